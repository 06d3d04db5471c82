/* Fully sharded data parallel (ZeRO-3, PyTorch's FSDP) for ct_ddp.
 *
 * The model's parameters are grouped in units: the modules the options
 * list, and one more for the parameters outside them (the "root" unit,
 * units[0] here). Each unit's parameters are views of one buffer of their
 * own, N blocks of B elements (the unit's elements, padded), and rank r
 * keeps only block r (`shard`, the optimizer's) and its averaged
 * gradients (`grad`). The buffer's memory exists only while the unit is
 * gathered: an allgather of the shards fills it before the unit's forward
 * (a forward pre-hook on its module; the root unit's on the model), and it
 * is handed back after the forward (unless keep_after_forward), gathered
 * again before the unit's backward (a gradient hook on the forward's
 * output, or the forward pre-hook when activation checkpointing recomputes
 * the unit), and handed back once its gradients are reduce-scattered. While
 * a unit computes, the next one's allgather is in flight: the following unit
 * in forward, the previous one in backward.
 *
 * A unit is reduce-scattered when every parameter of it has its gradient
 * (the post-accumulate hooks), in a fixed order on every rank (units from
 * the last to the root, each after those later in forward), through one
 * staging buffer of the largest unit; what is left goes at the end of
 * backward, where the usage map is checked as ct_ddp does. The gradients
 * leave .grad. Under no_sync the gradients stay in .grad, whole, and the
 * units are handed back at the end of backward all the same. */
#include "ddp_impl.h"

#include <ct/autograd.h>

#include <stdio.h>
#include <stdlib.h>

static const char *op = "ddp";

typedef enum unit_state { RESHARDED, GATHERING, GATHERED } unit_state;

typedef struct fsdp_unit {
    ct_ddp *ddp;
    int index;
    ct_module *module; /* NULL for the root unit: its hooks are on the model */
    char name[96];
    char why[320]; /* what ops say when given a parameter of it while resharded */
    int *params;   /* model parameter indices, registration order */
    int nparams;
    int64_t *at; /* [nparams]: each one's offset in the unit, in elements */
    int64_t numel, block;
    ct_storage *full; /* N blocks; released while resharded */
    ct_tensor *whole; /* [N block] over full */
    ct_tensor *shard; /* [block]: this rank's parameters */
    ct_tensor *grad;  /* [block]: this rank's averaged gradients */
    bool fresh;       /* grad is zero: the next reduce-scatter may write it */
    unit_state state;
    ct_work *gather;
    int pending; /* parameters without their gradient in this backward */
    bool reduced;
    uint64_t version; /* full's, when it was handed back */
    bool stepped;     /* the shard changed since */
    bool built;       /* the parameters live in full */
    bool hooked;      /* its module's forward hooks are this unit's */
} fsdp_unit;

struct ddp_fsdp {
    fsdp_unit *u;
    int nunits;
    int *unit_of;       /* [n]: each parameter's unit */
    int next_reduce;    /* in reduce order: units nunits-1 .. 0 */
    ct_tensor *staging; /* [N * largest block]: the reduce-scatter's input */
    ct_tensor *tmp;     /* [largest block]: its output, when grad is not fresh */
    ct_tensor *map;     /* [n]: the usage map */
    ct_module *model;
    bool summoned; /* ct_ddp_summon_params: every unit stays, the hooks rest */
};

/* ------------------------------------------------------------ gathering */

static int gather_start(fsdp_unit *u) {
    if (u->state != RESHARDED)
        return 0;
    if (u->numel == 0) { /* a module without parameters: nothing to move */
        u->state = GATHERED;
        return 0;
    }
    ct_ddp *d = u->ddp;
    int64_t bytes = ct_numel(u->whole) * (int64_t)ct_dtype_size(d->dtype);
    CT_TRY(ct__tensor_storage_restore(u->full, (size_t)bytes));
    int rc = ct_comm_allgather(d->comm, u->whole, u->shard, &u->gather);
    if (rc) {
        ct__tensor_storage_release(u->full, u->why);
        return ct__err_set(rc, "%s: gathering unit %s: %s", op, u->name, ct_errmsg());
    }
    /* Until the unit's own forward or backward waits for it, its
     * parameters are not to be read. */
    ct__tensor_storage_mark(u->full, u->why);
    u->state = GATHERING;
    return 0;
}

static int gather_wait(fsdp_unit *u) {
    CT_TRY(gather_start(u));
    if (u->state == GATHERED)
        return 0;
    int rc = ct_work_wait(u->gather);
    ct_work_free(u->gather);
    u->gather = NULL;
    /* A graph that saved a parameter reads the gathered values: the ones it
     * saved, unless a step came between, when the allgather's bump of the
     * version stays and the graph's backward fails its version check. */
    ct__tensor_storage_mark(u->full, NULL);
    if (!u->stepped)
        ct__tensor_storage_set_version(u->full, u->version);
    u->stepped = false;
    u->state = GATHERED;
    return rc ? ct__err_set(rc, "%s: gathering unit %s: %s", op, u->name, ct_errmsg()) : 0;
}

static int reshard(fsdp_unit *u) {
    int rc = u->state == GATHERING ? gather_wait(u) : 0;
    if (u->state != RESHARDED)
        u->version = ct__tensor_storage_version(u->full);
    ct__tensor_storage_release(u->full, u->why);
    u->state = RESHARDED;
    return rc;
}

static fsdp_unit *unit_at(ct_ddp *d, int k) {
    return k >= 0 && k < d->fsdp->nunits ? &d->fsdp->u[k] : NULL;
}

/* Gathers u now and starts the gather of the unit step units on (in
 * forward: the next one; in backward: the previous). */
static int gather_and_prefetch(fsdp_unit *u, int step) {
    CT_TRY(gather_wait(u));
    fsdp_unit *next = step ? unit_at(u->ddp, u->index + step) : NULL;
    return next ? gather_start(next) : 0;
}

/* ---------------------------------------------------------------- hooks */

static ct_tensor *before_backward(ct_tensor *grad, void *ctx) {
    fsdp_unit *u = ctx;
    ct_ddp *d = u->ddp;
    int rc = 0;
    d->fsdp->summoned = false; /* a backward hands the units back as it goes */
    if (!d->in_backward) {
        rc = ct_autograd_queue_final_callback(ct__ddp_finalize_cb, d);
        d->in_backward = rc == 0;
    }
    /* Backward meets the root's own ops first, then the units from the
     * last. */
    if (!rc)
        rc = gather_and_prefetch(u, u->index == 0 ? d->fsdp->nunits - 1 : -1);
    return rc ? (ct_autograd_fail(rc, "%s", ct_errmsg()), NULL) : grad;
}

static int pre_forward(ct_module *m, void *ctx) {
    (void)m;
    fsdp_unit *u = ctx;
    if (u->ddp->fsdp->summoned)
        return 0;
    return gather_and_prefetch(u, u->ddp->in_backward ? -1 : 1);
}

static int post_forward(ct_module *m, ct_tensor *y, void *ctx) {
    (void)m;
    fsdp_unit *u = ctx;
    ct_ddp *d = u->ddp;
    if (ct_requires_grad(y) && ct_grad_enabled()) {
        int h = ct_tensor_register_hook(y, before_backward, u);
        if (h < 0)
            return h;
    }
    /* The root unit stays until the end of backward, and nothing is handed
     * back while backward runs (a checkpointed unit recomputes inside it). */
    if (u->index == 0 || d->in_backward || d->o.keep_after_forward || d->fsdp->summoned)
        return 0;
    return reshard(u);
}

/* ------------------------------------------------------------- reducing */

/* Reduce-scatters unit u's gradients (zero for parameters without one) into
 * its shard and drops them from .grad; then hands the unit back. */
static int reduce(ct_ddp *d, fsdp_unit *u) {
    ddp_fsdp *f = d->fsdp;
    if (u->numel == 0) {
        u->reduced = true;
        return reshard(u);
    }
    int size = ct_comm_size(d->comm);
    int rc = 0;
    ct_scope_begin();
    ct_tensor *in = ct_narrow(f->staging, 0, 0, u->block * size);
    for (int k = 0; !rc && k < u->nparams; k++) {
        ddp_param *p = &d->p[u->params[k]];
        ct_tensor *dst = ct_narrow(in, 0, u->at[k], p->numel);
        ct_tensor *g = ct_tensor_grad(p->t);
        ct_tensor *flat = g ? ct_reshape(g, 1, &p->numel) : NULL;
        rc = !dst || (g && !flat) ? ct_errcode() : ct__tensor_copy_any(dst, flat ? flat : d->zero);
        if (!rc)
            rc = ct_tensor_set_grad(p->t, NULL);
    }
    ct_tensor *out = u->fresh ? u->grad : ct_narrow(f->tmp, 0, 0, u->block);
    if (!rc)
        rc = in && out ? ct_comm_reduce_scatter(d->comm, out, in, CT_REDUCE_AVG, NULL)
                       : ct_errcode();
    if (!rc && !u->fresh && !ct_add_(u->grad, out))
        rc = ct_errcode();
    ct_scope_end();
    u->fresh = false;
    u->reduced = true;
    int wrc = reshard(u);
    return rc ? rc : wrc;
}

/* Reduces the units that are ready, in order. */
static int reduce_ready(ct_ddp *d) {
    ddp_fsdp *f = d->fsdp;
    int rc = 0;
    while (!rc && f->next_reduce >= 0 && f->u[f->next_reduce].pending == 0)
        rc = reduce(d, &f->u[f->next_reduce--]);
    return rc;
}

int ct__ddp_fsdp_ready(ct_ddp *d, ddp_param *p) {
    if (p->calls < p->expected)
        return 0;
    fsdp_unit *u = &d->fsdp->u[d->fsdp->unit_of[p - d->p]];
    --u->pending;
    return reduce_ready(d);
}

int ct__ddp_fsdp_finalize(ct_ddp *d) {
    ddp_fsdp *f = d->fsdp;
    int rc = 0;
    if (d->sync) {
        while (!rc && f->next_reduce >= 0)
            rc = reduce(d, &f->u[f->next_reduce--]);
        if (!rc)
            rc = ct__ddp_write_usage_map(d, f->map);
        if (!rc)
            rc = ct_comm_allreduce(d->comm, f->map, CT_REDUCE_AVG, NULL);
        if (!rc)
            rc = ct__ddp_unused_error(d, f->map);
    }
    for (int k = 0; k < f->nunits; k++) {
        int wrc = reshard(&f->u[k]);
        rc = rc ? rc : wrc;
        f->u[k].pending = f->u[k].nparams;
        f->u[k].reduced = false;
    }
    f->next_reduce = f->nunits - 1;
    return rc;
}

/* ---------------------------------------------------------------- setup */

static void describe_unit(fsdp_unit *u) {
    const char *path = u->module ? ct_module_path(u->module) : "";
    snprintf(u->name, sizeof u->name, "%s%s%s", u->module ? "'" : "the root's", path,
             u->module ? "'" : "");
    snprintf(u->why, sizeof u->why,
             "it is a parameter of fully sharded unit %s, whose parameters exist only during "
             "the unit's forward and backward (ct_ddp shard 3): a parameter used outside its "
             "unit (make the module that uses it the unit, or one around both)",
             u->name);
}

/* "unit 'transformer.h.0'", or "the model" for its root. */
static const char *label(ct_module *m, char *buf, size_t cap) {
    const char *path = ct_module_path(m);
    snprintf(buf, cap, *path ? "unit '%s'" : "the model (as a unit)", path);
    return buf;
}

/* Which unit each parameter is in: those of the listed modules, the rest
 * in the root unit. */
static int assign(ct_ddp *d, ddp_fsdp *f, ct_module *const *mods, int nmods) {
    for (int i = 0; i < d->n; i++)
        f->unit_of[i] = 0;
    for (int k = 0; k < nmods; k++) {
        ct_param_list pl;
        ct_param_list_init(&pl);
        int rc = mods[k] ? ct_module_named_parameters(mods[k], &pl)
                         : ct__err_set(CT_EINVAL, "%s: unit %d is NULL", op, k);
        for (int j = 0; !rc && j < pl.n; j++) {
            int i = 0;
            while (i < d->n && d->p[i].t != pl.tensors[j])
                i++;
            if (i == d->n)
                rc = ct__err_set(CT_EINVAL,
                                 "%s: unit '%s' holds %s, which is not a parameter of "
                                 "the model",
                                 op, ct_module_path(mods[k]), pl.names[j]);
            else if (f->unit_of[i] != 0) {
                char a[128], b[128];
                rc = ct__err_set(CT_EINVAL,
                                 "%s: parameter %s is in %s and in %s: a unit wrapped twice, or "
                                 "one inside another",
                                 op, d->p[i].name, label(mods[f->unit_of[i] - 1], a, sizeof a),
                                 label(mods[k], b, sizeof b));
            } else
                f->unit_of[i] = k + 1;
        }
        ct_param_list_free(&pl);
        CT_TRY(rc);
    }
    return 0;
}

/* Unit u's buffer, its parameters rebound into it with their values, and
 * this rank's shard of it. */
static int build_unit(ct_ddp *d, fsdp_unit *u) {
    int size = ct_comm_size(d->comm), rank = ct_comm_rank(d->comm);
    size_t esize = ct_dtype_size(d->dtype);
    /* The shard is a tensor of its own, aligned wherever its block lies:
     * no rounding, so that padding stays under N elements a unit. */
    u->block = (u->numel + size - 1) / size;
    int64_t whole = u->block * size;
    u->full = ct__tensor_storage_new_releasable((size_t)whole * esize, d->device);
    if (!u->full)
        return ct_errcode();
    u->whole = ct__tensor_own(ct_tensor_from_storage(u->full, 0, 1, &whole, NULL, d->dtype));
    if (!u->whole)
        return ct_errcode();
    CT_TRY(ct__tensor_fill_any(u->whole, 0));
    for (int k = 0; k < u->nparams; k++) {
        ddp_param *p = &d->p[u->params[k]];
        ct_tensor *dst = ct__tensor_own(ct_narrow(u->whole, 0, u->at[k], p->numel));
        ct_tensor *src = dst ? ct__tensor_own(ct_tensor_from_storage(ct_tensor_storage(p->t),
                                                                     ct_tensor_offset(p->t), 1,
                                                                     &p->numel, NULL, d->dtype))
                             : NULL;
        int rc = !src ? ct_errcode() : ct__tensor_copy_any(dst, src);
        ct_tensor_free(src);
        ct_tensor_free(dst);
        CT_TRY(rc);
        CT_TRY(ct__tensor_rebind(p->t, u->full, u->at[k]));
        u->built = true;
    }
    ct_tensor *mine = ct__tensor_own(ct_narrow(u->whole, 0, rank * u->block, u->block));
    u->shard = mine ? ct__tensor_own(ct_clone(mine)) : NULL;
    ct_tensor_free(mine);
    u->grad = ct__tensor_own(ct_full_on(1, &u->block, 0, d->dtype, d->device));
    if (!u->shard || !u->grad)
        return ct_errcode();
    u->fresh = true;
    u->pending = u->nparams;
    /* Handed back at once: the parameters' old memory and the units' do
     * not all live at the same time. */
    u->state = GATHERED;
    return reshard(u);
}

static int hook_units(ddp_fsdp *f) {
    for (int k = 0; k < f->nunits; k++) {
        int rc = ct_module_set_forward_hooks(k ? f->u[k].module : f->model, pre_forward,
                                             post_forward, &f->u[k]);
        if (rc)
            return ct__err_set(rc, "%s: unit %s: %s", op, f->u[k].name, ct_errmsg());
        f->u[k].hooked = true;
    }
    return 0;
}

int ct__ddp_fsdp_init(ct_ddp *d, ct_module *model) {
    CT_REQUIRE(!ct_module_flat_params(model), CT_EINVAL,
               "%s: shard 3 gives each unit a buffer of its own: do not flatten the model "
               "(ct_module_flatten), whose flat buffer would keep every parameter's memory",
               op);
    CT_REQUIRE(!d->o.uneven_inputs, CT_EINVAL,
               "%s: shard 3 does not take uneven_inputs yet: give every rank the same number of "
               "steps",
               op);
    CT_REQUIRE(!d->has_hook, CT_EINVAL, "%s: a comm hook and shard are exclusive", op);
    ddp_fsdp *f = d->fsdp = calloc(1, sizeof *f);
    ct_module *const *mods = d->o.units;
    int nmods = d->o.nunits;
    ct_module **kids = NULL;
    if (f && nmods == 0) {
        nmods = ct_module_num_children(model);
        kids = calloc((size_t)(nmods > 0 ? nmods : 1), sizeof *kids);
        for (int k = 0; kids && k < nmods; k++)
            kids[k] = ct_module_child_at(model, k);
        mods = kids;
    }
    if (f) {
        f->model = model;
        f->unit_of = calloc((size_t)d->n, sizeof *f->unit_of);
        f->u = calloc((size_t)nmods + 1, sizeof *f->u);
    }
    int rc = f && f->unit_of && f->u && (kids || d->o.nunits)
                 ? 0
                 : ct__err_set(CT_ENOMEM, "%s: out of memory", op);
    if (!rc && nmods < 0)
        rc = ct__err_set(CT_EINVAL, "%s: nunits %d is negative", op, nmods);
    if (!rc)
        rc = assign(d, f, mods, nmods);
    f->nunits = rc ? 0 : nmods + 1;
    for (int k = 0; !rc && k < f->nunits; k++) {
        fsdp_unit *u = &f->u[k];
        *u = (fsdp_unit){.ddp = d, .index = k, .module = k ? mods[k - 1] : NULL};
        describe_unit(u);
        u->params = malloc(sizeof *u->params * (size_t)(d->n > 0 ? d->n : 1));
        u->at = malloc(sizeof *u->at * (size_t)(d->n > 0 ? d->n : 1));
        if (!u->params || !u->at) {
            rc = ct__err_set(CT_ENOMEM, "%s: out of memory", op);
            break;
        }
        for (int i = 0; i < d->n; i++)
            if (f->unit_of[i] == k) {
                u->at[u->nparams] = u->numel;
                u->params[u->nparams++] = i;
                u->numel += d->p[i].numel;
            }
    }
    free(kids);
    d->o.units = NULL; /* read here only: the caller's array may go */
    int64_t largest = 1;
    for (int k = 0; !rc && k < f->nunits; k++) {
        rc = build_unit(d, &f->u[k]);
        largest = f->u[k].block > largest ? f->u[k].block : largest;
    }
    if (!rc) {
        int64_t staged = largest * ct_comm_size(d->comm);
        bool host_comm = ct_device_equal(d->device, ct_comm_device(d->comm));
        f->staging = ct__tensor_own(host_comm ? ct_comm_zeros(d->comm, 1, &staged, d->dtype)
                                              : ct_full_on(1, &staged, 0, d->dtype, d->device));
        f->tmp = ct__tensor_own(ct_full_on(1, &largest, 0, d->dtype, d->device));
        f->map = ct__tensor_own(ct_full_on(1, (int64_t[]){d->n}, 0, d->dtype, d->device));
        rc = f->staging && f->tmp && f->map ? 0 : ct_errcode();
    }
    f->next_reduce = f->nunits - 1;
    return rc ? rc : hook_units(f);
}

void ct__ddp_fsdp_free(ct_ddp *d) {
    ddp_fsdp *f = d->fsdp;
    if (!f)
        return;
    /* The parameters keep their values: each unit is gathered one last
     * time, and the module keeps the buffer. */
    for (int k = 0; k < f->nunits; k++) {
        fsdp_unit *u = &f->u[k];
        if (u->hooked)
            ct_module_set_forward_hooks(k ? u->module : f->model, NULL, NULL, NULL);
        if (u->built && u->state != GATHERED)
            gather_wait(u);
        ct_work_free(u->gather);
        ct_tensor_free(u->whole);
        ct_tensor_free(u->shard);
        ct_tensor_free(u->grad);
        ct_storage_free(u->full);
        free(u->params);
        free(u->at);
    }
    ct_tensor_free(f->staging);
    ct_tensor_free(f->tmp);
    ct_tensor_free(f->map);
    free(f->unit_of);
    free(f->u);
    free(f);
    d->fsdp = NULL;
}

int ct_ddp_summon_params(ct_ddp *d, bool summon) {
    CT_TRY(ct__ddp_check(d, "ddp_summon_params"));
    if (!d->fsdp)
        return 0;
    CT_REQUIRE(!d->in_backward, CT_ESTATE, "ddp_summon_params: called during a backward");
    int rc = 0;
    for (int k = 0; k < d->fsdp->nunits; k++) {
        fsdp_unit *u = &d->fsdp->u[k];
        int wrc = !u->built ? 0 : summon ? gather_wait(u) : reshard(u);
        rc = rc ? rc : wrc;
    }
    d->fsdp->summoned = summon;
    return rc;
}

/* ----------------------------------------------------------- optimizer */

/* Where parameter i lies in this rank's shard of its unit: its elements
 * [*from, *from + *n) are the shard's from *at; *n 0 when none are. */
static fsdp_unit *shard_part(const ct_ddp *d, int i, int64_t *from, int64_t *at, int64_t *n) {
    fsdp_unit *u = &d->fsdp->u[d->fsdp->unit_of[i]];
    int k = 0;
    while (u->params[k] != i)
        k++;
    int64_t mine = (int64_t)ct_comm_rank(d->comm) * u->block;
    int64_t p0 = u->at[k], p1 = p0 + d->p[i].numel;
    int64_t lo = p0 > mine ? p0 : mine, hi = p1 < mine + u->block ? p1 : mine + u->block;
    *from = hi > lo ? lo - p0 : 0;
    *at = lo - mine;
    *n = hi > lo ? hi - lo : 0;
    return u;
}

ct_tensor *ct__ddp_fsdp_piece(ct_ddp *d, int i, int64_t *from, int *rc) {
    int64_t at, n;
    fsdp_unit *u = shard_part(d, i, from, &at, &n);
    *rc = 0;
    return n ? ct__ddp_piece(u->shard, at, u->grad, at, n, rc) : NULL;
}

int ct_ddp_param_shard(const ct_ddp *d, int param, ct_tensor **piece, int64_t *offset) {
    CT_TRY(ct__ddp_check(d, "ddp_param_shard"));
    CT_REQUIRE(piece && offset, CT_EINVAL, "ddp_param_shard: piece or offset is NULL");
    *piece = NULL;
    *offset = 0;
    CT_REQUIRE(d->fsdp, CT_ESTATE,
               "ddp_param_shard: the model is not fully sharded (shard %d): its parameters are "
               "whole on every rank",
               (int)d->o.shard);
    CT_REQUIRE(param >= 0 && param < d->n, CT_EINVAL,
               "ddp_param_shard: parameter %d is outside [0, %d)", param, d->n);
    int64_t at, n;
    const fsdp_unit *u = shard_part(d, param, offset, &at, &n);
    if (!n)
        return 0;
    *piece = ct__tensor_own(ct_narrow(u->shard, 0, at, n));
    return *piece ? 0 : ct_errcode();
}

int ct__ddp_fsdp_after_step(ct_ddp *d) {
    /* The shards changed: every unit gathers afresh before it computes. */
    int rc = 0;
    for (int k = 0; k < d->fsdp->nunits; k++) {
        int wrc = d->fsdp->u[k].built ? reshard(&d->fsdp->u[k]) : 0;
        d->fsdp->u[k].stepped = true;
        rc = rc ? rc : wrc;
    }
    return rc;
}

int ct__ddp_fsdp_zero_grads(ct_ddp *d) {
    for (int k = 0; k < d->fsdp->nunits; k++) {
        CT_TRY(ct__tensor_fill_any(d->fsdp->u[k].grad, 0));
        d->fsdp->u[k].fresh = true;
    }
    return 0;
}

int64_t ct__ddp_fsdp_bytes(const ct_ddp *d, int64_t *shards, int64_t *grads) {
    int64_t esize = (int64_t)ct_dtype_size(d->dtype), largest = 0;
    *shards = *grads = 0;
    for (int k = 0; k < d->fsdp->nunits; k++) {
        const fsdp_unit *u = &d->fsdp->u[k];
        *shards += u->block * esize;
        *grads += u->block * esize;
        largest = ct_numel(u->whole) > largest ? ct_numel(u->whole) : largest;
    }
    /* The staging, the reduce's output and one unit's buffer. */
    return (ct_numel(d->fsdp->staging) + ct_numel(d->fsdp->tmp) + largest) * esize;
}
