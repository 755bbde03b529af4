/*
 * tmpl_parse: tokens -> syntax tree, a recursive-descent parser following jinja2's grammar
 * and operator precedence (or < and < not < comparisons < + - < ~ < * / // % < ** < unary,
 * with filters and `is` tests binding tighter than any binary operator).
 *
 * Nesting depth is capped so a template of ten thousand '(' fails cleanly instead of
 * overflowing the C stack.
 */
#include "text/tmpl.h"
#include "text/tmpl_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_PARSE_DEPTH 200

struct parser {
    struct tarena *a;
    struct tok *t;
    size_t n, i;
    int depth, loops;
    jmp_buf jb;
    struct err *e;
};

struct nvec {
    struct tnode **v;
    int n, cap;
};

_Noreturn static void pfail(struct parser *P, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void pfail(struct parser *P, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set(P->e, "TemplateSyntaxError: %s (line %d)", msg, P->t[P->i].line);
    longjmp(P->jb, 1);
}

static void *palloc(struct parser *P, size_t n)
{
    void *p = ta_alloc(P->a, n);
    if (!p) pfail(P, "template too large");
    return p;
}

static struct tnode *mk(struct parser *P, int kind)
{
    struct tnode *nd = palloc(P, sizeof *nd);
    nd->kind = (uint8_t)kind;
    nd->line = P->t[P->i].line;
    return nd;
}

static void nv_push(struct parser *P, struct nvec *v, struct tnode *nd)
{
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        struct tnode **nv = palloc(P, (size_t)nc * sizeof *nv);
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = nd;
}

static const char **names_push(struct parser *P, const char **names, int n, const char *s,
                               size_t len)
{
    const char **nn = palloc(P, (size_t)(n + 1) * sizeof *nn);
    if (n) memcpy(nn, names, (size_t)n * sizeof *nn);
    char *c = palloc(P, len + 1);
    memcpy(c, s, len);
    nn[n] = c;
    return nn;
}

static struct tok *cur(struct parser *P)
{
    return &P->t[P->i];
}

static struct tok *peek(struct parser *P, size_t k)
{
    return P->i + k < P->n ? &P->t[P->i + k] : &P->t[P->n - 1];
}

static int is_op(struct tok *t, const char *op)
{
    return t->type == TK_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}

static int is_name(struct tok *t, const char *w)
{
    return t->type == TK_NAME && t->n == strlen(w) && !memcmp(t->s, w, t->n);
}

static const char *describe(struct tok *t, char *buf, size_t cap)
{
    switch (t->type) {
    case TK_EOF:
        return "end of template";
    case TK_BLOCK_END:
        return "end of statement block";
    case TK_VAR_END:
        return "end of print statement";
    case TK_STRING:
        return "string";
    case TK_INT:
    case TK_FLOAT:
        return "number";
    case TK_DATA:
        return "template data";
    default:
        snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s);
        return buf;
    }
}

static void expect_op(struct parser *P, const char *op)
{
    if (!is_op(cur(P), op)) {
        char b[64];
        pfail(P, "expected '%s', got %s", op, describe(cur(P), b, sizeof b));
    }
    P->i++;
}

static struct tok *expect_name(struct parser *P)
{
    if (cur(P)->type != TK_NAME) {
        char b[64];
        pfail(P, "expected a name, got %s", describe(cur(P), b, sizeof b));
    }
    return &P->t[P->i++];
}

static void expect_block_end(struct parser *P)
{
    if (cur(P)->type != TK_BLOCK_END) {
        char b[64];
        pfail(P, "expected end of statement block, got %s", describe(cur(P), b, sizeof b));
    }
    P->i++;
}

static void enter(struct parser *P)
{
    if (++P->depth > MAX_PARSE_DEPTH) pfail(P, "template nested too deeply");
}

static struct tnode *parse_expr(struct parser *P, int allow_cond);
static struct tnode *parse_unary(struct parser *P, int with_filter);
static struct tnode *parse_primary(struct parser *P);
static struct tnode *parse_postfix(struct parser *P, struct tnode *nd);

/* Comma-separated expressions; a bare `a, b` is a tuple. */
static struct tnode *parse_tuple(struct parser *P, int allow_cond)
{
    struct tnode *first = parse_expr(P, allow_cond);
    if (!is_op(cur(P), ",")) return first;
    struct tnode *tu = mk(P, E_TUPLE);
    struct nvec v = {0};
    nv_push(P, &v, first);
    while (is_op(cur(P), ",")) {
        P->i++;
        struct tok *t = cur(P);
        if (t->type == TK_BLOCK_END || t->type == TK_VAR_END || is_op(t, ")") || is_name(t, "in"))
            break;
        nv_push(P, &v, parse_expr(P, allow_cond));
    }
    tu->kids = v.v;
    tu->nkids = v.n;
    return tu;
}

/* (args, name=value) after the '(' was seen. */
static void parse_args(struct parser *P, struct tnode *call)
{
    struct nvec pos = {0}, kw = {0};
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (pos.n + kw.n > 0) expect_op(P, ",");
        if (is_op(cur(P), ")")) break;
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            pfail(P, "*args and **kwargs in calls are not supported");
        if (cur(P)->type == TK_NAME && is_op(peek(P, 1), "=")) {
            struct tok *nm = &P->t[P->i];
            P->i += 2;
            call->names = names_push(P, call->names, call->nnames++, nm->s, nm->n);
            nv_push(P, &kw, parse_expr(P, 1));
        } else {
            if (kw.n) pfail(P, "positional argument after keyword argument");
            nv_push(P, &pos, parse_expr(P, 1));
        }
    }
    P->i++;
    call->kids = pos.v;
    call->nkids = pos.n;
    call->kids2 = kw.v;
    call->nkids2 = kw.n;
}

static struct tnode *parse_filter(struct parser *P, struct tnode *operand)
{
    struct tnode *f = mk(P, E_FILTER);
    struct tok *nm = expect_name(P);
    f->a = operand;
    f->str = nm->s;
    f->len = nm->n;
    if (!tmpl_filter_known(nm->s, nm->n)) {
        P->i--;
        pfail(P, "No filter named '%.*s'.", (int)(nm->n > 40 ? 40 : nm->n), nm->s);
    }
    /* dotted filter names do not exist in chat templates; keep the grammar simple */
    if (is_op(cur(P), "(")) parse_args(P, f);
    return f;
}

static struct tnode *parse_test(struct parser *P, struct tnode *operand)
{
    struct tnode *te = mk(P, E_TEST);
    te->a = operand;
    if (is_name(cur(P), "not")) {
        te->op = 1;
        P->i++;
    }
    struct tok *nm = expect_name(P);
    te->str = nm->s;
    te->len = nm->n;
    if (!tmpl_test_known(nm->s, nm->n)) {
        P->i--;
        pfail(P, "No test named '%.*s'.", (int)(nm->n > 40 ? 40 : nm->n), nm->s);
    }
    struct tok *t = cur(P);
    if (is_op(t, "(")) {
        parse_args(P, te);
    } else if ((t->type == TK_NAME && !is_name(t, "else") && !is_name(t, "or") &&
                !is_name(t, "and") && !is_name(t, "if") && !is_name(t, "in") && !is_name(t, "is") &&
                !is_name(t, "not")) ||
               t->type == TK_STRING || t->type == TK_INT || t->type == TK_FLOAT || is_op(t, "[") ||
               is_op(t, "{")) {
        /* `is divisibleby 3`, `is sameas false`: one argument without parentheses */
        struct tnode *arg = parse_postfix(P, parse_primary(P));
        te->kids = palloc(P, sizeof *te->kids);
        te->kids[0] = arg;
        te->nkids = 1;
    }
    return te;
}

static struct tnode *parse_filter_expr(struct parser *P, struct tnode *nd)
{
    for (;;) {
        if (is_op(cur(P), "|")) {
            P->i++;
            nd = parse_filter(P, nd);
        } else if (is_name(cur(P), "is")) {
            P->i++;
            nd = parse_test(P, nd);
        } else if (is_op(cur(P), "(")) {
            struct tnode *c = mk(P, E_CALL);
            c->a = nd;
            parse_args(P, c);
            nd = c;
        } else {
            return nd;
        }
    }
}

static struct tnode *parse_subscript(struct parser *P, struct tnode *obj)
{
    struct tnode *parts[3] = {0};
    int k = 0, colons = 0;
    while (!is_op(cur(P), "]")) {
        if (is_op(cur(P), ":")) {
            if (++colons > 2) pfail(P, "too many ':' in subscript");
            k++;
            P->i++;
            continue;
        }
        if (parts[k]) pfail(P, "expected ']' in subscript");
        parts[k] = parse_expr(P, 1);
        if (!colons && is_op(cur(P), ",")) pfail(P, "tuple subscripts are not supported");
    }
    P->i++;
    struct tnode *nd;
    if (!colons) {
        if (!parts[0]) pfail(P, "empty subscript");
        nd = mk(P, E_ITEM);
        nd->b = parts[0];
    } else {
        nd = mk(P, E_SLICE);
        nd->b = parts[0];
        nd->c = parts[1];
        nd->d = parts[2];
    }
    nd->a = obj;
    return nd;
}

static struct tnode *parse_postfix(struct parser *P, struct tnode *nd)
{
    for (;;) {
        struct tok *t = cur(P);
        if (is_op(t, ".")) {
            P->i++;
            struct tok *a = cur(P);
            if (a->type == TK_NAME) {
                struct tnode *g = mk(P, E_ATTR);
                g->a = nd;
                g->str = a->s;
                g->len = a->n;
                P->i++;
                nd = g;
            } else if (a->type == TK_INT) {
                struct tnode *g = mk(P, E_ITEM);
                g->a = nd;
                g->b = mk(P, E_LIT);
                g->b->lit = tv_int(a->i);
                P->i++;
                nd = g;
            } else {
                pfail(P, "expected an attribute name after '.'");
            }
        } else if (is_op(t, "[")) {
            P->i++;
            enter(P);
            nd = parse_subscript(P, nd);
            P->depth--;
        } else if (is_op(t, "(")) {
            struct tnode *c = mk(P, E_CALL);
            c->a = nd;
            enter(P);
            parse_args(P, c);
            P->depth--;
            nd = c;
        } else {
            return nd;
        }
    }
}

static struct tnode *parse_primary(struct parser *P)
{
    struct tok *t = cur(P);
    struct tnode *nd;
    char b[64];
    enter(P);
    switch (t->type) {
    case TK_NAME:
        nd = mk(P, E_LIT);
        if (is_name(t, "true") || is_name(t, "True")) {
            nd->lit = tv_bool(1);
        } else if (is_name(t, "false") || is_name(t, "False")) {
            nd->lit = tv_bool(0);
        } else if (is_name(t, "none") || is_name(t, "None")) {
            nd->lit = tv_none();
        } else {
            nd->kind = E_NAME;
            nd->str = t->s;
            nd->len = t->n;
        }
        P->i++;
        break;
    case TK_STRING: {
        /* adjacent literals concatenate: 'a' 'b' == 'ab' */
        size_t total = 0, k = P->i;
        while (P->t[k].type == TK_STRING) total += P->t[k++].n;
        char *s = palloc(P, total + 1);
        size_t o = 0;
        while (cur(P)->type == TK_STRING) {
            memcpy(s + o, cur(P)->s, cur(P)->n);
            o += cur(P)->n;
            P->i++;
        }
        nd = mk(P, E_LIT);
        nd->lit = tv_sref(s, o);
        break;
    }
    case TK_INT:
        nd = mk(P, E_LIT);
        nd->lit = tv_int(t->i);
        P->i++;
        break;
    case TK_FLOAT:
        nd = mk(P, E_LIT);
        nd->lit = tv_float(t->f);
        P->i++;
        break;
    case TK_OP:
        if (is_op(t, "(")) {
            P->i++;
            if (is_op(cur(P), ")")) {
                P->i++;
                nd = mk(P, E_TUPLE);
                break;
            }
            nd = parse_expr(P, 1);
            if (is_op(cur(P), ",")) {
                struct tnode *tu = mk(P, E_TUPLE);
                struct nvec v = {0};
                nv_push(P, &v, nd);
                while (is_op(cur(P), ",")) {
                    P->i++;
                    if (is_op(cur(P), ")")) break;
                    nv_push(P, &v, parse_expr(P, 1));
                }
                tu->kids = v.v;
                tu->nkids = v.n;
                nd = tu;
            }
            expect_op(P, ")");
            break;
        }
        if (is_op(t, "[")) {
            P->i++;
            nd = mk(P, E_LIST);
            struct nvec v = {0};
            while (!is_op(cur(P), "]")) {
                if (v.n) expect_op(P, ",");
                if (is_op(cur(P), "]")) break;
                nv_push(P, &v, parse_expr(P, 1));
            }
            P->i++;
            nd->kids = v.v;
            nd->nkids = v.n;
            break;
        }
        if (is_op(t, "{")) {
            P->i++;
            nd = mk(P, E_DICT);
            struct nvec k = {0}, v = {0};
            while (!is_op(cur(P), "}")) {
                if (k.n) expect_op(P, ",");
                if (is_op(cur(P), "}")) break;
                nv_push(P, &k, parse_expr(P, 1));
                expect_op(P, ":");
                nv_push(P, &v, parse_expr(P, 1));
            }
            P->i++;
            nd->kids = k.v;
            nd->nkids = k.n;
            nd->kids2 = v.v;
            nd->nkids2 = v.n;
            break;
        }
        /* fallthrough */
    default:
        pfail(P, "unexpected %s", describe(t, b, sizeof b));
    }
    P->depth--;
    return nd;
}

static struct tnode *parse_unary(struct parser *P, int with_filter)
{
    struct tnode *nd;
    enter(P);
    if (is_op(cur(P), "-") || is_op(cur(P), "+")) {
        int neg = is_op(cur(P), "-");
        P->i++;
        struct tnode *inner = parse_unary(P, 0);
        if (neg && inner->kind == E_LIT && inner->lit.t == TV_INT && inner->lit.u.i != INT64_MIN) {
            inner->lit.u.i = -inner->lit.u.i;
            nd = inner;
        } else if (neg && inner->kind == E_LIT && inner->lit.t == TV_FLOAT) {
            inner->lit.u.f = -inner->lit.u.f;
            nd = inner;
        } else {
            nd = mk(P, neg ? E_NEG : E_POS);
            nd->a = inner;
        }
    } else {
        nd = parse_postfix(P, parse_primary(P));
    }
    if (with_filter) nd = parse_filter_expr(P, nd);
    P->depth--;
    return nd;
}

static struct tnode *bin(struct parser *P, int kind, int op, struct tnode *a, struct tnode *b)
{
    struct tnode *nd = mk(P, kind);
    nd->op = (uint8_t)op;
    nd->a = a;
    nd->b = b;
    return nd;
}

static struct tnode *parse_pow(struct parser *P)
{
    struct tnode *l = parse_unary(P, 1);
    while (is_op(cur(P), "**")) {
        P->i++;
        l = bin(P, E_BIN, OP_POW, l, parse_unary(P, 1));
    }
    return l;
}

static struct tnode *parse_math2(struct parser *P)
{
    struct tnode *l = parse_pow(P);
    for (;;) {
        int op = is_op(cur(P), "*")    ? OP_MUL
                 : is_op(cur(P), "/")  ? OP_DIV
                 : is_op(cur(P), "//") ? OP_FLOORDIV
                 : is_op(cur(P), "%")  ? OP_MOD
                                       : 0;
        if (!op) return l;
        P->i++;
        l = bin(P, E_BIN, op, l, parse_pow(P));
    }
}

static struct tnode *parse_concat(struct parser *P)
{
    struct tnode *l = parse_math2(P);
    while (is_op(cur(P), "~")) {
        P->i++;
        l = bin(P, E_BIN, OP_CONCAT, l, parse_math2(P));
    }
    return l;
}

static struct tnode *parse_math1(struct parser *P)
{
    struct tnode *l = parse_concat(P);
    for (;;) {
        int op = is_op(cur(P), "+") ? OP_ADD : is_op(cur(P), "-") ? OP_SUB : 0;
        if (!op) return l;
        P->i++;
        l = bin(P, E_BIN, op, l, parse_concat(P));
    }
}

static struct tnode *parse_compare(struct parser *P)
{
    struct tnode *l = parse_math1(P), *result = NULL;
    for (;;) {
        struct tok *t = cur(P);
        int op = is_op(t, "==")                                     ? OP_EQ
                 : is_op(t, "!=")                                   ? OP_NE
                 : is_op(t, "<")                                    ? OP_LT
                 : is_op(t, "<=")                                   ? OP_LE
                 : is_op(t, ">")                                    ? OP_GT
                 : is_op(t, ">=")                                   ? OP_GE
                 : is_name(t, "in")                                 ? OP_IN
                 : (is_name(t, "not") && is_name(peek(P, 1), "in")) ? OP_NOTIN
                                                                    : 0;
        if (!op) break;
        P->i += op == OP_NOTIN ? 2 : 1;
        struct tnode *r = parse_math1(P);
        struct tnode *c = bin(P, E_BIN, op, l, r);
        /* a < b < c  ==  a < b and b < c */
        result = result ? bin(P, E_AND, 0, result, c) : c;
        l = r;
    }
    return result ? result : l;
}

static struct tnode *parse_not(struct parser *P)
{
    if (is_name(cur(P), "not")) {
        P->i++;
        enter(P);
        struct tnode *nd = mk(P, E_NOT);
        nd->a = parse_not(P);
        P->depth--;
        return nd;
    }
    return parse_compare(P);
}

static struct tnode *parse_and(struct parser *P)
{
    struct tnode *l = parse_not(P);
    while (is_name(cur(P), "and")) {
        P->i++;
        l = bin(P, E_AND, 0, l, parse_not(P));
    }
    return l;
}

static struct tnode *parse_or(struct parser *P)
{
    struct tnode *l = parse_and(P);
    while (is_name(cur(P), "or")) {
        P->i++;
        l = bin(P, E_OR, 0, l, parse_and(P));
    }
    return l;
}

static struct tnode *parse_expr(struct parser *P, int allow_cond)
{
    enter(P);
    struct tnode *nd = parse_or(P);
    while (allow_cond && is_name(cur(P), "if")) {
        P->i++;
        struct tnode *c = mk(P, E_COND);
        c->b = nd;
        c->a = parse_or(P);
        if (is_name(cur(P), "else")) {
            P->i++;
            c->c = parse_expr(P, 1);
        }
        nd = c;
    }
    P->depth--;
    return nd;
}

/* Targets of for and set: name, name.attr (set only), or a, b / (a, b). */
static struct tnode *parse_target(struct parser *P, int allow_attr)
{
    int paren = is_op(cur(P), "(");
    if (paren) P->i++;
    struct nvec v = {0};
    for (;;) {
        struct tok *nm = expect_name(P);
        struct tnode *nd = mk(P, E_NAME);
        nd->str = nm->s;
        nd->len = nm->n;
        if (allow_attr && is_op(cur(P), ".")) {
            P->i++;
            struct tok *at = expect_name(P);
            struct tnode *g = mk(P, E_ATTR);
            g->a = nd;
            g->str = at->s;
            g->len = at->n;
            nd = g;
        }
        nv_push(P, &v, nd);
        if (!is_op(cur(P), ",")) break;
        P->i++;
    }
    if (paren) expect_op(P, ")");
    if (v.n == 1) return v.v[0];
    struct tnode *tu = mk(P, E_TUPLE);
    tu->kids = v.v;
    tu->nkids = v.n;
    return tu;
}

static struct tnode *parse_body(struct parser *P, const char *const *ends, struct nvec *out);

/* Body up to one of `ends` ("endif", ...); returns the keyword token that ended it. */
static struct tok *body_until(struct parser *P, const char *const *ends, struct tnode *nd,
                              int second)
{
    struct nvec v = {0};
    parse_body(P, ends, &v);
    if (second) {
        nd->kids2 = v.v;
        nd->nkids2 = v.n;
    } else {
        nd->kids = v.v;
        nd->nkids = v.n;
    }
    struct tok *kw = cur(P);
    P->i++;
    return kw;
}

static void parse_params(struct parser *P, struct tnode *nd)
{
    struct nvec defs = {0};
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (nd->nnames) expect_op(P, ",");
        if (is_op(cur(P), ")")) break;
        struct tok *nm = expect_name(P);
        nd->names = names_push(P, nd->names, nd->nnames++, nm->s, nm->n);
        struct tnode *def = NULL;
        if (is_op(cur(P), "=")) {
            P->i++;
            def = parse_expr(P, 1);
        }
        nv_push(P, &defs, def);
    }
    P->i++;
    nd->kids2 = defs.v;
    nd->nkids2 = defs.n;
}

static struct tnode *parse_stmt(struct parser *P)
{
    struct tok *kw = expect_name(P);
    struct tnode *nd;
    static const char *const if_ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    static const char *const for_ends[] = {"else", "endfor", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    enter(P);
    if (is_name(kw, "if")) {
        nd = mk(P, N_IF);
        nd->a = parse_expr(P, 0);
        expect_block_end(P);
        struct tnode *at = nd;
        for (;;) {
            struct tok *end = body_until(P, if_ends, at, 0);
            if (is_name(end, "elif")) {
                struct tnode *el = mk(P, N_IF);
                el->a = parse_expr(P, 0);
                expect_block_end(P);
                at->kids2 = palloc(P, sizeof *at->kids2);
                at->kids2[0] = el;
                at->nkids2 = 1;
                at = el;
                continue;
            }
            if (is_name(end, "else")) {
                expect_block_end(P);
                body_until(P, endif, at, 1);
            }
            break;
        }
    } else if (is_name(kw, "for")) {
        nd = mk(P, N_FOR);
        nd->a = parse_target(P, 0);
        if (!is_name(cur(P), "in")) pfail(P, "expected 'in' in for loop");
        P->i++;
        nd->b = parse_tuple(P, 0);
        if (is_name(cur(P), "if")) {
            P->i++;
            nd->c = parse_expr(P, 1);
        }
        if (is_name(cur(P), "recursive")) pfail(P, "recursive loops are not supported");
        expect_block_end(P);
        P->loops++;
        struct tok *end = body_until(P, for_ends, nd, 0);
        P->loops--;
        if (is_name(end, "else")) {
            expect_block_end(P);
            body_until(P, endfor, nd, 1);
        }
    } else if (is_name(kw, "set")) {
        struct tnode *target = parse_target(P, 1);
        if (is_op(cur(P), "=")) {
            P->i++;
            nd = mk(P, N_SET);
            nd->a = target;
            nd->b = parse_tuple(P, 1);
        } else {
            static const char *const ends[] = {"endset", NULL};
            if (target->kind != E_NAME) pfail(P, "a block set assigns one name");
            nd = mk(P, N_SETBLOCK);
            nd->a = target;
            expect_block_end(P);
            body_until(P, ends, nd, 0);
        }
    } else if (is_name(kw, "macro")) {
        static const char *const ends[] = {"endmacro", NULL};
        nd = mk(P, N_MACRO);
        struct tok *nm = expect_name(P);
        nd->str = nm->s;
        nd->len = nm->n;
        parse_params(P, nd);
        expect_block_end(P);
        int loops = P->loops;
        P->loops = 0;
        body_until(P, ends, nd, 0);
        P->loops = loops;
        if (cur(P)->type == TK_NAME) P->i++; /* {% endmacro name %} */
    } else if (is_name(kw, "call")) {
        static const char *const ends[] = {"endcall", NULL};
        nd = mk(P, N_CALLBLOCK);
        if (is_op(cur(P), "(")) parse_params(P, nd);
        nd->a = parse_expr(P, 1);
        if (nd->a->kind != E_CALL) pfail(P, "expected a call after {%% call %%}");
        expect_block_end(P);
        int loops = P->loops;
        P->loops = 0;
        body_until(P, ends, nd, 0);
        P->loops = loops;
    } else if (is_name(kw, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        nd = mk(P, N_FILTERBLOCK);
        struct tnode *f = parse_filter(P, NULL);
        while (is_op(cur(P), "|")) {
            P->i++;
            f = parse_filter(P, f);
        }
        nd->a = f;
        expect_block_end(P);
        body_until(P, ends, nd, 0);
    } else if (is_name(kw, "generation")) {
        /* transformers' assistant-mask marker: renders its body unchanged */
        static const char *const ends[] = {"endgeneration", NULL};
        nd = mk(P, N_BODY);
        expect_block_end(P);
        body_until(P, ends, nd, 0);
    } else if (is_name(kw, "break") || is_name(kw, "continue")) {
        if (!P->loops) pfail(P, "'%.*s' outside of a loop", (int)kw->n, kw->s);
        nd = mk(P, is_name(kw, "break") ? N_BREAK : N_CONTINUE);
    } else {
        pfail(P, "unknown tag '%.*s'", (int)(kw->n > 40 ? 40 : kw->n), kw->s);
    }
    P->depth--;
    expect_block_end(P);
    return nd;
}

static struct tnode *parse_body(struct parser *P, const char *const *ends, struct nvec *out)
{
    for (;;) {
        struct tok *t = cur(P);
        if (t->type == TK_EOF) {
            if (ends) pfail(P, "unexpected end of template, expected '%s'", ends[0]);
            return NULL;
        }
        if (t->type == TK_DATA) {
            struct tnode *nd = mk(P, N_DATA);
            nd->str = t->s;
            nd->len = t->n;
            nv_push(P, out, nd);
            P->i++;
        } else if (t->type == TK_VAR_BEGIN) {
            P->i++;
            struct tnode *nd = mk(P, N_OUTPUT);
            nd->a = parse_tuple(P, 1);
            if (cur(P)->type != TK_VAR_END) {
                char b[64];
                pfail(P, "expected end of print statement, got %s", describe(cur(P), b, sizeof b));
            }
            P->i++;
            nv_push(P, out, nd);
        } else if (t->type == TK_BLOCK_BEGIN) {
            struct tok *kw = peek(P, 1);
            if (kw->type == TK_NAME && ends) {
                for (int k = 0; ends[k]; k++)
                    if (is_name(kw, ends[k])) {
                        P->i++;
                        return NULL;
                    }
            }
            if (kw->type == TK_NAME && ((kw->n > 3 && !memcmp(kw->s, "end", 3)) ||
                                        is_name(kw, "elif") || is_name(kw, "else"))) {
                P->i++;
                pfail(P, "unexpected '%.*s'", (int)(kw->n > 40 ? 40 : kw->n), kw->s);
            }
            P->i++;
            nv_push(P, out, parse_stmt(P));
        } else {
            char b[64];
            pfail(P, "unexpected %s", describe(t, b, sizeof b));
        }
    }
}

struct tmpl *tmpl_parse(const char *src, size_t len, struct err *e)
{
    struct tmpl *volatile t = calloc(1, sizeof *t);
    if (!t) {
        err_set(e, "out of memory");
        return NULL;
    }
    t->arena.limit = TMPL_MAX_MEMORY;
    struct parser P = {.a = &t->arena, .e = e};
    if (tmpl_lex(&t->arena, src ? src : "", src ? len : 0, &P.t, &P.n, e)) {
        tmpl_destroy(t);
        return NULL;
    }
    if (setjmp(P.jb)) {
        tmpl_destroy(t);
        return NULL;
    }
    struct nvec v = {0};
    t->root = mk(&P, N_BODY);
    parse_body(&P, NULL, &v);
    t->root->kids = v.v;
    t->root->nkids = v.n;
    return t;
}

void tmpl_destroy(struct tmpl *t)
{
    if (!t) return;
    ta_free(&t->arena);
    free(t);
}
