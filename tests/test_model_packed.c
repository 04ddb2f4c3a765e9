/* Packed documents on the host backend: a sequence that packs several
 * documents (block-diagonal causal attention, RoPE restarting at each)
 * gives each document's logits, the loss and the gradients of running them
 * one at a time (tests/test_model_packed.h); fp32 within 1e-5, with and
 * without activation checkpointing, on tiny Llama (GQA, llama3 RoPE) and
 * tiny Qwen2 (q/k/v bias, tied), and bf16 storage within 2e-2; with the
 * fused attention and the GEMM one. And a
 * vocabulary in row parts computes what whole blocks do (parts_run). */
#include "test_model_packed.h"

int main(void)
{
    zn_dev_config dc = zn_dev_config_default();
    dc.name = "host";
    dc.gpu_budget = 256u << 20;
    zn_dev *dev;
    if (zn_dev_create(&dev, &dc))
        ZT_SETUP_FAIL("host device: %s", zn_last_error());
    const char *fixtures[] = { "tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-qwen3",
                               "tiny-phi3", "tiny-olmo2", "tiny-mistral-window",
                               "tiny-gemma", "tiny-gemma2", "tiny-gemma3", "tiny-olmo3",
                               "tiny-qwen3moe", "tiny-mixtral" };
    const int nf = (int)(sizeof fixtures / sizeof fixtures[0]);
    for (int f = 0; f < nf; f++) {
        packed_run(dev, fixtures[f], ZN_DTYPE_F32, 1, 1e-5);
        packed_run(dev, fixtures[f], ZN_DTYPE_F32, 0, 1e-5);
        packed_run(dev, fixtures[f], ZN_DTYPE_BF16, 1, 2e-2);
    }
    /* attention in query blocks of 5 rows, starting inside documents */
    pk_attn_block = 5;
    for (int f = 0; f < nf; f++) {
        packed_run(dev, fixtures[f], ZN_DTYPE_F32, 1, 1e-5);
        packed_run(dev, fixtures[f], ZN_DTYPE_BF16, 0, 2e-2);
    }
    pk_attn_block = 0;
    /* the fused attention's key starts in fp32 and in bf16 (bf16 above ran
     * the GEMM attention, the default at these lengths) */
    for (int f = 0; f < nf; f++) {
        pk_attention = ZN_ATTN_FUSED;
        packed_run(dev, fixtures[f], ZN_DTYPE_F32, 1, 1e-5);
        packed_run(dev, fixtures[f], ZN_DTYPE_F32, 0, 1e-5);
        packed_run(dev, fixtures[f], ZN_DTYPE_BF16, 1, 2e-2);
        pk_attention = ZN_ATTN_AUTO;
    }
    parts_run(dev, ZN_DTYPE_F32, 1e-6);
    parts_run(dev, ZN_DTYPE_BF16, 1e-6);
    zn_dev_destroy(dev);
    return zt_done();
}
