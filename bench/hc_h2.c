/* The HTTP/2 half of hc (h2c with prior knowledge) over libnghttp2. nghttp2 keeps a
 * request's stream user data until the stream closes, so a request cancelled earlier stays
 * allocated (done, callbacks no longer called) until on_stream_close releases it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/hc_impl.h"
#include "common/util.h"

static void link_stream(struct hc_conn *k, struct hc_req *r)
{
    r->prev = NULL;
    r->next = k->streams;
    if (k->streams) k->streams->prev = r;
    k->streams = r;
    r->h2_open = 1;
}

static void unlink_stream(struct hc_conn *k, struct hc_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else if (k->streams == r)
        k->streams = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    r->h2_open = 0;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
    (void)flags;
    (void)ud;
    if (f->hd.type != NGHTTP2_HEADERS) return 0;
    struct hc_req *r = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (!r || namelen != 7 || memcmp(name, ":status", 7)) return 0;
    int st = 0;
    for (size_t i = 0; i < valuelen && i < 3; i++) st = st * 10 + (value[i] - '0');
    r->status = st;
    return 0;
}

static int on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    (void)ud;
    if (f->hd.type != NGHTTP2_HEADERS) return 0;
    struct hc_req *r = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (!r || r->done || r->got_head || r->status < 200) return 0;
    r->got_head = 1;
    if (r->cb.on_head) r->cb.on_head(r->ctx, r->status);
    return 0;
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data, size_t len,
                   void *ud)
{
    (void)flags;
    (void)ud;
    struct hc_req *r = nghttp2_session_get_stream_user_data(s, sid);
    if (!r || r->done) return 0;
    r->bytes_in += len;
    if (r->cb.on_body && r->cb.on_body(r->ctx, (const char *)data, len))
        hc_h2_cancel(r, "cancelled by the response handler");
    return 0;
}

static int on_stream_close(nghttp2_session *s, int32_t sid, uint32_t code, void *ud)
{
    struct hc_conn *k = ud;
    struct hc_req *r = nghttp2_session_get_stream_user_data(s, sid);
    if (!r) return 0;
    nghttp2_session_set_stream_user_data(s, sid, NULL);
    unlink_stream(k, r);
    if (r->done) {
        hc_req_release(r);
        return 0;
    }
    if (code == NGHTTP2_NO_ERROR && r->got_head) {
        hc_req_finish(r, 1, NULL);
    } else {
        char why[160];
        snprintf(why, sizeof why, "HTTP/2 stream closed: %s", nghttp2_http2_strerror(code));
        hc_req_finish(r, 0, why);
    }
    return 0;
}

static ssize_t read_body(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len, uint32_t *flags,
                         nghttp2_data_source *src, void *ud)
{
    (void)s;
    (void)sid;
    (void)ud;
    struct hc_req *r = src->ptr;
    size_t k = r->body_len - r->body_sent;
    if (k > len) k = len;
    memcpy(buf, r->body + r->body_sent, k);
    r->body_sent += k;
    if (r->body_sent == r->body_len) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)k;
}

int hc_h2_start(struct hc_conn *k, struct err *e)
{
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs)) return err_set(e, "nghttp2: out of memory");
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    int rc = nghttp2_session_client_new(&k->sess, cbs, k);
    nghttp2_session_callbacks_del(cbs);
    if (rc) return err_set(e, "nghttp2_session_client_new: %s", nghttp2_strerror(rc));
    /* Large windows: a benchmark must never stall on flow control. */
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                   {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1u << 24}};
    nghttp2_submit_settings(k->sess, NGHTTP2_FLAG_NONE, iv, 2);
    nghttp2_session_set_local_window_size(k->sess, NGHTTP2_FLAG_NONE, 0, 1 << 30);
    return 0;
}

static void add_nv(nghttp2_nv *nv, int *n, const char *name, const char *value)
{
    nv[*n].name = (uint8_t *)name;
    nv[*n].namelen = strlen(name);
    nv[*n].value = (uint8_t *)value;
    nv[*n].valuelen = strlen(value);
    nv[*n].flags = NGHTTP2_NV_FLAG_NONE; /* nghttp2 copies both */
    (*n)++;
}

int hc_h2_submit(struct hc_conn *k, struct hc_req *r)
{
    nghttp2_nv nv[8];
    int n = 0;
    char clen[32];
    add_nv(nv, &n, ":method", r->method);
    add_nv(nv, &n, ":scheme", k->c->tls ? "https" : "http");
    add_nv(nv, &n, ":authority", k->c->authority);
    add_nv(nv, &n, ":path", r->path);
    add_nv(nv, &n, "user-agent", "pagoda-bench");
    if (r->body) {
        snprintf(clen, sizeof clen, "%zu", r->body_len);
        add_nv(nv, &n, "content-type", "application/json");
        add_nv(nv, &n, "content-length", clen);
    }
    if (k->c->auth_header) add_nv(nv, &n, "authorization", k->c->auth_header);
    nghttp2_data_provider prd = {.source.ptr = r, .read_callback = read_body};
    int32_t sid = nghttp2_submit_request(k->sess, NULL, nv, (size_t)n, r->body ? &prd : NULL, r);
    if (sid < 0) {
        char why[160];
        snprintf(why, sizeof why, "nghttp2_submit_request: %s", nghttp2_strerror(sid));
        hc_req_finish(r, 0, why);
        return -1;
    }
    r->stream_id = sid;
    r->conn = k;
    link_stream(k, r);
    if (!k->in_cb) hc_h2_send(k);
    return 0;
}

int hc_h2_recv(struct hc_conn *k, const char *d, size_t n)
{
    k->in_cb = 1;
    ssize_t rc = nghttp2_session_mem_recv(k->sess, (const uint8_t *)d, n);
    k->in_cb = 0;
    if (rc < 0) {
        char why[160];
        snprintf(why, sizeof why, "HTTP/2: %s", nghttp2_strerror((int)rc));
        hc_conn_close(k, why);
        return -1;
    }
    return 0;
}

int hc_h2_send(struct hc_conn *k)
{
    if (k->dead || !k->connected || k->in_cb) return 0;
    /* Keep at most ~1 MiB queued; the rest waits until the socket drains. */
    while (k->out_len - k->out_off < (1u << 20)) {
        const uint8_t *data;
        k->in_cb = 1;
        ssize_t n = nghttp2_session_mem_send(k->sess, &data);
        k->in_cb = 0;
        if (n < 0) {
            char why[160];
            snprintf(why, sizeof why, "HTTP/2: %s", nghttp2_strerror((int)n));
            hc_conn_close(k, why);
            return -1;
        }
        if (n == 0) break;
        hc_out_append(k, (const char *)data, (size_t)n);
    }
    if (hc_conn_flush(k) < 0) return -1;
    if (!nghttp2_session_want_read(k->sess) && !nghttp2_session_want_write(k->sess) &&
        k->out_off == k->out_len) {
        hc_conn_close(k, "HTTP/2 session ended (GOAWAY)");
        return -1;
    }
    return 0;
}

void hc_h2_fail_all(struct hc_conn *k, const char *why)
{
    while (k->streams) {
        struct hc_req *r = k->streams;
        if (k->sess) nghttp2_session_set_stream_user_data(k->sess, r->stream_id, NULL);
        unlink_stream(k, r);
        if (r->done)
            hc_req_release(r);
        else
            hc_req_finish(r, 0, why);
    }
}

void hc_h2_cancel(struct hc_req *r, const char *reason)
{
    struct hc_conn *k = r->conn;
    if (k && k->sess && !k->dead) {
        nghttp2_submit_rst_stream(k->sess, NGHTTP2_FLAG_NONE, r->stream_id, NGHTTP2_CANCEL);
        hc_req_finish(r, 0, reason); /* memory stays until on_stream_close */
        hc_h2_send(k);
        return;
    }
    hc_req_finish(r, 0, reason);
}
