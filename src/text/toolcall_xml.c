/*
 * The tool-call formats whose arguments are not JSON, converted to compact JSON as they are
 * read: qwen3_xml (<parameter=K> values typed by the tool's schema) and gemma4 (Gemma 4's
 * argument syntax). See toolcall.h; the parser's driving loop is in toolcall.c.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/toolcall_impl.h"

/* ---- qwen3_xml ------------------------------------------------------------------------ */

/* The JSON Schema type of parameter key of the call's tool: 1 when it is a string (or
 * unknown: vLLM's parser also keeps those as they are). */
static int param_is_string(const struct tcall_parser *p, const char *fn, const char *key)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, p->tools)
    {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(n) || strcmp(n->valuestring, fn)) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(f, "parameters"), "properties");
        const cJSON *ty =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, key), "type");
        if (cJSON_IsString(ty)) return !strcmp(ty->valuestring, "string");
        if (!cJSON_IsArray(ty)) return 1;
        const cJSON *x;
        cJSON_ArrayForEach(x,
                           ty) if (cJSON_IsString(x) && !strcmp(x->valuestring, "string")) return 1;
        return 0;
    }
    return 1;
}

/* Appends s[0..n) to the arguments as the inside of a JSON string. */
static void args_escaped(struct tcall *c, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char buf[8];
        if (ch == '"' || ch == '\\') {
            buf[0] = '\\', buf[1] = (char)ch;
            tcall_str_append(&c->args, buf, 2);
        } else if (ch == '\n') {
            tcall_str_append(&c->args, "\\n", 2);
        } else if (ch == '\t') {
            tcall_str_append(&c->args, "\\t", 2);
        } else if (ch == '\r') {
            tcall_str_append(&c->args, "\\r", 2);
        } else if (ch < 0x20) {
            static const char hex[] = "0123456789abcdef";
            memcpy(buf, "\\u00", 4);
            buf[4] = hex[ch >> 4], buf[5] = hex[ch & 15];
            tcall_str_append(&c->args, buf, 6);
        } else {
            tcall_str_append(&c->args, s + i, 1);
        }
    }
}

/* Reads "<tag=VALUE>" at the start of held: 1 + *len (bytes) and the value's span, 0 when
 * more text is needed, -1 when held does not start so. */
static int xml_open(const struct tcall_parser *p, const char *tag, size_t *len, size_t *v0,
                    size_t *vn)
{
    const char *h = p->held.p;
    size_t n = p->held.len, t = strlen(tag);
    if (!tc_starts(h, n, tag)) return -1;
    if (n <= t) return 0;
    for (size_t i = t; i < n; i++) {
        if (h[i] == '>') {
            *v0 = t, *vn = i - t, *len = i + 1;
            return 1;
        }
        if (h[i] == '<' || h[i] == '\n' || i - t > 256) return -1;
    }
    return 0;
}

static void skip_ws(struct tcall_parser *p)
{
    size_t i = 0;
    while (i < p->held.len && tc_is_ws(p->held.p[i])) i++;
    tcall_str_append(&p->raw, p->held.p, i);
    tc_consume(p, i);
}

int tc_step_x_func(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
    skip_ws(p);
    size_t len, v0, vn;
    int r = xml_open(p, "<function=", &len, &v0, &vn);
    if (r == 0 && !at_end) return 0;
    if (r <= 0) {
        tc_call_abandon(p, content);
        return 1;
    }
    tc_set_name(tc_cur(p), p->held.p + v0, vn);
    tc_consume(p, len);
    p->n_params = 0;
    p->st = ST_X_BODY;
    return 1;
}

int tc_step_x_body(struct tcall_parser *p, int at_end)
{
    skip_ws(p);
    struct tcall *c = tc_cur(p);
    if (!p->held.len) return 0;
    size_t len, v0, vn;
    int r = xml_open(p, "<parameter=", &len, &v0, &vn);
    if (r == 1) {
        tcall_str_append(&c->args, p->n_params ? "," : "{", 1);
        p->n_params++;
        char *key = xmalloc(vn + 1);
        memcpy(key, p->held.p + v0, vn);
        key[vn] = 0;
        tcall_str_append(&c->args, "\"", 1);
        args_escaped(c, key, vn);
        tcall_str_append(&c->args, "\":", 2);
        p->value_string = param_is_string(p, c->name, key);
        if (p->value_string) tcall_str_append(&c->args, "\"", 1);
        free(key);
        tc_consume(p, len);
        p->value_begun = 0;
        p->st = ST_X_VALUE;
        return 1;
    }
    const char *end = "</function>";
    if (tc_starts(p->held.p, p->held.len, end) && p->held.len < strlen(end) && !at_end) return 0;
    if (r == 0 && !at_end) return 0;
    /* </function>, or anything else: the call's arguments are complete */
    if (tc_starts(p->held.p, p->held.len, end) && p->held.len >= strlen(end))
        tc_consume(p, strlen(end));
    tc_puts(&c->args, p->n_params ? "}" : "{}");
    tc_call_close(p);
    p->st = ST_X_END;
    return 1;
}

/* A non-string parameter's text as JSON: parsed and printed compact, or as a string when
 * it is not JSON. */
static void args_typed(struct tcall *c, const char *s, size_t n)
{
    while (n && tc_is_ws(*s)) s++, n--;
    while (n && tc_is_ws(s[n - 1])) n--;
    cJSON *v = cJSON_ParseWithLength(s, n);
    if (v) {
        char *t = cJSON_PrintUnformatted(v);
        tc_puts(&c->args, t);
        free(t);
        cJSON_Delete(v);
        return;
    }
    tcall_str_append(&c->args, "\"", 1);
    args_escaped(c, s, n);
    tcall_str_append(&c->args, "\"", 1);
}

int tc_step_x_value(struct tcall_parser *p, int at_end)
{
    static const char end[] = "</parameter>";
    struct tcall *c = tc_cur(p);
    if (!p->value_begun) { /* the newline after <parameter=K> is markup */
        if (!p->held.len) return 0;
        if (p->held.p[0] == '\n') tc_consume(p, 1);
        p->value_begun = 1;
    }
    const char *h = p->held.p;
    size_t n = p->held.len;
    long k = tc_find(h, n, end);
    if (k < 0 && !at_end) {
        if (!p->value_string) return 0;
        /* hold what may be "\n</parameter>" (the newline before the tag is markup) */
        size_t keep = tc_partial(h, n, "\n</parameter>");
        size_t keep2 = tc_partial(h, n, end);
        if (keep2 > keep) keep = keep2;
        args_escaped(c, h, n - keep);
        tc_consume(p, n - keep);
        return 0;
    }
    size_t vn = k < 0 ? n : (size_t)k;
    if (vn && h[vn - 1] == '\n') vn--;
    if (p->value_string) {
        args_escaped(c, h, vn);
        tcall_str_append(&c->args, "\"", 1);
    } else {
        args_typed(c, h, vn);
    }
    tc_consume(p, k < 0 ? n : (size_t)k + sizeof end - 1);
    p->st = ST_X_BODY;
    return 1;
}

int tc_step_x_end(struct tcall_parser *p, int at_end)
{
    static const char end[] = "</tool_call>";
    size_t i = 0;
    while (i < p->held.len && tc_is_ws(p->held.p[i])) i++;
    tc_consume(p, i);
    if (!p->held.len) return 0;
    if (tc_starts(p->held.p, p->held.len, end) && p->held.len < sizeof end - 1 && !at_end) return 0;
    if (tc_starts(p->held.p, p->held.len, end) && p->held.len >= sizeof end - 1)
        tc_consume(p, sizeof end - 1);
    p->st = ST_TEXT;
    return 1;
}

/* ---- gemma4 --------------------------------------------------------------------------- */

int tc_step_g_name(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
    static const char call[] = "call:";
    const char *h = p->held.p;
    size_t n = p->held.len;
    if (!tc_starts(h, n, call) || (n < sizeof call - 1 && at_end)) {
        tc_call_abandon(p, content);
        return 1;
    }
    const char *brace = memchr(h, '{', n);
    size_t span = brace ? (size_t)(brace - h) : n;
    int bad = span > 256 + sizeof call;
    for (size_t i = sizeof call - 1; i < span && !bad; i++) bad = h[i] == '<' || h[i] == '\n';
    if (!bad && !brace && !at_end) return 0;
    if (bad || !brace) {
        tc_call_abandon(p, content);
        return 1;
    }
    tc_set_name(tc_cur(p), h + sizeof call - 1, span - (sizeof call - 1));
    tcall_str_append(&p->raw, h, span);
    tc_consume(p, span);
    p->g_depth = 0;
    p->g_str = 0;
    p->st = ST_G_ARGS;
    return 1;
}

/* The arguments in Gemma 4's syntax, converted to compact JSON as they come: a bare key is
 * quoted when its ':' arrives, a string's text is escaped up to its closing mark (a possible
 * start of the mark held back), everything else is copied. */
int tc_step_g_args(struct tcall_parser *p, int at_end)
{
    struct tcall *c = tc_cur(p);
    static const char q[] = GEMMA_QUOTE;
    const size_t ql = sizeof q - 1;
    for (;;) {
        const char *h = p->held.p;
        size_t n = p->held.len;
        if (!n) return 0;
        if (p->g_str) {
            long k = tc_find(h, n, q);
            size_t take = k >= 0 ? (size_t)k : n - (at_end ? 0 : tc_partial(h, n, q));
            args_escaped(c, h, take);
            tc_consume(p, take);
            if (k < 0) return 0;
            tcall_str_append(&c->args, "\"", 1);
            tc_consume(p, ql);
            p->g_str = 0;
            continue;
        }
        if (tc_is_ws(h[0])) {
            tc_consume(p, 1);
            continue;
        }
        if (tc_starts(h, n, q) && n < ql && !at_end) return 0;
        if (tc_starts(h, n, q) && n >= ql) { /* a string (a value, or an escaped key) */
            tcall_str_append(&c->args, "\"", 1);
            tc_consume(p, ql);
            p->g_str = 1;
            p->g_key = 0;
            continue;
        }
        char ch = h[0];
        int in_obj = p->g_depth > 0 && p->g_stack[p->g_depth - 1] == '{';
        if (p->g_key && in_obj && ch != '}') { /* a bare key, up to ':' */
            /* a key is at most 256 bytes: the same cut in any chunking */
            const char *colon = memchr(h, ':', n < 256 ? n : 256);
            if (!colon && !at_end && n < 256) return 0;
            size_t kn = colon ? (size_t)(colon - h) : n < 256 ? n : 256;
            tcall_str_append(&c->args, "\"", 1);
            args_escaped(c, h, kn);
            tcall_str_append(&c->args, "\":", 2);
            tc_consume(p, colon ? kn + 1 : kn);
            p->g_key = 0;
            continue;
        }
        tcall_str_append(&c->args, &ch, 1);
        tc_consume(p, 1);
        if (ch == '{' || ch == '[') {
            if (p->g_depth == (int)sizeof p->g_stack) { /* too deep: the call ends here */
                tc_call_close(p);
                p->st = ST_G_END;
                return 1;
            }
            p->g_stack[p->g_depth++] = ch;
            p->g_key = ch == '{';
        } else if ((ch == '}' || ch == ']') && p->g_depth > 0) {
            if (--p->g_depth == 0) {
                tc_call_close(p);
                p->st = ST_G_END;
                return 1;
            }
        } else if (ch == ',') {
            p->g_key = in_obj;
        }
    }
}

int tc_step_g_end(struct tcall_parser *p, int at_end)
{
    static const char end[] = "<tool_call|>";
    size_t i = 0;
    while (i < p->held.len && tc_is_ws(p->held.p[i])) i++;
    tc_consume(p, i);
    if (!p->held.len) return 0;
    if (tc_starts(p->held.p, p->held.len, end) && p->held.len < sizeof end - 1 && !at_end) return 0;
    if (tc_starts(p->held.p, p->held.len, end) && p->held.len >= sizeof end - 1)
        tc_consume(p, sizeof end - 1);
    p->st = ST_TEXT;
    return 1;
}
