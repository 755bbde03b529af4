/*
 * The Gemma family (Gemma 2 and 3): the Llama stack with sandwich norms around both blocks,
 * (1 + w) norm weights, a sqrt(hidden) embedding scale and query_pre_attn_scalar.
 *
 *     x += post_norm(o(attn(norm(x))));  x += post_norm(mlp(pre_norm(x)))
 *
 * Gemma 2 alternates sliding and full layers and soft-caps attention and final logits;
 * Gemma 3 has q/k norms, a full layer every sliding_window_pattern layers and per-layer-type
 * rope parameters.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>

#include "model/arch.h"
#include "model/blocks.h"

static int gemma_load(struct model *m, struct err *e)
{
    const struct model_config *c = &m->cfg;
    int H = c->hidden;
    char p[256];
    for (int l = 0; l < c->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
#define NAME(s) blk_name(m, p, sizeof p, l, s)
        if (blk_attn_load(m, NAME("self_attn"), &L->attn, e) ||
            blk_mlp_load(m, NAME("mlp"), c->ffn, &L->mlp, e) ||
            blk_norm_load(m, NAME("input_layernorm.weight"), H, &L->attn_norm, e) ||
            blk_norm_load(m, NAME("post_attention_layernorm.weight"), H, &L->post_attn_norm, e) ||
            blk_norm_load(m, NAME("pre_feedforward_layernorm.weight"), H, &L->ffn_norm, e) ||
            blk_norm_load(m, NAME("post_feedforward_layernorm.weight"), H, &L->post_ffn_norm, e))
            return -1;
#undef NAME
    }
    return 0;
}

static void gemma_layers(struct model *m, const struct fwd_batch *b)
{
    int n = b->n_tokens;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        blk_norm(m, m->h, m->x, L->attn_norm, n);
        blk_attn(m, &L->attn, l, b);
        blk_reduce(m, n); /* a split's partial sums, whole before the post-norm */
        blk_norm(m, m->h, m->h, L->post_attn_norm, n);
        blk_add(m, n);
        blk_norm(m, m->h, m->x, L->ffn_norm, n);
        blk_mlp(m, &L->mlp, n);
        blk_reduce(m, n);
        blk_norm(m, m->h, m->h, L->post_ffn_norm, n);
        blk_add(m, n);
    }
}

static int gemma_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    c->norm_plus_one = true;
    c->embed_scale = sqrtf((float)c->hidden);
    double qpas = c->head_dim;
    if (config_get_num(root, "query_pre_attn_scalar", c->head_dim, &qpas, e)) return -1;
    c->attn_scale = (float)(1.0 / sqrt(qpas));
    return 0;
}

static int gemma2_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    if (!c->layer_types_given)
        for (int i = 0; i < c->n_layers; i++)
            c->layer_kinds[i] = i % 2 == 0 ? LAYER_SLIDING : LAYER_FULL;
    return gemma_config(c, root, e);
}

static int gemma3_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    c->qk_norm = true;
    if (!c->layer_types_given) {
        int pattern = 0;
        config_get_int(root, "sliding_window_pattern", 0, &pattern, NULL);
        if (!pattern) config_get_int(root, "_sliding_window_pattern", 0, &pattern, NULL);
        if (!pattern) pattern = 6;
        for (int i = 0; i < c->n_layers; i++)
            c->layer_kinds[i] = (i + 1) % pattern ? LAYER_SLIDING : LAYER_FULL;
    }
    return gemma_config(c, root, e);
}

const struct arch arch_gemma2 = {"Gemma2ForCausalLM", "gemma2",     gemma2_config,
                                 gemma_load,          gemma_layers, true};
const struct arch arch_gemma3 = {"Gemma3ForCausalLM", "gemma3",     gemma3_config,
                                 gemma_load,          gemma_layers, true};
