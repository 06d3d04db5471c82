/* ctlaunch: starts the ranks of a ct job on this machine and supervises
 * them.
 *
 *   ctlaunch -np N [--nnodes M --node-rank K --master HOST:PORT]
 *            [--log-dir DIR] [--ranks LIST] [--max-restarts R] [--grace S]
 *            [--hang-timeout S] PROGRAM [ARGS...]
 *
 * Each rank runs PROGRAM in its own process group with the CT_* variables
 * that ct_dist_init() reads. Output lines are prefixed with "[rank N]".
 * When a rank fails, the others are stopped (SIGTERM, then SIGKILL after the
 * grace period) and the first failure is reported with the last lines of its
 * stderr; ctlaunch exits with that rank's code. With --hang-timeout, a
 * watcher thread reads the ranks' heartbeats from the store and stops a job
 * whose ranks stopped making progress. --help says more.
 */
#define _GNU_SOURCE

#include <ct/dist.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS  1024
#define TAIL_LINES 20
#define LINE_MAX_  4096
/* ctlaunch's exit code after a hang, as timeout(1)'s. */
#define HANG_EXIT_CODE 124
/* A byte on the signal pipe that is no signal: the watcher found a hang. */
#define HANG_WAKEUP 0

static const char usage_text[] =
    "usage: ctlaunch -np N [options] PROGRAM [ARGS...]\n"
    "\n"
    "Starts N ranks of PROGRAM on this machine, each in its own process group, and\n"
    "supervises them.\n"
    "\n"
    "options:\n"
    "  -np N               ranks on this node (required)\n"
    "  --nnodes M          nodes in the job (default 1)\n"
    "  --node-rank K       this node's index, 0 <= K < M (default 0)\n"
    "  --master HOST:PORT  the store's address, given to every rank as CT_MASTER_ADDR\n"
    "                      and CT_MASTER_PORT; node 0's ctlaunch hosts the store on\n"
    "                      PORT. Without it (one node only), ctlaunch hosts the store\n"
    "                      on 127.0.0.1 at a free port, so jobs never collide\n"
    "  --log-dir DIR       also write each rank's output to DIR/rank.N.out and\n"
    "                      DIR/rank.N.err\n"
    "  --ranks LIST        show only these ranks on the console, e.g. 0 or 0,2-3\n"
    "                      (default: all)\n"
    "  --max-restarts R    restart the whole group up to R times after a failure;\n"
    "                      ranks see the count in CT_RESTART_COUNT (default 0)\n"
    "  --grace S           seconds between SIGTERM and SIGKILL when stopping ranks\n"
    "                      (default 5)\n"
    "  --hang-timeout S    stop the job when a rank that sends heartbeats (every rank\n"
    "                      that called ct_dist_init) has made no progress for S\n"
    "                      seconds: no collective completed, no ct_dist_heartbeat()\n"
    "                      (default: off)\n"
    "  -h, --help          this text\n"
    "\n"
    "Each rank gets CT_RANK, CT_WORLD_SIZE, CT_LOCAL_RANK, CT_LOCAL_WORLD_SIZE,\n"
    "CT_MASTER_ADDR, CT_MASTER_PORT, CT_RESTART_COUNT, and CT_NUM_THREADS (online\n"
    "CPUs divided among the local ranks) unless CT_NUM_THREADS is already set.\n"
    "\n"
    "When a rank exits with a non-zero code or dies on a signal, ctlaunch stops the\n"
    "others, reports that first failure with the last lines of its stderr, and\n"
    "exits with its code (128 + the signal for a signal). SIGINT, SIGTERM, SIGHUP,\n"
    "SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to every rank.\n"
    "\n"
    "With --hang-timeout, a hang is reported with each rank's progress, how long ago\n"
    "it changed and the collective it waits in; the ranks are stopped as after a\n"
    "failure (and restarted under --max-restarts), and ctlaunch exits with 124.\n";

typedef struct options {
    int np, nnodes, node_rank, max_restarts;
    double grace;
    double hang_timeout; /* seconds; 0: no hang detection */
    char *master_host;   /* owned */
    const char *log_dir;
    int master_port;
    bool *show; /* [np]: ranks shown on the console */
    char **argv;
} options;

/* Collects a stream's bytes into lines. */
typedef struct stream {
    int fd; /* -1 once closed */
    char buf[LINE_MAX_];
    size_t len;
    FILE *log;
} stream;

typedef struct rank {
    pid_t pid; /* 0 once reaped */
    int status;
    bool exited;
    stream out, err;
    char tail[TAIL_LINES][256]; /* the last stderr lines, a ring */
    int ntail;
} rank;

/* Signals ctlaunch handles: all but SIGCHLD are forwarded to the ranks. */
static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD};

static int signal_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(signal_pipe[1], &b, 1) < 0) {
        /* The pipe is full: a wake-up is already pending. */
    }
    errno = saved;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("ctlaunch: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\nTry 'ctlaunch --help'.\n", stderr);
    va_end(ap);
    exit(2);
}

static int parse_int(const char *flag, const char *v, int lo, int hi) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi)
        die_usage("%s needs a whole number in [%d, %d], got '%s'", flag, lo, hi, v ? v : "");
    return (int)x;
}

/* "0,2-3" into show[0..np-1]. */
static void parse_ranks(const char *list, bool *show, int np) {
    for (int i = 0; i < np; i++)
        show[i] = false;
    const char *p = list;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            die_usage("--ranks: cannot read '%s' (expected a list like 0,2-3)", list);
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p)
                die_usage("--ranks: cannot read '%s' (expected a list like 0,2-3)", list);
        }
        if (a < 0 || b >= np || a > b)
            die_usage("--ranks: %ld-%ld is outside the %d local ranks", a, b, np);
        for (long i = a; i <= b; i++)
            show[i] = true;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            die_usage("--ranks: unexpected '%c' in '%s'", *end, list);
    }
}

static void parse(int argc, char **argv, options *o) {
    *o = (options){.nnodes = 1, .grace = 5};
    const char *ranks = NULL;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            exit(0);
        }
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!v)
            die_usage("%s needs a value", a);
        i++;
        if (!strcmp(a, "-np") || !strcmp(a, "--nproc-per-node"))
            o->np = parse_int(a, v, 1, MAX_RANKS);
        else if (!strcmp(a, "--nnodes"))
            o->nnodes = parse_int(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--node-rank"))
            o->node_rank = parse_int(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--max-restarts"))
            o->max_restarts = parse_int(a, v, 0, 1000000);
        else if (!strcmp(a, "--log-dir"))
            o->log_dir = v;
        else if (!strcmp(a, "--ranks"))
            ranks = v;
        else if (!strcmp(a, "--grace")) {
            char *end;
            o->grace = strtod(v, &end);
            if (!*v || *end || !(o->grace >= 0) || !isfinite(o->grace))
                die_usage("--grace needs seconds >= 0, got '%s'", v);
        } else if (!strcmp(a, "--hang-timeout")) {
            char *end;
            o->hang_timeout = strtod(v, &end);
            if (!*v || *end || !(o->hang_timeout > 0) || !isfinite(o->hang_timeout))
                die_usage("--hang-timeout needs seconds > 0, got '%s'", v);
        } else if (!strcmp(a, "--master")) {
            const char *colon = strrchr(v, ':');
            if (!colon || colon == v)
                die_usage("--master needs HOST:PORT, got '%s'", v);
            free(o->master_host);
            o->master_host = strndup(v, (size_t)(colon - v));
            o->master_port = parse_int("--master's port", colon + 1, 1, 65535);
        } else {
            die_usage("unknown option '%s'", a);
        }
    }
    if (o->np == 0)
        die_usage("-np N is required");
    if (!o->master_host && o->nnodes > 1)
        die_usage("--nnodes %d needs --master HOST:PORT, the same on every node", o->nnodes);
    if (!o->master_host)
        o->master_host = strdup("127.0.0.1");
    o->show = malloc(sizeof(bool) * (size_t)o->np);
    if (!o->master_host || !o->show) {
        perror("ctlaunch");
        exit(1);
    }
    if (o->node_rank >= o->nnodes)
        die_usage("--node-rank %d is not below --nnodes %d", o->node_rank, o->nnodes);
    if (i >= argc)
        die_usage("no program to run");
    o->argv = &argv[i];
    if (ranks)
        parse_ranks(ranks, o->show, o->np);
    else
        for (int r = 0; r < o->np; r++)
            o->show[r] = true;
}

/* ------------------------------------------------------------ spawning */

static void set_env_int(const char *name, long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    setenv(name, buf, 1);
}

/* Runs in the child: its own process group, the job's variables, then the
 * program. */
static void exec_rank(const options *o, int local, int restart, int out, int err) {
    setpgid(0, 0);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    set_env_int("CT_RANK", (long)o->node_rank * o->np + local);
    set_env_int("CT_WORLD_SIZE", (long)o->nnodes * o->np);
    set_env_int("CT_LOCAL_RANK", local);
    set_env_int("CT_LOCAL_WORLD_SIZE", o->np);
    setenv("CT_MASTER_ADDR", o->master_host, 1);
    set_env_int("CT_MASTER_PORT", o->master_port);
    set_env_int("CT_RESTART_COUNT", restart);
    if (!getenv("CT_NUM_THREADS")) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        set_env_int("CT_NUM_THREADS", cpus / o->np > 0 ? cpus / o->np : 1);
    }
    execvp(o->argv[0], o->argv);
    fprintf(stderr, "ctlaunch: cannot run '%s': %s\n", o->argv[0], strerror(errno));
    _exit(127);
}

static FILE *open_log(const options *o, int local, const char *kind) {
    if (!o->log_dir)
        return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank.%d.%s", o->log_dir, local, kind);
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "ctlaunch: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

static int spawn(const options *o, rank *ranks, int restart) {
    for (int r = 0; r < o->np; r++) {
        int out[2], err[2];
        if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) {
            perror("ctlaunch: pipe");
            return -1;
        }
        fflush(NULL);
        /* Signals stay blocked across fork, so that the child cannot run
         * ctlaunch's handlers (which would report to ctlaunch's pipe) before
         * it restores the defaults. */
        sigset_t all, old;
        sigfillset(&all);
        sigprocmask(SIG_BLOCK, &all, &old);
        pid_t pid = fork();
        if (pid == 0) {
            for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++)
                signal(forwarded[i], SIG_DFL);
            signal(SIGPIPE, SIG_DFL);
            sigprocmask(SIG_SETMASK, &old, NULL);
            exec_rank(o, r, restart, out[1], err[1]);
        }
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (pid < 0) {
            perror("ctlaunch: fork");
            return -1;
        }
        setpgid(pid, pid); /* also here: no race with the first kill */
        close(out[1]);
        close(err[1]);
        rank *k = &ranks[r];
        *k = (rank){.pid = pid};
        k->out = (stream){.fd = out[0], .log = open_log(o, r, "out")};
        k->err = (stream){.fd = err[0], .log = open_log(o, r, "err")};
        fcntl(out[0], F_SETFL, O_NONBLOCK);
        fcntl(err[0], F_SETFL, O_NONBLOCK);
    }
    return 0;
}

/* -------------------------------------------------------------- output */

static void remember(rank *k, const char *line, size_t len) {
    char *slot = k->tail[k->ntail++ % TAIL_LINES];
    size_t n = len < 255 ? len : 255;
    memcpy(slot, line, n);
    slot[n] = 0;
}

/* Writes one complete line of rank r's stream. */
static void emit(const options *o, rank *ranks, int r, bool is_err, const char *line, size_t len) {
    rank *k = &ranks[r];
    stream *s = is_err ? &k->err : &k->out;
    if (s->log) {
        fwrite(line, 1, len, s->log);
        fputc('\n', s->log);
        fflush(s->log);
    }
    if (is_err)
        remember(k, line, len);
    if (o->show[r]) {
        FILE *f = is_err ? stderr : stdout;
        fprintf(f, "[rank %ld] %.*s\n", (long)o->node_rank * o->np + r, (int)len, line);
        fflush(f);
    }
}

/* Reads what is available; returns false once the stream is closed. */
static bool drain(const options *o, rank *ranks, int r, bool is_err) {
    stream *s = is_err ? &ranks[r].err : &ranks[r].out;
    for (;;) {
        ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        if (n <= 0) {
            if (s->len > 0)
                emit(o, ranks, r, is_err, s->buf, s->len);
            s->len = 0;
            close(s->fd);
            s->fd = -1;
            if (s->log)
                fclose(s->log);
            s->log = NULL;
            return false;
        }
        s->len += (size_t)n;
        char *start = s->buf, *nl;
        while ((nl = memchr(start, '\n', (size_t)(s->buf + s->len - start)))) {
            emit(o, ranks, r, is_err, start, (size_t)(nl - start));
            start = nl + 1;
        }
        size_t rest = (size_t)(s->buf + s->len - start);
        /* A line longer than the buffer is written in pieces. */
        if (rest == sizeof s->buf) {
            emit(o, ranks, r, is_err, s->buf, rest);
            rest = 0;
        }
        memmove(s->buf, start, rest);
        s->len = rest;
    }
}

/* ------------------------------------------------------- hang detection */

/* What the watcher knows of one local rank's heartbeats (ct_dist_init's
 * heartbeat thread sets "ct/hb/<restart>/<rank>" to "<progress> <what it
 * waits in>", or "<progress> done" at finalize, about once a second). */
typedef struct beat_state {
    bool seen, done;
    unsigned long long progress;
    double changed; /* when ctlaunch saw progress change */
    char waiting[96];
} beat_state;

/* --hang-timeout's watcher: a thread with its own store client, so that a
 * slow store never holds up the ranks' output. It reads each local rank's
 * heartbeat every second; when one has sent heartbeats, is not done and
 * has not progressed for the timeout, it writes a report and wakes the
 * supervisor through the signal pipe. */
typedef struct watcher {
    const options *o;
    bool enabled;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC: stop was set */
    /* Guarded by mu. */
    bool stop;
    int generation; /* the restart count of the running ranks; -1: none */
    bool *exited;   /* [np]: reaped ranks, which send no more heartbeats */
    char *report;   /* the hang found in this generation, until taken */
    bool hung;
    /* The thread's own. */
    ct_store *store;
    beat_state *state; /* [np] */
    bool *gone;        /* [np]: a copy of exited */
    int state_generation;
} watcher;

static void watcher_poll_rank(watcher *w, int generation, int r, double t) {
    const options *o = w->o;
    beat_state *st = &w->state[r];
    char key[64];
    const char *keys[] = {key};
    snprintf(key, sizeof key, "ct/hb/%d/%ld", generation, (long)o->node_rank * o->np + r);
    bool exists = true;
    if (!st->seen && ct_store_check(w->store, keys, 1, &exists, 1.0))
        exists = false;
    void *value = NULL;
    size_t len = 0;
    if (!exists || ct_store_get(w->store, key, &value, &len, 1.0))
        return;
    unsigned long long progress;
    int rest = 0;
    if (sscanf(value, "%llu %n", &progress, &rest) == 1) {
        const char *waiting = (const char *)value + rest;
        bool done = !strcmp(waiting, "done");
        /* A rank that initializes again after finalize counts from scratch. */
        if (!st->seen || progress != st->progress || (st->done && !done))
            st->changed = t;
        st->seen = true;
        st->done = done;
        st->progress = progress;
        snprintf(st->waiting, sizeof st->waiting, "%s", waiting);
    }
    free(value);
}

/* Appends to buf (cap bytes, *len used), cutting off what does not fit. */
static void CT_PRINTF(4, 5) appendf(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
    if (*len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    *len = n < 0 || *len + (size_t)n >= cap ? cap - 1 : *len + (size_t)n;
}

/* Whether local rank r sends heartbeats, is running and is not done. */
static bool rank_watched(const watcher *w, int r) {
    const beat_state *st = &w->state[r];
    return st->seen && !st->done && !w->gone[r];
}

/* ... and has not progressed for the timeout. */
static bool rank_hung(const watcher *w, int r, double t) {
    return rank_watched(w, r) && t - w->state[r].changed >= w->o->hang_timeout;
}

/* The report of a hang (the caller frees it), or NULL if no rank is hung. */
static char *watcher_judge(const watcher *w, double t) {
    const options *o = w->o;
    int nhung = 0;
    double least = INFINITY;
    for (int r = 0; r < o->np; r++)
        if (rank_hung(w, r, t)) {
            nhung++;
            least = fmin(least, t - w->state[r].changed);
        }
    size_t cap = 256 + (size_t)o->np * 256, len = 0;
    char *report = nhung ? malloc(cap) : NULL;
    if (!report)
        return NULL;
    appendf(report, cap, &len, "ctlaunch: hang: no progress for %.1f s on rank%s", least,
            nhung > 1 ? "s" : "");
    for (int r = 0, listed = 0; r < o->np; r++)
        if (rank_hung(w, r, t))
            appendf(report, cap, &len, "%s %ld", listed++ ? "," : "",
                    (long)o->node_rank * o->np + r);
    appendf(report, cap, &len, " (--hang-timeout %g); stopping the ranks\n", o->hang_timeout);
    /* Every rank with heartbeats: who waits in a collective, who never came. */
    for (int r = 0; r < o->np; r++) {
        const beat_state *st = &w->state[r];
        bool waiting = strcmp(st->waiting, "-") != 0;
        if (rank_watched(w, r))
            appendf(report, cap, &len,
                    "ctlaunch:   rank %ld%s: progress %llu, unchanged for %.1f s, %s%s\n",
                    (long)o->node_rank * o->np + r, rank_hung(w, r, t) ? " (hung)" : "",
                    st->progress, t - st->changed, waiting ? "waiting in " : "in no collective",
                    waiting ? st->waiting : "");
    }
    return report;
}

static void *watcher_main(void *arg) {
    watcher *w = arg;
    const options *o = w->o;
    /* Node 0 hosts the store in this process; other nodes reach node 0's. */
    const char *host = o->node_rank == 0 ? "127.0.0.1" : o->master_host;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += 1;
        while (!w->stop && pthread_cond_timedwait(&w->cv, &w->mu, &until) != ETIMEDOUT)
            ;
        if (w->stop)
            break;
        int generation = w->generation;
        if (generation < 0 || w->hung)
            continue;
        memcpy(w->gone, w->exited, sizeof *w->gone * (size_t)o->np);
        pthread_mutex_unlock(&w->mu);
        if (w->state_generation != generation) {
            memset(w->state, 0, sizeof *w->state * (size_t)o->np);
            w->state_generation = generation;
        }
        if (!w->store)
            w->store = ct_store_connect(host, o->master_port, 1.0);
        char *report = NULL;
        if (w->store) {
            for (int r = 0; r < o->np; r++)
                if (!w->gone[r])
                    watcher_poll_rank(w, generation, r, now());
            report = watcher_judge(w, now());
        }
        pthread_mutex_lock(&w->mu);
        if (report && w->generation == generation) {
            w->hung = true;
            w->report = report;
            unsigned char b = HANG_WAKEUP;
            if (write(signal_pipe[1], &b, 1) < 0) {
                /* The pipe is full: the supervisor wakes up anyway. */
            }
        } else {
            free(report);
        }
    }
    pthread_mutex_unlock(&w->mu);
    ct_store_free(w->store);
    return NULL;
}

/* Starts the watcher when --hang-timeout asks for one. */
static int watcher_start(watcher *w, const options *o) {
    *w = (watcher){.o = o, .generation = -1, .state_generation = -1};
    if (o->hang_timeout == 0)
        return 0;
    w->exited = calloc((size_t)o->np, sizeof *w->exited);
    w->gone = calloc((size_t)o->np, sizeof *w->gone);
    w->state = calloc((size_t)o->np, sizeof *w->state);
    if (!w->exited || !w->gone || !w->state) {
        perror("ctlaunch");
        return -1;
    }
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&w->mu, NULL);
    /* Signals go to the main thread, which forwards them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int err = pthread_create(&w->thread, NULL, watcher_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        fprintf(stderr, "ctlaunch: cannot start the hang watcher: %s\n", strerror(err));
        return -1;
    }
    w->enabled = true;
    return 0;
}

/* Watches the ranks of restart `generation`, or none when it is -1. */
static void watcher_watch(watcher *w, int generation) {
    if (!w->enabled)
        return;
    pthread_mutex_lock(&w->mu);
    w->generation = generation;
    w->hung = false;
    free(w->report);
    w->report = NULL;
    memset(w->exited, 0, sizeof *w->exited * (size_t)w->o->np);
    pthread_mutex_unlock(&w->mu);
}

static void watcher_rank_exited(watcher *w, int r) {
    if (!w->enabled)
        return;
    pthread_mutex_lock(&w->mu);
    w->exited[r] = true;
    pthread_mutex_unlock(&w->mu);
}

/* The report of a hang found among the running ranks (the caller frees
 * it), or NULL. */
static char *watcher_take_report(watcher *w) {
    if (!w->enabled)
        return NULL;
    pthread_mutex_lock(&w->mu);
    char *report = w->report;
    w->report = NULL;
    pthread_mutex_unlock(&w->mu);
    return report;
}

static void watcher_free(watcher *w) {
    if (w->enabled) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
    }
    free(w->report);
    free(w->exited);
    free(w->gone);
    free(w->state);
}

/* ---------------------------------------------------------- supervision */

static bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

static int exit_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void signal_all(const rank *ranks, int np, int sig) {
    for (int r = 0; r < np; r++)
        if (ranks[r].pid > 0)
            kill(-ranks[r].pid, sig);
}

static void report(const options *o, rank *ranks, int r) {
    rank *k = &ranks[r];
    long global = (long)o->node_rank * o->np + r;
    if (WIFEXITED(k->status))
        fprintf(stderr, "ctlaunch: rank %ld failed first: it exited with code %d\n", global,
                WEXITSTATUS(k->status));
    else
        fprintf(stderr, "ctlaunch: rank %ld failed first: it was killed by signal %d (%s)\n",
                global, WTERMSIG(k->status), strsignal(WTERMSIG(k->status)));
    int n = k->ntail < TAIL_LINES ? k->ntail : TAIL_LINES;
    if (n > 0)
        fprintf(stderr, "ctlaunch: the last %d line%s of rank %ld's stderr:\n", n, n > 1 ? "s" : "",
                global);
    for (int i = k->ntail - n; i < k->ntail; i++)
        fprintf(stderr, "    %s\n", k->tail[i % TAIL_LINES]);
}

/* How a generation of the group ended. */
typedef struct outcome {
    enum { ENDED_OK, ENDED_FAILED, ENDED_HUNG, ENDED_SIGNAL } how;
    int rank;   /* ENDED_FAILED: the local rank that failed first */
    int signal; /* ENDED_SIGNAL: the signal that stopped it */
} outcome;

/* Runs one generation of the group to the end. */
static outcome supervise(const options *o, rank *ranks, watcher *watch) {
    int np = o->np, first = -1, stop_signal = 0, alive = np;
    bool hung = false;
    double kill_at = 0;  /* when SIGKILL follows SIGTERM; 0: not stopping */
    double drain_by = 0; /* after the last exit, how long output may still come */
    struct pollfd *fds = calloc((size_t)(2 * np + 1), sizeof *fds);
    if (!fds) {
        perror("ctlaunch");
        signal_all(ranks, np, SIGKILL);
        return (outcome){.how = ENDED_SIGNAL, .signal = SIGKILL};
    }
    for (;;) {
        int open_streams = 0, n = 0;
        fds[n++] = (struct pollfd){.fd = signal_pipe[0], .events = POLLIN};
        for (int r = 0; r < np; r++) {
            fds[n++] = (struct pollfd){.fd = ranks[r].out.fd, .events = POLLIN};
            fds[n++] = (struct pollfd){.fd = ranks[r].err.fd, .events = POLLIN};
            open_streams += (ranks[r].out.fd >= 0) + (ranks[r].err.fd >= 0);
        }
        /* A rank's own children may hold its pipes open after it exits. */
        if (alive == 0 && drain_by == 0)
            drain_by = now() + 1;
        if (alive == 0 && (open_streams == 0 || now() >= drain_by))
            break;
        int timeout = kill_at > 0 ? (int)((kill_at - now()) * 1000) + 1 : 1000;
        poll(fds, (nfds_t)n, timeout < 0 ? 0 : timeout);
        for (int r = 0; r < np; r++) {
            if (ranks[r].out.fd >= 0)
                drain(o, ranks, r, false);
            if (ranks[r].err.fd >= 0)
                drain(o, ranks, r, true);
        }
        unsigned char sigs[64];
        ssize_t got = read(signal_pipe[0], sigs, sizeof sigs);
        for (ssize_t i = 0; i < got; i++) {
            if (sigs[i] == HANG_WAKEUP) {
                char *hang = watcher_take_report(watch);
                if (hang && first < 0 && !stop_signal && !hung) {
                    fputs(hang, stderr);
                    hung = true;
                    signal_all(ranks, np, SIGTERM);
                    kill_at = now() + o->grace;
                }
                free(hang);
                continue;
            }
            if (sigs[i] == SIGCHLD)
                continue;
            signal_all(ranks, np, sigs[i]);
            if ((sigs[i] == SIGINT || sigs[i] == SIGTERM || sigs[i] == SIGHUP) && !stop_signal) {
                stop_signal = sigs[i];
                fprintf(stderr, "ctlaunch: got %s; stopping the ranks\n", strsignal(sigs[i]));
                if (kill_at == 0)
                    kill_at = now() + o->grace;
            }
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            for (int r = 0; r < np; r++) {
                if (ranks[r].pid != pid)
                    continue;
                ranks[r].pid = 0;
                ranks[r].status = status;
                ranks[r].exited = true;
                alive--;
                watcher_rank_exited(watch, r);
                if (failed(status) && first < 0 && !stop_signal && !hung) {
                    first = r;
                    signal_all(ranks, np, SIGTERM);
                    kill_at = now() + o->grace;
                }
            }
        }
        if (kill_at > 0 && now() >= kill_at && alive > 0) {
            signal_all(ranks, np, SIGKILL);
            kill_at = now() + 3600;
        }
    }
    free(fds);
    if (stop_signal)
        return (outcome){.how = ENDED_SIGNAL, .signal = stop_signal};
    if (hung)
        return (outcome){.how = ENDED_HUNG};
    return first >= 0 ? (outcome){.how = ENDED_FAILED, .rank = first} : (outcome){.how = ENDED_OK};
}

int main(int argc, char **argv) {
    options o;
    parse(argc, argv, &o);
    if (o.log_dir && mkdir(o.log_dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "ctlaunch: cannot create --log-dir %s: %s\n", o.log_dir, strerror(errno));
        return 1;
    }
    if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK)) {
        perror("ctlaunch: pipe");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++)
        sigaction(forwarded[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* Node 0 hosts the store the ranks meet through; it outlives restarts.
     * Without --master it binds a free port, published to the ranks. */
    ct_store_server *store = NULL;
    if (o.node_rank == 0) {
        store = ct_store_server_new(o.master_port ? "*" : "127.0.0.1", o.master_port);
        if (!store) {
            fprintf(stderr, "ctlaunch: cannot host the store: %s\n", ct_errmsg());
            return 1;
        }
        o.master_port = ct_store_server_port(store);
    }
    rank *ranks = calloc((size_t)o.np, sizeof *ranks);
    if (!ranks) {
        perror("ctlaunch");
        ct_store_server_free(store);
        return 1;
    }
    watcher watch;
    if (watcher_start(&watch, &o)) {
        watcher_free(&watch);
        free(ranks);
        ct_store_server_free(store);
        return 1;
    }
    int code = 0;
    for (int restart = 0;; restart++) {
        watcher_watch(&watch, restart);
        if (spawn(&o, ranks, restart)) {
            signal_all(ranks, o.np, SIGKILL);
            code = 1;
            break;
        }
        outcome end = supervise(&o, ranks, &watch);
        watcher_watch(&watch, -1);
        if (end.how == ENDED_OK || end.how == ENDED_SIGNAL) {
            code = end.how == ENDED_SIGNAL ? 128 + end.signal : 0;
            break;
        }
        if (end.how == ENDED_FAILED)
            report(&o, ranks, end.rank);
        if (restart >= o.max_restarts) {
            code = end.how == ENDED_HUNG ? HANG_EXIT_CODE : exit_code(ranks[end.rank].status);
            break;
        }
        fprintf(stderr, "ctlaunch: restarting the group (%d of %d restarts)\n", restart + 1,
                o.max_restarts);
    }
    watcher_free(&watch);
    free(ranks);
    free(o.show);
    free(o.master_host);
    ct_store_server_free(store);
    return code;
}
