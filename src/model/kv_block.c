#include "model/kv_block.h"

#include <stdlib.h>

#include "common/util.h"
#include "model/backend.h"
#include "paged_kv/kv_quant.h"

/* Layers with their own KV storage (not linear-attention, not reading another's). */
static int owns_kv(const struct model_config *c, int l)
{
    return (!c->layer_kinds || c->layer_kinds[l] != LAYER_LINEAR) &&
           (!c->kv_source || c->kv_source[l] == l);
}

/* Bytes of one layer's K (role 0) or V (role 1) rows of one block: in a KV cache format its
 * n_kv_heads head blocks, contiguous (paged_kv/kv_quant.h). */
static size_t layer_bytes(const struct model *m, int l, int role)
{
    const struct kv_geom *g = &m->kvg[l];
    if (g->k_dtype != KV_DTYPE_AUTO)
        return (size_t)g->n_kv_heads * kv_head_block_bytes(role ? g->v_dtype : g->k_dtype, role,
                                                           g->block_size, g->head_dim);
    size_t vb = m->be->ops->kv_value_bytes > 0 ? (size_t)m->be->ops->kv_value_bytes : sizeof(float);
    return (size_t)g->block_size * (size_t)g->n_kv_heads * (size_t)g->head_dim * vb;
}

size_t model_kv_block_bytes(const struct model *m)
{
    size_t n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (owns_kv(&m->cfg, l)) n += layer_bytes(m, l, 0) + layer_bytes(m, l, 1);
    return n;
}

void model_kv_block_read(struct model *m, int block, void *dst)
{
    char *p = dst;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (!owns_kv(&m->cfg, l)) continue;
        size_t nk = layer_bytes(m, l, 0), nv = layer_bytes(m, l, 1);
        m->be->ops->download(m->be->ctx, p, (char *)m->kv[l].k + nk * (size_t)block, nk);
        m->be->ops->download(m->be->ctx, p + nk, (char *)m->kv[l].v + nv * (size_t)block, nv);
        p += nk + nv;
    }
}

void model_kv_block_write(struct model *m, int block, const void *src)
{
    const char *p = src;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (!owns_kv(&m->cfg, l)) continue;
        size_t nk = layer_bytes(m, l, 0), nv = layer_bytes(m, l, 1);
        m->be->ops->upload(m->be->ctx, (char *)m->kv[l].k + nk * (size_t)block, p, nk);
        m->be->ops->upload(m->be->ctx, (char *)m->kv[l].v + nv * (size_t)block, p + nk, nv);
        p += nk + nv;
    }
}

int model_kv_copy_engine(const struct model *m)
{
    const struct backend_ops *o = m->be->ops;
    return o->host_alloc && o->copy_setup && o->copy_block && o->copy_mark && o->copy_done &&
           o->copy_fence && o->copy_seconds;
}

void model_kv_copy_setup(struct model *m)
{
    int n = 0;
    void **base = xmalloc(sizeof(void *) * 2 * (size_t)m->cfg.n_layers);
    size_t *bytes = xmalloc(sizeof(size_t) * 2 * (size_t)m->cfg.n_layers);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (!owns_kv(&m->cfg, l)) continue;
        base[n] = m->kv[l].k;
        bytes[n++] = layer_bytes(m, l, 0);
        base[n] = m->kv[l].v;
        bytes[n++] = layer_bytes(m, l, 1);
    }
    m->be->ops->copy_setup(m->be->ctx, BACKEND_COPY_BLOCK, n, base, bytes);
    n = model_state_pieces(m, base, bytes);
    if (n) m->be->ops->copy_setup(m->be->ctx, BACKEND_COPY_STATE, n, base, bytes);
    free(base);
    free(bytes);
}

void model_kv_block_copy_out(struct model *m, int block, void *dst)
{
    m->be->ops->copy_block(m->be->ctx, BACKEND_COPY_BLOCK, block, dst, 1);
}

void model_kv_block_copy_in(struct model *m, int block, const void *src)
{
    m->be->ops->copy_block(m->be->ctx, BACKEND_COPY_BLOCK, block, (void *)src, 0);
}

void model_state_copy_out(struct model *m, int slot, void *dst)
{
    m->be->ops->copy_block(m->be->ctx, BACKEND_COPY_STATE, slot, dst, 1);
}

void model_state_copy_in(struct model *m, int slot, const void *src)
{
    m->be->ops->copy_block(m->be->ctx, BACKEND_COPY_STATE, slot, (void *)src, 0);
}
