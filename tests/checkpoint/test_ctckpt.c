/* ctckpt, the checkpoint tool, run as a user runs it: info, verify, diff and
 * convert on real checkpoints (the golden one and ones made here); and
 * fmnist_mlp stopped and resumed, whose final checkpoint ctckpt diff finds
 * equal to that of a run that never stopped, on 1 rank and on 2 under
 * ctlaunch. */
#include "ct_test.h"

#include <ct/checkpoint.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEADLINE 120

static const char *tmp(void) {
    static char dir[256];
    return tt_tmp_path(dir, "");
}

static void sh(const char *fmt, const char *a, const char *b) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0)
        fprintf(stderr, "'%s' failed\n", cmd);
}

/* ctckpt with up to five arguments (NULL-terminated). */
static tt_job job_;
static int ctckpt(const char *a, const char *b, const char *c, const char *d, const char *e) {
    tt_run_job(&job_, (const char *const[]){CTCKPT_PATH, a, b, c, d, e, NULL},
               (const char *const[]){NULL}, DEADLINE);
    return tt_job_exit_code(&job_);
}

static const char *golden(void) {
    static char path[512];
    snprintf(path, sizeof path, "%s/v1.0", CT_TEST_DATA_DIR);
    return path;
}

TEST(info_lists_the_format_tensors_values_and_metadata) {
    ASSERT_EQ(ctckpt("info", golden(), "-v", NULL, NULL), 0);
    const char *says[] = {"format 1.0",    "2 rank(s)",  "float32",
                          "sharded",       "[7, 10]",    "per_rank",
                          "rng.seed",      "1000, 1001", "saved_by = ckpt_rank",
                          "data-00001.bin"};
    for (size_t i = 0; i < sizeof says / sizeof *says; i++)
        TT_ASSERT_JOB(&job_, strstr(job_.out, says[i]));
    ASSERT_EQ(ctckpt("info", "/nonexistent", NULL, NULL, NULL), 2);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "not a committed ct checkpoint"));
}

TEST(verify_passes_a_good_checkpoint_and_names_a_damaged_byte) {
    ASSERT_EQ(ctckpt("verify", golden(), NULL, NULL, NULL), 0);
    TT_ASSERT_JOB(&job_, strstr(job_.out, "ok: 4 tensors, 7 chunks"));
    char copy[400], file[600];
    snprintf(copy, sizeof copy, "%s/damaged", tmp());
    sh("cp -r '%s' '%s'", golden(), copy);
    snprintf(file, sizeof file, "%s/data-00001.bin", copy);
    int fd = open(file, O_RDWR);
    ASSERT_EQ(pwrite(fd, "\x7f", 1, 200), 1);
    close(fd);
    ASSERT_EQ(ctckpt("verify", copy, NULL, NULL, NULL), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "data-00001.bin") && strstr(job_.err, "tensor 'v'") &&
                             strstr(job_.err, "checksum"));
    ASSERT_EQ(truncate(file, 10), 0);
    ASSERT_EQ(ctckpt("verify", copy, NULL, NULL, NULL), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "truncated"));
}

/* A one-tensor checkpoint at dir/name whose element 3 is x. */
static int save_with(const char *name, float x) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", tmp(), name);
    ct_tensor *w = ct_arange(0, 10, 1, CT_FLOAT32);
    ct_copy_(ct_narrow(w, 0, 3, 1), ct_scalar(x, CT_FLOAT32));
    ct_state *st = ct_state_new();
    ct_state_add_tensor(st, "w", w, CT_STATE_REPLICATED);
    int rc = ct_checkpoint_save(path, st, NULL, NULL);
    ct_state_free(st);
    return rc;
}

TEST(diff_says_equal_or_how_many_elements_differ_and_by_how_much) {
    ASSERT_EQ(save_with("a", 3), 0);
    ASSERT_EQ(save_with("b", 3), 0);
    ASSERT_EQ(save_with("c", 3.5f), 0);
    char a[600], b[600], c[600];
    snprintf(a, sizeof a, "%s/a", tmp());
    snprintf(b, sizeof b, "%s/b", tmp());
    snprintf(c, sizeof c, "%s/c", tmp());
    ASSERT_EQ(ctckpt("diff", a, b, NULL, NULL), 0);
    TT_ASSERT_JOB(&job_, strstr(job_.out, "hold the same state"));
    ASSERT_EQ(ctckpt("diff", a, c, NULL, NULL), 1);
    TT_ASSERT_JOB(&job_,
                  strstr(job_.out, "tensor 'w': 1 of 10 elements differ, max |a - b| = 0.5"));
    ASSERT_EQ(ctckpt("diff", a, golden(), NULL, NULL), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.out, "tensor 'w': replicated float32 [10] vs sharded"));
}

TEST(convert_reshards_and_keeps_per_rank_entries_only_at_the_same_world_size) {
    char two[600], three[600];
    snprintf(two, sizeof two, "%s/two", tmp());
    snprintf(three, sizeof three, "%s/three", tmp());
    ASSERT_EQ(ctckpt("convert", golden(), two, "--shards", "2"), 0);
    ASSERT_EQ(ctckpt("diff", golden(), two, NULL, NULL), 0);
    ASSERT_EQ(ctckpt("convert", golden(), three, "--shards", "3"), 2);
    TT_ASSERT_JOB(&job_,
                  strstr(job_.err, "per-rank tensor 'own'") && strstr(job_.err, "--drop-per-rank"));
    tt_run_job(&job_,
               (const char *const[]){CTCKPT_PATH, "convert", golden(), three, "--shards", "3",
                                     "--drop-per-rank", NULL},
               (const char *const[]){NULL}, DEADLINE);
    TT_ASSERT_JOB(&job_, tt_job_exit_code(&job_) == 0);
    ASSERT_EQ(ctckpt("info", three, NULL, NULL, NULL), 0);
    TT_ASSERT_JOB(&job_, strstr(job_.out, "3 rank(s)"));
    ct_checkpoint_reader *ck;
    ASSERT_EQ(ct_checkpoint_reader_open(three, &ck), 0);
    ct_checkpoint_tensor_info t;
    ASSERT_EQ(ct_checkpoint_reader_tensor(ck, ct_checkpoint_reader_find(ck, "w"), &t), 0);
    ASSERT_EQ(t.nchunks, 3);
    ASSERT_EQ(ct_checkpoint_reader_find(ck, "own"), -1);
    ct_tensor *w = ct_checkpoint_reader_read(ck, ct_checkpoint_reader_find(ck, "w"), 0);
    ASSERT_TRUE(w);
    ASSERT_EQ(ct_get(w, (int64_t[]){6, 9}), 609);
    ASSERT_EQ(ct_checkpoint_reader_verify(ck, NULL, NULL), 0);
    ct_checkpoint_reader_close(ck);
}

TEST(convert_goes_to_safetensors_and_back) {
    char st[600], back[600];
    snprintf(st, sizeof st, "%s/golden.safetensors", tmp());
    snprintf(back, sizeof back, "%s/back", tmp());
    ASSERT_EQ(ctckpt("convert", golden(), st, NULL, NULL), 2);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "--drop-per-rank"));
    ASSERT_EQ(ctckpt("convert", golden(), st, "--drop-per-rank", NULL), 0);
    ct_tensor_dict *d;
    ASSERT_EQ(ct_safetensors_load(st, &d), 0);
    ASSERT_EQ(ct_tensor_dict_count(d), 3);
    ASSERT_STR_CONTAINS(ct_tensor_dict_meta(d, "ct.value.step"), "77");
    ct_tensor_dict_free(d);
    ASSERT_EQ(ctckpt("convert", st, back, NULL, NULL), 0);
    ct_checkpoint_reader *ck;
    ASSERT_EQ(ct_checkpoint_reader_open(back, &ck), 0);
    ct_tensor *v = ct_checkpoint_reader_read(ck, ct_checkpoint_reader_find(ck, "v"), 0);
    ASSERT_TRUE(v);
    ASSERT_EQ(ct_get(v, (int64_t[]){12}), 31);
    ct_checkpoint_reader_close(ck);
}

/* info and verify take a .safetensors file too (they said "manifest.json:
 * Not a directory"): its tensors and metadata; the format's rules, which a
 * truncated file breaks. */
TEST(info_and_verify_read_a_safetensors_file) {
    char st[400], cut[400];
    snprintf(st, sizeof st, "%s/exported.safetensors", tmp());
    snprintf(cut, sizeof cut, "%s/cut.safetensors", tmp());
    ASSERT_EQ(ctckpt("convert", golden(), st, "--drop-per-rank", NULL), 0);
    ASSERT_EQ(ctckpt("info", st, NULL, NULL, NULL), 0);
    const char *says[] = {"safetensors file, 3 tensor(s)", "float32", "[7, 10]", "bfloat16",
                          "ct.value.step = 77"};
    for (size_t i = 0; i < sizeof says / sizeof *says; i++)
        TT_ASSERT_JOB(&job_, strstr(job_.out, says[i]));
    ASSERT_EQ(ctckpt("verify", st, NULL, NULL, NULL), 0);
    TT_ASSERT_JOB(&job_, strstr(job_.out, "ok: 3 tensors"));
    sh("head -c 100 '%s' > '%s'", st, cut);
    ASSERT_EQ(ctckpt("verify", cut, NULL, NULL, NULL), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "truncated"));
    ASSERT_EQ(ctckpt("info", cut, NULL, NULL, NULL), 2);
}

/* A chunk read only in part when resharding is checked all the same: a
 * flipped byte in block 3 of a one-rank checkpoint fails convert --shards 2
 * (which reads half of the chunk on each new rank), naming the file and the
 * block, and verify lists the block. The 1.0 golden checkpoint, which has
 * no block checksums, is refused too. */
TEST(convert_refuses_a_damaged_chunk_that_it_reads_only_in_part) {
    char src[400], dst[400], file[600];
    snprintf(src, sizeof src, "%s/whole", tmp());
    snprintf(dst, sizeof dst, "%s/halves", tmp());
    ct_tensor *w = ct_zeros(CT_SHAPE(16, 65536), CT_FLOAT32);
    ct_state *st = ct_state_new();
    ct_state_add_tensor(st, "w", w, CT_STATE_REPLICATED);
    ASSERT_EQ(ct_checkpoint_save(src, st, NULL, NULL), 0);
    ct_state_free(st);
    snprintf(file, sizeof file, "%s/data-00000.bin", src);
    int fd = open(file, O_RDWR);
    ASSERT_EQ(pwrite(fd, "\x7f", 1, (3 << 20) + 12345), 1);
    close(fd);
    ASSERT_EQ(ctckpt("convert", src, dst, "--shards", "2"), 2);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "data-00000.bin") && strstr(job_.err, "block 3") &&
                             strstr(job_.err, "damaged"));
    ASSERT_EQ(ctckpt("verify", src, NULL, NULL, NULL), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "1 damaged block") &&
                             strstr(job_.err, "block 3 (bytes 3145728..4194304) in tensor 'w'"));
    char copy[400];
    snprintf(copy, sizeof copy, "%s/golden-damaged", tmp());
    sh("cp -r '%s' '%s'", golden(), copy);
    snprintf(file, sizeof file, "%s/data-00000.bin", copy);
    fd = open(file, O_RDWR);
    ASSERT_EQ(pwrite(fd, "\x7f", 1, 4), 1);
    close(fd);
    snprintf(dst, sizeof dst, "%s/golden-thirds", tmp());
    tt_run_job(&job_,
               (const char *const[]){CTCKPT_PATH, "convert", copy, dst, "--shards", "3",
                                     "--drop-per-rank", NULL},
               (const char *const[]){NULL}, DEADLINE);
    TT_ASSERT_JOB(&job_, tt_job_exit_code(&job_) == 2 && strstr(job_.err, "data-00000.bin") &&
                             strstr(job_.err, "checksum"));
}

/* A FIFO in place of the manifest or a data file: info refuses it at once
 * instead of waiting for a writer forever. */
TEST(info_refuses_a_fifo_in_place_of_a_file_without_hanging) {
    char copy[400], file[600];
    snprintf(copy, sizeof copy, "%s/fifo", tmp());
    sh("cp -r '%s' '%s'", golden(), copy);
    snprintf(file, sizeof file, "%s/data-00001.bin", copy);
    ASSERT_EQ(unlink(file), 0);
    ASSERT_EQ(mkfifo(file, 0644), 0);
    ASSERT_EQ(ctckpt("info", copy, NULL, NULL, NULL), 2);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "data-00001.bin") && strstr(job_.err, "a FIFO"));
    printf("  info with a FIFO for a data file: exit 2 in %.3f s\n", job_.seconds);
    snprintf(file, sizeof file, "%s/manifest.json", copy);
    ASSERT_EQ(unlink(file), 0);
    ASSERT_EQ(mkfifo(file, 0644), 0);
    ASSERT_EQ(ctckpt("info", copy, NULL, NULL, NULL), 2);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "manifest.json") && strstr(job_.err, "a FIFO"));
}

/* ------------------------------------------------------------ fmnist_mlp */

static bool have_data(void) {
    return FMNIST_PATH[0] &&
           access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) == 0;
}

/* fmnist_mlp on np ranks (0: without ctlaunch), checkpoints in dir, with
 * the flags of extra (NULL-terminated). */
static bool fmnist_with(int np, const char *dir, const char *const *extra) {
    char npstr[8];
    snprintf(npstr, sizeof npstr, "%d", np);
    const char *args[32];
    int n = 0;
    if (np) {
        args[n++] = CTLAUNCH_PATH;
        args[n++] = "-np";
        args[n++] = npstr;
    }
    const char *rest[] = {FMNIST_PATH, "--threads",        "1", "--metrics",
                          "/dev/null", "--checkpoint-dir", dir};
    for (size_t i = 0; i < sizeof rest / sizeof *rest; i++)
        args[n++] = rest[i];
    for (int i = 0; extra[i] && n < 31; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    tt_run_job(&job_, args, (const char *const[]){"CT_BACKEND", NULL}, DEADLINE);
    return tt_job_exit_code(&job_) == 0;
}

/* 40 steps of the full run, saving every 15; stop (> 0) stops it early. */
static bool fmnist(int np, const char *dir, const char *stop) {
    return fmnist_with(np, dir,
                       (const char *const[]){"--max-steps", "40", "--save-every", "15",
                                             stop ? "--stop-at-step" : NULL, stop, NULL});
}

static void resumes_exactly(int np) {
    if (!have_data()) {
        printf("  no fmnist_mlp, or Fashion-MNIST is not installed (dataset-fashion-mnist): "
               "skipped\n");
        return;
    }
    char straight[400], resumed[400], a[600], b[600];
    snprintf(straight, sizeof straight, "%s/straight-%d", tmp(), np);
    snprintf(resumed, sizeof resumed, "%s/resumed-%d", tmp(), np);
    TT_ASSERT_JOB(&job_, fmnist(np, straight, NULL));
    TT_ASSERT_JOB(&job_, fmnist(np, resumed, "20"));
    TT_ASSERT_JOB(&job_, strstr(job_.out, "stopped at step 20"));
    TT_ASSERT_JOB(&job_, fmnist(np, resumed, NULL));
    TT_ASSERT_JOB(&job_, strstr(job_.out, "resumed from") && strstr(job_.out, "at step 20"));
    snprintf(a, sizeof a, "%s/step-00000040", straight);
    snprintf(b, sizeof b, "%s/step-00000040", resumed);
    ASSERT_EQ(ctckpt("diff", a, b, NULL, NULL), 0);
    printf("  %s\n", job_.out);
}

/* fmnist_mlp's ZeRO stages against plain data parallel on np ranks with the
 * global batch batch: 200 steps of SGD with momentum under each --shard,
 * whose final checkpoints (the parameters and the momentum, saved as each
 * stage holds them: whole, or as each rank's blocks) hold the same state
 * as DDP's, bit for bit. */
static void stages_end_where_ddp_does(int np, const char *batch) {
    char ddp[400], dir[400], a[600], b[600];
    snprintf(ddp, sizeof ddp, "%s/stage0-%d", tmp(), np);
    TT_ASSERT_JOB(
        &job_,
        fmnist_with(np, ddp, (const char *const[]){"--max-steps", "200", "--batch", batch, NULL}));
    snprintf(a, sizeof a, "%s/step-00000200", ddp);
    for (int stage = 1; stage <= 3; stage++) {
        char s[2] = {(char)('0' + stage), 0};
        snprintf(dir, sizeof dir, "%s/stage%d-%d", tmp(), stage, np);
        TT_ASSERT_JOB(&job_, fmnist_with(np, dir,
                                         (const char *const[]){"--max-steps", "200", "--batch",
                                                               batch, "--shard", s, NULL}));
        snprintf(b, sizeof b, "%s/step-00000200", dir);
        ASSERT_EQ(ctckpt("diff", a, b, NULL, NULL), 0);
        printf("  %d ranks, --shard %d: %s", np, stage, job_.out);
    }
}

TEST(every_shard_stage_of_fmnist_mlp_ends_where_ddp_does_on_2_3_and_4_ranks) {
    if (!have_data()) {
        printf("  no fmnist_mlp, or Fashion-MNIST is not installed (dataset-fashion-mnist): "
               "skipped\n");
        return;
    }
    stages_end_where_ddp_does(2, "64");
    stages_end_where_ddp_does(3, "48");
    stages_end_where_ddp_does(4, "64");
}

TEST(fmnist_mlp_stopped_and_resumed_ends_where_an_unbroken_run_does) { resumes_exactly(0); }
TEST(fmnist_mlp_on_2_ranks_stopped_and_resumed_ends_where_an_unbroken_run_does) {
    resumes_exactly(2);
}
