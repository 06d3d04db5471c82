/* ct CPU internal header: branch-free float helpers that gcc and clang
 * vectorise: selects and exp.
 *
 * libm's expf is an opaque call, so a loop over it stays scalar. This one is
 * plain branch-free C: range reduction x = n ln2 + r with |r| <= ln2/2, the
 * Cephes degree-5 polynomial for e^r (at most about 1 ulp over the whole
 * range), and 2^n built from exponent bits. n is applied in two halves so
 * that results in the subnormal range come out right instead of flushing to
 * zero. */
#ifndef CT_CPU_VEXP_H
#define CT_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

static inline uint32_t ct__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ct__f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* cond ? a : b as a bit blend. gcc threads jumps through a ternary on
 * floats, and the duplicated paths then hold operations that "could trap"
 * (or a branch per element for doubles), so the loop is not vectorised. */
static inline float ct__f32_select(int cond, float a, float b) {
    uint32_t m = -(uint32_t)cond;
    return ct__f32_from_bits((ct__f32_bits(a) & m) | (ct__f32_bits(b) & ~m));
}

static inline double ct__f64_select(int cond, double a, double b) {
    uint64_t m = -(uint64_t)cond, ua, ub;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    ua = (ua & m) | (ub & ~m);
    memcpy(&a, &ua, sizeof a);
    return a;
}

/* e^x: 0 below -104 (under half the smallest subnormal), inf above ~88.72,
 * NaN for NaN (NaN fails both clamp comparisons). */
static inline float ct__vexpf(float x) {
    x = ct__f32_select(x < -104.0f, -104.0f, x);
    x = ct__f32_select(x > 88.8f, 88.8f, x);
    /* Adding 1.5 * 2^23 rounds x / ln2 to the nearest integer n and leaves n
     * in the low mantissa bits, read back without a float-to-int cast (which
     * NaN would make undefined). */
    float t = x * 1.44269504088896341f + 12582912.0f;
    uint32_t n = ct__f32_bits(t) - 0x4b400000u;
    float nf = t - 12582912.0f;
    /* Cody-Waite: ln2 split so that nf * hi is exact. */
    float r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* n is in [-150, 128]: split it into two halves that are each a normal
     * power of two. */
    uint32_t n1 = (uint32_t)((int32_t)n >> 1);
    return p * ct__f32_from_bits((n1 + 127u) << 23) * ct__f32_from_bits((n - n1 + 127u) << 23);
}

#endif
