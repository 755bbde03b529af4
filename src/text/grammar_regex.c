/*
 * Regular expressions into grammars: the practical subset that structured-output requests
 * use. Literals (UTF-8), '.', classes with ranges, negation and \d \w \s \D \W \S, escapes
 * (\n \t \r \xHH \uHHHH and escaped punctuation), groups ( ) and (?: ), alternation, and
 * the quantifiers ? * + {m} {m,} {m,n} (a lazy '?' after them is accepted: it changes
 * nothing for a recognizer). The expression matches the whole output: a leading ^ and a
 * trailing $ are accepted and change nothing. Backreferences, lookaround and other
 * anchors are refused with an error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/grammar_impl.h"

struct rx {
    struct gb *b;
    const char *s;
    size_t n, i;
    int json; /* inside a JSON string: characters JSON escapes appear escaped */
    int depth;
    long nest; /* the repetition product of what was just parsed (see rx_rep_count) */
};

/* Nested bounded repetitions, (x{a,b}){c,d}, are ambiguous: the matcher keeps a stack for
 * each way of splitting the input between them, up to the product of their counts (a
 * pattern of 17 bytes, a{0,2} stacked seven times, ran past 20 s on 200 bytes). Each
 * repetition counts its bound plus one (? and * as 2, {m,} as m + 2); a product past
 * RX_NEST_MAX over two or more levels is refused. Measured (x86, one core, 200 bytes):
 * a{1,10}{1,10} (121) 1.1 ms, (a{1,30}){1,30} (961) 75 ms, and a sanitizer build is about
 * 100 times slower, which the fuzzer's 10 s bound must allow for 4 KB inputs. */
#define RX_NEST_MAX 128

static long rx_rep_count(int lo, int hi)
{
    return (hi >= 0 ? hi : lo + 1L) + 1;
}

static int32_t rx_alt(struct rx *p);

/* A code-point class as a symbol; in a JSON string without '"', '\' and controls. */
static int32_t rx_class_sym(struct rx *p, struct cp_ranges *c)
{
    if (p->json) {
        struct cp_ranges t = {0};
        for (int i = 0; i < c->n; i++) cp_ranges_add(&t, c->r[2 * i], c->r[2 * i + 1]);
        cp_ranges_norm(&t, 1); /* complement, add the forbidden, complement back */
        cp_ranges_add(&t, 0, 0x1F);
        cp_ranges_add(&t, '"', '"');
        cp_ranges_add(&t, '\\', '\\');
        cp_ranges_norm(&t, 1);
        free(c->r);
        *c = t;
    }
    return gb_cp_ranges(p->b, c->r, c->n);
}

static int32_t rx_char(struct rx *p, uint32_t cp)
{
    char buf[8];
    if (p->json && (cp < 0x20 || cp == '"' || cp == '\\')) {
        const char *esc = cp == '"'    ? "\\\""
                          : cp == '\\' ? "\\\\"
                          : cp == '\n' ? "\\n"
                          : cp == '\t' ? "\\t"
                          : cp == '\r' ? "\\r"
                                       : NULL;
        if (esc) return gb_lit(p->b, esc, strlen(esc));
        snprintf(buf, sizeof buf, "\\u%04x", (unsigned)cp);
        return gb_lit(p->b, buf, 6);
    }
    uint32_t r[2] = {cp, cp};
    return gb_cp_ranges(p->b, r, 1);
}

static int rx_int(struct rx *p, int *v)
{
    size_t st = p->i;
    long x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && x <= 100000)
        x = x * 10 + (p->s[p->i++] - '0');
    *v = (int)x;
    return p->i > st;
}

static int32_t rx_atom(struct rx *p)
{
    struct gb *b = p->b;
    char c = p->s[p->i];
    if (c == '(') {
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':')
                p->i += 2;
            else
                return gb_fail(b, "regex: lookaround and named groups are not supported (at %zu)",
                               p->i);
        }
        if (++p->depth > 100) return gb_fail(b, "regex: groups nested too deep");
        int32_t x = rx_alt(p);
        p->depth--;
        if (b->failed) return -1;
        if (p->i >= p->n || p->s[p->i] != ')') return gb_fail(b, "regex: missing ')'");
        p->i++;
        return x; /* p->nest: the group's */
    }
    p->nest = 1;
    if (c == '[') {
        struct cp_ranges cr = {0};
        int k = gram_parse_class(b, p->s + p->i + 1, p->n - p->i - 1, 1, &cr);
        if (k < 0) {
            free(cr.r);
            return -1;
        }
        p->i += 1 + (size_t)k;
        int32_t x = rx_class_sym(p, &cr);
        free(cr.r);
        return x;
    }
    if (c == '.') {
        p->i++;
        struct cp_ranges cr = {0};
        cp_ranges_add(&cr, '\n', '\n');
        cp_ranges_norm(&cr, 1);
        int32_t x = rx_class_sym(p, &cr);
        free(cr.r);
        return x;
    }
    if (c == '\\') {
        struct cp_ranges cr = {0};
        uint32_t cp;
        int k = gram_parse_escape(p->s + p->i + 1, p->n - p->i - 1, &cp, &cr, 1);
        if (k < 0) {
            free(cr.r);
            return gb_fail(b, "regex: unsupported escape at %zu", p->i);
        }
        p->i += 1 + (size_t)k;
        int32_t x = cp == 0xFFFFFFFFu ? rx_class_sym(p, &cr) : rx_char(p, cp);
        free(cr.r);
        return x;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return gb_fail(b, "regex: nothing to repeat at %zu", p->i);
    uint32_t cp;
    p->i += (size_t)gram_utf8(p->s + p->i, p->n - p->i, &cp);
    return rx_char(p, cp);
}

/* One more repetition over an operand of product *cur (refused past RX_NEST_MAX). */
static int rx_nest(struct rx *p, long *cur, int lo, int hi, size_t at)
{
    long k = rx_rep_count(lo, hi);
    if (*cur > 1 && *cur * k > RX_NEST_MAX) {
        gb_fail(p->b,
                "regex: nested repetitions at %zu allow more than %d ways to split the input "
                "(the product of their counts); write the repetition once (a{2,6} for "
                "(a{1,2}){2,3})",
                at, RX_NEST_MAX);
        return 0;
    }
    *cur = *cur * k > RX_NEST_MAX ? RX_NEST_MAX + 1 : *cur * k;
    return 1;
}

static int32_t rx_seq(struct rx *p)
{
    struct gb *b = p->b;
    struct gb_list l = {0};
    long nest = 1;
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')' && !b->failed) {
        char c = p->s[p->i];
        if (c == '^' && p->i == 0) {
            p->i++;
            continue;
        }
        if (c == '$' && p->i + 1 == p->n) {
            p->i++;
            continue;
        }
        if (c == '^' || c == '$') {
            gb_fail(b, "regex: anchors inside the expression are not supported");
            break;
        }
        int32_t x = rx_atom(p);
        if (b->failed) break;
        long cur = p->nest;
        size_t at = p->i;
        /* Stacked ?, * and + fold into one repetition of x: (x?)? is x?, (x+)+ is x+, any
         * other pair is x*. Applied one over another they would nest x ever deeper. */
        int plo = -1, phi = 0; /* the pending folded repetition; plo < 0: none */
        while (p->i < p->n && !b->failed) {
            char q = p->s[p->i];
            int lo, hi;
            size_t save = p->i;
            if (q == '?' || q == '*' || q == '+') {
                lo = q == '+', hi = q == '?' ? 1 : -1;
                p->i++;
                if (p->i < p->n && (p->s[p->i] == '?' || p->s[p->i] == '+'))
                    p->i++; /* lazy, possessive */
                if (plo < 0) {
                    plo = lo, phi = hi;
                } else {
                    plo = plo && lo;
                    phi = phi < 0 || hi < 0 ? -1 : 1;
                }
                continue;
            }
            if (plo >= 0) {
                if (!rx_nest(p, &cur, plo, phi, at)) break;
                x = gb_rep(b, x, plo, phi);
                plo = -1;
            }
            if (q == '{') {
                save = p->i++;
                if (!rx_int(p, &lo)) { /* a literal '{' */
                    p->i = save;
                    break;
                }
                hi = lo;
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    if (!rx_int(p, &hi)) hi = -1;
                }
                if (p->i >= p->n || p->s[p->i] != '}') {
                    gb_fail(b, "regex: bad repetition at %zu", save);
                    break;
                }
                p->i++;
            } else
                break;
            if (p->i < p->n && (p->s[p->i] == '?' || p->s[p->i] == '+'))
                p->i++; /* lazy, possessive */
            if (!rx_nest(p, &cur, lo, hi, save)) break;
            x = gb_rep(b, x, lo, hi);
        }
        if (plo >= 0 && !b->failed && rx_nest(p, &cur, plo, phi, at)) x = gb_rep(b, x, plo, phi);
        if (cur > nest) nest = cur;
        gb_list_push(&l, x);
    }
    p->nest = nest;
    return gb_list_seq(b, &l);
}

static int32_t rx_alt(struct rx *p)
{
    struct gb_list l = {0};
    long nest = 1;
    for (;;) {
        int32_t x = rx_seq(p);
        if (p->b->failed) break;
        if (p->nest > nest) nest = p->nest;
        gb_list_push(&l, x);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    p->nest = nest;
    return gb_list_alt(p->b, &l);
}

int32_t gram_regex_into(struct gb *b, const char *re, size_t n, int in_json_string)
{
    struct rx p = {b, re, n, 0, in_json_string, 0, 1};
    int32_t x = rx_alt(&p);
    if (!b->failed && p.i < n) return gb_fail(b, "regex: unbalanced ')' at %zu", p.i);
    return b->failed ? -1 : x;
}

struct gram *gram_from_regex(const char *re, size_t len, struct err *e)
{
    struct gb b;
    gb_init(&b, e);
    int32_t x = gram_regex_into(&b, re, len, 0);
    int root = gb_rule_new(&b, "root", 0);
    if (!b.failed) gb_alt_add(&b, root, &x, 1);
    return gb_finish(&b, root);
}
