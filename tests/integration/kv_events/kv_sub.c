/* kv_sub: a ZeroMQ subscriber of vLLM-format KV-cache events for the tests. It prints
 * every message as one JSON line, the msgpack payload decoded generically (maps as
 * objects, arrays as arrays; integers above 2^53 as decimal strings so that JavaScript
 * keeps block hashes exact):
 *
 *     {"topic":"kv-events","seq":0,"batch":[1795396135.1,[{"type":"BlockStored",...}],0]}
 *
 * Usage: kv_sub ENDPOINT TOPIC SECONDS [REPLAY_ENDPOINT]
 * Prints "ready" once subscribed, then messages for SECONDS or until a batch holds an
 * AllBlocksCleared event; with REPLAY_ENDPOINT it then asks for every batch from sequence 0
 * and prints the answers as {"replay_seq":N,"batch":...} up to the end marker (seq -1).
 * Exits 1 on a message that is not [topic, 8-byte seq, msgpack]. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

struct rd {
    const uint8_t *p, *end;
    int bad;
};

static uint64_t be(struct rd *r, int n)
{
    if (r->end - r->p < n) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | *r->p++;
    return v;
}

static void put_uint(uint64_t v)
{
    if (v > (1ull << 53))
        printf("\"%llu\"", (unsigned long long)v);
    else
        printf("%llu", (unsigned long long)v);
}

static void put_str(struct rd *r, uint64_t n)
{
    if ((uint64_t)(r->end - r->p) < n) {
        r->bad = 1;
        return;
    }
    putchar('"');
    for (uint64_t i = 0; i < n; i++) {
        uint8_t c = r->p[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
    r->p += n;
}

static void value(struct rd *r, int depth);

static void seq(struct rd *r, uint64_t n, int map, int depth)
{
    putchar(map ? '{' : '[');
    for (uint64_t i = 0; i < n && !r->bad; i++) {
        if (i) putchar(',');
        value(r, depth + 1);
        if (map) {
            putchar(':');
            value(r, depth + 1);
        }
    }
    putchar(map ? '}' : ']');
}

static void value(struct rd *r, int depth)
{
    if (depth > 32 || r->p >= r->end) {
        r->bad = 1;
        return;
    }
    uint8_t t = *r->p++;
    if (t < 0x80)
        printf("%u", t);
    else if (t >= 0xe0)
        printf("%d", (int8_t)t);
    else if ((t & 0xf0) == 0x80)
        seq(r, t & 0x0f, 1, depth);
    else if ((t & 0xf0) == 0x90)
        seq(r, t & 0x0f, 0, depth);
    else if ((t & 0xe0) == 0xa0)
        put_str(r, t & 0x1f);
    else if (t == 0xc0)
        printf("null");
    else if (t == 0xc2)
        printf("false");
    else if (t == 0xc3)
        printf("true");
    else if (t == 0xcc)
        put_uint(be(r, 1));
    else if (t == 0xcd)
        put_uint(be(r, 2));
    else if (t == 0xce)
        put_uint(be(r, 4));
    else if (t == 0xcf)
        put_uint(be(r, 8));
    else if (t == 0xd0)
        printf("%d", (int8_t)be(r, 1));
    else if (t == 0xd1)
        printf("%d", (int16_t)be(r, 2));
    else if (t == 0xd2)
        printf("%d", (int32_t)be(r, 4));
    else if (t == 0xd3)
        printf("%lld", (long long)(int64_t)be(r, 8));
    else if (t == 0xcb) {
        uint64_t u = be(r, 8);
        double d;
        memcpy(&d, &u, 8);
        printf("%.17g", d);
    } else if (t == 0xd9)
        put_str(r, be(r, 1));
    else if (t == 0xda)
        put_str(r, be(r, 2));
    else if (t == 0xdb)
        put_str(r, be(r, 4));
    else if (t == 0xdc)
        seq(r, be(r, 2), 0, depth);
    else if (t == 0xdd)
        seq(r, be(r, 4), 0, depth);
    else if (t == 0xde)
        seq(r, be(r, 2), 1, depth);
    else if (t == 0xdf)
        seq(r, be(r, 4), 1, depth);
    else
        r->bad = 1; /* bin, ext and float32 are not part of this wire */
}

/* Prints payload as JSON; 0 when it is one whole msgpack value. */
static int payload(const uint8_t *p, size_t n)
{
    struct rd r = {p, p + n, 0};
    value(&r, 0);
    return r.bad || r.p != r.end ? -1 : 0;
}

static int recv_part(void *s, zmq_msg_t *m)
{
    zmq_msg_init(m);
    return zmq_msg_recv(m, s, 0) < 0 ? -1 : 0;
}

static uint64_t seq8(zmq_msg_t *m)
{
    struct rd r = {zmq_msg_data(m), (const uint8_t *)zmq_msg_data(m) + zmq_msg_size(m), 0};
    return be(&r, 8);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: kv_sub ENDPOINT TOPIC SECONDS [REPLAY_ENDPOINT]\n");
        return 2;
    }
    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    if (zmq_connect(sub, argv[1]) || zmq_setsockopt(sub, ZMQ_SUBSCRIBE, argv[2], strlen(argv[2]))) {
        fprintf(stderr, "kv_sub: %s: %s\n", argv[1], zmq_strerror(zmq_errno()));
        return 1;
    }
    int timeout = 100;
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    printf("ready\n");
    fflush(stdout);
    double end = now() + atof(argv[3]);
    int rc = 0, cleared = 0;
    while (!cleared && now() < end) {
        zmq_msg_t m[3];
        if (recv_part(sub, &m[0])) {
            zmq_msg_close(&m[0]);
            continue;
        }
        int n = 1;
        while (zmq_msg_more(&m[n - 1]) && n < 3) {
            if (recv_part(sub, &m[n])) break;
            n++;
        }
        if (n != 3 || zmq_msg_more(&m[2]) || zmq_msg_size(&m[1]) != 8) {
            fprintf(stderr, "kv_sub: a message of %d parts (want topic, seq, payload)\n", n);
            rc = 1;
        } else {
            printf("{\"topic\":");
            struct rd t = {zmq_msg_data(&m[0]),
                           (const uint8_t *)zmq_msg_data(&m[0]) + zmq_msg_size(&m[0]), 0};
            put_str(&t, zmq_msg_size(&m[0]));
            printf(",\"seq\":%llu,\"bytes\":%zu,\"batch\":", (unsigned long long)seq8(&m[1]),
                   zmq_msg_size(&m[2]));
            if (payload(zmq_msg_data(&m[2]), zmq_msg_size(&m[2]))) {
                fprintf(stderr, "kv_sub: a payload that is not one msgpack value\n");
                rc = 1;
            }
            printf("}\n");
            fflush(stdout);
            cleared =
                memmem(zmq_msg_data(&m[2]), zmq_msg_size(&m[2]), "AllBlocksCleared", 16) != NULL;
        }
        for (int i = 0; i < n; i++) zmq_msg_close(&m[i]);
    }
    if (argc > 4) {
        /* DEALER, not REQ: the answer is many messages, which a REQ socket would refuse
         * after the first. The empty delimiter a REQ socket adds is sent by hand. */
        void *req = zmq_socket(ctx, ZMQ_DEALER);
        zmq_setsockopt(req, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
        zmq_connect(req, argv[4]);
        uint8_t start[8] = {0};
        zmq_send(req, "", 0, ZMQ_SNDMORE);
        zmq_send(req, start, 8, 0);
        double stop = now() + 5;
        for (;;) {
            zmq_msg_t m[3];
            if (recv_part(req, &m[0])) {
                zmq_msg_close(&m[0]);
                if (now() > stop) {
                    fprintf(stderr, "kv_sub: no end of replay\n");
                    rc = 1;
                    break;
                }
                continue;
            }
            int n = 1;
            while (zmq_msg_more(&m[n - 1]) && n < 3) {
                if (recv_part(req, &m[n])) break;
                n++;
            }
            if (n != 3 || zmq_msg_size(&m[0]) != 0 || zmq_msg_size(&m[1]) != 8) {
                fprintf(stderr, "kv_sub: a replay answer of %d parts (want \"\", seq, payload)\n",
                        n);
                rc = 1;
                for (int i = 0; i < n; i++) zmq_msg_close(&m[i]);
                break;
            }
            int64_t s = (int64_t)seq8(&m[1]);
            if (s == -1) {
                printf("{\"replay_end\":true,\"bytes\":%zu}\n", zmq_msg_size(&m[2]));
            } else {
                printf("{\"replay_seq\":%lld,\"batch\":", (long long)s);
                if (payload(zmq_msg_data(&m[2]), zmq_msg_size(&m[2]))) rc = 1;
                printf("}\n");
            }
            for (int i = 0; i < n; i++) zmq_msg_close(&m[i]);
            if (s == -1) break;
        }
        zmq_close(req);
    }
    fflush(stdout);
    zmq_close(sub);
    zmq_ctx_term(ctx);
    return rc;
}
