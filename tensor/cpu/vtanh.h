/* ct CPU internal header: a float tanh that gcc and clang vectorise.
 *
 * Near zero, tanh(x) = x * p(x^2) with p a degree-5 least-squares fit to
 * tanh(x)/x on |x| <= 0.625 (relative error about 1.1e-7, fitted for ct with
 * numpy). Further out, tanh|x| = 1 - 2 / (e^(2|x|) + 1) has no
 * cancellation worth the name. Both are computed and blended without
 * branches so that loops over it vectorise. */
#ifndef CT_CPU_VTANH_H
#define CT_CPU_VTANH_H

#include "vexp.h"

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

#endif
