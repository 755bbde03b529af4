/* Minimal test helpers: CHECK prints file:line and the failed condition and counts it. */
#ifndef PAGODA_TESTS_TEST_UTIL_H
#define PAGODA_TESTS_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

static int test_failures, test_checks;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

#define TEST_DONE()                                                                                \
    do {                                                                                           \
        if (test_failures) {                                                                       \
            fprintf(stderr, "%d check(s) failed\n", test_failures);                                \
            return 1;                                                                              \
        }                                                                                          \
        printf("all checks passed\n");                                                             \
        return 0;                                                                                  \
    } while (0)

#endif
