/* ct CPU internal header: float tanh and erf that gcc and clang vectorise.
 *
 * libm's tanhf and erff are opaque calls that keep loops scalar. These are
 * branch-free: each range is computed and the results blended by bit
 * masks. Their polynomials are least-squares fits made for ct with numpy,
 * weighted for relative error. */
#ifndef CT_CPU_VMATH_H
#define CT_CPU_VMATH_H

#include "vexp.h"

#include <math.h>

/* Near zero, tanh(x) = x * p(x^2), p fitted on |x| <= 0.625 (relative error
 * about 1.1e-7). Further out, tanh|x| = 1 - 2 / (e^(2|x|) + 1) has no
 * cancellation worth the name. */
static inline float ct__vtanhf(float x) {
    float u = x * x;
    float p = -0.005648165475577116f;
    p = p * u + 0.020568322390317917f;
    p = p * u - 0.053708337247371674f;
    p = p * u + 0.13330845534801483f;
    p = p * u - 0.333332359790802f;
    p = p * u + 1.0f;
    float small = x * p;
    float ax = ct__f32_from_bits(ct__f32_bits(x) & 0x7fffffffu);
    float big = 1.0f - 2.0f / (ct__vexpf(2.0f * ax) + 1.0f);
    big = ct__f32_from_bits(ct__f32_bits(big) | (ct__f32_bits(x) & 0x80000000u));
    /* NaN fails the comparison and takes the polynomial path, which keeps
     * it NaN. */
    return ct__f32_select(ax > 0.625f, big, small);
}

/* For |x| < 1, erf(x) = x * p(x^2) (relative error about 1.8e-7). For
 * 1 <= |x| < 4, erf|x| = 1 - e^(-x^2) q(1/|x|), q fitted to erfc(x) e^(x^2)
 * (absolute error below 1e-7). From 4 on, erf is 1 in float. */
static inline float ct__verff(float x) {
    float u = x * x;
    float p = 7.971048762556165e-05f;
    p = p * u - 0.0008043373818509281f;
    p = p * u + 0.0051918332464993f;
    p = p * u - 0.026855509728193283f;
    p = p * u + 0.11283621937036514f;
    p = p * u - 0.3761262893676758f;
    p = p * u + 1.1283791065216064f;
    float small = x * p;
    float ax = ct__f32_from_bits(ct__f32_bits(x) & 0x7fffffffu);
    float t = 1.0f / ct__f32_select(ax < 1.0f, 1.0f, ax);
    float q = -0.013516003265976906f;
    q = q * t + 0.04781874641776085f;
    q = q * t - 0.015037806704640388f;
    q = q * t - 0.19865430891513824f;
    q = q * t + 0.4677893817424774f;
    q = q * t - 0.45946377515792847f;
    q = q * t + 0.03892770782113075f;
    q = q * t + 0.5594750046730042f;
    q = q * t + 0.00024451338686048985f;
    float big = 1.0f - ct__vexpf(-u) * q;
    big = ct__f32_select(ax >= 4.0f, 1.0f, big);
    big = ct__f32_from_bits(ct__f32_bits(big) | (ct__f32_bits(x) & 0x80000000u));
    /* NaN fails the comparison and takes the polynomial path. */
    return ct__f32_select(ax >= 1.0f, big, small);
}

/* exp, tanh and erf of float or double x: ct's vectorisable float forms,
 * libm's for double. Needs <tgmath.h> or <math.h> for the double ones. */
#define CT__VEXP(x)  _Generic((x), float : ct__vexpf((float)(x)), default : exp(x))
#define CT__VTANH(x) _Generic((x), float : ct__vtanhf((float)(x)), default : tanh(x))
#define CT__VERF(x)  _Generic((x), float : ct__verff((float)(x)), default : erf(x))

/* GELU's tanh form, 0.5 x (1 + tanh u) with u = sqrt(2/pi) (x + 0.044715
 * x^3), and its gradient g d/dx. Written as x s(2u), s the sigmoid: one exp
 * and one division, where tanh costs both and a polynomial. From -32 down
 * the value is 0 to float and double precision, as is its limit at -inf;
 * x is clamped there (NaN passes), so that -inf never meets an infinite
 * exp. The derivative is s + x s (1 - s) (2u)'. */
#define CT__GELU_TANH_DEFS(S, T, SELECT)                                                           \
    static inline T ct__gelu_tanh_sig_##S(T x) {                                                   \
        return 1 / (1 + CT__VEXP((T)-1.59576912160573071176 * (x + (T)0.044715 * x * x * x)));     \
    }                                                                                              \
    static inline T ct__gelu_tanh_##S(T x) {                                                       \
        x = SELECT(x < -32, (T)-32, x);                                                            \
        return x * ct__gelu_tanh_sig_##S(x);                                                       \
    }                                                                                              \
    static inline T ct__gelu_tanh_grad_##S(T x, T g) {                                             \
        x = SELECT(x < -32, (T)-32, x);                                                            \
        T s = ct__gelu_tanh_sig_##S(x);                                                            \
        T dv = (T)1.59576912160573071176 * (1 + (T)(3 * 0.044715) * x * x);                        \
        return g * (s + x * s * (1 - s) * dv);                                                     \
    }
CT__GELU_TANH_DEFS(f, float, ct__f32_select)
CT__GELU_TANH_DEFS(d, double, ct__f64_select)
#define CT__GELU_TANH(x) _Generic((x), float : ct__gelu_tanh_f, default : ct__gelu_tanh_d)(x)
#define CT__GELU_TANH_GRAD(x, g)                                                                   \
    _Generic((x), float : ct__gelu_tanh_grad_f, default : ct__gelu_tanh_grad_d)(x, g)

#endif
