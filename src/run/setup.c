/* The model a config describes, as zn_model_dims: from an HF folder
 * (model.path) or from the dimensions in the config's `model` section. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zinc/config.h"
#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/nvme.h"
#include "zinc/run.h"
#include "zinc/tokens.h"

/* cfg's lora section (and lora.adapter's adapter_config.json) into d. */
static int lora_dims(const zn_config *cfg, zn_model_dims *d)
{
    const zn_config_lora *c = &cfg->lora;
    memset(&d->lora, 0, sizeof d->lora);
    if (!c->r && !c->adapter[0])
        return 0;
    d->lora.r = (int)c->r;
    d->lora.alpha = c->lora_alpha;
    d->lora.dropout = c->lora_dropout;
    d->lora.rslora = c->use_rslora;
    d->lora.targets = c->targets;
    /* PEFT's default for a fused family (phi3) is qkv_proj, not q_proj + v_proj */
    if (d->fused_proj && zn_config_get_origin(cfg, "lora.target_modules") == ZN_ORIGIN_DEFAULT)
        d->lora.targets = ZN_LORA_QKV;
    zn_lora_fit_family(d); /* "all-linear" as the family's projections */
    if (c->adapter[0]) {
        zn_lora a;
        int rc = zn_lora_read_peft_config(c->adapter, &a);
        if (rc)
            return zn_error_prefix(rc, "%s: lora.adapter", cfg->source);
        zn_model_dims fit = *d;
        fit.lora = a;
        zn_lora_fit_family(&fit);
        a = fit.lora;
        /* what the config says must agree with the adapter */
#define AGREE(key, cond, fmt, x, y)                                                         \
        if (zn_config_get_origin(cfg, key) != ZN_ORIGIN_DEFAULT && !(cond))                 \
            return zn_set_error(ZN_ECONFIG, "%s: " key " is " fmt " but the adapter in %s "   \
                                "has " fmt, cfg->source, x, c->adapter, y);
        AGREE("lora.r", c->r == a.r, "%lld", (long long)c->r, (long long)a.r)
        AGREE("lora.lora_alpha", c->lora_alpha == a.alpha, "%g", c->lora_alpha, a.alpha)
        AGREE("lora.use_rslora", c->use_rslora == (a.rslora != 0), "%d", (int)c->use_rslora,
              a.rslora)
        AGREE("lora.target_modules", d->lora.targets == a.targets, "0x%x", d->lora.targets,
              a.targets)
#undef AGREE
        double dropout = zn_config_get_origin(cfg, "lora.lora_dropout") != ZN_ORIGIN_DEFAULT
                             ? c->lora_dropout : a.dropout;
        d->lora = a;
        d->lora.dropout = dropout;
    }
    int rc = zn_model_dims_validate(d);
    return rc ? zn_error_prefix(rc, "%s", cfg->source) : 0;
}

/* The model.* keys only some families read: each names its families (bits
 * of 1 << arch); set for another family it is refused, never ignored. */
#define FAM(a) (1u << (a))
static const struct {
    const char *key;
    unsigned families;
} family_keys[] = {
    { "model.sliding_window", FAM(ZN_ARCH_GEMMA2) | FAM(ZN_ARCH_GEMMA3) | FAM(ZN_ARCH_OLMO3) |
                              FAM(ZN_ARCH_MISTRAL) | FAM(ZN_ARCH_PHI3) | FAM(ZN_ARCH_MIXTRAL) },
    { "model.sliding_window_pattern", FAM(ZN_ARCH_GEMMA3) },
    { "model.query_pre_attn_scalar", FAM(ZN_ARCH_GEMMA2) | FAM(ZN_ARCH_GEMMA3) },
    { "model.attn_logit_softcapping", FAM(ZN_ARCH_GEMMA2) | FAM(ZN_ARCH_GEMMA3) },
    { "model.final_logit_softcapping", FAM(ZN_ARCH_GEMMA2) | FAM(ZN_ARCH_GEMMA3) },
    { "model.rope_local_base_freq", FAM(ZN_ARCH_GEMMA3) },
    { "model.num_experts", FAM(ZN_ARCH_QWEN3_MOE) | FAM(ZN_ARCH_MIXTRAL) },
    { "model.num_experts_per_tok", FAM(ZN_ARCH_QWEN3_MOE) | FAM(ZN_ARCH_MIXTRAL) },
    { "model.moe_intermediate_size", FAM(ZN_ARCH_QWEN3_MOE) },
    { "model.decoder_sparse_step", FAM(ZN_ARCH_QWEN3_MOE) },
    { "model.norm_topk_prob", FAM(ZN_ARCH_QWEN3_MOE) },
    { "model.output_router_logits", FAM(ZN_ARCH_QWEN3_MOE) | FAM(ZN_ARCH_MIXTRAL) },
    { "model.router_aux_loss_coef", FAM(ZN_ARCH_QWEN3_MOE) | FAM(ZN_ARCH_MIXTRAL) },
};

static int key_set(const zn_config *cfg, const char *key)
{
    return zn_config_get_origin(cfg, key) != ZN_ORIGIN_DEFAULT;
}

/* Appends `"name": value,` to buf (the value printed by the caller's
 * format); nonzero when buf is full. */
static int put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len)
        return -1;
    *len += (size_t)n;
    return 0;
}

/* gemma2, gemma3_text, olmo3, qwen3_moe, mixtral from the model.* keys: the
 * keys written as the config.json they name and read by the folder's own
 * parser (zn_model_dims_from_json), so a key not set takes the family's HF
 * default exactly as a config.json without it would. */
static int dims_as_hf(const zn_config *cfg, zn_model_arch arch, zn_model_dims *d)
{
    const zn_config_model *m = &cfg->model;
    char buf[4096], name[ZN_PATH_MAX + 16];
    size_t len = 0;
    int bad = put(buf, sizeof buf, &len, "{\"model_type\": \"%s\"", zn_model_arch_name(arch));
#define PUT_INT(k, v) bad |= put(buf, sizeof buf, &len, ", \"" k "\": %lld", (long long)(v))
#define PUT_NUM(k, v) bad |= put(buf, sizeof buf, &len, ", \"" k "\": %.17g", (double)(v))
#define PUT_BOOL(k, v) bad |= put(buf, sizeof buf, &len, ", \"" k "\": %s", (v) ? "true" : "false")
    /* the required dimensions: absent (0), the parser names the key */
    if (m->hidden_size) PUT_INT("hidden_size", m->hidden_size);
    if (m->num_hidden_layers) PUT_INT("num_hidden_layers", m->num_hidden_layers);
    if (m->num_attention_heads) PUT_INT("num_attention_heads", m->num_attention_heads);
    if (m->intermediate_size) PUT_INT("intermediate_size", m->intermediate_size);
    if (m->vocab_size) PUT_INT("vocab_size", m->vocab_size);
    if (m->num_key_value_heads) PUT_INT("num_key_value_heads", m->num_key_value_heads);
    if (m->head_dim) PUT_INT("head_dim", m->head_dim);
    /* the rest only where the config sets them: zinc's own defaults of
     * these keys (max_position_embeddings 4096, ...) are not these
     * families' */
    if (key_set(cfg, "model.max_position_embeddings"))
        PUT_INT("max_position_embeddings", m->max_position_embeddings);
    if (key_set(cfg, "model.rope_theta")) PUT_NUM("rope_theta", m->rope_theta);
    if (key_set(cfg, "model.rms_norm_eps")) PUT_NUM("rms_norm_eps", m->rms_norm_eps);
    if (key_set(cfg, "model.tie_word_embeddings"))
        PUT_BOOL("tie_word_embeddings", m->tie_word_embeddings);
    if (key_set(cfg, "model.attention_bias")) PUT_BOOL("attention_bias", m->attention_bias);
    if (key_set(cfg, "model.sliding_window")) PUT_INT("sliding_window", m->sliding_window);
    if (key_set(cfg, "model.sliding_window_pattern"))
        PUT_INT("sliding_window_pattern", m->sliding_window_pattern);
    if (key_set(cfg, "model.query_pre_attn_scalar"))
        PUT_NUM("query_pre_attn_scalar", m->query_pre_attn_scalar);
    /* a soft-cap of 0 is none: config.json's null */
    if (key_set(cfg, "model.attn_logit_softcapping"))
        bad |= m->attn_logit_softcapping > 0
                   ? put(buf, sizeof buf, &len, ", \"attn_logit_softcapping\": %.17g",
                         m->attn_logit_softcapping)
                   : put(buf, sizeof buf, &len, ", \"attn_logit_softcapping\": null");
    if (key_set(cfg, "model.final_logit_softcapping"))
        bad |= m->final_logit_softcapping > 0
                   ? put(buf, sizeof buf, &len, ", \"final_logit_softcapping\": %.17g",
                         m->final_logit_softcapping)
                   : put(buf, sizeof buf, &len, ", \"final_logit_softcapping\": null");
    if (key_set(cfg, "model.rope_local_base_freq"))
        PUT_NUM("rope_local_base_freq", m->rope_local_base_freq);
    if (key_set(cfg, "model.num_experts")) {
        if (arch == ZN_ARCH_MIXTRAL)
            PUT_INT("num_local_experts", m->num_experts);
        else
            PUT_INT("num_experts", m->num_experts);
    }
    if (key_set(cfg, "model.num_experts_per_tok"))
        PUT_INT("num_experts_per_tok", m->num_experts_per_tok);
    if (key_set(cfg, "model.moe_intermediate_size"))
        PUT_INT("moe_intermediate_size", m->moe_intermediate_size);
    if (key_set(cfg, "model.decoder_sparse_step"))
        PUT_INT("decoder_sparse_step", m->decoder_sparse_step);
    if (key_set(cfg, "model.norm_topk_prob")) PUT_BOOL("norm_topk_prob", m->norm_topk_prob);
    if (key_set(cfg, "model.output_router_logits"))
        PUT_BOOL("output_router_logits", m->output_router_logits);
    if (key_set(cfg, "model.router_aux_loss_coef"))
        PUT_NUM("router_aux_loss_coef", m->router_aux_loss_coef);
#undef PUT_INT
#undef PUT_NUM
#undef PUT_BOOL
    bad |= put(buf, sizeof buf, &len, "}");
    if (bad)
        return zn_set_error(ZN_ECONFIG, "%s: model: the keys do not fit in %zu bytes",
                            cfg->source, sizeof buf);
    snprintf(name, sizeof name, "%s: model", cfg->source);
    return zn_model_dims_from_json(d, buf, name);
}

int zn_run_model_dims(const zn_config *cfg, zn_model_dims *d)
{
    const zn_config_model *m = &cfg->model;
    if (m->path[0]) {
        int rc = zn_model_dims_from_hf(d, m->path);
        if (rc)
            return zn_error_prefix(rc, "%s: model.path", cfg->source);
        return lora_dims(cfg, d);
    }
    if (!m->hidden_size)
        return zn_set_error(ZN_ECONFIG, "%s: no model: set model.path to an HF model folder "
                            "or give model.hidden_size, num_hidden_layers, ...", cfg->source);
    /* model.model_type's order (src/config/schema.c) */
    static const zn_model_arch archs[] = { ZN_ARCH_LLAMA, ZN_ARCH_QWEN2, ZN_ARCH_MISTRAL,
                                           ZN_ARCH_QWEN3, ZN_ARCH_PHI3, ZN_ARCH_OLMO2,
                                           ZN_ARCH_GEMMA, ZN_ARCH_GEMMA2, ZN_ARCH_GEMMA3,
                                           ZN_ARCH_OLMO3, ZN_ARCH_QWEN3_MOE, ZN_ARCH_MIXTRAL };
    int na = (int)(sizeof archs / sizeof archs[0]);
    zn_model_arch arch = archs[m->arch >= 0 && m->arch < na ? m->arch : 0];
    for (size_t i = 0; i < sizeof family_keys / sizeof family_keys[0]; i++)
        if (key_set(cfg, family_keys[i].key) && !(family_keys[i].families & FAM(arch)))
            return zn_set_error(ZN_EUNSUPPORTED, "%s: %s is not a key of model_type %s "
                                "(docs/config.md names the families that read it)", cfg->source,
                                family_keys[i].key, zn_model_arch_name(arch));
    if (arch == ZN_ARCH_GEMMA2 || arch == ZN_ARCH_GEMMA3 || arch == ZN_ARCH_OLMO3 ||
        arch == ZN_ARCH_QWEN3_MOE || arch == ZN_ARCH_MIXTRAL) {
        int rc = dims_as_hf(cfg, arch, d);
        return rc ? rc : lora_dims(cfg, d);
    }
    zn_model_dims_default(d);
    d->arch = arch;
    d->hidden = m->hidden_size;
    d->n_layers = m->num_hidden_layers;
    d->n_heads = m->num_attention_heads;
    d->n_kv_heads = m->num_key_value_heads ? m->num_key_value_heads : m->num_attention_heads;
    d->head_dim = m->head_dim ? m->head_dim : m->hidden_size / m->num_attention_heads;
    d->intermediate = m->intermediate_size;
    d->vocab = m->vocab_size;
    d->max_pos = m->max_position_embeddings;
    d->rope_theta = m->rope_theta;
    d->rope_type = ZN_ROPE_DEFAULT;
    d->rms_eps = m->rms_norm_eps;
    d->tie_embeddings = m->tie_word_embeddings;
    /* as config.json would give them: qwen2's q/k/v bias, llama's and
     * qwen3's attention_bias on all four, qwen3's q/k norm */
    int ab = (d->arch == ZN_ARCH_LLAMA || d->arch == ZN_ARCH_QWEN3 || d->arch == ZN_ARCH_OLMO2 ||
              d->arch == ZN_ARCH_GEMMA) &&
             m->attention_bias;
    d->qkv_bias = d->arch == ZN_ARCH_QWEN2 || ab;
    d->o_bias = ab;
    d->qk_norm = d->arch == ZN_ARCH_QWEN3 ? 1 : d->arch == ZN_ARCH_OLMO2 ? 2 : 0;
    d->post_norm = d->arch == ZN_ARCH_OLMO2;
    d->gemma_norm = d->gelu_mlp = d->embed_scaled = d->arch == ZN_ARCH_GEMMA;
    d->fused_proj = d->arch == ZN_ARCH_PHI3;
    if (key_set(cfg, "model.sliding_window")) /* mistral's, phi3's (else none: null) */
        d->sliding_window = m->sliding_window;
    int rc = zn_model_dims_validate(d);
    if (rc)
        return zn_error_prefix(rc, "%s: model", cfg->source);
    return lora_dims(cfg, d);
}

/* Elements of parameter tensors smaller than `threshold`: those stay on
 * the GPU (DeepSpeed's stage3_param_persistence_threshold). */
uint64_t zn_run_persistent_params(const zn_model_dims *d, uint64_t threshold)
{
    uint64_t H = (uint64_t)d->hidden, V = (uint64_t)d->vocab;
    /* Every decoder layer's base tensors (the model's own list: a mixture
     * of experts' dense and sparse layers differ), then the embedding,
     * final norm, head. */
    uint64_t total = 0;
    for (int b = 1; b <= (int)d->n_layers; b++) {
        int np = zn_model_block_nparams(d, b);
        for (int i = 0; i < np; i++) {
            zn_param_info pi;
            if (zn_model_block_param(d, b, i, &pi) == 0 && !pi.lora &&
                (uint64_t)pi.numel < threshold)
                total += (uint64_t)pi.numel;
        }
    }
    if (d->tie_embeddings)
        total += V * H;  /* one table, resident: the head reads it too */
    else if (V * H < threshold)
        total += V * H * 2;
    if (H < threshold)
        total += H;
    return total;
}

/* The file system that holds `path`, or that will hold it (a swap
 * directory that tiers.create_nvme_path lets the run create is measured at
 * its nearest existing parent): its free bytes and its device id. */
static int fs_stat(const char *path, uint64_t *free_bytes, uint64_t *dev)
{
    char p[ZN_PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (;;) {
        struct statvfs sv;
        struct stat st;
        if (statvfs(p, &sv) == 0 && stat(p, &st) == 0) {
            *free_bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
            *dev = (uint64_t)st.st_dev;
            return 0;
        }
        if (errno != ENOENT)
            return -errno;
        char *slash = strrchr(p, '/');
        if (!slash) {
            snprintf(p, sizeof p, ".");
            continue;
        }
        if (slash == p) {
            p[1] = '\0';
            continue;
        }
        *slash = '\0';
    }
}

/* An "auto" NVMe path's share of the budget: its file system's free space,
 * counted once however many paths sit on that file system. */
static uint64_t fs_once(uint64_t dev, uint64_t fr, uint64_t *seen, int *nseen)
{
    for (int k = 0; k < *nseen; k++)
        if (seen[k] == dev)
            return 0;
    if (*nseen < 64)
        seen[(*nseen)++] = dev;
    return fr;
}

/* Opens the config's train.device for a look: 1 and its info when it is a
 * CUDA GPU that answers ("auto" = cuda:0), else 0 (the host backend, or no
 * GPU: the probe's error is cleared). */
static int probe_cuda(const zn_config *cfg, zn_dev_info *info)
{
    const char *name = cfg->train.device;
    if (!strcmp(name, "host"))
        return 0;
    zn_dev_config dc = zn_dev_config_default();
    dc.name = strcmp(name, "auto") && name[0] ? name : "cuda:0";
    dc.gpu_budget = 1 << 20;
    zn_dev *d = NULL;
    if (zn_dev_create(&d, &dc) != 0) {
        zn_clear_error();
        return 0;
    }
    zn_dev_get_info(d, info);
    zn_dev_destroy(d);
    return info->kind == ZN_DEV_CUDA;
}

int zn_run_has_cuda(const zn_config *cfg)
{
    zn_dev_info info;
    return probe_cuda(cfg, &info);
}

/* offload_optimizer "none": the states stay on the device and zinc's Adam
 * steps them there when the plan fits; when it does not, and would with
 * them in pinned RAM and the CPU Adam, they move there (where DeepSpeed
 * would run out of memory), and `note` says so. Plan and train both call
 * this with the same options, so both take the same placement. Returns 1
 * when it moved them, 0 when not, or a negative error of a dry plan. */
int zn_run_fit_optimizer(zn_config *cfg, zn_spec *sp, const zn_train_options *o, int world,
                          FILE *note)
{
    if (sp->opt_home != ZN_TIER_GPU)
        return 0;
    zn_plan p;
    zn_train_options po = *o;
    po.spec = sp;
    int rc = zn_train_plan(&p, &po, world);
    if (rc != ZN_ENOFIT)
        return rc < 0 ? rc : 0;
    char why[sizeof p.why];
    snprintf(why, sizeof why, "%s", p.why);
    zn_spec moved = *sp;
    moved.opt_home = ZN_TIER_CPU;
    po.spec = &moved;
    rc = zn_train_plan(&p, &po, world);
    if (rc == ZN_ENOFIT)
        return 0;   /* it does not fit either way: the run reports "none"'s reason */
    if (rc < 0)
        return rc;
    /* the spec is what runs; the config says it too, for the effective
     * config and the checkpoint's record of where the states lived */
    sp->opt_home = ZN_TIER_CPU;
    cfg->zero.offload_optimizer.device = ZN_OFFLOAD_CPU;
    if (note) {
        fprintf(note, "  note       zero_optimization.offload_optimizer.device \"none\" -> \"cpu\": "
                "with the fp32 master, Adam moments and gradient sums on the GPU the plan does "
                "not fit (%s); in pinned RAM, stepped by zinc's CPU Adam, it does, and the plan "
                "counts them there\n", why);
        fflush(note);
    }
    return 1;
}

/* Free memory of the GPU the config's train.device names, for an "auto"
 * GPU budget: 0 when the device is the host backend or no GPU answers
 * (zn_run_budgets then uses the host backend's rule). */
uint64_t zn_run_gpu_free(const zn_config *cfg)
{
    zn_dev_info info;
    return cfg->tiers.gpu_auto && probe_cuda(cfg, &info) ? info.free_mem : 0;
}

/* Resolves the three tier budgets of a config; "auto" becomes: GPU, the
 * device's free memory less a 1 GiB margin (the host backend: a quarter of
 * RAM, as its arena does); CPU, 90% of MemAvailable; NVMe, the free space of
 * each path's file system. nvme_path directories of the offload sections
 * count as auto-sized NVMe paths when tiers.nvme does not list them. */
/* ---- what else holds space on a swap path's file system ---------------------
 * The trainer's swap files are "zinc-train" ones (src/train/tier.c); what
 * dead runs left of them in the swap folders (kill -9) a run removes before
 * it takes its space, so that space counts as free. */
#define TRAIN_SWAP_PREFIX "zinc-train"

/* What dead runs left in swap folder `dir` (zn_swap_scan_stale): a run
 * removes it before it takes its space, so an "auto" size counts it free. */
static uint64_t reclaimable(const char *dir)
{
    zn_swap_scan sc;
    return zn_swap_scan_stale(dir, TRAIN_SWAP_PREFIX, &sc) ? 0 : sc.stale_bytes;
}

int zn_run_budgets(const zn_config *cfg, const zn_topo *topo, uint64_t gpu_free,
                   zn_plan_budgets *b)
{
    memset(b, 0, sizeof *b);
    if (cfg->tiers.gpu_auto)
        b->bytes[ZN_TIER_GPU] = gpu_free ? (gpu_free > (1ull << 30) ? gpu_free - (1ull << 30) : 0)
                                         : topo->mem_total / 4;
    else
        b->bytes[ZN_TIER_GPU] = cfg->tiers.gpu;
    b->bytes[ZN_TIER_CPU] = cfg->tiers.cpu_auto ? (uint64_t)((double)topo->mem_available * 0.9)
                                                : cfg->tiers.cpu;
    const char *extra[2] = { cfg->zero.offload_param.nvme_path,
                             cfg->zero.offload_optimizer.nvme_path };
    uint64_t seen[64];
    int nseen = 0;
    for (int i = 0; i < cfg->tiers.n_nvme; i++) {
        const zn_config_nvme_path *np = &cfg->tiers.nvme[i];
        if (!np->size_auto) {
            b->bytes[ZN_TIER_NVME] += np->size;
            continue;
        }
        uint64_t fr, dev;
        int rc = fs_stat(np->path, &fr, &dev);
        if (rc)
            return zn_set_error(rc, "%s: tiers.nvme[%d].path %s: %s", cfg->source, i,
                                np->path, strerror(-rc));
        b->bytes[ZN_TIER_NVME] += fs_once(dev, fr + reclaimable(np->path), seen, &nseen);
    }
    for (int j = 0; j < 2; j++) {
        if (!extra[j][0] || (j == 1 && !strcmp(extra[0], extra[1])))
            continue;
        bool listed = false;
        for (int i = 0; i < cfg->tiers.n_nvme; i++)
            listed |= !strcmp(cfg->tiers.nvme[i].path, extra[j]);
        if (listed)
            continue;
        uint64_t fr, dev;
        int rc = fs_stat(extra[j], &fr, &dev);
        if (rc)
            return zn_set_error(rc, "%s: zero_optimization.%s.nvme_path %s: %s", cfg->source,
                                j ? "offload_optimizer" : "offload_param", extra[j],
                                strerror(-rc));
        b->bytes[ZN_TIER_NVME] += fs_once(dev, fr + reclaimable(extra[j]), seen, &nseen);
    }
    return 0;
}

/* An NVMe path that exists here but cannot be written: a read-only file
 * system or no write permission. The run would stop creating its swap
 * files; a plan refuses it too. (A path that does not exist is
 * zn_config_nvme_path_check's: refused unless tiers.create_nvme_path.) */
static int nvme_path_writable(const zn_config *cfg, const char *key, const char *path)
{
    const char *p = path;
    struct stat st;
    if (stat(p, &st) != 0)
        return 0;
    struct statvfs sv;
    if (statvfs(p, &sv) == 0 && (sv.f_flag & ST_RDONLY))
        return zn_set_error(ZN_ECONFIG, "%s: %s %s is on a read-only file system (%s)",
                            cfg->source, key, path, p);
    if (access(p, W_OK) != 0)
        return zn_set_error(ZN_ECONFIG, "%s: %s %s: %s is not writable here: %s", cfg->source,
                            key, path, p, strerror(errno));
    return 0;
}


/* The tiers.nvme folders on file system `dev` that exist, each once. */
static int folders_on(const zn_config *cfg, uint64_t dev, const char **out, int max)
{
    uint64_t ino[ZN_MAX_NVME_PATHS];
    int n = 0;
    for (int i = 0; i < cfg->tiers.n_nvme && n < max && n < ZN_MAX_NVME_PATHS; i++) {
        struct stat st;
        if (stat(cfg->tiers.nvme[i].path, &st) || !S_ISDIR(st.st_mode) ||
            (uint64_t)st.st_dev != dev)
            continue;
        bool seen = false;
        for (int j = 0; j < n; j++)
            seen |= ino[j] == (uint64_t)st.st_ino;
        if (seen)
            continue;
        ino[n] = (uint64_t)st.st_ino;
        out[n++] = cfg->tiers.nvme[i].path;
    }
    return n;
}

/* Bytes the files under an open directory take, on its file system only. */
static uint64_t tree_bytes(int dfd, uint64_t dev, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    uint64_t sum = 0;
    struct dirent *e;
    struct stat sb;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
            fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) ||
            (uint64_t)sb.st_dev != dev)
            continue;
        sum += (uint64_t)sb.st_blocks * 512;
        int sub;
        if (S_ISDIR(sb.st_mode) && depth < 16 &&
            (sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                          O_CLOEXEC)) >= 0)
            sum += tree_bytes(sub, dev, depth + 1);
    }
    closedir(d);
    return sum;
}

/* The dead runs' leftovers in the folders on file system `dev`: a run
 * (strict) removes them, each removal warned with its size; a plan counts
 * them. *bytes and *n what they held. */
static void leftovers(const zn_config *cfg, uint64_t dev, int strict, uint64_t *bytes, int *n)
{
    const char *dirs[ZN_MAX_NVME_PATHS];
    int nd = folders_on(cfg, dev, dirs, ZN_MAX_NVME_PATHS);
    *bytes = 0;
    *n = 0;
    for (int i = 0; i < nd; i++) {
        uint64_t b = 0;
        int f = 0;
        zn_swap_scan sc;
        int rc = strict ? zn_swap_clean_stale(dirs[i], TRAIN_SWAP_PREFIX, &b, &f)
                        : zn_swap_scan_stale(dirs[i], TRAIN_SWAP_PREFIX, &sc);
        if (rc) {
            zn_warn("swap: looking for dead runs' files in %s: %s", dirs[i], zn_last_error());
            continue;
        }
        *bytes += strict ? b : sc.stale_bytes;
        *n += strict ? f : sc.stale;
    }
}

/* What else zinc knows holds space on file system `dev`, for a refusal:
 * swap folders it may not remove (a live run's, a kept one, another
 * host's) and the checkpoint directory when it is there. */
static void held_text(const zn_config *cfg, uint64_t dev, char *out, size_t len)
{
    const char *dirs[ZN_MAX_NVME_PATHS];
    int nd = folders_on(cfg, dev, dirs, ZN_MAX_NVME_PATHS);
    size_t o = 0;
    char sz[32];
    out[0] = '\0';
#define ADD(...)                                                          \
    do {                                                                  \
        if (o < len)                                                      \
            o += (size_t)snprintf(out + o, len - o, __VA_ARGS__);         \
    } while (0)
    for (int i = 0; i < nd; i++) {
        zn_swap_scan sc;
        if (zn_swap_scan_stale(dirs[i], TRAIN_SWAP_PREFIX, &sc) || !sc.held)
            continue;
        ADD("; %s holds %s of swap that zinc may not remove (%d run%s:", dirs[i],
            zn_format_size(sc.held_bytes, sz, sizeof sz), sc.held, sc.held > 1 ? "s" : "");
        for (int j = 0; j < sc.n_named; j++)
            ADD("%s %s (%s, %s, run %ld)", j ? "," : "", sc.named[j].path,
                zn_format_size(sc.named[j].bytes, sz, sizeof sz),
                zn_swap_held_desc(sc.named[j].why), sc.named[j].pid);
        ADD("%s)", sc.held > sc.n_named ? ", ..." : "");
    }
    const char *ck = cfg->train.checkpoint.dir;
    struct stat st;
    if (ck[0] && stat(ck, &st) == 0 && S_ISDIR(st.st_mode) && (uint64_t)st.st_dev == dev) {
        int fd = open(ck, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        uint64_t b = fd < 0 ? 0 : tree_bytes(fd, dev, 0);
        ADD("; train.checkpoint.dir %s is on it too and holds %s", ck,
            zn_format_size(b, sz, sizeof sz));
    }
#undef ADD
}

int zn_run_check_budgets(const zn_config *cfg, const zn_topo *topo, const zn_plan_budgets *b,
                         int strict)
{
    /* the swap folders of a run with state on NVMe: there, or allowed to be
     * made; plan and train refuse a missing one alike */
    if (cfg->zero.offload_param.device == ZN_OFFLOAD_NVME ||
        cfg->zero.offload_optimizer.device == ZN_OFFLOAD_NVME) {
        const char *paths[ZN_MAX_NVME_PATHS + 2];
        int np = zn_config_nvme_paths(cfg, paths, ZN_MAX_NVME_PATHS + 2);
        for (int i = 0; i < np; i++) {
            int rc = zn_config_nvme_path_check(cfg, i, NULL);
            if (rc)
                return rc;
        }
    }
    for (int i = 0; i < cfg->tiers.n_nvme; i++) {
        int rc = nvme_path_writable(cfg, "tiers.nvme path", cfg->tiers.nvme[i].path);
        if (rc)
            return rc;
    }
    const char *extra[2] = { cfg->zero.offload_param.nvme_path,
                             cfg->zero.offload_optimizer.nvme_path };
    for (int j = 0; j < 2; j++) {
        int rc = extra[j][0] && (j == 0 ? cfg->zero.offload_param.device
                                        : cfg->zero.offload_optimizer.device) == ZN_OFFLOAD_NVME
                     ? nvme_path_writable(cfg, j ? "zero_optimization.offload_optimizer.nvme_path"
                                                 : "zero_optimization.offload_param.nvme_path",
                                          extra[j])
                     : 0;
        if (rc)
            return rc;
    }
    char msg[4096] = "", x[32], y[32];
    size_t o = 0;
    int n = 0;
#define PROBLEM(...)                                                              \
    do {                                                                          \
        if (o < sizeof msg)                                                       \
            o += (size_t)snprintf(msg + o, sizeof msg - o, "%s", n++ ? "; " : ""); \
        if (o < sizeof msg)                                                       \
            o += (size_t)snprintf(msg + o, sizeof msg - o, __VA_ARGS__);          \
    } while (0)
    if (!cfg->tiers.cpu_auto && topo->mem_total && cfg->tiers.cpu > topo->mem_total)
        PROBLEM("tiers.cpu %s is more than this machine's RAM (%s)",
                zn_format_size(cfg->tiers.cpu, x, sizeof x),
                zn_format_size(topo->mem_total, y, sizeof y));
    /* explicit NVMe sizes, summed per file system, against its free space */
    struct { uint64_t dev, want, fr; const char *path; int paths; } fs[64];
    int nfs = 0;
    for (int i = 0; i < cfg->tiers.n_nvme; i++) {
        const zn_config_nvme_path *np = &cfg->tiers.nvme[i];
        uint64_t fr, dev;
        if (np->size_auto || fs_stat(np->path, &fr, &dev))
            continue;  /* an unreadable path is zn_run_budgets' or the run's error */
        int k = 0;
        while (k < nfs && fs[k].dev != dev)
            k++;
        if (k == nfs) {
            if (nfs == 64)
                continue;
            fs[nfs++] = (typeof(fs[0])){ dev, 0, fr, np->path, 0 };
        }
        fs[k].want += np->size;
        fs[k].paths++;
    }
    for (int k = 0; k < nfs; k++) {
        if (fs[k].want <= fs[k].fr)
            continue;
        /* short: what dead runs left there is the run's to take. A run
         * removes it now and measures again; a plan counts it as free. */
        uint64_t stale = 0, fr2, dev2;
        int nstale = 0;
        char z[32], held[1536];
        leftovers(cfg, fs[k].dev, strict, &stale, &nstale);
        /* an unlinked file's blocks come back when its last reference goes:
         * a run killed a moment ago may still hold them (its io_uring's
         * registered files close after it is reaped); up to 5 s for that */
        for (int t = 0; strict && nstale && t < 100; t++) {
            if (fs_stat(fs[k].path, &fr2, &dev2))
                break;
            bool done = fr2 >= fs[k].want || fr2 >= fs[k].fr + stale;
            if (done || t == 99) {
                fs[k].fr = fr2;
                break;
            }
            usleep(50 * 1000);
        }
        if (!strict)
            fs[k].fr += stale;
        if (!strict && nstale)
            zn_warn("tiers.nvme: the file system of %s holds %s of swap files that dead runs "
                    "left (%d, in its swap folders); a run removes them before it starts, so "
                    "the plan counts them as free: %s", fs[k].path,
                    zn_format_size(stale, x, sizeof x), nstale,
                    fs[k].want <= fs[k].fr ? "with them gone tiers.nvme fits"
                                           : "even with them gone it is short");
        if (fs[k].want <= fs[k].fr)
            continue;
        held_text(cfg, fs[k].dev, held, sizeof held);
        PROBLEM("tiers.nvme asks %s on the file system of %s%s, which has %s free "
                "(short by %s)%s%s", zn_format_size(fs[k].want, x, sizeof x), fs[k].path,
                fs[k].paths > 1 ? " and the other paths on it" : "",
                zn_format_size(fs[k].fr, y, sizeof y),
                zn_format_size(fs[k].want - fs[k].fr, z, sizeof z),
                !nstale ? "" : strict ? ", after removing what dead runs left there"
                                      : ", counting what dead runs left there",
                held);
    }
#undef PROBLEM
    /* pinning beyond RLIMIT_MEMLOCK is refused and the buffers stay pageable
     * (slower H2D/D2H, still correct): a warning, not an error. Root has
     * CAP_IPC_LOCK and is not limited. */
    if (topo->memlock_limit != UINT64_MAX && geteuid() != 0 &&
        b->bytes[ZN_TIER_CPU] > topo->memlock_limit)
        zn_warn("RLIMIT_MEMLOCK (%s) is below the cpu tier's budget (%s): pinned buffers "
                "beyond it stay pageable; raise it (ulimit -l unlimited, or memlock in "
                "/etc/security/limits.conf)", zn_format_size(topo->memlock_limit, x, sizeof x),
                zn_format_size(b->bytes[ZN_TIER_CPU], y, sizeof y));
    if (!n)
        return 0;
    if (strict)
        return zn_set_error(ZN_ECONFIG, "%s: %s", cfg->source, msg);
    zn_warn("%s: %s: this machine cannot run this plan as it is (planning for another one?)",
            cfg->source, msg);
    return 0;
}

/* The planner's input for a model and a config. `blocks` must hold
 * zn_model_num_parts(d) entries: the blocks as the trainer streams them,
 * the vocabulary in parts. */
void zn_run_plan_input(const zn_config *cfg, const zn_model_dims *d, int world,
                       uint64_t *blocks, zn_plan_input *in)
{
    int nb = zn_model_num_parts(d);
    for (int i = 0; i < nb; i++) {
        zn_model_part_info pt;
        blocks[i] = zn_model_part(d, i, &pt) ? 0 : pt.n;
    }
    memset(in, 0, sizeof *in);
    in->n_blocks = nb;
    in->block_params = blocks;
    in->trainable_params = zn_model_trainable_count(d);
    in->persistent_params =
        zn_run_persistent_params(d, (uint64_t)cfg->zero.stage3_param_persistence_threshold);
    in->tied_params = d->tie_embeddings ? (uint64_t)(d->vocab * d->hidden) : 0;
    in->n_layers = d->n_layers;
    in->hidden = d->hidden;
    in->n_heads = d->n_heads;
    in->n_kv_heads = d->n_kv_heads;
    in->head_dim = d->head_dim;
    in->intermediate = d->intermediate;
    in->vocab = d->vocab;
    in->micro_batch = cfg->train_micro_batch_size_per_gpu;
    in->seq_len = cfg->data.seq_len;
    in->param_bytes = (cfg->bf16 || cfg->fp16.enabled) ? 2 : 4;
    /* a 16-bit run is a GPU run (its kernels are CUDA's); an fp32 one where
     * the config names a CUDA device */
    in->cuda = in->param_bytes == 2 || !strncmp(cfg->train.device, "cuda", 4);
    in->world_size = world;
    in->activation_checkpointing = cfg->train.activation_checkpointing;
}

int zn_run_check_data(const zn_config *cfg, const zn_model_dims *d, int strict)
{
    if (!cfg->data.path[0] && cfg->model.path[0])
        return zn_set_error(ZN_ECONFIG, "%s: model.path is %s but data.path is not set: the "
                            "model would train on zinc's built-in synthetic tokens. Give the "
                            "token file `zinc prepare` made (--data FILE, or data.path), or "
                            "--data synthetic to train on synthetic data on purpose",
                            cfg->source, cfg->model.path);
    const char *files[2] = { ZN_DATA_SYNTHETIC(&cfg->data) ? "" : cfg->data.path,
                             cfg->data.eval_path };
    static const char *const keys[2] = { "data.path", "data.eval_path" };
    for (int i = 0; i < 2; i++) {
        if (!files[i][0])
            continue;
        zn_tokens *t = NULL;
        int rc = zn_tokens_open(&t, files[i]);
        if (rc && !strict) {
            zn_warn("%s: %s: %s: a run here would stop at this (planning for another "
                    "machine?)", cfg->source, keys[i], zn_last_error());
            continue;
        }
        if (rc)
            return zn_error_prefix(rc, "%s: %s", cfg->source, keys[i]);
        uint32_t v = zn_tokens_vocab(t);
        zn_tokens_close(t);
        if ((int64_t)v > d->vocab)
            return zn_set_error(ZN_ECONFIG, "%s: %s %s holds token ids of a %u-token vocabulary; "
                                "the model's has %lld (made with another tokenizer?)",
                                cfg->source, keys[i], files[i], v, (long long)d->vocab);
    }
    return 0;
}
