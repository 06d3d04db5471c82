/* Factories: values, shapes, dtypes, sequences and their errors. */
#include "ct_test.h"

#include <stdlib.h>

static const ct_dtype all_dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16,
                                      CT_INT64,   CT_INT32,   CT_UINT8,    CT_BOOL};
#define NDTYPES (int)(sizeof all_dtypes / sizeof *all_dtypes)

/* Every element of t equals value (as t's dtype stores it). */
static bool all_equal(ct_tensor *t, double value) {
    int64_t n = ct_numel(t);
    for (int64_t i = 0; i < n; i++)
        if (tt_at(t, i) != value) {
            tt_fail(__FILE__, __LINE__, "%s element %lld: %g, want %g",
                    ct_dtype_name(ct_tensor_dtype(t)), (long long)i, tt_at(t, i), value);
            return false;
        }
    return true;
}

TEST(zeros_ones_full_every_dtype_and_size) {
    /* 40000 elements cross the parallel grain; 17 and 1023 are odd sizes. */
    static const int64_t shapes[][3] = {
        {0, 3, 1}, {1, 1, 1}, {17, 1, 1}, {3, 1023, 1}, {4, 100, 100}};
    for (int d = 0; d < NDTYPES; d++) {
        ct_dtype dt = all_dtypes[d];
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            ct_tensor *z = ct_zeros(3, shapes[s], dt);
            ct_tensor *o = ct_ones(3, shapes[s], dt);
            ct_tensor *f = ct_full(3, shapes[s], -3.0, dt);
            ASSERT_TRUE(z && o && f);
            ASSERT_EQ(ct_tensor_dtype(f), dt);
            ASSERT_TRUE(ct_is_contiguous(f));
            ASSERT_EQ(ct_numel(f), shapes[s][0] * shapes[s][1] * shapes[s][2]);
            ASSERT_TRUE(all_equal(z, 0));
            ASSERT_TRUE(all_equal(o, 1));
            double want = dt == CT_BOOL ? 1 : dt == CT_UINT8 ? (uint8_t)-3 : -3;
            ASSERT_TRUE(all_equal(f, want));
        }
    }
    /* A value that the dtype rounds is stored rounded, once. */
    ct_tensor *b = ct_full(CT_SHAPE(5), 1.0 / 3.0, CT_BFLOAT16);
    ASSERT_NEAR(tt_at(b, 4), 1.0 / 3.0, 2e-3);
    ASSERT_TRUE(all_equal(b, tt_at(b, 0)));
}

TEST(scalar_is_zero_dimensional) {
    ct_tensor *s = ct_scalar(2.5, CT_FLOAT64);
    ASSERT_EQ(ct_ndim(s), 0);
    ASSERT_EQ(ct_numel(s), 1);
    ASSERT_NEAR(ct_item(s), 2.5, 0);
    ASSERT_EQ(ct_item_int64(ct_scalar(-7, CT_INT32)), -7);
    ASSERT_FAILS(ct_scalar(1, (ct_dtype)99), CT_EINVAL, "scalar", "dtype");
}

TEST(from_data_copies_every_dtype) {
    double vals[6] = {0, 1, -2, 3.5, 4, 1};
    for (int d = 0; d < NDTYPES; d++) {
        ct_dtype dt = all_dtypes[d];
        ct_tensor *ref = ct_from_data(vals, CT_SHAPE(2, 3), CT_FLOAT64);
        ct_tensor *want = ct_to_dtype(ref, dt);
        ASSERT_TRUE(want);
        /* Round-trip the dtype's own bytes. */
        unsigned char bytes[6 * 8];
        memcpy(bytes, ct_data_ptr(want), 6 * ct_dtype_size(dt));
        ct_tensor *t = ct_from_data(bytes, CT_SHAPE(2, 3), dt);
        ASSERT_TRUE(t && ct_data_ptr(t) != (void *)bytes);
        memset(bytes, 0xff, sizeof bytes);
        ASSERT_CLOSE(t, want, 0, 0);
    }
    ASSERT_EQ(ct_numel(ct_from_data(NULL, CT_SHAPE(4, 0), CT_FLOAT32)), 0);
    ASSERT_FAILS(ct_from_data(NULL, CT_SHAPE(2, 3), CT_FLOAT32), CT_EINVAL, "from_data", "NULL",
                 "[2, 3]");
    ASSERT_FAILS(ct_from_data(vals, CT_SHAPE(2, -3), CT_FLOAT64), CT_EINVAL, "from_data",
                 "[2, -3]");
}

TEST(eye_square_and_rectangular) {
    static const int64_t cases[][2] = {{0, -1}, {1, -1}, {4, -1}, {3, 5}, {5, 2}, {17, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int d = 0; d < NDTYPES; d++) {
            ct_tensor *e = ct_eye(cases[c][0], cases[c][1], all_dtypes[d]);
            int64_t n = cases[c][0], m = cases[c][1] < 0 ? n : cases[c][1];
            ASSERT_TRUE(e);
            ASSERT_EQ(ct_size(e, 0), n);
            ASSERT_EQ(ct_size(e, 1), m);
            for (int64_t i = 0; i < n * m; i++)
                ASSERT_EQ(tt_at(e, i), i / m == i % m);
        }
    }
    ASSERT_FAILS(ct_eye(-1, 3, CT_FLOAT32), CT_EINVAL, "eye", "[-1, 3]");
}

TEST(arange_matches_pytorch) {
    struct {
        double start, end, step;
        int64_t n;
    } cases[] = {
        {0, 5, 1, 5}, {0, 5.5, 1, 6}, {1, 2, 0.3, 4},     {5, 0, -1, 5},        {-1, -3, -0.5, 4},
        {2, 2, 1, 0}, {2, 2, -1, 0},  {0, 1023, 1, 1023}, {0, 40000, 1, 40000},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int d = 0; d < NDTYPES - 1; d++) {
            ct_dtype dt = all_dtypes[d];
            ct_tensor *a = ct_arange(cases[c].start, cases[c].end, cases[c].step, dt);
            ASSERT_TRUE(a);
            ASSERT_EQ(ct_ndim(a), 1);
            ASSERT_EQ(ct_size(a, 0), cases[c].n);
            ASSERT_EQ(ct_tensor_dtype(a), dt);
            ct_tensor *want = ct_empty(CT_SHAPE(cases[c].n), CT_FLOAT64);
            double *w = ct_data_ptr(want);
            for (int64_t i = 0; i < cases[c].n; i++)
                w[i] = cases[c].start + (double)i * cases[c].step;
            ASSERT_CLOSE(a, ct_to_dtype(want, dt), 0, 0);
        }
    }
    ASSERT_FAILS(ct_arange(0, 5, 0, CT_FLOAT32), CT_EINVAL, "arange", "step");
    ASSERT_FAILS(ct_arange(0, 5, -1, CT_FLOAT32), CT_EINVAL, "arange", "wrong sign");
    ASSERT_FAILS(ct_arange(5, 0, 1, CT_INT64), CT_EINVAL, "arange", "wrong sign");
    ASSERT_FAILS(ct_arange(0, INFINITY, 1, CT_FLOAT32), CT_EINVAL, "arange", "finite");
    ASSERT_FAILS(ct_arange(0, 1e30, 1e-30, CT_FLOAT32), CT_EINVAL, "arange", "too many");
}

TEST(linspace_ends_exactly) {
    ASSERT_EQ(ct_numel(ct_linspace(0, 1, 0, CT_FLOAT32)), 0);
    ct_tensor *one = ct_linspace(3, 7, 1, CT_FLOAT32);
    ASSERT_EQ(ct_numel(one), 1);
    ASSERT_EQ(tt_at(one, 0), 3);
    ct_tensor *l = ct_linspace(-1, 1, 5, CT_FLOAT64);
    double want[] = {-1, -0.5, 0, 0.5, 1};
    ASSERT_CLOSE(l, ct_from_data(want, CT_SHAPE(5), CT_FLOAT64), 0, 0);
    /* Both ends exact even when the step does not divide evenly. */
    ct_tensor *odd = ct_linspace(0.1, 0.7, 1023, CT_FLOAT64);
    ASSERT_EQ(tt_at(odd, 0), 0.1);
    ASSERT_EQ(tt_at(odd, 1022), 0.7);
    ASSERT_NEAR(tt_at(odd, 511), 0.4, 1e-15);
    ct_tensor *i = ct_linspace(0, 10, 4, CT_INT64);
    int64_t wi[] = {0, 3, 6, 10};
    ASSERT_CLOSE(i, ct_from_data(wi, CT_SHAPE(4), CT_INT64), 0, 0);
    ct_tensor *big = ct_linspace(0, 39999, 40000, CT_FLOAT32);
    for (int64_t k = 0; k < 40000; k += 997)
        ASSERT_EQ(tt_at(big, k), k);
    ASSERT_FAILS(ct_linspace(0, 1, -1, CT_FLOAT32), CT_EINVAL, "linspace", "-1 steps");
}

TEST(shape_errors_name_the_factory) {
    ASSERT_FAILS(ct_zeros(CT_SHAPE(2, -1), CT_FLOAT32), CT_EINVAL, "zeros", "[2, -1]");
    ASSERT_FAILS(ct_ones(CT_SHAPE(-4), CT_INT32), CT_EINVAL, "ones", "[-4]");
    ASSERT_FAILS(ct_full(CT_SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 1), 0, CT_FLOAT32), CT_EINVAL, "full",
                 "ndim 9");
    ASSERT_FAILS(ct_zeros(CT_SHAPE(2), (ct_dtype)-1), CT_EINVAL, "zeros", "dtype");
    ASSERT_FAILS(ct_ones(CT_SHAPE(INT64_MAX / 4, 8), CT_FLOAT32), CT_EINVAL, "ones", "too large");
    /* Empty, but its strides would overflow (found by fuzz_rpc). */
    ASSERT_FAILS(ct_empty(CT_SHAPE(0, INT64_C(1) << 56, (INT64_C(1) << 32) + 1), CT_FLOAT32),
                 CT_EINVAL, "too large");
    ct_tensor *empty = ct_empty(CT_SHAPE(0, 1 << 20, 1 << 20), CT_FLOAT32);
    ASSERT_TRUE(empty);
    ASSERT_EQ(ct_numel(empty), 0);
}

static int recorded_op = -1, recorded_inputs = -1;
static int record(const ct_op_record *rec) {
    recorded_op = rec->op;
    recorded_inputs = rec->ninputs;
    return 0;
}

TEST(factories_record_an_op_without_inputs) {
    static const ct_tensor_hooks hooks = {.record = record};
    ct_tensor_set_hooks(&hooks);
    ct_tensor *t = ct_linspace(0, 1, 3, CT_FLOAT32);
    ct_tensor_set_hooks(NULL);
    ASSERT_TRUE(t);
    ASSERT_EQ(recorded_op, CT_OP_EMPTY);
    ASSERT_EQ(recorded_inputs, 0);
}
