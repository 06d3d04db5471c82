/* ct__cpu_sgemm: ct's own float32 GEMM for x86-64 CPUs with AVX2 and FMA,
 * for thin products; OpenBLAS computes the rest.
 *
 * Why not OpenBLAS alone: the products of training a small transformer are
 * tall and thin (4096 x 128 by 128 x 384, say). perf on examples/gpt showed
 * OpenBLAS spending a quarter of its time outside its kernel, repacking both
 * operands block by block and running a separate pass that zeroes C before
 * every beta = 0 call. Here:
 *  - the left operand A is read in place when its rows are contiguous, and
 *    packed (6 rows interleaved) only when it is transposed, where reading
 *    it in place would use a few floats of each cache line;
 *  - the right operand B is packed into 16-column panels, all of k at once
 *    when that fits in half of L2, which for these shapes is once per call;
 *  - C is written by the kernel alone (beta = 0 stores, other betas load),
 *    and each row block of C is finished while it is in cache.
 *
 * The loops follow BLIS's layering (Van Zee and van de Geijn, "BLIS: A
 * Framework for Rapidly Instantiating BLAS Functionality", ACM TOMS 2015):
 * columns in NC blocks, k in KC blocks (B's block packed), rows in MC
 * blocks, then a 6 x 16 register tile whose B panel stays in L1 while the
 * tile walks down the rows. On Zen 3 the tile's 12 accumulators cover the
 * FMA units' latency (2 units x 4 cycles), and each k costs 12 FMAs against
 * 8 loads, so the kernel is FMA-bound: with its operands in L1 it ran as
 * fast as a loop of FMAs alone.
 *
 * Each element of C is summed over k in one fixed order, KC block by KC
 * block, whatever rows a call covers: results do not depend on how
 * ct_matmul splits C's rows across threads.
 *
 * CPUs without AVX2 and FMA, and calls for which a thread's pack buffer
 * cannot be allocated, go to OpenBLAS's cblas_sgemm. */
#include "tensor_impl.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMM_X86 1
#include <immintrin.h>
#else
#define GEMM_X86 0
#endif

enum {
    MR = 6,    /* register tile rows */
    NR = 16,   /* register tile columns: two 8-float vectors */
    KC = 256,  /* k per block: a 16-column B panel is 16 KiB, half of L1 */
    MC = 144,  /* rows per block: a packed A block is 144 KiB, in L2 */
    NC = 1024, /* columns per packed B block: 1 MiB */
    THIN = 256,
    KB_FLOATS = 1 << 16, /* all of k's B packed at once up to here: 256 KiB */
};

/* One thread's pack buffer: a B block then an A block, 64-byte aligned. */
#define PACK_FLOATS ((size_t)KC * NC + (size_t)MC * KC)

#if GEMM_X86
#define GEMM_TARGET __attribute__((target("avx2,fma")))

/* c[0..MRV) x [0..nr) = alpha * sum_k a(i, k) b(k, :) + beta * c, where
 * a(i, k) = a[i * rsa + k * csa] and b is a packed kc x 16 panel whose
 * columns past nr are zero. MRV is a constant at each call site, so that
 * the accumulators live in registers and short edge tiles do no wasted
 * work. */
#define GEMM_INLINE GEMM_TARGET __attribute__((always_inline)) static inline
GEMM_INLINE void tile_rows(const int MRV, int64_t kc, const float *a, int64_t rsa, int64_t csa,
                           const float *b, float alpha, float beta, float *c, int64_t ldc, int nr) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MRV; i++)
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        /* C's tile is needed only after the k loop: fetching it now hides the
         * miss (measured: 9% on examples/gpt's products). */
#pragma GCC unroll 6
    for (int i = 0; i < MRV; i++) {
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + NR - 1), _MM_HINT_T0);
    }
    int64_t off = 0;
    for (int64_t k = 0; k < kc; k++, off += csa, b += NR) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MRV; i++) {
            __m256 x = _mm256_broadcast_ss(a + i * rsa + off);
            acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
        }
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int i = 0; i < MRV; i++) {
        float *ci = c + i * ldc;
        __m256 v0 = _mm256_mul_ps(va, acc[i][0]), v1 = _mm256_mul_ps(va, acc[i][1]);
        if (nr == NR) {
            if (beta != 0) {
                v0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(ci), v0);
                v1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(ci + 8), v1);
            }
            _mm256_storeu_ps(ci, v0);
            _mm256_storeu_ps(ci + 8, v1);
            continue;
        }
        /* A row narrower than 16 goes through a full one on the stack. */
        float row[NR];
        _mm256_storeu_ps(row, v0);
        _mm256_storeu_ps(row + 8, v1);
        for (int j = 0; j < nr; j++)
            ci[j] = beta == 0 ? row[j] : row[j] + beta * ci[j];
    }
}

/* The register tile for the first mr (1 to 6) rows. */
GEMM_TARGET static void kernel(int mr, int64_t kc, const float *a, int64_t rsa, int64_t csa,
                               const float *b, float alpha, float beta, float *c, int64_t ldc,
                               int nr) {
    switch (mr) {
    case 1: tile_rows(1, kc, a, rsa, csa, b, alpha, beta, c, ldc, nr); break;
    case 2: tile_rows(2, kc, a, rsa, csa, b, alpha, beta, c, ldc, nr); break;
    case 3: tile_rows(3, kc, a, rsa, csa, b, alpha, beta, c, ldc, nr); break;
    case 4: tile_rows(4, kc, a, rsa, csa, b, alpha, beta, c, ldc, nr); break;
    case 5: tile_rows(5, kc, a, rsa, csa, b, alpha, beta, c, ldc, nr); break;
    default: tile_rows(MR, kc, a, rsa, csa, b, alpha, beta, c, ldc, nr); break;
    }
}

/* Columns [j0, j0 + 8) of B's rows [0, 8) into the 16-column panel at dst
 * (k by k, NR apart), where B(k, j) = b[k + j * csb]: an 8 x 8 transpose in
 * registers. */
GEMM_TARGET static void pack_b_8x8(const float *b, int64_t csb, float *dst) {
    __m256 r[8], t[8];
    for (int j = 0; j < 8; j++)
        r[j] = _mm256_loadu_ps(b + j * csb);
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 8; j += 4)
        for (int h = 0; h < 2; h++) {
            r[j + h] = _mm256_shuffle_ps(t[j + h], t[j + 2 + h], 0x44);
            r[j + 2 + h] = _mm256_shuffle_ps(t[j + h], t[j + 2 + h], 0xee);
        }
    /* r[0..3] hold k = 0, 2, 1, 3 of columns 0-3 (low lanes) and of k + 4
     * (high lanes); r[4..7] the same for columns 4-7. */
    static const int order[4] = {0, 2, 1, 3};
    for (int q = 0; q < 4; q++) {
        __m256 lo = r[order[q]], hi = r[4 + order[q]];
        _mm256_storeu_ps(dst + q * NR, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(dst + (q + 4) * NR, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
}

/* dst = B's kc x nc block, where B(k, j) = b[k * rsb + j * csb], as
 * 16-column panels of kc rows each, the last one padded with zeros. Rows
 * of B are read in order, so that the hardware prefetcher streams them. */
GEMM_TARGET static void pack_b(int64_t kc, int64_t nc, const float *b, int64_t rsb, int64_t csb,
                               float *dst) {
    int64_t full = nc / NR * NR;
    if (csb == 1) {
        for (int64_t k = 0; k < kc; k++) {
            const float *src = b + k * rsb;
            for (int64_t j0 = 0; j0 < full; j0 += NR) {
                float *d = dst + j0 * kc + k * NR;
                _mm256_store_ps(d, _mm256_loadu_ps(src + j0));
                _mm256_store_ps(d + 8, _mm256_loadu_ps(src + j0 + 8));
            }
        }
    } else {
        /* Transposed: B's columns are contiguous down k. */
        int64_t k8 = kc / 8 * 8;
        for (int64_t j0 = 0; j0 < full; j0 += 8) {
            float *d = dst + j0 / NR * NR * kc + j0 % NR;
            for (int64_t k = 0; k < k8; k += 8)
                pack_b_8x8(b + k + j0 * csb, csb, d + k * NR);
            for (int64_t k = k8; k < kc; k++)
                for (int64_t j = 0; j < 8; j++)
                    d[k * NR + j] = b[k + (j0 + j) * csb];
        }
    }
    if (full == nc)
        return;
    float *d = dst + full * kc;
    for (int64_t k = 0; k < kc; k++)
        for (int64_t j = 0; j < NR; j++)
            d[k * NR + j] = full + j < nc ? b[k * rsb + (full + j) * csb] : 0;
}

/* dst = A's mc x kc block, where A(i, k) = a[i + k * csa] (A transposed:
 * its rows are contiguous down k), as 6-row panels laid out k by k. Rows
 * past mc are zero. Each k's mc values are contiguous in memory and read
 * together, so the source streams in order. */
GEMM_TARGET static void pack_a_trans(int64_t mc, int64_t kc, const float *a, int64_t csa,
                                     float *dst) {
    int64_t full = mc / MR * MR;
    for (int64_t k = 0; k < kc; k++) {
        const float *src = a + k * csa;
        for (int64_t i0 = 0; i0 < full; i0 += MR)
            memcpy(dst + i0 * kc + k * MR, src + i0, MR * sizeof(float));
        for (int64_t i = 0; i < MR && full < mc; i++)
            dst[full * kc + k * MR + i] = full + i < mc ? src[full + i] : 0;
    }
}

/* The blocked product; beta applies to the first k block only. When all
 * of B's k rows for a column block fit in half of L2 (k of a few hundred,
 * as in the thin products this kernel is for), they are packed at once and
 * each row block walks its k blocks in turn, finishing its part of C while
 * that is in cache instead of reading it back once per k block. */
GEMM_TARGET static void gemm_avx2(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                  const float *a, int64_t lda, const float *b, int64_t ldb,
                                  float beta, float *c, int64_t ldc, float *buf) {
    int64_t rsa = ta ? 1 : lda, csa = ta ? lda : 1;
    int64_t rsb = tb ? 1 : ldb, csb = tb ? ldb : 1;
    float *bpack = buf, *apack = buf + (size_t)KC * NC;
    for (int64_t jc = 0; jc < n; jc += NC) {
        int64_t nc = n - jc < NC ? n - jc : NC, npad = (nc + NR - 1) / NR * NR;
        int64_t kb = k * npad <= KB_FLOATS ? k : KC;
        for (int64_t pb = 0; pb < k; pb += kb) {
            int64_t pe = k - pb < kb ? k : pb + kb;
            for (int64_t pc = pb; pc < pe; pc += KC)
                pack_b(pe - pc < KC ? pe - pc : KC, nc, b + pc * rsb + jc * csb, rsb, csb,
                       bpack + (pc - pb) * npad);
            for (int64_t ic = 0; ic < m; ic += MC) {
                int64_t mc = m - ic < MC ? m - ic : MC;
                for (int64_t pc = pb; pc < pe; pc += KC) {
                    int64_t kc = pe - pc < KC ? pe - pc : KC;
                    const float *ablk = a + ic * rsa + pc * csa, *bblk = bpack + (pc - pb) * npad;
                    float bk = pc == 0 ? beta : 1;
                    if (ta)
                        pack_a_trans(mc, kc, ablk, csa, apack);
                    for (int64_t jr = 0; jr < nc; jr += NR) {
                        int nr = (int)(nc - jr < NR ? nc - jr : NR);
                        for (int64_t ir = 0; ir < mc; ir += MR) {
                            int mr = (int)(mc - ir < MR ? mc - ir : MR);
                            const float *ap = ta ? apack + ir * kc : ablk + ir * rsa;
                            kernel(mr, kc, ap, ta ? 1 : rsa, ta ? MR : 1, bblk + jr * kc, alpha, bk,
                                   c + (ic + ir) * ldc + jc + jr, ldc, nr);
                        }
                    }
                }
            }
        }
    }
}
#endif

static pthread_key_t pack_key;
static bool pack_key_made;
/* Also held here so that leak checkers see the buffer of a live thread. */
static _Thread_local float *pack_mine;
static bool have_avx2_fma;

/* At load time, before any thread of ct's exists. */
__attribute__((constructor)) static void gemm_setup(void) {
    pack_key_made = pthread_key_create(&pack_key, free) == 0;
#if GEMM_X86
    have_avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
}

/* This thread's pack buffer, made on first use and freed when the thread
 * exits; NULL when it cannot be made. */
static float *pack_buffer(void) {
    if (pack_mine || !pack_key_made)
        return pack_mine;
    float *buf = aligned_alloc(64, PACK_FLOATS * sizeof(float));
    if (buf && pthread_setspecific(pack_key, buf) != 0) {
        free(buf);
        buf = NULL;
    }
    return pack_mine = buf;
}

/* The products ct's kernel computes: those where it measured faster than
 * OpenBLAS's on Zen 3 (docs/decisions.md), that is where n or k is at most
 * THIN. There OpenBLAS's repacking and zeroing are a large part of the
 * work; larger products amortise them, and OpenBLAS's blocking then wins.
 * A matrix-vector product (one row, or fewer than 8 columns, which the
 * 16-column panels would pad) reads B once in BLAS's gemv-like path, and
 * three times here. */
static bool thin(int64_t m, int64_t n, int64_t k) {
    return m >= 2 && n >= NR / 2 && (n <= THIN || k <= THIN);
}

void ct__cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0)
        return;
    float *buf = k > 0 && have_avx2_fma && thin(m, n, k) ? pack_buffer() : NULL;
#if GEMM_X86
    if (buf) {
        gemm_avx2(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, buf);
        return;
    }
#endif
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta,
                c, (blasint)ldc);
}
