/* Paged attention over quantized KV head blocks (paged_kv/kv_quant.h): the codes are
 * decoded inside the dot products and the value sums, never into a copy of a block. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "common/scratch.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/impl.h"
#include "paged_kv/kv_quant.h"

void cpu_kv_store_q(const struct kv_layer *kv, const struct kv_geom *g, const float *k,
                    const float *v, const struct fwd_batch *b)
{
    int B = g->block_size, d = g->head_dim, H = g->n_kv_heads;
    size_t hbk = kv_head_block_bytes(g->k_dtype, KV_ROLE_K, B, d);
    size_t hbv = kv_head_block_bytes(g->v_dtype, KV_ROLE_V, B, d);
    uint8_t *kb = (uint8_t *)kv->k, *vb = (uint8_t *)kv->v;
    /* In batch order: a block's tokens arrive in position order, which the growing block
     * scales rely on. */
    for (int t = 0; t < b->n_tokens; t++) {
        size_t blk = (size_t)(b->slot[t] / B);
        int off = b->slot[t] % B;
        for (int h = 0; h < H; h++) {
            const float *kr = k + ((size_t)t * H + h) * d, *vr = v + ((size_t)t * H + h) * d;
            kv_store_row(g->k_dtype, KV_ROLE_K, kb + (blk * H + h) * hbk, off, B, d, kr,
                         g->k_scale);
            kv_store_row(g->v_dtype, KV_ROLE_V, vb + (blk * H + h) * hbv, off, B, d, vr,
                         g->v_scale);
        }
    }
}

/* q . row, row one token's codes; qp is the query prepared for the block (times the
 * channel scales for int keys; rotated for tq). */
static float dot_codes(int dt, const uint8_t *row, const float *qp, int d)
{
    float s = 0;
    switch (dt) {
    case KV_DTYPE_F32:
        for (int c = 0; c < d; c++) s += qp[c] * ((const float *)row)[c];
        return s;
    case KV_DTYPE_BF16:
        for (int c = 0; c < d; c++) s += qp[c] * bf16_to_f32(((const uint16_t *)row)[c]);
        return s;
    case KV_DTYPE_FP8:
        for (int c = 0; c < d; c++) s += qp[c] * kv_e4m3_value[row[c]];
        return s;
    case KV_DTYPE_INT8:
        for (int c = 0; c < d; c++) s += qp[c] * (float)((const int8_t *)row)[c];
        return s;
    case KV_DTYPE_INT4:
        for (int c = 0; c < d; c += 2) {
            uint8_t x = row[c >> 1];
            s += qp[c] * (float)((x & 15) - 8) + qp[c + 1] * (float)((x >> 4) - 8);
        }
        return s;
    case KV_DTYPE_TQ4: {
        const float *cb = kv_tq_codebook(4);
        for (int c = 0; c < d; c += 2) {
            uint8_t x = row[c >> 1];
            s += qp[c] * cb[x & 15] + qp[c + 1] * cb[x >> 4];
        }
        return s;
    }
    case KV_DTYPE_TQ3: {
        const float *cb = kv_tq_codebook(3);
        for (int c = 0; c < d; c += 8, row += 3) {
            uint32_t w = (uint32_t)row[0] | (uint32_t)row[1] << 8 | (uint32_t)row[2] << 16;
            for (int i = 0; i < 8; i++) s += qp[c + i] * cb[(w >> (3 * i)) & 7];
        }
        return s;
    }
    default: {
        const float *cb = kv_tq_codebook(2);
        for (int c = 0; c < d; c += 4) {
            uint8_t x = row[c >> 2];
            s += qp[c] * cb[x & 3] + qp[c + 1] * cb[(x >> 2) & 3] + qp[c + 2] * cb[(x >> 4) & 3] +
                 qp[c + 3] * cb[x >> 6];
        }
        return s;
    }
    }
}

/* acc += w * row (row one token's codes, w already carrying the token's scale). */
static void axpy_codes(int dt, float *acc, float w, const uint8_t *row, int d)
{
    switch (dt) {
    case KV_DTYPE_F32:
        for (int c = 0; c < d; c++) acc[c] += w * ((const float *)row)[c];
        return;
    case KV_DTYPE_BF16:
        for (int c = 0; c < d; c++) acc[c] += w * bf16_to_f32(((const uint16_t *)row)[c]);
        return;
    case KV_DTYPE_FP8:
        for (int c = 0; c < d; c++) acc[c] += w * kv_e4m3_value[row[c]];
        return;
    case KV_DTYPE_INT8:
        for (int c = 0; c < d; c++) acc[c] += w * (float)((const int8_t *)row)[c];
        return;
    case KV_DTYPE_INT4:
        for (int c = 0; c < d; c += 2) {
            uint8_t x = row[c >> 1];
            acc[c] += w * (float)((x & 15) - 8);
            acc[c + 1] += w * (float)((x >> 4) - 8);
        }
        return;
    case KV_DTYPE_TQ4: {
        const float *cb = kv_tq_codebook(4);
        for (int c = 0; c < d; c += 2) {
            uint8_t x = row[c >> 1];
            acc[c] += w * cb[x & 15];
            acc[c + 1] += w * cb[x >> 4];
        }
        return;
    }
    case KV_DTYPE_TQ3: {
        const float *cb = kv_tq_codebook(3);
        for (int c = 0; c < d; c += 8, row += 3) {
            uint32_t x = (uint32_t)row[0] | (uint32_t)row[1] << 8 | (uint32_t)row[2] << 16;
            for (int i = 0; i < 8; i++) acc[c + i] += w * cb[(x >> (3 * i)) & 7];
        }
        return;
    }
    default: {
        const float *cb = kv_tq_codebook(2);
        for (int c = 0; c < d; c += 4) {
            uint8_t x = row[c >> 2];
            acc[c] += w * cb[x & 3];
            acc[c + 1] += w * cb[(x >> 2) & 3];
            acc[c + 2] += w * cb[(x >> 4) & 3];
            acc[c + 3] += w * cb[x >> 6];
        }
        return;
    }
    }
}

float softmax_portable(float *s, int n, float m)
{
    float sum = 0;
    for (int i = 0; i < n; i++) s[i] = expf(s[i] - m);
    for (int i = 0; i < n; i++) sum += s[i];
    return sum;
}

void kvq_dot_portable(int dt, const uint8_t *rows, size_t rb, int n, int d, const float *q,
                      size_t ldq, int nq, float *s, size_t lds)
{
    for (int j = 0; j < nq; j++)
        for (int i = 0; i < n; i++)
            s[j * lds + i] = dot_codes(dt, rows + (size_t)i * rb, q + j * ldq, d);
}

void kvq_axpy_portable(int dt, const uint8_t *rows, size_t rb, int n, int d, float *acc, size_t lda,
                       int nq, const float *w, size_t ldw)
{
    for (int j = 0; j < nq; j++)
        for (int i = 0; i < n; i++)
            axpy_codes(dt, acc + j * lda, w[j * ldw + i], rows + (size_t)i * rb, d);
}

/* Whether a row of this format and role has a factor of its own: not plain values, nor int
 * keys (whose per-channel scales go into the query). */
static int row_scaled(int dt, int role)
{
    return !(dt == KV_DTYPE_F32 || dt == KV_DTYPE_BF16 ||
             (role == KV_ROLE_K && (dt == KV_DTYPE_INT8 || dt == KV_DTYPE_INT4)));
}

/* The factor of token t's row: its bf16 scale or gain, 1 where it has none. */
static float row_scale(int dt, int role, const uint8_t *hb, int t)
{
    return row_scaled(dt, role) ? bf16_to_f32(((const uint16_t *)hb)[t]) : 1.0f;
}

/* The most query heads one work item takes, and the most consecutive tokens of one sequence
 * (a run) that share its key and value rows: the per-query maxima and sums sit on the stack. */
#define ATTNQ_HEADS_MAX 8
#define ATTNQ_RUN_MAX   8

/* Where the rows of one KV head of one pool block lie: at base + block * blk + head * head
 * + hdr, row i at + i * row. Quantized layers keep a head's rows together after its header
 * (paged_kv/kv_quant.h); auto layers are float32 rows of every head, token after token. */
struct kv_addr {
    const uint8_t *base;
    size_t blk, head, hdr, row;
    int dt; /* the kernels' format: auto reads as KV_DTYPE_F32 */
};

struct attnq_job {
    float *out;
    const float *q;
    const struct kv_geom *g;
    const struct fwd_batch *b;
    const struct attn_params *p;
    const int32_t *tok_seq;
    struct kv_addr k, v;
    int hpi;            /* query heads per work item: a divisor of the GQA group */
    const int32_t *run; /* each run's first token, then n_tokens */
    atomic_long next;   /* the next work item to claim, from the last (the longest) */
};

/* One work item per (run of T tokens, hpi query heads of one KV head): the T * hpi queries
 * scored block by block, each block's key rows decoded once for all of them (the query
 * prepared once per block), softmax per query, then the value sums the same way. A query
 * reads only keys at or before its own position: the scores of later keys of the run are
 * computed with the others but never read, and their value weights are 0, which adds an
 * exact 0 to a sum of finite values. Every query's operations are the same whatever T and
 * hpi are (impl.h kvq_dot / kvq_axpy), so how tokens and heads are grouped never changes a
 * result. */
static void attnq_task(void *arg, int ith, int nth)
{
    (void)ith;
    (void)nth;
    struct attnq_job *j = arg;
    const struct attn_params *p = j->p;
    const struct kv_geom *g = j->g;
    const struct fwd_batch *b = j->b;
    int d = p->head_dim, B = g->block_size, H = g->n_kv_heads, group = p->n_heads / H;
    int kd = j->k.dt, vd = j->v.dt, hpi = j->hpi, per_kv = group / hpi;
    int kscaled = row_scaled(kd, KV_ROLE_K), vscaled = row_scaled(vd, KV_ROLE_V);
    long item;
    while ((item = atomic_fetch_sub(&j->next, 1)) >= 0) {
        int ri = (int)(item / (H * per_kv)), r = (int)(item % (H * per_kv));
        int kvh = r / per_kv, h0 = kvh * group + r % per_kv * hpi;
        int tok0 = j->run[ri], T = j->run[ri + 1] - tok0, nq = T * hpi;
        int s = j->tok_seq[tok0], qlast = b->pos[tok0 + T - 1], first = 0;
        if (p->window > 0 && qlast - p->window + 1 > 0) first = qlast - p->window + 1;
        int nkeys = qlast + 1 - first;
        /* per query: scores [nkeys], the query (rotated for tq keys), its per-block form, the
         * value sum, and one block's value weights [B] */
        size_t per = (size_t)nkeys + 3 * (size_t)d + (size_t)B;
        float *sc = scratch_get(SCRATCH_ATTN, per * (size_t)nq);
        float *qr = sc + (size_t)nq * nkeys, *qp = qr + (size_t)nq * d;
        float *acc = qp + (size_t)nq * d, *wt = acc + (size_t)nq * d;
        float mx[ATTNQ_RUN_MAX * ATTNQ_HEADS_MAX], inv[ATTNQ_RUN_MAX * ATTNQ_HEADS_MAX];
        int last[ATTNQ_RUN_MAX * ATTNQ_HEADS_MAX]; /* each query's last key, from first */
        for (int e = 0; e < nq; e++) {
            int t = tok0 + e / hpi, h = h0 + e % hpi;
            memcpy(qr + (size_t)e * d, j->q + ((size_t)t * p->n_heads + h) * d,
                   sizeof(float) * (size_t)d);
            if (kv_dtype_rotated(kd)) kv_tq_rotate(qr + (size_t)e * d, d);
            mx[e] = -INFINITY;
            last[e] = b->pos[t] - first;
        }
        const int32_t *bt = b->block_table + (size_t)s * b->max_blocks;
        for (int bi = first / B; bi <= qlast / B; bi++) {
            const uint8_t *hb = j->k.base + (size_t)bt[bi] * j->k.blk + (size_t)kvh * j->k.head;
            const float *qv = qr;
            if (kd == KV_DTYPE_INT8 || kd == KV_DTYPE_INT4) { /* the channel scales */
                const uint16_t *cs = (const uint16_t *)hb;
                for (int e = 0; e < nq; e++)
                    for (int c = 0; c < d; c++)
                        qp[(size_t)e * d + c] = qr[(size_t)e * d + c] * bf16_to_f32(cs[c]);
                qv = qp;
            }
            int t0 = bi * B < first ? first - bi * B : 0;
            int t1 = bi * B + B - 1 > qlast ? qlast - bi * B : B - 1;
            float *sb = sc + (bi * B + t0 - first); /* query e's scores of tokens t0 .. t1 */
            cpu_impl->kvq_dot(kd, hb + j->k.hdr + (size_t)t0 * j->k.row, j->k.row, t1 - t0 + 1, d,
                              qv, (size_t)d, nq, sb, (size_t)nkeys);
            for (int e = 0; e < nq; e++) {
                /* this query's keys of the block: t0 .. tl */
                int tl = last[e] + first - bi * B < t1 ? last[e] + first - bi * B : t1;
                float *se = sb + (size_t)e * nkeys, m = mx[e];
                for (int tt = t0; tt <= tl; tt++) { /* a row factor of 1 is left out: exact */
                    float v = se[tt - t0];
                    v = (kscaled ? v * row_scale(kd, KV_ROLE_K, hb, tt) : v) * p->scale;
                    if (p->softcap > 0) v = p->softcap * tanhf(v / p->softcap);
                    se[tt - t0] = v;
                    m = v > m ? v : m;
                }
                mx[e] = m;
            }
        }
        for (int e = 0; e < nq; e++) {
            float *se = sc + (size_t)e * nkeys;
            inv[e] = 1.0f / cpu_impl->softmax(se, last[e] + 1, mx[e]);
            for (int i = last[e] + 1; i < nkeys; i++) se[i] = 0;
        }
        memset(acc, 0, sizeof(float) * (size_t)d * nq);
        for (int bi = first / B; bi <= qlast / B; bi++) {
            const uint8_t *hb = j->v.base + (size_t)bt[bi] * j->v.blk + (size_t)kvh * j->v.head;
            int t0 = bi * B < first ? first - bi * B : 0;
            int t1 = bi * B + B - 1 > qlast ? qlast - bi * B : B - 1;
            for (int e = 0; e < nq; e++) {
                const float *se = sc + (size_t)e * nkeys + (bi * B + t0 - first);
                float *we = wt + (size_t)e * B, ie = inv[e];
                if (vscaled)
                    for (int tt = t0; tt <= t1; tt++)
                        we[tt - t0] = se[tt - t0] * ie * row_scale(vd, KV_ROLE_V, hb, tt);
                else
                    for (int tt = t0; tt <= t1; tt++) we[tt - t0] = se[tt - t0] * ie;
            }
            cpu_impl->kvq_axpy(vd, hb + j->v.hdr + (size_t)t0 * j->v.row, j->v.row, t1 - t0 + 1, d,
                               acc, (size_t)d, nq, wt, (size_t)B);
        }
        for (int e = 0; e < nq; e++) {
            int t = tok0 + e / hpi, h = h0 + e % hpi;
            if (kv_dtype_rotated(vd)) kv_tq_unrotate(acc + (size_t)e * d, d);
            memcpy(j->out + ((size_t)t * p->n_heads + h) * d, acc + (size_t)e * d,
                   sizeof(float) * (size_t)d);
        }
    }
}

static struct kv_addr kv_addr(const void *base, int dt, int role, const struct kv_geom *g)
{
    int B = g->block_size, d = g->head_dim, H = g->n_kv_heads;
    struct kv_addr a = {.base = base, .dt = dt};
    if (dt == KV_DTYPE_AUTO) { /* float32 rows [slot][head][d] */
        a.dt = KV_DTYPE_F32;
        a.head = sizeof(float) * (size_t)d;
        a.row = a.head * (size_t)H;
        a.blk = a.row * (size_t)B;
        return a;
    }
    a.head = kv_head_block_bytes(dt, role, B, d);
    a.blk = a.head * (size_t)H;
    a.hdr = kv_header_bytes(dt, role, B, d);
    a.row = kv_row_bytes(dt, d);
    return a;
}

void cpu_attention_q(struct threadpool *tp, float *out, const float *q, const struct kv_layer *kv,
                     const struct kv_geom *g, const struct fwd_batch *b,
                     const struct attn_params *p, const int32_t *tok_seq)
{
    /* Runs: consecutive tokens of one sequence at consecutive positions, at most
     * ATTNQ_RUN_MAX (one token where a window bounds the keys: the run's earliest query
     * would need keys that may have left the pool) */
    int32_t *run = (int32_t *)scratch_get(SCRATCH_ATTN_RUNS, (size_t)b->n_tokens + 1);
    int n_runs = 0, run_max = p->window > 0 ? 1 : ATTNQ_RUN_MAX;
    for (int t = 0; t < b->n_tokens; t++)
        if (t == 0 || t - run[n_runs - 1] >= run_max || tok_seq[t] != tok_seq[t - 1] ||
            b->pos[t] != b->pos[t - 1] + 1)
            run[n_runs++] = t;
    run[n_runs] = b->n_tokens;
    /* The most heads of a GQA group per item that still leave an item for every thread:
     * fewer decodes of each block, as much parallel work as the pool can take. */
    int group = p->n_heads / g->n_kv_heads, hpi = 1, nth = tp_size(tp);
    for (int c = group < ATTNQ_HEADS_MAX ? group : ATTNQ_HEADS_MAX; c > 1; c--)
        if (group % c == 0 && (long)n_runs * g->n_kv_heads * (group / c) >= nth) {
            hpi = c;
            break;
        }
    struct attnq_job j = {.out = out,
                          .q = q,
                          .g = g,
                          .b = b,
                          .p = p,
                          .tok_seq = tok_seq,
                          .k = kv_addr(kv->k, g->k_dtype, KV_ROLE_K, g),
                          .v = kv_addr(kv->v, g->v_dtype, KV_ROLE_V, g),
                          .hpi = hpi,
                          .run = run};
    atomic_init(&j.next, (long)n_runs * g->n_kv_heads * (group / hpi) - 1);
    tp_run(tp, attnq_task, &j);
}
