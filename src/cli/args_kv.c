/* The KV cache format options shared by the engine commands and perplexity. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"

int arg_kv_option(int argc, char **argv, int *i, struct kv_spec *s)
{
    const char *a = argv[*i];
    int which = !strcmp(a, "--kv-cache-dtype")     ? 3
                : !strcmp(a, "--kv-cache-dtype-k") ? 1
                : !strcmp(a, "--kv-cache-dtype-v") ? 2
                                                   : 0;
    if (!which && strcmp(a, "--kv-cache-skip-layers")) return 0;
    const char *v = arg_value(argc, argv, i);
    if (!v) return -1;
    if (!which) {
        struct err e = {0};
        if (kv_spec_parse_skip(s, v, &e)) {
            fprintf(stderr, "pagoda: %s\n", e.msg);
            return -1;
        }
        return 1;
    }
    int d = kv_dtype_parse(v);
    if (d < 0 || d == KV_DTYPE_F32) { /* f32 is what auto resolves to beside a quantized side */
        fprintf(stderr,
                "pagoda: %s: '%s' is not a KV cache format (auto, bf16, fp8, int8, int4, tq4, "
                "tq3, tq2)\n",
                a, v);
        return -1;
    }
    if (which & 1) s->k = (uint8_t)d;
    if (which & 2) s->v = (uint8_t)d;
    return 1;
}
