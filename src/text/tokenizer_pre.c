/*
 * Pre-tokenizers of tokenizer.json: Split (PCRE2 regex or literal, five behaviors, invert),
 * ByteLevel (GPT-2 byte map, optional prefix space and GPT-2 regex), Metaspace, Digits,
 * Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer and Sequence. Pieces are offsets
 * into one arena per encode call, so splitting copies nothing; only ByteLevel and Metaspace,
 * which rewrite text, append to the arena.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/tokenizer_impl.h"

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust's char::is_whitespace (Unicode White_Space), one character per match */
static const char WS_CHAR[] =
    "[\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}"
    "\\x{3000}]";
/* is_ascii_punctuation() || Unicode punctuation (P*), one character per match */
static const char PUNCT_CHAR[] = "[\\p{P}!-/:-@\\[-`{-~]";

uint32_t tok_byte_to_cp[256];
int16_t tok_cp_to_byte[324];

static void bytemap_build(void)
{
    /* printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in byte order */
    uint32_t next = 256;
    for (int i = 0; i < 324; i++) tok_cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        tok_byte_to_cp[b] = keep ? (uint32_t)b : next++;
        tok_cp_to_byte[tok_byte_to_cp[b]] = (int16_t)b;
    }
}

void tok_bytemap_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, bytemap_build);
}

static int parse_behavior(const cJSON *j, enum tok_split_behavior *b, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "behavior");
    if (!cJSON_IsString(v)) {
        *b = TOK_SPLIT_ISOLATED;
        return 0;
    }
    const char *s = v->valuestring;
    if (!strcmp(s, "Removed"))
        *b = TOK_SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated"))
        *b = TOK_SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious"))
        *b = TOK_SPLIT_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext"))
        *b = TOK_SPLIT_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous"))
        *b = TOK_SPLIT_CONTIGUOUS;
    else
        return err_set(e, "tokenizer.json: split behavior '%s' is not supported", s);
    return 0;
}

static int charclass(struct tok_pre *p, const char *pattern, enum tok_split_behavior b, int invert,
                     struct err *e)
{
    p->kind = TOK_PRE_CHARCLASS;
    p->behavior = b;
    p->invert = invert;
    p->re = tok_regex_compile(pattern, strlen(pattern), e);
    return p->re ? 0 : -1;
}

int tok_pre_parse(const cJSON *j, struct tok_pre *p, struct err *e)
{
    memset(p, 0, sizeof *p);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return err_set(e, "tokenizer.json: pre_tokenizer without a type");
    const char *ty = t->valuestring;
    if (!strcmp(ty, "Sequence")) {
        p->kind = TOK_PRE_SEQUENCE;
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        p->subs = xcalloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *p->subs);
        const cJSON *it;
        cJSON_ArrayForEach(it, arr)
        {
            if (tok_pre_parse(it, &p->subs[p->nsubs], e) != 0) return -1;
            p->nsubs++;
        }
        return 0;
    }
    if (!strcmp(ty, "Split")) {
        p->kind = TOK_PRE_SPLIT;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        if (cJSON_IsString(s))
            p->re = tok_regex_literal(s->valuestring, strlen(s->valuestring), e);
        else if (cJSON_IsString(r))
            p->re = tok_regex_compile(r->valuestring, strlen(r->valuestring), e);
        else
            return err_set(e, "tokenizer.json: Split has no String or Regex pattern");
        if (!p->re) return err_wrap(e, "tokenizer.json: Split pattern");
        p->invert = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "invert"));
        return parse_behavior(j, &p->behavior, e);
    }
    if (!strcmp(ty, "ByteLevel")) {
        p->kind = TOK_PRE_BYTELEVEL;
        p->add_prefix_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space"));
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(j, "use_regex");
        if (!ur || cJSON_IsTrue(ur)) {
            p->re = tok_regex_compile(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, e);
            if (!p->re) return -1;
        }
        return 0;
    }
    if (!strcmp(ty, "Metaspace")) {
        p->kind = TOK_PRE_METASPACE;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "replacement");
        const char *rs = cJSON_IsString(r) ? r->valuestring : "\xe2\x96\x81";
        size_t rl = strlen(rs);
        if (rl == 0 || rl > 4 || tok_utf8_len((const unsigned char *)rs, rl) != (int)rl)
            return err_set(e, "tokenizer.json: Metaspace replacement must be one character");
        memcpy(p->repl, rs, rl);
        p->repl_len = (int)rl;
        p->prepend = TOK_PREPEND_ALWAYS;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        if (cJSON_IsString(ps)) {
            if (!strcmp(ps->valuestring, "always"))
                p->prepend = TOK_PREPEND_ALWAYS;
            else if (!strcmp(ps->valuestring, "first"))
                p->prepend = TOK_PREPEND_FIRST;
            else if (!strcmp(ps->valuestring, "never"))
                p->prepend = TOK_PREPEND_NEVER;
            else
                return err_set(e, "tokenizer.json: Metaspace prepend_scheme '%s' is not supported",
                               ps->valuestring);
        } else if (cJSON_IsFalse(aps)) {
            p->prepend = TOK_PREPEND_NEVER; /* the older spelling of the same option */
        }
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "split");
        p->split = !sp || cJSON_IsTrue(sp);
        p->re = tok_regex_literal(p->repl, rl, e);
        return p->re ? 0 : -1;
    }
    if (!strcmp(ty, "Digits")) {
        int each = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "individual_digits"));
        return charclass(p, "[0-9]", each ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, 0, e);
    }
    if (!strcmp(ty, "Punctuation")) {
        enum tok_split_behavior b;
        if (parse_behavior(j, &b, e) != 0) return -1;
        return charclass(p, PUNCT_CHAR, b, 0, e);
    }
    if (!strcmp(ty, "Whitespace")) return charclass(p, "\\w+|[^\\w\\s]+", TOK_SPLIT_REMOVED, 1, e);
    if (!strcmp(ty, "WhitespaceSplit")) return charclass(p, WS_CHAR, TOK_SPLIT_REMOVED, 0, e);
    if (!strcmp(ty, "BertPreTokenizer")) {
        p->kind = TOK_PRE_SEQUENCE;
        p->subs = xcalloc(2, sizeof *p->subs);
        p->nsubs = 2;
        if (charclass(&p->subs[0], WS_CHAR, TOK_SPLIT_REMOVED, 0, e) != 0) return -1;
        return charclass(&p->subs[1], PUNCT_CHAR, TOK_SPLIT_ISOLATED, 0, e);
    }
    return err_set(e, "tokenizer.json: pre_tokenizer type '%s' is not supported", ty);
}

void tok_pre_dispose(struct tok_pre *p)
{
    for (int i = 0; i < p->nsubs; i++) tok_pre_dispose(&p->subs[i]);
    free(p->subs);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

static void seg_push(struct tok_matcher *m, size_t a, size_t b, size_t match)
{
    if (m->nseg + 3 > m->segcap) {
        m->segcap = m->segcap ? m->segcap * 2 : 192;
        m->seg = xrealloc(m->seg, m->segcap * sizeof(size_t));
    }
    m->seg[m->nseg++] = a;
    m->seg[m->nseg++] = b;
    m->seg[m->nseg++] = match;
}

/*
 * Splits piece `pc` by re and applies the behavior, as Hugging Face's
 * NormalizedString::split does: the text is cut into alternating (non-)match segments, the
 * behavior folds matches into their neighbours, then empty (and Removed) segments go.
 */
static int split_piece(const pcre2_code *re, enum tok_split_behavior beh, int invert,
                       const struct tok_buf *arena, const struct tok_piece *pc,
                       struct tok_pieces *out, struct tok_matcher *m)
{
    const char *s = arena->p + pc->off;
    size_t n = pc->len, prev = 0, from = 0, ms, me;
    m->nseg = 0;
    while (from <= n) {
        int r = tok_regex_next(re, m, s, n, from, &ms, &me);
        if (r < 0) return -1;
        if (r == 0) break;
        if (prev != ms) seg_push(m, prev, ms, 0);
        seg_push(m, ms, me, 1);
        prev = me;
        if (me > ms)
            from = me;
        else if (me >= n)
            break;
        else
            from = me + (size_t)tok_utf8_len((const unsigned char *)s + me, n - me);
    }
    if (prev != n) seg_push(m, prev, n, 0);
    size_t ns = m->nseg / 3;
    size_t *g = m->seg;
    if (invert)
        for (size_t i = 0; i < ns; i++) g[3 * i + 2] = !g[3 * i + 2];

    /* fold in place; w = number of output segments */
    size_t w = 0;
    int prev_match = 0;
    switch (beh) {
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < ns; i++) g[3 * i + 2] = 0;
        w = ns;
        break;
    case TOK_SPLIT_REMOVED:
        w = ns;
        break;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < ns; i++) {
            int im = (int)g[3 * i + 2];
            if (im == prev_match && w > 0)
                g[3 * (w - 1) + 1] = g[3 * i + 1];
            else {
                g[3 * w] = g[3 * i], g[3 * w + 1] = g[3 * i + 1], g[3 * w + 2] = 0;
                w++;
            }
            prev_match = im;
        }
        break;
    case TOK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < ns; i++) {
            int im = (int)g[3 * i + 2];
            if (im && !prev_match && w > 0)
                g[3 * (w - 1) + 1] = g[3 * i + 1];
            else {
                g[3 * w] = g[3 * i], g[3 * w + 1] = g[3 * i + 1], g[3 * w + 2] = 0;
                w++;
            }
            prev_match = im;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT: {
        /* fold from the end, writing segments backwards from the top, then shift down */
        size_t top = ns;
        for (size_t k = ns; k-- > 0;) {
            int im = (int)g[3 * k + 2];
            size_t a = g[3 * k], b = g[3 * k + 1];
            if (im && !prev_match && top < ns)
                g[3 * top] = a;
            else {
                top--;
                g[3 * top] = a, g[3 * top + 1] = b, g[3 * top + 2] = 0;
            }
            prev_match = im;
        }
        w = ns - top;
        memmove(g, g + 3 * top, w * 3 * sizeof(size_t));
        break;
    }
    }
    for (size_t i = 0; i < w; i++) {
        size_t a = g[3 * i], b = g[3 * i + 1];
        if (g[3 * i + 2] || a == b) continue;
        tok_pieces_push(out, pc->off + a, b - a, pc->first && a == 0);
    }
    return 0;
}

/* Appends the GPT-2 byte-mapped form of arena[off, off+len) to the arena as a new piece. */
static void bytelevel_map(struct tok_buf *arena, size_t off, size_t len, int first,
                          struct tok_pieces *out)
{
    tok_buf_reserve(arena, len * 2);
    const unsigned char *s = (const unsigned char *)arena->p + off;
    size_t start = arena->len;
    char *o = arena->p + arena->len;
    for (size_t i = 0; i < len; i++) o += tok_utf8_put(tok_byte_to_cp[s[i]], o);
    arena->len = (size_t)(o - arena->p);
    arena->p[arena->len] = 0;
    tok_pieces_push(out, start, arena->len - start, first);
}

static int apply_one(const struct tok_pre *p, struct tok_buf *arena, const struct tok_piece *pc,
                     struct tok_pieces *out, struct tok_matcher *m)
{
    switch (p->kind) {
    case TOK_PRE_SEQUENCE:
        return -1; /* handled by tok_pre_apply */
    case TOK_PRE_SPLIT:
    case TOK_PRE_CHARCLASS:
        return split_piece(p->re, p->behavior, p->invert, arena, pc, out, m);
    case TOK_PRE_BYTELEVEL: {
        struct tok_piece src = *pc;
        if (p->add_prefix_space && (src.len == 0 || arena->p[src.off] != ' ')) {
            size_t start = arena->len;
            tok_buf_reserve(arena, src.len + 1);
            arena->p[arena->len++] = ' ';
            tok_buf_put(arena, arena->p + src.off, src.len);
            src.off = start;
            src.len++;
        }
        if (!p->re) {
            bytelevel_map(arena, src.off, src.len, src.first, out);
            return 0;
        }
        size_t from = out->n;
        if (split_piece(p->re, TOK_SPLIT_ISOLATED, 0, arena, &src, out, m) != 0) return -1;
        /* map each new piece in place of itself (the arena grows behind them) */
        size_t to = out->n;
        for (size_t i = from; i < to; i++) {
            struct tok_piece q = out->v[i];
            bytelevel_map(arena, q.off, q.len, q.first, out);
            out->v[i] = out->v[out->n - 1];
            out->n--;
        }
        return 0;
    }
    case TOK_PRE_METASPACE: {
        /* replace ' ' by the replacement, then maybe prepend it (HF's order) */
        size_t start = arena->len;
        tok_buf_reserve(arena, pc->len * (size_t)p->repl_len + (size_t)p->repl_len);
        const char *s = arena->p + pc->off; /* stable: capacity reserved above */
        int starts_with =
            pc->len > 0 && (s[0] == ' ' || (pc->len >= (size_t)p->repl_len &&
                                            !memcmp(s, p->repl, (size_t)p->repl_len)));
        int prepend = !starts_with && (p->prepend == TOK_PREPEND_ALWAYS ||
                                       (p->prepend == TOK_PREPEND_FIRST && pc->first));
        char *o = arena->p + arena->len;
        if (prepend) memcpy(o, p->repl, (size_t)p->repl_len), o += p->repl_len;
        for (size_t i = 0; i < pc->len; i++) {
            if (s[i] == ' ')
                memcpy(o, p->repl, (size_t)p->repl_len), o += p->repl_len;
            else
                *o++ = s[i];
        }
        arena->len = (size_t)(o - arena->p);
        arena->p[arena->len] = 0;
        struct tok_piece np = {start, arena->len - start, pc->first};
        if (!p->split) {
            if (np.len) tok_pieces_push(out, np.off, np.len, np.first);
            return 0;
        }
        return split_piece(p->re, TOK_SPLIT_MERGED_NEXT, 0, arena, &np, out, m);
    }
    }
    return 0;
}

int tok_pre_apply(const struct tok_pre *p, struct tok_buf *arena, struct tok_pieces *in,
                  struct tok_pieces *out, struct tok_matcher *m)
{
    if (p->kind != TOK_PRE_SEQUENCE) {
        out->n = 0;
        for (size_t i = 0; i < in->n; i++)
            if (apply_one(p, arena, &in->v[i], out, m) != 0) return -1;
        return 0;
    }
    /* a sequence ping-pongs between in and out; the result must end in out */
    struct tok_pieces *a = in, *b = out;
    if (p->nsubs == 0) {
        out->n = 0;
        for (size_t i = 0; i < in->n; i++)
            tok_pieces_push(out, in->v[i].off, in->v[i].len, in->v[i].first);
        return 0;
    }
    for (int k = 0; k < p->nsubs; k++) {
        if (tok_pre_apply(&p->subs[k], arena, a, b, m) != 0) return -1;
        struct tok_pieces *t = a;
        a = b;
        b = t;
    }
    if (a != out) { /* odd number of swaps left the result in `in` */
        struct tok_pieces t = *out;
        *out = *in;
        *in = t;
    }
    return 0;
}
