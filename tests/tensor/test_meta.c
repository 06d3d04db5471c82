/* The meta device: shapes, dtypes and strides without memory. Ops check,
 * broadcast and record as on the CPU, reads give zeros, and its allocator
 * counts what each storage would hold; a model built there (ct_nn_set_device)
 * holds nothing, and its backward runs. */
#include "ct_test.h"

#include <ct/collectives.h>
#include <ct/nn.h>
#include <unistd.h>

static const ct_device meta = CT_DEVICE_META;

TEST(meta_tensors_count_their_bytes_and_hold_none) {
    int64_t before = ct_memory_allocated(meta), host = ct_memory_allocated(CT_DEVICE_CPU);
    ct_scope_begin();
    ct_tensor *t = ct_empty_on(CT_SHAPE(1 << 20, 256), CT_FLOAT32, meta);
    ASSERT_TRUE(t);
    /* 1 GiB planned, none of it on the host. */
    ASSERT_EQ(ct_memory_allocated(meta) - before, (int64_t)1 << 30);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), host);
    ASSERT_TRUE(ct_memory_peak(meta) - before >= (int64_t)1 << 30);
    char buf[CT_DEVICE_STR];
    ASSERT_STR_CONTAINS(ct_device_str(ct_tensor_device(t), buf), "meta:0");
    ct_scope_end();
    ASSERT_EQ(ct_memory_allocated(meta), before);
    ct_memory_reset_peak(meta);
    ASSERT_EQ(ct_memory_peak(meta), before);
    ASSERT_FAILS(ct_empty_on(CT_SHAPE(2), CT_FLOAT32, ((ct_device){CT_META, 1})), CT_EDEVICE,
                 "meta:1: no such device");
}

TEST(ops_on_views_broadcast_and_make_their_results_there) {
    ct_tensor *a = ct_empty_on(CT_SHAPE(4, 1, 6), CT_FLOAT32, meta);
    ct_tensor *b = ct_empty_on(CT_SHAPE(5, 6), CT_FLOAT32, meta);
    int64_t before = ct_memory_allocated(meta);
    ct_tensor *s = ct_add(a, b);
    ASSERT_TRUE(s);
    ASSERT_EQ(ct_ndim(s), 3);
    ASSERT_EQ(ct_size(s, 1), 5);
    ASSERT_EQ(ct_memory_allocated(meta) - before, 4 * 5 * 6 * 4);
    /* A transposed view into matmul, a reduction, a softmax: shapes as on
     * the CPU. */
    ct_tensor *m = ct_matmul(ct_transpose(b, 0, 1), b);
    ASSERT_TRUE(m);
    ASSERT_EQ(ct_size(m, 0), 6);
    ASSERT_EQ(ct_size(m, 1), 6);
    ct_tensor *r = ct_sum(s, CT_DIMS(2), false);
    ASSERT_EQ(ct_ndim(r), 2);
    ASSERT_EQ(ct_tensor_dtype(ct_softmax(ct_to_dtype(m, CT_FLOAT64), 1)), CT_FLOAT64);
    /* Wrong shapes fail as anywhere. */
    ASSERT_FAILS(ct_matmul(b, b), CT_ESHAPE, "matmul");
    /* Mixing devices fails, naming both. */
    ASSERT_FAILS(ct_add(a, ct_zeros(CT_SHAPE(6), CT_FLOAT32)), CT_EDEVICE, "meta:0", "cpu");
}

TEST(reading_a_meta_tensor_gives_zeros) {
    ct_tensor *t = ct_full_on(CT_SHAPE(3, 2), 7.0, CT_FLOAT64, meta);
    ASSERT_NEAR(ct_item(ct_sum(t, NULL, 0, false)), 0.0, 0);
    ct_tensor *h = ct_to(ct_transpose(t, 0, 1), CT_DEVICE_CPU);
    ASSERT_TRUE(h && ct_tensor_device(h).type == CT_CPU);
    ASSERT_EQ(ct_size(h, 0), 2);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            ASSERT_NEAR(ct_get(h, (int64_t[]){i, j}), 0.0, 0);
    /* A host tensor copied there keeps its shape and loses its values. */
    ct_tensor *back = ct_to(ct_to(ct_ones(CT_SHAPE(4), CT_INT64), meta), CT_DEVICE_CPU);
    ASSERT_NEAR(ct_get(back, (int64_t[]){3}), 0.0, 0);
}

TEST(a_model_built_there_holds_nothing_and_runs_backward) {
    int64_t host = ct_memory_allocated(CT_DEVICE_CPU), before = ct_memory_allocated(meta);
    ct_device was = ct_nn_set_device(meta);
    ASSERT_EQ(ct_nn_device().type, CT_META);
    ct_module *net = ct_sequential_new();
    ct_sequential_append(net, ct_linear_new(1000, 1000, true));
    ct_sequential_append(net, ct_gelu_new(false));
    ct_sequential_append(net, ct_layer_norm_new(1000, 1e-5));
    ct_sequential_append(net, ct_linear_new(1000, 10, false));
    ct_nn_set_device(was);
    ASSERT_EQ(ct_nn_device().type, CT_CPU);
    ASSERT_TRUE(net);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), host);
    int64_t params = (1000 * 1000 + 1000 + 2 * 1000 + 1000 * 10) * 4;
    ASSERT_EQ(ct_memory_allocated(meta) - before, params);
    ct_tensor *x = ct_empty_on(CT_SHAPE(32, 1000), CT_FLOAT32, meta);
    ct_tensor *y = ct_empty_on(CT_SHAPE(32), CT_INT64, meta);
    ct_tensor *loss = ct_cross_entropy(ct_module_forward(net, x), y, NULL);
    ASSERT_TRUE(loss);
    ASSERT_EQ(ct_tensor_backward(loss), 0);
    ct_param_list pl;
    ct_param_list_init(&pl);
    ASSERT_EQ(ct_module_named_parameters(net, &pl), 0);
    for (int i = 0; i < pl.n; i++) {
        ct_tensor *g = ct_tensor_grad(pl.tensors[i]);
        ASSERT_TRUE(g && ct_tensor_device(g).type == CT_META);
        ASSERT_EQ(ct_numel(g), ct_numel(pl.tensors[i]));
    }
    ct_param_list_free(&pl);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), host);
    ct_module_free(net);
}

TEST(only_a_dry_communicator_takes_meta_tensors) {
    ct_tensor *t = ct_empty_on(CT_SHAPE(8), CT_FLOAT32, meta);
    char name[64];
    snprintf(name, sizeof name, "/ct-test-meta-%d", (int)getpid());
    ct_comm *shm =
        ct_comm_new(&(ct_comm_config){.backend = CT_BACKEND_SHM, .size = 1, .shm_name = name});
    ASSERT_TRUE(shm);
    ASSERT_RC(ct_comm_allreduce(shm, t, CT_REDUCE_SUM, NULL), CT_EDEVICE,
              "on the meta device, which holds no data", "dry communicator");
    ct_comm_free(shm);
    ct_comm *dry = ct_comm_new(&(ct_comm_config){.backend = CT_BACKEND_DRY, .rank = 3, .size = 8});
    ASSERT_TRUE(dry);
    ct_tensor *all = ct_empty_on(CT_SHAPE(64), CT_FLOAT32, meta);
    int64_t host = ct_memory_allocated(CT_DEVICE_CPU);
    ct_memory_reset_peak(CT_DEVICE_CPU);
    ASSERT_EQ(ct_comm_allreduce(dry, t, CT_REDUCE_SUM, NULL), 0);
    ASSERT_EQ(ct_comm_allgather(dry, all, t, NULL), 0);
    ASSERT_EQ(ct_comm_reduce_scatter(dry, t, all, CT_REDUCE_AVG, NULL), 0);
    /* Nothing was staged through the host, not even for a moment. */
    ASSERT_EQ(ct_memory_peak(CT_DEVICE_CPU), host);
    ct_comm_free(dry);
}
