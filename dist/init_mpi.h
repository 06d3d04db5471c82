/* ct dist internal header: not installed, not part of the API.
 *
 * What ct_dist_init (init.c) needs from MPI, so that init.c reads the same
 * with and without it: init_mpi.c implements these when the build has MPI;
 * without MPI they are the inline stubs below, which say so. All of them are
 * called only from the thread that runs ct_dist_init / ct_dist_finalize.
 */
#ifndef CT_DIST_INIT_MPI_H
#define CT_DIST_INIT_MPI_H

#include <ct/dist.h>

#include "base_impl.h"

#ifdef CT_HAVE_MPI

/* Initializes MPI unless the program did (asking for MPI_THREAD_MULTIPLE;
 * at least MPI_THREAD_SERIALIZED is needed), then sets w's rank and size
 * from MPI_COMM_WORLD and its local rank and size from the ranks sharing
 * this machine (MPI_COMM_TYPE_SHARED). Errors: CT_ENOTSUP naming the thread
 * level MPI provides, CT_EFOREIGN with MPI's text. */
int ct__dist_mpi_init(ct_world *w);
/* Copies len bytes from rank 0's buf into every rank's buf; a collective
 * over MPI_COMM_WORLD. Waits at most timeout_s seconds, then fails with
 * CT_ETIMEDOUT naming what (a short noun phrase) was being shared. */
int ct__dist_mpi_share(void *buf, size_t len, const char *what, double timeout_s);
/* A pointer to a handle of MPI_COMM_WORLD, for ct_comm_config.mpi_comm. */
const void *ct__dist_mpi_world_comm(void);
/* Frees what ct__dist_mpi_init made and finalizes MPI if it initialized
 * it. A no-op if ct__dist_mpi_init was not called or failed. */
void ct__dist_mpi_finalize(void);
/* After a failed collective (a timeout, a dead peer, a mismatch): meets
 * the other ranks in a barrier of at most timeout_s, and if one does not
 * come, leaves MPI_Finalize out of ct__dist_mpi_finalize. MPI_Finalize
 * waits for every rank (Open MPI's ends in a fence of the whole job), so
 * it would wait for a stuck peer forever; where every rank failed alike
 * (a mismatch) they all meet and finalize cleanly. Without MPI_Finalize
 * the process exits and the launcher ends the job, which has failed. */
void ct__dist_mpi_meet(double timeout_s);

#else

static inline int ct__dist_mpi_init(ct_world *w) {
    return ct__err_set(CT_ENOTSUP,
                       "dist_init: launched by %s (%d ranks), but this build of ct has no MPI; "
                       "rebuild it with Open MPI (libopenmpi-dev), or launch with ctlaunch -np %d",
                       ct_world_source_name(w->source), w->size, w->size);
}
static inline int ct__dist_mpi_share(void *buf, size_t len, const char *what, double timeout_s) {
    (void)buf, (void)len, (void)timeout_s;
    return ct__err_set(CT_ENOTSUP, "dist_init: sharing %s needs MPI, which this build lacks", what);
}
static inline const void *ct__dist_mpi_world_comm(void) { return NULL; }
static inline void ct__dist_mpi_finalize(void) {}
static inline void ct__dist_mpi_meet(double timeout_s) { (void)timeout_s; }

#endif

#endif
