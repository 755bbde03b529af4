/*
 * Ternary (BitNet) kernels: the packed layout on hand-made values, the activation quantizer
 * on values with known roundings (half to even, the clamp, zero and NaN rows), and the
 * product against a reference written here from the format's definition on every instruction
 * set. The integer dot is exact and the scaling one fixed sequence of float operations, so
 * every comparison is bitwise.
 */
#include <math.h>
#include <string.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/impl.h"
#include "kernels/cpu/quant.h"
#include "test_util.h"

static uint32_t rng = 12345;
static uint32_t rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return rng >> 8;
}

static void test_layout(void)
{
    /* k = 200: one whole block of 128 and a partial one */
    int8_t v[200];
    for (int j = 0; j < 200; j++) v[j] = (int8_t)(j % 3 - 1);
    CHECK(qweight_ternary_row_bytes(200) == 64, "%zu", qweight_ternary_row_bytes(200));
    CHECK(qweight_ternary_row_bytes(128) == 32, "%zu", qweight_ternary_row_bytes(128));
    uint8_t row[64];
    qweight_ternary_pack(v, 200, row);
    for (int j = 0; j < 200; j++)
        CHECK(qweight_ternary_get(row, j) == v[j], "col %d: %d", j, qweight_ternary_get(row, j));
    for (int j = 200; j < 256; j++) CHECK(qweight_ternary_get(row, j) == 0, "pad %d", j);
    /* column 128 b + 32 i + j in bits 2i of byte j of block b: columns 0, 32, 64, 96 share
     * byte 0 (values -1, 1, 0, -1: codes 0, 2, 1, 0) */
    CHECK(row[0] == (0 | 2 << 2 | 1 << 4 | 0 << 6), "byte 0 = %#x", row[0]);
    /* decoded as a matrix row: value / t_div * t_mul */
    struct qweight w = {.fmt = WFMT_TERNARY, .n = 1, .k = 200, .w = row, .row_bytes = 64};
    w.t_div = 4.0f;
    w.t_mul = 1.0f;
    float out[200];
    quant_dequant_row(&w, 0, 0, 200, out);
    for (int j = 0; j < 200; j++) CHECK(out[j] == v[j] / 4.0f, "dequant %d: %g", j, out[j]);
}

static void test_quantize(void)
{
    /* max 127: scale 1, so q is x rounded half to even */
    float x[9] = {127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.7f, -126.6f};
    int8_t want[9] = {127, 0, 2, 2, 0, -2, -2, 4, -127};
    int8_t q[128];
    int32_t sum;
    memset(q, 0x7f, sizeof q);
    float s = cpu_ternary_quantize(x, 9, 128, q, &sum);
    CHECK(s == 1.0f, "scale %g", s);
    int32_t ws = 0;
    for (int j = 0; j < 9; j++) {
        CHECK(q[j] == want[j], "q[%d] = %d, want %d", j, q[j], want[j]);
        ws += want[j];
    }
    for (int j = 9; j < 128; j++) CHECK(q[j] == 0, "pad q[%d] = %d", j, q[j]);
    CHECK(sum == ws, "sum %d, want %d", sum, ws);

    /* the largest magnitude maps to +-127; the scale is 127 / max in float32 */
    float y[3] = {0.1f, -3.0f, 1.0f};
    s = cpu_ternary_quantize(y, 3, 3, q, &sum);
    CHECK(s == 127.0f / 3.0f, "scale %g", s);
    CHECK(q[1] == -127 && q[2] == (int8_t)nearbyintf(1.0f * (127.0f / 3.0f)) && q[0] == 4,
          "q = %d %d %d", q[0], q[1], q[2]);

    /* a zero row: the scale's floor of 1e-5, all zeros; a NaN becomes a defined zero */
    float z[4] = {0, 0, NAN, 0};
    s = cpu_ternary_quantize(z, 4, 4, q, &sum);
    CHECK(s == 127.0f / 1e-5f, "zero-row scale %g", s);
    CHECK(!q[0] && !q[1] && !q[2] && !q[3] && sum == 0, "zero row");
}

/* The AVX2 quantizer against the portable one, bitwise: scale, bytes, padding and sum, over
 * lengths around its 8- and 32-value steps, with NaN, infinities, ties and the clamp. */
static void test_quantize_tables(void)
{
#if defined(PAGODA_X86)
    if (!cpu_isa_available(CPU_ISA_AVX2)) return;
    static const int64_t ks[] = {1, 7, 8, 9, 31, 32, 33, 63, 64, 100, 2560, 2561};
    float *x = xmalloc(sizeof(float) * 2561);
    int8_t *qa = xmalloc(2600), *qb = xmalloc(2600);
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
        for (int v = 0; v < 4; v++) {
            int64_t k = ks[ki];
            for (int64_t j = 0; j < k; j++) {
                x[j] = ((float)(rnd() % 20001) - 10000.0f) / 997.0f;
                if (v == 1 && j % 5 == 0) x[j] = (float)(int)x[j] + 0.5f; /* ties */
                if (v == 2 && j == k / 2) x[j] = NAN;
                if (v == 3 && j == k / 3) x[j] = j % 2 ? INFINITY : -INFINITY;
            }
            int32_t sa = -1, sb = -2;
            memset(qa, 0x55, 2600);
            memset(qb, 0x55, 2600);
            float fa = ternary_quantize_portable(x, k, k + 37, qa, &sa);
            float fb = ternary_quantize_avx2(x, k, k + 37, qb, &sb);
            CHECK(!memcmp(&fa, &fb, sizeof fa) && sa == sb && !memcmp(qa, qb, (size_t)k + 37),
                  "k=%lld variant %d: avx2 quantizer differs (scale %.9g/%.9g, sum %d/%d)",
                  (long long)k, v, fa, fb, sa, sb);
        }
    free(x);
    free(qa);
    free(qb);
#endif
}

/* The product by the format's definition: y = (float)dot / (s * t_div) * t_mul. */
static void reference(const struct qweight *w, const float *x, int m, float *y)
{
    int8_t *q = xmalloc((size_t)w->k + 128);
    for (int i = 0; i < m; i++) {
        int32_t sum;
        float s = ternary_quantize_portable(x + (size_t)i * w->k, w->k, w->k, q, &sum);
        for (int64_t r = 0; r < w->n; r++) {
            int32_t d = 0;
            for (int64_t j = 0; j < w->k; j++)
                d += qweight_ternary_get(w->w + r * w->row_bytes, j) * q[j];
            y[(size_t)i * w->n + r] = (float)d / (s * w->t_div) * w->t_mul;
        }
    }
    free(q);
}

static void test_matmul(struct threadpool *tp)
{
    /* shapes: partial blocks, the int16 flush boundary (8 blocks) and past it, a row count
     * that is no multiple of the thread split (16) */
    static const int64_t shapes[][2] = {{16, 128},  {40, 200},  {33, 1024},
                                        {24, 2560}, {20, 6912}, {70, 1024}};
    /* 16 and more: the amx table's tiles (2 and 4 of them, x rows past m) */
    static const int ms[] = {1, 2, 3, 4, 5, 9, 16, 23, 40, 100};
    enum cpu_isa isas[] = {CPU_ISA_PORTABLE, CPU_ISA_AVX2, CPU_ISA_AVXVNNI, CPU_ISA_AVX512,
                           CPU_ISA_AMX};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t n = shapes[si][0], k = shapes[si][1];
        struct qweight w = {.fmt = WFMT_TERNARY, .bits = 2, .n = n, .k = k};
        w.row_bytes = qweight_ternary_row_bytes(k);
        uint8_t *data = xmalloc((size_t)n * w.row_bytes);
        int8_t *v = xmalloc((size_t)k);
        for (int64_t r = 0; r < n; r++) {
            /* row 0 all +1 and row 1 all -1: the largest sums the int16 stage meets */
            for (int64_t j = 0; j < k; j++)
                v[j] = (int8_t)(r == 0 ? 1 : r == 1 ? -1 : (int)(rnd() % 3) - 1);
            qweight_ternary_pack(v, k, data + r * w.row_bytes);
        }
        w.w = data;
        w.t_div = si % 2 ? 1.0f : 0.3125f;
        w.t_mul = si % 2 ? 0.7f : 1.0f;
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            int m = ms[mi];
            float *x = xmalloc(sizeof(float) * (size_t)(m * k));
            for (int64_t j = 0; j < m * k; j++) x[j] = ((float)(rnd() % 20001) - 10000.0f) / 997.0f;
            for (int i = 0; i < m && i < 2; i++) /* rows at the clamp: all +-max */
                for (int64_t j = 0; j < k; j++) x[i * k + j] = i ? -2.5f : 2.5f;
            float *want = xmalloc(sizeof(float) * (size_t)(m * n));
            float *got = xmalloc(sizeof(float) * (size_t)(m * n));
            reference(&w, x, m, want);
            for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
                if (!cpu_isa_available(isas[ii])) continue;
                cpu_isa_set(isas[ii]);
                memset(got, 0, sizeof(float) * (size_t)(m * n));
                cpu_matmul(tp, got, x, &w, m);
                int bad = 0;
                for (int64_t t = 0; t < m * n && bad < 3; t++)
                    if (memcmp(&got[t], &want[t], sizeof(float))) {
                        CHECK(0, "%s n=%lld k=%lld m=%d: y[%lld] = %.9g, want %.9g",
                              cpu_isa_name(isas[ii]), (long long)n, (long long)k, m, (long long)t,
                              got[t], want[t]);
                        bad++;
                    }
            }
            free(x);
            free(want);
            free(got);
        }
        free(v);
        free(data);
    }
    cpu_kernels_init();
}

/* Every table's kernel directly on int8 rows at the extremes (-128 against all -1 codes and
 * 127 against all +1), over 54 blocks (k = 6912): the int16 stage must not saturate. */
static void test_extremes(void)
{
    int64_t k = 6912;
    size_t rb = qweight_ternary_row_bytes(k);
    uint8_t *data = xmalloc(2 * rb);
    int8_t *v = xmalloc((size_t)k);
    for (int r = 0; r < 2; r++) {
        for (int64_t j = 0; j < k; j++) v[j] = (int8_t)(r ? -1 : 1);
        qweight_ternary_pack(v, k, data + r * rb);
    }
    struct qweight w = {.fmt = WFMT_TERNARY, .n = 2, .k = k, .w = data, .row_bytes = rb};
    w.t_div = w.t_mul = 1.0f;
    int8_t *q = xmalloc(2 * (size_t)k);
    memset(q, 0x80, (size_t)k);    /* row 0: -128 */
    memset(q + k, 127, (size_t)k); /* row 1: 127 */
    int32_t qsum[2] = {-128 * (int32_t)k, 127 * (int32_t)k};
    float qdiv[2] = {1.0f, 1.0f}, y[4];
    const struct cpu_impl *tables[] = {
        &cpu_impl_portable,
#if defined(PAGODA_X86)
        &cpu_impl_avx2
#endif
    };
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        if (t && !cpu_isa_available(CPU_ISA_AVX2)) continue;
        tables[t]->ternary(&w, 0, 2, q, (size_t)k, qsum, qdiv, 2, y, 2);
        float want[4] = {-128.0f * k, 128.0f * k, 127.0f * k, -127.0f * k};
        for (int i = 0; i < 4; i++) CHECK(y[i] == want[i], "table %zu y[%d] = %g", t, i, y[i]);
    }
    free(q);
    free(v);
    free(data);
}

int main(void)
{
    cpu_kernels_init();
    struct threadpool *tp = tp_create(2);
    test_layout();
    test_quantize();
    test_quantize_tables();
    test_matmul(tp);
    test_extremes();
    tp_destroy(tp);
    TEST_DONE();
}
