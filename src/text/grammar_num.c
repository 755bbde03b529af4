/*
 * Numeric ranges of JSON Schema (minimum, maximum, exclusiveMinimum, exclusiveMaximum) as
 * regular expressions over the number's text, for grammar_json.c. Both are exact:
 *
 * - integers: digit by digit over the lengths between the bounds (bounds of 1e15 and more
 *   in magnitude are not enforced);
 * - numbers: written in plain decimal (no exponent) once a bound is given, so that the
 *   value can be compared with the bound digit by digit: the integer part against the
 *   bound's integer part (an integer range), and where they are equal the fraction against
 *   the bound's fraction (an automaton that is tight on the lower bound, the upper one or
 *   both, see frac()). A bound is read as the shortest decimal that gives back the same
 *   double (0.1 is 0.1), with at most 30 places; one that needs more is refused, and
 *   bounds of 1e15 and more in magnitude are not enforced, as for integers.
 *
 * The regex is at most a few KB: one alternative per length of the integer part (19 at
 * most) and one nesting level per fraction digit of a bound (30 at most).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "text/grammar_impl.h"

#define BIG 1e15

/* A growable string. */
struct sb {
    char *p;
    size_t n, cap;
};

static void put(struct sb *r, const char *s)
{
    size_t l = strlen(s);
    if (r->n + l + 1 > r->cap) {
        r->cap = (r->n + l + 1) * 2;
        r->p = xrealloc(r->p, r->cap);
    }
    memcpy(r->p + r->n, s, l + 1);
    r->n += l;
}

/* ---- integers ---- */

/* Equal-length digit strings a <= b: the numbers between them, digit by digit. */
static void same_len(struct sb *r, const char *a, const char *b, int n)
{
    char t[64];
    if (n == 0) return;
    if (n == 1) {
        snprintf(t, sizeof t, "[%c-%c]", a[0], b[0]);
        put(r, t);
        return;
    }
    if (a[0] == b[0]) {
        snprintf(t, sizeof t, "%c(", a[0]);
        put(r, t);
        same_len(r, a + 1, b + 1, n - 1);
        put(r, ")");
        return;
    }
    char nines[32], zeros[32];
    memset(nines, '9', (size_t)n - 1), memset(zeros, '0', (size_t)n - 1);
    snprintf(t, sizeof t, "(%c(", a[0]);
    put(r, t);
    same_len(r, a + 1, nines, n - 1);
    put(r, "))");
    if (a[0] + 1 <= b[0] - 1) {
        snprintf(t, sizeof t, "|[%c-%c][0-9]{%d}", a[0] + 1, b[0] - 1, n - 1);
        put(r, t);
    }
    snprintf(t, sizeof t, "|(%c(", b[0]);
    put(r, t);
    same_len(r, zeros, b + 1, n - 1);
    put(r, "))");
}

/* Non-negative integers lo..hi (hi < 0: unbounded) without leading zeros. */
static void nonneg(struct sb *r, long long lo, long long hi)
{
    put(r, "(");
    int first = 1;
    for (int len = 1; len <= 19; len++) {
        long long start = len == 1 ? 0 : 1, end = 9;
        for (int i = 1; i < len; i++) start *= 10, end = end * 10 + 9;
        if (hi >= 0 && start > hi) break;
        if (end < lo) continue;
        long long a = lo > start ? lo : start;
        if (hi < 0 && a == start && len > 1) { /* every number of this length and longer */
            char t[64];
            snprintf(t, sizeof t, "%s[1-9][0-9]{%d,}", first ? "" : "|", len - 1);
            put(r, t);
            first = 0;
            break;
        }
        long long z = hi >= 0 && hi < end ? hi : end;
        char sa[32], sz[32];
        snprintf(sa, sizeof sa, "%lld", a);
        snprintf(sz, sizeof sz, "%lld", z);
        if (!first) put(r, "|");
        put(r, "(");
        same_len(r, sa, sz, len);
        put(r, ")");
        first = 0;
    }
    put(r, ")");
}

static int int_range(struct sb *r, const cJSON *s, char *msg, size_t cap)
{
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    const cJSON *xmn = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum");
    const cJSON *xmx = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    int has_lo = 0, has_hi = 0;
    long long lo = 0, hi = 0;
    if (cJSON_IsNumber(mn) && fabs(mn->valuedouble) < BIG)
        has_lo = 1, lo = (long long)ceil(mn->valuedouble);
    if (cJSON_IsNumber(xmn) && fabs(xmn->valuedouble) < BIG) {
        long long v = (long long)floor(xmn->valuedouble) + 1;
        if (!has_lo || v > lo) lo = v;
        has_lo = 1;
    }
    if (cJSON_IsNumber(mx) && fabs(mx->valuedouble) < BIG)
        has_hi = 1, hi = (long long)floor(mx->valuedouble);
    if (cJSON_IsNumber(xmx) && fabs(xmx->valuedouble) < BIG) {
        long long v = (long long)ceil(xmx->valuedouble) - 1;
        if (!has_hi || v < hi) hi = v;
        has_hi = 1;
    }
    if (!has_lo && !has_hi) return 0;
    if (has_lo && has_hi && lo > hi) {
        snprintf(msg, cap, "integer range %lld..%lld is empty", lo, hi);
        return -1;
    }
    if (!has_lo) { /* ..hi */
        if (hi >= 0) {
            put(r, "-[1-9][0-9]*|");
            nonneg(r, 0, hi);
        } else {
            put(r, "-");
            nonneg(r, -hi, -1);
        }
    } else if (lo >= 0) {
        nonneg(r, lo, has_hi ? hi : -1);
    } else { /* lo < 0 */
        put(r, "-");
        nonneg(r, has_hi && hi < 0 ? -hi : 1, -lo);
        if (!has_hi || hi >= 0) {
            put(r, "|");
            nonneg(r, 0, has_hi ? hi : -1);
        }
    }
    return 1;
}

/* ---- numbers ---- */

/* A bound's magnitude as a decimal: integer part and fraction digits (no trailing zeros). */
struct dec {
    double v;
    long long ip;
    char fr[32];
    int incl;
};

/* 1: read; 0: not enforced (too large); -1: needs more than 30 places. */
static int dec_read(double v, int incl, struct dec *d)
{
    if (fabs(v) >= BIG) return 0;
    double m = fabs(v);
    char buf[64];
    int places = 0;
    for (; places <= 30; places++) {
        snprintf(buf, sizeof buf, "%.*f", places, m);
        if (strtod(buf, NULL) == m) break;
    }
    if (places > 30) return -1;
    d->v = v;
    d->incl = incl;
    char *dot = strchr(buf, '.');
    d->fr[0] = 0;
    if (dot) {
        *dot = 0;
        snprintf(d->fr, sizeof d->fr, "%s", dot + 1);
        size_t n = strlen(d->fr);
        while (n && d->fr[n - 1] == '0') d->fr[--n] = 0;
    }
    d->ip = atoll(buf);
    return 1;
}

/*
 * The fraction digits s after a point (s may be empty, i.e. zero), compared with the rest
 * of the bounds' fractions L and H (empty: zeros from here on) while the digits so far
 * equal theirs (tl: equal to the lower bound's, th: the upper's). Writes a group of
 * alternatives and returns 1, or 0 (nothing written) when no s fits. top: the first digit,
 * where an empty s is written without the point and a non-empty one after "\.".
 */
static int frac(struct sb *r, const char *L, const char *H, int tl, int th, int il, int ih, int top)
{
    if (!tl && !th) {
        put(r, top ? "(\\.[0-9]+)?" : "[0-9]*");
        return 1;
    }
    if (tl && !th && !*L) { /* s >= 0 (or > 0) */
        put(r,
            il ? (top ? "(\\.[0-9]+)?" : "[0-9]*") : (top ? "\\.0*[1-9][0-9]*" : "0*[1-9][0-9]*"));
        return 1;
    }
    if (th && !*H && (!tl || !*L)) { /* s <= 0: zeros only, when the bounds allow it */
        if (!ih || (tl && !il)) return 0;
        put(r, top ? "(\\.0+)?" : "0*");
        return 1;
    }
    /* the end of s here, and each next digit d */
    int end_ok = (!tl || (!*L && il)) && (!th || *H || ih);
    char l0 = tl ? (*L ? *L : '0') : '0', h0 = th ? (*H ? *H : '0') : '9';
    const char *L1 = *L ? L + 1 : L, *H1 = *H ? H + 1 : H;
    struct sb alts = {0};
    put(&alts, "");
    int n = 0;
    char t[32];
    if (l0 <= h0 && tl) { /* d == l0: still tight on the lower bound */
        struct sb sub = {0};
        put(&sub, "");
        if (frac(&sub, L1, H1, 1, th && l0 == h0, il, ih, 0)) {
            snprintf(t, sizeof t, "%s%c", n++ ? "|" : "", l0);
            put(&alts, t);
            put(&alts, sub.p);
        }
        free(sub.p);
    }
    char a = tl ? l0 + 1 : l0, z = th ? h0 - 1 : h0; /* free digits */
    if (a <= z) {
        snprintf(t, sizeof t, "%s[%c-%c][0-9]*", n++ ? "|" : "", a, z);
        put(&alts, t);
    }
    if (l0 <= h0 && th && !(tl && l0 == h0)) { /* d == h0: still tight on the upper bound */
        struct sb sub = {0};
        put(&sub, "");
        if (frac(&sub, L1, H1, 0, 1, il, ih, 0)) {
            snprintf(t, sizeof t, "%s%c", n++ ? "|" : "", h0);
            put(&alts, t);
            put(&alts, sub.p);
        }
        free(sub.p);
    }
    int any = n > 0 || end_ok;
    if (any) {
        if (top && n)
            put(r, "(\\.("), put(r, alts.p), put(r, end_ok ? "))?" : "))");
        else if (n)
            put(r, end_ok ? "(|" : "("), put(r, alts.p), put(r, ")");
        /* no digit may follow: s ends here, nothing to write */
    }
    free(alts.p);
    return any;
}

/* Non-negative decimals between a and b (NULL: unbounded); 0 when there are none. */
static int nonneg_dec(struct sb *r, const struct dec *a, const struct dec *b)
{
    struct sb out = {0};
    put(&out, "(");
    int n = 0;
    char t[48];
    if (b && a->ip == b->ip) {
        snprintf(t, sizeof t, "%lld", a->ip);
        struct sb f = {0};
        put(&f, "");
        if (frac(&f, a->fr, b->fr, 1, 1, a->incl, b->incl, 1)) put(&out, t), put(&out, f.p), n++;
        free(f.p);
    } else if (!b || a->ip < b->ip) {
        struct sb f = {0};
        put(&f, "");
        if (frac(&f, a->fr, "", 1, 0, a->incl, 1, 1)) {
            snprintf(t, sizeof t, "%lld", a->ip);
            put(&out, t), put(&out, f.p), n++;
        }
        f.n = 0;
        if (!b || a->ip + 1 <= b->ip - 1) {
            put(&out, n++ ? "|" : "");
            nonneg(&out, a->ip + 1, b ? b->ip - 1 : -1);
            put(&out, "(\\.[0-9]+)?");
        }
        if (b && frac(&f, "", b->fr, 0, 1, 1, b->incl, 1)) {
            snprintf(t, sizeof t, "%s%lld", n++ ? "|" : "", b->ip);
            put(&out, t), put(&out, f.p);
        }
        free(f.p);
    }
    put(&out, ")");
    if (n) put(r, out.p);
    free(out.p);
    return n > 0;
}

static int num_range(struct sb *r, const cJSON *s, char *msg, size_t cap)
{
    static const char *const keys[4] = {"minimum", "exclusiveMinimum", "maximum",
                                        "exclusiveMaximum"};
    struct dec lo = {0}, hi = {0}, d;
    int has_lo = 0, has_hi = 0;
    for (int k = 0; k < 4; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, keys[k]);
        if (!cJSON_IsNumber(x)) continue;
        int rc = dec_read(x->valuedouble, !(k & 1), &d);
        if (rc < 0) {
            snprintf(msg, cap, "'%s' %g needs more than 30 decimal places", keys[k],
                     x->valuedouble);
            return -1;
        }
        if (!rc) continue;
        if (k < 2 && (!has_lo || d.v > lo.v || (d.v == lo.v && !d.incl))) lo = d, has_lo = 1;
        if (k >= 2 && (!has_hi || d.v < hi.v || (d.v == hi.v && !d.incl))) hi = d, has_hi = 1;
    }
    if (!has_lo && !has_hi) return 0;
    if (has_lo && has_hi && (lo.v > hi.v || (lo.v == hi.v && !(lo.incl && hi.incl)))) {
        snprintf(msg, cap, "number range %g..%g is empty", lo.v, hi.v);
        return -1;
    }
    int n = 0;
    /* v >= 0: from max(lo, 0) to hi */
    struct dec zero = {0, 0, "", 1};
    if (!has_hi || hi.v >= 0) {
        const struct dec *a = has_lo && lo.v >= 0 ? &lo : &zero;
        n += nonneg_dec(r, a, has_hi ? &hi : NULL);
    }
    /* v < 0: "-" and the magnitude, above |hi| (or 0, excluded) up to |lo| */
    if (!has_lo || lo.v < 0) {
        struct dec above = has_hi && hi.v < 0 ? hi : (struct dec){0, 0, "", 0};
        struct sb neg = {0};
        put(&neg, "");
        if (nonneg_dec(&neg, &above, has_lo ? &lo : NULL)) {
            put(r, n++ ? "|-" : "-");
            put(r, neg.p);
        }
        free(neg.p);
    }
    if (!n) {
        snprintf(msg, cap, "number range %g..%g is empty", lo.v, hi.v);
        return -1;
    }
    return 1;
}

char *gram_range_regex(const cJSON *s, int integer, char *msg, size_t cap)
{
    struct sb r = {0};
    put(&r, "");
    int rc = integer ? int_range(&r, s, msg, cap) : num_range(&r, s, msg, cap);
    if (rc <= 0) {
        free(r.p);
        return NULL;
    }
    return r.p;
}
