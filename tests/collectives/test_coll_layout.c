/* The shm backend's segment grows linearly with the ranks: its layout
 * alone, at the world sizes of one machine and beyond, with no ranks run.
 * It once held a channel per ordered pair of ranks, clamped at 4 KiB a
 * slot: 604 MiB at 128 ranks and 33 GiB at 1024. */
#include "coll_impl.h"
#include "ct_test.h"

#define MIB (1024.0 * 1024.0)

static size_t bytes_at(int n) {
    size_t b = 0;
    if (ct__shm_layout_bytes(n, &b))
        tt_fail(__FILE__, __LINE__, "layout of %d ranks: %s", n, ct_errmsg());
    return b;
}

TEST(the_segment_grows_linearly_with_the_ranks) {
    static const int sizes[] = {2, 8, 64, 128, 256, 1024};
    size_t per_rank_at_2 = bytes_at(2) / 2;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        int n = sizes[i];
        size_t b = bytes_at(n);
        printf("  %5d ranks: %10zu bytes (%.1f MiB, %.0f KiB per rank)\n", n, b, b / MIB,
               (double)b / n / 1024.0);
        /* Linear: the bytes per rank never grow beyond those at 2 ranks
         * (the header's page is shared by more ranks as they grow). */
        ASSERT_TRUE(b / (size_t)n <= per_rank_at_2);
        ASSERT_TRUE(b >= (size_t)n * (512u << 10)); /* the ring's slots are in it */
    }
    ASSERT_TRUE(bytes_at(8) <= 8 * MIB);
    ASSERT_TRUE(bytes_at(256) <= 256 * MIB);
    /* What a 1024-rank machine can afford: under 1 GiB. */
    ASSERT_TRUE(bytes_at(1024) < 1024 * MIB);
}

TEST(a_world_beyond_the_layout_is_refused_naming_the_limit) {
    size_t b = 0;
    ASSERT_RC(ct__shm_layout_bytes(CT__SHM_MAX_RANKS + 1, &b), CT_EINVAL, "4096", "4097");
    ASSERT_RC(ct__shm_layout_bytes(0, &b), CT_EINVAL, "1 to 4096");
    ASSERT_EQ(ct__shm_layout_bytes(CT__SHM_MAX_RANKS, &b), 0);
    ct_comm *c = ct_comm_new(&(ct_comm_config){.backend = CT_BACKEND_SHM,
                                               .rank = 0,
                                               .size = CT__SHM_MAX_RANKS + 1,
                                               .timeout_s = 1,
                                               .shm_name = "/ct-test-layout-too-many"});
    ASSERT_TRUE(c == NULL);
    ASSERT_EQ(ct_errcode(), CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "takes 1 to 4096 ranks");
}
