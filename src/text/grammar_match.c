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
    uint32_t *cm; /* build_mask scratch */
    int cap_cm;
    int32_t *cand;
    int cap_cand;
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
    free(m->cm), free(m->cand);
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
 * JSON schema from the cache: a non-recursive schema has finitely many states.
 */
#define CACHE_MAX 4096

struct centry {
    uint64_t h;
    int32_t *key;
    int klen;
    uint32_t *mask;
};

/* A position's token sets (see build_mask). */
struct gpos {
    int32_t p1, p2; /* the top frame's position and the next one's (-1: none) */
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
};

void gram_cache_free(struct gram_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->cap; i++)
        if (c->t[i].key) free(c->t[i].key), free(c->t[i].mask);
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
 * These sets depend on the grammar and the vocabulary only, so they are computed the first
 * time a position is met and kept in the grammar for every later state and request. A
 * state's mask is then the union of its stacks' accepted sets and those of their uncertain
 * tokens that the whole state accepts, tried in trie order so shared prefixes are stepped
 * once.
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

/*
 * The token sets of position pos, walking the trie in preorder from the stack (pos, SENT)
 * and skipping the subtree below the first rejected byte. In this walk a state's acc flag
 * means the step into it popped past the alternative's end. Cost: a transition lookup per
 * trie node visited, a matcher step per distinct (state, byte) pair.
 */
static void walk_pos(struct gram_matcher *m, const struct gram_vocab *v, int32_t p1, int32_t p2,
                     struct gpos *out)
{
    const struct gbset *follow = m->g->follow;
    const int32_t *pos_rule = m->g->pos_rule;
    int words = (v->n_vocab + 31) / 32;
    uint32_t *mask = xcalloc((size_t)words, sizeof *mask);
    int32_t *unc = NULL;
    int n_unc = 0, cap_unc = 0, n_acc = 0;
    int base = m->n_nodes;
    int32_t top = node_new(m, p1, p2 >= 0 ? node_new(m, p2, SENT) : SENT);
    walk_begin(m, v, &top, 1, 0);
    int32_t *lv = m->lv;
    lv[0] = 0;
    /* pend[d]: some path to trie depth d has just left the alternative (the next byte must
     * be able to follow its rule); out[d]: some path has left it and taken such a byte, so
     * the rest of the token is the unknown stack's to judge */
    uint8_t *pend = xcalloc((size_t)v->max_depth + 1, 1);
    uint8_t *out_ = xcalloc((size_t)v->max_depth + 1, 1);
    const struct gbset *fol = &follow[pos_rule[p2 >= 0 ? p2 : p1]];
    const struct tnode *tn = v->t;
    for (int i = 1; i < v->n_nodes;) {
        const struct tnode *x = &tn[i];
        int d = x->depth;
        struct wstate *up = &m->ws[lv[d - 1]];
        /* every byte below stays in this state (which has stacks): all accepted */
        if (!(x->cls & ~up->loops)) {
            for (int32_t k = x->tok0; k < x->tok_end; k++) {
                int32_t id = v->order[k];
                mask[id >> 5] |= 1u << (id & 31);
            }
            n_acc += x->tok_end - x->tok0;
            i = x->skip;
            continue;
        }
        int ctx = out_[d - 1] || (pend[d - 1] && (fol->w[x->byte >> 5] >> (x->byte & 31) & 1));
        if (up->n && ++up->visits == LOOP_AFTER) loops_of(m, lv[d - 1]);
        int32_t t = transition(m, lv[d - 1], x->byte);
        if (t == T_DEAD) {
            if (ctx) unc_add_range(&unc, &n_unc, &cap_unc, x->tok0, x->tok_end);
            i = x->skip;
            continue;
        }
        /* tokens ending here: taken inside the alternative, or left to the stack below
         * (this step popped, or an earlier pop took this byte) */
        if (m->ws[t].n > 0) {
            for (int k = 0; k < x->tok_n; k++) {
                int32_t id = v->order[x->tok0 + k];
                mask[id >> 5] |= 1u << (id & 31);
            }
            n_acc += x->tok_n;
        } else {
            unc_add_range(&unc, &n_unc, &cap_unc, x->tok0, x->tok0 + x->tok_n);
        }
        pend[d] = (uint8_t)m->ws[t].acc;
        out_[d] = (uint8_t)ctx;
        lv[d] = t;
        i++;
    }
    free(pend), free(out_);
    m->n_nodes = base;
    if (n_acc < words) { /* the list is smaller */
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
    out->p1 = p1;
    out->p2 = p2;
    out->done = 1;
}

/* Sets the bits of the tokens in cand[0..n) (indices into v->order, ascending) whose bytes
 * the matcher's state accepts: a walk of the trie from the whole state that enters only
 * subtrees holding candidates and leaves one at its first rejected byte. */
static void verify(struct gram_matcher *m, const struct gram_vocab *v, const int32_t *cand, int n,
                   uint32_t *mask)
{
    if (!n) return;
    int base = m->n_nodes;
    walk_begin(m, v, m->cur, m->n_cur, m->acc);
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
        if (++up->visits == LOOP_AFTER) loops_of(m, lv[x->depth - 1]);
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

static struct gram_cache *cache_for(struct gram *g, const struct gram_vocab *v)
{
    struct gram_cache *c = g->cache;
    if (c && c->v != v) {
        gram_cache_free(c);
        c = g->cache = NULL;
    }
    if (!c) {
        c = g->cache = xcalloc(1, sizeof *c);
        c->v = v;
        c->cap = 2 * CACHE_MAX;
        c->t = xcalloc((size_t)c->cap, sizeof *c->t);
        c->cap_pt = 256;
        c->pt = xcalloc((size_t)c->cap_pt, sizeof *c->pt);
    }
    return c;
}

static uint32_t pt_hash(int32_t p1, int32_t p2)
{
    return (uint32_t)(mix(mix(H0, p1), p2) >> 32);
}

/* The entry of (p1, p2) in c, NULL when absent; adds fresh (taking its arrays) when given. */
static struct gpos *pt_get(struct gram_cache *c, int32_t p1, int32_t p2, struct gpos *fresh)
{
    uint32_t i = pt_hash(p1, p2) & (uint32_t)(c->cap_pt - 1);
    for (; c->pt[i]; i = (i + 1) & (uint32_t)(c->cap_pt - 1))
        if (c->pt[i]->p1 == p1 && c->pt[i]->p2 == p2) return c->pt[i];
    if (!fresh) return NULL;
    if (2 * (c->n_pt + 1) > c->cap_pt) {
        int cap = c->cap_pt * 2;
        struct gpos **t = xcalloc((size_t)cap, sizeof *t);
        for (int k = 0; k < c->cap_pt; k++)
            if (c->pt[k]) {
                uint32_t j = pt_hash(c->pt[k]->p1, c->pt[k]->p2) & (uint32_t)(cap - 1);
                while (t[j]) j = (j + 1) & (uint32_t)(cap - 1);
                t[j] = c->pt[k];
            }
        free(c->pt);
        c->pt = t;
        c->cap_pt = cap;
        return pt_get(c, p1, p2, fresh);
    }
    c->pt[i] = xmalloc(sizeof *c->pt[i]);
    *c->pt[i] = *fresh;
    c->n_pt++;
    return c->pt[i];
}

/* A state's mask from its positions' token sets (computed here when new). */
static void build_mask(struct gram_matcher *m, const struct gram_vocab *v, uint32_t *mask)
{
    struct gram *g = m->g;
    int words = (v->n_vocab + 31) / 32;
    memset(mask, 0, sizeof *mask * (size_t)words);
    /* uncertain tokens by index into v->order */
    if (m->cap_cm < words) {
        free(m->cm);
        m->cm = xmalloc(sizeof *m->cm * (size_t)words);
        m->cap_cm = words;
    }
    uint32_t *cm = m->cm;
    memset(cm, 0, sizeof *cm * (size_t)words);
    int n_unc = 0;
    for (int i = 0; i < m->n_cur; i++) {
        const struct gnode *top = &m->nodes[m->cur[i]];
        int32_t p1 = top->pos, p2 = top->parent >= 0 ? m->nodes[top->parent].pos : -1;
        int dup = 0;
        for (int j = 0; j < i && !dup; j++) {
            const struct gnode *o = &m->nodes[m->cur[j]];
            dup = o->pos == p1 && (o->parent >= 0 ? m->nodes[o->parent].pos : -1) == p2;
        }
        if (dup) continue;
        pthread_mutex_lock(&g->mu);
        make_follow(g);
        int done = pt_get(cache_for(g, v), p1, p2, NULL) != NULL;
        pthread_mutex_unlock(&g->mu);
        struct gpos fresh = {0};
        if (!done) walk_pos(m, v, p1, p2, &fresh);
        pthread_mutex_lock(&g->mu);
        struct gpos *e = pt_get(cache_for(g, v), p1, p2, NULL);
        if (!e && fresh.done)
            e = pt_get(g->cache, p1, p2, &fresh);
        else
            free(fresh.acc), free(fresh.acc_mask), free(fresh.unc), free(fresh.unc_mask);
        if (!e) { /* the cache was replaced for another vocabulary meanwhile */
            pthread_mutex_unlock(&g->mu);
            i--;
            continue;
        }
        if (e->acc_mask)
            for (int w = 0; w < words; w++) mask[w] |= e->acc_mask[w];
        else
            for (int k = 0; k < e->n_acc; k++) mask[e->acc[k] >> 5] |= 1u << (e->acc[k] & 31);
        if (e->unc_mask)
            for (int w = 0; w < words; w++) cm[w] |= e->unc_mask[w];
        else
            for (int k = 0; k < e->n_unc; k++) cm[e->unc[k] >> 5] |= 1u << (e->unc[k] & 31);
        n_unc += e->n_unc;
        pthread_mutex_unlock(&g->mu);
    }
    int k = 0;
    if (n_unc) /* in order, unique, and not accepted already */
        for (int w = 0; w < words; w++)
            for (uint32_t x = cm[w]; x; x &= x - 1) {
                int32_t c = w * 32 + __builtin_ctz(x), id = v->order[c];
                if (mask[id >> 5] >> (id & 31) & 1) continue;
                grow(&m->cand, &m->cap_cand, k + 1);
                m->cand[k++] = c;
            }
    verify(m, v, m->cand, k, mask);
    for (int i = 0; i < v->n_eos; i++) {
        size_t len;
        const char *s = gram_vocab_token(v, v->eos[i], &len);
        int end = m->acc;
        if (!end && s) end = run_bytes(m, s, len, 0, &end) && end;
        if (end) mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
    }
}

void gram_matcher_fill_mask(struct gram_matcher *m, const struct gram_vocab *v, uint32_t *mask)
{
    struct gram *g = m->g;
    uint64_t h;
    int klen = state_key(m, &h);
    size_t bytes = sizeof *mask * (size_t)((v->n_vocab + 31) / 32);
    int hit = 0;
    pthread_mutex_lock(&g->mu);
    struct gram_cache *c = g->cache;
    if (c && c->v == v) {
        for (int i = (int)(h & (uint64_t)(c->cap - 1));; i = (i + 1) & (c->cap - 1)) {
            struct centry *en = &c->t[i];
            if (!en->key) break;
            if (en->h == h && en->klen == klen &&
                !memcmp(en->key, m->key, sizeof *m->key * (size_t)klen)) {
                memcpy(mask, en->mask, bytes);
                hit = 1;
                break;
            }
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (hit) return;
    build_mask(m, v, mask);
    pthread_mutex_lock(&g->mu);
    c = cache_for(g, v);
    if (c->n < CACHE_MAX) {
        int i = (int)(h & (uint64_t)(c->cap - 1));
        while (c->t[i].key && !(c->t[i].h == h && c->t[i].klen == klen &&
                                !memcmp(c->t[i].key, m->key, sizeof *m->key * (size_t)klen)))
            i = (i + 1) & (c->cap - 1);
        if (!c->t[i].key) {
            c->t[i].h = h;
            c->t[i].klen = klen;
            c->t[i].key = xmalloc(sizeof *m->key * (size_t)klen);
            memcpy(c->t[i].key, m->key, sizeof *m->key * (size_t)klen);
            c->t[i].mask = xmalloc(bytes);
            memcpy(c->t[i].mask, mask, bytes);
            c->n++;
        }
    }
    pthread_mutex_unlock(&g->mu);
}

void gram_forget_states(struct gram *g)
{
    pthread_mutex_lock(&g->mu);
    struct gram_cache *c = g->cache;
    if (c) {
        for (int i = 0; i < c->cap; i++)
            if (c->t[i].key) free(c->t[i].key), free(c->t[i].mask);
        memset(c->t, 0, sizeof *c->t * (size_t)c->cap);
        c->n = 0;
    }
    pthread_mutex_unlock(&g->mu);
}
