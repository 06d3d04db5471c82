/* ct file internal header: not installed, not part of the API. Part of the
 * base layer (base_impl.h), on every module's include path. */
#ifndef CT_FILE_IMPL_H
#define CT_FILE_IMPL_H

/* The file steps every reader and writer of ct's formats shares (.npy,
 * llm.c's files, safetensors, checkpoints): opening only regular files,
 * full reads and writes, and the temp-file-and-rename commit. Each sets
 * ct's error message, naming the file by the caller's "shown" text; a
 * caller that wants its own prefix wraps ct_errmsg(). Thread-safe: they
 * share no state. */

#include "base_impl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* What ct__file_open refuses besides a name that cannot be opened, and how
 * it says so. */
typedef struct ct__file_rules {
    int refuse;           /* the code for a symbolic link or a file that is not regular */
    bool follow;          /* follow a symbolic link at name instead of refusing it */
    const char *link_why; /* follows "a symbolic link" in the message, or NULL */
    const char *kind_why; /* follows "not a regular file (a FIFO)", or NULL */
} ct__file_rules;

/* Opens name (relative to dirfd, or AT_FDCWD) for reading: a regular file
 * only, and without blocking on a FIFO or a device. Returns the fd, or
 * rules->refuse for a symbolic link (unless rules->follow) or a file that is
 * not regular, CT_EIO otherwise (*missing, when not NULL, says whether the
 * name does not exist). *size, when not NULL, gets the file's length. */
int ct__file_open(int dirfd, const char *name, const char *shown, const ct__file_rules *rules,
                  int64_t *size, bool *missing);

/* "a FIFO", "a directory", "a socket" or "a device": what a file that is
 * not regular is, for a message. */
const char *ct__file_kind(mode_t mode);

/* Writes len bytes at off in full, or CT_EIO naming shown. */
int ct__file_pwrite_all(int fd, const void *buf, size_t len, int64_t off, const char *shown);
/* Reads len bytes at off in full; CT_ECORRUPT naming shown when the file
 * ends first, CT_EIO for an I/O error. */
int ct__file_pread_all(int fd, void *buf, size_t len, int64_t off, const char *shown);

/* fsync on the directory path (relative to dirfd, or AT_FDCWD), so that a
 * rename into it lasts; fine where the file system cannot fsync one. */
int ct__file_fsync_dir_at(int dirfd, const char *path);
int ct__file_fsync_dir(const char *path);
/* The parent directory of path (malloc'd: "." for a bare name). */
char *ct__file_parent_dir(const char *path);

/* Ends the write of a file into tmp that is to replace dst (both relative to
 * dirfd, or AT_FDCWD): given rc, the write's outcome so far, it fsyncs and
 * closes fd, renames tmp over dst and fsyncs their directory, or removes
 * tmp when any step (or the write) failed. Messages begin with shown. */
int ct__file_commit(int dirfd, int fd, const char *tmp, const char *dst, int rc, const char *shown);

/* Writes a file in order, gathering small pieces (a view's runs) into a
 * 1 MiB stage so that each write is large. Zero-initialise it with shown
 * (names it in messages), fd and off (the file offset of the first byte);
 * ct__file_writer_free releases the stage. */
typedef struct ct__writer {
    const char *shown;
    int fd;
    int64_t off; /* where the next write goes */
    char *stage; /* 1 MiB, allocated on first use */
    size_t used;
} ct__writer;

/* Writes n bytes at w->off onwards; ctx is the ct__writer (a ct__run_fn). */
int ct__file_writer_put(void *ctx, const void *p, size_t n);
/* Writes out what the stage holds. */
int ct__file_writer_flush(ct__writer *w);
void ct__file_writer_free(ct__writer *w);

#endif
