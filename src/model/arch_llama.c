/*
 * The Llama family: Llama, Mistral, Qwen2 and Qwen3 share one pre-norm layer stack.
 *
 *     x += o(attn(norm(x)));  x += down(act(gate) * up)(norm(x))
 *
 * They differ in config only: Mistral's sliding window on every layer, Qwen2's q/k/v biases,
 * Qwen3's per-head q/k norms, Qwen's max_window_layers.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "model/blocks.h"

static int llama_load(struct model *m, struct err *e)
{
    const struct model_config *c = &m->cfg;
    char p[256];
    for (int l = 0; l < c->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
#define NAME(s) blk_name(m, p, sizeof p, l, s)
        if (blk_attn_load(m, NAME("self_attn"), &L->attn, e) ||
            blk_mlp_load(m, NAME("mlp"), c->ffn, &L->mlp, e) ||
            blk_norm_load(m, NAME("input_layernorm.weight"), c->hidden, &L->attn_norm, e) ||
            blk_norm_load(m, NAME("post_attention_layernorm.weight"), c->hidden, &L->ffn_norm, e))
            return -1;
#undef NAME
    }
    return 0;
}

static void llama_layers(struct model *m, const struct fwd_batch *b)
{
    int n = b->n_tokens;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        blk_capture(m, l, n);
        blk_norm(m, m->h, m->x, L->attn_norm, n);
        blk_attn(m, &L->attn, l, b);
        blk_reduce(m, n);
        blk_add(m, n);
        blk_norm(m, m->h, m->x, L->ffn_norm, n);
        blk_mlp(m, &L->mlp, n);
        blk_reduce(m, n);
        blk_add(m, n);
    }
    blk_capture(m, m->cfg.n_layers, n);
}

static int mistral_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    (void)root, (void)e;
    if (!c->layer_types_given)
        for (int i = 0; i < c->n_layers; i++) c->layer_kinds[i] = LAYER_SLIDING;
    return 0;
}

/* Qwen: a window only with use_sliding_window, and then on layers from max_window_layers. */
static int qwen_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    (void)e;
    int use = config_get_bool(root, "use_sliding_window", false);
    if (!c->layer_types_given) {
        int mwl = c->n_layers;
        config_get_int(root, "max_window_layers", c->n_layers, &mwl, NULL);
        for (int i = 0; i < c->n_layers; i++)
            c->layer_kinds[i] = use && i >= mwl ? LAYER_SLIDING : LAYER_FULL;
    }
    return 0;
}

static int qwen2_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    if (!config_get_bool(root, "use_sliding_window", false)) c->sliding_window = 0;
    c->attn_bias = true; /* q/k/v always have biases; o never */
    c->o_bias = false;
    return qwen_config(c, root, e);
}

static int qwen3_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    c->qk_norm = true;
    return qwen_config(c, root, e);
}

const struct arch arch_llama = {"LlamaForCausalLM", "llama", NULL, llama_load, llama_layers, true};
const struct arch arch_mistral = {"MistralForCausalLM", "mistral",    mistral_config,
                                  llama_load,           llama_layers, true};
const struct arch arch_qwen2 = {"Qwen2ForCausalLM", "qwen2",      qwen2_config,
                                llama_load,         llama_layers, true};
const struct arch arch_qwen3 = {"Qwen3ForCausalLM", "qwen3",      qwen3_config,
                                llama_load,         llama_layers, true};
