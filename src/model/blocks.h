/*
 * blocks: the pieces the families' layer stacks are made of, written once against the
 * backend table. A block reads its input from m->h (the normalized residual rows) and leaves
 * its output in m->h; the family adds it to the residual m->x.
 *
 *     blk_norm(m, m->h, m->x, L->attn_norm, n);
 *     blk_attn(m, &L->attn, l, b);
 *     blk_add(m, n);                             // x += h
 */
#ifndef PAGODA_MODEL_BLOCKS_H
#define PAGODA_MODEL_BLOCKS_H

#include "model/model.h"

/** The name of layer `layer`'s tensor or module `suffix` ("mlp.gate_proj") in buf. */
const char *blk_name(const struct model *m, char *buf, size_t n, int layer, const char *suffix);

/** Loads the norm weight `name` [dim] ((1 + w) when the config says so). */
int blk_norm_load(struct model *m, const char *name, int dim, float **out, struct err *e);

/** Loads `<prefix>.{q,k,v,o}_proj` with the biases and q/k norms the config declares. In a
 * tensor-parallel group, the rank's heads: q/k/v and their biases by rows, o by columns, o's
 * bias at rank 0 only (model_load_linear_split). */
int blk_attn_load(struct model *m, const char *prefix, struct attn_block *a, struct err *e);

/** Loads `<prefix>.{gate,up,down}_proj` of width ffn (and their biases, mlp_bias); in a
 * tensor-parallel group the rank's share of the width (ffn is the rank's). */
int blk_mlp_load(struct model *m, const char *prefix, int ffn, struct mlp_block *p, struct err *e);

/** Loads `<prefix>.*` of a Gated DeltaNet layer (linear_attn). */
int blk_linear_load(struct model *m, const char *prefix, struct linear_block *lb, struct err *e);

/** Loads the router `<prefix>.gate`, the experts (`<prefix>.experts.N.*` or the MLX stacks
 * `<prefix>.switch_mlp.*`) and, when the config has one, the gated shared expert. In a
 * tensor-parallel group (vLLM's split): the router and the shared expert's gate whole, each
 * expert's and the shared expert's share of the width (moe_intermediate_size and
 * shared_expert_intermediate_size in the config are the rank's); blk_moe then leaves a
 * partial sum in m->h that the family adds up with blk_reduce. */
int blk_moe_load(struct model *m, const char *prefix, int layer, struct moe_block *mb,
                 struct err *e);

/** out [rows, hidden] = RMSNorm(x) * w */
void blk_norm(struct model *m, float *out, const float *x, const float *w, int rows);

/** The residual rows entering layer `layer` (n_layers: leaving the last) are kept where
 * model_aux_alloc asked for them; a family's layer loop calls it before each layer and after
 * the last. Nothing when none is asked for. */
void blk_capture(struct model *m, int layer, int rows);

/** x += h over the step's rows. */
void blk_add(struct model *m, int rows);

/** In a tensor-parallel group (model/tp.h), h = the sum of every rank's partial h (the rows
 * after o or down, whose inputs each rank holds a share of); nothing at one rank. */
void blk_reduce(struct model *m, int rows);

/** Self-attention of layer `layer` over the paged KV: q/k/v of m->h, biases, q/k norms, rope
 * (the layer kind's tables), the KV store, attention, o. Result in m->h. */
void blk_attn(struct model *m, const struct attn_block *a, int layer, const struct fwd_batch *b);

/** Gated MLP of m->h: down(act(gate) * up). Result in m->h. */
void blk_mlp(struct model *m, const struct mlp_block *p, int rows);

/** Gated DeltaNet of layer `layer` over m->h, continuing each sequence's recurrent state:
 * in_proj_qkv -> causal conv -> delta rule -> gated norm with z -> out_proj. Result in m->h. */
void blk_linear(struct model *m, const struct linear_block *lb, int layer,
                const struct fwd_batch *b);

/** The `moe` operation's parameters for a block's experts under the model's config. */
struct moe_params blk_moe_params(const struct model *m, const struct moe_block *mb);

/** Routed experts of m->h plus the gated shared expert. Result in m->h. */
void blk_moe(struct model *m, const struct moe_block *mb, int rows);

#endif
