/* The launches of the indexing, selection and random kernels (index.cu)
 * from tensors (cuda_impl.h). */
#include "cuda_impl.h"

/* Makes t's device current and gives its index and compute stream. */
static int launch_on(const ct_tensor *t, int *device, void **stream) {
    *device = t->storage->device.index;
    return ct__cuda_launch_on(*device, stream);
}

/* Scans t on the device into *r and brings the answer back. */
static int scan(ct_tensor *t, int64_t bound, ct__cuda_scan *r) {
    *r = (ct__cuda_scan){.first = INT64_MAX, .max = INT64_MIN};
    ct__cuda_iter k;
    ct__cuda_iter_of(&k, &t, 1, t->ndim, t->sizes);
    if (k.numel == 0)
        return 0;
    int device;
    void *stream;
    int rc = launch_on(t, &device, &stream);
    ct_storage *s = rc ? NULL : ct__cuda_storage_new("index check", sizeof *r, device);
    if (!s)
        return rc ? rc : ct_errcode();
    rc = ct__cuda_launched(ct__cuda_launch_scan(&k, (int)t->dtype, bound, s->data, stream), device,
                           "the scan kernel");
    if (!rc)
        rc = ct__cuda_copy(device, r, s->data, sizeof *r, false, true);
    ct_storage_free(s);
    return rc;
}

int ct__cuda_scan_index(ct_tensor *index, int64_t bound, bool *found, int64_t *bad, int64_t *max) {
    ct__cuda_scan r;
    int rc = scan(index, bound, &r);
    *found = !rc && r.first != INT64_MAX;
    *bad = r.bad_int;
    *max = r.max;
    return rc;
}

int ct__cuda_scan_probabilities(ct_tensor *p, bool *found, double *bad) {
    ct__cuda_scan r;
    int rc = scan(p, -1, &r);
    *found = !rc && r.first != INT64_MAX;
    *bad = r.bad_float;
    return rc;
}

static int index_op(ct_tensor *const ops[3], int64_t jump, bool scatter) {
    const ct_tensor *index = ops[1];
    ct__cuda_iter k;
    ct__cuda_iter_of(&k, ops, 3, index->ndim, index->sizes);
    int device;
    void *stream;
    int rc = launch_on(index, &device, &stream);
    if (rc)
        return rc;
    if (scatter)
        return ct__cuda_launched(
            ct__cuda_launch_scatter_add(&k, (int)ops[2]->dtype, (int)index->dtype, jump, stream),
            device, "the scatter_add kernel");
    return ct__cuda_launched(
        ct__cuda_launch_gather(&k, (int)ct__esize(ops[0]->dtype), (int)index->dtype, jump, stream),
        device, "the gather kernel");
}

/* The kernels take the operands over index's shape, the one that walks
 * with the index first; the indexed one stays put along dim (stride 0) and
 * moves there by the index values, jump bytes each. */
static int dim_index_op(ct_tensor *walks, ct_tensor *index, ct_tensor *indexed, int dim,
                        bool scatter) {
    int64_t strides[CT_MAX_DIMS];
    memcpy(strides, indexed->strides, sizeof strides);
    int64_t jump = strides[dim] * (int64_t)ct__esize(indexed->dtype);
    strides[dim] = 0;
    ct_tensor w = ct__layout_view(walks, index->ndim, index->sizes, walks->strides, walks->offset);
    ct_tensor x = ct__layout_view(indexed, index->ndim, index->sizes, strides, indexed->offset);
    return index_op((ct_tensor *const[]){&w, index, &x}, jump, scatter);
}

int ct__cuda_gather(ct_tensor *out, ct_tensor *t, int dim, ct_tensor *index) {
    return dim_index_op(out, index, t, dim, false);
}

int ct__cuda_scatter_add(ct_tensor *self, int dim, ct_tensor *index, ct_tensor *src) {
    return dim_index_op(src, index, self, dim, true);
}

int ct__cuda_one_hot(ct_tensor *out, ct_tensor *labels, int64_t classes) {
    /* Every element is written, each seeing its row's label: the labels
     * viewed at out's shape, stride 0 along the classes. */
    int64_t strides[CT_MAX_DIMS];
    memcpy(strides, labels->strides, sizeof strides);
    strides[labels->ndim] = 0;
    ct_tensor along = ct__layout_view(labels, out->ndim, out->sizes, strides, labels->offset);
    labels = &along;
    ct__cuda_iter k;
    ct__cuda_iter_of(&k, (ct_tensor *[]){out, labels}, 2, out->ndim, out->sizes);
    int device;
    void *stream;
    int rc = launch_on(out, &device, &stream);
    return rc ? rc
              : ct__cuda_launched(ct__cuda_launch_one_hot(&k, (int)labels->dtype, classes, stream),
                                  device, "the one_hot kernel");
}

int ct__cuda_band(ct_tensor *out, ct_tensor *t, int64_t k, bool upper) {
    ct__cuda_iter it;
    ct__cuda_iter_of(&it, (ct_tensor *[]){out, t}, 2, out->ndim, out->sizes);
    int device;
    void *stream;
    int rc = launch_on(out, &device, &stream);
    return rc ? rc
              : ct__cuda_launched(ct__cuda_launch_band(&it, (int)ct__esize(out->dtype),
                                                       out->sizes[out->ndim - 2],
                                                       out->sizes[out->ndim - 1], k, upper, stream),
                                  device, upper ? "the triu kernel" : "the tril kernel");
}

/* where has four operands, one more than the kernels' iterator holds: the
 * CPU's iterator orders and merges the dims of all four, and the fourth
 * rides beside the other three at the same dims. */
int ct__cuda_where(ct_tensor *out, ct_tensor *cond, ct_tensor *a, ct_tensor *b,
                   const uint64_t *a_bits, int nd, const int64_t *shape) {
    ct__iter it;
    ct__iter_init(&it, (ct_tensor *[]){out, cond, a ? a : out, b}, 4, nd, shape);
    ct__cuda_iter k = {.ndim = it.ndim, .numel = it.numel};
    ct__cuda_operand fourth = {.data = it.data[3]};
    for (int j = 0; j < 3; j++)
        k.data[j] = it.data[j];
    for (int d = 0; d < it.ndim; d++) {
        k.shape[d] = it.shape[d];
        for (int j = 0; j < 3; j++)
            k.strides[d][j] = it.strides[d][j];
        fourth.strides[d] = it.strides[d][3];
    }
    int device;
    void *stream;
    int rc = launch_on(out, &device, &stream);
    return rc ? rc
              : ct__cuda_launched(ct__cuda_launch_where(&k, &fourth, (int)ct__esize(out->dtype),
                                                        a ? NULL : a_bits, stream),
                                  device, a ? "the where kernel" : "the masked_fill kernel");
}

int ct__cuda_draw(ct_tensor *out, const ct__draw *d) {
    int device;
    void *stream;
    int rc = launch_on(out, &device, &stream);
    return rc ? rc
              : ct__cuda_launched(ct__cuda_launch_draw(d, stream), device, "the random kernel");
}
