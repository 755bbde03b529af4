/* Response bodies and SSE events of the OpenAI and Anthropic APIs, written straight into
 * byte buffers (no intermediate JSON tree on the per-token path). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "http/job.h"

static void put_float(struct http_buf *o, float f)
{
    if (!isfinite(f)) f = -9999.0f; /* -inf: what OpenAI-compatible servers report */
    http_buf_printf(o, "%.8g", (double)f);
}

/* The token as clients see it: its text, or "token_id:N" with return_tokens_as_token_ids
 * or without a tokenizer. */
static char *token_text(struct http_job *j, int32_t id, size_t *len)
{
    if (j->g.tokens_as_ids || !j->served->model.tok) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "token_id:%d", id);
        *len = (size_t)n;
        char *s = malloc((size_t)n + 1);
        memcpy(s, buf, (size_t)n + 1);
        return s;
    }
    return tok_decode_len(j->served->model.tok, &id, 1, 0, len);
}

static void put_token(struct http_buf *o, struct http_job *j, int32_t id, int with_bytes)
{
    size_t len = 0;
    char *s = token_text(j, id, &len);
    /* Single tokens may cut a UTF-8 character: the string gets U+FFFD, bytes stay exact. */
    struct http_buf fixed = {0};
    http_buf_append(&fixed, "", 0);
    for (size_t i = 0; i < len;) {
        size_t l = 1;
        while (l <= 4 && (i + l > len || !http_utf8_valid(s + i, l))) l++;
        if (l > 4) {
            http_buf_append(&fixed, "\xef\xbf\xbd", 3);
            i++;
        } else {
            http_buf_append(&fixed, s + i, l);
            i += l;
        }
    }
    http_buf_json_str(o, fixed.p, fixed.len);
    http_buf_dispose(&fixed);
    if (with_bytes) {
        http_buf_puts(o, ",\"bytes\":[");
        for (size_t i = 0; i < len; i++)
            http_buf_printf(o, "%s%u", i ? "," : "", (unsigned)(unsigned char)s[i]);
        http_buf_puts(o, "]");
    }
    free(s);
}

/* Chat: {"content":[{token, logprob, bytes, top_logprobs}]}. */
static void chat_logprobs(struct http_buf *o, struct http_job *j, const struct http_lp *lp, int n)
{
    http_buf_puts(o, "{\"content\":[");
    for (int i = 0; i < n; i++) {
        http_buf_puts(o, i ? ",{\"token\":" : "{\"token\":");
        put_token(o, j, lp[i].id, 0);
        http_buf_puts(o, ",\"logprob\":");
        put_float(o, lp[i].logprob);
        size_t len = 0;
        char *s = token_text(j, lp[i].id, &len);
        http_buf_puts(o, ",\"bytes\":[");
        for (size_t b = 0; b < len; b++)
            http_buf_printf(o, "%s%u", b ? "," : "", (unsigned)(unsigned char)s[b]);
        free(s);
        http_buf_puts(o, "],\"top_logprobs\":[");
        int nt = lp[i].n_top < j->g.top_logprobs ? lp[i].n_top : j->g.top_logprobs;
        for (int t = 0; t < nt; t++) {
            http_buf_puts(o, t ? ",{\"token\":" : "{\"token\":");
            put_token(o, j, lp[i].top[t].id, 1);
            http_buf_puts(o, ",\"logprob\":");
            put_float(o, lp[i].top[t].logprob);
            http_buf_puts(o, "}");
        }
        http_buf_puts(o, "]}");
    }
    http_buf_puts(o, "]}");
}

/* Code points of UTF-8 text s[n]: the unit of text_offset (vLLM counts Python characters). */
static long code_points(const char *s, size_t n)
{
    long k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}

/*
 * Completions: {"tokens","token_logprobs","top_logprobs","text_offset"} of a and then b.
 * A token's text_offset is where the text stands when it arrives: the characters the
 * sequence's detokenizer (*pos) has made final before it. A character split over byte
 * tokens ("é" as <0xC3><0xA9>) counts once, at the token that completes it; decoding each
 * token alone would count a U+FFFD for each of its bytes.
 */
static void completion_logprobs(struct http_buf *o, struct http_job *j, const struct http_lp *a,
                                int na, const struct http_lp *b, int nb, struct http_text_pos *pos)
{
    const char *keys[4] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    long *offs = xmalloc(sizeof *offs * (size_t)(na + nb ? na + nb : 1));
    const struct tok *tok = j->served->model.tok;
    if (tok && !pos->ts) pos->ts = tok_stream_create(tok, j->g.skip_special);
    for (int i = 0; i < na + nb; i++) {
        offs[i] = pos->chars;
        if (!tok) continue; /* no text (--skip-tokenizer-init): every offset is 0 */
        size_t len = 0;
        char *s = tok_stream_push_len(pos->ts, i < na ? a[i].id : b[i - na].id, &len);
        pos->chars += code_points(s, len);
        free(s);
    }
    http_buf_puts(o, "{");
    for (int k = 0; k < 4; k++) {
        http_buf_printf(o, "%s\"%s\":[", k ? "," : "", keys[k]);
        for (int i = 0; i < na + nb; i++) {
            const struct http_lp *lp = i < na ? &a[i] : &b[i - na];
            if (i) http_buf_puts(o, ",");
            if (k == 0) {
                put_token(o, j, lp->id, 0);
            } else if (k == 1) {
                if (lp->has_lp)
                    put_float(o, lp->logprob);
                else
                    http_buf_puts(o, "null");
            } else if (k == 2) {
                if (!lp->has_lp) {
                    http_buf_puts(o, "null");
                    continue;
                }
                http_buf_puts(o, "{");
                int nt = lp->n_top < j->g.top_logprobs ? lp->n_top : j->g.top_logprobs;
                /* The chosen token is always listed (OpenAI's shape: logprobs + 1 at most). */
                int listed = 0;
                for (int t = 0; t < nt; t++) {
                    if (t) http_buf_puts(o, ",");
                    put_token(o, j, lp->top[t].id, 0);
                    http_buf_puts(o, ":");
                    put_float(o, lp->top[t].logprob);
                    listed |= lp->top[t].id == lp->id;
                }
                if (!listed && nt > 0) {
                    http_buf_puts(o, ",");
                    put_token(o, j, lp->id, 0);
                    http_buf_puts(o, ":");
                    put_float(o, lp->logprob);
                }
                http_buf_puts(o, "}");
            } else {
                http_buf_printf(o, "%ld", offs[i]);
            }
        }
        http_buf_puts(o, "]");
    }
    http_buf_puts(o, "}");
    free(offs);
}

/* ,"key":[ids] (return_token_ids, as vLLM names them). */
static void put_ids(struct http_buf *o, const char *key, const int32_t *ids, int n)
{
    http_buf_printf(o, ",\"%s\":[", key);
    for (int i = 0; i < n; i++) http_buf_printf(o, i ? ",%d" : "%d", ids[i]);
    http_buf_puts(o, "]");
}

static void put_prompt_ids(struct http_buf *o, struct http_job *j, const struct job_choice *c)
{
    put_ids(o, "prompt_token_ids", j->g.prompts[c->prompt], j->g.n_prompt[c->prompt]);
}

static const char *openai_finish(const struct job_choice *c)
{
    if (c->n_calls && c->finish == FINISH_STOP) return "tool_calls";
    return c->finish == FINISH_NONE ? "error" : finish_reason_name(c->finish);
}

static void anthropic_stop(struct http_job *j, struct http_buf *o)
{
    struct job_choice *c = &j->c[0];
    const char *r = c->ch.stopped                ? "stop_sequence"
                    : c->finish == FINISH_LENGTH ? "max_tokens"
                    : c->n_calls                 ? "tool_use"
                                                 : "end_turn";
    http_buf_printf(o, "\"stop_reason\":\"%s\",\"stop_sequence\":", r);
    if (c->ch.stopped) {
        const char *s = j->g.stop[c->ch.stop_index];
        http_buf_json_str(o, s, strlen(s));
    } else {
        http_buf_puts(o, "null");
    }
}

struct usage {
    long prompt, output, cached;
};

static struct usage usage_of(struct http_job *j)
{
    struct usage u = {0};
    for (int i = 0; i < j->n_c; i++) {
        struct job_choice *c = &j->c[i];
        u.output += c->n_output;
        if (i % j->g.n == 0) {
            u.prompt += c->seen ? c->n_prompt : j->g.n_prompt[c->prompt];
            u.cached += c->n_cached;
        }
    }
    return u;
}

static void openai_usage(struct http_job *j, struct http_buf *o)
{
    struct usage u = usage_of(j);
    http_buf_printf(o,
                    "\"usage\":{\"prompt_tokens\":%ld,\"completion_tokens\":%ld,\"total_tokens\":"
                    "%ld,\"prompt_tokens_details\":{\"cached_tokens\":%ld}}",
                    u.prompt, u.output, u.prompt + u.output, u.cached);
}

static void anthropic_usage(struct http_job *j, struct http_buf *o, int with_output)
{
    struct usage u = usage_of(j);
    http_buf_printf(o,
                    "\"usage\":{\"input_tokens\":%ld,\"cache_creation_input_tokens\":0,"
                    "\"cache_read_input_tokens\":%ld",
                    u.prompt - u.cached, u.cached);
    if (with_output) http_buf_printf(o, ",\"output_tokens\":%ld", u.output);
    http_buf_puts(o, "}");
}

static void openai_head(struct http_job *j, struct http_buf *o, const char *object)
{
    http_buf_printf(o, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", j->id, object,
                    j->created);
    http_buf_json_str(o, j->served->model.name, strlen(j->served->model.name));
}

void http_fmt_final(struct http_job *j, struct http_buf *o)
{
    const char *name = j->served->model.name;
    if (j->route == HTTP_ROUTE_MESSAGES) {
        struct job_choice *c = &j->c[0];
        http_buf_printf(
            o, "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":", j->id);
        http_buf_json_str(o, name, strlen(name));
        if (c->out) {
            http_buf_puts(o, ",\"content\":");
            http_out_anthropic_content(j, c, o);
            http_buf_puts(o, ",");
        } else {
            http_buf_puts(o, ",\"content\":[{\"type\":\"text\",\"text\":");
            http_buf_json_str(o, c->text.p ? c->text.p : "", c->text.len);
            http_buf_puts(o, "}],");
        }
        anthropic_stop(j, o);
        http_buf_puts(o, ",");
        anthropic_usage(j, o, 1);
        http_buf_puts(o, "}");
        return;
    }
    int chat = j->route == HTTP_ROUTE_CHAT;
    openai_head(j, o, chat ? "chat.completion" : "text_completion");
    http_buf_puts(o, ",\"choices\":[");
    for (int i = 0; i < j->n_c; i++) {
        struct job_choice *c = &j->c[i];
        http_buf_printf(o, "%s{\"index\":%d,", i ? "," : "", i);
        if (chat) {
            http_buf_puts(o, "\"message\":");
            if (c->out) {
                http_out_openai_message(j, c, o);
            } else {
                http_buf_puts(o, "{\"role\":\"assistant\",\"content\":");
                http_buf_json_str(o, c->text.p ? c->text.p : "", c->text.len);
                http_buf_puts(o, "}");
            }
            http_buf_puts(o, ",\"logprobs\":");
            if (j->g.logprobs)
                chat_logprobs(o, j, c->lps, c->n_lps);
            else
                http_buf_puts(o, "null");
        } else {
            struct http_buf text = {0};
            http_buf_append(&text, "", 0);
            if (j->g.echo) http_buf_puts(&text, j->g.prompt_text[c->prompt]);
            http_buf_append(&text, c->text.p, c->text.len);
            http_buf_puts(o, "\"text\":");
            http_buf_json_str(o, text.p, text.len);
            http_buf_dispose(&text);
            http_buf_puts(o, ",\"logprobs\":");
            struct http_text_pos pos = {0};
            if (j->g.logprobs)
                completion_logprobs(o, j, j->g.echo ? c->plps : NULL, j->g.echo ? c->n_plps : 0,
                                    c->lps, c->n_lps, &pos);
            else
                http_buf_puts(o, "null");
            if (pos.ts) tok_stream_destroy(pos.ts);
        }
        http_buf_printf(o, ",\"finish_reason\":\"%s\"", openai_finish(c));
        if (j->g.return_ids) {
            if (!chat) put_prompt_ids(o, j, c);
            put_ids(o, "token_ids", c->ids, c->n_ids);
        }
        http_buf_puts(o, "}");
    }
    http_buf_puts(o, "],");
    openai_usage(j, o);
    if (chat && j->g.return_ids) put_prompt_ids(o, j, &j->c[0]); /* one prompt */
    http_buf_puts(o, "}");
}

void http_fmt_sse(struct http_buf *o, const char *event, const struct http_buf *data)
{
    if (event) http_buf_printf(o, "event: %s\n", event);
    http_buf_puts(o, "data: ");
    http_buf_append(o, data->p, data->len);
    http_buf_puts(o, "\n\n");
}

void http_fmt_anthropic_start(struct http_job *j, struct http_buf *o)
{
    struct http_buf d = {0};
    const char *name = j->served->model.name;
    http_buf_printf(&d,
                    "{\"type\":\"message_start\",\"message\":{\"id\":\"%s\",\"type\":\"message\","
                    "\"role\":\"assistant\",\"model\":",
                    j->id);
    http_buf_json_str(&d, name, strlen(name));
    http_buf_puts(&d, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,");
    anthropic_usage(j, &d, 0);
    d.len--; /* reopen the usage object: output_tokens so far */
    http_buf_puts(&d, ",\"output_tokens\":0}}}");
    http_fmt_sse(o, "message_start", &d);
    d.len = 0;
    if (!j->c[0].out) { /* output parsing opens its blocks as they come (output.c) */
        http_buf_puts(&d, "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{"
                          "\"type\":\"text\",\"text\":\"\"}}");
        http_fmt_sse(o, "content_block_start", &d);
        d.len = 0;
    }
    http_buf_puts(&d, "{\"type\":\"ping\"}");
    http_fmt_sse(o, "ping", &d);
    http_buf_dispose(&d);
    j->msg_started = 1;
}

/* The chat stream's first chunk of a choice: the role. */
static void openai_first_chunk(struct http_job *j, int index)
{
    struct http_buf d = {0};
    openai_head(j, &d, "chat.completion.chunk");
    http_buf_printf(&d,
                    ",\"choices\":[{\"index\":%d,\"delta\":{\"role\":\"assistant\","
                    "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]",
                    index);
    if (j->g.include_usage) http_buf_puts(&d, ",\"usage\":null");
    if (j->g.return_ids) put_prompt_ids(&d, j, &j->c[index]);
    http_buf_puts(&d, "}");
    http_fmt_sse(&j->out, NULL, &d);
    http_buf_dispose(&d);
}

void http_fmt_stream_delta(struct http_job *j, int index, const char *delta_json)
{
    struct job_choice *c = &j->c[index];
    if (!c->sent_first) openai_first_chunk(j, index);
    c->sent_first = 1;
    struct http_buf d = {0};
    openai_head(j, &d, "chat.completion.chunk");
    http_buf_printf(&d,
                    ",\"choices\":[{\"index\":%d,\"delta\":%s,\"logprobs\":null,"
                    "\"finish_reason\":null}]",
                    index, delta_json);
    if (j->g.include_usage) http_buf_puts(&d, ",\"usage\":null");
    http_buf_puts(&d, "}");
    http_fmt_sse(&j->out, NULL, &d);
    http_buf_dispose(&d);
}

void http_fmt_stream_choice(struct http_job *j, int index, const char *delta, size_t len,
                            const struct http_lp *lps, int n_lps, int finished)
{
    struct job_choice *c = &j->c[index];
    struct http_buf *o = &j->out;
    if (j->route == HTTP_ROUTE_MESSAGES) {
        if (!j->msg_started) http_fmt_anthropic_start(j, o);
        if (!len) return;
        struct http_buf d = {0};
        http_buf_puts(&d, "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
                          "\"text_delta\",\"text\":");
        http_buf_json_str(&d, delta, len);
        http_buf_puts(&d, "}}");
        http_fmt_sse(o, "content_block_delta", &d);
        http_buf_dispose(&d);
        return;
    }
    int chat = j->route == HTTP_ROUTE_CHAT;
    const char *object = chat ? "chat.completion.chunk" : "text_completion";
    struct http_buf d = {0};
    if (chat && !c->sent_first) openai_first_chunk(j, index);
    int echo = !chat && j->g.echo && !c->sent_first;
    int prompt_ids = !chat && j->g.return_ids && !c->sent_first;
    c->sent_first = 1;
    if (!len && !n_lps && !c->n_ids && !finished && !echo && !prompt_ids) {
        http_buf_dispose(&d);
        return;
    }
    openai_head(j, &d, object);
    http_buf_printf(&d, ",\"choices\":[{\"index\":%d,", index);
    if (chat) {
        http_buf_puts(&d, "\"delta\":{");
        if (len) {
            http_buf_puts(&d, "\"content\":");
            http_buf_json_str(&d, delta, len);
        }
        http_buf_puts(&d, "},\"logprobs\":");
        if (j->g.logprobs && n_lps)
            chat_logprobs(&d, j, lps, n_lps);
        else
            http_buf_puts(&d, "null");
    } else {
        struct http_buf text = {0};
        http_buf_append(&text, "", 0);
        if (echo) http_buf_puts(&text, j->g.prompt_text[c->prompt]);
        http_buf_append(&text, delta, len);
        http_buf_puts(&d, "\"text\":");
        http_buf_json_str(&d, text.p, text.len);
        http_buf_dispose(&text);
        http_buf_puts(&d, ",\"logprobs\":");
        if (j->g.logprobs && (n_lps || echo))
            completion_logprobs(&d, j, echo ? c->plps : NULL, echo ? c->n_plps : 0, lps, n_lps,
                                &c->text_pos);
        else
            http_buf_puts(&d, "null");
    }
    if (finished)
        http_buf_printf(&d, ",\"finish_reason\":\"%s\"", openai_finish(c));
    else
        http_buf_puts(&d, ",\"finish_reason\":null");
    if (prompt_ids) put_prompt_ids(&d, j, c);
    if (j->g.return_ids) put_ids(&d, "token_ids", c->ids, c->n_ids);
    http_buf_puts(&d, "}]");
    if (j->g.include_usage) http_buf_puts(&d, ",\"usage\":null");
    http_buf_puts(&d, "}");
    http_fmt_sse(o, NULL, &d);
    http_buf_dispose(&d);
}

void http_fmt_stream_tail(struct http_job *j, struct http_buf *o)
{
    struct http_buf d = {0};
    if (j->route == HTTP_ROUTE_MESSAGES) {
        if (j->failed_status) {
            char *e = http_error_anthropic(&j->err);
            http_buf_puts(&d, e);
            free(e);
            http_fmt_sse(o, "error", &d);
            http_buf_dispose(&d);
            return;
        }
        if (!j->msg_started) http_fmt_anthropic_start(j, o);
        if (j->c[0].out) {
            http_out_anthropic_close(j); /* o is j->out */
        } else {
            http_buf_puts(&d, "{\"type\":\"content_block_stop\",\"index\":0}");
            http_fmt_sse(o, "content_block_stop", &d);
            d.len = 0;
        }
        http_buf_puts(&d, "{\"type\":\"message_delta\",\"delta\":{");
        anthropic_stop(j, &d);
        http_buf_printf(&d, "},\"usage\":{\"output_tokens\":%ld}}", usage_of(j).output);
        http_fmt_sse(o, "message_delta", &d);
        d.len = 0;
        http_buf_puts(&d, "{\"type\":\"message_stop\"}");
        http_fmt_sse(o, "message_stop", &d);
        http_buf_dispose(&d);
        return;
    }
    if (j->failed_status) {
        char *e = http_error_openai(&j->err);
        http_buf_puts(&d, e);
        free(e);
        http_fmt_sse(o, NULL, &d);
        d.len = 0;
    } else if (j->g.include_usage) {
        openai_head(j, &d,
                    j->route == HTTP_ROUTE_CHAT ? "chat.completion.chunk" : "text_completion");
        http_buf_puts(&d, ",\"choices\":[],");
        openai_usage(j, &d);
        http_buf_puts(&d, "}");
        http_fmt_sse(o, NULL, &d);
        d.len = 0;
    }
    http_buf_puts(o, "data: [DONE]\n\n");
    http_buf_dispose(&d);
}
