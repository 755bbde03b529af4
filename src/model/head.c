/* Draft heads over a target's hidden states: loading and the forward step (see head.h). */
#include "model/head.h"

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
        float *bufs[] = {h->pair, h->cat, h->out};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) o->free(ctx, bufs[i]);
        memset(&h->m->st, 0, sizeof h->m->st); /* the target's */
        model_destroy(h->m);
    }
    free(h->idx);
    free(h);
}

struct model_head *model_head_load_mtp(const struct model *t, struct err *e)
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
    m->st = t->st;
    snprintf(m->prefix, sizeof m->prefix, "mtp.");
    snprintf(m->head, sizeof m->head, "%s", t->head);
    m->embed = t->embed;
    m->lm_head = t->lm_head;
    m->embed_scale = t->embed_scale;
    m->layers = xcalloc(1, sizeof *m->layers);
    int H = m->cfg.hidden;
    if (blk_norm_load(m, "mtp.norm.weight", H, &m->final_norm, e) ||
        blk_norm_load(m, "mtp.pre_fc_norm_embedding.weight", H, &h->norm_e, e) ||
        blk_norm_load(m, "mtp.pre_fc_norm_hidden.weight", H, &h->norm_h, e) ||
        model_load_linear(m, "mtp.fc", H, 2 * (int64_t)H, &h->fc, e) || m->cfg.arch->load(m, e)) {
        char msg[sizeof e->msg];
        snprintf(msg, sizeof msg, "%s", e->msg);
        err_set(e, "--speculative-method mtp: %s", msg);
        model_head_destroy(h);
        return NULL;
    }
    m->rope_shared = t->rope_shared;
    for (int i = 0; i < 2; i++) {
        size_t half = (size_t)(t->cfg.rope_dims[i] / 2);
        m->rope_inv_freq[i] = xmalloc(sizeof(float) * (half ? half : 1));
        memcpy(m->rope_inv_freq[i], t->rope_inv_freq[i], sizeof(float) * half);
        m->rope_mscale[i] = t->rope_mscale[i];
    }
    return h;
}

int model_head_alloc(struct model_head *h, int max_tokens, int max_logits, int n_blocks,
                     int block_size, struct err *e)
{
    struct model *m = h->m;
    if (model_state_alloc(m, max_tokens, max_logits, n_blocks, block_size, 0, e)) return -1;
    const struct backend_ops *o = m->be->ops;
    size_t TH = (size_t)max_tokens * (size_t)m->cfg.hidden;
    h->pair = o->alloc(m->be->ctx, sizeof(float) * 2 * TH);
    h->cat = o->alloc(m->be->ctx, sizeof(float) * 2 * TH);
    h->out = o->alloc(m->be->ctx, sizeof(float) * TH);
    h->idx = xmalloc(sizeof(int32_t) * 2 * (size_t)max_tokens);
    h->max_tokens = max_tokens;
    if (!h->pair || !h->cat || !h->out)
        return err_set(e, "out of memory for the draft head's buffers (%d rows)", max_tokens);
    return 0;
}

void model_head_forward(struct model_head *h, const struct fwd_batch *b, int from_target,
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
    /* cat [n, 2H]: row i is [embedding i, hidden i], rows of pair taken alternately */
    for (int i = 0; i < n; i++) {
        h->idx[2 * i] = i;
        h->idx[2 * i + 1] = n + i;
    }
    o->gather_rows(ctx, h->cat, h->pair, h->idx, 2 * n, H);
    o->matmul(ctx, m->x, h->cat, &h->fc, n);
    c->arch->layers(m, b);
    o->rms_norm(ctx, h->out, m->x, m->final_norm, n, H, c->rms_eps);
    if (b->n_logits == 0) return;
    o->gather_rows(ctx, m->xl, h->out, b->logit_rows, b->n_logits, H);
    o->matmul(ctx, m->logits, m->xl, &m->lm_head, b->n_logits);
    if (c->final_softcap > 0)
        o->softcap(ctx, m->logits, (int64_t)b->n_logits * c->vocab, c->final_softcap);
}
