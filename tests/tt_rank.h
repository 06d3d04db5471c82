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

#endif
