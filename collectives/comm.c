/* Communicators and work: what every backend shares.
 *
 * Issuing checks the arguments, stages non-contiguous tensors (and a host
 * backend's device tensors, through host memory) and appends a
 * work to the communicator's queue. One thread at a time runs the executor,
 * which starts queued works in issue order and drives the started ones
 * through the backend's non-blocking functions: the progress thread when
 * nobody waits, or a thread blocked in ct_work_wait, which then needs no
 * wake-up and no handoff (that is what keeps a small blocking allreduce at
 * a few microseconds). A blocking call never wakes the progress thread. */
#include "coll_impl.h"
#include "tensor_impl.h"

#include <ct/cuda.h>

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

static const char *const op_names[CT__NOPS] = {
    [CT__ALLREDUCE] = "allreduce",
    [CT__BROADCAST] = "broadcast",
    [CT__REDUCE] = "reduce",
    [CT__ALLGATHER] = "allgather",
    [CT__REDUCE_SCATTER] = "reduce_scatter",
    [CT__ALLTOALL] = "alltoall",
    [CT__BARRIER] = "barrier",
    [CT__SEND] = "send",
    [CT__RECV] = "recv",
};

static const char *const rop_names[] = {"sum", "avg", "min", "max", "prod"};

const char *ct__coll_op_name(int op) { return op >= 0 && op < CT__NOPS ? op_names[op] : "?"; }

const char *ct__coll_desc_str(char *buf, size_t n, const ct__coll_desc *d) {
    const char *dtype =
        d->dtype >= 0 && d->dtype < CT_NDTYPES ? ct_dtype_name((ct_dtype)d->dtype) : "?";
    snprintf(buf, n, "%s #%llu (%s, %lld elements", ct__coll_op_name(d->op),
             (unsigned long long)d->seq, dtype, (long long)d->count);
    if (ct__op_reduces(d->op))
        ct__coll_msg_append(buf, n, ", %s",
                            d->rop >= 0 && d->rop <= CT_REDUCE_PROD ? rop_names[d->rop] : "?");
    if (ct__op_has_root(d->op))
        ct__coll_msg_append(buf, n, ", root %d", d->root);
    if (ct__op_is_p2p(d->op))
        ct__coll_msg_append(buf, n, ", %s %d, tag %d", d->op == CT__SEND ? "to" : "from", d->root,
                            d->tag);
    ct__coll_msg_append(buf, n, ")");
    return buf;
}

void ct__coll_desc_differ(char *buf, size_t n, const ct__coll_desc *a, int ra,
                          const ct__coll_desc *b, int rb) {
    char x[64], y[64];
    const char *field = NULL;
    bool pair = ct__op_is_p2p(a->op) && ct__op_is_p2p(b->op) && a->op != b->op;
    /* The first field that differs, in the order that explains the rest: a
     * different operation makes the other fields incomparable. */
    if (a->op != b->op && !pair) {
        field = "operation";
        snprintf(x, sizeof x, "%s", ct__coll_op_name(a->op));
        snprintf(y, sizeof y, "%s", ct__coll_op_name(b->op));
    } else if (a->dtype != b->dtype) {
        field = "dtype";
        snprintf(x, sizeof x, "%s",
                 a->dtype >= 0 && a->dtype < CT_NDTYPES ? ct_dtype_name((ct_dtype)a->dtype) : "?");
        snprintf(y, sizeof y, "%s",
                 b->dtype >= 0 && b->dtype < CT_NDTYPES ? ct_dtype_name((ct_dtype)b->dtype) : "?");
    } else if (a->count != b->count) {
        field = "count";
        snprintf(x, sizeof x, "%lld elements", (long long)a->count);
        snprintf(y, sizeof y, "%lld elements", (long long)b->count);
    } else if (ct__op_reduces(a->op) && a->rop != b->rop) {
        field = "reduction";
        snprintf(x, sizeof x, "%s",
                 a->rop >= 0 && a->rop <= CT_REDUCE_PROD ? rop_names[a->rop] : "?");
        snprintf(y, sizeof y, "%s",
                 b->rop >= 0 && b->rop <= CT_REDUCE_PROD ? rop_names[b->rop] : "?");
    } else if (ct__op_has_root(a->op) && a->root != b->root) {
        field = "root";
        snprintf(x, sizeof x, "root %d", a->root);
        snprintf(y, sizeof y, "root %d", b->root);
    } else if (pair && a->tag != b->tag) {
        field = "tag";
        snprintf(x, sizeof x, "tag %d", a->tag);
        snprintf(y, sizeof y, "tag %d", b->tag);
    } else if (a->seq != b->seq) {
        field = "sequence number";
        snprintf(x, sizeof x, "#%llu", (unsigned long long)a->seq);
        snprintf(y, sizeof y, "#%llu", (unsigned long long)b->seq);
    }
    if (field)
        ct__coll_msg_append(buf, n, "the %s differs: %s on rank %d, %s on rank %d", field, x, ra, y,
                            rb);
}

void ct__coll_disagree_msg(char *buf, size_t n, int op, const ct__coll_desc *first,
                           const ct__coll_desc *other, int r) {
    char a[256];
    snprintf(buf, n, "%s: ranks disagree: rank 0 has %s, rank %d has ", ct__coll_op_name(op),
             ct__coll_desc_str(a, sizeof a, first), r);
    ct__coll_msg_append(buf, n, "%s (", ct__coll_desc_str(a, sizeof a, other));
    ct__coll_desc_differ(buf, n, first, 0, other, r);
    ct__coll_msg_append(buf, n, ")");
}

bool ct__coll_desc_match(const ct__coll_desc *a, const ct__coll_desc *b) {
    return a->seq == b->seq && a->op == b->op && a->dtype == b->dtype && a->count == b->count &&
           (!ct__op_reduces(a->op) || a->rop == b->rop) &&
           (!ct__op_has_root(a->op) || a->root == b->root);
}

/* splitmix64 steps over the compared fields, the others zeroed. */
int64_t ct__coll_desc_fingerprint(const ct__coll_desc *d) {
    uint64_t fields[] = {d->seq,
                         (uint64_t)(uint32_t)d->op,
                         (uint64_t)(uint32_t)d->dtype,
                         (uint64_t)d->count,
                         ct__op_reduces(d->op) ? (uint64_t)(uint32_t)d->rop : 0,
                         ct__op_has_root(d->op) ? (uint64_t)(uint32_t)d->root : 0};
    uint64_t h = 0;
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        h += fields[i] + 0x9e3779b97f4a7c15ull;
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
        h ^= h >> 31;
    }
    return (int64_t)(h >> 2);
}

const char *ct_backend_name(ct_backend backend) {
    switch (backend) {
    case CT_BACKEND_SHM: return "shm";
    case CT_BACKEND_MPI: return "mpi";
    case CT_BACKEND_NCCL: return "nccl";
    case CT_BACKEND_GLOO: return "gloo";
    case CT_BACKEND_HIER: return "hier";
    case CT_BACKEND_DRY: return "dry";
    }
    return "?";
}

static const ct__backend *backend_table(ct_backend backend) {
    switch (backend) {
    case CT_BACKEND_SHM: return &ct__shm_backend;
    case CT_BACKEND_DRY: return &ct__dry_backend;
#ifdef CT_HAVE_MPI
    case CT_BACKEND_MPI: return &ct__mpi_backend;
#endif
#ifdef CT_HAVE_NCCL
    case CT_BACKEND_NCCL: return &ct__nccl_backend;
#endif
#ifdef CT_HAVE_GLOO
    case CT_BACKEND_GLOO: return &ct__gloo_backend;
#endif
    default: return NULL;
    }
}

/* hier is made from a flat communicator of any backend here. */
bool ct_backend_available(ct_backend backend) {
    return backend == CT_BACKEND_HIER || backend_table(backend) != NULL;
}

int ct_comm_nccl_id(void *id) {
    if (!id)
        return ct__err_set(CT_EINVAL, "comm_nccl_id: id is NULL");
#ifdef CT_HAVE_NCCL
    return ct__nccl_unique_id(id);
#else
    return ct__err_set(CT_ENOTSUP, "comm_nccl_id: this build of ct has no NCCL (it needs CUDA and "
                                   "NCCL at configure time)");
#endif
}

void ct__coll_msg_append(char *buf, size_t n, const char *fmt, ...) {
    size_t len = strnlen(buf, n);
    if (len + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

int ct__work_fail(ct_work *w, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->msg, sizeof w->msg, fmt, ap);
    va_end(ap);
    return code;
}

/* -------------------------------------------------------- communicators */

ct_comm *ct__comm_alloc(const ct__backend *be, int rank, int size, double timeout) {
    ct_comm *c = calloc(1, sizeof *c);
    if (!c || !(c->send_seq = calloc((size_t)size, sizeof *c->send_seq)) ||
        !(c->recv_seq = calloc((size_t)size, sizeof *c->recv_seq))) {
        if (c) {
            free(c->send_seq);
            free(c);
        }
        ct__err_set(CT_ENOMEM, "comm_new: out of memory for a communicator of %d ranks", size);
        return NULL;
    }
    c->be = be;
    c->rank = rank;
    c->size = size;
    c->timeout = timeout > 0 ? timeout : CT_COMM_DEFAULT_TIMEOUT;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_thread, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    return c;
}

static void comm_release(ct_comm *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    if (c->impl)
        c->be->destroy(c);
    for (ct_work *w = c->pool, *next; w; w = next) {
        next = w->next;
        free(w);
    }
    pthread_cond_destroy(&c->cv_thread);
    pthread_cond_destroy(&c->cv_done);
    pthread_mutex_destroy(&c->mu);
    free(c->active);
    free(c->send_seq);
    free(c->recv_seq);
    free(c);
}

void ct__comm_discard(ct_comm *c) { comm_release(c); }

static void *progress_main(void *arg);

ct_comm *ct__comm_activate(ct_comm *c) {
    /* Signals are for the application's threads: the progress thread
     * blocks them all. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&c->thread, NULL, progress_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        ct__err_set(CT_EFOREIGN, "comm_new: cannot start the progress thread: %s", strerror(rc));
        comm_release(c);
        return NULL;
    }
    c->thread_started = true;
    return c;
}

ct_comm *ct_comm_new(const ct_comm_config *cfg) {
    if (!cfg) {
        ct__err_set(CT_EINVAL, "comm_new: config is NULL");
        return NULL;
    }
    if (cfg->size < 1) {
        ct__err_set(CT_EINVAL, "comm_new: size %d is not a group (at least 1 rank)", cfg->size);
        return NULL;
    }
    if (cfg->rank < 0 || cfg->rank >= cfg->size) {
        ct__err_set(CT_EINVAL, "comm_new: rank %d is outside [0, %d)", cfg->rank, cfg->size);
        return NULL;
    }
    if (!(cfg->timeout_s >= 0) || cfg->timeout_s > 1e9) {
        ct__err_set(CT_EINVAL, "comm_new: timeout %g s is not in [0, 1e9]", cfg->timeout_s);
        return NULL;
    }
    const ct__backend *be = backend_table(cfg->backend);
    if (!be) {
        ct__err_set(CT_ENOTSUP, "comm_new: backend %s is not in this build (%s)",
                    ct_backend_name(cfg->backend),
                    cfg->backend == CT_BACKEND_MPI    ? "configure found no MPI"
                    : cfg->backend == CT_BACKEND_NCCL ? "configure found no CUDA with NCCL"
                    : cfg->backend == CT_BACKEND_GLOO ? "configure found no libgloo-dev"
                    : cfg->backend == CT_BACKEND_HIER
                        ? "hier is made from a flat communicator by ct_comm_hierarchical"
                        : "unknown backend");
        return NULL;
    }
    ct_comm *c = ct__comm_alloc(be, cfg->rank, cfg->size, cfg->timeout_s);
    if (!c)
        return NULL;
    if (be->init(c, cfg)) {
        c->impl = NULL;
        ct__comm_discard(c);
        return NULL;
    }
    return ct__comm_activate(c);
}

void ct_comm_free(ct_comm *c) {
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_cond_signal(&c->cv_thread);
    pthread_mutex_unlock(&c->mu);
    if (c->thread_started)
        pthread_join(c->thread, NULL);
    comm_release(c);
}

int ct_comm_rank(const ct_comm *c) { return c ? c->rank : -1; }
int ct_comm_size(const ct_comm *c) { return c ? c->size : -1; }
ct_backend ct_comm_backend(const ct_comm *c) { return c->be->kind; }
ct_device ct_comm_device(const ct_comm *c) {
    return c && c->be->device ? c->be->device(c) : CT_DEVICE_CPU;
}
double ct_comm_timeout(const ct_comm *c) { return c->timeout; }

/* c->mu held, or the executor's own thread. */
static bool has_work(ct_comm *c) { return c->queue_head || c->nactive > 0; }

int ct_comm_set_progress_thread(ct_comm *c, bool enabled) {
    if (!c)
        return ct__err_set(CT_EINVAL, "comm_set_progress_thread: comm is NULL");
    pthread_mutex_lock(&c->mu);
    c->caller_progress = !enabled;
    if (enabled && has_work(c) && !c->executing)
        pthread_cond_signal(&c->cv_thread);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int ct_comm_set_timeout(ct_comm *c, double seconds) {
    if (!c)
        return ct__err_set(CT_EINVAL, "comm_set_timeout: comm is NULL");
    if (!(seconds > 0) || seconds > 1e9)
        return ct__err_set(CT_EINVAL, "comm_set_timeout: %g s is not in (0, 1e9]", seconds);
    c->timeout = seconds;
    return 0;
}

/* The op of each recent collective, by sequence number, for stats. */
#define STATS_RING 256

void ct_comm_stats_get(ct_comm *c, ct_comm_stats *s) {
    s->issued = atomic_load(&c->issued);
    s->completed = atomic_load(&c->completed);
    s->direct = atomic_load(&c->direct);
    s->pending_op = NULL;
    s->pending_seq = 0;
    if (s->issued > s->completed) {
        s->pending_seq = s->completed + 1;
        s->pending_op = ct__coll_op_name(atomic_load(&c->recent_ops[s->pending_seq % STATS_RING]));
    }
}

/* ------------------------------------------------------------- executor */

static void work_release_tensors(ct_work *w) {
    ct_tensor_free(w->in_ref);
    ct_tensor_free(w->out_ref);
    ct_tensor_free(w->out_user);
    w->in_ref = w->out_ref = w->out_user = NULL;
}

/* Finishes w with rc (0, or a CT_E* code with w->msg set). After the state
 * is stored, w may be gone: a blocking caller's work lives on its stack. */
static void complete(ct_comm *c, ct_work *w, int rc) {
    if (rc == 0 && w->out_user) {
        int crc = w->out_ref != w->out_user ? ct__tensor_copy_any(w->out_user, w->out_ref) : 0;
        if (crc)
            rc = ct__work_fail(w, crc, "%s", ct_errmsg());
        else
            ct__tensor_bump_version(w->out_user);
    }
    work_release_tensors(w);
    w->err = rc;
    if (!ct__op_is_p2p(w->desc.op))
        atomic_fetch_add(&c->completed, 1);
    /* Paired with ct_work_wait: it counts itself a waiter, then checks the
     * state; here the state is stored, then the waiters counted. */
    atomic_store(&w->state, CT__WORK_DONE);
    if (atomic_load(&c->waiters) > 0) {
        pthread_mutex_lock(&c->mu);
        pthread_cond_broadcast(&c->cv_done);
        pthread_mutex_unlock(&c->mu);
    }
}

/* The group failed: record the first error, tell the backend, and fail
 * every active and queued work with it. Executor only. */
static void fail_group(ct_comm *c, int code, const char *msg) {
    pthread_mutex_lock(&c->mu);
    bool first = atomic_load(&c->failed) == 0;
    if (first) {
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", msg);
        atomic_store(&c->failed, code);
    }
    ct_work *queued = c->queue_head;
    c->queue_head = c->queue_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    if (first && c->be->abort)
        c->be->abort(c, code, msg);
    int failed = atomic_load(&c->failed);
    while (c->nactive > 0) {
        ct_work *w = c->active[--c->nactive];
        if (w->msg != msg)
            snprintf(w->msg, sizeof w->msg, "%s", c->fail_msg);
        complete(c, w, failed);
    }
    for (ct_work *w = queued, *next; w; w = next) {
        next = w->next;
        snprintf(w->msg, sizeof w->msg, "%s", c->fail_msg);
        complete(c, w, failed);
    }
}

/* Starts what it can of the queue, in issue order. A work the backend
 * cannot start yet (CT__AGAIN) stays queued without holding up the ones
 * behind it: the backend keeps the order that matters (collectives among
 * themselves, messages per peer and direction), and a recv queued behind
 * another recv must not keep this rank's sends from starting. Returns
 * whether any started; fails the group on an error. */
static bool start_queued(ct_comm *c) {
    ct_work *finished = NULL, **finished_tail = &finished, *failing = NULL;
    int fail_rc = 0;
    bool started = false;
    if (!atomic_load_explicit(&c->queue_head, memory_order_acquire))
        return false;
    pthread_mutex_lock(&c->mu);
    ct_work *prev = NULL;
    for (ct_work *w = c->queue_head, *next; w; w = next) {
        next = w->next;
        if (CT__GROW(c->active, &c->cap_active, c->nactive + 1, 0, "comm: the active works"))
            break; /* retried on the next pass */
        int failed = atomic_load(&c->failed);
        int rc = failed ? failed : c->be->start(c, w);
        if (rc == CT__AGAIN) {
            prev = w;
            continue;
        }
        if (prev)
            prev->next = next;
        else
            c->queue_head = next;
        if (c->queue_tail == w)
            c->queue_tail = prev;
        w->next = NULL;
        started = true;
        w->deadline = ct__now() + c->timeout + c->be->deadline_margin;
        atomic_store_explicit(&w->state, CT__WORK_STARTED, memory_order_relaxed);
        if (rc == CT__PENDING) {
            c->active[c->nactive++] = w;
        } else if (rc == CT__DONE || failed) {
            if (failed)
                snprintf(w->msg, sizeof w->msg, "%s", c->fail_msg);
            w->err = failed;
            *finished_tail = w;
            finished_tail = &w->next;
        } else {
            c->active[c->nactive++] = w;
            failing = w;
            fail_rc = rc;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    for (ct_work *w = finished, *next; w; w = next) {
        next = w->next;
        complete(c, w, w->err);
    }
    if (failing)
        fail_group(c, fail_rc, failing->msg);
    return started;
}

/* One pass over the active works. Returns whether any moved. */
static bool progress_active(ct_comm *c) {
    bool moved = false;
    for (int i = 0; i < c->nactive;) {
        ct_work *w = c->active[i];
        int rc = c->be->progress(c, w);
        if (rc == CT__PENDING || rc == CT__AGAIN) {
            moved |= rc == CT__AGAIN;
            i++;
            continue;
        }
        moved = true;
        if (rc < 0) {
            fail_group(c, rc, w->msg);
            return true;
        }
        memmove(&c->active[i], &c->active[i + 1], (size_t)(c->nactive - i - 1) * sizeof *c->active);
        c->nactive--;
        complete(c, w, 0);
    }
    return moved;
}

/* Checks deadlines and the peers. Returns whether the group failed. */
static bool check_health(ct_comm *c, double now) {
    char msg[CT__MSG_LEN];
    int rc = c->be->poll(c, msg);
    if (rc < 0) {
        fail_group(c, rc, msg);
        return true;
    }
    for (int i = 0; i < c->nactive; i++) {
        ct_work *w = c->active[i];
        if (now < w->deadline)
            continue;
        char desc[256];
        snprintf(msg, sizeof msg, "%s timed out after %g s on rank %d",
                 ct__coll_desc_str(desc, sizeof desc, &w->desc), c->timeout, c->rank);
        c->be->describe_timeout(c, w, msg);
        fail_group(c, CT_ETIMEDOUT, msg);
        return true;
    }
    return false;
}

static bool queue_empty(ct_comm *c) {
    return atomic_load_explicit(&c->queue_head, memory_order_acquire) == NULL;
}

/* How an idle executor waits: spin briefly (a peer on another core answers
 * within microseconds), then yield, then sleep in growing steps, so that an
 * executor waiting for a slow peer costs little CPU. A sleep is the last
 * resort: on a virtual machine a sleeping core may take a millisecond or
 * more to wake, and a peer kept waiting that long starts sleeping too, so
 * that two ranks can hand each chunk over at sleep speed. A thread blocked
 * in a wait has nothing else to do and yields for longer than the progress
 * thread, which shares its core with the application. */
#define SPIN_SECONDS         50e-6
#define YIELD_SECONDS_WAITER 20e-3
#define YIELD_SECONDS_THREAD 2e-3
#define POLL_SECONDS         2e-3

/* Whether a waiter for w may stop waiting on the host: w completed, or
 * (unless full) a device backend queued it, so that the compute stream can
 * be ordered after it. */
static bool work_settled(const ct_comm *c, ct_work *w, bool full) {
    return atomic_load_explicit(&w->state, memory_order_acquire) == CT__WORK_DONE ||
           (!full && c->be->order && atomic_load_explicit(&w->launched, memory_order_acquire));
}

/* Runs the executor until `until` settles (work_settled), or (until ==
 * NULL) until nothing is queued or active. The caller set c->executing. */
static void execute(ct_comm *c, ct_work *until, bool full) {
    double idle_since = 0, last_poll = 0;
    unsigned idle = 0;
    for (;;) {
        if (until ? work_settled(c, until, full) : c->nactive == 0 && queue_empty(c))
            return;
        bool moved = start_queued(c);
        moved |= progress_active(c);
        if (moved) {
            idle = 0;
            continue;
        }
        if (idle++ % 64 != 0) {
            cpu_relax();
            continue;
        }
        double now = ct__now();
        if (idle == 1)
            idle_since = last_poll = now;
        if (now - last_poll >= POLL_SECONDS) {
            last_poll = now;
            if (check_health(c, now))
                continue;
        }
        double waited = now - idle_since;
        if (waited < SPIN_SECONDS) {
            cpu_relax();
        } else if (waited < (until ? YIELD_SECONDS_WAITER : YIELD_SECONDS_THREAD)) {
            sched_yield();
        } else {
            long ns = waited < 0.1 ? 50000 : 1000000;
            nanosleep(&(struct timespec){0, ns}, NULL);
        }
    }
}

/* Ends this thread's turn at the executor (c->mu held): waiters may take
 * over, and what is left goes to the progress thread when it takes work. */
static void leave_executor(ct_comm *c) {
    c->executing = false;
    pthread_cond_broadcast(&c->cv_done);
    if ((has_work(c) && !c->caller_progress) || c->stopping)
        pthread_cond_signal(&c->cv_thread);
}

/* How often an idle progress thread lets the backend serve its peers. */
#define IDLE_POLL_NS 5000000L

/* Waits on cv_thread (c->mu held) for at most IDLE_POLL_NS. When nothing
 * happened and no thread executes, it polls the backend: a peer may ask
 * this rank how far it got (mpi), or have failed the group, which this
 * rank then learns before its next call. The wait is timed even while a
 * waiter executes, which does not signal when it leaves nothing behind. */
static void idle_wait(ct_comm *c) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += IDLE_POLL_NS;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    if (pthread_cond_timedwait(&c->cv_thread, &c->mu, &ts) != ETIMEDOUT || c->executing ||
        has_work(c) || c->stopping || atomic_load(&c->failed))
        return;
    c->executing = true;
    pthread_mutex_unlock(&c->mu);
    char msg[CT__MSG_LEN];
    int rc = c->be->poll(c, msg);
    if (rc < 0)
        fail_group(c, rc, msg);
    pthread_mutex_lock(&c->mu);
    leave_executor(c);
}

static void *progress_main(void *arg) {
    ct_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while ((c->executing || !has_work(c) || c->caller_progress) && !c->stopping)
            idle_wait(c);
        if (c->executing) { /* stopping, while a waiter runs the executor */
            idle_wait(c);
            continue;
        }
        if (!has_work(c))
            break; /* stopping, and everything issued has completed */
        c->executing = true;
        pthread_mutex_unlock(&c->mu);
        execute(c, NULL, true);
        pthread_mutex_lock(&c->mu);
        leave_executor(c);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ----------------------------------------------------------------- work */

static int work_result(ct_work *w) {
    if (w->err)
        return ct__err_set(w->err, "%s", w->msg);
    return 0;
}

void ct__work_launched(ct_comm *c, ct_work *w) {
    atomic_store(&w->launched, true);
    if (atomic_load(&c->waiters) > 0) {
        pthread_mutex_lock(&c->mu);
        pthread_cond_broadcast(&c->cv_done);
        pthread_mutex_unlock(&c->mu);
    }
}

/* Waits until w settles (work_settled); when it is still running on a
 * device, orders the device's compute stream after it. */
static int work_wait(ct_work *w, bool full) {
    ct_comm *c = w->comm;
    if (!work_settled(c, w, full)) {
        pthread_mutex_lock(&c->mu);
        atomic_fetch_add(&c->waiters, 1);
        while (!work_settled(c, w, full)) {
            if (c->executing) {
                pthread_cond_wait(&c->cv_done, &c->mu);
                continue;
            }
            c->executing = true;
            pthread_mutex_unlock(&c->mu);
            execute(c, w, full);
            pthread_mutex_lock(&c->mu);
            leave_executor(c);
        }
        atomic_fetch_sub(&c->waiters, 1);
        pthread_mutex_unlock(&c->mu);
    }
    if (atomic_load_explicit(&w->state, memory_order_acquire) == CT__WORK_DONE)
        return work_result(w);
    return c->be->order(c, w);
}

int ct_work_wait(ct_work *w) {
    if (!w)
        return ct__err_set(CT_EINVAL, "work_wait: work is NULL");
    return work_wait(w, false);
}

/* Makes this thread c's executor unless another thread is, or (need_work)
 * there is nothing to execute; whether it did. */
static bool try_enter_executor(ct_comm *c, bool need_work) {
    pthread_mutex_lock(&c->mu);
    bool mine = !c->executing && (!need_work || has_work(c));
    if (mine)
        c->executing = true;
    pthread_mutex_unlock(&c->mu);
    return mine;
}

static void exit_executor(ct_comm *c) {
    pthread_mutex_lock(&c->mu);
    leave_executor(c);
    pthread_mutex_unlock(&c->mu);
}

int ct_comm_progress(ct_comm *c) {
    if (!c)
        return ct__err_set(CT_EINVAL, "comm_progress: comm is NULL");
    if (try_enter_executor(c, true)) {
        start_queued(c);
        progress_active(c);
        exit_executor(c);
    }
    int failed = atomic_load(&c->failed);
    if (failed)
        return ct__err_set(failed, "comm_progress: the communicator failed: %s", c->fail_msg);
    return 0;
}

/* Makes this thread c's executor, waiting while another thread is; the
 * caller then runs the executor's functions and leaves it. */
static void enter_executor(ct_comm *c) {
    pthread_mutex_lock(&c->mu);
    while (c->executing)
        pthread_cond_wait(&c->cv_done, &c->mu);
    c->executing = true;
    pthread_mutex_unlock(&c->mu);
}

void ct__comm_fail(ct_comm *c, int code, const char *msg) {
    enter_executor(c);
    fail_group(c, code, msg);
    exit_executor(c);
}

int ct__comm_check(ct_comm *c, char *msg) {
    if (try_enter_executor(c, false)) {
        check_health(c, ct__now());
        exit_executor(c);
    }
    int failed = atomic_load(&c->failed);
    if (failed)
        snprintf(msg, CT__MSG_LEN, "%s", c->fail_msg);
    return failed;
}

int ct_work_test(ct_work *w) {
    if (!w)
        return ct__err_set(CT_EINVAL, "work_test: work is NULL");
    if (atomic_load_explicit(&w->state, memory_order_acquire) != CT__WORK_DONE)
        return 0;
    int rc = work_result(w);
    return rc ? rc : 1;
}

void ct_work_free(ct_work *w) {
    if (!w)
        return;
    work_wait(w, true);
    ct_comm *c = w->comm;
    pthread_mutex_lock(&c->mu);
    w->next = c->pool;
    c->pool = w;
    pthread_mutex_unlock(&c->mu);
    comm_release(c);
}

/* ---------------------------------------------------------------- issue */

/* Checks a tensor argument: live, and on a device the backend takes. */
static int check_tensor(ct_comm *c, const char *op, const char *what, ct_tensor *t) {
    if (!t) {
        if (ct_errcode() != CT_OK)
            return ct_errcode();
        return ct__err_set(CT_EINVAL, "%s: %s is NULL", op, what);
    }
    if (t->magic != CT__TENSOR_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: %s is not a live tensor (freed or foreign)", op, what);
    if (t->storage->device.type == CT_META && c->be->kind != CT_BACKEND_DRY)
        return ct__err_set(CT_EDEVICE,
                           "%s: %s is on the meta device, which holds no data to send; only a "
                           "dry communicator (CT_BACKEND_DRY) takes meta tensors",
                           op, what);
    return c->be->check_tensor(c, op, t);
}

static int check_comm(ct_comm *c, const char *op) {
    if (!c)
        return ct__err_set(CT_EINVAL, "%s: comm is NULL", op);
    int failed = atomic_load(&c->failed);
    if (failed)
        return ct__err_set(failed, "%s: the communicator failed earlier: %s", op, c->fail_msg);
    return 0;
}

static int check_rank(ct_comm *c, const char *op, const char *what, int r) {
    if (r < 0 || r >= c->size)
        return ct__err_set(CT_EINVAL, "%s: %s %d is outside [0, %d)", op, what, r, c->size);
    return 0;
}

static int check_rop(const char *op, ct_reduce_op rop, ct_dtype dtype) {
    if ((int)rop < CT_REDUCE_SUM || rop > CT_REDUCE_PROD)
        return ct__err_set(CT_EINVAL, "%s: unknown reduction %d", op, (int)rop);
    if (rop == CT_REDUCE_AVG && dtype == CT_BOOL)
        return ct__err_set(CT_EDTYPE, "%s: avg is not defined for bool", op);
    return 0;
}

/* The tensor the backend reads and writes for t: t itself (a new
 * reference) when it is contiguous on the device the backend takes, else a
 * contiguous copy there. A host backend (shm, mpi) so takes a device's
 * tensors through host memory, as gloo takes CUDA tensors: the copy in
 * waits for the device's queued work, and complete() copies the result
 * back, queued on the device. */
static ct_tensor *staged_ref(ct_comm *c, const char *op, ct_tensor *t) {
    ct_device on = ct_comm_device(c);
    /* A meta tensor (only a dry communicator takes one) holds nothing to
     * stage, and a copy would be real memory. */
    if ((ct_is_contiguous(t) && ct_device_equal(t->storage->device, on)) ||
        t->storage->device.type == CT_META)
        return ct_tensor_retain(t);
    ct_tensor *copy = ct__tensor_own(ct__tensor_new_on(op, t->ndim, t->sizes, t->dtype, on));
    if (copy && ct__tensor_copy_any(copy, t)) {
        ct_tensor_free(copy);
        return NULL;
    }
    return copy; /* the work's reference, not the caller's scope's */
}

static ct_work *work_get(ct_comm *c) {
    pthread_mutex_lock(&c->mu);
    ct_work *w = c->pool;
    if (w)
        c->pool = w->next;
    pthread_mutex_unlock(&c->mu);
    if (!w && posix_memalign((void **)&w, 64, sizeof *w) != 0) {
        ct__err_set(CT_ENOMEM, "out of memory for a work handle");
        return NULL;
    }
    return w;
}

/* What an issuing function hands to submit(). */
typedef struct request {
    const char *name;
    ct__coll_desc desc;
    ct_tensor *in, *out; /* out NULL: the op does not write (send, barrier) */
    bool out_unchanged;  /* out is not written on this rank (reduce off the root) */
} request;

/* Stages, numbers and queues a request; waits for it when work is NULL. */
static int submit(ct_comm *c, request *r, ct_work **work) {
    ct_work stack_work, *w = work ? work_get(c) : &stack_work;
    if (!w)
        return CT_ENOMEM;
    memset(w, 0, offsetof(ct_work, be));
    w->comm = c;
    w->heap = work != NULL;
    w->desc = r->desc;
    atomic_init(&w->state, CT__WORK_QUEUED);
    if (r->in && !(w->in_ref = staged_ref(c, r->name, r->in)))
        goto fail;
    if (r->out == r->in)
        w->out_ref = w->in_ref ? ct_tensor_retain(w->in_ref) : NULL;
    else if (r->out && !(w->out_ref = staged_ref(c, r->name, r->out)))
        goto fail;
    if (r->out && !r->out_unchanged)
        w->out_user = ct_tensor_retain(r->out);
    w->in = w->in_ref ? ct__data(w->in_ref) : NULL;
    w->out = w->out_ref ? ct__data(w->out_ref) : w->in;
    if (c->be->issue && c->be->issue(c, w))
        goto fail;

    if (ct__op_is_p2p(w->desc.op)) {
        uint64_t *seq = w->desc.op == CT__SEND ? c->send_seq : c->recv_seq;
        w->desc.seq = ++seq[w->desc.root];
    } else {
        w->desc.seq = ++c->next_seq;
        atomic_store(&c->recent_ops[w->desc.seq % STATS_RING], (unsigned char)w->desc.op);
        atomic_fetch_add(&c->issued, 1);
    }
    if (work) {
        atomic_fetch_add(&c->refs, 1);
        *work = w;
    }
    pthread_mutex_lock(&c->mu);
    if (c->queue_tail)
        c->queue_tail->next = w;
    else
        c->queue_head = w;
    c->queue_tail = w;
    if (work && !c->executing && !c->caller_progress)
        pthread_cond_signal(&c->cv_thread);
    pthread_mutex_unlock(&c->mu);
    return work ? 0 : work_wait(w, true);

fail:
    work_release_tensors(w);
    if (w->heap) {
        pthread_mutex_lock(&c->mu);
        w->next = c->pool;
        c->pool = w;
        pthread_mutex_unlock(&c->mu);
    }
    return ct_errcode();
}

static int begin(ct_comm *c, const char *op, ct_work **work) {
    if (work)
        *work = NULL;
    return check_comm(c, op);
}

static ct__coll_desc make_desc(ct__op op, ct_tensor *t, int64_t count) {
    return (ct__coll_desc){.op = op, .dtype = t ? (int32_t)t->dtype : CT_UINT8, .count = count};
}

int ct_comm_allreduce(ct_comm *c, ct_tensor *t, ct_reduce_op op, ct_work **work) {
    const char *name = "allreduce";
    int rc = begin(c, name, work);
    if (rc || (rc = check_tensor(c, name, "t", t)) || (rc = check_rop(name, op, t->dtype)))
        return rc;
    request r = {name, make_desc(CT__ALLREDUCE, t, ct_numel(t)), t, t, false};
    r.desc.rop = (int32_t)op;
    return submit(c, &r, work);
}

int ct_comm_broadcast(ct_comm *c, ct_tensor *t, int root, ct_work **work) {
    const char *name = "broadcast";
    int rc = begin(c, name, work);
    if (rc || (rc = check_tensor(c, name, "t", t)) || (rc = check_rank(c, name, "root", root)))
        return rc;
    request r = {name, make_desc(CT__BROADCAST, t, ct_numel(t)), t, t, c->rank == root};
    r.desc.root = root;
    return submit(c, &r, work);
}

int ct_comm_reduce(ct_comm *c, ct_tensor *t, ct_reduce_op op, int root, ct_work **work) {
    const char *name = "reduce";
    int rc = begin(c, name, work);
    if (rc || (rc = check_tensor(c, name, "t", t)) || (rc = check_rop(name, op, t->dtype)) ||
        (rc = check_rank(c, name, "root", root)))
        return rc;
    request r = {name, make_desc(CT__REDUCE, t, ct_numel(t)), t, t, c->rank != root};
    r.desc.rop = (int32_t)op;
    r.desc.root = root;
    return submit(c, &r, work);
}

/* Checks a two-tensor op: same dtype, numel(big) == size x numel(small),
 * no overlap unless allowed. */
static int check_pair(ct_comm *c, const char *name, ct_tensor *out, ct_tensor *in,
                      int64_t out_per_in, int64_t in_per_out) {
    int rc;
    if ((rc = check_tensor(c, name, "out", out)) || (rc = check_tensor(c, name, "in", in)))
        return rc;
    char a[CT__DESC_STR], b[CT__DESC_STR];
    if (out->dtype != in->dtype)
        return ct__err_set(CT_EDTYPE, "%s: out %s and in %s differ in dtype", name,
                           ct__tensor_desc(a, out), ct__tensor_desc(b, in));
    int64_t no = ct_numel(out), ni = ct_numel(in);
    if (no * in_per_out != ni * out_per_in)
        return ct__err_set(CT_ESHAPE, "%s: out %s must have %s the elements of in %s (%d ranks)",
                           name, ct__tensor_desc(a, out),
                           out_per_in > 1   ? "size times"
                           : in_per_out > 1 ? "1/size of"
                                            : "as many as",
                           ct__tensor_desc(b, in), c->size);
    return 0;
}

int ct_comm_allgather(ct_comm *c, ct_tensor *out, ct_tensor *in, ct_work **work) {
    const char *name = "allgather";
    int rc = begin(c, name, work);
    if (rc || (rc = check_pair(c, name, out, in, c->size, 1)))
        return rc;
    int64_t n = ct_numel(in);
    /* In place: in is this rank's block of a contiguous out. */
    bool in_place = ct_is_contiguous(out) && ct_is_contiguous(in) &&
                    ct__data(in) == ct__data(out) + c->rank * n * (int64_t)ct__esize(in->dtype);
    if (!in_place && ct__tensor_memory_overlaps(out, in))
        return ct__err_set(CT_EINVAL, "%s: in overlaps out without being this rank's block of it",
                           name);
    request r = {name, make_desc(CT__ALLGATHER, in, n), in, out, false};
    return submit(c, &r, work);
}

int ct_comm_reduce_scatter(ct_comm *c, ct_tensor *out, ct_tensor *in, ct_reduce_op op,
                           ct_work **work) {
    const char *name = "reduce_scatter";
    int rc = begin(c, name, work);
    if (rc || (rc = check_pair(c, name, out, in, 1, c->size)) ||
        (rc = check_rop(name, op, in->dtype)))
        return rc;
    if (ct__tensor_memory_overlaps(out, in))
        return ct__err_set(CT_EINVAL, "%s: in and out overlap", name);
    request r = {name, make_desc(CT__REDUCE_SCATTER, out, ct_numel(out)), in, out, false};
    r.desc.rop = (int32_t)op;
    return submit(c, &r, work);
}

int ct_comm_alltoall(ct_comm *c, ct_tensor *out, ct_tensor *in, ct_work **work) {
    const char *name = "alltoall";
    int rc = begin(c, name, work);
    if (rc || (rc = check_pair(c, name, out, in, 1, 1)))
        return rc;
    if (ct_numel(in) % c->size != 0) {
        char a[CT__DESC_STR];
        return ct__err_set(CT_ESHAPE, "%s: in %s does not split into %d equal blocks", name,
                           ct__tensor_desc(a, in), c->size);
    }
    if (ct__tensor_memory_overlaps(out, in))
        return ct__err_set(CT_EINVAL, "%s: in and out overlap", name);
    request r = {name, make_desc(CT__ALLTOALL, in, ct_numel(in)), in, out, false};
    return submit(c, &r, work);
}

int ct_comm_barrier(ct_comm *c, ct_work **work) {
    int rc = begin(c, "barrier", work);
    if (rc)
        return rc;
    request r = {"barrier", make_desc(CT__BARRIER, NULL, 0), NULL, NULL, false};
    return submit(c, &r, work);
}

static int p2p(ct_comm *c, const char *name, ct__op op, ct_tensor *t, int peer, int tag,
               ct_work **work) {
    int rc = begin(c, name, work);
    if (rc || (rc = check_tensor(c, name, "t", t)) ||
        (rc = check_rank(c, name, op == CT__SEND ? "dst" : "src", peer)))
        return rc;
    if (peer == c->rank)
        return ct__err_set(CT_EINVAL, "%s: rank %d cannot %s itself", name, peer,
                           op == CT__SEND ? "send to" : "receive from");
    if (tag < 0)
        return ct__err_set(CT_EINVAL, "%s: tag %d is negative", name, tag);
    request r = {name, make_desc(op, t, ct_numel(t)), t, op == CT__RECV ? t : NULL, false};
    r.desc.root = peer;
    r.desc.tag = tag;
    return submit(c, &r, work);
}

int ct_comm_send(ct_comm *c, ct_tensor *t, int dst, int tag, ct_work **work) {
    return p2p(c, "send", CT__SEND, t, dst, tag, work);
}

int ct_comm_recv(ct_comm *c, ct_tensor *t, int src, int tag, ct_work **work) {
    return p2p(c, "recv", CT__RECV, t, src, tag, work);
}

/* ---------------------------------------------------------------- split */

typedef struct member {
    int64_t key;
    int rank;
} member;

static int member_cmp(const void *a, const void *b) {
    const member *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->rank - y->rank;
}

int ct_comm_split(ct_comm *c, int color, int key, ct_comm **out) {
    if (!out)
        return ct__err_set(CT_EINVAL, "comm_split: out is NULL");
    *out = NULL;
    int rc = check_comm(c, "comm_split");
    if (rc)
        return rc;
    if (color < 0 && color != CT_COMM_SPLIT_NONE)
        return ct__err_set(CT_EINVAL, "comm_split: color %d is negative (CT_COMM_SPLIT_NONE is %d)",
                           color, CT_COMM_SPLIT_NONE);
    if (c->be->split_direct) {
        c->splits++;
        return c->be->split_direct(c, color, key, out);
    }
    int64_t mine[2] = {color, key};
    ct_tensor *in = ct_from_data(mine, 1, (int64_t[]){2}, CT_INT64);
    ct_tensor *all = ct_empty(1, (int64_t[]){2 * (int64_t)c->size}, CT_INT64);
    member *members = malloc((size_t)c->size * sizeof *members);
    int *new_to_old = malloc((size_t)c->size * sizeof *new_to_old);
    if (!members || !new_to_old)
        rc = ct__err_set(CT_ENOMEM, "comm_split: out of memory");
    else if (!in || !all)
        rc = ct_errcode();
    else
        rc = ct_comm_allgather(c, all, in, NULL);
    uint64_t index = c->splits++;
    if (rc == 0 && color != CT_COMM_SPLIT_NONE) {
        const int64_t *v = ct_data_ptr(all);
        int n = 0, new_rank = -1;
        for (int r = 0; r < c->size; r++)
            if (v[2 * r] == color)
                members[n++] = (member){v[2 * r + 1], r};
        qsort(members, (size_t)n, sizeof *members, member_cmp);
        for (int i = 0; i < n; i++) {
            new_to_old[i] = members[i].rank;
            if (members[i].rank == c->rank)
                new_rank = i;
        }
        *out = c->be->split(c, color, index, new_rank, n, new_to_old);
        if (!*out)
            rc = ct_errcode();
    }
    free(members);
    free(new_to_old);
    ct__tensor_release(in);
    ct__tensor_release(all);
    return rc;
}

/* ------------------------------------------------------- shared memory */

int ct__comm_agree(ct_comm *c, bool ok, int *first_failed) {
    int32_t first = ok ? c->size : c->rank;
    ct_tensor *t = ct_from_data(&first, 0, NULL, CT_INT32);
    int rc = t ? ct_comm_allreduce(c, t, CT_REDUCE_MIN, NULL) : ct_errcode();
    if (rc == 0)
        first = *(const int32_t *)ct_data_ptr(t);
    ct__tensor_release(t);
    *first_failed = rc == 0 && first < c->size ? first : -1;
    return rc;
}

int ct__comm_allgather_host(ct_comm *c, const int64_t *mine, int64_t n, int64_t *all) {
    ct_device dev = ct_comm_device(c);
    int64_t total = n * c->size;
    ct_tensor *host = ct__tensor_own(ct_from_data(mine, 1, &n, CT_INT64));
    ct_tensor *in = host ? ct__tensor_own(ct_to(host, dev)) : NULL;
    ct_tensor *out = ct__tensor_own(ct_empty_on(1, &total, CT_INT64, dev));
    int rc = in && out ? ct_comm_allgather(c, out, in, NULL) : ct_errcode();
    ct_tensor *back = rc ? NULL : ct__tensor_own(ct_to(out, CT_DEVICE_CPU));
    if (back)
        memcpy(all, ct_data_ptr(back), (size_t)total * sizeof *all);
    else if (!rc)
        rc = ct_errcode();
    ct_tensor_free(back);
    ct_tensor_free(out);
    ct_tensor_free(in);
    ct_tensor_free(host);
    return rc;
}

ct_tensor *ct_comm_zeros(ct_comm *c, int ndim, const int64_t *sizes, ct_dtype dtype) {
    const char *name = "comm_zeros";
    if (check_comm(c, name) || ct__tensor_check_shape(name, ndim, sizes, dtype))
        return NULL;
    int64_t numel = ct__tensor_numel(ndim, sizes);
    size_t bytes = (size_t)numel * ct__esize(dtype);
    int64_t mine[2] = {dtype, numel};
    int64_t *all = malloc(2 * (size_t)c->size * sizeof *all);
    int rc = all ? ct__comm_allgather_host(c, mine, 2, all)
                 : ct__err_set(CT_ENOMEM, "%s: out of memory for %d ranks", name, c->size);
    for (int r = 0; r < c->size && rc == 0; r++) {
        const int64_t *v = all + 2 * r;
        if (v[0] != dtype || v[1] != numel)
            rc = ct__err_set(CT_EINVAL,
                             "%s: ranks ask for different tensors: rank %d for %lld %s, rank %d "
                             "for %lld %s",
                             name, c->rank, (long long)numel, ct_dtype_name(dtype), r,
                             (long long)v[1], ct_dtype_name((ct_dtype)v[0]));
    }
    free(all);
    /* Without shared memory (the backend has none, or a rank could not make
     * its part), an ordinary tensor where the backend takes them. */
    ct_storage *s = NULL;
    if (rc == 0 && c->be->alloc_shared && bytes > 0)
        rc = c->be->alloc_shared(c, bytes, &s);
    ct_tensor *t = rc  ? NULL
                   : s ? ct_tensor_from_storage(s, 0, ndim, sizes, NULL, dtype)
                       : ct_full_on(ndim, sizes, 0, dtype, ct_comm_device(c));
    ct_storage_free(s);
    return t;
}
