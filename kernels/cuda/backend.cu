/*
 * The CUDA backend: the operations of model/backend.h on one GPU.
 *
 * Weights are copied to device memory as stored and decoded in registers by the kernels.
 * Activations are float32; KV rows are bf16. Step metadata (tokens, positions, slots,
 * block tables, logit rows) is uploaded once per step by batch_begin into fixed device
 * buffers that the kernels read.
 *
 * Operations are recorded on a tape and run when a result is needed (download, argmax,
 * upload, free, the next batch_begin). A decode step (at most CU_GRAPH_MAX_TOKENS tokens)
 * runs as a CUDA graph: the tape of a step is captured once and replayed whenever a later
 * step records the same tape (same operations on the same buffers and shapes; the values
 * that change per step live in the metadata buffers), so a step costs one graph launch.
 */
#include <assert.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/util.h"
#include "model/backend.h"
#include "paged_kv/kv_quant.h"
int backend_cuda_create(struct backend *be, int device, struct err *e);
int backend_cuda_device_count(void);
}

#include "kernels/cuda/cuda.cuh"

#define CU_GRAPH_MAX_TOKENS 512
#define CU_GRAPHS           16
#define CU_TRACE_STEPS      8192 /* replayed steps whose device times PAGODA_CUDA_TRACE keeps */
#define CU_WORKSPACE        (32u << 20)
#define CU_TILE_TABLES      4

void cu_fatal(const char *what, const char *msg, const char *file, int line)
{
    fprintf(stderr, "pagoda: CUDA error at %s:%d: %s: %s\n", file, line, what, msg);
    abort();
}

enum opk {
    OP_EMBED,
    OP_MATMUL,
    OP_BIAS,
    OP_RMS,
    OP_ROPE,
    OP_KV_STORE,
    OP_ATTN,
    OP_ACT,
    OP_ADD,
    OP_SOFTCAP,
    OP_GATHER,
    OP_ARGMAX,
    OP_GEMV,    /* m <= CU_GEMV_MAX_M: one or more matrices over the same x, maybe paired */
    OP_ADD_RMS, /* add followed by rms_norm of the sum */
    OP_ROPE_KV, /* rope of q, rope of k, kv_store of k and v */
    OP_SAMPLE,
    OP_GEMM_SET, /* 2 or 3 cuBLASLt products over one x, run on as many streams at once */
    OP_ROPE_TAB, /* the step's rope tables (also done by an embed op: its rope fields) */
    /* the hybrid and MoE families (hybrid.cu, moe.cu) */
    OP_ROPE_PART,
    OP_SPLIT_QG,
    OP_GATE_MUL,
    OP_RMS_GATED,
    OP_DELTA, /* its arguments in dn */
    OP_MOE,   /* its arguments in me */
    OP_COPY,
    OP_SCALE,
    OP_KV_STORE_Q, /* a layer in a KV cache format (attn_q.cu): its arguments in kq */
    OP_ATTN_Q,     /* its arguments in aq */
    /* a tensor-parallel group's collectives (group.cu) */
    OP_ALL_REDUCE,
    OP_ALL_GATHER,
    /* a product of ternary weights (ternary.cu): y p[0], x p[1], m i[0], i[1] 1: x already
     * quantized in tq by the product before; t_div, t_mul in f[0], f[1]. No other operation
     * fuses with it. */
    OP_TERNARY,
};

static const char *const op_names[] = {
    "embed",        "gemm",         "add_bias",      "rms_norm",       "rope",        "kv_store",
    "attention",    "act_mul",      "add",           "softcap",        "gather_rows", "argmax",
    "gemv",         "add+rms_norm", "rope+kv_store", "sample",         "gemm set",    "rope tables",
    "rope_partial", "split_qgate",  "gate_mul",      "rms_norm_gated", "delta_net",   "moe",
    "copy",         "scale",        "kv_store_q",    "attention_q",    "all_reduce",  "all_gather",
    "ternary"};

/* Flags of an OP_GEMM_SET in i[3]: the rope + KV store launch after the fused set reads
 * its columns (no split); the set's results are bf16. */
#define SET_NO_SPLIT 1
#define SET_BF16     2

/* One recorded operation. Zeroed before filling so that tapes compare with memcmp. */
struct op {
    int kind;
    int i[4];
    int64_t n;
    float f[2];
    const void *p[8];
    dweight w;
    cu_attn_args att;
    cu_gemv_set gs;
    union {
        cu_delta_args dn; /* OP_DELTA */
        cu_moe_args me;   /* OP_MOE */
        cu_kvq_args kq;   /* OP_KV_STORE_Q */
        cu_attnq_args aq; /* OP_ATTN_Q */
    };
};

/* Per-operation device time, when PAGODA_CUDA_PROFILE=1 (operations run eagerly). */
struct prof_ent {
    char name[64];
    double ms;
    long calls;
};
#define PROF_MAX 96

struct graph_entry {
    op *ops;
    int n_ops;
    uint64_t gen, last_use;
    cudaGraphExec_t exec;
};

struct cu_ctx {
    int dev;
    cudaStream_t st;
    cudaDeviceProp prop;
    cu_gemm_ctx g;

    /* step metadata: one device buffer and its pinned staging copy */
    int32_t *d_meta, *h_meta;
    size_t cap_tok, cap_seq, cap_bt; /* capacities (elements) */
    int32_t *d_tokens, *d_pos, *d_slot, *d_tok_seq, *d_logit_rows, *d_pick_rows, *d_seq_len,
        *d_q_start, *d_state_slot, *d_bt;
    /* recorded after a step's copies from the staging buffers (h_meta, h_tiles), before its
     * operations: the next step refills them once it has passed, without waiting for the
     * step itself */
    cudaEvent_t staged;
    const int32_t *h_logit_rows; /* the host array of the current batch */
    int n_tokens, n_seqs, max_blocks, n_logits;
    int graph_step;
    /* Query-row tiles of the tensor-core attention kernel, one table per GQA group size
     * seen in the step (computed when an attention operation is recorded). */
    int32_t *d_tiles, *h_tiles;
    size_t tiles_cap; /* int32 per table */
    int tile_group[CU_TILE_TABLES], tile_n[CU_TILE_TABLES], n_tile_tables;
    /* PAGODA_CUDA_ATTN, a debugging override: unset (auto, the default) tensor cores for
     * steps with prompt tokens or >= 64 tokens (the decode kernel when every token is its
     * sequence's only one) where the head size allows, simt the float32 kernel for every
     * step, tc the 64-row tile kernel for every step whose head size it takes */
    int attn_mode; /* 0 auto, 1 simt, 2 tc */
    /* the decode kernel's 2 to CU_ATTN_CLUSTER_MAX key ranges merged in a cluster (compute
     * capability 9.0 on; more ranges, or older GPUs: by the last range through global memory) */
    int dec_cluster;

    /* scratch */
    __nv_bfloat16 *xb;
    size_t xb_cap;
    float *part;
    size_t part_cap;
    int *sem; /* counters of the decode attention's key ranges (zero between launches) */
    size_t sem_cap;
    int32_t *d_small; /* ad-hoc gather rows */
    size_t small_cap;
    /* One allocation of pick_cap rows: the split argmax's per-row slots and counts (zero
     * between launches), then the picked token ids (argmax, sample) of the last step, where
     * the next step's embedding reads them; those are copied to the pinned slots h_pick
     * (pick_cap rows each), which picks() reads, the oldest first. */
    unsigned long long *d_amax_slot;
    unsigned *d_amax_count;
    int32_t *d_pick;
    int pick_cap;
    struct backend_ops ops; /* cuda_ops with this backend's switches applied */
    int32_t *h_pick[2];
    cudaEvent_t pick_done[2];
    int pick_n[2], pick_first, pick_pending;
    struct sample_row *d_sample; /* sampling parameters of the rows being sampled */
    size_t sample_cap;
    /* routed experts: a device table of each MoE layer's expert descriptors, built on the
     * layer's first use (found by its gate array), and the scratch of cu_moe */
    struct moe_table *moe_tabs;
    int n_moe_tabs;
    void *moe_ws;
    size_t moe_ws_cap;

    uint64_t gen; /* bumped when any buffer a tape points to moves */
    op *tape;
    int n_ops, cap_ops;
    graph_entry graphs[CU_GRAPHS];
    uint64_t clock;
    int graphs_on;
    int fuse; /* merge neighbouring operations (PAGODA_CUDA_FUSE=0: off) */
    /* PAGODA_CUDA_BATCH_INVARIANT=1: a row's result does not depend on the batch: every
     * product through the matrix-vector kernels (8 rows per launch), attention key ranges
     * of a fixed width. Slower for large batches; for reproducible serving and tests. */
    int invariant;
    /* kernels launched early, their blocks starting while the kernel before them ends
     * (programmatic dependent launch; compute capability 9.0 and later) */
    int early_launch;
    /* 1: the bf16 matrices of a q/k/v set could not be moved next to each other; their
     * products then run apart */
    int fuse_failed;
    float *ycat;
    size_t ycat_cap;
    void *tq; /* ternary products' int8 rows, sums and scales (cu_ternary_scratch) */
    size_t tq_cap;
    cudaStream_t side[2];
    cudaEvent_t fork, join[2];
    void *side_ws[2];

    /* profiling */
    int trace; /* PAGODA_CUDA_TRACE=1: graph captures and replays, reported at exit */
    long n_captures, n_replays, n_eager;
    double capture_ms;
    /* with trace, the host's time around replayed steps (ms): from the step's start to its
     * flush (recording, uploads), the graph lookup (with the dead-result pass), the launch
     * call, waiting for the step's tokens, and the caller's time from the tokens to the
     * next step's start */
    double t_begin, t_tokens, h_record, h_find, h_launch, h_wait, h_caller;
    long h_replays, h_steps;
    /* with trace, the device's time of replayed steps: events around each graph (a ring by
     * replay number), read once a step's picks are in; per step, the graph's time and the
     * time since the previous graph ended (its picks' copy, this step's copies, the
     * launch), in µs */
    cudaEvent_t g_start[4], g_end[4];
    long g_seq, g_flush[4], n_flush, pick_graph[2];
    float *g_span, *g_gap;
    int n_g;
    int prof; /* PAGODA_CUDA_PROFILE: 1 every flush, 2 decode steps, 3 prefill steps */
    /* steps of the profiled kind begun so far: the first is a warm-up (module loading,
     * cuBLASLt plans, graph captures) and none of its flushes is profiled */
    long prof_seen;
    cudaEvent_t *ev;
    int ev_cap;
    prof_ent pe[PROF_MAX];
    int n_pe;
    double prof_wall, prof_kernels;
    long prof_steps;

    /* weights: device descriptors and allocations */
    dweight **wdesc;
    void **walloc;
    int n_w, cap_w;
    size_t weight_bytes;

    /* the host-memory KV tier's copy stream (copy.cu), made by the first host_alloc */
    cu_copier *copier;

    /* a tensor-parallel group (model/tp.h): this GPU's NCCL communicator (NULL: none), its
     * rank of grp_size, and the all-gather's landing buffer */
    void *comm;
    int grp_rank, grp_size;
    float *gath;
    size_t gath_cap;
    /* the group's one-shot all-reduce (group.cu; NULL: NCCL's alone) and this rank's view */
    cu_ar *ar;
    const cu_ar_peers *arp;
};

/* ---- tape execution ---- */

static void exec_op(cu_ctx *c, const op *o)
{
    cudaStream_t s = c->st;
    switch (o->kind) {
    case OP_EMBED:
    case OP_ROPE_TAB: {
        cu_rope_tab rt = {(float *)o->p[4], (float *)o->p[5], (const float *)o->p[6],
                          c->d_pos,         o->i[1],          o->f[1]};
        if (o->kind == OP_ROPE_TAB)
            cu_rope_tables(s, rt, o->i[0]);
        else
            cu_embed(s, (float *)o->p[0], o->w, (const int32_t *)o->p[1], (const int32_t *)o->p[2],
                     (const int32_t *)o->p[3], o->i[0], o->f[0], o->p[4] ? &rt : NULL);
        break;
    }
    case OP_MATMUL: {
        int m = o->i[0];
        if (m <= 0) break;
        if ((m <= CU_GEMV_MAX_M && !o->i[2]) || c->invariant)
            for (int i0 = 0; i0 < m; i0 += CU_GEMV_MAX_M)
                cu_gemv(s, o->w, (const float *)o->p[1] + (int64_t)i0 * o->w.k,
                        m - i0 < CU_GEMV_MAX_M ? m - i0 : CU_GEMV_MAX_M,
                        (float *)o->p[0] + (int64_t)i0 * o->w.n, o->w.n);
        else if (o->i[1]) /* the operation before left x in bf16 in xb */
            cu_gemm_lt(s, &c->g, o->w, c->xb, m, (float *)o->p[0], c->g.workspace, o->i[3]);
        else
            cu_gemm(s, &c->g, o->w, (const float *)o->p[1], m, (float *)o->p[0], c->xb, o->i[3]);
        break;
    }
    case OP_BIAS:
        cu_add_bias(s, (float *)o->p[0], (const float *)o->p[1], o->i[0], o->i[1]);
        break;
    case OP_RMS:
        cu_rms_norm(s, (float *)o->p[0], (const float *)o->p[1], (const float *)o->p[2], o->i[0],
                    o->i[1], o->f[0], (__nv_bfloat16 *)o->p[4]);
        break;
    case OP_ROPE:
        cu_rope(s, (float *)o->p[0], o->i[0], o->i[1], o->i[2], (const float *)o->p[1],
                (const float *)o->p[2]);
        break;
    case OP_KV_STORE:
        cu_kv_store(s, (__nv_bfloat16 *)o->p[0], (__nv_bfloat16 *)o->p[1], (const float *)o->p[2],
                    (const float *)o->p[3], c->d_slot, o->i[0], o->i[1]);
        break;
    case OP_ATTN:
        cu_attention(s, o->att);
        break;
    case OP_KV_STORE_Q:
        cu_kv_store_q(s, o->kq);
        break;
    case OP_ATTN_Q:
        cu_attention_q(s, o->aq);
        break;
    case OP_ACT:
        if (o->i[1]) /* gate and up in bf16 */
            cu_act_mul_b16(s, (__nv_bfloat16 *)o->p[3], (const __nv_bfloat16 *)o->p[1],
                           (const __nv_bfloat16 *)o->p[2], o->n, o->i[0]);
        else
            cu_act_mul(s, (float *)o->p[0], (const float *)o->p[1], (const float *)o->p[2], o->n,
                       o->i[0], (__nv_bfloat16 *)o->p[3]);
        break;
    case OP_ADD:
        cu_add(s, (float *)o->p[0], (const float *)o->p[1], o->n);
        break;
    case OP_SOFTCAP:
        cu_softcap(s, (float *)o->p[0], o->n, o->f[0]);
        break;
    case OP_GATHER:
        cu_gather_rows(s, (float *)o->p[0], (const float *)o->p[1], (const int32_t *)o->p[2],
                       o->i[0], o->i[1]);
        break;
    case OP_ARGMAX:
        cu_argmax(s, (int32_t *)o->p[0], (const float *)o->p[1], o->i[0], o->i[1], o->i[2],
                  (unsigned long long *)o->p[3], (unsigned *)o->p[4], c->early_launch);
        break;
    case OP_GEMV: {
        /* More than CU_GEMV_MAX_M rows only in batch-invariant mode: 8 rows per launch. */
        int m = o->i[0];
        for (int i0 = 0; i0 < m; i0 += CU_GEMV_MAX_M) {
            cu_gemv_set g = o->gs;
            for (int j = 0; j < g.nw; j++) g.y[j] += (int64_t)i0 * g.w[j].n;
            cu_gemv_multi(s, g, (const float *)o->p[1] + (int64_t)i0 * g.w[0].k,
                          m - i0 < CU_GEMV_MAX_M ? m - i0 : CU_GEMV_MAX_M);
        }
        break;
    }
    case OP_ROPE_KV:
        cu_rope_kv(s, (float *)o->p[4], (float *)o->p[5], (float *)o->p[2], (const float *)o->p[7],
                   (__nv_bfloat16 *)o->p[0], (__nv_bfloat16 *)o->p[1], c->d_slot, o->i[0], o->i[1],
                   o->i[2], o->i[3], (const float *)o->p[6], (const float *)o->p[3]);
        break;
    case OP_SAMPLE:
        cu_sample(s, (int32_t *)o->p[0], (const float *)o->p[1], o->i[0], o->i[1],
                  (const sample_row *)o->p[2]);
        break;
    case OP_GEMM_SET: {
        const int m = o->i[0], nw = o->gs.nw;
        if (!o->i[2]) /* else the operation before wrote xb */
            cu_to_bf16(s, c->xb, (const float *)o->p[1], (int64_t)m * o->gs.w[0].k);
        if (o->i[1]) { /* fused: one product into p[2], then its columns apart */
            dweight cat = o->gs.w[0];
            cat.n = o->gs.w[0].n + o->gs.w[1].n + o->gs.w[2].n;
            cu_gemm_lt(s, &c->g, cat, c->xb, m, (float *)o->p[2], c->g.workspace);
            if (!(o->i[3] & SET_NO_SPLIT)) /* else the rope + KV store after it splits them */
                cu_split3(s, (const float *)o->p[2], m, (int)o->gs.w[0].n, (int)o->gs.w[1].n,
                          (int)o->gs.w[2].n, o->gs.y[0], o->gs.y[1], o->gs.y[2]);
            break;
        }
        CU(cudaEventRecord(c->fork, s));
        for (int j = 1; j < nw; j++) CU(cudaStreamWaitEvent(c->side[j - 1], c->fork, 0));
        for (int j = 0; j < nw; j++) {
            cudaStream_t sj = j ? c->side[j - 1] : s;
            void *ws = j ? c->side_ws[j - 1] : c->g.workspace;
            if (o->i[3] & SET_BF16)
                cu_gemm_lt_b16(sj, &c->g, o->gs.w[j], c->xb, m, (__nv_bfloat16 *)o->gs.y[j], ws);
            else
                cu_gemm_lt(sj, &c->g, o->gs.w[j], c->xb, m, o->gs.y[j], ws);
        }
        for (int j = 1; j < nw; j++) {
            CU(cudaEventRecord(c->join[j - 1], c->side[j - 1]));
            CU(cudaStreamWaitEvent(s, c->join[j - 1], 0));
        }
        break;
    }
    case OP_ADD_RMS:
        if (o->i[2]) /* the group's sum of y first, in the same kernel */
            cu_ar_run(s, c->arp, c->grp_rank, c->grp_size, (float *)o->p[2], (float *)o->p[1],
                      (float *)o->p[0], (const float *)o->p[3], (__nv_bfloat16 *)o->p[4], o->i[0],
                      o->i[1], (int64_t)o->i[0] * o->i[1], o->f[0]);
        else
            cu_add_rms_norm(s, (float *)o->p[0], (float *)o->p[1], (const float *)o->p[2],
                            (const float *)o->p[3], o->i[0], o->i[1], o->f[0],
                            (__nv_bfloat16 *)o->p[4]);
        break;
    case OP_ROPE_PART:
        cu_rope_partial(s, (float *)o->p[0], o->i[0], o->i[1], o->i[2], o->i[3],
                        (const float *)o->p[1], (const float *)o->p[2]);
        break;
    case OP_SPLIT_QG:
        cu_split_qgate(s, (float *)o->p[0], (float *)o->p[1], (const float *)o->p[2], o->i[0],
                       o->i[1], o->i[2]);
        break;
    case OP_GATE_MUL:
        cu_gate_mul(s, (float *)o->p[0], (const float *)o->p[1], o->i[0], o->i[1], o->i[2]);
        break;
    case OP_RMS_GATED:
        cu_rms_norm_gated(s, (float *)o->p[0], (const float *)o->p[1], (const float *)o->p[2],
                          (const float *)o->p[3], o->i[0], o->i[1], o->f[0]);
        break;
    case OP_DELTA:
        cu_delta_net(s, o->dn);
        break;
    case OP_MOE:
        cu_moe(s, o->me);
        break;
    case OP_COPY:
        cu_copy(s, (void *)o->p[0], o->p[1], (size_t)o->n);
        break;
    case OP_SCALE:
        cu_scale(s, (float *)o->p[0], o->n, o->f[0]);
        break;
    case OP_ALL_REDUCE:
        if (o->i[0])
            cu_ar_run(s, c->arp, c->grp_rank, c->grp_size, (float *)o->p[0], NULL, NULL, NULL, NULL,
                      0, 0, o->n, 0.0f);
        else
            cu_all_reduce(s, c->comm, (float *)o->p[0], o->n);
        break;
    case OP_ALL_GATHER:
        cu_all_gather(s, c->comm, (float *)o->p[0], (const float *)o->p[1], (float *)o->p[2],
                      c->grp_size, o->i[0], o->i[1]);
        break;
    case OP_TERNARY:
        cu_ternary(s, o->w, (const float *)o->p[1], o->i[0], (float *)o->p[0], c->tq, o->f[0],
                   o->f[1], !o->i[1]);
        break;
    }
}

static void op_label(const op *o, char *buf, size_t n)
{
    switch (o->kind) {
    case OP_GEMV: {
        char f[16];
        snprintf(f, sizeof f, "%s%d", o->gs.w[0].fmt == DF_BF16 ? "bf16" : "q", o->gs.w[0].bits);
        snprintf(buf, n, "gemv %s %s%lldx%lld m<=%d", f,
                 o->gs.pair     ? "gate+up+act "
                 : o->gs.nw > 1 ? "fused "
                                : "",
                 (long long)o->gs.row_end[o->gs.nw - 1] * (o->gs.pair ? 2 : 1),
                 (long long)o->gs.w[0].k,
                 o->i[0] == 1   ? 1
                 : o->i[0] <= 4 ? 4
                                : 8);
        break;
    }
    case OP_GEMM_SET:
        snprintf(buf, n, "gemm set %s%lldx%lld", o->i[1] ? "fused " : "",
                 (long long)(o->gs.w[0].n + o->gs.w[1].n + o->gs.w[2].n), (long long)o->gs.w[0].k);
        break;
    case OP_MOE:
        snprintf(buf, n, "moe %s (%d experts, top %d)",
                 !o->me.grouped           ? "a product per (row, expert)"
                 : cu_moe_streamed(o->me) ? "grouped, streamed"
                                          : "grouped, tensor cores",
                 o->me.n_experts, o->me.top_k);
        break;
    case OP_ALL_REDUCE:
        snprintf(buf, n, "all_reduce %s %lld", o->i[0] ? "one-shot" : "nccl", (long long)o->n);
        break;
    case OP_ADD_RMS:
        snprintf(buf, n, "%sadd+rms_norm %dx%d", o->i[2] ? "all_reduce one-shot+" : "", o->i[0],
                 o->i[1]);
        break;
    case OP_TERNARY:
        snprintf(buf, n, "ternary %s %lldx%lld%s", o->i[0] <= CU_GEMV_MAX_M ? "gemv" : "gemm",
                 (long long)o->w.n, (long long)o->w.k, o->i[1] ? " (x quantized before)" : "");
        break;
    case OP_MATMUL:
        snprintf(buf, n, "gemm %s%s %lldx%lld",
                 o->w.fmt == DF_BF16 ? "bf16/cuBLASLt" : "tensor-core", o->i[3] ? " +=" : "",
                 (long long)o->w.n, (long long)o->w.k);
        break;
    case OP_ATTN:
        if (o->att.decode >= 2)
            snprintf(buf, n, "attention decode, a warp a pair (%d tokens)", o->att.n_tokens);
        else if (o->att.decode)
            snprintf(buf, n, "attention decode (%d tokens, %d splits)", o->att.n_tokens,
                     o->att.splits);
        else if (o->att.n_tiles)
            snprintf(buf, n, "attention tc (%d tokens, %d tiles)", o->att.n_tokens, o->att.n_tiles);
        else
            snprintf(buf, n, "attention (%d tokens, %d splits)", o->att.n_tokens, o->att.splits);
        break;
    default:
        snprintf(buf, n, "%s", op_names[o->kind]);
    }
}

static void prof_add(cu_ctx *c, const char *name, double ms)
{
    int i = 0;
    while (i < c->n_pe && strcmp(c->pe[i].name, name)) i++;
    if (i == c->n_pe) {
        if (c->n_pe == PROF_MAX) return;
        snprintf(c->pe[c->n_pe++].name, sizeof c->pe[0].name, "%s", name);
    }
    c->pe[i].ms += ms;
    c->pe[i].calls++;
}

/* Host time in ms (monotonic). */
static double now_ms(void)
{
    return 1e3 * util_now();
}

/* Runs the tape eagerly with an event pair around every operation. */
static void exec_profiled(cu_ctx *c)
{
    if (2 * c->n_ops > c->ev_cap) {
        for (int i = 0; i < c->ev_cap; i++) CU(cudaEventDestroy(c->ev[i]));
        free(c->ev);
        c->ev_cap = 2 * c->n_ops;
        c->ev = (cudaEvent_t *)malloc(sizeof(cudaEvent_t) * (size_t)c->ev_cap);
        for (int i = 0; i < c->ev_cap; i++) CU(cudaEventCreate(&c->ev[i]));
    }
    CU(cudaStreamSynchronize(c->st));
    const double t0 = now_ms();
    for (int i = 0; i < c->n_ops; i++) {
        CU(cudaEventRecord(c->ev[2 * i], c->st));
        exec_op(c, &c->tape[i]);
        CU(cudaEventRecord(c->ev[2 * i + 1], c->st));
    }
    CU(cudaStreamSynchronize(c->st));
    c->prof_wall += now_ms() - t0;
    c->prof_steps++;
    for (int i = 0; i < c->n_ops; i++) {
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, c->ev[2 * i], c->ev[2 * i + 1]));
        char name[64];
        op_label(&c->tape[i], name, sizeof name);
        prof_add(c, name, ms);
        c->prof_kernels += ms;
    }
}

static int cmp_pe(const void *a, const void *b)
{
    double x = ((const prof_ent *)a)->ms, y = ((const prof_ent *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void prof_report(cu_ctx *c)
{
    if (!c->prof || !c->prof_steps) return;
    qsort(c->pe, (size_t)c->n_pe, sizeof c->pe[0], cmp_pe);
    fprintf(stderr, "\ncuda profile: %ld flushes, %.2f ms wall, %.2f ms in operations (%.1f%%)\n",
            c->prof_steps, c->prof_wall, c->prof_kernels, 100.0 * c->prof_kernels / c->prof_wall);
    fprintf(stderr, "%-48s %8s %10s %10s %6s\n", "operation", "calls", "total ms", "us/call",
            "share");
    for (int i = 0; i < c->n_pe; i++)
        fprintf(stderr, "%-48s %8ld %10.2f %10.2f %5.1f%%\n", c->pe[i].name, c->pe[i].calls,
                c->pe[i].ms, 1e3 * c->pe[i].ms / (double)c->pe[i].calls,
                100.0 * c->pe[i].ms / c->prof_kernels);
}

static void graphs_clear(cu_ctx *c)
{
    for (int i = 0; i < CU_GRAPHS; i++) {
        graph_entry *g = &c->graphs[i];
        if (!g->ops) continue;
        CU(cudaGraphExecDestroy(g->exec));
        free(g->ops);
        memset(g, 0, sizeof *g);
    }
}

static graph_entry *graph_find(cu_ctx *c)
{
    for (int i = 0; i < CU_GRAPHS; i++) {
        graph_entry *g = &c->graphs[i];
        if (g->ops && g->gen == c->gen && g->n_ops == c->n_ops &&
            !memcmp(g->ops, c->tape, sizeof(op) * (size_t)c->n_ops))
            return g;
    }
    return NULL;
}

static graph_entry *graph_capture(cu_ctx *c)
{
    graph_entry *g = &c->graphs[0];
    for (int i = 0; i < CU_GRAPHS; i++) {
        if (!c->graphs[i].ops) {
            g = &c->graphs[i];
            break;
        }
        if (c->graphs[i].last_use < g->last_use) g = &c->graphs[i];
    }
    if (g->ops) {
        CU(cudaGraphExecDestroy(g->exec));
        free(g->ops);
    }
    cudaGraph_t graph;
    CU(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < c->n_ops; i++) exec_op(c, &c->tape[i]);
    CU(cudaStreamEndCapture(c->st, &graph));
    CU(cudaGraphInstantiate(&g->exec, graph, 0));
    CU(cudaGraphDestroy(graph));
    g->ops = (op *)malloc(sizeof(op) * (size_t)c->n_ops);
    if (!g->ops) cu_fatal("malloc", "out of host memory", __FILE__, __LINE__);
    memcpy(g->ops, c->tape, sizeof(op) * (size_t)c->n_ops);
    g->n_ops = c->n_ops;
    g->gen = c->gen;
    return g;
}

/* Whether operation o names buffer b in any of its pointers. */
static bool op_mentions(const op *o, const void *b)
{
    for (int i = 0; i < 8; i++)
        if (o->p[i] == b) return true;
    for (int i = 0; i < 3; i++)
        if ((const void *)o->gs.y[i] == b) return true;
    if (o->kind == OP_DELTA) {
        const cu_delta_args &d = o->dn;
        if ((const void *)d.out == b || (const void *)d.qkv == b || (const void *)d.beta == b ||
            (const void *)d.a == b || (const void *)d.conv == b || (const void *)d.rec == b)
            return true;
    }
    if (o->kind == OP_MOE && ((const void *)o->me.out == b || (const void *)o->me.x == b ||
                              (const void *)o->me.router == b))
        return true;
    return (const void *)o->gs.nsrc == b || (const void *)o->gs.resid == b ||
           (const void *)o->att.q == b || (const void *)o->att.out == b;
}

/* Whether o writes all n floats of b without reading b first. */
static bool op_overwrites(const op *o, const void *b, int64_t n)
{
    switch (o->kind) {
    case OP_MATMUL:
        return o->p[0] == b && !o->i[3] && o->p[1] != b && (int64_t)o->i[0] * o->w.n == n;
    case OP_GEMM_SET:
        /* with SET_NO_SPLIT the launch after it writes the three results; with SET_BF16 it
         * writes bf16 */
        if (o->p[1] == b || o->i[3]) return false;
        for (int j = 0; j < o->gs.nw; j++)
            if ((const void *)o->gs.y[j] == b) return (int64_t)o->i[0] * o->gs.w[j].n == n;
        return false;
    case OP_RMS:
        return o->p[0] == b && o->p[1] != b && (int64_t)o->i[0] * o->i[1] == n;
    case OP_ADD_RMS:
        return o->p[0] == b && o->p[1] != b && o->p[2] != b && (int64_t)o->i[0] * o->i[1] == n;
    case OP_ACT:
        return o->p[0] == b && o->p[1] != b && o->p[2] != b && o->n == n;
    case OP_ATTN:
        return (const void *)o->att.out == b && (const void *)o->att.q != b &&
               (int64_t)o->att.n_tokens * o->att.n_heads * o->att.head_dim == n;
    }
    return false;
}

/* Whether the n floats of b are dead after operation i: nothing reads them before an
 * operation overwrites all of them (operation i + 1 may be the product that reads the bf16
 * copy operation i wrote in their place). */
static bool dead_after(const cu_ctx *c, int i, const void *b, int64_t n)
{
    for (int j = i + 1; j < c->n_ops; j++) {
        const op *o = &c->tape[j];
        if (op_overwrites(o, b, n)) return true;
        if (!op_mentions(o, b)) continue;
        if (j == i + 1 && o->kind == OP_MATMUL && o->i[1] && o->p[1] == b && o->p[0] != b) continue;
        if (j == i + 1 && o->kind == OP_GEMM_SET && o->i[2] && o->p[1] == b) {
            bool writes = false;
            for (int k = 0; k < o->gs.nw; k++) writes |= (const void *)o->gs.y[k] == b;
            if (!writes) continue;
        }
        return false;
    }
    return false;
}

/* The operations that write a bf16 copy of their result for the product after them (the
 * activation, the norms, decode attention) skip the float32 result where the tape proves
 * it dead: read by nothing but that product (which reads the copy) before an operation
 * overwrites all of it. Then gate and up products whose only reader is the activation
 * after them (itself writing bf16 alone) write bf16 results, which it reads. */
static void drop_dead_f32(cu_ctx *c)
{
    for (int i = 0; i < c->n_ops; i++) {
        op *w = &c->tape[i];
        const void *b;
        int64_t n;
        if (w->kind == OP_ACT && w->p[3] && w->p[0]) {
            b = w->p[0];
            n = w->n;
        } else if ((w->kind == OP_RMS || w->kind == OP_ADD_RMS) && w->p[4] && w->p[0] &&
                   w->p[0] != w->p[1]) {
            b = w->p[0];
            n = (int64_t)w->i[0] * w->i[1];
        } else if (w->kind == OP_ATTN && w->att.outb && w->att.out) {
            b = w->att.out;
            n = (int64_t)w->att.n_tokens * w->att.n_heads * w->att.head_dim;
        } else {
            continue;
        }
        if (dead_after(c, i, b, n)) {
            if (w->kind == OP_ATTN)
                w->att.out = NULL;
            else
                w->p[0] = NULL;
        }
    }
    for (int i = 0; i + 1 < c->n_ops; i++) {
        op *st = &c->tape[i], *a = &c->tape[i + 1];
        if (st->kind != OP_GEMM_SET || st->i[1] || st->i[3] || st->gs.nw != 2 ||
            a->kind != OP_ACT || a->i[1] || a->p[0] || !a->p[3] || a->p[1] != st->gs.y[0] ||
            a->p[2] != st->gs.y[1])
            continue;
        const int m = st->i[0];
        const int64_t n = (int64_t)m * st->gs.w[0].n;
        if (st->gs.w[1].n != st->gs.w[0].n || a->n != n || n % 4 ||
            !dead_after(c, i + 1, st->gs.y[0], n) || !dead_after(c, i + 1, st->gs.y[1], n) ||
            !cu_gemm_lt_b16_ok(&c->g, st->gs.w[0], m) || !cu_gemm_lt_b16_ok(&c->g, st->gs.w[1], m))
            continue;
        st->i[3] = SET_BF16;
        a->i[1] = 1;
    }
}

/* Runs every recorded operation (as a graph on decode steps). */
static void flush(cu_ctx *c)
{
    if (!c->n_ops) return;
    c->n_flush++;
    const double h0 = c->trace ? now_ms() : 0;
    if (c->fuse) drop_dead_f32(c);
    CU(cudaSetDevice(c->dev));
    CU(cudaEventRecord(c->staged, c->st));
    int profile = c->prof == 1;
    if (c->prof > 1) {
        int decode = c->n_tokens == c->n_seqs;
        profile = (c->prof == 2 ? decode : !decode) && c->prof_seen > 1;
    }
    if (profile) {
        exec_profiled(c);
    } else if (c->graph_step && c->graphs_on) {
        graph_entry *g = graph_find(c);
        const bool replay = g != NULL;
        if (!g) {
            const double t0 = now_ms();
            g = graph_capture(c);
            c->capture_ms += now_ms() - t0;
            c->n_captures++;
        } else {
            c->n_replays++;
        }
        g->last_use = ++c->clock;
        const double h1 = c->trace ? now_ms() : 0;
        if (c->trace && replay) {
            c->g_flush[c->g_seq % 4] = c->n_flush;
            CU(cudaEventRecord(c->g_start[c->g_seq % 4], c->st));
        }
        CU(cudaGraphLaunch(g->exec, c->st));
        if (c->trace && replay) CU(cudaEventRecord(c->g_end[c->g_seq++ % 4], c->st));
        if (c->trace && replay && c->t_begin > 0) {
            const double h2 = now_ms();
            c->h_record += h0 - c->t_begin;
            c->h_find += h1 - h0;
            c->h_launch += h2 - h1;
            c->h_replays++;
        }
    } else {
        c->n_eager++;
        for (int i = 0; i < c->n_ops; i++) exec_op(c, &c->tape[i]);
    }
    c->n_ops = 0;
}

static op *record(cu_ctx *c, int kind)
{
    if (c->n_ops == c->cap_ops) {
        c->cap_ops = c->cap_ops ? c->cap_ops * 2 : 1024;
        c->tape = (op *)realloc(c->tape, sizeof(op) * (size_t)c->cap_ops);
        if (!c->tape) cu_fatal("realloc", "out of host memory", __FILE__, __LINE__);
    }
    op *o = &c->tape[c->n_ops++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    return o;
}

/* Device scratch that tapes point to: growing it moves it, which invalidates graphs. */
static void *grow(cu_ctx *c, void *p, size_t *cap, size_t need)
{
    if (need <= *cap) return p;
    flush(c);
    CU(cudaStreamSynchronize(c->st));
    if (p) CU(cudaFree(p));
    size_t n = need + need / 2;
    CU(cudaMalloc(&p, n));
    *cap = n;
    c->gen++;
    graphs_clear(c);
    return p;
}

/* ---- memory ---- */

static void *cu_alloc(void *ctx, size_t bytes)
{
    cu_ctx *c = (cu_ctx *)ctx;
    CU(cudaSetDevice(c->dev));
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is reported as NULL, not fatal */
        return NULL;
    }
    CU(cudaMemsetAsync(p, 0, bytes, c->st));
    return p;
}

static void cu_free(void *ctx, void *p)
{
    cu_ctx *c = (cu_ctx *)ctx;
    flush(c);
    CU(cudaStreamSynchronize(c->st));
    CU(cudaFree(p));
}

/* Makes the context's device current for a call that may come from the thread of another
 * device (a tensor-parallel group's lead reading and writing a rank's KV, and queueing its
 * copies, between steps: model/kv_block.h), and the caller's device again on return. */
struct dev_scope {
    int prev;
    explicit dev_scope(int dev) : prev(-1)
    {
        if (cudaGetDevice(&prev) != cudaSuccess) {
            cudaGetLastError();
            prev = -1;
        }
        if (prev != dev) CU(cudaSetDevice(dev));
    }
    ~dev_scope()
    {
        int cur = -1;
        if (prev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev) cudaSetDevice(prev);
    }
};

static void cu_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    flush(c);
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st));
}

static void cu_download(void *ctx, void *dst, const void *src, size_t bytes)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    flush(c);
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->st));
    CU(cudaStreamSynchronize(c->st));
}

/* The copy engine of the host-memory KV tier (backend_ops.host_alloc and on). Each copy
 * batch runs the operations recorded so far first: it must follow the step that wrote its
 * blocks. Host memory is mapped, as the copy kernels read and write it directly, and
 * portable, so that the other GPUs of a tensor-parallel group map it too (host_map). */
static void *cu_host_alloc(void *ctx, size_t bytes)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (!c->copier) c->copier = cu_copier_create();
    cu_copier_map(c->copier, p, bytes);
    return p;
}

static void cu_host_map(void *ctx, void *p, size_t bytes)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    if (!c->copier) c->copier = cu_copier_create();
    cu_copier_map(c->copier, p, bytes);
}

/* The copies into p complete; the copier goes with the last area it maps. */
static void cu_host_unmap(void *ctx, void *p)
{
    cu_ctx *c = (cu_ctx *)ctx;
    if (!c->copier) return;
    dev_scope ds(c->dev);
    CU(cudaStreamSynchronize(c->st));
    if (p && cu_copier_unmap(c->copier, p)) {
        uint64_t t = cu_copier_mark(c->copier, c->st);
        while (!cu_copier_done(c->copier, t)) {
        }
    } else {
        cu_copier_destroy(c->copier);
        c->copier = NULL;
    }
}

static void cu_host_free(void *ctx, void *p)
{
    cu_host_unmap(ctx, p);
    if (p) CU(cudaFreeHost(p));
}

static void cu_copy_setup(void *ctx, int kind, int n_seg, void *const *base, const size_t *bytes)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    cu_copier_setup(c->copier, kind, n_seg, base, bytes);
}

static void cu_copy_block(void *ctx, int kind, int32_t block, void *host, int to_host)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    flush(c); /* a launch may follow: the step's recorded work goes first */
    cu_copier_block(c->copier, c->st, kind, block, host, to_host);
}

static uint64_t cu_copy_mark(void *ctx)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    flush(c);
    return cu_copier_mark(c->copier, c->st);
}

static int cu_copy_done(void *ctx, uint64_t t)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    return cu_copier_done(c->copier, t);
}

static void cu_copy_fence(void *ctx)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    flush(c);
    cu_copier_fence(c->copier, c->st);
}

static void cu_copy_seconds(void *ctx, double *out_s, double *in_s)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dev_scope ds(c->dev);
    cu_copier_seconds(c->copier, out_s, in_s);
}

static int cu_weight_prepare(void *ctx, struct qweight *w, struct err *e)
{
    cu_ctx *c = (cu_ctx *)ctx;
    dweight d;
    memset(&d, 0, sizeof d);
    switch (w->fmt) {
    case WFMT_F32:
        d.fmt = DF_F32;
        break;
    case WFMT_F16:
        d.fmt = DF_F16;
        break;
    case WFMT_BF16:
        d.fmt = DF_BF16;
        break;
    case WFMT_AFFINE:
        d.fmt = DF_AFFINE;
        break;
    case WFMT_MXFP4:
        d.fmt = DF_MXFP4;
        break;
    case WFMT_MXFP8:
        d.fmt = DF_MXFP8;
        break;
    case WFMT_NVFP4:
        d.fmt = DF_NVFP4;
        break;
    case WFMT_TERNARY:
        d.fmt = DF_TERNARY;
        break;
    }
    d.bits = w->bits;
    d.group = w->group;
    d.gshift = -1;
    if (w->group > 0) {
        d.gpr = w->k / w->group;
        if (!(w->group & (w->group - 1)))
            for (d.gshift = 0; (1 << d.gshift) < w->group; d.gshift++) {
            }
    }
    d.n = w->n;
    d.k = w->k;
    d.row_bytes = (int64_t)w->row_bytes;
    d.sdtype = w->sdtype == ST_BF16  ? DS_BF16
               : w->sdtype == ST_F16 ? DS_F16
               : w->sdtype == ST_F32 ? DS_F32
                                     : DS_U8;
    size_t data = (size_t)w->n * w->row_bytes, groups = 0, ssz = 0;
    if (w->scales) {
        groups = (size_t)(w->n * (w->k / w->group));
        ssz = w->fmt == WFMT_AFFINE ? st_dtype_size(w->sdtype) : 1;
    }
    size_t a1 = (data + 255) & ~(size_t)255, a2 = (groups * ssz + 255) & ~(size_t)255;
    size_t total = a1 + a2 + (w->biases ? a2 : 0);
    CU(cudaSetDevice(c->dev));
    uint8_t *p = NULL;
    if (cudaMalloc((void **)&p, total ? total : 256) != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return err_set(e,
                       "cuda:%d: out of device memory for a %lld x %lld weight (%zu bytes, %zu "
                       "free of %zu)",
                       c->dev, (long long)w->n, (long long)w->k, total, fr, tot);
    }
    /* On the backend's stream, which does not wait for the legacy default stream: a plain
     * cudaMemcpy from pageable memory may return before its data has landed, and a kernel
     * on this stream could then read the matrix before it is complete. */
    CU(cudaMemcpyAsync(p, w->w, data, cudaMemcpyHostToDevice, c->st));
    d.w = p;
    if (w->scales) {
        CU(cudaMemcpyAsync(p + a1, w->scales, groups * ssz, cudaMemcpyHostToDevice, c->st));
        d.scales = p + a1;
    }
    if (w->biases) {
        CU(cudaMemcpyAsync(p + a1 + a2, w->biases, groups * ssz, cudaMemcpyHostToDevice, c->st));
        d.biases = p + a1 + a2;
    }
    CU(cudaStreamSynchronize(c->st)); /* the host copy may go away after this call */
    if (c->n_w == c->cap_w) {
        c->cap_w = c->cap_w ? c->cap_w * 2 : 256;
        c->wdesc = (dweight **)realloc(c->wdesc, sizeof(dweight *) * (size_t)c->cap_w);
        c->walloc = (void **)realloc(c->walloc, sizeof(void *) * (size_t)c->cap_w);
        if (!c->wdesc || !c->walloc) cu_fatal("realloc", "out of host memory", __FILE__, __LINE__);
    }
    dweight *h = (dweight *)malloc(sizeof *h);
    if (!h) cu_fatal("malloc", "out of host memory", __FILE__, __LINE__);
    *h = d;
    c->wdesc[c->n_w] = h;
    c->walloc[c->n_w++] = p;
    c->weight_bytes += total;
    w->dev = h;
    return 0;
}

static const dweight &dw(const struct qweight *w)
{
    if (!w->dev) cu_fatal("weight", "used before weight_prepare", __FILE__, __LINE__);
    return *(const dweight *)w->dev;
}

/* ---- step metadata ---- */

static size_t grow_cap(size_t have, size_t need)
{
    if (need <= have) return have;
    size_t n = have ? have : 64;
    while (n < need) n *= 2;
    return n;
}

static void cu_batch_begin(void *ctx, const struct fwd_batch *b)
{
    cu_ctx *c = (cu_ctx *)ctx;
    flush(c);
    if (c->trace) {
        c->t_begin = now_ms();
        if (c->t_tokens > 0) {
            c->h_caller += c->t_begin - c->t_tokens;
            c->h_steps++;
        }
        c->t_tokens = 0;
    }
    CU(cudaSetDevice(c->dev));
    /* The staging buffers are refilled below: the previous step's copies out of them must
     * have run (the step itself may still be running). */
    CU(cudaEventSynchronize(c->staged));
    size_t nt = (size_t)(b->n_tokens > b->n_logits ? b->n_tokens : b->n_logits);
    size_t ct = grow_cap(c->cap_tok, nt), cs = grow_cap(c->cap_seq, (size_t)b->n_seqs + 1),
           cb = grow_cap(c->cap_bt, (size_t)b->n_seqs * (size_t)b->max_blocks);
    if (ct != c->cap_tok || cs != c->cap_seq || cb != c->cap_bt || !c->d_meta) {
        CU(cudaStreamSynchronize(c->st)); /* a running step may read them */
        if (c->d_meta) CU(cudaFree(c->d_meta));
        if (c->h_meta) CU(cudaFreeHost(c->h_meta));
        size_t total = 6 * ct + 3 * cs + cb;
        CU(cudaMalloc((void **)&c->d_meta, total * sizeof(int32_t)));
        CU(cudaMallocHost((void **)&c->h_meta, total * sizeof(int32_t)));
        c->cap_tok = ct;
        c->cap_seq = cs;
        c->cap_bt = cb;
        c->d_tokens = c->d_meta;
        c->d_pos = c->d_meta + ct;
        c->d_slot = c->d_meta + 2 * ct;
        c->d_tok_seq = c->d_meta + 3 * ct;
        c->d_logit_rows = c->d_meta + 4 * ct;
        c->d_pick_rows = c->d_meta + 5 * ct;
        c->d_seq_len = c->d_meta + 6 * ct;
        c->d_q_start = c->d_meta + 6 * ct + cs;
        c->d_state_slot = c->d_meta + 6 * ct + 2 * cs;
        c->d_bt = c->d_meta + 6 * ct + 3 * cs;
        c->gen++;
        graphs_clear(c);
    }
    int32_t *h = c->h_meta;
    size_t n = (size_t)b->n_tokens;
    memcpy(h, b->tokens, n * 4);
    memcpy(h + ct, b->pos, n * 4);
    memcpy(h + 2 * ct, b->slot, n * 4);
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->q_start[s]; t < b->q_start[s + 1]; t++) h[3 * ct + t] = s;
    if (b->n_logits) memcpy(h + 4 * ct, b->logit_rows, (size_t)b->n_logits * 4);
    if (b->pick_rows) {
        if (!c->pick_pending)
            cu_fatal("batch_begin", "a step takes picked tokens but no pick is pending", __FILE__,
                     __LINE__);
        memcpy(h + 5 * ct, b->pick_rows, n * 4);
    } else {
        memset(h + 5 * ct, 0xff, n * 4); /* -1: every token from tokens[] */
    }
    memcpy(h + 6 * ct, b->seq_len, (size_t)b->n_seqs * 4);
    memcpy(h + 6 * ct + cs, b->q_start, (size_t)(b->n_seqs + 1) * 4);
    if (b->state_slot)
        memcpy(h + 6 * ct + 2 * cs, b->state_slot, (size_t)b->n_seqs * 4);
    else
        memset(h + 6 * ct + 2 * cs, 0, (size_t)b->n_seqs * 4); /* no linear-attention layers */
    memcpy(h + 6 * ct + 3 * cs, b->block_table, (size_t)b->n_seqs * b->max_blocks * 4);
    CU(cudaMemcpyAsync(c->d_meta, h, (6 * ct + 3 * cs + cb) * 4, cudaMemcpyHostToDevice, c->st));
    c->h_logit_rows = b->logit_rows;
    c->n_tokens = b->n_tokens;
    c->n_seqs = b->n_seqs;
    c->max_blocks = b->max_blocks;
    c->n_logits = b->n_logits;
    c->graph_step = b->n_tokens <= CU_GRAPH_MAX_TOKENS;
    c->n_tile_tables = 0;
    if (c->prof > 1 && (c->prof == 2) == (b->n_tokens == b->n_seqs)) c->prof_seen++;
}

/*
 * The tile table of the tensor-core attention kernel for GQA groups of `group` query
 * heads: tile i is (sequence, first row) with rows of 64. Built on the host once per step
 * and group, and copied ahead of the step's operations (the previous step has finished:
 * batch_begin waited for it). Returns the table index; *n gets the tile count.
 */
static int tile_table(cu_ctx *c, const struct fwd_batch *b, int group, int *n)
{
    for (int i = 0; i < c->n_tile_tables; i++)
        if (c->tile_group[i] == group) {
            *n = c->tile_n[i];
            return i;
        }
    if (c->n_tile_tables == CU_TILE_TABLES) return -1;
    /* at most one partial tile per sequence */
    size_t need = 2 * ((size_t)b->n_tokens * group / CU_ATTN_TC_ROWS + (size_t)b->n_seqs + 1);
    if (need > c->tiles_cap) {
        size_t bytes = c->tiles_cap * CU_TILE_TABLES * sizeof(int32_t);
        c->d_tiles =
            (int32_t *)grow(c, c->d_tiles, &bytes, need * CU_TILE_TABLES * sizeof(int32_t));
        if (c->h_tiles) CU(cudaFreeHost(c->h_tiles));
        CU(cudaMallocHost((void **)&c->h_tiles, bytes));
        c->tiles_cap = bytes / (CU_TILE_TABLES * sizeof(int32_t));
        c->n_tile_tables = 0; /* the step's earlier tables went with the flushed operations */
    }
    int ti = c->n_tile_tables++;
    int32_t *seq = c->h_tiles + (size_t)ti * c->tiles_cap, *row = seq + c->tiles_cap / 2;
    int nt = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int rows = (b->q_start[s + 1] - b->q_start[s]) * group;
        for (int r = 0; r < rows; r += CU_ATTN_TC_ROWS, nt++) {
            seq[nt] = s;
            row[nt] = r;
        }
    }
    int32_t *d = c->d_tiles + (size_t)ti * c->tiles_cap;
    CU(cudaMemcpyAsync(d, seq, sizeof(int32_t) * (size_t)nt, cudaMemcpyHostToDevice, c->st));
    CU(cudaMemcpyAsync(d + c->tiles_cap / 2, row, sizeof(int32_t) * (size_t)nt,
                       cudaMemcpyHostToDevice, c->st));
    c->tile_group[ti] = group;
    c->tile_n[ti] = nt;
    *n = nt;
    return ti;
}

/* ---- operations ---- */

static op *last_op(cu_ctx *c, int kind);

static void cu_rope_tables_op(void *ctx, float *cos_t, float *sin_t, const float *inv_freq,
                              int half, float mscale, const struct fwd_batch *b)
{
    cu_ctx *c = (cu_ctx *)ctx;
    op *o = record(c, OP_ROPE_TAB);
    o->p[4] = cos_t;
    o->p[5] = sin_t;
    o->p[6] = inv_freq;
    o->i[0] = b->n_tokens;
    o->i[1] = half;
    o->f[1] = mscale;
}

static void cu_embed_op(void *ctx, float *out, const struct qweight *table,
                        const struct fwd_batch *b, float scale)
{
    cu_ctx *c = (cu_ctx *)ctx;
    /* rope tables recorded just before: the embedding launch writes them too */
    op *rt = last_op(c, OP_ROPE_TAB);
    op *o = rt ? rt : record(c, OP_EMBED);
    o->kind = OP_EMBED;
    o->p[0] = out;
    o->w = dw(table);
    o->p[1] = c->d_tokens;
    o->p[2] = c->d_pick_rows;
    o->p[3] = c->d_pick;
    o->i[0] = b->n_tokens;
    o->f[0] = scale;
}

/* The last recorded operation when it is of `kind`, else NULL. */
static op *last_op(cu_ctx *c, int kind)
{
    if (!c->fuse || !c->n_ops || c->tape[c->n_ops - 1].kind != kind) return NULL;
    return &c->tape[c->n_ops - 1];
}

/* The weight allocation that starts at p, or -1. */
static int walloc_index(cu_ctx *c, const void *p)
{
    for (int i = 0; i < c->n_w; i++)
        if (c->walloc[i] == p && c->wdesc[i]->w == p) return i;
    return -1;
}

/*
 * Moves the 3 bf16 matrices of set p into one allocation, rows one after another (once per
 * set: later steps find them adjacent). Only p refers to them in the current tape; graphs
 * captured before refer to the old copies and are dropped. Returns 0 when the matrices
 * cannot be moved (not separate allocations, or no device memory for the copy).
 */
static int set_merge(cu_ctx *c, op *p)
{
    int idx[3];
    size_t bytes[3], total = 0;
    for (int j = 0; j < 3; j++) {
        idx[j] = walloc_index(c, p->gs.w[j].w);
        if (idx[j] < 0) return 0;
        for (int i = 0; i < j; i++)
            if (idx[i] == idx[j]) return 0;
        bytes[j] = (size_t)p->gs.w[j].n * (size_t)p->gs.w[j].row_bytes;
        total += bytes[j];
    }
    CU(cudaStreamSynchronize(c->st)); /* graphs in flight may still read the old copies */
    uint8_t *cat = NULL;
    if (cudaMalloc((void **)&cat, total) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    size_t off = 0;
    for (int j = 0; j < 3; j++) {
        CU(cudaMemcpyAsync(cat + off, p->gs.w[j].w, bytes[j], cudaMemcpyDeviceToDevice, c->st));
        off += bytes[j];
    }
    CU(cudaStreamSynchronize(c->st));
    off = 0;
    for (int j = 0; j < 3; j++) {
        CU(cudaFree(c->walloc[idx[j]]));
        c->walloc[idx[j]] = j ? NULL : cat;
        c->wdesc[idx[j]]->w = cat + off;
        p->gs.w[j].w = cat + off;
        off += bytes[j];
    }
    c->gen++;
    graphs_clear(c);
    return 1;
}

/* The last recorded operation, a set of 3 products over one x: one product if the matrices
 * are bf16 of one row size (moved next to each other on first use). */
static void set_fuse(cu_ctx *c, int m)
{
    /* larger m: the split costs more than one product gains over three on parallel streams
     * (prefill of 8 prompts of 512: 34,353 against 36,125 tokens/s) */
    if (m > 512) return;
    op *p = &c->tape[c->n_ops - 1];
    const dweight *w = p->gs.w;
    for (int j = 0; j < 3; j++)
        if (w[j].fmt != DF_BF16 || w[j].row_bytes != w[0].row_bytes || w[j].n % 4 ||
            (uintptr_t)p->gs.y[j] % 16)
            return;
    dweight cat = w[0];
    cat.n = w[0].n + w[1].n + w[2].n;
    if (!cu_gemm_lt_ok(&c->g, cat, m)) return;
    const bool adjacent =
        w[1].w == w[0].w + w[0].n * w[0].row_bytes && w[2].w == w[1].w + w[1].n * w[1].row_bytes;
    if (!adjacent && (c->fuse_failed || !set_merge(c, p))) {
        c->fuse_failed = 1;
        return;
    }
    const size_t need = sizeof(float) * (size_t)m * (size_t)cat.n;
    if (need > c->ycat_cap) {
        /* growing flushes the tape: this step's set runs as 3 products */
        c->ycat = (float *)grow(c, c->ycat, &c->ycat_cap, need);
        return;
    }
    p->i[1] = 1;
    p->p[2] = c->ycat;
}

/* Whether one-row products of w run on a streaming kernel (k_gemv_stream for 16-bit
 * weights, k_gemv_q4_stream for affine 4-bit), which take the norm before them, the
 * residual add after them and rope + KV store into their launch (other kernels would run
 * those as launches of their own). */
static bool streams(const dweight &w)
{
    return cu_gemv_stream_ok(w) || cu_gemv_q4s_ok(w);
}

/* The most rows a product of w takes through the matrix-vector kernels: bf16 products of
 * 2 to 8 rows go to cuBLASLt, which reads the weights once for all rows (the matrix-vector
 * kernel multiplies each weight with every x row in float32, far below bandwidth at 8
 * rows). */
static int gemv_most(const cu_ctx *c, const dweight &d)
{
    if (c->invariant) return INT_MAX;
    return d.fmt == DF_BF16 ? 1 : CU_GEMV_MAX_M;
}

/* A ternary product: an operation of its own, outside every fusion of the other formats.
 * Products over the x of the product just recorded (q, k, v; gate, up) reuse its int8 rows. */
static void ternary_op(cu_ctx *c, float *y, const float *x, const struct qweight *w,
                       const dweight &d, int m)
{
    const size_t need = cu_ternary_scratch(d, m);
    if (need > c->tq_cap) c->tq = grow(c, c->tq, &c->tq_cap, need);
    op *p = last_op(c, OP_TERNARY);
    const bool same_x = p && p->p[1] == x && p->p[0] != x && p->i[0] == m &&
                        p->w.row_bytes == d.row_bytes && p->w.k == d.k;
    op *o = record(c, OP_TERNARY);
    o->p[0] = y;
    o->p[1] = x;
    o->w = d;
    o->i[0] = m;
    o->i[1] = same_x;
    o->f[0] = w->t_div;
    o->f[1] = w->t_mul;
}

static void cu_matmul_op(void *ctx, float *y, const float *x, const struct qweight *w, int m)
{
    cu_ctx *c = (cu_ctx *)ctx;
    const dweight &d = dw(w);
    if (d.fmt == DF_TERNARY) return ternary_op(c, y, x, w, d, m);
    const int most = gemv_most(c, d);
    if (m <= most && cu_gemv_fast(d)) {
        /* Another matrix over the same x as the previous product: one launch for both. */
        op *p = last_op(c, OP_GEMV);
        if (p && !p->gs.pair && !p->gs.resid && p->gs.nw < 3 && p->p[1] == x && p->i[0] == m &&
            (void *)y != x) {
            int ok = 1;
            for (int i = 0; i < p->gs.nw; i++) ok &= p->gs.y[i] != y && (void *)p->gs.y[i] != x;
            cu_gemv_set g = p->gs;
            g.w[g.nw] = d;
            g.y[g.nw] = y;
            g.row_end[g.nw] = g.row_end[g.nw - 1] + d.n;
            g.nw++;
            if (ok && cu_gemv_set_ok(g)) {
                p->gs = g;
                return;
            }
        }
        const int keep_order = c->invariant;
        /* rms_norm of one row into x just recorded: the product takes its place and
         * normalizes x itself */
        op *rn = m == 1 && streams(d) && !keep_order ? last_op(c, OP_RMS) : NULL;
        if (rn && !(rn->p[0] == x && rn->i[0] == 1 && rn->i[1] == d.k && rn->p[1] != x)) rn = NULL;
        cu_gemv_set norm; /* zeroed bytes, padding too: tapes compare with memcmp */
        memset(&norm, 0, sizeof norm);
        if (rn) {
            norm.nsrc = (const float *)rn->p[1];
            norm.nweight = (const float *)rn->p[2];
            norm.nepsilon = rn->f[0];
            memset(rn, 0, sizeof *rn);
            rn->kind = OP_GEMV;
        }
        op *o = rn ? rn : record(c, OP_GEMV);
        o->p[1] = x;
        o->i[0] = m;
        o->gs = norm;
        o->gs.keep_order = keep_order;
        o->gs.early = c->early_launch;
        o->gs.w[0] = d;
        o->gs.y[0] = y;
        o->gs.row_end[0] = d.n;
        o->gs.nw = 1;
        return;
    }
    if (m > most && d.fmt == DF_BF16 && !c->invariant)
        c->xb = (__nv_bfloat16 *)grow(c, c->xb, &c->xb_cap,
                                      sizeof(__nv_bfloat16) * (size_t)m * (size_t)d.k);
    if (m > most && !c->invariant && cu_gemm_lt_ok(&c->g, d, m)) {
        /* Another cuBLASLt product over the x of the previous one: both in one set. */
        op *p = c->fuse && c->n_ops ? &c->tape[c->n_ops - 1] : NULL;
        if (p && p->p[1] == x && p->i[0] == m && (void *)y != x) {
            if (p->kind == OP_MATMUL && p->w.fmt == DF_BF16 && p->w.k == d.k && p->p[0] != y &&
                p->p[0] != x && cu_gemm_lt_ok(&c->g, p->w, m)) {
                cu_gemv_set g;
                memset(&g, 0, sizeof g);
                g.w[0] = p->w;
                g.y[0] = (float *)p->p[0];
                g.nw = 1;
                const int pre = p->i[1];
                memset(p, 0, sizeof *p);
                p->kind = OP_GEMM_SET;
                p->p[1] = x;
                p->i[0] = m;
                p->i[2] = pre;
                p->gs = g;
            }
            if (p->kind == OP_GEMM_SET && p->gs.nw < 3 && p->gs.w[0].k == d.k) {
                int fresh = 1;
                for (int j = 0; j < p->gs.nw; j++) fresh &= p->gs.y[j] != y;
                if (fresh) {
                    p->gs.w[p->gs.nw] = d;
                    p->gs.y[p->gs.nw++] = y;
                    if (p->gs.nw == 3) set_fuse(c, m);
                    return;
                }
            }
        }
    }
    /* x just written by the activation or a norm: it writes the bf16 copy the product reads
     * too (a second product over x joins this one in a set, which then skips the copy) */
    op *prev = m > most && !c->invariant && c->fuse && c->n_ops ? &c->tape[c->n_ops - 1] : NULL;
    const bool lt = prev && (void *)y != x && cu_gemm_lt_ok(&c->g, d, m);
    const bool pre =
        lt && ((prev->kind == OP_ACT && prev->p[0] == x && prev->n == (int64_t)m * d.k) ||
               ((prev->kind == OP_RMS || prev->kind == OP_ADD_RMS) && prev->p[0] == x &&
                prev->i[0] == m && prev->i[1] == d.k) ||
               (prev->kind == OP_ATTN && prev->att.decode && prev->att.out == x &&
                prev->att.n_tokens == m && (int64_t)prev->att.n_heads * prev->att.head_dim == d.k));
    if (pre && prev->kind == OP_ATTN)
        prev->att.outb = c->xb;
    else if (pre)
        prev->p[prev->kind == OP_ACT ? 3 : 4] = c->xb;
    op *o = record(c, OP_MATMUL);
    o->p[0] = y;
    o->p[1] = x;
    o->w = d;
    o->i[0] = m;
    o->i[1] = pre;
    o->i[2] = m <= CU_GEMV_MAX_M && m > most; /* a few rows, on cuBLASLt all the same */
}

static void cu_add_bias_op(void *ctx, float *y, const float *bias, int m, int n)
{
    op *o = record((cu_ctx *)ctx, OP_BIAS);
    o->p[0] = y;
    o->p[1] = bias;
    o->i[0] = m;
    o->i[1] = n;
}

static void cu_rms_norm_op(void *ctx, float *out, const float *x, const float *w, int rows, int dim,
                           float eps)
{
    cu_ctx *c = (cu_ctx *)ctx;
    /* y = a . W^T (cuBLASLt), then x += y, then this norm of x overwriting y: y is never
     * read, so the product adds into x itself and the norm reads the sum. */
    op *p = last_op(c, OP_ADD);
    op *mm = p && c->n_ops >= 2 ? &c->tape[c->n_ops - 2] : NULL;
    if (mm && mm->kind == OP_MATMUL && !mm->i[3] && mm->p[0] == p->p[1] && mm->p[0] == out &&
        p->p[0] == x && (const void *)x != out && mm->p[1] != x && mm->p[1] != out &&
        mm->i[0] == rows && mm->w.n == dim && p->n == (int64_t)rows * dim &&
        (rows > CU_GEMV_MAX_M || mm->i[2]) && !c->invariant && cu_gemm_lt_ok(&c->g, mm->w, rows)) {
        mm->p[0] = x;
        mm->i[3] = 1;
        c->n_ops--;
        p = NULL;
    }
    if (p && p->p[0] == x && p->n == (int64_t)rows * dim) {
        const void *y = p->p[1];
        memset(p, 0, sizeof *p);
        p->kind = OP_ADD_RMS;
        p->p[0] = out;
        p->p[1] = x;
        p->p[2] = y;
        p->p[3] = w;
        p->i[0] = rows;
        p->i[1] = dim;
        p->f[0] = eps;
        /* y just summed over the group by the one-shot exchange: the exchange, the add and
         * the norm in one kernel */
        op *ar = c->n_ops >= 2 ? &c->tape[c->n_ops - 2] : NULL;
        if (ar && ar->kind == OP_ALL_REDUCE && ar->i[0] && ar->p[0] == y &&
            ar->n == (int64_t)rows * dim && dim % 4 == 0 && cu_ar_fits(ar->n, y, x, out, w, NULL)) {
            p->i[2] = 1;
            *ar = *p;
            c->n_ops--;
        }
        return;
    }
    op *o = record(c, OP_RMS);
    o->p[0] = out;
    o->p[1] = x;
    o->p[2] = w;
    o->i[0] = rows;
    o->i[1] = dim;
    o->f[0] = eps;
}

static void cu_rope_op(void *ctx, float *x, int rows, int heads, int d, const float *cos_t,
                       const float *sin_t)
{
    op *o = record((cu_ctx *)ctx, OP_ROPE);
    o->p[0] = x;
    o->p[1] = cos_t;
    o->p[2] = sin_t;
    o->i[0] = rows;
    o->i[1] = heads;
    o->i[2] = d;
}

/* The rope + KV store just recorded (the last operation) after the one-row q/k/v products
 * of its q, k and v: the streaming kernel does both. */
static void qkv_rope(cu_ctx *c, const struct kv_layer *kv, const struct kv_geom *g, const float *q,
                     const float *k, const float *v, const void *cos_t, const void *sin_t,
                     int n_tokens)
{
    if (n_tokens != 1 || c->n_ops < 2) return;
    op *p = &c->tape[c->n_ops - 2];
    cu_gemv_set &s = p->gs;
    const int64_t d = g->head_dim;
    if (p->kind != OP_GEMV || p->i[0] != 1 || s.nw != 3 || s.pair || s.resid || s.keep_order ||
        s.y[0] != q || s.y[1] != k || s.y[2] != v || s.w[0].n % d ||
        s.w[1].n != g->n_kv_heads * d || s.w[2].n != s.w[1].n)
        return;
    for (int j = 0; j < 3; j++)
        if (!streams(s.w[j])) return;
    s.rope_half = (int)(d / 2);
    s.rcos = (const float *)cos_t;
    s.rsin = (const float *)sin_t;
    s.kc = (__nv_bfloat16 *)kv->k;
    s.vc = (__nv_bfloat16 *)kv->v;
    s.slot = c->d_slot;
    c->n_ops--;
}

static void cu_kv_store_op(void *ctx, const struct kv_layer *kv, const struct kv_geom *g,
                           const float *k, const float *v, const struct fwd_batch *b)
{
    cu_ctx *c = (cu_ctx *)ctx;
    if (g->k_dtype != KV_DTYPE_AUTO) { /* a KV cache format (attn_q.cu) */
        op *o = record(c, OP_KV_STORE_Q);
        o->p[0] = kv->k;
        o->p[1] = kv->v;
        o->p[2] = k;
        o->p[3] = v;
        cu_kvq_args &a = o->kq;
        a.kc = kv->k;
        a.vc = kv->v;
        a.k = k;
        a.v = v;
        a.slot = c->d_slot;
        a.n_tokens = b->n_tokens;
        a.n_kv_heads = g->n_kv_heads;
        a.head_dim = g->head_dim;
        a.block_size = g->block_size;
        a.k_dtype = g->k_dtype;
        a.v_dtype = g->v_dtype;
        a.k_scale = g->k_scale;
        a.v_scale = g->v_scale;
        return;
    }
    /* rope(q), rope(k) just recorded with the same tables: all three in one launch */
    if (c->fuse && c->n_ops >= 2) {
        op *rq = &c->tape[c->n_ops - 2], *rk = &c->tape[c->n_ops - 1];
        if (rq->kind == OP_ROPE && rk->kind == OP_ROPE && rk->p[0] == k && rq->p[0] != k &&
            rq->p[0] != v && rq->i[0] == b->n_tokens && rk->i[0] == b->n_tokens &&
            rq->i[2] == g->head_dim && rk->i[2] == g->head_dim && rk->i[1] == g->n_kv_heads &&
            rq->p[1] == rk->p[1] && rq->p[2] == rk->p[2]) {
            float *q = (float *)rq->p[0];
            const void *cos_t = rq->p[1], *sin_t = rq->p[2];
            int hq = rq->i[1];
            c->n_ops--;
            memset(rq, 0, sizeof *rq);
            rq->kind = OP_ROPE_KV;
            rq->p[4] = q;
            rq->p[5] = k;
            rq->p[6] = cos_t;
            rq->p[0] = kv->k;
            rq->p[1] = kv->v;
            rq->p[2] = v;
            rq->p[3] = sin_t;
            rq->i[0] = b->n_tokens;
            rq->i[1] = hq;
            rq->i[2] = g->n_kv_heads;
            rq->i[3] = g->head_dim;
            /* after q, k and v as one product: this launch reads its columns in place of
             * the split */
            op *set = c->n_ops >= 2 ? &c->tape[c->n_ops - 2] : NULL;
            if (set && set->kind == OP_GEMM_SET && set->i[1] && !set->i[3] &&
                set->i[0] == b->n_tokens && set->gs.nw == 3 && set->gs.y[0] == q &&
                set->gs.y[1] == k && set->gs.y[2] == v &&
                set->gs.w[0].n == (int64_t)hq * g->head_dim &&
                set->gs.w[1].n == (int64_t)g->n_kv_heads * g->head_dim &&
                set->gs.w[2].n == set->gs.w[1].n) {
                set->i[3] = SET_NO_SPLIT;
                rq->p[7] = set->p[2];
            }
            qkv_rope(c, kv, g, q, k, v, cos_t, sin_t, b->n_tokens);
            return;
        }
    }
    op *o = record(c, OP_KV_STORE);
    o->p[0] = kv->k;
    o->p[1] = kv->v;
    o->p[2] = k;
    o->p[3] = v;
    o->i[0] = b->n_tokens;
    o->i[1] = g->n_kv_heads * g->head_dim;
}

/* The partial results of `splits` key ranges per token and query head, [n_tokens, n_heads,
 * splits, head_dim + 2] floats, in c->part. */
static float *attn_part(cu_ctx *c, const struct fwd_batch *b, const struct attn_params *p,
                        int splits)
{
    size_t need =
        sizeof(float) * (size_t)b->n_tokens * p->n_heads * splits * (size_t)(p->head_dim + 2);
    c->part = (float *)grow(c, c->part, &c->part_cap, need);
    return c->part;
}

static void cu_attention_op(void *ctx, float *out, const float *q, const struct kv_layer *kv,
                            const struct kv_geom *g, const struct fwd_batch *b,
                            const struct attn_params *p)
{
    cu_ctx *c = (cu_ctx *)ctx;
    assert(cu_attn_ok(p->head_dim, p->n_heads, p->n_kv_heads)); /* attn_check at load */
    if (g->k_dtype != KV_DTYPE_AUTO) {                          /* a KV cache format (attn_q.cu) */
        op *o = record(c, OP_ATTN_Q);
        o->p[0] = out;
        o->p[1] = q;
        o->p[2] = kv->k;
        o->p[3] = kv->v;
        cu_attnq_args &a = o->aq;
        a.q = q;
        a.out = out;
        a.k = kv->k;
        a.v = kv->v;
        a.pos = c->d_pos;
        a.tok_seq = c->d_tok_seq;
        a.block_table = c->d_bt;
        a.n_tokens = b->n_tokens;
        a.n_heads = p->n_heads;
        a.n_kv_heads = p->n_kv_heads;
        a.head_dim = p->head_dim;
        a.block_size = g->block_size;
        a.max_blocks = b->max_blocks;
        a.k_dtype = g->k_dtype;
        a.v_dtype = g->v_dtype;
        a.window = p->window;
        a.scale = p->scale;
        a.softcap = p->softcap;
        /* the tensor-core kernel where it takes the formats and shapes (not in batch-invariant
         * mode, whose results must not depend on the step's other tokens, nor with
         * PAGODA_CUDA_ATTN=simt); the split count, as for bf16, from the block-table width */
        a.splits = 0;
        a.part = NULL;
        if (!c->invariant && c->attn_mode != 1 &&
            cu_attnq_fast_ok(g->k_dtype, g->v_dtype, p->head_dim, p->n_heads / p->n_kv_heads,
                             g->block_size)) {
            int max_keys = b->max_blocks * g->block_size;
            if (p->window > 0 && p->window < max_keys) max_keys = p->window;
            a.splits =
                cu_attnq_splits(b->n_tokens, p->n_kv_heads, max_keys, c->prop.multiProcessorCount);
            if (a.splits > 1) a.part = attn_part(c, b, p, a.splits);
            o->p[4] = a.part;
        }
        return;
    }
    cu_attn_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.out = out;
    a.k = (const __nv_bfloat16 *)kv->k;
    a.v = (const __nv_bfloat16 *)kv->v;
    a.pos = c->d_pos;
    a.tok_seq = c->d_tok_seq;
    a.seq_len = c->d_seq_len;
    a.block_table = c->d_bt;
    a.n_tokens = b->n_tokens;
    a.n_heads = p->n_heads;
    a.n_kv_heads = p->n_kv_heads;
    a.head_dim = p->head_dim;
    a.block_size = g->block_size;
    a.max_blocks = b->max_blocks;
    a.scale = p->scale;
    a.softcap = p->softcap;
    a.window = p->window;
    int group = p->n_heads / p->n_kv_heads, chunks = (group + 3) / 4;
    /* The split count depends on the block-table width, not on this step's lengths, so
     * that consecutive decode steps record the same tape. */
    int max_keys = b->max_blocks * g->block_size;
    if (p->window > 0 && p->window < max_keys) max_keys = p->window;
    /* Tensor cores when the step has prompt tokens or many sequences: a tile of 64 rows
     * then holds many rows or its key tiles are few; and the decode kernel for every decode
     * step, whose keys go in ranges over the GPU when the sequences are few (one sequence of
     * 1024 + 64 tokens: 239.8 against 216.7 tokens/s with the float32 kernel's splits, of
     * 4096 + 32: 230.8 against 191.9). Otherwise the float32 kernel, which takes every head
     * size (the decode kernels take 64 and 128, the tile kernel 256 as well). */
    const int dec = b->n_tokens == b->n_seqs && cu_attn_dec_ok(p->head_dim, group);
    int use_tc = !c->invariant && cu_attn_tc_ok(p->head_dim) && c->attn_mode != 1 &&
                 (c->attn_mode == 2 || b->n_tokens > b->n_seqs || b->n_tokens >= 64 || dec);
    /* Decode steps (one token a sequence): the decode kernel, whose warps split the keys,
     * unless PAGODA_CUDA_ATTN=tc asks for the 64-row tiles. */
    if (use_tc && dec && c->attn_mode != 2) {
        a.decode = 1;
        a.early = c->early_launch;
        /* many pairs: a warp a pair, unless one token's keys would keep its warps long
         * after the others (the longest over 1,024 keys and over twice the mean); few
         * sequences: their keys in ranges over the GPU, merged by the last range */
        const int pairs = b->n_tokens * p->n_kv_heads;
        if (pairs >= 4 * c->prop.multiProcessorCount) {
            int64_t longest = 0, total = 0;
            for (int t = 0; t < b->n_tokens; t++) {
                int64_t keys = (int64_t)b->pos[t] + 1;
                if (p->window > 0 && keys > p->window) keys = p->window;
                if (keys > longest) longest = keys;
                total += keys;
            }
            if (longest <= CU_ATTN_DECW_KEYS || longest * b->n_tokens <= 2 * total) a.decode = 2;
        }
        a.splits = a.decode == 1 ? cu_attn_dec_splits(b->n_tokens, p->n_kv_heads, max_keys,
                                                      c->prop.multiProcessorCount)
                                 : 1;
        a.cluster = c->dec_cluster && a.splits > 1 && a.splits <= CU_ATTN_CLUSTER_MAX;
        if (a.splits > 1) {
            a.part = attn_part(c, b, p, a.splits);
            size_t nsem = (size_t)b->n_tokens * p->n_kv_heads;
            if (nsem * sizeof(int) > c->sem_cap) {
                c->sem = (int *)grow(c, c->sem, &c->sem_cap, nsem * sizeof(int));
                CU(cudaMemsetAsync(c->sem, 0, c->sem_cap, c->st));
            }
            a.sem = c->sem;
        }
        op *o = record(c, OP_ATTN);
        o->att = a;
        return;
    }
    if (use_tc) {
        int nt = 0, ti = tile_table(c, b, p->n_heads / p->n_kv_heads, &nt);
        if (ti >= 0) {
            a.n_tiles = nt;
            a.tile_seq = c->d_tiles + (size_t)ti * c->tiles_cap;
            a.tile_row = a.tile_seq + c->tiles_cap / 2;
            a.q_start = c->d_q_start;
            a.splits = 1;
            op *o = record(c, OP_ATTN);
            o->att = a;
            return;
        }
    }
    if (c->invariant) {
        /* Each token's keys fall into ranges of CU_ATTN_FIXED_KEYS from its first visible
         * key, whatever else is in the batch; ranges past a token's keys stay empty. */
        a.key_chunk = CU_ATTN_FIXED_KEYS;
        a.splits = (max_keys + CU_ATTN_FIXED_KEYS - 1) / CU_ATTN_FIXED_KEYS;
    } else {
        a.splits = cu_attn_splits(b->n_tokens, p->n_kv_heads * chunks, max_keys,
                                  c->prop.multiProcessorCount);
    }
    if (a.splits > 1) a.part = attn_part(c, b, p, a.splits);
    op *o = record(c, OP_ATTN);
    o->att = a;
}

static void cu_act_mul_op(void *ctx, float *out, const float *gate, const float *up, int64_t n,
                          enum act_kind act)
{
    cu_ctx *c = (cu_ctx *)ctx;
    /* gate and up products just recorded as one launch: fuse the activation into it. */
    op *p = last_op(c, OP_GEMV);
    if (p && p->gs.nw == 2 && !p->gs.pair && p->gs.y[0] == out && p->gs.y[0] == gate &&
        p->gs.y[1] == up && p->gs.w[0].n == p->gs.w[1].n && n == (int64_t)p->i[0] * p->gs.w[0].n) {
        p->gs.pair = 1;
        p->gs.gelu = (int)act;
        p->gs.row_end[1] = p->gs.row_end[0];
        if (cu_gemv_set_ok(p->gs)) return;
        p->gs.pair = 0;
        p->gs.gelu = 0;
        p->gs.row_end[1] = 2 * p->gs.row_end[0];
    }
    op *o = record(c, OP_ACT);
    o->p[0] = out;
    o->p[1] = gate;
    o->p[2] = up;
    o->n = n;
    o->i[0] = (int)act; /* act_of's act */
}

static void cu_add_op(void *ctx, float *x, const float *y, int64_t n)
{
    cu_ctx *c = (cu_ctx *)ctx;
    /* x += y where y is the one-row product just recorded: the product adds its rows to x */
    op *p = last_op(c, OP_GEMV);
    if (p && streams(p->gs.w[0]) && p->i[0] == 1 && p->gs.nw == 1 && !p->gs.pair && !p->gs.resid &&
        p->gs.y[0] == y && p->gs.w[0].n == n && (const void *)x != y &&
        (const void *)x != p->p[1]) {
        p->gs.resid = x;
        return;
    }
    op *o = record(c, OP_ADD);
    o->p[0] = x;
    o->p[1] = y;
    o->n = n;
}

static void cu_softcap_op(void *ctx, float *x, int64_t n, float cap)
{
    op *o = record((cu_ctx *)ctx, OP_SOFTCAP);
    o->p[0] = x;
    o->n = n;
    o->f[0] = cap;
}

static void cu_gather_rows_op(void *ctx, float *dst, const float *src, const int32_t *rows, int n,
                              int dim)
{
    cu_ctx *c = (cu_ctx *)ctx;
    const int32_t *drows = c->d_logit_rows;
    if (rows != c->h_logit_rows || n > c->n_logits) {
        /* Rows other than this step's logit rows: upload them first. */
        c->d_small =
            (int32_t *)grow(c, c->d_small, &c->small_cap, sizeof(int32_t) * (size_t)(n + 64));
        flush(c);
        CU(cudaMemcpyAsync(c->d_small, rows, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice,
                           c->st));
        CU(cudaStreamSynchronize(c->st));
        drows = c->d_small;
    }
    op *o = record(c, OP_GATHER);
    o->p[0] = dst;
    o->p[1] = src;
    o->p[2] = drows;
    o->i[0] = n;
    o->i[1] = dim;
    if (drows == c->d_small) flush(c); /* d_small may be reused before the next flush */
}

/* Makes room for `rows` picked ids: the device buffer (moving it invalidates graphs) and
 * the two pinned slots. The ids of the last pick move with them: the next step may take
 * them as input, and picks() may not have read them yet. */
static void pick_reserve(cu_ctx *c, int rows)
{
    if (rows <= c->pick_cap) return;
    flush(c);
    CU(cudaStreamSynchronize(c->st));
    const int old = c->pick_cap, nr = rows + rows / 2;
    unsigned long long *base;
    CU(cudaMalloc((void **)&base, (sizeof(unsigned long long) + 2 * sizeof(int32_t)) * nr));
    /* On the step stream: it does not wait for the legacy default stream (non-blocking), so
     * a plain cudaMemset could still be pending when the first pick counts its blocks in */
    CU(cudaMemsetAsync(base, 0, (sizeof(unsigned long long) + sizeof(unsigned)) * nr, c->st));
    int32_t *ids = (int32_t *)((unsigned *)(base + nr) + nr);
    if (old) {
        CU(cudaMemcpyAsync(ids, c->d_pick, sizeof(int32_t) * old, cudaMemcpyDeviceToDevice, c->st));
        CU(cudaStreamSynchronize(c->st));
        CU(cudaFree(c->d_amax_slot));
    }
    c->d_amax_slot = base;
    c->d_amax_count = (unsigned *)(base + nr);
    c->d_pick = ids;
    for (int i = 0; i < 2; i++) {
        int32_t *h;
        CU(cudaMallocHost((void **)&h, sizeof(int32_t) * nr));
        if (c->h_pick[i]) {
            memcpy(h, c->h_pick[i], sizeof(int32_t) * old);
            CU(cudaFreeHost(c->h_pick[i]));
        }
        c->h_pick[i] = h;
    }
    c->pick_cap = nr;
    c->gen++;
    graphs_clear(c);
}

static void cu_picks(void *ctx, int32_t *out, int rows)
{
    cu_ctx *c = (cu_ctx *)ctx;
    if (!c->pick_pending) cu_fatal("picks", "no pick is pending", __FILE__, __LINE__);
    const int s = c->pick_first;
    if (rows > c->pick_n[s])
        cu_fatal("picks", "more ids read than the pick has rows", __FILE__, __LINE__);
    const double h0 = c->trace ? now_ms() : 0;
    CU(cudaEventSynchronize(c->pick_done[s]));
    if (c->trace) {
        c->t_tokens = now_ms();
        c->h_wait += c->t_tokens - h0;
        const long j = c->pick_graph[s];
        if (j >= 0 && c->n_g < CU_TRACE_STEPS) {
            float ms = 0, gap = -1;
            CU(cudaEventElapsedTime(&ms, c->g_start[j % 4], c->g_end[j % 4]));
            /* the graph before it ran in the flush just before this one's */
            if (j >= 1 && c->g_flush[(j - 1) % 4] == c->g_flush[j % 4] - 1)
                CU(cudaEventElapsedTime(&gap, c->g_end[(j - 1) % 4], c->g_start[j % 4]));
            c->g_span[c->n_g] = 1e3f * ms;
            c->g_gap[c->n_g++] = gap < 0 ? -1.0f : 1e3f * gap;
        }
    }
    memcpy(out, c->h_pick[s], sizeof(int32_t) * (size_t)rows);
    c->pick_first = (s + 1) % 2;
    c->pick_pending--;
}

/* Records a per-row operation that writes one token id per logit row into d_pick (argmax,
 * sample; `params` its per-row parameters in device memory), runs the step and queues the
 * ids' copy to host memory; with out, waits for them. */
static void token_op(cu_ctx *c, int kind, int32_t *out, const float *x, int rows, int n,
                     const void *params)
{
    if (c->pick_pending == 2)
        cu_fatal("argmax", "a third pick started before one was read", __FILE__, __LINE__);
    /* The greedy pick of one row just written by a one-row product over the GPU: the
     * product's blocks pick it as they write the row, with no launch of its own. */
    op *pr = kind == OP_ARGMAX && rows == 1 ? last_op(c, OP_GEMV) : NULL;
    if (pr && pr->i[0] == 1 && pr->gs.y[0] == x && pr->gs.w[0].n == n && !pr->gs.amax_out &&
        cu_gemv_amax_ok(pr->gs)) {
        pr->gs.amax_out = c->d_pick;
        pr->gs.amax_slot = c->d_amax_slot;
        pr->gs.amax_count = c->d_amax_count;
    } else {
        op *o = record(c, kind);
        o->p[0] = c->d_pick;
        o->p[1] = x;
        o->p[2] = params;
        o->i[0] = rows;
        o->i[1] = n;
        if (kind == OP_ARGMAX && 4 * rows <= c->prop.multiProcessorCount) {
            /* too few rows for a block each to fill the GPU: each row over many blocks */
            o->i[2] = 2 * c->prop.multiProcessorCount / rows;
            if (o->i[2] > 128) o->i[2] = 128;
            o->p[3] = c->d_amax_slot;
            o->p[4] = c->d_amax_count;
        }
    }
    const long g0 = c->g_seq;
    flush(c);
    const int s = (c->pick_first + c->pick_pending) % 2;
    c->pick_graph[s] = c->g_seq != g0 ? c->g_seq - 1 : -1;
    CU(cudaMemcpyAsync(c->h_pick[s], c->d_pick, sizeof(int32_t) * (size_t)rows,
                       cudaMemcpyDeviceToHost, c->st));
    CU(cudaEventRecord(c->pick_done[s], c->st));
    c->pick_n[s] = rows;
    c->pick_pending++;
    if (out) cu_picks(c, out, rows);
}

static void cu_argmax_op(void *ctx, int32_t *out, const float *x, int rows, int n)
{
    cu_ctx *c = (cu_ctx *)ctx;
    if (rows <= 0) return;
    pick_reserve(c, rows);
    token_op(c, OP_ARGMAX, out, x, rows, n, NULL);
}

static void cu_sample_op(void *ctx, int32_t *out, const float *x, int rows, int n,
                         const struct sample_row *p)
{
    cu_ctx *c = (cu_ctx *)ctx;
    if (rows <= 0) return;
    pick_reserve(c, rows);
    c->d_sample = (struct sample_row *)grow(c, c->d_sample, &c->sample_cap,
                                            sizeof(struct sample_row) * (size_t)rows);
    /* The parameters travel ahead of the step's operations, which have not run yet and do
     * not read them; the previous step's sampling ran before them in the stream (a copy
     * from pageable memory is staged at once). */
    CU(cudaMemcpyAsync(c->d_sample, p, sizeof(struct sample_row) * (size_t)rows,
                       cudaMemcpyHostToDevice, c->st));
    token_op(c, OP_SAMPLE, out, x, rows, n, c->d_sample);
}

/* ---- the hybrid and MoE families ---- */

static void cu_rope_partial_op(void *ctx, float *x, int rows, int heads, int d, int rot,
                               const float *cos_t, const float *sin_t)
{
    op *o = record((cu_ctx *)ctx, OP_ROPE_PART);
    o->p[0] = x;
    o->p[1] = cos_t;
    o->p[2] = sin_t;
    o->i[0] = rows;
    o->i[1] = heads;
    o->i[2] = d;
    o->i[3] = rot;
}

static void cu_split_qgate_op(void *ctx, float *q, float *gate, const float *qg, int rows,
                              int heads, int d)
{
    op *o = record((cu_ctx *)ctx, OP_SPLIT_QG);
    o->p[0] = q;
    o->p[1] = gate;
    o->p[2] = qg;
    o->i[0] = rows;
    o->i[1] = heads;
    o->i[2] = d;
}

static void cu_scale_op(void *ctx, float *x, int64_t n, float sc)
{
    op *o = record((cu_ctx *)ctx, OP_SCALE);
    o->p[0] = x;
    o->n = n;
    o->f[0] = sc;
}

static void cu_gate_mul_op(void *ctx, float *x, const float *g, int rows, int n, int gn)
{
    op *o = record((cu_ctx *)ctx, OP_GATE_MUL);
    o->p[0] = x;
    o->p[1] = g;
    o->i[0] = rows;
    o->i[1] = n;
    o->i[2] = gn;
}

static void cu_rms_norm_gated_op(void *ctx, float *out, const float *x, const float *z,
                                 const float *w, int rows, int dim, float eps)
{
    op *o = record((cu_ctx *)ctx, OP_RMS_GATED);
    o->p[0] = out;
    o->p[1] = x;
    o->p[2] = z;
    o->p[3] = w;
    o->i[0] = rows;
    o->i[1] = dim;
    o->f[0] = eps;
}

/* The step's token ranges, positions and state slots are read from the metadata buffers. */
static void cu_delta_net_op(void *ctx, float *out, float *qkv, const float *beta_in, const float *a,
                            const struct state_layer *st, const struct delta_params *p,
                            const struct fwd_batch *b)
{
    cu_ctx *c = (cu_ctx *)ctx;
    if (!b->state_slot)
        cu_fatal("delta_net", "a step without recurrent-state slots", __FILE__, __LINE__);
    op *o = record(c, OP_DELTA);
    cu_delta_args &d = o->dn;
    d.out = out;
    d.qkv = qkv;
    d.beta = beta_in;
    d.a = a;
    d.conv = st->conv;
    d.rec = st->rec;
    d.conv_w = p->conv_w;
    d.a_log = p->a_log;
    d.dt_bias = p->dt_bias;
    d.q_start = c->d_q_start;
    d.pos = c->d_pos;
    d.state_slot = c->d_state_slot;
    d.n_tokens = b->n_tokens;
    d.n_seqs = b->n_seqs;
    d.n_k_heads = p->n_k_heads;
    d.n_v_heads = p->n_v_heads;
    d.k_dim = p->k_dim;
    d.v_dim = p->v_dim;
    d.conv_k = p->conv_k;
}

/* A MoE layer's expert descriptors on the device: gate, up and down [n_experts] each. */
struct moe_table {
    /* the host descriptors (qweight.dev) of the first and last experts' matrices: they stay
     * allocated while the backend lives, so no other layer's can share their addresses */
    const void *key[6];
    int n_experts;
    int uniform_gu, uniform_down; /* as cu_moe_args */
    dweight *d;
    float *expert_scale; /* device [n_experts] (Gemma 4), else NULL */
};

static bool same_layout(const dweight &a, const dweight &b)
{
    return a.fmt == b.fmt && a.bits == b.bits && a.group == b.group && a.sdtype == b.sdtype &&
           a.gshift == b.gshift && a.gpr == b.gpr && a.n == b.n && a.k == b.k &&
           a.row_bytes == b.row_bytes && !a.scales == !b.scales && !a.biases == !b.biases;
}

/* The table of p's layer, built on its first use (outside any graph capture: recording
 * runs nothing). */
static const moe_table *moe_table_get(cu_ctx *c, const struct moe_params *p)
{
    const int E = p->n_experts;
    const void *key[6] = {p->gate[0].dev,     p->up[0].dev,     p->down[0].dev,
                          p->gate[E - 1].dev, p->up[E - 1].dev, p->down[E - 1].dev};
    for (int i = 0; i < c->n_moe_tabs; i++)
        if (!memcmp(c->moe_tabs[i].key, key, sizeof key) && c->moe_tabs[i].n_experts == E)
            return &c->moe_tabs[i];
    const size_t bytes = sizeof(dweight) * 3 * (size_t)E;
    dweight *h = (dweight *)malloc(bytes);
    c->moe_tabs =
        (moe_table *)realloc(c->moe_tabs, sizeof(moe_table) * (size_t)(c->n_moe_tabs + 1));
    if (!h || !c->moe_tabs) cu_fatal("malloc", "out of host memory", __FILE__, __LINE__);
    moe_table *t = &c->moe_tabs[c->n_moe_tabs++];
    memcpy(t->key, key, sizeof key);
    t->n_experts = E;
    t->uniform_gu = t->uniform_down = 1;
    for (int e = 0; e < E; e++) {
        h[e] = dw(&p->gate[e]);
        h[E + e] = dw(&p->up[e]);
        h[2 * E + e] = dw(&p->down[e]);
        t->uniform_gu &= same_layout(h[0], h[e]) && same_layout(h[0], h[E + e]);
        t->uniform_down &= same_layout(h[2 * E], h[2 * E + e]);
    }
    CU(cudaSetDevice(c->dev));
    CU(cudaMalloc((void **)&t->d, bytes));
    CU(cudaMemcpyAsync(t->d, h, bytes, cudaMemcpyHostToDevice, c->st));
    t->expert_scale = NULL;
    if (p->expert_scale) {
        CU(cudaMalloc((void **)&t->expert_scale, sizeof(float) * (size_t)E));
        CU(cudaMemcpyAsync(t->expert_scale, p->expert_scale, sizeof(float) * (size_t)E,
                           cudaMemcpyHostToDevice, c->st));
    }
    CU(cudaStreamSynchronize(c->st)); /* h goes away */
    free(h);
    return t;
}

static void cu_moe_op(void *ctx, float *out, const float *x, const float *router,
                      const struct moe_params *p, int rows, int hidden)
{
    cu_ctx *c = (cu_ctx *)ctx;
    if (rows <= 0) return;
    const int E = p->n_experts, K = p->top_k;
    const dweight &g0 = dw(&p->gate[0]), &d0 = dw(&p->down[0]);
    if (g0.k != hidden || d0.n != hidden || d0.k != g0.n || K < 1 || K > E)
        cu_fatal("moe", "expert shapes that do not match the layer", __FILE__, __LINE__);
    if (sizeof(float) * (size_t)E + 8 * (size_t)K > 48 * 1024)
        cu_fatal("moe", "more experts than the routing kernel holds", __FILE__, __LINE__);
    const moe_table *t = moe_table_get(c, p);
    const int inner = (int)g0.n;
    /* growing flushes what was recorded before: the operation is recorded after it */
    c->moe_ws = grow(c, c->moe_ws, &c->moe_ws_cap, cu_moe_scratch_bytes(rows, K, E, inner, hidden));
    op *o = record(c, OP_MOE);
    cu_moe_args &a = o->me;
    a.out = out;
    a.x = x;
    a.router = router;
    a.gate = t->d;
    a.up = t->d + E;
    a.down = t->d + 2 * E;
    a.ex_gu = g0;
    a.ex_down = d0;
    a.uniform_gu = t->uniform_gu;
    a.uniform_down = t->uniform_down;
    a.rows = rows;
    a.hidden = hidden;
    a.inner = inner;
    a.n_experts = E;
    a.top_k = K;
    a.norm_topk = p->norm_topk;
    a.expert_scale = t->expert_scale;
    a.gelu = p->act == ACT_GELU_TANH;
    a.grouped = rows > CU_GEMV_MAX_M;
    /* batch-invariant mode: each entry's result as the per-entry products give it, whatever
     * the rows (as the dense products) */
    a.exact = c->invariant;
    cu_moe_carve(&a, c->moe_ws);
}

/* Recorded behind the tape's operations; with none recorded (between steps, as the engine
 * copies recurrent states) launched at once, in stream order all the same. */
static void cu_copy_op(void *ctx, void *dst, const void *src, size_t bytes)
{
    cu_ctx *c = (cu_ctx *)ctx;
    if (!c->n_ops) {
        CU(cudaSetDevice(c->dev));
        cu_copy(c->st, dst, src, bytes);
        return;
    }
    op *o = record(c, OP_COPY);
    o->p[0] = dst;
    o->p[1] = src;
    o->n = (int64_t)bytes;
}

static void cu_info(void *ctx, struct backend_info *out)
{
    cu_ctx *c = (cu_ctx *)ctx;
    memset(out, 0, sizeof *out);
    CU(cudaSetDevice(c->dev));
    snprintf(out->device, sizeof out->device, "%.100s (cuda:%d, sm_%d%d, %d SMs)", c->prop.name,
             c->dev, c->prop.major, c->prop.minor, c->prop.multiProcessorCount);
    size_t fr = 0, tot = 0;
    CU(cudaMemGetInfo(&fr, &tot));
    out->mem_total = tot;
    out->mem_free = fr;
    out->kv_value_bytes = 2;
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Medians of the replayed steps' device times (PAGODA_CUDA_TRACE). */
static void trace_graph_report(cu_ctx *c)
{
    if (c->n_g) {
        int ng = 0;
        for (int i = 0; i < c->n_g; i++)
            if (c->g_gap[i] >= 0) c->g_gap[ng++] = c->g_gap[i];
        qsort(c->g_span, (size_t)c->n_g, sizeof(float), cmp_float);
        qsort(c->g_gap, (size_t)ng, sizeof(float), cmp_float);
        fprintf(stderr,
                "cuda: device time a replayed step (us, median of %d): graph %.1f; from the "
                "previous graph's end (%d): %.1f\n",
                c->n_g, c->g_span[c->n_g / 2], ng, ng ? c->g_gap[ng / 2] : 0.0f);
    }
    for (int i = 0; i < 4; i++) {
        CU(cudaEventDestroy(c->g_start[i]));
        CU(cudaEventDestroy(c->g_end[i]));
    }
    free(c->g_span);
    free(c->g_gap);
}

/* ---- tensor-parallel groups ---- */

static int cu_group_create(void *ctx, int size, void *const *members, struct err *e)
{
    (void)ctx;
    int devs[64] = {0};
    if (size < 1 || size > 64) return err_set(e, "a group of %d GPUs (1 to 64)", size);
    for (int r = 0; r < size; r++) {
        devs[r] = ((cu_ctx *)members[r])->dev;
        for (int q = 0; q < r; q++)
            if (devs[q] == devs[r])
                return err_set(e, "ranks %d and %d of the group are both on cuda:%d", q, r,
                               devs[r]);
    }
    void *comms[64];
    char msg[300];
    if (cu_group_init(comms, size, devs, msg, sizeof msg)) return err_set(e, "%s", msg);
    /* the one-shot exchange where the GPUs map each other's memory, unless turned off
     * (backend_custom_all_reduce_set); NCCL's alone otherwise */
    const char *env = getenv("PAGODA_CUDA_CUSTOM_ALL_REDUCE");
    cu_ar *ar = NULL;
    if (size > 1 && !(env && !strcmp(env, "0"))) {
        ar = cu_ar_create(size, devs, msg, sizeof msg);
        if (!ar) fprintf(stderr, "pagoda: cuda: every exchange through NCCL: %s\n", msg);
    }
    for (int r = 0; r < size; r++) {
        cu_ctx *c = (cu_ctx *)members[r];
        c->comm = comms[r];
        c->grp_rank = r;
        c->grp_size = size;
        c->ar = ar;
        c->arp = ar ? cu_ar_rank(ar, r) : NULL;
    }
    return 0;
}

static void cu_all_reduce_op(void *ctx, float *x, int64_t n)
{
    cu_ctx *c = (cu_ctx *)ctx;
    op *o = record(c, OP_ALL_REDUCE);
    o->p[0] = x;
    o->n = n;
    o->i[0] = c->arp && cu_ar_fits(n, x, NULL, NULL, NULL, NULL); /* 1: one-shot, 0: NCCL */
}

static void cu_all_gather_op(void *ctx, float *out, const float *in, int rows, int cols)
{
    cu_ctx *c = (cu_ctx *)ctx;
    c->gath = (float *)grow(c, c->gath, &c->gath_cap,
                            sizeof(float) * (size_t)rows * (size_t)cols * (size_t)c->grp_size);
    op *o = record(c, OP_ALL_GATHER);
    o->p[0] = out;
    o->p[1] = in;
    o->p[2] = c->gath;
    o->i[0] = rows;
    o->i[1] = cols;
}

static void cu_submit(void *ctx)
{
    flush((cu_ctx *)ctx);
}

static void cu_destroy(void *ctx)
{
    cu_ctx *c = (cu_ctx *)ctx;
    flush(c);
    prof_report(c);
    cu_ktrace_stop();
    if (c->trace)
        fprintf(stderr,
                "cuda: %ld graphs captured (%.1f ms capturing and instantiating), %ld replays, "
                "%ld eager flushes\n",
                c->n_captures, c->capture_ms, c->n_replays, c->n_eager);
    if (c->trace && c->h_replays && c->h_steps)
        fprintf(stderr,
                "cuda: host time a replayed step (us, %ld): recording %.1f, graph lookup %.1f, "
                "launch call %.1f; a step after a token pick (%ld): waiting for the tokens "
                "%.1f, the caller between steps %.1f\n",
                c->h_replays, 1e3 * c->h_record / c->h_replays, 1e3 * c->h_find / c->h_replays,
                1e3 * c->h_launch / c->h_replays, c->h_steps, 1e3 * c->h_wait / c->h_steps,
                1e3 * c->h_caller / c->h_steps);
    if (c->trace) trace_graph_report(c);
    for (int i = 0; i < c->ev_cap; i++) CU(cudaEventDestroy(c->ev[i]));
    free(c->ev);
    CU(cudaSetDevice(c->dev));
    CU(cudaStreamSynchronize(c->st));
    graphs_clear(c);
    for (int i = 0; i < c->n_w; i++) {
        CU(cudaFree(c->walloc[i]));
        free(c->wdesc[i]);
    }
    free(c->walloc);
    free(c->wdesc);
    if (c->d_meta) CU(cudaFree(c->d_meta));
    if (c->h_meta) CU(cudaFreeHost(c->h_meta));
    if (c->d_tiles) CU(cudaFree(c->d_tiles));
    if (c->h_tiles) CU(cudaFreeHost(c->h_tiles));
    if (c->xb) CU(cudaFree(c->xb));
    if (c->ycat) CU(cudaFree(c->ycat));
    if (c->tq) CU(cudaFree(c->tq));
    if (c->gath) CU(cudaFree(c->gath));
    cu_ar_leave(c->ar, c->grp_rank);
    cu_group_leave(c->comm);
    if (c->part) CU(cudaFree(c->part));
    if (c->sem) CU(cudaFree(c->sem));
    if (c->d_small) CU(cudaFree(c->d_small));
    if (c->d_amax_slot) CU(cudaFree(c->d_amax_slot));
    for (int i = 0; i < 2; i++) {
        if (c->h_pick[i]) CU(cudaFreeHost(c->h_pick[i]));
        CU(cudaEventDestroy(c->pick_done[i]));
    }
    CU(cudaEventDestroy(c->staged));
    if (c->d_sample) CU(cudaFree(c->d_sample));
    for (int i = 0; i < c->n_moe_tabs; i++) {
        CU(cudaFree(c->moe_tabs[i].d));
        if (c->moe_tabs[i].expert_scale) CU(cudaFree(c->moe_tabs[i].expert_scale));
    }
    free(c->moe_tabs);
    if (c->moe_ws) CU(cudaFree(c->moe_ws));
    CU(cudaEventDestroy(c->fork));
    for (int j = 0; j < 2; j++) {
        CU(cudaStreamDestroy(c->side[j]));
        CU(cudaEventDestroy(c->join[j]));
        CU(cudaFree(c->side_ws[j]));
    }
    cu_copier_destroy(c->copier);
    cu_gemm_ctx_destroy(&c->g);
    cublasLtDestroy(c->g.lt);
    CU(cudaFree(c->g.workspace));
    CU(cudaStreamDestroy(c->st));
    free(c->tape);
    free(c);
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .async_picks = 1,
    .kv_value_bytes = 2,
    /* no ternary products yet: BitNet models are refused when they load */
    .bitnet = 1,
    .kv_dtypes = (1u << KV_DTYPE_COUNT) - 4, /* all but f32 (auto here is bf16) */
    .info = cu_info,
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .weight_prepare = cu_weight_prepare,
    .batch_begin = cu_batch_begin,
    .attn_check = cu_attn_check,
    .embed = cu_embed_op,
    .matmul = cu_matmul_op,
    .add_bias = cu_add_bias_op,
    .rms_norm = cu_rms_norm_op,
    .rope = cu_rope_op,
    .rope_tables = cu_rope_tables_op,
    .kv_store = cu_kv_store_op,
    .attention = cu_attention_op,
    .act_mul = cu_act_mul_op,
    .add = cu_add_op,
    .softcap = cu_softcap_op,
    .gather_rows = cu_gather_rows_op,
    .argmax = cu_argmax_op,
    .picks = cu_picks,
    .destroy = cu_destroy,
    .sample = NULL,
    .rope_partial = cu_rope_partial_op,
    .split_qgate = cu_split_qgate_op,
    .gate_mul = cu_gate_mul_op,
    .rms_norm_gated = cu_rms_norm_gated_op,
    .delta_net = cu_delta_net_op,
    .moe = cu_moe_op,
    .copy = cu_copy_op,
    /* Gemma 4's scalars are not on this backend yet: models that need them are refused when
     * they load */
    .scale = cu_scale_op,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .copy_setup = cu_copy_setup,
    .copy_block = cu_copy_block,
    .copy_mark = cu_copy_mark,
    .copy_done = cu_copy_done,
    .copy_fence = cu_copy_fence,
    .copy_seconds = cu_copy_seconds,
    .host_map = cu_host_map,
    .host_unmap = cu_host_unmap,
    .group_create = cu_group_create,
    .all_reduce = cu_all_reduce_op,
    .all_gather = cu_all_gather_op,
    .submit = cu_submit,
};

int backend_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* An on/off knob: "1" on, "0" off, anything else (or unset) its default. */
static int env_flag(const char *name, int dflt)
{
    const char *v = getenv(name);
    if (v && !strcmp(v, "1")) return 1;
    if (v && !strcmp(v, "0")) return 0;
    return dflt;
}

int backend_cuda_create(struct backend *be, int device, struct err *e)
{
    int n = backend_cuda_device_count();
    if (device >= n)
        return err_set(e, "--device cuda:%d: %s", device,
                       n ? "no such GPU" : "no CUDA GPU is visible to this process");
    cu_ctx *c = (cu_ctx *)calloc(1, sizeof *c);
    if (!c) return err_set(e, "out of host memory");
    c->dev = device;
    CU(cudaSetDevice(device));
    CU(cudaGetDeviceProperties(&c->prop, device));
    if (c->prop.major < 8) {
        err_set(e, "cuda:%d (%.100s) has compute capability %d.%d; pagoda needs 8.0 or newer",
                device, c->prop.name, c->prop.major, c->prop.minor);
        free(c);
        return -1;
    }
    CU(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&c->staged, cudaEventDisableTiming));
    for (int i = 0; i < 2; i++)
        CU(cudaEventCreateWithFlags(&c->pick_done[i], cudaEventDisableTiming));
    if (cublasLtCreate(&c->g.lt) != CUBLAS_STATUS_SUCCESS)
        cu_fatal("cublasLtCreate", "cannot create a cuBLASLt handle", __FILE__, __LINE__);
    c->g.workspace_bytes = CU_WORKSPACE;
    CU(cudaMalloc(&c->g.workspace, c->g.workspace_bytes));
    const char *env = getenv("PAGODA_CUDA_GRAPHS");
    c->graphs_on = !(env && !strcmp(env, "0"));
    env = getenv("PAGODA_CUDA_TRACE");
    c->trace = env && !strcmp(env, "1");
    if (c->trace) {
        for (int i = 0; i < 4; i++) {
            CU(cudaEventCreate(&c->g_start[i]));
            CU(cudaEventCreate(&c->g_end[i]));
        }
        c->g_span = (float *)malloc(sizeof(float) * CU_TRACE_STEPS);
        c->g_gap = (float *)malloc(sizeof(float) * CU_TRACE_STEPS);
        if (!c->g_span || !c->g_gap) cu_fatal("malloc", "out of host memory", __FILE__, __LINE__);
    }
    env = getenv("PAGODA_CUDA_KTRACE");
    if (env && *env) cu_ktrace_start(env);
    env = getenv("PAGODA_CUDA_PROFILE");
    c->prof = !env                      ? 0
              : !strcmp(env, "1")       ? 1
              : !strcmp(env, "decode")  ? 2
              : !strcmp(env, "prefill") ? 3
                                        : 0;
    env = getenv("PAGODA_CUDA_FUSE");
    c->fuse = !(env && !strcmp(env, "0"));
    env = getenv("PAGODA_CUDA_BATCH_INVARIANT");
    c->invariant = env && !strcmp(env, "1");
    env = getenv("PAGODA_CUDA_ATTN");
    c->attn_mode = env && !strcmp(env, "tc") ? 2 : env && !strcmp(env, "simt") ? 1 : 0;
    if (c->attn_mode != 1) cu_attention_init();
    cu_gemv_tc_init();
    c->dec_cluster = c->prop.major >= 9;
    /* the products of a set of more than 8 rows over one x run at the same time on side
     * streams, each with its own cuBLASLt workspace */
    CU(cudaEventCreateWithFlags(&c->fork, cudaEventDisableTiming));
    for (int j = 0; j < 2; j++) {
        CU(cudaStreamCreateWithFlags(&c->side[j], cudaStreamNonBlocking));
        CU(cudaEventCreateWithFlags(&c->join[j], cudaEventDisableTiming));
        CU(cudaMalloc(&c->side_ws[j], c->g.workspace_bytes));
    }
    c->early_launch = c->prop.major >= 9;
    /* GPU sampling (PAGODA_CUDA_SAMPLE=0: the host's) */
    c->ops = cuda_ops;
    if (env_flag("PAGODA_CUDA_SAMPLE", 1)) c->ops.sample = cu_sample_op;
    be->ops = &c->ops;
    be->ctx = c;
    return 0;
}
