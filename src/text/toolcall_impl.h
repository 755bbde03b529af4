/* Internals of the tool-call parser shared by toolcall.c (the parser, the JSON formats)
 * and toolcall_xml.c (qwen3_xml and gemma4, the formats whose arguments are not JSON). */
#ifndef PAGODA_TEXT_TOOLCALL_IMPL_H
#define PAGODA_TEXT_TOOLCALL_IMPL_H

#include <string.h>

#include "text/harmony.h"
#include "text/toolcall.h"

#define GEMMA_QUOTE "<|\"|>" /* Gemma 4's string delimiter */

enum tc_state {
    ST_TEXT,        /* content, looking for the format's start tag */
    ST_PLAIN,       /* content to the end (llama3_json: the output did not start with a call) */
    ST_LLAMA_START, /* llama3_json: the start of the output decides */
    ST_OBJ,         /* a JSON call object (or, bare, mistral's [ARGS] object) */
    ST_AFTER_OBJ,   /* after a JSON call: its end tag, a separator or the next call */
    ST_M_OPEN,      /* mistral after [TOOL_CALLS]: an array of calls or a name */
    ST_M_NAME,      /* mistral v11: the name up to [ARGS] */
    ST_X_FUNC,      /* qwen3_xml after <tool_call>: <function=NAME> */
    ST_X_BODY,      /* qwen3_xml: <parameter=KEY> or </function> */
    ST_X_VALUE,     /* qwen3_xml: a parameter's value up to </parameter> */
    ST_X_END,       /* qwen3_xml after </function>: </tool_call> */
    ST_G_NAME,      /* gemma4 after <|tool_call>: call:NAME up to '{' */
    ST_G_ARGS,      /* gemma4: the arguments, converted to JSON */
    ST_G_END,       /* gemma4 after the arguments: <tool_call|> */
};

/* The JSON scanner's state for one call. */
struct tc_jread {
    int bare; /* the value is the arguments themselves */
    int depth, in_str, esc;
    int expect, field; /* at depth 1 of a call object */
    int in_args;       /* bytes go to the call's arguments */
    struct tcall_str key, name;
};

struct tcall_parser {
    enum tcall_format f;
    const cJSON *tools;
    enum tc_state st;
    struct tcall_str held; /* text not consumed yet */
    struct tcall_str raw;  /* the open call's markup so far (content if it proves malformed) */
    struct tcall *calls;
    int n_calls, cap_calls;
    int in_array;   /* mistral: inside [TOOL_CALLS][ ... ] */
    int after_call; /* whitespace between calls is dropped */
    struct tc_jread j;
    /* qwen3_xml */
    int n_params, value_string, value_begun;
    /* gemma4: open containers ('{' or '['), whether a key is due, inside a string */
    char g_stack[64];
    int g_depth, g_key, g_str;
    /* harmony: the messages, and whether the open call's JSON is complete (or broken) */
    struct harmony h;
    int j_over;
};

/* ---- small functions over the held text ---- */

static inline struct tcall *tc_cur(struct tcall_parser *p)
{
    return &p->calls[p->n_calls - 1];
}

static inline void tc_str_consume(struct tcall_str *s, size_t n)
{
    memmove(s->p, s->p + n, s->len - n);
    s->len -= n;
}

static inline void tc_consume(struct tcall_parser *p, size_t n)
{
    tc_str_consume(&p->held, n);
}

static inline int tc_is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* Where tag first occurs in s[0..n), or -1. */
static inline long tc_find(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t i = 0; i + t <= n; i++)
        if (s[i] == tag[0] && !memcmp(s + i, tag, t)) return (long)i;
    return -1;
}

/* The longest suffix of s[0..n) that is a proper prefix of tag: text to hold back. */
static inline size_t tc_partial(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t l = t - 1 < n ? t - 1 : n; l > 0; l--)
        if (!memcmp(s + n - l, tag, l)) return l;
    return 0;
}

/* s[0..n) (n may be short of the tag) matches the start of tag. */
static inline int tc_starts(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    return !memcmp(s, tag, n < t ? n : t);
}

static inline void tc_puts(struct tcall_str *s, const char *p)
{
    tcall_str_append(s, p, strlen(p));
}

/* ---- calls (toolcall.c) ---- */

/** Opens a call (its name NULL). */
struct tcall *tc_call_open(struct tcall_parser *p);
/** The open call is complete: arguments "{}" when it had none. */
void tc_call_close(struct tcall_parser *p);
/** The open call's markup proved malformed before its name: released as content. */
void tc_call_abandon(struct tcall_parser *p, struct tcall_str *content);
/** The call's name: s[0..n) with surrounding whitespace dropped. */
void tc_set_name(struct tcall *c, const char *s, size_t n);

/* ---- the states of toolcall_xml.c: 1 when they made progress, 0 when they need text ---- */

int tc_step_x_func(struct tcall_parser *p, struct tcall_str *content, int at_end);
int tc_step_x_body(struct tcall_parser *p, int at_end);
int tc_step_x_value(struct tcall_parser *p, int at_end);
int tc_step_x_end(struct tcall_parser *p, int at_end);
int tc_step_g_name(struct tcall_parser *p, struct tcall_str *content, int at_end);
int tc_step_g_args(struct tcall_parser *p, int at_end);
int tc_step_g_end(struct tcall_parser *p, int at_end);

#endif
