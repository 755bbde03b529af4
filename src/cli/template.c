/*
 * template subcommand: renders a chat template exactly as the model would be prompted,
 * for checking a model's template or a conversation without running the model.
 *
 *   pagoda template (--model DIR | --template FILE) --messages-file F [--tools-file F]
 *                   [--vars-file F] [--add-generation-prompt] [--name NAME]
 *
 * Output is the prompt bytes, nothing added. Exit 1 when the template raises (its
 * message on stderr), 2 on usage errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/util.h"
#include "text/tmpl.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: pagoda template (--model DIR | --template FILE) --messages-file F\n"
               "                       [--tools-file F] [--vars-file F] [--add-generation-prompt]\n"
               "                       [--name NAME]\n"
               "  --model DIR            use DIR's chat template and special tokens\n"
               "  --template FILE        use the Jinja template in FILE\n"
               "  --messages-file F      JSON list of {\"role\", \"content\", ...}\n"
               "  --tools-file F         JSON list of tool schemas (passed as `tools`)\n"
               "  --vars-file F          JSON object of extra variables (bos_token, ...)\n"
               "  --add-generation-prompt  end with the assistant turn header\n"
               "  --name NAME            pick a named template of tokenizer_config.json\n");
}

static cJSON *load_json(const char *path, const char *what)
{
    struct err e = {0};
    size_t n;
    char *s = util_read_file(path, &n, &e);
    if (!s) {
        fprintf(stderr, "pagoda template: %s\n", e.msg);
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(s, n);
    free(s);
    if (!j) fprintf(stderr, "pagoda template: %s: %s is not valid JSON\n", path, what);
    return j;
}

int cli_template(int argc, char **argv)
{
    const char *model = NULL, *tfile = NULL, *mfile = NULL, *toolfile = NULL, *vfile = NULL;
    const char *name = NULL;
    int gen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--model")           ? &model
                           : !strcmp(a, "--template")      ? &tfile
                           : !strcmp(a, "--messages-file") ? &mfile
                           : !strcmp(a, "--tools-file")    ? &toolfile
                           : !strcmp(a, "--vars-file")     ? &vfile
                           : !strcmp(a, "--name")          ? &name
                                                           : NULL;
        if (dst) {
            if (i + 1 >= argc) {
                fprintf(stderr, "pagoda template: %s needs a value\n", a);
                return 2;
            }
            *dst = argv[++i];
        } else if (!strcmp(a, "--add-generation-prompt")) {
            gen = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "pagoda template: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!!model == !!tfile || !mfile) {
        fprintf(stderr, "pagoda template: give one of --model/--template, and --messages-file\n");
        usage(stderr);
        return 2;
    }
    struct err e = {0};
    char *src = model ? tmpl_load_from_model(model, name, &e) : util_read_file(tfile, NULL, &e);
    if (!src) {
        fprintf(stderr, "pagoda template: %s\n", e.msg);
        return 1;
    }
    int rc = 1;
    cJSON *messages = load_json(mfile, "messages");
    cJSON *tools = toolfile ? load_json(toolfile, "tools") : NULL;
    cJSON *vars = vfile ? load_json(vfile, "vars") : NULL;
    cJSON *all = model ? tmpl_special_tokens(model) : cJSON_CreateObject();
    if (!messages || (toolfile && !tools) || (vfile && !vars)) goto done;
    if (!cJSON_IsArray(messages)) {
        fprintf(stderr, "pagoda template: %s: messages must be a JSON list\n", mfile);
        goto done;
    }
    if (vars && !cJSON_IsObject(vars)) {
        fprintf(stderr, "pagoda template: %s: vars must be a JSON object\n", vfile);
        goto done;
    }
    /* the vars file overrides the model's special tokens */
    for (cJSON *v = vars ? vars->child : NULL; v; v = v->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(all, v->string);
        cJSON_AddItemReferenceToObject(all, v->string, v);
    }
    size_t len;
    char *out = tmpl_apply_chat(src, messages, tools, NULL, gen, all, &len, &e);
    if (!out) {
        fprintf(stderr, "pagoda template: %s\n", e.msg);
        goto done;
    }
    rc = fwrite(out, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : 1;
    free(out);
done:
    cJSON_Delete(messages);
    cJSON_Delete(tools);
    cJSON_Delete(vars);
    cJSON_Delete(all);
    free(src);
    return rc;
}
