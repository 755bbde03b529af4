/*
 * tp: tensor parallelism on one host (vLLM's --tensor-parallel-size). A model is split over
 * `size` devices, one rank each, in the Megatron manner: every attention layer's heads and
 * every MLP's width are shared out (q/k/v and gate/up by rows, o and down by columns; in a
 * MoE layer every expert's width, the router whole on every rank as vLLM does), so each
 * rank computes a partial sum of o's and down's outputs that the group adds up
 * (backend_ops.all_reduce, blk_reduce); a Gated DeltaNet layer's key and value heads (its
 * input projections by rows, out_proj by columns) and their recurrent states alike; the
 * embedding and the head are split by vocabulary rows: a rank embeds the tokens of its share
 * (zeros for the others) and the group adds the rows up, and the head's logits are gathered
 * (all_gather).
 *
 * The engine holds rank 0's model (the lead) and calls the model API as for one device:
 * the calls that touch every rank (forward, the step buffers and state slots, a state slot's
 * copy, the KV format) run on each rank at once, rank 0 on the caller's thread and each other rank
 * on a thread of its own that created its backend; picks, samples and logits are read from the
 * lead, which holds the gathered logits.
 *
 *     struct model *m = model_load_tp(dir, &be, "cuda", 2, 0, &e);  // be: rank 0's backend
 *     model_forward(m, &batch, NULL);                              // every rank steps
 *
 * At most TP_MAX ranks; the CPU backend runs groups too (threads exchanging through shared
 * memory), which the tests use to check the split against one rank.
 */
#ifndef PAGODA_MODEL_TP_H
#define PAGODA_MODEL_TP_H

#include "model/model.h"

#define TP_MAX 8

struct tp_group;

/**
 * Loads dir split over `size` ranks: rank 0 on be (created by the caller on the first
 * device: "cuda:K" or "cpu"), rank r on a backend of its own for device K + r ("cpu": another
 * CPU backend of `threads` threads). size 1 is model_load. NULL + err when a rank fails to
 * load, the model's family or shape does not split `size` ways, or the backend cannot make
 * a group (no collective library, too few devices).
 */
struct model *model_load_tp(const char *dir, struct backend *be, const char *device, int size,
                            int threads, struct err *e);

/** Loads rank `rank` of `size` (model_load is rank 0 of 1). */
struct model *model_load_rank(const char *dir, struct backend *be, int rank, int size,
                              struct err *e);

/* Used by the model API for a group's lead: each runs on every rank. */
void tpg_forward(struct tp_group *g, const struct fwd_batch *b, float *logits);
int tpg_state_alloc(struct tp_group *g, int max_tokens, int max_logits, int n_blocks,
                    int block_size, int n_states, struct err *e);
void tpg_state_copy(struct tp_group *g, int dst, int src);
int tpg_hidden_alloc(struct tp_group *g, int max_rows, struct err *e);
int tpg_set_kv_format(struct tp_group *g, const struct kv_spec *s, struct err *e);
/** The group's size, and rank r's model (0: the lead). Between the group's calls the other
 * ranks' threads wait, so the lead's thread may use their models' KV and copy engines (the
 * tiers do: each rank's share of a block or snapshot, model/kv_block.h). */
int tpg_size(const struct tp_group *g);
struct model *tpg_rank_model(struct tp_group *g, int r);
/** Stops the other ranks and frees their models and backends (model_destroy of the lead). */
void tpg_destroy(struct tp_group *g);

/* One rank's part of the calls above (the model API's functions on a model alone). */
void model_forward_rank(struct model *m, const struct fwd_batch *b, float *logits);
int model_state_alloc_rank(struct model *m, int max_tokens, int max_logits, int n_blocks,
                           int block_size, int n_states, struct err *e);
int model_hidden_alloc_rank(struct model *m, int max_rows, struct err *e);
void model_state_copy_rank(struct model *m, int dst, int src);
int model_set_kv_format_rank(struct model *m, const struct kv_spec *s, struct err *e);

#endif
