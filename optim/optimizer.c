/* Optimizer objects: parameters and groups, flat state, the step's plan and
 * its parallel run, zero_grad, and the state accessors.
 *
 * A step first plans: it walks the parameters in order and cuts the ones
 * with a gradient into segments, runs of elements that share one set of
 * hyperparameters and lie back to back in the parameter storage, the
 * gradient storage and the flat state buffers. Flat parameter and gradient
 * buffers make the whole model one segment; scattered parameters make one
 * segment each. The segments, laid end to end, form one iteration space that
 * a single ct_parallel_for covers, so small parameters do not each pay for a
 * trip to the pool. Nothing is written until the plan has been checked. */
#include "optim_impl.h"

#include <ct/autograd.h>

#include <math.h>
#include <stdlib.h>

#define OPTIM_MAGIC 0x63744f31u /* "ctO1" */
#define OPTIM_DEAD  0xdeadc7c9u
#define MAX_STATES  (1 + CT__OPTIM_MAX_BUFS)

typedef struct group {
    double weight_decay, lr_scale;
} group;

typedef struct param {
    ct_tensor *t; /* a reference the optimizer holds */
    int group;
    int64_t offset; /* into the flat state buffers, in elements */
    int64_t numel;
} param;

/* A run of elements updated with one set of hyperparameters
 * (device_impl.h's, which the device's optim_step takes). */
typedef ct__optim_segment segment;

struct ct_optim {
    uint32_t magic;
    ct_optim_options opts; /* opts.lr is the current rate */
    int64_t step_count;
    ct_dtype dtype;
    group *groups;
    int nparams;
    param *params;
    int64_t total; /* elements in every flat buffer */
    int nstates;
    const char *names[MAX_STATES];
    ct_tensor *states[MAX_STATES]; /* [0] "step": int64 [nparams]; others [total] */
    ct_tensor **views;             /* [state * nparams + param], made on first use */
    segment *segs;                 /* [nparams]: the current step's plan */
    ct_optim_hooks hooks;
};

static int check(const ct_optim *opt, const char *fn) {
    if (!opt)
        return ct__err_set(CT_EINVAL, "%s: the optimizer is NULL", fn);
    if (opt->magic != OPTIM_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: %p is not a live optimizer (freed or foreign)", fn,
                           (const void *)opt);
    return 0;
}

ct_optim_options ct_optim_defaults(ct_optim_kind kind, double lr) {
    ct_optim_options o = {.kind = kind, .lr = lr};
    if (kind != CT_OPTIM_SGD) {
        o.beta1 = 0.9;
        o.beta2 = 0.999;
        o.eps = 1e-8;
        o.weight_decay = kind == CT_OPTIM_ADAMW ? 1e-2 : 0;
    }
    return o;
}

static const char *kind_name(ct_optim_kind kind) {
    switch (kind) {
    case CT_OPTIM_SGD: return "SGD";
    case CT_OPTIM_ADAM: return "Adam";
    case CT_OPTIM_ADAMW: return "AdamW";
    }
    return "?";
}

static bool nonneg(double x) { return x >= 0 && isfinite(x); }

static int check_options(const ct_optim_options *o, const char *fn) {
    if (!o)
        return ct__err_set(CT_EINVAL, "%s: options are NULL; start from ct_optim_defaults()", fn);
    if (o->kind != CT_OPTIM_SGD && o->kind != CT_OPTIM_ADAM && o->kind != CT_OPTIM_ADAMW)
        return ct__err_set(CT_EINVAL,
                           "%s: kind %d is not CT_OPTIM_SGD, CT_OPTIM_ADAM or CT_OPTIM_ADAMW", fn,
                           (int)o->kind);
    const char *k = kind_name(o->kind);
    if (!nonneg(o->lr))
        return ct__err_set(CT_EINVAL, "%s: %s lr %g is invalid; expected a finite rate >= 0", fn, k,
                           o->lr);
    if (o->kind == CT_OPTIM_SGD) {
        if (!nonneg(o->momentum))
            return ct__err_set(CT_EINVAL,
                               "%s: SGD momentum %g is invalid; expected a finite value >= 0", fn,
                               o->momentum);
        if (!isfinite(o->dampening))
            return ct__err_set(CT_EINVAL, "%s: SGD dampening %g is not finite", fn, o->dampening);
        if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
            return ct__err_set(CT_EINVAL,
                               "%s: SGD nesterov momentum requires momentum > 0 and dampening 0 "
                               "(got momentum %g, dampening %g)",
                               fn, o->momentum, o->dampening);
        return 0;
    }
    const double betas[2] = {o->beta1, o->beta2};
    for (int i = 0; i < 2; i++)
        if (!(betas[i] >= 0 && betas[i] < 1))
            return ct__err_set(CT_EINVAL, "%s: %s beta%d %g is outside [0, 1)", fn, k, i + 1,
                               betas[i]);
    if (!nonneg(o->eps))
        return ct__err_set(CT_EINVAL, "%s: %s eps %g is invalid; expected a finite value >= 0", fn,
                           k, o->eps);
    return 0;
}

static int check_group(const ct_param_group *g, int index, const char *fn) {
    if (g->nparams < 0 || (g->nparams > 0 && !g->params))
        return ct__err_set(CT_EINVAL, "%s: group %d has %d parameters at %p", fn, index, g->nparams,
                           (const void *)g->params);
    if (!nonneg(g->weight_decay))
        return ct__err_set(CT_EINVAL,
                           "%s: group %d weight_decay %g is invalid; expected a finite value >= 0",
                           fn, index, g->weight_decay);
    if (!(g->lr_scale > 0 && isfinite(g->lr_scale)))
        return ct__err_set(
            CT_EINVAL,
            "%s: group %d lr_scale %g is invalid; expected a finite value > 0 (1 for "
            "the optimizer's rate; leave parameters out to freeze them)",
            fn, index, g->lr_scale);
    return 0;
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (ct_tensor *const *)a, y = (uintptr_t) * (ct_tensor *const *)b;
    return (x > y) - (x < y);
}

int ct__optim_check_tensor(const ct_tensor *t, const char *fn, const char *role) {
    if (!t)
        return ct_errcode() != CT_OK ? ct_errcode()
                                     : ct__err_set(CT_EINVAL, "%s: %s is NULL", fn, role);
    if (t->magic != CT__TENSOR_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: %s is not a live tensor (freed or foreign)", fn, role);
    return 0;
}

/* Checks every parameter and lists them in order in all. */
static int check_params(const ct_param_group *groups, int ngroups, int total, ct_tensor **all,
                        const char *fn) {
    char d0[CT__DESC_STR], d1[CT__DESC_STR], role[64];
    int k = 0;
    for (int gi = 0; gi < ngroups; gi++) {
        for (int j = 0; j < groups[gi].nparams; j++, k++) {
            ct_tensor *t = groups[gi].params[j];
            snprintf(role, sizeof role, "param %d (group %d)", k, gi);
            int rc = ct__optim_check_tensor(t, fn, role);
            if (rc)
                return rc;
            ct_dtype dt = ct_tensor_dtype(t);
            if (dt != CT_FLOAT32 && dt != CT_FLOAT64)
                return ct__err_set(CT_EDTYPE,
                                   "%s: param %d (group %d) is %s; optimizers update float32 or "
                                   "float64 parameters",
                                   fn, k, gi, ct__tensor_desc(d0, t));
            if (k > 0 && ct__tensor_check_same_device(fn, (ct_tensor *const[]){all[0], t}, 2))
                return ct__err_set(CT_EDEVICE,
                                   "%s: param %d (group %d) is on another device than param 0 "
                                   "(%s); one optimizer updates one device's parameters",
                                   fn, k, gi, ct_errmsg());
            if (k > 0 && dt != ct_tensor_dtype(all[0]))
                return ct__err_set(CT_EDTYPE,
                                   "%s: param %d (group %d) is %s but param 0 is %s; one optimizer "
                                   "takes one dtype (make one per dtype)",
                                   fn, k, gi, ct__tensor_desc(d0, t), ct__tensor_desc(d1, all[0]));
            if (!ct_is_contiguous(t))
                return ct__err_set(
                    CT_EINVAL,
                    "%s: param %d (group %d) %s is not contiguous; parameters must be "
                    "dense",
                    fn, k, gi, ct__tensor_desc(d0, t));
            all[k] = t;
        }
    }
    if (total == 0)
        return ct__err_set(CT_EINVAL, "%s: got an empty parameter list", fn);
    ct_tensor **sorted = malloc((size_t)total * sizeof *sorted);
    if (!sorted)
        return ct__err_set(CT_ENOMEM, "%s: out of memory for %d parameters", fn, total);
    memcpy(sorted, all, (size_t)total * sizeof *sorted);
    qsort(sorted, (size_t)total, sizeof *sorted, cmp_ptr);
    ct_tensor *dup = NULL;
    for (int i = 1; i < total && !dup; i++)
        if (sorted[i] == sorted[i - 1])
            dup = sorted[i];
    free(sorted);
    if (dup) {
        int a = 0;
        while (all[a] != dup)
            a++;
        int b = a + 1;
        while (all[b] != dup)
            b++;
        return ct__err_set(CT_EINVAL, "%s: param %d %s is listed again as param %d", fn, a,
                           ct__tensor_desc(d0, dup), b);
    }
    return 0;
}

/* A zeroed tensor on device that the optimizer owns, whatever scope the
 * caller is in. */
static ct_tensor *owned_zeros(int64_t n, ct_dtype dtype, ct_device device) {
    ct_scope_begin();
    ct_tensor *t = ct_full_on(CT_SHAPE(n), 0, dtype, device);
    if (t)
        ct_tensor_retain(t);
    ct_scope_end();
    return t;
}

static int alloc_state(ct_optim *opt, const char *fn) {
    static const char *const sgd[] = {"momentum_buffer"};
    static const char *const adam[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    const ct_optim_options *o = &opt->opts;
    int nbufs = 0;
    const char *const *names = NULL;
    if (o->kind == CT_OPTIM_SGD) {
        names = sgd;
        nbufs = o->momentum != 0;
    } else {
        names = adam;
        nbufs = o->amsgrad ? 3 : 2;
    }
    opt->names[0] = "step";
    opt->states[0] = owned_zeros(opt->nparams, CT_INT64, CT_DEVICE_CPU);
    opt->nstates = 1;
    if (!opt->states[0])
        return ct_errcode();
    for (int i = 0; i < nbufs; i++) {
        opt->names[opt->nstates] = names[i];
        opt->states[opt->nstates] =
            owned_zeros(opt->total, opt->dtype, ct_tensor_device(opt->params[0].t));
        if (!opt->states[opt->nstates])
            return ct_errcode();
        opt->nstates++;
    }
    opt->views = calloc((size_t)opt->nstates * (size_t)opt->nparams, sizeof *opt->views);
    opt->segs = malloc((size_t)opt->nparams * sizeof *opt->segs);
    if (!opt->views || !opt->segs)
        return ct__err_set(CT_ENOMEM, "%s: out of memory for the state of %d parameters", fn,
                           opt->nparams);
    return 0;
}

static ct_optim *create(const ct_optim_options *opts, const ct_param_group *groups, int ngroups,
                        const char *fn) {
    if (ngroups < 0 || (ngroups > 0 && !groups)) {
        ct__err_set(CT_EINVAL, "%s: %d groups at %p", fn, ngroups, (const void *)groups);
        return NULL;
    }
    int total = 0;
    for (int i = 0; i < ngroups; i++) {
        if (check_group(&groups[i], i, fn))
            return NULL;
        if (groups[i].nparams > INT32_MAX - total) {
            ct__err_set(CT_EINVAL, "%s: more than %d parameters", fn, INT32_MAX);
            return NULL;
        }
        total += groups[i].nparams;
    }
    ct_tensor **all = malloc((size_t)(total > 0 ? total : 1) * sizeof *all);
    ct_optim *opt = calloc(1, sizeof *opt);
    group *gs = malloc((size_t)(ngroups > 0 ? ngroups : 1) * sizeof *gs);
    param *ps = calloc((size_t)(total > 0 ? total : 1), sizeof *ps);
    if (!all || !opt || !gs || !ps) {
        ct__err_set(CT_ENOMEM, "%s: out of memory for %d parameters", fn, total);
        goto fail;
    }
    if (check_params(groups, ngroups, total, all, fn))
        goto fail;
    opt->magic = OPTIM_MAGIC;
    opt->opts = *opts;
    opt->dtype = ct_tensor_dtype(all[0]);
    opt->groups = gs;
    opt->params = ps;
    for (int gi = 0, k = 0; gi < ngroups; gi++) {
        gs[gi] = (group){groups[gi].weight_decay, groups[gi].lr_scale};
        for (int j = 0; j < groups[gi].nparams; j++, k++) {
            ps[k] = (param){ct_tensor_retain(all[k]), gi, opt->total, ct_numel(all[k])};
            opt->nparams++;
            opt->total += ps[k].numel;
        }
    }
    free(all);
    if (alloc_state(opt, fn)) {
        ct_optim_free(opt);
        return NULL;
    }
    return opt;
fail:
    free(all);
    free(opt);
    free(gs);
    free(ps);
    return NULL;
}

ct_optim *ct_optim_new(const ct_optim_options *opts, ct_tensor *const *params, int nparams) {
    if (check_options(opts, "optim_new"))
        return NULL;
    if (!nonneg(opts->weight_decay)) {
        ct__err_set(CT_EINVAL,
                    "optim_new: weight_decay %g is invalid; expected a finite value >= 0",
                    opts->weight_decay);
        return NULL;
    }
    ct_param_group g = {params, nparams, opts->weight_decay, 1};
    return create(opts, &g, 1, "optim_new");
}

ct_optim *ct_optim_new_groups(const ct_optim_options *opts, const ct_param_group *groups,
                              int ngroups) {
    if (check_options(opts, "optim_new_groups"))
        return NULL;
    return create(opts, groups, ngroups, "optim_new_groups");
}

void ct_optim_free(ct_optim *opt) {
    if (!opt)
        return;
    CT_ASSERT(opt->magic == OPTIM_MAGIC && "ct_optim_free: not a live optimizer");
    if (opt->hooks.free)
        opt->hooks.free(opt->hooks.ctx);
    if (opt->views)
        for (int i = 0; i < opt->nstates * opt->nparams; i++)
            ct_tensor_free(opt->views[i]);
    for (int i = 0; i < opt->nstates; i++)
        ct_tensor_free(opt->states[i]);
    for (int i = 0; i < opt->nparams; i++)
        ct_tensor_free(opt->params[i].t);
    free(opt->views);
    free(opt->segs);
    free(opt->params);
    free(opt->groups);
    opt->magic = OPTIM_DEAD;
    free(opt);
}

/* ------------------------------------------------------------------ step */

/* b starts where a ends in the same storage, both dense: one run. */
static bool follows(const ct_tensor *a, const ct_tensor *b) {
    return ct_tensor_storage(a) == ct_tensor_storage(b) &&
           ct_tensor_dtype(a) == ct_tensor_dtype(b) && ct_is_contiguous(a) && ct_is_contiguous(b) &&
           ct_tensor_offset(a) + ct_numel(a) == ct_tensor_offset(b);
}

/* The hyperparameters of a group at a parameter's step (counted from 1). */
static ct__optim_hyper hyper(const ct_optim *opt, const group *g, int64_t step) {
    const ct_optim_options *o = &opt->opts;
    double lr = o->lr * g->lr_scale;
    ct__optim_hyper h = {
        .kind = o->kind,
        .lr = lr,
        .weight_decay = g->weight_decay,
        .momentum = o->momentum,
        .dampening = o->dampening,
        .nesterov = o->nesterov,
        .first = step == 1,
        .beta1 = o->beta1,
        .beta2 = o->beta2,
        .eps = o->eps,
        .amsgrad = o->amsgrad,
    };
    if (o->kind != CT_OPTIM_SGD) {
        h.step_size = lr / (1 - pow(o->beta1, (double)step));
        h.bc2_sqrt = sqrt(1 - pow(o->beta2, (double)step));
        h.decay = 1 - lr * g->weight_decay;
    }
    return h;
}

static int64_t *param_steps(const ct_optim *opt) { return ct_data_ptr(opt->states[0]); }

/* Checks every gradient and cuts the plan; reads only. Strided gradients are
 * copied into contiguous tensors that the caller's scope owns. */
static int plan(ct_optim *opt, int *nsegs_out, int64_t *total_out) {
    char d0[CT__DESC_STR], d1[CT__DESC_STR];
    const int64_t *steps = param_steps(opt);
    int nsegs = 0;
    int64_t total = 0;
    const ct_tensor *prev_p = NULL, *prev_g = NULL;
    int prev = -1;
    for (int i = 0; i < opt->nparams; i++) {
        const param *pp = &opt->params[i];
        ct_tensor *g = ct_tensor_grad(pp->t);
        if (!g)
            continue;
        char role[64];
        snprintf(role, sizeof role, "the gradient of param %d", i);
        int rc = ct__optim_check_tensor(g, "optim_step", role);
        if (rc)
            return rc;
        if (ct__tensor_check_same_device("optim_step", (ct_tensor *const[]){pp->t, g}, 2))
            return ct__err_set(CT_EDEVICE, "optim_step: param %d and its gradient: %s", i,
                               ct_errmsg());
        if (ct_tensor_dtype(g) != opt->dtype)
            return ct__err_set(CT_EDTYPE, "optim_step: param %d is %s but its gradient is %s", i,
                               ct__tensor_desc(d0, pp->t), ct__tensor_desc(d1, g));
        if (!ct__same_shape(g, pp->t))
            return ct__err_set(CT_ESHAPE, "optim_step: param %d is %s but its gradient is %s", i,
                               ct__tensor_desc(d0, pp->t), ct__tensor_desc(d1, g));
        if (steps[i] < 0 || steps[i] == INT64_MAX)
            return ct__err_set(CT_ESTATE,
                               "optim_step: param %d's \"step\" state is %lld; expected a count "
                               ">= 0",
                               i, (long long)steps[i]);
        if (!ct_is_contiguous(g) && !(g = ct_contiguous(g)))
            return ct_errcode();
        if (pp->numel == 0)
            continue;
        segment *last = nsegs > 0 ? &opt->segs[nsegs - 1] : NULL;
        if (last && opt->params[prev].group == pp->group && steps[prev] == steps[i] &&
            last->offset + last->n == pp->offset && follows(prev_p, pp->t) && follows(prev_g, g)) {
            last->n += pp->numel;
        } else {
            opt->segs[nsegs++] = (segment){
                .start = total,
                .n = pp->numel,
                .p = ct_data_ptr(pp->t),
                .g = ct_data_ptr(g),
                .offset = pp->offset,
                .h = hyper(opt, &opt->groups[pp->group], steps[i] + 1),
            };
        }
        total += pp->numel;
        prev_p = pp->t;
        prev_g = g;
        prev = i;
    }
    *nsegs_out = nsegs;
    *total_out = total;
    return 0;
}

int ct_optim_step(ct_optim *opt) {
    int rc = check(opt, "optim_step");
    if (rc)
        return rc;
    bool grad_mode = ct_set_grad_enabled(false);
    ct_scope_begin();
    int nsegs = 0;
    int64_t total = 0;
    rc = plan(opt, &nsegs, &total);
    if (rc == 0) {
        ct__optim_step st = {opt->segs, nsegs, total, opt->dtype, {NULL}};
        for (int j = 1; j < opt->nstates; j++)
            st.bufs[j - 1] = ct_data_ptr(opt->states[j]);
        ct_device device = opt->nparams ? ct_tensor_device(opt->params[0].t) : CT_DEVICE_CPU;
        const ct__device_ops *ops = CT__DEVICE_GET("optim_step", device, optim_step);
        rc = ops ? ops->optim_step(&st, device.index) : ct_errcode();
        if (rc == 0) {
            int64_t *steps = param_steps(opt);
            for (int i = 0; i < opt->nparams; i++) {
                if (ct_tensor_grad(opt->params[i].t)) {
                    steps[i]++;
                    ct__tensor_bump_version(opt->params[i].t);
                }
            }
            opt->step_count++;
            if (opt->hooks.after_step)
                rc = opt->hooks.after_step(opt->hooks.ctx);
        }
    }
    ct_scope_end();
    ct_set_grad_enabled(grad_mode);
    return rc;
}

/* Zeroes bytes bytes from p, inside t's storage, where the storage lives:
 * memset on the host, one fill kernel on a device. */
static int zero_run(const ct_tensor *t, char *p, size_t bytes) {
    ct_storage *s = ct_tensor_storage(t);
    if (ct__is_host(ct_storage_device(s))) {
        memset(p, 0, bytes);
        return 0;
    }
    ct_tensor *run =
        ct_tensor_from_storage(s, p - (char *)s->data, CT_SHAPE((int64_t)bytes), NULL, CT_UINT8);
    return run ? ct__tensor_fill_any(run, 0) : ct_errcode();
}

int ct_optim_zero_grad(ct_optim *opt, bool set_to_none) {
    int rc = check(opt, "optim_zero_grad");
    if (rc)
        return rc;
    if (opt->hooks.zero_grad)
        return opt->hooks.zero_grad(opt->hooks.ctx, set_to_none);
    if (set_to_none) {
        for (int i = 0; i < opt->nparams && rc == 0; i++)
            rc = ct_tensor_set_grad(opt->params[i].t, NULL);
        return rc;
    }
    bool grad_mode = ct_set_grad_enabled(false);
    ct_scope_begin();
    ct_tensor *zero = NULL;
    char *run = NULL;
    size_t run_bytes = 0;
    const ct_tensor *last = NULL;
    for (int i = 0; i < opt->nparams && rc == 0; i++) {
        ct_tensor *g = ct_tensor_grad(opt->params[i].t);
        if (!g)
            continue;
        /* Strided gradients are zeroed by a copy, on their device;
         * contiguous runs (a flat buffer's views are one) at once. */
        if (!ct_is_contiguous(g)) {
            if (!zero)
                zero = ct_full_on(0, NULL, 0, ct_tensor_dtype(g), ct_tensor_device(g));
            if (!ct_copy_(g, zero))
                rc = ct_errcode();
            continue;
        }
        size_t bytes = (size_t)ct_numel(g) * ct_dtype_size(ct_tensor_dtype(g));
        if (last && follows(last, g)) {
            run_bytes += bytes;
        } else {
            if (run_bytes)
                rc = zero_run(last, run, run_bytes);
            run = ct_data_ptr(g);
            run_bytes = bytes;
        }
        last = g;
        ct__tensor_bump_version(g);
    }
    if (run_bytes && !rc)
        rc = zero_run(last, run, run_bytes);
    ct_scope_end();
    ct_set_grad_enabled(grad_mode);
    return rc;
}

int ct_optim_set_hooks(ct_optim *opt, const ct_optim_hooks *hooks) {
    int rc = check(opt, "optim_set_hooks");
    if (rc)
        return rc;
    if (opt->hooks.free)
        opt->hooks.free(opt->hooks.ctx);
    opt->hooks = hooks ? *hooks : (ct_optim_hooks){0};
    return 0;
}

/* ------------------------------------------------------------- accessors */

double ct_optim_lr(const ct_optim *opt) { return check(opt, "optim_lr") ? NAN : opt->opts.lr; }

int ct_optim_set_lr(ct_optim *opt, double lr) {
    int rc = check(opt, "optim_set_lr");
    if (rc)
        return rc;
    if (isnan(lr) && ct_errcode() != CT_OK)
        return ct_errcode();
    if (!nonneg(lr))
        return ct__err_set(CT_EINVAL, "optim_set_lr: lr %g is invalid; expected a finite rate >= 0",
                           lr);
    opt->opts.lr = lr;
    return 0;
}

int64_t ct_optim_step_count(const ct_optim *opt) {
    int rc = check(opt, "optim_step_count");
    return rc ? rc : opt->step_count;
}

int ct_optim_set_step_count(ct_optim *opt, int64_t step) {
    int rc = check(opt, "optim_set_step_count");
    if (rc)
        return rc;
    if (step < 0)
        return ct__err_set(CT_EINVAL, "optim_set_step_count: step %lld is negative",
                           (long long)step);
    opt->step_count = step;
    int64_t *steps = param_steps(opt);
    for (int i = 0; i < opt->nparams; i++)
        steps[i] = step;
    return 0;
}

int ct_optim_num_params(const ct_optim *opt) {
    int rc = check(opt, "optim_num_params");
    return rc ? rc : opt->nparams;
}

static int check_index(const ct_optim *opt, int index, const char *fn) {
    int rc = check(opt, fn);
    if (rc)
        return rc;
    if (index < 0 || index >= opt->nparams)
        return ct__err_set(CT_EINVAL, "%s: param index %d is out of range [0, %d)", fn, index,
                           opt->nparams);
    return 0;
}

ct_tensor *ct_optim_param(const ct_optim *opt, int index) {
    return check_index(opt, index, "optim_param") ? NULL : opt->params[index].t;
}

int64_t ct_optim_param_offset(const ct_optim *opt, int index) {
    return check_index(opt, index, "optim_param_offset") ? -1 : opt->params[index].offset;
}

int ct_optim_num_states(const ct_optim *opt) {
    int rc = check(opt, "optim_num_states");
    return rc ? rc : opt->nstates;
}

int ct_optim_state_at(const ct_optim *opt, int i, const char **name, ct_tensor **state) {
    int rc = check(opt, "optim_state_at");
    if (rc)
        return rc;
    if (i < 0 || i >= opt->nstates)
        return ct__err_set(CT_EINVAL, "optim_state_at: state index %d is out of range [0, %d)", i,
                           opt->nstates);
    if (name)
        *name = opt->names[i];
    if (state)
        *state = opt->states[i];
    return 0;
}

static int find_state(const ct_optim *opt, const char *name, const char *fn) {
    int rc = check(opt, fn);
    if (rc)
        return rc;
    for (int i = 0; name && i < opt->nstates; i++)
        if (strcmp(opt->names[i], name) == 0)
            return i;
    char list[128] = "";
    for (int i = 0; i < opt->nstates; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? ", " : "",
                 opt->names[i]);
    return ct__err_set(CT_EINVAL, "%s: this %s optimizer has no state \"%s\"; it has %s", fn,
                       kind_name(opt->opts.kind), name ? name : "(null)", list);
}

ct_tensor *ct_optim_state(const ct_optim *opt, const char *name) {
    int i = find_state(opt, name, "optim_state");
    return i < 0 ? NULL : opt->states[i];
}

ct_tensor *ct_optim_param_state(ct_optim *opt, const char *name, int index) {
    int s = find_state(opt, name, "optim_param_state");
    if (s < 0 || check_index(opt, index, "optim_param_state"))
        return NULL;
    ct_tensor **view = &opt->views[s * opt->nparams + index];
    if (!*view) {
        const param *pp = &opt->params[index];
        ct_tensor *base = opt->states[s];
        ct_scope_begin();
        *view =
            s == 0 ? ct_tensor_from_storage(ct_tensor_storage(base), index, 0, NULL, NULL, CT_INT64)
                   : ct_tensor_from_storage(ct_tensor_storage(base), pp->offset, ct_ndim(pp->t),
                                            ct_sizes(pp->t), NULL, opt->dtype);
        if (*view)
            ct_tensor_retain(*view);
        ct_scope_end();
    }
    return *view;
}
