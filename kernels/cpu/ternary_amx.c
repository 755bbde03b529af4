/*
 * The AMX ternary kernel for products of many input rows (prefill; see ternary.c): TDPBUSD
 * multiplies the unsigned codes (0..2) by the int8 inputs, taken transposed as the other AMX
 * kernels are (gemm_bf16_amx.c):
 *
 *   A (tmm4, tmm5): 16 weight rows by 64 codes, a block of 32 weight rows decoded once a pass
 *                   into bytes in column order;
 *   B (tmm6, tmm7): the same 64 columns of 16 input rows, 16 rows of 4-byte quads;
 *   C (tmm0..3):    16 weight rows by 16 input rows of int32 dots over every column.
 *
 * The dots are exact and the scaling the same float operations: the results equal the other
 * kernels' to the bit.
 */
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512BW__)
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/impl.h"

/* The exact dots of C into y: d - qsum, divided by qdiv, times t_mul (each tile row is a
 * weight row against 16 input rows, so the input rows' terms are vectors). */
static void store_dots(const struct qweight *w, int tiles, float *y, int64_t ldy, int64_t wr,
                       int nb, int xr, int m, const int32_t *qsum, const float *qdiv)
{
    int32_t c[4][256] __attribute__((aligned(64)));
    float f[4][256] __attribute__((aligned(64)));
    gemm_amx_c_store(c, tiles);
    const __m512 tm = _mm512_set1_ps(w->t_mul);
    for (int t = 0; t < tiles; t++) {
        int x0 = xr + (t >> 1) * 16, nx = m - x0 < 16 ? m - x0 : 16;
        __mmask16 in = (__mmask16)((1u << nx) - 1);
        __m512i qs = _mm512_maskz_loadu_epi32(in, qsum + x0);
        __m512 qd = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), in, qdiv + x0);
        for (int i = 0; i < 16; i++) {
            __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(c[t] + i * 16), qs));
            _mm512_store_ps(f[t] + i * 16, _mm512_mul_ps(_mm512_div_ps(d, qd), tm));
        }
    }
    gemm_tiles_store(f, tiles, y, ldy, wr, nb, xr, m);
}

void ternary_matmul_amx(const struct qweight *w, int64_t r0, int64_t r1, const int8_t *q,
                        size_t stride, const int32_t *qsum, const float *qdiv, int m, float *y,
                        int64_t ldy)
{
    const int64_t kp = (int64_t)w->row_bytes * 4, steps = kp / 64, blocks = kp / 128;
    const int mpad = (m + 15) / 16 * 16;
    /* the inputs as B tiles: [16-row block][step] of 1 KB (rows past m zero) */
    uint8_t *xb = (uint8_t *)scratch_get(SCRATCH_GEMM_A, (size_t)mpad * kp / 4);
    for (int b = 0; b < mpad / 16; b++)
        for (int64_t s = 0; s < steps; s++) {
            __m512i r[16];
            for (int j = 0; j < 16; j++)
                r[j] = b * 16 + j < m
                           ? _mm512_loadu_si512(q + (size_t)(b * 16 + j) * stride + s * 64)
                           : _mm512_setzero_si512();
            gemm_transpose16(r);
            for (int t = 0; t < 16; t++)
                _mm512_storeu_si512(xb + ((size_t)b * steps + s) * AMX_TILE_BYTES + t * 64, r[t]);
        }
    uint8_t *panel = (uint8_t *)scratch_get(SCRATCH_GEMM_B, (size_t)(32 * kp / 4));
    const __m256i m3 = _mm256_set1_epi8(3);
    const int pass = gemm_amx_pass((size_t)kp);
    gemm_amx_begin();
    for (int xs = 0; xs < mpad; xs += pass) {
        int xe = xs + pass < mpad ? xs + pass : mpad;
        for (int64_t rb = r0; rb < r1; rb += 32) {
            int nb = (int)(r1 - rb < 32 ? r1 - rb : 32);
            /* a 32-byte block of codes is 128 columns: bit pairs 0, 1, 2, 3 of its bytes */
            for (int i = 0; i < 32; i++) {
                uint8_t *d = panel + (size_t)i * kp;
                if (i >= nb) {
                    memset(d, 0, (size_t)kp);
                    continue;
                }
                const uint8_t *row = w->w + (size_t)(rb + i) * w->row_bytes;
                for (int64_t bl = 0; bl < blocks; bl++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(row + bl * 32));
                    _mm256_storeu_si256((__m256i *)(d + bl * 128), _mm256_and_si256(v, m3));
                    _mm256_storeu_si256((__m256i *)(d + bl * 128 + 32),
                                        _mm256_and_si256(_mm256_srli_epi16(v, 2), m3));
                    _mm256_storeu_si256((__m256i *)(d + bl * 128 + 64),
                                        _mm256_and_si256(_mm256_srli_epi16(v, 4), m3));
                    _mm256_storeu_si256((__m256i *)(d + bl * 128 + 96),
                                        _mm256_and_si256(_mm256_srli_epi16(v, 6), m3));
                }
            }
            for (int x0 = xs; x0 < xe; x0 += 32) {
                const int tiles = x0 + 16 < xe ? 4 : 2;
                const uint8_t *b0 = xb + (size_t)(x0 / 16) * steps * AMX_TILE_BYTES;
                gemm_amx_c_zero();
                for (int64_t s = 0; s < steps; s++) {
                    _tile_loadd(4, panel + s * 64, kp);
                    _tile_loadd(5, panel + 16 * kp + s * 64, kp);
                    _tile_loadd(6, b0 + s * AMX_TILE_BYTES, 64);
                    _tile_dpbusd(0, 4, 6);
                    _tile_dpbusd(1, 5, 6);
                    if (tiles == 4) {
                        _tile_loadd(7, b0 + (steps + s) * AMX_TILE_BYTES, 64);
                        _tile_dpbusd(2, 4, 7);
                        _tile_dpbusd(3, 5, 7);
                    }
                }
                store_dots(w, tiles, y, ldy, rb, nb, x0, m, qsum, qdiv);
            }
        }
    }
    gemm_amx_end();
}

#endif
