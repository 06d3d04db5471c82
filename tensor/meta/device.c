/* The meta device's table (device_impl.h, ct/tensor.h's CT_META): storages
 * that count bytes and hold none, and kernels that do nothing, so that a
 * computation runs its front ends (checks, broadcasting, autograd's
 * records, every allocation) without touching memory. */
#include "cpu_impl.h"
#include "device_impl.h"

#include <stdatomic.h>

/* Every meta storage points here: a view's pointer arithmetic needs a real
 * base, and no kernel reads or writes through it. */
static _Alignas(64) char base[64];
static atomic_llong allocated, peak;

static void meta_free(void *data, void *ctx) {
    (void)data;
    atomic_fetch_sub(&allocated, (long long)(uintptr_t)ctx);
}

static ct_storage *meta_storage_new(const char *op, size_t nbytes, int index) {
    if (index != 0) {
        ct__err_set(CT_EDEVICE, "%s: meta:%d: no such device (the meta device is meta:0)", op,
                    index);
        return NULL;
    }
    long long now = atomic_fetch_add(&allocated, (long long)nbytes) + (long long)nbytes;
    for (long long was = atomic_load(&peak);
         now > was && !atomic_compare_exchange_weak(&peak, &was, now);)
        ;
    ct_storage *s =
        ct_storage_from_blob(base, nbytes, CT_DEVICE_META, meta_free, (void *)(uintptr_t)nbytes);
    if (!s)
        meta_free(base, (void *)(uintptr_t)nbytes);
    return s;
}

static int64_t meta_allocated(int index) {
    (void)index;
    return atomic_load(&allocated);
}

static int64_t meta_peak(int index) {
    (void)index;
    return atomic_load(&peak);
}

static void meta_reset_peak(int index) {
    (void)index;
    atomic_store(&peak, atomic_load(&allocated));
}

static int meta_synchronize(int index) {
    (void)index;
    return 0;
}

/* What a meta tensor holds, read on the host: zeros. */
static int meta_read(int index, void *dst, const void *src, size_t n) {
    (void)index;
    (void)src;
    memset(dst, 0, n);
    return 0;
}

/* One side of a copy is the meta device; the host's side, if it is the
 * destination, gets the zeros a meta tensor holds. */
static int meta_copy(ct_tensor *dst, ct_tensor *src) {
    (void)src;
    return ct__is_host(ct_tensor_device(dst)) ? ct__cpu_fill(dst, 0) : 0;
}

static int meta_fill(ct_tensor *t, double value) {
    (void)t;
    (void)value;
    return 0;
}

static int meta_unary(int op, ct_tensor *out, ct_tensor *src, const double p[2],
                      const int64_t ip[2]) {
    (void)op, (void)out, (void)src, (void)p, (void)ip;
    return 0;
}

static int meta_binary(int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double scalar,
                       ct_dtype dtype, int nd, const int64_t *shape) {
    (void)op, (void)dst, (void)x, (void)y, (void)scalar, (void)dtype, (void)nd, (void)shape;
    return 0;
}

static int meta_where(ct_tensor *out, ct_tensor *cond, ct_tensor *a, ct_tensor *b,
                      const uint64_t *a_bits, int nd, const int64_t *shape) {
    (void)out, (void)cond, (void)a, (void)b, (void)a_bits, (void)nd, (void)shape;
    return 0;
}

static int meta_reduce(const ct__reduction *r, ct_tensor *in, ct_tensor *out, ct_tensor *indices,
                       const bool *mask, bool keepdim) {
    (void)r, (void)in, (void)out, (void)indices, (void)mask, (void)keepdim;
    return 0;
}

static int meta_softmax(ct_tensor *out, ct_tensor *in, int dim, bool log) {
    (void)out, (void)in, (void)dim, (void)log;
    return 0;
}

static int meta_layer_norm(ct_tensor *y, ct_tensor *mean, ct_tensor *rstd, ct_tensor *x,
                           ct_tensor *w, ct_tensor *b, double eps) {
    (void)y, (void)mean, (void)rstd, (void)x, (void)w, (void)b, (void)eps;
    return 0;
}

static int meta_layer_norm_backward(ct_tensor *dx, ct_tensor *dw, ct_tensor *db, ct_tensor *dy,
                                    ct_tensor *x, ct_tensor *w, ct_tensor *mean, ct_tensor *rstd) {
    (void)dx, (void)dw, (void)db, (void)dy, (void)x, (void)w, (void)mean, (void)rstd;
    return 0;
}

static int meta_cross_entropy(ct_tensor *loss, ct_tensor *lse, ct_tensor *x, ct_tensor *t,
                              int64_t ignore, double smoothing) {
    (void)loss, (void)lse, (void)x, (void)t, (void)ignore, (void)smoothing;
    return 0;
}

static int meta_cross_entropy_backward(ct_tensor *grad, ct_tensor *x, ct_tensor *t, ct_tensor *lse,
                                       ct_tensor *scale, int64_t ignore, double smoothing) {
    (void)grad, (void)x, (void)t, (void)lse, (void)scale, (void)ignore, (void)smoothing;
    return 0;
}

static int meta_attention(const ct__attention *a) {
    (void)a;
    return 0;
}

static int meta_optim_step(const ct__optim_step *s, int index) {
    (void)s, (void)index;
    return 0;
}

/* Every index is 0: in range, and a shape taken from the largest is the
 * smallest it can be. */
static int meta_scan_index(ct_tensor *index, int64_t bound, bool *found, int64_t *bad,
                           int64_t *max) {
    (void)bound;
    *found = false;
    *bad = 0;
    *max = ct_numel(index) > 0 ? 0 : INT64_MIN;
    return 0;
}

static int meta_gather(ct_tensor *out, ct_tensor *t, int dim, ct_tensor *index) {
    (void)out, (void)t, (void)dim, (void)index;
    return 0;
}

static int meta_scatter_add(ct_tensor *self, int dim, ct_tensor *index, ct_tensor *src) {
    (void)self, (void)dim, (void)index, (void)src;
    return 0;
}

static int meta_one_hot(ct_tensor *out, ct_tensor *labels, int64_t classes) {
    (void)out, (void)labels, (void)classes;
    return 0;
}

static int meta_band(ct_tensor *out, ct_tensor *t, int64_t k, bool upper) {
    (void)out, (void)t, (void)k, (void)upper;
    return 0;
}

static int meta_matmul(const ct__mm_plan *p, int index) {
    (void)p, (void)index;
    return 0;
}

static int meta_draw(ct_tensor *out, const ct__draw *d) {
    (void)out, (void)d;
    return 0;
}

static int meta_scan_probabilities(ct_tensor *p, bool *found, double *bad) {
    (void)p;
    *found = false;
    *bad = 0;
    return 0;
}

const ct__device_ops ct__meta_device_ops = {
    .name = "meta",
    .storage_new = meta_storage_new,
    .memory_allocated = meta_allocated,
    .memory_peak = meta_peak,
    .memory_reset_peak = meta_reset_peak,
    .synchronize = meta_synchronize,
    .read = meta_read,
    .copy = meta_copy,
    .fill = meta_fill,
    .unary = meta_unary,
    .binary = meta_binary,
    .where = meta_where,
    .reduce = meta_reduce,
    .softmax = meta_softmax,
    .layer_norm = meta_layer_norm,
    .layer_norm_backward = meta_layer_norm_backward,
    .ln_half = true,
    .cross_entropy = meta_cross_entropy,
    .cross_entropy_backward = meta_cross_entropy_backward,
    .attention = meta_attention,
    .optim_step = meta_optim_step,
    .scan_index = meta_scan_index,
    .gather = meta_gather,
    .scatter_add = meta_scatter_add,
    .one_hot = meta_one_hot,
    .band = meta_band,
    .matmul = meta_matmul,
    .mm_half = true,
    .mm_limit = INT64_MAX,
    .draw = meta_draw,
    .scan_probabilities = meta_scan_probabilities,
};
