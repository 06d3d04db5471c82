/* The CUDA device layer of a build without CUDA: no device, ever. A CUDA
 * tensor cannot exist here, so the device ops below are reached only by
 * mistake; each says that this ct has no CUDA. */
#include "cuda_impl.h"

/* Every stub ignores its arguments but the device. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

static int none(int device) {
    return ct__seterr(CT_EDEVICE,
                      "cuda:%d: this ct was built without CUDA (configure with "
                      "-DCT_CUDA=ON where the CUDA Toolkit is installed)",
                      device);
}

#define NONE_ON(t) none((t)->storage->device.index)

int ct__cuda_count(const char **why) {
    if (why)
        *why = "this ct was built without CUDA";
    return 0;
}

int ct__cuda_use(int device) { return none(device); }

int ct__cuda_stream(int device, void **stream) {
    *stream = NULL;
    return none(device);
}

int ct__cuda_devmem(int device, ct__devmem *mem) { return none(device); }

int ct__cuda_copy(int device, void *dst, const void *src, size_t n, bool to_device,
                  bool from_device) {
    return none(device);
}

int ct__cuda_sync(int device) { return none(device); }

/* reductions, softmax, cross-entropy, layer norm */

int ct__cuda_cross_entropy(ct_tensor *loss, ct_tensor *lse, ct_tensor *x, ct_tensor *t,
                           int64_t ignore, double smoothing) {
    return NONE_ON(x);
}

int ct__cuda_cross_entropy_backward(ct_tensor *grad, ct_tensor *x, ct_tensor *t, ct_tensor *lse,
                                    ct_tensor *scale, int64_t ignore, double smoothing) {
    return NONE_ON(x);
}

int ct__cuda_layer_norm(ct_tensor *y, ct_tensor *mean, ct_tensor *rstd, ct_tensor *x, ct_tensor *w,
                        ct_tensor *b, double eps) {
    return NONE_ON(x);
}

int ct__cuda_layer_norm_backward(ct_tensor *dx, ct_tensor *dw, ct_tensor *db, ct_tensor *dy,
                                 ct_tensor *x, ct_tensor *w, ct_tensor *mean, ct_tensor *rstd) {
    return NONE_ON(x);
}

/* indexing, where, concatenation, factories, random */

/* matmul, pinned host memory */

int ct__cuda_host_alloc(size_t nbytes, void **ptr) {
    *ptr = NULL;
    return none(0);
}

void ct__cuda_host_free(void *ptr) {}

int ct__cuda_copy_async(int device, void *dst, const void *src, size_t n, bool to_device,
                        bool from_device) {
    return none(device);
}
