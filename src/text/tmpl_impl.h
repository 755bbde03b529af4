/*
 * tmpl_impl: what the chat-template modules share and nobody else sees: the arena every
 * value and syntax node lives in, the value model (Python's types as Jinja sees them), the
 * syntax tree, and the render state. tmpl_lex/tmpl_parse build the tree, tmpl_value holds
 * the value helpers (str(), repr(), ==, tojson), tmpl_filter the filters and tests,
 * tmpl_method the str/dict/list methods and globals, tmpl_render walks the tree.
 *
 * Errors inside parse and render longjmp back to the entry point (tmpl_parse,
 * tmpl_render): every allocation is in an arena that the entry point frees, so unwinding
 * leaks nothing, and no helper has to thread error codes through a dozen levels.
 */
#ifndef PAGODA_MODEL_TMPL_IMPL_H
#define PAGODA_MODEL_TMPL_IMPL_H

#include <setjmp.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "common/err.h"

/* Bounds that keep a hostile template from exhausting the process. */
#define TMPL_MAX_MEMORY (256u << 20) /* arena bytes per render */
#define TMPL_MAX_OUTPUT (64u << 20)  /* bytes of rendered text */
#define TMPL_MAX_DEPTH  400          /* nested evaluation (C stack frames / 2) */
#define TMPL_MAX_STEPS  10000000ull  /* loop iterations + calls per render */

/* ---- arena ---- */

struct tchunk;
struct tarena {
    struct tchunk *cur;
    size_t total, limit;
};
/** Zeroed, max-aligned memory; NULL once `limit` bytes are used. */
void *ta_alloc(struct tarena *a, size_t n);
/** Grows the most recent allocation `p` (old size `oldn`) in place when room allows. */
int ta_grow_last(struct tarena *a, const void *p, size_t oldn, size_t newn);
void ta_free(struct tarena *a);

/* ---- values ---- */

enum tv_type {
    TV_UNDEF, /* u.s/n: the missing name, for the error message */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR, /* u.s/n: UTF-8 bytes, immutable, not NUL-terminated */
    TV_LIST,
    TV_DICT,
    TV_NS, /* namespace(): a dict whose attributes templates may assign */
    TV_FUNC,
    TV_LOOP,
};

struct tlist;
struct tdict;
struct tfunc;
struct tloop;

struct tval {
    uint8_t t;
    uint8_t markup; /* TV_STR from |safe or |escape: `+` escapes the other operand */
    uint32_t n;
    union {
        int64_t i;
        double f;
        const char *s;
        struct tlist *l;
        struct tdict *d;
        struct tfunc *fn;
        struct tloop *loop;
    } u;
};

struct tlist {
    struct tval *v;
    uint32_t n, cap;
    uint8_t tuple; /* prints as (a, b) */
    uint8_t gen;   /* a generator (map/select results): one pass, no len(), not JSON */
    uint8_t used;  /* generator already consumed */
};

/* Insertion-ordered; linear lookup (chat dicts hold a handful of keys). */
struct tdict {
    struct tval *k, *v;
    uint32_t n, cap;
};

enum tfn_kind { TFN_BUILTIN, TFN_METHOD, TFN_MACRO, TFN_CALLER, TFN_CYCLE };

struct tscope;
struct tnode;
struct tfunc {
    uint8_t kind;
    const char *name;
    struct tval self;         /* TFN_METHOD: the receiver; TFN_CYCLE: the loop */
    const struct tnode *node; /* TFN_MACRO / TFN_CALLER: definition */
    struct tscope *scope;     /* where it was defined */
    struct tval caller;       /* TFN_MACRO called from {% call %} */
};

struct tloop {
    int64_t index0, length;
    const struct tval *items;
};

/* ---- syntax tree ---- */

enum tn_kind {
    /* statements */
    N_DATA,        /* str/len: literal text */
    N_OUTPUT,      /* a */
    N_IF,          /* a: cond, kids: then, kids2: else */
    N_FOR,         /* a: target, b: iterable, c: filter, kids: body, kids2: else */
    N_SET,         /* a: target, b: value */
    N_SETBLOCK,    /* a: target, kids: body */
    N_MACRO,       /* str: name, names/kids2: params/defaults, kids: body */
    N_CALLBLOCK,   /* a: call expr, names/kids2: caller params, kids: body */
    N_FILTERBLOCK, /* a: filter chain with a NULL innermost operand, kids: body */
    N_BREAK,
    N_CONTINUE,
    N_BODY, /* kids: a plain sequence ({% generation %}, {% with %}) */
    /* expressions */
    E_LIT,    /* lit */
    E_NAME,   /* str */
    E_ATTR,   /* a.str */
    E_ITEM,   /* a[b] */
    E_SLICE,  /* a[b:c:d], NULL parts omitted */
    E_CALL,   /* a(kids, names=kids2) */
    E_FILTER, /* a|str(kids, names=kids2) */
    E_TEST,   /* a is [not] str(kids); op: negated */
    E_NEG,
    E_POS,
    E_NOT,
    E_BIN, /* a op b */
    E_AND,
    E_OR,
    E_COND, /* b if a else c */
    E_LIST,
    E_TUPLE,
    E_DICT, /* kids: keys, kids2: values */
};

enum tn_op {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
};

struct tnode {
    uint8_t kind, op;
    int line;
    const char *str;
    size_t len;
    struct tval lit;
    struct tnode *a, *b, *c, *d;
    struct tnode **kids, **kids2;
    int nkids, nkids2;
    const char **names; /* NUL-terminated; for keyword args, loop targets, params */
    int nnames;
};

struct tmpl {
    struct tarena arena;
    struct tnode *root; /* N_BODY */
};

/* ---- lexer ---- */

enum tk_type {
    TK_DATA,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP,
    TK_EOF
};

struct tok {
    uint8_t type;
    int line;
    const char *s; /* TK_DATA/TK_NAME/TK_OP: into the source; TK_STRING: decoded copy */
    size_t n;
    int64_t i;
    double f;
};

/** Tokenizes normalized source (whitespace control applied); -1 + err on bad syntax. */
int tmpl_lex(struct tarena *a, const char *src, size_t len, struct tok **out, size_t *ntok,
             struct err *e);

/* ---- render state ---- */

struct tbuf {
    char *p;
    size_t n, cap;
};

struct rt {
    jmp_buf jb;
    struct err *e;
    struct tarena a;
    struct tbuf *out; /* where output goes now (swapped for captures) */
    struct tscope *root;
    const struct tdict *ctx; /* the caller's variables */
    int depth, line;
    uint64_t steps;
    int loopctl;               /* 1 break, 2 continue, pending */
    int json_ascii, json_sort; /* tojson's ensure_ascii and sort_keys */
};

struct targs {
    struct tval *pos;
    int npos;
    const char **kwn;
    struct tval *kwv;
    int nkw;
};

_Noreturn void rt_fail(struct rt *rt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *rt_alloc(struct rt *rt, size_t n);
void rt_step(struct rt *rt);

/* constructors */
static inline struct tval tv_none(void)
{
    struct tval v = {.t = TV_NONE};
    return v;
}
static inline struct tval tv_bool(int b)
{
    struct tval v = {.t = TV_BOOL, .u.i = b != 0};
    return v;
}
static inline struct tval tv_int(int64_t i)
{
    struct tval v = {.t = TV_INT, .u.i = i};
    return v;
}
static inline struct tval tv_float(double f)
{
    struct tval v = {.t = TV_FLOAT, .u.f = f};
    return v;
}
static inline struct tval tv_undef(const char *name, size_t n)
{
    struct tval v = {.t = TV_UNDEF, .n = (uint32_t)n, .u.s = name};
    return v;
}
/** A string value that points at `s` (which must outlive the render). */
static inline struct tval tv_sref(const char *s, size_t n)
{
    struct tval v = {.t = TV_STR, .n = (uint32_t)n, .u.s = s};
    return v;
}
struct tval tv_str(struct rt *rt, const char *s, size_t n); /* copies */
struct tval tv_cstr(const char *s);                         /* static text */
struct tval tv_list(struct rt *rt, uint32_t cap);
void tl_push(struct rt *rt, struct tlist *l, struct tval v);
struct tval tv_dict(struct rt *rt, uint32_t cap);
void td_set(struct rt *rt, struct tdict *d, struct tval k, struct tval v);
/** Pointer to the value under key, NULL when absent. */
struct tval *td_get(const struct tdict *d, struct tval k);
struct tval *td_gets(const struct tdict *d, const char *k, size_t n);

/* Python semantics */
int tv_truthy(struct tval v);
int tv_eq(struct tval a, struct tval b);
/** <0, 0, >0; fails with TypeError when Python would ('<' between str and int). */
int tv_cmp(struct rt *rt, struct tval a, struct tval b);
const char *tv_typename(struct tval v);
int tv_is_num(struct tval v); /* bool, int, float */
double tv_num(struct tval v);
/** The items a for loop visits: list elements, dict keys, string characters. */
const struct tval *tv_iter(struct rt *rt, struct tval v, uint32_t *n);
/** len(); fails on values without one. */
int64_t tv_len(struct rt *rt, struct tval v);

/* text */
void tb_put(struct rt *rt, struct tbuf *b, const char *s, size_t n);
static inline void tb_puts(struct rt *rt, struct tbuf *b, const char *s)
{
    tb_put(rt, b, s, strlen(s));
}
void tb_str(struct rt *rt, struct tbuf *b, struct tval v);  /* str(v) */
void tb_repr(struct rt *rt, struct tbuf *b, struct tval v); /* repr(v) */
/** json.dumps(v, ensure_ascii=False, indent=indent (<0: None), separators=(isep, ksep)). */
void tb_json(struct rt *rt, struct tbuf *b, struct tval v, int indent, const char *isep,
             const char *ksep, int level);
void fmt_float(char *out, size_t cap, double f); /* Python repr of a float */
struct tval tv_to_str(struct rt *rt, struct tval v);
struct tval tv_concat(struct rt *rt, struct tval a, struct tval b); /* both TV_STR */
struct tval tv_from_json(struct rt *rt, const void *cjson);
/** HTML-escapes str(v) (& < > " ') into a markup string; markup passes unchanged. */
struct tval tv_escape(struct rt *rt, struct tval v);
/** Length in bytes of the UTF-8 sequence starting at s (1 for invalid bytes). */
size_t utf8_len(const char *s, size_t n);
/** The code point at s (a lone byte for invalid UTF-8); *len gets its byte length. */
uint32_t u_decode(const char *s, size_t n, size_t *len);
int u_isspace(const char *s, size_t n, size_t *clen);

/* filters, tests, methods, globals */
struct tval tmpl_filter(struct rt *rt, const char *name, size_t nlen, struct tval v,
                        struct targs *a);
int tmpl_test(struct rt *rt, const char *name, size_t nlen, struct tval v, struct targs *a);
/** Whether a filter / test of that name exists (jinja2 rejects unknown ones at parse time). */
int tmpl_filter_known(const char *name, size_t nlen);
int tmpl_test_known(const char *name, size_t nlen);
/** Attribute `name` of `self` as a bound method, or found=0 when `self` has no such method. */
int tmpl_has_method(struct tval self, const char *name, size_t nlen);
struct tval tmpl_call_method(struct rt *rt, struct tval self, const char *name, struct targs *a);
/** A global function (range, dict, namespace, raise_exception, strftime_now, ...) or -1. */
int tmpl_global(const char *name, size_t nlen);
struct tval tmpl_call_global(struct rt *rt, const char *name, struct targs *a);
/** Calls any callable value (macro, method, global, loop.cycle). */
struct tval rt_call(struct rt *rt, struct tval fn, struct targs *a);
/** Attribute / item lookup with Jinja's rules (fails on undefined receivers). */
struct tval rt_getattr(struct rt *rt, struct tval obj, const char *name, size_t n);
struct tval rt_getitem(struct rt *rt, struct tval obj, struct tval key);

/** Argument `pos` (positional) or `name` (keyword), NULL when not given. */
struct tval *targ(struct targs *a, int pos, const char *name);

#endif
