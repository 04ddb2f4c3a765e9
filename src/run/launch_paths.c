/* The folders a launched `zinc train` writes on every host (its swap
 * folders and its checkpoint folder), read from the train command line the
 * launcher was given, and the checkpoint it resumes from, for the check
 * before anything starts (zn_cluster_train_paths, launch.h). Reads the
 * config as zinc train does: CONFIG (or a LLaMA-Factory recipe), or the
 * config a --resume folder recorded, under the line's --set. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "zinc/ckpt.h"
#include "zinc/config.h"
#include "zinc/launch.h"

/* zinc train's flags that take a value (src/cli/cmd_train.c) */
static const char *const valued[] = { "--model", "--data", "--steps", "--trace", "--json-log",
                                      NULL };

static int is_zinc(const char *a)
{
    const char *b = strrchr(a, '/');
    return !strcmp(b ? b + 1 : a, "zinc");
}

static int add(zn_cluster_paths *out, const char *path, const char *what, int must_exist)
{
    if (!*path)
        return 0;
    for (int i = 0; i < out->n; i++)
        if (!strcmp(out->path[i], path) && out->p[i].must_exist == must_exist)
            return 0;   /* one folder named twice is tried once */
    if (out->n >= ZN_CLUSTER_PATHS_MAX)
        return zn_set_error(ZN_EARG, "launch: more than %d folders to check",
                            ZN_CLUSTER_PATHS_MAX);
    int i = out->n++;
    snprintf(out->path[i], sizeof out->path[i], "%s", path);
    snprintf(out->what[i], sizeof out->what[i], "%s", what);
    out->p[i] = (zn_cluster_path){ out->path[i], out->what[i], must_exist };
    return 0;
}

/* The config as zinc train reads it from its line's CONFIG and --sets. */
static int load(zn_config *cfg, const char *path, const char **sets, int n_sets,
                const char *default_json)
{
    if (path && zn_recipe_is_path(path)) {
        zn_recipe *r = malloc(sizeof *r);
        if (!r)
            return zn_set_error(-ENOMEM, "launch: out of memory");
        int rc = zn_recipe_read(path, r);
        const char **all = malloc(sizeof *all * (size_t)(ZN_RECIPE_MAX_SETS + n_sets));
        if (!rc && !all)
            rc = zn_set_error(-ENOMEM, "launch: out of memory");
        if (!rc) {
            int na = 0;
            for (int i = 0; i < r->n_sets; i++)
                all[na++] = r->sets[i];
            for (int i = 0; i < n_sets; i++)
                all[na++] = sets[i];
            rc = r->ds_config[0] ? zn_config_load(cfg, r->ds_config, all, na)
                                 : zn_config_parse(cfg, "{}", r->path, all, na);
        }
        free(all);
        free(r);
        return rc;
    }
    if (path)
        return zn_config_load(cfg, path, sets, n_sets);
    return zn_config_parse(cfg, default_json, "(zinc train's embedded default)", sets, n_sets);
}

int zn_cluster_train_paths(const char *const *argv, int argc, const char *default_json,
                           zn_cluster_paths *out)
{
    memset(out, 0, sizeof *out);
    if (argc < 2 || !is_zinc(argv[0]) || strcmp(argv[1], "train")) {
        snprintf(out->note, sizeof out->note, "the command is not zinc train");
        return 0;
    }
    const char **sets = calloc((size_t)argc, sizeof *sets);
    zn_config *cfg = malloc(sizeof *cfg);
    const char *path = NULL, *resume_dir = NULL;
    int n_sets = 0, rc = 0, resume = 0;
    zn_ckpt *ck = NULL;
    if (!sets || !cfg) {
        rc = zn_set_error(-ENOMEM, "launch: out of memory");
        goto out;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set") && i + 1 < argc) {
            sets[n_sets++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            sets[n_sets++] = a + 6;
        } else if (!strcmp(a, "--resume")) {
            resume = 1;
            /* an optional value, as zinc train takes it: "latest" or a
             * folder (a file is CONFIG) */
            struct stat st;
            if (i + 1 < argc && (!strcmp(argv[i + 1], "latest") ||
                                 (stat(argv[i + 1], &st) == 0 && S_ISDIR(st.st_mode)))) {
                i++;
                if (strcmp(argv[i], "latest"))
                    resume_dir = argv[i];
            }
        } else if (a[0] == '-') {
            for (int k = 0; valued[k]; k++)
                if (!strcmp(a, valued[k]) && i + 1 < argc) {
                    i++;
                    break;
                }
        } else if (!path) {
            path = a;
        }
    }
    /* every rank reads the checkpoint it resumes from: there on each host
     * (a folder this host sees; one it does not see is the ranks' to name) */
    if (resume_dir && (rc = add(out, resume_dir, "the checkpoint to resume (--resume)", 2)))
        goto out;
    /* the config's warnings are the ranks' to give (each gives them when
     * it reads it): quiet here, errors still said */
    zn_log_level lvl = zn_log_get_level();
    if (lvl < ZN_LOG_ERROR)
        zn_log_set_level(ZN_LOG_ERROR);
    if (!path && resume_dir) {
        /* zinc train --resume DIR without CONFIG trains with the config the
         * checkpoint recorded, under the line's --sets: read from this
         * host's copy (its manifest; nothing verified here) */
        const char *text = NULL;
        if (zn_ckpt_open(&ck, resume_dir) || !(text = zn_ckpt_config_text(ck))) {
            zn_log_set_level(lvl);
            snprintf(out->note, sizeof out->note, "zinc train --resume %.240s without CONFIG: "
                     "its recorded config is not readable here (%.120s): its folders are not "
                     "checked", resume_dir, ck ? "no config recorded" : zn_last_error());
            goto out;
        }
        char name[ZN_PATH_MAX + 32];
        snprintf(name, sizeof name, "(config recorded in %s)", zn_ckpt_path(ck));
        rc = zn_config_parse(cfg, text, name, sets, n_sets);
    } else {
        rc = load(cfg, path, sets, n_sets, default_json);
    }
    zn_log_set_level(lvl);
    if (rc) {
        if (rc == -ENOENT) {
            snprintf(out->note, sizeof out->note, "%.400s is not readable here (%s)",
                     path ? path : "CONFIG", zn_last_error());
            rc = 0;
        } else {
            zn_error_prefix(rc, "the train command's config");
        }
        goto out;
    }
    const char *nv[ZN_MAX_NVME_PATHS];
    int n = zn_config_nvme_paths(cfg, nv, ZN_MAX_NVME_PATHS);
    for (int i = 0; i < n && !rc; i++)
        rc = add(out, nv[i], "the swap folder (tiers.nvme / offload nvme_path)",
                 !cfg->tiers.create_nvme_path);
    if (!rc)
        rc = add(out, cfg->train.checkpoint.dir, "the checkpoint folder (train.checkpoint.dir)",
                 0);
    /* --resume without a folder: the checkpoint folder's latest */
    if (!rc && resume && !resume_dir)
        rc = add(out, cfg->train.checkpoint.dir, "the checkpoint to resume (--resume: "
                 "train.checkpoint.dir)", 2);
out:
    zn_ckpt_close(ck);
    free(sets);
    free(cfg);
    return rc;
}
