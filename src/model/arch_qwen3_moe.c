/*
 * Qwen3-MoE: the Qwen3 layer (q/k norms, pre-norm) with routed experts in place of the MLP
 * on the sparse layers.
 *
 *     x += o(attn(norm(x)));  x += moe(norm(x))  (or the dense MLP on mlp_only_layers)
 *
 * The router is a softmax over num_experts, the top num_experts_per_tok kept (renormalized
 * when norm_topk_prob); layer l is sparse when (l + 1) % decoder_sparse_step == 0 and l is not
 * in mlp_only_layers.
 *
 * Split over a tensor-parallel group as vLLM does: the attention by heads, the router whole on
 * every rank (each picks the same experts), every expert's width shared out (blk_moe_load),
 * and the partial sums of o and of the experts added up after each (blk_reduce).
 */
#include <cjson/cJSON.h>
#include <stdio.h>

#include "model/arch.h"
#include "model/blocks.h"

/* The experts' fields, shared with Qwen3.5-MoE. */
int arch_moe_config(struct model_config *c, const struct cJSON *root, bool norm_default,
                    struct err *e)
{
    struct moe_config *mc = &c->moe;
    int step = 1;
    if (config_get_int(root, "num_experts", 0, &mc->n_experts, e) ||
        (!mc->n_experts && config_get_int(root, "num_local_experts", 0, &mc->n_experts, e)) ||
        config_get_int(root, "num_experts_per_tok", 0, &mc->top_k, e) ||
        config_get_int(root, "moe_intermediate_size", 0, &mc->inner, e) ||
        config_get_int(root, "shared_expert_intermediate_size", 0, &mc->shared_inner, e) ||
        config_get_int(root, "decoder_sparse_step", 1, &step, e))
        return -1;
    mc->norm_topk = config_get_bool(root, "norm_topk_prob", norm_default);
    if (!mc->n_experts) return 0;
    if (mc->top_k < 1 || mc->top_k > mc->n_experts || mc->inner < 1 || step < 1)
        return err_set(e,
                       "config.json: num_experts_per_tok (%d) must be in 1..num_experts (%d), "
                       "moe_intermediate_size and decoder_sparse_step positive",
                       mc->top_k, mc->n_experts);
    for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = (l + 1) % step == 0;
    const cJSON *only = config_get(root, "mlp_only_layers");
    if (cJSON_IsArray(only))
        for (const cJSON *it = only->child; it; it = it->next)
            if (cJSON_IsNumber(it) && it->valueint >= 0 && it->valueint < c->n_layers)
                c->layer_moe[it->valueint] = false;
    return 0;
}

static int qwen3_moe_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    c->qk_norm = true;
    if (!c->layer_types_given) {
        int use = config_get_bool(root, "use_sliding_window", false), mwl = c->n_layers;
        config_get_int(root, "max_window_layers", c->n_layers, &mwl, NULL);
        for (int i = 0; i < c->n_layers; i++)
            c->layer_kinds[i] = use && i >= mwl ? LAYER_SLIDING : LAYER_FULL;
    }
    return arch_moe_config(c, root, false, e);
}

static int qwen3_moe_load(struct model *m, struct err *e)
{
    const struct model_config *c = &m->cfg;
    char p[256];
    for (int l = 0; l < c->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
#define NAME(s) blk_name(m, p, sizeof p, l, s)
        if (blk_attn_load(m, NAME("self_attn"), &L->attn, e) ||
            (c->layer_moe[l] ? blk_moe_load(m, NAME("mlp"), l, &L->moe, e)
                             : blk_mlp_load(m, NAME("mlp"), c->ffn, &L->mlp, e)) ||
            blk_norm_load(m, NAME("input_layernorm.weight"), c->hidden, &L->attn_norm, e) ||
            blk_norm_load(m, NAME("post_attention_layernorm.weight"), c->hidden, &L->ffn_norm, e))
            return -1;
#undef NAME
    }
    return 0;
}

static void qwen3_moe_layers(struct model *m, const struct fwd_batch *b)
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
        if (m->cfg.layer_moe[l])
            blk_moe(m, &L->moe, n);
        else
            blk_mlp(m, &L->mlp, n);
        blk_reduce(m, n);
        blk_add(m, n);
    }
    blk_capture(m, m->cfg.n_layers, n);
}

const struct arch arch_qwen3_moe = {"Qwen3MoeForCausalLM", "qwen3_moe",      qwen3_moe_config,
                                    qwen3_moe_load,        qwen3_moe_layers, true};
