/*
 * The served models and their loader thread. Every field of struct http_served but
 * `model` and `engine` is read and written under ms->mu; those two are written by the
 * loader only while nobody holds the model (held == 0 and the state not LOADED), so a
 * holder reads them without the lock.
 *
 * One model loads at a time, on the loader thread, so no event loop ever waits for a
 * load. Unloading (engine_destroy, a join) also runs there.
 */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/util.h"
#include "http/models.h"
#include "model/config.h"
#include "text/tmpl.h"

/* The KV pool of an engine whose --kv-cache-memory is not given (engine.c's default on the
 * CPU); what the budget counts for it. */
#define DEFAULT_KV_BYTES ((size_t)1 << 30)

struct http_models {
    struct http_served *m;
    int n;
    struct http_models_config cfg;
    char *names; /* "a, b, c" for messages */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the loader waits on it: a model wanted, one released, stop */
    pthread_t thread;
    int started, stop;
};

const char *http_model_state_name(enum http_model_state s)
{
    static const char *const names[] = {"unloaded", "loading", "loaded", "failed"};
    return names[s];
}

/* ---- specs -------------------------------------------------------------------------- */

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int http_model_spec_parse(const char *arg, struct http_model_spec *sp, struct err *e)
{
    memset(sp, 0, sizeof *sp);
    const char *eq = strchr(arg, '=');
    if (!eq || is_dir(arg)) {
        if (!*arg) return err_set(e, "--model: an empty folder name");
        sp->dir = xstrdup(arg);
        char *copy = xstrdup(arg);
        size_t n = strlen(copy);
        while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
        sp->names[sp->n_names++] = xstrdup(basename(copy));
        free(copy);
        return 0;
    }
    if (!eq[1]) return err_set(e, "--model %s: no folder after '='", arg);
    if (eq == arg) return err_set(e, "--model %s: an empty name (NAME[,ALIAS...]=DIR)", arg);
    for (const char *p = arg; p < eq;) {
        const char *c = memchr(p, ',', (size_t)(eq - p));
        if (!c) c = eq;
        if (c == p) {
            http_model_spec_dispose(sp);
            return err_set(e, "--model %s: an empty name (NAME[,ALIAS...]=DIR)", arg);
        }
        if (sp->n_names == HTTP_MODEL_MAX_NAMES) {
            http_model_spec_dispose(sp);
            return err_set(e, "--model %s: more than %d names", arg, HTTP_MODEL_MAX_NAMES);
        }
        char *name = xmalloc((size_t)(c - p) + 1);
        memcpy(name, p, (size_t)(c - p));
        name[c - p] = 0;
        sp->names[sp->n_names++] = name;
        p = c < eq ? c + 1 : eq;
    }
    sp->dir = xstrdup(eq + 1);
    return 0;
}

void http_model_spec_dispose(struct http_model_spec *sp)
{
    for (int i = 0; i < sp->n_names; i++) free(sp->names[i]);
    free(sp->dir);
    memset(sp, 0, sizeof *sp);
}

int http_model_specs_read(const char *path, struct http_model_spec **specs, int *n, struct err *e)
{
    size_t len = 0;
    char *text = util_read_file(path, &len, e);
    if (!text) return -1;
    int line = 0, rc = 0;
    for (char *p = text, *next; p && *p; p = next) {
        line++;
        next = strchr(p, '\n');
        if (next) *next++ = 0;
        while (*p == ' ' || *p == '\t') p++;
        char *end = p + strlen(p);
        while (end > p && strchr(" \t\r", end[-1])) *--end = 0;
        if (!*p || *p == '#') continue;
        struct http_model_spec sp;
        if (http_model_spec_parse(p, &sp, e) < 0) {
            rc = err_wrap(e, "%s:%d", path, line);
            break;
        }
        *specs = xrealloc(*specs, sizeof **specs * (size_t)(*n + 1));
        (*specs)[(*n)++] = sp;
    }
    free(text);
    return rc;
}

/* ---- the registry ------------------------------------------------------------------- */

/* The folder's regular files (weights, tokenizer) plus the KV pool. */
static size_t model_bytes(const char *dir, const struct engine_config *ec)
{
    size_t sum = ec->kv_cache_memory ? ec->kv_cache_memory : DEFAULT_KV_BYTES;
    DIR *d = opendir(dir);
    if (!d) return sum;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d))) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) sum += (size_t)st.st_size;
    }
    closedir(d);
    return sum;
}

struct http_models *http_models_create(const struct http_model_spec *specs, int n,
                                       const struct http_models_config *cfg, struct err *e)
{
    for (int i = 0; i < n; i++) {
        if (!is_dir(specs[i].dir)) {
            err_set(e, "--model %s: no such folder", specs[i].dir);
            return NULL;
        }
        for (int k = 0; k < specs[i].n_names; k++)
            for (int j = 0; j <= i; j++)
                for (int q = 0; q < (j == i ? k : specs[j].n_names); q++)
                    if (!strcmp(specs[i].names[k], specs[j].names[q])) {
                        err_set(e, "the model name '%s' is given twice", specs[i].names[k]);
                        return NULL;
                    }
    }
    struct http_models *ms = xcalloc(1, sizeof *ms);
    ms->cfg = *cfg;
    ms->n = n;
    ms->m = xcalloc((size_t)n, sizeof *ms->m);
    struct http_buf names = {0};
    for (int i = 0; i < n; i++) {
        struct http_served *m = &ms->m[i];
        m->spec = specs[i];
        for (int k = 0; k < m->spec.n_names; k++) m->spec.names[k] = xstrdup(specs[i].names[k]);
        m->spec.dir = xstrdup(specs[i].dir);
        m->bytes = model_bytes(m->spec.dir, &cfg->engine);
        m->model.name = m->spec.names[0];
        m->model.names = (const char *const *)m->spec.names;
        m->model.n_names = m->spec.n_names;
        for (int k = 0; k < m->spec.n_names; k++)
            http_buf_printf(&names, "%s'%s'", names.len ? ", " : "", m->spec.names[k]);
        if (cfg->budget && m->bytes > cfg->budget)
            fprintf(stderr,
                    "pagoda serve: model '%s' needs %zu bytes (its files and KV pool), more than "
                    "--models-memory-budget %zu: it cannot be loaded\n",
                    m->model.name, m->bytes, cfg->budget);
    }
    ms->names = names.p ? names.p : xstrdup("");
    pthread_mutex_init(&ms->mu, NULL);
    pthread_cond_init(&ms->cv, NULL);
    return ms;
}

int http_models_count(const struct http_models *ms)
{
    return ms->n;
}
struct http_served *http_models_at(struct http_models *ms, int i)
{
    return &ms->m[i];
}
const char *http_models_names(const struct http_models *ms)
{
    return ms->names;
}
void http_models_lock(struct http_models *ms)
{
    pthread_mutex_lock(&ms->mu);
}
void http_models_unlock(struct http_models *ms)
{
    pthread_mutex_unlock(&ms->mu);
}

int http_models_find(const struct http_models *ms, const char *name)
{
    for (int i = 0; i < ms->n; i++)
        for (int k = 0; k < ms->m[i].spec.n_names; k++)
            if (!strcmp(ms->m[i].spec.names[k], name)) return i;
    return -1;
}

struct http_served *http_models_acquire(struct http_models *ms, int i, unsigned *failures)
{
    struct http_served *m = &ms->m[i];
    pthread_mutex_lock(&ms->mu);
    if (m->state == HTTP_MODEL_LOADED) {
        m->held++;
        pthread_mutex_unlock(&ms->mu);
        return m;
    }
    m->wanted++;
    *failures = m->failures;
    if (m->state == HTTP_MODEL_FAILED) m->retry = 1;
    pthread_cond_signal(&ms->cv);
    pthread_mutex_unlock(&ms->mu);
    return NULL;
}

void http_models_unwant(struct http_models *ms, int i)
{
    pthread_mutex_lock(&ms->mu);
    ms->m[i].wanted--;
    pthread_mutex_unlock(&ms->mu);
}

void http_models_peek(struct http_models *ms, int i, enum http_model_state *state,
                      unsigned *failures, char *error, size_t n)
{
    pthread_mutex_lock(&ms->mu);
    *state = ms->m[i].state;
    *failures = ms->m[i].failures;
    if (error) snprintf(error, n, "%s", ms->m[i].error);
    pthread_mutex_unlock(&ms->mu);
}

void http_models_release(struct http_models *ms, struct http_served *m)
{
    pthread_mutex_lock(&ms->mu);
    m->held--;
    m->last_used = util_now();
    if (m->held == 0) pthread_cond_signal(&ms->cv);
    pthread_mutex_unlock(&ms->mu);
}

static void stats_add(struct engine_stats *a, const struct engine_stats *b)
{
    a->running += b->running;
    a->waiting += b->waiting;
    a->kv_blocks_total += b->kv_blocks_total;
    a->kv_blocks_used += b->kv_blocks_used;
    a->kv_blocks_free += b->kv_blocks_free;
    a->kv_blocks_cached += b->kv_blocks_cached;
    a->state_slots_total += b->state_slots_total;
    a->state_slots_used += b->state_slots_used;
    a->state_slots_free += b->state_slots_free;
    a->state_slots_cached += b->state_slots_cached;
    if (b->state_bytes > a->state_bytes) a->state_bytes = b->state_bytes;
    a->prefix_query_tokens += b->prefix_query_tokens;
    a->prefix_hit_tokens += b->prefix_hit_tokens;
    a->preemptions += b->preemptions;
    a->prompt_tokens += b->prompt_tokens;
    a->generation_tokens += b->generation_tokens;
    for (int i = 0; i <= FINISH_ERROR; i++) a->requests_finished[i] += b->requests_finished[i];
    a->steps += b->steps;
    a->steps_overlapped += b->steps_overlapped;
    for (int i = 0; i <= ENGINE_STEP_BUCKETS; i++) a->step_hist[i] += b->step_hist[i];
    a->step_time_sum += b->step_time_sum;
    a->step_decode_rows += b->step_decode_rows;
    a->step_prefill_tokens += b->step_prefill_tokens;
    a->steps_time_capped += b->steps_time_capped;
    a->steps_predicted += b->steps_predicted;
    a->step_predicted_sum += b->step_predicted_sum;
    a->step_measured_sum += b->step_measured_sum;
    a->step_error_sum += b->step_error_sum;
    if (!a->cost_ready && b->cost_ready) { /* one model's: the first fitted */
        a->cost_ready = 1;
        a->cost_a = b->cost_a;
        a->cost_b = b->cost_b;
        a->cost_c = b->cost_c;
    }
    for (int i = 0; i <= ENGINE_QUEUE_BUCKETS; i++) a->queue_hist[i] += b->queue_hist[i];
    a->queue_time_sum += b->queue_time_sum;
    for (int m = 0; m < SPEC_METHODS; m++) {
        a->spec_drafts[m] += b->spec_drafts[m];
        a->spec_draft_tokens[m] += b->spec_draft_tokens[m];
        a->spec_accepted_tokens[m] += b->spec_accepted_tokens[m];
        for (int i = 0; i <= SPEC_MAX_TOKENS; i++)
            a->spec_accept_hist[m][i] += b->spec_accept_hist[m][i];
        for (int i = 0; i < SPEC_MAX_TOKENS; i++)
            a->spec_accepted_pos[m][i] += b->spec_accepted_pos[m][i];
    }
    if (b->tier_on) { /* the disk tiers of every model, summed */
        struct kv_tier_stats *x = &a->tier;
        const struct kv_tier_stats *y = &b->tier;
        a->tier_on = 1;
        x->disk.blocks += y->disk.blocks;
        x->disk.bytes += y->disk.bytes;
        x->disk.stored += y->disk.stored;
        x->disk.stored_bytes += y->disk.stored_bytes;
        x->disk.faults_write += y->disk.faults_write;
        x->disk.faults_read += y->disk.faults_read;
        x->disk.faults_corrupt += y->disk.faults_corrupt;
        x->disk.evicted_blocks += y->disk.evicted_blocks;
        x->disk.full += y->disk.full;
        x->disk_budget += y->disk_budget;
        x->store_dropped += y->store_dropped;
        x->store_seconds += y->store_seconds;
        x->load_blocks += y->load_blocks;
        x->load_bytes += y->load_bytes;
        x->load_seconds += y->load_seconds;
        x->load_failed += y->load_failed;
        x->disk.states += y->disk.states;
        x->disk.stored_states += y->disk.stored_states;
        x->load_states += y->load_states;
        x->state_failed += y->state_failed;
        a->tier_query_tokens += b->tier_query_tokens;
        a->tier_hit_tokens += b->tier_hit_tokens;
        a->tier_bypasses += b->tier_bypasses;
        a->tier_state_queries += b->tier_state_queries;
        a->tier_state_hits += b->tier_state_hits;
    }
    if (b->host_on) { /* the host tiers of every model, summed */
        struct kv_host_stats *x = &a->host;
        const struct kv_host_stats *y = &b->host;
        a->host_on = 1;
        x->blocks += y->blocks;
        x->slots += y->slots;
        x->stored_blocks += y->stored_blocks;
        x->store_dropped += y->store_dropped;
        x->evicted_blocks += y->evicted_blocks;
        x->load_blocks += y->load_blocks;
        x->fences += y->fences;
        a->host_used_bytes += b->host_used_bytes;
        a->host_budget_bytes += b->host_budget_bytes;
        a->host_load_bytes += b->host_load_bytes;
        a->host_store_bytes += b->host_store_bytes;
        a->host_query_tokens += b->host_query_tokens;
        a->host_hit_tokens += b->host_hit_tokens;
        a->host_load_seconds += b->host_load_seconds;
        struct kv_host_stats *xs = &a->host_snap;
        const struct kv_host_stats *ys = &b->host_snap;
        xs->blocks += ys->blocks;
        xs->slots += ys->slots;
        xs->stored_blocks += ys->stored_blocks;
        xs->store_dropped += ys->store_dropped;
        xs->store_deferred += ys->store_deferred;
        xs->evicted_blocks += ys->evicted_blocks;
        xs->load_blocks += ys->load_blocks;
        xs->fences += ys->fences;
        a->host_state_queries += b->host_state_queries;
        a->host_state_hits += b->host_state_hits;
        a->host_store_seconds += b->host_store_seconds;
    }
}

int http_models_stats(struct http_models *ms, struct engine_stats *out)
{
    memset(out, 0, sizeof *out);
    int loaded = 0;
    pthread_mutex_lock(&ms->mu);
    for (int i = 0; i < ms->n; i++) {
        if (ms->m[i].state != HTTP_MODEL_LOADED) continue;
        struct engine_stats st;
        engine_stats(ms->m[i].engine, &st);
        stats_add(out, &st);
        loaded++;
    }
    pthread_mutex_unlock(&ms->mu);
    return loaded;
}

/* ---- loading and unloading (no lock held) --------------------------------------------- */

static int load_side(struct http_models *ms, struct http_served *m, struct err *e)
{
    if (ms->cfg.skip_tokenizer_init) return 0;
    if (!(m->tok = tok_load(m->spec.dir, e))) return -1;
    struct err te = {0};
    m->tmpl_src = ms->cfg.chat_template ? util_read_file(ms->cfg.chat_template, NULL, e)
                                        : tmpl_load_from_model(m->spec.dir, NULL, &te);
    if (!m->tmpl_src && ms->cfg.chat_template) return -1;
    /* no template: chat is a 400 */
    m->tmpl_vars = tmpl_special_tokens(m->spec.dir);
    const char *tp = ms->cfg.tool_call_parser, *rp = ms->cfg.reasoning_parser;
    int tf = tp ? tcall_format_from_name(tp) : (int)tcall_format_detect(m->tmpl_src);
    int rf = rp ? reason_format_from_name(rp) : REASON_NONE;
    m->model.tool_format = tf < 0 ? TCALL_NONE : (enum tcall_format)tf;
    m->model.reason_format = rf < 0 ? REASON_NONE : (enum reason_format)rf;
    return 0;
}

static void free_side(struct http_served *m)
{
    if (m->tok) tok_destroy(m->tok);
    free(m->tmpl_src);
    cJSON_Delete(m->tmpl_vars);
    m->tok = NULL;
    m->tmpl_src = NULL;
    m->tmpl_vars = NULL;
}

/* m->grammar_tags: the tags of the model's tool-call format, then its reasoning format's. */
static void grammar_tags(struct http_served *m)
{
    const char *const *lists[2] = {tcall_format_tags(m->model.tool_format),
                                   reason_format_tags(m->model.reason_format)};
    int n = 0, cap = (int)(sizeof m->grammar_tags / sizeof *m->grammar_tags) - 1;
    for (int l = 0; l < 2; l++)
        for (const char *const *t = lists[l]; *t && n < cap; t++) {
            int dup = 0;
            for (int i = 0; i < n && !dup; i++) dup = !strcmp(m->grammar_tags[i], *t);
            if (!dup) m->grammar_tags[n++] = *t;
        }
    m->grammar_tags[n] = NULL;
}

static int load_engine(struct http_models *ms, struct http_served *m, struct err *e)
{
    struct engine_config ec = ms->cfg.engine;
    ec.model_dir = m->spec.dir;
    grammar_tags(m);
    ec.grammar_tags = m->grammar_tags;
    /* Several models on one --kv-disk-dir: each its own folder in it, named after it (a
     * store holds one model's blocks and is locked by its engine). */
    char disk[4096];
    if (ec.kv_disk_dir && ms->n > 1) {
        if (mkdir(ec.kv_disk_dir, 0755) && errno != EEXIST)
            return err_set(e, "--kv-disk-dir %s: %s", ec.kv_disk_dir, strerror(errno));
        snprintf(disk, sizeof disk, "%s/%s", ec.kv_disk_dir, m->model.name);
        ec.kv_disk_dir = disk;
    }
    struct engine *en = engine_create(&ec, e);
    if (!en) return err_wrap(e, "loading %s", m->spec.dir);
    int32_t vocab = engine_model_config(en)->vocab;
    if (m->tok && tok_vocab_size(m->tok) < vocab) vocab = tok_vocab_size(m->tok);
    m->model.tok = m->tok;
    m->model.tmpl_src = m->tmpl_src;
    m->model.tmpl_vars = m->tmpl_vars;
    m->model.vocab = vocab;
    m->model.max_model_len = engine_max_model_len(en);
    m->model.pooling = engine_pooling(en);
    m->engine = en;
    return 0;
}

int http_models_load_now(struct http_models *ms, int i, int stage, struct err *e)
{
    struct http_served *m = &ms->m[i];
    if (stage == 0) {
        pthread_mutex_lock(&ms->mu);
        m->state = HTTP_MODEL_LOADING;
        pthread_mutex_unlock(&ms->mu);
        return load_side(ms, m, e);
    }
    int rc = load_engine(ms, m, e);
    pthread_mutex_lock(&ms->mu);
    m->state = rc == 0 ? HTTP_MODEL_LOADED : HTTP_MODEL_FAILED;
    if (rc == 0) {
        m->loads++;
        m->max_model_len = m->model.max_model_len;
        m->last_used = util_now();
    }
    pthread_mutex_unlock(&ms->mu);
    return rc;
}

/* Called with the lock held, the model LOADED and not held; returns with it held again. */
static void unload(struct http_models *ms, struct http_served *m, int for_memory)
{
    m->state = HTTP_MODEL_UNLOADED;
    if (for_memory)
        m->unloads_memory++;
    else
        m->unloads_idle++;
    struct engine *en = m->engine;
    m->engine = NULL;
    pthread_mutex_unlock(&ms->mu);
    fprintf(stderr, "pagoda serve: unloading model '%s' (%s)\n", m->model.name,
            for_memory ? "memory budget" : "idle");
    engine_destroy(en);
    free_side(m);
    pthread_mutex_lock(&ms->mu);
}

static size_t loaded_bytes(const struct http_models *ms)
{
    size_t sum = 0;
    for (int i = 0; i < ms->n; i++)
        if (ms->m[i].state == HTTP_MODEL_LOADED || ms->m[i].state == HTTP_MODEL_LOADING)
            sum += ms->m[i].bytes;
    return sum;
}

/* The least recently used loaded model that nothing holds or waits for, or NULL. */
static struct http_served *lru_idle(struct http_models *ms)
{
    struct http_served *best = NULL;
    for (int i = 0; i < ms->n; i++) {
        struct http_served *m = &ms->m[i];
        if (m->state != HTTP_MODEL_LOADED || m->held || m->wanted) continue;
        if (!best || m->last_used < best->last_used) best = m;
    }
    return best;
}

static void notify(struct http_models *ms)
{
    if (ms->cfg.on_change) ms->cfg.on_change(ms->cfg.user);
}

/* Loads m (lock held on entry and return). */
static void load(struct http_models *ms, struct http_served *m)
{
    m->state = HTTP_MODEL_LOADING;
    m->retry = 0;
    pthread_mutex_unlock(&ms->mu);
    fprintf(stderr, "pagoda serve: loading model '%s' from %s\n", m->model.name, m->spec.dir);
    double t0 = util_now();
    struct err e = {0};
    int rc = load_side(ms, m, &e);
    if (rc == 0 && (rc = load_engine(ms, m, &e)) < 0) free_side(m);
    if (rc == 0)
        fprintf(stderr, "pagoda serve: model '%s' ready in %.1f s, context %d tokens\n",
                m->model.name, util_now() - t0, m->model.max_model_len);
    else
        fprintf(stderr, "pagoda serve: model '%s' failed to load: %s\n", m->model.name, e.msg);
    pthread_mutex_lock(&ms->mu);
    if (rc == 0) {
        m->state = HTTP_MODEL_LOADED;
        m->loads++;
        m->max_model_len = m->model.max_model_len;
        m->last_used = util_now();
    } else {
        m->state = HTTP_MODEL_FAILED;
        m->failures++;
        snprintf(m->error, sizeof m->error, "%s", e.msg);
    }
}

/*
 * One pass of the loader (lock held): unload what has been idle too long, then load the
 * first wanted model, making room within the budget by unloading idle models, least
 * recently used first. Returns 1 when it changed anything, else 0; *wake is set to when
 * the next idle unload falls due (0: none).
 */
static int loader_pass(struct http_models *ms, double *wake)
{
    double now = util_now();
    *wake = 0;
    for (int i = 0; i < ms->n; i++) {
        struct http_served *m = &ms->m[i];
        if (m->state != HTTP_MODEL_LOADED || m->held || m->wanted || ms->cfg.idle_timeout <= 0)
            continue;
        double due = m->last_used + ms->cfg.idle_timeout;
        if (due <= now) {
            unload(ms, m, 0);
            return 1;
        }
        if (!*wake || due < *wake) *wake = due;
    }
    for (int i = 0; i < ms->n; i++) {
        struct http_served *m = &ms->m[i];
        /* a failed model loads again only for a request that came after the failure */
        if (!m->wanted ||
            !(m->state == HTTP_MODEL_UNLOADED || (m->state == HTTP_MODEL_FAILED && m->retry)))
            continue;
        if (ms->cfg.budget && m->bytes > ms->cfg.budget) {
            m->state = HTTP_MODEL_FAILED;
            m->failures++;
            m->retry = 0;
            snprintf(m->error, sizeof m->error,
                     "it needs %zu bytes (its files and KV pool), more than "
                     "--models-memory-budget %zu",
                     m->bytes, ms->cfg.budget);
            return 1;
        }
        while (ms->cfg.budget && loaded_bytes(ms) + m->bytes > ms->cfg.budget) {
            struct http_served *victim = lru_idle(ms);
            if (!victim) break;
            unload(ms, victim, 1);
        }
        /* over the budget with every loaded model busy: wait for a release */
        if (ms->cfg.budget && loaded_bytes(ms) + m->bytes > ms->cfg.budget) continue;
        load(ms, m);
        return 1;
    }
    return 0;
}

static void *loader_main(void *arg)
{
    struct http_models *ms = arg;
    pthread_mutex_lock(&ms->mu);
    while (!ms->stop) {
        double wake;
        if (loader_pass(ms, &wake)) {
            pthread_mutex_unlock(&ms->mu);
            notify(ms);
            pthread_mutex_lock(&ms->mu);
            continue;
        }
        if (wake) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double d = wake - util_now() + 0.01;
            if (d < 0) d = 0;
            ts.tv_sec += (time_t)d;
            ts.tv_nsec += (long)((d - floor(d)) * 1e9);
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&ms->cv, &ms->mu, &ts);
        } else {
            pthread_cond_wait(&ms->cv, &ms->mu);
        }
    }
    pthread_mutex_unlock(&ms->mu);
    return NULL;
}

int http_models_start(struct http_models *ms, struct err *e)
{
    if (pthread_create(&ms->thread, NULL, loader_main, ms) != 0)
        return err_set(e, "cannot start the model loader thread");
    ms->started = 1;
    return 0;
}

void http_models_stop(struct http_models *ms)
{
    if (!ms->started) return;
    pthread_mutex_lock(&ms->mu);
    ms->stop = 1;
    pthread_cond_signal(&ms->cv);
    pthread_mutex_unlock(&ms->mu);
    pthread_join(ms->thread, NULL);
    ms->started = 0;
}

void http_models_destroy(struct http_models *ms)
{
    if (!ms) return;
    http_models_stop(ms);
    for (int i = 0; i < ms->n; i++) {
        struct http_served *m = &ms->m[i];
        if (m->engine) engine_destroy(m->engine);
        free_side(m);
        http_model_spec_dispose(&m->spec);
    }
    pthread_mutex_destroy(&ms->mu);
    pthread_cond_destroy(&ms->cv);
    free(ms->names);
    free(ms->m);
    free(ms);
}
