/* The rank programs' shared start: see tt_rank.h. */
#include "tt_rank.h"

#include "ct_test.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void announce_pid(void) {
    printf("pid=%ld\n", (long)getpid());
    fflush(stdout);
}

ct_comm *tt_rank_join(double timeout_s, int *rank, int *size) {
    ct_dist_options opts = {.backend = NULL, .timeout_s = timeout_s};
    if (ct_dist_init(&opts) != 0) {
        tt_fail(__FILE__, __LINE__, "ct_dist_init: %s", ct_errmsg());
        return NULL;
    }
    ct_comm *c = ct_dist_comm();
    *rank = ct_comm_rank(c);
    *size = ct_comm_size(c);
    return c;
}

void tt_check_rc_(const char *file, int line, const char *what, int rc) {
    if (rc)
        tt_fail(file, line, "%s: %s: %s", what, ct_errname(rc), ct_errmsg());
}

bool tt_message_holds(int rank, const char *what, const char *const *subs) {
    for (int i = 0; subs[i]; i++)
        if (!strstr(ct_errmsg(), subs[i])) {
            tt_fail(__FILE__, __LINE__, "%s: '%s' does not say '%s'", what, ct_errmsg(), subs[i]);
            return false;
        }
    printf("rank %d: %s: %s\n", rank, what, ct_errmsg());
    return true;
}

/* The inodes of this process's sockets, from /proc/self/fd, into inodes;
 * how many. */
static int own_sockets(unsigned long *inodes, int cap) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < cap;) {
        char path[300], link[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, link, sizeof link - 1);
        link[len > 0 ? len : 0] = 0;
        if (sscanf(link, "socket:[%lu]", &inodes[n]) == 1)
            n++;
    }
    if (d)
        closedir(d);
    return n;
}

int tt_listeners_on_loopback(int rank) {
    unsigned long inodes[256];
    int n = own_sockets(inodes, 256), listeners = 0;
    const char *tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        char line[512], addr[64];
        unsigned state;
        unsigned long inode;
        while (f && fgets(line, sizeof line, f)) {
            if (sscanf(line, " %*d: %63[0-9A-Fa-f]:%*x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu",
                       addr, &state, &inode) != 3 ||
                state != 0x0A)
                continue;
            for (int i = 0; i < n; i++) {
                if (inodes[i] != inode)
                    continue;
                listeners++;
                /* 127.0.0.1 as /proc prints the network-order word. */
                if (strcmp(addr, "0100007F") != 0)
                    tt_fail(__FILE__, __LINE__, "rank %d listens on %s (hex, %s), not 127.0.0.1",
                            rank, addr, tables[t]);
            }
        }
        if (f)
            fclose(f);
    }
    return listeners;
}
