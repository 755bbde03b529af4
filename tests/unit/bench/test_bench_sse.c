/*
 * The load client's SSE parser and its handling of OpenAI stream chunks: events split
 * across reads at every byte, keep-alive comments, CRLF / CR / LF line ends, multi-line data,
 * the [DONE] sentinel, a BOM, and the limits.
 */
#include <stdlib.h>
#include <string.h>

#include "bench/request.h"
#include "bench/sse.h"
#include "common/util.h"
#include "test_util.h"

#define MAX_EV 16

struct rec {
    int n;
    char type[MAX_EV][64];
    char data[MAX_EV][256];
    size_t len[MAX_EV];
    int stop_after; /* stop the feed after this many events (0: never) */
};

static int on_event(void *ctx, const char *event, const char *data, size_t len)
{
    struct rec *r = ctx;
    if (r->n < MAX_EV) {
        snprintf(r->type[r->n], sizeof r->type[0], "%s", event);
        memcpy(r->data[r->n], data, len < 255 ? len : 255);
        r->data[r->n][len < 255 ? len : 255] = 0;
        r->len[r->n] = len;
    }
    r->n++;
    return r->stop_after && r->n >= r->stop_after ? 7 : 0;
}

/* Feeds s in two parts split at `cut`, then compares with the expected events. */
static void run_split(const char *s, size_t len, size_t cut, int n_exp, const char *const *types,
                      const char *const *datas, uint64_t comments)
{
    struct rec r = {0};
    struct sse_parser p;
    sse_init(&p, on_event, &r);
    CHECK(sse_feed(&p, s, cut) == 0, "cut %zu: first part", cut);
    CHECK(sse_feed(&p, s + cut, len - cut) == 0, "cut %zu: second part", cut);
    CHECK(r.n == n_exp, "cut %zu: %d events, expected %d", cut, r.n, n_exp);
    for (int i = 0; i < n_exp && i < r.n; i++) {
        CHECK(!strcmp(r.type[i], types[i]), "cut %zu event %d: type '%s', expected '%s'", cut, i,
              r.type[i], types[i]);
        CHECK(!strcmp(r.data[i], datas[i]), "cut %zu event %d: data '%s', expected '%s'", cut, i,
              r.data[i], datas[i]);
        CHECK(r.len[i] == strlen(datas[i]), "cut %zu event %d: length %zu", cut, i, r.len[i]);
    }
    CHECK(p.comments == comments, "cut %zu: %llu comments, expected %llu", cut,
          (unsigned long long)p.comments, (unsigned long long)comments);
    CHECK(!sse_pending(&p), "cut %zu: nothing should be pending", cut);
    sse_dispose(&p);
}

static void every_split(const char *s, int n_exp, const char *const *types,
                        const char *const *datas, uint64_t comments)
{
    size_t len = strlen(s);
    for (size_t cut = 0; cut <= len; cut++) run_split(s, len, cut, n_exp, types, datas, comments);
}

/* One byte per feed call, the worst case of a slow network. */
static void bytewise(const char *s, int n_exp, const char *const *datas)
{
    struct rec r = {0};
    struct sse_parser p;
    sse_init(&p, on_event, &r);
    for (size_t i = 0; s[i]; i++) CHECK(sse_feed(&p, s + i, 1) == 0, "byte %zu", i);
    CHECK(r.n == n_exp, "bytewise: %d events, expected %d", r.n, n_exp);
    for (int i = 0; i < n_exp && i < r.n; i++)
        CHECK(!strcmp(r.data[i], datas[i]), "bytewise event %d: '%s'", i, r.data[i]);
    sse_dispose(&p);
}

static void test_openai_stream(void)
{
    const char *s = ": keep-alive\n\n"
                    "data: {\"a\":1}\n\n"
                    ":ping\r\n"
                    "data: {\"b\":2}\r\n\r\n"
                    "data: [DONE]\n\n";
    const char *types[] = {"message", "message", "message"};
    const char *datas[] = {"{\"a\":1}", "{\"b\":2}", "[DONE]"};
    every_split(s, 3, types, datas, 2);
    bytewise(s, 3, datas);
}

static void test_multiline_and_fields(void)
{
    /* multi-line data joined with LF; an event type; id/retry ignored; no space after the
     * colon; an empty data line; CR alone as a line end */
    const char *s = "event: message_start\nid: 7\nretry: 100\ndata: line one\ndata:line two\n\n"
                    "data\r\rdata: x\rdata: y\r\r"
                    "event: ping\n\n"; /* no data: not dispatched, the type is reset */
    const char *types[] = {"message_start", "message", "message"};
    const char *datas[] = {"line one\nline two", "", "x\ny"};
    every_split(s, 3, types, datas, 0);
}

static void test_bom_and_space(void)
{
    const char *s = "\xEF\xBB\xBF"
                    "data:  two spaces\n\n";
    const char *types[] = {"message"};
    const char *datas[] = {" two spaces"}; /* only one leading space is removed */
    every_split(s, 1, types, datas, 0);
    /* bytes that only start like a BOM stay in the line: "\xEF" then "data..." is a field
     * named "\xEFdata", which is ignored */
    struct rec r = {0};
    struct sse_parser p;
    sse_init(&p, on_event, &r);
    CHECK(sse_feed(&p,
                   "\xEF"
                   "data: x\n\n",
                   10) == 0,
          "feed");
    CHECK(r.n == 0, "a field named \\xEFdata is not data: %d events", r.n);
    sse_dispose(&p);
}

static void test_stop_and_pending(void)
{
    struct rec r = {.stop_after = 1};
    struct sse_parser p;
    sse_init(&p, on_event, &r);
    CHECK(sse_feed(&p, "data: 1\n\ndata: 2\n\n", 18) == 7, "the callback's stop value returns");
    CHECK(r.n == 1, "%d events after a stop", r.n);
    sse_dispose(&p);

    struct rec r2 = {0};
    sse_init(&p, on_event, &r2);
    CHECK(sse_feed(&p, "data: cut", 9) == 0, "feed");
    CHECK(sse_pending(&p), "a partial line is pending");
    CHECK(sse_feed(&p, "\n", 1) == 0 && sse_pending(&p), "an undispatched event is pending");
    CHECK(r2.n == 0, "no event without the blank line");
    sse_dispose(&p);
}

static void test_line_limit(void)
{
    struct rec r = {0};
    struct sse_parser p;
    sse_init(&p, on_event, &r);
    size_t n = 1u << 20;
    char *big = xmalloc(n);
    memset(big, 'a', n);
    int rc = 0;
    for (int i = 0; i < 17 && rc == 0; i++) rc = sse_feed(&p, big, n);
    CHECK(rc == -1, "a line over SSE_MAX_LINE is an error (rc %d)", rc);
    free(big);
    sse_dispose(&p);
}

static void done_noop(void *owner, struct breq *b)
{
    (void)owner;
    (void)b;
}

/* OpenAI chunks through the request handler: content chunks, usage, [DONE], errors. */
static void test_stream_chunks(void)
{
    struct req_result res;
    struct breq b;
    breq_init(&b, &res, util_now(), done_noop, NULL);
    b.t_send = util_now();
    const char *s =
        "data: "
        "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Ro\"}}]}\n\n"
        ": keep-alive\n\n"
        "data: "
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"meo\"},\"finish_reason\":null}]}\n\n"
        "data: {\"choices\":[{\"index\":0,\"text\":\"!\",\"finish_reason\":\"length\"}]}\n\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,"
        "\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
        "data: [DONE]\n\n";
    size_t len = strlen(s);
    for (size_t i = 0; i < len; i += 7)
        CHECK(sse_feed(&b.sse, s + i, len - i < 7 ? len - i : 7) == 0, "feed at %zu", i);
    CHECK(res.chunks == 3, "%d content chunks (the empty role chunk is not one)", res.chunks);
    CHECK(res.n_chunk_t == 3, "%d chunk times", res.n_chunk_t);
    CHECK(res.ttft >= 0, "TTFT set");
    CHECK(res.prompt_tokens == 5 && res.completion_tokens == 3 && res.cached_tokens == 4,
          "usage %d %d %d", res.prompt_tokens, res.completion_tokens, res.cached_tokens);
    CHECK(res.done_seen, "[DONE] seen");
    CHECK(!strcmp(res.finish_reason, "length"), "finish reason '%s'", res.finish_reason);
    CHECK(!b.stream_error, "no stream error");
    CHECK(req_output_tokens(&res) == 3 && req_input_tokens(&res) == 5, "token counts");
    breq_dispose(&b);
    req_result_dispose(&res);

    breq_init(&b, &res, util_now(), done_noop, NULL);
    const char *err = "data: {\"error\":{\"message\":\"KV pool exhausted\",\"code\":500}}\n\n";
    sse_feed(&b.sse, err, strlen(err));
    CHECK(b.stream_error && strstr(b.stream_error, "KV pool exhausted"), "error event: %s",
          b.stream_error ? b.stream_error : "(none)");
    breq_dispose(&b);
    req_result_dispose(&res);

    breq_init(&b, &res, util_now(), done_noop, NULL);
    CHECK(sse_feed(&b.sse, "data: {oops\n\n", 13) == 1, "malformed JSON stops the stream");
    CHECK(b.stream_error != NULL, "and is reported");
    breq_dispose(&b);
    req_result_dispose(&res);
}

/* return_token_ids: the completion chunks' token_ids are collected in order (the
 * multi-turn benchmark appends them to the conversation). */
static void test_stream_token_ids(void)
{
    struct req_result res;
    struct breq b;
    breq_init(&b, &res, util_now(), done_noop, NULL);
    b.t_send = util_now();
    const char *s = "data: {\"choices\":[{\"index\":0,\"text\":\"ab\",\"token_ids\":[5,6]}]}\n\n"
                    "data: {\"choices\":[{\"index\":0,\"text\":\"c\",\"token_ids\":[7],"
                    "\"finish_reason\":\"length\"}]}\n\n"
                    "data: [DONE]\n\n";
    CHECK(sse_feed(&b.sse, s, strlen(s)) == 0, "feed");
    CHECK(res.n_out_ids == 3 && res.out_ids[0] == 5 && res.out_ids[1] == 6 && res.out_ids[2] == 7,
          "%d ids", res.n_out_ids);
    breq_dispose(&b);
    req_result_dispose(&res);
}

static void test_request_body(void)
{
    struct prompt p = {.ids = (int32_t[]){5, 6, 7}, .n_ids = 3, .input_len = 3, .output_len = 9};
    struct req_opts o = {.model = "m", .temperature = 0, .ignore_eos = 1};
    char *s = request_body(&o, &p);
    CHECK(
        !strcmp(s,
                "{\"model\":\"m\",\"prompt\":[5,6,7],\"max_tokens\":9,\"temperature\":0,"
                "\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}"),
        "completions body: %s", s);
    free(s);
    cJSON *extra = cJSON_Parse("{\"temperature\":0.5,\"top_k\":3}");
    struct prompt q = {.text = "hi \"there\"", .output_len = 4};
    struct req_opts oc = {.chat = 1, .model = "m", .temperature = -1, .extra = extra};
    s = request_body(&oc, &q);
    CHECK(!strcmp(s, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi "
                     "\\\"there\\\"\"}],\"max_tokens\":4,\"stream\":true,\"stream_options\":"
                     "{\"include_usage\":true},\"temperature\":0.5,\"top_k\":3}"),
          "chat body: %s", s);
    free(s);
    cJSON_Delete(extra);
}

int main(void)
{
    test_openai_stream();
    test_multiline_and_fields();
    test_bom_and_space();
    test_stop_and_pending();
    test_line_limit();
    test_stream_chunks();
    test_stream_token_ids();
    test_request_body();
    TEST_DONE();
}
