/* ct tensor internal header: the Philox4x32-10 block function and the
 * definition of ct's random streams. Not installed. Pure C with no ct
 * dependencies, so that the CUDA generator and the known-answer test can
 * include it and produce bit-identical words.
 *
 * Philox4x32-10 is the counter-based generator of J. K. Salmon, M. A. Moraes,
 * R. O. Dror and D. E. Shaw, "Parallel random numbers: as easy as 1, 2, 3",
 * Proc. SC'11 (2011), Section 3.2: ten rounds of two 32x32->64 multiplies on
 * a 128-bit counter, with a 64-bit key bumped by Weyl constants between
 * rounds.
 *
 * The stream. A generator is (seed, offset). A draw of n elements starting at
 * offset o uses blocks b = 0, 1, ..., each block being one Philox call:
 *   key     = {seed & 0xffffffff, seed >> 32}
 *   counter = the 128-bit integer o + b, as four little-endian 32-bit words
 *   words   = Philox4x32-10(counter, key), w[0..3]
 * Outputs are laid out on the words in one of two ways:
 *   32-bit layout (float32, float16, bfloat16 uniform and normal draws):
 *     element i takes word i % 4 of block i / 4;
 *   64-bit layout (float64 uniform and normal draws, bernoulli, randperm):
 *     element i takes u = w[2j] | (uint64)w[2j+1] << 32, j = i % 2, of
 *     block i / 2.
 * A uniform in [0, 1) keeps the top m bits: (w >> (32 - m)) * 2^-m, or
 * (u >> (64 - m)) * 2^-m, where m is the dtype's significand width (24
 * float32, 11 float16, 8 bfloat16, 53 float64); every such value is exactly
 * representable, so a uniform never rounds up to 1.
 * A normal pairs elements (2k, 2k + 1) of a block (Box-Muller): with u1, u2
 * their uniforms (24 bits in the 32-bit layout, 53 in the 64-bit one),
 * r = sqrt(-2 ln(1 - u1)), z[2k] = r cos(2 pi u2), z[2k+1] = r sin(2 pi u2),
 * computed in double and then rounded to the dtype.
 * bernoulli(p) gives 1 where the 53-bit uniform u < p.
 * randperm(n) sorts 0..n-1 by the 64-bit values u, ties by position.
 * After a draw the generator's offset has advanced by the number of blocks,
 * ceil(n / elements per block). Element i therefore depends only on (seed,
 * offset, i): never on the thread count or the device. */
#ifndef CT_PHILOX_H
#define CT_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CT__PHILOX_FN __host__ __device__ static inline
#else
#define CT__PHILOX_FN static inline
#endif

#define CT__PHILOX_M0 0xD2511F53u
#define CT__PHILOX_M1 0xCD9E8D57u
#define CT__PHILOX_W0 0x9E3779B9u /* golden ratio */
#define CT__PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

CT__PHILOX_FN void ct__philox4x32_10(const uint32_t counter[4], const uint32_t key[2],
                                     uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)CT__PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)CT__PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += CT__PHILOX_W0;
        k1 += CT__PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The words of block `block` of a draw that starts at `offset`. */
CT__PHILOX_FN void ct__philox_block(uint64_t seed, uint64_t offset, uint64_t block,
                                    uint32_t out[4]) {
    uint64_t lo = offset + block;
    uint32_t counter[4] = {(uint32_t)lo, (uint32_t)(lo >> 32), lo < offset, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    ct__philox4x32_10(counter, key, out);
}

/* Block b's per_block values: its four words (per_block 4, the 32-bit
 * layout) or its two 64-bit pairs (per_block 2). */
CT__PHILOX_FN void ct__philox_values(uint64_t seed, uint64_t offset, uint64_t block, int per_block,
                                     uint64_t v[4]) {
    uint32_t w[4];
    ct__philox_block(seed, offset, block, w);
    for (int j = 0; j < per_block; j++)
        v[j] = per_block == 4 ? w[j] : (uint64_t)w[2 * j + 1] << 32 | w[2 * j];
}

/* Block b's per_block uniforms of `bits` bits, or, with normal, the
 * standard normals Box-Muller makes of them in pairs. The host's and the
 * device's libm may differ in the last bit of log, cos and sin, and so the
 * normals in theirs. */
CT__PHILOX_FN void ct__philox_draw(uint64_t seed, uint64_t offset, uint64_t block, int per_block,
                                   int bits, int normal, double u[4]) {
    uint64_t v[4];
    ct__philox_values(seed, offset, block, per_block, v);
    int width = per_block == 4 ? 32 : 64;
    double scale = ldexp(1.0, -bits);
    for (int j = 0; j < per_block; j++)
        u[j] = (double)(v[j] >> (width - bits)) * scale;
    for (int j = 0; normal && j < per_block; j += 2) {
        double r = sqrt(-2.0 * log(1.0 - u[j])), theta = 2.0 * M_PI * u[j + 1];
        u[j] = r * cos(theta);
        u[j + 1] = r * sin(theta);
    }
}

#endif
