/*
 * config: a model's config.json (and generation_config.json) reduced to what the forward
 * pass needs. Both layouts found in the wild are read: `rope_theta` + `rope_scaling`
 * (older) and `rope_parameters` (newer, optionally one set per layer type as Gemma 3 has).
 */
#ifndef PAGODA_MODEL_CONFIG_H
#define PAGODA_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

struct arch;
struct cJSON;

enum rope_type {
    ROPE_DEFAULT,
    ROPE_LINEAR,
    ROPE_DYNAMIC,
    ROPE_YARN,
    ROPE_LLAMA3,
    ROPE_PROPORTIONAL
};

struct rope_params {
    enum rope_type type;
    double theta;
    double factor;
    int orig_max_pos;            /* original_max_position_embeddings */
    double low_freq_factor;      /* llama3 */
    double high_freq_factor;     /* llama3 */
    double beta_fast, beta_slow; /* yarn */
    double attention_factor;     /* yarn; 0 = derived from factor (and mscale) */
    double mscale, mscale_all_dim;
    bool truncate; /* yarn: round the correction range */
    /* proportional (Gemma 4): the share of a head's pairs that rotate; the rest keep a zero
     * frequency, and the exponents divide by the whole head size */
    double partial;
};

/* Attention over all earlier tokens, over a window of them, or linear attention with a
 * recurrent state (Gated DeltaNet). */
enum layer_kind { LAYER_FULL, LAYER_SLIDING, LAYER_LINEAR };
enum act_kind { ACT_SILU, ACT_GELU_TANH, ACT_RELU2 /* relu(x)^2 (BitNet) */ };

/* How a linear layer's weight is stored (see model/weights.h). */
enum quant_mode { QMODE_NONE, QMODE_AFFINE, QMODE_MXFP4, QMODE_MXFP8, QMODE_NVFP4 };

/* BitNet b1.58's linear layers (quantization_config.quant_method "bitnet"): ternary weights
 * against int8 activations. OFFLINE_DIV: packed values with a weight_scale the product divides
 * by (linear_class "bitlinear"); OFFLINE_MUL: one it multiplies by ("autobitlinear", offline);
 * ONLINE: float master weights made ternary when they load ("autobitlinear", online). */
enum bitnet_mode { BITNET_NONE, BITNET_OFFLINE_DIV, BITNET_OFFLINE_MUL, BITNET_ONLINE };

struct quant_spec {
    enum quant_mode mode;
    int bits;
    int group;
};

struct quant_override {
    char *prefix; /* module path, e.g. "model.layers.0.mlp.gate" */
    struct quant_spec spec;
};

#define CONFIG_MAX_EOS 8

/* Routed experts (Qwen3-MoE, Qwen3.5-MoE). */
struct moe_config {
    int n_experts;    /* num_experts / num_local_experts; 0 = dense */
    int top_k;        /* num_experts_per_tok */
    int inner;        /* moe_intermediate_size */
    int shared_inner; /* shared_expert_intermediate_size; 0 = no shared expert */
    bool norm_topk;   /* norm_topk_prob */
    bool beside_mlp;  /* Gemma 4: the experts run beside the dense MLP, with a scaled router */
};

/* Gated DeltaNet layers (linear_*). */
struct linear_config {
    int n_k_heads, n_v_heads; /* linear_num_key_heads, linear_num_value_heads */
    int k_dim, v_dim;         /* linear_key_head_dim, linear_value_head_dim */
    int conv_k;               /* linear_conv_kernel_dim */
};

struct model_config {
    char arch_name[64];
    const struct arch *arch; /* the family's descriptor (model/arch.h) */
    int hidden;              /* hidden_size */
    int n_layers;            /* num_hidden_layers */
    int n_heads;             /* num_attention_heads */
    int n_kv_heads;          /* num_key_value_heads */
    int head_dim;
    int ffn; /* intermediate_size */
    int vocab;
    int max_pos; /* max_position_embeddings: the context length */
    float rms_eps;
    enum act_kind act;
    struct rope_params rope_full;    /* full-attention layers (all layers when one set) */
    struct rope_params rope_sliding; /* sliding-window layers */
    int sliding_window;              /* 0 = none */
    enum layer_kind *layer_kinds;    /* n_layers */
    bool layer_types_given;          /* layer_types listed them (else the family's pattern) */
    bool tie_embeddings;
    bool tie_explicit; /* tie_word_embeddings was present in config.json */
    bool attn_bias;    /* q/k/v projections have biases (Qwen2, attention_bias) */
    bool o_bias;       /* o_proj has a bias (attention_bias on Llama) */
    bool mlp_bias;
    bool qk_norm;        /* per-head RMSNorm of q and k (Qwen3, Gemma 3) */
    bool norm_plus_one;  /* RMSNorm weights stored as w - 1: (1 + w) (Gemma, Qwen3.5) */
    float attn_softcap;  /* 0 = none */
    float final_softcap; /* 0 = none */
    float attn_scale;    /* multiplies q.k */
    float embed_scale;   /* multiplies the embedded rows (Gemma: sqrt(hidden)) */
    int rope_dim;        /* rotated values of a head (partial_rotary_factor * head_dim) */
    /* values of a head the rope tables cover on full-attention and on sliding layers: both
     * rope_dim unless the family sets them (Gemma 4: each kind's head size) */
    int rope_dims[2];
    /* Per layer (default: head_dim, num_key_value_heads, the layer itself). kv_source[l] != l:
     * the layer reads that earlier layer's K and V and stores none (num_kv_shared_layers). */
    int *layer_head_dim, *layer_kv_heads, *kv_source;
    int max_head_dim;     /* the largest of layer_head_dim */
    int max_kv_dim;       /* the largest layer_kv_heads * layer_head_dim */
    int ple_dim;          /* hidden_size_per_layer_input: per-layer inputs (Gemma 4), 0 = none */
    bool k_eq_v;          /* attention_k_eq_v: full-attention layers take V from the K projection */
    bool ffn_double_wide; /* use_double_wide_mlp: KV-shared layers' MLP is 2 * intermediate_size */
    bool layer_scale;     /* each layer's output is scaled by its layer_scalar (Gemma 4) */
    bool attn_gate;       /* q_proj also yields a sigmoid gate on the attention output */
    struct moe_config moe;
    bool *layer_moe; /* [n_layers] the layer's MLP is routed experts */
    struct linear_config lin;
    struct quant_spec quant; /* default for linear layers; mode NONE = unquantized */
    enum bitnet_mode bitnet; /* BitNet's linear layers (set by its family), else NONE */
    struct quant_override *quant_overrides;
    int n_quant_overrides;
    int32_t eos_ids[CONFIG_MAX_EOS];
    int n_eos;
    int32_t bos_id; /* -1 when none */
};

/** Reads DIR/config.json and, when present, DIR/generation_config.json. */
int config_load(struct model_config *c, const char *dir, struct err *e);
void config_dispose(struct model_config *c);

/** The quantization of the module at `prefix` (a tensor name without ".weight"). */
struct quant_spec config_quant_for(const struct model_config *c, const char *prefix);

const char *config_rope_type_name(enum rope_type t);

/* Field readers for the families' config hooks (model/arch.h). A missing or null field
 * gives the default; a present field of the wrong type is an error naming it. */
const struct cJSON *config_get(const struct cJSON *o, const char *k);
int config_get_int(const struct cJSON *o, const char *k, int def, int *out, struct err *e);
int config_get_num(const struct cJSON *o, const char *k, double def, double *out, struct err *e);
bool config_get_bool(const struct cJSON *o, const char *k, bool def);

#endif
