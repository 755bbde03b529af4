/* Thinking and answer text of a reasoning model's output (see reasoning.h). A push costs
 * O(held * tag length); held stays shorter than a tag between pushes. */
#include "text/reasoning.h"

#include <string.h>

enum { R_BEFORE, R_IN, R_AFTER };

static const char *const names[] = {"", "qwen3", "deepseek_r1", "gemma4", "harmony"};

int reason_format_from_name(const char *name)
{
    for (int i = 1; i < (int)(sizeof names / sizeof *names); i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

const char *reason_format_name(enum reason_format f)
{
    return names[f];
}

const char *reason_format_start(enum reason_format f)
{
    return f == REASON_GEMMA4    ? "<|channel>thought"
           : f == REASON_HARMONY ? "<|channel|>analysis<|message|>"
                                 : "<think>";
}

const char *reason_format_end(enum reason_format f)
{
    return f == REASON_GEMMA4 ? "<channel|>" : f == REASON_HARMONY ? "<|end|>" : "</think>";
}

const char *const *reason_format_tags(enum reason_format f)
{
    static const char *const think[] = {"<think>", "</think>", NULL};
    static const char *const gemma[] = {"<|channel>", "<channel|>", NULL};
    static const char *const none[] = {NULL};
    return f == REASON_NONE      ? none
           : f == REASON_GEMMA4  ? gemma
           : f == REASON_HARMONY ? harmony_tags
                                 : think;
}

void reason_parser_init(struct reason_parser *r, enum reason_format f, int in_thinking)
{
    memset(r, 0, sizeof *r);
    r->f = f;
    r->state = f == REASON_NONE                         ? R_AFTER
               : in_thinking || f == REASON_DEEPSEEK_R1 ? R_IN
                                                        : R_BEFORE;
    r->fresh = r->state != R_AFTER;
    tcall_str_append(&r->held, "", 0); /* never NULL: held.p + i is always defined */
    harmony_init(&r->h, f == REASON_HARMONY && in_thinking);
}

void reason_parser_dispose(struct reason_parser *r)
{
    tcall_str_dispose(&r->held);
    harmony_dispose(&r->h);
}

int reason_parser_thinking(const struct reason_parser *r)
{
    return r->f == REASON_HARMONY ? harmony_thinking(&r->h) : r->state != R_AFTER;
}

/* ---- harmony: thinking and answer from the messages, calls passed on in one form ---- */

struct h_out {
    struct tcall_str *thinking, *answer;
};

static void h_answer(void *ctx, const char *s, size_t n)
{
    tcall_str_append(((struct h_out *)ctx)->answer, s, n);
}

static void h_think(void *ctx, const char *s, size_t n)
{
    tcall_str_append(((struct h_out *)ctx)->thinking, s, n);
}

static void h_call_open(void *ctx, const char *name, size_t n)
{
    struct tcall_str *a = ((struct h_out *)ctx)->answer;
    static const char pre[] = "<|start|>assistant<|channel|>commentary to=functions.";
    static const char post[] = " <|constrain|>json<|message|>";
    tcall_str_append(a, pre, sizeof pre - 1);
    tcall_str_append(a, name, n);
    tcall_str_append(a, post, sizeof post - 1);
}

static void h_call_end(void *ctx)
{
    tcall_str_append(((struct h_out *)ctx)->answer, "<|call|>", 8);
}

static const struct harmony_sink h_sink = {h_answer, h_think, h_call_open, h_answer, h_call_end};

static int is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static void consume(struct tcall_str *h, size_t n)
{
    memmove(h->p, h->p + n, h->len - n);
    h->len -= n;
}

/* Leading whitespace and then tag at the start of h: 1 (*len its bytes), 0 when h may
 * still become that, -1 when it cannot. */
static int lead_tag(const struct tcall_str *h, const char *tag, size_t *len)
{
    size_t i = 0, t = strlen(tag);
    while (i < h->len && is_ws(h->p[i])) i++;
    size_t n = h->len - i;
    if (memcmp(h->p + i, tag, n < t ? n : t)) return -1;
    if (n < t) return 0;
    *len = i + t;
    return 1;
}

static void run(struct reason_parser *r, struct tcall_str *thinking, struct tcall_str *answer,
                int at_end)
{
    struct tcall_str *h = &r->held;
    size_t len;
    if (r->f == REASON_HARMONY) {
        struct h_out o = {thinking, answer};
        harmony_run(&r->h, h, at_end, &h_sink, &o);
        return;
    }
    if (r->state == R_BEFORE || (r->state == R_IN && r->fresh)) {
        int m = lead_tag(h, reason_format_start(r->f), &len);
        if (m == 0 && !at_end) return;
        if (m == 1) {
            consume(h, len);
            r->state = R_IN;
        } else if (r->state == R_BEFORE) {
            r->state = R_AFTER;
        }
        r->fresh = 0;
    }
    if (r->state == R_IN) {
        const char *end = reason_format_end(r->f);
        size_t t = strlen(end), k = 0;
        int found = 0;
        for (; k + t <= h->len; k++)
            if (!memcmp(h->p + k, end, t)) {
                found = 1;
                break;
            }
        if (!found) {
            size_t keep = 0;
            if (!at_end)
                for (size_t l = t - 1 < h->len ? t - 1 : h->len; l > 0 && !keep; l--)
                    if (!memcmp(h->p + h->len - l, end, l)) keep = l;
            tcall_str_append(thinking, h->p, h->len - keep);
            consume(h, h->len - keep);
            return;
        }
        tcall_str_append(thinking, h->p, k);
        consume(h, k + t);
        r->state = R_AFTER;
        r->fresh = 1; /* the whitespace after </think> is markup */
    }
    if (r->fresh) {
        size_t i = 0;
        while (i < h->len && is_ws(h->p[i])) i++;
        consume(h, i);
        if (!h->len) return;
        r->fresh = 0;
    }
    tcall_str_append(answer, h->p, h->len);
    h->len = 0;
}

void reason_parser_push(struct reason_parser *r, const char *s, size_t n,
                        struct tcall_str *thinking, struct tcall_str *answer)
{
    tcall_str_append(&r->held, s, n);
    run(r, thinking, answer, 0);
}

void reason_parser_finish(struct reason_parser *r, struct tcall_str *thinking,
                          struct tcall_str *answer)
{
    run(r, thinking, answer, 1);
}
