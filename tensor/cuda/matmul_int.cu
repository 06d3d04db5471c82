// Integer matmul on the device (cuda_kernels.h): int64, wrapping as on the
// CPU, over any strides. cuBLAS has no integer GEMM that wraps in 64 bits,
// and integer matmul is for correctness, not speed: each block computes a
// kTile x kTile tile of c from tiles of a and b staged in shared memory.
#include "kernels_common.cuh"

namespace {

constexpr int kTile = 16;
// Grid dims y and z hold at most 65535; the loops cover the rest.
constexpr int64_t kMaxGrid = 65535;

__global__ void matmul_int_kernel(ct__mm_plan p) {
    __shared__ int64_t ta[kTile][kTile], tb[kTile][kTile];
    const int64_t *a = reinterpret_cast<const int64_t *>(p.a.data);
    const int64_t *b = reinterpret_cast<const int64_t *>(p.b.data);
    int64_t *c = reinterpret_cast<int64_t *>(p.c);
    int tx = threadIdx.x, ty = threadIdx.y;
    // Every thread of a block runs the same iterations, so the barriers
    // inside are reached by all.
    for (int64_t batch = blockIdx.z; batch < p.nb; batch += gridDim.z) {
        int64_t ao = 0, bo = 0, rem = batch;
        for (int d = p.nbatch - 1; d >= 0; d--) {
            int64_t i = rem % p.batch[d];
            rem /= p.batch[d];
            ao += i * p.a.bstrides[d];
            bo += i * p.b.bstrides[d];
        }
        for (int64_t r0 = blockIdx.y * int64_t(kTile); r0 < p.m; r0 += gridDim.y * int64_t(kTile))
            for (int64_t c0 = blockIdx.x * int64_t(kTile); c0 < p.n;
                 c0 += gridDim.x * int64_t(kTile)) {
                int64_t row = r0 + ty, col = c0 + tx;
                uint64_t acc = 0;
                for (int64_t q0 = 0; q0 < p.k; q0 += kTile) {
                    ta[ty][tx] =
                        row < p.m && q0 + tx < p.k ? a[ao + row * p.a.rs + (q0 + tx) * p.a.cs] : 0;
                    tb[ty][tx] =
                        q0 + ty < p.k && col < p.n ? b[bo + (q0 + ty) * p.b.rs + col * p.b.cs] : 0;
                    __syncthreads();
#pragma unroll
                    for (int q = 0; q < kTile; q++)
                        acc += static_cast<uint64_t>(ta[ty][q]) * static_cast<uint64_t>(tb[q][tx]);
                    __syncthreads();
                }
                if (row < p.m && col < p.n)
                    c[(batch * p.m + row) * p.n + col] = static_cast<int64_t>(acc);
            }
    }
}

unsigned grid_for(int64_t n) {
    int64_t g = (n + kTile - 1) / kTile;
    return static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid);
}

} // namespace

extern "C" int ct__cuda_launch_matmul_int(const ct__mm_plan *p, void *stream) {
    dim3 grid(grid_for(p->n), grid_for(p->m),
              static_cast<unsigned>(p->nb < kMaxGrid ? p->nb : kMaxGrid));
    matmul_int_kernel<<<grid, dim3(kTile, kTile), 0, static_cast<cudaStream_t>(stream)>>>(*p);
    return ct_cuda::launched();
}
