/* ct/npy.h: NumPy .npy arrays, read and written.
 *
 * An .npy file holds one array: the magic "\x93NUMPY", a version, a
 * Python dict literal saying the element type ('descr'), the memory order
 * ('fortran_order') and the shape, then the elements. The format is NumPy's
 * NEP 1 ("A simple file format for NumPy arrays") and the numpy.lib.format
 * reference; docs/npy.md says what this reader accepts.
 *
 * Example:
 *
 *     #include <ct/npy.h>
 *     #include <stdio.h>
 *
 *     int main(void) {
 *         ct_scope_begin();
 *         ct_tensor *w = ct_view(ct_arange(0, 6, 1, CT_FLOAT32), CT_SHAPE(2, 3));
 *         // A transposed view: np.load("w.npy") gives its [3, 2] values.
 *         int rc = ct_npy_save("w.npy", ct_transpose(w, 0, 1));
 *         ct_tensor *back = rc == 0 ? ct_npy_load("w.npy", NULL) : NULL;
 *         bool ok = back != NULL;
 *         if (ok)
 *             ct_print(back);
 *         else
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         ct_scope_end(); // frees w, back and the temporaries
 *         return ok ? 0 : 1;
 *     }
 *
 * Element types. numpy's '<f8' '<f4' '<f2' '<i8' '<i4' '|u1' '|b1' (and
 * their big-endian '>' forms, byte-swapped on load) map to float64,
 * float32, float16, int64, int32, uint8 and bool. The other numeric types
 * (int8, int16, the unsigned types but uint8, complex, long double) have no
 * ct dtype and are refused with CT_ENOTSUP, as are strings, datetimes,
 * structured dtypes and Python objects ('|O': ct never unpickles). numpy
 * has no bfloat16: ct_npy_save refuses a bfloat16 tensor (widen it with
 * ct_to_dtype(t, CT_FLOAT32), which is exact), and ct_npy_load reads the
 * 2-byte void type ml_dtypes saves its bfloat16 as ('<V2', '|V2') only when
 * asked to (bfloat16_from_v2).
 *
 * Ownership. A loaded tensor follows ct's rule: inside a scope the scope
 * owns it, outside one the caller does. A memory-mapped tensor's storage
 * holds the mapping and unmaps it when its last view goes.
 *
 * Threads. Every function here is thread-safe. Saving reads the tensor; do
 * not write to it from another thread meanwhile.
 */
#ifndef CT_NPY_H
#define CT_NPY_H

#include <ct/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The longest header (the dict and its padding) a file may have, in bytes:
 * numpy's own default limit when it reads (max_header_size). */
#define CT_NPY_MAX_HEADER 10000
/* CT_NPY_MMAP_AUTO maps the data of files that hold at least this many
 * bytes of it; smaller ones are read, which costs less than a mapping. */
#define CT_NPY_MMAP_MIN_BYTES ((int64_t)1 << 20)

/* Whether a load maps the file's data into memory instead of reading it.
 * A mapping is private and writable: in-place ops on the tensor change
 * memory only, never the file, and pages are read from the file as they are
 * first touched. It needs data in ct's byte order (little-endian) at an
 * offset that is a multiple of the element size (numpy aligns it to 64).
 * While a tensor maps a file, the file must not shrink: touching a page
 * past its new end raises SIGBUS, as with any mapped file; pages not yet
 * touched or written show later writes to the file by others. */
typedef enum ct_npy_mmap {
    CT_NPY_MMAP_AUTO = 0, /* map when the data can be mapped and holds at least
                             CT_NPY_MMAP_MIN_BYTES; otherwise read */
    CT_NPY_MMAP_NEVER,    /* always read into memory ct allocates */
    CT_NPY_MMAP_ALWAYS,   /* map, or fail with CT_ENOTSUP where the data
                             cannot be (big-endian, misaligned) */
} ct_npy_mmap;

/* Options for ct_npy_load(); a zeroed struct (or NULL) gives the
 * defaults. */
typedef struct ct_npy_options {
    ct_npy_mmap mmap;
    /* A Fortran-order file loads as a view with column-major strides
     * (ct_is_contiguous() false; same values, no copy). true: as a new
     * row-major tensor instead. */
    bool contiguous;
    /* Read the void type '<V2' / '|V2' as bfloat16: how ml_dtypes (and
     * JAX) save bfloat16 arrays. Off, such a file is refused, since V2 can
     * hold any 2-byte record. */
    bool bfloat16_from_v2;
    /* Open a path whose last component is a symbolic link. Off, it is
     * refused (O_NOFOLLOW). */
    bool follow_symlinks;
} ct_npy_options;

/* Reads the .npy file at path (versions 1.0, 2.0 and 3.0). Returns a new
 * CPU tensor with the file's shape and values (scope-owned inside a scope),
 * memory-mapped as opts->mmap says; a 0-d file gives a 0-d tensor.
 * Errors, every message naming the path:
 *   CT_EINVAL   NULL path;
 *   CT_EIO      the file cannot be opened or read (the system's reason is
 *               kept), is a symbolic link (unless follow_symlinks), or is
 *               not a regular file (a FIFO, a directory, a device);
 *   CT_EVERSION a version other than 1.0, 2.0 and 3.0;
 *   CT_ECORRUPT a bad magic, a header longer than CT_NPY_MAX_HEADER or past
 *               the end of the file, a header that is not the dict the
 *               format defines (the message says where and what: missing,
 *               unknown or repeated keys, a negative or overflowing size, a
 *               shape that is not a tuple, padding that is not spaces and a
 *               newline), data shorter or longer than the shape needs, a
 *               bool byte other than 0 and 1;
 *   CT_ENOTSUP  a descr with no ct dtype (named in the message), more than
 *               CT_MAX_DIMS dims, CT_NPY_MMAP_ALWAYS for data that cannot be
 *               mapped;
 *   CT_ENOMEM   out of memory.
 * Thread-safe. */
CT_API ct_tensor *ct_npy_load(const char *path, const ct_npy_options *opts);
/* The same for name relative to the directory open at dirfd (AT_FDCWD: the
 * working directory), as openat() resolves it. */
CT_API ct_tensor *ct_npy_load_at(int dirfd, const char *name, const ct_npy_options *opts);

/* Writes t to path as version 1.0 (2.0 if the header should ever need
 * more than 65535 bytes), little-endian, C order, whatever t's strides: a
 * view is written with its own values and shape. A CUDA tensor is copied to
 * the host first. The file appears whole or not at all: the data goes to a
 * new file beside path, which is synced and renamed over path (replacing a
 * symbolic link at path, not its target), and the directory is synced.
 * Errors: CT_EINVAL for a NULL or empty path, a path ending in '/', or a
 * NULL or freed tensor; CT_ENOTSUP for bfloat16 (see above); CT_EIO when a
 * file cannot be created, written, synced or renamed (the system's reason
 * is kept), and then path is left as it was; CT_ENOMEM; ct_to's errors for
 * a device tensor. Thread-safe; saves of one path from several threads
 * leave one of the tensors there, whole. */
CT_API int ct_npy_save(const char *path, const ct_tensor *t);
/* The same for name relative to the directory open at dirfd. */
CT_API int ct_npy_save_at(int dirfd, const char *name, const ct_tensor *t);

#ifdef __cplusplus
}
#endif

#endif /* CT_NPY_H */
