/*
 * The engine's side of the disk tier (paged_kv/kv_tier.h): full blocks go down as their
 * hashes are committed; a waiting request whose prefix continues on disk past the pool's
 * hits loads those blocks while the others step, unless recomputing them is estimated to
 * be faster.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/util.h"
#include "model/kv_block.h"
#include "paged_kv/kv_events.h"
#include "sched/engine_impl.h"

/* The store queue holds two full steps of blocks, within this many bytes. */
#define TIER_QUEUE_BYTES ((size_t)128 << 20)
/* Bytes hashed at each end of a weights file for the fingerprint. */
#define TIER_FP_SAMPLE ((size_t)1 << 20)

/* XXH3-64 of a file: all of it, or its size and `sample` bytes at each end (weights). */
static uint64_t file_digest(const char *path, size_t sample)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat s;
    uint64_t h = 0;
    if (!fstat(fd, &s)) {
        size_t n = (size_t)s.st_size, take = sample && n > 2 * sample ? sample : n;
        char *buf = xmalloc(2 * take + sizeof n + 1);
        memcpy(buf, &n, sizeof n);
        ssize_t a = pread(fd, buf + sizeof n, take, 0), b = 0;
        if (take < n) b = pread(fd, buf + sizeof n + take, take, (off_t)(n - take));
        if (a >= 0 && b >= 0) h = XXH3_64bits(buf, sizeof n + (size_t)a + (size_t)b);
        free(buf);
    }
    close(fd);
    return h;
}

/* The store's fingerprint: the pool's (architecture, shapes, weight bytes, KV format,
 * block size) plus digests of the model folder's config, tokenizer, chat template and
 * weights (size and both ends of each file: a changed weight file almost always changes
 * its header or its size; hashing gigabytes at every start would not be worth it). */
static int fingerprint(const struct engine *en, const char *base, char *out, int cap)
{
    static const char *const whole[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                        "chat_template.jinja", "chat_template.json"};
    int n = snprintf(out, (size_t)cap, "%s", base);
    char p[4096];
    for (size_t i = 0; i < sizeof whole / sizeof *whole && n < cap; i++) {
        snprintf(p, sizeof p, "%s/%s", en->cfg.model_dir, whole[i]);
        n += snprintf(out + n, (size_t)(cap - n), "|%s=%016llx", whole[i],
                      (unsigned long long)file_digest(p, 0));
    }
    DIR *d = opendir(en->cfg.model_dir);
    if (!d) return n;
    /* readdir order varies: combine the weight files' digests order-free */
    uint64_t w = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
        snprintf(p, sizeof p, "%s/%s", en->cfg.model_dir, de->d_name);
        w ^= file_digest(p, TIER_FP_SAMPLE) ^ XXH3_64bits(de->d_name, l);
    }
    closedir(d);
    if (n < cap)
        n += snprintf(out + n, (size_t)(cap - n), "|weights=%016llx", (unsigned long long)w);
    return n < cap ? n : cap - 1;
}

int tier_open(struct engine *en, const char *pool_fp, struct err *e)
{
    const struct engine_config *cfg = &en->cfg;
    if (!cfg->kv_disk_dir) return 0;
    if (cfg->disable_prefix_caching) {
        fprintf(stderr, "pagoda: --kv-disk-dir is unused: prefix caching is off\n");
        return 0;
    }
    if (en->hybrid) {
        /* A prefix hit of a hybrid model resumes from the recurrent-state snapshot at the
         * hit's last block; snapshots are not written down, so a disk hit could never be
         * used. */
        fprintf(stderr, "pagoda: --kv-disk-dir is off for hybrid models: their recurrent-state "
                        "snapshots are not stored on disk\n");
        return 0;
    }
    if (strcmp(en->be.ops->name, "cpu") != 0)
        return err_set(e, "--kv-disk-dir: the disk tier runs on the CPU backend only so far");
    char fp[2048];
    int fpn = fingerprint(en, pool_fp, fp, sizeof fp);
    size_t bb = model_kv_block_bytes(en->m);
    int per_step = (cfg->max_num_batched_tokens + en->block_size - 1) / en->block_size;
    int q = 2 * per_step;
    if ((size_t)q * bb > TIER_QUEUE_BYTES) q = (int)(TIER_QUEUE_BYTES / bb);
    if (q < 4) q = 4;
    struct kv_tier_config tc = {.dir = cfg->kv_disk_dir,
                                .disk_bytes =
                                    cfg->kv_disk_size ? cfg->kv_disk_size : (size_t)16 << 30,
                                .fp = fp,
                                .fp_len = (size_t)fpn,
                                .block_bytes = bb,
                                .queue_blocks = q,
                                .max_load_blocks = en->max_blocks};
    en->tier = kv_tier_create(&tc, e);
    return en->tier ? 0 : -1;
}

void tier_close(struct engine *en)
{
    kv_tier_destroy(en->tier);
    en->tier = NULL;
}

void tier_store(struct engine *en, int32_t block, struct kv_hash h)
{
    if (kv_lookup(&en->pool, h) != block || kv_tier_has(en->tier, h)) return;
    void *buf = kv_tier_store_begin(en->tier);
    if (!buf) return; /* the queue is full: dropped (counted) */
    model_kv_block_read(en->m, block, buf);
    kv_tier_store_end(en->tier, h);
}

int tier_try_load(struct engine *en, struct request *r, int n_hit)
{
    if (!en->tier || r->tier_tried) return 0;
    r->tier_tried = 1;
    int bs = en->block_size, avail = r->n_hashes;
    if (avail * bs >= r->n_tokens) avail--; /* compute at least one token */
    if (avail <= n_hit) return 0;
    int n = kv_tier_probe(en->tier, r->hashes + n_hit, avail - n_hit);
    en->tier_query_tokens += (uint64_t)(r->n_tokens - n_hit * bs);
    if (n == 0) return 0;
    /* Never slower than recompute: with both rates measured, a load estimated to take at
     * least as long as computing its tokens is bypassed. */
    if (!kv_tier_worth_loading((double)n * (double)model_kv_block_bytes(en->m), n * bs,
                               kv_tier_load_rate(en->tier), en->prefill_tps)) {
        en->tier_bypasses++;
        return 0;
    }
    if (!kv_can_allocate(&en->pool, n, en->hit_blocks, n_hit)) return 0;
    kv_touch(&en->pool, en->hit_blocks, n_hit);
    memcpy(r->blocks, en->hit_blocks, sizeof(int32_t) * (size_t)n_hit);
    kv_allocate(&en->pool, n, r->blocks + n_hit);
    r->n_blocks = n_hit + n;
    r->load_id = kv_tier_load_start(en->tier, r->hashes + n_hit, r->blocks + n_hit, n);
    if (r->load_id < 0) { /* every load slot busy: compute instead */
        kv_release(&en->pool, r->blocks, r->n_blocks);
        r->n_blocks = 0;
        return 0;
    }
    r->load_from = n_hit;
    en->n_loading++;
    return 1;
}

static void write_block(void *user, int32_t block, const void *raw)
{
    struct engine *en = user;
    model_kv_block_write(en->m, block, raw);
}

void tier_poll(struct engine *en, double wait_s)
{
    if (!en->tier) return;
    kv_tier_poll(en->tier, en->n_loading ? wait_s : 0, write_block, en);
    if (!en->n_loading) return;
    for (struct request *r = en->waiting.head; r; r = r->next) {
        int n_ok;
        if (r->load_id < 0 || !kv_tier_load_done(en->tier, r->load_id, &n_ok)) continue;
        /* The loaded blocks join the pool's index; released, they stay cached (LRU tail),
         * so that the request's next plan finds its whole prefix there. */
        for (int i = 0; i < n_ok; i++) {
            int j = r->load_from + i;
            /* a block back in the pool is a block stored, for KV-event subscribers too */
            if (kv_commit_hash(&en->pool, r->blocks[j], r->hashes[j]) && en->cfg.kv_events)
                kv_events_stored(en->cfg.kv_events, &r->hashes[j], 1, j ? &r->hashes[j - 1] : NULL,
                                 r->tokens + (size_t)j * (size_t)en->block_size);
        }
        kv_release(&en->pool, r->blocks, r->n_blocks);
        r->n_blocks = 0;
        r->load_id = -1;
        en->n_loading--;
        en->tier_hit_tokens += (uint64_t)n_ok * (uint64_t)en->block_size;
    }
}

void tier_cancel(struct engine *en, struct request *r)
{
    if (r->load_id < 0) return;
    kv_tier_load_cancel(en->tier, r->load_id);
    r->load_id = -1;
    en->n_loading--;
}

void tier_publish(struct engine *en, struct engine_stats *st)
{
    if (!en->tier) return;
    st->tier_on = 1;
    kv_tier_stats(en->tier, &st->tier);
    st->tier_query_tokens = en->tier_query_tokens;
    st->tier_hit_tokens = en->tier_hit_tokens;
    st->tier_bypasses = en->tier_bypasses;
}
