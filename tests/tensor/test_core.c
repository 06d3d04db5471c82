/* Errors, dtypes, storage, tensor lifetime, scopes and the autograd hook. */
#include "ct_test.h"
#include <ct/cuda.h>

#include <stdlib.h>

TEST(strerror_and_errname_cover_every_code) {
    ASSERT_STR_CONTAINS(ct_strerror(CT_OK), "success");
    ASSERT_STR_CONTAINS(ct_strerror(CT_ESHAPE), "shape");
    ASSERT_STR_CONTAINS(ct_errname(CT_ETIMEDOUT), "CT_ETIMEDOUT");
    ASSERT_STR_CONTAINS(ct_strerror(-1000), "unknown");
    ASSERT_STR_CONTAINS(ct_errname(5), "UNKNOWN");
    for (int code = -1; code >= CT_EAUTH; code--) {
        ASSERT_TRUE(strncmp(ct_errname(code), "CT_E", 4) == 0);
        ASSERT_TRUE(strcmp(ct_strerror(code), "unknown error") != 0);
    }
}

TEST(dtype_sizes_names_and_promotion) {
    ASSERT_EQ(ct_dtype_size(CT_BFLOAT16), 2);
    ASSERT_EQ(ct_dtype_size(CT_INT64), 8);
    ASSERT_EQ(ct_dtype_size(CT_NDTYPES), 0);
    ASSERT_STR_CONTAINS(ct_dtype_name(CT_FLOAT16), "float16");
    ASSERT_EQ(ct_promote_types(CT_INT32, CT_FLOAT16), CT_FLOAT16);
    ASSERT_EQ(ct_promote_types(CT_FLOAT16, CT_BFLOAT16), CT_FLOAT32);
    ASSERT_EQ(ct_promote_types(CT_BOOL, CT_UINT8), CT_UINT8);
    ASSERT_EQ(ct_promote_types(CT_UINT8, CT_INT32), CT_INT32);
    ASSERT_EQ(ct_promote_types(CT_FLOAT64, CT_FLOAT32), CT_FLOAT64);
    ASSERT_EQ(ct_promote_types(CT_INT64, CT_BOOL), CT_INT64);
}

TEST(half_precision_round_trips) {
    float cases[] = {0.0f,           -0.0f,           1.0f,     -2.5f,    65504.0f, 6.1035156e-05f,
                     5.9604645e-08f, 0.333251953125f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ct_tensor *h = ct_to_dtype(ct_scalar(cases[i], CT_FLOAT32), CT_FLOAT16);
        ASSERT_NEAR(ct_item(h), cases[i], 0);
    }
    /* Overflow saturates to inf; rounding is to nearest even. */
    ASSERT_TRUE(isinf(ct_item(ct_to_dtype(ct_scalar(70000.0, CT_FLOAT32), CT_FLOAT16))));
    ASSERT_NEAR(ct_item(ct_to_dtype(ct_scalar(2049.0, CT_FLOAT32), CT_FLOAT16)), 2048.0, 0);
    ASSERT_NEAR(ct_item(ct_to_dtype(ct_scalar(2051.0, CT_FLOAT32), CT_FLOAT16)), 2052.0, 0);
    ASSERT_TRUE(isnan(ct_item(ct_to_dtype(ct_scalar(NAN, CT_FLOAT32), CT_FLOAT16))));
    ASSERT_TRUE(isnan(ct_item(ct_to_dtype(ct_scalar(NAN, CT_FLOAT32), CT_BFLOAT16))));
    ASSERT_NEAR(ct_item(ct_to_dtype(ct_scalar(1.00390625, CT_FLOAT32), CT_BFLOAT16)), 1.0, 0);
    /* 3e38 = 1.7634 * 2^127 rounds to 226/128 * 2^127 in bfloat16's 8 bits. */
    ASSERT_NEAR(ct_item(ct_to_dtype(ct_scalar(3.0e38, CT_FLOAT32), CT_BFLOAT16)),
                226.0 / 128.0 * ldexp(1.0, 127), 0);
}

static int blob_frees;
static void count_free(void *data, void *ctx) {
    blob_frees++;
    ASSERT_TRUE(ctx == (void *)&blob_frees);
    free(data);
}

/* Runs on a thread of its own, outside the harness's scope, so that the
 * outermost ct_keep hands tensors to the caller. */
static void blob_lifetime(void) {
    blob_frees = 0;
    float *mem = malloc(6 * sizeof(float));
    for (int i = 0; i < 6; i++)
        mem[i] = (float)i;
    ct_storage *s =
        ct_storage_from_blob(mem, 6 * sizeof(float), CT_DEVICE_CPU, count_free, &blob_frees);
    ASSERT_TRUE(s != NULL);
    ct_scope_begin();
    ct_tensor *t = ct_tensor_from_storage(s, 0, CT_SHAPE(2, 3), NULL, CT_FLOAT32);
    ct_tensor *v = ct_keep(ct_transpose(t, 0, 1));
    ct_scope_end();
    ct_storage_free(s);
    ASSERT_EQ(blob_frees, 0);
    ASSERT_NEAR(ct_get(v, (int64_t[]){2, 1}), 5.0, 0);
    ct_tensor_free(v);
    ASSERT_EQ(blob_frees, 1);
}

TEST(storage_from_blob_calls_free_once_when_the_last_view_goes) { tt_run_unscoped(blob_lifetime); }

TEST(storage_bounds_are_checked) {
    ct_storage *s = ct_storage_new(24, CT_DEVICE_CPU);
    ASSERT_FAILS(ct_tensor_from_storage(s, 1, CT_SHAPE(2, 3), NULL, CT_FLOAT32), CT_ERANGE,
                 "tensor_from_storage", "[2, 3]");
    ASSERT_FAILS(ct_tensor_from_storage(s, 0, CT_SHAPE(2, 2), (int64_t[]){-1, 1}, CT_FLOAT32),
                 CT_ERANGE, "tensor_from_storage");
    ASSERT_TRUE(ct_tensor_from_storage(s, 5, CT_SHAPE(0, 9), NULL, CT_FLOAT32) != NULL);
    ct_storage_free(s);
    ASSERT_FAILS(ct_storage_from_blob(NULL, 8, CT_DEVICE_CPU, NULL, NULL), CT_EINVAL, "NULL");
    ASSERT_FAILS(ct_storage_new(8, (ct_device){CT_CUDA, 1000}), CT_EDEVICE, "storage_new",
                 "cuda:1000");
    ASSERT_FAILS(ct_storage_new(8, (ct_device){(ct_device_type)7, 0}), CT_EDEVICE,
                 "unknown device type 7");
}

TEST(storage_is_aligned_to_64_bytes) {
    for (int i = 1; i < 100; i += 7) {
        ct_tensor *t = ct_empty(CT_SHAPE(i), CT_UINT8);
        ASSERT_EQ((uintptr_t)ct_storage_data(ct_tensor_storage(t)) % 64, 0);
    }
}

TEST(factory_rejects_bad_shapes) {
    ASSERT_FAILS(ct_empty(CT_SHAPE(2, -1), CT_FLOAT32), CT_EINVAL, "empty", "negative", "[2, -1]");
    ASSERT_FAILS(ct_empty(9, (int64_t[9]){1, 1, 1, 1, 1, 1, 1, 1, 1}, CT_FLOAT32), CT_EINVAL,
                 "ndim 9");
    ASSERT_FAILS(ct_empty(CT_SHAPE(2), (ct_dtype)42), CT_EINVAL, "dtype");
    ASSERT_FAILS(ct_empty(CT_SHAPE(INT64_C(1) << 40, INT64_C(1) << 40), CT_FLOAT32), CT_EINVAL,
                 "too large");
}

static void keep_across_scopes(void) {
    ct_scope_begin();
    ct_tensor *outer = ct_zeros(CT_SHAPE(4), CT_FLOAT32);
    ct_scope_begin();
    ct_tensor *kept = ct_keep(ct_add_scalar(outer, 1.0));
    ct_add_scalar(outer, 2.0); /* released by the inner scope */
    ct_scope_end();
    ASSERT_NEAR(ct_get(kept, (int64_t[]){3}), 1.0, 0);
    ct_scope_end();

    /* At the outermost scope, keep hands the tensor to the caller. */
    ct_tensor *mine;
    ct_scope_begin();
    mine = ct_keep(ct_ones(CT_SHAPE(2), CT_INT32));
    ct_scope_end();
    ASSERT_EQ(ct_get(mine, (int64_t[]){1}), 1);
    ct_tensor_free(mine);
}

TEST(scopes_release_and_keep_hands_out) { tt_run_unscoped(keep_across_scopes); }

TEST(keep_of_a_tensor_the_scope_does_not_own_is_a_no_op) {
    ct_tensor *param = ct_keep(ct_zeros(CT_SHAPE(3), CT_FLOAT32));
    ct_scope_begin();
    ASSERT_TRUE(ct_keep(param) == param);
    ASSERT_TRUE(ct_keep(NULL) == NULL);
    ct_scope_end();
    ASSERT_EQ(ct_numel(param), 3);
    ct_tensor_free(param); /* the harness's scope is outermost: keep gave it to us */
}

TEST(a_long_loop_of_ops_in_scopes_does_not_grow) {
    /* Under ASan a leak here fails the run; the storage count stays flat. */
    ct_tensor *w = ct_keep(ct_ones(CT_SHAPE(16, 16), CT_FLOAT32));
    for (int step = 0; step < 2000; step++) {
        ct_scope_begin();
        ct_tensor *x = ct_full(CT_SHAPE(8, 16), (double)step, CT_FLOAT32);
        ct_tensor *y =
            ct_relu(ct_sub_scalar(ct_mul(ct_transpose(x, 0, 1), ct_view(x, CT_SHAPE(16, 8))), 1.0));
        ct_tensor *z =
            ct_add(ct_slice(y, 0, 0, 16, 2), ct_narrow(ct_select(w, 0, step % 16), 0, 0, 8));
        ASSERT_TRUE(z != NULL);
        ct_scope_end();
    }
    ct_tensor_free(w);
}

TEST(version_counter_is_shared_by_views_and_bumped_in_place) {
    ct_tensor *t = ct_zeros(CT_SHAPE(4, 4), CT_FLOAT32);
    ct_tensor *v = ct_transpose(t, 0, 1);
    uint64_t v0 = ct_tensor_version(t);
    ct_add_scalar_(v, 1.0);
    ASSERT_EQ(ct_tensor_version(t), v0 + 1);
    ct_copy_(ct_select(t, 0, 1), ct_ones(CT_SHAPE(4), CT_FLOAT32));
    ASSERT_EQ(ct_tensor_version(v), v0 + 2);
    ct_exp(t); /* out of place: no bump */
    ASSERT_EQ(ct_tensor_version(t), v0 + 2);
}

TEST(null_input_keeps_the_first_message) {
    ct_errclear();
    ct_tensor *bad =
        ct_matmul(ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32), ct_zeros(CT_SHAPE(4, 5), CT_FLOAT32));
    ASSERT_TRUE(bad == NULL);
    ct_tensor *r = ct_relu(ct_add(bad, ct_ones(CT_SHAPE(1), CT_FLOAT32)));
    ASSERT_TRUE(r == NULL);
    ASSERT_EQ(ct_errcode(), CT_ESHAPE);
    ASSERT_STR_CONTAINS(ct_errmsg(), "matmul");
    ct_errclear();
    ASSERT_FAILS(ct_exp(NULL), CT_EINVAL, "exp", "input 0 is NULL");
}

TEST(item_and_get_check_their_arguments) {
    ct_tensor *t = ct_arange(0, 6, 1, CT_INT64);
    ASSERT_TRUE(isnan(ct_item(t)));
    ASSERT_EQ(ct_errcode(), CT_ESHAPE);
    ASSERT_STR_CONTAINS(ct_errmsg(), "6 elements");
    ASSERT_EQ(ct_item_int64(ct_select(t, 0, 5)), 5);
    ASSERT_TRUE(isnan(ct_get(t, (int64_t[]){6})));
    ASSERT_EQ(ct_errcode(), CT_ERANGE);
    ASSERT_EQ(ct_item_int64(ct_scalar(9007199254740993.0, CT_INT64)), 9007199254740992LL);
}

/* The hook sees every op with its inputs; a failing recorder fails the op. */
static int recorded[CT_NOPS];
static int fail_on = -1;
static int record_op(const ct_op_record *rec) {
    recorded[rec->op]++;
    if ((int)rec->op == fail_on)
        return CT_ESTATE;
    return 0;
}
static int meta_freed;
static void free_meta(void *meta) {
    meta_freed++;
    free(meta);
}

TEST(autograd_hook_sees_ops_and_frees_meta) {
    static const ct_tensor_hooks hooks = {.record = record_op, .free_meta = free_meta};
    memset(recorded, 0, sizeof recorded);
    meta_freed = 0;
    ct_tensor_set_hooks(&hooks);
    ct_scope_begin();
    ct_tensor *a = ct_ones(CT_SHAPE(2, 2), CT_FLOAT32);
    ct_tensor_set_meta(a, malloc(16));
    ct_exp(ct_transpose(ct_add(a, a), 0, 1));
    ct_mul_(a, a);
    fail_on = CT_OP_SIGMOID;
    ct_tensor *s = ct_sigmoid(a);
    fail_on = -1;
    ct_scope_end();
    ct_tensor_set_hooks(NULL);
    ASSERT_TRUE(s == NULL);
    ASSERT_EQ(recorded[CT_OP_ADD], 1);
    ASSERT_EQ(recorded[CT_OP_PERMUTE], 1);
    ASSERT_EQ(recorded[CT_OP_EXP], 1);
    ASSERT_EQ(recorded[CT_OP_MUL], 1);
    ASSERT_EQ(recorded[CT_OP_SIGMOID], 1);
    ASSERT_EQ(meta_freed, 1);
    ASSERT_STR_CONTAINS(ct_op_name(CT_OP_LOG_SOFTMAX), "LOG_SOFTMAX");
}

TEST(memory_stats_count_live_storages_and_their_peak) {
    ct_memory_reset_peak(CT_DEVICE_CPU);
    int64_t base = ct_memory_allocated(CT_DEVICE_CPU);
    ASSERT_EQ(ct_memory_peak(CT_DEVICE_CPU), base);
    ct_scope_begin();
    ct_tensor *big = ct_empty(CT_SHAPE(1 << 18), CT_FLOAT64);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), base + (8 << 18));
    ASSERT_TRUE(ct_transpose(ct_view(big, CT_SHAPE(512, 512)), 0, 1));
    static float blob[64];
    ct_storage *wrapped = ct_storage_from_blob(blob, sizeof blob, CT_DEVICE_CPU, NULL, NULL);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), base + (8 << 18));
    ct_storage_free(wrapped);
    ct_scope_end();
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), base);
    ASSERT_EQ(ct_memory_peak(CT_DEVICE_CPU), base + (8 << 18));
    ct_memory_reset_peak(CT_DEVICE_CPU);
    ASSERT_EQ(ct_memory_peak(CT_DEVICE_CPU), base);
}

/* A tensor made by an op shares one heap block with its storage header and,
 * when small, its data: the block must last as long as any reference to the
 * storage, whoever holds it and whichever thread drops it. */
static void small_tensor_block_lifetime(void) {
    ct_scope_begin();
    ct_tensor *base = ct_arange(0, 6, 1, CT_FLOAT32);
    ct_tensor *row = ct_keep(ct_select(ct_view(base, CT_SHAPE(2, 3)), 0, 1));
    ct_storage *s = ct_storage_retain(ct_tensor_storage(base));
    ct_scope_end();
    ASSERT_EQ(ct_get(row, (int64_t[]){2}), 5);
    ct_tensor_free(row);
    ASSERT_EQ(((const float *)ct_storage_data(s))[4], 4);
    ct_storage_free(s);
}

TEST(a_view_and_a_storage_reference_outlive_the_small_tensor_they_came_from) {
    tt_run_unscoped(small_tensor_block_lifetime);
}

static ct_tensor *handed_over[4];
static void free_handed_over(void) {
    for (int i = 0; i < 4; i++)
        ct_tensor_free(handed_over[i]);
}

static void last_reference_on_another_thread(void) {
    ct_tensor *small = ct_ones(CT_SHAPE(3), CT_FLOAT32);
    ct_tensor *big = ct_ones(CT_SHAPE(1 << 16), CT_FLOAT32);
    handed_over[0] = small;
    handed_over[1] = ct_unsqueeze(small, 0);
    handed_over[2] = big;
    handed_over[3] = ct_narrow(big, 0, 1, 2);
    tt_run_unscoped(free_handed_over);
}

TEST(the_last_reference_may_be_dropped_on_another_thread) {
    int64_t before = ct_memory_allocated(CT_DEVICE_CPU);
    tt_run_unscoped(last_reference_on_another_thread);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), before);
}

TEST(memory_stats_are_exact_for_small_tensors_and_count_no_scalar_operand) {
    ct_memory_reset_peak(CT_DEVICE_CPU);
    int64_t base = ct_memory_allocated(CT_DEVICE_CPU);
    ct_scope_begin();
    ct_tensor *x = ct_ones(CT_SHAPE(3), CT_FLOAT32);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), base + 12);
    /* The scalar is handed to the kernel without a storage of its own. */
    ct_tensor *y = ct_mul_scalar(x, 2.5);
    ASSERT_NEAR(ct_get(y, (int64_t[]){2}), 2.5, 0);
    ASSERT_TRUE(ct_add_scalar_(y, 1) == y);
    ASSERT_NEAR(ct_get(y, (int64_t[]){0}), 3.5, 0);
    ASSERT_EQ(ct_memory_peak(CT_DEVICE_CPU), base + 24);
    int64_t total = 24;
    const int64_t sizes[] = {0, 1, 63, 64, 4095, 4096, 4097, 65536};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        ct_tensor *t = ct_empty(1, &sizes[i], CT_UINT8);
        total += sizes[i];
        ASSERT_EQ((uintptr_t)ct_storage_data(ct_tensor_storage(t)) % 64, 0);
        ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), base + total);
    }
    ct_storage *s = ct_storage_new(100, CT_DEVICE_CPU);
    ASSERT_EQ((uintptr_t)ct_storage_data(s) % 64, 0);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), base + total + 100);
    ct_storage_free(s);
    ct_scope_end();
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), base);
}

TEST(messages_name_the_form_of_the_op_called) {
    ct_tensor *i = ct_ones(CT_SHAPE(2), CT_INT32);
    ASSERT_FAILS(ct_add_scalar_(i, 0.5), CT_EDTYPE, "add_scalar_: ", "float32");
    ASSERT_FAILS(ct_mul_(i, ct_ones(CT_SHAPE(3), CT_INT32)), CT_ESHAPE, "mul_: ");
    ASSERT_FAILS(ct_sub_scalar(NULL, 1), CT_EINVAL, "sub_scalar: ");
    ASSERT_FAILS(ct_ge(i, NULL), CT_EINVAL, "ge: ");
    ASSERT_FAILS(ct_exp_(i), CT_EDTYPE, "exp_: ");
    ASSERT_FAILS(ct_neg(ct_ones(CT_SHAPE(1), CT_BOOL)), CT_EDTYPE, "neg: ");
}

TEST(errclear_forgets_the_message_too) {
    ct_errclear();
    ASSERT_TRUE(ct_sqrt(NULL) == NULL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "sqrt");
    ct_errclear();
    ASSERT_EQ(ct_errcode(), CT_OK);
    ASSERT_EQ(strlen(ct_errmsg()), 0);
    ASSERT_TRUE(ct_log(NULL) == NULL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "log: input 0 is NULL");
}

/* The device factories on the host: values, dtype and shape as ct_full's,
 * _like following a view's shape into a contiguous result, and the errors. */
TEST(factories_on_a_device_and_like_another_tensor) {
    ct_tensor *f = ct_full_on(CT_SHAPE(2, 3), 2.5, CT_FLOAT64, CT_DEVICE_CPU);
    ASSERT_CLOSE(f, ct_full(CT_SHAPE(2, 3), 2.5, CT_FLOAT64), 0, 0);
    ct_tensor *e = ct_empty_on(CT_SHAPE(4), CT_INT32, CT_DEVICE_CPU);
    ASSERT_TRUE(e != NULL && ct_tensor_dtype(e) == CT_INT32 && ct_numel(e) == 4);
    ct_tensor *view = ct_transpose(ct_ones(CT_SHAPE(3, 5), CT_BFLOAT16), 0, 1);
    ct_tensor *z = ct_zeros_like(view);
    ASSERT_CLOSE(z, ct_zeros(CT_SHAPE(5, 3), CT_BFLOAT16), 0, 0);
    ASSERT_TRUE(ct_is_contiguous(z));
    ASSERT_CLOSE(ct_full_like(view, -1), ct_full(CT_SHAPE(5, 3), -1, CT_BFLOAT16), 0, 0);
    ASSERT_TRUE(ct_empty_like(view) != NULL &&
                ct_device_equal(ct_tensor_device(ct_empty_like(view)), CT_DEVICE_CPU));
    ASSERT_FAILS(ct_full_on(CT_SHAPE(2), 0, CT_FLOAT32, (ct_device){(ct_device_type)7, 0}),
                 CT_EDEVICE, "full_on", "unknown device type 7");
    ASSERT_FAILS(ct_empty_on(CT_SHAPE(-1), CT_FLOAT32, CT_DEVICE_CPU), CT_EINVAL, "empty_on");
    ASSERT_FAILS(ct_zeros_like(NULL), CT_EINVAL, "zeros_like");
    int n = ct_cuda_device_count();
    ASSERT_FAILS(ct_full_on(CT_SHAPE(2), 0, CT_FLOAT32, (ct_device){CT_CUDA, n}), CT_EDEVICE,
                 "full_on");
}

/* Runs anywhere: a device that is not there is a clear CT_EDEVICE, whether
 * the machine has no device (this one) or fewer than asked for. */
TEST(cuda_devices_that_are_not_there_are_named) {
    int n = ct_cuda_device_count();
    ASSERT_TRUE(n >= 0);
    ASSERT_TRUE(n > 0 || strlen(ct_cuda_unavailable_reason()) > 0);
    ASSERT_RC(ct_cuda_set_device(n), CT_EDEVICE, "ct_cuda_set_device");
    ASSERT_RC(ct_cuda_synchronize(-1), CT_EDEVICE, "cuda:-1");
    ct_cuda_memory_stats st;
    ASSERT_RC(ct_cuda_memory_stats_get(n, &st), CT_EDEVICE,
              n ? "no such device" : "there is no CUDA device");
    ct_tensor *x = ct_ones(CT_SHAPE(2, 3), CT_FLOAT32);
    ASSERT_FAILS(ct_to(x, (ct_device){CT_CUDA, n}), CT_EDEVICE, "ct_to");
    /* To where it is already: the same tensor. */
    ct_tensor *same = ct_to(x, CT_DEVICE_CPU);
    ASSERT_TRUE(same != NULL && ct_data_ptr(same) == ct_data_ptr(x));
    ASSERT_FAILS(ct_to(NULL, CT_DEVICE_CPU), CT_EINVAL, "ct_to");
    ASSERT_FAILS(ct_to_async(x, (ct_device){CT_CUDA, n}), CT_EDEVICE, "ct_to_async");
    ASSERT_TRUE(!ct_is_pinned(x) && !ct_is_pinned(NULL));
    if (n == 0) {
        /* Pinning needs the driver. */
        ASSERT_FAILS(ct_empty_pinned(CT_SHAPE(4), CT_FLOAT32), CT_EDEVICE, "ct_empty_pinned");
        ASSERT_FAILS(ct_pin_memory(x), CT_EDEVICE, "ct_pin_memory");
    }
}
