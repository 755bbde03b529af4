/*
 * spec: speculative decoding inside the engine's batch steps.
 *
 * Before a step is planned, spec_propose gives each running request that is decoding a
 * number of drafts (r->n_draft, the tokens written past its known tokens): how many
 * follows its measured acceptance and the number of running requests (spec_k). The step
 * then runs that request as 1 + n_draft query rows (its last token and the drafts), each
 * with its logits, their KV slots planned like any other. spec_verify walks the rows in
 * order: row j's token is the target's own pick (greedy, or sampled with the request's
 * generator and every sampling option, exactly as without drafts); the draft at j is
 * accepted when it equals that pick, and the first pick that differs (or the pick after
 * the last draft) ends the walk. The drafts are deterministic (q one-hot), for which
 * rejection sampling accepts draft d with probability p(d) and otherwise draws from the
 * residual max(0, p - q) normalized, that is p without d: the same law as "accept when
 * the target's draw is d, else keep the draw", which is what is done, so that greedy and
 * seeded outputs are those of plain decoding bitwise. Requests that sample draw the drafts
 * of the draft model, MTP and EAGLE-3 from the drafter's law instead, verified by the
 * speculative-sampling rule (spec_sample.c). Rejected rows' K/V lie past the
 * request's computed tokens (overwritten later) and their blocks go back to the pool.
 *
 * Drafters: ngram (prompt lookup over the prompt and output, ngram.c), draft (a smaller
 * model with the same vocabulary on the same backend, its own paged KV, draft.c), and mtp
 * and eagle3 (a head over the model's hidden states, KV in the model's block layout,
 * spec_head.c over model/head.h).
 * Hybrid models: the recurrent state is copied to a backup slot before a verification and
 * comes back when a draft is rejected; the kept rows are then computed again by the next
 * step (a draft model with linear-attention layers is refused).
 */
#ifndef PAGODA_SCHED_SPEC_H
#define PAGODA_SCHED_SPEC_H

#include "sched/cost.h"
#include "sched/engine_impl.h"

struct spec {
    struct spec_config cfg;
    int disable_n;            /* cfg.disable_by_batch_size resolved */
    struct spec_draft *draft; /* SPEC_DRAFT: the draft model (draft.c) */
    struct spec_head *head;   /* SPEC_MTP, SPEC_EAGLE3: a head over the model's hidden states */
    /* The step's cost in rows: t = a + b * rows, fitted by least squares with exponential
     * forgetting over the steps that only decode or verify (spec_observe). */
    struct sched_fit fit;
    /* Sampled drafts' laws (spec_sample.c; NULL for ngram): an arena of q_cap (token,
     * probability) entries refilled from q_used = 0 every step, and [vocab] scratch rows: a
     * draft's logits at target ids (row), as downloaded (dl), a target row's probabilities
     * (pp), zeros between uses (dense). */
    int32_t *q_ids;
    float *q_p;
    size_t q_cap, q_used;
    float *row, *dl, *pp, *dense;
};

/** Checks cfg and sets up the drafter for engine en (model and pool sized already);
 * 0, or -1 + err with a message naming the option. */
int spec_create(struct engine *en, struct err *e);
void spec_destroy(struct engine *en);

/** Whether r may carry drafts now: decoding (one known token not computed, none being
 * picked), no grammar, no prompt log-probabilities still to compute, not an embedding. */
int spec_eligible(const struct engine *en, const struct request *r);

/** Drafts r may carry this step: at most K, fewer as running requests approach
 * disable_by_batch_size (K * (D - n) / D rounded up, 0 from D on) and as r's acceptance
 * rate falls: the k-th draft is kept with probability rate^k, and is worth its row while
 * that is at least spec_threshold; never past max_tokens. */
int spec_k(const struct engine *en, const struct request *r, int n_running);

/** What a draft row must be worth, in expected kept tokens, at n running requests: with
 * the fitted step cost t = a + b * rows, a row costs b, in which plain steps would give
 * b * n / (a + b * n) tokens; 1/4 until the fit has rows of different counts. Grows to 1
 * as the batch fills where rows cost compute (CPU), stays small where a step is bound by
 * reading the weights (a GPU at small batch). */
double spec_threshold(const struct engine *en, int n_running);

/** A step of `rows` query rows that only decoded or verified took dt seconds. */
void spec_observe(struct engine *en, int rows, double dt);

/** While planning: how many of r's n_draft drafts join its row this step, given the budget
 * and logit rows left: as many as the budget, the rows, the pool (never preempting) and, for
 * hybrid models, a free state slot for the backup allow, and none past a due state
 * snapshot. Drafts left out are dropped (spec_drop). */
int spec_plan(struct engine *en, struct request *r, int budget, int rows);
/** r runs with drafts this step: hybrid models copy its state to a backup slot first. */
void spec_commit(struct engine *en, struct request *r);

/** The drafts r asks for before a step (spec_k, 0 when not eligible; its n_draft is reset):
 * a request that gets none creeps back towards drafting. */
int spec_want(const struct engine *en, struct request *r, int n_running);

/** The step about to run is en->plans[en->cur][0..n_plan) over en's batch arrays: a head
 * over the hidden states notes which rows each request has in it. */
void spec_step_rows(struct engine *en, int n_plan);

/** Before planning a step: sets every running request's n_draft (0 where none). */
void spec_propose(struct engine *en);

/** The verification of p's rows (its step has run and, unless the backend picked them,
 * their logits are in en->logits): emits the accepted drafts and the next token, rolls
 * back what the rejected rows took, counts. r may be retired (freed) on return. */
void spec_verify(struct engine *en, struct step_seq *p);

/** Draws the uniform numbers of p's rows for a backend that samples them, keeping the
 * generator's state before them (spec_verify winds it on by the tokens kept). */
void spec_draw_rows(struct engine *en, const struct step_seq *p, struct sample_row *rows);

/** r's drafts do not run this step (no budget or blocks for them): forgotten, and the
 * draft model's K/V of them too. */
void spec_drop(struct engine *en, struct request *r);

/** r leaves the running set (finished, preempted): the draft model's blocks go back. */
void spec_release(struct engine *en, struct request *r);

/* ngram.c */
/**
 * Prompt lookup: the longest n (max down to min) for which the last n tokens of
 * tokens[0..n_tokens) occurred earlier; of their occurrences the latest, and up to k of
 * the tokens that followed it go to out. Returns how many (0: no match). Cost: at most
 * (max - min + 1) * n_tokens comparisons of n-grams.
 */
int spec_ngram_propose(const int32_t *tokens, int n_tokens, int min, int max, int k, int32_t *out);

/* draft.c */
struct spec_draft *spec_draft_create(struct engine *en, const char *dir, struct err *e);
void spec_draft_destroy(struct spec_draft *d);
/** Runs the draft model greedily for reqs[0..n) (k[i] drafts each, k[i] reduced to what
 * its pool and the step budget allow), writing r->n_draft and the drafts. */
void spec_draft_propose(struct engine *en, struct spec_draft *d, struct request **reqs, int *k,
                        int n);
/** After verification: r's draft K/V is valid for its first `valid` tokens. */
void spec_draft_rollback(struct engine *en, struct spec_draft *d, struct request *r, int valid);
void spec_draft_release(struct spec_draft *d, struct request *r);

/* spec_head.c */
struct spec_head *spec_head_create(struct engine *en, struct err *e);
void spec_head_destroy(struct spec_head *d);
/** Notes the rows of the step about to run (spec_step_rows). */
void spec_head_step_rows(struct engine *en, struct spec_head *d, int n_plan);
/** The head's rows of the last step's requests, then the drafts of every running request
 * that drafts (spec_want), writing r->n_draft and the drafts. */
void spec_head_propose(struct engine *en, struct spec_head *d);

/* spec_sample.c: drafts drawn from the drafter's law, verified by rejection sampling */
/** Sizes the arena of the drafters with a law of their own (draft, mtp, eagle3). */
void spec_q_init(struct engine *en);
void spec_q_dispose(struct spec *s);
/**
 * Draft j of r from row `row` of the drafter's logits (model dm, after its forward; its
 * vocabulary maps to the target's as id + d2t[id] where d2t is given): where r samples
 * (temperature > 0) and drafts 0..j-1 were drawn the same way, drawn from the drafter's law
 * after r's processing with the uniform number of its output position, the law kept for the
 * verification (r->n_q = j + 1); else `pick`, the drafter's greedy token (a point mass).
 * r->tokens[n_tokens .. n_tokens + j) hold drafts 0..j-1.
 */
int32_t spec_q_pick(struct engine *en, struct request *r, int j, const struct model *dm, int row,
                    const int32_t *d2t, int32_t pick);
/**
 * The rule for a draft d drawn from law q (q_ids[0..q_n), probabilities q[], q(d) = qd > 0)
 * against the target's law p (p_ids[0..p_n), p[]): d with probability min(1, p(d) / q(d)),
 * else a draw from max(0, p - q) normalized; one or two uniform numbers of g. scratch:
 * [vocabulary] zeros on entry and return. *accepted says which. Cost O(p_n + q_n).
 */
int32_t spec_rule(const int32_t *p_ids, const float *p, int p_n, const int32_t *q_ids,
                  const float *q, int q_n, int32_t d, float qd, struct rng *g, float *scratch,
                  int *accepted);
/** Row j of r's verification (r->n_tokens = the row's context, its draft next) for a draft
 * with a law (j < r->n_q): the token it keeps (spec_rule); r's generator winds on by the
 * position's number. */
int32_t spec_q_verify(struct engine *en, struct request *r, int j, const float *logits,
                      int *accepted);

#endif
