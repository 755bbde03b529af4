/* Draft heads over a target's hidden states: loading and the forward step (see head.h). */
#include "model/head.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/arch.h"
#include "model/blocks.h"

/* The head's config: the target's, with one full-attention layer of its attention shape. */
static void head_config(struct model_config *c, const struct model_config *t)
{
    *c = *t;
    c->n_layers = 1;
    c->layer_kinds = xcalloc(1, sizeof *c->layer_kinds);
    c->layer_kinds[0] = LAYER_FULL;
    c->layer_moe = xcalloc(1, sizeof *c->layer_moe);
    c->layer_moe[0] = t->layer_moe && t->layer_moe[t->n_layers - 1];
    c->layer_head_dim = xcalloc(1, sizeof(int));
    c->layer_kv_heads = xcalloc(1, sizeof(int));
    c->kv_source = xcalloc(1, sizeof(int));
    c->layer_head_dim[0] = t->head_dim;
    c->layer_kv_heads[0] = t->n_kv_heads;
    c->quant_overrides = NULL;
    c->n_quant_overrides = 0;
    if (t->n_quant_overrides > 0) {
        c->quant_overrides = xcalloc((size_t)t->n_quant_overrides, sizeof *c->quant_overrides);
        for (int i = 0; i < t->n_quant_overrides; i++) {
            c->quant_overrides[i] = t->quant_overrides[i];
            c->quant_overrides[i].prefix = xstrdup(t->quant_overrides[i].prefix);
        }
        c->n_quant_overrides = t->n_quant_overrides;
    }
}

void model_head_destroy(struct model_head *h)
{
    if (!h) return;
    if (h->m) {
        const struct backend_ops *o = h->m->be->ops;
        void *ctx = h->m->be->ctx;
        float *bufs[] = {h->pair, h->cat, h->out, h->res};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) o->free(ctx, bufs[i]);
        if (!h->own_st) memset(&h->m->st, 0, sizeof h->m->st); /* the target's */
        model_destroy(h->m);
    }
    free(h->idx);
    free(h->d2t);
    free(h);
}

/* The whole matrix `name` [vocab, hidden] of a split target's checkpoint, loaded again onto
 * the lead's backend for the head m. */
static int head_whole(struct model *m, const struct model *t, const char *name, struct qweight *w,
                      struct err *e)
{
    struct model *view = xcalloc(1, sizeof *view); /* the target's checkpoint, unsplit */
    view->cfg = t->cfg;
    view->st = t->st;
    view->be = t->be;
    int rc = model_load_linear(view, name, t->cfg.vocab, t->cfg.hidden, w, e);
    free(view->tensors.linears);
    free(view);
    if (rc == 0) model_track_linear(m, w);
    return rc;
}

/* The head's embedding: the target's, or, where the target is split over devices (its
 * embedding then holds the rank's share of the vocabulary), the whole table loaded again
 * from the target's checkpoint onto the lead's backend. */
static int head_embed(struct model *m, const struct model *t, struct err *e)
{
    m->embed_scale = t->embed_scale;
    if (t->tp_size <= 1) {
        m->embed = t->embed;
        return 0;
    }
    char n[160];
    snprintf(n, sizeof n, "%sembed_tokens", t->prefix);
    return head_whole(m, t, n, &m->embed, e);
}

/* The target's output head for an MTP module: the target's own, or, where the target is
 * split (its head then holds the rank's share of the vocabulary), the whole matrix on the
 * lead (the whole embedding head_embed loaded, when they are tied). */
static int head_lm(struct model *m, const struct model *t, struct err *e)
{
    if (t->tp_size <= 1) {
        m->lm_head = t->lm_head;
        return 0;
    }
    char n[160];
    snprintf(n, sizeof n, "%s.weight", t->head);
    if (t->cfg.tie_embeddings || (!t->cfg.tie_explicit && !st_find(&t->st, n))) {
        m->lm_head = m->embed; /* counted once */
        return 0;
    }
    return head_whole(m, t, t->head, &m->lm_head, e);
}

/* A split target's config holds its rank's share of the heads and MLP and expert widths: the
 * MTP layer,
 * whole on the lead, takes the whole model's (the key-value heads: kv_parts shares of
 * n_kv_heads, model/model.h). */
static void head_unsplit(struct model_config *c, const struct model *t)
{
    if (t->tp_size <= 1) return;
    c->n_heads *= t->tp_size;
    c->n_kv_heads *= t->kv_parts;
    c->layer_kv_heads[0] = c->n_kv_heads;
    c->max_kv_dim = c->n_kv_heads * c->head_dim;
    c->ffn *= t->tp_size;
    c->moe.inner *= t->tp_size;
    c->moe.shared_inner *= t->tp_size;
}

/* The rope tables of the target, copied (the head's positions rotate as the target's). */
static void head_rope(struct model *m, const struct model *t)
{
    m->rope_shared = t->rope_shared;
    for (int i = 0; i < 2; i++) {
        size_t half = (size_t)(t->cfg.rope_dims[i] / 2);
        m->rope_inv_freq[i] = xmalloc(sizeof(float) * (half ? half : 1));
        memcpy(m->rope_inv_freq[i], t->rope_inv_freq[i], sizeof(float) * half);
        m->rope_mscale[i] = t->rope_mscale[i];
    }
}

struct model_head *model_head_load_mtp(struct model *t, struct err *e)
{
    char n[160];
    int layers = 0;
    for (;; layers++) {
        snprintf(n, sizeof n, "mtp.layers.%d.input_layernorm.weight", layers);
        if (!st_find(&t->st, n)) break;
    }
    if (layers == 0 || !st_find(&t->st, "mtp.fc.weight")) {
        err_set(e,
                "--speculative-method mtp: the checkpoint (%s) has no multi-token-prediction "
                "module (tensors mtp.fc, mtp.layers.0.*): it ships with Qwen3.5/3.6 checkpoints, "
                "and conversions often drop it",
                t->cfg.arch_name);
        return NULL;
    }
    if (layers > 1) {
        err_set(e, "--speculative-method mtp: %d MTP layers (mtp.layers.*): only one is supported",
                layers);
        return NULL;
    }
    struct model_head *h = xcalloc(1, sizeof *h);
    h->target = t;
    struct model *m = h->m = xcalloc(1, sizeof *m);
    m->be = t->be;
    head_config(&m->cfg, &t->cfg);
    head_unsplit(&m->cfg, t);
    m->st = t->st;
    snprintf(m->prefix, sizeof m->prefix, "mtp.");
    snprintf(m->head, sizeof m->head, "%s", t->head);
    m->layers = xcalloc(1, sizeof *m->layers);
    int H = m->cfg.hidden;
    if (head_embed(m, t, e) || head_lm(m, t, e) ||
        blk_norm_load(m, "mtp.norm.weight", H, &m->final_norm, e) ||
        blk_norm_load(m, "mtp.pre_fc_norm_embedding.weight", H, &h->norm_e, e) ||
        blk_norm_load(m, "mtp.pre_fc_norm_hidden.weight", H, &h->norm_h, e) ||
        model_load_linear(m, "mtp.fc", H, 2 * (int64_t)H, &h->fc, e) || m->cfg.arch->load(m, e)) {
        char msg[sizeof e->msg];
        snprintf(msg, sizeof msg, "%s", e->msg);
        err_set(e, "--speculative-method mtp: %s", msg);
        model_head_destroy(h);
        return NULL;
    }
    head_rope(m, t);
    return h;
}

/* Families whose layer loop keeps the rows EAGLE-3 reads (blk_capture). */
static int captures(const struct model_config *c)
{
    static const char *const fam[] = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe"};
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
        if (!strcmp(c->arch->family, fam[i])) return 1;
    return 0;
}

/* config.json of an EAGLE-3 head into c (the target's config with the head's attention and
 * MLP shape) and the three target layers into aux; 0 or -1 + err naming the field. */
static int eagle3_config(struct model_config *c, const struct model_config *t, const char *dir,
                         int *aux, int *draft_vocab, struct err *e)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *text = util_read_file(path, &len, e);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    int rc = -1, H = 0, th = 0, vocab = 0, heads = 0, kv = 0, hd = 0, ffn = 0;
    double eps = 1e-6;
    if (!cJSON_IsObject(root)) {
        err_set(e, "%s: not a JSON object", path);
        goto out;
    }
    if (config_get_int(root, "hidden_size", 0, &H, e) ||
        config_get_int(root, "target_hidden_size", H, &th, e) ||
        config_get_int(root, "vocab_size", t->vocab, &vocab, e) ||
        config_get_int(root, "draft_vocab_size", vocab, draft_vocab, e) ||
        config_get_int(root, "num_attention_heads", 0, &heads, e) ||
        config_get_int(root, "num_key_value_heads", heads, &kv, e) ||
        config_get_int(root, "intermediate_size", 0, &ffn, e) ||
        config_get_int(root, "head_dim", heads > 0 ? H / heads : 0, &hd, e) ||
        config_get_num(root, "rms_norm_eps", 1e-6, &eps, e))
        goto out;
    if (H != t->hidden || th != t->hidden || vocab != t->vocab) {
        err_set(e,
                "%s: hidden_size %d (target_hidden_size %d) and vocab_size %d must be the "
                "model's (%d, %d)",
                path, H, th, vocab, t->hidden, t->vocab);
        goto out;
    }
    if (heads <= 0 || kv <= 0 || heads % kv || ffn <= 0 || *draft_vocab <= 0 ||
        *draft_vocab > vocab || hd != t->head_dim) {
        err_set(e,
                "%s: num_attention_heads %d, num_key_value_heads %d, intermediate_size %d, "
                "draft_vocab_size %d, head_dim %d: heads a multiple of KV heads, a draft "
                "vocabulary of at most %d, the model's head_dim %d",
                path, heads, kv, ffn, *draft_vocab, hd, vocab, t->head_dim);
        goto out;
    }
    int n = t->n_layers;
    aux[0] = 2 < n ? 2 : n - 1; /* vLLM's choice: low, middle, high */
    aux[1] = n / 2;
    aux[2] = n - 3 > 0 ? n - 3 : 0;
    const cJSON *ec = config_get(root, "eagle_config");
    const cJSON *ids = cJSON_IsObject(ec) ? config_get(ec, "eagle_aux_hidden_state_layer_ids")
                                          : config_get(root, "eagle_aux_hidden_state_layer_ids");
    if (ids) {
        if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) != 3) {
            err_set(e, "%s: eagle_aux_hidden_state_layer_ids must list 3 layers", path);
            goto out;
        }
        for (int i = 0; i < 3; i++) {
            const cJSON *x = cJSON_GetArrayItem(ids, i);
            /* as vLLM reads them: id l is the residual entering layer l */
            if (!cJSON_IsNumber(x) || x->valueint < 0 || x->valueint > n) {
                err_set(e, "%s: eagle_aux_hidden_state_layer_ids: ids in [0, %d]", path, n);
                goto out;
            }
            aux[i] = x->valueint;
        }
    }
    if (kv * hd > c->max_kv_dim) c->max_kv_dim = kv * hd;
    c->n_heads = heads;
    c->n_kv_heads = kv;
    c->layer_kv_heads[0] = kv;
    c->ffn = ffn;
    c->rms_eps = (float)eps;
    c->vocab = *draft_vocab;
    c->qk_norm = c->attn_bias = c->o_bias = c->mlp_bias = c->attn_gate = false;
    c->norm_plus_one = false;
    c->layer_moe[0] = false;
    c->moe = (struct moe_config){0};
    c->act = ACT_SILU;
    c->attn_softcap = c->final_softcap = 0;
    c->quant = (struct quant_spec){0};
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

struct model_head *model_head_load_eagle3(struct model *t, const char *dir, struct err *e)
{
    if (!captures(&t->cfg)) {
        err_set(e,
                "--speculative-method eagle3: the model's family (%s) does not keep the layer "
                "rows EAGLE-3 reads (supported: Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE)",
                t->cfg.arch->family);
        return NULL;
    }
    struct model_head *h = xcalloc(1, sizeof *h);
    h->kind = HEAD_EAGLE3;
    h->target = t;
    h->own_st = 1;
    struct model *m = h->m = xcalloc(1, sizeof *m);
    m->be = t->be;
    head_config(&m->cfg, &t->cfg);
    int aux[3], dv = 0;
    char pfx[] = "--speculative-model";
    if (eagle3_config(&m->cfg, &t->cfg, dir, aux, &dv, e)) goto fail;
    const struct model_config *c = &m->cfg;
    struct err be_err;
    const struct backend_ops *o = t->be->ops;
    if (o->attn_check &&
        o->attn_check(t->be->ctx, c->head_dim, c->n_heads, c->n_kv_heads, &be_err)) {
        err_set(e, "%s/config.json: %d query heads, %d KV heads of %d: %s", dir, c->n_heads,
                c->n_kv_heads, c->head_dim, be_err.msg);
        goto fail;
    }
    int64_t H = c->hidden, qd = (int64_t)c->n_heads * c->head_dim,
            kvd = (int64_t)c->n_kv_heads * c->head_dim;
    m->layers = xcalloc(1, sizeof *m->layers);
    struct model_layer *L = &m->layers[0];
    struct attn_block *a = &L->attn;
    if (head_embed(m, t, e) || st_open(&m->st, dir, e) ||
        model_load_linear(m, "fc", H, 3 * H, &h->fc, e) ||
        model_load_linear(m, "midlayer.self_attn.q_proj", qd, 2 * H, &a->wq, e) ||
        model_load_linear(m, "midlayer.self_attn.k_proj", kvd, 2 * H, &a->wk, e) ||
        model_load_linear(m, "midlayer.self_attn.v_proj", kvd, 2 * H, &a->wv, e) ||
        model_load_linear(m, "midlayer.self_attn.o_proj", H, qd, &a->wo, e) ||
        blk_mlp_load(m, "midlayer.mlp", c->ffn, &L->mlp, e) ||
        blk_norm_load(m, "midlayer.input_layernorm.weight", (int)H, &h->norm_e, e) ||
        blk_norm_load(m, "midlayer.hidden_norm.weight", (int)H, &h->norm_h, e) ||
        blk_norm_load(m, "midlayer.post_attention_layernorm.weight", (int)H, &L->ffn_norm, e) ||
        blk_norm_load(m, "norm.weight", (int)H, &m->final_norm, e) ||
        model_load_linear(m, "lm_head", dv, H, &m->lm_head, e))
        goto fail;
    /* d2t [draft vocab] int64: target id = draft id + d2t[draft id] */
    const struct st_tensor *d2t = st_find(&m->st, "d2t");
    h->d2t = xcalloc((size_t)dv, sizeof *h->d2t);
    if (d2t && (d2t->dtype != ST_I64 || d2t->ndim != 1 || d2t->shape[0] != dv)) {
        err_set(e, "%s: tensor 'd2t' must be I64 [%d] (the draft vocabulary)", d2t->file, dv);
        goto fail;
    }
    if (!d2t && dv != c->vocab) {
        err_set(e, "%s: no tensor 'd2t' for a draft vocabulary of %d", dir, dv);
        goto fail;
    }
    for (int i = 0; d2t && i < dv; i++) {
        int64_t v;
        memcpy(&v, (const uint8_t *)d2t->data + 8 * (size_t)i, 8);
        if (i + v < 0 || i + v >= t->cfg.vocab) {
            err_set(e, "%s: d2t[%d] = %lld maps outside the vocabulary of %d", d2t->file, i,
                    (long long)v, t->cfg.vocab);
            goto fail;
        }
        h->d2t[i] = (int32_t)v;
    }
    memcpy(m->aux_layer, aux, sizeof aux); /* the target's, set by model_head_alloc */
    head_rope(m, t);
    return h;
fail:;
    char msg[sizeof e->msg];
    snprintf(msg, sizeof msg, "%s", e->msg);
    err_set(e, "%s %s: %s", pfx, dir, msg);
    model_head_destroy(h);
    return NULL;
}

int model_head_alloc(struct model_head *h, int max_tokens, int max_logits, int n_blocks,
                     int block_size, struct err *e)
{
    struct model *m = h->m;
    if (model_state_alloc(m, max_tokens, max_logits, n_blocks, block_size, 0, e)) return -1;
    /* EAGLE-3: the target keeps its three layers' rows (the head holds their ids) */
    if (h->kind == HEAD_EAGLE3 && !h->target->aux && model_aux_alloc(h->target, m->aux_layer, 3, e))
        return -1;
    const struct backend_ops *o = m->be->ops;
    size_t TH = (size_t)max_tokens * (size_t)m->cfg.hidden;
    h->pair = o->alloc(m->be->ctx, sizeof(float) * 3 * TH);
    h->cat = o->alloc(m->be->ctx, sizeof(float) * 3 * TH);
    h->out = o->alloc(m->be->ctx, sizeof(float) * TH);
    h->res = o->alloc(m->be->ctx, sizeof(float) * TH);
    h->idx = xmalloc(sizeof(int32_t) * 3 * (size_t)max_tokens);
    h->max_tokens = max_tokens;
    if (!h->pair || !h->cat || !h->out || !h->res)
        return err_set(e, "out of memory for the draft head's buffers (%d rows)", max_tokens);
    return 0;
}

/* cat [n, k * H] = row i of each of the k pieces of pair [k * n, H] side by side. */
static void join(struct model_head *h, int n, int k)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) h->idx[k * i + j] = j * n + i;
    h->m->be->ops->gather_rows(h->m->be->ctx, h->cat, h->pair, h->idx, k * n, h->m->cfg.hidden);
}

static void mtp_forward(struct model_head *h, const struct fwd_batch *b, int from_target,
                        const int32_t *src_rows)
{
    struct model *m = h->m;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int n = b->n_tokens, H = c->hidden;
    size_t nh = (size_t)n * (size_t)H;

    model_step_begin(m, b);
    /* pair = [norm_e(embed(tokens)) (n rows); norm_h(hidden) (n rows)] */
    o->embed(ctx, m->x, &m->embed, b, m->embed_scale);
    o->rms_norm(ctx, h->pair, m->x, h->norm_e, n, H, c->rms_eps);
    float *hid = h->pair + nh;
    if (from_target) { /* the target's last layer output, through its final norm */
        o->gather_rows(ctx, hid, h->target->x, src_rows, n, H);
        o->rms_norm(ctx, hid, hid, h->target->final_norm, n, H, h->target->cfg.rms_eps);
    } else {
        o->gather_rows(ctx, hid, h->out, src_rows, n, H);
    }
    o->rms_norm(ctx, hid, hid, h->norm_h, n, H, c->rms_eps);
    join(h, n, 2); /* row i: [embedding i, hidden i] */
    o->matmul(ctx, m->x, h->cat, &h->fc, n);
    c->arch->layers(m, b);
    o->rms_norm(ctx, h->out, m->x, m->final_norm, n, H, c->rms_eps);
    if (b->n_logits == 0) return;
    o->gather_rows(ctx, m->xl, h->out, b->logit_rows, b->n_logits, H);
    o->matmul(ctx, m->logits, m->xl, &m->lm_head, b->n_logits);
    if (c->final_softcap > 0)
        o->softcap(ctx, m->logits, (int64_t)b->n_logits * c->vocab, c->final_softcap);
}

static void eagle3_forward(struct model_head *h, const struct fwd_batch *b, int from_target,
                           const int32_t *src_rows)
{
    struct model *m = h->m;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const struct model_layer *L = &m->layers[0];
    int n = b->n_tokens, H = c->hidden;
    size_t nh = (size_t)n * (size_t)H;

    model_step_begin(m, b);
    if (from_target) { /* r = fc([low, mid, high]) of the target's kept rows */
        const struct model *t = h->target;
        for (int i = 0; i < 3; i++)
            o->gather_rows(ctx, h->pair + (size_t)i * nh,
                           t->aux + (size_t)i * t->max_tokens * (size_t)H, src_rows, n, H);
        join(h, n, 3);
        o->matmul(ctx, h->res, h->cat, &h->fc, n);
    } else {
        o->gather_rows(ctx, h->res, h->out, src_rows, n, H);
    }
    o->embed(ctx, m->x, &m->embed, b, m->embed_scale);
    o->rms_norm(ctx, h->pair, m->x, h->norm_e, n, H, c->rms_eps);
    o->rms_norm(ctx, h->pair + nh, h->res, h->norm_h, n, H, c->rms_eps);
    join(h, n, 2); /* row i: [embedding i, hidden i], the attention's input of 2H */
    float *h_rows = m->h;
    m->h = h->cat;
    blk_attn(m, &L->attn, 0, b); /* its output [n, H] at the start of cat */
    m->h = h_rows;
    o->copy(ctx, m->x, h->res, sizeof(float) * nh);
    o->add(ctx, m->x, h->cat, (int64_t)nh);
    blk_norm(m, m->h, m->x, L->ffn_norm, n);
    blk_mlp(m, &L->mlp, n);
    blk_add(m, n);
    o->copy(ctx, h->out, m->x, sizeof(float) * nh);
    if (b->n_logits == 0) return;
    o->gather_rows(ctx, m->xl, h->out, b->logit_rows, b->n_logits, H);
    o->rms_norm(ctx, m->xl, m->xl, m->final_norm, b->n_logits, H, c->rms_eps);
    o->matmul(ctx, m->logits, m->xl, &m->lm_head, b->n_logits);
}

void model_head_forward(struct model_head *h, const struct fwd_batch *b, int from_target,
                        const int32_t *src_rows)
{
    if (h->kind == HEAD_EAGLE3)
        eagle3_forward(h, b, from_target, src_rows);
    else
        mtp_forward(h, b, from_target, src_rows);
}
