/*
 * What the golden tests share: which architectures they compare, reading a folder's
 * architecture, and the reference model folders in name order.
 */
#ifndef PAGODA_TESTS_GOLDEN_UTIL_H
#define PAGODA_TESTS_GOLDEN_UTIL_H

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* The dense architectures of the engine. */
static const char *const golden_supported[] = {
    "LlamaForCausalLM",      "MistralForCausalLM", "Qwen2ForCausalLM",    "Qwen3ForCausalLM",
    "Gemma2ForCausalLM",     "Gemma3ForCausalLM",  "Qwen3MoeForCausalLM", "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM", "Gemma4ForCausalLM"};

/* Architectures whose operations (Gemma 4's layer scalars and per-expert scales) the CUDA
 * backend does not run yet (NULL ends the list): it refuses them when they load, so they are
 * compared on the CPU only. */
static const char *const golden_cpu_only[] = {"Gemma4ForCausalLM", NULL};

/* Whether `device` runs arch (any supported one on the CPU). */
static inline int golden_device_runs(const char *arch, const char *device)
{
    if (strncmp(device, "cuda", 4)) return 1;
    for (size_t k = 0; golden_cpu_only[k]; k++)
        if (!strcmp(arch, golden_cpu_only[k])) return 0;
    return 1;
}

/* The first entry of DIR/config.json's "architectures" into arch ("(none)" when absent);
 * returns whether the engine supports it. */
static inline int golden_arch(const char *dir, char *arch, size_t cap)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *cfg = util_read_file(path, NULL, NULL);
    cJSON *c = cfg ? cJSON_Parse(cfg) : NULL;
    free(cfg);
    const cJSON *ar = cJSON_GetObjectItem(c, "architectures");
    snprintf(arch, cap, "%s", ar && cJSON_IsString(ar->child) ? ar->child->valuestring : "(none)");
    cJSON_Delete(c);
    for (size_t k = 0; k < sizeof golden_supported / sizeof golden_supported[0]; k++)
        if (!strcmp(arch, golden_supported[k])) return 1;
    return 0;
}

static inline int golden_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of mdir (heap names, sorted) into names[max]; -1 when mdir cannot be read. */
static inline int golden_list(const char *mdir, char **names, int max)
{
    DIR *d = opendir(mdir);
    if (!d) {
        fprintf(stderr, "test data missing: cannot open %s\n", mdir);
        return -1;
    }
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < max)
        if (de->d_name[0] != '.') names[n++] = xstrdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], golden_cmp_str);
    return n;
}

#endif
