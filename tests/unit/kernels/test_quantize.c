/*
 * Quantizer tests: the element encoders on exact values (every e4m3 code, e2m1 midpoints,
 * e8m0 around the sqrt(2) boundary); rows of every format, bit width and group size give the
 * nearest code of their group's grid (within half a step inside its range) and decode through
 * quant_dequant_row to exactly the grid value of the code written; and the tensors of the
 * MLX copies in the reference data are reproduced byte for byte from their bf16 originals.
 * usage: test_quantize [TESTDATA_DIR]
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quantize.h"
#include "model/safetensors.h"
#include "test_util.h"

static void test_encoders(void)
{
    /* every finite e4m3 code is its own nearest code; -0 keeps its sign */
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue; /* NaN codes */
        CHECK(quant_e4m3_encode(quant_fp8_lut[c]) == c, "e4m3 %#x -> %#x", c,
              quant_e4m3_encode(quant_fp8_lut[c]));
    }
    /* midpoints go to the even code; past 448 saturates (464 is 448's upper midpoint) */
    CHECK(quant_e4m3_encode(1.0625f) == 0x38, "1 + 1/16 rounds to 1 (even)");
    CHECK(quant_e4m3_encode(1.1875f) == 0x3a, "1 + 3/16 rounds to 1.25 (even)");
    CHECK(quant_e4m3_encode(0x1p-10f) == 0x00, "half the smallest subnormal rounds to 0");
    CHECK(quant_e4m3_encode(3 * 0x1p-10f) == 0x02, "1.5 subnormal steps round to 2");
    CHECK(quant_e4m3_encode(15 * 0x1p-10f) == 0x08, "7.5 subnormal steps round to 2^-6");
    CHECK(quant_e4m3_encode(463.9f) == 0x7e && quant_e4m3_encode(464.0f) == 0x7e &&
              quant_e4m3_encode(1e9f) == 0x7e && quant_e4m3_encode(-INFINITY) == 0xfe,
          "e4m3 saturates");
    CHECK(quant_e4m3_encode(NAN) != 0x7f && quant_e4m3_encode(NAN) != 0xff, "no NaN code");

    static const float v[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 8; c++) {
        CHECK(quant_e2m1_encode(v[c]) == c, "e2m1 %g", v[c]);
        CHECK(quant_e2m1_encode(-v[c]) == (8 | c), "e2m1 -%g", v[c]);
    }
    static const float mid[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const uint8_t even[] = {0, 2, 2, 4, 4, 6, 6};
    for (int i = 0; i < 7; i++)
        CHECK(quant_e2m1_encode(mid[i]) == even[i], "e2m1 midpoint %g -> %d", mid[i],
              quant_e2m1_encode(mid[i]));
    CHECK(quant_e2m1_encode(6.9f) == 7 && quant_e2m1_encode(-100.0f) == 15, "e2m1 saturates");
    CHECK(quant_e2m1_encode(-0.1f) == 8, "a small negative value is -0");

    CHECK(quant_e8m0_encode(1.0f) == 127 && quant_e8m0_encode(0.25f) == 125, "e8m0 of 2^e");
    CHECK(quant_e8m0_encode(1.4142f) == 127 && quant_e8m0_encode(1.4143f) == 128,
          "e8m0 rounds log2 at sqrt(2)");
    CHECK(quant_e8m0_encode(0.0f) == 127, "e8m0 of 0");
    CHECK(quant_e8m0_encode(1e-45f) == 0 && quant_e8m0_encode(3e38f) == 254, "e8m0 clamps");
    CHECK(quant_e8m0_encode(INFINITY) == 255 && quant_e8m0_encode(NAN) == 255, "e8m0 of inf");
}

/* Reads code j of an LSB-first stream of `bits`-bit codes. */
static unsigned code_at(const uint8_t *row, int64_t j, int bits)
{
    unsigned v = 0;
    for (int b = 0; b < bits; b++) {
        int64_t bit = j * bits + b;
        v |= (unsigned)((row[bit >> 3] >> (bit & 7)) & 1) << b;
    }
    return v;
}

static float grid_value(const struct quant_target *t, unsigned q, float s, float b)
{
    if (t->fmt == WFMT_AFFINE) return s * (float)q + b;
    return (t->fmt == WFMT_MXFP8 ? quant_fp8_lut[q] : quant_fp4_lut[q]) * s;
}

/* One random row of k values quantized to t: every value decodes (quant_dequant_row) to the
 * grid value of the code written, that value is the nearest on the group's grid, and inside
 * the grid's range it is within half a step. */
static void check_row(const struct quant_target *t, int64_t k, unsigned seed)
{
    float *x = xmalloc(sizeof(float) * (size_t)k), *y = xmalloc(sizeof(float) * (size_t)k);
    srand(seed);
    for (int64_t j = 0; j < k; j++) {
        float r = (float)rand() / (float)RAND_MAX - 0.5f;
        x[j] = r * (j % 3 ? 0.05f : 0.4f) + (seed % 2 ? 0.01f : 0.0f);
        x[j] = bf16_to_f32(f32_to_bf16(x[j])); /* the weights of a bf16 checkpoint */
    }
    if (k >= 64)
        for (int j = 0; j < 32; j++) x[j] = 0; /* a group of zeros */
    uint8_t *codes = xmalloc((size_t)(k * t->bits / 8));
    int64_t groups = k / t->group;
    float *sf = xmalloc(sizeof(float) * (size_t)groups), *bf = xmalloc(sizeof(float) * groups);
    uint8_t *s8 = xmalloc((size_t)groups);
    struct quant_target t32 = *t;
    t32.sdtype = ST_F32;
    int affine = t->fmt == WFMT_AFFINE;
    quant_quantize_row(&t32, x, k, codes, affine ? (void *)sf : (void *)s8, affine ? bf : NULL);
    if (!affine)
        for (int64_t g = 0; g < groups; g++)
            sf[g] = t->fmt == WFMT_NVFP4 ? quant_fp8_lut[s8[g]] : quant_e8m0(s8[g]);
    /* the same codes with the scale dtype of the real files */
    uint8_t *codes2 = xmalloc((size_t)(k * t->bits / 8));
    uint16_t *s16 = xmalloc(2 * (size_t)groups), *b16 = xmalloc(2 * (size_t)groups);
    quant_quantize_row(t, x, k, codes2, affine ? (void *)s16 : (void *)s8, affine ? b16 : NULL);
    CHECK(!memcmp(codes, codes2, (size_t)(k * t->bits / 8)), "codes depend on the scale dtype");
    struct qweight w = {.fmt = t->fmt,
                        .bits = t->bits,
                        .group = t->group,
                        .n = 1,
                        .k = k,
                        .w = codes2,
                        .row_bytes = (size_t)(k * t->bits / 8),
                        .scales = affine ? (const void *)s16 : (const void *)s8,
                        .biases = affine ? b16 : NULL,
                        .sdtype = affine ? ST_BF16 : ST_U8};
    quant_dequant_row(&w, 0, 0, k, y);
    int nq = t->fmt == WFMT_AFFINE ? 1 << t->bits : t->fmt == WFMT_MXFP8 ? 256 : 16;
    int bad_decode = 0, bad_nearest = 0, bad_half = 0;
    for (int64_t j = 0; j < k; j++) {
        int64_t g = j / t->group;
        unsigned q = code_at(codes2, j, t->bits);
        float s = sf[g], b = affine ? bf[g] : 0;
        float sd = affine ? bf16_to_f32(s16[g]) : s, bd = affine ? bf16_to_f32(b16[g]) : 0;
        if (y[j] != grid_value(t, q, sd, bd)) bad_decode++;
        /* nearest on the float-scale grid the codes were chosen on */
        double d = fabs((double)x[j] - grid_value(t, q, s, b)), best = d, lo = 1e30, hi = -1e30;
        for (int c = 0; c < nq; c++) {
            float gv = grid_value(t, (unsigned)c, s, b);
            if (gv != gv) continue;
            best = fmin(best, fabs((double)x[j] - gv));
            lo = fmin(lo, gv);
            hi = fmax(hi, gv);
        }
        /* a value within float rounding of a midpoint ((x - b) / s in float) may take either
         * neighbour */
        double step = affine ? fabs(s) : s * (t->fmt == WFMT_MXFP8 ? 32.0 : 2.0);
        if (d > best + step * 1e-6 + (fabs(x[j]) + fabs(b)) * 0x1p-23) bad_nearest++;
        if (x[j] >= lo && x[j] <= hi && d > step / 2 * (1 + 1e-5)) bad_half++;
    }
    CHECK(!bad_decode, "fmt %d bits %d group %d: %d values decode to another grid value", t->fmt,
          t->bits, t->group, bad_decode);
    CHECK(!bad_nearest, "fmt %d bits %d group %d: %d values not on their nearest code", t->fmt,
          t->bits, t->group, bad_nearest);
    CHECK(!bad_half, "fmt %d bits %d group %d: %d values more than half a step away", t->fmt,
          t->bits, t->group, bad_half);
    free(x);
    free(y);
    free(codes);
    free(codes2);
    free(sf);
    free(bf);
    free(s8);
    free(s16);
    free(b16);
}

static void test_rows(void)
{
    static const int bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    for (int b = 0; b < 6; b++)
        for (int g = 0; g < 3; g++)
            for (unsigned seed = 1; seed <= 4; seed++) {
                struct quant_target t = {WFMT_AFFINE, bits[b], groups[g], ST_BF16};
                check_row(&t, 512, seed * 7 + (unsigned)b);
            }
    struct quant_target fp[] = {
        {WFMT_MXFP4, 4, 32, ST_U8}, {WFMT_MXFP8, 8, 32, ST_U8}, {WFMT_NVFP4, 4, 16, ST_U8}};
    for (int i = 0; i < 3; i++)
        for (unsigned seed = 1; seed <= 4; seed++) check_row(&fp[i], 512, seed);

    /* a constant group: MLX's bias is the value itself, the scale the 1e-7 floor */
    float c[32], s, bb;
    uint8_t q[32], sc[2];
    for (int j = 0; j < 32; j++) c[j] = 0.5f;
    struct quant_target t = {WFMT_AFFINE, 4, 32, ST_F32};
    quant_quantize_row(&t, c, 32, q, &s, &bb);
    CHECK(bb == 0.5f && s == -1e-7f && q[0] == 0 && q[15] == 0, "constant group: s %g b %g", s, bb);
    /* non-finite values never give undefined codes */
    c[3] = NAN;
    c[4] = INFINITY;
    quant_quantize_row(&t, c, 32, q, &s, &bb);
    for (int i = 0; i < 3; i++) quant_quantize_row(&fp[i], c, 32, q, sc, NULL);
}

/* Quantizes every matrix of `src` that `ref` holds quantized and compares the bytes. */
static void check_reference(const char *td, const char *src, const char *ref, struct quant_target t)
{
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/models/%s", td, src);
    snprintf(b, sizeof b, "%s/models/%s", td, ref);
    struct safetensors s, r;
    struct err e;
    if (st_open(&s, a, &e) || st_open(&r, b, &e)) {
        CHECK(0, "test data missing: %s", e.msg);
        return;
    }
    int tensors = 0, differ = 0;
    for (int i = 0; i < r.ntensors; i++) {
        const struct st_tensor *sc = &r.tensors[i];
        size_t nl = strlen(sc->name);
        if (nl < 7 || strcmp(sc->name + nl - 7, ".scales")) continue;
        char name[512];
        snprintf(name, sizeof name, "%.*s.weight", (int)(nl - 7), sc->name);
        const struct st_tensor *x = st_find(&s, name), *rw = st_find(&r, name);
        snprintf(name, sizeof name, "%.*s.biases", (int)(nl - 7), sc->name);
        const struct st_tensor *rb = st_find(&r, name);
        if (!x || !rw || x->ndim != 2 || x->dtype != ST_BF16) continue;
        int64_t n = x->shape[0], k = x->shape[1];
        size_t rowb = (size_t)(k * t.bits / 8), sb = (size_t)(k / t.group) * (rb ? 2 : 1);
        uint8_t *w = xmalloc(rowb * (size_t)n), *ss = xmalloc(sb * (size_t)n),
                *bs = xmalloc(sb * (size_t)n);
        float *row = xmalloc(sizeof(float) * (size_t)k);
        for (int64_t i2 = 0; i2 < n; i2++) {
            for (int64_t j = 0; j < k; j++)
                row[j] = bf16_to_f32(((const uint16_t *)x->data)[i2 * k + j]);
            quant_quantize_row(&t, row, k, w + i2 * rowb, ss + i2 * sb, rb ? bs + i2 * sb : NULL);
        }
        int same = rw->nbytes == rowb * (size_t)n && !memcmp(w, rw->data, rw->nbytes) &&
                   sc->nbytes == sb * (size_t)n && !memcmp(ss, sc->data, sc->nbytes) &&
                   (!rb || (rb->nbytes == sb * (size_t)n && !memcmp(bs, rb->data, rb->nbytes)));
        if (!same) fprintf(stderr, "%s: %s differs from the reference\n", ref, x->name);
        differ += !same;
        tensors++;
        free(w);
        free(ss);
        free(bs);
        free(row);
    }
    CHECK(tensors > 0 && differ == 0, "%s: %d of %d quantized tensors differ", ref, differ,
          tensors);
    printf("%-20s %d quantized tensors byte-identical\n", ref, tensors - differ);
    st_close(&s);
    st_close(&r);
}

int main(int argc, char **argv)
{
    const char *td = argc > 1 ? argv[1] : "../shared/testdata";
    quant_init();
    test_encoders();
    test_rows();
    check_reference(td, "llama-tiny", "llama-tiny-mlx4",
                    (struct quant_target){WFMT_AFFINE, 4, 64, ST_BF16});
    check_reference(td, "llama-tiny", "llama-tiny-mxfp4",
                    (struct quant_target){WFMT_MXFP4, 4, 32, ST_U8});
    check_reference(td, "qwen3-tiny", "qwen3-tiny-mlx8",
                    (struct quant_target){WFMT_AFFINE, 8, 64, ST_BF16});
    check_reference(td, "qwen3-tiny", "qwen3-tiny-mlx3",
                    (struct quant_target){WFMT_AFFINE, 3, 32, ST_BF16});
    check_reference(td, "mistral-tiny", "mistral-tiny-mlx2",
                    (struct quant_target){WFMT_AFFINE, 2, 32, ST_BF16});
    check_reference(td, "gemma3-tiny", "gemma3-tiny-mxfp8",
                    (struct quant_target){WFMT_MXFP8, 8, 32, ST_U8});
    TEST_DONE();
}
