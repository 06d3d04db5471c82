/* The hierarchical communicator: shm among the ranks of one machine, the
 * flat communicator's backend (gloo, mpi) among one rank per machine, as
 * Horovod's hierarchical allreduce and NCCL's trees across nodes do.
 *
 * It holds three communicators: the flat one over every rank (which it was
 * made from), local (shm, the ranks of this machine, ranked by their order
 * in the flat one) and cross (the flat backend, the ranks with this rank's
 * local index on every machine, ranked by machine). Every machine holds the
 * same number of ranks, L; there are H machines.
 *
 * The algorithms. Each shards the buffer over the L local ranks, so that
 * every rank carries 1/L of the data across machines and every rank's link
 * is used:
 *   allreduce       local reduce_scatter of the first L x floor(n/L)
 *                   elements into a shard, cross allreduce of the shard,
 *                   local allgather of the shards; the n mod L elements
 *                   left over take a local allreduce and a cross allreduce
 *                   on every local index (a few elements, for no extra
 *                   step);
 *   broadcast       on the root's machine a local broadcast; then a cross
 *                   broadcast of shard l from the root's machine; then, on
 *                   the other machines, a local allgather of the shards in
 *                   place (the left-over elements: a cross broadcast on
 *                   local index 0 and a local broadcast from it);
 *   allgather       cross allgather of this rank's block, local allgather
 *                   of those, in machine-major order through a permuted
 *                   view of out;
 *   reduce_scatter  local reduce_scatter of in's blocks permuted so that
 *                   local rank l gets block (h, l) of every machine h, then
 *                   a cross reduce_scatter.
 * allgather and reduce_scatter need the flat ranks machine-major (rank = h x
 * L + l, as ctlaunch, torchrun and Slurm's block distribution number them);
 * otherwise they, and every other operation (reduce, alltoall, barrier,
 * send, recv), run on the flat communicator.
 *
 * Numerics. A reduction sums within the machine first, then across
 * machines: the same on every rank, but not the flat backend's order, so
 * floating-point results may differ from the flat communicator's within
 * reassociation (integers, and floats whose sums are exact, agree bit for
 * bit). The steps of an avg sum, and the result is divided once at the
 * end, as on the other backends; float16 and bfloat16 reduce in a float32
 * copy and round to their dtype once.
 *
 * Agreement. Before the data steps, every rank's descriptor goes to every
 * rank (an allgather within the machine, then one across), and every rank
 * compares them all: ranks that disagree fail together with CT_EMISMATCH
 * naming both, before any data moves.
 *
 * Order. Every operation is a plan of steps on the three communicators,
 * each step waiting for at most one earlier step of its plan. Each
 * communicator has a queue of steps in plan order, and a step is issued
 * only from the head of its queue, so that every rank of a communicator
 * issues its steps in the same order however the plans' steps complete;
 * steps of later plans still overlap earlier ones (a machine's
 * reduce_scatter of the next bucket runs while this one crosses machines).
 *
 * Threads. The three communicators advance only on this communicator's
 * executor (their progress threads are off), which pumps them from
 * progress and is told, by CT__AGAIN, to keep polling while steps move;
 * plans, queues and the spare scratch are the executor's own.
 *
 * Failure. A failed step fails the plan with the step's error, prefixed
 * with where it ran and a legend of that communicator's ranks in global
 * ranks; comm.c then fails the group, and abort fails the three
 * communicators, whose peers learn it as their backends tell them. */
#include "coll_impl.h"
#include "tensor_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

enum { LOCAL, CROSS, FLAT, NSUB };
static const char *const sub_names[NSUB] = {"within the machine", "across machines", "flat"};

/* The most steps a plan takes (allreduce and broadcast: five, after the
 * two of the agreement). */
#define MAX_STEPS  7
#define DESC_BYTES ((int64_t)sizeof(ct__coll_desc))
/* Timeouts. A rank that is late keeps its machine's local step waiting,
 * and through it the cross step of the other machines: the local step
 * times out first and names the late rank, the cross step a little later
 * (its peer's failure note then names the rank instead of the peer), and
 * the operation itself later still (comm.c's deadline, deadline_margin). */
#define CROSS_MARGIN_S 0.5

typedef struct plan plan;

typedef struct step {
    plan *p;
    int sub;  /* LOCAL, CROSS or FLAT */
    int op;   /* ct__op */
    int rop;  /* reductions */
    int root; /* broadcast and reduce: the root; send and recv: the peer */
    int tag;  /* send and recv */
    int dep;  /* the step of the plan to wait for, or -1 */
    ct_tensor *out, *in;
    ct_work *work; /* once issued */
    bool done;
    struct step *next; /* the queue of its communicator */
} step;

struct plan {
    ct_work *w;
    int nsteps, ndone;
    int err; /* 0, or the CT_E* code of the first failed step (w->msg set) */
    step steps[MAX_STEPS];
    ct_tensor *scratch;
    bool spare; /* scratch is the communicator's spare */
    /* Reductions run their steps as sums where the op is avg, and in
     * float32 for float16 and bfloat16; when finish is set, the result's
     * acc_n elements in acc then go to w->out, divided and rounded once.
     * acc_in holds a float32 copy of the input. */
    bool finish;
    ct_tensor *acc, *acc_in;
    int64_t acc_n;
    /* The agreement: every rank's descriptor, gathered within the machine
     * (descs) and then across machines (all, machine-major), by steps 0 and
     * 1, which the data steps wait for; checked once, before any of them is
     * issued. agree is -1 for plans without one (those on flat). */
    int agree;
    bool checked;
    ct_tensor *mine, *descs, *all;
    plan *next, *prev; /* the live plans */
};

typedef struct hier {
    ct_comm *sub[NSUB];
    int L, H;           /* ranks per machine, machines */
    int *host, *local;  /* per flat rank: machine and local index */
    bool machine_major; /* flat rank == host x L + local for every rank */
    step *head[NSUB], *tail[NSUB];
    plan *live;
    /* The largest scratch so far, lent to one plan at a time (spare_busy):
     * a training loop's allreduces of the same buckets reuse memory that is
     * already mapped instead of faulting in a new buffer each call. */
    ct_storage *spare;
    bool spare_busy;
} hier;

static hier *impl(const ct_comm *c) { return c->impl; }

/* --------------------------------------------------------------- plans */

/* A view of n elements of the contiguous t from element off, with sizes
 * and strides when given (ndim dimensions), else flat. */
static ct_tensor *view_of(ct_tensor *t, int64_t off, int ndim, const int64_t *sizes,
                          const int64_t *strides) {
    return ct__tensor_own(ct_tensor_from_storage(ct_tensor_storage(t), ct_tensor_offset(t) + off,
                                                 ndim, sizes, strides, t->dtype));
}

static ct_tensor *flat_view(ct_tensor *t, int64_t off, int64_t n) {
    return view_of(t, off, 1, &n, NULL);
}

/* Appends a step to p: arg is the rop of a reduction, else the root; out
 * and in are references the step takes (NULL for none). Returns its index,
 * or -1 with the error recorded when a view could not be made (out or in
 * NULL where wanted). */
static int add(plan *p, int sub, int op, int arg, int dep, ct_tensor *out, ct_tensor *in,
               bool want_out, bool want_in) {
    CT_ASSERT(p->nsteps < MAX_STEPS);
    step *s = &p->steps[p->nsteps];
    *s =
        (step){.p = p, .sub = sub, .op = op, .dep = dep < 0 ? p->agree : dep, .out = out, .in = in};
    if (ct__op_reduces(op))
        s->rop = arg;
    else
        s->root = arg;
    p->nsteps++;
    if ((want_out && !out) || (want_in && !in))
        return -1;
    return p->nsteps - 1;
}

/* A scratch tensor of n elements of dt for p: on the spare storage when no
 * plan holds it (grown first if it is too small), else a new one. NULL
 * with the error recorded. */
static ct_tensor *scratch_of(hier *h, plan *p, int64_t n, ct_dtype dt) {
    size_t bytes = (size_t)n * ct_dtype_size(dt);
    if (h->spare_busy || n == 0)
        return ct__tensor_own(ct_empty(1, &n, dt));
    if (!h->spare || ct_storage_nbytes(h->spare) < bytes) {
        ct_storage_free(h->spare);
        if (!(h->spare = ct_storage_new(bytes, CT_DEVICE_CPU)))
            return NULL;
    }
    h->spare_busy = p->spare = true;
    return ct__tensor_own(ct_tensor_from_storage(h->spare, 0, 1, &n, NULL, dt));
}

static void plan_free(hier *h, plan *p) {
    if (p->spare)
        h->spare_busy = false;
    for (int i = 0; i < p->nsteps; i++) {
        step *s = &p->steps[i];
        ct_work_free(s->work);
        ct_tensor_free(s->out);
        ct_tensor_free(s->in);
    }
    ct_tensor_free(p->scratch);
    ct_tensor_free(p->acc);
    ct_tensor_free(p->acc_in);
    ct_tensor_free(p->mine);
    ct_tensor_free(p->descs);
    ct_tensor_free(p->all);
    free(p);
}

static ct_tensor *bytes(int64_t n) { return ct__tensor_own(ct_empty(1, &n, CT_UINT8)); }

/* Steps 0 and 1: this rank's descriptor to every rank. */
static int plan_agreement(hier *h, plan *p, ct_work *w) {
    if (!(p->mine = bytes(DESC_BYTES)) || !(p->descs = bytes(h->L * DESC_BYTES)) ||
        !(p->all = bytes((int64_t)h->H * h->L * DESC_BYTES)))
        return -1;
    memcpy(ct__data(p->mine), &w->desc, sizeof w->desc);
    int ag = add(p, LOCAL, CT__ALLGATHER, 0, -1, ct_tensor_retain(p->descs),
                 ct_tensor_retain(p->mine), true, true);
    p->agree = add(p, CROSS, CT__ALLGATHER, 0, ag, ct_tensor_retain(p->all),
                   ct_tensor_retain(p->descs), true, true);
    return 0;
}

/* Whether every rank's descriptor matches rank 0's; else fails p with
 * CT_EMISMATCH naming both, as every rank does from the same table. */
static void check_agreement(hier *h, plan *p) {
    p->checked = true;
    const ct_comm *c = p->w->comm;
    const char *all = ct__data(p->all);
    ct__coll_desc first, other;
    for (int r = 0; r < c->size; r++) {
        int64_t at = ((int64_t)h->host[r] * h->L + h->local[r]) * DESC_BYTES;
        memcpy(r ? &other : &first, all + at, sizeof first);
        if (r == 0 || ct__coll_desc_match(&first, &other))
            continue;
        p->err = CT_EMISMATCH;
        ct__coll_disagree_msg(p->w->msg, sizeof p->w->msg, p->w->desc.op, &first, &other, r);
        return;
    }
}

static bool is_half(ct_dtype dt) { return dt == CT_FLOAT16 || dt == CT_BFLOAT16; }

/* The tensor a reduction over t (n elements) runs in: a float32 copy for
 * the 16-bit floats (of t's values when load), else t. NULL with the error
 * recorded. */
static ct_tensor *reduction_buffer(ct_tensor *t, int64_t n, bool load) {
    if (!is_half(t->dtype))
        return ct_tensor_retain(t);
    ct_tensor *acc = ct__tensor_own(ct_empty(1, &n, CT_FLOAT32));
    if (acc && load)
        ct__coll_acc_load(ct__data(acc), ct__data(t), n, t->dtype);
    return acc;
}

/* The op the steps of a reduction run, and whether its result needs the
 * finish of struct plan. */
static int step_rop(plan *p, const ct_work *w) {
    ct_reduce_op rop = (ct_reduce_op)w->desc.rop;
    p->finish = rop == CT_REDUCE_AVG || is_half((ct_dtype)w->desc.dtype);
    return rop == CT_REDUCE_AVG ? CT_REDUCE_SUM : rop;
}

/* allreduce of w->out (n elements) in place. */
static int plan_allreduce(hier *h, plan *p, ct_work *w) {
    int64_t n = w->desc.count, q = n / h->L, body = q * h->L, tail = n - body;
    int rop = step_rop(p, w);
    ct_tensor *t = p->acc = reduction_buffer(w->out_ref, n, true);
    p->acc_n = n;
    if (!t)
        return -1;
    if (q > 0) {
        p->scratch = scratch_of(h, p, q, t->dtype);
        if (!p->scratch)
            return -1;
        int rs = add(p, LOCAL, CT__REDUCE_SCATTER, rop, -1, ct_tensor_retain(p->scratch),
                     flat_view(t, 0, body), true, true);
        if (rs < 0)
            return -1;
        int ar =
            add(p, CROSS, CT__ALLREDUCE, rop, rs, ct_tensor_retain(p->scratch), NULL, true, false);
        if (add(p, LOCAL, CT__ALLGATHER, 0, ar, flat_view(t, 0, body), ct_tensor_retain(p->scratch),
                true, true) < 0)
            return -1;
    }
    if (tail > 0) {
        int ar = add(p, LOCAL, CT__ALLREDUCE, rop, -1, flat_view(t, body, tail), NULL, true, false);
        if (ar < 0 ||
            add(p, CROSS, CT__ALLREDUCE, rop, ar, flat_view(t, body, tail), NULL, true, false) < 0)
            return -1;
    }
    return 0;
}

/* broadcast of w->out (n elements) from flat rank root. */
static int plan_broadcast(hier *h, plan *p, ct_work *w) {
    ct_tensor *t = w->out_ref;
    int me = w->comm->rank, root = w->desc.root;
    int rh = h->host[root], rl = h->local[root], l = h->local[me];
    bool root_machine = h->host[me] == rh;
    int64_t n = w->desc.count, q = n / h->L, body = q * h->L, tail = n - body;
    int first = -1;
    if (root_machine &&
        (first = add(p, LOCAL, CT__BROADCAST, rl, -1, ct_tensor_retain(t), NULL, true, false)) < 0)
        return -1;
    if (q > 0) {
        int bc = add(p, CROSS, CT__BROADCAST, rh, first, flat_view(t, l * q, q), NULL, true, false);
        if (bc < 0)
            return -1;
        if (!root_machine && add(p, LOCAL, CT__ALLGATHER, 0, bc, flat_view(t, 0, body),
                                 flat_view(t, l * q, q), true, true) < 0)
            return -1;
    }
    if (tail > 0) {
        int bc = first;
        if (l == 0 && (bc = add(p, CROSS, CT__BROADCAST, rh, first, flat_view(t, body, tail), NULL,
                                true, false)) < 0)
            return -1;
        if (!root_machine &&
            add(p, LOCAL, CT__BROADCAST, 0, bc, flat_view(t, body, tail), NULL, true, false) < 0)
            return -1;
    }
    return 0;
}

/* allgather: in (m elements) into out (H x L x m, machine-major). The cross
 * step gathers block (h', l) of every machine h' into scratch (H x m); the
 * local step gathers the scratches of the machine into out seen as L x H x
 * m, a permuted view that comm.c stages. */
static int plan_allgather(hier *h, plan *p, ct_work *w) {
    int64_t m = w->desc.count, hm = (int64_t)h->H * m;
    p->scratch = scratch_of(h, p, hm, w->in_ref->dtype);
    if (!p->scratch)
        return -1;
    int ag = add(p, CROSS, CT__ALLGATHER, 0, -1, ct_tensor_retain(p->scratch),
                 ct_tensor_retain(w->in_ref), true, true);
    int64_t sizes[3] = {h->L, h->H, m}, strides[3] = {m, (int64_t)h->L * m, 1};
    if (ag < 0 || add(p, LOCAL, CT__ALLGATHER, 0, ag, view_of(w->out_ref, 0, 3, sizes, strides),
                      ct_tensor_retain(p->scratch), true, true) < 0)
        return -1;
    return 0;
}

/* reduce_scatter: in (H x L x m, machine-major) into out (m). The local
 * step reduces in seen as L x H x m (staged by comm.c) into scratch (H x
 * m): local rank l gets block (h', l) of every machine; the cross step
 * reduces those into block (h, l). */
static int plan_reduce_scatter(hier *h, plan *p, ct_work *w) {
    int64_t m = w->desc.count, hm = (int64_t)h->H * m;
    int rop = step_rop(p, w);
    p->acc_in = reduction_buffer(w->in_ref, hm * h->L, true);
    p->acc = reduction_buffer(w->out_ref, m, false);
    p->acc_n = m;
    if (!p->acc_in || !p->acc || !(p->scratch = scratch_of(h, p, hm, p->acc->dtype)))
        return -1;
    int64_t sizes[3] = {h->L, h->H, m}, strides[3] = {m, (int64_t)h->L * m, 1};
    int rs = add(p, LOCAL, CT__REDUCE_SCATTER, rop, -1, ct_tensor_retain(p->scratch),
                 view_of(p->acc_in, 0, 3, sizes, strides), true, true);
    if (rs < 0 || add(p, CROSS, CT__REDUCE_SCATTER, rop, rs, ct_tensor_retain(p->acc),
                      ct_tensor_retain(p->scratch), true, true) < 0)
        return -1;
    return 0;
}

/* Any operation as one step on the flat communicator. */
static int plan_flat(plan *p, ct_work *w) {
    const ct__coll_desc *d = &w->desc;
    int s = add(p, FLAT, d->op, d->rop, -1, w->out_ref ? ct_tensor_retain(w->out_ref) : NULL,
                w->in_ref ? ct_tensor_retain(w->in_ref) : NULL, false, false);
    p->steps[s].root = d->root;
    p->steps[s].tag = d->tag;
    return 0;
}

/* Makes w's plan into w->be and queues its steps: 0, or a CT_E* code with
 * w->msg set. */
static int plan_new(ct_comm *c, ct_work *w) {
    hier *h = impl(c);
    plan *p = calloc(1, sizeof *p);
    if (!p)
        return ct__work_fail(w, CT_ENOMEM, "hierarchical %s: out of memory",
                             ct__coll_op_name(w->desc.op));
    p->w = w;
    p->agree = -1;
    bool hierarchical =
        w->desc.op == CT__ALLREDUCE || w->desc.op == CT__BROADCAST ||
        (h->machine_major && (w->desc.op == CT__ALLGATHER || w->desc.op == CT__REDUCE_SCATTER));
    int rc = hierarchical ? plan_agreement(h, p, w) : 0;
    if (!rc)
        switch (w->desc.op) {
        case CT__ALLREDUCE: rc = plan_allreduce(h, p, w); break;
        case CT__BROADCAST: rc = plan_broadcast(h, p, w); break;
        case CT__ALLGATHER: rc = hierarchical ? plan_allgather(h, p, w) : plan_flat(p, w); break;
        case CT__REDUCE_SCATTER:
            rc = hierarchical ? plan_reduce_scatter(h, p, w) : plan_flat(p, w);
            break;
        default: rc = plan_flat(p, w); break;
        }
    if (rc) {
        plan_free(h, p);
        return ct__work_fail(w, ct_errcode(), "hierarchical %s: %s", ct__coll_op_name(w->desc.op),
                             ct_errmsg());
    }
    for (int i = 0; i < p->nsteps; i++) {
        step *s = &p->steps[i];
        if (h->tail[s->sub])
            h->tail[s->sub]->next = s;
        else
            h->head[s->sub] = s;
        h->tail[s->sub] = s;
    }
    p->next = h->live;
    if (h->live)
        h->live->prev = p;
    h->live = p;
    memcpy(w->be, &p, sizeof p);
    return 0;
}

static void plan_unlink(hier *h, plan *p) {
    if (p->prev)
        p->prev->next = p->next;
    else
        h->live = p->next;
    if (p->next)
        p->next->prev = p->prev;
}

/* ------------------------------------------------------------- running */

/* " (its ranks 0, 1, ... are ranks 2, 3, ...)": the legend of sub's ranks
 * in this communicator's, for messages that name them. */
static void legend(const hier *h, const ct_comm *c, int sub, char *buf, size_t n) {
    int me = c->rank;
    ct__coll_msg_append(buf, n, " (there, rank");
    if (sub == LOCAL) {
        for (int r = 0, k = 0; r < c->size; r++)
            if (h->host[r] == h->host[me])
                ct__coll_msg_append(buf, n, "%s %d is rank %d", k++ ? "," : "", h->local[r], r);
    } else {
        for (int m = 0; m < h->H; m++)
            for (int r = 0; r < c->size; r++)
                if (h->host[r] == m && h->local[r] == h->local[me])
                    ct__coll_msg_append(buf, n, "%s %d is rank %d", m ? "," : "", m, r);
    }
    ct__coll_msg_append(buf, n, ")");
}

static void step_fail(hier *h, step *s, int code, const char *what) {
    plan *p = s->p;
    if (p->err)
        return;
    ct_comm *c = p->w->comm;
    char d[256];
    p->err = code;
    snprintf(p->w->msg, sizeof p->w->msg,
             "%s: its %s step %s: ", ct__coll_desc_str(d, sizeof d, &p->w->desc),
             ct__coll_op_name(s->op), sub_names[s->sub]);
    ct__coll_msg_append(p->w->msg, sizeof p->w->msg, "%s", what);
    if (s->sub != FLAT)
        legend(h, c, s->sub, p->w->msg, sizeof p->w->msg);
}

static int issue(hier *h, step *s) {
    ct_comm *sub = h->sub[s->sub];
    ct_work **wk = &s->work;
    ct_reduce_op rop = (ct_reduce_op)s->rop;
    switch (s->op) {
    case CT__ALLREDUCE: return ct_comm_allreduce(sub, s->out, rop, wk);
    case CT__BROADCAST: return ct_comm_broadcast(sub, s->out, s->root, wk);
    case CT__REDUCE: return ct_comm_reduce(sub, s->out, rop, s->root, wk);
    case CT__ALLGATHER: return ct_comm_allgather(sub, s->out, s->in, wk);
    case CT__REDUCE_SCATTER: return ct_comm_reduce_scatter(sub, s->out, s->in, rop, wk);
    case CT__ALLTOALL: return ct_comm_alltoall(sub, s->out, s->in, wk);
    case CT__BARRIER: return ct_comm_barrier(sub, wk);
    case CT__SEND: return ct_comm_send(sub, s->in, s->root, s->tag, wk);
    case CT__RECV: return ct_comm_recv(sub, s->out, s->root, s->tag, wk);
    }
    return ct__err_set(CT_EINVAL, "hierarchical: unknown op %d", s->op);
}

/* Issues what the queues allow, advances the three communicators and
 * notes the steps that completed, until nothing moves. Returns whether
 * anything did. */
static bool pump(hier *h) {
    bool any = false;
    for (bool moved = true; moved; any |= moved) {
        moved = false;
        for (int k = 0; k < NSUB; k++) {
            step *s;
            while ((s = h->head[k]) && (s->dep < 0 || s->p->steps[s->dep].done || s->p->err)) {
                h->head[k] = s->next;
                if (!h->head[k])
                    h->tail[k] = NULL;
                s->next = NULL;
                if (s->dep >= 0 && s->dep == s->p->agree && !s->p->checked && !s->p->err)
                    check_agreement(h, s->p);
                if (s->p->err)
                    continue;
                int rc = issue(h, s);
                if (rc)
                    step_fail(h, s, rc, ct_errmsg());
                moved = true;
            }
            ct_comm_progress(h->sub[k]);
        }
        for (plan *p = h->live; p; p = p->next)
            for (int i = 0; i < p->nsteps; i++) {
                step *s = &p->steps[i];
                if (!s->work || s->done)
                    continue;
                int rc = ct_work_test(s->work);
                if (rc == 0)
                    continue;
                moved = true;
                s->done = true;
                if (rc < 0)
                    step_fail(h, s, rc, ct_errmsg());
                else
                    p->ndone++;
            }
    }
    return any;
}

/* Where w stands: CT__DONE (its plan freed), CT__PENDING, or its error. */
static int settle(hier *h, ct_work *w) {
    plan *p;
    memcpy(&p, w->be, sizeof p);
    if (!p->err && p->ndone < p->nsteps)
        return CT__PENDING;
    if (p->err)
        return p->err;
    if (p->finish)
        ct__coll_acc_store(w->out, ct__data(p->acc), p->acc_n, (ct_dtype)w->desc.dtype,
                           (ct_reduce_op)w->desc.rop, w->comm->size);
    plan_unlink(h, p);
    plan_free(h, p);
    return CT__DONE;
}

static int hier_start(ct_comm *c, ct_work *w) {
    hier *h = impl(c);
    double timeout = atomic_load(&c->timeout);
    for (int k = 0; k < NSUB; k++)
        atomic_store(&h->sub[k]->timeout, timeout + (k == CROSS ? CROSS_MARGIN_S : 0));
    int rc = plan_new(c, w);
    if (rc)
        return rc;
    pump(h);
    return settle(h, w);
}

static int hier_progress(ct_comm *c, ct_work *w) {
    hier *h = impl(c);
    bool moved = pump(h);
    int rc = settle(h, w);
    return rc == CT__PENDING && moved ? CT__AGAIN : rc;
}

static int hier_poll(ct_comm *c, char *msg) {
    hier *h = impl(c);
    for (int k = 0; k < NSUB; k++) {
        char sub[CT__MSG_LEN];
        int rc = ct__comm_check(h->sub[k], sub);
        if (rc < 0) {
            /* Named after the oldest operation, which waits on it. */
            const plan *oldest = h->live;
            while (oldest && oldest->next)
                oldest = oldest->next;
            char d[256] = "hierarchical";
            if (oldest)
                ct__coll_desc_str(d, sizeof d, &oldest->w->desc);
            snprintf(msg, CT__MSG_LEN, "%s: the communicator %s failed: ", d, sub_names[k]);
            ct__coll_msg_append(msg, CT__MSG_LEN, "%s", sub);
            if (k != FLAT)
                legend(h, c, k, msg, CT__MSG_LEN);
            return rc;
        }
    }
    return 0;
}

static void hier_describe_timeout(ct_comm *c, const ct_work *w, char *msg) {
    hier *h = impl(c);
    plan *p;
    memcpy(&p, w->be, sizeof p);
    for (int i = 0; i < p->nsteps; i++) {
        step *s = &p->steps[i];
        if (s->done)
            continue;
        ct__coll_msg_append(msg, CT__MSG_LEN, "; it waits in its %s step %s%s",
                            ct__coll_op_name(s->op), sub_names[s->sub],
                            s->work ? "" : ", not yet issued");
        if (s->work) {
            ct_comm *sub = h->sub[s->sub];
            sub->be->describe_timeout(sub, s->work, msg);
        }
        if (s->sub != FLAT)
            legend(h, c, s->sub, msg, CT__MSG_LEN);
        return;
    }
}

/* Fails the three communicators (their backends tell their peers), then
 * frees every plan: their steps' works are done, as the communicators
 * failed them. */
static void hier_abort(ct_comm *c, int code, const char *msg) {
    hier *h = impl(c);
    for (int k = 0; k < NSUB; k++)
        ct__comm_fail(h->sub[k], code, msg);
    for (int k = 0; k < NSUB; k++)
        h->head[k] = h->tail[k] = NULL;
    while (h->live) {
        plan *p = h->live;
        plan_unlink(h, p);
        plan_free(h, p);
    }
}

static void hier_destroy(ct_comm *c) {
    hier *h = impl(c);
    while (h->live) {
        plan *p = h->live;
        plan_unlink(h, p);
        plan_free(h, p);
    }
    for (int k = 0; k < NSUB; k++)
        ct_comm_free(h->sub[k]);
    ct_storage_free(h->spare);
    free(h->host);
    free(h->local);
    free(h);
}

static int hier_check_tensor(ct_comm *c, const char *op, const ct_tensor *t) {
    ct_comm *flat = impl(c)->sub[FLAT];
    return flat->be->check_tensor(flat, op, t);
}

static int hier_split_direct(ct_comm *c, int color, int key, ct_comm **out) {
    return ct_comm_split(impl(c)->sub[FLAT], color, key, out);
}

const ct__backend ct__hier_backend = {
    .kind = CT_BACKEND_HIER,
    .deadline_margin = 2 * CROSS_MARGIN_S,
    .destroy = hier_destroy,
    .check_tensor = hier_check_tensor,
    .start = hier_start,
    .progress = hier_progress,
    .poll = hier_poll,
    .describe_timeout = hier_describe_timeout,
    .abort = hier_abort,
    .split_direct = hier_split_direct,
};

/* --------------------------------------------------------------- making */

/* Each rank's machine and local index from every rank's machine id: the
 * machines in order of their first rank, the local indices in rank order.
 * Fails unless every machine holds the same number of ranks. */
static int layout(hier *h, const int64_t *ids, int size) {
    int *count = calloc((size_t)size, sizeof *count);
    int64_t *seen = malloc((size_t)size * sizeof *seen);
    int rc = 0;
    if (!count || !seen) {
        rc = ct__err_set(CT_ENOMEM, "comm_hierarchical: out of memory for %d ranks", size);
        goto out;
    }
    h->H = 0;
    for (int r = 0; r < size; r++) {
        int m = 0;
        while (m < h->H && seen[m] != ids[r])
            m++;
        if (m == h->H)
            seen[h->H++] = ids[r];
        h->host[r] = m;
        h->local[r] = count[m]++;
    }
    h->L = count[0];
    h->machine_major = true;
    for (int m = 0; m < h->H; m++)
        if (count[m] != h->L) {
            int first = 0;
            while (h->host[first] != m)
                first++;
            rc = ct__err_set(CT_EINVAL,
                             "comm_hierarchical: the machines hold different numbers of ranks "
                             "(%d on rank 0's, %d on rank %d's); hierarchical collectives need "
                             "the same number on each",
                             h->L, count[m], first);
            goto out;
        }
    for (int r = 0; r < size; r++)
        h->machine_major &= r == h->host[r] * h->L + h->local[r];
out:
    free(count);
    free(seen);
    return rc;
}

/* The local shm communicator: its first rank names the segment and tells
 * the others over a split of flat. */
static int make_local(hier *h, ct_comm *flat, ct_comm **out) {
    int me = flat->rank;
    ct_comm *group = NULL;
    int rc = ct_comm_split(flat, h->host[me], h->local[me], &group);
    char name[64] = "";
    if (!rc && h->local[me] == 0) {
        unsigned char rnd[12];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
            memset(rnd, 0, sizeof rnd); /* the pid still keeps jobs apart */
        int len = snprintf(name, sizeof name, "/ct-hier-%ld-", (long)getpid());
        for (size_t i = 0; i < sizeof rnd; i++)
            len += snprintf(name + len, sizeof name - (size_t)len, "%02x", rnd[i]);
    }
    ct_tensor *t =
        rc ? NULL : ct__tensor_own(ct_from_data(name, 1, (int64_t[]){sizeof name}, CT_UINT8));
    if (!rc)
        rc = t ? ct_comm_broadcast(group, t, 0, NULL) : ct_errcode();
    if (!rc) {
        memcpy(name, ct_data_ptr(t), sizeof name);
        name[sizeof name - 1] = 0;
        ct_comm_config cfg = {.backend = CT_BACKEND_SHM,
                              .rank = h->local[me],
                              .size = h->L,
                              .timeout_s = ct_comm_timeout(flat),
                              .shm_name = name};
        *out = ct_comm_new(&cfg);
        if (!*out)
            rc = ct_errcode();
    }
    ct_tensor_free(t);
    ct_comm_free(group);
    return rc;
}

int ct_comm_hierarchical(ct_comm *flat, uint64_t machine, ct_comm **out) {
    const char *name = "comm_hierarchical";
    if (!out)
        return ct__err_set(CT_EINVAL, "%s: out is NULL", name);
    *out = NULL;
    if (!flat)
        return ct__err_set(CT_EINVAL, "%s: flat is NULL", name);
    if (flat->be->kind == CT_BACKEND_HIER || flat->be->kind == CT_BACKEND_NCCL)
        return ct__err_set(CT_EINVAL,
                           "%s: the flat communicator's backend is %s; it must be gloo, "
                           "mpi or shm (host tensors)",
                           name, ct_backend_name(flat->be->kind));
    hier *h = calloc(1, sizeof *h);
    int size = flat->size, rc = 0;
    int64_t *ids = malloc((size_t)size * sizeof *ids);
    if (h) {
        h->host = malloc((size_t)size * sizeof *h->host);
        h->local = malloc((size_t)size * sizeof *h->local);
    }
    int64_t mine;
    memcpy(&mine, &machine, sizeof mine);
    if (!h || !ids || !h->host || !h->local)
        rc = ct__err_set(CT_ENOMEM, "%s: out of memory for %d ranks", name, size);
    else
        rc = ct__comm_allgather_host(flat, &mine, 1, ids);
    if (!rc)
        rc = layout(h, ids, size);
    free(ids);
    /* Every rank computed the same layout, so all fail here or none. */
    if (!rc)
        rc = make_local(h, flat, &h->sub[LOCAL]);
    int first_failed = -1;
    int arc = ct__comm_agree(flat, rc == 0, &first_failed);
    if (!rc && (arc || first_failed >= 0))
        rc = arc ? arc
                 : ct__err_set(CT_EPEER,
                               "%s: rank %d could not make its machine's shm "
                               "communicator (its own error says why)",
                               name, first_failed);
    if (!rc)
        rc = ct_comm_split(flat, h->local[flat->rank], h->host[flat->rank], &h->sub[CROSS]);
    ct_comm *c = rc ? NULL : ct__comm_alloc(&ct__hier_backend, flat->rank, size, flat->timeout);
    if (!rc && !c)
        rc = ct_errcode();
    if (rc) {
        if (h) {
            ct_comm_free(h->sub[LOCAL]);
            ct_comm_free(h->sub[CROSS]);
            free(h->host);
            free(h->local);
        }
        free(h);
        return rc;
    }
    h->sub[FLAT] = flat;
    for (int k = 0; k < NSUB; k++)
        ct_comm_set_progress_thread(h->sub[k], false);
    c->impl = h;
    *out = ct__comm_activate(c);
    return *out ? 0 : ct_errcode();
}
