/* libFuzzer harnesses for every parser of outside input (issue 32): one
 * source, built once per target with -DZN_FUZZ=<name>. Each input is handed
 * to the parser as the user would hand it: a config's text, or a file in a
 * folder of its own (config.json, a .safetensors, a token file, a PEFT
 * adapter_config.json, a checkpoint's manifest.json, a LLaMA-Factory recipe,
 * a model.safetensors.index.json beside real shards, a generation_config.json
 * beside a model's config.json, read as `zinc generate` opens the folder). A
 * parser may refuse
 * an input; it may not crash, leak (ASan) or overflow (UBSan). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zinc/ckpt.h"
#include "zinc/config.h"
#include "zinc/gensession.h"
#include "zinc/model.h"
#include "zinc/safetensors.h"
#include "zinc/tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

static char dir[64];

/* `name` in this process's folder holds the input; its path. */
static const char *put(const char *name, const uint8_t *data, size_t n)
{
    static char path[128];
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%.40s/zn_fuzz_XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir))
            abort();
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f))
        abort();
    return path;
}

#define ZN_FUZZ_config 1
#define ZN_FUZZ_hfconfig 2
#define ZN_FUZZ_safetensors 3
#define ZN_FUZZ_tokens 4
#define ZN_FUZZ_peft 5
#define ZN_FUZZ_manifest 6
#define ZN_FUZZ_recipe 7
#define ZN_FUZZ_stindex 8
#define ZN_FUZZ_genconfig 9
#define TARGET_(x) ZN_FUZZ_##x
#define TARGET(x) TARGET_(x)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
#if TARGET(ZN_FUZZ) == ZN_FUZZ_config
    char *text = malloc(n + 1);
    memcpy(text, data, n);
    text[n] = '\0';
    zn_config c;
    zn_config_parse(&c, text, "fuzz", NULL, 0);
    free(text);
#elif TARGET(ZN_FUZZ) == ZN_FUZZ_hfconfig
    put("config.json", data, n);
    zn_model_dims d;
    zn_model_dims_from_hf(&d, dir);
#elif TARGET(ZN_FUZZ) == ZN_FUZZ_safetensors
    const char *p = put("model.safetensors", data, n);
    zn_st *st = NULL;
    if (!zn_st_open(&st, p))
        zn_st_count(st);
    zn_st_close(st);
#elif TARGET(ZN_FUZZ) == ZN_FUZZ_tokens
    const char *p = put("data.tok", data, n);
    zn_tokens *t = NULL;
    if (!zn_tokens_open(&t, p) && zn_tokens_count(t))
        zn_tokens_get(t, zn_tokens_count(t) - 1);
    zn_tokens_close(t);
#elif TARGET(ZN_FUZZ) == ZN_FUZZ_peft
    put("adapter_config.json", data, n);
    zn_lora l;
    zn_lora_read_peft_config(dir, &l);
#elif TARGET(ZN_FUZZ) == ZN_FUZZ_manifest
    put("manifest.json", data, n);
    zn_ckpt *ck = NULL;
    if (!zn_ckpt_open(&ck, dir))
        zn_ckpt_close(ck);
#elif TARGET(ZN_FUZZ) == ZN_FUZZ_recipe
    /* the recipe's folder is the harness's: a dataset_info.json or a
     * deepspeed file it names is looked up there and found missing */
    const char *p = put("recipe.yaml", data, n);
    zn_recipe *r = malloc(sizeof *r);
    if (!r)
        abort();
    zn_recipe_read(p, r);
    free(r);
#elif TARGET(ZN_FUZZ) == ZN_FUZZ_stindex
    /* the index names shards; the real shards of ZN_FUZZ_SHARDS (a model
     * folder, run_fuzz.sh's caller sets it) lie beside it, copied once, so
     * an index that names them reaches the cross-checks of names, shards
     * and offsets rather than stopping at a missing file */
    static int copied;
    if (!copied) {
        copied = 1;
        const char *from = getenv("ZN_FUZZ_SHARDS");
        for (int k = 1; from && k <= 2; k++) {
            char src[4096], name[64];
            snprintf(name, sizeof name, "model-%05d-of-00002.safetensors", k);
            snprintf(src, sizeof src, "%s/%s", from, name);
            FILE *f = fopen(src, "rb");
            if (!f)
                continue;
            static uint8_t buf[1 << 20];
            size_t got = fread(buf, 1, sizeof buf, f);
            fclose(f);
            put(name, buf, got);
        }
    }
    const char *p = put("model.safetensors.index.json", data, n);
    zn_st *st = NULL;
    if (!zn_st_open(&st, p) && zn_st_count(st))
        zn_st_find(st, zn_st_tensor_at(st, 0)->name);
    zn_st_close(st);
#elif TARGET(ZN_FUZZ) == ZN_FUZZ_genconfig
    /* the decoding defaults of a model folder: a fixed config.json (the
     * model, ZN_FUZZ_MODEL's) beside the input as generation_config.json */
    static int have_config;
    if (!have_config) {
        const char *from = getenv("ZN_FUZZ_MODEL");
        char src[4096];
        snprintf(src, sizeof src, "%s/config.json", from ? from : ".");
        FILE *f = fopen(src, "rb");
        if (!f)
            abort();
        static uint8_t cfg[1 << 16];
        size_t got = fread(cfg, 1, sizeof cfg, f);
        fclose(f);
        put("config.json", cfg, got);
        have_config = 1;
    }
    put("generation_config.json", data, n);
    zn_gen_session_config gc = zn_gen_session_config_default();
    gc.model = dir;
    zn_gen_session *s = NULL;
    if (!zn_gen_session_open(&s, &gc))
        zn_gen_session_close(s);
#else
#error "ZN_FUZZ names no target"
#endif
    return 0;
}
