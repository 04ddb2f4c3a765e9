/* A generation session (src/run/gen_session.c, gen_prompt.c): what `zinc
 * generate`, `zinc chat` and `zinc bench generate` share. The model to run
 * (a Hugging Face folder, a base and a PEFT adapter unmerged, or a `zinc
 * train` checkpoint read in place), the decoding settings (the folder's
 * generation_config.json as transformers reads it, then the caller's
 * overrides), the folder's tokenizer and chat template in a Python
 * co-process (scripts/zinc_tokenize.py), the prompts, the device with the
 * model placed on it (include/zinc/generate.h), the batch decoded and a
 * chat's history. Nothing here prints or ends the process: every function
 * returns 0 or a negative code with zn_last_error() set; messages read as
 * the detail after the command's name ("--checkpoint: ..."), and name the
 * options the way the CLI spells them. */
#ifndef ZINC_GENSESSION_H
#define ZINC_GENSESSION_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "zinc/cost.h"
#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/model.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- placing a model for generation ----------------------------------------------- */

/* How the model is placed. `zinc generate`, `zinc chat` and `zinc bench
 * generate` all go through zn_gen_place_model with these, so the bench
 * measures the placement generate makes for the same settings. */
typedef struct {
    const char *device;   /* zn_dev_config.name: "auto" (default), "host", "cuda[:N]" */
    uint64_t gpu_budget;  /* the device arena in bytes; 0 (default): the device's */
    int dtype;            /* ZN_DTYPE_F32 or ZN_DTYPE_BF16; -1 (default): the device's */
    const char *nvme;     /* a folder: streamed layers homed on NVMe there; NULL: pinned RAM */
    int64_t ctx;          /* tokens per sequence, prompt and generated */
    int64_t batch;        /* sequences decoded together (default 1) */
    int kv_home;          /* ZN_GEN_KV_AUTO (default), _DEVICE or _PINNED */
    int resident;         /* at most this many layers on the device; -1 (default): all that fit */
    int ring;             /* device slots for streamed layers (default 2) */
} zn_gen_place;

ZN_API zn_gen_place zn_gen_place_default(void);

/* "auto", "device" or "pinned" into *kv_home. 0, or ZN_EARG ("--kv-cache
 * must be auto, device or pinned (not 'x')"). */
ZN_API int zn_gen_parse_kv_home(const char *s, int *kv_home);

/* The model (GEMM attention, a context of o->ctx tokens) and its generator
 * of o->batch sequences placed on dev in dtype dt (o->device, gpu_budget
 * and dtype are the caller's to apply): the one sizing rule. Returns the
 * library's code; *m and *g are NULL on failure. The caller destroys *g,
 * then *m. */
ZN_API int zn_gen_place_model(zn_dev *dev, const zn_model_dims *d, zn_dtype dt,
                              const zn_gen_place *o, zn_model **m, zn_gen **g);

/* The device, the model and its generator, owned together. */
typedef struct {
    zn_dev *dev;
    zn_model *m;
    zn_gen *g;
    zn_dtype dt;
    int kv_home;    /* as asked (zn_gen_place.kv_home); where it went: zn_gen_get_placement */
    int64_t ctx;    /* tokens per sequence it was placed for */
    int64_t batch;  /* sequences it decodes together */
    double load_s;  /* seconds reading the weights */
} zn_gen_engine;

/* Creates the device (o->device, o->gpu_budget), places the model of dims
 * d on it (zn_gen_place_model: weights resident, or streamed from pinned
 * memory or NVMe where the device has no room; the KV cache where
 * o->kv_home says) and, unless plan_only, loads it: `model`'s weights with
 * `adapter` (may be NULL) unmerged, or `ckpt`'s (a LoRA checkpoint's base
 * from `model`). Returns 0 or the failing call's code, its message
 * prefixed with "device", "placing the model" or "loading ..."; on
 * failure *e is zeroed. */
ZN_API int zn_gen_engine_open(zn_gen_engine *e, const zn_model_dims *d, const char *model,
                              const char *adapter, const char *ckpt, const zn_gen_place *o,
                              int plan_only);
/* Frees what e holds (accepts a zeroed or half-opened engine). */
ZN_API void zn_gen_engine_close(zn_gen_engine *e);
/* Where the weights are, in one line for people, into buf. */
ZN_API void zn_gen_engine_placement_line(const zn_gen_engine *e, char *buf, size_t n);

/* The figures a plan's bound divides by: `target`'s (a name zn_cost_target
 * knows), else this machine's from the cost model's cache (ZINC_CACHE_DIR,
 * as `zinc plan --tune` keeps them) for `device` and the `nvme` folder,
 * measured now when `recalibrate` (announced on `note`, may be NULL). A
 * figure nobody measured stays 0. Returns 0, ZN_EARG (an unknown target;
 * with a target nothing else can fail), or the measurement's code
 * prefixed with "the link's figures". */
ZN_API int zn_gen_link_figures(const char *device, const char *nvme, const char *target,
                               int recalibrate, zn_ceilings *c, FILE *note);

/* The bytes one decoding step moves. */
typedef struct {
    uint64_t h2d;  /* streamed layers, a pinned cache's rows, gathered embedding rows */
    uint64_t d2h;  /* a pinned cache's new rows, the logits */
    uint64_t nvme; /* NVMe-homed layers read */
} zn_gen_bytes;

/* The bytes one decoding step of B sequences at context ctx_tokens (tokens
 * cached per sequence) moves with placement p: the streamed layers, a
 * pinned cache's cached rows (ctx_tokens per sequence) and the gathered
 * embedding rows in; a pinned cache's new rows and the logits out; the
 * NVMe-homed layers read. The plan, its bound and the bench's check of
 * what a run moved all count with this. */
ZN_API void zn_gen_step_bytes(const zn_gen_placement *p, int64_t B, int64_t ctx_tokens,
                              zn_gen_bytes *s);

/* The least seconds a decoding step of B sequences at context ctx_tokens
 * takes on figures c: each resource alone (the host link, the
 * device-to-host link and NVMe reads with zn_gen_step_bytes' bytes; the
 * compute: comp_s when it is measured (>= 0), else from a GEMM rate), the
 * busiest one (*by names it); on shared cores (the host backend) compute
 * and the copies added, or the disk when longer. 0 when nothing moves (*by
 * "nothing") or a figure it needs is unknown (*by "unknown"). */
ZN_API double zn_gen_step_bound(const zn_gen_placement *p, int64_t B, int64_t ctx_tokens,
                                const zn_ceilings *c, const zn_model_dims *d, double comp_s,
                                const char **by);

/* ---- the session -------------------------------------------------------------------- */

/* Decoding settings over the folder's: a field left at
 * zn_gen_session_config_default's value is not given. */
typedef struct {
    int64_t max_new_tokens;    /* > 0 */
    int do_sample;             /* 0 or 1; -1: not given */
    double temperature;        /* > 0 */
    int64_t top_k;             /* >= 0 */
    double top_p;              /* > 0 */
    double repetition_penalty; /* > 0 */
    uint64_t seed;             /* always taken (default 0) */
} zn_gen_overrides;

typedef struct {
    const char *model;       /* the HF folder (weights, tokenizer); with checkpoint, NULL:
                                the folder the run recorded */
    const char *adapter;     /* a PEFT LoRA adapter folder for model, or NULL */
    const char *checkpoint;  /* a `zinc train` checkpoint (a step folder or the root), or NULL */
    zn_gen_overrides decode;
    const char *source_root; /* holds scripts/zinc_tokenize.py and .venv (NULL: ".") */
    const char *python;      /* the tokenizer's interpreter; NULL: $ZINC_PYTHON, else
                                source_root/.venv/bin/python */
} zn_gen_session_config;

ZN_API zn_gen_session_config zn_gen_session_config_default(void);

typedef struct zn_gen_session zn_gen_session;

/* The model to run and how to decode: with a checkpoint its dims and LoRA
 * and the folder (c->model, which must be of its shape, or the recorded
 * one); the decoding settings (generation_config.json, then c->decode,
 * then zn_gen_params_check); the dims from the folder and the adapter's
 * LoRA. Strings in c are copied. Returns 0, ZN_EARG (neither a model nor
 * a checkpoint; an adapter given with a checkpoint, whose LoRA holds its
 * adapters: no other failure is ZN_EARG), or the failing read's code
 * ("--checkpoint: ...", "--adapter: ...", "FILE:LINE: ..."). */
ZN_API int zn_gen_session_open(zn_gen_session **out, const zn_gen_session_config *c);
/* Ends the tokenizer, frees the engine, the prompts, the outputs and the
 * history. Accepts NULL. */
ZN_API void zn_gen_session_close(zn_gen_session *s);

typedef struct {
    const char *model;       /* the folder the weights and tokenizer come from */
    zn_model_dims dims;
    zn_gen_params params;    /* the decoding settings in force */
    int tokenizer;           /* the tokenizer's co-process runs */
    int64_t prompts;         /* prompts set (zn_gen_session_prompts) */
    int64_t longest;         /* the longest prompt's ids */
    int64_t ctx;             /* tokens per sequence: the prompts' or the chat's context */
} zn_gen_session_info;

/* Pointers in *out stay valid until the session closes. */
ZN_API void zn_gen_session_get_info(const zn_gen_session *s, zn_gen_session_info *out);

/* Starts the folder's tokenizer (when no eos id is set, its eos becomes
 * the stop ids). Returns 0, -errno (no interpreter: the message says how
 * to make the virtual environment), -EPIPE (it ended without a word),
 * ZN_ECONFIG (its own refusal, such as no tokenizer.json) or ZN_ECORRUPT
 * (an answer that is not JSON). */
ZN_API int zn_gen_session_open_tokenizer(zn_gen_session *s);
/* The chat template's extra variables, as apply_chat_template's keyword
 * arguments (a JSON object, e.g. {"enable_thinking": true}), for the
 * tokenizer started after this; NULL: none (a template that reads
 * enable_thinking then gets false, as zinc prepare gives it). ZN_EARG when
 * not a JSON object or the tokenizer already runs. */
ZN_API int zn_gen_session_set_template_args(zn_gen_session *s, const char *json_object);

/* The prompts of one batch: exactly one of the four. */
typedef struct {
    const char *text;     /* raw text, no chat template ("--prompt") */
    const char *chat;     /* one user turn through the chat template ("--chat") */
    const int64_t *ids;   /* token ids, n_ids of them ("--ids"; non-NULL even when n_ids
                             is 0, which is refused); no tokenizer needed */
    int64_t n_ids;
    const char *jsonl;    /* one JSON object a line: {"prompt"}, {"messages"} or {"ids"} */
} zn_gen_prompt_source;

/* Reads and tokenizes the prompts (the tokenizer is started when one is
 * text), then fixes the context: `context` tokens (0: the longest prompt
 * and max_new_tokens), at most the model's max_position_embeddings.
 * Returns 0, -errno (the file), ZN_ECONFIG (a malformed line, "FILE:LINE:
 * ..."; no prompts; an id that is not a token id; no room for new tokens
 * in the context), or the tokenizer's failure. */
ZN_API int zn_gen_session_prompts(zn_gen_session *s, const zn_gen_prompt_source *p,
                                  int64_t context);

/* Places the model for the session (zn_gen_engine_open with its folder,
 * adapter or checkpoint): o->ctx 0 takes the session's context, o->batch
 * is capped at the prompts' count. Returns zn_gen_engine_open's codes. */
ZN_API int zn_gen_session_place(zn_gen_session *s, const zn_gen_place *o, int plan_only);
/* The placed engine, NULL before zn_gen_session_place. */
ZN_API zn_gen_engine *zn_gen_session_engine(zn_gen_session *s);

/* Text as it is decoded: `len` new bytes at `text` (0 at times on the
 * last), complete characters only; `last`: the sequence ends. A nonzero
 * return stops the generation with that value. */
typedef int (*zn_gen_text_fn)(void *ctx, const char *text, size_t len, int last);

/* Generates for every prompt, with the session's settings. With on_text
 * (one prompt and the tokenizer only: ZN_EARG otherwise) the text is
 * streamed to it. *seconds: the generation's. Returns 0 or zn_gen_run's
 * code. */
ZN_API int zn_gen_session_generate(zn_gen_session *s, zn_gen_text_fn on_text, void *ctx,
                                   double *seconds);

typedef struct {
    const int32_t *prompt;   /* the prompt's ids */
    int64_t prompt_len;
    const int32_t *ids;      /* the generated ids (NULL before zn_gen_session_generate) */
    int64_t len;
    int eos;                 /* it ended at a stop id (else at max_new_tokens) */
} zn_gen_output;

/* Prompt i (0 .. info.prompts - 1) and what it generated; views into the
 * session. */
ZN_API void zn_gen_session_output(const zn_gen_session *s, int64_t i, zn_gen_output *out);

/* The text of ids through the tokenizer, malloc'd into *text (free()).
 * Returns 0, or the tokenizer's failure. */
ZN_API int zn_gen_session_decode(zn_gen_session *s, const int32_t *ids, int64_t n,
                                 char **text);

/* ---- a chat: the whole history is each turn's prompt ---------------------------------- */

/* Starts a chat: the context (`context` tokens, 0: max_position_embeddings
 * at most 4096; never more than it) and the system prompt (NULL: none).
 * Returns 0 or -ENOMEM. */
ZN_API int zn_gen_session_chat_begin(zn_gen_session *s, int64_t context, const char *system);
/* Forgets the history (the system prompt stays). */
ZN_API void zn_gen_session_chat_reset(zn_gen_session *s);
/* Replaces the system prompt (NULL or "": none) and forgets the history.
 * Returns 0 or -ENOMEM (the history and the old system prompt kept). */
ZN_API int zn_gen_session_chat_system(zn_gen_session *s, const char *system);
/* Adds a user turn (after the system prompt when the history is empty)
 * and renders the history through the chat template with the generation
 * prompt; *n_ids its length. Returns 0 or the tokenizer's failure. */
ZN_API int zn_gen_session_chat_prompt(zn_gen_session *s, const char *user, int64_t *n_ids);
/* Takes the last user turn back (one that does not fit the context). */
ZN_API void zn_gen_session_chat_undo(zn_gen_session *s);

typedef struct {
    int64_t tokens;   /* generated */
    double seconds;   /* the generation's */
} zn_gen_turn;

/* The reply to the rendered history (zn_gen_session_chat_prompt), streamed
 * to on_text (may be NULL), kept as the assistant's turn. The generator
 * reuses the cache of the history it has already seen. Returns 0,
 * zn_gen_run's code or the tokenizer's failure. */
ZN_API int zn_gen_session_chat_reply(zn_gen_session *s, zn_gen_text_fn on_text, void *ctx,
                                     zn_gen_turn *turn);

#ifdef __cplusplus
}
#endif
#endif
