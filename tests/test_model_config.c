/* HF config.json parsing and parameter counts: the published sizes of real
 * models (from their config.json files, weights not needed), defaults, the
 * llama3 rope_scaling block, and clear errors for bad or unsupported keys. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "zinc/model.h"
#include "zt.h"
#include "test_model_fixtures.h"

static void check_count(const char *file, uint64_t want)
{
    zn_model_dims d;
    int rc = zn_model_dims_from_hf(&d, zt_fixture(file));
    ZT_CHECK_MSG(rc == 0, "%s: rc %d: %s", file, rc, zn_last_error());
    if (rc)
        return;
    ZT_EQ_U64(zn_model_param_count(&d), want);
    uint64_t sum = 0;
    for (int b = 0; b < zn_model_num_blocks(&d); b++)
        sum += zn_model_block_param_count(&d, b);
    ZT_EQ_U64(sum, want);
    ZT_EQ_U64(zn_model_block_param_count(&d, -1), 0);
    ZT_EQ_U64(zn_model_block_param_count(&d, zn_model_num_blocks(&d)), 0);
}

/* A real config.json of a family zinc does not build yet: refused, naming
 * the model_type and what it needs (`what`, a piece of the message). */
static void check_refused(const char *file, const char *model_type, const char *what)
{
    zn_model_dims d;
    zn_clear_error();
    int rc = zn_model_dims_from_hf(&d, zt_fixture(file));
    ZT_CHECK_MSG(rc == ZN_EUNSUPPORTED, "%s: rc %d: %s", file, rc, zn_last_error());
    char want[96];
    snprintf(want, sizeof want, "model_type '%s' is not built yet: it needs", model_type);
    ZT_CONTAINS(zn_last_error(), want);
    ZT_CONTAINS(zn_last_error(), what);
}

static int parse(const char *text, zn_model_dims *d)
{
    zn_clear_error();
    return zn_model_dims_from_json(d, text, "cfg.json");
}

#define BASE_OTHER "\"model_type\":\"bert\",\"hidden_size\":64"
#define BASE "\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2," \
             "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320"

int main(void)
{
    zn_model_dims d;

    /* Published parameter counts. */
    check_count("configs/llama-2-7b.json", 6738415616ull);
    check_count("configs/llama-3-8b.json", 8030261248ull);
    check_count("configs/llama-3.1-8b.json", 8030261248ull);
    check_count("configs/qwen2.5-7b.json", 7615616512ull);
    check_count("configs/qwen2.5-14b.json", 14770033664ull);
    check_count("configs/qwen2.5-0.5b.json", 494032768ull); /* tied embeddings */

    /* The real config.json files of the models people fine-tune now
     * (fixtures/model-configs/README.md): the built families plan from
     * config.json alone with transformers' parameter count (the figures:
     * sum of numel over AutoModelForCausalLM.from_config on the meta device,
     * transformers 5.23, scripts/gen_param_counts.py); the others are
     * refused naming what they need. */
    check_count("model-configs/Llama-3.1-8B-Instruct.json", 8030261248ull);
    check_count("model-configs/Llama-3.2-3B.json", 3212749824ull);
    check_count("model-configs/Mistral-7B-Instruct-v0.3.json", 7248023552ull);
    check_count("model-configs/Qwen2.5-7B-Instruct.json", 7615616512ull);
    check_count("model-configs/Qwen2.5-14B.json", 14770033664ull);
    check_count("model-configs/Qwen3-8B.json", 8190735360ull);
    check_count("model-configs/Qwen3-14B.json", 14768307200ull);
    check_count("model-configs/Qwen3-30B-A3B.json", 30532122624ull);
    check_count("model-configs/gemma-2-9b-it.json", 9241705984ull);
    check_count("model-configs/phi-4.json", 14659507200ull);
    check_count("model-configs/Olmo-3.1-32B-Instruct.json", 32233522176ull);
    check_refused("model-configs/Qwen3.5-9B.json", "qwen3_5", "linear-attention");

    /* Mistral: the Llama block under its own name; v0.3's sliding_window
     * null is full attention, a window is kept and a longer sequence is
     * masked (tests/test_model_ref.c's tiny-mistral-window), attention_bias is not
     * read (MistralAttention has no biases), export writes the family. */
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("model-configs/Mistral-7B-Instruct-v0.3.json")),
              0);
    ZT_EQ_INT(d.arch, ZN_ARCH_MISTRAL);
    ZT_EQ_INT(d.sliding_window, 0);
    ZT_EQ_INT(d.qkv_bias, 0);
    ZT_EQ_INT(d.max_pos, 32768);
    ZT_EQ_INT(zn_model_check_window(&d, 1 << 20), 0);
    ZT_EQ_INT(parse("{\"model_type\":\"mistral\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
                    "\"sliding_window\":4096,\"attention_bias\":true}", &d), 0);
    ZT_EQ_INT(d.sliding_window, 4096);
    ZT_EQ_INT(d.qkv_bias + d.o_bias, 0);
    ZT_EQ_INT(d.max_pos, 131072);  /* MistralConfig's default */
    ZT_EQ_INT(zn_model_check_window(&d, 4096), 0);
    ZT_EQ_INT(zn_model_check_window(&d, 4097), 0); /* masked: tiny-mistral-window */
    ZT_CHECK(!strcmp(zn_model_arch_name(ZN_ARCH_MISTRAL), "mistral"));
    ZT_CHECK(!strcmp(zn_model_arch_class(ZN_ARCH_MISTRAL), "MistralForCausalLM"));
    /* a model_type nobody knows */
    ZT_EQ_INT(parse("{" BASE_OTHER "}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "model_type 'bert' is not a family zinc knows (it trains llama, "
                                 "qwen2, mistral, qwen3, qwen3_moe, mixtral, gemma, gemma2, "
                                 "gemma3_text, phi3, olmo2, olmo3)");

    /* Qwen3: head_dim 128 when config.json leaves it out (Qwen3-8B's does;
     * Qwen3Config's default, whatever hidden_size / heads is), the per-head
     * q/k norm, attention_bias on all four projections, export writes the
     * family and its head_dim back. */
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("model-configs/Qwen3-8B.json")), 0);
    ZT_EQ_INT(d.arch, ZN_ARCH_QWEN3);
    ZT_EQ_INT(d.head_dim, 128);
    ZT_EQ_INT(d.qk_norm, 1);
    ZT_EQ_INT(d.qkv_bias + d.o_bias, 0);
    ZT_EQ_INT(d.max_pos, 40960);
    ZT_EQ_INT(parse("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
                    "\"attention_bias\":true}", &d), 0);
    ZT_EQ_INT(d.head_dim, 128);
    ZT_EQ_INT(d.qkv_bias + d.o_bias, 2);
    ZT_EQ_INT(d.max_pos, 32768);
    ZT_EQ_INT(parse("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
                    "\"use_sliding_window\":true}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "use_sliding_window=true");
    ZT_CHECK(!strcmp(zn_model_arch_class(ZN_ARCH_QWEN3), "Qwen3ForCausalLM"));

    /* Qwen3-MoE: Qwen3's attention, 128 experts of 768, 8 a token,
     * renormalized, every layer sparse; the block lists the attention, the
     * router and each expert's three projections under the published names.
     * tiny-qwen3moe (transformers' count: 190,032) has layer 1 dense
     * (mlp_only_layers) with intermediate_size. */
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("model-configs/Qwen3-30B-A3B.json")), 0);
    ZT_EQ_INT(d.arch, ZN_ARCH_QWEN3_MOE);
    ZT_EQ_INT(d.n_experts, 128);
    ZT_EQ_INT(d.top_k, 8);
    ZT_EQ_INT(d.moe_intermediate, 768);
    ZT_EQ_INT(d.norm_topk, 1);
    ZT_EQ_INT(d.router_logits, 0);
    ZT_EQ_INT(d.qk_norm, 1);
    ZT_CHECK(zn_model_layer_moe(&d, 0) && zn_model_layer_moe(&d, 47));
    ZT_EQ_INT(zn_model_block_nparams(&d, 1), 8 + 1 + 3 * 128);
    {
        zn_param_info pi;
        ZT_EQ_INT(zn_model_block_param(&d, 48, 8, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.47.mlp.gate.weight"));
        ZT_EQ_INT(pi.shape[0], 128);
        ZT_EQ_INT(zn_model_block_param(&d, 48, 8 + 3 * 127 + 3, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.47.mlp.experts.127.down_proj.weight"));
        ZT_EQ_INT(pi.shape[0], 2048);
        ZT_EQ_INT(pi.shape[1], 768);
    }
    check_count("tiny-qwen3moe", 190032ull);
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("tiny-qwen3moe")), 0);
    ZT_CHECK(zn_model_layer_moe(&d, 0) && !zn_model_layer_moe(&d, 1) && zn_model_layer_moe(&d, 2));
    {
        zn_param_info pi;
        ZT_EQ_INT(zn_model_block_nparams(&d, 2), 8 + 3);
        ZT_EQ_INT(zn_model_block_param(&d, 2, 8, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.1.mlp.gate_proj.weight"));
        ZT_EQ_INT(pi.shape[0], 96);
        ZT_EQ_INT(zn_model_block_param(&d, 3, 9, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.2.mlp.experts.0.gate_proj.weight"));
        ZT_EQ_INT(pi.shape[0], 24);
    }
    /* LoRA on the experts is not built: refused by name; all-linear is the
     * attention when every layer is sparse (PEFT finds no nn.Linear in
     * transformers 5's experts), and refused with a dense layer's MLP */
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("model-configs/Qwen3-30B-A3B.json")), 0);
    d.lora.r = 8;
    d.lora.alpha = 16;
    d.lora.targets = ZN_LORA_Q | ZN_LORA_UP;
    ZT_EQ_INT(zn_model_dims_validate(&d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "experts' projections");
    d.lora.targets = ZN_LORA_ALL;
    zn_lora_fit_family(&d);
    ZT_EQ_INT(d.lora.targets, ZN_LORA_Q | ZN_LORA_K | ZN_LORA_V | ZN_LORA_O);
    ZT_EQ_INT(zn_model_dims_validate(&d), 0);
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("tiny-qwen3moe")), 0);
    d.lora.r = 8;
    d.lora.alpha = 16;
    d.lora.targets = ZN_LORA_ALL;
    zn_lora_fit_family(&d);
    ZT_EQ_INT(zn_model_dims_validate(&d), ZN_EUNSUPPORTED);
#define MOE "{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,\"num_hidden_layers\":4," \
            "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
    ZT_EQ_INT(parse(MOE "\"num_experts\":4,\"num_experts_per_tok\":2,"
                        "\"decoder_sparse_step\":2}", &d), 0);
    ZT_CHECK(!zn_model_layer_moe(&d, 0) && zn_model_layer_moe(&d, 1) &&
             !zn_model_layer_moe(&d, 2) && zn_model_layer_moe(&d, 3));
    ZT_EQ_INT(d.norm_topk, 0); /* Qwen3MoeConfig's default */
    ZT_EQ_INT(d.moe_intermediate, 768);
    ZT_EQ_INT(parse(MOE "\"num_experts\":4,\"num_experts_per_tok\":5}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "num_experts_per_tok 5");
    ZT_EQ_INT(parse(MOE "\"output_router_logits\":true,\"router_aux_loss_coef\":0.02}", &d),
              0);
    ZT_CHECK(d.router_logits == 1 && d.router_aux_coef == 0.02);
    ZT_EQ_INT(parse(MOE "\"output_router_logits\":true,\"router_aux_loss_coef\":-1}", &d),
              ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "router_aux_loss_coef -1 must be >= 0");
    ZT_EQ_INT(parse(MOE "\"num_experts\":4,\"num_local_experts\":8}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "disagree");
    ZT_EQ_INT(parse(MOE "\"mlp_only_layers\":[4]}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "mlp_only_layers[0]");
    ZT_EQ_INT(parse(MOE "\"mlp_only_layers\":[0, 3], \"num_experts\": 4, "
                        "\"num_experts_per_tok\": 1}", &d), 0);
    ZT_CHECK(!zn_model_layer_moe(&d, 0) && zn_model_layer_moe(&d, 1) &&
             !zn_model_layer_moe(&d, 3));
#undef MOE

    /* Mixtral: Mistral's attention, every layer sparse, the experts
     * intermediate_size wide, always renormalized; the published names
     * block_sparse_moe.gate and experts.E.w1 (gate), w3 (up), w2 (down).
     * tiny-mixtral: transformers' count 115,520. */
    check_count("tiny-mixtral", 115520ull);
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("tiny-mixtral")), 0);
    ZT_EQ_INT(d.arch, ZN_ARCH_MIXTRAL);
    ZT_CHECK(d.n_experts == 4 && d.top_k == 2 && d.moe_intermediate == 32 && d.norm_topk);
    ZT_CHECK(zn_model_layer_moe(&d, 0) && zn_model_layer_moe(&d, 1));
    ZT_EQ_INT(d.qk_norm + d.qkv_bias + d.o_bias, 0);
    {
        zn_param_info pi;
        ZT_EQ_INT(zn_model_block_param(&d, 1, 6, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.0.block_sparse_moe.gate.weight"));
        ZT_EQ_INT(zn_model_block_param(&d, 2, 7, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.1.block_sparse_moe.experts.0.w1.weight"));
        ZT_EQ_INT(zn_model_block_param(&d, 2, 8, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.1.block_sparse_moe.experts.0.w3.weight"));
        ZT_EQ_INT(zn_model_block_param(&d, 2, 9 + 3 * 3, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.1.block_sparse_moe.experts.3.w2.weight"));
        ZT_EQ_INT(pi.shape[0], 64);
        ZT_EQ_INT(pi.shape[1], 32);
    }
#define MIX "{\"model_type\":\"mixtral\",\"hidden_size\":64,\"num_hidden_layers\":2," \
            "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320"
    ZT_EQ_INT(parse(MIX "}", &d), 0);
    ZT_CHECK(d.n_experts == 8 && d.top_k == 2 && d.max_pos == 131072 && !d.sliding_window);
    ZT_EQ_INT(parse(MIX ",\"router_jitter_noise\":0.01}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "router_jitter_noise 0.01");
    ZT_EQ_INT(parse(MIX ",\"num_experts\":4,\"num_local_experts\":8}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "disagree");
    ZT_EQ_INT(parse(MIX ",\"sliding_window\":4096}", &d), 0);
    ZT_EQ_INT(d.sliding_window, 4096);
#undef MIX

    /* Gemma: GemmaConfig's head_dim 256 and tied embeddings by default; its
     * activation in hidden_activation where a config has both (older
     * Gemma folders say hidden_act "gelu" beside it), exact GELU refused */
    ZT_EQ_INT(parse("{\"model_type\":\"gemma\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
                    "\"hidden_act\":\"gelu\",\"hidden_activation\":\"gelu_pytorch_tanh\"}",
                    &d), 0);
    ZT_EQ_INT(d.arch, ZN_ARCH_GEMMA);
    ZT_EQ_INT(d.head_dim, 256);
    ZT_EQ_INT(d.tie_embeddings, 1);
    ZT_EQ_INT(d.gemma_norm + d.gelu_mlp + d.embed_scaled, 3);
    ZT_EQ_INT(parse("{\"model_type\":\"gemma\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
                    "\"hidden_act\":\"gelu\"}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "'gelu' is not supported (gemma computes 'gelu_pytorch_tanh')");

    /* Gemma 2: gemma's pieces, the four norms, query_pre_attn_scalar, the
     * two soft-caps and windows on every other layer from layer 0
     * (Gemma2Config's default layer_types); other patterns of layer_types
     * read as written, irregular ones, a null window, bidirectional
     * attention and attention dropout refused by name */
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("model-configs/gemma-2-9b-it.json")), 0);
    ZT_EQ_INT(d.arch, ZN_ARCH_GEMMA2);
    ZT_EQ_INT(d.post_norm, 2);
    ZT_EQ_INT(d.gemma_norm + d.gelu_mlp + d.embed_scaled + d.tie_embeddings, 4);
    ZT_CHECK(d.attn_scalar == 224 && d.attn_softcap == 50 && d.final_softcap == 30);
    ZT_EQ_INT(d.sliding_window, 4096);
    ZT_EQ_INT(d.head_dim, 256);
    ZT_EQ_INT(zn_model_layer_slides(&d, 0), 1);
    ZT_EQ_INT(zn_model_layer_slides(&d, 1), 0);
    ZT_EQ_INT(zn_model_layer_slides(&d, 40), 1);
    ZT_CHECK(!strcmp(zn_model_arch_class(ZN_ARCH_GEMMA2), "Gemma2ForCausalLM"));
#define G2 "\"model_type\":\"gemma2\",\"hidden_size\":64,\"num_hidden_layers\":4," \
           "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320"
    ZT_EQ_INT(parse("{" G2 ",\"attn_logit_softcapping\":null,\"layer_types\":[\"sliding_attention\","
                    "\"sliding_attention\",\"full_attention\",\"sliding_attention\"]}", &d), 0);
    ZT_CHECK(d.attn_softcap == 0 && d.final_softcap == 30 && d.attn_scalar == 256);
    ZT_EQ_INT(d.full_every, 3);
    ZT_EQ_INT(zn_model_layer_slides(&d, 2) + 2 * zn_model_layer_slides(&d, 3), 2);
    ZT_EQ_INT(parse("{" G2 ",\"layer_types\":[\"full_attention\",\"full_attention\","
                    "\"full_attention\",\"full_attention\"]}", &d), 0);
    ZT_EQ_INT(zn_model_layer_slides(&d, 0) + zn_model_layer_slides(&d, 3), 0);
    ZT_EQ_INT(parse("{" G2 ",\"layer_types\":[\"sliding_attention\",\"full_attention\","
                    "\"full_attention\",\"sliding_attention\"]}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "layer_types[2] is not \"sliding_attention\"");
    ZT_EQ_INT(parse("{" G2 ",\"layer_types\":[\"full_attention\"]}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "num_hidden_layers (4)");
    ZT_EQ_INT(parse("{" G2 ",\"sliding_window\":null}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "sliding_window null");
    ZT_EQ_INT(parse("{" G2 ",\"use_bidirectional_attention\":true}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "use_bidirectional_attention");
    ZT_EQ_INT(parse("{" G2 ",\"attention_dropout\":0.1}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "attention_dropout");
    ZT_EQ_INT(parse("{" G2 ",\"final_logit_softcapping\":-1}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "final_logit_softcapping");
    ZT_EQ_INT(parse("{" G2 ",\"query_pre_attn_scalar\":0}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "query_pre_attn_scalar");
#undef G2

    /* Gemma 3 (gemma3_text): Gemma 2's block with the per-head (1 + w) q/k
     * norm, no soft-caps unless set, one full layer every
     * sliding_window_pattern (6) when layer_types is absent, and two RoPE
     * bases: rope_local_base_freq unscaled on the sliding layers, rope_theta
     * with its scaling on the full ones. Gemma3TextConfig()'s defaults and a
     * config of gemma-3-12b-it's text shape (written here, the published
     * file is not vendored) count transformers 5.23's parameters. */
#define G3 "\"model_type\":\"gemma3_text\",\"hidden_size\":64,\"num_hidden_layers\":7," \
           "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320"
    ZT_EQ_INT(parse("{\"model_type\":\"gemma3_text\",\"hidden_size\":2304,\"num_hidden_layers\":26,"
                    "\"num_attention_heads\":8,\"num_key_value_heads\":4,"
                    "\"intermediate_size\":9216,\"vocab_size\":262208}", &d), 0);
    ZT_EQ_U64(zn_model_param_count(&d), 2628658432ull);
    ZT_EQ_INT(d.arch, ZN_ARCH_GEMMA3);
    ZT_EQ_INT(d.head_dim, 256);
    ZT_EQ_INT(d.max_pos, 131072);
    ZT_EQ_INT(d.qk_norm, 1);
    ZT_EQ_INT(d.post_norm, 2);
    ZT_EQ_INT(d.gemma_norm + d.gelu_mlp + d.embed_scaled + d.tie_embeddings, 4);
    ZT_CHECK(d.attn_scalar == 256 && d.attn_softcap == 0 && d.final_softcap == 0);
    ZT_EQ_INT(d.sliding_window, 4096);
    ZT_EQ_INT(d.full_every, 6);
    ZT_CHECK(d.rope_theta == 1e6 && d.rope_local_theta == 1e4);
    ZT_EQ_INT(d.rope_type, ZN_ROPE_DEFAULT);
    ZT_EQ_INT(zn_model_layer_slides(&d, 4) + 2 * zn_model_layer_slides(&d, 5), 1);
    ZT_CHECK(!strcmp(zn_model_arch_class(ZN_ARCH_GEMMA3), "Gemma3ForCausalLM"));
    ZT_EQ_INT(parse("{\"model_type\":\"gemma3_text\",\"hidden_size\":3840,\"num_hidden_layers\":48,"
                    "\"num_attention_heads\":16,\"num_key_value_heads\":8,"
                    "\"intermediate_size\":15360,\"vocab_size\":262208,\"sliding_window\":1024,"
                    "\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"linear\"}}", &d), 0);
    ZT_EQ_U64(zn_model_param_count(&d), 11766034176ull);
    ZT_EQ_INT(d.rope_type, ZN_ROPE_LINEAR);
    ZT_CHECK(d.rope_factor == 8);
    {
        /* the global layers' frequencies / 8 (transformers: 0.125,
         * 0.11221089214086533, ..., 1.3924673680776323e-07), the local
         * ones unscaled at 10000 */
        float inv[128];
        double fac;
        ZT_EQ_INT(zn_model_rope_table(&d, 5, inv, &fac), 0);
        ZT_CHECK(fac == 1.0);
        ZT_CHECK(inv[0] == 0.125f && fabs(inv[1] / 0.11221089214086533 - 1) < 1e-6 &&
                 fabs(inv[127] / 1.3924673680776323e-07 - 1) < 1e-6);
        ZT_EQ_INT(zn_model_rope_table(&d, 4, inv, &fac), 0);
        ZT_CHECK(inv[0] == 1.0f && fabs(inv[64] / 0.01 - 1) < 1e-6);
        ZT_EQ_INT(zn_model_rope_table(&d, 48, inv, &fac), ZN_EARG);
    }
    /* transformers 5's rope_parameters per layer type, and 4.x's keys */
    ZT_EQ_INT(parse("{" G3 ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"linear\","
                    "\"factor\":4.0,\"rope_theta\":5000.0},\"sliding_attention\":{\"rope_type\":"
                    "\"default\",\"rope_theta\":100.0}}}", &d), 0);
    ZT_CHECK(d.rope_theta == 5000 && d.rope_local_theta == 100 && d.rope_factor == 4);
    ZT_EQ_INT(parse("{" G3 ",\"rope_theta\":5000,\"rope_local_base_freq\":100,"
                    "\"sliding_window_pattern\":3,\"final_logit_softcapping\":30}", &d), 0);
    ZT_CHECK(d.rope_theta == 5000 && d.rope_local_theta == 100 && d.final_softcap == 30);
    ZT_EQ_INT(d.full_every, 3);
    ZT_EQ_INT(parse("{" G3 ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1.0}}",
                    &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "rope_parameters.rope_type");
    ZT_EQ_INT(parse("{" G3 ",\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"linear\","
                    "\"factor\":2.0}}}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "rope_parameters.sliding_attention.rope_type");
    ZT_EQ_INT(parse("{" G3 ",\"rope_theta\":5000,\"rope_parameters\":{}}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "keep rope_parameters alone");
    ZT_EQ_INT(parse("{" G3 ",\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2.0}}", &d),
              ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "'dynamic' is not supported");
    ZT_EQ_INT(parse("{" G3 ",\"sliding_window\":null}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "Gemma 3's sliding layers need a window");
    ZT_EQ_INT(parse("{" G3 ",\"use_bidirectional_attention\":true}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "use_bidirectional_attention");
    ZT_EQ_INT(parse("{" G3 ",\"layer_types\":[\"sliding_attention\",\"full_attention\","
                    "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\","
                    "\"full_attention\",\"sliding_attention\"]}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "layer_types[3] is not \"full_attention\"");
    /* the multimodal checkpoint stays refused, naming the vision tower */
    ZT_EQ_INT(parse("{\"model_type\":\"gemma3\",\"text_config\":{}}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "a vision tower");
    /* linear and yarn stay the layered families' */
    ZT_EQ_INT(parse("{" BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":2.0}}", &d),
              ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "zinc implements 'default' and 'llama3')");
#undef G3

    /* OLMo 3: OLMo 2's block, one full layer every 4 by default, the
     * window on the others, YaRN on the full ones only (OLMo 3.1: factor 8
     * over 8192 positions, attention_factor 1.2079..., transformers'
     * _compute_yarn_parameters: inv_freq[5] 0.3587302267551422, [20]
     * 0.01485569030046463, [63] 3.068925877869333e-07), the sliding ones
     * unscaled at rope_theta */
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("model-configs/Olmo-3.1-32B-Instruct.json")), 0);
    ZT_EQ_INT(d.arch, ZN_ARCH_OLMO3);
    ZT_EQ_INT(d.qk_norm, 2);
    ZT_EQ_INT(d.post_norm, 1);
    ZT_EQ_INT(d.full_every, 4);
    ZT_EQ_INT(d.sliding_window, 4096);
    ZT_EQ_INT(d.rope_type, ZN_ROPE_YARN);
    ZT_CHECK(d.rope_local_theta == 500000 && d.rope_theta == 500000);
    ZT_CHECK(d.rope_attn_factor == 1.2079441541679836 && d.rope_beta_fast == 32 &&
             d.rope_beta_slow == 1 && d.rope_factor == 8);
    ZT_EQ_INT(d.rope_orig_max_pos, 8192);
    ZT_CHECK(!strcmp(zn_model_arch_class(ZN_ARCH_OLMO3), "Olmo3ForCausalLM"));
    {
        float inv[64];
        double fac;
        ZT_EQ_INT(zn_model_rope_table(&d, 3, inv, &fac), 0);
        ZT_CHECK(fabs(fac - 1.2079441541679836 * 1.2079441541679836) < 1e-12);
        static const struct { int i; double v; } want[] = {
            { 0, 1.0 }, { 5, 0.3587302267551422 }, { 10, 0.12868738174438477 },
            { 15, 0.046164050698280334 }, { 20, 0.01485569030046463 },
            { 25, 0.003800320206210017 }, { 30, 0.000814839790109545 },
            { 40, 3.428102354519069e-05 }, { 63, 3.068925877869333e-07 },
        };
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
            ZT_CHECK_MSG(fabs(inv[want[k].i] / want[k].v - 1) < 1e-6, "yarn inv_freq[%d] %.9g, "
                         "transformers %.9g", want[k].i, inv[want[k].i], want[k].v);
        ZT_EQ_INT(zn_model_rope_table(&d, 2, inv, &fac), 0);
        ZT_CHECK(fac == 1.0 && fabs(inv[20] / pow(500000.0, -40.0 / 128) - 1) < 1e-6);
    }
#define O3 "\"model_type\":\"olmo3\",\"hidden_size\":64,\"num_hidden_layers\":4," \
           "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320"
    ZT_EQ_INT(parse("{" O3 ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
                    "\"original_max_position_embeddings\":512}}", &d), 0);
    ZT_CHECK(fabs(d.rope_attn_factor - (0.1 * log(4.0) + 1)) < 1e-15);
    ZT_CHECK(d.rope_theta == 500000 && d.rope_local_theta == 500000);
    ZT_EQ_INT(zn_model_layer_slides(&d, 2) + 2 * zn_model_layer_slides(&d, 3), 1);
    ZT_EQ_INT(parse("{" O3 ",\"rope_theta\":10000}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "ambiguous for olmo3");
    ZT_EQ_INT(parse("{" O3 ",\"rope_local_base_freq\":10000}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "rope_local_base_freq");
    ZT_EQ_INT(parse("{" O3 ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
                    "\"mscale\":1.0,\"mscale_all_dim\":1.0}}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "rope_scaling.mscale");
    ZT_EQ_INT(parse("{" O3 ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
                    "\"truncate\":false}}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "rope_scaling.truncate");
    ZT_EQ_INT(parse("{" O3 ",\"sliding_window\":null}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "OLMo 3's sliding layers need a window");
    ZT_EQ_INT(parse("{" O3 ",\"attention_dropout\":0.1}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "attention_dropout");
#undef O3

    /* phi3 (phi-4): q, k, v in one qkv_proj and gate, up in one
     * gate_up_proj, as zinc's own tensors; a rotary share below 1
     * (phi-4-mini's 0.75) and training dropouts are refused by name;
     * LoRA targets its own module names, "all-linear" becoming them */
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("model-configs/phi-4.json")), 0);
    ZT_EQ_INT(d.arch, ZN_ARCH_PHI3);
    ZT_EQ_INT(d.fused_proj, 1);
    ZT_EQ_INT(d.n_kv_heads, 10);
    {
        zn_param_info pi;
        ZT_EQ_INT(zn_model_block_nparams(&d, 1), 6);
        ZT_EQ_INT(zn_model_block_param(&d, 1, 4, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.0.self_attn.qkv_proj.weight"));
        ZT_EQ_INT(pi.shape[0], 5120 + 2 * 1280);
        ZT_EQ_INT(zn_model_block_param(&d, 1, 5, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.0.mlp.gate_up_proj.weight"));
        ZT_EQ_INT(pi.shape[0], 2 * 17920);
        zn_model_dims l = d;
        l.lora.r = 8;
        l.lora.alpha = 16;
        l.lora.targets = ZN_LORA_O | ZN_LORA_DOWN | ZN_LORA_QKV;
        ZT_EQ_INT(zn_model_dims_validate(&l), 0);
        l.lora.targets = ZN_LORA_Q | ZN_LORA_V;
        ZT_EQ_INT(zn_model_dims_validate(&l), ZN_ECONFIG);
        ZT_CONTAINS(zn_last_error(), "phi3 has no q_proj, k_proj, v_proj");
        l.lora.targets = ZN_LORA_ALL;
        zn_lora_fit_family(&l);
        ZT_EQ_INT(l.lora.targets, ZN_LORA_QKV | ZN_LORA_O | ZN_LORA_GATE_UP | ZN_LORA_DOWN);
        ZT_EQ_INT(zn_model_dims_validate(&l), 0);
        ZT_EQ_U64(zn_model_block_param_count(&l, 1) - zn_model_block_param_count(&d, 1),
                  8ull * (5120 + 7680 + 5120 + 5120 + 5120 + 35840 + 17920 + 5120));
        ZT_EQ_INT(zn_model_block_param(&l, 1, 10, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.0.self_attn.qkv_proj.lora_A.weight"));
        ZT_EQ_INT(zn_model_block_param(&l, 1, 13, &pi), 0);
        ZT_CHECK(!strcmp(pi.name, "model.layers.0.mlp.gate_up_proj.lora_B.weight"));
        ZT_EQ_INT(pi.shape[0], 2 * 17920);
        /* and a llama has no fused projection to adapt */
        zn_model_dims q;
        ZT_EQ_INT(zn_model_dims_from_hf(&q, zt_fixture("model-configs/Llama-3.2-3B.json")), 0);
        q.lora = l.lora;
        ZT_EQ_INT(zn_model_dims_validate(&q), ZN_ECONFIG);
        ZT_CONTAINS(zn_last_error(), "llama has no qkv_proj or gate_up_proj");
        q.lora.targets = ZN_LORA_ALL;
        zn_lora_fit_family(&q);
        ZT_EQ_INT(q.lora.targets, ZN_LORA_ALL);
    }
    ZT_EQ_INT(parse("{\"model_type\":\"phi3\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
                    "\"partial_rotary_factor\":0.75}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "partial_rotary_factor 0.75 is not supported");
    ZT_EQ_INT(parse("{\"model_type\":\"phi3\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
                    "\"resid_pdrop\":0.1}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "resid_pdrop 0.1 is not supported");
    ZT_EQ_INT(parse("{\"model_type\":\"phi3\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
                    "\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1],"
                    "\"long_factor\":[1]}}", &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "'longrope' is not supported");

    /* Fields of a real config. */
    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("configs/qwen2.5-7b.json")), 0);
    ZT_EQ_INT(d.arch, ZN_ARCH_QWEN2);
    ZT_EQ_INT(d.hidden, 3584);
    ZT_EQ_INT(d.n_layers, 28);
    ZT_EQ_INT(d.n_heads, 28);
    ZT_EQ_INT(d.n_kv_heads, 4);
    ZT_EQ_INT(d.head_dim, 128);
    ZT_EQ_INT(d.intermediate, 18944);
    ZT_EQ_INT(d.vocab, 152064);
    ZT_EQ_INT(d.max_pos, 131072);
    ZT_CHECK(d.rope_theta == 1000000.0);
    ZT_CHECK(d.rms_eps == 1e-6);
    ZT_EQ_INT(d.qkv_bias, 1);
    ZT_EQ_INT(d.o_bias, 0);
    ZT_EQ_INT(d.tie_embeddings, 0);
    ZT_EQ_INT(d.rope_type, ZN_ROPE_DEFAULT);
    ZT_EQ_INT(zn_model_num_blocks(&d), 30);

    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("configs/llama-3.1-8b.json")), 0);
    ZT_EQ_INT(d.rope_type, ZN_ROPE_LLAMA3);
    ZT_CHECK(d.rope_factor == 8.0);
    ZT_CHECK(d.rope_low_freq_factor == 1.0);
    ZT_CHECK(d.rope_high_freq_factor == 4.0);
    ZT_EQ_INT(d.rope_orig_max_pos, 8192);
    ZT_CHECK(d.rope_theta == 500000.0);
    ZT_EQ_INT(d.qkv_bias, 0);

    ZT_EQ_INT(zn_model_dims_from_hf(&d, zt_fixture("configs/llama-2-7b.json")), 0);
    ZT_CHECK(d.rope_theta == 10000.0); /* absent: LlamaConfig's default */
    ZT_CHECK(d.rms_eps == 1e-5);

    /* Defaults for optional keys. */
    ZT_EQ_INT(parse("{" BASE "}", &d), 0);
    ZT_EQ_INT(d.n_kv_heads, 4);
    ZT_EQ_INT(d.head_dim, 16);
    ZT_EQ_INT(d.max_pos, 2048);
    ZT_CHECK(d.rms_eps == 1e-6);
    ZT_EQ_INT(parse("{" BASE ",\"attention_bias\":true,\"num_key_value_heads\":null}", &d), 0);
    ZT_EQ_INT(d.qkv_bias, 1);
    ZT_EQ_INT(d.o_bias, 1);
    ZT_EQ_INT(d.n_kv_heads, 4);
    /* Bias parameters are counted: 2 x (64 q + 64 k + 64 v + 64 o) on top. */
    zn_model_dims nb;
    ZT_EQ_INT(parse("{" BASE "}", &nb), 0);
    ZT_EQ_U64(zn_model_param_count(&d) - zn_model_param_count(&nb), 2 * 4 * 64);

    /* transformers 5 spelling: rope_parameters carries theta and type. */
    ZT_EQ_INT(parse("{" BASE ",\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":"
                    "\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                    "\"original_max_position_embeddings\":32},\"layer_types\":"
                    "[\"full_attention\",\"full_attention\"]}", &d), 0);
    ZT_CHECK(d.rope_theta == 500000.0);
    ZT_EQ_INT(d.rope_type, ZN_ROPE_LLAMA3);
    ZT_EQ_INT(d.rope_orig_max_pos, 32);
    ZT_EQ_INT(parse("{" BASE ",\"rope_parameters\":{\"rope_theta\":1000000.0,\"rope_type\":"
                    "\"default\"}}", &d), 0);
    ZT_CHECK(d.rope_theta == 1000000.0);
    ZT_EQ_INT(d.rope_type, ZN_ROPE_DEFAULT);
    ZT_EQ_INT(parse("{" BASE ",\"rope_theta\":10.0,\"rope_parameters\":{\"rope_theta\":20.0}}",
                    &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "disagree");
    ZT_EQ_INT(parse("{" BASE ",\"layer_types\":[\"full_attention\",\"sliding_attention\"]}", &d),
              ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "layer_types[1]");

    /* Errors name the file and the key. */
    ZT_EQ_INT(parse("{\"model_type\":\"llama\"}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "cfg.json");
    ZT_CONTAINS(zn_last_error(), "hidden_size");
    ZT_EQ_INT(parse("{" BASE ",\"num_key_value_heads\":3}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "num_key_value_heads");
    ZT_EQ_INT(parse("{" BASE ",\"rope_theta\":\"big\"}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "rope_theta");
    ZT_EQ_INT(parse("{" BASE ",\"tie_word_embeddings\":1}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "tie_word_embeddings");
    ZT_EQ_INT(parse("{\"model_type\":\"llama\",\"hidden_size\":-64}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "hidden_size");
    ZT_EQ_INT(parse("{\"model_type\":\"llama\",\"hidden_size\":64.5}", &d), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "hidden_size");
    ZT_EQ_INT(parse("{" BASE ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}", &d),
              ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "rope_scaling.low_freq_factor");
    ZT_EQ_INT(parse("{" BASE ",\"hidden_size\":64}", &d), ZN_ECONFIG); /* duplicate key */
    ZT_CONTAINS(zn_last_error(), "cfg.json");
    ZT_EQ_INT(parse("{" BASE, &d), ZN_ECONFIG);
    ZT_EQ_INT(parse("[1]", &d), ZN_ECONFIG);

    /* Valid but unsupported: refused, never ignored. */
    const char *unsupported[] = {
        "{" BASE ",\"model_type\":\"gpt2\"}",
        "{" BASE ",\"hidden_act\":\"gelu\"}",
        "{" BASE ",\"mlp_bias\":true}",
        "{" BASE ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}",
    };
    ZT_EQ_INT(parse("{\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                    "\"intermediate_size\":128,\"vocab_size\":320,\"model_type\":\"gpt2\"}",
                    &d), ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "gpt2");
    for (size_t i = 1; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        int rc = parse(unsupported[i], &d);
        ZT_CHECK_MSG(rc == ZN_EUNSUPPORTED, "case %zu: rc %d (%s)", i, rc, zn_last_error());
    }
    ZT_EQ_INT(parse("{\"model_type\":\"qwen2\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":320,"
                    "\"use_sliding_window\":true}", &d), ZN_EUNSUPPORTED);

    /* A missing file is an OS error naming the path. */
    ZT_EQ_INT(zn_model_dims_from_hf(&d, "/nonexistent/zinc/config.json"), -ENOENT);
    ZT_CONTAINS(zn_last_error(), "/nonexistent/zinc/config.json");

    /* Round trip through write_hf. */
    zn_model_dims a, b;
    ZT_EQ_INT(zn_model_dims_from_hf(&a, zt_fixture("configs/llama-3.1-8b.json")), 0);
    char tmpl[] = "/tmp/zn_cfgXXXXXX";
    ZT_CHECK(mkdtemp(tmpl) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", tmpl);
    ZT_EQ_INT(zn_model_dims_write_hf(&a, path), 0);
    ZT_EQ_INT(zn_model_dims_from_hf(&b, tmpl), 0);
    ZT_CHECK(memcmp(&a, &b, sizeof a) == 0);
    ZT_EQ_INT(zn_model_dims_from_hf(&a, zt_fixture("configs/qwen2.5-0.5b.json")), 0);
    ZT_EQ_INT(zn_model_dims_write_hf(&a, path), 0);
    ZT_EQ_INT(zn_model_dims_from_hf(&b, path), 0);
    ZT_CHECK(memcmp(&a, &b, sizeof a) == 0);
    ZT_EQ_INT(zn_model_dims_from_json(&a, "{\"model_type\":\"mistral\",\"hidden_size\":64,"
                                      "\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                                      "\"intermediate_size\":128,\"vocab_size\":320,"
                                      "\"sliding_window\":64}", "m.json"), 0);
    ZT_EQ_INT(zn_model_dims_write_hf(&a, path), 0);
    ZT_EQ_INT(zn_model_dims_from_hf(&b, path), 0);
    ZT_CHECK(memcmp(&a, &b, sizeof a) == 0);
    FILE *mf = fopen(path, "r");
    char mtext[4096] = "";
    ZT_CHECK(mf != NULL);
    if (mf) {
        size_t got = fread(mtext, 1, sizeof mtext - 1, mf);
        mtext[got] = '\0';
        fclose(mf);
    }
    ZT_CONTAINS(mtext, "\"MistralForCausalLM\"");
    ZT_CONTAINS(mtext, "\"model_type\": \"mistral\"");
    ZT_CONTAINS(mtext, "\"sliding_window\": 64");
    /* qwen3_moe: the experts' keys and the dense layers come back */
    ZT_EQ_INT(zn_model_dims_from_hf(&a, zt_fixture("tiny-qwen3moe")), 0);
    ZT_EQ_INT(zn_model_dims_write_hf(&a, path), 0);
    ZT_EQ_INT(zn_model_dims_from_hf(&b, path), 0);
    ZT_CHECK(memcmp(&a, &b, sizeof a) == 0);
    ZT_EQ_INT(zn_model_dims_from_hf(&a, zt_fixture("tiny-mixtral")), 0);
    ZT_EQ_INT(zn_model_dims_write_hf(&a, path), 0);
    ZT_EQ_INT(zn_model_dims_from_hf(&b, path), 0);
    ZT_CHECK(memcmp(&a, &b, sizeof a) == 0);
    /* gemma2: the scalar, the caps and the layer pattern come back;
     * gemma3_text and olmo3 their RoPE per layer type too */
    static const char *const windowed[] = { "model-configs/gemma-2-9b-it.json",
                                            "tiny-gemma3", "tiny-olmo3",
                                            "model-configs/Olmo-3.1-32B-Instruct.json" };
    for (size_t i = 0; i < sizeof windowed / sizeof windowed[0]; i++) {
        ZT_EQ_INT(zn_model_dims_from_hf(&a, zt_fixture(windowed[i])), 0);
        ZT_EQ_INT(zn_model_dims_write_hf(&a, path), 0);
        ZT_EQ_INT(zn_model_dims_from_hf(&b, path), 0);
        ZT_CHECK_MSG(memcmp(&a, &b, sizeof a) == 0, "%s: config.json round trip", windowed[i]);
    }
    unlink(path);
    rmdir(tmpl);

    zn_model_dims_default(&d);
    ZT_EQ_INT(zn_model_dims_validate(&d), 0);
    d.n_kv_heads = 3;
    ZT_EQ_INT(zn_model_dims_validate(&d), ZN_ECONFIG);
    return zt_done();
}
