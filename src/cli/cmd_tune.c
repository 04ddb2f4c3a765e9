/* `zinc plan CONFIG --tune`: the placements that fit, ranked by the cost
 * model's predicted step time (zinc/cost.h), for this machine (its ceilings
 * measured once and cached) or a named target (--target a10). Each
 * candidate is the user's config with a few --set keys changed and is
 * planned exactly as `zinc train` with those --sets would plan it (the
 * trainer's allocation run dry), so a candidate the plan contract refuses
 * is never offered. The global batch is kept: micro-batch x accumulation
 * stays the config's product. --write FILE writes the chosen config (the
 * user's JSON with the chosen keys set, and a "_tune" object saying where
 * each value came from). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "util/fs-impl.h"
#include "zinc/cost.h"
#include "zinc/run.h"
#include "zinc/zinc.h"

#define MAX_KNOBS 8

typedef struct {
    char set[MAX_KNOBS][96];   /* "key=value" */
    int n_set;
    int fits;                  /* 1 fits, 0 does not, -1 error */
    char why[160];             /* does not fit / error: the first reason */
    zn_cost cost;
    uint64_t host_bytes;       /* the cpu tier's total */
    bool given;                /* the config as given (no key changed) */
} cand;

static const char *dev_names[] = { "none", "cpu", "nvme" };

/* The value a candidate key has in the config as loaded, for "what
 * differs" and the provenance of --write. */
static void current_value(const zn_config *c, const char *key, char *out, size_t n)
{
    if (!strcmp(key, "zero_optimization.offload_param.device"))
        snprintf(out, n, "%s", dev_names[c->zero.offload_param.device]);
    else if (!strcmp(key, "zero_optimization.offload_optimizer.device"))
        snprintf(out, n, "%s", dev_names[c->zero.offload_optimizer.device]);
    else if (!strcmp(key, "zero_optimization.stage"))
        snprintf(out, n, "%d", c->zero.stage);
    else if (!strcmp(key, "train_micro_batch_size_per_gpu"))
        snprintf(out, n, "%lld", (long long)c->train_micro_batch_size_per_gpu);
    else if (!strcmp(key, "gradient_accumulation_steps"))
        snprintf(out, n, "%lld", (long long)c->gradient_accumulation_steps);
    else if (!strcmp(key, "activation_checkpointing.cpu_checkpointing"))
        snprintf(out, n, "%s", c->activation_checkpointing.cpu_checkpointing ? "true" : "false");
    else if (!strcmp(key, "tiers.grads"))
        snprintf(out, n, "%s", c->tiers.grads == 1 ? "cpu" : c->tiers.grads == 2 ? "nvme" : "auto");
    else
        snprintf(out, n, "?");
}

static void add_set(cand *c, const char *key, const char *val)
{
    if (c->n_set < MAX_KNOBS)
        snprintf(c->set[c->n_set++], sizeof c->set[0], "%s=%s", key, val);
}

/* The candidate's keys that differ from the config as given ("" for none). */
static void describe(const cand *c, const zn_config *base, char *out, size_t n)
{
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < c->n_set; i++) {
        char key[96], cur[32];
        snprintf(key, sizeof key, "%s", c->set[i]);
        char *eq = strchr(key, '=');
        *eq = '\0';
        current_value(base, key, cur, sizeof cur);
        if (!strcmp(cur, eq + 1))
            continue;
        const char *short_key = strrchr(key, '.') ? strrchr(key, '.') + 1 : key;
        if (!strcmp(key, "zero_optimization.offload_param.device"))
            short_key = "offload_param";
        else if (!strcmp(key, "zero_optimization.offload_optimizer.device"))
            short_key = "offload_optimizer";
        if (o < n)
            o += (size_t)snprintf(out + o, n - o, "%s%s=%s", o ? ", " : "", short_key, eq + 1);
    }
    if (!out[0])
        snprintf(out, n, "(the config as given)");
}

static int by_step(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->fits != y->fits)
        return y->fits - x->fits;
    return (x->cost.step_s > y->cost.step_s) - (x->cost.step_s < y->cost.step_s);
}

/* Plans one candidate and predicts it; the compute comes from the probe of
 * its micro-batch (this machine) or the target's analytic rate. */
static void evaluate(cand *c, const char *path, const char **user_sets, int n_user, int world,
                     const zn_ceilings *target, FILE *devnull, int flags)
{
    const char *sets[96];
    int n = 0;
    for (int i = 0; i < n_user && n < 80; i++)
        sets[n++] = user_sets[i];
    for (int i = 0; i < c->n_set; i++)
        sets[n++] = c->set[i];
    zn_config cfg;
    zn_model_dims d;
    zn_plan plan;
    zn_plan_input in;
    int rc = zn_cli_plan_config(path, sets, n, world, target ? target->gpu_bytes : 0, devnull,
                                false, &cfg, &d, &plan, &in);
    if (rc) {
        c->fits = rc == ZN_ENOFIT ? 0 : -1;
        snprintf(c->why, sizeof c->why, "%.159s", rc == ZN_ENOFIT ? plan.why : zn_last_error());
        return;
    }
    c->fits = 1;
    c->host_bytes = plan.tier_total[ZN_TIER_CPU];
    /* the values the run resolved (an optimizer "none" that does not fit
     * on the GPU moves to "cpu", as zinc train moves it) */
    for (int i = 0; i < c->n_set; i++) {
        char key[96], v[32];
        snprintf(key, sizeof key, "%s", c->set[i]);
        *strchr(key, '=') = '\0';
        current_value(&cfg, key, v, sizeof v);
        snprintf(c->set[i], sizeof c->set[i], "%.63s=%.31s", key, v);
    }
    int mb = zn_config_moment_bytes(cfg.train.optim);
    int fmt = mb == 1 ? 2 : mb == 2 ? 1 : 0;
    uint64_t tokens = (uint64_t)(cfg.train_micro_batch_size_per_gpu * cfg.data.seq_len) *
                      (uint64_t)cfg.gradient_accumulation_steps;
    if (target) {
        zn_cost_compute comp;
        double lf = zn_model_flops(&d, 1, cfg.train_micro_batch_size_per_gpu, cfg.data.seq_len);
        double hf = zn_model_flops(&d, (int)d.n_layers + 1, cfg.train_micro_batch_size_per_gpu,
                                   cfg.data.seq_len);
        zn_cost_compute_analytic(target, lf / 3, hf * 4 / 3, cfg.train.activation_checkpointing,
                                 &comp);
        comp.blocks = zn_model_num_parts(&d);
        rc = zn_cost_predict(&plan, target, &comp, d.n_layers, tokens, fmt, &c->cost);
    } else {
        rc = zn_run_predict(&cfg, &d, &plan, flags, &c->cost, stderr);
    }
    if (rc) {
        c->fits = -1;
        snprintf(c->why, sizeof c->why, "no prediction: %s",
                 c->cost.missing[0] ? c->cost.missing : zn_last_error());
    }
}

/* The config file with the chosen keys set and their provenance. */
static int write_config(const char *src, const char *dst, const cand *c, const zn_config *base,
                        const cand *given, const char *ceil_name)
{
    json_error_t e;
    json_t *root = json_load_file(src, 0, &e);
    if (!root)
        return zn_set_error(ZN_ECONFIG, "--write: %s is not JSON (line %d: %s); --write takes "
                            "a JSON config", src, e.line, e.text);
    json_t *prov = json_object();
    for (int i = 0; i < c->n_set; i++) {
        char key[96], cur[32];
        snprintf(key, sizeof key, "%s", c->set[i]);
        char *eq = strchr(key, '=');
        *eq = '\0';
        const char *val = eq + 1;
        current_value(base, key, cur, sizeof cur);
        if (!strcmp(cur, val))
            continue;
        json_t *v = json_loads(val, JSON_DECODE_ANY, NULL);
        if (!v)
            v = json_string(val);
        json_t *cur_obj = root;
        char *save = NULL, path[96];
        snprintf(path, sizeof path, "%s", key);
        char *seg = strtok_r(path, ".", &save);
        while (seg) {
            char *next = strtok_r(NULL, ".", &save);
            if (!next) {
                json_object_set_new(cur_obj, seg, v);
                break;
            }
            json_t *child = json_object_get(cur_obj, seg);
            if (!json_is_object(child)) {
                child = json_object();
                json_object_set_new(cur_obj, seg, child);
            }
            cur_obj = child;
            seg = next;
        }
        char why[200];
        snprintf(why, sizeof why, "zinc plan --tune: was %s", cur);
        json_object_set_new(prov, key, json_pack("{s:O,s:s}", "value", json_object_get(cur_obj, strrchr(key, '.') ? strrchr(key, '.') + 1 : key), "from", why));
    }
    json_object_set_new(root, "_tune", json_pack("{s:s,s:f,s:f,s:s,s:o}", "by",
                                                 "zinc plan --tune", "predicted_step_s",
                                                 c->cost.step_s, "given_predicted_step_s",
                                                 given && given->fits == 1 ? given->cost.step_s : 0.0,
                                                 "ceilings", ceil_name, "settings", prov));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    int rc = text ? zn_fs_write_atomic(dst, text, strlen(text))
                  : zn_set_error(-ENOMEM, "out of memory");
    free(text);
    return rc ? zn_error_prefix(rc, "--write %s", dst) : 0;
}

int zn_cli_tune(const char *path, const char **sets, int n_sets, int world, const char *target_name,
                bool tune, bool recalibrate, const char *write)
{
    const zn_ceilings *target = NULL;
    if (target_name && !(target = zn_cost_target(target_name))) {
        fprintf(stderr, "zinc: error: --target %s: known targets are %s\n", target_name,
                zn_cost_target_names());
        return 2;
    }
    /* the config as given, for what it is and what changes */
    const char *tsets[96];
    int nt = 0;
    for (int i = 0; i < n_sets && nt < 80; i++)
        tsets[nt++] = sets[i];
    if (target && target->cuda)
        tsets[nt++] = "train.device=cuda";
    FILE *devnull = fopen("/dev/null", "w");
    if (!devnull)
        return zn_cli_fail(-errno, "/dev/null");
    zn_config base;
    zn_model_dims d;
    zn_plan plan;
    zn_plan_input in;
    int rc = zn_cli_plan_config(path, tsets, nt, world, target ? target->gpu_bytes : 0, stdout,
                                false, &base, &d, &plan, &in);
    if (rc && rc != ZN_ENOFIT) {
        fclose(devnull);
        return zn_cli_fail(rc, NULL);
    }
    int flags = recalibrate ? ZN_CEIL_RECALIBRATE : 0;
    zn_ceilings here;
    zn_cost_compute comp0;
    if (!target) {
        /* measured once, before the search (announced), then from the cache */
        if ((rc = zn_run_ceilings(&base, &d, flags, &here, &comp0, stdout))) {
            fclose(devnull);
            return zn_cli_fail(rc, "cost model");
        }
        flags = 0;
    }
    const zn_ceilings *ceil = target ? target : &here;
    printf("\ncost model: %s\n", ceil->source);

    /* the knobs */
    int64_t gb = base.train_micro_batch_size_per_gpu * base.gradient_accumulation_steps;
    int64_t micros[16];
    int nm = 0;
    for (int64_t m = 1; m <= gb && nm < 16; m++)
        if (gb % m == 0 && m <= 64)
            micros[nm++] = m;
    bool ckpt = base.train.activation_checkpointing;
    int max_c = 3 * 3 * 2 * nm * 2 + 1;
    cand *cs = calloc((size_t)max_c, sizeof *cs);
    if (!cs) {
        fclose(devnull);
        return zn_cli_fail(-ENOMEM, "tune");
    }
    int nc = 1;  /* cs[0]: the config as given */
    if (tune) {
        for (int p = 0; p < 3; p++)
            for (int o = 0; o < 3; o++)
                for (int g = 0; g < (o == 2 ? 2 : 1); g++)
                    for (int mi = 0; mi < nm; mi++)
                        for (int k = 0; k < (ckpt ? 2 : 1); k++) {
                            cand *c = &cs[nc++];
                            char v[32];
                            add_set(c, "zero_optimization.offload_param.device", dev_names[p]);
                            add_set(c, "zero_optimization.offload_optimizer.device", dev_names[o]);
                            snprintf(v, sizeof v, "%d", p ? 3 : base.zero.stage);
                            add_set(c, "zero_optimization.stage", v);
                            if (o == 2)
                                add_set(c, "tiers.grads", g ? "nvme" : "auto");
                            snprintf(v, sizeof v, "%lld", (long long)micros[mi]);
                            add_set(c, "train_micro_batch_size_per_gpu", v);
                            snprintf(v, sizeof v, "%lld", (long long)(gb / micros[mi]));
                            add_set(c, "gradient_accumulation_steps", v);
                            if (ckpt)
                                add_set(c, "activation_checkpointing.cpu_checkpointing",
                                        k ? "true" : "false");
                        }
    }
    /* a grid point equal to the config as given is that candidate */
    cs[0].given = true;
    for (int i = 1; i < nc; i++) {
        char what[256];
        describe(&cs[i], &base, what, sizeof what);
        if (!strcmp(what, "(the config as given)"))
            cs[i--] = cs[--nc];
    }
    for (int i = 0; i < nc; i++)
        evaluate(&cs[i], path, tsets, nt, world, target, devnull, flags);
    fclose(devnull);
    qsort(cs, (size_t)nc, sizeof *cs, by_step);
    /* candidates the run resolves to the same settings are one (the
     * faster copy stays; "the config as given" passes to it) */
    for (int i = 1; i < nc; i++) {
        int same = -1;
        for (int j = 0; j < i && same < 0 && cs[i].fits == 1; j++) {
            bool eq = cs[j].fits == 1 && cs[j].n_set == cs[i].n_set;
            for (int k = 0; k < cs[i].n_set && eq; k++)
                eq = !strcmp(cs[i].set[k], cs[j].set[k]);
            if (eq)
                same = j;
        }
        if (same >= 0) {
            cs[same].given |= cs[i].given;
            memmove(&cs[i], &cs[i + 1], (size_t)(nc - i - 1) * sizeof *cs);
            nc--, i--;
        }
    }
    int fit = 0, nofit = 0, err = 0, given_rank = -1;
    for (int i = 0; i < nc; i++) {
        fit += cs[i].fits == 1;
        nofit += cs[i].fits == 0;
        err += cs[i].fits < 0;
        if (cs[i].given)
            given_rank = i;
    }
    printf("\n%s: %d candidate%s (global batch %lld kept), %d fit%s\n",
           tune ? "tune" : "predict", nc, nc == 1 ? "" : "s", (long long)gb, fit, "");
    printf("  %-3s %14s %10s %-18s %10s %12s  %s\n", "#", "predicted step", "tokens/s", "bound",
           "host RAM", "NVMe TB/day", "settings");
    for (int i = 0; i < nc && i < 5 && cs[i].fits == 1; i++) {
        char what[256], ram[32];
        describe(&cs[i], &base, what, sizeof what);
        printf("  %-3d %12.3f s %10.0f %-18s %10s %12.2f  %s\n", i + 1, cs[i].cost.step_s,
               cs[i].cost.tokens_per_s,
               zn_train_resource_name((zn_train_resource)cs[i].cost.bound),
               zn_format_size(cs[i].host_bytes, ram, sizeof ram), cs[i].cost.nvme_tb_per_day,
               what);
        if (getenv("ZINC_TUNE_DEBUG"))
            for (int k = 0; k < cs[i].n_set; k++)
                printf("        %s\n", cs[i].set[k]);
    }
    if (tune) {
        if (fit > 5)
            printf("  %d more fit and are slower (up to %.3f s)\n", fit - 5,
                   cs[fit - 1].cost.step_s);
        if (nofit) {
            /* the first reason of each kind, with its count */
            int shown = 0;
            for (int i = 0; i < nc && shown < 3; i++) {
                if (cs[i].fits != 0)
                    continue;
                char tier[16] = "";
                sscanf(cs[i].why, "%15s", tier);
                bool seen = false;
                for (int j = 0; j < i && !seen; j++)
                    seen = cs[j].fits == 0 && !strncmp(cs[j].why, tier, strlen(tier));
                if (seen)
                    continue;
                int cnt = 0;
                for (int j = 0; j < nc; j++)
                    cnt += cs[j].fits == 0 && !strncmp(cs[j].why, tier, strlen(tier));
                printf("  %d do not fit: %s tier short, e.g. %s\n", cnt, tier, cs[i].why);
                shown++;
            }
        }
        if (err)
            for (int i = 0; i < nc; i++)
                if (cs[i].fits < 0) {
                    printf("  %d refused by the plan or not predictable, e.g. %s\n", err, cs[i].why);
                    break;
                }
        if (given_rank >= 0 && cs[given_rank].fits == 1)
            printf("the config as given: #%d, predicted step %.3f s\n", given_rank + 1,
                   cs[given_rank].cost.step_s);
        else if (given_rank >= 0)
            printf("the config as given does not fit: %s\n", cs[given_rank].why);
    }
    rc = fit ? 0 : 1;
    if (fit && write) {
        int w = write_config(path, write, &cs[0], &base,
                             given_rank >= 0 ? &cs[given_rank] : NULL, ceil->name[0] ? ceil->name : "this machine");
        if (w)
            rc = zn_cli_fail(w, NULL);
        else
            printf("wrote %s (the chosen settings; \"_tune\" says where each came from)\n", write);
    }
    if (!fit)
        fprintf(stderr, "zinc: error: no candidate fits%s%s\n", nc ? ": " : "",
                nc ? cs[0].why : "");
    free(cs);
    return rc;
}
