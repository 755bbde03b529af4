/*
 * Per-connection state of a loop: the generation requests each connection has in progress
 * (--max-streams-per-connection) and, for HTTP/2, how fast it resets streams. A client that
 * opens and resets streams faster than RESET_RATE a second over a burst of RESET_BURST
 * (CVE-2023-44487, "rapid reset"; nghttp2's bounds) gets GOAWAY with ENHANCE_YOUR_CALM and
 * its connection ends once its open streams have.
 *
 * The table is open addressing keyed by the connection's address, at most half full,
 * deleted by backward shift. An entry lives while its connection has requests in progress
 * or its reset bucket is not full again; the probe drops the rest every second. h2o does not
 * tell when a connection closes, so the GOAWAY, sent from a zero timeout after the reset that
 * crossed the bound, first looks the connection up among the loop's live HTTP/2 connections.
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/util.h"
#include "http/internal.h"

#include <h2o/http2.h>
#include <h2o/http2_internal.h> /* after h2o.h and http2.h, which it needs */

#define RESET_BURST 1000.0
#define RESET_RATE  33.0 /* resets a second, refilled */

struct conn_slot {
    const h2o_conn_t *conn;
    int n;         /* generation requests in progress */
    double tokens; /* resets left in the bucket */
    double t;      /* when tokens was last brought up to date */
    int calm;      /* over the bound: GOAWAY pending or sent */
};

static size_t home(const struct http_loop *l, const h2o_conn_t *c)
{
    return (size_t)(((uint64_t)(uintptr_t)c >> 4) * 0x9E3779B97F4A7C15ull >> 20) &
           (l->conns_cap - 1);
}

static size_t find(const struct http_loop *l, const h2o_conn_t *c)
{
    size_t i = home(l, c);
    while (l->conns[i].conn && l->conns[i].conn != c) i = (i + 1) & (l->conns_cap - 1);
    return i;
}

static void refill(struct conn_slot *e, double now)
{
    e->tokens += (now - e->t) * RESET_RATE;
    if (e->tokens > RESET_BURST) e->tokens = RESET_BURST;
    e->t = now;
}

static void remove_at(struct http_loop *l, size_t i)
{
    size_t mask = l->conns_cap - 1;
    for (size_t j = (i + 1) & mask; l->conns[j].conn; j = (j + 1) & mask) {
        size_t k = home(l, l->conns[j].conn);
        /* j's entry may move into the hole at i unless its home lies in (i, j] */
        int stays = i <= j ? (k > i && k <= j) : (k > i || k <= j);
        if (stays) continue;
        l->conns[i] = l->conns[j];
        i = j;
    }
    l->conns[i].conn = NULL;
    l->conns_used--;
}

int http_conn_streams(struct http_loop *l, const h2o_conn_t *conn)
{
    if (!l->conns_cap) return 0;
    size_t i = find(l, conn);
    return l->conns[i].conn ? l->conns[i].n : 0;
}

void http_conn_hold(struct http_loop *l, const h2o_conn_t *c)
{
    if ((l->conns_used + 1) * 2 > l->conns_cap) {
        struct conn_slot *old = l->conns;
        size_t n = l->conns_cap;
        l->conns_cap = n ? n * 2 : 64;
        l->conns = xcalloc(l->conns_cap, sizeof *l->conns);
        for (size_t k = 0; k < n; k++)
            if (old[k].conn) l->conns[find(l, old[k].conn)] = old[k];
        free(old);
    }
    size_t i = find(l, c);
    struct conn_slot *e = &l->conns[i];
    if (!e->conn) {
        *e = (struct conn_slot){.conn = c, .tokens = RESET_BURST, .t = util_now()};
        l->conns_used++;
    }
    e->n++;
}

void http_conn_release(struct http_loop *l, const h2o_conn_t *c, int reset)
{
    size_t i = find(l, c);
    struct conn_slot *e = &l->conns[i];
    assert(e->conn == c && e->n > 0);
    e->n--;
    refill(e, util_now());
    if (reset && !e->calm && --e->tokens < 0) {
        e->calm = 1;
        if (!h2o_timeout_is_linked(&l->calm))
            h2o_timeout_link(l->loop, &l->ctx.zero_timeout, &l->calm);
    }
    if (e->n == 0 && !e->calm && e->tokens >= RESET_BURST) remove_at(l, i);
}

/* The zero timeout armed by a connection over the bound: GOAWAY to those still open. */
void http_conn_send_calm(h2o_timeout_entry_t *entry)
{
    struct http_loop *l = H2O_STRUCT_FROM_MEMBER(struct http_loop, calm, entry);
    for (size_t i = 0; i < l->conns_cap; i++) {
        struct conn_slot *e = &l->conns[i];
        if (!e->conn || e->calm != 1) continue;
        e->calm = 2;
        for (h2o_linklist_t *n = l->ctx.http2._conns.next; n != &l->ctx.http2._conns; n = n->next) {
            h2o_http2_conn_t *h2 = H2O_STRUCT_FROM_MEMBER(h2o_http2_conn_t, _conns, n);
            if ((const h2o_conn_t *)&h2->super != e->conn || h2->state != H2O_HTTP2_CONN_STATE_OPEN)
                continue;
            /* as h2o itself does on a protocol error: no new streams, closed when the
             * open ones have ended */
            h2o_http2_encode_goaway_frame(&h2->_write.buf, h2->pull_stream_ids.max_open,
                                          H2O_HTTP2_ERROR_ENHANCE_YOUR_CALM,
                                          h2o_iovec_init(H2O_STRLIT("too many streams reset")));
            h2o_http2_conn_request_write(h2);
            h2->state = H2O_HTTP2_CONN_STATE_HALF_CLOSED;
            http_metrics_goaway(l->srv->metrics);
            break;
        }
    }
}

void http_conn_sweep(struct http_loop *l)
{
    double now = util_now();
    for (size_t i = 0; i < l->conns_cap;) {
        struct conn_slot *e = &l->conns[i];
        if (e->conn && e->n == 0) {
            refill(e, now);
            /* a connection told to calm down keeps its entry for a while: its address
             * may be reused, but only after it closed */
            if (e->tokens >= RESET_BURST) {
                remove_at(l, i);
                continue; /* another entry may have moved into i */
            }
        }
        i++;
    }
}
