/* What the rank programs of the multi-process tests (coll_rank, ddp_rank,
 * ckpt_rank) share. Linking tt_rank.c makes the program print "pid=<pid>"
 * before main, so that the driver can check that no rank is left behind. */
#ifndef TT_RANK_H
#define TT_RANK_H

#include <ct/dist.h>

/* Joins the job (ct_dist_init) with timeout_s for rendezvous and every
 * collective; the world communicator, with its rank and size in *rank and
 * *size, or NULL with the failure recorded. */
ct_comm *tt_rank_join(double timeout_s, int *rank, int *size);

/* Records a failure at the caller's line naming what, when rc is an
 * error. */
#define TT_CHECK_RC(what, rc) tt_check_rc_(__FILE__, __LINE__, (what), (rc))
void tt_check_rc_(const char *file, int line, const char *what, int rc);

/* Whether ct_errmsg() holds every string of subs (NULL-ended). Records a
 * failure naming the first it lacks; otherwise prints the message as
 * "rank R: what: message", for the job's log. */
bool tt_message_holds(int rank, const char *what, const char *const *subs);

/* Checks that every TCP listener of this process binds 127.0.0.1, recording
 * a failure (naming rank) for each that does not; how many it found. */
int tt_listeners_on_loopback(int rank);

#endif
