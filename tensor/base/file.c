/* The file steps ct's file formats share (tensor/base/file_impl.h). */
#include "file_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CT__WRITER_STAGE ((size_t)1 << 20)

const char *ct__file_kind(mode_t mode) {
    return S_ISFIFO(mode)   ? "a FIFO"
           : S_ISDIR(mode)  ? "a directory"
           : S_ISSOCK(mode) ? "a socket"
                            : "a device";
}

int ct__file_open(int dirfd, const char *name, const char *shown, const ct__file_rules *rules,
                  int64_t *size, bool *missing) {
    if (missing)
        *missing = false;
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer. */
    int fd =
        openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC | (rules->follow ? 0 : O_NOFOLLOW));
    if (fd < 0) {
        if (missing)
            *missing = errno == ENOENT;
        if (errno == ELOOP && !rules->follow)
            return ct__err_set(rules->refuse, "%s: a symbolic link%s", shown,
                               rules->link_why ? rules->link_why : "");
        return ct__err_set(CT_EIO, "%s: cannot open: %s", shown, strerror(errno));
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = ct__err_set(CT_EIO, "%s: cannot stat: %s", shown, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = ct__err_set(rules->refuse, "%s: not a regular file (%s)%s", shown,
                         ct__file_kind(st.st_mode), rules->kind_why ? rules->kind_why : "");
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = ct__err_set(CT_EIO, "%s: %s", shown, strerror(errno));
    if (rc) {
        close(fd);
        return rc;
    }
    if (size)
        *size = (int64_t)st.st_size;
    return fd;
}

int ct__file_pwrite_all(int fd, const void *buf, size_t len, int64_t off, const char *shown) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return ct__err_set(CT_EIO, "%s: writing %zu bytes at %lld: %s", shown, len,
                               (long long)off, n < 0 ? strerror(errno) : "wrote nothing");
        p += n;
        len -= (size_t)n;
        off += n;
    }
    return 0;
}

int ct__file_pread_all(int fd, void *buf, size_t len, int64_t off, const char *shown) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ct__err_set(CT_EIO, "%s: reading %zu bytes at %lld: %s", shown, len,
                               (long long)off, strerror(errno));
        if (n == 0)
            return ct__err_set(CT_ECORRUPT, "%s: the file ends at byte %lld, before %zu more bytes",
                               shown, (long long)off, len);
        p += n;
        len -= (size_t)n;
        off += n;
    }
    return 0;
}

int ct__file_fsync_dir_at(int dirfd, const char *path) {
    int fd = openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ct__err_set(CT_EIO, "%s: opening the directory to fsync it: %s", path,
                           strerror(errno));
    int rc = 0;
    /* Some file systems cannot fsync a directory (EINVAL): there is nothing
     * more to do there. */
    if (fsync(fd) != 0 && errno != EINVAL)
        rc = ct__err_set(CT_EIO, "%s: fsync: %s", path, strerror(errno));
    close(fd);
    return rc;
}

int ct__file_fsync_dir(const char *path) { return ct__file_fsync_dir_at(AT_FDCWD, path); }

char *ct__file_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    while (slash && slash > path && slash[1] == '\0') /* "dir/" */
        slash = memrchr(path, '/', (size_t)(slash - path));
    char *out = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!out)
        ct__err_set(CT_ENOMEM, "%s: out of memory", path);
    return out;
}

int ct__file_commit(int dirfd, int fd, const char *tmp, const char *dst, int rc,
                    const char *shown) {
    if (rc == 0 && fsync(fd) != 0)
        rc = ct__err_set(CT_EIO, "%s: cannot sync %s: %s", shown, tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = ct__err_set(CT_EIO, "%s: cannot close %s: %s", shown, tmp, strerror(errno));
    if (rc == 0 && renameat(dirfd, tmp, dirfd, dst) != 0)
        rc =
            ct__err_set(CT_EIO, "%s: cannot rename %s to %s: %s", shown, tmp, dst, strerror(errno));
    if (rc) {
        unlinkat(dirfd, tmp, 0);
        return rc;
    }
    char *dir = ct__file_parent_dir(dst);
    rc = dir ? ct__file_fsync_dir_at(dirfd, dir) : ct_errcode();
    free(dir);
    return rc ? ct__err_set(rc, "%s: %s", shown, ct_errmsg()) : 0;
}

static int write_at(ct__writer *w, const void *p, size_t n) {
    int rc = ct__file_pwrite_all(w->fd, p, n, w->off, w->shown);
    w->off += (int64_t)n;
    return rc;
}

int ct__file_writer_flush(ct__writer *w) {
    int rc = write_at(w, w->stage, w->used);
    w->used = 0;
    return rc;
}

int ct__file_writer_put(void *ctx, const void *p, size_t n) {
    ct__writer *w = ctx;
    if (w->used + n > CT__WRITER_STAGE) {
        int rc = ct__file_writer_flush(w);
        if (rc)
            return rc;
    }
    if (n >= CT__WRITER_STAGE)
        return write_at(w, p, n);
    if (!w->stage && !(w->stage = malloc(CT__WRITER_STAGE)))
        return ct__err_set(CT_ENOMEM, "%s: out of memory for a write buffer", w->shown);
    memcpy(w->stage + w->used, p, n);
    w->used += n;
    return 0;
}

void ct__file_writer_free(ct__writer *w) {
    free(w->stage);
    w->stage = NULL;
}
