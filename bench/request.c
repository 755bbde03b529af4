/* One benchmark request: see request.h. */
#include "bench/request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

char *request_body(const struct req_opts *o, const struct prompt *p)
{
    cJSON *b = cJSON_CreateObject();
    if (o->model) cJSON_AddStringToObject(b, "model", o->model);
    if (o->chat) {
        cJSON *msgs = cJSON_AddArrayToObject(b, "messages");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", p->text ? p->text : "");
        cJSON_AddItemToArray(msgs, m);
    } else if (p->text) {
        cJSON_AddStringToObject(b, "prompt", p->text);
    } else {
        cJSON_AddItemToObject(b, "prompt", cJSON_CreateIntArray(p->ids, p->n_ids));
    }
    cJSON_AddNumberToObject(b, "max_tokens", p->output_len);
    if (o->temperature >= 0) cJSON_AddNumberToObject(b, "temperature", o->temperature);
    if (o->ignore_eos) cJSON_AddTrueToObject(b, "ignore_eos");
    cJSON_AddTrueToObject(b, "stream");
    cJSON *so = cJSON_AddObjectToObject(b, "stream_options");
    cJSON_AddTrueToObject(so, "include_usage");
    if (o->extra)
        for (const cJSON *it = o->extra->child; it; it = it->next) {
            cJSON_DeleteItemFromObjectCaseSensitive(b, it->string);
            cJSON_AddItemToObject(b, it->string, cJSON_Duplicate(it, 1));
        }
    char *s = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    return s;
}

void breq_init(struct breq *b, struct req_result *res, double t_run0, breq_done_fn done,
               void *owner)
{
    memset(b, 0, sizeof *b);
    memset(res, 0, sizeof *res);
    res->input_len = -1;
    res->prompt_tokens = res->completion_tokens = res->cached_tokens = -1;
    res->ttft = -1;
    b->res = res;
    b->t_run0 = t_run0;
    b->done = done;
    b->owner = owner;
    sse_init(&b->sse, breq_on_event, b);
}

void breq_dispose(struct breq *b)
{
    sse_dispose(&b->sse);
    free(b->errbody);
    free(b->stream_error);
    b->errbody = b->stream_error = NULL;
}

static void add_chunk(struct breq *b, double now)
{
    struct req_result *r = b->res;
    if (r->ttft < 0) r->ttft = now - b->t_send;
    if (r->n_chunk_t == r->cap_chunk_t) {
        r->cap_chunk_t = r->cap_chunk_t ? r->cap_chunk_t * 2 : 64;
        r->chunk_t = xrealloc(r->chunk_t, sizeof *r->chunk_t * (size_t)r->cap_chunk_t);
    }
    r->chunk_t[r->n_chunk_t++] = now - b->t_run0;
    r->chunks++;
    if (b->chunk_counter) (*b->chunk_counter)++;
}

static int nonempty_string(const cJSON *j)
{
    return cJSON_IsString(j) && j->valuestring[0];
}

/* Servers without a tokenizer (vLLM's and pagoda's --skip-tokenizer-init) send "" as text and
 * the chunk's tokens as "token_ids": such a chunk is content too. */
static int nonempty_ids(const cJSON *j)
{
    return cJSON_IsArray(j) && cJSON_GetArraySize(j) > 0;
}

int breq_on_event(void *ctx, const char *event, const char *data, size_t len)
{
    struct breq *b = ctx;
    struct req_result *r = b->res;
    double now = util_now();
    (void)event;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        r->done_seen = 1;
        return 0;
    }
    cJSON *j = cJSON_ParseWithLength(data, len);
    if (!j) {
        if (!b->stream_error) b->stream_error = xstrdup("malformed JSON in the event stream");
        return 1;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (err && !cJSON_IsNull(err)) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
        char buf[512];
        snprintf(buf, sizeof buf, "error event: %s",
                 cJSON_IsString(msg)   ? msg->valuestring
                 : cJSON_IsString(err) ? err->valuestring
                                       : "(no message)");
        if (!b->stream_error) b->stream_error = xstrdup(buf);
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
    const cJSON *c0 = cJSON_GetArrayItem(choices, 0);
    if (c0) {
        const cJSON *delta = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        int content = nonempty_string(cJSON_GetObjectItemCaseSensitive(c0, "text")) ||
                      nonempty_ids(cJSON_GetObjectItemCaseSensitive(c0, "token_ids"));
        if (delta)
            content |=
                nonempty_string(cJSON_GetObjectItemCaseSensitive(delta, "content")) ||
                nonempty_string(cJSON_GetObjectItemCaseSensitive(delta, "reasoning_content")) ||
                nonempty_string(cJSON_GetObjectItemCaseSensitive(delta, "reasoning"));
        if (content) add_chunk(b, now);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c0, "token_ids"), *id;
        cJSON_ArrayForEach(id, ids)
        {
            if (!cJSON_IsNumber(id)) continue;
            if (r->n_out_ids == r->cap_out_ids) {
                r->cap_out_ids = r->cap_out_ids ? 2 * r->cap_out_ids : 64;
                r->out_ids = xrealloc(r->out_ids, sizeof *r->out_ids * (size_t)r->cap_out_ids);
            }
            r->out_ids[r->n_out_ids++] = (int32_t)id->valueint;
        }
        const cJSON *fr = cJSON_GetObjectItemCaseSensitive(c0, "finish_reason");
        if (cJSON_IsString(fr))
            snprintf(r->finish_reason, sizeof r->finish_reason, "%s", fr->valuestring);
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(usage)) {
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
        const cJSON *det = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
        const cJSON *cached = cJSON_GetObjectItemCaseSensitive(det, "cached_tokens");
        if (cJSON_IsNumber(pt)) r->prompt_tokens = pt->valueint;
        if (cJSON_IsNumber(ct)) r->completion_tokens = ct->valueint;
        if (cJSON_IsNumber(cached)) r->cached_tokens = cached->valueint;
    }
    cJSON_Delete(j);
    return 0;
}

static void on_head(void *ctx, int status)
{
    struct breq *b = ctx;
    b->res->status = status;
}

static int on_body(void *ctx, const char *d, size_t n)
{
    struct breq *b = ctx;
    if (b->res->status != 200) {
        size_t k = n;
        if (b->errlen + k > 4096) k = 4096 - b->errlen;
        if (k) {
            b->errbody = xrealloc(b->errbody, b->errlen + k + 1);
            memcpy(b->errbody + b->errlen, d, k);
            b->errlen += k;
            b->errbody[b->errlen] = 0;
        }
        return 0;
    }
    int rc = sse_feed(&b->sse, d, n);
    if (rc < 0 && !b->stream_error) b->stream_error = xstrdup("event stream line too long");
    return rc != 0;
}

/* "HTTP 400: <error.message>" from an OpenAI-shaped error body, else the body's start. */
static char *http_error(int status, const char *body)
{
    char buf[600];
    cJSON *j = body ? cJSON_Parse(body) : NULL;
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    if (!cJSON_IsString(msg)) msg = cJSON_GetObjectItemCaseSensitive(j, "message");
    if (cJSON_IsString(msg))
        snprintf(buf, sizeof buf, "HTTP %d: %s", status, msg->valuestring);
    else if (cJSON_IsString(err))
        snprintf(buf, sizeof buf, "HTTP %d: %s", status, err->valuestring);
    else
        snprintf(buf, sizeof buf, "HTTP %d: %.200s", status, body ? body : "");
    cJSON_Delete(j);
    return xstrdup(buf);
}

static void on_done(void *ctx, int ok, const char *error)
{
    struct breq *b = ctx;
    struct req_result *r = b->res;
    r->e2e = util_now() - b->t_send;
    if (b->stream_error)
        r->error = xstrdup(b->stream_error);
    else if (!ok)
        r->error = xstrdup(error ? error : "failed");
    else if (r->status != 200)
        r->error = http_error(r->status, b->errbody);
    else if (sse_pending(&b->sse))
        r->error = xstrdup("the stream ended inside an event");
    else if (!r->done_seen) /* OpenAI-compatible streams end with it; without it, cut short */
        r->error = xstrdup("the stream ended without data: [DONE]");
    r->ok = r->error == NULL;
    b->h = NULL;
    b->done(b->owner, b);
}

const struct hc_callbacks breq_callbacks = {on_head, on_body, on_done};
