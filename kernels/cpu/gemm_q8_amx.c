/*
 * Affine 2- to 8-bit weights against int8 activations with AMX (see gemm.h), for groups
 * of 64 columns or a multiple: the AVX-512 kernel's arithmetic (gemm_q8_avx512.c), with the
 * integer sums of a group taken by TDPBUSD. As with bf16 (gemm_bf16_amx.c) the product is
 * taken transposed:
 *
 *   A (tmm4, tmm5): 16 weight rows by 64 codes (unsigned), one group step; 8-bit codes
 *                   straight from the weights, the others unpacked once a pass into a block
 *                   of 32 rows (gemm_q8_load_codes: in the order x is prepared in);
 *   B (tmm6, tmm7): the same 64 columns of 16 x rows as int8, 16 rows of 4-byte quads;
 *   C (tmm0..3):    16 weight rows by 16 x rows of int32 sums, a group's.
 *
 * After each group, the four C tiles go through memory into float32 sums (16 x rows a
 * vector, one weight row at a time): sum += (isum * s) * dx, then sum += b * (dx * sum(xq)),
 * the AVX-512 kernel's two operations per output and group in its order, so the two give
 * the same bits.
 */
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512VNNI__)
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/quant.h"

int gemm_q8_amx_serves(const struct qweight *w)
{
    return w->group % 64 == 0 && w->k % 64 == 0;
}

/* A prepared block of 16 x rows: k / 64 tiles, then dx [groups][16], then dx * sum(xq)
 * [groups][16] (rows past m: zero). */
static size_t block_bytes(const struct qweight *w)
{
    return (size_t)(w->k / 64) * AMX_TILE_BYTES +
           (size_t)(w->k / w->group) * 2 * 16 * sizeof(float);
}

size_t gemm_q8_amx_prep_bytes(const struct qweight *w, int m)
{
    return (size_t)(m + 15) / 16 * block_bytes(w);
}

void gemm_q8_amx_prep(const struct qweight *w, const float *x, int m, int b0, int b1, uint8_t *xp)
{
    const int64_t k = w->k, steps = k / 64, groups = k / w->group;
    const size_t rs = (gemm_q8_prep_bytes(w) + 63) / 64 * 64, kq = (size_t)(k + 63) / 64 * 64;
    uint8_t *rows = (uint8_t *)scratch_get(SCRATCH_GEMM_A, 16 * rs / sizeof(float));
    for (int b = b0; b < b1; b++) {
        int n = m - b * 16 < 16 ? m - b * 16 : 16;
        gemm_q8_prep(w, x + (size_t)b * 16 * k, n, rows, rs);
        memset(rows + n * rs, 0, (16 - n) * rs); /* rows past m: zero codes and scales */
        uint8_t *blk = xp + (size_t)b * block_bytes(w);
        for (int64_t s = 0; s < steps; s++) {
            __m512i r[16];
            for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_si512(rows + j * rs + s * 64);
            gemm_transpose16(r); /* r[q]: quad q of the 16 rows */
            for (int q = 0; q < 16; q++)
                _mm512_storeu_si512(blk + s * AMX_TILE_BYTES + q * 64, r[q]);
        }
        float *dxv = (float *)(blk + steps * AMX_TILE_BYTES), *xsv = dxv + groups * 16;
        for (int64_t g = 0; g < groups; g++)
            for (int j = 0; j < 16; j++) {
                const float *d = (const float *)(rows + j * rs + kq);
                dxv[g * 16 + j] = d[g];
                xsv[g * 16 + j] = d[groups + g];
            }
    }
}

/* The C tiles of one group into the float sums acc[t] (16 weight rows of 16 x rows each):
 * tile t holds weight rows (t & 1) * 16 of the block against x block xb + (t >> 1). */
static void add_group(float acc[4][256], int tiles, const float *sc, const float *bi,
                      const float *dx0, const float *xs0, const float *dx1, const float *xs1)
{
    int32_t c[4][256] __attribute__((aligned(64)));
    gemm_amx_c_store(c, tiles);
    for (int t = 0; t < tiles; t++) {
        const float *dx = t >> 1 ? dx1 : dx0, *xs = t >> 1 ? xs1 : xs0;
        __m512 d = _mm512_loadu_ps(dx), e = _mm512_loadu_ps(xs);
        const float *s = sc + (t & 1) * 16, *b = bi + (t & 1) * 16;
        for (int i = 0; i < 16; i++) {
            __m512 a = _mm512_load_ps(acc[t] + i * 16);
            __m512 v = _mm512_cvtepi32_ps(_mm512_load_si512(c[t] + i * 16));
            a = _mm512_fmadd_ps(_mm512_mul_ps(v, _mm512_set1_ps(s[i])), d, a);
            a = _mm512_fmadd_ps(_mm512_set1_ps(b[i]), e, a);
            _mm512_store_ps(acc[t] + i * 16, a);
        }
    }
}

void gemm_q8_amx_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp, int m,
                      float *y, int64_t ldy)
{
    const int64_t k = w->k, G = w->group, groups = k / G, steps = k / 64, spg = G / 64;
    const size_t bb = block_bytes(w);
    const int mpad = (m + 15) / 16 * 16;
    const int pass = gemm_amx_pass((size_t)k);
    uint8_t *panel = (uint8_t *)scratch_get(SCRATCH_GEMM_B, (size_t)(32 * k / 4));
    float *sc = scratch_get(SCRATCH_GEMV, (size_t)(2 * 32 * groups)), *bi = sc + 32 * groups;
    float acc[4][256] __attribute__((aligned(64)));
    for (int xs = 0; xs < mpad; xs += pass) {
        int xe = xs + pass < mpad ? xs + pass : mpad;
        for (int64_t rb = r0; rb < r1; rb += 32) {
            int nb = (int)(r1 - rb < 32 ? r1 - rb : 32);
            const uint8_t *a = w->w + (size_t)rb * w->row_bytes;
            size_t as = w->row_bytes;
            if (w->bits != 8 || nb < 32) { /* codes as bytes, rows past nb zero */
                for (int i = 0; i < 32; i++)
                    for (int64_t c = 0; c < k; c += 64)
                        _mm512_storeu_si512(panel + (size_t)i * k + c,
                                            i < nb
                                                ? gemm_q8_load_codes(a + (size_t)i * as, w->bits, c)
                                                : _mm512_setzero_si512());
                a = panel;
                as = (size_t)k;
            }
            for (int64_t g = 0; g < groups; g++)
                for (int i = 0; i < 32; i++) {
                    int64_t e = (rb + i) * groups + g;
                    sc[g * 32 + i] = i < nb ? quant_load_scale(w->scales, w->sdtype, e) : 0.0f;
                    bi[g * 32 + i] = i < nb ? quant_load_scale(w->biases, w->sdtype, e) : 0.0f;
                }
            for (int xb = xs; xb < xe; xb += 32) {
                const int tiles = xb + 16 < xe ? 4 : 2;
                const uint8_t *b0 = xp + (size_t)(xb / 16) * bb, *b1 = tiles == 4 ? b0 + bb : b0;
                const float *dx0 = (const float *)(b0 + steps * AMX_TILE_BYTES),
                            *xs0 = dx0 + groups * 16;
                const float *dx1 = (const float *)(b1 + steps * AMX_TILE_BYTES),
                            *xs1 = dx1 + groups * 16;
                memset(acc, 0, sizeof acc);
                for (int64_t g = 0; g < groups; g++) {
                    gemm_amx_c_zero();
                    for (int64_t s = g * spg; s < (g + 1) * spg; s++) {
                        _tile_loadd(4, a + s * 64, as);
                        _tile_loadd(5, a + 16 * as + s * 64, as);
                        _tile_loadd(6, b0 + s * AMX_TILE_BYTES, 64);
                        _tile_dpbusd(0, 4, 6);
                        _tile_dpbusd(1, 5, 6);
                        if (tiles == 4) {
                            _tile_loadd(7, b1 + s * AMX_TILE_BYTES, 64);
                            _tile_dpbusd(2, 4, 7);
                            _tile_dpbusd(3, 5, 7);
                        }
                    }
                    add_group(acc, tiles, sc + g * 32, bi + g * 32, dx0 + g * 16, xs0 + g * 16,
                              dx1 + g * 16, xs1 + g * 16);
                }
                gemm_tiles_store(acc, tiles, y, ldy, rb, nb, xb, m);
            }
        }
    }
}

#endif
