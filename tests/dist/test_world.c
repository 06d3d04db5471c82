/* Finding the world from the environment: each launcher's variables, the
 * order they are tried in, and inconsistent or malformed values. */
#include "ct_test.h"

#include <ct/dist.h>

#include <stdlib.h>
#include <string.h>

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
    tt_launch_env((const char *[]){"SLURM_PROCID", "9", "SLURM_NTASKS", "16", "SLURM_LOCALID", "1",
                                   "SLURM_STEP_ID", "0", "PMIX_RANK", "9", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_SLURM);
    ASSERT_EQ(w.rank, 9);
    ASSERT_EQ(w.local_rank, 1);
    ASSERT_EQ(w.local_size, 0);   /* Slurm does not say plainly */
    ASSERT_EQ(w.master_port, -1); /* with PMI, MPI brings the ranks together */
    tt_launch_env(NULL);
}

TEST(env_variables_of_torchrun_and_pytorchjob) {
    ct_world w;
    tt_launch_env((const char *[]){"RANK", "3", "WORLD_SIZE", "4", "LOCAL_RANK", "1",
                                   "LOCAL_WORLD_SIZE", "2", "MASTER_ADDR", "node0", "MASTER_PORT",
                                   "29500", "TORCHELASTIC_RESTART_COUNT", "2", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_ENV);
    ASSERT_EQ(w.rank, 3);
    ASSERT_EQ(w.size, 4);
    ASSERT_EQ(w.local_rank, 1);
    ASSERT_EQ(w.local_size, 2);
    ASSERT_EQ(w.restart_count, 2);
    ASSERT_STR_CONTAINS(w.master_addr, "node0");
    ASSERT_EQ(w.master_port, 29500);
    ASSERT_STR_CONTAINS(ct_world_source_name(w.source), "env://");
    /* torchrun's agent serves its own store on MASTER_PORT: ct's is one up,
     * unless CT_MASTER_PORT says where. */
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.master_port, 29501);
    setenv("CT_MASTER_PORT", "31000", 1);
    setenv("CT_MASTER_ADDR", "10.0.0.9", 1);
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.master_port, 31000);
    ASSERT_STR_CONTAINS(w.master_addr, "10.0.0.9");
    /* PyTorchJob: one rank per pod, nothing said about the machine. */
    tt_launch_env((const char *[]){"RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "job-master-0",
                                   "MASTER_PORT", "23456", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.local_size, 0);
    ASSERT_EQ(w.local_rank, -1);
    /* A world of one needs nowhere to meet. */
    tt_launch_env((const char *[]){"RANK", "0", "WORLD_SIZE", "1", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_ENV);
    ASSERT_EQ(w.master_port, -1);
    tt_launch_env(NULL);
}

TEST(slurm_counts_only_inside_a_step_and_meets_at_its_first_host) {
    ct_world w;
    /* A batch script is one process, whatever SLURM_NTASKS says. */
    tt_launch_env((const char *[]){"SLURM_PROCID", "0", "SLURM_NTASKS", "4", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_SINGLE);
    setenv("SLURM_STEP_ID", "4294967291", 1); /* the batch step */
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_SINGLE);
    /* A task of step 3 of job 4242, without PMI. */
    tt_launch_env((const char *[]){"SLURM_PROCID", "2", "SLURM_NTASKS", "4", "SLURM_LOCALID", "0",
                                   "SLURM_STEP_ID", "3", "SLURM_JOB_ID", "4242",
                                   "SLURM_STEP_NODELIST", "node[07-09,12],gpu1", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_SLURM);
    ASSERT_EQ(w.rank, 2);
    ASSERT_EQ(w.local_size, 0);
    ASSERT_EQ(w.local_rank, 0);
    ASSERT_STR_CONTAINS(w.master_addr, "node07");
    ASSERT_EQ((int)strlen(w.master_addr), 6);
    ASSERT_EQ(w.master_port, 15000 + 242 * 10 + 3);
    setenv("SLURM_STEP_NUM_NODES", "1", 1); /* one node: all local */
    setenv("SLURM_STEP_NODELIST", "gpu1", 1);
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.local_size, 4);
    ASSERT_STR_CONTAINS(w.master_addr, "gpu1");
    setenv("SLURM_STEP_NODELIST", "[", 1);
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "first host", "\"[\"");
    tt_launch_env(NULL);
}

TEST(a_launcher_nests_others_but_two_claims_on_this_process_must_agree) {
    ct_world w;
    /* ctlaunch inside a Slurm step: ctlaunch's ranks. */
    tt_launch_env((const char *[]){"CT_RANK", "5", "CT_WORLD_SIZE", "8", "SLURM_PROCID", "1",
                                   "SLURM_NTASKS", "2", "SLURM_STEP_ID", "0", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_CTLAUNCH);
    ASSERT_EQ(w.size, 8);
    /* env:// by hand against the step's own world: two claims. */
    tt_launch_env((const char *[]){"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "n0",
                                   "MASTER_PORT", "1234", "SLURM_PROCID", "1", "SLURM_NTASKS", "2",
                                   "SLURM_STEP_ID", "0", "SLURM_JOB_ID", "7", NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "two worlds", "env:// says rank 0 of 2",
              "Slurm says rank 1 of 2", "SLURM_PROCID");
    ASSERT_EQ(w.source, CT_WORLD_SINGLE);
    /* torchrun inside the step is a launcher of its own. */
    setenv("TORCHELASTIC_RUN_ID", "job7", 1);
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_ENV);
    /* Open MPI's world that agrees is no conflict. */
    tt_launch_env((const char *[]){"RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "n0",
                                   "MASTER_PORT", "1234", "OMPI_COMM_WORLD_RANK", "1",
                                   "OMPI_COMM_WORLD_SIZE", "2", NULL});
    ASSERT_EQ(ct_world_from_env(&w), 0);
    ASSERT_EQ(w.source, CT_WORLD_ENV);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "Open MPI says rank 1 of 3");
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
    tt_launch_env((const char *[]){"RANK", "0", "WORLD_SIZE", "2", NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "MASTER_ADDR is unset", "MASTER_PORT");
    tt_launch_env((const char *[]){"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "n0",
                                   "MASTER_PORT", "65535", "TORCHELASTIC_USE_AGENT_STORE", "True",
                                   NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "MASTER_PORT=\"65535\"", "[1, 65534]");
    tt_launch_env((const char *[]){"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "", NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "MASTER_ADDR", "empty");
    tt_launch_env((const char *[]){"SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_STEP_ID", "0",
                                   "SLURM_STEP_NODELIST", "n0", NULL});
    ASSERT_RC(ct_world_from_env(&w), CT_EINVAL, "SLURM_JOB_ID is unset");
    ASSERT_RC(ct_world_from_env(NULL), CT_EINVAL, "NULL world");
    tt_launch_env(NULL);
}
