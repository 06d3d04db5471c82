// ct's reduction kernels (cuda_kernels.h): reductions over any set of dims,
// softmax and log_softmax along a dim, cross-entropy and layer norm with
// their backwards.
//
// Every kernel gives each output (or row) a group of lanes: blockDim.x
// lanes of a block work on one output and blockDim.y outputs share the
// block. Short or strided rows get few lanes and many outputs per block;
// long contiguous rows a whole block. A group combines its lanes' partials
// in a fixed order, so results do not depend on timing.
#include "kernels_common.cuh"

#include <cmath>
#include <cstdint>

using namespace ct_cuda;

namespace {

// Threads per block for every kernel here.
constexpr int kBlock = 256;
// Blocks that keep every SM of an H100 or H200 busy a few times over; a
// grid smaller than this splits long reductions.
constexpr int64_t kFillBlocks = 512;

template <typename T>
constexpr bool kFloat = std::is_floating_point<T>::value || std::is_same<T, __half>::value ||
                        std::is_same<T, __nv_bfloat16>::value;

template <typename C> __device__ inline bool is_nan(C x) { return x != x; }

// by_dtype for the kernels that take float dtypes only.
template <typename F> int by_float_dtype(int dtype, F &&f) {
    return by_dtype(dtype, [&](auto t) -> int {
        if constexpr (kFloat<decltype(t)>)
            return f(t);
        else
            return static_cast<int>(cudaErrorInvalidValue);
    });
}

// The same for float32 and float64, the dtypes cross-entropy computes in.
template <typename F> int by_wide_float(int dtype, F &&f) {
    switch (dtype) {
    case 0: return f(float());
    case 1: return f(double());
    }
    return static_cast<int>(cudaErrorInvalidValue);
}

// An element in the compute type C: integers never pass through double.
template <typename C, typename T> __device__ inline C to_comp(T v) {
    if constexpr (std::is_same<C, int64_t>::value)
        return Elem<T>::load(v);
    else
        return static_cast<C>(Conv<T>::to(v));
}

template <typename T> __device__ inline T load_at(const char *p) {
    return *reinterpret_cast<const T *>(p);
}

int64_t pow2_ceil(int64_t n) {
    int64_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

__device__ inline int64_t esize_of(int dtype) {
    switch (dtype) {
    case 1:
    case 4: return 8;
    case 0:
    case 5: return 4;
    case 2:
    case 3: return 2;
    default: return 1;
    }
}

// Stores v into an element of dtype, as ct__tensor_store_double does on the CPU.
__device__ inline void put_double(char *p, int dtype, double v) {
    switch (dtype) {
    case 0: *reinterpret_cast<float *>(p) = static_cast<float>(v); return;
    case 1: *reinterpret_cast<double *>(p) = v; return;
    case 2: *reinterpret_cast<__nv_bfloat16 *>(p) = Conv<__nv_bfloat16>::from(v); return;
    case 3: *reinterpret_cast<__half *>(p) = Conv<__half>::from(v); return;
    case 4: *reinterpret_cast<int64_t *>(p) = static_cast<int64_t>(v); return;
    case 5: *reinterpret_cast<int32_t *>(p) = static_cast<int32_t>(v); return;
    case 6: *reinterpret_cast<uint8_t *>(p) = static_cast<uint8_t>(static_cast<int64_t>(v)); return;
    default: *reinterpret_cast<uint8_t *>(p) = v != 0.0; return;
    }
}

// Stores an integer result as reduce.c's store_int does.
__device__ inline void put_int(char *p, int dtype, int64_t v) {
    switch (dtype) {
    case 4: *reinterpret_cast<int64_t *>(p) = v; return;
    case 5: *reinterpret_cast<int32_t *>(p) = static_cast<int32_t>(v); return;
    case 6: *reinterpret_cast<uint8_t *>(p) = static_cast<uint8_t>(v); return;
    case 7: *reinterpret_cast<uint8_t *>(p) = v != 0; return;
    default: put_double(p, dtype, static_cast<double>(v)); return;
    }
}

// The input and output byte offsets of point i of a space.
struct Offsets {
    int64_t in, out;
};

__device__ inline Offsets point(const ct__cuda_red_space &s, int64_t i) {
    Offsets o{0, 0};
    for (int d = 0; d < s.ndim; d++) {
        // The outermost dim takes what is left: no division for one dim.
        int64_t idx = d + 1 < s.ndim ? i % s.shape[d] : i;
        i /= d + 1 < s.ndim ? s.shape[d] : 1;
        o.in += idx * s.in[d];
        o.out += idx * s.out[d];
    }
    return o;
}

__device__ inline int64_t in_offset(const ct__cuda_red_space &s, int64_t i) {
    if (s.ndim == 1)
        return i * s.in[0];
    int64_t o = 0;
    for (int d = 0; d < s.ndim; d++) {
        int64_t idx = d + 1 < s.ndim ? i % s.shape[d] : i;
        i /= d + 1 < s.ndim ? s.shape[d] : 1;
        o += idx * s.in[d];
    }
    return o;
}

// Combines v across the blockDim.x lanes of each group; every lane gets
// the result. All threads of the block call it together. sh holds 32
// values of C, for groups of a whole block (blockDim.y 1).
template <typename C, typename Op> __device__ C group_reduce(C v, Op op, C *sh) {
    int gx = static_cast<int>(blockDim.x);
    for (int o = (gx < 32 ? gx : 32) / 2; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (gx <= 32)
        return v;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); // the previous call's readers are done with sh
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    C r = sh[0];
    for (int w = 1; w < gx / 32; w++)
        r = op(r, sh[w]);
    return r;
}

struct AddOp {
    template <typename C> __device__ C operator()(C a, C b) const { return a + b; }
};
// NaN wins, so that it propagates.
struct MaxOp {
    template <typename C> __device__ C operator()(C a, C b) const {
        return b > a || is_nan(b) ? b : a;
    }
};

// ------------------------------------------------------------ reductions
//
// A family is a plain struct (it lives in shared memory): init, add (the
// element at reduced position r), merge (another partial) and store (the
// finished output at a byte offset of out).

template <typename C> struct Sum {
    using Tot = typename std::conditional<std::is_same<C, int64_t>::value, uint64_t, double>::type;
    Tot s;
    __device__ void init(const ct__cuda_reduce_args &) { s = 0; }
    __device__ void add(C x, int64_t, const ct__cuda_reduce_args &a) {
        if constexpr (std::is_same<C, int64_t>::value) {
            s += static_cast<uint64_t>(x);
        } else {
            C v = x;
            switch (a.map) {
            case CT__MAP_ABS: v = fabs(x); break;
            case CT__MAP_NZ: v = x != 0 ? C(1) : C(0); break;
            case CT__MAP_POW: v = pow(fabs(x), static_cast<C>(a.scalar)); break;
            case CT__MAP_SQR: v = x * x; break;
            default: break;
            }
            s += static_cast<double>(v);
        }
    }
    __device__ void merge(const Sum &o, const ct__cuda_reduce_args &) { s += o.s; }
    __device__ double value(const ct__cuda_reduce_args &) const { return static_cast<double>(s); }
    __device__ int64_t int_value() const { return static_cast<int64_t>(s); }
};

template <typename C> struct Prod {
    using Tot = typename std::conditional<std::is_same<C, int64_t>::value, uint64_t, double>::type;
    Tot p;
    __device__ void init(const ct__cuda_reduce_args &) { p = 1; }
    __device__ void add(C x, int64_t, const ct__cuda_reduce_args &) { p *= static_cast<Tot>(x); }
    __device__ void merge(const Prod &o, const ct__cuda_reduce_args &) { p *= o.p; }
    __device__ double value(const ct__cuda_reduce_args &) const { return static_cast<double>(p); }
    __device__ int64_t int_value() const { return static_cast<int64_t>(p); }
};

template <typename C> __device__ inline C lowest() {
    if constexpr (std::is_same<C, int64_t>::value)
        return INT64_MIN;
    else
        return -INFINITY;
}
template <typename C> __device__ inline C highest() {
    if constexpr (std::is_same<C, int64_t>::value)
        return INT64_MAX;
    else
        return INFINITY;
}

// max and min (family says which), of x or |x|; NaN propagates.
template <typename C> struct Extreme {
    C m;
    __device__ void init(const ct__cuda_reduce_args &a) {
        m = a.family == CT__RED_MAX ? lowest<C>() : highest<C>();
    }
    __device__ void take(C v, const ct__cuda_reduce_args &a) {
        bool better = a.family == CT__RED_MAX ? v > m : v < m;
        m = better || is_nan(v) ? v : m;
    }
    __device__ void add(C x, int64_t, const ct__cuda_reduce_args &a) {
        if constexpr (!std::is_same<C, int64_t>::value)
            x = a.map == CT__MAP_ABS ? fabs(x) : x;
        take(x, a);
    }
    __device__ void merge(const Extreme &o, const ct__cuda_reduce_args &a) { take(o.m, a); }
    __device__ double value(const ct__cuda_reduce_args &) const { return static_cast<double>(m); }
    __device__ int64_t int_value() const { return static_cast<int64_t>(m); }
};

// Welford's running mean and squared deviations; partials merge with
// Chan's formula, as reduce.c's do.
template <typename C> struct Var {
    int64_t n;
    double mean, m2;
    __device__ void init(const ct__cuda_reduce_args &) {
        n = 0;
        mean = m2 = 0;
    }
    __device__ void add(C x, int64_t, const ct__cuda_reduce_args &) {
        double v = static_cast<double>(x);
        n++;
        double d = v - mean;
        mean += d / static_cast<double>(n);
        m2 += d * (v - mean);
    }
    __device__ void merge(const Var &o, const ct__cuda_reduce_args &) {
        if (o.n == 0)
            return;
        // Into an empty partial, o as it is: delta * delta can overflow, and
        // times na == 0 it would be NaN.
        if (n == 0) {
            *this = o;
            return;
        }
        double na = static_cast<double>(n), nb = static_cast<double>(o.n), t = na + nb;
        double delta = o.mean - mean;
        mean += delta * (nb / t);
        // With na * nb / t >= 1/2, this order overflows only when the term
        // itself does.
        m2 += o.m2 + delta * (delta * (na * nb / t));
        n += o.n;
    }
    __device__ double value(const ct__cuda_reduce_args &a) const {
        double dof = static_cast<double>(n) - a.scalar;
        return m2 / (dof > 0 ? dof : 0);
    }
    __device__ int64_t int_value() const { return 0; }
};

// logsumexp online: the running max m and the sum s of exp(x - m). A
// non-finite max decides the result alone (reduce.c's rule), so s counts
// only while m is finite.
template <typename C> struct Lse {
    C m;
    double s;
    __device__ void init(const ct__cuda_reduce_args &) {
        m = -INFINITY;
        s = 0;
    }
    __device__ void add(C x, int64_t, const ct__cuda_reduce_args &) {
        if (x > m || is_nan(x)) {
            bool keep = isfinite(static_cast<double>(x));
            s = keep
                    ? (isfinite(static_cast<double>(m)) ? s * exp(static_cast<double>(m - x)) : 0) +
                          1
                    : 0;
            m = is_nan(m) ? m : x;
        } else if (isfinite(static_cast<double>(m))) {
            s += static_cast<double>(exp(x - m));
        }
    }
    __device__ void merge(const Lse &o, const ct__cuda_reduce_args &) {
        C t = o.m > m || is_nan(o.m) ? o.m : m;
        if (isfinite(static_cast<double>(t))) {
            double a = isfinite(static_cast<double>(m)) ? s * exp(static_cast<double>(m - t)) : 0;
            double b =
                isfinite(static_cast<double>(o.m)) ? o.s * exp(static_cast<double>(o.m - t)) : 0;
            s = a + b;
        } else {
            s = 0;
        }
        m = t;
    }
    __device__ double value(const ct__cuda_reduce_args &) const {
        double v = static_cast<double>(m);
        return isfinite(v) ? v + log(s) : v;
    }
    __device__ int64_t int_value() const { return 0; }
};

// The extreme and the first index holding it (the first NaN, when there
// is one). The choice depends on values and indices only, so partials of
// interleaved elements merge in any order.
template <typename C> struct Arg {
    C v;
    int64_t i;
    __device__ void init(const ct__cuda_reduce_args &) {
        v = C(0);
        i = -1;
    }
    __device__ void take(C bv, int64_t bi, const ct__cuda_reduce_args &a) {
        if (bi < 0)
            return;
        bool better;
        if (i < 0) {
            better = true;
        } else if (is_nan(v) || is_nan(bv)) {
            better = is_nan(bv) && (!is_nan(v) || bi < i);
        } else if (bv == v) {
            better = bi < i;
        } else {
            better = a.family == CT__RED_ARGMAX ? bv > v : bv < v;
        }
        if (better) {
            v = bv;
            i = bi;
        }
    }
    __device__ void add(C x, int64_t r, const ct__cuda_reduce_args &a) { take(x, r, a); }
    __device__ void merge(const Arg &o, const ct__cuda_reduce_args &a) { take(o.v, o.i, a); }
    __device__ double value(const ct__cuda_reduce_args &) const { return static_cast<double>(v); }
    __device__ int64_t int_value() const { return static_cast<int64_t>(v); }
};

template <typename F> struct IsArg : std::false_type {};
template <typename C> struct IsArg<Arg<C>> : std::true_type {};

__device__ inline double post(const ct__cuda_reduce_args &a, double v) {
    switch (a.post) {
    case CT__POST_MEAN: return v / static_cast<double>(a.nred);
    case CT__POST_SQRT: return sqrt(v);
    case CT__POST_ROOT: return pow(v, 1.0 / a.scalar);
    default: return v;
    }
}

// Writes a finished output at byte offset off of out (and max_dim's index
// at the same element of indices).
template <typename C, typename F>
__device__ void store(const F &f, const ct__cuda_reduce_args &a, int64_t off) {
    if constexpr (IsArg<F>::value) {
        if (a.indices)
            *reinterpret_cast<int64_t *>(a.indices + off / esize_of(a.out_dtype) * 8) = f.i;
        if (a.index_only) {
            *reinterpret_cast<int64_t *>(a.out + off) = f.i;
            return;
        }
    }
    if constexpr (std::is_same<C, int64_t>::value)
        put_int(a.out + off, a.out_dtype, f.int_value());
    else
        put_double(a.out + off, a.out_dtype, post(a, f.value(a)));
}

// Partials of a group in shared memory: the largest family is 24 bytes.
constexpr int kMaxFamily = 32;

template <typename T, typename C, typename F>
__global__ void __launch_bounds__(kBlock)
    reduce_kernel(ct__cuda_reduce_args a, int64_t chunk, int nsplit) {
    static_assert(sizeof(F) <= kMaxFamily, "a family's partial outgrew the shared buffer");
    __shared__ __align__(16) unsigned char shm[kBlock * kMaxFamily];
    F *sh = reinterpret_cast<F *>(shm);
    const int gx = static_cast<int>(blockDim.x), tx = threadIdx.x;
    const int slot = threadIdx.y * gx + tx;
    const int64_t nout = a.kept.numel;
    const int split = static_cast<int>(blockIdx.y);
    const int64_t lo = static_cast<int64_t>(split) * chunk;
    const int64_t hi = lo + chunk < a.nred ? lo + chunk : a.nred;
    // The loop bound is the same for every thread of the block, which all
    // take part in the merge.
    for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y; first < nout;
         first += static_cast<int64_t>(gridDim.x) * blockDim.y) {
        int64_t o = first + threadIdx.y;
        F acc;
        acc.init(a);
        Offsets off{0, 0};
        if (o < nout) {
            off = point(a.kept, o);
            const char *base = a.in + off.in;
            for (int64_t r = lo + tx; r < hi; r += gx)
                acc.add(to_comp<C>(load_at<T>(base + in_offset(a.red, r))), r, a);
        }
        if (gx > 1) {
            sh[slot] = acc;
            __syncthreads();
            for (int s = gx / 2; s > 0; s >>= 1) {
                if (tx < s)
                    sh[slot].merge(sh[slot + s], a);
                __syncthreads();
            }
            acc = sh[slot - tx];
            __syncthreads();
        }
        if (tx == 0 && o < nout) {
            if (nsplit == 1)
                store<C>(acc, a, off.out);
            else
                reinterpret_cast<F *>(a.workspace)[o * nsplit + split] = acc;
        }
    }
}

// Merges each output's split partials in split order.
template <typename C, typename F>
__global__ void reduce_merge_kernel(ct__cuda_reduce_args a, int nsplit) {
    const F *part = reinterpret_cast<const F *>(a.workspace);
    for (int64_t o = first_of_thread(); o < a.kept.numel; o += grid_step()) {
        F acc = part[o * nsplit];
        for (int s = 1; s < nsplit; s++)
            acc.merge(part[o * nsplit + s], a);
        store<C>(acc, a, point(a.kept, o).out);
    }
}

struct RedShape {
    int gx, gy;
    unsigned blocks;
    int nsplit;
    int64_t chunk;
};

// Lanes per output, outputs per block, and splits of long reductions.
RedShape red_shape(const ct__cuda_reduce_args &a) {
    int64_t nout = a.kept.numel, nred = a.nred;
    int64_t red_step = a.red.in[0] < 0 ? -a.red.in[0] : a.red.in[0];
    int64_t kept_step = a.kept.in[0] < 0 ? -a.kept.in[0] : a.kept.in[0];
    // Reduced elements nearer each other than outputs are: lanes read
    // neighbours. Otherwise neighbouring outputs go to neighbouring lanes.
    bool inner = a.kept.numel == 1 || red_step <= kept_step;
    RedShape r;
    if (inner)
        r.gx = static_cast<int>(pow2_ceil(nred < kBlock ? (nred > 0 ? nred : 1) : kBlock));
    else
        r.gx = kBlock / static_cast<int>(pow2_ceil(nout < kBlock ? nout : kBlock));
    r.gy = kBlock / r.gx;
    int64_t groups = (nout + r.gy - 1) / r.gy;
    r.blocks = static_cast<unsigned>(groups < 65536 ? groups : 65536);
    r.nsplit = 1;
    r.chunk = nred > 0 ? nred : 1;
    int64_t per_lane = 256;
    if (groups < kFillBlocks && nred > r.gx * per_lane) {
        int64_t want = (kFillBlocks + groups - 1) / groups;
        int64_t most = (nred + r.gx * per_lane - 1) / (r.gx * per_lane);
        int64_t n = want < most ? want : most;
        n = n < 65535 ? n : 65535;
        r.chunk = (nred + n - 1) / n;
        r.nsplit = static_cast<int>((nred + r.chunk - 1) / r.chunk);
    }
    return r;
}

// Calls f with the input's element type, its compute type and the family.
template <typename Fn> int by_family(const ct__cuda_reduce_args &a, Fn &&fn) {
    return by_dtype(a.in_dtype, [&](auto t) -> int {
        using T = decltype(t);
        constexpr bool fl = kFloat<T>;
        using C = typename std::conditional<fl, typename Acc<T>::type, int64_t>::type;
        using L = typename std::conditional<fl, typename Acc<T>::type, float>::type;
        switch (a.family) {
        case CT__RED_SUM: return fn(T(), C(), Sum<C>());
        case CT__RED_PROD: return fn(T(), C(), Prod<C>());
        case CT__RED_MAX:
        case CT__RED_MIN: return fn(T(), C(), Extreme<C>());
        case CT__RED_LSE: return fn(T(), L(), Lse<L>());
        case CT__RED_ARGMAX:
        case CT__RED_ARGMIN: return fn(T(), C(), Arg<C>());
        case CT__RED_VAR:
            if constexpr (fl)
                return fn(T(), C(), Var<C>());
            break;
        }
        return static_cast<int>(cudaErrorInvalidValue);
    });
}

} // namespace

extern "C" int64_t ct__cuda_reduce_workspace(const ct__cuda_reduce_args *a) {
    if (a->kept.numel == 0)
        return 0;
    RedShape r = red_shape(*a);
    if (r.nsplit == 1)
        return 0;
    int64_t size = 0;
    by_family(*a, [&](auto, auto, auto f) {
        size = static_cast<int64_t>(sizeof(f));
        return 0;
    });
    return size * a->kept.numel * r.nsplit;
}

extern "C" int ct__cuda_launch_reduce(const ct__cuda_reduce_args *a, void *stream) {
    if (a->kept.numel == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    RedShape r = red_shape(*a);
    if (r.nsplit > 1 && !a->workspace)
        return static_cast<int>(cudaErrorInvalidValue);
    return by_family(*a, [&](auto t, auto c, auto f) {
        using T = decltype(t);
        using C = decltype(c);
        using F = decltype(f);
        dim3 grid(r.blocks, static_cast<unsigned>(r.nsplit)), block(r.gx, r.gy);
        reduce_kernel<T, C, F><<<grid, block, 0, s>>>(*a, r.chunk, r.nsplit);
        if (r.nsplit > 1)
            reduce_merge_kernel<C, F><<<blocks_for(a->kept.numel), kThreads, 0, s>>>(*a, r.nsplit);
        return launched();
    });
}

// --------------------------------------------------------------- softmax

namespace {

// Lanes per row: a power of two up to a warp for short rows, a block of
// kBlock for long ones; one lane per row when rows lie closer together
// than a row's elements, and there are enough of them.
int row_lanes(int64_t n, bool strided, int64_t nrows) {
    if (strided && nrows >= 4096)
        return 1;
    if (n > 2048)
        return kBlock;
    return static_cast<int>(pow2_ceil(n < 32 ? (n > 0 ? n : 1) : 32));
}

unsigned row_blocks(int64_t nrows, int gy) {
    int64_t b = (nrows + gy - 1) / gy;
    return static_cast<unsigned>(b < 65536 ? b : 65536);
}

// Three passes over a row, as on the CPU: its max, the sum of exp(x - max),
// then the output.
template <typename T>
__global__ void __launch_bounds__(kBlock) softmax_kernel(ct__cuda_rows r, int log_out) {
    using C = typename Acc<T>::type;
    __shared__ C sh[32];
    const int gx = static_cast<int>(blockDim.x), tx = threadIdx.x;
    for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y; first < r.rows.numel;
         first += static_cast<int64_t>(gridDim.x) * blockDim.y) {
        int64_t row = first + threadIdx.y;
        bool live = row < r.rows.numel;
        Offsets off = live ? point(r.rows, row) : Offsets{0, 0};
        const char *x = r.in + off.in;
        char *y = r.out + off.out;
        int64_t n = live ? r.n : 0;
        C m = -INFINITY;
        for (int64_t k = tx; k < n; k += gx)
            m = MaxOp()(m, to_comp<C>(load_at<T>(x + k * r.in_step)));
        m = group_reduce(m, MaxOp(), sh);
        C s = 0;
        for (int64_t k = tx; k < n; k += gx)
            s += exp(to_comp<C>(load_at<T>(x + k * r.in_step)) - m);
        s = group_reduce(s, AddOp(), sh);
        // (v - m) - log(s), not v - (m + log(s)): the sum would round log(s)
        // to the spacing of v (softmax.c's rule).
        C ls = log(s), inv = C(1) / s;
        for (int64_t k = tx; k < n; k += gx) {
            C v = to_comp<C>(load_at<T>(x + k * r.in_step));
            *reinterpret_cast<T *>(y + k * r.out_step) =
                Conv<T>::from(static_cast<double>(log_out ? (v - m) - ls : exp(v - m) * inv));
        }
    }
}

} // namespace

extern "C" int ct__cuda_launch_softmax(const ct__cuda_rows *r, int dtype, int log, void *stream) {
    if (r->rows.numel == 0 || r->n == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int64_t step = r->in_step < 0 ? -r->in_step : r->in_step;
    int64_t row_step = r->rows.in[0] < 0 ? -r->rows.in[0] : r->rows.in[0];
    int gx = row_lanes(r->n, r->rows.numel > 1 && step > row_step, r->rows.numel);
    int gy = kBlock / gx;
    dim3 block(gx, gy);
    unsigned blocks = row_blocks(r->rows.numel, gy);
    return by_float_dtype(dtype, [&](auto t) {
        softmax_kernel<decltype(t)><<<blocks, block, 0, s>>>(*r, log);
        return launched();
    });
}

// --------------------------------------------------------- cross-entropy

namespace {

// One row per group: the row's max, the sums of exp(x - max) and of
// x - max, and the loss from them, as the CPU's ce_forward computes them (in
// T). lse [2, n] gets the maxima, then the logs of the sums of exp.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    ce_forward_kernel(const T *x, const int64_t *t, T *lse, double *loss, int64_t n, int64_t c,
                      int64_t ignore, double smoothing) {
    __shared__ T sh[32];
    const int gx = static_cast<int>(blockDim.x), tx = threadIdx.x;
    double on = 1 - smoothing, off = smoothing / static_cast<double>(c);
    for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y; first < n;
         first += static_cast<int64_t>(gridDim.x) * blockDim.y) {
        int64_t i = first + threadIdx.y;
        int64_t len = i < n ? c : 0;
        const T *r = x + (i < n ? i : 0) * c;
        T m = -INFINITY;
        for (int64_t k = tx; k < len; k += gx)
            m = MaxOp()(m, r[k]);
        m = group_reduce(m, MaxOp(), sh);
        T s = 0, dev = 0;
        for (int64_t k = tx; k < len; k += gx) {
            T d = r[k] - m;
            s += exp(d);
            dev += d;
        }
        s = group_reduce(s, AddOp(), sh);
        dev = group_reduce(dev, AddOp(), sh);
        if (tx == 0 && i < n) {
            T ls = log(s);
            lse[i] = m;
            lse[n + i] = ls;
            int64_t k = t[i];
            double smooth = off > 0 ? off * static_cast<double>(dev) : 0;
            loss[i] = k == ignore
                          ? 0
                          : static_cast<double>(ls) +
                                on * (static_cast<double>(m) - static_cast<double>(r[k])) - smooth;
        }
    }
}

template <typename T>
__global__ void ce_backward_kernel(const T *x, const int64_t *t, const T *lse, const T *scale,
                                   int64_t scale_stride, T *g, int64_t n, int64_t c, int64_t ignore,
                                   T on, T off) {
    for (int64_t e = first_of_thread(); e < n * c; e += grid_step()) {
        int64_t i = e / c, k = e % c, target = t[i];
        if (target == ignore) {
            g[e] = 0;
            continue;
        }
        T s = scale[i * scale_stride];
        T v = (exp((x[e] - lse[i]) - lse[n + i]) - off) * s;
        g[e] = k == target ? v - on * s : v;
    }
}

} // namespace

extern "C" int ct__cuda_launch_cross_entropy(const void *x, const int64_t *t, void *lse,
                                             double *loss, int64_t n, int64_t c, int64_t ignore,
                                             double smoothing, int dtype, void *stream) {
    if (n == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int gx = row_lanes(c, false, n), gy = kBlock / gx;
    return by_wide_float(dtype, [&](auto v) {
        using T = decltype(v);
        ce_forward_kernel<T><<<row_blocks(n, gy), dim3(gx, gy), 0, s>>>(
            static_cast<const T *>(x), t, static_cast<T *>(lse), loss, n, c, ignore, smoothing);
        return launched();
    });
}

extern "C" int ct__cuda_launch_cross_entropy_backward(const void *x, const int64_t *t,
                                                      const void *lse, const void *scale,
                                                      int64_t scale_stride, void *grad, int64_t n,
                                                      int64_t c, int64_t ignore, double smoothing,
                                                      int dtype, void *stream) {
    if (n == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    double on = 1 - smoothing, off = smoothing / static_cast<double>(c);
    return by_wide_float(dtype, [&](auto v) {
        using T = decltype(v);
        ce_backward_kernel<T><<<blocks_for(n * c), kThreads, 0, s>>>(
            static_cast<const T *>(x), t, static_cast<const T *>(lse),
            static_cast<const T *>(scale), scale_stride, static_cast<T *>(grad), n, c, ignore,
            static_cast<T>(on), static_cast<T>(off));
        return launched();
    });
}

// ------------------------------------------------------------ layer norm

namespace {

// One row per group: mean, then the mean squared deviation (two passes, in
// the compute type), then the output.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    layer_norm_kernel(const T *x, const T *w, const T *b, T *y, typename Acc<T>::type *mean,
                      typename Acc<T>::type *rstd, int64_t rows, int64_t d, double eps) {
    using C = typename Acc<T>::type;
    __shared__ C sh[32];
    const int gx = static_cast<int>(blockDim.x), tx = threadIdx.x;
    for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y; first < rows;
         first += static_cast<int64_t>(gridDim.x) * blockDim.y) {
        int64_t i = first + threadIdx.y;
        int64_t len = i < rows ? d : 0;
        const T *r = x + (i < rows ? i : 0) * d;
        C s = 0;
        for (int64_t k = tx; k < len; k += gx)
            s += to_comp<C>(r[k]);
        C mu = group_reduce(s, AddOp(), sh) / static_cast<C>(d);
        C q = 0;
        for (int64_t k = tx; k < len; k += gx) {
            C v = to_comp<C>(r[k]) - mu;
            q += v * v;
        }
        C var = group_reduce(q, AddOp(), sh) / static_cast<C>(d);
        C rs = C(1) / sqrt(var + static_cast<C>(eps));
        for (int64_t k = tx; k < len; k += gx) {
            C v = (to_comp<C>(r[k]) - mu) * rs;
            if (w)
                v *= to_comp<C>(w[k]);
            if (b)
                v += to_comp<C>(b[k]);
            y[i * d + k] = Conv<T>::from(static_cast<double>(v));
        }
        if (tx == 0 && i < rows) {
            mean[i] = mu;
            rstd[i] = rs;
        }
    }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per row, g = dy * w.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    layer_norm_dx_kernel(const T *dy, const T *x, const T *w, const typename Acc<T>::type *mean,
                         const typename Acc<T>::type *rstd, T *dx, int64_t rows, int64_t d) {
    using C = typename Acc<T>::type;
    __shared__ C sh[32];
    const int gx = static_cast<int>(blockDim.x), tx = threadIdx.x;
    for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y; first < rows;
         first += static_cast<int64_t>(gridDim.x) * blockDim.y) {
        int64_t i = first + threadIdx.y;
        int64_t len = i < rows ? d : 0, base = (i < rows ? i : 0) * d;
        C mu = i < rows ? mean[i] : C(0), rs = i < rows ? rstd[i] : C(0);
        C sg = 0, sgx = 0;
        for (int64_t k = tx; k < len; k += gx) {
            C g = to_comp<C>(dy[base + k]) * (w ? to_comp<C>(w[k]) : C(1));
            sg += g;
            sgx += g * (to_comp<C>(x[base + k]) - mu) * rs;
        }
        sg = group_reduce(sg, AddOp(), sh) / static_cast<C>(d);
        sgx = group_reduce(sgx, AddOp(), sh) / static_cast<C>(d);
        for (int64_t k = tx; k < len; k += gx) {
            C g = to_comp<C>(dy[base + k]) * (w ? to_comp<C>(w[k]) : C(1));
            C xhat = (to_comp<C>(x[base + k]) - mu) * rs;
            dx[base + k] = Conv<T>::from(static_cast<double>(rs * (g - sg - xhat * sgx)));
        }
    }
}

// dw[j] = sum over rows of dy * xhat, db[j] = sum of dy: 32 columns per
// block, blockDim.y lanes down the rows, combined in lane order.
constexpr int kCols = 32, kRowLanes = kBlock / kCols;

template <typename T>
__global__ void __launch_bounds__(kBlock)
    layer_norm_dwdb_kernel(const T *dy, const T *x, const typename Acc<T>::type *mean,
                           const typename Acc<T>::type *rstd, T *dw, T *db, int64_t rows,
                           int64_t d) {
    using C = typename Acc<T>::type;
    __shared__ C shw[kRowLanes][kCols], shb[kRowLanes][kCols];
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t col0 = static_cast<int64_t>(blockIdx.x) * kCols; col0 < d;
         col0 += static_cast<int64_t>(gridDim.x) * kCols) {
        int64_t j = col0 + tx;
        C sw = 0, sb = 0;
        if (j < d)
            for (int64_t i = ty; i < rows; i += kRowLanes) {
                C g = to_comp<C>(dy[i * d + j]);
                sw += g * (to_comp<C>(x[i * d + j]) - mean[i]) * rstd[i];
                sb += g;
            }
        shw[ty][tx] = sw;
        shb[ty][tx] = sb;
        __syncthreads();
        if (ty == 0 && j < d) {
            for (int k = 1; k < kRowLanes; k++) {
                sw += shw[k][tx];
                sb += shb[k][tx];
            }
            if (dw)
                dw[j] = Conv<T>::from(static_cast<double>(sw));
            if (db)
                db[j] = Conv<T>::from(static_cast<double>(sb));
        }
        __syncthreads();
    }
}

} // namespace

extern "C" int ct__cuda_launch_layer_norm(const void *x, const void *w, const void *b, void *y,
                                          void *mean, void *rstd, int64_t rows, int64_t d,
                                          double eps, int dtype, void *stream) {
    if (rows == 0 || d == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int gx = row_lanes(d, false, rows), gy = kBlock / gx;
    return by_float_dtype(dtype, [&](auto v) {
        using T = decltype(v);
        using C = typename Acc<T>::type;
        layer_norm_kernel<T><<<row_blocks(rows, gy), dim3(gx, gy), 0, s>>>(
            static_cast<const T *>(x), static_cast<const T *>(w), static_cast<const T *>(b),
            static_cast<T *>(y), static_cast<C *>(mean), static_cast<C *>(rstd), rows, d, eps);
        return launched();
    });
}

extern "C" int ct__cuda_launch_layer_norm_backward(const void *dy, const void *x, const void *w,
                                                   const void *mean, const void *rstd, void *dx,
                                                   void *dw, void *db, int64_t rows, int64_t d,
                                                   int dtype, void *stream) {
    if (d == 0)
        return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return by_float_dtype(dtype, [&](auto v) {
        using T = decltype(v);
        using C = typename Acc<T>::type;
        const T *tdy = static_cast<const T *>(dy), *tx = static_cast<const T *>(x);
        const C *tm = static_cast<const C *>(mean), *tr = static_cast<const C *>(rstd);
        if (dx && rows > 0) {
            int gx = row_lanes(d, false, rows), gy = kBlock / gx;
            layer_norm_dx_kernel<T><<<row_blocks(rows, gy), dim3(gx, gy), 0, s>>>(
                tdy, tx, static_cast<const T *>(w), tm, tr, static_cast<T *>(dx), rows, d);
        }
        if (dw || db) {
            int64_t tiles = (d + kCols - 1) / kCols;
            layer_norm_dwdb_kernel<T>
                <<<static_cast<unsigned>(tiles < 65536 ? tiles : 65536), dim3(kCols, kRowLanes), 0,
                   s>>>(tdy, tx, tm, tr, static_cast<T *>(dw), static_cast<T *>(db), rows, d);
        }
        return launched();
    });
}
