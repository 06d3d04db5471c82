/* Finding the world from the environment: each launcher's variables, the
 * order they are tried in, and inconsistent or malformed values. */
#include "ct_test.h"

#include <ct/dist.h>

TEST(no_launcher_is_a_world_of_one) {
    tt_launch_env(NULL);
    ct_world w;
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_SINGLE);
    ASSERT_EQ(w.rank, 0);
    ASSERT_EQ(w.size, 1);
    ASSERT_EQ(w.local_size, 1);
    ASSERT_EQ(w.master_port, -1);
    ASSERT_STR_CONTAINS(ct_world_source_name(w.source), "single");
}

TEST(ctlaunch_variables) {
    tt_launch_env((const char *[]){"CT_RANK", "5", "CT_WORLD_SIZE", "8", "CT_LOCAL_RANK", "1",
                                   "CT_LOCAL_WORLD_SIZE", "4", "CT_MASTER_ADDR", "node0",
                                   "CT_MASTER_PORT", "29500", "CT_RESTART_COUNT", "2", NULL});
    ct_world w;
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_CTLAUNCH);
    ASSERT_EQ(w.rank, 5);
    ASSERT_EQ(w.size, 8);
    ASSERT_EQ(w.local_rank, 1);
    ASSERT_EQ(w.local_size, 4);
    ASSERT_EQ(w.restart_count, 2);
    ASSERT_STR_CONTAINS(w.master_addr, "node0");
    ASSERT_EQ(w.master_port, 29500);
    tt_launch_env(NULL);
}

TEST(mpi_pmi_and_slurm_variables_in_that_order) {
    ct_world w;
    tt_launch_env((const char *[]){"OMPI_COMM_WORLD_RANK", "3", "OMPI_COMM_WORLD_SIZE", "4",
                                   "OMPI_COMM_WORLD_LOCAL_RANK", "1", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                   "2", "SLURM_PROCID", "9", "SLURM_NTASKS", "16", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_OPENMPI);
    ASSERT_EQ(w.rank, 3);
    ASSERT_EQ(w.local_rank, 1);
    ASSERT_EQ(w.local_size, 2);
    tt_launch_env((const char *[]){"PMI_RANK", "2", "PMI_SIZE", "3", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_PMI);
    ASSERT_EQ(w.rank, 2);
    ASSERT_EQ(w.local_size, 3); /* no local variables: one node assumed */
    tt_launch_env(
        (const char *[]){"SLURM_PROCID", "9", "SLURM_NTASKS", "16", "SLURM_LOCALID", "1", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_SLURM);
    ASSERT_EQ(w.rank, 9);
    ASSERT_EQ(w.local_rank, 1);
    ASSERT_EQ(w.local_size, 0); /* Slurm does not say plainly */
    tt_launch_env(NULL);
}

TEST(inconsistent_or_malformed_variables_are_errors) {
    ct_world w;
    tt_launch_env((const char *[]){"CT_RANK", "4", "CT_WORLD_SIZE", "4", NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "CT_RANK=\"4\"", "[0, 3]");
    ASSERT_EQ(w.source, CT_WORLD_SINGLE);
    tt_launch_env((const char *[]){"CT_RANK", "1", NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "CT_WORLD_SIZE is unset", "ctlaunch");
    tt_launch_env(
        (const char *[]){"OMPI_COMM_WORLD_RANK", "x1", "OMPI_COMM_WORLD_SIZE", "2", NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "OMPI_COMM_WORLD_RANK=\"x1\"");
    tt_launch_env((const char *[]){"CT_RANK", "0", "CT_WORLD_SIZE", "2", "CT_MASTER_ADDR", "h",
                                   "CT_MASTER_PORT", "70000", NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "CT_MASTER_PORT=\"70000\"");
    tt_launch_env(
        (const char *[]){"CT_RANK", "0", "CT_WORLD_SIZE", "2", "CT_LOCAL_WORLD_SIZE", "3", NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "CT_LOCAL_WORLD_SIZE");
    ASSERT_RC(ct_world_from_env(NULL), CT_EINVAL, "NULL world");
    tt_launch_env(NULL);
}
