/*
 * backend: the operations a model's forward pass needs, as a function table plus a
 * context (in the manner of ggml's backends). Architecture code (model/forward.c) is
 * written once against it; the CPU backend (model/backend_cpu.c) is the reference and the
 * CUDA backend plugs in the same table.
 *
 * Every float pointer an op receives is backend memory (from ops->alloc): the architecture
 * code never dereferences it, so it may live on a device. Step metadata (token ids,
 * positions, KV slots, block tables) reaches the backend through batch_begin() once per
 * step and is read from the host-side `struct fwd_batch` by the ops that need it.
 */
#ifndef PAGODA_MODEL_BACKEND_H
#define PAGODA_MODEL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/config.h"
#include "model/weights.h"

/*
 * One forward step over a batch of sequences: a flattened list of new tokens and, per
 * sequence, where its tokens sit and which KV blocks hold its context (block-paged KV).
 */
struct fwd_batch {
    int n_tokens;
    const int32_t *tokens; /* [n_tokens] */
    const int32_t *pos;    /* [n_tokens] position of each token in its sequence */
    const int32_t *slot;   /* [n_tokens] KV row for its K/V: block * block_size + offset */
    int n_seqs;
    const int32_t *q_start;     /* [n_seqs + 1] sequence s owns tokens [q_start[s], q_start[s+1]) */
    const int32_t *seq_len;     /* [n_seqs] tokens in the sequence's KV after this step */
    const int32_t *block_table; /* [n_seqs][max_blocks] block ids of each sequence */
    int max_blocks;
    int n_logits;
    const int32_t *logit_rows; /* [n_logits] token rows whose next-token logits are wanted */
    /* NULL, or [n_tokens]: where >= 0, token t is not tokens[t] but the id picked for that
     * row by the last argmax or sample started before this step (one not yet read back:
     * the engine runs a step while the previous one's picks are still on their way) */
    const int32_t *pick_rows;
    /* [n_seqs] recurrent-state slot of each sequence (models with linear-attention layers;
     * NULL otherwise). A sequence whose first token of the step is at position 0 starts
     * from a zero state; any other continues the state its slot holds. */
    const int32_t *state_slot;
    /* Rows whose final hidden state (after the final norm, no head) is wanted: the pooled
     * rows of embedding requests. hidden_rows [n_hidden] token rows, in any order. */
    int n_hidden;
    const int32_t *hidden_rows;
    /* Gated DeltaNet layers: NULL (every token one at a time), or [n_seqs] a position, a
     * multiple of delta_chunk, below which the sequence's tokens run the delta rule in
     * chunks of delta_chunk tokens aligned to positions 0, C, 2C... (the WY form); tokens at
     * or past it run one at a time. A chunk not wholly in the step also runs token by token.
     * The two forms differ in the last bits, so the caller fixes the position per request
     * (the engine: the prompt's whole chunks) and ends steps below it at chunk boundaries. */
    const int32_t *delta_chunked;
    int delta_chunk; /* 2 to DELTA_CHUNK_MAX */
};

/* The longest delta-rule chunk a backend takes (fwd_batch.delta_chunk). */
#define DELTA_CHUNK_MAX 64

/* KV storage of one layer: K and V as [n_blocks][block_size][n_kv_heads][head_dim] values of
 * the backend's KV type (backend_ops.kv_value_bytes: float32 on the CPU, bf16 on CUDA). */
struct kv_layer {
    float *k, *v;
};

struct kv_geom {
    int n_blocks, block_size, n_kv_heads, head_dim;
    /* enum kv_dtype of K and of V (paged_kv/kv_quant.h). Both 0 (auto): the layout above.
     * Otherwise K and V are each [n_blocks][n_kv_heads] head blocks of their format
     * (kv_head_block_bytes), read in place by the attention kernels. */
    int k_dtype, v_dtype;
    float k_scale, v_scale; /* fp8: a checkpoint's fixed scales; 0: a scale per token */
};

/* Recurrent state of one linear-attention layer for n_slots sequences, float32:
 * conv [n_slots][conv_k - 1][conv_dim] (the last inputs of the causal convolution) and
 * rec [n_slots][n_v_heads][k_dim][v_dim] (the delta rule's matrix). */
struct state_layer {
    float *conv, *rec;
};

/* A Gated DeltaNet layer's shape and small parameters (backend memory). */
struct delta_params {
    int n_k_heads, n_v_heads, k_dim, v_dim; /* v head h reads k head h / (n_v / n_k) */
    int conv_k;                             /* causal depthwise kernel (4) */
    const float *conv_w;                    /* [conv_dim][conv_k], conv_dim = 2*Hk*dk + Hv*dv */
    const float *a_log, *dt_bias;           /* [n_v_heads] */
};

/* Routed experts of one MoE layer: expert e is down(act(gate x) * up x). */
struct moe_params {
    int n_experts, top_k;
    int norm_topk; /* renormalize the chosen weights to sum to 1 */
    enum act_kind act;
    const struct qweight *gate, *up, *down; /* [n_experts] each: [I, H], [I, H], [H, I] */
    const float *expert_scale; /* host [n_experts]: multiplies a chosen expert's weight after
                                  the renormalization (Gemma 4), else NULL */
};

struct attn_params {
    int n_heads, n_kv_heads, head_dim;
    float scale;   /* multiplies q.k */
    float softcap; /* 0 = none: scores become cap * tanh(score / cap) */
    int window;    /* 0 = full causal attention; else keys with pos > q_pos - window */
};

/* What a backend runs on, for reports and memory planning. */
struct backend_info {
    char device[160];   /* "cpu (8 threads)", "NVIDIA H200 (cuda:0, sm_90, 132 SMs)" */
    size_t mem_total;   /* bytes of the memory the backend allocates from */
    size_t mem_free;    /* of which free now */
    int kv_value_bytes; /* bytes per stored K/V value */
};

/* One logit row's sampling parameters for backends that sample where the logits are. */
struct sample_row {
    float temperature; /* <= 0: the largest value (the lowest index among equals) */
    int top_k;         /* <= 0: off */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off */
    float u;           /* the row's uniform draw in [0, 1) */
};

/* What the copy engine moves (backend_ops.copy_setup): KV pool blocks, and the
 * recurrent-state slots of hybrid models. */
enum backend_copy_kind { BACKEND_COPY_BLOCK, BACKEND_COPY_STATE, BACKEND_COPY_KINDS };

struct backend_ops {
    const char *name;
    /* 1: argmax / sample with no host output return before the ids exist (the device works
     * on while the host plans the next step); 0: they are computed when called */
    int async_picks;
    int kv_value_bytes; /* bytes per stored K or V value (4: float32, 2: bf16) */
    /* 1: matmul takes WFMT_TERNARY weights (BitNet's BitLinear, int8 activations) and act_mul
     * ACT_RELU2; 0: models that need them are refused when they load */
    int bitnet;
    /* bit d set: KV format d (enum kv_dtype) is stored and read besides auto */
    uint32_t kv_dtypes;
    void (*info)(void *ctx, struct backend_info *out);
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    void (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*download)(void *ctx, void *dst, const void *src, size_t bytes);
    /* Makes a weight usable by the backend (a device copy, a repacking); 0 or -1 + err. */
    int (*weight_prepare)(void *ctx, struct qweight *w, struct err *e);
    void (*batch_begin)(void *ctx, const struct fwd_batch *b);
    /* Optional (NULL: every shape runs). Whether attention of head size head_dim with
     * n_heads query heads over n_kv_heads KV heads runs here: 0, or -1 with a message that
     * names the supported values. model_load asks it for every attention shape of a model,
     * so that a shape a backend cannot run is refused when the model loads. */
    int (*attn_check)(void *ctx, int head_dim, int n_heads, int n_kv_heads, struct err *e);

    /* out[t] = table[tokens[t]] * scale for every token of the batch. */
    void (*embed)(void *ctx, float *out, const struct qweight *table, const struct fwd_batch *b,
                  float scale);
    /* y[m, n] = x[m, k] . W^T */
    void (*matmul)(void *ctx, float *y, const float *x, const struct qweight *w, int m);
    /* y[i, :] += bias for m rows of n */
    void (*add_bias)(void *ctx, float *y, const float *bias, int m, int n);
    void (*rms_norm)(void *ctx, float *out, const float *x, const float *w, int rows, int dim,
                     float eps);
    /* x [rows, heads, d] rotated by cos/sin [rows, d/2] */
    void (*rope)(void *ctx, float *x, int rows, int heads, int d, const float *cos_t,
                 const float *sin_t);
    /* Optional (NULL: the caller uploads tables it computed): cos_t and sin_t [n_tokens, half]
     * of the batch's positions, cos((float)pos * inv_freq[i]) * mscale and the sine alike,
     * in single precision; inv_freq [half] in backend memory. */
    void (*rope_tables)(void *ctx, float *cos_t, float *sin_t, const float *inv_freq, int half,
                        float mscale, const struct fwd_batch *b);
    /* Writes this step's K/V rows [n_tokens, n_kv_heads * head_dim] into their slots. */
    void (*kv_store)(void *ctx, const struct kv_layer *kv, const struct kv_geom *g, const float *k,
                     const float *v, const struct fwd_batch *b);
    /* out [n_tokens, n_heads * head_dim]: causal (optionally windowed) attention of each
     * token over its sequence's paged KV. */
    void (*attention)(void *ctx, float *out, const float *q, const struct kv_layer *kv,
                      const struct kv_geom *g, const struct fwd_batch *b,
                      const struct attn_params *p);
    void (*act_mul)(void *ctx, float *out, const float *gate, const float *up, int64_t n,
                    enum act_kind act);
    void (*add)(void *ctx, float *x, const float *y, int64_t n);
    void (*softcap)(void *ctx, float *x, int64_t n, float cap);
    /* dst[i] = src[rows[i]] for rows of dim floats */
    void (*gather_rows)(void *ctx, float *dst, const float *src, const int32_t *rows, int n,
                        int dim);
    /* out[i] (host memory) = index of the largest value of row i of x [rows, n] (the
     * lowest index among equals): greedy sampling without moving logits to the host.
     * With out NULL the call may return before the ids exist: they stay in the backend,
     * where the next step's pick_rows find them, until picks() reads them. */
    void (*argmax)(void *ctx, int32_t *out, const float *x, int rows, int n);
    /* Waits for the earliest argmax or sample started with out NULL and not yet read, and
     * writes its `rows` ids to out (host memory). At most two are pending at a time. */
    void (*picks)(void *ctx, int32_t *out, int rows);
    void (*destroy)(void *ctx);
    /* Optional (NULL: not offered). out[i] (host memory) = the token sampled from row i of
     * x [rows, n] under p[i]: candidates are the finite values in canonical order (larger
     * first, then lower index); top_k keeps the first top_k, min_p those within
     * temperature * ln(min_p) of the largest, top_p the shortest prefix holding that share
     * of the kept weight exp((x - max) / temperature); the token is the first of the kept
     * in canonical order whose cumulative weight exceeds u times their total. With out
     * NULL, as argmax. */
    void (*sample)(void *ctx, int32_t *out, const float *x, int rows, int n,
                   const struct sample_row *p);

    /* The operations of the hybrid and MoE families. Optional: a model that needs one the
     * backend lacks is refused when it loads (model/arch.h). */
    /* Partial rotary: rotates pairs (j, j + rot/2), j < rot/2, of each head of d values;
     * cos/sin [rows, rot/2]. */
    void (*rope_partial)(void *ctx, float *x, int rows, int heads, int d, int rot,
                         const float *cos_t, const float *sin_t);
    /* qg [rows, heads, 2 * d] holds each head's query then its gate: q and gate [rows, heads
     * * d] receive them apart. */
    void (*split_qgate)(void *ctx, float *q, float *gate, const float *qg, int rows, int heads,
                        int d);
    /* x [rows, n] *= sigmoid(g), g [rows, gn] with gn = n (elementwise) or 1 (per row). */
    void (*gate_mul)(void *ctx, float *x, const float *g, int rows, int n, int gn);
    /* out[r] = RMSNorm(x[r]) * w * silu(z[r]) over rows of dim (out may alias x). */
    void (*rms_norm_gated)(void *ctx, float *out, const float *x, const float *z, const float *w,
                           int rows, int dim, float eps);
    /* Gated DeltaNet over the step: qkv [n_tokens, conv_dim] (overwritten), beta_in and a
     * [n_tokens, n_v_heads]; out [n_tokens, n_v_heads * v_dim]. Per sequence: causal conv
     * (kernel conv_k, SiLU) continuing st->conv, q and k L2-normalized, beta = sigmoid(b),
     * g = -exp(a_log) * softplus(a + dt_bias), S = S * exp(g) + k (beta (v - S^T k))^T,
     * o = S^T q / sqrt(k_dim); the slot's state is left after the sequence's last token. */
    void (*delta_net)(void *ctx, float *out, float *qkv, const float *beta_in, const float *a,
                      const struct state_layer *st, const struct delta_params *p,
                      const struct fwd_batch *b);
    /* out [rows, H] = sum over each row's top_k experts (softmax of router [rows, n_experts],
     * ties to the lower index) of weight * expert(x), added in expert order. */
    void (*moe)(void *ctx, float *out, const float *x, const float *router,
                const struct moe_params *p, int rows, int hidden);
    /* dst = src, bytes in backend memory (ordered with the step's work). */
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    /* x [n] *= s (Gemma 4's layer scalars). */
    void (*scale)(void *ctx, float *x, int64_t n, float s);

    /* A copy engine beside the step (the host-memory KV tier, paged_kv/kv_host.h). Optional
     * (NULL: the backend has none; the CPU's KV pool is host memory already). Copies run in
     * the order queued, each after the step work queued before it, and never make the host
     * wait; the backend may hold them back until the next copy_mark or copy_fence to copy
     * them together. */
    /* Pinned host memory (NULL when it cannot be had), and its release. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* The pieces of one unit of a kind (enum backend_copy_kind), once per kind before
     * copy_block: segment s of unit b is base[s] + bytes[s] * b (backend memory); a unit's
     * host image is its segments in order. */
    void (*copy_setup)(void *ctx, int kind, int n_seg, void *const *base, const size_t *bytes);
    /* Queues a copy of unit `block` of that kind to its image at host (memory from
     * host_alloc), to_host, or back. */
    void (*copy_block)(void *ctx, int kind, int32_t block, void *host, int to_host);
    /* A ticket (> 0, increasing) completed once every copy queued so far has; whether
     * ticket t has (never waits). */
    uint64_t (*copy_mark)(void *ctx);
    int (*copy_done)(void *ctx, uint64_t t);
    /* The step work queued from now on waits on the device for every copy queued so far. */
    void (*copy_fence)(void *ctx);
    /* Device seconds the copies completed so far took, down (to host) and up. */
    void (*copy_seconds)(void *ctx, double *out_s, double *in_s);
    /* Memory from another context's host_alloc (a tensor-parallel group's lead) made usable
     * by this one's copy_block, and no longer (its copies complete first). Optional: without
     * them a split model has no copy engine. */
    void (*host_map)(void *ctx, void *p, size_t bytes);
    void (*host_unmap)(void *ctx, void *p);

    /* Tensor parallelism (model/tp.h). Optional (NULL: the backend runs no groups). */
    /* Makes members[0..size) (contexts of this backend, members[0] == ctx, one device each)
     * one group, member r its rank r; 0, or -1 + err (no collective library, a device twice). */
    int (*group_create)(void *ctx, int size, void *const *members, struct err *e);
    /* x [n] = the sum over the group of every rank's x [n], added in rank order. Every rank
     * calls it with the same n, in the same order among the group's collectives. */
    void (*all_reduce)(void *ctx, float *x, int64_t n);
    /* out [rows, size * cols] = every rank's in [rows, cols] side by side, rank 0 first. */
    void (*all_gather)(void *ctx, float *out, const float *in, int rows, int cols);
    /* Starts the work recorded so far (backends that record a step before running it); every
     * rank of a group calls it at the end of its share of a step, since each rank's
     * collectives wait for the others'. */
    void (*submit)(void *ctx);
};

struct backend {
    const struct backend_ops *ops;
    void *ctx;
};

/** The CPU backend on a pool of `threads` threads (<= 0: one per core). */
int backend_cpu_create(struct backend *be, int threads, struct err *e);

/**
 * The backend a device string names: "cpu", "cuda" or "cuda:N". NULL or "" picks cuda
 * when this build has the CUDA backend and a GPU is present, else cpu. `threads` sizes
 * the CPU pool (<= 0: one per core).
 */
int backend_create(struct backend *be, const char *device, int threads, struct err *e);

/**
 * Batch-invariant mode for the whole process (vLLM's --batch-invariant): each row's result
 * is the same whatever else shares its step. On the CPU it switches the products of 9 or
 * more rows to the invariant kernels (cpu_batch_invariant_set); turning it on also sets
 * PAGODA_CUDA_BATCH_INVARIANT=1 for CUDA backends created afterwards. Call before creating
 * the backend.
 */
void backend_batch_invariant_set(int on);

/**
 * The one-shot all-reduce over peer memory for a split model's small exchanges (vLLM's custom
 * all-reduce; on by default where every pair of the group's GPUs maps each other's memory):
 * off (vLLM's --disable-custom-all-reduce), every exchange goes through NCCL. Sets
 * PAGODA_CUDA_CUSTOM_ALL_REDUCE for groups made afterwards.
 */
void backend_custom_all_reduce_set(int on);

/** Whether this build has the CUDA backend and sees at least one GPU. */
int backend_cuda_available(void);

/** The GPUs this build's CUDA backend sees (0 without it). */
int backend_gpu_count(void);

void backend_destroy(struct backend *be);

/**
 * Bytes left for the KV pool when the backend may use `util` (0, 1] of its memory and
 * `resident` bytes (weights, activations, workspaces) are taken: util * total - resident,
 * at most what is free now, 0 when nothing is left.
 */
size_t backend_kv_budget(const struct backend_info *bi, double util, size_t resident);

#endif
