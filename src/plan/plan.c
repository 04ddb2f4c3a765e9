/* The placement planner: bytes of each state class and the tier that holds
 * them, from the offload settings (DeepSpeed's rules) and the tier budgets.
 * The sizes follow ZeRO's accounting: 16-bit params 2 B, fp32 master, m and
 * v 4 B each, fp32 gradient accumulators 4 B per parameter (DeepSpeed
 * ZeRO-Offload paper, Table 1 and section 4). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "zinc/optim.h"
#include "zinc/plan.h"

const char *zn_tier_name(zn_tier t)
{
    static const char *n[] = { "gpu", "cpu", "nvme" };
    return (unsigned)t < ZN_TIER_COUNT ? n[t] : "?";
}

const char *zn_state_name(zn_state_class c)
{
    static const char *n[] = {
        "params (working)", "master (fp32)", "adam m (fp32)", "adam v (fp32)",
        "grads (fp32)", "activations (ckpt)", "working buffers",
    };
    return (unsigned)c < ZN_STATE_COUNT ? n[c] : "?";
}

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* Bytes of one decoder layer's transient activations during its backward
 * (recompute + gradients), per micro-batch. Per token: the layer input, two
 * norm outputs, q, attention output, o-proj output, MLP output (7 x hidden),
 * k and v (2 x kv width), gate, up and the SwiGLU product (3 x intermediate),
 * each with a gradient of the same size alive at the peak: x2. Attention
 * scores and probabilities are fp32, per head: batch x heads x seq^2 x 4 B,
 * probs and their gradient: x2. The loss head adds one chunk of logits. */
static uint64_t layer_work_bytes(const zn_plan_input *in)
{
    uint64_t tokens = (uint64_t)in->micro_batch * (uint64_t)in->seq_len;
    uint64_t kv = (uint64_t)in->n_kv_heads * (uint64_t)in->head_dim;
    uint64_t per_tok = (7 * (uint64_t)in->hidden + 2 * kv + 3 * (uint64_t)in->intermediate) * 2;
    uint64_t act = tokens * per_tok * (uint64_t)in->param_bytes;
    uint64_t scores = (uint64_t)in->micro_batch * (uint64_t)in->n_heads *
                      (uint64_t)in->seq_len * (uint64_t)in->seq_len * 4 * 2;
    uint64_t chunk = min_u64((uint64_t)in->vocab, 16384);
    uint64_t logits = tokens * chunk * 4 * 2;
    return act + max_u64(scores, logits);
}

static void add(zn_plan *p, zn_state_class c, zn_tier t, uint64_t bytes)
{
    p->bytes[c][t] += bytes;
}

/* Bytes of fp32 Adam moments (m + v) in tier t as 8-bit ones would take:
 * laid out as the trainer lays them out (zn_mom_layout_bytes; the fp32
 * figures are 4 bytes an element, in the estimate and in the trainer's
 * items, whose NVMe extents are rounded up to pages: the elements are the
 * bytes / 4 at most). */
static uint64_t q8_of(const zn_plan *p, zn_tier t)
{
    return zn_mom_layout_bytes(ZN_MOM_Q8, p->bytes[ZN_STATE_ADAM_M][t] / 4) +
           zn_mom_layout_bytes(ZN_MOM_Q8, p->bytes[ZN_STATE_ADAM_V][t] / 4);
}

/* Tier t (cpu: the optimizer in RAM; nvme: swapped there) short by
 * `short_by` with fp32 Adam moments in it: what train.optim=adamw_bnb_8bit
 * (8-bit blockwise m and v, which both tiers hold at their size) would
 * save, into fix[n]; on NVMe the figure is about the 8-bit plan's (its
 * extents are rounded to pages, and the gradients' tier may change).
 * Returns 1 when that alone makes the tier fit, 0 when it does not, -1
 * (fix empty) when the moments are too small a part of the tier to be
 * worth saying: a LoRA run's adapters, whose moments are a few per cent of
 * the frozen base's 16-bit copy. */
static int q8_advice(const zn_plan *p, zn_tier t, uint64_t short_by, char *fix, size_t n)
{
    uint64_t fp = p->bytes[ZN_STATE_ADAM_M][t] + p->bytes[ZN_STATE_ADAM_V][t];
    fix[0] = '\0';
    if (p->moment_bytes != 4 || !fp || fp * 16 < p->tier_total[t])
        return -1;
    uint64_t q8 = q8_of(p, t);
    if (q8 >= fp)
        return -1;
    uint64_t save = fp - q8;
    char a[32], b[32], c[32], d[32];
    zn_format_size(q8, a, sizeof a);
    zn_format_size(fp, b, sizeof b);
    zn_format_size(save, c, sizeof c);
    if (save >= short_by) {
        snprintf(fix, n, "train.optim=adamw_bnb_8bit keeps Adam's m and v in 8 bits (%s instead "
                 "of %s), which saves %s and alone fits (the %s tier then needs %s%s)", a, b, c,
                 zn_tier_name(t), t == ZN_TIER_NVME ? "about " : "",
                 zn_format_size(p->tier_total[t] - save, d, sizeof d));
        return 1;
    }
    snprintf(fix, n, "train.optim=adamw_bnb_8bit keeps Adam's m and v in 8 bits (%s instead of "
             "%s) and saves %s, not enough alone (short by %s even so)", a, b, c,
             zn_format_size(short_by - save, d, sizeof d));
    return 0;
}

/* What follows from the bytes per class and tier: SSD wear per step,
 * whether the states asked on NVMe would fit in RAM, and whether it all
 * fits (with what is short and the fix). */
static int finish(zn_plan *p, const zn_spec *sp, bool act_ckpt)
{
    zn_tier ptier = sp->param_home;
    zn_tier otier = sp->opt_home;
    for (int t = 0; t < ZN_TIER_COUNT; t++) {
        p->tier_total[t] = 0;
        for (int c = 0; c < ZN_STATE_COUNT; c++)
            p->tier_total[t] += p->bytes[c][t];
    }
    p->why[0] = '\0';
    /* SSD wear: what one optimizer step writes to NVMe on this rank. The
     * updated master, m and v go back; so do NVMe-homed params; gradient
     * accumulators on NVMe are written once per micro-batch. */
    uint64_t A = sp->accumulation > 0 ? (uint64_t)sp->accumulation : 1;
    p->nvme_write_part[0] = p->bytes[ZN_STATE_MASTER][ZN_TIER_NVME] +
                            p->bytes[ZN_STATE_ADAM_M][ZN_TIER_NVME] +
                            p->bytes[ZN_STATE_ADAM_V][ZN_TIER_NVME];
    /* (only what trains is written back: a frozen LoRA base never is) */
    p->nvme_write_part[1] = p->params_total && p->params_trainable < p->params_total
                                ? (uint64_t)((double)p->bytes[ZN_STATE_PARAMS][ZN_TIER_NVME] *
                                             (double)p->params_trainable /
                                             (double)p->params_total)
                                : p->bytes[ZN_STATE_PARAMS][ZN_TIER_NVME];
    p->nvme_write_part[2] = p->bytes[ZN_STATE_GRADS][ZN_TIER_NVME] * A;
    p->nvme_write_step = p->nvme_write_part[0] + p->nvme_write_part[1] + p->nvme_write_part[2];
    /* states on NVMe that would fit in the cpu tier's room: say so (the
     * config asked for NVMe; the plan does not override it) */
    uint64_t opt_nvme = p->bytes[ZN_STATE_MASTER][ZN_TIER_NVME] +
                        p->bytes[ZN_STATE_ADAM_M][ZN_TIER_NVME] +
                        p->bytes[ZN_STATE_ADAM_V][ZN_TIER_NVME];
    p->opt_fits_cpu = opt_nvme && p->tier_total[ZN_TIER_CPU] + opt_nvme +
                                      p->bytes[ZN_STATE_GRADS][ZN_TIER_NVME] <=
                                      p->budget[ZN_TIER_CPU];
    /* the same for params on NVMe, which are written back every step (an
     * example planned for a small machine, given a larger tiers.cpu) */
    uint64_t par_nvme = p->bytes[ZN_STATE_PARAMS][ZN_TIER_NVME];
    p->params_fit_cpu = par_nvme && p->nvme_write_part[1] &&
                        p->tier_total[ZN_TIER_CPU] + par_nvme <= p->budget[ZN_TIER_CPU];

    /* Feasibility and the fix for the first tier that is short. */
    p->fits = true;
    size_t used = 0;
    char need[32], have[32], short_by[32];
    for (int t = 0; t < ZN_TIER_COUNT; t++) {
        if (p->tier_total[t] <= p->budget[t])
            continue;
        p->fits = false;
        zn_format_size(p->tier_total[t], need, sizeof need);
        zn_format_size(p->budget[t], have, sizeof have);
        zn_format_size(p->tier_total[t] - p->budget[t], short_by, sizeof short_by);
        used += (size_t)snprintf(p->why + used, sizeof p->why - used,
                                 "%s%s tier needs %s, its budget is %s (short by %s)",
                                 used ? "; " : "", zn_tier_name((zn_tier)t), need, have, short_by);
        if (used >= sizeof p->why)
            break;
        char fix[768] = "";
        uint64_t opt_bytes = (p->bytes[ZN_STATE_MASTER][t] + p->bytes[ZN_STATE_ADAM_M][t] +
                              p->bytes[ZN_STATE_ADAM_V][t] + p->bytes[ZN_STATE_GRADS][t]);
        char ob[32], pbs[32], nv[32];
        zn_format_size(p->budget[ZN_TIER_NVME], nv, sizeof nv);
        if (t == ZN_TIER_GPU) {
            if (otier == ZN_TIER_GPU && opt_bytes)
                snprintf(fix, sizeof fix, "%s=cpu moves %s of optimizer state off the GPU "
                         "(needs stage >= 1)", p->key.opt_home, zn_format_size(opt_bytes, ob, sizeof ob));
            else if (ptier == ZN_TIER_GPU)
                snprintf(fix, sizeof fix, "%s=cpu moves %s of parameters off the GPU "
                         "(needs stage 3)", p->key.param_home, zn_format_size(p->bytes[ZN_STATE_PARAMS][t], pbs, sizeof pbs));
            else if (p->bytes[ZN_STATE_ACT_CKPT][t] && act_ckpt)
                snprintf(fix, sizeof fix, "activation_checkpointing.cpu_checkpointing=true "
                         "moves the checkpointed activations (%s) to pinned RAM, the GPU keeps "
                         "three of them; or lower %s or data.seq_len",
                         zn_format_size(p->bytes[ZN_STATE_ACT_CKPT][t], ob, sizeof ob),
                         p->key.micro_batch);
            else
                snprintf(fix, sizeof fix, "lower %s, data.seq_len "
                         "or stage3_max_live_parameters / stage3_prefetch_bucket_size",
                         p->key.micro_batch);
        } else if (t == ZN_TIER_CPU) {
            if (otier == ZN_TIER_CPU && opt_bytes) {
                /* the cheapest fix that fits first: 8-bit moments cost no
                 * I/O and no SSD wear; the states on NVMe cost both */
                char q8[256], to_nvme[160], both[96];
                int q8_fits = q8_advice(p, ZN_TIER_CPU, p->tier_total[t] - p->budget[t], q8,
                                        sizeof q8);
                snprintf(to_nvme, sizeof to_nvme, "%s=nvme needs %s on nvme; tiers.nvme has %s",
                         p->key.opt_home, zn_format_size(opt_bytes + p->tier_total[ZN_TIER_NVME], ob, sizeof ob), nv);
                /* the NVMe tier swaps 8-bit moments at their size too */
                uint64_t fp = p->bytes[ZN_STATE_ADAM_M][t] + p->bytes[ZN_STATE_ADAM_V][t];
                char nb[32];
                snprintf(both, sizeof both, "; both together need %s on nvme",
                         zn_format_size(opt_bytes - fp + q8_of(p, t) +
                                        p->tier_total[ZN_TIER_NVME], nb, sizeof nb));
                if (q8_fits == 1)
                    snprintf(fix, sizeof fix, "%s; or %s", q8, to_nvme);
                else if (q8_fits == 0)
                    snprintf(fix, sizeof fix, "%s; %s%s", to_nvme, q8, both);
                else
                    snprintf(fix, sizeof fix, "%s", to_nvme);
            } else if (ptier == ZN_TIER_CPU && p->bytes[ZN_STATE_PARAMS][t])
                snprintf(fix, sizeof fix, "%s=nvme needs %s on nvme; tiers.nvme has %s",
                         p->key.param_home, zn_format_size(p->bytes[ZN_STATE_PARAMS][t] +
                                        p->tier_total[ZN_TIER_NVME], ob, sizeof ob), nv);
            else if (ptier == ZN_TIER_NVME && p->bytes[ZN_STATE_PARAMS][t])
                snprintf(fix, sizeof fix, "lower %s", p->key.param_max_in_cpu);
            else
                snprintf(fix, sizeof fix, "raise tiers.cpu, or lower buffer_count / %s / "
                         "buffer_size", p->key.opt_unit);
        } else {
            /* fp32 moments swapped there: 8-bit ones take a quarter */
            char q8[256];
            int q8_fits = otier == ZN_TIER_NVME
                              ? q8_advice(p, ZN_TIER_NVME, p->tier_total[t] - p->budget[t], q8,
                                          sizeof q8) : -1;
            char more[256];
            char sb[32];
            if (p->spec_shadow)
                snprintf(more, sizeof more, "train.speculative_step=false drops the optimizer "
                         "states' second copy (%s); or give tiers.nvme more space (another "
                         "path, or a larger size) or move state to the cpu tier",
                         zn_format_size(p->spec_shadow, sb, sizeof sb));
            else
                snprintf(more, sizeof more, "give tiers.nvme more space (another path, or a "
                         "larger size) or move state to the cpu tier");
            if (q8_fits == 1)
                snprintf(fix, sizeof fix, "%s; or %s", q8, more);
            else if (q8_fits == 0)
                snprintf(fix, sizeof fix, "%s; %s", more, q8);
            else
                snprintf(fix, sizeof fix, "%s", more);
        }
        used += (size_t)snprintf(p->why + used, sizeof p->why - used, ": %s", fix);
        if (used >= sizeof p->why)
            break;
    }
    if (!p->fits)
        return zn_set_error(ZN_ENOFIT, "%s", p->why);
    return 0;
}


int zn_plan_use_items(zn_plan *p, const zn_spec *sp)
{
    if (!p->n_items)
        return zn_set_error(ZN_EARG, "plan: no itemized allocations");
    memset(p->bytes, 0, sizeof p->bytes);
    for (int i = 0; i < p->n_items; i++)
        p->bytes[p->items[i].cls][p->items[i].tier] += p->items[i].bytes;
    /* the bytes a step writes are the states' own, not their extents
     * rounded to engine blocks: keep zn_plan_compute's figure */
    uint64_t wear = p->nvme_write_step, part[3];
    memcpy(part, p->nvme_write_part, sizeof part);
    int rc = finish(p, sp, sp->plan.activation_checkpointing);
    p->nvme_write_step = wear;
    memcpy(p->nvme_write_part, part, sizeof part);
    return rc;
}

void zn_plan_print_items(const zn_plan *p, FILE *f)
{
    char b1[32], b2[32];
    fprintf(f, "%-40s %-5s %-20s %6s %14s %14s\n", "allocation", "tier", "class", "count",
            "each", "bytes");
    for (int i = 0; i < p->n_items; i++)
        fprintf(f, "%-40s %-5s %-20s %6u %14s %14s\n", p->items[i].what,
                zn_tier_name(p->items[i].tier), zn_state_name(p->items[i].cls),
                p->items[i].count,
                zn_format_size(p->items[i].bytes / (p->items[i].count ? p->items[i].count : 1),
                               b1, sizeof b1),
                zn_format_size(p->items[i].bytes, b2, sizeof b2));
}

int zn_plan_compute(zn_plan *p, const zn_spec *sp)
{
    const zn_plan_input *in = &sp->plan;
    const zn_plan_budgets *b = &sp->budgets;
    memset(p, 0, sizeof *p);
    p->key = sp->key;
    if (in->n_blocks < 1 || !in->block_params || in->world_size < 1 ||
        (in->param_bytes != 2 && in->param_bytes != 4) || in->micro_batch < 1 ||
        in->seq_len < 1)
        return zn_set_error(ZN_ECONFIG, "plan: inconsistent input (blocks %d, world %d, "
                            "param bytes %d, micro batch %lld, seq %lld)", in->n_blocks,
                            in->world_size, in->param_bytes, (long long)in->micro_batch,
                            (long long)in->seq_len);
    const uint64_t W = (uint64_t)in->world_size;
    const uint64_t pb = (uint64_t)in->param_bytes;

    uint64_t P = 0, largest = 0;
    for (int i = 0; i < in->n_blocks; i++) {
        P += in->block_params[i];
        largest = max_u64(largest, in->block_params[i]);
    }
    p->params_total = P;
    p->largest_block = largest;

    /* ZeRO sharding: stage 1 shards optimizer states, 2 adds gradients,
     * 3 adds parameters. */
    uint64_t P_param = sp->zero_stage >= 3 ? ceil_div(P, W) : P;
    /* optimizer states and gradients: only what trains (a LoRA base has none) */
    uint64_t PT = in->trainable_params && in->trainable_params < P ? in->trainable_params : P;
    p->params_trainable = PT;
    uint64_t P_opt = sp->zero_stage >= 1 ? ceil_div(PT, W) : PT;
    uint64_t P_grad = sp->zero_stage >= 2 ? ceil_div(PT, W) : PT;
    uint64_t persistent = min_u64(in->persistent_params, P);

    /* 16-bit params. */
    zn_tier ptier = sp->param_home;
    if (ptier == ZN_TIER_GPU) {
        add(p, ZN_STATE_PARAMS, ZN_TIER_GPU, P_param * pb);
    } else {
        uint64_t pers_shard = sp->zero_stage >= 3 ? ceil_div(persistent, W) : persistent;
        uint64_t rest = P_param > pers_shard ? P_param - pers_shard : 0;
        add(p, ZN_STATE_PARAMS, ZN_TIER_GPU, pers_shard * pb);
        if (ptier == ZN_TIER_CPU) {
            add(p, ZN_STATE_PARAMS, ZN_TIER_CPU, rest * pb);
        } else {
            uint64_t in_cpu = min_u64(sp->param_max_in_cpu, rest);
            add(p, ZN_STATE_PARAMS, ZN_TIER_CPU, in_cpu * pb);
            add(p, ZN_STATE_PARAMS, ZN_TIER_NVME, (rest - in_cpu) * pb);
        }
    }

    /* Optimizer states (+ gradient accumulators, which follow them: DeepSpeed
     * swaps gradients to NVMe with the optimizer). The spec's opt_ratio is
     * the fraction of sub-groups stepped on the CPU; the rest stay on the GPU. */
    zn_tier otier = sp->opt_home;
    double ratio = otier == ZN_TIER_GPU ? 0.0 : sp->opt_ratio;
    uint64_t opt_off = (uint64_t)((double)P_opt * ratio);
    uint64_t grad_off = (uint64_t)((double)P_grad * ratio);
    /* the moments in train.optim's format: 4, 2 or 1 bytes per element,
     * 8-bit ones with a 4-byte absmax per 256 and padded as the trainer
     * pads them (zn_tr_moments) */
    int mb = sp->moment_bytes;
    p->moment_bytes = mb;
    zn_mom_fmt mf = mb == 1 ? ZN_MOM_Q8 : mb == 2 ? ZN_MOM_BF16 : ZN_MOM_F32;
    /* the master in train.master_weights' format: fp32, or bf16 (stochastic
     * rounding) */
    uint64_t msb = sp->master_bf16_sr ? 2 : 4;
    p->master_bytes = (int)msb;
    for (int c = ZN_STATE_MASTER; c <= ZN_STATE_ADAM_V; c++) {
        bool mom = c != ZN_STATE_MASTER;
        uint64_t off_b = mom ? zn_mom_layout_bytes(mf, opt_off) : opt_off * msb;
        uint64_t dev_n = P_opt - opt_off;
        uint64_t dev_b = mom ? (dev_n ? zn_mom_layout_bytes(mf, dev_n) : 0) : dev_n * msb;
        add(p, (zn_state_class)c, otier == ZN_TIER_GPU ? ZN_TIER_GPU : otier, off_b);
        add(p, (zn_state_class)c, ZN_TIER_GPU, dev_b);
    }
    /* With the states on NVMe the gradients follow them (tiers.grads nvme),
     * or stay in pinned RAM (cpu; auto decides once the rest is placed). */
    zn_tier gtier = otier;
    if (otier == ZN_TIER_NVME && sp->grads == ZN_GRADS_CPU)
        gtier = ZN_TIER_CPU;
    add(p, ZN_STATE_GRADS, gtier, grad_off * 4);
    add(p, ZN_STATE_GRADS, ZN_TIER_GPU, (P_grad - grad_off) * 4);

    /* Activations. With checkpointing only each layer's input is kept;
     * without it every layer's transient activations stay until backward. */
    uint64_t tokens = (uint64_t)in->micro_batch * (uint64_t)in->seq_len;
    uint64_t work_layer = layer_work_bytes(in);
    if (in->activation_checkpointing) {
        uint64_t ckpt = (uint64_t)in->n_layers * tokens * (uint64_t)in->hidden * pb;
        /* the trainer keeps checkpoints on the device (cpu_checkpointing is
         * refused by the config until it is implemented) */
        add(p, ZN_STATE_ACT_CKPT, ZN_TIER_GPU, ckpt);
    } else {
        add(p, ZN_STATE_ACT_CKPT, ZN_TIER_GPU, (uint64_t)in->n_layers * work_layer / 2);
    }

    /* GPU working set: the live parameter window (the block in use and the
     * prefetched ones, bounded by stage3_max_live_parameters and
     * stage3_prefetch_bucket_size), the blocks' fp32 gradients before they
     * go to the host, and one layer's transient activations. */
    uint64_t window = 0;
    if (ptier != ZN_TIER_GPU || W > 1) {
        uint64_t want = largest + sp->prefetch_bucket;
        window = max_u64(largest, min_u64(sp->max_live_params, want));
        window = min_u64(window, P);
        /* The window holds whole blocks: at least the largest one. */
        window = max_u64(window, largest);
    }
    p->live_window = window;
    /* the block gradients: two fp32 buffers of the largest block (one is
     * filled while the other goes D2H), as the trainer allocates them */
    add(p, ZN_STATE_WORK, ZN_TIER_GPU, window * pb + 2 * largest * 4 + work_layer);
    /* a tied embedding's head gradient waits on the GPU for the embedding's
     * backward (src/model/model_train.c) */
    add(p, ZN_STATE_WORK, ZN_TIER_GPU, in->tied_params * 4);

    /* Host working set: NVMe staging buffers for parameters and optimizer
     * sub-groups (DeepSpeed's buffer_count x buffer_size and buffer_count x
     * the spec's opt_unit). */
    uint64_t sub = min_u64(sp->opt_unit, P_opt);
    p->sub_group = sub;
    if (ptier == ZN_TIER_NVME)
        add(p, ZN_STATE_WORK, ZN_TIER_CPU, (uint64_t)sp->param_buffers *
            min_u64(sp->param_buffer_size, max_u64(largest, 1)) * pb);
    /* The param cache (tiers.param_cache blocks) hands NVMe-home params
     * from the optimizer to the next forward where the step is pipelined:
     * one rank, or stage 3 (whose blocks' homes hold this rank's shard). */
    if (p->bytes[ZN_STATE_PARAMS][ZN_TIER_NVME] && (W == 1 || sp->zero_stage >= 3))
        add(p, ZN_STATE_WORK, ZN_TIER_CPU, (uint64_t)sp->param_cache *
            (sp->zero_stage >= 3 ? ceil_div(largest, W) : largest) * pb);
    /* buffer_count x sub_group fp32 buffers hold a quarter as many units'
     * master, m, v and gradients in flight; the moments take their own
     * size (the trainer keeps the unit and shrinks the staging) */
    if (otier == ZN_TIER_NVME) {
        uint64_t pool = (uint64_t)sp->opt_buffers * sub, flight = pool / 4;
        add(p, ZN_STATE_WORK, ZN_TIER_CPU, mf == ZN_MOM_F32 ? pool * 4
                                            : flight * 8 + 2 * zn_mom_layout_bytes(mf, flight));
    }
    /* Pinned staging for one block's fp32 gradients on their way D2H (this
     * rank's shard of it), two of them so that one block's copy overlaps
     * the previous one's accumulation. */
    add(p, ZN_STATE_WORK, ZN_TIER_CPU, 2 * ((largest + W - 1) / W) * 4);

    for (int t = 0; t < ZN_TIER_COUNT; t++) {
        p->budget[t] = b->bytes[t];
        for (int c = 0; c < ZN_STATE_COUNT; c++)
            p->tier_total[t] += p->bytes[c][t];
    }
    /* auto: the fastest tier with room (pinned RAM beats NVMe) */
    uint64_t gb = p->bytes[ZN_STATE_GRADS][ZN_TIER_NVME];
    if (otier == ZN_TIER_NVME && sp->grads == ZN_GRADS_AUTO && gb &&
        p->tier_total[ZN_TIER_CPU] + gb <= p->budget[ZN_TIER_CPU]) {
        p->bytes[ZN_STATE_GRADS][ZN_TIER_NVME] = 0;
        p->bytes[ZN_STATE_GRADS][ZN_TIER_CPU] += gb;
        p->tier_total[ZN_TIER_NVME] -= gb;
        p->tier_total[ZN_TIER_CPU] += gb;
        gtier = ZN_TIER_CPU;
    }
    p->grads_tier = gtier;

    /* The speculative step (train.speculative_step): a second copy of the
     * optimizer states on NVMe, which every update writes in turn (a unit
     * stepped before the global norm is known too), so that the last
     * step's states stay whole and each step can be committed by
     * reference; auto takes it when the tier has room for it and for the
     * states once more beside it (a checkpoint copy of them, which on the
     * same disk would otherwise find it full), or for it alone when no
     * periodic save copies them (commit_only). */
    uint64_t shadow = p->bytes[ZN_STATE_MASTER][ZN_TIER_NVME] +
                      p->bytes[ZN_STATE_ADAM_M][ZN_TIER_NVME] +
                      p->bytes[ZN_STATE_ADAM_V][ZN_TIER_NVME];
    p->spec_shadow = p->spec_declined = 0;
    uint64_t nv_now = 0;   /* the tier's bytes as placed so far */
    for (int c = 0; c < ZN_STATE_COUNT; c++)
        nv_now += p->bytes[c][ZN_TIER_NVME];
    if (otier == ZN_TIER_NVME && shadow && sp->speculate != 2) {
        if (sp->speculate == 1 ||
            nv_now + (sp->commit_only ? 1 : 2) * shadow <= p->budget[ZN_TIER_NVME]) {
            p->spec_shadow = shadow;
            add(p, ZN_STATE_WORK, ZN_TIER_NVME, shadow);
            p->tier_total[ZN_TIER_NVME] += shadow;
        } else {
            p->spec_declined = shadow;
        }
    }

    return finish(p, sp, in->activation_checkpointing);
}

void zn_plan_print(const zn_plan *p, FILE *f)
{
    char buf[32];
    fprintf(f, "%-20s %14s %14s %14s\n", "state", "gpu", "cpu", "nvme");
    for (int c = 0; c < ZN_STATE_COUNT; c++) {
        if ((c == ZN_STATE_ADAM_M || c == ZN_STATE_ADAM_V) && p->moment_bytes &&
            p->moment_bytes != 4) {
            char nm[32];
            snprintf(nm, sizeof nm, "adam %s (%s)", c == ZN_STATE_ADAM_M ? "m" : "v",
                     p->moment_bytes == 1 ? "int8" : "bf16");
            fprintf(f, "%-20s", nm);
        } else if (c == ZN_STATE_MASTER && p->master_bytes == 2) {
            fprintf(f, "%-20s", "master (bf16 sr)");
        } else {
            fprintf(f, "%-20s", zn_state_name((zn_state_class)c));
        }
        for (int t = 0; t < ZN_TIER_COUNT; t++) {
            if (p->bytes[c][t])
                fprintf(f, " %14s", zn_format_size(p->bytes[c][t], buf, sizeof buf));
            else
                fprintf(f, " %14s", "-");
        }
        fputc('\n', f);
    }
    fprintf(f, "%-20s", "total");
    for (int t = 0; t < ZN_TIER_COUNT; t++)
        fprintf(f, " %14s", zn_format_size(p->tier_total[t], buf, sizeof buf));
    fprintf(f, "\n%-20s", "budget");
    for (int t = 0; t < ZN_TIER_COUNT; t++)
        fprintf(f, " %14s", zn_format_size(p->budget[t], buf, sizeof buf));
    fprintf(f, "\n%-20s", "headroom");
    for (int t = 0; t < ZN_TIER_COUNT; t++) {
        if (p->tier_total[t] <= p->budget[t]) {
            fprintf(f, " %14s", zn_format_size(p->budget[t] - p->tier_total[t], buf, sizeof buf));
        } else {
            char s[40];
            snprintf(s, sizeof s, "-%s", zn_format_size(p->tier_total[t] - p->budget[t], buf,
                                                        sizeof buf));
            fprintf(f, " %14s", s);
        }
    }
    fputc('\n', f);
    if (p->master_bytes) {
        /* what each trained parameter costs the optimizer side, with the
         * master's format named: bf16_sr is a choice, not a default */
        int mb = p->moment_bytes ? p->moment_bytes : 4;
        fprintf(f, "per trained parameter: master %d B (%s), adam m + v %s B (%s), "
                "grads 4 B\n", p->master_bytes,
                p->master_bytes == 2 ? "bf16, stochastic rounding: train.master_weights "
                                       "bf16_sr" : "fp32",
                mb == 4 ? "8" : mb == 2 ? "4" : "2.03",
                mb == 4 ? "fp32" : mb == 2 ? "bf16" : "int8");
    }
    if (p->spec_shadow)
        fprintf(f, "(the nvme work holds the optimizer states' second copy, %s: each update "
                "writes the copy the last one did not, so that with checkpoints every step is "
                "committed in place, and units step before the global norm is known, stepped "
                "again when clipping applies; train.speculative_step=false drops it)\n",
                zn_format_size(p->spec_shadow, buf, sizeof buf));
    if (p->spec_declined)
        fprintf(f, "(no second copy of the optimizer states: it, %s, and the states once more "
                "beside it (a periodic save's copy) do not fit the nvme tier; without it every "
                "unit waits for the global norm and no step is committed in place (with "
                "train.checkpoint.every 0 the copy needs no room beside it). "
                "train.speculative_step=true takes it anyway)\n",
                zn_format_size(p->spec_declined, buf, sizeof buf));
    if (p->gpu_outside) {
        char b2[32];
        fprintf(f, "(the gpu total holds %s outside the arena: the GEMM streams' cuBLAS "
                "handles and workspaces, every stream's scratch%s; the arena takes %s)\n",
                zn_format_size(p->gpu_outside, buf, sizeof buf),
                p->gpu_outside_nccl ? ", NCCL's buffers" : "",
                zn_format_size(p->tier_total[ZN_TIER_GPU] - p->gpu_outside, b2, sizeof b2));
    }
    if (p->nvme_write_step) {
        char b2[32];
        char b3[32], b4[32], b5[32];
        uint64_t opt = p->nvme_write_part[0], gr = p->nvme_write_part[2];
        fprintf(f, "\nnvme writes %s per optimizer step on this rank (%s per 1000 steps; "
                "optimizer states %s, params %s, gradient accumulators %s, once per "
                "micro-batch): SSDs are rated for a total of terabytes written\n",
                zn_format_size(p->nvme_write_step, buf, sizeof buf),
                zn_format_size(p->nvme_write_step * 1000, b2, sizeof b2),
                zn_format_size(opt, b3, sizeof b3),
                zn_format_size(p->nvme_write_part[1], b4, sizeof b4),
                zn_format_size(gr, b5, sizeof b5));
        if (p->opt_fits_cpu)
            fprintf(f, "the optimizer states would fit in the cpu tier's headroom: "
                    "%s=cpu keeps them in RAM and writes nothing per step\n", p->key.opt_home);
        if (p->params_fit_cpu)
            fprintf(f, "the params on NVMe (%s) would fit in the cpu tier's headroom: "
                    "%s=cpu keeps them in RAM and saves their %s written per step\n",
                    zn_format_size(p->bytes[ZN_STATE_PARAMS][ZN_TIER_NVME], b3, sizeof b3),
                    p->key.param_home,
                    zn_format_size(p->nvme_write_part[1], b4, sizeof b4));
        /* fp32 moments swapped: 8-bit ones (stepped alike on NVMe) would
         * write a quarter of their bytes */
        uint64_t fp = p->bytes[ZN_STATE_ADAM_M][ZN_TIER_NVME] +
                      p->bytes[ZN_STATE_ADAM_V][ZN_TIER_NVME];
        uint64_t q8 = q8_of(p, ZN_TIER_NVME);
        if (p->moment_bytes == 4 && fp && q8 < fp && fp * 16 >= p->nvme_write_part[0])
            fprintf(f, "train.optim=adamw_bnb_8bit keeps Adam's m and v in 8 bits, on NVMe too: "
                    "%s of optimizer states per step instead of %s (%s in all)\n",
                    zn_format_size(opt - fp + q8, b3, sizeof b3),
                    zn_format_size(opt, b4, sizeof b4),
                    zn_format_size(p->nvme_write_step - fp + q8, b5, sizeof b5));
    }
}
