/* The load client's HTTP/1.1 response parser: framing by length, chunks and close, split at
 * every byte; interim responses; keep-alive rules; malformed responses rejected. And its URLs. */
#include <string.h>

#include "bench/hc.h"
#include "bench/http1.h"
#include "test_util.h"

struct body {
    char buf[4096];
    size_t len;
    int abort_at; /* abort once this many bytes arrived (0: never) */
};

static int on_body(void *ctx, const char *d, size_t n)
{
    struct body *b = ctx;
    if (b->len + n < sizeof b->buf) memcpy(b->buf + b->len, d, n);
    b->len += n;
    b->buf[b->len < sizeof b->buf ? b->len : sizeof b->buf - 1] = 0;
    return b->abort_at && (int)b->len >= b->abort_at;
}

/* Parses s split at every position; checks status, body, keep-alive and bytes used. */
static void every_split(const char *s, int status, const char *body, int keep_alive,
                        size_t used_total, int needs_eof)
{
    size_t len = strlen(s);
    for (size_t cut = 0; cut <= len; cut++) {
        static struct h1_resp r;
        struct body b = {0};
        h1_resp_init(&r, on_body, &b);
        ssize_t u1 = h1_resp_feed(&r, s, cut);
        CHECK(u1 >= 0, "cut %zu: %s", cut, r.error);
        ssize_t u2 = r.state == H1_DONE ? 0 : h1_resp_feed(&r, s + u1, len - (size_t)u1);
        CHECK(u2 >= 0, "cut %zu: %s", cut, r.error);
        if (needs_eof) CHECK(h1_resp_eof(&r) == 0, "cut %zu: eof", cut);
        CHECK(r.state == H1_DONE, "cut %zu: state %d", cut, r.state);
        CHECK(r.status == status, "cut %zu: status %d", cut, r.status);
        CHECK(!strcmp(b.buf, body), "cut %zu: body '%s'", cut, b.buf);
        CHECK(r.keep_alive == keep_alive, "cut %zu: keep-alive %d", cut, r.keep_alive);
        CHECK((size_t)(u1 + u2) == used_total, "cut %zu: used %zd", cut, u1 + u2);
    }
}

static void test_framing(void)
{
    const char *cl =
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello";
    every_split(cl, 200, "hello", 1, strlen(cl), 0);

    const char *chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                          "Content-Type: text/event-stream\r\n\r\n"
                          "6\r\ndata: \r\nA;ext=1\r\n{\"a\":123}\n\r\n0\r\nX-Trailer: 1\r\n\r\n";
    every_split(chunked, 200, "data: {\"a\":123}\n", 1, strlen(chunked), 0);

    /* bare LF line ends are accepted too */
    const char *lf = "HTTP/1.1 404 Not Found\nContent-Length: 2\n\nno";
    every_split(lf, 404, "no", 1, strlen(lf), 0);

    const char *close_delim = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil eof";
    every_split(close_delim, 200, "until eof", 0, strlen(close_delim), 1);

    const char *http10 = "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx";
    every_split(http10, 200, "x", 0, strlen(http10), 0);

    const char *interim =
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
    every_split(interim, 201, "", 1, strlen(interim), 0);

    /* a second response in the same read is left for the next parse */
    const char *two = "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n";
    every_split(two, 204, "", 1, strlen("HTTP/1.1 204 No Content\r\n\r\n"), 0);
}

static void expect_error(const char *s, const char *what)
{
    static struct h1_resp r;
    struct body b = {0};
    h1_resp_init(&r, on_body, &b);
    ssize_t u = h1_resp_feed(&r, s, strlen(s));
    CHECK(u == -1 && r.state == H1_ERROR, "%s: accepted (used %zd)", what, u);
    CHECK(r.error[0], "%s: no message", what);
}

static void test_errors(void)
{
    expect_error("HTTQ/1.1 200 OK\r\n\r\n", "bad protocol");
    expect_error("HTTP/1.1 2x0 OK\r\n\r\n", "bad status");
    expect_error("HTTP/1.1 200 OK\r\nContent-Length: 12a\r\n\r\n", "bad Content-Length");
    expect_error("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                 "conflicting lengths");
    expect_error("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unknown coding");
    expect_error("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size");
    expect_error("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
                 "chunk longer than its size");
    expect_error("HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "header without a colon");

    static struct h1_resp r;
    static char big[H1_MAX_HEAD + 100];
    memcpy(big, "HTTP/1.1 200 OK\r\nX: ", 20);
    memset(big + 20, 'a', sizeof big - 21);
    big[sizeof big - 1] = 0;
    expect_error(big, "oversized head");

    /* the connection closes mid-body */
    struct body b = {0};
    h1_resp_init(&r, on_body, &b);
    const char *cut = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
    CHECK(h1_resp_feed(&r, cut, strlen(cut)) == (ssize_t)strlen(cut), "partial body");
    CHECK(h1_resp_eof(&r) == -1 && r.error[0], "eof inside a Content-Length body is an error");

    /* a body callback can abort */
    struct body ab = {.abort_at = 2};
    h1_resp_init(&r, on_body, &ab);
    const char *s = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
    CHECK(h1_resp_feed(&r, s, strlen(s)) == -1 && !strcmp(r.error, "aborted"), "abort");
}

static void test_url(void)
{
    struct hc_url u;
    struct err e = {{0}};
    CHECK(hc_url_parse("http://127.0.0.1:8080", &u, &e) == 0 && !u.tls &&
              !strcmp(u.host, "127.0.0.1") && !strcmp(u.port, "8080") && !u.prefix[0],
          "plain: %s", e.msg);
    CHECK(hc_url_parse("https://api.example.com/v1/", &u, &e) == 0 && u.tls &&
              !strcmp(u.port, "443") && !strcmp(u.prefix, "/v1"),
          "https default port, prefix without the trailing slash");
    CHECK(hc_url_parse("HTTP://[::1]:9000/x?y", &u, &e) == 0 && !strcmp(u.host, "::1") &&
              !strcmp(u.port, "9000") && !strcmp(u.prefix, "/x"),
          "IPv6, query dropped");
    CHECK(hc_url_parse("http://h", &u, &e) == 0 && !strcmp(u.port, "80"), "default port 80");
    const char *bad[] = {"ftp://h",     "127.0.0.1:8080", "http://",
                         "http://h:0",  "http://h:70000", "http://h:8a",
                         "http://[::1", "http://[::1]x",  "http://h:"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e.msg[0] = 0;
        CHECK(hc_url_parse(bad[i], &u, &e) == -1 && e.msg[0], "accepted %s", bad[i]);
    }
}

int main(void)
{
    test_url();
    test_framing();
    test_errors();
    TEST_DONE();
}
