/*
 * One engine step (after vLLM v1's scheduler): plan which tokens of which requests run,
 * allocate their KV blocks (plan, then commit), run one forward pass over the flattened
 * batch, then sample, emit events and retire finished requests.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "paged_kv/kv_events.h"
#include "sched/engine_impl.h"
#include "sched/spec.h"

static int min_i(int a, int b)
{
    return a < b ? a : b;
}

/* Hashes of the request's full blocks of known tokens (up to a placeholder), extended as
 * tokens are appended. */
static void update_hashes(struct engine *en, struct request *r)
{
    int full = (r->ph_pos >= 0 ? r->ph_pos : r->n_tokens) / en->block_size;
    for (int i = r->n_hashes; i < full; i++)
        r->hashes[i] =
            kv_block_hash(&en->pool, i ? &r->hashes[i - 1] : NULL,
                          r->tokens + (size_t)i * en->block_size, en->block_size, NULL, 0);
    if (full > r->n_hashes) r->n_hashes = full;
}

static int wants_prompt_rows(const struct request *r)
{
    return r->plp && !r->plp_sent && r->n_computed < r->n_prompt;
}

/* Gives r's recurrent-state slot back. A state that ends at a block boundary is named by
 * that block's hash first, so that it stays as a prefix snapshot while the slot is free. */
void req_release_state(struct engine *en, struct request *r)
{
    if (r->state_slot < 0) return;
    int bs = en->block_size, k = r->n_computed / bs;
    if (!en->cfg.disable_prefix_caching && k > 0 && r->n_computed % bs == 0) {
        update_hashes(en, r);
        if (k <= r->n_hashes && kv_lookup(&en->states, r->hashes[k - 1]) < 0 &&
            kv_commit_hash(&en->states, r->state_slot, r->hashes[k - 1]) && (en->tier || en->host))
            tier_store_state(en, r->state_slot, r->hashes[k - 1]);
    }
    kv_release(&en->states, &r->state_slot, 1);
    r->state_slot = -1;
}

/* After a step: a copy of r's state where it ends at the end of the prompt's last full
 * block, or at every hybrid_state_interval-th block, named by that block's hash. Best
 * effort: without a free slot no snapshot is taken. */
static void snapshot(struct engine *en, struct request *r)
{
    if (!en->hybrid || en->cfg.disable_prefix_caching || r->state_slot < 0) return;
    int bs = en->block_size, k = r->n_computed / bs, iv = en->cfg.hybrid_state_interval;
    if (k < 1 || r->n_computed % bs) return;
    if (k != r->n_prompt / bs && !(iv > 0 && k % iv == 0)) return;
    update_hashes(en, r);
    if (k > r->n_hashes || kv_lookup(&en->states, r->hashes[k - 1]) >= 0) return;
    int32_t slot;
    if (!kv_can_allocate(&en->states, 1, NULL, 0) || kv_allocate(&en->states, 1, &slot)) return;
    tier_reuse_state(en, slot);
    model_state_copy(en->m, slot, r->state_slot);
    kv_commit_hash(&en->states, slot, r->hashes[k - 1]);
    if (en->tier || en->host) tier_store_state(en, slot, r->hashes[k - 1]);
    kv_release(&en->states, &slot, 1);
}

/* Hybrid models: a chunk ends where a snapshot is due, so that the state is there to copy. */
int step_cap_snapshot(const struct engine *en, const struct request *r, int computed, int n_new)
{
    if (!en->hybrid || en->cfg.disable_prefix_caching) return n_new;
    int bs = en->block_size, end = computed + n_new, iv = en->cfg.hybrid_state_interval;
    int last = r->n_prompt / bs * bs;
    if (last > computed && last < end) end = last;
    if (iv > 0) {
        int next = (computed / (iv * bs) + 1) * iv * bs;
        if (next < end) end = next;
    }
    return end - computed;
}

/* Hybrid models: a piece that stops below the request's chunk mark stops at a chunk
 * boundary, where the delta rule's chunked form needs it; 0 when no whole chunk fits. */
static int cap_chunk(const struct engine *en, const struct request *r, int computed, int n_new)
{
    int C = en->delta_chunk, end = computed + n_new;
    if (!C || end >= chunk_mark(en, r)) return n_new;
    end = end / C * C;
    return end > computed ? end - computed : 0;
}

static void preempt(struct engine *en, struct request *v, uint64_t *n_preempt)
{
    list_remove(&en->running, v);
    req_release_state(en, v);
    spec_release(en, v);
    kv_release(&en->pool, v->blocks, v->n_blocks);
    v->n_blocks = 0;
    v->n_computed = 0;
    v->n_committed = 0;
    /* Swap: its full blocks were copied to the host tier as they were registered; when it
     * resumes it looks them up there again (a request looks up the tiers once otherwise),
     * so that only what the host tier lost and its last partial block are recomputed. */
    if (en->cfg.preemption_mode == PREEMPTION_SWAP) v->tier_tried = 0;
    if (v->embed) embed_reset(en, v);
    v->state = RS_WAITING;
    list_insert_ordered(&en->waiting, v);
    (*n_preempt)++;
}

/* Blocks r still needs so that n_new more tokens have rows. */
static int blocks_needed(const struct engine *en, int computed, int have, int n_new)
{
    int want = (computed + n_new + en->block_size - 1) / en->block_size;
    return want > have ? want - have : 0;
}

/* Caps a chunk by the logit rows left for prompt log-probabilities. */
static int cap_prompt_rows(const struct request *r, int n_new, int lp_left)
{
    return wants_prompt_rows(r) ? min_i(n_new, lp_left) : n_new;
}

struct step_counts {
    uint64_t preempt, prompt_tokens, gen_tokens, q_tokens, hit_tokens;
    int planned; /* tokens planned (the prefill-rate estimate of the disk tier) */
    /* queue times of the requests first scheduled this step */
    uint64_t queue_hist[ENGINE_QUEUE_BUCKETS + 1];
    double queue_sum;
};

/* Whether these parameters need the request's logit rows on the host: logit bias,
 * penalties or log-probabilities of the chosen token. */
static int host_row_params(const struct sampling_params *sp)
{
    return sp->n_logit_bias || sp->logprobs || sp->top_logprobs || sp->repetition_penalty != 1.0f ||
           sp->presence_penalty != 0 || sp->frequency_penalty != 0;
}

/* Whether the request's tokens can all be picked where the logits are (nothing read on the
 * host): then the step after one that runs it need not wait for its token. */
static int pickable(const struct engine *en, const struct request *r)
{
    return !r->plp && !r->embed && !r->gm && !r->steer && !host_row_params(&r->sp) &&
           (r->sp.temperature <= 0 || model_can_sample(en->m)) && !en->spec;
}

/* The step-time bound while a step is planned: the rows and keys planned (decode rows
 * reserved first), and the prefill tokens admitted. */
struct step_time {
    int on; /* --max-step-ms is set and the model is fitted */
    double t_max;
    int rows, prefill;
    double ctx;
    int capped;
};

/* Reserves the rows of every running request that decodes (one token to compute, and its
 * drafts unless planning ahead): they run whatever the bound says. */
static void time_start(struct engine *en, struct step_time *tb, int ahead)
{
    *tb = (struct step_time){0};
    if (!(en->cfg.max_step_ms > 0) || !en->cost.ready) return;
    tb->on = 1;
    tb->t_max = en->cfg.max_step_ms * 1e-3;
    for (const struct request *r = en->running.head; r; r = r->next) {
        if (r->n_tokens - r->n_computed != 1) continue;
        int n = 1 + (ahead ? 0 : r->n_draft);
        tb->rows += n;
        tb->ctx += sched_cost_keys(r->n_computed, n);
    }
}

/* Caps a chunk of n_new tokens of a request with `computed` tokens: the long-prefill
 * threshold, then the time bound (prefill chunks only; a decode row was reserved). */
static int cap_time(const struct engine *en, struct step_time *tb, int computed, int n_new,
                    int decode)
{
    int lt = en->cfg.long_prefill_token_threshold;
    if (lt > 0 && lt < en->delta_chunk) lt = en->delta_chunk; /* else no whole chunk fits */
    if (lt > 0 && n_new > lt) n_new = lt;
    if (!tb->on || decode) return n_new;
    int n = sched_cost_fit_tokens(&en->cost, tb->t_max, tb->rows, tb->ctx, computed, n_new);
    /* A cut chunk ends at a whole block: fewer step shapes (a backend that replays captured
     * steps by shape captures fewer) and blocks that fill in one piece. */
    if (n < n_new) {
        n = n / en->block_size * en->block_size;
        tb->capped = 1;
    }
    /* a step admits a block of prefill whatever the bound says, so that prefill moves on
     * however long the decode rows alone take */
    int floor = min_i(n_new, en->block_size - tb->prefill);
    return n > floor ? n : floor;
}

/* A prefill chunk joined the step: its rows count against the bound. */
static void time_add(struct step_time *tb, int computed, int n)
{
    tb->rows += n;
    tb->ctx += sched_cost_keys(computed, n);
    tb->prefill += n;
}

/*
 * Plans the next step into en->plans[en->cur]. With `ahead` set, a step is in flight whose
 * tokens are not read yet: nothing is preempted (the planner stops where blocks run short)
 * and no request whose tokens need the host joins; either sets en->want_sync, so that the
 * following step reads the tokens first and plans as usual.
 */
static int plan_step(struct engine *en, struct step_counts *sc, int *lp_left, int ahead)
{
    int budget = en->cfg.max_num_batched_tokens, n_plan = 0, preempted = 0;
    int seq_cap = min_i(en->cfg.max_num_seqs, en->cfg.max_num_batched_tokens);
    struct step_seq *plan = en->plans[en->cur];
    en->plan_n[en->cur] = 0;
    struct step_time tb;
    time_start(en, &tb, ahead);
    en->shape[en->cur].capped = 0;

    /* Running requests first, in priority order; when blocks run out, the last one (lowest
     * priority, latest arrival) goes back to waiting and will be recomputed. */
    for (struct request *r = en->running.head; r && budget > 0 && n_plan < seq_cap;) {
        const int decode = r->n_tokens - r->n_computed == 1;
        int n_new = cap_prompt_rows(r, min_i(r->n_tokens - r->n_computed, budget), *lp_left);
        n_new = cap_time(en, &tb, r->n_computed, n_new, decode);
        n_new = step_cap_snapshot(en, r, r->n_computed, n_new);
        n_new = cap_chunk(en, r, r->n_computed, n_new);
        if (n_new <= 0) {
            r = r->next;
            continue;
        }
        /* Drafts ride as extra rows where the budget, the logit rows and the pool have room
         * for them (they never preempt anything). */
        int k = ahead || n_new != 1 ? 0 : spec_plan(en, r, budget - 1, *lp_left);
        n_new += k;
        int need = blocks_needed(en, r->n_computed, r->n_blocks, n_new), self = 0;
        if (ahead && !kv_can_allocate(&en->pool, need, NULL, 0)) {
            en->want_sync = 1;
            en->plan_n[en->cur] = n_plan;
            return n_plan;
        }
        while (!kv_can_allocate(&en->pool, need, NULL, 0)) {
            struct request *v = en->running.tail;
            preempted = 1;
            preempt(en, v, &sc->preempt);
            if (v == r) {
                self = 1;
                break;
            }
        }
        if (self) break;
        kv_allocate(&en->pool, need, r->blocks + r->n_blocks);
        tier_reuse(en, r->blocks + r->n_blocks, need);
        r->n_blocks += need;
        if (k > 0) spec_commit(en, r);
        plan[n_plan++] = (struct step_seq){r, n_new, -1, 0, 0, 0, 0, 0, k};
        if (!decode) time_add(&tb, r->n_computed, n_new);
        budget -= n_new;
        sc->planned += n_new;
        if (wants_prompt_rows(r)) *lp_left -= n_new;
        *lp_left -= k;
        r = r->next;
    }
    en->plan_n[en->cur] = n_plan;
    en->shape[en->cur].capped = tb.capped;
    if (preempted) return n_plan;

    /* Then waiting ones, while the budget, the sequence cap and the pool allow; those
     * whose blocks are on their way from disk wait aside. */
    for (struct request *r = en->waiting.head, *nx;
         r && budget > 0 && en->running.n < en->cfg.max_num_seqs && n_plan < seq_cap; r = nx) {
        nx = r->next;
        if (r->loading) continue;
        if (ahead && !pickable(en, r)) {
            en->want_sync = 1;
            break;
        }
        update_hashes(en, r);
        int n_hit = 0;
        if (!en->cfg.disable_prefix_caching && !r->plp && !embed_whole_prompt(en, r)) {
            n_hit = kv_lookup_prefix(&en->pool, r->hashes, r->n_hashes, en->hit_blocks);
            if (n_hit * en->block_size >= r->n_tokens) n_hit--; /* compute at least one token */
            if (tier_try_load(en, r, n_hit)) continue;
        }
        /* A hybrid model resumes only where a state snapshot ends a hit block. */
        int32_t snap = -1;
        while (en->hybrid && n_hit > 0 && (snap = kv_lookup(&en->states, r->hashes[n_hit - 1])) < 0)
            n_hit--;
        int computed = n_hit * en->block_size;
        int n_new = min_i(r->n_tokens - computed, budget);
        if (wants_prompt_rows(r)) n_new = min_i(n_new, *lp_left);
        n_new = cap_time(en, &tb, computed, n_new, 0);
        n_new = step_cap_snapshot(en, r, computed, n_new);
        n_new = cap_chunk(en, r, computed, n_new);
        if (n_new <= 0) break;
        int need = blocks_needed(en, computed, n_hit, n_new);
        if (!kv_can_allocate(&en->pool, need, en->hit_blocks, n_hit)) break;
        if (en->hybrid && !kv_can_allocate(&en->states, 1, &snap, snap >= 0)) break;
        if (en->hybrid) {
            if (snap >= 0) kv_touch(&en->states, &snap, 1);
            kv_allocate(&en->states, 1, &r->state_slot);
            tier_reuse_state(en, r->state_slot);
            if (snap >= 0) {
                model_state_copy(en->m, r->state_slot, snap);
                kv_release(&en->states, &snap, 1);
            }
        }
        kv_touch(&en->pool, en->hit_blocks, n_hit);
        memcpy(r->blocks, en->hit_blocks, sizeof(int32_t) * (size_t)n_hit);
        kv_allocate(&en->pool, need, r->blocks + n_hit);
        tier_reuse(en, r->blocks + n_hit, need);
        r->n_blocks = n_hit + need;
        r->n_computed = computed;
        r->n_committed = n_hit;
        if (!r->scheduled_once) {
            r->n_cached = computed;
            r->scheduled_once = 1;
            double q = util_now() - r->t_submit;
            int bk = 0;
            while (bk < ENGINE_QUEUE_BUCKETS && q > engine_queue_bucket_bounds[bk]) bk++;
            sc->queue_hist[bk]++;
            sc->queue_sum += q;
        }
        sc->q_tokens += (uint64_t)r->n_tokens;
        sc->hit_tokens += (uint64_t)computed;
        list_remove(&en->waiting, r);
        r->state = RS_RUNNING;
        list_insert_ordered(&en->running, r);
        plan[n_plan++] = (struct step_seq){r, n_new, -1, 0, 0, 0, 0, 0, 0};
        en->plan_n[en->cur] = n_plan;
        time_add(&tb, computed, n_new);
        budget -= n_new;
        sc->planned += n_new;
        if (wants_prompt_rows(r)) *lp_left -= n_new;
    }
    en->shape[en->cur].capped = tb.capped;
    return n_plan;
}

/* Flattens the plan into the forward batch (a placeholder's token taken from its pick).
 * Returns the number of logit rows. */
static int build_batch(struct engine *en, int n_plan, struct fwd_batch *b)
{
    int bs = en->block_size, nt = 0, nl = 0, nh = 0, picked = 0;
    for (int s = 0; s < n_plan; s++) {
        struct step_seq *p = &en->plans[en->cur][s];
        struct request *r = p->r;
        en->b_qstart[s] = nt;
        for (int j = 0; j < p->n_new; j++, nt++) {
            int pos = r->n_computed + j;
            en->b_tokens[nt] = r->tokens[pos];
            en->b_pick[nt] = -1;
            if (pos == r->ph_pos) {
                en->b_tokens[nt] = 0;
                en->b_pick[nt] = r->ph_row;
                picked = 1;
            }
            en->b_pos[nt] = pos;
            en->b_slot[nt] = r->blocks[pos / bs] * bs + pos % bs;
        }
        en->b_seqlen[s] = r->n_computed + p->n_new;
        en->b_state[s] = r->state_slot;
        en->b_chunked[s] = chunk_mark(en, r);
        int32_t *row = en->b_bt + (size_t)s * en->max_blocks;
        for (int i = 0; i < r->n_blocks; i++) row[i] = r->blocks[i] < 0 ? 0 : r->blocks[i];
        int done = r->n_computed + p->n_new == r->n_tokens;
        if (p->n_spec > 0) { /* verification: every row's logits */
            p->logit_row = nl;
            p->n_logits = p->n_new;
            for (int j = 0; j < p->n_new; j++) en->b_logit_rows[nl++] = en->b_qstart[s] + j;
        } else if (wants_prompt_rows(r)) {
            p->logit_row = nl;
            p->n_logits = p->n_new;
            p->all_rows = 1;
            for (int j = 0; j < p->n_new; j++) en->b_logit_rows[nl++] = en->b_qstart[s] + j;
        } else if (done) {
            p->logit_row = nl;
            p->n_logits = 1;
            en->b_logit_rows[nl++] = nt - 1;
        }
        p->samples = (done || p->n_spec > 0) && p->n_logits > 0;
        if (r->embed) {
            p->hid_row = nh;
            p->n_hid = embed_plan_rows(en, p, en->b_qstart[s], en->b_hidden_rows + nh);
            nh += p->n_hid;
        }
    }
    en->b_qstart[n_plan] = nt;
    *b = (struct fwd_batch){.n_tokens = nt,
                            .tokens = en->b_tokens,
                            .pos = en->b_pos,
                            .slot = en->b_slot,
                            .n_seqs = n_plan,
                            .q_start = en->b_qstart,
                            .seq_len = en->b_seqlen,
                            .block_table = en->b_bt,
                            .max_blocks = en->max_blocks,
                            .n_logits = nl,
                            .logit_rows = en->b_logit_rows,
                            .pick_rows = picked ? en->b_pick : NULL,
                            .state_slot = en->hybrid ? en->b_state : NULL,
                            .n_hidden = nh,
                            .hidden_rows = en->b_hidden_rows,
                            .delta_chunked = en->delta_chunk ? en->b_chunked : NULL,
                            .delta_chunk = en->delta_chunk};
    return nl;
}

/* Log-probabilities of prompt tokens predicted by rows of this chunk. */
static void record_prompt_logprobs(struct engine *en, struct request *r, int first_pos, int n,
                                   const float *rows)
{
    int k = r->sp.prompt_logprobs;
    for (int j = 0; j < n; j++) {
        int target = first_pos + j + 1;
        if (target >= r->n_prompt) break;
        const float *row = rows + (size_t)j * en->vocab;
        r->plp[target] = sampler_logprob(row, en->vocab, r->tokens[target]);
        if (k) sampler_top_logprobs(row, en->vocab, k, r->ptop + (size_t)target * k);
    }
}

static void emit(struct request *r, const struct engine_event *ev)
{
    if (r->cb) r->cb(r->user, ev);
}

static enum finish_reason stop_check(const struct engine *en, const struct request *r, int32_t t)
{
    if (!r->sp.ignore_eos) {
        const struct model_config *c = &en->m->cfg;
        for (int i = 0; i < c->n_eos; i++)
            if (c->eos_ids[i] == t) return FINISH_STOP;
    }
    for (int i = 0; i < r->sp.n_stop_ids; i++)
        if (r->sp.stop_ids[i] == t) return FINISH_STOP;
    if (r->gm && gram_matcher_is_terminated(r->gm)) return FINISH_STOP; /* nothing may follow */
    if (r->n_output >= r->sp.max_tokens || r->n_tokens >= en->max_model_len) return FINISH_LENGTH;
    return FINISH_NONE;
}

/* Reports r's blocks [a, b), just stored, as one BlockStored event. */
static void store_event(struct engine *en, const struct request *r, int a, int b)
{
    kv_events_stored(en->cfg.kv_events, r->hashes + a, b - a, a ? &r->hashes[a - 1] : NULL,
                     r->tokens + (size_t)a * (size_t)en->block_size);
}

/* Registers the request's full blocks of known tokens that its computed rows cover, for
 * prefix sharing (and reports them to the KV-events publisher when there is one). */
void step_commit_blocks(struct engine *en, struct request *r)
{
    if (en->cfg.disable_prefix_caching) return;
    update_hashes(en, r);
    int full = min_i(r->n_computed / en->block_size, r->n_hashes);
    struct kv_events *ev = en->cfg.kv_events;
    int run = -1; /* first block of the run of blocks stored just now, reported as one event */
    for (int i = r->n_committed; i < full; i++) {
        int stored = r->blocks[i] >= 0 && kv_commit_hash(&en->pool, r->blocks[i], r->hashes[i]);
        if (r->blocks[i] >= 0 && (en->tier || en->host)) tier_store(en, r->blocks[i], r->hashes[i]);
        if (!ev) continue;
        if (stored && run < 0) run = i;
        if (!stored && run >= 0) {
            store_event(en, r, run, i);
            run = -1;
        }
    }
    if (run >= 0) store_event(en, r, run, full);
    if (full > r->n_committed) r->n_committed = full;
}

static void publish_counts(struct engine *en, struct step_counts *sc);

/* Once the step is launched: its rows are computed (the device runs them in order before
 * any later step), its full blocks registered, prompt log-probabilities recorded; an
 * embedding request pools its rows (read back already) and ends with its prompt. */
static void advance(struct engine *en, struct step_seq *p, struct step_counts *sc)
{
    struct request *r = p->r;
    if (!r) return;
    if (r->embed) embed_take(en, p);
    int bs = en->block_size, old = r->n_computed;
    r->n_computed += p->n_new - p->n_spec; /* the accepted drafts are added by spec_verify */
    if (old < r->n_prompt) sc->prompt_tokens += (uint64_t)(min_i(r->n_computed, r->n_prompt) - old);

    if (p->all_rows)
        record_prompt_logprobs(en, r, old, p->n_logits,
                               en->logits + (size_t)p->logit_row * en->vocab);
    step_commit_blocks(en, r);
    /* a verification's state is that after all its rows until spec_verify settles it */
    if (!p->n_spec) snapshot(en, r);

    /* Every layer windowed: blocks wholly behind the next query's window are released
     * (they stay cached under their hash). A step still in flight may read them, but any
     * later writer runs after it. */
    if (en->sliding_only) {
        int lo = r->n_computed - en->window + 1; /* first key the next token still sees */
        for (int i = 0; (i + 1) * bs <= lo && i < r->n_blocks; i++)
            if (r->blocks[i] >= 0) {
                kv_release(&en->pool, &r->blocks[i], 1);
                r->blocks[i] = -1;
            }
    }
    if (r->embed && r->n_computed == r->n_prompt) {
        publish_counts(en, sc); /* its prompt tokens are counted before its event */
        embed_done(en, r);
    }
}

/* The tokens the plan's entries pick (those still live whose last row samples). */
static int picks(const struct step_seq *plan, int n)
{
    int k = 0;
    for (int s = 0; s < n; s++) k += plan[s].r && plan[s].samples;
    return k;
}

/* Adds the counts gathered so far to the engine's counters before any event of them goes
 * out, so that a client that has its tokens reads them in /metrics. */
static void publish_counts(struct engine *en, struct step_counts *sc)
{
    if (!sc->prompt_tokens && !sc->gen_tokens) return;
    pthread_mutex_lock(&en->mu);
    en->stats.prompt_tokens += sc->prompt_tokens;
    en->stats.generation_tokens += sc->gen_tokens;
    pthread_mutex_unlock(&en->mu);
    sc->prompt_tokens = sc->gen_tokens = 0;
}

/* Once the step's tokens are known: the sampled token, its event, the stop checks (the
 * token is counted by the caller, before this emits it). */
static void result(struct engine *en, struct step_seq *p)
{
    struct request *r = p->r;
    if (!r || !p->samples) return;
    if (r->plp && !r->plp_sent) {
        struct engine_event ev = {.kind = ENGINE_EV_PROMPT_LOGPROBS,
                                  .req_id = r->id,
                                  .token = -1,
                                  .n_prompt_lp = r->n_prompt,
                                  .prompt_lp = r->plp,
                                  .prompt_top = r->ptop,
                                  .n_top = r->sp.prompt_logprobs,
                                  .n_prompt = r->n_prompt,
                                  .n_cached = r->n_cached};
        emit(r, &ev);
        r->plp_sent = 1;
    }
    if (p->n_spec > 0) {
        spec_verify(en, p);
        return;
    }
    const int lr = p->logit_row + p->n_logits - 1;
    const float *row = en->logits + (size_t)lr * en->vocab;
    int32_t t = en->greedy_step ? en->greedy[lr] : sample_next(en, r, row);
    if (r->steer) t = steer_pick(r, t);
    step_emit(en, r, t, row);
}

enum finish_reason step_emit(struct engine *en, struct request *r, int32_t t, const float *row)
{
    if (r->ph_pos >= 0) { /* the placeholder this step's pick stands behind */
        r->tokens[r->ph_pos] = t;
        r->ph_pos = r->ph_row = -1;
        step_commit_blocks(en, r);
    } else {
        r->tokens[r->n_tokens++] = t;
    }
    r->n_output++;
    if (r->gm) gram_matcher_accept_token(r->gm, en->gvocab, t); /* the mask allowed t */
    if (r->steer) steer_accept(en, r, t);
    struct engine_event ev = {.kind = ENGINE_EV_TOKEN,
                              .req_id = r->id,
                              .token = t,
                              .n_prompt = r->n_prompt,
                              .n_cached = r->n_cached,
                              .n_output = r->n_output};
    if (r->sp.logprobs || r->sp.top_logprobs) ev.logprob = sampler_logprob(row, en->vocab, t);
    if (r->sp.top_logprobs) {
        sampler_top_logprobs(row, en->vocab, r->sp.top_logprobs, en->top);
        ev.n_top = r->sp.top_logprobs < en->vocab ? r->sp.top_logprobs : en->vocab;
        ev.top = en->top;
    }
    ev.finish = stop_check(en, r, t);
    if (ev.finish != FINISH_NONE) req_count_finish(en, ev.finish);
    emit(r, &ev);
    if (ev.finish != FINISH_NONE) req_finish(en, r, ev.finish, 0);
    return ev.finish;
}

/* For each sequence whose token the launched step picks: a placeholder at the end of its
 * tokens, so that the next step can take the pick as its input before it is read; none
 * where that token ends the request by length (no next step). */
static void add_placeholders(struct engine *en, struct step_seq *plan, int n_plan)
{
    for (int s = 0; s < n_plan; s++) {
        struct step_seq *p = &plan[s];
        struct request *r = p->r;
        if (!r || !p->samples || p->n_spec > 0) continue;
        if (r->n_output + 1 >= r->sp.max_tokens || r->n_tokens + 1 >= en->max_model_len) continue;
        r->ph_pos = r->n_tokens;
        r->ph_row = p->logit_row + p->n_logits - 1;
        r->tokens[r->n_tokens++] = -1;
    }
}

/* Whether a row of this sequence must reach the host: prompt log-probabilities, logit bias,
 * penalties, log-probabilities of the chosen token, a grammar's mask, or the verification of
 * drafts drawn from a law (the rejection rule reads the target's rows). */
static int needs_host_row(const struct step_seq *p)
{
    return p->all_rows || p->r->gm || p->r->steer || host_row_params(&p->r->sp) ||
           (p->n_spec > 0 && p->r->n_q > 0);
}

/* Whether every token this step samples is a plain greedy pick: then the backend picks
 * them where the logits are, and only the token ids travel back instead of [rows, vocab]
 * floats. */
static int greedy_only(const struct engine *en, int n_plan)
{
    for (int s = 0; s < n_plan; s++) {
        const struct step_seq *p = &en->plans[en->cur][s];
        if (p->n_logits > 0 && (needs_host_row(p) || p->r->sp.temperature > 0)) return 0;
    }
    return 1;
}

/*
 * Whether the backend can sample every row of this step (none needs its row on the host);
 * if so fills en->srow, drawing each sampled row's uniform number from its request's
 * generator, as sample_next would.
 */
static int device_sample(struct engine *en, int n_plan, int nl)
{
    const struct step_seq *plan = en->plans[en->cur];
    if (!model_can_sample(en->m)) return 0;
    for (int s = 0; s < n_plan; s++)
        if (plan[s].n_logits > 0 && needs_host_row(&plan[s])) return 0;
    memset(en->srow, 0, sizeof(struct sample_row) * (size_t)nl);
    for (int s = 0; s < n_plan; s++) {
        const struct step_seq *p = &plan[s];
        struct request *r = p->r;
        if (!p->samples) continue;
        if (p->n_spec > 0) {
            spec_draw_rows(en, p, en->srow);
            continue;
        }
        const struct sampling_params *sp = &r->sp;
        struct sample_row *row = &en->srow[p->logit_row + p->n_logits - 1];
        row->temperature = sp->temperature;
        if (sp->temperature <= 0) continue;
        row->top_k = sp->top_k;
        row->top_p = sp->top_p;
        row->min_p = sp->min_p;
        row->u = (float)rng_uniform(&r->rng);
    }
    return 1;
}

/* Runs the step with its tokens picked where the logits are (greedy, or sampled by the
 * backend), without waiting for them; 0 (nothing run) when some row needs the host. */
static int launch_picked(struct engine *en, int n_plan, const struct fwd_batch *b, int nl)
{
    if (greedy_only(en, n_plan)) {
        model_forward(en->m, b, NULL);
        model_argmax(en->m, nl, NULL);
    } else if (device_sample(en, n_plan, nl)) {
        model_forward(en->m, b, NULL);
        model_sample(en->m, nl, en->srow, NULL);
    } else {
        return 0;
    }
    return 1;
}

/* Reads the picks of the step in flight, then its tokens' events and stops. */
static void collect(struct engine *en, struct step_counts *sc)
{
    struct step_seq *plan = en->plans[!en->cur];
    model_picks(en->m, en->fly_nl, en->greedy);
    en->greedy_step = 1;
    sc->gen_tokens += (uint64_t)picks(plan, en->fly_n);
    publish_counts(en, sc);
    for (int s = 0; s < en->fly_n; s++) result(en, &plan[s]);
    en->fly_n = 0;
    en->plan_n[!en->cur] = 0;
}

/* The launched plan becomes the one in flight: its rows count as computed, its picks get
 * placeholders; the other plan is built next. */
static void take_off(struct engine *en, int n_plan, int nl, struct step_counts *sc)
{
    struct step_seq *plan = en->plans[en->cur];
    for (int s = 0; s < n_plan; s++) advance(en, &plan[s], sc);
    add_placeholders(en, plan, n_plan);
    en->fly_n = n_plan;
    en->fly_nl = nl;
    en->cur = !en->cur;
}

/* Whether the next step may go out before the tokens in flight are read: every running
 * request has its tokens picked where the logits are. */
static int may_overlap(const struct engine *en)
{
    if (!en->overlap || en->want_sync) return 0;
    for (const struct request *r = en->running.head; r; r = r->next)
        if (!pickable(en, r)) return 0;
    return 1;
}

/* The step's hidden rows of embedding requests, to the host (waits for the step). */
static void read_hidden(struct engine *en, const struct fwd_batch *b)
{
    if (b->n_hidden > 0) model_hidden(en->m, b->n_hidden, en->hidden);
}

/* The shape of the plan just made (before its rows are counted as computed), and what the
 * step-time model predicts for it. */
static struct step_shape *plan_shape(struct engine *en, int n_plan)
{
    struct step_shape *sh = &en->shape[en->cur];
    sh->rows = sh->decode = sh->prefill = 0;
    sh->ctx = 0;
    for (int s = 0; s < n_plan; s++) {
        const struct step_seq *p = &en->plans[en->cur][s];
        const struct request *r = p->r;
        sh->rows += p->n_new;
        sh->ctx += sched_cost_keys(r->n_computed, p->n_new);
        if (p->n_new - p->n_spec == 1 && r->n_computed >= r->n_prompt)
            sh->decode += p->n_new;
        else
            sh->prefill += p->n_new;
    }
    sh->predicted = en->cost.ready ? sched_cost_predict(&en->cost, sh->rows, sh->ctx) : -1;
    return sh;
}

int step_run(struct engine *en)
{
    double t0 = util_now();
    struct step_counts sc = {0};
    int seq_cap = min_i(en->cfg.max_num_seqs, en->cfg.max_num_batched_tokens);
    int lp_left = en->max_logits - seq_cap;
    int n_plan = 0, ran = 0, overlapped = 0, spec_rows = 0;
    /* planned: the shape of the step planned now; timed: that of the step whose time this
     * call measures (the one it ran to its end, or, overlapped, the one whose picks it
     * waited for while the next ran), NULL when neither */
    struct step_shape *planned = NULL, *timed = NULL;
    if (en->fly_n > 0 && may_overlap(en)) {
        /* The next step first, its inputs the picks in flight; then those picks. */
        n_plan = plan_step(en, &sc, &lp_left, 1);
        if (n_plan > 0) {
            planned = plan_shape(en, n_plan);
            timed = &en->shape[!en->cur];
        }
        overlapped = n_plan > 0;
        struct fwd_batch b;
        int nl = n_plan > 0 ? build_batch(en, n_plan, &b) : 0;
        /* embedding requests are not pickable: none is in a step planned ahead */
        assert(n_plan == 0 || b.n_hidden == 0);
        if (n_plan > 0 && nl == 0) model_forward(en->m, &b, NULL);
        /* every request is pickable (may_overlap, plan_step): this cannot fail */
        else if (n_plan > 0 && !launch_picked(en, n_plan, &b, nl))
            n_plan = 0;
        ran = en->fly_n;
        collect(en, &sc);
        if (n_plan > 0 && nl > 0) {
            take_off(en, n_plan, nl, &sc);
        } else {
            for (int s = 0; s < n_plan; s++) advance(en, &en->plans[en->cur][s], &sc);
            en->plan_n[en->cur] = 0;
        }
    } else {
        const int was_flying = en->fly_n > 0;
        if (en->fly_n > 0) {
            ran = en->fly_n;
            collect(en, &sc);
        }
        en->want_sync = 0;
        spec_propose(en);
        n_plan = plan_step(en, &sc, &lp_left, 0);
        if (n_plan > 0) planned = plan_shape(en, n_plan);
        /* timed when it runs to its end here and nothing else was waited for */
        if (n_plan > 0 && !was_flying) timed = planned;
        for (int s = 0; en->spec && s < n_plan; s++) { /* only decoding or verifying */
            const struct step_seq *p = &en->plans[en->cur][s];
            spec_rows += p->n_new;
            if (p->n_new - p->n_spec != 1) spec_rows = -(1 << 30);
        }
        if (n_plan > 0) {
            struct fwd_batch b;
            int nl = build_batch(en, n_plan, &b);
            spec_step_rows(en, n_plan);
            if (nl > 0 && launch_picked(en, n_plan, &b, nl)) {
                read_hidden(en, &b);
                take_off(en, n_plan, nl, &sc);
                if (!en->overlap)
                    collect(en, &sc);
                else
                    timed = NULL; /* still running */
            } else {
                en->greedy_step = 0;
                struct step_seq *ps = en->plans[en->cur];
                masks_start(en, ps, n_plan);
                model_forward(en->m, &b, en->logits);
                masks_wait(en);
                read_hidden(en, &b);
                struct step_seq *plan = en->plans[en->cur];
                for (int s = 0; s < n_plan; s++) advance(en, &plan[s], &sc);
                sc.gen_tokens += (uint64_t)picks(plan, n_plan);
                publish_counts(en, &sc);
                for (int s = 0; s < n_plan; s++) result(en, &plan[s]);
                en->plan_n[en->cur] = 0;
            }
        }
    }
    /* A step in flight whose requests all ended: nothing waits for its picks. */
    if (en->fly_n > 0) {
        int live = 0;
        for (int s = 0; s < en->fly_n; s++) live |= en->plans[!en->cur][s].r != NULL;
        if (!live) collect(en, &sc);
    }
    double dt = util_now() - t0;
    if (spec_rows > 0) spec_observe(en, spec_rows, dt);
    if (timed) sched_cost_observe(&en->cost, timed->rows, timed->ctx, dt);
    /* steps of many tokens run near the prefill rate: its running average */
    if (en->tier && sc.planned >= 64 && dt > 0) {
        double tps = sc.planned / dt;
        en->prefill_tps = en->prefill_tps > 0 ? 0.8 * en->prefill_tps + 0.2 * tps : tps;
    }

    pthread_mutex_lock(&en->mu);
    struct engine_stats *st = &en->stats;
    st->prefix_query_tokens += sc.q_tokens;
    st->prefix_hit_tokens += sc.hit_tokens;
    st->preemptions += sc.preempt;
    st->prompt_tokens += sc.prompt_tokens;
    st->generation_tokens += sc.gen_tokens;
    for (int bk = 0; bk <= ENGINE_QUEUE_BUCKETS; bk++) st->queue_hist[bk] += sc.queue_hist[bk];
    st->queue_time_sum += sc.queue_sum;
    if (n_plan > 0) {
        st->steps++;
        st->steps_overlapped += (uint64_t)overlapped;
        int bk = 0;
        while (bk < ENGINE_STEP_BUCKETS && dt > engine_step_bucket_bounds[bk]) bk++;
        st->step_hist[bk]++;
        st->step_time_sum += dt;
    }
    if (planned) {
        st->step_decode_rows += (uint64_t)planned->decode;
        st->step_prefill_tokens += (uint64_t)planned->prefill;
        st->steps_time_capped += (uint64_t)planned->capped;
    }
    if (timed && timed->predicted >= 0) {
        st->steps_predicted++;
        st->step_predicted_sum += timed->predicted;
        st->step_measured_sum += dt;
        st->step_error_sum += fabs(timed->predicted - dt);
    }
    st->cost_ready = en->cost.ready;
    st->cost_a = en->cost.a;
    st->cost_b = en->cost.b;
    st->cost_c = en->cost.c;
    pthread_mutex_unlock(&en->mu);
    return n_plan + ran;
}

void step_publish_gauges(struct engine *en)
{
    pthread_mutex_lock(&en->mu);
    struct engine_stats *st = &en->stats;
    st->running = en->running.n;
    st->waiting = en->waiting.n + en->incoming.n;
    st->kv_blocks_free = en->pool.n_free;
    st->kv_blocks_cached = en->pool.n_cached;
    st->kv_blocks_used = en->pool.n_blocks - en->pool.n_free;
    st->state_slots_free = en->states.n_free;
    st->state_slots_cached = en->states.n_cached;
    st->state_slots_used = en->states.n_blocks - en->states.n_free;
    tier_publish(en, st);
    pthread_mutex_unlock(&en->mu);
}
