/* The cost model's overlap rules (zn_cost_predict), on made-up ceilings and
 * traffic whose step time is worked out by hand below: the host backend's
 * shared cores (times add, with the disk engine's CPU time and the device
 * accumulation), the optimizer chain on NVMe hidden only under the window
 * (at the disk's mixed rate when it is known), and the GPU's overlap. The
 * figures are round so that each expected value is exact arithmetic; a
 * relative tolerance of 1e-12 covers the double rounding. */
#include <math.h>
#include <string.h>

#include "zinc/cost.h"
#include "zinc/optim.h"
#include "zt.h"

#define CLOSE(a, b) ZT_CHECK_MSG(fabs((a) - (b)) <= 1e-12 * fabs(b) + 1e-15, \
                                 "%s = %.9g, expected %.9g", #a, (double)(a), (double)(b))

static zn_ceilings host_ceilings(void)
{
    zn_ceilings c;
    memset(&c, 0, sizeof c);
    c.shared_cores = true;
    c.h2d_bps = c.d2h_bps = 1e9;      /* 1 ns per byte */
    c.mem_bps = 10e9;
    c.nvme_read_bps = 1e9;
    c.nvme_write_bps = 2e9;
    c.adam_pps[ZN_MOM_F32] = 1e9;     /* 1 ns per parameter */
    c.dev_adam_pps = 1e9;
    return c;
}

/* 4 layers of 10 ms forward and 20 ms backward, a head of 5 ms: 125 ms of
 * compute per micro-batch, 40 ms of it the forward (the window) */
static const zn_cost_compute comp = { .layer_fwd_s = 0.010, .layer_bwd_s = 0.020,
                                      .head_s = 0.005, .blocks = 6 };

static zn_plan plan_with(uint64_t h2d, uint64_t d2h, uint64_t rd, uint64_t wr, bool opt_nvme)
{
    zn_plan p;
    memset(&p, 0, sizeof p);
    p.step.h2d = h2d;
    p.step.d2h = d2h;
    p.step.nvme_read = rd;
    p.step.nvme_write = wr;
    p.step.adam_params = 10000000;  /* 10 ms of CPU Adam */
    p.step.micro_batches = 1;
    p.step.pipelined = true;        /* under the next forward */
    p.step.opt_on_nvme = opt_nvme;
    if (opt_nvme)  /* all of it the optimizer's states */
        p.step.chain_read = rd, p.step.chain_write = wr;
    return p;
}

static void test_shared_cores_add(void)
{
    zn_ceilings c = host_ceilings();
    zn_plan p = plan_with(5000000, 3000000, 0, 0, false);
    zn_cost o;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    /* 125 compute + 5 h2d + 3 d2h + 10 Adam */
    CLOSE(o.step_s, 0.143);
    CLOSE(o.exposed_opt_s, 0.0);
    ZT_EQ_INT(o.bound, ZN_RES_COMPUTE);

    /* the bf16 master's own Adam rate: 10M at 0.5 G/s, 20 ms */
    c.adam_sr_pps[ZN_MOM_F32] = 0.5e9;
    p.step.master_sr = true;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.step_s, 0.153);
    /* a target without the figure takes the fp32 master's */
    c.adam_sr_pps[ZN_MOM_F32] = 0;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.step_s, 0.143);
    p.step.master_sr = false;

    /* the schedule's fixed cost: 6 blocks x 2 x 1 micro-batch x 100 us */
    c.block_use_s = 100e-6;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    ZT_EQ_U64(o.block_uses, 12);
    CLOSE(o.step_s, 0.143 + 0.0012);
}

static void test_disk_cpu_and_chain(void)
{
    zn_ceilings c = host_ceilings();
    /* the optimizer's states on NVMe: 30 MB read (30 ms), 30 MB written
     * (15 ms): the chain, 45 ms, is longer than the 40 ms forward */
    zn_plan p = plan_with(0, 0, 30000000, 30000000, true);
    zn_cost o;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.busy_s[ZN_RES_NVME], 0.045);
    CLOSE(o.exposed_opt_s, 0.005);
    CLOSE(o.step_s, 0.125 + 0.010 + 0.005);
    ZT_EQ_INT(o.bound, ZN_RES_NVME);

    /* a mixed rate slower than the two directions added sets the chain:
     * 60 MB at 1 GB/s, 60 ms, 20 ms past the window */
    c.nvme_mixed_bps = 1e9;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.exposed_opt_s, 0.020);
    CLOSE(o.step_s, 0.155);
    /* a faster one does not shorten the disk's own busy time */
    c.nvme_mixed_bps = 10e9;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.exposed_opt_s, 0.005);

    /* the engine's CPU time per byte comes out of the shared cores:
     * 30 MB x 0.1 ns + 30 MB x 0.2 ns = 9 ms */
    c.nvme_mixed_bps = 0;
    c.nvme_read_cpu = 0.1e-9;
    c.nvme_write_cpu = 0.2e-9;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.io_cpu_s, 0.009);
    CLOSE(o.step_s, 0.125 + 0.010 + 0.009 + 0.005);

    /* without clipping the unit steps under the backward too (window
     * 125 ms): nothing of the chain is exposed */
    p.step.overlap_step = true;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.exposed_opt_s, 0.0);
    CLOSE(o.step_s, 0.125 + 0.010 + 0.009);

    /* params on NVMe too: the backward's fetches (100 MB, 100 ms) are
     * not in the chain: the disk is busy 145 ms, the chain is 45 ms */
    p.step.nvme_read += 100000000;
    p.step.overlap_step = false;
    c.nvme_read_cpu = c.nvme_write_cpu = 0;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.busy_s[ZN_RES_NVME], 0.145);
    CLOSE(o.exposed_opt_s, 0.005);
    CLOSE(o.step_s, 0.145);
    ZT_EQ_INT(o.bound, ZN_RES_NVME);

    /* parameters on NVMe, optimizer on the CPU, nothing written back: the
     * disk overlaps the cores whole, and sets the step only when longer */
    zn_plan q = plan_with(0, 0, 300000000, 0, false);
    c.nvme_read_cpu = c.nvme_write_cpu = 0;
    ZT_EQ_INT(zn_cost_predict(&q, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.step_s, 0.300);
    ZT_EQ_INT(o.bound, ZN_RES_NVME);
}

static void test_device_accumulation(void)
{
    zn_ceilings c = host_ceilings();
    zn_plan p = plan_with(0, 0, 0, 0, false);
    p.step.opt_on_device = true;
    p.step.dev_accum_bytes = 50000000;  /* 5 ms at 10 GB/s */
    zn_cost o;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    /* 125 compute + 10 device Adam (on the compute) + 5 accumulation */
    CLOSE(o.busy_s[ZN_RES_D2H], 0.005);
    CLOSE(o.step_s, 0.140);
    /* on a GPU the sums are HBM traffic beside the compute: not counted */
    c.shared_cores = false;
    c.cuda = true;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.busy_s[ZN_RES_D2H], 0.0);
    CLOSE(o.step_s, 0.135);
}

static void test_gpu_overlap(void)
{
    zn_ceilings c = host_ceilings();
    c.shared_cores = false;
    c.cuda = true;
    /* the link and the disk beside the compute; the CPU Adam (10 ms) and
     * the states' disk (45 ms) under the 40 ms forward: 5 ms exposed */
    zn_plan p = plan_with(50000000, 30000000, 30000000, 30000000, true);
    zn_cost o;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.exposed_opt_s, 0.005);
    CLOSE(o.step_s, 0.130);
    /* a link slower than all of it sets the step */
    p.step.h2d = 200000000;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.step_s, 0.200);
    ZT_EQ_INT(o.bound, ZN_RES_H2D);
    /* the gradients' way home longer than the backward: 100 MB at 1 GB/s
     * (100 ms) plus 150 MB summed at 10 GB/s (15 ms) against 85 ms of
     * backward. With clipping the optimizer starts 30 ms after the
     * backward's compute: 30 + 10 of Adam - 40 of forward = 0 exposed. */
    p = plan_with(50000000, 100000000, 0, 0, false);
    p.step.accum_bytes = 150000000;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.busy_s[ZN_RES_D2H], 0.115);
    CLOSE(o.accum_tail_s, 0.030);
    CLOSE(o.exposed_opt_s, 0.0);
    CLOSE(o.step_s, 0.125);
    /* a slower Adam (50 ms): 30 + 50 - 40 = 40 ms exposed */
    p.step.adam_params = 50000000;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.exposed_opt_s, 0.040);
    CLOSE(o.step_s, 0.165);
    ZT_EQ_INT(o.bound, ZN_RES_ADAM);
    /* without clipping units step as their gradients land: no tail, the
     * 50 ms hide under the 125 ms window */
    p.step.overlap_step = true;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.accum_tail_s, 0.0);
    CLOSE(o.step_s, 0.125);
    /* two micro-batches: only the last one's tail counts (115 / 2 = 57.5
     * ms of the way home against 85 ms of backward: none) */
    p.step.overlap_step = false;
    p.step.micro_batches = 2;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), 0);
    CLOSE(o.accum_tail_s, 0.0);
    CLOSE(o.exposed_opt_s, 0.010);
    CLOSE(o.step_s, 0.260);
    /* a missing ceiling is named */
    p = plan_with(200000000, 30000000, 30000000, 30000000, true);
    c.nvme_write_bps = 0;
    ZT_EQ_INT(zn_cost_predict(&p, &c, &comp, 4, 256, ZN_MOM_F32, &o), ZN_EARG);
    ZT_CONTAINS(o.missing, "nvme write");
}

int main(void)
{
    test_shared_cores_add();
    test_disk_cpu_and_chain();
    test_device_accumulation();
    test_gpu_overlap();
    return zt_done();
}
