/* Internals shared by the engine's files: requests, the engine state, the step. */
#ifndef PAGODA_SCHED_ENGINE_IMPL_H
#define PAGODA_SCHED_ENGINE_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/model.h"
#include "paged_kv/kv_pool.h"
#include "sched/cost.h"
#include "sched/engine.h"

/* The delta rule's chunk of hybrid models where the block size allows (engine.c). */
#define ENGINE_DELTA_CHUNK 16

enum req_state { RS_WAITING, RS_RUNNING, RS_DONE };

struct request {
    uint64_t id;
    uint64_t arrival; /* submission order */
    double t_submit;  /* util_now() at submission */
    int priority;
    enum req_state state;
    struct request *prev, *next; /* in the waiting or running list */

    int32_t *tokens; /* prompt, then output: [cap] */
    int n_tokens, n_prompt, cap;
    /* the position of an output token still being picked by the step in flight (its slot in
     * tokens holds -1 until the pick is read), and that pick's row; -1: none */
    int ph_pos, ph_row;
    int n_computed; /* tokens whose K/V are in the pool */
    int n_output;
    int n_cached;       /* prompt tokens served from the prefix cache (first schedule) */
    int scheduled_once; /* n_cached is final */

    int32_t *blocks; /* block table: [max_blocks]; -1 = released (outside the window) */
    int n_blocks;
    struct kv_hash *hashes; /* of full blocks of tokens: [max_blocks] */
    int n_hashes;           /* hashes known (computed from tokens) */
    int n_committed;        /* blocks registered in the index */
    int32_t state_slot;     /* recurrent-state slot while running (hybrid models), else -1 */
    /* tier loads (sched/tier.c): while `loading`, r waits aside holding blocks[0..n_blocks):
     * [host_from, host_from + host_n) copied up from the host tier, [load_from, n_blocks)
     * read from disk by load load_id (-1: none or ended), of which those before load_end
     * hold their KV once it has ended; host_ticket: the copy engine's ticket the blocks wait
     * for (0: none); tier_tried: looked up once already */
    int load_id, load_from, tier_tried;
    int loading, host_from, host_n, load_end;
    uint64_t host_ticket;
    /* hybrid models: the load resumes after block load_k (its snapshot is in the state pool,
     * or copied up from host memory (load_snap_host) or read from disk into state slot
     * load_snap, -1 when not; load_snap_ok once it was) */
    int load_k, load_snap_ok, load_snap_host;
    int32_t load_snap;

    /* speculative decoding (sched/spec.c): drafts for the next step in tokens[n_tokens ..
     * n_tokens + n_draft) (scratch past the known tokens), the measured acceptance (moving
     * average of accepted / drafted), the generator before a step's rows drew their
     * numbers (rows sampled by the backend), and the draft model's block table and the
     * tokens whose K/V it holds */
    int n_draft;
    float spec_rate;
    struct rng rng_saved;
    int32_t *dblocks; /* [max_blocks] */
    int n_dblocks, d_computed;
    int32_t state_backup; /* hybrid models: a copy of the state before a verification, or -1 */
    /* drafts drawn from the drafter's law (sched/spec_sample.c): the first n_q of the drafts,
     * each with its law (q_n[j] candidates from q_off[j] in the spec's arena, q_d[j] the
     * draft's probability); rng_peek: the generator after their numbers (r->rng is wound on
     * as tokens are kept); rng_spec: the generator of acceptances and residual draws */
    int n_q;
    int q_n[SPEC_MAX_TOKENS];
    size_t q_off[SPEC_MAX_TOKENS];
    float q_d[SPEC_MAX_TOKENS];
    struct rng rng_peek, rng_spec;
    /* draft heads over the hidden states (sched/spec_head.c): the rows this request had in
     * the step numbered hid_step (spec_step_rows), hid_n of them from batch row hid_row at
     * position hid_pos */
    uint64_t hid_step;
    int hid_row, hid_pos, hid_n;

    struct sampling_params sp; /* stop_ids / logit_bias point into owned copies */
    int32_t *stop_ids;
    struct logit_bias *bias;
    struct rng rng;
    int aborted; /* 0, or the finish reason an early end gives it (engine_abort / _stop_request) */
    struct gram_matcher *gm; /* structured output: the grammar's state after the output */
    uint32_t *gmask;         /* its next mask, computed during the forward pass (masks.c) */
    int gmask_ready;
    struct steer *steer; /* lazy grammar and thinking budget (steer.c), NULL when neither */

    /* embedding requests: the pooled rows so far, summed (mean) or copied (last, cls) */
    int embed;
    int pool_skip; /* leading tokens mean pooling leaves out */
    double *pool;  /* [hidden] */
    int pool_rows; /* rows in pool */

    /* prompt logprobs, filled while the prompt is computed */
    float *plp;
    struct token_logprob *ptop;
    int plp_sent;

    engine_event_fn cb;
    void *user;
};

struct req_list {
    struct request *head, *tail;
    int n;
};

/* One planned sequence of a step. */
struct step_seq {
    struct request *r;
    int n_new;
    int logit_row; /* first logit row of this sequence, -1 when none */
    int n_logits;  /* rows: 1, or one per new token for prompt logprobs */
    int all_rows;  /* a row for every new token (prompt logprobs) */
    int samples;   /* the step completes the request's tokens: its last row picks the next */
    int hid_row;   /* embedding requests: first hidden row of this sequence in the step */
    int n_hid;     /* and their number */
    int n_spec;    /* drafts verified: its n_new = 1 + n_spec rows, each with logits */
};

/* A planned step's shape, for the step-time model: query rows, keys they read, and the
 * prediction made when it was planned (predicted < 0: none). */
struct step_shape {
    int rows, decode, prefill; /* rows = decode (drafts included) + prefill */
    double ctx, predicted;
    int capped; /* the step-time bound cut its prefill */
};

struct engine {
    struct engine_config cfg;
    struct backend be;
    struct model *m;
    int vocab, block_size, max_blocks, max_model_len, max_logits;
    int sliding_only; /* every layer is windowed: blocks behind the window are released */
    int window;
    struct kv_pool pool;
    /* The disk tier (sched/tier.c); NULL: none. n_loading: waiting requests whose blocks
     * are being read; prefill_tps: tokens per second of large steps (an average), for the
     * load-or-recompute estimate; the counters are published with the statistics. */
    struct kv_tier *tier;
    /* The host-memory tier over the pinned arena host_mem; NULL: none. host_snap: its
     * snapshot slots for a hybrid model (units: state slots), in the same arena. */
    struct kv_host *host, *host_snap;
    void *host_mem;
    uint64_t host_query_tokens, host_hit_tokens;
    /* hybrid models: snapshot lookups that reached host memory and disk, and hits there */
    uint64_t host_state_queries, host_state_hits, tier_state_queries, tier_state_hits;
    int n_loading;
    double prefill_tps;
    uint64_t tier_query_tokens, tier_hit_tokens, tier_bypasses;
    /* Recurrent-state slots of hybrid models, kept by the same rules as blocks: reference
     * counts, plan then commit, snapshots named by the block-hash chain (the hash of the
     * block at whose end the state was taken) and kept in LRU order while free. */
    struct kv_pool states;
    int hybrid; /* the model has linear-attention layers */
    /* Hybrid models: the delta rule's chunk (fwd_batch.delta_chunk; it divides block_size),
     * or 0 when every token takes the token form. A request's prompt tokens below
     * chunk_mark() take the chunked form, the rest and every generated token the token
     * form, however the request is scheduled: pieces of a prompt end at chunk boundaries
     * below the mark. A snapshot past the mark (taken at finish, preemption or an interval)
     * holds a state computed token by token where a later prompt without it would compute
     * those positions in chunks: resuming from it agrees with that to rounding, not bitwise. */
    int delta_chunk;
    int32_t *b_chunked; /* [seq_cap] chunk_mark of each step sequence */
    struct pooling_config pooling;
    struct spec *spec; /* speculative decoding (sched/spec.c), NULL when off */

    /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct req_list incoming;
    uint64_t *aborts;
    enum finish_reason *abort_why; /* [cap_aborts]: FINISH_ABORT, or FINISH_STOP */
    int n_aborts, cap_aborts;
    int stop;
    struct engine_stats stats;
    uint64_t next_id;
    int live; /* requests submitted and not finished */

    /* engine thread only */
    struct req_list waiting, running;
    pthread_t thread;
    int has_thread;
    uint64_t arrivals;
    struct rng seeder;

    /* step buffers, sized at start-up */
    int32_t *b_tokens, *b_pos, *b_slot, *b_qstart, *b_seqlen, *b_bt, *b_logit_rows, *b_pick;
    int32_t *b_state; /* [seq_cap] state slot of each step sequence */
    float *logits;    /* [max_logits, vocab] */
    int32_t *greedy;  /* [max_logits] tokens picked by the backend (greedy steps) */
    int greedy_step;  /* this step's tokens are in greedy[] (picked or sampled where the logits
                         are; the logits stayed on the backend) */
    struct sample_row *srow; /* [max_logits] rows the backend samples (model_can_sample) */
    /* Two plans: the one being built and the step in flight, launched with its tokens
     * picked where the logits are and not yet read (fly_n > 0). The next step goes out
     * before they are read, its sequences' inputs taken from the picks (pick_rows). */
    struct step_seq *plans[2];
    int plan_n[2];
    struct step_shape shape[2]; /* of plans[0] and plans[1] */
    struct sched_cost cost;     /* the step-time model (sched/cost.h) */
    int cur; /* plans[cur] is built next; plans[!cur] is in flight when fly_n > 0 */
    int fly_n, fly_nl;
    int want_sync; /* the next step reads the tokens in flight first (blocks ran short, or a
                      request whose tokens are not picked where the logits are waits) */
    int overlap;   /* steps overlap (cfg.overlap resolved for the backend) */
    int32_t *hit_blocks;
    struct kv_hash *hit_hashes;
    float *work;               /* [vocab] sampling scratch */
    uint32_t *gmask;           /* [(vocab + 31) / 32] the allowed tokens of a grammar request */
    struct gram_vocab *gvocab; /* built on the first grammar request (guarded by mu) */
    /* the thread that computes grammar requests' masks while a step's forward pass runs
     * (masks.c): the step's requests in mq[0..mq_n), mq_done once all are filled */
    pthread_t mthread;
    int mthread_on, mquit, mq_n, mq_cap, mq_busy, mq_done;
    struct request **mq;
    pthread_mutex_t mmu;
    pthread_cond_t mcv;
    uint32_t *counts;           /* [vocab] zeroed between uses */
    int32_t *cand;              /* [vocab] candidate ids */
    struct sampler_cand *scand; /* [vocab] the sampler's candidates (model/sampler.h) */
    struct token_logprob top[ENGINE_MAX_TOP_LOGPROBS];

    /* embedding requests (models that can embed): the step's hidden rows, final-normed */
    int32_t *b_hidden_rows; /* [max_hidden] token rows */
    float *hidden;          /* [max_hidden, hidden] host copy */
    float *emb_out;         /* [hidden] the vector of the event */
    int max_hidden;         /* max_num_batched_tokens for mean pooling, else the sequence cap */
};

/* step.c */
/* One step; returns the sequences it ran. */
int step_run(struct engine *en);
/* Publishes the running/waiting/KV gauges to the shared statistics. */
void step_publish_gauges(struct engine *en);
/* Where r's chunked delta-rule tokens end: its prompt's whole chunks. */
static inline int chunk_mark(const struct engine *en, const struct request *r)
{
    return en->delta_chunk ? r->n_prompt / en->delta_chunk * en->delta_chunk : 0;
}

/* Gives r's recurrent-state slot back (named as a snapshot where it ends at a block). */
void req_release_state(struct engine *en, struct request *r);
/* Counts a finished request in the statistics; done before its last event goes out, so
 * that a client that has seen its end finds it in /metrics. */
void req_count_finish(struct engine *en, enum finish_reason why);
/* Retires r (its blocks back to the pool, no plan naming it) and frees it. With emit, its
 * FINISH event goes out (counted first); without, the caller has already sent its end with
 * the last token and counted it. */
void req_finish(struct engine *en, struct request *r, enum finish_reason why, int emit);

/* Appends t to r's output (or fills its placeholder), sends its event and applies the stop
 * checks; `row` is t's logit row on the host when log-probabilities are asked. Returns the
 * finish reason: when not FINISH_NONE, r is retired and freed. */
enum finish_reason step_emit(struct engine *en, struct request *r, int32_t t, const float *row);
/* Hybrid models: n_new capped so that a chunk ends where a state snapshot is due. */
int step_cap_snapshot(const struct engine *en, const struct request *r, int computed, int n_new);
/* Registers r's full blocks of known tokens that its computed rows cover. */
void step_commit_blocks(struct engine *en, struct request *r);
/* tier.c: the host-memory and disk tiers */
/* Opens the tiers cfg.kv_host_memory and cfg.kv_disk_dir name (pool_fp: the pool's
 * fingerprint); 0 also when they stay off (no prefix caching: a note on stderr). */
int tier_open(struct engine *en, const char *pool_fp, struct err *e);
void tier_close(struct engine *en);
/* Queues pool block `block`, just registered under h, for the tiers (unless held there). */
void tier_store(struct engine *en, int32_t block, struct kv_hash h);
/* State slot `slot` was just named by h (a snapshot): queued for the tiers (unless held). */
void tier_store_state(struct engine *en, int32_t slot, struct kv_hash h);
/* State slot `slot` was just allocated: the next steps write it (fenced behind a pending
 * copy down of the snapshot it held, as tier_reuse). */
void tier_reuse_state(struct engine *en, int32_t slot);
/* Pool blocks[0..n) were just allocated: the next steps write them (sched/tier.c fences
 * them behind pending copies down). */
void tier_reuse(struct engine *en, const int32_t *blocks, int n);
/* Once per request: when r's prefix continues in host memory or on disk past its n_hit
 * pool hits (in en->hit_blocks) and loading beats recomputing, takes the blocks and starts
 * the loads:
 * 1, r waits for it (tier_poll); 0: plan r as usual. */
int tier_try_load(struct engine *en, struct request *r, int n_hit);
/* Takes landed reads; a finished load's blocks join the pool's index and are released. */
void tier_poll(struct engine *en, double wait_s);
/* r ends while loading: its load is abandoned (its blocks are released by the caller). */
void tier_cancel(struct engine *en, struct request *r);
/* Copies the tier's figures into st (mu held). */
void tier_publish(struct engine *en, struct engine_stats *st);

/* embed.c: embedding requests */
/* Whether r's pooling needs rows prefix caching would skip (mean, cls): no cache lookup. */
int embed_whole_prompt(const struct engine *en, const struct request *r);
/* Appends to rows the step rows of p's chunk (its tokens are step rows q0...) that r's
 * pooling reads; returns how many. */
int embed_plan_rows(const struct engine *en, const struct step_seq *p, int q0, int32_t *rows);
/* Pools p's hidden rows of the step just run (en->hidden) into its request. */
void embed_take(struct engine *en, const struct step_seq *p);
/* Forgets what r pooled (it was preempted: its prompt will be computed again). */
void embed_reset(struct engine *en, struct request *r);
/* r's prompt is computed: its vector goes out in an EMBEDDING event and r is retired
 * (blocks back to the pool). */
void embed_done(struct engine *en, struct request *r);

/* sample.c: the next token of r from its logits row (left unchanged). */
int32_t sample_next(struct engine *en, struct request *r, const float *logits);
/* The same with the uniform number drawn from g and rounded to float, as for a row sampled
 * by the backend (NULL: no draw, the first candidate back), and the law it draws from
 * (temperature > 0): its *n candidates in en->cand[0..*n) and, where probs is given, their
 * probabilities in probs[0..*n) (zero elsewhere). *n is 0 for a greedy pick (temperature 0,
 * or no finite logit). The penalties read r->tokens[0..n_tokens). */
int32_t sample_dist(struct engine *en, struct request *r, const float *logits, struct rng *g,
                    float *probs, int *n);

/* lists */
void list_append(struct req_list *l, struct request *r);
void list_remove(struct req_list *l, struct request *r);
/* Inserts by (priority, arrival): lower first. */
void list_insert_ordered(struct req_list *l, struct request *r);

/* steer.c: output steering that depends on the tokens so far. A request with a steer
 * samples on the host and never runs in an overlapped step. */
struct steer;
/** NULL when sp asks for neither; holds a reference to sp's grammar when it waits for a
 * trigger (and clears sp->grammar), and copies of the ids and trigger. */
struct steer *steer_create(struct sampling_params *sp);
void steer_destroy(struct steer *s);
/** The token to take: a forced one in place of the sampled t while the budget forces. */
int32_t steer_pick(struct request *r, int32_t t);
/** After t joined the output: counts the budget, looks for the trigger (then r->gm). */
void steer_accept(struct engine *en, struct request *r, int32_t t);

/* masks.c: grammar masks of the step's sampling requests on a worker thread, started
 * before the forward pass and waited for after it; sample.c uses r->gmask when ready. */
void masks_start(struct engine *en, const struct step_seq *plan, int n_plan);
void masks_wait(struct engine *en);
void masks_stop(struct engine *en);

#endif
