/*
 * Tokenizer tests: every golden case of ../shared/testdata/tokenizers/<name>/golden.json
 * (encode without and with special tokens, decode), every model folder's prompts
 * (models/<name>/golden.json prompt_ids, made with the default add_special_tokens=True), the
 * streaming-equals-one-shot property on every golden, rejection of unsupported components,
 * and exact vectors for the normalizers, pre-tokenizers and decoders.
 *
 * argv[1] = the testdata folder. Missing data fails the test.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"

#include "test_util.h"

static const char *testdata;

static cJSON *read_json(const char *path)
{
    struct err e = {0};
    size_t len;
    char *txt = util_read_file(path, &len, &e);
    if (!txt) {
        fprintf(stderr, "FAIL: missing test data: %s\n", e.msg);
        exit(1);
    }
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!j) {
        fprintf(stderr, "FAIL: %s is not JSON\n", path);
        exit(1);
    }
    return j;
}

static struct tok *load_or_die(const char *dir)
{
    struct err e = {0};
    struct tok *t = tok_load(dir, &e);
    if (!t) {
        fprintf(stderr, "FAIL: loading %s: %s\n", dir, e.msg);
        exit(1);
    }
    return t;
}

static int ids_equal(const int32_t *a, size_t n, const cJSON *arr)
{
    if ((int)n != cJSON_GetArraySize(arr)) return 0;
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) if ((int32_t)x->valuedouble != a[i++]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *a, size_t n)
{
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 60; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "%s\n", n > 60 ? " ..." : "");
}

static int32_t *json_ids(const cJSON *arr, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *v = xmalloc((*n + 1) * sizeof(int32_t));
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) v[i++] = (int32_t)x->valuedouble;
    return v;
}

/* Streams ids one at a time and checks the concatenation equals tok_decode, and that no
 * piece ends inside a UTF-8 character. */
static void check_stream(const struct tok *t, const int32_t *ids, size_t n, int skip,
                         const char *label)
{
    size_t olen;
    char *one = tok_decode_len(t, ids, n, skip, &olen);
    struct tok_stream *s = tok_stream_create(t, skip);
    struct tok_buf acc = {0};
    int split_char = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t pl;
        char *piece = i < n ? tok_stream_push_len(s, ids[i], &pl) : tok_stream_finish_len(s, &pl);
        if (tok_utf8_check(piece, pl) != pl) split_char = 1;
        tok_buf_put(&acc, piece, pl);
        free(piece);
    }
    tok_stream_destroy(s);
    CHECK(acc.len == olen && (!acc.len || !memcmp(acc.p, one, acc.len)),
          "%s: stream (skip=%d) '%s' != one-shot '%s'", label, skip, acc.p ? acc.p : "", one);
    CHECK(!split_char, "%s: a streamed piece split a UTF-8 character", label);
    tok_buf_dispose(&acc);
    free(one);
}

static void test_golden_tokenizer(const char *name)
{
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tokenizers/%s", testdata, name);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    cJSON *g = read_json(path);
    struct tok *t = load_or_die(dir);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(g, "cases"), *c;
    int ncase = 0, before = test_failures;
    cJSON_ArrayForEach(c, cases)
    {
        const char *text = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "ids");
        const cJSON *want_sp = cJSON_GetObjectItemCaseSensitive(c, "ids_with_special");
        const char *decoded = cJSON_GetObjectItemCaseSensitive(c, "decoded")->valuestring;
        struct err e = {0};
        int32_t *ids;
        size_t n;
        char label[160];
        snprintf(label, sizeof label, "%s case %d", name, ncase);
        int rc = tok_encode(t, text, strlen(text), 0, &ids, &n, &e);
        CHECK(rc == 0, "%s: encode failed: %s", label, e.msg);
        if (rc == 0) {
            int ok = ids_equal(ids, n, want);
            CHECK(ok, "%s: ids differ for text '%.80s'", label, text);
            if (!ok) print_ids("got", ids, n);
            free(ids);
        }
        rc = tok_encode(t, text, strlen(text), 1, &ids, &n, &e);
        CHECK(rc == 0 && ids_equal(ids, n, want_sp), "%s: ids_with_special differ", label);
        if (rc == 0) free(ids);

        size_t wn;
        int32_t *w = json_ids(want, &wn);
        char *dec = tok_decode(t, w, wn, 0);
        CHECK(!strcmp(dec, decoded), "%s: decoded '%s' != '%s'", label, dec, decoded);
        free(dec);
        check_stream(t, w, wn, 0, label);
        free(w);
        w = json_ids(want_sp, &wn);
        check_stream(t, w, wn, 0, label);
        check_stream(t, w, wn, 1, label);
        free(w);
        ncase++;
    }
    CHECK(ncase > 0, "%s: golden.json has no cases", name);
    printf("tokenizers/%s: %d cases, %s\n", name, ncase, test_failures == before ? "ok" : "FAILED");
    tok_destroy(t);
    cJSON_Delete(g);
}

static void test_model_prompts(void)
{
    char mdir[4096];
    snprintf(mdir, sizeof mdir, "%s/models", testdata);
    DIR *d = opendir(mdir);
    CHECK(d != NULL, "missing test data: %s", mdir);
    if (!d) return;
    int nmodels = 0, nprompts = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char dir[4400], path[4600];
        snprintf(dir, sizeof dir, "%s/%s", mdir, de->d_name);
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if (access(path, R_OK) != 0) continue;
        snprintf(path, sizeof path, "%s/golden.json", dir);
        cJSON *g = read_json(path);
        struct tok *t = load_or_die(dir);
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(g, "cases"))
        {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(c, "text");
            if (!cJSON_IsString(text)) continue;
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "prompt_ids");
            int32_t *ids;
            size_t n;
            struct err e = {0};
            int rc = tok_encode(t, text->valuestring, strlen(text->valuestring), 1, &ids, &n, &e);
            CHECK(rc == 0 && ids_equal(ids, n, want), "models/%s: prompt '%s' encodes differently",
                  de->d_name, text->valuestring);
            if (rc == 0) free(ids);
            size_t wn;
            int32_t *w = json_ids(want, &wn);
            check_stream(t, w, wn, 1, de->d_name);
            free(w);
            nprompts++;
        }
        tok_destroy(t);
        cJSON_Delete(g);
        nmodels++;
    }
    closedir(d);
    CHECK(nmodels >= 10 && nprompts >= 40, "expected the model folders (found %d, %d prompts)",
          nmodels, nprompts);
    printf("models: %d folders, %d prompts\n", nmodels, nprompts);
}

/* ---- synthetic tokenizers written to a temp folder ---- */

static char tmpdir[256];

static struct tok *load_text(const char *json, struct err *e)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
    FILE *f = fopen(path, "wb");
    fputs(json, f);
    fclose(f);
    return tok_load(tmpdir, e);
}

/* A tiny byte-free BPE: vocab of single chars a..e, space-ish, and merges ab, abc. */
static const char *mini(const char *model_extra, const char *norm, const char *pre,
                        const char *post, const char *dec, const char *added)
{
    static char buf[8192];
    snprintf(buf, sizeof buf,
             "{\"added_tokens\":%s,\"normalizer\":%s,\"pre_tokenizer\":%s,"
             "\"post_processor\":%s,\"decoder\":%s,"
             "\"model\":{\"type\":\"BPE\",%s\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"c\":3,"
             "\"ab\":4,\"abc\":5,\" \":6,\"\\u2581\":7,\"\\u2581a\":8,\"<0x41>\":9,\"<0xC3>\":10,"
             "\"<0xA9>\":11,\"d\":12,\"<s>\":13,\"<m>\":14,\"\\u2581ab\":15},"
             "\"merges\":[\"a b\",[\"ab\",\"c\"],\"\\u2581 a\",\"\\u2581a b\"]}}",
             added ? added : "[]", norm ? norm : "null", pre ? pre : "null", post ? post : "null",
             dec ? dec : "null", model_extra ? model_extra : "");
    return buf;
}

static void expect_encode(const struct tok *t, const char *text, int add_special,
                          const int32_t *want, size_t wn, const char *label)
{
    int32_t *ids;
    size_t n;
    struct err e = {0};
    int rc = tok_encode(t, text, strlen(text), add_special, &ids, &n, &e);
    int ok = rc == 0 && n == wn && (!n || !memcmp(ids, want, n * sizeof(int32_t)));
    CHECK(ok, "%s: encode('%s') wrong (%s)", label, text, rc ? e.msg : "ids differ");
    if (!ok && rc == 0) print_ids("got", ids, n);
    if (rc == 0) free(ids);
}

static void test_unsupported(void)
{
    struct {
        const char *json, *needle;
    } cases[] = {
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}",
         "model type 'Unigram' is not supported"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}",
         "model type 'WordPiece' is not supported"},
        {NULL, "normalizer type 'Precompiled' is not supported"},
        {NULL, "pre_tokenizer type 'UnicodeScripts' is not supported"},
        {NULL, "decoder type 'CTC' is not supported"},
        {NULL, "post_processor type 'Foo' is not supported"},
        {"{not json", "invalid JSON"},
    };
    char json[4][8192];
    snprintf(json[0], sizeof json[0], "%s",
             mini(NULL, "{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"\"}", NULL, NULL,
                  NULL, NULL));
    snprintf(json[1], sizeof json[1], "%s",
             mini(NULL, NULL, "{\"type\":\"UnicodeScripts\"}", NULL, NULL, NULL));
    snprintf(json[2], sizeof json[2], "%s",
             mini(NULL, NULL, NULL, NULL, "{\"type\":\"CTC\"}", NULL));
    snprintf(json[3], sizeof json[3], "%s",
             mini(NULL, NULL, NULL, "{\"type\":\"Foo\"}", NULL, NULL));
    for (int i = 2; i <= 5; i++) cases[i].json = json[i - 2];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct err e = {0};
        struct tok *t = load_text(cases[i].json, &e);
        CHECK(t == NULL && strstr(e.msg, cases[i].needle), "unsupported %zu: got '%s'", i, e.msg);
        tok_destroy(t);
    }
    struct err e = {0};
    CHECK(tok_load("/nonexistent-dir", &e) == NULL && strstr(e.msg, "tokenizer.json"),
          "missing folder: '%s'", e.msg);
}

static void test_bpe_and_added(void)
{
    struct err e = {0};
    struct tok *t = load_text(mini("\"unk_token\":\"<unk>\",\"fuse_unk\":true,", NULL, NULL,
                                   "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
                                   "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\","
                                   "\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\","
                                   "\"ids\":[13],\"tokens\":[\"<s>\"]}}}",
                                   NULL,
                                   "[{\"id\":13,\"content\":\"<s>\",\"special\":true,"
                                   "\"normalized\":false},{\"id\":14,\"content\":\"<m>\","
                                   "\"special\":false,\"normalized\":false,\"lstrip\":true,"
                                   "\"rstrip\":true},{\"id\":16,\"content\":\"cd\","
                                   "\"special\":false,\"normalized\":false,\"single_word\":true}]"),
                              &e);
    CHECK(t != NULL, "mini tokenizer: %s", e.msg);
    if (!t) return;
    CHECK(tok_vocab_size(t) == 17, "vocab size %d", tok_vocab_size(t));
    expect_encode(t, "abc", 0, (int32_t[]){5}, 1, "merges to abc");
    expect_encode(t, "abcab", 0, (int32_t[]){5, 4}, 2, "abc ab");
    expect_encode(t, "abc", 1, (int32_t[]){13, 5}, 2, "template BOS");
    expect_encode(t, "axxb", 0, (int32_t[]){1, 0, 2}, 3, "fused unk");
    expect_encode(t, "a <m>  b", 0, (int32_t[]){1, 14, 2}, 3, "lstrip+rstrip eat spaces");
    expect_encode(t, "<s>a", 0, (int32_t[]){13, 1}, 2, "special in text");
    expect_encode(t, "a cd b", 0, (int32_t[]){1, 6, 16, 6, 2}, 5, "single_word alone");
    expect_encode(t, "acd", 0, (int32_t[]){1, 3, 12}, 3, "single_word inside a word");
    char *s = tok_decode(t, (int32_t[]){13, 5, 6, 14}, 4, 1);
    CHECK(!strcmp(s, "abc   <m>"), "no decoder joins with spaces, skip special: '%s'", s);
    free(s);
    int32_t *ids;
    size_t n;
    CHECK(tok_encode(t, "a\xff", 2, 0, &ids, &n, &e) == -1 && strstr(e.msg, "UTF-8"),
          "bad UTF-8 rejected: '%s'", e.msg);
    s = tok_decode(t, (int32_t[]){5, 999, -3, 1}, 4, 0);
    CHECK(!strcmp(s, "abc a"), "unknown ids skipped: '%s'", s);
    free(s);
    tok_destroy(t);

    /* byte fallback and the llama-style decoder chain */
    t = load_text(mini("\"byte_fallback\":true,", NULL,
                       "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":"
                       "\"first\",\"split\":false}",
                       NULL,
                       "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
                       "{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
                       "{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,"
                       "\"stop\":0}]}",
                       "[{\"id\":13,\"content\":\"<s>\",\"special\":true,\"normalized\":false}]"),
                  &e);
    CHECK(t != NULL, "byte fallback tokenizer: %s", e.msg);
    if (!t) return;
    expect_encode(t, "abc", 0, (int32_t[]){7, 5}, 2, "prepend first; lowest rank wins");
    expect_encode(t, "<s>abc", 0, (int32_t[]){13, 5}, 2, "no prepend after a special token");
    expect_encode(t, "ab", 0, (int32_t[]){7, 4}, 2, "a b (rank 0) beats \u2581 a (rank 2)");
    expect_encode(t, "a", 0, (int32_t[]){8}, 1, "\u2581 a merges");
    expect_encode(t, "A\xc3\xa9", 0, (int32_t[]){7, 9, 10, 11}, 4, "byte fallback");
    s = tok_decode(t, (int32_t[]){8, 9, 10, 11}, 4, 0);
    CHECK(!strcmp(s, "aA\xc3\xa9"), "byte fallback decode: '%s'", s);
    free(s);
    s = tok_decode(t, (int32_t[]){8, 10, 9}, 3, 0);
    CHECK(!strcmp(s, "a\xef\xbf\xbd\xef\xbf\xbd"), "invalid byte run: one U+FFFD per byte: '%s'",
          s);
    free(s);
    s = tok_decode(t, (int32_t[]){10, 10, 1}, 3, 0);
    CHECK(!strcmp(s, "\xef\xbf\xbd\xef\xbf\xbd"
                     "a"),
          "one U+FFFD per byte: '%s'", s);
    free(s);
    int32_t seqs[][5] = {
        {8, 10, 11, 7, 1}, {7, 7, 8, 10, 9}, {10, 11, 10, 11, 7}, {7, 10, 7, 11, 7}};
    for (int i = 0; i < 4; i++) check_stream(t, seqs[i], 5, 0, "byte fallback stream");
    tok_destroy(t);
}

static int pieces_are(const char *pre_json, const char *text, const char *const *want, int nw)
{
    cJSON *j = cJSON_Parse(pre_json);
    struct tok_pre p;
    struct err e = {0};
    tok_bytemap_init();
    if (tok_pre_parse(j, &p, &e) != 0) {
        fprintf(stderr, "  parse: %s\n", e.msg);
        cJSON_Delete(j);
        return 0;
    }
    cJSON_Delete(j);
    struct tok_buf arena = {0};
    struct tok_pieces in = {0}, out = {0};
    struct tok_matcher m;
    tok_matcher_init(&m);
    tok_buf_put(&arena, text, strlen(text));
    tok_pieces_push(&in, 0, strlen(text), 1);
    int ok = tok_pre_apply(&p, &arena, &in, &out, &m) == 0 && (int)out.n == nw;
    for (int i = 0; ok && i < nw; i++)
        ok = out.v[i].len == strlen(want[i]) &&
             !memcmp(arena.p + out.v[i].off, want[i], out.v[i].len);
    if (!ok) {
        fprintf(stderr, "  got %zu pieces:", out.n);
        for (size_t i = 0; i < out.n; i++)
            fprintf(stderr, " [%.*s]", (int)out.v[i].len, arena.p + out.v[i].off);
        fprintf(stderr, "\n");
    }
    tok_matcher_dispose(&m);
    tok_buf_dispose(&arena);
    free(in.v);
    free(out.v);
    tok_pre_dispose(&p);
    return ok;
}

#define PIECES(json, text, ...)                                                                    \
    do {                                                                                           \
        const char *const w_[] = {__VA_ARGS__};                                                    \
        CHECK(pieces_are(json, text, w_, (int)(sizeof w_ / sizeof w_[0])), "pre %s on '%s'", json, \
              text);                                                                               \
    } while (0)

static void test_pre_tokenizers(void)
{
    const char *txt = "the-final--countdown";
    PIECES("{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Removed\"}", txt,
           "the", "final", "countdown");
    PIECES("{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Isolated\"}", txt,
           "the", "-", "final", "-", "-", "countdown");
    PIECES(
        "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"MergedWithPrevious\"}",
        txt, "the-", "final-", "-", "countdown");
    PIECES("{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"MergedWithNext\"}",
           txt, "the", "-final", "-", "-countdown");
    PIECES("{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Contiguous\"}", txt,
           "the", "-", "final", "--", "countdown");
    PIECES("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a-z]+\"},\"behavior\":\"Removed\","
           "\"invert\":true}",
           txt, "the", "final", "countdown");
    PIECES("{\"type\":\"Digits\",\"individual_digits\":true}", "a123b", "a", "1", "2", "3", "b");
    PIECES("{\"type\":\"Digits\",\"individual_digits\":false}", "a123b", "a", "123", "b");
    PIECES("{\"type\":\"Punctuation\"}", "Hey, you!?", "Hey", ",", " you", "!", "?");
    PIECES("{\"type\":\"Whitespace\"}", "Hey man!  How's it", "Hey", "man", "!", "How", "'", "s",
           "it");
    PIECES("{\"type\":\"WhitespaceSplit\"}", " Hey  man!\tok ", "Hey", "man!", "ok");
    PIECES("{\"type\":\"Metaspace\",\"prepend_scheme\":\"always\",\"split\":true}", "Hey   friend!",
           "\xe2\x96\x81Hey", "\xe2\x96\x81", "\xe2\x96\x81",
           "\xe2\x96\x81"
           "friend!");
    PIECES("{\"type\":\"Metaspace\",\"prepend_scheme\":\"never\",\"split\":true}", "Hey friend",
           "Hey",
           "\xe2\x96\x81"
           "friend");
    PIECES("{\"type\":\"Metaspace\",\"prepend_scheme\":\"first\",\"split\":false}", "a b",
           "\xe2\x96\x81"
           "a\xe2\x96\x81"
           "b");
    PIECES("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}", "Hello world",
           "\xc4\xa0Hello", "\xc4\xa0world");
    PIECES("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}", "a b\n",
           "a\xc4\xa0"
           "b\xc4\x8a");
    PIECES("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"WhitespaceSplit\"},{\"type\":"
           "\"Digits\",\"individual_digits\":true}]}",
           "ab12 c3", "ab", "1", "2", "c", "3");
}

static void expect_norm(enum tok_nf form, const char *in, const char *want, const char *label)
{
    struct tok_buf b = {0};
    tok_unicode_normalize(form, in, strlen(in), &b);
    CHECK(b.len == strlen(want) && !memcmp(b.p, want, b.len), "%s: got '%s'", label,
          b.p ? b.p : "");
    tok_buf_dispose(&b);
}

static void test_normalizers(void)
{
    expect_norm(TOK_NF_C, "e\xcc\x81", "\xc3\xa9", "NFC composes e + acute");
    expect_norm(TOK_NF_D, "\xc3\xa9", "e\xcc\x81", "NFD decomposes e-acute");
    expect_norm(TOK_NF_C, "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81",
                "NFC composes Hangul LVT");
    expect_norm(TOK_NF_D, "\xea\xb0\x81", "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "NFD Hangul");
    expect_norm(TOK_NF_KC, "\xef\xac\x81", "fi", "NFKC fi ligature");
    expect_norm(TOK_NF_KC, "\xe2\x91\xa0", "1", "NFKC circled one");
    expect_norm(TOK_NF_C, "\xef\xac\x81", "\xef\xac\x81", "NFC keeps the ligature");
    /* a + dot below + acute, given in the wrong order: reordered, then composed */
    expect_norm(TOK_NF_C, "a\xcc\x81\xcc\xa3", "\xe1\xba\xa1\xcc\x81", "NFC reorders marks");
    expect_norm(TOK_NF_C, "\xe2\x84\xab", "\xc3\x85", "NFC singleton Angstrom");
    struct tok_buf b = {0};
    tok_unicode_lowercase("\xc3\x80"
                          "BC\xc4\xb0\xce\xa3",
                          8, &b);
    CHECK(!strcmp(b.p, "\xc3\xa0"
                       "bci\xcc\x87\xcf\x83"),
          "lowercase: '%s'", b.p);
    tok_buf_dispose(&b);

    struct err e = {0};
    struct tok *t = load_text(mini(NULL,
                                   "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Strip\","
                                   "\"strip_left\":true,\"strip_right\":true},{\"type\":"
                                   "\"Lowercase\"},{\"type\":\"Replace\",\"pattern\":{\"Regex\":"
                                   "\"x+\"},\"content\":\"b\"},{\"type\":\"NFKC\"}]}",
                                   NULL, NULL, NULL, NULL),
                              &e);
    CHECK(t != NULL, "normalizer tokenizer: %s", e.msg);
    if (t) {
        expect_encode(t, "  AXXXC\t", 0, (int32_t[]){5}, 1, "strip, lowercase, regex replace");
        tok_destroy(t);
    }
}

static void test_decoders(void)
{
    /* llama3: an emoji split over byte-level tokens streams without splitting a character */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tokenizers/llama3", testdata);
    struct tok *t = load_or_die(dir);
    const char *txt = "x \xf0\x9f\xa6\x99\xf0\x9f\xa6\x99 \xe4\xbd\xa0\xe5\xa5\xbd";
    int32_t *ids;
    size_t n;
    struct err e = {0};
    CHECK(tok_encode(t, txt, strlen(txt), 1, &ids, &n, &e) == 0, "%s", e.msg);
    check_stream(t, ids, n, 0, "llama3 emoji");
    free(ids);
    /* the emoji's tokens cut short: the incomplete tail becomes one U+FFFD at the end */
    CHECK(tok_encode(t, "\xf0\x9f\xa6\x99", 4, 0, &ids, &n, &e) == 0 && n >= 2, "emoji tokens");
    char *s = tok_decode(t, ids, n - 1, 1);
    check_stream(t, ids, n - 1, 1, "llama3 cut");
    CHECK(!strcmp(s, "\xef\xbf\xbd"), "cut sequence decodes lossily: '%s'", s);
    free(s);
    free(ids);
    CHECK(tok_token_id(t, "<|eot_id|>") == 128009, "token id of <|eot_id|>");
    CHECK(tok_bos_id(t) == 128000 && tok_eos_id(t) == 128009, "bos/eos from tokenizer_config.json");
    CHECK(tok_is_special(t, 128000) && !tok_is_special(t, 100), "special flags");
    tok_destroy(t);

    /* Metaspace decoder: the first token loses its leading replacement, later ones keep it */
    t = load_text(mini(NULL, NULL, NULL, NULL,
                       "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":"
                       "\"always\",\"split\":true}",
                       NULL),
                  &e);
    CHECK(t != NULL, "metaspace decoder: %s", e.msg);
    if (t) {
        s = tok_decode(t, (int32_t[]){8, 8, 7, 1}, 4, 0);
        CHECK(!strcmp(s, "a a a"), "metaspace decode: '%s'", s);
        free(s);
        check_stream(t, (int32_t[]){8, 8, 7, 1}, 4, 0, "metaspace stream");
        tok_destroy(t);
    }
    /* Strip with stop after Fuse holds the tail until the end */
    t = load_text(
        mini(NULL, NULL, NULL, NULL,
             "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Strip\","
             "\"content\":\"a\",\"start\":2,\"stop\":1},{\"type\":\"Replace\",\"pattern\":"
             "{\"String\":\"bc\"},\"content\":\"X\"}]}",
             NULL),
        &e);
    CHECK(t != NULL, "strip decoder: %s", e.msg);
    if (t) {
        int32_t q[] = {1, 1, 1, 2, 3, 6, 4, 3, 1};
        s = tok_decode(t, q, 9, 0);
        CHECK(!strcmp(s, "aX aX"), "fused strip/replace: '%s'", s);
        free(s);
        check_stream(t, q, 9, 0, "fused strip/replace stream");
        tok_destroy(t);
    }
}

/* Inputs of 16 KiB or more use a word cache; it must not change a single id. GPT-2's
 * pre-tokenization is unchanged by cutting just before a blank line, so the corpus encoded
 * whole (cached) must equal the concatenation of small chunks (uncached). */
static void test_word_cache_is_transparent(void)
{
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tokenizers/gpt2", testdata);
    snprintf(path, sizeof path, "%s/corpus/tinyshakespeare.txt", testdata);
    struct err e = {0};
    size_t len;
    char *text = util_read_file(path, &len, &e);
    CHECK(text != NULL, "missing corpus: %s", e.msg);
    if (!text) return;
    if (len > 300000) len = 300000;
    while (len && text[len - 1] != '.') len--; /* end on a complete sentence */
    struct tok *t = load_or_die(dir);
    int32_t *whole, *part;
    size_t nw, np;
    CHECK(tok_encode(t, text, len, 0, &whole, &nw, &e) == 0, "%s", e.msg);
    struct tok_ids acc = {0};
    size_t start = 0;
    while (start < len) {
        size_t end = start + 8000 < len ? start + 8000 : len;
        while (end < len && end > start + 1 && !(text[end] == '\n' && text[end + 1] == '\n')) end--;
        if (end <= start + 1) end = start + 8000 < len ? start + 8000 : len;
        CHECK(tok_encode(t, text + start, end - start, 0, &part, &np, &e) == 0, "%s", e.msg);
        for (size_t i = 0; i < np; i++) tok_ids_push(&acc, part[i]);
        free(part);
        start = end;
    }
    CHECK(acc.n == nw && !memcmp(acc.v, whole, nw * sizeof(int32_t)),
          "cached encode differs from chunked encode (%zu vs %zu ids)", nw, acc.n);
    free(acc.v);
    free(whole);
    free(text);
    tok_destroy(t);
}

static void test_lossy_utf8(void)
{
    /* expected outputs follow Rust's from_utf8_lossy (maximal subparts) */
    struct {
        const char *in, *want;
    } v[] = {
        {"a\x80"
         "b",
         "a\xef\xbf\xbd"
         "b"},
        {"\xe2\x82"
         "a",
         "\xef\xbf\xbd"
         "a"},
        {"\xf0\x9f\x98", "\xef\xbf\xbd"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe2\x82\xac", "\xe2\x82\xac"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        size_t len = strlen(v[i].in);
        for (size_t cut = 0; cut <= len; cut++) { /* any split into two feeds gives the same */
            struct tok_utf8_lossy u = {{0}, 0};
            struct tok_buf b = {0};
            tok_utf8_lossy_feed(&u, (const unsigned char *)v[i].in, cut, 0, &b);
            tok_utf8_lossy_feed(&u, (const unsigned char *)v[i].in + cut, len - cut, 1, &b);
            CHECK(b.len == strlen(v[i].want) && !memcmp(b.p, v[i].want, b.len), "lossy %zu cut %zu",
                  i, cut);
            tok_buf_dispose(&b);
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_tokenizer TESTDATA_DIR\n");
        return 2;
    }
    testdata = argv[1];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pagoda-tok-test-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const char *names[] = {"gpt2", "llama3", "llama2", "bytelevel-2k", "metaspace-2k"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) test_golden_tokenizer(names[i]);
    test_model_prompts();
    test_unsupported();
    test_bpe_and_added();
    test_pre_tokenizers();
    test_normalizers();
    test_decoders();
    test_lossy_utf8();
    test_word_cache_is_transparent();
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
    unlink(path);
    rmdir(tmpdir);
    printf("%d checks, %d failures\n", test_checks, test_failures);
    return test_failures ? 1 : 0;
}
