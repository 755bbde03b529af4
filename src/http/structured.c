/*
 * Structured output fields of a generation request, compiled into the request's grammar:
 * OpenAI's response_format ({"type": "text" | "json_object" | "json_schema", "json_schema":
 * {"name", "schema", "strict"}}) and vLLM's guided_json, guided_regex, guided_choice and
 * guided_grammar (GBNF). At most one per request. A schema, regex or grammar that does
 * not compile is the client's error: a 400 naming the field, with the compiler's message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "http/request.h"

static int compiled(struct http_gen *g, struct gram *gr, const char *field, const struct err *e,
                    struct http_error *he)
{
    if (!gr) return http_error_set(he, 400, field, "'%s' is invalid: %s", field, e->msg);
    g->sp.grammar = gr;
    return 0;
}

static int response_format(const cJSON *rf, struct http_gen *g, struct http_error *he)
{
    const char *f = "response_format";
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(t))
        return http_error_set(he, 400, f, "'%s' must be an object with a string 'type'", f);
    struct err e = {0};
    if (!strcmp(t->valuestring, "text")) return 0;
    if (!strcmp(t->valuestring, "json_object"))
        return compiled(g, gram_compile_cached(GRAM_JSON_OBJECT, "", 0, &e), f, &e, he);
    if (strcmp(t->valuestring, "json_schema") != 0)
        return http_error_set(
            he, 400, f, "'%s.type' must be 'text', 'json_object' or 'json_schema', got '%.40s'", f,
            t->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return http_error_set(he, 400, "response_format.json_schema",
                              "'response_format.json_schema' must be an object");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (name && !cJSON_IsString(name))
        return http_error_set(he, 400, "response_format.json_schema.name",
                              "'response_format.json_schema.name' must be a string");
    if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
        return http_error_set(he, 400, "response_format.json_schema.strict",
                              "'response_format.json_schema.strict' must be a boolean");
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return http_error_set(
            he, 400, "response_format.json_schema.schema",
            "'response_format.json_schema.schema' is required and must be an object");
    char *text = cJSON_PrintUnformatted(schema);
    struct gram *gr = gram_compile_cached(GRAM_JSON_SCHEMA, text, strlen(text), &e);
    free(text);
    return compiled(g, gr, "response_format.json_schema.schema", &e, he);
}

int http_parse_structured(enum http_api api, const cJSON *body, struct http_gen *g,
                          struct http_error *he)
{
    static const char *const fields[] = {"response_format", "guided_json", "guided_regex",
                                         "guided_choice", "guided_grammar"};
    const cJSON *v[5];
    int n = 0, which = -1;
    for (int i = 0; i < 5; i++) {
        v[i] = cJSON_GetObjectItemCaseSensitive(body, fields[i]);
        if (v[i] && cJSON_IsNull(v[i])) v[i] = NULL;
        if (v[i]) n++, which = i;
    }
    if (n == 0) return 0;
    if (api == HTTP_API_MESSAGES)
        return http_error_set(he, 400, fields[which], "'%s' is not supported by the messages API",
                              fields[which]);
    if (n > 1)
        return http_error_set(he, 400, fields[which],
                              "at most one of response_format, guided_json, guided_regex, "
                              "guided_choice and guided_grammar may be given");
    const char *f = fields[which];
    const cJSON *x = v[which];
    struct err e = {0};
    switch (which) {
    case 0:
        return response_format(x, g, he);
    case 1: {
        if (!cJSON_IsObject(x) && !cJSON_IsString(x))
            return http_error_set(he, 400, f, "'%s' must be a JSON schema (an object or its text)",
                                  f);
        char *text = cJSON_IsString(x) ? xstrdup(x->valuestring) : cJSON_PrintUnformatted(x);
        struct gram *gr = gram_compile_cached(GRAM_JSON_SCHEMA, text, strlen(text), &e);
        free(text);
        return compiled(g, gr, f, &e, he);
    }
    case 2:
    case 4:
        if (!cJSON_IsString(x) || !x->valuestring[0])
            return http_error_set(he, 400, f, "'%s' must be a non-empty string", f);
        return compiled(g,
                        gram_compile_cached(which == 2 ? GRAM_REGEX : GRAM_GBNF, x->valuestring,
                                            strlen(x->valuestring), &e),
                        f, &e, he);
    default: {
        int k = cJSON_GetArraySize(x);
        if (!cJSON_IsArray(x) || k == 0 || k > 1024)
            return http_error_set(he, 400, f, "'%s' must be an array of 1 to 1024 strings", f);
        const char **s = xmalloc(sizeof *s * (size_t)k);
        size_t *l = xmalloc(sizeof *l * (size_t)k);
        int i = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, x)
        {
            if (!cJSON_IsString(c) || !c->valuestring[0]) {
                free(s), free(l);
                return http_error_set(he, 400, f, "'%s[%d]' must be a non-empty string", f, i);
            }
            s[i] = c->valuestring;
            l[i++] = strlen(c->valuestring);
        }
        struct gram *gr = gram_from_choices(s, l, k, &e);
        free(s), free(l);
        return compiled(g, gr, f, &e, he);
    }
    }
}
