/* A rank for test_launcher: behaves as its first argument says.
 *
 *   env            prints its CT_* variables and exits 0
 *   fail R CODE    rank R writes to stderr and exits with CODE; the others wait
 *   kill R         rank R dies on SIGKILL; the others wait
 *   wait           prints "ready" and waits to be stopped
 *   stubborn       ignores SIGTERM, prints "ready" and waits
 *   restart        rank 1 fails on the first run only
 *   store          meets the other ranks through ctlaunch's store
 *
 * Every mode first prints "pid=<pid>", so the test can check that no rank
 * is left behind. Waiting ranks give up after 30 s. */
#define _DEFAULT_SOURCE

#include <ct/dist.h>
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
    fprintf(stderr, "ctlaunch_rank: unknown mode '%s'\n", mode);
    return 2;
}
