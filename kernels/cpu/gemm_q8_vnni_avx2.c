/* The many-row affine tiles with AVX-VNNI (compiled with -mavxvnni as well, when the
 * compiler has it; used only when the CPU has it): one vpdpbusd adds 4 code x int8
 * products per int32 lane, for 4- and 8-bit codes alike (see gemm_q8_avx2.h); vpdpwssd adds 2
 * int16 products, for mxfp8's int16 panels (gemm_mx_avx2.c). */
#include "kernels/cpu/gemm_q8_avx2.h"

#if defined(__AVXVNNI__)
G8_TABLE(g8_tab_vnni, 4, 1)
G8_TABLE(g8_tab_vnni_e2, 2, 1)
#endif
