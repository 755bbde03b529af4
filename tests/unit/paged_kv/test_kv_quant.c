/* The KV cache formats: e4m3 coding, the rotation, and each format's round-trip error
 * against the bound kv_quant.h states, blocks written a token at a time with the scales
 * growing as later tokens outgrow them. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "paged_kv/kv_quant.h"
#include "test_util.h"
#define TEST_RAND_SEED 0x1234567u
#include "test_rand.h"

static void test_names(void)
{
    for (int i = 0; i < KV_DTYPE_COUNT; i++)
        CHECK(kv_dtype_parse(kv_dtype_name(i)) == i, "%s", kv_dtype_name(i));
    CHECK(kv_dtype_parse("fp8_e4m3") == KV_DTYPE_FP8, "alias");
    CHECK(kv_dtype_parse("int3") == -1 && kv_dtype_parse("") == -1, "bad names");
    struct kv_spec s = {0};
    struct err e = {0};
    CHECK(kv_spec_parse_skip(&s, "0,1,-2,-1", &e) == 0 && s.n_skip == 4, "%s", e.msg);
    CHECK(kv_spec_skips(&s, 0, 10) && kv_spec_skips(&s, 9, 10) && kv_spec_skips(&s, 8, 10) &&
              !kv_spec_skips(&s, 5, 10),
          "skips");
    CHECK(kv_spec_parse_skip(&s, "1,x", &e) == -1, "bad list refused");
    CHECK(kv_dtype_check(KV_DTYPE_TQ3, 36, 16, &e) == -1, "tq needs multiples of 8");
    CHECK(kv_dtype_check(KV_DTYPE_TQ3, 96, 16, &e) == 0, "%s", e.msg);
    CHECK(kv_dtype_check(KV_DTYPE_INT4, 33, 16, &e) == -1, "int4 needs an even head size");
    /* exact sizes: header + codes, rounded up to 16 bytes */
    CHECK(kv_head_block_bytes(KV_DTYPE_FP8, KV_ROLE_K, 16, 64) == 1056, "fp8");
    CHECK(kv_head_block_bytes(KV_DTYPE_INT8, KV_ROLE_K, 16, 64) == 1152, "int8 K");
    CHECK(kv_head_block_bytes(KV_DTYPE_INT8, KV_ROLE_V, 16, 64) == 1056, "int8 V");
    CHECK(kv_head_block_bytes(KV_DTYPE_INT4, KV_ROLE_K, 16, 64) == 640, "int4 K");
    CHECK(kv_head_block_bytes(KV_DTYPE_TQ3, KV_ROLE_V, 16, 64) == 416, "tq3");
    CHECK(kv_head_block_bytes(KV_DTYPE_TQ2, KV_ROLE_V, 16, 64) == 288, "tq2");
}

static void test_e4m3(void)
{
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue; /* NaN codes */
        uint8_t r = kv_f32_to_e4m3(kv_e4m3_value[c]);
        CHECK(r == c || (c == 0x80 && r == 0x80), "code %d -> %g -> %d", c,
              (double)kv_e4m3_value[c], r);
    }
    CHECK(kv_f32_to_e4m3(1000.0f) == 0x7e && kv_f32_to_e4m3(-1e30f) == 0xfe, "saturates");
    CHECK(kv_f32_to_e4m3(1.0625f) == 0x38, "a tie rounds to even (1.0)");
    CHECK(kv_f32_to_e4m3(1.1875f) == 0x3a, "a tie rounds to even (1.25)");
    CHECK(kv_f32_to_e4m3(0.0155f) == 0x08, "rounds up into the normals");
    CHECK(kv_e4m3_value[0x7e] == 448.0f && kv_e4m3_value[0x01] == 0.001953125f, "values");
}

static void test_rotation(void)
{
    int dims[] = {8, 32, 64, 96, 128, 512};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        int d = dims[i];
        float x[512], y[512];
        double n0 = 0, n1 = 0, diff = 0;
        for (int c = 0; c < d; c++) {
            x[c] = y[c] = gauss();
            n0 += (double)x[c] * x[c];
        }
        kv_tq_rotate(y, d);
        for (int c = 0; c < d; c++) n1 += (double)y[c] * y[c];
        kv_tq_unrotate(y, d);
        for (int c = 0; c < d; c++) diff = fmax(diff, fabs(y[c] - x[c]));
        /* float rounding of log2(d) butterfly stages */
        CHECK(fabs(n1 - n0) < 1e-4 * n0 && diff < 1e-5, "d %d: norm %g vs %g, diff %g", d, n1, n0,
              diff);
    }
}

/* Writes n tokens of d values (token t scaled by growth^t, channel 3 an outlier) into one
 * head block, then checks every decoded value against the format's bound. */
static void roundtrip(int dt, int role, int B, int d, float growth)
{
    size_t hbb = kv_head_block_bytes(dt, role, B, d);
    uint8_t *hb = calloc(1, hbb);
    float *x = malloc(sizeof(float) * (size_t)B * d), out[512];
    memset(hb, 0xa5, hbb); /* stale bytes: off 0 must start the block afresh */
    float amax_c[512] = {0};
    for (int t = 0; t < B; t++) {
        for (int c = 0; c < d; c++) {
            float v = gauss() * powf(growth, (float)t) * (c == 3 ? 8.0f : 1.0f);
            if (t == 5 && c == 7) v = 0; /* a zero */
            x[t * d + c] = v;
            amax_c[c] = fmaxf(amax_c[c], fabsf(v));
        }
        kv_store_row(dt, role, hb, t, B, d, x + t * d, 0);
    }
    const uint16_t *sc = (const uint16_t *)hb;
    double se = 0, sx = 0;
    int bad = 0;
    for (int t = 0; t < B; t++) {
        kv_load_row(dt, role, hb, t, B, d, out);
        float amax_t = 0;
        for (int c = 0; c < d; c++) amax_t = fmaxf(amax_t, fabsf(x[t * d + c]));
        for (int c = 0; c < d; c++) {
            float v = x[t * d + c], e = fabsf(out[c] - v), bound = INFINITY;
            se += (double)e * e;
            sx += (double)v * v;
            if (dt == KV_DTYPE_F32) bound = 0;
            if (dt == KV_DTYPE_BF16) bound = fabsf(v) / 256;
            if (dt == KV_DTYPE_FP8) {
                uint32_t u = (uint32_t)sc[t] << 16;
                float s;
                memcpy(&s, &u, 4);
                bound = fabsf(v) / 16 + s / 1024;
                if (s > 1.008f * amax_t / 448) bad++;
            }
            if ((dt == KV_DTYPE_INT8 || dt == KV_DTYPE_INT4) && role == KV_ROLE_K) {
                float qmax = dt == KV_DTYPE_INT8 ? 127 : 7;
                uint32_t u = (uint32_t)sc[c] << 16;
                float s;
                memcpy(&s, &u, 4);
                bound = s * 1.0001f;
                if (s > 2.02f * amax_c[c] / qmax) bad++;
            }
            if ((dt == KV_DTYPE_INT8 || dt == KV_DTYPE_INT4) && role == KV_ROLE_V) {
                float qmax = dt == KV_DTYPE_INT8 ? 127 : 7;
                uint32_t u = (uint32_t)sc[t] << 16;
                float s;
                memcpy(&s, &u, 4);
                bound = s * 0.5001f;
                if (s > 1.008f * amax_t / qmax) bad++;
            }
            if (e > bound) bad++;
        }
    }
    CHECK(!bad, "%s %s d %d growth %g: %d values past the bound", kv_dtype_name(dt),
          role ? "V" : "K", d, (double)growth, bad);
    if (kv_dtype_rotated(dt)) { /* mean square: the codebook's distortion, 30% slack for the
                                   sample size and the bf16 gain */
        double want = dt == KV_DTYPE_TQ4 ? 0.009501 : dt == KV_DTYPE_TQ3 ? 0.03455 : 0.1175;
        CHECK(se / sx < 1.3 * want, "%s d %d: relative mse %g, distortion %g", kv_dtype_name(dt), d,
              se / sx, want);
    }
    free(x);
    free(hb);
}

static void test_roundtrip(void)
{
    int dims[] = {32, 64, 96};
    float growth[] = {1.0f, 1.3f, 0.7f};
    for (int dt = KV_DTYPE_F32; dt < KV_DTYPE_COUNT; dt++)
        for (int role = 0; role < 2; role++)
            for (int i = 0; i < 3; i++)
                for (int g = 0; g < 3; g++) roundtrip(dt, role, 16, dims[i], growth[g]);
    for (int i = 0; i < 20; i++) roundtrip(KV_DTYPE_TQ3, KV_ROLE_K, 16, 128, 1.0f);
}

/* A block whose later token is 1000x the first: int8 key scales grow by powers of two and
 * the first token's codes are rescaled (one more rounding, within the stated bound). */
static void test_growth(void)
{
    int B = 4, d = 8;
    uint8_t hb[256] = {0};
    float a[8] = {1, -2, 3, -4, 0.5f, 0, 7, 8}, b[8], out[8];
    for (int c = 0; c < d; c++) b[c] = a[c] * 1000;
    kv_store_row(KV_DTYPE_INT8, KV_ROLE_K, hb, 0, B, d, a, 0);
    kv_load_row(KV_DTYPE_INT8, KV_ROLE_K, hb, 0, B, d, out);
    CHECK(fabsf(out[6] - 7) < 7.0f / 127, "before growth %g", (double)out[6]);
    kv_store_row(KV_DTYPE_INT8, KV_ROLE_K, hb, 1, B, d, b, 0);
    kv_load_row(KV_DTYPE_INT8, KV_ROLE_K, hb, 1, B, d, out);
    for (int c = 0; c < d; c++)
        CHECK(fabsf(out[c] - b[c]) <= fabsf(b[c]) / 127 * 2.02f, "c %d: %g vs %g", c,
              (double)out[c], (double)b[c]);
    kv_load_row(KV_DTYPE_INT8, KV_ROLE_K, hb, 0, B, d, out);
    CHECK(out[7] == 0 || fabsf(out[7] - 8) <= 8 * 1000 * 2.02f / 127, "rescaled %g",
          (double)out[7]);
    /* fp8: a checkpoint scale saturates */
    uint8_t f8[64] = {0};
    float big[8] = {1000, 1, 0, 0, 0, 0, 0, 0};
    kv_store_row(KV_DTYPE_FP8, KV_ROLE_K, f8, 0, B, d, big, 1.0f);
    kv_load_row(KV_DTYPE_FP8, KV_ROLE_K, f8, 0, B, d, out);
    CHECK(out[0] == 448 && out[1] == 1, "fixed scale: %g %g", (double)out[0], (double)out[1]);
    /* a one-hot vector spreads over every rotated coordinate at equal size: the gain makes
     * its reconstruction exact up to float rounding */
    uint8_t tq[256] = {0};
    float one[32] = {0}, o2[32];
    one[5] = 3;
    kv_store_row(KV_DTYPE_TQ2, KV_ROLE_V, tq, 0, 4, 32, one, 0);
    kv_load_row(KV_DTYPE_TQ2, KV_ROLE_V, tq, 0, 4, 32, o2);
    CHECK(fabsf(o2[5] - 3) < 0.02f && fabsf(o2[0]) < 0.02f, "one-hot %g %g", (double)o2[5],
          (double)o2[0]);
}

int main(void)
{
    test_names();
    test_e4m3();
    test_rotation();
    test_roundtrip();
    test_growth();
    TEST_DONE();
}
