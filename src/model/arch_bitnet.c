/*
 * BitNet b1.58: the Llama layer stack with two more norms and ternary linear layers.
 *
 *     x += o(sub_norm(attn(norm(x))));  x += down(sub_norm(relu(gate)^2 * up))(norm(x))
 *
 * Every linear layer of the decoder is a BitLinear (quantization_config.quant_method
 * "bitnet"): its input row is quantized to int8 by absmax and multiplied by ternary weights
 * (WFMT_TERNARY, model/weights.h). Three checkpoint layouts load into that one format:
 *   packed   (microsoft/bitnet-b1.58-2B-4T, and MLX's conversion, which keeps its tensors)
 *            `weight` uint8 [n/4, k]: output row r + i * n/4 is in bits 2i..2i+1 of packed row
 *            r as value + 1; `weight_scale` [1]. linear_class "bitlinear" divides the product
 *            by it, "autobitlinear" (offline) multiplies by it;
 *   master   (the -bf16 checkpoint; linear_class "autobitlinear", quantization_mode
 *            "online") float weights, made ternary per tensor here as the reference does at
 *            run time: s = 1 / max(mean|W|, 1e-5), values round(W * s) clamped to [-1, 1],
 *            and the product divided by s.
 * Without quantization_config the reference runs plain linear layers, and so does pagoda.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/arch.h"
#include "model/blocks.h"

static int bitnet_config(struct model_config *c, const struct cJSON *root, struct err *e)
{
    if (!config_get(root, "hidden_act")) c->act = ACT_RELU2; /* BitNetConfig's default */
    const cJSON *q = config_get(root, "quantization_config");
    const cJSON *qm = cJSON_IsObject(q) ? config_get(q, "quant_method") : NULL;
    if (!qm) return 0;
    if (!cJSON_IsString(qm) || strcmp(qm->valuestring, "bitnet"))
        return err_set(e,
                       "config.json: quantization_config.quant_method '%s' is not supported "
                       "for BitNet (only \"bitnet\")",
                       cJSON_IsString(qm) ? qm->valuestring : "?");
    const cJSON *lc = config_get(q, "linear_class"), *md = config_get(q, "quantization_mode");
    const char *cls = cJSON_IsString(lc) ? lc->valuestring : "bitlinear";
    const char *mode = cJSON_IsString(md) ? md->valuestring : "offline";
    if (strcmp(mode, "offline") && strcmp(mode, "online"))
        return err_set(e,
                       "config.json: quantization_config.quantization_mode '%s' is not "
                       "supported (offline or online)",
                       mode);
    if (!strcmp(cls, "bitlinear")) {
        if (!strcmp(mode, "online"))
            return err_set(e, "config.json: quantization_config: linear_class bitlinear has no "
                              "online mode (autobitlinear has)");
        c->bitnet = BITNET_OFFLINE_DIV;
    } else if (!strcmp(cls, "autobitlinear")) {
        c->bitnet = strcmp(mode, "online") ? BITNET_OFFLINE_MUL : BITNET_ONLINE;
    } else {
        return err_set(e,
                       "config.json: quantization_config.linear_class '%s' is not supported "
                       "(bitlinear or autobitlinear)",
                       cls);
    }
    return 0;
}

static float read_float(const struct st_tensor *t, int64_t i)
{
    if (t->dtype == ST_BF16) return bf16_to_f32(((const uint16_t *)t->data)[i]);
    if (t->dtype == ST_F16) return f16_to_f32(((const uint16_t *)t->data)[i]);
    return ((const float *)t->data)[i];
}

static int is_float(enum st_dtype d)
{
    return d == ST_F32 || d == ST_F16 || d == ST_BF16;
}

/* The one value of `<prefix>.weight_scale` (w: the weight it scales). */
static int weight_scale(struct model *m, const struct st_tensor *w, const char *prefix, float *out,
                        struct err *e)
{
    char name[300];
    snprintf(name, sizeof name, "%s.weight_scale", prefix);
    const struct st_tensor *t = st_find(&m->st, name);
    if (!t)
        return err_set(e, "%s: tensor '%s' is missing: packed BitNet weights need their scale",
                       w->file, name);
    int64_t count = 1;
    for (int i = 0; i < t->ndim; i++) count *= t->shape[i];
    if (count != 1 || !is_float(t->dtype)) {
        char a[128];
        return err_set(e, "%s: tensor '%s': %s %s, expected one F32, F16 or BF16 value", t->file,
                       t->name, st_dtype_name(t->dtype),
                       st_shape_str(t->shape, t->ndim, a, sizeof a));
    }
    *out = read_float(t, 0);
    if (!isfinite(*out) || *out == 0)
        return err_set(e, "%s: tensor '%s': scale %g is not a finite nonzero number", t->file,
                       t->name, (double)*out);
    return 0;
}

/* Output row o (of n) of the packed tensor p [n/4, k] straight into a ternary row (the
 * codes are value + 1 in both layouts; columns past k get code 1, a zero); -1 on a code 3. */
static int repack_row(const uint8_t *p, int64_t n, int64_t k, int64_t o, uint8_t *row)
{
    const uint8_t *src = p + (size_t)(o % (n / 4)) * (size_t)k;
    int sh = 2 * (int)(o / (n / 4)), bad = 0;
    for (int64_t b = 0; b < (k + 127) / 128; b++)
        for (int j = 0; j < 32; j++) {
            int byte = 0;
            for (int i = 0; i < 4; i++) {
                int64_t c = b * 128 + i * 32 + j;
                int code = c < k ? src[c] >> sh & 3 : 1;
                bad |= code == 3;
                byte |= code << 2 * i;
            }
            row[b * 32 + j] = (uint8_t)byte;
        }
    return bad ? -1 : 0;
}

/* Linear layer `prefix` [n, k] as ternary weights in backend memory. */
static int bitnet_linear(struct model *m, const char *prefix, int64_t n, int64_t k,
                         struct qweight *w, struct err *e)
{
    enum bitnet_mode mode = m->cfg.bitnet;
    if (mode == BITNET_NONE) return model_load_linear(m, prefix, n, k, w, e);
    char name[300], a[128];
    snprintf(name, sizeof name, "%s.weight", prefix);
    const struct st_tensor *t = st_find(&m->st, name);
    if (!t)
        return err_set(e, "%s: tensor '%s' is missing",
                       m->st.nfiles == 1 ? m->st.files[0].base : "checkpoint", name);
    memset(w, 0, sizeof *w);
    w->fmt = WFMT_TERNARY;
    w->bits = 2;
    w->n = n;
    w->k = k;
    w->row_bytes = qweight_ternary_row_bytes(k);
    w->t_div = w->t_mul = 1.0f;
    if (mode == BITNET_ONLINE) {
        if (!is_float(t->dtype) || t->ndim != 2 || t->shape[0] != n || t->shape[1] != k)
            return err_set(e,
                           "%s: tensor '%s': %s %s, expected float [%lld, %lld] (quantization_"
                           "mode online: master weights)",
                           t->file, t->name, st_dtype_name(t->dtype),
                           st_shape_str(t->shape, t->ndim, a, sizeof a), (long long)n,
                           (long long)k);
    } else {
        if (n % 4)
            return err_set(e, "%s: tensor '%s': %lld outputs do not pack four to a byte", t->file,
                           t->name, (long long)n);
        if (t->dtype != ST_U8 || t->ndim != 2 || t->shape[0] != n / 4 || t->shape[1] != k)
            return err_set(e,
                           "%s: tensor '%s': %s %s, expected U8 [%lld, %lld] (packed ternary "
                           "values, four output rows a byte)",
                           t->file, t->name, st_dtype_name(t->dtype),
                           st_shape_str(t->shape, t->ndim, a, sizeof a), (long long)(n / 4),
                           (long long)k);
        float ws = 0;
        if (weight_scale(m, t, prefix, &ws, e)) return -1;
        if (mode == BITNET_OFFLINE_DIV)
            w->t_div = ws;
        else
            w->t_mul = ws;
    }
    uint8_t *data = model_host_weight(m, (size_t)n * w->row_bytes);
    int rc = 0;
    if (mode == BITNET_ONLINE) {
        int8_t *v = xmalloc((size_t)k);
        /* s = 1 / max(mean|W|, 1e-5) in float32, as the reference's WeightQuant */
        double sum = 0;
        for (int64_t i = 0; i < n * k; i++) sum += fabs((double)read_float(t, i));
        float mean = (float)(sum / (double)(n * k));
        float s = 1.0f / (mean > 1e-5f ? mean : 1e-5f);
        for (int64_t o = 0; o < n; o++) {
            for (int64_t j = 0; j < k; j++) {
                float r = nearbyintf(read_float(t, o * k + j) * s);
                v[j] = (int8_t)(r > 0 ? 1 : r < 0 ? -1 : 0);
            }
            qweight_ternary_pack(v, k, data + (size_t)o * w->row_bytes);
        }
        free(v);
        w->t_div = s;
    } else {
        for (int64_t o = 0; o < n && !rc; o++)
            if (repack_row(t->data, n, k, o, data + (size_t)o * w->row_bytes))
                rc = err_set(e,
                             "%s: tensor '%s': output row %lld holds code 3, which is no "
                             "ternary value",
                             t->file, t->name, (long long)o);
    }
    w->w = data;
    if (rc || m->be->ops->weight_prepare(m->be->ctx, w, e)) return -1;
    model_track_linear(m, w);
    return 0;
}

static int bitnet_load(struct model *m, struct err *e)
{
    const struct model_config *c = &m->cfg;
    int H = c->hidden, F = c->ffn, qdim = c->n_heads * c->head_dim,
        kvdim = c->n_kv_heads * c->head_dim;
    char p[256];
    for (int l = 0; l < c->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        struct attn_block *a = &L->attn;
        struct mlp_block *f = &L->mlp;
#define NAME(s) blk_name(m, p, sizeof p, l, s)
        if (bitnet_linear(m, NAME("self_attn.q_proj"), qdim, H, &a->wq, e) ||
            bitnet_linear(m, NAME("self_attn.k_proj"), kvdim, H, &a->wk, e) ||
            bitnet_linear(m, NAME("self_attn.v_proj"), kvdim, H, &a->wv, e) ||
            bitnet_linear(m, NAME("self_attn.o_proj"), H, qdim, &a->wo, e) ||
            bitnet_linear(m, NAME("mlp.gate_proj"), F, H, &f->gate, e) ||
            bitnet_linear(m, NAME("mlp.up_proj"), F, H, &f->up, e) ||
            bitnet_linear(m, NAME("mlp.down_proj"), H, F, &f->down, e) ||
            model_load_vec(m, NAME("self_attn.q_proj.bias"), qdim, 0, c->attn_bias, &a->bq, e) ||
            model_load_vec(m, NAME("self_attn.k_proj.bias"), kvdim, 0, c->attn_bias, &a->bk, e) ||
            model_load_vec(m, NAME("self_attn.v_proj.bias"), kvdim, 0, c->attn_bias, &a->bv, e) ||
            model_load_vec(m, NAME("self_attn.o_proj.bias"), H, 0, c->o_bias, &a->bo, e) ||
            blk_norm_load(m, NAME("self_attn.attn_sub_norm.weight"), qdim, &a->o_norm, e) ||
            blk_norm_load(m, NAME("mlp.ffn_sub_norm.weight"), F, &f->down_norm, e) ||
            blk_norm_load(m, NAME("input_layernorm.weight"), H, &L->attn_norm, e) ||
            blk_norm_load(m, NAME("post_attention_layernorm.weight"), H, &L->ffn_norm, e))
            return -1;
#undef NAME
    }
    return 0;
}

static void bitnet_layers(struct model *m, const struct fwd_batch *b)
{
    int n = b->n_tokens;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        blk_norm(m, m->h, m->x, L->attn_norm, n);
        blk_attn(m, &L->attn, l, b); /* attn_sub_norm before o (attn_block.o_norm) */
        blk_add(m, n);
        blk_norm(m, m->h, m->x, L->ffn_norm, n);
        blk_mlp(m, &L->mlp, n); /* ffn_sub_norm before down (mlp_block.down_norm) */
        blk_add(m, n);
    }
}

const struct arch arch_bitnet = {"BitNetForCausalLM", "bitnet",      bitnet_config,
                                 bitnet_load,         bitnet_layers, false};
