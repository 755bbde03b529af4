#include "http/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void http_buf_append(struct http_buf *b, const void *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1) cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void http_buf_puts(struct http_buf *b, const char *s)
{
    http_buf_append(b, s, strlen(s));
}

void http_buf_printf(struct http_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        http_buf_append(b, tmp, (size_t)n);
        return;
    }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    http_buf_append(b, big, (size_t)n);
    free(big);
}

void http_buf_json_str(struct http_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    http_buf_append(b, "\"", 1);
    size_t run = 0; /* bytes copied verbatim in one append */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        http_buf_append(b, s + run, i - run);
        run = i + 1;
        char esc[6] = {'\\', 0};
        size_t el = 2;
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        default:
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            el = 6;
        }
        http_buf_append(b, esc, el);
    }
    http_buf_append(b, s + run, n - run);
    http_buf_append(b, "\"", 1);
}

void http_buf_dispose(struct http_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int http_error_set(struct http_error *he, int status, const char *param, const char *fmt, ...)
{
    if (!he) return -1;
    he->status = status;
    snprintf(he->param, sizeof he->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(he->msg, sizeof he->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *openai_type(int status)
{
    if (status >= 500) return "server_error";
    if (status == 429) return "requests"; /* OpenAI's type for a request-count limit */
    return "invalid_request_error";
}

static const char *anthropic_type(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
        return "overloaded_error";
    default:
        return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *http_error_openai(const struct http_error *he)
{
    struct http_buf b = {0};
    http_buf_puts(&b, "{\"error\":{\"message\":");
    http_buf_json_str(&b, he->msg, strlen(he->msg));
    http_buf_printf(&b, ",\"type\":\"%s\",\"param\":", openai_type(he->status));
    if (he->param[0])
        http_buf_json_str(&b, he->param, strlen(he->param));
    else
        http_buf_puts(&b, "null");
    http_buf_puts(&b, ",\"code\":");
    if (he->code[0])
        http_buf_json_str(&b, he->code, strlen(he->code));
    else
        http_buf_puts(&b, "null");
    http_buf_puts(&b, "}}");
    return b.p;
}

/*
 * Anthropic names a field as a dotted path (messages.0.content) and starts the message with
 * it: "messages.0.content: field required". The parsers name fields OpenAI's way
 * (messages[0].content), some in the message too; this writes every one in that form.
 */
static void anthropic_message(const struct http_error *he, struct http_buf *out)
{
    char path[sizeof he->param];
    size_t n = 0;
    for (const char *p = he->param; *p && n + 1 < sizeof path; p++) {
        if (*p == ']') continue;
        path[n++] = *p == '[' ? '.' : *p;
    }
    path[n] = 0;
    const char *msg = he->msg;
    if (n) {
        http_buf_printf(out, "%s: ", path);
        /* the message already names the field: 'x' must be ... / x: ... */
        size_t pl = strlen(he->param);
        if (!strncmp(msg, path, n) && msg[n] == ':')
            msg += n + 1;
        else if (msg[0] == '\'' && !strncmp(msg + 1, he->param, pl) && msg[pl + 1] == '\'')
            msg += pl + 2; /* 'x' must be ... -> x: must be ... */
        else if (!strncmp(msg, he->param, pl) && msg[pl] == ':')
            msg += pl + 1;
        while (*msg == ' ') msg++;
    }
    http_buf_puts(out, msg);
}

char *http_error_anthropic(const struct http_error *he)
{
    struct http_buf b = {0};
    http_buf_printf(&b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":",
                    anthropic_type(he->status));
    struct http_buf m = {0};
    anthropic_message(he, &m);
    http_buf_json_str(&b, m.p ? m.p : "", m.len);
    http_buf_dispose(&m);
    http_buf_puts(&b, "}}");
    return b.p;
}

/* Bytes of the UTF-8 sequence at s (1..4), or 0 when it is malformed or cut short. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x3f >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

int http_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_seq(u + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

size_t http_utf8_complete(const char *s, size_t n)
{
    /* Walk back over at most 3 continuation bytes to the last lead byte. */
    size_t i = n;
    for (int k = 0; k < 4 && i > 0; k++) {
        unsigned char c = (unsigned char)s[i - 1];
        if ((c & 0xc0) != 0x80) {
            size_t need = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            return n - (i - 1) >= need ? n : i - 1;
        }
        i--;
    }
    return n;
}

static const cJSON *field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int http_json_bool(const cJSON *o, const char *name, int *out, struct http_error *he)
{
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return http_error_set(he, 400, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 1;
}

int http_json_int(const cJSON *o, const char *name, long lo, long hi, long *out,
                  struct http_error *he)
{
    const cJSON *v = field(o, name);
    if (!v) return 0;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d))
        return http_error_set(he, 400, name, "'%s' must be an integer", name);
    if (d < (double)lo || d > (double)hi)
        return http_error_set(he, 400, name, "'%s' must be between %ld and %ld, got %.0f", name, lo,
                              hi, d);
    *out = (long)d;
    return 1;
}

int http_json_num(const cJSON *o, const char *name, double lo, double hi, double *out,
                  struct http_error *he)
{
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return http_error_set(he, 400, name, "'%s' must be a number", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return http_error_set(he, 400, name, "'%s' must be between %g and %g, got %g", name, lo, hi,
                              v->valuedouble);
    *out = v->valuedouble;
    return 1;
}

int http_json_str(const cJSON *o, const char *name, const char **out, struct http_error *he)
{
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsString(v)) return http_error_set(he, 400, name, "'%s' must be a string", name);
    *out = v->valuestring;
    return 1;
}

/* Byte offset of the first raw control character inside a string, or -1 (RFC 8259 §7:
 * they must be escaped; cJSON takes them as they are). One pass over the body. */
static long raw_control_in_string(const char *s, size_t n)
{
    int in = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!in) {
            in = c == '"';
        } else if (c == '\\') {
            i++;
        } else if (c == '"') {
            in = 0;
        } else if (c < 0x20) {
            return (long)i;
        }
    }
    return -1;
}

/* The first member name that an object of v repeats (depth first), or NULL. Cost: the
 * pairs of names of each object, so objects are limited to HTTP_JSON_MAX_MEMBERS members. */
#define HTTP_JSON_MAX_MEMBERS 4096
static const char *duplicate_key(const cJSON *v, int *too_many)
{
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return NULL;
    int n = 0;
    for (const cJSON *a = v->child; a; a = a->next, n++) {
        if (cJSON_IsObject(v)) {
            if (n >= HTTP_JSON_MAX_MEMBERS) {
                *too_many = 1;
                return NULL;
            }
            for (const cJSON *b = v->child; b != a; b = b->next)
                if (!strcmp(a->string, b->string)) return a->string;
        }
        const char *d = duplicate_key(a, too_many);
        if (d || *too_many) return d;
    }
    return NULL;
}

cJSON *http_json_parse_body(const char *body, size_t len, struct http_error *he)
{
    if (!http_utf8_valid(body, len)) {
        http_error_set(he, 400, NULL, "the request body is not valid UTF-8");
        return NULL;
    }
    long raw = raw_control_in_string(body, len);
    if (raw >= 0) {
        http_error_set(he, 400, NULL,
                       "the request body is not valid JSON: a string holds a raw control "
                       "character (byte %ld; write it as an escape such as \\n)",
                       raw);
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!j) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        http_error_set(he, 400, NULL, "the request body is not valid JSON (near byte %zu)", at);
        return NULL;
    }
    /* Only whitespace may follow the value. */
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') {
            cJSON_Delete(j);
            http_error_set(he, 400, NULL, "the request body has data after the JSON value");
            return NULL;
        }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        http_error_set(he, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    int too_many = 0;
    const char *dup = duplicate_key(j, &too_many);
    if (dup || too_many) {
        if (too_many)
            http_error_set(he, 400, NULL, "the request body has an object of more than %d members",
                           HTTP_JSON_MAX_MEMBERS);
        else
            http_error_set(he, 400, NULL,
                           "the request body repeats the member '%.60s' in one object", dup);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}
