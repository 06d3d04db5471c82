/* The file-system steps a crash-safe commit is made of. */
#include "checkpoint_impl.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int remove_one(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

int ct__ckpt_remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : ct__err_set(CT_EIO, "%s: %s", path, strerror(errno));
    /* FTW_PHYS: a symlink inside is removed, never followed. */
    if (nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return ct__err_set(CT_EIO, "%s: removing: %s", path, strerror(errno));
    return 0;
}

int ct__ckpt_make_dirs(const char *path) {
    char *p = strdup(path);
    if (!p)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", path);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        bool end = *s == '\0';
        if (*s != '/' && !end)
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            rc = ct__err_set(CT_EIO, "%s: creating the directory: %s", p, strerror(errno));
            break;
        }
        if (end)
            break;
        *s = '/';
    }
    struct stat sb;
    if (!rc && (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        rc = ct__err_set(CT_EIO, "%s: exists and is not a directory", path);
    free(p);
    return rc;
}

int ct__ckpt_open_regular(int dirfd, const char *name, const char *shown, bool *missing) {
    static const ct__file_rules rules = {
        .refuse = CT_ECORRUPT,
        .link_why = "; a checkpoint's files must be regular files in its directory",
        .kind_why = "; a checkpoint holds only regular files",
    };
    return ct__file_open(dirfd, name, shown, &rules, NULL, missing);
}
