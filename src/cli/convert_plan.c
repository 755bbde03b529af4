/* convert_plan: which output tensors `pagoda convert` writes and where their bytes come from. */
#include <cjson/cJSON.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/convert.h"
#include "common/util.h"
#include "model/config.h"

/* The MLX quantization a source folder declares: a default and per-module entries. */
struct src_quant {
    int present;
    struct quant_target def;
    const cJSON *entries; /* the object, for per-module lookups */
};

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int is_float(enum st_dtype t)
{
    return t == ST_F32 || t == ST_F16 || t == ST_BF16;
}

static enum wfmt float_fmt(enum st_dtype t)
{
    return t == ST_F32 ? WFMT_F32 : t == ST_F16 ? WFMT_F16 : WFMT_BF16;
}

/* One quantization entry (the default or a module's) over `def`; *off when it is false. */
static int parse_spec(const cJSON *q, const struct quant_target *def, const char *where,
                      struct quant_target *out, int *off, struct err *e)
{
    *out = *def;
    *off = cJSON_IsFalse(q);
    if (*off) return 0;
    if (!cJSON_IsObject(q))
        return err_set(e, "config.json: quantization '%s' must be an object", where);
    const cJSON *mode = config_get(q, "mode");
    if (mode) {
        const char *m = cJSON_IsString(mode) ? mode->valuestring : "";
        if (!strcmp(m, "affine"))
            *out = (struct quant_target){WFMT_AFFINE, 4, 64, ST_BF16};
        else if (!strcmp(m, "mxfp4"))
            *out = (struct quant_target){WFMT_MXFP4, 4, 32, ST_U8};
        else if (!strcmp(m, "mxfp8"))
            *out = (struct quant_target){WFMT_MXFP8, 8, 32, ST_U8};
        else if (!strcmp(m, "nvfp4"))
            *out = (struct quant_target){WFMT_NVFP4, 4, 16, ST_U8};
        else
            return err_set(e, "config.json: quantization '%s': mode '%s' is not supported", where,
                           m);
    }
    if (config_get_int(q, "bits", out->bits, &out->bits, e) ||
        config_get_int(q, "group_size", out->group, &out->group, e))
        return -1;
    int ok = out->fmt == WFMT_AFFINE
                 ? (out->bits >= 2 && out->bits <= 8 && out->bits != 7) &&
                       (out->group == 32 || out->group == 64 || out->group == 128)
             : out->fmt == WFMT_NVFP4 ? out->bits == 4 && out->group == 16
             : out->fmt == WFMT_MXFP8 ? out->bits == 8 && out->group == 32
                                      : out->bits == 4 && out->group == 32;
    if (!ok)
        return err_set(e,
                       "config.json: quantization '%s': %d bits at group size %d is not supported",
                       where, out->bits, out->group);
    return 0;
}

static int parse_src_quant(const cJSON *cfg, struct src_quant *sq, struct err *e)
{
    memset(sq, 0, sizeof *sq);
    const cJSON *q = config_get(cfg, "quantization");
    if (!q) q = config_get(cfg, "quantization_config");
    if (!q) return 0;
    /* Hugging Face's own quantization_config (GPTQ, AWQ, fp8, ...) names a quant_method */
    const cJSON *qm = config_get(q, "quant_method");
    if (qm)
        return err_set(e,
                       "config.json: quantization_config of quant_method '%s' is not "
                       "supported (only bf16, f16, f32 and MLX's formats are read)",
                       cJSON_IsString(qm) ? qm->valuestring : "?");
    struct quant_target def = {WFMT_AFFINE, 4, 64, ST_BF16};
    int off;
    if (parse_spec(q, &def, "quantization", &sq->def, &off, e)) return -1;
    sq->present = !off;
    sq->entries = q;
    return 0;
}

/* The stored format of module `module` in the source; -1 when none is declared for it. */
static int src_quant_for(const struct src_quant *sq, const char *module, struct quant_target *q,
                         struct err *e)
{
    if (!sq->present)
        return err_set(e,
                       "tensor '%s.weight' has scales but config.json declares no MLX "
                       "quantization",
                       module);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(sq->entries, module);
    int off = 0;
    if (!it || (!cJSON_IsObject(it) && !cJSON_IsFalse(it))) {
        *q = sq->def;
        return 0;
    }
    if (parse_spec(it, &sq->def, module, q, &off, e)) return -1;
    if (off)
        return err_set(e,
                       "tensor '%s.weight' has scales but config.json says the module is "
                       "not quantized",
                       module);
    return 0;
}

/* Checks that t has shape [..lead, n, cols] with the leading dimensions of w. */
static int same_lead(const struct st_tensor *t, const struct st_tensor *w, int64_t cols,
                     struct err *e)
{
    int ok = t->ndim == w->ndim && t->shape[t->ndim - 1] == cols;
    for (int d = 0; ok && d < w->ndim - 1; d++) ok = t->shape[d] == w->shape[d];
    char a[96], b[96];
    if (!ok)
        return err_set(e, "%s: tensor '%s': shape %s does not fit its weight %s", t->file, t->name,
                       st_shape_str(t->shape, t->ndim, a, sizeof a),
                       st_shape_str(w->shape, w->ndim, b, sizeof b));
    return 0;
}

/* The matrix of tensor t ([n, k] or [E, n, k] floats, or MLX codes [.., n, k * bits / 32]
 * with `module`.scales / .biases); *sdt the float dtype its values come in. */
static int matrix_of(const struct safetensors *st, const struct st_tensor *t, const char *module,
                     const struct src_quant *sq, struct cv_matrix *m, enum st_dtype *sdt,
                     struct err *e)
{
    char name[1024];
    snprintf(name, sizeof name, "%s.scales", module);
    const struct st_tensor *sc = st_find(st, name), *bi = NULL;
    struct quant_target q = {float_fmt(t->dtype), (int)st_dtype_size(t->dtype) * 8, 0, ST_U8};
    if (t->ndim != 2 && t->ndim != 3)
        return err_set(e, "%s: tensor '%s': a matrix must have 2 or 3 dimensions", t->file,
                       t->name);
    int64_t cols = t->shape[t->ndim - 1], k = cols;
    if (sc) {
        if (t->dtype != ST_U32)
            return err_set(e, "%s: tensor '%s': quantized weights must be U32, not %s", t->file,
                           t->name, st_dtype_name(t->dtype));
        if (src_quant_for(sq, module, &q, e)) return -1;
        k = cols * 32 / q.bits;
        if ((cols * 32) % q.bits || k % q.group)
            return err_set(e, "%s: tensor '%s': %lld columns do not hold groups of %d at %d bits",
                           t->file, t->name, (long long)cols, q.group, q.bits);
        if (same_lead(sc, t, k / q.group, e)) return -1;
        int affine = q.fmt == WFMT_AFFINE;
        if (affine ? !is_float(sc->dtype) : sc->dtype != ST_U8)
            return err_set(e, "%s: tensor '%s': dtype %s is not one of this format's scales",
                           sc->file, sc->name, st_dtype_name(sc->dtype));
        if (affine) {
            snprintf(name, sizeof name, "%s.biases", module);
            if (!(bi = st_find(st, name)))
                return err_set(e, "tensor '%s' is missing (affine weights need biases)", name);
            if (same_lead(bi, t, k / q.group, e)) return -1;
            if (bi->dtype != sc->dtype)
                return err_set(e, "%s: tensor '%s': dtype %s differs from its scales'", bi->file,
                               bi->name, st_dtype_name(bi->dtype));
        }
        *sdt = affine && sc->dtype != ST_F32 ? sc->dtype : ST_BF16;
    } else if (!is_float(t->dtype)) {
        return err_set(e,
                       "%s: tensor '%s': dtype %s is not a weight type (need F32, F16, BF16, "
                       "or U32 with scales)",
                       t->file, t->name, st_dtype_name(t->dtype));
    } else {
        *sdt = t->dtype;
    }
    m->n_parts = t->ndim == 3 ? (int)t->shape[0] : 1;
    m->n = t->shape[t->ndim - 2];
    m->k = k;
    m->parts = xcalloc((size_t)m->n_parts, sizeof *m->parts);
    size_t wrow = (size_t)cols * st_dtype_size(t->dtype), groups = (size_t)(sc ? k / q.group : 0);
    size_t ssz = sc ? st_dtype_size(sc->dtype) : 0;
    for (int p = 0; p < m->n_parts; p++) {
        size_t r0 = (size_t)p * (size_t)m->n;
        m->parts[p] = (struct qweight){.fmt = q.fmt,
                                       .bits = q.bits,
                                       .group = q.group,
                                       .n = m->n,
                                       .k = k,
                                       .w = (const uint8_t *)t->data + r0 * wrow,
                                       .row_bytes = wrow,
                                       .sdtype = sc ? sc->dtype : ST_U8};
        if (sc) m->parts[p].scales = (const uint8_t *)sc->data + r0 * groups * ssz;
        if (bi) m->parts[p].biases = (const uint8_t *)bi->data + r0 * groups * ssz;
    }
    return 0;
}

int cv_module_matches(const char *module, const char *pattern)
{
    if (strpbrk(pattern, "*?[")) return fnmatch(pattern, module, 0) == 0;
    size_t pl = strlen(pattern);
    if (!pl) return 0;
    for (const char *p = module; (p = strstr(p, pattern)) != NULL; p++)
        if ((p == module || p[-1] == '.') && (p[pl] == 0 || p[pl] == '.')) return 1;
    return 0;
}

static struct cv_tensor *add(struct cv_plan *p, const char *name, enum st_dtype dt, int ndim,
                             const int64_t *shape, enum cv_kind kind)
{
    p->t = xrealloc(p->t, (size_t)(p->n + 1) * sizeof *p->t);
    struct cv_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    t->dt = dt;
    t->ndim = ndim;
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= (size_t)(t->shape[d] = shape[d]);
    t->bytes = numel * st_dtype_size(dt);
    t->kind = kind;
    return t;
}

static struct cv_matrix *keep_matrix(struct cv_plan *p, const struct cv_matrix *m)
{
    struct cv_matrix *c = xmalloc(sizeof *c);
    *c = *m;
    p->mats = xrealloc(p->mats, (size_t)(p->n_mats + 1) * sizeof *p->mats);
    p->mats[p->n_mats++] = c;
    if (m->k > p->max_k) p->max_k = m->k;
    return c;
}

/* Output tensors of a matrix for a quantized target: module.weight / .scales / .biases, or
 * the matrix unquantized when its rows do not divide into groups or it has a single row (a
 * gate of one output, kept as MLX's conversions keep it). */
static void add_quantized(struct cv_plan *p, const struct cv_options *o, const char *module,
                          struct cv_matrix *m, int lead, enum st_dtype sdt,
                          const struct st_tensor *src, int *keep8_hits)
{
    int64_t shape[3] = {m->n_parts};
    char name[1024];
    struct quant_target q = o->q;
    int eight = 0;
    for (int i = 0; i < o->n_keep8; i++)
        if (cv_module_matches(module, o->keep8[i])) {
            keep8_hits[i]++;
            eight = m->k % o->q8.group == 0;
        }
    if (eight) q = o->q8;
    if (m->k % q.group || m->n < 2) {
        snprintf(name, sizeof name, "%s.weight", module);
        if (src) { /* stored as floats already: as it is */
            add(p, name, src->dtype, src->ndim, src->shape, CV_RAW)->src = src;
            free(m->parts);
            return;
        }
        shape[lead] = m->n;
        shape[lead + 1] = m->k;
        add(p, name, sdt, lead + 2, shape, CV_FLOAT)->m = keep_matrix(p, m);
        return;
    }
    if (q.fmt == WFMT_AFFINE) q.sdtype = sdt == ST_F16 ? ST_F16 : ST_BF16;
    m->q = q;
    struct cv_matrix *km = keep_matrix(p, m);
    shape[lead] = m->n;
    shape[lead + 1] = m->k * q.bits / 32;
    snprintf(name, sizeof name, "%s.weight", module);
    add(p, name, ST_U32, lead + 2, shape, CV_CODES)->m = km;
    shape[lead + 1] = m->k / q.group;
    snprintf(name, sizeof name, "%s.scales", module);
    add(p, name, q.fmt == WFMT_AFFINE ? q.sdtype : ST_U8, lead + 2, shape, CV_SCALES)->m = km;
    if (q.fmt == WFMT_AFFINE) {
        snprintf(name, sizeof name, "%s.biases", module);
        add(p, name, q.sdtype, lead + 2, shape, CV_BIASES)->m = km;
    }
    if (eight) {
        p->ov = xrealloc(p->ov, (size_t)(p->n_ov + 1) * sizeof *p->ov);
        p->ov[p->n_ov++] = (struct cv_override){xstrdup(module), q};
    }
}

/* Hugging Face experts `X.experts.<e>.<proj>.weight`, e = 0 .. E-1, all [n, k] of one float
 * dtype: stacked into one matrix of E parts (MLX's X.switch_mlp.<proj>). Returns E, or 0 when
 * t is not expert 0 of a complete set. */
static int expert_stack(const struct safetensors *st, const struct st_tensor *t, char *prefix,
                        char *proj, struct cv_matrix *m, char *consumed)
{
    const char *x = strstr(t->name, ".experts.0.");
    if (!x || !is_float(t->dtype) || t->ndim != 2) return 0;
    const char *pr = x + strlen(".experts.0.");
    if (strcmp(pr, "gate_proj.weight") && strcmp(pr, "up_proj.weight") &&
        strcmp(pr, "down_proj.weight"))
        return 0;
    snprintf(prefix, 512, "%.*s", (int)(x - t->name), t->name);
    snprintf(proj, 32, "%.*s", (int)(strlen(pr) - strlen(".weight")), pr);
    int n = 0;
    char name[1024];
    for (;; n++) {
        snprintf(name, sizeof name, "%s.experts.%d.%s.weight", prefix, n, proj);
        const struct st_tensor *u = st_find(st, name);
        if (!u || u->dtype != t->dtype || u->ndim != 2 || u->shape[0] != t->shape[0] ||
            u->shape[1] != t->shape[1])
            break;
    }
    m->n_parts = n;
    m->n = t->shape[0];
    m->k = t->shape[1];
    m->parts = xcalloc((size_t)n, sizeof *m->parts);
    size_t rb = (size_t)m->k * st_dtype_size(t->dtype);
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s.experts.%d.%s.weight", prefix, i, proj);
        const struct st_tensor *u = st_find(st, name);
        consumed[u - st->tensors] = 1;
        m->parts[i] = (struct qweight){.fmt = float_fmt(u->dtype),
                                       .bits = (int)st_dtype_size(u->dtype) * 8,
                                       .n = m->n,
                                       .k = m->k,
                                       .w = u->data,
                                       .row_bytes = rb};
    }
    return n;
}

/* A depthwise convolution [C, 1, K] (Hugging Face) or [C, K, 1] (MLX) in the target's layout;
 * the bytes are the same, only the shape says which. */
static void conv_shape(const struct st_tensor *t, int mlx, int64_t *shape)
{
    memcpy(shape, t->shape, sizeof t->shape);
    if (t->ndim != 3 || !strstr(t->name, "conv1d.weight")) return;
    if (mlx && shape[1] == 1 && shape[2] != 1) {
        shape[1] = shape[2];
        shape[2] = 1;
    } else if (!mlx && shape[2] == 1 && shape[1] != 1) {
        shape[2] = shape[1];
        shape[1] = 1;
    }
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct cv_tensor *)a)->name, ((const struct cv_tensor *)b)->name);
}

/* Bf16 / f16 target: a matrix of MLX experts X.switch_mlp.<proj> [E, n, k] becomes Hugging
 * Face's X.experts.<e>.<proj>.weight, each [n, k]. */
static void add_unstacked(struct cv_plan *p, const struct cv_options *o, const char *name,
                          struct cv_matrix *m)
{
    const char *s = strstr(name, ".switch_mlp.");
    const char *proj = s + strlen(".switch_mlp.");
    int plen = (int)(strlen(proj) - strlen(".weight"));
    for (int i = 0; i < m->n_parts; i++) {
        struct cv_matrix one = *m;
        one.parts = xmalloc(sizeof *one.parts);
        one.parts[0] = m->parts[i];
        one.n_parts = 1;
        char out[1024];
        snprintf(out, sizeof out, "%.*s.experts.%d.%.*s.weight", (int)(s - name), name, i, plen,
                 proj);
        int64_t shape[2] = {m->n, m->k};
        add(p, out, o->fdt, 2, shape, CV_FLOAT)->m = keep_matrix(p, &one);
    }
    free(m->parts);
}

/* Quantized target: Gemma 4's fused Hugging Face experts X.experts.gate_up_proj [E, 2I, H]
 * become MLX's X.experts.switch_glu.gate_proj and .up_proj [E, I, H] (the first and second
 * half of each expert's rows), and X.experts.down_proj [E, H, I] its switch_glu.down_proj.
 * Returns 1 when t was one of them (planned), else 0. */
static int fused_to_switch_glu(struct cv_plan *p, const struct cv_options *o,
                               const struct st_tensor *t, int *hits)
{
    static const char gu[] = ".experts.gate_up_proj", dn[] = ".experts.down_proj";
    int gate_up = ends_with(t->name, gu);
    if (!gate_up && !ends_with(t->name, dn)) return 0;
    if (t->ndim != 3 || !is_float(t->dtype) || (gate_up && t->shape[1] % 2)) return 0;
    int plen = (int)(strlen(t->name) - strlen(gate_up ? gu : dn));
    int halves = gate_up ? 2 : 1;
    int64_t E = t->shape[0], rows = t->shape[1] / halves, k = t->shape[2];
    size_t rb = (size_t)k * st_dtype_size(t->dtype);
    for (int h = 0; h < halves; h++) {
        struct cv_matrix m = {.n_parts = (int)E, .n = rows, .k = k};
        m.parts = xcalloc((size_t)E, sizeof *m.parts);
        for (int64_t x = 0; x < E; x++)
            m.parts[x] =
                (struct qweight){.fmt = float_fmt(t->dtype),
                                 .bits = (int)st_dtype_size(t->dtype) * 8,
                                 .n = rows,
                                 .k = k,
                                 .w = (const uint8_t *)t->data +
                                      ((size_t)x * (size_t)halves + (size_t)h) * rb * (size_t)rows,
                                 .row_bytes = rb};
        char module[1024];
        snprintf(module, sizeof module, "%.*s.experts.switch_glu.%s", plen, t->name,
                 !gate_up ? "down_proj"
                 : h      ? "up_proj"
                          : "gate_proj");
        add_quantized(p, o, module, &m, 1, t->dtype, NULL, hits);
    }
    return 1;
}

/* Bf16 / f16 target: MLX's Gemma 4 experts X.experts.switch_glu.<proj> [E, n, k] back in
 * the Hugging Face layout: gate and up fused into X.experts.gate_up_proj [E, 2I, H] (each
 * expert's gate rows, then its up rows), down as X.experts.down_proj. t is any of the three
 * weights, m its matrix; the partner of gate or up is consumed here. */
static int switch_glu_to_fused(struct cv_plan *p, const struct cv_options *o,
                               const struct safetensors *st, const struct src_quant *sq,
                               const struct st_tensor *t, struct cv_matrix *m, char *consumed,
                               struct err *e)
{
    const char *s = strstr(t->name, ".experts.switch_glu.");
    const char *proj = s + strlen(".experts.switch_glu.");
    int plen = (int)(s - t->name);
    char name[1100], module[1024];
    if (!strcmp(proj, "down_proj.weight")) {
        snprintf(name, sizeof name, "%.*s.experts.down_proj", plen, t->name);
        int64_t shape[3] = {m->n_parts, m->n, m->k};
        add(p, name, o->fdt, 3, shape, CV_FLOAT)->m = keep_matrix(p, m);
        return 0;
    }
    int is_gate = !strcmp(proj, "gate_proj.weight");
    if (!is_gate && strcmp(proj, "up_proj.weight")) {
        free(m->parts);
        return err_set(e, "%s: tensor '%s': not a Gemma 4 expert projection", t->file, t->name);
    }
    snprintf(module, sizeof module, "%.*s.experts.switch_glu.%s", plen, t->name,
             is_gate ? "up_proj" : "gate_proj");
    snprintf(name, sizeof name, "%s.weight", module);
    const struct st_tensor *u = st_find(st, name);
    struct cv_matrix other = {0};
    enum st_dtype sdt;
    int rc = !u ? err_set(e, "tensor '%s' is missing (the experts' %s needs it)", name, proj)
                : matrix_of(st, u, module, sq, &other, &sdt, e);
    if (!rc && (other.n_parts != m->n_parts || other.n != m->n || other.k != m->k))
        rc = err_set(e, "%s: tensor '%s': shape differs from '%s'", u->file, u->name, t->name);
    if (rc) {
        free(m->parts);
        free(other.parts);
        return -1;
    }
    consumed[u - st->tensors] = 1;
    const struct cv_matrix *g = is_gate ? m : &other, *up = is_gate ? &other : m;
    struct cv_matrix f = {.n_parts = 2 * m->n_parts, .n = m->n, .k = m->k};
    f.parts = xcalloc((size_t)f.n_parts, sizeof *f.parts);
    for (int x = 0; x < m->n_parts; x++) {
        f.parts[2 * x] = g->parts[x];
        f.parts[2 * x + 1] = up->parts[x];
    }
    free(m->parts);
    free(other.parts);
    snprintf(name, sizeof name, "%.*s.experts.gate_up_proj", plen, t->name);
    int64_t shape[3] = {f.n_parts / 2, 2 * f.n, f.k};
    add(p, name, o->fdt, 3, shape, CV_FLOAT)->m = keep_matrix(p, &f);
    return 0;
}

int cv_plan_build(struct cv_plan *p, const struct cv_options *o, const struct safetensors *st,
                  const cJSON *cfg, struct err *e)
{
    memset(p, 0, sizeof *p);
    struct src_quant sq;
    if (parse_src_quant(cfg, &sq, e)) return -1;
    const cJSON *tc = config_get(cfg, "text_config");
    const cJSON *tie = config_get(cfg, "tie_word_embeddings");
    if (!tie && cJSON_IsObject(tc)) tie = config_get(tc, "tie_word_embeddings");
    p->tied = cJSON_IsTrue(tie);
    char *consumed = xcalloc((size_t)st->ntensors + 1, 1);
    int *hits = xcalloc((size_t)o->n_keep8 + 1, sizeof *hits);
    int rc = 0;
    char module[1024], prefix[512], proj[32];
    /* First the Hugging Face experts a quantized target stacks, wherever they sit. */
    for (int i = 0; i < st->ntensors && o->quantized; i++) {
        struct cv_matrix m = {0};
        if (consumed[i] || !expert_stack(st, &st->tensors[i], prefix, proj, &m, consumed)) continue;
        snprintf(module, sizeof module, "%s.switch_mlp.%s", prefix, proj);
        add_quantized(p, o, module, &m, 1, st->tensors[i].dtype, NULL, hits);
    }
    for (int i = 0; i < st->ntensors && rc == 0; i++) {
        const struct st_tensor *t = &st->tensors[i];
        if (consumed[i]) continue;
        size_t nl = strlen(t->name);
        struct cv_matrix m = {0};
        enum st_dtype sdt = t->dtype;
        if (ends_with(t->name, ".scales") || ends_with(t->name, ".biases")) {
            snprintf(module, sizeof module, "%.*s.weight", (int)(nl - 7), t->name);
            const struct st_tensor *w = st_find(st, module);
            if (w && w->dtype == ST_U32) continue; /* written with its weight */
        }
        int is_weight = ends_with(t->name, ".weight");
        snprintf(module, sizeof module, "%.*s", (int)(is_weight ? nl - 7 : nl), t->name);
        char scales[1100];
        snprintf(scales, sizeof scales, "%s.scales", module);
        int quantized_src = is_weight && st_find(st, scales) != NULL;
        int glu = strstr(t->name, ".experts.switch_glu.") != NULL; /* Gemma 4, MLX */
        int stacked = glu || strstr(t->name, ".switch_mlp.") != NULL;
        int matrix = quantized_src || (is_weight && is_float(t->dtype) &&
                                       (t->ndim == 2 || (t->ndim == 3 && stacked)));
        if (o->quantized) {
            if ((p->tied && !strcmp(t->name, "lm_head.weight")) ||
                ends_with(t->name, "rotary_emb.inv_freq"))
                continue; /* the embedding serves as the head; inv_freq is recomputed */
            if (fused_to_switch_glu(p, o, t, hits)) continue;
            if (matrix) {
                if ((rc = matrix_of(st, t, module, &sq, &m, &sdt, e)) == 0)
                    add_quantized(p, o, module, &m, t->ndim == 3, sdt, quantized_src ? NULL : t,
                                  hits);
                continue;
            }
        } else if (quantized_src || (matrix && t->ndim == 3)) {
            if ((rc = matrix_of(st, t, module, &sq, &m, &sdt, e))) continue;
            if (glu && t->ndim == 3) {
                rc = switch_glu_to_fused(p, o, st, &sq, t, &m, consumed, e);
            } else if (stacked && t->ndim == 3) {
                add_unstacked(p, o, t->name, &m);
            } else {
                int64_t shape[3] = {m.n_parts, m.n, m.k};
                int lead = t->ndim == 3;
                add(p, t->name, o->fdt, lead + 2, shape + !lead, CV_FLOAT)->m = keep_matrix(p, &m);
            }
            continue;
        }
        int64_t shape[ST_MAX_DIMS];
        conv_shape(t, o->quantized, shape);
        int cast = !o->quantized && is_float(t->dtype) && t->dtype != o->fdt;
        add(p, t->name, cast ? o->fdt : t->dtype, t->ndim, shape, cast ? CV_CAST : CV_RAW)->src = t;
    }
    for (int i = 0; i < o->n_keep8 && rc == 0; i++)
        if (!hits[i]) rc = err_set(e, "--keep-8bit '%s' selects no quantized module", o->keep8[i]);
    free(consumed);
    free(hits);
    if (rc) return -1;
    qsort(p->t, (size_t)p->n, sizeof *p->t, cmp_name);
    for (int i = 1; i < p->n; i++)
        if (!strcmp(p->t[i].name, p->t[i - 1].name))
            return err_set(e,
                           "tensor '%s' would be written twice (the source holds it in two "
                           "layouts)",
                           p->t[i].name);
    if (p->n == 0) return err_set(e, "the source holds no tensors");
    return 0;
}

void cv_plan_dispose(struct cv_plan *p)
{
    for (int i = 0; i < p->n; i++) free(p->t[i].name);
    for (int i = 0; i < p->n_mats; i++) {
        free(p->mats[i]->parts);
        free(p->mats[i]);
    }
    for (int i = 0; i < p->n_ov; i++) free(p->ov[i].module);
    free(p->t);
    free(p->mats);
    free(p->ov);
    memset(p, 0, sizeof *p);
}
