/* The gloo backend: ct collectives on Debian's libgloo (PyTorch's CPU
 * engine) over its TCP transport, for CPU tensors across machines.
 *
 * gloo_shim.cpp wraps gloo's C++; this file holds ct's side: the
 * non-blocking vtable, the threads, the descriptor checks, the dtypes and
 * the errors.
 *
 * Threads. gloo's algorithms block their caller until the peers have done
 * their part, and the vtable must not (comm.c's executor never waits for a
 * peer). Each communicator therefore runs two threads of its own, each a
 * queue of jobs: the collective lane runs the collectives one at a time in
 * issue order (every rank issues them in the same order, as gloo needs),
 * and the p2p lane waits for sends and receives. The executor's start
 * makes a job and queues it; progress only looks whether it is done.
 * Sends and receives are posted on the executor, in issue order, and only
 * waited for on the p2p lane, so that a receive posted early never keeps a
 * later send of this rank from its peer; a collective never waits behind
 * point-to-point traffic, nor that behind a collective. A job is its own
 * allocation, shared by the work and the lane (refs), so that a work that
 * comm.c abandons after a failure or a timeout leaves the lane a job to
 * finish; the job keeps the storages it reads and writes alive until then.
 *
 * Agreement. Ahead of every collective the ranks allgather their
 * descriptors (one small gloo allgather), and every rank compares all of
 * them, so that a mismatch fails every rank with the same CT_EMISMATCH
 * message before any data moves (the barrier is that exchange alone). A
 * send posts its descriptor ahead of its data; the receive posts the data
 * buffer only once the descriptor matches its own.
 *
 * Numerics. float16 and bfloat16 reduce in a float32 copy, in the
 * collective lane's scratch buffer (ct__coll_acc_load), and round to their
 * dtype once at the end (ct__coll_acc_store): gloo's own float16 sums in
 * 16 bits and it has no bfloat16. Every reduction runs ct's kernels
 * (ct__coll_acc_combine), so NaN, integer wrapping and bool follow the
 * other backends; avg is a sum divided at the end. reduce_scatter is an
 * allreduce of the whole input, of which each rank keeps its block (gloo
 * has no reduce-scatter over user buffers): twice the traffic of a ring
 * reduce-scatter.
 *
 * Failure. gloo's own timeouts are ct's plus GLOO_TIMEOUT_MARGIN_S, so
 * that comm.c's deadline fires first and describe_timeout can name the
 * ranks that did not arrive (each rank publishes in the store, from poll,
 * the last collective it began). A broken connection names the rank at
 * its other end. abort writes the failure to the store under the
 * communicator's prefix, then closes every connection, which wakes this
 * rank's lanes and fails the peers' pending operations at once; a peer
 * whose operation breaks looks in the store first and reports the
 * original failure (so that a dead rank is named on every survivor, not
 * the survivor that closed). Buffers of abandoned operations stay
 * allocated until the lane is done with them.
 */
#include "coll_impl.h"
#include "gloo_shim.h"
#include "tensor_impl.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Slots of point-to-point traffic: far above gloo's collective slots,
 * which build on a small prefix in the top byte. */
#define SLOT_P2P_DESC (0x7full << 56 | 1)
#define SLOT_P2P_DATA (0x7full << 56 | 2)
/* gloo's timeouts exceed ct's by this much (see Failure above). */
#define GLOO_TIMEOUT_MARGIN_S 1.0
/* How often poll publishes how far this rank got, at most. */
#define PUBLISH_PERIOD_S 0.1
/* The longest key prefix a communicator takes, splits included. */
#define PREFIX_MAX 255

typedef struct gloo_impl gloo_impl;

/* One operation, from start until both the work and its lane let go. */
typedef struct job {
    atomic_int refs;  /* the work's (until it completes or is abandoned) and the lane's */
    atomic_bool done; /* the lane finished it: err and msg are set */
    int err;          /* 0 or a CT_E* code */
    char msg[CT__MSG_LEN];
    ct__coll_desc desc;
    void *in, *out;
    ct_storage *keep[2]; /* of in and out, held until the job is freed */
    double deadline;     /* monotonic seconds: ct's, before the margin */
    /* Point to point: the descriptor sent, or the sender's received, and
     * the posted transfers. */
    ct__coll_desc wire;
    ct__gloo_buf *desc_buf, *data_buf;
    struct job *next;                  /* the lane's queue */
    struct job *live_prev, *live_next; /* gloo_impl.live */
} job;
_Static_assert(sizeof(job *) <= CT__WORK_BACKEND_BYTES, "a job pointer fits in ct_work.be");

/* A thread with a queue of jobs. */
typedef struct lane {
    gloo_impl *g;
    void (*run)(gloo_impl *g, job *j);
    pthread_t thread;
    bool started;
    pthread_mutex_t mu; /* guards head, tail and stop */
    pthread_cond_t cv;
    job *head, *tail;
    bool stop;
} lane;

struct gloo_impl {
    ct__gloo_ctx *ctx; /* NULL in a group of one */
    int rank, size;
    ct_comm_store store;
    char prefix[PREFIX_MAX + 1];
    char addr[256];
    lane coll, p2p;
    atomic_bool failed;         /* abort ran: the lanes drop what they still hold */
    atomic_bool group_knows;    /* a mismatch: every rank saw it, no notice needed */
    atomic_bool noticed;        /* the failure came from a peer's notice: not echoed */
    atomic_uint_fast64_t began; /* the sequence number of the last collective begun */
    /* The collective lane's own. */
    void *scratch;
    size_t scratch_cap;
    ct__coll_desc *descs; /* size: every rank's descriptor of the current collective */
    /* The executor's own. */
    uint64_t published;
    double next_publish;
    job *live; /* jobs a work still holds */
};

static job *job_of(ct_work *w) { return *(job **)(void *)w->be; }

static void job_release(job *j) {
    if (atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    ct__gloo_buf_free(j->desc_buf);
    ct__gloo_buf_free(j->data_buf);
    for (int i = 0; i < 2; i++)
        ct_storage_free(j->keep[i]);
    free(j);
}

static int64_t remaining_ms(const job *j) {
    double left = j->deadline + GLOO_TIMEOUT_MARGIN_S - ct__now();
    return left > 0.001 ? (int64_t)(left * 1e3) : 1;
}

/* "<prefix><name>" into key (CT__MSG_LEN bytes). */
static const char *key_of(const gloo_impl *g, char *key, const char *name) {
    snprintf(key, CT__MSG_LEN, "%s%s", g->prefix, name);
    return key;
}

/* ----------------------------------------------------------- the lanes */

static void *lane_main(void *arg) {
    lane *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->head && !l->stop)
            pthread_cond_wait(&l->cv, &l->mu);
        job *j = l->head;
        if (!j)
            break;
        l->head = j->next;
        if (!l->head)
            l->tail = NULL;
        pthread_mutex_unlock(&l->mu);
        /* After abort the work was completed with the group's failure:
         * what the job would do no longer matters. */
        if (!atomic_load(&l->g->failed))
            l->run(l->g, j);
        atomic_store_explicit(&j->done, true, memory_order_release);
        job_release(j);
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static void lane_push(lane *l, job *j) {
    pthread_mutex_lock(&l->mu);
    j->next = NULL;
    if (l->tail)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static int lane_start(gloo_impl *g, lane *l, void (*run)(gloo_impl *, job *)) {
    l->g = g;
    l->run = run;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    /* Signals are for the application's threads, as on the progress
     * thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&l->thread, NULL, lane_main, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return ct__err_set(CT_EFOREIGN, "gloo: cannot start a thread: %s", strerror(rc));
    l->started = true;
    return 0;
}

/* Ends the thread once its queue is empty: a job still running ends at its
 * gloo timeout at the latest, sooner after abort closed the connections. */
static void lane_stop(lane *l) {
    if (!l->started)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    l->started = false;
}

/* ---------------------------------------------------------- the errors */

/* How long a rank that saw a connection break without knowing whose
 * waits for the note of a rank that knows: the rank next to a dead one
 * writes it within milliseconds, and the loser of that race used to report
 * no rank at all. */
#define UNNAMED_PEER_WAIT_S 1.0

/* Records a failed gloo call in j: with the failure a peer wrote to the
 * store when there is one (the cause, where this rank only saw its
 * effect), else with what gloo said. */
static void job_fail(gloo_impl *g, job *j, int rc, int peer, const char *err) {
    char d[256], key[CT__MSG_LEN];
    ct__coll_desc_str(d, sizeof d, &j->desc);
    void *note = NULL;
    size_t len = 0;
    double wait = rc == CT_EPEER && peer < 0 ? UNNAMED_PEER_WAIT_S : 0;
    if ((rc == CT_EPEER || rc == CT_ETIMEDOUT) && !atomic_load(&g->failed) &&
        g->store.get(g->store.ctx, key_of(g, key, "fail"), wait, &note, &len) == 0) {
        atomic_store(&g->noticed, true);
        j->err = CT_EPEER;
        snprintf(j->msg, sizeof j->msg, "%s: the group failed on %.*s", d, (int)len,
                 (const char *)note);
        free(note);
        return;
    }
    free(note);
    j->err = rc;
    if (rc == CT_EPEER && peer >= 0)
        snprintf(j->msg, sizeof j->msg,
                 "%s on rank %d: the connection to rank %d broke (rank %d died or closed it): "
                 "gloo: %s",
                 d, g->rank, peer, peer, err);
    else if (rc == CT_EPEER)
        snprintf(j->msg, sizeof j->msg, "%s on rank %d: a connection to a peer broke: gloo: %s", d,
                 g->rank, err);
    else if (rc == CT_ETIMEDOUT)
        snprintf(j->msg, sizeof j->msg, "%s timed out in gloo on rank %d: %s", d, g->rank, err);
    else
        snprintf(j->msg, sizeof j->msg, "%s failed in gloo on rank %d: %s", d, g->rank, err);
}

/* ----------------------------------------------------------- collectives */

/* The lane's scratch buffer, at least bytes; NULL when memory runs out. */
static void *scratch(gloo_impl *g, size_t bytes) {
    if (bytes > g->scratch_cap) {
        free(g->scratch);
        g->scratch_cap = 0;
        if (!(g->scratch = malloc(bytes)))
            return NULL;
        g->scratch_cap = bytes;
    }
    return g->scratch;
}

/* What gloo's reduction callback runs in. */
typedef struct red {
    ct_dtype dtype; /* the accumulator's: float32 for 16-bit floats */
    ct_reduce_op op;
} red;

static void combine(void *ctx, void *out, const void *a, const void *b, size_t n) {
    const red *r = ctx;
    ct__coll_acc_combine(out, a, b, (int64_t)n, r->dtype, r->op);
}

/* Allgathers the descriptors and compares them: 0, or CT_EMISMATCH with
 * the same message on every rank, or gloo's error. */
static int agree(gloo_impl *g, job *j, int *peer, char *err) {
    const ct__coll_desc *d = &j->desc;
    /* Field by field, so that no padding byte travels. */
    ct__coll_desc *mine = &g->descs[g->rank];
    memset(mine, 0, sizeof *mine);
    *mine = (ct__coll_desc){.seq = d->seq,
                            .op = d->op,
                            .dtype = d->dtype,
                            .rop = d->rop,
                            .root = d->root,
                            .count = d->count};
    int rc =
        ct__gloo_allgather(g->ctx, mine, g->descs, sizeof *mine / 8, 8, remaining_ms(j), peer, err);
    if (rc)
        return rc;
    int other = 1;
    while (other < g->size && ct__coll_desc_match(&g->descs[0], &g->descs[other]))
        other++;
    if (other == g->size)
        return 0;
    ct__coll_disagree_msg(j->msg, sizeof j->msg, d->op, &g->descs[0], &g->descs[other], other);
    atomic_store(&g->group_knows, true);
    return CT_EMISMATCH;
}

/* allreduce, reduce and reduce_scatter. In place on out where the result
 * is the dtype's own over all of out; else in the scratch buffer. */
static int run_reduction(gloo_impl *g, job *j, int *peer, char *err) {
    const ct__coll_desc *d = &j->desc;
    ct_dtype dt = (ct_dtype)d->dtype;
    ct_reduce_op rop = (ct_reduce_op)d->rop;
    size_t asz = ct__coll_acc_size(dt);
    bool wide = asz != ct__esize(dt);
    bool scatter = d->op == CT__REDUCE_SCATTER;
    /* A reduce's other ranks keep their tensor; gloo writes partial sums
     * into the buffer it is given. */
    bool discard = d->op == CT__REDUCE && g->rank != d->root;
    int64_t n = scatter ? (int64_t)g->size * d->count : d->count;
    void *buf = j->out;
    if (wide || scatter || discard) {
        if (!(buf = scratch(g, (size_t)n * asz))) {
            snprintf(err, CT__GLOO_ERR_LEN, "out of memory for %zu bytes of staging",
                     (size_t)n * asz);
            return CT_ENOMEM;
        }
        ct__coll_acc_load(buf, j->in, n, dt);
    }
    red r = {wide ? CT_FLOAT32 : dt, rop};
    int rc = 0;
    if (g->size > 1 && d->op == CT__REDUCE)
        rc = ct__gloo_reduce(g->ctx, buf, (size_t)n, asz, d->root, combine, &r, remaining_ms(j),
                             peer, err);
    else if (g->size > 1)
        rc = ct__gloo_allreduce(g->ctx, buf, (size_t)n, asz, combine, &r, remaining_ms(j), peer,
                                err);
    if (rc || discard || (buf == j->out && rop != CT_REDUCE_AVG))
        return rc;
    const char *mine = (const char *)buf + (scatter ? (size_t)g->rank * (size_t)d->count * asz : 0);
    ct__coll_acc_store(j->out, mine, d->count, dt, rop, g->size);
    return 0;
}

/* broadcast, allgather and alltoall: bytes that only move. */
static int run_move(gloo_impl *g, job *j, int *peer, char *err) {
    const ct__coll_desc *d = &j->desc;
    size_t es = ct__esize((ct_dtype)d->dtype), count = (size_t)d->count;
    if (g->size == 1) {
        if (j->in != j->out && d->op != CT__BROADCAST)
            memmove(j->out, j->in, count * es);
        return 0;
    }
    int64_t ms = remaining_ms(j);
    switch (d->op) {
    case CT__BROADCAST:
        return ct__gloo_broadcast(g->ctx, j->out, count, es, d->root, ms, peer, err);
    case CT__ALLGATHER: return ct__gloo_allgather(g->ctx, j->in, j->out, count, es, ms, peer, err);
    default: return ct__gloo_alltoall(g->ctx, j->in, j->out, count, es, ms, peer, err);
    }
}

static void run_collective(gloo_impl *g, job *j) {
    atomic_store(&g->began, j->desc.seq);
    int peer = -1, rc = 0;
    char err[CT__GLOO_ERR_LEN] = "";
    if (g->size > 1 && (rc = agree(g, j, &peer, err)) == CT_EMISMATCH) {
        j->err = rc;
        return;
    }
    if (!rc && j->desc.op != CT__BARRIER && j->desc.count > 0)
        rc = ct__op_reduces(j->desc.op) ? run_reduction(g, j, &peer, err)
                                        : run_move(g, j, &peer, err);
    if (rc)
        job_fail(g, j, rc, peer, err);
}

/* -------------------------------------------------------- point to point */

/* Posts what can be posted without the peer: a send's descriptor and
 * data, a receive's descriptor. On the executor, in issue order. */
static int post_p2p(gloo_impl *g, job *j, char *err) {
    const ct__coll_desc *d = &j->desc;
    j->wire = (ct__coll_desc){.seq = d->seq,
                              .op = d->op,
                              .dtype = d->dtype,
                              .root = d->root,
                              .tag = d->tag,
                              .count = d->count};
    if (d->op == CT__RECV)
        return ct__gloo_post_recv(g->ctx, &j->wire, sizeof j->wire, d->root, SLOT_P2P_DESC,
                                  &j->desc_buf, err);
    int rc = ct__gloo_post_send(g->ctx, &j->wire, sizeof j->wire, d->root, SLOT_P2P_DESC,
                                &j->desc_buf, err);
    if (!rc && d->count > 0)
        rc = ct__gloo_post_send(g->ctx, j->in, (size_t)d->count * ct__esize((ct_dtype)d->dtype),
                                d->root, SLOT_P2P_DATA, &j->data_buf, err);
    return rc;
}

static void run_p2p(gloo_impl *g, job *j) {
    const ct__coll_desc *d = &j->desc;
    int peer = -1;
    char err[CT__GLOO_ERR_LEN] = "";
    int rc = ct__gloo_buf_wait(j->desc_buf, remaining_ms(j), &peer, err);
    if (!rc && d->op == CT__RECV) {
        char why[CT__MSG_LEN] = "";
        ct__coll_desc_differ(why, sizeof why, &j->wire, d->root, d, g->rank);
        if (why[0]) {
            char a[256];
            j->err = CT_EMISMATCH;
            snprintf(j->msg, sizeof j->msg, "%s does not match the send from rank %d: %s",
                     ct__coll_desc_str(a, sizeof a, d), d->root, why);
            return;
        }
        if (d->count > 0)
            rc =
                ct__gloo_post_recv(g->ctx, j->out, (size_t)d->count * ct__esize((ct_dtype)d->dtype),
                                   d->root, SLOT_P2P_DATA, &j->data_buf, err);
    }
    if (!rc && j->data_buf)
        rc = ct__gloo_buf_wait(j->data_buf, remaining_ms(j), &peer, err);
    if (rc)
        job_fail(g, j, rc, peer, err);
}

/* ------------------------------------------------------------- the vtable */

static int gloo_check_tensor(ct_comm *c, const char *op, const ct_tensor *t) {
    (void)c;
    (void)op;
    (void)t;
    return 0; /* any dtype; a device's tensors come through host memory (comm.c) */
}

static void live_unlink(gloo_impl *g, job *j) {
    if (j->live_prev)
        j->live_prev->live_next = j->live_next;
    else
        g->live = j->live_next;
    if (j->live_next)
        j->live_next->live_prev = j->live_prev;
}

static int gloo_start(ct_comm *c, ct_work *w) {
    gloo_impl *g = c->impl;
    job *j = calloc(1, sizeof *j);
    if (!j)
        return ct__work_fail(w, CT_ENOMEM, "%s #%llu: out of memory", ct__coll_op_name(w->desc.op),
                             (unsigned long long)w->desc.seq);
    atomic_init(&j->refs, 2);
    atomic_init(&j->done, false);
    j->desc = w->desc;
    j->in = w->in;
    j->out = w->out;
    j->deadline = ct__now() + atomic_load(&c->timeout);
    if (w->in_ref)
        j->keep[0] = ct_storage_retain(w->in_ref->storage);
    if (w->out_ref)
        j->keep[1] = ct_storage_retain(w->out_ref->storage);
    *(job **)(void *)w->be = j;
    bool p2p = ct__op_is_p2p(w->desc.op);
    char err[CT__GLOO_ERR_LEN];
    int rc = p2p ? post_p2p(g, j, err) : 0;
    if (rc) {
        job_release(j);
        job_release(j);
        char d[256];
        return ct__work_fail(w, rc, "%s on rank %d: gloo: %s",
                             ct__coll_desc_str(d, sizeof d, &w->desc), c->rank, err);
    }
    j->live_next = g->live;
    if (g->live)
        g->live->live_prev = j;
    g->live = j;
    lane_push(p2p ? &g->p2p : &g->coll, j);
    return CT__PENDING;
}

static int gloo_progress(ct_comm *c, ct_work *w) {
    gloo_impl *g = c->impl;
    job *j = job_of(w);
    if (!atomic_load_explicit(&j->done, memory_order_acquire))
        return CT__PENDING;
    int rc = j->err;
    if (rc)
        snprintf(w->msg, sizeof w->msg, "%s", j->msg);
    live_unlink(g, j);
    job_release(j);
    return rc ? rc : CT__DONE;
}

/* Publishes the last collective this rank began, for describe_timeout on
 * the peers; best effort, a lost one is followed by the next. */
static int gloo_poll(ct_comm *c, char *msg) {
    (void)msg;
    gloo_impl *g = c->impl;
    uint64_t began = atomic_load(&g->began);
    double now = ct__now();
    if (g->size == 1 || began == g->published || now < g->next_publish)
        return 0;
    char key[CT__MSG_LEN], name[32], value[32];
    snprintf(name, sizeof name, "began/%d", g->rank);
    int len = snprintf(value, sizeof value, "%llu", (unsigned long long)began);
    if (g->store.set(g->store.ctx, key_of(g, key, name), value, (size_t)len) == 0)
        g->published = began;
    g->next_publish = now + PUBLISH_PERIOD_S;
    return 0;
}

/* Names the peers that have not begun w, from what they published. */
static void gloo_describe_timeout(ct_comm *c, const ct_work *w, char *msg) {
    gloo_impl *g = c->impl;
    const ct__coll_desc *d = &w->desc;
    if (ct__op_is_p2p(d->op)) {
        ct__coll_msg_append(msg, CT__MSG_LEN, "; rank %d has not %s", d->root,
                            d->op == CT__SEND ? "received it" : "sent the matching message");
        return;
    }
    bool any = false;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank)
            continue;
        char key[CT__MSG_LEN], name[32];
        snprintf(name, sizeof name, "began/%d", p);
        void *value = NULL;
        size_t len = 0;
        bool arrived = g->store.get(g->store.ctx, key_of(g, key, name), 0, &value, &len) == 0 &&
                       strtoull(value, NULL, 10) >= d->seq;
        free(value);
        if (!arrived) {
            ct__coll_msg_append(msg, CT__MSG_LEN, "%s%d",
                                any ? ", " : "; ranks that did not arrive: ", p);
            any = true;
        }
    }
    if (!any)
        ct__coll_msg_append(msg, CT__MSG_LEN,
                            "; every rank arrived (the operation itself is stuck)");
}

static void gloo_abort(ct_comm *c, int code, const char *msg) {
    (void)code;
    gloo_impl *g = c->impl;
    atomic_store(&g->failed, true);
    /* comm.c completes these works now; their jobs are the lanes' alone. */
    while (g->live) {
        job *j = g->live;
        live_unlink(g, j);
        job_release(j);
    }
    if (g->size == 1)
        return;
    /* Not for a failure every rank saw, nor to echo a peer's notice. */
    if (!atomic_load(&g->group_knows) && !atomic_load(&g->noticed)) {
        char key[CT__MSG_LEN], note[CT__MSG_LEN];
        int len = snprintf(note, sizeof note, "rank %d: %s", c->rank, msg);
        g->store.set(g->store.ctx, key_of(g, key, "fail"), note,
                     (size_t)(len < (int)sizeof note ? len : (int)sizeof note - 1));
    }
    ct__gloo_ctx_close(g->ctx);
}

static void impl_free(gloo_impl *g) {
    lane_stop(&g->coll);
    lane_stop(&g->p2p);
    ct__gloo_ctx_free(g->ctx);
    free(g->scratch);
    free(g->descs);
    free(g);
}

static void gloo_destroy(ct_comm *c) {
    gloo_impl *g = c->impl;
    if (!g)
        return;
    CT_ASSERT(g->live == NULL); /* comm.c drains or aborts first */
    impl_free(g);
    c->impl = NULL;
}

/* Connects c's group through store under prefix, bound to addr. */
static int impl_init(ct_comm *c, const ct_comm_store *store, const char *prefix, const char *addr,
                     const char *what) {
    if (c->size > 1 && (!store || !store->set || !store->get))
        return ct__err_set(CT_EINVAL,
                           "gloo: %s: config.store is %s; a group of %d ranks meets through a "
                           "store (ct_dist_init hands it ctlaunch's)",
                           what, store ? "missing its functions" : "NULL", c->size);
    if (c->size > 1 && (!prefix || strlen(prefix) > 200))
        return ct__err_set(CT_EINVAL,
                           "gloo: %s: config.store_prefix is %s; expected at most 200 bytes", what,
                           prefix ? "too long" : "NULL");
    if (strlen(addr) >= 256)
        return ct__err_set(CT_EINVAL, "gloo: %s: config.gloo_addr is longer than 255 bytes", what);
    gloo_impl *g = calloc(1, sizeof *g);
    if (g)
        g->descs = calloc((size_t)c->size, sizeof *g->descs);
    if (!g || !g->descs) {
        free(g);
        return ct__err_set(CT_ENOMEM, "gloo: %s: out of memory for a communicator of %d ranks",
                           what, c->size);
    }
    g->rank = c->rank;
    g->size = c->size;
    if (store)
        g->store = *store;
    snprintf(g->prefix, sizeof g->prefix, "%s", prefix ? prefix : "");
    snprintf(g->addr, sizeof g->addr, "%s", addr);
    double timeout = atomic_load(&c->timeout);
    int rc = 0;
    if (c->size > 1) {
        ct__gloo_store s = {store->ctx, store->set, store->get, g->prefix};
        char err[CT__GLOO_ERR_LEN];
        int peer = -1;
        rc = ct__gloo_connect(&s, addr, c->rank, c->size, (int64_t)(timeout * 1e3), &g->ctx, &peer,
                              err);
        if (rc)
            rc = ct__err_set(rc,
                             "gloo: %s: rank %d of %d could not connect its group (at %s, within "
                             "%g s): %s",
                             what, c->rank, c->size, addr, timeout, err);
    }
    if (!rc)
        rc = lane_start(g, &g->coll, run_collective);
    if (!rc)
        rc = lane_start(g, &g->p2p, run_p2p);
    if (rc) {
        impl_free(g);
        return rc;
    }
    c->impl = g;
    return 0;
}

static int gloo_init(ct_comm *c, const ct_comm_config *cfg) {
    return impl_init(c, cfg->store, cfg->store_prefix,
                     cfg->gloo_addr ? cfg->gloo_addr : "127.0.0.1", "ct_comm_new");
}

/* The new group meets under a prefix of its own inside the parent's:
 * index tells splits apart, color the groups of one split. */
static ct_comm *gloo_split(ct_comm *c, int color, uint64_t index, int new_rank, int new_size,
                           const int *new_to_old) {
    (void)new_to_old;
    gloo_impl *g = c->impl;
    char prefix[PREFIX_MAX + 64];
    snprintf(prefix, sizeof prefix, "%ssplit%llu.%d/", g->prefix, (unsigned long long)index, color);
    if (strlen(prefix) > 200) {
        ct__err_set(CT_EINVAL, "gloo: ct_comm_split: splits nested too deep (key prefix '%s')",
                    prefix);
        return NULL;
    }
    ct_comm *n = ct__comm_alloc(&ct__gloo_backend, new_rank, new_size, atomic_load(&c->timeout));
    if (!n)
        return NULL;
    if (impl_init(n, g->size > 1 ? &g->store : NULL, prefix, g->addr, "ct_comm_split")) {
        ct__comm_discard(n);
        return NULL;
    }
    return ct__comm_activate(n);
}

const ct__backend ct__gloo_backend = {
    .kind = CT_BACKEND_GLOO,
    .init = gloo_init,
    .destroy = gloo_destroy,
    .check_tensor = gloo_check_tensor,
    .start = gloo_start,
    .progress = gloo_progress,
    .poll = gloo_poll,
    .describe_timeout = gloo_describe_timeout,
    .abort = gloo_abort,
    .split = gloo_split,
};
