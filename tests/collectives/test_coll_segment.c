/* The shm backend's segment in /dev/shm: attach refuses one it cannot
 * trust (another size, group or world access, another owner), and a rank 0
 * killed by SIGTERM before every rank attached leaves nothing behind. */
#include "ct_test.h"

#include <ct/collectives.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void segment_name(char *name, size_t cap, const char *what) {
    snprintf(name, cap, "/ct-test-seg-%s-%ld", what, (long)getpid());
}

static bool segment_exists(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* Entries of /dev/shm that belong to the segment name: it and the blocks
 * named after it (name.bN.R). Only these: the tests that run beside this
 * one under ctest -j make and remove segments of their own. */
static int count_segments_of(const char *name) {
    DIR *d = opendir("/dev/shm");
    int n = 0;
    size_t len = strlen(name + 1);
    for (struct dirent *e; d && (e = readdir(d));)
        n += strncmp(e->d_name, name + 1, len) == 0;
    if (d)
        closedir(d);
    return n;
}

static void sleep_ms(int ms) { nanosleep(&(struct timespec){0, ms * 1000000L}, NULL); }

static ct_comm *join_as_rank_1(const char *name) {
    return ct_comm_new(&(ct_comm_config){
        .backend = CT_BACKEND_SHM, .rank = 1, .size = 2, .timeout_s = 2, .shm_name = name});
}

/* A segment of name made by someone else, size bytes, mode mode. */
static bool plant(const char *name, off_t size, mode_t mode) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        tt_fail(__FILE__, __LINE__, "planting %s: %s", name, strerror(errno));
        return false;
    }
    bool ok = ftruncate(fd, size) == 0 && fchmod(fd, mode) == 0;
    close(fd);
    return ok;
}

TEST(a_segment_of_another_size_is_refused) {
    char name[64];
    segment_name(name, sizeof name, "size");
    ASSERT_TRUE(plant(name, 12345, 0600));
    ct_comm *c = join_as_rank_1(name);
    shm_unlink(name);
    ASSERT_TRUE(c == NULL);
    ASSERT_EQ(ct_errcode(), CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "has 12345 bytes");
}

TEST(a_segment_others_can_reach_is_refused) {
    char name[64];
    segment_name(name, sizeof name, "mode");
    ASSERT_TRUE(plant(name, 4096, 0644));
    ct_comm *c = join_as_rank_1(name);
    shm_unlink(name);
    ASSERT_TRUE(c == NULL);
    ASSERT_EQ(ct_errcode(), CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "mode 644");
}

TEST(a_segment_of_another_user_is_refused) {
    if (geteuid() != 0) {
        printf("  (not root: no other user's segment can be planted; skipped)\n");
        return;
    }
    char name[64], path[512];
    segment_name(name, sizeof name, "owner");
    ASSERT_TRUE(plant(name, 4096, 0600));
    snprintf(path, sizeof path, "/dev/shm%s", name);
    ASSERT_EQ(chown(path, 4242, 4242), 0);
    ct_comm *c = join_as_rank_1(name);
    shm_unlink(name);
    ASSERT_TRUE(c == NULL);
    ASSERT_EQ(ct_errcode(), CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "belongs to uid 4242");
}

/* Rank 0 waits for a rank 1 that never comes; SIGTERM (no handler) kills
 * it there, between the segment's creation and the last attach. */
TEST(rank_0_sigtermed_before_the_last_attach_leaves_nothing_in_dev_shm) {
    char name[64];
    segment_name(name, sizeof name, "term");
    pid_t pid = fork();
    if (pid == 0) {
        ct_comm *c = ct_comm_new(&(ct_comm_config){
            .backend = CT_BACKEND_SHM, .rank = 0, .size = 2, .timeout_s = 20, .shm_name = name});
        _exit(c ? 0 : 1);
    }
    ASSERT_TRUE(pid > 0);
    double t0 = tt_now();
    while (!segment_exists(name) && tt_now() - t0 < 10)
        sleep_ms(2);
    bool created = segment_exists(name);
    sleep_ms(50); /* well inside the wait for rank 1 */
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(created);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
    t0 = tt_now();
    while (segment_exists(name) && tt_now() - t0 < 5)
        sleep_ms(2);
    bool left = segment_exists(name);
    if (left)
        shm_unlink(name);
    ASSERT_TRUE(!left);
    ASSERT_EQ(count_segments_of(name), 0);
}
