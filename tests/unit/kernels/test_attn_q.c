/*
 * Quantized KV attention on every instruction set: the row kernels (impl.h kvq_dot,
 * kvq_axpy) of each table against the portable ones for every format, on partial runs of
 * a block and head sizes that are and are not multiples of 16; then cpu_attention_q whole
 * (GQA, partial blocks, a sliding window) against a double-precision reference built from
 * kv_load_row, each table against the portable one, and a sequence's output alone against
 * the same sequence in a batch; the same for auto (float32) layers, and for a prefill's runs
 * of tokens, each token's output as alone.
 */
#include <math.h>
#include <string.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/impl.h"
#include "model/backend.h"
#include "paged_kv/kv_quant.h"
#include "test_util.h"
#include "test_rand.h"

static const int formats[] = {KV_DTYPE_F32,  KV_DTYPE_BF16, KV_DTYPE_FP8, KV_DTYPE_INT8,
                              KV_DTYPE_INT4, KV_DTYPE_TQ4,  KV_DTYPE_TQ3, KV_DTYPE_TQ2};
#define N_FORMATS (int)(sizeof formats / sizeof formats[0])

/* The tables this build and CPU can run, portable first. */
static int tables(const struct cpu_impl **t)
{
    int n = 0;
    t[n++] = &cpu_impl_portable;
#if defined(PAGODA_X86)
    if (cpu_isa_available(CPU_ISA_AVX2)) t[n++] = &cpu_impl_avx2;
#endif
#if defined(PAGODA_AVX512)
    if (cpu_isa_available(CPU_ISA_AVX512)) t[n++] = &cpu_impl_avx512;
#endif
    return n;
}

/* Rows [t0, t0 + n) of a block of 16 written with gaussian rows (some of them scaled up so
 * int keys grow their scales): kvq_dot within d 2^-23 sum |q_c x_c| of the portable one,
 * kvq_axpy bitwise the portable one. */
static void test_rows(void)
{
    const struct cpu_impl *t[3];
    int nt = tables(t);
    int dims[] = {16, 64, 80, 128, 72, 40}; /* 72 and 40: not multiples of 16 */
    int runs[][2] = {{0, 16}, {3, 9}, {15, 1}, {0, 5}};
    enum { B = 16, DMAX = 128 };
    static uint8_t hb[B * DMAX * 4 + 2 * DMAX + 16];
    float x[DMAX], q[DMAX], onehot[DMAX], val[B][DMAX], w[B];
    for (int f = 0; f < N_FORMATS; f++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (int role = 0; role < 2; role++) {
                int dt = formats[f], d = dims[di];
                if (kv_dtype_check(dt, d, B, &(struct err){0})) continue;
                memset(hb, 0, sizeof hb);
                for (int r = 0; r < B; r++) {
                    float amp = r % 5 == 3 ? 8.0f : 1.0f;
                    for (int c = 0; c < d; c++) x[c] = gauss() * amp;
                    kv_store_row(dt, role, hb, r, B, d, x, 0);
                }
                size_t hdr = kv_header_bytes(dt, role, B, d), rb = kv_row_bytes(dt, d);
                const uint8_t *rows = hb + hdr;
                /* each value as the portable kernel reads it: q one-hot, an exact product */
                for (int c = 0; c < d; c++) {
                    memset(onehot, 0, sizeof onehot);
                    onehot[c] = 1.0f;
                    float s[B];
                    kvq_dot_portable(dt, rows, rb, B, d, onehot, 0, 1, s, 0);
                    for (int r = 0; r < B; r++) val[r][c] = s[r];
                }
                for (int c = 0; c < d; c++) q[c] = gauss();
                for (int r = 0; r < B; r++) w[r] = (float)urand();
                for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
                    int t0 = runs[ri][0], n = runs[ri][1];
                    float s0[B], s1[B], a0[DMAX], a1[DMAX], init[DMAX];
                    for (int c = 0; c < d; c++) init[c] = gauss();
                    kvq_dot_portable(dt, rows + t0 * rb, rb, n, d, q, 0, 1, s0, 0);
                    memcpy(a0, init, sizeof(float) * d);
                    kvq_axpy_portable(dt, rows + t0 * rb, rb, n, d, a0, 0, 1, w, 0);
                    for (int i = 0; i < n; i++) {
                        double exact = 0, mag = 0;
                        for (int c = 0; c < d; c++) {
                            exact += (double)q[c] * val[t0 + i][c];
                            mag += fabs((double)q[c] * val[t0 + i][c]);
                        }
                        CHECK(fabs(s0[i] - exact) <= d * 0x1p-24 * mag, "%s d %d row %d",
                              kv_dtype_name(dt), d, t0 + i);
                    }
                    for (int ti = 1; ti < nt; ti++) {
                        t[ti]->kvq_dot(dt, rows + t0 * rb, rb, n, d, q, 0, 1, s1, 0);
                        for (int i = 0; i < n; i++) {
                            double mag = 0;
                            for (int c = 0; c < d; c++) mag += fabs((double)q[c] * val[t0 + i][c]);
                            CHECK(fabs((double)s1[i] - s0[i]) <= d * 0x1p-23 * mag,
                                  "table %d %s role %d d %d row %d: %.9g vs %.9g", ti,
                                  kv_dtype_name(dt), role, d, t0 + i, s1[i], s0[i]);
                        }
                        memcpy(a1, init, sizeof(float) * d);
                        t[ti]->kvq_axpy(dt, rows + t0 * rb, rb, n, d, a1, 0, 1, w, 0);
                        CHECK(!memcmp(a0, a1, sizeof(float) * d),
                              "table %d %s role %d d %d rows %d+%d: value sums differ", ti,
                              kv_dtype_name(dt), role, d, t0, n);
                    }
                }
            }
}

/* Seven query heads in one call (4 + 2 + 1 at a time) give each head's bits of a call of
 * one head, on every table and format. */
/* The softmax weights of every table against e^(s - m) in double (s - m rounded to float, as
 * the tables take it): each within 4 ulp (2^-22 relative) where e^(s - m) is above e^-87,
 * under 2^-125 below e^-87.3 (expf's subnormals or the AVX2 table's 0); the sum within
 * n 2^-22 of the exact one; lengths 1 to 40 (vector and tail lanes); NaN kept. */
static void test_softmax(void)
{
    const struct cpu_impl *t[3];
    int nt = tables(t);
    float s[64], in[64];
    for (int ti = 0; ti < nt; ti++)
        for (int n = 1; n <= 40; n++) {
            float m = 3.0f;
            for (int i = 0; i < n; i++) /* scores from m down to m - 100 */
                in[i] = m - (float)(i * 97 % 41) * 2.5f + gauss() * 0.01f;
            in[0] = m;
            memcpy(s, in, sizeof(float) * (size_t)n);
            s[n] = 7.0f; /* past the end: untouched */
            double sum = t[ti]->softmax(s, n, m), exact = 0;
            CHECK(s[n] == 7.0f, "table %d n %d: wrote past n", ti, n);
            for (int i = 0; i < n; i++) {
                float x = in[i] - m;
                double e = exp((double)x);
                exact += e;
                if (x < -87.3f)
                    CHECK(s[i] >= 0.0f && s[i] < 0x1p-125f, "table %d n %d: e^%g = %g", ti, n,
                          (double)x, (double)s[i]);
                else if (x > -87.0f)
                    CHECK(fabs(s[i] - e) <= 0x1p-22 * e, "table %d n %d: e^%g = %.9g, not %.9g", ti,
                          n, (double)x, (double)s[i], e);
            }
            CHECK(fabs(sum - exact) <= n * 0x1p-22 * exact, "table %d n %d: sum %.9g, not %.9g", ti,
                  n, sum, exact);
        }
    for (int ti = 0; ti < nt; ti++) {
        float v[3] = {0.0f, NAN, -1.0f};
        t[ti]->softmax(v, 3, 0.0f);
        CHECK(v[0] == 1.0f && isnan(v[1]) && fabs(v[2] - exp(-1.0)) <= 0x1p-22,
              "table %d: e^0, e^NaN, e^-1 = %g %g %g", ti, (double)v[0], (double)v[1],
              (double)v[2]);
    }
}

static void test_heads(void)
{
    const struct cpu_impl *t[3];
    int nt = tables(t);
    enum { B = 16, D = 64, NQ = 7 };
    static uint8_t hb[B * D * 4 + 2 * D + 16];
    static float q[NQ][D], w[NQ][B], s1[NQ][B], sn[NQ][B], a1[NQ][D], an[NQ][D];
    float x[D];
    for (int f = 0; f < N_FORMATS; f++)
        for (int role = 0; role < 2; role++) {
            int dt = formats[f];
            for (int r = 0; r < B; r++) {
                for (int c = 0; c < D; c++) x[c] = gauss();
                kv_store_row(dt, role, hb, r, B, D, x, 0);
            }
            const uint8_t *rows = hb + kv_header_bytes(dt, role, B, D) + 2 * kv_row_bytes(dt, D);
            for (int j = 0; j < NQ; j++) {
                for (int c = 0; c < D; c++) q[j][c] = a1[j][c] = an[j][c] = gauss();
                for (int i = 0; i < B; i++) w[j][i] = (float)urand();
            }
            for (int ti = 0; ti < nt; ti++) {
                size_t rb = kv_row_bytes(dt, D);
                t[ti]->kvq_dot(dt, rows, rb, B - 3, D, &q[0][0], D, NQ, &sn[0][0], B);
                t[ti]->kvq_axpy(dt, rows, rb, B - 3, D, &an[0][0], D, NQ, &w[0][0], B);
                for (int j = 0; j < NQ; j++) {
                    t[ti]->kvq_dot(dt, rows, rb, B - 3, D, q[j], 0, 1, s1[j], 0);
                    t[ti]->kvq_axpy(dt, rows, rb, B - 3, D, a1[j], 0, 1, w[j], 0);
                    CHECK(!memcmp(s1[j], sn[j], sizeof(float) * (B - 3)),
                          "table %d %s: head %d's scores depend on the heads beside it", ti,
                          kv_dtype_name(dt), j);
                    CHECK(!memcmp(a1[j], an[j], sizeof a1[j]),
                          "table %d %s: head %d's value sum depends on the heads beside it", ti,
                          kv_dtype_name(dt), j);
                }
            }
        }
}

/* Two sequences over a pool of head blocks of 16: sequence 0 at 37 tokens (a partial last
 * block), sequence 1 at 21; 8 query heads on 2 KV heads. */
enum { HD = 64, NH = 8, NKV = 2, BS = 16, NBLK = 8, MAXB = 4 };
static const int32_t table_ids[2][MAXB] = {{5, 2, 7, 0}, {1, 6, 3, 4}};
static const int seq_len[2] = {37, 21};

struct pool {
    struct kv_layer kv;
    struct kv_geom g;
    float *kf, *vf; /* [seq][pos][NKV][HD] the rows as written */
};

/* Auto layers (both formats KV_DTYPE_AUTO) hold float32 rows [slot][NKV][HD]. */
static size_t layer_bytes(int dt, int role)
{
    if (dt == KV_DTYPE_AUTO) return sizeof(float) * NBLK * BS * NKV * HD;
    return kv_head_block_bytes(dt, role, BS, HD) * NBLK * NKV;
}

static void pool_fill(struct pool *p, int kd, int vd)
{
    p->g = (struct kv_geom){NBLK, BS, NKV, HD, kd, vd, 0, 0};
    size_t kb = layer_bytes(kd, KV_ROLE_K), vb = layer_bytes(vd, KV_ROLE_V);
    p->kv.k = xmalloc(kb);
    p->kv.v = xmalloc(vb);
    memset(p->kv.k, 0, kb);
    memset(p->kv.v, 0, vb);
    size_t n = 2 * MAXB * BS * NKV * HD;
    p->kf = xmalloc(n * sizeof(float));
    p->vf = xmalloc(n * sizeof(float));
    /* one token at a time, as decode writes them */
    for (int s = 0; s < 2; s++)
        for (int pos = 0; pos < seq_len[s]; pos++) {
            float *k = p->kf + ((size_t)(s * MAXB * BS + pos) * NKV) * HD;
            float *v = p->vf + ((size_t)(s * MAXB * BS + pos) * NKV) * HD;
            for (int i = 0; i < NKV * HD; i++) {
                k[i] = gauss() * (i % 17 == 0 ? 4.0f : 1.0f);
                v[i] = gauss();
            }
            int32_t slot = table_ids[s][pos / BS] * BS + pos % BS, ps = pos;
            struct fwd_batch b = {.n_tokens = 1, .pos = &ps, .slot = &slot};
            if (kd == KV_DTYPE_AUTO) {
                memcpy(p->kv.k + (size_t)slot * NKV * HD, k, sizeof(float) * NKV * HD);
                memcpy(p->kv.v + (size_t)slot * NKV * HD, v, sizeof(float) * NKV * HD);
            } else {
                cpu_kv_store_q(&p->kv, &p->g, k, v, &b);
            }
        }
}

/* The row of KV head kvh at position kp of sequence s as the layer holds it. */
static void pool_row(const struct pool *p, int role, int s, int kp, int kvh, float *out)
{
    int dt = role == KV_ROLE_K ? p->g.k_dtype : p->g.v_dtype, blk = table_ids[s][kp / BS];
    const void *base = role == KV_ROLE_K ? (const void *)p->kv.k : (const void *)p->kv.v;
    if (dt == KV_DTYPE_AUTO) {
        memcpy(out, (const float *)base + ((size_t)(blk * BS + kp % BS) * NKV + kvh) * HD,
               sizeof(float) * HD);
        return;
    }
    kv_load_row(dt, role,
                (const uint8_t *)base + (blk * NKV + kvh) * kv_head_block_bytes(dt, role, BS, HD),
                kp % BS, BS, HD, out);
}

/* The attention of one token (sequence s at pos) from the rows as held, in double sums. */
static void reference(const struct pool *p, int s, int pos, const float *q,
                      const struct attn_params *ap, float *ref)
{
    int win = ap->window;
    for (int h = 0; h < NH; h++) {
        int kvh = h / (NH / NKV), first = win && pos + 1 > win ? pos + 1 - win : 0;
        double sc[64], mx = -1e300, sum = 0, o[HD] = {0};
        for (int kp = first; kp <= pos; kp++) {
            float kr[HD];
            pool_row(p, KV_ROLE_K, s, kp, kvh, kr);
            double d = 0;
            for (int c = 0; c < HD; c++) d += (double)q[h * HD + c] * kr[c];
            sc[kp] = d * ap->scale;
            if (sc[kp] > mx) mx = sc[kp];
        }
        for (int kp = first; kp <= pos; kp++) sum += sc[kp] = exp(sc[kp] - mx);
        for (int kp = first; kp <= pos; kp++) {
            float vr[HD];
            pool_row(p, KV_ROLE_V, s, kp, kvh, vr);
            for (int c = 0; c < HD; c++) o[c] += sc[kp] / sum * vr[c];
        }
        for (int c = 0; c < HD; c++) ref[h * HD + c] = (float)o[c];
    }
}

static void pool_free(struct pool *p)
{
    free(p->kv.k);
    free(p->kv.v);
    free(p->kf);
    free(p->vf);
}

/* Runs attention for the tokens (seq, pos) given; out [n][NH][HD]. */
static void attend(struct threadpool *tp, const struct pool *p, int n, const int *seq,
                   const int32_t *pos, const float *q, const struct attn_params *ap, float *out)
{
    int32_t tok_seq[32], qs[3] = {0, 0, 0}, slot[32];
    int32_t bt[2][MAXB];
    /* this batch's sequences, in order of first appearance */
    int map[2] = {-1, -1}, ns = 0;
    for (int i = 0; i < n; i++) {
        if (map[seq[i]] < 0) {
            map[seq[i]] = ns;
            memcpy(bt[ns], table_ids[seq[i]], sizeof bt[0]);
            ns++;
        }
        tok_seq[i] = map[seq[i]];
        slot[i] = table_ids[seq[i]][pos[i] / BS] * BS + pos[i] % BS;
    }
    struct fwd_batch b = {.n_tokens = n,
                          .pos = pos,
                          .slot = slot,
                          .n_seqs = ns,
                          .q_start = qs,
                          .block_table = &bt[0][0],
                          .max_blocks = MAXB};
    cpu_attention_q(tp, out, q, &p->kv, &p->g, &b, ap, tok_seq);
}

static void test_attention(struct threadpool *tp, struct threadpool *wide)
{
    const struct cpu_impl *t[3], *saved = cpu_impl;
    int nt = tables(t);
    int pairs[][2] = {{KV_DTYPE_FP8, KV_DTYPE_FP8},   {KV_DTYPE_INT8, KV_DTYPE_INT8},
                      {KV_DTYPE_INT4, KV_DTYPE_INT4}, {KV_DTYPE_TQ4, KV_DTYPE_TQ4},
                      {KV_DTYPE_TQ3, KV_DTYPE_TQ3},   {KV_DTYPE_TQ2, KV_DTYPE_TQ2},
                      {KV_DTYPE_BF16, KV_DTYPE_BF16}, {KV_DTYPE_INT8, KV_DTYPE_TQ3},
                      {KV_DTYPE_TQ4, KV_DTYPE_FP8},   {KV_DTYPE_AUTO, KV_DTYPE_AUTO}};
    /* four queries: each sequence's last token, a mid-block one, the first token */
    int seq[4] = {0, 1, 0, 1};
    int32_t pos[4] = {36, 20, 17, 0};
    static float q[4 * NH * HD], ref[4 * NH * HD], out[4][4 * NH * HD], one[NH * HD];
    /* out[3]: the 16-thread run */
    for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++)
        for (int win = 0; win <= 10; win += 10) {
            int kd = pairs[pi][0], vd = pairs[pi][1];
            struct pool p;
            pool_fill(&p, kd, vd);
            for (int i = 0; i < 4 * NH * HD; i++) q[i] = gauss();
            struct attn_params ap = {NH, NKV, HD, 0.125f, 0, win};
            /* the reference: the rows as held, double sums */
            for (int i = 0; i < 4; i++)
                reference(&p, seq[i], pos[i], q + i * NH * HD, &ap, ref + i * NH * HD);
            for (int ti = 0; ti < nt; ti++) {
                cpu_impl = t[ti];
                attend(tp, &p, 4, seq, pos, q, &ap, out[ti]);
                /* against the reference: float sums over at most 37 tokens, the rotation's
                 * float transform for tq values; values are O(1) */
                double worst = 0;
                for (int i = 0; i < 4 * NH * HD; i++)
                    worst = fmax(worst, fabs((double)out[ti][i] - ref[i]));
                CHECK(worst <= 2e-5, "table %d K %s V %s window %d: off the reference by %g", ti,
                      kv_dtype_name(kd), kv_dtype_name(vd), win, worst);
                /* against the portable table: scores differ by rounding only */
                if (ti) {
                    worst = 0;
                    for (int i = 0; i < 4 * NH * HD; i++)
                        worst = fmax(worst, fabs((double)out[ti][i] - out[0][i]));
                    CHECK(worst <= 1e-5, "table %d K %s V %s: off the portable table by %g", ti,
                          kv_dtype_name(kd), kv_dtype_name(vd), worst);
                }
                /* batch invariance: sequence 0's mid-block token alone gives the same bits,
                 * with 2 threads (4 heads an item) and with 16 (1 head an item alone, 2 in
                 * the batch of 4) */
                attend(tp, &p, 1, &seq[2], &pos[2], q + 2 * NH * HD, &ap, one);
                CHECK(!memcmp(one, out[ti] + 2 * NH * HD, sizeof one),
                      "table %d K %s V %s: a sequence alone differs from it in a batch", ti,
                      kv_dtype_name(kd), kv_dtype_name(vd));
                attend(wide, &p, 1, &seq[2], &pos[2], q + 2 * NH * HD, &ap, one);
                CHECK(!memcmp(one, out[ti] + 2 * NH * HD, sizeof one),
                      "table %d K %s V %s: 16 threads alone differ from 2 in a batch", ti,
                      kv_dtype_name(kd), kv_dtype_name(vd));
                attend(wide, &p, 4, seq, pos, q, &ap, out[3]);
                CHECK(!memcmp(out[3], out[ti], sizeof out[3]),
                      "table %d K %s V %s: 16 threads differ from 2", ti, kv_dtype_name(kd),
                      kv_dtype_name(vd));
            }
            /* a prefill's runs: sequence 0 at 20 .. 36 and sequence 1 at 10 .. 20 in one
             * batch (queries that share key rows are grouped, 8 tokens at most): every
             * token as alone, bit for bit, and near the reference */
            enum { NR = 28 };
            static float qr[NR * NH * HD], rr[NR * NH * HD], orun[NR * NH * HD];
            int rseq[NR];
            int32_t rpos[NR];
            for (int i = 0; i < NR; i++) {
                rseq[i] = i < 17 ? 0 : 1;
                rpos[i] = i < 17 ? 20 + i : 10 + (i - 17);
            }
            for (int i = 0; i < NR * NH * HD; i++) qr[i] = gauss();
            for (int i = 0; i < NR; i++)
                reference(&p, rseq[i], rpos[i], qr + i * NH * HD, &ap, rr + i * NH * HD);
            for (int ti = 0; ti < nt; ti++) {
                cpu_impl = t[ti];
                attend(tp, &p, NR, rseq, rpos, qr, &ap, orun);
                double worst = 0;
                for (int i = 0; i < NR * NH * HD; i++)
                    worst = fmax(worst, fabs((double)orun[i] - rr[i]));
                CHECK(worst <= 2e-5, "table %d K %s V %s window %d: runs off the reference by %g",
                      ti, kv_dtype_name(kd), kv_dtype_name(vd), win, worst);
                for (int i = 0; i < NR; i++) {
                    attend(i % 2 ? wide : tp, &p, 1, &rseq[i], &rpos[i], qr + i * NH * HD, &ap,
                           one);
                    CHECK(!memcmp(one, orun + i * NH * HD, sizeof one),
                          "table %d K %s V %s window %d: token %d of a run differs alone", ti,
                          kv_dtype_name(kd), kv_dtype_name(vd), win, i);
                }
            }
            cpu_impl = saved;
            pool_free(&p);
        }
}

int main(void)
{
    cpu_kernels_init();
    struct threadpool *tp = tp_create(2), *wide = tp_create(16);
    test_rows();
    test_softmax();
    test_heads();
    test_attention(tp, wide);
    tp_destroy(wide);
    tp_destroy(tp);
    TEST_DONE();
}
