/*
 * libFuzzer target for the tokenizer: arbitrary bytes are encoded and the ids decoded with
 * real vocabularies (GPT-2 byte-level, Llama 3, Llama 2 SentencePiece-style, a Metaspace
 * normalizer tokenizer); arbitrary id sequences are decoded one-shot and streamed.
 * Properties checked (abort on violation):
 * - encode never crashes; it fails only on invalid UTF-8;
 * - byte-level tokenizers round-trip: decode(encode(x)) == x;
 * - streaming detokenization concatenates to exactly the one-shot decode.
 * Test data: $PAGODA_TESTDATA, default ../shared/testdata (relative to the project root).
 * Built and run by tests/fuzz/run.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static const char *const NAMES[] = {"gpt2", "llama3", "llama2", "metaspace-2k"};
enum { NTOK = sizeof NAMES / sizeof NAMES[0] };
static struct tok *toks[NTOK];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *td = getenv("PAGODA_TESTDATA");
    if (!td) td = "../shared/testdata";
    for (int i = 0; i < NTOK; i++) {
        char dir[4096];
        struct err e = {0};
        snprintf(dir, sizeof dir, "%s/tokenizers/%s", td, NAMES[i]);
        toks[i] = tok_load(dir, &e);
        if (!toks[i]) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", e.msg);
            abort();
        }
    }
    return 0;
}

static void check_stream(const struct tok *t, const int32_t *ids, size_t n, int skip)
{
    size_t olen, pl;
    char *one = tok_decode_len(t, ids, n, skip, &olen);
    struct tok_stream *s = tok_stream_create(t, skip);
    size_t cap = olen + 64, len = 0;
    char *acc = malloc(cap);
    for (size_t i = 0; i <= n; i++) {
        char *p = i < n ? tok_stream_push_len(s, ids[i], &pl) : tok_stream_finish_len(s, &pl);
        if (len + pl + 1 > cap) acc = realloc(acc, cap = 2 * (len + pl + 1));
        memcpy(acc + len, p, pl);
        len += pl;
        free(p);
    }
    tok_stream_destroy(s);
    if (len != olen || memcmp(acc, one, len) != 0) {
        fprintf(stderr, "stream '%.*s' != one-shot '%s'\n", (int)len, acc, one);
        abort();
    }
    free(acc);
    free(one);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int which = data[0] % NTOK, mode = data[0] / NTOK % 4;
    const struct tok *t = toks[which];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    if (mode < 2) {
        int32_t *ids;
        size_t n;
        struct err e = {0};
        if (tok_encode(t, text, len, mode, &ids, &n, &e) != 0) return 0;
        size_t blen;
        char *back = tok_decode_len(t, ids, n, 0, &blen);
        if (which <= 1 && mode == 0 && (blen != len || memcmp(back, text, len) != 0)) {
            fprintf(stderr, "byte-level round trip failed: '%.*s' -> '%s'\n", (int)len, text, back);
            abort();
        }
        free(back);
        check_stream(t, ids, n, 0);
        free(ids);
    } else {
        /* the bytes as little-endian 24-bit ids, some out of range on purpose */
        size_t n = len / 3;
        int32_t *ids = malloc((n + 1) * sizeof(int32_t));
        int32_t v = tok_vocab_size(t);
        for (size_t i = 0; i < n; i++) {
            uint32_t x = (uint32_t)data[1 + 3 * i] | (uint32_t)data[2 + 3 * i] << 8 |
                         (uint32_t)data[3 + 3 * i] << 16;
            ids[i] = x % 8 == 0 ? (int32_t)x : (int32_t)(x % (uint32_t)v);
        }
        check_stream(t, ids, n, mode == 3);
        free(ids);
    }
    return 0;
}
