/* ctlaunch, run for real: variables, output, the first failure, stopping
 * the other ranks, signals, restarts, logs, ct_dist_init under ctlaunch,
 * hang detection, supervision that loses no process (a flooding rank, a
 * rank's children, ctlaunch killed), the log directory's checks, the
 * store's bind address, and bad flags. Each run has a deadline, and every
 * rank is checked to be gone afterwards. */
#include "ct_test.h"

#include "tail.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

typedef struct result {
    int status; /* waitpid's; -1 if it timed out */
    char out[16384], err[16384];
    double seconds;
} result;

static void slurp(int fd, char *buf, size_t cap) {
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, buf, cap - 1);
    buf[n > 0 ? n : 0] = 0;
    close(fd);
}

/* How run_full runs ctlaunch. */
typedef struct run_how {
    double timeout; /* kill it (and fail) past this many seconds */
    int sig;        /* 0, or a signal to send it ... */
    int ready;      /* ... once its stdout holds this many "ready" */
    double after;   /* ... and this many seconds have passed */
    bool no_stdout; /* its stdout goes to /dev/null (sig then needs ready 0) */
    /* ... and, when not NULL, this file is not empty (the ranks write it
     * once started, after ctlaunch installed its handlers) */
    const char *ready_file;
} run_how;

/* CTLAUNCH_PATH and args (NULL-terminated, up to 62) into argv[64]. */
static void ctlaunch_argv(const char *argv[64], const char *const *args) {
    argv[0] = CTLAUNCH_PATH;
    int n = 1;
    for (; args[n - 1] && n < 63; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
}

static void run_full(result *r, const char *const *args, const run_how *how) {
    char out_path[] = "/tmp/ct_launch_out_XXXXXX", err_path[] = "/tmp/ct_launch_err_XXXXXX";
    int out = how->no_stdout ? open("/dev/null", O_RDWR) : mkstemp(out_path),
        err = mkstemp(err_path);
    if (!how->no_stdout)
        unlink(out_path);
    unlink(err_path);
    const char *argv[64];
    ctlaunch_argv(argv, args);
    double t0 = tt_now();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out, STDOUT_FILENO);
        dup2(err, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(126);
    }
    bool signalled = false;
    r->status = -1;
    while (tt_now() - t0 < how->timeout) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r->status = st;
            break;
        }
        if (how->sig && !signalled) {
            char buf[16384];
            ssize_t got = how->no_stdout ? 0 : pread(out, buf, sizeof buf - 1, 0);
            buf[got > 0 ? got : 0] = 0;
            int seen = 0;
            for (char *p = buf; (p = strstr(p, "ready")); p++)
                seen++;
            struct stat ready;
            bool file_ready =
                !how->ready_file || (stat(how->ready_file, &ready) == 0 && ready.st_size > 0);
            if (seen >= how->ready && file_ready && tt_now() - t0 >= how->after) {
                kill(pid, how->sig);
                signalled = true;
            }
        }
        usleep(10000);
    }
    if (r->status == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    r->seconds = tt_now() - t0;
    slurp(out, r->out, sizeof r->out);
    slurp(err, r->err, sizeof r->err);
}

static void run(result *r, const char *const *args, double timeout) {
    run_full(r, args, &(run_how){.timeout = timeout});
}

/* Whether pid has ended: it is gone, or a zombie that its new parent (the
 * nearest subreaper, once ctlaunch is gone) has yet to reap. */
static bool pid_ended(pid_t pid) {
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return true;
    ssize_t n = read(fd, stat, sizeof stat - 1);
    close(fd);
    stat[n > 0 ? n : 0] = 0;
    const char *paren = strrchr(stat, ')');
    return !paren || paren[1] == 0 || paren[2] == 'Z' || paren[2] == 'X';
}

/* Every pid=N in text is gone, allowing up to two seconds for signals to
 * land and the kernel to reap. */
static bool no_rank_left(const char *text) {
    double deadline = tt_now() + 2;
    for (const char *p = text; (p = strstr(p, "pid=")); p += 4) {
        pid_t pid = (pid_t)atol(p + 4);
        while (!pid_ended(pid) && tt_now() < deadline)
            usleep(10000);
        if (!pid_ended(pid)) {
            fprintf(stderr, "pid %ld outlived its job\n", (long)pid);
            kill(pid, SIGKILL);
            return false;
        }
    }
    return true;
}

/* The file's text (NUL-terminated, cut to cap - 1 bytes); "" if absent. */
static const char *read_text(const char *path, char *buf, size_t cap) {
    buf[0] = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return buf;
    ssize_t n = read(fd, buf, cap - 1);
    buf[n > 0 ? n : 0] = 0;
    close(fd);
    return buf;
}

/* A TCP port that was free on 127.0.0.1 a moment ago. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int code_of(const result *r) {
    if (r->status == -1)
        return -1;
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : 1000 + WTERMSIG(r->status);
}

TEST(every_rank_gets_its_variables_and_prefixed_output) {
    static result r;
    run(&r, (const char *[]){"-np", "3", RANK_PATH, "env", NULL}, 20);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "[rank 0] rank=0 world=3 local=0 local_world=3 master=127.0.0.1:");
    ASSERT_STR_CONTAINS(r.out, "restart=0 threads=");
    ASSERT_STR_CONTAINS(r.out, "[rank 2] rank=2 world=3 local=2");
    ASSERT_TRUE(!strstr(r.out, "threads=(unset)"));
    /* Node 1 of 2: global ranks continue where node 0's end, and the store
     * is node 0's. (A job across nodes needs a secret they share.) */
    setenv("CT_JOB_SECRET", "test-launcher-shared-secret", 1);
    run(&r,
        (const char *[]){"-np", "2", "--nnodes", "2", "--node-rank", "1", "--master",
                         "10.0.0.7:4242", RANK_PATH, "env", NULL},
        20);
    unsetenv("CT_JOB_SECRET");
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.out,
                        "[rank 3] rank=3 world=4 local=1 local_world=2 master=10.0.0.7:4242");
}

TEST(ranks_meet_through_the_store_ctlaunch_hosts) {
    static result r, other;
    run(&r, (const char *[]){"-np", "3", RANK_PATH, "store", NULL}, 30);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "[rank 2] met 3 ranks at 127.0.0.1:");
    /* A second job gets a store of its own on another port. */
    run(&other, (const char *[]){"-np", "2", RANK_PATH, "store", NULL}, 30);
    ASSERT_EQ(code_of(&other), 0);
    const char *x = strstr(r.out, "127.0.0.1:"), *y = strstr(other.out, "127.0.0.1:");
    ASSERT_TRUE(x && y && atoi(x + 10) != atoi(y + 10));
}

TEST(the_first_failure_stops_the_others_and_sets_the_exit_code) {
    static result r;
    run(&r, (const char *[]){"-np", "4", "--grace", "2", RANK_PATH, "fail", "2", "3", NULL}, 20);
    ASSERT_EQ(code_of(&r), 3);
    ASSERT_STR_CONTAINS(r.err, "rank 2 failed first: it exited with code 3");
    ASSERT_STR_CONTAINS(r.err, "something went wrong");
    ASSERT_TRUE(r.seconds < 10);
    ASSERT_TRUE(no_rank_left(r.out));
}

TEST(a_rank_killed_by_a_signal_is_reported) {
    static result r;
    run(&r, (const char *[]){"-np", "2", RANK_PATH, "kill", "1", NULL}, 20);
    ASSERT_EQ(code_of(&r), 128 + SIGKILL);
    ASSERT_STR_CONTAINS(r.err, "rank 1 failed first: it was killed by signal 9");
    ASSERT_TRUE(no_rank_left(r.out));
}

TEST(sigterm_is_forwarded_and_ranks_that_ignore_it_are_killed) {
    static result r;
    run_full(&r, (const char *[]){"-np", "3", RANK_PATH, "wait", NULL},
             &(run_how){.timeout = 20, .sig = SIGTERM, .ready = 3});
    ASSERT_EQ(code_of(&r), 128 + SIGTERM);
    ASSERT_STR_CONTAINS(r.err, "stopping the ranks");
    ASSERT_TRUE(no_rank_left(r.out));
    /* Ranks that ignore SIGTERM get SIGKILL after the grace period. */
    run_full(&r, (const char *[]){"-np", "2", "--grace", "0.5", RANK_PATH, "stubborn", NULL},
             &(run_how){.timeout = 20, .sig = SIGTERM, .ready = 2});
    ASSERT_EQ(code_of(&r), 128 + SIGTERM);
    ASSERT_TRUE(r.seconds >= 0.5 && r.seconds < 10);
    ASSERT_TRUE(no_rank_left(r.out));
}

TEST(max_restarts_restarts_the_group) {
    static result r;
    run(&r, (const char *[]){"-np", "2", "--max-restarts", "1", RANK_PATH, "restart", NULL}, 20);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.err, "restarting the group (1 of 1 restarts)");
    ASSERT_STR_CONTAINS(r.out, "[rank 1] ok restart=1");
    run(&r, (const char *[]){"-np", "2", RANK_PATH, "restart", NULL}, 20);
    ASSERT_EQ(code_of(&r), 1);
}

TEST(ranks_filter_the_console_and_log_dir_keeps_everything) {
    static result r;
    char dir[] = "/tmp/ct_launch_logs_XXXXXX";
    ASSERT_TRUE(mkdtemp(dir));
    run(&r, (const char *[]){"-np", "3", "--ranks", "1", "--log-dir", dir, RANK_PATH, "env", NULL},
        20);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "[rank 1] rank=1");
    ASSERT_TRUE(!strstr(r.out, "[rank 0]") && !strstr(r.out, "[rank 2]"));
    char path[256], text[1024] = {0};
    snprintf(path, sizeof path, "%s/rank.2.out", dir);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    ASSERT_STR_CONTAINS(text, "rank=2 world=3");
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/rank.%d.out", dir, i);
        unlink(path);
        snprintf(path, sizeof path, "%s/rank.%d.err", dir, i);
        unlink(path);
    }
    rmdir(dir);
}

TEST(ranks_join_with_ct_dist_init) {
    static result r;
    run(&r, (const char *[]){"-np", "3", RANK_PATH, "dist", NULL}, 30);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "[rank 0] dist rank=0 size=3 local=0/3 backend=shm sum=6 group=0 "
                               "group_sum=2");
    ASSERT_STR_CONTAINS(r.out, "[rank 1] dist rank=1 size=3 local=1/3 backend=shm sum=6 group=-1");
    ASSERT_STR_CONTAINS(r.out, "[rank 2] dist rank=2 size=3 local=2/3 backend=shm sum=6 group=1 "
                               "group_sum=2");
    /* A restarted group meets again, under keys of its own restart. */
    run(&r, (const char *[]){"-np", "2", "--max-restarts", "1", RANK_PATH, "dist", "restart", NULL},
        30);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.err, "restarting the group (1 of 1 restarts)");
    ASSERT_STR_CONTAINS(r.out, "[rank 1] dist rank=1 size=2");
}

TEST(hang_timeout_stops_ranks_that_make_no_progress) {
    static result r;
    /* Rank 0 waits in a barrier that rank 1 never reaches; the barrier's
     * own timeout is far away, so only the hang detection can end it. */
    setenv("CT_TIMEOUT", "60", 1);
    run(&r,
        (const char *[]){"-np", "2", "--hang-timeout", "2", "--grace", "1", RANK_PATH, "hang",
                         NULL},
        30);
    unsetenv("CT_TIMEOUT");
    ASSERT_EQ(code_of(&r), 124);
    ASSERT_STR_CONTAINS(r.err, "ctlaunch: hang: no progress for 2.");
    ASSERT_STR_CONTAINS(r.err, " s on ranks 0, 1 (--hang-timeout 2)");
    ASSERT_STR_CONTAINS(r.err, "rank 0 (hung): progress 0, unchanged for ");
    ASSERT_STR_CONTAINS(r.err, "waiting in barrier #1");
    ASSERT_STR_CONTAINS(r.err, "rank 1 (hung): progress 0, unchanged for ");
    ASSERT_STR_CONTAINS(r.err, "in no collective");
    /* Found within a second or two of the timeout, then stopped. */
    ASSERT_TRUE(r.seconds >= 2 && r.seconds < 7);
    ASSERT_TRUE(no_rank_left(r.out));
}

/* An outsider on the store's port, without the job's secret or with a
 * wrong one, sets every rank's heartbeat key with growing progress, as a
 * rank would; port is the store's. Runs until killed. */
static void forge_heartbeats(int port) {
    void *ctx = zmq_ctx_new();
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    for (uint64_t id = 1;; id++) {
        void *s = zmq_socket(ctx, ZMQ_DEALER);
        int zero = 0;
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
        if (id % 2) {
            zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, "x", 1);
            zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, "not-the-jobs-secret", 19);
        }
        zmq_connect(s, endpoint);
        for (int rank = 0; rank < 2; rank++) {
            /* The store's wire format (docs/store.md): magic, op 2 (set), id. */
            unsigned char h[20] = {'C', 'T', 'S', '1', 2};
            for (int i = 0; i < 8; i++)
                h[8 + i] = (unsigned char)((id * 2 + (uint64_t)rank) >> (8 * i));
            char key[32], value[32];
            snprintf(key, sizeof key, "ct/hb/0/%d", rank);
            int n = snprintf(value, sizeof value, "%llu -", (unsigned long long)id);
            zmq_send(s, h, sizeof h, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(s, key, strlen(key), ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(s, value, (size_t)n, ZMQ_DONTWAIT);
        }
        usleep(200000);
        zmq_close(s);
    }
}

TEST(forged_heartbeats_from_outsiders_do_not_hide_a_hang) {
    static result r;
    int port = free_port();
    ASSERT_TRUE(port > 0);
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    pid_t forger = fork();
    if (forger == 0) {
        forge_heartbeats(port);
        _exit(0);
    }
    setenv("CT_TIMEOUT", "60", 1);
    run(&r,
        (const char *[]){"-np", "2", "--master", master, "--hang-timeout", "2", "--grace", "1",
                         RANK_PATH, "hang", NULL},
        15);
    unsetenv("CT_TIMEOUT");
    kill(forger, SIGKILL);
    waitpid(forger, NULL, 0);
    ASSERT_EQ(code_of(&r), 124);
    ASSERT_STR_CONTAINS(r.err, "ctlaunch: hang: no progress for 2.");
    ASSERT_STR_CONTAINS(r.err, "refused a connection from 127.0.0.1");
    ASSERT_TRUE(r.seconds < 8);
    ASSERT_TRUE(no_rank_left(r.out));
}

TEST(hang_timeout_spares_ranks_that_make_progress_or_send_no_heartbeats) {
    static result r;
    /* ct_dist_heartbeat() for 3 s without a collective is progress. */
    run(&r, (const char *[]){"-np", "2", "--hang-timeout", "1.5", RANK_PATH, "beat", "3", NULL},
        30);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "[rank 1] beat done");
    ASSERT_TRUE(!strstr(r.err, "hang"));
    /* A program that never calls ct_dist_init is never reported. */
    run(&r, (const char *[]){"-np", "2", "--hang-timeout", "1", RANK_PATH, "sleep", "2.5", NULL},
        30);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_TRUE(!strstr(r.err, "hang"));
}

TEST(a_rank_flooding_its_output_does_not_stall_the_supervisor) {
    static result r;
    char pidfile[256], pids[64];
    tt_tmp_path(pidfile, "flood.pid");
    /* Rank 0 writes lines faster than ctlaunch forwards them (to
     * /dev/null, so the test writes no large files); rank 1 fails after
     * 0.3 s. ctlaunch must still reap rank 1, stop rank 0 and exit. */
    run_full(
        &r,
        (const char *[]){"-np", "2", "--grace", "1", RANK_PATH, "flood", pidfile, "1", "3", NULL},
        &(run_how){.timeout = 15, .no_stdout = true});
    ASSERT_EQ(code_of(&r), 3);
    ASSERT_STR_CONTAINS(r.err, "rank 1 failed first: it exited with code 3");
    ASSERT_STR_CONTAINS(r.err, "failing beside a flood");
    ASSERT_TRUE(r.seconds < 3);
    ASSERT_TRUE(no_rank_left(read_text(pidfile, pids, sizeof pids)));
    /* A signal is still forwarded promptly: SIGTERM once the flood runs. */
    unlink(pidfile);
    run_full(
        &r, (const char *[]){"-np", "2", RANK_PATH, "flood", pidfile, NULL},
        &(run_how){
            .timeout = 15, .sig = SIGTERM, .after = 0.5, .no_stdout = true, .ready_file = pidfile});
    ASSERT_EQ(code_of(&r), 128 + SIGTERM);
    ASSERT_TRUE(r.seconds < 4.5);
    ASSERT_TRUE(no_rank_left(read_text(pidfile, pids, sizeof pids)));
}

TEST(a_ranks_children_do_not_outlive_the_job) {
    static result r;
    /* The rank exits 0 and leaves a child in its process group. */
    run(&r, (const char *[]){"-np", "2", RANK_PATH, "orphan", "group", NULL}, 15);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_TRUE(r.seconds < 4);
    ASSERT_TRUE(no_rank_left(r.out));
    /* A child that ignores SIGTERM gets SIGKILL after the grace period. */
    run(&r, (const char *[]){"-np", "1", "--grace", "0.5", RANK_PATH, "orphan", "stubborn", NULL},
        15);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_TRUE(r.seconds >= 0.5 && r.seconds < 4);
    ASSERT_TRUE(no_rank_left(r.out));
    /* A child that left the group for a session of its own is re-parented
     * to ctlaunch (a subreaper), which stops it too. */
    run(&r, (const char *[]){"-np", "1", RANK_PATH, "orphan", "setsid", NULL}, 15);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_TRUE(r.seconds < 4);
    ASSERT_TRUE(no_rank_left(r.out));
}

TEST(killing_ctlaunch_with_sigkill_stops_every_rank) {
    static result r;
    run_full(&r, (const char *[]){"-np", "3", RANK_PATH, "wait", NULL},
             &(run_how){.timeout = 15, .sig = SIGKILL, .ready = 3});
    ASSERT_EQ(code_of(&r), 1000 + SIGKILL);
    ASSERT_STR_CONTAINS(r.out, "ready");
    ASSERT_TRUE(no_rank_left(r.out));
}

/* Removes dir's rank.N.{out,err} for N < np, then dir. */
static void remove_logs(const char *dir, int np) {
    char path[512];
    for (int i = 0; i < np; i++) {
        snprintf(path, sizeof path, "%s/rank.%d.out", dir, i);
        unlink(path);
        snprintf(path, sizeof path, "%s/rank.%d.err", dir, i);
        unlink(path);
    }
    rmdir(dir);
}

TEST(log_dir_appends_every_generation_under_a_header) {
    static result r;
    char dir[256], path[512], text[8192];
    tt_tmp_path(dir, "logs_restart");
    run(&r,
        (const char *[]){"-np", "2", "--max-restarts", "1", "--log-dir", dir, RANK_PATH, "restart",
                         NULL},
        20);
    ASSERT_EQ(code_of(&r), 0);
    /* ctlaunch made the directory, private to this user, and the files. */
    struct stat st;
    ASSERT_EQ(stat(dir, &st), 0);
    ASSERT_EQ(st.st_mode & 0777, 0700);
    snprintf(path, sizeof path, "%s/rank.1.err", dir);
    ASSERT_EQ(stat(path, &st), 0);
    ASSERT_EQ(st.st_mode & 0777, 0600);
    /* The failed generation's stderr, the one that says why, survives the
     * restart. */
    read_text(path, text, sizeof text);
    ASSERT_STR_CONTAINS(text, "==== ctlaunch: generation 0, rank 1, started 20");
    ASSERT_STR_CONTAINS(text, "failing on purpose on the first run");
    ASSERT_STR_CONTAINS(text, "==== ctlaunch: generation 1, rank 1, started ");
    ASSERT_TRUE(strstr(text, "generation 0") < strstr(text, "failing on purpose"));
    ASSERT_TRUE(strstr(text, "failing on purpose") < strstr(text, "generation 1"));
    snprintf(path, sizeof path, "%s/rank.1.out", dir);
    read_text(path, text, sizeof text);
    ASSERT_STR_CONTAINS(text, "==== ctlaunch: generation 1, rank 1, started ");
    ASSERT_STR_CONTAINS(text, "ok restart=1");
    /* A second job in the same directory appends. */
    run(&r, (const char *[]){"-np", "2", "--log-dir", dir, RANK_PATH, "env", NULL}, 20);
    ASSERT_EQ(code_of(&r), 0);
    read_text(path, text, sizeof text);
    ASSERT_STR_CONTAINS(text, "ok restart=1");
    ASSERT_STR_CONTAINS(text, "rank=1 world=2");
    remove_logs(dir, 2);
}

TEST(log_dir_refuses_symlinks_and_directories_others_can_write) {
    static result r;
    char dir[256], link[256], victim[256], path[512], text[256];
    tt_tmp_path(dir, "logs_checked");
    tt_tmp_path(link, "logs_link");
    tt_tmp_path(victim, "victim");
    ASSERT_EQ(mkdir(dir, 0700), 0);
    /* The directory named is a symlink. */
    ASSERT_EQ(symlink(dir, link), 0);
    run(&r, (const char *[]){"-np", "1", "--log-dir", link, RANK_PATH, "env", NULL}, 10);
    ASSERT_EQ(code_of(&r), 1);
    ASSERT_STR_CONTAINS(r.err, "--log-dir");
    ASSERT_STR_CONTAINS(r.err, "symbolic link");
    ASSERT_TRUE(!strstr(r.out, "rank=0"));
    /* A log file is a symlink to a file elsewhere: not followed, not
     * written. */
    int fd = open(victim, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(fd >= 0 && write(fd, "precious\n", 9) == 9);
    close(fd);
    snprintf(path, sizeof path, "%s/rank.0.err", dir);
    ASSERT_EQ(symlink(victim, path), 0);
    run(&r, (const char *[]){"-np", "1", "--log-dir", dir, RANK_PATH, "env", NULL}, 10);
    ASSERT_EQ(code_of(&r), 1);
    ASSERT_STR_CONTAINS(r.err, "rank.0.err");
    ASSERT_STR_CONTAINS(r.err, "symbolic link");
    ASSERT_TRUE(!strcmp(read_text(victim, text, sizeof text), "precious\n"));
    unlink(path);
    /* A FIFO in place of a log file is refused, not waited on. */
    ASSERT_EQ(mkfifo(path, 0600), 0);
    run(&r, (const char *[]){"-np", "1", "--log-dir", dir, RANK_PATH, "env", NULL}, 10);
    ASSERT_EQ(code_of(&r), 1);
    ASSERT_STR_CONTAINS(r.err, "not a regular file");
    unlink(path);
    /* A directory others can write to. */
    ASSERT_EQ(chmod(dir, 0777), 0);
    run(&r, (const char *[]){"-np", "1", "--log-dir", dir, RANK_PATH, "env", NULL}, 10);
    ASSERT_EQ(code_of(&r), 1);
    ASSERT_STR_CONTAINS(r.err, "writable by others");
    ASSERT_EQ(chmod(dir, 0700), 0);
    /* A file where the directory should be. */
    run(&r, (const char *[]){"-np", "1", "--log-dir", victim, RANK_PATH, "env", NULL}, 10);
    ASSERT_EQ(code_of(&r), 1);
    ASSERT_STR_CONTAINS(r.err, "not a directory");
    unlink(link);
    unlink(victim);
    remove_logs(dir, 1);
}

TEST(log_fds_do_not_leak_into_ranks) {
    static result r;
    char dir[256];
    tt_tmp_path(dir, "logs_fds");
    run(&r,
        (const char *[]){"-np", "3", "--max-restarts", "1", "--log-dir", dir, RANK_PATH, "fds",
                         NULL},
        20);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "[rank 2] fds listed");
    ASSERT_TRUE(!strstr(r.out, dir));
    remove_logs(dir, 3);
}

TEST(the_stderr_tail_counts_lines_in_64_bits) {
    /* A job that writes more than 2^31 (or 2^32) lines: the ring keeps
     * the last ones in order, never indexing outside itself. */
    static ct__tail t;
    const uint64_t starts[] = {0, (uint64_t)INT_MAX - 3, (uint64_t)UINT32_MAX - 3};
    for (size_t s = 0; s < sizeof starts / sizeof *starts; s++) {
        memset(&t, 0, sizeof t);
        t.count = starts[s];
        char line[32];
        for (int i = 0; i < 30; i++) {
            snprintf(line, sizeof line, "line %d", i);
            ct__tail_push(&t, line, strlen(line));
        }
        ASSERT_EQ(ct__tail_size(&t), CT__TAIL_LINES);
        for (size_t i = 0; i < CT__TAIL_LINES; i++) {
            snprintf(line, sizeof line, "line %d", (int)(30 - CT__TAIL_LINES + i));
            ASSERT_STR_CONTAINS(ct__tail_line(&t, i), line);
        }
    }
    memset(&t, 0, sizeof t);
    ct__tail_push(&t, "only", 4);
    ASSERT_EQ(ct__tail_size(&t), 1);
    ASSERT_STR_CONTAINS(ct__tail_line(&t, 0), "only");
}

/* The address the listener on CT_MASTER_PORT has, from a "listen" rank. */
static const char *listener(const result *r) {
    const char *p = strstr(r->out, "] listen ");
    return p ? p + 9 : "(no listen line)";
}

TEST(the_store_binds_loopback_unless_the_job_spans_machines) {
    static result r;
    char master[64], port_flag[16], expected[64];
    int port = free_port();
    ASSERT_TRUE(port > 0);
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    snprintf(port_flag, sizeof port_flag, "%d", port);
    snprintf(expected, sizeof expected, "127.0.0.1:%d\n", port);
    /* One node: loopback, whatever --master or --master-port say. */
    run(&r, (const char *[]){"-np", "1", "--master", master, RANK_PATH, "listen", NULL}, 10);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(listener(&r), expected);
    run(&r, (const char *[]){"-np", "1", "--master-port", port_flag, RANK_PATH, "listen", NULL},
        10);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(listener(&r), expected);
    /* The ranks are told where the store listens, not the name given. */
    snprintf(master, sizeof master, "localhost:%d", port);
    run(&r, (const char *[]){"-np", "1", "--master", master, RANK_PATH, "listen", NULL}, 10);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(listener(&r), expected);
    char told[64];
    snprintf(told, sizeof told, "master=127.0.0.1:%d\n", port);
    ASSERT_STR_CONTAINS(r.out, told);
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    /* Several nodes: the address --master names, when it is this host's.
     * (A job across nodes needs a secret they share.) */
    setenv("CT_JOB_SECRET", "test-launcher-shared-secret", 1);
    run(&r,
        (const char *[]){"-np", "1", "--nnodes", "2", "--master", master, RANK_PATH, "listen",
                         NULL},
        10);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(listener(&r), expected);
    /* ... and a clear error when it is not (192.0.2.1 is TEST-NET-1). */
    snprintf(master, sizeof master, "192.0.2.1:%d", port);
    run(&r,
        (const char *[]){"-np", "1", "--nnodes", "2", "--master", master, RANK_PATH, "listen",
                         NULL},
        10);
    ASSERT_EQ(code_of(&r), 1);
    ASSERT_STR_CONTAINS(r.err, "192.0.2.1 is not an address of this machine");
    ASSERT_STR_CONTAINS(r.err, "--bind");
    /* --bind overrides. */
    run(&r,
        (const char *[]){"-np", "1", "--nnodes", "2", "--master", master, "--bind", "127.0.0.1",
                         RANK_PATH, "listen", NULL},
        10);
    ASSERT_EQ(code_of(&r), 0);
    unsetenv("CT_JOB_SECRET");
    ASSERT_STR_CONTAINS(listener(&r), expected);
    run(&r, (const char *[]){"--help", NULL}, 10);
    ASSERT_STR_CONTAINS(r.out, "--bind ADDR");
}

TEST(bad_usage_names_the_flag) {
    static result r;
    run(&r, (const char *[]){"--bogus", "1", RANK_PATH, NULL}, 10);
    ASSERT_EQ(code_of(&r), 2);
    ASSERT_STR_CONTAINS(r.err, "unknown option '--bogus'");
    run(&r, (const char *[]){RANK_PATH, "env", NULL}, 10);
    ASSERT_STR_CONTAINS(r.err, "-np N is required");
    run(&r, (const char *[]){"-np", "2", "--ranks", "5", RANK_PATH, "env", NULL}, 10);
    ASSERT_STR_CONTAINS(r.err, "--ranks: 5-5 is outside the 2 local ranks");
    run(&r, (const char *[]){"-np", "2", "--nnodes", "2", RANK_PATH, "env", NULL}, 10);
    ASSERT_STR_CONTAINS(r.err, "--nnodes 2 needs --master HOST:PORT");
    run(&r, (const char *[]){"-np", "0", RANK_PATH, NULL}, 10);
    ASSERT_STR_CONTAINS(r.err, "-np needs a whole number in [1, 1024], got '0'");
    run(&r, (const char *[]){"-np", "2", "--hang-timeout", "0", RANK_PATH, "env", NULL}, 10);
    ASSERT_EQ(code_of(&r), 2);
    ASSERT_STR_CONTAINS(r.err, "--hang-timeout needs seconds > 0, got '0'");
    run(&r, (const char *[]){"-np", "2", "--hang-timeout", "soon", RANK_PATH, "env", NULL}, 10);
    ASSERT_STR_CONTAINS(r.err, "--hang-timeout needs seconds > 0, got 'soon'");
    run(&r, (const char *[]){"--help", NULL}, 10);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "--max-restarts R");
    ASSERT_STR_CONTAINS(r.out, "--hang-timeout S");
    run(&r, (const char *[]){"-np", "2", "/nonexistent/program", NULL}, 10);
    ASSERT_EQ(code_of(&r), 127);
    ASSERT_STR_CONTAINS(r.err, "cannot run '/nonexistent/program'");
}

/* Starts ctlaunch with args in the background, its output discarded. */
static pid_t start_ctlaunch(const char *const *args) {
    const char *argv[64];
    ctlaunch_argv(argv, args);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(126);
    }
    return pid;
}

/* --nnodes MIN:MAX on one node (test_elastic_cluster has the job that
 * changes its members): the rounds, and what does not fit. */
TEST(an_elastic_job_forms_rounds_and_refuses_what_does_not_fit) {
    static result r;
    char master[64];
    run(&r, (const char *[]){"-np", "1", "--nnodes", "3:2", RANK_PATH, "env", NULL}, 10);
    ASSERT_EQ(code_of(&r), 2);
    ASSERT_STR_CONTAINS(r.err, "--nnodes: needs M or MIN:MAX with 1 <= MIN <= MAX");
    setenv("CT_JOB_SECRET", "test-launcher-shared-secret", 1);
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    run(&r,
        (const char *[]){"-np", "1", "--nnodes", "1:2", "--node-rank", "1", "--master", master,
                         RANK_PATH, "env", NULL},
        10);
    ASSERT_EQ(code_of(&r), 2);
    ASSERT_STR_CONTAINS(r.err, "gives out node ranks at each round");
    /* The host alone closes round 0 once --last-call has passed. */
    run(&r,
        (const char *[]){"-np", "2", "--nnodes", "1:3", "--node-rank", "0", "--master", master,
                         "--last-call", "0.3", RANK_PATH, "env", NULL},
        20);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_STR_CONTAINS(r.err, "round 0 (start): 1 node, 2 ranks: node 0 (");
    ASSERT_STR_CONTAINS(r.out, "[rank 1] rank=1 world=2 local=1 local_world=2");
    ASSERT_STR_CONTAINS(r.out, "restart=0");
    /* Fewer nodes than MIN within --join-timeout. */
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    run(&r,
        (const char *[]){"-np", "1", "--nnodes", "2:3", "--node-rank", "0", "--master", master,
                         "--join-timeout", "0.5", RANK_PATH, "env", NULL},
        20);
    ASSERT_EQ(code_of(&r), 1);
    ASSERT_STR_CONTAINS(r.err,
                        "round 0: 1 of the --nnodes minimum 2 nodes joined within --join-timeout "
                        "0.5 s; giving up");
    /* A node with another -np than the host's is refused. */
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    pid_t host = start_ctlaunch((const char *[]){"-np", "2", "--nnodes", "2:3", "--node-rank", "0",
                                                 "--master", master, "--join-timeout", "10",
                                                 RANK_PATH, "env", NULL});
    run(&r,
        (const char *[]){"-np", "1", "--nnodes", "2:3", "--master", master, RANK_PATH, "env", NULL},
        20);
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    unsetenv("CT_JOB_SECRET");
    ASSERT_EQ(code_of(&r), 1);
    ASSERT_STR_CONTAINS(r.err, "this node runs -np 1 ranks, and the job's host 2 per node");
}

/* A fixed job of two nodes restarts together: node 1's rank fails before
 * ct_dist_init, node 0's rank, waiting there for it (CT_TIMEOUT is far
 * off), is stopped at once, and both meet again in round 1 (node 0's
 * --max-restarts counts). Nodes that restart alone would leave node 0
 * waiting out the timeout. */
TEST(a_job_of_two_nodes_restarts_together) {
    static result r;
    char master[64];
    /* Both nodes are here: gloo may bind loopback. */
    setenv("CT_JOB_SECRET", "test-launcher-shared-secret", 1);
    setenv("CT_BIND_ADDR", "127.0.0.1", 1);
    setenv("CT_TIMEOUT", "100", 1);
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    char out_path[] = "/tmp/ct_launch_node1_XXXXXX";
    int out = mkstemp(out_path);
    pid_t node1 = fork();
    if (node1 == 0) {
        dup2(out, STDOUT_FILENO);
        dup2(out, STDERR_FILENO);
        execl(CTLAUNCH_PATH, CTLAUNCH_PATH, "-np", "1", "--nnodes", "2", "--node-rank", "1",
              "--master", master, RANK_PATH, "dist", "early", (char *)NULL);
        _exit(126);
    }
    run(&r,
        (const char *[]){"-np", "1", "--nnodes", "2", "--node-rank", "0", "--master", master,
                         "--max-restarts", "1", RANK_PATH, "dist", "early", NULL},
        60);
    int status = -1;
    double until = tt_now() + 20;
    while (waitpid(node1, &status, WNOHANG) == 0 && tt_now() < until)
        usleep(10000);
    if (tt_now() >= until) {
        kill(node1, SIGKILL);
        waitpid(node1, &status, 0);
    }
    unsetenv("CT_TIMEOUT");
    unsetenv("CT_BIND_ADDR");
    unsetenv("CT_JOB_SECRET");
    char node1_out[8192];
    read_text(out_path, node1_out, sizeof node1_out);
    unlink(out_path);
    close(out);
    ASSERT_EQ(code_of(&r), 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_TRUE(r.seconds < 30);
    ASSERT_STR_CONTAINS(r.err,
                        "round 0 failed on node 1 (code 1); re-forming the job (restart 1 of 1)");
    ASSERT_STR_CONTAINS(r.err, "round 1 (fail): 2 nodes, 2 ranks");
    ASSERT_STR_CONTAINS(r.out, "[rank 0] dist rank=0 size=2");
    ASSERT_STR_CONTAINS(node1_out, "round 1: this is node 1 of 2");
    ASSERT_STR_CONTAINS(node1_out, "[rank 1] dist rank=1 size=2");
}
