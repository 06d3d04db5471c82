/* The optimizers' update on a CUDA device (the table's optim_step,
 * device_impl.h): one launch per segment, queued in order on the device's
 * compute stream. Built with CUDA only. */
#include "cuda_impl.h"

int ct__cuda_optim_step(const ct__optim_step *st, int device) {
    void *stream;
    int rc = ct__cuda_launch_on(device, &stream);
    size_t es = ct_dtype_size(st->dtype);
    for (int k = 0; k < st->nsegs && !rc; k++) {
        const ct__optim_segment *s = &st->segs[k];
        char *bufs[CT__OPTIM_MAX_BUFS];
        for (int j = 0; j < CT__OPTIM_MAX_BUFS; j++)
            bufs[j] = st->bufs[j] ? st->bufs[j] + (size_t)s->offset * es : NULL;
        /* The kinds are the launch's 0 SGD, 1 Adam, 2 AdamW. */
        rc = ct__cuda_launched(ct__cuda_launch_optim(&s->h, s->h.kind, st->dtype == CT_FLOAT64,
                                                     s->p, s->g, bufs, s->n, stream),
                               device, "the optimizer's update kernel");
    }
    return rc;
}
