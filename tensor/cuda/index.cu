// ct's CUDA kernels for indexing, selection and random draws (the "indexing
// and random" part of cuda_kernels.h): gather and scatter_add along a dim,
// the scan that finds out-of-range values, one_hot, tril and triu, where and
// masked_fill, and Philox draws. One thread per element (per Philox block
// for draws), grid-stride, with 64-bit positions.
#include "kernels_common.cuh"
#include "philox.h"

#include <stdint.h>
#include <string.h>

using namespace ct_cuda;

namespace {

// Gather, tril and where move elements without looking at them: one
// unsigned type per element size serves every dtype.
template <typename F> int by_size(int esize, F &&f) {
    switch (esize) {
    case 1: return f(uint8_t());
    case 2: return f(uint16_t());
    case 4: return f(uint32_t());
    case 8: return f(uint64_t());
    }
    return static_cast<int>(cudaErrorInvalidValue);
}

// The dtypes an index may have, int64 and int32, and with Labels, uint8
// too (one_hot's labels).
template <bool Labels = false, typename F> int by_index(int dtype, F &&f) {
    switch (dtype) {
    case 4: return f(int64_t());
    case 5: return f(int32_t());
    }
    if constexpr (Labels)
        if (dtype == 6)
            return f(uint8_t());
    return static_cast<int>(cudaErrorInvalidValue);
}

template <typename I> __device__ inline int64_t load_index(const char *p) {
    return static_cast<int64_t>(*reinterpret_cast<const I *>(p));
}

// ------------------------------------------------- gather and scatter_add

template <typename T, typename I> __global__ void gather_kernel(ct__cuda_iter it, int64_t jump) {
    for (int64_t i = first_of_thread(); i < it.numel; i += grid_step()) {
        int64_t o[3];
        element_offsets<3>(it, i, o);
        int64_t at = load_index<I>(it.data[1] + o[1]);
        *reinterpret_cast<T *>(it.data[0] + o[0]) =
            *reinterpret_cast<const T *>(it.data[2] + o[2] + at * jump);
    }
}

__device__ inline void atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ inline void atomic_add(double *p, double v) { atomicAdd(p, v); }
__device__ inline void atomic_add(__half *p, __half v) { atomicAdd(p, v); }
__device__ inline void atomic_add(__nv_bfloat16 *p, __nv_bfloat16 v) { atomicAdd(p, v); }
// Integers wrap around, as on the CPU: the adds are done on unsigned words.
__device__ inline void atomic_add(int64_t *p, int64_t v) {
    atomicAdd(reinterpret_cast<unsigned long long *>(p), static_cast<unsigned long long>(v));
}
__device__ inline void atomic_add(int32_t *p, int32_t v) {
    atomicAdd(reinterpret_cast<unsigned *>(p), static_cast<unsigned>(v));
}

// A byte has no atomic of its own: the aligned 32-bit word that holds it is
// swapped whole. That word lies inside the byte's allocation, since device
// blocks are aligned to far more than 4 bytes.
__device__ inline unsigned *word_of(const void *p, unsigned *shift) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    *shift = static_cast<unsigned>(a & 3) * 8;
    return reinterpret_cast<unsigned *>(a & ~static_cast<uintptr_t>(3));
}
__device__ inline void atomic_add(uint8_t *p, uint8_t v) {
    unsigned shift;
    unsigned *word = word_of(p, &shift);
    unsigned seen = *word, want;
    do {
        want = seen;
        unsigned sum = ((want >> shift) + v) & 0xffu;
        seen = atomicCAS(word, want, (want & ~(0xffu << shift)) | (sum << shift));
    } while (seen != want);
}
// bool adds as a logical or, as on the CPU.
__device__ inline void atomic_add(Bool *p, Bool v) {
    unsigned shift;
    unsigned *word = word_of(p, &shift);
    atomicOr(word, static_cast<unsigned>(v.v) << shift);
}

template <typename T, typename I>
__global__ void scatter_add_kernel(ct__cuda_iter it, int64_t jump) {
    for (int64_t i = first_of_thread(); i < it.numel; i += grid_step()) {
        int64_t o[3];
        element_offsets<3>(it, i, o);
        int64_t at = load_index<I>(it.data[1] + o[1]);
        atomic_add(reinterpret_cast<T *>(it.data[2] + o[2] + at * jump),
                   *reinterpret_cast<const T *>(it.data[0] + o[0]));
    }
}

} // namespace

extern "C" int ct__cuda_launch_gather(const ct__cuda_iter *it, int esize, int index_dtype,
                                      int64_t jump, void *stream) {
    if (it->numel == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_size(esize, [&](auto t) {
        return by_index(index_dtype, [&](auto i) {
            gather_kernel<decltype(t), decltype(i)>
                <<<blocks_for(it->numel), kThreads, 0, s>>>(*it, jump);
            return launched();
        });
    });
}

extern "C" int ct__cuda_launch_scatter_add(const ct__cuda_iter *it, int dtype, int index_dtype,
                                           int64_t jump, void *stream) {
    if (it->numel == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(dtype, [&](auto t) {
        return by_index(index_dtype, [&](auto i) {
            scatter_add_kernel<decltype(t), decltype(i)>
                <<<blocks_for(it->numel), kThreads, 0, s>>>(*it, jump);
            return launched();
        });
    });
}

// --------------------------------------------------------------- the scan

namespace {

// What is out of range: for an index, a value outside [0, bound) (bound <
// 0: only a negative one); for a probability, one outside [0, 1].
template <typename T, bool Float = std::is_floating_point<typename Acc<T>::type>::value>
struct Range {
    __device__ static bool out(T v, int64_t bound) {
        int64_t x = static_cast<int64_t>(v);
        return x < 0 || (bound >= 0 && x >= bound);
    }
    __device__ static int64_t as_int(T v) { return static_cast<int64_t>(v); }
    __device__ static double as_float(T) { return 0; }
};
template <typename T> struct Range<T, true> {
    __device__ static bool out(T v, int64_t) {
        double p = Conv<T>::to(v);
        return !(p >= 0 && p <= 1);
    }
    __device__ static int64_t as_int(T) { return INT64_MIN; }
    __device__ static double as_float(T v) { return Conv<T>::to(v); }
};

__global__ void scan_init_kernel(ct__cuda_scan *r) {
    *r = ct__cuda_scan{INT64_MAX, INT64_MIN, 0, 0.0};
}

// Each thread meets its positions in increasing order, so its first bad
// one is its smallest; warps combine theirs before one atomic each.
template <typename T>
__global__ void scan_kernel(ct__cuda_iter it, int64_t bound, ct__cuda_scan *r) {
    int64_t first = INT64_MAX, largest = INT64_MIN;
    for (int64_t i = first_of_thread(); i < it.numel; i += grid_step()) {
        int64_t o[1];
        element_offsets<1>(it, i, o);
        T v = *reinterpret_cast<const T *>(it.data[0] + o[0]);
        if (first == INT64_MAX && Range<T>::out(v, bound))
            first = i;
        int64_t x = Range<T>::as_int(v);
        largest = x > largest ? x : largest;
    }
    for (int d = 16; d > 0; d /= 2) {
        long long f = __shfl_down_sync(0xffffffffu, static_cast<long long>(first), d);
        long long m = __shfl_down_sync(0xffffffffu, static_cast<long long>(largest), d);
        first = f < first ? f : first;
        largest = m > largest ? m : largest;
    }
    if (threadIdx.x % 32 != 0)
        return;
    if (first != INT64_MAX)
        atomicMin(reinterpret_cast<long long *>(&r->first), static_cast<long long>(first));
    if (largest != INT64_MIN)
        atomicMax(reinterpret_cast<long long *>(&r->max), static_cast<long long>(largest));
}

// The value at the first bad position, for the message.
template <typename T> __global__ void scan_pick_kernel(ct__cuda_iter it, ct__cuda_scan *r) {
    if (r->first == INT64_MAX)
        return;
    int64_t o[1];
    element_offsets<1>(it, r->first, o);
    T v = *reinterpret_cast<const T *>(it.data[0] + o[0]);
    r->bad_int = Range<T>::as_int(v);
    r->bad_float = Range<T>::as_float(v);
}

template <typename T>
int launch_scan(const ct__cuda_iter &it, int64_t bound, ct__cuda_scan *r, cudaStream_t s) {
    scan_init_kernel<<<1, 1, 0, s>>>(r);
    if (it.numel > 0) {
        scan_kernel<T><<<blocks_for(it.numel), kThreads, 0, s>>>(it, bound, r);
        scan_pick_kernel<T><<<1, 1, 0, s>>>(it, r);
    }
    return launched();
}

} // namespace

extern "C" int ct__cuda_launch_scan(const ct__cuda_iter *it, int dtype, int64_t bound,
                                    ct__cuda_scan *result, void *stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (dtype) {
    case 0: return launch_scan<float>(*it, bound, result, s);
    case 1: return launch_scan<double>(*it, bound, result, s);
    case 2: return launch_scan<__nv_bfloat16>(*it, bound, result, s);
    case 3: return launch_scan<__half>(*it, bound, result, s);
    }
    return by_index<true>(dtype,
                          [&](auto i) { return launch_scan<decltype(i)>(*it, bound, result, s); });
}

// ------------------------------------------------------ one_hot, tril, triu

namespace {

// The output is contiguous: an element's class is its position modulo the
// class count.
template <typename I> __global__ void one_hot_kernel(ct__cuda_iter it, int64_t classes) {
    for (int64_t i = first_of_thread(); i < it.numel; i += grid_step()) {
        int64_t oo, ol;
        offsets(it, i, &oo, &ol);
        int64_t c = oo / static_cast<int64_t>(sizeof(int64_t)) % classes;
        *reinterpret_cast<int64_t *>(it.data[0] + oo) = load_index<I>(it.data[1] + ol) == c;
    }
}

// The output is contiguous: its position gives the row and the column.
template <typename T>
__global__ void band_kernel(ct__cuda_iter it, int64_t rows, int64_t cols, int64_t k, bool upper) {
    for (int64_t i = first_of_thread(); i < it.numel; i += grid_step()) {
        int64_t oo, os;
        offsets(it, i, &oo, &os);
        int64_t at = oo / static_cast<int64_t>(sizeof(T));
        int64_t diff = at % cols - at / cols % rows;
        bool keep = upper ? diff >= k : diff <= k;
        *reinterpret_cast<T *>(it.data[0] + oo) =
            keep ? *reinterpret_cast<const T *>(it.data[1] + os) : T(0);
    }
}

} // namespace

extern "C" int ct__cuda_launch_one_hot(const ct__cuda_iter *it, int labels_dtype, int64_t classes,
                                       void *stream) {
    if (it->numel == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_index<true>(labels_dtype, [&](auto i) {
        one_hot_kernel<decltype(i)><<<blocks_for(it->numel), kThreads, 0, s>>>(*it, classes);
        return launched();
    });
}

extern "C" int ct__cuda_launch_band(const ct__cuda_iter *it, int esize, int64_t rows, int64_t cols,
                                    int64_t k, int upper, void *stream) {
    if (it->numel == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_size(esize, [&](auto t) {
        band_kernel<decltype(t)>
            <<<blocks_for(it->numel), kThreads, 0, s>>>(*it, rows, cols, k, upper != 0);
        return launched();
    });
}

// ------------------------------------------------------- where, masked_fill

namespace {

// Only the chosen operand is read.
template <typename T>
__global__ void where_kernel(ct__cuda_iter it, ct__cuda_operand b, bool a_scalar, T a_value) {
    for (int64_t i = first_of_thread(); i < it.numel; i += grid_step()) {
        int64_t o[3], ob = 0, j = i;
        o[0] = o[1] = o[2] = 0;
        for (int d = 0; d < it.ndim; d++) {
            int64_t idx = j % it.shape[d];
            j /= it.shape[d];
            o[0] += idx * it.strides[d][0];
            o[1] += idx * it.strides[d][1];
            o[2] += idx * it.strides[d][2];
            ob += idx * b.strides[d];
        }
        T v;
        if (*reinterpret_cast<const uint8_t *>(it.data[1] + o[1]))
            v = a_scalar ? a_value : *reinterpret_cast<const T *>(it.data[2] + o[2]);
        else
            v = *reinterpret_cast<const T *>(b.data + ob);
        *reinterpret_cast<T *>(it.data[0] + o[0]) = v;
    }
}

} // namespace

extern "C" int ct__cuda_launch_where(const ct__cuda_iter *it, const ct__cuda_operand *b, int esize,
                                     const uint64_t *a_bits, void *stream) {
    if (it->numel == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_size(esize, [&](auto t) {
        using T = decltype(t);
        // The value's bytes are the first esize of *a_bits, as the CPU
        // stores them.
        T value = 0;
        if (a_bits)
            memcpy(&value, a_bits, sizeof value);
        where_kernel<T>
            <<<blocks_for(it->numel), kThreads, 0, s>>>(*it, *b, a_bits != nullptr, value);
        return launched();
    });
}

// ------------------------------------------------------------------ draws

namespace {

// Block b of the draw writes elements [b * per_block, (b + 1) * per_block),
// each from (seed, offset, b) alone, through philox.h's code. The affine
// map is an fma, as on the CPU, so that both round alike.
template <typename T> __global__ void draw_kernel(ct__draw d, int64_t nblocks) {
    T *out = reinterpret_cast<T *>(d.out);
    for (int64_t b = first_of_thread(); b < nblocks; b += grid_step()) {
        double u[4];
        ct__philox_draw(d.seed, d.offset, static_cast<uint64_t>(b), d.per_block, d.bits,
                        d.kind == CT__DRAW_NORMAL, u);
        int64_t first = b * d.per_block;
        for (int j = 0; j < d.per_block && first + j < d.n; j++) {
            double x;
            if (d.kind == CT__DRAW_BERNOULLI)
                x = u[j] < (d.p_in_out ? Conv<T>::to(out[first + j]) : d.a);
            else
                x = fma(d.b, u[j], d.a);
            out[first + j] = Conv<T>::from(x);
        }
    }
}

} // namespace

extern "C" int ct__cuda_launch_draw(const ct__draw *d, void *stream) {
    if (d->n == 0)
        return 0;
    int64_t nblocks = (d->n + d->per_block - 1) / d->per_block;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_dtype(d->dtype, [&](auto t) {
        draw_kernel<decltype(t)><<<blocks_for(nblocks), kThreads, 0, s>>>(*d, nblocks);
        return launched();
    });
}
