/* CUDA tensors on a real device: copies both ways for every dtype and for
 * views, device storage through the caching allocator, its stats and its
 * out-of-memory error, and the current device per thread. Without a device
 * the whole program is skipped (exit 77); test_core checks the errors that
 * no device gives, and test_cuda_allocator the allocator's rules, here. */
#include "ct_test.h"

#include <ct/cuda.h>
#include <pthread.h>
#include <stdlib.h>

static const ct_device cuda0 = {CT_CUDA, 0};

TEST(copies_to_the_device_and_back_keep_every_value) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_tensor *x = tt_rand(CT_SHAPE(3, 5, 7), (ct_dtype)d, 40 + (uint64_t)d);
        ct_tensor *on = ct_to(x, cuda0);
        ASSERT_TRUE(on != NULL);
        ASSERT_EQ(ct_tensor_device(on).type, CT_CUDA);
        ct_tensor *back = ct_to(on, CT_DEVICE_CPU);
        ASSERT_TRUE(back != NULL);
        ASSERT_CLOSE(back, x, 0, 0);
    }
    /* A view on the host goes over as its values. */
    ct_tensor *v = ct_transpose(tt_rand(CT_SHAPE(4, 6), CT_FLOAT32, 9), 0, 1);
    ASSERT_CLOSE(ct_to(ct_to(v, cuda0), CT_DEVICE_CPU), v, 0, 0);
    /* An empty tensor. */
    ct_tensor *e = ct_zeros(CT_SHAPE(0, 3), CT_FLOAT32);
    ASSERT_EQ(ct_numel(ct_to(ct_to(e, cuda0), CT_DEVICE_CPU)), 0);
}

TEST(ops_without_a_cuda_kernel_say_so) {
    ct_tensor *on = ct_to(tt_rand(CT_SHAPE(4, 6), CT_FLOAT32, 9), cuda0);
    ASSERT_FAILS(ct_add(on, on), CT_EDEVICE, "cuda:0", "no CUDA kernel", "ct_to");
    /* A strided view of device memory cannot come back without the device
     * copy kernel. */
    ct_storage *s = ct_storage_new(24 * sizeof(float), cuda0);
    ASSERT_TRUE(s != NULL);
    ct_tensor *strided =
        ct_tensor_from_storage(s, 0, CT_SHAPE(6, 4), (int64_t[]){1, 6}, CT_FLOAT32);
    ct_storage_free(s);
    ASSERT_TRUE(strided != NULL);
    ASSERT_FAILS(ct_to(strided, CT_DEVICE_CPU), CT_ENOTSUP, "non-contiguous");
}

TEST(device_storage_comes_back_from_the_cache) {
    ASSERT_EQ(ct_cuda_empty_cache(0), 0);
    ct_cuda_memory_stats a, b;
    ASSERT_EQ(ct_cuda_memory_stats_get(0, &a), 0);
    ct_storage *s = ct_storage_new(3 << 20, cuda0);
    ASSERT_TRUE(s != NULL);
    ASSERT_EQ(ct_cuda_memory_stats_get(0, &b), 0);
    ASSERT_EQ(b.allocated - a.allocated, 3 << 20);
    ct_storage_free(s);
    s = ct_storage_new(3 << 20, cuda0);
    ASSERT_TRUE(s != NULL);
    ct_cuda_memory_stats c;
    ASSERT_EQ(ct_cuda_memory_stats_get(0, &c), 0);
    ASSERT_EQ(c.device_mallocs, b.device_mallocs);
    ASSERT_TRUE(c.cache_hits > b.cache_hits);
    ct_storage_free(s);
}

TEST(asking_for_more_than_the_device_has_says_what_is_held) {
    ASSERT_FAILS(ct_storage_new((size_t)1 << 50, cuda0), CT_ENOMEM, "CUDA out of memory",
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

__attribute__((constructor)) static void require_device(void) {
    if (ct_cuda_device_count() == 0) {
        printf("skipped: no CUDA device (%s)\n", ct_cuda_unavailable_reason());
        exit(77);
    }
}
