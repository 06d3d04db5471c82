/* ctlaunch, run for real: variables, output, the first failure, stopping
 * the other ranks, signals, restarts, logs, ct_dist_init under ctlaunch,
 * hang detection, and bad flags. Each run has a deadline, and every rank is
 * checked to be gone afterwards. */
#include "ct_test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Runs ctlaunch with args; when signal_after > 0, sends it sig once its
 * stdout holds `ready` lines. Kills it (and fails) past timeout seconds. */
static void run_full(result *r, const char *const *args, double timeout, int sig, int ready) {
    char out_path[] = "/tmp/ct_launch_out_XXXXXX", err_path[] = "/tmp/ct_launch_err_XXXXXX";
    int out = mkstemp(out_path), err = mkstemp(err_path);
    unlink(out_path);
    unlink(err_path);
    const char *argv[64] = {CTLAUNCH_PATH};
    int n = 1;
    for (; args[n - 1] && n < 63; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
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
    while (tt_now() - t0 < timeout) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r->status = st;
            break;
        }
        if (sig && !signalled) {
            char buf[16384];
            ssize_t got = pread(out, buf, sizeof buf - 1, 0);
            buf[got > 0 ? got : 0] = 0;
            int seen = 0;
            for (char *p = buf; (p = strstr(p, "ready")); p++)
                seen++;
            if (seen >= ready) {
                kill(pid, sig);
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
    run_full(r, args, timeout, 0, 0);
}

/* Every pid=N the ranks printed is gone (allowing a moment for the kernel
 * to reap them). */
static bool no_rank_left(const char *out) {
    for (const char *p = out; (p = strstr(p, "pid=")); p += 4) {
        pid_t pid = (pid_t)atol(p + 4);
        int tries = 0;
        while (kill(pid, 0) == 0 && tries++ < 100)
            usleep(10000);
        if (kill(pid, 0) == 0)
            return false;
    }
    return true;
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
     * is node 0's. */
    run(&r,
        (const char *[]){"-np", "2", "--nnodes", "2", "--node-rank", "1", "--master",
                         "10.0.0.7:4242", RANK_PATH, "env", NULL},
        20);
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
    run_full(&r, (const char *[]){"-np", "3", RANK_PATH, "wait", NULL}, 20, SIGTERM, 3);
    ASSERT_EQ(code_of(&r), 128 + SIGTERM);
    ASSERT_STR_CONTAINS(r.err, "stopping the ranks");
    ASSERT_TRUE(no_rank_left(r.out));
    /* Ranks that ignore SIGTERM get SIGKILL after the grace period. */
    run_full(&r, (const char *[]){"-np", "2", "--grace", "0.5", RANK_PATH, "stubborn", NULL}, 20,
             SIGTERM, 2);
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
