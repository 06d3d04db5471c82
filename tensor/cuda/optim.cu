// The optimizers' fused update on a CUDA device: optim_rules.h's rules, one
// element per thread, grid-stride. Built with --fmad=false (CMakeLists.txt)
// so that, with CUDA's correctly rounded division and square root, a step
// gives the CPU loops' bits.
#include "kernels_common.cuh"

using ct_cuda::blocks_for;
using ct_cuda::first_of_thread;
using ct_cuda::grid_step;
using ct_cuda::kThreads;
using ct_cuda::launched;

namespace {

// What the host decided once per launch: which rule and which of its
// branches (the same for every thread).
struct Flags {
    bool adam, wd, nesterov, decoupled, amsgrad;
    int mode;
};

template <typename T> __device__ T root(T v) { return sqrt(v); }

template <typename T>
__global__ void update_kernel(ct__optim_hyper h, Flags f, T *p, const T *g, T *b0, T *b1, T *b2,
                              int64_t n) {
    for (int64_t i = first_of_thread(); i < n; i += grid_step()) {
        T x = p[i], d = g[i];
        if (!f.adam) {
            T b = f.mode == 2 ? b0[i] : T(0);
            CT__SGD_RULE(T, x, d, b, T(h.lr), T(h.weight_decay), T(h.momentum), T(1 - h.dampening),
                         f.wd, f.mode, f.nesterov);
            if (f.mode != 0)
                b0[i] = b;
        } else {
            T m = b0[i], v = b1[i], vm = f.amsgrad ? b2[i] : T(0);
            CT__ADAM_RULE(T, root, x, d, m, v, vm, T(h.beta1), T(1 - h.beta1), T(h.beta2),
                          T(1 - h.beta2), T(h.eps), T(h.decay), T(h.weight_decay), T(h.bc2_sqrt),
                          T(h.step_size), f.decoupled, f.wd, f.amsgrad);
            b0[i] = m;
            b1[i] = v;
            if (f.amsgrad)
                b2[i] = vm;
        }
        p[i] = x;
    }
}

template <typename T>
int launch(const ct__optim_hyper &h, const Flags &f, char *p, const char *g, char *const *bufs,
           int64_t n, cudaStream_t s) {
    update_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
        h, f, reinterpret_cast<T *>(p), reinterpret_cast<const T *>(g),
        reinterpret_cast<T *>(bufs[0]), reinterpret_cast<T *>(bufs[1]),
        reinterpret_cast<T *>(bufs[2]), n);
    return launched();
}

} // namespace

// adam: 0 SGD, 1 Adam, 2 AdamW; f64: float64 (else float32). Returns a
// cudaError_t.
extern "C" int ct__cuda_launch_optim(const ct__optim_hyper *h, int adam, int f64, char *p,
                                     const char *g, char *const *bufs, int64_t n, void *stream) {
    if (n == 0)
        return 0;
    Flags f = {adam != 0,   adam == 1 ? h->weight_decay != 0 : adam == 0 && h->weight_decay != 0,
               h->nesterov, adam == 2,
               h->amsgrad,  h->momentum == 0 ? 0 : h->first ? 1 : 2};
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return f64 ? launch<double>(*h, f, p, g, bufs, n, s) : launch<float>(*h, f, p, g, bufs, n, s);
}
