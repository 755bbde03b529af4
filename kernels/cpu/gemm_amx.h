/*
 * gemm_amx: what the AMX product kernels share (gemm_bf16_amx.c, gemm_q8_amx.c,
 * ternary_amx.c); include only from files compiled with AMX-TILE and AVX-512.
 *
 * Every kernel runs with gemm_amx_begin's configuration: eight tiles of 16 rows of 64 bytes,
 * tmm0..3 the C tiles of 32 weight rows by 32 x rows (tile t: weight rows (t & 1) * 16 of the
 * block against x rows (t >> 1) * 16), tmm4..5 the weights', tmm6..7 the x rows'.
 */
#ifndef PAGODA_KERNELS_CPU_GEMM_AMX_H
#define PAGODA_KERNELS_CPU_GEMM_AMX_H

#include <immintrin.h>
#include <stddef.h>

/* A tile's bytes: 16 rows of 64 */
#define AMX_TILE_BYTES 1024
/* The x rows one pass over a block of 32 weight rows takes: about 1 MB of them (half a
 * core's L2), so that the block's weights are read from memory once a pass. */
#define AMX_PASS_BYTES (1u << 20)

/* The x rows of a pass, for x rows of `row_bytes` prepared bytes: a multiple of 32. */
static inline int gemm_amx_pass(size_t row_bytes)
{
    int pass = (int)(AMX_PASS_BYTES / row_bytes) / 32 * 32;
    return pass < 32 ? 32 : pass;
}

/* The C tiles zeroed. */
static inline __attribute__((always_inline)) void gemm_amx_c_zero(void)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

/* The first `tiles` (2 or 4) C tiles into c, 1 KB apart, 64 bytes a row. */
static inline __attribute__((always_inline)) void gemm_amx_c_store(void *c, int tiles)
{
    char *p = (char *)c;
    _tile_stored(0, p, 64);
    _tile_stored(1, p + AMX_TILE_BYTES, 64);
    if (tiles == 4) {
        _tile_stored(2, p + 2 * AMX_TILE_BYTES, 64);
        _tile_stored(3, p + 3 * AMX_TILE_BYTES, 64);
    }
}

#endif
