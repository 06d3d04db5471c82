/* The CUDA device layer of a build without CUDA: no device, ever. A CUDA
 * tensor cannot exist here, so the device ops below are reached only by
 * mistake; each says that this ct has no CUDA. The ops themselves have
 * no stubs: a build without CUDA has no CUDA table (device_impl.h). */
#include "cuda_impl.h"

/* Every stub ignores its arguments but the device. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

static int none(int device) {
    return ct__err_set(CT_EDEVICE,
                       "cuda:%d: this ct was built without CUDA (configure with "
                       "-DCT_CUDA=ON where the CUDA Toolkit is installed)",
                       device);
}

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
