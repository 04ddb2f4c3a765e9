/* A training run set up from a config: the ranks joined, the model and its
 * weights (or adapters) loaded, budgets, the plan and the trainer, the
 * data loaders. Config plus machine in, a ready trainer out; `zinc train`,
 * `zinc bench train` and the tests all start a run here, so each gets the
 * same placement, the same optimizer fitting and the same data. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zinc/ckpt.h"
#include "zinc/comm.h"
#include "zinc/run.h"
#include "zinc/safetensors.h"
#include "zinc/tokens.h"
#include "zinc/train.h"

void zn_run_close(zn_run *ts)
{
    zn_train_destroy(ts->tr);
    zn_train_llama_destroy(ts->llama);
    zn_loader_destroy(ts->loader);
    zn_tokens_close(ts->data);
    zn_loader_destroy(ts->eval_loader);
    zn_tokens_close(ts->eval_data);
    free(ts->ids);
    free(ts->tgts);
    free(ts->pos);
    free(ts->eval_ids);
    free(ts->eval_tgts);
    free(ts->eval_pos);
    zn_comm_destroy(ts->comm);
    memset(ts, 0, sizeof *ts);
}

void zn_run_free_trainer(zn_run *ts)
{
    zn_train_destroy(ts->tr);
    ts->tr = NULL;
}

int zn_run_barrier(zn_run *ts)
{
    return ts->comm && ts->world > 1 ? zn_comm_barrier(ts->comm) : 0;
}

int zn_run_abort(zn_run *ts, int code)
{
    return ts->comm && ts->world > 1 ? zn_comm_abort(ts->comm, code) : 0;
}

/* Joins the ranks; with several, picks this rank's device (LOCAL_RANK) and
 * binds it to a NUMA node. */
static int join_ranks(zn_run *ts, zn_config *cfg, int *local_size)
{
    zn_launch_info li;
    int rc = zn_launch_detect(&li);
    if (rc)
        return rc;
    zn_comm_config cc = zn_comm_config_default();
    cc.launch = &li;
    if ((rc = zn_comm_create(&ts->comm, &cc)))
        return zn_error_prefix(rc, "joining the ranks (%s launch)",
                               zn_launcher_name(li.launcher));
    ts->rank = zn_comm_rank(ts->comm);
    ts->world = zn_comm_size(ts->comm);
    *local_size = li.local_size > 0 ? li.local_size : 1;
    if (ts->world == 1)
        return 0;
    if (!cfg->train.device[0] || !strcmp(cfg->train.device, "auto")) {
        char name[sizeof cfg->train.device];
        if ((rc = zn_launch_device_name(&li, name, sizeof name)))
            return rc;
        snprintf(cfg->train.device, sizeof cfg->train.device, "%s", name);
    }
    /* one NUMA node per local rank, where there is more than one */
    zn_topo topo;
    int node = -1;
    if (!zn_topo_discover(&topo) && topo.n_numa > 1 && zn_launch_bind_numa(&li, -1, &node))
        zn_warn("rank %d: NUMA binding failed: %s", ts->rank, zn_last_error());
    return 0;
}

/* The token data and the loader of the global batch (every rank reads it
 * and trains on its slice). `count` > 0 fixes the synthetic set's size (a
 * resumed run must see the ids its checkpoint was trained on; the default
 * size depends on train.steps). */
int zn_run_open_data(zn_run *ts, const zn_config *cfg, uint64_t count)
{
    int rc;
    int64_t B = cfg->train_micro_batch_size_per_gpu, T = cfg->data.seq_len;
    int64_t A = cfg->gradient_accumulation_steps;
    zn_loader_destroy(ts->loader);
    zn_tokens_close(ts->data);
    ts->loader = NULL;
    ts->data = NULL;
    if ((rc = zn_run_check_data(cfg, &ts->dims, 1)))
        return rc;
    if (!ZN_DATA_SYNTHETIC(&cfg->data)) {
        if ((rc = zn_tokens_open(&ts->data, cfg->data.path)))
            return rc;
    } else {
        uint64_t need = (uint64_t)(cfg->train.steps > 0 ? cfg->train.steps : 1) *
                        (uint64_t)(ts->world * A * B * (T + 1)) + (uint64_t)T + 1;
        if (!count)
            count = need < (1u << 18) ? (1u << 18) : need > (1u << 26) ? (1u << 26) : need;
        if ((rc = zn_tokens_synthetic(&ts->data, count, (uint32_t)ts->dims.vocab,
                                      cfg->data.seed)))
            return rc;
    }
    zn_loader_config lc = zn_loader_config_default();
    lc.seq_len = T;
    lc.batch = ts->world * A * B;  /* the global batch: rank r trains on slice r */
    lc.seed = cfg->data.seed;
    lc.vocab = ts->dims.vocab;
    lc.packing = cfg->data.packing;
    if ((rc = zn_loader_create(&ts->loader, ts->data, &lc)))
        return rc;
    if (!ts->ids) {
        ts->rank_tokens = (size_t)(A * B * T);
        size_t n = (size_t)ts->world * ts->rank_tokens;
        ts->ids = malloc(n * sizeof *ts->ids);
        ts->tgts = malloc(n * sizeof *ts->tgts);
        ts->pos = malloc(n * sizeof *ts->pos);
        if (!ts->ids || !ts->tgts || !ts->pos)
            return zn_set_error(-ENOMEM, "out of memory");
    }
    return 0;
}

/* LoRA: the adapters' start (lora.adapter, or PEFT's init from lora.seed)
 * and the header's line, with PEFT's print_trainable_parameters figures. */
static int choose_adapters(zn_run *ts, const zn_config *cfg, int flags)
{
    const zn_lora *l = &ts->dims.lora;
    if (l->r <= 0)
        return 0;
    char from[ZN_PATH_MAX + 64], tg[96] = "";
    for (unsigned t = 1; t <= ZN_LORA_LAST; t <<= 1)
        if (l->targets & t)
            snprintf(tg + strlen(tg), sizeof tg - strlen(tg), "%s%s", tg[0] ? "," : "",
                     zn_lora_target_name(t));
    /* the init's stream and the dropout masks' (which resume draws the same) */
    zn_train_llama_set_lora_seed(ts->llama, cfg->lora.seed);
    if (flags & ZN_RUN_NO_WEIGHTS) {
        snprintf(from, sizeof from, "from the checkpoint");
    } else if (cfg->lora.adapter[0]) {
        char desc[ZN_PATH_MAX + 64];
        int rc = zn_train_llama_load_adapter(ts->llama, cfg->lora.adapter, desc, sizeof desc);
        if (rc)
            return zn_error_prefix(rc, "%s", cfg->source);
        snprintf(from, sizeof from, "%s", desc);
    } else {
        if (!cfg->lora.init_lora_weights)
            return zn_set_error(ZN_EUNSUPPORTED, "%s: lora.init_lora_weights false without "
                                "lora.adapter: zinc starts adapters from PEFT's default init "
                                "(true) or from an adapter folder", cfg->source);
        snprintf(from, sizeof from, "PEFT init, seed %llu", (unsigned long long)cfg->lora.seed);
    }
    uint64_t tr = zn_model_trainable_count(&ts->dims), all = zn_model_param_count(&ts->dims);
    char drop[48] = "";
    if (l->dropout > 0)
        snprintf(drop, sizeof drop, ", dropout %g", l->dropout);
    snprintf(ts->lora, sizeof ts->lora, "r %d, alpha %g%s%s, %s; trainable params: %llu || all "
             "params: %llu || trainable%%: %.4f; adapters %s", l->r, l->alpha,
             l->rslora ? " (rslora)" : "", drop, tg, (unsigned long long)tr,
             (unsigned long long)all, 100.0 * (double)tr / (double)all, from);
    return 0;
}

/* The initial weights: model.path's safetensors, checked against the
 * model before the trainer allocates anything, or the seeded init. */
static int choose_weights(zn_run *ts, const zn_config *cfg, int flags)
{
    const char *mp = cfg->model.path;
    int rc = choose_adapters(ts, cfg, flags);
    if (rc)
        return rc;
    /* a resumed LoRA run reads its frozen base again: the checkpoint holds
     * only the adapters */
    if (ts->dims.lora.r > 0)
        flags &= ~ZN_RUN_NO_WEIGHTS;
    if (!mp[0] || cfg->model.init == 1 || (flags & ZN_RUN_NO_WEIGHTS)) {
        snprintf(ts->weights, sizeof ts->weights, "%s, seed %llu",
                 flags & ZN_RUN_NO_WEIGHTS ? "from the checkpoint (after a seeded init)"
                                           : "random init",
                 (unsigned long long)cfg->model.seed);
        return 0;
    }
    char desc[sizeof ts->weights - 16], a[ZN_PATH_MAX + 40], b[ZN_PATH_MAX + 40];
    struct stat st;
    snprintf(a, sizeof a, "%s/model.safetensors", mp);
    snprintf(b, sizeof b, "%s/model.safetensors.index.json", mp);
    bool none = !stat(mp, &st) && S_ISDIR(st.st_mode) && access(a, F_OK) && access(b, F_OK);
    if (none && (flags & ZN_RUN_SHAPES_ONLY)) {
        snprintf(ts->weights, sizeof ts->weights, "none in %s: its config.json's shapes", mp);
        return 1;
    }
    if (none)
        return zn_set_error(-ENOENT, "%s: model.path %s has no weights (no model.safetensors or "
                            "model.safetensors.index.json); to train this shape from a seeded "
                            "random init, set model.init=random", cfg->source, mp);
    rc = zn_train_llama_load(ts->llama, mp, desc, sizeof desc);
    if (rc)
        return zn_error_prefix(rc, "%s: model.path", cfg->source);
    snprintf(ts->weights, sizeof ts->weights, "%s", desc);
    return 0;
}

/* data.eval_path: its windows in file order, one global batch at a time */
static int open_eval(zn_run *ts, const zn_config *cfg)
{
    if (!cfg->data.eval_path[0])
        return 0;
    int64_t B = cfg->train_micro_batch_size_per_gpu, T = cfg->data.seq_len;
    int rc = zn_tokens_open(&ts->eval_data, cfg->data.eval_path);
    if (rc)
        return zn_error_prefix(rc, "%s: data.eval_path", cfg->source);
    zn_loader_config lc = zn_loader_config_default();
    lc.seq_len = T;
    lc.batch = ts->world * B;
    lc.shuffle = 0;
    lc.vocab = ts->dims.vocab;
    lc.packing = cfg->data.packing;
    lc.partial = 1;   /* a small eval split is evaluated, as the HF Trainer does */
    if ((rc = zn_loader_create(&ts->eval_loader, ts->eval_data, &lc)))
        return zn_error_prefix(rc, "%s: data.eval_path", cfg->source);
    size_t n = (size_t)(ts->world * B * T);
    ts->eval_ids = malloc(n * sizeof *ts->eval_ids);
    ts->eval_tgts = malloc(n * sizeof *ts->eval_tgts);
    ts->eval_pos = malloc(n * sizeof *ts->eval_pos);
    if (!ts->eval_ids || !ts->eval_tgts || !ts->eval_pos)
        return zn_set_error(-ENOMEM, "out of memory");
    return 0;
}

int zn_run_eval(zn_run *ts, const zn_config *cfg, double *mean,
                              uint64_t *n_targets)
{
    uint64_t nb = zn_loader_steps_per_epoch(ts->eval_loader), tgt = 0;
    if (cfg->train.eval_batches > 0 && (uint64_t)cfg->train.eval_batches < nb)
        nb = (uint64_t)cfg->train.eval_batches;
    size_t slice = (size_t)(cfg->train_micro_batch_size_per_gpu * cfg->data.seq_len);
    double sum = 0;
    for (uint64_t k = 0; k < nb; k++) {
        double s;
        uint64_t c;
        int rc = zn_loader_get(ts->eval_loader, k, ts->eval_ids, ts->eval_tgts, ts->eval_pos);
        size_t at = (size_t)ts->rank * slice;
        if (!rc)
            rc = zn_train_eval(ts->tr, ts->eval_ids + at, ts->eval_tgts + at, ts->eval_pos + at,
                               1, &s, &c);
        if (rc)
            return zn_error_prefix(rc, "evaluation on %s", cfg->data.eval_path);
        sum += s;
        tgt += c;
    }
    *mean = tgt ? sum / (double)tgt : NAN;
    *n_targets = tgt;
    return 0;
}

/* train.num_train_epochs (the HF Trainer's name): the steps that many
 * passes over the token file's windows take at the global batch, unless
 * train.steps (or max_steps) is given, which wins as HF's max_steps does. */
static int epochs_to_steps(zn_run *ts, zn_config *cfg, FILE *note)
{
    double ep = cfg->train.num_train_epochs;
    if (ep <= 0)
        return 0;
    if (zn_config_get_origin(cfg, "train.steps") != ZN_ORIGIN_DEFAULT) {
        if (note && ts->rank == 0)
            fprintf(note, "  note       train.num_train_epochs %g: train.steps %lld is given and "
                    "wins (as the HF Trainer's max_steps does)\n", ep,
                    (long long)cfg->train.steps);
        return 0;
    }
    if (ZN_DATA_SYNTHETIC(&cfg->data))
        return zn_set_error(ZN_ECONFIG, "%s: train.num_train_epochs needs a token file "
                            "(data.path): the synthetic set has no epochs; give train.steps",
                            cfg->source);
    int rc = zn_run_open_data(ts, cfg, 0);
    if (rc)
        return rc;
    uint64_t spe = zn_loader_steps_per_epoch(ts->loader);
    if (!spe)
        return zn_set_error(ZN_ECONFIG, "%s: %s holds less than one global batch of windows",
                            cfg->source, cfg->data.path);
    int64_t steps = (int64_t)ceil(ep * (double)spe);
    zn_config_set_steps(cfg, steps);
    if (note && ts->rank == 0)
        fprintf(note, "  epochs     %g x %llu steps per epoch (%llu windows of %lld tokens, "
                "global batch %lld) = %lld steps; the schedule over them: warmup %lld, "
                "total %lld (these replace the defaults above)\n", ep, (unsigned long long)spe,
                (unsigned long long)zn_loader_num_windows(ts->loader),
                (long long)cfg->data.seq_len, (long long)cfg->train_batch_size, (long long)steps,
                (long long)cfg->scheduler.warmup_num_steps,
                (long long)cfg->scheduler.total_num_steps);
    return 0;
}

int zn_run_open(zn_run *ts, zn_config *cfg, int flags, FILE *note)
{
    memset(ts, 0, sizeof *ts);
    ts->world = 1;
    int rc, local_size = 1;
    uint64_t *blocks = NULL;
    zn_spec *sp = NULL;
    zn_model_dims d;
    zn_topo topo;
    zn_plan_budgets budgets;
    rc = join_ranks(ts, cfg, &local_size);
    ts->local_size = local_size;
    if (rc || (rc = zn_run_resolve(cfg, NULL, ts->world, ts->rank == 0 ? note : NULL)) ||
        (rc = zn_run_model_dims(cfg, &d)))
        goto out;
    if ((rc = zn_topo_discover(&topo))) {
        rc = zn_error_prefix(rc, "topology");
        goto out;
    }
    if ((rc = zn_run_budgets(cfg, &topo, zn_run_gpu_free(cfg), &budgets)) ||
        (rc = zn_run_check_budgets(cfg, &topo, &budgets, 1)))
        goto out;
    /* "auto" budgets of host memory and disk are shared by the ranks of a host */
    if (local_size > 1) {
        if (cfg->tiers.cpu_auto)
            budgets.bytes[ZN_TIER_CPU] /= (uint64_t)local_size;
        if (cfg->tiers.gpu_auto && !zn_run_gpu_free(cfg))
            budgets.bytes[ZN_TIER_GPU] /= (uint64_t)local_size;
        budgets.bytes[ZN_TIER_NVME] /= (uint64_t)local_size;
    }
    int nb = zn_model_num_parts(&d);
    blocks = calloc((size_t)nb, sizeof *blocks);
    sp = calloc(1, sizeof *sp);
    if (!blocks || !sp) {
        rc = zn_set_error(-ENOMEM, "out of memory");
        goto out;
    }
    zn_plan_input in;
    zn_run_plan_input(cfg, &d, ts->world, blocks, &in);

    int64_t B = cfg->train_micro_batch_size_per_gpu, T = cfg->data.seq_len;
    ts->dims = d;
    if ((rc = epochs_to_steps(ts, cfg, note)))
        goto out;
    if ((rc = zn_train_llama_create(&ts->llama, &d, B, T, cfg->model.init_std, cfg->model.seed)) ||
        (rc = choose_weights(ts, cfg, flags)))
        goto out;
    zn_train_llama_set_attention(ts->llama, cfg->train.attention);
    if ((rc = zn_run_spec(cfg, &in, &budgets, sp)))
        goto out;
    zn_train_options o = zn_train_options_default();
    o.spec = sp;
    o.model = zn_train_llama_model(ts->llama);
    o.record_trace = (flags & ZN_RUN_TRACE) != 0;
    o.comm = ts->comm;
    if ((rc = zn_run_fit_optimizer(cfg, sp, &o, ts->world, ts->rank == 0 ? note : NULL)) < 0)
        goto out;
    double t0 = zn_now_s();
    if ((rc = zn_train_create(&ts->tr, &o)))
        goto out;
    ts->load_s = zn_now_s() - t0;
    uint64_t all_bytes;
    ts->load_bytes = zn_train_llama_bytes_read(ts->llama, &all_bytes);
    if (all_bytes && ts->world > 1)  /* one rank: the header's weights line says it */
        zn_info("rank %d of %d: read %llu of the weights' %llu bytes (%.3f) in %.2f s", ts->rank,
                ts->world, (unsigned long long)ts->load_bytes, (unsigned long long)all_bytes,
                (double)ts->load_bytes / (double)all_bytes, ts->load_s);

    ts->dims = d;
    if ((rc = zn_run_open_data(ts, cfg, 0)) || (rc = open_eval(ts, cfg)))
        goto out;
    ts->params = zn_model_param_count(&d);
out:
    free(blocks);
    free(sp);
    if (rc) {
        /* everything but the communicator: the caller reports, then may
         * end the other ranks with it (zn_run_abort) */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zn_last_error());
        zn_comm *comm = ts->comm;
        int rank = ts->rank, world = ts->world;
        ts->comm = NULL;
        zn_run_close(ts);
        ts->comm = comm;
        ts->rank = rank;
        ts->world = world;
        zn_set_error(rc, "%s", msg);
    }
    return rc;
}

int zn_run_step(zn_run *ts, uint64_t step, zn_train_step_info *info)
{
    int rc = zn_loader_get(ts->loader, step, ts->ids, ts->tgts, ts->pos);
    if (rc)
        return rc;
    size_t at = (size_t)ts->rank * ts->rank_tokens;
    return zn_train_step(ts->tr, ts->ids + at, ts->tgts + at, ts->pos + at, info);
}

int zn_run_check_weights(const zn_config *cfg, const zn_model_dims *d)
{
    zn_run ts;
    memset(&ts, 0, sizeof ts);
    ts.dims = *d;
    int rc = zn_train_llama_create(&ts.llama, d, cfg->train_micro_batch_size_per_gpu,
                                   cfg->data.seq_len, cfg->model.init_std, cfg->model.seed);
    if (!rc)
        rc = choose_weights(&ts, cfg, ZN_RUN_SHAPES_ONLY);
    zn_train_llama_destroy(ts.llama);
    return rc;
}
