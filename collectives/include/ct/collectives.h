/* ct/collectives.h: communicators and collective operations on tensors.
 *
 * A ct_comm is a group of ranks (processes) that exchange tensors. Every
 * operation is asynchronous: pass a ct_work ** and the call returns as soon
 * as the operation is queued, with a handle to wait on or test; pass NULL
 * and the call waits for it (the blocking form). Communication made async
 * overlaps compute: a per-communicator progress thread carries it forward.
 *
 * Backends, behind one interface:
 *   - shm: ranks on one machine, through a shared-memory segment (chunked,
 *     pipelined ring for large messages; a one-round exchange for small
 *     ones).
 *   - mpi: Open MPI's non-blocking collectives, for mpirun and several
 *     machines.
 *   - nccl: CUDA tensors, on a communication stream.
 *   - gloo: Debian's libgloo (PyTorch's CPU engine) over TCP, for CPU
 *     tensors across machines without an MPI launcher.
 * collectives/ is handed its bootstrap (a segment name, an MPI_Comm, an
 * NCCL unique id, a store's functions for gloo); it never reads the
 * environment. ct_dist_init() (ct/dist.h)
 * does the bootstrapping for a launched job.
 *
 * The example runs a communicator of one rank, which needs no launcher.
 *
 * Example:
 *
 *     #include <ct/collectives.h>
 *     #include <stdio.h>
 *     #include <unistd.h>
 *
 *     int main(void) {
 *         char name[64];
 *         snprintf(name, sizeof name, "/ct-example-%d", (int)getpid());
 *         ct_comm_config cfg = {.backend = CT_BACKEND_SHM, .rank = 0, .size = 1, .shm_name = name};
 *         ct_comm *comm = ct_comm_new(&cfg);
 *         ct_tensor *t = ct_arange(0, 4, 1, CT_FLOAT32);
 *         ct_work *work = NULL;
 *         int rc = comm && t ? 0 : ct_errcode();
 *         if (rc == 0)
 *             rc = ct_comm_allreduce(comm, t, CT_REDUCE_SUM, &work);
 *         if (rc == 0)
 *             rc = ct_work_wait(work);
 *         if (rc == 0)
 *             rc = ct_comm_broadcast(comm, t, 0, NULL);
 *         ct_tensor *sum = rc == 0 ? ct_sum(t, NULL, 0, false) : NULL;
 *         if (sum)
 *             printf("rank %d of %d: sum = %g\n", ct_comm_rank(comm), ct_comm_size(comm),
 *                    ct_item(sum));
 *         else
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         ct_tensor_free(sum);
 *         ct_work_free(work);
 *         ct_tensor_free(t);
 *         ct_comm_free(comm);
 *         return rc != 0;
 *     }
 *
 * Ordering. Every rank must issue the same collectives in the same order
 * (their sequence numbers must match). Each call is checked against its
 * peers' cheaply and by default: a rank that calls a different operation,
 * dtype, element count, root or reduction at the same sequence number makes
 * the operation fail on every rank with CT_EMISMATCH, naming both sides.
 * Point-to-point messages between two ranks arrive in the order sent; a
 * recv's tag, dtype and count must match the next send from that peer.
 *
 * Errors. Functions that return int return 0 or a negative CT_E* code and
 * record a message (ct_errmsg()). Issuing fails with CT_EINVAL (bad root,
 * peer, tag or reduction, overlapping tensors), CT_ESHAPE (tensor sizes
 * that do not fit the group), CT_EDTYPE (dtypes differ, avg of bool),
 * CT_EDEVICE (a tensor on the wrong device for the backend), or the code
 * of the failure that failed the communicator earlier (below). Completion
 * fails with:
 *   - CT_ETIMEDOUT: the operation did not finish within the communicator's
 *     timeout. The message names the operation, its sequence number and the
 *     ranks that had not arrived at it.
 *   - CT_EPEER: a peer died or failed; the message names it.
 *   - CT_EMISMATCH: ranks disagree about the operation (see Ordering).
 * Any of these fails the communicator: every pending and later operation on
 * it fails promptly with the first error's code and message, on every rank
 * that is still alive, whether or not it had reached the operation. Create
 * a new communicator to continue.
 *
 * Tensors. CPU tensors of any dtype for shm, mpi and gloo, CUDA tensors on the
 * communicator's device for nccl (ct_comm_device); non-contiguous ones are
 * staged through a contiguous copy on their device (contiguous tensors take
 * a path with no allocation per call). float16 and bfloat16 reduce in
 * float32 on the CPU backends (shm, mpi, gloo), in their own type in NCCL. Reductions are
 * bitwise identical on every rank. A queued operation holds references to
 * its tensors; do not read or write them until it completes.
 *
 * CUDA tensors (nccl). An operation follows the work issued on ct's compute
 * stream of the device before the call (an op queued just before it is
 * seen by it) and runs on a communication stream of the communicator's
 * own, so that it overlaps compute issued after the call. Completion is
 * device-side: ct_work_wait returns once the operation is queued on the
 * device and the compute stream is made to wait for it, without waiting
 * for the transfer on the host, so that ops issued after ct_work_wait see
 * its result (and ct_item or a copy to the host waits for it). The host
 * waits for the transfer itself where the API promises completion: in the
 * blocking form (work == NULL), ct_work_free, ct_comm_free, and
 * ct_work_test returning 1. An error that NCCL reports after ct_work_wait
 * returned fails the communicator, and so the next operation. The memory
 * of a tensor freed while an operation on it runs is not reused until it
 * ends.
 *
 * Threads. Operations on one communicator may be issued from any thread, but
 * one at a time, and in the same order on every rank. A ct_work may be
 * waited on or tested from any thread; free it once. Communicators are
 * independent of each other.
 */
#ifndef CT_COLLECTIVES_H
#define CT_COLLECTIVES_H

#include <ct/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_reduce_op {
    CT_REDUCE_SUM,
    CT_REDUCE_AVG, /* sum divided by the group size; integers truncate */
    CT_REDUCE_MIN,
    CT_REDUCE_MAX,
    CT_REDUCE_PROD,
} ct_reduce_op;
/* For bool, sum and max are logical or; prod and min are logical and. */

typedef enum ct_backend {
    CT_BACKEND_SHM,
    CT_BACKEND_MPI,
    CT_BACKEND_NCCL,
    CT_BACKEND_GLOO,
    /* shm within each machine and the flat communicator's backend across
     * machines: made by ct_comm_hierarchical, never by ct_comm_new */
    CT_BACKEND_HIER,
    /* one process playing rank `rank` of a group of `size` alone, as if
     * every rank held what it holds: each operation completes at once, on
     * the meta device moving nothing, on the host writing what a group of
     * identical ranks would get (size times the value for a sum, size
     * copies for an allgather); send and recv fail (CT_ENOTSUP). For
     * shape-only dry runs (ct_memory_plan) and tests; needs no config but
     * rank and size. The only backend that takes meta tensors. */
    CT_BACKEND_DRY,
} ct_backend;

/* "shm", "mpi", "nccl", "gloo"; "?" for others. */
CT_API const char *ct_backend_name(ct_backend backend);
/* Whether this build has the backend (mpi, nccl and gloo are optional). */
CT_API bool ct_backend_available(ct_backend backend);

/* The bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES). */
#define CT_NCCL_ID_BYTES 128
/* Makes a new NCCL unique id into id (CT_NCCL_ID_BYTES bytes): rank 0 makes
 * it and hands it to every rank of the group, which passes it as
 * config.nccl_id (ct_dist_init does this through the store or MPI).
 * Errors: CT_EINVAL for NULL, CT_ENOTSUP in a build without NCCL,
 * CT_EFOREIGN with NCCL's text. Thread-safe. */
CT_API int ct_comm_nccl_id(void *id);

/* A key-value store the gloo backend meets its peers through (ct_store,
 * ct/dist.h, in ct_dist_init), as functions, since collectives/ does not
 * know the store: set stores a copy of value under key; get waits up to
 * timeout_s (0: not at all) for key and returns a malloc'd copy the caller
 * free()s, or CT_ETIMEDOUT when it is absent. Both return 0 or a CT_E*
 * code with the message recorded. The communicator calls them from its
 * own threads, one call at a time per communicator but from several
 * communicators (those split from it) at once: they must be thread-safe.
 * The store must outlive the communicator and every one split from it. */
typedef struct ct_comm_store {
    void *ctx;
    int (*set)(void *ctx, const char *key, const void *value, size_t len);
    int (*get)(void *ctx, const char *key, double timeout_s, void **value, size_t *len);
} ct_comm_store;

/* The default timeout of every operation, in seconds. */
#define CT_COMM_DEFAULT_TIMEOUT 300.0

typedef struct ct_comm_config {
    ct_backend backend;
    int rank, size;   /* this process's rank in [0, size) */
    double timeout_s; /* per operation; 0 means CT_COMM_DEFAULT_TIMEOUT */
    /* shm: the segment's name ("/name", at most 200 bytes), the same on
     * every rank and unique to this communicator. Rank 0 creates it; the
     * others attach within timeout_s, and the name is unlinked once all
     * have, so nothing is left in /dev/shm. */
    const char *shm_name;
    /* mpi: a pointer to an MPI_Comm of size ranks; the communicator keeps
     * a duplicate of it. MPI must be initialized with MPI_THREAD_SERIALIZED
     * or better. */
    const void *mpi_comm;
    /* nccl: the ncclUniqueId (rank 0 made it and handed it to the others)
     * and this rank's CUDA device. */
    const void *nccl_id;
    int device;
    /* gloo: the store the ranks meet through, a prefix of at most 200
     * bytes for every key the communicator uses (the same on every rank,
     * unique to this communicator, so that its keys meet no one else's),
     * and the IPv4 address or host name its TCP connections bind to and
     * the peers reach it at (NULL: 127.0.0.1, one machine only). */
    const ct_comm_store *store;
    const char *store_prefix;
    const char *gloo_addr;
} ct_comm_config;

typedef struct ct_comm ct_comm;
typedef struct ct_work ct_work;

/* Creates a communicator; every rank of the group calls it with the same
 * backend and size. It returns once all ranks have joined (or fails with
 * CT_ETIMEDOUT naming the ranks that did not join). The caller owns the
 * result. Errors: CT_EINVAL for a bad config, CT_ENOTSUP for a backend this
 * build lacks, CT_EIO / CT_EFOREIGN when the segment or library fails (with
 * its own text). */
CT_API ct_comm *ct_comm_new(const ct_comm_config *config);
/* Waits for every operation already issued (each up to its timeout), then
 * frees the communicator. ct_work handles stay valid until freed. Accepts
 * NULL. */
CT_API void ct_comm_free(ct_comm *comm);

CT_API int ct_comm_rank(const ct_comm *comm);
CT_API int ct_comm_size(const ct_comm *comm);
CT_API ct_backend ct_comm_backend(const ct_comm *comm);
/* The device of the tensors the communicator takes: CT_DEVICE_CPU for shm, gloo
 * and mpi, (ct_device){CT_CUDA, config.device} for nccl. Thread-safe. */
CT_API ct_device ct_comm_device(const ct_comm *comm);
/* Changes the timeout of operations issued from now on; seconds > 0. */
CT_API int ct_comm_set_timeout(ct_comm *comm, double seconds);
CT_API double ct_comm_timeout(const ct_comm *comm);

/* Whether async operations advance on the communicator's progress thread
 * (the default). With it off, they advance only while a thread waits on
 * one, tests one, or calls ct_comm_progress(): for machines without a spare
 * core per rank, where the thread's waiting for peers takes time from the
 * compute it should overlap. Operations issued before keep their course. */
CT_API int ct_comm_set_progress_thread(ct_comm *comm, bool enabled);
/* Advances queued and running operations as far as they go without
 * waiting, on the calling thread, unless another thread is doing so. Cheap
 * when nothing is pending. Returns 0, or the communicator's failure (its
 * first error's code and message). */
CT_API int ct_comm_progress(ct_comm *comm);

/* Passing CT_COMM_SPLIT_NONE as color leaves the rank out of every new
 * communicator. */
#define CT_COMM_SPLIT_NONE (-1)

/* MPI_Comm_split: a collective over comm. Ranks passing the same color form
 * a new communicator, ordered by key (then by rank in comm), on comm's
 * backend with comm's timeout. *out is NULL for CT_COMM_SPLIT_NONE. Errors
 * as for a collective, and as for ct_comm_new. */
CT_API int ct_comm_split(ct_comm *comm, int color, int key, ct_comm **out);

/* Hierarchical collectives (Horovod's hierarchical allreduce, NCCL's
 * trees across nodes): a communicator over the ranks of flat (gloo or mpi,
 * across machines) whose allreduce, broadcast, allgather and
 * reduce_scatter run as shm among the ranks of each machine and flat's
 * backend among one rank per machine, every local rank carrying its 1/L
 * share of the data across (L ranks per machine), so that a machine's
 * link carries 1/L of the bytes a flat ring puts on it. Other operations,
 * and allgather and reduce_scatter where the ranks are not numbered
 * machine by machine, run on flat. Reductions sum within the machine
 * first: results equal flat's up to float reassociation (bit for bit for
 * integers); docs/multinode.md says more.
 *
 * machine identifies this rank's machine: equal on the ranks of one
 * machine, different across machines. Every machine must hold the same
 * number of ranks. A collective over flat: every rank calls it. On success
 * *out owns flat (ct_comm_free(*out) frees it; do not use flat directly
 * any more), ct_comm_rank and ct_comm_size are flat's, ct_comm_backend
 * is CT_BACKEND_HIER, and ct_comm_split splits flat. On failure the
 * caller keeps flat, and *out is NULL. Errors, on every rank: CT_EINVAL
 * for NULL arguments, a device backend, or machines with different
 * numbers of ranks (the message names them); the errors of
 * ct_comm_split and of the shm communicator's ct_comm_new. */
CT_API int ct_comm_hierarchical(ct_comm *flat, uint64_t machine, ct_comm **out);

/* What the communicator is doing, for hang reports. Thread-safe. */
typedef struct ct_comm_stats {
    uint64_t issued;    /* collectives issued on this rank */
    uint64_t completed; /* collectives completed (successfully or not) */
    /* The oldest collective not completed yet: its name and sequence
     * number, or NULL and 0. */
    const char *pending_op;
    uint64_t pending_seq;
    /* Allreduces that ran straight on ct_comm_zeros memory, nothing staged:
     * how to tell that the shared memory is in use. */
    uint64_t direct;
} ct_comm_stats;
CT_API void ct_comm_stats_get(ct_comm *comm, ct_comm_stats *stats);

/* ------------------------------------------------------- shared memory */

/* A zero-filled contiguous tensor in memory that every rank's transport can
 * reach: with the shm backend, one shared segment per rank that every rank
 * of comm maps. An allreduce on such a tensor, or on a contiguous view of
 * it, over more than 64 KiB skips the staging copies: each rank reduces its
 * share straight from its peers' memory and writes it into theirs
 * (PyTorch's symmetric memory and NCCL's registered buffers are the same
 * idea). The fast path needs every rank to pass the same view; otherwise
 * the usual path runs, with the same results. Other operations on it take
 * the usual path. Backends without such memory return an ordinary zeroed
 * tensor: on the host for mpi, on the communicator's device for nccl.
 *
 * When some rank cannot create or map its segment (a /dev/shm without the
 * room, as in containers by default), every rank gets an ordinary zeroed
 * tensor instead, and that rank says why on stderr.
 *
 * A collective: every rank of comm calls it, in the same order among the
 * other operations, with the same sizes and dtype. The caller owns the
 * result (scope-owned inside a scope); it stays valid after comm is freed.
 * Errors, on every rank: CT_EINVAL for bad sizes or a dtype, or when ranks
 * ask for different ones (the message names both); CT_ENOMEM; the
 * communicator's own failures. Call it from the thread that issues
 * operations. */
CT_API ct_tensor *ct_comm_zeros(ct_comm *comm, int ndim, const int64_t *sizes, ct_dtype dtype);

/* ------------------------------------------------------------ operations */

/* Each operation returns 0 once issued (work != NULL: *work receives a new
 * handle the caller owns) or completed (work == NULL), or a CT_E* code, in
 * which case *work is NULL. Tensors are CPU tensors for shm, mpi and gloo, CUDA
 * tensors for nccl. */

/* t := reduction of t over all ranks, on every rank. */
CT_API int ct_comm_allreduce(ct_comm *comm, ct_tensor *t, ct_reduce_op op, ct_work **work);
/* t := root's t, on every rank. */
CT_API int ct_comm_broadcast(ct_comm *comm, ct_tensor *t, int root, ct_work **work);
/* root's t := reduction of t over all ranks; other ranks' t is unchanged. */
CT_API int ct_comm_reduce(ct_comm *comm, ct_tensor *t, ct_reduce_op op, int root, ct_work **work);
/* out (size x numel(in) elements, any shape) := every rank's in, in rank
 * order. in may be rank's own block of out. */
CT_API int ct_comm_allgather(ct_comm *comm, ct_tensor *out, ct_tensor *in, ct_work **work);
/* out (numel(in) / size elements) := the reduction over all ranks of block
 * rank of in. */
CT_API int ct_comm_reduce_scatter(ct_comm *comm, ct_tensor *out, ct_tensor *in, ct_reduce_op op,
                                  ct_work **work);
/* in and out have the same numel, divisible by size: block j of in goes to
 * rank j, and block i of out comes from rank i. */
CT_API int ct_comm_alltoall(ct_comm *comm, ct_tensor *out, ct_tensor *in, ct_work **work);
/* Completes once every rank has issued it. */
CT_API int ct_comm_barrier(ct_comm *comm, ct_work **work);
/* Point to point. tag >= 0 must match at both ends. */
CT_API int ct_comm_send(ct_comm *comm, ct_tensor *t, int dst, int tag, ct_work **work);
CT_API int ct_comm_recv(ct_comm *comm, ct_tensor *t, int src, int tag, ct_work **work);

/* ------------------------------------------------------------------ work */

/* Waits until the operation completes; returns 0 or its CT_E* code, with
 * the message recorded on this thread. May be called again. On CUDA
 * tensors (nccl) it waits until the operation is queued on the device and
 * orders the device's compute stream after it (see CUDA tensors above). */
CT_API int ct_work_wait(ct_work *work);
/* 1 if it completed successfully, 0 if still pending, or its CT_E* code.
 * On CUDA tensors, 1 means that the device finished it. */
CT_API int ct_work_test(ct_work *work);
/* Waits for the operation if still pending, then frees the handle. Accepts
 * NULL. */
CT_API void ct_work_free(ct_work *work);

#ifdef __cplusplus
}
#endif

#endif
