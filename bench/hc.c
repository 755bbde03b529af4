/* HTTP client core and the HTTP/1.1 half: see hc.h. HTTP/2 lives in hc_h2.c. */
#include "bench/hc.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench/hc_impl.h"
#include "common/util.h"

int hc_url_parse(const char *s, struct hc_url *u, struct err *e)
{
    memset(u, 0, sizeof *u);
    size_t skip = 0;
    if (!strncasecmp(s, "https://", 8)) {
        u->tls = 1;
        skip = 8;
    } else if (!strncasecmp(s, "http://", 7)) {
        skip = 7;
    } else {
        return err_set(e, "%s: the URL must start with http:// or https://", s);
    }
    const char *h = s + skip, *end = h + strcspn(h, "/?#");
    const char *colon = NULL;
    if (*h == '[') { /* [IPv6]:port */
        const char *rb = memchr(h, ']', (size_t)(end - h));
        if (!rb) return err_set(e, "%s: unterminated [IPv6] address", s);
        if ((size_t)(rb - h - 1) >= sizeof u->host) return err_set(e, "%s: host too long", s);
        memcpy(u->host, h + 1, (size_t)(rb - h - 1));
        colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
        if (!colon && rb + 1 != end) return err_set(e, "%s: junk after the address", s);
    } else {
        colon = memchr(h, ':', (size_t)(end - h));
        const char *he = colon ? colon : end;
        if ((size_t)(he - h) >= sizeof u->host) return err_set(e, "%s: host too long", s);
        memcpy(u->host, h, (size_t)(he - h));
    }
    if (!u->host[0]) return err_set(e, "%s: no host", s);
    if (colon) {
        size_t pl = (size_t)(end - colon - 1);
        if (pl == 0 || pl >= sizeof u->port || strspn(colon + 1, "0123456789") < pl)
            return err_set(e, "%s: bad port", s);
        memcpy(u->port, colon + 1, pl);
        long port = strtol(u->port, NULL, 10);
        if (port < 1 || port > 65535) return err_set(e, "%s: port out of range", s);
    } else {
        strcpy(u->port, u->tls ? "443" : "80");
    }
    size_t pl = strcspn(end, "?#");
    while (pl && end[pl - 1] == '/') pl--;
    if (pl >= sizeof u->prefix) return err_set(e, "%s: path too long", s);
    memcpy(u->prefix, end, pl);
    return 0;
}

struct hc *hc_create(const struct hc_url *u, enum hc_proto proto, int connections,
                     const char *api_key, const struct hc_tls_opts *tls, struct err *e)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(u->host, u->port, &hints, &res);
    if (rc || !res) {
        err_set(e, "cannot resolve %s: %s", u->host, gai_strerror(rc));
        return NULL;
    }
    struct hc *c = xcalloc(1, sizeof *c);
    c->url = *u;
    c->proto = proto;
    memcpy(&c->addr, res->ai_addr, res->ai_addrlen);
    c->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    int v6 = strchr(u->host, ':') != NULL;
    snprintf(c->authority, sizeof c->authority, "%s%s%s:%s", v6 ? "[" : "", u->host, v6 ? "]" : "",
             u->port);
    if (api_key) {
        size_t n = strlen(api_key) + 8;
        c->auth_header = xmalloc(n);
        snprintf(c->auth_header, n, "Bearer %s", api_key);
    }
    c->n_h2 = connections < 1 ? 1 : connections;
    c->h2_conns = xcalloc((size_t)c->n_h2, sizeof *c->h2_conns);
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (c->epfd < 0) {
        err_set(e, "epoll_create1: %s", strerror(errno));
        hc_destroy(c);
        return NULL;
    }
    if (u->tls && hc_tls_init(c, tls, e)) {
        hc_destroy(c);
        return NULL;
    }
    return c;
}

static void free_conn(struct hc_conn *k)
{
    if (k->sess) nghttp2_session_del(k->sess);
    hc_tls_conn_free(k);
    free(k->out);
    free(k);
}

/* Frees the connections closed since the last sweep (they may still be named by events of the
 * current epoll batch, so closing only marks them). */
static void sweep(struct hc *c)
{
    struct hc_conn **pp = &c->conns;
    while (*pp) {
        struct hc_conn *k = *pp;
        if (k->dead) {
            *pp = k->next;
            free_conn(k);
        } else {
            pp = &k->next;
        }
    }
}

void hc_destroy(struct hc *c)
{
    if (!c) return;
    for (struct hc_conn *k = c->conns; k; k = k->next) hc_conn_close(k, "client closed");
    sweep(c);
    if (c->epfd >= 0) close(c->epfd);
    hc_tls_free(c);
    free(c->h2_conns);
    free(c->auth_header);
    free(c);
}

void hc_req_release(struct hc_req *r)
{
    if (r->h2_open || r->c->submitting == r) return;
    free(r->path);
    free(r->body);
    free(r);
}

void hc_req_finish(struct hc_req *r, int ok, const char *error)
{
    if (r->done) return;
    r->done = 1;
    r->c->active--;
    r->cb.on_done(r->ctx, ok, ok ? NULL : error ? error : "failed");
    hc_req_release(r);
}

void hc_conn_want_write(struct hc_conn *k, int on)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0), .data.ptr = k};
    epoll_ctl(k->c->epfd, EPOLL_CTL_MOD, k->fd, &ev);
}

void hc_out_append(struct hc_conn *k, const char *d, size_t n)
{
    if (k->out_off == k->out_len) k->out_off = k->out_len = 0;
    if (k->out_len + n > k->out_cap) {
        size_t cap = k->out_cap ? k->out_cap : 4096;
        while (cap < k->out_len + n) cap *= 2;
        k->out = xrealloc(k->out, cap);
        k->out_cap = cap;
    }
    memcpy(k->out + k->out_len, d, n);
    k->out_len += n;
}

struct hc_conn *hc_conn_open(struct hc *c, int h2, struct err *e)
{
    int fd = socket(c->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        err_set(e, "socket: %s", strerror(errno));
        return NULL;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = connect(fd, (struct sockaddr *)&c->addr, c->addrlen);
    if (rc < 0 && errno != EINPROGRESS) {
        err_set(e, "connect to %s: %s", c->authority, strerror(errno));
        close(fd);
        return NULL;
    }
    struct hc_conn *k = xcalloc(1, sizeof *k);
    k->c = c;
    k->fd = fd;
    k->h2 = h2;
    k->tcp_up = rc == 0;
    k->connected = k->tcp_up && !c->tls;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT, .data.ptr = k};
    if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        err_set(e, "epoll_ctl: %s", strerror(errno));
        close(fd);
        free(k);
        return NULL;
    }
    k->next = c->conns;
    c->conns = k;
    if (c->tls && hc_tls_attach(k, e) < 0) {
        hc_conn_close(k, e->msg);
        return NULL;
    }
    if (h2 && hc_h2_start(k, e) < 0) {
        hc_conn_close(k, e->msg);
        return NULL;
    }
    return k;
}

void hc_conn_close(struct hc_conn *k, const char *why)
{
    if (k->dead) return;
    k->dead = 1;
    epoll_ctl(k->c->epfd, EPOLL_CTL_DEL, k->fd, NULL);
    close(k->fd);
    for (int i = 0; i < k->c->n_h2; i++)
        if (k->c->h2_conns[i] == k) k->c->h2_conns[i] = NULL;
    if (k->h2) hc_h2_fail_all(k, why);
    if (k->req) {
        struct hc_req *r = k->req;
        k->req = NULL;
        r->conn = NULL;
        hc_req_finish(r, 0, why);
    }
}

static void conn_failed(struct hc_conn *k, const char *why)
{
    if (k->h2)
        hc_conn_close(k, why);
    else
        hc_h1_conn_failed(k, why);
}

int hc_conn_flush(struct hc_conn *k)
{
    if (!k->connected) return 0;
    while (k->out_off < k->out_len) {
        ssize_t w = hc_io_write(k, k->out + k->out_off, k->out_len - k->out_off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            char why[160];
            snprintf(why, sizeof why, "send: %s", strerror(errno));
            conn_failed(k, why);
            return -1;
        }
        k->out_off += (size_t)w;
    }
    int more = k->out_off < k->out_len || (k->sess && nghttp2_session_want_write(k->sess));
    hc_conn_want_write(k, more);
    return 0;
}

/* Starts r on a connection; r may finish (fail) before this returns. */
static void start(struct hc *c, struct hc_req *r)
{
    struct err e = {{0}};
    if (c->proto == HC_HTTP1) {
        struct hc_conn *k = NULL;
        for (struct hc_conn *it = c->conns; it; it = it->next)
            if (!it->dead && !it->h2 && !it->req && it->connected) {
                k = it;
                break;
            }
        if (!k) {
            k = hc_conn_open(c, 0, &e);
            r->fresh_conn = 1;
        }
        if (!k) {
            hc_req_finish(r, 0, e.msg);
            return;
        }
        hc_h1_send(k, r);
        return;
    }
    int slot = c->h2_next++ % c->n_h2;
    struct hc_conn *k = c->h2_conns[slot];
    if (!k) {
        k = hc_conn_open(c, 1, &e);
        if (!k) {
            hc_req_finish(r, 0, e.msg);
            return;
        }
        c->h2_conns[slot] = k;
    }
    hc_h2_submit(k, r);
}

struct hc_req *hc_submit(struct hc *c, const char *method, const char *path, const char *body,
                         size_t body_len, const struct hc_callbacks *cb, void *ctx)
{
    struct hc_req *r = xcalloc(1, sizeof *r);
    r->c = c;
    snprintf(r->method, sizeof r->method, "%s", method);
    size_t pl = strlen(c->url.prefix) + strlen(path) + 1;
    r->path = xmalloc(pl);
    snprintf(r->path, pl, "%s%s", c->url.prefix, path);
    if (body) {
        r->body = xmalloc(body_len + 1);
        memcpy(r->body, body, body_len);
        r->body_len = body_len;
    }
    r->cb = *cb;
    r->ctx = ctx;
    c->active++;
    /* A request can fail inside start() (connection refused, a send error with no way to
     * retry): its memory is then kept until here, so that NULL can be returned safely. */
    c->submitting = r;
    start(c, r);
    c->submitting = NULL;
    if (r->done) {
        hc_req_release(r);
        return NULL;
    }
    return r;
}

void hc_cancel(struct hc *c, struct hc_req *r, const char *reason)
{
    (void)c;
    if (r->done) return;
    if (r->conn && r->conn->h2) {
        hc_h2_cancel(r, reason);
        return;
    }
    struct hc_conn *k = r->conn;
    if (k) {
        k->req = NULL;
        r->conn = NULL;
        hc_conn_close(k, reason);
    }
    hc_req_finish(r, 0, reason);
}

static void h2_readable(struct hc_conn *k);

/* Drives the connect and the TLS handshake; returns 1 once the connection is ready. */
static int establish(struct hc_conn *k)
{
    if (!k->tcp_up) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            char why[512];
            snprintf(why, sizeof why, "connect to %s: %s", k->c->authority, strerror(err));
            hc_conn_close(k, why); /* a refused connection is a real failure: no retry */
            return 0;
        }
        k->tcp_up = 1;
        k->connected = !k->ssl;
    }
    if (!k->connected) {
        char why[512];
        int rc = hc_tls_handshake(k, why, sizeof why);
        if (rc < 0) {
            hc_conn_close(k, why);
            return 0;
        }
        if (rc == 0) {
            hc_conn_want_write(k, k->tls_want_write);
            return 0;
        }
        k->connected = 1;
    }
    return 1;
}

static void writable(struct hc_conn *k)
{
    if (!k->connected && !establish(k)) return;
    if (k->h2)
        hc_h2_send(k);
    else
        hc_conn_flush(k);
}

static void h2_readable(struct hc_conn *k)
{
    char buf[65536];
    for (;;) {
        ssize_t n = hc_io_read(k, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            char why[160];
            snprintf(why, sizeof why, "recv: %s", errno == EPROTO ? "TLS error" : strerror(errno));
            hc_conn_close(k, why);
            return;
        }
        if (n == 0) {
            hc_conn_close(k, "connection closed by the server");
            return;
        }
        if (hc_h2_recv(k, buf, (size_t)n) < 0) return;
    }
    hc_h2_send(k);
}

int hc_poll(struct hc *c, int timeout_ms)
{
    struct epoll_event evs[256];
    int n = epoll_wait(c->epfd, evs, 256, timeout_ms);
    if (n < 0) {
        if (errno == EINTR) return 0;
        return -1;
    }
    for (int i = 0; i < n; i++) {
        struct hc_conn *k = evs[i].data.ptr;
        if (k->dead) continue;
        uint32_t ev = evs[i].events;
        if (!k->connected) {
            /* connecting or in the TLS handshake: any event moves it on (or reports the
             * error); once ready, what was queued goes out */
            if (establish(k)) writable(k);
            continue;
        }
        if (ev & EPOLLOUT) writable(k);
        if (k->dead) continue;
        if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
            if (k->h2)
                h2_readable(k);
            else
                hc_h1_readable(k);
        }
    }
    sweep(c);
    return n;
}

int hc_active(const struct hc *c)
{
    return c->active;
}

struct fetch {
    int done, ok, status;
    char *buf;
    size_t len, cap;
    char error[256];
};

static void fetch_head(void *ctx, int status)
{
    ((struct fetch *)ctx)->status = status;
}

static int fetch_body(void *ctx, const char *d, size_t n)
{
    struct fetch *f = ctx;
    if (f->len + n + 1 > f->cap) {
        f->cap = (f->len + n + 1) * 2;
        f->buf = xrealloc(f->buf, f->cap);
    }
    memcpy(f->buf + f->len, d, n);
    f->len += n;
    return f->len > (64u << 20); /* a metrics page or model list is never this big */
}

static void fetch_done(void *ctx, int ok, const char *error)
{
    struct fetch *f = ctx;
    f->done = 1;
    f->ok = ok;
    if (!ok) snprintf(f->error, sizeof f->error, "%s", error);
}

int hc_fetch(struct hc *c, const char *method, const char *path, const char *body, double timeout_s,
             int *status, char **resp, size_t *resp_len, struct err *e)
{
    struct fetch f = {0};
    static const struct hc_callbacks cb = {fetch_head, fetch_body, fetch_done};
    struct hc_req *r = hc_submit(c, method, path, body, body ? strlen(body) : 0, &cb, &f);
    double t_end = util_now() + timeout_s;
    while (r && !f.done) {
        double left = t_end - util_now();
        if (left <= 0) {
            hc_cancel(c, r, "timed out");
            break;
        }
        if (hc_poll(c, (int)(left * 1000) + 1) < 0) {
            hc_cancel(c, r, "epoll failed");
            break;
        }
    }
    if (!f.ok) {
        free(f.buf);
        return err_set(e, "%s %s%s: %s", method, c->authority, path, f.error);
    }
    if (!f.buf) f.buf = xmalloc(1);
    f.buf[f.len] = 0;
    *status = f.status;
    *resp = f.buf;
    if (resp_len) *resp_len = f.len;
    return 0;
}
