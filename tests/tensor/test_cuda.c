/* CUDA tensors on a real device, or on the test device (device_under_test.h):
 * copies both ways for every dtype and for views, device storage in the
 * memory statistics (on CUDA through the caching allocator, its stats and
 * its out-of-memory error) and the current device per thread. Without a
 * device the CUDA program is skipped (exit 77); test_core checks the errors
 * that no device gives, and test_cuda_allocator the allocator's rules,
 * here. */
#include "ct_test.h"
#include "device_under_test.h"

#include <ct/ct.h>
#include <ct/cuda.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

TEST(copies_to_the_device_and_back_keep_every_value) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_tensor *x = tt_rand(CT_SHAPE(3, 5, 7), (ct_dtype)d, 40 + (uint64_t)d);
        ct_tensor *on = ct_to(x, dut);
        ASSERT_TRUE(on != NULL);
        ASSERT_EQ(ct_tensor_device(on).type, DUT_TYPE);
        ct_tensor *back = ct_to(on, CT_DEVICE_CPU);
        ASSERT_TRUE(back != NULL);
        ASSERT_CLOSE(back, x, 0, 0);
    }
    /* A view on the host goes over as its values. */
    ct_tensor *v = ct_transpose(tt_rand(CT_SHAPE(4, 6), CT_FLOAT32, 9), 0, 1);
    ASSERT_CLOSE(ct_to(ct_to(v, dut), CT_DEVICE_CPU), v, 0, 0);
    /* An empty tensor. */
    ct_tensor *e = ct_zeros(CT_SHAPE(0, 3), CT_FLOAT32);
    ASSERT_EQ(ct_numel(ct_to(ct_to(e, dut), CT_DEVICE_CPU)), 0);
}

static ct_tensor *identity(void *ctx, ct_tensor *const *inputs, int n) {
    (void)ctx;
    (void)n;
    return inputs[0];
}

TEST(ops_without_a_cuda_kernel_say_so) {
    ct_tensor *on = ct_to(tt_rand(CT_SHAPE(4, 6), CT_FLOAT64, 9), dut);
    ASSERT_RC(ct_gradcheck(identity, NULL, &on, 1, NULL), CT_EDEVICE, DUT_NAME,
              "no " DUT_TYPE_NAME " kernel", "ct_to");
    ASSERT_FAILS(ct_copy_(ct_ones(CT_SHAPE(4, 6), CT_FLOAT32), on), CT_EDEVICE, "on cpu", DUT_NAME);
}

/* Factories on the device, values read back one at a time, and printing. */
TEST(factories_item_and_print_work_on_the_device) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_tensor *f = ct_full_on(CT_SHAPE(3, 70), 3, (ct_dtype)d, dut);
        ASSERT_TRUE(f != NULL);
        ASSERT_EQ(ct_tensor_device(f).type, DUT_TYPE);
        ASSERT_CLOSE(ct_to(f, CT_DEVICE_CPU), ct_full(CT_SHAPE(3, 70), 3, (ct_dtype)d), 0, 0);
        ASSERT_CLOSE(ct_to(ct_zeros_like(f), CT_DEVICE_CPU), ct_zeros(CT_SHAPE(3, 70), (ct_dtype)d),
                     0, 0);
        ASSERT_EQ(ct_tensor_device(ct_empty_like(f)).type, DUT_TYPE);
    }
    ct_tensor *x = tt_rand(CT_SHAPE(4, 5), CT_FLOAT64, 12);
    ct_tensor *on = ct_to(x, dut);
    ASSERT_NEAR(ct_get(on, (int64_t[]){2, 3}), ct_get(x, (int64_t[]){2, 3}), 0);
    ASSERT_NEAR(ct_item(ct_select(ct_select(on, 0, 1), 0, 4)), ct_get(x, (int64_t[]){1, 4}), 0);
    ASSERT_FAILS(ct_empty_on(CT_SHAPE(2), CT_FLOAT32, (ct_device){DUT_TYPE, 999}), CT_EDEVICE,
                 DUT_TYPE_NAME ":999");
    char buf[512];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    ASSERT_EQ(ct_tensor_fprint(f, ct_to(ct_arange(0, 3, 1, CT_FLOAT32), dut)), 0);
    fclose(f);
    ASSERT_STR_CONTAINS(buf, "device=" DUT_NAME);
    ASSERT_STR_CONTAINS(buf, "2.");
}

static pthread_t hook_thread;
static int hook_device = -1;

static ct_tensor *note_thread(ct_tensor *grad, void *ctx) {
    (void)ctx;
    hook_thread = pthread_self();
    hook_device = ct_device_current(DUT_TYPE).index;
    return grad;
}

/* A backward on the device gives the CPU's gradients, runs on the device's
 * own thread with the device current, and leaves gradients there. */
TEST(backward_on_the_device_matches_the_cpu_on_its_own_thread) {
    ct_tensor *hx = tt_rand(CT_SHAPE(6, 5), CT_FLOAT64, 21);
    ct_tensor *hw = tt_rand(CT_SHAPE(5), CT_FLOAT64, 22);
    ct_tensor *grads[2][2];
    for (int k = 0; k < 2; k++) {
        ct_device dev = k ? dut : CT_DEVICE_CPU;
        ct_tensor *x = ct_requires_grad_(ct_to(hx, dev), true);
        ct_tensor *w = ct_requires_grad_(ct_to(hw, dev), true);
        ct_tensor *h = ct_tanh(ct_mul(x, w));
        if (k)
            ASSERT_TRUE(ct_tensor_register_hook(h, note_thread, NULL) > 0);
        ct_tensor *loss = ct_sum(ct_mul(h, ct_slice(x, 0, 0, 6, 1)), NULL, 0, false);
        ASSERT_TRUE(loss != NULL);
        ASSERT_EQ(ct_tensor_backward(loss), 0);
        grads[k][0] = ct_tensor_grad(x);
        grads[k][1] = ct_tensor_grad(w);
    }
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(ct_tensor_device(grads[1][i]).type, DUT_TYPE);
        ASSERT_CLOSE(ct_to(grads[1][i], CT_DEVICE_CPU), grads[0][i], 1e-12, 1e-12);
    }
    /* A device's backward runs on that device's own thread
     * (autograd/engine.c), not the caller's. */
    ASSERT_TRUE(!pthread_equal(hook_thread, pthread_self()));
    ASSERT_EQ(hook_device, 0);
    /* A gradient given on another device than its output is refused. */
    ct_tensor *y = ct_mul_scalar(ct_requires_grad_(ct_to(hw, dut), true), 2);
    ASSERT_RC(ct_backward(&y, 1, (ct_tensor *[]){ct_ones(CT_SHAPE(5), CT_FLOAT64)}, false),
              CT_EDEVICE, DUT_NAME, "on cpu");
}

/* The optimizers' device kernel computes rules.h's rules as the CPU loops
 * do, without contraction: the same bits after several steps. */
TEST(optimizer_steps_on_the_device_give_the_cpus_bits) {
    ct_optim_kind kinds[] = {CT_OPTIM_SGD, CT_OPTIM_ADAM, CT_OPTIM_ADAMW};
    for (int k = 0; k < 3; k++) {
        for (int dt = 0; dt < 2; dt++) {
            ct_dtype dtype = dt ? CT_FLOAT64 : CT_FLOAT32;
            ct_tensor *p[2][2];
            ct_optim_options o = ct_optim_defaults(kinds[k], 0.01);
            o.weight_decay = 0.1;
            o.momentum = kinds[k] == CT_OPTIM_SGD ? 0.9 : o.momentum;
            o.amsgrad = kinds[k] == CT_OPTIM_ADAM;
            for (int side = 0; side < 2; side++) {
                ct_device dev = side ? dut : CT_DEVICE_CPU;
                for (int i = 0; i < 2; i++)
                    p[side][i] = ct_tensor_retain(ct_requires_grad_(
                        ct_to(tt_rand(CT_SHAPE(33 + i, 7), dtype, 30 + (uint64_t)i), dev), true));
                ct_optim *opt = ct_optim_new(&o, p[side], 2);
                ASSERT_TRUE(opt != NULL);
                for (int step = 0; step < 3; step++) {
                    for (int i = 0; i < 2; i++)
                        ASSERT_EQ(ct_tensor_set_grad(p[side][i],
                                                     ct_to(tt_rand(CT_SHAPE(33 + i, 7), dtype,
                                                                   100 + (uint64_t)(step * 2 + i)),
                                                           dev)),
                                  0);
                    ASSERT_EQ(ct_optim_step(opt), 0);
                }
                ASSERT_EQ(ct_optim_zero_grad(opt, false), 0);
                ASSERT_CLOSE(ct_to(ct_tensor_grad(p[side][0]), CT_DEVICE_CPU),
                             ct_zeros(CT_SHAPE(33, 7), dtype), 0, 0);
                ct_optim_free(opt);
            }
            for (int i = 0; i < 2; i++) {
                ASSERT_CLOSE(ct_to(p[1][i], CT_DEVICE_CPU), p[0][i], 0, 0);
                ct_tensor_free(p[0][i]);
                ct_tensor_free(p[1][i]);
            }
        }
    }
    /* Parameters on two devices do not make one optimizer. */
    ct_tensor *mixed[2] = {ct_requires_grad_(ct_zeros(CT_SHAPE(2), CT_FLOAT32), true),
                           ct_requires_grad_(ct_full_on(CT_SHAPE(2), 0, CT_FLOAT32, dut), true)};
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_SGD, 0.1);
    ASSERT_FAILS(ct_optim_new(&o, mixed, 2), CT_EDEVICE, "param 1", "another device");
}

/* A module moved to the device computes what it computes on the host, and
 * its flat buffers are made there. */
TEST(modules_move_to_the_device_and_flatten_there) {
    ct_module *nets[2];
    ct_tensor *x = tt_rand(CT_SHAPE(8, 6), CT_FLOAT32, 41), *out[2];
    for (int k = 0; k < 2; k++) {
        ct_manual_seed(5);
        nets[k] = ct_sequential_new();
        ct_sequential_append(nets[k], ct_linear_new(6, 16, true));
        ct_sequential_append(nets[k], ct_relu_new());
        ct_sequential_append(nets[k], ct_linear_new(16, 3, true));
        if (k)
            ASSERT_EQ(ct_module_to(nets[k], dut), 0);
        ASSERT_EQ(ct_module_flatten(nets[k], true), 0);
        ASSERT_EQ(ct_tensor_device(ct_module_flat_params(nets[k])).type, k ? DUT_TYPE : CT_CPU);
        out[k] = ct_module_forward(nets[k], k ? ct_to(x, dut) : x);
        ASSERT_TRUE(out[k] != NULL);
    }
    ASSERT_CLOSE(ct_to(out[1], CT_DEVICE_CPU), out[0], 1e-5, 1e-5);
    ASSERT_RC(ct_module_to(nets[1], CT_DEVICE_CPU), CT_ESTATE, "flattened");
    for (int k = 0; k < 2; k++)
        ct_module_free(nets[k]);
}

/* The device copy kernel against the CPU's, on the same views. */
TEST(views_on_the_device_copy_and_convert_as_on_the_cpu) {
    ct_tensor *x = tt_rand(CT_SHAPE(5, 6, 7), CT_FLOAT32, 3);
    ct_tensor *on = ct_to(x, dut);
    ASSERT_TRUE(on != NULL);
    ct_tensor *views[][2] = {
        {ct_transpose(x, 0, 2), ct_transpose(on, 0, 2)},
        {ct_slice(x, 1, 1, 6, 2), ct_slice(on, 1, 1, 6, 2)},
        {ct_expand(ct_narrow(x, 0, 2, 1), CT_SHAPE(4, 6, 7)),
         ct_expand(ct_narrow(on, 0, 2, 1), CT_SHAPE(4, 6, 7))},
        {ct_select(ct_permute(x, (int[]){2, 0, 1}), 1, 3),
         ct_select(ct_permute(on, (int[]){2, 0, 1}), 1, 3)},
    };
    for (size_t v = 0; v < sizeof views / sizeof *views; v++) {
        ASSERT_CLOSE(ct_to(views[v][1], CT_DEVICE_CPU), views[v][0], 0, 0);
        ASSERT_CLOSE(ct_to(ct_clone(views[v][1]), CT_DEVICE_CPU), views[v][0], 0, 0);
        for (int d = 0; d < CT_NDTYPES; d++)
            ASSERT_CLOSE(ct_to(ct_to_dtype(views[v][1], (ct_dtype)d), CT_DEVICE_CPU),
                         ct_to_dtype(views[v][0], (ct_dtype)d), 0, 0);
    }
    /* Every dtype to every dtype. Between float dtypes NaN, infinities and
     * an integer beyond float's 24 bits go too; into integers only values
     * they hold, since C (the CPU kernel) leaves the rest undefined. */
    double fvals[] = {0, 1, -1, 2.5, -3.75, 255, 16777217, NAN, INFINITY, -INFINITY};
    double ivals[] = {0, 1, 2, 7, 100, 255, 3, 0, 1, 64};
    ct_tensor *fbase = ct_from_data(fvals, CT_SHAPE(10), CT_FLOAT64);
    ct_tensor *ibase = ct_from_data(ivals, CT_SHAPE(10), CT_FLOAT64);
    for (int s = 0; s < CT_NDTYPES; s++)
        for (int d = 0; d < CT_NDTYPES; d++) {
            bool floats = ct_dtype_is_float((ct_dtype)s) && ct_dtype_is_float((ct_dtype)d);
            ct_tensor *src = ct_to_dtype(floats ? fbase : ibase, (ct_dtype)s);
            ASSERT_CLOSE(ct_to(ct_to_dtype(ct_to(src, dut), (ct_dtype)d), CT_DEVICE_CPU),
                         ct_to_dtype(src, (ct_dtype)d), 0, 0);
        }
    /* copy_ on the device, broadcasting. */
    ct_tensor *dst = ct_to(ct_zeros(CT_SHAPE(3, 4), CT_FLOAT64), dut);
    ASSERT_TRUE(ct_copy_(dst, ct_to(ct_arange(0, 4, 1, CT_INT32), dut)) != NULL);
    ASSERT_CLOSE(ct_to(dst, CT_DEVICE_CPU),
                 ct_expand(ct_arange(0, 4, 1, CT_FLOAT64), CT_SHAPE(3, 4)), 0, 0);
}

typedef ct_tensor *(*binary_fn)(ct_tensor *, ct_tensor *);
typedef ct_tensor *(*binary_scalar_fn)(ct_tensor *, double);

/* Every binary op in every dtype the CPU takes, broadcast, on views, with a
 * scalar and in place: the device's result is the CPU's. pow goes through
 * each side's libm, so it may differ in the last bits. */
TEST(binary_ops_on_the_device_match_the_cpu) {
#define FN(name)  ct_##name,
#define SFN(name) ct_##name##_scalar,
    binary_fn fns[] = {CT_BINARY_OP_MAP(FN) ct_pow};
    binary_scalar_fn sfns[] = {CT_BINARY_OP_MAP(SFN)};
#undef FN
#undef SFN
    const int nfns = (int)(sizeof fns / sizeof *fns), nsfns = (int)(sizeof sfns / sizeof *sfns);
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_scope_begin();
        ct_tensor *a = tt_rand(CT_SHAPE(3, 1, 5), (ct_dtype)d, 70 + (uint64_t)d);
        ct_tensor *b = ct_transpose(tt_rand(CT_SHAPE(5, 4), (ct_dtype)d, 80 + (uint64_t)d), 0, 1);
        /* db is a transposed view on the device, as b is on the host. */
        ct_tensor *da = ct_to(a, dut);
        ct_tensor *db = ct_transpose(ct_to(ct_transpose(b, 0, 1), dut), 0, 1);
        for (int f = 0; f < nfns && !tt_failed(); f++) {
            double rtol = f == nfns - 1 ? 1e-5 : 0;
            ct_tensor *want = fns[f](a, b);
            if (!want) {
                /* Not defined for this dtype on the CPU: the same error here. */
                int code = ct_errcode();
                ct_errclear();
                ASSERT_FAILS(fns[f](da, db), code, "");
                continue;
            }
            ASSERT_CLOSE(ct_to(fns[f](da, db), CT_DEVICE_CPU), want, rtol, 0);
        }
        for (int f = 0; f < nsfns && !tt_failed(); f++) {
            ct_tensor *want = sfns[f](a, 2.5);
            if (!want) {
                ct_errclear();
                continue;
            }
            ASSERT_CLOSE(ct_to(sfns[f](da, 2.5), CT_DEVICE_CPU), want, 0, 0);
        }
        /* In place, into a copy of each. */
        ct_tensor *ha = ct_clone(ct_expand(a, CT_SHAPE(3, 4, 5)));
        ct_tensor *hd = ct_to(ha, dut);
        if (ct_mul_(ha, b)) {
            ASSERT_TRUE(ct_mul_(hd, db) != NULL);
            ASSERT_CLOSE(ct_to(hd, CT_DEVICE_CPU), ha, 0, 0);
        }
        ct_errclear();
        ct_scope_end();
    }
}

typedef ct_tensor *(*unary_fn)(ct_tensor *);

static ct_tensor *pow_3(ct_tensor *t) { return ct_pow_scalar(t, 3); }
static ct_tensor *pow_half(ct_tensor *t) { return ct_pow_scalar(t, 0.5); }
static ct_tensor *clamp_1(ct_tensor *t) { return ct_clamp(t, -1, 1.5); }

/* Every unary op in every dtype, on a view: the device's result is the
 * CPU's, within a few ulps where the two sides' math libraries differ
 * (ct's float exp and tanh are its own). */
TEST(unary_ops_on_the_device_match_the_cpu) {
#define FN(name) ct_##name,
    unary_fn fns[] = {CT_UNARY_OP_MAP(FN) pow_3, pow_half, clamp_1};
#undef FN
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_scope_begin();
        ct_tensor *x = ct_transpose(tt_rand(CT_SHAPE(6, 9), (ct_dtype)d, 90 + (uint64_t)d), 0, 1);
        ct_tensor *dx = ct_transpose(ct_to(ct_transpose(x, 0, 1), dut), 0, 1);
        bool half = d == CT_FLOAT16 || d == CT_BFLOAT16;
        for (size_t f = 0; f < sizeof fns / sizeof *fns && !tt_failed(); f++) {
            ct_tensor *want = fns[f](x);
            if (!want) {
                int code = ct_errcode();
                ct_errclear();
                ASSERT_FAILS(fns[f](dx), code, "");
                continue;
            }
            ASSERT_CLOSE(ct_to(fns[f](dx), CT_DEVICE_CPU), want, half ? 1e-2 : 1e-5, 1e-6);
        }
        /* In place. */
        ct_tensor *hx = ct_clone(x), *hd = ct_to(hx, dut);
        if (ct_neg_(hx)) {
            ASSERT_TRUE(ct_neg_(hd) != NULL);
            ASSERT_CLOSE(ct_to(hd, CT_DEVICE_CPU), hx, 0, 0);
        }
        ct_errclear();
        ct_scope_end();
    }
}

TEST(device_storage_counts_in_the_memory_statistics) {
    ASSERT_EQ(dut_synchronize(), 0);
    int64_t before = ct_memory_allocated(dut);
    ct_memory_reset_peak(dut);
    ct_storage *s = ct_storage_new(3 << 20, dut);
    ASSERT_TRUE(s != NULL);
    ASSERT_EQ(ct_memory_allocated(dut) - before, 3 << 20);
    ct_storage_free(s);
    ASSERT_EQ(ct_memory_allocated(dut), before);
    ASSERT_EQ(ct_memory_peak(dut) - before, 3 << 20);
}

TEST(asking_for_more_than_the_device_has_is_out_of_memory) {
    ASSERT_FAILS(ct_storage_new((size_t)1 << 50, dut), CT_ENOMEM, "out of memory");
}

#if DUT_CUDA
TEST(device_storage_comes_back_from_the_cache) {
    ASSERT_EQ(ct_cuda_empty_cache(0), 0);
    ct_cuda_memory_stats a, b;
    ASSERT_EQ(ct_cuda_memory_stats_get(0, &a), 0);
    ct_storage *s = ct_storage_new(3 << 20, dut);
    ASSERT_TRUE(s != NULL);
    ASSERT_EQ(ct_cuda_memory_stats_get(0, &b), 0);
    ASSERT_EQ(b.allocated - a.allocated, 3 << 20);
    ct_storage_free(s);
    s = ct_storage_new(3 << 20, dut);
    ASSERT_TRUE(s != NULL);
    ct_cuda_memory_stats c;
    ASSERT_EQ(ct_cuda_memory_stats_get(0, &c), 0);
    ASSERT_EQ(c.device_mallocs, b.device_mallocs);
    ASSERT_TRUE(c.cache_hits > b.cache_hits);
    ct_storage_free(s);
}

TEST(asking_for_more_than_the_device_has_says_what_is_held) {
    ASSERT_FAILS(ct_storage_new((size_t)1 << 50, dut), CT_ENOMEM, "CUDA out of memory",
                 "tried to allocate 1024.00 TiB", "free of");
    ct_cuda_memory_stats st;
    ASSERT_EQ(ct_cuda_memory_stats_get(0, &st), 0);
    ASSERT_TRUE(st.ooms >= 1);
}

static void *other_thread(void *arg) {
    *(int *)arg = ct_cuda_current_device();
    return NULL;
}

TEST(the_current_device_belongs_to_the_thread) {
    int last = ct_cuda_device_count() - 1;
    ASSERT_EQ(ct_cuda_set_device(last), 0);
    ASSERT_EQ(ct_cuda_current_device(), last);
    int seen = -1;
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, other_thread, &seen), 0);
    pthread_join(th, NULL);
    ASSERT_EQ(seen, 0);
    ASSERT_EQ(ct_cuda_set_device(0), 0);
    ASSERT_EQ(ct_cuda_synchronize(0), 0);
}
#endif
