/*
 * tokenizer: loading tokenizer.json + tokenizer_config.json, the encode pipeline and the
 * public API (see tokenizer.h). Stages live in tokenizer_{norm,pre,bpe,dec}.c.
 *
 * Encoding follows Hugging Face tokenizers step by step: added tokens whose `normalized` is
 * false are cut out of the raw text first (leftmost-longest, honouring lstrip, rstrip and
 * single_word); each remaining segment is normalized, cut again by the normalized added
 * tokens, pre-tokenized into pieces and each piece run through the BPE model. With
 * add_special the post-processor's tokens go around the result.
 *
 * All state written during an encode lives in a per-call scratch, so one struct tok can be
 * shared by threads.
 */
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common/util.h"
#include "text/tokenizer_impl.h"

/* ---- loading ---- */

static int parse_added(struct tok *t, const cJSON *arr, struct err *e)
{
    int n = cJSON_GetArraySize(arr);
    t->added = xcalloc((size_t)n + 1, sizeof *t->added);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(c) || id->valuedouble < 0 ||
            id->valuedouble > 0x7fffffff)
            return err_set(e, "tokenizer.json: added token %d has no valid id and content",
                           t->nadded);
        if (!c->valuestring[0]) continue;
        struct tok_added *a = &t->added[t->nadded++];
        a->content = xstrdup(c->valuestring);
        a->len = strlen(a->content);
        a->id = (int32_t)id->valuedouble;
        a->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"));
        a->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "lstrip"));
        a->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "rstrip"));
        a->single_word = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "single_word"));
        const cJSON *nz = cJSON_GetObjectItemCaseSensitive(it, "normalized");
        a->normalized = nz ? cJSON_IsTrue(nz) : !a->special;
    }
    return 0;
}

/* Buckets added tokens by first byte, longest first, for leftmost-longest matching. */
static void build_buckets(const struct tok *t, int normalized, int32_t first[257], int32_t **order)
{
    int cnt[256] = {0};
    for (int i = 0; i < t->nadded; i++) {
        if (t->added[i].normalized != normalized) continue;
        const char *c = normalized ? t->norm_content[i] : t->added[i].content;
        size_t l = normalized ? t->norm_len[i] : t->added[i].len;
        if (l) cnt[(unsigned char)c[0]]++;
    }
    first[0] = 0;
    for (int b = 0; b < 256; b++) first[b + 1] = first[b] + cnt[b];
    *order = xmalloc(((size_t)first[256] + 1) * sizeof(int32_t));
    int32_t fill[256];
    memcpy(fill, first, sizeof fill);
    for (int i = 0; i < t->nadded; i++) {
        if (t->added[i].normalized != normalized) continue;
        const char *c = normalized ? t->norm_content[i] : t->added[i].content;
        size_t l = normalized ? t->norm_len[i] : t->added[i].len;
        if (!l) continue;
        int b = (unsigned char)c[0];
        /* insertion keeps each bucket sorted by length, longest first */
        int32_t k = fill[b]++;
        while (k > first[b]) {
            int32_t o = (*order)[k - 1];
            size_t ol = normalized ? t->norm_len[o] : t->added[o].len;
            if (ol >= l) break;
            (*order)[k] = o;
            k--;
        }
        (*order)[k] = i;
    }
}

static void ids_append(int32_t **v, int *n, const int32_t *src, int m)
{
    *v = xrealloc(*v, (size_t)(*n + m + 1) * sizeof(int32_t));
    if (m) memcpy(*v + *n, src, (size_t)m * sizeof(int32_t));
    *n += m;
}

static int parse_post(struct tok *t, const cJSON *j, struct err *e)
{
    if (!j || cJSON_IsNull(j)) return 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(ty)) return err_set(e, "tokenizer.json: post_processor without a type");
    const char *s = ty->valuestring;
    if (!strcmp(s, "ByteLevel")) return 0; /* only trims offsets; ids are unchanged */
    if (!strcmp(s, "Sequence")) {
        const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(j, "processors");
        cJSON_ArrayForEach(it, arr) if (parse_post(t, it, e) != 0) return -1;
        return 0;
    }
    /* each processor wraps what the previous ones produced */
    int32_t *pre = NULL, *post = NULL;
    int npre = 0, npost = 0;
    if (!strcmp(s, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
        int seen_seq = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, single)
        {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
            if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
                seen_seq = 1;
                continue;
            }
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
            if (!cJSON_IsString(name)) {
                free(pre), free(post);
                return err_set(e, "tokenizer.json: TemplateProcessing item is not understood");
            }
            const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids"), *x;
            if (!cJSON_IsArray(ids)) {
                free(pre), free(post);
                return err_set(e,
                               "tokenizer.json: TemplateProcessing special token '%s' has no ids",
                               name->valuestring);
            }
            cJSON_ArrayForEach(x, ids)
            {
                int32_t v = (int32_t)x->valuedouble;
                if (seen_seq)
                    ids_append(&post, &npost, &v, 1);
                else
                    ids_append(&pre, &npre, &v, 1);
            }
        }
    } else if (!strcmp(s, "RobertaProcessing") || !strcmp(s, "BertProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(j, "cls");
        const cJSON *sep = cJSON_GetObjectItemCaseSensitive(j, "sep");
        if (cJSON_GetArraySize(cls) != 2 || cJSON_GetArraySize(sep) != 2)
            return err_set(e, "tokenizer.json: %s needs cls and sep", s);
        int32_t c = (int32_t)cJSON_GetArrayItem(cls, 1)->valuedouble;
        int32_t p = (int32_t)cJSON_GetArrayItem(sep, 1)->valuedouble;
        ids_append(&pre, &npre, &c, 1);
        ids_append(&post, &npost, &p, 1);
    } else {
        return err_set(e, "tokenizer.json: post_processor type '%s' is not supported", s);
    }
    ids_append(&pre, &npre, t->post_pre, t->npost_pre);
    free(t->post_pre);
    t->post_pre = pre, t->npost_pre = npre;
    ids_append(&t->post_post, &t->npost_post, post, npost);
    free(post);
    return 0;
}

/* bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}. */
static int32_t config_token(const struct tok *t, const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? tok_token_id(t, v->valuestring) : -1;
}

static int load_config(struct tok *t, const char *dir, struct err *e)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0; /* optional */
    fclose(f);
    size_t len;
    char *txt = util_read_file(path, &len, e);
    if (!txt) return -1;
    cJSON *cfg = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return err_set(e, "%s: not a JSON object", path);
    }
    t->bos_id = config_token(t, cfg, "bos_token");
    t->eos_id = config_token(t, cfg, "eos_token");
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    if (cJSON_IsBool(ab) || cJSON_IsBool(ae)) {
        /* as transformers does: explicit flags rebuild the single-sequence template */
        t->npost_pre = t->npost_post = 0;
        if (cJSON_IsTrue(ab) && t->bos_id >= 0)
            ids_append(&t->post_pre, &t->npost_pre, &t->bos_id, 1);
        if (cJSON_IsTrue(ae) && t->eos_id >= 0)
            ids_append(&t->post_post, &t->npost_post, &t->eos_id, 1);
    }
    cJSON_Delete(cfg);
    return 0;
}

static int load_json(struct tok *t, const cJSON *root, struct err *e)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return err_set(e, "tokenizer.json: no model object");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(model, "type");
    const char *mtype = cJSON_IsString(mt) ? mt->valuestring : NULL;
    if (!mtype && cJSON_GetObjectItemCaseSensitive(model, "merges")) mtype = "BPE";
    if (!mtype || strcmp(mtype, "BPE") != 0)
        return err_set(e, "tokenizer.json: model type '%s' is not supported (only BPE is)",
                       mtype ? mtype : "?");
    if (tok_bpe_parse(model, &t->bpe, e) != 0) return -1;
    if (parse_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), e) != 0) return -1;

    /* id -> string over vocabulary and added tokens (added content wins, as in HF) */
    int32_t maxid = -1;
    const cJSON *it, *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    cJSON_ArrayForEach(it, vocab) if ((int32_t)it->valuedouble > maxid) maxid =
        (int32_t)it->valuedouble;
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].id > maxid) maxid = t->added[i].id;
    t->nids = maxid + 1;
    t->id2tok = xcalloc((size_t)t->nids + 1, sizeof(char *));
    t->id2len = xcalloc((size_t)t->nids + 1, sizeof(uint32_t));
    t->is_special = xcalloc((size_t)t->nids + 1, 1);
    cJSON_ArrayForEach(it, vocab)
    {
        int32_t id = (int32_t)it->valuedouble;
        free(t->id2tok[id]);
        t->id2tok[id] = xstrdup(it->string);
        t->id2len[id] = (uint32_t)strlen(it->string);
    }
    strmap_init(&t->added_map);
    for (int i = 0; i < t->nadded; i++) {
        struct tok_added *a = &t->added[i];
        free(t->id2tok[a->id]);
        t->id2tok[a->id] = xstrdup(a->content);
        t->id2len[a->id] = (uint32_t)a->len;
        t->is_special[a->id] = (uint8_t)a->special;
        strmap_put(&t->added_map, a->content, a->len, a->id);
    }

    const cJSON *nj = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (nj && !cJSON_IsNull(nj)) {
        t->norm = xcalloc(1, sizeof *t->norm);
        if (tok_norm_parse(nj, t->norm, e) != 0) return -1;
    }
    const cJSON *pj = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (pj && !cJSON_IsNull(pj)) {
        t->pre = xcalloc(1, sizeof *t->pre);
        if (tok_pre_parse(pj, t->pre, e) != 0) return -1;
    }
    if (parse_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), e) != 0) return -1;
    if (tok_decoder_parse(cJSON_GetObjectItemCaseSensitive(root, "decoder"), &t->dec, e) != 0)
        return -1;

    /* normalized added tokens are matched against normalized text, so normalize them too */
    t->norm_content = xcalloc((size_t)t->nadded + 1, sizeof(char *));
    t->norm_len = xcalloc((size_t)t->nadded + 1, sizeof(size_t));
    struct tok_matcher m;
    tok_matcher_init(&m);
    for (int i = 0; i < t->nadded; i++) {
        if (!t->added[i].normalized) continue;
        struct tok_buf b = {0};
        if (t->norm)
            tok_norm_apply(t->norm, t->added[i].content, t->added[i].len, &b, &m);
        else
            tok_buf_put(&b, t->added[i].content, t->added[i].len);
        t->norm_content[i] = b.p ? b.p : xstrdup("");
        t->norm_len[i] = b.len;
        t->has_norm_added = 1;
    }
    tok_matcher_dispose(&m);
    build_buckets(t, 0, t->first_raw, &t->raw_order);
    build_buckets(t, 1, t->first_norm, &t->norm_order);
    t->alnum_re = tok_regex_compile("[\\p{L}\\p{N}]", 13, e);
    return t->alnum_re ? 0 : -1;
}

struct tok *tok_load(const char *dir, struct err *e)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    size_t len;
    char *txt = util_read_file(path, &len, e);
    if (!txt) return NULL;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    if (!cJSON_IsObject(root)) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= txt && at <= txt + len ? (long)(at - txt) : -1;
        err_set(e, "%s: invalid JSON (near byte %ld)", path, off);
        cJSON_Delete(root);
        free(txt);
        return NULL;
    }
    free(txt);
    tok_bytemap_init();
    struct tok *t = xcalloc(1, sizeof *t);
    t->bos_id = t->eos_id = -1;
    t->bpe.unk_id = -1;
    int rc = load_json(t, root, e);
    cJSON_Delete(root);
    if (rc == 0) rc = load_config(t, dir, e);
    if (rc != 0) {
        tok_destroy(t);
        return NULL;
    }
    return t;
}

void tok_destroy(struct tok *t)
{
    if (!t) return;
    tok_bpe_dispose(&t->bpe);
    for (int32_t i = 0; i < t->nids; i++) free(t->id2tok[i]);
    free(t->id2tok);
    free(t->id2len);
    free(t->is_special);
    for (int i = 0; i < t->nadded; i++) {
        free(t->added[i].content);
        if (t->norm_content) free(t->norm_content[i]);
    }
    free(t->added);
    free(t->norm_content);
    free(t->norm_len);
    if (t->added_map.cap || t->added_map.keys) strmap_dispose(&t->added_map);
    free(t->raw_order);
    free(t->norm_order);
    if (t->norm) tok_norm_dispose(t->norm);
    free(t->norm);
    if (t->pre) tok_pre_dispose(t->pre);
    free(t->pre);
    tok_decoder_dispose(&t->dec);
    free(t->post_pre);
    free(t->post_post);
    if (t->alnum_re) pcre2_code_free(t->alnum_re);
    free(t);
}

int32_t tok_vocab_size(const struct tok *t)
{
    return t->nids;
}

int32_t tok_token_id(const struct tok *t, const char *token)
{
    int32_t id;
    size_t n = strlen(token);
    if (strmap_get(&t->added_map, token, n, &id)) return id;
    if (strmap_get(&t->bpe.vocab, token, n, &id)) return id;
    return -1;
}

int tok_is_special(const struct tok *t, int32_t id)
{
    return id >= 0 && id < t->nids && t->is_special[id];
}

int32_t tok_bos_id(const struct tok *t)
{
    return t->bos_id;
}

int32_t tok_eos_id(const struct tok *t)
{
    return t->eos_id;
}

/* ---- encoding ---- */

/*
 * Word cache of one encode call: words repeat (Zipf), so large inputs keep the BPE result of
 * short pieces in a direct-mapped table. Only allocated for inputs of CACHE_MIN_INPUT bytes
 * or more; a slot is overwritten on collision. 4096 slots x 80 bytes = 320 KiB.
 */
enum { CACHE_SLOTS = 4096, CACHE_KEY = 40, CACHE_IDS = 8, CACHE_MIN_INPUT = 16384 };

struct cache_slot {
    uint8_t klen, nids; /* klen 0: empty */
    char key[CACHE_KEY - 2];
    int32_t ids[CACHE_IDS];
};

struct enc {
    const struct tok *t;
    struct cache_slot *cache;
    struct tok_ids ids;
    struct tok_buf arena, normed;
    struct tok_pieces pa, pb;
    struct tok_matcher m;
    struct tok_bpe_scratch bs;
};

static int model_segment(struct enc *c, const char *s, size_t len, int first)
{
    if (!len) return 0;
    c->arena.len = 0;
    tok_buf_put(&c->arena, s, len);
    c->pa.n = 0;
    tok_pieces_push(&c->pa, 0, len, first);
    struct tok_pieces *ps = &c->pa;
    if (c->t->pre) {
        if (tok_pre_apply(c->t->pre, &c->arena, &c->pa, &c->pb, &c->m) != 0) return -1;
        ps = &c->pb;
    }
    for (size_t i = 0; i < ps->n; i++) {
        const char *w = c->arena.p + ps->v[i].off;
        size_t wl = ps->v[i].len;
        struct cache_slot *slot = NULL;
        if (c->cache && wl <= sizeof slot->key) {
            slot = &c->cache[XXH3_64bits(w, wl) & (CACHE_SLOTS - 1)];
            if (slot->klen == wl && !memcmp(slot->key, w, wl)) {
                for (int k = 0; k < slot->nids; k++) tok_ids_push(&c->ids, slot->ids[k]);
                continue;
            }
        }
        size_t before = c->ids.n;
        tok_bpe_word(&c->t->bpe, w, wl, &c->ids, &c->bs);
        if (slot && wl && c->ids.n - before <= CACHE_IDS) {
            slot->klen = (uint8_t)wl;
            slot->nids = (uint8_t)(c->ids.n - before);
            memcpy(slot->key, w, wl);
            memcpy(slot->ids, c->ids.v + before, slot->nids * sizeof(int32_t));
        }
    }
    return 0;
}

static int is_alnum_at(struct enc *c, const char *s, size_t len)
{
    if (!len) return 0;
    unsigned char ch = (unsigned char)s[0];
    if (ch < 0x80) return (ch >= '0' && ch <= '9') || ((ch | 32) >= 'a' && (ch | 32) <= 'z');
    size_t ms, me, l = (size_t)tok_utf8_len((const unsigned char *)s, len);
    return tok_regex_next(c->t->alnum_re, &c->m, s, l, 0, &ms, &me) == 1 && ms == 0 && me == l;
}

static size_t prev_char(const char *s, size_t i)
{
    do i--;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

/*
 * Cuts s[0..len) at the added tokens of one pass (raw or normalized) and passes the text in
 * between to `next`. Leftmost-longest, non-overlapping, as Hugging Face's Aho-Corasick pass.
 */
typedef int (*seg_fn)(struct enc *c, const char *s, size_t len, int first);

static int split_added(struct enc *c, int normalized, const char *s, size_t len, int first,
                       seg_fn next)
{
    const struct tok *t = c->t;
    const int32_t *fb = normalized ? t->first_norm : t->first_raw;
    const int32_t *order = normalized ? t->norm_order : t->raw_order;
    size_t start_offset = 0, i = 0;
    while (i < len) {
        int b = (unsigned char)s[i];
        int hit = -1;
        size_t hl = 0;
        for (int32_t k = fb[b]; k < fb[b + 1]; k++) {
            int a = order[k];
            const char *ct = normalized ? t->norm_content[a] : t->added[a].content;
            size_t cl = normalized ? t->norm_len[a] : t->added[a].len;
            if (cl <= len - i && !memcmp(s + i, ct, cl)) {
                hit = a, hl = cl;
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        const struct tok_added *a = &t->added[hit];
        size_t ms = i, me = i + hl;
        if (a->single_word) {
            int before = ms > 0 && is_alnum_at(c, s + prev_char(s, ms), len - prev_char(s, ms));
            int after = me < len && is_alnum_at(c, s + me, len - me);
            if (before || after) {
                i = me;
                continue;
            }
        }
        if (a->lstrip) {
            size_t k = ms, l;
            while (k > start_offset) {
                size_t p = prev_char(s, k);
                if (!tok_is_whitespace(tok_utf8_get((const unsigned char *)s + p, &l))) break;
                k = p;
            }
            ms = k;
        }
        if (a->rstrip) {
            size_t l;
            while (me < len && tok_is_whitespace(tok_utf8_get((const unsigned char *)s + me, &l)))
                me += l;
        }
        if (ms > start_offset &&
            next(c, s + start_offset, ms - start_offset, first && start_offset == 0) != 0)
            return -1;
        tok_ids_push(&c->ids, a->id);
        start_offset = i = me;
    }
    if (len > start_offset &&
        next(c, s + start_offset, len - start_offset, first && start_offset == 0) != 0)
        return -1;
    return 0;
}

static int normalized_segment(struct enc *c, const char *s, size_t len, int first)
{
    const struct tok *t = c->t;
    if (!t->norm) {
        if (t->has_norm_added) return split_added(c, 1, s, len, first, model_segment);
        return model_segment(c, s, len, first);
    }
    c->normed.len = 0;
    if (tok_norm_apply(t->norm, s, len, &c->normed, &c->m) != 0) return -1;
    /* model_segment copies into the arena, so c->normed stays intact while it is cut */
    if (t->has_norm_added)
        return split_added(c, 1, c->normed.p, c->normed.len, first, model_segment);
    return model_segment(c, c->normed.p, c->normed.len, first);
}

int tok_encode(const struct tok *t, const char *text, size_t len, int add_special, int32_t **ids,
               size_t *n, struct err *e)
{
    *ids = NULL;
    *n = 0;
    size_t bad = tok_utf8_check(text, len);
    if (bad != len) return err_set(e, "input is not valid UTF-8 (byte %zu)", bad);
    struct enc c;
    memset(&c, 0, sizeof c);
    c.t = t;
    tok_matcher_init(&c.m);
    if (len >= CACHE_MIN_INPUT) c.cache = xcalloc(CACHE_SLOTS, sizeof *c.cache);
    if (add_special)
        for (int i = 0; i < t->npost_pre; i++) tok_ids_push(&c.ids, t->post_pre[i]);
    int rc = split_added(&c, 0, text, len, 1, normalized_segment);
    if (add_special)
        for (int i = 0; i < t->npost_post; i++) tok_ids_push(&c.ids, t->post_post[i]);
    tok_matcher_dispose(&c.m);
    tok_buf_dispose(&c.arena);
    tok_buf_dispose(&c.normed);
    free(c.pa.v);
    free(c.pb.v);
    tok_bpe_scratch_dispose(&c.bs);
    free(c.cache);
    if (rc != 0) {
        free(c.ids.v);
        return err_set(e, "regular expression matching failed (input too complex)");
    }
    if (!c.ids.v) c.ids.v = xmalloc(sizeof(int32_t));
    *ids = c.ids.v;
    *n = c.ids.n;
    return 0;
}

char *tok_decode(const struct tok *t, const int32_t *ids, size_t n, int skip_special)
{
    return tok_decode_len(t, ids, n, skip_special, NULL);
}

char *tok_decode_len(const struct tok *t, const int32_t *ids, size_t n, int skip_special,
                     size_t *len)
{
    struct tok_strs l = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->nids || !t->id2tok[id]) continue; /* unknown ids are skipped */
        if (skip_special && t->is_special[id]) continue;
        tok_strs_push(&l, t->id2tok[id], t->id2len[id]);
    }
    struct tok_buf out = {0};
    tok_decoder_run(&t->dec, &l, &out);
    tok_strs_dispose(&l);
    if (len) *len = out.len;
    if (!out.p) return xstrdup("");
    return out.p;
}

const char *tok_id_to_token(const struct tok *t, int32_t id)
{
    return id >= 0 && id < t->nids ? t->id2tok[id] : NULL;
}
