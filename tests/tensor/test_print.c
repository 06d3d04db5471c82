/* Printing: values, abbreviation, shape, dtype and strides. */
#include "ct_test.h"

#include <stdlib.h>

static char *print_to_string(ct_tensor *t) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = ct_tensor_fprint(f, t);
    fclose(f);
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

TEST(small_tensors_print_every_value) {
    ct_tensor *t = ct_view(ct_arange(0, 6, 1, CT_FLOAT32), CT_SHAPE(2, 3));
    char *s = print_to_string(ct_transpose(t, 0, 1));
    ASSERT_TRUE(s != NULL);
    ASSERT_STR_CONTAINS(s, "tensor([[0.0000, 3.0000],\n");
    ASSERT_STR_CONTAINS(s, "[2.0000, 5.0000]]");
    ASSERT_STR_CONTAINS(s, "shape=[3, 2], dtype=float32, strides=[1, 3]");
    free(s);
    s = print_to_string(ct_lt_scalar(ct_arange(0, 3, 1, CT_INT32), 1));
    ASSERT_STR_CONTAINS(s, "[ true, false, false]");
    free(s);
    /* A view with a storage offset prints its own elements. */
    s = print_to_string(ct_select(ct_transpose(t, 0, 1), 0, 2));
    ASSERT_STR_CONTAINS(s, "tensor([2.0000, 5.0000], shape=[2]");
    free(s);
    s = print_to_string(ct_scalar(-7, CT_INT64));
    ASSERT_STR_CONTAINS(s, "tensor(-7, shape=[], dtype=int64");
    free(s);
    s = print_to_string(ct_zeros(CT_SHAPE(0, 3), CT_FLOAT32));
    ASSERT_STR_CONTAINS(s, "tensor([], shape=[0, 3]");
    free(s);
}

TEST(large_tensors_are_abbreviated) {
    ct_tensor *t = ct_view(ct_arange(0, 20000, 1, CT_INT32), CT_SHAPE(100, 200));
    char *s = print_to_string(t);
    ASSERT_TRUE(s != NULL);
    ASSERT_STR_CONTAINS(s, "[    0,     1,     2, ...,   197,   198,   199]");
    ASSERT_STR_CONTAINS(s, "...");
    ASSERT_STR_CONTAINS(s, "19999]]");
    ASSERT_TRUE(strlen(s) < 2000);
    free(s);
}

TEST(extreme_floats_switch_to_scientific) {
    ct_tensor *t = ct_from_data((float[]){1e-6f, 3e9f, NAN, -INFINITY}, CT_SHAPE(4), CT_FLOAT32);
    char *s = print_to_string(t);
    ASSERT_TRUE(s != NULL);
    ASSERT_STR_CONTAINS(s, "1.0000e-06");
    ASSERT_STR_CONTAINS(s, "nan");
    ASSERT_STR_CONTAINS(s, "-inf");
    free(s);
    ASSERT_EQ(ct_tensor_fprint(NULL, t), CT_EINVAL);
}
