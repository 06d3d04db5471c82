/* Factories: tensors made from a value, a sequence or the caller's data. */
#include "cpu_impl.h"
#include "device_impl.h"

#include <math.h>

static ct_tensor *record_factory(ct_tensor *t) {
    return ct__tensor_record1(CT_OP_EMPTY, t, NULL, 0, NULL);
}

/* A new tensor on device, filled with value when fill is set. */
static ct_tensor *make_on(const char *op, int ndim, const int64_t *sizes, bool fill, double value,
                          ct_dtype dtype, ct_device device) {
    const ct__device_ops *dev = CT__DEVICE_GET(op, device, fill);
    ct_tensor *t = dev ? ct__tensor_new_on(op, ndim, sizes, dtype, device) : NULL;
    if (!t || !fill)
        return t ? record_factory(t) : NULL;
    if (dev->fill(t, value)) {
        ct__tensor_release(t);
        return NULL;
    }
    return record_factory(t);
}

static ct_tensor *full(const char *op, int ndim, const int64_t *sizes, double value,
                       ct_dtype dtype) {
    return make_on(op, ndim, sizes, true, value, dtype, CT_DEVICE_CPU);
}

ct_tensor *ct_empty_on(int ndim, const int64_t *sizes, ct_dtype dtype, ct_device device) {
    return make_on("empty_on", ndim, sizes, false, 0, dtype, device);
}

ct_tensor *ct_full_on(int ndim, const int64_t *sizes, double value, ct_dtype dtype,
                      ct_device device) {
    return make_on("full_on", ndim, sizes, true, value, dtype, device);
}

static ct_tensor *like(const char *op, const ct_tensor *t, bool fill, double value) {
    if (ct__tensor_check_handles(op, (ct_tensor *const *)&t, 1))
        return NULL;
    return make_on(op, t->ndim, t->sizes, fill, value, t->dtype, t->storage->device);
}

ct_tensor *ct_empty_like(const ct_tensor *t) { return like("empty_like", t, false, 0); }
ct_tensor *ct_zeros_like(const ct_tensor *t) { return like("zeros_like", t, true, 0); }
ct_tensor *ct_full_like(const ct_tensor *t, double value) {
    return like("full_like", t, true, value);
}

ct_tensor *ct_zeros(int ndim, const int64_t *sizes, ct_dtype dtype) {
    return full("zeros", ndim, sizes, 0.0, dtype);
}

ct_tensor *ct_ones(int ndim, const int64_t *sizes, ct_dtype dtype) {
    return full("ones", ndim, sizes, 1.0, dtype);
}

ct_tensor *ct_full(int ndim, const int64_t *sizes, double value, ct_dtype dtype) {
    return full("full", ndim, sizes, value, dtype);
}

ct_tensor *ct_scalar(double value, ct_dtype dtype) { return full("scalar", 0, NULL, value, dtype); }

ct_tensor *ct_from_data(const void *data, int ndim, const int64_t *sizes, ct_dtype dtype) {
    /* Checked before allocating: NULL data is fine only for an empty shape. */
    bool empty = false;
    for (int i = 0; !data && sizes && i < ndim && i < CT_MAX_DIMS; i++)
        empty |= sizes[i] == 0;
    if (!data && !empty && ndim >= 0 && ndim <= CT_MAX_DIMS && (ndim == 0 || sizes)) {
        char buf[CT__SHAPE_STR];
        ct__err_set(CT_EINVAL, "from_data: data is NULL for a %s%s tensor", ct_dtype_name(dtype),
                    ct__tensor_shape_str(buf, ndim, sizes));
        return NULL;
    }
    ct_tensor *t = ct__tensor_new("from_data", ndim, sizes, dtype);
    if (!t)
        return NULL;
    size_t nbytes = (size_t)ct_numel(t) * ct_dtype_size(dtype);
    if (nbytes > 0)
        memcpy(ct__data(t), data, nbytes);
    return record_factory(t);
}

ct_tensor *ct_eye(int64_t n, int64_t m, ct_dtype dtype) {
    if (m < 0)
        m = n;
    ct_tensor *t = ct__tensor_new("eye", 2, (int64_t[]){n, m}, dtype);
    if (!t)
        return NULL;
    ct__cpu_fill(t, 0.0);
    size_t esize = ct_dtype_size(dtype);
    char *data = ct__data(t);
    for (int64_t i = 0; i < n && i < m; i++)
        ct__tensor_store_double(dtype, data + (i * m + i) * (int64_t)esize, 1.0);
    return record_factory(t);
}

/* Element i is start + i * step, or, with from_both_ends, end - (n - 1 - i) *
 * step for the upper half, so that both endpoints are exact. */
typedef struct seq_job {
    char *data;
    ct_dtype dtype;
    double start, end, step;
    int64_t n;
    bool from_both_ends;
} seq_job;

static void seq_chunk(void *arg, int64_t lo, int64_t hi) {
    const seq_job *j = arg;
    int64_t esize = (int64_t)ct_dtype_size(j->dtype);
    for (int64_t i = lo; i < hi; i++) {
        double v = j->from_both_ends && i >= j->n / 2 ? j->end - (double)(j->n - 1 - i) * j->step
                                                      : j->start + (double)i * j->step;
        ct__tensor_store_double(j->dtype, j->data + i * esize, v);
    }
}

static ct_tensor *sequence(const char *op, seq_job *j) {
    ct_tensor *t = ct__tensor_new(op, 1, &j->n, j->dtype);
    if (!t)
        return NULL;
    j->data = ct__data(t);
    ct_parallel_for(0, j->n, CT__GRAIN_ELEMENTWISE, seq_chunk, j);
    return record_factory(t);
}

/* Sizes beyond this cannot be allocated anyway, and the conversion from
 * double stays defined. */
#define MAX_SEQUENCE 0x1p62

ct_tensor *ct_arange(double start, double end, double step, ct_dtype dtype) {
    if (!isfinite(start) || !isfinite(end) || !isfinite(step) || step == 0) {
        ct__err_set(CT_EINVAL,
                    "arange: start %g, end %g and step %g must be finite, and step nonzero", start,
                    end, step);
        return NULL;
    }
    if ((step > 0 && end < start) || (step < 0 && end > start)) {
        ct__err_set(CT_EINVAL, "arange: step %g has the wrong sign to go from %g to %g", step,
                    start, end);
        return NULL;
    }
    double n = ceil((end - start) / step);
    if (!(n < MAX_SEQUENCE)) {
        ct__err_set(CT_EINVAL, "arange: [%g, %g) in steps of %g has too many elements", start, end,
                    step);
        return NULL;
    }
    seq_job j = {.dtype = dtype, .start = start, .end = end, .step = step, .n = (int64_t)n};
    return sequence("arange", &j);
}

ct_tensor *ct_linspace(double start, double end, int64_t steps, ct_dtype dtype) {
    if (steps < 0 || !isfinite(start) || !isfinite(end)) {
        ct__err_set(CT_EINVAL,
                    "linspace: %lld steps from %g to %g; expected steps >= 0 and finite ends",
                    (long long)steps, start, end);
        return NULL;
    }
    seq_job j = {.dtype = dtype,
                 .start = start,
                 .end = end,
                 .step = steps > 1 ? (end - start) / (double)(steps - 1) : 0.0,
                 .n = steps,
                 .from_both_ends = steps > 1};
    return sequence("linspace", &j);
}
