/*
 * model: a loaded checkpoint (config + weights in place) and its forward pass over a
 * batch of tokens of several sequences on block-paged KV storage.
 *
 *     struct model *m = model_load(dir, &backend, &e);
 *     model_state_alloc(m, max_tokens, max_logits, n_blocks, block_size, &e);
 *     model_forward(m, &batch, logits);   // logits [batch.n_logits, vocab] on the host
 *
 * The architectures are in model/arch.c (one arch_<family>.c each, over model/blocks.h);
 * weights in f32/f16/bf16, MLX affine 2-8 bit, mxfp4, mxfp8 and nvfp4.
 */
#ifndef PAGODA_MODEL_MODEL_H
#define PAGODA_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "paged_kv/kv_quant.h"

/* self_attn.*: projections, optional per-head norms and biases. */
struct attn_block {
    struct qweight wq, wk, wv, wo; /* [Hq*D, hidden], [Hkv*D, hidden] x2, [hidden, Hq*D] */
    float *q_norm, *k_norm;        /* [D] per-head norms, else NULL */
    float *bq, *bk, *bv, *bo;      /* projection biases, else NULL */
    float *o_norm; /* [Hq*D] RMSNorm of the attention output before o (BitNet), else NULL */
};

/* mlp.*: down(act(gate(x)) * up(x)); its width is gate.n. */
struct mlp_block {
    struct qweight gate, up, down; /* [ffn, hidden] x2, [hidden, ffn] */
    float *b_gate, *b_up, *b_down; /* biases, else NULL */
    float *down_norm;              /* [ffn] RMSNorm before down (BitNet), else NULL */
};

/* linear_attn.*: a Gated DeltaNet layer (Hk key heads of dk, Hv value heads of dv). */
struct linear_block {
    struct qweight in_qkv;  /* [2*Hk*dk + Hv*dv, hidden]: q, k, v before the convolution */
    struct qweight in_z;    /* [Hv*dv, hidden] the output gate */
    struct qweight in_b;    /* [Hv, hidden] beta before its sigmoid */
    struct qweight in_a;    /* [Hv, hidden] the decay's input */
    struct qweight out;     /* [hidden, Hv*dv] */
    float *conv_w;          /* [conv_dim, conv_k] depthwise causal kernel */
    float *a_log, *dt_bias; /* [Hv] */
    float *norm;            /* [dv] the gated norm's weight (plain w) */
};

/* mlp.* of a routed-experts layer. */
struct moe_block {
    struct qweight router;            /* [E, hidden] mlp.gate */
    struct qweight *gate, *up, *down; /* [E] each: [inner, hidden] x2, [hidden, inner] */
    struct mlp_block shared;          /* shared_expert.*, when the config has one */
    struct qweight shared_gate;       /* [1, hidden] shared_expert_gate */
    const float *expert_scale;        /* [E] host: Gemma 4's router.per_expert_scale, else NULL */
};

/* One decoder layer: a family fills the blocks and norms it has. */
struct model_layer {
    float *attn_norm; /* [hidden] input_layernorm */
    float *ffn_norm;  /* [hidden] post_attention_ (Llama) / pre_feedforward_ (Gemma) */
    float *post_attn_norm, *post_ffn_norm; /* [hidden] Gemma sandwich norms, else NULL */
    struct attn_block attn;
    struct linear_block lin;
    struct mlp_block mlp;
    struct moe_block moe;
    /* Gemma 4 */
    float *v_norm;      /* [D] ones: V's RMSNorm has no weight */
    float *router_norm; /* [hidden] router.scale / sqrt(hidden): the router's input norm */
    float *pre_moe_norm, *post_mlp_norm,
        *post_moe_norm;                /* [hidden] *_feedforward_layernorm_2/1/2 */
    struct qweight ple_gate, ple_proj; /* [P, hidden] per_layer_input_gate, [hidden, P] */
    float *ple_norm;                   /* [hidden] post_per_layer_input_norm */
    float layer_scalar;                /* the layer's output is scaled by it */
};

/* Every tensor a model loaded, for counting and freeing without knowing its family. */
struct model_tensors {
    struct qweight **linears; /* matrices (a tied head appears once) */
    float **vecs;             /* vectors in backend memory */
    int64_t *vec_len;         /* their lengths */
    int n_linears, n_vecs, cap_linears, cap_vecs;
};

struct model {
    struct model_config cfg;
    char prefix[40]; /* of the decoder's tensors: "model.", "model.language_model.", ... */
    char head[40];   /* the output head's name: "lm_head" or "language_model.lm_head" */
    struct safetensors st;
    struct backend *be;
    struct qweight embed;   /* [vocab, hidden] */
    struct qweight lm_head; /* [vocab, hidden]; the embedding when tied */
    float embed_scale;
    float *final_norm; /* [hidden] */
    struct model_layer *layers;
    struct qweight *experts; /* every MoE layer's experts, 3 * n_experts a layer */
    struct model_tensors tensors;
    float *host_scales; /* host vectors the layers point into (per-expert scales) */
    /* Per-layer inputs (Gemma 4): embed_tokens_per_layer [vocab, L*P], per_layer_model_
     * projection [L*P, hidden], per_layer_projection_norm [P] */
    struct qweight ple_embed, ple_model_proj;
    float *ple_proj_norm;
    int rope_shared;         /* full and sliding layers use the same rope tables */
    float *rope_inv_freq[2]; /* [D/2] host tables: full-attention layers, sliding layers */
    float rope_mscale[2];    /* yarn attention factor (1 otherwise) */
    float *rope_inv_dev[2];  /* the same in backend memory, where it computes the tables */

    /* Step state, sized by model_state_alloc (backend memory). */
    int max_tokens, max_logits;
    float *x, *h, *q, *k, *v, *att, *gate, *up; /* activations of up to max_tokens rows */
    float *xl;                                  /* [max_logits, hidden] rows for the head */
    float *logits;                              /* [max_logits, vocab] */
    float *rope_cos[2], *rope_sin[2];           /* [max_tokens, D/2] backend tables */
    float *host_cos, *host_sin;                 /* host staging for the tables */
    float *qg, *qgate;         /* gated attention: [T, Hq*2D] q_proj output, [T, Hq*D] gate */
    float *lin_qkv, *lin_z;    /* DeltaNet: [T, conv_dim], [T, Hv*dv] */
    float *lin_b, *lin_a;      /* [T, Hv] each */
    float *lin_out;            /* [T, Hv*dv] */
    float *router, *moe_out;   /* MoE: [T, E], [T, hidden] */
    float *shared_g;           /* [T] the shared expert's gate */
    float *ple, *ple_in;       /* per-layer inputs: [T, L*P] work rows, [L, T, P] per layer */
    float *ple_g;              /* [T, P] a layer's gated per-layer input */
    int32_t *ple_rows;         /* host [L * T]: the gather from [T, L, P] to [L, T, P] */
    struct kv_geom *kvg;       /* [n_layers] each layer's KV shape (its source's when shared) */
    struct kv_layer *kv;       /* [n_layers] (attention layers) */
    struct state_layer *state; /* [n_layers] (linear-attention layers) */
    int n_states;              /* recurrent-state slots */
    struct kv_spec kv_spec;    /* KV formats (model_set_kv_format); zero: auto */

    /* [max_hidden, hidden] final-normed rows of fwd_batch.hidden_rows (embeddings); NULL
     * and 0 until model_hidden_alloc */
    float *hid;
    int max_hidden;

    /* EAGLE-3 (model_aux_alloc): the residual rows entering layers aux_layer[0..n_aux) (or,
     * for n_layers, leaving the last), [n_aux][max_tokens, hidden]; n_aux 0 otherwise */
    int n_aux, aux_layer[3];
    float *aux;

    /* Tensor parallelism (model/tp.h): this model is rank tp_rank of tp_size (0 of 1 alone);
     * its config holds the rank's share of the heads and MLP width, its head the rank's
     * vocab_part rows of the vocabulary, whose logits [max_logits, vocab_part] land in
     * logits_part before the group gathers them into logits. The group's lead (rank 0) is the
     * model the engine holds: tp is its group, through which the calls that touch every
     * rank go; NULL elsewhere. host_blobs: model_host_weight's memory. */
    int tp_rank, tp_size, vocab_part;
    /* the rank's key-value heads are share kv_part of kv_parts: tp_rank of tp_size, or, with
     * fewer heads than ranks, head tp_rank * heads / tp_size (ranks then share a head) */
    int kv_part, kv_parts;
    int *layer_kv_parts; /* [n_layers] each layer's kv_parts (its own KV head count); NULL alone */
    float *logits_part;
    int32_t *tp_tokens; /* host [max_tokens]: a step's tokens as rows of the embedding's share */
    struct tp_group *tp;
    void **host_blobs;
    int n_host_blobs;
};

/* How a rank of a tensor-parallel group takes its share of a matrix. */
enum tp_split {
    SPLIT_NONE,  /* the whole matrix on every rank */
    SPLIT_ROWS,  /* rows [rank * n, (rank + 1) * n): a share of the outputs */
    SPLIT_COLS,  /* columns [rank * k, (rank + 1) * k): a share of the inputs (partial sums) */
    SPLIT_KV,    /* rows [kv_part * n, (kv_part + 1) * n): the rank's key-value heads */
    SPLIT_VOCAB, /* SPLIT_ROWS, then a row of zeros (n + 1 rows): an embedding's share, whose
                    last row every token outside the share looks up */
};

/** Loads the linear layer `prefix` ("model.layers.0.self_attn.q_proj") of n outputs and k
 * inputs in its stored format (for the families' loaders). 0, or -1 + err naming the tensor. */
int model_load_linear(struct model *m, const char *prefix, int64_t n, int64_t k, struct qweight *w,
                      struct err *e);

/** As model_load_linear, n and k the rank's share under `split` (model/tp.h; at one rank the
 * whole matrix whatever the split). A column share is copied out of the mapping; quantized
 * weights split on whole groups. */
int model_load_linear_split(struct model *m, const char *prefix, int64_t n, int64_t k,
                            enum tp_split split, struct qweight *w, struct err *e);

/** A matrix of k inputs whose rows are n_parts blocks stacked (a DeltaNet's in_proj_qkv: q,
 * k, v), each shared out by rows alike: parts[i] is the rank's share of block i, and the rank
 * holds its rows of each block one after another (copied out of the mapping; at one rank the
 * whole matrix of sum(parts) rows). */
int model_load_linear_stacked(struct model *m, const char *prefix, int n_parts,
                              const int64_t *parts, int64_t k, struct qweight *w, struct err *e);

/** As model_load_rows for the rank's rows of each of n_parts stacked blocks of rows, parts[i]
 * the rank's share of block i (as model_load_linear_stacked). */
int model_load_rows_stacked(struct model *m, const char *name, int n_parts, const int64_t *parts,
                            int64_t cols, float **out, struct err *e);

/** As model_load_vec for the rank's share of the vector under split (SPLIT_ROWS: [rank * dim,
 * (rank + 1) * dim); SPLIT_KV: by kv_part). */
int model_load_vec_part(struct model *m, const char *name, int dim, float add, int required,
                        enum tp_split split, float **out, struct err *e);

/** Counts w among the model's matrices (for one a family built itself). */
void model_track_linear(struct model *m, struct qweight *w);

/** `bytes` of zeroed host memory that lives as long as the model: weights a family builds
 * at load time (a repacking) or a share copied out of the mapping, handed to the backend's
 * weight_prepare (which reads them in place on the CPU and copies them elsewhere). */
void *model_host_weight(struct model *m, size_t bytes);

/** Loads the vector `name` of dim values into backend memory as float, plus `add` ((1 + w)
 * norms). A missing tensor is an error when `required`, else *out = NULL. */
int model_load_vec(struct model *m, const char *name, int dim, float add, int required, float **out,
                   struct err *e);

/** Expert `expert` of the stack [E, n, k] stored under `prefix` (MLX switch_mlp). */
int model_load_expert(struct model *m, const char *prefix, int expert, int64_t n, int64_t k,
                      struct qweight *w, struct err *e);

/** As model_load_expert, n and k the rank's share of the expert under `split` (as
 * model_load_linear_split). */
int model_load_expert_split(struct model *m, const char *prefix, int expert, int64_t n, int64_t k,
                            enum tp_split split, struct qweight *w, struct err *e);

/** Rows [row0, row0 + n) of expert `expert` of the unquantized stack `name` [E, R, k] (a
 * fused gate_up_proj holds gate then up), n and k the rank's share under split: SPLIT_ROWS
 * takes rows [row0 + rank * n, row0 + (rank + 1) * n), SPLIT_COLS a share of the k inputs. */
int model_load_expert_rows(struct model *m, const char *name, int expert, int64_t row0, int64_t n,
                           int64_t k, enum tp_split split, struct qweight *w, struct err *e);

/** Makes SPLIT_KV take the rank's share of layer l's own key-value heads (for a family whose
 * layers differ in KV head count: called before loading the layer's k and v). */
void model_kv_share_layer(struct model *m, int l);

/** The `dim` values of the vector `name` as host floats. */
int model_read_vec(struct model *m, const char *name, int dim, float *out, struct err *e);

/** A copy of host values in backend memory, freed with the model. */
float *model_upload_vec(struct model *m, const float *host, int64_t n, struct err *e);

/** Loads `name` as rows x cols floats, stored with any singleton dimensions ([C, 1, K] or
 * [C, K, 1] for a depthwise convolution's [C, K]). */
int model_load_rows(struct model *m, const char *name, int64_t rows, int64_t cols, float **out,
                    struct err *e);

/** Loads the model folder onto the backend. NULL + err naming the file and tensor. */
struct model *model_load(const char *dir, struct backend *be, struct err *e);

/** Sizes the step buffers, the KV storage (n_blocks blocks of block_size tokens) and the
 * recurrent-state slots of linear-attention layers (n_states; 0 for models without them). */
int model_state_alloc(struct model *m, int max_tokens, int max_logits, int n_blocks, int block_size,
                      int n_states, struct err *e);

/** Sizes the buffer of the rows a step asks the final hidden state of (fwd_batch.hidden_rows,
 * at most max_rows a step); models that serve no embedding never call it. */
int model_hidden_alloc(struct model *m, int max_rows, struct err *e);

/** Keeps, from now on, the residual rows entering each layer of layers[0..n) (n_layers: the
 * last layer's output) of every step in m->aux (after model_state_alloc; the families of
 * model/arch.h that call blk_capture). 0, or -1 + err when out of memory. */
int model_aux_alloc(struct model *m, const int *layers, int n, struct err *e);

/** Copies the last step's n hidden rows (after model_forward) to host memory out [n, hidden],
 * in the order of fwd_batch.hidden_rows; waits for the step to end. */
void model_hidden(struct model *m, int n, float *out);

/** KV bytes one token takes across the attention layers (K and V in the backend's KV type). */
size_t model_kv_bytes_per_token(const struct model *m);

/** Sets the KV formats model_state_alloc lays the cache out in: 0, or -1 with a message
 * when the backend lacks a format or a layer's head size does not suit it. */
int model_set_kv_format(struct model *m, const struct kv_spec *s, struct err *e);

/** KV bytes of one block of block_size tokens across the attention layers under spec
 * (NULL: the model's own, model_set_kv_format). */
size_t model_kv_bytes_per_block(const struct model *m, const struct kv_spec *spec, int block_size);

/** Bytes of one sequence's recurrent state across the linear-attention layers (0: none); of a
 * split model, one rank's share (its heads' conv rows and matrices). */
size_t model_state_bytes(const struct model *m);

/** Copies recurrent-state slot src to slot dst (every linear-attention layer), in order
 * with the steps around it; a split model's on every rank. */
void model_state_copy(struct model *m, int dst, int src);

/** Copies recurrent-state slot `slot` to host memory dst [model_state_bytes] (of a split
 * model the rank's share; model_state_image_read covers every rank): for each
 * linear-attention layer in order, its conv rows then its delta-rule matrix, float32 (the
 * image a disk tier stores; it waits for the work queued before it). */
void model_state_read(struct model *m, int slot, void *dst);

/** Copies src [model_state_bytes] (model_state_read's image) into slot `slot`, in order
 * with the steps after it. */
void model_state_write(struct model *m, int slot, const void *src);

/** The pieces of state slots (the copy engine's, model_kv_copy_setup): for each
 * linear-attention layer in order, its conv rows then its matrix; piece s of slot i is
 * base[s] + bytes[s] * i. base and bytes hold 2 * n_layers; returns how many pieces. */
int model_state_pieces(const struct model *m, void **base, size_t *bytes);

/** The start of every step of m: the batch handed to the backend, the rope tables of its
 * positions (model_forward calls it; a draft head over the model's layers does too). */
void model_step_begin(struct model *m, const struct fwd_batch *b);

/** Runs one step; writes logits [b->n_logits, vocab] to host memory, or leaves them in
 * backend memory (m->logits) when `logits` is NULL (see model_argmax). The final-normed
 * hidden rows b->hidden_rows stay in backend memory until model_hidden reads them. */
void model_forward(struct model *m, const struct fwd_batch *b, float *logits);

/** Greedy tokens of the last step's n logit rows (after model_forward with NULL logits),
 * computed where the logits live; written to host memory. With out NULL it may return
 * before they exist: the next step can take them as input (fwd_batch.pick_rows) and
 * model_picks reads them. */
void model_argmax(struct model *m, int n, int32_t *out);

/** Waits for the earliest model_argmax / model_sample started with out NULL and not yet
 * read, and writes its n tokens to out. */
void model_picks(struct model *m, int n, int32_t *out);

/** Whether the backend samples where the logits are (model_sample). */
int model_can_sample(const struct model *m);

/** Tokens sampled from the last step's n logit rows under p[i] (after model_forward with
 * NULL logits), where the logits live; written to host memory (out NULL: as model_argmax). */
void model_sample(struct model *m, int n, const struct sample_row *p, int32_t *out);

void model_destroy(struct model *m);

/** Parameter count (values of every matrix and vector). */
int64_t model_param_count(const struct model *m);

/** Bytes of weights as stored. */
size_t model_weight_bytes(const struct model *m);

#endif
