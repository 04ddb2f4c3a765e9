/* The decoder against PyTorch on CUDA: the same fixtures as test_model_ref,
 * in bf16 (fp32 accumulation; the GEMM attention, the default at these
 * lengths, and the fused one) within 2e-2 and in fp32 within 1e-4 (cuBLAS
 * may reorder sums); packed documents against one at a time
 * (test_model_packed.h). Skips (77) without a GPU. */
#include "test_model_ref.h"
#include "test_model_packed.h"

/* fp32 on the GPU: the host's bounds widened this much (cuBLAS's order,
 * atomics) until a GPU run measures the spread (issue 37); bf16 takes
 * the host's bf16 bounds as they are. */
#define GPU_SLACK 10.0

int main(void)
{
    zn_dev_config dc = zn_dev_config_default();
    dc.name = "cuda";
    dc.gpu_budget = 1u << 30;
    zn_dev *dev;
    int rc = zn_dev_create(&dev, &dc);
    if (rc == ZN_ENODEV)
        ZT_SKIP("no CUDA device: %s", zn_last_error());
    if (rc)
        ZT_SETUP_FAIL("cuda device: %s", zn_last_error());
    const char *fixtures[] = { "tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-qwen3",
                               "tiny-phi3", "tiny-olmo2", "tiny-mistral-window",
                               "tiny-gemma", "tiny-gemma2", "tiny-gemma3", "tiny-olmo3",
                               "tiny-qwen3moe", "tiny-mixtral" };
    for (int f = 0; f < (int)(sizeof fixtures / sizeof fixtures[0]); f++) {
        ref_result r;
        ref_run(dev, fixtures[f], ZN_DTYPE_BF16, 1, 1.0, &r, NULL, NULL);
        ref_run(dev, fixtures[f], ZN_DTYPE_BF16, 0, 1.0, &r, NULL, NULL);
        ref_run(dev, fixtures[f], ZN_DTYPE_F32, 1, GPU_SLACK, &r, NULL, NULL);
        /* packed documents == one at a time, through the CUDA kernels */
        packed_run(dev, fixtures[f], ZN_DTYPE_F32, 1, 1e-4);
        packed_run(dev, fixtures[f], ZN_DTYPE_BF16, 0, 2e-2);
        /* attention in query blocks (causal skipping, offsets into the
         * softmax and key_start, dK/dV summed over blocks) */
        ref_attn_block = 3;
        ref_run(dev, fixtures[f], ZN_DTYPE_F32, 1, GPU_SLACK, &r, NULL, NULL);
        ref_run(dev, fixtures[f], ZN_DTYPE_BF16, 0, 1.0, &r, NULL, NULL);
        ref_attn_block = 0;
        pk_attn_block = 5;
        packed_run(dev, fixtures[f], ZN_DTYPE_F32, 1, 1e-4);
        pk_attn_block = 0;
        /* bf16 above ran the GEMM attention (the default at these
         * lengths); the fused kernels too, and the fused one refusing f32
         * by name */
        ref_attention = ZN_ATTN_FUSED;
        ref_run(dev, fixtures[f], ZN_DTYPE_BF16, 1, 1.0, &r, NULL, NULL);
        ref_run(dev, fixtures[f], ZN_DTYPE_BF16, 0, 1.0, &r, NULL, NULL);
        pk_attention = ZN_ATTN_FUSED;
        packed_run(dev, fixtures[f], ZN_DTYPE_BF16, 0, 2e-2);
        pk_attention = ZN_ATTN_AUTO;
        ref_attention = ZN_ATTN_AUTO;
    }
    {
        zn_model_dims d;
        if (zn_model_dims_from_hf(&d, zt_fixture("tiny-llama")))
            ZT_SETUP_FAIL("tiny-llama: %s", zn_last_error());
        zn_model_config mc = zn_model_config_default(dev);
        mc.dtype = ZN_DTYPE_F32;
        mc.attention = ZN_ATTN_FUSED;
        zn_model *m = NULL;
        int crc = zn_model_create(&m, dev, &d, &mc);
        ZT_CHECK_MSG(crc == ZN_ECONFIG && strstr(zn_last_error(), "bf16"),
                     "fused f32 attention on CUDA: rc %d (%s)", crc, zn_last_error());
        zn_model_destroy(m);
    }
    /* the vocabulary in row parts == whole blocks (the embedding's rows
     * kernels, the head's running log-sum-exp across calls) */
    parts_run(dev, ZN_DTYPE_F32, 1e-4);
    parts_run(dev, ZN_DTYPE_BF16, 2e-2);
    zn_dev_destroy(dev);
    return zt_done();
}
