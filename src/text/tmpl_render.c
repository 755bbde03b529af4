/*
 * tmpl_render: walks the syntax tree with a chain of scopes. Scoping follows jinja2:
 * every for-loop iteration and every macro call gets a fresh scope whose `set`s vanish
 * when it ends (namespace() objects are the way out), `if` blocks share their parent's.
 * Lookups go scope chain -> the caller's context -> globals -> undefined.
 *
 * Cost bounds: every loop iteration and call is a step (TMPL_MAX_STEPS), nesting is
 * capped at TMPL_MAX_DEPTH, and all memory comes from one arena capped at TMPL_MAX_MEMORY.
 */
#include "text/tmpl.h"
#include "text/tmpl_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

struct tscope {
    struct tscope *parent;
    struct tdict vars;
};

void rt_fail(struct rt *rt, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set(rt->e, "%s (line %d)", msg, rt->line);
    longjmp(rt->jb, 1);
}

void *rt_alloc(struct rt *rt, size_t n)
{
    void *p = ta_alloc(&rt->a, n);
    if (!p) {
        err_set(rt->e, "MemoryError: template used more than %u MiB (line %d)",
                TMPL_MAX_MEMORY >> 20, rt->line);
        longjmp(rt->jb, 1);
    }
    return p;
}

void rt_step(struct rt *rt)
{
    if (++rt->steps > TMPL_MAX_STEPS) rt_fail(rt, "RuntimeError: template runs too long");
}

static void enter(struct rt *rt)
{
    if (++rt->depth > TMPL_MAX_DEPTH) rt_fail(rt, "RecursionError: nested too deeply");
}

static struct tscope *scope_new(struct rt *rt, struct tscope *parent)
{
    struct tscope *s = rt_alloc(rt, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(struct rt *rt, struct tscope *s, const char *name, size_t n, struct tval v)
{
    td_set(rt, &s->vars, tv_sref(name, n), v);
}

/* An undefined value carrying jinja2's wording for when it is misused. */
static struct tval undef_fmt(struct rt *rt, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static struct tval undef_fmt(struct rt *rt, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (k < 0) k = 0;
    if ((size_t)k >= sizeof msg) k = sizeof msg - 1;
    struct tval s = tv_str(rt, msg, (size_t)k);
    return tv_undef(s.u.s, s.n);
}

_Noreturn static void fail_undef(struct rt *rt, struct tval u)
{
    rt_fail(rt, "UndefinedError: %.*s", (int)u.n, u.u.s ? u.u.s : "undefined");
}

static struct tval lookup(struct rt *rt, struct tscope *s, const char *name, size_t n)
{
    for (; s; s = s->parent) {
        struct tval *v = td_gets(&s->vars, name, n);
        if (v) return *v;
    }
    struct tval *v = rt->ctx ? td_gets(rt->ctx, name, n) : NULL;
    if (v) return *v;
    if (tmpl_global(name, n) >= 0) {
        struct tfunc *f = rt_alloc(rt, sizeof *f);
        f->kind = TFN_BUILTIN;
        char *nm = rt_alloc(rt, n + 1);
        memcpy(nm, name, n);
        f->name = nm;
        struct tval fv = {.t = TV_FUNC, .u.fn = f};
        return fv;
    }
    return undef_fmt(rt, "'%.*s' is undefined", (int)(n > 100 ? 100 : n), name);
}

static const char *obj_desc(struct tval v, char *buf, size_t cap)
{
    if (v.t == TV_NONE) return "'None'";
    snprintf(buf, cap, "'%s object'", tv_typename(v));
    return buf;
}

static struct tval bound(struct rt *rt, struct tval self, const char *name, size_t n, int kind)
{
    struct tfunc *f = rt_alloc(rt, sizeof *f);
    f->kind = (uint8_t)kind;
    char *nm = rt_alloc(rt, n + 1);
    memcpy(nm, name, n);
    f->name = nm;
    f->self = self;
    struct tval fv = {.t = TV_FUNC, .u.fn = f};
    return fv;
}

static struct tval loop_attr(struct rt *rt, struct tval lv, const char *name, size_t n)
{
    struct tloop *L = lv.u.loop;
#define IS(w) (n == sizeof(w) - 1 && !memcmp(name, w, n))
    if (IS("index")) return tv_int(L->index0 + 1);
    if (IS("index0")) return tv_int(L->index0);
    if (IS("revindex")) return tv_int(L->length - L->index0);
    if (IS("revindex0")) return tv_int(L->length - L->index0 - 1);
    if (IS("first")) return tv_bool(L->index0 == 0);
    if (IS("last")) return tv_bool(L->index0 == L->length - 1);
    if (IS("length")) return tv_int(L->length);
    if (IS("depth")) return tv_int(1);
    if (IS("depth0")) return tv_int(0);
    if (IS("previtem"))
        return L->index0 > 0 ? L->items[L->index0 - 1] : undef_fmt(rt, "there is no previous item");
    if (IS("nextitem"))
        return L->index0 + 1 < L->length ? L->items[L->index0 + 1]
                                         : undef_fmt(rt, "there is no next item");
    if (IS("cycle")) return bound(rt, lv, name, n, TFN_CYCLE);
#undef IS
    return undef_fmt(rt, "'LoopContext object' has no attribute '%.*s'", (int)n, name);
}

struct tval rt_getattr(struct rt *rt, struct tval obj, const char *name, size_t n)
{
    char b[64];
    if (n > 100) n = 100;
    switch (obj.t) {
    case TV_UNDEF:
        fail_undef(rt, obj);
    case TV_DICT:
        if (tmpl_has_method(obj, name, n)) return bound(rt, obj, name, n, TFN_METHOD);
        /* fallthrough */
    case TV_NS: {
        struct tval *v = td_gets(obj.u.d, name, n);
        if (v) return *v;
        break;
    }
    case TV_LOOP:
        return loop_attr(rt, obj, name, n);
    default:
        if (tmpl_has_method(obj, name, n)) return bound(rt, obj, name, n, TFN_METHOD);
        break;
    }
    return undef_fmt(rt, "%s has no attribute '%.*s'", obj_desc(obj, b, sizeof b), (int)n, name);
}

struct tval rt_getitem(struct rt *rt, struct tval obj, struct tval key)
{
    char b[64];
    if (obj.t == TV_UNDEF) fail_undef(rt, obj);
    if (obj.t == TV_DICT) {
        struct tval *v = td_get(obj.u.d, key);
        if (v) return *v;
    } else if ((obj.t == TV_LIST && !obj.u.l->gen) || obj.t == TV_STR) {
        if (key.t == TV_INT || key.t == TV_BOOL) {
            int64_t i = key.u.i;
            if (obj.t == TV_LIST) {
                if (i < 0) i += obj.u.l->n;
                if (i >= 0 && i < obj.u.l->n) return obj.u.l->v[i];
            } else {
                uint32_t cnt;
                const struct tval *ch = tv_iter(rt, obj, &cnt);
                if (i < 0) i += cnt;
                if (i >= 0 && i < cnt) return ch[i];
            }
            return undef_fmt(rt, "%s has no element %" PRId64, obj_desc(obj, b, sizeof b), key.u.i);
        }
    }
    if (key.t == TV_STR) return rt_getattr(rt, obj, key.u.s, key.n);
    struct tbuf kb = {0};
    tb_repr(rt, &kb, key);
    return undef_fmt(rt, "%s has no element %.*s", obj_desc(obj, b, sizeof b),
                     (int)(kb.n > 80 ? 80 : kb.n), kb.p ? kb.p : "");
}

/* Python's slice index rules (negative indices, clamping, negative steps). */
static struct tval do_slice(struct rt *rt, struct tval obj, struct tval *st, struct tval *sp,
                            struct tval *sk)
{
    if (obj.t == TV_UNDEF) fail_undef(rt, obj);
    int64_t step = 1;
    struct tval *parts[3] = {st, sp, sk};
    for (int k = 0; k < 3; k++)
        if (parts[k] && parts[k]->t != TV_NONE && parts[k]->t != TV_INT && parts[k]->t != TV_BOOL)
            rt_fail(rt, "TypeError: slice indices must be integers or None");
    if (sk && sk->t != TV_NONE) step = sk->u.i;
    if (step == 0) rt_fail(rt, "ValueError: slice step cannot be zero");
    uint32_t len;
    const struct tval *items;
    if (obj.t == TV_STR || (obj.t == TV_LIST && !obj.u.l->gen))
        items = tv_iter(rt, obj, &len);
    else
        return undef_fmt(rt, "'%s' object is not subscriptable", tv_typename(obj));
    int64_t n = len, lower = step > 0 ? 0 : -1, upper = step > 0 ? n : n - 1;
    int64_t start, stop;
    if (!st || st->t == TV_NONE) {
        start = step < 0 ? upper : lower;
    } else {
        start = st->u.i;
        if (start < 0) start = start + n < lower ? lower : start + n;
        if (start > upper) start = upper;
    }
    if (!sp || sp->t == TV_NONE) {
        stop = step < 0 ? lower : upper;
    } else {
        stop = sp->u.i;
        if (stop < 0) stop = stop + n < lower ? lower : stop + n;
        if (stop > upper) stop = upper;
    }
    if (obj.t == TV_STR) {
        struct tbuf b = {0};
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            tb_put(rt, &b, items[i].u.s, items[i].n);
        return tv_sref(b.p ? b.p : "", b.n);
    }
    struct tval out = tv_list(rt, 0);
    out.u.l->tuple = obj.u.l->tuple;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        tl_push(rt, out.u.l, items[i]);
    return out;
}

static struct tval eval(struct rt *rt, const struct tnode *nd, struct tscope *s);
static void exec_body(struct rt *rt, struct tnode **kids, int n, struct tscope *s);

static int contains(struct rt *rt, struct tval hay, struct tval needle)
{
    if (hay.t == TV_STR) {
        if (needle.t != TV_STR)
            rt_fail(rt, "TypeError: 'in <string>' requires string as left operand, not %s",
                    tv_typename(needle));
        if (!needle.n) return 1;
        return needle.n <= hay.n && memmem(hay.u.s, hay.n, needle.u.s, needle.n) != NULL;
    }
    if (hay.t == TV_DICT || hay.t == TV_NS) return td_get(hay.u.d, needle) != NULL;
    if (hay.t != TV_LIST && hay.t != TV_UNDEF)
        rt_fail(rt, "TypeError: argument of type '%s' is not iterable", tv_typename(hay));
    uint32_t n;
    const struct tval *it = tv_iter(rt, hay, &n);
    for (uint32_t i = 0; i < n; i++)
        if (tv_eq(it[i], needle)) return 1;
    return 0;
}

_Noreturn static void bad_operands(struct rt *rt, const char *op, struct tval a, struct tval b)
{
    if (a.t == TV_UNDEF) fail_undef(rt, a);
    if (b.t == TV_UNDEF) fail_undef(rt, b);
    if (!strcmp(op, "+") && (a.t == TV_STR || (a.t == TV_LIST && !a.u.l->gen)))
        rt_fail(rt, "TypeError: can only concatenate %s (not \"%s\") to %s", tv_typename(a),
                tv_typename(b), tv_typename(a));
    rt_fail(rt, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", op, tv_typename(a),
            tv_typename(b));
}

static int64_t checked(struct rt *rt, int overflow, int64_t r)
{
    if (overflow) rt_fail(rt, "OverflowError: integer result too large");
    return r;
}

static struct tval binop(struct rt *rt, int op, struct tval a, struct tval b)
{
    int both_int = (a.t == TV_INT || a.t == TV_BOOL) && (b.t == TV_INT || b.t == TV_BOOL);
    int nums = tv_is_num(a) && tv_is_num(b);
    int64_t r;
    switch (op) {
    case OP_CONCAT:
        return tv_concat(rt, tv_to_str(rt, a), tv_to_str(rt, b));
    case OP_EQ:
        return tv_bool(tv_eq(a, b));
    case OP_NE:
        return tv_bool(!tv_eq(a, b));
    case OP_LT:
        return tv_bool(tv_cmp(rt, a, b) < 0);
    case OP_LE:
        return tv_bool(tv_cmp(rt, a, b) <= 0);
    case OP_GT:
        return tv_bool(tv_cmp(rt, a, b) > 0);
    case OP_GE:
        return tv_bool(tv_cmp(rt, a, b) >= 0);
    case OP_IN:
        return tv_bool(contains(rt, b, a));
    case OP_NOTIN:
        return tv_bool(!contains(rt, b, a));
    case OP_ADD:
        if (both_int) {
            checked(rt, __builtin_add_overflow(a.u.i, b.u.i, &r), 0);
            return tv_int(r);
        }
        if (nums) return tv_float(tv_num(a) + tv_num(b));
        if (a.t == TV_STR && b.t == TV_STR) {
            /* Markup + str escapes the str, as markupsafe does */
            if (a.markup != b.markup) {
                if (a.markup)
                    b = tv_escape(rt, b);
                else
                    a = tv_escape(rt, a);
            }
            struct tval r2 = tv_concat(rt, a, b);
            r2.markup = a.markup;
            return r2;
        }
        if (a.t == TV_LIST && b.t == TV_LIST && !a.u.l->gen && !b.u.l->gen &&
            a.u.l->tuple == b.u.l->tuple) {
            struct tval l = tv_list(rt, a.u.l->n + b.u.l->n);
            l.u.l->tuple = a.u.l->tuple;
            for (uint32_t i = 0; i < a.u.l->n; i++) tl_push(rt, l.u.l, a.u.l->v[i]);
            for (uint32_t i = 0; i < b.u.l->n; i++) tl_push(rt, l.u.l, b.u.l->v[i]);
            return l;
        }
        bad_operands(rt, "+", a, b);
    case OP_SUB:
        if (both_int) {
            checked(rt, __builtin_sub_overflow(a.u.i, b.u.i, &r), 0);
            return tv_int(r);
        }
        if (nums) return tv_float(tv_num(a) - tv_num(b));
        bad_operands(rt, "-", a, b);
    case OP_MUL:
        if (both_int) {
            checked(rt, __builtin_mul_overflow(a.u.i, b.u.i, &r), 0);
            return tv_int(r);
        }
        if (nums) return tv_float(tv_num(a) * tv_num(b));
        if ((a.t == TV_STR || a.t == TV_LIST) && (b.t == TV_INT || b.t == TV_BOOL)) {
            struct tval t = a;
            a = b;
            b = t;
        }
        if ((a.t == TV_INT || a.t == TV_BOOL) && (b.t == TV_STR || b.t == TV_LIST) && a.u.i > 0 &&
            (double)a.u.i * (b.t == TV_STR ? b.n : b.u.l->n * 16.0) > TMPL_MAX_OUTPUT)
            rt_fail(rt, "MemoryError: repetition result too large");
        if ((a.t == TV_INT || a.t == TV_BOOL) && b.t == TV_STR) {
            struct tbuf buf = {0};
            for (int64_t i = 0; i < a.u.i; i++) tb_put(rt, &buf, b.u.s, b.n);
            return tv_sref(buf.p ? buf.p : "", buf.n);
        }
        if ((a.t == TV_INT || a.t == TV_BOOL) && b.t == TV_LIST && !b.u.l->gen) {
            struct tval l = tv_list(rt, 0);
            l.u.l->tuple = b.u.l->tuple;
            for (int64_t i = 0; i < a.u.i; i++)
                for (uint32_t k = 0; k < b.u.l->n; k++) tl_push(rt, l.u.l, b.u.l->v[k]);
            return l;
        }
        bad_operands(rt, "*", a, b);
    case OP_DIV:
        if (!nums) bad_operands(rt, "/", a, b);
        if (tv_num(b) == 0) rt_fail(rt, "ZeroDivisionError: division by zero");
        return tv_float(tv_num(a) / tv_num(b));
    case OP_FLOORDIV:
        if (!nums) bad_operands(rt, "//", a, b);
        if (tv_num(b) == 0) rt_fail(rt, "ZeroDivisionError: integer division or modulo by zero");
        if (both_int) {
            if (a.u.i == INT64_MIN && b.u.i == -1) checked(rt, 1, 0);
            int64_t q = a.u.i / b.u.i;
            if ((a.u.i % b.u.i != 0) && ((a.u.i < 0) != (b.u.i < 0))) q--;
            return tv_int(q);
        }
        return tv_float(floor(tv_num(a) / tv_num(b)));
    case OP_MOD:
        if (a.t == TV_STR) {
            struct targs m = {.pos = &b, .npos = 1};
            return tmpl_call_method(rt, a, "__mod__", &m);
        }
        if (!nums) bad_operands(rt, "%", a, b);
        if (tv_num(b) == 0) rt_fail(rt, "ZeroDivisionError: integer division or modulo by zero");
        if (both_int) {
            if (b.u.i == -1) return tv_int(0);
            int64_t m = a.u.i % b.u.i;
            if (m != 0 && ((m < 0) != (b.u.i < 0))) m += b.u.i;
            return tv_int(m);
        } else {
            double x = tv_num(a), y = tv_num(b), m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return tv_float(m);
        }
    case OP_POW:
        if (!nums) bad_operands(rt, "**", a, b);
        if (both_int && b.u.i >= 0) {
            int64_t base = a.u.i, res = 1, e = b.u.i;
            while (e > 0) {
                if (e & 1) checked(rt, __builtin_mul_overflow(res, base, &res), 0);
                e >>= 1;
                if (e) checked(rt, __builtin_mul_overflow(base, base, &base), 0);
            }
            return tv_int(res);
        }
        return tv_float(pow(tv_num(a), tv_num(b)));
    }
    rt_fail(rt, "TemplateRuntimeError: unknown operator");
}

/* Positional and keyword arguments of a call/filter/test node, evaluated. */
static void eval_args(struct rt *rt, const struct tnode *nd, struct tscope *s, struct targs *a,
                      int extra)
{
    memset(a, 0, sizeof *a);
    a->npos = nd->nkids;
    if (nd->nkids) a->pos = rt_alloc(rt, (size_t)nd->nkids * sizeof *a->pos);
    for (int i = 0; i < nd->nkids; i++) a->pos[i] = eval(rt, nd->kids[i], s);
    a->nkw = nd->nkids2;
    a->kwn = rt_alloc(rt, (size_t)(nd->nkids2 + extra) * sizeof *a->kwn);
    a->kwv = rt_alloc(rt, (size_t)(nd->nkids2 + extra) * sizeof *a->kwv);
    for (int i = 0; i < nd->nkids2; i++) {
        a->kwn[i] = nd->names[i];
        a->kwv[i] = eval(rt, nd->kids2[i], s);
    }
}

struct tval *targ(struct targs *a, int pos, const char *name)
{
    if (pos >= 0 && pos < a->npos) return &a->pos[pos];
    for (int i = 0; i < a->nkw; i++)
        if (name && !strcmp(a->kwn[i], name)) return &a->kwv[i];
    return NULL;
}

static struct tval capture(struct rt *rt, struct tnode **kids, int n, struct tscope *s)
{
    struct tbuf b = {0}, *saved = rt->out;
    rt->out = &b;
    exec_body(rt, kids, n, s);
    rt->out = saved;
    return tv_sref(b.p ? b.p : "", b.n);
}

/* Macro and caller() bodies: bind parameters, run the body, return its output. */
static struct tval call_macro(struct rt *rt, struct tfunc *f, struct targs *a)
{
    const struct tnode *nd = f->node;
    struct tscope *s = scope_new(rt, f->scope);
    int np = nd->nnames;
    struct tval varargs = tv_list(rt, 0), kwargs = tv_dict(rt, 0);
    varargs.u.l->tuple = 1;
    for (int i = 0; i < np; i++) {
        struct tval v;
        struct tval *given = NULL;
        if (i < a->npos) given = &a->pos[i];
        for (int k = 0; !given && k < a->nkw; k++)
            if (!strcmp(a->kwn[k], nd->names[i])) given = &a->kwv[k];
        if (given)
            v = *given;
        else if (nd->kids2[i])
            v = eval(rt, nd->kids2[i], s);
        else
            v = undef_fmt(rt, "parameter '%s' was not provided", nd->names[i]);
        scope_set(rt, s, nd->names[i], strlen(nd->names[i]), v);
    }
    for (int i = np; i < a->npos; i++) tl_push(rt, varargs.u.l, a->pos[i]);
    for (int k = 0; k < a->nkw; k++) {
        int known = !strcmp(a->kwn[k], "caller");
        for (int i = 0; i < np && !known; i++) known = !strcmp(a->kwn[k], nd->names[i]);
        if (!known)
            td_set(rt, kwargs.u.d, tv_cstr(a->kwn[k]), a->kwv[k]);
        else if (!strcmp(a->kwn[k], "caller"))
            scope_set(rt, s, "caller", 6, a->kwv[k]);
    }
    scope_set(rt, s, "varargs", 7, varargs);
    scope_set(rt, s, "kwargs", 6, kwargs);
    int saved_ctl = rt->loopctl;
    struct tval out = capture(rt, nd->kids, nd->nkids, s);
    rt->loopctl = saved_ctl;
    return out;
}

struct tval rt_call(struct rt *rt, struct tval fn, struct targs *a)
{
    if (fn.t == TV_UNDEF) fail_undef(rt, fn);
    if (fn.t != TV_FUNC) rt_fail(rt, "TypeError: '%s' object is not callable", tv_typename(fn));
    struct tfunc *f = fn.u.fn;
    rt_step(rt);
    enter(rt);
    struct tval r;
    switch (f->kind) {
    case TFN_MACRO:
    case TFN_CALLER:
        r = call_macro(rt, f, a);
        break;
    case TFN_METHOD:
        r = tmpl_call_method(rt, f->self, f->name, a);
        break;
    case TFN_CYCLE: {
        if (!a->npos) rt_fail(rt, "TypeError: no items for cycling given");
        struct tloop *L = f->self.u.loop;
        r = a->pos[L->index0 % a->npos];
        break;
    }
    default:
        r = tmpl_call_global(rt, f->name, a);
        break;
    }
    rt->depth--;
    return r;
}

static struct tval eval_call(struct rt *rt, const struct tnode *nd, struct tscope *s,
                             struct tval *caller)
{
    struct targs a;
    struct tval fn;
    if (nd->a->kind == E_ATTR) {
        struct tval obj = eval(rt, nd->a->a, s);
        if (tmpl_has_method(obj, nd->a->str, nd->a->len)) {
            eval_args(rt, nd, s, &a, 0);
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)nd->a->len, nd->a->str);
            rt_step(rt);
            return tmpl_call_method(rt, obj, name, &a);
        }
        fn = rt_getattr(rt, obj, nd->a->str, nd->a->len);
    } else {
        fn = eval(rt, nd->a, s);
    }
    eval_args(rt, nd, s, &a, 1);
    if (caller) {
        a.kwn[a.nkw] = "caller";
        a.kwv[a.nkw++] = *caller;
    }
    return rt_call(rt, fn, &a);
}

static struct tval eval_filter(struct rt *rt, const struct tnode *nd, struct tscope *s,
                               struct tval *input)
{
    struct tval v;
    if (!nd->a) {
        if (!input) rt_fail(rt, "TemplateRuntimeError: filter without input");
        v = *input;
    } else if (input && nd->a->kind == E_FILTER) {
        v = eval_filter(rt, nd->a, s, input); /* {% filter a|b %}: the chain's inner end */
    } else {
        v = eval(rt, nd->a, s);
    }
    struct targs a;
    eval_args(rt, nd, s, &a, 0);
    return tmpl_filter(rt, nd->str, nd->len, v, &a);
}

static struct tval eval(struct rt *rt, const struct tnode *nd, struct tscope *s)
{
    struct tval v, w;
    enter(rt);
    switch (nd->kind) {
    case E_LIT:
        v = nd->lit;
        break;
    case E_NAME:
        v = lookup(rt, s, nd->str, nd->len);
        break;
    case E_ATTR:
        v = rt_getattr(rt, eval(rt, nd->a, s), nd->str, nd->len);
        break;
    case E_ITEM:
        v = eval(rt, nd->a, s);
        v = rt_getitem(rt, v, eval(rt, nd->b, s));
        break;
    case E_SLICE: {
        struct tval o = eval(rt, nd->a, s), p[3];
        const struct tnode *parts[3] = {nd->b, nd->c, nd->d};
        for (int k = 0; k < 3; k++)
            if (parts[k]) p[k] = eval(rt, parts[k], s);
        v = do_slice(rt, o, nd->b ? &p[0] : NULL, nd->c ? &p[1] : NULL, nd->d ? &p[2] : NULL);
        break;
    }
    case E_CALL:
        v = eval_call(rt, nd, s, NULL);
        break;
    case E_FILTER:
        v = eval_filter(rt, nd, s, NULL);
        break;
    case E_TEST: {
        struct targs a;
        w = eval(rt, nd->a, s);
        eval_args(rt, nd, s, &a, 0);
        int r = tmpl_test(rt, nd->str, nd->len, w, &a);
        v = tv_bool(nd->op ? !r : r);
        break;
    }
    case E_NEG:
    case E_POS:
        v = eval(rt, nd->a, s);
        if (v.t == TV_UNDEF) fail_undef(rt, v);
        if (v.t == TV_BOOL) v = tv_int(v.u.i);
        if (v.t != TV_INT && v.t != TV_FLOAT)
            rt_fail(rt, "TypeError: bad operand type for unary %s: '%s'",
                    nd->kind == E_NEG ? "-" : "+", tv_typename(v));
        if (nd->kind == E_NEG) {
            if (v.t == TV_INT && v.u.i == INT64_MIN) checked(rt, 1, 0);
            v = v.t == TV_INT ? tv_int(-v.u.i) : tv_float(-v.u.f);
        }
        break;
    case E_NOT:
        v = tv_bool(!tv_truthy(eval(rt, nd->a, s)));
        break;
    case E_AND:
        v = eval(rt, nd->a, s);
        if (tv_truthy(v)) v = eval(rt, nd->b, s);
        break;
    case E_OR:
        v = eval(rt, nd->a, s);
        if (!tv_truthy(v)) v = eval(rt, nd->b, s);
        break;
    case E_COND:
        if (tv_truthy(eval(rt, nd->a, s)))
            v = eval(rt, nd->b, s);
        else
            v = nd->c ? eval(rt, nd->c, s)
                      : undef_fmt(rt, "the inline if-expression evaluated to false and no else "
                                      "section was defined.");
        break;
    case E_BIN:
        v = eval(rt, nd->a, s);
        w = eval(rt, nd->b, s);
        v = binop(rt, nd->op, v, w);
        break;
    case E_LIST:
    case E_TUPLE:
        v = tv_list(rt, (uint32_t)nd->nkids);
        v.u.l->tuple = nd->kind == E_TUPLE;
        for (int i = 0; i < nd->nkids; i++) tl_push(rt, v.u.l, eval(rt, nd->kids[i], s));
        break;
    case E_DICT:
        v = tv_dict(rt, (uint32_t)nd->nkids);
        for (int i = 0; i < nd->nkids; i++) {
            struct tval k = eval(rt, nd->kids[i], s);
            if (k.t == TV_LIST && !k.u.l->tuple) rt_fail(rt, "TypeError: unhashable type: 'list'");
            if (k.t == TV_DICT) rt_fail(rt, "TypeError: unhashable type: 'dict'");
            td_set(rt, v.u.d, k, eval(rt, nd->kids2[i], s));
        }
        break;
    default:
        rt_fail(rt, "TemplateRuntimeError: not an expression");
    }
    rt->depth--;
    return v;
}

static void assign(struct rt *rt, const struct tnode *target, struct tval v, struct tscope *s)
{
    if (target->kind == E_NAME) {
        scope_set(rt, s, target->str, target->len, v);
    } else if (target->kind == E_ATTR) {
        struct tval obj = lookup(rt, s, target->a->str, target->a->len);
        if (obj.t != TV_NS)
            rt_fail(rt, "TemplateRuntimeError: cannot assign attribute on non-namespace object");
        td_set(rt, obj.u.d, tv_sref(target->str, target->len), v);
    } else {
        uint32_t n;
        if (v.t == TV_DICT || v.t == TV_UNDEF || v.t == TV_STR || v.t == TV_LIST) {
            const struct tval *it = tv_iter(rt, v, &n);
            if ((int)n != target->nkids)
                rt_fail(rt, "ValueError: %s values to unpack (expected %d, got %u)",
                        (int)n < target->nkids ? "not enough" : "too many", target->nkids, n);
            for (int i = 0; i < target->nkids; i++) assign(rt, target->kids[i], it[i], s);
        } else {
            rt_fail(rt, "TypeError: cannot unpack non-iterable %s object", tv_typename(v));
        }
    }
}

static void exec_for(struct rt *rt, const struct tnode *nd, struct tscope *s)
{
    struct tval seq = eval(rt, nd->b, s);
    uint32_t n;
    const struct tval *items = tv_iter(rt, seq, &n);
    if (nd->c) {
        /* `for x in xs if cond`: filter first so loop.length/last see the kept items */
        struct tval kept = tv_list(rt, n);
        for (uint32_t i = 0; i < n; i++) {
            rt_step(rt);
            struct tscope *fs = scope_new(rt, s);
            assign(rt, nd->a, items[i], fs);
            if (tv_truthy(eval(rt, nd->c, fs))) tl_push(rt, kept.u.l, items[i]);
        }
        items = kept.u.l->v;
        n = kept.u.l->n;
    }
    struct tloop *L = rt_alloc(rt, sizeof *L);
    L->length = n;
    L->items = items;
    struct tval lv = {.t = TV_LOOP, .u.loop = L};
    for (uint32_t i = 0; i < n; i++) {
        rt_step(rt);
        struct tscope *ls = scope_new(rt, s);
        L->index0 = i;
        scope_set(rt, ls, "loop", 4, lv);
        assign(rt, nd->a, items[i], ls);
        exec_body(rt, nd->kids, nd->nkids, ls);
        if (rt->loopctl == 1) {
            rt->loopctl = 0;
            break;
        }
        rt->loopctl = 0;
    }
    if (!n) exec_body(rt, nd->kids2, nd->nkids2, s);
}

static struct tval make_func(struct rt *rt, int kind, const struct tnode *nd, struct tscope *s)
{
    struct tfunc *f = rt_alloc(rt, sizeof *f);
    f->kind = (uint8_t)kind;
    f->node = nd;
    f->scope = s;
    if (nd->str) {
        char *nm = rt_alloc(rt, nd->len + 1);
        memcpy(nm, nd->str, nd->len);
        f->name = nm;
    } else {
        f->name = "caller";
    }
    struct tval v = {.t = TV_FUNC, .u.fn = f};
    return v;
}

static void exec_node(struct rt *rt, const struct tnode *nd, struct tscope *s)
{
    rt->line = nd->line;
    enter(rt);
    switch (nd->kind) {
    case N_DATA:
        tb_put(rt, rt->out, nd->str, nd->len);
        break;
    case N_OUTPUT:
        tb_str(rt, rt->out, eval(rt, nd->a, s));
        break;
    case N_IF:
        if (tv_truthy(eval(rt, nd->a, s)))
            exec_body(rt, nd->kids, nd->nkids, s);
        else
            exec_body(rt, nd->kids2, nd->nkids2, s);
        break;
    case N_FOR:
        exec_for(rt, nd, s);
        break;
    case N_SET:
        assign(rt, nd->a, eval(rt, nd->b, s), s);
        break;
    case N_SETBLOCK:
        assign(rt, nd->a, capture(rt, nd->kids, nd->nkids, s), s);
        break;
    case N_MACRO:
        scope_set(rt, s, nd->str, nd->len, make_func(rt, TFN_MACRO, nd, s));
        break;
    case N_CALLBLOCK: {
        struct tval caller = make_func(rt, TFN_CALLER, nd, s);
        tb_str(rt, rt->out, eval_call(rt, nd->a, s, &caller));
        break;
    }
    case N_FILTERBLOCK: {
        struct tval body = capture(rt, nd->kids, nd->nkids, s);
        tb_str(rt, rt->out, eval_filter(rt, nd->a, s, &body));
        break;
    }
    case N_BREAK:
        rt->loopctl = 1;
        break;
    case N_CONTINUE:
        rt->loopctl = 2;
        break;
    case N_BODY:
        exec_body(rt, nd->kids, nd->nkids, s);
        break;
    default:
        rt_fail(rt, "TemplateRuntimeError: not a statement");
    }
    rt->depth--;
}

static void exec_body(struct rt *rt, struct tnode **kids, int n, struct tscope *s)
{
    for (int i = 0; i < n && !rt->loopctl; i++) exec_node(rt, kids[i], s);
}

char *tmpl_render(const struct tmpl *t, const cJSON *context, size_t *out_len, struct err *e)
{
    if (!t) {
        err_set(e, "no template");
        return NULL;
    }
    if (context && !cJSON_IsObject(context)) {
        err_set(e, "template context must be a JSON object");
        return NULL;
    }
    struct rt *rt = calloc(1, sizeof *rt);
    if (!rt) {
        err_set(e, "out of memory");
        return NULL;
    }
    rt->e = e;
    rt->a.limit = TMPL_MAX_MEMORY;
    rt->line = 1;
    char *result = NULL;
    if (setjmp(rt->jb) == 0) {
        struct tbuf out = {0};
        rt->out = &out;
        struct tval ctx = tv_from_json(rt, context);
        if (ctx.t == TV_DICT) rt->ctx = ctx.u.d;
        rt->root = scope_new(rt, NULL);
        exec_body(rt, t->root->kids, t->root->nkids, rt->root);
        result = malloc(out.n + 1);
        if (!result) {
            err_set(e, "out of memory");
        } else {
            if (out.n) memcpy(result, out.p, out.n);
            result[out.n] = 0;
            if (out_len) *out_len = out.n;
        }
    }
    ta_free(&rt->a);
    free(rt);
    return result;
}
