/* POST /v1/embeddings without a server: the input forms, the prompt, the encodings and the
 * dimensions, exact response bytes, and every refusal with its status and field, on the
 * tokenizer and pooling files of testdata/embeddings/qwen3-embed-tiny. */
#include <stdlib.h>
#include <string.h>

#include "http/embed.h"
#include "test_util.h"

static struct http_model model;

static int parse(const char *json, struct http_embed *q, struct http_error *he)
{
    cJSON *body = cJSON_Parse(json);
    CHECK(body, "bad test JSON %s", json);
    memset(he, 0, sizeof *he);
    int rc = http_embed_parse(body, &model, q, he);
    cJSON_Delete(body);
    return rc;
}

static int ids_are(const struct http_embed *q, int i, const int32_t *want, int n)
{
    return q->n_input[i] == n && !memcmp(q->inputs[i], want, sizeof *want * (size_t)n);
}

static void test_inputs(void)
{
    struct http_embed q;
    struct http_error he;
    /* "Once upon a time" is [1292, 308, 1057, 261, 618] in the reference */
    const int32_t once[] = {1292, 308, 1057, 261, 618};
    CHECK(parse("{\"input\":\"Once upon a time\",\"model\":\"embed\"}", &q, &he) == 0, "%s",
          he.msg);
    CHECK(q.n_inputs == 1 && ids_are(&q, 0, once, 5), "string");
    CHECK(!q.base64 && q.dimensions == 128 && q.dim == 128 && q.pool_skip[0] == 0, "defaults");
    http_embed_dispose(&q);
    CHECK(parse("{\"input\":[\"Once upon a time\",\"a\"]}", &q, &he) == 0, "%s", he.msg);
    CHECK(q.n_inputs == 2 && ids_are(&q, 0, once, 5) && q.n_input[1] == 1 && q.inputs[1][0] == 67,
          "strings");
    http_embed_dispose(&q);
    CHECK(parse("{\"input\":[1292,308,1057,261,618]}", &q, &he) == 0, "%s", he.msg);
    CHECK(q.n_inputs == 1 && ids_are(&q, 0, once, 5), "ids");
    http_embed_dispose(&q);
    CHECK(parse("{\"input\":[[1292,308,1057,261,618],[67]],\"encoding_format\":\"base64\","
                "\"dimensions\":2,\"user\":\"u\"}",
                &q, &he) == 0,
          "%s", he.msg);
    CHECK(q.n_inputs == 2 && ids_are(&q, 0, once, 5) && q.inputs[1][0] == 67 && q.base64 &&
              q.dimensions == 2,
          "id lists");
    http_embed_dispose(&q);
    /* the prompt is prepended to the text before tokenizing */
    CHECK(parse("{\"input\":\"a\",\"prompt_name\":\"query\"}", &q, &he) == 0, "%s", he.msg);
    int32_t *ids;
    size_t n;
    struct err e = {0};
    const char *full = "Instruct: find the passage\nQuery:a";
    CHECK(tok_encode(model.tok, full, strlen(full), 1, &ids, &n, &e) == 0, "%s", e.msg);
    CHECK(q.n_inputs == 1 && ids_are(&q, 0, ids, (int)n), "prompted input");
    free(ids);
    http_embed_dispose(&q);
}

/* Exact bytes: floats as %.9g, base64 of little-endian float32, truncation renormalized. */
static void test_format(void)
{
    struct http_embed q;
    struct http_error he;
    struct http_buf b = {0};
    CHECK(parse("{\"input\":[[1,2],[3]],\"dimensions\":2}", &q, &he) == 0, "%s", he.msg);
    q.vecs[0] = 3, q.vecs[1] = 4, q.vecs[2] = 100; /* input 0: [3, 4, 100, 0...] */
    q.vecs[128] = 0.5f, q.vecs[129] = -0.5f;       /* input 1 */
    http_embed_format(&q, &model, &b);
    CHECK(!strcmp(b.p, "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
                       "\"embedding\":[0.600000024,0.800000012]},{\"object\":\"embedding\","
                       "\"index\":1,\"embedding\":[0.707106769,-0.707106769]}],\"model\":"
                       "\"embed\",\"usage\":{\"prompt_tokens\":3,\"total_tokens\":3}}"),
          "%s", b.p);
    http_buf_dispose(&b);
    http_embed_dispose(&q);
    CHECK(parse("{\"input\":[5],\"encoding_format\":\"base64\",\"dimensions\":3}", &q, &he) == 0,
          "%s", he.msg);
    q.vecs[0] = 1.0f, q.vecs[1] = -2.0f, q.vecs[2] = 0; /* renormalized: 1/sqrt5, -2/sqrt5 */
    http_embed_format(&q, &model, &b);
    /* 0x3ee4f92e, 0xbf64f92e, 0: bytes 2e f9 e4 3e 2e f9 64 bf 00 00 00 00 */
    CHECK(strstr(b.p, "\"embedding\":\"LvnkPi75ZL8AAAAA\"") != NULL, "%s", b.p);
    http_buf_dispose(&b);
    http_embed_dispose(&q);
}

static void test_refusals(void)
{
    static const struct {
        const char *body;
        int status;
        const char *param, *msg;
    } cases[] = {
        {"{}", 400, "input", "'input' is required"},
        {"{\"input\":null}", 400, "input", "'input' is required"},
        {"{\"input\":\"\"}", 400, "input", "must not be empty"},
        {"{\"input\":[]}", 400, "input", "must not be empty"},
        {"{\"input\":[\"a\",\"\"]}", 400, "input[1]", "must not be empty"},
        {"{\"input\":[[1],[]]}", 400, "input[1]", "must not be empty"},
        {"{\"input\":5}", 400, "input", "must be a string"},
        {"{\"input\":{\"a\":1}}", 400, "input", "must be a string"},
        {"{\"input\":[1,\"a\"]}", 400, "input", "must be a string"},
        {"{\"input\":[[1],\"a\"]}", 400, "input", "must be a string"},
        {"{\"input\":[1.5]}", 400, "input", "token id"},
        {"{\"input\":[2048]}", 400, "input", "(0..2047)"},
        {"{\"input\":[[1],[-1]]}", 400, "input[1]", "token id"},
        {"{\"input\":\"a\",\"encoding_format\":\"int8\"}", 400, "encoding_format", "base64"},
        {"{\"input\":\"a\",\"encoding_format\":1}", 400, "encoding_format", "string"},
        {"{\"input\":\"a\",\"dimensions\":0}", 400, "dimensions", "between 1 and 128"},
        {"{\"input\":\"a\",\"dimensions\":129}", 400, "dimensions", "between 1 and 128"},
        {"{\"input\":\"a\",\"dimensions\":\"8\"}", 400, "dimensions", "integer"},
        {"{\"input\":\"a\",\"prompt_name\":\"passage\"}", 400, "prompt_name", "'query'"},
        {"{\"input\":[1,2],\"prompt_name\":\"query\"}", 400, "prompt_name", "token ids"},
        {"{\"input\":\"a\",\"model\":\"other\"}", 404, "model", "does not exist"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct http_embed q;
        struct http_error he;
        int rc = parse(cases[i].body, &q, &he);
        CHECK(rc == -1 && he.status == cases[i].status && !strcmp(he.param, cases[i].param) &&
                  strstr(he.msg, cases[i].msg),
              "%s: rc %d, %d %s '%s'", cases[i].body, rc, he.status, he.param, he.msg);
        CHECK(q.n_inputs == 0 && !q.inputs && !q.vecs, "%s: q holds nothing", cases[i].body);
    }
    /* one token more than the context */
    struct http_embed q;
    struct http_error he;
    struct http_buf long_ids = {0};
    http_buf_puts(&long_ids, "{\"input\":[[7],[");
    for (int i = 0; i <= model.max_model_len; i++) http_buf_printf(&long_ids, "%s7", i ? "," : "");
    http_buf_puts(&long_ids, "]]}");
    CHECK(parse(long_ids.p, &q, &he) == -1 && he.status == 400 && !strcmp(he.param, "input") &&
              !strcmp(he.code, "context_length_exceeded") && strstr(he.msg, "input 1 has 65"),
          "%s %s", he.code, he.msg);
    http_buf_dispose(&long_ids);
    /* a model without pooling */
    struct pooling_config none = {0};
    snprintf(none.why, sizeof none.why, "the folder has no modules.json");
    const struct pooling_config *keep = model.pooling;
    model.pooling = &none;
    CHECK(parse("{\"input\":\"a\"}", &q, &he) == -1 && he.status == 400 &&
              !strcmp(he.param, "model") && strstr(he.msg, "cannot embed: the folder has no"),
          "%s", he.msg);
    model.pooling = keep;
}

int main(int argc, char **argv)
{
    const char *data = argc > 1 ? argv[1] : "../shared/testdata";
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/embeddings/qwen3-embed-tiny", data);
    struct err e = {0};
    struct tok *t = tok_load(dir, &e);
    struct pooling_config pc;
    if (!t || pooling_config_load(&pc, dir, 128, &e)) {
        fprintf(stderr, "cannot load %s: %s\n", dir, e.msg);
        return 1;
    }
    /* a context of 64 tokens, for the length check */
    model = (struct http_model){
        .name = "embed", .tok = t, .vocab = 2048, .max_model_len = 64, .pooling = &pc};
    test_inputs();
    test_format();
    test_refusals();
    pooling_config_dispose(&pc);
    tok_destroy(t);
    TEST_DONE();
}
