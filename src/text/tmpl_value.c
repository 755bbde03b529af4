/*
 * tmpl_value: the arena and the value model: constructors, lists and insertion-ordered
 * dicts, and Python's semantics where output depends on them: truthiness, equality across
 * int/float/bool, ordering errors between unrelated types, iteration and len(), and the
 * conversion of JSON input into values. Turning values into text is tmpl_text.
 */
#include "text/tmpl_impl.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- arena ---- */

struct tchunk {
    struct tchunk *prev;
    size_t cap, used;
    const char *last; /* most recent allocation, for ta_grow_last */
    size_t last_n;
    _Alignas(16) char data[];
};

#define CHUNK_MIN (64u << 10)

static size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

void *ta_alloc(struct tarena *a, size_t n)
{
    size_t need = align16(n ? n : 1);
    if (need < n) return NULL;
    struct tchunk *c = a->cur;
    if (!c || c->cap - c->used < need) {
        size_t cap = need > CHUNK_MIN ? need : CHUNK_MIN;
        if (a->limit && a->total + cap > a->limit) return NULL;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->prev = a->cur;
        c->cap = cap;
        c->used = 0;
        a->cur = c;
        a->total += cap;
    }
    char *p = c->data + c->used;
    c->used += need;
    c->last = p;
    c->last_n = n;
    memset(p, 0, need);
    return p;
}

int ta_grow_last(struct tarena *a, const void *p, size_t oldn, size_t newn)
{
    struct tchunk *c = a->cur;
    if (!c || c->last != p || c->last_n != oldn || newn < oldn) return 0;
    size_t start = (size_t)((const char *)p - c->data);
    if (align16(newn) > c->cap - start) return 0;
    c->used = start + align16(newn);
    c->last_n = newn;
    return 1;
}

void ta_free(struct tarena *a)
{
    while (a->cur) {
        struct tchunk *p = a->cur->prev;
        free(a->cur);
        a->cur = p;
    }
    a->total = 0;
}

/* ---- constructors ---- */

struct tval tv_str(struct rt *rt, const char *s, size_t n)
{
    if (n > UINT32_MAX) rt_fail(rt, "MemoryError: string too long");
    char *d = rt_alloc(rt, n);
    if (n) memcpy(d, s, n);
    return tv_sref(d, n);
}

struct tval tv_cstr(const char *s)
{
    return tv_sref(s, strlen(s));
}

struct tval tv_concat(struct rt *rt, struct tval a, struct tval b)
{
    size_t n = (size_t)a.n + b.n;
    if (n > TMPL_MAX_OUTPUT) rt_fail(rt, "MemoryError: string too long");
    if (!b.n) return a;
    if (!a.n) return b;
    /* Appending to the string allocated last extends it in place, so the common
     * `set s = s + piece` loop costs O(total) memory instead of O(total^2). Other
     * values sharing the prefix keep their length and never see the new bytes. */
    if (ta_grow_last(&rt->a, a.u.s, a.n, n)) {
        memcpy((char *)a.u.s + a.n, b.u.s, b.n);
        return tv_sref(a.u.s, n);
    }
    char *d = rt_alloc(rt, n);
    memcpy(d, a.u.s, a.n);
    memcpy(d + a.n, b.u.s, b.n);
    return tv_sref(d, n);
}

struct tval tv_list(struct rt *rt, uint32_t cap)
{
    struct tlist *l = rt_alloc(rt, sizeof *l);
    if (cap) l->v = rt_alloc(rt, (size_t)cap * sizeof *l->v);
    l->cap = cap;
    struct tval v = {.t = TV_LIST, .u.l = l};
    return v;
}

void tl_push(struct rt *rt, struct tlist *l, struct tval v)
{
    if (l->n == l->cap) {
        uint32_t nc = l->cap ? l->cap * 2 : 4;
        if (nc < l->cap) rt_fail(rt, "MemoryError: list too long");
        struct tval *nv = rt_alloc(rt, (size_t)nc * sizeof *nv);
        if (l->n) memcpy(nv, l->v, (size_t)l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
}

struct tval tv_dict(struct rt *rt, uint32_t cap)
{
    struct tdict *d = rt_alloc(rt, sizeof *d);
    if (cap) {
        d->k = rt_alloc(rt, (size_t)cap * sizeof *d->k);
        d->v = rt_alloc(rt, (size_t)cap * sizeof *d->v);
    }
    d->cap = cap;
    struct tval v = {.t = TV_DICT, .u.d = d};
    return v;
}

struct tval *td_get(const struct tdict *d, struct tval k)
{
    for (uint32_t i = 0; i < d->n; i++)
        if (tv_eq(d->k[i], k)) return &d->v[i];
    return NULL;
}

struct tval *td_gets(const struct tdict *d, const char *k, size_t n)
{
    for (uint32_t i = 0; i < d->n; i++)
        if (d->k[i].t == TV_STR && d->k[i].n == n && !memcmp(d->k[i].u.s, k, n)) return &d->v[i];
    return NULL;
}

void td_set(struct rt *rt, struct tdict *d, struct tval k, struct tval v)
{
    struct tval *slot = td_get(d, k);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        uint32_t nc = d->cap ? d->cap * 2 : 4;
        struct tval *nk = rt_alloc(rt, (size_t)nc * sizeof *nk);
        struct tval *nv = rt_alloc(rt, (size_t)nc * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, (size_t)d->n * sizeof *nk);
            memcpy(nv, d->v, (size_t)d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

/* ---- Python semantics ---- */

int tv_is_num(struct tval v)
{
    return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT;
}

double tv_num(struct tval v)
{
    return v.t == TV_FLOAT ? v.u.f : (double)v.u.i;
}

int tv_truthy(struct tval v)
{
    switch (v.t) {
    case TV_UNDEF:
    case TV_NONE:
        return 0;
    case TV_BOOL:
    case TV_INT:
        return v.u.i != 0;
    case TV_FLOAT:
        return v.u.f != 0;
    case TV_STR:
        return v.n > 0;
    case TV_LIST:
        return v.u.l->gen || v.u.l->n > 0; /* a generator is always true */
    case TV_DICT:
        return v.u.d->n > 0;
    default:
        return 1;
    }
}

int tv_eq(struct tval a, struct tval b)
{
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT) return a.u.i == b.u.i;
        return tv_num(a) == tv_num(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case TV_UNDEF:
    case TV_NONE:
        return 1;
    case TV_STR:
        return a.n == b.n && !memcmp(a.u.s, b.u.s, a.n);
    case TV_LIST:
        if (a.u.l == b.u.l) return 1;
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->gen || b.u.l->gen) return 0;
        if (a.u.l->n != b.u.l->n) return 0;
        for (uint32_t i = 0; i < a.u.l->n; i++)
            if (!tv_eq(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case TV_DICT:
        if (a.u.d == b.u.d) return 1;
        if (a.u.d->n != b.u.d->n) return 0;
        for (uint32_t i = 0; i < a.u.d->n; i++) {
            struct tval *o = td_get(b.u.d, a.u.d->k[i]);
            if (!o || !tv_eq(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case TV_NS:
        return a.u.d == b.u.d;
    case TV_FUNC:
        return a.u.fn == b.u.fn;
    case TV_LOOP:
        return a.u.loop == b.u.loop;
    default:
        return 0;
    }
}

int tv_cmp(struct rt *rt, struct tval a, struct tval b)
{
    if (a.t == TV_UNDEF || b.t == TV_UNDEF) {
        struct tval u = a.t == TV_UNDEF ? a : b;
        rt_fail(rt, "UndefinedError: '%.*s' is undefined", (int)u.n, u.u.s ? u.u.s : "");
    }
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT) return (a.u.i > b.u.i) - (a.u.i < b.u.i);
        double x = tv_num(a), y = tv_num(b);
        return (x > y) - (x < y);
    }
    if (a.t == TV_STR && b.t == TV_STR) {
        size_t m = a.n < b.n ? a.n : b.n;
        int c = m ? memcmp(a.u.s, b.u.s, m) : 0;
        if (c) return c;
        return (a.n > b.n) - (a.n < b.n);
    }
    if (a.t == TV_LIST && b.t == TV_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->gen &&
        !b.u.l->gen) {
        for (uint32_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (tv_eq(a.u.l->v[i], b.u.l->v[i])) continue;
            return tv_cmp(rt, a.u.l->v[i], b.u.l->v[i]);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    rt_fail(rt, "TypeError: '<' not supported between instances of '%s' and '%s'", tv_typename(a),
            tv_typename(b));
}

const char *tv_typename(struct tval v)
{
    switch (v.t) {
    case TV_UNDEF:
        return "Undefined";
    case TV_NONE:
        return "NoneType";
    case TV_BOOL:
        return "bool";
    case TV_INT:
        return "int";
    case TV_FLOAT:
        return "float";
    case TV_STR:
        return "str";
    case TV_LIST:
        return v.u.l->gen ? "generator" : v.u.l->tuple ? "tuple" : "list";
    case TV_DICT:
        return "dict";
    case TV_NS:
        return "Namespace";
    case TV_FUNC:
        return v.u.fn->kind == TFN_MACRO ? "Macro" : "function";
    case TV_LOOP:
        return "LoopContext";
    default:
        return "object";
    }
}

size_t utf8_len(const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (k > n) return 1;
    for (size_t i = 1; i < k; i++)
        if (((unsigned char)s[i] >> 6) != 2) return 1;
    return k;
}

uint32_t u_decode(const char *s, size_t n, size_t *len)
{
    size_t k = utf8_len(s, n);
    const unsigned char *u = (const unsigned char *)s;
    *len = k;
    switch (k) {
    case 2:
        return ((uint32_t)(u[0] & 0x1f) << 6) | (u[1] & 0x3f);
    case 3:
        return ((uint32_t)(u[0] & 0x0f) << 12) | ((uint32_t)(u[1] & 0x3f) << 6) | (u[2] & 0x3f);
    case 4:
        return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3f) << 12) |
               ((uint32_t)(u[2] & 0x3f) << 6) | (u[3] & 0x3f);
    default:
        return u[0];
    }
}

int u_isspace(const char *s, size_t n, size_t *clen)
{
    uint32_t c = u_decode(s, n, clen);
    return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

const struct tval *tv_iter(struct rt *rt, struct tval v, uint32_t *n)
{
    switch (v.t) {
    case TV_UNDEF:
        *n = 0;
        return NULL;
    case TV_LIST:
        if (v.u.l->gen) {
            if (v.u.l->used) {
                *n = 0;
                return NULL;
            }
            v.u.l->used = 1;
        }
        *n = v.u.l->n;
        return v.u.l->v;
    case TV_DICT:
        *n = v.u.d->n;
        return v.u.d->k;
    case TV_STR: {
        struct tval *out = rt_alloc(rt, (size_t)v.n * sizeof *out);
        uint32_t k = 0;
        for (size_t i = 0; i < v.n;) {
            size_t cl = utf8_len(v.u.s + i, v.n - i);
            out[k++] = tv_sref(v.u.s + i, cl);
            i += cl;
        }
        *n = k;
        return out;
    }
    default:
        rt_fail(rt, "TypeError: '%s' object is not iterable", tv_typename(v));
    }
}

int64_t tv_len(struct rt *rt, struct tval v)
{
    switch (v.t) {
    case TV_UNDEF:
        return 0;
    case TV_STR: {
        int64_t k = 0;
        for (size_t i = 0; i < v.n; i += utf8_len(v.u.s + i, v.n - i)) k++;
        return k;
    }
    case TV_LIST:
        if (!v.u.l->gen) return v.u.l->n;
        break;
    case TV_DICT:
    case TV_NS:
        return v.u.d->n;
    default:
        break;
    }
    rt_fail(rt, "TypeError: object of type '%s' has no len()", tv_typename(v));
}

struct tval tv_from_json(struct rt *rt, const void *p)
{
    const cJSON *j = p;
    if (!j || cJSON_IsNull(j)) return tv_none();
    if (cJSON_IsBool(j)) return tv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        /* cJSON keeps no int/float distinction: integral values become ints, as the
         * JSON producers of chat requests write them. */
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9.2e18) return tv_int((int64_t)d);
        return tv_float(d);
    }
    if (cJSON_IsString(j)) return tv_cstr(j->valuestring ? j->valuestring : "");
    if (cJSON_IsArray(j)) {
        struct tval l = tv_list(rt, (uint32_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c; c = c->next) tl_push(rt, l.u.l, tv_from_json(rt, c));
        return l;
    }
    if (cJSON_IsObject(j)) {
        struct tval d = tv_dict(rt, (uint32_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c; c = c->next)
            td_set(rt, d.u.d, tv_cstr(c->string ? c->string : ""), tv_from_json(rt, c));
        return d;
    }
    return tv_none();
}
