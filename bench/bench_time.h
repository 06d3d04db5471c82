/* Timing helpers shared by the benchmarks. Header-only; thread-safe. */
#ifndef CT_BENCH_TIME_H
#define CT_BENCH_TIME_H

#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* qsort comparator for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
