/*
 * The routes of the model registry (http/models.h): GET /v1/models and GET /v1/models/{id}
 * with each model's state, the per-model series of /metrics, and the requests that wait on
 * their loop while the loader thread loads their model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "http/internal.h"

static void reply_json(h2o_req_t *req, struct http_buf *b)
{
    http_reply(req, HTTP_ROUTE_MODELS, 200, "application/json", b->p ? b->p : "", b->len);
    http_buf_dispose(b);
}

static int nibble(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Percent-decodes src[0..n) into dst (n + 1 bytes); -1 on a bad escape or a NUL byte. */
static int url_decode(const char *src, size_t n, char *dst)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)src[i];
        if (c == '%') {
            if (n - i < 3) return -1;
            int hi = nibble(src[i + 1]), lo = nibble(src[i + 2]);
            if (hi < 0 || lo < 0) return -1;
            c = hi << 4 | lo;
            i += 2;
        }
        if (!c) return -1;
        dst[o++] = (char)c;
    }
    dst[o] = 0;
    return 0;
}

/* One model object: OpenAI's {"id","object":"model",...} or Anthropic's {"type":"model",...},
 * with the model's state ("loaded", "unloaded", "loading", "failed"). Lock held. */
static void model_object(struct http_server *s, const struct http_served *m, const char *name,
                         int anthropic, struct http_buf *b)
{
    if (anthropic) {
        char ts[32];
        struct tm tm;
        gmtime_r(&s->started, &tm);
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
        http_buf_puts(b, "{\"type\":\"model\",\"id\":");
        http_buf_json_str(b, name, strlen(name));
        http_buf_puts(b, ",\"display_name\":");
        http_buf_json_str(b, name, strlen(name));
        http_buf_printf(b, ",\"created_at\":\"%s\"", ts);
    } else {
        http_buf_puts(b, "{\"id\":");
        http_buf_json_str(b, name, strlen(name));
        http_buf_printf(b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"pagoda\"",
                        (long)s->started);
        if (m->max_model_len) http_buf_printf(b, ",\"max_model_len\":%d", m->max_model_len);
    }
    http_buf_printf(b, ",\"state\":\"%s\"}", http_model_state_name(m->state));
}

/* GET /v1/models (every name of every model) and GET /v1/models/{id} (path: the id part,
 * still percent-encoded; NULL for the list). */
void http_routes_models(struct http_server *s, h2o_req_t *req, const char *id, size_t id_len)
{
    int anthropic = http_anthropic_client(req);
    struct http_buf b = {0};
    struct http_models *ms = s->models;
    if (id) {
        struct http_error he = {0};
        char *name = xmalloc(id_len + 1);
        int i = url_decode(id, id_len, name) < 0 ? -1 : http_models_find(ms, name);
        if (i < 0) {
            http_error_set(&he, 404, "model",
                           "The model '%.100s' does not exist (this server has %s)", name,
                           http_models_names(ms));
            snprintf(he.code, sizeof he.code, "model_not_found");
            free(name);
            http_reply_error(req, HTTP_ROUTE_MODELS, &he);
            return;
        }
        http_models_lock(ms);
        model_object(s, http_models_at(ms, i), name, anthropic, &b);
        http_models_unlock(ms);
        free(name);
        reply_json(req, &b);
        return;
    }
    http_buf_puts(&b, anthropic ? "{\"data\":[" : "{\"object\":\"list\",\"data\":[");
    const char *first = NULL, *last = NULL;
    http_models_lock(ms);
    for (int i = 0; i < http_models_count(ms); i++) {
        const struct http_served *m = http_models_at(ms, i);
        for (int k = 0; k < m->spec.n_names; k++) {
            if (first) http_buf_puts(&b, ",");
            model_object(s, m, m->spec.names[k], anthropic, &b);
            if (!first) first = m->spec.names[k];
            last = m->spec.names[k];
        }
    }
    http_models_unlock(ms);
    if (anthropic) {
        http_buf_puts(&b, "],\"has_more\":false,\"first_id\":");
        http_buf_json_str(&b, first, strlen(first));
        http_buf_puts(&b, ",\"last_id\":");
        http_buf_json_str(&b, last, strlen(last));
        http_buf_puts(&b, "}");
    } else {
        http_buf_puts(&b, "]}");
    }
    reply_json(req, &b);
}

/* A Prometheus label value: backslash, quote and newline escaped. */
static void label_value(struct http_buf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            http_buf_printf(b, "\\%c", *v);
        else if (*v == '\n')
            http_buf_puts(b, "\\n");
        else
            http_buf_append(b, v, 1);
    }
}

/* Per-model series: loaded or not, requests holding it and waiting for it, loads, unloads. */
void http_routes_models_metrics(struct http_models *ms, struct http_buf *b)
{
    static const struct {
        const char *name, *type, *help;
    } series[] = {
        {"pagoda_model_loaded", "gauge", "1 when the model is loaded, by model."},
        {"pagoda_model_requests_in_progress", "gauge", "Requests using the model now, by model."},
        {"pagoda_model_requests_waiting_for_load", "gauge",
         "Requests waiting for the model to load, by model."},
        {"pagoda_model_loads_total", "counter", "Times the model was loaded, by model."},
        {"pagoda_model_load_failures_total", "counter", "Failed loads, by model."},
        {"pagoda_model_unloads_total", "counter",
         "Times the model was unloaded, by model and reason (idle, memory_budget)."},
    };
    http_models_lock(ms);
    for (size_t k = 0; k < sizeof series / sizeof series[0]; k++) {
        http_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", series[k].name, series[k].help,
                        series[k].name, series[k].type);
        for (int i = 0; i < http_models_count(ms); i++) {
            const struct http_served *m = http_models_at(ms, i);
            unsigned long v[] = {m->state == HTTP_MODEL_LOADED, (unsigned long)m->held,
                                 (unsigned long)m->wanted, m->loads, m->failures};
            for (int r = 0; r < (k == 5 ? 2 : 1); r++) {
                http_buf_printf(b, "%s{model=\"", series[k].name);
                label_value(b, m->model.name);
                if (k == 5)
                    http_buf_printf(b, "\",reason=\"%s\"} %lu\n", r ? "memory_budget" : "idle",
                                    r ? m->unloads_memory : m->unloads_idle);
                else
                    http_buf_printf(b, "\"} %lu\n", v[k]);
            }
        }
    }
    http_models_unlock(ms);
}

/* ---- requests that wait for their model to load ---------------------------------- */

struct model_wait {
    h2o_linklist_t link; /* in loop->model_waits while waiting */
    struct http_loop *loop;
    h2o_req_t *req;
    enum http_route route;
    int model;
    unsigned failures; /* the model's failed loads when the wait began */
};

static void on_wait_dispose(void *p)
{
    struct model_wait *w = p;
    if (!h2o_linklist_is_linked(&w->link)) return;
    h2o_linklist_unlink(&w->link); /* the client went away while its model loaded */
    http_models_unwant(w->loop->srv->models, w->model);
}

void http_models_wait(struct http_loop *l, h2o_req_t *req, enum http_route route, int model,
                      unsigned failures)
{
    /* the loader's word on this load reaches this loop after the wait is queued: the loop
     * runs this code now and reads its messages later */
    struct model_wait *w = h2o_mem_alloc_shared(&req->pool, sizeof *w, on_wait_dispose);
    *w = (struct model_wait){
        .loop = l, .req = req, .route = route, .model = model, .failures = failures};
    /* the body may live in the connection's read buffer: keep a copy with the request */
    if (req->entity.len) {
        char *copy = h2o_mem_alloc_pool(&req->pool, req->entity.len);
        memcpy(copy, req->entity.base, req->entity.len);
        req->entity = h2o_iovec_init(copy, req->entity.len);
    }
    h2o_linklist_insert(&l->model_waits, &w->link);
}

void http_routes_on_models(h2o_multithread_receiver_t *r, h2o_linklist_t *messages)
{
    struct http_loop *l = H2O_STRUCT_FROM_MEMBER(struct http_loop, models, r);
    while (!h2o_linklist_is_empty(messages)) {
        h2o_multithread_message_t *m =
            H2O_STRUCT_FROM_MEMBER(h2o_multithread_message_t, link, messages->next);
        h2o_linklist_unlink(&m->link);
        free(m);
    }
    /* The waits to resume move to a list of their own first: a resumed request whose model
     * was unloaded again in between waits anew, at the tail of l->model_waits. */
    h2o_linklist_t ready;
    h2o_linklist_init_anchor(&ready);
    for (h2o_linklist_t *n = l->model_waits.next, *next; n != &l->model_waits; n = next) {
        next = n->next;
        struct model_wait *w = H2O_STRUCT_FROM_MEMBER(struct model_wait, link, n);
        enum http_model_state state;
        unsigned failures;
        http_models_peek(l->srv->models, w->model, &state, &failures, NULL, 0);
        if (state == HTTP_MODEL_LOADED || failures != w->failures) {
            h2o_linklist_unlink(&w->link);
            h2o_linklist_insert(&ready, &w->link);
        }
    }
    while (!h2o_linklist_is_empty(&ready)) {
        struct model_wait *w = H2O_STRUCT_FROM_MEMBER(struct model_wait, link, ready.next);
        h2o_linklist_unlink(&w->link);
        http_models_unwant(l->srv->models, w->model);
        enum http_model_state state;
        unsigned failures;
        char error[1024];
        http_models_peek(l->srv->models, w->model, &state, &failures, error, sizeof error);
        if (failures != w->failures) {
            struct http_error he = {0};
            http_error_set(&he, 500, NULL, "the model '%s' could not be loaded: %.400s",
                           http_models_at(l->srv->models, w->model)->model.name, error);
            http_reply_error(w->req, w->route, &he);
        } else {
            http_routes_model(l, w->req, w->route);
        }
    }
}

void http_routes_drop_waits(struct http_loop *l)
{
    while (!h2o_linklist_is_empty(&l->model_waits)) {
        struct model_wait *w = H2O_STRUCT_FROM_MEMBER(struct model_wait, link, l->model_waits.next);
        h2o_linklist_unlink(&w->link);
        http_models_unwant(l->srv->models, w->model);
        struct http_error he = {0};
        http_error_set(&he, 503, NULL, "the server is shutting down");
        http_reply_error(w->req, w->route, &he);
    }
}
