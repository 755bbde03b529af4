/* Speculative decoding: the draft length, the proposals, the verification of a request's
 * rows and its rollback (see spec.h). */
#include "sched/spec.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

const char *spec_method_name(enum spec_method m)
{
    switch (m) {
    case SPEC_NGRAM:
        return "ngram";
    case SPEC_DRAFT:
        return "draft";
    case SPEC_MTP:
        return "mtp";
    case SPEC_EAGLE3:
        return "eagle3";
    default:
        return "none";
    }
}

int spec_create(struct engine *en, struct err *e)
{
    const struct spec_config *c = &en->cfg.spec;
    if (c->method == SPEC_NONE) return 0;
    if (c->method < SPEC_NGRAM || c->method > SPEC_EAGLE3)
        return err_set(e, "--speculative-method: unknown method %d", (int)c->method), -1;
    if (c->num_tokens < 0 || c->num_tokens > SPEC_MAX_TOKENS)
        return err_set(e, "--num-speculative-tokens: must be in [1, %d] (got %d)", SPEC_MAX_TOKENS,
                       c->num_tokens),
               -1;
    struct spec *s = xcalloc(1, sizeof *s);
    s->cfg = *c;
    if (s->cfg.num_tokens == 0) s->cfg.num_tokens = 4;
    if (s->cfg.ngram_min <= 0) s->cfg.ngram_min = 1;
    if (s->cfg.ngram_max <= 0) s->cfg.ngram_max = s->cfg.ngram_min > 4 ? s->cfg.ngram_min : 4;
    if (s->cfg.ngram_max < s->cfg.ngram_min) {
        err_set(e, "--ngram-max (%d) is below --ngram-min (%d)", s->cfg.ngram_max,
                s->cfg.ngram_min);
        free(s);
        return -1;
    }
    s->disable_n = c->disable_by_batch_size > 0 ? c->disable_by_batch_size : 64;
    en->spec = s;
    spec_q_init(en);
    if (c->method == SPEC_DRAFT) {
        if (!c->model_dir || !*c->model_dir) {
            err_set(e, "--speculative-method draft needs --speculative-model DIR");
            return -1;
        }
        s->draft = spec_draft_create(en, c->model_dir, e);
        if (!s->draft) return -1;
    }
    if (c->method == SPEC_EAGLE3 && (!c->model_dir || !*c->model_dir)) {
        err_set(e, "--speculative-method eagle3 needs --speculative-model DIR (the EAGLE-3 head)");
        return -1;
    }
    if (c->method == SPEC_MTP || c->method == SPEC_EAGLE3) {
        s->head = spec_head_create(en, e);
        if (!s->head) return -1;
    }
    return 0;
}

void spec_destroy(struct engine *en)
{
    if (!en->spec) return;
    if (en->spec->draft) spec_draft_destroy(en->spec->draft);
    if (en->spec->head) spec_head_destroy(en->spec->head);
    spec_q_dispose(en->spec);
    free(en->spec);
    en->spec = NULL;
}

int spec_eligible(const struct engine *en, const struct request *r)
{
    return en->spec && r->state == RS_RUNNING && !r->embed && !r->gm && !r->steer &&
           r->ph_pos < 0 && r->n_output >= 1 && r->n_tokens - r->n_computed == 1 &&
           (!r->plp || r->plp_sent);
}

void spec_observe(struct engine *en, int rows, double dt)
{
    struct spec *s = en->spec;
    if (!s || rows <= 0 || !(dt > 0)) return;
    sched_fit_add(&s->fit, 0.98, rows, 0, dt); /* forgets over about 50 steps */
}

double spec_threshold(const struct engine *en, int n_running)
{
    double a, b, c;
    if (!sched_fit_solve(&en->spec->fit, 0, &a, &b, &c)) return 0.25;
    if (b <= 0) return 0.05; /* rows cost nothing measurable */
    double n = n_running > 0 ? n_running : 1, t = b * n / (a + b * n);
    return t < 0.05 ? 0.05 : t;
}

int spec_k(const struct engine *en, const struct request *r, int n_running)
{
    const struct spec *s = en->spec;
    int K = s->cfg.num_tokens, D = s->disable_n;
    if (n_running >= D) return 0;
    int kb = (K * (D - n_running) + D - 1) / D;
    /* the k-th draft is kept with probability rate^k: worth its row while that is at least
     * the threshold */
    /* a seeded request with drafts drawn from a law: its tokens depend on where it had
     * drafts, which then must not follow measured step times (the same seed alone, the
     * same tokens) */
    double rate = r->spec_rate;
    double thr =
        s->q_ids && r->sp.has_seed && r->sp.temperature > 0 ? 0.25 : spec_threshold(en, n_running);
    int ka = K;
    if (rate < thr)
        ka = 0;
    else if (rate < 1)
        ka = (int)floor(log(thr) / log(rate) + 1e-9);
    int k = kb < ka ? kb : ka;
    int left = r->sp.max_tokens - r->n_output - 1; /* every kept draft is one more output */
    return k < left ? k : left > 0 ? left : 0;
}

int spec_want(const struct engine *en, struct request *r, int n_running)
{
    r->n_draft = r->n_q = 0;
    if (!spec_eligible(en, r)) return 0;
    int k = spec_k(en, r, n_running);
    if (k <= 0) {
        /* no drafts for a low acceptance: it creeps back up, so that drafts are tried
         * again after a while (about 35 steps from 0 to 1/2) */
        r->spec_rate += 0.02f * (1 - r->spec_rate);
        return 0;
    }
    return k;
}

void spec_step_rows(struct engine *en, int n_plan)
{
    if (en->spec && en->spec->head) spec_head_step_rows(en, en->spec->head, n_plan);
}

void spec_propose(struct engine *en)
{
    struct spec *s = en->spec;
    if (!s) return;
    s->q_used = 0; /* the laws of the last step's drafts are spent */
    if (s->head) {
        spec_head_propose(en, s->head);
        return;
    }
    int n_running = en->running.n, n = 0;
    struct request *reqs[64];
    int ks[64];
    for (struct request *r = en->running.head; r; r = r->next) {
        int k = spec_want(en, r, n_running);
        if (k <= 0) continue;
        if (s->cfg.method == SPEC_NGRAM) {
            r->n_draft = spec_ngram_propose(r->tokens, r->n_tokens, s->cfg.ngram_min,
                                            s->cfg.ngram_max, k, r->tokens + r->n_tokens);
            continue;
        }
        /* the draft model runs them in batches of up to 64 sequences */
        reqs[n] = r;
        ks[n++] = k;
        if (n == 64) {
            spec_draft_propose(en, s->draft, reqs, ks, n);
            n = 0;
        }
    }
    if (n) spec_draft_propose(en, s->draft, reqs, ks, n);
}

int spec_plan(struct engine *en, struct request *r, int budget, int rows)
{
    int k = r->n_draft < budget ? r->n_draft : budget;
    if (k > rows) k = rows;
    if (k > 0 && en->hybrid) { /* no row past a due snapshot; a slot for the backup */
        int c = step_cap_snapshot(en, r, r->n_computed, 1 + k) - 1;
        if (c < k) k = c;
        if (!kv_can_allocate(&en->states, 1, NULL, 0)) k = 0;
    }
    int bs = en->block_size;
    int want = (r->n_computed + 1 + k + bs - 1) / bs;
    if (k > 0 && want > r->n_blocks && !kv_can_allocate(&en->pool, want - r->n_blocks, NULL, 0))
        k = 0;
    if (k < r->n_draft) spec_drop(en, r);
    return k > 0 ? k : 0;
}

void spec_commit(struct engine *en, struct request *r)
{
    if (!en->hybrid) return;
    kv_allocate(&en->states, 1, &r->state_backup);
    tier_reuse_state(en, r->state_backup);
    model_state_copy(en->m, r->state_backup, r->state_slot);
}

/* Hybrid models: the recurrent state after a verification is that after all its rows. When
 * every draft was kept it is the request's; else the state before the step comes back and
 * the kept rows are computed again by the next step (the token form of the delta rule, as
 * plain decoding computes them: the same bits). The backup slot goes back either way. */
static void settle_state(struct engine *en, struct request *r, int all_kept, int before)
{
    if (r->state_backup < 0) return;
    if (!all_kept) {
        model_state_copy(en->m, r->state_slot, r->state_backup);
        r->n_computed = before;
    }
    kv_release(&en->states, &r->state_backup, 1);
    r->state_backup = -1;
}

void spec_draw_rows(struct engine *en, const struct step_seq *p, struct sample_row *rows)
{
    (void)en;
    struct request *r = p->r;
    const struct sampling_params *sp = &r->sp;
    r->rng_saved = r->rng;
    for (int j = 0; j < p->n_logits; j++) {
        struct sample_row *row = &rows[p->logit_row + j];
        row->temperature = sp->temperature;
        if (sp->temperature <= 0) continue;
        row->top_k = sp->top_k;
        row->top_p = sp->top_p;
        row->min_p = sp->min_p;
        row->u = (float)rng_uniform(&r->rng);
    }
}

void spec_drop(struct engine *en, struct request *r)
{
    r->n_draft = 0;
    if (en->spec && en->spec->draft) spec_draft_rollback(en, en->spec->draft, r, r->n_tokens);
}

void spec_release(struct engine *en, struct request *r)
{
    r->n_draft = r->n_q = 0;
    if (r->state_backup >= 0) {
        kv_release(&en->states, &r->state_backup, 1);
        r->state_backup = -1;
    }
    if (en->spec && en->spec->draft) spec_draft_release(en->spec->draft, r);
}

/* Counts one verification of k drafts with a accepted, and the a accepted tokens as
 * generated (the step counted the first token of each sampling sequence). */
static void count(struct engine *en, int k, int a)
{
    int m = en->spec->cfg.method;
    pthread_mutex_lock(&en->mu);
    struct engine_stats *st = &en->stats;
    st->spec_drafts[m]++;
    st->spec_draft_tokens[m] += (uint64_t)k;
    st->spec_accepted_tokens[m] += (uint64_t)a;
    st->spec_accept_hist[m][a]++;
    for (int i = 0; i < a; i++) st->spec_accepted_pos[m][i]++;
    st->generation_tokens += (uint64_t)a;
    pthread_mutex_unlock(&en->mu);
}

void spec_verify(struct engine *en, struct step_seq *p)
{
    struct request *r = p->r;
    const int k = p->n_spec, base = r->n_tokens, V = en->vocab, bs = en->block_size;
    int32_t out[SPEC_MAX_TOKENS + 1];
    int n_out = 0;
    /* The target's pick of each row, as plain decoding would make it: the penalties see
     * the drafts before the row (accepted so far) as output. A draft drawn from a law is
     * kept or replaced by the rejection rule instead (the rows are then on the host). Row j
     * takes the j-th uniform number of r's generator either way. */
    assert(!en->greedy_step || r->n_q == 0);
    for (int j = 0; j <= k; j++) {
        int lr = p->logit_row + j, kept = 0;
        const float *row = en->logits + (size_t)lr * V;
        r->n_tokens = base + j;
        int32_t t = en->greedy_step       ? en->greedy[lr]
                    : j < k && j < r->n_q ? spec_q_verify(en, r, j, row, &kept)
                                          : sample_next(en, r, row);
        out[n_out++] = t;
        /* a draft is kept when the row's token is it (the rule draws from the residual,
         * which never holds the draft, except where p and q agree to rounding) */
        if (j == k || t != r->tokens[base + j]) break;
    }
    r->n_tokens = base;
    r->n_q = 0;
    const int a = n_out - 1; /* drafts accepted */
    if (en->greedy_step && r->sp.temperature > 0) {
        /* rows sampled by the backend drew k + 1 numbers: keep those of the tokens kept */
        r->rng = r->rng_saved;
        for (int i = 0; i < n_out; i++) rng_uniform(&r->rng);
    }
    /* The accepted drafts' K/V are the request's; the rejected rows' lie past it (written
     * again when their positions come) and the blocks only they took go back. */
    r->n_computed += a;
    settle_state(en, r, a == k, base - 1);
    int keep = (base + n_out + bs - 1) / bs;
    if (keep < r->n_blocks) {
        kv_release(&en->pool, r->blocks + keep, r->n_blocks - keep);
        r->n_blocks = keep;
    }
    if (en->spec->draft) spec_draft_rollback(en, en->spec->draft, r, base + (a < k ? a : k - 1));
    r->spec_rate = 0.8f * r->spec_rate + 0.2f * (float)a / (float)k;
    count(en, k, a);
    for (int i = 0; i < n_out; i++) {
        const float *row = en->logits + (size_t)(p->logit_row + i) * V;
        if (step_emit(en, r, out[i], row) != FINISH_NONE) return; /* r is gone */
    }
    step_commit_blocks(en, r);
}
