/*
 * Drafts of a head over the target's hidden states (MTP, EAGLE-3: model/head.h). After every step
 * the target's last layer output stays where it was computed until the next step; before
 * that next step is planned, spec_head_propose runs the head over the rows each request had
 * in it (spec_step_rows noted them): the head's row at position p reads the target's hidden
 * state of p and the token at p + 1, so a row whose next token is known (every row kept,
 * the last one once its token is picked) writes the head's K/V of p. The last such row of a
 * request that drafts gives its first draft; each later draft is one more head step, fed
 * the previous draft and the head's own output. The head's KV is laid out by the target's
 * block ids (positions of a cached block carry the head's K/V that its first owner wrote);
 * draft rows past a request's blocks go to scratch blocks of its own. Drafts are greedy, or
 * for a request that samples drawn from the head's law (spec_q_pick). Cost: one head layer over the
 * step's rows, then one head step of one row per drafting request for each further draft.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/head.h"
#include "sched/spec.h"

static int min_i(int a, int b)
{
    return a < b ? a : b;
}

struct spec_head {
    struct model_head *h;
    uint64_t step; /* the steps spec_step_rows has seen */
    int T, seq_cap, max_blocks, bs;
    int scratch0, scr; /* the first scratch block, scratch blocks a drafting request */
    int32_t *tokens, *pos, *slot, *qstart, *seqlen, *bt, *lrows, *picks, *src; /* the step */
    struct request **reqs;                                                     /* drafting */
    int *ks, *row_of;
};

struct spec_head *spec_head_create(struct engine *en, struct err *e)
{
    struct model_head *h = en->cfg.spec.method == SPEC_EAGLE3
                               ? model_head_load_eagle3(en->m, en->cfg.spec.model_dir, e)
                               : model_head_load_mtp(en->m, e);
    if (!h) return NULL;
    struct spec_head *d = xcalloc(1, sizeof *d);
    d->h = h;
    d->bs = en->block_size;
    d->max_blocks = en->max_blocks;
    d->T = en->cfg.max_num_batched_tokens;
    d->seq_cap = min_i(en->cfg.max_num_seqs, d->T);
    d->scr = (SPEC_MAX_TOKENS + d->bs - 1) / d->bs + 1;
    d->scratch0 = en->pool.n_blocks;
    if (model_head_alloc(h, d->T, d->seq_cap, d->scratch0 + d->seq_cap * d->scr, d->bs, e)) {
        spec_head_destroy(d);
        return NULL;
    }
    size_t T = (size_t)d->T, S = (size_t)d->seq_cap;
    d->tokens = xmalloc(sizeof(int32_t) * T);
    d->pos = xmalloc(sizeof(int32_t) * T);
    d->slot = xmalloc(sizeof(int32_t) * T);
    d->src = xmalloc(sizeof(int32_t) * T);
    d->qstart = xmalloc(sizeof(int32_t) * (S + 1));
    d->seqlen = xmalloc(sizeof(int32_t) * S);
    d->bt = xmalloc(sizeof(int32_t) * S * (size_t)d->max_blocks);
    d->lrows = xmalloc(sizeof(int32_t) * S);
    d->picks = xmalloc(sizeof(int32_t) * S);
    d->reqs = xmalloc(sizeof(struct request *) * S);
    d->ks = xmalloc(sizeof(int) * S);
    d->row_of = xmalloc(sizeof(int) * S);
    return d;
}

void spec_head_destroy(struct spec_head *d)
{
    if (!d) return;
    model_head_destroy(d->h);
    free(d->tokens);
    free(d->pos);
    free(d->slot);
    free(d->src);
    free(d->qstart);
    free(d->seqlen);
    free(d->bt);
    free(d->lrows);
    free(d->picks);
    free(d->reqs);
    free(d->ks);
    free(d->row_of);
    free(d);
}

void spec_head_step_rows(struct engine *en, struct spec_head *d, int n_plan)
{
    d->step++;
    const struct step_seq *plan = en->plans[en->cur];
    for (int s = 0; s < n_plan; s++) {
        struct request *r = plan[s].r;
        if (!r || r->embed) continue;
        r->hid_step = d->step;
        r->hid_row = en->b_qstart[s];
        r->hid_pos = en->b_pos[en->b_qstart[s]];
        r->hid_n = plan[s].n_new;
    }
}

/* Block id of block index bi of r for drafting request i: its own, else scratch. */
static int32_t block_of(const struct spec_head *d, const struct request *r, int i, int bi)
{
    if (bi < r->n_blocks) return r->blocks[bi] < 0 ? 0 : r->blocks[bi];
    return d->scratch0 + i * d->scr + (bi - r->n_blocks);
}

static void run(struct spec_head *d, int n_seqs, int nt, int nl, int from_target)
{
    d->qstart[n_seqs] = nt;
    struct fwd_batch b = {.n_tokens = nt,
                          .tokens = d->tokens,
                          .pos = d->pos,
                          .slot = d->slot,
                          .n_seqs = n_seqs,
                          .q_start = d->qstart,
                          .seq_len = d->seqlen,
                          .block_table = d->bt,
                          .max_blocks = d->max_blocks,
                          .n_logits = nl,
                          .logit_rows = d->lrows};
    model_head_forward(d->h, &b, from_target, d->src);
    if (nl > 0) model_argmax(d->h->m, nl, d->picks);
}

void spec_head_propose(struct engine *en, struct spec_head *d)
{
    const int bs = d->bs, n_running = en->running.n;
    int nt = 0, ns = 0, nd = 0, kmax = 0;
    if (n_running >= en->spec->disable_n) {
        /* no request drafts at this batch size: the head does not run at all (its KV then
         * misses these steps' positions, which costs acceptance later, never exactness) */
        for (struct request *r = en->running.head; r; r = r->next) r->n_draft = 0;
        return;
    }
    /* Step one: the head's rows of every request's rows in the last step; the first draft
     * of those that draft from their last row. */
    for (struct request *r = en->running.head; r; r = r->next) {
        int k = spec_want(en, r, n_running);
        if (r->embed || r->hid_step != d->step || ns == d->seq_cap) continue;
        int lo = r->hid_pos,
            hi = min_i(min_i(r->hid_pos + r->hid_n, r->n_computed), r->n_tokens - 1);
        if (hi <= lo || nt + (hi - lo) > d->T) continue;
        d->qstart[ns] = nt;
        for (int p = lo; p < hi; p++, nt++) {
            d->tokens[nt] = r->tokens[p + 1];
            d->pos[nt] = p;
            d->slot[nt] = block_of(d, r, 0, p / bs) * bs + p % bs;
            d->src[nt] = r->hid_row + (p - r->hid_pos);
        }
        d->seqlen[ns] = hi;
        int32_t *row = d->bt + (size_t)ns * d->max_blocks;
        for (int i = 0; i < r->n_blocks; i++) row[i] = r->blocks[i] < 0 ? 0 : r->blocks[i];
        ns++;
        /* draft rows stay inside the block table */
        k = min_i(k, d->max_blocks * bs - (r->n_tokens - 2));
        if (k > 0 && hi == r->n_tokens - 1) {
            d->lrows[nd] = nt - 1;
            d->reqs[nd] = r;
            d->ks[nd] = k;
            kmax = k > kmax ? k : kmax;
            nd++;
        }
    }
    if (ns == 0) return;
    run(d, ns, nt, nd, 1);
    for (int i = 0; i < nd; i++) {
        struct request *r = d->reqs[i];
        r->tokens[r->n_tokens] =
            spec_q_pick(en, r, 0, d->h->m, i, d->h->d2t, model_head_token(d->h, d->picks[i]));
        r->n_draft = 1;
        d->row_of[i] = d->lrows[i];
    }
    /* Steps 2..k: the row at position n_tokens - 2 + j reads draft j and the head's output
     * of the row before it, and gives draft j + 1. */
    for (int j = 1; j < kmax; j++) {
        nt = 0;
        for (int i = 0; i < nd; i++) {
            struct request *r = d->reqs[i];
            if (d->ks[i] <= j) continue;
            int p = r->n_tokens - 2 + j;
            d->qstart[nt] = nt;
            d->tokens[nt] = r->tokens[r->n_tokens + j - 1];
            d->pos[nt] = p;
            d->slot[nt] = block_of(d, r, i, p / bs) * bs + p % bs;
            d->src[nt] = d->row_of[i];
            d->seqlen[nt] = p + 1;
            int32_t *row = d->bt + (size_t)nt * d->max_blocks;
            for (int b = 0; b <= p / bs; b++) row[b] = block_of(d, r, i, b);
            d->lrows[nt] = nt;
            d->row_of[i] = nt;
            nt++;
        }
        if (nt == 0) break;
        run(d, nt, nt, nt, 0);
        for (int i = 0; i < nd; i++) {
            struct request *r = d->reqs[i];
            if (d->ks[i] <= j) continue;
            int row = d->row_of[i];
            r->tokens[r->n_tokens + j] = spec_q_pick(en, r, j, d->h->m, row, d->h->d2t,
                                                     model_head_token(d->h, d->picks[row]));
            r->n_draft = j + 1;
        }
    }
}
