/* The optimizers of a build without CUDA: device parameters cannot exist,
 * so this is reached only by mistake. */
#include "optim_impl.h"

int ct__optim_update_cuda(const ct__optim_hyper *h, ct_dtype dtype, char *p, const char *g,
                          char *const *bufs, int64_t n, int device) {
    (void)h;
    (void)dtype;
    (void)p;
    (void)g;
    (void)bufs;
    (void)n;
    return ct__seterr(CT_EDEVICE, "optim_step: cuda:%d: this ct was built without CUDA", device);
}
