/*
 * GBNF (llama.cpp's grammar text) into a grammar: `name ::= alternatives` rules, "string"
 * literals with escapes, [character classes] with ranges and ^, `.` for any character,
 * ( groups ), and the quantifiers ? * + {m} {m,} {m,n}; # comments. A rule may span lines;
 * the next `name ::=` starts another. The start rule is root.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/grammar_impl.h"

struct gp {
    struct gb *b;
    const char *s;
    size_t n, i;
    int depth;
};

static int is_name(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static void skip_ws(struct gp *p)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->i++;
        } else {
            break;
        }
    }
}

/* At "name ::=": the name's length, else 0. */
static size_t rule_head(const struct gp *p)
{
    size_t j = p->i;
    while (j < p->n && is_name(p->s[j])) j++;
    size_t len = j - p->i;
    while (j < p->n && (p->s[j] == ' ' || p->s[j] == '\t')) j++;
    return len && p->n - j >= 3 && !memcmp(p->s + j, "::=", 3) ? len : 0;
}

static int32_t gp_alt(struct gp *p);

static int32_t gp_atom(struct gp *p)
{
    struct gb *b = p->b;
    char c = p->s[p->i];
    if (c == '"') {
        p->i++;
        char *buf = xmalloc(p->n - p->i + 1);
        size_t k = 0;
        while (p->i < p->n && p->s[p->i] != '"') {
            if (p->s[p->i] == '\\') {
                uint32_t cp;
                int l = gram_parse_escape(p->s + p->i + 1, p->n - p->i - 1, &cp, NULL, 0);
                if (l < 0) {
                    free(buf);
                    return gb_fail(b, "grammar: bad escape in a string at byte %zu", p->i);
                }
                p->i += 1 + (size_t)l;
                /* as UTF-8 */
                if (cp < 0x80)
                    buf[k++] = (char)cp;
                else if (cp < 0x800)
                    buf[k++] = (char)(0xC0 | cp >> 6), buf[k++] = (char)(0x80 | (cp & 63));
                else if (cp < 0x10000)
                    buf[k++] = (char)(0xE0 | cp >> 12), buf[k++] = (char)(0x80 | (cp >> 6 & 63)),
                    buf[k++] = (char)(0x80 | (cp & 63));
                else
                    buf[k++] = (char)(0xF0 | cp >> 18), buf[k++] = (char)(0x80 | (cp >> 12 & 63)),
                    buf[k++] = (char)(0x80 | (cp >> 6 & 63)), buf[k++] = (char)(0x80 | (cp & 63));
            } else {
                buf[k++] = p->s[p->i++];
            }
        }
        if (p->i >= p->n) {
            free(buf);
            return gb_fail(b, "grammar: unterminated string");
        }
        p->i++;
        int32_t x = gb_lit(b, buf, k);
        free(buf);
        return x;
    }
    if (c == '[') {
        struct cp_ranges cr = {0};
        int k = gram_parse_class(b, p->s + p->i + 1, p->n - p->i - 1, 0, &cr);
        int32_t x = k < 0 ? -1 : gb_cp_ranges(b, cr.r, cr.n);
        free(cr.r);
        p->i += 1 + (size_t)(k < 0 ? 0 : k);
        return x;
    }
    if (c == '.') {
        p->i++;
        uint32_t r[2] = {0, 0x10FFFF};
        return gb_cp_ranges(b, r, 1);
    }
    if (c == '(') {
        p->i++;
        if (++p->depth > 100) return gb_fail(b, "grammar: groups nested too deep");
        int32_t x = gp_alt(p);
        p->depth--;
        skip_ws(p);
        if (b->failed) return -1;
        if (p->i >= p->n || p->s[p->i] != ')')
            return gb_fail(b, "grammar: missing ')' at byte %zu", p->i);
        p->i++;
        return x;
    }
    if (is_name(c)) {
        size_t st = p->i;
        while (p->i < p->n && is_name(p->s[p->i])) p->i++;
        return GSYM_RULE(gb_rule_named(b, p->s + st, p->i - st));
    }
    return gb_fail(b, "grammar: unexpected '%c' at byte %zu", c, p->i);
}

static int gp_int(struct gp *p, int *v)
{
    size_t st = p->i;
    long x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && x <= 100000)
        x = x * 10 + (p->s[p->i++] - '0');
    *v = (int)x;
    return p->i > st;
}

static int32_t gp_seq(struct gp *p)
{
    struct gb *b = p->b;
    struct gb_list l = {0};
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n || b->failed) break;
        char c = p->s[p->i];
        if (c == '|' || c == ')' || rule_head(p)) break;
        int32_t x = gp_atom(p);
        if (b->failed) break;
        for (;;) {
            if (p->i >= p->n) break;
            char q = p->s[p->i];
            int lo, hi;
            if (q == '?')
                lo = 0, hi = 1, p->i++;
            else if (q == '*')
                lo = 0, hi = -1, p->i++;
            else if (q == '+')
                lo = 1, hi = -1, p->i++;
            else if (q == '{') {
                p->i++;
                skip_ws(p);
                if (!gp_int(p, &lo)) {
                    gb_fail(b, "grammar: bad repetition at byte %zu", p->i);
                    break;
                }
                skip_ws(p);
                hi = lo;
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    skip_ws(p);
                    if (!gp_int(p, &hi)) hi = -1;
                    skip_ws(p);
                }
                if (p->i >= p->n || p->s[p->i] != '}') {
                    gb_fail(b, "grammar: bad repetition at byte %zu", p->i);
                    break;
                }
                p->i++;
            } else
                break;
            x = gb_rep(b, x, lo, hi);
        }
        gb_list_push(&l, x);
    }
    return gb_list_seq(b, &l);
}

static int32_t gp_alt(struct gp *p)
{
    struct gb_list l = {0};
    for (;;) {
        int32_t x = gp_seq(p);
        if (p->b->failed) break;
        gb_list_push(&l, x);
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    return gb_list_alt(p->b, &l);
}

struct gram *gram_from_gbnf(const char *text, size_t len, struct err *e)
{
    struct gb b;
    gb_init(&b, e);
    struct gp p = {&b, text, len, 0, 0};
    for (;;) {
        skip_ws(&p);
        if (p.i >= p.n || b.failed) break;
        size_t nl = rule_head(&p);
        if (!nl) {
            gb_fail(&b, "grammar: expected 'name ::=' at byte %zu", p.i);
            break;
        }
        int r = gb_rule_named(&b, text + p.i, nl);
        if (b.rules[r].defined && b.rules[r].n_alts) {
            gb_fail(&b, "grammar: rule '%s' is defined twice", b.rules[r].name);
            break;
        }
        p.i += nl;
        while (p.s[p.i] != ':') p.i++; /* rule_head saw "::=" after blanks */
        p.i += 3;
        int32_t x = gp_alt(&p);
        if (b.failed) break;
        b.rules[r].defined = 1;
        /* the rule's own alternatives (a helper alternation is flattened) */
        const struct gb_rule *h = GSYM_IS_RULE(x) ? &b.rules[GSYM_ID(x)] : NULL;
        if (h && h->anon && GSYM_ID(x) != r) {
            for (int a = 0; a < b.rules[GSYM_ID(x)].n_alts; a++)
                gb_alt_add(&b, r, b.rules[GSYM_ID(x)].alts[a], b.rules[GSYM_ID(x)].alt_len[a]);
        } else {
            gb_alt_add(&b, r, &x, 1);
        }
        skip_ws(&p);
        if (p.i < p.n && p.s[p.i] == ')') {
            gb_fail(&b, "grammar: unbalanced ')' at byte %zu", p.i);
            break;
        }
    }
    int root = -1;
    for (int r = 0; r < b.n_rules && !b.failed; r++)
        if (b.rules[r].name && !strcmp(b.rules[r].name, "root")) root = r;
    if (!b.failed && root < 0) gb_fail(&b, "grammar: no 'root' rule");
    return gb_finish(&b, root);
}
