/* KV-cache events: the --kv-events-config parser, the payload bytes of each event in both
 * encodings, the pool's eviction and the engine's store reports carrying the low 64 bits of
 * the blocks' XXH3-128 names, and a full queue dropping a step's batch. The module's .c is
 * included so that batches can be built and encoded without sockets. */
#include "paged_kv/kv_events.c"

#include "test_util.h"

static void test_config(void)
{
    struct kv_events_config c;
    struct err e = {0};
    CHECK(kv_events_config_parse("{}", &c, &e) == 0, "%s", e.msg);
    CHECK(!c.enable && !c.zmq, "off by default");
    CHECK(!strcmp(c.endpoint, "tcp://*:5557") && !c.replay_endpoint[0] && !c.topic[0],
          "vLLM's defaults: %s", c.endpoint);
    CHECK(c.buffer_steps == 10000 && c.hwm == 100000 && c.max_queue_size == 100000, "numbers");
    CHECK(kv_events_config_parse("{\"enable_kv_cache_events\":true}", &c, &e) == 0, "%s", e.msg);
    CHECK(c.enable && c.zmq && !c.array_events, "zmq is the default publisher when enabled");
    CHECK(kv_events_config_parse(
              "{\"enable_kv_cache_events\":true,\"publisher\":\"null\",\"endpoint\":"
              "\"tcp://10.0.0.1:6000\",\"replay_endpoint\":\"tcp://*:6001\",\"buffer_steps\":5,"
              "\"hwm\":7,\"max_queue_size\":9,\"topic\":\"kv\",\"event_format\":\"array\"}",
              &c, &e) == 0,
          "%s", e.msg);
    CHECK(c.enable && !c.zmq, "publisher null: no events");
    CHECK(!strcmp(c.endpoint, "tcp://10.0.0.1:6000") && !strcmp(c.replay_endpoint, "tcp://*:6001"),
          "endpoints");
    CHECK(c.buffer_steps == 5 && c.hwm == 7 && c.max_queue_size == 9 && !strcmp(c.topic, "kv") &&
              c.array_events,
          "values");
    CHECK(kv_events_config_parse("{\"replay_endpoint\":null}", &c, &e) == 0 &&
              !c.replay_endpoint[0],
          "a null replay endpoint");
    static const char *const bad[][2] = {
        {"", "not a JSON object"},
        {"[]", "not a JSON object"},
        {"{\"enable_kv_cache_events\":\"yes\"}", "\"enable_kv_cache_events\" must be"},
        {"{\"publisher\":\"kafka\"}", "\"publisher\" must be"},
        {"{\"endpoint\":5}", "\"endpoint\" must be a string"},
        {"{\"endpoint\":\"\"}", "\"endpoint\" is empty"},
        {"{\"buffer_steps\":0}", "\"buffer_steps\" must be an integer in [1,"},
        {"{\"max_queue_size\":1.5}", "\"max_queue_size\" must be an integer"},
        {"{\"event_format\":\"json\"}", "\"event_format\" must be"},
        {"{\"enable_kv_cache_event\":true}", "unknown key \"enable_kv_cache_event\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e.msg[0] = 0;
        CHECK(kv_events_config_parse(bad[i][0], &c, &e) == -1 && strstr(e.msg, bad[i][1]), "%s: %s",
              bad[i][0], e.msg);
    }
}

/* An engine-side recorder without sockets: the stage of a zeroed kv_events. */
static void recorder(struct kv_events *ev, int block_size, const char *medium, int queue)
{
    memset(ev, 0, sizeof *ev);
    kv_events_attach(ev, block_size, medium);
    ev->cfg.max_queue_size = queue;
    ev->queue = xcalloc((size_t)queue, sizeof *ev->queue);
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
}

static void recorder_dispose(struct kv_events *ev)
{
    for (int i = 0; i < ev->cfg.max_queue_size; i++) batch_dispose(&ev->queue[i]);
    free(ev->queue);
    batch_dispose(&ev->stage);
    batch_dispose(&ev->cur);
    msgpack_buf_dispose(&ev->out);
    pthread_mutex_destroy(&ev->mu);
    pthread_cond_destroy(&ev->cv);
}

static void test_payload(void)
{
    struct kv_events ev;
    recorder(&ev, 2, "GPU", 4);
    struct kv_hash h[2] = {{0x8000000000000005ull, 0xaa}, {7, 0xbb}};
    int32_t toks[4] = {7, 300, -1, 70000};
    kv_events_stored(&ev, h, 1, NULL, toks);
    kv_events_stored(&ev, h + 1, 1, h, toks + 2);
    kv_events_removed(&ev, h[1]);
    kv_events_cleared(&ev);
    ev.stage.ts = 1.5;
    struct msgpack_buf o = {0};
    encode_batch(&o, &ev.stage, ev.block_size, ev.medium, 0);
    /* [1.5, [{BlockStored...}, {BlockStored...}, {BlockRemoved...}, {AllBlocksCleared}], 0] */
    static const char want[] = "\x93\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00\x94"
                               "\x88\xa4type\xab"
                               "BlockStored\xac"
                               "block_hashes\x91\xcf\x80\x00\x00\x00\x00\x00\x00\x05"
                               "\xb1parent_block_hash\xc0"
                               "\xa9token_ids\x92\x07\xcd\x01\x2c"
                               "\xaa"
                               "block_size\x02"
                               "\xa7lora_id\xc0"
                               "\xa6medium\xa3GPU"
                               "\xa9lora_name\xc0"
                               "\x88\xa4type\xab"
                               "BlockStored\xac"
                               "block_hashes\x91\x07"
                               "\xb1parent_block_hash\xcf\x80\x00\x00\x00\x00\x00\x00\x05"
                               "\xa9token_ids\x92\xff\xce\x00\x01\x11\x70"
                               "\xaa"
                               "block_size\x02"
                               "\xa7lora_id\xc0"
                               "\xa6medium\xa3GPU"
                               "\xa9lora_name\xc0"
                               "\x83\xa4type\xac"
                               "BlockRemoved\xac"
                               "block_hashes\x91\x07"
                               "\xa6medium\xa3GPU"
                               "\x81\xa4type\xb0"
                               "AllBlocksCleared"
                               "\x00";
    CHECK(o.len == sizeof want - 1 && !memcmp(o.p, want, o.len), "map payload: %zu bytes, want %zu",
          o.len, sizeof want - 1);
    encode_batch(&o, &ev.stage, ev.block_size, ev.medium, 1);
    static const char want_arr[] = "\x93\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00\x94"
                                   "\x98\xab"
                                   "BlockStored\x91\xcf\x80\x00\x00\x00\x00\x00\x00\x05\xc0"
                                   "\x92\x07\xcd\x01\x2c\x02\xc0\xa3GPU\xc0"
                                   "\x98\xab"
                                   "BlockStored\x91\x07\xcf\x80\x00\x00\x00\x00\x00\x00\x05"
                                   "\x92\xff\xce\x00\x01\x11\x70\x02\xc0\xa3GPU\xc0"
                                   "\x93\xac"
                                   "BlockRemoved\x91\x07\xa3GPU"
                                   "\x91\xb0"
                                   "AllBlocksCleared"
                                   "\x00";
    CHECK(o.len == sizeof want_arr - 1 && !memcmp(o.p, want_arr, o.len),
          "array payload: %zu bytes, want %zu", o.len, sizeof want_arr - 1);
    msgpack_buf_dispose(&o);
    recorder_dispose(&ev);
}

/* The pool reports each eviction of a named block, with the name the store reported. */
static void test_pool_hooks(void)
{
    struct kv_events ev;
    recorder(&ev, 4, "CPU", 4);
    struct kv_pool p;
    kv_pool_init(&p, 3, 4, "m", 1);
    p.events = &ev;
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct kv_hash h[2];
    h[0] = kv_block_hash(&p, NULL, toks, 4, NULL, 0);
    h[1] = kv_block_hash(&p, &h[0], toks + 4, 4, NULL, 0);
    int32_t b[2];
    CHECK(kv_allocate(&p, 2, b) == 0, "alloc");
    CHECK(ev.stage.n == 0, "fresh blocks evict nothing");
    CHECK(kv_commit_hash(&p, b[0], h[0]) == 1 && kv_commit_hash(&p, b[1], h[1]) == 1, "commit");
    CHECK(kv_commit_hash(&p, b[1], h[1]) == 0, "a second commit is a no-op");
    kv_events_stored(&ev, h, 2, NULL, toks);
    kv_release(&p, b, 2);
    /* LRU: the never-used block 2 first, then the request's tail block b[1], then b[0] */
    int32_t c[3];
    CHECK(kv_allocate(&p, 3, c) == 0, "alloc all");
    CHECK(ev.stage.n == 3, "%d events", ev.stage.n);
    const struct ev *v = ev.stage.ev;
    CHECK(v[0].kind == EV_STORED && v[0].n_hashes == 2 && v[0].n_tokens == 8 && !v[0].has_parent,
          "stored");
    CHECK(ev.stage.hashes[0] == h[0].lo && ev.stage.hashes[1] == h[1].lo, "the names' low halves");
    CHECK(!memcmp(ev.stage.tokens, toks, sizeof toks), "tokens");
    CHECK(v[1].kind == EV_REMOVED && ev.stage.hashes[v[1].hash_off] == h[1].lo,
          "tail evicted first");
    CHECK(v[2].kind == EV_REMOVED && ev.stage.hashes[v[2].hash_off] == h[0].lo, "then the head");
    kv_pool_dispose(&p);
    recorder_dispose(&ev);
}

/* Flush hands whole batches over; past max_queue_size a step's batch is dropped. */
static void test_queue(void)
{
    struct kv_events ev;
    recorder(&ev, 1, "GPU", 2);
    kv_events_flush(&ev);
    CHECK(ev.q_n == 0, "an empty step sends nothing");
    int32_t t = 5;
    struct kv_hash h = {9, 9};
    for (int i = 0; i < 3; i++) {
        kv_events_stored(&ev, &h, 1, NULL, &t);
        kv_events_removed(&ev, h);
        kv_events_flush(&ev);
        CHECK(ev.stage.n == 0, "the stage is empty after a flush");
    }
    uint64_t pub, drop;
    kv_events_counts(&ev, &pub, &drop);
    CHECK(ev.q_n == 2 && drop == 1 && pub == 0, "queued %d dropped %llu", ev.q_n,
          (unsigned long long)drop);
    CHECK(ev.queue[0].n == 2 && ev.queue[1].n == 2 && ev.queue[0].ts > 1.7e9, "whole batches");
    recorder_dispose(&ev);
}

int main(void)
{
    test_config();
    test_payload();
    test_pool_hooks();
    test_queue();
    TEST_DONE();
}
