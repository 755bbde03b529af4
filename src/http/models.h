/*
 * http models: the models a server serves, each under one or more names, each with its own
 * engine (and engine thread) once loaded. One loader thread loads a model when a request
 * wants it, unloads one that has been idle for --model-idle-timeout seconds, and keeps the
 * loaded models within --models-memory-budget bytes by unloading the least recently used
 * idle ones first. A model with requests in progress (held) is never unloaded.
 *
 *     struct http_models *ms = http_models_create(specs, n, &cfg, &e);
 *     int i = http_models_find(ms, "llama");              // -1: no such name (a 404)
 *     struct http_served *m = http_models_acquire(ms, i);  // NULL: not loaded; now wanted
 *     ... m->model, m->engine for the request ...
 *     http_models_release(ms, m);                          // one release per acquire
 *
 * A NULL acquire counts the caller as waiting (http_models_unwant undoes it) and wakes the
 * loader; cfg.on_change runs on the loader thread after every load, failed load and unload.
 * No h2o here: the server turns on_change into messages to its event loops.
 */
#ifndef PAGODA_HTTP_MODELS_H
#define PAGODA_HTTP_MODELS_H

#include <pthread.h>
#include <stddef.h>

#include "common/err.h"
#include "http/request.h"
#include "sched/engine.h"

enum http_model_state {
    HTTP_MODEL_UNLOADED,
    HTTP_MODEL_LOADING,
    HTTP_MODEL_LOADED,
    HTTP_MODEL_FAILED, /* the last load failed (error says why); the next request retries */
};

/** "unloaded", "loading", "loaded", "failed". */
const char *http_model_state_name(enum http_model_state s);

#define HTTP_MODEL_MAX_NAMES 8

/** One model as given on the command line: names (the first is the one responses carry). */
struct http_model_spec {
    char *names[HTTP_MODEL_MAX_NAMES];
    int n_names;
    char *dir;
};

#define HTTP_MODEL_MAX_NAMES 8

/**
 * Parses "DIR", "NAME=DIR" or "NAME,ALIAS,...=DIR" into sp (heap strings). An argument
 * that names an existing folder is a DIR even when it holds '='. A DIR alone is named after
 * its base name. 0, or -1 + e.
 */
int http_model_spec_parse(const char *arg, struct http_model_spec *sp, struct err *e);
/**
 * Reads a models file: one model a line in the form of http_model_spec_parse, blank lines
 * and lines starting with '#' skipped. Appends to *specs (n, cap). 0, or -1 + e naming the line.
 */
int http_model_specs_read(const char *path, struct http_model_spec **specs, int *n, struct err *e);
void http_model_spec_dispose(struct http_model_spec *sp);

struct http_models_config {
    struct engine_config engine; /* every model's engine options (model_dir set per model) */
    int skip_tokenizer_init;
    double idle_timeout; /* seconds a model with nothing in progress stays loaded; 0: for good */
    size_t budget;       /* bytes all loaded models may take; 0: no bound */
    const char *chat_template;    /* a template file in place of each model's; NULL: theirs */
    const char *tool_call_parser; /* vLLM's name (checked by the caller); NULL: from the
                                   * model's chat template */
    const char *reasoning_parser; /* vLLM's name (checked by the caller); NULL: none */
    void (*on_change)(void *user);
    void *user;
};

/** One served model. The loader thread writes it under the registry's lock; a holder reads
 * model and engine without it (they do not change while any request holds the model). */
struct http_served {
    struct http_model_spec spec;
    struct http_model model; /* name, names, tok, template, vocab, max_model_len, pooling */
    struct engine *engine;   /* set while LOADED */
    struct tok *tok;
    char *tmpl_src;
    cJSON *tmpl_vars;
    /* the tool-call and reasoning formats' markup (NULL-terminated): special tokens that
     * constrained decoding may write (engine_config.grammar_tags) */
    const char *grammar_tags[24];
    enum http_model_state state;
    int held;          /* requests using it now */
    int wanted;        /* requests waiting for it to load */
    unsigned failures; /* failed loads so far (a waiter compares it to see its load fail) */
    int retry;         /* a request came after the last failure: load again */
    double last_used;  /* util_now() of the last release */
    size_t bytes;      /* the folder's files plus the KV pool: what the budget counts */
    int max_model_len; /* known once it was loaded (0 before) */
    char error[1024];  /* why the last load failed */
    unsigned long loads, unloads_idle, unloads_memory;
};

struct http_models;

/** Checks the folders exist and sizes each model; loads nothing. NULL + e. */
struct http_models *http_models_create(const struct http_model_spec *specs, int n,
                                       const struct http_models_config *cfg, struct err *e);
/** Stops the loader thread (after a load in progress ends); no on_change runs after it. */
void http_models_stop(struct http_models *ms);
/** Stops the loader thread and unloads every model (nothing may hold one). */
void http_models_destroy(struct http_models *ms);

/** Starts the loader thread (load on demand, idle and budget unloading). */
int http_models_start(struct http_models *ms, struct err *e);

/**
 * Loads model i on the calling thread, in two stages so that a server can report a bad
 * tokenizer before it listens: stage 0 the tokenizer and template, stage 1 the engine.
 * For the model loaded at start; 0 or -1 + e.
 */
int http_models_load_now(struct http_models *ms, int i, int stage, struct err *e);

int http_models_count(const struct http_models *ms);
/** Model i (for listing; read its state under http_models_lock). */
struct http_served *http_models_at(struct http_models *ms, int i);
/** The model one of whose names is name, or -1. */
int http_models_find(const struct http_models *ms, const char *name);
/** Every name, comma-separated, for messages (static to the registry). */
const char *http_models_names(const struct http_models *ms);

/**
 * Model i held by the caller when LOADED; NULL otherwise, the caller then counted wanted
 * and *failures its failed loads so far (a later count tells the waiter its load failed).
 */
struct http_served *http_models_acquire(struct http_models *ms, int i, unsigned *failures);
/** Undoes the wanted count of a NULL acquire (the waiter is answered or gone). */
void http_models_unwant(struct http_models *ms, int i);
/** Model i's failed-load count and state, read together. */
void http_models_peek(struct http_models *ms, int i, enum http_model_state *state,
                      unsigned *failures, char *error, size_t n);
void http_models_release(struct http_models *ms, struct http_served *m);

void http_models_lock(struct http_models *ms);
void http_models_unlock(struct http_models *ms);

/** The sum of the loaded engines' statistics; returns how many are loaded. */
int http_models_stats(struct http_models *ms, struct engine_stats *out);

#endif
