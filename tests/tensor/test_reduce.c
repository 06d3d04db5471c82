/* Reductions against plain reference loops, on every layout and dtype, with
 * their edge cases, thread-count independence, autograd records and
 * errors. */
#include "ct_test.h"

#include <stdlib.h>

typedef enum ref_op {
    R_SUM,
    R_MEAN,
    R_PROD,
    R_AMAX,
    R_AMIN,
    R_VAR,
    R_STD,
    R_LSE,
    R_NORM,
    R_MAX_DIM,
    R_MIN_DIM,
    R_ARGMAX,
    R_ARGMIN,
} ref_op;

static const char *const ref_names[] = {"sum",     "mean",   "prod",      "amax", "amin",
                                        "var",     "std",    "logsumexp", "norm", "max_dim",
                                        "min_dim", "argmax", "argmin"};

static bool single_dim(ref_op op) { return op >= R_MAX_DIM; }

static ct_tensor *run_op(ref_op op, ct_tensor *t, const int *dims, int ndims, bool keepdim,
                         double scalar, ct_tensor **indices) {
    switch (op) {
    case R_SUM: return ct_sum(t, dims, ndims, keepdim);
    case R_MEAN: return ct_mean(t, dims, ndims, keepdim);
    case R_PROD: return ct_prod(t, dims, ndims, keepdim);
    case R_AMAX: return ct_amax(t, dims, ndims, keepdim);
    case R_AMIN: return ct_amin(t, dims, ndims, keepdim);
    case R_VAR: return ct_var(t, dims, ndims, scalar, keepdim);
    case R_STD: return ct_std(t, dims, ndims, scalar, keepdim);
    case R_LSE: return ct_logsumexp(t, dims, ndims, keepdim);
    case R_NORM: return ct_norm(t, scalar, dims, ndims, keepdim);
    case R_MAX_DIM: return ct_max_dim(t, dims[0], keepdim, indices);
    case R_MIN_DIM: return ct_min_dim(t, dims[0], keepdim, indices);
    case R_ARGMAX: return ct_argmax(t, dims[0], keepdim);
    case R_ARGMIN: return ct_argmin(t, dims[0], keepdim);
    }
    return NULL;
}

/* Index of the first extreme of v (the first NaN if there is one). */
static int64_t ref_arg(const double *v, int64_t n, bool max) {
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(v[i]))
            return i;
        if (max ? v[i] > v[best] : v[i] < v[best])
            best = i;
    }
    return best;
}

static double ref_value(ref_op op, const double *v, int64_t n, double scalar) {
    double acc = 0, m;
    switch (op) {
    case R_SUM:
    case R_MEAN:
        for (int64_t i = 0; i < n; i++)
            acc += v[i];
        return op == R_MEAN ? acc / (double)n : acc;
    case R_PROD:
        acc = 1;
        for (int64_t i = 0; i < n; i++)
            acc *= v[i];
        return acc;
    case R_AMAX:
    case R_MAX_DIM: return v[ref_arg(v, n, true)];
    case R_AMIN:
    case R_MIN_DIM: return v[ref_arg(v, n, false)];
    case R_ARGMAX: return (double)ref_arg(v, n, true);
    case R_ARGMIN: return (double)ref_arg(v, n, false);
    case R_VAR:
    case R_STD: {
        double mean = ref_value(R_MEAN, v, n, 0);
        for (int64_t i = 0; i < n; i++)
            acc += (v[i] - mean) * (v[i] - mean);
        double dof = (double)n - scalar;
        acc /= dof > 0 ? dof : 0;
        return op == R_STD ? sqrt(acc) : acc;
    }
    case R_LSE:
        m = n ? v[ref_arg(v, n, true)] : -INFINITY;
        if (!isfinite(m))
            return m;
        for (int64_t i = 0; i < n; i++)
            acc += exp(v[i] - m);
        return m + log(acc);
    case R_NORM:
        if (isinf(scalar)) {
            m = fabs(v[0]);
            for (int64_t i = 1; i < n; i++)
                m = scalar > 0 ? fmax(m, fabs(v[i])) : fmin(m, fabs(v[i]));
            return m;
        }
        for (int64_t i = 0; i < n; i++)
            acc += scalar == 0 ? v[i] != 0 : pow(fabs(v[i]), scalar);
        return scalar == 0 ? acc : pow(acc, 1 / scalar);
    }
    return NAN;
}

/* The reduction of t over the dims in mask, computed in float64 one output
 * at a time from its elements in row-major order. */
static ct_tensor *ref_reduce(ref_op op, ct_tensor *t, const bool *mask, bool keepdim,
                             double scalar) {
    int nd = ct_ndim(t), ond = 0;
    const int64_t *sz = ct_sizes(t);
    int64_t osz[CT_MAX_DIMS], nred = 1, nout = 1, idx[CT_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        if (mask[d])
            nred *= sz[d];
        else
            nout *= sz[d];
        if (!mask[d] || keepdim)
            osz[ond++] = mask[d] ? 1 : sz[d];
    }
    int64_t n = ct_numel(t);
    /* Read through a float64 copy: element by element is too slow under
     * TSan for the large shapes. */
    const double *in = ct_data_ptr(ct_contiguous(ct_to_dtype(t, CT_FLOAT64)));
    double *vals = malloc(sizeof(double) * (size_t)(n + 1));
    double *res = malloc(sizeof(double) * (size_t)(nout + 1));
    int64_t *fill = calloc((size_t)(nout + 1), sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) {
        tt_unravel(i, nd, sz, idx);
        int64_t o = 0;
        for (int d = 0; d < nd; d++)
            if (!mask[d])
                o = o * sz[d] + idx[d];
        vals[o * nred + fill[o]++] = in[i];
    }
    for (int64_t o = 0; o < nout; o++)
        res[o] = ref_value(op, vals + o * nred, nred, scalar);
    ct_tensor *r = ct_from_data(res, ond, osz, CT_FLOAT64);
    free(vals);
    free(res);
    free(fill);
    return r;
}

static void dims_mask(int nd, const int *dims, int ndims, bool *mask) {
    for (int d = 0; d < CT_MAX_DIMS; d++)
        mask[d] = ndims == 0;
    for (int i = 0; i < ndims; i++)
        mask[dims[i] < 0 ? dims[i] + (nd > 0 ? nd : 1) : dims[i]] = true;
}

static ct_dtype want_dtype(ref_op op, ct_dtype in) {
    if (op == R_ARGMAX || op == R_ARGMIN)
        return CT_INT64;
    if (ct_dtype_is_float(in))
        return in;
    if (op == R_SUM || op == R_PROD)
        return CT_INT64;
    return op == R_LSE ? CT_FLOAT32 : in;
}

/* Relative tolerance for results stored in each dtype; integers are exact. */
static const double rtol_of[CT_NDTYPES] = {
    [CT_FLOAT64] = 1e-10, [CT_FLOAT32] = 2e-5, [CT_FLOAT16] = 2e-3, [CT_BFLOAT16] = 1e-2};

/* Runs op on t and compares shape, dtype, values and (max_dim) indices with
 * the reference. */
static bool check_op(ref_op op, ct_tensor *t, const int *dims, int ndims, bool keepdim,
                     double scalar, const char *what) {
    ct_tensor *idx = NULL;
    ct_tensor *got = run_op(op, t, dims, ndims, keepdim, scalar, &idx);
    bool mask[CT_MAX_DIMS];
    dims_mask(ct_ndim(t), dims, ndims, mask);
    ct_tensor *want = ref_reduce(op, t, mask, keepdim, scalar);
    ct_dtype wd = want_dtype(op, ct_tensor_dtype(t));
    char dims_str[64] = "all";
    for (int i = 0, len = 0; i < ndims; i++)
        len +=
            snprintf(dims_str + len, sizeof dims_str - (size_t)len, "%s%d", i ? "," : "", dims[i]);
    if (!got || ct_tensor_dtype(got) != wd) {
        tt_fail(__FILE__, __LINE__, "%s %s over %s (keepdim %d): %s", ref_names[op], what, dims_str,
                keepdim, got ? ct_dtype_name(ct_tensor_dtype(got)) : ct_errmsg());
        return false;
    }
    double rtol = rtol_of[wd];
    /* Sums of many values in [-2, 2] cancel, so give float results an
     * absolute floor too. */
    if (!tt_close(__FILE__, __LINE__, got, want, rtol, rtol)) {
        tt_fail(__FILE__, __LINE__, "  in %s %s over %s (keepdim %d)", ref_names[op], what,
                dims_str, keepdim);
        return false;
    }
    if ((op == R_MAX_DIM || op == R_MIN_DIM) &&
        !tt_close(__FILE__, __LINE__, idx,
                  ref_reduce(op == R_MAX_DIM ? R_ARGMAX : R_ARGMIN, t, mask, keepdim, 0), 0, 0)) {
        tt_fail(__FILE__, __LINE__, "  indices of %s %s over %s", ref_names[op], what, dims_str);
        return false;
    }
    return true;
}

typedef struct shape {
    int ndim;
    int64_t sizes[4];
} shape;

static const shape shapes[] = {
    {0, {0}},      {1, {17}},      {1, {1023}},     {2, {2, 3}},    {2, {7, 1}},
    {2, {20, 37}}, {3, {4, 5, 6}}, {3, {3, 1, 17}}, {3, {2, 0, 3}}, {4, {2, 3, 4, 5}},
};
#define NSHAPES (int)(sizeof shapes / sizeof *shapes)

/* Every dims list worth testing on an nd-dim tensor: all dims, each dim (and
 * its negative spelling), and each pair. Returns how many; list[k] holds
 * count[k] dims. */
static int dims_lists(int nd, bool single, int list[][2], int *count) {
    int n = 0;
    if (!single)
        count[n++] = 0;
    for (int d = 0; d < (nd > 0 ? nd : 1); d++) {
        list[n][0] = d;
        count[n++] = 1;
    }
    list[n][0] = -1;
    count[n++] = 1;
    for (int a = 0; !single && a < nd; a++)
        for (int b = a + 1; b < nd; b++) {
            list[n][0] = b;
            list[n][1] = a;
            count[n++] = 2;
        }
    return n;
}

/* op over every shape, dims list, keepdim and layout for each dtype. */
static bool check_matrix(ref_op op, const ct_dtype *dtypes, int ndtypes, double scalar) {
    for (int s = 0; s < NSHAPES; s++) {
        const shape *sh = &shapes[s];
        int list[16][2], count[16];
        int nlists = dims_lists(sh->ndim, single_dim(op), list, count);
        for (int di = 0; di < ndtypes; di++) {
            ct_tensor *base = tt_rand(sh->ndim, sh->sizes, dtypes[di], (uint64_t)(s * 31 + di));
            for (int l = 0; l < TT_NLAYOUTS; l++) {
                ct_tensor *t = tt_layout_of(base, (tt_layout)l);
                char what[64];
                snprintf(what, sizeof what, "%s %s", ct_dtype_name(dtypes[di]),
                         tt_layout_name((tt_layout)l));
                for (int k = 0; k < nlists; k++) {
                    /* Reducing an empty dim has no identity for these. */
                    bool extreme = op == R_AMAX || op == R_AMIN || single_dim(op) ||
                                   (op == R_NORM && isinf(scalar));
                    bool mask[CT_MAX_DIMS];
                    dims_mask(sh->ndim, list[k], count[k], mask);
                    bool empty = false;
                    for (int d = 0; d < sh->ndim; d++)
                        empty |= mask[d] && sh->sizes[d] == 0;
                    if (extreme && empty)
                        continue;
                    for (int keep = 0; keep < 2; keep++)
                        if (!check_op(op, t, list[k], count[k], keep, scalar, what)) {
                            tt_fail(__FILE__, __LINE__, "  shape #%d", s);
                            return false;
                        }
                }
            }
        }
    }
    return true;
}

static const ct_dtype float_dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16};
static const ct_dtype all_dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16,
                                      CT_INT64,   CT_INT32,   CT_UINT8,    CT_BOOL};
#define NFLOAT 4
#define NALL   8

TEST(sum_matches_reference) { ASSERT_TRUE(check_matrix(R_SUM, all_dtypes, NALL, 0)); }
TEST(mean_matches_reference) { ASSERT_TRUE(check_matrix(R_MEAN, float_dtypes, NFLOAT, 0)); }
TEST(amax_amin_match_reference) {
    ASSERT_TRUE(check_matrix(R_AMAX, all_dtypes, NALL, 0));
    ASSERT_TRUE(check_matrix(R_AMIN, all_dtypes, NALL, 0));
}
TEST(var_std_match_reference) {
    ASSERT_TRUE(check_matrix(R_VAR, float_dtypes, NFLOAT, 1));
    ASSERT_TRUE(check_matrix(R_VAR, float_dtypes, 2, 0));
    ASSERT_TRUE(check_matrix(R_STD, float_dtypes, NFLOAT, 1));
}
TEST(logsumexp_matches_reference) { ASSERT_TRUE(check_matrix(R_LSE, all_dtypes, NALL, 0)); }
TEST(norm_matches_reference) {
    static const double ps[] = {2, 1, INFINITY, -INFINITY, 0, 3, 0.5};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++)
        ASSERT_TRUE(check_matrix(R_NORM, float_dtypes, i < 2 ? NFLOAT : 2, ps[i]));
}
TEST(max_min_dim_and_arg_match_reference) {
    for (ref_op op = R_MAX_DIM; op <= R_ARGMIN; op++)
        ASSERT_TRUE(check_matrix(op, all_dtypes, NALL, 0));
}

/* Products of many values over/underflow, so prod gets short rows of values
 * near 1 and small integers. */
TEST(prod_matches_reference) {
    ct_tensor *f = ct_add_scalar(ct_div_scalar(tt_rand(CT_SHAPE(6, 37), CT_FLOAT64, 5), 8), 1);
    for (int di = 0; di < NALL; di++) {
        ct_tensor *base = ct_to_dtype(f, all_dtypes[di]);
        if (!ct_dtype_is_float(all_dtypes[di]))
            base = tt_rand(CT_SHAPE(2, 7), all_dtypes[di], 6);
        for (int l = 0; l < TT_NLAYOUTS; l++) {
            ct_tensor *t = tt_layout_of(base, (tt_layout)l);
            for (int keep = 0; keep < 2; keep++) {
                ASSERT_TRUE(check_op(R_PROD, t, NULL, 0, keep, 0, "all"));
                ASSERT_TRUE(check_op(R_PROD, t, CT_DIMS(0), keep, 0, "dim 0"));
                ASSERT_TRUE(check_op(R_PROD, t, CT_DIMS(-1), keep, 0, "dim -1"));
            }
        }
    }
}

/* Shapes large enough to cut into several chunks, in both the contiguous
 * (inner) and the across-outputs (outer) kernels. */
TEST(large_reductions_match_reference) {
    static const shape big[] = {
        {2, {3, 40000}}, {2, {5000, 7}}, {2, {700, 300}}, {3, {9, 70, 130}}, {1, {70001}}};
    static const ref_op ops[] = {R_SUM, R_MEAN, R_AMAX, R_VAR, R_LSE, R_NORM, R_ARGMAX};
    for (size_t s = 0; s < sizeof big / sizeof *big; s++) {
        ct_tensor *t = tt_rand(big[s].ndim, big[s].sizes, CT_FLOAT64, s);
        ct_tensor *f = ct_to_dtype(t, CT_FLOAT32);
        for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
            for (int d = -1; d < big[s].ndim; d++) {
                int nd = d < 0 ? 0 : 1;
                ASSERT_TRUE(check_op(ops[o], t, &d, nd || single_dim(ops[o]), false, 2, "big"));
                ASSERT_TRUE(check_op(ops[o], f, &d, nd || single_dim(ops[o]), false, 2, "big"));
            }
    }
}

TEST(expanded_inputs) {
    ct_tensor *row = tt_rand(CT_SHAPE(1, 5), CT_FLOAT32, 1);
    ct_tensor *col = tt_rand(CT_SHAPE(4, 1), CT_FLOAT64, 2);
    ct_tensor *er = ct_expand(row, CT_SHAPE(40, 5));
    ct_tensor *ec = ct_expand(col, CT_SHAPE(4, 60));
    for (ref_op op = R_SUM; op <= R_ARGMIN; op++)
        for (int d = 0; d < 2; d++) {
            double p = op == R_NORM ? 3 : 1;
            ASSERT_TRUE(check_op(op, er, &d, 1, false, p, "expanded rows"));
            ASSERT_TRUE(check_op(op, ec, &d, 1, true, p, "expanded columns"));
            if (!single_dim(op))
                ASSERT_TRUE(check_op(op, er, NULL, 0, false, p, "expanded rows"));
        }
}

/* Views whose kept dims do not merge, so batches of outputs end at a kept
 * dim's edge. */
TEST(views_with_gaps) {
    ct_tensor *base = tt_rand(CT_SHAPE(6, 7, 50), CT_FLOAT32, 12);
    ct_tensor *v = ct_narrow(base, 1, 1, 5);
    ct_tensor *w = ct_narrow(ct_transpose(base, 0, 1), 0, 2, 3);
    for (ref_op op = R_SUM; op <= R_ARGMIN; op++)
        for (int d = -1; d < 3; d++) {
            int nd = d < 0 && !single_dim(op) ? 0 : 1, dim = d < 0 ? 2 : d;
            ASSERT_TRUE(check_op(op, v, &dim, nd, false, 3, "narrowed"));
            ASSERT_TRUE(check_op(op, w, &dim, nd, true, 3, "transposed and narrowed"));
        }
}

TEST(sum_of_integers_and_bools_is_int64) {
    ct_tensor *b = ct_from_data((uint8_t[]){1, 0, 1, 1}, CT_SHAPE(4), CT_BOOL);
    ct_tensor *s = ct_sum(b, NULL, 0, false);
    ASSERT_EQ(ct_tensor_dtype(s), CT_INT64);
    ASSERT_EQ(ct_item_int64(s), 3);
    ct_tensor *big =
        ct_from_data((int64_t[]){INT64_MAX / 2, INT64_MAX / 2, 1}, CT_SHAPE(3), CT_INT64);
    ASSERT_EQ(ct_item_int64(ct_sum(big, NULL, 0, false)), INT64_MAX);
    ASSERT_EQ(ct_tensor_dtype(ct_prod(b, NULL, 0, false)), CT_INT64);
    ASSERT_EQ(ct_tensor_dtype(ct_amax(b, NULL, 0, false)), CT_BOOL);
    ASSERT_EQ(ct_tensor_dtype(ct_logsumexp(b, NULL, 0, false)), CT_FLOAT32);
}

TEST(empty_reductions) {
    ct_tensor *e = ct_zeros(CT_SHAPE(2, 0, 3), CT_FLOAT32);
    ct_tensor *s = ct_sum(e, CT_DIMS(1), false);
    ASSERT_TRUE(s);
    ASSERT_EQ(ct_ndim(s), 2);
    ASSERT_NEAR(ct_get(s, (int64_t[]){1, 2}), 0, 0);
    ASSERT_NEAR(ct_item(ct_sum(e, NULL, 0, false)), 0, 0);
    ASSERT_NEAR(ct_item(ct_prod(e, NULL, 0, false)), 1, 0);
    ASSERT_TRUE(isnan(ct_item(ct_mean(e, NULL, 0, false))));
    ASSERT_TRUE(isnan(ct_item(ct_var(e, NULL, 0, 1, false))));
    ASSERT_TRUE(isinf(ct_item(ct_logsumexp(e, NULL, 0, false))));
    ASSERT_NEAR(ct_item(ct_norm(e, 2, NULL, 0, false)), 0, 0);
    ASSERT_EQ(ct_item_int64(ct_sum(ct_zeros(CT_SHAPE(0), CT_INT32), NULL, 0, false)), 0);
    /* Reducing a non-empty dim of an empty tensor gives an empty result. */
    ct_tensor *m = ct_amax(e, CT_DIMS(2), true);
    ASSERT_TRUE(m);
    ASSERT_EQ(ct_numel(m), 0);
    ASSERT_EQ(ct_size(m, 2), 1);
    ASSERT_FAILS(ct_amax(e, CT_DIMS(1), false), CT_EINVAL, "amax", "[2, 0, 3]", "size 0");
    ASSERT_FAILS(ct_amin(e, NULL, 0, false), CT_EINVAL, "amin", "[2, 0, 3]");
    ASSERT_FAILS(ct_argmax(e, 1, false), CT_EINVAL, "argmax", "[2, 0, 3]");
    ASSERT_FAILS(ct_max_dim(e, 1, false, NULL), CT_EINVAL, "max_dim", "[2, 0, 3]");
    ASSERT_FAILS(ct_norm(e, INFINITY, NULL, 0, false), CT_EINVAL, "norm", "[2, 0, 3]");
}

TEST(scalar_tensors) {
    ct_tensor *x = ct_scalar(-2.5, CT_FLOAT64);
    ASSERT_NEAR(ct_item(ct_sum(x, CT_DIMS(0), false)), -2.5, 0);
    ASSERT_NEAR(ct_item(ct_amax(x, CT_DIMS(-1), true)), -2.5, 0);
    ASSERT_NEAR(ct_item(ct_norm(x, 1, NULL, 0, false)), 2.5, 0);
    ASSERT_EQ(ct_ndim(ct_mean(x, NULL, 0, true)), 0);
    ASSERT_EQ(ct_item_int64(ct_argmax(x, 0, false)), 0);
    ASSERT_FAILS(ct_sum(x, CT_DIMS(1), false), CT_EINVAL, "sum", "float64[]");
}

TEST(nan_propagates_and_first_index_wins) {
    ct_tensor *t =
        ct_from_data((float[]){1, NAN, 3, NAN, 3, -1, -1, 3}, CT_SHAPE(2, 4), CT_FLOAT32);
    ct_tensor *idx;
    ct_tensor *v = ct_max_dim(t, 1, false, &idx);
    ASSERT_TRUE(isnan(ct_get(v, (int64_t[]){0})));
    ASSERT_EQ(ct_get(idx, (int64_t[]){0}), 1);
    ASSERT_NEAR(ct_get(v, (int64_t[]){1}), 3, 0);
    ASSERT_EQ(ct_get(idx, (int64_t[]){1}), 0);
    ASSERT_EQ(ct_get(ct_argmin(t, 1, false), (int64_t[]){1}), 1);
    ASSERT_EQ(ct_get(ct_argmin(t, 1, false), (int64_t[]){0}), 1);
    ASSERT_TRUE(isnan(ct_item(ct_amax(t, NULL, 0, false))));
    ASSERT_TRUE(isnan(ct_item(ct_amin(t, NULL, 0, false))));
    ASSERT_TRUE(isnan(ct_get(ct_logsumexp(t, CT_DIMS(1), false), (int64_t[]){0})));
    /* Short runs are reduced across outputs (the outer kernel), strided or
     * contiguous. */
    ct_tensor *tr = ct_transpose(t, 0, 1);
    ASSERT_EQ(ct_get(ct_argmax(tr, 0, false), (int64_t[]){0}), 1);
    ASSERT_EQ(ct_get(ct_argmax(ct_contiguous(tr), 0, false), (int64_t[]){0}), 1);
    ASSERT_EQ(ct_get(ct_argmin(ct_contiguous(tr), 0, false), (int64_t[]){1}), 1);
    ASSERT_TRUE(isnan(ct_get(ct_amax(ct_contiguous(tr), CT_DIMS(0), false), (int64_t[]){0})));
}

TEST(logsumexp_special_values) {
    double in[][2] = {
        {-INFINITY, -INFINITY}, {INFINITY, 1}, {NAN, 1}, {1000, 1000}, {-INFINITY, 2}};
    double want[] = {-INFINITY, INFINITY, NAN, 1000 + log(2.0), 2};
    for (int i = 0; i < 5; i++) {
        ct_tensor *t = ct_from_data(in[i], CT_SHAPE(2), CT_FLOAT64);
        double got = ct_item(ct_logsumexp(ct_to_dtype(t, CT_FLOAT32), NULL, 0, false));
        if (isnan(want[i]))
            ASSERT_TRUE(isnan(got));
        else
            ASSERT_NEAR(got, want[i], 1e-4);
        got = ct_item(ct_logsumexp(t, NULL, 0, false));
        ASSERT_TRUE(isnan(want[i]) ? isnan(got) : fabs(got - want[i]) <= 1e-12 || got == want[i]);
    }
}

TEST(var_correction_and_tiny_counts) {
    ct_tensor *t = ct_from_data((double[]){1, 2, 4}, CT_SHAPE(3), CT_FLOAT64);
    ASSERT_NEAR(ct_item(ct_var(t, NULL, 0, 0, false)), 14.0 / 9, 1e-15);
    ASSERT_NEAR(ct_item(ct_var(t, NULL, 0, 1, false)), 7.0 / 3, 1e-15);
    ASSERT_NEAR(ct_item(ct_std(t, NULL, 0, 1, false)), sqrt(7.0 / 3), 1e-15);
    ASSERT_TRUE(isinf(ct_item(ct_var(t, NULL, 0, 3, false))));
    ct_tensor *one = ct_from_data((double[]){5}, CT_SHAPE(1), CT_FLOAT64);
    ASSERT_TRUE(isnan(ct_item(ct_var(one, NULL, 0, 1, false))));
    ASSERT_NEAR(ct_item(ct_var(one, NULL, 0, 0, false)), 0, 0);
    /* A large offset does not swamp a small spread. */
    ct_tensor *off = ct_add_scalar(tt_rand(CT_SHAPE(100000), CT_FLOAT32, 3), 1e4);
    double v = ct_item(ct_var(off, NULL, 0, 1, false));
    ASSERT_NEAR(v, 4.0 / 3, 0.03);
}

/* float32 var and std of deviations whose float squares underflow (5e-24)
 * or overflow (2e38), while the std of each is a normal float: summed in
 * double, rooted and rounded once. Whole tensors, short rows (the column
 * kernels) and long rows (the run kernels, lanes and tail) all do. */
TEST(float32_std_of_tiny_and_huge_spreads) {
    double v[3][101] = {{1e-23, 0}, {3e38, 0, 1}};
    for (int i = 0; i < 101; i++)
        v[2][i] = i % 2 ? 0 : 1e-23;
    static const int64_t len[] = {2, 3, 101};
    double want[] = {sqrt(2.0) * 5e-24, sqrt(3.0) * 1e38, 1e-23 * sqrt(51.0 * 50 / (101 * 100))};
    for (int k = 0; k < 3; k++) {
        ct_tensor *x = ct_to_dtype(ct_from_data(v[k], CT_SHAPE(len[k]), CT_FLOAT64), CT_FLOAT32);
        ct_tensor *rows = ct_contiguous(ct_expand(ct_unsqueeze(x, 0), CT_SHAPE(3, len[k])));
        ct_tensor *cols = ct_contiguous(ct_transpose(rows, 0, 1));
        ct_tensor *got[] = {ct_std(x, NULL, 0, 1, false), ct_std(rows, CT_DIMS(1), 1, false),
                            ct_std(cols, CT_DIMS(0), 1, false)};
        for (int g = 0; g < 3; g++)
            for (int64_t i = 0; i < ct_numel(got[g]); i++)
                ASSERT_NEAR(tt_at(got[g], i) / want[k], 1, 1e-7);
    }
}

/* A partial whose mean squared overflows merges into an empty one without
 * NaN (0 * inf): squared deviations that overflow give +inf, constant rows
 * of large values 0, as the whole-tensor reduction gives. Rows of a few
 * elements take the column kernels. */
TEST(float64_var_of_huge_values_is_inf_or_zero) {
    ct_tensor *x = ct_from_data((double[]){1e200, 3e200}, CT_SHAPE(2), CT_FLOAT64);
    ct_tensor *rows = ct_contiguous(ct_expand(ct_unsqueeze(x, 0), CT_SHAPE(2, 2)));
    ct_tensor *cols = ct_contiguous(ct_transpose(rows, 0, 1));
    for (int sd = 0; sd < 2; sd++) {
        ct_tensor *(*f)(ct_tensor *, const int *, int, double, bool) = sd ? ct_std : ct_var;
        ct_tensor *huge[] = {f(x, NULL, 0, 1, false), f(rows, CT_DIMS(1), 1, false),
                             f(cols, CT_DIMS(0), 0, false)};
        for (int g = 0; g < 3; g++)
            for (int64_t i = 0; i < ct_numel(huge[g]); i++)
                ASSERT_TRUE(tt_at(huge[g], i) == INFINITY);
        ct_tensor *flat[] = {f(rows, CT_DIMS(0), 1, false), f(cols, CT_DIMS(1), 0, true)};
        for (int g = 0; g < 2; g++)
            for (int64_t i = 0; i < ct_numel(flat[g]); i++)
                ASSERT_TRUE(tt_at(flat[g], i) == 0);
    }
}

/* Float32 sums keep double-like accuracy over many elements. */
TEST(float32_sum_is_accurate) {
    int64_t n = 1 << 22;
    ct_tensor *t = ct_full(CT_SHAPE(n), 0.1, CT_FLOAT32);
    double want = (double)0.1f * (double)n;
    ASSERT_NEAR(ct_item(ct_sum(t, NULL, 0, false)), want, want * 1e-6);
    ct_tensor *cols = ct_full(CT_SHAPE(n / 64, 64), 0.1, CT_FLOAT32);
    ASSERT_NEAR(ct_get(ct_sum(cols, CT_DIMS(0), false), (int64_t[]){3}), want / 64,
                want / 64 * 1e-6);
}

static bool bitwise_equal(ct_tensor *a, ct_tensor *b) {
    return a && b && ct_numel(a) == ct_numel(b) && ct_tensor_dtype(a) == ct_tensor_dtype(b) &&
           memcmp(ct_data_ptr(a), ct_data_ptr(b),
                  (size_t)ct_numel(a) * ct_dtype_size(ct_tensor_dtype(a))) == 0;
}

/* Every reduction gives the same bits on 1, 2 and 3 threads. */
TEST(results_do_not_depend_on_thread_count) {
    static const shape big[] = {
        {1, {1 << 18}}, {2, {1500, 300}}, {2, {3, 50001}}, {2, {30001, 5}}, {3, {64, 33, 65}}};
    int saved = ct_get_num_threads();
    for (size_t s = 0; s < sizeof big / sizeof *big; s++) {
        ct_tensor *t = tt_rand(big[s].ndim, big[s].sizes, CT_FLOAT32, s + 100);
        ct_tensor *h = ct_to_dtype(t, CT_BFLOAT16);
        for (ref_op op = R_SUM; op <= R_ARGMIN; op++)
            for (int d = -1; d < big[s].ndim; d++) {
                if (op == R_PROD)
                    continue;
                if (d < 0 && single_dim(op))
                    continue;
                int nd = d < 0 ? 0 : 1, dim = d;
                ct_tensor *res[3], *hres[3];
                for (int n = 1; n <= 3; n++) {
                    ASSERT_EQ(ct_set_num_threads(n), 0);
                    res[n - 1] = run_op(op, t, &dim, nd, false, 2, NULL);
                    hres[n - 1] = run_op(op, h, &dim, nd, false, 2, NULL);
                }
                for (int n = 1; n < 3; n++) {
                    if (!bitwise_equal(res[0], res[n]) || !bitwise_equal(hres[0], hres[n])) {
                        ct_set_num_threads(saved);
                        tt_fail(__FILE__, __LINE__,
                                "%s of shape #%zu over dim %d differs on %d threads", ref_names[op],
                                s, d, n + 1);
                        return;
                    }
                }
            }
    }
    ct_set_num_threads(saved);
}

/* The last record, copied: its arrays are borrowed for the call only. */
static struct {
    ct_op op;
    int ninputs, noutputs, count;
    ct_tensor *in, *out[2];
    ct_op_args args;
} seen;

static int recorder(const ct_op_record *rec) {
    seen.op = rec->op;
    seen.ninputs = rec->ninputs;
    seen.noutputs = rec->noutputs;
    seen.in = rec->inputs[0];
    for (int i = 0; i < rec->noutputs && i < 2; i++)
        seen.out[i] = rec->outputs[i];
    seen.args = *rec->args;
    seen.count++;
    return 0;
}

TEST(ops_are_recorded_for_autograd) {
    static const ct_tensor_hooks hooks = {.record = recorder};
    ct_tensor *t = tt_rand(CT_SHAPE(3, 4, 5), CT_FLOAT32, 9);
    ct_tensor_set_hooks(&hooks);
    ct_tensor *v = ct_var(t, CT_DIMS(-1, 0), 0.5, true);
    ct_tensor_set_hooks(NULL);
    ASSERT_TRUE(v);
    ASSERT_EQ(seen.op, CT_OP_VAR);
    ASSERT_EQ(seen.ninputs, 1);
    ASSERT_TRUE(seen.in == t);
    ASSERT_TRUE(seen.out[0] == v);
    ASSERT_EQ(seen.args.nints, 2);
    ASSERT_EQ(seen.args.ints[0], 2);
    ASSERT_EQ(seen.args.ints[1], 0);
    ASSERT_TRUE(seen.args.keepdim);
    ASSERT_NEAR(seen.args.scalars[0], 0.5, 0);

    ct_tensor_set_hooks(&hooks);
    ct_tensor *idx;
    ct_tensor *m = ct_max_dim(t, 1, false, &idx);
    ct_tensor_set_hooks(NULL);
    ASSERT_EQ(seen.op, CT_OP_MAX_DIM);
    ASSERT_EQ(seen.noutputs, 2);
    ASSERT_TRUE(seen.out[0] == m && seen.out[1] == idx);
    ASSERT_EQ(ct_tensor_dtype(idx), CT_INT64);

    static const struct {
        ct_op op;
        ref_op ref;
    } each[] = {{CT_OP_SUM, R_SUM},       {CT_OP_MEAN, R_MEAN},    {CT_OP_PROD, R_PROD},
                {CT_OP_AMAX, R_AMAX},     {CT_OP_AMIN, R_AMIN},    {CT_OP_STD, R_STD},
                {CT_OP_LOGSUMEXP, R_LSE}, {CT_OP_NORM, R_NORM},    {CT_OP_MIN_DIM, R_MIN_DIM},
                {CT_OP_ARGMAX, R_ARGMAX}, {CT_OP_ARGMIN, R_ARGMIN}};
    for (size_t i = 0; i < sizeof each / sizeof *each; i++) {
        seen.count = 0;
        ct_tensor_set_hooks(&hooks);
        ct_tensor *r = run_op(each[i].ref, t, CT_DIMS(1), false, 3, NULL);
        ct_tensor_set_hooks(NULL);
        ASSERT_TRUE(r);
        ASSERT_EQ(seen.count, 1);
        ASSERT_EQ(seen.op, each[i].op);
        ASSERT_EQ(seen.args.ints[0], 1);
        if (each[i].op == CT_OP_NORM)
            ASSERT_NEAR(seen.args.scalars[0], 3, 0);
    }
}

/* Outside any scope the caller owns results; the indices max_dim makes when
 * the caller does not ask for them are released (ASan checks). */
TEST(max_dim_without_indices_leaks_nothing) {
    ct_tensor *t = ct_keep(tt_rand(CT_SHAPE(4, 6), CT_FLOAT64, 4));
    ct_scope_end();
    ct_tensor *m = ct_max_dim(t, 0, true, NULL);
    ct_tensor *idx = NULL;
    ct_tensor *n = ct_min_dim(t, 0, true, &idx);
    bool ok = m && n && idx && ct_get(idx, (int64_t[]){0, 0}) >= 0;
    ct_tensor_free(m);
    ct_tensor_free(n);
    ct_tensor_free(idx);
    ct_tensor_free(t);
    ct_scope_begin();
    ASSERT_TRUE(ok);
}

static int failing_recorder(const ct_op_record *rec) {
    (void)rec;
    return CT_ESTATE;
}

TEST(failing_recorder_fails_the_op) {
    static const ct_tensor_hooks hooks = {.record = failing_recorder};
    ct_tensor *t = tt_rand(CT_SHAPE(4, 6), CT_FLOAT64, 4);
    ct_tensor *idx = (ct_tensor *)1;
    ct_tensor_set_hooks(&hooks);
    ct_tensor *a = ct_max_dim(t, 0, true, NULL);
    ct_tensor *b = ct_min_dim(t, 1, false, &idx);
    ct_tensor *c = ct_sum(t, NULL, 0, false);
    ct_tensor_set_hooks(NULL);
    ASSERT_TRUE(!a && !b && !c && !idx);
    ASSERT_EQ(ct_errcode(), CT_ESTATE);
    ct_errclear();
}

TEST(errors_name_the_op_and_shape) {
    ct_tensor *t = ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32);
    ct_tensor *i = ct_zeros(CT_SHAPE(2, 3), CT_INT64);
    ASSERT_FAILS(ct_sum(t, CT_DIMS(2), false), CT_EINVAL, "sum", "[2, 3]", "dim 2");
    ASSERT_FAILS(ct_sum(t, CT_DIMS(-3), false), CT_EINVAL, "sum", "[2, 3]");
    ASSERT_FAILS(ct_sum(t, CT_DIMS(0, -2), false), CT_EINVAL, "sum", "[2, 3]", "more than once");
    ASSERT_FAILS(ct_prod(t, CT_DIMS(1, 1), false), CT_EINVAL, "prod", "[2, 3]");
    ASSERT_FAILS(ct_sum(t, NULL, 2, false), CT_EINVAL, "sum", "[2, 3]", "NULL");
    ASSERT_FAILS(ct_sum(t, CT_DIMS(0, 1, 0), false), CT_EINVAL, "sum", "[2, 3]");
    ASSERT_FAILS(ct_mean(i, NULL, 0, false), CT_EDTYPE, "mean", "int64[2, 3]", "floating");
    ASSERT_FAILS(ct_var(i, NULL, 0, 1, false), CT_EDTYPE, "var", "int64[2, 3]");
    ASSERT_FAILS(ct_std(i, NULL, 0, 1, false), CT_EDTYPE, "std", "int64[2, 3]");
    ASSERT_FAILS(ct_norm(i, 2, NULL, 0, false), CT_EDTYPE, "norm", "int64[2, 3]");
    ASSERT_FAILS(ct_norm(t, NAN, NULL, 0, false), CT_EINVAL, "norm", "NaN");
    ASSERT_FAILS(ct_argmax(t, 5, false), CT_EINVAL, "argmax", "[2, 3]");
    ASSERT_FAILS(ct_max_dim(t, -3, false, NULL), CT_EINVAL, "max_dim", "[2, 3]");
    ASSERT_FAILS(ct_sum(NULL, NULL, 0, false), CT_EINVAL, "sum", "NULL");
    ASSERT_FAILS(ct_logsumexp(NULL, NULL, 0, false), CT_EINVAL, "logsumexp");
    /* A NULL input keeps the first failure's message. */
    ct_errclear();
    ct_tensor *bad = ct_sum(t, CT_DIMS(7), false);
    ct_tensor *chained = ct_amax(ct_mean(bad, NULL, 0, false), NULL, 0, false);
    ASSERT_TRUE(!chained);
    ASSERT_STR_CONTAINS(ct_errmsg(), "sum: dim 7");
    ct_tensor *idx = (ct_tensor *)1;
    ASSERT_TRUE(!ct_min_dim(NULL, 0, false, &idx));
    ASSERT_TRUE(idx == NULL);
    ct_errclear();
}
