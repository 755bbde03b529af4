/* Model loading: config, tensors checked against the architecture, rope tables. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/arch.h"
#include "model/tp.h"

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

void model_track_linear(struct model *m, struct qweight *w)
{
    track_linear(m, w);
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

static int load_linear_parts(struct model *m, const char *prefix, int expert, int64_t n, int64_t k,
                             enum tp_split split, int n_parts, const int64_t *stack,
                             struct qweight *w, struct err *e);

static int load_linear(struct model *m, const char *prefix, int expert, int64_t n, int64_t k,
                       enum tp_split split, struct qweight *w, struct err *e)
{
    return load_linear_parts(m, prefix, expert, n, k, split, 0, NULL, w, e);
}

int model_load_linear(struct model *m, const char *prefix, int64_t n, int64_t k, struct qweight *w,
                      struct err *e)
{
    return model_load_linear_split(m, prefix, n, k, SPLIT_NONE, w, e);
}

int model_load_linear_split(struct model *m, const char *prefix, int64_t n, int64_t k,
                            enum tp_split split, struct qweight *w, struct err *e)
{
    if (load_linear(m, prefix, -1, n, k, split, w, e)) return -1;
    track_linear(m, w);
    return 0;
}

int model_load_linear_stacked(struct model *m, const char *prefix, int n_parts,
                              const int64_t *parts, int64_t k, struct qweight *w, struct err *e)
{
    int64_t n = 0;
    for (int i = 0; i < n_parts; i++) n += parts[i];
    if (load_linear_parts(m, prefix, -1, n, k, SPLIT_ROWS, n_parts, parts, w, e)) return -1;
    track_linear(m, w);
    return 0;
}

int model_load_expert(struct model *m, const char *prefix, int expert, int64_t n, int64_t k,
                      struct qweight *w, struct err *e)
{
    return model_load_expert_split(m, prefix, expert, n, k, SPLIT_NONE, w, e);
}

int model_load_expert_split(struct model *m, const char *prefix, int expert, int64_t n, int64_t k,
                            enum tp_split split, struct qweight *w, struct err *e)
{
    if (load_linear(m, prefix, expert, n, k, split, w, e)) return -1;
    track_linear(m, w);
    return 0;
}

/* Bytes of one row of w's scales (and of its biases): k / group entries. */
static size_t scale_row_bytes(const struct qweight *w)
{
    return w->scales ? (size_t)(w->k / w->group) * st_dtype_size(w->sdtype) : 0;
}

/* The share this rank takes under split: part *r of *S. */
static void share_of(const struct model *m, enum tp_split split, int *r, int *S)
{
    *r = 0;
    *S = 1;
    if (m->tp_size <= 1 || split == SPLIT_NONE) return; /* alone (a draft head's model too) */
    *r = split == SPLIT_KV ? m->kv_part : m->tp_rank;
    *S = split == SPLIT_KV ? m->kv_parts : m->tp_size;
}

void *model_host_weight(struct model *m, size_t bytes)
{
    uint8_t *p = xcalloc(1, bytes ? bytes : 1);
    m->host_blobs = xrealloc(m->host_blobs, sizeof(void *) * (size_t)(m->n_host_blobs + 1));
    m->host_blobs[m->n_host_blobs++] = p;
    return p;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The group a column share of k inputs is stored in, from weights in groups of `group` (0:
 * unquantized): the same when the share falls on whole groups; else, for affine weights, the
 * largest group of at least 32 that both fall on whole groups of (each stored group split into
 * groups of the same scale and bias: the same values); -1 when neither. */
static int split_group(int64_t k, int group, int affine)
{
    if (!group || k % group == 0) return group;
    int64_t g = gcd64(k, group);
    return affine && g >= 32 ? (int)g : -1;
}

/* Narrows the whole matrix w (as stored) to this rank's share under split: a row share
 * points into the mapping; a column share, an embedding's share with its row of zeros and
 * the shares of n_parts stacked blocks of rows (parts[i] rows of block i) are copied into
 * host memory. Then the backend prepares it. */
static int take_share(struct model *m, const char *prefix, struct qweight *w, enum tp_split split,
                      int n_parts, const int64_t *parts, struct err *e)
{
    int S, r;
    share_of(m, split, &r, &S);
    if (split == SPLIT_ROWS && n_parts > 0 && S > 1) { /* each part's share, one after another */
        if (w->fmt == WFMT_TERNARY)
            return err_set(e, "%s: a ternary matrix of stacked parts does not split", prefix);
        size_t srb = scale_row_bytes(w);
        int64_t n = w->n / S, src = 0, dst = 0;
        uint8_t *codes = model_host_weight(m, (size_t)n * w->row_bytes);
        uint8_t *sc = w->scales ? model_host_weight(m, (size_t)n * srb) : NULL;
        uint8_t *bi = w->biases ? model_host_weight(m, (size_t)n * srb) : NULL;
        for (int i = 0; i < n_parts; i++) {
            int64_t from = src + r * parts[i];
            memcpy(codes + (size_t)dst * w->row_bytes, w->w + (size_t)from * w->row_bytes,
                   (size_t)parts[i] * w->row_bytes);
            if (sc)
                memcpy(sc + (size_t)dst * srb, (const uint8_t *)w->scales + (size_t)from * srb,
                       (size_t)parts[i] * srb);
            if (bi)
                memcpy(bi + (size_t)dst * srb, (const uint8_t *)w->biases + (size_t)from * srb,
                       (size_t)parts[i] * srb);
            src += S * parts[i];
            dst += parts[i];
        }
        w->w = codes;
        if (sc) w->scales = sc;
        if (bi) w->biases = bi;
        w->n = n;
    } else if ((split == SPLIT_ROWS || split == SPLIT_KV || split == SPLIT_VOCAB) && S > 1) {
        int64_t n = w->n / S;
        size_t srb = scale_row_bytes(w);
        w->w += (size_t)(r * n) * w->row_bytes;
        if (w->scales) w->scales = (const uint8_t *)w->scales + (size_t)(r * n) * srb;
        if (w->biases) w->biases = (const uint8_t *)w->biases + (size_t)(r * n) * srb;
        w->n = n;
        if (split == SPLIT_VOCAB) { /* a copy with a row of zeros after the share's rows */
            if (w->fmt == WFMT_TERNARY)
                return err_set(e, "%s: a ternary embedding does not split", prefix);
            size_t codes = (size_t)n * w->row_bytes, sb = (size_t)n * srb;
            size_t bytes =
                codes + w->row_bytes + (w->scales ? sb + srb : 0) + (w->biases ? sb + srb : 0);
            uint8_t *p = model_host_weight(m, bytes);
            memcpy(p, w->w, codes);
            w->w = p; /* codes, scales and biases of the zero row stay 0: the value 0 */
            p += codes + w->row_bytes;
            if (w->scales) {
                memcpy(p, w->scales, sb);
                w->scales = p;
                p += sb + srb;
            }
            if (w->biases) {
                memcpy(p, w->biases, sb);
                w->biases = p;
            }
            w->n = n + 1;
        }
    } else if (split == SPLIT_COLS && S > 1) {
        int64_t k = w->k / S, c0 = r * k;
        int g2 = split_group(k, w->group, w->fmt == WFMT_AFFINE);
        if (w->fmt == WFMT_TERNARY || (k * w->bits) % 8 || g2 < 0)
            return err_set(e,
                           "%s: its %lld inputs split %d ways do not fall on whole groups of %d "
                           "(--tensor-parallel-size)",
                           prefix, (long long)w->k, S, w->group);
        int G = w->group ? w->group : 1, G2 = g2 ? g2 : 1;
        size_t rb = (size_t)(k * w->bits / 8), srb = scale_row_bytes(w);
        size_t ssz = w->scales ? st_dtype_size(w->sdtype) : 0, nsrb = (size_t)(k / G2) * ssz;
        size_t bytes = (size_t)w->n * (rb + (w->biases ? 2 : 1) * nsrb);
        uint8_t *blob = model_host_weight(m, bytes), *p = blob;
        for (int64_t i = 0; i < w->n; i++, p += rb)
            memcpy(p, w->w + (size_t)i * w->row_bytes + (size_t)(c0 * w->bits / 8), rb);
        w->w = blob;
        w->row_bytes = rb;
        /* each of the share's groups takes the scale (and bias) of the group it lies in */
        const void **parts[2] = {&w->scales, &w->biases};
        for (int j = 0; j < 2; j++) {
            if (!*parts[j]) continue;
            const uint8_t *src = *parts[j];
            uint8_t *dst = p;
            for (int64_t i = 0; i < w->n; i++) {
                const uint8_t *row = src + (size_t)i * srb;
                if (G2 == G) { /* whole groups: the row's run of them */
                    memcpy(p, row + (size_t)(c0 / G) * ssz, nsrb);
                    p += nsrb;
                    continue;
                }
                for (int64_t c = c0; c < c0 + k; c += G2, p += ssz)
                    memcpy(p, row + (size_t)(c / G) * ssz, ssz);
            }
            *parts[j] = dst;
        }
        w->group = g2;
        w->k = k;
    }
    return m->be->ops->weight_prepare(m->be->ctx, w, e);
}

/* Checks t against [rows, cols], or [E, rows, cols] with E > expert when expert >= 0, and
 * returns the byte offset of the expert's [rows, cols] slice. */
/* The weight format of a float tensor's dtype; -1 when it is not F32, F16 or BF16. */
static int float_wfmt(enum st_dtype d)
{
    return d == ST_F32 ? WFMT_F32 : d == ST_F16 ? WFMT_F16 : d == ST_BF16 ? WFMT_BF16 : -1;
}

static int check_slice(const struct st_tensor *t, int expert, int64_t rows, int64_t cols,
                       size_t elem_bytes, size_t *offset, struct err *e)
{
    *offset = 0;
    if (expert < 0) {
        int64_t want[2] = {rows, cols};
        return check_shape(t, 2, want, e);
    }
    int64_t want[3] = {t->ndim == 3 && t->shape[0] > expert ? t->shape[0] : expert + 1, rows, cols};
    if (check_shape(t, 3, want, e)) return -1;
    *offset = (size_t)expert * (size_t)rows * (size_t)cols * elem_bytes;
    return 0;
}

/* Loads the linear layer `prefix` of n outputs and k inputs; with expert >= 0, expert
 * `expert` of a stack [E, n, k] stored under that name (MLX switch_mlp). With n_parts > 0
 * its rows are n_parts blocks, stack[i] rows of block i the rank's share
 * (model_load_linear_stacked). */
static int load_linear_parts(struct model *m, const char *prefix, int expert, int64_t n, int64_t k,
                             enum tp_split split, int n_parts, const int64_t *stack,
                             struct qweight *w, struct err *e)
{
    char name[256];
    size_t off;
    memset(w, 0, sizeof *w);
    int part, parts;
    share_of(m, split, &part, &parts);
    if (split == SPLIT_COLS) /* the whole matrix first */
        k *= parts;
    else
        n *= parts;
    w->n = n;
    w->k = k;
    snprintf(name, sizeof name, "%s.weight", prefix);
    const struct st_tensor *t = need(m, name, e);
    if (!t) return -1;
    snprintf(name, sizeof name, "%s.scales", prefix);
    const struct st_tensor *sc = st_find(&m->st, name);
    if (!sc) {
        if (check_slice(t, expert, n, k, st_dtype_size(t->dtype), &off, e)) return -1;
        int f = float_wfmt(t->dtype);
        if (f < 0)
            return err_set(e,
                           "%s: tensor '%s': dtype %s is not a supported weight type (need "
                           "F32, F16, BF16, or U32 with scales)",
                           t->file, t->name, st_dtype_name(t->dtype));
        w->fmt = (enum wfmt)f;
        w->bits = (int)st_dtype_size(t->dtype) * 8;
        w->w = (const uint8_t *)t->data + off;
        w->row_bytes = (size_t)k * st_dtype_size(t->dtype);
        return take_share(m, prefix, w, split, n_parts, stack, e);
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
    size_t soff;
    if (check_slice(t, expert, n, k * q.bits / 32, 4, &off, e) ||
        check_slice(sc, expert, n, k / q.group, st_dtype_size(sc->dtype), &soff, e))
        return -1;
    w->bits = q.bits;
    w->group = q.group;
    w->w = (const uint8_t *)t->data + off;
    w->row_bytes = (size_t)(k * q.bits / 8);
    w->scales = (const uint8_t *)sc->data + soff;
    w->sdtype = sc->dtype;
    switch (q.mode) {
    case QMODE_AFFINE: {
        w->fmt = WFMT_AFFINE;
        if (sc->dtype != ST_BF16 && sc->dtype != ST_F16 && sc->dtype != ST_F32)
            return err_set(e, "%s: tensor '%s': scales must be BF16, F16 or F32, not %s", sc->file,
                           sc->name, st_dtype_name(sc->dtype));
        snprintf(name, sizeof name, "%s.biases", prefix);
        const struct st_tensor *bi = need(m, name, e);
        size_t boff;
        if (!bi || check_slice(bi, expert, n, k / q.group, st_dtype_size(bi->dtype), &boff, e))
            return -1;
        if (bi->dtype != sc->dtype)
            return err_set(e, "%s: tensor '%s': dtype %s differs from its scales' %s", bi->file,
                           bi->name, st_dtype_name(bi->dtype), st_dtype_name(sc->dtype));
        w->biases = (const uint8_t *)bi->data + boff;
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
    return take_share(m, prefix, w, split, n_parts, stack, e);
}

/* Converts `count` values of t to host floats, plus `add`. */
static int host_floats(const struct st_tensor *t, int64_t count, float add, float *host,
                       struct err *e)
{
    for (int64_t i = 0; i < count; i++) {
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
            return err_set(e, "%s: tensor '%s': dtype %s is not supported for a vector", t->file,
                           t->name, st_dtype_name(t->dtype));
        }
        host[i] += add;
    }
    return 0;
}

/* Converts `count` values of t to float in backend memory, plus `add`. */
static int load_floats(struct model *m, const struct st_tensor *t, int64_t count, float add,
                       float **out, struct err *e)
{
    float *host = xmalloc(sizeof(float) * (size_t)count);
    if (host_floats(t, count, add, host, e)) {
        free(host);
        return -1;
    }
    *out = m->be->ops->alloc(m->be->ctx, sizeof(float) * (size_t)count);
    if (!*out) {
        free(host);
        return err_set(e, "%s: tensor '%s': out of memory", t->file, t->name);
    }
    m->be->ops->upload(m->be->ctx, *out, host, sizeof(float) * (size_t)count);
    free(host);
    track_vec(m, *out, count);
    return 0;
}

int model_load_vec(struct model *m, const char *name, int dim, float add, int required, float **out,
                   struct err *e)
{
    *out = NULL;
    const struct st_tensor *t = st_find(&m->st, name);
    if (!t) return required ? (need(m, name, e), -1) : 0;
    int64_t want[1] = {dim};
    if (check_shape(t, 1, want, e)) return -1;
    return load_floats(m, t, dim, add, out, e);
}

int model_load_vec_part(struct model *m, const char *name, int dim, float add, int required,
                        enum tp_split split, float **out, struct err *e)
{
    int r, S;
    share_of(m, split, &r, &S);
    if (S == 1) return model_load_vec(m, name, dim, add, required, out, e);
    *out = NULL;
    const struct st_tensor *t = st_find(&m->st, name);
    if (!t) return required ? (need(m, name, e), -1) : 0;
    int64_t want[1] = {(int64_t)dim * S};
    if (check_shape(t, 1, want, e)) return -1;
    struct st_tensor part = *t;
    part.data = (const uint8_t *)t->data + (size_t)r * dim * st_dtype_size(t->dtype);
    return load_floats(m, &part, dim, add, out, e);
}

int model_read_vec(struct model *m, const char *name, int dim, float *out, struct err *e)
{
    const struct st_tensor *t = need(m, name, e);
    if (!t) return -1;
    int64_t want[1] = {dim};
    if (check_shape(t, 1, want, e)) return -1;
    for (int i = 0; i < dim; i++) {
        if (t->dtype == ST_F32)
            out[i] = ((const float *)t->data)[i];
        else if (t->dtype == ST_F16)
            out[i] = f16_to_f32(((const uint16_t *)t->data)[i]);
        else if (t->dtype == ST_BF16)
            out[i] = bf16_to_f32(((const uint16_t *)t->data)[i]);
        else
            return err_set(e, "%s: tensor '%s': dtype %s is not supported for a vector", t->file,
                           t->name, st_dtype_name(t->dtype));
    }
    return 0;
}

float *model_upload_vec(struct model *m, const float *host, int64_t n, struct err *e)
{
    float *d = m->be->ops->alloc(m->be->ctx, sizeof(float) * (size_t)n);
    if (!d) {
        err_set(e, "out of memory for a vector of %lld values", (long long)n);
        return NULL;
    }
    m->be->ops->upload(m->be->ctx, d, host, sizeof(float) * (size_t)n);
    track_vec(m, d, n);
    return d;
}

int model_load_expert_rows(struct model *m, const char *name, int expert, int64_t row0, int64_t n,
                           int64_t k, enum tp_split split, struct qweight *w, struct err *e)
{
    memset(w, 0, sizeof *w);
    const struct st_tensor *t = need(m, name, e);
    if (!t) return -1;
    int part, parts;
    share_of(m, split, &part, &parts);
    if (split == SPLIT_COLS) /* the whole rows first */
        k *= parts;
    else
        n *= parts;
    char a[128];
    if (t->ndim != 3 || t->shape[0] <= expert || t->shape[1] < row0 + n || t->shape[2] != k)
        return err_set(e, "%s: tensor '%s': shape %s, expected [>%d, >=%lld, %lld]", t->file,
                       t->name, st_shape_str(t->shape, t->ndim, a, sizeof a), expert,
                       (long long)(row0 + n), (long long)k);
    int f = float_wfmt(t->dtype);
    if (f < 0)
        return err_set(e,
                       "%s: tensor '%s': dtype %s is not a supported expert stack (need F32, "
                       "F16 or BF16)",
                       t->file, t->name, st_dtype_name(t->dtype));
    w->fmt = (enum wfmt)f;
    size_t es = st_dtype_size(t->dtype);
    w->n = n;
    w->k = k;
    w->bits = (int)es * 8;
    w->w = (const uint8_t *)t->data +
           ((size_t)expert * (size_t)t->shape[1] + (size_t)row0) * (size_t)k * es;
    w->row_bytes = (size_t)k * es;
    if (take_share(m, name, w, split, 0, NULL, e)) return -1;
    track_linear(m, w);
    return 0;
}

/* The tensor `name` of rows x cols values, stored with any singleton dimensions; NULL + err
 * when it is missing or of another shape. */
static const struct st_tensor *need_rows(struct model *m, const char *name, int64_t rows,
                                         int64_t cols, struct err *e)
{
    const struct st_tensor *t = need(m, name, e);
    if (!t) return NULL;
    int64_t count = 1;
    for (int i = 0; i < t->ndim; i++) count *= t->shape[i];
    int ok = t->ndim >= 2 && t->shape[0] == rows && count == rows * cols;
    for (int i = 1; ok && i < t->ndim; i++) ok = t->shape[i] == cols || t->shape[i] == 1;
    if (!ok) {
        char a[128];
        err_set(e, "%s: tensor '%s': shape %s, expected %lld rows of %lld values", t->file, t->name,
                st_shape_str(t->shape, t->ndim, a, sizeof a), (long long)rows, (long long)cols);
        return NULL;
    }
    return t;
}

int model_load_rows(struct model *m, const char *name, int64_t rows, int64_t cols, float **out,
                    struct err *e)
{
    *out = NULL;
    const struct st_tensor *t = need_rows(m, name, rows, cols, e);
    if (!t) return -1;
    return load_floats(m, t, rows * cols, 0, out, e);
}

int model_load_rows_stacked(struct model *m, const char *name, int n_parts, const int64_t *parts,
                            int64_t cols, float **out, struct err *e)
{
    int r, S;
    share_of(m, SPLIT_ROWS, &r, &S);
    int64_t n = 0;
    for (int i = 0; i < n_parts; i++) n += parts[i];
    if (S == 1) return model_load_rows(m, name, n, cols, out, e);
    *out = NULL;
    const struct st_tensor *t = need_rows(m, name, n * S, cols, e);
    if (!t) return -1;
    float *host = xmalloc(sizeof(float) * (size_t)(n * cols));
    int64_t src = 0, dst = 0;
    for (int i = 0; i < n_parts; i++) {
        struct st_tensor part = *t;
        part.data = (const uint8_t *)t->data +
                    (size_t)((src + r * parts[i]) * cols) * st_dtype_size(t->dtype);
        if (host_floats(&part, parts[i] * cols, 0, host + dst * cols, e)) {
            free(host);
            return -1;
        }
        src += S * parts[i];
        dst += parts[i];
    }
    *out = model_upload_vec(m, host, n * cols, e);
    free(host);
    return *out ? 0 : -1;
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
    case ROPE_PROPORTIONAL: { /* the first partial * d / 2 pairs rotate, the rest stand */
        int angles = (int)(r->partial * d / 2);
        for (int i = 0; i < half; i++) inv[i] = i < angles ? (float)(inv[i] / r->factor) : 0.0f;
        break;
    }
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
    float plus = c->norm_plus_one ? 1.0f : 0.0f;
    /* The text tower of a multimodal checkpoint sits under language_model (Hugging Face:
     * model.language_model.*, MLX: language_model.model.*). */
    static const char *const layouts[][2] = {{"model.", "lm_head"},
                                             {"model.language_model.", "lm_head"},
                                             {"language_model.model.", "language_model.lm_head"}};
    char n[128];
    size_t li = 0;
    for (size_t i = 1; i < sizeof layouts / sizeof layouts[0] && !li; i++) {
        snprintf(n, sizeof n, "%sembed_tokens.weight", layouts[i][0]);
        if (st_find(&m->st, n)) li = i;
    }
    snprintf(m->prefix, sizeof m->prefix, "%s", layouts[li][0]);
    snprintf(m->head, sizeof m->head, "%s", layouts[li][1]);
    snprintf(n, sizeof n, "%sembed_tokens", m->prefix);
    if (model_load_linear_split(m, n, m->vocab_part, H, SPLIT_VOCAB, &m->embed, e)) return -1;
    snprintf(n, sizeof n, "%s.weight", m->head);
    int tie = c->tie_embeddings || (!c->tie_explicit && !st_find(&m->st, n));
    if (m->tp_size > 1) { /* the rank's rows of the vocabulary */
        snprintf(n, sizeof n, "%sembed_tokens", m->prefix);
        if (model_load_linear_split(m, tie ? n : m->head, m->vocab_part, H, SPLIT_ROWS, &m->lm_head,
                                    e))
            return -1;
    } else if (tie) {
        m->lm_head = m->embed;
    } else if (model_load_linear(m, m->head, c->vocab, H, &m->lm_head, e)) {
        return -1;
    }
    snprintf(n, sizeof n, "%snorm.weight", m->prefix);
    if (model_load_vec(m, n, (int)H, plus, 1, &m->final_norm, e)) return -1;
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
           a->truncate == b->truncate && a->partial == b->partial;
}

/* A model whose layers need an operation the backend lacks is refused here, naming both. */
static int check_ops(const struct model *m, const char *dir, struct err *e)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    int linear = 0, moe = 0;
    for (int l = 0; l < c->n_layers; l++) {
        linear |= c->layer_kinds[l] == LAYER_LINEAR;
        moe |= c->layer_moe[l];
    }
    const char *missing = NULL;
    if (linear && (!o->delta_net || !o->rms_norm_gated || !o->copy))
        missing = "Gated DeltaNet layers";
    else if (c->attn_gate && (!o->split_qgate || !o->gate_mul))
        missing = "gated attention";
    else if (c->rope_dim < c->head_dim && !o->rope_partial)
        missing = "partial rotary embeddings";
    else if (moe && (!o->moe || !o->gate_mul))
        missing = "routed experts";
    else if (c->layer_scale && !o->scale)
        missing = "layer scalars";
    else if (c->k_eq_v && !o->copy)
        missing = "K reused as V";
    else if ((c->bitnet != BITNET_NONE || c->act == ACT_RELU2) && !o->bitnet)
        missing = "ternary BitLinear products (int8 activations) and ReLU^2";
    if (!missing) return 0;
    return err_set(e,
                   "%s: %s (%s) needs %s, which the %s backend does not run yet (use --device "
                   "cpu)",
                   dir, c->arch_name, c->arch->family, missing, o->name);
}

/* Rank `rank` of `size` takes its share of the heads, the KV heads and the MLP width (the
 * family's load splits the matrices alike); what does not divide evenly is refused. A layer
 * with fewer key-value heads than ranks has each head serve size / heads ranks; its heads
 * are shared out in layer_kv_parts[l] parts (model_kv_share_layer). */
static int tp_share(struct model *m, const char *dir, int rank, int size, struct err *e)
{
    struct model_config *c = &m->cfg;
    m->tp_rank = m->kv_part = rank;
    m->tp_size = m->kv_parts = size;
    m->vocab_part = c->vocab;
    if (size == 1) return 0;
    if (!c->arch->tensor_parallel)
        return err_set(e,
                       "%s: %s (%s) does not run split over GPUs yet (--tensor-parallel-size "
                       "%d): the Llama, Mistral, Qwen2, Qwen3, Gemma 2, 3 and 4, Qwen3-MoE and "
                       "Qwen3.5 families do",
                       dir, c->arch_name, c->arch->family, size);
    const char *what = NULL;
    char layer_what[96];
    int v = 0, kvh = c->n_kv_heads;
    if (kvh % size && size % kvh) what = "key-value heads", v = kvh;
    for (int l = 0; l < c->n_layers && !what; l++) {
        int h = c->layer_kv_heads[l];
        if (h % size == 0 || size % h == 0) continue;
        snprintf(layer_what, sizeof layer_what,
                 "key-value heads on layer %d (num_global_key_value_heads or per_layer_config)", l);
        what = layer_what, v = h;
    }
    if (!what && c->n_heads % size) what = "attention heads", v = c->n_heads;
    /* the dense MLP's width where a layer has one (not in a model of routed experts alone) */
    bool dense = false;
    for (int l = 0; l < c->n_layers; l++) dense = dense || !c->layer_moe[l];
    dense = dense || c->moe.beside_mlp; /* Gemma 4: the experts beside the dense MLP */
    if (!what && dense && c->ffn % size) what = "intermediate_size", v = c->ffn;
    if (!what && c->moe.n_experts && c->moe.inner % size)
        what = "moe_intermediate_size", v = c->moe.inner;
    if (!what && c->moe.n_experts && c->moe.shared_inner % size)
        what = "shared_expert_intermediate_size", v = c->moe.shared_inner;
    if (!what && c->vocab % size) what = "vocab_size", v = c->vocab;
    int linear = 0; /* Gated DeltaNet layers: their key and value heads are shared out */
    for (int l = 0; l < c->n_layers && c->layer_kinds; l++)
        linear |= c->layer_kinds[l] == LAYER_LINEAR;
    if (!what && linear && c->lin.n_k_heads % size)
        what = "linear_num_key_heads", v = c->lin.n_k_heads;
    if (!what && linear && c->lin.n_v_heads % size)
        what = "linear_num_value_heads", v = c->lin.n_v_heads;
    if (what)
        return err_set(e,
                       "%s: config.json has %d %s, which do not divide into "
                       "--tensor-parallel-size %d parts",
                       dir, v, what, size);
    /* down_proj's share of the inputs on whole quantization groups (take_share) */
    const struct quant_spec *q = &c->quant;
    const char *field[3] = {dense ? "intermediate_size" : NULL,
                            c->moe.n_experts ? "moe_intermediate_size" : NULL,
                            c->moe.n_experts ? "shared_expert_intermediate_size" : NULL};
    int width[3] = {c->ffn, c->moe.inner, c->moe.shared_inner};
    for (int i = 0; i < 3 && q->mode != QMODE_NONE; i++)
        if (field[i] && width[i] &&
            split_group(width[i] / size, q->group, q->mode == QMODE_AFFINE) < 0)
            return err_set(e,
                           "%s: config.json's %s %d split %d ways (--tensor-parallel-size) leaves "
                           "each rank %d inputs of down_proj, which do not fall on whole "
                           "quantization groups of %d%s",
                           dir, field[i], width[i], size, width[i] / size, q->group,
                           q->mode == QMODE_AFFINE ? " or of 32 or more" : "");
    c->n_heads /= size;
    m->kv_parts = kvh < size ? kvh : size;
    m->kv_part = rank * m->kv_parts / size;
    c->n_kv_heads = kvh / m->kv_parts;
    m->layer_kv_parts = xmalloc(sizeof(int) * (size_t)c->n_layers);
    c->max_kv_dim = 0;
    for (int l = 0; l < c->n_layers; l++) {
        int h = c->layer_kv_heads[l], parts = h < size ? h : size;
        m->layer_kv_parts[l] = parts;
        c->layer_kv_heads[l] = h / parts;
        int kv = c->layer_kv_heads[l] * c->layer_head_dim[l];
        if (kv > c->max_kv_dim) c->max_kv_dim = kv;
    }
    c->ffn /= size;
    c->moe.inner /= size; /* each expert's share: gate/up by rows, down by columns */
    c->moe.shared_inner /= size;
    if (linear) {
        c->lin.n_k_heads /= size;
        c->lin.n_v_heads /= size;
    }
    m->vocab_part = c->vocab / size;
    return 0;
}

void model_kv_share_layer(struct model *m, int l)
{
    if (!m->layer_kv_parts) return;
    m->kv_parts = m->layer_kv_parts[l];
    m->kv_part = m->tp_rank * m->kv_parts / m->tp_size;
}

struct model *model_load(const char *dir, struct backend *be, struct err *e)
{
    return model_load_rank(dir, be, 0, 1, e);
}

struct model *model_load_rank(const char *dir, struct backend *be, int rank, int size,
                              struct err *e)
{
    struct model *m = xcalloc(1, sizeof *m);
    m->be = be;
    if (config_load(&m->cfg, dir, e)) {
        free(m);
        return NULL;
    }
    const struct model_config *c = &m->cfg;
    if (check_ops(m, dir, e) || tp_share(m, dir, rank, size, e)) {
        /* first: what the backend cannot run is named as such */
        config_dispose(&m->cfg);
        free(m);
        return NULL;
    }
    struct err be_err;
    for (int l = 0; l < c->n_layers && be->ops->attn_check; l++) {
        int d = c->layer_head_dim[l], kv = c->layer_kv_heads[l];
        if (l > 0 && d == c->layer_head_dim[l - 1] && kv == c->layer_kv_heads[l - 1]) continue;
        if (be->ops->attn_check(be->ctx, d, c->n_heads, kv, &be_err)) {
            err_set(e, "%s: config.json head_dim %d (%d query heads, %d KV heads): %s", dir, d,
                    c->n_heads, kv, be_err.msg);
            config_dispose(&m->cfg);
            free(m);
            return NULL;
        }
    }
    if (st_open(&m->st, dir, e) || load_weights(m, e)) {
        model_destroy(m);
        return NULL;
    }
    m->rope_shared = rope_equal(&m->cfg.rope_full, &m->cfg.rope_sliding) &&
                     m->cfg.rope_dims[0] == m->cfg.rope_dims[1];
    for (int i = 0; i < 2; i++) {
        int d = m->cfg.rope_dims[i];
        m->rope_inv_freq[i] = xmalloc(sizeof(float) * (size_t)(d / 2));
        m->rope_mscale[i] = rope_inv_freq(i == 0 ? &m->cfg.rope_full : &m->cfg.rope_sliding, d,
                                          m->rope_inv_freq[i]);
    }
    return m;
}

static int n_attn_layers(const struct model_config *c)
{
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += c->layer_kinds[l] != LAYER_LINEAR;
    return n;
}

/* Whether layer l stores K and V: an attention layer that reads no earlier layer's. */
static int owns_kv(const struct model_config *c, int l)
{
    return c->layer_kinds[l] != LAYER_LINEAR && c->kv_source[l] == l;
}

size_t model_kv_bytes_per_token(const struct model *m)
{
    const struct model_config *c = &m->cfg;
    size_t vb = m->be->ops->kv_value_bytes > 0 ? (size_t)m->be->ops->kv_value_bytes : sizeof(float);
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (owns_kv(c, l)) n += (size_t)2 * c->layer_kv_heads[l] * c->layer_head_dim[l] * vb;
    return n;
}

/* The formats layer l's K and V are stored in under s: both auto when s is auto on both
 * sides or skips the layer, else both set, auto resolving to the backend's own value type. */
static void layer_dtypes(const struct model *m, const struct kv_spec *s, int l, int *kd, int *vd)
{
    *kd = *vd = KV_DTYPE_AUTO;
    if ((s->k == KV_DTYPE_AUTO && s->v == KV_DTYPE_AUTO) || kv_spec_skips(s, l, m->cfg.n_layers))
        return;
    int native = m->be->ops->kv_value_bytes == 2 ? KV_DTYPE_BF16 : KV_DTYPE_F32;
    *kd = s->k ? s->k : native;
    *vd = s->v ? s->v : native;
}

size_t model_kv_bytes_per_block(const struct model *m, const struct kv_spec *spec, int block_size)
{
    const struct model_config *c = &m->cfg;
    if (!spec) spec = &m->kv_spec;
    size_t vb = m->be->ops->kv_value_bytes > 0 ? (size_t)m->be->ops->kv_value_bytes : sizeof(float);
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (!owns_kv(c, l)) continue;
        int kd, vd, h = c->layer_kv_heads[l], d = c->layer_head_dim[l];
        layer_dtypes(m, spec, l, &kd, &vd);
        if (kd == KV_DTYPE_AUTO)
            n += (size_t)2 * block_size * h * d * vb;
        else
            n += (size_t)h * (kv_head_block_bytes(kd, KV_ROLE_K, block_size, d) +
                              kv_head_block_bytes(vd, KV_ROLE_V, block_size, d));
    }
    return n;
}

int model_set_kv_format(struct model *m, const struct kv_spec *s, struct err *e)
{
    if (m->tp) return tpg_set_kv_format(m->tp, s, e);
    return model_set_kv_format_rank(m, s, e);
}

int model_set_kv_format_rank(struct model *m, const struct kv_spec *s, struct err *e)
{
    const struct model_config *c = &m->cfg;
    uint32_t have = m->be->ops->kv_dtypes;
    int want[2] = {s->k, s->v};
    for (int i = 0; i < 2; i++)
        if (want[i] != KV_DTYPE_AUTO && !(have >> want[i] & 1u))
            return err_set(e, "the %s backend has no KV cache format %s (it has auto%s)",
                           m->be->ops->name, kv_dtype_name(want[i]),
                           have ? " and others" : " only");
    for (int i = 0; i < s->n_skip; i++)
        if (s->skip[i] >= c->n_layers || s->skip[i] < -c->n_layers)
            return err_set(e, "--kv-cache-skip-layers: layer %d of a model of %d layers",
                           (int)s->skip[i], c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        if (!owns_kv(c, l)) continue;
        int kd, vd;
        layer_dtypes(m, s, l, &kd, &vd);
        if (kv_dtype_check(kd, c->layer_head_dim[l], 1, e) ||
            kv_dtype_check(vd, c->layer_head_dim[l], 1, e))
            return err_wrap(e, "layer %d", l);
    }
    m->kv_spec = *s;
    return 0;
}

/* A checkpoint's fp8 KV scale (llm-compressor / vLLM: self_attn.k_scale and v_scale, one
 * value each; older checkpoints: one self_attn.kv_scale for both), or 0 when the checkpoint
 * has none or holds no usable one (not positive, not finite). A scale of several values
 * (per head) is refused: reading only its first would quantize the other heads wrongly. */
static int kv_ckpt_scale(const struct model *m, int l, const char *which, float *out, struct err *e)
{
    char n[160];
    *out = 0;
    snprintf(n, sizeof n, "%slayers.%d.self_attn.%s", m->prefix, l, which);
    const struct st_tensor *t = st_find(&m->st, n);
    if (!t) {
        snprintf(n, sizeof n, "%slayers.%d.self_attn.kv_scale", m->prefix, l);
        t = st_find(&m->st, n);
    }
    if (!t) return 0;
    if (st_numel(t) != 1)
        return err_set(e, "%s: a KV scale of %lld values (only one scale a layer is supported)", n,
                       (long long)st_numel(t));
    float v = 0;
    if (t->dtype == ST_F32)
        memcpy(&v, t->data, 4);
    else if (t->dtype == ST_BF16)
        v = bf16_to_f32(*(const uint16_t *)t->data);
    else if (t->dtype == ST_F16)
        v = f16_to_f32(*(const uint16_t *)t->data);
    else
        return err_set(e, "%s: a KV scale must be F32, BF16 or F16", n);
    *out = v > 0 && isfinite(v) ? v : 0;
    return 0;
}

/* Floats of one slot of one linear-attention layer: the conv tail, then the matrix. */
static void state_floats(const struct model_config *c, size_t *conv, size_t *rec)
{
    const struct linear_config *L = &c->lin;
    size_t conv_dim = (size_t)2 * L->n_k_heads * L->k_dim + (size_t)L->n_v_heads * L->v_dim;
    *conv = (size_t)(L->conv_k > 0 ? L->conv_k - 1 : 0) * conv_dim;
    *rec = (size_t)L->n_v_heads * L->k_dim * L->v_dim;
}

size_t model_state_bytes(const struct model *m)
{
    const struct model_config *c = &m->cfg;
    size_t conv, rec;
    state_floats(c, &conv, &rec);
    return (size_t)(c->n_layers - n_attn_layers(c)) * (conv + rec) * sizeof(float);
}

void model_state_copy(struct model *m, int dst, int src)
{
    if (m->tp) {
        tpg_state_copy(m->tp, dst, src);
        return;
    }
    model_state_copy_rank(m, dst, src);
}

void model_state_copy_rank(struct model *m, int dst, int src)
{
    const struct model_config *c = &m->cfg;
    size_t conv, rec;
    state_floats(c, &conv, &rec);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kinds[l] != LAYER_LINEAR) continue;
        struct state_layer *s = &m->state[l];
        m->be->ops->copy(m->be->ctx, s->conv + conv * (size_t)dst, s->conv + conv * (size_t)src,
                         conv * sizeof(float));
        m->be->ops->copy(m->be->ctx, s->rec + rec * (size_t)dst, s->rec + rec * (size_t)src,
                         rec * sizeof(float));
    }
}

void model_state_read(struct model *m, int slot, void *dst)
{
    const struct model_config *c = &m->cfg;
    size_t conv, rec;
    state_floats(c, &conv, &rec);
    float *p = dst;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kinds[l] != LAYER_LINEAR) continue;
        struct state_layer *s = &m->state[l];
        m->be->ops->download(m->be->ctx, p, s->conv + conv * (size_t)slot, conv * sizeof(float));
        m->be->ops->download(m->be->ctx, p + conv, s->rec + rec * (size_t)slot,
                             rec * sizeof(float));
        p += conv + rec;
    }
}

void model_state_write(struct model *m, int slot, const void *src)
{
    const struct model_config *c = &m->cfg;
    size_t conv, rec;
    state_floats(c, &conv, &rec);
    const float *p = src;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kinds[l] != LAYER_LINEAR) continue;
        struct state_layer *s = &m->state[l];
        m->be->ops->upload(m->be->ctx, s->conv + conv * (size_t)slot, p, conv * sizeof(float));
        m->be->ops->upload(m->be->ctx, s->rec + rec * (size_t)slot, p + conv, rec * sizeof(float));
        p += conv + rec;
    }
}

int model_state_pieces(const struct model *m, void **base, size_t *bytes)
{
    const struct model_config *c = &m->cfg;
    size_t conv, rec;
    state_floats(c, &conv, &rec);
    int n = 0;
    for (int l = 0; l < c->n_layers && m->state; l++) {
        if (!c->layer_kinds || c->layer_kinds[l] != LAYER_LINEAR) continue;
        base[n] = m->state[l].conv;
        bytes[n++] = conv * sizeof(float);
        base[n] = m->state[l].rec;
        bytes[n++] = rec * sizeof(float);
    }
    return n;
}

int model_state_alloc(struct model *m, int max_tokens, int max_logits, int n_blocks, int block_size,
                      int n_states, struct err *e)
{
    if (m->tp)
        return tpg_state_alloc(m->tp, max_tokens, max_logits, n_blocks, block_size, n_states, e);
    return model_state_alloc_rank(m, max_tokens, max_logits, n_blocks, block_size, n_states, e);
}

int model_state_alloc_rank(struct model *m, int max_tokens, int max_logits, int n_blocks,
                           int block_size, int n_states, struct err *e)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    size_t T = (size_t)max_tokens, H = (size_t)c->hidden, D = (size_t)c->max_head_dim;
    size_t qdim = (size_t)c->n_heads * D, kvdim = (size_t)c->max_kv_dim;
    size_t R = (size_t)(c->rope_dims[0] > c->rope_dims[1] ? c->rope_dims[0] : c->rope_dims[1]);
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
    size_t F = (size_t)c->ffn;
    if (c->ffn_double_wide) F *= 2;
    if ((size_t)c->moe.shared_inner > F) F = (size_t)c->moe.shared_inner;
    m->gate = A(T * F);
    m->up = A(T * F);
    m->xl = A((size_t)max_logits * H);
    m->logits = A((size_t)max_logits * (size_t)c->vocab);
    if (m->tp_size > 1) {
        m->tp_tokens = xmalloc(sizeof(int32_t) * T);
        m->logits_part = A((size_t)max_logits * (size_t)m->vocab_part);
        if (!m->logits_part) return err_set(e, "out of memory for %d rows of logits", max_logits);
    }
    for (int i = 0; i < 2; i++) {
        size_t half = (size_t)c->rope_dims[i] / 2;
        m->rope_cos[i] = A(T * R / 2);
        m->rope_sin[i] = A(T * R / 2);
        if (o->rope_tables) {
            m->rope_inv_dev[i] = A(half);
            if (m->rope_inv_dev[i])
                o->upload(ctx, m->rope_inv_dev[i], m->rope_inv_freq[i], sizeof(float) * half);
        }
    }
    m->host_cos = xmalloc(sizeof(float) * T * R / 2);
    m->host_sin = xmalloc(sizeof(float) * T * R / 2);
    m->kv = xcalloc((size_t)c->n_layers, sizeof *m->kv);
    m->kvg = xcalloc((size_t)c->n_layers, sizeof *m->kvg);
    m->state = xcalloc((size_t)c->n_layers, sizeof *m->state);
    size_t vb = o->kv_value_bytes > 0 ? (size_t)o->kv_value_bytes : sizeof(float);
    if (c->ple_dim) {
        size_t LP = (size_t)c->n_layers * (size_t)c->ple_dim;
        m->ple = A(T * LP);
        m->ple_in = A(T * LP);
        m->ple_g = A(T * (size_t)c->ple_dim);
        m->ple_rows = xmalloc(sizeof(int32_t) * T * (size_t)c->n_layers);
        if (!m->ple || !m->ple_in || !m->ple_g)
            return err_set(e, "out of memory for the per-layer inputs of %d tokens", max_tokens);
    }
    if (c->attn_gate) {
        m->qg = A(T * qdim * 2);
        m->qgate = A(T * qdim);
    }
    if (c->moe.n_experts) {
        m->router = A(T * (size_t)c->moe.n_experts);
        m->moe_out = A(T * H);
        m->shared_g = A(T);
    }
    size_t conv_n, rec_n;
    state_floats(c, &conv_n, &rec_n);
    const struct linear_config *lc = &c->lin;
    size_t vdim = (size_t)lc->n_v_heads * lc->v_dim;
    m->n_states = n_states;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kinds[l] != LAYER_LINEAR) continue;
        if (!m->lin_qkv) {
            m->lin_qkv = A(T * (2 * (size_t)lc->n_k_heads * lc->k_dim + vdim));
            m->lin_z = A(T * vdim);
            m->lin_b = A(T * (size_t)lc->n_v_heads);
            m->lin_a = A(T * (size_t)lc->n_v_heads);
            m->lin_out = A(T * vdim);
        }
        m->state[l].conv = A((size_t)n_states * conv_n + 1);
        m->state[l].rec = A((size_t)n_states * rec_n + 1);
        if (!m->state[l].conv || !m->state[l].rec)
            return err_set(e, "out of memory for the recurrent states (%d slots of %zu bytes)",
                           n_states, model_state_bytes(m));
    }
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kinds[l] == LAYER_LINEAR) continue;
        int src = c->kv_source[l], kd, vd, h = c->layer_kv_heads[src], d = c->layer_head_dim[src];
        layer_dtypes(m, &m->kv_spec, src, &kd, &vd);
        m->kvg[l] = (struct kv_geom){n_blocks, block_size, h, d, kd, vd, 0, 0};
        if ((kd == KV_DTYPE_FP8 && kv_ckpt_scale(m, src, "k_scale", &m->kvg[l].k_scale, e)) ||
            (vd == KV_DTYPE_FP8 && kv_ckpt_scale(m, src, "v_scale", &m->kvg[l].v_scale, e)))
            return -1;
        if (!owns_kv(c, l)) continue; /* it reads its source's storage */
        size_t k_bytes = (size_t)n_blocks * block_size * (size_t)h * (size_t)d * vb,
               v_bytes = k_bytes;
        if (kd != KV_DTYPE_AUTO) {
            k_bytes = (size_t)n_blocks * h * kv_head_block_bytes(kd, KV_ROLE_K, block_size, d);
            v_bytes = (size_t)n_blocks * h * kv_head_block_bytes(vd, KV_ROLE_V, block_size, d);
        }
        m->kv[l].k = o->alloc(ctx, k_bytes);
        m->kv[l].v = o->alloc(ctx, v_bytes);
        if (!m->kv[l].k || !m->kv[l].v)
            return err_set(e, "out of memory for the KV cache (%d blocks of %d tokens)", n_blocks,
                           block_size);
    }
#undef A
    if (!m->x || !m->h || !m->gate || !m->up || !m->logits)
        return err_set(e, "out of memory for step buffers of %d tokens", max_tokens);
    return 0;
}

int model_hidden_alloc(struct model *m, int max_rows, struct err *e)
{
    if (m->tp) return tpg_hidden_alloc(m->tp, max_rows, e);
    return model_hidden_alloc_rank(m, max_rows, e);
}

int model_hidden_alloc_rank(struct model *m, int max_rows, struct err *e)
{
    if (m->hid) m->be->ops->free(m->be->ctx, m->hid);
    m->hid = m->be->ops->alloc(m->be->ctx, sizeof(float) * (size_t)max_rows * m->cfg.hidden);
    m->max_hidden = m->hid ? max_rows : 0;
    if (!m->hid) return err_set(e, "out of memory for %d hidden rows of a step", max_rows);
    return 0;
}

int model_aux_alloc(struct model *m, const int *layers, int n, struct err *e)
{
    m->aux = m->be->ops->alloc(m->be->ctx,
                               sizeof(float) * (size_t)n * m->max_tokens * (size_t)m->cfg.hidden);
    if (!m->aux)
        return err_set(e, "out of memory for %d hidden rows of %d layers", m->max_tokens, n);
    m->n_aux = n;
    memcpy(m->aux_layer, layers, sizeof(int) * (size_t)n);
    return 0;
}

void model_destroy(struct model *m)
{
    if (!m) return;
    if (m->tp) tpg_destroy(m->tp); /* the other ranks first */
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    struct model_tensors *t = &m->tensors;
    for (int i = 0; i < t->n_vecs; i++) o->free(ctx, t->vecs[i]);
    free(t->vecs);
    free(t->vec_len);
    free(t->linears);
    free(m->layers);
    float *bufs[] = {m->ple,
                     m->ple_in,
                     m->ple_g,
                     m->qg,
                     m->qgate,
                     m->lin_qkv,
                     m->lin_z,
                     m->lin_b,
                     m->lin_a,
                     m->lin_out,
                     m->router,
                     m->moe_out,
                     m->shared_g,
                     m->x,
                     m->h,
                     m->q,
                     m->k,
                     m->v,
                     m->att,
                     m->gate,
                     m->up,
                     m->xl,
                     m->logits,
                     m->logits_part,
                     m->hid,
                     m->aux,
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
    if (m->state) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            if (m->state[l].conv) o->free(ctx, m->state[l].conv);
            if (m->state[l].rec) o->free(ctx, m->state[l].rec);
        }
        free(m->state);
    }
    free(m->experts);
    free(m->kvg);
    free(m->ple_rows);
    free(m->host_scales);
    free(m->host_cos);
    free(m->host_sin);
    free(m->rope_inv_freq[0]);
    free(m->rope_inv_freq[1]);
    free(m->tp_tokens);
    for (int i = 0; i < m->n_host_blobs; i++) free(m->host_blobs[i]);
    free(m->host_blobs);
    free(m->layer_kv_parts);
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
    if (m->tp_size > 1) { /* the rank's shares (and its whole embedding) */
        const struct model_tensors *t = &m->tensors;
        for (int i = 0; i < t->n_linears; i++) n += qweight_bytes(t->linears[i]);
        for (int i = 0; i < t->n_vecs; i++) n += sizeof(float) * (size_t)t->vec_len[i];
        return n;
    }
    for (int i = 0; i < m->st.ntensors; i++) n += m->st.tensors[i].nbytes;
    return n;
}
