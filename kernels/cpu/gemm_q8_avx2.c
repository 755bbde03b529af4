/*
 * Affine 4- and 8-bit weights against int8 activations with 256-bit vectors (see gemm.h
 * and gemm_q8_avx2.h): the input preparation, the panel packing, the driver and the AVX2
 * tiles. The AVX-VNNI tiles (gemm_q8_vnni_avx2.c) run over the same panels.
 *
 * A prepared x row: k int8 values (4-bit weights: each 8 columns as their 4 even ones, then
 * their 4 odd ones, the order a 4-bit panel unpacks to), padded to 64 bytes; then per
 * group dx = max|x| / 127, then dx * sum(xq). Cost per 8 columns of 16 weight rows and one
 * x row: 4 vpdpbusd (AVX-VNNI), 4 vpmaddubsw + 2 vpaddw + 2 vpmaddwd (AVX2, 4-bit) or
 * 4 vpsignb + 4 vpmaddubsw + 4 vpmaddwd (AVX2, 8-bit), plus their int32 adds; per group, 4
 * float operations per 8 weight rows.
 */
#include "common/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_q8_avx2.h"
#include "kernels/cpu/quant.h"

G8_TABLE(g8_tab_avx2_e4, 4, 0)
G8_TABLE(g8_tab_avx2_e2, 2, 0)
G8_TABLE(g8_tab_avx2_s8, 4, 2)

static int64_t xq_bytes(const struct qweight *w)
{
    return g8_xq_bytes(w->k, 4);
}

size_t gemm_q8_avx2_prep_bytes(const struct qweight *w)
{
    return (size_t)xq_bytes(w) + (size_t)(w->k / w->group) * 2 * sizeof(float);
}

void gemm_q8_avx2_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride)
{
    int64_t k = w->k, G = w->group, groups = k / G, kq = xq_bytes(w);
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * k;
        uint8_t *row = xp + (size_t)i * stride;
        float *dx = (float *)(row + kq), *xs = dx + groups;
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = xi + g * G;
            float amax = g8_absmax(xg, G);
            float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
            __m256 vid = _mm256_set1_ps(id);
            __m256i sum = _mm256_setzero_si256();
            for (int64_t j = 0; j < G; j += 32) {
                int32_t q[32];
                for (int v = 0; v < 4; v++) {
                    __m256i qv =
                        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + j + 8 * v), vid));
                    _mm256_storeu_si256((__m256i *)(q + 8 * v), qv);
                    sum = _mm256_add_epi32(sum, qv);
                }
                int64_t c = g * G + j;
                if (w->bits == 4) {
                    /* each 8 columns: their 4 even ones, then their 4 odd ones */
                    for (int t = 0; t < 32; t++)
                        row[c + (t & ~7) + (t & 1) * 4 + (t & 7) / 2] = (uint8_t)(int8_t)q[t];
                } else {
                    for (int t = 0; t < 32; t++) row[c + t] = (uint8_t)(int8_t)q[t];
                }
            }
            __m128i s4 =
                _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            dx[g] = d;
            xs[g] = d * (float)_mm_cvtsi128_si32(s4);
        }
    }
}

/*
 * The codes of rows [rb, rb + nb) (rows past nb zero), columns [kp, kp + len), into pw
 * [len / 4][2][8 rows] of 4 codes, 8 rows and 32 columns at a time:
 *   8-bit: 32 codes of each row as they lie (AVX-VNNI) or as q - 128 (AVX2: signed, for
 *     vpsignb + vpmaddubsw), 8 x 8 words transposed;
 *   4-bit: each row's 16 bytes (4 words of 8 codes) transposed while still packed,
 *     two rows a register (rows l and l + 4), then unpacked: word d's low nibbles are the
 *     row's codes 8d, 8d + 2, 8d + 4, 8d + 6, its high ones the odd ones, two steps of the
 *     tile (x prepared in that order). 12 shuffles per 8 rows by 32 columns, where
 *     unpacking first and transposing 8 x 8 words took 32.
 */
ALWAYS_INLINE void pack_codes(const struct qweight *w, const int bits, const int sgn, int64_t rb,
                              int nb, int64_t kp, int64_t len, uint8_t *pw)
{
    const int64_t span = 32;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int v = 0; v < 2; v++) {
        const uint8_t *rows[8];
        for (int l = 0; l < 8; l++) {
            int j = v * 8 + l;
            rows[l] = j < nb ? w->w + (size_t)(rb + j) * w->row_bytes : NULL;
        }
        for (int64_t c = 0; c < len / span; c++) {
            int64_t c0 = kp + c * span;
            __m256i r[8];
            uint8_t *dst = pw + (c * 8 * 2 + v) * 32; /* step t at dst + t * 64 */
            if (bits == 4) {
                __m256i z[4], t[4];
                for (int l = 0; l < 4; l++) {
                    __m128i a = rows[l] ? _mm_loadu_si128((const __m128i *)(rows[l] + c0 / 2))
                                        : _mm_setzero_si128();
                    __m128i b = rows[l + 4]
                                    ? _mm_loadu_si128((const __m128i *)(rows[l + 4] + c0 / 2))
                                    : _mm_setzero_si128();
                    z[l] = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
                }
                t[0] = _mm256_unpacklo_epi32(z[0], z[1]);
                t[1] = _mm256_unpackhi_epi32(z[0], z[1]);
                t[2] = _mm256_unpacklo_epi32(z[2], z[3]);
                t[3] = _mm256_unpackhi_epi32(z[2], z[3]);
                const __m256i m4 = _mm256_set1_epi8(0x0f);
                __m256i d[4] = {
                    _mm256_unpacklo_epi64(t[0], t[2]), _mm256_unpackhi_epi64(t[0], t[2]),
                    _mm256_unpacklo_epi64(t[1], t[3]), _mm256_unpackhi_epi64(t[1], t[3])};
                for (int q = 0; q < 4; q++) {
                    _mm256_storeu_si256((__m256i *)(dst + 2 * q * 64), _mm256_and_si256(d[q], m4));
                    _mm256_storeu_si256((__m256i *)(dst + (2 * q + 1) * 64),
                                        _mm256_and_si256(_mm256_srli_epi16(d[q], 4), m4));
                }
                continue;
            }
            for (int l = 0; l < 8; l++) {
                if (!rows[l])
                    r[l] = _mm256_setzero_si256();
                else if (sgn)
                    r[l] =
                        _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rows[l] + c0)), flip);
                else
                    r[l] = _mm256_loadu_si256((const __m256i *)(rows[l] + c0));
            }
            transpose8x32(r);
            for (int t = 0; t < 8; t++) _mm256_storeu_si256((__m256i *)(dst + t * 64), r[t]);
        }
    }
}

/*
 * Rows [rb, rb + nb) of W, columns [kp, kp + len), into the panel: pw [len / 4][2][8 rows]
 * of 4 codes (rows past nb zero), ps [gpp][16] scales then [gpp][16] biases at
 * ps + 16 * gmax. Signed 8-bit codes q - 128 take 128 s_g into the bias:
 * s q + b = s (q - 128) + (b + 128 s).
 */
ALWAYS_INLINE void pack_panel(const struct qweight *w, const int bits, const int sgn, int64_t rb,
                              int nb, int64_t kp, int64_t len, uint8_t *pw, float *ps, int64_t gmax)
{
    int64_t groups = w->k / w->group, gpp = len / w->group, g0 = kp / w->group;
    pack_codes(w, bits, sgn, rb, nb, kp, len, pw);
    for (int j = 0; j < G8NB; j++) {
        int64_t e = (rb + j) * groups + g0;
        for (int64_t g = 0; g < gpp; g++) {
            float sc = j < nb ? quant_load_scale(w->scales, w->sdtype, e + g) : 0.0f;
            float bi = j < nb ? quant_load_scale(w->biases, w->sdtype, e + g) : 0.0f;
            ps[g * G8NB + j] = sc;
            ps[G8NB * gmax + g * G8NB + j] = sgn ? bi + 128.0f * sc : bi;
        }
    }
}

static void pack4(const struct qweight *w, int E, int64_t rb, int nb, int64_t kp, int64_t len,
                  uint8_t *pw, float *ps, int64_t gmax)
{
    (void)E;
    pack_panel(w, 4, 0, rb, nb, kp, len, pw, ps, gmax);
}

static void pack8(const struct qweight *w, int E, int64_t rb, int nb, int64_t kp, int64_t len,
                  uint8_t *pw, float *ps, int64_t gmax)
{
    (void)E;
    pack_panel(w, 8, 0, rb, nb, kp, len, pw, ps, gmax);
}

static void pack8s(const struct qweight *w, int E, int64_t rb, int nb, int64_t kp, int64_t len,
                   uint8_t *pw, float *ps, int64_t gmax)
{
    (void)E;
    pack_panel(w, 8, 1, rb, nb, kp, len, pw, ps, gmax);
}

void g8_run(const struct qweight *w, int E, const g8_fn *tab, int MR, int64_t kq, g8_pack_fn pack,
            int64_t r0, int64_t r1, const uint8_t *xp, size_t stride, int m, float *y, int64_t ldy)
{
    int xb = E == 2 ? 2 : 1;
    int64_t k = w->k, G = w->group, groups = k / G, kc = GEMM_KC, gmax = kc / G;
    uint8_t *pw = (uint8_t *)scratch_get(SCRATCH_GEMM_B, (size_t)(kc / E * 64 / 4));
    float *ps = scratch_get(SCRATCH_GEMV, (size_t)(2 * G8NB * gmax));
    float *park = scratch_get(SCRATCH_GEMM_A, (size_t)m * G8NB);
    for (int64_t rb = r0; rb < r1; rb += G8NB) {
        int nb = (int)(r1 - rb < G8NB ? r1 - rb : G8NB);
        for (int64_t kp = 0; kp < k; kp += kc) {
            int64_t len = k - kp < kc ? k - kp : kc;
            pack(w, E, rb, nb, kp, len, pw, ps, gmax);
            int last = kp + len >= k;
            for (int i0 = 0; i0 < m; i0 += MR) {
                int mr = m - i0 < MR ? m - i0 : MR;
                const uint8_t *x0 = xp + (size_t)i0 * stride;
                struct g8_tile_args a = {pw,
                                         ps,
                                         ps + G8NB * gmax,
                                         len / G,
                                         G / E,
                                         x0 + kp * xb,
                                         (const float *)(x0 + kq) + kp / G,
                                         (const float *)(x0 + kq) + groups + kp / G,
                                         stride,
                                         park + (size_t)i0 * G8NB,
                                         kp > 0,
                                         last ? y + i0 * ldy + rb : NULL,
                                         ldy,
                                         nb};
                tab[mr - 1](&a);
            }
        }
    }
}

void gemm_q8_avx2_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                       size_t stride, int m, float *y, int64_t ldy, int vnni)
{
    /* AVX2: 8-bit codes signed (vpsignb + vpmaddubsw); AVX-VNNI: vpdpbusd on them as they are */
    int mode = vnni ? 1 : w->bits == 8 ? 2 : 0;
    const g8_fn *tab = mode == 2 ? g8_tab_avx2_s8 : g8_tab_avx2_e4;
    g8_pack_fn pk = w->bits == 4 ? pack4 : vnni ? pack8 : pack8s;
#if defined(PAGODA_AVXVNNI)
    if (vnni) tab = g8_tab_vnni;
#endif
    g8_run(w, 4, tab, g8_rows(4, mode), xq_bytes(w), pk, r0, r1, xp, stride, m, y, ldy);
}
