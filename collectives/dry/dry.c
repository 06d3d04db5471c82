/* The dry backend (CT_BACKEND_DRY): one process plays one rank of a group
 * of any size alone, as if every other rank held what it holds. Each
 * collective completes as it starts: on the meta device it moves nothing;
 * on the host it writes what a group of identical ranks would get (a sum is
 * size times this rank's value, an allgather size copies of it), so that
 * code which reads a collective's answer (data parallel's agreement
 * checks) runs its ordinary path. ct_memory_plan (dist/plan.c) drives data
 * parallel and the sharded stages through it on meta tensors. Point to
 * point has no peer to meet and is refused as it is issued. */
#include "coll_impl.h"
#include "tensor_impl.h"

#include <stdlib.h>
#include <string.h>

static int dry_init(ct_comm *c, const ct_comm_config *cfg) {
    (void)cfg;
    c->impl = c; /* no state of its own; non-NULL marks it made */
    return 0;
}

static void dry_destroy(ct_comm *c) { c->impl = NULL; }

static int dry_check_tensor(ct_comm *c, const char *op, const ct_tensor *t) {
    (void)c, (void)op, (void)t;
    return 0;
}

/* out := the reduction by op of size copies of in (n elements each), as
 * the ranks' reduction would give them: through the accumulator type, so
 * that 16-bit floats and averages round as the real backends round. */
static int reduce_copies(ct_comm *c, ct_work *w, void *out, const void *in, int64_t n) {
    ct_dtype dt = (ct_dtype)w->desc.dtype;
    ct_reduce_op op = (ct_reduce_op)w->desc.rop;
    void *acc = n > 0 ? malloc((size_t)n * ct__coll_acc_size(dt)) : NULL;
    if (n > 0 && !acc)
        return ct__work_fail(w, CT_ENOMEM, "%s: out of memory for %lld elements",
                             ct__coll_op_name(w->desc.op), (long long)n);
    if (n > 0) {
        ct__coll_acc_load(acc, in, n, dt);
        for (int r = 1; r < c->size; r++)
            ct__coll_acc_combine(acc, acc, in, n, dt, op);
        ct__coll_acc_store(out, acc, n, dt, op, c->size);
    }
    free(acc);
    return CT__DONE;
}

/* Refused as it is issued, so that the communicator stays usable: the
 * caller's mistake, not a failure of the group. */
static int dry_issue(ct_comm *c, ct_work *w) {
    const ct__coll_desc *d = &w->desc;
    if (!ct__op_is_p2p(d->op))
        return 0;
    return ct__err_set(CT_ENOTSUP,
                       "%s: a dry communicator has no peers: rank %d cannot %s rank %d (plan "
                       "point-to-point traffic by hand)",
                       ct__coll_op_name(d->op), c->rank,
                       d->op == CT__SEND ? "send to" : "receive from", d->root);
}

static int dry_start(ct_comm *c, ct_work *w) {
    const ct__coll_desc *d = &w->desc;
    ct_tensor *ref = w->out_ref ? w->out_ref : w->in_ref;
    if (!ref || !ct__is_host(ct_tensor_device(ref)))
        return CT__DONE;
    size_t es = ct_dtype_size((ct_dtype)d->dtype);
    switch (d->op) {
    case CT__ALLREDUCE: return reduce_copies(c, w, w->out, w->in, d->count);
    case CT__REDUCE:
        return d->root == c->rank ? reduce_copies(c, w, w->out, w->in, d->count) : CT__DONE;
    case CT__REDUCE_SCATTER:
        return reduce_copies(c, w, w->out, (const char *)w->in + (size_t)c->rank * d->count * es,
                             d->count);
    case CT__ALLGATHER:
        for (int r = 0; r < c->size; r++)
            memmove((char *)w->out + (size_t)r * d->count * es, w->in, (size_t)d->count * es);
        return CT__DONE;
    case CT__ALLTOALL: {
        /* Every rank sends this rank the chunk this rank would send itself. */
        size_t chunk = (size_t)(d->count / c->size) * es;
        for (int r = 0; r < c->size; r++)
            if (r != c->rank)
                memmove((char *)w->out + (size_t)r * chunk,
                        (const char *)w->in + (size_t)c->rank * chunk, chunk);
        if (w->out != w->in)
            memmove((char *)w->out + (size_t)c->rank * chunk,
                    (const char *)w->in + (size_t)c->rank * chunk, chunk);
        return CT__DONE;
    }
    default: return CT__DONE; /* broadcast: every rank holds the root's already; barrier */
    }
}

static int dry_progress(ct_comm *c, ct_work *w) {
    (void)c, (void)w;
    return CT__DONE;
}

static int dry_poll(ct_comm *c, char *msg) {
    (void)c, (void)msg;
    return 0;
}

static void dry_describe_timeout(ct_comm *c, const ct_work *w, char *msg) {
    (void)c, (void)w, (void)msg;
}

static ct_comm *dry_split(ct_comm *c, int color, uint64_t index, int new_rank, int new_size,
                          const int *new_to_old) {
    (void)color, (void)index, (void)new_to_old;
    ct_comm *child = ct__comm_alloc(&ct__dry_backend, new_rank, new_size, c->timeout);
    if (!child)
        return NULL;
    child->impl = child;
    return ct__comm_activate(child);
}

const ct__backend ct__dry_backend = {
    .kind = CT_BACKEND_DRY,
    .init = dry_init,
    .destroy = dry_destroy,
    .check_tensor = dry_check_tensor,
    .issue = dry_issue,
    .start = dry_start,
    .progress = dry_progress,
    .poll = dry_poll,
    .describe_timeout = dry_describe_timeout,
    .split = dry_split,
};
