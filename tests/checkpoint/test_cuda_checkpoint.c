/* Checkpoints, safetensors files and RPC with tensors on a CUDA device:
 * everything passes through host memory. A save holds the values of every
 * op queued before it, a load writes into device tensors and views in
 * place, the background checkpointer snapshots at the call, and an RPC
 * argument or result on a device arrives on the host, its gradient going
 * back to the device. Without a device the whole program is skipped (exit
 * 77); the host paths are test_ckpt's, test_safetensors' and test_rpc's. */
#include "ct_test.h"
#include "device_under_test.h"

#include <ct/checkpoint.h>
#include <ct/ct.h>
#include <ct/cuda.h>
#include <stdio.h>
#include <stdlib.h>

static ct_tensor *on_device(ct_tensor *t) { return ct_to(t, dut); }
static ct_tensor *on_host(ct_tensor *t) { return ct_to(t, CT_DEVICE_CPU); }

/* Device tensors of every dtype, contiguous and as views, with a host
 * tensor beside them, saved and loaded into other device tensors. */
TEST(a_checkpoint_of_device_tensors_loads_into_device_tensors_and_views) {
    char dir[256];
    tt_tmp_path(dir, "sync");
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_tensor *x = tt_rand(CT_SHAPE(5, 7), (ct_dtype)d, 10 + (uint64_t)d);
        ct_tensor *big = tt_rand(CT_SHAPE(6, 9), (ct_dtype)d, 30 + (uint64_t)d);
        ct_tensor *host = tt_rand(CT_SHAPE(4), (ct_dtype)d, 50 + (uint64_t)d);
        ct_tensor *dx = on_device(x);
        /* Values queued on the device just before the save are saved. */
        ct_tensor *dbig = on_device(ct_zeros(CT_SHAPE(6, 9), (ct_dtype)d));
        ASSERT_TRUE(ct_copy_(dbig, on_device(big)) != NULL);
        ct_tensor *view = ct_slice(ct_transpose(dbig, 0, 1), 0, 1, 9, 2); /* (4, 6) */
        ct_tensor *empty = on_device(ct_zeros(CT_SHAPE(0, 3), (ct_dtype)d));
        ct_state *st = ct_state_new();
        ASSERT_EQ(ct_state_add_tensor(st, "x", dx, CT_STATE_REPLICATED), 0);
        ASSERT_EQ(ct_state_add_tensor(st, "view", view, CT_STATE_PER_RANK), 0);
        ASSERT_EQ(ct_state_add_tensor(st, "host", host, CT_STATE_REPLICATED), 0);
        ASSERT_EQ(ct_state_add_tensor(st, "empty", empty, CT_STATE_REPLICATED), 0);
        ASSERT_EQ(ct_checkpoint_save(dir, st, NULL, NULL), 0);
        ct_state_free(st);

        /* The files are a host tensor's: the reader gives the same values. */
        ct_checkpoint_reader *r = NULL;
        ASSERT_EQ(ct_checkpoint_reader_open(dir, &r), 0);
        ASSERT_CLOSE(ct_checkpoint_reader_read(r, ct_checkpoint_reader_find(r, "view"), 0),
                     on_host(view), 0, 0);
        ct_checkpoint_reader_close(r);

        ct_tensor *lx = on_device(ct_zeros(CT_SHAPE(5, 7), (ct_dtype)d));
        ct_tensor *lbig = on_device(ct_zeros(CT_SHAPE(6, 9), (ct_dtype)d));
        ct_tensor *lview = ct_slice(ct_transpose(lbig, 0, 1), 0, 1, 9, 2);
        ct_tensor *lhost = ct_zeros(CT_SHAPE(4), (ct_dtype)d);
        ct_tensor *lempty = on_device(ct_zeros(CT_SHAPE(0, 3), (ct_dtype)d));
        st = ct_state_new();
        ASSERT_EQ(ct_state_add_tensor(st, "x", lx, CT_STATE_REPLICATED), 0);
        ASSERT_EQ(ct_state_add_tensor(st, "view", lview, CT_STATE_PER_RANK), 0);
        ASSERT_EQ(ct_state_add_tensor(st, "host", lhost, CT_STATE_REPLICATED), 0);
        ASSERT_EQ(ct_state_add_tensor(st, "empty", lempty, CT_STATE_REPLICATED), 0);
        ASSERT_EQ(ct_checkpoint_load(dir, st, NULL), 0);
        ct_state_free(st);
        ASSERT_EQ(ct_tensor_device(lx).type, DUT_TYPE);
        ASSERT_CLOSE(on_host(lx), x, 0, 0);
        ASSERT_CLOSE(on_host(lview), on_host(view), 0, 0);
        ASSERT_CLOSE(lhost, host, 0, 0);
        /* The view was written in place: what lies outside it is untouched. */
        ct_tensor *outside = ct_slice(ct_transpose(lbig, 0, 1), 0, 0, 9, 2);
        ASSERT_CLOSE(on_host(outside), ct_zeros(CT_SHAPE(5, 6), (ct_dtype)d), 0, 0);
    }
}

/* A block of a sharded tensor on the device, and a checkpoint saved from
 * the device loaded on the host. */
TEST(a_device_shard_saves_and_loads_on_the_host) {
    char dir[256];
    tt_tmp_path(dir, "shard");
    ct_tensor *x = tt_rand(CT_SHAPE(8, 3), CT_FLOAT32, 3);
    ct_tensor *dx = on_device(x);
    ct_state *st = ct_state_new();
    ASSERT_EQ(ct_state_add_shard(st, "w", dx, 2, (int64_t[]){8, 3}, (int64_t[]){0, 0}), 0);
    ASSERT_EQ(ct_checkpoint_save(dir, st, NULL, NULL), 0);
    ct_state_free(st);
    ct_tensor *back = ct_zeros(CT_SHAPE(8, 3), CT_FLOAT32);
    st = ct_state_new();
    ASSERT_EQ(ct_state_add_tensor(st, "w", back, CT_STATE_REPLICATED), 0);
    ASSERT_EQ(ct_checkpoint_load(dir, st, NULL), 0);
    ct_state_free(st);
    ASSERT_CLOSE(back, x, 0, 0);
}

/* The background checkpointer copies device tensors before save returns:
 * an op queued on the device right after it does not reach the file. */
TEST(the_background_checkpointer_saves_device_values_as_of_the_call) {
    char dir[256];
    tt_tmp_path(dir, "async");
    ct_checkpointer *ck = ct_checkpointer_new(NULL);
    ASSERT_TRUE(ck != NULL);
    ct_tensor *x = tt_rand(CT_SHAPE(256, 1024), CT_FLOAT32, 7);
    ct_tensor *y = tt_rand(CT_SHAPE(33, 17), CT_FLOAT64, 8);
    ct_tensor *dx = on_device(x);
    ct_tensor *dy = on_device(y);
    ct_tensor *yview = ct_transpose(dy, 0, 1);
    ct_state *st = ct_state_new();
    ASSERT_EQ(ct_state_add_tensor(st, "x", dx, CT_STATE_REPLICATED), 0);
    ASSERT_EQ(ct_state_add_tensor(st, "yt", yview, CT_STATE_REPLICATED), 0);
    ASSERT_EQ(ct_checkpointer_reserve(ck, st), 0);
    ASSERT_EQ(ct_checkpointer_save(ck, dir, st, NULL), 0);
    ASSERT_TRUE(ct_add_scalar_(dx, 1) != NULL);
    ASSERT_TRUE(ct_mul_scalar_(dy, -3) != NULL);
    ASSERT_EQ(ct_checkpointer_wait(ck), 0);
    ct_state_free(st);
    ct_checkpointer_free(ck);

    ct_tensor *lx = on_device(ct_zeros(CT_SHAPE(256, 1024), CT_FLOAT32));
    ct_tensor *ly = on_device(ct_zeros(CT_SHAPE(17, 33), CT_FLOAT64));
    st = ct_state_new();
    ASSERT_EQ(ct_state_add_tensor(st, "x", lx, CT_STATE_REPLICATED), 0);
    ASSERT_EQ(ct_state_add_tensor(st, "yt", ly, CT_STATE_REPLICATED), 0);
    ASSERT_EQ(ct_checkpoint_load(dir, st, NULL), 0);
    ct_state_free(st);
    ASSERT_CLOSE(on_host(lx), x, 0, 0);
    ASSERT_CLOSE(on_host(ly), ct_transpose(y, 0, 1), 0, 0);
    /* And the device tensors did change after the call. */
    ASSERT_CLOSE(on_host(dx), ct_add_scalar(x, 1), 0, 0);
}

TEST(safetensors_save_device_tensors_and_load_them_on_the_host) {
    char path[256];
    tt_tmp_path(path, "w.safetensors");
    ct_tensor *a = tt_rand(CT_SHAPE(3, 5), CT_BFLOAT16, 1);
    ct_tensor *b = tt_rand(CT_SHAPE(4, 6), CT_INT64, 2);
    ct_tensor *da = on_device(a);
    ct_tensor *db = ct_transpose(on_device(b), 0, 1);
    ct_tensor_dict *set = ct_tensor_dict_new();
    ASSERT_EQ(ct_tensor_dict_add(set, "a", da), 0);
    ASSERT_EQ(ct_tensor_dict_add(set, "bt", db), 0);
    ASSERT_EQ(ct_tensor_dict_add(set, "host", b), 0);
    ASSERT_EQ(ct_safetensors_save(path, set), 0);
    ct_tensor_dict_free(set);
    ASSERT_EQ(ct_safetensors_load(path, &set), 0);
    ASSERT_EQ(ct_tensor_device(ct_tensor_dict_find(set, "a")).type, CT_CPU);
    ASSERT_CLOSE(ct_tensor_dict_find(set, "a"), a, 0, 0);
    ASSERT_CLOSE(ct_tensor_dict_find(set, "bt"), ct_transpose(b, 0, 1), 0, 0);
    ASSERT_CLOSE(ct_tensor_dict_find(set, "host"), b, 0, 0);
    ct_tensor_dict_free(set);
}

#if __has_include(<ct/dist_autograd.h>)
#include <ct/dist_autograd.h>

/* Doubles its tensor; says where the tensor arrived, and returns a device
 * tensor as a second result. */
static int twice(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    ct_tensor *t = ct_rpc_args_tensor(in, 0);
    if (!t)
        return ct_errcode();
    int rc = ct_rpc_args_add_tensor(out, ct_mul_scalar(t, 2));
    if (!rc)
        rc = ct_rpc_args_add_int(out, ct_tensor_device(t).type);
    if (!rc)
        rc = ct_rpc_args_add_tensor(out, ct_to(t, dut));
    return rc;
}

/* A world of one whose worker calls itself: the message crosses the wire.
 * The gradient of a device tensor sent comes back on the host and lands on
 * the device. */
TEST(rpc_sends_device_tensors_through_the_host_and_their_gradients_back) {
    ASSERT_EQ(ct_dist_init(NULL), 0);
    ASSERT_EQ(ct_rpc_register("twice", twice, NULL), 0);
    ASSERT_EQ(ct_rpc_init(NULL), 0);
    const char *self = ct_rpc_worker_name(ct_rpc_self());
    ct_tensor *x = tt_rand(CT_SHAPE(4, 5), CT_FLOAT32, 21);
    ct_tensor *w = ct_requires_grad_(on_device(x), true);
    ct_tensor *wt = ct_transpose(on_device(x), 0, 1);

    ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
    ASSERT_EQ(ct_rpc_args_add_tensor(in, wt), 0);
    ASSERT_EQ(ct_rpc_sync(self, "twice", in, 30.0, &out), 0);
    ASSERT_EQ(ct_rpc_args_int(out, 1), CT_CPU);
    ct_tensor *got = ct_rpc_args_tensor(out, 0);
    ASSERT_EQ(ct_tensor_device(got).type, CT_CPU);
    ASSERT_CLOSE(got, ct_mul_scalar(ct_transpose(x, 0, 1), 2), 0, 0);
    /* A result on the device comes back on the host too. */
    ASSERT_EQ(ct_tensor_device(ct_rpc_args_tensor(out, 2)).type, CT_CPU);
    ASSERT_CLOSE(ct_rpc_args_tensor(out, 2), ct_transpose(x, 0, 1), 0, 0);
    ct_rpc_args_free(in);
    ct_rpc_args_free(out);

    int64_t id = ct_dist_autograd_begin();
    ASSERT_TRUE(id != 0);
    in = ct_rpc_args_new();
    ASSERT_EQ(ct_rpc_args_add_tensor(in, w), 0);
    ASSERT_EQ(ct_rpc_sync(self, "twice", in, 30.0, &out), 0);
    ct_tensor *loss = ct_sum(ct_rpc_args_tensor(out, 0), NULL, 0, false);
    ASSERT_EQ(ct_dist_backward(id, &loss, 1), 0);
    ct_tensor *g = ct_dist_autograd_grad(id, w);
    ASSERT_TRUE(g != NULL);
    ASSERT_EQ(ct_tensor_device(g).type, DUT_TYPE);
    ASSERT_CLOSE(on_host(g), ct_full(CT_SHAPE(4, 5), 2, CT_FLOAT32), 0, 0);
    ct_rpc_args_free(in);
    ct_rpc_args_free(out);
    ASSERT_EQ(ct_dist_autograd_end(id), 0);
    ASSERT_EQ(ct_rpc_shutdown(), 0);
    ct_dist_finalize();
}
#endif
