/* A rank for test_launcher: behaves as its first argument says.
 *
 *   env            prints its CT_* variables and exits 0
 *   fail R CODE    rank R writes to stderr and exits with CODE; the others wait
 *   kill R         rank R dies on SIGKILL; the others wait
 *   wait           prints "ready" and waits to be stopped
 *   stubborn       ignores SIGTERM, prints "ready" and waits
 *   restart        rank 1 fails on the first run only
 *   store          meets the other ranks through ctlaunch's store
 *   dist [restart|early]
 *                  ct_dist_init, an allreduce on the world and on a group
 *                  of the even ranks, ct_dist_finalize (twice); with
 *                  "restart", rank 1 then fails on the first run only;
 *                  with "early", it fails before ct_dist_init on the first
 *                  run, so that the others wait for it there
 *   hang           ct_dist_init, prints "ready"; then rank 0 waits in a
 *                  barrier the others never reach, and they sleep
 *   beat S         ct_dist_init, then ct_dist_heartbeat() for S seconds
 *                  without a collective, then ct_dist_finalize
 *   sleep S        sleeps S seconds without ct_dist_init
 *   flood FILE [R CODE]
 *                  every rank appends "pid=<pid>" to FILE; then rank 0
 *                  writes to stdout as fast as it can, rank R fails with
 *                  CODE after 0.3 s, and the other ranks wait
 *   orphan HOW     starts a child that prints "pid=<pid>" and sleeps,
 *                  then exits 0. HOW: "group" (the child stays in the
 *                  rank's process group), "stubborn" (it also ignores
 *                  SIGTERM) or "setsid" (it leaves for a session of its own)
 *   fds            prints "fd N -> TARGET" for each open fd above 2
 *   listen         prints "listen ADDR:PORT" for the TCP listener on
 *                  CT_MASTER_PORT, from /proc/net/tcp, or "listen none";
 *                  then "master=CT_MASTER_ADDR:CT_MASTER_PORT"
 *
 * Every mode first prints "pid=<pid>", so the test can check that no rank
 * is left behind. Waiting ranks give up after 30 s. The dist modes work
 * under mpirun too. */
#define _DEFAULT_SOURCE

#include <ct/dist.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v ? v : "(unset)";
}

static int wait_a_while(void) {
    struct timespec tick = {0, 100000000};
    for (int i = 0; i < 300; i++)
        nanosleep(&tick, NULL);
    return 0;
}

static void sleep_s(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int dist_failed(const char *what) {
    fprintf(stderr, "%s: %s\n", what, ct_errmsg());
    ct_dist_finalize();
    return 1;
}

/* The sum over comm of value, through an allreduce. */
static int sum_over(ct_comm *comm, double value, double *sum) {
    ct_tensor *t = ct_from_data(&value, CT_SHAPE(1), CT_FLOAT64);
    int rc = t ? ct_comm_allreduce(comm, t, CT_REDUCE_SUM, NULL) : ct_errcode();
    if (rc == 0)
        *sum = ct_item(t);
    ct_tensor_free(t);
    return rc;
}

static int dist_mode(bool fail_first_run) {
    if (ct_dist_init(NULL))
        return dist_failed("ct_dist_init");
    const ct_world *w = ct_dist_world();
    int rank = w->rank; /* w is the library's, and finalize clears it */
    double sum = 0, group_sum = -1;
    if (sum_over(ct_dist_comm(), w->rank + 1, &sum))
        return dist_failed("allreduce");
    int evens[64], n = 0;
    for (int r = 0; r < w->size && n < 64; r += 2)
        evens[n++] = r;
    ct_comm *group = NULL;
    if (ct_dist_new_group(evens, n, &group))
        return dist_failed("ct_dist_new_group");
    if (group && sum_over(group, w->rank, &group_sum))
        return dist_failed("allreduce on the group");
    printf("dist rank=%d size=%d local=%d/%d backend=%s sum=%g group=%d group_sum=%g\n", w->rank,
           w->size, w->local_rank, w->local_size, ct_backend_name(ct_comm_backend(ct_dist_comm())),
           sum, group ? ct_comm_rank(group) : -1, group_sum);
    fflush(stdout);
    ct_comm_free(group);
    ct_dist_finalize();
    ct_dist_finalize();
    if (fail_first_run && rank == 1 && !strcmp(env("CT_RESTART_COUNT"), "0")) {
        fprintf(stderr, "failing on purpose after ct_dist_init on the first run\n");
        return 1;
    }
    return ct_dist_is_initialized();
}

static int flood_mode(int rank, int argc, char **argv) {
    char pid[32];
    int fd = open(argv[2], O_WRONLY | O_CREAT | O_APPEND, 0600);
    int len = snprintf(pid, sizeof pid, "pid=%ld\n", (long)getpid());
    if (fd < 0 || write(fd, pid, (size_t)len) != len || close(fd)) {
        perror(argv[2]);
        return 1;
    }
    if (rank == 0) {
        static char flood[4096];
        for (size_t i = 0; i < sizeof flood; i++)
            flood[i] = i % 2 ? '\n' : 'y';
        while (write(STDOUT_FILENO, flood, sizeof flood) > 0)
            ;
        return 1;
    }
    if (argc > 4 && rank == atoi(argv[3])) {
        sleep_s(0.3);
        fprintf(stderr, "rank %d: failing beside a flood\n", rank);
        return atoi(argv[4]);
    }
    printf("ready\n");
    fflush(stdout);
    return wait_a_while();
}

/* The child is ready once it says so on a pipe, so that the rank exits
 * only after the child has taken its place (its own session, SIGTERM
 * ignored). */
static int orphan_mode(const char *how) {
    int ready[2];
    if (pipe(ready)) {
        perror("pipe");
        return 1;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        if (!strcmp(how, "setsid"))
            setsid();
        if (!strcmp(how, "stubborn"))
            signal(SIGTERM, SIG_IGN);
        int null = open("/dev/null", O_RDWR);
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        if (write(ready[1], "x", 1) != 1)
            _exit(1);
        for (int i = 0; i < 300; i++)
            sleep_s(0.1);
        _exit(0);
    }
    char x;
    close(ready[1]);
    if (read(ready[0], &x, 1) != 1) {
        fprintf(stderr, "orphan: the child did not get ready\n");
        return 1;
    }
    printf("pid=%ld\n", (long)child);
    return 0;
}

static int fds_mode(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        perror("/proc/self/fd");
        return 1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd <= 2 || fd == dirfd(d))
            continue;
        char link[64], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        target[n > 0 ? n : 0] = 0;
        printf("fd %d -> %s\n", fd, target);
    }
    closedir(d);
    printf("fds listed\n");
    return 0;
}

static int listen_mode(void) {
    FILE *f = fopen("/proc/net/tcp", "r");
    if (!f) {
        perror("/proc/net/tcp");
        return 1;
    }
    unsigned port = (unsigned)atoi(env("CT_MASTER_PORT"));
    char line[512];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        unsigned addr, lport, state;
        if (sscanf(line, " %*d: %x:%x %*x:%*x %x", &addr, &lport, &state) == 3 && lport == port &&
            state == 0x0A) {
            /* /proc/net/tcp prints the address as the host reads the
             * network-order word. */
            unsigned char *b = (unsigned char *)&addr;
            printf("listen %u.%u.%u.%u:%u\n", b[0], b[1], b[2], b[3], lport);
            found = true;
        }
    }
    fclose(f);
    if (!found)
        printf("listen none\n");
    printf("master=%s:%s\n", env("CT_MASTER_ADDR"), env("CT_MASTER_PORT"));
    return 0;
}

int main(int argc, char **argv) {
    int rank = atoi(env("CT_RANK"));
    printf("pid=%ld\n", (long)getpid());
    fflush(stdout);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "env")) {
        printf("rank=%s world=%s local=%s local_world=%s master=%s:%s restart=%s threads=%s\n",
               env("CT_RANK"), env("CT_WORLD_SIZE"), env("CT_LOCAL_RANK"),
               env("CT_LOCAL_WORLD_SIZE"), env("CT_MASTER_ADDR"), env("CT_MASTER_PORT"),
               env("CT_RESTART_COUNT"), env("CT_NUM_THREADS"));
        return 0;
    }
    if (!strcmp(mode, "fail") && argc > 3) {
        if (rank != atoi(argv[2]))
            return wait_a_while();
        fprintf(stderr, "rank %d: something went wrong\n", rank);
        return atoi(argv[3]);
    }
    if (!strcmp(mode, "kill") && argc > 2) {
        if (rank != atoi(argv[2]))
            return wait_a_while();
        raise(SIGKILL);
    }
    if (!strcmp(mode, "wait") || !strcmp(mode, "stubborn")) {
        if (!strcmp(mode, "stubborn"))
            signal(SIGTERM, SIG_IGN);
        printf("ready\n");
        fflush(stdout);
        return wait_a_while();
    }
    if (!strcmp(mode, "restart")) {
        int first = !strcmp(env("CT_RESTART_COUNT"), "0");
        if (rank == 1 && first) {
            fprintf(stderr, "failing on purpose on the first run\n");
            return 1;
        }
        printf("ok restart=%s\n", env("CT_RESTART_COUNT"));
        return 0;
    }
    if (!strcmp(mode, "store")) {
        /* Each rank publishes its pid and waits for everyone's. */
        ct_world w;
        ct_store *store =
            ct_world_from_env(&w) ? NULL : ct_store_connect(w.master_addr, w.master_port, 10);
        char key[64], pid[32], *keys[64];
        snprintf(key, sizeof key, "pid/%d", w.rank);
        snprintf(pid, sizeof pid, "%ld", (long)getpid());
        int rc = store ? ct_store_set(store, key, pid, strlen(pid), -1) : -1;
        for (int r = 0; r < w.size && r < 64; r++) {
            keys[r] = malloc(32);
            snprintf(keys[r], 32, "pid/%d", r);
        }
        if (rc == 0)
            rc = ct_store_wait(store, (const char *const *)keys, w.size, 10);
        for (int r = 0; r < w.size && r < 64; r++)
            free(keys[r]);
        ct_store_free(store);
        if (rc) {
            fprintf(stderr, "rank %d: %s\n", w.rank, ct_errmsg());
            return 1;
        }
        printf("met %d ranks at %s:%d\n", w.size, w.master_addr, w.master_port);
        return 0;
    }
    if (!strcmp(mode, "dist")) {
        if (argc > 2 && !strcmp(argv[2], "early") && rank == 1 &&
            !strcmp(env("CT_RESTART_COUNT"), "0")) {
            fprintf(stderr, "failing on purpose before ct_dist_init on the first run\n");
            return 1;
        }
        return dist_mode(argc > 2 && !strcmp(argv[2], "restart"));
    }
    if (!strcmp(mode, "hang")) {
        if (ct_dist_init(NULL))
            return dist_failed("ct_dist_init");
        printf("ready\n");
        fflush(stdout);
        if (rank == 0 && ct_comm_barrier(ct_dist_comm(), NULL))
            return dist_failed("barrier");
        return wait_a_while();
    }
    if (!strcmp(mode, "beat") && argc > 2) {
        if (ct_dist_init(NULL))
            return dist_failed("ct_dist_init");
        for (double end = now_s() + atof(argv[2]); now_s() < end;) {
            ct_dist_heartbeat();
            sleep_s(0.2);
        }
        ct_dist_finalize();
        printf("beat done\n");
        return 0;
    }
    if (!strcmp(mode, "sleep") && argc > 2) {
        sleep_s(atof(argv[2]));
        return 0;
    }
    if (!strcmp(mode, "flood") && argc > 2)
        return flood_mode(rank, argc, argv);
    if (!strcmp(mode, "orphan") && argc > 2)
        return orphan_mode(argv[2]);
    if (!strcmp(mode, "fds"))
        return fds_mode();
    if (!strcmp(mode, "listen"))
        return listen_mode();
    fprintf(stderr, "ctlaunch_rank: unknown mode '%s'\n", mode);
    return 2;
}
