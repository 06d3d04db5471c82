/* ctlaunch: starts the ranks of a ct job on this machine and supervises
 * them.
 *
 *   ctlaunch -np N [--nnodes M --node-rank K --master HOST:PORT]
 *            [--log-dir DIR] [--ranks LIST] [--max-restarts R] [--grace S]
 *            PROGRAM [ARGS...]
 *
 * Each rank runs PROGRAM in its own process group with the CT_* variables
 * that ct_dist_init() reads. Output lines are prefixed with "[rank N]".
 * When a rank fails, the others are stopped (SIGTERM, then SIGKILL after the
 * grace period) and the first failure is reported with the last lines of its
 * stderr; ctlaunch exits with that rank's code. --help says more.
 */
#define _GNU_SOURCE

#include <ct/dist.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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
    "  -h, --help          this text\n"
    "\n"
    "Each rank gets CT_RANK, CT_WORLD_SIZE, CT_LOCAL_RANK, CT_LOCAL_WORLD_SIZE,\n"
    "CT_MASTER_ADDR, CT_MASTER_PORT, CT_RESTART_COUNT, and CT_NUM_THREADS (online\n"
    "CPUs divided among the local ranks) unless CT_NUM_THREADS is already set.\n"
    "\n"
    "When a rank exits with a non-zero code or dies on a signal, ctlaunch stops the\n"
    "others, reports that first failure with the last lines of its stderr, and\n"
    "exits with its code (128 + the signal for a signal). SIGINT, SIGTERM, SIGHUP,\n"
    "SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to every rank.\n";

typedef struct options {
    int np, nnodes, node_rank, max_restarts;
    double grace;
    char *master_host; /* owned */
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
            if (*end || !(o->grace >= 0))
                die_usage("--grace needs seconds >= 0, got '%s'", v);
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

/* Runs one generation of the group to the end. Returns the rank that failed
 * first (-1 if none), or -2 - signal when a forwarded signal stopped it. */
static int supervise(const options *o, rank *ranks) {
    int np = o->np, first = -1, stop_signal = 0, alive = np;
    double kill_at = 0;  /* when SIGKILL follows SIGTERM; 0: not stopping */
    double drain_by = 0; /* after the last exit, how long output may still come */
    struct pollfd *fds = calloc((size_t)(2 * np + 1), sizeof *fds);
    if (!fds) {
        perror("ctlaunch");
        signal_all(ranks, np, SIGKILL);
        return -1;
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
                if (failed(status) && first < 0 && !stop_signal) {
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
    return stop_signal ? -2 - stop_signal : first;
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
    int code = 0;
    for (int restart = 0;; restart++) {
        if (spawn(&o, ranks, restart)) {
            signal_all(ranks, o.np, SIGKILL);
            code = 1;
            break;
        }
        int first = supervise(&o, ranks);
        if (first < 0) {
            code = first <= -2 ? 128 + (-2 - first) : 0;
            break;
        }
        report(&o, ranks, first);
        if (restart >= o.max_restarts) {
            code = exit_code(ranks[first].status);
            break;
        }
        fprintf(stderr, "ctlaunch: restarting the group (%d of %d restarts)\n", restart + 1,
                o.max_restarts);
    }
    free(ranks);
    free(o.show);
    free(o.master_host);
    ct_store_server_free(store);
    return code;
}
