/* Autograd overhead: backward time per node of a long chain of tiny ops.
 *
 * The chain mirrors bench/autograd_torch.py op for op: x is a float32 [1]
 * leaf holding 1.0 that requires grad; for i = 0 .. N-1, y = y * 1.0001
 * when i is even and y = y + 0.5 when i is odd. Only the backward is timed.
 * A fresh chain is built for each run and the best run is kept, divided by
 * N. One thread.
 *
 * Prints one JSON object per chain length: {"bench": "autograd_overhead",
 * "impl": "ct", "threads": 1, "nodes": N, "us_per_node": ...}.
 */
#define _POSIX_C_SOURCE 200809L

#include <ct/autograd.h>

#include "bench_time.h"
#include <math.h>
#include <stdio.h>
#include <time.h>

/* Seconds one backward through a fresh chain of n nodes takes, or a
 * negative value on error. */
static double backward_seconds(int n) {
    ct_scope_begin();
    ct_tensor *x = ct_requires_grad_(ct_ones(CT_SHAPE(1), CT_FLOAT32), true);
    ct_tensor *y = x;
    for (int i = 0; i < n; i++)
        y = i % 2 == 0 ? ct_mul_scalar(y, 1.0001) : ct_add_scalar(y, 0.5);
    double t0 = bench_now();
    int rc = y ? ct_tensor_backward(y) : ct_errcode();
    double t = bench_now() - t0;
    /* float32(1.0001) drifts about 1e-3 from the exact power over 50000
     * multiplies. */
    double expect = pow(1.0001, (n + 1) / 2), got = rc ? NAN : ct_item(ct_tensor_grad(x));
    if (rc || fabs(got - expect) > 1e-2 * expect) {
        fprintf(stderr, "bench_autograd: chain of %d: %s (dy/dx = %g, expected %g)\n", n,
                rc ? ct_errmsg() : "wrong gradient", got, expect);
        t = -1;
    }
    ct_scope_end();
    return t;
}

int main(void) {
    ct_set_num_threads(1);
    static const struct { int nodes, runs; } sizes[] = {{1000, 20}, {100000, 3}};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        double best = INFINITY;
        for (int r = 0; r < sizes[s].runs; r++) {
            double t = backward_seconds(sizes[s].nodes);
            if (t < 0)
                return 1;
            best = t < best ? t : best;
        }
        printf(
            "{\"bench\": \"autograd_overhead\", \"impl\": \"ct\", \"threads\": 1, \"nodes\": %d, "
            "\"us_per_node\": %.4f}\n",
            sizes[s].nodes, best / sizes[s].nodes * 1e6);
        fflush(stdout);
    }
    return 0;
}
