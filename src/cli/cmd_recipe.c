/* `zinc train RECIPE.yaml`: a LLaMA-Factory recipe run as it is. The recipe
 * (src/config/recipe.c) becomes the DeepSpeed config it names plus --set
 * overrides; its datasets (dataset_info.json under dataset_dir) are
 * tokenized with the model folder's tokenizer and chat template into
 * output_dir; after training, output_dir holds what LLaMA-Factory leaves
 * there: the adapter (or the model) of the last checkpoint, the step log
 * trainer_log.jsonl and, with plot_loss, the loss picture. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "util/fs-impl.h"
#include "zinc/ckpt.h"
#include "zinc/comm.h"

int zn_cli_recipe_open(const char *path, zn_recipe **out, char *log_path, size_t log_len)
{
    *out = NULL;
    zn_recipe *r = malloc(sizeof *r);
    if (!r) {
        fprintf(stderr, "zinc: error: out of memory\n");
        return 1;
    }
    int rc = zn_recipe_read(path, r);
    if (rc) {
        free(r);
        return zn_cli_fail(rc, "recipe");
    }
    if (!r->output_dir[0]) {
        fprintf(stderr, "zinc: error: %s: output_dir is missing (where LLaMA-Factory and zinc "
                "leave the checkpoints and the result)\n", path);
        free(r);
        return 2;
    }
    if (r->val_size >= 1 && r->val_size != (double)(int64_t)r->val_size) {
        fprintf(stderr, "zinc: error: %s: val_size %g: a fraction below 1 or a whole number "
                "of examples\n", path, r->val_size);
        free(r);
        return 2;
    }
    if ((rc = zn_fs_mkdir_p(r->output_dir, 0755))) {
        fprintf(stderr, "zinc: error: %s: output_dir %s: %s\n", path, r->output_dir,
                zn_last_error());
        free(r);
        return 1;
    }
    /* each rank tokenizes into its own file (the same bytes: no race) */
    zn_launch_info li;
    int rank = zn_launch_detect(&li) ? 0 : li.rank;
    char tok[4300], ev[4300], mlen[32], msamp[32], frac[32];
    snprintf(tok, sizeof tok, "%s/zinc-train.rank%d.tok", r->output_dir, rank);
    snprintf(ev, sizeof ev, "%s/zinc-eval.rank%d.tok", r->output_dir, rank);
    snprintf(mlen, sizeof mlen, "%lld", (long long)r->cutoff_len);
    snprintf(msamp, sizeof msamp, "%lld", (long long)r->max_samples);
    if (r->val_size >= 1)
        snprintf(frac, sizeof frac, "%lld", (long long)r->val_size);
    else
        snprintf(frac, sizeof frac, "%.17g", r->val_size);
    const char *args[32];
    int n = 0;
    args[n++] = "--model";
    args[n++] = r->model;
    args[n++] = "--dataset-info";
    args[n++] = r->dataset_dir;
    args[n++] = "--datasets";
    args[n++] = r->datasets;
    args[n++] = "--out";
    args[n++] = tok;
    args[n++] = "--quiet";
    if (r->cutoff_len) {
        args[n++] = "--max-len";
        args[n++] = mlen;
    }
    if (r->max_samples) {
        args[n++] = "--max-samples";
        args[n++] = msamp;
    }
    int eval = r->val_size > 0 || r->eval_datasets[0];
    if (eval) {
        args[n++] = "--eval-out";
        args[n++] = ev;
        if (r->eval_datasets[0]) {
            args[n++] = "--eval-datasets";
            args[n++] = r->eval_datasets;
        } else {
            /* LLaMA-Factory: a fraction of the data, or a number of examples */
            args[n++] = r->val_size >= 1 ? "--eval-count" : "--eval-fraction";
            args[n++] = frac;
        }
    }
    printf("recipe     %s: %s fine-tune of %s%s%s\n", path, r->lora ? "LoRA" : "full",
           r->model, r->ds_config[0] ? ", DeepSpeed config " : "", r->ds_config);
    if (r->notes[0])
        printf("           accepted, changing nothing zinc computes: %s\n", r->notes);
    printf("data       %s from %s/dataset_info.json, with %s's tokenizer and chat template\n",
           r->datasets, r->dataset_dir, r->model);
    fflush(stdout);
    if ((rc = zn_cli_run_prepare(args, n))) {
        fprintf(stderr, "zinc: error: %s: preparing the datasets failed (above)\n", path);
        free(r);
        return 1;
    }
    if (zn_recipe_add_data(r, tok, eval ? ev : NULL)) {
        free(r);
        return zn_cli_fail(ZN_ECONFIG, "recipe");
    }
    snprintf(log_path, log_len, "%s/trainer_log.jsonl", r->output_dir);
    *out = r;
    return 0;
}

int zn_cli_recipe_finish(const zn_recipe *r, const char *log_path, int bf16)
{
    zn_launch_info li;
    if (!zn_launch_detect(&li) && li.rank != 0)
        return 0;
    /* the last checkpoint as LLaMA-Factory leaves its result: a PEFT adapter
     * (fp32, as its trainable parameters are) or the model */
    int rc = zn_ckpt_export(r->output_dir, r->output_dir,
                            r->lora || !bf16 ? ZN_DTYPE_F32 : ZN_DTYPE_BF16, 0);
    if (rc)
        return zn_cli_fail(rc, "recipe: writing the result into output_dir");
    printf("result     %s: %s\n", r->output_dir,
           r->lora ? "adapter_config.json, adapter_model.safetensors (peft loads it)"
                   : "config.json, safetensors and the tokenizer (transformers loads it)");
    if (r->plot_loss) {
        char svg[4200];
        snprintf(svg, sizeof svg, "%s/training_loss.svg", r->output_dir);
        if ((rc = zn_cli_plot(log_path, svg, "training")))
            fprintf(stderr, "zinc: warning: plot_loss: %s\n", zn_last_error());
        else
            printf("plot       %s\n", svg);
    }
    return 0;
}
