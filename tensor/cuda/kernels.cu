// ct's CUDA kernels (cuda_kernels.h): elementwise work over ct's element
// iterator, computed on the device with one thread per element, grid-stride.
#include "cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace {

// ct_dtype, in its order (ct/tensor.h): float32, float64, bfloat16, float16,
// int64, int32, uint8, bool. bool is one byte holding 0 or 1.
struct Bool {
    uint8_t v;
};

template <typename T> struct Conv {
    __device__ static double to(T v) { return static_cast<double>(v); }
    __device__ static T from(double v) { return static_cast<T>(v); }
};
template <> struct Conv<__half> {
    __device__ static double to(__half v) { return __half2float(v); }
    __device__ static __half from(double v) { return __float2half_rn(static_cast<float>(v)); }
};
template <> struct Conv<__nv_bfloat16> {
    __device__ static double to(__nv_bfloat16 v) { return __bfloat162float(v); }
    __device__ static __nv_bfloat16 from(double v) {
        return __float2bfloat16_rn(static_cast<float>(v));
    }
};
template <> struct Conv<Bool> {
    __device__ static double to(Bool v) { return v.v != 0; }
    __device__ static Bool from(double v) { return Bool{static_cast<uint8_t>(v != 0)}; }
};

// int64 through double would lose bits above 2^53: integers convert
// directly among themselves.
template <typename D, typename S> struct Cast {
    __device__ static D run(S v) { return Conv<D>::from(Conv<S>::to(v)); }
};
template <typename T> struct Cast<T, T> {
    __device__ static T run(T v) { return v; }
};
template <> struct Cast<int32_t, int64_t> {
    __device__ static int32_t run(int64_t v) { return static_cast<int32_t>(v); }
};
template <> struct Cast<int64_t, int32_t> {
    __device__ static int64_t run(int32_t v) { return v; }
};
template <> struct Cast<uint8_t, int64_t> {
    __device__ static uint8_t run(int64_t v) { return static_cast<uint8_t>(v); }
};
template <> struct Cast<int64_t, uint8_t> {
    __device__ static int64_t run(uint8_t v) { return v; }
};

// The byte offsets of element i in each operand.
__device__ inline void offsets(const ct__cuda_iter2 &it, int64_t i, int64_t *o0, int64_t *o1) {
    int64_t a = 0, b = 0;
    for (int d = 0; d < it.ndim; d++) {
        int64_t idx = i % it.shape[d];
        i /= it.shape[d];
        a += idx * it.strides[d][0];
        b += idx * it.strides[d][1];
    }
    *o0 = a;
    *o1 = b;
}

template <typename D, typename S> __global__ void copy_kernel(ct__cuda_iter2 it) {
    int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < it.numel;
         i += step) {
        int64_t od, os;
        offsets(it, i, &od, &os);
        *reinterpret_cast<D *>(it.data[0] + od) =
            Cast<D, S>::run(*reinterpret_cast<const S *>(it.data[1] + os));
    }
}

constexpr int kThreads = 256;

// Enough blocks to fill the device several times over; the grid-stride loop
// covers the rest.
unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

template <typename D, typename S> int launch_copy(const ct__cuda_iter2 &it, cudaStream_t stream) {
    copy_kernel<D, S><<<blocks_for(it.numel), kThreads, 0, stream>>>(it);
    return static_cast<int>(cudaGetLastError());
}

template <typename D> int launch_copy_from(const ct__cuda_iter2 &it, int src, cudaStream_t s) {
    switch (src) {
    case 0: return launch_copy<D, float>(it, s);
    case 1: return launch_copy<D, double>(it, s);
    case 2: return launch_copy<D, __nv_bfloat16>(it, s);
    case 3: return launch_copy<D, __half>(it, s);
    case 4: return launch_copy<D, int64_t>(it, s);
    case 5: return launch_copy<D, int32_t>(it, s);
    case 6: return launch_copy<D, uint8_t>(it, s);
    case 7: return launch_copy<D, Bool>(it, s);
    }
    return static_cast<int>(cudaErrorInvalidValue);
}

} // namespace

extern "C" int ct__cuda_launch_copy(const ct__cuda_iter2 *it, int dst_dtype, int src_dtype,
                                    void *stream) {
    if (it->numel == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (dst_dtype) {
    case 0: return launch_copy_from<float>(*it, src_dtype, s);
    case 1: return launch_copy_from<double>(*it, src_dtype, s);
    case 2: return launch_copy_from<__nv_bfloat16>(*it, src_dtype, s);
    case 3: return launch_copy_from<__half>(*it, src_dtype, s);
    case 4: return launch_copy_from<int64_t>(*it, src_dtype, s);
    case 5: return launch_copy_from<int32_t>(*it, src_dtype, s);
    case 6: return launch_copy_from<uint8_t>(*it, src_dtype, s);
    case 7: return launch_copy_from<Bool>(*it, src_dtype, s);
    }
    return static_cast<int>(cudaErrorInvalidValue);
}
