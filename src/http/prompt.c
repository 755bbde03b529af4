/* Chat prompts: OpenAI messages and Anthropic messages/system, checked, normalized to
 * {role, content: string} (plus tool_calls and tool_call_id, see tools.c) and rendered
 * through the model's chat template with the request's tools. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "http/request.h"
#include "text/tmpl.h"

/* Joins the text parts of a content array into one string (parts separated by "\n" for
 * OpenAI, concatenated for Anthropic blocks). NULL + he for a non-text part. */
static char *content_text(enum http_api api, const cJSON *content, const char *where,
                          struct http_error *he)
{
    if (cJSON_IsString(content)) return xstrdup(content->valuestring);
    if (!cJSON_IsArray(content)) {
        http_error_set(he, 400, where, "'%s' must be a string or an array of content %s", where,
                       api == HTTP_API_MESSAGES ? "blocks" : "parts");
        return NULL;
    }
    struct http_buf b = {0};
    http_buf_append(&b, "", 0);
    int i = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content)
    {
        char path[96];
        snprintf(path, sizeof path, "%s[%d]", where, i);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
            http_error_set(he, 400, path, "'%s' must be an object with a string 'type'", path);
            goto fail;
        }
        if (strcmp(type->valuestring, "text") != 0) {
            http_error_set(he, 400, path, "'%s': content type '%.40s' is not supported (only text)",
                           path, type->valuestring);
            goto fail;
        }
        if (!cJSON_IsString(text)) {
            http_error_set(he, 400, path, "'%s.text' must be a string", path);
            goto fail;
        }
        if (i > 0 && api != HTTP_API_MESSAGES) http_buf_puts(&b, "\n");
        http_buf_puts(&b, text->valuestring);
        i++;
    }
    return b.p;
fail:
    http_buf_dispose(&b);
    return NULL;
}

static void add_message(cJSON *arr, const char *role, const char *text)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", text);
    cJSON_AddItemToArray(arr, m);
}

/* OpenAI messages -> normalized array. */
static cJSON *openai_messages(const cJSON *body, struct http_error *he)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!msgs || cJSON_IsNull(msgs)) {
        http_error_set(he, 400, "messages", "'messages' is required");
        return NULL;
    }
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        http_error_set(he, 400, "messages", "'messages' must be a non-empty array");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        char path[96];
        snprintf(path, sizeof path, "messages[%d]", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            http_error_set(he, 400, path, "'%s' must be an object with a string 'role'", path);
            goto fail;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") &&
            strcmp(r, "assistant") && strcmp(r, "tool")) {
            snprintf(path, sizeof path, "messages[%d].role", i);
            http_error_set(he, 400, path,
                           "'%s': unknown role '%.40s' (expected system, developer, user, "
                           "assistant or tool)",
                           path, r);
            goto fail;
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (calls && cJSON_IsNull(calls)) calls = NULL;
        snprintf(path, sizeof path, "messages[%d].content", i);
        char *text;
        if ((!content || cJSON_IsNull(content)) && !strcmp(r, "assistant"))
            text = xstrdup("");
        else if (!content || cJSON_IsNull(content)) {
            http_error_set(he, 400, path, "'%s' is required", path);
            goto fail;
        } else if (!(text = content_text(HTTP_API_CHAT, content, path, he)))
            goto fail;
        /* Templates know system; developer is its newer name. */
        add_message(out, !strcmp(r, "developer") ? "system" : r, text);
        free(text);
        cJSON *added = cJSON_GetArrayItem(out, cJSON_GetArraySize(out) - 1);
        if (calls) {
            snprintf(path, sizeof path, "messages[%d].tool_calls", i);
            if (strcmp(r, "assistant")) {
                http_error_set(he, 400, path, "'%s': only assistant messages have tool calls",
                               path);
                goto fail;
            }
            if (http_openai_tool_calls(calls, path, added, he) < 0) goto fail;
        }
        if (!strcmp(r, "tool")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
            if (!cJSON_IsString(id)) {
                snprintf(path, sizeof path, "messages[%d].tool_call_id", i);
                http_error_set(he, 400, path, "'%s' is required for tool messages", path);
                goto fail;
            }
            cJSON_AddStringToObject(added, "tool_call_id", id->valuestring);
        }
        i++;
    }
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

/* Whether every block of an Anthropic content array is text. */
static int text_only(const cJSON *content)
{
    const cJSON *b;
    cJSON_ArrayForEach(b, content)
    {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
        if (cJSON_IsString(t) && strcmp(t->valuestring, "text")) return 0;
    }
    return 1;
}

/* Anthropic system + messages -> normalized array; *prefill gets the text of a final
 * assistant message (the answer continues it), or NULL. */
static cJSON *anthropic_messages(const cJSON *body, char **prefill, struct http_error *he)
{
    *prefill = NULL;
    cJSON *out = cJSON_CreateArray();
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(body, "system");
    if (sys && !cJSON_IsNull(sys)) {
        char *text = content_text(HTTP_API_MESSAGES, sys, "system", he);
        if (!text) goto fail;
        add_message(out, "system", text);
        free(text);
    }
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!msgs || cJSON_IsNull(msgs)) {
        http_error_set(he, 400, "messages", "messages: field required");
        goto fail;
    }
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        http_error_set(he, 400, "messages", "messages: must be a non-empty array");
        goto fail;
    }
    int n = cJSON_GetArraySize(msgs), i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        char path[96];
        snprintf(path, sizeof path, "messages.%d", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            http_error_set(he, 400, path, "%s: must be an object with a string role", path);
            goto fail;
        }
        if (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")) {
            snprintf(path, sizeof path, "messages.%d.role", i);
            http_error_set(he, 400, path,
                           "%s: unknown role '%.40s' (expected user or assistant; the system "
                           "prompt goes in 'system')",
                           path, role->valuestring);
            goto fail;
        }
        snprintf(path, sizeof path, "messages.%d.content", i);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!content || cJSON_IsNull(content)) {
            http_error_set(he, 400, path, "%s: field required", path);
            goto fail;
        }
        if (cJSON_IsArray(content) && !text_only(content)) {
            /* tool_use, tool_result, thinking blocks */
            if (http_anthropic_blocks(role->valuestring, content, path, out, he) < 0) goto fail;
            i++;
            continue;
        }
        char *text = content_text(HTTP_API_MESSAGES, content, path, he);
        if (!text) goto fail;
        if (i == n - 1 && !strcmp(role->valuestring, "assistant"))
            *prefill = text;
        else {
            add_message(out, role->valuestring, text);
            free(text);
        }
        i++;
    }
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

int http_chat_prompt(enum http_api api, const cJSON *body, const struct http_model *m,
                     int32_t **ids, int *n, char **text_out, struct http_error *he)
{
    if (!m->tok)
        return http_error_no_tokenizer(
            he, "messages", api == HTTP_API_MESSAGES ? "a messages request" : "a chat request");
    char *prefill = NULL;
    cJSON *msgs = api == HTTP_API_MESSAGES ? anthropic_messages(body, &prefill, he)
                                           : openai_messages(body, he);
    if (!msgs) return -1;
    const char *field = "messages";
    int rc = -1;
    char *text = NULL;
    cJSON *tools = NULL, *vars = NULL;
    if (http_tools_parse(api, body, &tools, he) < 0) goto out;
    if (!(vars = http_template_vars(api, body, m, he))) goto out;
    if (!m->tmpl_src) {
        http_error_set(he, 400, field,
                       "the model has no chat template; send a plain prompt to /v1/completions");
        goto out;
    }
    struct err e = {0};
    size_t len = 0;
    text = tmpl_apply_chat(m->tmpl_src, msgs, tools, NULL, 1, vars, &len, &e);
    if (!text) {
        http_error_set(he, 400, field, "the chat template rejected the messages: %s", e.msg);
        goto out;
    }
    if (prefill) {
        struct http_buf b = {.p = text, .len = len, .cap = len + 1};
        http_buf_puts(&b, prefill);
        text = b.p;
        len = b.len;
    }
    size_t nid = 0;
    if (tok_encode(m->tok, text, len, 0, ids, &nid, &e) != 0) {
        http_error_set(he, 400, field, "the prompt cannot be tokenized: %s", e.msg);
        goto out;
    }
    *n = (int)nid;
    rc = 0;
    if (text_out) {
        *text_out = text;
        text = NULL;
    }
out:
    free(text);
    free(prefill);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(vars);
    return rc;
}
