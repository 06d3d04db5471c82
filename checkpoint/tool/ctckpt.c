/* ctckpt: looks into, checks, compares and converts ct checkpoints.
 *
 *   ctckpt info DIR|FILE.safetensors [-v]
 *   ctckpt verify DIR|FILE.safetensors
 *   ctckpt diff A B
 *   ctckpt convert SRC DST [--shards N] [--drop-per-rank]
 *
 * Exit codes: 0 success (diff: no difference), 1 a failed check or a
 * difference, 2 bad usage or an error. */
#include <ct/checkpoint.h>
#include <ct/cli.h>

#include "base_impl.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: ctckpt info DIR [-v]        tensors, shapes, dtypes, shards, values, format\n"
    "       ctckpt CMD --help           a command's flags\n"
    "       ctckpt verify DIR           check every checksum and bound\n"
    "       ctckpt info|verify FILE     a .safetensors file: its tensors and metadata;\n"
    "                                   verify checks the format's rules (it has no\n"
    "                                   checksums)\n"
    "       ctckpt diff A B             compare two checkpoints tensor by tensor\n"
    "       ctckpt convert SRC DST [--shards N] [--drop-per-rank]\n"
    "           SRC a checkpoint, DST ending in .safetensors: export the tensors\n"
    "           SRC a .safetensors file: import it as a checkpoint of one rank\n"
    "           --shards N: rewrite SRC as if N ranks had saved it, each tensor\n"
    "           split by rows; per-rank entries need N equal to SRC's world\n"
    "           size, or --drop-per-rank to leave them out (they are listed)\n"
    "Exit codes: 0 success (diff: equal), 1 a check failed (diff: they differ),\n"
    "2 bad usage or an error.\n";

static int fail(const char *what) {
    fprintf(stderr, "ctckpt: %s: %s\n", what, ct_errmsg());
    return 2;
}

static void print_shape(FILE *f, int ndim, const int64_t *sizes) {
    fputc('[', f);
    for (int d = 0; d < ndim; d++)
        fprintf(f, "%s%" PRId64, d ? ", " : "", sizes[d]);
    fputc(']', f);
}

/* ----------------------------------------------------------------- info */

/* A regular file is taken for a safetensors file, as convert takes it: a ct
 * checkpoint is a directory. */
static bool is_regular_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* info (check false) or verify (check true) of a safetensors file. Loading
 * it applies every rule of the format (ct_safetensors_load); the format has
 * no checksums to verify beyond that. */
static int safetensors_info(const char *path, bool check) {
    ct_tensor_dict *d;
    if (ct_safetensors_load(path, &d)) {
        fprintf(stderr, "ctckpt: %s: %s\n", check ? "verify" : "info", ct_errmsg());
        return check ? 1 : 2;
    }
    int n = ct_tensor_dict_count(d);
    if (!check)
        printf("%s: safetensors file, %d tensor(s)\n\n%-40s %-9s %s\n", path, n, "tensor", "dtype",
               "shape");
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        const ct_tensor *t = ct_tensor_dict_tensor(d, i);
        bytes += ct_numel(t) * (int64_t)ct_dtype_size(ct_tensor_dtype(t));
        if (check)
            continue;
        printf("%-40s %-9s ", ct_tensor_dict_name(d, i), ct_dtype_name(ct_tensor_dtype(t)));
        print_shape(stdout, ct_ndim(t), ct_sizes(t));
        putchar('\n');
    }
    if (check) {
        printf("ok: %d tensors, %" PRId64 " bytes, the safetensors format's rules hold\n", n,
               bytes);
    } else {
        printf("\n%" PRId64 " bytes of tensor data\n", bytes);
        for (int i = 0; i < ct_tensor_dict_num_meta(d); i++) {
            const char *key, *value;
            ct_tensor_dict_meta_at(d, i, &key, &value);
            printf("%s%s = %s\n", i ? "" : "\nmetadata:\n", key, value);
        }
    }
    ct_tensor_dict_free(d);
    return 0;
}

static int info(const char *path, bool verbose) {
    if (is_regular_file(path))
        return safetensors_info(path, false);
    ct_checkpoint_reader *ck;
    if (ct_checkpoint_reader_open(path, &ck))
        return fail("info");
    int major, minor;
    ct_checkpoint_reader_version(ck, &major, &minor);
    printf("%s: ct checkpoint, format %d.%d, written by %s, %d rank(s)", path, major, minor,
           ct_checkpoint_reader_writer(ck), ct_checkpoint_reader_world_size(ck));
    if (ct_checkpoint_reader_step(ck) >= 0)
        printf(", step %" PRId64, ct_checkpoint_reader_step(ck));
    printf("\n\n%-40s %-9s %-10s %-20s %s\n", "tensor", "dtype", "kind", "shape", "chunks");
    int64_t total = 0;
    for (int i = 0; i < ct_checkpoint_reader_num_tensors(ck); i++) {
        ct_checkpoint_tensor_info t;
        ct_checkpoint_reader_tensor(ck, i, &t);
        char shape[128];
        FILE *mem = fmemopen(shape, sizeof shape, "w");
        print_shape(mem, t.ndim, t.sizes);
        fclose(mem);
        printf("%-40s %-9s %-10s %-20s %d\n", t.name, ct_dtype_name(t.dtype),
               ct_state_kind_name(t.kind), shape, t.nchunks);
        for (int c = 0; c < t.nchunks; c++) {
            ct_checkpoint_chunk_info k;
            ct_checkpoint_reader_chunk(ck, i, c, &k);
            total += k.nbytes;
            if (!verbose)
                continue;
            printf("    rank %d: at ", k.rank);
            print_shape(stdout, t.ndim, k.offsets);
            printf(" sizes ");
            print_shape(stdout, t.ndim, k.sizes);
            printf(" in %s bytes %" PRId64 "..%" PRId64 " xxh3 %016" PRIx64 "\n", k.file,
                   k.byte_offset, k.byte_offset + k.nbytes, k.xxh3);
        }
    }
    int nv = ct_checkpoint_reader_num_values(ck);
    if (nv > 0)
        printf("\n%-40s %-9s %-10s %s\n", "value", "type", "kind", "value(s)");
    for (int i = 0; i < nv; i++) {
        const char *name, *type, *text;
        ct_state_kind kind;
        ct_checkpoint_reader_value(ck, i, 0, &name, &kind, &type, &text);
        printf("%-40s %-9s %-10s %s", name, type, ct_state_kind_name(kind), text ? text : "-");
        int ranks = kind == CT_STATE_PER_RANK ? ct_checkpoint_reader_world_size(ck) : 1;
        for (int r = 1; r < ranks; r++) {
            ct_checkpoint_reader_value(ck, i, r, NULL, NULL, NULL, &text);
            printf(", %s", text ? text : "-");
        }
        printf("\n");
    }
    int nm = ct_checkpoint_reader_num_meta(ck);
    if (nm > 0)
        printf("\nmetadata\n");
    for (int i = 0; i < nm; i++) {
        const char *k, *v;
        ct_checkpoint_reader_meta(ck, i, &k, &v);
        printf("  %s = %s\n", k, v);
    }
    printf("\n%d tensors, %" PRId64 " bytes of data\n", ct_checkpoint_reader_num_tensors(ck),
           total);
    ct_checkpoint_reader_close(ck);
    return 0;
}

/* --------------------------------------------------------------- verify */

typedef struct meter {
    double start, last;
} meter;

/* A progress line on a terminal, at most a few times a second. */
static void progress(int64_t done, int64_t total, void *ctx) {
    meter *m = ctx;
    double t = ct__now();
    if (!isatty(STDERR_FILENO) || (t - m->last < 0.25 && done < total))
        return;
    m->last = t;
    fprintf(stderr, "\rverifying: %.1f%% of %.1f MB, %.0f MB/s", total ? 100.0 * done / total : 100,
            total / 1e6, done / 1e6 / (t - m->start + 1e-9));
    if (done == total)
        fputc('\n', stderr);
}

static int verify(const char *path) {
    if (is_regular_file(path))
        return safetensors_info(path, true);
    ct_checkpoint_reader *ck;
    if (ct_checkpoint_reader_open(path, &ck)) {
        fprintf(stderr, "ctckpt: verify: %s\n", ct_errmsg());
        return 1;
    }
    meter m = {ct__now(), 0};
    int rc = ct_checkpoint_reader_verify(ck, progress, &m);
    int64_t bytes = 0;
    int chunks = 0;
    for (int i = 0; i < ct_checkpoint_reader_num_tensors(ck); i++) {
        ct_checkpoint_tensor_info t;
        ct_checkpoint_reader_tensor(ck, i, &t);
        for (int c = 0; c < t.nchunks; c++, chunks++) {
            ct_checkpoint_chunk_info k;
            ct_checkpoint_reader_chunk(ck, i, c, &k);
            bytes += k.nbytes;
        }
    }
    if (rc)
        fprintf(stderr, "ctckpt: verify: %s\n", ct_errmsg());
    else
        printf("%s: ok: %d tensors, %d chunks, %" PRId64 " bytes checked in %.2f s\n", path,
               ct_checkpoint_reader_num_tensors(ck), chunks, bytes, ct__now() - m.start);
    ct_checkpoint_reader_close(ck);
    return rc ? 1 : 0;
}

/* ----------------------------------------------------------------- diff */

/* Compares two tensors of one dtype and shape; prints and returns whether
 * they differ. */
static bool tensors_differ(const char *what, ct_tensor *a, ct_tensor *b) {
    size_t bytes = (size_t)ct_numel(a) * ct_dtype_size(ct_tensor_dtype(a));
    if (!memcmp(ct_data_ptr(a), ct_data_ptr(b), bytes))
        return false;
    ct_scope_begin();
    ct_tensor *da = ct_to_dtype(a, CT_FLOAT64), *db = ct_to_dtype(b, CT_FLOAT64);
    ct_tensor *ne = ct_sum(ct_to_dtype(ct_ne(da, db), CT_INT64), NULL, 0, false);
    ct_tensor *gap = ct_amax(ct_abs(ct_sub(da, db)), NULL, 0, false);
    if (ne && gap)
        printf("%s: %" PRId64 " of %" PRId64 " elements differ, max |a - b| = %.9g\n", what,
               ct_item_int64(ne), ct_numel(a), ct_item(gap));
    else
        printf("%s: differs (%s)\n", what, ct_errmsg());
    ct_scope_end();
    return true;
}

static int diff_tensor(ct_checkpoint_reader *a, ct_checkpoint_reader *b, int i, bool *differ) {
    ct_checkpoint_tensor_info ta, tb;
    ct_checkpoint_reader_tensor(a, i, &ta);
    int j = ct_checkpoint_reader_find(b, ta.name);
    if (j < 0) {
        printf("tensor '%s': only in A\n", ta.name);
        *differ = true;
        return 0;
    }
    ct_checkpoint_reader_tensor(b, j, &tb);
    bool same_shape =
        ta.ndim == tb.ndim && !memcmp(ta.sizes, tb.sizes, sizeof(int64_t) * (size_t)ta.ndim);
    /* Replicated and sharded both hold one global tensor: only its values
     * count, not how it was split. */
    bool per_rank = ta.kind == CT_STATE_PER_RANK;
    if (ta.dtype != tb.dtype || !same_shape || per_rank != (tb.kind == CT_STATE_PER_RANK)) {
        printf("tensor '%s': %s %s ", ta.name, ct_state_kind_name(ta.kind),
               ct_dtype_name(ta.dtype));
        print_shape(stdout, ta.ndim, ta.sizes);
        printf(" vs %s %s ", ct_state_kind_name(tb.kind), ct_dtype_name(tb.dtype));
        print_shape(stdout, tb.ndim, tb.sizes);
        printf("\n");
        *differ = true;
        return 0;
    }
    int ranks = per_rank ? ct_checkpoint_reader_world_size(a) : 1;
    if (ranks != (per_rank ? ct_checkpoint_reader_world_size(b) : 1)) {
        printf("tensor '%s': per-rank, in worlds of %d and %d ranks\n", ta.name, ranks,
               ct_checkpoint_reader_world_size(b));
        *differ = true;
        return 0;
    }
    for (int r = 0; r < ranks; r++) {
        ct_scope_begin();
        ct_tensor *x = ct_checkpoint_reader_read(a, i, r), *y = ct_checkpoint_reader_read(b, j, r);
        char what[1200];
        snprintf(what, sizeof what, ranks > 1 ? "tensor '%s' of rank %d" : "tensor '%s'", ta.name,
                 r);
        int rc = x && y ? 0 : ct_errcode();
        if (!rc && tensors_differ(what, x, y))
            *differ = true;
        ct_scope_end();
        if (rc)
            return rc;
    }
    return 0;
}

static int diff(const char *pa, const char *pb) {
    ct_checkpoint_reader *a, *b;
    if (ct_checkpoint_reader_open(pa, &a))
        return fail("diff");
    if (ct_checkpoint_reader_open(pb, &b)) {
        ct_checkpoint_reader_close(a);
        return fail("diff");
    }
    bool differ = false;
    int rc = 0;
    for (int i = 0; !rc && i < ct_checkpoint_reader_num_tensors(a); i++)
        rc = diff_tensor(a, b, i, &differ);
    for (int i = 0; !rc && i < ct_checkpoint_reader_num_tensors(b); i++) {
        ct_checkpoint_tensor_info t;
        ct_checkpoint_reader_tensor(b, i, &t);
        if (ct_checkpoint_reader_find(a, t.name) < 0) {
            printf("tensor '%s': only in B\n", t.name);
            differ = true;
        }
    }
    /* Values and metadata, by name, in both directions. */
    for (int side = 0; !rc && side < 2; side++) {
        ct_checkpoint_reader *x = side ? b : a, *y = side ? a : b;
        for (int i = 0; i < ct_checkpoint_reader_num_values(x); i++) {
            const char *name, *tx = NULL, *ty = NULL;
            ct_checkpoint_reader_value(x, i, 0, &name, NULL, NULL, &tx);
            int j = 0;
            const char *other = NULL;
            for (; j < ct_checkpoint_reader_num_values(y); j++) {
                ct_checkpoint_reader_value(y, j, 0, &other, NULL, NULL, &ty);
                if (!strcmp(other, name))
                    break;
            }
            if (j == ct_checkpoint_reader_num_values(y)) {
                printf("value '%s': only in %s\n", name, side ? "B" : "A");
                differ = true;
            } else if (!side && strcmp(tx ? tx : "", ty ? ty : "")) {
                printf("value '%s': %s vs %s\n", name, tx, ty);
                differ = true;
            }
        }
    }
    if (!rc)
        printf(differ ? "%s and %s differ\n" : "%s and %s hold the same state\n", pa, pb);
    ct_checkpoint_reader_close(a);
    ct_checkpoint_reader_close(b);
    return rc ? fail("diff") : differ;
}

/* -------------------------------------------------------------- convert */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static int export_safetensors(const char *src, const char *dst, bool drop_per_rank) {
    ct_checkpoint_reader *ck;
    if (ct_checkpoint_reader_open(src, &ck))
        return fail("convert");
    ct_tensor_dict *d = ct_tensor_dict_new();
    int rc = d ? 0 : ct_errcode();
    ct_scope_begin();
    for (int i = 0; !rc && i < ct_checkpoint_reader_num_tensors(ck); i++) {
        ct_checkpoint_tensor_info t;
        ct_checkpoint_reader_tensor(ck, i, &t);
        if (t.kind == CT_STATE_PER_RANK) {
            fprintf(stderr, "ctckpt: %s per-rank tensor '%s'\n",
                    drop_per_rank ? "leaving out" : "cannot export", t.name);
            rc = drop_per_rank ? 0 : 1;
            continue;
        }
        ct_tensor *x = ct_checkpoint_reader_read(ck, i, 0);
        rc = x ? ct_tensor_dict_add(d, t.name, x) : ct_errcode();
    }
    /* Values travel as metadata, "ct.value.<name>". */
    for (int i = 0; !rc && i < ct_checkpoint_reader_num_values(ck); i++) {
        const char *name, *text;
        ct_state_kind kind;
        ct_checkpoint_reader_value(ck, i, 0, &name, &kind, NULL, &text);
        if (kind == CT_STATE_PER_RANK) {
            fprintf(stderr, "ctckpt: %s per-rank value '%s'\n",
                    drop_per_rank ? "leaving out" : "cannot export", name);
            rc = drop_per_rank ? 0 : 1;
            continue;
        }
        char key[1100];
        snprintf(key, sizeof key, "ct.value.%s", name);
        rc = ct_tensor_dict_set_meta(d, key, text);
    }
    for (int i = 0; !rc && i < ct_checkpoint_reader_num_meta(ck); i++) {
        const char *k, *v;
        ct_checkpoint_reader_meta(ck, i, &k, &v);
        rc = ct_tensor_dict_set_meta(d, k, v);
    }
    if (!rc)
        rc = ct_safetensors_save(dst, d);
    ct_scope_end();
    ct_tensor_dict_free(d);
    ct_checkpoint_reader_close(ck);
    if (rc == 1) {
        fprintf(stderr, "ctckpt: safetensors has no ranks; pass --drop-per-rank to export the "
                        "rest\n");
        return 2;
    }
    return rc ? fail("convert") : 0;
}

static int import_safetensors(const char *src, const char *dst) {
    ct_tensor_dict *d;
    if (ct_safetensors_load(src, &d))
        return fail("convert");
    ct_state *st = ct_state_new();
    int rc = st ? 0 : ct_errcode();
    for (int i = 0; !rc && i < ct_tensor_dict_count(d); i++)
        rc = ct_state_add_tensor(st, ct_tensor_dict_name(d, i), ct_tensor_dict_tensor(d, i),
                                 CT_STATE_REPLICATED);
    for (int i = 0; !rc && i < ct_tensor_dict_num_meta(d); i++) {
        const char *k, *v;
        ct_tensor_dict_meta_at(d, i, &k, &v);
        rc = ct_state_set_meta(st, k, v);
    }
    if (!rc)
        rc = ct_checkpoint_save(dst, st, NULL, NULL);
    ct_state_free(st);
    ct_tensor_dict_free(d);
    return rc ? fail("convert") : 0;
}

/* Resharding runs one thread per new rank, each with a communicator over
 * shared memory: each loads its row block of every tensor from SRC and all
 * of them save DST together, through the same API a training job uses. */
typedef struct shard_job {
    const char *src, *dst, *shm_name;
    int rank, size;
    bool per_rank; /* carry the per-rank entries (same world size) */
    int rc;
    char message[1024];
} shard_job;

static int add_tensor_block(ct_state *st, ct_checkpoint_tensor_info *t, int rank, int size,
                            bool per_rank) {
    if (t->kind == CT_STATE_PER_RANK) {
        if (!per_rank)
            return 0;
        ct_tensor *x = ct_empty(t->ndim, t->sizes, t->dtype);
        return x ? ct_state_add_tensor(st, t->name, x, CT_STATE_PER_RANK) : ct_errcode();
    }
    int64_t rows = t->ndim ? t->sizes[0] : 1;
    int64_t lo = rows * rank / size, hi = rows * (rank + 1) / size;
    if (hi == lo)
        return 0;
    int64_t sizes[CT_MAX_DIMS], offsets[CT_MAX_DIMS] = {0};
    memcpy(sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    if (t->ndim) {
        sizes[0] = hi - lo;
        offsets[0] = lo;
    }
    ct_tensor *x = ct_empty(t->ndim, sizes, t->dtype);
    return x ? ct_state_add_shard(st, t->name, x, t->ndim, t->sizes, offsets) : ct_errcode();
}

static int reshard_rank(shard_job *job) {
    ct_comm *comm = ct_comm_new(&(ct_comm_config){.backend = CT_BACKEND_SHM,
                                                  .rank = job->rank,
                                                  .size = job->size,
                                                  .timeout_s = 600,
                                                  .shm_name = job->shm_name});
    if (!comm)
        return ct_errcode();
    ct_checkpoint_reader *ck = NULL;
    ct_state *st = ct_state_new();
    int rc = st ? ct_checkpoint_reader_open(job->src, &ck) : ct_errcode();
    int nv = rc ? 0 : ct_checkpoint_reader_num_values(ck);
    uint64_t *slots = calloc((size_t)nv + 1, sizeof *slots);
    ct_scope_begin();
    for (int i = 0; !rc && i < ct_checkpoint_reader_num_tensors(ck); i++) {
        ct_checkpoint_tensor_info t;
        ct_checkpoint_reader_tensor(ck, i, &t);
        rc = add_tensor_block(st, &t, job->rank, job->size, job->per_rank);
    }
    for (int i = 0; !rc && i < nv; i++) {
        const char *name, *type;
        ct_state_kind kind;
        ct_checkpoint_reader_value(ck, i, 0, &name, &kind, &type, NULL);
        if (kind == CT_STATE_PER_RANK && !job->per_rank)
            continue;
        rc = !strcmp(type, "int64")     ? ct_state_add_i64(st, name, (int64_t *)&slots[i], kind)
             : !strcmp(type, "float64") ? ct_state_add_f64(st, name, (double *)&slots[i], kind)
                                        : ct_state_add_u64(st, name, &slots[i], kind);
    }
    ct_checkpoint_options o = ct_checkpoint_defaults();
    o.step = rc ? -1 : ct_checkpoint_reader_step(ck);
    ct_checkpoint_reader_close(ck);
    if (!rc)
        rc = ct_checkpoint_load(job->src, st, comm);
    if (!rc)
        rc = ct_checkpoint_save(job->dst, st, comm, &o);
    ct_scope_end();
    free(slots);
    ct_state_free(st);
    ct_comm_free(comm);
    return rc;
}

static void *reshard_thread(void *arg) {
    shard_job *job = arg;
    job->rc = reshard_rank(job);
    if (job->rc)
        snprintf(job->message, sizeof job->message, "%s", ct_errmsg());
    return NULL;
}

static int reshard(const char *src, const char *dst, int shards, bool drop_per_rank) {
    ct_checkpoint_reader *ck;
    if (ct_checkpoint_reader_open(src, &ck))
        return fail("convert");
    int world = ct_checkpoint_reader_world_size(ck), dropped = 0;
    for (int i = 0; i < ct_checkpoint_reader_num_tensors(ck); i++) {
        ct_checkpoint_tensor_info t;
        ct_checkpoint_reader_tensor(ck, i, &t);
        if (t.kind == CT_STATE_PER_RANK && world != shards) {
            fprintf(stderr, "ctckpt: per-rank tensor '%s' is valid only for %d ranks\n", t.name,
                    world);
            dropped++;
        }
    }
    for (int i = 0; i < ct_checkpoint_reader_num_values(ck); i++) {
        const char *name;
        ct_state_kind kind;
        ct_checkpoint_reader_value(ck, i, 0, &name, &kind, NULL, NULL);
        if (kind == CT_STATE_PER_RANK && world != shards) {
            fprintf(stderr, "ctckpt: per-rank value '%s' is valid only for %d ranks\n", name,
                    world);
            dropped++;
        }
    }
    ct_checkpoint_reader_close(ck);
    if (dropped && !drop_per_rank) {
        fprintf(stderr,
                "ctckpt: convert: %d per-rank entries cannot go to %d shards; pass "
                "--drop-per-rank to leave them out\n",
                dropped, shards);
        return 2;
    }
    char shm_name[64];
    snprintf(shm_name, sizeof shm_name, "/ctckpt-%ld", (long)getpid());
    shard_job *jobs = calloc((size_t)shards, sizeof *jobs);
    pthread_t *threads = calloc((size_t)shards, sizeof *threads);
    if (!jobs || !threads) {
        free(jobs);
        free(threads);
        fprintf(stderr, "ctckpt: convert: out of memory\n");
        return 2;
    }
    int started = 0;
    for (; started < shards; started++) {
        jobs[started] = (shard_job){src, dst, shm_name, started, shards, world == shards, 0, ""};
        if (pthread_create(&threads[started], NULL, reshard_thread, &jobs[started]))
            break;
    }
    int rc = started == shards ? 0 : 2;
    for (int r = 0; r < started; r++) {
        pthread_join(threads[r], NULL);
        if (jobs[r].rc && !rc) {
            fprintf(stderr, "ctckpt: convert: %s\n", jobs[r].message);
            rc = 2;
        }
    }
    if (rc == 0)
        printf("%s: %d shards written from %s\n", dst, shards, src);
    free(jobs);
    free(threads);
    return rc;
}

/* A subcommand's flags and its positional arguments, parsed by ct/cli.h's
 * rules with "ctckpt CMD" as the program: 0 to go on with exactly nargs
 * positional arguments at argv[*first]; -1 once --help or --version has
 * printed (exit 0); 2 after a usage error, said on stderr. */
static int parse_command(const char *cmd, const char *args, int nargs, const ct_cli_flag *flags,
                         size_t nflags, int argc, char **argv, int *first) {
    char prog[32];
    snprintf(prog, sizeof prog, "ctckpt %s", cmd);
    ct_cli cli = {.prog = prog,
                  .about = "See 'ctckpt --help' for every command.",
                  .flags = flags,
                  .nflags = nflags,
                  .args = args};
    int rc = ct_cli_parse(&cli, argc, argv, first);
    if (rc)
        return rc > 0 ? -1 : 2;
    if (argc - *first != nargs) {
        fprintf(stderr, "%s: needs %s, got %d argument%s\nTry '%s --help'.\n", prog, args,
                argc - *first, argc - *first == 1 ? "" : "s", prog);
        return 2;
    }
    return 0;
}

static int convert(int argc, char **argv) {
    int shards = 0, first;
    bool drop = false;
    const ct_cli_flag flags[] = {
        CT_CLI_FLAG("--shards", CT_CLI_INT, &shards, "N",
                    "rewrite SRC as if N ranks had saved it, each tensor split by rows", .min = 1,
                    .max = 4096, .default_text = ""),
        CT_CLI_FLAG("--drop-per-rank", CT_CLI_SWITCH, &drop, NULL,
                    "leave out per-rank entries (they are listed) when N differs from SRC's "
                    "world size"),
    };
    int rc = parse_command("convert", "SRC DST", 2, flags, 2, argc, argv, &first);
    if (rc)
        return rc < 0 ? 0 : rc;
    const char *src = argv[first], *dst = argv[first + 1];
    if (is_regular_file(src))
        return import_safetensors(src, dst);
    if (ends_with(dst, ".safetensors"))
        return export_safetensors(src, dst, drop);
    if (!shards) {
        fprintf(stderr, "ctckpt: convert: say --shards N (or give DST a .safetensors name)\n");
        return 2;
    }
    return reshard(src, dst, shards, drop);
}

/* info, verify and diff: their flags, then the command. */
static int run_simple(const char *cmd, int argc, char **argv) {
    bool verbose = false;
    const ct_cli_flag flags[] = {
        CT_CLI_FLAG("--verbose", CT_CLI_SWITCH, &verbose, NULL,
                    "also print each tensor's first values", .alias = "-v"),
    };
    bool is_info = !strcmp(cmd, "info"), is_diff = !strcmp(cmd, "diff");
    int first;
    int rc = parse_command(cmd, is_diff ? "A B" : "DIR|FILE.safetensors", is_diff ? 2 : 1, flags,
                           is_info ? 1 : 0, argc, argv, &first);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (is_info)
        return info(argv[first], verbose);
    return is_diff ? diff(argv[first], argv[first + 1]) : verify(argv[first]);
}

int main(int argc, char **argv) {
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!strcmp(cmd, "info") || !strcmp(cmd, "verify") || !strcmp(cmd, "diff"))
        return run_simple(cmd, argc - 1, argv + 1);
    if (!strcmp(cmd, "convert"))
        return convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "--version")) {
        printf("ctckpt (ct) %s\n", ct_version());
        return 0;
    }
    bool help = argc == 2 && (!strcmp(cmd, "-h") || !strcmp(cmd, "--help"));
    if (!help && *cmd)
        fprintf(stderr, "ctckpt: unknown command '%s' (info, verify, diff, convert)\n", cmd);
    fputs(usage, help ? stdout : stderr);
    return help ? 0 : 2;
}
