#include "model/weights.h"

#include <stdio.h>
#include <string.h>

size_t qweight_bytes(const struct qweight *w)
{
    size_t b = (size_t)w->n * w->row_bytes;
    if (w->scales) {
        size_t groups = (size_t)(w->n * (w->k / w->group));
        size_t s = w->fmt == WFMT_AFFINE ? st_dtype_size(w->sdtype) : 1;
        b += groups * s * (w->biases ? 2 : 1);
    }
    return b;
}

size_t qweight_ternary_row_bytes(int64_t k)
{
    return (size_t)((k + 127) / 128) * 32;
}

void qweight_ternary_pack(const int8_t *vals, int64_t k, uint8_t *row)
{
    memset(row, 0x55, qweight_ternary_row_bytes(k)); /* code 1 (a zero) in all four slots */
    for (int64_t j = 0; j < k; j++) {
        int64_t c = j % 128;
        uint8_t *p = row + (j / 128) * 32 + c % 32;
        int sh = 2 * (int)(c / 32);
        *p = (uint8_t)((*p & ~(3 << sh)) | (vals[j] + 1) << sh);
    }
}

double qweight_bits_per_weight(const struct qweight *w)
{
    return 8.0 * (double)qweight_bytes(w) / ((double)w->n * (double)w->k);
}

const char *qweight_format_name(const struct qweight *w, char *buf, size_t n)
{
    switch (w->fmt) {
    case WFMT_F32:
        snprintf(buf, n, "f32");
        break;
    case WFMT_F16:
        snprintf(buf, n, "f16");
        break;
    case WFMT_BF16:
        snprintf(buf, n, "bf16");
        break;
    case WFMT_AFFINE:
        snprintf(buf, n, "mlx%d-g%d", w->bits, w->group);
        break;
    case WFMT_MXFP4:
        snprintf(buf, n, "mxfp4");
        break;
    case WFMT_MXFP8:
        snprintf(buf, n, "mxfp8");
        break;
    case WFMT_NVFP4:
        snprintf(buf, n, "nvfp4");
        break;
    case WFMT_TERNARY:
        snprintf(buf, n, "ternary");
        break;
    }
    return buf;
}
