/*
 * Routed experts on the CPU (backend_ops.moe): each row's top-k experts by router logit,
 * their outputs weighted by the softmax and added in expert order.
 *
 * A decode step (few rows) runs every chosen expert at once in two pool jobs: the gate and
 * up products of all of them split by inner rows, then the down products split by output
 * columns, each thread adding its columns of every expert into the rows in expert order.
 * One expert at a time would cost three pool hand-offs an expert (24 a layer at top 8),
 * each longer than the product itself (an expert's 512 x 1024 product at 4 bits is 0.3 MB,
 * about 15 us on one core). Larger steps run one expert at a time over the rows routed to
 * it, through cpu_matmul. Both compute every product with the matmul kernels'
 * batch-invariant arithmetic over the same inputs, so a row's output does not depend on the
 * path, the other rows or the thread count.
 */
#include <math.h>
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/impl.h"

/* Steps of at most this many rows take the two-job path. Its buffers hold every (row,
 * expert) pair at once: 16 rows at top 8, hidden 4096 and inner 1536 are about 8 MB. */
#define MOE_FUSED_MAX_ROWS 16

/* A step's routing: entries (row r, slot i) = r * K + i, their expert ids and weights, and
 * the entries sorted by expert: expert e owns list[start[e], start[e + 1]). */
struct moe_route {
    int32_t *sel;   /* [rows * K] */
    float *wt;      /* [rows * K] */
    int32_t *list;  /* [rows * K] entries in expert order (rows ascending within one) */
    int32_t *start; /* [E + 1] */
};

/* The K largest of E logits, largest first, ties to the lower index, in one pass that keeps
 * them sorted: O(E) compares, plus at most K moves for each logit that enters. */
static void top_k(const float *lg, int E, int K, int32_t *out)
{
    int n = 0;
    for (int e = 0; e < E; e++) {
        float v = lg[e];
        if (n == K && !(v > lg[out[K - 1]])) continue;
        int j = n < K ? n++ : K - 1;
        for (; j > 0 && v > lg[out[j - 1]]; j--) out[j] = out[j - 1];
        out[j] = e;
    }
}

static void moe_route(const float *router, const struct moe_params *p, int rows,
                      struct moe_route *rt)
{
    int E = p->n_experts, K = p->top_k;
    float *buf = scratch_get(SCRATCH_MOE_ROUTE, (size_t)rows * K * 3 + (size_t)E * 2 + 1);
    rt->sel = (int32_t *)buf;
    rt->wt = buf + (size_t)rows * K;
    rt->list = (int32_t *)(rt->wt + (size_t)rows * K);
    rt->start = rt->list + (size_t)rows * K;
    int32_t *fill = rt->start + E + 1; /* [E] */
    for (int r = 0; r < rows; r++) {
        const float *lg = router + (size_t)r * E;
        float mx = lg[0];
        for (int e = 1; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += expf(lg[e] - mx);
        int32_t *rs = rt->sel + (size_t)r * K;
        float *rw = rt->wt + (size_t)r * K;
        top_k(lg, E, K, rs);
        for (int i = 0; i < K; i++) rw[i] = (float)(expf(lg[rs[i]] - mx) / sum);
        if (p->norm_topk) {
            float tot = 0;
            for (int i = 0; i < K; i++) tot += rw[i];
            for (int i = 0; i < K; i++) rw[i] /= tot;
        }
        if (p->expert_scale)
            for (int i = 0; i < K; i++) rw[i] *= p->expert_scale[rs[i]];
    }
    memset(rt->start, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int i = 0; i < rows * K; i++) rt->start[rt->sel[i] + 1]++;
    for (int e = 0; e < E; e++) rt->start[e + 1] += rt->start[e];
    memcpy(fill, rt->start, sizeof(int32_t) * (size_t)E);
    for (int i = 0; i < rows * K; i++) rt->list[fill[rt->sel[i]]++] = i;
}

static void act_mul(enum act_kind act, float *g, const float *u, int64_t n)
{
    if (act == ACT_SILU)
        cpu_silu_mul(g, g, u, n);
    else
        cpu_gelu_tanh_mul(g, g, u, n);
}

/* ---- one expert at a time (larger steps) ---- */

static void moe_by_expert(struct threadpool *tp, float *out, const float *x,
                          const struct moe_params *p, const struct moe_route *rt, int hidden)
{
    int E = p->n_experts, K = p->top_k;
    for (int e = 0; e < E; e++) {
        int n = rt->start[e + 1] - rt->start[e];
        if (!n) continue;
        int inner = (int)p->gate[e].n;
        const int32_t *ent = rt->list + rt->start[e];
        float *xe = scratch_get(SCRATCH_MOE_X, (size_t)n * hidden);
        float *ge = scratch_get(SCRATCH_MOE_G, (size_t)n * inner);
        float *ue = scratch_get(SCRATCH_MOE_U, (size_t)n * inner);
        for (int i = 0; i < n; i++)
            memcpy(xe + (size_t)i * hidden, x + (size_t)(ent[i] / K) * hidden,
                   sizeof(float) * (size_t)hidden);
        cpu_matmul(tp, ge, xe, &p->gate[e], n);
        cpu_matmul(tp, ue, xe, &p->up[e], n);
        act_mul(p->act, ge, ue, (int64_t)n * inner);
        cpu_matmul(tp, xe, ge, &p->down[e], n);
        for (int i = 0; i < n; i++) {
            float w = rt->wt[ent[i]], *o = out + (size_t)(ent[i] / K) * hidden;
            const float *y = xe + (size_t)i * hidden;
            for (int c = 0; c < hidden; c++) o[c] += y[c] * w;
        }
    }
}

/* ---- every expert at once (decode steps) ---- */

/* Inputs of one product family (the gate and up products, or the down products): entry j
 * of the expert order reads x row j (`ldx` floats apart) and its prepared form (`stride`
 * bytes apart), or with `shared` set every entry reads row 0 (a one-row step). */
struct moe_in {
    const float *x;
    const uint8_t *xp;
    size_t stride;
    int64_t ldx;
    int shared;
};

struct moe_job {
    const struct moe_params *p;
    const struct moe_route *rt;
    int rows, hidden, inner;
    struct moe_in in, mid; /* the gate/up inputs; the down inputs (g) */
    float *g, *u, *y;      /* [entries][inner] x2, [entries][hidden], in expert order */
    float *out;
};

static void in_rows(const struct moe_in *in, int j, const float **x, const uint8_t **xp)
{
    int64_t row = in->shared ? 0 : j;
    *x = in->x + row * in->ldx;
    *xp = in->xp ? in->xp + (size_t)row * in->stride : NULL;
}

/* Inner rows [lo, hi) of every chosen expert's gate and up products, then the activation. */
static void moe_up_task(void *arg, int ith, int nth)
{
    struct moe_job *j = arg;
    const struct moe_params *p = j->p;
    long lo, hi;
    tp_range(j->inner, ith, nth, 16, &lo, &hi);
    if (lo >= hi) return;
    for (int e = 0; e < p->n_experts; e++) {
        int s = j->rt->start[e], n = j->rt->start[e + 1] - s;
        if (!n) continue;
        const float *x;
        const uint8_t *xp;
        in_rows(&j->in, s, &x, &xp);
        int ld = j->inner;
        /* gate and up alternate every 32 rows: two weight streams in flight at once keep
         * more of the memory system busy than one (random experts of the scaled Qwen3.6
         * shape on one core: 0 to 18 %, typically 5 %, more bytes a second); an output row
         * is the same whatever range computes it */
        for (long r = lo; r < hi; r += 32) {
            long r1 = r + 32 < hi ? r + 32 : hi;
            cpu_impl->matmul(&p->gate[e], r, r1, x, xp, j->in.stride, n, j->g + (size_t)s * ld, ld);
            cpu_impl->matmul(&p->up[e], r, r1, x, xp, j->in.stride, n, j->u + (size_t)s * ld, ld);
        }
        for (int i = s; i < s + n; i++)
            act_mul(p->act, j->g + (size_t)i * ld + lo, j->u + (size_t)i * ld + lo, hi - lo);
    }
}

/* Output columns [lo, hi) of every chosen expert's down product, added into the rows in
 * expert order (the order moe_by_expert adds them in). */
static void moe_down_task(void *arg, int ith, int nth)
{
    struct moe_job *j = arg;
    const struct moe_params *p = j->p;
    int K = p->top_k, H = j->hidden;
    long lo, hi;
    tp_range(H, ith, nth, 16, &lo, &hi);
    if (lo >= hi) return;
    for (int r = 0; r < j->rows; r++)
        memset(j->out + (size_t)r * H + lo, 0, sizeof(float) * (size_t)(hi - lo));
    for (int e = 0; e < p->n_experts; e++) {
        int s = j->rt->start[e], n = j->rt->start[e + 1] - s;
        if (!n) continue;
        const float *x;
        const uint8_t *xp;
        in_rows(&j->mid, s, &x, &xp);
        cpu_impl->matmul(&p->down[e], lo, hi, x, xp, j->mid.stride, n, j->y + (size_t)s * H, H);
        for (int i = s; i < s + n; i++) {
            int ent = j->rt->list[i];
            float w = j->rt->wt[ent], *o = j->out + (size_t)(ent / K) * H;
            const float *y = j->y + (size_t)i * H;
            for (long c = lo; c < hi; c++) o[c] += y[c] * w;
        }
    }
}

/* Whether a and b read their input in one prepared layout (the layout depends on the
 * format and the input width alone). */
static int same_prep(const struct qweight *a, const struct qweight *b)
{
    return a->fmt == b->fmt && a->bits == b->bits && a->group == b->group && a->k == b->k &&
           a->n == b->n;
}

/* Whether the step can run every expert at once: few rows, and one input layout for all
 * the gate and up products and one for all the down products. */
static int fused_fits(const struct moe_params *p, int rows)
{
    if (rows > MOE_FUSED_MAX_ROWS) return 0;
    for (int e = 0; e < p->n_experts; e++)
        if (!same_prep(&p->gate[e], &p->gate[0]) || !same_prep(&p->up[e], &p->gate[0]) ||
            !same_prep(&p->down[e], &p->down[0]))
            return 0;
    return 1;
}

static void moe_fused(struct threadpool *tp, float *out, const float *x, const struct moe_params *p,
                      const struct moe_route *rt, int rows, int hidden)
{
    int entries = rows * p->top_k, inner = (int)p->gate[0].n;
    size_t xs = (cpu_impl->prep_bytes(&p->gate[0]) + 63) / 64 * 64;
    size_t gs = (cpu_impl->prep_bytes(&p->down[0]) + 63) / 64 * 64;
    /* gate/up inputs: with one row every entry reads it; else the rows gathered in expert
     * order, each prepared once (a row's prepared form depends on the row alone) */
    int shared = rows == 1;
    const float *xin = x;
    uint8_t *xp = NULL;
    if (shared) {
        xp = (uint8_t *)scratch_get(SCRATCH_MOE_X, xs / sizeof(float) + 1);
        if (xs) cpu_impl->prep(&p->gate[0], x, 1, xp, xs);
    } else {
        float *xb = scratch_get(SCRATCH_MOE_X,
                                (size_t)entries * hidden + (rows + entries) * xs / sizeof(float));
        uint8_t *xp_rows = (uint8_t *)(xb + (size_t)entries * hidden);
        xp = xp_rows + (size_t)rows * xs;
        if (xs) cpu_impl->prep(&p->gate[0], x, rows, xp_rows, xs);
        for (int i = 0; i < entries; i++) {
            int r = rt->list[i] / p->top_k;
            memcpy(xb + (size_t)i * hidden, x + (size_t)r * hidden, sizeof(float) * (size_t)hidden);
            if (xs) memcpy(xp + (size_t)i * xs, xp_rows + (size_t)r * xs, xs);
        }
        xin = xb;
    }
    float *gb = scratch_get(SCRATCH_MOE_G, (size_t)entries * inner + entries * gs / sizeof(float));
    float *ub = scratch_get(SCRATCH_MOE_U, (size_t)entries * (inner + hidden));
    struct moe_job j = {
        .p = p,
        .rt = rt,
        .rows = rows,
        .hidden = hidden,
        .inner = inner,
        .in = {xin, xs ? xp : NULL, xs, hidden, shared},
        .mid = {gb, gs ? (uint8_t *)(gb + (size_t)entries * inner) : NULL, gs, inner, 0},
        .g = gb,
        .u = ub,
        .y = ub + (size_t)entries * inner,
        .out = out,
    };
    tp_run(tp, moe_up_task, &j);
    /* the down products' inputs, prepared on this thread: entries x inner values, a few
     * microseconds at decode sizes, less than another hand-off to the pool */
    if (gs) cpu_impl->prep(&p->down[0], gb, entries, (uint8_t *)j.mid.xp, gs);
    tp_run(tp, moe_down_task, &j);
}

void cpu_moe(struct threadpool *tp, float *out, const float *x, const float *router,
             const struct moe_params *p, int rows, int hidden)
{
    struct moe_route rt;
    moe_route(router, p, rows, &rt);
    if (fused_fits(p, rows)) {
        moe_fused(tp, out, x, p, &rt, rows, hidden);
        return;
    }
    memset(out, 0, sizeof(float) * (size_t)rows * hidden);
    moe_by_expert(tp, out, x, p, &rt, hidden);
}
