/* ct on one CUDA device against the device's own limits, in one run:
 *  - elementwise bandwidth (add, mul, copy, gelu) on float32 tensors of 64
 *    and 256 MiB, beside cudaMemcpy device to device of the same size;
 *  - matmul (4096^3, and a batch of 32 1024^3) in float32, TF32 and
 *    bfloat16, beside cuBLAS called directly with the same shapes and
 *    compute types.
 * One JSON object per result on stdout, the targets' verdicts on stderr.
 * Bandwidth counts the bytes read and written; every figure is the best of
 * REPS timings, each of at least MIN_SECONDS of back-to-back calls and the
 * synchronization that ends them. Without a device it prints one line
 * saying why it skipped, and exits 0.
 *
 *     bench_cuda [--quick]     --quick: 64 MiB and 4096^3 only, fewer reps */
#include <ct/ct.h>
#include <ct/cuda.h>

#include "bench_time.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#define MIN_SECONDS 0.05

static int reps = 5;
static const ct_device gpu = {CT_CUDA, 0};

typedef struct timed {
    void (*run)(void *ctx); /* queues one call */
    int (*sync)(void *ctx); /* waits for the calls queued */
    void *ctx;
} timed;

/* Seconds per call: the best of reps rounds. */
static double time_calls(const timed *t) {
    t->run(t->ctx);
    if (t->sync(t->ctx))
        return -1;
    double best = 1e30;
    int iters = 1;
    for (int r = 0; r < reps; r++) {
        double t0, dt;
        for (;;) {
            t0 = bench_now();
            for (int i = 0; i < iters; i++)
                t->run(t->ctx);
            if (t->sync(t->ctx))
                return -1;
            dt = bench_now() - t0;
            if (dt >= MIN_SECONDS)
                break;
            iters *= 2;
        }
        if (dt / iters < best)
            best = dt / iters;
    }
    return best;
}

static int ct_sync(void *ctx) {
    (void)ctx;
    return ct_cuda_synchronize(0);
}

static int stream_sync(void *ctx) {
    return cudaStreamSynchronize(*(cudaStream_t *)ctx) == cudaSuccess ? 0 : -1;
}

/* ------------------------------------------------------------ elementwise */

typedef struct ew {
    const char *op;
    ct_tensor *a, *b, *out;
} ew;

/* Each call's result goes back to the device's cache at once, as in a
 * training step. */
static void ew_run(void *ctx) {
    ew *e = ctx;
    ct_scope_begin();
    if (!strcmp(e->op, "add"))
        ct_add(e->a, e->b);
    else if (!strcmp(e->op, "mul"))
        ct_mul(e->a, e->b);
    else if (!strcmp(e->op, "copy"))
        ct_copy_(e->out, e->a);
    else
        ct_gelu(e->a);
    ct_scope_end();
}

typedef struct memcpy_job {
    cudaStream_t stream; /* first: stream_sync reads it */
    void *dst;
    const void *src;
    size_t bytes;
} memcpy_job;

static void memcpy_run(void *ctx) {
    memcpy_job *m = ctx;
    cudaMemcpyAsync(m->dst, m->src, m->bytes, cudaMemcpyDeviceToDevice, m->stream);
}

/* The worst ratio of add, mul and copy (gelu is reported, not held to the
 * target); -1 if the tensors cannot be made. */
static double bench_elementwise(size_t mib, cudaStream_t stream) {
    int64_t n = (int64_t)(mib << 20) / 4;
    ct_tensor *a = ct_full_on(1, (int64_t[]){n}, 1.5, CT_FLOAT32, gpu);
    ct_tensor *b = ct_full_on(1, (int64_t[]){n}, 0.5, CT_FLOAT32, gpu);
    ct_tensor *out = ct_empty_on(1, (int64_t[]){n}, CT_FLOAT32, gpu);
    if (!a || !b || !out) {
        fprintf(stderr, "bench_cuda: %s\n", ct_errmsg());
        return -1;
    }
    size_t bytes = (size_t)n * 4;
    memcpy_job m = {stream, ct_data_ptr(out), ct_data_ptr(a), bytes};
    double copy_s = time_calls(&(timed){memcpy_run, stream_sync, &m});
    double copy_gbps = 2.0 * (double)bytes / copy_s / 1e9;
    printf("{\"bench\": \"cuda\", \"impl\": \"cudaMemcpy\", \"op\": \"memcpy_d2d\", \"mib\": %zu, "
           "\"gbps\": %.1f}\n",
           mib, copy_gbps);
    static const struct {
        const char *op;
        double traffic; /* bytes moved per element byte */
    } ops[] = {{"add", 3}, {"mul", 3}, {"copy", 2}, {"gelu", 2}};
    double worst = 1e30;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        ew e = {ops[i].op, a, b, out};
        double s = time_calls(&(timed){ew_run, ct_sync, &e});
        if (s < 0) {
            fprintf(stderr, "bench_cuda: %s: %s\n", ops[i].op, ct_errmsg());
            continue;
        }
        double gbps = ops[i].traffic * (double)bytes / s / 1e9, ratio = gbps / copy_gbps;
        printf("{\"bench\": \"cuda\", \"impl\": \"ct\", \"op\": \"%s\", \"mib\": %zu, "
               "\"gbps\": %.1f, \"memcpy_gbps\": %.1f, \"ratio\": %.3f}\n",
               ops[i].op, mib, gbps, copy_gbps, ratio);
        fprintf(stderr, "  %-5s %4zu MiB: %7.1f GB/s, %.2f x cudaMemcpy's %.1f GB/s\n", ops[i].op,
                mib, gbps, ratio, copy_gbps);
        if (strcmp(ops[i].op, "gelu") && ratio < worst)
            worst = ratio;
    }
    ct_tensor_free(a);
    ct_tensor_free(b);
    ct_tensor_free(out);
    return worst;
}

/* ----------------------------------------------------------------- matmul */

typedef struct mm {
    ct_tensor *a, *b;
} mm;

static void mm_run(void *ctx) {
    mm *p = ctx;
    ct_scope_begin();
    ct_matmul(p->a, p->b);
    ct_scope_end();
}

typedef struct blas_job {
    cudaStream_t stream; /* first: stream_sync reads it */
    cublasHandle_t handle;
    int batch, m, n, k;
    cudaDataType type;
    cublasComputeType_t compute;
    const void *a, *b;
    void *c;
} blas_job;

/* Row-major c = a @ b, as ct asks it: c^T = b^T a^T in cuBLAS's terms. */
static void blas_run(void *ctx) {
    blas_job *j = ctx;
    const float one = 1, zero = 0;
    cublasGemmStridedBatchedEx(j->handle, CUBLAS_OP_N, CUBLAS_OP_N, j->n, j->m, j->k, &one, j->b,
                               j->type, j->n, (long long)j->k * j->n, j->a, j->type, j->k,
                               (long long)j->m * j->k, &zero, j->c, j->type, j->n,
                               (long long)j->m * j->n, j->batch, j->compute, CUBLAS_GEMM_DEFAULT);
}

/* The worst ratio of ct to cuBLAS over the modes, for the given shape; -1
 * if the tensors cannot be made. */
static double bench_matmul(int batch, int size, cudaStream_t stream, cublasHandle_t handle) {
    static const struct {
        const char *mode;
        ct_dtype dtype;
        bool tf32;
        cudaDataType type;
        cublasComputeType_t compute;
    } modes[] = {
        {"fp32", CT_FLOAT32, false, CUDA_R_32F, CUBLAS_COMPUTE_32F},
        {"tf32", CT_FLOAT32, true, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
        {"bf16", CT_BFLOAT16, false, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
    };
    double worst = 1e30, flop = 2.0 * batch * (double)size * size * size;
    int64_t shape[3] = {batch, size, size};
    int nd = batch > 1 ? 3 : 2;
    const int64_t *sizes = batch > 1 ? shape : shape + 1;
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        ct_scope_begin();
        ct_tensor *a = ct_full_on(nd, sizes, 0.25, modes[i].dtype, gpu);
        ct_tensor *b = ct_full_on(nd, sizes, 0.5, modes[i].dtype, gpu);
        ct_tensor *c = ct_empty_on(nd, sizes, modes[i].dtype, gpu);
        if (!a || !b || !c) {
            fprintf(stderr, "bench_cuda: %s\n", ct_errmsg());
            ct_scope_end();
            return -1;
        }
        ct_cuda_set_tf32(modes[i].tf32);
        double ct_s = time_calls(&(timed){mm_run, ct_sync, &(mm){a, b}});
        ct_cuda_set_tf32(false);
        blas_job j = {stream,         handle,         batch,         size,
                      size,           size,           modes[i].type, modes[i].compute,
                      ct_data_ptr(a), ct_data_ptr(b), ct_data_ptr(c)};
        double blas_s = time_calls(&(timed){blas_run, stream_sync, &j});
        ct_scope_end();
        if (ct_s < 0 || blas_s < 0) {
            fprintf(stderr, "bench_cuda: matmul %s: %s\n", modes[i].mode, ct_errmsg());
            continue;
        }
        double tf = flop / ct_s / 1e12, peer = flop / blas_s / 1e12, ratio = tf / peer;
        printf("{\"bench\": \"cuda\", \"impl\": \"ct\", \"op\": \"matmul\", \"mode\": \"%s\", "
               "\"batch\": %d, \"size\": %d, \"tflops\": %.2f, \"cublas_tflops\": %.2f, "
               "\"ratio\": %.3f}\n",
               modes[i].mode, batch, size, tf, peer, ratio);
        fprintf(stderr, "  matmul %s %dx%d^3: %7.2f TFLOP/s, %.2f x cuBLAS's %.2f\n", modes[i].mode,
                batch, size, tf, ratio, peer);
        if (ratio < worst)
            worst = ratio;
    }
    return worst;
}

/* The verdict on stderr, and as a JSON line. ratio <= 0: not measured. */
static void target(const char *name, const char *peer, double ratio, double want) {
    bool measured = ratio > 0 && ratio < 1e29, met = measured && ratio >= want;
    if (measured)
        fprintf(stderr, "target: %s >= %.1f x %s: %s (ratio %.2f)\n", name, want, peer,
                met ? "met" : "missed", ratio);
    else
        fprintf(stderr, "target: %s >= %.1f x %s: not measured\n", name, want, peer);
    printf("{\"bench\": \"cuda\", \"summary\": \"target\", \"target\": \"%s\", "
           "\"ratio\": %.3f, \"target_ratio\": %.1f, \"met\": %s}\n",
           name, measured ? ratio : -1.0, want, met ? "true" : "false");
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (ct_cuda_device_count() == 0) {
        printf("{\"bench\": \"cuda\", \"skipped\": \"no CUDA device: %s\"}\n",
               ct_cuda_unavailable_reason());
        return 0;
    }
    if (quick)
        reps = 3;
    struct cudaDeviceProp prop;
    cudaStream_t stream;
    cublasHandle_t handle;
    if (cudaSetDevice(0) != cudaSuccess || cudaGetDeviceProperties(&prop, 0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(handle, stream) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_cuda: cannot set up the CUDA peers on cuda:0\n");
        return 1;
    }
    printf("{\"bench\": \"cuda\", \"device\": \"%s\", \"memory_gib\": %.1f}\n", prop.name,
           (double)prop.totalGlobalMem / (1 << 30));
    fprintf(stderr, "elementwise, float32, beside cudaMemcpy device to device:\n");
    double ew_worst = 1e30;
    for (size_t mib = 64; mib <= (quick ? 64u : 256u); mib *= 4) {
        double w = bench_elementwise(mib, stream);
        if (w < ew_worst)
            ew_worst = w;
    }
    fprintf(stderr, "matmul, beside cuBLAS called directly:\n");
    double mmw = bench_matmul(1, 4096, stream, handle);
    if (!quick) {
        double w = bench_matmul(32, 1024, stream, handle);
        if (w < mmw)
            mmw = w;
    }
    target("elementwise", "device copy", ew_worst, 0.8);
    target("matmul", "cuBLAS", mmw, 0.9);
    cublasDestroy(handle);
    cudaStreamDestroy(stream);
    return 0;
}
