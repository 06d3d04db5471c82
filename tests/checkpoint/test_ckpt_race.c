/* Two savers in one directory, at the moment that matters. A save that
 * replaces a checkpoint swaps the new one into place (renameat2), which
 * leaves the old one under "PATH.tmp" for the saver to remove. If another
 * saver starts then, its removal of stale tmps must leave that directory
 * to its owner: removing it beside the owner made the two removals collide
 * ("removing: Directory not empty", seen once in CI), and once the owner
 * starts its next save under the same name it would delete that save's
 * files. renameat2 is wrapped at link time (-Wl,--wrap) so that the other
 * save runs right after the swap, in this process. */
#include "ct_test.h"

#include <ct/checkpoint.h>

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

int __real_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
                     unsigned flags);
int __wrap_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
                     unsigned flags);

static ct_state *state;
static const char *other; /* the other saver's path, while one is wanted */
static int other_rc = -1;
static bool spared;

static int save(const char *path) {
    ct_checkpoint_options o = ct_checkpoint_defaults();
    o.step = 1;
    return ct_checkpoint_save(path, state, NULL, &o);
}

int __wrap_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
                     unsigned flags) {
    int rc = __real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
    if (rc == 0 && other) {
        const char *path = other;
        other = NULL;
        other_rc = save(path);
        struct stat sb;
        spared = stat(oldpath, &sb) == 0; /* oldpath: the tmp holding the replaced checkpoint */
    }
    return rc;
}

TEST(a_save_spares_the_checkpoint_another_save_just_replaced) {
    char a[256], b[256], a_tmp[300];
    tt_tmp_path(a, "a");
    tt_tmp_path(b, "b");
    snprintf(a_tmp, sizeof a_tmp, "%s.tmp", a);
    state = ct_state_new();
    ASSERT_EQ(
        ct_state_add_tensor(state, "w", ct_arange(0, 1000, 1, CT_FLOAT32), CT_STATE_REPLICATED), 0);
    ASSERT_EQ(save(a), 0);
    other = b;
    ASSERT_EQ(save(a), 0); /* replaces a: the other save runs right after the swap */
    ASSERT_TRUE(other == NULL);
    ASSERT_EQ(other_rc, 0);
    ASSERT_TRUE(spared);
    struct stat sb;
    ASSERT_TRUE(stat(a_tmp, &sb) != 0); /* and its owner removed it */
    ASSERT_EQ(ct_checkpoint_load(a, state, NULL), 0);
    ASSERT_EQ(ct_checkpoint_load(b, state, NULL), 0);
    ct_state_free(state);
}
