/* ct's CUDA kernels, as C sees them: internal, not installed. The kernels
 * are C++ (kernels.cu); this header is plain C on both sides, so it holds
 * only plain data.
 *
 * Errors: each launch returns 0 or a cudaError_t value (non-zero), which
 * the caller turns into a ct error. Threads: any; a launch is queued on the
 * stream given. */
#ifndef CT_CUDA_KERNELS_H
#define CT_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT__CUDA_MAX_DIMS 8

/* ct's element iterator (tensor_impl.h), for two operands: the coalesced
 * shape, dim 0 innermost, and each operand's byte strides. */
typedef struct ct__cuda_iter2 {
    int ndim;
    int64_t numel;
    int64_t shape[CT__CUDA_MAX_DIMS];
    int64_t strides[CT__CUDA_MAX_DIMS][2];
    char *data[2];
} ct__cuda_iter2;

/* dst = src, converted from src_dtype to dst_dtype (ct_dtype values). */
int ct__cuda_launch_copy(const ct__cuda_iter2 *it, int dst_dtype, int src_dtype, void *stream);

#ifdef __cplusplus
}
#endif

#endif
