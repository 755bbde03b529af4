/* The KV cache formats: names, head block layout, the per-token writer, a reference
 * reader, and the rotation and codebooks of the rotated (tq) formats. */
#include "paged_kv/kv_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

static const char *const names[KV_DTYPE_COUNT] = {"auto", "f32", "bf16", "fp8", "int8",
                                                  "int4", "tq4", "tq3",  "tq2"};

const char *kv_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < KV_DTYPE_COUNT ? names[dtype] : "?";
}

int kv_dtype_parse(const char *s)
{
    if (!s) return -1;
    for (int i = 0; i < KV_DTYPE_COUNT; i++)
        if (!strcmp(s, names[i])) return i;
    if (!strcmp(s, "fp8_e4m3")) return KV_DTYPE_FP8;
    if (!strcmp(s, "bfloat16")) return KV_DTYPE_BF16;
    if (!strcmp(s, "float32") || !strcmp(s, "fp32")) return KV_DTYPE_F32;
    return -1;
}

int kv_spec_parse_skip(struct kv_spec *s, const char *list, struct err *e)
{
    s->n_skip = 0;
    const char *p = list;
    while (*p) {
        while (*p == ',' || *p == ' ') p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < -1000000 || v > 1000000)
            return err_set(e, "--kv-cache-skip-layers: '%s' is not a list of layer indices", list);
        if (s->n_skip == KV_SKIP_MAX)
            return err_set(e, "--kv-cache-skip-layers: more than %d layers", KV_SKIP_MAX);
        s->skip[s->n_skip++] = (int32_t)v;
        p = end;
        if (*p && *p != ',' && *p != ' ')
            return err_set(e, "--kv-cache-skip-layers: '%s' is not a list of layer indices", list);
    }
    return 0;
}

int kv_spec_skips(const struct kv_spec *s, int l, int n_layers)
{
    for (int i = 0; i < s->n_skip; i++) {
        int v = s->skip[i] < 0 ? n_layers + s->skip[i] : s->skip[i];
        if (v == l) return 1;
    }
    return 0;
}

int kv_dtype_bits(int dtype)
{
    switch (dtype) {
    case KV_DTYPE_F32:
        return 32;
    case KV_DTYPE_BF16:
        return 16;
    case KV_DTYPE_FP8:
    case KV_DTYPE_INT8:
        return 8;
    case KV_DTYPE_INT4:
    case KV_DTYPE_TQ4:
        return 4;
    case KV_DTYPE_TQ3:
        return 3;
    case KV_DTYPE_TQ2:
        return 2;
    default:
        return 0;
    }
}

int kv_dtype_check(int dtype, int head_dim, int block_size, struct err *e)
{
    if (dtype < 0 || dtype >= KV_DTYPE_COUNT)
        return err_set(e, "unknown KV cache format %d", dtype);
    if (block_size < 1) return err_set(e, "KV block size %d", block_size);
    if (dtype == KV_DTYPE_INT4 && head_dim % 2)
        return err_set(e, "KV cache format int4 needs an even head size, not %d", head_dim);
    if (kv_dtype_rotated(dtype) && (head_dim % 8 || head_dim > KV_TQ_MAX_DIM))
        return err_set(
            e, "KV cache format %s needs a head size that is a multiple of 8 up to %d, not %d",
            names[dtype], KV_TQ_MAX_DIM, head_dim);
    return 0;
}

size_t kv_header_bytes(int dtype, int role, int block_size, int head_dim)
{
    switch (dtype) {
    case KV_DTYPE_FP8:
        return 2 * (size_t)block_size;
    case KV_DTYPE_INT8:
    case KV_DTYPE_INT4:
        return 2 * (size_t)(role == KV_ROLE_K ? head_dim : block_size);
    case KV_DTYPE_TQ4:
    case KV_DTYPE_TQ3:
    case KV_DTYPE_TQ2:
        return 2 * (size_t)block_size;
    default:
        return 0;
    }
}

size_t kv_head_block_bytes(int dtype, int role, int block_size, int head_dim)
{
    size_t n = kv_header_bytes(dtype, role, block_size, head_dim) +
               (size_t)block_size * kv_row_bytes(dtype, head_dim);
    return (n + 15) & ~(size_t)15;
}

/* e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7f / 0xff are NaN. */
const float kv_e4m3_value[256] = {
    0.0f,         0.001953125f,  0.00390625f,  0.005859375f,  0.0078125f,   0.009765625f,
    0.01171875f,  0.013671875f,  0.015625f,    0.017578125f,  0.01953125f,  0.021484375f,
    0.0234375f,   0.025390625f,  0.02734375f,  0.029296875f,  0.03125f,     0.03515625f,
    0.0390625f,   0.04296875f,   0.046875f,    0.05078125f,   0.0546875f,   0.05859375f,
    0.0625f,      0.0703125f,    0.078125f,    0.0859375f,    0.09375f,     0.1015625f,
    0.109375f,    0.1171875f,    0.125f,       0.140625f,     0.15625f,     0.171875f,
    0.1875f,      0.203125f,     0.21875f,     0.234375f,     0.25f,        0.28125f,
    0.3125f,      0.34375f,      0.375f,       0.40625f,      0.4375f,      0.46875f,
    0.5f,         0.5625f,       0.625f,       0.6875f,       0.75f,        0.8125f,
    0.875f,       0.9375f,       1.0f,         1.125f,        1.25f,        1.375f,
    1.5f,         1.625f,        1.75f,        1.875f,        2.0f,         2.25f,
    2.5f,         2.75f,         3.0f,         3.25f,         3.5f,         3.75f,
    4.0f,         4.5f,          5.0f,         5.5f,          6.0f,         6.5f,
    7.0f,         7.5f,          8.0f,         9.0f,          10.0f,        11.0f,
    12.0f,        13.0f,         14.0f,        15.0f,         16.0f,        18.0f,
    20.0f,        22.0f,         24.0f,        26.0f,         28.0f,        30.0f,
    32.0f,        36.0f,         40.0f,        44.0f,         48.0f,        52.0f,
    56.0f,        60.0f,         64.0f,        72.0f,         80.0f,        88.0f,
    96.0f,        104.0f,        112.0f,       120.0f,        128.0f,       144.0f,
    160.0f,       176.0f,        192.0f,       208.0f,        224.0f,       240.0f,
    256.0f,       288.0f,        320.0f,       352.0f,        384.0f,       416.0f,
    448.0f,       0.0f,          -0.0f,        -0.001953125f, -0.00390625f, -0.005859375f,
    -0.0078125f,  -0.009765625f, -0.01171875f, -0.013671875f, -0.015625f,   -0.017578125f,
    -0.01953125f, -0.021484375f, -0.0234375f,  -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f,    -0.03515625f,  -0.0390625f,  -0.04296875f,  -0.046875f,   -0.05078125f,
    -0.0546875f,  -0.05859375f,  -0.0625f,     -0.0703125f,   -0.078125f,   -0.0859375f,
    -0.09375f,    -0.1015625f,   -0.109375f,   -0.1171875f,   -0.125f,      -0.140625f,
    -0.15625f,    -0.171875f,    -0.1875f,     -0.203125f,    -0.21875f,    -0.234375f,
    -0.25f,       -0.28125f,     -0.3125f,     -0.34375f,     -0.375f,      -0.40625f,
    -0.4375f,     -0.46875f,     -0.5f,        -0.5625f,      -0.625f,      -0.6875f,
    -0.75f,       -0.8125f,      -0.875f,      -0.9375f,      -1.0f,        -1.125f,
    -1.25f,       -1.375f,       -1.5f,        -1.625f,       -1.75f,       -1.875f,
    -2.0f,        -2.25f,        -2.5f,        -2.75f,        -3.0f,        -3.25f,
    -3.5f,        -3.75f,        -4.0f,        -4.5f,         -5.0f,        -5.5f,
    -6.0f,        -6.5f,         -7.0f,        -7.5f,         -8.0f,        -9.0f,
    -10.0f,       -11.0f,        -12.0f,       -13.0f,        -14.0f,       -15.0f,
    -16.0f,       -18.0f,        -20.0f,       -22.0f,        -24.0f,       -26.0f,
    -28.0f,       -30.0f,        -32.0f,       -36.0f,        -40.0f,       -44.0f,
    -48.0f,       -52.0f,        -56.0f,       -60.0f,        -64.0f,       -72.0f,
    -80.0f,       -88.0f,        -96.0f,       -104.0f,       -112.0f,      -120.0f,
    -128.0f,      -144.0f,       -160.0f,      -176.0f,       -192.0f,      -208.0f,
    -224.0f,      -240.0f,       -256.0f,      -288.0f,       -320.0f,      -352.0f,
    -384.0f,      -416.0f,       -448.0f,      0.0f,
};

uint8_t kv_f32_to_e4m3(float x)
{
    uint8_t s = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (!(a == a)) return 0;
    if (a >= 448.0f) return s | 0x7e;
    if (a < 0.015625f) /* subnormal: steps of 2^-9 (8 rounds up to the least normal, 0x08) */
        return s | (uint8_t)lrintf(a * 512.0f);
    int e;
    float f = frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
    int m = (int)lrintf((f * 2.0f - 1.0f) * 8.0f), E = e + 6;
    if (m == 8) {
        m = 0;
        E++;
    }
    return s | (uint8_t)(E << 3) | (uint8_t)m; /* a < 448 keeps (E, m) below (15, 7) */
}

/* Lloyd-Max centroids of the standard normal (the positive half; the codebook is
 * symmetric). Mean square distortion: 2 bits 0.1175, 3 bits 0.03455, 4 bits 0.009501. */
static const float cb2[4] = {-1.5104176f, -0.4527800f, 0.4527800f, 1.5104176f};
static const float cb3[8] = {-2.1519457f, -1.3439093f, -0.7560053f, -0.2450942f,
                             0.2450942f,  0.7560053f,  1.3439093f,  2.1519457f};
static const float cb4[16] = {-2.7325896f, -2.0690172f, -1.6180464f, -1.2562312f,
                              -0.9423405f, -0.6567591f, -0.3880483f, -0.1283950f,
                              0.1283950f,  0.3880483f,  0.6567591f,  0.9423405f,
                              1.2562312f,  1.6180464f,  2.0690172f,  2.7325896f};

const float *kv_tq_codebook(int bits)
{
    return bits == 2 ? cb2 : bits == 3 ? cb3 : bits == 4 ? cb4 : NULL;
}

/* Sign bit of coordinate c of the rotation: splitmix64 of a fixed seed and c / 64. The seed
 * is part of the format: changing it changes what stored blocks mean. */
static int rot_sign(int c)
{
    uint64_t z = 0x70a90da5eed00001ull + (uint64_t)(c >> 6) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (int)((z >> (c & 63)) & 1);
}

static void fwht(float *x, int m)
{
    for (int h = 1; h < m; h *= 2)
        for (int i = 0; i < m; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)m);
    for (int i = 0; i < m; i++) x[i] *= s;
}

static void rotate(float *x, int d, int inverse)
{
    for (int start = 0; start < d;) {
        int m = 1;
        while (m * 2 <= d - start) m *= 2;
        if (!inverse)
            for (int i = 0; i < m; i++)
                if (rot_sign(start + i)) x[start + i] = -x[start + i];
        fwht(x + start, m);
        if (inverse)
            for (int i = 0; i < m; i++)
                if (rot_sign(start + i)) x[start + i] = -x[start + i];
        start += m;
    }
}

void kv_tq_rotate(float *x, int d)
{
    rotate(x, d, 0);
}

void kv_tq_unrotate(float *x, int d)
{
    rotate(x, d, 1);
}

/* The least bf16 at or above s >= 0 (a scale rounded up keeps every code in range). */
static uint16_t bf16_up(float s)
{
    uint32_t u;
    memcpy(&u, &s, 4);
    if (u & 0xffffu) u += 0x10000u;
    return (uint16_t)(u >> 16);
}

static int code_get(int dtype, const uint8_t *row, int c)
{
    if (dtype == KV_DTYPE_INT8) return ((const int8_t *)row)[c];
    return ((row[c >> 1] >> ((c & 1) * 4)) & 15) - 8;
}

static void code_set(int dtype, uint8_t *row, int c, int q)
{
    if (dtype == KV_DTYPE_INT8) {
        ((int8_t *)row)[c] = (int8_t)q;
        return;
    }
    int sh = (c & 1) * 4;
    row[c >> 1] = (uint8_t)((row[c >> 1] & ~(15 << sh)) | ((q + 8) << sh));
}

static int tq_get(const uint8_t *row, int bits, int c)
{
    if (bits == 4) return (row[c >> 1] >> ((c & 1) * 4)) & 15;
    if (bits == 2) return (row[c >> 2] >> ((c & 3) * 2)) & 3;
    const uint8_t *g = row + (c >> 3) * 3;
    uint32_t w = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16;
    return (int)(w >> ((c & 7) * 3)) & 7;
}

static void tq_set(uint8_t *row, int bits, int c, int q)
{
    if (bits == 3) {
        uint8_t *g = row + (c >> 3) * 3;
        uint32_t w = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16;
        int sh = (c & 7) * 3;
        w = (w & ~(7u << sh)) | (uint32_t)q << sh;
        g[0] = (uint8_t)w;
        g[1] = (uint8_t)(w >> 8);
        g[2] = (uint8_t)(w >> 16);
        return;
    }
    int per = 8 / bits, sh = (c % per) * bits, mask = (1 << bits) - 1;
    row[c / per] = (uint8_t)((row[c / per] & ~(mask << sh)) | (q << sh));
}

/* Round half away from zero of q / 2^k. */
static int shift_round(int q, int k)
{
    if (k > 16) return 0;
    int h = 1 << (k - 1);
    return q >= 0 ? (q + h) >> k : -((-q + h) >> k);
}

static int clamp_code(float v, int qmax)
{
    long q = lrintf(v);
    return q > qmax ? qmax : q < -qmax ? -qmax : (int)q;
}

static void store_int(int dtype, int role, uint8_t *hb, int off, int B, int d, const float *x)
{
    int qmax = dtype == KV_DTYPE_INT8 ? 127 : 7;
    uint16_t *sc = (uint16_t *)hb;
    uint8_t *data = hb + kv_header_bytes(dtype, role, B, d);
    size_t rb = kv_row_bytes(dtype, d);
    uint8_t *row = data + (size_t)off * rb;
    if (role == KV_ROLE_V) { /* one scale for the token */
        float amax = 0;
        for (int c = 0; c < d; c++) amax = fmaxf(amax, fabsf(x[c]));
        sc[off] = bf16_up(amax / (float)qmax);
        float s = bf16_to_f32(sc[off]), inv = s > 0 ? 1.0f / s : 0;
        for (int c = 0; c < d; c++) code_set(dtype, row, c, clamp_code(x[c] * inv, qmax));
        return;
    }
    for (int c = 0; c < d; c++) { /* keys: one scale per channel of the block */
        float a = fabsf(x[c]), s = off ? bf16_to_f32(sc[c]) : 0;
        if (off == 0 || s == 0) {
            s = bf16_to_f32(bf16_up(a / (float)qmax)); /* earlier codes of a zero scale are all 0 */
        } else if (a > s * (float)qmax) {
            int k = 0;
            while (s * (float)qmax < a) {
                s *= 2;
                k++;
            }
            for (int t = 0; t < off; t++) {
                uint8_t *r = data + (size_t)t * rb;
                code_set(dtype, r, c, shift_round(code_get(dtype, r, c), k));
            }
        }
        sc[c] = f32_to_bf16(s);
        code_set(dtype, row, c, s > 0 ? clamp_code(x[c] / s, qmax) : 0);
    }
}

/* One bf16 scale per token (and head): fixed as the token is written, never revised, so a
 * token's codes do not depend on what the block holds later. */
static void store_fp8(uint8_t *hb, int off, int B, int d, const float *x, float fixed)
{
    uint16_t *sc = (uint16_t *)hb;
    float amax = 0;
    for (int c = 0; c < d; c++) amax = fmaxf(amax, fabsf(x[c]));
    sc[off] = fixed > 0 ? f32_to_bf16(fixed) : bf16_up(amax / 448.0f);
    float s = bf16_to_f32(sc[off]), inv = s > 0 ? 1.0f / s : 0;
    uint8_t *row = hb + 2 * (size_t)B + (size_t)off * d;
    for (int c = 0; c < d; c++) row[c] = kv_f32_to_e4m3(x[c] * inv);
}

static void store_tq(int dtype, uint8_t *hb, int off, int B, int d, const float *x)
{
    int bits = kv_dtype_bits(dtype), n = 1 << bits;
    const float *cb = kv_tq_codebook(bits);
    uint16_t *gain = (uint16_t *)hb;
    uint8_t *row = hb + 2 * (size_t)B + (size_t)off * kv_row_bytes(dtype, d);
    float y[KV_TQ_MAX_DIM];
    double n2 = 0;
    for (int c = 0; c < d; c++) {
        y[c] = x[c];
        n2 += (double)x[c] * x[c];
    }
    float norm = (float)sqrt(n2);
    kv_tq_rotate(y, d);
    float f = norm > 0 ? sqrtf((float)d) / norm : 0, q2 = 0;
    for (int c = 0; c < d; c++) {
        float v = y[c] * f;
        int i = 0;
        while (i < n - 1 && v > 0.5f * (cb[i] + cb[i + 1])) i++;
        tq_set(row, bits, c, i);
        q2 += cb[i] * cb[i];
    }
    gain[off] = f32_to_bf16(norm > 0 ? norm / sqrtf(q2) : 0);
}

void kv_store_row(int dtype, int role, uint8_t *hb, int off, int block_size, int head_dim,
                  const float *x, float fixed_scale)
{
    int d = head_dim;
    switch (dtype) {
    case KV_DTYPE_F32:
        memcpy((float *)hb + (size_t)off * d, x, sizeof(float) * (size_t)d);
        break;
    case KV_DTYPE_BF16:
        for (int c = 0; c < d; c++) ((uint16_t *)hb)[(size_t)off * d + c] = f32_to_bf16(x[c]);
        break;
    case KV_DTYPE_FP8:
        store_fp8(hb, off, block_size, d, x, fixed_scale);
        break;
    case KV_DTYPE_INT8:
    case KV_DTYPE_INT4:
        store_int(dtype, role, hb, off, block_size, d, x);
        break;
    default:
        store_tq(dtype, hb, off, block_size, d, x);
        break;
    }
}

void kv_load_row(int dtype, int role, const uint8_t *hb, int off, int block_size, int head_dim,
                 float *out)
{
    int d = head_dim;
    const uint8_t *data = hb + kv_header_bytes(dtype, role, block_size, d);
    const uint8_t *row = data + (size_t)off * kv_row_bytes(dtype, d);
    const uint16_t *sc = (const uint16_t *)hb;
    switch (dtype) {
    case KV_DTYPE_F32:
        memcpy(out, row, sizeof(float) * (size_t)d);
        break;
    case KV_DTYPE_BF16:
        for (int c = 0; c < d; c++) out[c] = bf16_to_f32(((const uint16_t *)row)[c]);
        break;
    case KV_DTYPE_FP8:
        for (int c = 0; c < d; c++) out[c] = kv_e4m3_value[row[c]] * bf16_to_f32(sc[off]);
        break;
    case KV_DTYPE_INT8:
    case KV_DTYPE_INT4:
        for (int c = 0; c < d; c++)
            out[c] = (float)code_get(dtype, row, c) * bf16_to_f32(sc[role == KV_ROLE_K ? c : off]);
        break;
    default: {
        int bits = kv_dtype_bits(dtype);
        const float *cb = kv_tq_codebook(bits);
        float g = bf16_to_f32(sc[off]);
        for (int c = 0; c < d; c++) out[c] = cb[tq_get(row, bits, c)] * g;
        kv_tq_unrotate(out, d);
    }
    }
}
