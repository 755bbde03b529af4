/*
 * JSON Schema into a grammar: what OpenAI strict structured outputs accept. Types object
 * (properties in schema order, required ones present, others optional; no property
 * outside "properties", as strict mode asks; an object without "properties" is a map whose
 * values follow "additionalProperties", any JSON when that is absent or true), array
 * (items, prefixItems, minItems, maxItems), string (minLength, maxLength, pattern as a whole-string
 * regex, formats date, time, date-time, uuid, email, ipv4), integer and number (minimum,
 * maximum and their exclusive forms, exactly: grammar_num.c), boolean, null; enum, const, anyOf /
 * oneOf, a single allOf, type lists, $ref into the document (#, #/$defs/..., #/definitions/...,
 * recursion allowed). Keywords whose meaning a grammar cannot enforce (not, if, patternProperties,
 * uniqueItems ...) are refused with an error rather than ignored.
 *
 * Whitespace as XGrammar's default JSON grammar: any of space, tab, newline, carriage
 * return between tokens, here at most JSON_WS_MAX bytes in each gap, so that a model
 * cannot stall in whitespace. The value itself starts and ends the output.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "text/grammar_impl.h"

#define JSON_WS_MAX 20
#define JSON_DEPTH  64

struct jref {
    char *path;
    int rule;
};

struct js {
    struct gb *b;
    const cJSON *doc;
    struct jref *refs;
    int n_refs;
    int depth;
    int32_t ws, str, num, intg, any, chr; /* built on first use, 0 until then */
    int gemma;         /* Gemma 4's argument syntax (gram_from_tool_spec "syntax": "gemma4") */
    const cJSON *tags; /* tool spec: markup strings that are single special tokens */
};

#define GEMMA_QUOTE "<|\"|>"

static int32_t js_schema(struct js *j, const cJSON *s);

/* Tool-spec markup: each occurrence of one of the spec's tags as the special token
 * (GRAM_TAG_MARK and the tag's text), the rest as bytes. */
static int32_t markup(struct js *j, const char *s)
{
    struct gb_list seq = {0};
    const char *run = s, *p = s;
    while (*p) {
        size_t best = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, j->tags)
        {
            size_t n = strlen(t->valuestring);
            if (n > best && !strncmp(p, t->valuestring, n)) best = n;
        }
        if (!best) {
            p++;
            continue;
        }
        if (p > run) gb_list_push(&seq, gb_lit(j->b, run, (size_t)(p - run)));
        gb_list_push(&seq, gb_byte((unsigned char)GRAM_TAG_MARK));
        gb_list_push(&seq, gb_lit(j->b, p, best));
        run = p += best;
    }
    if (p > run || !seq.n) gb_list_push(&seq, gb_lit(j->b, run, (size_t)(p - run)));
    return gb_list_seq(j->b, &seq);
}

/* A literal; in Gemma 4's syntax its string marks are the <|"|> token where that is one. */
static int32_t lit(struct js *j, const char *s)
{
    return j->gemma && j->tags ? markup(j, s) : gb_lit(j->b, s, strlen(s));
}

static int32_t regex(struct js *j, const char *re, int in_string)
{
    return gram_regex_into(j->b, re, strlen(re), in_string && !j->gemma);
}

static int32_t ws(struct js *j)
{
    if (j->gemma) return gb_empty(j->b); /* its bare keys run up to ':' */
    if (!j->ws) {
        struct gbset s = {{0}};
        s.w[0] = 1u << '\t' | 1u << '\n' | 1u << '\r';
        s.w[1] = 1u << (' ' - 32);
        j->ws = gb_rep(j->b, gb_set(j->b, &s), 0, JSON_WS_MAX);
    }
    return j->ws;
}

/* One character inside a JSON string: unescaped (no '"', '\' or controls) or an escape. */
static int32_t str_char(struct js *j)
{
    if (!j->chr && j->gemma) { /* raw text up to the closing mark: no '<' */
        uint32_t r[4] = {0, '<' - 1, '<' + 1, 0x10FFFF};
        j->chr = gb_cp_ranges(j->b, r, 2);
    }
    if (!j->chr) {
        uint32_t r[6] = {0x20, 0x21, 0x23, 0x5B, 0x5D, 0x10FFFF};
        int32_t plain = gb_cp_ranges(j->b, r, 3);
        int32_t esc = regex(j, "\\\\([\"\\\\/bfnrt]|u[0-9a-fA-F]{4})", 0);
        int32_t alt[2] = {plain, esc};
        j->chr = gb_alt(j->b, alt, 2);
    }
    return j->chr;
}

static int32_t quoted(struct js *j, int32_t body)
{
    int32_t q = j->gemma ? lit(j, GEMMA_QUOTE) : gb_byte('"');
    int32_t v[3] = {q, body, q};
    return gb_seq(j->b, v, 3);
}

static int32_t any_string(struct js *j)
{
    if (!j->str) j->str = quoted(j, gb_star(j->b, str_char(j)));
    return j->str;
}

static int32_t any_number(struct js *j)
{
    if (!j->num) j->num = regex(j, "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?", 0);
    return j->num;
}

/* "{" ws ( kv ws ( "," ws kv ws )* )? "}" with kv = key ws ":" ws value */
static int32_t map_of(struct js *j, int32_t value)
{
    struct gb *b = j->b;
    int32_t kv[5] = {any_string(j), ws(j), gb_byte(':'), ws(j), value};
    int32_t k = gb_seq(b, kv, 5);
    int32_t more[4] = {gb_byte(','), ws(j), k, ws(j)};
    int32_t body[3] = {k, ws(j), gb_star(b, gb_seq(b, more, 4))};
    int32_t all[4] = {gb_byte('{'), ws(j), gb_opt(b, gb_seq(b, body, 3)), gb_byte('}')};
    return gb_seq(b, all, 4);
}

static int32_t list_of(struct js *j, int32_t item, int lo, int hi)
{
    struct gb *b = j->b;
    if (hi == 0) {
        int32_t v[3] = {gb_byte('['), ws(j), gb_byte(']')};
        return gb_seq(b, v, 3);
    }
    int32_t more[4] = {gb_byte(','), ws(j), item, ws(j)};
    int32_t rest = gb_rep(b, gb_seq(b, more, 4), lo > 1 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    int32_t body[3] = {item, ws(j), rest};
    int32_t in = gb_seq(b, body, 3);
    int32_t all[4] = {gb_byte('['), ws(j), lo > 0 ? in : gb_opt(b, in), gb_byte(']')};
    return gb_seq(b, all, 4);
}

/* Any JSON value: a named rule, so that it can nest. */
static int32_t any_value(struct js *j)
{
    if (j->any) return j->any;
    struct gb *b = j->b;
    int rule = gb_rule_new(b, "value", 0);
    j->any = GSYM_RULE(rule);
    int32_t alts[7] = {map_of(j, j->any), list_of(j, j->any, 0, -1), any_string(j), any_number(j),
                       lit(j, "true"),    lit(j, "false"),           lit(j, "null")};
    for (int i = 0; i < 7; i++) gb_alt_add(b, rule, &alts[i], 1);
    return j->any;
}

/* ---- numbers in a range (grammar_num.c writes the regex) ---- */

static int32_t ranged(struct js *j, const cJSON *s, int integer)
{
    char msg[160] = "";
    char *re = gram_range_regex(s, integer, msg, sizeof msg);
    if (!re && msg[0]) return gb_fail(j->b, "schema: %s", msg);
    if (!re && integer) {
        if (!j->intg) j->intg = regex(j, "-?(0|[1-9][0-9]*)", 0);
        return j->intg;
    }
    if (!re) return any_number(j);
    int32_t x = regex(j, re, 0);
    free(re);
    return x;
}

/* ---- strings ---- */

static int32_t string(struct js *j, const cJSON *s)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *mnl = cJSON_GetObjectItemCaseSensitive(s, "minLength");
    const cJSON *mxl = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    if (cJSON_IsString(pat)) return quoted(j, regex(j, pat->valuestring, 1));
    if (pat) return gb_fail(j->b, "schema: 'pattern' must be a string");
    if (cJSON_IsString(fmt)) {
        static const char *const fmts[][2] = {
            {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"},
            {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?(Z|[+-]([01][0-9]|2["
                     "0-3]):[0-5][0-9])"},
            {"date-time",
             "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:([0-"
             "5][0-9]|60)(\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
            {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
            {"email", "[a-zA-Z0-9_%+-]+(\\.[a-zA-Z0-9_%+-]+)*@[a-zA-Z0-9-]+(\\.[a-zA-Z0-9-]+)*\\.["
                      "a-zA-Z]{2,}"},
            {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1["
                     "0-9][0-9]|[1-9]?[0-9])"},
        };
        for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++)
            if (!strcmp(fmt->valuestring, fmts[i][0])) return quoted(j, regex(j, fmts[i][1], 1));
        /* other formats are annotations (JSON Schema's default): any string */
    }
    int lo = 0, hi = -1;
    if (mnl && (!cJSON_IsNumber(mnl) || mnl->valuedouble < 0 || mnl->valuedouble > 10000))
        return gb_fail(j->b, "schema: 'minLength' must be an integer in 0..10000");
    if (mxl && (!cJSON_IsNumber(mxl) || mxl->valuedouble < 0 || mxl->valuedouble > 10000))
        return gb_fail(j->b, "schema: 'maxLength' must be an integer in 0..10000");
    if (mnl) lo = (int)mnl->valuedouble;
    if (mxl) hi = (int)mxl->valuedouble;
    if (!mnl && !mxl) return any_string(j);
    return quoted(j, gb_rep(j->b, str_char(j), lo, hi));
}

/* ---- objects ---- */

/* ---- Gemma 4's argument syntax: strings between its marks, keys bare where they are
 * names (letters, digits, '_', '-', '.'), else marked; numbers, true, false, null, {} and
 * [] as in JSON ---- */

struct gtext {
    char *p;
    size_t n, cap;
};

static void gt_put(struct gtext *t, const char *s)
{
    size_t l = strlen(s);
    if (t->n + l + 1 > t->cap) {
        t->cap = (t->n + l + 1) * 2;
        t->p = xrealloc(t->p, t->cap);
    }
    memcpy(t->p + t->n, s, l + 1);
    t->n += l;
}

static void gemma_key(struct gtext *t, const char *k)
{
    int bare = *k != 0;
    for (const char *c = k; *c && bare; c++)
        bare = (*c >= '0' && *c <= '9') || ((*c | 32) >= 'a' && (*c | 32) <= 'z') || *c == '_' ||
               *c == '-' || *c == '.';
    if (!bare) gt_put(t, GEMMA_QUOTE);
    gt_put(t, k);
    if (!bare) gt_put(t, GEMMA_QUOTE);
}

static void gemma_print(const cJSON *v, struct gtext *t)
{
    if (cJSON_IsString(v)) {
        gt_put(t, GEMMA_QUOTE);
        gt_put(t, v->valuestring);
        gt_put(t, GEMMA_QUOTE);
    } else if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        gt_put(t, cJSON_IsObject(v) ? "{" : "[");
        const cJSON *x;
        cJSON_ArrayForEach(x, v)
        {
            if (x != v->child) gt_put(t, ",");
            if (cJSON_IsObject(v)) gemma_key(t, x->string), gt_put(t, ":");
            gemma_print(x, t);
        }
        gt_put(t, cJSON_IsObject(v) ? "}" : "]");
    } else {
        char *s = cJSON_PrintUnformatted(v);
        gt_put(t, s);
        free(s);
    }
}

static int32_t key_lit(struct js *j, const char *name)
{
    struct gtext t = {0};
    cJSON *s = cJSON_CreateString(name);
    if (j->gemma)
        gemma_key(&t, name);
    else
        t.p = cJSON_PrintUnformatted(s);
    int32_t x = lit(j, t.p);
    free(t.p);
    cJSON_Delete(s);
    return x;
}

static int32_t object(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return gb_fail(b, "schema: 'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return gb_fail(b, "schema: 'required' must be an array");
    const cJSON *r;
    cJSON_ArrayForEach(r, req)
    {
        if (!cJSON_IsString(r)) return gb_fail(b, "schema: 'required' must list strings");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return gb_fail(b, "schema: required property '%.100s' is not in 'properties'",
                           r->valuestring);
    }
    int n = cJSON_GetArraySize(props);
    if (n == 0) {
        if (cJSON_IsFalse(add)) {
            int32_t v[3] = {gb_byte('{'), ws(j), gb_byte('}')};
            return gb_seq(b, v, 3);
        }
        return map_of(j, add && cJSON_IsObject(add) ? js_schema(j, add) : any_value(j));
    }
    /* rest[i][first]: properties i.. , the first one written without a leading comma */
    int32_t *kv = xmalloc(sizeof *kv * (size_t)n);
    char *need = xcalloc((size_t)n, 1);
    int i = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props)
    {
        cJSON_ArrayForEach(r, req) if (!strcmp(r->valuestring, p->string)) need[i] = 1;
        int32_t v[6] = {key_lit(j, p->string), ws(j), gb_byte(':'), ws(j), js_schema(j, p), ws(j)};
        if (b->failed) break;
        kv[i++] = gb_seq(b, v, 6);
    }
    int32_t body = -1;
    if (!b->failed) {
        int32_t next[2] = {gb_empty(b), gb_empty(b)}; /* rest[n][0], rest[n][1] */
        for (i = n - 1; i >= 0; i--) {
            int32_t cur[2];
            for (int first = 0; first < 2; first++) {
                int32_t with[3] = {gb_byte(','), ws(j), kv[i]};
                int32_t w = first ? kv[i] : gb_seq(b, with, 3);
                int32_t v[2] = {w, next[0]};
                int32_t present = gb_seq(b, v, 2);
                if (need[i]) {
                    cur[first] = present;
                } else {
                    int32_t alt[2] = {present, next[first]};
                    cur[first] = gb_alt(b, alt, 2);
                }
            }
            next[0] = cur[0], next[1] = cur[1];
        }
        int32_t v[4] = {gb_byte('{'), ws(j), next[1], gb_byte('}')};
        body = gb_seq(b, v, 4);
    }
    free(kv);
    free(need);
    return b->failed ? -1 : body;
}

/* ---- the schema ---- */

static int32_t ref(struct js *j, const char *path)
{
    for (int i = 0; i < j->n_refs; i++)
        if (!strcmp(j->refs[i].path, path)) return GSYM_RULE(j->refs[i].rule);
    if (path[0] != '#')
        return gb_fail(j->b, "schema: only local $ref (#...) is supported, got '%.100s'", path);
    const cJSON *t = j->doc;
    const char *s = path + 1;
    while (*s == '/') {
        s++;
        char part[256];
        size_t k = 0;
        while (*s && *s != '/' && k + 1 < sizeof part) {
            if (s[0] == '~' && (s[1] == '0' || s[1] == '1'))
                part[k++] = s[1] == '0' ? '~' : '/', s += 2;
            else
                part[k++] = *s++;
        }
        part[k] = 0;
        t = cJSON_GetObjectItemCaseSensitive(t, part);
        if (!t) return gb_fail(j->b, "schema: $ref '%.100s' does not resolve", path);
    }
    if (*s) return gb_fail(j->b, "schema: $ref '%.100s' does not resolve", path);
    int rule = gb_rule_new(j->b, path, 0);
    j->refs = xrealloc(j->refs, sizeof *j->refs * (size_t)(j->n_refs + 1));
    j->refs[j->n_refs++] = (struct jref){xstrdup(path), rule};
    int32_t body = js_schema(j, t);
    if (!j->b->failed) gb_alt_add(j->b, rule, &body, 1);
    return GSYM_RULE(rule);
}

/* A tuple: prefixItems[i] for the i-th item, then `items` for the rest (false: none; absent:
 * any), lo..hi items in all (hi < 0: unbounded). Built from the last prefix item back, each
 * one optional once lo items are written: "[" p0 ("," p1 ("," p2 rest)?)? "]". */
static int32_t tuple(struct js *j, const cJSON *prefix, const cJSON *items, int lo, int hi)
{
    struct gb *b = j->b;
    int k = cJSON_GetArraySize(prefix);
    int m = hi >= 0 && hi < k ? hi : k; /* prefix items that may be written */
    int no_rest = cJSON_IsFalse(items) || m < k;
    if (no_rest && lo > m)
        return gb_fail(b, "schema: 'minItems' %d is above the %d items 'prefixItems' allows", lo,
                       m);
    if (m == 0) return list_of(j, 0, 0, 0);
    int32_t *p = xmalloc(sizeof *p * (size_t)m);
    for (int i = 0; i < m && !b->failed; i++) p[i] = js_schema(j, cJSON_GetArrayItem(prefix, i));
    int32_t after = gb_empty(b); /* what may follow item m - 1 (and its whitespace) */
    if (!no_rest && !b->failed) {
        int32_t item = cJSON_IsObject(items) ? js_schema(j, items) : any_value(j);
        int32_t more[4] = {gb_byte(','), ws(j), item, ws(j)};
        after = gb_rep(b, gb_seq(b, more, 4), lo > k ? lo - k : 0, hi < 0 ? -1 : hi - k);
    }
    for (int i = m - 1; i > 0 && !b->failed; i--) { /* after item i - 1: "," item i ... */
        int32_t next[5] = {gb_byte(','), ws(j), p[i], ws(j), after};
        after = gb_seq(b, next, 5);
        if (i >= lo) after = gb_opt(b, after);
    }
    int32_t body[3] = {p[0], ws(j), after};
    int32_t in = b->failed ? -1 : gb_seq(b, body, 3);
    free(p);
    if (b->failed) return -1;
    int32_t all[4] = {gb_byte('['), ws(j), lo > 0 ? in : gb_opt(b, in), gb_byte(']')};
    return gb_seq(b, all, 4);
}

static int32_t of_type(struct js *j, const cJSON *s, const char *type)
{
    if (!strcmp(type, "object")) return object(j, s);
    if (!strcmp(type, "string")) return string(j, s);
    if (!strcmp(type, "integer")) return ranged(j, s, 1);
    if (!strcmp(type, "number")) return ranged(j, s, 0);
    if (!strcmp(type, "boolean")) {
        int32_t v[2] = {lit(j, "true"), lit(j, "false")};
        return gb_alt(j->b, v, 2);
    }
    if (!strcmp(type, "null")) return lit(j, "null");
    if (!strcmp(type, "array")) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minItems");
        const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
        const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
        if (prefix && (!cJSON_IsArray(prefix) || cJSON_GetArraySize(prefix) > 1000))
            return gb_fail(j->b, "schema: 'prefixItems' must be an array of at most 1000 schemas");
        int lo = 0, hi = -1;
        if (mn && (!cJSON_IsNumber(mn) || mn->valuedouble < 0 || mn->valuedouble > 1000))
            return gb_fail(j->b, "schema: 'minItems' must be an integer in 0..1000");
        if (mx && (!cJSON_IsNumber(mx) || mx->valuedouble < 0 || mx->valuedouble > 1000))
            return gb_fail(j->b, "schema: 'maxItems' must be an integer in 0..1000");
        if (mn) lo = (int)mn->valuedouble;
        if (mx) hi = (int)mx->valuedouble;
        if (hi >= 0 && hi < lo) return gb_fail(j->b, "schema: 'maxItems' is below 'minItems'");
        if (cJSON_GetArraySize(prefix) > 0) return tuple(j, prefix, items, lo, hi);
        if (cJSON_IsFalse(items)) hi = 0;
        return list_of(j, items && cJSON_IsObject(items) ? js_schema(j, items) : any_value(j), lo,
                       hi);
    }
    return gb_fail(j->b, "schema: unknown type '%.40s'", type);
}

static int32_t literal_value(struct js *j, const cJSON *v)
{
    struct gtext t = {0};
    if (j->gemma)
        gemma_print(v, &t);
    else
        t.p = cJSON_PrintUnformatted(v);
    int32_t x = lit(j, t.p);
    free(t.p);
    return x;
}

static int32_t alternatives(struct js *j, const cJSON *arr, const char *kw)
{
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || n == 0)
        return gb_fail(j->b, "schema: '%s' must be a non-empty array", kw);
    int32_t *v = xmalloc(sizeof *v * (size_t)n);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr)
    {
        v[i] = !strcmp(kw, "enum") ? literal_value(j, x) : js_schema(j, x);
        if (j->b->failed) break;
        i++;
    }
    int32_t r = j->b->failed ? -1 : gb_alt(j->b, v, n);
    free(v);
    return r;
}

static int32_t js_schema(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    if (b->failed) return -1;
    if (cJSON_IsTrue(s)) return any_value(j);
    if (!cJSON_IsObject(s)) return gb_fail(b, "schema: a schema must be an object or true");
    if (++j->depth > JSON_DEPTH) return gb_fail(b, "schema: nested deeper than %d", JSON_DEPTH);
    static const char *const refused[] = {"not",
                                          "if",
                                          "then",
                                          "else",
                                          "patternProperties",
                                          "dependentSchemas",
                                          "dependentRequired",
                                          "unevaluatedProperties",
                                          "unevaluatedItems",
                                          "propertyNames",
                                          "contains",
                                          "minProperties",
                                          "maxProperties",
                                          "multipleOf",
                                          NULL};
    int32_t out = -1;
    for (int i = 0; refused[i]; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, refused[i])) {
            out = gb_fail(b, "schema: '%s' is not supported", refused[i]);
            goto done;
        }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
    if (cJSON_IsTrue(u)) {
        out = gb_fail(b, "schema: 'uniqueItems' is not supported");
        goto done;
    }
    const cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        out = cJSON_IsString(x) ? ref(j, x->valuestring)
                                : gb_fail(b, "schema: '$ref' must be a string");
    } else if ((x = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        out = literal_value(j, x);
    } else if ((x = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        out = alternatives(j, x, "enum");
    } else if ((x = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        out = alternatives(j, x, "anyOf");
    } else if ((x = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        out = alternatives(j, x, "oneOf");
    } else if ((x = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) != 1)
            out = gb_fail(b, "schema: 'allOf' is supported with exactly one schema");
        else
            out = js_schema(j, x->child);
    } else if ((x = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        if (cJSON_IsString(x)) {
            out = of_type(j, s, x->valuestring);
        } else if (cJSON_IsArray(x) && cJSON_GetArraySize(x) > 0) {
            int n = cJSON_GetArraySize(x), i = 0;
            int32_t v[8];
            const cJSON *t;
            cJSON_ArrayForEach(t, x)
            {
                if (!cJSON_IsString(t) || i == 8) {
                    out = gb_fail(b, "schema: 'type' must be a string or a list of type names");
                    goto done;
                }
                v[i++] = of_type(j, s, t->valuestring);
            }
            out = b->failed ? -1 : gb_alt(b, v, n);
        } else {
            out = gb_fail(b, "schema: 'type' must be a string or a list of type names");
        }
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties")) {
        out = object(j, s);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items") ||
               cJSON_GetObjectItemCaseSensitive(s, "prefixItems")) {
        out = of_type(j, s, "array");
    } else {
        out = any_value(j);
    }
done:
    j->depth--;
    return out;
}

struct gram *gram_from_json_schema(const char *json, size_t len, struct err *e)
{
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!doc)
        return err_set(e, "schema: not valid JSON (near byte %zu)", end ? (size_t)(end - json) : 0),
               NULL;
    struct gb b;
    gb_init(&b, e);
    struct js j = {.b = &b, .doc = doc};
    int32_t x = js_schema(&j, doc);
    int root = gb_rule_new(&b, "root", 0);
    if (!b.failed) gb_alt_add(&b, root, &x, 1);
    for (int i = 0; i < j.n_refs; i++) free(j.refs[i].path);
    free(j.refs);
    cJSON_Delete(doc);
    return gb_finish(&b, root);
}

struct gram *gram_json_object(void)
{
    struct gb b;
    struct err e;
    gb_init(&b, &e);
    struct js j = {.b = &b};
    int32_t x = map_of(&j, any_value(&j));
    int root = gb_rule_new(&b, "root", 0);
    gb_alt_add(&b, root, &x, 1);
    return gb_finish(&b, root);
}

/* qwen3_xml parameters: <parameter=K>\nV\n</parameter>\n each, in order, the required ones
 * present; V free text without '<' for strings (at most max_bytes bytes when given), else
 * JSON under the parameter's schema. */
static int32_t spec_params(struct js *j, const cJSON *params)
{
    struct gb_list seq = {0};
    const cJSON *p;
    cJSON_ArrayForEach(p, params)
    {
        const cJSON *key = cJSON_GetObjectItemCaseSensitive(p, "key");
        if (!cJSON_IsString(key))
            return gb_list_seq(j->b, &seq), gb_fail(j->b, "tool spec: a parameter needs a key");
        char open[320];
        snprintf(open, sizeof open, "<parameter=%.256s>\n", key->valuestring);
        int32_t value;
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "text"))) {
            struct gbset s;
            memset(&s, 0xff, sizeof s);
            s.w['<' / 32] &= ~(1u << ('<' % 32));
            const cJSON *max = cJSON_GetObjectItemCaseSensitive(p, "max_bytes");
            value = gb_rep(j->b, gb_set(j->b, &s), 0, cJSON_IsNumber(max) ? max->valueint : -1);
        } else {
            value = js_schema(j, cJSON_GetObjectItemCaseSensitive(p, "schema"));
        }
        int32_t v[3] = {markup(j, open), value, markup(j, "\n</parameter>\n")};
        int32_t one = j->b->failed ? -1 : gb_seq(j->b, v, 3);
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "required"))) one = gb_opt(j->b, one);
        gb_list_push(&seq, one);
    }
    return gb_list_seq(j->b, &seq);
}

/* One of the spec's calls: prefix (a string, or an array of alternatives), a JSON value
 * under "schema" (or qwen3_xml "params"), suffix. */
static int32_t spec_call(struct js *j, const cJSON *call)
{
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(call, "prefix");
    const cJSON *suf = cJSON_GetObjectItemCaseSensitive(call, "suffix");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(call, "schema");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(call, "params");
    int good_pre = cJSON_IsString(pre) || (cJSON_IsArray(pre) && cJSON_GetArraySize(pre) > 0);
    const cJSON *x, *alt = cJSON_IsArray(pre) ? pre : NULL;
    cJSON_ArrayForEach(x, alt) good_pre &= cJSON_IsString(x);
    if (!good_pre || !cJSON_IsString(suf) || (!schema && !cJSON_IsArray(params)))
        return gb_fail(j->b, "tool spec: a call needs 'prefix', 'schema' or 'params', 'suffix'");
    struct gb_list alts = {0};
    if (cJSON_IsString(pre))
        gb_list_push(&alts, markup(j, pre->valuestring));
    else
        cJSON_ArrayForEach(x, pre) gb_list_push(&alts, markup(j, x->valuestring));
    int32_t head = gb_list_alt(j->b, &alts);
    /* $ref resolves inside the call's own schema */
    for (int i = 0; i < j->n_refs; i++) free(j->refs[i].path);
    j->n_refs = 0;
    j->doc = schema ? schema : params;
    int32_t v[3] = {head, schema ? js_schema(j, schema) : spec_params(j, params),
                    markup(j, suf->valuestring)};
    return j->b->failed ? -1 : gb_seq(j->b, v, 3);
}

struct gram *gram_from_tool_spec(const char *json, size_t len, struct err *e)
{
    cJSON *spec = cJSON_ParseWithLength(json, len);
    if (!spec) return err_set(e, "tool spec: not valid JSON"), NULL;
    struct gb b;
    gb_init(&b, e);
    struct js j = {.b = &b};
    const cJSON *syntax = cJSON_GetObjectItemCaseSensitive(spec, "syntax");
    j.gemma = cJSON_IsString(syntax) && !strcmp(syntax->valuestring, "gemma4");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(spec, "calls");
    const cJSON *begin = cJSON_GetObjectItemCaseSensitive(spec, "begin");
    const cJSON *sep = cJSON_GetObjectItemCaseSensitive(spec, "sep");
    const cJSON *end = cJSON_GetObjectItemCaseSensitive(spec, "end");
    const cJSON *max = cJSON_GetObjectItemCaseSensitive(spec, "max");
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(spec, "tags"), *t;
    int good_tags = !tags || cJSON_IsArray(tags);
    cJSON_ArrayForEach(t, tags) good_tags &= cJSON_IsString(t) && t->valuestring[0];
    j.tags = cJSON_GetArraySize(tags) ? tags : NULL;
    int32_t x = -1;
    if (!cJSON_IsArray(calls) || !cJSON_GetArraySize(calls) || !cJSON_IsString(begin) ||
        !cJSON_IsString(sep) || !cJSON_IsString(end) || !cJSON_IsNumber(max) || max->valueint < 1) {
        gb_fail(&b, "tool spec: needs calls, begin, sep, end and max >= 1");
    } else if (!good_tags) {
        gb_fail(&b, "tool spec: 'tags' must be an array of non-empty strings");
    } else {
        struct gb_list alts = {0};
        const cJSON *c;
        cJSON_ArrayForEach(c, calls) gb_list_push(&alts, spec_call(&j, c));
        int32_t one = gb_list_alt(&b, &alts);
        int32_t more[2] = {markup(&j, sep->valuestring), one};
        int32_t rest = gb_rep(&b, gb_seq(&b, more, 2), 0, max->valueint - 1);
        int32_t all[4] = {markup(&j, begin->valuestring), one, rest, markup(&j, end->valuestring)};
        if (!b.failed) x = gb_seq(&b, all, 4);
    }
    int root = gb_rule_new(&b, "root", 0);
    if (!b.failed) gb_alt_add(&b, root, &x, 1);
    for (int i = 0; i < j.n_refs; i++) free(j.refs[i].path);
    free(j.refs);
    cJSON_Delete(spec);
    return gb_finish(&b, root);
}
