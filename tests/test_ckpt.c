/* Checkpoints (include/zinc/ckpt.h) on the host backend with the trainer
 * tests' block model:
 *  - resume is bit-exact: 10 steps, save, load into a fresh trainer, 10 more
 *    gives the losses and final fp32 weights of 20 uninterrupted steps, for
 *    every placement test_train uses, and across placements (saved with the
 *    optimizer on NVMe, resumed with everything on the device, and back);
 *  - a flipped byte, a truncated file and a missing file are refused by
 *    verify and by open/load, naming the file; a different model or world
 *    size is refused;
 *  - ENOSPC / EIO injected into a save's writes leave the previous checkpoint
 *    as `latest` and intact, no temporary folder, and a trainer that goes on
 *    training with unchanged numerics;
 *  - keep_last prunes old checkpoints;
 *  - export: a Llama trained two steps, exported as fp32 and bf16 in several
 *    shards, reads back through the safetensors reader with HF names and
 *    shapes and values equal to the master rounded to the dtype, and loads
 *    as a model. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt/ckpt-impl.h"
#include "zinc/ckpt.h"
#include "zinc/config.h"
#include "zinc/model.h"
#include "zinc/nvme.h"
#include "zinc/safetensors.h"
#include "zinc/tokens.h"
#include "zinc/run.h"
#include "zinc/train.h"
#include "test_nvme_common.h"
#include "test_train_toy.h"
#include "zt.h"

#define STEPS 20
#define HALF 10
#define V 64
#define H 192
#define NMID 4
#define MB 4
#define SEQ 16
#define ACC 2

static char nvme_dir[4200], ck_root[4300];

static const char *base_json =
    "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2,"
    " \"gradient_clipping\": 1.0,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"betas\": [0.9, 0.95],"
    "   \"eps\": 1e-8, \"weight_decay\": 0.01}},"
    " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0,"
    "   \"warmup_max_lr\": 0.01, \"warmup_num_steps\": 5, \"warmup_type\": \"linear\"}},"
    " \"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 10000,"
    "   \"stage3_param_persistence_threshold\": 0,"
    "   \"offload_param\": {\"device\": \"cpu\", \"buffer_count\": 3},"
    "   \"offload_optimizer\": {\"device\": \"cpu\", \"buffer_count\": 4}},"
    " \"aio\": {\"block_size\": 65536, \"queue_depth\": 8},"
    " \"data\": {\"seq_len\": 16},"
    " \"train\": {\"device\": \"host\", \"threads\": 2}}";

static zn_tokens *data;
static zn_loader *loader;
static int32_t ids[ACC * MB * SEQ], tgts[ACC * MB * SEQ];

static int create(zn_trainer **tr, toy_model *toy, const char **sets, int nsets,
                  uint64_t gpu_budget)
{
    const char *all[32];
    int n = 0;
    static char tiers[8600];
    snprintf(tiers, sizeof tiers, "tiers.nvme=[{\"path\": \"%s\", \"size\": \"64MiB\"}]",
             nvme_dir);
    all[n++] = tiers;
    all[n++] = "tiers.cpu=\"64MiB\"";
    all[n++] = "tiers.gpu=\"64MiB\"";
    for (int i = 0; i < nsets; i++)
        all[n++] = sets[i];
    zn_config cfg;
    int rc = zn_config_parse(&cfg, base_json, "test", all, n);
    if (!rc)
        rc = zn_config_resolve_batch(&cfg, 1);
    if (rc)
        return rc;
    toy_setup(toy, V, H, NMID, MB * SEQ, 7);
    zn_plan_input in;
    toy_plan_input(toy, MB, SEQ, &in);
    zn_train_options o = zn_train_options_default();
    zn_spec o_spec;
    ZT_EQ_INT(zn_run_spec(&cfg, &in, NULL, &o_spec), 0);
    o.spec = &o_spec;
    o.model = &toy->model;
    o_spec.budgets.bytes[ZN_TIER_GPU] = gpu_budget ? gpu_budget : cfg.tiers.gpu;
    o_spec.budgets.bytes[ZN_TIER_CPU] = cfg.tiers.cpu;
    o_spec.budgets.bytes[ZN_TIER_NVME] = 64u << 20;
    return zn_train_create(tr, &o);
}

/* Steps [from, to) with the loader's batches of those indices. */
static int steps(zn_trainer *tr, int from, int to, double *loss)
{
    for (int s = from; s < to; s++) {
        if (zn_loader_get(loader, (uint64_t)s, ids, tgts, NULL))
            ZT_SETUP_FAIL("loader: %s", zn_last_error());
        zn_train_step_info info;
        int rc = zn_train_step(tr, ids, tgts, NULL, &info);
        if (rc)
            return rc;
        if (info.step != s + 1)
            return zn_set_error(ZN_EINTERNAL, "step numbered %lld, expected %d",
                                (long long)info.step, s + 1);
        loss[s] = info.loss;
    }
    return 0;
}

typedef struct {
    double loss[STEPS];
    float *master;
    uint64_t n;
} ref_run;

static void read_master(zn_trainer *tr, ref_run *o)
{
    o->n = zn_train_num_params(tr);
    o->master = malloc(o->n * 4);
    ZT_EQ_INT(zn_train_read_master(tr, o->master, o->n), 0);
}

static void compare(const char *label, const ref_run *ref, const ref_run *o, int from)
{
    int bad = 0;
    for (int s = from; s < STEPS; s++)
        if (memcmp(&o->loss[s], &ref->loss[s], sizeof(double)) && bad++ < 3)
            ZT_FAIL_AT("%s: step %d loss %.9g differs from the uninterrupted run's %.9g", label,
                       s + 1, o->loss[s], ref->loss[s]);
    ZT_CHECK_MSG(!bad, "%s: %d losses differ", label, bad);
    ZT_CHECK(o->n == ref->n);
    if (o->n == ref->n) {
        uint64_t diff = 0, first = 0;
        for (uint64_t i = 0; i < o->n; i++)
            if (memcmp(&o->master[i], &ref->master[i], 4) && !diff++)
                first = i;
        ZT_CHECK_MSG(!diff, "%s: %llu final weights differ (first at %llu: %.9g vs %.9g)", label,
                     (unsigned long long)diff, (unsigned long long)first,
                     (double)o->master[first], (double)ref->master[first]);
    }
}

static zn_ckpt_save_options save_opts(const char *dir)
{
    zn_ckpt_save_options o = zn_ckpt_save_options_default();
    o.dir = dir;
    o.keep_last = 2;
    o.config_text = base_json;
    o.client_json = "{\"data_step\": 10}";
    o.chunk_bytes = 65536 * 3; /* several chunks per state file */
    return o;
}

typedef struct {
    const char *label;
    const char **sets;
    int n;
    int tiny;   /* 0: the default gpu budget; 1: tiny; 2: tiny + the device optimizer's states */
} placement;

/* The budget of a placement: tiny, plus 16 B per parameter (master, m, v,
 * gradient sums) and some room when the optimizer is on the device. */
static uint64_t budget_of(const placement *p, uint64_t tiny, uint64_t n_params)
{
    return !p->tiny ? 0 : p->tiny == 1 ? tiny : tiny + n_params * 16 + (256u << 10);
}

/* A trainer of placement a after HALF steps (their losses into o). */
static zn_trainer *run_half(const char *label, const placement *a, uint64_t tiny,
                            const ref_run *ref, toy_model *toy, ref_run *o)
{
    zn_trainer *tr;
    memset(o, 0, sizeof *o);
    if (create(&tr, toy, a->sets, a->n, budget_of(a, tiny, ref->n)))
        ZT_SETUP_FAIL("%s: create: %s", label, zn_last_error());
    ZT_EQ_INT(steps(tr, 0, HALF, o->loss), 0);
    return tr;
}

/* Loads ck into a new trainer of placement b, runs the second half and
 * compares it with the uninterrupted run. Closes ck. */
static void finish_from(const char *label, zn_ckpt *ck, const placement *b, uint64_t tiny,
                        const ref_run *ref, ref_run *o)
{
    toy_model toy;
    zn_trainer *tr;
    if (create(&tr, &toy, b->sets, b->n, budget_of(b, tiny, ref->n)))
        ZT_SETUP_FAIL("%s: create: %s", label, zn_last_error());
    int rc = zn_ckpt_load(ck, tr);
    ZT_CHECK_MSG(rc == 0, "%s: load: %s", label, zn_last_error());
    zn_ckpt_close(ck);
    ZT_EQ_INT(steps(tr, HALF, STEPS, o->loss), 0);
    read_master(tr, o);
    zn_train_destroy(tr);
    compare(label, ref, o, HALF);
    free(o->master);
    o->master = NULL;
}

/* Saves after HALF steps with placement a, resumes with placement b. */
static void resume_case(const placement *a, const placement *b, uint64_t tiny, const ref_run *ref)
{
    char label[256], dir[4400];
    snprintf(label, sizeof label, "save [%s] -> resume [%s]", a->label, b->label);
    snprintf(dir, sizeof dir, "%s/resume-%d", ck_root, rand());
    toy_model toy;
    ref_run o;
    zn_trainer *tr = run_half(label, a, tiny, ref, &toy, &o);
    zn_ckpt_save_options so = save_opts(dir);
    char where[4500];
    int rc = zn_ckpt_save(tr, &so, where, sizeof where);
    ZT_CHECK_MSG(rc == 0, "%s: save: %s", label, zn_last_error());
    zn_train_destroy(tr);
    if (rc)
        return;
    ZT_EQ_INT(zn_ckpt_verify(dir), 0);
    zn_ckpt *ck;
    ZT_EQ_INT(zn_ckpt_open(&ck, dir), 0);
    ZT_CHECK(!strcmp(zn_ckpt_path(ck), where));
    ZT_EQ_INT(zn_ckpt_step(ck), HALF);
    ZT_CONTAINS(zn_ckpt_client_json(ck), "data_step");
    ZT_CHECK(zn_ckpt_config_text(ck) && !strcmp(zn_ckpt_config_text(ck), base_json));
    finish_from(label, ck, b, tiny, ref, &o);
    printf("%-75s ok\n", label);
}

/* Loads a checkpoint into the trainer that saved it after it ran past it
 * (a rewind): nothing of the newer state may survive, in particular no
 * parameters the optimizer handed to the next forward (the param cache). */
static void rewind_case(const placement *a, uint64_t tiny, const ref_run *ref)
{
    char label[256], dir[4400];
    snprintf(label, sizeof label, "rewind [%s]", a->label);
    snprintf(dir, sizeof dir, "%s/rewind-%d", ck_root, rand());
    toy_model toy;
    zn_trainer *tr;
    ref_run o;
    double later[STEPS];
    memset(&o, 0, sizeof o);
    if (create(&tr, &toy, a->sets, a->n, budget_of(a, tiny, ref->n)))
        ZT_SETUP_FAIL("%s: create: %s", label, zn_last_error());
    ZT_EQ_INT(steps(tr, 0, HALF, o.loss), 0);
    zn_ckpt_save_options so = save_opts(dir);
    char where[4500];
    ZT_EQ_INT(zn_ckpt_save(tr, &so, where, sizeof where), 0);
    ZT_EQ_INT(steps(tr, HALF, HALF + 3, later), 0);
    zn_ckpt *ck;
    ZT_EQ_INT(zn_ckpt_open(&ck, dir), 0);
    int rc = zn_ckpt_load(ck, tr);
    ZT_CHECK_MSG(rc == 0, "%s: load: %s", label, zn_last_error());
    zn_ckpt_close(ck);
    ZT_EQ_INT(steps(tr, HALF, STEPS, o.loss), 0);
    zn_train_report r;
    zn_train_get_report(tr, &r);
    read_master(tr, &o);
    zn_train_destroy(tr);
    compare(label, ref, &o, HALF);
    printf("%-75s ok (param cache served %llu fetches)\n", label,
           (unsigned long long)r.param_cache_hits);
    free(o.master);
}

/* ---- corruption ----------------------------------------------------------------*/
static void copy_tree(const char *from, const char *to)
{
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -a '%s' '%s'", to, from, to);
    if (system(cmd))
        ZT_SETUP_FAIL("%s failed", cmd);
}

static void expect_refused(const char *what, const char *dir, const char *file, int load_too,
                           const char **sets, int nsets)
{
    int rc = zn_ckpt_verify(dir);
    ZT_CHECK_MSG(rc != 0, "%s: verify accepted it", what);
    ZT_CONTAINS(zn_last_error(), file);
    if (!load_too)
        return;
    /* open sees sizes and presence; load sees the crc */
    zn_ckpt *ck = NULL;
    rc = zn_ckpt_open(&ck, dir);
    if (rc == 0) {
        toy_model toy;
        zn_trainer *tr;
        if (create(&tr, &toy, sets, nsets, 0))
            ZT_SETUP_FAIL("create: %s", zn_last_error());
        rc = zn_ckpt_load(ck, tr);
        ZT_CHECK_MSG(rc == ZN_ECORRUPT, "%s: load returned %d", what, rc);
        ZT_CONTAINS(zn_last_error(), file);
        printf("%-40s load refused: %s\n", what, zn_last_error());
        /* a trainer half loaded is never presented as valid */
        zn_train_step_info info;
        zn_loader_get(loader, 0, ids, tgts, NULL);
        ZT_EQ_INT(zn_train_step(tr, ids, tgts, NULL, &info), ZN_ECORRUPT);
        zn_train_destroy(tr);
        zn_ckpt_close(ck);
    } else {
        ZT_EQ_INT(rc, ZN_ECORRUPT);
        ZT_CONTAINS(zn_last_error(), file);
        printf("%-40s open refused: %s\n", what, zn_last_error());
    }
}

static void corruption(const char *good, const char **sets, int nsets)
{
    char bad[4400], path[4600];
    snprintf(bad, sizeof bad, "%s/bad", ck_root);
    /* one flipped byte in the middle of m.bin */
    copy_tree(good, bad);
    snprintf(path, sizeof path, "%s/rank-0/m.bin", bad);
    int fd = open(path, O_RDWR);
    ZT_CHECK(fd >= 0);
    struct stat st;
    fstat(fd, &st);
    unsigned char c;
    ZT_CHECK(pread(fd, &c, 1, st.st_size / 2) == 1);
    c ^= 0x10;
    ZT_CHECK(pwrite(fd, &c, 1, st.st_size / 2) == 1);
    close(fd);
    expect_refused("flipped byte in rank-0/m.bin", bad, "rank-0/m.bin", 1, sets, nsets);
    /* truncated v.bin */
    copy_tree(good, bad);
    snprintf(path, sizeof path, "%s/rank-0/v.bin", bad);
    ZT_CHECK(truncate(path, st.st_size - 4096) == 0);
    expect_refused("truncated rank-0/v.bin", bad, "rank-0/v.bin", 1, sets, nsets);
    /* missing master.bin */
    copy_tree(good, bad);
    snprintf(path, sizeof path, "%s/rank-0/master.bin", bad);
    ZT_CHECK(unlink(path) == 0);
    expect_refused("missing rank-0/master.bin", bad, "rank-0/master.bin", 1, sets, nsets);
    /* a flipped byte in the manifest itself */
    copy_tree(good, bad);
    snprintf(path, sizeof path, "%s/manifest.json", bad);
    fd = open(path, O_RDWR);
    ZT_CHECK(fd >= 0);
    char text[8192];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    ZT_CHECK(n > 0);
    text[n > 0 ? n : 0] = '\0';
    char *at = strstr(text, "\"step\": 10");
    ZT_CHECK(at != NULL);
    if (at) {
        at[9] = '7';
        ZT_CHECK(pwrite(fd, text, (size_t)n, 0) == n);
    }
    close(fd);
    expect_refused("edited manifest.json", bad, "manifest.json", 1, sets, nsets);
    /* no manifest: an incomplete folder */
    ZT_CHECK(unlink(path) == 0);
    ZT_CHECK(zn_ckpt_verify(bad) != 0);
    ZT_CONTAINS(zn_last_error(), "manifest.json");
    char cmd[4500];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", bad);
    if (system(cmd))
        ZT_SETUP_FAIL("rm failed");
}

/* ---- I/O errors during a save ------------------------------------------------------*/
typedef struct {
    _Atomic uint64_t seen;
    uint64_t nth;
    int res;
} fault_state;

/* ---- a final save keeps the NVMe state in place -----------------------------------
 * A save with final_save of a trainer whose optimizer state is on NVMe links
 * the swap file into the rank's folder: the same bytes and crc32c as a
 * copying save of the same state, the trainer refuses to step after it, the
 * checkpoint outlives the trainer's swap and resumes bit for bit; damage in
 * what it refers to is found, damage in the ranges it punched out is not
 * its concern; a missing or truncated swap file is refused by name. A save
 * at once cancelled by its flag leaves nothing and the trainer goes on. */
static const zn_ckpt_file *file_of(const zn_ckpt *ck, const char *name)
{
    const zn_ckpt_file *f = zn_ckpt__file(ck, name);
    if (!f)
        ZT_SETUP_FAIL("checkpoint %s lists no %s", ck->path, name);
    return f;
}

static void flip_at(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    unsigned char b = 0;
    if (fd < 0 || pread(fd, &b, 1, (off_t)off) != 1)
        ZT_SETUP_FAIL("%s: %s", path, strerror(errno));
    b ^= 0x5a;
    if (pwrite(fd, &b, 1, (off_t)off) != 1)
        ZT_SETUP_FAIL("%s: %s", path, strerror(errno));
    close(fd);
}

static void final_case(const placement *a, const placement *b, uint64_t tiny, const ref_run *ref)
{
    char label[256], dcopy[4400], dref[4400], where[4500], path[4800];
    snprintf(label, sizeof label, "final save in place [%s] -> resume [%s]", a->label, b->label);
    snprintf(dcopy, sizeof dcopy, "%s/fcopy-%d", ck_root, rand());
    snprintf(dref, sizeof dref, "%s/fref-%d", ck_root, rand());
    toy_model toy;
    ref_run o;
    zn_trainer *tr = run_half(label, a, tiny, ref, &toy, &o);
    /* cancelled: nothing left, the trainer untouched */
    static volatile sig_atomic_t cancel = 1;
    zn_ckpt_save_options so = save_opts(dcopy);
    so.cancel = &cancel;
    ZT_EQ_INT(zn_ckpt_save(tr, &so, where, sizeof where), -ECANCELED);
    DIR *dd = opendir(dcopy);
    int left = 0;
    for (struct dirent *e; dd && (e = readdir(dd));)
        left += e->d_name[0] != '.' || (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."));
    if (dd)
        closedir(dd);
    ZT_CHECK_MSG(!left, "%s: a cancelled save left %d entries in %s", label, left, dcopy);
    so.cancel = NULL;
    ZT_EQ_INT(zn_ckpt_save(tr, &so, where, sizeof where), 0);
    ZT_CHECK(zn_ckpt_save_keeps_nvme(tr, dref));
    so = save_opts(dref);
    so.final_save = true;
    int rc = zn_ckpt_save(tr, &so, where, sizeof where);
    ZT_CHECK_MSG(rc == 0, "%s: final save: %s", label, zn_last_error());
    /* the trainer gave its state away */
    zn_train_step_info info;
    zn_loader_get(loader, HALF, ids, tgts, NULL);
    ZT_CHECK(zn_train_step(tr, ids, tgts, NULL, &info) != 0);
    zn_train_destroy(tr);   /* its swap file goes: the checkpoint's link stays */
    if (rc)
        return;
    snprintf(path, sizeof path, "%s/rank-0/state.swp", where);
    struct stat st;
    ZT_CHECK_MSG(stat(path, &st) == 0, "%s: no %s", label, path);
    snprintf(path, sizeof path, "%s/rank-0/m.bin", where);
    ZT_CHECK_MSG(stat(path, &st) < 0, "%s: %s was copied", label, path);
    ZT_EQ_INT(zn_ckpt_verify(dref), 0);
    zn_ckpt *cc, *cr;
    char cpath[4500];
    snprintf(cpath, sizeof cpath, "%s/step-%08d", dcopy, HALF);
    ZT_EQ_INT(zn_ckpt_open(&cc, cpath), 0);
    ZT_EQ_INT(zn_ckpt_open(&cr, where), 0);
    for (int k = 0; k < 3; k++) {
        char rel[64];
        snprintf(rel, sizeof rel, "rank-0/%s", zn_ckpt__state_file[k]);
        const zn_ckpt_file *fc = file_of(cc, rel), *fr = file_of(cr, rel);
        ZT_CHECK_MSG(fr->nref && !fc->nref && fr->bytes == fc->bytes && fr->crc == fc->crc,
                     "%s: %s in place: %llu bytes crc %08x (%d refs), copied: %llu crc %08x",
                     label, rel, (unsigned long long)fr->bytes, fr->crc, fr->nref,
                     (unsigned long long)fc->bytes, fc->crc);
    }
    zn_ckpt_close(cc);

    /* resumed (from a copy of the folder: the damage below is to the original) */
    char dup[4600];
    snprintf(dup, sizeof dup, "%s-dup", where);
    copy_tree(where, dup);
    zn_ckpt *ck;
    ZT_EQ_INT(zn_ckpt_open(&ck, dup), 0);
    finish_from(label, ck, b, tiny, ref, &o);

    /* a byte of v.bin's first piece, in the swap file: found; a byte
     * nothing refers to: not the checkpoint's concern */
    const zn_ckpt_file *fv = file_of(cr, "rank-0/v.bin");
    uint64_t used_end = 0, hole = UINT64_MAX;
    for (int k = 0; k < 3; k++) {
        char rel[64];
        snprintf(rel, sizeof rel, "rank-0/%s", zn_ckpt__state_file[k]);
        const zn_ckpt_file *f = file_of(cr, rel);
        for (size_t i = 0; i < f->npc; i++)
            if (f->pc[i].src == 0 && f->pc[i].off + f->pc[i].len > used_end)
                used_end = f->pc[i].off + f->pc[i].len;
    }
    snprintf(path, sizeof path, "%s/rank-0/state.swp", where);
    if (stat(path, &st) == 0 && (uint64_t)st.st_size > used_end + 8192)
        hole = used_end + 4096;
    ZT_CHECK(fv->npc > 0 && fv->pc[0].src == 0);
    if (hole != UINT64_MAX) {
        flip_at(path, hole);
        ZT_EQ_INT(zn_ckpt_verify(where), 0);
    }
    uint64_t first = fv->pc[0].off;
    flip_at(path, first + fv->pc[0].len / 2);
    zn_ckpt_close(cr);
    expect_refused("a flipped byte v.bin refers to", where, "v.bin", 1, a->sets, a->n);
    /* truncated, then missing */
    ZT_EQ_INT(truncate(path, (off_t)(first + 1)), 0);
    expect_refused("state.swp truncated", where, "state.swp", 0, a->sets, a->n);
    ZT_EQ_INT(unlink(path), 0);
    expect_refused("state.swp missing", where, "state.swp", 0, a->sets, a->n);
    printf("%-75s ok%s\n", label, hole == UINT64_MAX ? " (no unused range to damage)" : "");
}

/* Every step committed by reference (zn_ckpt_commit_start): the NVMe
 * states in two copies, so the commit of step HALF stays whole while step
 * HALF + 1 runs; the next commit removes it; a stop seals the newest with
 * the update in flight dropped; a resume from a commit is bit for bit the
 * uninterrupted run (clipping off: every unit steps in the norm-first
 * walk, as its gradients are final). */
static void commit_case(uint64_t tiny)
{
    const char *sets[] = { "zero_optimization.offload_param.device=\"nvme\"",
                           "zero_optimization.offload_optimizer.device=\"nvme\"",
                           "gradient_clipping=0" };
    placement pl = { "params+optimizer nvme, no clipping", sets, 3, 1 };
    char label[256], dir[4400], where[4500], path[4800], dup[4600], seal[4500];
    snprintf(label, sizeof label, "every step committed [%s]", pl.label);
    snprintf(dir, sizeof dir, "%s/commit-%d", ck_root, rand());
    toy_model toy;
    zn_trainer *tr;
    ref_run ref, o;
    memset(&ref, 0, sizeof ref);
    if (create(&tr, &toy, pl.sets, pl.n, tiny))
        ZT_SETUP_FAIL("%s: create: %s", label, zn_last_error());
    ZT_EQ_INT(steps(tr, 0, STEPS, ref.loss), 0);
    read_master(tr, &ref);
    zn_train_destroy(tr);

    tr = run_half(label, &pl, tiny, &ref, &toy, &o);
    ZT_CHECK_MSG(zn_ckpt_commit_possible(tr, dir), "%s: no commit possible", label);
    zn_ckpt_save_options so = save_opts(dir);
    zn_ckpt_bg *bg = NULL;
    ZT_EQ_INT(zn_ckpt_commit_start(tr, &so, &bg), 0);
    int rc = bg ? zn_ckpt_save_end(bg, where, sizeof where, NULL) : -1;
    ZT_CHECK_MSG(rc == 0, "%s: commit: %s", label, zn_last_error());
    if (rc) {
        zn_train_destroy(tr);
        return;
    }
    struct stat st;
    snprintf(path, sizeof path, "%s/rank-0/state.swp", where);
    ZT_CHECK_MSG(stat(path, &st) == 0, "%s: no %s", label, path);
    snprintf(path, sizeof path, "%s/rank-0/m.bin", where);
    ZT_CHECK_MSG(stat(path, &st) < 0, "%s: %s was copied", label, path);
    /* the next step writes the other copy: the commit stays whole */
    double l2[STEPS];
    ZT_EQ_INT(steps(tr, HALF, HALF + 1, l2), 0);
    ZT_EQ_INT(zn_train_sync(tr), 0);
    ZT_CHECK_MSG(zn_ckpt_verify(where) == 0, "%s: the commit of step %d after step %d: %s",
                 label, HALF, HALF + 1, zn_last_error());
    snprintf(dup, sizeof dup, "%s-dup", where);
    copy_tree(where, dup);
    /* the next commit removes it (the step after overwrites its copy) */
    char where1[4500];
    ZT_EQ_INT(zn_ckpt_commit_start(tr, &so, &bg), 0);
    ZT_EQ_INT(bg ? zn_ckpt_save_end(bg, where1, sizeof where1, NULL) : -1, 0);
    ZT_CHECK_MSG(stat(where, &st) < 0, "%s: %s outlived the next commit", label, where);
    /* a stop: the next step's update in flight and its commit waiting for
     * it are dropped; the newest complete commit is sealed */
    ZT_EQ_INT(steps(tr, HALF + 1, HALF + 2, l2), 0);
    ZT_EQ_INT(zn_ckpt_commit_start(tr, &so, &bg), 0);
    ZT_EQ_INT(zn_ckpt_commit_seal(tr, where1, true, &bg, seal, sizeof seal), 0);
    ZT_CHECK(bg == NULL);
    ZT_CHECK_MSG(zn_ckpt_verify(seal) == 0, "%s: sealed %s: %s", label, seal, zn_last_error());
    zn_train_step_info info;
    zn_loader_get(loader, HALF + 2, ids, tgts, NULL);
    ZT_CHECK(zn_train_step(tr, ids, tgts, NULL, &info) != 0);
    zn_train_destroy(tr);   /* its swap file goes: the commit's link stays */
    ZT_CHECK_MSG(zn_ckpt_verify(seal) == 0, "%s: %s after the run: %s", label, seal,
                 zn_last_error());
    /* sealed: the ranges nothing refers to punched out (the swap file
     * holds the parameters, gradients and both copies: a commit refers to
     * one copy) */
    snprintf(path, sizeof path, "%s/rank-0/state.swp", seal);
    ZT_CHECK(stat(path, &st) == 0);
    ZT_CHECK_MSG((uint64_t)st.st_blocks * 512 < (uint64_t)st.st_size * 3 / 4,
                 "%s: %s holds %llu of its %llu bytes after the seal", label, path,
                 (unsigned long long)st.st_blocks * 512, (unsigned long long)st.st_size);
    zn_ckpt *ck;
    ZT_EQ_INT(zn_ckpt_open(&ck, dup), 0);
    finish_from(label, ck, &pl, tiny, &ref, &o);
    free(ref.master);
    printf("%-75s ok\n", label);
}

typedef struct {
    _Atomic int writing, go;
} hold_state;

static void *go_later(void *arg)
{
    usleep(200 * 1000);   /* (the seal has dropped the update by now, or waits for it) */
    atomic_store(&((hold_state *)arg)->go, 1);
    return NULL;
}

/* A commit held as it begins its files until the test says go: a stop
 * can land while the commit is past its wait for the update it commits. */
static void hold_point(void *user, const char *point)
{
    hold_state *h = user;
    if (strcmp(point, "rank-dir"))
        return;
    atomic_store(&h->writing, 1);
    for (int i = 0; i < 5000 && !atomic_load(&h->go); i++)
        usleep(1000);
}

/* A stop while a commit writes (its update done, the next one waiting for
 * it): the seal lets it finish and seals it, and the commit before is
 * gone; marking the trainer failed first made the commit's reads of the
 * state fail, and the failed commit took this run's earlier ones with it
 * (nothing left to resume from). */
static void commit_stop_while_writing(uint64_t tiny)
{
    const char *sets[] = { "zero_optimization.offload_param.device=\"nvme\"",
                           "zero_optimization.offload_optimizer.device=\"nvme\"",
                           "gradient_clipping=0" };
    placement pl = { "params+optimizer nvme, no clipping", sets, 3, 1 };
    const char *label = "a stop while a commit writes";
    char dir[4400], first[4500], seal[4500];
    snprintf(dir, sizeof dir, "%s/commit-stop-%d", ck_root, rand());
    toy_model toy;
    zn_trainer *tr;
    if (create(&tr, &toy, pl.sets, pl.n, tiny))
        ZT_SETUP_FAIL("%s: create: %s", label, zn_last_error());
    double l[STEPS];
    ZT_EQ_INT(steps(tr, 0, HALF, l), 0);
    zn_ckpt_save_options so = save_opts(dir);
    zn_ckpt_bg *bg = NULL;
    ZT_EQ_INT(zn_ckpt_commit_start(tr, &so, &bg), 0);
    ZT_EQ_INT(bg ? zn_ckpt_save_end(bg, first, sizeof first, NULL) : -1, 0);
    ZT_EQ_INT(steps(tr, HALF, HALF + 1, l), 0);
    ZT_EQ_INT(zn_train_sync(tr), 0);
    hold_state h = { 0, 0 };
    so.point = hold_point;
    so.point_user = &h;
    ZT_EQ_INT(zn_ckpt_commit_start(tr, &so, &bg), 0);
    for (int i = 0; i < 5000 && !atomic_load(&h.writing); i++)
        usleep(1000);
    ZT_CHECK_MSG(atomic_load(&h.writing), "%s: the commit began no files in 5 s", label);
    /* the seal waits for it: let it go once the seal has begun */
    pthread_t t;
    int started = pthread_create(&t, NULL, go_later, &h) == 0;
    ZT_CHECK(started);
    int rc = zn_ckpt_commit_seal(tr, first, true, &bg, seal, sizeof seal);
    if (started)
        pthread_join(t, NULL);
    ZT_CHECK_MSG(rc == 0, "%s: seal: %s", label, zn_last_error());
    ZT_CHECK_MSG(strcmp(seal, first) != 0, "%s: sealed the commit before (%s), not the one "
                 "writing", label, seal);
    ZT_CHECK_MSG(zn_ckpt_verify(seal) == 0, "%s: sealed %s: %s", label, seal, zn_last_error());
    struct stat st;
    ZT_CHECK_MSG(stat(first, &st) < 0, "%s: %s outlived the next commit", label, first);
    char latest[4500], want[64];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    FILE *f = fopen(latest, "r");
    snprintf(want, sizeof want, "step-%08d\n", HALF + 1);
    ZT_CHECK_MSG(f && fgets(latest, sizeof latest, f) && !strcmp(latest, want),
                 "%s: latest is not step %d", label, HALF + 1);
    if (f)
        fclose(f);
    zn_train_destroy(tr);
    ZT_CHECK_MSG(zn_ckpt_verify(seal) == 0, "%s: %s after the run: %s", label, seal,
                 zn_last_error());
    printf("%-75s ok\n", label);
}

static int fault_fn(void *user, const zn_aio_fault_site *site)
{
    fault_state *f = user;
    uint64_t k = atomic_fetch_add(&f->seen, 1) + 1;
    return k == f->nth ? f->res : site->res;
}


static void read_latest(const char *dir, char *out, size_t n)
{
    char p[4500];
    snprintf(p, sizeof p, "%s/latest", dir);
    FILE *f = fopen(p, "r");
    out[0] = '\0';
    if (f) {
        if (!fgets(out, (int)n, f))
            out[0] = '\0';
        fclose(f);
    }
}

static void io_errors(const placement *pl, uint64_t tiny, const ref_run *ref)
{
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/enospc", ck_root);
    toy_model toy;
    zn_trainer *tr;
    ref_run o;
    memset(&o, 0, sizeof o);
    if (create(&tr, &toy, pl->sets, pl->n, pl->tiny ? tiny : 0))
        ZT_SETUP_FAIL("create: %s", zn_last_error());
    ZT_EQ_INT(steps(tr, 0, 4, o.loss), 0);
    zn_ckpt_save_options so = save_opts(dir);
    ZT_EQ_INT(zn_ckpt_save(tr, &so, NULL, 0), 0);
    char before[64], after[64];
    read_latest(dir, before, sizeof before);
    ZT_CHECK(!strcmp(before, "step-00000004\n"));
    /* fail the n-th block write of later saves, across the three files */
    uint64_t nths[] = { 1, 2, 5, 9 };
    int errs[] = { -ENOSPC, -EIO, -ENOSPC, -ENOSPC };
    for (int i = 0; i < 4; i++) {
        ZT_EQ_INT(steps(tr, 4 + i, 5 + i, o.loss), 0);
        fault_state fs = { 0, nths[i], errs[i] };
        so.fault_hook = fault_fn;
        so.fault_user = &fs;
        int rc = zn_ckpt_save(tr, &so, NULL, 0);
        ZT_CHECK_MSG(rc == errs[i], "fault at write %llu: save returned %d (%s)",
                     (unsigned long long)nths[i], rc, zn_last_error());
        ZT_CONTAINS(zn_last_error(), ".bin");
        if (i == 0)
            printf("injected ENOSPC -> %s\n", zn_last_error());
        read_latest(dir, after, sizeof after);
        ZT_CHECK_MSG(!strcmp(before, after), "latest changed to %s after a failed save", after);
        ZT_EQ_INT(tn_dir_count(dir, ".step-"), 0);
        ZT_EQ_INT(tn_dir_count(dir, "step-"), 1);
        ZT_EQ_INT(zn_ckpt_verify(dir), 0);
    }
    so.fault_hook = NULL;
    /* the trainer was not disturbed: the rest of the run is the reference's */
    ZT_EQ_INT(steps(tr, 8, STEPS, o.loss), 0);
    read_master(tr, &o);
    compare("training on after failed saves", ref, &o, 0);
    /* keep_last: three more saves leave two */
    zn_train_destroy(tr);
    free(o.master);
    printf("%-75s ok\n", "ENOSPC/EIO during saves: previous checkpoint kept, training goes on");
}

/* ---- the background save and the stop flag ---------------------------------------*/
static volatile sig_atomic_t stop_flag;

static void *raise_later(void *arg)
{
    struct timespec ts = { 0, (long)(intptr_t)arg * 1000000L };  /* ms */
    nanosleep(&ts, NULL);
    stop_flag = 1;
    return NULL;
}

/* Steps [from, to) as steps() does, each step's stop flag raised after a
 * few milliseconds (step s: s %% ms_n x ms_a): a step the flag stopped (-ECANCELED) left the state as
 * it was, so it runs again with the flag down. Returns how many stopped. */
static int steps_with_stops(zn_trainer *tr, int from, int to, double *loss, int ms_a, int ms_n)
{
    int stopped = 0;
    for (int s = from; s < to; s++) {
        if (zn_loader_get(loader, (uint64_t)s, ids, tgts, NULL))
            ZT_SETUP_FAIL("loader: %s", zn_last_error());
        stop_flag = 0;
        pthread_t th;
        pthread_create(&th, NULL, raise_later, (void *)(intptr_t)(s % ms_n * ms_a));
        zn_train_step_info info;
        int rc = zn_train_step(tr, ids, tgts, NULL, &info);
        pthread_join(th, NULL);
        stop_flag = 0;
        if (rc == -ECANCELED) {
            ZT_CONTAINS(zn_last_error(), "stopped before its update");
            stopped++;
            rc = zn_train_step(tr, ids, tgts, NULL, &info);
        }
        ZT_EQ_INT(rc, 0);
        ZT_EQ_INT(info.step, s + 1);
        loss[s] = info.loss;
    }
    return stopped;
}

/* Files of checkpoint folders a and b equal, byte for byte (the state). */
static void same_state(const char *a, const char *b)
{
    for (int k = 0; k < 3; k++) {
        char pa[4700], pb[4700];
        snprintf(pa, sizeof pa, "%s/rank-0/%s", a, zn_ckpt__state_file[k]);
        snprintf(pb, sizeof pb, "%s/rank-0/%s", b, zn_ckpt__state_file[k]);
        uint64_t na = 0, nb = 0;
        uint32_t ca = 1, cb = 2;
        ZT_EQ_INT(zn_ckpt__file_crc(pa, &na, &ca), 0);
        ZT_EQ_INT(zn_ckpt__file_crc(pb, &nb, &cb), 0);
        ZT_CHECK_MSG(na == nb && ca == cb, "%s: %llu bytes crc %08x, the save at once's %llu "
                     "crc %08x", pa, (unsigned long long)na, ca, (unsigned long long)nb, cb);
    }
}

/* A save written in the background while three more steps run (their
 * updates wait for it): its files equal a save's at once of the same step,
 * it resumes to the uninterrupted run; a dropped one leaves nothing; a
 * failing one keeps the previous latest; the stop flag stops steps before
 * their update with the state kept. NVMe state is refused. */
static void background_case(const placement *pl, const placement *nv, uint64_t tiny,
                            const ref_run *ref)
{
    char dir[4400], now[4400];
    snprintf(dir, sizeof dir, "%s/bg", ck_root);
    snprintf(now, sizeof now, "%s/bg-now", ck_root);
    toy_model toy;
    zn_trainer *tr;
    ref_run o;
    memset(&o, 0, sizeof o);
    if (create(&tr, &toy, pl->sets, pl->n, 0))
        ZT_SETUP_FAIL("create: %s", zn_last_error());
    ZT_CHECK(zn_ckpt_save_background(tr));
    ZT_EQ_INT(zn_train_set_stop(tr, &stop_flag), 0);
    int stopped = steps_with_stops(tr, 0, HALF, o.loss, 15, 4);
    zn_ckpt_save_options so = save_opts(dir);
    zn_ckpt_bg *bg;
    ZT_EQ_INT(zn_ckpt_save_start(tr, &so, 0.05, &bg), 0);   /* paced: still writing below */
    ZT_EQ_INT(zn_ckpt_save_step(bg), HALF);
    zn_ckpt_bg *bg2 = NULL;
    ZT_EQ_INT(zn_ckpt_save_start(tr, &so, 0, &bg2), -EBUSY);   /* one at a time */
    ZT_CHECK(bg2 == NULL);
    ZT_EQ_INT(tn_dir_count(dir, ".step-"), 1);
    double later[STEPS];
    ZT_EQ_INT(steps(tr, HALF, HALF + 3, later), 0);
    char where[4500];
    zn_ckpt_bg_stats st;
    ZT_EQ_INT(zn_ckpt_save_end(bg, where, sizeof where, &st), 0);
    ZT_CONTAINS(where, "step-00000010");
    ZT_CHECK(st.bytes > 0 && st.write_s >= 0.04);
    ZT_EQ_INT(zn_ckpt_verify(dir), 0);
    ZT_EQ_INT(tn_dir_count(dir, ".step-"), 0);
    /* the rest of this run is the reference's: the steps ran while it wrote */
    memcpy(&o.loss[HALF], &later[HALF], 3 * sizeof(double));
    stopped += steps_with_stops(tr, HALF + 3, STEPS, o.loss, 15, 4);
    read_master(tr, &o);
    compare("training on during a background save, stop flag raised", ref, &o, 0);
    free(o.master);
    o.master = NULL;
    /* a dropped save leaves nothing; a failing one keeps latest */
    char before[64], after[64];
    read_latest(dir, before, sizeof before);
    ZT_EQ_INT(zn_ckpt_save_start(tr, &so, 1.0, &bg), 0);
    zn_ckpt_save_drop(bg);
    fault_state fs = { 0, 2, -EIO };
    so.fault_hook = fault_fn;
    so.fault_user = &fs;
    ZT_EQ_INT(zn_ckpt_save_start(tr, &so, 0, &bg), 0);
    int rc = zn_ckpt_save_end(bg, NULL, 0, NULL);
    ZT_CHECK_MSG(rc == -EIO, "a failing background save returned %d (%s)", rc, zn_last_error());
    ZT_CONTAINS(zn_last_error(), ".bin");
    read_latest(dir, after, sizeof after);
    ZT_CHECK_MSG(!strcmp(before, after), "latest %s became %s", before, after);
    ZT_EQ_INT(tn_dir_count(dir, ".step-"), 0);
    zn_train_destroy(tr);

    /* the same step saved at once: the same files */
    if (create(&tr, &toy, pl->sets, pl->n, 0))
        ZT_SETUP_FAIL("create: %s", zn_last_error());
    ZT_EQ_INT(steps(tr, 0, HALF, o.loss), 0);
    so = save_opts(now);
    ZT_EQ_INT(zn_ckpt_save(tr, &so, NULL, 0), 0);
    zn_train_destroy(tr);
    char a[4600], b[4600];
    snprintf(a, sizeof a, "%s/step-00000010", dir);
    snprintf(b, sizeof b, "%s/step-00000010", now);
    same_state(a, b);

    /* resumed from the background save: the uninterrupted run */
    if (create(&tr, &toy, pl->sets, pl->n, 0))
        ZT_SETUP_FAIL("create: %s", zn_last_error());
    zn_ckpt *ck;
    ZT_EQ_INT(zn_ckpt_open(&ck, a), 0);
    ZT_EQ_INT(zn_ckpt_load(ck, tr), 0);
    zn_ckpt_close(ck);
    ZT_EQ_INT(steps(tr, HALF, STEPS, o.loss), 0);
    read_master(tr, &o);
    zn_train_destroy(tr);
    compare("resumed from a background save", ref, &o, HALF);
    free(o.master);

    /* without clipping each unit steps as soon as its gradients are
     * final, late in the backward: from there a step must run to its end
     * (the flag's guard), and the run still equals one without stops */
    {
        const char *noclip[8];
        int nn = 0;
        for (int i = 0; i < pl->n; i++)
            noclip[nn++] = pl->sets[i];
        noclip[nn++] = "gradient_clipping=0";
        ref_run ra, b2;
        memset(&ra, 0, sizeof ra);
        memset(&b2, 0, sizeof b2);
        if (create(&tr, &toy, noclip, nn, 0))
            ZT_SETUP_FAIL("create: %s", zn_last_error());
        ZT_EQ_INT(steps(tr, 0, STEPS, ra.loss), 0);
        read_master(tr, &ra);
        zn_train_destroy(tr);
        if (create(&tr, &toy, noclip, nn, 0))
            ZT_SETUP_FAIL("create: %s", zn_last_error());
        ZT_EQ_INT(zn_train_set_stop(tr, &stop_flag), 0);
        int st2 = steps_with_stops(tr, 0, STEPS, b2.loss, 3, 20);
        read_master(tr, &b2);
        zn_train_destroy(tr);
        compare("stop flag without clipping", &ra, &b2, 0);
        printf("%-75s ok (%d of %d stopped)\n", "stop flag, units stepping during the backward",
               st2, STEPS);
        free(ra.master);
        free(b2.master);
    }

    /* the optimizer on NVMe: not in the background */
    if (create(&tr, &toy, nv->sets, nv->n, nv->tiny ? tiny : 0))
        ZT_SETUP_FAIL("create: %s", zn_last_error());
    ZT_CHECK(!zn_ckpt_save_background(tr));
    ZT_EQ_INT(zn_ckpt_save_start(tr, &so, 0, &bg), ZN_EARG);
    zn_train_destroy(tr);
    printf("%-75s ok (%d of %d steps stopped by the flag and run again)\n",
           "background save: same files, resumes, drop, fault; stop flag", stopped, STEPS - 3);
}

static void prune_and_refusals(const char **sets, int nsets)
{
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/prune", ck_root);
    toy_model toy;
    zn_trainer *tr;
    double loss[STEPS];
    if (create(&tr, &toy, sets, nsets, 0))
        ZT_SETUP_FAIL("create: %s", zn_last_error());
    zn_ckpt_save_options so = save_opts(dir);
    for (int s = 0; s < 5; s++) {
        ZT_EQ_INT(steps(tr, s, s + 1, loss), 0);
        ZT_EQ_INT(zn_ckpt_save(tr, &so, NULL, 0), 0);
    }
    /* saving the same step twice replaces it atomically */
    ZT_EQ_INT(zn_ckpt_save(tr, &so, NULL, 0), 0);
    zn_train_destroy(tr);
    ZT_EQ_INT(tn_dir_count(dir, "step-"), 2);
    char lat[64];
    read_latest(dir, lat, sizeof lat);
    ZT_CHECK(!strcmp(lat, "step-00000005\n"));
    char p[4500];
    snprintf(p, sizeof p, "%s/step-00000004/manifest.json", dir);
    ZT_CHECK(access(p, F_OK) == 0);
    ZT_EQ_INT(zn_ckpt_verify(dir), 0);

    /* another model (one more mid block) is refused with both sizes named */
    zn_ckpt *ck;
    ZT_EQ_INT(zn_ckpt_open(&ck, dir), 0);
    {
        zn_trainer *tr2;
        /* a trainer of a wider toy: create by hand */
        zn_config cfg;
        ZT_EQ_INT(zn_config_parse(&cfg, base_json, "test", NULL, 0), 0);
        ZT_EQ_INT(zn_config_resolve_batch(&cfg, 1), 0);
        toy_model wide;
        toy_setup(&wide, V, H + 64, NMID, MB * SEQ, 7);
        zn_plan_input in;
        toy_plan_input(&wide, MB, SEQ, &in);
        zn_train_options o = zn_train_options_default();
        zn_spec o_spec;
        ZT_EQ_INT(zn_run_spec(&cfg, &in, NULL, &o_spec), 0);
        o.spec = &o_spec;
        o.model = &wide.model;
        o_spec.budgets.bytes[ZN_TIER_GPU] = 64u << 20;
        o_spec.budgets.bytes[ZN_TIER_CPU] = 64u << 20;
        ZT_EQ_INT(zn_train_create(&tr2, &o), 0);
        ZT_EQ_INT(zn_ckpt_load(ck, tr2), ZN_ECONFIG);
        ZT_CONTAINS(zn_last_error(), "another model");
        printf("other model refused: %s\n", zn_last_error());
        /* refused before anything changed: the trainer still trains */
        zn_train_step_info info;
        zn_loader_get(loader, 0, ids, tgts, NULL);
        ZT_EQ_INT(zn_train_step(tr2, ids, tgts, NULL, &info), 0);
        zn_train_destroy(tr2);
    }
    zn_ckpt_close(ck);
}

/* ---- export ------------------------------------------------------------------------*/
static void export_case(void)
{
    zn_model_dims d;
    zn_model_dims_default(&d);
    d.hidden = 64;
    d.n_layers = 2;
    d.n_heads = 4;
    d.n_kv_heads = 2;
    d.head_dim = 16;
    d.intermediate = 96;
    d.vocab = 64;
    d.max_pos = 64;
    zn_config cfg;
    const char *sets[] = { "zero_optimization.offload_param.device=\"none\"",
                           "zero_optimization.offload_optimizer.device=\"none\"" };
    ZT_EQ_INT(zn_config_parse(&cfg, base_json, "test", sets, 2), 0);
    ZT_EQ_INT(zn_config_resolve_batch(&cfg, 1), 0);
    zn_train_llama *ll;
    ZT_EQ_INT(zn_train_llama_create(&ll, &d, MB, SEQ, 0.02, 11), 0);
    int nb = zn_model_num_blocks(&d);
    uint64_t *bp = calloc((size_t)nb, sizeof *bp);
    for (int b = 0; b < nb; b++)
        bp[b] = zn_model_block_param_count(&d, b);
    zn_plan_input in;
    memset(&in, 0, sizeof in);
    in.n_blocks = nb;
    in.block_params = bp;
    in.n_layers = d.n_layers;
    in.hidden = d.hidden;
    in.n_heads = d.n_heads;
    in.n_kv_heads = d.n_kv_heads;
    in.head_dim = d.head_dim;
    in.intermediate = d.intermediate;
    in.vocab = d.vocab;
    in.micro_batch = MB;
    in.seq_len = SEQ;
    in.param_bytes = 4;
    in.world_size = 1;
    in.activation_checkpointing = true;
    zn_train_options o = zn_train_options_default();
    zn_spec o_spec;
    ZT_EQ_INT(zn_run_spec(&cfg, &in, NULL, &o_spec), 0);
    o.spec = &o_spec;
    o.model = zn_train_llama_model(ll);
    o_spec.budgets.bytes[ZN_TIER_GPU] = 256u << 20;
    o_spec.budgets.bytes[ZN_TIER_CPU] = 256u << 20;
    zn_trainer *tr;
    ZT_EQ_INT(zn_train_create(&tr, &o), 0);
    double loss[STEPS];
    ZT_EQ_INT(steps(tr, 0, 2, loss), 0);
    uint64_t P = zn_train_num_params(tr);
    float *master = malloc(P * 4);
    ZT_EQ_INT(zn_train_read_master(tr, master, P), 0);
    char dir[4400], out[4400];
    snprintf(dir, sizeof dir, "%s/llama", ck_root);
    zn_ckpt_save_options so = save_opts(dir);
    so.dims = &d;
    ZT_EQ_INT(zn_ckpt_save(tr, &so, NULL, 0), 0);
    zn_train_destroy(tr);
    zn_train_llama_destroy(ll);

    zn_ckpt *ck;
    ZT_EQ_INT(zn_ckpt_open(&ck, dir), 0);
    zn_model_dims d2;
    ZT_EQ_INT(zn_ckpt_dims(ck, &d2), 0);
    ZT_EQ_INT(zn_ckpt_check_dims(ck, &d), 0);
    d2.intermediate = 128;
    ZT_EQ_INT(zn_ckpt_check_dims(ck, &d2), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "intermediate");
    zn_ckpt_close(ck);

    for (int pass = 0; pass < 2; pass++) {
        zn_dtype dt = pass ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
        snprintf(out, sizeof out, "%s/hf-%s", ck_root, zn_dtype_name(dt));
        /* 20 KB shards: several files */
        int rc = zn_ckpt_export(dir, out, dt, 20000);
        ZT_CHECK_MSG(rc == 0, "export %s: %s", zn_dtype_name(dt), zn_last_error());
        zn_st *st;
        char idx[4500];
        snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", out);
        rc = zn_st_open(&st, idx);
        ZT_CHECK_MSG(rc == 0, "opening the export: %s", zn_last_error());
        if (rc)
            break;
        ZT_CHECK(zn_st_num_shards(st) > 2);
        size_t count = 0;
        uint64_t flat = 0, mism = 0;
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < zn_model_block_nparams(&d, b); i++) {
                zn_param_info pi;
                ZT_EQ_INT(zn_model_block_param(&d, b, i, &pi), 0);
                const zn_st_tensor *t = zn_st_find(st, pi.name);
                ZT_CHECK_MSG(t != NULL, "%s missing from the export", pi.name);
                if (!t)
                    continue;
                count++;
                ZT_EQ_INT(t->ndim, pi.ndim);
                for (int k = 0; k < pi.ndim; k++)
                    ZT_CHECK(t->shape[k] == pi.shape[k]);
                ZT_CHECK(t->dtype == zn_st_dtype_from(dt));
                float *v = malloc((size_t)pi.numel * 4);
                ZT_EQ_INT(zn_st_read(st, t, ZN_DTYPE_F32, v, (size_t)pi.numel * 4), 0);
                for (int64_t e = 0; e < pi.numel; e++) {
                    float want = master[flat + (uint64_t)e];
                    if (dt == ZN_DTYPE_BF16)
                        want = zn_bf16_widen(zn_bf16_round(want));
                    if (memcmp(&v[e], &want, 4))
                        mism++;
                }
                flat += (uint64_t)pi.numel;
                free(v);
            }
        ZT_CHECK(flat == P);
        ZT_EQ_INT(count, zn_st_count(st));
        ZT_CHECK_MSG(!mism, "%s export: %llu values differ from the master rounded",
                     zn_dtype_name(dt), (unsigned long long)mism);
        zn_st_close(st);
        /* and it loads as a model (config.json + shards) */
        zn_dev_config dc = zn_dev_config_default();
        dc.name = "host";
        zn_dev *dev;
        ZT_EQ_INT(zn_dev_create(&dev, &dc), 0);
        /* config.json declares the dtype written, in both spellings, so
         * that transformers' default from_pretrained keeps it */
        char cj[4600];
        snprintf(cj, sizeof cj, "%s/config.json", out);
        json_error_t je;
        json_t *cfgj = json_load_file(cj, 0, &je);
        ZT_CHECK_MSG(cfgj != NULL, "%s: %s", cj, je.text);
        const char *want_dt = dt == ZN_DTYPE_F32 ? "float32" : "bfloat16";
        ZT_EQ_STR(json_string_value(json_object_get(cfgj, "torch_dtype")), want_dt);
        ZT_EQ_STR(json_string_value(json_object_get(cfgj, "dtype")), want_dt);
        json_decref(cfgj);
        zn_model_dims d3;
        ZT_EQ_INT(zn_model_dims_from_hf(&d3, out), 0);
        ZT_EQ_INT(d3.hidden, d.hidden);
        zn_model_config mc = zn_model_config_default(dev);
        mc.max_batch = 1;
        mc.max_seq = 8;
        zn_model *m;
        ZT_EQ_INT(zn_model_create(&m, dev, &d3, &mc), 0);
        zn_model_state *ms;
        ZT_EQ_INT(zn_model_state_create(&ms, m, 0), 0);
        rc = zn_model_state_load(ms, out);
        ZT_CHECK_MSG(rc == 0, "loading the export: %s", zn_last_error());
        zn_model_state_destroy(ms);
        zn_model_destroy(m);
        zn_dev_destroy(dev);
        printf("export %s: %zu tensors, values = master rounded: ok\n", zn_dtype_name(dt),
               count);
    }
    /* a corrupted master is refused by export too */
    char p[4600];
    snprintf(p, sizeof p, "%s/step-00000002/rank-0/master.bin", dir);
    int fd = open(p, O_RDWR);
    unsigned char c = 0;
    ZT_CHECK(pread(fd, &c, 1, 100) == 1);
    c ^= 1;
    ZT_CHECK(pwrite(fd, &c, 1, 100) == 1);
    close(fd);
    snprintf(out, sizeof out, "%s/hf-bad", ck_root);
    ZT_EQ_INT(zn_ckpt_export(dir, out, ZN_DTYPE_F32, 0), ZN_ECORRUPT);
    ZT_CONTAINS(zn_last_error(), "rank-0/master.bin");
    free(master);
    free(bp);
}

static void rm_all(void)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", nvme_dir);
    if (nvme_dir[0] && system(cmd))
        fprintf(stderr, "%s failed\n", cmd);
}

/* A file the checkpoint code writes is created new, never through what
 * was at its name: a link planted at the temporary name (found by probing:
 * .latest.tmp-PID followed a symlink and overwrote its target) is replaced
 * and its target left alone. */
static void test_planted_link(void)
{
    char victim[4400], link[4400];
    snprintf(victim, sizeof victim, "%s/victim", ck_root);
    snprintf(link, sizeof link, "%s/.latest.tmp-%ld", ck_root, (long)getpid());
    FILE *f = fopen(victim, "w");
    if (!f)
        ZT_SETUP_FAIL("fopen %s", victim);
    fputs("keep", f);
    fclose(f);
    if (symlink(victim, link) < 0)
        ZT_SETUP_FAIL("symlink %s", link);
    ZT_EQ_INT(zn_ckpt__write_small(link, "new", 3), 0);
    char buf[16] = "";
    f = fopen(victim, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    struct stat sb;
    ZT_CHECK_MSG(!strcmp(buf, "keep"), "the link's target was written: '%s'", buf);
    ZT_CHECK_MSG(lstat(link, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 3,
                 "%s is not the new 3-byte file", link);
    unlink(link);
    unlink(victim);
}

int main(void)
{
    snprintf(nvme_dir, sizeof nvme_dir, "%s", tn_tmpdir("ckpt"));
    atexit(rm_all);
    snprintf(ck_root, sizeof ck_root, "%s/ck", nvme_dir);
    if (mkdir(ck_root, 0755) < 0)
        ZT_SETUP_FAIL("mkdir %s: %s", ck_root, strerror(errno));
    test_planted_link();
    if (zn_tokens_synthetic(&data, 40000, V, 3))
        ZT_SETUP_FAIL("synthetic data: %s", zn_last_error());
    zn_loader_config lc = zn_loader_config_default();
    lc.seq_len = SEQ;
    lc.batch = ACC * MB;
    lc.seed = 5;
    lc.vocab = V;
    if (zn_loader_create(&loader, data, &lc))
        ZT_SETUP_FAIL("loader: %s", zn_last_error());

    /* the GPU budget that leaves room for exactly two mid blocks (test_train) */
    uint64_t slot = (uint64_t)(2 * H * H) * 4, tiny;
    {
        toy_model toy;
        zn_trainer *tr;
        const char *sets[] = { "zero_optimization.offload_param.device=\"cpu\"" };
        if (create(&tr, &toy, sets, 1, 0))
            ZT_SETUP_FAIL("probe: %s", zn_last_error());
        zn_train_report r;
        zn_train_get_report(tr, &r);
        tiny = r.peak[ZN_TIER_GPU] - (uint64_t)r.param_slots * slot + 2 * slot + slot / 2;
        zn_train_destroy(tr);
    }
    const char *dev[] = { "zero_optimization.offload_param.device=\"none\"",
                          "zero_optimization.offload_optimizer.device=\"none\"" };
    const char *cpu[] = { "zero_optimization.offload_param.device=\"cpu\"",
                          "zero_optimization.offload_optimizer.device=\"cpu\"" };
    const char *cpu_nvme[] = { "zero_optimization.offload_param.device=\"cpu\"",
                               "zero_optimization.offload_optimizer.device=\"nvme\"" };
    const char *nvme[] = { "zero_optimization.offload_param.device=\"nvme\"",
                           "zero_optimization.offload_optimizer.device=\"nvme\"" };
    const char *nvme0[] = { "zero_optimization.offload_param.device=\"nvme\"",
                            "zero_optimization.offload_optimizer.device=\"nvme\"",
                            "zero_optimization.offload_param.max_in_cpu=0" };
    placement pl[] = {
        { "all on the device", dev, 2, 0 },
        { "params+optimizer cpu", cpu, 2, 1 },
        { "params cpu, optimizer nvme", cpu_nvme, 2, 1 },
        { "params+optimizer nvme, tiny gpu", nvme, 2, 1 },
    };
    /* the optimizer on the device with its blocks' homes off it: the load
     * makes the working copies on the device and sends them home */
    const char *nvme_dopt[] = { "zero_optimization.offload_param.device=\"nvme\"",
                                "zero_optimization.offload_optimizer.device=\"none\"",
                                "zero_optimization.offload_param.max_in_cpu=0" };
    placement dopt_off = { "params nvme, optimizer on the device, tiny gpu", nvme_dopt, 3, 2 };
    placement nvme_home = { "params (none in cpu)+optimizer nvme, tiny gpu", nvme0, 3, 1 };

    /* the uninterrupted reference */
    ref_run ref;
    {
        toy_model toy;
        zn_trainer *tr;
        if (create(&tr, &toy, dev, 2, 0))
            ZT_SETUP_FAIL("create: %s", zn_last_error());
        ZT_EQ_INT(steps(tr, 0, STEPS, ref.loss), 0);
        read_master(tr, &ref);
        zn_train_destroy(tr);
    }
    for (int i = 0; i < 4; i++)
        resume_case(&pl[i], &pl[i], tiny, &ref);
    resume_case(&pl[3], &pl[0], tiny, &ref);
    resume_case(&pl[0], &pl[2], tiny, &ref);
    resume_case(&pl[1], &pl[3], tiny, &ref);
    resume_case(&dopt_off, &dopt_off, tiny, &ref);
    resume_case(&pl[1], &dopt_off, tiny, &ref);
    rewind_case(&nvme_home, tiny, &ref);
    final_case(&pl[2], &pl[2], tiny, &ref);
    final_case(&pl[3], &pl[1], tiny, &ref);
    commit_case(tiny);
    commit_stop_while_writing(tiny);

    /* a good checkpoint to damage */
    {
        char good[4400];
        snprintf(good, sizeof good, "%s/good", ck_root);
        toy_model toy;
        zn_trainer *tr;
        double loss[STEPS];
        if (create(&tr, &toy, cpu_nvme, 2, tiny))
            ZT_SETUP_FAIL("create: %s", zn_last_error());
        ZT_EQ_INT(steps(tr, 0, HALF, loss), 0);
        zn_ckpt_save_options so = save_opts(good);
        char where[4500];
        ZT_EQ_INT(zn_ckpt_save(tr, &so, where, sizeof where), 0);
        zn_train_destroy(tr);
        corruption(where, cpu, 2);
    }
    background_case(&pl[1], &pl[2], tiny, &ref);
    io_errors(&pl[0], tiny, &ref);
    io_errors(&pl[3], tiny, &ref);
    prune_and_refusals(cpu, 2);
    export_case();
    free(ref.master);
    zn_loader_destroy(loader);
    zn_tokens_close(data);
    return zt_done();
}
