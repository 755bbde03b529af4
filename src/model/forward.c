/*
 * The forward pass of the dense decoder families, written once against the backend table.
 *
 * Llama / Mistral / Qwen2 / Qwen3:  x += o(attn(norm(x)));  x += down(act(gate) * up)(norm(x))
 * Gemma 2 / 3 add sandwich norms around both blocks, (1 + w) norm weights, sqrt(hidden)
 * embedding scale, attention and final logit soft-capping (Gemma 2) and q/k norms (Gemma 3).
 */
#include <math.h>
#include <string.h>

#include "model/model.h"

/* Fills host cos/sin [n_tokens, D/2] for one rope parameter set. Dynamic NTK rescales the
 * base once a position passes the original context (per token, so cached keys keep the
 * rotation they were stored with). */
static void rope_tables(const struct model *m, int which, const struct fwd_batch *b, float *cos_t,
                        float *sin_t)
{
    const struct rope_params *r = which == 0 ? &m->cfg.rope_full : &m->cfg.rope_sliding;
    int d = m->cfg.head_dim, half = d / 2;
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

static int rope_equal(const struct rope_params *a, const struct rope_params *b)
{
    return a->type == b->type && a->theta == b->theta && a->factor == b->factor &&
           a->orig_max_pos == b->orig_max_pos && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor && a->beta_fast == b->beta_fast &&
           a->beta_slow == b->beta_slow && a->attention_factor == b->attention_factor &&
           a->mscale == b->mscale && a->mscale_all_dim == b->mscale_all_dim &&
           a->truncate == b->truncate;
}

void model_forward(struct model *m, const struct fwd_batch *b, float *logits)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int n = b->n_tokens, H = c->hidden, D = c->head_dim, F = c->ffn;
    int qdim = c->n_heads * D, kvdim = c->n_kv_heads * D;
    size_t half_bytes = sizeof(float) * (size_t)n * (size_t)(D / 2);

    o->batch_begin(ctx, b);
    int same_rope = rope_equal(&c->rope_full, &c->rope_sliding);
    for (int i = 0; i < (same_rope ? 1 : 2); i++) {
        const struct rope_params *r = i == 0 ? &c->rope_full : &c->rope_sliding;
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

    o->embed(ctx, m->x, &m->embed, b, m->embed_scale);
    for (int l = 0; l < c->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        int sliding = c->layer_kinds[l] == LAYER_SLIDING;
        int rt = sliding && !same_rope ? 1 : 0;

        o->rms_norm(ctx, m->h, m->x, L->attn_norm, n, H, c->rms_eps);
        o->matmul(ctx, m->q, m->h, &L->wq, n);
        o->matmul(ctx, m->k, m->h, &L->wk, n);
        o->matmul(ctx, m->v, m->h, &L->wv, n);
        if (L->bq) {
            o->add_bias(ctx, m->q, L->bq, n, qdim);
            o->add_bias(ctx, m->k, L->bk, n, kvdim);
            o->add_bias(ctx, m->v, L->bv, n, kvdim);
        }
        if (L->q_norm) {
            o->rms_norm(ctx, m->q, m->q, L->q_norm, n * c->n_heads, D, c->rms_eps);
            o->rms_norm(ctx, m->k, m->k, L->k_norm, n * c->n_kv_heads, D, c->rms_eps);
        }
        o->rope(ctx, m->q, n, c->n_heads, D, m->rope_cos[rt], m->rope_sin[rt]);
        o->rope(ctx, m->k, n, c->n_kv_heads, D, m->rope_cos[rt], m->rope_sin[rt]);
        o->kv_store(ctx, &m->kv[l], &m->kvg, m->k, m->v, b);
        struct attn_params ap = {
            .n_heads = c->n_heads,
            .n_kv_heads = c->n_kv_heads,
            .head_dim = D,
            .scale = c->attn_scale,
            .softcap = c->attn_softcap,
            .window = sliding ? c->sliding_window : 0,
        };
        o->attention(ctx, m->att, m->q, &m->kv[l], &m->kvg, b, &ap);
        o->matmul(ctx, m->h, m->att, &L->wo, n);
        if (L->bo) o->add_bias(ctx, m->h, L->bo, n, H);
        if (L->post_attn_norm) o->rms_norm(ctx, m->h, m->h, L->post_attn_norm, n, H, c->rms_eps);
        o->add(ctx, m->x, m->h, (int64_t)n * H);

        o->rms_norm(ctx, m->h, m->x, L->ffn_norm, n, H, c->rms_eps);
        o->matmul(ctx, m->gate, m->h, &L->w_gate, n);
        o->matmul(ctx, m->up, m->h, &L->w_up, n);
        if (L->b_gate) {
            o->add_bias(ctx, m->gate, L->b_gate, n, F);
            o->add_bias(ctx, m->up, L->b_up, n, F);
        }
        o->act_mul(ctx, m->gate, m->gate, m->up, (int64_t)n * F, c->act);
        o->matmul(ctx, m->h, m->gate, &L->w_down, n);
        if (L->b_down) o->add_bias(ctx, m->h, L->b_down, n, H);
        if (L->post_ffn_norm) o->rms_norm(ctx, m->h, m->h, L->post_ffn_norm, n, H, c->rms_eps);
        o->add(ctx, m->x, m->h, (int64_t)n * H);
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
    o->matmul(ctx, m->logits, m->xl, &m->lm_head, b->n_logits);
    if (c->final_softcap > 0)
        o->softcap(ctx, m->logits, (int64_t)b->n_logits * c->vocab, c->final_softcap);
    if (logits) o->download(ctx, logits, m->logits, sizeof(float) * (size_t)b->n_logits * c->vocab);
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
