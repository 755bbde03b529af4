/*
 * tmpl_chat: the apply_chat_template glue: building the variables transformers passes to
 * a chat template, and finding a model folder's template and special tokens.
 */
#include "text/tmpl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"

char *tmpl_apply_chat(const char *template_src, const cJSON *messages, const cJSON *tools,
                      const cJSON *documents, int add_generation_prompt, const cJSON *extra_vars,
                      size_t *out_len, struct err *e)
{
    if (!template_src) {
        err_set(e, "no chat template");
        return NULL;
    }
    struct tmpl *t = tmpl_parse(template_src, strlen(template_src), e);
    if (!t) return NULL;
    /* The context borrows the caller's JSON: references, not copies. */
    cJSON *ctx = cJSON_CreateObject();
    if (!ctx) {
        tmpl_destroy(t);
        err_set(e, "out of memory");
        return NULL;
    }
    cJSON *empty = NULL;
    if (!messages) messages = empty = cJSON_CreateArray();
    cJSON_AddItemReferenceToObject(ctx, "messages", (cJSON *)messages);
    if (tools && !cJSON_IsNull(tools))
        cJSON_AddItemReferenceToObject(ctx, "tools", (cJSON *)tools);
    else
        cJSON_AddNullToObject(ctx, "tools");
    if (documents && !cJSON_IsNull(documents))
        cJSON_AddItemReferenceToObject(ctx, "documents", (cJSON *)documents);
    else
        cJSON_AddNullToObject(ctx, "documents");
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_generation_prompt != 0);
    if (extra_vars && cJSON_IsObject(extra_vars)) {
        for (const cJSON *v = extra_vars->child; v; v = v->next) {
            if (!v->string) continue;
            cJSON_DeleteItemFromObjectCaseSensitive(ctx, v->string);
            cJSON_AddItemReferenceToObject(ctx, v->string, (cJSON *)v);
        }
    }
    char *out = tmpl_render(t, ctx, out_len, e);
    cJSON_Delete(ctx);
    cJSON_Delete(empty);
    tmpl_destroy(t);
    return out;
}

static cJSON *read_json(const char *path, struct err *e)
{
    size_t n;
    char *s = util_read_file(path, &n, e);
    if (!s) return NULL;
    cJSON *j = cJSON_ParseWithLength(s, n);
    free(s);
    if (!j) err_set(e, "%s: not valid JSON", path);
    return j;
}

char *tmpl_load_from_model(const char *dir, const char *name, struct err *e)
{
    char path[4096];
    struct stat st;
    /* transformers prefers the standalone file over the tokenizer_config.json field */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (!name && stat(path, &st) == 0) return util_read_file(path, NULL, e);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cJSON *cfg = read_json(path, e);
    if (!cfg) return NULL;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    char *out = NULL;
    const char *want = name ? name : "default";
    if (cJSON_IsString(ct) && !name) {
        out = xstrdup(ct->valuestring);
    } else if (cJSON_IsArray(ct)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, ct)
        {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "template");
            if (cJSON_IsString(n) && cJSON_IsString(t) && !strcmp(n->valuestring, want)) {
                out = xstrdup(t->valuestring);
                break;
            }
        }
        if (!out) err_set(e, "%s: no chat template named '%s'", path, want);
    } else if (cJSON_IsString(ct)) {
        err_set(e, "%s: the model has a single chat template, not one named '%s'", path, name);
    } else {
        err_set(e, "%s: no chat_template (and no chat_template.jinja)", dir);
    }
    cJSON_Delete(cfg);
    return out;
}

cJSON *tmpl_special_tokens(const char *dir)
{
    cJSON *out = cJSON_CreateObject();
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cJSON *cfg = read_json(path, NULL);
    if (!cfg) return out;
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, names[i]);
        if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(v)) cJSON_AddStringToObject(out, names[i], v->valuestring);
    }
    cJSON_Delete(cfg);
    return out;
}
