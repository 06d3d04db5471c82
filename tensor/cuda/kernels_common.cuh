// Shared by ct's CUDA kernel files (internal): ct's dtypes as device
// types, conversions between them, the compute types, the iterator's
// offsets, launch shapes, and elementwise maps over the iterator.
// Header-only; every function is inline or a template, so each .cu that
// includes it gets its own copies.
#ifndef CT_KERNELS_COMMON_CUH
#define CT_KERNELS_COMMON_CUH

#include "cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

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

// The byte offsets of element i in the first K operands. One dim, the
// common case after coalescing, needs no division.
template <int K>
__device__ inline void element_offsets(const ct__cuda_iter &it, int64_t i, int64_t (&o)[K]) {
    if (it.ndim == 1) {
        for (int k = 0; k < K; k++)
            o[k] = i * it.strides[0][k];
        return;
    }
    for (int k = 0; k < K; k++)
        o[k] = 0;
    for (int d = 0; d < it.ndim; d++) {
        int64_t idx = i % it.shape[d];
        i /= it.shape[d];
        for (int k = 0; k < K; k++)
            o[k] += idx * it.strides[d][k];
    }
}

// The byte offsets of element i in the first two operands.
__device__ inline void offsets(const ct__cuda_iter &it, int64_t i, int64_t *o0, int64_t *o1) {
    int64_t o[2];
    element_offsets<2>(it, i, o);
    *o0 = o[0];
    *o1 = o[1];
}

constexpr int kThreads = 256;

// Enough blocks to fill the device several times over; the grid-stride loop
// covers the rest.
inline unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

// A grid-stride loop's start and step, in 64 bits: a grid can cover more
// than 2^31 elements.
__device__ inline int64_t first_of_thread() {
    return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_step() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// The launch just made, as the cudaError_t the launchers return (0: queued).
inline int launched() { return static_cast<int>(cudaGetLastError()); }

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

// ------------------------------------------------------ elementwise maps
//
// map_launch<O, A, B>(it, f, stream) writes f(a, b) to every element of the
// iterator's operand 0 (of type O), a and b the elements of operands 1 and
// 2 (of types A and B). An absent input is None, and f takes one argument
// fewer: f(a) for one input, f() for none. f is a plain struct (kernel
// arguments are copied by value).
//
// Where the iterator is one run of contiguous elements in every operand,
// each aligned to its vector's size, a thread moves V elements at a time:
// 16 bytes of the widest operand in one load or store, as memcpy does.
// Anything else, and the tail of that run, goes an element at a time.

struct None {};

template <typename T> constexpr int size_of() {
    return std::is_same<T, None>::value ? 1 : static_cast<int>(sizeof(T));
}

// An unsigned word of each vector size, for 1- to 16-byte loads.
template <int Bytes> struct Word;
template <> struct Word<1> { using type = uint8_t; };
template <> struct Word<2> { using type = uint16_t; };
template <> struct Word<4> { using type = uint32_t; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };

template <typename T, int V> struct Pack { T v[V]; };

template <typename T, int V> __device__ inline Pack<T, V> load_pack(const char *p) {
    using W = typename Word<sizeof(T) * V>::type;
    W w = *reinterpret_cast<const W *>(p);
    Pack<T, V> r;
    memcpy(&r, &w, sizeof r);
    return r;
}

template <typename T, int V> __device__ inline void store_pack(char *p, const Pack<T, V> &r) {
    using W = typename Word<sizeof(T) * V>::type;
    W w;
    memcpy(&w, &r, sizeof w);
    *reinterpret_cast<W *>(p) = w;
}

template <typename O, typename A, typename B, typename F>
__device__ inline void map_one(const ct__cuda_iter &it, int64_t i, const F &f) {
    constexpr int K = std::is_same<A, None>::value ? 1 : std::is_same<B, None>::value ? 2 : 3;
    int64_t o[K];
    element_offsets<K>(it, i, o);
    O *out = reinterpret_cast<O *>(it.data[0] + o[0]);
    if constexpr (K == 1)
        *out = f();
    else if constexpr (K == 2)
        *out = f(*reinterpret_cast<const A *>(it.data[1] + o[1]));
    else
        *out = f(*reinterpret_cast<const A *>(it.data[1] + o[1]),
                 *reinterpret_cast<const B *>(it.data[2] + o[2]));
}

// V == 1: any layout. V > 1: one contiguous, aligned run (map_launch
// checks), in vectors of V, then the tail element by element.
template <int V, typename O, typename A, typename B, typename F>
__global__ void map_kernel(ct__cuda_iter it, F f) {
    int64_t step = grid_step(), first = first_of_thread();
    int64_t done = 0;
    if constexpr (V > 1) {
        int64_t nvec = it.numel / V;
        for (int64_t v = first; v < nvec; v += step) {
            int64_t i = v * V;
            Pack<O, V> out;
            if constexpr (std::is_same<A, None>::value) {
#pragma unroll
                for (int l = 0; l < V; l++)
                    out.v[l] = f();
            } else if constexpr (std::is_same<B, None>::value) {
                Pack<A, V> a = load_pack<A, V>(it.data[1] + i * sizeof(A));
#pragma unroll
                for (int l = 0; l < V; l++)
                    out.v[l] = f(a.v[l]);
            } else {
                Pack<A, V> a = load_pack<A, V>(it.data[1] + i * sizeof(A));
                Pack<B, V> b = load_pack<B, V>(it.data[2] + i * sizeof(B));
#pragma unroll
                for (int l = 0; l < V; l++)
                    out.v[l] = f(a.v[l], b.v[l]);
            }
            store_pack<O, V>(it.data[0] + i * sizeof(O), out);
        }
        done = nvec * V;
    }
    for (int64_t i = done + first; i < it.numel; i += step)
        map_one<O, A, B>(it, i, f);
}

// Operand k of type T is one contiguous run whose start is aligned for
// vectors of V elements.
template <typename T> inline bool vector_operand(const ct__cuda_iter &it, int k, int v) {
    return std::is_same<T, None>::value ||
           (it.strides[0][k] == size_of<T>() &&
            reinterpret_cast<uintptr_t>(it.data[k]) % static_cast<uintptr_t>(v * size_of<T>()) ==
                0);
}

template <typename O, typename A = None, typename B = None, typename F>
int map_launch(const ct__cuda_iter &it, const F &f, cudaStream_t stream) {
    if (it.numel == 0)
        return 0;
    constexpr int widest = size_of<O>() > size_of<A>()
                               ? (size_of<O>() > size_of<B>() ? size_of<O>() : size_of<B>())
                               : (size_of<A>() > size_of<B>() ? size_of<A>() : size_of<B>());
    constexpr int V = 16 / widest;
    if (it.ndim == 1 && vector_operand<O>(it, 0, V) && vector_operand<A>(it, 1, V) &&
        vector_operand<B>(it, 2, V))
        map_kernel<V, O, A, B><<<blocks_for((it.numel + V - 1) / V), kThreads, 0, stream>>>(it, f);
    else
        map_kernel<1, O, A, B><<<blocks_for(it.numel), kThreads, 0, stream>>>(it, f);
    return launched();
}

} // namespace ct_cuda

#endif
