/* ctlaunch: starts the ranks of a ct job on this machine and supervises
 * them.
 *
 *   ctlaunch -np N [--nnodes M|MIN:MAX --node-rank K --master HOST:PORT]
 *            [--master-port PORT] [--bind ADDR] [--log-dir DIR]
 *            [--ranks LIST] [--max-restarts R] [--grace S]
 *            [--hang-timeout S] PROGRAM [ARGS...]
 *
 * Each rank runs PROGRAM in its own process group with the CT_* variables
 * that ct_dist_init() reads. Output lines are prefixed with "[rank N]".
 * When a rank fails, the others are stopped (SIGTERM, then SIGKILL after the
 * grace period) and the first failure is reported with the last lines of its
 * stderr; ctlaunch exits with that rank's code. With --hang-timeout, a
 * watcher thread reads the ranks' heartbeats from the store and stops a job
 * whose ranks stopped making progress. With --nnodes MIN:MAX the job is
 * elastic: the nodes meet in rounds through the store (elastic.h), and the
 * job re-forms when a node dies or joins. --help says more.
 *
 * No process outlives the job: ranks die with ctlaunch (PR_SET_PDEATHSIG),
 * ctlaunch is a subreaper, so a rank's orphaned children become its own,
 * and every generation ends by stopping whatever is left of each rank's
 * process group and of those orphans. docs/launcher.md has the guarantees.
 */
#define _GNU_SOURCE

#include <ct/cli.h>
#include <ct/dist.h>

#include "base_impl.h"
#include "elastic.h"
#include "tail.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 1024
#define LINE_MAX_ 4096
/* How long teardown waits for SIGKILLed processes to go before it gives
 * up on them with a warning (one in uninterruptible sleep may take long). */
#define KILL_WAIT_S 5
/* ctlaunch's exit code after a hang, as timeout(1)'s. */
#define HANG_EXIT_CODE 124
/* A byte on the signal pipe that is no signal: the watcher found a hang. */
#define HANG_WAKEUP 0

static const char about[] =
    "Starts N ranks of PROGRAM on this machine, each in its own process group, and\n"
    "supervises them.";

static const char epilog[] =
    "Each rank gets CT_RANK, CT_WORLD_SIZE, CT_LOCAL_RANK, CT_LOCAL_WORLD_SIZE,\n"
    "CT_MASTER_ADDR, CT_MASTER_PORT, CT_RESTART_COUNT, and CT_NUM_THREADS (online\n"
    "CPUs divided among the local ranks) unless CT_NUM_THREADS is already set.\n"
    "\n"
    "When a rank exits with a non-zero code or dies on a signal, ctlaunch stops the\n"
    "others, reports that first failure with the last lines of its stderr, and\n"
    "exits with its code (128 + the signal for a signal). SIGINT, SIGTERM, SIGHUP,\n"
    "SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to every rank.\n"
    "\n"
    "No process outlives the job: when the ranks have exited, what is left of their\n"
    "process groups and their orphaned children get SIGTERM, then SIGKILL after the\n"
    "grace period; if ctlaunch itself is killed, the ranks get SIGKILL.\n"
    "\n"
    "With --hang-timeout, a hang is reported with each rank's progress, how long ago\n"
    "it changed and the collective it waits in; the ranks are stopped as after a\n"
    "failure (and restarted under --max-restarts), and ctlaunch exits with 124.\n";

typedef struct options {
    int np, max_restarts;
    /* The nodes of the job, or of the running round of an elastic one
     * (min_nodes < max_nodes), and this node's index among them. */
    int nnodes, node_rank;
    int min_nodes, max_nodes;
    bool node_rank_given;
    bool hosts_store;               /* node 0 of a fixed job; --node-rank 0 of an elastic one */
    double last_call, join_timeout; /* the rounds of a job of several nodes */
    double grace;
    double hang_timeout; /* seconds; 0: no hang detection */
    char *master_host;   /* owned: --master's HOST, or 127.0.0.1 */
    const char *bind;    /* --bind, or NULL for the default policy */
    /* Where this node's ranks (and the watcher) reach the store: node 0's
     * listening address, or master_host on the other nodes. Owned. */
    char *store_addr;
    const char *log_dir;
    const char *secret_file; /* --secret-file, else CT_SECRET_FILE; NULL: a new secret */
    int master_port;
    bool *show; /* [np]: ranks shown on the console */
    char **argv;
} options;

/* A --log-dir file, open for the whole run: each generation appends. */
typedef struct logfile {
    int fd; /* -1: none, or given up after a write error */
    char name[32];
    bool midline; /* the last byte written was not a newline */
} logfile;

/* Collects a stream's bytes into lines. */
typedef struct stream {
    int fd; /* -1 once closed */
    char buf[LINE_MAX_];
    size_t len;
    logfile *log; /* NULL without --log-dir */
} stream;

typedef struct rank {
    pid_t pid; /* 0 once reaped */
    /* The rank's process group, kept after the rank is reaped, since its
     * children may live on in it; 0 once the group is empty. */
    pid_t pgid;
    int status;
    bool exited;
    stream out, err;
    ct__tail tail; /* the last stderr lines */
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

static void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("ctlaunch: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\nTry 'ctlaunch --help'.\n", stderr);
    va_end(ap);
    exit(2);
}

/* --master HOST:PORT into options (a CT_CLI_CUSTOM parser). */
static int parse_master(void *dest, const char *v) {
    options *o = dest;
    const char *colon = strrchr(v, ':');
    char *end = NULL;
    errno = 0;
    long port = colon && colon != v && colon[1] >= '0' && colon[1] <= '9'
                    ? strtol(colon + 1, &end, 10)
                    : -1;
    if (port < 1 || port > 65535 || errno || (end && *end))
        return ct_seterr(CT_EINVAL, "needs HOST:PORT with PORT in [1, 65535], got '%s'", v);
    char *host = strndup(v, (size_t)(colon - v));
    if (!host)
        return ct_seterr(CT_ENOMEM, "out of memory");
    free(o->master_host);
    o->master_host = host;
    o->master_port = (int)port;
    return 0;
}

/* --nnodes M or MIN:MAX into options (a CT_CLI_CUSTOM parser). */
static int parse_nnodes(void *dest, const char *v) {
    options *o = dest;
    char *end;
    errno = 0;
    long lo = strtol(v, &end, 10), hi = lo;
    if (end != v && *end == ':')
        hi = strtol(end + 1, &end, 10);
    if (end == v || *end || errno || lo < 1 || hi < lo || hi > 1 << 20)
        return ct_seterr(CT_EINVAL, "needs M or MIN:MAX with 1 <= MIN <= MAX <= %d, got '%s'",
                         1 << 20, v);
    o->min_nodes = (int)lo;
    o->max_nodes = (int)hi;
    return 0;
}

static bool elastic(const options *o) { return o->min_nodes < o->max_nodes; }

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
    *o = (options){.nnodes = 1,
                   .min_nodes = 1,
                   .max_nodes = 1,
                   .grace = 5,
                   .last_call = 10,
                   .join_timeout = 600};
    const char *ranks = NULL;
    bool master_port_flag = false, master_flag = false;
    int port = 0;
    const ct_cli_flag flags[] = {
        CT_CLI_FLAG("--nproc-per-node", CT_CLI_INT, &o->np, "N", "ranks on this node (required)",
                    .alias = "-np", .min = 1, .max = MAX_RANKS, .default_text = ""),
        CT_CLI_FLAG("--nnodes", CT_CLI_CUSTOM, o, "M|MIN:MAX",
                    "nodes in the job; MIN:MAX makes it elastic: it runs on as many nodes as "
                    "join, between MIN and MAX, and re-forms when one dies or joins "
                    "(docs/multinode.md)",
                    .parse = parse_nnodes, .default_text = "1"),
        CT_CLI_FLAG("--node-rank", CT_CLI_INT, &o->node_rank, "K",
                    "this node's index, 0 <= K < M; node 0 hosts the store. Elastic jobs: "
                    "0 on the node that hosts the store, none on the others, whose index each "
                    "round gives out",
                    .min = 0, .max = 1 << 20, .default_text = "0", .given = &o->node_rank_given),
        CT_CLI_FLAG("--last-call", CT_CLI_DOUBLE, &o->last_call, "S",
                    "elastic jobs: how long a round waits for more nodes once MIN have joined",
                    .min = 0, .max = 1e6, .expects = "seconds >= 0"),
        CT_CLI_FLAG("--join-timeout", CT_CLI_DOUBLE, &o->join_timeout, "S",
                    "several nodes: how long a node waits for a round to form, or the host "
                    "for MIN nodes (all M after a restart), before giving up",
                    .min = 1e-3, .max = 1e9, .expects = "seconds > 0"),
        CT_CLI_FLAG("--master", CT_CLI_CUSTOM, o, "HOST:PORT",
                    "the store's address; node 0's ctlaunch hosts the store on PORT, the "
                    "other nodes' ranks get HOST and PORT in CT_MASTER_ADDR and "
                    "CT_MASTER_PORT. Without it (one node only), ctlaunch hosts the store at "
                    "a free port, so jobs never collide",
                    .parse = parse_master, .given = &master_flag),
        CT_CLI_FLAG("--master-port", CT_CLI_INT, &port, "PORT",
                    "one node: the store's port, instead of a free one", .min = 1, .max = 65535,
                    .default_text = "", .given = &master_port_flag),
        CT_CLI_FLAG("--bind", CT_CLI_STRING, &o->bind, "ADDR",
                    "where node 0 hosts the store: an IPv4 address or an interface name of "
                    "this machine ('*' is every interface). Default: 127.0.0.1 on one node; "
                    "with --nnodes > 1 the address HOST of --master resolves to, which must "
                    "be this machine's"),
        CT_CLI_FLAG("--secret-file", CT_CLI_STRING, &o->secret_file, "F",
                    "the job's secret, the same file on every node (mode 600; default: "
                    "CT_SECRET_FILE, else a new random secret, which works for one node "
                    "only); store and RPC connections must prove it, and the ranks get it in "
                    "CT_JOB_SECRET"),
        CT_CLI_FLAG("--log-dir", CT_CLI_STRING, &o->log_dir, "DIR",
                    "also append each rank's output to DIR/rank.N.out and DIR/rank.N.err "
                    "(mode 600), under a header per restart; DIR is created (mode 700) or "
                    "must be this user's own real directory, not writable by others"),
        CT_CLI_FLAG("--ranks", CT_CLI_STRING, &ranks, "LIST",
                    "show only these ranks on the console, e.g. 0 or 0,2-3", .default_text = "all"),
        CT_CLI_FLAG("--max-restarts", CT_CLI_INT, &o->max_restarts, "R",
                    "restart the whole group up to R times after a failure; ranks see the "
                    "count in CT_RESTART_COUNT",
                    .min = 0, .max = 1000000),
        CT_CLI_FLAG("--grace", CT_CLI_DOUBLE, &o->grace, "S",
                    "seconds between SIGTERM and SIGKILL when stopping ranks", .min = 0, .max = 1e6,
                    .expects = "seconds >= 0"),
        CT_CLI_FLAG("--hang-timeout", CT_CLI_DOUBLE, &o->hang_timeout, "S",
                    "stop the job when a rank that sends heartbeats (every rank that called "
                    "ct_dist_init) has made no progress for S seconds: no collective "
                    "completed, no ct_dist_heartbeat()",
                    .min = 1e-3, .max = 1e9, .expects = "seconds > 0", .default_text = "off"),
    };
    ct_cli cli = {.prog = "ctlaunch",
                  .about = about,
                  .flags = flags,
                  .nflags = sizeof flags / sizeof *flags,
                  .args = "PROGRAM [ARGS...]",
                  .stop_at_args = true,
                  .epilog = epilog};
    int i, rc = ct_cli_parse(&cli, argc, argv, &i);
    if (rc)
        exit(rc > 0 ? 0 : 2);
    if (master_port_flag)
        o->master_port = port;
    if (o->bind && !*o->bind)
        die_usage("--bind needs an IPv4 address or an interface name");
    if (o->np == 0)
        die_usage("-np N is required");
    if (master_port_flag && master_flag)
        die_usage("give the store's port once: --master HOST:PORT or --master-port PORT");
    o->nnodes = o->max_nodes;
    if (!o->master_host && o->max_nodes > 1)
        die_usage("--nnodes %d needs --master HOST:PORT, the same on every node", o->max_nodes);
    if (elastic(o) && o->node_rank_given && o->node_rank != 0)
        die_usage("--node-rank %d: an elastic job (--nnodes %d:%d) gives out node ranks at each "
                  "round; pass --node-rank 0 on the node that hosts the store, and none on the "
                  "others",
                  o->node_rank, o->min_nodes, o->max_nodes);
    if (!o->master_host)
        o->master_host = strdup("127.0.0.1");
    o->show = malloc(sizeof(bool) * (size_t)o->np);
    if (!o->master_host || !o->show) {
        perror("ctlaunch");
        exit(1);
    }
    if (!elastic(o) && o->node_rank >= o->nnodes)
        die_usage("--node-rank %d is not below --nnodes %d", o->node_rank, o->nnodes);
    o->hosts_store = elastic(o) ? o->node_rank_given : o->node_rank == 0;
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
    setenv("CT_MASTER_ADDR", o->store_addr, 1);
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

/* ------------------------------------------------------------- logging */

/* Opens --log-dir, which ctlaunch makes (mode 0700) or which must be a real
 * directory of this user that others cannot write to: someone else who can
 * write there could swap a log for a link to a file of this user's. The
 * files are opened relative to the fd, so the directory cannot be swapped
 * either. Returns the fd, or -1 after a message. */
static int open_log_dir(const char *path) {
    if (mkdir(path, 0700) && errno != EEXIST) {
        fprintf(stderr, "ctlaunch: cannot create --log-dir %s: %s\n", path, strerror(errno));
        return -1;
    }
    int dir = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dir < 0 || fstat(dir, &st)) {
        int e = errno;
        struct stat lst;
        bool link = e == ELOOP || (!lstat(path, &lst) && S_ISLNK(lst.st_mode));
        fprintf(stderr, "ctlaunch: --log-dir %s: %s\n", path,
                link           ? "is a symbolic link; name the directory itself"
                : e == ENOTDIR ? "is not a directory"
                               : strerror(e));
        if (dir >= 0)
            close(dir);
        return -1;
    }
    const char *why = st.st_uid != geteuid() ? "belongs to another user"
                      : st.st_mode & S_IWOTH ? "is writable by others (chmod o-w it)"
                                             : NULL;
    if (why) {
        fprintf(stderr, "ctlaunch: --log-dir %s %s; choose a directory of your own\n", path, why);
        close(dir);
        return -1;
    }
    return dir;
}

/* Opens (or creates) DIR/rank.<local>.<kind> for appending: close-on-exec
 * so later ranks do not inherit it, no symlink followed, and a regular file
 * only (O_NONBLOCK, so that a FIFO planted there fails instead of blocking
 * ctlaunch). Mode 0600: logs hold whatever a program prints. */
static int open_log(int dir, const char *dir_path, logfile *f, int local, const char *kind) {
    snprintf(f->name, sizeof f->name, "rank.%d.%s", local, kind);
    f->fd = openat(dir, f->name,
                   O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
    struct stat st;
    int e = f->fd < 0 || fstat(f->fd, &st) ? errno : 0;
    /* A FIFO without a reader fails to open (ENXIO): say what it is. */
    if (e && e != ELOOP && !fstatat(dir, f->name, &st, AT_SYMLINK_NOFOLLOW) && !S_ISREG(st.st_mode))
        e = 0;
    const char *why = e == ELOOP ? "it is a symbolic link, which ctlaunch does not follow"
                      : e        ? strerror(e)
                      : !S_ISREG(st.st_mode) ? "it is not a regular file"
                                             : NULL;
    if (why) {
        fprintf(stderr, "ctlaunch: cannot log to %s/%s: %s\n", dir_path, f->name, why);
        if (f->fd >= 0)
            close(f->fd);
        f->fd = -1;
        return -1;
    }
    return 0;
}

/* The log files of every local rank, [2 * np]: out, err. NULL without
 * --log-dir. */
static logfile *open_logs(const options *o) {
    if (!o->log_dir)
        return NULL;
    int dir = open_log_dir(o->log_dir);
    logfile *logs = dir < 0 ? NULL : calloc(2 * (size_t)o->np, sizeof *logs);
    if (dir >= 0 && !logs)
        perror("ctlaunch");
    for (int r = 0; logs && r < o->np; r++)
        if (open_log(dir, o->log_dir, &logs[2 * r], r, "out") ||
            open_log(dir, o->log_dir, &logs[2 * r + 1], r, "err")) {
            for (int i = 0; i < 2 * r + 2; i++)
                if (logs[i].fd >= 0)
                    close(logs[i].fd);
            free(logs);
            logs = NULL;
        }
    if (dir >= 0)
        close(dir);
    return logs;
}

static void close_logs(logfile *logs, int np) {
    for (int i = 0; logs && i < 2 * np; i++)
        if (logs[i].fd >= 0)
            close(logs[i].fd);
    free(logs);
}

/* Appends to a log; after a write error (a full disk) it says so once and
 * logs no more to that file, and the ranks carry on. */
static void log_write(logfile *f, const char *buf, size_t len) {
    if (!f || f->fd < 0 || len == 0)
        return;
    for (size_t done = 0; done < len;) {
        ssize_t n = write(f->fd, buf + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "ctlaunch: cannot write %s: %s; it logs no more\n", f->name,
                    n < 0 ? strerror(errno) : "nothing written");
            close(f->fd);
            f->fd = -1;
            return;
        }
        done += (size_t)n;
    }
    f->midline = buf[len - 1] != '\n';
}

/* Marks where a generation's output starts, so that a restart keeps what
 * the failed generation wrote and a reader can tell the two apart. */
static void log_header(logfile *f, int restart, long global) {
    if (!f || f->fd < 0)
        return;
    char when[64], line[160];
    time_t t = time(NULL);
    struct tm tm;
    if (!localtime_r(&t, &tm) || !strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S%z", &tm))
        snprintf(when, sizeof when, "%lld s after the epoch", (long long)t);
    int n =
        snprintf(line, sizeof line, "%s==== ctlaunch: generation %d, rank %ld, started %s ====\n",
                 f->midline ? "\n" : "", restart, global, when);
    log_write(f, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static int spawn(const options *o, rank *ranks, logfile *logs, int restart) {
    pid_t parent = getpid();
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
            /* The rank dies with ctlaunch, even of SIGKILL; if ctlaunch is
             * already gone, prctl came too late and the rank must not start. */
            if (prctl(PR_SET_PDEATHSIG, SIGKILL)) {
                fprintf(stderr, "ctlaunch: prctl(PR_SET_PDEATHSIG): %s\n", strerror(errno));
                _exit(127);
            }
            if (getppid() != parent)
                _exit(127);
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
        *k = (rank){.pid = pid, .pgid = pid};
        k->out = (stream){.fd = out[0], .log = logs ? &logs[2 * r] : NULL};
        k->err = (stream){.fd = err[0], .log = logs ? &logs[2 * r + 1] : NULL};
        long global = (long)o->node_rank * o->np + r;
        log_header(k->out.log, restart, global);
        log_header(k->err.log, restart, global);
        fcntl(out[0], F_SETFL, O_NONBLOCK);
        fcntl(err[0], F_SETFL, O_NONBLOCK);
    }
    return 0;
}

/* -------------------------------------------------------------- output */

/* Passes on one complete line of rank r's stream: to the console (the
 * caller flushes) and, for stderr, to the tail kept for a failure report. */
static void emit(const options *o, rank *ranks, int r, bool is_err, const char *line, size_t len) {
    rank *k = &ranks[r];
    if (is_err)
        ct__tail_push(&k->tail, line, len);
    if (o->show[r])
        fprintf(is_err ? stderr : stdout, "[rank %ld] %.*s\n", (long)o->node_rank * o->np + r,
                (int)len, line);
}

/* Reads once, at most a buffer's worth: a rank that writes without pause
 * then gets one turn per poll round like every other stream, and cannot
 * hold up reaping, signals or the other ranks' output. Returns false once
 * the stream is closed. */
static bool drain(const options *o, rank *ranks, int r, bool is_err) {
    stream *s = is_err ? &ranks[r].err : &ranks[r].out;
    ssize_t n;
    do
        n = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return true;
    if (n <= 0) {
        if (s->len > 0)
            emit(o, ranks, r, is_err, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
    } else {
        log_write(s->log, s->buf + s->len, (size_t)n);
        s->len += (size_t)n;
        char *start = s->buf, *nl;
        while ((nl = memchr(start, '\n', (size_t)(s->buf + s->len - start)))) {
            emit(o, ranks, r, is_err, start, (size_t)(nl - start));
            start = nl + 1;
        }
        size_t rest = (size_t)(s->buf + s->len - start);
        /* A line longer than the buffer is passed on in pieces. */
        if (rest == sizeof s->buf) {
            emit(o, ranks, r, is_err, s->buf, rest);
            rest = 0;
        }
        memmove(s->buf, start, rest);
        s->len = rest;
    }
    if (o->show[r])
        fflush(is_err ? stderr : stdout);
    return s->fd >= 0;
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
    int generation;  /* the restart count of the running ranks; -1: none */
    long first_rank; /* the global rank of local rank 0 in the generation */
    bool *exited;    /* [np]: reaped ranks, which send no more heartbeats */
    char *report;    /* the hang found in this generation, until taken */
    bool hung;
    /* The thread's own. */
    ct_store *store;
    beat_state *state; /* [np] */
    bool *gone;        /* [np]: a copy of exited */
    int state_generation;
    long first; /* a copy of first_rank */
} watcher;

static void watcher_poll_rank(watcher *w, int generation, int r, double t) {
    beat_state *st = &w->state[r];
    char key[64];
    const char *keys[] = {key};
    snprintf(key, sizeof key, "ct/hb/%d/%ld", generation, w->first + r);
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
            appendf(report, cap, &len, "%s %ld", listed++ ? "," : "", w->first + r);
    appendf(report, cap, &len, " (--hang-timeout %g); stopping the ranks\n", o->hang_timeout);
    /* Every rank with heartbeats: who waits in a collective, who never came. */
    for (int r = 0; r < o->np; r++) {
        const beat_state *st = &w->state[r];
        bool waiting = strcmp(st->waiting, "-") != 0;
        if (rank_watched(w, r))
            appendf(report, cap, &len,
                    "ctlaunch:   rank %ld%s: progress %llu, unchanged for %.1f s, %s%s\n",
                    w->first + r, rank_hung(w, r, t) ? " (hung)" : "", st->progress,
                    t - st->changed, waiting ? "waiting in " : "in no collective",
                    waiting ? st->waiting : "");
    }
    return report;
}

static void *watcher_main(void *arg) {
    watcher *w = arg;
    const options *o = w->o;
    const char *host = o->store_addr;
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
        w->first = w->first_rank;
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
                    watcher_poll_rank(w, generation, r, ct__now());
            report = watcher_judge(w, ct__now());
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
    w->first_rank = (long)w->o->node_rank * w->o->np;
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

/* Sends sig to every rank's process group that still has a member,
 * including the groups of ranks already reaped (their children may live
 * on there); sig 0 only checks. Forgets a group once it is empty, so that
 * a later process group that reuses the id is never signalled. Returns how
 * many groups are left. */
static int signal_all(rank *ranks, int np, int sig) {
    int left = 0;
    for (int r = 0; r < np; r++) {
        if (ranks[r].pgid <= 0)
            continue;
        if (kill(-ranks[r].pgid, sig) && errno == ESRCH)
            ranks[r].pgid = 0;
        else
            left++;
    }
    return left;
}

/* Reaps every child that has ended: a rank not reaped yet (when spawning
 * failed) or an orphan re-parented to ctlaunch; an unreaped zombie would
 * keep its process group from emptying. */
static void reap_all(rank *ranks, int np) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
        for (int r = 0; r < np; r++)
            if (ranks[r].pid == pid) {
                ranks[r].pid = 0;
                ranks[r].status = status;
                ranks[r].exited = true;
            }
}

/* ctlaunch's children that are not ranks: processes orphaned by a rank's
 * exit, re-parented to ctlaunch as their subreaper, from any process group.
 * Found in /proc (the kernel keeps no list a program can read otherwise).
 * Returns how many pids it put in pids[cap]; more are found next round. */
static size_t find_orphans(const rank *ranks, int np, pid_t *pids, size_t cap) {
    DIR *proc = opendir("/proc");
    if (!proc)
        return 0;
    pid_t self = getpid();
    size_t n = 0;
    struct dirent *e;
    while (n < cap && (e = readdir(proc))) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        char path[300], stat[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t len = fd < 0 ? -1 : read(fd, stat, sizeof stat - 1);
        if (fd >= 0)
            close(fd);
        if (len <= 0)
            continue;
        stat[len] = 0;
        /* "pid (comm) state ppid ...": comm may hold spaces and parentheses. */
        const char *paren = strrchr(stat, ')');
        char state;
        long ppid;
        if (!paren || sscanf(paren + 1, " %c %ld", &state, &ppid) != 2 || ppid != self)
            continue;
        pid_t pid = (pid_t)atol(e->d_name);
        bool is_rank = false;
        for (int r = 0; r < np; r++)
            is_rank |= ranks[r].pid == pid;
        if (!is_rank)
            pids[n++] = pid;
    }
    closedir(proc);
    return n;
}

/* Passes on what the generation's streams still hold and closes them:
 * once stop_leftovers has run, nothing holds a pipe open, so each ends
 * within a pipe's capacity (the bound is for a pipe that still does not). */
static void close_streams(const options *o, rank *ranks) {
    for (int r = 0; r < o->np; r++)
        for (int e = 0; e < 2; e++) {
            stream *s = e ? &ranks[r].err : &ranks[r].out;
            for (int i = 0; i < 64 && s->fd >= 0; i++)
                drain(o, ranks, r, e);
            if (s->fd >= 0) {
                close(s->fd);
                s->fd = -1;
            }
        }
}

/* Stops every process the generation left behind: what remains of each
 * rank's process group and the orphans re-parented to ctlaunch. SIGTERM
 * (unless the supervisor sent it already, when kill_at is when SIGKILL is
 * due), SIGKILL after the grace period, until kill() finds no group
 * (ESRCH) and no orphan is left, or KILL_WAIT_S after the SIGKILL. */
static void stop_leftovers(const options *o, rank *ranks, double kill_at) {
    pid_t orphans[256], termed_orphans[256];
    size_t ntermed = 0;
    bool termed = kill_at > 0, killed = false;
    double give_up = 0;
    for (;;) {
        reap_all(ranks, o->np);
        size_t norphans = find_orphans(ranks, o->np, orphans, sizeof orphans / sizeof *orphans);
        int groups = signal_all(ranks, o->np, 0);
        if (groups == 0 && norphans == 0)
            return;
        if (!termed) {
            signal_all(ranks, o->np, SIGTERM);
            kill_at = ct__now() + o->grace;
            termed = true;
        }
        /* Orphans get SIGTERM once each, when first seen: those in process
         * groups of their own get no group's signal. */
        for (size_t i = 0; i < norphans && !killed; i++) {
            bool seen = false;
            for (size_t j = 0; j < ntermed; j++)
                seen |= termed_orphans[j] == orphans[i];
            if (!seen && ntermed < sizeof termed_orphans / sizeof *termed_orphans) {
                termed_orphans[ntermed++] = orphans[i];
                kill(orphans[i], SIGTERM);
            }
        }
        if (ct__now() >= kill_at) {
            signal_all(ranks, o->np, SIGKILL);
            for (size_t i = 0; i < norphans; i++)
                kill(orphans[i], SIGKILL);
            if (!killed)
                give_up = ct__now() + KILL_WAIT_S;
            killed = true;
        }
        if (killed && ct__now() >= give_up) {
            fprintf(stderr,
                    "ctlaunch: %d process group%s and %zu other process%s of the job did not end "
                    "%d s after SIGKILL; giving up on them\n",
                    groups, groups == 1 ? "" : "s", norphans, norphans == 1 ? "" : "es",
                    KILL_WAIT_S);
            return;
        }
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
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
    size_t n = ct__tail_size(&k->tail);
    if (n > 0)
        fprintf(stderr, "ctlaunch: the last %zu line%s of rank %ld's stderr:\n", n,
                n > 1 ? "s" : "", global);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "    %s\n", ct__tail_line(&k->tail, i));
}

/* How a generation of the group ended. */
typedef struct outcome {
    enum { ENDED_OK, ENDED_FAILED, ENDED_HUNG, ENDED_SIGNAL, ENDED_REFORM } how;
    int rank;       /* ENDED_FAILED: the local rank that failed first */
    int signal;     /* ENDED_SIGNAL: the signal that stopped it */
    double kill_at; /* when SIGTERM was sent, when SIGKILL is due; else 0 */
} outcome;

/* Runs one generation of the group to the end; el (NULL on one node)
 * may end it early, when the job re-forms. */
static outcome supervise(const options *o, rank *ranks, watcher *watch, ctl_elastic *el) {
    int np = o->np, first = -1, stop_signal = 0, alive = np;
    bool hung = false, reform = false;
    double kill_at = 0;  /* when SIGKILL follows SIGTERM; 0: not stopping */
    double drain_by = 0; /* after the last exit, how long output may still come */
    struct pollfd *fds = calloc((size_t)(2 * np + 1), sizeof *fds);
    if (!fds) {
        perror("ctlaunch");
        signal_all(ranks, np, SIGKILL);
        return (outcome){.how = ENDED_SIGNAL, .signal = SIGKILL, .kill_at = ct__now()};
    }
    double pruned = ct__now(); /* when empty process groups were last forgotten */
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
            drain_by = ct__now() + 1;
        if (alive == 0 && (open_streams == 0 || ct__now() >= drain_by))
            break;
        int timeout = kill_at > 0 ? (int)((kill_at - ct__now()) * 1000) + 1 : el ? 250 : 1000;
        poll(fds, (nfds_t)n, timeout < 0 ? 0 : timeout);
        for (int r = 0; r < np; r++) {
            if (fds[1 + 2 * r].revents)
                drain(o, ranks, r, false);
            if (fds[2 + 2 * r].revents)
                drain(o, ranks, r, true);
        }
        unsigned char sigs[64];
        ssize_t got = read(signal_pipe[0], sigs, sizeof sigs);
        for (ssize_t i = 0; i < got; i++) {
            if (sigs[i] == HANG_WAKEUP) {
                char *hang = watcher_take_report(watch);
                if (hang && first < 0 && !stop_signal && !hung && !reform) {
                    fputs(hang, stderr);
                    hung = true;
                    signal_all(ranks, np, SIGTERM);
                    kill_at = ct__now() + o->grace;
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
                    kill_at = ct__now() + o->grace;
            }
        }
        int status;
        pid_t pid;
        bool reaped = false;
        /* Orphans re-parented to ctlaunch are reaped here too. */
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            reaped = true;
            for (int r = 0; r < np; r++) {
                if (ranks[r].pid != pid)
                    continue;
                ranks[r].pid = 0;
                ranks[r].status = status;
                ranks[r].exited = true;
                alive--;
                watcher_rank_exited(watch, r);
                if (failed(status) && first < 0 && !stop_signal && !hung && !reform) {
                    first = r;
                    signal_all(ranks, np, SIGTERM);
                    kill_at = ct__now() + o->grace;
                }
            }
        }
        if (el && alive > 0 && first < 0 && !stop_signal && !hung && !reform &&
            ctl_elastic_should_stop(el)) {
            reform = true;
            fprintf(stderr, "ctlaunch: the job re-forms; stopping this node's ranks\n");
            signal_all(ranks, np, SIGTERM);
            kill_at = ct__now() + o->grace;
        }
        if (reaped || ct__now() - pruned >= 1) {
            signal_all(ranks, np, 0);
            pruned = ct__now();
        }
        if (kill_at > 0 && ct__now() >= kill_at && alive > 0) {
            signal_all(ranks, np, SIGKILL);
            kill_at = ct__now() + 3600;
        }
    }
    free(fds);
    /* SIGKILL may already have been sent (kill_at pushed an hour on);
     * stop_leftovers then sends it again at once. */
    double due = kill_at > ct__now() + 3000 ? ct__now() : kill_at;
    if (stop_signal)
        return (outcome){.how = ENDED_SIGNAL, .signal = stop_signal, .kill_at = due};
    if (hung)
        return (outcome){.how = ENDED_HUNG, .kill_at = due};
    if (reform)
        return (outcome){.how = ENDED_REFORM, .kill_at = due};
    return first >= 0 ? (outcome){.how = ENDED_FAILED, .rank = first, .kill_at = due}
                      : (outcome){.how = ENDED_OK};
}

/* The job's secret: from --secret-file or CT_SECRET_FILE (every node reads
 * the same file), else CT_JOB_SECRET when an outer launcher set one, else a
 * new random one, which only this node's ranks learn. The ranks get it in
 * the environment, never on a command line, where ps would show it. */
static int setup_secret(const options *o) {
    char secret[CT_SECRET_MAX + 1];
    const char *file = o->secret_file ? o->secret_file : getenv("CT_SECRET_FILE");
    const char *given = getenv("CT_JOB_SECRET");
    if (!file && !given && o->nnodes > 1) {
        fprintf(stderr,
                "ctlaunch: --nnodes %d: every node needs the same secret; pass --secret-file F "
                "(a file of mode 600, the same on every node)\n",
                o->nnodes);
        return 1;
    }
    bool inherited = !file && given;
    int rc = file        ? ct_secret_read_file(file, secret)
             : inherited ? ct_secret_set(given)
                         : ct_secret_generate(secret);
    if (!rc && !inherited)
        rc = ct_secret_set(secret);
    if (!rc && !inherited && setenv("CT_JOB_SECRET", secret, 1)) {
        perror("ctlaunch: setenv");
        rc = 1;
    }
    memset(secret, 0, sizeof secret);
    if (rc < 0)
        fprintf(stderr, "ctlaunch: the job's secret: %s\n", ct_errmsg());
    return rc;
}

/* ------------------------------------------------------ store placement */

/* Whether addr (network order) is an address of one of this machine's
 * interfaces; with name, the interface must be that one. */
static bool local_ipv4(struct in_addr *addr, const char *name) {
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs))
        return false;
    bool found = false;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        struct in_addr a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
        if (name ? !strcmp(i->ifa_name, name) : a.s_addr == addr->s_addr) {
            *addr = a;
            found = true;
        }
    }
    freeifaddrs(ifs);
    return found;
}

/* Decides where node 0 hosts the store (listen, an address ct_store_server_new
 * takes) and where this node's ranks reach it (o->store_addr). Nothing
 * listens on every interface unless --bind '*' asks: a store others can
 * reach is a store others can write. Returns 0, or 1 after a message. */
/* --master's host as one of this machine's addresses, into *a; 1 after a
 * message when it resolves to none of them. */
static int master_address(const options *o, struct in_addr *a) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(o->master_host, NULL, &hints, &res);
    if (rc) {
        fprintf(stderr,
                "ctlaunch: cannot resolve --master's host '%s': %s; pass --bind ADDR, the address "
                "of this machine that the other nodes reach\n",
                o->master_host, gai_strerror(rc));
        return 1;
    }
    bool found = false;
    char first[INET_ADDRSTRLEN] = "";
    for (struct addrinfo *i = res; i && !found; i = i->ai_next) {
        *a = ((struct sockaddr_in *)i->ai_addr)->sin_addr;
        if (!first[0])
            inet_ntop(AF_INET, a, first, sizeof first);
        found = local_ipv4(a, NULL);
    }
    freeaddrinfo(res);
    if (found)
        return 0;
    char what[600];
    if (strcmp(first, o->master_host))
        snprintf(what, sizeof what, "%s resolves to %s, which", o->master_host, first);
    else
        snprintf(what, sizeof what, "%s", first);
    fprintf(stderr,
            "ctlaunch: --master %s:%d: %s is not an address of this machine, and node 0 hosts the "
            "store there; run node 0 on that host, or pass --bind ADDR with the address or "
            "interface of this machine that the other nodes reach\n",
            o->master_host, o->master_port, what);
    return 1;
}

static int place_store(options *o, char bind_at[static INET_ADDRSTRLEN]) {
    if (!o->hosts_store) {
        o->store_addr = strdup(o->master_host);
        return o->store_addr ? 0 : (perror("ctlaunch"), 1);
    }
    struct in_addr a;
    bool everywhere = o->bind && !strcmp(o->bind, "*");
    if (everywhere || (!o->bind && o->nnodes == 1)) {
        /* Every rank is on this machine, or '*' was asked for: the ranks
         * reach the store on loopback. */
        inet_pton(AF_INET, "127.0.0.1", &a);
    } else if (o->bind) {
        if (inet_pton(AF_INET, o->bind, &a) != 1 && !local_ipv4(&a, o->bind)) {
            fprintf(stderr,
                    "ctlaunch: --bind %s is neither an IPv4 address nor an interface of this "
                    "machine with one\n",
                    o->bind);
            return 1;
        }
    } else if (master_address(o, &a)) {
        return 1;
    }
    char reach[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a, reach, sizeof reach);
    snprintf(bind_at, INET_ADDRSTRLEN, "%s", everywhere ? "*" : reach);
    o->store_addr = strdup(reach);
    return o->store_addr ? 0 : (perror("ctlaunch"), 1);
}

int main(int argc, char **argv) {
    options o;
    parse(argc, argv, &o);
    /* Orphans of the ranks become ctlaunch's children, so that they can
     * be found and stopped with the job. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1))
        fprintf(stderr,
                "ctlaunch: warning: cannot become a subreaper (%s); a rank's orphaned "
                "children in process groups of their own may outlive the job\n",
                strerror(errno));
    logfile *logs = open_logs(&o);
    char bind_at[INET_ADDRSTRLEN];
    if ((o.log_dir && !logs) || place_store(&o, bind_at)) {
        close_logs(logs, o.np);
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

    if (setup_secret(&o))
        return 1;
    /* Node 0 hosts the store the ranks meet through; it outlives restarts.
     * Without --master it binds a free port, published to the ranks. */
    ct_store_server *store = NULL;
    if (o.hosts_store) {
        store = ct_store_server_new(bind_at, o.master_port);
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
    /* Ranks a failed spawn did not reach have no streams. */
    for (int r = 0; r < o.np; r++)
        ranks[r].out.fd = ranks[r].err.fd = -1;
    watcher watch;
    if (watcher_start(&watch, &o)) {
        watcher_free(&watch);
        free(ranks);
        ct_store_server_free(store);
        return 1;
    }
    /* The rounds of a job of several nodes give each generation its number
     * and this node's place; a job of one node counts restarts. */
    ctl_elastic el = {.min_nodes = o.min_nodes,
                      .max_nodes = o.max_nodes,
                      .np = o.np,
                      .host = o.hosts_store,
                      .fixed = !elastic(&o),
                      .given_rank = o.node_rank,
                      .last_call = o.last_call,
                      .join_timeout = o.join_timeout,
                      .max_restarts = o.max_restarts};
    ctl_elastic *rounds = o.max_nodes > 1 ? &el : NULL;
    bool started = !rounds || !ctl_elastic_start(&el, o.store_addr, o.master_port);
    int code = started ? 0 : 1;
    char reason[16] = "start";
    for (int restart = 0; started; restart++) {
        int generation = restart;
        if (rounds) {
            if (ctl_elastic_join(&el, reason, &code))
                break;
            code = 0;
            o.node_rank = el.node_rank;
            o.nnodes = el.nnodes;
            generation = el.round;
        }
        watcher_watch(&watch, generation);
        if (spawn(&o, ranks, logs, generation)) {
            signal_all(ranks, o.np, SIGKILL);
            stop_leftovers(&o, ranks, ct__now());
            close_streams(&o, ranks);
            code = 1;
            if (rounds)
                ctl_elastic_end(&el, code);
            break;
        }
        outcome end = supervise(&o, ranks, &watch, rounds);
        watcher_watch(&watch, -1);
        stop_leftovers(&o, ranks, end.kill_at);
        close_streams(&o, ranks);
        if (end.how == ENDED_OK || end.how == ENDED_SIGNAL) {
            code = end.how == ENDED_SIGNAL ? 128 + end.signal : 0;
            if (rounds)
                ctl_elastic_end(&el, code);
            break;
        }
        if (end.how == ENDED_FAILED)
            report(&o, ranks, end.rank);
        int fail_code = end.how == ENDED_HUNG     ? HANG_EXIT_CODE
                        : end.how == ENDED_FAILED ? exit_code(ranks[end.rank].status)
                                                  : 0;
        if (rounds) {
            if (ctl_elastic_next(&el, end.how != ENDED_REFORM, fail_code, reason, &code))
                break;
            continue;
        }
        if (restart >= o.max_restarts) {
            code = fail_code;
            break;
        }
        fprintf(stderr, "ctlaunch: restarting the group (%d of %d restarts)\n", restart + 1,
                o.max_restarts);
    }
    ctl_elastic_free(&el);
    watcher_free(&watch);
    free(ranks);
    free(o.show);
    free(o.master_host);
    free(o.store_addr);
    close_logs(logs, o.np);
    ct_store_server_free(store);
    return code;
}
