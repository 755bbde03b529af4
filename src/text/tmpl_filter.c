/*
 * tmpl_filter: jinja2's built-in filters and tests, plus transformers' tojson. Results
 * keep jinja2's types where output depends on them: map/select/reject/selectattr/
 * rejectattr/unique/batch/reverse give one-pass generators (tojson refuses them, as in
 * Python), items gives (key, value) tuples, round gives floats.
 */
#include "text/tmpl_impl.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define NAMEIS(w) (nlen == sizeof(w) - 1 && !memcmp(name, w, nlen))

static const char *const filters[] = {
    "abs",        "attr",     "batch",     "capitalize", "center", "count",  "d",
    "default",    "dictsort", "e",         "escape",     "first",  "float",  "forceescape",
    "format",     "indent",   "int",       "items",      "join",   "last",   "length",
    "list",       "lower",    "map",       "max",        "min",    "pprint", "reject",
    "rejectattr", "replace",  "reverse",   "round",      "safe",   "select", "selectattr",
    "sort",       "string",   "sum",       "title",      "tojson", "trim",   "truncate",
    "unique",     "upper",    "wordcount", NULL};

static const char *const tests[] = {
    "!=",       "<",        "<=",          "==",       ">",           ">=",       "boolean",
    "callable", "defined",  "divisibleby", "eq",       "equalto",     "escaped",  "even",
    "false",    "filter",   "float",       "ge",       "greaterthan", "gt",       "in",
    "integer",  "iterable", "le",          "lessthan", "lower",       "lt",       "mapping",
    "ne",       "none",     "number",      "odd",      "sameas",      "sequence", "string",
    "test",     "true",     "undefined",   "upper",    NULL};

static int known(const char *const *list, const char *name, size_t nlen)
{
    for (int i = 0; list[i]; i++)
        if (strlen(list[i]) == nlen && !memcmp(list[i], name, nlen)) return 1;
    return 0;
}

int tmpl_filter_known(const char *name, size_t nlen)
{
    return known(filters, name, nlen);
}

int tmpl_test_known(const char *name, size_t nlen)
{
    return known(tests, name, nlen);
}

static struct tval gen_of(struct tval l)
{
    l.u.l->gen = 1;
    return l;
}

static int arg_bool(struct tval *v, int def)
{
    return v ? tv_truthy(*v) : def;
}

static int64_t arg_int(struct rt *rt, struct tval *v, int64_t def, const char *what)
{
    if (!v || v->t == TV_NONE) return def;
    if (v->t == TV_INT || v->t == TV_BOOL) return v->u.i;
    if (v->t == TV_FLOAT) return (int64_t)v->u.f;
    rt_fail(rt, "TypeError: %s must be an integer, not %s", what, tv_typename(*v));
}

static struct tval *arg_str(struct rt *rt, struct tval *v, const char *what)
{
    if (v && v->t != TV_STR && v->t != TV_NONE)
        rt_fail(rt, "TypeError: %s must be a string, not %s", what, tv_typename(*v));
    return v && v->t == TV_STR ? v : NULL;
}

/* attribute="a.b.0": jinja2's make_attrgetter walks dots, digits index lists. */
static struct tval attr_path(struct rt *rt, struct tval item, struct tval path)
{
    if (path.t == TV_INT) return rt_getitem(rt, item, path);
    if (path.t != TV_STR) rt_fail(rt, "TypeError: attribute must be a string");
    size_t i = 0;
    while (i <= path.n) {
        size_t j = i;
        while (j < path.n && path.u.s[j] != '.') j++;
        int digits = j > i;
        for (size_t k = i; k < j; k++) digits &= path.u.s[k] >= '0' && path.u.s[k] <= '9';
        if (digits && j - i < 18)
            item = rt_getitem(rt, item, tv_int(strtoll(path.u.s + i, NULL, 10)));
        else
            item = rt_getattr(rt, item, path.u.s + i, j - i);
        i = j + 1;
    }
    return item;
}

/* Comparison key of sort/unique/min/max/dictsort: lowercased strings unless told not. */
static struct tval sort_key(struct rt *rt, struct tval v, int case_sensitive)
{
    if (case_sensitive || v.t != TV_STR) return v;
    char *d = rt_alloc(rt, v.n);
    for (uint32_t i = 0; i < v.n; i++) d[i] = (char)tolower((unsigned char)v.u.s[i]);
    return tv_sref(d, v.n);
}

/* Stable merge sort of items[] by keys[] (tv_cmp may fail like Python's sorted()). */
static void msort(struct rt *rt, struct tval *keys, struct tval *items, uint32_t n, int rev)
{
    if (n < 2) return;
    uint32_t h = n / 2;
    msort(rt, keys, items, h, rev);
    msort(rt, keys + h, items + h, n - h, rev);
    struct tval *tk = rt_alloc(rt, (size_t)n * sizeof *tk),
                *ti = rt_alloc(rt, (size_t)n * sizeof *ti);
    uint32_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        int c = tv_cmp(rt, keys[j], keys[i]);
        int take_right = rev ? c > 0 : c < 0;
        if (take_right) {
            tk[o] = keys[j];
            ti[o++] = items[j++];
        } else {
            tk[o] = keys[i];
            ti[o++] = items[i++];
        }
    }
    while (i < h) tk[o] = keys[i], ti[o++] = items[i++];
    while (j < n) tk[o] = keys[j], ti[o++] = items[j++];
    memcpy(keys, tk, (size_t)n * sizeof *tk);
    memcpy(items, ti, (size_t)n * sizeof *ti);
}

static struct tval str_of(struct rt *rt, struct tval v)
{
    return tv_to_str(rt, v);
}

static struct tval tuple2(struct rt *rt, struct tval a, struct tval b)
{
    struct tval t = tv_list(rt, 2);
    t.u.l->tuple = 1;
    tl_push(rt, t.u.l, a);
    tl_push(rt, t.u.l, b);
    return t;
}

/* Python's str.splitlines() line boundaries (ASCII ones). */
static int line_break(const char *s, size_t n, size_t i, size_t *len)
{
    char c = s[i];
    if (c == '\r' && i + 1 < n && s[i + 1] == '\n') {
        *len = 2;
        return 1;
    }
    *len = 1;
    return c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e;
}

static struct tval f_indent(struct rt *rt, struct tval v, struct targs *a)
{
    struct tval s = str_of(rt, v), *w = targ(a, 0, "width");
    struct tval ind;
    if (w && w->t == TV_STR) {
        ind = *w;
    } else {
        int64_t n = arg_int(rt, w, 4, "width");
        struct tbuf b = {0};
        for (int64_t i = 0; i < n && i < 10000; i++) tb_put(rt, &b, " ", 1);
        ind = tv_sref(b.p ? b.p : "", b.n);
    }
    int first = arg_bool(targ(a, 1, "first"), 0), blank = arg_bool(targ(a, 2, "blank"), 0);
    struct tbuf b = {0};
    if (first) tb_put(rt, &b, ind.u.s, ind.n);
    /* jinja2 appends "\n" then splitlines(): a trailing newline yields no extra line */
    size_t i = 0, start = 0, ln = 0;
    int nline = 0;
    struct tval src = tv_concat(rt, s, tv_cstr("\n"));
    while (i < src.n) {
        size_t bl;
        if (!line_break(src.u.s, src.n, i, &bl)) {
            i++;
            continue;
        }
        ln = i - start;
        if (nline) {
            tb_put(rt, &b, "\n", 1);
            if (blank || ln) tb_put(rt, &b, ind.u.s, ind.n);
        }
        tb_put(rt, &b, src.u.s + start, ln);
        nline++;
        i += bl;
        start = i;
    }
    return tv_sref(b.p ? b.p : "", b.n);
}

static struct tval f_tojson(struct rt *rt, struct tval v, struct targs *a)
{
    /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None,
     * sort_keys=False) -> json.dumps(...) */
    struct tval *ea = targ(a, 0, "ensure_ascii"), *ind = targ(a, 1, "indent");
    struct tval *sep = targ(a, 2, "separators"), *sk = targ(a, 3, "sort_keys");
    int indent = -1;
    if (ind && ind->t != TV_NONE) {
        indent = (int)arg_int(rt, ind, 0, "indent");
        if (indent < 0) indent = 0;
        if (indent > 64) indent = 64;
    }
    const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
    if (sep && sep->t == TV_LIST && sep->u.l->n == 2 && sep->u.l->v[0].t == TV_STR &&
        sep->u.l->v[1].t == TV_STR) {
        struct tval i0 = tv_concat(rt, sep->u.l->v[0], tv_sref("\0", 1));
        struct tval k0 = tv_concat(rt, sep->u.l->v[1], tv_sref("\0", 1));
        isep = i0.u.s;
        ksep = k0.u.s;
    }
    int oa = rt->json_ascii, os = rt->json_sort;
    rt->json_ascii = arg_bool(ea, 0);
    rt->json_sort = arg_bool(sk, 0);
    struct tbuf b = {0};
    tb_json(rt, &b, v, indent, isep, ksep, 0);
    rt->json_ascii = oa;
    rt->json_sort = os;
    return tv_sref(b.p ? b.p : "", b.n);
}

static struct tval f_select(struct rt *rt, struct tval v, struct targs *a, int by_attr, int reject)
{
    uint32_t n;
    /* jinja2 guards with `if value:`, so None and empty inputs give nothing */
    const struct tval *it = tv_truthy(v) ? tv_iter(rt, v, &n) : (n = 0, NULL);
    struct tval out = tv_list(rt, 0);
    int off = by_attr ? 1 : 0;
    struct tval *attr = by_attr ? targ(a, 0, "attribute") : NULL;
    if (by_attr && !attr) rt_fail(rt, "TypeError: selectattr needs an attribute name");
    struct tval *test = targ(a, off, NULL);
    if (test && test->t != TV_STR) rt_fail(rt, "TypeError: test name must be a string");
    struct targs rest = {0};
    if (a->npos > off + 1) {
        rest.pos = a->pos + off + 1;
        rest.npos = a->npos - off - 1;
    }
    for (uint32_t i = 0; i < n; i++) {
        rt_step(rt);
        struct tval x = attr ? attr_path(rt, it[i], *attr) : it[i];
        int ok = test ? tmpl_test(rt, test->u.s, test->n, x, &rest) : tv_truthy(x);
        if (ok != reject) tl_push(rt, out.u.l, it[i]);
    }
    return gen_of(out);
}

static struct tval f_map(struct rt *rt, struct tval v, struct targs *a)
{
    uint32_t n;
    const struct tval *it = tv_truthy(v) ? tv_iter(rt, v, &n) : (n = 0, NULL);
    struct tval out = tv_list(rt, n);
    struct tval *attr = targ(a, -1, "attribute"), *def = targ(a, -1, "default");
    struct tval *fname = attr ? NULL : targ(a, 0, NULL);
    if (!attr && (!fname || fname->t != TV_STR))
        rt_fail(rt, "TypeError: map needs a filter name or attribute=");
    struct targs rest = {0};
    if (!attr && a->npos > 1) {
        rest.pos = a->pos + 1;
        rest.npos = a->npos - 1;
    }
    if (!attr) {
        rest.kwn = a->kwn;
        rest.kwv = a->kwv;
        rest.nkw = a->nkw;
    }
    for (uint32_t i = 0; i < n; i++) {
        rt_step(rt);
        struct tval x;
        if (attr) {
            x = attr_path(rt, it[i], *attr);
            if (x.t == TV_UNDEF && def) x = *def;
        } else {
            x = tmpl_filter(rt, fname->u.s, fname->n, it[i], &rest);
        }
        tl_push(rt, out.u.l, x);
    }
    return gen_of(out);
}

static struct tval f_sort(struct rt *rt, struct tval v, struct targs *a)
{
    int rev = arg_bool(targ(a, 0, "reverse"), 0), cs = arg_bool(targ(a, 1, "case_sensitive"), 0);
    struct tval *attr = targ(a, 2, "attribute");
    uint32_t n;
    const struct tval *it = tv_iter(rt, v, &n);
    struct tval out = tv_list(rt, n);
    struct tval *keys = rt_alloc(rt, (size_t)(n ? n : 1) * sizeof *keys);
    for (uint32_t i = 0; i < n; i++) {
        tl_push(rt, out.u.l, it[i]);
        keys[i] = sort_key(rt, attr ? attr_path(rt, it[i], *attr) : it[i], cs);
    }
    msort(rt, keys, out.u.l->v, n, rev);
    return out;
}

static struct tval f_dictsort(struct rt *rt, struct tval v, struct targs *a)
{
    if (v.t != TV_DICT) rt_fail(rt, "TypeError: dictsort needs a mapping");
    int cs = arg_bool(targ(a, 0, "case_sensitive"), 0);
    struct tval *by = arg_str(rt, targ(a, 1, "by"), "by");
    int rev = arg_bool(targ(a, 2, "reverse"), 0);
    int byval = by && by->n == 5 && !memcmp(by->u.s, "value", 5);
    uint32_t n = v.u.d->n;
    struct tval out = tv_list(rt, n);
    struct tval *keys = rt_alloc(rt, (size_t)(n ? n : 1) * sizeof *keys);
    for (uint32_t i = 0; i < n; i++) {
        tl_push(rt, out.u.l, tuple2(rt, v.u.d->k[i], v.u.d->v[i]));
        keys[i] = sort_key(rt, byval ? v.u.d->v[i] : v.u.d->k[i], cs);
    }
    msort(rt, keys, out.u.l->v, n, rev);
    return out;
}

static struct tval f_minmax(struct rt *rt, struct tval v, struct targs *a, int want_max)
{
    int cs = arg_bool(targ(a, 0, "case_sensitive"), 0);
    struct tval *attr = targ(a, 1, "attribute");
    uint32_t n;
    const struct tval *it = tv_iter(rt, v, &n);
    if (!n) return tv_undef("No aggregated item, sequence was empty.", 38);
    uint32_t best = 0;
    struct tval bk = sort_key(rt, attr ? attr_path(rt, it[0], *attr) : it[0], cs);
    for (uint32_t i = 1; i < n; i++) {
        struct tval k = sort_key(rt, attr ? attr_path(rt, it[i], *attr) : it[i], cs);
        int c = tv_cmp(rt, k, bk);
        if (want_max ? c > 0 : c < 0) {
            best = i;
            bk = k;
        }
    }
    return it[best];
}

static struct tval f_unique(struct rt *rt, struct tval v, struct targs *a)
{
    int cs = arg_bool(targ(a, 0, "case_sensitive"), 0);
    struct tval *attr = targ(a, 1, "attribute");
    uint32_t n;
    const struct tval *it = tv_iter(rt, v, &n);
    struct tval out = tv_list(rt, 0), seen = tv_list(rt, 0);
    for (uint32_t i = 0; i < n; i++) {
        rt_step(rt);
        struct tval k = sort_key(rt, attr ? attr_path(rt, it[i], *attr) : it[i], cs);
        int dup = 0;
        for (uint32_t j = 0; j < seen.u.l->n && !dup; j++) dup = tv_eq(seen.u.l->v[j], k);
        if (dup) continue;
        tl_push(rt, seen.u.l, k);
        tl_push(rt, out.u.l, it[i]);
    }
    return gen_of(out);
}

static struct tval f_int(struct rt *rt, struct tval v, struct targs *a)
{
    struct tval *def = targ(a, 0, "default");
    int64_t base = arg_int(rt, targ(a, 1, "base"), 10, "base");
    if (v.t == TV_INT || v.t == TV_BOOL) return tv_int(v.u.i);
    if (v.t == TV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) return tv_int((int64_t)v.u.f);
    if (v.t == TV_STR && v.n < 64) {
        char buf[64];
        size_t o = 0;
        for (uint32_t i = 0; i < v.n; i++)
            if (v.u.s[i] != '_') buf[o++] = v.u.s[i];
        buf[o] = 0;
        char *end;
        errno = 0;
        long long r = base >= 2 && base <= 36 ? strtoll(buf, &end, (int)base) : 0;
        if (base >= 2 && base <= 36 && !errno && end != buf) {
            while (*end && isspace((unsigned char)*end)) end++;
            if (!*end) return tv_int(r);
        }
        double d = strtod(buf, &end);
        if (end != buf && isfinite(d) && fabs(d) < 9.2e18) {
            while (*end && isspace((unsigned char)*end)) end++;
            if (!*end) return tv_int((int64_t)d);
        }
    }
    return def ? *def : tv_int(0);
}

static struct tval f_float(struct rt *rt, struct tval v, struct targs *a)
{
    (void)rt;
    struct tval *def = targ(a, 0, "default");
    if (tv_is_num(v)) return tv_float(tv_num(v));
    if (v.t == TV_STR && v.n < 64) {
        char buf[64], *end;
        memcpy(buf, v.u.s, v.n);
        buf[v.n] = 0;
        double d = strtod(buf, &end);
        if (end != buf) {
            while (*end && isspace((unsigned char)*end)) end++;
            if (!*end) return tv_float(d);
        }
    }
    return def ? *def : tv_float(0);
}

static struct tval f_round(struct rt *rt, struct tval v, struct targs *a)
{
    int64_t prec = arg_int(rt, targ(a, 0, "precision"), 0, "precision");
    struct tval *m = arg_str(rt, targ(a, 1, "method"), "method");
    if (!tv_is_num(v)) rt_fail(rt, "TypeError: type %s doesn't define __round__", tv_typename(v));
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    double x = tv_num(v), scale = pow(10, (double)prec), y = x * scale;
    if (m && m->n == 4 && !memcmp(m->u.s, "ceil", 4))
        y = ceil(y);
    else if (m && m->n == 5 && !memcmp(m->u.s, "floor", 5))
        y = floor(y);
    else
        y = nearbyint(y); /* Python's round: half to even */
    return tv_float(y / scale);
}

static struct tval f_list(struct rt *rt, struct tval v)
{
    uint32_t n;
    const struct tval *it = tv_iter(rt, v, &n);
    struct tval out = tv_list(rt, n);
    for (uint32_t i = 0; i < n; i++) tl_push(rt, out.u.l, it[i]);
    return out;
}

static struct tval f_join(struct rt *rt, struct tval v, struct targs *a)
{
    struct tval *sep = targ(a, 0, "d"), *attr = targ(a, 1, "attribute");
    struct tval d = sep ? str_of(rt, *sep) : tv_cstr("");
    uint32_t n;
    const struct tval *it = tv_iter(rt, v, &n);
    struct tbuf b = {0};
    for (uint32_t i = 0; i < n; i++) {
        if (i) tb_put(rt, &b, d.u.s, d.n);
        tb_str(rt, &b, attr ? attr_path(rt, it[i], *attr) : it[i]);
    }
    return tv_sref(b.p ? b.p : "", b.n);
}

static struct tval f_case(struct rt *rt, struct tval v, int mode)
{
    /* 0 upper, 1 lower, 2 capitalize, 3 jinja2 title (words start after space - ( { [ <) */
    struct tval s = str_of(rt, v);
    char *d = rt_alloc(rt, s.n);
    int start = 1;
    for (uint32_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.u.s[i];
        if (mode == 0)
            c = (unsigned char)toupper(c);
        else if (mode == 1)
            c = (unsigned char)tolower(c);
        else if (mode == 2)
            c = (unsigned char)(i == 0 ? toupper(c) : tolower(c));
        else {
            int sep = isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
            c = (unsigned char)(sep ? c : start ? toupper(c) : tolower(c));
            start = sep;
        }
        d[i] = (char)c;
    }
    return tv_sref(d, s.n);
}

struct tval tmpl_call_method(struct rt *rt, struct tval self, const char *name, struct targs *a);

struct tval tmpl_filter(struct rt *rt, const char *name, size_t nlen, struct tval v,
                        struct targs *a)
{
    if (NAMEIS("tojson")) return f_tojson(rt, v, a);
    if (NAMEIS("trim")) return tmpl_call_method(rt, str_of(rt, v), "strip", a);
    if (NAMEIS("length") || NAMEIS("count")) return tv_int(tv_len(rt, v));
    if (NAMEIS("string")) return str_of(rt, v);
    if (NAMEIS("safe")) {
        struct tval m = str_of(rt, v);
        m.markup = 1;
        return m;
    }
    if (NAMEIS("default") || NAMEIS("d")) {
        struct tval *def = targ(a, 0, "default_value");
        int boolean = arg_bool(targ(a, 1, "boolean"), 0);
        if (v.t == TV_UNDEF || (boolean && !tv_truthy(v))) return def ? *def : tv_cstr("");
        return v;
    }
    if (NAMEIS("items")) {
        if (v.t == TV_UNDEF) return tv_list(rt, 0);
        if (v.t != TV_DICT) rt_fail(rt, "TypeError: Can only get item pairs from a mapping.");
        struct tval out = tv_list(rt, v.u.d->n);
        for (uint32_t i = 0; i < v.u.d->n; i++)
            tl_push(rt, out.u.l, tuple2(rt, v.u.d->k[i], v.u.d->v[i]));
        return out;
    }
    if (NAMEIS("first") || NAMEIS("last")) {
        if (NAMEIS("last") && v.t == TV_LIST && v.u.l->gen)
            rt_fail(rt, "TypeError: 'generator' object is not reversible");
        uint32_t n;
        const struct tval *it = tv_iter(rt, v, &n);
        if (!n) return tv_undef("No first item, sequence was empty.", 34);
        return NAMEIS("first") ? it[0] : it[n - 1];
    }
    if (NAMEIS("join")) return f_join(rt, v, a);
    if (NAMEIS("upper")) return f_case(rt, v, 0);
    if (NAMEIS("lower")) return f_case(rt, v, 1);
    if (NAMEIS("capitalize")) return f_case(rt, v, 2);
    if (NAMEIS("title")) return f_case(rt, v, 3);
    if (NAMEIS("replace")) return tmpl_call_method(rt, str_of(rt, v), "replace", a);
    if (NAMEIS("select") || NAMEIS("reject")) return f_select(rt, v, a, 0, NAMEIS("reject"));
    if (NAMEIS("selectattr") || NAMEIS("rejectattr"))
        return f_select(rt, v, a, 1, NAMEIS("rejectattr"));
    if (NAMEIS("map")) return f_map(rt, v, a);
    if (NAMEIS("list")) return f_list(rt, v);
    if (NAMEIS("int")) return f_int(rt, v, a);
    if (NAMEIS("float")) return f_float(rt, v, a);
    if (NAMEIS("abs")) {
        if (v.t == TV_INT || v.t == TV_BOOL) {
            if (v.u.i == INT64_MIN) rt_fail(rt, "OverflowError: integer result too large");
            return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == TV_FLOAT) return tv_float(fabs(v.u.f));
        rt_fail(rt, "TypeError: bad operand type for abs(): '%s'", tv_typename(v));
    }
    if (NAMEIS("round")) return f_round(rt, v, a);
    if (NAMEIS("unique")) return f_unique(rt, v, a);
    if (NAMEIS("reverse")) {
        if (v.t == TV_STR) {
            uint32_t n;
            const struct tval *ch = tv_iter(rt, v, &n);
            struct tbuf b = {0};
            for (uint32_t i = n; i-- > 0;) tb_put(rt, &b, ch[i].u.s, ch[i].n);
            return tv_sref(b.p ? b.p : "", b.n);
        }
        struct tval l = f_list(rt, v);
        for (uint32_t i = 0, j = l.u.l->n; i + 1 < j; i++, j--) {
            struct tval t = l.u.l->v[i];
            l.u.l->v[i] = l.u.l->v[j - 1];
            l.u.l->v[j - 1] = t;
        }
        return gen_of(l);
    }
    if (NAMEIS("sort")) return f_sort(rt, v, a);
    if (NAMEIS("dictsort")) return f_dictsort(rt, v, a);
    if (NAMEIS("escape") || NAMEIS("e") || NAMEIS("forceescape")) return tv_escape(rt, v);
    if (NAMEIS("indent")) return f_indent(rt, v, a);
    if (NAMEIS("wordcount")) {
        struct tval s = str_of(rt, v);
        int64_t n = 0;
        int in = 0;
        for (uint32_t i = 0; i < s.n; i++) {
            unsigned char c = (unsigned char)s.u.s[i];
            int w = isalnum(c) || c == '_' || c >= 0x80;
            if (w && !in) n++;
            in = w;
        }
        return tv_int(n);
    }
    if (NAMEIS("center")) return tmpl_call_method(rt, str_of(rt, v), "center", a);
    if (NAMEIS("batch")) {
        int64_t size = arg_int(rt, targ(a, 0, "linecount"), 1, "linecount");
        struct tval *fill = targ(a, 1, "fill_with");
        if (size < 1) rt_fail(rt, "ValueError: batch size must be positive");
        uint32_t n;
        const struct tval *it = tv_iter(rt, v, &n);
        struct tval out = tv_list(rt, 0), cur = tv_list(rt, 0);
        for (uint32_t i = 0; i < n; i++) {
            tl_push(rt, cur.u.l, it[i]);
            if (cur.u.l->n == size) {
                tl_push(rt, out.u.l, cur);
                cur = tv_list(rt, 0);
            }
        }
        if (cur.u.l->n) {
            while (fill && cur.u.l->n < size) tl_push(rt, cur.u.l, *fill);
            tl_push(rt, out.u.l, cur);
        }
        return gen_of(out);
    }
    if (NAMEIS("min") || NAMEIS("max")) return f_minmax(rt, v, a, NAMEIS("max"));
    if (NAMEIS("sum")) {
        struct tval *attr = targ(a, 0, "attribute"), *start = targ(a, 1, "start");
        struct tval acc = start ? *start : tv_int(0);
        uint32_t n;
        const struct tval *it = tv_iter(rt, v, &n);
        for (uint32_t i = 0; i < n; i++) {
            struct tval x = attr ? attr_path(rt, it[i], *attr) : it[i];
            if (!tv_is_num(acc) || !tv_is_num(x))
                rt_fail(rt, "TypeError: unsupported operand type(s) for +: '%s' and '%s'",
                        tv_typename(acc), tv_typename(x));
            if (acc.t != TV_FLOAT && x.t != TV_FLOAT) {
                int64_t r;
                if (__builtin_add_overflow(acc.u.i, x.u.i, &r))
                    rt_fail(rt, "OverflowError: integer result too large");
                acc = tv_int(r);
            } else {
                acc = tv_float(tv_num(acc) + tv_num(x));
            }
        }
        return acc;
    }
    if (NAMEIS("attr")) {
        struct tval *nm = arg_str(rt, targ(a, 0, "name"), "name");
        if (!nm) rt_fail(rt, "TypeError: attr needs a name");
        if (v.t == TV_UNDEF) return v;
        return rt_getattr(rt, v, nm->u.s, nm->n);
    }
    if (NAMEIS("format")) {
        struct tval args = tv_list(rt, (uint32_t)a->npos);
        args.u.l->tuple = 1;
        for (int i = 0; i < a->npos; i++) tl_push(rt, args.u.l, a->pos[i]);
        struct targs m = {.pos = &args, .npos = 1};
        return tmpl_call_method(rt, str_of(rt, v), "__mod__", &m);
    }
    if (NAMEIS("pprint")) {
        struct tbuf b = {0};
        tb_repr(rt, &b, v);
        return tv_sref(b.p ? b.p : "", b.n);
    }
    if (NAMEIS("truncate")) {
        struct tval s = str_of(rt, v);
        int64_t len = arg_int(rt, targ(a, 0, "length"), 255, "length");
        int killwords = arg_bool(targ(a, 1, "killwords"), 0);
        struct tval *end = arg_str(rt, targ(a, 2, "end"), "end");
        struct tval e = end ? *end : tv_cstr("...");
        int64_t leeway = arg_int(rt, targ(a, 3, "leeway"), 5, "leeway");
        if (tv_len(rt, s) <= len + leeway) return s;
        uint32_t n;
        const struct tval *ch = tv_iter(rt, s, &n);
        int64_t keep = len - tv_len(rt, e);
        if (keep < 0) keep = 0;
        size_t bytes = 0;
        for (int64_t i = 0; i < keep && i < n; i++) bytes += ch[i].n;
        if (!killwords) {
            size_t sp = bytes;
            while (sp > 0 && s.u.s[sp - 1] != ' ') sp--;
            if (sp > 0) bytes = sp - 1;
        }
        return tv_concat(rt, tv_str(rt, s.u.s, bytes), e);
    }
    rt_fail(rt, "TemplateAssertionError: No filter named '%.*s'.", (int)(nlen > 60 ? 60 : nlen),
            name);
}

int tmpl_test(struct rt *rt, const char *name, size_t nlen, struct tval v, struct targs *a)
{
    struct tval *x = targ(a, 0, NULL);
    if (NAMEIS("defined")) return v.t != TV_UNDEF;
    if (NAMEIS("undefined")) return v.t == TV_UNDEF;
    if (NAMEIS("none")) return v.t == TV_NONE;
    if (NAMEIS("string")) return v.t == TV_STR;
    if (NAMEIS("number")) return tv_is_num(v);
    if (NAMEIS("integer")) return v.t == TV_INT;
    if (NAMEIS("float")) return v.t == TV_FLOAT;
    if (NAMEIS("boolean")) return v.t == TV_BOOL;
    if (NAMEIS("true")) return v.t == TV_BOOL && v.u.i;
    if (NAMEIS("false")) return v.t == TV_BOOL && !v.u.i;
    if (NAMEIS("mapping")) return v.t == TV_DICT;
    if (NAMEIS("iterable"))
        return v.t == TV_STR || v.t == TV_LIST || v.t == TV_DICT || v.t == TV_UNDEF;
    if (NAMEIS("sequence"))
        return v.t == TV_STR || (v.t == TV_LIST && !v.u.l->gen) || v.t == TV_DICT;
    if (NAMEIS("callable")) return v.t == TV_FUNC;
    if (NAMEIS("escaped")) return 0;
    if (NAMEIS("lower") || NAMEIS("upper")) {
        if (v.t != TV_STR) return 0;
        int cased = 0;
        for (uint32_t i = 0; i < v.n; i++) {
            unsigned char c = (unsigned char)v.u.s[i];
            if (NAMEIS("lower") ? isupper(c) : islower(c)) return 0;
            cased |= isalpha(c);
        }
        return cased;
    }
    if (NAMEIS("even") || NAMEIS("odd")) {
        if (v.t != TV_INT && v.t != TV_BOOL)
            rt_fail(rt, "TypeError: not all arguments converted during string formatting");
        return (v.u.i % 2 == 0) == NAMEIS("even");
    }
    if (NAMEIS("filter") || NAMEIS("test")) {
        if (v.t != TV_STR) return 0;
        return NAMEIS("filter") ? tmpl_filter_known(v.u.s, v.n) : tmpl_test_known(v.u.s, v.n);
    }
    if (!x) rt_fail(rt, "TypeError: test '%.*s' needs an argument", (int)nlen, name);
    if (NAMEIS("divisibleby")) {
        if (!tv_is_num(v) || !tv_is_num(*x)) rt_fail(rt, "TypeError: divisibleby needs numbers");
        if (tv_num(*x) == 0) rt_fail(rt, "ZeroDivisionError: integer division or modulo by zero");
        if (v.t != TV_FLOAT && x->t != TV_FLOAT) return x->u.i == -1 || v.u.i % x->u.i == 0;
        return fmod(tv_num(v), tv_num(*x)) == 0;
    }
    if (NAMEIS("equalto") || NAMEIS("eq") || NAMEIS("==")) return tv_eq(v, *x);
    if (NAMEIS("ne") || NAMEIS("!=")) return !tv_eq(v, *x);
    if (NAMEIS("lt") || NAMEIS("<") || NAMEIS("lessthan")) return tv_cmp(rt, v, *x) < 0;
    if (NAMEIS("le") || NAMEIS("<=")) return tv_cmp(rt, v, *x) <= 0;
    if (NAMEIS("gt") || NAMEIS(">") || NAMEIS("greaterthan")) return tv_cmp(rt, v, *x) > 0;
    if (NAMEIS("ge") || NAMEIS(">=")) return tv_cmp(rt, v, *x) >= 0;
    if (NAMEIS("sameas")) {
        if (v.t != x->t) return 0;
        if (v.t == TV_NONE || v.t == TV_UNDEF) return 1;
        if (v.t == TV_BOOL || v.t == TV_INT) return v.u.i == x->u.i;
        if (v.t == TV_FLOAT) return 0;
        if (v.t == TV_STR) return v.u.s == x->u.s && v.n == x->n;
        return v.u.l == x->u.l;
    }
    if (NAMEIS("in")) {
        struct tval hay = *x;
        if (hay.t == TV_STR) {
            if (v.t != TV_STR)
                rt_fail(rt, "TypeError: 'in <string>' requires string as left operand");
            return !v.n || memmem(hay.u.s, hay.n, v.u.s, v.n) != NULL;
        }
        if (hay.t == TV_DICT) return td_get(hay.u.d, v) != NULL;
        uint32_t n;
        const struct tval *it = tv_iter(rt, hay, &n);
        for (uint32_t i = 0; i < n; i++)
            if (tv_eq(it[i], v)) return 1;
        return 0;
    }
    rt_fail(rt, "TemplateAssertionError: No test named '%.*s'.", (int)(nlen > 60 ? 60 : nlen),
            name);
}
