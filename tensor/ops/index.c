/* Joining and indexing: cat, stack, index_select, gather, scatter_add,
 * one_hot, tril, triu: the front ends. They check, allocate and record; the
 * device's entries move the elements (device_impl.h: tensor/cpu/index.c,
 * tensor/cuda/index.c).
 *
 * Pieces of a tensor (a narrow, a select, a restrided operand) are
 * described by views that live on the stack: the iterators read only a
 * tensor's layout, so they need no reference, no allocation and no scope
 * entry.
 *
 * Index values are checked before any element moves, on every device: an
 * index out of range is CT_ERANGE, never a stray write. On a device the
 * check is a scan kernel whose answer the host waits for, so that the error
 * is returned by the op that caused it, as on the CPU. */
#include "device_impl.h"

/* ------------------------------------------------------- stack views */

/* Gather and scatter treat a 0-d tensor as one element along dim 0, as
 * PyTorch does. */
static ct_tensor at_least_1d(const ct_tensor *t) {
    if (t->ndim > 0)
        return ct__layout_view(t, t->ndim, t->sizes, t->strides, t->offset);
    return ct__layout_view(t, 1, (int64_t[]){1}, (int64_t[]){1}, t->offset);
}

/* Live inputs, all on one device. */
static int check_inputs(const char *op, ct_tensor *const *ts, int n) {
    int rc = ct__tensor_check_handles(op, ts, n);
    return rc ? rc : ct__tensor_check_same_device(op, ts, n);
}

static ct_op_args ints_args(int n, const int64_t *v) {
    ct_op_args a = {.nints = n};
    memcpy(a.ints, v, sizeof(int64_t) * (size_t)n);
    return a;
}

/* ------------------------------------------------------- cat and stack */

static int check_list(const char *op, ct_tensor *const *ts, int n) {
    if (!ts || n < 1)
        return ct__err_set(CT_EINVAL, "%s: expected a non-empty list of tensors, got %d", op,
                           ts ? n : 0);
    return check_inputs(op, ts, n);
}

static ct_dtype promote_all(ct_tensor *const *ts, int n) {
    ct_dtype dtype = ts[0]->dtype;
    for (int i = 1; i < n; i++)
        dtype = ct_promote_types(dtype, ts[i]->dtype);
    return dtype;
}

/* PyTorch still accepts 1-D empty tensors in any cat, whatever the others'
 * shape, for code that starts from torch.tensor([]). */
static bool cat_skips(const ct_tensor *t) { return t->ndim == 1 && t->sizes[0] == 0; }

ct_tensor *ct_cat(ct_tensor *const *ts, int n, int dim) {
    if (check_list("cat", ts, n))
        return NULL;
    char a[CT__DESC_STR], b[CT__DESC_STR];
    int r = 0; /* the tensor whose shape the others must match */
    for (int i = 0; i < n; i++) {
        if (ts[i]->ndim == 0) {
            ct__err_set(CT_ESHAPE,
                        "cat: tensor %d is zero-dimensional (%s) and cannot be concatenated; "
                        "unsqueeze it first",
                        i, ct__tensor_desc(a, ts[i]));
            return NULL;
        }
        if (cat_skips(ts[r]))
            r = i;
    }
    const ct_tensor *ref = ts[r];
    int d = ct__tensor_wrap_dim("cat", dim, ref->ndim);
    if (d < 0)
        return NULL;
    int64_t sizes[CT_MAX_DIMS];
    memcpy(sizes, ref->sizes, sizeof sizes);
    sizes[d] = 0;
    for (int i = 0; i < n; i++) {
        const ct_tensor *t = ts[i];
        if (cat_skips(t))
            continue;
        bool same = t->ndim == ref->ndim;
        for (int k = 0; same && k < t->ndim; k++)
            same = k == d || t->sizes[k] == ref->sizes[k];
        if (!same) {
            ct__err_set(CT_ESHAPE,
                        "cat: tensor %d is %s but tensor %d is %s; sizes must match except in "
                        "dim %d",
                        r, ct__tensor_desc(a, ref), i, ct__tensor_desc(b, t), d);
            return NULL;
        }
        sizes[d] += t->sizes[d];
    }
    ct_tensor *out =
        ct__tensor_new_on("cat", ref->ndim, sizes, promote_all(ts, n), ref->storage->device);
    if (!out)
        return NULL;
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (cat_skips(ts[i]))
            continue;
        ct_tensor part = ct__tensor_narrow_view(out, d, at, ts[i]->sizes[d]);
        if (ct__tensor_copy_any(&part, ts[i])) {
            ct__tensor_release(out);
            return NULL;
        }
        at += ts[i]->sizes[d];
    }
    ct_op_args args = ints_args(1, (int64_t[]){d});
    return ct__tensor_record1(CT_OP_CAT, out, ts, n, &args);
}

ct_tensor *ct_stack(ct_tensor *const *ts, int n, int dim) {
    if (check_list("stack", ts, n))
        return NULL;
    const ct_tensor *ref = ts[0];
    char a[CT__DESC_STR], b[CT__DESC_STR];
    if (ref->ndim == CT_MAX_DIMS) {
        ct__err_set(CT_EINVAL, "stack: %s already has the maximum of %d dims",
                    ct__tensor_desc(a, ref), CT_MAX_DIMS);
        return NULL;
    }
    int d = ct__tensor_wrap_dim("stack", dim, ref->ndim + 1);
    if (d < 0)
        return NULL;
    for (int i = 1; i < n; i++) {
        bool same = ts[i]->ndim == ref->ndim;
        for (int k = 0; same && k < ref->ndim; k++)
            same = ts[i]->sizes[k] == ref->sizes[k];
        if (!same) {
            ct__err_set(CT_ESHAPE, "stack: tensor 0 is %s but tensor %d is %s; all must match",
                        ct__tensor_desc(a, ref), i, ct__tensor_desc(b, ts[i]));
            return NULL;
        }
    }
    int64_t sizes[CT_MAX_DIMS];
    for (int i = 0, j = 0; i <= ref->ndim; i++)
        sizes[i] = i == d ? n : ref->sizes[j++];
    ct_tensor *out =
        ct__tensor_new_on("stack", ref->ndim + 1, sizes, promote_all(ts, n), ref->storage->device);
    if (!out)
        return NULL;
    for (int i = 0; i < n; i++) {
        ct_tensor part = ct__tensor_select_view(out, d, i);
        if (ct__tensor_copy_any(&part, ts[i])) {
            ct__tensor_release(out);
            return NULL;
        }
    }
    ct_op_args args = ints_args(1, (int64_t[]){d});
    return ct__tensor_record1(CT_OP_STACK, out, ts, n, &args);
}

/* --------------------------------------------------------- index values */

static int check_index_dtype(const char *op, const char *what, const ct_tensor *index,
                             bool allow_uint8) {
    if (index->dtype == CT_INT64 || index->dtype == CT_INT32 ||
        (allow_uint8 && index->dtype == CT_UINT8))
        return 0;
    char desc[CT__DESC_STR];
    return ct__err_set(CT_EDTYPE, "%s: %s must be int64 or int32%s, got %s", op, what,
                       allow_uint8 ? " or uint8" : "", ct__tensor_desc(desc, index));
}

/* What the device's scan of index values found: the first value outside
 * [0, bound) in iteration order (bound < 0: only negatives count), and the
 * largest value. */
typedef struct index_scan {
    bool found;
    int64_t bad, max;
} index_scan;

static int scan_index(ct_tensor *index, int64_t bound, index_scan *s) {
    *s = (index_scan){false, 0, INT64_MIN};
    const ct__device_ops *dev = CT__DEVICE_GET("index", index->storage->device, scan_index);
    return dev ? dev->scan_index(index, bound, &s->found, &s->bad, &s->max) : ct_errcode();
}

static int check_index_range(const char *op, ct_tensor *index, const ct_tensor *t, int dim) {
    int64_t size = t->ndim ? t->sizes[dim] : 1;
    index_scan s;
    int rc = scan_index(index, size, &s);
    if (rc || !s.found)
        return rc;
    char desc[CT__DESC_STR];
    return ct__err_set(CT_ERANGE,
                       "%s: index %lld is out of range for dim %d of size %lld (input %s); "
                       "expected [0, %lld)",
                       op, (long long)s.bad, dim, (long long)size, ct__tensor_desc(desc, t),
                       (long long)size);
}

/* ------------------------------------------- gather and scatter kernels */

/* The kernels of the operands' device (device_impl.h). */
static int gather_into(ct_tensor *out, ct_tensor *t, int dim, ct_tensor *index) {
    const ct__device_ops *dev = CT__DEVICE_GET("gather", out->storage->device, gather);
    return dev ? dev->gather(out, t, dim, index) : ct_errcode();
}

static int scatter_add_into(ct_tensor *self, int dim, ct_tensor *index, ct_tensor *src) {
    const ct__device_ops *dev = CT__DEVICE_GET("scatter_add", self->storage->device, scatter_add);
    return dev ? dev->scatter_add(self, dim, index, src) : ct_errcode();
}

/* -------------------------------------------------------- index ops */

ct_tensor *ct_index_select(ct_tensor *t, int dim, ct_tensor *index) {
    if (check_inputs("index_select", (ct_tensor *[]){t, index}, 2))
        return NULL;
    int d = ct__tensor_wrap_dim("index_select", dim, t->ndim);
    if (d < 0 || check_index_dtype("index_select", "index", index, false))
        return NULL;
    char a[CT__DESC_STR], b[CT__DESC_STR];
    int64_t nidx = ct_numel(index);
    if (index->ndim > 1 || (t->ndim == 0 && nidx != 1)) {
        ct__err_set(CT_ESHAPE,
                    "index_select: index %s must be 1-D (or a single value for the 0-d input "
                    "%s)",
                    ct__tensor_desc(a, index), ct__tensor_desc(b, t));
        return NULL;
    }
    if (check_index_range("index_select", index, t, d))
        return NULL;
    int64_t sizes[CT_MAX_DIMS];
    memcpy(sizes, t->sizes, sizeof sizes);
    if (t->ndim > 0)
        sizes[d] = nidx;
    ct_tensor *out =
        ct__tensor_new_on("index_select", t->ndim, sizes, t->dtype, t->storage->device);
    if (!out)
        return NULL;
    /* index_select is a gather whose index is the 1-D index broadcast over
     * every other dim of the output. */
    ct_tensor t1 = at_least_1d(t), out1 = at_least_1d(out);
    int64_t idx_strides[CT_MAX_DIMS] = {0};
    idx_strides[d] = index->ndim ? index->strides[0] : 0;
    ct_tensor idx = ct__layout_view(index, out1.ndim, out1.sizes, idx_strides, index->offset);
    if (gather_into(&out1, &t1, d, &idx)) {
        ct__tensor_release(out);
        return NULL;
    }
    ct_op_args args = ints_args(1, (int64_t[]){d});
    return ct__tensor_record1(CT_OP_INDEX_SELECT, out, (ct_tensor *const[]){t, index}, 2, &args);
}

/* index must not be larger than each other operand outside dim (src: in
 * every dim). */
static int check_index_fits(const char *op, const ct_tensor *index, const ct_tensor *t, int dim,
                            const char *what) {
    char a[CT__DESC_STR], b[CT__DESC_STR];
    int ni = index->ndim ? index->ndim : 1, nt = t->ndim ? t->ndim : 1;
    if (ni != nt)
        return ct__err_set(CT_ESHAPE, "%s: index %s and %s %s must have the same number of dims",
                           op, ct__tensor_desc(a, index), what, ct__tensor_desc(b, t));
    for (int k = 0; k < index->ndim; k++)
        if (k != dim && index->sizes[k] > t->sizes[k])
            return ct__err_set(CT_ESHAPE,
                               "%s: index %s is larger than %s %s in dim %d (%lld vs %lld)", op,
                               ct__tensor_desc(a, index), what, ct__tensor_desc(b, t), k,
                               (long long)index->sizes[k], (long long)t->sizes[k]);
    return 0;
}

ct_tensor *ct_gather(ct_tensor *t, int dim, ct_tensor *index) {
    if (check_inputs("gather", (ct_tensor *[]){t, index}, 2))
        return NULL;
    int d = ct__tensor_wrap_dim("gather", dim, t->ndim);
    if (d < 0 || check_index_dtype("gather", "index", index, false) ||
        check_index_fits("gather", index, t, d, "input") ||
        check_index_range("gather", index, t, d))
        return NULL;
    ct_tensor *out =
        ct__tensor_new_on("gather", index->ndim, index->sizes, t->dtype, t->storage->device);
    if (!out)
        return NULL;
    ct_tensor out1 = at_least_1d(out), t1 = at_least_1d(t), idx1 = at_least_1d(index);
    if (gather_into(&out1, &t1, d, &idx1)) {
        ct__tensor_release(out);
        return NULL;
    }
    ct_op_args args = ints_args(1, (int64_t[]){d});
    return ct__tensor_record1(CT_OP_GATHER, out, (ct_tensor *const[]){t, index}, 2, &args);
}

/* Validates a scatter and wraps dim into *d. */
static int check_scatter(const char *op, ct_tensor *t, int dim, ct_tensor *index, ct_tensor *src,
                         int *d) {
    if (check_inputs(op, (ct_tensor *[]){t, index, src}, 3))
        return ct_errcode();
    *d = ct__tensor_wrap_dim(op, dim, t->ndim);
    if (*d < 0)
        return CT_EINVAL;
    char a[CT__DESC_STR], b[CT__DESC_STR];
    if (src->dtype != t->dtype)
        return ct__err_set(CT_EDTYPE, "%s: src %s and self %s must have the same dtype", op,
                           ct__tensor_desc(a, src), ct__tensor_desc(b, t));
    int rc = check_index_dtype(op, "index", index, false);
    if (!rc)
        rc = check_index_fits(op, index, t, *d, "self");
    if (!rc)
        rc = check_index_fits(op, index, src, -1, "src");
    if (!rc)
        rc = check_index_range(op, index, t, *d);
    return rc;
}

/* Adds src into out (t itself, or a copy of it) and records the op. */
static ct_tensor *scatter_add(ct_tensor *out, ct_tensor *t, int d, ct_tensor *index,
                              ct_tensor *src) {
    ct_tensor self1 = at_least_1d(out), idx1 = at_least_1d(index), src1 = at_least_1d(src);
    if (scatter_add_into(&self1, d, &idx1, &src1)) {
        if (out != t)
            ct__tensor_release(out);
        return NULL;
    }
    ct_op_args args = ints_args(1, (int64_t[]){d});
    return ct__tensor_record(CT_OP_SCATTER_ADD, (ct_tensor *const[]){t, index, src}, 3, &out, 1,
                             out == t, &args);
}

ct_tensor *ct_scatter_add(ct_tensor *t, int dim, ct_tensor *index, ct_tensor *src) {
    int d;
    if (check_scatter("scatter_add", t, dim, index, src, &d))
        return NULL;
    ct_tensor *out =
        ct__tensor_new_on("scatter_add", t->ndim, t->sizes, t->dtype, t->storage->device);
    if (!out)
        return NULL;
    if (ct__tensor_copy_any(out, t)) {
        ct__tensor_release(out);
        return NULL;
    }
    return scatter_add(out, t, d, index, src);
}

ct_tensor *ct_scatter_add_(ct_tensor *t, int dim, ct_tensor *index, ct_tensor *src) {
    int d;
    if (check_scatter("scatter_add_", t, dim, index, src, &d) ||
        ct__tensor_check_inplace(CT_OP_SCATTER_ADD, "scatter_add_", t,
                                 (ct_tensor *const[]){index, src}, 2))
        return NULL;
    return scatter_add(t, t, d, index, src);
}

/* ------------------------------------------------------------- one_hot */

static int one_hot_into(ct_tensor *out, ct_tensor *labels, int64_t classes) {
    const ct__device_ops *dev = CT__DEVICE_GET("one_hot", labels->storage->device, one_hot);
    return dev ? dev->one_hot(out, labels, classes) : ct_errcode();
}

ct_tensor *ct_one_hot(ct_tensor *labels, int64_t num_classes) {
    if (check_inputs("one_hot", &labels, 1) || check_index_dtype("one_hot", "labels", labels, true))
        return NULL;
    char desc[CT__DESC_STR];
    if (labels->ndim == CT_MAX_DIMS) {
        ct__err_set(CT_EINVAL, "one_hot: labels %s already have the maximum of %d dims",
                    ct__tensor_desc(desc, labels), CT_MAX_DIMS);
        return NULL;
    }
    index_scan s;
    if (scan_index(labels, num_classes, &s))
        return NULL;
    if (s.found) {
        if (s.bad < 0)
            ct__err_set(CT_ERANGE, "one_hot: label %lld in %s is negative", (long long)s.bad,
                        ct__tensor_desc(desc, labels));
        else
            ct__err_set(CT_ERANGE, "one_hot: label %lld in %s is out of range for %lld classes",
                        (long long)s.bad, ct__tensor_desc(desc, labels), (long long)num_classes);
        return NULL;
    }
    if (num_classes < 0) {
        if (ct_numel(labels) == 0) {
            ct__err_set(CT_EINVAL,
                        "one_hot: cannot infer the number of classes from the empty labels %s; "
                        "pass num_classes",
                        ct__tensor_desc(desc, labels));
            return NULL;
        }
        num_classes = s.max + 1;
    }
    int64_t sizes[CT_MAX_DIMS];
    memcpy(sizes, labels->sizes, sizeof(int64_t) * (size_t)labels->ndim);
    sizes[labels->ndim] = num_classes;
    ct_tensor *out =
        ct__tensor_new_on("one_hot", labels->ndim + 1, sizes, CT_INT64, labels->storage->device);
    if (!out)
        return NULL;
    if (one_hot_into(out, labels, num_classes)) {
        ct__tensor_release(out);
        return NULL;
    }
    ct_op_args args = ints_args(1, (int64_t[]){num_classes});
    return ct__tensor_record1(CT_OP_ONE_HOT, out, &labels, 1, &args);
}

/* -------------------------------------------------------- tril and triu */

static int band_into(ct_tensor *out, ct_tensor *t, int64_t k, bool upper) {
    const ct__device_ops *dev = CT__DEVICE_GET(upper ? "triu" : "tril", t->storage->device, band);
    return dev ? dev->band(out, t, k, upper) : ct_errcode();
}

static ct_tensor *band(const char *op, ct_op opcode, ct_tensor *t, int64_t k, bool upper) {
    if (check_inputs(op, &t, 1))
        return NULL;
    if (t->ndim < 2) {
        char desc[CT__DESC_STR];
        ct__err_set(CT_ESHAPE, "%s: input %s must have at least 2 dims", op,
                    ct__tensor_desc(desc, t));
        return NULL;
    }
    ct_tensor *out = ct__tensor_new_on(op, t->ndim, t->sizes, t->dtype, t->storage->device);
    if (!out)
        return NULL;
    if (band_into(out, t, k, upper)) {
        ct__tensor_release(out);
        return NULL;
    }
    ct_op_args args = ints_args(1, (int64_t[]){k});
    return ct__tensor_record1(opcode, out, &t, 1, &args);
}

ct_tensor *ct_tril(ct_tensor *t, int64_t k) { return band("tril", CT_OP_TRIL, t, k, false); }
ct_tensor *ct_triu(ct_tensor *t, int64_t k) { return band("triu", CT_OP_TRIU, t, k, true); }
