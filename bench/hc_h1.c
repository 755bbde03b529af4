/* The HTTP/1.1 half of hc: one request per connection at a time, kept alive for the next. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "bench/hc_impl.h"

/* An HTTP/1.1 connection failed under r. A request that saw no response byte on a reused
 * connection is sent again on a new one (the server may have closed an idle keep-alive
 * connection just as it was reused); anything else fails. */
void hc_h1_conn_failed(struct hc_conn *k, const char *why)
{
    struct hc_req *r = k->req;
    k->req = NULL;
    hc_conn_close(k, why);
    if (!r) return;
    r->conn = NULL;
    if (!r->bytes_in && !r->fresh_conn) {
        struct err e = {{0}};
        struct hc_conn *nk = hc_conn_open(r->c, 0, &e);
        if (nk) {
            r->fresh_conn = 1;
            hc_h1_send(nk, r);
            return;
        }
        hc_req_finish(r, 0, e.msg);
        return;
    }
    hc_req_finish(r, 0, why);
}

static int h1_on_body(void *ctx, const char *d, size_t n)
{
    struct hc_req *r = ctx;
    if (!r->got_head) {
        r->got_head = 1;
        r->status = r->conn->resp.status;
        if (r->cb.on_head) r->cb.on_head(r->ctx, r->status);
    }
    return r->cb.on_body ? r->cb.on_body(r->ctx, d, n) : 0;
}

void hc_h1_send(struct hc_conn *k, struct hc_req *r)
{
    k->req = r;
    r->conn = k;
    r->bytes_in = 0;
    h1_resp_init(&k->resp, h1_on_body, r);
    k->resp.head_request = !strcmp(r->method, "HEAD");
    char head[2048];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: pagoda-bench\r\n"
                     "Accept: application/json, text/event-stream\r\n",
                     r->method, r->path, k->c->authority);
    if (r->body)
        n += snprintf(head + n, sizeof head - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", r->body_len);
    if (k->c->auth_header)
        n +=
            snprintf(head + n, sizeof head - (size_t)n, "Authorization: %s\r\n", k->c->auth_header);
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    hc_out_append(k, head, (size_t)n);
    if (r->body_len) hc_out_append(k, r->body, r->body_len);
    hc_conn_flush(k);
}

void hc_h1_readable(struct hc_conn *k)
{
    char buf[65536];
    for (;;) {
        ssize_t n = hc_io_read(k, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            char why[160];
            snprintf(why, sizeof why, "recv: %s", errno == EPROTO ? "TLS error" : strerror(errno));
            hc_h1_conn_failed(k, why);
            return;
        }
        if (n == 0) {
            struct hc_req *r = k->req;
            if (r && r->bytes_in && h1_resp_eof(&k->resp) == 0) {
                k->req = NULL;
                hc_conn_close(k, "closed");
                hc_req_finish(r, 1, NULL);
            } else {
                hc_h1_conn_failed(k, r && r->bytes_in ? k->resp.error
                                                      : "connection closed before any response");
            }
            return;
        }
        size_t off = 0;
        while (off < (size_t)n) {
            struct hc_req *r = k->req;
            if (!r) {
                hc_conn_close(k, "unexpected bytes on an idle connection");
                return;
            }
            r->bytes_in += (uint64_t)n - off;
            ssize_t used = h1_resp_feed(&k->resp, buf + off, (size_t)n - off);
            if (used < 0) {
                char why[200];
                snprintf(why, sizeof why, "HTTP/1.1 response: %s", k->resp.error);
                k->req = NULL;
                r->conn = NULL;
                hc_conn_close(k, why);
                hc_req_finish(r, 0, why);
                return;
            }
            off += (size_t)used;
            if (!r->got_head && k->resp.state != H1_HEAD) {
                r->got_head = 1;
                r->status = k->resp.status;
                if (r->cb.on_head) r->cb.on_head(r->ctx, r->status);
            }
            if (k->resp.state != H1_DONE) continue;
            int reuse = k->resp.keep_alive && off == (size_t)n;
            k->req = NULL;
            r->conn = NULL;
            if (!reuse) hc_conn_close(k, "closed");
            hc_req_finish(r, 1, NULL); /* may submit a new request on k */
            if (!reuse) return;
        }
    }
}
