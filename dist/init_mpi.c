/* ct_dist_init's use of MPI under an MPI launcher (mpirun, srun, a PMI
 * launcher): initializing MPI, the world from MPI_COMM_WORLD, and sharing
 * rank 0's bootstrap bytes. dist's own messages go over a duplicate of
 * MPI_COMM_WORLD with MPI_ERRORS_RETURN, so the program's error handler on
 * MPI_COMM_WORLD is left alone and MPI errors come back as CT_EFOREIGN. */
#include "init_mpi.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <time.h>

static struct {
    bool initialized_here; /* MPI_Init_thread was ours, so MPI_Finalize is too */
    bool active;           /* between a successful init and finalize */
    /* A broadcast was abandoned at its deadline, or a collective failed:
     * MPI_Finalize could wait for it forever, so the process is left to
     * exit without it (the launcher then ends the job, which is broken
     * anyway). */
    bool abandoned;
    MPI_Comm comm;  /* dist's duplicate of MPI_COMM_WORLD */
    MPI_Comm world; /* MPI_COMM_WORLD as an lvalue, for ct_comm_config.mpi_comm */
} mpi = {.comm = MPI_COMM_NULL};

static int mpi_error(int err, const char *call) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, text, &len) != MPI_SUCCESS)
        len = snprintf(text, sizeof text, "MPI error %d", err);
    return ct__err_set(CT_EFOREIGN, "dist_init: %s failed: %.*s", call, len, text);
}

static const char *thread_level_name(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    }
    return "an unknown thread level";
}

/* Rank, size, and the ranks on this machine, from MPI itself: they win over
 * the launcher's variables (Slurm does not give the local size at all). */
static int read_world(ct_world *w) {
    int rc, rank, size, local_rank, local_size;
    MPI_Comm node;
    if ((rc = MPI_Comm_rank(mpi.comm, &rank)) || (rc = MPI_Comm_size(mpi.comm, &size)))
        return mpi_error(rc, "MPI_Comm_rank/size");
    rc = MPI_Comm_split_type(mpi.comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    if (rc)
        return mpi_error(rc, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    rc = MPI_Comm_rank(node, &local_rank);
    if (!rc)
        rc = MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    if (rc)
        return mpi_error(rc, "MPI_Comm_rank/size of the node's communicator");
    /* A launcher's ranks that MPI did not join (srun without PMI, an MPI
     * built without the launcher's PMI) each come up as a world of one. */
    if (w->source != CT_WORLD_SINGLE && (size != w->size || rank != w->rank))
        return ct__err_set(CT_EINVAL,
                           "dist_init: %s says rank %d of %d, but MPI's world has this process "
                           "as rank %d of %d: the launcher and MPI disagree; under srun, choose "
                           "a PMI MPI supports (srun --mpi=pmix; srun --mpi=list), or run "
                           "without PMI, where ct meets at the step's first host",
                           ct_world_source_name(w->source), w->rank, w->size, rank, size);
    w->rank = rank;
    w->size = size;
    w->local_rank = local_rank;
    w->local_size = local_size;
    return 0;
}

int ct__dist_mpi_init(ct_world *w) {
    int initialized = 0, provided = MPI_THREAD_SINGLE, rc;
    MPI_Initialized(&initialized);
    if (!initialized) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized)
            return ct__err_set(CT_ESTATE, "dist_init: MPI was finalized already and cannot be "
                                          "initialized again in this process");
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc)
            return mpi_error(rc, "MPI_Init_thread");
        mpi.initialized_here = true;
    } else if ((rc = MPI_Query_thread(&provided))) {
        return mpi_error(rc, "MPI_Query_thread");
    }
    mpi.active = true;
    if (provided < MPI_THREAD_SERIALIZED) {
        rc = ct__err_set(CT_ENOTSUP,
                         "dist_init: MPI provides %s, but ct's progress threads need "
                         "MPI_THREAD_SERIALIZED or better%s",
                         thread_level_name(provided),
                         mpi.initialized_here ? ""
                                              : " (initialize MPI with MPI_Init_thread and ask for "
                                                "MPI_THREAD_MULTIPLE)");
        ct__dist_mpi_finalize();
        return rc;
    }
    mpi.world = MPI_COMM_WORLD;
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &mpi.comm))) {
        mpi_error(rc, "MPI_Comm_dup(MPI_COMM_WORLD)");
        ct__dist_mpi_finalize();
        return CT_EFOREIGN;
    }
    MPI_Comm_set_errhandler(mpi.comm, MPI_ERRORS_RETURN);
    if ((rc = read_world(w)))
        ct__dist_mpi_finalize();
    return rc;
}

/* Waits at most timeout_s for req: 0, CT_ETIMEDOUT (no message; the
 * request is abandoned, and with it MPI_Finalize) or an MPI error. A
 * bounded wait, so that a rank that never comes does not hang the others;
 * the backoff keeps the test loop cheap while it lasts. */
static int wait_bounded(MPI_Request *req, double timeout_s, const char *what) {
    struct timespec pause = {0, 1000};
    double start = ct__now();
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc)
            return mpi_error(rc, what);
        if (done)
            return 0;
        if (ct__now() - start > timeout_s) {
            mpi.abandoned = true;
            return CT_ETIMEDOUT;
        }
        nanosleep(&pause, NULL);
        if (pause.tv_nsec < 10000000)
            pause.tv_nsec *= 2;
    }
}

int ct__dist_mpi_share(void *buf, size_t len, const char *what, double timeout_s) {
    CT_ASSERT(mpi.active && len <= (size_t)INT_MAX);
    MPI_Request req;
    int rc = MPI_Ibcast(buf, (int)len, MPI_BYTE, 0, mpi.comm, &req);
    if (rc)
        return mpi_error(rc, "MPI_Ibcast");
    rc = wait_bounded(&req, timeout_s, "MPI_Test of the broadcast");
    if (rc == CT_ETIMEDOUT)
        return ct__err_set(CT_ETIMEDOUT,
                           "dist_init: waited %.1f s for rank 0 to share %s over MPI; is rank 0 "
                           "running and calling ct_dist_init?",
                           timeout_s, what);
    return rc;
}

void ct__dist_mpi_meet(double timeout_s) {
    if (!mpi.active)
        return;
    MPI_Request req;
    if (MPI_Ibarrier(mpi.comm, &req) != MPI_SUCCESS ||
        wait_bounded(&req, timeout_s, "MPI_Test of the barrier before MPI_Finalize"))
        mpi.abandoned = true;
}

const void *ct__dist_mpi_world_comm(void) { return &mpi.world; }

void ct__dist_mpi_finalize(void) {
    if (!mpi.active)
        return;
    if (mpi.comm != MPI_COMM_NULL)
        MPI_Comm_free(&mpi.comm);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (mpi.initialized_here && !finalized && !mpi.abandoned)
        MPI_Finalize();
    mpi.initialized_here = false;
    mpi.active = false;
}
