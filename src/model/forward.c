/*
 * The forward pass, written once against the backend table: the step's rope tables, the
 * embedding, the family's layer stack (model/arch.h), the final norm and the head.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "model/arch.h"
#include "model/model.h"
#include "model/tp.h"

/* Fills host cos/sin [n_tokens, D/2] for one rope parameter set. Dynamic NTK rescales the
 * base once a position passes the original context (per token, so cached keys keep the
 * rotation they were stored with). */
static void rope_tables(const struct model *m, int which, const struct fwd_batch *b, float *cos_t,
                        float *sin_t)
{
    const struct rope_params *r = which == 0 ? &m->cfg.rope_full : &m->cfg.rope_sliding;
    int d = m->cfg.rope_dims[which], half = d / 2;
    const float *inv = m->rope_inv_freq[which];
    float ms = m->rope_mscale[which];
    for (int t = 0; t < b->n_tokens; t++) {
        int pos = b->pos[t];
        float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        if (r->type == ROPE_DYNAMIC && pos + 1 > r->orig_max_pos) {
            double len = pos + 1;
            double base = r->theta * pow(r->factor * len / r->orig_max_pos - (r->factor - 1),
                                         (double)d / (d - 2));
            for (int i = 0; i < half; i++) {
                float f = (float)(1.0 / pow(base, (double)(2 * i) / d));
                float ang = (float)pos * f;
                c[i] = cosf(ang);
                s[i] = sinf(ang);
            }
            continue;
        }
        for (int i = 0; i < half; i++) {
            float ang = (float)pos * inv[i];
            c[i] = cosf(ang) * ms;
            s[i] = sinf(ang) * ms;
        }
    }
}

void model_step_begin(struct model *m, const struct fwd_batch *b)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int n = b->n_tokens;

    o->batch_begin(ctx, b);
    for (int i = 0; i < (m->rope_shared ? 1 : 2); i++) {
        const struct rope_params *r = i == 0 ? &c->rope_full : &c->rope_sliding;
        int D = c->rope_dims[i];
        size_t half_bytes = sizeof(float) * (size_t)n * (size_t)(D / 2);
        if (o->rope_tables && m->rope_inv_dev[i] && r->type != ROPE_DYNAMIC) {
            /* the backend computes them where they are used: no copy before the step */
            o->rope_tables(ctx, m->rope_cos[i], m->rope_sin[i], m->rope_inv_dev[i], D / 2,
                           m->rope_mscale[i], b);
            continue;
        }
        rope_tables(m, i, b, m->host_cos, m->host_sin);
        o->upload(ctx, m->rope_cos[i], m->host_cos, half_bytes);
        o->upload(ctx, m->rope_sin[i], m->host_sin, half_bytes);
    }
}

void model_forward(struct model *m, const struct fwd_batch *b, float *logits)
{
    if (m->tp)
        tpg_forward(m->tp, b, logits);
    else
        model_forward_rank(m, b, logits);
}

void model_forward_rank(struct model *m, const struct fwd_batch *b, float *logits)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int n = b->n_tokens, H = c->hidden;

    struct fwd_batch own;
    if (m->tp_size > 1) {
        /* the embedding's share: a token of another share reads its last row (zeros), and
         * the sum over the group is every token's row (the steps' tokens are on the host) */
        assert(!b->pick_rows);
        int lo = m->tp_rank * m->vocab_part;
        for (int t = 0; t < n; t++) {
            int id = b->tokens[t] - lo;
            m->tp_tokens[t] = id >= 0 && id < m->vocab_part ? id : m->vocab_part;
        }
        own = *b;
        own.tokens = m->tp_tokens;
        b = &own;
    }
    model_step_begin(m, b);
    o->embed(ctx, m->x, &m->embed, b, m->embed_scale);
    if (m->tp_size > 1) o->all_reduce(ctx, m->x, (int64_t)n * H);
    c->arch->layers(m, b);

    if (b->n_hidden > 0) { /* pooled rows of embedding requests: the final norm, no head */
        assert(b->n_hidden <= m->max_hidden);
        o->gather_rows(ctx, m->hid, m->x, b->hidden_rows, b->n_hidden, H);
        o->rms_norm(ctx, m->hid, m->hid, m->final_norm, b->n_hidden, H, c->rms_eps);
    }
    if (b->n_logits == 0) return;
    /* Every row in order (a decode step): the norm reads them in place, no gather. */
    int all_rows = b->n_logits == n;
    for (int i = 0; all_rows && i < n; i++) all_rows = b->logit_rows[i] == i;
    if (all_rows) {
        o->rms_norm(ctx, m->xl, m->x, m->final_norm, n, H, c->rms_eps);
    } else {
        o->gather_rows(ctx, m->xl, m->x, b->logit_rows, b->n_logits, H);
        o->rms_norm(ctx, m->xl, m->xl, m->final_norm, b->n_logits, H, c->rms_eps);
    }
    if (m->tp_size > 1) { /* each rank's share of the vocabulary, then all of it */
        o->matmul(ctx, m->logits_part, m->xl, &m->lm_head, b->n_logits);
        if (c->final_softcap > 0)
            o->softcap(ctx, m->logits_part, (int64_t)b->n_logits * m->vocab_part, c->final_softcap);
        o->all_gather(ctx, m->logits, m->logits_part, b->n_logits, m->vocab_part);
        if (m->tp_rank > 0) return; /* the lead reads the logits */
    } else {
        o->matmul(ctx, m->logits, m->xl, &m->lm_head, b->n_logits);
        if (c->final_softcap > 0)
            o->softcap(ctx, m->logits, (int64_t)b->n_logits * c->vocab, c->final_softcap);
    }
    if (logits) o->download(ctx, logits, m->logits, sizeof(float) * (size_t)b->n_logits * c->vocab);
}

void model_hidden(struct model *m, int n, float *out)
{
    assert(n <= m->max_hidden);
    m->be->ops->download(m->be->ctx, out, m->hid, sizeof(float) * (size_t)n * m->cfg.hidden);
}

void model_argmax(struct model *m, int n, int32_t *out)
{
    m->be->ops->argmax(m->be->ctx, out, m->logits, n, m->cfg.vocab);
}

void model_picks(struct model *m, int n, int32_t *out)
{
    m->be->ops->picks(m->be->ctx, out, n);
}

int model_can_sample(const struct model *m)
{
    return m->be->ops->sample != NULL;
}

void model_sample(struct model *m, int n, const struct sample_row *p, int32_t *out)
{
    m->be->ops->sample(m->be->ctx, out, m->logits, n, m->cfg.vocab, p);
}
