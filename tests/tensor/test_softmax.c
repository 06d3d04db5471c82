/* softmax and log_softmax against a plain reference loop, on every layout and
 * float dtype, with special values, thread-count independence, autograd
 * records and errors. */
#include "ct_test.h"

#include <stdlib.h>

/* Softmax (or log-softmax) of t along dim in float64, one row at a time. */
static ct_tensor *ref_softmax(ct_tensor *t, int dim, bool log_out) {
    int nd = ct_ndim(t);
    const int64_t *sz = ct_sizes(t);
    int d = dim < 0 ? dim + (nd > 0 ? nd : 1) : dim;
    int64_t n = ct_numel(t), len = nd > 0 ? sz[d] : 1, idx[CT_MAX_DIMS];
    double *out = malloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        tt_unravel(i, nd, sz, idx);
        if (nd > 0 && idx[d] != 0)
            continue;
        /* i is the first element of its row; the row steps by stride. */
        int64_t stride = 1;
        for (int k = nd - 1; k > d; k--)
            stride *= sz[k];
        double m = -INFINITY, s = 0;
        for (int64_t r = 0; r < len; r++) {
            double x = tt_at(t, i + r * stride);
            m = isnan(x) || x > m ? x : m;
        }
        for (int64_t r = 0; r < len; r++)
            s += exp(tt_at(t, i + r * stride) - m);
        for (int64_t r = 0; r < len; r++) {
            double x = tt_at(t, i + r * stride);
            out[i + r * stride] = log_out ? x - m - log(s) : exp(x - m) / s;
        }
    }
    ct_tensor *r = ct_from_data(out, nd, sz, CT_FLOAT64);
    free(out);
    return r;
}

static const double rtol_of[CT_NDTYPES] = {
    [CT_FLOAT64] = 1e-12, [CT_FLOAT32] = 1e-5, [CT_FLOAT16] = 2e-3, [CT_BFLOAT16] = 1e-2};

static bool check_softmax(ct_tensor *t, int dim, bool log_out, const char *what) {
    ct_tensor *got = log_out ? ct_log_softmax(t, dim) : ct_softmax(t, dim);
    ct_tensor *want = ref_softmax(t, dim, log_out);
    ct_dtype dt = ct_tensor_dtype(t);
    if (!got || ct_tensor_dtype(got) != dt) {
        tt_fail(__FILE__, __LINE__, "%s dim %d of %s: %s", log_out ? "log_softmax" : "softmax", dim,
                what, got ? ct_dtype_name(ct_tensor_dtype(got)) : ct_errmsg());
        return false;
    }
    /* log_softmax values reach about -10 here; softmax values are in [0, 1]. */
    double atol = rtol_of[dt] * (log_out ? 10 : 1);
    if (!tt_close(__FILE__, __LINE__, got, want, rtol_of[dt], atol)) {
        tt_fail(__FILE__, __LINE__, "  in %s dim %d of %s", log_out ? "log_softmax" : "softmax",
                dim, what);
        return false;
    }
    return true;
}

static const ct_dtype float_dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16};

/* Shapes that reach rows shorter and longer than a conversion block, single
 * rows, size-1 and size-0 dims, and tiles of columns that do not divide
 * evenly. */
TEST(softmax_matches_reference) {
    /* {ndim, sizes...} */
    static const int64_t shapes[][5] = {{0},          {1, 17},         {1, 1023},    {2, 2, 3},
                                        {2, 7, 1},    {2, 20, 37},     {3, 4, 5, 6}, {3, 3, 1, 17},
                                        {3, 2, 0, 3}, {4, 2, 3, 4, 5}, {2, 3, 5000}, {2, 130, 70}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int nd = (int)shapes[s][0];
        const int64_t *sizes = shapes[s] + 1;
        for (int di = 0; di < 4; di++) {
            ct_tensor *base = ct_mul_scalar(tt_rand(nd, sizes, float_dtypes[di], s * 7 + di), 3);
            for (int l = 0; l < TT_NLAYOUTS; l++) {
                ct_tensor *t = tt_layout_of(base, (tt_layout)l);
                char what[96];
                snprintf(what, sizeof what, "%s %s shape #%zu", ct_dtype_name(float_dtypes[di]),
                         tt_layout_name((tt_layout)l), s);
                for (int d = -1; d < (nd > 0 ? nd : 1); d++)
                    for (int lg = 0; lg < 2; lg++)
                        ASSERT_TRUE(check_softmax(t, d, lg, what));
            }
        }
    }
}

TEST(expanded_input) {
    ct_tensor *row = tt_rand(CT_SHAPE(1, 40), CT_FLOAT32, 3);
    ct_tensor *e = ct_expand(row, CT_SHAPE(30, 40));
    for (int d = 0; d < 2; d++)
        for (int lg = 0; lg < 2; lg++)
            ASSERT_TRUE(check_softmax(e, d, lg, "expanded"));
}

TEST(rows_sum_to_one) {
    ct_tensor *t = ct_mul_scalar(tt_rand(CT_SHAPE(64, 3000), CT_FLOAT32, 8), 20);
    ct_tensor *s = ct_sum(ct_softmax(t, 1), CT_DIMS(1), false);
    for (int64_t i = 0; i < 64; i++)
        ASSERT_NEAR(ct_get(s, &i), 1, 1e-5);
    s = ct_sum(ct_softmax(t, 0), CT_DIMS(0), false);
    for (int64_t i = 0; i < 3000; i += 7)
        ASSERT_NEAR(ct_get(s, &i), 1, 1e-5);
}

TEST(special_values) {
    static const double rows[][3] = {{-INFINITY, 1, 2},   {-INFINITY, -INFINITY, -INFINITY},
                                     {NAN, 1, 2},         {INFINITY, 1, 2},
                                     {1000, 1000, -1000}, {-1000, -1001, -1002}};
    for (int dt = 0; dt < 2; dt++) {
        ct_tensor *t = ct_from_data(rows, CT_SHAPE(6, 3), CT_FLOAT64);
        t = ct_to_dtype(t, float_dtypes[dt]);
        ct_tensor *tr = ct_contiguous(ct_transpose(t, 0, 1));
        for (int lg = 0; lg < 2; lg++) {
            ASSERT_TRUE(check_softmax(t, 1, lg, "special rows"));
            ASSERT_TRUE(check_softmax(tr, 0, lg, "special columns"));
        }
        ct_tensor *s = ct_softmax(t, 1);
        ASSERT_NEAR(ct_get(s, (int64_t[]){0, 0}), 0, 0);
        ASSERT_TRUE(isnan(ct_get(s, (int64_t[]){1, 0})));
        ASSERT_TRUE(isnan(ct_get(s, (int64_t[]){2, 2})));
        ASSERT_TRUE(isinf(ct_get(ct_log_softmax(t, 1), (int64_t[]){0, 0})));
    }
}

/* log_softmax is (x - max) - log(sum exp(x - max)): x - (max + log sum)
 * rounds the log to the spacing of the logits, which at 1e4 in float32
 * (1e16 in float64) is about log 2 itself. Rows and columns take different
 * kernels. */
TEST(log_softmax_keeps_accuracy_at_large_logits) {
    static const double rows[][3] = {{1e4, 1e4, 0}, {1e16, 1e16, 0}};
    for (int dt = 0; dt < 2; dt++) {
        ct_dtype dtype = dt ? CT_FLOAT64 : CT_FLOAT32;
        double tol = dt ? 1e-15 : 1e-7;
        ct_tensor *row = ct_from_data(rows[dt], CT_SHAPE(1, 3), CT_FLOAT64);
        ct_tensor *t = ct_to_dtype(ct_expand(row, CT_SHAPE(4, 3)), dtype);
        ct_tensor *ls[2] = {
            ct_log_softmax(t, 1),
            ct_transpose(ct_log_softmax(ct_contiguous(ct_transpose(t, 0, 1)), 0), 0, 1)};
        for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < 4; i++) {
                ASSERT_NEAR(ct_get(ls[k], (int64_t[]){i, 0}), -log(2.0), tol);
                ASSERT_NEAR(ct_get(ls[k], (int64_t[]){i, 1}), -log(2.0), tol);
                ASSERT_NEAR(ct_get(ls[k], (int64_t[]){i, 2}), -rows[dt][0] - log(2.0),
                            rows[dt][0] * tol);
            }
    }
}

static bool bitwise_equal(ct_tensor *a, ct_tensor *b) {
    return a && b && ct_numel(a) == ct_numel(b) &&
           memcmp(ct_data_ptr(a), ct_data_ptr(b),
                  (size_t)ct_numel(a) * ct_dtype_size(ct_tensor_dtype(a))) == 0;
}

TEST(results_do_not_depend_on_thread_count) {
    ct_tensor *t = ct_mul_scalar(tt_rand(CT_SHAPE(33, 70, 65), CT_FLOAT32, 5), 4);
    int saved = ct_get_num_threads();
    for (int d = 0; d < 3; d++)
        for (int lg = 0; lg < 2; lg++) {
            ct_tensor *r[3];
            for (int n = 1; n <= 3; n++) {
                ct_set_num_threads(n);
                r[n - 1] = lg ? ct_log_softmax(t, d) : ct_softmax(t, d);
            }
            ct_set_num_threads(saved);
            ASSERT_TRUE(bitwise_equal(r[0], r[1]));
            ASSERT_TRUE(bitwise_equal(r[0], r[2]));
        }
}

/* The last record, copied: its arrays are borrowed for the call only. */
static struct {
    ct_op op;
    ct_tensor *in, *out;
    ct_op_args args;
} seen;

static int recorder(const ct_op_record *rec) {
    seen.op = rec->op;
    seen.in = rec->inputs[0];
    seen.out = rec->outputs[0];
    seen.args = *rec->args;
    return 0;
}

TEST(ops_are_recorded_for_autograd) {
    static const ct_tensor_hooks hooks = {.record = recorder};
    ct_tensor *t = tt_rand(CT_SHAPE(3, 4), CT_FLOAT32, 2);
    ct_tensor_set_hooks(&hooks);
    ct_tensor *s = ct_softmax(t, -1);
    ct_tensor_set_hooks(NULL);
    ASSERT_EQ(seen.op, CT_OP_SOFTMAX);
    ASSERT_TRUE(seen.in == t && seen.out == s);
    ASSERT_EQ(seen.args.nints, 1);
    ASSERT_EQ(seen.args.ints[0], 1);
    ct_tensor_set_hooks(&hooks);
    ct_tensor *l = ct_log_softmax(t, 0);
    ct_tensor_set_hooks(NULL);
    ASSERT_EQ(seen.op, CT_OP_LOG_SOFTMAX);
    ASSERT_TRUE(seen.out == l);
    ASSERT_EQ(seen.args.ints[0], 0);
}

TEST(errors_name_the_op_and_shape) {
    ct_tensor *t = ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32);
    ASSERT_FAILS(ct_softmax(t, 2), CT_EINVAL, "softmax", "[2, 3]", "dim 2");
    ASSERT_FAILS(ct_log_softmax(t, -3), CT_EINVAL, "log_softmax", "[2, 3]");
    ASSERT_FAILS(ct_softmax(ct_zeros(CT_SHAPE(2, 3), CT_INT32), 1), CT_EDTYPE, "softmax",
                 "int32[2, 3]");
    ASSERT_FAILS(ct_log_softmax(ct_zeros(CT_SHAPE(4), CT_BOOL), 0), CT_EDTYPE, "log_softmax",
                 "bool[4]");
    ASSERT_FAILS(ct_softmax(NULL, 0), CT_EINVAL, "softmax", "NULL");
    ct_errclear();
    ASSERT_TRUE(!ct_log_softmax(ct_softmax(t, 5), 0));
    ASSERT_STR_CONTAINS(ct_errmsg(), "softmax: dim 5");
    ct_errclear();
}
