/* A CUDA device's dispatch table (device_impl.h): the kernels of
 * tensor/cuda/ and the memory of its caching allocator. Built with CUDA
 * only; a build without it has no CUDA table. */
#include "cuda_impl.h"
#include "device_impl.h"

#include <ct/cuda.h>

static int64_t cuda_allocated(int index) {
    ct_cuda_memory_stats s;
    return ct_cuda_memory_stats_get(index, &s) ? 0 : s.allocated;
}

static int64_t cuda_peak(int index) {
    ct_cuda_memory_stats s;
    return ct_cuda_memory_stats_get(index, &s) ? 0 : s.peak_allocated;
}

static void cuda_reset_peak(int index) { (void)ct_cuda_reset_peak_memory(index); }

static void cuda_set_default(int index) { ct__cuda_set_default_device(index); }

static int cuda_read(int index, void *dst, const void *src, size_t n) {
    return ct__cuda_copy(index, dst, src, n, false, true);
}

const ct__device_ops ct__cuda_device_ops = {
    .name = "cuda",
    .storage_new = ct__cuda_storage_new,
    .memory_allocated = cuda_allocated,
    .memory_peak = cuda_peak,
    .memory_reset_peak = cuda_reset_peak,
    .synchronize = ct__cuda_sync,
    .read = cuda_read,
    .count = ct_cuda_device_count,
    .current = ct_cuda_current_device,
    .use = ct_cuda_set_device,
    .set_default = cuda_set_default,
    .stream = ct__cuda_stream,
    .record_stream = ct__cuda_record_stream,
    .to = ct__cuda_to,
    .copy = ct__cuda_copy_tensor,
    .fill = ct__cuda_fill,
    .unary = ct__cuda_unary,
    .binary = ct__cuda_binary,
    .where = ct__cuda_where,
    .reduce = ct__cuda_reduce,
    .softmax = ct__cuda_softmax,
    .layer_norm = ct__cuda_layer_norm,
    .layer_norm_backward = ct__cuda_layer_norm_backward,
    .ln_half = true,
    .cross_entropy = ct__cuda_cross_entropy,
    .cross_entropy_backward = ct__cuda_cross_entropy_backward,
    .optim_step = ct__cuda_optim_step,
    .scan_index = ct__cuda_scan_index,
    .gather = ct__cuda_gather,
    .scatter_add = ct__cuda_scatter_add,
    .one_hot = ct__cuda_one_hot,
    .band = ct__cuda_band,
    .matmul = ct__cuda_matmul,
    .mm_half = true,
    .mm_limit = INT32_MAX, /* cuBLAS's dims and leading dims are ints */
    .draw = ct__cuda_draw,
    .scan_probabilities = ct__cuda_scan_probabilities,
};
