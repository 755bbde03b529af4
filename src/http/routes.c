/* Route dispatch (method, auth, readiness) and the routes that answer at once: models,
 * health, metrics, tokenize, detokenize and count_tokens. Generation and embeddings routes
 * parse their body here and hand it to a job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "http/internal.h"

void http_reply(h2o_req_t *req, enum http_route route, int status, const char *content_type,
                const char *body, size_t len)
{
    static const struct {
        int status;
        const char *reason;
    } reasons[] = {{200, "OK"},
                   {400, "Bad Request"},
                   {401, "Unauthorized"},
                   {404, "Not Found"},
                   {405, "Method Not Allowed"},
                   {413, "Payload Too Large"},
                   {429, "Too Many Requests"},
                   {500, "Internal Server Error"},
                   {503, "Service Unavailable"}};
    const char *reason = "Error";
    for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++)
        if (reasons[i].status == status) reason = reasons[i].reason;
    req->res.status = status;
    req->res.reason = reason;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, content_type,
                   strlen(content_type));
    http_metrics_request(http_loop_of(req)->srv->metrics, route, status);
    h2o_send_inline(req, body, len);
}

int http_anthropic_client(h2o_req_t *req)
{
    return h2o_find_header_by_str(&req->headers, H2O_STRLIT("anthropic-version"), -1) >= 0;
}

void http_reply_error(h2o_req_t *req, enum http_route route, const struct http_error *he)
{
    /* /v1/models serves both APIs: an Anthropic client says so with anthropic-version */
    int anthropic = route == HTTP_ROUTE_MESSAGES || route == HTTP_ROUTE_COUNT_TOKENS ||
                    (route == HTTP_ROUTE_MODELS && http_anthropic_client(req));
    char *body = anthropic ? http_error_anthropic(he) : http_error_openai(he);
    if (he->status == 401)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_WWW_AUTHENTICATE, NULL,
                       H2O_STRLIT("Bearer"));
    http_reply(req, route, he->status, "application/json", body, strlen(body));
    free(body);
}

/*
 * Admission: a generation request on a connection that already has
 * --max-streams-per-connection in progress, or whose n engine requests would make more than
 * --max-waiting-requests wait (queued in the engine, not running), is answered 429 with
 * Retry-After instead of queueing without bound. Returns 0 when admitted. Requests admitted
 * but not yet submitted count as waiting (s->unsubmitted); checks at the same moment on
 * several loops can still overshoot the waiting bound by the number of loops.
 */
static int admit(struct http_server *s, struct engine *en, h2o_req_t *req, enum http_route route,
                 int n)
{
    struct http_error he = {0};
    int per_conn = route != HTTP_ROUTE_EMBEDDINGS && s->cfg.max_conn_streams > 0
                       ? http_conn_streams(http_loop_of(req), req->conn)
                       : 0;
    if (per_conn >= s->cfg.max_conn_streams && s->cfg.max_conn_streams > 0) {
        http_error_set(&he, 429, NULL,
                       "this connection has %d requests in progress "
                       "(--max-streams-per-connection %d); retry later",
                       per_conn, s->cfg.max_conn_streams);
    } else {
        if (s->cfg.max_waiting <= 0) return 0;
        struct engine_stats st;
        engine_stats(en, &st);
        int waiting = engine_live(en) - st.running + atomic_load(&s->unsubmitted);
        if (waiting + n <= s->cfg.max_waiting) return 0;
        http_error_set(&he, 429, NULL,
                       "the server is at capacity: %d requests are waiting "
                       "(--max-waiting-requests %d); retry later",
                       waiting, s->cfg.max_waiting);
    }
    snprintf(he.code, sizeof he.code, "rate_limit_exceeded");
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL, H2O_STRLIT("1"));
    http_metrics_rejected(s->metrics,
                          per_conn >= s->cfg.max_conn_streams && s->cfg.max_conn_streams > 0);
    http_reply_error(req, route, &he);
    return -1;
}

static void reply_buf(h2o_req_t *req, enum http_route route, struct http_buf *b)
{
    http_reply(req, route, 200, "application/json", b->p ? b->p : "", b->len);
    http_buf_dispose(b);
}

/* scheme: a prefix compared without regard to case ("Bearer " in RFC 7235 is); "" for none */
static int header_is(h2o_req_t *req, const char *name, const char *scheme, const char *value,
                     size_t vlen)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, name, strlen(name), -1);
    if (i < 0) return 0;
    h2o_iovec_t v = req->headers.entries[i].value;
    size_t sl = strlen(scheme);
    if (v.len < sl || !h2o_lcstris(v.base, sl, scheme, sl)) return 0;
    v.base += sl;
    v.len -= sl;
    /* Constant time over the key's length. */
    if (v.len != vlen) return 0;
    unsigned char diff = 0;
    for (size_t k = 0; k < vlen; k++) diff |= (unsigned char)(v.base[k] ^ value[k]);
    return diff == 0;
}

static int authorized(struct http_server *s, h2o_req_t *req)
{
    const char *key = s->cfg.api_key;
    if (!key) return 1;
    size_t kl = strlen(key);
    return header_is(req, "authorization", "bearer ", key, kl) ||
           header_is(req, "x-api-key", "", key, kl);
}

static cJSON *body_json(h2o_req_t *req, struct http_error *he)
{
    return http_json_parse_body(req->entity.base ? req->entity.base : "", req->entity.len, he);
}

static void route_metrics(struct http_server *s, h2o_req_t *req)
{
    struct http_buf b = {0};
    struct engine_stats st;
    /* the engines' statistics summed over the loaded models (none while the one model
     * given loads at start) */
    http_models_stats(s->models, &st);
    http_metrics_render(s->metrics, atomic_load(&s->ready) ? &st : NULL, &b);
    http_routes_models_metrics(s->models, &b);
    http_buf_puts(&b, "# HELP pagoda_http_connections_total Connections accepted, by event loop.\n"
                      "# TYPE pagoda_http_connections_total counter\n");
    for (int i = 0; i < s->n_loops; i++)
        http_buf_printf(&b, "pagoda_http_connections_total{loop=\"%d\"} %lu\n", i,
                        atomic_load(&s->loops[i].accepted));
    http_reply(req, HTTP_ROUTE_METRICS, 200, "text/plain; version=0.0.4; charset=utf-8", b.p,
               b.len);
    http_buf_dispose(&b);
}

/* POST /tokenize: {"prompt": text, "add_special_tokens"} or {"messages": [...]}. */
static void route_tokenize(const struct http_model *model, h2o_req_t *req, const cJSON *body)
{
    struct http_error he = {0};
    int32_t *ids = NULL;
    int n = 0;
    if (http_check_model(body, model, 0, &he) < 0) goto fail;
    if (!model->tok) {
        http_error_no_tokenizer(&he, NULL, "/tokenize");
        goto fail;
    }
    if (cJSON_GetObjectItemCaseSensitive(body, "messages")) {
        if (http_chat_prompt(HTTP_API_CHAT, body, model, &ids, &n, NULL, &he) < 0) goto fail;
    } else {
        const char *prompt = NULL;
        int add = 1;
        if (http_json_str(body, "prompt", &prompt, &he) < 0) goto fail;
        if (!prompt) {
            http_error_set(&he, 400, "prompt", "'prompt' (a string) or 'messages' is required");
            goto fail;
        }
        if (http_json_bool(body, "add_special_tokens", &add, &he) < 0) goto fail;
        size_t nn = 0;
        struct err e = {0};
        if (tok_encode(model->tok, prompt, strlen(prompt), add, &ids, &nn, &e) != 0) {
            http_error_set(&he, 400, "prompt", "the prompt cannot be tokenized: %s", e.msg);
            goto fail;
        }
        n = (int)nn;
    }
    struct http_buf b = {0};
    http_buf_printf(&b, "{\"count\":%d,\"max_model_len\":%d,\"tokens\":[", n, model->max_model_len);
    for (int i = 0; i < n; i++) http_buf_printf(&b, "%s%d", i ? "," : "", ids[i]);
    http_buf_puts(&b, "]}");
    free(ids);
    reply_buf(req, HTTP_ROUTE_TOKENIZE, &b);
    return;
fail:
    free(ids);
    http_reply_error(req, HTTP_ROUTE_TOKENIZE, &he);
}

/* POST /detokenize: {"tokens": [ids]} -> {"prompt": text}. */
static void route_detokenize(const struct http_model *model, h2o_req_t *req, const cJSON *body)
{
    struct http_error he = {0};
    if (http_check_model(body, model, 0, &he) < 0) goto fail;
    if (!model->tok) {
        http_error_no_tokenizer(&he, NULL, "/detokenize");
        goto fail;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(body, "tokens");
    if (!cJSON_IsArray(t)) {
        http_error_set(&he, 400, "tokens", "'tokens' must be an array of token ids");
        goto fail;
    }
    int n = cJSON_GetArraySize(t), i = 0;
    int32_t *ids = xmalloc(sizeof *ids * (size_t)(n ? n : 1));
    const cJSON *v;
    cJSON_ArrayForEach(v, t)
    {
        if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble ||
            v->valuedouble < 0 || v->valuedouble >= model->vocab) {
            free(ids);
            http_error_set(&he, 400, "tokens",
                           "'tokens[%d]' is not a token id of the vocabulary (0..%d)", i,
                           model->vocab - 1);
            goto fail;
        }
        ids[i++] = (int32_t)v->valuedouble;
    }
    size_t len = 0;
    char *text = tok_decode_len(model->tok, ids, (size_t)n, 0, &len);
    free(ids);
    struct http_buf b = {0};
    http_buf_puts(&b, "{\"prompt\":");
    http_buf_json_str(&b, text ? text : "", text ? len : 0);
    http_buf_puts(&b, "}");
    free(text);
    reply_buf(req, HTTP_ROUTE_DETOKENIZE, &b);
    return;
fail:
    http_reply_error(req, HTTP_ROUTE_DETOKENIZE, &he);
}

static void route_count_tokens(const struct http_model *model, h2o_req_t *req, const cJSON *body)
{
    struct http_error he = {0};
    int32_t *ids = NULL;
    int n = 0;
    if (http_check_model(body, model, 1, &he) < 0 ||
        http_chat_prompt(HTTP_API_MESSAGES, body, model, &ids, &n, NULL, &he) < 0) {
        http_reply_error(req, HTTP_ROUTE_COUNT_TOKENS, &he);
        return;
    }
    free(ids);
    struct http_buf b = {0};
    http_buf_printf(&b, "{\"input_tokens\":%d}", n);
    reply_buf(req, HTTP_ROUTE_COUNT_TOKENS, &b);
}

static const struct {
    const char *path;
    const char *method;
    enum http_route route;
} routes[] = {
    {"/v1/chat/completions", "POST", HTTP_ROUTE_CHAT},
    {"/v1/completions", "POST", HTTP_ROUTE_COMPLETIONS},
    {"/v1/messages", "POST", HTTP_ROUTE_MESSAGES},
    {"/v1/messages/count_tokens", "POST", HTTP_ROUTE_COUNT_TOKENS},
    {"/v1/models", "GET", HTTP_ROUTE_MODELS},
    {"/health", "GET", HTTP_ROUTE_HEALTH},
    {"/metrics", "GET", HTTP_ROUTE_METRICS},
    {"/tokenize", "POST", HTTP_ROUTE_TOKENIZE},
    {"/detokenize", "POST", HTTP_ROUTE_DETOKENIZE},
    {"/v1/embeddings", "POST", HTTP_ROUTE_EMBEDDINGS},
};

/*
 * CORS (--allowed-origins, as vLLM): a request whose Origin is allowed gets
 * Access-Control-Allow-Origin (the origin itself, or * when every origin is), and a
 * preflight (OPTIONS with Access-Control-Request-Method) is answered 204 with the methods
 * and the headers asked for, before authentication (browsers send preflights without
 * credentials). Returns 1 when req was a preflight and is answered.
 */
static int origin_allowed(const char *list, h2o_iovec_t origin)
{
    /* list: "*", or origins separated by commas, spaces, quotes or brackets (a JSON list) */
    for (const char *p = list; *p;) {
        while (*p && strchr("[], \"'", *p)) p++;
        const char *e = p;
        while (*e && !strchr("[], \"'", *e)) e++;
        size_t n = (size_t)(e - p);
        if (n == 1 && *p == '*') return 2;
        if (n && n == origin.len && !memcmp(p, origin.base, n)) return 1;
        p = e;
    }
    return 0;
}

static int cors(struct http_server *s, h2o_req_t *req)
{
    const char *list = s->cfg.allowed_origins;
    ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("origin"), -1);
    if (!list || !*list || i < 0) return 0;
    h2o_iovec_t origin = req->headers.entries[i].value;
    int ok = origin_allowed(list, origin);
    if (!ok) return 0;
    if (ok == 2)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ACCESS_CONTROL_ALLOW_ORIGIN, NULL,
                       H2O_STRLIT("*"));
    else {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ACCESS_CONTROL_ALLOW_ORIGIN, NULL,
                       origin.base, origin.len);
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_VARY, NULL, H2O_STRLIT("Origin"));
    }
    ssize_t m =
        h2o_find_header_by_str(&req->headers, H2O_STRLIT("access-control-request-method"), -1);
    if (!h2o_memis(req->method.base, req->method.len, H2O_STRLIT("OPTIONS")) || m < 0) return 0;
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("access-control-allow-methods"),
                          0, NULL, H2O_STRLIT("GET, POST, OPTIONS"));
    ssize_t h =
        h2o_find_header_by_str(&req->headers, H2O_STRLIT("access-control-request-headers"), -1);
    if (h >= 0)
        h2o_add_header_by_str(
            &req->pool, &req->res.headers, H2O_STRLIT("access-control-allow-headers"), 0, NULL,
            req->headers.entries[h].value.base, req->headers.entries[h].value.len);
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("access-control-max-age"), 0,
                          NULL, H2O_STRLIT("600"));
    req->res.status = 204;
    req->res.reason = "No Content";
    h2o_send_inline(req, "", 0);
    return 1;
}

/* The index in routes[] of path[0..plen) (GET /v1/models/{id} is /v1/models's), or -1. */
static int route_index(const char *path, size_t plen)
{
    int found = -1;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        size_t n = strlen(routes[i].path);
        if (n == plen && !memcmp(routes[i].path, path, plen)) found = (int)i;
        if (routes[i].route == HTTP_ROUTE_MODELS && plen > n + 1 &&
            !memcmp(routes[i].path, path, n) && path[n] == '/')
            found = (int)i;
    }
    return found;
}

enum http_route http_route_of_path(h2o_iovec_t path)
{
    const char *q = memchr(path.base, '?', path.len);
    int i = path.base ? route_index(path.base, q ? (size_t)(q - path.base) : path.len) : -1;
    return i >= 0 ? routes[i].route : HTTP_ROUTE_OTHER;
}

int http_routes_dispatch(struct http_loop *l, h2o_req_t *req)
{
    struct http_server *s = l->srv;
    if (cors(s, req)) return 0;
    size_t plen = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    int found = route_index(req->path.base, plen);
    struct http_error he = {0};
    enum http_route route = found >= 0 ? routes[found].route : HTTP_ROUTE_OTHER;
    if (found < 0) {
        http_error_set(&he, 404, NULL, "no route for %.*s %.*s", (int)req->method.len,
                       req->method.base, (int)(plen < 200 ? plen : 200), req->path.base);
        http_reply_error(req, route, &he);
        return 0;
    }
    const char *method = routes[found].method;
    int head = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
    if (!h2o_memis(req->method.base, req->method.len, method, strlen(method)) &&
        !(head && !strcmp(method, "GET"))) {
        http_error_set(&he, 405, NULL, "%s only accepts %s", routes[found].path, method);
        http_reply_error(req, route, &he);
        return 0;
    }
    /* h2o reads bodies up to twice --max-body-size (so that an HTTP/2 client gets this 413
     * rather than a REFUSED_STREAM it retries; see transport.c) */
    if (req->entity.len > s->cfg.max_body) {
        http_error_set(&he, 413, NULL,
                       "the request body (%zu bytes) is larger than --max-body-size (%zu bytes)",
                       req->entity.len, s->cfg.max_body);
        http_reply_error(req, route, &he);
        return 0;
    }
    int shutting = atomic_load(&s->shutting_down), ready = atomic_load(&s->ready);
    if (route == HTTP_ROUTE_HEALTH) {
        const char *b = shutting ? "{\"status\":\"shutting_down\"}"
                        : ready  ? "{\"status\":\"ok\"}"
                                 : "{\"status\":\"loading\"}";
        http_reply(req, route, ready && !shutting ? 200 : 503, "application/json", b, strlen(b));
        return 0;
    }
    if (route == HTTP_ROUTE_METRICS) {
        route_metrics(s, req);
        return 0;
    }
    if (!authorized(s, req)) {
        http_error_set(&he, 401, NULL,
                       "Incorrect or missing API key: send it as "
                       "'Authorization: Bearer KEY' or 'x-api-key: KEY'");
        snprintf(he.code, sizeof he.code, "invalid_api_key");
        http_reply_error(req, route, &he);
        return 0;
    }
    if (!ready || shutting) {
        http_error_set(&he, 503, NULL,
                       shutting ? "the server is shutting down" : "the model is still loading");
        http_reply_error(req, route, &he);
        return 0;
    }
    if (route == HTTP_ROUTE_MODELS) {
        size_t base = strlen(routes[found].path);
        if (plen > base)
            http_routes_models(s, req, req->path.base + base + 1, plen - base - 1);
        else
            http_routes_models(s, req, NULL, 0);
        return 0;
    }
    http_routes_model(l, req, route);
    return 0;
}

/*
 * The routes that need a model: the body's "model" picks it (the first model when it is
 * not given); a loaded model is held for the request, an unloaded one is loaded on the
 * loader thread while the request waits on this loop (the body stays in req->pool and is
 * parsed again when the model is there).
 */
void http_routes_model(struct http_loop *l, h2o_req_t *req, enum http_route route)
{
    struct http_server *s = l->srv;
    struct http_models *ms = s->models;
    struct http_error he = {0};
    cJSON *body = body_json(req, &he);
    if (!body) {
        http_reply_error(req, route, &he);
        return;
    }
    const char *name = NULL;
    int r = http_json_str(body, "model", &name, &he), i = 0;
    if (r == 0 && (route == HTTP_ROUTE_MESSAGES || route == HTTP_ROUTE_COUNT_TOKENS))
        r = http_error_set(&he, 400, "model", "'model' is required");
    if (r > 0 && (i = http_models_find(ms, name)) < 0) {
        r = http_error_set(&he, 404, "model",
                           "The model '%.100s' does not exist (this server has %s)", name,
                           http_models_names(ms));
        snprintf(he.code, sizeof he.code, "model_not_found");
    }
    if (r < 0) {
        cJSON_Delete(body);
        http_reply_error(req, route, &he);
        return;
    }
    unsigned failures = 0;
    struct http_served *m = http_models_acquire(ms, i, &failures);
    if (!m) {
        cJSON_Delete(body);
        http_models_wait(l, req, route, i, failures);
        return;
    }
    const struct http_model *model = &m->model;
    if (route == HTTP_ROUTE_TOKENIZE)
        route_tokenize(model, req, body);
    else if (route == HTTP_ROUTE_DETOKENIZE)
        route_detokenize(model, req, body);
    else if (route == HTTP_ROUTE_COUNT_TOKENS)
        route_count_tokens(model, req, body);
    else if (route == HTTP_ROUTE_EMBEDDINGS) {
        struct http_embed q;
        if (http_embed_parse(body, model, &q, &he) < 0)
            http_reply_error(req, route, &he);
        else if (admit(s, m->engine, req, route, q.n_inputs) < 0)
            http_embed_dispose(&q);
        else {
            http_embed_start(l, req, m, &q);
            m = NULL; /* the job holds it */
        }
    } else {
        enum http_api api = route == HTTP_ROUTE_CHAT          ? HTTP_API_CHAT
                            : route == HTTP_ROUTE_COMPLETIONS ? HTTP_API_COMPLETIONS
                                                              : HTTP_API_MESSAGES;
        struct http_gen g;
        if (http_gen_parse(api, body, model, &g, &he) < 0)
            http_reply_error(req, route, &he);
        else if (admit(s, m->engine, req, route, g.n_prompts * g.n) < 0)
            http_gen_dispose(&g);
        else {
            http_job_start(l, req, route, m, &g);
            m = NULL;
        }
    }
    if (m) http_models_release(ms, m);
    cJSON_Delete(body);
}
