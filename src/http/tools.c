/*
 * Tool calling in requests: the tools of OpenAI and Anthropic bodies in one shape (the one
 * HF chat templates read), tool_choice, the grammar that enforces a required or named
 * choice in the output parser's wire format, and the tool parts of conversation messages
 * (assistant tool calls, tool results) converted for the template.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "http/request.h"

/* Names as OpenAI allows them: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'. */
static int good_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || s[i] == '-' || (s[i] >= '0' && s[i] <= '9') ||
              ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z')))
            return 0;
    return 1;
}

/* {"type": "function", "function": {name, description, parameters}} from its parts. */
static cJSON *tool_entry(const char *name, const cJSON *desc, const cJSON *params)
{
    cJSON *fn = cJSON_CreateObject();
    cJSON_AddStringToObject(fn, "name", name);
    if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
    cJSON_AddItemToObject(fn, "parameters",
                          params ? cJSON_Duplicate(params, 1)
                                 : cJSON_Parse("{\"type\":\"object\","
                                               "\"properties\":{}}"));
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "type", "function");
    cJSON_AddItemToObject(t, "function", fn);
    return t;
}

int http_tools_parse(enum http_api api, const cJSON *body, cJSON **out, struct http_error *he)
{
    *out = NULL;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    if (!tools || cJSON_IsNull(tools)) return 0;
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) > HTTP_MAX_TOOLS)
        return http_error_set(he, 400, "tools", "'tools' must be an array of at most %d tools",
                              HTTP_MAX_TOOLS);
    if (cJSON_GetArraySize(tools) == 0) return 0;
    cJSON *arr = cJSON_CreateArray();
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        char path[48];
        snprintf(path, sizeof path, api == HTTP_API_MESSAGES ? "tools.%d" : "tools[%d]", i++);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn =
            api == HTTP_API_MESSAGES ? t : cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(
            fn, api == HTTP_API_MESSAGES ? "input_schema" : "parameters");
        if (!cJSON_IsObject(t)) {
            http_error_set(he, 400, path, "%s: must be an object", path);
            goto fail;
        }
        if (api == HTTP_API_MESSAGES && cJSON_IsString(type) &&
            strcmp(type->valuestring, "custom")) {
            http_error_set(he, 400, path,
                           "%s: tool type '%.40s' is not supported (only custom tools)", path,
                           type->valuestring);
            goto fail;
        }
        if (api != HTTP_API_MESSAGES &&
            (!cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
             !cJSON_IsObject(fn))) {
            http_error_set(he, 400, path,
                           "'%s' must be {\"type\": \"function\", \"function\": {...}}", path);
            goto fail;
        }
        if (!cJSON_IsString(name) || !good_name(name->valuestring)) {
            http_error_set(he, 400, path, "%s: needs a name of 1 to 64 letters, digits, '_' or '-'",
                           path);
            goto fail;
        }
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params)) {
            http_error_set(he, 400, path, "%s: the parameters must be a JSON Schema object", path);
            goto fail;
        }
        const cJSON *x;
        cJSON_ArrayForEach(x, arr)
        {
            const cJSON *other = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(x, "function"), "name");
            if (!strcmp(other->valuestring, name->valuestring)) {
                http_error_set(he, 400, path, "%s: tool name '%s' is given twice", path,
                               name->valuestring);
                goto fail;
            }
        }
        cJSON_AddItemToArray(arr, tool_entry(name->valuestring,
                                             cJSON_GetObjectItemCaseSensitive(fn, "description"),
                                             cJSON_IsObject(params) ? params : NULL));
    }
    *out = arr;
    return 0;
fail:
    cJSON_Delete(arr);
    return -1;
}

/* ---- tool_choice and its grammar --------------------------------------------------- */

static const cJSON *find_tool(const cJSON *tools, const char *name)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, name)) return fn;
    }
    return NULL;
}

static char *json_quoted(const char *s)
{
    cJSON *v = cJSON_CreateString(s);
    char *q = cJSON_PrintUnformatted(v);
    cJSON_Delete(v);
    return q;
}

/* qwen3_xml: one entry per parameter in schema order (string values are free text, the
 * others JSON under their schema), as the grammar spec's "params". */
static cJSON *xml_params(const cJSON *schema)
{
    cJSON *out = cJSON_CreateArray();
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(schema, "required");
    const cJSON *p;
    cJSON_ArrayForEach(p, props)
    {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
        int required = 0;
        const cJSON *r;
        cJSON_ArrayForEach(r, req) required |=
            cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "key", p->string);
        cJSON_AddItemToObject(e, "schema", cJSON_Duplicate(p, 1));
        cJSON_AddBoolToObject(e, "text",
                              cJSON_IsString(ty) && !strcmp(ty->valuestring, "string") &&
                                  !cJSON_GetObjectItemCaseSensitive(p, "enum"));
        cJSON_AddBoolToObject(e, "required", required);
        /* maxLength counts characters; as many bytes is a tighter bound that always holds */
        const cJSON *max = cJSON_GetObjectItemCaseSensitive(p, "maxLength");
        if (cJSON_IsNumber(max) && max->valuedouble >= 0)
            cJSON_AddNumberToObject(e, "max_bytes", max->valuedouble);
        cJSON_AddItemToArray(out, e);
    }
    return out;
}

/* Whether the model's tokenizer holds tag as one special token (one the engine's grammar
 * vocabulary then holds too: engine_config.grammar_tags lists the same formats' tags). */
static int special_tag(const struct http_model *m, const char *tag)
{
    int32_t id = m->tok ? tok_token_id(m->tok, tag) : -1;
    return id >= 0 && id < m->vocab && tok_is_special(m->tok, id);
}

/* The tool-call and reasoning formats' tags that are special tokens, for the tool spec. */
static cJSON *special_tags(const struct http_model *m, const struct http_gen *g)
{
    cJSON *arr = cJSON_CreateArray();
    const char *const *lists[2] = {tcall_format_tags(g->tool_format),
                                   reason_format_tags(g->reason_format)};
    for (int l = 0; l < 2; l++)
        for (const char *const *t = lists[l]; *t; t++)
            if (special_tag(m, *t)) cJSON_AddItemToArray(arr, cJSON_CreateString(*t));
    return arr;
}

/* The lazy grammar's trigger: text, or a special token's text behind GRAM_TAG_MARK (as the
 * grammar vocabulary reads the token, so that only the token switches the grammar on). */
static void set_trigger(struct http_gen *g, const struct http_model *m, const char *text)
{
    size_t n = strlen(text);
    int mark = special_tag(m, text);
    free(g->trigger);
    g->trigger = xmalloc(n + 2);
    g->trigger[0] = GRAM_TAG_MARK;
    memcpy(g->trigger + mark, text, n + 1);
    g->sp.grammar_trigger = g->trigger;
}

/* harmony: what an `auto` grammar waits for. The recipient comes before the channel (as the
 * chat template writes calls) or after it (as the harmony docs do); either way the header
 * holds it, and only a call's header does. */
#define HARMONY_TRIGGER " to=functions."

/* One call of tool fn in the format's wire form, for gram_from_tool_spec (lazy: the
 * grammar of an `auto` choice, which starts at the format's trigger). */
static cJSON *call_spec(enum tcall_format f, const cJSON *fn, int lazy)
{
    const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    cJSON *c = cJSON_CreateObject();
    char *q = json_quoted(name);
    struct http_buf pre = {0};
    if (f == TCALL_QWEN3_XML) {
        http_buf_printf(&pre, "<tool_call>\n<function=%s>\n", name);
        cJSON_AddStringToObject(c, "prefix", pre.p);
        cJSON_AddItemToObject(c, "params", xml_params(params));
        cJSON_AddStringToObject(c, "suffix", "</function>\n</tool_call>");
    } else if (f == TCALL_GEMMA4) {
        http_buf_printf(&pre, "<|tool_call>call:%s", name);
        cJSON_AddStringToObject(c, "prefix", pre.p);
        cJSON_AddItemToObject(c, "schema", cJSON_Duplicate(params, 1));
        cJSON_AddStringToObject(c, "suffix", "<tool_call|>");
    } else if (f == TCALL_HARMONY && !lazy) {
        http_buf_printf(
            &pre, "<|channel|>commentary" HARMONY_TRIGGER "%s <|constrain|>json<|message|>", name);
        cJSON_AddStringToObject(c, "prefix", pre.p);
        cJSON_AddItemToObject(c, "schema", cJSON_Duplicate(params, 1));
        cJSON_AddStringToObject(c, "suffix", "<|call|>");
    } else if (f == TCALL_HARMONY) {
        /* from the recipient on: the header as the harmony docs write it (channel first,
         * then <|constrain|>) or as the chat template does (recipient first, then the
         * channel and the content type) */
        static const char *const tails[] = {" <|constrain|>json<|message|>", " json<|message|>",
                                            "<|channel|>commentary <|constrain|>json<|message|>",
                                            "<|channel|>commentary json<|message|>"};
        cJSON *alts = cJSON_CreateArray();
        for (int i = 0; i < 4; i++) {
            pre.len = 0;
            http_buf_printf(&pre, HARMONY_TRIGGER "%s%s", name, tails[i]);
            cJSON_AddItemToArray(alts, cJSON_CreateString(pre.p));
        }
        cJSON_AddItemToObject(c, "prefix", alts);
        cJSON_AddItemToObject(c, "schema", cJSON_Duplicate(params, 1));
        cJSON_AddStringToObject(c, "suffix", "<|call|>");
    } else {
        http_buf_printf(&pre, "%s{\"name\": %s, \"%s\": ", f == TCALL_HERMES ? "<tool_call>\n" : "",
                        q, f == TCALL_LLAMA3_JSON ? "parameters" : "arguments");
        cJSON_AddStringToObject(c, "prefix", pre.p);
        cJSON_AddItemToObject(c, "schema", cJSON_Duplicate(params, 1));
        cJSON_AddStringToObject(c, "suffix", f == TCALL_HERMES ? "}\n</tool_call>" : "}");
    }
    http_buf_dispose(&pre);
    free(q);
    return c;
}

/* The grammar of 1..max calls of the given tools (all of them, or only `only`); lazy: an
 * `auto` choice's, from the trigger on. */
static int call_grammar(struct http_gen *g, const struct http_model *m, const char *only, int lazy,
                        const char *field, struct http_error *he)
{
    enum tcall_format f = g->tool_format;
    cJSON *spec = cJSON_CreateObject(), *calls = cJSON_CreateArray();
    const cJSON *t;
    cJSON_ArrayForEach(t, g->tools)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        if (!only || !strcmp(only, name)) cJSON_AddItemToArray(calls, call_spec(f, fn, lazy));
    }
    cJSON_AddItemToObject(spec, "calls", calls);
    cJSON_AddItemToObject(spec, "tags", special_tags(m, g));
    /* a prompt that opened thinking: the model thinks first, and the calls follow the end
     * tag (the grammar switches on there, on the token where the tag is a special token):
     * harmony's next message, Gemma 4's call right after the tag (as its template writes
     * it), the others' after a blank line */
    const char *think_end = g->think_open && !lazy ? reason_format_end(g->reason_format) : NULL;
    struct http_buf begin = {0};
    if (think_end)
        http_buf_printf(&begin, "%s%s", think_end,
                        f == TCALL_HARMONY  ? "<|start|>assistant"
                        : f == TCALL_GEMMA4 ? ""
                                            : "\n\n");
    http_buf_puts(&begin, f == TCALL_MISTRAL ? "[TOOL_CALLS][" : "");
    cJSON_AddStringToObject(spec, "begin", begin.p);
    http_buf_dispose(&begin);
    if (think_end) set_trigger(g, m, think_end);
    cJSON_AddStringToObject(spec, "sep",
                            f == TCALL_LLAMA3_JSON ? "; "
                            : f == TCALL_MISTRAL   ? ", "
                            : f == TCALL_GEMMA4    ? ""
                                                   : "\n");
    if (f == TCALL_GEMMA4) cJSON_AddStringToObject(spec, "syntax", "gemma4");
    cJSON_AddStringToObject(spec, "end", f == TCALL_MISTRAL ? "]" : "");
    /* harmony: <|call|> ends the output (a stop token), so one call a turn */
    cJSON_AddNumberToObject(spec, "max",
                            g->parallel_calls && !only && f != TCALL_HARMONY ? HTTP_MAX_CALLS : 1);
    char *text = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);
    struct err e = {0};
    g->sp.grammar = gram_compile_cached(GRAM_TOOL_SPEC, text, strlen(text), &e);
    free(text);
    if (!g->sp.grammar)
        return http_error_set(he, 400, field, "a tool's parameters cannot be enforced: %s", e.msg);
    return 0;
}

/* OpenAI tool_choice: "none" | "auto" | "required" | {"type": "function", "function":
 * {"name"}}. *name points into body. */
static int openai_choice(const cJSON *tc, enum http_tool_choice *c, const char **name,
                         struct http_error *he)
{
    const char *f = "tool_choice";
    if (cJSON_IsString(tc)) {
        const char *s = tc->valuestring;
        *c = !strcmp(s, "none")       ? HTTP_TOOLS_NONE
             : !strcmp(s, "auto")     ? HTTP_TOOLS_AUTO
             : !strcmp(s, "required") ? HTTP_TOOLS_REQUIRED
                                      : (enum http_tool_choice) - 1;
        if ((int)*c < 0)
            return http_error_set(he, 400, f,
                                  "'%s' must be 'none', 'auto', 'required' or a named function", f);
        return 0;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
    const cJSON *n =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
        !cJSON_IsString(n))
        return http_error_set(
            he, 400, f,
            "'%s' must be a string or {\"type\": \"function\", \"function\": {\"name\"}}", f);
    *c = HTTP_TOOLS_NAMED;
    *name = n->valuestring;
    return 0;
}

/* Anthropic tool_choice: {"type": "auto" | "any" | "tool" | "none", "name",
 * "disable_parallel_tool_use"}. */
static int anthropic_choice(const cJSON *tc, enum http_tool_choice *c, const char **name,
                            int *parallel, struct http_error *he)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(type))
        return http_error_set(he, 400, "tool_choice",
                              "tool_choice: must be an object with a string type");
    const char *s = type->valuestring;
    *c = !strcmp(s, "none")   ? HTTP_TOOLS_NONE
         : !strcmp(s, "auto") ? HTTP_TOOLS_AUTO
         : !strcmp(s, "any")  ? HTTP_TOOLS_REQUIRED
         : !strcmp(s, "tool") ? HTTP_TOOLS_NAMED
                              : (enum http_tool_choice) - 1;
    if ((int)*c < 0)
        return http_error_set(he, 400, "tool_choice.type",
                              "tool_choice.type: must be auto, any, tool or none");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(tc, "name");
    if (*c == HTTP_TOOLS_NAMED && !cJSON_IsString(n))
        return http_error_set(he, 400, "tool_choice.name",
                              "tool_choice.name: field required for type tool");
    if (*c == HTTP_TOOLS_NAMED) *name = n->valuestring;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(tc, "disable_parallel_tool_use");
    if (d && !cJSON_IsBool(d))
        return http_error_set(he, 400, "tool_choice.disable_parallel_tool_use",
                              "tool_choice.disable_parallel_tool_use: must be a boolean");
    if (cJSON_IsTrue(d)) *parallel = 0;
    return 0;
}

int http_parse_tools(enum http_api api, const cJSON *body, const struct http_model *m,
                     struct http_gen *g, struct http_error *he)
{
    if (api == HTTP_API_COMPLETIONS) return 0;
    if (http_tools_parse(api, body, &g->tools, he) < 0) return -1;
    g->parallel_calls = 1;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    const char *name = NULL;
    enum http_tool_choice c = g->tools ? HTTP_TOOLS_AUTO : HTTP_TOOLS_NONE;
    if (tc && !cJSON_IsNull(tc)) {
        int r = api == HTTP_API_MESSAGES ? anthropic_choice(tc, &c, &name, &g->parallel_calls, he)
                                         : openai_choice(tc, &c, &name, he);
        if (r < 0) return -1;
    }
    if (api == HTTP_API_CHAT) {
        int b, r = http_json_bool(body, "parallel_tool_calls", &b, he);
        if (r < 0) return -1;
        if (r) g->parallel_calls = b;
    }
    if (c != HTTP_TOOLS_NONE && !g->tools)
        return http_error_set(he, 400, "tool_choice", "'tool_choice' needs 'tools'");
    if (c == HTTP_TOOLS_NAMED && !find_tool(g->tools, name))
        return http_error_set(he, 400, "tool_choice",
                              "'tool_choice' names '%.64s', which is not in 'tools'", name);
    g->tool_choice = c;
    if (c == HTTP_TOOLS_NONE) return 0;
    if (m->tool_format == TCALL_NONE)
        return http_error_set(he, 400, "tools",
                              "tool calling needs a tool-call parser: start the server with "
                              "--tool-call-parser (the chat template shows no known format)");
    g->tool_format = m->tool_format;
    if (c == HTTP_TOOLS_AUTO) {
        /* free text until the format's start tag (its special token, where it is one),
         * then calls under the tools' schemas; structured output, when asked for,
         * constrains the text instead */
        const char *trigger = g->tool_format == TCALL_HARMONY
                                  ? HARMONY_TRIGGER
                                  : tcall_format_trigger(g->tool_format);
        if (!trigger || g->sp.grammar) return 0;
        set_trigger(g, m, trigger);
        return call_grammar(g, m, NULL, 1, "tools", he);
    }
    if (g->sp.grammar)
        return http_error_set(he, 400, "tool_choice",
                              "a required or named 'tool_choice' cannot be combined with "
                              "structured output (response_format, guided_*)");
    return call_grammar(g, m, c == HTTP_TOOLS_NAMED ? name : NULL, 0, "tools", he);
}

/* ---- messages ------------------------------------------------------------------------ */

/* One call for the template: {id, type, function: {name, arguments: object}}. */
static cJSON *template_call(const char *id, const char *name, cJSON *args)
{
    cJSON *fn = cJSON_CreateObject();
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddItemToObject(fn, "arguments", args);
    cJSON *c = cJSON_CreateObject();
    if (id) cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddItemToObject(c, "function", fn);
    return c;
}

int http_openai_tool_calls(const cJSON *calls, const char *path, cJSON *out_msg,
                           struct http_error *he)
{
    if (!cJSON_IsArray(calls)) return http_error_set(he, 400, path, "'%s' must be an array", path);
    cJSON *arr = cJSON_CreateArray();
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls)
    {
        char where[128];
        snprintf(where, sizeof where, "%s[%d]", path, i++);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(name) || (args && !cJSON_IsString(args) && !cJSON_IsObject(args))) {
            cJSON_Delete(arr);
            return http_error_set(he, 400, where,
                                  "'%s' must have function.name and function.arguments (a JSON "
                                  "string)",
                                  where);
        }
        /* templates iterate the arguments (tool_call.arguments|items): an object, as
         * transformers passes it; text that is not JSON stays a string */
        cJSON *a = !args                  ? cJSON_CreateObject()
                   : cJSON_IsObject(args) ? cJSON_Duplicate(args, 1)
                                          : cJSON_Parse(args->valuestring);
        if (!a) a = cJSON_CreateString(args->valuestring);
        cJSON_AddItemToArray(
            arr, template_call(cJSON_IsString(id) ? id->valuestring : NULL, name->valuestring, a));
    }
    cJSON_AddItemToObject(out_msg, "tool_calls", arr);
    return 0;
}

/* The text of a tool_result's content: a string or text blocks. */
static int result_text(const cJSON *content, const char *path, struct http_buf *b,
                       struct http_error *he)
{
    if (!content || cJSON_IsNull(content)) return 0;
    if (cJSON_IsString(content)) {
        http_buf_puts(b, content->valuestring);
        return 0;
    }
    const cJSON *part;
    cJSON_ArrayForEach(part, content)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return http_error_set(he, 400, path, "%s: tool results may hold only text blocks",
                                  path);
        http_buf_puts(b, text->valuestring);
    }
    return cJSON_IsArray(content)
               ? 0
               : http_error_set(he, 400, path, "%s: must be a string or text blocks", path);
}

int http_anthropic_blocks(const char *role, const cJSON *content, const char *path, cJSON *out,
                          struct http_error *he)
{
    int user = !strcmp(role, "user");
    struct http_buf text = {0};
    http_buf_append(&text, "", 0);
    cJSON *calls = cJSON_CreateArray();
    int i = 0, n_results = 0;
    const cJSON *blk;
    cJSON_ArrayForEach(blk, content)
    {
        char where[96];
        snprintf(where, sizeof where, "%s.%d", path, i++);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(blk, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(t, "text")) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(blk, "text");
            if (!cJSON_IsString(s)) {
                http_error_set(he, 400, where, "%s.text: must be a string", where);
                goto fail;
            }
            http_buf_puts(&text, s->valuestring);
        } else if (!strcmp(t, "tool_use") && !user) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(blk, "id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(blk, "name");
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(blk, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input)) {
                http_error_set(he, 400, where, "%s: tool_use needs id, name and an input object",
                               where);
                goto fail;
            }
            cJSON_AddItemToArray(calls, template_call(id->valuestring, name->valuestring,
                                                      cJSON_Duplicate(input, 1)));
        } else if (!strcmp(t, "tool_result") && user) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(blk, "tool_use_id");
            if (!cJSON_IsString(id)) {
                http_error_set(he, 400, where, "%s.tool_use_id: field required", where);
                goto fail;
            }
            struct http_buf r = {0};
            http_buf_append(&r, "", 0);
            if (result_text(cJSON_GetObjectItemCaseSensitive(blk, "content"), where, &r, he) < 0) {
                http_buf_dispose(&r);
                goto fail;
            }
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(m, "content", r.p);
            cJSON_AddItemToArray(out, m);
            http_buf_dispose(&r);
            n_results++;
        } else if ((!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) && !user) {
            /* earlier thinking: templates drop it from past turns */
        } else {
            http_error_set(he, 400, where, "%s: content type '%.40s' is not supported here", where,
                           t);
            goto fail;
        }
    }
    if (!user || !n_results || text.len) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", role);
        cJSON_AddStringToObject(m, "content", text.p);
        if (cJSON_GetArraySize(calls)) {
            cJSON_AddItemToObject(m, "tool_calls", calls);
            calls = NULL;
        }
        cJSON_AddItemToArray(out, m);
    }
    cJSON_Delete(calls);
    http_buf_dispose(&text);
    return 0;
fail:
    cJSON_Delete(calls);
    http_buf_dispose(&text);
    return -1;
}

/* ---- template variables -------------------------------------------------------------- */

cJSON *http_template_vars(enum http_api api, const cJSON *body, const struct http_model *m,
                          struct http_error *he)
{
    cJSON *vars = m->tmpl_vars ? cJSON_Duplicate(m->tmpl_vars, 1) : cJSON_CreateObject();
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw)) {
            http_error_set(he, 400, "chat_template_kwargs",
                           "'chat_template_kwargs' must be an object");
            goto fail;
        }
        const cJSON *v;
        cJSON_ArrayForEach(v, kw)
        {
            cJSON_DeleteItemFromObjectCaseSensitive(vars, v->string);
            cJSON_AddItemToObject(vars, v->string, cJSON_Duplicate(v, 1));
        }
    }
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(body, "thinking");
    if (api == HTTP_API_MESSAGES && th && !cJSON_IsNull(th)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(th, "type");
        if (!cJSON_IsString(type) ||
            (strcmp(type->valuestring, "enabled") && strcmp(type->valuestring, "disabled"))) {
            http_error_set(he, 400, "thinking.type", "thinking.type: must be enabled or disabled");
            goto fail;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(vars, "enable_thinking");
        cJSON_AddBoolToObject(vars, "enable_thinking", !strcmp(type->valuestring, "enabled"));
    }
    const cJSON *effort = cJSON_GetObjectItemCaseSensitive(body, "reasoning_effort");
    if (api == HTTP_API_CHAT && effort && !cJSON_IsNull(effort)) {
        if (!cJSON_IsString(effort)) {
            http_error_set(he, 400, "reasoning_effort", "'reasoning_effort' must be a string");
            goto fail;
        }
        /* gpt-oss templates read it; "none" turns thinking off where templates know
         * enable_thinking */
        cJSON_DeleteItemFromObjectCaseSensitive(vars, "reasoning_effort");
        cJSON_AddStringToObject(vars, "reasoning_effort", effort->valuestring);
        if (!strcmp(effort->valuestring, "none") &&
            !cJSON_GetObjectItemCaseSensitive(vars, "enable_thinking"))
            cJSON_AddFalseToObject(vars, "enable_thinking");
    }
    return vars;
fail:
    cJSON_Delete(vars);
    return NULL;
}
