/*
 * libFuzzer target for the output parsers: the first byte picks the tool-call format and
 * the reasoning format, the second seeds a chunking, the rest is model output. The output
 * goes through reasoning and tool-call parsers once whole and once in chunks. Properties:
 * no crash or overrun; both runs give the same thinking, content and calls; a call's
 * arguments only grow while the chunks arrive (what a stream sent stays a prefix) and its
 * name never changes once known. Built and run by tests/fuzz/run.sh.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/reasoning.h"
#include "text/toolcall.h"

#define MAX_CALLS 64

struct result {
    struct tcall_str thinking, content;
    struct tcall_parser *tp;
};

static void feed(struct result *r, struct reason_parser *rp, const char *s, size_t n, size_t *sent,
                 char **names)
{
    struct tcall_str answer = {0};
    reason_parser_push(rp, s, n, &r->thinking, &answer);
    tcall_parser_push(r->tp, answer.p ? answer.p : "", answer.len, &r->content);
    tcall_str_dispose(&answer);
    for (int i = 0; i < tcall_parser_n_calls(r->tp) && i < MAX_CALLS; i++) {
        const struct tcall *c = tcall_parser_call(r->tp, i);
        if (!c->name) continue;
        if (names[i] && strcmp(names[i], c->name)) abort();
        if (!names[i]) names[i] = strdup(c->name);
        if (c->args.len < sent[i]) abort();
        sent[i] = c->args.len;
    }
}

static void finish(struct result *r, struct reason_parser *rp)
{
    struct tcall_str answer = {0};
    reason_parser_finish(rp, &r->thinking, &answer);
    tcall_parser_push(r->tp, answer.p ? answer.p : "", answer.len, &r->content);
    tcall_parser_finish(r->tp, &r->content);
    tcall_str_dispose(&answer);
}

static int same(const struct tcall_str *a, const struct tcall_str *b)
{
    return a->len == b->len && (!a->len || !memcmp(a->p, b->p, a->len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    static const char *tools_json =
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"n\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\"}}}}}]";
    cJSON *tools = cJSON_Parse(tools_json);
    enum tcall_format tf = (enum tcall_format)(1 + data[0] % 6);
    enum reason_format rf = (enum reason_format)(data[0] / 6 % 5);
    int opened = data[0] / 30 % 2;
    uint32_t seed = data[1] * 2654435761u + 1;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;

    struct result whole = {{0}, {0}, tcall_parser_create(tf, tools)};
    struct result parts = {{0}, {0}, tcall_parser_create(tf, tools)};
    struct reason_parser r1, r2;
    reason_parser_init(&r1, rf, opened);
    reason_parser_init(&r2, rf, opened);
    size_t sent1[MAX_CALLS] = {0}, sent2[MAX_CALLS] = {0};
    char *names1[MAX_CALLS] = {0}, *names2[MAX_CALLS] = {0};
    feed(&whole, &r1, s, n, sent1, names1);
    finish(&whole, &r1);
    for (size_t at = 0; at < n;) {
        seed = seed * 1103515245u + 12345u;
        size_t k = 1 + (seed >> 16) % 8;
        if (k > n - at) k = n - at;
        feed(&parts, &r2, s + at, k, sent2, names2);
        at += k;
    }
    finish(&parts, &r2);

    if (!same(&whole.thinking, &parts.thinking) || !same(&whole.content, &parts.content)) abort();
    int nc = tcall_parser_n_calls(whole.tp);
    if (nc != tcall_parser_n_calls(parts.tp)) abort();
    for (int i = 0; i < nc; i++) {
        const struct tcall *a = tcall_parser_call(whole.tp, i), *b = tcall_parser_call(parts.tp, i);
        if (!a->name != !b->name || (a->name && strcmp(a->name, b->name))) abort();
        if (!same(&a->args, &b->args) || a->done != b->done) abort();
    }
    for (int i = 0; i < MAX_CALLS; i++) free(names1[i]), free(names2[i]);
    tcall_str_dispose(&whole.thinking);
    tcall_str_dispose(&whole.content);
    tcall_str_dispose(&parts.thinking);
    tcall_str_dispose(&parts.content);
    tcall_parser_destroy(whole.tp);
    tcall_parser_destroy(parts.tp);
    reason_parser_dispose(&r1);
    reason_parser_dispose(&r2);
    cJSON_Delete(tools);
    return 0;
}
