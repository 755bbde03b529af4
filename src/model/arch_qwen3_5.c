/*
 * Qwen3.5 / 3.6 (dense and MoE): a hybrid stack. Most layers are Gated DeltaNet linear
 * attention with a fixed-size recurrent state; every full_attention_interval-th layer is
 * full attention whose q_proj also yields a sigmoid gate on its output, with partial rotary
 * embeddings. Norms are (1 + w); the MoE variant's MLPs are routed experts plus a shared
 * expert scaled by sigmoid(shared_expert_gate).
 *
 *     x += linear_attn(norm(x))  or  x += o(attn(norm(x)) * sigmoid(gate))
 *     x += mlp(norm(x))          or  x += moe(norm(x)) + sigmoid(sg(norm(x))) * shared(norm(x))
 *
 * The ...ForConditionalGeneration checkpoints are read for their text tower (text_config,
 * language_model tensors).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>

#include "model/arch.h"
#include "model/blocks.h"

static int qwen3_5_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    struct linear_config *L = &c->lin;
    c->qk_norm = true;
    c->norm_plus_one = true;
    c->attn_gate = config_get_bool(root, "attn_output_gate", true);
    if (config_get_int(root, "linear_num_key_heads", 16, &L->n_k_heads, e) ||
        config_get_int(root, "linear_num_value_heads", 32, &L->n_v_heads, e) ||
        config_get_int(root, "linear_key_head_dim", 128, &L->k_dim, e) ||
        config_get_int(root, "linear_value_head_dim", 128, &L->v_dim, e) ||
        config_get_int(root, "linear_conv_kernel_dim", 4, &L->conv_k, e))
        return -1;
    if (L->n_k_heads < 1 || L->n_v_heads % L->n_k_heads || L->k_dim < 1 || L->v_dim < 1 ||
        L->conv_k < 1 || L->conv_k > 16)
        return err_set(e,
                       "config.json: linear attention shape %d key heads of %d, %d value heads "
                       "of %d, conv kernel %d is not supported (value heads a multiple of key "
                       "heads, kernel 1..16)",
                       L->n_k_heads, L->k_dim, L->n_v_heads, L->v_dim, L->conv_k);
    double prf = 1.0;
    const cJSON *rp = config_get(root, "rope_parameters");
    if (config_get_num(root, "partial_rotary_factor", 1.0, &prf, e) ||
        (cJSON_IsObject(rp) && config_get_num(rp, "partial_rotary_factor", prf, &prf, e)))
        return -1;
    c->rope_dim = (int)(c->head_dim * prf);
    if (c->rope_dim < 2 || c->rope_dim % 2 || c->rope_dim > c->head_dim)
        return err_set(e, "config.json: partial_rotary_factor %g gives %d rotated values of %d",
                       prf, c->rope_dim, c->head_dim);
    if (!c->layer_types_given) {
        int every = 4;
        if (config_get_int(root, "full_attention_interval", 4, &every, e)) return -1;
        for (int l = 0; l < c->n_layers; l++)
            c->layer_kinds[l] = every > 0 && (l + 1) % every == 0 ? LAYER_FULL : LAYER_LINEAR;
    }
    return arch_moe_config(c, root, true, e);
}

static int qwen3_5_load(struct model *m, struct err *e)
{
    const struct model_config *c = &m->cfg;
    char p[256];
    for (int l = 0; l < c->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
#define NAME(s) blk_name(m, p, sizeof p, l, s)
        if ((c->layer_kinds[l] == LAYER_LINEAR
                 ? blk_linear_load(m, NAME("linear_attn"), &L->lin, e)
                 : blk_attn_load(m, NAME("self_attn"), &L->attn, e)) ||
            (c->layer_moe[l] ? blk_moe_load(m, NAME("mlp"), l, &L->moe, e)
                             : blk_mlp_load(m, NAME("mlp"), c->ffn, &L->mlp, e)) ||
            blk_norm_load(m, NAME("input_layernorm.weight"), c->hidden, &L->attn_norm, e) ||
            blk_norm_load(m, NAME("post_attention_layernorm.weight"), c->hidden, &L->ffn_norm, e))
            return -1;
#undef NAME
    }
    return 0;
}

static void qwen3_5_layers(struct model *m, const struct fwd_batch *b)
{
    int n = b->n_tokens;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        blk_norm(m, m->h, m->x, L->attn_norm, n);
        if (m->cfg.layer_kinds[l] == LAYER_LINEAR)
            blk_linear(m, &L->lin, l, b);
        else
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
}

/* Both split over a tensor-parallel group (model/tp.h): the DeltaNet layers by key and value
 * heads, full attention by heads (each head's query and gate rows together), the MLP and
 * every expert by width (blk_moe_load), the router whole. */
const struct arch arch_qwen3_5 = {"Qwen3_5ForCausalLM", "qwen3_5",      qwen3_5_config,
                                  qwen3_5_load,         qwen3_5_layers, true};
const struct arch arch_qwen3_5_vl = {"Qwen3_5ForConditionalGeneration",
                                     "qwen3_5",
                                     qwen3_5_config,
                                     qwen3_5_load,
                                     qwen3_5_layers,
                                     true};
const struct arch arch_qwen3_5_moe = {
    "Qwen3_5MoeForCausalLM", "qwen3_5_moe", qwen3_5_config, qwen3_5_load, qwen3_5_layers, true};
const struct arch arch_qwen3_5_moe_vl = {"Qwen3_5MoeForConditionalGeneration",
                                         "qwen3_5_moe",
                                         qwen3_5_config,
                                         qwen3_5_load,
                                         qwen3_5_layers,
                                         true};
