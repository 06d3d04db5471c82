/* The nccl collectives backend: CUDA tensors, moved by NCCL on a
 * communication stream of the communicator's own.
 *
 * Streams. Each communicator has a non-blocking CUDA stream for its NCCL
 * calls. Issuing a work records an event (`ready`) on ct's compute stream
 * of the device, on the issuing thread, so that the operation follows the
 * compute work queued before the call and none queued after it: a bucket
 * of gradients issued during backward does not wait for the rest of
 * backward. The communication stream waits for that event just before the
 * operation's own NCCL call (the agreement check does not need the data).
 * Another event (`done`), recorded after the NCCL call, tells progress
 * when the work is done, and lets ct_work_wait order the compute stream
 * after it (order) once the call is queued (ct__work_launched), without
 * waiting on the host. start and progress only enqueue and query: they
 * never wait for the device. A staged (non-contiguous) output is copied
 * back on the compute stream, which then waits for the operation at the
 * point where it is launched: the price of a non-contiguous output.
 *
 * Memory. Issuing marks the tensors' blocks as used by the communication
 * stream (the device table's record_stream): the caching allocator then holds a
 * freed block back until the communication stream's work on it is done,
 * even when the work ended by failing while a copy was still queued.
 *
 * Agreement check. Before each collective, the ranks allreduce (max) a
 * fingerprint of its descriptor as {fp, -fp}: every rank sees fp and -fp
 * come back unchanged exactly when all fingerprints are equal. Only then is
 * the operation itself launched. On a disagreement every rank gathers every
 * rank's descriptor and fails with CT_EMISMATCH, naming who issued what. A
 * barrier is the check alone. NCCL calls must be issued in the same order
 * on every rank, so a work whose check is in flight holds back the start of
 * later works (`busy`): the NCCL order is check 1, op 1, check 2, op 2, ...
 * everywhere. The price: each collective waits for the one before it to
 * finish (its check queues behind it on the stream) and for a round trip to
 * the host before it launches.
 *
 * Point to point. Sends and receives have no check (NCCL has no tags: the
 * tag is not checked either). NCCL's send completes only once the peer
 * receives, and a communicator's operations run in order on its stream, so
 * two ranks that both send to each other before receiving wait for each
 * other until the timeout; one side must receive first.
 *
 * Non-blocking communicators. Communicators are created non-blocking (NCCL
 * 2.14 and later), so that init and split can time out instead of hanging.
 * On such a communicator an NCCL call may return ncclInProgress before it
 * has enqueued anything; progress then polls ncclCommGetAsyncError, and only
 * once NCCL reports ncclSuccess is the completion event recorded and the
 * next NCCL call made.
 *
 * Numerics. NCCL reduces float16 and bfloat16 in their own type, not in
 * float32 as the CPU backends do, so a float16 sum may differ from theirs in
 * the last bits (widening to float32 around the call would double the
 * bytes moved). bool reduces as uint8 with max (sum, max: logical or) and
 * min (prod, min: logical and).
 *
 * Threads. The executor runs start, progress, poll, describe_timeout and
 * abort on one thread at a time; split runs on the caller's thread
 * meanwhile. impl->mu serializes NCCL calls on the communicator between the
 * two. The executor only try-locks it in start, progress and poll (and tries
 * again later), so it never blocks there; abort waits for a split in
 * progress, which is bounded by the timeout.
 */
#include "coll_impl.h"
#include "device_impl.h"
#include "tensor_impl.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
/* nccl.h declares ncclGroupStart() and others without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 13, 0)
#error "the nccl backend needs NCCL 2.13 or newer (ncclAvg, ncclBfloat16, ncclRemoteError)"
#endif
/* Non-blocking communicators (ncclConfig_t, ncclCommFinalize). */
#define CT__NCCL_NONBLOCKING (NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0))
#define CT__NCCL_SPLIT       (NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0))

/* What both sides of the agreement check use; the device holds one copy,
 * pinned host memory its mirror. */
typedef struct nccl_scratch {
    int64_t check[2];      /* {fp, -fp}, reduced with max */
    ct__coll_desc descs[]; /* (size): every rank's descriptor, after a disagreement */
} nccl_scratch;

typedef struct nccl_impl {
    ncclComm_t comm; /* NULL once aborted */
    int device, rank, size;
    cudaStream_t stream;      /* the communication stream */
    nccl_scratch *dev, *host; /* device scratch, and its pinned host mirror */
    /* The work whose agreement check is in flight, or whose NCCL call is not
     * enqueued yet: later works wait for it. */
    ct_work *busy;
    /* Collectives whose NCCL calls are all enqueued, for split: see
     * lock_idle. */
    uint64_t launched;
    /* Works' events: every one created (freed with the communicator, so
     * abandoned works leak none) and those not in use. */
    cudaEvent_t *events, *idle;
    int nevents, nidle, cap;
    pthread_mutex_t mu; /* see Threads above */
} nccl_impl;

enum { STAGE_CHECK, STAGE_DIAGNOSE, STAGE_RUN };

/* ct's compute stream on the communicator's device, where tensor ops queue
 * their work (the CUDA device table's stream). */
static int compute_stream(const nccl_impl *n, void **stream) {
    return ct__device_ops_of(CT_CUDA)->stream(n->device, stream);
}

/* t's blocks are used by the communication stream until its work so far is
 * done (the table's record_stream). */
static int record_on_comm(const nccl_impl *n, ct_tensor *t) {
    return ct__device_ops_of(CT_CUDA)->record_stream(t, n->stream);
}

/* Each work's state, in w->be. */
typedef struct nccl_work {
    cudaEvent_t ready; /* recorded on the compute stream at issue */
    cudaEvent_t done;  /* recorded after the current stage's NCCL call */
    int64_t fp;        /* the descriptor's fingerprint, for collectives */
    int stage;
    bool enqueued; /* NCCL has enqueued the current stage's call */
} nccl_work;
_Static_assert(sizeof(nccl_work) <= CT__WORK_BACKEND_BYTES, "nccl_work does not fit in w->be");

static nccl_work *work_state(ct_work *w) { return (nccl_work *)w->be; }

static size_t scratch_bytes(int size) {
    return sizeof(nccl_scratch) + (size_t)size * sizeof(ct__coll_desc);
}

/* ---------------------------------------------------------------- messages */

/* "cudaErrorMemoryAllocation: out of memory" */
static const char *cuda_text(char *buf, size_t n, cudaError_t e) {
    snprintf(buf, n, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    return buf;
}

/* NCCL's text for r, with its last error message when it kept one. */
static const char *nccl_text(char *buf, size_t n, ncclComm_t comm, ncclResult_t r) {
    const char *last = ncclGetLastError(comm);
    if (last && *last)
        snprintf(buf, n, "%s (%s)", ncclGetErrorString(r), last);
    else
        snprintf(buf, n, "%s", ncclGetErrorString(r));
    return buf;
}

/* A remote error means a peer died or failed; anything else is NCCL's or
 * CUDA's own failure on this rank. */
static int nccl_code(ncclResult_t r) { return r == ncclRemoteError ? CT_EPEER : CT_EFOREIGN; }

/* --------------------------------------------------------- current device */

/* CUDA's current device is per thread, and this backend runs both on ct's
 * progress thread and on the user's threads (ct_comm_new, split, free, and
 * ct_work_wait, which may run the executor). Each entry point makes the
 * communicator's device current, then gives the caller its device back,
 * but only where that device already has a context: cudaSetDevice creates
 * one (CUDA 12 and later), and restoring a thread's never-chosen default,
 * device 0, would cost every rank a context on GPU 0. */
typedef CUresult (*primary_ctx_state_fn)(CUdevice dev, unsigned int *flags, int *active);
static primary_ctx_state_fn primary_ctx_state;
static pthread_once_t primary_ctx_state_once = PTHREAD_ONCE_INIT;

static void primary_ctx_state_lookup(void) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 11030,
                                                     cudaEnableDefault, &found);
#else
    cudaError_t e =
        cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &fn, cudaEnableDefault, &found);
#endif
    if (e == cudaSuccess && found == cudaDriverEntryPointSuccess)
        primary_ctx_state = (primary_ctx_state_fn)fn;
}

typedef struct device_scope {
    int prev;
    bool switched;
} device_scope;

static cudaError_t device_enter(int device, device_scope *s) {
    s->switched = false;
    cudaError_t e = cudaGetDevice(&s->prev);
    if (e != cudaSuccess || s->prev == device)
        return e;
    e = cudaSetDevice(device);
    s->switched = e == cudaSuccess;
    return e;
}

static void device_leave(const device_scope *s) {
    if (!s->switched)
        return;
    pthread_once(&primary_ctx_state_once, primary_ctx_state_lookup);
    unsigned int flags = 0;
    int active = 1;
    if (primary_ctx_state && primary_ctx_state((CUdevice)s->prev, &flags, &active) != CUDA_SUCCESS)
        active = 1;
    if (active)
        cudaSetDevice(s->prev);
}

/* ------------------------------------------------------- NCCL's own state */

static void sleep_ns(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Waits until NCCL has finished the non-blocking call last made on comm
 * (init, split, finalize) or the deadline (ct__now() seconds) passes. Only
 * init, split and destroy wait, on the user's thread; the executor never
 * does. Returns NCCL's state: ncclInProgress after the deadline. */
static ncclResult_t wait_ready(ncclComm_t comm, double deadline) {
    long ns = 20000;
    for (;;) {
        ncclResult_t state;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess)
            return r;
        if (state != ncclInProgress || ct__now() >= deadline)
            return state;
        sleep_ns(ns);
        ns = ns < 1000000 ? ns * 2 : 1000000;
    }
}

/* 0, or the CT_E* code of an error NCCL recorded on the communicator (a
 * failed kernel, a dead peer), with its text in buf. */
static int comm_async_error(nccl_impl *n, char *buf, size_t len) {
    ncclResult_t state;
    ncclResult_t r = ncclCommGetAsyncError(n->comm, &state);
    if (r == ncclSuccess)
        r = state;
    if (r == ncclSuccess || r == ncclInProgress)
        return 0;
    nccl_text(buf, len, n->comm, r);
    return nccl_code(r);
}

/* Tears down a communicator no work uses any more: finalizes it (which
 * waits for the peers' side) up to timeout seconds, then destroys it; aborts
 * it instead when NCCL recorded an error or finalizing does not finish in
 * time. */
static void comm_release(ncclComm_t comm, double timeout) {
    ncclResult_t state;
    bool clean = ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclSuccess;
#if CT__NCCL_NONBLOCKING
    if (clean) {
        ncclResult_t r = ncclCommFinalize(comm);
        clean = (r == ncclSuccess || r == ncclInProgress) &&
                wait_ready(comm, ct__now() + timeout) == ncclSuccess;
    }
#else
    (void)timeout;
#endif
    if (clean)
        ncclCommDestroy(comm);
    else
        ncclCommAbort(comm);
}

/* --------------------------------------------------------- communicators */

/* Frees n with its NCCL communicator (if any); runs on n's device. */
static void impl_free(nccl_impl *n, double timeout) {
    if (n->comm)
        comm_release(n->comm, timeout);
    /* A check's copy into the scratch may still be queued behind a work
     * that ended by failing (aborting ends NCCL's kernels, so it runs
     * soon): let it run before the scratch goes. */
    if (n->stream)
        cudaStreamSynchronize(n->stream);
    for (int i = 0; i < n->nevents; i++)
        cudaEventDestroy(n->events[i]);
    if (n->stream)
        cudaStreamDestroy(n->stream);
    cudaFree(n->dev);
    cudaFreeHost(n->host);
    free(n->events);
    free(n->idle);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

/* The state of a communicator on device (current already) without its NCCL
 * communicator: the stream and the scratch. what names
 * the operation in errors. */
static int impl_new(const char *what, int rank, int size, int device, nccl_impl **out) {
    *out = NULL;
    nccl_impl *n = calloc(1, sizeof *n);
    if (!n)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", what);
    n->device = device;
    n->rank = rank;
    n->size = size;
    pthread_mutex_init(&n->mu, NULL);
    const char *call = "cudaStreamCreateWithFlags";
    cudaError_t e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) {
        call = "cudaMalloc";
        e = cudaMalloc((void **)&n->dev, scratch_bytes(size));
    }
    if (e == cudaSuccess) {
        call = "cudaMallocHost";
        e = cudaMallocHost((void **)&n->host, scratch_bytes(size));
    }
    if (e != cudaSuccess) {
        char text[256];
        int rc = ct__err_set(CT_EFOREIGN, "%s: rank %d of %d: %s on cuda:%d failed: %s", what, rank,
                             size, call, device, cuda_text(text, sizeof text, e));
        impl_free(n, 0);
        return rc;
    }
    *out = n;
    return 0;
}

static int nccl_init_on_device(ct_comm *c, const ct_comm_config *cfg, nccl_impl *n) {
    double timeout = atomic_load(&c->timeout);
    ncclUniqueId id;
    memcpy(&id, cfg->nccl_id, sizeof id);
#if CT__NCCL_NONBLOCKING
    const char *call = "ncclCommInitRankConfig";
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, c->size, id, c->rank, &config);
    if (r == ncclSuccess || r == ncclInProgress)
        r = wait_ready(n->comm, ct__now() + timeout);
    if (r == ncclInProgress)
        return ct__err_set(
            CT_ETIMEDOUT,
            "nccl init: rank %d of %d on cuda:%d: the NCCL communicator did not form "
            "within %g s (NCCL cannot tell which ranks did not join; check that "
            "every rank got the same nccl_id and called ct_comm_new)",
            c->rank, c->size, n->device, timeout);
#else
    /* Without non-blocking communicators, init cannot time out. */
    const char *call = "ncclCommInitRank";
    ncclResult_t r = ncclCommInitRank(&n->comm, c->size, id, c->rank);
#endif
    if (r != ncclSuccess) {
        char text[512];
        return ct__err_set(nccl_code(r), "nccl init: rank %d of %d on cuda:%d: %s failed: %s",
                           c->rank, c->size, n->device, call,
                           nccl_text(text, sizeof text, n->comm, r));
    }
    return 0;
}

static int nccl_init(ct_comm *c, const ct_comm_config *cfg) {
    if (!cfg->nccl_id)
        return ct__err_set(CT_EINVAL,
                           "nccl init: rank %d of %d: config.nccl_id is NULL (rank 0 makes it with "
                           "ncclGetUniqueId and hands it to the other ranks)",
                           c->rank, c->size);
    char text[256];
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess)
        return ct__err_set(CT_EFOREIGN, "nccl init: rank %d of %d: cudaGetDeviceCount failed: %s",
                           c->rank, c->size, cuda_text(text, sizeof text, e));
    if (cfg->device < 0 || cfg->device >= ndev)
        return ct__err_set(CT_EINVAL,
                           "nccl init: rank %d of %d: config.device is %d, but this process sees "
                           "%d CUDA device(s)",
                           c->rank, c->size, cfg->device, ndev);
    device_scope ds;
    e = device_enter(cfg->device, &ds);
    if (e != cudaSuccess)
        return ct__err_set(CT_EFOREIGN, "nccl init: rank %d of %d: cudaSetDevice(%d) failed: %s",
                           c->rank, c->size, cfg->device, cuda_text(text, sizeof text, e));
    nccl_impl *n;
    int rc = impl_new("nccl init", c->rank, c->size, cfg->device, &n);
    if (rc == 0)
        rc = nccl_init_on_device(c, cfg, n);
    if (rc == 0)
        c->impl = n;
    else if (n)
        impl_free(n, 0);
    device_leave(&ds);
    return rc;
}

static void nccl_destroy(ct_comm *c) {
    nccl_impl *n = c->impl;
    if (!n)
        return;
    device_scope ds;
    device_enter(n->device, &ds);
    impl_free(n, atomic_load(&c->timeout));
    device_leave(&ds);
    c->impl = NULL;
}

static int nccl_check_tensor(ct_comm *c, const char *op, const ct_tensor *t) {
    const nccl_impl *n = c->impl;
    ct_device d = t->storage->device;
    if (ct_device_equal(d, (ct_device){CT_CUDA, n->device}))
        return 0;
    char dev[CT_DEVICE_STR];
    return ct__err_set(CT_EDEVICE,
                       "%s: the nccl backend takes CUDA tensors on the communicator's device "
                       "cuda:%d; got a tensor on %s",
                       op, n->device, ct_device_str(d, dev));
}

static ct_device nccl_device(const ct_comm *c) {
    const nccl_impl *n = c->impl;
    return (ct_device){CT_CUDA, n->device};
}

int ct__nccl_unique_id(void *id) {
    ncclUniqueId u;
    _Static_assert(sizeof u == CT_NCCL_ID_BYTES, "CT_NCCL_ID_BYTES is not NCCL's id size");
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return ct__err_set(r == ncclRemoteError ? CT_EPEER : CT_EFOREIGN,
                           "comm_nccl_id: ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return 0;
}

/* ---------------------------------------------------------------- events */

/* Returns rc after releasing what w holds: its event, and the right to
 * start the next work. Every end of a work, success or failure, passes
 * here. */
static int work_end(nccl_impl *n, ct_work *w, int rc) {
    nccl_work *nw = work_state(w);
    if (nw->done) {
        n->idle[n->nidle++] = nw->done;
        nw->done = NULL;
    }
    if (nw->ready) {
        n->idle[n->nidle++] = nw->ready;
        nw->ready = NULL;
    }
    if (n->busy == w)
        n->busy = NULL;
    return rc;
}

static int fail_cuda(nccl_impl *n, ct_work *w, const char *call, cudaError_t e) {
    char desc[256], text[256];
    return work_end(n, w,
                    ct__work_fail(w, CT_EFOREIGN, "%s: %s on cuda:%d failed: %s",
                                  ct__coll_desc_str(desc, sizeof desc, &w->desc), call, n->device,
                                  cuda_text(text, sizeof text, e)));
}

/* An idle event, or a new one (the pool grows to the most works ever in
 * flight at once, two events each). Runs on n's device. */
static cudaError_t event_take(nccl_impl *n, cudaEvent_t *out) {
    if (n->nidle > 0) {
        *out = n->idle[--n->nidle];
        return cudaSuccess;
    }
    if (n->nevents == n->cap) {
        int cap = n->cap ? 2 * n->cap : 16;
        cudaEvent_t *events = realloc(n->events, (size_t)cap * sizeof *events);
        if (events)
            n->events = events;
        cudaEvent_t *idle = events ? realloc(n->idle, (size_t)cap * sizeof *idle) : NULL;
        if (!idle)
            return cudaErrorMemoryAllocation;
        n->idle = idle;
        n->cap = cap;
    }
    cudaError_t e = cudaEventCreateWithFlags(out, cudaEventDisableTiming);
    if (e == cudaSuccess)
        n->events[n->nevents++] = *out;
    return e;
}

/* ------------------------------------------------------------- launching */

static ncclDataType_t nccl_dtype(ct_dtype dtype) {
    switch (dtype) {
    case CT_FLOAT32: return ncclFloat32;
    case CT_FLOAT64: return ncclFloat64;
    case CT_BFLOAT16: return ncclBfloat16;
    case CT_FLOAT16: return ncclFloat16;
    case CT_INT64: return ncclInt64;
    case CT_INT32: return ncclInt32;
    case CT_UINT8: return ncclUint8;
    case CT_BOOL: return ncclUint8;
    case CT_NDTYPES: break;
    }
    CT_ASSERT(!"unknown dtype");
}

static ncclRedOp_t nccl_redop(ct_dtype dtype, ct_reduce_op op) {
    bool logical = dtype == CT_BOOL;
    switch (op) {
    case CT_REDUCE_SUM: return logical ? ncclMax : ncclSum;
    case CT_REDUCE_PROD: return logical ? ncclMin : ncclProd;
    case CT_REDUCE_MIN: return ncclMin;
    case CT_REDUCE_MAX: return ncclMax;
    case CT_REDUCE_AVG: CT_ASSERT(!logical); return ncclAvg;
    }
    CT_ASSERT(!"unknown reduction");
}

/* The NCCL call behind each stage, for messages. */
static const char *stage_call(const ct_work *w, int stage) {
    static const char *const calls[CT__NOPS] = {
        [CT__ALLREDUCE] = "ncclAllReduce",
        [CT__BROADCAST] = "ncclBroadcast",
        [CT__REDUCE] = "ncclReduce",
        [CT__ALLGATHER] = "ncclAllGather",
        [CT__REDUCE_SCATTER] = "ncclReduceScatter",
        [CT__ALLTOALL] = "ncclSend/ncclRecv group",
        [CT__SEND] = "ncclSend",
        [CT__RECV] = "ncclRecv",
    };
    if (stage == STAGE_CHECK)
        return "ncclAllReduce (agreement check)";
    if (stage == STAGE_DIAGNOSE)
        return "ncclAllGather (every rank's descriptor)";
    return calls[w->desc.op];
}

static int fail_nccl(nccl_impl *n, ct_work *w, ncclResult_t r) {
    char desc[256], text[512];
    return work_end(n, w,
                    ct__work_fail(w, nccl_code(r), "%s: %s on cuda:%d failed: %s",
                                  ct__coll_desc_str(desc, sizeof desc, &w->desc),
                                  stage_call(w, work_state(w)->stage), n->device,
                                  nccl_text(text, sizeof text, n->comm, r)));
}

/* Alltoall as one group of sends and receives: block p of in to rank p,
 * block p of out from it. */
static ncclResult_t launch_alltoall(nccl_impl *n, ct_work *w, ncclDataType_t dt) {
    size_t block = (size_t)w->desc.count / (size_t)n->size;
    size_t bytes = block * ct__esize((ct_dtype)w->desc.dtype);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
        return r;
    for (int p = 0; p < n->size && r == ncclSuccess; p++) {
        r = ncclSend((const char *)w->in + (size_t)p * bytes, block, dt, p, n->comm, n->stream);
        if (r == ncclSuccess)
            r = ncclRecv((char *)w->out + (size_t)p * bytes, block, dt, p, n->comm, n->stream);
    }
    /* A started group is always ended; the first error wins. */
    ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
}

static ncclResult_t launch_op(nccl_impl *n, ct_work *w) {
    const ct__coll_desc *d = &w->desc;
    ncclDataType_t dt = nccl_dtype((ct_dtype)d->dtype);
    size_t count = (size_t)d->count;
    switch ((ct__op)d->op) {
    case CT__ALLREDUCE:
        return ncclAllReduce(w->in, w->out, count, dt, nccl_redop((ct_dtype)d->dtype, d->rop),
                             n->comm, n->stream);
    case CT__BROADCAST: return ncclBroadcast(w->in, w->out, count, dt, d->root, n->comm, n->stream);
    case CT__REDUCE:
        return ncclReduce(w->in, w->out, count, dt, nccl_redop((ct_dtype)d->dtype, d->rop), d->root,
                          n->comm, n->stream);
    case CT__ALLGATHER: return ncclAllGather(w->in, w->out, count, dt, n->comm, n->stream);
    case CT__REDUCE_SCATTER:
        return ncclReduceScatter(w->in, w->out, count, dt, nccl_redop((ct_dtype)d->dtype, d->rop),
                                 n->comm, n->stream);
    case CT__ALLTOALL: return launch_alltoall(n, w, dt);
    case CT__SEND: return ncclSend(w->in, count, dt, d->root, n->comm, n->stream);
    case CT__RECV: return ncclRecv(w->out, count, dt, d->root, n->comm, n->stream);
    case CT__BARRIER: /* the agreement check is the barrier */
    case CT__NOPS: break;
    }
    CT_ASSERT(!"no NCCL call for this operation");
}

/* What the stage's NCCL call needs first: the check's input copied to the
 * device (the pinned host scratch is reused only after the previous check
 * completed), or, for the operation, the compute work issued before it. */
static cudaError_t stage_prepare(nccl_impl *n, ct_work *w) {
    nccl_work *nw = work_state(w);
    if (nw->stage == STAGE_RUN)
        return cudaStreamWaitEvent(n->stream, nw->ready, 0);
    if (nw->stage == STAGE_CHECK) {
        n->host->check[0] = nw->fp;
        n->host->check[1] = -nw->fp;
        return cudaMemcpyAsync(n->dev->check, n->host->check, sizeof n->host->check,
                               cudaMemcpyHostToDevice, n->stream);
    }
    if (nw->stage == STAGE_DIAGNOSE) {
        n->host->descs[n->rank] = w->desc;
        return cudaMemcpyAsync(&n->dev->descs[n->rank], &n->host->descs[n->rank],
                               sizeof(ct__coll_desc), cudaMemcpyHostToDevice, n->stream);
    }
    return cudaSuccess;
}

static ncclResult_t stage_launch(nccl_impl *n, ct_work *w) {
    switch (work_state(w)->stage) {
    case STAGE_CHECK:
        return ncclAllReduce(n->dev->check, n->dev->check, 2, ncclInt64, ncclMax, n->comm,
                             n->stream);
    case STAGE_DIAGNOSE:
        return ncclAllGather(&n->dev->descs[n->rank], n->dev->descs, sizeof(ct__coll_desc),
                             ncclUint8, n->comm, n->stream);
    default: return launch_op(n, w);
    }
}

/* A staged output goes back into the caller's tensor on the compute
 * stream, after the operation: comm.c's complete() would copy it only once
 * the host saw the work done, after ops the caller queued meanwhile. */
static int copy_back(nccl_impl *n, ct_work *w) {
    if (!w->out_user || w->out_user == w->out_ref)
        return 0;
    void *compute;
    int rc = compute_stream(n, &compute);
    if (rc == 0) {
        cudaError_t e = cudaStreamWaitEvent(compute, work_state(w)->done, 0);
        if (e != cudaSuccess)
            return fail_cuda(n, w, "cudaStreamWaitEvent (compute stream)", e);
        rc = ct__tensor_copy_any(w->out_user, w->out_ref);
    }
    if (rc != 0) {
        char desc[256];
        return work_end(n, w,
                        ct__work_fail(w, rc, "%s: copying the result back: %s",
                                      ct__coll_desc_str(desc, sizeof desc, &w->desc), ct_errmsg()));
    }
    ct__tensor_bump_version(w->out_user);
    ct_tensor_free(w->out_user);
    w->out_user = NULL;
    return 0;
}

/* NCCL has enqueued the stage's call: copies its result back to the host
 * and records the completion event. */
static int stage_enqueued(nccl_impl *n, ct_work *w) {
    nccl_work *nw = work_state(w);
    cudaError_t e = cudaSuccess;
    if (nw->stage == STAGE_CHECK)
        e = cudaMemcpyAsync(n->host->check, n->dev->check, sizeof n->host->check,
                            cudaMemcpyDeviceToHost, n->stream);
    else if (nw->stage == STAGE_DIAGNOSE)
        e = cudaMemcpyAsync(n->host->descs, n->dev->descs, (size_t)n->size * sizeof(ct__coll_desc),
                            cudaMemcpyDeviceToHost, n->stream);
    if (e != cudaSuccess)
        return fail_cuda(n, w, "cudaMemcpyAsync", e);
    e = cudaEventRecord(nw->done, n->stream);
    if (e != cudaSuccess)
        return fail_cuda(n, w, "cudaEventRecord", e);
    nw->enqueued = true;
    if (nw->stage != STAGE_RUN)
        return CT__PENDING;
    if (n->busy == w) {
        n->busy = NULL;
        n->launched += !ct__op_is_p2p(w->desc.op);
    }
    int rc = copy_back(n, w);
    if (rc != 0)
        return rc;
    ct__work_launched(w->comm, w);
    return CT__PENDING;
}

static int stage_begin(nccl_impl *n, ct_work *w, int stage) {
    nccl_work *nw = work_state(w);
    nw->stage = stage;
    nw->enqueued = false;
    cudaError_t e = stage_prepare(n, w);
    if (e != cudaSuccess)
        return fail_cuda(n, w, stage == STAGE_RUN ? "cudaStreamWaitEvent" : "cudaMemcpyAsync", e);
    ncclResult_t r = stage_launch(n, w);
    if (r == ncclInProgress)
        return CT__PENDING; /* progress records the event once NCCL has enqueued */
    if (r != ncclSuccess)
        return fail_nccl(n, w, r);
    return stage_enqueued(n, w);
}

/* The ranks agree: a barrier is complete (its check was the barrier), any
 * other collective launches. */
static int agreed(nccl_impl *n, ct_work *w) {
    if (w->desc.op == CT__BARRIER) {
        n->launched++;
        return work_end(n, w, CT__DONE);
    }
    return stage_begin(n, w, STAGE_RUN);
}

/* "ranks 0-2, 5 have" for the ranks whose descriptor matches leader's (no
 * rank before leader does). */
static void append_ranks(char *msg, size_t cap, const ct__coll_desc *descs, int size, int leader) {
    int count = 0;
    for (int r = leader; r < size; r++)
        count += ct__coll_desc_match(&descs[r], &descs[leader]);
    ct__coll_msg_append(msg, cap, count == 1 ? "rank " : "ranks ");
    const char *sep = "";
    for (int r = leader; r < size; r++) {
        if (!ct__coll_desc_match(&descs[r], &descs[leader]))
            continue;
        int last = r;
        while (last + 1 < size && ct__coll_desc_match(&descs[last + 1], &descs[leader]))
            last++;
        if (last > r)
            ct__coll_msg_append(msg, cap, "%s%d-%d", sep, r, last);
        else
            ct__coll_msg_append(msg, cap, "%s%d", sep, r);
        sep = ", ";
        r = last;
    }
    ct__coll_msg_append(msg, cap, count == 1 ? " has" : " have");
}

/* Every rank's descriptor is on the host: every rank sees the same data and
 * so reaches the same verdict, and fails with the same message. */
static int diagnosed(nccl_impl *n, ct_work *w) {
    enum { MAX_VARIANTS = 8 };
    const ct__coll_desc *descs = n->host->descs;
    int leaders[MAX_VARIANTS], nvariants = 0;
    bool more = false;
    for (int r = 0; r < n->size; r++) {
        int v = 0;
        while (v < nvariants && !ct__coll_desc_match(&descs[r], &descs[leaders[v]]))
            v++;
        if (v < nvariants)
            continue;
        if (nvariants < MAX_VARIANTS)
            leaders[nvariants++] = r;
        else
            more = true;
    }
    /* The fingerprints differed, and they hash exactly what ct__coll_desc_match
     * compares. */
    CT_ASSERT(nvariants > 1);
    char msg[CT__MSG_LEN] = "", desc[256];
    ct__coll_msg_append(msg, sizeof msg, "%s #%llu: ranks disagree: ", ct__coll_op_name(w->desc.op),
                        (unsigned long long)w->desc.seq);
    for (int v = 0; v < nvariants; v++) {
        ct__coll_msg_append(msg, sizeof msg, "%s", v ? "; " : "");
        append_ranks(msg, sizeof msg, descs, n->size, leaders[v]);
        ct__coll_msg_append(msg, sizeof msg, " %s",
                            ct__coll_desc_str(desc, sizeof desc, &descs[leaders[v]]));
    }
    if (more)
        ct__coll_msg_append(msg, sizeof msg, "; and more");
    ct__coll_msg_append(msg, sizeof msg, " (");
    ct__coll_desc_differ(msg, sizeof msg, &descs[leaders[0]], leaders[0], &descs[leaders[1]],
                         leaders[1]);
    ct__coll_msg_append(msg, sizeof msg, ")");
    return work_end(n, w, ct__work_fail(w, CT_EMISMATCH, "%s", msg));
}

/* ------------------------------------------------------------- executor */

/* On the issuing thread: w's events, `ready` recorded on the compute
 * stream, and its tensors marked as used by the communication stream. */
static int issue_locked(nccl_impl *n, ct_work *w) {
    nccl_work *nw = work_state(w);
    *nw = (nccl_work){0};
    void *compute;
    int rc = compute_stream(n, &compute);
    if (rc != 0)
        return rc;
    const char *call = "cudaEventCreateWithFlags";
    cudaError_t e = event_take(n, &nw->ready);
    if (e == cudaSuccess)
        e = event_take(n, &nw->done);
    if (e == cudaSuccess) {
        call = "cudaEventRecord (compute stream)";
        e = cudaEventRecord(nw->ready, compute);
    }
    if (e != cudaSuccess) {
        char desc[256], text[256];
        work_end(n, w, 0);
        return ct__err_set(e == cudaErrorMemoryAllocation ? CT_ENOMEM : CT_EFOREIGN,
                           "%s: %s on cuda:%d failed: %s",
                           ct__coll_desc_str(desc, sizeof desc, &w->desc), call, n->device,
                           cuda_text(text, sizeof text, e));
    }
    if ((w->in_ref && (rc = record_on_comm(n, w->in_ref))) ||
        (w->out_ref && (rc = record_on_comm(n, w->out_ref))))
        work_end(n, w, 0);
    return rc;
}

static int nccl_issue(ct_comm *c, ct_work *w) {
    nccl_impl *n = c->impl;
    pthread_mutex_lock(&n->mu);
    device_scope ds;
    cudaError_t e = device_enter(n->device, &ds);
    int rc = e == cudaSuccess ? issue_locked(n, w) : 0;
    device_leave(&ds);
    pthread_mutex_unlock(&n->mu);
    if (e != cudaSuccess) {
        char text[256];
        rc = ct__err_set(CT_EFOREIGN, "%s: cudaSetDevice(%d) failed: %s",
                         ct__coll_op_name(w->desc.op), n->device, cuda_text(text, sizeof text, e));
    }
    return rc;
}

/* ct_work_wait on a launched work: ct's compute stream waits for it. A
 * work whose events went back to the pool is done on the device. */
static int nccl_order(ct_comm *c, ct_work *w) {
    nccl_impl *n = c->impl;
    nccl_work *nw = work_state(w);
    int rc = 0;
    pthread_mutex_lock(&n->mu);
    if (nw->done) {
        device_scope ds;
        void *compute;
        cudaError_t e = device_enter(n->device, &ds);
        if (e == cudaSuccess && (rc = compute_stream(n, &compute)) == 0)
            e = cudaStreamWaitEvent(compute, nw->done, 0);
        device_leave(&ds);
        if (e != cudaSuccess) {
            char desc[256], text[256];
            rc = ct__err_set(CT_EFOREIGN, "%s: ordering the compute stream of cuda:%d after it: %s",
                             ct__coll_desc_str(desc, sizeof desc, &w->desc), n->device,
                             cuda_text(text, sizeof text, e));
        }
    }
    pthread_mutex_unlock(&n->mu);
    return rc;
}

static int start_locked(nccl_impl *n, ct_work *w) {
    nccl_work *nw = work_state(w);
    char desc[256];
    if (!n->comm)
        return work_end(n, w,
                        ct__work_fail(w, CT_ESTATE, "%s: the NCCL communicator was aborted",
                                      ct__coll_desc_str(desc, sizeof desc, &w->desc)));
    if (n->busy)
        return CT__AGAIN;
    n->busy = w;
    if (ct__op_is_p2p(w->desc.op))
        return stage_begin(n, w, STAGE_RUN);
    nw->fp = ct__coll_desc_fingerprint(&w->desc);
    return stage_begin(n, w, STAGE_CHECK);
}

static int progress_locked(nccl_impl *n, ct_work *w) {
    nccl_work *nw = work_state(w);
    char desc[256], text[512];
    if (!n->comm)
        return work_end(n, w,
                        ct__work_fail(w, CT_ESTATE, "%s: the NCCL communicator was aborted",
                                      ct__coll_desc_str(desc, sizeof desc, &w->desc)));
    if (!nw->enqueued) {
        ncclResult_t state;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &state);
        if (r == ncclSuccess && state == ncclInProgress)
            return CT__PENDING;
        if (r == ncclSuccess)
            r = state;
        if (r != ncclSuccess)
            return fail_nccl(n, w, r);
        int rc = stage_enqueued(n, w);
        if (rc != CT__PENDING)
            return rc;
    }
    cudaError_t e = cudaEventQuery(nw->done);
    if (e == cudaErrorNotReady) {
        int rc = comm_async_error(n, text, sizeof text);
        if (rc == 0)
            return CT__PENDING;
        return work_end(n, w,
                        ct__work_fail(w, rc, "%s: NCCL failed on cuda:%d: %s",
                                      ct__coll_desc_str(desc, sizeof desc, &w->desc), n->device,
                                      text));
    }
    if (e != cudaSuccess)
        return fail_cuda(n, w, "cudaEventQuery", e);
    switch (nw->stage) {
    case STAGE_CHECK:
        if (n->host->check[0] == nw->fp && n->host->check[1] == -nw->fp)
            return agreed(n, w);
        return stage_begin(n, w, STAGE_DIAGNOSE);
    case STAGE_DIAGNOSE: return diagnosed(n, w);
    default: return work_end(n, w, CT__DONE);
    }
}

/* Runs fn on n's device with n->mu held; busy_rc when split holds it. */
static int run_locked(nccl_impl *n, ct_work *w, int (*fn)(nccl_impl *, ct_work *), int busy_rc) {
    if (pthread_mutex_trylock(&n->mu) != 0)
        return busy_rc;
    device_scope ds;
    cudaError_t e = device_enter(n->device, &ds);
    int rc = e == cudaSuccess ? fn(n, w) : fail_cuda(n, w, "cudaSetDevice", e);
    device_leave(&ds);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

static int nccl_start(ct_comm *c, ct_work *w) {
    return run_locked(c->impl, w, start_locked, CT__AGAIN);
}

static int nccl_progress(ct_comm *c, ct_work *w) {
    return run_locked(c->impl, w, progress_locked, CT__PENDING);
}

static int nccl_poll(ct_comm *c, char *msg) {
    nccl_impl *n = c->impl;
    if (pthread_mutex_trylock(&n->mu) != 0)
        return 0;
    int rc = 0;
    char text[512];
    device_scope ds;
    if (n->comm && device_enter(n->device, &ds) == cudaSuccess) {
        rc = comm_async_error(n, text, sizeof text);
        device_leave(&ds);
    }
    if (rc != 0)
        snprintf(msg, CT__MSG_LEN, "the NCCL communicator (rank %d of %d on cuda:%d) failed: %s",
                 n->rank, n->size, n->device, text);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

/* NCCL cannot tell which ranks did not arrive: say where this rank is.
 * Ranks cannot compare their issued counts (c->issued) over NCCL, but
 * under ctlaunch the heartbeat carries them, and ctlaunch's hang detection
 * names the ranks that fell behind. */
static void nccl_describe_timeout(ct_comm *c, const ct_work *w, char *msg) {
    const nccl_impl *n = c->impl;
    const nccl_work *nw = (const nccl_work *)w->be;
    const char *where = !nw->enqueued            ? "NCCL had not finished enqueuing it"
                        : nw->stage == STAGE_RUN ? "it was running on the communication stream"
                                                 : "this rank was in the agreement check before it";
    ct__coll_msg_append(msg, CT__MSG_LEN,
                        "; %s on cuda:%d; NCCL cannot tell which ranks did not arrive", where,
                        n->device);
}

/* The watchdog's path: the executor calls it once when the communicator
 * fails (a timeout, a peer's or NCCL's error). Aborting stops this rank's
 * NCCL kernels, so the stream drains; NCCL does not tell the peers, which
 * notice through their own errors or timeouts. */
static void nccl_abort(ct_comm *c, int code, const char *msg) {
    (void)code;
    (void)msg;
    nccl_impl *n = c->impl;
    pthread_mutex_lock(&n->mu);
    if (n->comm) {
        device_scope ds;
        device_enter(n->device, &ds);
        ncclCommAbort(n->comm);
        device_leave(&ds);
        n->comm = NULL;
    }
    n->busy = NULL;
    pthread_mutex_unlock(&n->mu);
}

/* ----------------------------------------------------------------- split */

#if CT__NCCL_SPLIT
/* Takes n->mu once every collective issued before the split has all its
 * NCCL calls enqueued, waiting on the caller's thread while the executor
 * gets them going. Otherwise a rank could enter ncclCommSplit (holding
 * n->mu, so that its executor cannot launch) while a peer waits, before its
 * own split, for this rank's agreement check of an earlier collective:
 * neither would ever move. A collective that never gets going times out in
 * the executor, which aborts the communicator. */
static int lock_idle(ct_comm *c, nccl_impl *n, double deadline) {
    long ns = 20000;
    for (;;) {
        pthread_mutex_lock(&n->mu);
        if (!n->comm || (!n->busy && n->launched == atomic_load(&c->issued)))
            return 0;
        pthread_mutex_unlock(&n->mu);
        if (ct__now() >= deadline)
            return ct__err_set(CT_ETIMEDOUT,
                               "split: rank %d of %d: the operations issued before the split did "
                               "not get started in time",
                               n->rank, n->size);
        sleep_ns(ns);
        ns = ns < 1000000 ? ns * 2 : 1000000;
    }
}

/* ncclCommSplit of n's communicator, on n's device with n->mu held. Every
 * rank of the parent calls it, those leaving with NCCL_SPLIT_NOCOLOR
 * (*child stays NULL for them). */
static int split_nccl(nccl_impl *n, int color, int key, double timeout, ncclComm_t *child) {
    if (!n->comm)
        return ct__err_set(CT_ESTATE, "split: the NCCL communicator was aborted");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    double deadline = ct__now() + timeout;
    ncclResult_t r = ncclCommSplit(n->comm, color, key, child, &config);
    if (r == ncclSuccess || r == ncclInProgress)
        r = wait_ready(n->comm, deadline);
    if (r == ncclSuccess && *child)
        r = wait_ready(*child, deadline);
    if (r == ncclSuccess)
        return 0;
    int rc;
    if (r == ncclInProgress) {
        rc =
            ct__err_set(CT_ETIMEDOUT,
                        "split: rank %d of %d on cuda:%d: ncclCommSplit did not finish within %g s "
                        "(NCCL cannot tell which ranks did not call it)",
                        n->rank, n->size, n->device, timeout);
    } else {
        char text[512];
        rc = ct__err_set(nccl_code(r), "split: rank %d of %d on cuda:%d: ncclCommSplit failed: %s",
                         n->rank, n->size, n->device, nccl_text(text, sizeof text, n->comm, r));
    }
    if (*child)
        ncclCommAbort(*child);
    *child = NULL;
    return rc;
}

/* A ct_comm around an NCCL communicator ready for use, on device (current
 * already); takes ownership of nc. Its rank and size are NCCL's. */
static int comm_wrap(ncclComm_t nc, int device, double timeout, ct_comm **out) {
    int rank = 0, size = 0;
    ncclResult_t r = ncclCommUserRank(nc, &rank);
    if (r == ncclSuccess)
        r = ncclCommCount(nc, &size);
    if (r != ncclSuccess) {
        char text[512];
        ncclCommAbort(nc);
        return ct__err_set(CT_EFOREIGN, "split: ncclCommUserRank/ncclCommCount failed: %s",
                           nccl_text(text, sizeof text, nc, r));
    }
    ct_comm *c = ct__comm_alloc(&ct__nccl_backend, rank, size, timeout);
    if (!c) {
        ncclCommAbort(nc);
        return CT_ENOMEM;
    }
    nccl_impl *n;
    int rc = impl_new("split", rank, size, device, &n);
    if (rc != 0) {
        ncclCommAbort(nc);
        ct__comm_discard(c);
        return rc;
    }
    n->comm = nc;
    c->impl = n;
    if (!(*out = ct__comm_activate(c)))
        return ct_errcode();
    return 0;
}
#endif

/* Splits c by color, ordering each new group by key (then by rank in c),
 * with ncclCommSplit exchanging color and key itself. Every rank of c calls
 * it (ncclCommSplit is collective over c), CT_COMM_SPLIT_NONE ones too:
 * they get *out = NULL and 0. Blocks the caller up to c's timeout. */
static int nccl_split_direct(ct_comm *c, int color, int key, ct_comm **out) {
    nccl_impl *n = c->impl;
    *out = NULL;
#if CT__NCCL_SPLIT
    double timeout = atomic_load(&c->timeout);
    int rc = lock_idle(c, n, ct__now() + timeout);
    if (rc != 0)
        return rc;
    device_scope ds;
    cudaError_t e = device_enter(n->device, &ds);
    if (e != cudaSuccess) {
        char text[256];
        rc = ct__err_set(CT_EFOREIGN, "split: cudaSetDevice(%d) failed: %s", n->device,
                         cuda_text(text, sizeof text, e));
    } else {
        ncclComm_t child = NULL;
        rc = split_nccl(n, color == CT_COMM_SPLIT_NONE ? NCCL_SPLIT_NOCOLOR : color, key, timeout,
                        &child);
        if (rc == 0 && child)
            rc = comm_wrap(child, n->device, timeout, out);
        device_leave(&ds);
    }
    pthread_mutex_unlock(&n->mu);
    return rc;
#else
    (void)color;
    (void)key;
    return ct__err_set(CT_ENOTSUP,
                       "split: rank %d of %d: ncclCommSplit needs NCCL 2.18 or newer; ct was built "
                       "with NCCL %d.%d.%d",
                       n->rank, n->size, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#endif
}

const ct__backend ct__nccl_backend = {
    .kind = CT_BACKEND_NCCL,
    .init = nccl_init,
    .destroy = nccl_destroy,
    .check_tensor = nccl_check_tensor,
    .device = nccl_device,
    .issue = nccl_issue,
    .order = nccl_order,
    .start = nccl_start,
    .progress = nccl_progress,
    .poll = nccl_poll,
    .describe_timeout = nccl_describe_timeout,
    .abort = nccl_abort,
    .split_direct = nccl_split_direct,
};
