/* Starting and stopping the server under test: see server.h. */
#include "bench/server.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

struct server {
    pid_t pid;
    int exited, code, status; /* once it ended: si_code (CLD_EXITED...) and si_status */
};

struct server *server_start(const char *cmd, const char *args, const char *log, struct err *e)
{
    size_t len = strlen(cmd) + (args ? strlen(args) : 0) + 2;
    char *line = xmalloc(len);
    snprintf(line, len, "%s%s%s", cmd, args && args[0] ? " " : "", args ? args : "");
    int fd = 2;
    if (log && (fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0) {
        err_set(e, "--server-log %s: %s", log, strerror(errno));
        free(line);
        return NULL;
    }
    if (log) dprintf(fd, "== pagoda-bench: %s\n", line);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        err_set(e, "--server-cmd: fork: %s", strerror(errno));
        if (fd != 2) close(fd);
        free(line);
        return NULL;
    }
    if (pid == 0) {
        /* Its own process group: ^C at the terminal reaches pagoda-bench only, which then
         * stops the server in order; the whole group gets the signals (sh and its children). */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* pagoda-bench killed: do not leave it running */
        signal(SIGPIPE, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid); /* also here, so that a stop right after the fork finds the group */
    if (fd != 2) close(fd);
    fprintf(stderr, "pagoda-bench: started server (pid %d): %s\n", (int)pid, line);
    free(line);
    struct server *s = xcalloc(1, sizeof *s);
    s->pid = pid;
    return s;
}

/* Whether the process ended, without reaping it: while it stays a zombie its process group id
 * cannot be reused, so signals to the group reach only what it started. */
static int ended(struct server *s)
{
    if (s->exited) return 1;
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)s->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == s->pid) {
        s->exited = 1;
        s->code = si.si_code;
        s->status = si.si_status;
    }
    return s->exited;
}

static void describe_exit(const struct server *s, char *buf, size_t n)
{
    if (s->code == CLD_EXITED)
        snprintf(buf, n, "exit status %d", s->status);
    else
        snprintf(buf, n, "killed by signal %d", s->status);
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int server_wait_ready(struct server *s, struct hc *c, double timeout_s, volatile int *interrupt,
                      struct err *e)
{
    double t0 = util_now();
    for (;;) {
        if (ended(s)) {
            char why[64];
            describe_exit(s, why, sizeof why);
            return err_set(e, "the server exited before it was ready (%s)", why);
        }
        if (interrupt && *interrupt) return err_set(e, "interrupted");
        int status = 0;
        char *body = NULL;
        struct err fe = {{0}};
        if (!hc_fetch(c, "GET", "/health", NULL, 5, &status, &body, NULL, &fe)) {
            free(body);
            body = NULL;
            if (status == 200) return 0;
            if (status == 404 &&
                !hc_fetch(c, "GET", "/v1/models", NULL, 5, &status, &body, NULL, &fe)) {
                free(body);
                if (status == 200) return 0;
            }
        }
        if (util_now() - t0 > timeout_s)
            return err_set(e, "the server did not answer /health or /v1/models within %g s",
                           timeout_s);
        sleep_s(0.2);
    }
}

int server_stop(struct server *s, double grace_s)
{
    if (!s) return 0;
    int killed = 0;
    if (!ended(s)) {
        kill(-s->pid, SIGTERM);
        double t0 = util_now();
        while (!ended(s) && util_now() - t0 < grace_s) sleep_s(0.05);
        if (!s->exited) {
            fprintf(stderr,
                    "pagoda-bench: the server did not stop within %g s of SIGTERM: SIGKILL\n",
                    grace_s);
            killed = 1;
        }
    }
    /* what is left of the group (children of sh that outlived it) goes too, then the reap */
    kill(-s->pid, SIGKILL);
    int st;
    while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR) {
    }
    int rc = killed ? -1 : s->code == CLD_EXITED ? s->status : 128 + s->status;
    free(s);
    return rc;
}
