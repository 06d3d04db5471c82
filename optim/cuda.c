/* The optimizers' update on a CUDA device (built with CUDA only). */
#include "cuda_impl.h"
#include "optim_impl.h"

int ct__optim_update_cuda(const ct__optim_hyper *h, ct_dtype dtype, char *p, const char *g,
                          char *const *bufs, int64_t n, int device) {
    void *stream;
    int rc = ct__cuda_launch_on(device, &stream);
    int adam = h->kind == CT_OPTIM_SGD ? 0 : h->kind == CT_OPTIM_ADAM ? 1 : 2;
    return rc ? rc
              : ct__cuda_launched(
                    ct__optim_launch(h, adam, dtype == CT_FLOAT64, p, g, bufs, n, stream), device,
                    "the optimizer's update kernel");
}
