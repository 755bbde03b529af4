/*
 * Tool-call and reasoning tags that the tokenizer holds as special tokens, as the real Gemma 4
 * (<|tool_call>, <tool_call|>, <|"|>, <|channel>, <channel|>) and gpt-oss (<|start|>,
 * <|channel|>, <|message|>, <|constrain|>, <|end|>, <|call|>, <|return|>) tokenizers do. The
 * shipped tiny tokenizers hold none, so the test writes a copy of llama-tiny whose last
 * vocabulary entries (and the merges that make them) are replaced by such special tokens,
 * plus one unrelated special token, with <|call|> and <|return|> as end-of-sequence ids as
 * gpt-oss has them. Checked: the grammar vocabulary holds exactly the tags (behind
 * GRAM_TAG_MARK); masks allow a tag token exactly where a tool grammar expects the tag; a
 * lazy grammar switches on at the tag token; required, named and auto tool choices for
 * gemma4 and harmony, run greedily through the engine with the random-weight model, give
 * outputs that the parsers turn into valid calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "http/request.h"
#include "sched/engine.h"
#include "test_util.h"

static const char *const gemma_tags[] = {"<|tool_call>", "<tool_call|>", "<|\"|>", "<|channel>",
                                         "<channel|>"};
static const char *const harmony_tags_[] = {"<|start|>", "<|channel|>",   "<|message|>",
                                            "<|end|>",   "<|constrain|>", "<|call|>",
                                            "<|return|>"};
#define N_GEMMA   5
#define N_HARMONY 7
#define N_TAGS    (N_GEMMA + N_HARMONY + 1) /* and an unrelated special token */

static char dir[64];
static const char *files[] = {"config.json", "model.safetensors", "tokenizer_config.json"};
static int32_t tag_id[N_TAGS];                        /* gemma's, harmony's, then <|image|> */
static const char *all_tags[N_GEMMA + N_HARMONY + 1]; /* for the engine: NULL-terminated */

/* The copy: the last N_TAGS ids become special added tokens. */
static int make_model(const char *src)
{
    strcpy(dir, "/tmp/pagoda-tags-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    char a[1200], b[1200];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (symlink(a, b)) return -1;
    }
    snprintf(a, sizeof a, "%s/tokenizer.json", src);
    char *text = util_read_file(a, NULL, NULL);
    cJSON *tj = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!tj) return -1;
    cJSON *model = cJSON_GetObjectItem(tj, "model"), *vocab = cJSON_GetObjectItem(model, "vocab");
    cJSON *merges = cJSON_GetObjectItem(model, "merges"),
          *added = cJSON_GetObjectItem(tj, "added_tokens");
    int V = cJSON_GetArraySize(vocab);
    /* drop the entries and the merges that make them (BPE numbers merges' results in order,
     * so the last ids are made by no other merge) */
    for (cJSON *x = vocab->child, *next; x; x = next) {
        next = x->next;
        if (x->valueint >= V - N_TAGS) cJSON_Delete(cJSON_DetachItemViaPointer(vocab, x));
    }
    for (cJSON *x = merges->child, *next; x; x = next) {
        next = x->next;
        char joined[256] = "";
        if (cJSON_IsString(x)) { /* "a b" */
            const char *sp = strchr(x->valuestring, ' ');
            if (sp)
                snprintf(joined, sizeof joined, "%.*s%s", (int)(sp - x->valuestring),
                         x->valuestring, sp + 1);
        } else {
            snprintf(joined, sizeof joined, "%s%s", cJSON_GetArrayItem(x, 0)->valuestring,
                     cJSON_GetArrayItem(x, 1)->valuestring);
        }
        if (!cJSON_GetObjectItemCaseSensitive(vocab, joined))
            cJSON_Delete(cJSON_DetachItemViaPointer(merges, x));
    }
    for (int i = 0; i < N_TAGS; i++) {
        const char *s = i < N_GEMMA      ? gemma_tags[i]
                        : i < N_TAGS - 1 ? harmony_tags_[i - N_GEMMA]
                                         : "<|image|>";
        tag_id[i] = V - N_TAGS + i;
        if (i < N_TAGS - 1) all_tags[i] = s;
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", tag_id[i]);
        cJSON_AddStringToObject(t, "content", s);
        cJSON_AddFalseToObject(t, "single_word");
        cJSON_AddFalseToObject(t, "lstrip");
        cJSON_AddFalseToObject(t, "rstrip");
        cJSON_AddFalseToObject(t, "normalized");
        cJSON_AddTrueToObject(t, "special");
        cJSON_AddItemToArray(added, t);
    }
    all_tags[N_TAGS - 1] = NULL;
    char *out = cJSON_PrintUnformatted(tj);
    cJSON_Delete(tj);
    snprintf(b, sizeof b, "%s/tokenizer.json", dir);
    FILE *f = fopen(b, "w");
    int ok = f && fputs(out, f) >= 0;
    if (f) fclose(f);
    free(out);
    /* gpt-oss ends a turn at <|return|> and a call at <|call|> */
    snprintf(b, sizeof b, "%s/generation_config.json", dir);
    f = fopen(b, "w");
    ok = ok && f &&
         fprintf(f, "{\"eos_token_id\": [2, %d, %d]}\n", tag_id[N_GEMMA + 5], tag_id[N_GEMMA + 6]) >
             0;
    if (f) fclose(f);
    return ok ? 0 : -1;
}

static void remove_model(void)
{
    char p[1200];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    unlink(p);
    rmdir(dir);
}

#define CALL_ID   (tag_id[N_GEMMA + 5])
#define RETURN_ID (tag_id[N_GEMMA + 6])

/* ---- the grammar vocabulary and masks ------------------------------------------------- */

static int allowed(const uint32_t *mask, int32_t id)
{
    return mask[id >> 5] >> (id & 31) & 1;
}

/* Number of ids in the mask among the tag tokens. */
static int tags_allowed(const uint32_t *mask)
{
    int n = 0;
    for (int i = 0; i < N_TAGS; i++) n += allowed(mask, tag_id[i]);
    return n;
}

static void test_vocab_and_masks(const struct tok *t)
{
    struct err e = {0};
    int32_t V = tok_vocab_size(t);
    int32_t eos[3] = {2, CALL_ID, RETURN_ID};
    struct gram_vocab *v = gram_vocab_create(t, V, eos, 3, all_tags, &e);
    CHECK(v, "%s", e.msg);
    if (!v) return;
    /* the tags behind the marker, the unrelated special token and eos left out */
    for (int i = 0; i < N_TAGS; i++) {
        size_t len;
        const char *b = gram_vocab_token(v, tag_id[i], &len);
        const char *want = i < N_TAGS - 1 ? all_tags[i] : NULL;
        CHECK(want ? b && len == strlen(want) + 1 && b[0] == GRAM_TAG_MARK &&
                         !memcmp(b + 1, want, len - 1)
                   : !b,
              "tag %d: %.*s", i, (int)len, b ? b : "");
    }
    size_t len;
    CHECK(!gram_vocab_token(v, 2, &len), "eos <|im_end|> in the vocabulary");
    int words = (V + 31) / 32;
    uint32_t *mask = xmalloc(sizeof *mask * (size_t)words);

    /* Gemma 4: the call's tags and the string marks are the tokens, and nothing else is */
    static const char spec[] =
        "{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"syntax\":\"gemma4\","
        "\"tags\":[\"<|tool_call>\",\"<tool_call|>\",\"<|\\\"|>\"],\"calls\":[{\"prefix\":"
        "\"<|tool_call>call:get\",\"suffix\":\"<tool_call|>\",\"schema\":{\"type\":\"object\","
        "\"properties\":{\"s\":{\"type\":\"string\"}},\"required\":[\"s\"],"
        "\"additionalProperties\":false}}]}";
    struct gram *g = gram_from_tool_spec(spec, strlen(spec), &e);
    CHECK(g, "%s", e.msg);
    if (g) {
        struct gram_matcher *m = gram_matcher_create(g);
        gram_matcher_fill_mask(m, v, mask);
        int n = 0;
        for (int32_t id = 0; id < V; id++) n += allowed(mask, id);
        CHECK(n == 1 && allowed(mask, tag_id[0]), "start: %d tokens allowed", n);
        CHECK(gram_matcher_accept_token(m, v, tag_id[0]), "<|tool_call>");
        CHECK(gram_matcher_accept_bytes(m, "call:get{s:", 11), "call:get{s:");
        gram_matcher_fill_mask(m, v, mask);
        CHECK(tags_allowed(mask) == 1 && allowed(mask, tag_id[2]), "the string's mark");
        CHECK(gram_matcher_accept_token(m, v, tag_id[2]), "<|\"|>");
        gram_matcher_fill_mask(m, v, mask);
        CHECK(tags_allowed(mask) == 1 && allowed(mask, tag_id[2]), "in the string: the mark");
        /* the text spelt in ordinary tokens is not the mark */
        CHECK(!gram_matcher_try_bytes(m, "<|\"|>", 5), "a spelt mark");
        CHECK(gram_matcher_accept_bytes(m, "ab", 2), "ab");
        CHECK(gram_matcher_accept_token(m, v, tag_id[2]), "<|\"|>");
        CHECK(gram_matcher_accept_bytes(m, "}", 1), "}");
        gram_matcher_fill_mask(m, v, mask);
        n = 0;
        for (int32_t id = 0; id < V; id++) n += allowed(mask, id);
        CHECK(n == 1 && allowed(mask, tag_id[1]), "the end: %d tokens allowed", n);
        CHECK(gram_matcher_accept_token(m, v, tag_id[1]), "<tool_call|>");
        gram_matcher_fill_mask(m, v, mask);
        /* the end-of-sequence ids only: <|im_end|>, <|call|>, <|return|> */
        CHECK(gram_matcher_is_terminated(m) && allowed(mask, 2) && tags_allowed(mask) == 2 &&
                  allowed(mask, CALL_ID) && allowed(mask, RETURN_ID),
              "after the call: eos");
        gram_matcher_destroy(m);
        gram_unref(g);
    }

    /* harmony: <|call|> is an end-of-sequence id; it ends the output where the grammar
     * expects its tag (and may end after it), not before */
    static const char hspec[] =
        "{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"tags\":[\"<|channel|>\","
        "\"<|constrain|>\",\"<|message|>\",\"<|call|>\"],\"calls\":[{\"prefix\":\"<|channel|>"
        "commentary to=functions.get <|constrain|>json<|message|>\",\"suffix\":\"<|call|>\","
        "\"schema\":{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"boolean\"}},"
        "\"required\":[\"b\"],\"additionalProperties\":false}}]}";
    g = gram_from_tool_spec(hspec, strlen(hspec), &e);
    CHECK(g, "%s", e.msg);
    if (g) {
        struct gram_matcher *m = gram_matcher_create(g);
        CHECK(gram_matcher_accept_token(m, v, tag_id[N_GEMMA + 1]), "<|channel|>");
        CHECK(gram_matcher_accept_bytes(m, "commentary to=functions.get ", 28), "header");
        gram_matcher_fill_mask(m, v, mask);
        CHECK(tags_allowed(mask) == 1 && allowed(mask, tag_id[N_GEMMA + 4]), "<|constrain|>");
        CHECK(gram_matcher_accept_token(m, v, tag_id[N_GEMMA + 4]), "<|constrain|>");
        CHECK(gram_matcher_accept_bytes(m, "json", 4), "json");
        CHECK(gram_matcher_accept_token(m, v, tag_id[N_GEMMA + 2]), "<|message|>");
        CHECK(gram_matcher_accept_bytes(m, "{\"b\": true", 10), "args");
        gram_matcher_fill_mask(m, v, mask);
        CHECK(!allowed(mask, CALL_ID) && !allowed(mask, 2), "eos before the arguments end");
        CHECK(gram_matcher_accept_bytes(m, "}", 1), "}");
        gram_matcher_fill_mask(m, v, mask);
        CHECK(allowed(mask, CALL_ID) && !allowed(mask, RETURN_ID) && !allowed(mask, 2),
              "<|call|> ends the call");
        CHECK(gram_matcher_accept_token(m, v, CALL_ID), "<|call|> accepted");
        gram_matcher_destroy(m);
        gram_unref(g);
    }

    /* a grammar that spells text never admits a tag token, even where its text would do */
    g = gram_from_json_schema("{\"type\":\"string\"}", 17, &e);
    if (g) {
        struct gram_matcher *m = gram_matcher_create(g);
        CHECK(gram_matcher_accept_bytes(m, "\"", 1), "\"");
        gram_matcher_fill_mask(m, v, mask);
        CHECK(!tags_allowed(mask), "a JSON string admits %d tag tokens", tags_allowed(mask));
        CHECK(gram_matcher_try_bytes(m, "<|tool_call>", 12), "the text itself is fine");
        gram_matcher_destroy(m);
        gram_unref(g);
    }
    free(mask);
    gram_vocab_destroy(v);
}

/* ---- through the engine ---------------------------------------------------------------- */

#define MAX_OUT 256

struct out {
    int32_t ids[MAX_OUT];
    int n;
    enum finish_reason finish;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct out *o = user;
    if (ev->kind == ENGINE_EV_TOKEN && o->n < MAX_OUT) o->ids[o->n++] = ev->token;
    if (ev->finish != FINISH_NONE) o->finish = ev->finish;
}

static struct http_model model;

static const char *const tools =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"boolean\"},\"c\":{\"enum\":[\"x\","
    "\"yy\"]}},\"required\":[\"b\",\"c\"],\"additionalProperties\":false}}},{\"type\":"
    "\"function\",\"function\":{\"name\":\"put\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"n\":{\"enum\":[1,2]}},\"required\":[\"n\"],\"additionalProperties\":"
    "false}}}]";

/* Runs a chat request greedily; the output as text with the tags (end-of-sequence ids
 * dropped, as the server does), or NULL when the request was refused. It ends at a stop,
 * or (max_tokens 12 or less) at the length. */
static char *chat(struct engine *en, const char *extra, int max_tokens, struct http_gen *g)
{
    char json[4096];
    snprintf(json, sizeof json,
             "{\"model\":\"tiny\",\"max_tokens\":%d,\"temperature\":0,\"parallel_tool_calls\":"
             "false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s%s}",
             max_tokens, tools, extra);
    cJSON *body = cJSON_Parse(json);
    struct http_error he = {0};
    int rc = http_gen_parse(HTTP_API_CHAT, body, &model, g, &he);
    cJSON_Delete(body);
    CHECK(rc == 0, "%s: %s", extra, he.msg);
    if (rc) return NULL;
    struct out o = {0};
    g->sp.logit_bias = g->bias; /* as the server's job does */
    g->sp.n_logit_bias = g->n_bias;
    struct engine_request q = {.prompt = g->prompts[0],
                               .n_prompt = g->n_prompt[0],
                               .sp = g->sp,
                               .on_event = on_event,
                               .user = &o};
    struct err e = {0};
    CHECK(engine_submit(en, &q, &e) > 0, "submit: %s", e.msg);
    for (int guard = 0; engine_step(en) > 0 && guard < 10000; guard++) {
    }
    CHECK(o.finish == (max_tokens > 12 ? FINISH_STOP : FINISH_LENGTH),
          "%s: finish %s after %d tokens", extra, finish_reason_name(o.finish), o.n);
    while (o.n && (o.ids[o.n - 1] == 2 || o.ids[o.n - 1] == CALL_ID || o.ids[o.n - 1] == RETURN_ID))
        o.n--;
    return tok_decode(model.tok, o.ids, (size_t)o.n, 0);
}

/* The calls the format's parser finds in out: exactly one, of a tool with valid arguments
 * (want: its name, or NULL for either). */
static void check_call(enum tcall_format f, const char *out, const char *want)
{
    cJSON *tl = cJSON_Parse(strchr(tools, '['));
    struct tcall_parser *p = tcall_parser_create(f, tl);
    struct tcall_str content = {0};
    tcall_parser_push(p, out, strlen(out), &content);
    tcall_parser_finish(p, &content);
    int n = tcall_parser_n_calls(p);
    CHECK(n == 1, "%s: %d calls in %s", tcall_format_name(f), n, out);
    if (n >= 1) {
        const struct tcall *c = tcall_parser_call(p, 0);
        cJSON *args = cJSON_Parse(c->args.p);
        int good = 0;
        if (c->name && !strcmp(c->name, "get")) {
            const cJSON *b = cJSON_GetObjectItem(args, "b"), *x = cJSON_GetObjectItem(args, "c");
            good = cJSON_IsBool(b) && cJSON_IsString(x) &&
                   (!strcmp(x->valuestring, "x") || !strcmp(x->valuestring, "yy")) &&
                   cJSON_GetArraySize(args) == 2;
        } else if (c->name && !strcmp(c->name, "put")) {
            const cJSON *v = cJSON_GetObjectItem(args, "n");
            good = cJSON_IsNumber(v) && (v->valueint == 1 || v->valueint == 2) &&
                   cJSON_GetArraySize(args) == 1;
        }
        CHECK(good && (!want || !strcmp(c->name, want)), "%s: call %s(%s) in %s",
              tcall_format_name(f), c->name ? c->name : "?", c->args.p, out);
        cJSON_Delete(args);
    }
    tcall_str_dispose(&content);
    tcall_parser_destroy(p);
    cJSON_Delete(tl);
}

static void test_engine(struct engine *en)
{
    struct http_gen g;
    char extra[256];
    /* gemma4 and harmony, required and named: the grammar writes the tags as tokens */
    for (int h = 0; h < 2; h++) {
        enum tcall_format f = h ? TCALL_HARMONY : TCALL_GEMMA4;
        model.tool_format = f;
        static const char *const choices[] = {
            ",\"tool_choice\":\"required\"",
            ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"put\"}}"};
        for (int c = 0; c < 2; c++) {
            char *out = chat(en, choices[c], 200, &g);
            if (!out) continue;
            /* the output starts with the format's opening tag, written as the token */
            const char *open = h ? "<|channel|>commentary to=functions." : "<|tool_call>call:";
            CHECK(!strncmp(out, open, strlen(open)), "%s: %s", tcall_format_name(f), out);
            check_call(f, out, c ? "put" : NULL);
            free(out);
            http_gen_dispose(&g);
        }
    }
    /* gemma4 auto: free text until the model picks <|tool_call> (pushed by a bias), which
     * switches the grammar on */
    model.tool_format = TCALL_GEMMA4;
    snprintf(extra, sizeof extra, ",\"tool_choice\":\"auto\",\"logit_bias\":{\"%d\":100}",
             (int)tag_id[0]);
    char *out = chat(en, extra, 200, &g);
    if (out) {
        CHECK(g.sp.grammar_trigger && g.sp.grammar_trigger[0] == GRAM_TAG_MARK &&
                  !strcmp(g.sp.grammar_trigger + 1, "<|tool_call>"),
              "the trigger is the token");
        check_call(TCALL_GEMMA4, out, NULL);
        free(out);
        http_gen_dispose(&g);
    }
    /* without the bias the output stays free text (the random model never picks the tag in
     * its first 12 tokens) */
    out = chat(en, ",\"tool_choice\":\"auto\"", 12, &g);
    if (out) {
        CHECK(!strstr(out, "<|tool_call>"), "%s", out);
        free(out);
        http_gen_dispose(&g);
    }
    model.tool_format = TCALL_HERMES;
}

/* harmony auto: the trigger is the header's recipient (ordinary text); the grammar from
 * there takes the header in the docs' and the template's forms, its tags as tokens. */
static void test_harmony_auto(const struct tok *t)
{
    model.tool_format = TCALL_HARMONY;
    char json[4096];
    snprintf(json, sizeof json,
             "{\"model\":\"tiny\",\"max_tokens\":20,\"messages\":[{\"role\":\"user\","
             "\"content\":\"hi\"}],%s}",
             tools);
    cJSON *body = cJSON_Parse(json);
    struct http_gen g;
    struct http_error he = {0};
    int rc = http_gen_parse(HTTP_API_CHAT, body, &model, &g, &he);
    cJSON_Delete(body);
    model.tool_format = TCALL_HERMES;
    CHECK(rc == 0, "%s", he.msg);
    if (rc) return;
    CHECK(g.sp.grammar && g.sp.grammar_trigger && !strcmp(g.sp.grammar_trigger, " to=functions."),
          "trigger %s", g.sp.grammar_trigger ? g.sp.grammar_trigger : "(none)");
    static const char *const forms[] = {
        " to=functions.get "
        "\xff<|constrain|>json\xff<|message|>{\"b\":false,\"c\":\"x\"}\xff<|call|>",
        " to=functions.get json\xff<|message|>{\"b\":false,\"c\":\"x\"}\xff<|call|>",
        " to=functions.put\xff<|channel|>commentary \xff<|constrain|>json\xff<|message|>{\"n\":1}"
        "\xff<|call|>",
        " to=functions.put\xff<|channel|>commentary json\xff<|message|>{\"n\": 2}\xff<|call|>"};
    for (int i = 0; i < 4; i++) {
        struct gram_matcher *m = gram_matcher_create(g.sp.grammar);
        CHECK(gram_matcher_accept_bytes(m, forms[i], strlen(forms[i])) && gram_matcher_can_end(m),
              "form %d refused", i);
        gram_matcher_destroy(m);
    }
    /* spelt in ordinary tokens the tags are refused */
    struct gram_matcher *m = gram_matcher_create(g.sp.grammar);
    CHECK(!gram_matcher_accept_bytes(m, " to=functions.get <|constrain|>", 31), "spelt tag");
    gram_matcher_destroy(m);
    http_gen_dispose(&g);
    (void)t;
}

/* A prompt that opened thinking: the grammar waits for the end-of-thinking token (Gemma 4's
 * <channel|>, harmony's <|end|>) and then asks for the call at once. */
static void test_after_thinking(void)
{
    static const struct {
        enum tcall_format tf;
        enum reason_format rf;
        const char *tmpl, *end, *out;
    } cases[] = {
        {TCALL_GEMMA4, REASON_GEMMA4, "{{ messages[0].content }}<|channel>thought\n", "<channel|>",
         "\xff<channel|>\xff<|tool_call>call:put{n:2}\xff<tool_call|>"},
        {TCALL_HARMONY, REASON_HARMONY,
         "{{ messages[0].content }}<|start|>assistant<|channel|>analysis<|message|>", "<|end|>",
         "\xff<|end|>\xff<|start|>assistant\xff<|channel|>commentary to=functions.put "
         "\xff<|constrain|>json\xff<|message|>{\"n\":1}\xff<|call|>"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        model.tool_format = cases[i].tf;
        model.reason_format = cases[i].rf;
        model.tmpl_src = cases[i].tmpl;
        char json[4096];
        snprintf(json, sizeof json,
                 "{\"model\":\"tiny\",\"max_tokens\":20,\"messages\":[{\"role\":\"user\","
                 "\"content\":\"hi\"}],%s,\"tool_choice\":\"required\"}",
                 tools);
        cJSON *body = cJSON_Parse(json);
        struct http_gen g;
        struct http_error he = {0};
        int rc = http_gen_parse(HTTP_API_CHAT, body, &model, &g, &he);
        cJSON_Delete(body);
        CHECK(rc == 0, "%s", he.msg);
        if (rc) continue;
        CHECK(g.think_open, "case %zu: thinking not open", i);
        const char *tr = g.sp.grammar_trigger;
        CHECK(tr && tr[0] == GRAM_TAG_MARK && !strcmp(tr + 1, cases[i].end), "case %zu: trigger",
              i);
        struct gram_matcher *m = gram_matcher_create(g.sp.grammar);
        CHECK(gram_matcher_accept_bytes(m, cases[i].out, strlen(cases[i].out)) &&
                  gram_matcher_can_end(m),
              "case %zu: the call after thinking refused", i);
        gram_matcher_destroy(m);
        http_gen_dispose(&g);
    }
    model.tool_format = TCALL_HERMES;
    model.reason_format = REASON_NONE;
}

int main(int argc, char **argv)
{
    const char *data = argc > 1 ? argv[1] : "../shared/testdata";
    char src[1024];
    snprintf(src, sizeof src, "%s/models/llama-tiny", data);
    int made = make_model(src) == 0;
    CHECK(made, "cannot write the model copy in %s", dir);
    struct err e = {0};
    struct tok *t = made ? tok_load(dir, &e) : NULL;
    CHECK(t, "%s", e.msg);
    if (t) {
        for (int i = 0; i < N_TAGS; i++)
            CHECK(tok_is_special(t, tag_id[i]) &&
                      !strcmp(tok_id_to_token(t, tag_id[i]),
                              i < N_TAGS - 1 ? all_tags[i] : "<|image|>"),
                  "tag %d", i);
        test_vocab_and_masks(t);
        model = (struct http_model){.name = "tiny",
                                    .tok = t,
                                    .tmpl_src = "{{ messages[0].content }}",
                                    .vocab = tok_vocab_size(t),
                                    .max_model_len = 4096,
                                    .tool_format = TCALL_HERMES};
        test_harmony_auto(t);
        test_after_thinking();
        model.tmpl_src = "{{ messages[0].content }}";
        struct engine_config cfg = {.model_dir = dir,
                                    .manual = 1,
                                    .threads = 2,
                                    .max_num_seqs = 4,
                                    .grammar_tags = all_tags};
        struct engine *en = engine_create(&cfg, &e);
        CHECK(en, "engine_create: %s", e.msg);
        if (en) {
            test_engine(en);
            engine_destroy(en);
        }
        tok_destroy(t);
    }
    if (made) remove_model();
    TEST_DONE();
}
