/* The optimizers' update rules for one element, shared by the CPU loops
 * (cpu/optim.c) and the CUDA kernel (cuda/optim.cu), so that both compute the
 * same operations in the same order: PyTorch's _single_tensor_sgd, _adam
 * and _adamw, in the parameter's type T. Both files are built without
 * contraction into fused multiply-adds, so a step on the device gives the
 * CPU's bits. Internal; plain C that nvcc also compiles.
 *
 * The flags (wd, mode, nesterov, decoupled, amsgrad) are constant within a
 * loop, so each use compiles to a branch-free body. */
#ifndef CT_OPTIM_RULES_H
#define CT_OPTIM_RULES_H

#include <stdbool.h>
#include <stdint.h>

/* The most flat state buffers a kind uses (Adam with amsgrad: exp_avg,
 * exp_avg_sq, max_exp_avg_sq). */
#define CT__OPTIM_MAX_BUFS 3

/* Everything one fused update needs besides the pointers: the group's
 * hyperparameters with the step's bias corrections already folded in, so
 * that the kernels do no per-call arithmetic beyond casting to their type. */
/* The kinds, as ct/optim.h's ct_optim_kind numbers them (optim_impl.h
 * checks), for the kernels below optim/. */
enum { CT__OPTIM_SGD, CT__OPTIM_ADAM, CT__OPTIM_ADAMW };

typedef struct ct__optim_hyper {
    int kind;            /* CT__OPTIM_* */
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

/* NaN wins either way, as torch.maximum. */
#define CT__MAX_NAN(a, b) ((a) >= (b) || (a) != (a) ? (a) : (b))

/* SGD: x the parameter, d the gradient, b the momentum buffer, updated in
 * place. mode: 0 no momentum, 1 first step (the buffer becomes d), 2 later
 * steps. */
#define CT__SGD_RULE(T, x, d, b, lr, decay, mom, damp, wd, mode, nesterov)                         \
    do {                                                                                           \
        if (wd)                                                                                    \
            (d) = (d) + (decay) * (x);                                                             \
        if ((mode) != 0) {                                                                         \
            T nb_ = (mode) == 1 ? (d) : (mom) * (b) + (damp) * (d);                                \
            (b) = nb_;                                                                             \
            (d) = (nesterov) ? (d) + (mom)*nb_ : nb_;                                              \
        }                                                                                          \
        (x) = (x) - (lr) * (d);                                                                    \
    } while (0)

/* Adam and AdamW: m, v and vmax the moment buffers, updated in place.
 * decoupled: AdamW's x *= 1 - lr * wd (decay); wd: Adam's L2 term. */
#define CT__ADAM_RULE(T, SQRT, x, d, m, v, vmax, b1, c1, b2, c2, eps, decay, l2, bc2, step,        \
                      decoupled, wd, amsgrad)                                                      \
    do {                                                                                           \
        if (decoupled)                                                                             \
            (x) = (x) * (decay);                                                                   \
        if (wd)                                                                                    \
            (d) = (d) + (l2) * (x);                                                                \
        (m) = (b1) * (m) + (c1) * (d);                                                             \
        (v) = (b2) * (v) + (c2) * ((d) * (d));                                                     \
        T vi_ = (v);                                                                               \
        if (amsgrad) {                                                                             \
            vi_ = CT__MAX_NAN((vmax), vi_);                                                        \
            (vmax) = vi_;                                                                          \
        }                                                                                          \
        T denom_ = SQRT(vi_) / (bc2) + (eps);                                                      \
        (x) = (x) - (step) * ((m) / denom_);                                                       \
    } while (0)

#endif
