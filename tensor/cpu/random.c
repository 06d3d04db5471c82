/* Random draws on the CPU: the table's draw and scan_probabilities
 * entries (device_impl.h) for the front ends in tensor/ops/random.c; the
 * blocks of a draw run in parallel, each from its own Philox counters. */
#include "cpu_impl.h"
#include "philox.h"

/* Philox blocks per parallel chunk; each costs about as much as a few dozen
 * elementwise operations. */
#define GRAIN_BLOCKS 2048

/* The draw's description (ct__draw) is the device kernel's too. */
static void draw_blocks(void *arg, int64_t lo, int64_t hi) {
    const ct__draw *d = arg;
    ct_dtype dtype = (ct_dtype)d->dtype;
    int64_t esize = (int64_t)ct_dtype_size(dtype);
    for (int64_t b = lo; b < hi; b++) {
        double u[4];
        ct__philox_draw(d->seed, d->offset, (uint64_t)b, d->per_block, d->bits,
                        d->kind == CT__DRAW_NORMAL, u);
        int64_t first = b * d->per_block;
        for (int j = 0; j < d->per_block && first + j < d->n; j++) {
            char *p = d->out + (first + j) * esize;
            double x;
            if (d->kind == CT__DRAW_BERNOULLI)
                x = u[j] < (d->p_in_out ? ct__tensor_load_double(dtype, p) : d->a);
            else
                /* An fma, as on a device: both round alike, whatever the
                 * compiler would contract. */
                x = fma(d->b, u[j], d->a);
            ct__tensor_store_double(dtype, p, x);
        }
    }
}

/* Reserves the blocks for n elements and fills out (contiguous) on its
 * device. */
int ct__cpu_draw(ct_tensor *out, const ct__draw *d) {
    (void)out;
    int64_t nblocks = (d->n + d->per_block - 1) / d->per_block;
    ct__draw copy = *d;
    ct_parallel_for(0, nblocks, GRAIN_BLOCKS, draw_blocks, &copy);
    return 0;
}

/* The first probability outside [0, 1], in iteration order. */
typedef struct p_scan {
    ct_dtype dtype;
    bool found;
    double bad;
} p_scan;

static void p_scan_loop(void *ctx, char **data, const int64_t *strides, int64_t n) {
    p_scan *s = ctx;
    for (int64_t i = 0; i < n && !s->found; i++) {
        double p = ct__tensor_load_double(s->dtype, data[0] + i * strides[0]);
        if (!(p >= 0 && p <= 1)) {
            s->found = true;
            s->bad = p;
        }
    }
}

/* On one thread, or on the device in the same order, so that the message
 * names the same value every run. */
int ct__cpu_scan_probabilities(ct_tensor *p, bool *found, double *bad) {
    p_scan s = {p->dtype, false, 0.0};
    ct__iter it;
    ct__iter_init(&it, &p, 1, p->ndim, p->sizes);
    if (it.numel > 0)
        ct__iter_run_range(&it, p_scan_loop, &s, 0, it.numel);
    *found = s.found;
    *bad = s.bad;
    return 0;
}
