/* Joining and indexing ops against plain reference loops, on every layout and
 * dtype, with their edge cases and errors. */
#include "ct_test.h"

static const ct_dtype all_dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16,
                                      CT_INT64,   CT_INT32,   CT_UINT8,    CT_BOOL};
#define NDTYPES (int)(sizeof all_dtypes / sizeof *all_dtypes)

/* A float64 tensor of the given shape whose element at idx is f(ctx, idx). */
typedef double (*ref_fn)(const void *ctx, const int64_t *idx);

static ct_tensor *reference(int ndim, const int64_t *sizes, ref_fn f, const void *ctx) {
    ct_tensor *w = ct_empty(ndim, sizes, CT_FLOAT64);
    double *p = ct_data_ptr(w);
    int64_t idx[CT_MAX_DIMS];
    for (int64_t i = 0; i < ct_numel(w); i++) {
        tt_unravel(i, ndim, sizes, idx);
        p[i] = f(ctx, idx);
    }
    return w;
}

/* Indices in [0, bound) (or [-bound, bound) with negatives), from a fixed
 * hash of the seed. */
static ct_tensor *rand_index(int ndim, const int64_t *sizes, int64_t bound, ct_dtype dtype,
                             uint64_t seed) {
    ct_tensor *t = ct_empty(ndim, sizes, CT_INT64);
    int64_t *p = ct_data_ptr(t);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < ct_numel(t); i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (int64_t)((s >> 33) % (uint64_t)bound);
    }
    return ct_to_dtype(t, dtype);
}

static ct_tensor *int64s(int n, const int64_t *v) {
    return ct_from_data(v, 1, (int64_t[]){n}, CT_INT64);
}

/* --------------------------------------------------------------- cat */

typedef struct cat_ctx {
    ct_tensor *const *ts;
    int n, dim;
} cat_ctx;

static bool skipped(ct_tensor *t) { return ct_ndim(t) == 1 && ct_size(t, 0) == 0; }

static double cat_ref(const void *ctx, const int64_t *idx) {
    const cat_ctx *c = ctx;
    int64_t local[CT_MAX_DIMS];
    memcpy(local, idx, sizeof local);
    for (int j = 0; j < c->n; j++) {
        if (skipped(c->ts[j]))
            continue;
        int64_t s = ct_size(c->ts[j], c->dim);
        if (local[c->dim] < s)
            return ct_get(c->ts[j], local);
        local[c->dim] -= s;
    }
    return NAN;
}

/* Checks cat(ts, dim) against the reference: shape, promoted dtype and
 * values. */
static bool check_cat(ct_tensor *const *ts, int n, int dim) {
    ct_tensor *got = ct_cat(ts, n, dim);
    if (!got) {
        tt_fail(__FILE__, __LINE__, "cat failed: %s", ct_errmsg());
        return false;
    }
    int nd = ct_ndim(got), d = dim < 0 ? dim + nd : dim;
    ct_dtype dt = ct_tensor_dtype(ts[0]);
    for (int j = 1; j < n; j++)
        dt = ct_promote_types(dt, ct_tensor_dtype(ts[j]));
    if (ct_tensor_dtype(got) != dt) {
        tt_fail(__FILE__, __LINE__, "cat dtype %s, want %s", ct_dtype_name(ct_tensor_dtype(got)),
                ct_dtype_name(dt));
        return false;
    }
    cat_ctx c = {ts, n, d};
    ct_tensor *want = ct_to_dtype(reference(nd, ct_sizes(got), cat_ref, &c), dt);
    return tt_close(__FILE__, __LINE__, got, want, 0, 0);
}

TEST(cat_every_dim_dtype_and_layout) {
    static const int64_t base[] = {4, 3, 5};
    static const int64_t along[] = {2, 1, 0, 3};
    for (int nd = 1; nd <= 3; nd++) {
        for (int dim = -nd; dim < nd; dim++) {
            int d = dim < 0 ? dim + nd : dim;
            for (int rot = 0; rot < NDTYPES; rot++) {
                for (int lay = 0; lay < TT_NLAYOUTS; lay++) {
                    ct_tensor *ts[4];
                    for (int j = 0; j < 4; j++) {
                        int64_t sizes[3];
                        memcpy(sizes, base, sizeof sizes);
                        sizes[d] = along[j];
                        ct_tensor *t = tt_rand(nd, sizes, all_dtypes[(j + rot) % NDTYPES],
                                               (uint64_t)(j + 10 * rot));
                        ts[j] = tt_layout_of(t, (tt_layout)((j + lay) % TT_NLAYOUTS));
                    }
                    if (!check_cat(ts, 4, dim))
                        return;
                }
            }
        }
    }
}

TEST(cat_broadcast_views_large_and_empty) {
    /* Expanded (stride-0) inputs and a size over the parallel grain. */
    ct_tensor *row = ct_expand(tt_rand(CT_SHAPE(1, 17), CT_FLOAT32, 1), CT_SHAPE(1023, 17));
    ct_tensor *big = tt_layout_of(tt_rand(CT_SHAPE(1023, 40), CT_FLOAT32, 2), TT_TRANSPOSED);
    ASSERT_TRUE(check_cat((ct_tensor *[]){row, big, row}, 3, 1));
    ct_tensor *col = ct_expand(ct_scalar(7, CT_INT32), CT_SHAPE(40000));
    ASSERT_TRUE(check_cat((ct_tensor *[]){col, tt_rand(CT_SHAPE(40001), CT_INT64, 3)}, 2, 0));
    /* 1-D empty tensors are skipped whatever the others' shape. */
    ct_tensor *e = ct_zeros(CT_SHAPE(0), CT_FLOAT64);
    ct_tensor *a = tt_rand(CT_SHAPE(2, 3), CT_FLOAT32, 4);
    ct_tensor *b = tt_rand(CT_SHAPE(4, 3), CT_FLOAT32, 5);
    ct_tensor *got = ct_cat((ct_tensor *[]){e, a, e, b}, 4, 0);
    ASSERT_TRUE(got);
    ASSERT_EQ(ct_size(got, 0), 6);
    ASSERT_EQ(ct_tensor_dtype(got), CT_FLOAT64);
    ASSERT_TRUE(check_cat((ct_tensor *[]){e, a, e, b}, 4, -2));
    ct_tensor *all_empty = ct_cat((ct_tensor *[]){e, e}, 2, 0);
    ASSERT_TRUE(all_empty);
    ASSERT_EQ(ct_ndim(all_empty), 1);
    ASSERT_EQ(ct_numel(all_empty), 0);
    /* A single input is a copy. */
    ct_tensor *one = ct_cat(&a, 1, 1);
    ASSERT_TRUE(one && ct_tensor_storage(one) != ct_tensor_storage(a));
    ASSERT_CLOSE(one, a, 0, 0);
}

TEST(cat_errors) {
    ct_tensor *a = ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32);
    ct_tensor *b = ct_zeros(CT_SHAPE(2, 4), CT_FLOAT32);
    ASSERT_FAILS(ct_cat((ct_tensor *[]){a, b}, 2, 0), CT_ESHAPE, "cat", "[2, 3]", "[2, 4]",
                 "dim 0");
    ASSERT_FAILS(ct_cat((ct_tensor *[]){a, ct_zeros(CT_SHAPE(3), CT_FLOAT32)}, 2, 0), CT_ESHAPE,
                 "cat", "[2, 3]", "[3]");
    ASSERT_FAILS(ct_cat((ct_tensor *[]){a, ct_scalar(1, CT_FLOAT32)}, 2, 0), CT_ESHAPE, "cat",
                 "zero-dimensional");
    ASSERT_FAILS(ct_cat((ct_tensor *[]){a, a}, 2, 2), CT_EINVAL, "cat", "dim 2");
    ASSERT_FAILS(ct_cat((ct_tensor *[]){a, a}, 2, -3), CT_EINVAL, "cat", "dim -3");
    ASSERT_FAILS(ct_cat((ct_tensor *[]){a}, 0, 0), CT_EINVAL, "cat", "non-empty");
    ASSERT_FAILS(ct_cat(NULL, 2, 0), CT_EINVAL, "cat", "non-empty");
    ASSERT_FAILS(ct_cat((ct_tensor *[]){a, NULL}, 2, 0), CT_EINVAL, "cat", "input 1 is NULL");
    /* A NULL input keeps the message of the failure that produced it. */
    ct_errclear();
    ct_tensor *bad = ct_zeros(CT_SHAPE(-1), CT_FLOAT32);
    ASSERT_TRUE(ct_cat((ct_tensor *[]){a, bad}, 2, 0) == NULL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "zeros");
    ct_errclear();
}

/* --------------------------------------------------------------- stack */

typedef struct stack_ctx {
    ct_tensor *const *ts;
    int dim;
} stack_ctx;

static double stack_ref(const void *ctx, const int64_t *idx) {
    const stack_ctx *c = ctx;
    int64_t local[CT_MAX_DIMS];
    int nd = ct_ndim(c->ts[0]);
    for (int i = 0, j = 0; i <= nd; i++)
        if (i != c->dim)
            local[j++] = idx[i];
    return ct_get(c->ts[idx[c->dim]], local);
}

TEST(stack_every_dim_dtype_and_layout) {
    static const int64_t shape[] = {3, 1, 4};
    for (int nd = 0; nd <= 3; nd++) {
        for (int dim = -(nd + 1); dim <= nd; dim++) {
            int d = dim < 0 ? dim + nd + 1 : dim;
            for (int rot = 0; rot < NDTYPES; rot++) {
                ct_tensor *ts[3];
                for (int j = 0; j < 3; j++)
                    ts[j] = tt_layout_of(tt_rand(nd, shape, all_dtypes[(rot + j) % NDTYPES],
                                                 (uint64_t)(rot * 3 + j)),
                                         (tt_layout)j);
                ct_tensor *got = ct_stack(ts, 3, dim);
                ASSERT_TRUE(got);
                ASSERT_EQ(ct_ndim(got), nd + 1);
                ASSERT_EQ(ct_size(got, d), 3);
                ct_dtype dt = ct_promote_types(
                    ct_promote_types(ct_tensor_dtype(ts[0]), ct_tensor_dtype(ts[1])),
                    ct_tensor_dtype(ts[2]));
                ASSERT_EQ(ct_tensor_dtype(got), dt);
                stack_ctx c = {ts, d};
                ASSERT_CLOSE(got, ct_to_dtype(reference(nd + 1, ct_sizes(got), stack_ref, &c), dt),
                             0, 0);
            }
        }
    }
    ct_tensor *e = ct_zeros(CT_SHAPE(0, 2), CT_FLOAT32);
    ct_tensor *se = ct_stack((ct_tensor *[]){e, e}, 2, 1);
    ASSERT_TRUE(se);
    ASSERT_EQ(ct_size(se, 1), 2);
    ASSERT_EQ(ct_numel(se), 0);
}

TEST(stack_errors) {
    ct_tensor *a = ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32);
    ct_tensor *b = ct_zeros(CT_SHAPE(3, 2), CT_FLOAT32);
    ASSERT_FAILS(ct_stack((ct_tensor *[]){a, b}, 2, 0), CT_ESHAPE, "stack", "[2, 3]", "[3, 2]");
    ASSERT_FAILS(ct_stack((ct_tensor *[]){a, a}, 2, 3), CT_EINVAL, "stack", "dim 3");
    ASSERT_FAILS(ct_stack((ct_tensor *[]){a}, 0, 0), CT_EINVAL, "stack", "non-empty");
    ASSERT_FAILS(ct_stack((ct_tensor *[]){NULL, a}, 2, 0), CT_EINVAL, "stack", "input 0");
    ct_tensor *m = ct_zeros(CT_SHAPE(1, 1, 1, 1, 1, 1, 1, 1), CT_FLOAT32);
    ASSERT_FAILS(ct_stack(&m, 1, 0), CT_EINVAL, "stack", "maximum");
}

/* --------------------------------------------------------- index_select */

typedef struct select_ctx {
    ct_tensor *t, *index;
    int dim;
} select_ctx;

static double index_select_ref(const void *ctx, const int64_t *idx) {
    const select_ctx *c = ctx;
    int64_t local[CT_MAX_DIMS];
    memcpy(local, idx, sizeof local);
    if (ct_ndim(c->t) == 0)
        return ct_get(c->t, local);
    local[c->dim] = (int64_t)tt_at(c->index, idx[c->dim]);
    return ct_get(c->t, local);
}

typedef ct_tensor *(*index_op)(ct_tensor *t, int dim, ct_tensor *index);

/* Checks op(t, dim, index) against ref, element by element, and its dtype. */
static bool check_indexing(index_op op, ref_fn ref, ct_tensor *t, int dim, ct_tensor *index) {
    ct_tensor *got = op(t, dim, index);
    if (!got || ct_tensor_dtype(got) != ct_tensor_dtype(t)) {
        tt_fail(__FILE__, __LINE__, "failed or changed the dtype: %s", ct_errmsg());
        return false;
    }
    int nd = ct_ndim(t);
    select_ctx c = {t, index, nd ? (dim < 0 ? dim + nd : dim) : 0};
    ct_tensor *want = reference(ct_ndim(got), ct_sizes(got), ref, &c);
    return tt_close(__FILE__, __LINE__, got, want, 0, 0);
}

static bool check_index_select(ct_tensor *t, int dim, ct_tensor *index) {
    return check_indexing(ct_index_select, index_select_ref, t, dim, index);
}

TEST(index_select_every_dim_dtype_and_layout) {
    for (int d = 0; d < NDTYPES; d++) {
        ct_tensor *t = tt_rand(CT_SHAPE(5, 7, 3), all_dtypes[d], (uint64_t)d);
        for (int dim = -3; dim < 3; dim++) {
            int64_t size = ct_size(t, dim);
            for (int lay = 0; lay < TT_NLAYOUTS; lay++) {
                ct_tensor *tl = tt_layout_of(t, (tt_layout)lay);
                /* Duplicates, an odd count, int32 and a strided index. */
                ct_tensor *i64 = rand_index(CT_SHAPE(17), size, CT_INT64, (uint64_t)(dim + 9));
                ct_tensor *i32 = rand_index(CT_SHAPE(1), size, CT_INT32, 3);
                ct_tensor *strided = tt_layout_of(i64, TT_STRIDED);
                ct_tensor *empty = ct_zeros(CT_SHAPE(0), CT_INT64);
                ct_tensor *scalar = ct_scalar((double)(size - 1), CT_INT64);
                ASSERT_TRUE(check_index_select(tl, dim, i64));
                ASSERT_TRUE(check_index_select(tl, dim, i32));
                ASSERT_TRUE(check_index_select(tl, dim, strided));
                ASSERT_TRUE(check_index_select(tl, dim, empty));
                ASSERT_TRUE(check_index_select(tl, dim, scalar));
            }
        }
    }
    /* A 0-d input takes a single index 0. */
    ct_tensor *s = ct_index_select(ct_scalar(4, CT_INT32), 0, int64s(1, (int64_t[]){0}));
    ASSERT_TRUE(s);
    ASSERT_EQ(ct_ndim(s), 0);
    ASSERT_EQ(ct_item(s), 4);
}

TEST(index_select_large_both_ways) {
    /* Many short rows (an embedding lookup) and few long lines. */
    ct_tensor *table = tt_rand(CT_SHAPE(1023, 64), CT_FLOAT32, 1);
    ASSERT_TRUE(check_index_select(table, 0, rand_index(CT_SHAPE(5000), 1023, CT_INT64, 2)));
    ct_tensor *wide = tt_layout_of(tt_rand(CT_SHAPE(3, 40000), CT_BFLOAT16, 3), TT_TRANSPOSED);
    ASSERT_TRUE(check_index_select(wide, 0, int64s(2, (int64_t[]){2, 0})));
    ASSERT_TRUE(check_index_select(wide, 1, rand_index(CT_SHAPE(40001), 40000, CT_INT32, 4)));
    ct_tensor *bcast = ct_expand(tt_rand(CT_SHAPE(1, 33), CT_INT64, 5), CT_SHAPE(2000, 33));
    ASSERT_TRUE(check_index_select(bcast, 1, rand_index(CT_SHAPE(70), 33, CT_INT64, 6)));
}

TEST(index_select_errors) {
    ct_tensor *t = ct_zeros(CT_SHAPE(5, 3), CT_FLOAT32);
    ASSERT_FAILS(ct_index_select(t, 0, int64s(3, (int64_t[]){0, 7, 9})), CT_ERANGE, "index_select",
                 "index 7", "size 5", "float32[5, 3]");
    ASSERT_FAILS(ct_index_select(t, 1, int64s(1, (int64_t[]){-1})), CT_ERANGE, "index_select",
                 "index -1", "size 3");
    ASSERT_FAILS(ct_index_select(t, 0, ct_zeros(CT_SHAPE(2), CT_FLOAT32)), CT_EDTYPE,
                 "index_select", "int64 or int32", "float32[2]");
    ASSERT_FAILS(ct_index_select(t, 0, ct_zeros(CT_SHAPE(2), CT_UINT8)), CT_EDTYPE, "index_select",
                 "uint8[2]");
    ASSERT_FAILS(ct_index_select(t, 0, ct_zeros(CT_SHAPE(2, 2), CT_INT64)), CT_ESHAPE,
                 "index_select", "int64[2, 2]");
    ASSERT_FAILS(ct_index_select(t, 2, int64s(1, (int64_t[]){0})), CT_EINVAL, "index_select",
                 "dim 2");
    ASSERT_FAILS(ct_index_select(NULL, 0, int64s(1, (int64_t[]){0})), CT_EINVAL, "index_select",
                 "input 0 is NULL");
    ASSERT_FAILS(ct_index_select(ct_scalar(1, CT_FLOAT32), 0, int64s(2, (int64_t[]){0, 0})),
                 CT_ESHAPE, "index_select", "int64[2]");
}

/* -------------------------------------------------------------- gather */

static double gather_ref(const void *ctx, const int64_t *idx) {
    const select_ctx *c = ctx;
    int64_t local[CT_MAX_DIMS];
    memcpy(local, idx, sizeof local);
    local[c->dim] = (int64_t)ct_get(c->index, idx);
    return ct_get(c->t, local);
}

static bool check_gather(ct_tensor *t, int dim, ct_tensor *index) {
    return check_indexing(ct_gather, gather_ref, t, dim, index);
}

TEST(gather_every_dim_dtype_and_layout) {
    for (int d = 0; d < NDTYPES; d++) {
        ct_tensor *t = tt_rand(CT_SHAPE(4, 17, 3), all_dtypes[d], (uint64_t)d);
        for (int dim = -3; dim < 3; dim++) {
            /* The index may be smaller than the input outside dim, and
             * longer along it. */
            int64_t isizes[3] = {3, 9, 2};
            int dd = dim < 0 ? dim + 3 : dim;
            isizes[dd] = 5;
            for (int lay = 0; lay < TT_NLAYOUTS; lay++) {
                ct_tensor *index = rand_index(3, isizes, ct_size(t, dim),
                                              lay == 1 ? CT_INT32 : CT_INT64, (uint64_t)lay);
                ASSERT_TRUE(check_gather(tt_layout_of(t, (tt_layout)lay), dim,
                                         tt_layout_of(index, (tt_layout)(2 - lay))));
            }
        }
    }
    ct_tensor *t = tt_rand(CT_SHAPE(3, 4), CT_FLOAT32, 1);
    ASSERT_EQ(ct_numel(ct_gather(t, 1, ct_zeros(CT_SHAPE(3, 0), CT_INT64))), 0);
    /* A broadcast index, and a 0-d input with a 0-d index. */
    ct_tensor *bidx = ct_expand(rand_index(CT_SHAPE(1, 4), 3, CT_INT64, 2), CT_SHAPE(3, 4));
    ASSERT_TRUE(check_gather(t, 0, bidx));
    ct_tensor *g0 = ct_gather(ct_scalar(5, CT_FLOAT32), 0, ct_scalar(0, CT_INT64));
    ASSERT_TRUE(g0);
    ASSERT_EQ(ct_ndim(g0), 0);
    ASSERT_EQ(ct_item(g0), 5);
    /* Large: long lines along dim, and many short ones. */
    ct_tensor *big = tt_rand(CT_SHAPE(2000, 33), CT_FLOAT64, 3);
    ASSERT_TRUE(check_gather(big, 1, rand_index(CT_SHAPE(2000, 40), 33, CT_INT64, 4)));
    ASSERT_TRUE(check_gather(big, 0, rand_index(CT_SHAPE(4001, 2), 2000, CT_INT32, 5)));
}

TEST(gather_errors) {
    ct_tensor *t = ct_zeros(CT_SHAPE(3, 2), CT_FLOAT32);
    ASSERT_FAILS(ct_gather(t, 1, ct_zeros(CT_SHAPE(3, 2, 1), CT_INT64)), CT_ESHAPE, "gather",
                 "int64[3, 2, 1]", "float32[3, 2]");
    ASSERT_FAILS(ct_gather(t, 1, ct_zeros(CT_SHAPE(4, 2), CT_INT64)), CT_ESHAPE, "gather",
                 "int64[4, 2]", "dim 0");
    ct_tensor *bad = ct_view(int64s(4, (int64_t[]){0, 1, 2, 1}), CT_SHAPE(2, 2));
    ASSERT_FAILS(ct_gather(t, 1, bad), CT_ERANGE, "gather", "index 2", "size 2");
    ASSERT_FAILS(ct_gather(t, 1, ct_zeros(CT_SHAPE(3, 2), CT_FLOAT64)), CT_EDTYPE, "gather",
                 "float64[3, 2]");
    ASSERT_FAILS(ct_gather(t, 1, NULL), CT_EINVAL, "gather", "input 1 is NULL");
}

/* --------------------------------------------------------- scatter_add */

/* self + src scattered along dim, summed in double. */
static ct_tensor *scatter_add_ref(ct_tensor *self, int dim, ct_tensor *index, ct_tensor *src) {
    ct_tensor *want = ct_to_dtype(self, CT_FLOAT64);
    want = ct_clone(want);
    double *w = ct_data_ptr(want);
    int nd = ct_ndim(index);
    int64_t idx[CT_MAX_DIMS], at[CT_MAX_DIMS];
    for (int64_t i = 0; i < ct_numel(index); i++) {
        tt_unravel(i, nd, ct_sizes(index), idx);
        memcpy(at, idx, sizeof at);
        at[dim] = (int64_t)ct_get(index, idx);
        int64_t lin = 0;
        for (int k = 0; k < nd; k++)
            lin = lin * ct_size(self, k) + at[k];
        w[lin] += ct_get(src, idx);
        if (ct_tensor_dtype(self) == CT_BOOL)
            w[lin] = w[lin] != 0;
    }
    return want;
}

static double scatter_tol(ct_dtype d) {
    switch (d) {
    case CT_BFLOAT16: return 0.25;
    case CT_FLOAT16: return 0.05;
    case CT_FLOAT32: return 1e-5;
    default: return 0;
    }
}

TEST(scatter_add_every_dim_dtype_and_layout) {
    for (int d = 0; d < NDTYPES; d++) {
        ct_dtype dt = all_dtypes[d];
        for (int dim = -3; dim < 3; dim++) {
            int dd = dim < 0 ? dim + 3 : dim;
            for (int lay = 0; lay < TT_NLAYOUTS; lay++) {
                ct_tensor *self = tt_layout_of(tt_rand(CT_SHAPE(4, 6, 3), dt, 1), (tt_layout)lay);
                int64_t ssizes[3] = {5, 7, 3}, isizes[3] = {3, 5, 2};
                isizes[dd] = 9; /* more than self's size along dim: duplicates */
                ssizes[dd] = 10;
                ct_tensor *src = tt_layout_of(tt_rand(3, ssizes, dt, 2), (tt_layout)(2 - lay));
                ct_tensor *index =
                    tt_layout_of(rand_index(3, isizes, ct_size(self, dd),
                                            lay == 2 ? CT_INT32 : CT_INT64, (uint64_t)dd),
                                 (tt_layout)((lay + 1) % TT_NLAYOUTS));
                ct_tensor *want = scatter_add_ref(self, dd, index, src);
                ct_tensor *before = ct_clone(self);
                ct_tensor *got = ct_scatter_add(self, dim, index, src);
                ASSERT_TRUE(got && ct_tensor_dtype(got) == dt);
                ASSERT_CLOSE(got, want, 0, scatter_tol(dt));
                ASSERT_CLOSE(self, before, 0, 0);
                uint64_t version = ct_tensor_version(self);
                ASSERT_TRUE(ct_scatter_add_(self, dim, index, src) == self);
                ASSERT_TRUE(ct_tensor_version(self) > version);
                ASSERT_CLOSE(self, got, 0, 0);
            }
        }
    }
}

TEST(scatter_add_is_deterministic_across_thread_counts) {
    /* Every column gets 4096 float32 additions into 8 rows; the sums must
     * come out bit-identical on any thread count, and equal to adding in
     * index order. */
    ct_tensor *index = rand_index(CT_SHAPE(4096, 64), 8, CT_INT64, 7);
    ct_tensor *src = tt_rand(CT_SHAPE(4096, 64), CT_FLOAT32, 8);
    float want[8 * 64] = {0};
    const int64_t *ip = ct_data_ptr(index);
    const float *sp = ct_data_ptr(src);
    for (int64_t i = 0; i < 4096; i++)
        for (int64_t j = 0; j < 64; j++)
            want[ip[i * 64 + j] * 64 + j] += sp[i * 64 + j];
    int saved = ct_get_num_threads();
    for (int threads = 1; threads <= 4; threads++) {
        ASSERT_EQ(ct_set_num_threads(threads), 0);
        ct_tensor *out = ct_scatter_add_(ct_zeros(CT_SHAPE(8, 64), CT_FLOAT32), 0, index, src);
        bool same = out && memcmp(ct_data_ptr(out), want, sizeof want) == 0;
        if (!same) {
            ct_set_num_threads(saved);
            ASSERT_TRUE(same);
        }
    }
    ct_set_num_threads(saved);
}

TEST(scatter_add_errors) {
    ct_tensor *self = ct_zeros(CT_SHAPE(3, 4), CT_FLOAT32);
    ct_tensor *index = ct_zeros(CT_SHAPE(2, 4), CT_INT64);
    ct_tensor *src = ct_ones(CT_SHAPE(2, 4), CT_FLOAT32);
    ct_tensor *expanded = ct_expand(ct_zeros(CT_SHAPE(1, 4), CT_FLOAT32), CT_SHAPE(3, 4));
    ASSERT_FAILS(ct_scatter_add_(expanded, 0, index, src), CT_EINVAL, "scatter_add_",
                 "float32[3, 4]", "expanded");
    ASSERT_FAILS(ct_scatter_add(self, 0, index, ct_ones(CT_SHAPE(2, 4), CT_FLOAT64)), CT_EDTYPE,
                 "scatter_add", "float64[2, 4]", "float32[3, 4]");
    ASSERT_FAILS(ct_scatter_add(self, 0, index, ct_ones(CT_SHAPE(2, 3), CT_FLOAT32)), CT_ESHAPE,
                 "scatter_add", "int64[2, 4]", "src float32[2, 3]");
    ASSERT_FAILS(ct_scatter_add(self, 1, ct_zeros(CT_SHAPE(4, 4), CT_INT64),
                                ct_ones(CT_SHAPE(4, 4), CT_FLOAT32)),
                 CT_ESHAPE, "scatter_add", "self float32[3, 4]", "dim 0");
    ASSERT_FAILS(ct_scatter_add(self, 0, ct_full(CT_SHAPE(2, 4), 3, CT_INT64), src), CT_ERANGE,
                 "scatter_add", "index 3", "size 3");
    ASSERT_FAILS(ct_scatter_add(self, 0, ct_zeros(CT_SHAPE(2, 4), CT_INT32), NULL), CT_EINVAL,
                 "scatter_add", "input 2 is NULL");
    ASSERT_FAILS(ct_scatter_add(self, 0, ct_zeros(CT_SHAPE(2, 4), CT_BOOL), src), CT_EDTYPE,
                 "scatter_add", "bool[2, 4]");
    /* src a partly overlapping view of self. */
    ct_tensor *big = ct_zeros(CT_SHAPE(4, 4), CT_FLOAT32);
    ASSERT_FAILS(ct_scatter_add_(ct_narrow(big, 0, 0, 3), 0, index, ct_narrow(big, 0, 2, 2)),
                 CT_EINVAL, "scatter_add_", "overlaps");
    /* An empty index changes nothing. */
    ct_tensor *same = ct_scatter_add(self, 0, ct_zeros(CT_SHAPE(0, 4), CT_INT64), src);
    ASSERT_CLOSE(same, self, 0, 0);
}

/* ------------------------------------------------------------- one_hot */

TEST(one_hot_rows_and_inference) {
    int64_t v[] = {2, 0, 1, 2, 4, 0};
    ct_dtype dts[] = {CT_INT64, CT_INT32, CT_UINT8};
    for (int d = 0; d < 3; d++) {
        ct_tensor *labels = ct_to_dtype(ct_from_data(v, CT_SHAPE(2, 3), CT_INT64), dts[d]);
        for (int lay = 0; lay < TT_NLAYOUTS; lay++) {
            ct_tensor *l = tt_layout_of(labels, (tt_layout)lay);
            for (int64_t classes = -1; classes <= 7; classes += 8) {
                ct_tensor *oh = ct_one_hot(l, classes);
                int64_t c = classes < 0 ? 5 : classes;
                ASSERT_TRUE(oh);
                ASSERT_EQ(ct_tensor_dtype(oh), CT_INT64);
                ASSERT_EQ(ct_ndim(oh), 3);
                ASSERT_EQ(ct_size(oh, 2), c);
                for (int64_t i = 0; i < 6 * c; i++)
                    ASSERT_EQ(tt_at(oh, i), v[i / c] == i % c);
            }
        }
    }
    ct_tensor *labels = rand_index(CT_SHAPE(40000), 10, CT_INT64, 1);
    ct_tensor *big = ct_one_hot(labels, 10);
    ASSERT_TRUE(big);
    const int64_t *lp = ct_data_ptr(labels), *bp = ct_data_ptr(big);
    for (int64_t i = 0; i < 40000 * 10; i++)
        ASSERT_EQ(bp[i], lp[i / 10] == i % 10);
    ASSERT_EQ(ct_numel(ct_one_hot(ct_zeros(CT_SHAPE(0), CT_INT64), 3)), 0);
    ASSERT_EQ(ct_ndim(ct_one_hot(ct_scalar(1, CT_INT64), -1)), 1);
}

TEST(one_hot_errors) {
    ct_tensor *labels = int64s(3, (int64_t[]){0, -1, 2});
    ASSERT_FAILS(ct_one_hot(labels, 3), CT_ERANGE, "one_hot", "label -1", "negative");
    ASSERT_FAILS(ct_one_hot(labels, -1), CT_ERANGE, "one_hot", "label -1");
    ASSERT_FAILS(ct_one_hot(int64s(2, (int64_t[]){0, 3}), 3), CT_ERANGE, "one_hot", "label 3",
                 "3 classes");
    ASSERT_FAILS(ct_one_hot(ct_zeros(CT_SHAPE(2), CT_FLOAT32), 3), CT_EDTYPE, "one_hot",
                 "float32[2]");
    ASSERT_FAILS(ct_one_hot(ct_zeros(CT_SHAPE(0), CT_INT64), -1), CT_EINVAL, "one_hot", "infer");
    ASSERT_FAILS(ct_one_hot(NULL, 2), CT_EINVAL, "one_hot", "NULL");
}

/* ------------------------------------------------------- tril and triu */

typedef struct band_ctx {
    ct_tensor *t;
    int64_t k;
    bool upper;
} band_ctx;

static double band_ref(const void *ctx, const int64_t *idx) {
    const band_ctx *c = ctx;
    int nd = ct_ndim(c->t);
    int64_t diff = idx[nd - 1] - idx[nd - 2];
    bool keep = c->upper ? diff >= c->k : diff <= c->k;
    return keep ? ct_get(c->t, idx) : 0;
}

TEST(tril_triu_every_diagonal_dtype_and_layout) {
    static const int64_t shapes[][4] = {{5, 5}, {3, 4, 6}, {2, 1, 17, 3}, {4, 0}, {1, 1}};
    static const int nds[] = {2, 3, 4, 2, 2};
    static const int64_t ks[] = {-100, -2, -1, 0, 1, 3, 100};
    for (size_t s = 0; s < sizeof nds / sizeof *nds; s++) {
        for (int d = 0; d < NDTYPES; d++) {
            ct_tensor *t = tt_rand(nds[s], shapes[s], all_dtypes[d], (uint64_t)(s * 8 + d));
            for (int lay = 0; lay < TT_NLAYOUTS; lay++) {
                ct_tensor *tl = tt_layout_of(t, (tt_layout)lay);
                for (size_t k = 0; k < sizeof ks / sizeof *ks; k++) {
                    for (int upper = 0; upper < 2; upper++) {
                        ct_tensor *got = upper ? ct_triu(tl, ks[k]) : ct_tril(tl, ks[k]);
                        band_ctx c = {tl, ks[k], upper};
                        ASSERT_TRUE(got && ct_tensor_dtype(got) == all_dtypes[d]);
                        ASSERT_CLOSE(got, reference(nds[s], shapes[s], band_ref, &c), 0, 0);
                    }
                }
            }
        }
    }
}

TEST(tril_triu_large_and_broadcast) {
    ct_tensor *wide = tt_rand(CT_SHAPE(2, 40000), CT_FLOAT32, 1);
    ct_tensor *tall = tt_layout_of(tt_rand(CT_SHAPE(1023, 65), CT_FLOAT64, 2), TT_TRANSPOSED);
    ct_tensor *bcast = ct_expand(tt_rand(CT_SHAPE(1, 300), CT_INT32, 3), CT_SHAPE(300, 300));
    ct_tensor *cases[] = {wide, tall, bcast};
    for (int i = 0; i < 3; i++) {
        for (int upper = 0; upper < 2; upper++) {
            ct_tensor *got = upper ? ct_triu(cases[i], 7) : ct_tril(cases[i], -7);
            band_ctx c = {cases[i], upper ? 7 : -7, upper};
            ASSERT_CLOSE(got, reference(2, ct_sizes(cases[i]), band_ref, &c), 0, 0);
        }
    }
}

TEST(tril_triu_errors) {
    ASSERT_FAILS(ct_tril(ct_zeros(CT_SHAPE(4), CT_FLOAT32), 0), CT_ESHAPE, "tril", "[4]", "2 dims");
    ASSERT_FAILS(ct_triu(ct_scalar(1, CT_FLOAT32), 0), CT_ESHAPE, "triu", "float32[]");
    ASSERT_FAILS(ct_triu(NULL, 0), CT_EINVAL, "triu", "NULL");
}

/* ------------------------------------------------------ autograd records */

/* The record's arrays are borrowed for the call only: keep copies. */
static ct_op_record last;
static ct_op_args last_args;
static ct_tensor *last_output;
static int record(const ct_op_record *rec) {
    last = *rec;
    last_args = *rec->args;
    last_output = rec->outputs[0];
    return 0;
}

TEST(ops_record_their_inputs_and_args) {
    static const ct_tensor_hooks hooks = {.record = record};
    ct_tensor *a = ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32);
    ct_tensor *index = int64s(2, (int64_t[]){1, 0});
    ct_tensor_set_hooks(&hooks);
    ct_tensor *c = ct_cat((ct_tensor *[]){a, a, a}, 3, -1);
    ct_tensor_set_hooks(NULL);
    ASSERT_TRUE(c);
    ASSERT_EQ(last.op, CT_OP_CAT);
    ASSERT_EQ(last.ninputs, 3);
    ASSERT_EQ(last_args.nints, 1);
    ASSERT_EQ(last_args.ints[0], 1);

    ct_tensor_set_hooks(&hooks);
    ct_tensor *t = ct_triu(a, -1);
    ct_tensor_set_hooks(NULL);
    ASSERT_TRUE(t);
    ASSERT_EQ(last.op, CT_OP_TRIU);
    ASSERT_EQ(last_args.ints[0], -1);

    ct_tensor_set_hooks(&hooks);
    ct_tensor *s =
        ct_scatter_add_(a, 1, ct_view(index, CT_SHAPE(1, 2)), ct_ones(CT_SHAPE(1, 2), CT_FLOAT32));
    ct_tensor_set_hooks(NULL);
    ASSERT_TRUE(s == a);
    ASSERT_EQ(last.op, CT_OP_SCATTER_ADD);
    ASSERT_TRUE(last.inplace);
    ASSERT_EQ(last.ninputs, 3);
    ASSERT_TRUE(last_output == a);
}
