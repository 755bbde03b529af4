/*
 * The transport: a listening socket shared by --http-threads event loops (each an h2o
 * evloop with its own context), HTTP/1.1 with keep-alive, h2c by prior knowledge or
 * Upgrade (h2o's HTTP/1 side hands those over), TLS with ALPN "h2" / "http/1.1", and the
 * shutdown sequence driven by the main thread on SIGTERM / SIGINT.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "http/internal.h"
#include "model/config.h"

/* The listen queue: the kernel caps it at net.core.somaxconn (4096 by default since Linux
 * 5.4); a burst of thousands of clients connecting at once waits there, not refused. */
#define LISTEN_BACKLOG 65535

enum { CTRL_STOP_ACCEPT, CTRL_ABORT_ALL, CTRL_EXIT };

struct ctrl_msg {
    h2o_multithread_message_t super;
    int kind;
};

void http_config_default(struct http_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->port = 8080;
    cfg->threads = 1;
    cfg->max_body = 8u << 20;
    cfg->shutdown_timeout = 30;
    cfg->max_stream_buffer = 1u << 20;
    cfg->allowed_origins = "*"; /* vLLM's and llama.cpp's default */
    cfg->stream_idle_timeout = 60;
}

struct http_loop *http_loop_of(h2o_req_t *req)
{
    return H2O_STRUCT_FROM_MEMBER(struct http_loop, ctx, req->conn->ctx);
}

void http_new_id(struct http_server *s, char *buf, size_t n)
{
    unsigned long k = atomic_fetch_add(&s->next_id, 1);
    /* A per-process random prefix keeps ids unique across restarts. */
    snprintf(buf, n, "%08lx%08lx", (unsigned long)s->started & 0xffffffffUL, k);
}

static void on_accept(h2o_socket_t *listener, const char *err)
{
    if (err) return;
    struct http_loop *l = listener->data;
    h2o_socket_t *sock = h2o_evloop_socket_accept(listener);
    if (!sock) return;
    atomic_fetch_add(&l->accepted, 1);
    h2o_accept(&l->accept, sock);
}

static void on_control(h2o_multithread_receiver_t *r, h2o_linklist_t *messages)
{
    struct http_loop *l = H2O_STRUCT_FROM_MEMBER(struct http_loop, control, r);
    while (!h2o_linklist_is_empty(messages)) {
        struct ctrl_msg *m = H2O_STRUCT_FROM_MEMBER(struct ctrl_msg, super.link, messages->next);
        h2o_linklist_unlink(&m->super.link);
        switch (m->kind) {
        case CTRL_STOP_ACCEPT:
            if (l->listener) {
                h2o_socket_read_stop(l->listener);
                h2o_socket_close(l->listener);
                l->listener = NULL;
            }
            h2o_context_request_shutdown(&l->ctx);
            http_routes_drop_waits(l);
            break;
        case CTRL_ABORT_ALL:
            http_job_abort_all(l);
            http_embed_abort_all(l);
            break;
        default:
            l->exit = 1;
        }
        free(m);
    }
}

static void send_control(struct http_loop *l, int kind)
{
    struct ctrl_msg *m = xcalloc(1, sizeof *m);
    m->kind = kind;
    h2o_multithread_send_message(&l->control, &m->super);
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    (void)self;
    return http_routes_dispatch(http_loop_of(req), req);
}

#define PROBE_MS 100

static void on_probe(h2o_timeout_entry_t *entry)
{
    struct http_loop *l = H2O_STRUCT_FROM_MEMBER(struct http_loop, probe, entry);
    http_job_probe_clients(l);
    if (++l->probes % 10 == 0) http_conn_sweep(l);
    h2o_timeout_link(l->loop, &l->probe_timeout, &l->probe);
}

/*
 * Everything h2o allocates for a loop is made on the loop's own thread: h2o keeps its
 * socket-buffer recycling allocator in thread-local storage and every buffer remembers the
 * allocator of the thread that created its socket, so a socket made on the main thread (the
 * queue's wake-up pipe, the listener) would have all loops allocate from and free to the
 * main thread's free list at once. That race crashed servers with more than two loops on
 * machines with the cores to run them in parallel.
 */
static int loop_init(struct http_loop *l)
{
    struct http_server *s = l->srv;
    l->loop = h2o_evloop_create();
    h2o_context_init(&l->ctx, l->loop, &s->conf);
    h2o_linklist_init_anchor(&l->jobs);
    h2o_linklist_init_anchor(&l->embed_jobs);
    h2o_linklist_init_anchor(&l->to_submit);
    l->submit.cb = http_job_submit_pending;
    l->calm.cb = http_conn_send_calm;
    h2o_multithread_register_receiver(l->ctx.queue, &l->events, http_job_on_events);
    h2o_multithread_register_receiver(l->ctx.queue, &l->embeds, http_embed_on_done);
    h2o_multithread_register_receiver(l->ctx.queue, &l->control, on_control);
    h2o_multithread_register_receiver(l->ctx.queue, &l->models, http_routes_on_models);
    h2o_linklist_init_anchor(&l->model_waits);
    h2o_timeout_init(l->loop, &l->probe_timeout, PROBE_MS);
    l->probe.cb = on_probe;
    h2o_timeout_link(l->loop, &l->probe_timeout, &l->probe);
    l->accept.ctx = &l->ctx;
    l->accept.hosts = s->conf.hosts;
    l->accept.ssl_ctx = s->ssl;
    int fd = dup(s->listen_fd);
    if (fd < 0) return -1;
    l->listener = h2o_evloop_socket_create(l->loop, fd, H2O_SOCKET_FLAG_DONT_READ);
    l->listener->data = l;
    h2o_socket_read_start(l->listener, on_accept);
    return 0;
}

/*
 * h2o keeps freed socket buffers and memory-pool chunks on per-thread lists for reuse and
 * never frees them: what LeakSanitizer reported at exit (37-279 KB). The socket buffers'
 * list is reachable; the pool chunks' is not, but a fresh pool's first allocation takes
 * the list's head (or mallocs one), so taking and freeing more chunks than the list holds
 * (at most 16) empties it.
 */
static void http_loop_free_recycled(void)
{
    h2o_mem_recycle_t *r = &h2o_socket_buffer_prototype.allocator;
    while (r->cnt) free(h2o_mem_alloc_recycle(r, 1));
    for (int k = 0; k < 64; k++) {
        h2o_mem_pool_t pool;
        h2o_mem_init_pool(&pool);
        h2o_mem_alloc_pool(&pool, 1);
        free(pool.chunks); /* the chunk is the allocation itself */
    }
}

static void *loop_main(void *arg)
{
    struct http_loop *l = arg;
    int rc = loop_init(l);
    pthread_mutex_lock(&l->srv->start_mu);
    l->started = rc < 0 ? -errno : 1;
    pthread_cond_broadcast(&l->srv->start_cv);
    pthread_mutex_unlock(&l->srv->start_mu);
    if (rc < 0) return NULL;
    while (!l->exit) h2o_evloop_run(l->loop, INT32_MAX);
    free(l->conns);
    http_loop_free_recycled();
    return NULL;
}

/* Starts the loop's thread and waits until the loop is listening. */
static int loop_start(struct http_server *s, struct http_loop *l, struct err *e)
{
    l->srv = s;
    if (pthread_create(&l->thread, NULL, loop_main, l) != 0)
        return err_set(e, "cannot start an event-loop thread");
    pthread_mutex_lock(&s->start_mu);
    while (!l->started) pthread_cond_wait(&s->start_cv, &s->start_mu);
    pthread_mutex_unlock(&s->start_mu);
    if (l->started < 0) {
        pthread_join(l->thread, NULL);
        return err_set(e, "dup: %s", strerror(-l->started));
    }
    return 0;
}

static int open_listener(struct http_server *s, struct err *e)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    int rc = getaddrinfo(s->cfg.host, port, &hints, &res);
    if (rc != 0) return err_set(e, "--host %s: %s", s->cfg.host, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int on = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
        int er = errno;
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return err_set(e, "cannot listen on %s:%d: %s", s->cfg.host, s->cfg.port, strerror(er));
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    s->cfg.port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    s->listen_fd = fd;
    return 0;
}

static int setup_tls(struct http_server *s, struct err *e)
{
    if (!s->cfg.tls_cert && !s->cfg.tls_key) return 0;
    if (!s->cfg.tls_cert || !s->cfg.tls_key)
        return err_set(e, "--tls-cert and --tls-key go together");
    SSL_load_error_strings();
    SSL_library_init();
    s->ssl = SSL_CTX_new(TLS_server_method());
    SSL_CTX_set_min_proto_version(s->ssl, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate_chain_file(s->ssl, s->cfg.tls_cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(s->ssl, s->cfg.tls_key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(s->ssl) != 1) {
        char buf[256];
        ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
        return err_set(e, "TLS certificate %s / key %s: %s", s->cfg.tls_cert, s->cfg.tls_key, buf);
    }
    h2o_ssl_register_alpn_protocols(s->ssl, h2o_http2_alpn_protocols);
    return 0;
}

/* The model loader changed a model's state: every loop looks at its waiting requests. */
static void on_models_change(void *user)
{
    struct http_server *s = user;
    for (int i = 0; i < s->n_loops; i++) {
        h2o_multithread_message_t *m = xcalloc(1, sizeof *m);
        h2o_multithread_send_message(&s->loops[i].models, m);
    }
}

static void wait_jobs(struct http_server *s, double seconds)
{
    double until = util_now() + seconds;
    while (atomic_load(&s->jobs) > 0 && util_now() < until) usleep(10000);
}

static void stop_loops(struct http_server *s)
{
    for (int i = 0; i < s->n_loops; i++) send_control(&s->loops[i], CTRL_EXIT);
    for (int i = 0; i < s->n_loops; i++) pthread_join(s->loops[i].thread, NULL);
}

int http_serve(const struct http_config *cfg, struct err *e)
{
    static struct http_server server; /* reachable for the whole process */
    struct http_server *s = &server;
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->started = time(NULL);
    atomic_init(&s->ready, 0);
    atomic_init(&s->jobs, 0);
    atomic_init(&s->unsubmitted, 0);
    atomic_init(&s->shutting_down, 0);
    atomic_init(&s->next_id, 1);
    if (s->cfg.threads < 1) s->cfg.threads = 1;
    pthread_mutex_init(&s->start_mu, NULL);
    pthread_cond_init(&s->start_cv, NULL);

    /* Signals: the main thread waits for them; every other thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct http_models_config mc = {.engine = s->cfg.engine,
                                    .skip_tokenizer_init = s->cfg.skip_tokenizer_init,
                                    .idle_timeout = s->cfg.model_idle_timeout,
                                    .budget = s->cfg.models_budget,
                                    .chat_template = s->cfg.chat_template,
                                    .tool_call_parser = s->cfg.tool_call_parser,
                                    .reasoning_parser = s->cfg.reasoning_parser,
                                    .on_change = on_models_change,
                                    .user = s};
    if (!(s->models = http_models_create(cfg->models, cfg->n_models, &mc, e))) return -1;
    /* One model: its tokenizer before listening, its engine right after (as it always was);
     * several: each when a request first names it. */
    int one = cfg->n_models == 1;
    if ((one && http_models_load_now(s->models, 0, 0, e) < 0) || setup_tls(s, e) < 0 ||
        open_listener(s, e) < 0) {
        http_models_destroy(s->models);
        return -1;
    }
    /* the vllm:* metrics' model_name: the (first) model's first served name; with several
     * models the engine statistics are their sums */
    s->metrics = http_metrics_create(
        cfg->n_models > 0 && cfg->models[0].n_names ? cfg->models[0].names[0] : "");

    h2o_config_init(&s->conf);
    /* Twice --max-body-size: a body between the two is read and answered 413 in JSON by
     * the routes; past it h2o answers itself (HTTP/1.1: a 413 that transport.c turns into
     * JSON; HTTP/2: REFUSED_STREAM, which h2o 2.2 sends with no hook). One bound for both:
     * HTTP/2 streams buffer up to it in memory. */
    s->conf.max_request_entity_size = 2 * s->cfg.max_body;
    s->conf.server_name = h2o_iovec_init(H2O_STRLIT("pagoda"));
    h2o_hostconf_t *host =
        h2o_config_register_host(&s->conf, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    h2o_handler_t *handler = h2o_create_handler(path, sizeof *handler);
    handler->on_req = on_req;
    http_transport_register(host);

    s->n_loops = s->cfg.threads;
    s->loops = xcalloc((size_t)s->n_loops, sizeof *s->loops);
    for (int i = 0; i < s->n_loops; i++)
        if (loop_start(s, &s->loops[i], e) < 0) return -1;
    struct http_served *first = http_models_at(s->models, 0);
    if (one)
        fprintf(stderr, "pagoda serve: listening on %s://%s:%d (%d event loop%s); loading %s\n",
                s->ssl ? "https" : "http", s->cfg.host, s->cfg.port, s->n_loops,
                s->n_loops > 1 ? "s" : "", first->spec.dir);
    else
        fprintf(stderr,
                "pagoda serve: listening on %s://%s:%d (%d event loop%s); %d models, loaded "
                "on demand: %s\n",
                s->ssl ? "https" : "http", s->cfg.host, s->cfg.port, s->n_loops,
                s->n_loops > 1 ? "s" : "", cfg->n_models, http_models_names(s->models));

    if (one && http_models_load_now(s->models, 0, 1, e) < 0) {
        stop_loops(s);
        http_models_destroy(s->models);
        return -1;
    }
    if (http_models_start(s->models, e) < 0) {
        stop_loops(s);
        http_models_destroy(s->models);
        return -1;
    }
    atomic_store(&s->ready, 1);
    if (one) {
        const struct pooling_config *pc = first->model.pooling;
        if (pc->can_embed)
            fprintf(stderr, "pagoda serve: embeddings: %s pooling%s, %d dimensions\n",
                    pooling_kind_name(pc->kind), pc->normalize ? ", normalized" : "", pc->dim);
        fprintf(stderr, "pagoda serve: ready: model '%s', context %d tokens\n", first->model.name,
                first->model.max_model_len);
    } else {
        fprintf(stderr, "pagoda serve: ready\n");
    }

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "pagoda serve: %s: stopping (in-flight requests get %.0f s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", s->cfg.shutdown_timeout);
    atomic_store(&s->shutting_down, 1);
    for (int i = 0; i < s->n_loops; i++) send_control(&s->loops[i], CTRL_STOP_ACCEPT);
    close(s->listen_fd);
    wait_jobs(s, s->cfg.shutdown_timeout);
    if (atomic_load(&s->jobs) > 0) {
        fprintf(stderr, "pagoda serve: aborting %d request(s)\n", atomic_load(&s->jobs));
        for (int i = 0; i < s->n_loops; i++) send_control(&s->loops[i], CTRL_ABORT_ALL);
        wait_jobs(s, 5);
    }
    /* Let the last responses leave the sockets. */
    usleep(50000);
    http_models_stop(s->models); /* no loop hears of a model after this */
    stop_loops(s);
    http_models_destroy(s->models);
    fprintf(stderr, "pagoda serve: stopped\n");
    return 0;
}
