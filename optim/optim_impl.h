/* ct optim internal header: not installed, not part of the API. */
#ifndef CT_OPTIM_IMPL_H
#define CT_OPTIM_IMPL_H

#include <ct/optim.h>

#include "tensor_impl.h"

/* Everything one fused update needs besides the pointers: the group's
 * hyperparameters with the step's bias corrections already folded in, so
 * that the kernels do no per-call arithmetic beyond casting to their type. */
typedef struct ct__optim_hyper {
    ct_optim_kind kind;
    double lr;           /* the group's rate: the optimizer's lr times lr_scale */
    double weight_decay; /* L2 term added to the gradient (SGD, Adam) */
    /* SGD */
    double momentum, dampening;
    bool nesterov;
    bool first; /* the momentum buffer starts as the gradient, as PyTorch's None buffer */
    /* Adam, AdamW */
    double beta1, beta2, eps;
    double step_size; /* lr / (1 - beta1^step) */
    double bc2_sqrt;  /* sqrt(1 - beta2^step) */
    double decay;     /* AdamW's 1 - lr * weight_decay */
    bool amsgrad;
} ct__optim_hyper;

/* The most flat state buffers a kind uses (Adam with amsgrad: exp_avg,
 * exp_avg_sq, max_exp_avg_sq). */
#define CT__OPTIM_MAX_BUFS 3

/* Applies one update to n elements of dtype (float32 or float64): p, g and
 * the kind's buffers (bufs[CT__OPTIM_MAX_BUFS], unused ones NULL) point at
 * element 0 of contiguous runs. A pure
 * elementwise pass, so any split of a range gives the same bits. */
void ct__optim_update(const ct__optim_hyper *h, ct_dtype dtype, char *p, const char *g,
                      char *const *bufs, int64_t n);

/* ct__check_inputs's checks with the tensor named by its role in messages
 * ("param 3 (group 1)"); a NULL tensor keeps the error that made it NULL.
 * Returns 0 or a CT_E* code. */
int ct__optim_check_tensor(const ct_tensor *t, const char *fn, const char *role);

#endif
