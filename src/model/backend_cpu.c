/* The CPU backend: float32 activations in host memory, kernels from kernels/cpu. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/scratch.h"
#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "model/backend.h"
#include "paged_kv/kv_quant.h"

/* A tensor-parallel group of CPU backends (model/tp.h): each rank runs on a thread of its
 * own, and a collective is two barriers around the ranks' reads of each other's buffers. */
struct cpu_group {
    int size, refs;
    pthread_barrier_t bar;
    pthread_mutex_t mu;
    float *buf[8];      /* each rank's buffer of the collective under way */
    const float *in[8]; /* all_gather: each rank's input */
};

struct cpu_ctx {
    struct cpu_group *grp; /* NULL outside a group */
    int rank;
    struct threadpool *tp;
    int32_t *tok_seq; /* [cap] sequence of each token of the current step */
    int tok_cap;
    /* picks not yet read back (argmax with out NULL), oldest first from slot pick_first */
    int32_t *pick[2];
    int pick_cap[2], pick_n[2], pick_first, pick_pending;
};

/* A call out of the order the backend table states: a bug in the caller. */
static void misuse(const char *what)
{
    fprintf(stderr, "pagoda: cpu backend: %s\n", what);
    abort();
}

/* Zeroed, 64-byte aligned. calloc hands large blocks out as fresh pages that the kernel
 * zeroes on first touch, so a big KV pool costs nothing until it is used. The pointer the
 * allocator returned sits just before the aligned one. */
static void *cpu_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    char *raw = calloc(1, bytes + 64 + sizeof(void *));
    if (!raw) return NULL;
    uintptr_t a = ((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63;
    ((void **)a)[-1] = raw;
    return (void *)a;
}

static void cpu_free(void *ctx, void *p)
{
    (void)ctx;
    if (p) free(((void **)p)[-1]);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, src, bytes);
}

static int cpu_weight_prepare(void *ctx, struct qweight *w, struct err *e)
{
    (void)ctx;
    (void)w;
    (void)e;
    return 0; /* consumed in place from the mapping */
}

/* Maps each token of the step to its sequence, for attention. The map grows to the
 * largest step seen and is then reused. */
static void cpu_batch_begin(void *ctx, const struct fwd_batch *b)
{
    struct cpu_ctx *c = ctx;
    if (b->n_tokens > c->tok_cap) {
        c->tok_cap = b->n_tokens;
        c->tok_seq = xrealloc(c->tok_seq, sizeof(int32_t) * (size_t)c->tok_cap);
    }
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->q_start[s]; t < b->q_start[s + 1]; t++) c->tok_seq[t] = s;
}

static void cpu_embed(void *ctx, float *out, const struct qweight *table, const struct fwd_batch *b,
                      float scale)
{
    struct cpu_ctx *c = ctx;
    const int32_t *last =
        c->pick_pending ? c->pick[(c->pick_first + c->pick_pending - 1) % 2] : NULL;
    for (int t = 0; t < b->n_tokens; t++) {
        int32_t id = b->tokens[t];
        if (b->pick_rows && b->pick_rows[t] >= 0) {
            if (!last) misuse("a step takes picked tokens but no pick is pending");
            id = last[b->pick_rows[t]];
        }
        cpu_embed_row(table, id, scale, out + (size_t)t * table->k);
    }
}

static void cpu_matmul_op(void *ctx, float *y, const float *x, const struct qweight *w, int m)
{
    struct cpu_ctx *c = ctx;
    cpu_matmul(c->tp, y, x, w, m);
}

static void cpu_add_bias(void *ctx, float *y, const float *bias, int m, int n)
{
    (void)ctx;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) y[(size_t)i * n + j] += bias[j];
}

static void cpu_rms_norm_op(void *ctx, float *out, const float *x, const float *w, int rows,
                            int dim, float eps)
{
    (void)ctx;
    cpu_rms_norm(out, x, w, rows, dim, eps);
}

static void cpu_rope_op(void *ctx, float *x, int rows, int heads, int d, const float *cos_t,
                        const float *sin_t)
{
    (void)ctx;
    cpu_rope(x, rows, heads, d, cos_t, sin_t);
}

static void cpu_kv_store(void *ctx, const struct kv_layer *kv, const struct kv_geom *g,
                         const float *k, const float *v, const struct fwd_batch *b)
{
    (void)ctx;
    if (g->k_dtype != KV_DTYPE_AUTO) {
        cpu_kv_store_q(kv, g, k, v, b);
        return;
    }
    size_t row = (size_t)g->n_kv_heads * g->head_dim;
    for (int t = 0; t < b->n_tokens; t++) {
        memcpy(kv->k + (size_t)b->slot[t] * row, k + (size_t)t * row, row * sizeof(float));
        memcpy(kv->v + (size_t)b->slot[t] * row, v + (size_t)t * row, row * sizeof(float));
    }
}

static void cpu_attention(void *ctx, float *out, const float *q, const struct kv_layer *kv,
                          const struct kv_geom *g, const struct fwd_batch *b,
                          const struct attn_params *p)
{
    struct cpu_ctx *c = ctx;
    cpu_attention_q(c->tp, out, q, kv, g, b, p, c->tok_seq);
}

static void cpu_act_mul(void *ctx, float *out, const float *gate, const float *up, int64_t n,
                        enum act_kind act)
{
    (void)ctx;
    if (act == ACT_SILU)
        cpu_silu_mul(out, gate, up, n);
    else if (act == ACT_RELU2)
        cpu_relu2_mul(out, gate, up, n);
    else
        cpu_gelu_tanh_mul(out, gate, up, n);
}

static void cpu_add(void *ctx, float *x, const float *y, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static void cpu_softcap_op(void *ctx, float *x, int64_t n, float cap)
{
    (void)ctx;
    cpu_softcap(x, n, cap);
}

static void cpu_gather_rows(void *ctx, float *dst, const float *src, const int32_t *rows, int n,
                            int dim)
{
    (void)ctx;
    for (int i = 0; i < n; i++)
        memmove(dst + (size_t)i * dim, src + (size_t)rows[i] * dim, sizeof(float) * (size_t)dim);
}

static void cpu_argmax(void *ctx, int32_t *out, const float *x, int rows, int n)
{
    struct cpu_ctx *c = ctx;
    if (!out) { /* kept for picks() and the next step's pick_rows */
        if (c->pick_pending == 2) misuse("a third pick started before one was read");
        int s = (c->pick_first + c->pick_pending) % 2;
        if (rows > c->pick_cap[s]) {
            c->pick_cap[s] = rows;
            c->pick[s] = xrealloc(c->pick[s], sizeof(int32_t) * (size_t)rows);
        }
        c->pick_n[s] = rows;
        c->pick_pending++;
        out = c->pick[s];
    }
    for (int r = 0; r < rows; r++) {
        const float *v = x + (size_t)r * n;
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (v[i] > v[best]) best = i;
        out[r] = best;
    }
}

static void cpu_picks(void *ctx, int32_t *out, int rows)
{
    struct cpu_ctx *c = ctx;
    if (!c->pick_pending) misuse("picks read with none pending");
    int s = c->pick_first;
    if (rows > c->pick_n[s]) misuse("more picks read than the pick has rows");
    memcpy(out, c->pick[s], sizeof(int32_t) * (size_t)rows);
    c->pick_first = (s + 1) % 2;
    c->pick_pending--;
}

static void cpu_rope_partial_op(void *ctx, float *x, int rows, int heads, int d, int rot,
                                const float *cos_t, const float *sin_t)
{
    (void)ctx;
    cpu_rope_partial(x, rows, heads, d, rot, cos_t, sin_t);
}

static void cpu_split_qgate(void *ctx, float *q, float *gate, const float *qg, int rows, int heads,
                            int d)
{
    (void)ctx;
    for (long i = 0; i < (long)rows * heads; i++) {
        memcpy(q + (size_t)i * d, qg + (size_t)i * 2 * d, sizeof(float) * (size_t)d);
        memcpy(gate + (size_t)i * d, qg + (size_t)i * 2 * d + d, sizeof(float) * (size_t)d);
    }
}

static void cpu_gate_mul(void *ctx, float *x, const float *g, int rows, int n, int gn)
{
    (void)ctx;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            float v = g[(size_t)r * gn + (gn == 1 ? 0 : j)];
            x[(size_t)r * n + j] *= 1.0f / (1.0f + expf(-v));
        }
}

static void cpu_rms_norm_gated_op(void *ctx, float *out, const float *x, const float *z,
                                  const float *w, int rows, int dim, float eps)
{
    (void)ctx;
    cpu_rms_norm_gated(out, x, z, w, rows, dim, eps);
}

static void cpu_delta_net_op(void *ctx, float *out, float *qkv, const float *beta_in,
                             const float *a, const struct state_layer *st,
                             const struct delta_params *p, const struct fwd_batch *b)
{
    struct cpu_ctx *c = ctx;
    cpu_delta_net(c->tp, out, qkv, beta_in, a, st, p, b);
}

static void cpu_moe_op(void *ctx, float *out, const float *x, const float *router,
                       const struct moe_params *p, int rows, int hidden)
{
    struct cpu_ctx *c = ctx;
    cpu_moe(c->tp, out, x, router, p, rows, hidden);
}

static void cpu_scale(void *ctx, float *x, int64_t n, float s)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

static void cpu_info(void *ctx, struct backend_info *out)
{
    struct cpu_ctx *c = ctx;
    memset(out, 0, sizeof *out);
    snprintf(out->device, sizeof out->device, "cpu (%d threads)", tp_size(c->tp));
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES),
         psz = sysconf(_SC_PAGESIZE);
    out->mem_total = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
    out->mem_free = avail > 0 && psz > 0 ? (size_t)avail * (size_t)psz : 0;
    out->kv_value_bytes = (int)sizeof(float);
}

static int cpu_group_create(void *ctx, int size, void *const *members, struct err *e)
{
    (void)ctx;
    if (size < 1 || size > 8) return err_set(e, "a CPU group of %d ranks (1 to 8)", size);
    struct cpu_group *g = xcalloc(1, sizeof *g);
    g->size = g->refs = size;
    pthread_barrier_init(&g->bar, NULL, (unsigned)size);
    pthread_mutex_init(&g->mu, NULL);
    for (int r = 0; r < size; r++) {
        struct cpu_ctx *c = members[r];
        c->grp = g;
        c->rank = r;
    }
    return 0;
}

/* Rank r adds up elements [n r / size, n (r + 1) / size) of every rank's x, in rank order,
 * and writes the sums into every rank's x: the same floats everywhere. */
static void cpu_all_reduce(void *ctx, float *x, int64_t n)
{
    struct cpu_ctx *c = ctx;
    struct cpu_group *g = c->grp;
    g->buf[c->rank] = x;
    pthread_barrier_wait(&g->bar);
    int64_t lo = n * c->rank / g->size, hi = n * (c->rank + 1) / g->size;
    for (int64_t i = lo; i < hi; i++) {
        float sum = g->buf[0][i];
        for (int r = 1; r < g->size; r++) sum += g->buf[r][i];
        for (int r = 0; r < g->size; r++) g->buf[r][i] = sum;
    }
    pthread_barrier_wait(&g->bar);
}

static void cpu_all_gather(void *ctx, float *out, const float *in, int rows, int cols)
{
    struct cpu_ctx *c = ctx;
    struct cpu_group *g = c->grp;
    g->in[c->rank] = in;
    pthread_barrier_wait(&g->bar);
    size_t row = sizeof(float) * (size_t)cols;
    for (int r = 0; r < g->size; r++)
        for (int i = 0; i < rows; i++)
            memcpy(out + ((size_t)i * g->size + r) * cols, g->in[r] + (size_t)i * cols, row);
    pthread_barrier_wait(&g->bar);
}

static void cpu_destroy(void *ctx)
{
    struct cpu_ctx *c = ctx;
    if (c->grp) {
        struct cpu_group *g = c->grp;
        pthread_mutex_lock(&g->mu);
        int last = --g->refs == 0;
        pthread_mutex_unlock(&g->mu);
        if (last) {
            pthread_barrier_destroy(&g->bar);
            pthread_mutex_destroy(&g->mu);
            free(g);
        }
    }
    tp_destroy(c->tp);
    free(c->tok_seq);
    free(c->pick[0]);
    free(c->pick[1]);
    free(c);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .kv_value_bytes = sizeof(float),
    .bitnet = 1,
    .kv_dtypes = (1u << KV_DTYPE_COUNT) - 2, /* every format */
    .info = cpu_info,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .weight_prepare = cpu_weight_prepare,
    .batch_begin = cpu_batch_begin,
    .embed = cpu_embed,
    .matmul = cpu_matmul_op,
    .add_bias = cpu_add_bias,
    .rms_norm = cpu_rms_norm_op,
    .rope = cpu_rope_op,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .act_mul = cpu_act_mul,
    .add = cpu_add,
    .softcap = cpu_softcap_op,
    .gather_rows = cpu_gather_rows,
    .argmax = cpu_argmax,
    .picks = cpu_picks,
    .destroy = cpu_destroy,
    .rope_partial = cpu_rope_partial_op,
    .split_qgate = cpu_split_qgate,
    .gate_mul = cpu_gate_mul,
    .rms_norm_gated = cpu_rms_norm_gated_op,
    .delta_net = cpu_delta_net_op,
    .moe = cpu_moe_op,
    .copy = cpu_copy,
    .scale = cpu_scale,
    .group_create = cpu_group_create,
    .all_reduce = cpu_all_reduce,
    .all_gather = cpu_all_gather,
};

int backend_cpu_create(struct backend *be, int threads, struct err *e)
{
    (void)e;
    cpu_kernels_init();
    struct cpu_ctx *c = xcalloc(1, sizeof *c);
    c->tp = tp_create(threads);
    be->ops = &cpu_ops;
    be->ctx = c;
    return 0;
}

void backend_destroy(struct backend *be)
{
    if (be->ops) be->ops->destroy(be->ctx);
    be->ops = NULL;
    be->ctx = NULL;
}
