// ct's CUDA kernels (cuda_kernels.h): elementwise work over ct's element
// iterator, computed on the device with one thread per element, grid-stride.
#include "kernels_common.cuh"

using namespace ct_cuda;

namespace {

template <typename D, typename S> __global__ void copy_kernel(ct__cuda_iter it) {
    int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < it.numel;
         i += step) {
        int64_t od, os;
        offsets(it, i, &od, &os);
        *reinterpret_cast<D *>(it.data[0] + od) =
            Cast<D, S>::run(*reinterpret_cast<const S *>(it.data[1] + os));
    }
}

template <typename D, typename S> int launch_copy(const ct__cuda_iter &it, cudaStream_t stream) {
    copy_kernel<D, S><<<blocks_for(it.numel), kThreads, 0, stream>>>(it);
    return static_cast<int>(cudaGetLastError());
}

} // namespace

extern "C" int ct__cuda_launch_copy(const ct__cuda_iter *it, int dst_dtype, int src_dtype,
                                    void *stream) {
    if (it->numel == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(dst_dtype, [&](auto d) {
        return by_dtype(src_dtype,
                        [&](auto src) { return launch_copy<decltype(d), decltype(src)>(*it, s); });
    });
}

// ------------------------------------------------------------------- fill

namespace {

template <typename T> __global__ void fill_kernel(ct__cuda_iter it, T value) {
    int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < it.numel;
         i += step) {
        int64_t o = 0, j = i;
        for (int d = 0; d < it.ndim; d++) {
            o += (j % it.shape[d]) * it.strides[d][0];
            j /= it.shape[d];
        }
        *reinterpret_cast<T *>(it.data[0] + o) = value;
    }
}

} // namespace

extern "C" int ct__cuda_launch_fill(const ct__cuda_iter *it, int dtype, double value,
                                    void *stream) {
    if (it->numel == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(dtype, [&](auto t) {
        using T = decltype(t);
        fill_kernel<T><<<blocks_for(it->numel), kThreads, 0, s>>>(*it, Conv<T>::from(value));
        return static_cast<int>(cudaGetLastError());
    });
}

// ------------------------------------------------------------- binary ops

namespace {
__device__ inline int64_t int_pow(int64_t x, int64_t e) {
    if (e < 0)
        return x == 1 ? 1 : x == -1 ? (e & 1 ? -1 : 1) : 0;
    uint64_t r = 1, b = static_cast<uint64_t>(x);
    for (; e > 0; e >>= 1, b *= b)
        if (e & 1)
            r *= b;
    return static_cast<int64_t>(r);
}

template <typename A> struct Arith {
    __device__ static A apply(int op, A x, A y) {
        switch (op) {
        case CT__CUDA_ADD: return x + y;
        case CT__CUDA_SUB: return x - y;
        case CT__CUDA_MUL: return x * y;
        case CT__CUDA_DIV: return x / y;
        case CT__CUDA_POW: return pow(x, y);
        case CT__CUDA_MAXIMUM: return x > y || x != x ? x : y; // NaN propagates
        default: return x < y || x != x ? x : y;
        }
    }
};
template <> struct Arith<int64_t> {
    __device__ static int64_t apply(int op, int64_t x, int64_t y) {
        uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
        switch (op) {
        case CT__CUDA_ADD: return wrap(ux + uy);
        case CT__CUDA_SUB: return wrap(ux - uy);
        case CT__CUDA_MUL: return wrap(ux * uy);
        case CT__CUDA_POW: return int_pow(x, y);
        case CT__CUDA_MAXIMUM: return x > y ? x : y;
        default: return x < y ? x : y;
        }
    }
};

template <typename A> __device__ bool compare(int op, A x, A y) {
    switch (op) {
    case CT__CUDA_EQ: return x == y;
    case CT__CUDA_NE: return x != y;
    case CT__CUDA_LT: return x < y;
    case CT__CUDA_LE: return x <= y;
    case CT__CUDA_GT: return x > y;
    default: return x >= y;
    }
}

__device__ inline void offsets3(const ct__cuda_iter &it, int64_t i, int64_t o[3]) {
    o[0] = o[1] = o[2] = 0;
    for (int d = 0; d < it.ndim; d++) {
        int64_t idx = i % it.shape[d];
        i /= it.shape[d];
        o[0] += idx * it.strides[d][0];
        o[1] += idx * it.strides[d][1];
        o[2] += idx * it.strides[d][2];
    }
}

// The op is a kernel argument, not a template one: one kernel per dtype
// keeps the build short, and the switch costs nothing beside the loads.
template <typename T>
__global__ void binary_kernel(ct__cuda_iter it, int op, bool scalar_b, T scalar) {
    using A = typename Acc<T>::type;
    int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    bool cmp = op >= CT__CUDA_EQ;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < it.numel;
         i += step) {
        int64_t o[3];
        offsets3(it, i, o);
        A x = Elem<T>::load(*reinterpret_cast<const T *>(it.data[1] + o[1]));
        A y = Elem<T>::load(scalar_b ? scalar : *reinterpret_cast<const T *>(it.data[2] + o[2]));
        if (cmp)
            *reinterpret_cast<uint8_t *>(it.data[0] + o[0]) = compare<A>(op, x, y);
        else
            *reinterpret_cast<T *>(it.data[0] + o[0]) = Elem<T>::store(Arith<A>::apply(op, x, y));
    }
}

// Bool arithmetic (add, mul, maximum, minimum) computes in int64 and stores
// whether the result is non-zero; comparisons compare 0 and 1.
template <>
__global__ void binary_kernel<Bool>(ct__cuda_iter it, int op, bool scalar_b, Bool scalar) {
    int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < it.numel;
         i += step) {
        int64_t o[3];
        offsets3(it, i, o);
        int64_t x = *reinterpret_cast<const uint8_t *>(it.data[1] + o[1]) != 0;
        int64_t y =
            (scalar_b ? scalar.v : *reinterpret_cast<const uint8_t *>(it.data[2] + o[2])) != 0;
        *reinterpret_cast<uint8_t *>(it.data[0] + o[0]) =
            op >= CT__CUDA_EQ ? compare<int64_t>(op, x, y) : Arith<int64_t>::apply(op, x, y) != 0;
    }
}

template <typename T>
int launch_binary(const ct__cuda_iter &it, int op, bool scalar_b, double scalar, cudaStream_t s) {
    T v = Conv<T>::from(scalar);
    binary_kernel<T><<<blocks_for(it.numel), kThreads, 0, s>>>(it, op, scalar_b, v);
    return static_cast<int>(cudaGetLastError());
}

} // namespace

extern "C" int ct__cuda_launch_binary(const ct__cuda_iter *it, int op, int dtype, int scalar_b,
                                      double scalar, void *stream) {
    if (it->numel == 0)
        return 0;
    if (op < 0 || op >= CT__CUDA_NBINARY)
        return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(dtype, [&](auto t) {
        return launch_binary<decltype(t)>(*it, op, scalar_b != 0, scalar, s);
    });
}

// -------------------------------------------------------------- unary ops

namespace {

template <typename A> struct Unary {
    __device__ static A apply(int op, A x, A p0, A p1) {
        const A half = A(0.5), one = A(1);
        switch (op) {
        case CT__CUDA_NEG: return -x;
        case CT__CUDA_ABS: return fabs(x);
        case CT__CUDA_EXP: return exp(x);
        case CT__CUDA_LOG: return log(x);
        case CT__CUDA_LOG1P: return log1p(x);
        case CT__CUDA_SQRT: return sqrt(x);
        case CT__CUDA_RSQRT: return one / sqrt(x);
        case CT__CUDA_SIN: return sin(x);
        case CT__CUDA_COS: return cos(x);
        case CT__CUDA_TANH: return tanh(x);
        case CT__CUDA_SIGMOID: return one / (one + exp(-x));
        case CT__CUDA_RELU: return x > 0 || x != x ? x : A(0);
        case CT__CUDA_GELU: return x * half * (one + erf(x * A(0.70710678118654752440)));
        case CT__CUDA_GELU_TANH:
            return half * x *
                   (one + tanh(A(0.79788456080286535588) * (x + A(0.044715) * x * x * x)));
        case CT__CUDA_SILU: return x / (one + exp(-x));
        case CT__CUDA_POW_SCALAR: return p0 == A(2) ? x * x : pow(x, p0);
        default: {
            // min(max(x, lo), hi) as PyTorch: hi wins when lo > hi.
            A lo = x < p0 ? p0 : x;
            return lo > p1 ? p1 : lo;
        }
        }
    }
};

// The integer forms: neg, abs, relu, pow_scalar, clamp, wrapping.
template <> struct Unary<int64_t> {
    __device__ static int64_t apply(int op, int64_t x, int64_t p0, int64_t p1) {
        switch (op) {
        case CT__CUDA_NEG: return wrap(0 - static_cast<uint64_t>(x));
        case CT__CUDA_ABS: return x < 0 ? wrap(0 - static_cast<uint64_t>(x)) : x;
        case CT__CUDA_RELU: return x > 0 ? x : 0;
        case CT__CUDA_POW_SCALAR: return int_pow(x, p0);
        default: {
            int64_t lo = x < p0 ? p0 : x;
            return lo > p1 ? p1 : lo;
        }
        }
    }
};

template <typename T>
__global__ void unary_kernel(ct__cuda_iter it, int op, double p0, double p1, int64_t i0,
                             int64_t i1) {
    using A = decltype(Elem<T>::load(T()));
    constexpr bool ints = std::is_same<A, int64_t>::value;
    A q0 = ints ? static_cast<A>(i0) : static_cast<A>(p0);
    A q1 = ints ? static_cast<A>(i1) : static_cast<A>(p1);
    int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < it.numel;
         i += step) {
        int64_t od, os;
        offsets(it, i, &od, &os);
        A x = Elem<T>::load(*reinterpret_cast<const T *>(it.data[1] + os));
        *reinterpret_cast<T *>(it.data[0] + od) = Elem<T>::store(Unary<A>::apply(op, x, q0, q1));
    }
}

template <typename T>
int launch_unary(const ct__cuda_iter &it, int op, const double *p, const int64_t *ip,
                 cudaStream_t s) {
    unary_kernel<T><<<blocks_for(it.numel), kThreads, 0, s>>>(it, op, p[0], p[1], ip[0], ip[1]);
    return static_cast<int>(cudaGetLastError());
}

} // namespace

extern "C" int ct__cuda_launch_unary(const ct__cuda_iter *it, int op, int dtype, const double p[2],
                                     const int64_t ip[2], void *stream) {
    if (it->numel == 0)
        return 0;
    if (op < 0 || op >= CT__CUDA_NUNARY)
        return static_cast<int>(cudaErrorInvalidValue);
    if (dtype == 7) /* bool has no unary op */
        return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(dtype, [&](auto t) { return launch_unary<decltype(t)>(*it, op, p, ip, s); });
}
