/* The shared blocks of the families' layer stacks (see blocks.h). */
#include "model/blocks.h"

#include <stdio.h>

int blk_norm_load(struct model *m, const char *name, int dim, float **out, struct err *e)
{
    return model_load_vec(m, name, dim, m->cfg.gemma_norms ? 1.0f : 0.0f, 1, out, e);
}

int blk_attn_load(struct model *m, const char *prefix, struct attn_block *a, struct err *e)
{
    const struct model_config *c = &m->cfg;
    int H = c->hidden, D = c->head_dim;
    int qdim = c->n_heads * D, kvdim = c->n_kv_heads * D;
    char n[300];
#define NAME(s) (snprintf(n, sizeof n, "%s.%s", prefix, s), n)
    if (model_load_linear(m, NAME("q_proj"), qdim, H, &a->wq, e) ||
        model_load_linear(m, NAME("k_proj"), kvdim, H, &a->wk, e) ||
        model_load_linear(m, NAME("v_proj"), kvdim, H, &a->wv, e) ||
        model_load_linear(m, NAME("o_proj"), H, qdim, &a->wo, e))
        return -1;
    if (c->qk_norm && (blk_norm_load(m, NAME("q_norm.weight"), D, &a->q_norm, e) ||
                       blk_norm_load(m, NAME("k_norm.weight"), D, &a->k_norm, e)))
        return -1;
    if (model_load_vec(m, NAME("q_proj.bias"), qdim, 0, c->attn_bias, &a->bq, e) ||
        model_load_vec(m, NAME("k_proj.bias"), kvdim, 0, c->attn_bias, &a->bk, e) ||
        model_load_vec(m, NAME("v_proj.bias"), kvdim, 0, c->attn_bias, &a->bv, e) ||
        model_load_vec(m, NAME("o_proj.bias"), H, 0, c->o_bias, &a->bo, e))
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
    if (model_load_linear(m, NAME("gate_proj"), ffn, H, &p->gate, e) ||
        model_load_linear(m, NAME("up_proj"), ffn, H, &p->up, e) ||
        model_load_linear(m, NAME("down_proj"), H, ffn, &p->down, e))
        return -1;
    if (model_load_vec(m, NAME("gate_proj.bias"), ffn, 0, c->mlp_bias, &p->b_gate, e) ||
        model_load_vec(m, NAME("up_proj.bias"), ffn, 0, c->mlp_bias, &p->b_up, e) ||
        model_load_vec(m, NAME("down_proj.bias"), H, 0, c->mlp_bias, &p->b_down, e))
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

void blk_attn(struct model *m, const struct attn_block *a, int layer, const struct fwd_batch *b)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int n = b->n_tokens, D = c->head_dim;
    int qdim = c->n_heads * D, kvdim = c->n_kv_heads * D;
    int sliding = c->layer_kinds[layer] == LAYER_SLIDING;
    int rt = sliding && !m->rope_shared ? 1 : 0;

    o->matmul(ctx, m->q, m->h, &a->wq, n);
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
    o->rope(ctx, m->q, n, c->n_heads, D, m->rope_cos[rt], m->rope_sin[rt]);
    o->rope(ctx, m->k, n, c->n_kv_heads, D, m->rope_cos[rt], m->rope_sin[rt]);
    o->kv_store(ctx, &m->kv[layer], &m->kvg, m->k, m->v, b);
    struct attn_params ap = {
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = D,
        .scale = c->attn_scale,
        .softcap = c->attn_softcap,
        .window = sliding ? c->sliding_window : 0,
    };
    o->attention(ctx, m->att, m->q, &m->kv[layer], &m->kvg, b, &ap);
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
    o->matmul(ctx, m->h, m->gate, &p->down, rows);
    if (p->b_down) o->add_bias(ctx, m->h, p->b_down, rows, m->cfg.hidden);
}
