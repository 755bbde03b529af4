/*
 * bf16 weights against bf16-rounded activations with AMX (see gemm.h). The product is taken
 * transposed, y^T = W . x^T, so that the weights enter the tiles as they lie in the file:
 *
 *   A (tmm4, tmm5): 16 weight rows by 32 columns (64 bytes a row), loaded from W itself with
 *                   the weight row's stride;
 *   B (tmm6, tmm7): the same 32 columns of 16 x rows, prepared as 16 rows of column pairs
 *                   ([pair][x row][2 bf16], the layout TDPBF16PS takes);
 *   C (tmm0..3):    16 weight rows by 16 x rows of float32 sums, 2 x 2 of them: 32 weight rows
 *                   against 32 x rows, summed over every column before they are stored.
 *
 * A prepared x block is 16 rows (rows past m zero) by k columns: k / 32 tiles of 1 KB, one
 * after another. An output's arithmetic is TDPBF16PS's over the columns in order, whatever m.
 */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/gemm_avx512.h"

struct tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Palette 1, eight tiles of 16 rows of 64 bytes. Constant data: a configuration built on the
 * stack just before ldtilecfg loses its stores to the compiler, which does not see the
 * instruction read them. */
static const struct tile_config tiles_16x64 = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void gemm_amx_begin(void)
{
    _tile_loadconfig(&tiles_16x64);
}

void gemm_amx_end(void)
{
    _tile_release();
}

size_t gemm_bf16_amx_prep_bytes(const struct qweight *w, int m)
{
    return (size_t)(m + 15) / 16 * (size_t)(w->k / 32) * AMX_TILE_BYTES;
}

void gemm_bf16_amx_prep(const struct qweight *w, const float *x, int m, int b0, int b1, uint8_t *xp)
{
    int64_t k = w->k, steps = k / 32;
    for (int b = b0; b < b1; b++)
        for (int64_t s = 0; s < steps; s++) {
            __m512i r[16];
            for (int j = 0; j < 16; j++) {
                int row = b * 16 + j;
                if (row >= m) {
                    r[j] = _mm512_setzero_si512();
                    continue;
                }
                const float *xi = x + (size_t)row * k + s * 32;
                r[j] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xi + 16), _mm512_loadu_ps(xi));
            }
            gemm_transpose16(r); /* r[p]: column pair p of the 16 rows */
            uint8_t *d = xp + ((size_t)b * steps + s) * AMX_TILE_BYTES;
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(d + p * 64, r[p]);
        }
}

/* The C tiles into y (rows past m and weight rows past nb are not stored). */
static void store_c(float *y, int64_t ldy, int64_t wr, int nb, int xr, int m, int tiles)
{
    float c[4][256] __attribute__((aligned(64)));
    gemm_amx_c_store(c, tiles);
    gemm_tiles_store(c, tiles, y, ldy, wr, nb, xr, m);
}

void gemm_bf16_amx_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp, int m,
                        float *y, int64_t ldy)
{
    const int64_t k = w->k, steps = k / 32;
    const size_t ws = w->row_bytes;
    const int mpad = (m + 15) / 16 * 16;
    const int pass = gemm_amx_pass((size_t)k * 2);
    for (int xs = 0; xs < mpad; xs += pass) {
        int xe = xs + pass < mpad ? xs + pass : mpad;
        for (int64_t rb = r0; rb < r1; rb += 32) {
            int nb = (int)(r1 - rb < 32 ? r1 - rb : 32);
            const uint8_t *a = w->w + (size_t)rb * ws;
            size_t as = ws;
            if (nb < 32) { /* the last rows, copied into a block of 32 (rows past nb zero) */
                uint8_t *t = (uint8_t *)scratch_get(SCRATCH_GEMM_B, (size_t)(32 * k * 2 / 4));
                memset(t, 0, (size_t)(32 * k * 2));
                for (int i = 0; i < nb; i++)
                    memcpy(t + (size_t)i * k * 2, a + (size_t)i * ws, k * 2);
                a = t;
                as = (size_t)k * 2;
            }
            for (int xb = xs; xb < xe; xb += 32) {
                const int tiles = xb + 16 < xe ? 4 : 2;
                const uint8_t *b = xp + (size_t)(xb / 16) * steps * AMX_TILE_BYTES;
                gemm_amx_c_zero();
                for (int64_t s = 0; s < steps; s++) {
                    _tile_loadd(4, a + s * 64, as);
                    _tile_loadd(5, a + 16 * as + s * 64, as);
                    _tile_loadd(6, b + s * AMX_TILE_BYTES, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 5, 6);
                    if (tiles == 4) {
                        _tile_loadd(7, b + (steps + s) * AMX_TILE_BYTES, 64);
                        _tile_dpbf16ps(2, 4, 7);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                }
                store_c(y, ldy, rb, nb, xb, m, tiles);
            }
        }
    }
}

#endif
