/*
 * tmpl_method: the Python methods templates call on values (str.split, str.startswith,
 * dict.get, dict.items, list.index, ...) and the globals transformers provides (range,
 * dict, namespace, raise_exception, strftime_now). Semantics follow CPython; character
 * classes (upper/lower/isalpha) are ASCII, whitespace is Python's full set.
 */
#include "text/tmpl_impl.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char *const str_methods[] = {
    "capitalize", "center",    "count",        "endswith",     "find",       "format",
    "index",      "isalnum",   "isalpha",      "isdigit",      "isdecimal",  "islower",
    "isnumeric",  "isspace",   "isupper",      "join",         "ljust",      "lower",
    "lstrip",     "partition", "removeprefix", "removesuffix", "replace",    "rfind",
    "rjust",      "rsplit",    "rstrip",       "split",        "splitlines", "startswith",
    "strip",      "swapcase",  "title",        "upper",        "zfill",      NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const list_methods[] = {"append", "copy",   "count", "extend",
                                           "index",  "insert", "pop",   NULL};
static const char *const globals[] = {"range",           "dict",         "namespace",
                                      "raise_exception", "strftime_now", NULL};

static int find_name(const char *const *list, const char *name, size_t n)
{
    for (int i = 0; list[i]; i++)
        if (strlen(list[i]) == n && !memcmp(list[i], name, n)) return i;
    return -1;
}

int tmpl_has_method(struct tval self, const char *name, size_t nlen)
{
    switch (self.t) {
    case TV_STR:
        return find_name(str_methods, name, nlen) >= 0;
    case TV_DICT:
        return find_name(dict_methods, name, nlen) >= 0;
    case TV_LIST:
        return !self.u.l->gen && find_name(list_methods, name, nlen) >= 0;
    default:
        return 0;
    }
}

int tmpl_global(const char *name, size_t nlen)
{
    return find_name(globals, name, nlen);
}

static struct tval buf_val(struct tbuf *b)
{
    return tv_sref(b->p ? b->p : "", b->n);
}

static struct tval need_str(struct rt *rt, struct tval *v, const char *m)
{
    if (!v || v->t != TV_STR)
        rt_fail(rt, "TypeError: %s() argument must be str, not %s", m,
                v ? tv_typename(*v) : "nothing");
    return *v;
}

static int in_chars(struct tval chars, const char *s, size_t cl)
{
    for (size_t i = 0; i < chars.n;) {
        size_t k = utf8_len(chars.u.s + i, chars.n - i);
        if (k == cl && !memcmp(chars.u.s + i, s, cl)) return 1;
        i += k;
    }
    return 0;
}

/* strip/lstrip/rstrip: Python whitespace, or the given characters. */
static struct tval strip(struct rt *rt, struct tval s, struct tval *chars, int left, int right)
{
    if (chars && chars->t != TV_NONE && chars->t != TV_STR)
        rt_fail(rt, "TypeError: strip arg must be None or str");
    int use = chars && chars->t == TV_STR;
    size_t b = 0, e = s.n, cl;
    while (left && b < e) {
        cl = utf8_len(s.u.s + b, e - b);
        if (!(use ? in_chars(*chars, s.u.s + b, cl) : u_isspace(s.u.s + b, e - b, &cl))) break;
        b += cl;
    }
    while (right && e > b) {
        size_t st = e - 1;
        while (st > b && ((unsigned char)s.u.s[st] >> 6) == 2) st--;
        cl = e - st;
        size_t got;
        if (!(use ? in_chars(*chars, s.u.s + st, cl)
                  : (u_isspace(s.u.s + st, cl, &got) && got == cl)))
            break;
        e = st;
    }
    return tv_sref(s.u.s + b, e - b);
}

static struct tval split(struct rt *rt, struct tval s, struct targs *a, int from_right)
{
    struct tval *sep = targ(a, 0, "sep"), *mx = targ(a, 1, "maxsplit");
    int64_t maxsplit = mx && (mx->t == TV_INT || mx->t == TV_BOOL) ? mx->u.i : -1;
    struct tval out = tv_list(rt, 0);
    if (sep && sep->t != TV_NONE) {
        struct tval p = need_str(rt, sep, "split");
        if (!p.n) rt_fail(rt, "ValueError: empty separator");
        struct tval parts = tv_list(rt, 0);
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                const char *hit =
                    maxsplit-- != 0 && i <= s.n ? memmem(s.u.s + i, s.n - i, p.u.s, p.n) : NULL;
                if (!hit) break;
                tl_push(rt, parts.u.l, tv_sref(s.u.s + i, (size_t)(hit - s.u.s) - i));
                i = (size_t)(hit - s.u.s) + p.n;
            }
            tl_push(rt, parts.u.l, tv_sref(s.u.s + i, s.n - i));
            return parts;
        }
        size_t e = s.n;
        while (maxsplit-- != 0 && e >= p.n) {
            size_t k = e - p.n + 1, found = (size_t)-1;
            while (k-- > 0)
                if (!memcmp(s.u.s + k, p.u.s, p.n)) {
                    found = k;
                    break;
                }
            if (found == (size_t)-1) break;
            tl_push(rt, parts.u.l, tv_sref(s.u.s + found + p.n, e - found - p.n));
            e = found;
        }
        tl_push(rt, parts.u.l, tv_sref(s.u.s, e));
        for (uint32_t i = parts.u.l->n; i-- > 0;) tl_push(rt, out.u.l, parts.u.l->v[i]);
        return out;
    }
    /* no separator: runs of whitespace, no empty strings */
    if (from_right) {
        struct tval parts = tv_list(rt, 0);
        size_t e = s.n;
        for (;;) {
            while (e > 0 && isspace((unsigned char)s.u.s[e - 1])) e--;
            if (!e) break;
            if (maxsplit == 0) {
                tl_push(rt, parts.u.l, tv_sref(s.u.s, e));
                break;
            }
            size_t b = e;
            while (b > 0 && !isspace((unsigned char)s.u.s[b - 1])) b--;
            tl_push(rt, parts.u.l, tv_sref(s.u.s + b, e - b));
            maxsplit--;
            e = b;
        }
        for (uint32_t i = parts.u.l->n; i-- > 0;) tl_push(rt, out.u.l, parts.u.l->v[i]);
        return out;
    }
    size_t i = 0, cl;
    for (;;) {
        while (i < s.n && u_isspace(s.u.s + i, s.n - i, &cl)) i += cl;
        if (i >= s.n) break;
        if (maxsplit == 0) {
            tl_push(rt, out.u.l, tv_sref(s.u.s + i, s.n - i));
            break;
        }
        size_t b = i;
        while (i < s.n && !u_isspace(s.u.s + i, s.n - i, &cl)) i += utf8_len(s.u.s + i, s.n - i);
        tl_push(rt, out.u.l, tv_sref(s.u.s + b, i - b));
        maxsplit--;
    }
    return out;
}

static struct tval replace(struct rt *rt, struct tval s, struct targs *a)
{
    struct tval old = need_str(rt, targ(a, 0, "old"), "replace");
    struct tval new = need_str(rt, targ(a, 1, "new"), "replace");
    struct tval *cnt = targ(a, 2, "count");
    int64_t count = cnt && (cnt->t == TV_INT || cnt->t == TV_BOOL) ? cnt->u.i : -1;
    struct tbuf b = {0};
    if (!old.n) {
        /* Python inserts `new` between characters and at both ends */
        size_t i = 0;
        while (i <= s.n) {
            if (count-- != 0) tb_put(rt, &b, new.u.s, new.n);
            if (i == s.n) break;
            size_t cl = utf8_len(s.u.s + i, s.n - i);
            tb_put(rt, &b, s.u.s + i, cl);
            i += cl;
        }
        return buf_val(&b);
    }
    size_t i = 0;
    while (i < s.n) {
        const char *hit = count != 0 ? memmem(s.u.s + i, s.n - i, old.u.s, old.n) : NULL;
        if (!hit) break;
        tb_put(rt, &b, s.u.s + i, (size_t)(hit - s.u.s) - i);
        tb_put(rt, &b, new.u.s, new.n);
        i = (size_t)(hit - s.u.s) + old.n;
        count--;
    }
    tb_put(rt, &b, s.u.s + i, s.n - i);
    return buf_val(&b);
}

/* "{} {0} {name} {x!r:>10}" -- Python str.format for the forms templates use. */
static struct tval format(struct rt *rt, struct tval f, struct targs *a)
{
    struct tbuf b = {0};
    int autoidx = 0;
    for (size_t i = 0; i < f.n; i++) {
        char c = f.u.s[i];
        if (c == '}' && i + 1 < f.n && f.u.s[i + 1] == '}') {
            tb_put(rt, &b, "}", 1);
            i++;
            continue;
        }
        if (c != '{') {
            tb_put(rt, &b, &c, 1);
            continue;
        }
        if (i + 1 < f.n && f.u.s[i + 1] == '{') {
            tb_put(rt, &b, "{", 1);
            i++;
            continue;
        }
        size_t e = i + 1;
        while (e < f.n && f.u.s[e] != '}') e++;
        if (e >= f.n) rt_fail(rt, "ValueError: Single '{' encountered in format string");
        const char *fld = f.u.s + i + 1;
        size_t fl = e - i - 1, nl = 0;
        while (nl < fl && fld[nl] != '!' && fld[nl] != ':') nl++;
        struct tval v;
        if (!nl) {
            if (autoidx >= a->npos) rt_fail(rt, "IndexError: Replacement index out of range");
            v = a->pos[autoidx++];
        } else if (isdigit((unsigned char)fld[0])) {
            long k = strtol(fld, NULL, 10);
            if (k < 0 || k >= a->npos) rt_fail(rt, "IndexError: Replacement index out of range");
            v = a->pos[k];
        } else {
            struct tval *kv = NULL;
            for (int k = 0; k < a->nkw && !kv; k++)
                if (strlen(a->kwn[k]) == nl && !memcmp(a->kwn[k], fld, nl)) kv = &a->kwv[k];
            if (!kv) rt_fail(rt, "KeyError: '%.*s'", (int)nl, fld);
            v = *kv;
        }
        size_t p = nl;
        int conv_repr = 0;
        if (p < fl && fld[p] == '!') {
            conv_repr = p + 1 < fl && fld[p + 1] == 'r';
            p += 2;
        }
        struct tbuf vb = {0};
        if (p < fl && fld[p] == ':' && tv_is_num(v) && !conv_repr) {
            char spec[32], out[128];
            snprintf(spec, sizeof spec, "%%%.*s", (int)(fl - p - 1 > 20 ? 20 : fl - p - 1),
                     fld + p + 1);
            size_t sl = strlen(spec);
            char kind = sl > 1 ? spec[sl - 1] : 0;
            if (strchr("fFeEgG%", kind) && kind != '%')
                snprintf(out, sizeof out, spec, tv_num(v));
            else if (strchr("dxXob", kind) && kind != 'b' && kind != 'o' && v.t != TV_FLOAT) {
                spec[sl - 1] = 0;
                char s2[40];
                snprintf(s2, sizeof s2, "%s%s%c", spec, "ll", kind);
                snprintf(out, sizeof out, s2, (long long)v.u.i);
            } else {
                struct tbuf nb = {0};
                tb_str(rt, &nb, v);
                snprintf(out, sizeof out, "%.*s", (int)nb.n, nb.p ? nb.p : "");
            }
            tb_puts(rt, &b, out);
        } else {
            if (conv_repr)
                tb_repr(rt, &vb, v);
            else
                tb_str(rt, &vb, v);
            /* width with optional fill/align: "{:>10}", "{:<5}" */
            long width = 0;
            char align = '<', fill = ' ';
            if (p < fl && fld[p] == ':') {
                const char *sp = fld + p + 1;
                size_t sl = fl - p - 1, k = 0;
                if (sl >= 2 && strchr("<>^", sp[1])) {
                    fill = sp[0];
                    align = sp[1];
                    k = 2;
                } else if (sl >= 1 && strchr("<>^", sp[0])) {
                    align = sp[0];
                    k = 1;
                }
                while (k < sl && isdigit((unsigned char)sp[k]) && width < 10000)
                    width = width * 10 + (sp[k++] - '0');
            }
            long pad = width > (long)vb.n ? width - (long)vb.n : 0;
            long lp = align == '>' ? pad : align == '^' ? pad / 2 : 0;
            for (long k = 0; k < lp; k++) tb_put(rt, &b, &fill, 1);
            tb_put(rt, &b, vb.p ? vb.p : "", vb.n);
            for (long k = 0; k < pad - lp; k++) tb_put(rt, &b, &fill, 1);
        }
        i = e;
    }
    return buf_val(&b);
}

/* "%s" % value: printf-style formatting as Python's str % does it (s, r, d, i, f, %). */
static struct tval str_mod(struct rt *rt, struct tval fmt, struct tval args)
{
    const struct tval *av = &args;
    uint32_t na = 1, used = 0;
    if (args.t == TV_LIST && args.u.l->tuple) {
        av = args.u.l->v;
        na = args.u.l->n;
    }
    struct tbuf b = {0};
    for (size_t i = 0; i < fmt.n; i++) {
        char c = fmt.u.s[i];
        if (c != '%' || i + 1 >= fmt.n) {
            tb_put(rt, &b, &c, 1);
            continue;
        }
        char k = fmt.u.s[++i];
        if (k == '%') {
            tb_put(rt, &b, "%", 1);
            continue;
        }
        if (used >= na) rt_fail(rt, "TypeError: not enough arguments for format string");
        struct tval x = av[used++];
        if (k == 's') {
            tb_str(rt, &b, x);
        } else if (k == 'r') {
            tb_repr(rt, &b, x);
        } else if ((k == 'd' || k == 'i') && tv_is_num(x)) {
            tb_str(rt, &b, tv_int(x.t == TV_FLOAT ? (int64_t)x.u.f : x.u.i));
        } else if (k == 'f' && tv_is_num(x)) {
            char s[64];
            snprintf(s, sizeof s, "%f", tv_num(x));
            tb_puts(rt, &b, s);
        } else {
            rt_fail(rt, "ValueError: unsupported format character '%c'", k);
        }
    }
    if (used < na) rt_fail(rt, "TypeError: not all arguments converted during string formatting");
    return buf_val(&b);
}

static int64_t find(struct tval s, struct tval sub, int rev)
{
    if (sub.n > s.n) return -1;
    if (!rev) {
        const char *h = sub.n ? memmem(s.u.s, s.n, sub.u.s, sub.n) : s.u.s;
        return h ? h - s.u.s : -1;
    }
    for (size_t k = s.n - sub.n + 1; k-- > 0;)
        if (!memcmp(s.u.s + k, sub.u.s, sub.n)) return (int64_t)k;
    return -1;
}

/* Byte offset -> character index (Python indexes code points). */
static int64_t char_index(struct tval s, int64_t byte)
{
    if (byte < 0) return byte;
    int64_t k = 0;
    for (int64_t i = 0; i < byte; i += (int64_t)utf8_len(s.u.s + i, s.n - (size_t)i)) k++;
    return k;
}

static int all_chars(struct tval s, int (*pred)(int))
{
    if (!s.n) return 0;
    for (uint32_t i = 0; i < s.n; i++)
        if (!pred((unsigned char)s.u.s[i])) return 0;
    return 1;
}

static struct tval pad(struct rt *rt, struct tval s, struct targs *a, int mode)
{
    int64_t width = 0;
    struct tval *w = targ(a, 0, "width"), *f = targ(a, 1, "fillchar");
    if (w && (w->t == TV_INT || w->t == TV_BOOL)) width = w->u.i;
    if (width > 100000) width = 100000;
    struct tval fill = f && f->t == TV_STR && f->n ? *f : tv_cstr(" ");
    int64_t len = tv_len(rt, s), total = width > len ? width - len : 0;
    /* CPython center(): left = total/2 + (total & width & 1) */
    int64_t left = mode == 0 ? total / 2 + (total & width & 1) : mode == 1 ? 0 : total;
    struct tbuf b = {0};
    for (int64_t i = 0; i < left; i++) tb_put(rt, &b, fill.u.s, fill.n);
    tb_put(rt, &b, s.u.s, s.n);
    for (int64_t i = 0; i < total - left; i++) tb_put(rt, &b, fill.u.s, fill.n);
    return buf_val(&b);
}

static int is_prefix_at(struct tval s, struct tval p, int suffix)
{
    if (p.n > s.n) return 0;
    return !memcmp(s.u.s + (suffix ? s.n - p.n : 0), p.u.s, p.n);
}

static int starts_ends(struct rt *rt, struct tval s, struct targs *a, int suffix)
{
    struct tval *p = targ(a, 0, NULL);
    if (!p) rt_fail(rt, "TypeError: startswith/endswith takes a prefix");
    if (p->t == TV_STR) return is_prefix_at(s, *p, suffix);
    if (p->t == TV_LIST && p->u.l->tuple) {
        for (uint32_t i = 0; i < p->u.l->n; i++)
            if (p->u.l->v[i].t == TV_STR && is_prefix_at(s, p->u.l->v[i], suffix)) return 1;
        return 0;
    }
    rt_fail(rt, "TypeError: startswith first arg must be str or a tuple of str, not %s",
            tv_typename(*p));
}

static struct tval str_method(struct rt *rt, struct tval s, const char *m, struct targs *a)
{
#define M(w) (!strcmp(m, w))
    if (M("__mod__")) return str_mod(rt, s, a->pos[0]);
    if (M("strip")) return strip(rt, s, targ(a, 0, "chars"), 1, 1);
    if (M("lstrip")) return strip(rt, s, targ(a, 0, "chars"), 1, 0);
    if (M("rstrip")) return strip(rt, s, targ(a, 0, "chars"), 0, 1);
    if (M("split")) return split(rt, s, a, 0);
    if (M("rsplit")) return split(rt, s, a, 1);
    if (M("replace")) return replace(rt, s, a);
    if (M("startswith")) return tv_bool(starts_ends(rt, s, a, 0));
    if (M("endswith")) return tv_bool(starts_ends(rt, s, a, 1));
    if (M("upper") || M("lower") || M("capitalize") || M("swapcase") || M("title")) {
        char *d = rt_alloc(rt, s.n);
        int prev_cased = 0;
        for (uint32_t i = 0; i < s.n; i++) {
            int c = (unsigned char)s.u.s[i];
            if (M("upper"))
                c = toupper(c);
            else if (M("lower"))
                c = tolower(c);
            else if (M("capitalize"))
                c = i ? tolower(c) : toupper(c);
            else if (M("swapcase"))
                c = isupper(c) ? tolower(c) : toupper(c);
            else {
                /* str.title(): a letter after a non-letter starts a word */
                int alpha = isalpha(c);
                c = alpha ? (prev_cased ? tolower(c) : toupper(c)) : c;
                prev_cased = alpha;
            }
            d[i] = (char)c;
        }
        return tv_sref(d, s.n);
    }
    if (M("format")) return format(rt, s, a);
    if (M("join")) {
        struct tval *it = targ(a, 0, "iterable");
        if (!it) rt_fail(rt, "TypeError: join() takes exactly one argument");
        uint32_t n;
        const struct tval *v = tv_iter(rt, *it, &n);
        struct tbuf b = {0};
        for (uint32_t i = 0; i < n; i++) {
            if (v[i].t != TV_STR)
                rt_fail(rt, "TypeError: sequence item %u: expected str instance, %s found", i,
                        tv_typename(v[i]));
            if (i) tb_put(rt, &b, s.u.s, s.n);
            tb_put(rt, &b, v[i].u.s, v[i].n);
        }
        return buf_val(&b);
    }
    if (M("find") || M("rfind") || M("index")) {
        struct tval sub = need_str(rt, targ(a, 0, "sub"), m);
        int64_t r = char_index(s, find(s, sub, M("rfind")));
        if (r < 0 && M("index")) rt_fail(rt, "ValueError: substring not found");
        return tv_int(r);
    }
    if (M("count")) {
        struct tval sub = need_str(rt, targ(a, 0, "sub"), m);
        if (!sub.n) return tv_int(tv_len(rt, s) + 1);
        int64_t n = 0;
        for (size_t i = 0; i + sub.n <= s.n;) {
            const char *h = memmem(s.u.s + i, s.n - i, sub.u.s, sub.n);
            if (!h) break;
            n++;
            i = (size_t)(h - s.u.s) + sub.n;
        }
        return tv_int(n);
    }
    if (M("isdigit") || M("isdecimal") || M("isnumeric")) return tv_bool(all_chars(s, isdigit));
    if (M("isalpha")) return tv_bool(all_chars(s, isalpha));
    if (M("isalnum")) return tv_bool(all_chars(s, isalnum));
    if (M("isspace")) return tv_bool(all_chars(s, isspace));
    if (M("islower") || M("isupper")) {
        int cased = 0;
        for (uint32_t i = 0; i < s.n; i++) {
            int c = (unsigned char)s.u.s[i];
            if (M("islower") ? isupper(c) : islower(c)) return tv_bool(0);
            cased |= isalpha(c);
        }
        return tv_bool(cased);
    }
    if (M("center")) return pad(rt, s, a, 0);
    if (M("ljust")) return pad(rt, s, a, 1);
    if (M("rjust")) return pad(rt, s, a, 2);
    if (M("zfill")) {
        int64_t w = 0;
        struct tval *wv = targ(a, 0, "width");
        if (wv && wv->t == TV_INT) w = wv->u.i > 100000 ? 100000 : wv->u.i;
        struct tbuf b = {0};
        size_t sign = s.n && (s.u.s[0] == '-' || s.u.s[0] == '+');
        tb_put(rt, &b, s.u.s, sign);
        for (int64_t i = tv_len(rt, s); i < w; i++) tb_put(rt, &b, "0", 1);
        tb_put(rt, &b, s.u.s + sign, s.n - sign);
        return buf_val(&b);
    }
    if (M("splitlines")) {
        struct tval out = tv_list(rt, 0);
        size_t st = 0, i = 0;
        while (i < s.n) {
            char c = s.u.s[i];
            if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
                tl_push(rt, out.u.l, tv_sref(s.u.s + st, i - st));
                i += (c == '\r' && i + 1 < s.n && s.u.s[i + 1] == '\n') ? 2 : 1;
                st = i;
            } else {
                i++;
            }
        }
        if (st < s.n) tl_push(rt, out.u.l, tv_sref(s.u.s + st, s.n - st));
        return out;
    }
    if (M("partition")) {
        struct tval sep = need_str(rt, targ(a, 0, "sep"), m);
        if (!sep.n) rt_fail(rt, "ValueError: empty separator");
        struct tval t = tv_list(rt, 3);
        t.u.l->tuple = 1;
        int64_t at = find(s, sep, 0);
        if (at < 0) {
            tl_push(rt, t.u.l, s);
            tl_push(rt, t.u.l, tv_cstr(""));
            tl_push(rt, t.u.l, tv_cstr(""));
        } else {
            tl_push(rt, t.u.l, tv_sref(s.u.s, (size_t)at));
            tl_push(rt, t.u.l, sep);
            tl_push(rt, t.u.l, tv_sref(s.u.s + at + sep.n, s.n - (size_t)at - sep.n));
        }
        return t;
    }
    if (M("removeprefix") || M("removesuffix")) {
        struct tval p = need_str(rt, targ(a, 0, "prefix"), m);
        int suf = M("removesuffix");
        if (!is_prefix_at(s, p, suf)) return s;
        return tv_sref(s.u.s + (suf ? 0 : p.n), s.n - p.n);
    }
#undef M
    rt_fail(rt, "AttributeError: 'str' object has no attribute '%s'", m);
}

struct tval tmpl_call_method(struct rt *rt, struct tval self, const char *m, struct targs *a)
{
    if (self.t == TV_STR) return str_method(rt, self, m, a);
    if (self.t == TV_DICT) {
        struct tdict *d = self.u.d;
        if (!strcmp(m, "get")) {
            struct tval *k = targ(a, 0, "key"), *def = targ(a, 1, "default");
            if (!k) rt_fail(rt, "TypeError: get expected at least 1 argument");
            struct tval *v = td_get(d, *k);
            return v ? *v : def ? *def : tv_none();
        }
        if (!strcmp(m, "copy")) {
            struct tval c = tv_dict(rt, d->n);
            for (uint32_t i = 0; i < d->n; i++) td_set(rt, c.u.d, d->k[i], d->v[i]);
            return c;
        }
        struct tval out = tv_list(rt, d->n);
        for (uint32_t i = 0; i < d->n; i++) {
            if (!strcmp(m, "keys")) {
                tl_push(rt, out.u.l, d->k[i]);
            } else if (!strcmp(m, "values")) {
                tl_push(rt, out.u.l, d->v[i]);
            } else {
                struct tval t = tv_list(rt, 2);
                t.u.l->tuple = 1;
                tl_push(rt, t.u.l, d->k[i]);
                tl_push(rt, t.u.l, d->v[i]);
                tl_push(rt, out.u.l, t);
            }
        }
        return out;
    }
    if (self.t == TV_LIST) {
        struct tlist *l = self.u.l;
        if (l->tuple && (!strcmp(m, "append") || !strcmp(m, "pop") || !strcmp(m, "extend") ||
                         !strcmp(m, "insert")))
            rt_fail(rt, "AttributeError: 'tuple' object has no attribute '%s'", m);
        struct tval *x = targ(a, 0, NULL);
        if (!strcmp(m, "append")) {
            if (!x) rt_fail(rt, "TypeError: append() takes exactly one argument");
            tl_push(rt, l, *x);
            return tv_none();
        }
        if (!strcmp(m, "extend")) {
            if (!x) rt_fail(rt, "TypeError: extend() takes exactly one argument");
            uint32_t n;
            const struct tval *it = tv_iter(rt, *x, &n);
            for (uint32_t i = 0; i < n; i++) tl_push(rt, l, it[i]);
            return tv_none();
        }
        if (!strcmp(m, "pop") || !strcmp(m, "insert")) {
            int ins = !strcmp(m, "insert");
            int64_t i = x && (x->t == TV_INT || x->t == TV_BOOL) ? x->u.i : ins ? 0 : -1;
            if (i < 0) i += l->n;
            if (ins) {
                struct tval *v = targ(a, 1, NULL);
                if (!v) rt_fail(rt, "TypeError: insert expected 2 arguments");
                if (i < 0) i = 0;
                if (i > l->n) i = l->n;
                tl_push(rt, l, *v);
                memmove(l->v + i + 1, l->v + i, (size_t)(l->n - 1 - i) * sizeof *l->v);
                l->v[i] = *v;
                return tv_none();
            }
            if (i < 0 || i >= l->n) rt_fail(rt, "IndexError: pop index out of range");
            struct tval r = l->v[i];
            memmove(l->v + i, l->v + i + 1, (size_t)(l->n - 1 - i) * sizeof *l->v);
            l->n--;
            return r;
        }
        if (!strcmp(m, "copy")) {
            struct tval c = tv_list(rt, l->n);
            for (uint32_t i = 0; i < l->n; i++) tl_push(rt, c.u.l, l->v[i]);
            return c;
        }
        if (!x) rt_fail(rt, "TypeError: %s() takes exactly one argument", m);
        int64_t n = 0;
        for (uint32_t i = 0; i < l->n; i++) {
            if (!tv_eq(l->v[i], *x)) continue;
            if (!strcmp(m, "index")) return tv_int(i);
            n++;
        }
        if (!strcmp(m, "index")) rt_fail(rt, "ValueError: value is not in list");
        return tv_int(n);
    }
    rt_fail(rt, "AttributeError: '%s' object has no attribute '%s'", tv_typename(self), m);
}

struct tval tmpl_call_global(struct rt *rt, const char *name, struct targs *a)
{
    if (!strcmp(name, "raise_exception")) {
        struct tval *msg = targ(a, 0, "message");
        struct tbuf b = {0};
        if (msg) tb_str(rt, &b, *msg);
        rt_fail(rt, "TemplateError: %.*s", (int)(b.n > 800 ? 800 : b.n), b.p ? b.p : "");
    }
    if (!strcmp(name, "range")) {
        int64_t v[3] = {0, 0, 1};
        if (a->npos < 1 || a->npos > 3) rt_fail(rt, "TypeError: range expected 1 to 3 arguments");
        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i].t != TV_INT && a->pos[i].t != TV_BOOL)
                rt_fail(rt, "TypeError: '%s' object cannot be interpreted as an integer",
                        tv_typename(a->pos[i]));
        }
        if (a->npos == 1)
            v[1] = a->pos[0].u.i;
        else
            for (int i = 0; i < a->npos; i++) v[i] = a->pos[i].u.i;
        if (!v[2]) rt_fail(rt, "ValueError: range() arg 3 must not be zero");
        /* jinja2's sandbox refuses ranges over MAX_RANGE (100000) items */
        double cnt = ((double)v[1] - (double)v[0]) / (double)v[2];
        if (cnt > 100000)
            rt_fail(rt, "OverflowError: Range too big. The sandbox blocks ranges larger than "
                        "MAX_RANGE (100000).");
        struct tval out = tv_list(rt, cnt > 0 ? (uint32_t)ceil(cnt) : 0);
        for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2])
            tl_push(rt, out.u.l, tv_int(i));
        return out;
    }
    if (!strcmp(name, "dict") || !strcmp(name, "namespace")) {
        struct tval d = tv_dict(rt, (uint32_t)a->nkw);
        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i].t != TV_DICT && a->pos[i].t != TV_NS)
                rt_fail(rt, "TypeError: %s() positional argument must be a mapping", name);
            for (uint32_t k = 0; k < a->pos[i].u.d->n; k++)
                td_set(rt, d.u.d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]);
        }
        for (int i = 0; i < a->nkw; i++) td_set(rt, d.u.d, tv_cstr(a->kwn[i]), a->kwv[i]);
        if (name[0] == 'n') d.t = TV_NS;
        return d;
    }
    if (!strcmp(name, "strftime_now")) {
        struct tval *f = targ(a, 0, "format");
        if (!f || f->t != TV_STR) rt_fail(rt, "TypeError: strftime_now needs a format string");
        char fmt[256], out[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)f->n, f->u.s);
        /* SOURCE_DATE_EPOCH pins "now" for reproducible prompts (and tests) */
        const char *sde = getenv("SOURCE_DATE_EPOCH");
        time_t now = sde && *sde ? (time_t)strtoll(sde, NULL, 10) : time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(out, sizeof out, fmt, &tm);
        return tv_str(rt, out, n);
    }
    rt_fail(rt, "UndefinedError: '%s' is undefined", name);
}
