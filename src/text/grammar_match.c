/*
 * The matcher: a grammar run over bytes as a set of stacks (llama.cpp's GBNF matcher, with
 * shared stack frames). A stack is a chain of frames (a position in an alternative, the
 * frame to return to); its top is always at a byte set. One byte moves every stack whose
 * top admits it one position on and expands what follows (calls into rules, returns from
 * finished alternatives) until each stack is back at a byte set or the grammar's end.
 *
 * Frames live in an arena and are never shared mutably: advancing creates new ones, so a
 * trial (a mask walk, a rejected token) rolls back by truncating the arena. A call in tail
 * position reuses its caller's frame, which keeps x* and right-recursive rules flat; a
 * rule already expanded with the same return stack during one byte is not expanded again,
 * which ends the expansion of nullable loops.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/grammar_impl.h"

struct gnode {
    int32_t pos;    /* in g->syms */
    int32_t parent; /* frame below, -1 at the bottom */
    uint64_t h;     /* of the whole stack from this frame down */
};

struct visit {
    int32_t rule, cont;
    uint64_t h;
};

struct wstate;

struct gram_matcher {
    struct gram *g;
    struct gnode *nodes;
    int n_nodes, cap_nodes;
    int32_t *cur; /* the state: tops of its stacks */
    int n_cur, cap_cur, acc;
    int32_t *out; /* one byte's result */
    int n_out, cap_out, out_acc;
    int32_t *tmp; /* accept_bytes: the previous byte's result */
    int cap_tmp;
    struct visit *vis;
    int n_vis, cap_vis;
    /* mask walk scratch */
    struct wstate *ws; /* the walk's interned states */
    int n_ws, cap_ws;
    int32_t *wtab; /* hash table of ws indices (-1 empty), [cap_wtab] */
    int cap_wtab;
    int32_t *buf; /* the stacks of the walk's states */
    int n_buf, cap_buf;
    int32_t *trans; /* [256] per state that has been left */
    int n_trans, cap_trans;
    int32_t *lv; /* the walk state at each trie depth */
    int cap_lv;
    int32_t *key;
    int cap_key;
    int32_t *cand; /* build_mask scratch */
    int cap_cand;
    int32_t *cand2;
    int cap_cand2;
    int32_t *tmp2;
    int cap_tmp2;
    struct gpos **used; /* build_mask: the token sets the mask joins, */
    int n_used, cap_used;
    int32_t *extra; /* the tokens it accepts beyond them, */
    int n_extra, cap_extra;
};

#define H0 0x9E3779B97F4A7C15ull

static uint64_t mix(uint64_t h, int32_t pos)
{
    h ^= (uint64_t)(uint32_t)pos + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
}

/* Below the bottom frame: -1 (the grammar's end), or SENT (an unknown stack: masks, below). */
static inline uint64_t hash_of(const struct gram_matcher *m, int32_t n)
{
    return n >= 0 ? m->nodes[n].h : n == -1 ? H0 : ~H0;
}

static int32_t node_new(struct gram_matcher *m, int32_t pos, int32_t parent)
{
    if (m->n_nodes == m->cap_nodes) {
        m->cap_nodes = m->cap_nodes ? m->cap_nodes * 2 : 1024;
        m->nodes = xrealloc(m->nodes, sizeof *m->nodes * (size_t)m->cap_nodes);
    }
    struct gnode *n = &m->nodes[m->n_nodes];
    n->pos = pos;
    n->parent = parent;
    n->h = mix(hash_of(m, parent), pos);
    return m->n_nodes++;
}

/* Two stacks hold the same frames. */
static int same(const struct gram_matcher *m, int32_t a, int32_t b)
{
    while (a != b) {
        if (a < 0 || b < 0) return 0;
        const struct gnode *x = &m->nodes[a], *y = &m->nodes[b];
        if (x->h != y->h || x->pos != y->pos) return 0;
        a = x->parent;
        b = y->parent;
    }
    return 1;
}

/* memcpy of n int32 that may be 0 (with NULL arrays) */
static inline void cpy(int32_t *d, const int32_t *s, int n)
{
    if (n > 0) memcpy(d, s, sizeof *d * (size_t)n);
}

static void grow(int32_t **p, int *cap, int need)
{
    if (need < 1) need = 1; /* never NULL */
    if (need <= *cap) return;
    while (*cap < need) *cap = *cap ? *cap * 2 : 64;
    *p = xrealloc(*p, sizeof **p * (size_t)*cap);
}

static void add_stack(struct gram_matcher *m, int32_t pos, int32_t parent)
{
    int32_t n = node_new(m, pos, parent);
    uint64_t h = m->nodes[n].h;
    for (int i = 0; i < m->n_out; i++)
        if (m->nodes[m->out[i]].h == h && same(m, m->out[i], n)) {
            m->n_nodes--;
            return;
        }
    grow(&m->out, &m->cap_out, m->n_out + 1);
    m->out[m->n_out++] = n;
}

/* Expands from pos (returning to parent) until byte sets or the end. */
static void closure(struct gram_matcher *m, int32_t pos, int32_t parent)
{
    const struct gram *g = m->g;
    for (;;) {
        int32_t s = g->syms[pos];
        if (s == GSYM_END) {
            if (parent < 0) { /* the grammar's end, or out of a mask walk's position */
                m->out_acc = 1;
                return;
            }
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            continue;
        }
        if (!GSYM_IS_RULE(s)) {
            add_stack(m, pos, parent);
            return;
        }
        int32_t rule = GSYM_ID(s), cont = parent;
        int made = g->syms[pos + 1] != GSYM_END; /* a tail call returns where its caller does */
        if (made) cont = node_new(m, pos + 1, parent);
        uint64_t h = hash_of(m, cont);
        for (int i = 0; i < m->n_vis; i++)
            if (m->vis[i].rule == rule && m->vis[i].h == h && same(m, m->vis[i].cont, cont)) {
                if (made) m->n_nodes--;
                return;
            }
        if (m->n_vis == m->cap_vis) {
            m->cap_vis = m->cap_vis ? m->cap_vis * 2 : 64;
            m->vis = xrealloc(m->vis, sizeof *m->vis * (size_t)m->cap_vis);
        }
        m->vis[m->n_vis++] = (struct visit){rule, cont, h};
        for (int a = g->rule_alt[rule]; a < g->rule_alt[rule + 1]; a++)
            closure(m, g->alt_pos[a], cont);
        return;
    }
}

/* One byte over the stacks in[0..n): the result in m->out, m->out_acc. */
static void step(struct gram_matcher *m, const int32_t *in, int n, unsigned c)
{
    const struct gram *g = m->g;
    m->n_out = m->out_acc = m->n_vis = 0;
    for (int i = 0; i < n; i++) {
        const struct gnode *nd = &m->nodes[in[i]];
        const struct gbset *set = &g->sets[GSYM_ID(g->syms[nd->pos])];
        if (set->w[c >> 5] >> (c & 31) & 1) closure(m, nd->pos + 1, nd->parent);
    }
}

struct gram_matcher *gram_matcher_create(struct gram *g)
{
    struct gram_matcher *m = xcalloc(1, sizeof *m);
    m->g = gram_ref(g);
    for (int a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        closure(m, g->alt_pos[a], -1);
    grow(&m->cur, &m->cap_cur, m->n_out);
    cpy(m->cur, m->out, m->n_out);
    m->n_cur = m->n_out;
    m->acc = m->out_acc;
    return m;
}

void gram_matcher_destroy(struct gram_matcher *m)
{
    if (!m) return;
    gram_unref(m->g);
    free(m->nodes), free(m->cur), free(m->out), free(m->tmp), free(m->vis);
    free(m->buf), free(m->lv), free(m->key), free(m->ws), free(m->wtab), free(m->trans);
    free(m->cand), free(m->cand2), free(m->tmp2), free(m->used), free(m->extra);
    free(m);
}

/* Copies the frames the state uses to the front of the arena (the rest is garbage). */
static void compact(struct gram_matcher *m)
{
    int n = m->n_nodes;
    int32_t *map = xmalloc(sizeof *map * (size_t)n);
    for (int i = 0; i < n; i++) map[i] = -1;
    struct gnode *nn = xmalloc(sizeof *nn * (size_t)n);
    int k = 0;
    /* frames are created after their parents, so ascending order keeps parents first */
    char *live = xcalloc((size_t)n, 1);
    for (int i = 0; i < m->n_cur; i++)
        for (int32_t f = m->cur[i]; f >= 0 && !live[f]; f = m->nodes[f].parent) live[f] = 1;
    for (int i = 0; i < n; i++)
        if (live[i]) {
            nn[k] = m->nodes[i];
            if (nn[k].parent >= 0) nn[k].parent = map[nn[k].parent];
            map[i] = k++;
        }
    for (int i = 0; i < m->n_cur; i++) m->cur[i] = map[m->cur[i]];
    free(m->nodes);
    m->nodes = nn;
    m->n_nodes = k;
    m->cap_nodes = n;
    free(map);
    free(live);
}

/* Advances over s[0..n) (commit 0: only tries); 1 when every byte is accepted, and then
 * *end (when given) says whether the grammar may end after them. */
static int run_bytes(struct gram_matcher *m, const char *s, size_t n, int commit, int *end)
{
    int mark = m->n_nodes;
    const int32_t *in = m->cur;
    int n_in = m->n_cur, acc = m->acc;
    for (size_t i = 0; i < n; i++) {
        step(m, in, n_in, (unsigned char)s[i]);
        if (!m->n_out && !m->out_acc) {
            m->n_nodes = mark;
            return 0;
        }
        grow(&m->tmp, &m->cap_tmp, m->n_out);
        cpy(m->tmp, m->out, m->n_out);
        in = m->tmp;
        n_in = m->n_out;
        acc = m->out_acc;
    }
    if (end) *end = acc;
    if (!commit) {
        m->n_nodes = mark;
        return 1;
    }
    if (n) {
        grow(&m->cur, &m->cap_cur, n_in);
        cpy(m->cur, in, n_in);
        m->n_cur = n_in;
        m->acc = acc;
    }
    if (m->n_nodes > 65536 && m->n_nodes > 8 * m->n_cur) compact(m);
    return 1;
}

int gram_matcher_accept_bytes(struct gram_matcher *m, const char *s, size_t n)
{
    return run_bytes(m, s, n, 1, NULL);
}

int gram_matcher_try_bytes(struct gram_matcher *m, const char *s, size_t n)
{
    return run_bytes(m, s, n, 0, NULL);
}

int gram_matcher_can_end(const struct gram_matcher *m)
{
    return m->acc;
}

int gram_matcher_is_terminated(const struct gram_matcher *m)
{
    return m->acc && m->n_cur == 0;
}

/* ---- the vocabulary trie ---- */

/* One trie node, 20 bytes: the walk reads them in order. */
struct tnode {
    uint8_t byte;
    uint8_t pad;
    uint16_t depth;
    uint16_t cls; /* byte classes (byte_class) of the bytes in its subtree, itself included */
    uint16_t tok_n;
    int32_t skip;    /* the node after its subtree */
    int32_t tok0;    /* tokens ending before this node in preorder */
    int32_t tok_end; /* and before its subtree's end (t[skip].tok0, kept here: the walk
                        would otherwise read a distant node for every subtree it allows) */
};

/* Byte classes for whole-subtree decisions: digits, a-z, A-Z, space, other printable
 * ASCII, '"', '\', tab/newline/CR, other controls, UTF-8 continuation bytes and the
 * lead bytes of 2-, 3- and 4-byte sequences (and invalid bytes). */
#define N_CLS 14
static int byte_class(unsigned c)
{
    if (c >= '0' && c <= '9') return 0;
    if (c >= 'a' && c <= 'z') return 1;
    if (c >= 'A' && c <= 'Z') return 2;
    if (c == ' ') return 3;
    if (c == '"') return 5;
    if (c == '\\') return 6;
    if (c == '\t' || c == '\n' || c == '\r') return 7;
    if (c < 0x20 || c == 0x7F) return 8;
    if (c < 0x7F) return 4;
    if (c < 0xC0) return 9;
    if (c < 0xE0) return 10;
    if (c < 0xF0) return 11;
    if (c < 0xF8) return 12;
    return 13;
}

struct gram_vocab {
    int32_t n_vocab;
    char *bytes;     /* token bytes, by id (an end-of-sequence tag's too, kept out of the trie) */
    size_t *off;     /* [n_vocab + 1] */
    uint8_t *is_eos; /* [n_vocab] */
    int32_t *eos;
    int n_eos;
    /* the trie in preorder (node 0 the root): the tokens of node i's subtree are
     * order[t[i].tok0 .. t[i].tok_end), its own the first t[i].tok_n of them */
    struct tnode *t; /* [n_nodes + 1] */
    int n_nodes;
    int32_t *order; /* token ids sorted by their bytes */
    int max_depth;
};

static const struct gram_vocab *sort_v;
static int cmp_tok(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = sort_v->off[x + 1] - sort_v->off[x], ly = sort_v->off[y + 1] - sort_v->off[y];
    int c =
        memcmp(sort_v->bytes + sort_v->off[x], sort_v->bytes + sort_v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    return lx != ly ? (lx < ly ? -1 : 1) : (x < y ? -1 : x > y);
}

/* The index of the tag a special token's text is, or -1. */
static int tag_of(const struct tok *t, int32_t id, const char *const *tags)
{
    const char *s = tok_id_to_token(t, id);
    for (int i = 0; s && tags && tags[i]; i++)
        if (!strcmp(s, tags[i])) return i;
    return -1;
}

struct gram_vocab *gram_vocab_create(const struct tok *t, int32_t n_vocab, const int32_t *eos,
                                     int n_eos, const char *const *tags, struct err *e)
{
    if (n_vocab <= 0) return err_set(e, "empty vocabulary"), NULL;
    struct gram_vocab *v = xcalloc(1, sizeof *v);
    v->n_vocab = n_vocab;
    v->off = xcalloc((size_t)n_vocab + 1, sizeof *v->off);
    v->is_eos = xcalloc((size_t)n_vocab, 1);
    v->eos = xmalloc(sizeof *v->eos * (size_t)(n_eos ? n_eos : 1));
    for (int i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && eos[i] < n_vocab) v->is_eos[eos[i]] = 1, v->eos[v->n_eos++] = eos[i];
    size_t cap = 1 << 20, len = 0;
    v->bytes = xmalloc(cap);
    int32_t *ids = xmalloc(sizeof *ids * (size_t)n_vocab);
    int n_ids = 0;
    char tmp[1000]; /* the trie's depth bound (path[] below) */
    for (int32_t id = 0; id < n_vocab; id++) {
        v->off[id] = len;
        if (id >= tok_vocab_size(t)) continue;
        int k = -1, tag = tok_is_special(t, id) ? tag_of(t, id, tags) : -1;
        if (tag >= 0 && strlen(tags[tag]) < sizeof tmp - 1) {
            tmp[0] = GRAM_TAG_MARK;
            k = 1 + (int)strlen(tags[tag]);
            memcpy(tmp + 1, tags[tag], (size_t)k - 1);
        } else if (!v->is_eos[id] && !tok_is_special(t, id)) {
            k = tok_token_bytes(t, id, tmp, sizeof tmp);
            /* the marker byte is never part of UTF-8 text: a token holding it could only
             * spell a tag's marker with ordinary tokens */
            if (k > 0 && memchr(tmp, GRAM_TAG_MARK, (size_t)k)) k = -1;
        }
        if (k <= 0) continue;
        if (len + (size_t)k > cap) v->bytes = xrealloc(v->bytes, cap *= 2);
        memcpy(v->bytes + len, tmp, (size_t)k);
        len += (size_t)k;
        if (!v->is_eos[id]) ids[n_ids++] = id; /* an end tag is read by its id, not the trie */
    }
    v->off[n_vocab] = len;
    sort_v = v;
    qsort(ids, (size_t)n_ids, sizeof *ids, cmp_tok);
    sort_v = NULL;
    /* at most one node per byte of the tokens, plus the root */
    size_t cap_n = len + 2;
    struct tnode *tr = xcalloc(cap_n, sizeof *tr);
    int32_t *parent = xmalloc(sizeof *parent * cap_n);
    v->order = ids;
    int32_t path[1025]; /* node at each depth of the current path */
    int n = 1, depth = 0;
    path[0] = 0;
    const char *prev = NULL;
    size_t prev_len = 0;
    for (int i = 0; i < n_ids; i++) {
        const char *s = v->bytes + v->off[ids[i]];
        size_t l = v->off[ids[i] + 1] - v->off[ids[i]];
        size_t common = 0;
        while (prev && common < l && common < prev_len && s[common] == prev[common]) common++;
        while (depth > (int)common) tr[path[depth--]].skip = n; /* close nodes off the path */
        for (size_t k = common; k < l; k++) {
            tr[n].byte = (uint8_t)s[k];
            tr[n].depth = (uint16_t)(k + 1);
            parent[n] = path[depth];
            path[++depth] = n++;
        }
        /* sorted: tokens with the same bytes are adjacent, and come before the tokens they
         * are a prefix of, so preorder numbers the tokens in this order */
        tr[path[depth]].tok_n++;
        if (l > (size_t)v->max_depth) v->max_depth = (int)l;
        prev = s, prev_len = l;
    }
    while (depth > 0) tr[path[depth--]].skip = n;
    tr[0].skip = n;
    tr[n].skip = n;
    int32_t base = 0;
    for (int j = 0; j <= n; j++) {
        tr[j].tok0 = base;
        if (j < n) base += tr[j].tok_n;
    }
    for (int j = 0; j <= n; j++) tr[j].tok_end = tr[tr[j].skip].tok0;
    for (int j = n - 1; j >= 1; j--) {
        tr[j].cls |= (uint16_t)(1u << byte_class(tr[j].byte));
        tr[parent[j]].cls |= tr[j].cls;
    }
    free(parent);
    v->t = tr;
    v->n_nodes = n;
    return v;
}

void gram_vocab_destroy(struct gram_vocab *v)
{
    if (!v) return;
    free(v->bytes), free(v->off), free(v->is_eos), free(v->eos);
    free(v->t), free(v->order);
    free(v);
}

int32_t gram_vocab_size(const struct gram_vocab *v)
{
    return v->n_vocab;
}

const char *gram_vocab_token(const struct gram_vocab *v, int32_t id, size_t *len)
{
    *len = 0;
    if (id < 0 || id >= v->n_vocab || v->off[id + 1] == v->off[id]) return NULL;
    *len = v->off[id + 1] - v->off[id];
    return v->bytes + v->off[id];
}

int gram_matcher_accept_token(struct gram_matcher *m, const struct gram_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n_vocab) return 0;
    size_t len;
    if (v->is_eos[id]) { /* an end tag whose text the grammar still expects reads it */
        if (m->acc) return 1;
        const char *s = gram_vocab_token(v, id, &len);
        int end = 0;
        if (!s || !run_bytes(m, s, len, 0, &end) || !end) return 0;
        return run_bytes(m, s, len, 1, NULL);
    }
    const char *s = gram_vocab_token(v, id, &len);
    return s ? gram_matcher_accept_bytes(m, s, len) : 0;
}

/* ---- masks ---- */

/*
 * Masks are cached in the grammar by state: the state's stacks, sorted by hash, written
 * out as their positions top to bottom. Entries are only added (up to a bound), so a
 * grammar used by many requests (the server's compile cache) soon answers every step of a
 * JSON schema from the cache: a non-recursive schema has finitely many states. A new entry
 * keeps the mask as the token sets it joins (the positions' sets, which live as long as
 * the cache) and the few tokens accepted beyond them: a few hundred bytes, where a 16 KB
 * copy would touch fresh memory on the step that first meets the state; the state's
 * second visit makes the copy, and later ones read it.
 */
#define CACHE_MAX 4096

struct gpos;
struct centry {
    uint64_t h;
    int32_t *key; /* [klen], then the extra ids */
    int klen;
    struct gpos **sets;
    int n_sets, n_extra;
    uint32_t *mask; /* the whole mask, from the state's second visit on */
};

/* A position's token sets are computed with the stack's top frame and an unknown stack
 * below; where that leaves more than DEEPEN_UNC tokens uncertain, with the frame below too
 * (the tokens that leave the top frame's rule are mostly judged there), and so on, up to
 * GCTX frames. */
#define GCTX       8
#define DEEPEN_UNC 16

/* A position's token sets (see build_mask). */
struct gpos {
    int32_t p[GCTX];   /* the positions of a stack's top frames, top first (-1: none) */
    struct gpos *base; /* the entry of one frame less: its accepted tokens are these too */
    int deeper;        /* entries one frame deeper exist (or are to be made) */
    int done;
    uint32_t *acc_mask; /* accepted as a bitmask, or */
    int32_t *acc;       /* as a list of ids, whichever is smaller */
    int n_acc;
    uint32_t *unc_mask; /* uncertain tokens as indices into v->order: a bitmask, or */
    int32_t *unc;       /* an ascending list, whichever is smaller */
    int n_unc;
};

struct gram_cache {
    const struct gram_vocab *v;
    struct centry *t; /* open addressing, [cap] */
    int n, cap;
    struct gpos **pt; /* token sets by the positions of a stack's top two frames: open
                         addressing, [cap_pt] */
    int n_pt, cap_pt;
    int prepared;            /* every position's sets are in pt (gram_prepare) */
    struct gram_cache *next; /* the cache of another vocabulary */
};

void gram_cache_free(struct gram_cache *c)
{
    if (!c) return;
    gram_cache_free(c->next);
    for (int i = 0; i < c->cap; i++)
        if (c->t[i].key) free(c->t[i].key), free(c->t[i].sets), free(c->t[i].mask);
    for (int i = 0; i < c->cap_pt; i++)
        if (c->pt[i])
            free(c->pt[i]->acc_mask), free(c->pt[i]->acc), free(c->pt[i]->unc),
                free(c->pt[i]->unc_mask), free(c->pt[i]);
    free(c->pt);
    free(c->t);
    free(c);
}

static int cmp_u64_node(const void *a, const void *b, void *ctx)
{
    const struct gram_matcher *m = ctx;
    uint64_t x = m->nodes[*(const int32_t *)a].h, y = m->nodes[*(const int32_t *)b].h;
    return x < y ? -1 : x > y;
}

/* The state's key in m->key; returns its length. */
static int state_key(struct gram_matcher *m, uint64_t *h)
{
    qsort_r(m->cur, (size_t)m->n_cur, sizeof *m->cur, cmp_u64_node, m);
    int k = 0;
    for (int i = 0; i < m->n_cur; i++) {
        for (int32_t f = m->cur[i]; f >= 0; f = m->nodes[f].parent) {
            grow(&m->key, &m->cap_key, k + 2);
            m->key[k++] = m->nodes[f].pos;
        }
        grow(&m->key, &m->cap_key, k + 2);
        m->key[k++] = -1;
    }
    grow(&m->key, &m->cap_key, k + 1);
    m->key[k++] = m->acc;
    uint64_t x = H0;
    for (int i = 0; i < k; i++) x = mix(x, m->key[i]);
    *h = x;
    return k;
}

/*
 * The walk's states: each distinct set of stacks met during one walk, interned, with its
 * transitions filled in as bytes are tried. The trie has hundreds of thousands of nodes but
 * a walk meets few distinct states (inside a JSON string, nearly every byte leads back to
 * the same one), so most nodes cost a table lookup instead of a matcher step.
 */
struct wstate {
    int32_t off, n; /* stacks: m->buf[off .. off + n) */
    int acc;
    uint64_t h;
    int32_t trans;    /* index of its [256] transitions in m->trans, -1 until needed */
    uint16_t loops;   /* byte classes every byte of which leads back to this state */
    int visits;       /* trie nodes tried from it */
    struct gbset adm; /* the bytes its stacks' tops admit: any other byte is dead */
};

/* A state tried this often gets its looping classes worked out (up to 256 steps): worth it
 * for the few states a walk spends most of its nodes in, such as inside a string. */
#define LOOP_AFTER 64

#define T_UNKNOWN (-2)
#define T_DEAD    (-1)

static int cmp_h(const void *a, const void *b, void *ctx)
{
    const struct gram_matcher *m = ctx;
    uint64_t x = m->nodes[*(const int32_t *)a].h, y = m->nodes[*(const int32_t *)b].h;
    return x < y ? -1 : x > y;
}

/* The walk state of stacks s[0..n) + acc (sorted in place), added when new. */
static int32_t intern(struct gram_matcher *m, int32_t *s, int n, int acc)
{
    if (n > 1) qsort_r(s, (size_t)n, sizeof *s, cmp_h, m);
    uint64_t h = mix(H0, acc);
    for (int i = 0; i < n; i++) h = mix(h ^ m->nodes[s[i]].h, 0);
    int cap = m->cap_wtab;
    for (int32_t i = (int32_t)(h & (uint64_t)(cap - 1));; i = (i + 1) & (cap - 1)) {
        int32_t w = m->wtab[i];
        if (w < 0) {
            if (2 * (m->n_ws + 1) > cap) break; /* grow below, then insert */
            grow(&m->buf, &m->cap_buf, m->n_buf + n);
            cpy(m->buf + m->n_buf, s, n);
            if (m->n_ws == m->cap_ws) {
                m->cap_ws = m->cap_ws ? 2 * m->cap_ws : 64;
                m->ws = xrealloc(m->ws, sizeof *m->ws * (size_t)m->cap_ws);
            }
            struct wstate *x = &m->ws[m->n_ws];
            *x = (struct wstate){m->n_buf, n, acc, h, -1, 0, 0, {{0}}};
            for (int k = 0; k < n; k++) {
                const struct gbset *set = &m->g->sets[GSYM_ID(m->g->syms[m->nodes[s[k]].pos])];
                for (int b = 0; b < 8; b++) x->adm.w[b] |= set->w[b];
            }
            m->n_buf += n;
            m->wtab[i] = m->n_ws;
            return m->n_ws++;
        }
        const struct wstate *x = &m->ws[w];
        if (x->h != h || x->n != n || x->acc != acc) continue;
        int eq = 1;
        for (int k = 0; k < n && eq; k++) eq = same(m, m->buf[x->off + k], s[k]);
        if (eq) return w;
    }
    /* the table is half full: double it and rehash */
    int ncap = cap * 2;
    int32_t *t = xmalloc(sizeof *t * (size_t)ncap);
    for (int i = 0; i < ncap; i++) t[i] = -1;
    for (int w = 0; w < m->n_ws; w++) {
        int32_t i = (int32_t)(m->ws[w].h & (uint64_t)(ncap - 1));
        while (t[i] >= 0) i = (i + 1) & (ncap - 1);
        t[i] = w;
    }
    free(m->wtab);
    m->wtab = t;
    m->cap_wtab = ncap;
    return intern(m, s, n, acc);
}

/* The state after byte c from walk state w, or T_DEAD. */
static int32_t transition(struct gram_matcher *m, int32_t w, unsigned c)
{
    if (!(m->ws[w].adm.w[c >> 5] >> (c & 31) & 1)) return T_DEAD;
    if (m->ws[w].trans < 0) {
        grow(&m->trans, &m->cap_trans, m->n_trans + 256);
        for (int k = 0; k < 256; k++) m->trans[m->n_trans + k] = T_UNKNOWN;
        m->ws[w].trans = m->n_trans;
        m->n_trans += 256;
    }
    int32_t *t = &m->trans[m->ws[w].trans + (int)c];
    if (*t != T_UNKNOWN) return *t;
    /* step reads the stacks from buf, which intern may move: copy them out first */
    int n = m->ws[w].n;
    grow(&m->tmp, &m->cap_tmp, n);
    cpy(m->tmp, m->buf + m->ws[w].off, n);
    step(m, m->tmp, n, c);
    int32_t r = !m->n_out && !m->out_acc ? T_DEAD : intern(m, m->out, m->n_out, m->out_acc);
    m->trans[m->ws[w].trans + (int)c] = r;
    return r;
}

/* The byte classes of walk state w that loop: one byte of each class is tried first, and
 * only the classes whose first byte loops are tried whole (a state that loops on no class,
 * such as one inside a UTF-8 sequence, costs N_CLS steps, not 256). */
static void loops_of(struct gram_matcher *m, int32_t w)
{
    uint16_t seen = 0, bad = 0;
    for (unsigned c = 0; c < 256; c++) {
        int k = byte_class(c);
        if (seen >> k & 1) continue;
        seen |= (uint16_t)(1u << k);
        if (transition(m, w, c) != w) bad |= (uint16_t)(1u << k);
    }
    for (unsigned c = 0; c < 256; c++)
        if (!(bad >> byte_class(c) & 1) && transition(m, w, c) != w)
            bad |= (uint16_t)(1u << byte_class(c));
    m->ws[w].loops = (uint16_t)(~bad & ((1u << N_CLS) - 1));
}

/*
 * Masks are built from per-position token sets (the split XGrammar makes). A stack's top is
 * a position in one alternative; the stack below it only matters once a token's bytes run
 * past the end of that alternative. So for each position the trie is walked once with an
 * unknown stack below (a parent marked SENT), sorting every token into
 *   accepted:  some path takes all its bytes without leaving the alternative;
 *   uncertain: not accepted, but some path leaves the alternative (pops into the unknown
 *              stack) before or right after its last byte;
 *   rejected:  the rest.
 * Where many tokens stay uncertain (inside a JSON string the char rule ends after one byte,
 * and what a closing quote may bring is decided frames further down), the frame below is
 * added and only those tokens are walked again, frame by frame (GCTX, DEEPEN_UNC): a token
 * accepted or rejected under some frames stays so under any frames below them. These sets
 * depend on the grammar and the vocabulary only: gram_prepare computes them for every
 * position and every frame that can lie below it, ahead of the first mask, and a position
 * met that was not prepared gets them when first met; either way they are kept in the
 * grammar for every later state and request. A state's mask is then the union of its
 * stacks' accepted sets and those of their uncertain tokens that the stacks they came from
 * accept, tried in trie order so shared prefixes are stepped once.
 */
#define SENT (-2)

/* Resets the walk's tables and interns the stacks s[0..n) + acc as the walk's first state. */
static int32_t walk_begin(struct gram_matcher *m, const struct gram_vocab *v, const int32_t *s,
                          int n, int acc)
{
    grow(&m->lv, &m->cap_lv, v->max_depth + 1);
    m->n_ws = m->n_buf = m->n_trans = 0;
    if (!m->wtab) {
        m->cap_wtab = 256;
        m->wtab = xmalloc(sizeof *m->wtab * (size_t)m->cap_wtab);
    }
    for (int i = 0; i < m->cap_wtab; i++) m->wtab[i] = -1;
    grow(&m->tmp, &m->cap_tmp, n);
    cpy(m->tmp, s, n);
    return intern(m, m->tmp, n, acc);
}

static void unc_add_range(int32_t **u, int *n, int *cap, int32_t a, int32_t b)
{
    if (a >= b) return;
    grow(u, cap, *n + (b - a));
    for (int32_t k = a; k < b; k++) (*u)[(*n)++] = k;
}

/* Appends the candidates cand[j..n) in a..b (indices into v->order) to *u, or, without
 * candidates, all of a..b. */
static void add_range(int32_t **u, int *nu, int *cap, const int32_t *cand, int n, int j, int32_t a,
                      int32_t b)
{
    if (!cand) {
        unc_add_range(u, nu, cap, a, b);
        return;
    }
    while (j < n && cand[j] < a) j++;
    for (; j < n && cand[j] < b; j++) {
        grow(u, cap, *nu + 1);
        (*u)[(*nu)++] = cand[j];
    }
}

/*
 * The token sets of the stack p[0..depth) with an unknown stack below (SENT), walking the
 * trie in preorder and skipping the subtree below the first rejected byte. In this walk a
 * state's acc flag means the step into it popped past the bottom frame's alternative. With
 * base (the entry of p[0..depth - 1)), only base's uncertain tokens are walked: the tokens
 * its stack accepted or rejected are accepted or rejected under any frame below it too.
 * Cost: a transition lookup per trie node visited, a matcher step per distinct (state,
 * byte) pair.
 */
static void walk_pos(struct gram_matcher *m, const struct gram_vocab *v, const int32_t *p,
                     int depth, struct gpos *base, struct gpos *out)
{
    const struct gbset *follow = m->g->follow;
    const int32_t *pos_rule = m->g->pos_rule;
    int words = (v->n_vocab + 31) / 32;
    /* the candidates: base's uncertain tokens, ascending */
    int32_t *cand = NULL;
    int n_cand = 0, j = 0;
    if (base) {
        if (base->unc_mask) {
            cand = xmalloc(sizeof *cand * (size_t)(base->n_unc ? base->n_unc : 1));
            for (int w = 0; w < words; w++)
                for (uint32_t x = base->unc_mask[w]; x; x &= x - 1)
                    cand[n_cand++] = w * 32 + __builtin_ctz(x);
        } else {
            cand = base->unc;
            n_cand = base->n_unc;
        }
    }
    uint32_t *mask = base ? NULL : xcalloc((size_t)words, sizeof *mask);
    int32_t *unc = NULL, *acc = NULL;
    int n_unc = 0, cap_unc = 0, n_acc = 0, cap_acc = 0;
    int mark = m->n_nodes;
    int32_t top = SENT;
    for (int k = depth - 1; k >= 0; k--) top = node_new(m, p[k], top);
    walk_begin(m, v, &top, 1, 0);
    int32_t *lv = m->lv;
    lv[0] = 0;
    /* pend[d]: some path to trie depth d has just left the alternative (the next byte must
     * be able to follow its rule); out[d]: some path has left it and taken such a byte, so
     * the rest of the token is the unknown stack's to judge */
    uint8_t *pend = xcalloc((size_t)v->max_depth + 1, 1);
    uint8_t *out_ = xcalloc((size_t)v->max_depth + 1, 1);
    const struct gbset *fol = &follow[pos_rule[p[depth - 1]]];
    const struct tnode *tn = v->t;
    for (int i = 1; i < v->n_nodes;) {
        const struct tnode *x = &tn[i];
        if (base) { /* only subtrees holding candidates */
            while (j < n_cand && cand[j] < x->tok0) j++;
            if (j == n_cand) break;
            if (cand[j] >= x->tok_end) {
                i = x->skip;
                continue;
            }
        }
        int d = x->depth;
        struct wstate *up = &m->ws[lv[d - 1]];
        /* every byte below stays in this state (which has stacks): all accepted */
        if (!base && !(x->cls & ~up->loops)) {
            for (int32_t k = x->tok0; k < x->tok_end; k++) {
                int32_t id = v->order[k];
                mask[id >> 5] |= 1u << (id & 31);
            }
            n_acc += x->tok_end - x->tok0;
            i = x->skip;
            continue;
        }
        int ctx = out_[d - 1] || (pend[d - 1] && (fol->w[x->byte >> 5] >> (x->byte & 31) & 1));
        if (!base && up->n && ++up->visits == LOOP_AFTER) loops_of(m, lv[d - 1]);
        int32_t t = transition(m, lv[d - 1], x->byte);
        if (t == T_DEAD) {
            if (ctx) add_range(&unc, &n_unc, &cap_unc, cand, n_cand, j, x->tok0, x->tok_end);
            i = x->skip;
            continue;
        }
        /* tokens ending here: taken inside the alternative, or left to the stack below
         * (this step popped, or an earlier pop took this byte) */
        if (m->ws[t].n > 0) {
            if (base) {
                add_range(&acc, &n_acc, &cap_acc, cand, n_cand, j, x->tok0, x->tok0 + x->tok_n);
            } else {
                for (int k = 0; k < x->tok_n; k++) {
                    int32_t id = v->order[x->tok0 + k];
                    mask[id >> 5] |= 1u << (id & 31);
                }
                n_acc += x->tok_n;
            }
        } else {
            add_range(&unc, &n_unc, &cap_unc, cand, n_cand, j, x->tok0, x->tok0 + x->tok_n);
        }
        pend[d] = (uint8_t)m->ws[t].acc;
        out_[d] = (uint8_t)ctx;
        lv[d] = t;
        i++;
    }
    free(pend), free(out_);
    if (base && base->unc_mask) free(cand);
    m->n_nodes = mark;
    if (base) { /* indices into v->order: to ids */
        for (int k = 0; k < n_acc; k++) acc[k] = v->order[acc[k]];
        if (n_acc >= words / 8) {
            mask = xcalloc((size_t)words, sizeof *mask);
            for (int k = 0; k < n_acc; k++) mask[acc[k] >> 5] |= 1u << (acc[k] & 31);
            free(acc);
            out->acc_mask = mask;
        } else {
            out->acc = acc ? acc : xmalloc(sizeof *acc);
        }
        out->n_acc = n_acc;
    } else if (n_acc < words / 8) { /* the list is shorter to apply */
        out->acc = xmalloc(sizeof *out->acc * (size_t)(n_acc ? n_acc : 1));
        for (int w = 0; w < words; w++)
            for (uint32_t b = mask[w]; b; b &= b - 1)
                out->acc[out->n_acc++] = w * 32 + __builtin_ctz(b);
        free(mask);
    } else {
        out->acc_mask = mask;
        out->n_acc = n_acc;
    }
    if (n_unc >= words) {
        out->unc_mask = xcalloc((size_t)words, sizeof *out->unc_mask);
        for (int k = 0; k < n_unc; k++) out->unc_mask[unc[k] >> 5] |= 1u << (unc[k] & 31);
        free(unc);
    } else {
        out->unc = unc;
    }
    out->n_unc = n_unc;
    for (int k = 0; k < GCTX; k++) out->p[k] = k < depth ? p[k] : -1;
    out->base = base;
    out->deeper = n_unc > DEEPEN_UNC && depth < GCTX;
    out->done = 1;
}

/* Sets the bits of the tokens in cand[0..n) (indices into v->order, ascending) whose bytes
 * the stacks s[0..ns) accept: a walk of the trie from those stacks that enters only
 * subtrees holding candidates and leaves one at its first rejected byte. */
static void verify(struct gram_matcher *m, const struct gram_vocab *v, const int32_t *s, int ns,
                   const int32_t *cand, int n, uint32_t *mask)
{
    if (!n) return;
    int base = m->n_nodes;
    walk_begin(m, v, s, ns, 0);
    int32_t *lv = m->lv;
    lv[0] = 0;
    const struct tnode *tn = v->t;
    int j = 0;
    for (int i = 1; i < v->n_nodes && j < n;) {
        const struct tnode *x = &tn[i];
        while (j < n && cand[j] < x->tok0) j++;
        if (j == n) break;
        if (cand[j] >= x->tok_end) {
            i = x->skip;
            continue;
        }
        struct wstate *up = &m->ws[lv[x->depth - 1]];
        if (!(x->cls & ~up->loops)) { /* the whole subtree is accepted */
            for (; j < n && cand[j] < x->tok_end; j++) {
                int32_t id = v->order[cand[j]];
                mask[id >> 5] |= 1u << (id & 31);
            }
            i = x->skip;
            continue;
        }
        int32_t t = transition(m, lv[x->depth - 1], x->byte);
        if (t == T_DEAD) {
            i = x->skip;
            continue;
        }
        for (; j < n && cand[j] < x->tok0 + x->tok_n; j++) {
            int32_t id = v->order[cand[j]];
            mask[id >> 5] |= 1u << (id & 31);
        }
        if (m->ws[t].n == 0) { /* complete: no byte may follow */
            i = x->skip;
            continue;
        }
        lv[x->depth] = t;
        i++;
    }
    m->n_nodes = base;
}

static int set_or(struct gbset *d, const struct gbset *x)
{
    int ch = 0;
    for (int i = 0; i < 8; i++) {
        uint32_t w = d->w[i] | x->w[i];
        ch |= w != d->w[i];
        d->w[i] = w;
    }
    return ch;
}

/* g->pos_rule, and g->follow: the FOLLOW sets of the rules over bytes (with FIRST and
 * nullability on the way), iterated to a fixed point. The end of the grammar adds no
 * byte. Called under g->mu. */
static void make_follow(struct gram *g)
{
    if (g->follow) return;
    int R = g->n_rules;
    int32_t *pr = xmalloc(sizeof *pr * (size_t)(g->n_syms ? g->n_syms : 1));
    for (int r = 0; r < R; r++)
        for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            for (int p = g->alt_pos[a];; p++) {
                pr[p] = r;
                if (g->syms[p] == GSYM_END) break;
            }
    struct gbset *first = xcalloc((size_t)R, sizeof *first);
    struct gbset *fol = xcalloc((size_t)R, sizeof *fol);
    uint8_t *nul = xcalloc((size_t)R, 1);
    for (int ch = 1; ch;) {
        ch = 0;
        for (int r = 0; r < R; r++)
            for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                int p = g->alt_pos[a];
                for (;; p++) {
                    int32_t s = g->syms[p];
                    if (s == GSYM_END) break;
                    if (!GSYM_IS_RULE(s)) {
                        ch |= set_or(&first[r], &g->sets[GSYM_ID(s)]);
                        break;
                    }
                    ch |= set_or(&first[r], &first[GSYM_ID(s)]);
                    if (!nul[GSYM_ID(s)]) break;
                }
                if (g->syms[p] == GSYM_END && !nul[r]) nul[r] = 1, ch = 1;
            }
    }
    for (int ch = 1; ch;) {
        ch = 0;
        for (int r = 0; r < R; r++)
            for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
                for (int p = g->alt_pos[a]; g->syms[p] != GSYM_END; p++) {
                    int32_t s = g->syms[p];
                    if (!GSYM_IS_RULE(s)) continue;
                    struct gbset *f = &fol[GSYM_ID(s)];
                    int q = p + 1;
                    for (;; q++) { /* FIRST of what follows, and FOLLOW(r) if it may be empty */
                        int32_t t = g->syms[q];
                        if (t == GSYM_END) {
                            ch |= set_or(f, &fol[r]);
                            break;
                        }
                        if (!GSYM_IS_RULE(t)) {
                            ch |= set_or(f, &g->sets[GSYM_ID(t)]);
                            break;
                        }
                        ch |= set_or(f, &first[GSYM_ID(t)]);
                        if (!nul[GSYM_ID(t)]) break;
                    }
                }
    }
    free(first), free(nul);
    g->pos_rule = pr;
    g->follow = fol;
}

/* The grammar's cache for v, made when new. Caches are kept per vocabulary until the
 * grammar is freed, so the token sets a mask is built from stay put. Called under g->mu. */
static struct gram_cache *cache_for(struct gram *g, const struct gram_vocab *v)
{
    struct gram_cache *c = g->cache;
    while (c && c->v != v) c = c->next;
    if (!c) {
        c = xcalloc(1, sizeof *c);
        c->v = v;
        c->cap = 64; /* grows: a table sized for CACHE_MAX at once would be touched for the
                        first time, page by page, by the first request's steps */
        c->t = xcalloc((size_t)c->cap, sizeof *c->t);
        c->cap_pt = 256;
        c->pt = xcalloc((size_t)c->cap_pt, sizeof *c->pt);
        c->next = g->cache;
        g->cache = c;
    }
    return c;
}

static uint32_t pt_hash(const int32_t *p)
{
    uint64_t h = H0;
    for (int k = 0; k < GCTX; k++) h = mix(h, p[k]);
    return (uint32_t)(h >> 32);
}

/* The entry of positions p[GCTX] in c, NULL when absent; adds fresh (taking its arrays)
 * when given. */
static struct gpos *pt_get(struct gram_cache *c, const int32_t *p, struct gpos *fresh)
{
    uint32_t i = pt_hash(p) & (uint32_t)(c->cap_pt - 1);
    for (; c->pt[i]; i = (i + 1) & (uint32_t)(c->cap_pt - 1))
        if (!memcmp(c->pt[i]->p, p, sizeof c->pt[i]->p)) return c->pt[i];
    if (!fresh) return NULL;
    if (2 * (c->n_pt + 1) > c->cap_pt) {
        int cap = c->cap_pt * 2;
        struct gpos **t = xcalloc((size_t)cap, sizeof *t);
        for (int k = 0; k < c->cap_pt; k++)
            if (c->pt[k]) {
                uint32_t j = pt_hash(c->pt[k]->p) & (uint32_t)(cap - 1);
                while (t[j]) j = (j + 1) & (uint32_t)(cap - 1);
                t[j] = c->pt[k];
            }
        free(c->pt);
        c->pt = t;
        c->cap_pt = cap;
        return pt_get(c, p, fresh);
    }
    c->pt[i] = xmalloc(sizeof *c->pt[i]);
    *c->pt[i] = *fresh;
    c->n_pt++;
    return c->pt[i];
}

/* mask |= the tokens e accepts (its own and its base's) */
static void apply_set(uint32_t *mask, int words, const struct gpos *e)
{
    for (; e; e = e->base)
        if (e->acc_mask)
            for (int w = 0; w < words; w++) mask[w] |= e->acc_mask[w];
        else
            for (int k = 0; k < e->n_acc; k++) mask[e->acc[k] >> 5] |= 1u << (e->acc[k] & 31);
}

static void grow_ptr(struct gpos ***p, int *cap, int need)
{
    if (need <= *cap) return;
    while (*cap < need) *cap = *cap ? *cap * 2 : 16;
    *p = xrealloc(*p, sizeof **p * (size_t)*cap);
}

/* The positions of stack n's top GCTX frames, -1 past its bottom. */
static void top_positions(const struct gram_matcher *m, int32_t n, int32_t *p)
{
    for (int k = 0; k < GCTX; k++) {
        p[k] = n >= 0 ? m->nodes[n].pos : -1;
        if (n >= 0) n = m->nodes[n].parent;
    }
}

/* The entry of the frames p[0..depth) in c (base: that of p[0..depth - 1)), computed
 * when new. */
static struct gpos *entry(struct gram_matcher *m, const struct gram_vocab *v, struct gram_cache *c,
                          const int32_t *p, int depth, struct gpos *base)
{
    struct gram *g = m->g;
    int32_t key[GCTX];
    for (int k = 0; k < GCTX; k++) key[k] = k < depth ? p[k] : -1;
    pthread_mutex_lock(&g->mu);
    struct gpos *e = pt_get(c, key, NULL);
    pthread_mutex_unlock(&g->mu);
    if (e) return e;
    struct gpos fresh = {0};
    walk_pos(m, v, key, depth, base, &fresh);
    pthread_mutex_lock(&g->mu);
    e = pt_get(c, key, NULL);
    if (!e) e = pt_get(c, key, &fresh), fresh.done = 0;
    pthread_mutex_unlock(&g->mu);
    if (fresh.done) free(fresh.acc), free(fresh.acc_mask), free(fresh.unc), free(fresh.unc_mask);
    return e;
}

/* The deepest entry for stack n: one frame more while an entry asks for it. */
static struct gpos *stack_entry(struct gram_matcher *m, const struct gram_vocab *v,
                                struct gram_cache *c, int32_t n)
{
    int32_t p[GCTX];
    top_positions(m, n, p);
    struct gpos *e = entry(m, v, c, p, 1, NULL);
    for (int d = 1; e->deeper && d < GCTX && p[d] >= 0; d++) e = entry(m, v, c, p, d + 1, e);
    return e;
}

/* A state's mask from its stacks' token sets (computed here when new). The stacks are
 * grouped by their entries; each entry's accepted set joins the mask, and its uncertain
 * tokens that no set accepted are checked against that group's stacks only (a state
 * accepts a token when one of its stacks does). */
static void build_mask(struct gram_matcher *m, const struct gram_vocab *v, uint32_t *mask)
{
    struct gram *g = m->g;
    int words = (v->n_vocab + 31) / 32;
    memset(mask, 0, sizeof *mask * (size_t)words);
    m->n_used = m->n_extra = 0;
    pthread_mutex_lock(&g->mu);
    make_follow(g);
    struct gram_cache *c = cache_for(g, v);
    pthread_mutex_unlock(&g->mu);
    grow(&m->cand, &m->cap_cand, m->n_cur);
    int32_t *group = m->cand; /* of each stack: its entry's index in m->used */
    for (int i = 0; i < m->n_cur; i++) {
        struct gpos *e = stack_entry(m, v, c, m->cur[i]);
        group[i] = -1;
        for (int k = 0; k < m->n_used && group[i] < 0; k++)
            if (m->used[k] == e) group[i] = k;
        if (group[i] >= 0) continue;
        group[i] = m->n_used;
        apply_set(mask, words, e);
        grow_ptr(&m->used, &m->cap_used, m->n_used + 1);
        m->used[m->n_used++] = e;
    }
    for (int k = 0; k < m->n_used; k++) {
        const struct gpos *e = m->used[k];
        if (!e->n_unc) continue;
        int n_stk = 0;
        grow(&m->tmp2, &m->cap_tmp2, m->n_cur);
        for (int i = 0; i < m->n_cur; i++)
            if (group[i] == k) m->tmp2[n_stk++] = m->cur[i];
        int n = 0; /* in order, and not accepted already */
        grow(&m->cand2, &m->cap_cand2, e->n_unc);
        if (e->unc_mask) {
            for (int w = 0; w < words; w++)
                for (uint32_t x = e->unc_mask[w]; x; x &= x - 1) {
                    int32_t t = w * 32 + __builtin_ctz(x), id = v->order[t];
                    if (!(mask[id >> 5] >> (id & 31) & 1)) m->cand2[n++] = t;
                }
        } else {
            for (int j = 0; j < e->n_unc; j++) {
                int32_t id = v->order[e->unc[j]];
                if (!(mask[id >> 5] >> (id & 31) & 1)) m->cand2[n++] = e->unc[j];
            }
        }
        verify(m, v, m->tmp2, n_stk, m->cand2, n, mask);
        for (int j = 0; j < n; j++) {
            int32_t id = v->order[m->cand2[j]];
            if (mask[id >> 5] >> (id & 31) & 1) {
                grow(&m->extra, &m->cap_extra, m->n_extra + 1);
                m->extra[m->n_extra++] = id;
            }
        }
    }
    for (int i = 0; i < v->n_eos; i++) {
        size_t len;
        const char *s = gram_vocab_token(v, v->eos[i], &len);
        int end = m->acc;
        if (!end && s) end = run_bytes(m, s, len, 0, &end) && end;
        if (end) {
            mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
            grow(&m->extra, &m->cap_extra, m->n_extra + 1);
            m->extra[m->n_extra++] = v->eos[i];
        }
    }
}

/* A growing set of int32 (linear membership: the lists here are short). */
struct iset {
    int32_t *v;
    int n, cap;
};

static int iset_add(struct iset *l, int32_t x)
{
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == x) return 0;
    grow(&l->v, &l->cap, l->n + 1);
    l->v[l->n++] = x;
    return 1;
}

/*
 * The frames that can lie below a frame in rule r, by r: the position after a call of r
 * (r called in tail position returns where its caller does), or -1 at the bottom; and in
 * *pos the byte sets of the rules reachable from the root (*n_pos of them). Called under
 * g->mu after make_follow.
 */
static struct iset *returns_of(const struct gram *g, int32_t **pos, int *n_pos)
{
    int R = g->n_rules;
    struct iset *ret = xcalloc((size_t)R, sizeof *ret);
    uint8_t *seen = xcalloc((size_t)R, 1);
    int32_t *queue = xmalloc(sizeof *queue * (size_t)R), *tail = NULL;
    int nq = 0, n_tail = 0, cap_tail = 0;
    queue[nq++] = g->root;
    seen[g->root] = 1;
    iset_add(&ret[g->root], -1);
    for (int k = 0; k < nq; k++) { /* reachable rules, their calls' return positions */
        int r = queue[k];
        for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            for (int p = g->alt_pos[a]; g->syms[p] != GSYM_END; p++) {
                if (!GSYM_IS_RULE(g->syms[p])) continue;
                int32_t c = GSYM_ID(g->syms[p]);
                if (g->syms[p + 1] != GSYM_END) {
                    iset_add(&ret[c], p + 1);
                } else {
                    grow(&tail, &cap_tail, n_tail + 2);
                    tail[n_tail++] = r;
                    tail[n_tail++] = c;
                }
                if (!seen[c]) seen[c] = 1, queue[nq++] = c;
            }
    }
    for (int ch = 1; ch;) { /* a tail call returns wherever its caller does */
        ch = 0;
        for (int i = 0; i < n_tail; i += 2)
            for (int k = 0; k < ret[tail[i]].n; k++)
                ch |= iset_add(&ret[tail[i + 1]], ret[tail[i]].v[k]);
    }
    int32_t *out = NULL;
    int n = 0, cap = 0;
    for (int k = 0; k < nq; k++)
        for (int a = g->rule_alt[queue[k]]; a < g->rule_alt[queue[k] + 1]; a++)
            for (int p = g->alt_pos[a]; g->syms[p] != GSYM_END; p++)
                if (!GSYM_IS_RULE(g->syms[p])) {
                    grow(&out, &cap, n + 1);
                    out[n++] = p;
                }
    free(seen), free(queue), free(tail);
    *pos = out;
    *n_pos = n;
    return ret;
}

/* The entries one frame deeper than e (of p[0..depth)) for every frame that can lie below,
 * and theirs, as far as they ask for it. */
static void prepare_below(struct gram_matcher *m, const struct gram_vocab *v, struct gram_cache *c,
                          const struct iset *ret, int32_t *p, int depth, struct gpos *e, int *left)
{
    if (!e->deeper) return;
    const struct iset *below = &ret[m->g->pos_rule[p[depth - 1]]];
    for (int j = 0; j<below->n && * left> 0; j++) {
        if (below->v[j] < 0) continue; /* the bottom: e itself serves */
        p[depth] = below->v[j];
        --*left;
        prepare_below(m, v, c, ret, p, depth + 1, entry(m, v, c, p, depth + 1, e), left);
    }
}

#define PREPARE_DEEP_MAX 65536

int gram_prepare(struct gram *g, const struct gram_vocab *v)
{
    pthread_mutex_lock(&g->mu);
    make_follow(g);
    struct gram_cache *c = cache_for(g, v);
    if (c->prepared) {
        pthread_mutex_unlock(&g->mu);
        return 0;
    }
    int32_t *pos;
    int n_pos;
    struct iset *ret = returns_of(g, &pos, &n_pos);
    int before = c->n_pt;
    pthread_mutex_unlock(&g->mu);
    /* bounds: the compile timeout, and PREPARE_DEEP_MAX entries below the top frame (frames
     * whose rules are called from many places multiply); what is left is made when met */
    int ms = gram_compile_timeout(), i = 0, left = PREPARE_DEEP_MAX;
    double deadline = util_now() + 1e-3 * ms;
    struct gram_matcher *m = gram_matcher_create(g);
    for (; i < n_pos && !(ms && util_now() > deadline); i++) {
        int32_t p[GCTX] = {pos[i]};
        prepare_below(m, v, c, ret, p, 1, entry(m, v, c, p, 1, NULL), &left);
    }
    gram_matcher_destroy(m);
    for (int r = 0; r < g->n_rules; r++) free(ret[r].v);
    free(ret), free(pos);
    pthread_mutex_lock(&g->mu);
    c->prepared = i == n_pos; /* past the entry bound too: a call again would stop there */
    int made = c->n_pt - before;
    pthread_mutex_unlock(&g->mu);
    return made;
}

void gram_matcher_fill_mask(struct gram_matcher *m, const struct gram_vocab *v, uint32_t *mask)
{
    struct gram *g = m->g;
    uint64_t h;
    int klen = state_key(m, &h);
    int words = (v->n_vocab + 31) / 32;
    int hit = 0;
    pthread_mutex_lock(&g->mu);
    struct gram_cache *c = cache_for(g, v);
    for (int i = (int)(h & (uint64_t)(c->cap - 1));; i = (i + 1) & (c->cap - 1)) {
        struct centry *en = &c->t[i];
        if (!en->key) break;
        if (en->h == h && en->klen == klen &&
            !memcmp(en->key, m->key, sizeof *m->key * (size_t)klen)) {
            size_t bytes = sizeof *mask * (size_t)words;
            if (en->mask) {
                memcpy(mask, en->mask, bytes);
            } else { /* a state met again: worth a copy of its own */
                memset(mask, 0, bytes);
                for (int k = 0; k < en->n_sets; k++) apply_set(mask, words, en->sets[k]);
                for (int k = 0; k < en->n_extra; k++) {
                    int32_t id = en->key[klen + k];
                    mask[id >> 5] |= 1u << (id & 31);
                }
                en->mask = xmalloc(bytes);
                memcpy(en->mask, mask, bytes);
            }
            hit = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (hit) return;
    build_mask(m, v, mask);
    pthread_mutex_lock(&g->mu);
    if (c->n < CACHE_MAX && 2 * (c->n + 1) > c->cap) { /* keep it at most half full */
        int cap = 2 * c->cap;
        struct centry *t = xcalloc((size_t)cap, sizeof *t);
        for (int k = 0; k < c->cap; k++)
            if (c->t[k].key) {
                int j = (int)(c->t[k].h & (uint64_t)(cap - 1));
                while (t[j].key) j = (j + 1) & (cap - 1);
                t[j] = c->t[k];
            }
        free(c->t);
        c->t = t;
        c->cap = cap;
    }
    if (c->n < CACHE_MAX) {
        int i = (int)(h & (uint64_t)(c->cap - 1));
        while (c->t[i].key && !(c->t[i].h == h && c->t[i].klen == klen &&
                                !memcmp(c->t[i].key, m->key, sizeof *m->key * (size_t)klen)))
            i = (i + 1) & (c->cap - 1);
        if (!c->t[i].key) {
            struct centry *en = &c->t[i];
            en->h = h;
            en->klen = klen;
            en->key = xmalloc(sizeof *m->key * (size_t)(klen + m->n_extra));
            memcpy(en->key, m->key, sizeof *m->key * (size_t)klen);
            cpy(en->key + klen, m->extra, m->n_extra);
            en->n_extra = m->n_extra;
            en->sets = xmalloc(sizeof *en->sets * (size_t)(m->n_used ? m->n_used : 1));
            memcpy(en->sets, m->used, sizeof *m->used * (size_t)m->n_used);
            en->n_sets = m->n_used;
            c->n++;
        }
    }
    pthread_mutex_unlock(&g->mu);
}

void gram_forget_states(struct gram *g)
{
    pthread_mutex_lock(&g->mu);
    for (struct gram_cache *c = g->cache; c; c = c->next) {
        for (int i = 0; i < c->cap; i++)
            if (c->t[i].key) free(c->t[i].key), free(c->t[i].sets), free(c->t[i].mask);
        memset(c->t, 0, sizeof *c->t * (size_t)c->cap);
        c->n = 0;
    }
    pthread_mutex_unlock(&g->mu);
}

void gram_matcher_walk_mask(struct gram_matcher *m, const struct gram_vocab *v, uint32_t *mask)
{
    int words = (v->n_vocab + 31) / 32, n = 0;
    memset(mask, 0, sizeof *mask * (size_t)words);
    int32_t *all = xmalloc(sizeof *all * (size_t)(v->n_vocab ? v->n_vocab : 1));
    for (int32_t k = 0; k < v->t[0].tok_end; k++) all[n++] = k;
    verify(m, v, m->cur, m->n_cur, all, n, mask);
    free(all);
    for (int i = 0; i < v->n_eos; i++) {
        size_t len;
        const char *s = gram_vocab_token(v, v->eos[i], &len);
        int end = m->acc;
        if (!end && s) end = run_bytes(m, s, len, 0, &end) && end;
        if (end) mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
    }
}

int gram_n_positions(struct gram *g, const struct gram_vocab *v)
{
    pthread_mutex_lock(&g->mu);
    struct gram_cache *c = g->cache;
    while (c && c->v != v) c = c->next;
    int n = c ? c->n_pt : 0;
    pthread_mutex_unlock(&g->mu);
    return n;
}
