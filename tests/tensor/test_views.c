/* Views share storage and index correctly; reshape copies only when it must. */
#include "ct_test.h"

static bool shares(ct_tensor *a, ct_tensor *b) {
    return ct_tensor_storage(a) == ct_tensor_storage(b);
}

TEST(view_and_reshape) {
    ct_tensor *x = ct_arange(0, 24, 1, CT_FLOAT32);
    ct_tensor *v = ct_view(x, CT_SHAPE(2, -1, 4));
    ASSERT_TRUE(v && shares(v, x));
    ASSERT_EQ(ct_size(v, 1), 3);
    ASSERT_EQ(ct_get(v, (int64_t[]){1, 2, 3}), 23);
    /* A transposed tensor cannot be viewed flat; reshape copies it. */
    ct_tensor *t = ct_transpose(v, 0, 2);
    ASSERT_FAILS(ct_view(t, CT_SHAPE(24)), CT_ESHAPE, "view", "float32[4, 3, 2]", "ct_reshape");
    ct_tensor *r = ct_reshape(t, CT_SHAPE(24));
    ASSERT_TRUE(r && !shares(r, x));
    ASSERT_EQ(ct_get(r, (int64_t[]){1}), 12);
    /* Merging dims that are contiguous with each other stays a view. */
    ct_tensor *p = ct_permute(ct_view(x, CT_SHAPE(2, 3, 4)), (int[]){1, 2, 0});
    ct_tensor *m = ct_view(p, CT_SHAPE(12, 2));
    ASSERT_TRUE(m && shares(m, x));
    ASSERT_EQ(ct_get(m, (int64_t[]){5, 1}), 17);
    ASSERT_FAILS(ct_view(x, CT_SHAPE(5, -1)), CT_ESHAPE, "view", "[5, -1]");
    ASSERT_FAILS(ct_view(x, CT_SHAPE(-1, -1)), CT_EINVAL, "only one dim");
    ASSERT_FAILS(ct_view(x, CT_SHAPE(25)), CT_ESHAPE, "view", "24 elements");
    ct_tensor *e = ct_view(ct_zeros(CT_SHAPE(0, 4), CT_FLOAT32), CT_SHAPE(4, 0, 2));
    ASSERT_EQ(ct_numel(e), 0);
    ASSERT_EQ(ct_ndim(ct_view(ct_scalar(3, CT_INT32), CT_SHAPE(1, 1))), 2);
    ASSERT_EQ(ct_ndim(ct_reshape(ct_ones(CT_SHAPE(1, 1), CT_INT32), 0, NULL)), 0);
    ct_tensor *f = ct_flatten(ct_view(x, CT_SHAPE(2, 3, 4)), 1, -1);
    ASSERT_EQ(ct_size(f, 1), 12);
    ASSERT_FAILS(ct_flatten(x, 0, 3), CT_EINVAL, "flatten", "dim 3");
}

TEST(transpose_permute_select_slice_narrow) {
    ct_tensor *x = ct_view(ct_arange(0, 60, 1, CT_INT64), CT_SHAPE(3, 4, 5));
    ct_tensor *t = ct_transpose(x, 0, -1);
    ASSERT_EQ(ct_size(t, 0), 5);
    ASSERT_EQ(ct_get(t, (int64_t[]){4, 1, 2}), 2 * 20 + 1 * 5 + 4);
    ASSERT_FAILS(ct_permute(x, (int[]){0, 0, 1}), CT_EINVAL, "permute", "twice");
    ASSERT_FAILS(ct_transpose(x, 0, 3), CT_EINVAL, "transpose", "dim 3", "3-d");

    ct_tensor *s = ct_select(x, 1, -1);
    ASSERT_EQ(ct_ndim(s), 2);
    ASSERT_EQ(ct_get(s, (int64_t[]){2, 4}), 2 * 20 + 3 * 5 + 4);
    ASSERT_FAILS(ct_select(x, 1, 4), CT_ERANGE, "select", "index 4", "int64[3, 4, 5]");

    ct_tensor *sl = ct_slice(x, 2, 1, 100, 2); /* 1, 3 */
    ASSERT_EQ(ct_size(sl, 2), 2);
    ASSERT_EQ(ct_get(sl, (int64_t[]){1, 1, 1}), 20 + 5 + 3);
    ct_tensor *neg = ct_slice(x, 0, -2, -1, 1);
    ASSERT_EQ(ct_size(neg, 0), 1);
    ASSERT_EQ(ct_get(neg, (int64_t[]){0, 0, 0}), 20);
    ASSERT_EQ(ct_size(ct_slice(x, 0, 2, 1, 1), 0), 0);
    ASSERT_FAILS(ct_slice(x, 0, 0, 3, 0), CT_EINVAL, "slice", "step");
    ct_tensor *sl2 = ct_slice(ct_slice(x, 2, 0, 5, 2), 2, 1, 3, 1); /* 2, 4 */
    ASSERT_EQ(ct_get(sl2, (int64_t[]){0, 0, 1}), 4);

    ct_tensor *n = ct_narrow(x, 1, 1, 2);
    ASSERT_EQ(ct_get(n, (int64_t[]){0, 1, 0}), 10);
    ASSERT_FAILS(ct_narrow(x, 1, 3, 2), CT_ERANGE, "narrow", "[3, 5)");
}

TEST(expand_squeeze_unsqueeze_split) {
    ct_tensor *x = ct_view(ct_arange(0, 3, 1, CT_FLOAT32), CT_SHAPE(3, 1));
    ct_tensor *e = ct_expand(x, CT_SHAPE(2, 3, 4));
    ASSERT_EQ(ct_stride(e, 0), 0);
    ASSERT_EQ(ct_stride(e, 2), 0);
    ASSERT_EQ(ct_get(e, (int64_t[]){1, 2, 3}), 2);
    ASSERT_EQ(ct_size(ct_expand(x, CT_SHAPE(-1, 5)), 0), 3);
    ASSERT_FAILS(ct_expand(x, CT_SHAPE(4, 4)), CT_ESHAPE, "expand", "[3, 1]", "[4, 4]");
    ASSERT_FAILS(ct_expand(x, CT_SHAPE(3)), CT_EINVAL, "expand");

    ASSERT_EQ(ct_ndim(ct_squeeze(x, 1)), 1);
    ASSERT_EQ(ct_ndim(ct_squeeze(x, 0)), 2);
    ASSERT_EQ(ct_ndim(ct_squeeze_all(ct_zeros(CT_SHAPE(1, 3, 1, 1), CT_FLOAT32))), 1);
    ct_tensor *u = ct_unsqueeze(ct_transpose(ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32), 0, 1), -1);
    ASSERT_EQ(ct_ndim(u), 3);
    ASSERT_EQ(ct_size(u, 2), 1);
    ASSERT_FAILS(ct_unsqueeze(x, 3), CT_EINVAL, "unsqueeze");

    ct_tensor *pieces[4];
    ct_tensor *r = ct_arange(0, 10, 1, CT_INT32);
    ASSERT_EQ(ct_split(r, 4, 0, pieces, 4), 3);
    ASSERT_EQ(ct_numel(pieces[2]), 2);
    ASSERT_EQ(ct_get(pieces[2], (int64_t[]){1}), 9);
    ASSERT_EQ(ct_split(r, 3, 0, pieces, 2), 4); /* reports the count, fills cap */
    ASSERT_EQ(ct_split(r, 0, 0, pieces, 4), CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "split_size");
}

TEST(copy_broadcasts_and_converts) {
    ct_tensor *dst = ct_zeros(CT_SHAPE(3, 4), CT_FLOAT16);
    ct_tensor *src = ct_arange(0, 4, 1, CT_INT64);
    ASSERT_TRUE(ct_copy_(ct_transpose(ct_view(dst, CT_SHAPE(4, 3)), 0, 1),
                         ct_zeros(CT_SHAPE(4), CT_FLOAT32)) != NULL);
    ASSERT_TRUE(ct_copy_(dst, src) == dst);
    ASSERT_EQ(ct_get(dst, (int64_t[]){2, 3}), 3);
    ASSERT_FAILS(ct_copy_(src, dst), CT_ESHAPE, "copy_", "float16[3, 4]", "int64[4]");
    ct_tensor *e = ct_expand(ct_zeros(CT_SHAPE(1, 4), CT_FLOAT32), CT_SHAPE(3, 4));
    ASSERT_FAILS(ct_copy_(e, dst), CT_EINVAL, "copy_", "expanded");
    /* Every dtype pair converts through the compute type. */
    static const ct_dtype all[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16,
                                   CT_INT64,   CT_INT32,   CT_UINT8,    CT_BOOL};
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) {
            ct_tensor *a = ct_arange(0, 5, 1, all[i]);
            if (all[i] == CT_BOOL)
                a = ct_ne_scalar(ct_arange(0, 5, 1, CT_INT32), 0);
            ct_tensor *b = ct_to_dtype(a, all[j]);
            ASSERT_EQ(ct_tensor_dtype(b), all[j]);
            for (int64_t k = 0; k < 5; k++) {
                double want = all[i] == CT_BOOL || all[j] == CT_BOOL ? (k != 0) : (double)k;
                ASSERT_EQ(tt_at(b, k), want);
            }
        }
    ct_tensor *c =
        ct_contiguous(ct_transpose(ct_view(ct_arange(0, 6, 1, CT_FLOAT32), CT_SHAPE(2, 3)), 0, 1));
    ASSERT_TRUE(ct_is_contiguous(c));
    ASSERT_EQ(ct_get(c, (int64_t[]){2, 1}), 5);
    ct_tensor *same = ct_contiguous(c);
    ASSERT_TRUE(same == c);
    ct_tensor_free(ct_tensor_retain(same)); /* the extra reference is the scope's */
    ct_tensor *cl = ct_clone(c);
    ASSERT_TRUE(!shares(cl, c));
}
