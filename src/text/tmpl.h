/*
 * tmpl: the chat-template renderer. Hugging Face models ship a Jinja template that turns a
 * conversation (messages, tools, documents) into the prompt text the model was trained on;
 * this module parses and renders those templates the way transformers' apply_chat_template
 * does (jinja2 sandbox, trim_blocks + lstrip_blocks, its own tojson, raise_exception,
 * strftime_now), so a prompt built here is byte-identical to the Python one.
 *
 *     struct err e = {0};
 *     char *src = tmpl_load_from_model(dir, NULL, &e);
 *     char *prompt = tmpl_apply_chat(src, messages, NULL, NULL, 1, NULL, &len, &e);
 *
 * A parsed template is immutable and may be rendered from several threads at once. Bad
 * templates and bad contexts never crash: they return NULL with a message in `e`
 * ("TypeError: ... (line N)", or the template's own text for raise_exception).
 */
#ifndef PAGODA_MODEL_TMPL_H
#define PAGODA_MODEL_TMPL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/err.h"

struct tmpl;

/** Parses template source (need not be NUL-terminated). NULL + err on a syntax error. */
struct tmpl *tmpl_parse(const char *src, size_t len, struct err *e);

/** Frees a parsed template (NULL is fine). */
void tmpl_destroy(struct tmpl *t);

/**
 * Renders with `context` (a JSON object: its members are the template's variables).
 * Returns a heap string (NUL-terminated, length in *out_len when non-NULL) the caller
 * frees, or NULL + err when the template raises or misuses a value.
 */
char *tmpl_render(const struct tmpl *t, const cJSON *context, size_t *out_len, struct err *e);

/**
 * Renders a chat the way transformers' apply_chat_template does: the variables are
 * messages, tools (None when NULL), documents (None when NULL), add_generation_prompt and
 * every member of `extra_vars` (bos_token, eos_token, date_string, ...).
 */
char *tmpl_apply_chat(const char *template_src, const cJSON *messages, const cJSON *tools,
                      const cJSON *documents, int add_generation_prompt, const cJSON *extra_vars,
                      size_t *out_len, struct err *e);

/**
 * Reads a model folder's chat template: DIR/chat_template.jinja when present, else
 * `chat_template` of DIR/tokenizer_config.json (a string, or a list of {"name","template"}
 * from which `name` is picked, "default" when name is NULL). Heap string, or NULL + err.
 */
char *tmpl_load_from_model(const char *dir, const char *name, struct err *e);

/**
 * The special tokens of a model folder as template variables: a JSON object with
 * bos_token, eos_token, unk_token, pad_token (those tokenizer_config.json names, as strings
 * whether stored as strings or {"content": ...}). Never NULL; caller deletes.
 */
cJSON *tmpl_special_tokens(const char *dir);

#endif
