/*
 * tmpl_lex: template source -> tokens, with the whitespace rules transformers configures
 * (trim_blocks: a block or comment tag eats the one newline after it; lstrip_blocks:
 * spaces and tabs between a line start and a block or comment tag go away; `-` on a tag
 * side strips all whitespace on that side, `+` disables the block rules). Newlines are
 * normalized to \n and one trailing newline of the template is dropped, as jinja2 does.
 */
#include "text/tmpl_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

struct lexer {
    struct tarena *a;
    struct err *e;
    const char *s;
    size_t n, pos;
    int line;
    struct tok *toks;
    size_t ntok, cap;
    int failed;
};

static int lfail(struct lexer *L, const char *msg)
{
    if (!L->failed) err_set(L->e, "TemplateSyntaxError: %s (line %d)", msg, L->line);
    L->failed = 1;
    return -1;
}

static struct tok *push(struct lexer *L, int type)
{
    if (L->ntok == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        struct tok *t = ta_alloc(L->a, nc * sizeof *t);
        if (!t) return NULL;
        if (L->ntok) memcpy(t, L->toks, L->ntok * sizeof *t);
        L->toks = t;
        L->cap = nc;
    }
    struct tok *t = &L->toks[L->ntok++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = L->line;
    return t;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static void count_lines(struct lexer *L, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (L->s[i] == '\n') L->line++;
}

/* Emits text [from, to) after the strip rules of the tag that follows it. */
static int emit_data(struct lexer *L, size_t from, size_t to, char ctrl, int block_like,
                     int line_starting)
{
    if (ctrl == '-') {
        while (to > from && is_ws(L->s[to - 1])) to--;
    } else if (ctrl != '+' && block_like) {
        size_t l = to;
        while (l > from && L->s[l - 1] != '\n') l--;
        if (l > from || line_starting) {
            size_t k = l;
            while (k < to && is_ws(L->s[k]) && L->s[k] != '\n') k++;
            if (k == to) to = l;
        }
    }
    if (to > from) {
        struct tok *t = push(L, TK_DATA);
        if (!t) return lfail(L, "template too large");
        t->s = L->s + from;
        t->n = to - from;
    }
    return 0;
}

static int starts(struct lexer *L, size_t at, const char *w)
{
    size_t k = strlen(w);
    return at + k <= L->n && !memcmp(L->s + at, w, k);
}

/* Decodes a Python string literal body (unicode-escape rules) into the arena. */
static int lex_string(struct lexer *L, char q)
{
    size_t i = L->pos + 1;
    size_t start = i;
    while (i < L->n && L->s[i] != q) {
        if (L->s[i] == '\\') i++;
        i++;
    }
    if (i >= L->n) return lfail(L, "unexpected end of string");
    size_t raw = i - start;
    char *d = ta_alloc(L->a, raw + 1);
    if (!d) return lfail(L, "template too large");
    size_t o = 0;
    for (size_t k = start; k < i; k++) {
        char c = L->s[k];
        if (c != '\\' || k + 1 >= i) {
            d[o++] = c;
            continue;
        }
        char x = L->s[++k];
        unsigned long cp = 0;
        int hex = 0;
        switch (x) {
        case 'n':
            d[o++] = '\n';
            break;
        case 't':
            d[o++] = '\t';
            break;
        case 'r':
            d[o++] = '\r';
            break;
        case '\\':
            d[o++] = '\\';
            break;
        case '\'':
            d[o++] = '\'';
            break;
        case '"':
            d[o++] = '"';
            break;
        case 'a':
            d[o++] = '\a';
            break;
        case 'b':
            d[o++] = '\b';
            break;
        case 'f':
            d[o++] = '\f';
            break;
        case 'v':
            d[o++] = '\v';
            break;
        case '\n':
            break; /* line continuation */
        case 'x':
            hex = 2;
            break;
        case 'u':
            hex = 4;
            break;
        case 'U':
            hex = 8;
            break;
        default:
            if (x >= '0' && x <= '7') {
                int m = 0;
                while (m < 3 && k < i && L->s[k] >= '0' && L->s[k] <= '7')
                    cp = cp * 8 + (unsigned long)(L->s[k++] - '0'), m++;
                k--;
                hex = -1;
            } else {
                d[o++] = '\\';
                d[o++] = x;
            }
        }
        if (hex > 0) {
            if (k + (size_t)hex >= i) return lfail(L, "truncated \\x/\\u escape in string");
            for (int m = 0; m < hex; m++) {
                char h = L->s[k + 1 + (size_t)m];
                int v = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
                if (v < 0) return lfail(L, "bad \\x/\\u escape in string");
                cp = cp * 16 + (unsigned long)v;
            }
            k += (size_t)hex;
        }
        if (hex) {
            /* UTF-8 encode; the escape is never longer than its encoding. */
            if (cp > 0x10ffff) return lfail(L, "bad \\U escape in string");
            if (cp < 0x80) {
                d[o++] = (char)cp;
            } else if (cp < 0x800) {
                d[o++] = (char)(0xc0 | (cp >> 6));
                d[o++] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                d[o++] = (char)(0xe0 | (cp >> 12));
                d[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                d[o++] = (char)(0x80 | (cp & 0x3f));
            } else {
                d[o++] = (char)(0xf0 | (cp >> 18));
                d[o++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                d[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                d[o++] = (char)(0x80 | (cp & 0x3f));
            }
        }
    }
    struct tok *t = push(L, TK_STRING);
    if (!t) return lfail(L, "template too large");
    t->s = d;
    t->n = o;
    count_lines(L, L->pos, i);
    L->pos = i + 1;
    return 0;
}

static int lex_number(struct lexer *L)
{
    size_t i = L->pos;
    int isfloat = 0;
    char buf[128];
    size_t o = 0;
    while (i < L->n && ((L->s[i] >= '0' && L->s[i] <= '9') || L->s[i] == '_')) {
        if (L->s[i] != '_' && o < sizeof buf - 1) buf[o++] = L->s[i];
        i++;
    }
    /* "a.1.2" is two subscripts, not a float: jinja2 only reads a fraction when the
     * number does not follow a dot. */
    int after_dot = L->pos > 0 && L->s[L->pos - 1] == '.';
    if (!after_dot && i + 1 < L->n && L->s[i] == '.' && L->s[i + 1] >= '0' && L->s[i + 1] <= '9') {
        isfloat = 1;
        if (o < sizeof buf - 1) buf[o++] = L->s[i];
        i++;
        while (i < L->n && ((L->s[i] >= '0' && L->s[i] <= '9') || L->s[i] == '_')) {
            if (L->s[i] != '_' && o < sizeof buf - 1) buf[o++] = L->s[i];
            i++;
        }
    }
    if (!after_dot && i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
        size_t k = i + 1;
        if (k < L->n && (L->s[k] == '+' || L->s[k] == '-')) k++;
        if (k < L->n && L->s[k] >= '0' && L->s[k] <= '9') {
            isfloat = 1;
            while (i < k && o < sizeof buf - 1) buf[o++] = L->s[i++];
            while (i < L->n && L->s[i] >= '0' && L->s[i] <= '9') {
                if (o < sizeof buf - 1) buf[o++] = L->s[i];
                i++;
            }
        }
    }
    buf[o] = 0;
    if (o >= sizeof buf - 1) return lfail(L, "number literal too long");
    struct tok *t = push(L, isfloat ? TK_FLOAT : TK_INT);
    if (!t) return lfail(L, "template too large");
    if (isfloat) {
        t->f = strtod(buf, NULL);
    } else {
        errno = 0;
        unsigned long long v = strtoull(buf, NULL, 10);
        if (errno || v > INT64_MAX) return lfail(L, "integer literal too large");
        t->i = (int64_t)v;
    }
    L->pos = i;
    return 0;
}

/* Tokens inside {{ }} or {% %} up to and including the end tag. */
static int lex_tag(struct lexer *L, int is_block, int *line_starting)
{
    int depth = 0;
    for (;;) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            if (L->s[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->n) return lfail(L, is_block ? "missing '%}'" : "missing '}}'");
        const char *end = is_block ? "%}" : "}}";
        size_t p = L->pos;
        if (depth == 0) {
            char c = L->s[p];
            size_t at = (c == '-' || (c == '+' && is_block)) ? p + 1 : p;
            if (starts(L, at, end)) {
                struct tok *t = push(L, is_block ? TK_BLOCK_END : TK_VAR_END);
                if (!t) return lfail(L, "template too large");
                L->pos = at + 2;
                *line_starting = 0;
                if (c == '-') {
                    size_t q = L->pos;
                    while (L->pos < L->n && is_ws(L->s[L->pos])) L->pos++;
                    count_lines(L, q, L->pos);
                    *line_starting = L->pos > q && L->s[L->pos - 1] == '\n';
                } else if (is_block && c != '+' && L->pos < L->n && L->s[L->pos] == '\n') {
                    L->pos++;
                    L->line++;
                    *line_starting = 1;
                }
                return 0;
            }
        }
        char c = L->s[p];
        if (c == '\'' || c == '"') {
            if (lex_string(L, c)) return -1;
        } else if (c >= '0' && c <= '9') {
            if (lex_number(L)) return -1;
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t q = p;
            while (q < L->n &&
                   ((L->s[q] >= 'a' && L->s[q] <= 'z') || (L->s[q] >= 'A' && L->s[q] <= 'Z') ||
                    (L->s[q] >= '0' && L->s[q] <= '9') || L->s[q] == '_'))
                q++;
            struct tok *t = push(L, TK_NAME);
            if (!t) return lfail(L, "template too large");
            t->s = L->s + p;
            t->n = q - p;
            L->pos = q;
        } else {
            static const char *two[] = {"//", "**", "==", "!=", "<=", ">="};
            size_t k = 0;
            for (size_t m = 0; m < sizeof two / sizeof two[0]; m++)
                if (starts(L, p, two[m])) k = 2;
            if (!k && strchr("+-*/%~<>=()[]{},.:|;", c)) k = 1;
            if (!k || c == 0) {
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected character '%c'", c);
                return lfail(L, msg);
            }
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            struct tok *t = push(L, TK_OP);
            if (!t) return lfail(L, "template too large");
            t->s = L->s + p;
            t->n = k;
            L->pos = p + k;
        }
    }
}

/* {% raw %} ... {% endraw %}: the body is text, whatever it contains. */
static int lex_raw(struct lexer *L, int *line_starting)
{
    size_t i = L->pos;
    for (;;) {
        const char *hit = memmem(L->s + i, L->n - i, "{%", 2);
        if (!hit) return lfail(L, "missing '{% endraw %}'");
        size_t t = (size_t)(hit - L->s), k = t + 2;
        char ctrl = 0;
        if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) ctrl = L->s[k++];
        while (k < L->n && is_ws(L->s[k])) k++;
        if (!starts(L, k, "endraw")) {
            i = t + 2;
            continue;
        }
        k += 6;
        while (k < L->n && is_ws(L->s[k])) k++;
        char ectrl = 0;
        if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) ectrl = L->s[k++];
        if (!starts(L, k, "%}")) {
            i = t + 2;
            continue;
        }
        if (emit_data(L, L->pos, t, ctrl, 1, *line_starting)) return -1;
        count_lines(L, L->pos, k + 2);
        L->pos = k + 2;
        *line_starting = 0;
        if (ectrl == '-') {
            size_t q = L->pos;
            while (L->pos < L->n && is_ws(L->s[L->pos])) L->pos++;
            count_lines(L, q, L->pos);
            *line_starting = L->pos > q && L->s[L->pos - 1] == '\n';
        } else if (ectrl != '+' && L->pos < L->n && L->s[L->pos] == '\n') {
            L->pos++;
            L->line++;
            *line_starting = 1;
        }
        return 0;
    }
}

/* Is the block opened at `p` a {% raw %} tag? Sets *endp past its end tag. */
static int is_raw(struct lexer *L, size_t p, size_t *endp, char *ectrl)
{
    while (p < L->n && is_ws(L->s[p])) p++;
    if (!starts(L, p, "raw")) return 0;
    p += 3;
    while (p < L->n && is_ws(L->s[p])) p++;
    *ectrl = 0;
    if (p < L->n && (L->s[p] == '-' || L->s[p] == '+')) *ectrl = L->s[p++];
    if (!starts(L, p, "%}")) return 0;
    *endp = p + 2;
    return 1;
}

int tmpl_lex(struct tarena *a, const char *src, size_t len, struct tok **out, size_t *ntok,
             struct err *e)
{
    struct lexer L = {.a = a, .e = e, .line = 1};
    /* Normalize \r\n and \r to \n, then drop one trailing newline (keep_trailing_newline
     * is off in transformers' environment). */
    char *s = ta_alloc(a, len + 1);
    if (!s) return lfail(&L, "template too large");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    L.s = s;
    L.n = n;
    int line_starting = 1;
    while (L.pos < L.n) {
        const char *hit = NULL;
        for (size_t i = L.pos; i + 1 < L.n; i++) {
            if (L.s[i] == '{' && (L.s[i + 1] == '{' || L.s[i + 1] == '%' || L.s[i + 1] == '#')) {
                hit = L.s + i;
                break;
            }
        }
        if (!hit) {
            if (emit_data(&L, L.pos, L.n, 0, 0, 0)) return -1;
            count_lines(&L, L.pos, L.n);
            L.pos = L.n;
            break;
        }
        size_t t = (size_t)(hit - L.s), k = t + 2;
        char kind = hit[1], ctrl = 0;
        if (k < L.n && (L.s[k] == '-' || L.s[k] == '+')) ctrl = L.s[k++];
        if (emit_data(&L, L.pos, t, ctrl, kind != '{', line_starting)) return -1;
        count_lines(&L, L.pos, k);
        L.pos = k;
        if (kind == '#') {
            const char *ce = memmem(L.s + k, L.n - k, "#}", 2);
            if (!ce) return lfail(&L, "missing end of comment tag");
            size_t ct = (size_t)(ce - L.s);
            count_lines(&L, k, ct + 2);
            L.pos = ct + 2;
            line_starting = 0;
            if (ct > k && L.s[ct - 1] == '-') {
                size_t q = L.pos;
                while (L.pos < L.n && is_ws(L.s[L.pos])) L.pos++;
                count_lines(&L, q, L.pos);
                line_starting = L.pos > q && L.s[L.pos - 1] == '\n';
            } else if (!(ct > k && L.s[ct - 1] == '+') && L.pos < L.n && L.s[L.pos] == '\n') {
                L.pos++;
                L.line++;
                line_starting = 1;
            }
            continue;
        }
        size_t rend;
        char rctrl;
        if (kind == '%' && is_raw(&L, k, &rend, &rctrl)) {
            L.pos = rend;
            if (rctrl == '-') {
                while (L.pos < L.n && is_ws(L.s[L.pos])) L.pos++;
                line_starting = 0;
            } else if (rctrl != '+' && L.pos < L.n && L.s[L.pos] == '\n') {
                L.pos++;
                line_starting = 1;
            } else {
                line_starting = 0;
            }
            count_lines(&L, k, L.pos);
            if (lex_raw(&L, &line_starting)) return -1;
            continue;
        }
        if (!push(&L, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN))
            return lfail(&L, "template too large");
        if (lex_tag(&L, kind == '%', &line_starting)) return -1;
    }
    if (!push(&L, TK_EOF)) return lfail(&L, "template too large");
    *out = L.toks;
    *ntok = L.ntok;
    return 0;
}
