#include "common/scratch.h"

#include <pthread.h>
#include <stdlib.h>

#include "common/util.h"

struct scratch {
    float *p[SCRATCH_SLOTS];
    size_t cap[SCRATCH_SLOTS];
};

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void release(void *v)
{
    struct scratch *s = v;
    for (int i = 0; i < SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void make_key(void)
{
    pthread_key_create(&key, release);
}

float *scratch_get(enum scratch_slot slot, size_t floats)
{
    pthread_once(&once, make_key);
    struct scratch *s = pthread_getspecific(key);
    if (!s) {
        s = xcalloc(1, sizeof *s);
        pthread_setspecific(key, s);
    }
    if (floats > s->cap[slot]) {
        free(s->p[slot]);
        s->p[slot] = NULL;
        if (posix_memalign((void **)&s->p[slot], 64, floats * sizeof(float)) != 0)
            s->p[slot] = xmalloc(floats * sizeof(float));
        s->cap[slot] = floats;
    }
    return s->p[slot];
}
