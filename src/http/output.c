/*
 * Output parsing of chat and messages choices: the text after stop strings goes through
 * the reasoning parser (thinking vs answer) and then the tool-call parser (content vs
 * calls). Non-streaming requests keep the parts for the final body; streaming ones send
 * each part as it becomes certain: OpenAI delta.reasoning_content and delta.tool_calls
 * (index, id and name once, then argument pieces), Anthropic thinking, text and tool_use
 * content blocks (thinking_delta, text_delta, input_json_delta).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "http/job.h"

enum { BLK_NONE, BLK_THINKING, BLK_TEXT, BLK_TOOL };

struct out_call {
    char id[48];
    int started;      /* streaming: the call's name is out */
    size_t args_sent; /* streaming: argument bytes out */
};

struct http_out {
    struct reason_parser rp;
    struct tcall_parser *tp;   /* NULL: no tools */
    struct tcall_str thinking; /* non-streaming: all of it; streaming: not yet sent */
    struct out_call *calls;
    int n_calls;
    int block, block_kind; /* Anthropic stream: the open block (-1 none) and its kind */
    int n_blocks;
};

struct http_out *http_out_create(struct http_job *j)
{
    if (!j->g.tool_format && !j->g.reason_format) return NULL;
    struct http_out *o = xcalloc(1, sizeof *o);
    reason_parser_init(&o->rp, j->g.reason_format, j->g.think_open);
    if (j->g.tool_format) o->tp = tcall_parser_create(j->g.tool_format, j->g.tools);
    o->block = -1;
    return o;
}

void http_out_destroy(struct http_out *o)
{
    if (!o) return;
    reason_parser_dispose(&o->rp);
    tcall_parser_destroy(o->tp);
    tcall_str_dispose(&o->thinking);
    free(o->calls);
    free(o);
}

/* Named calls get an id (call_... / toolu_...) when first seen. */
static void track_calls(struct http_job *j, struct job_choice *c)
{
    struct http_out *o = c->out;
    int n = o->tp ? tcall_parser_n_calls(o->tp) : 0;
    while (n && !tcall_parser_call(o->tp, n - 1)->name) n--;
    if (n <= o->n_calls) return;
    o->calls = xrealloc(o->calls, sizeof *o->calls * (size_t)n);
    /* unique as the response id is: its hex part, the choice and the call */
    const char *hex = strpbrk(j->id, "-_");
    hex = hex ? hex + 1 : j->id;
    for (int i = o->n_calls; i < n; i++) {
        memset(&o->calls[i], 0, sizeof o->calls[i]);
        snprintf(o->calls[i].id, sizeof o->calls[i].id, "%s%.24s%02x%02x",
                 j->route == HTTP_ROUTE_MESSAGES ? "toolu_" : "call_", hex, c->index & 0xff,
                 i & 0xff);
    }
    o->n_calls = c->n_calls = n;
}

/* ---- Anthropic stream blocks ---------------------------------------------------------- */

static void block_close(struct http_job *j, struct http_out *o)
{
    if (o->block < 0) return;
    struct http_buf d = {0};
    http_buf_printf(&d, "{\"type\":\"content_block_stop\",\"index\":%d}", o->block);
    http_fmt_sse(&j->out, "content_block_stop", &d);
    http_buf_dispose(&d);
    o->block = -1;
    o->block_kind = BLK_NONE;
}

/* Opens a block of kind (closing the one before) unless one of that kind is open;
 * start_json: the content_block object. */
static void block_open(struct http_job *j, struct http_out *o, int kind, const char *start_json)
{
    if (o->block >= 0 && o->block_kind == kind && kind != BLK_TOOL) return;
    block_close(j, o);
    o->block = o->n_blocks++;
    o->block_kind = kind;
    struct http_buf d = {0};
    http_buf_printf(&d, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":%s}",
                    o->block, start_json);
    http_fmt_sse(&j->out, "content_block_start", &d);
    http_buf_dispose(&d);
}

static void block_delta(struct http_job *j, struct http_out *o, const char *type, const char *key,
                        const char *s, size_t n)
{
    struct http_buf d = {0};
    http_buf_printf(
        &d, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":",
        o->block, type, key);
    http_buf_json_str(&d, s, n);
    http_buf_puts(&d, "}}");
    http_fmt_sse(&j->out, "content_block_delta", &d);
    http_buf_dispose(&d);
}

void http_out_anthropic_close(struct http_job *j)
{
    struct http_out *o = j->c[0].out;
    if (!o->n_blocks) block_open(j, o, BLK_TEXT, "{\"type\":\"text\",\"text\":\"\"}");
    block_close(j, o);
}

static void anthropic_stream(struct http_job *j, struct job_choice *c, const char *content,
                             size_t len)
{
    struct http_out *o = c->out;
    if (!j->msg_started) http_fmt_anthropic_start(j, &j->out);
    if (o->thinking.len) {
        block_open(j, o, BLK_THINKING,
                   "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}");
        block_delta(j, o, "thinking_delta", "thinking", o->thinking.p, o->thinking.len);
        o->thinking.len = 0;
    }
    if (len) {
        block_open(j, o, BLK_TEXT, "{\"type\":\"text\",\"text\":\"\"}");
        block_delta(j, o, "text_delta", "text", content, len);
    }
    for (int i = 0; i < o->n_calls; i++) {
        const struct tcall *t = tcall_parser_call(o->tp, i);
        struct out_call *oc = &o->calls[i];
        if (!oc->started) {
            struct http_buf s = {0};
            http_buf_printf(&s, "{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":", oc->id);
            http_buf_json_str(&s, t->name, strlen(t->name));
            http_buf_puts(&s, ",\"input\":{}}");
            block_open(j, o, BLK_TOOL, s.p);
            http_buf_dispose(&s);
            oc->started = 1;
        }
        /* a piece ends at a whole character, unless the call is complete */
        size_t n = t->args.len - oc->args_sent;
        if (!t->done) n = http_utf8_complete(t->args.p + oc->args_sent, n);
        if (n) block_delta(j, o, "input_json_delta", "partial_json", t->args.p + oc->args_sent, n);
        oc->args_sent += n;
    }
}

/* ---- OpenAI stream -------------------------------------------------------------------- */

static void openai_stream(struct http_job *j, struct job_choice *c, const char *content, size_t len,
                          const struct http_lp *lps, int n_lps, int finished)
{
    struct http_out *o = c->out;
    struct http_buf d = {0};
    if (o->thinking.len) {
        http_buf_puts(&d, "{\"reasoning_content\":");
        http_buf_json_str(&d, o->thinking.p, o->thinking.len);
        http_buf_puts(&d, "}");
        http_fmt_stream_delta(j, c->index, d.p);
        o->thinking.len = 0;
    }
    /* token ids (return_token_ids) go out with the batch's content chunk, empty or not */
    if (len || n_lps || c->n_ids) http_fmt_stream_choice(j, c->index, content, len, lps, n_lps, 0);
    for (int i = 0; i < o->n_calls; i++) {
        const struct tcall *t = tcall_parser_call(o->tp, i);
        struct out_call *oc = &o->calls[i];
        size_t n = t->args.len - oc->args_sent;
        if (!t->done) n = http_utf8_complete(t->args.p + oc->args_sent, n);
        if (oc->started && !n) continue;
        d.len = 0;
        http_buf_printf(&d, "{\"tool_calls\":[{\"index\":%d,", i);
        if (!oc->started) {
            http_buf_printf(&d, "\"id\":\"%s\",\"type\":\"function\",", oc->id);
            http_buf_puts(&d, "\"function\":{\"name\":");
            http_buf_json_str(&d, t->name, strlen(t->name));
            http_buf_puts(&d, ",\"arguments\":");
        } else {
            http_buf_puts(&d, "\"function\":{\"arguments\":");
        }
        http_buf_json_str(&d, t->args.p + oc->args_sent, n);
        http_buf_puts(&d, "}}]}");
        http_fmt_stream_delta(j, c->index, d.p);
        oc->started = 1;
        oc->args_sent += n;
    }
    http_buf_dispose(&d);
    if (finished) http_fmt_stream_choice(j, c->index, "", 0, NULL, 0, 1);
}

void http_out_feed(struct http_job *j, struct job_choice *c, const char *s, size_t n,
                   const struct http_lp *lps, int n_lps, int finished)
{
    struct http_out *o = c->out;
    struct tcall_str answer = {0}, content = {0};
    reason_parser_push(&o->rp, s, n, &o->thinking, &answer);
    if (finished) reason_parser_finish(&o->rp, &o->thinking, &answer);
    if (o->tp) {
        tcall_parser_push(o->tp, answer.p ? answer.p : "", answer.len, &content);
        if (finished) tcall_parser_finish(o->tp, &content);
    } else {
        content = answer;
        answer = (struct tcall_str){0};
    }
    track_calls(j, c);
    const char *text = content.p ? content.p : "";
    if (!j->g.stream)
        http_buf_append(&c->text, text, content.len);
    else if (j->route == HTTP_ROUTE_MESSAGES)
        anthropic_stream(j, c, text, content.len);
    else
        openai_stream(j, c, text, content.len, lps, n_lps, finished);
    tcall_str_dispose(&answer);
    tcall_str_dispose(&content);
}

int http_out_special(struct http_job *j, struct job_choice *c, int32_t id, struct http_buf *delta)
{
    const struct tok *t = j->served->model.tok;
    if (!t || !j->g.skip_special || !tok_is_special(t, id)) return 0;
    size_t len = 0;
    char *s = tok_decode_len(t, &id, 1, 0, &len);
    /* the formats' markup reaches the parsers (a constrained call writes it as tokens) */
    int tag = 0;
    const char *const *lists[2] = {tcall_format_tags(j->g.tool_format),
                                   reason_format_tags(j->g.reason_format)};
    for (int l = 0; l < 2; l++)
        for (const char *const *p = lists[l]; *p && !tag; p++)
            tag = len == strlen(*p) && !memcmp(s, *p, len);
    int stopped = tag ? http_choice_push_text(&c->ch, s, len, delta) : 0;
    free(s);
    return tag ? 1 + stopped : 0;
}

/* ---- final bodies --------------------------------------------------------------------- */

void http_out_openai_message(struct http_job *j, struct job_choice *c, struct http_buf *o)
{
    (void)j;
    struct http_out *p = c->out;
    http_buf_puts(o, "{\"role\":\"assistant\",\"content\":");
    if (p->n_calls && !c->text.len)
        http_buf_puts(o, "null");
    else
        http_buf_json_str(o, c->text.p ? c->text.p : "", c->text.len);
    if (p->rp.f) {
        http_buf_puts(o, ",\"reasoning_content\":");
        if (p->thinking.len)
            http_buf_json_str(o, p->thinking.p, p->thinking.len);
        else
            http_buf_puts(o, "null");
    }
    if (p->n_calls) {
        http_buf_puts(o, ",\"tool_calls\":[");
        for (int i = 0; i < p->n_calls; i++) {
            const struct tcall *t = tcall_parser_call(p->tp, i);
            http_buf_printf(o, "%s{\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":",
                            i ? "," : "", p->calls[i].id);
            http_buf_json_str(o, t->name, strlen(t->name));
            http_buf_puts(o, ",\"arguments\":");
            http_buf_json_str(o, t->args.p, t->args.len);
            http_buf_puts(o, "}}");
        }
        http_buf_puts(o, "]");
    }
    http_buf_puts(o, "}");
}

void http_out_anthropic_content(struct http_job *j, struct job_choice *c, struct http_buf *o)
{
    (void)j;
    struct http_out *p = c->out;
    int n = 0;
    http_buf_puts(o, "[");
    if (p->thinking.len) {
        http_buf_puts(o, "{\"type\":\"thinking\",\"thinking\":");
        http_buf_json_str(o, p->thinking.p, p->thinking.len);
        http_buf_puts(o, ",\"signature\":\"\"}");
        n++;
    }
    if (c->text.len || (!n && !p->n_calls)) {
        http_buf_puts(o, n++ ? ",{\"type\":\"text\",\"text\":" : "{\"type\":\"text\",\"text\":");
        http_buf_json_str(o, c->text.p ? c->text.p : "", c->text.len);
        http_buf_puts(o, "}");
    }
    for (int i = 0; i < p->n_calls; i++) {
        const struct tcall *t = tcall_parser_call(p->tp, i);
        http_buf_printf(o, "%s{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":", n++ ? "," : "",
                        p->calls[i].id);
        http_buf_json_str(o, t->name, strlen(t->name));
        /* input is an object: arguments that are not one (cut short) give {} */
        cJSON *in = cJSON_ParseWithLength(t->args.p, t->args.len);
        char *text = cJSON_IsObject(in) ? cJSON_PrintUnformatted(in) : NULL;
        http_buf_puts(o, ",\"input\":");
        http_buf_puts(o, text ? text : "{}");
        http_buf_puts(o, "}");
        free(text);
        cJSON_Delete(in);
    }
    http_buf_puts(o, "]");
}
