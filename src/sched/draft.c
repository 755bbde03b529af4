/*
 * Draft-model drafts: a smaller model with the target's vocabulary, on the same backend,
 * with its own paged KV (block tables in the requests, no prefix sharing). For k drafts of
 * a batch of requests it runs k steps: the first brings each request's draft K/V up to its
 * known tokens (the tokens the last verification kept, or the whole context after a
 * preemption, in pieces under the step budget) and picks the first draft from the last row;
 * each later step feeds one draft and picks the next: greedily, or for a request that samples
 * drawn from the draft model's law (spec_q_pick). Buffers are sized at start-up.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sched/spec.h"

struct spec_draft {
    struct model *m;
    struct kv_pool pool;
    int T, seq_cap, max_blocks, bs;
    int32_t *tokens, *pos, *slot, *qstart, *seqlen, *bt, *lrows, *picks; /* the step */
    int *row_of;                                                         /* [seq_cap] */
};

struct spec_draft *spec_draft_create(struct engine *en, const char *dir, struct err *e)
{
    struct model *m = model_load(dir, &en->be, e);
    if (!m) return NULL;
    const struct model_config *c = &m->cfg, *t = &en->m->cfg;
    if (c->vocab != t->vocab) {
        err_set(e,
                "--speculative-model %s: its vocabulary has %d tokens, the model's %d: a draft "
                "model must share the tokenizer",
                dir, c->vocab, t->vocab);
        model_destroy(m);
        return NULL;
    }
    if (model_state_bytes(m) > 0) {
        err_set(e,
                "--speculative-model %s: a draft model with linear-attention layers is not "
                "supported (its recurrent state cannot be rolled back)",
                dir);
        model_destroy(m);
        return NULL;
    }
    struct spec_draft *d = xcalloc(1, sizeof *d);
    d->m = m;
    d->bs = en->block_size;
    d->max_blocks = en->max_blocks;
    d->T = en->cfg.max_num_batched_tokens;
    d->seq_cap = 64;
    /* as many tokens as the target's pool holds */
    int n_blocks = en->pool.n_blocks;
    if (model_state_alloc(m, d->T, d->seq_cap, n_blocks, d->bs, 0, e)) {
        spec_draft_destroy(d);
        return NULL;
    }
    kv_pool_init(&d->pool, n_blocks, d->bs, "draft", 5);
    d->tokens = xmalloc(sizeof(int32_t) * (size_t)d->T);
    d->pos = xmalloc(sizeof(int32_t) * (size_t)d->T);
    d->slot = xmalloc(sizeof(int32_t) * (size_t)d->T);
    d->qstart = xmalloc(sizeof(int32_t) * (size_t)(d->seq_cap + 1));
    d->seqlen = xmalloc(sizeof(int32_t) * (size_t)d->seq_cap);
    d->bt = xmalloc(sizeof(int32_t) * (size_t)d->seq_cap * (size_t)d->max_blocks);
    d->lrows = xmalloc(sizeof(int32_t) * (size_t)d->seq_cap);
    d->picks = xmalloc(sizeof(int32_t) * (size_t)d->seq_cap);
    d->row_of = xmalloc(sizeof(int) * (size_t)d->seq_cap);
    return d;
}

void spec_draft_destroy(struct spec_draft *d)
{
    if (!d) return;
    if (d->tokens) kv_pool_dispose(&d->pool);
    free(d->tokens);
    free(d->pos);
    free(d->slot);
    free(d->qstart);
    free(d->seqlen);
    free(d->bt);
    free(d->lrows);
    free(d->picks);
    free(d->row_of);
    model_destroy(d->m);
    free(d);
}

void spec_draft_release(struct spec_draft *d, struct request *r)
{
    if (!r->dblocks) return;
    kv_release(&d->pool, r->dblocks, r->n_dblocks);
    r->n_dblocks = 0;
    r->d_computed = 0;
}

void spec_draft_rollback(struct engine *en, struct spec_draft *d, struct request *r, int valid)
{
    (void)en;
    (void)d;
    if (r->d_computed > valid) r->d_computed = valid;
}

/* Appends request r's rows [from, to) (tokens at those positions) as sequence s. */
static void add_seq(struct spec_draft *d, int s, const struct request *r, int from, int to, int *nt)
{
    d->qstart[s] = *nt;
    for (int p = from; p < to; p++, (*nt)++) {
        d->tokens[*nt] = r->tokens[p];
        d->pos[*nt] = p;
        d->slot[*nt] = r->dblocks[p / d->bs] * d->bs + p % d->bs;
    }
    d->seqlen[s] = to;
    memcpy(d->bt + (size_t)s * d->max_blocks, r->dblocks, sizeof(int32_t) * (size_t)r->n_dblocks);
}

static void run(struct spec_draft *d, int n_seqs, int nt, int nl)
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
    model_forward(d->m, &b, NULL);
    if (nl > 0) model_argmax(d->m, nl, d->picks);
}

void spec_draft_propose(struct engine *en, struct spec_draft *d, struct request **reqs, int *k,
                        int n)
{
    int budget = d->T, nt = 0, ns = 0, nl = 0, kmax = 0;
    /* Step one: each request's draft K/V up to its known tokens; the first draft from
     * the last row. Blocks for every position the drafts will take come first. */
    for (int i = 0; i < n; i++) {
        struct request *r = reqs[i];
        r->n_draft = 0;
        int catch = r->n_tokens - r->d_computed, take = catch < budget ? catch : budget;
        if (take <= 0) {
            k[i] = 0;
            continue;
        }
        if (take < catch) k[i] = 0; /* catching up in pieces: no draft this step */
        int last = r->d_computed + take + (k[i] > 1 ? k[i] - 1 : 0); /* positions < last */
        int want = (last + d->bs - 1) / d->bs, need = want > r->n_dblocks ? want - r->n_dblocks : 0;
        if (!kv_can_allocate(&d->pool, need, NULL, 0)) {
            k[i] = 0;
            continue;
        }
        kv_allocate(&d->pool, need, r->dblocks + r->n_dblocks);
        r->n_dblocks += need;
        add_seq(d, ns, r, r->d_computed, r->d_computed + take, &nt);
        r->d_computed += take;
        d->row_of[i] = -1;
        if (k[i] > 0) {
            d->row_of[i] = nl;
            d->lrows[nl++] = nt - 1;
        }
        if (k[i] > kmax) kmax = k[i];
        budget -= take;
        ns++;
    }
    if (ns == 0) return;
    run(d, ns, nt, nl);
    for (int i = 0; i < n; i++)
        if (k[i] > 0) {
            struct request *r = reqs[i];
            r->tokens[r->n_tokens] =
                spec_q_pick(en, r, 0, d->m, d->row_of[i], NULL, d->picks[d->row_of[i]]);
            r->n_draft = 1;
        }
    /* Steps 2..k: feed draft j - 1, pick draft j. */
    for (int j = 1; j < kmax; j++) {
        nt = ns = 0;
        for (int i = 0; i < n; i++) {
            struct request *r = reqs[i];
            if (k[i] <= j) continue;
            int p = r->n_tokens + j - 1;
            add_seq(d, ns, r, p, p + 1, &nt);
            r->d_computed = p + 1;
            d->row_of[i] = ns;
            d->lrows[ns] = nt - 1;
            ns++;
        }
        if (ns == 0) break;
        run(d, ns, nt, ns);
        for (int i = 0; i < n; i++)
            if (k[i] > j) {
                struct request *r = reqs[i];
                r->tokens[r->n_tokens + j] =
                    spec_q_pick(en, r, j, d->m, d->row_of[i], NULL, d->picks[d->row_of[i]]);
                r->n_draft = j + 1;
            }
    }
}
