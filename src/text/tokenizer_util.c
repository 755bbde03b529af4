/* Buffers, UTF-8 and PCRE2 helpers shared by the tokenizer's stages (see tokenizer_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/tokenizer_impl.h"

void tok_buf_reserve(struct tok_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void tok_buf_put(struct tok_buf *b, const void *s, size_t n)
{
    tok_buf_reserve(b, n);
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void tok_buf_putc(struct tok_buf *b, char c)
{
    tok_buf_put(b, &c, 1);
}

void tok_buf_dispose(struct tok_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void tok_ids_push(struct tok_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->v = xrealloc(a->v, a->cap * sizeof(int32_t));
    }
    a->v[a->n++] = id;
}

void tok_pieces_push(struct tok_pieces *p, size_t off, size_t len, int first)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->v = xrealloc(p->v, p->cap * sizeof *p->v);
    }
    p->v[p->n].off = off;
    p->v[p->n].len = len;
    p->v[p->n].first = first;
    p->n++;
}

void tok_strs_push(struct tok_strs *l, const char *s, size_t len)
{
    if (l->n + 2 > l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->off = xrealloc(l->off, l->cap * sizeof(size_t));
    }
    if (l->n == 0) l->off[0] = 0;
    tok_buf_put(&l->buf, s, len);
    l->off[++l->n] = l->buf.len;
}

void tok_strs_clear(struct tok_strs *l)
{
    l->n = 0;
    l->buf.len = 0;
}

void tok_strs_dispose(struct tok_strs *l)
{
    tok_buf_dispose(&l->buf);
    free(l->off);
    memset(l, 0, sizeof *l);
}

/* ---- UTF-8 ---- */

/*
 * Classifies the sequence at s: > 0 valid of that length; 0 a valid but incomplete prefix
 * (all n bytes); < 0 invalid, -k = length of the maximal invalid subpart (Unicode's
 * "substitution of maximal subparts", which from_utf8_lossy follows).
 */
static int utf8_classify(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return -1;
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        unsigned d = s[i];
        if (d < lo || d > hi) return -i;
        lo = 0x80, hi = 0xBF;
    }
    return need;
}

int tok_utf8_len(const unsigned char *s, size_t n)
{
    if (n == 0) return 0;
    int k = utf8_classify(s, n);
    return k > 0 ? k : 0;
}

uint32_t tok_utf8_get(const unsigned char *s, size_t *len)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return ((c & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (c < 0xF0) {
        *len = 3;
        return ((c & 0x0F) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3F);
    }
    *len = 4;
    return ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3F);
}

int tok_utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tok_utf8_check(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_classify(u + i, n - i);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}

int tok_is_whitespace(uint32_t cp)
{
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Decodes s[0..n) into out; returns how many bytes were consumed before an incomplete tail. */
static size_t lossy_run(const unsigned char *s, size_t n, int final, struct tok_buf *out)
{
    size_t i = 0, run = 0; /* run: start of pending valid bytes, copied in one go */
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_classify(s + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        tok_buf_put(out, s + run, i - run);
        if (k == 0) {
            if (!final) return i;
            tok_buf_put(out, REPLACEMENT, 3);
            return n;
        }
        tok_buf_put(out, REPLACEMENT, 3);
        i += (size_t)-k;
        run = i;
    }
    tok_buf_put(out, s + run, i - run);
    return n;
}

void tok_utf8_lossy_feed(struct tok_utf8_lossy *u, const unsigned char *s, size_t n, int final,
                         struct tok_buf *out)
{
    static const unsigned char none = 0;
    if (!s) s = &none, n = 0;
    if (u->npend) {
        /* finish the pending sequence with at most 4 new bytes, then continue in s */
        unsigned char tmp[8];
        size_t take = n < 4 ? n : 4;
        memcpy(tmp, u->pend, (size_t)u->npend);
        memcpy(tmp + u->npend, s, take);
        size_t tn = (size_t)u->npend + take, i = 0;
        while (i < (size_t)u->npend) {
            int k = utf8_classify(tmp + i, tn - i);
            if (k > 0) {
                tok_buf_put(out, tmp + i, (size_t)k);
                i += (size_t)k;
            } else if (k < 0) {
                tok_buf_put(out, REPLACEMENT, 3);
                i += (size_t)-k;
            } else {
                /* still incomplete: everything left (pend tail + all of s) waits */
                if (final) {
                    tok_buf_put(out, REPLACEMENT, 3);
                    u->npend = 0;
                    return;
                }
                memmove(u->pend, tmp + i, tn - i);
                u->npend = (int)(tn - i);
                return;
            }
        }
        size_t used = i - (size_t)u->npend; /* bytes of s already consumed */
        u->npend = 0;
        s += used;
        n -= used;
    }
    size_t done = lossy_run(s, n, final, out);
    if (done < n) {
        memcpy(u->pend, s + done, n - done);
        u->npend = (int)(n - done);
    }
}

/* ---- regular expressions ---- */

static pcre2_code *compile(const char *pattern, size_t len, uint32_t extra, struct err *e)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | extra, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        err_set(e, "bad regex at offset %zu: %s", (size_t)eo, (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter on failure */
    return re;
}

pcre2_code *tok_regex_compile(const char *pattern, size_t len, struct err *e)
{
    return compile(pattern, len, PCRE2_UCP, e);
}

pcre2_code *tok_regex_literal(const char *s, size_t len, struct err *e)
{
    return compile(s, len, PCRE2_LITERAL, e);
}

void tok_matcher_init(struct tok_matcher *m)
{
    memset(m, 0, sizeof *m);
    m->md = pcre2_match_data_create(4, NULL);
    m->mctx = pcre2_match_context_create(NULL);
    m->jit = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, NULL);
    if (!m->md || !m->mctx) abort();
    if (m->jit) pcre2_jit_stack_assign(m->mctx, NULL, m->jit);
}

void tok_matcher_dispose(struct tok_matcher *m)
{
    pcre2_match_data_free(m->md);
    pcre2_match_context_free(m->mctx);
    if (m->jit) pcre2_jit_stack_free(m->jit);
    free(m->seg);
    memset(m, 0, sizeof *m);
}

int tok_regex_next(const pcre2_code *re, struct tok_matcher *m, const char *s, size_t n,
                   size_t from, size_t *ms, size_t *me)
{
    if (from > n) return 0;
    /* The text was validated once on entry; re-checking it per call would cost O(n) each. */
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, m->md, m->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    *ms = ov[0];
    *me = ov[1];
    if (*me < *ms) *me = *ms; /* \K in a lookahead can report end < start */
    return 1;
}
