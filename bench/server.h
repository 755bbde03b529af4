/*
 * server: a server process that pagoda-bench starts and stops itself (--server-cmd), so that
 * a sweep can restart it with other flags for each point (--sweep-server-args).
 *
 * server_start runs "/bin/sh -c 'CMD ARGS'" in a process group of its own, its stdout and
 * stderr to pagoda-bench's stderr or appended to a log file; server_wait_ready polls the
 * base URL until the server answers; server_stop sends SIGTERM to the whole group, waits a
 * grace period, then SIGKILL. Every started server is stopped once (one stop per start).
 */
#ifndef PAGODA_BENCH_SERVER_H
#define PAGODA_BENCH_SERVER_H

#include "bench/hc.h"
#include "common/err.h"

struct server;

/** Starts "cmd args" (args may be NULL or empty). log: a file to append to, or NULL. */
struct server *server_start(const char *cmd, const char *args, const char *log, struct err *e);

/**
 * Polls GET /health (200), or GET /v1/models (200) when /health answers 404, every 200 ms
 * for up to timeout_s. 0 when ready; -1 + err when the server exited, timed out, or
 * pagoda-bench was interrupted (*interrupt set).
 */
int server_wait_ready(struct server *s, struct hc *c, double timeout_s, volatile int *interrupt,
                      struct err *e);

/**
 * SIGTERM to the process group, SIGKILL after grace_s; reaps the process and frees s.
 * Returns its exit status (0..255), 128 + signal when a signal ended it, or -1 when it had
 * to be killed.
 */
int server_stop(struct server *s, double grace_s);

#endif
