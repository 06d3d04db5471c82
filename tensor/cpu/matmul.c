/* The CPU's matmul entry (device_impl.h): a ct__mm_plan, which
 * tensor/ops/matmul.c makes, on single-threaded GEMMs: ct's own for thin
 * float32 products (ct__cpu_sgemm, tensor/cpu/gemm.c), OpenBLAS for the
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
 * The integer loop sums in a fixed order under any split. */
#include "cpu_impl.h"

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

/* At load time, before any thread of ct's exists: OpenBLAS's own threads
 * would otherwise compete with ct's pool, and spin while idle. */
__attribute__((constructor)) static void blas_single_thread(void) { openblas_set_num_threads(1); }

/* How the CPU splits one plan across the pool. */
typedef struct mm_job {
    const ct__mm_plan *p;
    bool split_cols;
    int64_t parts; /* per matrix */
} mm_job;

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
