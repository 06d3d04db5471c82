/* ct_matmul against numpy.matmul's definition, evaluated in double. */
#include "ct_test.h"

#include <stdlib.h>

/* The reference: numpy.matmul written out as index arithmetic. */
static ct_tensor *ref_matmul(ct_tensor *a, ct_tensor *b) {
    int na = ct_ndim(a), nb = ct_ndim(b);
    int ba = na > 2 ? na - 2 : 0, bb = nb > 2 ? nb - 2 : 0, nbatch = ba > bb ? ba : bb;
    int64_t m = na > 1 ? ct_size(a, -2) : 1, n = nb > 1 ? ct_size(b, -1) : 1;
    int64_t k = ct_size(a, -1);
    int64_t batch[CT_MAX_DIMS], sizes[CT_MAX_DIMS];
    int ndim = 0;
    for (int d = 0; d < nbatch; d++) {
        int64_t sa = d - (nbatch - ba) < 0 ? 1 : ct_size(a, d - (nbatch - ba));
        int64_t sb = d - (nbatch - bb) < 0 ? 1 : ct_size(b, d - (nbatch - bb));
        batch[d] = sa == 1 ? sb : sa;
        sizes[ndim++] = batch[d];
    }
    if (na > 1)
        sizes[ndim++] = m;
    if (nb > 1)
        sizes[ndim++] = n;
    int64_t nbatches = 1;
    for (int d = 0; d < nbatch; d++)
        nbatches *= batch[d];
    double *vals = malloc(sizeof(double) * (size_t)(nbatches * m * n + 1));
    for (int64_t bi = 0; bi < nbatches; bi++) {
        int64_t bidx[CT_MAX_DIMS], ia[CT_MAX_DIMS], ib[CT_MAX_DIMS];
        tt_unravel(bi, nbatch, batch, bidx);
        for (int d = 0; d < ba; d++)
            ia[d] = ct_size(a, d) == 1 ? 0 : bidx[d + nbatch - ba];
        for (int d = 0; d < bb; d++)
            ib[d] = ct_size(b, d) == 1 ? 0 : bidx[d + nbatch - bb];
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double acc = 0;
                for (int64_t q = 0; q < k; q++) {
                    ia[na - 1] = q;
                    if (na > 1)
                        ia[na - 2] = i;
                    ib[nb > 1 ? nb - 2 : 0] = q;
                    if (nb > 1)
                        ib[nb - 1] = j;
                    acc += ct_get(a, ia) * ct_get(b, ib);
                }
                vals[(bi * m + i) * n + j] = acc;
            }
    }
    ct_tensor *want = ct_from_data(vals, ndim, sizes, CT_FLOAT64);
    free(vals);
    return want;
}

static void describe(char *buf, size_t cap, ct_tensor *t) {
    size_t len = (size_t)snprintf(buf, cap, "%s[", ct_dtype_name(ct_tensor_dtype(t)));
    for (int i = 0; i < ct_ndim(t) && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "",
                                (long long)ct_size(t, i));
    for (int i = 0; i < ct_ndim(t) && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "] strides (",
                                (long long)ct_stride(t, i));
    if (len < cap)
        snprintf(buf + len, cap - len, ")");
}

/* Tolerance for values summing k products of numbers in [-2, 2]. */
static void tolerance(ct_dtype dtype, int64_t k, double *rtol, double *atol) {
    double terms = 4.0 * (double)(k > 0 ? k : 1);
    switch (dtype) {
    case CT_FLOAT64: *rtol = 1e-12, *atol = 1e-14 * terms; return;
    case CT_FLOAT32: *rtol = 1e-5, *atol = 1e-6 * terms; return;
    case CT_BFLOAT16: *rtol = 1.0 / 128, *atol = 1e-6 * terms; return;
    case CT_FLOAT16: *rtol = 1.0 / 1024, *atol = 1e-6 * terms; return;
    default: *rtol = 0, *atol = 0; return;
    }
}

static bool check_matmul(const char *file, int line, ct_tensor *a, ct_tensor *b) {
    ct_tensor *got = ct_matmul(a, b);
    ct_tensor *want = got ? ref_matmul(a, b) : NULL;
    ct_dtype dtype = ct_promote_types(ct_tensor_dtype(a), ct_tensor_dtype(b));
    /* Integer results wrap to their dtype. */
    if (want && !ct_dtype_is_float(dtype))
        want = ct_to_dtype(want, dtype);
    double rtol, atol;
    tolerance(dtype, ct_size(a, -1), &rtol, &atol);
    if (got && ct_tensor_dtype(got) != dtype)
        tt_fail(file, line, "result dtype %s, want %s", ct_dtype_name(ct_tensor_dtype(got)),
                ct_dtype_name(dtype));
    else if (got && tt_close(file, line, got, want, rtol, atol))
        return true;
    char da[160], db[160];
    describe(da, sizeof da, a);
    describe(db, sizeof db, b);
    tt_fail(file, line, "matmul(%s, %s): %s", da, db, got ? "wrong result" : ct_errmsg());
    return false;
}

#define CHECK_MATMUL(a, b)                                                                         \
    do {                                                                                           \
        if (!check_matmul(__FILE__, __LINE__, (a), (b)))                                           \
            return;                                                                                \
    } while (0)

/* Ends each shape in the tables of (a, b) shape pairs below. */
#define SHAPE_END -1

static ct_tensor *rand_shape(const int64_t *dims, ct_dtype dtype, uint64_t seed) {
    int nd = 0;
    while (dims[nd] != SHAPE_END)
        nd++;
    return tt_rand(nd, dims, dtype, seed);
}

TEST(vectors) {
    ct_tensor *v = tt_rand(CT_SHAPE(17), CT_FLOAT32, 1);
    ct_tensor *w = tt_rand(CT_SHAPE(17), CT_FLOAT32, 2);
    ct_tensor *dot = ct_matmul(v, w);
    ASSERT_TRUE(dot);
    ASSERT_EQ(ct_ndim(dot), 0);
    CHECK_MATMUL(v, w);
    CHECK_MATMUL(v, tt_rand(CT_SHAPE(17, 5), CT_FLOAT32, 3));
    CHECK_MATMUL(tt_rand(CT_SHAPE(6, 17), CT_FLOAT32, 4), w);
    CHECK_MATMUL(tt_rand(CT_SHAPE(2, 3, 6, 17), CT_FLOAT32, 5), w);
    CHECK_MATMUL(v, tt_rand(CT_SHAPE(4, 17, 3), CT_FLOAT32, 6));
}

TEST(matrices) {
    static const int64_t shapes[][2][4] = {
        {{1, 1, SHAPE_END}, {1, 1, SHAPE_END}},       {{17, 17, SHAPE_END}, {17, 17, SHAPE_END}},
        {{1023, 3, SHAPE_END}, {3, 5, SHAPE_END}},    {{1023, 3, SHAPE_END}, {3, 1023, SHAPE_END}},
        {{3, 1023, SHAPE_END}, {1023, 5, SHAPE_END}}, {{5, 3, SHAPE_END}, {3, 1023, SHAPE_END}},
        {{64, 78, SHAPE_END}, {78, 10, SHAPE_END}},   {{1, 40, SHAPE_END}, {40, 33, SHAPE_END}},
        {{33, 40, SHAPE_END}, {40, 1, SHAPE_END}},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        CHECK_MATMUL(rand_shape(shapes[i][0], CT_FLOAT32, 10 + i),
                     rand_shape(shapes[i][1], CT_FLOAT32, 20 + i));
}

TEST(batched_broadcast) {
    static const int64_t shapes[][2][5] = {
        {{2, 1, 5, 3, SHAPE_END}, {4, 3, 7, SHAPE_END}},
        {{3, 4, 5, SHAPE_END}, {3, 5, 6, SHAPE_END}},
        {{1, 4, 5, SHAPE_END}, {3, 5, 6, SHAPE_END}},
        {{3, 4, 5, SHAPE_END}, {5, 6, SHAPE_END}},
        {{3, 1, 5, SHAPE_END}, {5, 6, SHAPE_END}},
        {{4, 5, SHAPE_END}, {2, 3, 5, 6, SHAPE_END}},
        {{2, 3, 4, 5, SHAPE_END}, {3, 5, 2, SHAPE_END}},
        {{1, 1, 4, 5, SHAPE_END}, {1, 5, 2, SHAPE_END}},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        CHECK_MATMUL(rand_shape(shapes[i][0], CT_FLOAT32, 30 + i),
                     rand_shape(shapes[i][1], CT_FLOAT32, 40 + i));
    ct_tensor *c = ct_matmul(tt_rand(CT_SHAPE(2, 1, 5, 3), CT_FLOAT32, 1),
                             tt_rand(CT_SHAPE(4, 3, 7), CT_FLOAT32, 2));
    ASSERT_TRUE(c);
    ASSERT_EQ(ct_ndim(c), 4);
    ASSERT_EQ(ct_size(c, 0), 2);
    ASSERT_EQ(ct_size(c, 1), 4);
    ASSERT_EQ(ct_size(c, 2), 5);
    ASSERT_EQ(ct_size(c, 3), 7);
}

/* Every operand layout, for plain, batched, vector and broadcast products. */
TEST(layouts) {
    static const int64_t shapes[][2][4] = {
        {{33, 17, SHAPE_END}, {17, 29, SHAPE_END}}, {{3, 9, 5, SHAPE_END}, {3, 5, 7, SHAPE_END}},
        {{3, 9, 5, SHAPE_END}, {5, 7, SHAPE_END}},  {{1, 9, 5, SHAPE_END}, {3, 5, 7, SHAPE_END}},
        {{9, 5, SHAPE_END}, {5, SHAPE_END}},        {{5, SHAPE_END}, {5, 7, SHAPE_END}},
        {{1, 5, SHAPE_END}, {5, 1, SHAPE_END}},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        ct_tensor *a = rand_shape(shapes[i][0], CT_FLOAT32, 50 + i);
        ct_tensor *b = rand_shape(shapes[i][1], CT_FLOAT32, 60 + i);
        for (int la = 0; la < TT_NLAYOUTS; la++)
            for (int lb = 0; lb < TT_NLAYOUTS; lb++)
                CHECK_MATMUL(tt_layout_of(a, (tt_layout)la), tt_layout_of(b, (tt_layout)lb));
    }
}

/* Views that BLAS reads in place (transpose flag, leading dim) and views it
 * cannot (stride 0, strides on both dims). */
TEST(views) {
    ct_tensor *x = tt_rand(CT_SHAPE(37, 24), CT_FLOAT32, 1);
    ct_tensor *w = tt_rand(CT_SHAPE(19, 24), CT_FLOAT32, 2);
    ct_tensor *wt = ct_transpose(w, 0, 1);
    CHECK_MATMUL(x, wt);
    CHECK_MATMUL(ct_transpose(x, 0, 1), tt_rand(CT_SHAPE(37, 11), CT_FLOAT32, 3));
    CHECK_MATMUL(ct_transpose(wt, 0, 1), ct_transpose(x, 0, 1));
    CHECK_MATMUL(ct_narrow(x, 1, 3, 19), ct_narrow(ct_narrow(wt, 0, 2, 19), 1, 1, 9));
    CHECK_MATMUL(ct_slice(x, 0, 1, 37, 2), ct_slice(wt, 1, 0, 19, 3));
    CHECK_MATMUL(ct_slice(x, 1, 0, 24, 2), ct_transpose(ct_slice(w, 1, 1, 24, 2), 0, 1));
    CHECK_MATMUL(ct_expand(tt_rand(CT_SHAPE(1, 24), CT_FLOAT32, 4), CT_SHAPE(5, 24)), wt);
    ct_tensor *y = tt_rand(CT_SHAPE(24, 6), CT_FLOAT32, 5);
    CHECK_MATMUL(ct_select(x, 0, 3), wt);
    CHECK_MATMUL(ct_select(y, 1, 2), wt);
    CHECK_MATMUL(x, ct_select(y, 1, 2));
    ct_tensor *batch = tt_rand(CT_SHAPE(4, 8, 24), CT_FLOAT32, 6);
    CHECK_MATMUL(batch, wt);
    CHECK_MATMUL(tt_rand(CT_SHAPE(4, 1, 24), CT_FLOAT32, 7), wt);
    CHECK_MATMUL(ct_slice(batch, 0, 0, 4, 2), wt);
    CHECK_MATMUL(ct_transpose(batch, 0, 1), wt);
    CHECK_MATMUL(ct_narrow(batch, 1, 0, 1), wt);
    CHECK_MATMUL(ct_permute(batch, (int[]){0, 2, 1}), batch);
    CHECK_MATMUL(ct_expand(tt_rand(CT_SHAPE(1, 8, 24), CT_FLOAT32, 6), CT_SHAPE(3, 8, 24)),
                 ct_expand(wt, CT_SHAPE(3, 24, 19)));
}

TEST(empty_dims) {
    static const int64_t shapes[][2][4] = {
        {{0, 3, SHAPE_END}, {3, 4, SHAPE_END}},       {{3, 4, SHAPE_END}, {4, 0, SHAPE_END}},
        {{3, 0, SHAPE_END}, {0, 4, SHAPE_END}},       {{0, SHAPE_END}, {0, SHAPE_END}},
        {{0, 2, 3, SHAPE_END}, {3, 4, SHAPE_END}},    {{2, 2, 0, SHAPE_END}, {2, 0, 4, SHAPE_END}},
        {{1, 2, 3, SHAPE_END}, {0, 3, 4, SHAPE_END}},
    };
    for (int dt = 0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            CHECK_MATMUL(rand_shape(shapes[i][0], dt ? CT_INT64 : CT_FLOAT32, 1),
                         rand_shape(shapes[i][1], dt ? CT_INT64 : CT_FLOAT32, 2));
    ct_tensor *z =
        ct_matmul(ct_empty(CT_SHAPE(3, 0), CT_FLOAT32), ct_empty(CT_SHAPE(0, 4), CT_FLOAT32));
    ASSERT_TRUE(z);
    for (int64_t i = 0; i < 12; i++)
        ASSERT_EQ(tt_at(z, i), 0);
}

TEST(dtypes) {
    static const ct_dtype pairs[][2] = {
        {CT_FLOAT64, CT_FLOAT64},  {CT_BFLOAT16, CT_BFLOAT16}, {CT_FLOAT16, CT_FLOAT16},
        {CT_INT32, CT_INT32},      {CT_INT64, CT_INT64},       {CT_UINT8, CT_UINT8},
        {CT_FLOAT32, CT_FLOAT64},  {CT_INT32, CT_FLOAT32},     {CT_INT32, CT_INT64},
        {CT_BFLOAT16, CT_FLOAT16}, {CT_BOOL, CT_FLOAT32},      {CT_BFLOAT16, CT_FLOAT32},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        ct_tensor *a = tt_rand(CT_SHAPE(2, 13, 21), pairs[i][0], 70 + i);
        ct_tensor *b = tt_rand(CT_SHAPE(21, 9), pairs[i][1], 80 + i);
        CHECK_MATMUL(a, b);
        CHECK_MATMUL(tt_layout_of(a, TT_STRIDED), tt_layout_of(b, TT_TRANSPOSED));
        CHECK_MATMUL(ct_select(b, 1, 2), ct_transpose(a, 1, 2));
    }
}

/* int32 products wrap like C's unsigned arithmetic, as in PyTorch. */
TEST(integer_wraparound) {
    ct_tensor *a = ct_full(CT_SHAPE(1, 2), 65536, CT_INT32);
    ct_tensor *b = ct_full(CT_SHAPE(2, 1), 65536, CT_INT32);
    ct_tensor *c = ct_matmul(a, b);
    ASSERT_TRUE(c);
    ASSERT_EQ(ct_item_int64(c), 0);
    ct_tensor *big = ct_full(CT_SHAPE(1), 3037000500.0, CT_INT64);
    ct_tensor *sq = ct_matmul(big, big);
    ASSERT_TRUE(sq);
    ASSERT_EQ(ct_item_int64(sq), (int64_t)(3037000500ull * 3037000500ull));
}

/* Shapes on each side of the float32 GEMM's tile (6 x 16) and block (k in
 * 256s, rows in 144s, columns in 1024s, all of k packed at once or not)
 * edges, one row, few columns, and every transpose: ct's own kernel takes
 * the thin ones, OpenBLAS the rest (tensor/cpu/gemm.c). */
TEST(gemm_edges) {
    static const int64_t mnk[][3] = {
        {7, 17, 257}, {145, 33, 9}, {2, 8, 300}, {13, 1030, 5}, {150, 40, 513},
        {6, 16, 256}, {1, 20, 30},  {9, 3, 40},  {5, 300, 300}, {20, 200, 600},
    };
    for (size_t i = 0; i < sizeof mnk / sizeof *mnk; i++) {
        ct_tensor *a = tt_rand(CT_SHAPE(mnk[i][0], mnk[i][2]), CT_FLOAT32, 40 + i);
        ct_tensor *b = tt_rand(CT_SHAPE(mnk[i][2], mnk[i][1]), CT_FLOAT32, 45 + i);
        for (int t = 0; t < 4; t++)
            CHECK_MATMUL(t & 1 ? tt_layout_of(a, TT_TRANSPOSED) : a,
                         t & 2 ? tt_layout_of(b, TT_TRANSPOSED) : b);
    }
}

/* Large enough to be split into blocks across threads: the split must not
 * change a single bit. */
TEST(thread_count_invariance) {
    static const int64_t shapes[][2][4] = {
        {{300, 200, SHAPE_END}, {200, 260, SHAPE_END}},
        {{8, 300, SHAPE_END}, {300, 2100, SHAPE_END}},
        {{6, 100, 120, SHAPE_END}, {6, 120, 90, SHAPE_END}},
        {{5, 77, 64, SHAPE_END}, {64, 100, SHAPE_END}},
        {{2000, 1100, SHAPE_END}, {1100, SHAPE_END}},
    };
    int saved = ct_get_num_threads();
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int dt = 0; dt < 3; dt++) {
            ct_dtype dtype = dt == 0 ? CT_FLOAT32 : dt == 1 ? CT_FLOAT64 : CT_INT64;
            ct_tensor *a = rand_shape(shapes[i][0], dtype, 90 + i);
            ct_tensor *b = rand_shape(shapes[i][1], dtype, 95 + i);
            ct_tensor *bt = tt_layout_of(b, TT_TRANSPOSED);
            ct_tensor *first[2] = {NULL, NULL};
            for (int threads = 1; threads <= 3; threads++) {
                ASSERT_EQ(ct_set_num_threads(threads), 0);
                ct_tensor *res[2] = {ct_matmul(a, b), ct_matmul(a, bt)};
                for (int v = 0; v < 2; v++) {
                    ASSERT_TRUE(res[v]);
                    if (!first[v]) {
                        first[v] = res[v];
                        continue;
                    }
                    size_t nbytes =
                        (size_t)ct_numel(res[v]) * ct_dtype_size(ct_tensor_dtype(res[v]));
                    if (memcmp(ct_data_ptr(res[v]), ct_data_ptr(first[v]), nbytes) != 0) {
                        ct_set_num_threads(saved);
                        tt_fail(__FILE__, __LINE__,
                                "shape pair %zu, %s, %s b: %d threads differ from 1 thread", i,
                                ct_dtype_name(dtype), v ? "transposed" : "contiguous", threads);
                        return;
                    }
                }
            }
            ct_set_num_threads(saved);
            if (dtype == CT_FLOAT32)
                CHECK_MATMUL(a, b);
        }
    ct_set_num_threads(saved);
}

TEST(errors) {
    ct_tensor *x = ct_zeros(CT_SHAPE(64, 784), CT_FLOAT32);
    ct_tensor *w = ct_zeros(CT_SHAPE(256, 10), CT_FLOAT32);
    ASSERT_FAILS(ct_matmul(x, w), CT_ESHAPE, "matmul", "[64, 784]", "[256, 10]",
                 "inner sizes differ (784 vs 256)");
    ASSERT_FAILS(ct_matmul(ct_zeros(CT_SHAPE(3), CT_FLOAT32), w), CT_ESHAPE, "matmul", "[3]",
                 "[256, 10]");
    ASSERT_FAILS(ct_matmul(x, ct_zeros(CT_SHAPE(5), CT_FLOAT32)), CT_ESHAPE, "matmul", "[64, 784]",
                 "[5]");
    ASSERT_FAILS(
        ct_matmul(ct_zeros(CT_SHAPE(2, 5, 3), CT_FLOAT32), ct_zeros(CT_SHAPE(4, 3, 7), CT_FLOAT32)),
        CT_ESHAPE, "matmul", "[2, 5, 3]", "[4, 3, 7]");
    ASSERT_FAILS(ct_matmul(ct_scalar(2, CT_FLOAT32), ct_zeros(CT_SHAPE(3), CT_FLOAT32)), CT_EINVAL,
                 "matmul", "[]", "[3]");
    ASSERT_FAILS(ct_matmul(w, ct_scalar(2, CT_FLOAT32)), CT_EINVAL, "matmul", "[256, 10]", "[]");
    ASSERT_FAILS(ct_matmul(ct_zeros(CT_SHAPE(2, 3), CT_BOOL), ct_zeros(CT_SHAPE(3, 4), CT_BOOL)),
                 CT_EDTYPE, "matmul", "[2, 3]", "[3, 4]", "bool");
    /* Expanded views reach BLAS's 32-bit dims without the memory. */
    int64_t huge = (int64_t)1 << 31;
    ct_tensor *one = ct_zeros(CT_SHAPE(1, 1), CT_FLOAT32);
    ASSERT_FAILS(ct_matmul(ct_expand(one, CT_SHAPE(1, huge)), ct_expand(one, CT_SHAPE(huge, 1))),
                 CT_ENOTSUP, "matmul", "[1, 2147483648]", "[2147483648, 1]");
    ASSERT_FAILS(ct_matmul(NULL, w), CT_EINVAL, "matmul");
    ASSERT_FAILS(ct_matmul(x, NULL), CT_EINVAL, "matmul");
}

/* A NULL input keeps the message of the op that failed first. */
TEST(null_keeps_first_error) {
    ct_tensor *x = ct_zeros(CT_SHAPE(64, 784), CT_FLOAT32);
    ct_tensor *w = ct_zeros(CT_SHAPE(256, 10), CT_FLOAT32);
    ct_errclear();
    ASSERT_TRUE(ct_matmul(ct_matmul(x, w), w) == NULL);
    ASSERT_EQ(ct_errcode(), CT_ESHAPE);
    ASSERT_STR_CONTAINS(ct_errmsg(), "[64, 784] @ [256, 10]");
    ct_errclear();
}

static struct {
    int calls, ninputs, noutputs;
    ct_tensor *inputs[2];
} seen;

static int record(const ct_op_record *rec) {
    if (rec->op != CT_OP_MATMUL)
        return 0;
    seen.calls++;
    seen.ninputs = rec->ninputs;
    seen.noutputs = rec->noutputs;
    for (int i = 0; i < rec->ninputs && i < 2; i++)
        seen.inputs[i] = rec->inputs[i];
    return 0;
}

TEST(records_autograd_op) {
    static const ct_tensor_hooks hooks = {.record = record};
    ct_tensor *a = tt_rand(CT_SHAPE(4, 3), CT_FLOAT32, 1);
    ct_tensor *b = tt_rand(CT_SHAPE(3, 2), CT_BFLOAT16, 2);
    ct_tensor_set_hooks(&hooks);
    ct_tensor *c = ct_matmul(a, b);
    ct_tensor_set_hooks(NULL);
    ASSERT_TRUE(c);
    ASSERT_EQ(seen.calls, 1);
    ASSERT_EQ(seen.ninputs, 2);
    ASSERT_EQ(seen.noutputs, 1);
    ASSERT_TRUE(seen.inputs[0] == a && seen.inputs[1] == b);
}
