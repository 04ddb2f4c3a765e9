/* What `zinc generate`, `zinc chat` and their tests share (gen_common.c):
 * the tokenizer co-process, prompts, the folder's generation defaults, the
 * decoding flags, the model and its generator, streaming text. Private to
 * src/cli. */
#ifndef ZN_CLI_GEN_H
#define ZN_CLI_GEN_H

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <sys/types.h>

#include "zinc/cost.h"
#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/model.h"

typedef struct {
    pid_t pid;
    FILE *to, *from;
    char *line;
    size_t cap;
    json_t *eos;
} tokenizer;

typedef struct {
    int64_t n, cap;
    int32_t **ids;
    int64_t *len;
} prompts;

typedef struct {
    tokenizer *tok;
    int stream;         /* print text as it comes (one prompt, no --json) */
    int32_t *gen;       /* the streamed sequence's ids so far */
    int64_t n, cap;
    size_t printed;     /* bytes of its text already printed */
} streamer;

typedef struct {
    double max_new, temp, topk, topp, rep, seed; /* < 0 (seed: 0): not given */
    int do_sample;                               /* -1: not given */
} decode_flags;

#define DECODE_FLAGS_UNSET { -1, -1, -1, -1, -1, 0, -1 }

#define DECODE_OPTIONS                                                                       \
    { "max-new-tokens", required_argument, 0, 'n' }, { "do-sample", no_argument, 0, 'S' },   \
    { "greedy", no_argument, 0, 'G' }, { "temperature", required_argument, 0, 'T' },         \
    { "top-k", required_argument, 0, 'k' }, { "top-p", required_argument, 0, 'q' },          \
    { "repetition-penalty", required_argument, 0, 'r' }, { "seed", required_argument, 0, 's' }

/* How a command places the model: `zinc generate`, `zinc chat` and `zinc
 * bench generate` all go through zn_gc_gen_place with these, so the bench
 * measures the placement generate would make for the same settings. */
typedef struct {
    const char *device, *dtype, *gpu_mem, *nvme; /* --device, --dtype, --gpu-mem, --nvme */
    int64_t ctx;   /* tokens per sequence (prompt and generated) */
    int64_t batch; /* sequences decoded together */
    int kv_home;   /* --kv-cache: ZN_GEN_KV_AUTO, _DEVICE or _PINNED */
    int resident;  /* bench --resident: at most this many layers on the device; -1: all that fit */
    int ring;      /* bench --ring: device slots for streamed layers */
} gen_place;

#define GEN_PLACE_DEFAULT { "auto", NULL, NULL, NULL, 0, 1, ZN_GEN_KV_AUTO, -1, 2 }

/* The bytes one decoding step moves (zn_gc_step_bytes). */
typedef struct {
    uint64_t h2d;  /* streamed layers, a pinned cache's rows, gathered embedding rows */
    uint64_t d2h;  /* a pinned cache's new rows, the logits */
    uint64_t nvme; /* NVMe-homed layers read */
} gen_step_bytes;

typedef struct {
    zn_dev *dev;
    zn_model *m;
    zn_gen *g;
    zn_dtype dt;
    int kv_home; /* as asked (gen_place.kv_home); where it went: zn_gen_get_placement */
    double load_s;
} engine;

/* Each function's contract is the comment above its definition in
 * gen_common.c. */
void zn_gc_tok_close(tokenizer *t);
json_t *zn_gc_tok_read(tokenizer *t);
int zn_gc_tok_open(tokenizer *t, const char *model);
json_t *zn_gc_tok_ask(tokenizer *t, json_t *req, const char *key);
json_t *zn_gc_ids_json(const int32_t *ids, int64_t n);
char *zn_gc_tok_decode(tokenizer *t, const int32_t *ids, int64_t n);
int zn_gc_prompts_add(prompts *p, json_t *arr, const char *where);
void zn_gc_prompts_free(prompts *p);
int zn_gc_prompt_from(prompts *p, tokenizer *t, json_t *rec, const char *where);
void zn_gc_eos_from(zn_gen_params *gp, json_t *v);
int zn_gc_folder_defaults(const char *dir, zn_gen_params *gp);
int zn_gc_on_token(void *ctx, int64_t seq, int32_t id, int last);
int zn_gc_num_arg(const char *name, const char *s, double lo, double *out);
int zn_gc_decode_flag(int c, const char *arg, decode_flags *f);
int zn_gc_ckpt_source(const char *ckpt, const char *model, char *model_out, size_t n,
                       zn_model_dims *d, const char *cmd);
int zn_gc_decode_setup(const decode_flags *f, const char *model, const char *adapter,
                        const char *cmd, int have_dims, zn_gen_params *gp, zn_model_dims *d);
int zn_gc_put_ckpt(void *ctx, int block, int i, uint64_t first, const float *v, uint64_t n);
void zn_gc_engine_close(engine *e);
int zn_gc_kv_flag(const char *arg, int *kv_home, const char *cmd);
int zn_gc_gen_place(zn_dev *dev, const zn_model_dims *d, zn_dtype dt, const gen_place *o,
                    zn_model **m, zn_gen **g);
int zn_gc_engine_open(engine *e, const zn_model_dims *d, const char *model, const char *adapter,
                       const char *ckpt, const gen_place *o, int plan_only, const char *cmd);
void zn_gc_placement_line(const engine *e, char *buf, size_t n);
int zn_gc_link_figures(const char *device, const char *nvme, const char *target,
                       int recalibrate, zn_ceilings *c, const char *cmd);
void zn_gc_step_bytes(const zn_gen_placement *p, int64_t B, int64_t ctx_tokens,
                      gen_step_bytes *s);
double zn_gc_step_bound(const zn_gen_placement *p, int64_t B, int64_t ctx_tokens,
                        const zn_ceilings *c, const zn_model_dims *d, double comp_s,
                        const char **by);
void zn_gc_print_plan(const engine *e, int64_t ctx, int64_t B, const zn_ceilings *c,
                      const zn_model_dims *d);
/* A signal removes the NVMe swap files before ending the process. */
void zn_gc_install_signals(void);
int zn_gc_setup(const decode_flags *f, const char **model, char *model_buf, size_t n,
                const char *adapter, const char *ckpt, const char *cmd, zn_gen_params *gp,
                zn_model_dims *d);

#endif
