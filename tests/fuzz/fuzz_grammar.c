/*
 * libFuzzer target for the structured-output compilers and matcher: the first byte picks
 * the front end (JSON Schema, regular expression, GBNF), the bytes up to the first NUL are
 * its source, the rest is fed to the matcher. Properties: compiling never crashes, leaks
 * or overruns, and returns a grammar or an error with a message; a matcher given any bytes
 * never crashes, and try_bytes agrees with accept_bytes.
 * Built and run by tests/fuzz/run.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int kind = data[0] % 3;
    const char *src = (const char *)data + 1;
    size_t n = size - 1;
    const char *nul = memchr(src, 0, n);
    size_t len = nul ? (size_t)(nul - src) : n;
    const char *rest = nul ? nul + 1 : src + n;
    size_t n_rest = nul ? n - len - 1 : 0;
    struct err e = {{0}};
    struct gram *g = kind == 0   ? gram_from_json_schema(src, len, &e)
                     : kind == 1 ? gram_from_regex(src, len, &e)
                                 : gram_from_gbnf(src, len, &e);
    if (!g) {
        if (!e.msg[0]) abort(); /* an error always has a message */
        return 0;
    }
    struct gram_matcher *m = gram_matcher_create(g);
    for (size_t i = 0; i < n_rest; i++) {
        int t = gram_matcher_try_bytes(m, rest + i, 1);
        if (gram_matcher_accept_bytes(m, rest + i, 1) != t) abort();
    }
    (void)gram_matcher_can_end(m);
    gram_matcher_destroy(m);
    gram_unref(g);
    return 0;
}
