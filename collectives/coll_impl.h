/* ct collectives internal header: not installed, not part of the API.
 *
 * comm.c owns the parts every backend shares: argument checks, staging of
 * non-contiguous tensors, the queue of issued work, the executor that
 * drives it (on the progress thread or on a waiting caller), timeouts and
 * the failed state. A backend is a table of non-blocking functions; it
 * never sleeps and never waits for a peer itself.
 */
#ifndef CT_COLL_IMPL_H
#define CT_COLL_IMPL_H

#include <ct/collectives.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#define CT__MSG_LEN 1024

typedef enum ct__op {
    CT__ALLREDUCE,
    CT__BROADCAST,
    CT__REDUCE,
    CT__ALLGATHER,
    CT__REDUCE_SCATTER,
    CT__ALLTOALL,
    CT__BARRIER,
    CT__SEND,
    CT__RECV,
    CT__NOPS
} ct__op;

const char *ct__coll_op_name(int op);
static inline bool ct__op_is_p2p(int op) { return op == CT__SEND || op == CT__RECV; }
static inline bool ct__op_reduces(int op) {
    return op == CT__ALLREDUCE || op == CT__REDUCE || op == CT__REDUCE_SCATTER;
}
static inline bool ct__op_has_root(int op) { return op == CT__BROADCAST || op == CT__REDUCE; }

/* What one call asks for. For a collective, every rank's must be equal. */
typedef struct ct__coll_desc {
    uint64_t
        seq; /* collectives: 1, 2, ... per communicator; p2p: 1, 2, ... per peer and direction */
    int32_t op, dtype, rop;
    int32_t root; /* broadcast/reduce: the root; send: the destination; recv: the source */
    int32_t tag;  /* send/recv */
    /* Elements: numel(t) for allreduce, broadcast, reduce, send and recv;
     * numel(in) for allgather and alltoall; numel(out) for reduce_scatter;
     * 0 for barrier. */
    int64_t count;
} ct__coll_desc;

/* "allreduce #12 (float32, 1000 elements, sum)" into buf. */
const char *ct__coll_desc_str(char *buf, size_t n, const ct__coll_desc *d);
/* Appends which field of rank ra's descriptor a and rank rb's b differ,
 * with both values: "the root differs: root 0 on rank 0, root 1 on rank
 * 1". For a send and the recv that takes it, the op and the peer are not
 * compared (they pair by construction). Nothing when they agree. */
void ct__coll_desc_differ(char *buf, size_t n, const ct__coll_desc *a, int ra,
                          const ct__coll_desc *b, int rb);
/* "allreduce: ranks disagree: rank 0 has allreduce #3 (...), rank r has
 * ... (the count differs: ...)" into buf (n bytes): how a backend that
 * compares every rank's descriptor with rank 0's reports the first that
 * differs, its own op being op. */
void ct__coll_disagree_msg(char *buf, size_t n, int op, const ct__coll_desc *first,
                           const ct__coll_desc *other, int r);
/* Whether two ranks' descriptors of the same collective agree. */
bool ct__coll_desc_match(const ct__coll_desc *a, const ct__coll_desc *b);
/* A hash of what ct__coll_desc_match compares, in 62 bits so that -fp cannot
 * overflow: backends that check agreement with one small allreduce of
 * {fp, -fp} (max) use it. */
int64_t ct__coll_desc_fingerprint(const ct__coll_desc *d);

enum { CT__WORK_QUEUED, CT__WORK_STARTED, CT__WORK_DONE };

/* Backend state kept in each work, so that issuing allocates nothing. */
#define CT__WORK_BACKEND_BYTES 256

struct ct_work {
    ct_comm *comm; /* holds a reference */
    ct__coll_desc desc;
    /* Contiguous data the backend reads (in) and writes (out). For
     * allreduce, broadcast, reduce, send and recv in == out. */
    void *in, *out;
    /* References held until completion: contiguous tensors for in and out
     * (the caller's own, or copies of non-contiguous ones), and the
     * caller's out when this rank writes it: on success it is copied into
     * from out_ref when that is a copy, and its version is bumped. */
    ct_tensor *in_ref, *out_ref, *out_user;
    atomic_int state;
    /* Device backends: the operation is queued on the device, so a wait can
     * order the compute stream after it (ct__work_launched). */
    atomic_bool launched;
    int err; /* 0 or the CT_E* code, valid once state is DONE */
    char msg[CT__MSG_LEN];
    double deadline; /* monotonic seconds, set when started */
    ct_work *next;   /* the communicator's queue */
    bool heap;       /* from ct_work_free's pool; false for a blocking call's */
    _Alignas(64) unsigned char be[CT__WORK_BACKEND_BYTES];
};

/* The progress of one pass over a work. */
enum { CT__PENDING = 0, CT__DONE = 1, CT__AGAIN = 2 };

typedef struct ct__backend {
    ct_backend kind;
    /* Seconds a work may run past the communicator's timeout before comm.c
     * times it out: for a backend whose parts time out first and know
     * better whom they waited for (hier). Usually 0. */
    double deadline_margin;
    /* Sets c->impl; every rank of the group calls it. May block up to
     * c->timeout while peers join (the one place a backend may wait).
     * Returns 0 or a CT_E* code with the message recorded. */
    int (*init)(ct_comm *c, const ct_comm_config *cfg);
    /* Frees c->impl; nothing is queued or active any more. */
    void (*destroy)(ct_comm *c);
    /* Whether t's device suits the backend: 0 or CT_EDEVICE with a message
     * naming op. */
    int (*check_tensor)(ct_comm *c, const char *op, const ct_tensor *t);
    /* Optional: the device whose tensors the backend takes; CPU when NULL. */
    ct_device (*device)(const ct_comm *c);
    /* Optional: called on the issuing thread once w's tensors are staged,
     * before w is queued (device backends: mark the point of the compute
     * stream that w must follow). 0, or a CT_E* code with the error
     * recorded: w is then not issued. */
    int (*issue)(ct_comm *c, ct_work *w);
    /* Optional, with issue: called by ct_work_wait on the waiting thread
     * once w->launched is set and w is not done, to order the device's
     * compute stream after w instead of waiting on the host. 0 or a CT_E*
     * code with the error recorded. */
    int (*order)(ct_comm *c, ct_work *w);
    /* Begins w, in issue order, without blocking. CT__DONE / CT__PENDING,
     * CT__AGAIN when it cannot begin yet (an earlier work must progress
     * first; the executor retries it and keeps collectives in issue order),
     * or a CT_E* code with w->msg set. */
    int (*start)(ct_comm *c, ct_work *w);
    /* Advances a started w without blocking: CT__DONE, CT__PENDING,
     * CT__AGAIN (still pending, but a part of it moved: the executor polls
     * on instead of backing off, as after a completion), or a CT_E* code
     * with w->msg set. */
    int (*progress)(ct_comm *c, ct_work *w);
    /* Called when a pass over the active works made no progress, at most
     * every few milliseconds: notices peers that died or failed the group.
     * 0, or a CT_E* code with msg (CT__MSG_LEN bytes) set. */
    int (*poll)(ct_comm *c, char *msg);
    /* w passed its deadline: writes "; ranks that did not arrive: 2, 3" or
     * whatever the backend can tell about the peers into msg (CT__MSG_LEN
     * bytes, already holding the start of the message, to append to). */
    void (*describe_timeout)(ct_comm *c, const ct_work *w, char *msg);
    /* The group failed with msg: tell the peers if the transport can, so
     * that theirs fail promptly too. Active works are abandoned after this
     * (cancel them if the transport needs it). May be NULL. */
    void (*abort)(ct_comm *c, int code, const char *msg);
    /* Makes the communicator of split's group: this rank's new rank and
     * size are given; color and index (the how-many-th split of c) tell
     * groups apart. Runs on the caller after the split's exchange. Returns
     * the new communicator or NULL with the error recorded. NULL when
     * split_direct is set. */
    ct_comm *(*split)(ct_comm *c, int color, uint64_t index, int new_rank, int new_size,
                      const int *new_to_old);
    /* Optional, for transports whose split exchanges color and key itself
     * (ncclCommSplit): replaces comm.c's exchange and split. Every rank of
     * c calls it, CT_COMM_SPLIT_NONE ones too (they get *out = NULL and 0).
     * Returns 0 or a CT_E* code with the message recorded. */
    int (*split_direct)(ct_comm *c, int color, int key, ct_comm **out);
    /* Optional: zero-filled memory of bytes (> 0, the same on every rank,
     * already checked) that every rank's transport reaches, for
     * ct_comm_zeros. Every rank calls it. Returns 0 with *out a storage the
     * caller owns, or 0 with *out NULL on every rank when some rank could
     * not make its part (the caller uses private memory then), or a CT_E*
     * code with the error recorded when the communicator failed. */
    int (*alloc_shared)(ct_comm *c, size_t bytes, ct_storage **out);
} ct__backend;

extern const ct__backend ct__shm_backend;
/* The most ranks a shm communicator takes: its segment (about 0.8 MiB per
 * rank) then needs about 3.3 GiB. */
#define CT__SHM_MAX_RANKS 4096
/* The bytes of a shm communicator's segment for n ranks, into *bytes: 0,
 * or CT_EINVAL (recorded) when n is not in [1, CT__SHM_MAX_RANKS]. */
int ct__shm_layout_bytes(int n, size_t *bytes);
extern const ct__backend ct__hier_backend;
extern const ct__backend ct__dry_backend;
#ifdef CT_HAVE_MPI
extern const ct__backend ct__mpi_backend;
#endif
#ifdef CT_HAVE_GLOO
extern const ct__backend ct__gloo_backend;
#endif
#ifdef CT_HAVE_NCCL
extern const ct__backend ct__nccl_backend;
/* ncclGetUniqueId into id (CT_NCCL_ID_BYTES bytes), for ct_comm_nccl_id. */
int ct__nccl_unique_id(void *id);
#endif

struct ct_comm {
    const ct__backend *be;
    void *impl; /* the backend's */
    int rank, size;
    _Atomic double timeout;
    atomic_long refs; /* the owner's and one per live work */

    pthread_mutex_t mu;       /* guards everything below up to the executor's own */
    pthread_cond_t cv_thread; /* for the progress thread: work to take, or stop */
    pthread_cond_t cv_done;   /* for waiters: a work completed, or the executor is free */
    atomic_int waiters;       /* threads waiting on cv_done */
    /* Issued, not started, in order. The head is atomic so that an idle
     * executor can see an empty queue without taking mu on every pass. */
    ct_work *_Atomic queue_head;
    ct_work *queue_tail;
    bool executing; /* a thread runs the executor */
    bool stopping;  /* ct_comm_free: the progress thread ends */
    bool thread_started;
    bool caller_progress; /* async work advances only on callers' threads */
    pthread_t thread;
    ct_work *pool; /* freed heap works, reused */
    uint64_t splits;

    /* Issue side (one issuing thread at a time). */
    uint64_t next_seq;
    uint64_t *send_seq, *recv_seq; /* per peer */

    /* The executor's own: only the thread running it touches these. */
    ct_work **active;
    int nactive, cap_active;

    /* Set once, when the group fails. */
    atomic_int failed;
    char fail_msg[CT__MSG_LEN];

    atomic_uint_fast64_t issued, completed;
    atomic_uint_fast64_t direct;           /* counted by the backend: ct_comm_stats's */
    _Atomic unsigned char recent_ops[256]; /* op of collective seq, at seq % 256 */
};

/* Monotonic seconds: ct__now (tensor_impl.h). */

/* Appends printf-style text to the string in buf (n bytes), truncating. */
void ct__coll_msg_append(char *buf, size_t n, const char *fmt, ...) CT_PRINTF(3, 4);

/* A device backend queued w on the device: sets w->launched and wakes the
 * threads waiting for it. Executor only. */
void ct__work_launched(ct_comm *c, ct_work *w);

/* Records the error for w (code and formatted message); returns code. */
int ct__work_fail(ct_work *w, int code, const char *fmt, ...) CT_PRINTF(3, 4);

/* Allocates a communicator shell for a backend's init/split, with rank,
 * size and timeout set (the caller fills impl). NULL on CT_ENOMEM. */
ct_comm *ct__comm_alloc(const ct__backend *be, int rank, int size, double timeout);
/* Frees a shell whose backend init failed (impl is NULL). */
void ct__comm_discard(ct_comm *c);
/* Starts the progress thread of a communicator whose impl is ready and
 * returns it; on failure frees it (impl included) and returns NULL with the
 * error recorded. */
ct_comm *ct__comm_activate(ct_comm *c);

/* Every rank's n int64 values (mine) into all (size x n), on the host,
 * through tensors on the backend's device: a blocking allgather. Returns 0
 * or the collective's CT_E* code. */
int ct__comm_allgather_host(ct_comm *c, const int64_t *mine, int64_t n, int64_t *all);
/* Fails c's group with code and msg, as its own executor would (its
 * backend tells the peers; every queued and active work fails), waiting
 * for a thread that executes c to leave first. For a communicator that
 * another one drives (the hierarchical one's parts). */
void ct__comm_fail(ct_comm *c, int code, const char *msg);
/* Where no thread executes c: checks its works' deadlines and its peers
 * (the backend's poll), as an idle executor does. Returns c's failure (its
 * code, with its message copied into msg, CT__MSG_LEN bytes) or 0. */
int ct__comm_check(ct_comm *c, char *msg);

/* Whether a step went well on every rank: *first_failed is the lowest rank
 * whose ok was false, or -1. Returns 0, or the CT_E* code of the
 * collective that carries the answer (the communicator failed). */
int ct__comm_agree(ct_comm *c, bool ok, int *first_failed);

/* ------------------------------------------------------------ reductions */

/* Reductions go through an accumulator type: float32 for float16 and
 * bfloat16, the dtype itself otherwise. Buffers named acc hold it; buffers
 * named src / out hold the dtype. Arguments may alias when they have the
 * same type. */
size_t ct__coll_acc_size(ct_dtype dtype);
/* acc := src */
void ct__coll_acc_load(void *acc, const void *src, int64_t n, ct_dtype dtype);
/* acc_out := acc_in (op) src */
void ct__coll_acc_combine(void *acc_out, const void *acc_in, const void *src, int64_t n,
                          ct_dtype dtype, ct_reduce_op op);
/* out := finish(acc_in (op) src): divided by nranks for avg. */
void ct__coll_acc_finish(void *out, const void *acc_in, const void *src, int64_t n, ct_dtype dtype,
                         ct_reduce_op op, int nranks);
/* out := finish(acc) */
void ct__coll_acc_store(void *out, const void *acc, int64_t n, ct_dtype dtype, ct_reduce_op op,
                        int nranks);

#endif
