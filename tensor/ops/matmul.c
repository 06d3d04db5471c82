/* ct_matmul: numpy.matmul, the front end. It checks and broadcasts the
 * operands and plans the product (a ct__mm_plan, device_impl.h) that the
 * device's matmul entry runs: tensor/cpu/matmul.c on ct's GEMM and
 * OpenBLAS, tensor/cuda/matmul.c on cuBLAS.
 *
 * An operand reaches the GEMM without a copy whenever one of its matrix
 * dims has unit stride (and its leading dim is within the device's
 * mm_limit); a transposed weight becomes a transpose flag. Other layouts,
 * and dtypes the device's GEMM lacks, are first copied into contiguous
 * scratch of the compute dtype: float32 (16-bit floats too, unless the
 * device multiplies them itself, mm_half: cuBLAS accumulates them in
 * float32), float64, or int64 for integers, which use a plain loop. */
#include "device_impl.h"

_Static_assert(CT__OPS_MAX_DIMS == CT_MAX_DIMS, "a plan's batch holds every batch dim");

/* Can BLAS read a rows x cols matrix with strides (rs, cs) in place? The
 * stride of a size-1 dim never matters. */
static void blas_form(ct__mm_mat *x, int64_t rows, int64_t cols, int64_t limit) {
    int64_t min_rs = cols > 1 ? cols : 1, min_cs = rows > 1 ? rows : 1;
    int64_t ld_plain = rows > 1 ? x->rs : min_rs, ld_trans = cols > 1 ? x->cs : min_cs;
    bool plain = (cols <= 1 || x->cs == 1) && ld_plain >= min_rs && ld_plain <= limit;
    bool trans = (rows <= 1 || x->rs == 1) && ld_trans >= min_cs && ld_trans <= limit;
    x->blas = plain || trans;
    x->trans = !plain && trans;
    x->ld = plain ? ld_plain : trans ? ld_trans : 0;
}

/* Describes t as the left (a) or right (b) operand of p; a 1-D left operand
 * is a row, a 1-D right operand a column. */
static void mm_describe(const ct__mm_plan *p, ct__mm_mat *x, const ct_tensor *t, bool left) {
    int nd = t->ndim, tbatch = nd > 2 ? nd - 2 : 0;
    x->data = ct__data(t);
    if (nd == 1) {
        x->rs = left ? 0 : t->strides[0];
        x->cs = left ? t->strides[0] : 0;
    } else {
        x->rs = t->strides[nd - 2];
        x->cs = t->strides[nd - 1];
    }
    for (int d = 0; d < p->nbatch; d++) {
        int td = d - (p->nbatch - tbatch);
        x->bstrides[d] = td < 0 || t->sizes[td] == 1 ? 0 : t->strides[td];
    }
    if (left)
        blas_form(x, p->m, p->k, p->limit);
    else
        blas_form(x, p->k, p->n, p->limit);
}

/* A contiguous tensor header over new storage on device that the caller
 * owns. Matmul's temporaries are built this way so that they never reach a
 * scope or the autograd recorder. */
static int scratch_new(ct_tensor *t, ct_storage **s, int ndim, const int64_t *sizes, ct_dtype dtype,
                       ct_device device) {
    *s = ct_storage_new((size_t)ct__tensor_numel(ndim, sizes) * ct_dtype_size(dtype), device);
    if (!*s)
        return ct_errcode();
    *t = (ct_tensor){.magic = CT__TENSOR_MAGIC, .storage = *s, .ndim = ndim, .dtype = dtype};
    memcpy(t->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
    ct__tensor_contiguous_strides(ndim, sizes, t->strides);
    return 0;
}

/* Points x at t, through a contiguous copy in the compute dtype (on t's
 * device) when t's dtype differs or BLAS cannot read its layout. */
static int mm_operand(const ct__mm_plan *p, ct__mm_mat *x, ct_tensor *t, bool left,
                      ct_storage **s) {
    mm_describe(p, x, t, left);
    if (t->dtype == (ct_dtype)p->dtype && (x->blas || p->dtype == CT_INT64))
        return 0;
    ct_tensor tmp;
    if (scratch_new(&tmp, s, t->ndim, t->sizes, (ct_dtype)p->dtype, t->storage->device) ||
        ct__tensor_copy_any(&tmp, t))
        return ct_errcode();
    mm_describe(p, x, &tmp, left);
    return 0;
}

/* When b is shared by every batch and a's batches are evenly spaced rows,
 * the whole batch is one taller GEMM: fewer, larger BLAS calls. */
static void mm_fold_batch(ct__mm_plan *p) {
    if (!p->a.blas || p->a.trans || p->nb * p->m > p->limit)
        return;
    int64_t expect = p->m * p->a.ld;
    for (int d = p->nbatch - 1; d >= 0; d--) {
        if (p->batch[d] == 1)
            continue;
        if (p->b.bstrides[d] != 0 || p->a.bstrides[d] != expect)
            return;
        expect *= p->batch[d];
    }
    p->m *= p->nb;
    p->nb = 1;
    p->nbatch = 0;
    p->a.rs = p->a.ld;
}

/* The dtype a device computes dtype's products in: the 16-bit floats in
 * float32 unless it multiplies them itself. */
static ct_dtype compute_dtype(ct_dtype dtype, bool half) {
    switch (dtype) {
    case CT_FLOAT64: return CT_FLOAT64;
    case CT_INT64:
    case CT_INT32:
    case CT_UINT8: return CT_INT64;
    case CT_BFLOAT16:
    case CT_FLOAT16: return half ? dtype : CT_FLOAT32;
    default: return CT_FLOAT32;
    }
}

/* Fails with "matmul: [a's shape] @ [b's shape]: <what>". Shapes are only
 * formatted here, off the path of a successful call. */
static int mm_fail(int code, const ct_tensor *a, const ct_tensor *b, const char *what) {
    char sa[CT__SHAPE_STR], sb[CT__SHAPE_STR];
    return ct__err_set(code, "matmul: %s @ %s: %s", ct__tensor_shape_str(sa, a->ndim, a->sizes),
                       ct__tensor_shape_str(sb, b->ndim, b->sizes), what);
}

/* Checks shapes and fills p's sizes and the output shape. */
static int mm_shapes(ct__mm_plan *p, const ct_tensor *a, const ct_tensor *b,
                     const ct__device_ops *dev, int *ndim, int64_t *sizes) {
    char what[CT__SHAPE_STR * 3];
    if (a->ndim == 0 || b->ndim == 0)
        return mm_fail(CT_EINVAL, a, b,
                       "both operands need at least 1 dim; use ct_mul to multiply by a 0-d tensor");
    ct_dtype dtype = ct_promote_types(a->dtype, b->dtype);
    if (dtype == CT_BOOL)
        return mm_fail(CT_EDTYPE, a, b,
                       "bool operands are not supported; convert them to an integer or float "
                       "dtype first");
    int64_t k = a->sizes[a->ndim - 1], kb = b->sizes[b->ndim > 1 ? b->ndim - 2 : 0];
    if (k != kb) {
        snprintf(what, sizeof what, "inner sizes differ (%lld vs %lld)", (long long)k,
                 (long long)kb);
        return mm_fail(CT_ESHAPE, a, b, what);
    }
    int na = a->ndim > 2 ? a->ndim - 2 : 0, nb = b->ndim > 2 ? b->ndim - 2 : 0;
    if (ct__tensor_broadcast_shapes("batch dims", na, a->sizes, nb, b->sizes, &p->nbatch,
                                    p->batch)) {
        snprintf(what, sizeof what, "%s", ct_errmsg());
        return mm_fail(CT_ESHAPE, a, b, what);
    }
    p->dtype = compute_dtype(dtype, dev->mm_half);
    p->limit = dev->mm_limit;
    p->nb = ct__tensor_numel(p->nbatch, p->batch);
    p->m = a->ndim > 1 ? a->sizes[a->ndim - 2] : 1;
    p->n = b->ndim > 1 ? b->sizes[b->ndim - 1] : 1;
    p->k = k;
    if (p->dtype != CT_INT64 && (p->m > p->limit || p->n > p->limit || k > p->limit)) {
        snprintf(what, sizeof what, "a matrix dim exceeds the %s matmul's limit of %lld", dev->name,
                 (long long)p->limit);
        return mm_fail(CT_ENOTSUP, a, b, what);
    }
    memcpy(sizes, p->batch, sizeof(int64_t) * (size_t)p->nbatch);
    *ndim = p->nbatch;
    if (a->ndim > 1)
        sizes[(*ndim)++] = p->m;
    if (b->ndim > 1)
        sizes[(*ndim)++] = p->n;
    return 0;
}

ct_tensor *ct_matmul(ct_tensor *a, ct_tensor *b) {
    if (CT__CHECK_ANY("matmul", a, b) ||
        ct__tensor_check_same_device("matmul", (ct_tensor *[]){a, b}, 2))
        return NULL;
    ct_device device = a->storage->device;
    const ct__device_ops *dev = CT__DEVICE_GET("matmul", device, matmul);
    ct__mm_plan p;
    int ndim = 0;
    int64_t sizes[CT_MAX_DIMS];
    if (!dev || mm_shapes(&p, a, b, dev, &ndim, sizes))
        return NULL;
    ct_dtype dtype = ct_promote_types(a->dtype, b->dtype);
    bool work = p.nb > 0 && p.m > 0 && p.n > 0 && p.k > 0;
    /* Scratch is made before the output so that a failure leaves nothing in
     * the caller's scope. */
    ct_storage *scratch[3] = {NULL, NULL, NULL};
    ct_tensor cbuf;
    ct_tensor *out = NULL;
    if (work && (mm_operand(&p, &p.a, a, true, &scratch[0]) ||
                 mm_operand(&p, &p.b, b, false, &scratch[1]) ||
                 (dtype != (ct_dtype)p.dtype &&
                  scratch_new(&cbuf, &scratch[2], ndim, sizes, (ct_dtype)p.dtype, device))))
        goto done;
    out = ct__tensor_new_on("matmul", ndim, sizes, dtype, device);
    if (!out)
        goto done;
    int rc = 0;
    if (!work) {
        /* k == 0 sums nothing: zeros. */
        rc = ct__tensor_fill_any(out, 0);
    } else {
        p.c = scratch[2] ? ct__data(&cbuf) : ct__data(out);
        mm_fold_batch(&p);
        rc = dev->matmul(&p, device.index);
        if (!rc && scratch[2])
            rc = ct__tensor_copy_any(out, &cbuf);
    }
    if (rc) {
        ct__tensor_release(out);
        out = NULL;
    }
done:
    for (int i = 0; i < 3; i++)
        ct_storage_free(scratch[i]);
    return out ? ct__tensor_record1(CT_OP_MATMUL, out, (ct_tensor *[]){a, b}, 2, NULL) : NULL;
}
