#include "model/kv_block.h"

#include <stdlib.h>

#include "common/util.h"
#include "model/backend.h"
#include "model/tp.h"
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

/* A split model's images hold each rank's share in rank order: the lead's calls below run
 * over every rank (the others' threads wait between steps, tp.h), each at its offset. */
static int n_ranks(const struct model *m)
{
    return m->tp ? tpg_size(m->tp) : 1;
}

static struct model *rank_model(struct model *m, int r)
{
    return r ? tpg_rank_model(m->tp, r) : m;
}

static size_t rank_block_bytes(const struct model *m)
{
    size_t n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (owns_kv(&m->cfg, l)) n += layer_bytes(m, l, 0) + layer_bytes(m, l, 1);
    return n;
}

size_t model_kv_block_bytes(const struct model *m)
{
    size_t n = 0;
    for (int r = 0; r < n_ranks(m); r++) n += rank_block_bytes(rank_model((struct model *)m, r));
    return n;
}

size_t model_state_image_bytes(const struct model *m)
{
    size_t n = 0;
    for (int r = 0; r < n_ranks(m); r++) n += model_state_bytes(rank_model((struct model *)m, r));
    return n;
}

/* Block `block` of every rank to its image at host (to_host) or from it. */
static void block_io(struct model *m, int block, char *host, int to_host)
{
    for (int r = 0; r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        const struct backend_ops *o = rm->be->ops;
        void *ctx = rm->be->ctx;
        for (int l = 0; l < rm->cfg.n_layers; l++) {
            if (!owns_kv(&rm->cfg, l)) continue;
            size_t nk = layer_bytes(rm, l, 0), nv = layer_bytes(rm, l, 1);
            char *k = (char *)rm->kv[l].k + nk * (size_t)block;
            char *v = (char *)rm->kv[l].v + nv * (size_t)block;
            if (to_host) {
                o->download(ctx, host, k, nk);
                o->download(ctx, host + nk, v, nv);
            } else {
                o->upload(ctx, k, host, nk);
                o->upload(ctx, v, host + nk, nv);
            }
            host += nk + nv;
        }
    }
}

void model_kv_block_read(struct model *m, int block, void *dst)
{
    block_io(m, block, dst, 1);
}

void model_kv_block_write(struct model *m, int block, const void *src)
{
    block_io(m, block, (char *)src, 0);
}

void model_state_image_read(struct model *m, int slot, void *dst)
{
    char *p = dst;
    for (int r = 0; r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        model_state_read(rm, slot, p);
        p += model_state_bytes(rm);
    }
}

void model_state_image_write(struct model *m, int slot, const void *src)
{
    const char *p = src;
    for (int r = 0; r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        model_state_write(rm, slot, p);
        p += model_state_bytes(rm);
    }
}

int model_kv_copy_engine(const struct model *m)
{
    const struct backend_ops *o = m->be->ops;
    return o->host_alloc && o->copy_setup && o->copy_block && o->copy_mark && o->copy_done &&
           o->copy_fence && o->copy_seconds && (!m->tp || (o->host_map && o->host_unmap));
}

static void rank_copy_setup(struct model *m)
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

void model_kv_copy_setup(struct model *m)
{
    for (int r = 0; r < n_ranks(m); r++) rank_copy_setup(rank_model(m, r));
}

void *model_host_alloc(struct model *m, size_t bytes)
{
    void *p = m->be->ops->host_alloc(m->be->ctx, bytes);
    for (int r = 1; p && r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        rm->be->ops->host_map(rm->be->ctx, p, bytes);
    }
    return p;
}

void model_host_free(struct model *m, void *p)
{
    if (!p) return;
    for (int r = 1; r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        rm->be->ops->host_unmap(rm->be->ctx, p);
    }
    m->be->ops->host_free(m->be->ctx, p);
}

/* Rank r's share of a unit's copy: its image lies after the lower ranks'. */
static void copy_unit(struct model *m, int kind, int32_t unit, char *host, int to_host)
{
    for (int r = 0; r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        rm->be->ops->copy_block(rm->be->ctx, kind, unit, host, to_host);
        host += kind == BACKEND_COPY_BLOCK ? rank_block_bytes(rm) : model_state_bytes(rm);
    }
}

void model_kv_block_copy_out(struct model *m, int block, void *dst)
{
    copy_unit(m, BACKEND_COPY_BLOCK, block, dst, 1);
}

void model_kv_block_copy_in(struct model *m, int block, const void *src)
{
    copy_unit(m, BACKEND_COPY_BLOCK, block, (char *)src, 0);
}

void model_state_copy_out(struct model *m, int slot, void *dst)
{
    copy_unit(m, BACKEND_COPY_STATE, slot, dst, 1);
}

void model_state_copy_in(struct model *m, int slot, const void *src)
{
    copy_unit(m, BACKEND_COPY_STATE, slot, (char *)src, 0);
}

/* Every rank marks at each call, so their tickets count alike: ticket t is the group's once
 * every rank's t is done. */
uint64_t model_copy_mark(struct model *m)
{
    uint64_t t = m->be->ops->copy_mark(m->be->ctx);
    for (int r = 1; r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        uint64_t tr = rm->be->ops->copy_mark(rm->be->ctx);
        if (tr > t) t = tr;
    }
    return t;
}

int model_copy_done(struct model *m, uint64_t t)
{
    for (int r = 0; r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        if (!rm->be->ops->copy_done(rm->be->ctx, t)) return 0;
    }
    return 1;
}

void model_copy_fence(struct model *m)
{
    for (int r = 0; r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        rm->be->ops->copy_fence(rm->be->ctx);
    }
}

void model_copy_seconds(struct model *m, double *out_s, double *in_s)
{
    /* the ranks copy at once, each its share: the slowest rank's time is the group's */
    *out_s = *in_s = 0;
    for (int r = 0; r < n_ranks(m); r++) {
        struct model *rm = rank_model(m, r);
        double o = 0, i = 0;
        rm->be->ops->copy_seconds(rm->be->ctx, &o, &i);
        if (o > *out_s) *out_s = o;
        if (i > *in_s) *in_s = i;
    }
}
