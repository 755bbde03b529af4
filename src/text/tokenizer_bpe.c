/*
 * The BPE model of tokenizer.json: vocabulary, ranked merges, byte fallback, unk fusing,
 * ignore_merges, continuing_subword_prefix / end_of_word_suffix.
 *
 * A word is a linked list of symbols; candidate merges sit in a binary min-heap ordered by
 * (rank, position), which is the order Hugging Face applies them in. A popped candidate is
 * used only if its two symbols are still adjacent and still form the same merge. Cost per
 * word of n characters: O(n log n) (each merge pushes at most two candidates).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/tokenizer_impl.h"

#define EMPTY_KEY UINT64_MAX

static size_t mslot(const struct tok_bpe *b, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (b->mcap - 1);
}

static void merge_put(struct tok_bpe *b, int32_t l, int32_t r, int32_t rank, int32_t nid)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    size_t i = mslot(b, key);
    while (b->mkeys[i] != EMPTY_KEY && b->mkeys[i] != key) i = (i + 1) & (b->mcap - 1);
    b->mkeys[i] = key; /* a repeated pair keeps its last rank, as a HashMap collect would */
    b->mrank[i] = rank;
    b->mnew[i] = nid;
}

static inline int merge_get(const struct tok_bpe *b, int32_t l, int32_t r, int32_t *rank,
                            int32_t *nid)
{
    if (!b->mcap) return 0;
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    size_t i = mslot(b, key);
    for (;;) {
        uint64_t k = b->mkeys[i];
        if (k == key) {
            *rank = b->mrank[i];
            *nid = b->mnew[i];
            return 1;
        }
        if (k == EMPTY_KEY) return 0;
        i = (i + 1) & (b->mcap - 1);
    }
}

static char *opt_string(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) && v->valuestring[0] ? xstrdup(v->valuestring) : NULL;
}

int tok_bpe_parse(const cJSON *model, struct tok_bpe *b, struct err *e)
{
    memset(b, 0, sizeof *b);
    strmap_init(&b->vocab);
    b->unk_id = -1;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return err_set(e, "tokenizer.json: BPE model has no vocab object");
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 0x7fffffff)
            return err_set(e, "tokenizer.json: vocab entry '%s' has no valid id", it->string);
        strmap_put(&b->vocab, it->string, strlen(it->string), (int32_t)it->valuedouble);
    }
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0)
        return err_set(e, "tokenizer.json: BPE dropout is not supported (set it to null)");
    b->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    b->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
    b->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    b->prefix = opt_string(model, "continuing_subword_prefix");
    b->suffix = opt_string(model, "end_of_word_suffix");
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk) &&
        !strmap_get(&b->vocab, unk->valuestring, strlen(unk->valuestring), &b->unk_id))
        b->unk_id = -1; /* HF fails only when the unknown token is actually needed */
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        if (!strmap_get(&b->vocab, name, 6, &b->byte_id[i])) b->byte_id[i] = -1;
    }

    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    int nm = cJSON_IsArray(merges) ? cJSON_GetArraySize(merges) : 0;
    b->mcap = 16;
    while (b->mcap < (size_t)nm * 2) b->mcap *= 2;
    b->mkeys = xmalloc(b->mcap * sizeof(uint64_t));
    memset(b->mkeys, 0xff, b->mcap * sizeof(uint64_t));
    b->mrank = xmalloc(b->mcap * sizeof(int32_t));
    b->mnew = xmalloc(b->mcap * sizeof(int32_t));
    size_t plen = b->prefix ? strlen(b->prefix) : 0;
    struct tok_buf tmp = {0};
    int rank = 0;
    cJSON_ArrayForEach(it, merges)
    {
        const char *l, *r;
        size_t ll, rl;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                tok_buf_dispose(&tmp);
                return err_set(e, "tokenizer.json: merge %d '%s' is not two tokens", rank,
                               it->valuestring);
            }
            l = it->valuestring, ll = (size_t)(sp - l);
            r = sp + 1, rl = strlen(r);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            l = it->child->valuestring, ll = strlen(l);
            r = it->child->next->valuestring, rl = strlen(r);
        } else {
            tok_buf_dispose(&tmp);
            return err_set(e, "tokenizer.json: merge %d is neither \"a b\" nor [\"a\", \"b\"]",
                           rank);
        }
        int32_t a, c, n;
        tmp.len = 0;
        tok_buf_put(&tmp, l, ll);
        if (plen && rl >= plen && !memcmp(r, b->prefix, plen))
            tok_buf_put(&tmp, r + plen, rl - plen);
        else
            tok_buf_put(&tmp, r, rl);
        if (!strmap_get(&b->vocab, l, ll, &a) || !strmap_get(&b->vocab, r, rl, &c) ||
            !strmap_get(&b->vocab, tmp.p, tmp.len, &n)) {
            err_set(e,
                    "tokenizer.json: merge %d ('%.*s' + '%.*s') uses a token missing from the "
                    "vocabulary",
                    rank, (int)ll, l, (int)rl, r);
            tok_buf_dispose(&tmp);
            return -1;
        }
        merge_put(b, a, c, rank, n);
        rank++;
    }
    tok_buf_dispose(&tmp);
    return 0;
}

void tok_bpe_dispose(struct tok_bpe *b)
{
    strmap_dispose(&b->vocab);
    free(b->mkeys);
    free(b->mrank);
    free(b->mnew);
    free(b->prefix);
    free(b->suffix);
    memset(b, 0, sizeof *b);
}

void tok_bpe_scratch_dispose(struct tok_bpe_scratch *s)
{
    free(s->id);
    free(s->prev);
    free(s->next);
    free(s->heap_rank);
    free(s->heap_pos);
    free(s->heap_id);
    memset(s, 0, sizeof *s);
}

static void scratch_fit(struct tok_bpe_scratch *s, size_t n)
{
    if (n > s->cap) {
        size_t c = s->cap ? s->cap : 64;
        while (c < n) c *= 2;
        s->id = xrealloc(s->id, c * sizeof(int32_t));
        s->prev = xrealloc(s->prev, c * sizeof(int32_t));
        s->next = xrealloc(s->next, c * sizeof(int32_t));
        s->cap = c;
    }
    if (3 * n + 4 > s->hcap) {
        size_t c = s->hcap ? s->hcap : 256;
        while (c < 3 * n + 4) c *= 2;
        s->heap_rank = xrealloc(s->heap_rank, c * sizeof(uint32_t));
        s->heap_pos = xrealloc(s->heap_pos, c * sizeof(uint32_t));
        s->heap_id = xrealloc(s->heap_id, c * sizeof(int32_t));
        s->hcap = c;
    }
}

static inline int heap_less(const struct tok_bpe_scratch *s, size_t a, size_t b)
{
    return s->heap_rank[a] < s->heap_rank[b] ||
           (s->heap_rank[a] == s->heap_rank[b] && s->heap_pos[a] < s->heap_pos[b]);
}

static inline void heap_swap(struct tok_bpe_scratch *s, size_t a, size_t b)
{
    uint32_t r = s->heap_rank[a], p = s->heap_pos[a];
    int32_t id = s->heap_id[a];
    s->heap_rank[a] = s->heap_rank[b], s->heap_pos[a] = s->heap_pos[b];
    s->heap_id[a] = s->heap_id[b];
    s->heap_rank[b] = r, s->heap_pos[b] = p, s->heap_id[b] = id;
}

static void heap_push(struct tok_bpe_scratch *s, size_t *hn, uint32_t rank, uint32_t pos,
                      int32_t nid)
{
    size_t i = (*hn)++;
    s->heap_rank[i] = rank, s->heap_pos[i] = pos, s->heap_id[i] = nid;
    while (i > 0 && heap_less(s, i, (i - 1) / 2)) {
        heap_swap(s, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_pop(struct tok_bpe_scratch *s, size_t *hn)
{
    size_t n = --(*hn), i = 0;
    if (n == 0) return;
    heap_swap(s, 0, n);
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_less(s, l, m)) m = l;
        if (r < n && heap_less(s, r, m)) m = r;
        if (m == i) break;
        heap_swap(s, i, m);
        i = m;
    }
}

static void try_candidate(const struct tok_bpe *b, struct tok_bpe_scratch *s, size_t *hn,
                          int32_t left)
{
    int32_t right = s->next[left], rank, nid;
    if (right < 0) return;
    if (merge_get(b, s->id[left], s->id[right], &rank, &nid))
        heap_push(s, hn, (uint32_t)rank, (uint32_t)left, nid);
}

void tok_bpe_word(const struct tok_bpe *b, const char *w, size_t len, struct tok_ids *out,
                  struct tok_bpe_scratch *s)
{
    int32_t id;
    if (len == 0) return;
    if (b->ignore_merges && strmap_get(&b->vocab, w, len, &id)) {
        tok_ids_push(out, id);
        return;
    }
    /* initial symbols: one per character, or one per byte through byte fallback */
    scratch_fit(s, len);
    int32_t n = 0;
    int last_unk = 0;
    struct tok_buf aff = {0};
    for (size_t i = 0; i < len;) {
        int cl = tok_utf8_len((const unsigned char *)w + i, len - i);
        if (cl <= 0) cl = 1; /* not reached on validated text */
        const char *c = w + i;
        size_t clen = (size_t)cl;
        int found;
        if (b->prefix || b->suffix) {
            aff.len = 0;
            if (b->prefix && i > 0) tok_buf_put(&aff, b->prefix, strlen(b->prefix));
            tok_buf_put(&aff, c, clen);
            if (b->suffix && i + clen == len) tok_buf_put(&aff, b->suffix, strlen(b->suffix));
            found = strmap_get(&b->vocab, aff.p, aff.len, &id);
        } else {
            found = strmap_get(&b->vocab, c, clen, &id);
        }
        i += clen;
        if (found) {
            s->id[n++] = id;
            last_unk = 0;
            continue;
        }
        if (b->byte_fallback) {
            int all = 1;
            for (size_t k = 0; k < clen; k++) all &= b->byte_id[(unsigned char)c[k]] >= 0;
            if (all) {
                for (size_t k = 0; k < clen; k++) s->id[n++] = b->byte_id[(unsigned char)c[k]];
                last_unk = 0;
                continue;
            }
        }
        if (b->unk_id >= 0) {
            if (!(b->fuse_unk && last_unk)) s->id[n++] = b->unk_id;
            last_unk = 1;
        }
        /* no unknown token: the character is dropped, as Hugging Face does */
    }
    tok_buf_dispose(&aff);
    if (n == 0) return;
    for (int32_t i = 0; i < n; i++) {
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < n ? i + 1 : -1;
    }
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_candidate(b, s, &hn, i);
    while (hn > 0) {
        uint32_t rank = s->heap_rank[0];
        int32_t left = (int32_t)s->heap_pos[0], nid = s->heap_id[0];
        heap_pop(s, &hn);
        int32_t right = s->next[left], r2, n2;
        /* stale: the left symbol was merged away, or its pair changed since the push */
        if (s->id[left] < 0 || right < 0) continue;
        if (!merge_get(b, s->id[left], s->id[right], &r2, &n2) || n2 != nid || (uint32_t)r2 != rank)
            continue;
        s->id[left] = nid;
        s->id[right] = -1;
        s->next[left] = s->next[right];
        if (s->next[right] >= 0) s->prev[s->next[right]] = left;
        if (s->prev[left] >= 0) try_candidate(b, s, &hn, s->prev[left]);
        try_candidate(b, s, &hn, left);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i]) tok_ids_push(out, s->id[i]);
}
