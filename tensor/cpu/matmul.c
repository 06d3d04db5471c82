/* ct_matmul: numpy.matmul on top of single-threaded GEMMs: ct's own for
 * thin float32 products (ct__cpu_sgemm, tensor/cpu/gemm.c), OpenBLAS for the
 * rest and for float64.
 *
 * ct parallelises on its own pool, so OpenBLAS is held to one thread and ct
 * splits each product across the pool: whole matrices of a batch, then parts
 * of one matrix. Results must not depend on the thread count, and splitting
 * the output alone does not guarantee that: an OpenBLAS micro-kernel may sum
 * a tile's k-products in an order that depends on where the tile starts
 * within the call (ct's own sums in one order under any row split). Two
 * splits are known to be safe:
 *  - rows cut at multiples of MM_ROW_ALIGN, which keeps every register tile
 *    where the unsplit call puts it (row parts follow the thread count);
 *  - fixed column blocks of MM_COL_BLOCK, used for short, wide products at
 *    every thread count alike (column tiles depend on the call's width).
 * The integer loop sums in a fixed order under any split.
 *
 * An operand reaches BLAS without a copy whenever one of its matrix dims has
 * unit stride; a transposed weight becomes a transpose flag. Other layouts,
 * and dtypes BLAS lacks, are first copied into contiguous scratch of the
 * compute dtype: float32 (16-bit floats too), float64, or int64 for integers,
 * which use a plain loop.
 *
 * CUDA tensors take the same plan to the device (tensor/cuda/matmul.c):
 * cuBLAS, which computes float16 and bfloat16 itself (accumulating in
 * float32), so only integers are converted, to int64 for a kernel. */
#include "cpu_impl.h"
#include "tensor_impl.h"

#include <cblas.h>

/* OpenBLAS hands its kernels groups of 3 register tiles of GEMM_UNROLL_N rows
 * of a row-major C (6 with AVX-512): 12 rows for float32 on Haswell and Zen,
 * 24 on AVX-512. A cut at a multiple of 24 keeps every group where the unsplit
 * call has it; test_matmul checks this on the machine at hand. */
#define MM_ROW_ALIGN 24
/* Wide enough that re-packing the short left operand per block costs little. */
#define MM_COL_BLOCK 512
/* Below this many rows, row parts cannot feed 8 threads: split columns. */
#define MM_COL_SPLIT_ROWS (8 * MM_ROW_ALIGN)
/* Multiply-adds that pay for handing a part to another thread. */
#define MM_GRAIN_MACS (1.0 * (1 << 20))
#define MM_BLAS_MAX   CT__CPU_MM_LIMIT

/* At load time, before any thread of ct's exists: OpenBLAS's own threads
 * would otherwise compete with ct's pool, and spin while idle. */
__attribute__((constructor)) static void blas_single_thread(void) { openblas_set_num_threads(1); }

_Static_assert(CT__OPS_MAX_DIMS == CT_MAX_DIMS, "a plan's batch holds every batch dim");

/* How the CPU splits one plan across the pool. */
typedef struct mm_job {
    const ct__mm_plan *p;
    bool split_cols;
    int64_t parts; /* per matrix */
} mm_job;

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

/* Wrapping integer matmul over any strides; unsigned arithmetic makes
 * overflow wrap, as it does in PyTorch, instead of being undefined. */
static void gemm_int64(const ct__mm_plan *p, const int64_t *a, const int64_t *b, int64_t *c,
                       int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            uint64_t acc = 0;
            for (int64_t q = 0; q < p->k; q++)
                acc +=
                    (uint64_t)a[i * p->a.rs + q * p->a.cs] * (uint64_t)b[q * p->b.rs + j * p->b.cs];
            c[i * p->n + j] = (int64_t)acc;
        }
}

/* Output rows [r0, r1) x columns [c0, c1) of one batch. */
static void mm_block(const ct__mm_plan *p, int64_t batch, int64_t r0, int64_t r1, int64_t c0,
                     int64_t c1) {
    int64_t ao = r0 * p->a.rs, bo = c0 * p->b.cs, rem = batch;
    for (int d = p->nbatch - 1; d >= 0; d--) {
        int64_t i = rem % p->batch[d];
        rem /= p->batch[d];
        ao += i * p->a.bstrides[d];
        bo += i * p->b.bstrides[d];
    }
    int64_t es = (int64_t)ct_dtype_size(p->dtype);
    const void *a = p->a.data + ao * es, *b = p->b.data + bo * es;
    void *c = p->c + ((batch * p->m + r0) * p->n + c0) * es;
    if (p->dtype == CT_INT64) {
        gemm_int64(p, a, b, c, r1 - r0, c1 - c0);
        return;
    }
    CBLAS_TRANSPOSE ta = p->a.trans ? CblasTrans : CblasNoTrans;
    CBLAS_TRANSPOSE tb = p->b.trans ? CblasTrans : CblasNoTrans;
    blasint m = (blasint)(r1 - r0), n = (blasint)(c1 - c0), k = (blasint)p->k;
    blasint lda = (blasint)p->a.ld, ldb = (blasint)p->b.ld, ldc = (blasint)p->n;
    if (p->dtype == CT_FLOAT32)
        ct__cpu_sgemm(p->a.trans, p->b.trans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}

/* Where part i of a matrix starts along the split dim. */
static int64_t mm_part_start(const mm_job *j, int64_t i) {
    const ct__mm_plan *p = j->p;
    if (j->split_cols)
        return i * MM_COL_BLOCK < p->n ? i * MM_COL_BLOCK : p->n;
    if (i == j->parts)
        return p->m;
    return (i * p->m / j->parts + MM_ROW_ALIGN / 2) / MM_ROW_ALIGN * MM_ROW_ALIGN;
}

/* Units [lo, hi) of the flattened (batch, part) range. */
static void mm_chunk(void *ctx, int64_t lo, int64_t hi) {
    const mm_job *j = ctx;
    for (int64_t u = lo; u < hi; u++) {
        int64_t batch = u / j->parts, part = u % j->parts;
        int64_t s0 = mm_part_start(j, part), s1 = mm_part_start(j, part + 1);
        if (j->split_cols)
            mm_block(j->p, batch, 0, j->p->m, s0, s1);
        else
            mm_block(j->p, batch, s0, s1, 0, j->p->n);
    }
}

static void mm_run(const ct__mm_plan *p) {
    double macs = (double)p->m * (double)p->n * (double)p->k;
    mm_job j = {.p = p, .split_cols = p->m < MM_COL_SPLIT_ROWS && p->n >= 2 * MM_COL_BLOCK};
    if (j.split_cols) {
        j.parts = (p->n + MM_COL_BLOCK - 1) / MM_COL_BLOCK;
    } else {
        /* Enough parts for the threads that whole matrices leave idle. */
        int64_t threads = ct_in_parallel_region() ? 1 : ct_get_num_threads();
        int64_t parts = (threads + p->nb - 1) / p->nb;
        if (parts > p->m / MM_ROW_ALIGN)
            parts = p->m / MM_ROW_ALIGN;
        if (parts > macs / MM_GRAIN_MACS)
            parts = (int64_t)(macs / MM_GRAIN_MACS);
        j.parts = parts > 1 ? parts : 1;
    }
    double unit_macs = macs / (double)j.parts;
    int64_t grain = unit_macs >= MM_GRAIN_MACS ? 1 : (int64_t)(MM_GRAIN_MACS / unit_macs) + 1;
    ct_parallel_for(0, p->nb * j.parts, grain, mm_chunk, &j);
}

int ct__cpu_matmul(const ct__mm_plan *p, int index) {
    (void)index;
    mm_run(p);
    return 0;
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
