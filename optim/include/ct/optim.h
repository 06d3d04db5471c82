/* ct/optim.h: optimizers (SGD, Adam, AdamW), gradient clipping and
 * learning-rate schedules.
 *
 * An optimizer holds references to its parameters and one flat buffer per
 * kind of state ("exp_avg", ...), with each parameter's state a view at an
 * offset, as llm.c does. ct_optim_step() reads every parameter's .grad
 * (ct_tensor_grad()) and updates the parameter in place with PyTorch 1.13's
 * rules. When the parameters are contiguous views that tile one storage in
 * order, and so are their gradients (nn's flat parameter and gradient
 * buffers), a step is one fused, vectorised pass over the whole range;
 * otherwise it is one fused pass per parameter. Learning-rate schedules are
 * closed forms of the step, so a resumed run computes the same rate without
 * replaying history.
 *
 * Example:
 *
 *     #include <ct/autograd.h>
 *     #include <ct/optim.h>
 *     #include <stdio.h>
 *
 *     int main(void) {
 *         ct_tensor *w = ct_requires_grad_(ct_randn(CT_SHAPE(4, 3), CT_FLOAT32, NULL), true);
 *         ct_tensor *b = ct_requires_grad_(ct_zeros(CT_SHAPE(3), CT_FLOAT32), true);
 *         ct_tensor *params[] = {w, b};
 *         ct_tensor *x = ct_randn(CT_SHAPE(8, 4), CT_FLOAT32, NULL);
 *         ct_param_group groups[] = {{&w, 1, 0.01, 1}, {&b, 1, 0, 1}}; // no decay for b
 *         ct_optim_options o = ct_optim_defaults(CT_OPTIM_ADAMW, 1e-2);
 *         ct_optim *opt = ct_optim_new_groups(&o, groups, 2);
 *         ct_lr_schedule sched = {
 *             .kind = CT_LR_COSINE, .base_lr = 1e-2, .total_steps = 90, .warmup_steps = 10};
 *         int rc = opt ? 0 : ct_errcode();
 *         for (int64_t step = 0; step < 100 && rc == 0; step++) {
 *             ct_scope_begin();
 *             ct_tensor *y = ct_add(ct_matmul(x, w), b);
 *             ct_tensor *loss = ct_mean(ct_mul(y, y), NULL, 0, false);
 *             rc = loss ? ct_tensor_backward(loss) : ct_errcode();
 *             if (rc == 0)
 *                 rc = ct_clip_grad_norm(params, 2, 1.0, NULL);
 *             if (rc == 0)
 *                 rc = ct_optim_set_lr(opt, ct_lr_schedule_at(&sched, step));
 *             if (rc == 0)
 *                 rc = ct_optim_step(opt);
 *             if (rc == 0)
 *                 rc = ct_optim_zero_grad(opt, true);
 *             if (rc == 0 && step % 25 == 0)
 *                 printf("step %d: loss %.4f\n", (int)step, ct_item(loss));
 *             ct_scope_end();
 *         }
 *         if (rc)
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         ct_optim_free(opt);
 *         ct_tensor_free(x);
 *         ct_tensor_free(w);
 *         ct_tensor_free(b);
 *         return rc ? 1 : 0;
 *     }
 *
 * Ownership. An optimizer holds a reference to each parameter until
 * ct_optim_free(). Its state tensors are borrowed: they live as long as the
 * optimizer, and writing into them (ct_copy_) changes its state, which is how
 * a checkpoint restores it.
 *
 * Errors. Functions return 0 or a negative CT_E* code, NULL or NAN, with a
 * message in ct_errmsg() naming the option or parameter, its value and what
 * was expected. A step that fails changes nothing.
 *
 * Threads. An optimizer is not thread-safe: one thread at a time may use it,
 * and nothing may read or write its parameters or gradients during a step.
 * The step runs its loops on ct's pool (ct_parallel_for); results do not
 * depend on the thread count. Schedules are pure and thread-safe.
 */
#ifndef CT_OPTIM_H
#define CT_OPTIM_H

#include <ct/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ optimizers */

typedef enum ct_optim_kind { CT_OPTIM_SGD, CT_OPTIM_ADAM, CT_OPTIM_ADAMW } ct_optim_kind;

/* Hyperparameters, named as in torch.optim. Fields of the other kinds are
 * ignored. Start from ct_optim_defaults(): zero is not Adam's default for
 * beta1, beta2 or eps. */
typedef struct ct_optim_options {
    ct_optim_kind kind;
    double lr;           /* >= 0 */
    double weight_decay; /* >= 0; used by ct_optim_new(); groups carry their own */
    /* SGD */
    double momentum;  /* >= 0 */
    double dampening; /* applied from the second step on */
    bool nesterov;    /* needs momentum > 0 and dampening 0 */
    /* Adam, AdamW */
    double beta1, beta2; /* each in [0, 1) */
    double eps;          /* >= 0 */
    bool amsgrad;
} ct_optim_options;

/* PyTorch's defaults for kind with learning rate lr: SGD with no momentum,
 * dampening or decay; Adam with betas (0.9, 0.999), eps 1e-8, no decay;
 * AdamW the same with weight_decay 1e-2. Thread-safe. */
CT_API ct_optim_options ct_optim_defaults(ct_optim_kind kind, double lr);

/* Parameters that share a weight decay and a learning-rate multiplier
 * (PyTorch's param_groups). The usual split: weights with decay, biases and
 * norm scales without. */
typedef struct ct_param_group {
    ct_tensor *const *params; /* borrowed for the call */
    int nparams;              /* may be 0 */
    double weight_decay;      /* >= 0: L2 for SGD and Adam, decoupled for AdamW */
    double lr_scale;          /* > 0: the group's rate is the optimizer's lr times this */
} ct_param_group;

/* An optimizer: its parameters, their state and the step count. */
typedef struct ct_optim ct_optim;

/* A new optimizer over params[0..nparams-1], one group with
 * opts->weight_decay and lr_scale 1. The caller owns the result
 * (ct_optim_free). Every parameter must be a live, dense (contiguous) CPU
 * tensor of float32 or float64, all of one dtype, none listed twice; a NULL
 * parameter keeps the error that made it NULL. State buffers start at zero.
 * Errors (NULL returned): CT_EINVAL for a bad option (negative lr, nesterov
 * without momentum or with dampening, a beta outside [0, 1), ...), no
 * parameters, a repeated or non-contiguous parameter; CT_EDTYPE for a
 * parameter of another dtype or mixed dtypes; CT_EDEVICE; CT_ENOMEM.
 * Thread-safe (the parameters are only read). */
CT_API ct_optim *ct_optim_new(const ct_optim_options *opts, ct_tensor *const *params, int nparams);
/* The same with parameter groups: each group's weight_decay and lr_scale
 * apply to its parameters, and opts->weight_decay is not used. Parameters
 * are numbered across groups in order. Errors as ct_optim_new, plus
 * CT_EINVAL for a negative weight decay or an lr_scale that is not > 0. */
CT_API ct_optim *ct_optim_new_groups(const ct_optim_options *opts, const ct_param_group *groups,
                                     int ngroups);
/* Releases the optimizer, its state and its references to the parameters.
 * Accepts NULL. */
CT_API void ct_optim_free(ct_optim *opt);

/* Updates every parameter that has a gradient, skipping those whose .grad
 * is NULL as PyTorch does (their state and step count stay as they are),
 * then counts the step. Gradients must match their parameter's shape and
 * dtype; a strided gradient is read through a contiguous copy. Parameters
 * are written in place and their version counters bumped, so a graph that
 * saved one fails its backward instead of using a stale value. Errors:
 * CT_EINVAL (bad handle), CT_ESHAPE / CT_EDTYPE for a gradient that does not
 * match, CT_ESTATE for a negative restored "step" count, CT_ENOMEM; on error
 * nothing is updated. Not thread-safe. */
CT_API int ct_optim_step(ct_optim *opt);
/* Drops every parameter's .grad (set_to_none), or writes zeros into the
 * existing gradients: one memset per run of gradients that tile a storage
 * back to back (a flat gradient buffer is one run). Errors: CT_EINVAL (bad
 * handle). Not thread-safe. */
CT_API int ct_optim_zero_grad(ct_optim *opt, bool set_to_none);

/* The learning rate, as set by the options or ct_optim_set_lr(). NAN with
 * CT_EINVAL for a bad handle. */
CT_API double ct_optim_lr(const ct_optim *opt);
/* Sets the learning rate the next step uses (each group's lr_scale still
 * applies). Errors: CT_EINVAL for a bad handle, or an lr that is negative,
 * infinite or NaN (the NAN a failed ct_lr_schedule_at() returns included, so
 * its error carries through). Not thread-safe. */
CT_API int ct_optim_set_lr(ct_optim *opt, double lr);
/* How many times ct_optim_step() has succeeded (or the count set below); a
 * negative CT_E* code for a bad handle. */
CT_API int64_t ct_optim_step_count(const ct_optim *opt);
/* Sets the step count and every parameter's own count (the "step" state) to
 * step, as after that many steps in which every parameter had a gradient;
 * restore the "step" state afterwards for exact per-parameter counts. A
 * count of 0 makes the next step start the momentum buffers and Adam's bias
 * correction afresh. Errors: CT_EINVAL (bad handle, negative step). */
CT_API int ct_optim_set_step_count(ct_optim *opt, int64_t step);

/* How many parameters, or a negative CT_E* code for a bad handle; the
 * parameters themselves, in order across groups, borrowed (NULL with
 * CT_EINVAL for a bad handle or index). */
CT_API int ct_optim_num_params(const ct_optim *opt);
CT_API ct_tensor *ct_optim_param(const ct_optim *opt, int index);
/* Where parameter index's state starts in each flat buffer, in elements:
 * the numels of the parameters before it, summed. -1 with CT_EINVAL for a
 * bad handle or index. */
CT_API int64_t ct_optim_param_offset(const ct_optim *opt, int index);

/* State, for checkpoints. There are ct_optim_num_states() named tensors:
 *   "step"            int64 [nparams]: each parameter's own step count;
 *   "momentum_buffer" SGD with momentum > 0;
 *   "exp_avg", "exp_avg_sq", and "max_exp_avg_sq" with amsgrad: Adam, AdamW.
 * The buffers are flat [total numel] tensors of the parameters' dtype, each
 * parameter at ct_optim_param_offset(). All are borrowed and live: copy
 * saved values into them to restore a state. ct_optim_num_states() returns
 * a negative CT_E* code for a bad handle. Not thread-safe. */
CT_API int ct_optim_num_states(const ct_optim *opt);
/* The name and tensor of state i; either out pointer may be NULL. Errors:
 * CT_EINVAL for a bad handle or index. */
CT_API int ct_optim_state_at(const ct_optim *opt, int i, const char **name, ct_tensor **state);
/* The state named name (borrowed), or NULL with CT_EINVAL naming the states
 * this optimizer has. */
CT_API ct_tensor *ct_optim_state(const ct_optim *opt, const char *name);
/* One parameter's slice of the named state: a view with the parameter's
 * shape (0-d for "step"). Borrowed, made on first use. NULL with CT_EINVAL
 * for a bad name or index; CT_ENOMEM. */
CT_API ct_tensor *ct_optim_param_state(ct_optim *opt, const char *name, int index);

/* Hooks for a layer that shards parameters across ranks (ct_ddp's ZeRO
 * stages make an optimizer over this rank's shard and install them):
 * after_step runs after every successful step, and its error is the step's
 * (the shard is then updated but the other ranks' may not have arrived);
 * zero_grad, when set, replaces ct_optim_zero_grad's own zeroing. Either
 * may be NULL. free (may be NULL) releases ctx when the optimizer is freed
 * or the hooks are replaced. */
typedef struct ct_optim_hooks {
    int (*after_step)(void *ctx);
    int (*zero_grad)(void *ctx, bool set_to_none);
    void (*free)(void *ctx);
    void *ctx;
} ct_optim_hooks;

/* Installs hooks (copied; NULL removes them, freeing the old ctx). Errors:
 * CT_EINVAL for a bad handle. Not thread-safe. */
CT_API int ct_optim_set_hooks(ct_optim *opt, const ct_optim_hooks *hooks);

/* --------------------------------------------------------------- clipping */

/* torch.nn.utils.clip_grad_norm_: the 2-norm of all the gradients of
 * params[0..n-1] together (parameters without a gradient are skipped); when
 * max_norm / (total + 1e-6) < 1, every gradient is scaled by that factor in
 * place. *total_norm_out (may be NULL) receives the norm before clipping. A
 * non-finite total (a NaN or inf gradient) is not an error, as with
 * PyTorch's default error_if_nonfinite=False, but unlike PyTorch the
 * gradients are then left as they are instead of being multiplied by 0 or
 * NaN: check isfinite(*total_norm_out) to skip such a step. Deterministic:
 * the thread count does not change the result. Errors: CT_EINVAL for n < 0,
 * a NULL or dead tensor, or max_norm negative or NaN. Gradients are written
 * in place: not thread-safe for them. */
CT_API int ct_clip_grad_norm(ct_tensor *const *params, int n, double max_norm,
                             double *total_norm_out);
/* The same with norm_type p > 0, or INFINITY for the largest absolute
 * value. CT_EINVAL for other p. */
CT_API int ct_clip_grad_norm_p(ct_tensor *const *params, int n, double max_norm, double norm_type,
                               double *total_norm_out);

/* Clipping when the gradients are split across ranks (ct_ddp's ZeRO
 * shards, ct_ddp_clip_grad_norm): combine turns this rank's part of the
 * norm, *partial (the sum of |g|^p over params, or the largest |g| when max
 * is true: p = INFINITY), into the total over every rank in place, and
 * returns 0 or a CT_E* code, which the clipping returns. With combine NULL
 * this is ct_clip_grad_norm_p. */
typedef int (*ct_norm_combine)(void *ctx, double *partial, bool max);
CT_API int ct_clip_grad_norm_split(ct_tensor *const *params, int n, double max_norm,
                                   double norm_type, ct_norm_combine combine, void *ctx,
                                   double *total_norm_out);

/* ---------------------------------------------------------- lr schedules */

typedef enum ct_lr_schedule_kind {
    CT_LR_CONSTANT,    /* base_lr */
    CT_LR_STEP,        /* StepLR: base_lr * gamma^(step / step_size) */
    CT_LR_MULTISTEP,   /* MultiStepLR: base_lr * gamma^(milestones <= step) */
    CT_LR_EXPONENTIAL, /* ExponentialLR: base_lr * gamma^step */
    CT_LR_COSINE,      /* CosineAnnealingLR to eta_min at total_steps, then held there */
    CT_LR_ONECYCLE     /* OneCycleLR, two phases, cosine annealing */
} ct_lr_schedule_kind;

/* A learning rate as a function of the step. Unused fields are ignored, so
 * designated initialisers read well:
 *     (ct_lr_schedule){.kind = CT_LR_STEP, .base_lr = 0.1, .step_size = 30, .gamma = 0.1}
 * Linear warmup combines with any kind: for step < warmup_steps the rate
 * rises linearly from warmup_start_factor times the main schedule's first
 * rate to that rate, and the main schedule then runs counted from the end
 * of the warmup (PyTorch's SequentialLR of LinearLR and the main one). */
typedef struct ct_lr_schedule {
    ct_lr_schedule_kind kind;
    double base_lr;             /* >= 0; ONECYCLE: the peak, PyTorch's max_lr */
    int64_t warmup_steps;       /* >= 0; 0: no warmup */
    double warmup_start_factor; /* in [0, 1] */
    double gamma;               /* > 0: STEP, MULTISTEP, EXPONENTIAL */
    int64_t step_size;          /* > 0: STEP */
    const int64_t *milestones;  /* MULTISTEP: nondecreasing, borrowed for each call */
    int nmilestones;
    int64_t total_steps;     /* > 0: COSINE (PyTorch's T_max), ONECYCLE */
    double eta_min;          /* COSINE: the final rate */
    double pct_start;        /* ONECYCLE: in [0, 1], share of steps rising (PyTorch: 0.3) */
    double div_factor;       /* ONECYCLE: > 0, initial = base_lr / div_factor (PyTorch: 25) */
    double final_div_factor; /* ONECYCLE: > 0, final = initial / final_div_factor (1e4) */
} ct_lr_schedule;

/* 0 if s is a valid schedule, else CT_EINVAL naming the field, its value and
 * the valid range. Thread-safe. */
CT_API int ct_lr_schedule_check(const ct_lr_schedule *s);
/* The learning rate at step (0 for the first step). NAN with CT_EINVAL for
 * an invalid schedule or a negative step. ONECYCLE holds its final rate past
 * total_steps - 1, where PyTorch raises. Thread-safe. */
CT_API double ct_lr_schedule_at(const ct_lr_schedule *s, int64_t step);

#ifdef __cplusplus
}
#endif

#endif /* CT_OPTIM_H */
