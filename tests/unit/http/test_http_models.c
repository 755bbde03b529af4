/* The served-model registry without a server: model arguments and files parsed, names
 * looked up, and the loader thread's choices (load on demand, a failed load, least recently
 * used idle model unloaded for the budget, a held model kept) on two tiny models. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/models.h"
#include "test_util.h"

static void test_specs(const char *data)
{
    struct http_model_spec sp;
    struct err e = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/llama-tiny/", data);
    CHECK(http_model_spec_parse(dir, &sp, &e) == 0, "%s", e.msg);
    CHECK(sp.n_names == 1 && !strcmp(sp.names[0], "llama-tiny"), "%s", sp.names[0]);
    http_model_spec_dispose(&sp);
    CHECK(http_model_spec_parse("a,b,c=/x/y", &sp, &e) == 0, "%s", e.msg);
    CHECK(sp.n_names == 3 && !strcmp(sp.names[0], "a") && !strcmp(sp.names[2], "c") &&
              !strcmp(sp.dir, "/x/y"),
          "%d", sp.n_names);
    http_model_spec_dispose(&sp);
    CHECK(http_model_spec_parse("a,,b=/x", &sp, &e) < 0 && strstr(e.msg, "an empty name"), "%s",
          e.msg);
    CHECK(http_model_spec_parse("a=", &sp, &e) < 0 && strstr(e.msg, "no folder"), "%s", e.msg);
    CHECK(http_model_spec_parse("1,2,3,4,5,6,7,8,9=/x", &sp, &e) < 0 &&
              strstr(e.msg, "more than 8 names"),
          "%s", e.msg);

    char path[] = "/tmp/pagoda-models-XXXXXX";
    int fd = mkstemp(path);
    const char text[] = "# two models\n\n  a,aa=/m/a  \nb=/m/b\n=/m/c\n";
    CHECK(write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1), "write");
    close(fd);
    struct http_model_spec *specs = NULL;
    int n = 0;
    CHECK(http_model_specs_read(path, &specs, &n, &e) < 0, "a nameless line is an error");
    CHECK(strstr(e.msg, ":5: ") && strstr(e.msg, "an empty name"), "%s", e.msg);
    CHECK(n == 2 && !strcmp(specs[0].names[1], "aa") && !strcmp(specs[0].dir, "/m/a") &&
              !strcmp(specs[1].dir, "/m/b"),
          "%d", n);
    for (int i = 0; i < n; i++) http_model_spec_dispose(&specs[i]);
    free(specs);
    unlink(path);
}

/* on_change: counts the loader's changes for the waits below */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int changes;

static void on_change(void *user)
{
    (void)user;
    pthread_mutex_lock(&mu);
    changes++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* Waits until model i is in state s (the loader reports every change). */
static void wait_state(struct http_models *ms, int i, enum http_model_state s)
{
    pthread_mutex_lock(&mu);
    for (;;) {
        enum http_model_state now;
        unsigned f;
        pthread_mutex_unlock(&mu);
        http_models_peek(ms, i, &now, &f, NULL, 0);
        pthread_mutex_lock(&mu);
        if (now == s) break;
        pthread_cond_wait(&cv, &mu);
    }
    pthread_mutex_unlock(&mu);
}

/* Acquires model i, waiting for its load when needed. */
static struct http_served *acquire(struct http_models *ms, int i)
{
    unsigned f;
    struct http_served *m = http_models_acquire(ms, i, &f);
    if (m) return m;
    wait_state(ms, i, HTTP_MODEL_LOADED);
    http_models_unwant(ms, i);
    return http_models_acquire(ms, i, &f);
}

static void test_loader(const char *data)
{
    char a[1024], b[1024], c[1024], broken[] = "/tmp/pagoda-broken-XXXXXX";
    snprintf(a, sizeof a, "a=%s/models/llama-tiny", data);
    snprintf(b, sizeof b, "b,bee=%s/models/qwen3-tiny", data);
    snprintf(c, sizeof c, "c=%s/models/llama-tiny", data);
    CHECK(mkdtemp(broken) != NULL, "mkdtemp");
    char bad[128];
    snprintf(bad, sizeof bad, "bad=%s", broken);
    struct http_model_spec specs[4];
    struct err e = {0};
    const char *args[4] = {a, b, c, bad};
    for (int i = 0; i < 4; i++)
        CHECK(http_model_spec_parse(args[i], &specs[i], &e) == 0, "%s", e.msg);
    struct http_models_config cfg = {.on_change = on_change};
    cfg.engine.kv_cache_memory = 1 << 20;
    cfg.engine.threads = 1;
    /* room for two of a, b, c (whichever two), not three */
    struct http_models *probe = http_models_create(specs, 4, &cfg, &e);
    size_t most = 0, least = (size_t)-1;
    for (int i = 0; i < 3; i++) {
        size_t by = http_models_at(probe, i)->bytes;
        if (by > most) most = by;
        if (by < least) least = by;
    }
    http_models_destroy(probe);
    cfg.budget = 2 * most + least - 1;
    struct http_models *ms = http_models_create(specs, 4, &cfg, &e);
    CHECK(ms != NULL, "%s", e.msg);
    CHECK(http_models_find(ms, "bee") == 1 && http_models_find(ms, "c") == 2 &&
              http_models_find(ms, "nope") == -1,
          "find");
    CHECK(!strcmp(http_models_names(ms), "'a', 'b', 'bee', 'c', 'bad'"), "%s",
          http_models_names(ms));
    CHECK(http_models_start(ms, &e) == 0, "%s", e.msg);

    struct http_served *ma = acquire(ms, 0);
    CHECK(ma && ma->engine && ma->model.max_model_len > 0, "a loaded");
    struct http_served *mb = acquire(ms, 1);
    CHECK(mb && !strcmp(mb->model.name, "b"), "b loaded");
    http_models_release(ms, mb);
    http_models_release(ms, ma); /* a is now the most recently used */
    /* c needs room: b, the least recently used idle model, goes */
    struct http_served *mc = acquire(ms, 2);
    CHECK(mc != NULL, "c loaded");
    enum http_model_state st;
    unsigned f;
    http_models_peek(ms, 1, &st, &f, NULL, 0);
    CHECK(st == HTTP_MODEL_UNLOADED && mb->unloads_memory == 1, "b unloaded: %s",
          http_model_state_name(st));
    http_models_peek(ms, 0, &st, &f, NULL, 0);
    CHECK(st == HTTP_MODEL_LOADED, "a kept: %s", http_model_state_name(st));
    /* a and c held: b waits, and loads once a is released (a is then the LRU idle one) */
    ma = acquire(ms, 0);
    CHECK(http_models_acquire(ms, 1, &f) == NULL, "b must wait while a and c are held");
    http_models_lock(ms);
    CHECK(http_models_at(ms, 1)->wanted == 1, "b wanted");
    http_models_unlock(ms);
    http_models_release(ms, ma);
    wait_state(ms, 1, HTTP_MODEL_LOADED);
    http_models_unwant(ms, 1);
    http_models_peek(ms, 0, &st, &f, NULL, 0);
    CHECK(st == HTTP_MODEL_UNLOADED && ma->unloads_memory == 1, "a unloaded, c (held) kept");
    http_models_peek(ms, 2, &st, &f, NULL, 0);
    CHECK(st == HTTP_MODEL_LOADED, "c kept: %s", http_model_state_name(st));
    http_models_release(ms, mc);

    /* a failed load: FAILED, failures counted, the reason kept */
    unsigned before;
    CHECK(http_models_acquire(ms, 3, &before) == NULL && before == 0, "bad wanted");
    wait_state(ms, 3, HTTP_MODEL_FAILED);
    char why[1024];
    http_models_peek(ms, 3, &st, &f, why, sizeof why);
    CHECK(f == 1 && strstr(why, "tokenizer.json"), "%u %s", f, why);
    http_models_unwant(ms, 3);
    http_models_destroy(ms);
    for (int i = 0; i < 4; i++) http_model_spec_dispose(&specs[i]);
    rmdir(broken);
}

int main(int argc, char **argv)
{
    const char *data = argc > 1 ? argv[1] : "../shared/testdata";
    test_specs(data);
    test_loader(data);
    TEST_DONE();
}
