/*
 * The grammar builder the front ends share (rules, byte sets, literals, repetition,
 * UTF-8 code-point ranges) and its finishing into the compiled form: every referenced rule
 * defined, no left recursion that would grow the matcher's stacks without consuming a byte.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "text/grammar_impl.h"

static int compile_timeout_ms = GRAM_COMPILE_TIMEOUT_MS;

void gram_set_compile_timeout(int ms)
{
    __atomic_store_n(&compile_timeout_ms, ms < 0 ? 0 : ms, __ATOMIC_RELAXED);
}

int gram_compile_timeout(void)
{
    return __atomic_load_n(&compile_timeout_ms, __ATOMIC_RELAXED);
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void gb_init(struct gb *b, struct err *e)
{
    memset(b, 0, sizeof *b);
    b->e = e;
    b->timeout_ms = __atomic_load_n(&compile_timeout_ms, __ATOMIC_RELAXED);
    if (b->timeout_ms) b->deadline = mono() + 1e-3 * b->timeout_ms;
    b->cap_sets = 512;
    b->sets = xcalloc((size_t)b->cap_sets, sizeof *b->sets);
    for (int c = 0; c < 256; c++) b->sets[c].w[c >> 5] = 1u << (c & 31);
    b->n_sets = 256;
}

void gb_dispose(struct gb *b)
{
    for (int r = 0; r < b->n_rules; r++) {
        for (int a = 0; a < b->rules[r].n_alts; a++) free(b->rules[r].alts[a]);
        free(b->rules[r].alts);
        free(b->rules[r].alt_len);
        free(b->rules[r].name);
    }
    free(b->rules);
    free(b->sets);
    memset(b, 0, sizeof *b);
}

int gb_fail(struct gb *b, const char *fmt, ...)
{
    if (!b->failed && b->e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->e->msg, sizeof b->e->msg, fmt, ap);
        va_end(ap);
    }
    b->failed = 1;
    return -1;
}

int gb_rule_new(struct gb *b, const char *name, int anon)
{
    if (b->n_rules >= GB_MAX_RULES && !b->failed)
        gb_fail(b, "grammar too large (more than %d rules)", GB_MAX_RULES);
    if (b->n_rules == b->cap_rules) {
        b->cap_rules = b->cap_rules ? b->cap_rules * 2 : 64;
        b->rules = xrealloc(b->rules, sizeof *b->rules * (size_t)b->cap_rules);
    }
    struct gb_rule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->anon = anon;
    r->defined = 1;
    r->name = name ? xstrdup(name) : NULL;
    return b->n_rules++;
}

int gb_rule_named(struct gb *b, const char *name, size_t len)
{
    for (int r = 0; r < b->n_rules; r++)
        if (b->rules[r].name && strlen(b->rules[r].name) == len &&
            !memcmp(b->rules[r].name, name, len))
            return r;
    char *s = xmalloc(len + 1);
    memcpy(s, name, len);
    s[len] = 0;
    int r = gb_rule_new(b, s, 0);
    free(s);
    b->rules[r].defined = 0;
    return r;
}

void gb_alt_add(struct gb *b, int rule, const int32_t *syms, int n)
{
    b->n_symbols += n;
    if (b->n_symbols > GB_MAX_SYMBOLS) {
        gb_fail(b, "grammar too large (more than %d symbols)", GB_MAX_SYMBOLS);
        n = 0; /* failed: what is built is never used */
    }
    /* the clock once every 4096 symbols */
    if (b->deadline && !b->failed && b->n_symbols >> 12 != (b->n_symbols - n) >> 12 &&
        mono() > b->deadline) {
        gb_fail(b, "compiling took longer than %d ms (--grammar-compile-timeout)", b->timeout_ms);
        n = 0;
    }
    struct gb_rule *r = &b->rules[rule];
    r->alts = xrealloc(r->alts, sizeof *r->alts * (size_t)(r->n_alts + 1));
    r->alt_len = xrealloc(r->alt_len, sizeof *r->alt_len * (size_t)(r->n_alts + 1));
    r->alts[r->n_alts] = xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (n) memcpy(r->alts[r->n_alts], syms, sizeof(int32_t) * (size_t)n);
    r->alt_len[r->n_alts++] = n;
}

int32_t gb_set(struct gb *b, const struct gbset *s)
{
    int count = 0, one = -1;
    for (int c = 0; c < 256; c++)
        if (s->w[c >> 5] >> (c & 31) & 1) count++, one = c;
    if (count == 1) return GSYM_SET(one);
    for (int i = 256; i < b->n_sets; i++)
        if (!memcmp(&b->sets[i], s, sizeof *s)) return GSYM_SET(i);
    if (b->n_sets == b->cap_sets) {
        b->cap_sets *= 2;
        b->sets = xrealloc(b->sets, sizeof *b->sets * (size_t)b->cap_sets);
    }
    b->sets[b->n_sets] = *s;
    return GSYM_SET(b->n_sets++);
}

int32_t gb_byte(int c)
{
    return GSYM_SET(c & 255);
}

int32_t gb_range(struct gb *b, int lo, int hi)
{
    struct gbset s = {{0}};
    for (int c = lo; c <= hi; c++) s.w[c >> 5] |= 1u << (c & 31);
    return gb_set(b, &s);
}

int32_t gb_seq(struct gb *b, const int32_t *syms, int n)
{
    if (b->failed) return -1; /* a failed part (-1) is never used */
    if (n == 1) return syms[0];
    /* splice one-alternative helper rules: shorter stacks for the matcher */
    long cap = 0;
    for (int i = 0; i < n; i++) {
        const struct gb_rule *r = GSYM_IS_RULE(syms[i]) ? &b->rules[GSYM_ID(syms[i])] : NULL;
        cap += r && r->anon && r->n_alts == 1 ? r->alt_len[0] : 1;
    }
    if (cap > GB_MAX_SYMBOLS)
        return gb_fail(b, "grammar too large (more than %d symbols)", GB_MAX_SYMBOLS);
    int32_t *v = xmalloc(sizeof *v * (size_t)(cap ? cap : 1));
    int k = 0;
    for (int i = 0; i < n; i++) {
        const struct gb_rule *r = GSYM_IS_RULE(syms[i]) ? &b->rules[GSYM_ID(syms[i])] : NULL;
        if (r && r->anon && r->n_alts == 1) {
            memcpy(v + k, r->alts[0], sizeof *v * (size_t)r->alt_len[0]);
            k += r->alt_len[0];
        } else {
            v[k++] = syms[i];
        }
    }
    int rule = gb_rule_new(b, NULL, 1);
    gb_alt_add(b, rule, v, k);
    free(v);
    return GSYM_RULE(rule);
}

int32_t gb_lit(struct gb *b, const char *s, size_t n)
{
    int32_t *v = xmalloc(sizeof *v * (n ? n : 1));
    for (size_t i = 0; i < n; i++) v[i] = gb_byte((unsigned char)s[i]);
    int rule = gb_rule_new(b, NULL, 1);
    gb_alt_add(b, rule, v, (int)n);
    free(v);
    return GSYM_RULE(rule);
}

int32_t gb_empty(struct gb *b)
{
    int rule = gb_rule_new(b, NULL, 1);
    gb_alt_add(b, rule, NULL, 0);
    return GSYM_RULE(rule);
}

void gb_list_push(struct gb_list *l, int32_t x)
{
    if (l->n == l->cap)
        l->v = xrealloc(l->v, sizeof *l->v * (size_t)(l->cap = l->cap ? l->cap * 2 : 8));
    l->v[l->n++] = x;
}

int32_t gb_list_seq(struct gb *b, struct gb_list *l)
{
    int32_t r = b->failed ? -1 : l->n ? gb_seq(b, l->v, l->n) : gb_empty(b);
    free(l->v);
    *l = (struct gb_list){0};
    return r;
}

int32_t gb_list_alt(struct gb *b, struct gb_list *l)
{
    int32_t r = b->failed ? -1 : gb_alt(b, l->v, l->n);
    free(l->v);
    *l = (struct gb_list){0};
    return r;
}

/* The alternatives of x as a list: a helper alternation is flattened into its user. */
static void add_alts_of(struct gb *b, int rule, int32_t x)
{
    const struct gb_rule *r = GSYM_IS_RULE(x) ? &b->rules[GSYM_ID(x)] : NULL;
    if (r && r->anon && r->n_alts > 1 && GSYM_ID(x) != rule) {
        for (int a = 0; a < r->n_alts; a++) {
            r = &b->rules[GSYM_ID(x)]; /* gb_alt_add may move the rules */
            gb_alt_add(b, rule, r->alts[a], r->alt_len[a]);
        }
        return;
    }
    if (r && r->anon && r->n_alts == 1) {
        int n = r->alt_len[0];
        int32_t *v = xmalloc(sizeof *v * (size_t)(n ? n : 1));
        memcpy(v, r->alts[0], sizeof *v * (size_t)n);
        gb_alt_add(b, rule, v, n);
        free(v);
        return;
    }
    gb_alt_add(b, rule, &x, 1);
}

int32_t gb_alt(struct gb *b, const int32_t *syms, int n)
{
    if (b->failed) return -1; /* a failed part (-1) is never used */
    if (n == 1) return syms[0];
    int rule = gb_rule_new(b, NULL, 1);
    for (int i = 0; i < n; i++) add_alts_of(b, rule, syms[i]);
    return GSYM_RULE(rule);
}

int32_t gb_opt(struct gb *b, int32_t x)
{
    if (b->failed) return -1; /* a failed part (-1) is never used */
    int rule = gb_rule_new(b, NULL, 1);
    add_alts_of(b, rule, x);
    gb_alt_add(b, rule, NULL, 0);
    return GSYM_RULE(rule);
}

/* R ::= x R | (empty): the matcher calls R in tail position, so its stacks stay flat. */
int32_t gb_star(struct gb *b, int32_t x)
{
    if (b->failed) return -1; /* a failed part (-1) is never used */
    int rule = gb_rule_new(b, NULL, 0);
    int32_t self = GSYM_RULE(rule);
    int32_t pair[2] = {x, self};
    int32_t s = gb_seq(b, pair, 2);
    add_alts_of(b, rule, s);
    gb_alt_add(b, rule, NULL, 0);
    return self;
}

/* ?, * or + */
static int rep_simple(int lo, int hi)
{
    return (lo == 0 || lo == 1) && (hi == -1 || (lo == 0 && hi == 1));
}

int32_t gb_rep(struct gb *b, int32_t x, int lo, int hi)
{
    if (b->failed) return -1; /* a failed part (-1) is never used */
    if (hi >= 0 && hi < lo)
        return gb_fail(b, "repetition {%d,%d}: the maximum is below the minimum", lo, hi);
    if (lo > 10000 || hi > 10000) return gb_fail(b, "repetition count over 10000");
    /* ?, * or + of y?, y* or y+ is y?, y* or y+ (the least count the product of the two,
     * unbounded if either is): the same strings, and a matcher that does not hold one
     * stack per way of nesting the two (twenty stacked ones: a million stacks a byte) */
    if (rep_simple(lo, hi) && GSYM_IS_RULE(x) && b->rules[GSYM_ID(x)].is_rep) {
        const struct gb_rule *r = &b->rules[GSYM_ID(x)];
        return gb_rep(b, r->rep_of, r->rep_lo * lo, r->rep_hi < 0 || hi < 0 ? -1 : 1);
    }
    int32_t tail;
    if (hi < 0) {
        tail = gb_star(b, x);
    } else {
        /* x? nested: (x (x (...)?)?)? so that each count is reached one way */
        tail = gb_empty(b);
        for (int i = 0; i < hi - lo; i++) {
            int32_t pair[2] = {x, tail};
            tail = gb_opt(b, i ? gb_seq(b, pair, 2) : x);
        }
    }
    int32_t *v = xmalloc(sizeof *v * (size_t)(lo + 1));
    for (int i = 0; i < lo; i++) v[i] = x;
    v[lo] = tail;
    int32_t r = gb_seq(b, v, lo + 1);
    free(v);
    if (!b->failed && rep_simple(lo, hi) && GSYM_IS_RULE(r)) { /* a rule made here */
        struct gb_rule *rr = &b->rules[GSYM_ID(r)];
        rr->is_rep = 1;
        rr->rep_of = x;
        rr->rep_lo = lo;
        rr->rep_hi = hi;
    }
    return r;
}

/* ---- code points as UTF-8 ---- */

static int enc(uint32_t cp, unsigned char *o)
{
    if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 63));
    o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

/* Splits lo..hi (same encoded length) until each piece is a product of byte ranges. */
static void utf8_piece(struct gb *b, uint32_t lo, uint32_t hi, int32_t *out, int *n)
{
    static const uint32_t maxes[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= maxes[i] && hi > maxes[i]) {
            utf8_piece(b, lo, maxes[i], out, n);
            utf8_piece(b, maxes[i] + 1, hi, out, n);
            return;
        }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_piece(b, lo, lo | m, out, n);
                utf8_piece(b, (lo | m) + 1, hi, out, n);
                return;
            }
            if ((hi & m) != m) {
                utf8_piece(b, lo, (hi & ~m) - 1, out, n);
                utf8_piece(b, hi & ~m, hi, out, n);
                return;
            }
        }
    }
    unsigned char a[4], z[4];
    int len = enc(lo, a);
    enc(hi, z);
    int32_t v[4];
    for (int k = 0; k < len; k++) v[k] = gb_range(b, a[k], z[k]);
    if (*n < 256) out[(*n)++] = gb_seq(b, v, len);
}

int32_t gb_cp_ranges(struct gb *b, const uint32_t *r, int n_pairs)
{
    struct gbset ascii = {{0}};
    int32_t pieces[257];
    int n = 0, has_ascii = 0;
    for (int i = 0; i < n_pairs; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        for (; lo <= hi && lo < 0x80; lo++) ascii.w[lo >> 5] |= 1u << (lo & 31), has_ascii = 1;
        if (lo > hi) continue;
        /* no surrogates in UTF-8 */
        if (lo < 0xD800 && hi >= 0xD800) {
            utf8_piece(b, lo, 0xD7FF, pieces + 1, &n);
            lo = 0xE000;
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            lo = 0xE000;
        }
        if (lo <= hi) utf8_piece(b, lo, hi, pieces + 1, &n);
    }
    if (n >= 256) return gb_fail(b, "character class too complex");
    if (has_ascii) pieces[0] = gb_set(b, &ascii);
    int32_t *p = has_ascii ? pieces : pieces + 1;
    int k = n + has_ascii;
    if (k == 0) return gb_fail(b, "empty character class (matches nothing)");
    return gb_alt(b, p, k);
}

void cp_ranges_add(struct cp_ranges *c, uint32_t lo, uint32_t hi)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 16;
        c->r = xrealloc(c->r, sizeof *c->r * 2 * (size_t)c->cap);
    }
    c->r[2 * c->n] = lo;
    c->r[2 * c->n + 1] = hi;
    c->n++;
}

static int cmp_pair(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

void cp_ranges_norm(struct cp_ranges *c, int negate)
{
    if (c->n > 1) qsort(c->r, (size_t)c->n, 2 * sizeof *c->r, cmp_pair); /* r is NULL when empty */
    int k = 0;
    for (int i = 0; i < c->n; i++) {
        if (k && c->r[2 * i] <= c->r[2 * (k - 1) + 1] + 1) {
            if (c->r[2 * i + 1] > c->r[2 * (k - 1) + 1]) c->r[2 * (k - 1) + 1] = c->r[2 * i + 1];
        } else {
            c->r[2 * k] = c->r[2 * i];
            c->r[2 * k + 1] = c->r[2 * i + 1];
            k++;
        }
    }
    c->n = k;
    if (!negate) return;
    uint32_t *old = xmalloc(sizeof *old * 2 * (size_t)(k ? k : 1));
    if (k) memcpy(old, c->r, sizeof *old * 2 * (size_t)k);
    c->n = 0;
    uint32_t next = 0;
    for (int i = 0; i < k; i++) {
        if (old[2 * i] > next) cp_ranges_add(c, next, old[2 * i] - 1);
        next = old[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF) cp_ranges_add(c, next, 0x10FFFF);
    free(old);
}

int gram_utf8(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    int len = u[0] < 0x80 ? 1 : u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 1;
    if ((size_t)len > n) len = 1;
    uint32_t v = len == 1 ? u[0] : u[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *cp = u[0];
            return 1;
        }
        v = v << 6 | (u[i] & 63);
    }
    *cp = v;
    return len;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int gram_parse_escape(const char *s, size_t n, uint32_t *cp, struct cp_ranges *cls, int regex)
{
    if (n == 0) return -1;
    char c = s[0];
    if (cls && regex && strchr("dDwWsS", c)) {
        struct cp_ranges t = {0};
        char l = (char)(c | 0x20);
        if (l == 'd') cp_ranges_add(&t, '0', '9');
        if (l == 'w') {
            cp_ranges_add(&t, '0', '9');
            cp_ranges_add(&t, 'A', 'Z');
            cp_ranges_add(&t, 'a', 'z');
            cp_ranges_add(&t, '_', '_');
        }
        if (l == 's') {
            cp_ranges_add(&t, '\t', '\r');
            cp_ranges_add(&t, ' ', ' ');
        }
        cp_ranges_norm(&t, c != l);
        for (int i = 0; i < t.n; i++) cp_ranges_add(cls, t.r[2 * i], t.r[2 * i + 1]);
        free(t.r);
        *cp = 0xFFFFFFFFu;
        return 1;
    }
    int hexn = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' && !regex ? 8 : 0;
    if (hexn) {
        if (n < (size_t)hexn + 1) return -1;
        uint32_t v = 0;
        for (int i = 1; i <= hexn; i++) {
            int d = hexval(s[i]);
            if (d < 0) return -1;
            v = v * 16 + (uint32_t)d;
        }
        if (v > 0x10FFFF) return -1;
        *cp = v;
        return hexn + 1;
    }
    switch (c) {
    case 'n':
        *cp = '\n';
        return 1;
    case 't':
        *cp = '\t';
        return 1;
    case 'r':
        *cp = '\r';
        return 1;
    case 'f':
        *cp = '\f';
        return 1;
    case 'v':
        *cp = '\v';
        return 1;
    case '0':
        *cp = 0;
        return 1;
    }
    if ((unsigned char)c < 0x80 &&
        !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9'))) {
        *cp = (uint32_t)c;
        return 1;
    }
    return -1;
}

int gram_parse_class(struct gb *b, const char *s, size_t n, int regex, struct cp_ranges *out)
{
    size_t i = 0;
    int negate = 0;
    if (i < n && s[i] == '^') negate = 1, i++;
    int first = 1;
    while (i < n && (s[i] != ']' || (first && regex && 0))) {
        first = 0;
        uint32_t lo;
        if (s[i] == '\\') {
            int k = gram_parse_escape(s + i + 1, n - i - 1, &lo, out, regex);
            if (k < 0) return gb_fail(b, "bad escape in a character class");
            i += 1 + (size_t)k;
            if (lo == 0xFFFFFFFFu) continue; /* a class escape, added */
        } else {
            i += (size_t)gram_utf8(s + i, n - i, &lo);
        }
        uint32_t hi = lo;
        if (i + 1 < n && s[i] == '-' && s[i + 1] != ']') {
            i++;
            if (s[i] == '\\') {
                int k = gram_parse_escape(s + i + 1, n - i - 1, &hi, NULL, regex);
                if (k < 0) return gb_fail(b, "bad escape in a character class");
                i += 1 + (size_t)k;
            } else {
                i += (size_t)gram_utf8(s + i, n - i, &hi);
            }
            if (hi < lo) return gb_fail(b, "character class range out of order");
        }
        cp_ranges_add(out, lo, hi);
    }
    if (i >= n) return gb_fail(b, "unterminated character class");
    cp_ranges_norm(out, negate);
    return (int)i + 1;
}

/* ---- finishing ---- */

struct lr_state {
    const struct gb *b;
    int *index, *low, *stack, *on, *comp;
    int n_stack, next, n_comp;
};

/* Left-corner edges of rule r: references that may come before any byte is consumed.
 * tail: the reference ends its alternative (the matcher reuses the caller's frame). */
static int edges(const struct gb *b, const char *nullable, int r, int *to, char *tail, int cap)
{
    int k = 0;
    const struct gb_rule *ru = &b->rules[r];
    for (int a = 0; a < ru->n_alts; a++)
        for (int i = 0; i < ru->alt_len[a]; i++) {
            int32_t s = ru->alts[a][i];
            if (!GSYM_IS_RULE(s)) break;
            if (k < cap) to[k] = GSYM_ID(s), tail[k] = i == ru->alt_len[a] - 1, k++;
            if (!nullable[GSYM_ID(s)]) break;
        }
    return k;
}

static void tarjan(struct lr_state *t, const char *nullable, int v)
{
    t->index[v] = t->low[v] = t->next++;
    t->stack[t->n_stack++] = v;
    t->on[v] = 1;
    int to[64];
    char tail[64];
    int k = edges(t->b, nullable, v, to, tail, 64);
    for (int i = 0; i < k; i++) {
        int w = to[i];
        if (t->index[w] < 0) {
            tarjan(t, nullable, w);
            if (t->low[w] < t->low[v]) t->low[v] = t->low[w];
        } else if (t->on[w] && t->index[w] < t->low[v]) {
            t->low[v] = t->index[w];
        }
    }
    if (t->low[v] == t->index[v]) {
        int w;
        do {
            w = t->stack[--t->n_stack];
            t->on[w] = 0;
            t->comp[w] = t->n_comp;
        } while (w != v);
        t->n_comp++;
    }
}

struct gram *gb_finish(struct gb *b, int root)
{
    struct gram *g = NULL;
    if (b->failed) goto out;
    for (int r = 0; r < b->n_rules; r++)
        if (!b->rules[r].defined) {
            gb_fail(b, "rule '%s' is used but not defined", b->rules[r].name);
            goto out;
        }
    int n = b->n_rules;
    char *nullable = xcalloc((size_t)n, 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (int a = 0; a < b->rules[r].n_alts && !nullable[r]; a++) {
                int all = 1;
                for (int i = 0; i < b->rules[r].alt_len[a] && all; i++) {
                    int32_t s = b->rules[r].alts[a][i];
                    all = GSYM_IS_RULE(s) && nullable[GSYM_ID(s)];
                }
                if (all) nullable[r] = changed = 1;
            }
        }
    }
    struct lr_state t = {b,
                         xmalloc(sizeof(int) * (size_t)n),
                         xmalloc(sizeof(int) * (size_t)n),
                         xmalloc(sizeof(int) * (size_t)n),
                         xcalloc((size_t)n, sizeof(int)),
                         xmalloc(sizeof(int) * (size_t)n),
                         0,
                         0,
                         0};
    for (int r = 0; r < n; r++) t.index[r] = -1;
    for (int r = 0; r < n; r++)
        if (t.index[r] < 0) tarjan(&t, nullable, r);
    int bad = -1;
    for (int r = 0; r < n && bad < 0; r++) {
        int to[64];
        char tail[64];
        int k = edges(b, nullable, r, to, tail, 64);
        for (int i = 0; i < k; i++)
            if (!tail[i] && t.comp[to[i]] == t.comp[r]) bad = r;
    }
    free(t.index), free(t.low), free(t.stack), free(t.on), free(t.comp);
    free(nullable);
    if (bad >= 0) {
        gb_fail(b, "rule '%s' is left-recursive",
                b->rules[bad].name ? b->rules[bad].name : "(anonymous)");
        goto out;
    }
    g = xcalloc(1, sizeof *g);
    int n_alts = 0, n_syms = 0;
    for (int r = 0; r < n; r++) {
        n_alts += b->rules[r].n_alts;
        for (int a = 0; a < b->rules[r].n_alts; a++) n_syms += b->rules[r].alt_len[a] + 1;
    }
    g->syms = xmalloc(sizeof *g->syms * (size_t)(n_syms + 1));
    g->alt_pos = xmalloc(sizeof *g->alt_pos * (size_t)(n_alts + 1));
    g->rule_alt = xmalloc(sizeof *g->rule_alt * (size_t)(n + 1));
    int ai = 0, si = 0;
    for (int r = 0; r < n; r++) {
        g->rule_alt[r] = ai;
        for (int a = 0; a < b->rules[r].n_alts; a++) {
            g->alt_pos[ai++] = si;
            memcpy(g->syms + si, b->rules[r].alts[a],
                   sizeof(int32_t) * (size_t)b->rules[r].alt_len[a]);
            si += b->rules[r].alt_len[a];
            g->syms[si++] = GSYM_END;
        }
    }
    g->rule_alt[n] = ai;
    g->syms[si] = GSYM_END;
    g->n_syms = si;
    g->n_rules = n;
    g->sets = b->sets;
    g->n_sets = b->n_sets;
    b->sets = NULL;
    g->root = root;
    g->refs = 1;
    pthread_mutex_init(&g->mu, NULL);
out:
    gb_dispose(b);
    return g;
}

struct gram *gram_ref(struct gram *g)
{
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

void gram_unref(struct gram *g)
{
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    gram_cache_free(g->cache);
    free(g->pos_rule);
    free(g->follow);
    pthread_mutex_destroy(&g->mu);
    free(g->syms);
    free(g->alt_pos);
    free(g->rule_alt);
    free(g->sets);
    free(g);
}

int gram_n_rules(const struct gram *g)
{
    return g->n_rules;
}

struct gram *gram_from_choices(const char *const *s, const size_t *len, int n, struct err *e)
{
    if (n <= 0) return err_set(e, "the list of choices is empty"), NULL;
    struct gb b;
    gb_init(&b, e);
    int32_t *v = xmalloc(sizeof *v * (size_t)n);
    for (int i = 0; i < n; i++) v[i] = gb_lit(&b, s[i], len[i]);
    int root = gb_rule_new(&b, "root", 0);
    for (int i = 0; i < n; i++) gb_alt_add(&b, root, &v[i], 1);
    free(v);
    return gb_finish(&b, root);
}
