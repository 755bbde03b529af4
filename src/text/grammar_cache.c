/*
 * The process-wide compile cache: a grammar per (kind, source text), keyed by the text's
 * 64-bit hash and confirmed by comparing the text. Requests that repeat a schema (the
 * usual agent loop) skip compilation and share one grammar, and with it its mask cache.
 * At most GRAM_CACHE_MAX entries; past that the oldest is dropped (requests using it keep
 * their references).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common/util.h"
#include "text/grammar.h"

#define GRAM_CACHE_MAX 64

struct slot {
    uint64_t h;
    enum gram_kind kind;
    char *text;
    size_t len;
    struct gram *g;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct slot slots[GRAM_CACHE_MAX];
static int next_slot;

static struct gram *compile(enum gram_kind kind, const char *text, size_t len, struct err *e)
{
    switch (kind) {
    case GRAM_JSON_SCHEMA:
        return gram_from_json_schema(text, len, e);
    case GRAM_REGEX:
        return gram_from_regex(text, len, e);
    case GRAM_GBNF:
        return gram_from_gbnf(text, len, e);
    case GRAM_JSON_OBJECT:
        return gram_json_object();
    case GRAM_TOOL_SPEC:
        return gram_from_tool_spec(text, len, e);
    }
    return NULL;
}

struct gram *gram_compile_cached(enum gram_kind kind, const char *text, size_t len, struct err *e)
{
    uint64_t h = XXH3_64bits(text, len) ^ (uint64_t)kind;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < GRAM_CACHE_MAX; i++) {
        struct slot *s = &slots[i];
        if (s->g && s->h == h && s->kind == kind && s->len == len && !memcmp(s->text, text, len)) {
            struct gram *g = gram_ref(s->g);
            pthread_mutex_unlock(&mu);
            return g;
        }
    }
    pthread_mutex_unlock(&mu);
    struct gram *g = compile(kind, text, len, e); /* outside the lock: may take a while */
    if (!g) return NULL;
    pthread_mutex_lock(&mu);
    struct slot *s = &slots[next_slot];
    next_slot = (next_slot + 1) % GRAM_CACHE_MAX;
    if (s->g) gram_unref(s->g);
    free(s->text);
    s->h = h;
    s->kind = kind;
    s->text = xmalloc(len + 1);
    memcpy(s->text, text, len);
    s->len = len;
    s->g = gram_ref(g);
    pthread_mutex_unlock(&mu);
    return g;
}
