/* A generation session (include/zinc/gensession.h): the model to run and
 * its decoding settings, the device with the model placed on it, the
 * figures a placement's bound divides by, the batch decoded and a chat's
 * history. The text side (tokenizer, prompts, streaming) is gen_prompt.c. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/ckpt.h"
#include "zinc/config.h"
#include "zinc/cost.h"
#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/gensession.h"
#include "zinc/model.h"
#include "zinc/run.h"
#include "zinc/util.h"
#include "run/gen-impl.h"

/* ---- placing the model ---------------------------------------------------------------- */

zn_gen_place zn_gen_place_default(void)
{
    zn_gen_place o;
    memset(&o, 0, sizeof o);
    o.device = "auto";
    o.dtype = -1;
    o.batch = 1;
    o.kv_home = ZN_GEN_KV_AUTO;
    o.resident = -1;
    o.ring = 2;
    return o;
}

int zn_gen_parse_kv_home(const char *s, int *kv_home)
{
    if (!strcmp(s, "auto"))
        *kv_home = ZN_GEN_KV_AUTO;
    else if (!strcmp(s, "device"))
        *kv_home = ZN_GEN_KV_DEVICE;
    else if (!strcmp(s, "pinned"))
        *kv_home = ZN_GEN_KV_PINNED;
    else
        return zn_set_error(ZN_EARG, "--kv-cache must be auto, device or pinned (not '%s')", s);
    return 0;
}

int zn_gen_place_model(zn_dev *dev, const zn_model_dims *d, zn_dtype dt, const zn_gen_place *o,
                       zn_model **m, zn_gen **g)
{
    *m = NULL;
    *g = NULL;
    if (o->ctx < 1 || o->batch < 1)
        return zn_set_error(ZN_EARG, "a context of %lld tokens, %lld sequences",
                            (long long)o->ctx, (long long)o->batch);
    zn_model_config mc = zn_model_config_default(dev);
    mc.dtype = dt;
    /* the workspace holds a prompt or a batch's decoded tokens, whichever is
     * more (a batch beyond the context was refused when it held a prompt) */
    mc.max_batch = (o->batch + o->ctx - 1) / o->ctx;
    mc.max_seq = o->ctx;
    mc.attention = ZN_ATTN_GEMM;
    zn_gen_config gc = zn_gen_config_default();
    gc.max_batch = o->batch;
    gc.nvme_dir = o->nvme;
    gc.kv_home = o->kv_home;
    gc.max_resident_layers = o->resident;
    gc.ring = o->ring;
    int rc = zn_model_create(m, dev, d, &mc);
    if (!rc)
        rc = zn_gen_open(g, *m, &gc);
    if (rc) {
        zn_model_destroy(*m);
        *m = NULL;
    }
    return rc;
}

void zn_gen_engine_close(zn_gen_engine *e)
{
    zn_gen_destroy(e->g);
    zn_model_destroy(e->m);
    zn_dev_destroy(e->dev);
    memset(e, 0, sizeof *e);
}

/* A checkpoint's values into the generator. */
static int put_ckpt(void *ctx, int block, int i, uint64_t first, const float *v, uint64_t n)
{
    return zn_gen_put(ctx, block, i, first, v, n);
}

int zn_gen_engine_open(zn_gen_engine *e, const zn_model_dims *d, const char *model,
                       const char *adapter, const char *ckpt, const zn_gen_place *o,
                       int plan_only)
{
    int rc;
    memset(e, 0, sizeof *e);
    zn_dev_config dc = zn_dev_config_default();
    dc.name = o->device;
    if (o->gpu_budget)
        dc.gpu_budget = o->gpu_budget;
    if ((rc = zn_dev_create(&e->dev, &dc)))
        return zn_error_prefix(rc, "device");
    e->dt = zn_model_config_default(e->dev).dtype;
    if (o->dtype >= 0)
        e->dt = (zn_dtype)o->dtype;
    e->kv_home = o->kv_home;
    e->ctx = o->ctx;
    e->batch = o->batch;
    if ((rc = zn_gen_place_model(e->dev, d, e->dt, o, &e->m, &e->g))) {
        zn_gen_engine_close(e);
        return zn_error_prefix(rc, "placing the model");
    }
    if (plan_only)
        return 0;
    double t0 = zn_now_s();
    if (ckpt) { /* a LoRA checkpoint holds the adapters only: the base from its folder */
        rc = d->lora.r > 0 ? zn_gen_load_base(e->g, model) : 0;
        if (!rc)
            rc = zn_ckpt_read_weights(ckpt, put_ckpt, e->g);
    } else {
        rc = zn_gen_load(e->g, model, adapter);
    }
    if (rc) {
        zn_gen_engine_close(e);
        return zn_error_prefix(rc, "loading %s", ckpt      ? "the checkpoint"
                                                 : adapter ? "the base and adapter"
                                                           : "weights");
    }
    e->load_s = zn_now_s() - t0;
    return 0;
}

void zn_gen_engine_placement_line(const zn_gen_engine *e, char *buf, size_t n)
{
    zn_gen_placement p;
    zn_gen_get_placement(e->g, &p);
    char a[32];
    int w;
    if (!p.streamed_layers)
        w = snprintf(buf, n, "every weight on the device (%s)",
                     zn_format_size(p.device_weight_bytes, a, sizeof a));
    else
        w = snprintf(buf, n, "%d of %d layers on the device, %d streamed from %s through %d slots "
                     "(%s per step)", p.resident_layers, p.layers, p.streamed_layers,
                     p.nvme_bytes ? "NVMe" : "pinned RAM", p.ring,
                     zn_format_size(p.streamed_bytes_per_step, a, sizeof a));
    if (p.kv_pinned && w >= 0 && (size_t)w < n)
        snprintf(buf + w, n - (size_t)w, ", KV cache in pinned RAM");
}

/* ---- the figures a placement's bound divides by --------------------------------------- */

int zn_gen_link_figures(const char *device, const char *nvme, const char *target,
                        int recalibrate, zn_ceilings *c, FILE *note)
{
    memset(c, 0, sizeof *c);
    if (target) {
        const zn_ceilings *t = zn_cost_target(target);
        if (!t)
            return zn_set_error(ZN_EARG, "--target %s: not a target zinc knows (%s)", target,
                                zn_cost_target_names());
        *c = *t;
        return 0;
    }
    zn_config cfg;
    zn_config_default(&cfg);
    snprintf(cfg.train.device, sizeof cfg.train.device, "%s", device);
    if (nvme) {
        cfg.tiers.n_nvme = 1;
        snprintf(cfg.tiers.nvme[0].path, sizeof cfg.tiers.nvme[0].path, "%s", nvme);
    }
    zn_cost_compute comp;
    int rc = zn_run_ceilings(&cfg, NULL, recalibrate ? ZN_CEIL_RECALIBRATE : ZN_CEIL_CACHED, c,
                             &comp, note);
    return rc ? zn_error_prefix(rc, "the link's figures") : 0;
}

void zn_gen_step_bytes(const zn_gen_placement *p, int64_t B, int64_t ctx_tokens,
                       zn_gen_bytes *s)
{
    uint64_t b = (uint64_t)B;
    s->h2d = p->streamed_bytes_per_step + b * p->embed_row_bytes;
    s->d2h = b * p->logits_row_bytes;
    s->nvme = p->nvme_bytes ? p->streamed_bytes_per_step : 0;
    if (p->kv_pinned) {
        s->h2d += b * (uint64_t)ctx_tokens * p->kv_token_bytes;
        s->d2h += b * p->kv_token_bytes;
    }
}

double zn_gen_step_bound(const zn_gen_placement *p, int64_t B, int64_t ctx_tokens,
                         const zn_ceilings *c, const zn_model_dims *d, double comp_s,
                         const char **by)
{
    zn_gen_bytes sb;
    zn_gen_step_bytes(p, B, ctx_tokens, &sb);
    *by = "nothing";
    if ((sb.h2d && !(c->h2d_bps > 0)) || (sb.nvme && !(c->nvme_read_bps > 0))) {
        *by = "unknown";
        return 0;
    }
    double comp = comp_s >= 0 ? comp_s : 0;
    if (comp_s < 0 && c->gemm_flops > 0) {
        uint64_t pc = zn_model_param_count(d);
        if (!d->tie_embeddings)
            pc -= (uint64_t)(d->vocab * d->hidden); /* a gather, not a GEMM */
        comp = 2.0 * (double)pc * (double)B /
               (c->gemm_flops * (c->model_eff > 0 ? c->model_eff : 1));
    }
    double t = 0, h2d = c->h2d_bps > 0 ? (double)sb.h2d / c->h2d_bps : 0;
    double d2h = c->d2h_bps > 0 ? (double)sb.d2h / c->d2h_bps : 0;
    double rd = sb.nvme ? (double)sb.nvme / c->nvme_read_bps : 0;
    if (c->shared_cores) {
        /* the host backend: its copies are memcpy on the cores that
         * compute, so they add (the cost model's rule); the disk beside */
        t = comp + h2d + d2h;
        *by = comp > 0 ? "compute and copies on the shared cores" : "the copies";
        if (rd > t)
            t = rd, *by = "NVMe reads";
        return t;
    }
    if (h2d > t)
        t = h2d, *by = "the host link";
    if (d2h > t)
        t = d2h, *by = "the device-to-host link";
    if (rd > t)
        t = rd, *by = "NVMe reads";
    if (comp > t)
        t = comp, *by = "compute";
    return t;
}

/* ---- the session ---------------------------------------------------------------------- */

struct zn_gen_session {
    char *model, *adapter, *ckpt;   /* the folder (a checkpoint's recorded one), or NULL */
    char *source_root, *python;
    char *template_args;            /* the chat template's variables (JSON), or NULL */
    zn_gen_params gp;
    zn_model_dims d;
    zn_gs_tok tok;
    zn_gs_prompts pr;               /* the batch's prompts; a chat's rendered history */
    int64_t longest, ctx;
    zn_gen_engine en;
    int32_t **gen;                  /* what each prompt generated */
    int64_t *gen_len;
    zn_gs_stream sm;
    int chat;                       /* zn_gen_session_chat_begin was called */
    json_t *msgs;                   /* the chat's history */
    char *system;
};

zn_gen_session_config zn_gen_session_config_default(void)
{
    zn_gen_session_config c;
    memset(&c, 0, sizeof c);
    c.decode.max_new_tokens = -1;
    c.decode.do_sample = -1;
    c.decode.temperature = -1;
    c.decode.top_k = -1;
    c.decode.top_p = -1;
    c.decode.repetition_penalty = -1;
    return c;
}

/* A copy of s (NULL stays NULL): 0 or -ENOMEM. */
static int dup_opt(char **out, const char *s)
{
    *out = s ? strdup(s) : NULL;
    return s && !*out ? -ENOMEM : 0;
}

/* --checkpoint: the checkpoint's model (its dims and LoRA), and the HF
 * folder for the tokenizer and the base: `model`, else the one the run
 * recorded, into model_out. A `model` of another shape is refused. */
static int ckpt_source(const char *ckpt, const char *model, char *model_out, size_t n,
                       zn_model_dims *d)
{
    zn_ckpt *ck = NULL;
    int rc = zn_ckpt_open(&ck, ckpt);
    if (!rc && (rc = zn_ckpt_dims(ck, d)) == -ENOENT)
        rc = zn_set_error(ZN_ECONFIG, "%s records no model shape (a checkpoint of `zinc train` "
                          "with a model section or --model has one)", ckpt);
    if (!rc && !model && zn_ckpt_model_path(ck, model_out, n)) {
        rc = zn_set_error(ZN_ECONFIG, "%s records no model folder: give --model DIR (the HF "
                          "folder it was trained from, for the tokenizer%s)", ckpt,
                          d->lora.r > 0 ? " and the base weights" : "");
    } else if (!rc && model) {
        snprintf(model_out, n, "%s", model);
        zn_model_dims md;
        if (!(rc = zn_model_dims_from_hf(&md, model))) {
            md.lora = d->lora;
            if ((rc = zn_ckpt_check_dims(ck, &md))) {
                char why[512];
                snprintf(why, sizeof why, "%s", zn_last_error());
                rc = zn_set_error(ZN_ECONFIG, "%s (the config being --model %s)", why, model);
            }
        }
    }
    zn_ckpt_close(ck);
    return rc ? zn_error_prefix(rc, "--checkpoint") : 0;
}

/* The decoding settings (the folder's generation_config.json, then the
 * overrides) and the model's dims (with the adapter's LoRA; already set
 * when `have_dims`, from a checkpoint). */
static int decode_setup(const zn_gen_overrides *f, const char *model, const char *adapter,
                        int have_dims, zn_gen_params *gp, zn_model_dims *d)
{
    int rc;
    *gp = zn_gen_params_default();
    if ((rc = zn_gs_folder_defaults(model, gp)))
        return rc;
    if (f->max_new_tokens > 0)
        gp->max_new_tokens = f->max_new_tokens;
    if (f->do_sample >= 0)
        gp->do_sample = f->do_sample;
    if (f->temperature > 0)
        gp->temperature = f->temperature;
    if (f->top_k >= 0)
        gp->top_k = f->top_k;
    if (f->top_p > 0)
        gp->top_p = f->top_p;
    if (f->repetition_penalty > 0)
        gp->repetition_penalty = f->repetition_penalty;
    gp->seed = f->seed;
    if ((rc = zn_gen_params_check(gp)) || (!have_dims && (rc = zn_model_dims_from_hf(d, model))))
        return rc;
    if (adapter && have_dims)
        return zn_set_error(ZN_EARG, "--adapter and --checkpoint: a LoRA checkpoint holds its "
                            "adapters");
    /* the adapter's folder is at fault, not an argument: ZN_EARG stays the
     * conflict's alone */
    if (adapter && (rc = zn_lora_read_peft_config(adapter, &d->lora)))
        return zn_error_prefix(rc == ZN_EARG ? ZN_ECONFIG : rc, "--adapter");
    if (adapter)
        zn_lora_fit_family(d);
    return 0;
}

void zn_gen_session_close(zn_gen_session *s)
{
    if (!s)
        return;
    zn_gen_engine_close(&s->en);
    for (int64_t i = 0; s->gen && i < s->pr.n; i++)
        free(s->gen[i]);
    free(s->gen);
    free(s->gen_len);
    zn_gs_prompts_free(&s->pr);
    zn_gs_tok_close(&s->tok);
    zn_gs_stream_free(&s->sm);
    json_decref(s->msgs);
    free(s->system);
    free(s->model);
    free(s->adapter);
    free(s->ckpt);
    free(s->source_root);
    free(s->python);
    free(s->template_args);
    free(s);
}

int zn_gen_session_open(zn_gen_session **out, const zn_gen_session_config *c)
{
    char ck_model[4096];
    int rc;
    *out = NULL;
    if (!c->model && !c->checkpoint)
        return zn_set_error(ZN_EARG, "no model: give a folder or a checkpoint");
    zn_gen_session *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    const char *model = c->model;
    if (c->checkpoint) {
        if ((rc = ckpt_source(c->checkpoint, c->model, ck_model, sizeof ck_model, &s->d)))
            goto fail;
        model = ck_model;
    }
    if ((rc = decode_setup(&c->decode, model, c->adapter, c->checkpoint != NULL, &s->gp,
                           &s->d)))
        goto fail;
    if ((rc = dup_opt(&s->model, model)) || (rc = dup_opt(&s->adapter, c->adapter)) ||
        (rc = dup_opt(&s->ckpt, c->checkpoint)) ||
        (rc = dup_opt(&s->source_root, c->source_root)) || (rc = dup_opt(&s->python, c->python)))
        goto fail;
    *out = s;
    return 0;
fail:
    zn_gen_session_close(s);
    return rc;
}

void zn_gen_session_get_info(const zn_gen_session *s, zn_gen_session_info *out)
{
    memset(out, 0, sizeof *out);
    out->model = s->model;
    out->dims = s->d;
    out->params = s->gp;
    out->tokenizer = s->tok.pid != 0;
    out->prompts = s->chat ? 0 : s->pr.n;
    out->longest = s->longest;
    out->ctx = s->ctx;
}

int zn_gen_session_set_template_args(zn_gen_session *s, const char *json_object)
{
    if (s->tok.pid)
        return zn_set_error(ZN_EARG, "the chat template's variables are set before the "
                            "tokenizer starts");
    char *copy = NULL;
    if (json_object) {
        json_error_t e;
        json_t *o = json_loads(json_object, 0, &e);
        int ok = json_is_object(o);
        json_decref(o);
        if (!ok)
            return zn_set_error(ZN_EARG, "the chat template's variables must be a JSON object, "
                                "not %.80s", json_object);
        if (!(copy = strdup(json_object)))
            return zn_set_error(-ENOMEM, "out of memory");
    }
    free(s->template_args);
    s->template_args = copy;
    return 0;
}

int zn_gen_session_open_tokenizer(zn_gen_session *s)
{
    int rc = zn_gs_tok_open(&s->tok, s->python, s->source_root, s->model, s->template_args);
    if (!rc && s->tok.eos && !s->gp.n_eos)
        zn_gs_eos_from(&s->gp, s->tok.eos);
    return rc;
}

/* The prompts of p into s->pr, the tokenizer started when one is text. */
static int take_prompts(zn_gen_session *s, const zn_gen_prompt_source *p)
{
    json_t *recs = NULL;
    int rc = 0, need_text = !p->ids && !p->jsonl; /* a file: when a line has no "ids" */
    if (p->jsonl && (rc = zn_gs_read_prompts(p->jsonl, &recs, &need_text)))
        goto out;
    if (need_text && (rc = zn_gen_session_open_tokenizer(s)))
        goto out;
    if (p->text || p->chat) {
        json_t *r = json_object();
        if (p->text)
            json_object_set_new(r, "prompt", json_string(p->text));
        else
            json_object_set_new(r, "messages",
                                json_pack("[{s:s, s:s}]", "role", "user", "content", p->chat));
        rc = zn_gs_prompt_from(&s->pr, &s->tok, r, p->text ? "--prompt" : "--chat");
        json_decref(r);
    } else if (p->ids) {
        json_t *a = json_array();
        for (int64_t i = 0; i < p->n_ids; i++)
            json_array_append_new(a, json_integer(p->ids[i]));
        rc = zn_gs_prompts_add(&s->pr, a, "--ids");
        json_decref(a);
    } else {
        size_t i;
        json_t *r;
        json_array_foreach(recs, i, r) {
            char where[4200];
            snprintf(where, sizeof where, "%s:%lld", p->jsonl,
                     (long long)json_integer_value(json_object_get(r, "_line")));
            if ((rc = zn_gs_prompt_from(&s->pr, &s->tok, r, where)))
                break;
        }
    }
out:
    json_decref(recs);
    return rc;
}

int zn_gen_session_prompts(zn_gen_session *s, const zn_gen_prompt_source *p, int64_t context)
{
    int rc = take_prompts(s, p);
    if (rc)
        return rc;
    /* the context: the longest prompt and the new tokens, within the model's */
    int64_t longest = 0;
    for (int64_t i = 0; i < s->pr.n; i++)
        longest = s->pr.len[i] > longest ? s->pr.len[i] : longest;
    int64_t ctx = context > 0 ? context : longest + s->gp.max_new_tokens;
    if (ctx > s->d.max_pos)
        ctx = s->d.max_pos;
    if (longest >= ctx)
        return zn_set_error(ZN_ECONFIG, "a prompt of %lld tokens leaves no room in a context "
                            "of %lld (max_position_embeddings %lld%s)", (long long)longest,
                            (long long)ctx, (long long)s->d.max_pos,
                            context > 0 ? ", --context" : "");
    s->longest = longest;
    s->ctx = ctx;
    return 0;
}

int zn_gen_session_place(zn_gen_session *s, const zn_gen_place *o, int plan_only)
{
    zn_gen_place po = *o;
    if (!po.ctx)
        po.ctx = s->ctx;
    if (!s->chat && s->pr.n && po.batch > s->pr.n)
        po.batch = s->pr.n;
    int rc = zn_gen_engine_open(&s->en, &s->d, s->model, s->adapter, s->ckpt, &po, plan_only);
    /* each turn's prompt is the history so far: its cache stays */
    if (!rc && s->chat)
        zn_gen_set_prefix_reuse(s->en.g, 1);
    return rc;
}

zn_gen_engine *zn_gen_session_engine(zn_gen_session *s)
{
    return s->en.g ? &s->en : NULL;
}

int zn_gen_session_generate(zn_gen_session *s, zn_gen_text_fn on_text, void *ctx,
                            double *seconds)
{
    *seconds = 0;
    if (!s->en.g)
        return zn_set_error(ZN_EARG, "no model placed");
    if (on_text && (s->pr.n != 1 || !s->tok.pid))
        return zn_set_error(ZN_EARG, "streamed text needs one prompt and the tokenizer");
    if (s->gen)
        return zn_set_error(ZN_EARG, "the prompts were generated for already");
    if (!(s->gen = calloc((size_t)s->pr.n, sizeof *s->gen)) ||
        !(s->gen_len = calloc((size_t)s->pr.n, sizeof *s->gen_len)))
        return -ENOMEM;
    zn_gs_stream_free(&s->sm);
    s->sm.tok = &s->tok;
    s->sm.fn = on_text;
    s->sm.ctx = ctx;
    double t0 = zn_now_s();
    int rc = zn_gen_run(s->en.g, s->pr.n, (const int32_t *const *)s->pr.ids, s->pr.len, &s->gp,
                        s->gen, s->gen_len, zn_gs_stream_token, &s->sm);
    *seconds = zn_now_s() - t0;
    return rc;
}

void zn_gen_session_output(const zn_gen_session *s, int64_t i, zn_gen_output *out)
{
    memset(out, 0, sizeof *out);
    out->prompt = s->pr.ids[i];
    out->prompt_len = s->pr.len[i];
    if (!s->gen)
        return;
    out->ids = s->gen[i];
    out->len = s->gen_len[i];
    for (int k = 0; k < s->gp.n_eos && out->len; k++)
        out->eos |= out->ids[out->len - 1] == s->gp.eos[k];
}

int zn_gen_session_decode(zn_gen_session *s, const int32_t *ids, int64_t n, char **text)
{
    *text = NULL;
    if (!s->tok.pid)
        return zn_set_error(ZN_EARG, "decoding needs the model's tokenizer");
    return zn_gs_tok_decode(&s->tok, ids, n, text);
}

/* ---- a chat ----------------------------------------------------------------------------- */

int zn_gen_session_chat_begin(zn_gen_session *s, int64_t context, const char *system)
{
    int64_t ctx = context > 0 ? context : (s->d.max_pos < 4096 ? s->d.max_pos : 4096);
    if (system && !(s->system = strdup(system)))
        return -ENOMEM;
    if (!(s->msgs = json_array()))
        return -ENOMEM;
    s->ctx = ctx > s->d.max_pos ? s->d.max_pos : ctx;
    s->chat = 1;
    return 0;
}

void zn_gen_session_chat_reset(zn_gen_session *s)
{
    json_array_clear(s->msgs);
    zn_gs_prompts_free(&s->pr);
}

int zn_gen_session_chat_system(zn_gen_session *s, const char *system)
{
    char *t = NULL;
    if (system && *system && !(t = strdup(system)))
        return -ENOMEM;
    free(s->system);
    s->system = t;
    zn_gen_session_chat_reset(s);
    return 0;
}

int zn_gen_session_chat_prompt(zn_gen_session *s, const char *user, int64_t *n_ids)
{
    *n_ids = 0;
    if (!s->chat || !s->tok.pid)
        return zn_set_error(ZN_EARG, "no chat begun with a tokenizer");
    zn_gs_prompts_free(&s->pr);
    if (!json_array_size(s->msgs) && s->system)
        json_array_append_new(s->msgs, json_pack("{s:s, s:s}", "role", "system", "content",
                                                 s->system));
    json_array_append_new(s->msgs, json_pack("{s:s, s:s}", "role", "user", "content", user));
    json_t *req = json_object(), *ids;
    json_object_set(req, "messages", s->msgs);
    int rc = zn_gs_tok_ask(&s->tok, req, "ids", &ids);
    if (!rc)
        rc = zn_gs_prompts_add(&s->pr, ids, "chat");
    json_decref(ids);
    if (!rc)
        *n_ids = s->pr.len[0];
    return rc;
}

void zn_gen_session_chat_undo(zn_gen_session *s)
{
    size_t n = json_array_size(s->msgs);
    if (n)
        json_array_remove(s->msgs, n - 1);
    zn_gs_prompts_free(&s->pr);
}

int zn_gen_session_chat_reply(zn_gen_session *s, zn_gen_text_fn on_text, void *ctx,
                              zn_gen_turn *turn)
{
    memset(turn, 0, sizeof *turn);
    if (!s->en.g || s->pr.n != 1)
        return zn_set_error(ZN_EARG, "no placed model or no prompt");
    int32_t *gen = NULL;
    int64_t gn = 0;
    s->sm.tok = &s->tok;
    s->sm.fn = on_text;
    s->sm.ctx = ctx;
    s->sm.n = 0;
    s->sm.printed = 0;
    free(s->sm.text);
    s->sm.text = NULL;
    double t0 = zn_now_s();
    int rc = zn_gen_run(s->en.g, 1, (const int32_t *const *)s->pr.ids, s->pr.len, &s->gp, &gen,
                        &gn, zn_gs_stream_token, &s->sm);
    double t1 = zn_now_s();
    zn_gs_prompts_free(&s->pr);
    char *text = NULL;
    if (!rc && on_text && s->sm.text) {
        /* the stream decoded every id at the last one: that is the reply */
        text = s->sm.text;
        s->sm.text = NULL;
    } else if (!rc) {
        rc = zn_gs_tok_decode(&s->tok, gen, gn, &text);
    }
    free(gen);
    if (rc)
        return rc;
    json_array_append_new(s->msgs, json_pack("{s:s, s:s}", "role", "assistant", "content",
                                             text));
    free(text);
    turn->tokens = gn;
    turn->seconds = t1 - t0;
    return 0;
}
