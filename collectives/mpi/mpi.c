/* The mpi backend: ct collectives on MPI-3 non-blocking operations.
 *
 * Every communicator keeps three duplicates of the MPI_Comm it was given:
 *   data: the operations themselves, and send/recv with the user's tags;
 *   ctl:  the agreement check ahead of every collective, the descriptor
 *         ahead of every send, and ct_comm_split's group creation;
 *   svc:  a small service that answers peers' "how many collectives have
 *         you issued?" (so that a timeout names the ranks that did not
 *         arrive) and receives their failure notices.
 *
 * Agreement. A collective runs in two stages. A 2-element MPI_MAX allreduce
 * of {fp, -fp}, fp a fingerprint of the descriptor, tells every rank at once
 * whether all agree (max(fp) == min(fp)); only then is the real operation
 * posted. On disagreement every rank gathers every rank's descriptor and
 * fails with the same CT_EMISMATCH message. One work at a time is in the
 * check stage, which keeps the data operations posted in issue order on
 * every rank, as MPI requires. A recv compares the descriptor that goes
 * ahead of the matching send with its own.
 *
 * Numerics. float16 and bfloat16 reduce in a float32 copy (ct__coll_acc_load,
 * then ct__coll_acc_store back); avg is MPI_SUM divided in ct__coll_acc_store; bool
 * reduces with MPI_LOR (sum, max) and MPI_LAND (prod, min). Moves carry
 * elements as unsigned integers of the dtype's size. Counts are MPI-3 ints:
 * check_tensor refuses tensors of more than INT_MAX elements.
 *
 * Threads. The progress threads of every communicator, and the callers of
 * ct_comm_new and ct_comm_split, call MPI. One process-wide mutex
 * serializes every MPI call ct makes, at every thread level: the calls are
 * short and never block, and a lock ThreadSanitizer can see orders them
 * where Open MPI's internal locking (not instrumented) cannot be checked.
 * Below MPI_THREAD_MULTIPLE the application must not call MPI itself while
 * a ct mpi communicator exists, since a progress thread may call MPI at any
 * moment. Within one communicator the executor (one thread at a
 * time) runs start, progress, poll, describe_timeout and abort; split runs
 * on the caller at the same time and uses only ctl, on which no other
 * collective is in flight then. Free every communicator before
 * MPI_Finalize.
 *
 * Failure. MPI cannot cancel a collective. When the group fails, requests
 * still in flight are abandoned, but MPI may still write into their buffers
 * if a late peer turns up. abort therefore keeps the storages of those
 * works' tensors alive, their staging buffers are never reused, and destroy
 * leaves the impl block and the three communicators to MPI: deliberate,
 * bounded leaks, only after a failure. abort also sends the failure to
 * every peer, whose poll (or next start) then fails their group with
 * CT_EPEER, so that a late rank does not join a collective the others
 * abandoned. Failures every rank detects itself (a collective's mismatch)
 * send no notice.
 *
 * Queries are answered from poll, which the executor calls every few
 * milliseconds, also while the communicator is idle. A rank whose progress
 * thread is stuck in a blocking foreign call cannot answer, and the
 * timed-out rank reports "no answer from ranks ..." for it.
 */
#include "coll_impl.h"
#include "tensor_impl.h"

#include <mpi.h>

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Tags on ctl (p2p traffic there never uses others). */
enum { TAG_P2P_DESC = 1, TAG_SPLIT = 2 };
/* Tags on svc. */
enum { TAG_QUERY = 1, TAG_ANSWER = 2, TAG_FAIL = 3 };

/* How long describe_timeout waits for peers to answer. */
#define DESCRIBE_WAIT_S 1.0
/* Service messages handled per pump, so that a flood cannot stall a pass. */
#define PUMP_MAX 64

/* ------------------------------------------------------------ the lock */

static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;

static void mpi_lock(void) { pthread_mutex_lock(&mpi_mu); }

static void mpi_unlock(void) { pthread_mutex_unlock(&mpi_mu); }

/* ------------------------------------------------------------- state */

/* A staging buffer. Each work in flight owns at most two; they return to
 * the communicator's pool, so a steady workload allocates nothing. */
typedef struct scratch {
    struct scratch *next;
    size_t cap;
    max_align_t data[];
} scratch;

typedef struct mpi_work mpi_work;

typedef struct mpi_impl {
    MPI_Comm data, ctl, svc;
    int tag_ub;         /* MPI_TAG_UB: the largest user tag */
    scratch *pool;      /* free staging buffers */
    mpi_work *inflight; /* works with MPI requests posted */
    ct_work *checking;  /* the work in the check stage, or NULL */
    bool group_knows;   /* the failure is one every rank detects itself */
    /* MPI requests were left in flight: MPI may still use this block and
     * the communicators, so destroy leaves them (freeing a communicator
     * under a pending libnbc schedule crashes Open MPI later). */
    bool abandoned;

    /* The service. svc_code/svc_msg: the first problem it met (a peer's
     * failure notice, CT_EPEER, or an MPI error, CT_EFOREIGN), which poll
     * reports. */
    MPI_Request svc_req; /* the receive, always posted while it works */
    int svc_code;
    char svc_msg[CT__MSG_LEN];
    MPI_Request *reply_req, *notice_req; /* per peer */
    uint64_t *reply;                     /* per peer: the answer in flight */
    int64_t *answer;                     /* per peer: issued count, -1 unknown */
    int *verdict;                        /* per peer: describe_timeout's */

    /* Buffers MPI reads or writes asynchronously. */
    int64_t fp[2];          /* the check stage's allreduce */
    char note[CT__MSG_LEN]; /* this rank's failure notice */
    char svc_buf[CT__MSG_LEN];
} mpi_impl;

/* Stages of a work. */
enum { MW_CHECK, MW_GATHER, MW_DATA, MW_P2P_DESC, MW_P2P_DATA };

/* Kept in ct_work.be. */
struct mpi_work {
    ct_work *w;
    mpi_work *prev, *next; /* mpi_impl.inflight */
    /* The float32 copy a 16-bit reduction works in, or the descriptor a
     * send carries or a recv receives; NULL when none is needed. */
    scratch *stage;
    /* After a failed check: every rank's descriptor, then a group index
     * per rank. */
    scratch *gather;
    MPI_Request req[2]; /* p2p: [0] the descriptor, [1] the data */
    int state;
    bool linked;
};
_Static_assert(sizeof(mpi_work) <= CT__WORK_BACKEND_BYTES, "mpi_work must fit in ct_work.be");

static mpi_work *mw_of(ct_work *w) { return (mpi_work *)(void *)w->be; }

/* ----------------------------------------------------------- helpers */

static void nap(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* MPI's text for an error code into buf (MPI_MAX_ERROR_STRING bytes); call
 * with the lock held. */
static const char *mpi_errtext(int rc, char *buf) {
    int len = 0;
    if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS)
        snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
    return buf;
}

/* Records a failed MPI call outside any work; returns CT_EFOREIGN. Lock held. */
static int mpi_fail(const char *what, const char *call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    return ct__err_set(CT_EFOREIGN, "mpi: %s: %s failed: %s", what, call, mpi_errtext(rc, text));
}

/* Fails w for a failed MPI call; returns CT_EFOREIGN. Lock held. */
static int work_mpi_fail(ct_work *w, const char *call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    return ct__work_fail(w, CT_EFOREIGN, "%s #%llu: %s failed: %s", ct__coll_op_name(w->desc.op),
                         (unsigned long long)w->desc.seq, call, mpi_errtext(rc, text));
}

static const char *thread_level_name(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
    }
}

static int count_key(const int *key, int size, int want) {
    int count = 0;
    for (int r = 0; r < size; r++)
        count += key[r] == want;
    return count;
}

/* Appends the ranks r with key[r] == want, runs as ranges: "0-3, 5". */
static void str_append_ranks(char *buf, size_t n, const int *key, int size, int want) {
    bool first = true;
    for (int r = 0; r < size; r++) {
        if (key[r] != want)
            continue;
        int end = r;
        while (end + 1 < size && key[end + 1] == want)
            end++;
        ct__coll_msg_append(buf, n, first ? "%d" : ", %d", r);
        if (end > r)
            ct__coll_msg_append(buf, n, "-%d", end);
        first = false;
        r = end;
    }
}

/* -------------------------------------------------------------- dtypes */

/* 16-bit floats reduce in a float32 copy. */
static bool widens(ct_dtype dtype) { return ct__coll_acc_size(dtype) != ct__esize(dtype); }

/* Moves only need the element size. */
static MPI_Datatype move_type(ct_dtype dtype) {
    switch (ct__esize(dtype)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
    }
}

/* The type a reduction of dtype runs in (float32 for 16-bit floats). */
static MPI_Datatype reduce_type(ct_dtype dtype) {
    switch (dtype) {
    case CT_FLOAT64: return MPI_DOUBLE;
    case CT_INT64: return MPI_INT64_T;
    case CT_INT32: return MPI_INT32_T;
    case CT_UINT8: return MPI_UINT8_T;
    case CT_BOOL: return MPI_C_BOOL;
    default: return MPI_FLOAT;
    }
}

static MPI_Op reduce_op(ct_dtype dtype, ct_reduce_op op) {
    if (dtype == CT_BOOL)
        return op == CT_REDUCE_SUM || op == CT_REDUCE_MAX ? MPI_LOR : MPI_LAND;
    switch (op) {
    case CT_REDUCE_MIN: return MPI_MIN;
    case CT_REDUCE_MAX: return MPI_MAX;
    case CT_REDUCE_PROD: return MPI_PROD;
    default: return MPI_SUM; /* sum, and avg before its division */
    }
}

/* ------------------------------------------------------------- scratch */

/* The smallest pooled buffer of at least bytes (so that a descriptor does
 * not take a large float32 buffer), else a new one; NULL when memory runs
 * out. */
static scratch *scratch_take(mpi_impl *m, size_t bytes) {
    scratch **best = NULL;
    for (scratch **pp = &m->pool; *pp; pp = &(*pp)->next)
        if ((*pp)->cap >= bytes && (!best || (*pp)->cap < (*best)->cap))
            best = pp;
    if (best) {
        scratch *s = *best;
        *best = s->next;
        return s;
    }
    /* None is big enough: replace one rather than let the pool grow. */
    if (m->pool) {
        scratch *old = m->pool;
        m->pool = old->next;
        free(old);
    }
    scratch *s = malloc(sizeof *s + bytes);
    if (s)
        s->cap = bytes;
    return s;
}

static void scratch_give(mpi_impl *m, scratch *s) {
    if (s) {
        s->next = m->pool;
        m->pool = s;
    }
}

/* ------------------------------------------------------ in-flight works */

static void link_work(mpi_impl *m, mpi_work *mw) {
    mw->prev = NULL;
    mw->next = m->inflight;
    if (m->inflight)
        m->inflight->prev = mw;
    m->inflight = mw;
    mw->linked = true;
}

/* Once no request of mw is pending, forgets it and returns its buffers to
 * the pool. */
static void settle(mpi_impl *m, mpi_work *mw) {
    if (mw->req[0] != MPI_REQUEST_NULL || mw->req[1] != MPI_REQUEST_NULL)
        return;
    if (mw->linked) {
        if (mw->prev)
            mw->prev->next = mw->next;
        else
            m->inflight = mw->next;
        if (mw->next)
            mw->next->prev = mw->prev;
        mw->linked = false;
    }
    scratch_give(m, mw->stage);
    scratch_give(m, mw->gather);
    mw->stage = mw->gather = NULL;
}

/* ------------------------------------------------------------- staging */

/* The bytes w's stage buffer needs (see mpi_work.stage), or 0 when it
 * needs none. */
static size_t stage_bytes(const ct_comm *c, const ct__coll_desc *d) {
    size_t n = (size_t)d->count;
    if (ct__op_is_p2p(d->op))
        return sizeof *d;
    if (!ct__op_reduces(d->op) || !widens(d->dtype))
        return 0;
    /* reduce_scatter: every block of the input, then the result block. */
    return (d->op == CT__REDUCE_SCATTER ? (size_t)c->size + 1 : 1) * n * sizeof(float);
}

/* Takes and fills w's stage buffer; 0 or CT_ENOMEM with w failed. */
static int stage_input(ct_comm *c, ct_work *w) {
    mpi_impl *m = c->impl;
    mpi_work *mw = mw_of(w);
    const ct__coll_desc *d = &w->desc;
    size_t bytes = stage_bytes(c, d);
    if (!bytes)
        return 0;
    mw->stage = scratch_take(m, bytes);
    if (!mw->stage)
        return ct__work_fail(w, CT_ENOMEM, "%s #%llu: out of memory for %zu bytes of staging",
                             ct__coll_op_name(d->op), (unsigned long long)d->seq, bytes);
    void *buf = mw->stage->data;
    if (d->op == CT__SEND)
        memcpy(buf, d, sizeof *d);
    else if (d->op != CT__RECV)
        ct__coll_acc_load(buf, w->in, d->op == CT__REDUCE_SCATTER ? c->size * d->count : d->count,
                          d->dtype);
    return 0;
}

/* The result of a reduction, once the data operation completed: converted
 * back from float32 and/or divided for avg. Non-root ranks of a reduce keep
 * their tensor. */
static void finish(ct_comm *c, ct_work *w) {
    const ct__coll_desc *d = &w->desc;
    mpi_work *mw = mw_of(w);
    if (!ct__op_reduces(d->op) || d->count == 0 || (d->op == CT__REDUCE && c->rank != d->root))
        return;
    bool wide = widens(d->dtype);
    if (!wide && d->rop != CT_REDUCE_AVG)
        return;
    const void *acc = w->out;
    if (wide)
        acc = (const float *)(const void *)mw->stage->data +
              (d->op == CT__REDUCE_SCATTER ? (size_t)c->size * (size_t)d->count : 0);
    ct__coll_acc_store(w->out, acc, d->count, d->dtype, d->rop, c->size);
}

/* -------------------------------------------------------------- posting
 * Each poster runs with the lock held and returns CT__PENDING or w's
 * error. */

static int post_data(ct_comm *c, ct_work *w) {
    mpi_impl *m = c->impl;
    mpi_work *mw = mw_of(w);
    const ct__coll_desc *d = &w->desc;
    int n = (int)d->count;
    bool wide = ct__op_reduces(d->op) && widens(d->dtype);
    void *stage = mw->stage ? (void *)mw->stage->data : NULL;
    const void *in = w->in;
    MPI_Datatype mt = move_type(d->dtype), rt = wide ? MPI_FLOAT : reduce_type(d->dtype);
    MPI_Op op = reduce_op(d->dtype, d->rop);
    MPI_Request *req = &mw->req[0];
    const char *call = "";
    int rc = MPI_SUCCESS;
    switch (d->op) {
    case CT__ALLREDUCE:
        call = "MPI_Iallreduce";
        rc = MPI_Iallreduce(MPI_IN_PLACE, wide ? stage : w->out, n, rt, op, m->data, req);
        break;
    case CT__BROADCAST:
        call = "MPI_Ibcast";
        rc = MPI_Ibcast(w->out, n, mt, d->root, m->data, req);
        break;
    case CT__REDUCE: {
        /* The root reduces in place; the others only send, so their
         * tensors stay as they were. */
        void *buf = wide ? stage : w->out;
        bool root = c->rank == d->root;
        call = "MPI_Ireduce";
        rc = MPI_Ireduce(root ? MPI_IN_PLACE : buf, root ? buf : NULL, n, rt, op, d->root, m->data,
                         req);
        break;
    }
    case CT__ALLGATHER: {
        size_t own = (size_t)n * ct__esize(d->dtype);
        if ((const char *)w->in == (const char *)w->out + (size_t)c->rank * own)
            in = MPI_IN_PLACE; /* in is this rank's block of out */
        call = "MPI_Iallgather";
        rc = MPI_Iallgather(in, n, mt, w->out, n, mt, m->data, req);
        break;
    }
    case CT__REDUCE_SCATTER:
        call = "MPI_Ireduce_scatter_block";
        if (wide)
            rc = MPI_Ireduce_scatter_block(stage, (float *)stage + (size_t)c->size * (size_t)n, n,
                                           MPI_FLOAT, op, m->data, req);
        else
            rc = MPI_Ireduce_scatter_block(in, w->out, n, rt, op, m->data, req);
        break;
    case CT__ALLTOALL:
        call = "MPI_Ialltoall";
        rc = MPI_Ialltoall(in, n / c->size, mt, w->out, n / c->size, mt, m->data, req);
        break;
    case CT__BARRIER:
        call = "MPI_Ibarrier";
        rc = MPI_Ibarrier(m->data, req);
        break;
    default: CT_ASSERT(!"mpi: post_data: not a collective");
    }
    if (rc != MPI_SUCCESS)
        return work_mpi_fail(w, call, rc);
    mw->state = MW_DATA;
    return CT__PENDING;
}

static int post_check(ct_comm *c, ct_work *w) {
    mpi_impl *m = c->impl;
    mpi_work *mw = mw_of(w);
    int64_t fp = ct__coll_desc_fingerprint(&w->desc);
    m->fp[0] = fp;
    m->fp[1] = -fp;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, m->fp, 2, MPI_INT64_T, MPI_MAX, m->ctl, &mw->req[0]);
    if (rc != MPI_SUCCESS)
        return work_mpi_fail(w, "MPI_Iallreduce (agreement check)", rc);
    m->checking = w;
    mw->state = MW_CHECK;
    return CT__PENDING;
}

/* The check found a disagreement: gather every rank's descriptor so that
 * every rank can name them all. */
static int post_gather(ct_comm *c, ct_work *w) {
    mpi_impl *m = c->impl;
    mpi_work *mw = mw_of(w);
    size_t bytes = (size_t)c->size * (sizeof(ct__coll_desc) + sizeof(int));
    mw->gather = scratch_take(m, bytes);
    if (!mw->gather)
        return ct__work_fail(w, CT_ENOMEM,
                             "%s #%llu: ranks disagree, and %zu bytes to gather their "
                             "descriptors could not be allocated",
                             ct__coll_op_name(w->desc.op), (unsigned long long)w->desc.seq, bytes);
    ct__coll_desc *all = (ct__coll_desc *)(void *)mw->gather->data;
    all[c->rank] = w->desc;
    int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, (int)sizeof(ct__coll_desc),
                            MPI_BYTE, m->ctl, &mw->req[0]);
    if (rc != MPI_SUCCESS)
        return work_mpi_fail(w, "MPI_Iallgather (descriptors)", rc);
    mw->state = MW_GATHER;
    return CT__PENDING;
}

/* The descriptors are in: fail with all of them, grouped. They cannot all
 * agree: the fingerprints differed, and they hash exactly what
 * ct__coll_desc_match compares. Every rank sees the same data and writes the
 * same message. */
static int judge(ct_comm *c, ct_work *w) {
    mpi_impl *m = c->impl;
    mpi_work *mw = mw_of(w);
    const ct__coll_desc *all = (const ct__coll_desc *)(const void *)mw->gather->data;
    int *group = (int *)(void *)(all + c->size); /* the first rank with the same descriptor */
    bool agree = true;
    for (int r = 0; r < c->size; r++) {
        group[r] = r;
        for (int g = 0; g < r; g++)
            if (group[g] == g && ct__coll_desc_match(&all[g], &all[r])) {
                group[r] = g;
                break;
            }
        agree = agree && group[r] == 0;
    }
    CT_ASSERT(!agree);
    char msg[CT__MSG_LEN] = "", desc[256];
    ct__coll_msg_append(msg, sizeof msg, "%s #%llu: ranks disagree:", ct__coll_op_name(w->desc.op),
                        (unsigned long long)w->desc.seq);
    for (int g = 0; g < c->size; g++) {
        if (group[g] != g)
            continue;
        bool many = count_key(group, c->size, g) > 1;
        ct__coll_msg_append(msg, sizeof msg, "%s %s ", g ? ";" : "", many ? "ranks" : "rank");
        str_append_ranks(msg, sizeof msg, group, c->size, g);
        ct__coll_msg_append(msg, sizeof msg, " %s %s", many ? "have" : "has",
                            ct__coll_desc_str(desc, sizeof desc, &all[g]));
    }
    /* The field, between rank 0 and the first rank that differs from it. */
    int other = 0;
    while (group[other] == 0)
        other++;
    ct__coll_msg_append(msg, sizeof msg, " (");
    ct__coll_desc_differ(msg, sizeof msg, &all[0], 0, &all[other], other);
    ct__coll_msg_append(msg, sizeof msg, ")");
    m->group_knows = true;
    return ct__work_fail(w, CT_EMISMATCH, "%s", msg);
}

/* A send posts its descriptor and its data; a recv posts both receives
 * and checks the descriptor before it looks at the data. */
static int post_p2p(ct_comm *c, ct_work *w) {
    mpi_impl *m = c->impl;
    mpi_work *mw = mw_of(w);
    const ct__coll_desc *d = &w->desc;
    if (d->tag > m->tag_ub)
        return ct__work_fail(w, CT_EINVAL, "%s #%llu: tag %d is above MPI_TAG_UB (%d) of this MPI",
                             ct__coll_op_name(d->op), (unsigned long long)d->seq, d->tag,
                             m->tag_ub);
    int rc;
    if (d->op == CT__SEND) {
        rc = MPI_Isend(mw->stage->data, (int)sizeof *d, MPI_BYTE, d->root, TAG_P2P_DESC, m->ctl,
                       &mw->req[0]);
        if (rc != MPI_SUCCESS)
            return work_mpi_fail(w, "MPI_Isend (descriptor)", rc);
        rc = MPI_Isend(w->in, (int)d->count, move_type(d->dtype), d->root, d->tag, m->data,
                       &mw->req[1]);
        if (rc != MPI_SUCCESS)
            return work_mpi_fail(w, "MPI_Isend", rc);
        mw->state = MW_P2P_DATA;
    } else {
        rc = MPI_Irecv(mw->stage->data, (int)sizeof *d, MPI_BYTE, d->root, TAG_P2P_DESC, m->ctl,
                       &mw->req[0]);
        if (rc != MPI_SUCCESS)
            return work_mpi_fail(w, "MPI_Irecv (descriptor)", rc);
        rc = MPI_Irecv(w->out, (int)d->count, move_type(d->dtype), d->root, d->tag, m->data,
                       &mw->req[1]);
        if (rc != MPI_SUCCESS)
            return work_mpi_fail(w, "MPI_Irecv", rc);
        mw->state = MW_P2P_DESC;
    }
    return CT__PENDING;
}

/* A recv's check of the descriptor that came ahead of the send. */
static int p2p_agree(ct_work *w) {
    const ct__coll_desc *d = &w->desc;
    const ct__coll_desc *s = (const ct__coll_desc *)(const void *)mw_of(w)->stage->data;
    if (s->op == CT__SEND && s->seq == d->seq && s->tag == d->tag && s->dtype == d->dtype &&
        s->count == d->count)
        return CT__PENDING;
    char mine[256], theirs[256], field[256] = "";
    ct__coll_desc_differ(field, sizeof field, s, d->root, d, w->comm->rank);
    return ct__work_fail(w, CT_EMISMATCH,
                         "recv #%llu from rank %d: the send does not match (%s): rank %d sent %s, "
                         "this rank posted %s",
                         (unsigned long long)d->seq, d->root, field, d->root,
                         ct__coll_desc_str(theirs, sizeof theirs, s),
                         ct__coll_desc_str(mine, sizeof mine, d));
}

/* ------------------------------------------------------------- service
 * Lock held in all of these. */

static int post_svc(mpi_impl *m) {
    return MPI_Irecv(m->svc_buf, (int)sizeof m->svc_buf, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG,
                     m->svc, &m->svc_req);
}

/* Tells peer how many collectives this rank has issued. Best effort: if
 * the previous answer to it is still in flight or the send fails, the peer
 * reports no answer from this rank. */
static void answer_query(ct_comm *c, int peer) {
    mpi_impl *m = c->impl;
    int done = 1;
    if (m->reply_req[peer] != MPI_REQUEST_NULL &&
        (MPI_Test(&m->reply_req[peer], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done))
        return;
    m->reply[peer] = atomic_load(&c->issued);
    if (MPI_Isend(&m->reply[peer], 1, MPI_UINT64_T, peer, TAG_ANSWER, m->svc,
                  &m->reply_req[peer]) != MPI_SUCCESS)
        m->reply_req[peer] = MPI_REQUEST_NULL;
}

/* Serves the service receive: answers queries, records answers and the
 * first failure notice. */
static void pump(ct_comm *c) {
    mpi_impl *m = c->impl;
    for (int i = 0; i < PUMP_MAX && m->svc_req != MPI_REQUEST_NULL; i++) {
        MPI_Status st;
        int flag = 0, len = 0;
        int rc = MPI_Test(&m->svc_req, &flag, &st);
        if (rc == MPI_SUCCESS && !flag)
            return;
        if (rc == MPI_SUCCESS)
            rc = MPI_Get_count(&st, MPI_BYTE, &len);
        if (rc == MPI_SUCCESS) {
            int peer = st.MPI_SOURCE;
            if (st.MPI_TAG == TAG_QUERY) {
                answer_query(c, peer);
            } else if (st.MPI_TAG == TAG_ANSWER && len == (int)sizeof(uint64_t)) {
                uint64_t issued;
                memcpy(&issued, m->svc_buf, sizeof issued);
                m->answer[peer] = (int64_t)issued;
            } else if (st.MPI_TAG == TAG_FAIL && !m->svc_code) {
                m->svc_code = CT_EPEER;
                snprintf(m->svc_msg, sizeof m->svc_msg, "rank %d failed: %.*s", peer,
                         len > 0 ? len - 1 : 0, m->svc_buf);
            }
            rc = post_svc(m);
        }
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            m->svc_req = MPI_REQUEST_NULL;
            if (!m->svc_code) {
                m->svc_code = CT_EFOREIGN;
                snprintf(m->svc_msg, sizeof m->svc_msg,
                         "mpi: the timeout service of rank %d failed: %s", c->rank,
                         mpi_errtext(rc, text));
            }
            return;
        }
    }
}

/* ------------------------------------------------------- the backend */

static int mpi_check_tensor(ct_comm *c, const char *op, const ct_tensor *t) {
    (void)c;
    char desc[CT__DESC_STR];
    /* A device's tensors come through host memory (comm.c stages them). */
    int64_t n = ct__tensor_numel(t->ndim, t->sizes);
    if (n > INT_MAX)
        return ct__err_set(CT_EINVAL,
                           "%s: %s has %lld elements, more than an MPI-3 count holds (INT_MAX = "
                           "%d); split it into smaller operations",
                           op, ct__tensor_desc(desc, t), (long long)n, INT_MAX);
    return 0;
}

static int mpi_start(ct_comm *c, ct_work *w) {
    mpi_impl *m = c->impl;
    mpi_work *mw = mw_of(w);
    bool p2p = ct__op_is_p2p(w->desc.op);
    CT_ASSERT(w->desc.count <= INT_MAX); /* check_tensor refused larger tensors */
    if (!p2p && m->checking)
        return CT__AGAIN; /* data operations must be posted in issue order */
    *mw = (mpi_work){.w = w, .req = {MPI_REQUEST_NULL, MPI_REQUEST_NULL}};
    int rc = stage_input(c, w);
    if (rc < 0)
        return rc;
    mpi_lock();
    /* A failure notice already here stops this rank from joining a
     * collective its peers abandoned. */
    pump(c);
    if (m->svc_code)
        rc = ct__work_fail(w, m->svc_code, "%s", m->svc_msg);
    else if (p2p)
        rc = post_p2p(c, w);
    else if (c->size == 1)
        rc = post_data(c, w);
    else
        rc = post_check(c, w);
    mpi_unlock();
    if (mw->req[0] != MPI_REQUEST_NULL || mw->req[1] != MPI_REQUEST_NULL)
        link_work(m, mw);
    else
        settle(m, mw);
    return rc;
}

/* Tests one request of w; 0, or w's error. Lock held. */
static int test_req(ct_work *w, MPI_Request *req, const char *what, int *flag) {
    *flag = 0;
    int rc = MPI_Test(req, flag, MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? 0 : work_mpi_fail(w, what, rc);
}

/* One step of w's stages. Lock held. */
static int advance(ct_comm *c, ct_work *w) {
    mpi_impl *m = c->impl;
    mpi_work *mw = mw_of(w);
    int flag, flag2, rc;
    switch (mw->state) {
    case MW_CHECK:
        if ((rc = test_req(w, &mw->req[0], "MPI_Test (agreement check)", &flag)) || !flag)
            return rc;
        m->checking = NULL;
        return m->fp[0] == -m->fp[1] ? post_data(c, w) : post_gather(c, w);
    case MW_GATHER:
        if ((rc = test_req(w, &mw->req[0], "MPI_Test (descriptors)", &flag)) || !flag)
            return rc;
        return judge(c, w);
    case MW_DATA:
        if ((rc = test_req(w, &mw->req[0], "MPI_Test", &flag)))
            return rc;
        return flag ? CT__DONE : CT__PENDING;
    case MW_P2P_DESC:
        if ((rc = test_req(w, &mw->req[0], "MPI_Test (descriptor)", &flag)) || !flag)
            return rc;
        if ((rc = p2p_agree(w)) < 0)
            return rc;
        mw->state = MW_P2P_DATA;
        /* fall through */
    case MW_P2P_DATA:
        if ((rc = test_req(w, &mw->req[0], "MPI_Test (descriptor)", &flag)) ||
            (rc = test_req(w, &mw->req[1], "MPI_Test", &flag2)))
            return rc;
        return flag && flag2 ? CT__DONE : CT__PENDING;
    default: CT_ASSERT(!"mpi: advance: bad state"); return CT__PENDING;
    }
}

static int mpi_progress(ct_comm *c, ct_work *w) {
    mpi_work *mw = mw_of(w);
    mpi_lock();
    int rc = advance(c, w);
    mpi_unlock();
    if (rc == CT__DONE)
        finish(c, w);
    settle(c->impl, mw);
    return rc;
}

static int mpi_poll(ct_comm *c, char *msg) {
    mpi_impl *m = c->impl;
    mpi_lock();
    pump(c);
    mpi_unlock();
    if (!m->svc_code)
        return 0;
    snprintf(msg, CT__MSG_LEN, "%s", m->svc_msg);
    return m->svc_code;
}

enum { PEER_UNASKED, PEER_SILENT, PEER_LATE, PEER_ARRIVED };

/* Asks the peers involved in w how far they got, for up to
 * DESCRIBE_WAIT_S, serving their own questions meanwhile (they may be
 * timing out too). */
static void mpi_describe_timeout(ct_comm *c, const ct_work *w, char *msg) {
    mpi_impl *m = c->impl;
    const ct__coll_desc *d = &w->desc;
    bool p2p = ct__op_is_p2p(d->op);
    int asked = 0;
    mpi_lock();
    for (int p = 0; p < c->size; p++) {
        m->answer[p] = -1;
        m->verdict[p] = PEER_UNASKED;
        if (p == c->rank || (p2p && p != d->root))
            continue;
        /* An empty message: nothing to keep alive, so the request can go. */
        MPI_Request q;
        if (MPI_Isend(NULL, 0, MPI_BYTE, p, TAG_QUERY, m->svc, &q) == MPI_SUCCESS)
            MPI_Request_free(&q);
        m->verdict[p] = PEER_SILENT;
        asked++;
    }
    mpi_unlock();
    double until = ct__now() + DESCRIBE_WAIT_S;
    for (;;) {
        mpi_lock();
        pump(c);
        mpi_unlock();
        int answered = 0;
        for (int p = 0; p < c->size; p++)
            answered += m->verdict[p] == PEER_SILENT && m->answer[p] >= 0;
        if (answered == asked || ct__now() >= until)
            break;
        nap(1000000);
    }
    for (int p = 0; p < c->size; p++)
        if (m->verdict[p] == PEER_SILENT && m->answer[p] >= 0)
            m->verdict[p] = (uint64_t)m->answer[p] >= d->seq ? PEER_ARRIVED : PEER_LATE;

    if (p2p) {
        if (m->verdict[d->root] == PEER_SILENT)
            ct__coll_msg_append(msg, CT__MSG_LEN, "; no answer from rank %d", d->root);
        else
            ct__coll_msg_append(msg, CT__MSG_LEN, "; rank %d answers but has not %s", d->root,
                                d->op == CT__SEND ? "received it" : "sent the matching message");
        return;
    }
    int late = count_key(m->verdict, c->size, PEER_LATE);
    int silent = count_key(m->verdict, c->size, PEER_SILENT);
    if (late) {
        ct__coll_msg_append(msg, CT__MSG_LEN, "; ranks that did not arrive: ");
        str_append_ranks(msg, CT__MSG_LEN, m->verdict, c->size, PEER_LATE);
    }
    if (silent) {
        ct__coll_msg_append(msg, CT__MSG_LEN, "; no answer from ranks ");
        str_append_ranks(msg, CT__MSG_LEN, m->verdict, c->size, PEER_SILENT);
    }
    if (!late && !silent)
        ct__coll_msg_append(msg, CT__MSG_LEN,
                            "; every rank arrived (the operation itself is stuck)");
}

/* Keeps the memory of an abandoned work alive: MPI may still write it. */
static void keep_buffers(ct_work *w) {
    ct_tensor *ts[] = {w->in_ref, w->out_ref};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (ts[i])
            ct_storage_retain(ts[i]->storage);
}

static void mpi_abort(ct_comm *c, int code, const char *msg) {
    (void)code;
    mpi_impl *m = c->impl;
    /* The works' staging buffers become unreachable: never reused. */
    for (mpi_work *mw = m->inflight; mw; mw = mw->next)
        keep_buffers(mw->w);
    m->abandoned = m->abandoned || m->inflight || m->checking;
    m->inflight = NULL;
    m->checking = NULL;
    /* Notices go out once: not for failures every rank detects itself,
     * not to echo a peer's notice. Best effort: a peer that misses it
     * times out on its own. */
    if (m->group_knows || m->svc_code == CT_EPEER || c->size == 1)
        return;
    snprintf(m->note, sizeof m->note, "%s", msg);
    int len = (int)strlen(m->note) + 1;
    mpi_lock();
    for (int p = 0; p < c->size; p++)
        if (p != c->rank && MPI_Isend(m->note, len, MPI_CHAR, p, TAG_FAIL, m->svc,
                                      &m->notice_req[p]) != MPI_SUCCESS)
            m->notice_req[p] = MPI_REQUEST_NULL;
    mpi_unlock();
}

/* A send from this block that may still be in flight: let MPI finish it,
 * and keep the block. Lock held. */
static void release_send(mpi_impl *m, MPI_Request *req) {
    int done = 1;
    if (*req == MPI_REQUEST_NULL)
        return;
    if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) {
        m->abandoned = true;
        MPI_Request_free(req);
    }
}

static void impl_free(ct_comm *c, mpi_impl *m) {
    int finalized = 1;
    mpi_lock();
    MPI_Finalized(&finalized);
    /* After MPI_Finalize, MPI touches nothing of ours any more. */
    if (!finalized) {
        if (m->svc_req != MPI_REQUEST_NULL) {
            /* Cancelling a receive completes locally. */
            MPI_Cancel(&m->svc_req);
            MPI_Wait(&m->svc_req, MPI_STATUS_IGNORE);
        }
        for (int p = 0; p < c->size; p++) {
            release_send(m, &m->reply_req[p]);
            release_send(m, &m->notice_req[p]);
        }
        MPI_Comm *comms[] = {&m->data, &m->ctl, &m->svc};
        for (size_t i = 0; i < sizeof comms / sizeof comms[0] && !m->abandoned; i++)
            if (*comms[i] != MPI_COMM_NULL)
                MPI_Comm_free(comms[i]);
    } else {
        m->abandoned = false;
    }
    mpi_unlock();
    while (m->pool) {
        scratch *s = m->pool;
        m->pool = s->next;
        free(s);
    }
    if (!m->abandoned)
        free(m);
}

static void mpi_destroy(ct_comm *c) {
    mpi_impl *m = c->impl;
    if (!m)
        return;
    CT_ASSERT(m->inflight == NULL); /* comm.c drains or aborts first */
    impl_free(c, m);
    c->impl = NULL;
}

/* MPI must be up, with threads allowed. */
static int check_mpi_ready(void) {
    int init = 0, fin = 0, level = MPI_THREAD_SINGLE;
    pthread_mutex_lock(&mpi_mu);
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Query_thread(&level);
    pthread_mutex_unlock(&mpi_mu);
    if (!init || fin)
        return ct__err_set(CT_ESTATE,
                           "mpi: ct_comm_new: MPI is %s; call MPI_Init_thread with "
                           "MPI_THREAD_MULTIPLE (or MPI_THREAD_SERIALIZED) first",
                           fin ? "already finalized" : "not initialized");
    if (level < MPI_THREAD_SERIALIZED)
        return ct__err_set(CT_ESTATE,
                           "mpi: ct_comm_new: MPI runs with %s, but ct's progress threads need "
                           "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (MPI_Init_thread)",
                           thread_level_name(level));
    return 0;
}

/* Duplicates parent into *out, waiting until deadline for the other ranks;
 * 0 or a CT_E* code with the message recorded. On a timeout the pending
 * MPI_Comm_idup is left behind: MPI cannot cancel it. */
static int dup_within(MPI_Comm parent, MPI_Comm *out, double deadline, double timeout,
                      const char *what) {
    MPI_Request req;
    const char *call = "MPI_Comm_idup";
    mpi_lock();
    int rc = MPI_Comm_idup(parent, out, &req);
    mpi_unlock();
    for (int flag = 0; rc == MPI_SUCCESS && !flag;) {
        mpi_lock();
        rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
        mpi_unlock();
        if (rc == MPI_SUCCESS && !flag) {
            if (ct__now() >= deadline) {
                *out = MPI_COMM_NULL;
                return ct__err_set(CT_ETIMEDOUT,
                                   "mpi: %s: not every rank of the MPI_Comm called it within %g "
                                   "s (MPI_Comm_idup stays pending)",
                                   what, timeout);
            }
            nap(100000);
        }
    }
    mpi_lock();
    if (rc == MPI_SUCCESS) {
        call = "MPI_Comm_set_errhandler";
        rc = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    }
    if (rc != MPI_SUCCESS)
        rc = mpi_fail(what, call, rc);
    mpi_unlock();
    return rc;
}

/* Makes c's impl from parent, a communicator of c->size ranks with this
 * process as c->rank. */
static int impl_init(ct_comm *c, MPI_Comm parent, const char *what) {
    int size = 0, rank = 0;
    mpi_lock();
    int rc = MPI_Comm_size(parent, &size);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_rank(parent, &rank);
    if (rc != MPI_SUCCESS)
        rc = mpi_fail(what, "MPI_Comm_size", rc);
    mpi_unlock();
    if (rc)
        return rc;
    if (size != c->size || rank != c->rank)
        return ct__err_set(CT_EINVAL,
                           "mpi: %s: the config says rank %d of %d, but the MPI_Comm has this "
                           "process as rank %d of %d",
                           what, c->rank, c->size, rank, size);

    size_t n = (size_t)size;
    mpi_impl *m = calloc(1, sizeof *m + n * (2 * sizeof(MPI_Request) + sizeof(uint64_t) +
                                             sizeof(int64_t) + sizeof(int)));
    if (!m)
        return ct__err_set(CT_ENOMEM, "mpi: %s: out of memory for a communicator of %d ranks", what,
                           size);
    m->reply_req = (MPI_Request *)(void *)(m + 1);
    m->notice_req = m->reply_req + n;
    m->reply = (uint64_t *)(void *)(m->notice_req + n);
    m->answer = (int64_t *)(void *)(m->reply + n);
    m->verdict = (int *)(void *)(m->answer + n);
    for (size_t p = 0; p < n; p++)
        m->reply_req[p] = m->notice_req[p] = MPI_REQUEST_NULL;
    m->data = m->ctl = m->svc = MPI_COMM_NULL;
    m->svc_req = MPI_REQUEST_NULL;

    double timeout = atomic_load(&c->timeout), deadline = ct__now() + timeout;
    MPI_Comm *comms[] = {&m->data, &m->ctl, &m->svc};
    for (size_t i = 0; i < sizeof comms / sizeof comms[0] && !rc; i++)
        rc = dup_within(parent, comms[i], deadline, timeout, what);
    /* A pending MPI_Comm_idup writes its handle into m when it completes. */
    m->abandoned = rc == CT_ETIMEDOUT;
    if (!rc) {
        int *ub = NULL, flag = 0;
        const char *call = "MPI_Comm_get_attr (MPI_TAG_UB)";
        mpi_lock();
        rc = MPI_Comm_get_attr(m->data, MPI_TAG_UB, &ub, &flag);
        if (rc == MPI_SUCCESS) {
            call = "MPI_Irecv (timeout service)";
            rc = post_svc(m);
        }
        if (rc != MPI_SUCCESS)
            rc = mpi_fail(what, call, rc);
        mpi_unlock();
        m->tag_ub = flag && ub ? *ub : 32767; /* the least the standard allows */
    }
    if (rc) {
        impl_free(c, m);
        return rc;
    }
    c->impl = m;
    return 0;
}

static int mpi_init(ct_comm *c, const ct_comm_config *cfg) {
    int rc = check_mpi_ready();
    if (rc)
        return rc;
    if (!cfg->mpi_comm)
        return ct__err_set(CT_EINVAL, "mpi: ct_comm_new: config.mpi_comm is NULL; pass a pointer "
                                      "to the group's MPI_Comm");
    return impl_init(c, *(const MPI_Comm *)cfg->mpi_comm, "ct_comm_new");
}

/* MPI_Comm_create_group over the new group's members only (ranks left out
 * take no part), then the usual three duplicates. It blocks, but every
 * member has just finished the split's exchange. */
static ct_comm *mpi_split(ct_comm *c, int color, uint64_t index, int new_rank, int new_size,
                          const int *new_to_old) {
    (void)color;
    (void)index;
    mpi_impl *m = c->impl;
    MPI_Group whole = MPI_GROUP_NULL, part = MPI_GROUP_NULL;
    MPI_Comm sub = MPI_COMM_NULL;
    const char *call = "MPI_Comm_group";
    mpi_lock();
    int rc = MPI_Comm_group(m->ctl, &whole);
    if (rc == MPI_SUCCESS) {
        call = "MPI_Group_incl";
        rc = MPI_Group_incl(whole, new_size, new_to_old, &part);
    }
    if (rc == MPI_SUCCESS) {
        call = "MPI_Comm_create_group";
        rc = MPI_Comm_create_group(m->ctl, part, TAG_SPLIT, &sub);
    }
    if (part != MPI_GROUP_NULL)
        MPI_Group_free(&part);
    if (whole != MPI_GROUP_NULL)
        MPI_Group_free(&whole);
    if (rc != MPI_SUCCESS)
        mpi_fail("ct_comm_split", call, rc);
    mpi_unlock();
    if (rc != MPI_SUCCESS)
        return NULL;

    ct_comm *n = ct__comm_alloc(&ct__mpi_backend, new_rank, new_size, atomic_load(&c->timeout));
    rc = n ? impl_init(n, sub, "ct_comm_split") : CT_ENOMEM;
    mpi_lock();
    MPI_Comm_free(&sub);
    mpi_unlock();
    if (rc) {
        if (n)
            ct__comm_discard(n);
        return NULL;
    }
    return ct__comm_activate(n);
}

const ct__backend ct__mpi_backend = {
    .kind = CT_BACKEND_MPI,
    .init = mpi_init,
    .destroy = mpi_destroy,
    .check_tensor = mpi_check_tensor,
    .start = mpi_start,
    .progress = mpi_progress,
    .poll = mpi_poll,
    .describe_timeout = mpi_describe_timeout,
    .abort = mpi_abort,
    .split = mpi_split,
};
