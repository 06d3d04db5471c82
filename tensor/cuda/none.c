/* The CUDA device layer of a build without CUDA: no device, ever. */
#include "cuda_impl.h"

static int none(int device) {
    return ct__seterr(CT_EDEVICE,
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

int ct__cuda_devmem(int device, ct__devmem *mem) {
    (void)mem;
    return none(device);
}

int ct__cuda_copy(int device, void *dst, const void *src, size_t n, bool to_device,
                  bool from_device) {
    (void)dst;
    (void)src;
    (void)n;
    (void)to_device;
    (void)from_device;
    return none(device);
}

int ct__cuda_sync(int device) { return none(device); }

int ct__cuda_copy_tensor(ct_tensor *dst, ct_tensor *src) {
    (void)src;
    return none(dst->storage->device.index);
}

int ct__cuda_binary(int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double scalar,
                    ct_dtype dtype, int nd, const int64_t *shape) {
    (void)op;
    (void)x;
    (void)y;
    (void)scalar;
    (void)dtype;
    (void)nd;
    (void)shape;
    return none(dst->storage->device.index);
}

int ct__cuda_unary(int op, ct_tensor *out, ct_tensor *src, const double p[2], const int64_t ip[2]) {
    (void)op;
    (void)src;
    (void)p;
    (void)ip;
    return none(out->storage->device.index);
}
