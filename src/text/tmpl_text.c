/*
 * tmpl_text: values to text the way Python writes them: str() and repr() (['a', 'b'],
 * {'k': 1}, True, None, 1e-05, quote choice and escapes of repr), markupsafe's escape,
 * and json.dumps as transformers' tojson calls it (ensure_ascii=False, ", " / ": "
 * separators, "," when indenting, optional sort_keys / ensure_ascii).
 */
#include "text/tmpl_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- text ---- */

void tb_put(struct rt *rt, struct tbuf *b, const char *s, size_t n)
{
    if (!n) return;
    if (b->n + n > TMPL_MAX_OUTPUT)
        rt_fail(rt, "MemoryError: output exceeds %u bytes", TMPL_MAX_OUTPUT);
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n) nc *= 2;
        if (!b->p || !ta_grow_last(&rt->a, b->p, b->cap, nc)) {
            char *np = rt_alloc(rt, nc);
            if (b->n) memcpy(np, b->p, b->n);
            b->p = np;
        }
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void fmt_float(char *out, size_t cap, double f)
{
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    /* Shortest digits that round-trip, as Python's repr picks them. */
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    char digits[24];
    int nd = 0, neg = buf[0] == '-';
    const char *q = buf + neg;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int exp = atoi(q + 1);
    size_t o = 0;
    char res[64];
    if (neg) res[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++) res[o++] = i < nd ? digits[i] : '0';
            res[o++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++) res[o++] = digits[i];
            else
                res[o++] = '0';
        } else {
            res[o++] = '0';
            res[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) res[o++] = '0';
            for (int i = 0; i < nd; i++) res[o++] = digits[i];
        }
        res[o] = 0;
    } else {
        res[o++] = digits[0];
        if (nd > 1) {
            res[o++] = '.';
            for (int i = 1; i < nd; i++) res[o++] = digits[i];
        }
        snprintf(res + o, sizeof res - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    snprintf(out, cap, "%s", res);
}

static void tb_num(struct rt *rt, struct tbuf *b, struct tval v)
{
    char s[64];
    if (v.t == TV_BOOL) {
        tb_puts(rt, b, v.u.i ? "True" : "False");
        return;
    }
    if (v.t == TV_INT)
        snprintf(s, sizeof s, "%" PRId64, v.u.i);
    else
        fmt_float(s, sizeof s, v.u.f);
    tb_puts(rt, b, s);
}

/* Python's str.isprintable, approximated for the code points chat text contains. */
static int u_printable(uint32_t c)
{
    if (c < 0x20 || c == 0x7f) return 0;
    if (c >= 0x80 && c <= 0xa0) return 0;
    if (c == 0xad || c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
        (c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff ||
        (c >= 0xd800 && c <= 0xdfff) || (c >= 0xe000 && c <= 0xf8ff) ||
        (c >= 0xfff9 && c <= 0xfffb))
        return 0;
    return 1;
}

static void tb_repr_str(struct rt *rt, struct tbuf *b, const char *s, size_t n)
{
    int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    tb_put(rt, b, &q, 1);
    for (size_t i = 0; i < n;) {
        size_t cl;
        uint32_t c = u_decode(s + i, n - i, &cl);
        char e[16];
        if (c == (uint32_t)q || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            tb_put(rt, b, e, 2);
        } else if (c == '\n') {
            tb_puts(rt, b, "\\n");
        } else if (c == '\r') {
            tb_puts(rt, b, "\\r");
        } else if (c == '\t') {
            tb_puts(rt, b, "\\t");
        } else if (cl == 1 && c >= 0x80) {
            /* invalid UTF-8 byte: Python would not have it in a str; show it escaped */
            snprintf(e, sizeof e, "\\x%02x", c);
            tb_puts(rt, b, e);
        } else if (!u_printable(c)) {
            if (c < 0x100)
                snprintf(e, sizeof e, "\\x%02x", c);
            else if (c < 0x10000)
                snprintf(e, sizeof e, "\\u%04x", c);
            else
                snprintf(e, sizeof e, "\\U%08x", c);
            tb_puts(rt, b, e);
        } else {
            tb_put(rt, b, s + i, cl);
        }
        i += cl;
    }
    tb_put(rt, b, &q, 1);
}

static void enter(struct rt *rt)
{
    if (++rt->depth > TMPL_MAX_DEPTH) rt_fail(rt, "RecursionError: value nested too deeply");
}

static void tb_value(struct rt *rt, struct tbuf *b, struct tval v, int repr)
{
    switch (v.t) {
    case TV_UNDEF:
        if (repr) tb_puts(rt, b, "Undefined");
        return;
    case TV_NONE:
        tb_puts(rt, b, "None");
        return;
    case TV_BOOL:
    case TV_INT:
    case TV_FLOAT:
        tb_num(rt, b, v);
        return;
    case TV_STR:
        if (repr)
            tb_repr_str(rt, b, v.u.s, v.n);
        else
            tb_put(rt, b, v.u.s, v.n);
        return;
    case TV_LIST: {
        struct tlist *l = v.u.l;
        if (l->gen) {
            tb_puts(rt, b, "<generator object>");
            return;
        }
        enter(rt);
        tb_puts(rt, b, l->tuple ? "(" : "[");
        for (uint32_t i = 0; i < l->n; i++) {
            if (i) tb_puts(rt, b, ", ");
            tb_value(rt, b, l->v[i], 1);
        }
        if (l->tuple && l->n == 1) tb_puts(rt, b, ",");
        tb_puts(rt, b, l->tuple ? ")" : "]");
        rt->depth--;
        return;
    }
    case TV_DICT:
    case TV_NS: {
        enter(rt);
        tb_puts(rt, b, v.t == TV_NS ? "<Namespace {" : "{");
        for (uint32_t i = 0; i < v.u.d->n; i++) {
            if (i) tb_puts(rt, b, ", ");
            tb_value(rt, b, v.u.d->k[i], 1);
            tb_puts(rt, b, ": ");
            tb_value(rt, b, v.u.d->v[i], 1);
        }
        tb_puts(rt, b, v.t == TV_NS ? "}>" : "}");
        rt->depth--;
        return;
    }
    case TV_FUNC:
        tb_puts(rt, b, v.u.fn->kind == TFN_MACRO ? "<Macro '" : "<function '");
        tb_puts(rt, b, v.u.fn->name ? v.u.fn->name : "?");
        tb_puts(rt, b, "'>");
        return;
    case TV_LOOP:
        tb_puts(rt, b, "<LoopContext>");
        return;
    }
}

void tb_str(struct rt *rt, struct tbuf *b, struct tval v)
{
    tb_value(rt, b, v, 0);
}

void tb_repr(struct rt *rt, struct tbuf *b, struct tval v)
{
    tb_value(rt, b, v, 1);
}

struct tval tv_to_str(struct rt *rt, struct tval v)
{
    if (v.t == TV_STR) return v;
    struct tbuf b = {0};
    tb_str(rt, &b, v);
    return tv_sref(b.p ? b.p : "", b.n);
}

struct tval tv_escape(struct rt *rt, struct tval v)
{
    if (v.t == TV_STR && v.markup) return v;
    struct tval s = tv_to_str(rt, v);
    struct tbuf b = {0};
    size_t run = 0;
    for (uint32_t i = 0; i < s.n; i++) {
        char c = s.u.s[i];
        const char *r = c == '&'    ? "&amp;"
                        : c == '<'  ? "&lt;"
                        : c == '>'  ? "&gt;"
                        : c == '"'  ? "&#34;"
                        : c == '\'' ? "&#39;"
                                    : NULL;
        if (!r) {
            run++;
            continue;
        }
        tb_put(rt, &b, s.u.s + i - run, run);
        run = 0;
        tb_puts(rt, &b, r);
    }
    tb_put(rt, &b, s.u.s + s.n - run, run);
    struct tval out = tv_sref(b.p ? b.p : "", b.n);
    out.markup = 1;
    return out;
}

static void tb_json_str(struct rt *rt, struct tbuf *b, const char *s, size_t n)
{
    tb_puts(rt, b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            } else if (c >= 0x80 && rt->json_ascii) {
                /* ensure_ascii=True: \uXXXX, surrogate pairs above the BMP */
                tb_put(rt, b, s + i - run, run);
                run = 0;
                size_t cl;
                uint32_t cp = u_decode(s + i, n - i, &cl);
                char e2[16];
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(e2, sizeof e2, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                             0xdc00 + (cp & 0x3ff));
                } else {
                    snprintf(e2, sizeof e2, "\\u%04x", cp);
                }
                tb_puts(rt, b, e2);
                i += cl - 1;
                continue;
            }
        }
        if (esc) {
            tb_put(rt, b, s + i - run, run);
            run = 0;
            tb_puts(rt, b, esc);
        } else {
            run++;
        }
    }
    tb_put(rt, b, s + n - run, run);
    tb_puts(rt, b, "\"");
}

static void json_newline(struct rt *rt, struct tbuf *b, int indent, int level)
{
    tb_puts(rt, b, "\n");
    for (int i = 0; i < indent * level; i++) tb_put(rt, b, " ", 1);
}

void tb_json(struct rt *rt, struct tbuf *b, struct tval v, int indent, const char *isep,
             const char *ksep, int level)
{
    char s[64];
    switch (v.t) {
    case TV_NONE:
        tb_puts(rt, b, "null");
        return;
    case TV_BOOL:
        tb_puts(rt, b, v.u.i ? "true" : "false");
        return;
    case TV_INT:
        tb_num(rt, b, v);
        return;
    case TV_FLOAT:
        if (isnan(v.u.f))
            tb_puts(rt, b, "NaN");
        else if (isinf(v.u.f))
            tb_puts(rt, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            tb_num(rt, b, v);
        return;
    case TV_STR:
        tb_json_str(rt, b, v.u.s, v.n);
        return;
    case TV_LIST:
        if (!v.u.l->gen) {
            struct tlist *l = v.u.l;
            if (!l->n) {
                tb_puts(rt, b, "[]");
                return;
            }
            if (level > 100) rt_fail(rt, "ValueError: Circular reference detected");
            tb_puts(rt, b, "[");
            for (uint32_t i = 0; i < l->n; i++) {
                if (i) tb_puts(rt, b, isep);
                if (indent >= 0) json_newline(rt, b, indent, level + 1);
                tb_json(rt, b, l->v[i], indent, isep, ksep, level + 1);
            }
            if (indent >= 0) json_newline(rt, b, indent, level);
            tb_puts(rt, b, "]");
            return;
        }
        break;
    case TV_DICT: {
        struct tdict *d = v.u.d;
        if (!d->n) {
            tb_puts(rt, b, "{}");
            return;
        }
        if (level > 100) rt_fail(rt, "ValueError: Circular reference detected");
        uint32_t *order = rt_alloc(rt, (size_t)d->n * sizeof *order);
        for (uint32_t i = 0; i < d->n; i++) order[i] = i;
        if (rt->json_sort) /* sort_keys=True: insertion sort, dicts here are small */
            for (uint32_t i = 1; i < d->n; i++)
                for (uint32_t j = i; j > 0 && tv_cmp(rt, d->k[order[j]], d->k[order[j - 1]]) < 0;
                     j--) {
                    uint32_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        tb_puts(rt, b, "{");
        for (uint32_t oi = 0; oi < d->n; oi++) {
            uint32_t i = order[oi];
            if (oi) tb_puts(rt, b, isep);
            if (indent >= 0) json_newline(rt, b, indent, level + 1);
            struct tval k = d->k[i];
            if (k.t == TV_STR) {
                tb_json_str(rt, b, k.u.s, k.n);
            } else if (k.t == TV_NONE || k.t == TV_BOOL || k.t == TV_INT || k.t == TV_FLOAT) {
                struct tbuf kb = {0};
                tb_json(rt, &kb, k, -1, isep, ksep, level);
                tb_json_str(rt, b, kb.p, kb.n);
            } else {
                rt_fail(rt, "TypeError: keys must be str, int, float, bool or None, not %s",
                        tv_typename(k));
            }
            tb_puts(rt, b, ksep);
            tb_json(rt, b, d->v[i], indent, isep, ksep, level + 1);
        }
        if (indent >= 0) json_newline(rt, b, indent, level);
        tb_puts(rt, b, "}");
        return;
    }
    default:
        break;
    }
    snprintf(s, sizeof s, "%s", tv_typename(v));
    rt_fail(rt, "TypeError: Object of type %s is not JSON serializable", s);
}
