/* Collectives on device tensors, one rank: every operation for every dtype,
 * views staged and copied back, the order against the compute stream, the
 * allocator's hold on a block in flight, and a data-parallel step, on the
 * device under test (device_under_test.h).
 *
 * On CUDA the communicator is nccl's, on the device itself. On the test
 * device it is shm's, on the host: comm.c stages device tensors through host
 * memory (docs/collectives.md), and the test device's lazy stream, poisoned
 * heap and stream-ordered frees catch a staging copy that does not wait for
 * the compute stream, reads device memory from the host, or lets a block be
 * reused while a copy of it is queued. Results come back with ct_to, on the
 * compute stream, which ct_work_wait orders after the collective. The nccl
 * backend's own cases (its communicators, several ranks, its errors) are
 * test_nccl's. */
#include "ct_test.h"
#include "device_under_test.h"

#include <ct/autograd.h>
#include <ct/collectives.h>
#include <ct/dist.h>
#include <ct/nn.h>

#include <unistd.h>

#if DUT_CUDA
/* nccl.h declares ncclGroupStart() and others without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

/* The device the communicator's buffers live on: the collectives run there. */
static const ct_device comm_device = {DUT_TYPE, 0};
/* Elements in the cases that need the device to be busy for a while. */
enum { BIG = 1 << 24 };

static ct_comm *comm_single(void) {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess)
        return NULL;
    return ct_comm_new(&(ct_comm_config){
        .backend = CT_BACKEND_NCCL, .rank = 0, .size = 1, .timeout_s = 30, .nccl_id = &id});
}
#else
/* shm's buffers are the host's: device tensors are staged. */
static const ct_device comm_device = {CT_CPU, 0};
/* The test device's stream runs only when the host waits, however small
 * the work: order is checked at any size. */
enum { BIG = 1 << 16 };

static ct_comm *comm_single(void) {
    char name[64];
    snprintf(name, sizeof name, "/ct-test-coll-device-%ld", (long)getpid());
    return ct_comm_new(&(ct_comm_config){
        .backend = CT_BACKEND_SHM, .rank = 0, .size = 1, .timeout_s = 30, .shm_name = name});
}
#endif

/* host's values on the device under test. */
static ct_tensor *on_device(ct_tensor *host) { return host ? ct_to(host, dut) : NULL; }

/* Asserts that device tensor got holds want's values (a CPU tensor). */
#define ASSERT_DEVICE_CLOSE(got, want, tol)                                                        \
    do {                                                                                           \
        ct_tensor *tt_got = (got) ? ct_to((got), CT_DEVICE_CPU) : NULL;                            \
        ASSERT_TRUE(tt_got != NULL);                                                               \
        ASSERT_CLOSE(tt_got, (want), (tol), (tol));                                                \
    } while (0)

/* With one rank, every reduction is the identity and every gather a copy:
 * each operation on allocator memory, for each dtype, gives
 * back what went in, placed as the operation says. */
TEST(every_collective_on_device_tensors) {
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    ASSERT_EQ(ct_comm_device(comm).type, comm_device.type);
    ASSERT_EQ(ct_comm_device(comm).index, comm_device.index);
    const ct_dtype dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16,
                               CT_INT64,   CT_INT32,   CT_UINT8,    CT_BOOL};
    for (size_t k = 0; k < sizeof dtypes / sizeof *dtypes; k++) {
        ct_dtype dt = dtypes[k];
        ct_tensor *want = tt_rand(CT_SHAPE(3, 5), dt, 100 + k);
        for (int rop = CT_REDUCE_SUM; rop <= CT_REDUCE_PROD; rop++) {
            if (rop == CT_REDUCE_AVG && dt == CT_BOOL)
                continue;
            ct_tensor *t = on_device(want);
            ct_work *work = NULL;
            ASSERT_EQ(ct_comm_allreduce(comm, t, (ct_reduce_op)rop, &work), 0);
            ASSERT_EQ(ct_work_wait(work), 0);
            ct_work_free(work);
            /* Integer avg truncates the sum over one rank: itself. */
            ASSERT_DEVICE_CLOSE(t, want, 0);
            ASSERT_EQ(ct_comm_reduce(comm, t, (ct_reduce_op)rop, 0, NULL), 0);
            ASSERT_DEVICE_CLOSE(t, want, 0);
        }
        ct_tensor *t = on_device(want);
        ASSERT_EQ(ct_comm_broadcast(comm, t, 0, NULL), 0);
        ASSERT_DEVICE_CLOSE(t, want, 0);
        ct_tensor *out = ct_empty_on(CT_SHAPE(3, 5), dt, dut);
        ASSERT_EQ(ct_comm_allgather(comm, out, t, NULL), 0);
        ASSERT_DEVICE_CLOSE(out, want, 0);
        out = ct_empty_on(CT_SHAPE(3, 5), dt, dut);
        ASSERT_EQ(ct_comm_reduce_scatter(comm, out, t, CT_REDUCE_SUM, NULL), 0);
        ASSERT_DEVICE_CLOSE(out, want, 0);
        out = ct_empty_on(CT_SHAPE(3, 5), dt, dut);
        ASSERT_EQ(ct_comm_alltoall(comm, out, t, NULL), 0);
        ASSERT_DEVICE_CLOSE(out, want, 0);
        /* Non-contiguous: staged on the device and copied back in place. */
        ct_tensor *wide = on_device(tt_rand(CT_SHAPE(5, 3), dt, 200 + k));
        ct_tensor *view = ct_transpose(wide, 0, 1);
        ASSERT_EQ(ct_comm_broadcast(comm, view, 0, NULL), 0);
        ct_tensor *view_out = ct_transpose(ct_empty_on(CT_SHAPE(5, 3), dt, dut), 0, 1);
        ct_work *work = NULL;
        ASSERT_EQ(ct_comm_allgather(comm, view_out, view, &work), 0);
        ASSERT_EQ(ct_work_wait(work), 0);
        ct_tensor *want_view = ct_contiguous(ct_to(view, CT_DEVICE_CPU));
        ASSERT_DEVICE_CLOSE(ct_contiguous(view_out), want_view, 0);
        ct_work_free(work);
    }
    ASSERT_EQ(ct_comm_barrier(comm, NULL), 0);
    /* ct_comm_zeros gives zeros on the communicator's device. */
    ct_tensor *z = ct_comm_zeros(comm, CT_SHAPE(4), CT_FLOAT32);
    ASSERT_TRUE(z != NULL);
    ASSERT_EQ(ct_tensor_device(z).type, comm_device.type);
    ASSERT_DEVICE_CLOSE(z, ct_zeros(CT_SHAPE(4), CT_FLOAT32), 0);
    ct_comm_free(comm);
}

/* The collective follows the compute stream (a fill and an add queued just
 * before it are in what it sends), and an op queued right after
 * ct_work_wait sees its result: no host synchronization in between. Large
 * enough that the ops take a while on the device. */
TEST(collectives_are_ordered_with_the_compute_stream) {
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    int64_t n = BIG;
    for (int round = 0; round < 3; round++) {
        ct_tensor *in = ct_full_on(CT_SHAPE(n), 1, CT_FLOAT32, dut);
        ct_tensor *out = ct_full_on(CT_SHAPE(n), -1, CT_FLOAT32, dut);
        for (int i = 0; i < 8; i++)
            in = ct_add_scalar(in, 1);
        ct_work *work = NULL;
        ASSERT_EQ(ct_comm_allgather(comm, out, in, &work), 0);
        ASSERT_EQ(ct_work_wait(work), 0);
        ct_tensor *twice = ct_mul_scalar(out, 2);
        ASSERT_DEVICE_CLOSE(ct_sum(twice, NULL, 0, false), ct_scalar(18.0 * (double)n, CT_FLOAT32),
                            1e-6);
        ct_work_free(work);
    }
    ct_comm_free(comm);
}

/* A block the communication stream uses is not handed to the compute
 * stream's next allocation before the collective is done: the input is
 * freed while its allgather is in flight, and the same size is allocated
 * and overwritten on the compute stream at once. */
TEST(the_allocator_does_not_reuse_a_block_in_flight) {
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    int64_t n = BIG;
    ct_tensor *out = ct_full_on(CT_SHAPE(n), 0, CT_FLOAT32, dut);
    ct_work *work = NULL;
    ct_scope_begin();
    ct_tensor *in = ct_full_on(CT_SHAPE(n), 5, CT_FLOAT32, dut);
    for (int i = 0; i < 16; i++)
        in = ct_add_scalar(in, 0); /* keeps the device busy before the collective */
    int rc = ct_comm_allgather(comm, out, in, &work);
    ct_scope_end();
    ASSERT_EQ(rc, 0);
    ct_tensor *other = ct_full_on(CT_SHAPE(n), 7, CT_FLOAT32, dut);
    ASSERT_TRUE(other != NULL);
    ASSERT_EQ(ct_work_wait(work), 0);
    ASSERT_DEVICE_CLOSE(ct_sum(out, NULL, 0, false), ct_scalar(5.0 * (double)n, CT_FLOAT32), 1e-6);
    ct_work_free(work);
    ct_comm_free(comm);
}

/* A step of ct_ddp with parameters on the device on one rank gives the gradients a
 * step without it gives (the average over one rank), in buckets small
 * enough that several allreduces overlap backward. */
TEST(ddp_on_device_parameters_matches_a_local_step) {
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    ct_module *models[2];
    for (int m = 0; m < 2; m++) {
        models[m] = ct_sequential_new();
        ct_sequential_append(models[m], ct_linear_new(16, 32, true));
        ct_sequential_append(models[m], ct_relu_new());
        ct_sequential_append(models[m], ct_linear_new(32, 4, true));
        ASSERT_TRUE(models[m] != NULL);
    }
    ct_param_list a, b;
    ct_param_list_init(&a);
    ct_param_list_init(&b);
    ASSERT_EQ(ct_module_named_parameters(models[0], &a), 0);
    ASSERT_EQ(ct_module_named_parameters(models[1], &b), 0);
    /* The parameters are leaves that require grad: copied with grad mode
     * off, as an in-place op on them is refused otherwise. */
    bool grad_was = ct_set_grad_enabled(false);
    for (int i = 0; i < a.n; i++)
        ASSERT_TRUE(ct_copy_(b.tensors[i], a.tensors[i]) != NULL);
    ct_set_grad_enabled(grad_was);
    for (int m = 0; m < 2; m++)
        ASSERT_EQ(ct_module_to(models[m], dut), 0);
    ct_param_list_free(&a);
    ct_param_list_free(&b);
    ct_param_list_init(&a);
    ct_param_list_init(&b);
    ASSERT_EQ(ct_module_named_parameters(models[0], &a), 0);
    ASSERT_EQ(ct_module_named_parameters(models[1], &b), 0);
    ct_ddp_options o = ct_ddp_defaults();
    o.first_bucket_bytes = o.bucket_bytes = 256;
    ct_ddp *ddp = ct_ddp_new(comm, models[1], &o);
    ASSERT_TRUE(ddp != NULL);
    ASSERT_TRUE(ct_ddp_num_buckets(ddp) > 1);
    for (int step = 0; step < 3; step++) {
        ct_tensor *x = on_device(tt_rand(CT_SHAPE(8, 16), CT_FLOAT32, 300 + step));
        for (int m = 0; m < 2; m++) {
            ct_tensor *y = ct_module_forward(models[m], x);
            ct_tensor *loss = ct_sum(ct_mul(y, y), NULL, 0, false);
            ASSERT_TRUE(loss != NULL);
            ASSERT_EQ(ct_backward(&loss, 1, NULL, false), 0);
        }
        for (int i = 0; i < a.n; i++) {
            ct_tensor *want = ct_to(ct_tensor_grad(a.tensors[i]), CT_DEVICE_CPU);
            ASSERT_TRUE(want != NULL);
            ASSERT_EQ(ct_tensor_device(ct_tensor_grad(b.tensors[i])).type, DUT_TYPE);
            ASSERT_DEVICE_CLOSE(ct_tensor_grad(b.tensors[i]), want, 1e-5);
        }
        for (int i = 0; i < a.n; i++) {
            ct_tensor_set_grad(a.tensors[i], NULL);
            ASSERT_TRUE(ct_copy_(ct_tensor_grad(b.tensors[i]), ct_zeros_like(b.tensors[i])) !=
                        NULL);
        }
    }
    ct_ddp_free(ddp);
    ct_param_list_free(&a);
    ct_param_list_free(&b);
    ct_module_free(models[0]);
    ct_module_free(models[1]);
    ct_comm_free(comm);
}
