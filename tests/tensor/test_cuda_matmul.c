/* matmul on a CUDA device against the CPU on the same inputs (every shape
 * matmul takes, every dtype, transposed, strided and offset operands, TF32
 * on and off, empty dims, errors, gradients); pinned memory and ct_to_async;
 * and the elementwise kernels' vectorized path against their element-wise
 * one. Without a device the whole program is skipped (exit 77). */
#include "ct_test.h"
#include "device_under_test.h"

#include <ct/autograd.h>
#include <ct/cuda.h>
#include <stdlib.h>

/* t on the device in t's exact layout: its whole storage copied over and
 * viewed with t's offset, sizes and strides. */
static ct_tensor *mirror(ct_tensor *t) {
    ct_storage *hs = ct_tensor_storage(t);
    ct_tensor *bytes =
        ct_tensor_from_storage(hs, 0, CT_SHAPE((int64_t)ct_storage_nbytes(hs)), NULL, CT_UINT8);
    ct_tensor *on = ct_to(bytes, dut);
    return on ? ct_tensor_from_storage(ct_tensor_storage(on), ct_tensor_offset(t), ct_ndim(t),
                                       ct_sizes(t), ct_strides(t), ct_tensor_dtype(t))
              : NULL;
}

/* The device's result against the CPU's: exact for integers; for floats
 * within what the dtype's rounding allows (the CPU computes 16-bit floats
 * in float32 and rounds once, as cuBLAS does). */
static bool matches_cpu(const char *file, int line, ct_tensor *a, ct_tensor *b) {
    ct_tensor *want = ct_matmul(a, b);
    ct_tensor *got = ct_matmul(mirror(a), mirror(b));
    if (!want || !got) {
        tt_fail(file, line, "matmul failed: %s", ct_errmsg());
        return false;
    }
    if (ct_tensor_device(got).type != DUT_TYPE) {
        tt_fail(file, line, "the result is not on the device");
        return false;
    }
    double tol[CT_NDTYPES] = {
        [CT_FLOAT32] = 1e-5, [CT_FLOAT64] = 1e-12, [CT_BFLOAT16] = 1.6e-2, [CT_FLOAT16] = 2e-3};
    double t = tol[ct_tensor_dtype(want)];
    return tt_close(file, line, ct_to(got, CT_DEVICE_CPU), want, t, t);
}
#define ASSERT_MATCHES_CPU(a, b)                                                                   \
    do {                                                                                           \
        if (!matches_cpu(__FILE__, __LINE__, (a), (b)))                                            \
            return;                                                                                \
    } while (0)

/* Shapes of every kind matmul takes: vectors, matrices, batches with and
 * without broadcasting, a batch that folds into one taller product. */
static const struct {
    int na, nb;
    int64_t a[4], b[4];
} shapes[] = {
    {1, 1, {7}, {7}},
    {1, 2, {7}, {7, 4}},
    {2, 1, {3, 7}, {7}},
    {2, 2, {3, 7}, {7, 4}},
    {3, 2, {4, 3, 7}, {7, 5}},
    {2, 3, {3, 7}, {2, 7, 4}},
    {4, 3, {2, 1, 3, 7}, {4, 7, 6}},
    {3, 3, {1, 3, 7}, {2, 7, 4}},
    {1, 3, {7}, {2, 7, 4}},
};

TEST(matmul_matches_the_cpu_for_every_shape_dtype_and_layout) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        if (d == CT_BOOL)
            continue;
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            ct_scope_begin();
            ct_tensor *a = tt_rand(shapes[s].na, shapes[s].a, (ct_dtype)d, 10 + s);
            ct_tensor *b = tt_rand(shapes[s].nb, shapes[s].b, (ct_dtype)d, 20 + s);
            for (int la = 0; la < TT_NLAYOUTS && !tt_failed(); la++)
                for (int lb = 0; lb < TT_NLAYOUTS && !tt_failed(); lb++)
                    ASSERT_MATCHES_CPU(tt_layout_of(a, (tt_layout)la),
                                       tt_layout_of(b, (tt_layout)lb));
            ct_scope_end();
        }
    }
}

TEST(transposed_sliced_offset_and_expanded_operands) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        if (d == CT_BOOL)
            continue;
        ct_scope_begin();
        ct_tensor *x = tt_rand(CT_SHAPE(9, 12), (ct_dtype)d, 31);
        ct_tensor *w = tt_rand(CT_SHAPE(10, 12), (ct_dtype)d, 32);
        /* A linear layer's x @ W^T: W^T is read as a transpose flag. */
        ASSERT_MATCHES_CPU(x, ct_transpose(w, 0, 1));
        ASSERT_MATCHES_CPU(ct_transpose(w, 0, 1), ct_narrow(ct_transpose(x, 0, 1), 0, 0, 10));
        /* Rows with a step, columns with a step: copied first. */
        ASSERT_MATCHES_CPU(ct_slice(x, 0, 1, 9, 2), ct_slice(ct_transpose(w, 0, 1), 1, 0, 10, 3));
        ASSERT_MATCHES_CPU(ct_slice(x, 1, 0, 12, 2), ct_slice(w, 0, 2, 8, 1));
        /* Offset by one element: unaligned for every vector load. */
        ASSERT_MATCHES_CPU(ct_narrow(x, 1, 1, 11), ct_narrow(ct_transpose(w, 0, 1), 0, 1, 11));
        /* A batch expanded from one matrix (batch stride 0). */
        ASSERT_MATCHES_CPU(ct_expand(ct_unsqueeze(x, 0), CT_SHAPE(3, 9, 12)),
                           ct_transpose(w, 0, 1));
        /* Batch dims in no regular order: some batches in one strided
         * call, the rest in a loop of calls. */
        ct_tensor *a4 = tt_rand(CT_SHAPE(3, 4, 5, 6), (ct_dtype)d, 33);
        ct_tensor *b4 = tt_rand(CT_SHAPE(4, 3, 6, 2), (ct_dtype)d, 34);
        ASSERT_MATCHES_CPU(a4, ct_transpose(b4, 0, 1));
        ASSERT_MATCHES_CPU(
            ct_permute(tt_rand(CT_SHAPE(4, 5, 3, 6), (ct_dtype)d, 35), (int[]){2, 0, 1, 3}),
            ct_transpose(b4, 0, 1));
        ASSERT_MATCHES_CPU(tt_rand(CT_SHAPE(4, 1, 5, 6), (ct_dtype)d, 36),
                           tt_rand(CT_SHAPE(1, 3, 6, 2), (ct_dtype)d, 37));
        ct_scope_end();
    }
}

TEST(mixed_dtypes_promote_as_on_the_cpu) {
    ct_tensor *a = tt_rand(CT_SHAPE(4, 6), CT_INT32, 41);
    ct_tensor *b = tt_rand(CT_SHAPE(6, 3), CT_FLOAT32, 42);
    ct_tensor *c = tt_rand(CT_SHAPE(6, 3), CT_BFLOAT16, 43);
    ct_tensor *u = tt_rand(CT_SHAPE(6, 3), CT_UINT8, 44);
    ASSERT_MATCHES_CPU(a, b);
    ASSERT_MATCHES_CPU(a, c);
    ASSERT_MATCHES_CPU(a, u);
    ASSERT_MATCHES_CPU(ct_to_dtype(a, CT_FLOAT64), b);
}

#if DUT_CUDA
/* Large enough that cuBLAS picks its tensor-core kernels. */
TEST(float32_is_exact_without_tf32_and_within_tf32_with_it) {
    ASSERT_TRUE(!ct_cuda_tf32_enabled());
    ct_tensor *a = tt_rand(CT_SHAPE(256, 384), CT_FLOAT32, 51);
    ct_tensor *b = tt_rand(CT_SHAPE(384, 200), CT_FLOAT32, 52);
    ct_tensor *want = ct_matmul(ct_to_dtype(a, CT_FLOAT64), ct_to_dtype(b, CT_FLOAT64));
    ct_tensor *da = ct_to(a, dut), *db = ct_to(b, dut);
    ct_tensor *off = ct_to_dtype(ct_to(ct_matmul(da, db), CT_DEVICE_CPU), CT_FLOAT64);
    ASSERT_CLOSE(off, want, 1e-5, 1e-4);
    ct_cuda_set_tf32(true);
    ASSERT_TRUE(ct_cuda_tf32_enabled());
    ct_tensor *on = ct_to_dtype(ct_to(ct_matmul(da, db), CT_DEVICE_CPU), CT_FLOAT64);
    ct_cuda_set_tf32(false);
    ASSERT_CLOSE(on, want, 1e-2, 0.15);
    /* TF32 rounds inputs to 10 bits: it shows, where float32 did not. */
    double worst_on = ct_item(ct_amax(ct_abs(ct_sub(on, want)), NULL, 0, false));
    double worst_off = ct_item(ct_amax(ct_abs(ct_sub(off, want)), NULL, 0, false));
    ASSERT_TRUE(worst_on > 10 * worst_off);
    /* The other dtypes ignore the setting. */
    ct_cuda_set_tf32(true);
    ASSERT_MATCHES_CPU(ct_to_dtype(a, CT_FLOAT64), ct_to_dtype(b, CT_FLOAT64));
    ASSERT_MATCHES_CPU(ct_to_dtype(a, CT_BFLOAT16), ct_to_dtype(b, CT_BFLOAT16));
    ct_cuda_set_tf32(false);
}
#endif

TEST(empty_dims_give_empty_results_and_k_0_gives_zeros) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        if (d == CT_BOOL)
            continue;
        ct_scope_begin();
        ct_tensor *z = ct_matmul(ct_to(ct_ones(CT_SHAPE(3, 0), (ct_dtype)d), dut),
                                 ct_to(ct_ones(CT_SHAPE(0, 4), (ct_dtype)d), dut));
        ASSERT_TRUE(z != NULL);
        ASSERT_CLOSE(ct_to(z, CT_DEVICE_CPU), ct_zeros(CT_SHAPE(3, 4), (ct_dtype)d), 0, 0);
        ct_tensor *e = ct_matmul(ct_to(ct_ones(CT_SHAPE(2, 0, 5), (ct_dtype)d), dut),
                                 ct_to(ct_ones(CT_SHAPE(5, 4), (ct_dtype)d), dut));
        ASSERT_TRUE(e != NULL);
        ASSERT_EQ(ct_numel(e), 0);
        ASSERT_EQ(ct_size(e, 1), 0);
        ct_tensor *nb = ct_matmul(ct_to(ct_ones(CT_SHAPE(0, 3, 5), (ct_dtype)d), dut),
                                  ct_to(ct_ones(CT_SHAPE(5, 4), (ct_dtype)d), dut));
        ASSERT_TRUE(nb != NULL);
        ASSERT_EQ(ct_numel(nb), 0);
        ct_scope_end();
    }
}

TEST(errors_are_the_cpus) {
    ct_tensor *a = ct_to(ct_ones(CT_SHAPE(2, 3), CT_FLOAT32), dut);
    ct_tensor *b = ct_to(ct_ones(CT_SHAPE(4, 5), CT_FLOAT32), dut);
    ASSERT_FAILS(ct_matmul(a, b), CT_ESHAPE, "matmul", "[2, 3] @ [4, 5]", "inner sizes differ");
    ASSERT_FAILS(ct_matmul(ct_to(ct_ones(CT_SHAPE(2, 2, 3), CT_FLOAT32), dut),
                           ct_to(ct_ones(CT_SHAPE(3, 3, 2), CT_FLOAT32), dut)),
                 CT_ESHAPE, "matmul", "batch");
    ASSERT_FAILS(ct_matmul(a, ct_ones(CT_SHAPE(3, 5), CT_FLOAT32)), CT_EDEVICE, "matmul", DUT_NAME,
                 "cpu");
    ASSERT_FAILS(ct_matmul(ct_ones(CT_SHAPE(5, 2), CT_FLOAT32), a), CT_EDEVICE, DUT_NAME, "cpu");
    ASSERT_FAILS(ct_matmul(ct_to(ct_ones(CT_SHAPE(2, 3), CT_BOOL), dut),
                           ct_to(ct_ones(CT_SHAPE(3, 2), CT_BOOL), dut)),
                 CT_EDTYPE, "bool");
    ASSERT_FAILS(ct_matmul(ct_to(ct_scalar(2, CT_FLOAT32), dut), a), CT_EINVAL, "at least 1 dim");
}

/* grad of a @ b against the CPU's, in float64, for each way the backward
 * is composed: plain, through a column-major (transposed) weight, vectors,
 * batches. */
TEST(gradients_on_the_device_match_the_cpu) {
    static const struct {
        int na, nb;
        int64_t a[3], b[3];
        bool wt; /* b is a transposed weight */
    } cases[] = {
        {2, 2, {3, 5}, {5, 4}, false}, {2, 2, {3, 5}, {4, 5}, true},
        {1, 2, {5}, {5, 4}, false},    {2, 1, {3, 5}, {5}, false},
        {1, 1, {5}, {5}, false},       {3, 3, {2, 3, 5}, {2, 5, 4}, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ct_scope_begin();
        ct_tensor *a = tt_rand(cases[c].na, cases[c].a, CT_FLOAT64, 60 + c);
        ct_tensor *b = tt_rand(cases[c].nb, cases[c].b, CT_FLOAT64, 70 + c);
        ct_tensor *grads[2][2];
        for (int dev = 0; dev < 2; dev++) {
            ct_tensor *x = ct_requires_grad_(dev ? ct_to(a, dut) : ct_clone(a), true);
            ct_tensor *w = ct_requires_grad_(dev ? ct_to(b, dut) : ct_clone(b), true);
            ct_tensor *y = ct_matmul(x, cases[c].wt ? ct_transpose(w, 0, 1) : w);
            ASSERT_TRUE(y != NULL);
            ct_tensor *g = tt_rand(ct_ndim(y), ct_sizes(y), CT_FLOAT64, 80 + c);
            ct_tensor *gy = dev ? ct_to(g, dut) : g;
            ASSERT_EQ(ct_grad(&y, 1, &gy, (ct_tensor *[]){x, w}, 2, grads[dev], NULL), 0);
            for (int i = 0; i < 2; i++)
                ASSERT_EQ(ct_tensor_device(grads[dev][i]).type, dev ? DUT_TYPE : CT_CPU);
        }
        for (int i = 0; i < 2; i++)
            ASSERT_CLOSE(ct_to(grads[1][i], CT_DEVICE_CPU), grads[0][i], 1e-12, 1e-12);
        ct_scope_end();
    }
}

/* ------------------------------------------------- asynchronous copies */

/* ct_to_async both ways from pageable memory, which any device takes: the
 * host reads the copy back after a synchronize. */
TEST(async_copies_are_read_after_a_synchronize) {
    ct_tensor *x = tt_rand(CT_SHAPE(33, 65), CT_FLOAT32, 90);
    ct_tensor *d = ct_to_async(x, dut);
    ASSERT_TRUE(d != NULL);
    ASSERT_EQ(ct_tensor_device(d).type, DUT_TYPE);
    ct_tensor *back = ct_to_async(ct_transpose(d, 0, 1), CT_DEVICE_CPU);
    ASSERT_TRUE(back != NULL);
    ASSERT_EQ(dut_synchronize(), 0);
    ASSERT_CLOSE(back, ct_transpose(x, 0, 1), 0, 0);
    for (int dt = 0; dt < CT_NDTYPES; dt++) {
        ct_tensor *v = tt_rand(CT_SHAPE(5, 7), (ct_dtype)dt, 91);
        ct_tensor *r = ct_to_async(ct_to_async(v, dut), CT_DEVICE_CPU);
        ASSERT_EQ(dut_synchronize(), 0);
        ASSERT_CLOSE(r, v, 0, 0);
    }
    ASSERT_EQ(ct_numel(ct_to_async(ct_zeros(CT_SHAPE(0, 3), CT_FLOAT32), dut)), 0);
}

#if DUT_CUDA
TEST(pinned_tensors_go_to_the_device_and_back_without_waiting) {
    ct_tensor *x = tt_rand(CT_SHAPE(33, 65), CT_FLOAT32, 90);
    ct_tensor *p = ct_pin_memory(x);
    ASSERT_TRUE(p != NULL);
    ASSERT_TRUE(ct_is_pinned(p));
    ASSERT_TRUE(!ct_is_pinned(x));
    ASSERT_TRUE(ct_is_pinned(ct_narrow(p, 0, 2, 5)));
    ASSERT_TRUE(ct_pin_memory(p) == p);
    ASSERT_EQ(ct_tensor_device(p).type, CT_CPU);
    ASSERT_CLOSE(p, x, 0, 0);
    ct_tensor *d = ct_to_async(p, dut);
    ASSERT_TRUE(d != NULL);
    ASSERT_EQ(ct_tensor_device(d).type, DUT_TYPE);
    /* Back into pinned memory, from a view, read after synchronizing. */
    ct_tensor *back = ct_to_async(ct_transpose(d, 0, 1), CT_DEVICE_CPU);
    ASSERT_TRUE(back != NULL);
    ASSERT_TRUE(ct_is_pinned(back));
    ASSERT_EQ(dut_synchronize(), 0);
    ASSERT_CLOSE(back, ct_transpose(x, 0, 1), 0, 0);
    /* Pageable memory and strided pinned views take the waiting path. */
    ASSERT_CLOSE(ct_to(ct_to_async(x, dut), CT_DEVICE_CPU), x, 0, 0);
    ASSERT_CLOSE(ct_to(ct_to_async(ct_transpose(p, 0, 1), dut), CT_DEVICE_CPU),
                 ct_transpose(x, 0, 1), 0, 0);
    /* Every dtype, and an empty tensor. */
    for (int dt = 0; dt < CT_NDTYPES; dt++) {
        ct_tensor *v = tt_rand(CT_SHAPE(5, 7), (ct_dtype)dt, 91);
        ct_tensor *r = ct_to_async(ct_to_async(ct_pin_memory(v), dut), CT_DEVICE_CPU);
        ASSERT_EQ(dut_synchronize(), 0);
        ASSERT_CLOSE(r, v, 0, 0);
    }
    ct_tensor *e = ct_empty_pinned(CT_SHAPE(0, 3), CT_FLOAT32);
    ASSERT_TRUE(e != NULL);
    ASSERT_EQ(ct_numel(ct_to_async(e, dut)), 0);
    ASSERT_FAILS(ct_pin_memory(d), CT_EDEVICE, DUT_NAME);
    ASSERT_FAILS(ct_empty_pinned(CT_SHAPE(-1), CT_FLOAT32), CT_EINVAL, "ct_empty_pinned");
}

TEST(a_pinned_source_freed_right_after_the_call_still_copies) {
    const int64_t n = 16 << 20; /* 64 MiB of float32 */
    ct_tensor *want = ct_arange(0, (double)n, 1, CT_FLOAT32);
    ct_tensor *big = ct_to(tt_rand(CT_SHAPE(4096, 4096), CT_FLOAT64, 92), dut);
    ct_scope_begin();
    ct_tensor *src = ct_pin_memory(want);
    /* Long matmuls queued first, so that the copy is still waiting when
     * its source is freed. */
    for (int i = 0; i < 4; i++)
        ASSERT_TRUE(ct_matmul(big, big) != NULL);
    ct_tensor *d = ct_keep(ct_to_async(src, dut));
    ct_scope_end(); /* frees src */
    ASSERT_TRUE(d != NULL);
    /* New pinned tensors of the size get other memory while the copy is
     * queued, or the same once it is done; either way it is not
     * overwritten under the copy. */
    for (int i = 0; i < 3; i++) {
        ct_tensor *other = ct_empty_pinned(CT_SHAPE(n), CT_FLOAT32);
        ASSERT_TRUE(other != NULL);
        memset(ct_data_ptr(other), 0xff, (size_t)n * 4);
    }
    ASSERT_CLOSE(ct_to(d, CT_DEVICE_CPU), want, 0, 0);
    ct_tensor_free(d);
    ASSERT_EQ(ct_cuda_empty_pinned_cache(), 0);
}
#endif

/* ------------------------------------------------- the elementwise path */

typedef ct_tensor *(*binary_fn)(ct_tensor *, ct_tensor *);
typedef ct_tensor *(*unary_fn)(ct_tensor *);

static ct_tensor *add_2(ct_tensor *t) { return ct_add_scalar(t, 2.5); }
static ct_tensor *to_f64(ct_tensor *t) { return ct_to_dtype(t, CT_FLOAT64); }
static ct_tensor *to_f16(ct_tensor *t) { return ct_to_dtype(t, CT_FLOAT16); }

/* Long runs, contiguous and offset by one element (every vector load
 * misaligned, so the element-wise path), with a tail that no vector
 * fills: both paths give the CPU's values. */
TEST(vectorized_and_elementwise_paths_give_the_cpus_values) {
    const int64_t n = (1 << 20) + 7;
    binary_fn bins[] = {ct_add, ct_mul, ct_sub, ct_maximum, ct_lt};
    unary_fn uns[] = {ct_clone, ct_neg, ct_gelu, ct_relu, add_2, to_f64, to_f16};
    ct_dtype dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_FLOAT16, CT_BFLOAT16, CT_INT32, CT_UINT8};
    for (size_t dt = 0; dt < sizeof dtypes / sizeof *dtypes; dt++) {
        ct_scope_begin();
        ct_tensor *x = tt_rand(CT_SHAPE(n + 1), dtypes[dt], 100 + dt);
        ct_tensor *y = tt_rand(CT_SHAPE(n + 1), dtypes[dt], 110 + dt);
        ct_tensor *dx = ct_to(x, dut), *dy = ct_to(y, dut);
        for (int off = 0; off < 2; off++) {
            ct_tensor *hx = ct_narrow(x, 0, off, n), *hy = ct_narrow(y, 0, 1 - off, n);
            ct_tensor *ex = ct_narrow(dx, 0, off, n), *ey = ct_narrow(dy, 0, 1 - off, n);
            ct_tensor *ax = ct_narrow(x, 0, off, n), *ay = ct_narrow(y, 0, off, n);
            ct_tensor *bx = ct_narrow(dx, 0, off, n), *by = ct_narrow(dy, 0, off, n);
            for (size_t f = 0; f < sizeof bins / sizeof *bins && !tt_failed(); f++) {
                ct_tensor *want = bins[f](ax, ay);
                if (!want) {
                    ct_errclear();
                    continue;
                }
                ASSERT_CLOSE(ct_to(bins[f](bx, by), CT_DEVICE_CPU), want, 0, 0);
                ASSERT_CLOSE(ct_to(bins[f](ex, ey), CT_DEVICE_CPU), bins[f](hx, hy), 0, 0);
            }
            for (size_t f = 0; f < sizeof uns / sizeof *uns && !tt_failed(); f++) {
                ct_tensor *want = uns[f](ax);
                if (!want) {
                    ct_errclear();
                    continue;
                }
                bool half = dtypes[dt] == CT_FLOAT16 || dtypes[dt] == CT_BFLOAT16;
                ASSERT_CLOSE(ct_to(uns[f](bx), CT_DEVICE_CPU), want, half ? 1e-2 : 1e-5, 1e-6);
            }
            /* fill, through zeros_like on the device, and copy_ in place. */
            ct_tensor *z = ct_zeros_like(bx);
            ASSERT_TRUE(ct_copy_(z, bx) != NULL);
            ASSERT_CLOSE(ct_to(z, CT_DEVICE_CPU), ax, 0, 0);
        }
        ct_scope_end();
    }
}
