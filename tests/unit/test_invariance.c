/*
 * Batch invariance of cpu_matmul: row i of y = x . W^T must be bitwise the same whatever
 * else is in the batch (m = 1 .. 300 rows) and whatever the thread count (1, 2, 3), for
 * every weight format, group size and instruction-set path (each compared with itself).
 * The engine relies on it: a request's greedy tokens may not depend on its batch-mates.
 */
#include <string.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "test_util.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}
static float frand(void)
{
    return (float)(rnd() % 2000001) / 1000000.0f - 1.0f;
}

struct mat {
    struct qweight w;
    uint8_t *data, *scales, *biases;
};

/* Random codes and sane scales; affine scales and biases in the given dtype. */
static void mat_make(struct mat *m, enum wfmt fmt, int bits, int group, int64_t n, int64_t k,
                     enum st_dtype sdtype)
{
    memset(m, 0, sizeof *m);
    struct qweight *w = &m->w;
    w->fmt = fmt;
    w->bits = bits;
    w->group = group;
    w->n = n;
    w->k = k;
    w->row_bytes = (size_t)(k * bits / 8);
    size_t nb = (size_t)n * w->row_bytes;
    m->data = xmalloc(nb + 8);
    for (size_t i = 0; i < nb; i++) m->data[i] = (uint8_t)rnd();
    if (fmt == WFMT_BF16)
        for (size_t i = 0; i < nb / 2; i++) ((uint16_t *)m->data)[i] = f32_to_bf16(frand());
    if (fmt == WFMT_F16)
        for (size_t i = 0; i < nb / 2; i++) ((uint16_t *)m->data)[i] = f32_to_f16(frand());
    if (fmt == WFMT_F32)
        for (size_t i = 0; i < nb / 4; i++) ((float *)m->data)[i] = frand();
    if (fmt == WFMT_MXFP8) /* no NaN codes */
        for (size_t i = 0; i < nb; i++)
            if ((m->data[i] & 0x7f) == 0x7f) m->data[i] ^= 1;
    w->w = m->data;
    size_t ng = group ? (size_t)(n * (k / group)) : 0;
    if (fmt == WFMT_AFFINE) {
        size_t es = sdtype == ST_F32 ? 4 : 2;
        m->scales = xmalloc(ng * es);
        m->biases = xmalloc(ng * es);
        for (size_t i = 0; i < ng; i++) {
            float s = frand() * 0.1f, b = frand() * 0.5f;
            if (sdtype == ST_F32) {
                ((float *)m->scales)[i] = s;
                ((float *)m->biases)[i] = b;
            } else if (sdtype == ST_F16) {
                ((uint16_t *)m->scales)[i] = f32_to_f16(s);
                ((uint16_t *)m->biases)[i] = f32_to_f16(b);
            } else {
                ((uint16_t *)m->scales)[i] = f32_to_bf16(s);
                ((uint16_t *)m->biases)[i] = f32_to_bf16(b);
            }
        }
        w->sdtype = sdtype;
        w->biases = m->biases;
    } else if (group) {
        m->scales = xmalloc(ng);
        for (size_t i = 0; i < ng; i++)
            m->scales[i] =
                fmt == WFMT_NVFP4 ? (uint8_t)(0x30 + rnd() % 16) : (uint8_t)(120 + rnd() % 8);
        w->sdtype = ST_U8;
    }
    w->scales = m->scales;
}

static void mat_free(struct mat *m)
{
    free(m->data);
    free(m->scales);
    free(m->biases);
}

#define MAXM 300

/* For one matrix and ISA: every row of every batch equals that row computed alone. */
static void check_invariance(struct threadpool *tps[3], const struct qweight *w, const float *x,
                             const char *name, enum cpu_isa isa)
{
    const int ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 33, 100, MAXM};
    int64_t n = w->n, k = w->k;
    cpu_isa_set(isa);
    float *alone = xmalloc(sizeof(float) * (size_t)(MAXM * n));
    float *y = xmalloc(sizeof(float) * (size_t)(MAXM * n));
    for (int i = 0; i < MAXM; i++) cpu_matmul(tps[0], alone + i * n, x + i * k, w, 1);
    int bad = 0;
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0] && !bad; mi++)
        for (int t = 0; t < 3 && !bad; t++) {
            int m = ms[mi];
            memset(y, 0xff, sizeof(float) * (size_t)(m * n));
            cpu_matmul(tps[t], y, x, w, m);
            for (int i = 0; i < m && !bad; i++)
                for (int64_t r = 0; r < n; r++)
                    if (memcmp(&y[i * n + r], &alone[i * n + r], sizeof(float))) {
                        CHECK(0, "%s %s m=%d threads=%d: y[%d][%lld] = %.9g, alone %.9g", name,
                              cpu_isa_name(isa), m, t + 1, i, (long long)r, y[i * n + r],
                              alone[i * n + r]);
                        bad = 1;
                        break;
                    }
        }
    CHECK(!bad, "%s %s: batch invariance", name, cpu_isa_name(isa));
    free(alone);
    free(y);
}

int main(void)
{
    cpu_kernels_init();
    struct threadpool *tps[3] = {tp_create(1), tp_create(2), tp_create(3)};
    struct {
        enum wfmt f;
        int bits, group;
        enum st_dtype sd;
        const char *name;
    } fmts[] = {
        {WFMT_F32, 32, 0, ST_U8, "f32"},
        {WFMT_F16, 16, 0, ST_U8, "f16"},
        {WFMT_BF16, 16, 0, ST_U8, "bf16"},
        {WFMT_AFFINE, 2, 32, ST_BF16, "mlx2 g32"},
        {WFMT_AFFINE, 2, 64, ST_BF16, "mlx2 g64"},
        {WFMT_AFFINE, 2, 128, ST_BF16, "mlx2 g128"},
        {WFMT_AFFINE, 3, 32, ST_BF16, "mlx3 g32"},
        {WFMT_AFFINE, 3, 64, ST_BF16, "mlx3 g64"},
        {WFMT_AFFINE, 3, 128, ST_BF16, "mlx3 g128"},
        {WFMT_AFFINE, 4, 32, ST_BF16, "mlx4 g32"},
        {WFMT_AFFINE, 4, 64, ST_BF16, "mlx4 g64"},
        {WFMT_AFFINE, 4, 128, ST_BF16, "mlx4 g128"},
        {WFMT_AFFINE, 4, 64, ST_F16, "mlx4 g64 f16 scales"},
        {WFMT_AFFINE, 4, 128, ST_F32, "mlx4 g128 f32 scales"},
        {WFMT_AFFINE, 5, 32, ST_BF16, "mlx5 g32"},
        {WFMT_AFFINE, 5, 64, ST_BF16, "mlx5 g64"},
        {WFMT_AFFINE, 5, 128, ST_BF16, "mlx5 g128"},
        {WFMT_AFFINE, 6, 32, ST_BF16, "mlx6 g32"},
        {WFMT_AFFINE, 6, 64, ST_BF16, "mlx6 g64"},
        {WFMT_AFFINE, 6, 128, ST_BF16, "mlx6 g128"},
        {WFMT_AFFINE, 8, 32, ST_BF16, "mlx8 g32"},
        {WFMT_AFFINE, 8, 64, ST_BF16, "mlx8 g64"},
        {WFMT_AFFINE, 8, 128, ST_BF16, "mlx8 g128"},
        {WFMT_MXFP4, 4, 32, ST_U8, "mxfp4"},
        {WFMT_MXFP8, 8, 32, ST_U8, "mxfp8"},
        {WFMT_NVFP4, 4, 16, ST_U8, "nvfp4"},
    };
    /* n = 40: thread ranges of 16, 16 and 8 rows (tails of every tile width); k crosses a
     * 512-column panel and, for the float formats, leaves a 7-column tail. */
    const int64_t n = 40;
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        int64_t k = fmts[fi].group ? 640 : 647;
        struct mat mt;
        mat_make(&mt, fmts[fi].f, fmts[fi].bits, fmts[fi].group, n, k, fmts[fi].sd);
        /* rows of very different magnitudes: per-row input scaling must not leak */
        float *x = xmalloc(sizeof(float) * (size_t)(MAXM * k));
        for (int i = 0; i < MAXM; i++) {
            float mag = (float)(1 + rnd() % 1000) / 100.0f;
            for (int64_t j = 0; j < k; j++) x[i * k + j] = frand() * mag;
        }
        check_invariance(tps, &mt.w, x, fmts[fi].name, CPU_ISA_PORTABLE);
        if (cpu_isa_available(CPU_ISA_AVX2))
            check_invariance(tps, &mt.w, x, fmts[fi].name, CPU_ISA_AVX2);
        free(x);
        mat_free(&mt);
    }
    for (int t = 0; t < 3; t++) tp_destroy(tps[t]);
    TEST_DONE();
}
