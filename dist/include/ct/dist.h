/* ct/dist.h: ct's distributed runtime.
 *
 * A multi-process job needs to know its shape and a place where its
 * processes meet. This header grows in sections, each built on the
 * previous one:
 *   - the world: rank, size and local rank, read from whichever launcher
 *     started the process (ctlaunch, mpirun, a PMI launcher, Slurm);
 *   - the store: a small key-value service over libzmq that carries
 *     rendezvous, the NCCL unique id, shared-memory segment names, RPC
 *     addresses and heartbeats. ctlaunch hosts it; without ctlaunch, rank 0
 *     does. Every operation has a timeout, so no rank waits forever.
 *   - init: ct_dist_init() finds the world, connects to (or hosts) the
 *     store, picks a collectives backend and builds the world communicator
 *     and process groups (ct/collectives.h has the operations);
 *   - data parallel: a model's gradients reduced across ranks in buckets
 *     whose allreduce overlaps backward (ct_ddp, below).
 *
 * Example:
 *
 *     #include <ct/dist.h>
 *     #include <stdio.h>
 *     #include <stdlib.h>
 *
 *     int main(void) {
 *         ct_store_server *server = ct_store_server_new("127.0.0.1", 0);
 *         ct_store *store = NULL;
 *         if (server)
 *             store = ct_store_connect("127.0.0.1", ct_store_server_port(server), 5.0);
 *         int64_t arrived = 0;
 *         void *addr = NULL;
 *         size_t len = 0;
 *         int rc = store ? 0 : ct_errcode();
 *         if (rc == 0)
 *             rc = ct_store_set(store, "rank0/addr", "10.0.0.1:4000", 13, -1);
 *         if (rc == 0)
 *             rc = ct_store_add(store, "arrived", 1, &arrived, -1);
 *         if (rc == 0)
 *             rc = ct_store_get(store, "rank0/addr", &addr, &len, 1.0);
 *         if (rc != 0) {
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         } else {
 *             printf("%lld arrived; rank 0 listens on %.*s\n", (long long)arrived, (int)len,
 *                    (const char *)addr);
 *         }
 *         free(addr);
 *         ct_store_free(store);
 *         ct_store_server_free(server);
 *         return rc != 0;
 *     }
 *
 * Errors. Functions that return int return 0 or a negative CT_E* code and
 * record a message (ct_errmsg()) that names the operation, the key(s), the
 * server's address and the timeout. CT_ETIMEDOUT: the server answered
 * nothing in time, or a key did not appear in time. CT_EPEER: the server is
 * unreachable (never connected, or the connection is down at the deadline).
 * CT_EINVAL: a bad argument, or a request the server refused. CT_ENOMEM:
 * the server is at one of its limits (named). CT_EAUTH: the server refused
 * this process's job secret.
 *
 * Threads. The server serves on its own thread; any number of clients, in
 * any number of processes, may talk to one server at once. A ct_store client
 * must be used by one thread at a time (zmq's rule for sockets); give each
 * thread its own. A client made before fork() must not be used in the
 * child: connect a new one there.
 */
#ifndef CT_DIST_H
#define CT_DIST_H

#include <ct/collectives.h>
#include <ct/nn.h>
#include <ct/optim.h>
#include <ct/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- world */

typedef enum ct_world_source {
    CT_WORLD_SINGLE,   /* no launcher: a world of one */
    CT_WORLD_CTLAUNCH, /* CT_RANK, CT_WORLD_SIZE, CT_LOCAL_*, CT_MASTER_*, CT_RESTART_COUNT */
    CT_WORLD_OPENMPI,  /* OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} */
    CT_WORLD_PMI,      /* PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS */
    CT_WORLD_SLURM,    /* SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, in a job step */
    /* torchrun's and Kubernetes' PyTorchJob's: RANK, WORLD_SIZE, LOCAL_RANK,
     * LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (docs/multinode.md) */
    CT_WORLD_ENV,
} ct_world_source;

typedef struct ct_world {
    int rank, size;
    /* The rank among the processes on this machine, and their number.
     * local_size is 0 when the launcher does not say (Slurm across nodes;
     * env:// without LOCAL_WORLD_SIZE), local_rank then -1 unless it says
     * that, and ct_dist_init finds both out. Without local variables under
     * PMI, every rank is taken to be local. */
    int local_rank, local_size;
    int restart_count; /* CT_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT, else 0 */
    /* Where the ranks meet in ct's store, for ct's own rendezvous
     * (ctlaunch, env://, Slurm without PMI: under the last two rank 0
     * hosts the store there); "" and -1 where an MPI launcher brings the
     * ranks together. */
    char master_addr[256];
    int master_port;
    ct_world_source source;
} ct_world;

/* Fills *w from the environment, trying ctlaunch's variables, then env://
 * (torchrun's), Open MPI's, PMI's and Slurm's (only inside a job step: a
 * batch script is one process); the first launcher with a rank or size
 * variable set wins, and its variables must then be complete and
 * consistent. A launcher nests others (ctlaunch or torchrun inside a Slurm
 * step, mpirun inside an allocation), so the outer job's variables are
 * left alone, except that env:// set by other means than torchrun (by hand,
 * by an operator) must agree with an MPI or Slurm world that is also set.
 * With none, *w is a world of one. Errors: CT_EINVAL naming the variable,
 * its value and the valid range, or both sources of two worlds that
 * disagree (*w is then a world of one). Thread-safe as long as nothing
 * changes the environment meanwhile. */
CT_API int ct_world_from_env(ct_world *w);
/* "ctlaunch", "Open MPI", ... */
CT_API const char *ct_world_source_name(ct_world_source source);

/* ----------------------------------------------------------------- trust */

/* A job has a secret, and every store and RPC connection proves it before
 * anything it sends is served (docs/security.md). The process's secret is,
 * first found: the one ct_secret_set() gave; CT_JOB_SECRET (ctlaunch puts
 * one there for its ranks); the content of the file CT_SECRET_FILE names;
 * under an MPI launcher, rank 0's, broadcast by ct_dist_init; else a random
 * one of this process's own, which only it and its forked children know.
 * A secret is CT_SECRET_MIN to CT_SECRET_MAX bytes of printable ASCII
 * without spaces. */
#define CT_SECRET_MIN     16
#define CT_SECRET_MAX     1024
#define CT_SECRET_HEX_LEN 64 /* ct_secret_generate's: 32 random bytes in hex */

/* Makes secret (copied) this process's secret, for servers and clients made
 * from now on. Errors: CT_EINVAL for a NULL, short, long or non-printable
 * secret. Thread-safe. */
CT_API int ct_secret_set(const char *secret);
/* Writes a new random secret (getrandom) and its NUL into out. Errors:
 * CT_EFOREIGN when the kernel gives no random bytes. Thread-safe. */
CT_API int ct_secret_generate(char out[CT_SECRET_HEX_LEN + 1]);
/* Reads a secret from the file at path into out (NUL-terminated; a final
 * newline is dropped). The file must be a regular file (not a symbolic link
 * or a FIFO) owned by this user and readable by nobody else (mode 600, as
 * ssh requires of its keys). Errors: CT_EINVAL naming what is wrong with
 * the file or its content, CT_EIO when it cannot be read. Thread-safe. */
CT_API int ct_secret_read_file(const char *path, char out[CT_SECRET_MAX + 1]);

/* ----------------------------------------------------------------- store */

/* Limits, checked on both sides of the wire. */
#define CT_STORE_MAX_KEY   1024               /* bytes in a key, without the NUL */
#define CT_STORE_MAX_VALUE (64 * 1024 * 1024) /* bytes in a value */
#define CT_STORE_MAX_KEYS  1024               /* keys in one wait or check */

typedef struct ct_store_server ct_store_server;
typedef struct ct_store ct_store;

/* Binds a store server to host:port and serves it on a new thread until
 * ct_store_server_free(). host is an IPv4 address, an interface name, NULL
 * for 127.0.0.1, or "*" for every interface (only when asked for: see
 * docs/security.md); port 0 picks a free port (ct_store_server_port() tells
 * which). Only clients that prove this process's secret (ct_secret_set)
 * are served. The limits CT_STORE_MAX_KEYS_TOTAL, CT_STORE_MAX_BYTES and
 * CT_STORE_MAX_CLIENTS are read from the environment here. The caller owns
 * the result. Errors: NULL with CT_EINVAL for a port outside [0, 65535] or a
 * limit variable that is not a whole number >= 1; CT_EIO when the address
 * cannot be bound (in use, unknown interface), with zmq's text; CT_EFOREIGN
 * when zmq or the thread cannot start. */
CT_API ct_store_server *ct_store_server_new(const char *host, int port);
/* The TCP port the server listens on; CT_EINVAL for a NULL or freed handle. */
CT_API int ct_store_server_port(const ct_store_server *server);
/* Stops the thread and frees the server and every key. Clients still
 * connected get CT_EPEER from their next operation. Accepts NULL. Not
 * thread-safe against itself (free once). */
CT_API void ct_store_server_free(ct_store_server *server);

/* Connects a client to the server at host:port (an address or a host name),
 * proving this process's secret, and checks, within timeout_s seconds, that
 * it answers; the server may start later within that time. timeout_s (> 0,
 * finite) is also the default timeout of every operation. The caller owns
 * the result. Errors: NULL with CT_EINVAL for a bad argument; CT_EPEER when
 * no server could be reached; CT_ETIMEDOUT when one was reached but did not
 * answer; CT_EAUTH when it refused this process's secret. */
CT_API ct_store *ct_store_connect(const char *host, int port, double timeout_s);
/* Closes the client without waiting for unsent messages. Accepts NULL. */
CT_API void ct_store_free(ct_store *store);

/* In every operation below: key is a NUL-terminated string of 1 to
 * CT_STORE_MAX_KEY bytes; values are binary blobs of at most
 * CT_STORE_MAX_VALUE bytes (NULL is allowed when the length is 0);
 * timeout_s > 0 is this call's limit in seconds, and a negative one means
 * the client's default. Errors as described in the overview. */

/* Stores a copy of value under key, replacing any earlier value, and wakes
 * the get()s and wait()s waiting for it. */
CT_API int ct_store_set(ct_store *store, const char *key, const void *value, size_t len,
                        double timeout_s);
/* Waits until key exists, then returns a copy of its value in *value
 * (malloc'd, NUL-terminated for convenience; the caller free()s it) and its
 * length in *len. On failure *value is NULL and *len 0. */
CT_API int ct_store_get(ct_store *store, const char *key, void **value, size_t *len,
                        double timeout_s);
/* Adds delta to the counter at key (an absent key counts as 0) and returns
 * the new total in *result (may be NULL). The value is stored as decimal
 * text, as torch's TCPStore does, so get() returns e.g. "8000". Applied
 * exactly once even when the request is resent. Errors: CT_EINVAL when the
 * current value is not a decimal integer, CT_ERANGE on int64 overflow. */
CT_API int ct_store_add(ct_store *store, const char *key, int64_t delta, int64_t *result,
                        double timeout_s);
/* Waits until every one of the nkeys (1 to CT_STORE_MAX_KEYS) keys exists.
 * The timeout message names the keys still missing. */
CT_API int ct_store_wait(ct_store *store, const char *const *keys, int nkeys, double timeout_s);
/* torch's compare_set: stores desired if key holds exactly expected, or if
 * key is absent and expected is empty (elen 0). Returns in *actual (malloc'd,
 * NUL-terminated; the caller free()s it) and *alen the value now stored, or,
 * when key is absent and expected is not empty, expected itself. */
CT_API int ct_store_compare_set(ct_store *store, const char *key, const void *expected, size_t elen,
                                const void *desired, size_t dlen, void **actual, size_t *alen,
                                double timeout_s);
/* Sets *all_exist to whether every one of the nkeys keys exists, without
 * waiting (torch's check). */
CT_API int ct_store_check(ct_store *store, const char *const *keys, int nkeys, bool *all_exist,
                          double timeout_s);
/* Removes key; *existed (may be NULL) tells whether it was there. */
CT_API int ct_store_delete(ct_store *store, const char *key, bool *existed, double timeout_s);

/* ------------------------------------------------------------------ init */

typedef struct ct_dist_options {
    /* "auto" (or NULL), "shm", "mpi", "nccl" or "gloo". auto: shm when every
     * rank is on one machine (ctlaunch with one node), gloo under ctlaunch
     * across machines (mpi in a build without gloo), mpi under mpirun
     * across machines. The environment variable CT_BACKEND, when set, overrides
     * auto. nccl gives CT_ENOTSUP until ct has CUDA tensors. */
    const char *backend;
    /* Seconds for rendezvous and for every collective; 0 takes CT_TIMEOUT
     * from the environment, else CT_COMM_DEFAULT_TIMEOUT. */
    double timeout_s;
} ct_dist_options;

/* Joins the job this process was launched into: reads the world
 * (ct_world_from_env), initializes MPI under an MPI launcher (local rank
 * and size then come from MPI_COMM_TYPE_SHARED), connects to ctlaunch's
 * store or hosts one on rank 0, exchanges what the backend needs (the
 * shared-memory segment name, the NCCL unique id) and builds the world
 * communicator. Under ctlaunch it also starts a heartbeat thread for
 * ctlaunch's --hang-timeout. Every rank calls it; opts may be NULL. A
 * world of one needs no launcher. Errors: CT_ESTATE if already
 * initialized; CT_EINVAL for a bad option or environment; CT_ENOTSUP for a
 * backend this build lacks; CT_ETIMEDOUT / CT_EPEER when peers or the store
 * do not answer, naming them. Not thread-safe: call it from one thread. */
CT_API int ct_dist_init(const ct_dist_options *opts);
/* Frees the groups, the world communicator and the store client (waiting
 * for issued collectives), stops the heartbeat and finalizes MPI if
 * ct_dist_init initialized it. Accepts being called when not initialized. */
CT_API void ct_dist_finalize(void);
CT_API bool ct_dist_is_initialized(void);
/* The world ct_dist_init found (local rank and size corrected under MPI);
 * NULL before init. Borrowed; invalid after ct_dist_finalize. */
CT_API const ct_world *ct_dist_world(void);
/* The world communicator; NULL before init. Borrowed; invalid after
 * ct_dist_finalize, which frees it. */
CT_API ct_comm *ct_dist_comm(void);
/* ct_dist_init's store client, for the thread that called init; NULL for a
 * world of one or before init. Borrowed; invalid after ct_dist_finalize. */
CT_API ct_store *ct_dist_store(void);
/* A process group of the world ranks listed (distinct, in [0, size)), in
 * that order: a collective over the world communicator, which every rank
 * calls with the same list. *out is the new communicator (owned by the
 * caller; free it before ct_dist_finalize) on listed ranks, NULL on the
 * others. */
CT_API int ct_dist_new_group(const int *ranks, int n, ct_comm **out);
/* Marks progress for ctlaunch's hang detection, for long stretches without
 * collectives (completed collectives on the world communicator count as
 * progress already; progress counts from ct_dist_init). Cheap; thread-safe;
 * a no-op before init. */
CT_API void ct_dist_heartbeat(void);

/* --------------------------------------------------------- data parallel */

/* Data-parallel training, PyTorch's DistributedDataParallel. Every rank
 * holds the same model and trains it on its own share of each batch;
 * gradients are averaged across ranks during backward, so every rank's
 * optimizer then takes the same step.
 *
 * Gradients live in one flat buffer that ct_ddp_new allocates: each
 * parameter's .grad becomes a view into it, and each bucket is a contiguous
 * range of it, so the allreduce needs no copy in or out. Buckets hold
 * parameters in the order their gradients are expected (reverse
 * registration order, then the order observed in the first iteration,
 * agreed across ranks): the first bucket is small, so that communication
 * starts early in backward, the others are capped. A post-accumulate hook
 * on every parameter marks it ready; a bucket whose parameters are all
 * ready starts its allreduce (average) at once, in the same bucket order on
 * every rank, while backward goes on; a callback at the end of backward
 * starts what is left and waits for everything, so when ct_tensor_backward
 * returns, the gradients are averaged.
 *
 * Keep the views: zero gradients with ct_optim_zero_grad(opt, false); with
 * set_to_none the next backward makes new gradient tensors, which the hook
 * copies back into the buckets (correct, one extra copy per parameter). */

/* The default first bucket's and other buckets' sizes, in bytes. */
#define CT_DDP_FIRST_BUCKET_BYTES (1 << 20)
#define CT_DDP_BUCKET_BYTES       (25 << 20)

/* Whether bucket allreduces overlap backward: THREAD starts each bucket as
 * it fills and the communicator's progress thread advances it while
 * backward computes; END turns that thread off (ct_comm_set_progress_thread,
 * until ct_ddp_free) and starts every bucket when backward ends, as one allreduce of the whole
 * gradient buffer (a machine without a spare core per rank has no core for the thread: measured,
 * the overlap cost more than it hid). AUTO takes THREAD with at least two cores per local rank, END
 * otherwise. */
typedef enum ct_ddp_progress {
    CT_DDP_PROGRESS_AUTO,
    CT_DDP_PROGRESS_THREAD,
    CT_DDP_PROGRESS_END,
} ct_ddp_progress;

/* What ct_ddp shards across its ranks (DeepSpeed's ZeRO stages; docs/sharding.md). Sharding
 * needs the model's parameters in one flat buffer (ct_module_flatten before ct_ddp_new) and
 * an optimizer made by ct_ddp_optim_new. Rank r of N owns the r-th N-th of the flat
 * parameters:
 *   OPTIMIZER (ZeRO-1): gradients are averaged as without sharding; each rank keeps the
 *     optimizer state of its share only and updates that share, and the step ends with an
 *     allgather of the parameters. Per parameter, fp32 AdamW: 4 + 4 + 8/N bytes.
 *   GRADIENTS (ZeRO-2): as OPTIMIZER, and each gradient leaves .grad as it arrives in
 *     backward for a bucket of the flat range that one rank owns; a full bucket is reduced
 *     (averaged) to its owner, so each rank keeps only its share's averaged gradients:
 *     4 + (4 + 8)/N bytes, plus two buckets of staging (the default bucket cap is then a
 *     sixteenth of the model, at most CT_DDP_BUCKET_BYTES). After backward, the
 *     parameters' .grad is NULL; the optimizer's parameters hold the averaged shard.
 *   FULL (ZeRO-3, FSDP): parameters too, per unit (options.units): each unit's
 *     parameters move into a buffer of their own, whose memory exists only while the unit
 *     computes: allgathered before its forward, handed back after it (unless
 *     keep_after_forward), gathered again before its backward, their gradients then
 *     reduce-scattered; the next unit's gather is in flight meanwhile. 16/N bytes, plus
 *     the units being used. The model must not be flattened. A parameter used outside its
 *     unit fails the op that uses it with CT_ESTATE naming the unit. ct_ddp_free is then a
 *     collective (every unit is gathered back into the model).
 * Under any, rebuild_buckets is not used (the buckets follow the shards) and
 * ct_ddp_set_comm_hook is refused. */
typedef enum ct_ddp_shard {
    CT_DDP_SHARD_NONE,
    CT_DDP_SHARD_OPTIMIZER,
    CT_DDP_SHARD_GRADIENTS,
    CT_DDP_SHARD_FULL,
} ct_ddp_shard;

typedef struct ct_ddp_options {
    int64_t first_bucket_bytes; /* 0: CT_DDP_FIRST_BUCKET_BYTES */
    int64_t bucket_bytes;       /* 0: CT_DDP_BUCKET_BYTES */
    /* A parameter that gets no gradient in an iteration (on any rank) is an
     * error naming it, unless this is set: then its gradient counts as zero
     * on the ranks that did not use it. */
    bool find_unused_parameters;
    /* The graph is the same every iteration: the first iteration counts
     * how many times each parameter's hook runs, so that a parameter used
     * in several reentrant backwards (activation checkpointing) is ready
     * after its last one. Without it, a second hook in one backward is an
     * error. The first iteration reduces everything at its end. */
    bool static_graph;
    /* Rebuild buckets after the first iteration in the order gradients
     * arrived (rank 0's order, broadcast). On by default in
     * ct_ddp_defaults(). */
    bool rebuild_buckets;
    /* Ranks may run out of batches at different times (ct_ddp_join): every
     * synchronized backward then starts with a one-element allreduce that
     * counts the ranks still training. */
    bool uneven_inputs;
    ct_ddp_progress progress; /* AUTO (0) by default */
    ct_ddp_shard shard;       /* NONE (0) by default */
    /* FULL: the units, modules of the model in forward order (none inside another; the
     * array is read by ct_ddp_new, the modules live as long as the model); the parameters
     * outside them form one more unit, gathered from the model's forward to the end of
     * backward. Every rank must run every unit's forward in the same order. 0 units: every
     * child of the model. */
    ct_module *const *units;
    int nunits;
    bool keep_after_forward; /* FULL: PyTorch's reshard_after_forward = false */
} ct_ddp_options;

typedef struct ct_ddp ct_ddp;

/* Replaces the allreduce of a bucket: start() begins communication of
 * bucket index (a flat float tensor of this rank's gradients) and returns a
 * work in *work; once that work completes, finish() (may be NULL) leaves
 * the bucket holding the average over ranks. Both run on the thread running
 * backward. Return 0 or a CT_E* code. free (may be NULL) releases ctx when
 * the hook is replaced or the ct_ddp freed. */
typedef struct ct_ddp_comm_hook {
    int (*start)(ct_comm *comm, ct_tensor *bucket, int index, void *ctx, ct_work **work);
    int (*finish)(ct_comm *comm, ct_tensor *bucket, int index, void *ctx);
    void (*free)(void *ctx);
    void *ctx;
} ct_ddp_comm_hook;

/* The defaults: the bucket sizes above, rebuild_buckets on, the rest off. */
CT_API ct_ddp_options ct_ddp_defaults(void);

/* Wraps model (its named parameters and buffers) for data-parallel
 * training on comm: a collective, every rank of comm calls it. It checks
 * that every rank holds the same parameters (names, shapes, dtypes, in the
 * same order) by comparing a hash, broadcasts rank 0's parameters and
 * buffers, builds the buckets and registers the hooks. Parameters must be
 * contiguous float tensors of one dtype that require grad. The caller
 * keeps model and comm alive until ct_ddp_free(). Errors (NULL returned):
 * CT_EMISMATCH on every rank when the models differ, with a per-parameter
 * diff against rank 0; CT_EINVAL / CT_EDTYPE for parameters it cannot
 * take; a collective's error. Not thread-safe: one thread trains. */
CT_API ct_ddp *ct_ddp_new(ct_comm *comm, ct_module *model, const ct_ddp_options *opts);
/* Removes the hooks and frees the buckets; each parameter keeps a copy of
 * its gradient. Accepts NULL. */
CT_API void ct_ddp_free(ct_ddp *ddp);

/* no_sync: while sync is false, backward accumulates gradients locally
 * without communication; the first backward after it is set true again
 * reduces the sum of all the micro-steps. */
CT_API int ct_ddp_set_sync(ct_ddp *ddp, bool sync);
/* Uneven inputs (needs uneven_inputs): a rank that has no more batches
 * calls this instead of its next step. It takes part in the other ranks'
 * gradient averaging with zero gradients until every rank has joined, then
 * returns 0; every rank calls it once at the end of the epoch. The average
 * stays over all ranks, so an iteration with k of n ranks training scales
 * the gradient by k / n (PyTorch's default). Errors: CT_ESTATE without
 * uneven_inputs, or a collective's error. */
CT_API int ct_ddp_join(ct_ddp *ddp);
/* Installs a hook that replaces the bucket allreduce (NULL restores it).
 * Every rank must install the same one. */
CT_API int ct_ddp_set_comm_hook(ct_ddp *ddp, const ct_ddp_comm_hook *hook);
/* The shipped hook: gradients travel as bfloat16 (half the bytes), are
 * averaged in float32 and rounded once, then widened back. Its state is
 * allocated here and freed by the ct_ddp it is installed in (ctx is NULL
 * when that allocation failed, which ct_ddp_set_comm_hook reports). */
CT_API ct_ddp_comm_hook ct_ddp_bf16_compress_hook(void);

/* The optimizer for ddp's model: without sharding, ct_optim_new_groups(opts, groups,
 * ngroups). Sharded, an optimizer over this rank's share: its parameters are 1-d pieces of
 * the model's parameters (views: a step writes the model), each piece's .grad the averaged
 * gradient there; its step updates the share and then allgathers the parameters, and its
 * zero_grad zeroes the gradients in place (set_to_none too: the pieces keep their views).
 * Groups name the model's parameters; one that no group names is not trained. One sharded
 * optimizer per ct_ddp at a time; free it before the ct_ddp (one that outlives it steps its
 * share alone). The caller owns the result. A collective only in its steps. Errors (NULL
 * returned): CT_EINVAL for a tensor that is not the model's, or named by two groups;
 * CT_ESTATE for a second sharded optimizer; ct_optim_new_groups's errors. */
CT_API ct_optim *ct_ddp_optim_new(ct_ddp *ddp, const ct_optim_options *opts,
                                  const ct_param_group *groups, int ngroups);
/* clip_grad_norm_ for ddp's model with opt (from ct_ddp_optim_new): the norm_type norm of
 * the averaged gradients of every rank together, one allreduce of a double when sharded;
 * every rank gets the same *total_norm_out (may be NULL) and scales its gradients alike.
 * Errors: ct_clip_grad_norm_p's, a collective's. A collective when sharded. */
CT_API int ct_ddp_clip_grad_norm(ct_ddp *ddp, ct_optim *opt, double max_norm, double norm_type,
                                 double *total_norm_out);
/* This rank's share of the flat parameters, [*lo, *hi) in elements (the whole range without
 * sharding). Errors: CT_EINVAL for a bad handle; CT_ESTATE under FULL (each unit is
 * sharded on its own). */
CT_API int ct_ddp_shard_range(const ct_ddp *ddp, int64_t *lo, int64_t *hi);
/* Under FULL, the model's parameters exist only while their unit computes: summon true
 * gathers every unit, so that the whole model can be read (to evaluate it, compare it,
 * save it whole), until a call with summon false hands them back (and each unit's next
 * forward gathers it anew); parameters read then must not be written. Without FULL a
 * no-op. A collective. Errors: CT_EINVAL for a bad handle, CT_ESTATE during a backward,
 * a collective's. */
CT_API int ct_ddp_summon_params(ct_ddp *ddp, bool summon);
/* Under FULL, this rank's part of model parameter `param` (in the order of
 * ct_module_named_parameters): *piece a new 1-d view of this rank's shard,
 * the parameter's elements [*offset, *offset + numel) in row-major order,
 * or NULL when the rank holds none of it. Reading and writing the view
 * read and write the shard in place, where a checkpoint saves and loads it
 * (ct_state_add_flat_shard); each unit gathers it anew before it computes.
 * The caller frees the view. Errors: CT_EINVAL for a bad handle, index or
 * NULL out pointer; CT_ESTATE without FULL (the parameters are whole). */
CT_API int ct_ddp_param_shard(const ct_ddp *ddp, int param, ct_tensor **piece, int64_t *offset);
/* What ddp shards (options.shard); NONE for a bad handle. */
CT_API ct_ddp_shard ct_ddp_stage(const ct_ddp *ddp);
/* Where parameter index of ddp's sharded optimizer comes from: *model_param, the model
 * parameter's index in registration order, and *offset, where the piece starts in that
 * parameter's elements (row-major). Without sharding the optimizer's parameters are the
 * model's: use ct_optim_param. Errors: CT_EINVAL for a bad handle or index, CT_ESTATE
 * without a live sharded optimizer. */
CT_API int ct_ddp_optim_param_source(const ct_ddp *ddp, int index, int *model_param,
                                     int64_t *offset);

/* The model state ddp and opt hold on this rank, in bytes: the parameters, the gradients
 * that persist between steps (the replicated buffer, or ZeRO-2's share), ZeRO-2's bucket
 * staging, and the optimizer's state. opt may be NULL (counted as 0). */
typedef struct ct_ddp_memory {
    int64_t params, grads, staging, optimizer;
} ct_ddp_memory;
CT_API int ct_ddp_memory_of(const ct_ddp *ddp, const ct_optim *opt, ct_ddp_memory *out);

/* ------------------------------------------------------------ memory plans */

/* A training run as ct_memory_plan replays it: the run's own code, called
 * back. The plan builds the model with its parameters on the meta device
 * (ct_nn_set_device), wraps it in ct_ddp over a dry communicator of
 * world_size ranks playing rank (CT_BACKEND_DRY), makes the optimizer and
 * takes `steps` training steps with every tensor on the meta device, so
 * that every allocation the run makes (parameters, flat and sharded
 * buffers, gathered units, buckets, activations, the saved graph, the
 * optimizer's state) is made, counted and freed in the run's order, and
 * none holds memory. */
typedef struct ct_memory_plan_config {
    int world_size; /* the run's ranks; 1: one process, without ct_ddp */
    int rank;       /* whose memory, in [0, world_size): shards differ at the end */
    /* Builds the model as the run does (its parameters go to the meta
     * device: make nothing on the CPU here). NULL with the error set. */
    ct_module *(*build)(void *ctx);
    /* Wraps it as the run does: ct_ddp_new(comm, model, the run's options).
     * NULL: ct_ddp_new with the defaults. Unused for one process. */
    ct_ddp *(*wrap)(void *ctx, ct_comm *comm, ct_module *model);
    /* The run's optimizer for the model (ddp NULL for one process). */
    ct_optim *(*optimizer)(void *ctx, ct_module *model, ct_ddp *ddp);
    /* One training step as the run takes it, in a scope of its own: a batch
     * made on device (ct_empty_on; its values do not matter), forward,
     * loss, backward, clipping, ct_optim_step, zero_grad. Values read back
     * (ct_item) are 0. 0 or a CT_E* code. */
    int (*step)(void *ctx, ct_module *model, ct_ddp *ddp, ct_optim *opt, ct_device device);
    void *ctx;
    int steps; /* 0: 2 (the first makes the optimizer's state) */
} ct_memory_plan_config;

/* What the replay held, in bytes on this rank. */
typedef struct ct_memory_estimate {
    int64_t peak;       /* the most at once during the steps: the step's peak */
    int64_t setup_peak; /* the most while the model, ct_ddp and optimizer were made */
    int64_t resident;   /* held after the last step: what persists between steps */
    /* Held on the host after the last step besides: what ct keeps there for
     * a model on any device (the optimizer's step counts). A run on the CPU
     * holds it too, on top of peak and resident. */
    int64_t host;
    ct_ddp_memory state; /* the model state in resident (ct_ddp_memory_of's split) */
} ct_memory_estimate;

/* Plans a run's per-rank memory before it runs: the peak of a training step
 * for the model, batch, optimizer, stage (ct_ddp_options.shard) and
 * activation checkpointing the callbacks use, from a shape-only dry run
 * (above) that allocates nothing but headers. A real run's peak adds what
 * the run keeps outside its model and steps (a dataset in ct tensors),
 * and, with the progress thread, ordering within a step may differ a
 * little (docs/sharding.md has the measured agreement). The default
 * generator is left as it was. Plans run one at a time (a lock; the meta
 * device's counters are the process's). Errors: CT_EINVAL for a bad config
 * (no build, optimizer or step; a rank outside the world), and the
 * callbacks' own, returned as they gave them. */
CT_API int ct_memory_plan(const ct_memory_plan_config *cfg, ct_memory_estimate *out);

/* Buckets, for inspection: how many, and the parameter names of bucket i
 * in order (borrowed until the buckets change, NULL-terminated). */
CT_API int ct_ddp_num_buckets(const ct_ddp *ddp);
CT_API const char *const *ct_ddp_bucket_names(const ct_ddp *ddp, int bucket);

#ifdef __cplusplus
}
#endif

#endif
