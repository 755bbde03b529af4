/* The messages of a harmony output (see harmony.h). */
#include "text/harmony.h"

#include <string.h>

#include "text/toolcall_impl.h"

enum { H_OUT, H_HEAD, H_BODY };
enum { K_TEXT, K_THINK, K_CALL };

#define T_START   "<|start|>"
#define T_CHANNEL "<|channel|>"
#define T_MESSAGE "<|message|>"
#define T_END     "<|end|>"
#define T_CALL    "<|call|>"
#define T_RETURN  "<|return|>"

const char *const harmony_tags[] = {T_START, T_CHANNEL,       T_MESSAGE, T_END,
                                    T_CALL,  "<|constrain|>", T_RETURN,  NULL};

void harmony_init(struct harmony *h, int in_analysis)
{
    memset(h, 0, sizeof *h);
    h->st = in_analysis ? H_BODY : H_OUT;
    h->kind = in_analysis ? K_THINK : K_TEXT;
    tcall_str_append(&h->head, "", 0);
}

void harmony_dispose(struct harmony *h)
{
    tcall_str_dispose(&h->head);
}

int harmony_thinking(const struct harmony *h)
{
    return h->st == H_BODY && h->kind == K_THINK;
}

/* The first of tags[0..n) in s[0..len): its offset (-1: none) and index. */
static long first_tag(const char *s, size_t len, const char *const *tags, int n, int *which)
{
    long best = -1;
    for (int i = 0; i < n; i++) {
        long k = tc_find(s, len, tags[i]);
        if (k >= 0 && (best < 0 || k < best)) best = k, *which = i;
    }
    return best;
}

/* The longest tail of s that may be the start of one of the tags. */
static size_t partial(const char *s, size_t len, const char *const *tags, int n)
{
    size_t keep = 0;
    for (int i = 0; i < n; i++) {
        size_t k = tc_partial(s, len, tags[i]);
        if (k > keep) keep = k;
    }
    return keep;
}

/* A word of the header after at (up to a space, a tag or the end). */
static size_t word(const char *at, const char *end)
{
    size_t n = 0;
    while (at + n < end && at[n] != ' ' && at[n] != '<' && at[n] != '\n') n++;
    return n;
}

/* The header is complete: what its body is. */
static void classify(struct harmony *h, const struct harmony_sink *k, void *ctx)
{
    const char *s = h->head.p, *end = s + h->head.len;
    const char *ch = strstr(s, T_CHANNEL);
    const char *cname = ch ? ch + strlen(T_CHANNEL) : NULL;
    size_t cn = cname ? word(cname, end) : 0;
    const char *to = NULL;
    for (const char *p = s; p + 3 <= end && !to; p++)
        if (!memcmp(p, "to=", 3) && (p == s || p[-1] == ' ' || p[-1] == '>')) to = p + 3;
    size_t tn = to ? word(to, end) : 0;
    static const char fn[] = "functions.";
    if (to && tn > sizeof fn - 1 && !memcmp(to, fn, sizeof fn - 1)) {
        h->kind = K_CALL;
        k->call_open(ctx, to + sizeof fn - 1, tn - (sizeof fn - 1));
    } else if (to || (cname && cn == 8 && !memcmp(cname, "analysis", 8))) {
        h->kind = K_THINK; /* thinking, or a built-in tool's input (python, browser) */
    } else {
        h->kind = K_TEXT;
    }
}

static void body(struct harmony *h, const struct harmony_sink *k, void *ctx, const char *s,
                 size_t n)
{
    if (!n) return;
    if (h->kind == K_CALL)
        k->call_args(ctx, s, n);
    else if (h->kind == K_THINK)
        k->think(ctx, s, n);
    else
        k->text(ctx, s, n);
}

/* H_OUT: content up to a message's start; stray ends are markup. */
static int step_out(struct harmony *h, struct tcall_str *held, int at_end,
                    const struct harmony_sink *k, void *ctx)
{
    static const char *const tags[] = {T_START, T_CHANNEL, T_MESSAGE, T_END, T_CALL, T_RETURN};
    int which = 0;
    long at = first_tag(held->p, held->len, tags, 6, &which);
    if (at < 0) {
        size_t keep = at_end ? 0 : partial(held->p, held->len, tags, 6);
        if (held->len > keep) k->text(ctx, held->p, held->len - keep);
        tc_str_consume(held, held->len - keep);
        return 0;
    }
    if (at) k->text(ctx, held->p, (size_t)at);
    tc_str_consume(held, (size_t)at + strlen(tags[which]));
    if (which == 0 || which == 1) {
        h->head.len = 0;
        if (which == 1) tc_puts(&h->head, T_CHANNEL); /* the first message's header */
        h->st = H_HEAD;
    } else if (which == 2) { /* a body without a header: content */
        h->kind = K_TEXT;
        h->st = H_BODY;
    }
    return 1;
}

/* H_HEAD: up to <|message|>. */
static int step_head(struct harmony *h, struct tcall_str *held, int at_end,
                     const struct harmony_sink *k, void *ctx)
{
    static const char *const tags[] = {T_MESSAGE, T_START, T_END, T_CALL, T_RETURN};
    int which = 0;
    long at = first_tag(held->p, held->len, tags, 5, &which);
    size_t take =
        at >= 0 ? (size_t)at : held->len - (at_end ? 0 : partial(held->p, held->len, tags, 5));
    if (h->head.len + take > HARMONY_HEAD_MAX) {
        /* not a header after all: what follows the tag is content (the same cut at any
         * chunking: HARMONY_HEAD_MAX bytes of header are read first) */
        size_t room = HARMONY_HEAD_MAX - h->head.len;
        tcall_str_append(&h->head, held->p, room);
        tc_str_consume(held, room);
        size_t skip = strncmp(h->head.p, T_CHANNEL, strlen(T_CHANNEL)) ? 0 : strlen(T_CHANNEL);
        k->text(ctx, h->head.p + skip, h->head.len - skip);
        h->head.len = 0;
        h->kind = K_TEXT;
        h->st = H_BODY;
        return 1;
    }
    tcall_str_append(&h->head, held->p, take);
    tc_str_consume(held, take);
    if (at < 0) {
        if (at_end) h->st = H_OUT; /* a header cut short: markup only */
        return 0;
    }
    if (which == 0) {
        tc_str_consume(held, strlen(T_MESSAGE));
        classify(h, k, ctx);
        h->st = H_BODY;
    } else {
        h->st = H_OUT; /* a header without a body: the tag that ended it is read again */
    }
    return 1;
}

/* H_BODY: up to its end tag (or the start of the next message, when the end is missing). */
static int step_body(struct harmony *h, struct tcall_str *held, int at_end,
                     const struct harmony_sink *k, void *ctx)
{
    static const char *const tags[] = {T_END, T_CALL, T_RETURN, T_START, T_CHANNEL};
    int which = 0;
    long at = first_tag(held->p, held->len, tags, 5, &which);
    if (at < 0) {
        size_t keep = at_end ? 0 : partial(held->p, held->len, tags, 5);
        body(h, k, ctx, held->p, held->len - keep);
        tc_str_consume(held, held->len - keep);
        if (!at_end) return 0;
    } else {
        body(h, k, ctx, held->p, (size_t)at);
        tc_str_consume(held, (size_t)at + (which < 3 ? strlen(tags[which]) : 0));
    }
    if (h->kind == K_CALL) k->call_end(ctx);
    h->kind = K_TEXT;
    h->st = H_OUT;
    return at >= 0;
}

void harmony_run(struct harmony *h, struct tcall_str *held, int at_end,
                 const struct harmony_sink *k, void *ctx)
{
    for (;;) {
        int progressed = h->st == H_OUT    ? step_out(h, held, at_end, k, ctx)
                         : h->st == H_HEAD ? step_head(h, held, at_end, k, ctx)
                                           : step_body(h, held, at_end, k, ctx);
        if (!progressed) return;
    }
}
