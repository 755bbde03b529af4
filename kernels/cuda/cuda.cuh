/*
 * cuda kernels: the launchers behind the CUDA backend (kernels/cuda/backend.cu). All take
 * device pointers and a stream; shapes follow the backend operations of model/backend.h.
 * Activations are float32; KV rows are stored as bf16.
 */
#ifndef PAGODA_KERNELS_CUDA_CUDA_CUH
#define PAGODA_KERNELS_CUDA_CUDA_CUH

#include <cublasLt.h>

#include "kernels/cuda/common.cuh"

/* ---- matrix products (gemv.cu, gemm.cu) ---- */

/* Largest m the register-blocked matrix-vector kernels take; larger m goes to GEMM. */
#define CU_GEMV_MAX_M 8

/** Whether the fast matrix-vector kernel handles this matrix (else the generic one runs). */
bool cu_gemv_fast(const dweight &w);
/* Whether one-row products of w can take the streaming 16-bit kernel (k_gemv_stream). */
bool cu_gemv_stream_ok(const dweight &w);

/** y[i, r] (row stride ldy) = dot(W row r, x row i) for i < m <= CU_GEMV_MAX_M. */
void cu_gemv(cudaStream_t s, const dweight &w, const float *x, int m, float *y, int64_t ldy);

/* Up to 3 matrices of one format and k over the same x, in one launch; y[j] is [m, n_j].
 * pair: 2 matrices of equal n (gate, up): y[0] = act(gate) * up, y[1] = up, the activation
 * gelu as act_of's act (enum act_kind). */
struct cu_gemv_set {
    dweight w[3];
    float *y[3];
    int64_t row_end[3]; /* cumulative rows */
    int nw, pair, gelu;
    /* 1: the same summation order for every m (batch-invariant mode): no m = 1 kernel */
    int keep_order;
    /* 1: the m = 1 kernel may start while the previous kernel finishes (programmatic
     * dependent launch; it waits for that kernel's results before reading x) */
    int early;
    /* m = 1, fused neighbours (NULL: none). Prologue: x = rms_norm(nsrc) * nweight with
     * nepsilon, also written to x itself; epilogue (one matrix, no pair): resid += y. */
    const float *nsrc, *nweight;
    float nepsilon;
    float *resid;
    /* m = 1, q/k/v (nw 3): rope on q and k with the tables rcos/rsin (half of a head's
     * dimensions: rope_half; 0: none) and k, v stored as bf16 into kc, vc at slot[0] */
    int rope_half;
    const float *rcos, *rsin;
    __nv_bfloat16 *kc, *vc;
    const int32_t *slot;
    /* m = 1, one matrix of plain rows (the output head): the greedy pick of its outputs
     * (as cu_argmax) into amax_out[0] as well, through amax_slot and amax_count (zero before
     * and after); NULL: none. Only where cu_gemv_amax_ok. */
    int32_t *amax_out;
    unsigned long long *amax_slot;
    unsigned *amax_count;
};
/** Whether a one-row product of this set can pick its largest output itself. */
bool cu_gemv_amax_ok(const cu_gemv_set &g);
bool cu_gemv_set_ok(const cu_gemv_set &g);

/* The fields of matrix i of a set, for kernels: chosen by comparisons with constant indices
 * (a run-time index into the set would copy it to local memory). */
struct set_mat {
    const uint8_t *w;
    const void *scales, *biases;
    int64_t row_bytes, gpr, n;
};

static __device__ __forceinline__ set_mat set_mat_of(const dweight &w)
{
    set_mat m;
    m.w = w.w;
    m.scales = w.scales;
    m.biases = w.biases;
    m.row_bytes = w.row_bytes;
    m.gpr = w.gpr;
    m.n = w.n;
    return m;
}

static __device__ __forceinline__ set_mat set_pick(const cu_gemv_set &g, int i)
{
    if (i == 0) return set_mat_of(g.w[0]);
    if (i == 1) return set_mat_of(g.w[1]);
    return set_mat_of(g.w[2]);
}
/** Whether the tensor-core 4-bit kernel takes this set (affine 4-bit, groups of 32 or more,
 * k a multiple of 128 up to 16384, every matrix's rows a multiple of 16). */
bool cu_gemv_q4_tc_ok(const cu_gemv_set &g);
/** y = W x for m = 1 of affine 4-bit weights on tensor cores (x rounded to fp16): through
 * k_gemv_q4_stream where it takes the set, else the ring kernel where its groups and shared
 * memory allow, else k_gemv_q4_tc. */
void cu_gemv_q4_tc(cudaStream_t s, const cu_gemv_set &g, const float *x);
/* Whether one-row products of w can take the streaming 4-bit kernel (k_gemv_q4_stream:
 * affine 4-bit, groups of 32 to 128 with 16-bit scales, k a multiple of 256 up to 16384,
 * rows a multiple of 8). */
bool cu_gemv_q4s_ok(const dweight &w);
/* y = W x for m = 1 through k_gemv_q4_stream, with the set's fused norm, residual add or
 * rope and KV store; false (nothing launched) where it does not take the set. */
bool cu_gemv_q4_stream(cudaStream_t s, const cu_gemv_set &g, const float *x);
/** Once per device, before any product: lets the ring kernel and the streaming 4-bit kernel
 * have more than 48 KB of shared memory. */
void cu_gemv_tc_init(void);
void cu_gemv_multi(cudaStream_t s, const cu_gemv_set &g, const float *x, int m);

/* A cuBLASLt plan of one shape. */
struct cu_lt_plan {
    int m, n, k;
    int ob; /* 1: bf16 results (else float32) */
    int ok; /* 0: cuBLASLt has no algorithm for this shape */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

#define CU_LT_PLANS 256

struct cu_gemm_ctx {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    cu_lt_plan plans[CU_LT_PLANS];
    int n_plans, next_plan;
};

void cu_gemm_ctx_destroy(cu_gemm_ctx *g);

/** y[m, n] = x[m, k] . W^T for any m: bf16 weights through cuBLASLt (x rounded to bf16 in
 * xb, m * k values), other formats through a tensor-core kernel that dequantizes tiles.
 * accumulate: y += x . W^T instead (cuBLASLt products only: cu_gemm_lt_ok). */
void cu_gemm(cudaStream_t s, cu_gemm_ctx *g, const dweight &w, const float *x, int m, float *y,
             __nv_bfloat16 *xb, bool accumulate = false);
/** Whether cuBLASLt takes this product (bf16 weights with a plan for the shape). */
bool cu_gemm_lt_ok(cu_gemm_ctx *g, const dweight &w, int m);
/** y = xb . W^T through cuBLASLt with x already rounded into xb, on stream s with a
 * workspace of g->workspace_bytes (one per stream running products at the same time);
 * accumulate: y += xb . W^T (the product's epilogue reads y as its C operand). */
void cu_gemm_lt(cudaStream_t s, cu_gemm_ctx *g, const dweight &w, const __nv_bfloat16 *xb, int m,
                float *y, void *workspace, bool accumulate = false);
/** Whether cuBLASLt takes this product with bf16 results. */
bool cu_gemm_lt_b16_ok(cu_gemm_ctx *g, const dweight &w, int m);
/** As cu_gemm_lt, the results rounded to bf16 into y [m, n] (cuBLASLt's first choice of
 * algorithm for the shape). */
void cu_gemm_lt_b16(cudaStream_t s, cu_gemm_ctx *g, const dweight &w, const __nv_bfloat16 *xb,
                    int m, __nv_bfloat16 *y, void *workspace);

/* ---- ternary products (ternary.cu; BitNet's BitLinear, DF_TERNARY) ---- */

/** Bytes of the scratch cu_ternary takes for m rows over w: the int8 rows [m, 4 row_bytes],
 * then m int32 sums and m float scales. */
size_t cu_ternary_scratch(const dweight &w, int m);
/** y[m, n] = x[m, k] . W^T for ternary W as the CPU computes it (kernels/cpu/ternary.c, to
 * the bit): x rows quantized to int8 by absmax into scratch (quantize false: scratch already
 * holds x quantized for a matrix of the same k, by the product before), exact integer dots,
 * then dot / (row scale * t_div) * t_mul. A matrix-vector kernel for m <= CU_GEMV_MAX_M, a
 * tiled one beyond. */
void cu_ternary(cudaStream_t s, const dweight &w, const float *x, int m, float *y, void *scratch,
                float t_div, float t_mul, bool quantize);

/* ---- KV cache formats (attn_q.cu; paged_kv/kv_quant.h) ---- */

struct cu_kvq_args {
    void *kc, *vc;      /* the layer's K and V head blocks */
    const float *k, *v; /* [n_tokens, n_kv_heads, head_dim] this step's rows */
    const int32_t *slot;
    int n_tokens, n_kv_heads, head_dim, block_size, k_dtype, v_dtype;
    float k_scale, v_scale; /* fp8: a checkpoint's fixed scales, else 0 */
};
/** Writes the step's K and V rows into head blocks, each block's tokens in order. */
void cu_kv_store_q(cudaStream_t s, const cu_kvq_args &a);

struct cu_attnq_args {
    const float *q; /* [n_tokens, n_heads, head_dim] */
    float *out;     /* [n_tokens, n_heads, head_dim] */
    const void *k, *v;
    const int32_t *pos, *tok_seq, *block_table;
    int n_tokens, n_heads, n_kv_heads, head_dim, block_size, max_blocks, k_dtype, v_dtype, window;
    float scale, softcap;
    /* splits > 0: the tensor-core kernel (cu_attnq_fast_ok), each token's keys in that many
     * ranges; with more than one, partial results in part [n_tokens, n_heads, splits, D + 2]
     * merged after. 0: the reference kernel. */
    int splits;
    float *part;
};
/** Attention of every token of the step over head blocks, the codes read in place. */
void cu_attention_q(cudaStream_t s, const cu_attnq_args &a);
/** Whether the tensor-core kernel takes these formats and shapes. */
bool cu_attnq_fast_ok(int k_dtype, int v_dtype, int head_dim, int group, int block_size);
/** Allows the tensor-core kernel its shared memory (before any launch or capture). */
void cu_attention_q_init(void);
/** Key ranges per token for the tensor-core kernel: enough warps to fill the GPU. */
int cu_attnq_splits(int n_tokens, int n_kv_heads, int max_keys, int sms);

/* ---- attention (attention.cu) ---- */

struct cu_attn_args {
    const float *q;             /* [n_tokens, n_heads, D] */
    float *out;                 /* [n_tokens, n_heads, D]; NULL: not written (decode path) */
    __nv_bfloat16 *outb;        /* decode path: out as bf16 as well, unless NULL */
    const __nv_bfloat16 *k, *v; /* [n_blocks, block_size, n_kv_heads, D] */
    const int32_t *pos, *tok_seq, *seq_len, *block_table;
    int n_tokens, n_heads, n_kv_heads, head_dim, block_size, max_blocks;
    float scale, softcap;
    int window;
    int splits;    /* key ranges per (token, kv head); partials combined after */
    int key_chunk; /* > 0: ranges of this many keys (batch-invariant), else keys / splits */
    float *part;   /* [n_tokens, n_heads, splits, D + 2] when splits > 1 */
    /* Tensor-core path (n_tiles > 0): tile i covers query rows [tile_row[i], + 64) of
     * sequence tile_seq[i], a sequence's rows being its tokens times the query heads of
     * one KV head (row r: token q_start[s] + r / group, head r % group of the group). */
    int n_tiles;
    const int32_t *tile_seq, *tile_row, *q_start;
    /* Decode path (decode = 1): every token is its sequence's only one; a block per token,
     * KV head and range of keys (splits of them), the range's keys split among its warps
     * (k_attention_dec); with several ranges, the last block of a token and KV head to finish
     * merges them, counted in sem ([n_tokens, n_kv_heads], zero between launches). With
     * decode = 2, a warp per token and KV head, all of its keys (k_attention_decw). */
    int decode;
    int *sem;
    int early; /* launched early (programmatic dependent launch) */
    /* decode = 1 with 2 to CU_ATTN_CLUSTER_MAX ranges: a token and KV head's ranges run as
     * one thread-block cluster and merge through distributed shared memory (no sem) */
    int cluster;
};

/* The most ranges the decode kernel merges within a cluster (the portable cluster size). */
#define CU_ATTN_CLUSTER_MAX 8

/* The largest head size attention runs (any even one up to it, on CUDA cores). */
#define CU_ATTN_MAX_D 512
/** Whether attention runs this shape: an even head_dim up to CU_ATTN_MAX_D, n_heads (up to
 * 65535, the grid's y limit) a multiple of n_kv_heads. */
bool cu_attn_ok(int head_dim, int n_heads, int n_kv_heads);
struct err;
/** backend_ops.attn_check: cu_attn_ok, or -1 with a message naming the supported shapes.
 * It reads no device state (ctx unused), so tests call it without a GPU. */
extern "C" int cu_attn_check(void *ctx, int head_dim, int n_heads, int n_kv_heads, struct err *e);

/* Query rows per block of the tensor-core attention kernel. */
#define CU_ATTN_TC_ROWS 64
/** Whether the tensor-core attention kernel takes this head size (64, 128, 256). */
bool cu_attn_tc_ok(int head_dim);
/** Whether the tensor-core decode attention kernels take this head size (64, 128) and GQA
 * group (up to 16). */
bool cu_attn_dec_ok(int head_dim, int group);
/* The longest context a decode step takes to k_attention_decw whatever the others' (a
 * pair's keys are one warp's work; longer ones when the mean is over half of it). */
#define CU_ATTN_DECW_KEYS 1024
/** Once per device, before any attention launch. */
void cu_attention_init(void);

/* Keys per attention range in batch-invariant mode. */
#define CU_ATTN_FIXED_KEYS 64

void cu_kv_store(cudaStream_t s, __nv_bfloat16 *kc, __nv_bfloat16 *vc, const float *k,
                 const float *v, const int32_t *slot, int n_tokens, int row);
void cu_attention(cudaStream_t s, const cu_attn_args &a);
/** out [rows, D] = the key ranges' partial results part [rows, splits, D + 2] (O unscaled,
 * then the range's maximum in natural log, -inf for an empty range, and its sum) merged; a
 * block a row. Also launched by attn_q.cu. */
__global__ void k_attn_merge(float *out, const float *__restrict__ part, int splits, int D);
/** Splits that fill the GPU for a step of n_tokens over up to max_keys keys. */
int cu_attn_splits(int n_tokens, int n_kv_heads, int max_keys, int sms);
/** Key ranges per token and KV head of the decode kernel: up to one block an SM, each range
 * at least one round of the block's warps. */
int cu_attn_dec_splits(int n_tokens, int n_kv_heads, int max_keys, int sms);

/* ---- element-wise and row-wise (ops.cu) ---- */

/* A step's rope tables: cos_t[t][i] = cos((float)pos[t] * inv[i]) * mscale, sin_t alike, for
 * i < half. */
struct cu_rope_tab {
    float *cos_t, *sin_t;
    const float *inv;
    const int32_t *pos;
    int half;
    float mscale;
};
/** The rope tables of n tokens. */
void cu_rope_tables(cudaStream_t s, const cu_rope_tab &rt, int n);
/** out[t] = table[id] * scale, id = picks[pick_rows[t]] where pick_rows (NULL: none) is >= 0,
 * else tokens[t]; with rt (NULL: none), the rope tables of the n tokens in the same launch. */
void cu_embed(cudaStream_t s, float *out, const dweight &table, const int32_t *tokens,
              const int32_t *pick_rows, const int32_t *picks, int n, float scale,
              const cu_rope_tab *rt = NULL);
/** out = rms_norm(x) * w over rows of dim; also as bf16 into ob unless it is NULL (out NULL:
 * the bf16 copy alone). */
void cu_rms_norm(cudaStream_t s, float *out, const float *x, const float *w, int rows, int dim,
                 float eps, __nv_bfloat16 *ob);
void cu_rope(cudaStream_t s, float *x, int rows, int heads, int d, const float *cos_t,
             const float *sin_t);
/** Rope on q [n, hq, d] and k [n, hkv, d] in place, then k and v stored at slot[t] of
 * the bf16 caches: the three operations in one launch. With src (rows of (hq + 2 hkv) d:
 * q, k and v of a token side by side) q, k and v are read from src and written to q, k
 * and v (the split of a product of the three matrices at once, in the same launch). */
void cu_rope_kv(cudaStream_t s, float *q, float *k, float *v, const float *src, __nv_bfloat16 *kc,
                __nv_bfloat16 *vc, const int32_t *slot, int n_tokens, int hq, int hkv, int d,
                const float *cos_t, const float *sin_t);
/** out = act(gate) * up (act: enum act_kind, as act_of); also as bf16 into ob unless it is
 * NULL (out NULL: the bf16 copy alone). */
void cu_act_mul(cudaStream_t s, float *out, const float *gate, const float *up, int64_t n, int act,
                __nv_bfloat16 *ob);
/** ob = act(gate) * up in bf16, from gate and up in bf16 (n a multiple of 4, 8-byte
 * aligned). */
void cu_act_mul_b16(cudaStream_t s, __nv_bfloat16 *ob, const __nv_bfloat16 *gate,
                    const __nv_bfloat16 *up, int64_t n, int act);
void cu_add(cudaStream_t s, float *x, const float *y, int64_t n);
/** x += y, then out = rms_norm(x) * w, over rows of dim (out may be y); also as bf16 into ob
 * unless it is NULL (out NULL: the bf16 copy alone). */
void cu_add_rms_norm(cudaStream_t s, float *out, float *x, const float *y, const float *w, int rows,
                     int dim, float eps, __nv_bfloat16 *ob);
void cu_add_bias(cudaStream_t s, float *y, const float *bias, int m, int n);
void cu_softcap(cudaStream_t s, float *x, int64_t n, float cap);
void cu_gather_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows, int n,
                    int dim);
void cu_to_bf16(cudaStream_t s, __nv_bfloat16 *dst, const float *src, int64_t n);
/** The columns of src [m, n0 + n1 + n2] as y0 [m, n0], y1 [m, n1], y2 [m, n2] (n_i % 4 == 0,
 * 16-byte aligned buffers). */
void cu_split3(cudaStream_t s, const float *src, int m, int n0, int n1, int n2, float *y0,
               float *y1, float *y2);
/** out[i] = index of the largest of row i (the first on ties) for rows of n floats. */
/** out[r] = the index of row r's largest value (the lowest among equals); with split > 1,
 * split blocks a row, through slot[rows] and count[rows], zero before and after. */
void cu_argmax(cudaStream_t s, int32_t *out, const float *x, int rows, int n, int split,
               unsigned long long *slot, unsigned *count, bool early);

/* ---- the hybrid and MoE families (hybrid.cu, moe.cu) ---- */

/** Partial rotary on x [rows, heads, d]: pairs (j, j + rot/2), j < rot/2, of each head;
 * cos_t/sin_t [rows, rot/2]. */
void cu_rope_partial(cudaStream_t s, float *x, int rows, int heads, int d, int rot,
                     const float *cos_t, const float *sin_t);
/** qg [rows, heads, 2 d] (each head's query, then its gate) into q and gate [rows, heads, d]. */
void cu_split_qgate(cudaStream_t s, float *q, float *gate, const float *qg, int rows, int heads,
                    int d);
/** x [rows, n] *= sigmoid(g), g [rows, gn], gn = n (element-wise) or 1 (one gate a row). */
void cu_gate_mul(cudaStream_t s, float *x, const float *g, int rows, int n, int gn);
/** x[0, n) *= sc (Gemma 4's layer scalars). */
void cu_scale(cudaStream_t s, float *x, int64_t n, float sc);
/** out[r] = rms_norm(x[r]) * w * silu(z[r]) over rows of dim (out may be x). */
void cu_rms_norm_gated(cudaStream_t s, float *out, const float *x, const float *z, const float *w,
                       int rows, int dim, float eps);
/** dst = src, bytes of device memory, as a kernel (a node like the others in a graph). */
void cu_copy(cudaStream_t s, void *dst, const void *src, size_t bytes);

/* A Gated DeltaNet layer over a step (backend_ops.delta_net); the per-step values (token
 * ranges, positions, state slots) are device buffers that batch_begin fills. */
struct cu_delta_args {
    float *out;                   /* [n_tokens, n_v_heads * v_dim] */
    float *qkv;                   /* [n_tokens, conv_dim]: q, k (n_k_heads * k_dim each), v */
    const float *beta, *a;        /* [n_tokens, n_v_heads] */
    float *conv;                  /* [slots][conv_k - 1][conv_dim] */
    float *rec;                   /* [slots][n_v_heads][k_dim][v_dim] */
    const float *conv_w;          /* [conv_dim][conv_k] */
    const float *a_log, *dt_bias; /* [n_v_heads] */
    const int32_t *q_start, *pos, *state_slot; /* [n_seqs + 1], [n_tokens], [n_seqs] */
    int n_tokens, n_seqs, n_k_heads, n_v_heads, k_dim, v_dim, conv_k;
};
/** The causal convolution (in place on qkv, SiLU, each sequence's tail continued and left in
 * its slot), then the delta rule per (sequence, value head) over the sequence's tokens. */
void cu_delta_net(cudaStream_t s, const cu_delta_args &d);

/* Rows a launch of the experts takes at most: longer steps run in chunks of this many rows
 * (the scratch holds a result row of each expert's products per chunk row). */
#define CU_MOE_CHUNK 1024

/* Routed experts (backend_ops.moe) over rows of x. */
struct cu_moe_args {
    float *out;              /* [rows, hidden] */
    const float *x, *router; /* [rows, hidden], [rows, n_experts] */
    /* the experts' matrices, device arrays [n_experts]: gate and up [inner, hidden], down
     * [hidden, inner] */
    const dweight *gate, *up, *down;
    /* expert 0's gate and down; uniform_gu: every expert's gate and up laid out as ex_gu,
     * uniform_down: every down as ex_down. Where uniform, the products decode whole units with
     * the format's templates; else element by element, each expert as its descriptor says. */
    dweight ex_gu, ex_down;
    int uniform_gu, uniform_down;
    int rows, hidden, inner, n_experts, top_k, norm_topk, gelu;
    const float *expert_scale; /* [n_experts] multiplies a chosen expert's weight after the
                                  renormalization (Gemma 4), else NULL */
    /* 0: a matrix-vector product per (row, chosen expert) entry, the down products adding
     * each row's entries in expert order; 1: entries grouped by expert, then a warp per
     * output row streaming it for 8 of the expert's entries at a time when they are few an
     * expert, else tiles of 64 on tensor cores (x rounded to bf16); a last launch adds each
     * row's */
    int grouped;
    /* batch-invariant mode: every entry's result as the per-entry products compute it (the
     * grouped rows streamed, never the tiles) */
    int exact;
    /* scratch of cu_moe_scratch_bytes(CU_MOE_CHUNK rows at most), carved by cu_moe_carve */
    int32_t *sel;   /* [rows * top_k] entry r * top_k + j: row r's j-th expert by id */
    float *wt;      /* [rows * top_k] the entry's weight */
    int32_t *list;  /* [rows * top_k] grouped: entries, expert after expert */
    int32_t *start; /* [n_experts + 1] grouped: each expert's first position in list */
    int32_t *tile0; /* [n_experts + 1] grouped: each expert's first tile of 64 positions */
    float *h;       /* [rows * top_k, inner] act(gate x) * up x, by entry (grouped: by position) */
    float *y;       /* [rows * top_k, hidden] grouped: each entry's expert output */
};
/** Whether grouped rows (a chunk of them) take the streamed per-expert products rather than
 * the tiles on tensor cores. */
bool cu_moe_streamed(const cu_moe_args &a);
/** Bytes of scratch for rows (at most CU_MOE_CHUNK) of a layer's shape. */
size_t cu_moe_scratch_bytes(int rows, int top_k, int n_experts, int inner, int hidden);
/** Points a's scratch fields into ws (cu_moe_scratch_bytes of a's shape). */
void cu_moe_carve(cu_moe_args *a, void *ws);
/** Routing (softmax, top_k with ties to the lower index, renormalized when norm_topk), the
 * chosen experts' products and each row's sum of them in expert order; rows beyond
 * CU_MOE_CHUNK in chunks. */
void cu_moe(cudaStream_t s, const cu_moe_args &a);

/* ---- sampling (sample.cu) ---- */

struct sample_row;
/** out[i] = the token sampled from row i under p[i] (device memory; backend_ops.sample). */
void cu_sample(cudaStream_t s, int32_t *out, const float *x, int rows, int n, const sample_row *p);

/** Kernel timeline to a CSV file (PAGODA_CUDA_KTRACE; ktrace.cu): start at backend creation,
 * written at its end. */
void cu_ktrace_start(const char *path);
void cu_ktrace_stop(void);

/* ---- the copy engine of the host-memory KV tier (copy.cu) ---- */

/* A stream beside the step's stream for copies between KV blocks and mapped pinned host
 * memory, batched into gather/scatter kernels, with a ring of events as tickets
 * (backend_ops.copy_blocks and the rest). */
struct cu_copier;
cu_copier *cu_copier_create(void);
void cu_copier_destroy(cu_copier *k);
/** host [bytes] (mapped pinned memory) may hold block images. */
void cu_copier_map(cu_copier *k, void *host, size_t bytes);
/** Forgets host; returns the mapped areas left. */
int cu_copier_unmap(cu_copier *k, void *host);
/** The pieces of a unit of `kind` (0: KV blocks, 1: state slots): segment s of unit b is
 * base[s] + bytes[s] * b; its host image is the segments one after another. */
void cu_copier_setup(cu_copier *k, int kind, int n_seg, void *const *base, const size_t *bytes);
/** Queues a copy of unit `block` of `kind` to (to_host) or from its image at host. */
void cu_copier_block(cu_copier *k, cudaStream_t step, int kind, int32_t block, void *host,
                     int to_host);
/** Launches the blocks queued, after the work queued on step so far. */
void cu_copier_flush(cu_copier *k, cudaStream_t step);
/** A ticket completed once every copy queued so far has (flushes; waits only when
 * CU_COPY_TICKETS tickets are outstanding). */
uint64_t cu_copier_mark(cu_copier *k, cudaStream_t step);
int cu_copier_done(cu_copier *k, uint64_t t);
/** The work queued on step from now on waits for every copy queued so far (flushes). */
void cu_copier_fence(cu_copier *k, cudaStream_t step);
/** Device seconds of the copy launches completed so far, down and up. */
void cu_copier_seconds(cu_copier *k, double *out_s, double *in_s);

/* ---- tensor-parallel groups (group.cu, through NCCL loaded at run time) ---- */

/** One NCCL communicator per GPU of devs[0..n) into comms; 0, or -1 with msg (NCCL missing,
 * its error). */
int cu_group_init(void **comms, int n, const int *devs, char *msg, size_t msg_n);
void cu_group_leave(void *comm);
/** x [n] = its sum over the group (float32). */
void cu_all_reduce(cudaStream_t s, void *comm, float *x, int64_t n);
/** out [rows, size * cols] = every rank's in [rows, cols] side by side (scratch: rows * cols *
 * size floats). */
void cu_all_gather(cudaStream_t s, void *comm, float *out, const float *in, float *scratch,
                   int size, int rows, int cols);

/* The one-shot all-reduce over peer memory (group.cu): sums of at most AR_MAX_FLOATS floats,
 * in AR_BLOCKS blocks of AR_THREADS threads. */
#define AR_BLOCKS     32 /* AR_BLOCKS * AR_MAX_RANKS <= AR_THREADS */
#define AR_THREADS    512
#define AR_MAX_RANKS  8
#define AR_MAX_FLOATS (256 * 1024)

/* What one rank's kernel sees: every rank's receive buffer (two halves of one slot of
 * AR_MAX_FLOATS a rank) and flags ([AR_BLOCKS][AR_MAX_RANKS]: slot [b][r] raised by block b
 * of rank r), and this rank's call counts (one a block). */
struct cu_ar_peers {
    float *buf[AR_MAX_RANKS];
    unsigned *sig[AR_MAX_RANKS];
    unsigned *count;
};
struct cu_ar;

/** The exchange over devs[0..n) with peer access enabled between all of them; NULL with why
 * when a pair cannot map each other's memory. */
cu_ar *cu_ar_create(int n, const int *devs, char *why, size_t why_n);
const cu_ar_peers *cu_ar_rank(cu_ar *a, int rank);
/** Frees rank's buffers; rank 0, the last to leave, frees a. */
void cu_ar_leave(cu_ar *a, int rank);
/** Whether a sum of n floats over these buffers runs here (size, float4 alignment). */
bool cu_ar_fits(int64_t n, const void *y, const void *x, const void *out, const void *w,
                const void *ob);
/** Without x: y [n] = its sum over the group. With x (n = rows * dim): x += the sum of y,
 * then out = rms_norm(x) * w and its bf16 copy ob (either may be NULL); y is left as it
 * was or, where out is y, overwritten. */
void cu_ar_run(cudaStream_t s, const cu_ar_peers *P, int rank, int size, float *y, float *x,
               float *out, const float *w, __nv_bfloat16 *ob, int rows, int dim, int64_t n,
               float eps);

#endif
