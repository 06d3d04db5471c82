/* The file-system steps a crash-safe commit is made of. */
#include "checkpoint_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int ct__fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ct__seterr(CT_EIO, "%s: opening the directory to fsync it: %s", path,
                          strerror(errno));
    int rc = 0;
    /* Some file systems cannot fsync a directory (EINVAL): there is nothing
     * more to do there. */
    if (fsync(fd) != 0 && errno != EINVAL)
        rc = ct__seterr(CT_EIO, "%s: fsync: %s", path, strerror(errno));
    close(fd);
    return rc;
}

static int remove_one(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

int ct__remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : ct__seterr(CT_EIO, "%s: %s", path, strerror(errno));
    /* FTW_PHYS: a symlink inside is removed, never followed. */
    if (nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return ct__seterr(CT_EIO, "%s: removing: %s", path, strerror(errno));
    return 0;
}

int ct__make_dirs(const char *path) {
    char *p = strdup(path);
    if (!p)
        return ct__seterr(CT_ENOMEM, "%s: out of memory", path);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        bool end = *s == '\0';
        if (*s != '/' && !end)
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            rc = ct__seterr(CT_EIO, "%s: creating the directory: %s", p, strerror(errno));
            break;
        }
        if (end)
            break;
        *s = '/';
    }
    struct stat sb;
    if (!rc && (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        rc = ct__seterr(CT_EIO, "%s: exists and is not a directory", path);
    free(p);
    return rc;
}

char *ct__parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    while (slash && slash > path && slash[1] == '\0') /* "dir/" */
        slash = memrchr(path, '/', (size_t)(slash - path));
    char *out = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!out)
        ct__seterr(CT_ENOMEM, "%s: out of memory", path);
    return out;
}

int ct__pwrite_all(int fd, const void *buf, size_t len, int64_t off, const char *path) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return ct__seterr(CT_EIO, "%s: writing %zu bytes at %lld: %s", path, len,
                              (long long)off, n < 0 ? strerror(errno) : "wrote nothing");
        p += n;
        len -= (size_t)n;
        off += n;
    }
    return 0;
}

int ct__pread_all(int fd, void *buf, size_t len, int64_t off, const char *path) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ct__seterr(CT_EIO, "%s: reading %zu bytes at %lld: %s", path, len,
                              (long long)off, strerror(errno));
        if (n == 0)
            return ct__seterr(CT_ECORRUPT, "%s: the file ends at byte %lld, before %zu more bytes",
                              path, (long long)off, len);
        p += n;
        len -= (size_t)n;
        off += n;
    }
    return 0;
}

int ct__open_regular(int dirfd, const char *name, const char *shown, bool *missing) {
    *missing = false;
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer. */
    int fd = openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        *missing = errno == ENOENT;
        if (errno == ELOOP)
            return ct__seterr(CT_ECORRUPT,
                              "%s: a symbolic link; a checkpoint's files must be regular files in "
                              "its directory",
                              shown);
        return ct__seterr(*missing ? CT_ECORRUPT : CT_EIO, "%s: %s", shown, strerror(errno));
    }
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) != 0)
        rc = ct__seterr(CT_EIO, "%s: %s", shown, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        rc = ct__seterr(CT_ECORRUPT,
                        "%s: not a regular file (%s); a checkpoint holds only regular "
                        "files",
                        shown,
                        S_ISFIFO(sb.st_mode)   ? "a FIFO"
                        : S_ISDIR(sb.st_mode)  ? "a directory"
                        : S_ISSOCK(sb.st_mode) ? "a socket"
                                               : "a device");
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = ct__seterr(CT_EIO, "%s: %s", shown, strerror(errno));
    if (rc) {
        close(fd);
        return rc;
    }
    return fd;
}
