/* Model loading: config, tensors checked against the architecture, rope tables. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/arch.h"

static int check_shape(const struct st_tensor *t, int ndim, const int64_t *want, struct err *e)
{
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (ok) return 0;
    char a[128], b[128];
    return err_set(e, "%s: tensor '%s': shape %s, expected %s", t->file, t->name,
                   st_shape_str(t->shape, t->ndim, a, sizeof a),
                   st_shape_str(want, ndim, b, sizeof b));
}

static const struct st_tensor *need(const struct model *m, const char *name, struct err *e)
{
    const struct st_tensor *t = st_find(&m->st, name);
    if (!t) {
        const char *f = m->st.nfiles == 1 ? m->st.files[0].base : "checkpoint";
        err_set(e, "%s: tensor '%s' is missing", f, name);
    }
    return t;
}

static void track_linear(struct model *m, struct qweight *w)
{
    struct model_tensors *t = &m->tensors;
    if (t->n_linears == t->cap_linears) {
        t->cap_linears = t->cap_linears ? 2 * t->cap_linears : 64;
        t->linears = xrealloc(t->linears, sizeof *t->linears * (size_t)t->cap_linears);
    }
    t->linears[t->n_linears++] = w;
}

static void track_vec(struct model *m, float *v, int64_t len)
{
    struct model_tensors *t = &m->tensors;
    if (t->n_vecs == t->cap_vecs) {
        t->cap_vecs = t->cap_vecs ? 2 * t->cap_vecs : 64;
        t->vecs = xrealloc(t->vecs, sizeof *t->vecs * (size_t)t->cap_vecs);
        t->vec_len = xrealloc(t->vec_len, sizeof *t->vec_len * (size_t)t->cap_vecs);
    }
    t->vecs[t->n_vecs] = v;
    t->vec_len[t->n_vecs++] = len;
}

static int load_linear(struct model *m, const char *prefix, int64_t n, int64_t k, struct qweight *w,
                       struct err *e);

int model_load_linear(struct model *m, const char *prefix, int64_t n, int64_t k, struct qweight *w,
                      struct err *e)
{
    if (load_linear(m, prefix, n, k, w, e)) return -1;
    track_linear(m, w);
    return 0;
}

static int load_linear(struct model *m, const char *prefix, int64_t n, int64_t k, struct qweight *w,
                       struct err *e)
{
    char name[256];
    memset(w, 0, sizeof *w);
    w->n = n;
    w->k = k;
    snprintf(name, sizeof name, "%s.weight", prefix);
    const struct st_tensor *t = need(m, name, e);
    if (!t) return -1;
    snprintf(name, sizeof name, "%s.scales", prefix);
    const struct st_tensor *sc = st_find(&m->st, name);
    if (!sc) {
        int64_t want[2] = {n, k};
        if (check_shape(t, 2, want, e)) return -1;
        switch (t->dtype) {
        case ST_F32:
            w->fmt = WFMT_F32;
            break;
        case ST_F16:
            w->fmt = WFMT_F16;
            break;
        case ST_BF16:
            w->fmt = WFMT_BF16;
            break;
        default:
            return err_set(e,
                           "%s: tensor '%s': dtype %s is not a supported weight type (need "
                           "F32, F16, BF16, or U32 with scales)",
                           t->file, t->name, st_dtype_name(t->dtype));
        }
        w->bits = (int)st_dtype_size(t->dtype) * 8;
        w->w = t->data;
        w->row_bytes = (size_t)k * st_dtype_size(t->dtype);
        return m->be->ops->weight_prepare(m->be->ctx, w, e);
    }
    struct quant_spec q = config_quant_for(&m->cfg, prefix);
    if (q.mode == QMODE_NONE)
        return err_set(e, "%s: tensor '%s' has scales but config.json declares no quantization",
                       sc->file, sc->name);
    if (t->dtype != ST_U32)
        return err_set(e, "%s: tensor '%s': quantized weights must be U32, not %s", t->file,
                       t->name, st_dtype_name(t->dtype));
    if (k % q.group || (k * q.bits) % 32)
        return err_set(e, "%s: tensor '%s': %lld inputs do not divide into groups of %d", t->file,
                       t->name, (long long)k, q.group);
    int64_t wshape[2] = {n, k * q.bits / 32}, sshape[2] = {n, k / q.group};
    if (check_shape(t, 2, wshape, e) || check_shape(sc, 2, sshape, e)) return -1;
    w->bits = q.bits;
    w->group = q.group;
    w->w = t->data;
    w->row_bytes = (size_t)(k * q.bits / 8);
    w->scales = sc->data;
    w->sdtype = sc->dtype;
    switch (q.mode) {
    case QMODE_AFFINE: {
        w->fmt = WFMT_AFFINE;
        if (sc->dtype != ST_BF16 && sc->dtype != ST_F16 && sc->dtype != ST_F32)
            return err_set(e, "%s: tensor '%s': scales must be BF16, F16 or F32, not %s", sc->file,
                           sc->name, st_dtype_name(sc->dtype));
        snprintf(name, sizeof name, "%s.biases", prefix);
        const struct st_tensor *bi = need(m, name, e);
        if (!bi || check_shape(bi, 2, sshape, e)) return -1;
        if (bi->dtype != sc->dtype)
            return err_set(e, "%s: tensor '%s': dtype %s differs from its scales' %s", bi->file,
                           bi->name, st_dtype_name(bi->dtype), st_dtype_name(sc->dtype));
        w->biases = bi->data;
        break;
    }
    case QMODE_MXFP4:
        w->fmt = WFMT_MXFP4;
        break;
    case QMODE_MXFP8:
        w->fmt = WFMT_MXFP8;
        break;
    case QMODE_NVFP4:
        w->fmt = WFMT_NVFP4;
        break;
    default:
        break;
    }
    if (w->fmt != WFMT_AFFINE && sc->dtype != ST_U8)
        return err_set(e, "%s: tensor '%s': scales of this format must be U8, not %s", sc->file,
                       sc->name, st_dtype_name(sc->dtype));
    return m->be->ops->weight_prepare(m->be->ctx, w, e);
}

int model_load_vec(struct model *m, const char *name, int dim, float add, int required, float **out,
                   struct err *e)
{
    *out = NULL;
    const struct st_tensor *t = st_find(&m->st, name);
    if (!t) return required ? (need(m, name, e), -1) : 0;
    int64_t want[1] = {dim};
    if (check_shape(t, 1, want, e)) return -1;
    float *host = xmalloc(sizeof(float) * (size_t)dim);
    for (int i = 0; i < dim; i++) {
        switch (t->dtype) {
        case ST_F32:
            host[i] = ((const float *)t->data)[i];
            break;
        case ST_F16:
            host[i] = f16_to_f32(((const uint16_t *)t->data)[i]);
            break;
        case ST_BF16:
            host[i] = bf16_to_f32(((const uint16_t *)t->data)[i]);
            break;
        default:
            free(host);
            return err_set(e, "%s: tensor '%s': dtype %s is not supported for a vector", t->file,
                           t->name, st_dtype_name(t->dtype));
        }
        host[i] += add;
    }
    *out = m->be->ops->alloc(m->be->ctx, sizeof(float) * (size_t)dim);
    if (!*out) {
        free(host);
        return err_set(e, "%s: tensor '%s': out of memory", t->file, t->name);
    }
    m->be->ops->upload(m->be->ctx, *out, host, sizeof(float) * (size_t)dim);
    free(host);
    track_vec(m, *out, dim);
    return 0;
}

/* inv_freq[i] for i < d/2 of one rope parameter set (dynamic NTK is applied per position at
 * step time, see forward.c). Returns the attention scaling factor (yarn), else 1. */
static float rope_inv_freq(const struct rope_params *r, int d, float *inv)
{
    int half = d / 2;
    for (int i = 0; i < half; i++) inv[i] = (float)(1.0 / pow(r->theta, (double)(2 * i) / d));
    float mscale = 1.0f;
    switch (r->type) {
    case ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv[i] = (float)(inv[i] / r->factor);
        break;
    case ROPE_LLAMA3: {
        double old = r->orig_max_pos, lo_wl = old / r->low_freq_factor,
               hi_wl = old / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            double f = inv[i], wl = 2 * M_PI / f;
            if (wl > lo_wl) {
                f = f / r->factor;
            } else if (wl >= hi_wl) {
                double smooth =
                    (old / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                f = (1 - smooth) * f / r->factor + smooth * f;
            }
            inv[i] = (float)f;
        }
        break;
    }
    case ROPE_YARN: {
        double base = r->theta, factor = r->factor;
        int orig = r->orig_max_pos;
#define YARN_DIM(rot) (d * log(orig / ((rot)*2 * M_PI)) / (2 * log(base)))
        double low = YARN_DIM(r->beta_fast), high = YARN_DIM(r->beta_slow);
#undef YARN_DIM
        if (r->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > d - 1) high = d - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra = 1 - ramp; /* share of the original (extrapolated) frequency */
            double f = inv[i];
            inv[i] = (float)(f / factor * (1 - extra) + f * extra);
        }
        if (r->attention_factor > 0) {
            mscale = (float)r->attention_factor;
        } else {
#define YARN_MSCALE(s, ms) ((s) <= 1 ? 1.0 : 0.1 * (ms)*log(s) + 1.0)
            if (r->mscale > 0 && r->mscale_all_dim > 0)
                mscale = (float)(YARN_MSCALE(factor, r->mscale) /
                                 YARN_MSCALE(factor, r->mscale_all_dim));
            else
                mscale = (float)YARN_MSCALE(factor, 1.0);
#undef YARN_MSCALE
        }
        break;
    }
    default:
        break;
    }
    return mscale;
}

/* The embedding, the head and the final norm; the family loads its layers. */
static int load_weights(struct model *m, struct err *e)
{
    const struct model_config *c = &m->cfg;
    int64_t H = c->hidden;
    float plus = c->gemma_norms ? 1.0f : 0.0f;
    if (model_load_linear(m, "model.embed_tokens", c->vocab, H, &m->embed, e)) return -1;
    int tie = c->tie_embeddings || (!c->tie_explicit && !st_find(&m->st, "lm_head.weight"));
    if (tie)
        m->lm_head = m->embed;
    else if (model_load_linear(m, "lm_head", c->vocab, H, &m->lm_head, e))
        return -1;
    if (model_load_vec(m, "model.norm.weight", (int)H, plus, 1, &m->final_norm, e)) return -1;
    m->embed_scale = c->embed_scale;
    m->layers = xcalloc((size_t)c->n_layers, sizeof *m->layers);
    return c->arch->load(m, e);
}

static int rope_equal(const struct rope_params *a, const struct rope_params *b)
{
    return a->type == b->type && a->theta == b->theta && a->factor == b->factor &&
           a->orig_max_pos == b->orig_max_pos && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor && a->beta_fast == b->beta_fast &&
           a->beta_slow == b->beta_slow && a->attention_factor == b->attention_factor &&
           a->mscale == b->mscale && a->mscale_all_dim == b->mscale_all_dim &&
           a->truncate == b->truncate;
}

struct model *model_load(const char *dir, struct backend *be, struct err *e)
{
    struct model *m = xcalloc(1, sizeof *m);
    m->be = be;
    if (config_load(&m->cfg, dir, e)) {
        free(m);
        return NULL;
    }
    const struct model_config *c = &m->cfg;
    struct err be_err;
    if (be->ops->attn_check &&
        be->ops->attn_check(be->ctx, c->head_dim, c->n_heads, c->n_kv_heads, &be_err)) {
        err_set(e, "%s: config.json head_dim %d (%d query heads, %d KV heads): %s", dir,
                c->head_dim, c->n_heads, c->n_kv_heads, be_err.msg);
        config_dispose(&m->cfg);
        free(m);
        return NULL;
    }
    if (st_open(&m->st, dir, e) || load_weights(m, e)) {
        model_destroy(m);
        return NULL;
    }
    m->rope_shared = rope_equal(&m->cfg.rope_full, &m->cfg.rope_sliding);
    int half = m->cfg.head_dim / 2;
    for (int i = 0; i < 2; i++) {
        m->rope_inv_freq[i] = xmalloc(sizeof(float) * (size_t)half);
        m->rope_mscale[i] = rope_inv_freq(i == 0 ? &m->cfg.rope_full : &m->cfg.rope_sliding,
                                          m->cfg.head_dim, m->rope_inv_freq[i]);
    }
    return m;
}

size_t model_kv_bytes_per_token(const struct model *m)
{
    size_t vb = m->be->ops->kv_value_bytes > 0 ? (size_t)m->be->ops->kv_value_bytes : sizeof(float);
    return (size_t)2 * m->cfg.n_layers * m->cfg.n_kv_heads * m->cfg.head_dim * vb;
}

int model_state_alloc(struct model *m, int max_tokens, int max_logits, int n_blocks, int block_size,
                      struct err *e)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    size_t T = (size_t)max_tokens, H = (size_t)c->hidden, D = (size_t)c->head_dim;
    size_t qdim = (size_t)c->n_heads * D, kvdim = (size_t)c->n_kv_heads * D;
    size_t wide = qdim > H ? qdim : H;
    m->max_tokens = max_tokens;
    m->max_logits = max_logits;
#define A(n) o->alloc(ctx, sizeof(float) * (n))
    m->x = A(T * H);
    m->h = A(T * wide);
    m->q = A(T * qdim);
    m->k = A(T * kvdim);
    m->v = A(T * kvdim);
    m->att = A(T * qdim);
    m->gate = A(T * (size_t)c->ffn);
    m->up = A(T * (size_t)c->ffn);
    m->xl = A((size_t)max_logits * H);
    m->logits = A((size_t)max_logits * (size_t)c->vocab);
    for (int i = 0; i < 2; i++) {
        m->rope_cos[i] = A(T * D / 2);
        m->rope_sin[i] = A(T * D / 2);
        if (o->rope_tables) {
            m->rope_inv_dev[i] = A(D / 2);
            if (m->rope_inv_dev[i])
                o->upload(ctx, m->rope_inv_dev[i], m->rope_inv_freq[i], sizeof(float) * (D / 2));
        }
    }
    m->host_cos = xmalloc(sizeof(float) * T * D / 2);
    m->host_sin = xmalloc(sizeof(float) * T * D / 2);
    m->kvg = (struct kv_geom){n_blocks, block_size, c->n_kv_heads, c->head_dim};
    m->kv = xcalloc((size_t)c->n_layers, sizeof *m->kv);
    size_t vb = o->kv_value_bytes > 0 ? (size_t)o->kv_value_bytes : sizeof(float);
    size_t kv_bytes = (size_t)n_blocks * block_size * kvdim * vb;
    for (int l = 0; l < c->n_layers; l++) {
        m->kv[l].k = o->alloc(ctx, kv_bytes);
        m->kv[l].v = o->alloc(ctx, kv_bytes);
        if (!m->kv[l].k || !m->kv[l].v)
            return err_set(e, "out of memory for the KV cache (%d blocks of %d tokens)", n_blocks,
                           block_size);
    }
#undef A
    if (!m->x || !m->h || !m->gate || !m->up || !m->logits)
        return err_set(e, "out of memory for step buffers of %d tokens", max_tokens);
    return 0;
}

void model_destroy(struct model *m)
{
    if (!m) return;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    struct model_tensors *t = &m->tensors;
    for (int i = 0; i < t->n_vecs; i++) o->free(ctx, t->vecs[i]);
    free(t->vecs);
    free(t->vec_len);
    free(t->linears);
    free(m->layers);
    float *bufs[] = {m->x,
                     m->h,
                     m->q,
                     m->k,
                     m->v,
                     m->att,
                     m->gate,
                     m->up,
                     m->xl,
                     m->logits,
                     m->rope_cos[0],
                     m->rope_cos[1],
                     m->rope_sin[0],
                     m->rope_sin[1],
                     m->rope_inv_dev[0],
                     m->rope_inv_dev[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) o->free(ctx, bufs[i]);
    if (m->kv) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            if (m->kv[l].k) o->free(ctx, m->kv[l].k);
            if (m->kv[l].v) o->free(ctx, m->kv[l].v);
        }
        free(m->kv);
    }
    free(m->host_cos);
    free(m->host_sin);
    free(m->rope_inv_freq[0]);
    free(m->rope_inv_freq[1]);
    st_close(&m->st);
    config_dispose(&m->cfg);
    free(m);
}

int64_t model_param_count(const struct model *m)
{
    const struct model_tensors *t = &m->tensors;
    int64_t n = 0;
    for (int i = 0; i < t->n_linears; i++) n += t->linears[i]->n * t->linears[i]->k;
    for (int i = 0; i < t->n_vecs; i++) n += t->vec_len[i];
    return n;
}

size_t model_weight_bytes(const struct model *m)
{
    size_t n = 0;
    for (int i = 0; i < m->st.ntensors; i++) n += m->st.tensors[i].nbytes;
    return n;
}
