/* Indexing, selection, joining and random draws on a CUDA device, each
 * against the CPU on the same inputs: index_select, gather, scatter_add,
 * one_hot, tril and triu, cat and stack, where and masked_fill over every
 * dtype, views and empty tensors; out-of-range indices and mixed devices;
 * Philox draws that give the CPU's values and advance the generator alike;
 * and the gradients of these ops on the device. Without a device the whole
 * program is skipped (exit 77). */
#include "ct_test.h"
#include "device_under_test.h"

#include <ct/autograd.h>
#include <ct/cuda.h>
#include <ct/nn.h>
#include <stdlib.h>

static ct_tensor *dev(ct_tensor *t) { return ct_to(t, dut); }
static ct_tensor *host(ct_tensor *t) { return ct_to(t, CT_DEVICE_CPU); }

/* The result on the device equals the CPU's: same dtype, same values. */
#define ASSERT_SAME(on_device, on_host)                                                            \
    do {                                                                                           \
        ct_tensor *tt_d = (on_device), *tt_h = (on_host);                                          \
        ASSERT_TRUE(tt_d != NULL && tt_h != NULL);                                                 \
        ASSERT_EQ(ct_tensor_device(tt_d).type, DUT_TYPE);                                          \
        ASSERT_EQ(ct_tensor_dtype(tt_d), ct_tensor_dtype(tt_h));                                   \
        ASSERT_CLOSE(host(tt_d), tt_h, 0, 0);                                                      \
    } while (0)

/* Both calls fail with code and the very same message. */
#define ASSERT_SAME_ERROR(on_device, on_host, code)                                                \
    do {                                                                                           \
        char tt_msg[512];                                                                          \
        ct_errclear();                                                                             \
        ASSERT_TRUE((on_host) == NULL);                                                            \
        ASSERT_EQ(ct_errcode(), code);                                                             \
        snprintf(tt_msg, sizeof tt_msg, "%s", ct_errmsg());                                        \
        ct_errclear();                                                                             \
        ASSERT_TRUE((on_device) == NULL);                                                          \
        ASSERT_EQ(ct_errcode(), code);                                                             \
        ASSERT_STR_CONTAINS(ct_errmsg(), tt_msg);                                                  \
        ct_errclear();                                                                             \
    } while (0)

/* Layouts built with ops that work on either device, so that the host's
 * and the device's copies of a tensor are the same view. */
enum { L_CONTIGUOUS, L_TRANSPOSED, L_STRIDED, L_EXPANDED, L_N };

/* t's values in the layout, on t's device. L_EXPANDED broadcasts t's first
 * row over dim 0 (a different value set, the same on both sides). */
static ct_tensor *layout_on(ct_tensor *t, int layout) {
    int nd = ct_ndim(t);
    const int64_t *sz = ct_sizes(t);
    ct_device device = ct_tensor_device(t);
    ct_dtype dtype = ct_tensor_dtype(t);
    int64_t shape[CT_MAX_DIMS];
    int perm[CT_MAX_DIMS];
    if (nd == 0 || layout == L_CONTIGUOUS)
        return ct_clone(t);
    switch (layout) {
    case L_TRANSPOSED: {
        for (int i = 0; i < nd; i++) {
            shape[i] = sz[nd - 1 - i];
            perm[i] = nd - 1 - i;
        }
        ct_tensor *v = ct_permute(ct_empty_on(nd, shape, dtype, device), perm);
        return ct_copy_(v, t) ? v : NULL;
    }
    case L_STRIDED: {
        memcpy(shape, sz, sizeof(int64_t) * (size_t)nd);
        shape[nd - 1] = sz[nd - 1] * 2 + 1;
        ct_tensor *buf = ct_full_on(nd, shape, 0, dtype, device);
        ct_tensor *v = ct_slice(buf, nd - 1, 1, shape[nd - 1], 2);
        return ct_copy_(v, t) ? v : NULL;
    }
    default: return ct_expand(ct_narrow(t, 0, 0, 1), nd, sz);
    }
}

/* A 1-D index of n values (i * 7 + 3) % size, repeating, in dtype. */
static ct_tensor *index_of(int64_t n, int64_t size, ct_dtype dtype) {
    int64_t v[256];
    for (int64_t i = 0; i < n; i++)
        v[i] = (i * 7 + 3) % size;
    return ct_to_dtype(ct_from_data(v, 1, &n, CT_INT64), dtype);
}

/* An index of shape (nd, sizes) with values in [0, size). */
static ct_tensor *index_shaped(int nd, const int64_t *sizes, int64_t size, ct_dtype dtype) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= sizes[i];
    return ct_reshape(index_of(n, size, dtype), nd, sizes);
}

/* ---------------------------------------------------------- index_select */

TEST(index_select_matches_the_cpu) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        for (int lay = 0; lay < L_N && !tt_failed(); lay++) {
            ct_scope_begin();
            ct_tensor *x = tt_rand(CT_SHAPE(4, 5, 6), (ct_dtype)d, 10 + (uint64_t)d);
            ct_tensor *hx = layout_on(x, lay), *dx = layout_on(dev(x), lay);
            for (int dim = -3; dim < 3 && !tt_failed(); dim++) {
                int64_t size = ct_size(x, dim);
                for (int it = 0; it < 2; it++) {
                    ct_tensor *idx = index_of(9, size, it ? CT_INT32 : CT_INT64);
                    ASSERT_SAME(ct_index_select(dx, dim, dev(idx)), ct_index_select(hx, dim, idx));
                    /* A strided index. */
                    ct_tensor *sidx = layout_on(idx, L_STRIDED);
                    ASSERT_SAME(ct_index_select(dx, dim, layout_on(dev(idx), L_STRIDED)),
                                ct_index_select(hx, dim, sidx));
                }
                /* An empty index. */
                ct_tensor *none = ct_zeros(CT_SHAPE(0), CT_INT64);
                ASSERT_SAME(ct_index_select(dx, dim, dev(none)), ct_index_select(hx, dim, none));
            }
            ct_scope_end();
        }
    }
    /* A 0-d source takes one index; an empty source gives an empty result. */
    ct_tensor *s = ct_scalar(2.5, CT_FLOAT32), *one = ct_zeros(CT_SHAPE(1), CT_INT64);
    ASSERT_SAME(ct_index_select(dev(s), 0, dev(one)), ct_index_select(s, 0, one));
    ct_tensor *e = ct_zeros(CT_SHAPE(3, 0), CT_FLOAT64);
    ASSERT_SAME(ct_index_select(dev(e), 0, dev(index_of(5, 3, CT_INT64))),
                ct_index_select(e, 0, index_of(5, 3, CT_INT64)));
    /* An embedding-sized lookup: many long rows. */
    ct_tensor *w = tt_rand(CT_SHAPE(1000, 64), CT_FLOAT32, 5);
    int64_t n = 4096;
    int64_t *v = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[i] = (i * 7919) % 1000;
    ct_tensor *ids = ct_from_data(v, 1, &n, CT_INT64);
    free(v);
    ASSERT_SAME(ct_index_select(dev(w), 0, dev(ids)), ct_index_select(w, 0, ids));
}

TEST(embedding_matches_the_cpu) {
    ct_tensor *w = tt_rand(CT_SHAPE(10, 6), CT_FLOAT32, 3);
    ct_tensor *ids = index_shaped(CT_SHAPE(2, 3, 4), 10, CT_INT64);
    ASSERT_SAME(ct_embedding(dev(ids), dev(w)), ct_embedding(ids, w));
    ct_tensor *ids32 = ct_to_dtype(ids, CT_INT32);
    ASSERT_SAME(ct_embedding(dev(ids32), dev(w)), ct_embedding(ids32, w));
    ASSERT_FAILS(ct_embedding(ids, dev(w)), CT_EDEVICE, "embedding", "on cpu", DUT_NAME);
}

/* ---------------------------------------------------------------- gather */

TEST(gather_matches_the_cpu) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        for (int lay = 0; lay < L_N && !tt_failed(); lay++) {
            ct_scope_begin();
            ct_tensor *x = tt_rand(CT_SHAPE(4, 5, 6), (ct_dtype)d, 20 + (uint64_t)d);
            ct_tensor *hx = layout_on(x, lay), *dx = layout_on(dev(x), lay);
            for (int dim = -3; dim < 3 && !tt_failed(); dim++) {
                /* Smaller than the input in the other dims. */
                ct_tensor *idx =
                    index_shaped(CT_SHAPE(3, 4, 5), ct_size(x, dim), dim % 2 ? CT_INT32 : CT_INT64);
                ASSERT_SAME(ct_gather(dx, dim, dev(idx)), ct_gather(hx, dim, idx));
                /* A transposed index. */
                ct_tensor *tidx = layout_on(idx, L_TRANSPOSED);
                ASSERT_SAME(ct_gather(dx, dim, layout_on(dev(idx), L_TRANSPOSED)),
                            ct_gather(hx, dim, tidx));
            }
            ct_tensor *none = ct_zeros(CT_SHAPE(0, 5, 6), CT_INT64);
            ASSERT_SAME(ct_gather(dx, 0, dev(none)), ct_gather(hx, 0, none));
            ct_scope_end();
        }
    }
    /* 0-d: one element along dim 0. */
    ct_tensor *s = ct_scalar(-1.5, CT_FLOAT64), *zero = ct_scalar(0, CT_INT64);
    ASSERT_SAME(ct_gather(dev(s), 0, dev(zero)), ct_gather(s, 0, zero));
}

/* ----------------------------------------------------------- scatter_add */

/* Atomic adds meet duplicates in any order: float sums may differ from
 * the CPU's in the last bits, integers may not. */
static double scatter_tol(ct_dtype d) {
    switch (d) {
    case CT_FLOAT32: return 1e-5;
    case CT_FLOAT64: return 1e-12;
    case CT_BFLOAT16: return 0.2;
    case CT_FLOAT16: return 0.02;
    default: return 0;
    }
}

TEST(scatter_add_matches_the_cpu) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        double tol = scatter_tol((ct_dtype)d);
        for (int lay = 0; lay < L_EXPANDED && !tt_failed(); lay++) {
            ct_scope_begin();
            ct_tensor *self = tt_rand(CT_SHAPE(4, 5, 6), (ct_dtype)d, 30 + (uint64_t)d);
            ct_tensor *src = tt_rand(CT_SHAPE(6, 5, 6), (ct_dtype)d, 40 + (uint64_t)d);
            ct_tensor *hs = layout_on(self, lay), *ds = layout_on(dev(self), lay);
            ct_tensor *hsrc = layout_on(src, (lay + 1) % L_N);
            ct_tensor *dsrc = layout_on(dev(src), (lay + 1) % L_N);
            for (int dim = -3; dim < 3 && !tt_failed(); dim++) {
                /* Duplicate positions, and an index smaller than self
                 * outside dim and than src. */
                ct_tensor *idx = index_shaped(CT_SHAPE(6, 4, 5), ct_size(self, dim),
                                              dim % 2 ? CT_INT32 : CT_INT64);
                if (dim != 0 && dim != -3)
                    idx = ct_narrow(idx, 0, 1, 4);
                ct_tensor *want = ct_scatter_add(hs, dim, idx, hsrc);
                ct_tensor *got = ct_scatter_add(ds, dim, dev(idx), dsrc);
                ASSERT_TRUE(want && got);
                ASSERT_CLOSE(host(got), want, tol, tol);
                /* In place, into a copy in the same layout. */
                ct_tensor *hin = layout_on(hs, L_TRANSPOSED), *din = layout_on(ds, L_TRANSPOSED);
                ASSERT_TRUE(ct_scatter_add_(hin, dim, idx, hsrc) == hin);
                ASSERT_TRUE(ct_scatter_add_(din, dim, dev(idx), dsrc) == din);
                ASSERT_CLOSE(host(din), hin, tol, tol);
            }
            ct_scope_end();
        }
    }
    /* Many adds into one place, where order matters most: 30000 float32
     * values in [-2, 2) sum to a few hundred, with rounding errors of
     * about 1e-5 each. */
    int64_t n = 30000;
    ct_tensor *idx = ct_contiguous(ct_expand(ct_zeros(CT_SHAPE(1), CT_INT64), 1, &n));
    for (int d = 0; d < 2; d++) {
        ct_tensor *acc = ct_zeros(CT_SHAPE(3), (ct_dtype)d);
        ct_tensor *many = tt_rand(1, &n, (ct_dtype)d, 8);
        ASSERT_CLOSE(host(ct_scatter_add(dev(acc), 0, dev(idx), dev(many))),
                     ct_scatter_add(acc, 0, idx, many), 0, d == CT_FLOAT32 ? 0.05 : 1e-9);
    }
}

/* --------------------------------------------------------------- one_hot */

TEST(one_hot_matches_the_cpu) {
    ct_dtype dts[] = {CT_INT64, CT_INT32, CT_UINT8};
    for (int i = 0; i < 3; i++) {
        ct_tensor *l = index_shaped(CT_SHAPE(3, 4), 5, dts[i]);
        for (int lay = 0; lay < L_N; lay++) {
            ct_tensor *hl = layout_on(l, lay), *dl = layout_on(dev(l), lay);
            ASSERT_SAME(ct_one_hot(dl, 7), ct_one_hot(hl, 7));
            ASSERT_SAME(ct_one_hot(dl, -1), ct_one_hot(hl, -1));
        }
    }
    ct_tensor *s = ct_scalar(2, CT_INT64), *e = ct_zeros(CT_SHAPE(0, 2), CT_INT32);
    ASSERT_SAME(ct_one_hot(dev(s), 4), ct_one_hot(s, 4));
    ASSERT_SAME(ct_one_hot(dev(e), 3), ct_one_hot(e, 3));
    ASSERT_SAME_ERROR(ct_one_hot(dev(e), -1), ct_one_hot(e, -1), CT_EINVAL);
}

/* ------------------------------------------------------------ tril, triu */

TEST(tril_and_triu_match_the_cpu) {
    int64_t ks[] = {-7, -1, 0, 2, 9};
    for (int d = 0; d < CT_NDTYPES; d++) {
        for (int lay = 0; lay < L_N && !tt_failed(); lay++) {
            ct_scope_begin();
            ct_tensor *x = tt_rand(CT_SHAPE(3, 4, 6), (ct_dtype)d, 50 + (uint64_t)d);
            ct_tensor *hx = layout_on(x, lay), *dx = layout_on(dev(x), lay);
            for (int k = 0; k < 5; k++) {
                ASSERT_SAME(ct_tril(dx, ks[k]), ct_tril(hx, ks[k]));
                ASSERT_SAME(ct_triu(dx, ks[k]), ct_triu(hx, ks[k]));
            }
            ct_tensor *m = ct_transpose(ct_select(hx, 0, 1), 0, 1);
            ct_tensor *dm = ct_transpose(ct_select(dx, 0, 1), 0, 1);
            ASSERT_SAME(ct_tril(dm, 1), ct_tril(m, 1));
            ct_scope_end();
        }
    }
    ct_tensor *e = ct_zeros(CT_SHAPE(0, 3), CT_FLOAT32);
    ASSERT_SAME(ct_triu(dev(e), 0), ct_triu(e, 0));
    ASSERT_SAME_ERROR(ct_tril(dev(ct_zeros(CT_SHAPE(3), CT_FLOAT32)), 0),
                      ct_tril(ct_zeros(CT_SHAPE(3), CT_FLOAT32), 0), CT_ESHAPE);
}

/* ------------------------------------------------------------ cat, stack */

TEST(cat_and_stack_match_the_cpu) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_scope_begin();
        ct_dtype d2 = (ct_dtype)((d + 3) % CT_NDTYPES); /* promotes */
        ct_tensor *a = tt_rand(CT_SHAPE(2, 3, 4), (ct_dtype)d, 60 + (uint64_t)d);
        ct_tensor *b = tt_rand(CT_SHAPE(2, 1, 4), d2, 70 + (uint64_t)d);
        ct_tensor *c = tt_rand(CT_SHAPE(2, 3, 4), d2, 80 + (uint64_t)d);
        for (int lay = 0; lay < L_N && !tt_failed(); lay++) {
            ct_tensor *h[] = {layout_on(a, lay), layout_on(b, (lay + 1) % L_N),
                              ct_zeros(CT_SHAPE(0), (ct_dtype)d)};
            ct_tensor *g[] = {layout_on(dev(a), lay), layout_on(dev(b), (lay + 1) % L_N),
                              dev(h[2])};
            ASSERT_SAME(ct_cat(g, 2, 1), ct_cat(h, 2, 1));
            ASSERT_SAME(ct_cat(g, 3, -2), ct_cat(h, 3, -2));
            ct_tensor *hs[] = {h[0], layout_on(c, lay)}, *gs[] = {g[0], layout_on(dev(c), lay)};
            for (int dim = -4; dim < 4; dim++)
                ASSERT_SAME(ct_stack(gs, 2, dim), ct_stack(hs, 2, dim));
        }
        ct_scope_end();
    }
    ct_tensor *a = tt_rand(CT_SHAPE(2, 3), CT_FLOAT32, 1);
    ASSERT_FAILS(ct_cat((ct_tensor *[]){dev(a), a}, 2, 0), CT_EDEVICE, "cat", DUT_NAME, "on cpu");
    ASSERT_FAILS(ct_stack((ct_tensor *[]){a, dev(a)}, 2, 0), CT_EDEVICE, "stack");
    ASSERT_SAME_ERROR(
        ct_cat((ct_tensor *[]){dev(a), dev(ct_zeros(CT_SHAPE(3, 3), CT_FLOAT32))}, 2, 1),
        ct_cat((ct_tensor *[]){a, ct_zeros(CT_SHAPE(3, 3), CT_FLOAT32)}, 2, 1), CT_ESHAPE);
}

/* ---------------------------------------------------- where, masked_fill */

TEST(where_and_masked_fill_match_the_cpu) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        for (int lay = 0; lay < L_N && !tt_failed(); lay++) {
            ct_scope_begin();
            ct_tensor *cond = tt_rand(CT_SHAPE(3, 1, 5), CT_BOOL, 90 + (uint64_t)d);
            ct_tensor *a = tt_rand(CT_SHAPE(3, 4, 5), (ct_dtype)d, 100 + (uint64_t)d);
            ct_tensor *b = tt_rand(CT_SHAPE(4, 1), (ct_dtype)d, 110 + (uint64_t)d);
            ct_tensor *hc = layout_on(cond, lay), *dc = layout_on(dev(cond), lay);
            ct_tensor *ha = layout_on(a, lay), *da = layout_on(dev(a), lay);
            ASSERT_SAME(ct_where(dc, da, dev(b)), ct_where(hc, ha, b));
            ASSERT_SAME(ct_where(dc, dev(b), da), ct_where(hc, b, ha));
            /* A 0-d operand of another dtype: promoted. */
            ct_tensor *s = ct_scalar(3, CT_INT64);
            ASSERT_SAME(ct_where(dc, da, dev(s)), ct_where(hc, ha, s));
            ASSERT_SAME(ct_where(dev(ct_scalar(1, CT_BOOL)), dev(s), da),
                        ct_where(ct_scalar(1, CT_BOOL), s, ha));
            /* masked_fill, out of place and in place, the mask broadcast. */
            ct_tensor *mask = tt_rand(CT_SHAPE(4, 1), CT_BOOL, 120 + (uint64_t)d);
            ASSERT_SAME(ct_masked_fill(da, dev(mask), 2.5), ct_masked_fill(ha, mask, 2.5));
            if (ct_dtype_is_float((ct_dtype)d))
                ASSERT_SAME(ct_masked_fill(da, dev(mask), NAN), ct_masked_fill(ha, mask, NAN));
            if (lay != L_EXPANDED) {
                ASSERT_TRUE(ct_masked_fill_(ha, mask, -1) == ha);
                ASSERT_TRUE(ct_masked_fill_(da, dev(mask), -1) == da);
                ASSERT_SAME(da, ha);
            }
            ct_scope_end();
        }
    }
    ct_tensor *e = ct_zeros(CT_SHAPE(0, 4), CT_FLOAT32), *ec = ct_zeros(CT_SHAPE(0, 1), CT_BOOL);
    ASSERT_SAME(ct_where(dev(ec), dev(e), dev(e)), ct_where(ec, e, e));
    ASSERT_SAME(ct_masked_fill(dev(e), dev(ec), 1), ct_masked_fill(e, ec, 1));
    ct_tensor *a = tt_rand(CT_SHAPE(2, 3), CT_FLOAT32, 2), *m = tt_rand(CT_SHAPE(2, 3), CT_BOOL, 3);
    ASSERT_FAILS(ct_where(dev(m), a, dev(a)), CT_EDEVICE, "where", DUT_NAME, "on cpu");
    ASSERT_FAILS(ct_masked_fill(dev(a), m, 0), CT_EDEVICE, "masked_fill");
    ASSERT_FAILS(ct_masked_fill_(dev(a), m, 0), CT_EDEVICE, "masked_fill_");
    ASSERT_SAME_ERROR(ct_where(dev(a), dev(a), dev(a)), ct_where(a, a, a), CT_EDTYPE);
}

/* ------------------------------------------------------------ bad input */

/* An index out of range is CT_ERANGE with the CPU's message, the first bad
 * value in the same order; nothing is written, and the device goes on. */
TEST(out_of_range_indices_are_errors_not_stray_writes) {
    ct_tensor *x = tt_rand(CT_SHAPE(5, 3), CT_FLOAT32, 4), *dx = dev(x);
    int64_t vals[] = {1, 4, 7, -2, 9, 0};
    ct_tensor *bad = ct_from_data(vals, CT_SHAPE(6), CT_INT64), *dbad = dev(bad);
    ASSERT_SAME_ERROR(ct_index_select(dx, 0, dbad), ct_index_select(x, 0, bad), CT_ERANGE);
    ASSERT_STR_CONTAINS(
        (ct_index_select(dx, 0, dbad), ct_errmsg()),
        "index_select: index 7 is out of range for dim 0 of size 5 (input float32[5, 3])");
    ct_errclear();
    /* The first bad value in iteration order, in a strided index too. */
    ct_tensor *sbad = ct_slice(bad, 0, 1, 6, 2), *dsbad = ct_slice(dbad, 0, 1, 6, 2);
    ASSERT_SAME_ERROR(ct_index_select(dx, 0, dsbad), ct_index_select(x, 0, sbad), CT_ERANGE);
    ASSERT_SAME_ERROR(ct_index_select(dx, 1, ct_to_dtype(dbad, CT_INT32)),
                      ct_index_select(x, 1, ct_to_dtype(bad, CT_INT32)), CT_ERANGE);
    ct_tensor *neg = ct_from_data((int64_t[]){0, -1}, CT_SHAPE(2), CT_INT64);
    ASSERT_SAME_ERROR(ct_index_select(dx, 0, dev(neg)), ct_index_select(x, 0, neg), CT_ERANGE);
    ASSERT_SAME_ERROR(ct_embedding(dev(neg), dx), ct_embedding(neg, x), CT_ERANGE);

    ct_tensor *g = ct_reshape(bad, CT_SHAPE(3, 2));
    ASSERT_SAME_ERROR(ct_gather(dx, 0, dev(g)), ct_gather(x, 0, g), CT_ERANGE);
    ASSERT_SAME_ERROR(ct_gather(dx, 1, dev(g)), ct_gather(x, 1, g), CT_ERANGE);
    ct_tensor *src = tt_rand(CT_SHAPE(3, 2), CT_FLOAT32, 5);
    ASSERT_SAME_ERROR(ct_scatter_add(dx, 0, dev(g), dev(src)), ct_scatter_add(x, 0, g, src),
                      CT_ERANGE);
    /* In place: self is left as it was. */
    ct_tensor *self = ct_clone(dx);
    ASSERT_SAME_ERROR(ct_scatter_add_(self, 0, dev(g), dev(src)),
                      ct_scatter_add_(ct_clone(x), 0, g, src), CT_ERANGE);
    ASSERT_SAME(self, x);

    ct_tensor *labels = ct_from_data((int64_t[]){2, 0, 5, 1}, CT_SHAPE(4), CT_INT64);
    ASSERT_SAME_ERROR(ct_one_hot(dev(labels), 5), ct_one_hot(labels, 5), CT_ERANGE);
    ASSERT_SAME_ERROR(ct_one_hot(dev(neg), -1), ct_one_hot(neg, -1), CT_ERANGE);
    ct_tensor *u8 = ct_to_dtype(labels, CT_UINT8);
    ASSERT_SAME_ERROR(ct_one_hot(dev(u8), 3), ct_one_hot(u8, 3), CT_ERANGE);

    /* The device is still fine. */
    ct_tensor *ok = index_of(4, 5, CT_INT64);
    ASSERT_SAME(ct_index_select(dx, 0, dev(ok)), ct_index_select(x, 0, ok));
}

TEST(inputs_on_different_devices_are_refused) {
    ct_tensor *x = tt_rand(CT_SHAPE(5, 3), CT_FLOAT32, 6), *dx = dev(x);
    ct_tensor *idx = index_shaped(CT_SHAPE(2, 3), 3, CT_INT64);
    ASSERT_FAILS(ct_index_select(dx, 0, ct_reshape(idx, CT_SHAPE(6))), CT_EDEVICE, "index_select",
                 "input 0 is on " DUT_NAME " and input 1 on cpu");
    ASSERT_FAILS(ct_gather(x, 1, dev(idx)), CT_EDEVICE, "gather", "on cpu", DUT_NAME);
    ASSERT_FAILS(ct_scatter_add(dx, 1, dev(idx), x), CT_EDEVICE, "scatter_add", "input 2");
    ASSERT_FAILS(ct_scatter_add_(dx, 1, idx, dx), CT_EDEVICE, "scatter_add_", "input 1");
}

/* ----------------------------------------------------------------- random */

static double normal_tol(ct_dtype d) {
    /* The two libms' log, cos and sin may differ in the last bit of a
     * double: a float64 normal by a few ulps, a narrower one by at most one
     * ulp of its own after rounding. */
    switch (d) {
    case CT_FLOAT64: return 1e-13;
    case CT_FLOAT32: return 2.5e-7;
    case CT_BFLOAT16: return 8e-3;
    default: return 1e-3;
    }
}

TEST(draws_on_the_device_are_the_cpus) {
    int64_t sizes[] = {1, 2, 3, 5, 6, 1023, 4097, (1 << 20) + 3};
    for (int d = 0; d < 4; d++) {
        ct_dtype dt = (ct_dtype)d;
        for (int s = 0; s < 8 && !tt_failed(); s++) {
            ct_scope_begin();
            int64_t n = sizes[s];
            ct_generator gh = {1234 + (uint64_t)s, 7}, gd = gh;
            ct_tensor *h = ct_uniform_(ct_empty(1, &n, dt), -1, 3, &gh);
            ct_tensor *g = ct_uniform_(ct_empty_on(1, &n, dt, dut), -1, 3, &gd);
            ASSERT_TRUE(h && g);
            ASSERT_EQ(gd.offset, gh.offset);
            ASSERT_CLOSE(host(g), h, 0, 0);
            h = ct_normal_(ct_empty(1, &n, dt), 0.5, 2, &gh);
            g = ct_normal_(ct_empty_on(1, &n, dt, dut), 0.5, 2, &gd);
            ASSERT_TRUE(h && g);
            ASSERT_EQ(gd.offset, gh.offset);
            ASSERT_CLOSE(host(g), h, normal_tol(dt), 0);
            h = ct_bernoulli_(ct_empty(1, &n, dt), 0.3, &gh);
            g = ct_bernoulli_(ct_empty_on(1, &n, dt, dut), 0.3, &gd);
            ASSERT_TRUE(h && g);
            ASSERT_EQ(gd.offset, gh.offset);
            ASSERT_CLOSE(host(g), h, 0, 0);
            ct_scope_end();
        }
    }
    /* bernoulli_ fills any dtype; bernoulli reads each probability. */
    ct_generator gh = {5, 0}, gd = gh;
    for (int d = 4; d < CT_NDTYPES; d++) {
        ASSERT_SAME(ct_bernoulli_(ct_empty_on(CT_SHAPE(33), (ct_dtype)d, dut), 0.6, &gd),
                    ct_bernoulli_(ct_empty(CT_SHAPE(33), (ct_dtype)d), 0.6, &gh));
        ASSERT_EQ(gd.offset, gh.offset);
    }
    for (int d = 0; d < 4; d++) {
        ct_tensor *p = ct_rand(CT_SHAPE(7, 9), (ct_dtype)d, &gh);
        gd = gh;
        for (int lay = 0; lay < L_N; lay++) {
            ASSERT_SAME(ct_bernoulli(layout_on(dev(p), lay), &gd),
                        ct_bernoulli(layout_on(p, lay), &gh));
            ASSERT_EQ(gd.offset, gh.offset);
        }
    }
}

TEST(draws_into_views_and_from_the_default_generator) {
    /* A view is filled in row-major order, as on the CPU. */
    for (int lay = L_TRANSPOSED; lay < L_EXPANDED; lay++) {
        ct_generator gh = {9, 3}, gd = gh;
        ct_tensor *x = ct_zeros(CT_SHAPE(17, 129), CT_FLOAT32);
        ct_tensor *h = layout_on(x, lay), *g = layout_on(dev(x), lay);
        ASSERT_TRUE(ct_normal_(h, 1, 2, &gh) == h);
        ASSERT_TRUE(ct_normal_(g, 1, 2, &gd) == g);
        ASSERT_CLOSE(host(g), h, normal_tol(CT_FLOAT32), 0);
        ASSERT_TRUE(ct_uniform_(h, 0, 1, &gh) && ct_uniform_(g, 0, 1, &gd));
        ASSERT_SAME(g, h);
        ASSERT_EQ(gd.offset, gh.offset);
    }
    /* The default generator advances by the same blocks from either. */
    ct_manual_seed(99);
    ct_tensor *g = ct_uniform_(ct_empty_on(CT_SHAPE(11), CT_FLOAT64, dut), 0, 1, NULL);
    uint64_t after = ct_default_generator()->offset;
    ct_manual_seed(99);
    ct_tensor *h = ct_uniform_(ct_empty(CT_SHAPE(11), CT_FLOAT64), 0, 1, NULL);
    ASSERT_EQ(after, ct_default_generator()->offset);
    ASSERT_SAME(g, h);
    /* Dropout's mask is drawn on the device. */
    ct_generator gh = {21, 0}, gd = gh;
    ct_tensor *x = tt_rand(CT_SHAPE(8, 33), CT_FLOAT32, 7);
    ASSERT_SAME(ct_dropout(dev(x), 0.25, true, &gd), ct_dropout(x, 0.25, true, &gh));
    ASSERT_EQ(gd.offset, gh.offset);
    ASSERT_SAME(ct_dropout(dev(x), 1, true, &gd), ct_dropout(x, 1, true, &gh));
    /* ... and so are rows keyed by their place in a larger draw. */
    const int64_t rows[] = {5, 0, 9, 2, 7, 1, 3, 4};
    ASSERT_SAME(
        ct_bernoulli_rows_(ct_empty_on(CT_SHAPE(8, 33), CT_FLOAT32, dut), 0.5, rows, 10, &gd),
        ct_bernoulli_rows_(ct_empty(CT_SHAPE(8, 33), CT_FLOAT32), 0.5, rows, 10, &gh));
    ASSERT_EQ(gd.offset, gh.offset);
    /* The CPU's errors. */
    ct_tensor *p = ct_from_data((float[]){0.5f, 1.5f, -1}, CT_SHAPE(3), CT_FLOAT32);
    ASSERT_SAME_ERROR(ct_bernoulli(dev(p), &gd), ct_bernoulli(p, &gh), CT_EINVAL);
    ASSERT_STR_CONTAINS((ct_bernoulli(dev(p), &gd), ct_errmsg()), "holds 1.5");
    ct_errclear();
    ASSERT_SAME_ERROR(ct_uniform_(ct_empty_on(CT_SHAPE(2), CT_INT32, dut), 0, 1, &gd),
                      ct_uniform_(ct_empty(CT_SHAPE(2), CT_INT32), 0, 1, &gh), CT_EDTYPE);
    ASSERT_EQ(gd.offset, gh.offset);
}

/* -------------------------------------------------------------- gradients */

typedef ct_tensor *(*grad_fn)(ct_tensor *const *x, ct_tensor *const *aux);

/* f's float64 gradients with respect to x on the device, from the same
 * upstream gradient, are the CPU's (scatter_add's atomic sums within
 * rounding). aux (indices, masks) goes to the device alike. */
static void grads_match(grad_fn f, int n, ct_tensor *const *x, int naux, ct_tensor *const *aux,
                        bool create_graph) {
    ct_tensor *hx[4], *dx[4], *haux[4], *daux[4], *hg[4], *dg[4];
    for (int i = 0; i < n; i++) {
        hx[i] = ct_requires_grad_(ct_clone(x[i]), true);
        dx[i] = ct_requires_grad_(dev(x[i]), true);
    }
    for (int i = 0; i < naux; i++) {
        haux[i] = aux[i];
        daux[i] = dev(aux[i]);
    }
    ct_tensor *hy = f(hx, haux), *dy = f(dx, daux);
    ASSERT_TRUE(hy && dy);
    ct_tensor *go = tt_rand(ct_ndim(hy), ct_sizes(hy), CT_FLOAT64, 77), *dgo = dev(go);
    ct_grad_options opts = {.create_graph = create_graph};
    ASSERT_EQ(ct_grad(&hy, 1, &go, hx, n, hg, &opts), 0);
    ASSERT_EQ(ct_grad(&dy, 1, &dgo, dx, n, dg, &opts), 0);
    for (int i = 0; i < n; i++) {
        ASSERT_EQ(ct_tensor_device(dg[i]).type, DUT_TYPE);
        ASSERT_CLOSE(host(dg[i]), hg[i], 1e-12, 1e-12);
    }
}

static ct_tensor *f_index_select(ct_tensor *const *x, ct_tensor *const *a) {
    return ct_index_select(x[0], 1, a[0]);
}
static ct_tensor *f_embedding(ct_tensor *const *x, ct_tensor *const *a) {
    return ct_embedding(a[0], x[0]);
}
static ct_tensor *f_gather(ct_tensor *const *x, ct_tensor *const *a) {
    return ct_gather(x[0], 1, a[0]);
}
static ct_tensor *f_scatter_add(ct_tensor *const *x, ct_tensor *const *a) {
    return ct_scatter_add(x[0], 0, a[0], x[1]);
}
static ct_tensor *f_where(ct_tensor *const *x, ct_tensor *const *a) {
    return ct_where(a[0], x[0], x[1]);
}
static ct_tensor *f_masked_fill(ct_tensor *const *x, ct_tensor *const *a) {
    return ct_masked_fill(x[0], a[0], 0.5);
}
static ct_tensor *f_cat(ct_tensor *const *x, ct_tensor *const *a) {
    (void)a;
    return ct_cat(x, 2, 1);
}
static ct_tensor *f_stack(ct_tensor *const *x, ct_tensor *const *a) {
    (void)a;
    return ct_stack(x, 2, -1);
}
static ct_tensor *f_tril_triu(ct_tensor *const *x, ct_tensor *const *a) {
    (void)a;
    return ct_cat((ct_tensor *[]){ct_tril(x[0], 1), ct_triu(x[0], -1)}, 2, 0);
}
static ct_tensor *f_slice(ct_tensor *const *x, ct_tensor *const *a) {
    (void)a;
    return ct_slice(x[0], 1, 1, 5, 2);
}

TEST(gradients_on_the_device_match_the_cpu) {
    ct_tensor *x45 = tt_rand(CT_SHAPE(4, 5), CT_FLOAT64, 1);
    ct_tensor *y45 = tt_rand(CT_SHAPE(4, 5), CT_FLOAT64, 2);
    ct_tensor *idx = ct_from_data((int64_t[]){3, 0, 3, 1, 4, 3}, CT_SHAPE(6), CT_INT64);
    grads_match(f_index_select, 1, &x45, 1, &idx, false);
    ct_tensor *ids = ct_reshape(idx, CT_SHAPE(2, 3));
    ct_tensor *w = tt_rand(CT_SHAPE(6, 5), CT_FLOAT64, 6);
    grads_match(f_embedding, 1, &w, 1, &ids, false);
    ct_tensor *g = index_shaped(CT_SHAPE(3, 6), 5, CT_INT64);
    grads_match(f_gather, 1, &x45, 1, &g, false);
    ct_tensor *s = index_shaped(CT_SHAPE(5, 5), 4, CT_INT64);
    ct_tensor *src = tt_rand(CT_SHAPE(5, 5), CT_FLOAT64, 3);
    grads_match(f_scatter_add, 2, (ct_tensor *[]){x45, src}, 1, &s, false);
    ct_tensor *m = tt_rand(CT_SHAPE(4, 5), CT_BOOL, 4);
    grads_match(f_where, 2, (ct_tensor *[]){x45, y45}, 1, &m, false);
    grads_match(f_masked_fill, 1, &x45, 1, &m, false);
    ct_tensor *x43 = tt_rand(CT_SHAPE(4, 3), CT_FLOAT64, 5);
    grads_match(f_cat, 2, (ct_tensor *[]){x45, x43}, 0, NULL, false);
    grads_match(f_stack, 2, (ct_tensor *[]){x45, y45}, 0, NULL, false);
    grads_match(f_tril_triu, 1, &x45, 0, NULL, false);
    /* Under create_graph a slice's backward scatters through positions
     * that it makes on the host and moves to the device. */
    grads_match(f_slice, 1, &x45, 0, NULL, true);
}
