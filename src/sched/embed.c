/*
 * Embedding requests in the engine's steps: which rows a chunk contributes to the pooling
 * (last token, every token, the first token), the running sums across chunks, and the
 * vector's event. The rows arrive final-normed from the forward pass (fwd_batch.hidden_rows);
 * pooling and the L2 norm run here on the host, in double, over [rows, hidden] floats.
 */
#include <math.h>
#include <string.h>

#include "sched/engine_impl.h"

int embed_whole_prompt(const struct engine *en, const struct request *r)
{
    return r->embed && en->pooling.kind != POOLING_LAST;
}

int embed_plan_rows(const struct engine *en, const struct step_seq *p, int q0, int32_t *rows)
{
    const struct request *r = p->r;
    int first = r->n_computed, end = first + p->n_new, n = 0;
    switch (en->pooling.kind) {
    case POOLING_LAST:
        if (end == r->n_prompt) rows[n++] = q0 + p->n_new - 1;
        break;
    case POOLING_CLS:
        if (first == 0) rows[n++] = q0;
        break;
    case POOLING_MEAN:
        for (int pos = first > r->pool_skip ? first : r->pool_skip; pos < end; pos++)
            rows[n++] = q0 + (pos - first);
        break;
    }
    return n;
}

void embed_take(struct engine *en, const struct step_seq *p)
{
    struct request *r = p->r;
    int H = en->m->cfg.hidden;
    for (int i = 0; i < p->n_hid; i++) {
        const float *row = en->hidden + (size_t)(p->hid_row + i) * H;
        for (int d = 0; d < H; d++) r->pool[d] += row[d];
    }
    r->pool_rows += p->n_hid;
}

void embed_reset(struct engine *en, struct request *r)
{
    memset(r->pool, 0, sizeof(double) * (size_t)en->m->cfg.hidden);
    r->pool_rows = 0;
}

void embed_done(struct engine *en, struct request *r)
{
    int H = en->m->cfg.hidden;
    /* one row for last and cls; the mean divides by the rows pooled (at least one: the
     * engine refuses a pool_skip that leaves none) */
    double scale = r->pool_rows > 0 ? 1.0 / r->pool_rows : 0.0, ss = 0;
    for (int d = 0; d < H; d++) {
        double v = r->pool[d] * scale;
        ss += v * v;
        r->pool[d] = v;
    }
    /* as torch.nn.functional.normalize: v / max(||v||, 1e-12) */
    double inv = en->pooling.normalize ? 1.0 / fmax(sqrt(ss), 1e-12) : 1.0;
    for (int d = 0; d < H; d++) en->emb_out[d] = (float)(r->pool[d] * inv);
    struct engine_event ev = {.kind = ENGINE_EV_EMBEDDING,
                              .req_id = r->id,
                              .token = -1,
                              .n_embedding = H,
                              .embedding = en->emb_out,
                              .finish = FINISH_STOP,
                              .n_prompt = r->n_prompt,
                              .n_cached = r->n_cached};
    req_count_finish(en, FINISH_STOP);
    if (r->cb) r->cb(r->user, &ev);
    req_finish(en, r, FINISH_STOP, 0);
}
