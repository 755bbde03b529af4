/* hc internals shared by the core (hc.c), HTTP/1.1 (hc_h1.c) and HTTP/2 (hc_h2.c) parts. */
#ifndef PAGODA_BENCH_HC_IMPL_H
#define PAGODA_BENCH_HC_IMPL_H

#include <nghttp2/nghttp2.h>
#include <stdint.h>
#include <sys/socket.h>

#include "bench/hc.h"
#include "bench/http1.h"

struct hc_conn;

struct hc_req {
    struct hc *c;
    struct hc_conn *conn;
    char method[8];
    char *path;
    char *body;
    size_t body_len, body_sent; /* HTTP/2: bytes handed to nghttp2 */
    struct hc_callbacks cb;
    void *ctx;
    int status;
    int got_head;
    int fresh_conn;    /* HTTP/1.1: sent on a connection opened for it */
    uint64_t bytes_in; /* response bytes seen (0: a reused connection may be retried) */
    int32_t stream_id; /* HTTP/2 */
    int done;          /* on_done was called */
    int h2_open;       /* HTTP/2: nghttp2 still knows the stream (memory kept until closed) */
    struct hc_req *prev, *next; /* HTTP/2: the streams of a connection */
};

struct hc_conn {
    struct hc *c;
    int fd;
    int tcp_up;         /* the TCP connect completed */
    int connected;      /* ready for HTTP bytes: TCP up and, with TLS, the handshake done */
    struct ssl_st *ssl; /* TLS session, or NULL */
    int tls_want_write; /* the handshake waits for the socket to be writable */
    int h2;
    char *out; /* bytes to write */
    size_t out_len, out_off, out_cap;
    struct hc_req *req;     /* HTTP/1.1: the request on this connection */
    struct h1_resp resp;    /* HTTP/1.1 */
    nghttp2_session *sess;  /* HTTP/2 */
    struct hc_req *streams; /* HTTP/2: requests with an open stream */
    int in_cb;              /* HTTP/2: inside nghttp2 (no mem_send until it returns) */
    int dead;
    struct hc_conn *next; /* list of all connections */
};

struct hc {
    struct hc_url url;
    enum hc_proto proto;
    int epfd;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char authority[300];
    char *auth_header; /* "Bearer KEY" or NULL */
    struct hc_conn *conns;
    int n_h2, h2_next;
    struct hc_conn **h2_conns;
    int active;
    struct hc_req *submitting; /* the request inside hc_submit (not freed before it returns) */
    struct ssl_ctx_st *tls;    /* TLS context for https, or NULL */
};

struct hc_conn *hc_conn_open(struct hc *c, int h2, struct err *e);
void hc_conn_close(struct hc_conn *k, const char *why);
void hc_conn_want_write(struct hc_conn *k, int on);
void hc_out_append(struct hc_conn *k, const char *d, size_t n);
/** Writes what is queued; 0, or -1 when the connection failed (already closed). */
int hc_conn_flush(struct hc_conn *k);
void hc_req_finish(struct hc_req *r, int ok, const char *error);
/** Frees a finished request unless nghttp2 still holds its stream. */
void hc_req_release(struct hc_req *r);

/* TLS (hc_tls.c) and the socket calls every connection goes through. */
int hc_tls_init(struct hc *c, const struct hc_tls_opts *o, struct err *e);
void hc_tls_free(struct hc *c);
int hc_tls_attach(struct hc_conn *k, struct err *e);
void hc_tls_conn_free(struct hc_conn *k);
/** 1 when done, 0 while it waits for the socket, -1 with a message in why. */
int hc_tls_handshake(struct hc_conn *k, char *why, size_t n);
/** recv/send on the connection, through TLS when it has it (-1 + errno EAGAIN: wait). */
ssize_t hc_io_read(struct hc_conn *k, char *buf, size_t n);
ssize_t hc_io_write(struct hc_conn *k, const char *buf, size_t n);

/** HTTP/1.1: sends r on k (k becomes busy with it). */
void hc_h1_send(struct hc_conn *k, struct hc_req *r);
/** HTTP/1.1: k failed; its request is sent again on a new connection when it saw no response
 * byte on a reused one, else it fails. k is closed. */
void hc_h1_conn_failed(struct hc_conn *k, const char *why);
/** HTTP/1.1: reads what k has and feeds the response parser. */
void hc_h1_readable(struct hc_conn *k);

int hc_h2_start(struct hc_conn *k, struct err *e);
int hc_h2_submit(struct hc_conn *k, struct hc_req *r);
/** Feeds received bytes into the session; -1 on a protocol error (connection closed). */
int hc_h2_recv(struct hc_conn *k, const char *d, size_t n);
/** Moves session output into the out buffer and writes it; -1 when the connection failed. */
int hc_h2_send(struct hc_conn *k);
void hc_h2_fail_all(struct hc_conn *k, const char *why);
void hc_h2_cancel(struct hc_req *r, const char *reason);

#endif
