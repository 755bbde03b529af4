/*
 * engine: the serving core. Requests go in, token events come out; in between, a step
 * scheduler (after vLLM v1) batches the prefill and decode work of every live request
 * into one forward pass per step, over a block-paged KV pool with hashed prefix sharing.
 *
 *     struct engine *en = engine_create(&cfg, &e);        // loads the model, starts the loop
 *     uint64_t id = engine_submit(en, &req, &e);         // 0 + err when the request is invalid
 *     ...  req.on_event(req.user, &ev) fires on the engine thread for every new token,
 *          and once more (or with the last token) when the request finishes
 *     engine_abort(en, id);                              // any time; a finish event follows
 *     engine_destroy(en);                                // aborts what is left, joins
 *
 * An embedding request (engine_request.embed) is a prompt computed like any other in the
 * same steps, with no sampling: its pooled rows' final hidden states are pooled as the
 * model's sentence-transformers files say (engine_pooling), the vector comes back in one
 * ENGINE_EV_EMBEDDING event, and its KV blocks are released at once.
 *
 * Threads: engine_submit, engine_abort and engine_stats may be called from any thread.
 * Event callbacks run on the engine thread: they must be quick (copy the event, post it
 * to another thread) and may call engine_abort but not engine_destroy. Pointers inside
 * an event are valid only during the callback.
 *
 * With cfg.manual set there is no engine thread: the caller drives engine_step(), and
 * callbacks run inside it (tests that need exact arrival points, offline tools).
 */
#ifndef PAGODA_SCHED_ENGINE_H
#define PAGODA_SCHED_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/config.h"
#include "model/pooling.h"
#include "model/sampler.h"
#include "paged_kv/kv_host.h"
#include "paged_kv/kv_tier.h"
#include "paged_kv/kv_quant.h"
#include "text/grammar.h"

enum finish_reason {
    FINISH_NONE = 0, /* still running */
    FINISH_STOP,     /* an end-of-sequence or stop token id */
    FINISH_LENGTH,   /* max_tokens, or the context length */
    FINISH_ABORT,    /* engine_abort or engine_destroy */
    FINISH_ERROR,    /* the request cannot be served (it never fits the KV pool) */
};

const char *finish_reason_name(enum finish_reason r); /* "stop", "length", "abort", "error" */

#define ENGINE_MAX_TOP_LOGPROBS 20

struct backend;

struct logit_bias {
    int32_t id;
    float bias; /* added to the logit before any other processing */
};

/*
 * Sampling per request. Processing order (as vLLM): logit bias, repetition / presence /
 * frequency penalties (over the output tokens; repetition also over the prompt), then
 * greedy when temperature <= 0, else temperature, top-k, top-p, min-p, and a draw from the
 * request's own generator (seeded: the same tokens whatever else is in the batch).
 * Reported log-probabilities are those of the raw model distribution.
 */
struct sampling_params {
    float temperature;        /* <= 0: greedy */
    float top_p;              /* (0, 1]; 1 = off */
    int top_k;                /* <= 0 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float repetition_penalty; /* > 0; 1 = off */
    float presence_penalty;   /* [-2, 2]; 0 = off */
    float frequency_penalty;  /* [-2, 2]; 0 = off */
    int has_seed;
    uint64_t seed;
    int max_tokens;          /* >= 1: output tokens at most */
    int ignore_eos;          /* keep going past end-of-sequence tokens */
    const int32_t *stop_ids; /* finish (reason stop) on any of these; copied by submit */
    int n_stop_ids;
    const struct logit_bias *logit_bias; /* copied by submit */
    int n_logit_bias;
    int logprobs;        /* report the chosen token's log-probability */
    int top_logprobs;    /* and this many alternatives, 0..ENGINE_MAX_TOP_LOGPROBS */
    int prompt_logprobs; /* >= 0 alternatives per prompt position; -1 = none. A request
                            with prompt logprobs computes its whole prompt (no cache reuse). */
    /* Structured output: every output token keeps the text a prefix of a sentence of this
     * grammar (text/grammar.h); end-of-sequence only where the sentence is complete, and
     * the request ends (stop) once nothing may follow. Submit takes its own reference. */
    struct gram *grammar;
    /* With a trigger (NUL-terminated, copied by submit), `grammar` constrains the output
     * only from the trigger's first occurrence on, the trigger's bytes the first it reads;
     * before that the output is free (an `auto` tool choice: text until the call's tag).
     * Bytes as the grammar vocabulary reads tokens: GRAM_TAG_MARK + a tag's text is the
     * tag's special token (engine_config.grammar_tags). */
    const char *grammar_trigger;
    /* Thinking budget (> 0): the output tokens after think_start (from the first output
     * token when n_think_start is 0) are counted until think_end appears; at the budget,
     * think_end is forced, one token a step. Ids copied by submit. */
    int think_budget;
    const int32_t *think_start, *think_end;
    int n_think_start, n_think_end;
};

/** Greedy-free defaults: temperature 1, no filters, no penalties, max_tokens 16. */
void sampling_params_default(struct sampling_params *sp);

enum engine_event_kind {
    ENGINE_EV_TOKEN,           /* a new output token (finish set when it is the last) */
    ENGINE_EV_PROMPT_LOGPROBS, /* once, before the first token, when prompt_logprobs >= 0 */
    ENGINE_EV_FINISH,          /* the request ended with no token to carry it (abort, error) */
    ENGINE_EV_EMBEDDING,       /* an embedding request's vector (finish: stop) */
};

struct engine_event {
    enum engine_event_kind kind;
    uint64_t req_id;
    /* ENGINE_EV_TOKEN */
    int32_t token;
    float logprob;                   /* when logprobs was asked */
    int n_top;                       /* alternatives, best first */
    const struct token_logprob *top; /* [n_top] */
    /* ENGINE_EV_PROMPT_LOGPROBS: for prompt position i (i >= 1) the log-probability of
     * prompt[i] given the tokens before it (position 0 has none: NaN), and top[i * n_top
     * ...] its alternatives. */
    int n_prompt_lp;
    const float *prompt_lp;
    const struct token_logprob *prompt_top;
    /* ENGINE_EV_EMBEDDING: [n_embedding] floats, pooled and (when the model says so)
     * L2-normalized */
    int n_embedding;
    const float *embedding;
    /* every kind */
    enum finish_reason finish; /* FINISH_NONE until the request's last event */
    int n_prompt;              /* prompt tokens */
    int n_cached;              /* prompt tokens served from the prefix cache */
    int n_output;              /* output tokens so far, this one included */
};

typedef void (*engine_event_fn)(void *user, const struct engine_event *ev);

struct engine_request {
    const int32_t *prompt; /* copied by submit */
    int n_prompt;
    struct sampling_params sp;
    int priority; /* lower runs first (vLLM); ties by arrival */
    /* 1: an embedding request (sp is not read; the model must be able to embed) */
    int embed;
    /* embedding requests of a model whose mean pooling leaves the prompt out
     * (include_prompt false): these first tokens are not pooled (< n_prompt) */
    int pool_skip;
    engine_event_fn on_event;
    void *user;
};

/* Speculative decoding (after vLLM's --speculative-config). */
enum spec_method {
    SPEC_NONE = 0,
    SPEC_NGRAM,  /* prompt lookup: the tokens that followed the latest earlier match of the
                    context's last n-gram (ngram_max down to ngram_min tokens) */
    SPEC_DRAFT,  /* a smaller model with the same vocabulary, its own paged KV; greedy, or
                    drawn from its law for requests that sample (rejection sampling) */
    SPEC_MTP,    /* the checkpoint's multi-token-prediction module (mtp.*) on the model's
                    hidden states, its KV in the model's block layout; drafts as SPEC_DRAFT */
    SPEC_EAGLE3, /* an EAGLE-3 head (model_dir) on three of the model's layers, as SPEC_MTP
                    otherwise */
};
#define SPEC_METHODS    5
#define SPEC_MAX_TOKENS 16 /* drafts per request and step at most */

const char *spec_method_name(enum spec_method m); /* "none", "ngram", "draft", "mtp", "eagle3" */

struct spec_config {
    enum spec_method method;
    int num_tokens;            /* K: drafts per request and step at most (0: 4) */
    int ngram_min, ngram_max;  /* prompt lookup n-gram sizes; 0: 1 and 4 */
    const char *model_dir;     /* SPEC_DRAFT: the draft model's folder; SPEC_EAGLE3: the head's */
    int disable_by_batch_size; /* K shrinks to 0 as running requests reach this; 0: 64 */
};

/* The order of the queues (vLLM's --scheduling-policy). */
enum sched_policy {
    SCHED_POLICY_PRIORITY = 0, /* by (priority, arrival): lower priority values first */
    SCHED_POLICY_FCFS,         /* by arrival alone; a request with a priority is refused */
};
/* What a preempted request gives up (vLLM's --preemption-mode). */
enum preemption_mode {
    PREEMPTION_RECOMPUTE = 0, /* its blocks; its tokens are computed again when it resumes */
    PREEMPTION_SWAP,          /* its full blocks, copied to the host tier as they were
                                 registered, come back from there when it resumes (needs
                                 kv_host_memory: CUDA) */
};

struct engine_config {
    const char *model_dir;
    const char *device; /* "cpu" (default); "cuda", "cuda:N" where built */
    int threads;        /* CPU compute threads; <= 0: one per core */
    /* devices the model is split over (model/tp.h): cuda:K..K+N-1 for --device cuda:K; 0 or
     * 1: one */
    int tensor_parallel_size;
    /* 1: every exchange of a split model through NCCL, none through the one-shot all-reduce
     * over peer memory (vLLM's --disable-custom-all-reduce) */
    int disable_custom_all_reduce;
    int block_size;                /* tokens per KV block; 0: 16 */
    int num_blocks;                /* KV blocks; 0: from kv_cache_memory */
    struct kv_spec kv;             /* KV cache formats (zero: auto) */
    size_t kv_cache_memory;        /* bytes for the KV pool; 0: a default */
    double gpu_memory_utilization; /* GPU share for weights + activations + KV (0: 0.9);
                                      sizes the KV pool on a GPU when kv_cache_memory is 0 */
    int max_num_batched_tokens;    /* token budget per step; 0: 2048 */
    /* A bound on a step's predicted time in milliseconds (0: none, the token budget alone):
     * decode rows always run, prefill tokens join while the step-time model (sched/cost.h)
     * predicts the step under the bound, at least block_size of them a step */
    double max_step_ms;
    int long_prefill_token_threshold; /* a prefill chunk of one request at most (0: none) */
    enum sched_policy scheduling_policy;
    enum preemption_mode preemption_mode;
    int max_num_seqs;           /* running requests at most; 0: 256 */
    int max_model_len;          /* 0: the model's context length */
    int disable_prefix_caching; /* 1: no hashing, no reuse */
    int mlock;                  /* 1: lock the weights in memory (the CPU reads them in place) */
    int manual;                 /* 1: no engine thread, see engine_step */
    /* A step whose tokens are all picked where the logits are (greedy, or sampled by the
     * backend) lets the next one go out before they are read, that step's inputs taken from
     * the picks: 1 always; -1 never (each step's tokens read before the next is planned);
     * 0 (the default) where the backend picks asynchronously (CUDA; on the CPU, where a step
     * runs to its end when launched, overlapping would only delay each token's event by a
     * step) */
    int overlap;
    /* Models with linear-attention layers: besides the end of each prompt's last full block
     * and a finished sequence's last full block, a snapshot of the recurrent state every N
     * blocks of a sequence (0: only those) */
    int hybrid_state_interval;
    /* 1: a row's result does not depend on the rest of its batch (vLLM's --batch-invariant):
     * the backend's invariant kernels for every product (backend_batch_invariant_set), for
     * reproducible seeded outputs; slower prefill and batched decode (docs/quantization.md) */
    int batch_invariant;
    /* Speculative decoding (method SPEC_NONE: off). Drafts ride as extra query rows of
     * their request in the same steps as everything else; the target's own pick of each
     * row decides, so greedy and seeded outputs are those of plain decoding. */
    struct spec_config spec;
    /* The disk tier (docs/engine.md, "KV tiers"): full blocks are written under this
     * directory and a prefix that misses the pool is loaded from there; NULL: none */
    const char *kv_disk_dir;
    size_t kv_disk_size; /* its byte budget; 0: 16 GiB */
    /* The host-memory tier (backends with a copy engine: CUDA): bytes of pinned host memory
     * that hold blocks copied down from the device pool; 0: none (with a disk tier on such
     * a backend, a staging area of its own size) */
    size_t kv_host_memory;
    /* KV-cache events (paged_kv/kv_events.h): when set, blocks stored in and evicted from
     * the prefix cache are reported to it, one batch per step; owned by the caller, it
     * outlives the engine. NULL: none. */
    struct kv_events *kv_events;
    /* Markup of the served model's tool-call and reasoning formats (NULL-terminated, owned
     * by the caller, outliving the engine; NULL: none): its special tokens with these texts
     * join the vocabulary of constrained decoding (gram_vocab_create) */
    const char *const *grammar_tags;
    /* A backend the caller made, used instead of the one `device` names and destroyed with
     * the engine (engine_create's failures too); NULL: none. Tests give the CPU's with a
     * copy engine of their own, to run the host tier without a GPU. */
    const struct backend *backend;
};

/* Step-time histogram bounds in seconds (a last bucket catches the rest). */
#define ENGINE_STEP_BUCKETS 12
extern const double engine_step_bucket_bounds[ENGINE_STEP_BUCKETS];
/* Queue-time histogram bounds in seconds: vLLM's request-latency buckets. */
#define ENGINE_QUEUE_BUCKETS 21
extern const double engine_queue_bucket_bounds[ENGINE_QUEUE_BUCKETS];

struct engine_stats {
    int running, waiting;
    int kv_blocks_total, kv_blocks_used, kv_blocks_free, kv_blocks_cached;
    /* recurrent-state slots (models with linear-attention layers; 0 otherwise): used by
     * running requests or held, free, and of those holding a named snapshot */
    int state_slots_total, state_slots_used, state_slots_free, state_slots_cached;
    size_t state_bytes; /* of one slot */
    uint64_t prefix_query_tokens, prefix_hit_tokens;
    uint64_t preemptions;
    uint64_t prompt_tokens;     /* tokens prefilled (computed, not served from cache) */
    uint64_t generation_tokens; /* tokens decoded */
    uint64_t requests_finished[FINISH_ERROR + 1]; /* by reason */
    uint64_t steps;
    uint64_t steps_overlapped; /* steps launched before the previous step's tokens were read */
    uint64_t step_hist[ENGINE_STEP_BUCKETS + 1]; /* counts per bucket (cumulate for Prometheus) */
    double step_time_sum;                        /* seconds */
    /* step composition, summed over steps: rows of decoding requests (drafts included)
     * and prompt (or recomputed) tokens; steps whose prefill the step-time bound cut */
    uint64_t step_decode_rows, step_prefill_tokens, steps_time_capped;
    /* the step-time model (sched/cost.h): its coefficients (seconds; a step, a row, a key
     * a row reads; cost_ready 0 until fitted) and, over the steps it predicted, the sums of
     * predicted and measured seconds and of the absolute error */
    int cost_ready;
    double cost_a, cost_b, cost_c;
    uint64_t steps_predicted;
    double step_predicted_sum, step_measured_sum, step_error_sum;
    /* speculative decoding, by method (enum spec_method): verifications (a request's
     * drafts checked in one step), draft tokens, accepted tokens, verifications by the
     * number of drafts accepted (0..SPEC_MAX_TOKENS), and accepted drafts by position */
    uint64_t spec_drafts[SPEC_METHODS];
    uint64_t spec_draft_tokens[SPEC_METHODS];
    uint64_t spec_accepted_tokens[SPEC_METHODS];
    uint64_t spec_accept_hist[SPEC_METHODS][SPEC_MAX_TOKENS + 1];
    uint64_t spec_accepted_pos[SPEC_METHODS][SPEC_MAX_TOKENS];
    /* the disk tier (tier_on 0: none, the rest 0) */
    int tier_on;
    struct kv_tier_stats tier;
    uint64_t tier_query_tokens; /* prompt tokens past the pool's hits looked up on disk */
    uint64_t tier_hit_tokens;   /* of those, loaded from disk */
    uint64_t tier_bypasses;     /* loads skipped: recomputing was estimated faster */
    /* the host-memory tier (host_on 0: none, the rest 0) */
    int host_on;
    struct kv_host_stats host;
    /* bytes held and the budget, loaded and stored */
    uint64_t host_used_bytes, host_budget_bytes, host_load_bytes, host_store_bytes;
    uint64_t host_query_tokens; /* prompt tokens past the pool's hits looked up there */
    uint64_t host_hit_tokens;   /* of those, copied up from there */
    /* device seconds of the copies up (loads) and down (stores), from the copy engine's
     * timing of each batch: bytes over seconds is the bus bandwidth achieved */
    double host_load_seconds, host_store_seconds;
    /* hybrid models' recurrent-state snapshots: the host tier's snapshot slots (host_snap:
     * their figures; the byte figures above include them), and per tier the lookups that
     * reached it (the tiers above lacked the snapshot a prefix resumes from) and, of those,
     * snapshots loaded from it */
    struct kv_host_stats host_snap;
    uint64_t host_state_queries, host_state_hits;
    uint64_t tier_state_queries, tier_state_hits;
    /* seconds from submission to a request's first schedule (vLLM's queued time) */
    uint64_t queue_hist[ENGINE_QUEUE_BUCKETS + 1];
    double queue_time_sum;
};

/** Loads the model and sizes the KV pool; starts the engine thread unless manual. */
struct engine *engine_create(const struct engine_config *cfg, struct err *e);

const struct model_config *engine_model_config(const struct engine *en);
/** The context length requests must fit: prompt + max_tokens <= this. */
int engine_max_model_len(const struct engine *en);
int engine_block_size(const struct engine *en);
/** The model folder's pooling (can_embed 0: embedding requests are refused). */
const struct pooling_config *engine_pooling(const struct engine *en);

/**
 * The vocabulary trie of constrained decoding, built from the model folder's tokenizer on
 * first use (a few hundred ms for a 128K vocabulary). NULL + err when there is no tokenizer.
 */
const struct gram_vocab *engine_grammar_vocab(struct engine *en, struct err *e);

/**
 * Queues a request; returns its id (> 0), or 0 with a message naming the bad field
 * (empty prompt, a token id outside the vocabulary, prompt + max_tokens over the context,
 * a sampling value out of range, an embedding request to a model that cannot embed).
 */
uint64_t engine_submit(struct engine *en, const struct engine_request *req, struct err *e);

/** Ends a request at the next step (its blocks return to the pool); unknown ids are ignored. */
void engine_abort(struct engine *en, uint64_t id);
/**
 * Ends a request at the next step as FINISH_STOP: the caller found a stop condition the
 * engine does not see (a stop string in the detokenized text). Counted as a stop, not an
 * abort, in engine_stats.
 */
void engine_stop_request(struct engine *en, uint64_t id);
/* A request the engine finished for `counted` (it ran on past a stop string its client found
 * first) is counted as a stop instead: the statistics follow the finish the client sees. */
void engine_recount_stop(struct engine *en, enum finish_reason counted);

/** Manual mode: runs one step; returns the requests still live (running + waiting). */
int engine_step(struct engine *en);

/** Requests not yet finished (running + waiting). */
int engine_live(struct engine *en);

void engine_stats(struct engine *en, struct engine_stats *out);

/** Aborts every live request (finish events fire), stops the thread, frees everything. */
void engine_destroy(struct engine *en);

#endif
