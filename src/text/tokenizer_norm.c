/*
 * Normalizers of tokenizer.json (Sequence, Prepend, Replace, NFC/NFD/NFKC/NFKD, Lowercase,
 * Strip) and the Unicode algorithms behind them. The tables (full decompositions, combining
 * classes, primary composites, per-character lowercase) are generated from the Unicode
 * Character Database by scripts/gen_unidata.py; Hangul syllables are handled by arithmetic.
 * Lowercase maps each character on its own (no Final_Sigma context), as Rust's
 * char::to_lowercase does inside Hugging Face tokenizers.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/tokenizer_impl.h"
#include "text/tokenizer_unidata.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---- Unicode ---- */

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7 };
enum { LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

static int ccc_of(uint32_t cp)
{
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = NELEM(uni_ccc);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (uni_ccc[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < NELEM(uni_ccc) && uni_ccc[lo].cp == cp ? uni_ccc[lo].ccc : 0;
}

static long decomp_index(uint32_t cp)
{
    size_t lo = 0, hi = NELEM(uni_decomp);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (uni_decomp[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < NELEM(uni_decomp) && uni_decomp[lo].cp == cp ? (long)lo : -1;
}

static uint32_t compose_pair(uint32_t a, uint32_t b)
{
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = NELEM(uni_comp);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (uni_comp[mid].a < a || (uni_comp[mid].a == a && uni_comp[mid].b < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < NELEM(uni_comp) && uni_comp[lo].a == a && uni_comp[lo].b == b) return uni_comp[lo].c;
    return 0;
}

struct cpvec {
    uint32_t *v;
    size_t n, cap;
};

static void cp_push(struct cpvec *c, uint32_t cp)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 64;
        c->v = xrealloc(c->v, c->cap * sizeof(uint32_t));
    }
    c->v[c->n++] = cp;
}

static void decompose(uint32_t cp, int compat, struct cpvec *out)
{
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        cp_push(out, LBASE + s / NCOUNT);
        cp_push(out, VBASE + (s % NCOUNT) / TCOUNT);
        if (s % TCOUNT) cp_push(out, TBASE + s % TCOUNT);
        return;
    }
    long i = cp < 0xA0 ? -1 : decomp_index(cp);
    if (i < 0) {
        cp_push(out, cp);
        return;
    }
    uint32_t off = compat ? uni_decomp[i].koff : uni_decomp[i].coff;
    uint32_t len = compat ? uni_decomp[i].klen : uni_decomp[i].clen;
    for (uint32_t k = 0; k < len; k++) cp_push(out, uni_decomp_pool[off + k]);
}

void tok_unicode_normalize(enum tok_nf form, const char *s, size_t len, struct tok_buf *out)
{
    size_t i = 0;
    while (i < len && (unsigned char)s[i] < 0x80) i++;
    if (i == len) { /* ASCII is invariant under every normalization form */
        tok_buf_put(out, s, len);
        return;
    }
    int compat = form == TOK_NF_KC || form == TOK_NF_KD;
    int comp = form == TOK_NF_C || form == TOK_NF_KC;
    struct cpvec d = {0};
    for (i = 0; i < len;) {
        size_t l;
        uint32_t cp = tok_utf8_get((const unsigned char *)s + i, &l);
        i += l;
        decompose(cp, compat, &d);
    }
    /* canonical ordering: stable insertion sort of each run of non-starters by class */
    for (size_t k = 1; k < d.n; k++) {
        int c = ccc_of(d.v[k]);
        if (!c) continue;
        size_t j = k;
        uint32_t x = d.v[k];
        while (j > 0 && ccc_of(d.v[j - 1]) > c) {
            d.v[j] = d.v[j - 1];
            j--;
        }
        d.v[j] = x;
    }
    size_t n = d.n;
    if (comp && n) {
        size_t w = 0;
        long starter = -1;
        int last_ccc = 0;
        for (size_t k = 0; k < n; k++) {
            uint32_t c = d.v[k];
            int cc = ccc_of(c);
            if (starter >= 0) {
                int adjacent = (long)w - 1 == starter;
                int blocked = !adjacent && (last_ccc == 0 || last_ccc >= cc);
                if (!blocked) {
                    uint32_t x = compose_pair(d.v[starter], c);
                    if (x) {
                        d.v[starter] = x;
                        continue;
                    }
                }
            }
            if (cc == 0) starter = (long)w;
            last_ccc = cc;
            d.v[w++] = c;
        }
        n = w;
    }
    tok_buf_reserve(out, n * 4);
    for (size_t k = 0; k < n; k++) out->len += (size_t)tok_utf8_put(d.v[k], out->p + out->len);
    out->p[out->len] = 0;
    free(d.v);
}

void tok_unicode_lowercase(const char *s, size_t len, struct tok_buf *out)
{
    tok_buf_reserve(out, len * 2);
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            out->p[out->len++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
            i++;
            continue;
        }
        size_t l;
        uint32_t cp = tok_utf8_get((const unsigned char *)s + i, &l);
        i += l;
        size_t lo = 0, hi = NELEM(uni_lower);
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (uni_lower[mid].cp < cp)
                lo = mid + 1;
            else
                hi = mid;
        }
        tok_buf_reserve(out, 8); /* a lowercase form is at most two characters */
        if (lo < NELEM(uni_lower) && uni_lower[lo].cp == cp) {
            out->len += (size_t)tok_utf8_put(uni_lower[lo].l0, out->p + out->len);
            if (uni_lower[lo].l1)
                out->len += (size_t)tok_utf8_put(uni_lower[lo].l1, out->p + out->len);
        } else {
            memcpy(out->p + out->len, s + i - l, l);
            out->len += l;
        }
    }
    out->p[out->len] = 0;
}

/* ---- normalizer components ---- */

static char *dup_n(const char *s, size_t n)
{
    char *d = xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Reads {"String": s} or {"Regex": r} into a compiled pattern. */
static pcre2_code *parse_pattern(const cJSON *pat, const char *what, struct err *e)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    pcre2_code *re = NULL;
    if (cJSON_IsString(s))
        re = tok_regex_literal(s->valuestring, strlen(s->valuestring), e);
    else if (cJSON_IsString(r))
        re = tok_regex_compile(r->valuestring, strlen(r->valuestring), e);
    else
        err_set(e, "tokenizer.json: %s has no String or Regex pattern", what);
    if (!re) err_wrap(e, "tokenizer.json: %s pattern", what);
    return re;
}

int tok_norm_parse(const cJSON *j, struct tok_norm *n, struct err *e)
{
    memset(n, 0, sizeof *n);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return err_set(e, "tokenizer.json: normalizer without a type");
    const char *ty = t->valuestring;
    if (!strcmp(ty, "Sequence")) {
        n->kind = TOK_NORM_SEQUENCE;
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        int cnt = cJSON_GetArraySize(arr);
        n->subs = xcalloc((size_t)cnt + 1, sizeof *n->subs);
        const cJSON *it;
        cJSON_ArrayForEach(it, arr)
        {
            if (tok_norm_parse(it, &n->subs[n->nsubs], e) != 0) return -1;
            n->nsubs++;
        }
    } else if (!strcmp(ty, "Prepend")) {
        n->kind = TOK_NORM_PREPEND;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prepend");
        if (!cJSON_IsString(p)) return err_set(e, "tokenizer.json: Prepend without 'prepend'");
        n->slen = strlen(p->valuestring);
        n->str = dup_n(p->valuestring, n->slen);
    } else if (!strcmp(ty, "Replace")) {
        n->kind = TOK_NORM_REPLACE;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsString(c)) return err_set(e, "tokenizer.json: Replace without 'content'");
        n->slen = strlen(c->valuestring);
        n->str = dup_n(c->valuestring, n->slen);
        n->re = parse_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), "Replace", e);
        if (!n->re) return -1;
    } else if (!strcmp(ty, "NFC")) {
        n->kind = TOK_NORM_NFC;
    } else if (!strcmp(ty, "NFD")) {
        n->kind = TOK_NORM_NFD;
    } else if (!strcmp(ty, "NFKC")) {
        n->kind = TOK_NORM_NFKC;
    } else if (!strcmp(ty, "NFKD")) {
        n->kind = TOK_NORM_NFKD;
    } else if (!strcmp(ty, "Lowercase")) {
        n->kind = TOK_NORM_LOWERCASE;
    } else if (!strcmp(ty, "Strip")) {
        n->kind = TOK_NORM_STRIP;
        n->left = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_left"));
        n->right = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_right"));
    } else {
        return err_set(e, "tokenizer.json: normalizer type '%s' is not supported", ty);
    }
    return 0;
}

void tok_norm_dispose(struct tok_norm *n)
{
    for (int i = 0; i < n->nsubs; i++) tok_norm_dispose(&n->subs[i]);
    free(n->subs);
    free(n->str);
    if (n->re) pcre2_code_free(n->re);
    memset(n, 0, sizeof *n);
}

static int replace_all(const pcre2_code *re, const char *content, size_t clen, const char *s,
                       size_t len, struct tok_buf *out, struct tok_matcher *m)
{
    size_t pos = 0, from = 0, ms, me;
    for (;;) {
        int r = tok_regex_next(re, m, s, len, from, &ms, &me);
        if (r < 0) return -1;
        if (r == 0) break;
        if (me == ms) { /* empty matches replace nothing; step over one character */
            if (ms >= len) break;
            from = ms + (size_t)tok_utf8_len((const unsigned char *)s + ms, len - ms);
            continue;
        }
        tok_buf_put(out, s + pos, ms - pos);
        tok_buf_put(out, content, clen);
        pos = from = me;
    }
    tok_buf_put(out, s + pos, len - pos);
    return 0;
}

int tok_norm_apply(const struct tok_norm *n, const char *s, size_t len, struct tok_buf *out,
                   struct tok_matcher *m)
{
    switch (n->kind) {
    case TOK_NORM_SEQUENCE: {
        /* ping-pong between two buffers; the last stage appends to out */
        struct tok_buf a = {0}, b = {0};
        const char *cur = s;
        size_t curlen = len;
        int rc = 0;
        for (int i = 0; i < n->nsubs && rc == 0; i++) {
            struct tok_buf *dst = i == n->nsubs - 1 ? out : (i % 2 ? &b : &a);
            if (dst != out) dst->len = 0;
            rc = tok_norm_apply(&n->subs[i], cur, curlen, dst, m);
            if (dst != out) {
                cur = dst->p ? dst->p : "";
                curlen = dst->len;
            }
        }
        if (n->nsubs == 0) tok_buf_put(out, s, len);
        tok_buf_dispose(&a);
        tok_buf_dispose(&b);
        return rc;
    }
    case TOK_NORM_PREPEND:
        if (len) tok_buf_put(out, n->str, n->slen);
        tok_buf_put(out, s, len);
        return 0;
    case TOK_NORM_REPLACE:
        return replace_all(n->re, n->str, n->slen, s, len, out, m);
    case TOK_NORM_NFC:
        tok_unicode_normalize(TOK_NF_C, s, len, out);
        return 0;
    case TOK_NORM_NFD:
        tok_unicode_normalize(TOK_NF_D, s, len, out);
        return 0;
    case TOK_NORM_NFKC:
        tok_unicode_normalize(TOK_NF_KC, s, len, out);
        return 0;
    case TOK_NORM_NFKD:
        tok_unicode_normalize(TOK_NF_KD, s, len, out);
        return 0;
    case TOK_NORM_LOWERCASE:
        tok_unicode_lowercase(s, len, out);
        return 0;
    case TOK_NORM_STRIP: {
        size_t a = 0, b = len, l;
        if (n->left)
            while (a < b && tok_is_whitespace(tok_utf8_get((const unsigned char *)s + a, &l)))
                a += l;
        if (n->right)
            while (b > a) {
                size_t k = b - 1;
                while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
                if (!tok_is_whitespace(tok_utf8_get((const unsigned char *)s + k, &l))) break;
                b = k;
            }
        tok_buf_put(out, s + a, b - a);
        return 0;
    }
    }
    return 0;
}
