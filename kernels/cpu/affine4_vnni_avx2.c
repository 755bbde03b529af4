/* The affine 4-bit integer tiles with AVX-VNNI (compiled with -mavxvnni as well, when the
 * compiler has it; used only when the CPU has it): vpdpbusd adds 4 nibble x int8 products
 * per int32 lane in one instruction, where AVX2 needs vpmaddubsw, vpaddw and vpmaddwd. */
#include "kernels/cpu/affine4_tile.h"

#if defined(__AVXVNNI__)
Q4_TABLE(q4_tab_vnni, 1)
#endif
