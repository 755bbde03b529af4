#include "paged_kv/kv_events.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"

#ifdef PAGODA_HAVE_ZMQ
#include <zmq.h>
#endif

/* ---- the configuration ---- */

static int copy_str(const cJSON *v, const char *key, char *out, size_t cap, struct err *e)
{
    if (!cJSON_IsString(v)) return err_set(e, "--kv-events-config: \"%s\" must be a string", key);
    if (strlen(v->valuestring) >= cap)
        return err_set(e, "--kv-events-config: \"%s\" is longer than %zu bytes", key, cap - 1);
    strcpy(out, v->valuestring);
    return 0;
}

static int get_int(const cJSON *v, const char *key, int lo, int hi, int *out, struct err *e)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble ||
        v->valuedouble < lo || v->valuedouble > hi)
        return err_set(e, "--kv-events-config: \"%s\" must be an integer in [%d, %d]", key, lo, hi);
    *out = (int)v->valuedouble;
    return 0;
}

int kv_events_config_parse(const char *json, struct kv_events_config *c, struct err *e)
{
    memset(c, 0, sizeof *c);
    strcpy(c->endpoint, "tcp://*:5557");
    c->buffer_steps = 10000;
    c->hwm = 100000;
    c->max_queue_size = 100000;
    int publisher = -1; /* not given */
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(e, "--kv-events-config: not a JSON object: %s", json);
    }
    int rc = 0;
    for (const cJSON *v = root->child; v && rc == 0; v = v->next) {
        const char *k = v->string;
        if (!strcmp(k, "enable_kv_cache_events")) {
            if (!cJSON_IsBool(v))
                rc = err_set(e, "--kv-events-config: \"%s\" must be true or false", k);
            c->enable = cJSON_IsTrue(v);
        } else if (!strcmp(k, "publisher")) {
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "zmq"))
                publisher = 1;
            else if (cJSON_IsString(v) && !strcmp(v->valuestring, "null"))
                publisher = 0;
            else
                rc = err_set(e, "--kv-events-config: \"publisher\" must be \"zmq\" or \"null\"");
        } else if (!strcmp(k, "endpoint")) {
            rc = copy_str(v, k, c->endpoint, sizeof c->endpoint, e);
        } else if (!strcmp(k, "replay_endpoint")) {
            if (!cJSON_IsNull(v))
                rc = copy_str(v, k, c->replay_endpoint, sizeof c->replay_endpoint, e);
        } else if (!strcmp(k, "topic")) {
            rc = copy_str(v, k, c->topic, sizeof c->topic, e);
        } else if (!strcmp(k, "buffer_steps")) {
            rc = get_int(v, k, 1, 1 << 24, &c->buffer_steps, e);
        } else if (!strcmp(k, "hwm")) {
            rc = get_int(v, k, 0, 1 << 30, &c->hwm, e);
        } else if (!strcmp(k, "max_queue_size")) {
            rc = get_int(v, k, 1, 1 << 24, &c->max_queue_size, e);
        } else if (!strcmp(k, "event_format")) {
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "array"))
                c->array_events = 1;
            else if (!(cJSON_IsString(v) && !strcmp(v->valuestring, "map")))
                rc =
                    err_set(e, "--kv-events-config: \"event_format\" must be \"map\" or \"array\"");
        } else {
            rc = err_set(e,
                         "--kv-events-config: unknown key \"%s\" (known: enable_kv_cache_events, "
                         "publisher, endpoint, replay_endpoint, buffer_steps, hwm, "
                         "max_queue_size, topic, event_format)",
                         k);
        }
    }
    cJSON_Delete(root);
    if (rc) return rc;
    if (!c->endpoint[0]) return err_set(e, "--kv-events-config: \"endpoint\" is empty");
    /* vLLM: the publisher defaults to zmq when events are enabled */
    c->zmq = c->enable && publisher != 0;
    return 0;
}

/* ---- one step's events ---- */

enum ev_kind { EV_STORED, EV_REMOVED, EV_CLEARED };

struct ev {
    uint8_t kind;
    uint8_t has_parent;
    uint32_t n_hashes, n_tokens;
    size_t hash_off, tok_off; /* into the batch's hashes and tokens */
    uint64_t parent;
};

/* A batch owns growable arrays that stay allocated when it is emptied: batches circulate
 * between the engine, the queue and the publisher by swapping, so once each has seen its
 * largest step nothing is allocated. */
struct batch {
    struct ev *ev;
    int n, cap;
    uint64_t *hashes;
    size_t n_hashes, cap_hashes;
    int32_t *tokens;
    size_t n_tokens, cap_tokens;
    double ts;
};

static void batch_clear(struct batch *b)
{
    b->n = 0;
    b->n_hashes = b->n_tokens = 0;
}

/* Unused in a build without libzmq. */
__attribute__((unused)) static void batch_dispose(struct batch *b)
{
    free(b->ev);
    free(b->hashes);
    free(b->tokens);
    memset(b, 0, sizeof *b);
}

static struct ev *batch_add(struct batch *b, enum ev_kind kind, size_t n_hashes, size_t n_tokens)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 16;
        b->ev = xrealloc(b->ev, sizeof *b->ev * (size_t)b->cap);
    }
    if (b->n_hashes + n_hashes > b->cap_hashes) {
        size_t cap = b->cap_hashes ? b->cap_hashes : 64;
        while (cap < b->n_hashes + n_hashes) cap *= 2;
        b->hashes = xrealloc(b->hashes, sizeof *b->hashes * cap);
        b->cap_hashes = cap;
    }
    if (b->n_tokens + n_tokens > b->cap_tokens) {
        size_t cap = b->cap_tokens ? b->cap_tokens : 1024;
        while (cap < b->n_tokens + n_tokens) cap *= 2;
        b->tokens = xrealloc(b->tokens, sizeof *b->tokens * cap);
        b->cap_tokens = cap;
    }
    struct ev *v = &b->ev[b->n++];
    memset(v, 0, sizeof *v);
    v->kind = (uint8_t)kind;
    v->n_hashes = (uint32_t)n_hashes;
    v->n_tokens = (uint32_t)n_tokens;
    v->hash_off = b->n_hashes;
    v->tok_off = b->n_tokens;
    b->n_hashes += n_hashes;
    b->n_tokens += n_tokens;
    return v;
}

static void batch_swap(struct batch *a, struct batch *b)
{
    struct batch t = *a;
    *a = *b;
    *b = t;
}

/* ---- the payload ---- */

static void key(struct msgpack_buf *o, const char *k)
{
    msgpack_cstr(o, k);
}

static void put_hashes(struct msgpack_buf *o, const uint64_t *h, uint32_t n)
{
    msgpack_array(o, n);
    for (uint32_t i = 0; i < n; i++) msgpack_uint(o, h[i]);
}

/* One event, as a tagged map (array 0) or a tagged positional array (array 1). */
static void encode_event(struct msgpack_buf *o, const struct batch *b, const struct ev *v,
                         int block_size, const char *medium, int array)
{
    const uint64_t *h = b->hashes + v->hash_off;
    if (v->kind == EV_STORED) {
        if (array) {
            msgpack_array(o, 8);
            key(o, "BlockStored");
        } else {
            msgpack_map(o, 8);
            key(o, "type");
            key(o, "BlockStored");
            key(o, "block_hashes");
        }
        put_hashes(o, h, v->n_hashes);
        if (!array) key(o, "parent_block_hash");
        if (v->has_parent)
            msgpack_uint(o, v->parent);
        else
            msgpack_nil(o);
        if (!array) key(o, "token_ids");
        msgpack_array(o, v->n_tokens);
        for (uint32_t i = 0; i < v->n_tokens; i++) msgpack_int(o, b->tokens[v->tok_off + i]);
        if (!array) key(o, "block_size");
        msgpack_uint(o, (uint64_t)block_size);
        if (!array) key(o, "lora_id");
        msgpack_nil(o);
        if (!array) key(o, "medium");
        msgpack_cstr(o, medium);
        if (!array) key(o, "lora_name");
        msgpack_nil(o);
    } else if (v->kind == EV_REMOVED) {
        if (array) {
            msgpack_array(o, 3);
            key(o, "BlockRemoved");
        } else {
            msgpack_map(o, 3);
            key(o, "type");
            key(o, "BlockRemoved");
            key(o, "block_hashes");
        }
        put_hashes(o, h, v->n_hashes);
        if (!array) key(o, "medium");
        msgpack_cstr(o, medium);
    } else {
        if (array) {
            msgpack_array(o, 1);
        } else {
            msgpack_map(o, 1);
            key(o, "type");
        }
        key(o, "AllBlocksCleared");
    }
}

/* The KVEventBatch [ts, events, data_parallel_rank] of b into o (cleared first). Unused in
 * a build without libzmq. */
__attribute__((unused)) static void encode_batch(struct msgpack_buf *o, const struct batch *b,
                                                 int block_size, const char *medium, int array)
{
    msgpack_buf_reset(o);
    msgpack_array(o, 3);
    msgpack_f64(o, b->ts);
    msgpack_array(o, (uint32_t)b->n);
    for (int i = 0; i < b->n; i++) encode_event(o, b, &b->ev[i], block_size, medium, array);
    msgpack_uint(o, 0);
}

/* ---- the publisher ---- */

struct replay_slot {
    uint64_t seq;
    uint8_t *p;
    size_t len, cap;
};

struct kv_events {
    struct kv_events_config cfg;
    int block_size;
    char medium[8];
    struct batch stage; /* engine thread: this step's events */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct batch *queue; /* [max_queue_size] ring: head is sent next */
    int q_head, q_n;
    int quit;
    uint64_t published, dropped;

    /* publisher thread */
    pthread_t thread;
    struct batch cur;
    struct msgpack_buf out;
    uint64_t seq;
    struct replay_slot *replay; /* [buffer_steps] ring of the last payloads sent */
    int r_head, r_n;
    void *ctx, *pub, *rep;
};

void kv_events_attach(struct kv_events *ev, int block_size, const char *medium)
{
    ev->block_size = block_size;
    snprintf(ev->medium, sizeof ev->medium, "%s", medium);
}

void kv_events_stored(struct kv_events *ev, const struct kv_hash *hashes, int n,
                      const struct kv_hash *parent, const int32_t *tokens)
{
    if (n <= 0) return;
    size_t nt = (size_t)n * (size_t)ev->block_size;
    struct ev *v = batch_add(&ev->stage, EV_STORED, (size_t)n, nt);
    for (int i = 0; i < n; i++) ev->stage.hashes[v->hash_off + (size_t)i] = hashes[i].lo;
    memcpy(ev->stage.tokens + v->tok_off, tokens, sizeof *tokens * nt);
    v->has_parent = parent != NULL;
    v->parent = parent ? parent->lo : 0;
}

void kv_events_removed(struct kv_events *ev, struct kv_hash h)
{
    struct ev *v = batch_add(&ev->stage, EV_REMOVED, 1, 0);
    ev->stage.hashes[v->hash_off] = h.lo;
}

void kv_events_cleared(struct kv_events *ev)
{
    batch_add(&ev->stage, EV_CLEARED, 0, 0);
}

static double wall_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void kv_events_flush(struct kv_events *ev)
{
    if (!ev->stage.n) return;
    ev->stage.ts = wall_seconds();
    pthread_mutex_lock(&ev->mu);
    if (ev->q_n == ev->cfg.max_queue_size) {
        ev->dropped++;
        batch_clear(&ev->stage);
    } else {
        int tail = (ev->q_head + ev->q_n) % ev->cfg.max_queue_size;
        batch_swap(&ev->stage, &ev->queue[tail]); /* the stage takes the slot's empty arrays */
        batch_clear(&ev->stage);
        ev->q_n++;
        pthread_cond_signal(&ev->cv);
    }
    pthread_mutex_unlock(&ev->mu);
}

void kv_events_counts(struct kv_events *ev, uint64_t *published, uint64_t *dropped)
{
    pthread_mutex_lock(&ev->mu);
    *published = ev->published;
    *dropped = ev->dropped;
    pthread_mutex_unlock(&ev->mu);
}

#ifdef PAGODA_HAVE_ZMQ

static void be64(uint8_t out[8], uint64_t v)
{
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(v >> (56 - 8 * i));
}

/* Keeps the payload just sent under seq for replay, over the oldest when full. */
static void replay_keep(struct kv_events *ev, uint64_t seq, const struct msgpack_buf *m)
{
    int cap = ev->cfg.buffer_steps;
    int slot = (ev->r_head + ev->r_n) % cap;
    if (ev->r_n == cap)
        ev->r_head = (ev->r_head + 1) % cap;
    else
        ev->r_n++;
    struct replay_slot *s = &ev->replay[slot];
    if (s->cap < m->len) {
        s->p = xrealloc(s->p, m->len);
        s->cap = m->len;
    }
    memcpy(s->p, m->p, m->len);
    s->len = m->len;
    s->seq = seq;
}

/* Answers the replay requests waiting on the ROUTER socket: [identity, "", start] gets
 * [identity, "", seq, payload] for every kept batch from start on, then [identity, "", -1,
 * ""]. */
static void replay_serve(struct kv_events *ev)
{
    for (;;) {
        zmq_msg_t part[4];
        int n = 0, more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, ev->rep, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                for (int i = 0; i < n; i++) zmq_msg_close(&part[i]);
                return; /* nothing (more) waiting */
            }
            more = zmq_msg_more(&m);
            if (n < 4) {
                zmq_msg_init(&part[n]);
                zmq_msg_move(&part[n++], &m);
            }
            zmq_msg_close(&m);
        }
        if (n == 3 && zmq_msg_size(&part[2]) == 8) {
            const uint8_t *s = zmq_msg_data(&part[2]);
            uint64_t start = 0;
            for (int i = 0; i < 8; i++) start = start << 8 | s[i];
            size_t idn = zmq_msg_size(&part[0]);
            const void *id = zmq_msg_data(&part[0]);
            uint8_t sb[8];
            for (int k = 0; k < ev->r_n; k++) {
                const struct replay_slot *r = &ev->replay[(ev->r_head + k) % ev->cfg.buffer_steps];
                if (r->seq < start) continue;
                be64(sb, r->seq);
                zmq_send(ev->rep, id, idn, ZMQ_SNDMORE);
                zmq_send(ev->rep, "", 0, ZMQ_SNDMORE);
                zmq_send(ev->rep, sb, 8, ZMQ_SNDMORE);
                zmq_send(ev->rep, r->p, r->len, 0);
            }
            be64(sb, UINT64_MAX); /* -1 as a signed 8-byte big-endian integer */
            zmq_send(ev->rep, id, idn, ZMQ_SNDMORE);
            zmq_send(ev->rep, "", 0, ZMQ_SNDMORE);
            zmq_send(ev->rep, sb, 8, ZMQ_SNDMORE);
            zmq_send(ev->rep, "", 0, 0);
        } else {
            fprintf(stderr,
                    "pagoda: kv events: a replay request of %d parts ignored (want "
                    "[identity, \"\", 8-byte start])\n",
                    n);
        }
        for (int i = 0; i < n; i++) zmq_msg_close(&part[i]);
    }
}

static void *publisher_main(void *arg)
{
    struct kv_events *ev = arg;
    for (;;) {
        pthread_mutex_lock(&ev->mu);
        while (!ev->q_n && !ev->quit) {
            if (!ev->rep) {
                pthread_cond_wait(&ev->cv, &ev->mu);
                continue;
            }
            /* with a replay socket, look at it every 50 ms while idle */
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 50 * 1000000L;
            if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
            if (pthread_cond_timedwait(&ev->cv, &ev->mu, &t) == ETIMEDOUT) break;
        }
        if (!ev->q_n && ev->quit) {
            pthread_mutex_unlock(&ev->mu);
            break;
        }
        int have = ev->q_n > 0;
        if (have) {
            batch_swap(&ev->cur, &ev->queue[ev->q_head]);
            ev->q_head = (ev->q_head + 1) % ev->cfg.max_queue_size;
            ev->q_n--;
        }
        pthread_mutex_unlock(&ev->mu);
        if (have) {
            encode_batch(&ev->out, &ev->cur, ev->block_size, ev->medium, ev->cfg.array_events);
            batch_clear(&ev->cur);
            uint8_t sb[8];
            be64(sb, ev->seq);
            /* PUB never blocks: past the high-water mark zmq drops the message */
            zmq_send(ev->pub, ev->cfg.topic, strlen(ev->cfg.topic), ZMQ_SNDMORE);
            zmq_send(ev->pub, sb, 8, ZMQ_SNDMORE);
            zmq_send(ev->pub, ev->out.p, ev->out.len, 0);
            if (ev->rep) replay_keep(ev, ev->seq, &ev->out);
            ev->seq++;
            pthread_mutex_lock(&ev->mu);
            ev->published++;
            pthread_mutex_unlock(&ev->mu);
        }
        if (ev->rep) replay_serve(ev);
    }
    return NULL;
}

/* vLLM's rule: bind a wildcard, IPC or in-process address, connect to anything else. */
static int binds(const char *ep)
{
    return strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) ||
           !strncmp(ep, "inproc://", 9);
}

struct kv_events *kv_events_create(const struct kv_events_config *c, struct err *e)
{
    if (!c->enable || !c->zmq) return NULL;
    struct kv_events *ev = xcalloc(1, sizeof *ev);
    ev->cfg = *c;
    ev->block_size = 16;
    strcpy(ev->medium, "GPU");
    ev->ctx = zmq_ctx_new();
    ev->pub = zmq_socket(ev->ctx, ZMQ_PUB);
    int hwm = c->hwm, linger = 1000;
    zmq_setsockopt(ev->pub, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(ev->pub, ZMQ_LINGER, &linger, sizeof linger);
    int rc =
        binds(c->endpoint) ? zmq_bind(ev->pub, c->endpoint) : zmq_connect(ev->pub, c->endpoint);
    if (rc != 0) {
        err_set(e, "kv events: cannot %s %s: %s", binds(c->endpoint) ? "bind" : "connect to",
                c->endpoint, zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (c->replay_endpoint[0]) {
        ev->rep = zmq_socket(ev->ctx, ZMQ_ROUTER);
        zmq_setsockopt(ev->rep, ZMQ_LINGER, &linger, sizeof linger);
        if (zmq_bind(ev->rep, c->replay_endpoint) != 0) {
            err_set(e, "kv events: cannot bind the replay endpoint %s: %s", c->replay_endpoint,
                    zmq_strerror(zmq_errno()));
            goto fail;
        }
        ev->replay = xcalloc((size_t)c->buffer_steps, sizeof *ev->replay);
    }
    ev->queue = xcalloc((size_t)c->max_queue_size, sizeof *ev->queue);
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
    if (pthread_create(&ev->thread, NULL, publisher_main, ev) != 0) {
        err_set(e, "kv events: cannot start the publisher thread");
        pthread_mutex_destroy(&ev->mu);
        pthread_cond_destroy(&ev->cv);
        free(ev->queue);
        goto fail;
    }
    return ev;
fail:
    if (ev->rep) zmq_close(ev->rep);
    zmq_close(ev->pub);
    zmq_ctx_term(ev->ctx);
    free(ev->replay);
    free(ev);
    return NULL;
}

void kv_events_destroy(struct kv_events *ev)
{
    if (!ev) return;
    kv_events_flush(ev);
    pthread_mutex_lock(&ev->mu);
    ev->quit = 1;
    pthread_cond_signal(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
    pthread_join(ev->thread, NULL);
    if (ev->rep) zmq_close(ev->rep);
    zmq_close(ev->pub); /* lingers up to a second for what is still in flight */
    zmq_ctx_term(ev->ctx);
    for (int i = 0; i < ev->cfg.max_queue_size; i++) batch_dispose(&ev->queue[i]);
    free(ev->queue);
    if (ev->replay)
        for (int i = 0; i < ev->cfg.buffer_steps; i++) free(ev->replay[i].p);
    free(ev->replay);
    batch_dispose(&ev->stage);
    batch_dispose(&ev->cur);
    msgpack_buf_dispose(&ev->out);
    pthread_mutex_destroy(&ev->mu);
    pthread_cond_destroy(&ev->cv);
    free(ev);
}

#else /* no libzmq in this build */

struct kv_events *kv_events_create(const struct kv_events_config *c, struct err *e)
{
    if (!c->enable || !c->zmq) return NULL;
    err_set(e, "kv events: this pagoda was built without libzmq (install libzmq3-dev and "
               "rebuild)");
    return NULL;
}

void kv_events_destroy(struct kv_events *ev)
{
    (void)ev;
}

#endif
