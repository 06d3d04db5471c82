/* The rank programs' shared start: see tt_rank.h. */
#include "tt_rank.h"

#include "ct_test.h"

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
