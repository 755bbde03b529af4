/* The shared blocks of the families' layer stacks (see blocks.h). */
#include "model/blocks.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"

const char *blk_name(const struct model *m, char *buf, size_t n, int layer, const char *suffix)
{
    snprintf(buf, n, "%slayers.%d.%s", m->prefix, layer, suffix);
    return buf;
}

int blk_norm_load(struct model *m, const char *name, int dim, float **out, struct err *e)
{
    return model_load_vec(m, name, dim, m->cfg.norm_plus_one ? 1.0f : 0.0f, 1, out, e);
}

int blk_attn_load(struct model *m, const char *prefix, struct attn_block *a, struct err *e)
{
    const struct model_config *c = &m->cfg;
    int H = c->hidden, D = c->head_dim;
    int qdim = c->n_heads * D, kvdim = c->n_kv_heads * D; /* the rank's share */
    int last = m->tp_rank == 0;                           /* o's bias: added once */
    char n[300];
#define NAME(s) (snprintf(n, sizeof n, "%s.%s", prefix, s), n)
    if (model_load_linear_split(m, NAME("q_proj"), c->attn_gate ? 2 * qdim : qdim, H, SPLIT_ROWS,
                                &a->wq, e) ||
        model_load_linear_split(m, NAME("k_proj"), kvdim, H, SPLIT_KV, &a->wk, e) ||
        model_load_linear_split(m, NAME("v_proj"), kvdim, H, SPLIT_KV, &a->wv, e) ||
        model_load_linear_split(m, NAME("o_proj"), H, qdim, SPLIT_COLS, &a->wo, e))
        return -1;
    if (c->qk_norm && (blk_norm_load(m, NAME("q_norm.weight"), D, &a->q_norm, e) ||
                       blk_norm_load(m, NAME("k_norm.weight"), D, &a->k_norm, e)))
        return -1;
    if (model_load_vec_part(m, NAME("q_proj.bias"), qdim, 0, c->attn_bias, SPLIT_ROWS, &a->bq, e) ||
        model_load_vec_part(m, NAME("k_proj.bias"), kvdim, 0, c->attn_bias, SPLIT_KV, &a->bk, e) ||
        model_load_vec_part(m, NAME("v_proj.bias"), kvdim, 0, c->attn_bias, SPLIT_KV, &a->bv, e) ||
        (last && model_load_vec(m, NAME("o_proj.bias"), H, 0, c->o_bias, &a->bo, e)))
        return -1;
#undef NAME
    return 0;
}

int blk_mlp_load(struct model *m, const char *prefix, int ffn, struct mlp_block *p, struct err *e)
{
    const struct model_config *c = &m->cfg;
    int H = c->hidden;
    char n[300];
#define NAME(s) (snprintf(n, sizeof n, "%s.%s", prefix, s), n)
    if (model_load_linear_split(m, NAME("gate_proj"), ffn, H, SPLIT_ROWS, &p->gate, e) ||
        model_load_linear_split(m, NAME("up_proj"), ffn, H, SPLIT_ROWS, &p->up, e) ||
        model_load_linear_split(m, NAME("down_proj"), H, ffn, SPLIT_COLS, &p->down, e))
        return -1;
    if (model_load_vec_part(m, NAME("gate_proj.bias"), ffn, 0, c->mlp_bias, SPLIT_ROWS, &p->b_gate,
                            e) ||
        model_load_vec_part(m, NAME("up_proj.bias"), ffn, 0, c->mlp_bias, SPLIT_ROWS, &p->b_up,
                            e) ||
        (m->tp_rank == 0 &&
         model_load_vec(m, NAME("down_proj.bias"), H, 0, c->mlp_bias, &p->b_down, e)))
        return -1;
#undef NAME
    return 0;
}

void blk_norm(struct model *m, float *out, const float *x, const float *w, int rows)
{
    m->be->ops->rms_norm(m->be->ctx, out, x, w, rows, m->cfg.hidden, m->cfg.rms_eps);
}

void blk_add(struct model *m, int rows)
{
    m->be->ops->add(m->be->ctx, m->x, m->h, (int64_t)rows * m->cfg.hidden);
}

void blk_reduce(struct model *m, int rows)
{
    if (m->tp_size > 1) m->be->ops->all_reduce(m->be->ctx, m->h, (int64_t)rows * m->cfg.hidden);
}

void blk_capture(struct model *m, int layer, int rows)
{
    for (int i = 0; i < m->n_aux; i++)
        if (m->aux_layer[i] == layer)
            m->be->ops->copy(m->be->ctx, m->aux + (size_t)i * m->max_tokens * (size_t)m->cfg.hidden,
                             m->x, sizeof(float) * (size_t)rows * (size_t)m->cfg.hidden);
}

void blk_attn(struct model *m, const struct attn_block *a, int layer, const struct fwd_batch *b)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int n = b->n_tokens, D = c->head_dim;
    int qdim = c->n_heads * D, kvdim = c->n_kv_heads * D;
    int sliding = c->layer_kinds[layer] == LAYER_SLIDING;
    int rt = sliding && !m->rope_shared ? 1 : 0;

    if (c->attn_gate) {
        o->matmul(ctx, m->qg, m->h, &a->wq, n);
        o->split_qgate(ctx, m->q, m->qgate, m->qg, n, c->n_heads, D);
    } else {
        o->matmul(ctx, m->q, m->h, &a->wq, n);
    }
    o->matmul(ctx, m->k, m->h, &a->wk, n);
    o->matmul(ctx, m->v, m->h, &a->wv, n);
    if (a->bq) {
        o->add_bias(ctx, m->q, a->bq, n, qdim);
        o->add_bias(ctx, m->k, a->bk, n, kvdim);
        o->add_bias(ctx, m->v, a->bv, n, kvdim);
    }
    if (a->q_norm) {
        o->rms_norm(ctx, m->q, m->q, a->q_norm, n * c->n_heads, D, c->rms_eps);
        o->rms_norm(ctx, m->k, m->k, a->k_norm, n * c->n_kv_heads, D, c->rms_eps);
    }
    if (c->rope_dim < D) {
        int R = c->rope_dim;
        o->rope_partial(ctx, m->q, n, c->n_heads, D, R, m->rope_cos[rt], m->rope_sin[rt]);
        o->rope_partial(ctx, m->k, n, c->n_kv_heads, D, R, m->rope_cos[rt], m->rope_sin[rt]);
    } else {
        o->rope(ctx, m->q, n, c->n_heads, D, m->rope_cos[rt], m->rope_sin[rt]);
        o->rope(ctx, m->k, n, c->n_kv_heads, D, m->rope_cos[rt], m->rope_sin[rt]);
    }
    o->kv_store(ctx, &m->kv[layer], &m->kvg[layer], m->k, m->v, b);
    struct attn_params ap = {
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = D,
        .scale = c->attn_scale,
        .softcap = c->attn_softcap,
        .window = sliding ? c->sliding_window : 0,
    };
    o->attention(ctx, m->att, m->q, &m->kv[layer], &m->kvg[layer], b, &ap);
    if (c->attn_gate) o->gate_mul(ctx, m->att, m->qgate, n, qdim, qdim);
    if (a->o_norm) o->rms_norm(ctx, m->att, m->att, a->o_norm, n, qdim, c->rms_eps);
    o->matmul(ctx, m->h, m->att, &a->wo, n);
    if (a->bo) o->add_bias(ctx, m->h, a->bo, n, c->hidden);
}

void blk_mlp(struct model *m, const struct mlp_block *p, int rows)
{
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int F = (int)p->gate.n;
    o->matmul(ctx, m->gate, m->h, &p->gate, rows);
    o->matmul(ctx, m->up, m->h, &p->up, rows);
    if (p->b_gate) {
        o->add_bias(ctx, m->gate, p->b_gate, rows, F);
        o->add_bias(ctx, m->up, p->b_up, rows, F);
    }
    o->act_mul(ctx, m->gate, m->gate, m->up, (int64_t)rows * F, m->cfg.act);
    if (p->down_norm) o->rms_norm(ctx, m->gate, m->gate, p->down_norm, rows, F, m->cfg.rms_eps);
    o->matmul(ctx, m->h, m->gate, &p->down, rows);
    if (p->b_down) o->add_bias(ctx, m->h, p->b_down, rows, m->cfg.hidden);
}

int blk_linear_load(struct model *m, const char *prefix, struct linear_block *lb, struct err *e)
{
    const struct linear_config *L = &m->cfg.lin; /* the rank's share of the heads */
    int H = m->cfg.hidden, vdim = L->n_v_heads * L->v_dim;
    /* in_proj_qkv's rows (and the convolution's channels) are q, k and v one after another:
     * a rank takes its key heads of q and of k and its value heads of v */
    const int64_t qkv[3] = {(int64_t)L->n_k_heads * L->k_dim, (int64_t)L->n_k_heads * L->k_dim,
                            vdim};
    char n[300];
#define NAME(s) (snprintf(n, sizeof n, "%s.%s", prefix, s), n)
    if (model_load_linear_stacked(m, NAME("in_proj_qkv"), 3, qkv, H, &lb->in_qkv, e) ||
        model_load_linear_split(m, NAME("in_proj_z"), vdim, H, SPLIT_ROWS, &lb->in_z, e) ||
        model_load_linear_split(m, NAME("in_proj_b"), L->n_v_heads, H, SPLIT_ROWS, &lb->in_b, e) ||
        model_load_linear_split(m, NAME("in_proj_a"), L->n_v_heads, H, SPLIT_ROWS, &lb->in_a, e) ||
        model_load_linear_split(m, NAME("out_proj"), H, vdim, SPLIT_COLS, &lb->out, e) ||
        model_load_rows_stacked(m, NAME("conv1d.weight"), 3, qkv, L->conv_k, &lb->conv_w, e) ||
        model_load_vec_part(m, NAME("A_log"), L->n_v_heads, 0, 1, SPLIT_ROWS, &lb->a_log, e) ||
        model_load_vec_part(m, NAME("dt_bias"), L->n_v_heads, 0, 1, SPLIT_ROWS, &lb->dt_bias, e) ||
        model_load_vec(m, NAME("norm.weight"), L->v_dim, 0, 1, &lb->norm, e))
        return -1;
#undef NAME
    return 0;
}

int blk_moe_load(struct model *m, const char *prefix, int layer, struct moe_block *mb,
                 struct err *e)
{
    const struct moe_config *mc = &m->cfg.moe;
    int H = m->cfg.hidden, E = mc->n_experts, I = mc->inner;
    char n[300];
    if (!m->experts)
        m->experts = xcalloc((size_t)m->cfg.n_layers * 3 * (size_t)E, sizeof *m->experts);
    mb->gate = m->experts + (size_t)layer * 3 * E;
    mb->up = mb->gate + E;
    mb->down = mb->up + E;
    snprintf(n, sizeof n, "%s.gate", prefix);
    if (model_load_linear(m, n, E, H, &mb->router, e)) return -1;
    snprintf(n, sizeof n, "%s.switch_mlp.gate_proj.weight", prefix);
    int stacked = st_find(&m->st, n) != NULL;
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    struct qweight *dst[3] = {mb->gate, mb->up, mb->down};
    for (int p = 0; p < 3; p++) {
        /* in a group every expert's share of the width: gate/up by rows, down by columns */
        int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
        enum tp_split split = p == 2 ? SPLIT_COLS : SPLIT_ROWS;
        for (int x = 0; x < E; x++) {
            int rc;
            if (stacked) {
                snprintf(n, sizeof n, "%s.switch_mlp.%s", prefix, proj[p]);
                rc = model_load_expert_split(m, n, x, rows, cols, split, &dst[p][x], e);
            } else {
                snprintf(n, sizeof n, "%s.experts.%d.%s", prefix, x, proj[p]);
                rc = model_load_linear_split(m, n, rows, cols, split, &dst[p][x], e);
            }
            if (rc) return -1;
        }
    }
    if (!mc->shared_inner) return 0;
    snprintf(n, sizeof n, "%s.shared_expert", prefix);
    if (blk_mlp_load(m, n, mc->shared_inner, &mb->shared, e)) return -1;
    snprintf(n, sizeof n, "%s.shared_expert_gate", prefix);
    return model_load_linear(m, n, 1, H, &mb->shared_gate, e);
}

void blk_linear(struct model *m, const struct linear_block *lb, int layer,
                const struct fwd_batch *b)
{
    const struct model_config *c = &m->cfg;
    const struct linear_config *L = &c->lin;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int n = b->n_tokens;
    o->matmul(ctx, m->lin_qkv, m->h, &lb->in_qkv, n);
    o->matmul(ctx, m->lin_z, m->h, &lb->in_z, n);
    o->matmul(ctx, m->lin_b, m->h, &lb->in_b, n);
    o->matmul(ctx, m->lin_a, m->h, &lb->in_a, n);
    struct delta_params dp = {
        .n_k_heads = L->n_k_heads,
        .n_v_heads = L->n_v_heads,
        .k_dim = L->k_dim,
        .v_dim = L->v_dim,
        .conv_k = L->conv_k,
        .conv_w = lb->conv_w,
        .a_log = lb->a_log,
        .dt_bias = lb->dt_bias,
    };
    o->delta_net(ctx, m->lin_out, m->lin_qkv, m->lin_b, m->lin_a, &m->state[layer], &dp, b);
    o->rms_norm_gated(ctx, m->lin_out, m->lin_out, m->lin_z, lb->norm, n * L->n_v_heads, L->v_dim,
                      c->rms_eps);
    o->matmul(ctx, m->h, m->lin_out, &lb->out, n);
}

struct moe_params blk_moe_params(const struct model *m, const struct moe_block *mb)
{
    const struct model_config *c = &m->cfg;
    return (struct moe_params){.n_experts = c->moe.n_experts,
                               .top_k = c->moe.top_k,
                               .norm_topk = c->moe.norm_topk,
                               .act = c->act,
                               .gate = mb->gate,
                               .up = mb->up,
                               .down = mb->down,
                               .expert_scale = mb->expert_scale};
}

void blk_moe(struct model *m, const struct moe_block *mb, int rows)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    struct moe_params mp = blk_moe_params(m, mb);
    o->matmul(ctx, m->router, m->h, &mb->router, rows);
    o->moe(ctx, m->moe_out, m->h, m->router, &mp, rows, c->hidden);
    if (c->moe.shared_inner) {
        /* h = sigmoid(shared_gate(h)) * shared(h) + routed */
        o->matmul(ctx, m->shared_g, m->h, &mb->shared_gate, rows);
        blk_mlp(m, &mb->shared, rows);
        o->gate_mul(ctx, m->h, m->shared_g, rows, c->hidden, 1);
        o->add(ctx, m->h, m->moe_out, (int64_t)rows * c->hidden);
    } else {
        o->copy(ctx, m->h, m->moe_out, sizeof(float) * (size_t)rows * c->hidden);
    }
}
