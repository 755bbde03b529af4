/*
 * Decoders of tokenizer.json (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
 * Sequence), run two ways:
 *
 * - one-shot (tok_decoder_run): the Hugging Face model, a list of token strings passed
 *   through each decoder in turn, then joined;
 * - streaming (tok_stream_*): the same chain as a pipeline of stages that hold back only
 *   what a later token could still change: an open run of byte tokens (ByteFallback), an
 *   incomplete UTF-8 sequence (ByteLevel), leading characters that Strip may still remove,
 *   a possible partial match of a Replace pattern. Everything else leaves at once.
 *
 * Before the first Fuse or ByteLevel stage the stages see whole tokens ("list mode");
 * after it they see one growing token in chunks ("fused mode"). A few combinations cannot
 * be decided before the end in fused mode (Strip with stop > 0, a regex Replace, ByteLevel
 * or ByteFallback after a Fuse); those stages hold their input until tok_stream_finish,
 * which keeps the output exact at the cost of latency.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"

static const char FFFD[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static int parse_one(const cJSON *j, struct tok_decoder *d, struct err *e)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return err_set(e, "tokenizer.json: decoder without a type");
    const char *ty = t->valuestring;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        cJSON_ArrayForEach(it, arr) if (parse_one(it, d, e) != 0) return -1;
        return 0;
    }
    d->v = xrealloc(d->v, (size_t)(d->n + 1) * sizeof *d->v);
    struct tok_dec *x = &d->v[d->n];
    memset(x, 0, sizeof *x);
    if (!strcmp(ty, "ByteLevel")) {
        x->kind = TOK_DEC_BYTELEVEL;
        tok_bytemap_init();
    } else if (!strcmp(ty, "ByteFallback")) {
        x->kind = TOK_DEC_BYTEFALLBACK;
    } else if (!strcmp(ty, "Fuse")) {
        x->kind = TOK_DEC_FUSE;
    } else if (!strcmp(ty, "Replace")) {
        x->kind = TOK_DEC_REPLACE;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsString(c))
            return err_set(e, "tokenizer.json: Replace decoder without content");
        x->content = xstrdup(c->valuestring);
        x->clen = strlen(x->content);
        if (cJSON_IsString(s) && s->valuestring[0]) {
            x->pat = xstrdup(s->valuestring);
            x->plen = strlen(x->pat);
        } else if (cJSON_IsString(r)) {
            x->re = tok_regex_compile(r->valuestring, strlen(r->valuestring), e);
            if (!x->re) return err_wrap(e, "tokenizer.json: Replace decoder pattern");
        } else {
            return err_set(e, "tokenizer.json: Replace decoder has no usable pattern");
        }
    } else if (!strcmp(ty, "Strip")) {
        x->kind = TOK_DEC_STRIP;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        size_t l = 0;
        if (!cJSON_IsString(c) || !c->valuestring[0] ||
            tok_utf8_len((const unsigned char *)c->valuestring, strlen(c->valuestring)) !=
                (int)strlen(c->valuestring))
            return err_set(e, "tokenizer.json: Strip decoder content must be one character");
        x->strip_cp = tok_utf8_get((const unsigned char *)c->valuestring, &l);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "start");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "stop");
        x->start = cJSON_IsNumber(st) && st->valueint > 0 ? st->valueint : 0;
        x->stop = cJSON_IsNumber(sp) && sp->valueint > 0 ? sp->valueint : 0;
    } else if (!strcmp(ty, "Metaspace")) {
        x->kind = TOK_DEC_METASPACE;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "replacement");
        const char *rs = cJSON_IsString(r) ? r->valuestring : "\xe2\x96\x81";
        size_t l;
        if (!rs[0] || tok_utf8_len((const unsigned char *)rs, strlen(rs)) != (int)strlen(rs))
            return err_set(e,
                           "tokenizer.json: Metaspace decoder replacement must be one character");
        x->repl_cp = tok_utf8_get((const unsigned char *)rs, &l);
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        x->prepend = 1;
        if (cJSON_IsString(ps))
            x->prepend = strcmp(ps->valuestring, "never") != 0;
        else if (cJSON_IsFalse(aps))
            x->prepend = 0;
    } else {
        return err_set(e, "tokenizer.json: decoder type '%s' is not supported", ty);
    }
    d->n++;
    return 0;
}

int tok_decoder_parse(const cJSON *j, struct tok_decoder *d, struct err *e)
{
    memset(d, 0, sizeof *d);
    if (!j || cJSON_IsNull(j)) return 0;
    d->present = 1;
    return parse_one(j, d, e);
}

void tok_decoder_dispose(struct tok_decoder *d)
{
    for (int i = 0; i < d->n; i++) {
        free(d->v[i].pat);
        free(d->v[i].content);
        if (d->v[i].re) pcre2_code_free(d->v[i].re);
    }
    free(d->v);
    memset(d, 0, sizeof *d);
}

/* ---- per-token operations shared by both modes ---- */

static void replace_token(const struct tok_dec *x, const char *s, size_t n, struct tok_buf *out)
{
    if (x->re) {
        struct tok_matcher m;
        tok_matcher_init(&m);
        size_t pos = 0, from = 0, ms, me;
        while (tok_regex_next(x->re, &m, s, n, from, &ms, &me) == 1) {
            if (me == ms) {
                if (ms >= n) break;
                from = ms + (size_t)tok_utf8_len((const unsigned char *)s + ms, n - ms);
                continue;
            }
            tok_buf_put(out, s + pos, ms - pos);
            tok_buf_put(out, x->content, x->clen);
            pos = from = me;
        }
        tok_buf_put(out, s + pos, n - pos);
        tok_matcher_dispose(&m);
        return;
    }
    size_t i = 0, run = 0;
    while (i + x->plen <= n) {
        if (!memcmp(s + i, x->pat, x->plen)) {
            tok_buf_put(out, s + run, i - run);
            tok_buf_put(out, x->content, x->clen);
            i += x->plen;
            run = i;
        } else {
            i++;
        }
    }
    tok_buf_put(out, s + run, n - run);
}

/* The byte of a "<0xXX>" token (uppercase or lowercase hex), or -1. */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Strip as Hugging Face does it: up to `start` leading and `stop` trailing content chars. */
static void strip_token(const struct tok_dec *x, const char *s, size_t n, struct tok_buf *out)
{
    size_t a = 0, b = n, l;
    for (int k = 0; k < x->start && a < n; k++) {
        if (tok_utf8_get((const unsigned char *)s + a, &l) != x->strip_cp) break;
        a += l;
    }
    for (int k = 0; k < x->stop && b > 0; k++) {
        size_t p = b - 1;
        while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
        if (tok_utf8_get((const unsigned char *)s + p, &l) != x->strip_cp) break;
        b = p;
    }
    if (b > a) tok_buf_put(out, s + a, b - a);
}

static void metaspace_token(const struct tok_dec *x, int first, const char *s, size_t n,
                            struct tok_buf *out)
{
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t cp = tok_utf8_get((const unsigned char *)s + i, &l);
        if (cp == x->repl_cp) {
            if (!(first && x->prepend)) tok_buf_putc(out, ' ');
        } else {
            tok_buf_put(out, s + i, l);
        }
        i += l;
    }
}

/* Bytes of a token for the ByteLevel decoder: mapped back when every char is in the map. */
static void bytelevel_bytes(const char *s, size_t n, struct tok_buf *out)
{
    size_t start = out->len;
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t cp = tok_utf8_get((const unsigned char *)s + i, &l);
        if (cp >= 324 || tok_cp_to_byte[cp] < 0) {
            out->len = start;
            tok_buf_put(out, s, n);
            return;
        }
        tok_buf_putc(out, (char)tok_cp_to_byte[cp]);
        i += l;
    }
}

/* ---- one-shot ---- */

void tok_decoder_run(const struct tok_decoder *d, const struct tok_strs *in, struct tok_buf *out)
{
    if (!d->present) {
        for (size_t i = 0; i < in->n; i++) {
            if (i) tok_buf_putc(out, ' ');
            tok_buf_put(out, in->buf.p + in->off[i], in->off[i + 1] - in->off[i]);
        }
        return;
    }
    struct tok_strs a = {0}, b = {0};
    const struct tok_strs *cur = in;
    struct tok_buf t = {0}, run = {0};
    for (int k = 0; k < d->n; k++) {
        const struct tok_dec *x = &d->v[k];
        struct tok_strs *nx = cur == &a ? &b : &a;
        tok_strs_clear(nx);
        size_t n = cur->n;
        switch (x->kind) {
        case TOK_DEC_BYTELEVEL: {
            t.len = 0;
            for (size_t i = 0; i < n; i++)
                bytelevel_bytes(cur->buf.p + cur->off[i], cur->off[i + 1] - cur->off[i], &t);
            struct tok_utf8_lossy u = {{0}, 0};
            run.len = 0;
            tok_utf8_lossy_feed(&u, (const unsigned char *)t.p, t.len, 1, &run);
            tok_strs_push(nx, run.p, run.len);
            break;
        }
        case TOK_DEC_FUSE:
            tok_strs_push(nx, cur->buf.p, cur->n ? cur->off[n] : 0);
            break;
        case TOK_DEC_BYTEFALLBACK:
            run.len = 0;
            for (size_t i = 0; i <= n; i++) {
                const char *s = i < n ? cur->buf.p + cur->off[i] : NULL;
                size_t l = i < n ? cur->off[i + 1] - cur->off[i] : 0;
                int byte = i < n ? byte_token(s, l) : -1;
                if (byte >= 0) {
                    tok_buf_putc(&run, (char)byte);
                    continue;
                }
                if (run.len) { /* a run of bytes: its text if valid UTF-8, else one U+FFFD each */
                    if (tok_utf8_check(run.p, run.len) == run.len)
                        tok_strs_push(nx, run.p, run.len);
                    else
                        for (size_t q = 0; q < run.len; q++) tok_strs_push(nx, FFFD, 3);
                    run.len = 0;
                }
                if (i < n) tok_strs_push(nx, s, l);
            }
            break;
        default:
            for (size_t i = 0; i < n; i++) {
                const char *s = cur->buf.p + cur->off[i];
                size_t l = cur->off[i + 1] - cur->off[i];
                t.len = 0;
                if (x->kind == TOK_DEC_REPLACE)
                    replace_token(x, s, l, &t);
                else if (x->kind == TOK_DEC_STRIP)
                    strip_token(x, s, l, &t);
                else
                    metaspace_token(x, i == 0, s, l, &t);
                tok_strs_push(nx, t.p, t.len);
            }
        }
        cur = nx;
    }
    if (cur->n) tok_buf_put(out, cur->buf.p, cur->off[cur->n]);
    tok_strs_dispose(&a);
    tok_strs_dispose(&b);
    tok_buf_dispose(&t);
    tok_buf_dispose(&run);
}

/* ---- streaming ---- */

struct stage {
    int fused;    /* input is chunks of one growing token */
    int hold_all; /* fused mode, not decidable before the end: keep everything */
    size_t count; /* tokens seen (list mode) or leading chars examined (fused Strip) */
    struct tok_buf hold;
    struct tok_utf8_lossy lossy;
};

struct tok_stream {
    const struct tok *t;
    int skip_special;
    struct stage *st; /* one per decoder; st[n] is unused */
    size_t ntok;      /* tokens that reached the sink (for the " " join without decoder) */
    struct tok_buf out;
    struct tok_buf tmp;
};

static void emit(struct tok_stream *s, int k, const char *p, size_t n);

static void emit_run(struct tok_stream *s, int k, struct stage *g)
{
    if (!g->hold.len) return;
    struct tok_buf r = g->hold;
    memset(&g->hold, 0, sizeof g->hold);
    if (tok_utf8_check(r.p, r.len) == r.len)
        emit(s, k + 1, r.p, r.len);
    else
        for (size_t q = 0; q < r.len; q++) emit(s, k + 1, FFFD, 3);
    r.len = 0;
    g->hold = r; /* keep the allocation */
}

/* Passes p[0..n) into stage k (k == number of decoders: the output). */
static void emit(struct tok_stream *s, int k, const char *p, size_t n)
{
    const struct tok_decoder *d = &s->t->dec;
    if (k >= d->n) {
        if (!d->present && s->ntok++) tok_buf_putc(&s->out, ' ');
        tok_buf_put(&s->out, p, n);
        return;
    }
    const struct tok_dec *x = &d->v[k];
    struct stage *g = &s->st[k];
    if (g->hold_all) {
        tok_buf_put(&g->hold, p, n);
        return;
    }
    struct tok_buf b = {0};
    switch (x->kind) {
    case TOK_DEC_BYTELEVEL:
        bytelevel_bytes(p, n, &b);
        {
            struct tok_buf txt = {0};
            tok_utf8_lossy_feed(&g->lossy, (const unsigned char *)b.p, b.len, 0, &txt);
            if (txt.len) emit(s, k + 1, txt.p, txt.len);
            tok_buf_dispose(&txt);
        }
        break;
    case TOK_DEC_FUSE:
        if (n || !g->fused) emit(s, k + 1, p, n);
        break;
    case TOK_DEC_BYTEFALLBACK: {
        int byte = byte_token(p, n);
        if (byte >= 0) {
            tok_buf_putc(&g->hold, (char)byte);
            break;
        }
        emit_run(s, k, g);
        emit(s, k + 1, p, n);
        break;
    }
    case TOK_DEC_REPLACE:
        if (!g->fused) {
            replace_token(x, p, n, &b);
            emit(s, k + 1, b.p ? b.p : "", b.len);
            break;
        }
        /* literal pattern over a growing token: keep a tail that may begin a match */
        tok_buf_put(&g->hold, p, n);
        {
            const char *h = g->hold.p;
            size_t hl = g->hold.len, i = 0, run = 0;
            while (i < hl) {
                size_t left = hl - i;
                if (left >= x->plen && !memcmp(h + i, x->pat, x->plen)) {
                    tok_buf_put(&b, h + run, i - run);
                    tok_buf_put(&b, x->content, x->clen);
                    i += x->plen;
                    run = i;
                } else if (left < x->plen && !memcmp(h + i, x->pat, left)) {
                    break;
                } else {
                    i++;
                }
            }
            tok_buf_put(&b, h + run, i - run);
            memmove(g->hold.p, h + i, hl - i);
            g->hold.len = hl - i;
            if (b.len) emit(s, k + 1, b.p, b.len);
        }
        break;
    case TOK_DEC_STRIP:
        if (!g->fused) {
            strip_token(x, p, n, &b);
            emit(s, k + 1, b.p ? b.p : "", b.len);
            break;
        }
        /* fused, stop == 0: only the first `start` chars of the whole text may go */
        {
            size_t a = 0, l;
            while (g->count < (size_t)x->start && a < n) {
                if (tok_utf8_get((const unsigned char *)p + a, &l) != x->strip_cp) {
                    g->count = (size_t)x->start;
                    break;
                }
                a += l;
                g->count++;
            }
            if (a < n) {
                g->count = (size_t)x->start;
                emit(s, k + 1, p + a, n - a);
            }
        }
        break;
    case TOK_DEC_METASPACE:
        metaspace_token(x, g->fused || g->count == 0, p, n, &b);
        g->count++;
        if (b.len || !g->fused) emit(s, k + 1, b.p ? b.p : "", b.len);
        break;
    }
    tok_buf_dispose(&b);
}

struct tok_stream *tok_stream_create(const struct tok *t, int skip_special)
{
    struct tok_stream *s = xcalloc(1, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    int n = t->dec.n;
    s->st = xcalloc((size_t)n + 1, sizeof *s->st);
    int fused = 0;
    for (int k = 0; k < n; k++) {
        const struct tok_dec *x = &t->dec.v[k];
        s->st[k].fused = fused;
        if (fused)
            s->st[k].hold_all = x->kind == TOK_DEC_BYTELEVEL || x->kind == TOK_DEC_BYTEFALLBACK ||
                                (x->kind == TOK_DEC_STRIP && x->stop > 0) ||
                                (x->kind == TOK_DEC_REPLACE && x->re);
        if (x->kind == TOK_DEC_FUSE || x->kind == TOK_DEC_BYTELEVEL) fused = 1;
    }
    return s;
}

void tok_stream_destroy(struct tok_stream *s)
{
    if (!s) return;
    for (int k = 0; k < s->t->dec.n; k++) tok_buf_dispose(&s->st[k].hold);
    free(s->st);
    tok_buf_dispose(&s->out);
    tok_buf_dispose(&s->tmp);
    free(s);
}

static char *take_out(struct tok_stream *s, size_t *len)
{
    if (len) *len = s->out.len;
    char *r = xmalloc(s->out.len + 1);
    if (s->out.len) memcpy(r, s->out.p, s->out.len);
    r[s->out.len] = 0;
    s->out.len = 0;
    return r;
}

char *tok_stream_push(struct tok_stream *s, int32_t id)
{
    return tok_stream_push_len(s, id, NULL);
}

char *tok_stream_finish(struct tok_stream *s)
{
    return tok_stream_finish_len(s, NULL);
}

char *tok_stream_push_len(struct tok_stream *s, int32_t id, size_t *len)
{
    const struct tok *t = s->t;
    if (id >= 0 && id < t->nids && t->id2tok[id] && !(s->skip_special && t->is_special[id]))
        emit(s, 0, t->id2tok[id], t->id2len[id]);
    return take_out(s, len);
}

char *tok_stream_finish_len(struct tok_stream *s, size_t *len)
{
    const struct tok_decoder *d = &s->t->dec;
    for (int k = 0; k < d->n; k++) {
        const struct tok_dec *x = &d->v[k];
        struct stage *g = &s->st[k];
        struct tok_buf b = {0};
        if (g->hold_all) {
            /* the whole fused token is here now: run the one-token decoder on it */
            struct tok_buf h = g->hold;
            memset(&g->hold, 0, sizeof g->hold);
            g->hold_all = 0;
            if (x->kind == TOK_DEC_BYTELEVEL) {
                struct tok_buf bytes = {0};
                bytelevel_bytes(h.p ? h.p : "", h.len, &bytes);
                struct tok_utf8_lossy u = {{0}, 0};
                tok_utf8_lossy_feed(&u, (const unsigned char *)bytes.p, bytes.len, 1, &b);
                tok_buf_dispose(&bytes);
            } else if (x->kind == TOK_DEC_BYTEFALLBACK) {
                int byte = byte_token(h.p, h.len);
                if (byte < 0)
                    tok_buf_put(&b, h.p, h.len);
                else if (byte < 0x80)
                    tok_buf_putc(&b, (char)byte);
                else
                    tok_buf_put(&b, FFFD, 3);
            } else if (x->kind == TOK_DEC_STRIP) {
                strip_token(x, h.p ? h.p : "", h.len, &b);
            } else {
                replace_token(x, h.p ? h.p : "", h.len, &b);
            }
            tok_buf_dispose(&h);
            if (b.len) emit(s, k + 1, b.p, b.len);
        } else if (x->kind == TOK_DEC_BYTELEVEL) {
            tok_utf8_lossy_feed(&g->lossy, NULL, 0, 1, &b);
            if (b.len) emit(s, k + 1, b.p, b.len);
        } else if (x->kind == TOK_DEC_BYTEFALLBACK) {
            emit_run(s, k, g);
        } else if (x->kind == TOK_DEC_REPLACE && g->fused && g->hold.len) {
            emit(s, k + 1, g->hold.p, g->hold.len);
            g->hold.len = 0;
        }
        tok_buf_dispose(&b);
    }
    return take_out(s, len);
}

/* ---- the bytes of one token ---- */

int tok_token_bytes(const struct tok *t, int32_t id, char *out, size_t cap)
{
    if (id < 0 || id >= t->nids || !t->id2tok[id]) return -1;
    const struct tok_decoder *d = &t->dec;
    struct tok_buf a = {0}, b = {0};
    tok_buf_put(&a, t->id2tok[id], t->id2len[id]);
    int is_byte = 0;
    for (int k = 0; d->present && k < d->n; k++) {
        const struct tok_dec *x = &d->v[k];
        b.len = 0;
        switch (x->kind) {
        case TOK_DEC_BYTELEVEL:
            bytelevel_bytes(a.p, a.len, &b);
            break;
        case TOK_DEC_BYTEFALLBACK: {
            int v = is_byte ? -1 : byte_token(a.p, a.len);
            if (v >= 0) {
                tok_buf_putc(&b, (char)v);
                is_byte = 1; /* later stages see a raw byte, not text */
            } else {
                tok_buf_put(&b, a.p, a.len);
            }
            break;
        }
        case TOK_DEC_REPLACE:
            if (is_byte)
                tok_buf_put(&b, a.p, a.len);
            else
                replace_token(x, a.p, a.len, &b);
            break;
        case TOK_DEC_METASPACE:
            metaspace_token(x, 0, a.p, a.len, &b);
            break;
        default: /* Fuse joins tokens; Strip acts at the ends of the whole text */
            tok_buf_put(&b, a.p, a.len);
        }
        struct tok_buf s = a;
        a = b;
        b = s;
    }
    int n = (int)a.len;
    if (a.len > cap)
        n = -1;
    else if (a.len)
        memcpy(out, a.p, a.len);
    tok_buf_dispose(&a);
    tok_buf_dispose(&b);
    return n;
}
