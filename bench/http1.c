/* HTTP/1.1 response parser: see http1.h. */
#include "bench/http1.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void h1_resp_init(struct h1_resp *r, h1_body_fn on_body, void *ctx)
{
    memset(r, 0, sizeof *r);
    r->state = H1_HEAD;
    r->content_length = -1;
    r->on_body = on_body;
    r->ctx = ctx;
}

static ssize_t fail(struct h1_resp *r, const char *msg)
{
    snprintf(r->error, sizeof r->error, "%s", msg);
    r->state = H1_ERROR;
    return -1;
}

/* Case-insensitive search for a comma-separated token in a header value. */
static int has_token(const char *v, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
        size_t s = i;
        while (i < n && v[i] != ',') i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
        if (e - s == tl && !strncasecmp(v + s, tok, tl)) return 1;
    }
    return 0;
}

/* Parses the complete head in r->head (ending with the blank line). */
static ssize_t parse_head(struct h1_resp *r)
{
    char *p = r->head, *end = r->head + r->head_len;
    char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol || end - p < 12 || memcmp(p, "HTTP/1.", 7) || p[8] != ' ')
        return fail(r, "malformed status line");
    int minor = p[7] - '0';
    if (!isdigit((unsigned char)p[9]) || !isdigit((unsigned char)p[10]) ||
        !isdigit((unsigned char)p[11]))
        return fail(r, "malformed status code");
    r->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    r->keep_alive = minor >= 1;
    int chunked = 0;
    p = eol + 1;
    while (p < end) {
        eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) break;
        char *le = eol;
        if (le > p && le[-1] == '\r') le--;
        if (le == p) break; /* the blank line */
        char *colon = memchr(p, ':', (size_t)(le - p));
        if (!colon || colon == p) return fail(r, "malformed header line");
        size_t nlen = (size_t)(colon - p);
        char *v = colon + 1;
        while (v < le && (*v == ' ' || *v == '\t')) v++;
        size_t vlen = (size_t)(le - v);
        while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t')) vlen--;
        if (nlen == 14 && !strncasecmp(p, "content-length", 14)) {
            if (!vlen) return fail(r, "empty Content-Length");
            int64_t cl = 0;
            for (size_t i = 0; i < vlen; i++) {
                if (!isdigit((unsigned char)v[i]) || cl > (INT64_MAX - 9) / 10)
                    return fail(r, "bad Content-Length");
                cl = cl * 10 + (v[i] - '0');
            }
            if (r->content_length >= 0 && r->content_length != cl)
                return fail(r, "conflicting Content-Length headers");
            r->content_length = cl;
        } else if (nlen == 17 && !strncasecmp(p, "transfer-encoding", 17)) {
            if (!has_token(v, vlen, "chunked")) return fail(r, "unsupported Transfer-Encoding");
            chunked = 1;
        } else if (nlen == 10 && !strncasecmp(p, "connection", 10)) {
            if (has_token(v, vlen, "close")) r->keep_alive = 0;
            if (has_token(v, vlen, "keep-alive")) r->keep_alive = 1;
        } else if (nlen == 12 && !strncasecmp(p, "content-type", 12)) {
            size_t k = vlen < sizeof r->content_type - 1 ? vlen : sizeof r->content_type - 1;
            memcpy(r->content_type, v, k);
            r->content_type[k] = 0;
        }
        p = eol + 1;
    }
    if (r->head_request || r->status == 204 || r->status == 304) {
        r->state = H1_DONE;
    } else if (chunked) {
        r->content_length = -1;
        r->state = H1_CHUNK_SIZE;
    } else if (r->content_length >= 0) {
        r->left = (uint64_t)r->content_length;
        r->state = r->left ? H1_BODY_LEN : H1_DONE;
    } else {
        r->keep_alive = 0;
        r->state = H1_BODY_CLOSE;
    }
    return 0;
}

/* Appends to r->line up to LF; returns 1 when a whole line is there (CR/LF stripped). */
static int take_line(struct h1_resp *r, const char *buf, size_t n, size_t *i, int *err)
{
    while (*i < n) {
        char c = buf[(*i)++];
        if (c == '\n') {
            if (r->line_len && r->line[r->line_len - 1] == '\r') r->line_len--;
            r->line[r->line_len] = 0;
            return 1;
        }
        if (r->line_len + 1 >= sizeof r->line) {
            *err = 1;
            return 0;
        }
        r->line[r->line_len++] = c;
    }
    return 0;
}

static int deliver(struct h1_resp *r, const char *d, size_t n)
{
    return n && r->on_body ? r->on_body(r->ctx, d, n) : 0;
}

ssize_t h1_resp_feed(struct h1_resp *r, const char *buf, size_t n)
{
    size_t i = 0;
    while (i < n && r->state != H1_DONE) {
        int lerr = 0;
        switch (r->state) {
        case H1_HEAD: {
            /* copy byte by byte until the blank line: heads are small */
            while (i < n) {
                if (r->head_len + 1 >= sizeof r->head) return fail(r, "response head too large");
                char c = buf[i++];
                r->head[r->head_len++] = c;
                size_t h = r->head_len;
                if (c == '\n' && ((h >= 2 && r->head[h - 2] == '\n') ||
                                  (h >= 3 && r->head[h - 2] == '\r' && r->head[h - 3] == '\n'))) {
                    r->head[h] = 0;
                    if (parse_head(r) < 0) return -1;
                    if (r->status >= 100 && r->status < 200) { /* interim: parse the next head */
                        r->head_len = 0;
                        r->state = H1_HEAD;
                        r->content_length = -1;
                    }
                    break;
                }
            }
            break;
        }
        case H1_BODY_LEN: {
            size_t k = n - i < r->left ? n - i : (size_t)r->left;
            if (deliver(r, buf + i, k)) return fail(r, "aborted");
            i += k;
            r->left -= k;
            if (!r->left) r->state = H1_DONE;
            break;
        }
        case H1_CHUNK_SIZE:
            if (!take_line(r, buf, n, &i, &lerr)) {
                if (lerr) return fail(r, "chunk-size line too long");
                break;
            }
            {
                char *e;
                errno = 0;
                if (!isxdigit((unsigned char)r->line[0])) return fail(r, "bad chunk size");
                unsigned long long sz = strtoull(r->line, &e, 16);
                if (errno || (*e && *e != ';' && *e != ' ' && *e != '\t'))
                    return fail(r, "bad chunk size");
                r->line_len = 0;
                r->left = sz;
                r->state = sz ? H1_CHUNK_DATA : H1_TRAILERS;
            }
            break;
        case H1_CHUNK_DATA: {
            size_t k = n - i < r->left ? n - i : (size_t)r->left;
            if (deliver(r, buf + i, k)) return fail(r, "aborted");
            i += k;
            r->left -= k;
            if (!r->left) r->state = H1_CHUNK_END;
            break;
        }
        case H1_CHUNK_END:
            if (!take_line(r, buf, n, &i, &lerr)) {
                if (lerr) return fail(r, "missing CRLF after chunk");
                break;
            }
            if (r->line_len) return fail(r, "missing CRLF after chunk");
            r->state = H1_CHUNK_SIZE;
            break;
        case H1_TRAILERS:
            if (!take_line(r, buf, n, &i, &lerr)) {
                if (lerr) return fail(r, "trailer line too long");
                break;
            }
            if (!r->line_len) r->state = H1_DONE;
            r->line_len = 0;
            break;
        case H1_BODY_CLOSE:
            if (deliver(r, buf + i, n - i)) return fail(r, "aborted");
            i = n;
            break;
        default:
            return fail(r, "parser used after an error");
        }
    }
    return (ssize_t)i;
}

int h1_resp_eof(struct h1_resp *r)
{
    if (r->state == H1_BODY_CLOSE) r->state = H1_DONE;
    if (r->state == H1_DONE) return 0;
    if (r->state != H1_ERROR) fail(r, "connection closed before the response ended");
    return -1;
}
