/*
 * kv_events: KV-cache events (blocks stored in the prefix cache, blocks evicted from it,
 * the whole cache cleared) published over ZeroMQ in vLLM's KV-events wire format, for
 * prefix-aware routers (llm-d's KV-cache indexer, the Gateway API Inference Extension,
 * vLLM production-stack, Dynamo) that track which replica holds which prefix.
 *
 *     struct kv_events_config c;
 *     kv_events_config_parse("{\"enable_kv_cache_events\":true}", &c, &e);
 *     struct kv_events *ev = kv_events_create(&c, &e);   // binds port 5557, starts a thread
 *     cfg.kv_events = ev;  engine_create(&cfg, ...);      // the engine reports into it
 *     ...  engine_destroy(en);  kv_events_destroy(ev);
 *
 * The wire (vllm/distributed/kv_events.py): a PUB socket sends one multipart message per
 * engine step that changed the cache: [topic, sequence number (8 bytes, big-endian, from
 * 0), payload], the payload a msgpack KVEventBatch [ts (float64 seconds since the epoch),
 * events, data_parallel_rank (0)]. Each event is a tagged map as vLLM writes it since its
 * PR #42892 ({"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h|nil,
 * "token_ids": [...], "block_size": n, "lora_id": nil, "medium": "GPU"|"CPU",
 * "lora_name": nil}; {"type": "BlockRemoved", "block_hashes": [...], "medium": ...};
 * {"type": "AllBlocksCleared"}), or, with "event_format": "array", the tagged positional
 * array of the vLLM releases before it (["BlockStored", hashes, parent, tokens,
 * block_size, lora_id, medium, lora_name], ...). With a replay endpoint, a ROUTER socket
 * answers [start sequence (8 bytes, big-endian)] with every kept batch from there, each
 * as [sequence, payload], then [-1 (8 bytes), ""].
 *
 * Block hashes: a pagoda block is named by a 128-bit XXH3 (kv_pool.h); events carry its
 * low 64 bits as an unsigned msgpack integer (vLLM sends 64-bit ints too). The first
 * block of a sequence has parent_block_hash nil (its real parent is the pool's model
 * fingerprint, which is not a block).
 *
 * Threads: the record functions and kv_events_flush run on the engine thread and only
 * append to memory the engine thread owns (no lock, no I/O); flush hands the step's
 * events to the publisher thread (one mutex, a pointer swap), which encodes and sends.
 * When max_queue_size batches wait unsent, a step's batch is dropped and counted (a
 * subscriber sees the sequence numbers stay contiguous: dropped batches never get one).
 */
#ifndef PAGODA_PAGED_KV_KV_EVENTS_H
#define PAGODA_PAGED_KV_KV_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/msgpack.h"
#include "paged_kv/kv_pool.h"

/** vLLM's KVEventsConfig fields (its names and defaults), plus event_format. */
struct kv_events_config {
    int enable;                /* enable_kv_cache_events (false) */
    int zmq;                   /* publisher: "zmq" (1, the default when enabled) or "null" */
    char endpoint[256];        /* port 5557 on every interface by default; bound when it has
                                  a '*' or '::' or is ipc:// or inproc://, else connected to */
    char replay_endpoint[256]; /* "" (null): no replay socket */
    int buffer_steps;          /* batches kept for replay (10000) */
    int hwm;                   /* the PUB socket's send high-water mark (100000) */
    int max_queue_size;        /* batches waiting for the publisher at most (100000) */
    char topic[256];           /* "" */
    int array_events;          /* event_format "array" (1) or "map" (0, the default) */
};

/**
 * Parses the --kv-events-config JSON object into c (defaults for absent keys). -1 + err
 * naming the key for bad JSON, an unknown key, a wrong type or a value out of range.
 */
int kv_events_config_parse(const char *json, struct kv_events_config *c, struct err *e);

struct kv_events;

/**
 * Opens the sockets and starts the publisher thread. NULL without an error when events are
 * off (enable false or publisher "null"); NULL + err when the endpoint cannot be bound or
 * connected, or when this build has no libzmq.
 */
struct kv_events *kv_events_create(const struct kv_events_config *c, struct err *e);

/** Sends what is queued (waiting at most a second for slow subscribers), closes, frees. */
void kv_events_destroy(struct kv_events *ev);

/** The pool's block size and where its blocks live ("GPU", "CPU"); set by the engine. */
void kv_events_attach(struct kv_events *ev, int block_size, const char *medium);

/* ---- the engine thread ---- */

/** Blocks hashes[0..n) were stored, chained after parent (NULL: the first blocks of a
 * sequence); tokens holds their n * block_size token ids. */
void kv_events_stored(struct kv_events *ev, const struct kv_hash *hashes, int n,
                      const struct kv_hash *parent, const int32_t *tokens);
/** Block h left the prefix cache (evicted for reuse). */
void kv_events_removed(struct kv_events *ev, struct kv_hash h);
/** Every cached block is gone. */
void kv_events_cleared(struct kv_events *ev);
/** Ends a step: its events (if any) go to the publisher as one batch. */
void kv_events_flush(struct kv_events *ev);

/** Batches published, and dropped because max_queue_size were waiting. */
void kv_events_counts(struct kv_events *ev, uint64_t *published, uint64_t *dropped);

#endif
