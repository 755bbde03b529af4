/*
 * libFuzzer target: the load client's response parsers (bench/http1.c, bench/sse.c) on
 * arbitrary bytes. Besides not crashing, both must not depend on how the bytes are split
 * across reads: parsing in two parts (cut where the first input byte says) must give the
 * same events, body, status and final state as parsing in one piece.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench/http1.c"
#include "bench/sse.c"

struct digest {
    uint64_t h;
    size_t n;
};

static void mix(struct digest *g, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) g->h = (g->h ^ b[i]) * 0x100000001B3ull;
    g->n++;
}

static int on_event(void *ctx, const char *event, const char *data, size_t len)
{
    struct digest *g = ctx;
    mix(g, event, strlen(event) + 1);
    mix(g, data, len);
    return 0;
}

static int on_body(void *ctx, const char *d, size_t n)
{
    struct digest *g = ctx;
    for (size_t i = 0; i < n; i++) mix(g, d + i, 1); /* byte-wise: independent of the runs */
    g->n -= n;
    return 0;
}

static void sse_run(const char *s, size_t n, size_t cut, struct digest *g, int *rc, int *pend)
{
    struct sse_parser p;
    sse_init(&p, on_event, g);
    *rc = sse_feed(&p, s, cut);
    if (*rc == 0) *rc = sse_feed(&p, s + cut, n - cut);
    *pend = sse_pending(&p);
    sse_dispose(&p);
}

static void h1_run(const char *s, size_t n, size_t cut, struct digest *g, struct h1_resp *r)
{
    h1_resp_init(r, on_body, g);
    size_t off = 0;
    size_t ends[2] = {cut, n};
    for (int k = 0; k < 2 && r->state != H1_ERROR && r->state != H1_DONE; k++) {
        ssize_t u = h1_resp_feed(r, s + off, ends[k] - off);
        if (u < 0) break;
        off += (size_t)u;
        if (r->state == H1_DONE) break;
    }
    if (r->state != H1_ERROR && r->state != H1_DONE) h1_resp_eof(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t n = size - 1;
    const char *s = (const char *)data + 1;
    size_t cut = n ? data[0] % (n + 1) : 0;

    struct digest a = {0xcbf29ce484222325ull, 0}, b = a;
    int rca, rcb, pa, pb;
    sse_run(s, n, n, &a, &rca, &pa);
    sse_run(s, n, cut, &b, &rcb, &pb);
    if (a.h != b.h || a.n != b.n || rca != rcb || pa != pb) abort();

    static struct h1_resp ra, rb;
    struct digest ga = {0xcbf29ce484222325ull, 0}, gb = ga;
    h1_run(s, n, n, &ga, &ra);
    h1_run(s, n, cut, &gb, &rb);
    if (ra.state != rb.state || ga.h != gb.h || ra.status != rb.status) abort();
    if (ra.state == H1_DONE && ra.keep_alive != rb.keep_alive) abort();
    return 0;
}
