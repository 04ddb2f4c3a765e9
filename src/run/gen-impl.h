/* What the two files of the generation session share (include/zinc/
 * gensession.h): gen_prompt.c holds the tokenizer co-process, the prompts,
 * the folder's decoding defaults and the text stream; gen_session.c the
 * session, the engine and the placement's figures. Private to src/run. */
#ifndef ZN_RUN_GEN_IMPL_H
#define ZN_RUN_GEN_IMPL_H

#include <jansson.h>
#include <stdio.h>
#include <sys/types.h>

#include "zinc/generate.h"
#include "zinc/gensession.h"

/* The tokenizer co-process (scripts/zinc_tokenize.py): one JSON request a
 * line on `to`, one answer a line on `from`. pid 0: not running. */
typedef struct {
    pid_t pid;
    FILE *to, *from;
    char *line;
    size_t cap;
    json_t *eos;        /* the eos ids it reported, or NULL */
} zn_gs_tok;

/* Prompts as ids, each malloc'd. */
typedef struct {
    int64_t n, cap;
    int32_t **ids;
    int64_t *len;
} zn_gs_prompts;

/* zn_gen_run's token callback that streams text: each id of the one
 * sequence joins `gen`, the whole is decoded and the bytes past `printed`
 * go to fn (NULL: nothing done). `text` keeps the last decoding. */
typedef struct {
    zn_gs_tok *tok;
    zn_gen_text_fn fn;
    void *ctx;
    int32_t *gen;
    int64_t n, cap;
    size_t printed;
    char *text;
} zn_gs_stream;

/* Starts `python script model [template_args]` (the script: source_root/
 * scripts/zinc_tokenize.py; python NULL: $ZINC_PYTHON, else source_root/
 * .venv/bin/python; template_args: the chat template's variables as a JSON
 * object, or NULL) and reads its greeting. 0 or a code with the reason
 * set; *t is zeroed on failure. */
int zn_gs_tok_open(zn_gs_tok *t, const char *python, const char *source_root,
                   const char *model, const char *template_args);
void zn_gs_tok_close(zn_gs_tok *t);
/* Sends `req` (stolen) and returns the answer's `key` (a new reference) in
 * *out. 0 or a code with the reason set. */
int zn_gs_tok_ask(zn_gs_tok *t, json_t *req, const char *key, json_t **out);
/* The text of ids, malloc'd. */
int zn_gs_tok_decode(zn_gs_tok *t, const int32_t *ids, int64_t n, char **text);
json_t *zn_gs_ids_json(const int32_t *ids, int64_t n);

/* Appends the ids of JSON array `arr`; messages name `where`. */
int zn_gs_prompts_add(zn_gs_prompts *p, json_t *arr, const char *where);
void zn_gs_prompts_free(zn_gs_prompts *p);
/* A prompt record ({"ids"}, {"messages"} or {"prompt"}) to ids through the
 * tokenizer. */
int zn_gs_prompt_from(zn_gs_prompts *p, zn_gs_tok *t, json_t *rec, const char *where);
/* The records of a jsonl file (each with "_line", its line number) into
 * *recs (a new array); *need_text is set when one has no "ids". */
int zn_gs_read_prompts(const char *path, json_t **recs, int *need_text);

/* eos ids (an integer or a list) appended to gp's. */
void zn_gs_eos_from(zn_gen_params *gp, json_t *v);
/* generation_config.json's settings over gp, eos from it or config.json. */
int zn_gs_folder_defaults(const char *dir, zn_gen_params *gp);

int zn_gs_stream_token(void *ctx, int64_t seq, int32_t id, int last);
void zn_gs_stream_free(zn_gs_stream *s);

#endif
