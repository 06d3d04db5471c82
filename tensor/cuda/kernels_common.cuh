// Shared by ct's CUDA kernel files (internal): ct's dtypes as device
// types, conversions between them, the compute types, the iterator's
// offsets, and launch shapes. Header-only; every function is inline or a
// template, so each .cu that includes it gets its own copies.
#ifndef CT_KERNELS_COMMON_CUH
#define CT_KERNELS_COMMON_CUH

#include "cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

namespace ct_cuda {

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
__device__ inline void offsets(const ct__cuda_iter &it, int64_t i, int64_t *o0, int64_t *o1) {
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

constexpr int kThreads = 256;

// Enough blocks to fill the device several times over; the grid-stride loop
// covers the rest.
inline unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

// Calls f with a value of the element type of ct_dtype dtype, in ct's
// order: float32, float64, bfloat16, float16, int64, int32, uint8, bool.
template <typename F> int by_dtype(int dtype, F &&f) {
    switch (dtype) {
    case 0: return f(float());
    case 1: return f(double());
    case 2: return f(__nv_bfloat16());
    case 3: return f(__half());
    case 4: return f(int64_t());
    case 5: return f(int32_t());
    case 6: return f(uint8_t());
    case 7: return f(Bool());
    }
    return static_cast<int>(cudaErrorInvalidValue);
}

// The compute type, as on the CPU (tensor_impl.h's CT__ACC_*): float for the
// 16- and 32-bit floats, double, and int64 for the integers and bool.
template <typename T> struct Acc { using type = int64_t; };
template <> struct Acc<float> { using type = float; };
template <> struct Acc<double> { using type = double; };
template <> struct Acc<__half> { using type = float; };
template <> struct Acc<__nv_bfloat16> { using type = float; };

// Elements to the compute type and back. Integers never pass through
// double, which would drop bits of an int64 above 2^53.
template <typename T,
          bool Int = (sizeof(typename Acc<T>::type) == 8 && !std::is_floating_point<T>::value)>
struct Elem {
    using A = typename Acc<T>::type;
    __device__ static A load(T v) { return static_cast<A>(Conv<T>::to(v)); }
    __device__ static T store(A v) { return Conv<T>::from(static_cast<double>(v)); }
};
template <typename T> struct Elem<T, true> {
    __device__ static int64_t load(T v) { return static_cast<int64_t>(v); }
    __device__ static T store(int64_t v) { return static_cast<T>(v); }
};
template <> struct Elem<Bool, true> {
    __device__ static int64_t load(Bool v) { return v.v != 0; }
    __device__ static Bool store(int64_t v) { return Bool{static_cast<uint8_t>(v != 0)}; }
};

// Integer arithmetic wraps like two's complement, as on the CPU.
__device__ inline int64_t wrap(uint64_t v) { return static_cast<int64_t>(v); }

} // namespace ct_cuda

#endif
