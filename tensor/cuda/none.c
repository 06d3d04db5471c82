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

int ct__cuda_copy_tensor(ct_tensor *dst, ct_tensor *src) { return NONE_ON(dst); }

int ct__cuda_binary(int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double scalar,
                    ct_dtype dtype, int nd, const int64_t *shape) {
    return NONE_ON(dst);
}

int ct__cuda_unary(int op, ct_tensor *out, ct_tensor *src, const double p[2], const int64_t ip[2]) {
    return NONE_ON(out);
}

int ct__cuda_fill(ct_tensor *t, double value) { return NONE_ON(t); }

/* reductions, softmax, cross-entropy, layer norm */

/* indexing, where, concatenation, factories, random */

/* matmul */
