/* The decoder against PyTorch on the host backend: tiny Llama (bf16 file,
 * llama3 RoPE, untied) and tiny Qwen2 (sharded fp32 file, q/k/v bias, tied
 * embeddings, ignored targets). fp32: loss and logits within 1e-5, every
 * gradient norm within 1e-4 of the float64 reference; the same with
 * activation checkpointing off gives bit-identical gradients; bf16 storage
 * (the CUDA precision recipe, emulated) within 2e-2, with the GEMM
 * attention (the default at these lengths) and with the fused one; the
 * fused attention in fp32 within the fp32 tolerances. */
#include "test_model_ref.h"

/* Which attention a config gets, and what each costs in the workspace. */
static void attention_choice(zn_dev *dev)
{
    zn_model_dims d;
    if (zn_model_dims_from_hf(&d, zt_fixture("tiny-llama")))
        ZT_SETUP_FAIL("tiny-llama: %s", zn_last_error());
    zn_model_config c = zn_model_config_default(NULL);
    c.max_seq = 256;
    c.attn_block = 64;
    c.dtype = ZN_DTYPE_F32;
    ZT_CHECK(!zn_model_attention_fused(&d, &c));
    /* bf16: AUTO is the GEMM attention up to ZN_ATTN_AUTO_FUSED_SEQ tokens
     * (the faster one on the first GPU), the fused one beyond */
    c.dtype = ZN_DTYPE_BF16;
    ZT_CHECK(!zn_model_attention_fused(&d, &c));
    c.max_seq = ZN_ATTN_AUTO_FUSED_SEQ;
    ZT_CHECK(!zn_model_attention_fused(&d, &c));
    c.max_seq = ZN_ATTN_AUTO_FUSED_SEQ + 1;
    ZT_CHECK(zn_model_attention_fused(&d, &c));
    c.max_seq = 256;
    c.attention = ZN_ATTN_FUSED;
    ZT_CHECK(zn_model_attention_fused(&d, &c));
    uint64_t fused = zn_model_workspace_bytes(&d, &c);
    c.attention = ZN_ATTN_GEMM;
    ZT_CHECK(!zn_model_attention_fused(&d, &c));
    uint64_t gemm = zn_model_workspace_bytes(&d, &c);
    /* the GEMM attention holds heads x attn_block x seq x (4 + 2 + 2) B of
     * scores (and GQA's fp32 dK/dV sums); the fused one 2 x tokens x heads
     * fp32 statistics */
    uint64_t scores = (uint64_t)(d.n_heads * 64 * 256) * 8;
    ZT_CHECK_MSG(fused > 0 && gemm > fused + scores - 2 * 256 * d.n_heads * 4 - 4096,
                 "workspace fused %llu, gemm %llu, scores %llu", (unsigned long long)fused,
                 (unsigned long long)gemm, (unsigned long long)scores);
    c.attention = ZN_ATTN_FUSED;
    c.dtype = ZN_DTYPE_F32;
    ZT_CHECK(zn_model_attention_fused(&d, &c));
    c.attention = 7;
    ZT_CHECK(zn_model_workspace_bytes(&d, &c) == 0);
    /* head_dim beyond the kernels: AUTO falls back at any length, FUSED is
     * refused */
    zn_model_dims wide = d;
    wide.head_dim = 2 * ZN_FLASH_MAX_HEAD_DIM;
    c.attention = ZN_ATTN_AUTO;
    c.dtype = ZN_DTYPE_BF16;
    c.max_seq = ZN_ATTN_AUTO_FUSED_SEQ + 1;
    ZT_CHECK(!zn_model_attention_fused(&wide, &c));
    c.max_seq = 256;
    c.attention = ZN_ATTN_FUSED;
    zn_model *m = NULL;
    int rc = zn_model_create(&m, dev, &wide, &c);
    ZT_CHECK_MSG(rc == ZN_ECONFIG && strstr(zn_last_error(), "head_dim"),
                 "fused attention, head_dim %lld: rc %d (%s)", (long long)wide.head_dim, rc,
                 zn_last_error());
    zn_model_destroy(m);
}

int main(void)
{
    zn_dev_config dc = zn_dev_config_default();
    dc.name = "host";
    dc.gpu_budget = 256u << 20;
    zn_dev *dev;
    if (zn_dev_create(&dev, &dc))
        ZT_SETUP_FAIL("host device: %s", zn_last_error());

    /* tiny-mistral: the Llama block under its own model_type, made by
     * transformers' MistralForCausalLM; tiny-qwen3: the per-head q/k norm,
     * heads x head_dim wider than hidden; tiny-phi3: q, k, v and gate, up
     * as row blocks of the fused tensors; tiny-olmo2: post-norms and the
     * full-width q/k norm; tiny-mistral-window: a 5-key sliding window over
     * 16-token sequences; tiny-gemma2: four norms a layer, the scores and
     * the logits soft-capped, query_pre_attn_scalar, the window on layers
     * 0 and 2 of 4; tiny-gemma3: the per-head (1 + w) q/k norm, the
     * window and rope_local_base_freq on layers 0, 1 and 3, linear-scaled
     * rope_theta on layer 2; tiny-olmo3: olmo2's block, the window on
     * layers 0-2, YaRN (its attention factor too) on layer 3; tiny-qwen3moe:
     * 8 experts, 2 a token, renormalized, the middle of 3 layers dense
     * (mlp_only_layers) */
    const char *fixtures[] = { "tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-qwen3",
                               "tiny-phi3", "tiny-olmo2", "tiny-mistral-window",
                               "tiny-gemma", "tiny-gemma2", "tiny-gemma3", "tiny-olmo3",
                               "tiny-qwen3moe", "tiny-mixtral" };
    for (int f = 0; f < (int)(sizeof fixtures / sizeof fixtures[0]); f++) {
        ref_result r1, r2, r3;
        float *g1 = NULL, *g2 = NULL;
        size_t n1 = 0, n2 = 0;
        ref_run(dev, fixtures[f], ZN_DTYPE_F32, 1, 1.0, &r1, &g1, &n1);
        ref_run(dev, fixtures[f], ZN_DTYPE_F32, 0, 1.0, &r2, &g2, &n2);
        ZT_CHECK(r1.loss_value == r2.loss_value);
        ZT_CHECK_MSG(n1 == n2 && g1 && g2 && !memcmp(g1, g2, n1 * 4),
                     "%s: gradients with and without checkpointing differ", fixtures[f]);
        ref_run(dev, fixtures[f], ZN_DTYPE_BF16, 1, 1.0, &r3, NULL, NULL);
        /* attention in query blocks of 3 rows (the causal mask skipping
         * the keys after each block): the same loss, logits and gradients
         * within the fp32 tolerance of the float64 reference */
        ref_attn_block = 3;
        ref_result r4;
        float *g4 = NULL;
        size_t n4 = 0;
        ref_run(dev, fixtures[f], ZN_DTYPE_F32, 1, 1.0, &r4, &g4, &n4);
        ref_run(dev, fixtures[f], ZN_DTYPE_BF16, 0, 1.0, &r3, NULL, NULL);
        ref_attn_block = 0;
        /* the fused attention (the C reference of the CUDA kernels) in fp32:
         * the same tolerances, and checkpointing on or off bit-identical
         * (the saved log-sum-exp against the recomputed one) */
        ref_attention = ZN_ATTN_FUSED;
        float *g5 = NULL, *g6 = NULL;
        size_t n5 = 0, n6 = 0;
        ref_run(dev, fixtures[f], ZN_DTYPE_F32, 1, 1.0, &r4, &g5, &n5);
        ref_run(dev, fixtures[f], ZN_DTYPE_F32, 0, 1.0, &r4, &g6, &n6);
        ZT_CHECK_MSG(n5 == n6 && g5 && g6 && !memcmp(g5, g6, n5 * 4),
                     "%s: fused attention: gradients with and without checkpointing differ",
                     fixtures[f]);
        /* bf16 above ran the GEMM attention (the default at these
         * lengths): the fused one in bf16 too */
        ref_attention = ZN_ATTN_FUSED;
        ref_run(dev, fixtures[f], ZN_DTYPE_BF16, 1, 1.0, &r3, NULL, NULL);
        ref_attention = ZN_ATTN_AUTO;
        free(g5);
        free(g6);
        free(g1);
        free(g2);
        free(g4);
    }
    attention_choice(dev);
    zn_dev_destroy(dev);
    return zt_done();
}
