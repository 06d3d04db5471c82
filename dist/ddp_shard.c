/* ZeRO stages 1 and 2 for ct_ddp (DeepSpeed's ZeRO, llm.c's -z 1).
 *
 * The parameters lie in one flat buffer (ct_module_flatten), and rank r owns
 * the range [r B, (r + 1) B) of it, the last rank also the remainder
 * (B = total / N, rounded down to 16 elements once it exceeds 64, so that
 * every shard starts aligned for the optimizer's vector loops). An
 * optimizer made by ct_ddp_optim_new holds one "piece" per parameter that
 * meets the range: a 1-d view of the parameter's elements there, whose
 * .grad is a view of the averaged gradient. Its step updates the shard, and
 * an after-step hook allgathers the flat buffer in place (the remainder
 * goes by a broadcast from the last rank).
 *
 * ZeRO-1 keeps ct_ddp's replicated gradient buffer and allreduce; the
 * pieces' gradients are views into it. ZeRO-2 keeps only this rank's
 * averaged gradients: each bucket is a range of the flat parameters that
 * one rank owns, cut from the top (the order gradients come in) at
 * ownership boundaries and at the bucket cap. A parameter's gradient moves,
 * as it arrives, out of .grad into its buckets' staging (two slots of
 * memory every rank maps, used in turn), and a bucket whose parameters have
 * all arrived starts its reduce (average) to the owner, which copies the
 * result into its gradient shard when the reduce is waited for: when its
 * slot is needed again, or at the end of backward. A parameter whose slot
 * is still being filled by an earlier bucket (gradients out of the expected
 * order) stays in .grad until the end of backward. The usage map travels
 * as an allreduce of its own at the end. */
#include "ddp_impl.h"

#include <ct/autograd.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSLOTS 2
/* Shards are rounded to this many elements once they exceed SHARD_ROUND_MIN. */
#define SHARD_ALIGN     16
#define SHARD_ROUND_MIN 64
/* ZeRO-2's default bucket cap: a sixteenth of the gradients, so that its
 * two slots hold an eighth; never above CT_DDP_BUCKET_BYTES, never below
 * this. */
#define ZERO2_MIN_BUCKET_BYTES (64 << 10)

static const char *op = "ddp";

typedef enum bucket_state { IDLE, FILLING, LAUNCHED } bucket_state;

typedef struct shard_bucket {
    int owner;
    int slot; /* while FILLING or LAUNCHED */
    bucket_state state;
} shard_bucket;

struct ddp_shard {
    int64_t total; /* elements of the flat parameters */
    int64_t block; /* B */
    int64_t lo, hi;
    ct_tensor *flat_params; /* [total], over the parameters' storage */
    int64_t *poff;          /* [n] each parameter's offset in it */
    /* ZeRO-2 */
    ct_tensor *grad; /* [hi - lo]: this rank's averaged gradients */
    ct_tensor *slots[NSLOTS];
    int slot_bucket[NSLOTS]; /* the bucket holding each slot, or -1 */
    int64_t slot_numel;
    shard_bucket *sb;
    int *moved;   /* [n]: whole gradients moved into the buckets in this backward */
    int *dep;     /* [n]: buckets the gradient in .grad has reached */
    int *waiting; /* [2 n]: parameters past their last hook with buckets to go */
    int nwaiting;
    ct_tensor *map; /* [n]: the usage map */
    /* The optimizer over this rank's shard, while it lives. */
    ct_optim *opt;
    int npieces;
    int *piece_param;      /* [npieces]: the model parameter of optimizer parameter k */
    int64_t *piece_offset; /* [npieces]: where in it (flattened) piece k starts */
};

/* ------------------------------------------------------------- layout */

static int owner_of(const ddp_shard *s, int64_t x, int size) {
    int64_t o = s->block ? x / s->block : size - 1;
    return o >= size ? size - 1 : (int)o;
}

/* The parameters must be ct_module_flatten's views, back to back in
 * registration order. */
static int check_flat(ct_ddp *d, ct_module *model) {
    ddp_shard *s = d->shard;
    ct_tensor *flat = ct_module_flat_params(model);
    if (!flat)
        return ct__err_set(CT_EINVAL,
                           "%s: shard %d needs the model's parameters in one flat buffer: call "
                           "ct_module_flatten(model, false) before ct_ddp_new",
                           op, (int)d->o.shard);
    int64_t at = ct_tensor_offset(flat);
    for (int i = 0; i < d->n; i++) {
        ct_tensor *t = d->p[i].t;
        if (ct_tensor_storage(t) != ct_tensor_storage(flat) || ct_tensor_offset(t) != at)
            return ct__err_set(CT_EINVAL,
                               "%s: parameter %s is not where the model's flat buffer puts it "
                               "(a parameter replaced after ct_module_flatten?); flatten the "
                               "model again before ct_ddp_new",
                               op, d->p[i].name);
        s->poff[i] = at - ct_tensor_offset(flat);
        at += d->p[i].numel;
    }
    s->total = at - ct_tensor_offset(flat);
    s->flat_params = ct__tensor_own(ct_tensor_from_storage(
        ct_tensor_storage(flat), ct_tensor_offset(flat), 1, &s->total, NULL, d->dtype));
    return s->flat_params ? 0 : ct_errcode();
}

static void lay_out(ct_ddp *d) {
    ddp_shard *s = d->shard;
    int size = ct_comm_size(d->comm), rank = ct_comm_rank(d->comm);
    s->block = s->total / size;
    if (s->block > SHARD_ROUND_MIN)
        s->block -= s->block % SHARD_ALIGN;
    s->lo = rank * s->block;
    s->hi = rank == size - 1 ? s->total : s->lo + s->block;
}

/* The parameter holding flat element x (registration order). */
static int param_at(const ct_ddp *d, int64_t x) {
    int lo = 0, hi = d->n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->shard->poff[mid] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ZeRO-2's buckets, from the top of the flat parameters down: each within
 * one owner's range and at most cap elements, ending at a parameter
 * boundary when one lies inside the cap. */
static int cut_buckets(ct_ddp *d) {
    ddp_shard *s = d->shard;
    int size = ct_comm_size(d->comm);
    int64_t esize = (int64_t)ct_dtype_size(d->dtype);
    int64_t grad_bytes = s->total * esize;
    int64_t cap_bytes = d->o.bucket_bytes;
    int64_t first_bytes = d->o.first_bucket_bytes;
    if (d->o.bucket_bytes == CT_DDP_BUCKET_BYTES) {
        cap_bytes =
            grad_bytes / 16 > ZERO2_MIN_BUCKET_BYTES ? grad_bytes / 16 : ZERO2_MIN_BUCKET_BYTES;
        cap_bytes = cap_bytes < CT_DDP_BUCKET_BYTES ? cap_bytes : CT_DDP_BUCKET_BYTES;
        first_bytes = first_bytes < cap_bytes ? first_bytes : cap_bytes;
    }
    ddp_bucket *b = calloc((size_t)s->total + 1, sizeof *b);
    s->sb = calloc((size_t)s->total + 1, sizeof *s->sb);
    if (!b || !s->sb) {
        free(b);
        return ct__err_set(CT_ENOMEM, "%s: out of memory", op);
    }
    int nb = 0;
    for (int64_t end = s->total; end > 0; nb++) {
        int64_t cap = (nb == 0 ? first_bytes : cap_bytes) / esize;
        cap = cap > 0 ? cap : 1;
        int owner = owner_of(s, end - 1, size);
        int64_t floor = (int64_t)owner * s->block;
        int64_t start = end - cap > floor ? end - cap : floor;
        int at = param_at(d, start);
        int64_t next = s->poff[at] + d->p[at].numel;
        if (s->poff[at] < start && next < end)
            at = param_at(d, start = next);
        int top = param_at(d, end - 1);
        b[nb] = (ddp_bucket){
            .first = d->n - 1 - top, .n = top - at + 1, .lo = start, .numel = end - start};
        s->sb[nb] = (shard_bucket){.owner = owner, .slot = -1};
        s->slot_numel = end - start > s->slot_numel ? end - start : s->slot_numel;
        end = start;
    }
    d->b = b;
    d->nbuckets = nb;
    for (int i = 0; i < d->n; i++)
        d->p[i].nbuckets = 0;
    for (int k = 0; k < nb; k++) {
        b[k].names = calloc((size_t)b[k].n + 1, sizeof *b[k].names);
        if (!b[k].names)
            return ct__err_set(CT_ENOMEM, "%s: out of memory", op);
        int counted = 0;
        for (int j = 0; j < b[k].n; j++) {
            ddp_param *p = &d->p[d->order[b[k].first + j]];
            b[k].names[j] = p->name;
            if (p->numel == 0)
                continue;
            if (p->nbuckets++ == 0)
                p->bucket = k;
            counted++;
        }
        b[k].pending = counted;
    }
    return 0;
}

/* The flat parameters move into memory every rank maps (ct_comm_zeros),
 * each parameter and the model's flat buffer rebound in place: the gather
 * after each step then writes each rank's updated shard straight into
 * the others' copies (shm's direct allgather) instead of through a ring.
 * Parameters on a device that a host backend stages stay where they are. */
static int share_params(ct_ddp *d, ct_module *model) {
    ddp_shard *s = d->shard;
    ct_tensor *flat = ct_module_flat_params(model);
    if (!ct_device_equal(d->device, ct_comm_device(d->comm)) || ct_numel(flat) != s->total ||
        ct_tensor_offset(flat) != 0)
        return 0;
    ct_tensor *shared = ct__tensor_own(ct_comm_zeros(d->comm, 1, &s->total, d->dtype));
    if (!shared)
        return ct_errcode();
    bool grad_mode = ct_set_grad_enabled(false);
    int rc = ct__tensor_copy_any(shared, s->flat_params);
    ct_set_grad_enabled(grad_mode);
    if (rc) {
        ct_tensor_free(shared);
        return rc;
    }
    /* The views first: the flat buffer's memory goes with its last view. A
     * view of it that someone else holds keeps it where it is, the
     * parameters back with it (the gather then takes the usual path). */
    ct_storage *to = ct_tensor_storage(shared), *from = ct_tensor_storage(flat);
    for (int i = 0; i < d->n; i++)
        CT_ASSERT(!ct__tensor_rebind(d->p[i].t, to, s->poff[i]));
    ct_tensor_free(s->flat_params);
    s->flat_params = shared;
    if (!ct__tensor_rebind(flat, to, 0))
        return 0;
    ct_errclear();
    for (int i = 0; i < d->n; i++)
        CT_ASSERT(!ct__tensor_rebind(d->p[i].t, from, s->poff[i]));
    s->flat_params = ct__tensor_own(ct_tensor_from_storage(from, 0, 1, &s->total, NULL, d->dtype));
    ct_tensor_free(shared);
    return s->flat_params ? 0 : ct_errcode();
}

int ct__ddp_shard_init(ct_ddp *d, ct_module *model) {
    if (d->has_hook)
        return ct__err_set(CT_EINVAL, "%s: a comm hook and shard are exclusive", op);
    ddp_shard *s = d->shard = calloc(1, sizeof *s);
    if (!s || !(s->poff = calloc((size_t)d->n, sizeof *s->poff)))
        return ct__err_set(CT_ENOMEM, "%s: out of memory", op);
    /* ZeRO-3's units hold the layout; this holds its optimizer's pieces. */
    if (d->o.shard == CT_DDP_SHARD_FULL)
        return 0;
    CT_TRY(check_flat(d, model));
    int size = ct_comm_size(d->comm);
    if (s->total < size)
        return ct__err_set(CT_EINVAL,
                           "%s: the model has %lld parameter elements, fewer than the %d ranks "
                           "shard %d would split them over",
                           op, (long long)s->total, size, (int)d->o.shard);
    lay_out(d);
    CT_TRY(share_params(d, model));
    if (d->o.shard == CT_DDP_SHARD_OPTIMIZER)
        return 0;
    CT_TRY(cut_buckets(d));
    int64_t mine = s->hi - s->lo;
    s->grad = ct__tensor_own(ct_full_on(1, &mine, 0, d->dtype, d->device));
    s->map = ct__tensor_own(ct_full_on(1, (int64_t[]){d->n}, 0, d->dtype, d->device));
    s->moved = calloc((size_t)d->n, sizeof *s->moved);
    s->dep = calloc((size_t)d->n, sizeof *s->dep);
    s->waiting = calloc(2 * (size_t)d->n, sizeof *s->waiting);
    if (!s->grad || !s->map)
        return ct_errcode();
    if (!s->moved || !s->dep || !s->waiting)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", op);
    /* Every rank maps the slots (ct_comm_zeros), and bucket k uses slot
     * k % NSLOTS on every rank: the reduce reads the peers' gradients
     * where they lie. */
    bool staged = !ct_device_equal(d->device, ct_comm_device(d->comm));
    for (int i = 0; i < NSLOTS; i++) {
        s->slot_bucket[i] = -1;
        s->slots[i] = ct__tensor_own(staged ? ct_full_on(1, &s->slot_numel, 0, d->dtype, d->device)
                                            : ct_comm_zeros(d->comm, 1, &s->slot_numel, d->dtype));
        if (!s->slots[i])
            return ct_errcode();
    }
    return 0;
}

void ct__ddp_shard_free(ct_ddp *d) {
    ddp_shard *s = d->shard;
    if (!s)
        return;
    /* An optimizer that outlives its ct_ddp steps alone: its hooks no longer
     * reach the ct_ddp. */
    if (s->opt)
        ct_optim_set_hooks(s->opt, NULL);
    ct_tensor_free(s->flat_params);
    ct_tensor_free(s->grad);
    ct_tensor_free(s->map);
    for (int i = 0; i < NSLOTS; i++)
        ct_tensor_free(s->slots[i]);
    free(s->poff);
    free(s->sb);
    free(s->moved);
    free(s->dep);
    free(s->waiting);
    free(s->piece_param);
    free(s->piece_offset);
    free(s);
    d->shard = NULL;
}

/* ----------------------------------------------------------- ZeRO-2 */

/* Waits for bucket k's reduce; the owner keeps the average. */
static int complete(ct_ddp *d, int k) {
    ddp_shard *s = d->shard;
    ddp_bucket *b = &d->b[k];
    int rc = ct_work_wait(b->work);
    ct_work_free(b->work);
    b->work = NULL;
    if (!rc && s->sb[k].owner == ct_comm_rank(d->comm)) {
        ct_tensor *dst = ct__tensor_own(ct_narrow(s->grad, 0, b->lo - s->lo, b->numel));
        rc = dst ? ct__tensor_copy_any(dst, b->view) : ct_errcode();
        ct_tensor_free(dst);
    }
    s->sb[k].state = IDLE;
    return rc;
}

/* Gives bucket k its slot, once the bucket holding it is reduced. false
 * (with *rc 0) when that bucket is still filling. */
static bool acquire(ct_ddp *d, int k, int *rc) {
    ddp_shard *s = d->shard;
    *rc = 0;
    if (s->sb[k].state != IDLE)
        return true;
    /* The buckets before k that share its slot must have started, or the
     * slot could go to k before them and never come back. */
    if (k - NSLOTS >= d->next_launch)
        return false;
    int slot = k % NSLOTS, holder = s->slot_bucket[slot];
    if (holder >= 0 && holder != k && s->sb[holder].state == LAUNCHED &&
        (*rc = complete(d, holder)))
        return false;
    ddp_bucket *b = &d->b[k];
    ct_tensor_free(b->view);
    b->view = ct__tensor_own(ct_narrow(s->slots[slot], 0, 0, b->numel));
    if (!b->view) {
        *rc = ct_errcode();
        return false;
    }
    s->slot_bucket[slot] = k;
    s->sb[k] = (shard_bucket){.owner = s->sb[k].owner, .slot = slot, .state = FILLING};
    return true;
}

/* Parameter i's elements in bucket k: [*from, *from + *len) of the
 * flattened parameter, at *at in the bucket. */
static void overlap(const ct_ddp *d, int i, int k, int64_t *from, int64_t *len, int64_t *at) {
    int64_t p0 = d->shard->poff[i], p1 = p0 + d->p[i].numel;
    int64_t b0 = d->b[k].lo, b1 = b0 + d->b[k].numel;
    int64_t lo = p0 > b0 ? p0 : b0, hi = p1 < b1 ? p1 : b1;
    *from = lo - p0;
    *len = hi - lo;
    *at = lo - b0;
}

/* Adds (or, for the first contribution in this backward, copies) src into
 * parameter i's part of bucket k; src NULL writes zeros. */
static int deposit(ct_ddp *d, int i, int k, ct_tensor *flat_grad, bool first) {
    int64_t from, len, at;
    overlap(d, i, k, &from, &len, &at);
    if (len <= 0)
        return 0;
    ct_tensor *dst = ct__tensor_own(ct_narrow(d->b[k].view, 0, at, len));
    ct_tensor *src = flat_grad ? ct__tensor_own(ct_narrow(flat_grad, 0, from, len)) : NULL;
    int rc = !dst || (flat_grad && !src) ? ct_errcode()
             : !src                      ? ct__tensor_copy_any(dst, d->zero)
             : first                     ? ct__tensor_copy_any(dst, src)
             : ct_add_(dst, src)         ? 0
                                         : ct_errcode();
    ct_tensor_free(src);
    ct_tensor_free(dst);
    return rc;
}

/* Parameter i's gradient has reached all its buckets: it leaves .grad. */
static int moved_all(ct_ddp *d, int i) {
    d->shard->moved[i]++;
    d->shard->dep[i] = 0;
    return ct_tensor_set_grad(d->p[i].t, NULL);
}

/* .grad as a flat view (a contiguous copy of a strided one), owned. */
static ct_tensor *flat_grad(ddp_param *p) {
    ct_tensor *g = ct_tensor_grad(p->t);
    ct_tensor *dense = ct__tensor_own(ct_is_contiguous(g) ? ct_tensor_retain(g) : ct_contiguous(g));
    ct_tensor *flat = dense ? ct__tensor_own(ct_view(dense, 1, &p->numel)) : NULL;
    ct_tensor_free(dense);
    return flat;
}

static int launch_ready(ct_ddp *d);

/* Moves parameter i's .grad into its buckets. Before its last hook call in
 * this backward (more may accumulate into .grad), all at once or not at
 * all. At its last, bucket by bucket in order while their slots are free:
 * each bucket it completes counts down and may start, which can free the
 * next one's slot; what is left waits in s->waiting. */
static int advance(ct_ddp *d, int i) {
    ddp_shard *s = d->shard;
    ddp_param *p = &d->p[i];
    bool last = p->calls >= p->expected;
    int rc = 0, end = p->bucket + p->nbuckets;
    if (!ct_tensor_grad(p->t) || p->nbuckets == 0)
        return 0;
    for (int k = p->bucket + s->dep[i]; !last && k < end; k++)
        if (!acquire(d, k, &rc))
            return rc;
    ct_tensor *flat = flat_grad(p);
    if (!flat)
        return ct_errcode();
    for (int k = p->bucket + s->dep[i]; !rc && k < end; k++) {
        if (!acquire(d, k, &rc))
            break;
        rc = deposit(d, i, k, flat, s->moved[i] == 0);
        s->dep[i]++;
        if (!rc && last && --d->b[k].pending == 0)
            rc = launch_ready(d);
    }
    ct_tensor_free(flat);
    if (!rc && s->dep[i] == p->nbuckets)
        return moved_all(d, i);
    if (!rc && last)
        s->waiting[s->nwaiting++] = i;
    return rc;
}

static int launch(ct_ddp *d, int k) {
    ddp_shard *s = d->shard;
    s->sb[k].state = LAUNCHED;
    return ct_comm_reduce(d->comm, d->b[k].view, CT_REDUCE_AVG, s->sb[k].owner, &d->b[k].work);
}

/* Starts the buckets that are ready, in order. */
static int launch_ready(ct_ddp *d) {
    int rc = 0;
    while (!rc && d->next_launch < d->nbuckets && d->b[d->next_launch].pending == 0)
        rc = launch(d, d->next_launch++);
    return rc;
}

/* Moves parameter p's gradient; then, as long as buckets start (each start
 * frees a slot), the waiting parameters' again. */
int ct__ddp_shard_ready(ct_ddp *d, ddp_param *p) {
    ddp_shard *s = d->shard;
    int started = d->next_launch;
    int rc = advance(d, (int)(p - d->p));
    while (!rc && s->nwaiting > 0 && d->next_launch != started) {
        started = d->next_launch;
        int n = s->nwaiting, *again = s->waiting + d->n; /* the upper half has room */
        memcpy(again, s->waiting, (size_t)n * sizeof *again);
        s->nwaiting = 0;
        for (int j = 0; !rc && j < n; j++)
            rc = advance(d, again[j]);
    }
    return rc;
}

int ct__ddp_shard_finalize(ct_ddp *d) {
    ddp_shard *s = d->shard;
    int rc = 0;
    /* In bucket order, so that each slot's earlier holder has started. */
    for (int k = d->next_launch; !rc && k < d->nbuckets; k++) {
        if (!acquire(d, k, &rc) && !rc)
            rc = ct__err_set(CT_ESTATE, "%s: bucket %d has no slot at the end of backward", op, k);
        for (int j = 0; !rc && j < d->b[k].n; j++) {
            int i = d->order[d->b[k].first + j];
            if (d->p[i].numel == 0)
                continue;
            ct_tensor *flat = ct_tensor_grad(d->p[i].t) ? flat_grad(&d->p[i]) : NULL;
            if (flat) {
                rc = deposit(d, i, k, flat, s->moved[i] == 0);
                if (!rc && ++s->dep[i] == d->p[i].nbuckets)
                    rc = moved_all(d, i);
            } else if (s->moved[i] == 0) {
                rc = ct_tensor_grad(d->p[i].t) ? ct_errcode() : deposit(d, i, k, NULL, true);
            }
            ct_tensor_free(flat);
        }
        if (!rc)
            rc = launch(d, k);
        d->next_launch = k + 1;
    }
    for (int k = 0; k < d->nbuckets; k++)
        if (s->sb[k].state == LAUNCHED) {
            int wrc = complete(d, k);
            rc = rc ? rc : wrc;
        }
    if (!rc)
        rc = ct__ddp_write_usage_map(d, s->map);
    if (!rc)
        rc = ct_comm_allreduce(d->comm, s->map, CT_REDUCE_AVG, NULL);
    if (!rc)
        rc = ct__ddp_unused_error(d, s->map);
    for (int i = 0; i < d->n; i++)
        s->moved[i] = s->dep[i] = 0;
    for (int k = 0; k < d->nbuckets; k++)
        s->sb[k].state = IDLE;
    s->nwaiting = 0;
    return rc;
}

/* ---------------------------------------------------------- optimizer */

/* After a step: every rank's updated shard, everywhere (ZeRO-3: when
 * each unit is next used). */
static int gather_params(void *ctx) {
    ct_ddp *d = ctx;
    if (d->fsdp)
        return ct__ddp_fsdp_after_step(d);
    ddp_shard *s = d->shard;
    int size = ct_comm_size(d->comm);
    bool grad_mode = ct_set_grad_enabled(false);
    ct_scope_begin();
    int rc = 0;
    if (s->block > 0) {
        ct_tensor *all = ct_narrow(s->flat_params, 0, 0, s->block * size);
        ct_tensor *mine = ct_narrow(s->flat_params, 0, s->lo, s->block);
        rc = all && mine ? ct_comm_allgather(d->comm, all, mine, NULL) : ct_errcode();
    }
    int64_t rest = s->total - s->block * size;
    if (!rc && rest > 0) {
        ct_tensor *tail = ct_narrow(s->flat_params, 0, s->block * size, rest);
        rc = tail ? ct_comm_broadcast(d->comm, tail, size - 1, NULL) : ct_errcode();
    }
    for (int i = 0; !rc && i < d->n; i++)
        ct__tensor_bump_version(d->p[i].t);
    ct_scope_end();
    ct_set_grad_enabled(grad_mode);
    return rc ? ct__err_set(rc, "%s: gathering the parameters after the step: %s", op, ct_errmsg())
              : 0;
}

/* Zeroes the gradients the shard's step reads: ZeRO-1's whole replicated
 * buffer (backward accumulates into all of it), ZeRO-2's shard. Both
 * kinds of zero_grad zero in place: the pieces keep their views. */
static int zero_grads(void *ctx, bool set_to_none) {
    (void)set_to_none;
    ct_ddp *d = ctx;
    ddp_shard *s = d->shard;
    if (d->fsdp)
        return ct__ddp_fsdp_zero_grads(d);
    if (s->grad)
        return ct__tensor_fill_any(s->grad, 0);
    ct_tensor *grads = ct__tensor_own(ct_narrow(d->flat, 0, d->n, s->total));
    int rc = grads ? ct__tensor_fill_any(grads, 0) : ct_errcode();
    ct_tensor_free(grads);
    for (int i = 0; !rc && i < d->n; i++)
        if (ct_tensor_grad(d->p[i].t) != d->p[i].grad)
            rc = ct_tensor_set_grad(d->p[i].t, d->p[i].grad);
    return rc;
}

static void forget_optim(void *ctx) {
    ct_ddp *d = ctx;
    if (d->shard)
        d->shard->opt = NULL;
}

/* The model parameter that t is, or -1 naming it in the error. */
static int model_index(const ct_ddp *d, const ct_tensor *t, int group, int j) {
    for (int i = 0; i < d->n; i++)
        if (d->p[i].t == t)
            return i;
    return ct__err_set(CT_EINVAL,
                       "%s: param %d of group %d is not a parameter of the ct_ddp's model", op, j,
                       group);
}

ct_tensor *ct__ddp_piece(ct_tensor *param_base, int64_t param_at, ct_tensor *grad_base,
                         int64_t grad_at, int64_t len, int *rc) {
    ct_tensor *piece = ct__tensor_own(ct_tensor_from_storage(
        ct_tensor_storage(param_base), ct_tensor_offset(param_base) + param_at, 1, &len, NULL,
        ct_tensor_dtype(param_base)));
    ct_tensor *grad = ct__tensor_own(
        ct_tensor_from_storage(ct_tensor_storage(grad_base), ct_tensor_offset(grad_base) + grad_at,
                               1, &len, NULL, ct_tensor_dtype(grad_base)));
    *rc = !piece || !grad ? ct_errcode() : ct_tensor_set_grad(piece, grad);
    ct_tensor_free(grad);
    if (*rc) {
        ct_tensor_free(piece);
        return NULL;
    }
    return piece;
}

/* Parameter i's piece of this rank's shard (a 1-d view), with its
 * gradient view attached; NULL when it has none. */
static ct_tensor *piece_of(ct_ddp *d, int i, int64_t *from, int *rc) {
    if (d->fsdp)
        return ct__ddp_fsdp_piece(d, i, from, rc);
    ddp_shard *s = d->shard;
    int64_t p0 = s->poff[i], p1 = p0 + d->p[i].numel;
    int64_t lo = p0 > s->lo ? p0 : s->lo, hi = p1 < s->hi ? p1 : s->hi;
    *rc = 0;
    if (hi <= lo)
        return NULL;
    *from = lo - p0;
    /* ZeRO-2's gradients are its share; ZeRO-1's the replicated buffer's
     * views, parameter by parameter. */
    return s->grad ? ct__ddp_piece(s->flat_params, lo, s->grad, lo - s->lo, hi - lo, rc)
                   : ct__ddp_piece(s->flat_params, lo, d->p[i].grad, *from, hi - lo, rc);
}

ct_optim *ct_ddp_optim_new(ct_ddp *d, const ct_optim_options *opts, const ct_param_group *groups,
                           int ngroups) {
    if (!d || ngroups < 0 || (ngroups > 0 && !groups)) {
        ct__err_set(CT_EINVAL, "ddp_optim_new: a NULL ct_ddp or groups");
        return NULL;
    }
    if (!d->shard)
        return ct_optim_new_groups(opts, groups, ngroups);
    ddp_shard *s = d->shard;
    if (s->opt) {
        ct__err_set(CT_ESTATE,
                    "ddp_optim_new: this ct_ddp already has a sharded optimizer; free it first");
        return NULL;
    }
    int *group_of = malloc((size_t)d->n * sizeof *group_of);
    ct_tensor **pieces = calloc((size_t)d->n, sizeof *pieces);
    ct_param_group *pg = calloc((size_t)(ngroups > 0 ? ngroups : 1), sizeof *pg);
    int *pparam = malloc((size_t)d->n * sizeof *pparam);
    int64_t *poffs = malloc((size_t)d->n * sizeof *poffs);
    int rc = group_of && pieces && pg && pparam && poffs
                 ? 0
                 : ct__err_set(CT_ENOMEM, "ddp_optim_new: out of memory");
    for (int i = 0; !rc && i < d->n; i++)
        group_of[i] = -1;
    for (int g = 0; !rc && g < ngroups; g++)
        for (int j = 0; !rc && j < groups[g].nparams; j++) {
            int i = model_index(d, groups[g].params[j], g, j);
            rc = i < 0 ? i : 0;
            if (!rc && group_of[i] >= 0)
                rc = ct__err_set(CT_EINVAL, "ddp_optim_new: parameter %s is in groups %d and %d",
                                 d->p[i].name, group_of[i], g);
            if (!rc)
                group_of[i] = g;
        }
    /* The optimizer's parameters, group by group, each in model order. */
    int np = 0;
    for (int g = 0; !rc && g < ngroups; g++) {
        pg[g] = groups[g];
        pg[g].params = pieces + np;
        pg[g].nparams = 0;
        for (int i = 0; !rc && i < d->n; i++) {
            int64_t from = 0;
            ct_tensor *piece = group_of[i] == g ? piece_of(d, i, &from, &rc) : NULL;
            if (!piece)
                continue;
            pieces[np] = piece;
            pparam[np] = i;
            poffs[np++] = from;
            pg[g].nparams++;
        }
    }
    ct_optim *opt = rc ? NULL : ct_optim_new_groups(opts, pg, ngroups);
    if (opt && ct_optim_set_hooks(opt, &(ct_optim_hooks){.after_step = gather_params,
                                                         .zero_grad = zero_grads,
                                                         .free = forget_optim,
                                                         .ctx = d})) {
        ct_optim_free(opt);
        opt = NULL;
    }
    for (int k = 0; k < np; k++)
        ct_tensor_free(pieces[k]);
    free(pieces);
    free(pg);
    free(group_of);
    if (!opt) {
        free(pparam);
        free(poffs);
        return NULL;
    }
    free(s->piece_param);
    free(s->piece_offset);
    s->opt = opt;
    s->npieces = np;
    s->piece_param = pparam;
    s->piece_offset = poffs;
    return opt;
}

/* ------------------------------------------------------------ clipping */

static int combine_norms(void *ctx, double *partial, bool max) {
    ct_tensor *t = ct__tensor_own(ct_from_data(partial, 1, (int64_t[]){1}, CT_FLOAT64));
    int rc = t ? ct__ddp_on_host(ctx, max ? HOST_ALLREDUCE_MAX : HOST_ALLREDUCE_SUM, t, t)
               : ct_errcode();
    if (!rc)
        *partial = ((double *)ct_data_ptr(t))[0];
    ct_tensor_free(t);
    return rc;
}

int ct_ddp_clip_grad_norm(ct_ddp *d, ct_optim *opt, double max_norm, double norm_type,
                          double *total_norm_out) {
    CT_TRY(ct__ddp_check(d, "ddp_clip_grad_norm"));
    if (!d->shard)
        return ct_clip_grad_norm_p(d->params.tensors, d->n, max_norm, norm_type, total_norm_out);
    CT_REQUIRE(opt && opt == d->shard->opt, CT_EINVAL,
               "ddp_clip_grad_norm: opt is not this ct_ddp's sharded optimizer "
               "(ct_ddp_optim_new)");
    int n = ct_optim_num_params(opt);
    ct_tensor **pieces = malloc((size_t)(n > 0 ? n : 1) * sizeof *pieces);
    if (!pieces)
        return ct__err_set(CT_ENOMEM, "ddp_clip_grad_norm: out of memory");
    for (int k = 0; k < n; k++)
        pieces[k] = ct_optim_param(opt, k);
    int rc =
        ct_clip_grad_norm_split(pieces, n, max_norm, norm_type, combine_norms, d, total_norm_out);
    free(pieces);
    return rc;
}

/* ------------------------------------------------------------- queries */

int ct_ddp_shard_range(const ct_ddp *d, int64_t *lo, int64_t *hi) {
    CT_TRY(ct__ddp_check(d, "ddp_shard_range"));
    CT_REQUIRE(!d->fsdp, CT_ESTATE,
               "ddp_shard_range: under shard 3 each unit is sharded on its own: there is no one "
               "range");
    int64_t total = 0;
    for (int i = 0; !d->shard && i < d->n; i++)
        total += d->p[i].numel;
    if (lo)
        *lo = d->shard ? d->shard->lo : 0;
    if (hi)
        *hi = d->shard ? d->shard->hi : total;
    return 0;
}

ct_ddp_shard ct_ddp_stage(const ct_ddp *d) {
    return ct__ddp_check(d, "ddp_stage") ? CT_DDP_SHARD_NONE : d->o.shard;
}

int ct_ddp_optim_param_source(const ct_ddp *d, int index, int *model_param, int64_t *offset) {
    CT_TRY(ct__ddp_check(d, "ddp_optim_param_source"));
    CT_REQUIRE(d->shard && d->shard->opt, CT_ESTATE,
               "ddp_optim_param_source: the ct_ddp has no live sharded optimizer");
    CT_REQUIRE(index >= 0 && index < d->shard->npieces, CT_EINVAL,
               "ddp_optim_param_source: index %d is outside [0, %d)", index, d->shard->npieces);
    if (model_param)
        *model_param = d->shard->piece_param[index];
    if (offset)
        *offset = d->shard->piece_offset[index];
    return 0;
}

static int64_t bytes_of(const ct_tensor *t) {
    return t ? ct_numel(t) * (int64_t)ct_dtype_size(ct_tensor_dtype(t)) : 0;
}

int ct_ddp_memory_of(const ct_ddp *d, const ct_optim *opt, ct_ddp_memory *out) {
    CT_TRY(ct__ddp_check(d, "ddp_memory_of"));
    CT_REQUIRE(out, CT_EINVAL, "ddp_memory_of: out is NULL");
    *out = (ct_ddp_memory){0};
    for (int i = 0; !d->fsdp && i < d->n; i++)
        out->params += bytes_of(d->p[i].t);
    const ddp_shard *s = d->shard;
    if (d->fsdp) {
        out->staging = ct__ddp_fsdp_bytes(d, &out->params, &out->grads);
    } else if (s && s->grad) {
        out->grads = bytes_of(s->grad);
        out->staging = bytes_of(s->map);
        for (int i = 0; i < NSLOTS; i++)
            out->staging += bytes_of(s->slots[i]);
    } else {
        out->grads = bytes_of(d->flat);
    }
    int nstates = opt ? ct_optim_num_states(opt) : 0;
    for (int i = 0; i < nstates; i++) {
        ct_tensor *t = NULL;
        CT_TRY(ct_optim_state_at(opt, i, NULL, &t));
        out->optimizer += bytes_of(t);
    }
    return nstates < 0 ? nstates : 0;
}
