// ct's CUDA kernels (cuda_kernels.h): elementwise work over ct's element
// iterator, each op family a functor handed to kernels_common.cuh's map
// (grid-stride, 16-byte vectors where the operands are contiguous).
#include "kernels_common.cuh"

using namespace ct_cuda;

namespace {

template <typename D, typename S> struct CopyOp {
    __device__ D operator()(S v) const { return Cast<D, S>::run(v); }
};

template <typename T> struct FillOp {
    T value;
    __device__ T operator()() const { return value; }
};

} // namespace

extern "C" int ct__cuda_launch_copy(const ct__cuda_iter *it, int dst_dtype, int src_dtype,
                                    void *stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(dst_dtype, [&](auto d) {
        return by_dtype(src_dtype, [&](auto src) {
            using D = decltype(d);
            using S = decltype(src);
            return map_launch<D, S>(*it, CopyOp<D, S>{}, s);
        });
    });
}

extern "C" int ct__cuda_launch_fill(const ct__cuda_iter *it, int dtype, double value,
                                    void *stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(dtype, [&](auto t) {
        using T = decltype(t);
        return map_launch<T>(*it, FillOp<T>{Conv<T>::from(value)}, s);
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
        case CT__BINARY_ADD: return x + y;
        case CT__BINARY_SUB: return x - y;
        case CT__BINARY_MUL: return x * y;
        case CT__BINARY_DIV: return x / y;
        case CT__BINARY_POW: return pow(x, y);
        case CT__BINARY_MAXIMUM: return x > y || x != x ? x : y; // NaN propagates
        default: return x < y || x != x ? x : y;
        }
    }
};
template <> struct Arith<int64_t> {
    __device__ static int64_t apply(int op, int64_t x, int64_t y) {
        uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
        switch (op) {
        case CT__BINARY_ADD: return wrap(ux + uy);
        case CT__BINARY_SUB: return wrap(ux - uy);
        case CT__BINARY_MUL: return wrap(ux * uy);
        case CT__BINARY_POW: return int_pow(x, y);
        case CT__BINARY_MAXIMUM: return x > y ? x : y;
        default: return x < y ? x : y;
        }
    }
};

template <typename A> __device__ bool compare(int op, A x, A y) {
    switch (op) {
    case CT__BINARY_EQ: return x == y;
    case CT__BINARY_NE: return x != y;
    case CT__BINARY_LT: return x < y;
    case CT__BINARY_LE: return x <= y;
    case CT__BINARY_GT: return x > y;
    default: return x >= y;
    }
}

// Elements to the compute type and back; comparisons give bool. Bool
// arithmetic (add, mul, maximum, minimum) computes in int64 and stores
// whether the result is non-zero.
template <typename T> struct ArithOp {
    using A = decltype(Elem<T>::load(T()));
    int op;
    __device__ T operator()(T x, T y) const {
        return Elem<T>::store(Arith<A>::apply(op, Elem<T>::load(x), Elem<T>::load(y)));
    }
};

template <typename T> struct CompareOp {
    using A = decltype(Elem<T>::load(T()));
    int op;
    __device__ Bool operator()(T x, T y) const {
        return Bool{static_cast<uint8_t>(compare<A>(op, Elem<T>::load(x), Elem<T>::load(y)))};
    }
};

// op(x, scalar): the scalar is the kernel's argument, not an operand.
template <typename Op, typename T> struct WithScalar {
    Op op;
    T scalar;
    __device__ auto operator()(T x) const { return op(x, scalar); }
};

template <typename O, typename T, typename Op>
int launch_binary(const ct__cuda_iter &it, Op op, bool scalar_b, double scalar, cudaStream_t s) {
    if (scalar_b)
        return map_launch<O, T>(it, WithScalar<Op, T>{op, Conv<T>::from(scalar)}, s);
    return map_launch<O, T, T>(it, op, s);
}

} // namespace

extern "C" int ct__cuda_launch_binary(const ct__cuda_iter *it, int op, int dtype, int scalar_b,
                                      double scalar, void *stream) {
    if (op < 0 || op >= CT__NUM_BINARY)
        return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(dtype, [&](auto t) {
        using T = decltype(t);
        if (op >= CT__BINARY_EQ)
            return launch_binary<Bool, T>(*it, CompareOp<T>{op}, scalar_b != 0, scalar, s);
        return launch_binary<T, T>(*it, ArithOp<T>{op}, scalar_b != 0, scalar, s);
    });
}

// -------------------------------------------------------------- unary ops

namespace {

template <typename A> struct Unary {
    __device__ static A apply(int op, A x, A p0, A p1) {
        const A half = A(0.5), one = A(1);
        switch (op) {
        case CT__UNARY_NEG: return -x;
        case CT__UNARY_ABS: return fabs(x);
        case CT__UNARY_EXP: return exp(x);
        case CT__UNARY_LOG: return log(x);
        case CT__UNARY_LOG1P: return log1p(x);
        case CT__UNARY_SQRT: return sqrt(x);
        case CT__UNARY_RSQRT: return one / sqrt(x);
        case CT__UNARY_SIN: return sin(x);
        case CT__UNARY_COS: return cos(x);
        case CT__UNARY_TANH: return tanh(x);
        case CT__UNARY_SIGMOID: return one / (one + exp(-x));
        case CT__UNARY_RELU: return x > 0 || x != x ? x : A(0);
        case CT__UNARY_GELU: return x * half * (one + erf(x * A(0.70710678118654752440)));
        case CT__UNARY_GELU_TANH:
            return half * x *
                   (one + tanh(A(0.79788456080286535588) * (x + A(0.044715) * x * x * x)));
        case CT__UNARY_SILU: return x / (one + exp(-x));
        case CT__UNARY_POW_SCALAR: return p0 == A(2) ? x * x : pow(x, p0);
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
        case CT__UNARY_NEG: return wrap(0 - static_cast<uint64_t>(x));
        case CT__UNARY_ABS: return x < 0 ? wrap(0 - static_cast<uint64_t>(x)) : x;
        case CT__UNARY_RELU: return x > 0 ? x : 0;
        case CT__UNARY_POW_SCALAR: return int_pow(x, p0);
        default: {
            int64_t lo = x < p0 ? p0 : x;
            return lo > p1 ? p1 : lo;
        }
        }
    }
};

template <typename T> struct UnaryOp {
    using A = decltype(Elem<T>::load(T()));
    int op;
    A p0, p1;
    __device__ T operator()(T x) const {
        return Elem<T>::store(Unary<A>::apply(op, Elem<T>::load(x), p0, p1));
    }
};

} // namespace

extern "C" int ct__cuda_launch_unary(const ct__cuda_iter *it, int op, int dtype, const double p[2],
                                     const int64_t ip[2], void *stream) {
    if (op < 0 || op >= CT__NUM_UNARY)
        return static_cast<int>(cudaErrorInvalidValue);
    if (dtype == 7) /* bool has no unary op */
        return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(dtype, [&](auto t) {
        using T = decltype(t);
        using A = typename UnaryOp<T>::A;
        constexpr bool ints = std::is_same<A, int64_t>::value;
        A p0 = ints ? static_cast<A>(ip[0]) : static_cast<A>(p[0]);
        A p1 = ints ? static_cast<A>(ip[1]) : static_cast<A>(p[1]);
        return map_launch<T, T>(*it, UnaryOp<T>{op, p0, p1}, s);
    });
}
