#include "model/kv_block.h"

#include "model/backend.h"

/* Layers with their own KV storage (not linear-attention, not reading another's). */
static int owns_kv(const struct model_config *c, int l)
{
    return (!c->layer_kinds || c->layer_kinds[l] != LAYER_LINEAR) &&
           (!c->kv_source || c->kv_source[l] == l);
}

/* Bytes of one layer's K (or V) rows of one block. */
static size_t layer_bytes(const struct model *m, int l)
{
    const struct kv_geom *g = &m->kvg[l];
    size_t vb = m->be->ops->kv_value_bytes > 0 ? (size_t)m->be->ops->kv_value_bytes : sizeof(float);
    return (size_t)g->block_size * (size_t)g->n_kv_heads * (size_t)g->head_dim * vb;
}

size_t model_kv_block_bytes(const struct model *m)
{
    size_t n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (owns_kv(&m->cfg, l)) n += 2 * layer_bytes(m, l);
    return n;
}

void model_kv_block_read(struct model *m, int block, void *dst)
{
    char *p = dst;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (!owns_kv(&m->cfg, l)) continue;
        size_t n = layer_bytes(m, l);
        m->be->ops->download(m->be->ctx, p, (char *)m->kv[l].k + n * (size_t)block, n);
        m->be->ops->download(m->be->ctx, p + n, (char *)m->kv[l].v + n * (size_t)block, n);
        p += 2 * n;
    }
}

void model_kv_block_write(struct model *m, int block, const void *src)
{
    const char *p = src;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (!owns_kv(&m->cfg, l)) continue;
        size_t n = layer_bytes(m, l);
        m->be->ops->upload(m->be->ctx, (char *)m->kv[l].k + n * (size_t)block, p, n);
        m->be->ops->upload(m->be->ctx, (char *)m->kv[l].v + n * (size_t)block, p + n, n);
        p += 2 * n;
    }
}
