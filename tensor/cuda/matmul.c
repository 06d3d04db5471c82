/* matmul on a CUDA device (cuda_impl.h): cuBLAS for the float dtypes, a
 * tiled kernel (matmul_int.cu) for the integers, which cuBLAS lacks.
 *
 * ct's matrices are row-major and cuBLAS's column-major. A row-major X is a
 * column-major X^T in the same memory, so c = a @ b is asked of cuBLAS as
 * c^T = b^T @ a^T: b first, each operand's transpose flag (a transposed
 * view, as a linear layer's W^T) carried over, nothing copied. */
#include <ct/cuda.h>

#include "cuda_impl.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#define MAX_DEVICES 64
/* What cuBLAS recommends on Hopper; other devices use less of it. */
#define WORKSPACE_BYTES ((size_t)32 << 20)
/* Matrices per cuBLAS call: some of its kernels put the batch in a grid
 * dim that holds no more. */
#define MAX_BATCH 65535

/* A handle per device, made on first use and kept for the process, bound
 * to the device's compute stream with a workspace of its own (cudaMalloc'd
 * outside ct's allocator: 32 MiB per device). A handle must not be used by
 * two threads at once, so the lock is held while a matmul is queued; the
 * device runs the work in stream order either way. */
static struct {
    pthread_mutex_t lock;
    cublasHandle_t handles[MAX_DEVICES];
} H = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int blas_fail(cublasStatus_t st, int device, const char *what) {
    return ct__err_set(st == CUBLAS_STATUS_ALLOC_FAILED ? CT_ENOMEM : CT_EFOREIGN,
                       "cuda:%d: %s: %s (%s)", device, what, cublasGetStatusString(st),
                       cublasGetStatusName(st));
}

/* device's handle, made if need be; under H.lock, with device current. */
static int handle_of(int device, void *stream, cublasHandle_t *out) {
    if (H.handles[device]) {
        *out = H.handles[device];
        return 0;
    }
    cublasHandle_t h = NULL;
    cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS)
        return blas_fail(st, device, "creating a cuBLAS handle");
    void *ws = NULL;
    cudaError_t e = cudaMalloc(&ws, WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cublasDestroy(h);
        return ct__err_set(e == cudaErrorMemoryAllocation ? CT_ENOMEM : CT_EFOREIGN,
                           "cuda:%d: allocating cuBLAS's workspace of %zu MiB: %s", device,
                           WORKSPACE_BYTES >> 20, cudaGetErrorString(e));
    }
    /* Setting the stream resets the workspace, so it goes first. Reductions
     * of float16 and bfloat16 products stay in float32. */
    if ((st = cublasSetStream(h, stream)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetWorkspace(h, ws, WORKSPACE_BYTES)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH |
                                       CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)) !=
            CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        cudaFree(ws);
        return blas_fail(st, device, "setting up a cuBLAS handle");
    }
    *out = H.handles[device] = h;
    return 0;
}

/* Whether the batches of dims [from, nbatch) of an operand with batch
 * strides bs start at multiples of one stride, *s: then one strided
 * cuBLAS call covers them. */
static bool uniform(const int64_t *bs, const int64_t *batch, int from, int nbatch, int64_t *s) {
    int64_t span = 1;
    bool found = false;
    *s = 0;
    for (int d = nbatch - 1; d >= from; d--) {
        if (batch[d] == 1)
            continue;
        if (!found)
            *s = bs[d];
        else if (bs[d] != *s * span)
            return false;
        found = true;
        span *= batch[d];
    }
    return true;
}

static int gemm_float(const ct__mm_plan *p, int device, cublasHandle_t h) {
    static const float f1 = 1, f0 = 0;
    static const double d1 = 1, d0 = 0;
    cudaDataType type = CUDA_R_32F;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    const void *one = &f1, *zero = &f0;
    switch (p->dtype) {
    case CT_FLOAT64:
        type = CUDA_R_64F;
        compute = CUBLAS_COMPUTE_64F;
        one = &d1;
        zero = &d0;
        break;
    case CT_FLOAT16: type = CUDA_R_16F; break;
    case CT_BFLOAT16: type = CUDA_R_16BF; break;
    default:
        if (ct_cuda_tf32_enabled())
            compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    }
    /* The batch dims split into outer ones, looped over here, and the
     * longest run of inner ones that both operands step through evenly
     * (every one, unless broadcasting mixes them). */
    int from = p->nbatch;
    int64_t sa = 0, sb = 0, ta, tb;
    while (from > 0 && uniform(p->a.bstrides, p->batch, from - 1, p->nbatch, &ta) &&
           uniform(p->b.bstrides, p->batch, from - 1, p->nbatch, &tb)) {
        from--;
        sa = ta;
        sb = tb;
    }
    int64_t inner = 1;
    for (int d = from; d < p->nbatch; d++)
        inner *= p->batch[d];
    int64_t es = (int64_t)ct_dtype_size((ct_dtype)p->dtype), mn = p->m * p->n;
    cublasOperation_t opa = p->b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = p->a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    for (int64_t o = 0; o < p->nb / inner; o++) {
        int64_t ao = 0, bo = 0, rem = o;
        for (int d = from - 1; d >= 0; d--) {
            int64_t i = rem % p->batch[d];
            rem /= p->batch[d];
            ao += i * p->a.bstrides[d];
            bo += i * p->b.bstrides[d];
        }
        for (int64_t i0 = 0; i0 < inner; i0 += MAX_BATCH) {
            int count = (int)(inner - i0 < MAX_BATCH ? inner - i0 : MAX_BATCH);
            cublasStatus_t st = cublasGemmStridedBatchedEx(
                h, opa, opb, (int)p->n, (int)p->m, (int)p->k, one, p->b.data + (bo + i0 * sb) * es,
                type, (int)p->b.ld, sb, p->a.data + (ao + i0 * sa) * es, type, (int)p->a.ld, sa,
                zero, p->c + ((o * inner + i0) * mn) * es, type, (int)p->n, mn, count, compute,
                CUBLAS_GEMM_DEFAULT);
            if (st != CUBLAS_STATUS_SUCCESS)
                return blas_fail(st, device, "cublasGemmStridedBatchedEx");
        }
    }
    return 0;
}

int ct__cuda_matmul(const ct__mm_plan *p, int device) {
    void *stream;
    int rc = ct__cuda_launch_on(device, &stream);
    if (rc)
        return rc;
    if (p->dtype == CT_INT64)
        return ct__cuda_launched(ct__cuda_launch_matmul_int(p, stream), device,
                                 "the integer matmul kernel");
    pthread_mutex_lock(&H.lock);
    cublasHandle_t h = NULL;
    rc = handle_of(device, stream, &h);
    if (!rc)
        rc = gemm_float(p, device, h);
    pthread_mutex_unlock(&H.lock);
    return rc;
}
