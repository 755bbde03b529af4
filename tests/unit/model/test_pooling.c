/* The sentence-transformers files of a model folder: the pipelines pagoda runs, those it
 * refuses (with the reason), malformed files, the prompts, and the Matryoshka truncation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/pooling.h"
#include "test_util.h"

static char tmp[] = "/tmp/pagoda-pooling-XXXXXX";
static int n_dirs;

static void put(const char *dir, const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    FILE *f = fopen(path, "w");
    CHECK(f, "cannot write %s", path);
    if (f) fputs(text, f), fclose(f);
}

#define TRANSFORMER "{\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"}"
#define POOLING     "{\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"}"
#define NORMALIZE   "{\"path\":\"2_Normalize\",\"type\":\"sentence_transformers.models.Normalize\"}"
#define DENSE       "{\"path\":\"2_Dense\",\"type\":\"sentence_transformers.models.Dense\"}"

/* A fresh folder with modules.json = mods and 1_Pooling/config.json = pool (NULL: none). */
static const char *folder(const char *mods, const char *pool, const char *st)
{
    static char dir[256];
    snprintf(dir, sizeof dir, "%s/%d", tmp, n_dirs++);
    mkdir(dir, 0700);
    if (mods) put(dir, "modules.json", mods);
    if (pool) {
        char sub[300];
        snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
        mkdir(sub, 0700);
        put(dir, "1_Pooling/config.json", pool);
    }
    if (st) put(dir, "config_sentence_transformers.json", st);
    return dir;
}

static void test_supported(void)
{
    struct pooling_config pc;
    struct err e = {0};
    const char *d = folder("[" TRANSFORMER "," POOLING "," NORMALIZE "]",
                           "{\"word_embedding_dimension\":64,\"pooling_mode_lasttoken\":true,"
                           "\"pooling_mode_mean_tokens\":false}",
                           "{\"prompts\":{\"query\":\"Q: \",\"doc\":\"\"},"
                           "\"default_prompt_name\":\"doc\"}");
    CHECK(pooling_config_load(&pc, d, 64, &e) == 0, "%s", e.msg);
    CHECK(pc.can_embed && pc.kind == POOLING_LAST && pc.normalize && pc.dim == 64, "%s", pc.why);
    CHECK(pc.include_prompt && pc.n_prompts == 2, "prompts %d", pc.n_prompts);
    CHECK(!strcmp(pooling_prompt(&pc, "query"), "Q: ") && !strcmp(pc.default_prompt, "doc"),
          "query prompt");
    CHECK(pooling_prompt(&pc, "passage") == NULL, "unknown prompt");
    pooling_config_dispose(&pc);

    d = folder("[" TRANSFORMER "," POOLING "]",
               "{\"pooling_mode_mean_tokens\":true,\"include_prompt\":false}", NULL);
    CHECK(pooling_config_load(&pc, d, 64, &e) == 0, "%s", e.msg);
    CHECK(pc.can_embed && pc.kind == POOLING_MEAN && !pc.normalize && !pc.include_prompt &&
              pc.dim == 64 && pc.n_prompts == 0,
          "mean, no normalize: %s", pc.why);
    pooling_config_dispose(&pc);

    d = folder("[" TRANSFORMER "," POOLING "]", "{\"pooling_mode_cls_token\":true}", NULL);
    CHECK(pooling_config_load(&pc, d, 64, &e) == 0 && pc.can_embed && pc.kind == POOLING_CLS,
          "cls");
    pooling_config_dispose(&pc);
}

/* Pipelines pagoda does not run load with can_embed 0 and a reason naming the part. */
static void test_refused(void)
{
    static const struct {
        const char *mods, *pool, *why;
    } cases[] = {
        {NULL, NULL, "no modules.json"},
        {"[" TRANSFORMER "," POOLING "," DENSE "]", "{\"pooling_mode_cls_token\":true}",
         "sentence_transformers.models.Dense"},
        {"[" TRANSFORMER "]", NULL, "no Pooling module"},
        {"[" TRANSFORMER "," POOLING "]", NULL, "1_Pooling/config.json is missing"},
        {"[" TRANSFORMER "," POOLING "]", "{\"pooling_mode_max_tokens\":true}",
         "pooling_mode_max_tokens is not supported"},
        {"[" TRANSFORMER "," POOLING "]",
         "{\"pooling_mode_cls_token\":true,\"pooling_mode_mean_tokens\":true}",
         "exactly one pooling mode"},
        {"[" TRANSFORMER "," POOLING "]", "{}", "exactly one pooling mode"},
        {"[" TRANSFORMER "," POOLING "]",
         "{\"pooling_mode_cls_token\":true,\"word_embedding_dimension\":32}",
         "word_embedding_dimension 32 is not the hidden size 64"},
        {"[" POOLING "]", "{\"pooling_mode_cls_token\":true}", "Pooling' is not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct pooling_config pc;
        struct err e = {0};
        const char *d = folder(cases[i].mods, cases[i].pool, NULL);
        CHECK(pooling_config_load(&pc, d, 64, &e) == 0, "case %zu: %s", i, e.msg);
        CHECK(!pc.can_embed && strstr(pc.why, cases[i].why), "case %zu: can_embed %d, why '%s'", i,
              pc.can_embed, pc.why);
        pooling_config_dispose(&pc);
    }
}

/* Files that are present but malformed are errors naming the file. */
static void test_malformed(void)
{
    struct pooling_config pc;
    struct err e = {0};
    const char *d = folder("{not json", NULL, NULL);
    CHECK(pooling_config_load(&pc, d, 64, &e) == -1 && strstr(e.msg, "modules.json"), "%s", e.msg);
    d = folder("{\"a\":1}", NULL, NULL);
    CHECK(pooling_config_load(&pc, d, 64, &e) == -1 && strstr(e.msg, "array"), "%s", e.msg);
    d = folder("[{\"path\":\"\"}]", NULL, NULL);
    CHECK(pooling_config_load(&pc, d, 64, &e) == -1 && strstr(e.msg, "'type'"), "%s", e.msg);
    d = folder("[" TRANSFORMER "," POOLING "]", "{\"pooling_mode_cls_token\":true}",
               "{\"prompts\":{\"q\":\"x\"},\"default_prompt_name\":\"p\"}");
    CHECK(pooling_config_load(&pc, d, 64, &e) == -1 && strstr(e.msg, "default_prompt_name"), "%s",
          e.msg);
}

static void test_truncate(void)
{
    float v[4] = {3, 4, 12, 0};
    pooling_truncate(v, 2);
    CHECK(v[0] == 0.6f && v[1] == 0.8f && v[2] == 12, "%g %g %g", v[0], v[1], v[2]);
    float z[2] = {0, 0};
    pooling_truncate(z, 2);
    CHECK(z[0] == 0 && z[1] == 0, "zero stays zero");
}

int main(void)
{
    CHECK(mkdtemp(tmp), "mkdtemp");
    test_supported();
    test_refused();
    test_malformed();
    test_truncate();
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", tmp);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    TEST_DONE();
}
