/*
 * http request: the body of a generation request (OpenAI chat or completions, Anthropic
 * messages) parsed and validated into what the engine needs: token-id prompts, sampling
 * parameters, stop strings and the output options. Pure: needs the tokenizer and the
 * chat template, not the engine, so every rule here is unit-tested on its own.
 *
 *     struct http_gen g;
 *     if (http_gen_parse(HTTP_API_CHAT, body, &model, &g, &he) < 0) reply_error(&he);
 *     ... submit g.n_prompts * g.n engine requests ...
 *     http_gen_dispose(&g);
 */
#ifndef PAGODA_HTTP_REQUEST_H
#define PAGODA_HTTP_REQUEST_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "http/json.h"
#include "text/reasoning.h"
#include "text/tokenizer.h"
#include "text/toolcall.h"
#include "sched/engine.h"

enum http_api {
    HTTP_API_CHAT,        /* POST /v1/chat/completions */
    HTTP_API_COMPLETIONS, /* POST /v1/completions */
    HTTP_API_MESSAGES,    /* POST /v1/messages (Anthropic) */
};

#define HTTP_MAX_STOP     16  /* stop strings per request */
#define HTTP_MAX_STOP_LEN 256 /* bytes per stop string */
#define HTTP_MAX_N        16  /* choices per prompt */
#define HTTP_MAX_PROMPTS  64  /* prompts per completions request */
#define HTTP_MAX_TOOLS    128 /* tools per request */
#define HTTP_MAX_CALLS    16  /* tool calls a required / named choice may make in one answer */

/** What the routes know of the served model. */
struct http_model {
    const char *name;         /* the served model name (responses carry it) */
    const char *const *names; /* [n_names] every name "model" may give (aliases); NULL: name */
    int n_names;
    const struct tok *tok;  /* tokenizer; NULL with --skip-tokenizer-init (token ids only) */
    const char *tmpl_src;   /* chat template source, NULL when the model has none */
    const cJSON *tmpl_vars; /* bos_token, eos_token, ... for the template */
    int32_t vocab;          /* token ids must be < this */
    int max_model_len;      /* prompt + max_tokens must fit */
    /* the model folder's pooling, for embeddings (NULL while the model loads) */
    const struct pooling_config *pooling;
    enum tcall_format tool_format;    /* --tool-call-parser, or what the template shows */
    enum reason_format reason_format; /* --reasoning-parser (REASON_NONE: no split) */
};

enum http_tool_choice {
    HTTP_TOOLS_NONE,     /* no tools, or tool_choice none: plain text */
    HTTP_TOOLS_AUTO,     /* the model may call tools */
    HTTP_TOOLS_REQUIRED, /* at least one call (Anthropic "any"), enforced by a grammar */
    HTTP_TOOLS_NAMED,    /* a call of tool_name, enforced by a grammar */
};

/** One parsed generation request. */
struct http_gen {
    enum http_api api;
    int32_t **prompts;  /* [n_prompts] token ids */
    int *n_prompt;      /* [n_prompts] */
    char **prompt_text; /* [n_prompts] the prompt as text (for echo) */
    int n_prompts;
    int n; /* choices per prompt */
    struct sampling_params sp;
    int max_tokens_given; /* 0: max_tokens was derived from the context */
    char *stop[HTTP_MAX_STOP];
    int n_stop;
    int32_t *stop_ids; /* stop_token_ids */
    int n_stop_ids;
    struct logit_bias *bias;
    int n_bias;
    int stream, include_usage;
    int echo;          /* completions: prepend the prompt */
    int logprobs;      /* report per-token log-probabilities */
    int top_logprobs;  /* alternatives per token */
    int tokens_as_ids; /* return_tokens_as_token_ids */
    int skip_special;  /* drop special tokens from text (default 1) */
    int return_ids;    /* return_token_ids: prompt_token_ids and token_ids in the response
                        * (default: on without a tokenizer, where text is always "") */
    int score_only;    /* max_tokens 0 with echo: no output, the prompt's logprobs */
    int priority;      /* engine queue order: lower first (vLLM's "priority") */
    /* tool calling and reasoning (chat and messages) */
    cJSON *tools; /* the request's tools in OpenAI's shape, NULL when none */
    enum http_tool_choice tool_choice;
    int parallel_calls;               /* parallel_tool_calls (default 1) */
    enum tcall_format tool_format;    /* parser of the output, TCALL_NONE: no tool calls */
    enum reason_format reason_format; /* REASON_NONE: no thinking split */
    int think_open;                   /* the prompt ends inside an open <think> */
    char *trigger; /* sp.grammar_trigger when built for the request (heap), else NULL */
    int32_t *think_start, *think_end; /* the tags' ids, for the thinking budget */
};

/**
 * Structured output (response_format, guided_json / guided_regex / guided_choice /
 * guided_grammar) into g->sp.grammar, compiled through the compile cache. 0, or -1 + he
 * (400 naming the field) when a field is malformed or its schema, regex or grammar is invalid.
 */
int http_parse_structured(enum http_api api, const cJSON *body, struct http_gen *g,
                          struct http_error *he);

/**
 * The request's tools in OpenAI's shape ([{"type": "function", "function": {"name",
 * "description", "parameters"}}]; Anthropic's {name, description, input_schema} converted):
 * *out a new array, or NULL when there are none. 0, or -1 + he naming the bad field.
 */
int http_tools_parse(enum http_api api, const cJSON *body, cJSON **out, struct http_error *he);

/**
 * tools, tool_choice, parallel_tool_calls (OpenAI) or tool_choice.disable_parallel_tool_use
 * (Anthropic) into g: the output parser and, for a required or named choice, the grammar
 * of the parser's wire format. Runs after http_parse_structured (the two conflict) and
 * after the prompt (a prompt that opened thinking puts the calls after its end tag).
 */
int http_parse_tools(enum http_api api, const cJSON *body, const struct http_model *m,
                     struct http_gen *g, struct http_error *he);

/**
 * The thinking budget (Anthropic thinking.budget_tokens, OpenAI reasoning_effort) into
 * g->sp; runs after the prompt and max_tokens are known. 0 or -1 + he.
 */
int http_parse_thinking(enum http_api api, const cJSON *body, const struct http_model *m,
                        struct http_gen *g, struct http_error *he);

/**
 * Converts one message's tool parts for the template: OpenAI assistant `tool_calls`
 * (function.arguments parsed into an object, as HF templates iterate it) into out_msg, or
 * an Anthropic message's content blocks (text, tool_use, tool_result, thinking) into
 * messages appended to out (tool results as role "tool" with tool_call_id). 0 or -1 + he.
 */
int http_openai_tool_calls(const cJSON *calls, const char *path, cJSON *out_msg,
                           struct http_error *he);
int http_anthropic_blocks(const char *role, const cJSON *content, const char *path, cJSON *out,
                          struct http_error *he);

/**
 * The template variables of a chat request: the model's (bos_token, ...), then
 * chat_template_kwargs, and for Anthropic `thinking` as enable_thinking. A new object.
 */
cJSON *http_template_vars(enum http_api api, const cJSON *body, const struct http_model *m,
                          struct http_error *he);

/** Parses and validates body for api into g. 0, or -1 with he (g then holds nothing). */
int http_gen_parse(enum http_api api, const cJSON *body, const struct http_model *m,
                   struct http_gen *g, struct http_error *he);
void http_gen_dispose(struct http_gen *g);

/**
 * The prompt token ids of a chat (OpenAI messages) or an Anthropic request: messages
 * checked, the template applied, the text tokenized. Heap ids in *ids. 0 or -1 + he.
 */
int http_chat_prompt(enum http_api api, const cJSON *body, const struct http_model *m,
                     int32_t **ids, int *n, char **text, struct http_error *he);

/**
 * The 400 for what needs the tokenizer on a server without one (--skip-tokenizer-init):
 * `what` names it ("a text prompt", "chat messages"). Returns -1.
 */
int http_error_no_tokenizer(struct http_error *he, const char *param, const char *what);

/** Checks the "model" field against the served names (404 when it is none of them). */
int http_check_model(const cJSON *body, const struct http_model *m, int required,
                     struct http_error *he);

#endif
