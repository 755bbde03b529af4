/* The sentence-transformers files of a model folder: modules.json, the Pooling module's
 * config.json and config_sentence_transformers.json. */
#include "model/pooling.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

const char *pooling_kind_name(enum pooling_kind k)
{
    static const char *names[] = {"last-token", "mean", "cls"};
    return names[k];
}

/* Parses dir/rel into *out: 1 when read, 0 when the file is absent, -1 + err when it cannot
 * be read or is not a JSON object. */
static int read_json(const char *dir, const char *rel, cJSON **out, struct err *e)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    *out = NULL;
    if (access(path, F_OK) != 0) return 0;
    size_t len;
    char *text = util_read_file(path, &len, e);
    if (!text) return -1;
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(*out) && !cJSON_IsArray(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return err_set(e, "%s: not a JSON object or array", path);
    }
    return 1;
}

/* The class name at the end of a module type ("sentence_transformers.models.Pooling"). */
static const char *type_tail(const char *type)
{
    const char *dot = strrchr(type, '.');
    return dot ? dot + 1 : type;
}

__attribute__((format(printf, 2, 3))) static int refuse(struct pooling_config *pc, const char *fmt,
                                                        ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pc->why, sizeof pc->why, fmt, ap);
    va_end(ap);
    pc->can_embed = 0;
    return 0;
}

/* The Pooling module's config.json: exactly one mode of those pagoda runs. */
static int read_pooling(struct pooling_config *pc, const char *dir, const char *sub, int hidden,
                        struct err *e)
{
    char rel[1024];
    snprintf(rel, sizeof rel, "%s/config.json", sub);
    cJSON *o;
    int got = read_json(dir, rel, &o, e);
    if (got < 0) return -1;
    if (!got) return refuse(pc, "%.200s is missing", rel);
    static const struct {
        const char *key;
        int kind; /* -1: a mode pagoda does not run */
    } modes[] = {
        {"pooling_mode_lasttoken", POOLING_LAST},  {"pooling_mode_mean_tokens", POOLING_MEAN},
        {"pooling_mode_cls_token", POOLING_CLS},   {"pooling_mode_max_tokens", -1},
        {"pooling_mode_mean_sqrt_len_tokens", -1}, {"pooling_mode_weightedmean_tokens", -1}};
    int n_on = 0, rc = 0;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, modes[i].key))) continue;
        n_on++;
        if (modes[i].kind < 0) {
            refuse(pc, "%s is not supported (last token, mean and CLS pooling are)", modes[i].key);
            goto out;
        }
        pc->kind = (enum pooling_kind)modes[i].kind;
    }
    if (n_on != 1) {
        refuse(pc, "%.200s must turn on exactly one pooling mode", rel);
        goto out;
    }
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "word_embedding_dimension");
    pc->dim = cJSON_IsNumber(d) ? d->valueint : hidden;
    if (pc->dim != hidden) {
        refuse(pc, "word_embedding_dimension %d is not the hidden size %d", pc->dim, hidden);
        goto out;
    }
    const cJSON *ip = cJSON_GetObjectItemCaseSensitive(o, "include_prompt");
    pc->include_prompt = !cJSON_IsFalse(ip);
    pc->can_embed = 1;
out:
    cJSON_Delete(o);
    return rc;
}

/* config_sentence_transformers.json: the named prompts and the default one. */
static int read_prompts(struct pooling_config *pc, const char *dir, struct err *e)
{
    cJSON *o;
    int got = read_json(dir, "config_sentence_transformers.json", &o, e);
    if (got <= 0) return got;
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(o, "prompts"), *p;
    int n = cJSON_IsObject(ps) ? cJSON_GetArraySize(ps) : 0;
    pc->prompts = xcalloc((size_t)(n ? n : 1), sizeof *pc->prompts);
    cJSON_ArrayForEach(p, ps)
    {
        if (!cJSON_IsObject(ps) || !cJSON_IsString(p)) continue;
        pc->prompts[pc->n_prompts].name = xstrdup(p->string);
        pc->prompts[pc->n_prompts++].text = xstrdup(p->valuestring);
    }
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(o, "default_prompt_name");
    if (cJSON_IsString(dp)) pc->default_prompt = xstrdup(dp->valuestring);
    cJSON_Delete(o);
    if (pc->default_prompt && !pooling_prompt(pc, pc->default_prompt))
        return err_set(e,
                       "%s/config_sentence_transformers.json: default_prompt_name '%s' is not "
                       "one of its prompts",
                       dir, pc->default_prompt);
    return 0;
}

int pooling_config_load(struct pooling_config *pc, const char *dir, int hidden, struct err *e)
{
    memset(pc, 0, sizeof *pc);
    pc->include_prompt = 1;
    cJSON *mods;
    int got = read_json(dir, "modules.json", &mods, e);
    if (got < 0) return -1;
    if (!got)
        return refuse(pc, "%s",
                      "the folder has no modules.json (not a sentence-transformers "
                      "model)");
    int rc = 0, seen_pool = 0, i = 0;
    const cJSON *m;
    if (!cJSON_IsArray(mods)) {
        cJSON_Delete(mods);
        return err_set(e, "%s/modules.json: not a JSON array of modules", dir);
    }
    cJSON_ArrayForEach(m, mods)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(m, "type");
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(m, "path");
        if (!cJSON_IsString(type) || !cJSON_IsString(path)) {
            rc = err_set(e, "%s/modules.json: module %d needs a string 'type' and 'path'", dir, i);
            break;
        }
        const char *t = type_tail(type->valuestring);
        /* The pipeline pagoda runs: this folder's transformer, one pooling, a normalize. */
        int transformer = i == 0 && !strcmp(t, "Transformer") && !path->valuestring[0];
        if (i == 1 && !strcmp(t, "Pooling")) {
            seen_pool = 1;
            if ((rc = read_pooling(pc, dir, path->valuestring, hidden, e)) || !pc->can_embed) break;
        } else if (i == 2 && seen_pool && !strcmp(t, "Normalize")) {
            pc->normalize = 1;
        } else if (!transformer) {
            refuse(pc,
                   "modules.json: module '%.100s' is not supported here (pagoda runs this "
                   "folder's Transformer, a Pooling and a Normalize module)",
                   type->valuestring);
            break;
        }
        i++;
    }
    cJSON_Delete(mods);
    if (rc) return rc;
    if (!seen_pool && !pc->why[0]) refuse(pc, "%s", "modules.json has no Pooling module");
    if (!pc->can_embed) return 0;
    if (read_prompts(pc, dir, e)) {
        pooling_config_dispose(pc);
        return -1;
    }
    return 0;
}

const char *pooling_prompt(const struct pooling_config *pc, const char *name)
{
    for (int i = 0; i < pc->n_prompts; i++)
        if (!strcmp(pc->prompts[i].name, name)) return pc->prompts[i].text;
    return NULL;
}

void pooling_truncate(float *v, int keep)
{
    double ss = 0;
    for (int i = 0; i < keep; i++) ss += (double)v[i] * v[i];
    double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (int i = 0; i < keep; i++) v[i] = (float)(v[i] * inv);
}

void pooling_config_dispose(struct pooling_config *pc)
{
    for (int i = 0; i < pc->n_prompts; i++) free(pc->prompts[i].name), free(pc->prompts[i].text);
    free(pc->prompts);
    free(pc->default_prompt);
    memset(pc, 0, sizeof *pc);
}
