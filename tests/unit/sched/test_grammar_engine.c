/*
 * Structured output through the engine: a random-weight model (llama-tiny) under JSON
 * schemas, a regular expression and a list of choices, greedy and sampled, several
 * requests per step. Every output must end by the grammar (finish stop, never length),
 * parse as JSON and satisfy its schema, checked here by hand, field by field.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "sched/engine.h"
#include "test_util.h"

#define MAX_OUT 600

struct out {
    int32_t ids[MAX_OUT];
    int n;
    enum finish_reason finish;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct out *o = user;
    if (ev->kind == ENGINE_EV_TOKEN && o->n < MAX_OUT) o->ids[o->n++] = ev->token;
    if (ev->finish != FINISH_NONE) o->finish = ev->finish;
}

static const char *const person =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{"
    "\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"tag\":{\"enum\":[\"a\",\"b\",\"c\"]}},"
    "\"required\":[\"name\",\"age\",\"tag\"],\"additionalProperties\":false}";
static const char *const bools =
    "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":4}";
static const char *const maybe =
    "{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"object\",\"properties\":{\"x\":{\"type\":"
    "\"integer\","
    "\"minimum\":-5,\"maximum\":5}},\"required\":[\"x\"],\"additionalProperties\":false}]}";

static int utf8_chars(const char *s)
{
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int valid(int kind, const char *text)
{
    if (kind == 3) { /* [a-z]{3}-[0-9]{2} */
        if (strlen(text) != 6 || text[3] != '-') return 0;
        for (int i = 0; i < 6; i++)
            if (i != 3 &&
                !(i < 3 ? text[i] >= 'a' && text[i] <= 'z' : text[i] >= '0' && text[i] <= '9'))
                return 0;
        return 1;
    }
    if (kind == 4) return !strcmp(text, "yes") || !strcmp(text, "no");
    cJSON *j = cJSON_ParseWithOpts(text, NULL, 1);
    int ok = 0;
    if (!j) return 0;
    if (kind == 0) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "name"),
                    *a = cJSON_GetObjectItemCaseSensitive(j, "age"),
                    *t = cJSON_GetObjectItemCaseSensitive(j, "tag");
        ok = cJSON_IsObject(j) && cJSON_GetArraySize(j) == 3 && cJSON_IsString(n) &&
             utf8_chars(n->valuestring) <= 12 && cJSON_IsNumber(a) &&
             a->valuedouble == floor(a->valuedouble) && a->valuedouble >= 0 &&
             a->valuedouble <= 150 && cJSON_IsString(t) && strlen(t->valuestring) == 1 &&
             strchr("abc", t->valuestring[0]);
    } else if (kind == 1) {
        int k = cJSON_GetArraySize(j);
        ok = cJSON_IsArray(j) && k >= 1 && k <= 4;
        const cJSON *x;
        cJSON_ArrayForEach(x, j) ok = ok && cJSON_IsBool(x);
    } else if (kind == 2) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "x");
        ok = cJSON_IsNull(j) ||
             (cJSON_IsObject(j) && cJSON_GetArraySize(j) == 1 && cJSON_IsNumber(x) &&
              x->valuedouble == floor(x->valuedouble) && fabs(x->valuedouble) <= 5);
    }
    cJSON_Delete(j);
    return ok;
}

int main(int argc, char **argv)
{
    const char *testdata = argc > 1 ? argv[1] : "../shared/testdata";
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", testdata);
    struct engine_config cfg = {.model_dir = dir, .manual = 1, .threads = 2, .max_num_seqs = 16};
    struct err e = {0};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en, "engine_create: %s", e.msg);
    if (!en) TEST_DONE();
    struct tok *t = tok_load(dir, &e);
    CHECK(t, "%s", e.msg);
    struct gram *g[5];
    g[0] = gram_from_json_schema(person, strlen(person), &e);
    g[1] = gram_from_json_schema(bools, strlen(bools), &e);
    g[2] = gram_from_json_schema(maybe, strlen(maybe), &e);
    g[3] = gram_from_regex("[a-z]{3}-[0-9]{2}", 17, &e);
    const char *ch[] = {"yes", "no"};
    size_t chl[] = {3, 2};
    g[4] = gram_from_choices(ch, chl, 2, &e);
    for (int k = 0; k < 5; k++) CHECK(g[k], "grammar %d: %s", k, e.msg);
    int32_t prompt[] = {1, 300, 301, 302, 303};
    enum { PER = 12 }; /* requests per grammar: greedy, and sampled at temperatures 1 and 2 */
    static struct out outs[5][PER];
    memset(outs, 0, sizeof outs);
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < PER; i++) {
            struct sampling_params sp;
            sampling_params_default(&sp);
            sp.temperature = i == 0 ? 0.0f : i < 6 ? 1.0f : 2.0f;
            sp.has_seed = 1;
            sp.seed = (uint64_t)(1000 * k + i);
            sp.max_tokens = 512;
            sp.grammar = g[k];
            prompt[1] = 300 + i;
            struct engine_request q = {.prompt = prompt,
                                       .n_prompt = 5,
                                       .sp = sp,
                                       .on_event = on_event,
                                       .user = &outs[k][i]};
            CHECK(engine_submit(en, &q, &e) > 0, "submit: %s", e.msg);
        }
    for (int k = 0; k < 5; k++) gram_unref(g[k]); /* the requests hold their own references */
    for (int guard = 0; engine_step(en) > 0 && guard < 100000; guard++) {
    }
    int n_ok = 0;
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < PER; i++) {
            struct out *o = &outs[k][i];
            char *text = tok_decode(t, o->ids, (size_t)o->n, 1);
            CHECK(o->finish == FINISH_STOP, "grammar %d request %d: finish %s after %d tokens: %s",
                  k, i, finish_reason_name(o->finish), o->n, text);
            int ok = valid(k, text);
            CHECK(ok, "grammar %d request %d: invalid output '%s'", k, i, text);
            n_ok += ok;
            if (i == 1) printf("grammar %d, sampled: %s\n", k, text);
            free(text);
        }
    printf("%d of %d outputs valid\n", n_ok, 5 * PER);
    tok_destroy(t);
    engine_destroy(en);
    TEST_DONE();
}
