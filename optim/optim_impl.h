/* ct optim internal header: not installed, not part of the API. */
#ifndef CT_OPTIM_IMPL_H
#define CT_OPTIM_IMPL_H

#include <ct/optim.h>

#include "rules.h"
#include "tensor_impl.h"

/* The most flat state buffers a kind uses (Adam with amsgrad: exp_avg,
 * exp_avg_sq, max_exp_avg_sq). */
#define CT__OPTIM_MAX_BUFS 3

/* Applies one update to n elements of dtype (float32 or float64): p, g and
 * the kind's buffers (bufs[CT__OPTIM_MAX_BUFS], unused ones NULL) point at
 * element 0 of contiguous runs. A pure
 * elementwise pass, so any split of a range gives the same bits. */
void ct__optim_update(const ct__optim_hyper *h, ct_dtype dtype, char *p, const char *g,
                      char *const *bufs, int64_t n);
/* The same on CUDA device memory, queued on the device's compute stream
 * (cuda.c; none.c in builds without CUDA). Returns 0 or a CT_E* code. */
int ct__optim_update_cuda(const ct__optim_hyper *h, ct_dtype dtype, char *p, const char *g,
                          char *const *bufs, int64_t n, int device);

/* ct__check_inputs's checks with the tensor named by its role in messages
 * ("param 3 (group 1)"); a NULL tensor keeps the error that made it NULL.
 * Returns 0 or a CT_E* code. */
int ct__optim_check_tensor(const ct_tensor *t, const char *fn, const char *role);

#endif
