/* The architectures pagoda runs, by config.json name. */
#include "model/arch.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const struct arch *const archs[] = {
    &arch_llama,      &arch_mistral,     &arch_qwen2,          &arch_qwen3,     &arch_gemma2,
    &arch_gemma3,     &arch_gemma4,      &arch_gemma4_vl,      &arch_qwen3_moe, &arch_qwen3_5,
    &arch_qwen3_5_vl, &arch_qwen3_5_moe, &arch_qwen3_5_moe_vl, &arch_bitnet,
};

const struct arch *arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(archs[i]->name, name)) return archs[i];
    return NULL;
}

void arch_list(char *buf, size_t n)
{
    size_t at = 0;
    if (n) buf[0] = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0] && at < n; i++) {
        int w = snprintf(buf + at, n - at, "%s%s", i ? ", " : "", archs[i]->name);
        if (w < 0) break;
        at += (size_t)w;
    }
}
