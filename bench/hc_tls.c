/*
 * TLS for hc (OpenSSL): the client context, one SSL object per connection, the non-blocking
 * handshake with ALPN ("h2" or "http/1.1"), and the read/write calls every connection uses
 * (plain sockets go straight to recv/send). Peers are verified against the system's CAs or
 * --cacert, with the host name (or IP address) checked, unless --insecure.
 */
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "bench/hc_impl.h"

int hc_tls_init(struct hc *c, const struct hc_tls_opts *o, struct err *e)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) return err_set(e, "TLS: cannot create a context");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (o && o->insecure) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        int ok = o && o->cafile ? SSL_CTX_load_verify_locations(ctx, o->cafile, NULL)
                                : SSL_CTX_set_default_verify_paths(ctx);
        if (ok != 1) {
            SSL_CTX_free(ctx);
            return err_set(e, "TLS: cannot load the CA certificates%s%s",
                           o && o->cafile ? " of " : "", o && o->cafile ? o->cafile : "");
        }
    }
    c->tls = ctx;
    return 0;
}

void hc_tls_free(struct hc *c)
{
    if (c->tls) SSL_CTX_free(c->tls);
    c->tls = NULL;
}

int hc_tls_attach(struct hc_conn *k, struct err *e)
{
    struct hc *c = k->c;
    SSL *ssl = SSL_new(c->tls);
    if (!ssl) return err_set(e, "TLS: cannot create a session");
    SSL_set_fd(ssl, k->fd);
    SSL_set_connect_state(ssl);
    int is_ip =
        strchr(c->url.host, ':') || strspn(c->url.host, "0123456789.") == strlen(c->url.host);
    if (is_ip) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), c->url.host);
    } else {
        SSL_set_tlsext_host_name(ssl, c->url.host);
        SSL_set1_host(ssl, c->url.host);
    }
    static const unsigned char h2[] = "\x02h2", h1[] = "\x08http/1.1";
    if (k->h2)
        SSL_set_alpn_protos(ssl, h2, sizeof h2 - 1);
    else
        SSL_set_alpn_protos(ssl, h1, sizeof h1 - 1);
    k->ssl = ssl;
    return 0;
}

void hc_tls_conn_free(struct hc_conn *k)
{
    if (k->ssl) SSL_free(k->ssl);
    k->ssl = NULL;
}

int hc_tls_handshake(struct hc_conn *k, char *why, size_t n)
{
    ERR_clear_error();
    int rc = SSL_do_handshake(k->ssl);
    if (rc == 1) {
        const unsigned char *alpn = NULL;
        unsigned len = 0;
        SSL_get0_alpn_selected(k->ssl, &alpn, &len);
        if (k->h2 && !(len == 2 && !memcmp(alpn, "h2", 2))) {
            snprintf(why, n, "TLS: %s did not agree to HTTP/2 (ALPN)", k->c->authority);
            return -1;
        }
        return 1;
    }
    int err = SSL_get_error(k->ssl, rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        k->tls_want_write = err == SSL_ERROR_WANT_WRITE;
        return 0;
    }
    long vr = SSL_get_verify_result(k->ssl);
    if (vr != X509_V_OK) {
        snprintf(why, n, "TLS handshake with %s: certificate verification failed: %s%s",
                 k->c->authority, X509_verify_cert_error_string(vr),
                 " (--cacert FILE, or --insecure)");
    } else {
        char buf[256];
        unsigned long e = ERR_get_error();
        if (e)
            ERR_error_string_n(e, buf, sizeof buf);
        else
            snprintf(buf, sizeof buf, "%s", err == SSL_ERROR_SYSCALL ? strerror(errno) : "failed");
        snprintf(why, n, "TLS handshake with %s: %s", k->c->authority, buf);
    }
    return -1;
}

/* Maps an SSL result to the recv/send convention: -1 with errno EAGAIN when the call must
 * wait, 0 at a clean close, -1 with errno EPROTO on a TLS error. */
static ssize_t tls_result(struct hc_conn *k, int rc)
{
    if (rc > 0) return rc;
    int err = SSL_get_error(k->ssl, rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        errno = EAGAIN;
        return -1;
    }
    if (err == SSL_ERROR_ZERO_RETURN) return 0;
    if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
        if (errno == 0) return 0; /* the peer closed without close_notify */
        return -1;
    }
    errno = EPROTO;
    return -1;
}

ssize_t hc_io_read(struct hc_conn *k, char *buf, size_t n)
{
    if (!k->ssl) return recv(k->fd, buf, n, 0);
    ERR_clear_error();
    errno = 0;
    return tls_result(k, SSL_read(k->ssl, buf, n > 1u << 30 ? 1 << 30 : (int)n));
}

ssize_t hc_io_write(struct hc_conn *k, const char *buf, size_t n)
{
    if (!k->ssl) return send(k->fd, buf, n, MSG_NOSIGNAL);
    ERR_clear_error();
    errno = 0;
    return tls_result(k, SSL_write(k->ssl, buf, n > 1u << 30 ? 1 << 30 : (int)n));
}
