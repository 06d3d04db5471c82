/* The program each rank of test_collectives runs, under ctlaunch or mpirun.
 * It joins the job with ct_dist_init (the launcher's default backend, or
 * CT_BACKEND's) and runs the scenario named on its command line:
 *
 *   correctness     every operation, dtype, size, root and layout, the async
 *                   form, in-place allgather, split and process groups, each
 *                   checked against a serial reference
 *   peer_killed     the last rank SIGKILLs itself mid-allreduce
 *   peer_killed_shared     the last rank dies before an allreduce on
 *                   ct_comm_zeros memory (the direct path) that the others run
 *   count_mismatch  rank 1 passes another element count than the others
 *   count_mismatch_shared  the same, all in one ct_comm_zeros allocation
 *   dtype_mismatch  rank 1 passes another dtype than the others
 *   op_mismatch     rank 1 broadcasts while the others allreduce
 *   late_rank       the last rank arrives after the timeout
 *   stuck_peer      the last rank never calls the allreduce the others
 *                   time out in, and ct_dist_finalize returns on them
 *                   within the timeout while it still sleeps
 *   auto_backend    the default backend is shm (every rank on one machine)
 *   loopback        every TCP listener of each rank (rank 0's store under an
 *                   MPI launcher) binds 127.0.0.1, every rank being on one
 *                   machine
 *   signal_masks    every thread that joining and an allreduce started
 *                   (the backend's, gloo's event loop among them) blocks
 *                   SIGPIPE: gloo writes without MSG_NOSIGNAL, so an
 *                   unblocked one dies with the process when a peer closes
 *   across_hosts    one rank per host (mpirun or ctlaunch on the test
 *                   cluster): auto picks mpi under mpirun, gloo under
 *                   ctlaunch, each rank is alone on its machine, and a
 *                   large allreduce crosses the hosts' links
 *
 * Every rank's input is a deterministic function of (rank, index), so each
 * rank computes the reference itself and nothing travels except through the
 * operation under test. Every rank prints "pid=<pid>" first so that the
 * driver can check that none is left behind. A failed check does not skip
 * the collectives that follow it, so the ranks stay in step and the run ends
 * with every failure reported. */
#include "ct_test.h"
#include "tt_rank.h"

#include <ct/dist.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64
/* Elements of the large allreduce: 12 MiB of float32, across many pipeline
 * chunks and slots of the shared-memory ring, and not divisible by 2, 3 or
 * 4. The other large messages hold BIG elements (a MiB or more, still many
 * ring slots), which keeps the serial references cheap. */
#define LARGE 3000001
#define BIG   375001
/* What output buffers hold before an operation, and what lies between the
 * elements of strided views: exact in every dtype. */
#define FILL 77.0

static int rank_, size_;
static int world_ranks[MAX_RANKS]; /* 0, 1, ..., size_ - 1 */
/* Element counts every operation is checked with: none, one, fewer than the
 * ranks, not divisible by 2, 3 or 4, and a small message (the one-round
 * path). Set by join(). */
#define NSIZES 5
static int64_t sizes_[NSIZES];

static const ct_dtype all_dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16,
                                      CT_INT64,   CT_INT32,   CT_UINT8,    CT_BOOL};
static const ct_reduce_op all_ops[] = {CT_REDUCE_SUM, CT_REDUCE_AVG, CT_REDUCE_MIN, CT_REDUCE_MAX,
                                       CT_REDUCE_PROD};
#define NDTYPES ((int)(sizeof all_dtypes / sizeof *all_dtypes))
#define NOPS    ((int)(sizeof all_ops / sizeof *all_ops))

static const char *op_name(ct_reduce_op op) {
    static const char *names[] = {"sum", "avg", "min", "max", "prod"};
    return names[op];
}

/* Joins the job, with timeout_s for rendezvous and every collective. */
static ct_comm *join(double timeout_s) {
    ct_comm *c = tt_rank_join(timeout_s, &rank_, &size_);
    if (!c)
        return NULL;
    if (size_ > MAX_RANKS) {
        tt_fail(__FILE__, __LINE__, "%d ranks; this program handles up to %d", size_, MAX_RANKS);
        return NULL;
    }
    for (int r = 0; r < size_; r++)
        world_ranks[r] = r;
    memcpy(sizes_, (int64_t[NSIZES]){0, 1, size_ - 1, 7, 100}, sizeof sizes_);
    return c;
}

/* ---------------------------------------------------------------- inputs */

/* Element i of rank r's input to op. Small integers, with quarters and an
 * occasional 256 in float dtypes, keep every sum of up to 64 ranks exact in
 * the accumulator (float32 for the 16-bit floats), so the reference is
 * exact whatever order the backend reduces in and only the final rounding
 * to the dtype remains; a backend accumulating in 16 bits rounds 256 plus
 * small terms differently (once three ranks or more add up). Factors for
 * prod stay in [-2, 2] ([1, 3] for uint8) so that products of the up to
 * four ranks these tests run fit every dtype exactly. bool runs through every
 * combination of four ranks' bits every 16 elements. */
static double input_value(int r, int64_t i, ct_dtype dt, ct_reduce_op op) {
    if (dt == CT_BOOL)
        return (double)(((i + 1) >> r) & 1);
    if (op == CT_REDUCE_PROD)
        return dt == CT_UINT8 ? (double)((i + 2 * r) % 3 + 1) : (double)((i + 2 * r) % 5 - 2);
    int64_t m = (i * 7 + r * 5 + 3) % 11;
    if (dt == CT_UINT8)
        return (double)m;
    if (!ct_dtype_is_float(dt))
        return (double)(m - 5);
    return (double)(m - 5) + 0.25 * r + (i % 13 == 5 && r == 0 ? 256.0 : 0.0);
}

/* v[0, n) := the values as dt stores them. */
static bool round_to(double *v, int64_t n, ct_dtype dt) {
    ct_scope_begin();
    ct_tensor *t = ct_to_dtype(ct_to_dtype(ct_from_data(v, 1, &n, CT_FLOAT64), dt), CT_FLOAT64);
    if (t)
        memcpy(v, ct_data_ptr(ct_contiguous(t)), sizeof(double) * (size_t)n);
    else
        tt_fail(__FILE__, __LINE__, "rounding to %s: %s", ct_dtype_name(dt), ct_errmsg());
    ct_scope_end();
    return t != NULL;
}

/* v[0, n) := elements [first, first + n) of rank r's input to op, as dt
 * stores them. Only the 16-bit floats round them; every other dtype holds
 * them exactly. */
static void fill_input(double *v, int r, int64_t first, int64_t n, ct_dtype dt, ct_reduce_op op) {
    for (int64_t i = 0; i < n; i++)
        v[i] = input_value(r, first + i, dt, op);
    if (dt == CT_FLOAT16 || dt == CT_BFLOAT16)
        round_to(v, n, dt);
}

/* The same, malloc'd. */
static double *input_values(int r, int64_t first, int64_t n, ct_dtype dt, ct_reduce_op op) {
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    fill_input(v, r, first, n, dt, op);
    return v;
}

/* The same as a 1-d tensor of dt (scope-owned). */
static ct_tensor *input_tensor(int r, int64_t first, int64_t n, ct_dtype dt, ct_reduce_op op) {
    double *v = input_values(r, first, n, dt, op);
    ct_tensor *t = ct_to_dtype(ct_from_data(v, 1, &n, CT_FLOAT64), dt);
    free(v);
    return t;
}

/* A tensor of n elements of dt, all FILL (scope-owned). */
static ct_tensor *filled(int64_t n, ct_dtype dt) { return ct_full(1, &n, FILL, dt); }

/* t's elements in row-major order (malloc'd), or NULL. */
static double *values_of(ct_tensor *t) {
    if (!t)
        return NULL;
    int64_t n = ct_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    ct_scope_begin();
    ct_tensor *d = ct_contiguous(ct_to_dtype(t, CT_FLOAT64));
    if (d)
        memcpy(v, ct_data_ptr(d), sizeof(double) * (size_t)n);
    ct_scope_end();
    if (!d) {
        free(v);
        return NULL;
    }
    return v;
}

/* ------------------------------------------------------------- reference */

/* acc (op) x, as ct defines op for dt; avg sums, and reduced() divides. */
static double combine(double acc, double x, ct_dtype dt, ct_reduce_op op) {
    if (dt == CT_BOOL) {
        bool any = op == CT_REDUCE_SUM || op == CT_REDUCE_MAX;
        return any ? (double)(acc != 0 || x != 0) : (double)(acc != 0 && x != 0);
    }
    switch (op) {
    case CT_REDUCE_SUM:
    case CT_REDUCE_AVG: return acc + x;
    case CT_REDUCE_MIN: return fmin(acc, x);
    case CT_REDUCE_MAX: return fmax(acc, x);
    case CT_REDUCE_PROD: return acc * x;
    }
    return NAN;
}

/* Elements [first, first + n) of the reduction with op of the inputs of the
 * world ranks listed, rounded to dt (malloc'd). */
static double *reduced(const int *ranks, int nranks, int64_t first, int64_t n, ct_dtype dt,
                       ct_reduce_op op) {
    double *acc = input_values(ranks[0], first, n, dt, op);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int k = 1; k < nranks; k++) {
        fill_input(v, ranks[k], first, n, dt, op);
        for (int64_t i = 0; i < n; i++)
            acc[i] = combine(acc[i], v[i], dt, op);
    }
    free(v);
    if (op == CT_REDUCE_AVG)
        for (int64_t i = 0; i < n; i++)
            acc[i] = ct_dtype_is_float(dt) ? acc[i] / nranks : trunc(acc[i] / nranks);
    round_to(acc, n, dt);
    return acc;
}

/* Float averages are divided in the accumulator and rounded once; allow
 * one unit in the last place of the dtype for a backend that multiplies by
 * 1/n instead. Everything else is exact. */
static double tolerance(ct_dtype dt, ct_reduce_op op) {
    if (op != CT_REDUCE_AVG)
        return 0;
    switch (dt) {
    case CT_FLOAT32: return ldexp(1, -23);
    case CT_FLOAT64: return ldexp(1, -52);
    case CT_FLOAT16: return ldexp(1, -10);
    case CT_BFLOAT16: return ldexp(1, -7);
    default: return 0;
    }
}

/* ---------------------------------------------------------------- checks */

/* Each check records a failure naming the case and returns whether it
 * passed; none of them returns from the caller, so that every rank goes on
 * issuing the same collectives. */

static bool check_rc_(int line, const char *what, int rc) {
    if (rc == 0)
        return true;
    /* Once an operation failed, the communicator refuses the rest: say so
     * once. */
    if (rc == CT_ESTATE && tt_failed())
        return false;
    tt_fail(__FILE__, line, "%s: %s: %s", what, ct_errname(rc), ct_errmsg());
    return false;
}
#define check_rc(what, rc) check_rc_(__LINE__, what, rc)

/* rc is code and the message holds each of the NULL-ended subs. */
static bool check_fails_(int line, const char *what, int rc, int code, const char *const *subs) {
    if (rc != code) {
        tt_fail(__FILE__, line, "%s returned %s, expected %s: %s", what, ct_errname(rc),
                ct_errname(code), ct_errmsg());
        return false;
    }
    for (; *subs; subs++)
        if (!strstr(ct_errmsg(), *subs)) {
            tt_fail(__FILE__, line, "%s: the message \"%s\" does not name \"%s\"", what,
                    ct_errmsg(), *subs);
            return false;
        }
    return true;
}
#define check_fails(what, rc, code, ...)                                                           \
    check_fails_(__LINE__, what, rc, code, (const char *const[]){__VA_ARGS__, NULL})

/* Whether a reduction with op of dt that returned rc ran, as it must unless
 * it is avg of bool, which every rank refuses with CT_EDTYPE. */
static bool check_reduction_rc_(int line, const char *what, int rc, ct_dtype dt, ct_reduce_op op) {
    if (dt == CT_BOOL && op == CT_REDUCE_AVG) {
        check_fails_(line, what, rc, CT_EDTYPE, (const char *const[]){"avg", "bool", NULL});
        return false;
    }
    return check_rc_(line, what, rc);
}
#define check_reduction_rc(what, rc, dt, op) check_reduction_rc_(__LINE__, what, rc, dt, op)

/* t holds want[0, n), within rtol of each value. want is malloc'd (a
 * reference from reduced(), input_values() or blocks()) and freed here. */
static bool check_values_(int line, const char *what, ct_tensor *t, double *want, int64_t n,
                          double rtol) {
    if (!t || ct_numel(t) != n) {
        tt_fail(__FILE__, line, "%s: expected %lld elements, got %lld", what, (long long)n,
                t ? (long long)ct_numel(t) : -1LL);
        free(want);
        return false;
    }
    double *got = values_of(t);
    bool ok = got != NULL;
    for (int64_t i = 0; ok && i < n; i++)
        if (!(got[i] == want[i] || fabs(got[i] - want[i]) <= rtol * fabs(want[i]))) {
            tt_fail(__FILE__, line, "%s: element %lld of %lld is %.9g, expected %.9g", what,
                    (long long)i, (long long)n, got[i], want[i]);
            ok = false;
        }
    free(got);
    free(want);
    return ok;
}
#define check_values(what, t, want, n, rtol) check_values_(__LINE__, what, t, want, n, rtol)

static bool check_names_rank_(int line, const char *what, const char *msg, int r) {
    if (tt_names_rank(msg, r))
        return true;
    tt_fail(__FILE__, line, "%s: the message \"%s\" does not name rank %d", what, msg, r);
    return false;
}
#define check_tt_names_rank(what, msg, r) check_names_rank_(__LINE__, what, msg, r)

/* A copy of t (1-d) in every other element of a buffer of FILL; *buf is the
 * whole buffer, for checking that nothing between the elements changed. */
static ct_tensor *strided_copy(ct_tensor *t, ct_tensor **buf) {
    int64_t n = ct_numel(t), len = 2 * n + 1;
    *buf = ct_full(1, &len, FILL, ct_tensor_dtype(t));
    ct_tensor *v = ct_slice(*buf, 0, 1, len, 2);
    return ct_copy_(v, t) ? v : NULL;
}

static bool check_gaps_(int line, const char *what, ct_tensor *buf) {
    double *v = values_of(buf), fill = FILL;
    round_to(&fill, 1, ct_tensor_dtype(buf));
    bool ok = v != NULL;
    for (int64_t i = 0; ok && i < ct_numel(buf); i += 2)
        if (v[i] != fill) {
            tt_fail(__FILE__, line, "%s: element %lld between the view's elements became %g", what,
                    (long long)i, v[i]);
            ok = false;
        }
    free(v);
    return ok;
}
#define check_gaps(what, buf) check_gaps_(__LINE__, what, buf)

/* ---------------------------------------------------------- correctness */

/* One case of each operation, on contiguous tensors of dt: n elements in
 * all, or per rank (per pair for alltoall) where the operation splits its
 * buffer into blocks. */

static void check_allreduce_of(ct_comm *c, int64_t n, ct_dtype dt, ct_reduce_op op) {
    char what[128];
    snprintf(what, sizeof what, "allreduce %s of %lld %s", op_name(op), (long long)n,
             ct_dtype_name(dt));
    ct_scope_begin();
    ct_tensor *t = input_tensor(rank_, 0, n, dt, op);
    if (check_reduction_rc(what, ct_comm_allreduce(c, t, op, NULL), dt, op))
        check_values(what, t, reduced(world_ranks, size_, 0, n, dt, op), n, tolerance(dt, op));
    ct_scope_end();
}

static void check_broadcast_of(ct_comm *c, int64_t n, ct_dtype dt, int root) {
    char what[128];
    snprintf(what, sizeof what, "broadcast of %lld %s from rank %d", (long long)n,
             ct_dtype_name(dt), root);
    ct_scope_begin();
    ct_tensor *t = input_tensor(rank_, 0, n, dt, CT_REDUCE_SUM);
    if (check_rc(what, ct_comm_broadcast(c, t, root, NULL)))
        check_values(what, t, input_values(root, 0, n, dt, CT_REDUCE_SUM), n, 0);
    ct_scope_end();
}

/* The root gets the reduction and the others keep their input. */
static void check_reduce_of(ct_comm *c, int64_t n, ct_dtype dt, ct_reduce_op op, int root) {
    char what[128];
    snprintf(what, sizeof what, "reduce %s of %lld %s to rank %d", op_name(op), (long long)n,
             ct_dtype_name(dt), root);
    ct_scope_begin();
    ct_tensor *t = input_tensor(rank_, 0, n, dt, op);
    if (check_reduction_rc(what, ct_comm_reduce(c, t, op, root, NULL), dt, op))
        check_values(what, t,
                     rank_ == root ? reduced(world_ranks, size_, 0, n, dt, op)
                                   : input_values(rank_, 0, n, dt, op),
                     n, tolerance(dt, op));
    ct_scope_end();
}

static void check_reduce_scatter_of(ct_comm *c, int64_t n, ct_dtype dt, ct_reduce_op op) {
    char what[128];
    snprintf(what, sizeof what, "reduce_scatter %s of %lld %s per rank", op_name(op), (long long)n,
             ct_dtype_name(dt));
    ct_scope_begin();
    ct_tensor *in = input_tensor(rank_, 0, size_ * n, dt, op);
    ct_tensor *out = filled(n, dt);
    if (check_reduction_rc(what, ct_comm_reduce_scatter(c, out, in, op, NULL), dt, op))
        check_values(what, out, reduced(world_ranks, size_, rank_ * n, n, dt, op), n,
                     tolerance(dt, op));
    ct_scope_end();
}

/* The operations that move blocks of n elements without reducing them. */
typedef enum move_op { MOVE_ALLGATHER, MOVE_ALLTOALL } move_op;

/* The expected output of a move (malloc'd): block r is elements
 * [first, first + n) of rank r's input, where first is 0 for an allgather
 * and rank_ * n for an alltoall. */
static double *blocks(int64_t first, int64_t n, ct_dtype dt) {
    double *want = malloc(sizeof(double) * (size_t)(size_ * n + 1));
    for (int r = 0; r < size_; r++)
        fill_input(want + r * n, r, first, n, dt, CT_REDUCE_SUM);
    return want;
}

/* An allgather of n elements per rank, or an alltoall of n per pair: from a
 * contiguous tensor into another or, with views, from a strided view into
 * a transposed [size, n], whose input's gaps must stay as they were. */
static void check_move(ct_comm *c, move_op op, int64_t n, ct_dtype dt, bool views) {
    bool gather = op == MOVE_ALLGATHER;
    char what[160];
    snprintf(what, sizeof what, "%s of %lld %s per %s%s", gather ? "allgather" : "alltoall",
             (long long)n, ct_dtype_name(dt), gather ? "rank" : "pair",
             views ? " from a strided view into a transposed one" : "");
    ct_scope_begin();
    ct_tensor *in = input_tensor(rank_, 0, gather ? n : size_ * n, dt, CT_REDUCE_SUM), *out;
    ct_tensor *buf = NULL;
    if (views) {
        in = strided_copy(in, &buf);
        out = tt_layout_of(ct_full(2, (int64_t[]){size_, n}, FILL, dt), TT_TRANSPOSED);
    } else {
        out = filled(size_ * n, dt);
    }
    int rc = gather ? ct_comm_allgather(c, out, in, NULL) : ct_comm_alltoall(c, out, in, NULL);
    if (check_rc(what, rc)) {
        check_values(what, out, blocks(gather ? 0 : rank_ * n, n, dt), size_ * n, 0);
        if (buf)
            check_gaps(what, buf);
    }
    ct_scope_end();
}

/* Sum runs at every size, the other reductions at 7 elements, which keeps
 * the count of cases down where they multiply with roots. */
static bool case_wanted(ct_reduce_op op, int64_t n) { return op == CT_REDUCE_SUM || n == 7; }

/* ------------------------------------------------- every case of each op */

/* Every dtype, reduction and size; avg of bool is refused on every rank. */
static void check_allreduce(ct_comm *c) {
    for (int d = 0; d < NDTYPES; d++)
        for (int o = 0; o < NOPS; o++)
            for (int s = 0; s < NSIZES; s++)
                check_allreduce_of(c, sizes_[s], all_dtypes[d], all_ops[o]);
    /* int64 reduces in int64: values past 2^53 would lose their low bits
     * in a double. */
    int64_t big[3], n = 3;
    for (int i = 0; i < 3; i++)
        big[i] = ((int64_t)1 << 60) + 3 * rank_ + i;
    ct_tensor *t = ct_from_data(big, 1, &n, CT_INT64);
    if (check_rc("allreduce sum of int64 beyond 2^53",
                 ct_comm_allreduce(c, t, CT_REDUCE_SUM, NULL)))
        for (int i = 0; i < 3; i++) {
            int64_t want = 0;
            for (int r = 0; r < size_; r++)
                want += ((int64_t)1 << 60) + 3 * r + i;
            int64_t got = ((const int64_t *)ct_data_ptr(t))[i];
            if (got != want)
                tt_fail(__FILE__, __LINE__,
                        "allreduce sum of int64 beyond 2^53: element %d is %lld, expected %lld", i,
                        (long long)got, (long long)want);
        }
}

static void check_broadcast(ct_comm *c) {
    for (int d = 0; d < NDTYPES; d++)
        for (int root = 0; root < size_; root++)
            for (int s = 0; s < NSIZES; s++)
                check_broadcast_of(c, sizes_[s], all_dtypes[d], root);
}

/* Every root, dtype and reduction. */
static void check_reduce(ct_comm *c) {
    for (int d = 0; d < NDTYPES; d++)
        for (int root = 0; root < size_; root++)
            for (int o = 0; o < NOPS; o++)
                for (int s = 0; s < NSIZES; s++)
                    if (case_wanted(all_ops[o], sizes_[s]))
                        check_reduce_of(c, sizes_[s], all_dtypes[d], all_ops[o], root);
}

/* Every dtype and size. */
static void check_moves(ct_comm *c, move_op op) {
    for (int d = 0; d < NDTYPES; d++)
        for (int s = 0; s < NSIZES; s++)
            check_move(c, op, sizes_[s], all_dtypes[d], false);
}

static void check_allgather(ct_comm *c) { check_moves(c, MOVE_ALLGATHER); }

static void check_alltoall(ct_comm *c) { check_moves(c, MOVE_ALLTOALL); }

/* Every dtype and reduction. */
static void check_reduce_scatter(ct_comm *c) {
    for (int d = 0; d < NDTYPES; d++)
        for (int o = 0; o < NOPS; o++)
            for (int s = 0; s < NSIZES; s++)
                if (case_wanted(all_ops[o], sizes_[s]))
                    check_reduce_scatter_of(c, sizes_[s], all_dtypes[d], all_ops[o]);
}

/* A barrier holds every rank until the last one arrives: rank 0 comes
 * 400 ms late. */
static void check_barrier(ct_comm *c) {
    const double delay = 0.4;
    check_rc("barrier", ct_comm_barrier(c, NULL));
    double t0 = tt_now();
    if (rank_ == 0)
        nanosleep(&(struct timespec){0, (long)(delay * 1e9)}, NULL);
    check_rc("barrier", ct_comm_barrier(c, NULL));
    double waited = tt_now() - t0;
    /* The ranks left the first barrier up to a scheduling delay apart. */
    if (rank_ != 0 && waited < delay / 2)
        tt_fail(__FILE__, __LINE__,
                "barrier returned after %.3f s although rank 0 arrived %.1f s late", waited, delay);
    ct_comm_stats stats;
    ct_comm_stats_get(c, &stats);
    if (stats.issued != stats.completed || stats.pending_op || stats.pending_seq)
        tt_fail(__FILE__, __LINE__,
                "with nothing pending, stats say %llu issued, %llu completed, pending %s #%llu",
                (unsigned long long)stats.issued, (unsigned long long)stats.completed,
                stats.pending_op ? stats.pending_op : "-", (unsigned long long)stats.pending_seq);
}

/* Around the ring, one way then the other, three messages each way with
 * different tags and sizes (one empty), received in the order sent. */
static void check_send_recv(ct_comm *c) {
    static const struct {
        int tag;
        int64_t first, n;
    } msgs[] = {{0, 0, 0}, {5, 1000, 7}, {9, 2000, 100}};
    enum { NMSGS = sizeof msgs / sizeof *msgs };
    for (int d = 0; d < NDTYPES; d++)
        for (int step = 1; step >= -1; step -= 2) {
            ct_dtype dt = all_dtypes[d];
            int dst = (rank_ + step + size_) % size_, src = (rank_ - step + size_) % size_;
            ct_scope_begin();
            ct_tensor *in[NMSGS], *out[NMSGS];
            ct_work *sends[NMSGS] = {0}, *recvs[NMSGS] = {0};
            char what[128];
            for (int m = 0; m < NMSGS; m++) {
                snprintf(what, sizeof what, "recv of %lld %s with tag %d from rank %d",
                         (long long)msgs[m].n, ct_dtype_name(dt), msgs[m].tag, src);
                out[m] = filled(msgs[m].n, dt);
                check_rc(what, ct_comm_recv(c, out[m], src, msgs[m].tag, &recvs[m]));
            }
            for (int m = 0; m < NMSGS; m++) {
                snprintf(what, sizeof what, "send of %lld %s with tag %d to rank %d",
                         (long long)msgs[m].n, ct_dtype_name(dt), msgs[m].tag, dst);
                in[m] = input_tensor(rank_, msgs[m].first, msgs[m].n, dt, CT_REDUCE_SUM);
                check_rc(what, ct_comm_send(c, in[m], dst, msgs[m].tag, &sends[m]));
            }
            for (int m = NMSGS - 1; m >= 0; m--) {
                snprintf(what, sizeof what, "recv of %lld %s with tag %d from rank %d",
                         (long long)msgs[m].n, ct_dtype_name(dt), msgs[m].tag, src);
                if (recvs[m] && check_rc(what, ct_work_wait(recvs[m])))
                    check_values(what, out[m],
                                 input_values(src, msgs[m].first, msgs[m].n, dt, CT_REDUCE_SUM),
                                 msgs[m].n, 0);
                if (sends[m])
                    check_rc("send", ct_work_wait(sends[m]));
                ct_work_free(recvs[m]);
                ct_work_free(sends[m]);
            }
            ct_scope_end();
        }
}

/* Large messages, in several dtypes and operations. */
static void check_large(ct_comm *c) {
    check_allreduce_of(c, LARGE, CT_FLOAT32, CT_REDUCE_SUM);
    check_allreduce_of(c, BIG, CT_BFLOAT16, CT_REDUCE_AVG);
    check_broadcast_of(c, BIG, CT_FLOAT64, size_ - 1);
    check_move(c, MOVE_ALLGATHER, BIG, CT_FLOAT32, false);
    check_reduce_scatter_of(c, BIG, CT_FLOAT64, CT_REDUCE_MAX);
    check_move(c, MOVE_ALLTOALL, BIG / 2, CT_INT32, false);

    ct_scope_begin();
    int dst = (rank_ + 1) % size_, src = (rank_ + size_ - 1) % size_;
    ct_tensor *in = input_tensor(rank_, 0, BIG, CT_FLOAT16, CT_REDUCE_SUM);
    ct_tensor *out = filled(BIG, CT_FLOAT16);
    ct_work *recv = NULL, *send = NULL;
    char what[128];
    snprintf(what, sizeof what, "recv of %lld float16 from rank %d", (long long)BIG, src);
    check_rc(what, ct_comm_recv(c, out, src, 1, &recv));
    check_rc("send", ct_comm_send(c, in, dst, 1, &send));
    if (send)
        check_rc("send", ct_work_wait(send));
    if (recv && check_rc(what, ct_work_wait(recv)))
        check_values(what, out, input_values(src, 0, BIG, CT_FLOAT16, CT_REDUCE_SUM), BIG, 0);
    ct_work_free(send);
    ct_work_free(recv);
    ct_scope_end();
}

/* rank_'s input to op as [rows, cols], seen transposed (scope-owned). */
static ct_tensor *transposed_input(int64_t rows, int64_t cols, ct_dtype dt, ct_reduce_op op) {
    return tt_layout_of(
        ct_reshape(input_tensor(rank_, 0, rows * cols, dt, op), 2, (int64_t[]){rows, cols}),
        TT_TRANSPOSED);
}

/* Transposed and strided tensors are staged through contiguous copies:
 * the values land in the logical order, and nothing between a strided
 * view's elements changes. */
static void check_noncontiguous(ct_comm *c) {
    const int64_t rows = 5, cols = 7, n = rows * cols, block = 6;
    const int last = size_ - 1, src = (rank_ + size_ - 1) % size_, dst = (rank_ + 1) % size_;
    for (int d = 0; d < NDTYPES; d++) {
        ct_dtype dt = all_dtypes[d];
        char what[128];
        ct_scope_begin();

        ct_tensor *t = transposed_input(rows, cols, dt, CT_REDUCE_SUM);
        snprintf(what, sizeof what, "allreduce sum of a transposed [5, 7] %s", ct_dtype_name(dt));
        if (!t || ct_is_contiguous(t))
            tt_fail(__FILE__, __LINE__, "%s: the test's view is contiguous", what);
        else if (check_rc(what, ct_comm_allreduce(c, t, CT_REDUCE_SUM, NULL)))
            check_values(what, t, reduced(world_ranks, size_, 0, n, dt, CT_REDUCE_SUM), n, 0);

        ct_tensor *buf;
        t = strided_copy(input_tensor(rank_, 0, n, dt, CT_REDUCE_MAX), &buf);
        snprintf(what, sizeof what, "allreduce max of a strided %s", ct_dtype_name(dt));
        if (check_rc(what, ct_comm_allreduce(c, t, CT_REDUCE_MAX, NULL))) {
            check_values(what, t, reduced(world_ranks, size_, 0, n, dt, CT_REDUCE_MAX), n, 0);
            check_gaps(what, buf);
        }

        t = strided_copy(input_tensor(rank_, 0, n, dt, CT_REDUCE_SUM), &buf);
        snprintf(what, sizeof what, "broadcast of a strided %s from rank %d", ct_dtype_name(dt),
                 last);
        if (check_rc(what, ct_comm_broadcast(c, t, last, NULL))) {
            check_values(what, t, input_values(last, 0, n, dt, CT_REDUCE_SUM), n, 0);
            check_gaps(what, buf);
        }

        check_move(c, MOVE_ALLGATHER, block, dt, true);
        check_move(c, MOVE_ALLTOALL, block, dt, true);

        /* reduce_scatter from a transposed [size, block] into a strided
         * view. */
        ct_tensor *in = transposed_input(size_, block, dt, CT_REDUCE_MIN);
        ct_tensor *out = strided_copy(filled(block, dt), &buf);
        snprintf(what, sizeof what, "reduce_scatter min of a transposed %s into a strided one",
                 ct_dtype_name(dt));
        if (check_rc(what, ct_comm_reduce_scatter(c, out, in, CT_REDUCE_MIN, NULL))) {
            check_values(what, out,
                         reduced(world_ranks, size_, rank_ * block, block, dt, CT_REDUCE_MIN),
                         block, 0);
            check_gaps(what, buf);
        }

        /* recv into a strided view, from a transposed send. */
        ct_tensor *sent = transposed_input(rows, cols, dt, CT_REDUCE_SUM);
        out = strided_copy(filled(n, dt), &buf);
        ct_work *recv = NULL;
        snprintf(what, sizeof what, "recv of a transposed %s into a strided one",
                 ct_dtype_name(dt));
        check_rc(what, ct_comm_recv(c, out, src, 3, &recv));
        check_rc("send", ct_comm_send(c, sent, dst, 3, NULL));
        if (recv && check_rc(what, ct_work_wait(recv))) {
            check_values(what, out, input_values(src, 0, n, dt, CT_REDUCE_SUM), n, 0);
            check_gaps(what, buf);
        }
        ct_work_free(recv);
        ct_scope_end();
    }
}

/* Several operations in flight at once, waited on in reverse order. */
static void check_async(ct_comm *c) {
    enum { NWORKS = 5 };
    const int64_t n = 100, block = 5;
    const int last = size_ - 1;
    ct_tensor *a = input_tensor(rank_, 0, n, CT_FLOAT32, CT_REDUCE_SUM);
    ct_tensor *b = input_tensor(rank_, 0, n, CT_INT64, CT_REDUCE_SUM);
    ct_tensor *g_in = input_tensor(rank_, 0, block, CT_BFLOAT16, CT_REDUCE_SUM);
    ct_tensor *g_out = filled(size_ * block, CT_BFLOAT16);
    ct_tensor *s_in = input_tensor(rank_, 0, size_ * block, CT_FLOAT64, CT_REDUCE_MAX);
    ct_tensor *s_out = filled(block, CT_FLOAT64);
    ct_work *w[NWORKS] = {0};
    static const char *what[NWORKS] = {"async allreduce", "async broadcast", "async allgather",
                                       "async reduce_scatter", "async barrier"};
    /* One statement each: the order of issue must be the same on every
     * rank, and an initializer list's order of evaluation is unspecified. */
    int rc[NWORKS];
    rc[0] = ct_comm_allreduce(c, a, CT_REDUCE_SUM, &w[0]);
    rc[1] = ct_comm_broadcast(c, b, last, &w[1]);
    rc[2] = ct_comm_allgather(c, g_out, g_in, &w[2]);
    rc[3] = ct_comm_reduce_scatter(c, s_out, s_in, CT_REDUCE_MAX, &w[3]);
    rc[4] = ct_comm_barrier(c, &w[4]);
    for (int k = 0; k < NWORKS; k++) {
        if (!check_rc(what[k], rc[k]))
            continue;
        if (!w[k]) {
            tt_fail(__FILE__, __LINE__, "%s: issued without a work handle", what[k]);
            continue;
        }
        int state = ct_work_test(w[k]);
        if (state != 0 && state != 1)
            tt_fail(__FILE__, __LINE__, "%s: ct_work_test gave %s before the wait", what[k],
                    ct_errname(state));
    }
    for (int k = NWORKS - 1; k >= 0; k--) {
        if (!w[k])
            continue;
        check_rc(what[k], ct_work_wait(w[k]));
        if (ct_work_test(w[k]) != 1)
            tt_fail(__FILE__, __LINE__, "%s: ct_work_test after the wait gave %d", what[k],
                    ct_work_test(w[k]));
        check_rc(what[k], ct_work_wait(w[k])); /* a second wait gives the same */
    }
    check_values(what[0], a, reduced(world_ranks, size_, 0, n, CT_FLOAT32, CT_REDUCE_SUM), n, 0);
    check_values(what[1], b, input_values(last, 0, n, CT_INT64, CT_REDUCE_SUM), n, 0);
    check_values(what[2], g_out, blocks(0, block, CT_BFLOAT16), size_ * block, 0);
    check_values(what[3], s_out,
                 reduced(world_ranks, size_, rank_ * block, block, CT_FLOAT64, CT_REDUCE_MAX),
                 block, 0);
    for (int k = 0; k < NWORKS; k++)
        ct_work_free(w[k]);
}

/* in is this rank's block of out: small and large. */
static void check_inplace_allgather(ct_comm *c) {
    static const int64_t counts[] = {10, BIG};
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < 2; d++) {
            ct_dtype dt = d ? CT_BFLOAT16 : CT_FLOAT32;
            int64_t n = counts[k];
            char what[128];
            snprintf(what, sizeof what, "in-place allgather of %lld %s per rank", (long long)n,
                     ct_dtype_name(dt));
            ct_scope_begin();
            ct_tensor *out = filled(size_ * n, dt);
            ct_tensor *in = ct_narrow(out, 0, rank_ * n, n);
            ct_copy_(in, input_tensor(rank_, 0, n, dt, CT_REDUCE_SUM));
            if (check_rc(what, ct_comm_allgather(c, out, in, NULL)))
                check_values(what, out, blocks(0, n, dt), size_ * n, 0);
            ct_scope_end();
        }
}

static uint64_t direct_count(ct_comm *c) {
    ct_comm_stats st;
    ct_comm_stats_get(c, &st);
    return st.direct;
}

/* An allreduce of op over n elements of dt, in t[at, at + n) where t is a
 * ct_comm_zeros tensor, or in a tensor of its own where t is NULL. Checks the
 * result, that nothing else in t changed, and that it ran straight on the
 * shared memory exactly when direct (only the shm backend can). */
static void check_shared_allreduce(ct_comm *c, const char *how, bool direct, ct_tensor *t,
                                   int64_t at, int64_t n, ct_dtype dt, ct_reduce_op op) {
    char what[192];
    snprintf(what, sizeof what, "allreduce %s of %lld %s %s", op_name(op), (long long)n,
             ct_dtype_name(dt), how);
    ct_scope_begin();
    ct_tensor *v = t ? ct_narrow(t, 0, at, n) : filled(n, dt);
    ct_copy_(v, input_tensor(rank_, 0, n, dt, op));
    uint64_t before = direct_count(c);
    if (check_rc(what, ct_comm_allreduce(c, v, op, NULL)))
        check_values(what, v, reduced(world_ranks, size_, 0, n, dt, op), n, tolerance(dt, op));
    bool want = direct && ct_comm_backend(c) == CT_BACKEND_SHM;
    if (direct_count(c) - before != (want ? 1u : 0u))
        tt_fail(__FILE__, __LINE__, "%s: ran %s, expected %s", what,
                direct_count(c) > before ? "straight on shared memory" : "the usual path",
                want ? "straight on shared memory" : "the usual path");
    if (t) {
        /* Zero outside the view: the ranks wrote only their own shares. */
        ct_tensor *rest = ct_cat(
            (ct_tensor *[]){ct_narrow(t, 0, 0, at), ct_narrow(t, 0, at + n, ct_numel(t) - at - n)},
            2, 0);
        int64_t others = ct_numel(rest);
        check_values(what, rest, calloc((size_t)others + 1, sizeof(double)), others, 0);
        ct_copy_(v, ct_zeros(1, &n, dt));
    }
    ct_scope_end();
}

/* A reduce-scatter from ct_comm_zeros memory (n elements a rank) runs
 * straight from the peers' memory too, and sums in the allreduce's order:
 * its block holds the bits that an allreduce of the same inputs leaves
 * there (fully sharded data parallel then reduces as data parallel does),
 * whatever the inputs' rounding (values that no order sums exactly). */
/* Values that no order of the ranks sums exactly: rank r's n of them. */
static ct_tensor *inexact_input(int64_t n) {
    return ct_add_scalar(
        ct_mul_scalar(ct_sin(ct_arange(0, (double)n, 1, CT_FLOAT32)), 1.0 + 0.37 * rank_),
        0.1 * rank_);
}

/* The largest |a - b|. */
static double apart_by(ct_tensor *a, ct_tensor *b) {
    return ct_item(ct_amax(ct_abs(ct_sub(a, b)), NULL, 0, false));
}

/* A reduce of ct_comm_zeros memory (to the last rank) runs straight from
 * the peers' memory too: the root's result holds the allreduce's bits, and
 * the other ranks' buffers stay as they were. */
static void check_shared_reduce(ct_comm *c, ct_tensor *t, int64_t n) {
    char what[96];
    snprintf(what, sizeof what, "reduce of %lld float32 in shared memory", (long long)n);
    ct_scope_begin();
    ct_tensor *v = ct_narrow(t, 0, 0, n), *x = inexact_input(n);
    ct_copy_(v, x);
    int root = size_ - 1;
    uint64_t before = direct_count(c);
    bool want = ct_comm_backend(c) == CT_BACKEND_SHM;
    if (check_rc(what, ct_comm_reduce(c, v, CT_REDUCE_SUM, root, NULL))) {
        if (direct_count(c) - before != (want ? 1u : 0u))
            tt_fail(__FILE__, __LINE__, "%s: ran %s", what,
                    direct_count(c) > before ? "straight on shared memory" : "the usual path");
        ct_tensor *got = ct_clone(v);
        ct_copy_(v, x);
        if (check_rc(what, ct_comm_allreduce(c, v, CT_REDUCE_SUM, NULL))) {
            double apart = rank_ == root ? apart_by(got, v) : apart_by(got, x);
            if (apart > (want || rank_ != root ? 0 : 1e-5))
                tt_fail(__FILE__, __LINE__, "%s: rank %d's buffer is %g from what it should hold",
                        what, rank_, apart);
        }
    }
    ct_copy_(v, ct_zeros(1, &n, CT_FLOAT32));
    ct_scope_end();
}

static void check_shared_reduce_scatter(ct_comm *c, ct_tensor *t, int64_t n) {
    char what[96];
    snprintf(what, sizeof what, "reduce_scatter of %lld float32 a rank from shared memory",
             (long long)n);
    ct_scope_begin();
    int64_t total = n * size_;
    ct_tensor *v = ct_narrow(t, 0, 0, total);
    ct_tensor *x = inexact_input(total);
    ct_copy_(v, x);
    ct_tensor *out = filled(n, CT_FLOAT32);
    uint64_t before = direct_count(c);
    if (!check_rc(what, ct_comm_reduce_scatter(c, out, v, CT_REDUCE_SUM, NULL))) {
        ct_scope_end();
        return;
    }
    bool want = ct_comm_backend(c) == CT_BACKEND_SHM;
    if (direct_count(c) - before != (want ? 1u : 0u))
        tt_fail(__FILE__, __LINE__, "%s: ran %s", what,
                direct_count(c) > before ? "straight on shared memory" : "the usual path");
    ct_copy_(v, x);
    if (check_rc(what, ct_comm_allreduce(c, v, CT_REDUCE_SUM, NULL))) {
        double apart = apart_by(out, ct_narrow(v, 0, rank_ * n, n));
        /* Without the direct path the two take different orders. */
        if (apart > (want ? 0 : 1e-5))
            tt_fail(__FILE__, __LINE__, "%s: its block is %g from the allreduce's", what, apart);
    }
    ct_copy_(v, ct_zeros(1, &total, CT_FLOAT32));
    ct_scope_end();
}

/* An allgather in place into ct_comm_zeros memory (n elements a rank: ZeRO's
 * gather of the parameters after a step) writes each rank's block straight
 * into the others' copies; a block outside the shared memory takes the
 * usual path. Either way every rank ends with every block. */
static void check_shared_allgather(ct_comm *c, ct_tensor *t, int64_t n, bool in_place) {
    char what[96];
    snprintf(what, sizeof what, "allgather of %lld float32 a rank into shared memory%s",
             (long long)n, in_place ? ", in place" : " from a private block");
    ct_scope_begin();
    int64_t total = n * size_;
    ct_tensor *all = ct_narrow(t, 0, 0, total);
    ct_tensor *mine = in_place ? ct_narrow(all, 0, rank_ * n, n) : ct_empty(1, &n, CT_FLOAT32);
    ct_copy_(mine, ct_add_scalar(ct_arange(0, (double)n, 1, CT_FLOAT32), 1000.0 * rank_));
    uint64_t before = direct_count(c);
    if (check_rc(what, ct_comm_allgather(c, all, mine, NULL))) {
        for (int r = 0; r < size_; r++) {
            ct_tensor *want = ct_add_scalar(ct_arange(0, (double)n, 1, CT_FLOAT32), 1000.0 * r);
            double apart =
                ct_item(ct_amax(ct_abs(ct_sub(ct_narrow(all, 0, r * n, n), want)), NULL, 0, false));
            if (apart != 0)
                tt_fail(__FILE__, __LINE__, "%s: rank %d's block is off by %g", what, r, apart);
        }
    }
    bool want = ct_comm_backend(c) == CT_BACKEND_SHM;
    if (direct_count(c) - before != (want ? 1u : 0u))
        tt_fail(__FILE__, __LINE__, "%s: ran %s", what,
                direct_count(c) > before ? "straight on shared memory" : "the usual path");
    ct_copy_(all, ct_zeros(1, &total, CT_FLOAT32));
    ct_scope_end();
}

/* ct_comm_zeros memory: allreduce straight from the peers' memory when every
 * rank passes the same view of it, the usual path when not, and the
 * allocation's own checks. */
static void check_shared(ct_comm *c) {
    enum { N = 40000, PAD = 128 }; /* room for views at rank x 16 on up to 8 ranks */
    ct_tensor *t = ct_comm_zeros(c, 1, (int64_t[]){N + PAD}, CT_FLOAT32);
    ct_tensor *h = ct_comm_zeros(c, 2, (int64_t[]){2, N}, CT_BFLOAT16);
    if (!check_rc("comm_zeros", t && h ? 0 : ct_errcode()))
        return;
    if (ct_tensor_dtype(h) != CT_BFLOAT16 || ct_ndim(h) != 2 || ct_size(h, 1) != N)
        tt_fail(__FILE__, __LINE__, "comm_zeros made the wrong shape or dtype");
    check_shared_allreduce(c, "in shared memory", true, t, 0, N + PAD, CT_FLOAT32, CT_REDUCE_SUM);
    check_shared_allreduce(c, "in a shared view", true, t, PAD / 2, N, CT_FLOAT32, CT_REDUCE_AVG);
    check_shared_allreduce(c, "again, at the next seq", true, t, PAD / 2, N, CT_FLOAT32,
                           CT_REDUCE_MAX);
    check_shared_allreduce(c, "of 16-bit floats in shared memory", true,
                           ct_view(h, 1, (int64_t[]){2 * N}), N / 2, N, CT_BFLOAT16, CT_REDUCE_AVG);
    /* Blocks of 128 KiB and more a rank on up to 8 ranks: past the
     * bulletins' 64 KiB, which every small collective takes. */
    enum { SHARED_BIG = 8 * 32768 };
    ct_tensor *big = ct_comm_zeros(c, 1, (int64_t[]){SHARED_BIG}, CT_FLOAT32);
    if (check_rc("comm_zeros of 1 MiB", big ? 0 : ct_errcode())) {
        check_shared_reduce_scatter(c, big, SHARED_BIG / size_);
        check_shared_reduce(c, big, SHARED_BIG / size_);
        check_shared_allgather(c, big, SHARED_BIG / size_, true);
        check_shared_allgather(c, big, SHARED_BIG / size_, false);
    }
    ct_tensor *ints = ct_comm_zeros(c, 1, (int64_t[]){N}, CT_INT32);
    if (check_rc("comm_zeros of int32", ints ? 0 : ct_errcode()))
        check_shared_allreduce(c, "of int32 in shared memory", true, ints, 0, N, CT_INT32,
                               CT_REDUCE_PROD);
    /* Views at different places, and shared memory on one rank only: the
     * ring path, with the same results. */
    check_shared_allreduce(c, "at a different place on each rank", false, t, rank_ * 16, N,
                           CT_FLOAT32, CT_REDUCE_SUM);
    check_shared_allreduce(c, "in shared memory on rank 0 only", false, rank_ ? NULL : t, 0, N,
                           CT_FLOAT32, CT_REDUCE_SUM);
    ct_tensor *empty = ct_comm_zeros(c, 1, (int64_t[]){0}, CT_FLOAT64);
    if (check_rc("comm_zeros of 0 elements", empty ? 0 : ct_errcode()) && ct_numel(empty) != 0)
        tt_fail(__FILE__, __LINE__, "comm_zeros of 0 elements made %lld",
                (long long)ct_numel(empty));
    /* A rank that cannot make its segment (its file size limit stops it
     * here, as a full /dev/shm would) leaves every rank with private
     * memory, which works the same. */
    bool limited = rank_ == size_ - 1;
    struct rlimit fsize;
    getrlimit(RLIMIT_FSIZE, &fsize);
    if (limited) {
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &(struct rlimit){4096, fsize.rlim_max});
    }
    ct_tensor *priv = ct_comm_zeros(c, 1, (int64_t[]){N}, CT_FLOAT32);
    if (limited) {
        setrlimit(RLIMIT_FSIZE, &fsize);
        signal(SIGXFSZ, SIG_DFL);
    }
    if (check_rc("comm_zeros without room on the last rank", priv ? 0 : ct_errcode()))
        check_shared_allreduce(c, "after comm_zeros fell back to private memory", false, priv, 0, N,
                               CT_FLOAT32, CT_REDUCE_SUM);
    char mine[64];
    snprintf(mine, sizeof mine, "rank %d for %d float32", rank_, 100 + rank_);
    ct_tensor *bad = ct_comm_zeros(c, 1, (int64_t[]){100 + rank_}, CT_FLOAT32);
    check_fails("comm_zeros of different sizes", bad ? 0 : ct_errcode(), CT_EINVAL,
                "ask for different", mine);
}

/* The sum over a communicator of one int64 per rank. */
static int64_t sum_over(ct_comm *c, int64_t value, const char *what) {
    ct_tensor *t = ct_full(1, (int64_t[]){1}, (double)value, CT_INT64);
    return check_rc(what, ct_comm_allreduce(c, t, CT_REDUCE_SUM, NULL)) ? ct_item_int64(t) : -1;
}

static void check_int_(int line, const char *what, int64_t got, int64_t want) {
    if (got != want)
        tt_fail(__FILE__, line, "%s: %lld, expected %lld", what, (long long)got, (long long)want);
}
#define check_int(what, got, want) check_int_(__LINE__, what, got, want)

static void check_split(ct_comm *c) {
    /* Even and odd ranks, keyed by rank. */
    ct_comm *sub = NULL;
    int color = rank_ % 2;
    if (check_rc("split into even and odd ranks", ct_comm_split(c, color, rank_, &sub)) && sub) {
        int64_t want = 0;
        for (int r = color; r < size_; r += 2)
            want += r;
        check_int("size of the parity group", ct_comm_size(sub), (size_ + 1 - color) / 2);
        check_int("rank in the parity group", ct_comm_rank(sub), rank_ / 2);
        /* A hierarchical communicator splits its flat one (gloo here). */
        ct_backend want_backend =
            ct_comm_backend(c) == CT_BACKEND_HIER ? CT_BACKEND_GLOO : ct_comm_backend(c);
        check_int("parity group's backend", ct_comm_backend(sub), want_backend);
        check_int("sum of world ranks over the parity group", sum_over(sub, rank_, "allreduce"),
                  want);
    } else if (!sub) {
        tt_fail(__FILE__, __LINE__, "split into even and odd ranks gave no communicator");
    }
    ct_comm_free(sub);

    /* One group, ordered by a key that reverses the ranks, and rank 0 left
     * out of it. */
    sub = NULL;
    color = rank_ == 0 ? CT_COMM_SPLIT_NONE : 7;
    if (check_rc("split leaving rank 0 out", ct_comm_split(c, color, -rank_, &sub))) {
        if (rank_ == 0 && sub)
            tt_fail(__FILE__, __LINE__, "split with CT_COMM_SPLIT_NONE gave a communicator");
        if (rank_ != 0 && !sub)
            tt_fail(__FILE__, __LINE__, "split leaving rank 0 out gave rank %d nothing", rank_);
        if (sub) {
            check_int("size of the group without rank 0", ct_comm_size(sub), size_ - 1);
            check_int("rank in the reversed group", ct_comm_rank(sub), size_ - 1 - rank_);
            ct_tensor *t = ct_full(1, (int64_t[]){1}, rank_, CT_INT64);
            if (check_rc("broadcast in the reversed group", ct_comm_broadcast(sub, t, 0, NULL)))
                check_int("broadcast from the reversed group's rank 0", ct_item_int64(t),
                          size_ - 1);
        }
    }
    ct_comm_free(sub);
    /* The parent goes on working. */
    check_int("sum of world ranks after the splits", sum_over(c, rank_, "allreduce"),
              (int64_t)size_ * (size_ - 1) / 2);
}

/* A process group of the last rank and rank 0, in that order. */
static void check_new_group(ct_comm *c) {
    const int members[2] = {size_ - 1, 0};
    ct_comm *g = NULL;
    bool member = rank_ == 0 || rank_ == size_ - 1;
    if (!check_rc("ct_dist_new_group", ct_dist_new_group(members, 2, &g)))
        return;
    if (member != (g != NULL))
        tt_fail(__FILE__, __LINE__, "rank %d is %sa member but got %s", rank_, member ? "" : "not ",
                g ? "a group" : "none");
    if (g) {
        check_int("size of the group", ct_comm_size(g), 2);
        check_int("rank in the group", ct_comm_rank(g), rank_ == size_ - 1 ? 0 : 1);
        check_int("sum over the group", sum_over(g, rank_ + 1, "allreduce"), size_ + 1);
    }
    ct_comm_free(g);
    check_rc("barrier after the group", ct_comm_barrier(c, NULL));
}

TEST(correctness) {
    static const struct {
        const char *name;
        void (*fn)(ct_comm *);
    } checks[] = {
        {"allreduce", check_allreduce},
        {"broadcast", check_broadcast},
        {"reduce", check_reduce},
        {"allgather", check_allgather},
        {"reduce_scatter", check_reduce_scatter},
        {"alltoall", check_alltoall},
        {"barrier", check_barrier},
        {"send_recv", check_send_recv},
        {"large", check_large},
        {"noncontiguous", check_noncontiguous},
        {"async", check_async},
        {"inplace_allgather", check_inplace_allgather},
        {"split", check_split},
        {"new_group", check_new_group},
        {"shared", check_shared},
    };
    ct_comm *c = join(20);
    if (!c)
        return;
    for (size_t k = 0; k < sizeof checks / sizeof *checks; k++) {
        double t0 = tt_now();
        ct_scope_begin();
        checks[k].fn(c);
        ct_scope_end();
        printf("rank %d: %s %s in %.2f s\n", rank_, checks[k].name,
               tt_failed() ? "FAILED" : "passed", tt_now() - t0);
        fflush(stdout);
        /* A rank that stops here exits non-zero, and the launcher stops the
         * others. */
        if (tt_failed())
            break;
    }
    ct_dist_finalize();
}

/* ---------------------------------------------------- failure scenarios */

/* After the communicator failed, the next call fails at once, with
 * CT_ESTATE or the first error again, and its message names what the
 * first one did (each of the NULL-ended subs, and rank `names`, if >= 0). */
static void check_later_calls_fail(ct_comm *c, int first, const char *const *subs, int names) {
    double t0 = tt_now();
    int rc = ct_comm_barrier(c, NULL);
    double took = tt_now() - t0;
    if (rc != CT_ESTATE && rc != first)
        tt_fail(__FILE__, __LINE__,
                "a barrier after the failure returned %s, expected CT_ESTATE or %s: %s",
                ct_errname(rc), ct_errname(first), ct_errmsg());
    if (took > 1.0)
        tt_fail(__FILE__, __LINE__, "a barrier after the failure took %.2f s to fail", took);
    for (; *subs; subs++)
        if (!strstr(ct_errmsg(), *subs))
            tt_fail(__FILE__, __LINE__, "the later failure \"%s\" does not repeat \"%s\"",
                    ct_errmsg(), *subs);
    if (names >= 0)
        check_tt_names_rank("the later failure", ct_errmsg(), names);
}

/* An allreduce sum of t meant to fail: how long it took in *took, and what
 * it said on stdout, for the driver's log. */
static int timed_allreduce(ct_comm *c, ct_tensor *t, double *took) {
    double t0 = tt_now();
    int rc = ct_comm_allreduce(c, t, CT_REDUCE_SUM, NULL);
    *took = tt_now() - t0;
    printf("rank %d: after %.2f s: %s\n", rank_, *took, ct_errmsg());
    return rc;
}

/* in: shared memory (ct_comm_zeros) for t, so that the allreduce runs the
 * direct path, or a tensor of its own. */
static ct_tensor *scenario_tensor(ct_comm *c, bool shared, int64_t n, int64_t len, ct_dtype dt) {
    if (!shared)
        return ct_zeros(1, &len, dt);
    ct_tensor *t = ct_comm_zeros(c, 1, &n, dt);
    return t ? ct_narrow(t, 0, 0, len) : NULL;
}

static void run_peer_killed(bool shared) {
    /* ctlaunch SIGTERMs the other ranks as soon as it sees one die. The
     * survivors ignore SIGTERM, to live long enough to report what their
     * allreduce said and exit on their own; the driver gives ctlaunch a
     * --grace long enough for that, and SIGKILL ends them after it. Ignoring
     * is process-wide, which blocking is not: threads that libraries start
     * when they load (OpenBLAS's pool) would still take the signal. */
    signal(SIGTERM, SIG_IGN);
    const double timeout = 10;
    ct_comm *c = join(timeout);
    if (!c)
        return;
    const int victim = size_ - 1;
    ct_tensor *t = scenario_tensor(c, shared, LARGE, LARGE, CT_FLOAT32);
    if (!check_rc("the tensor", t ? 0 : ct_errcode()))
        return;
    ct_copy_(t, input_tensor(rank_, 0, LARGE, CT_FLOAT32, CT_REDUCE_SUM));
    check_rc("barrier", ct_comm_barrier(c, NULL));
    if (rank_ == victim) {
        /* On the ring: let it get going, then die in the middle of it. The
         * direct path can finish a rank's part within that time, so there
         * the victim dies without arriving, and the others fail waiting for
         * it to publish its operation. */
        ct_work *w = NULL;
        if (!shared)
            check_rc("allreduce", ct_comm_allreduce(c, t, CT_REDUCE_SUM, &w));
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        raise(SIGKILL);
    }
    double took;
    int rc = timed_allreduce(c, t, &took);
    if (check_fails("allreduce with a dead peer", rc, CT_EPEER, "allreduce")) {
        check_tt_names_rank("allreduce with a dead peer", ct_errmsg(), victim);
        /* The death was noticed, not waited out. */
        if (took > timeout / 2)
            tt_fail(__FILE__, __LINE__, "the dead peer was noticed after %.2f s", took);
        check_later_calls_fail(c, CT_EPEER, (const char *const[]){NULL}, victim);
    }
    ct_dist_finalize();
}

/* Under mpirun with every rank on this machine, auto picks shm. */
TEST(auto_backend) {
    ct_comm *c = join(10);
    if (!c)
        return;
    if (ct_comm_backend(c) != CT_BACKEND_SHM)
        tt_fail(__FILE__, __LINE__, "auto picked %s on one machine, not shm",
                ct_backend_name(ct_comm_backend(c)));
    check_allreduce_of(c, 1000, CT_FLOAT32, CT_REDUCE_SUM);
    ct_dist_finalize();
}

TEST(loopback) {
    ct_comm *c = join(10);
    if (!c)
        return;
    int listeners = tt_listeners_on_loopback(rank_);
    bool hosts_store = rank_ == 0 && getenv("OMPI_COMM_WORLD_RANK");
    if (hosts_store && listeners == 0)
        tt_fail(__FILE__, __LINE__, "rank 0 hosts the store but no listener of its was found");
    check_allreduce_of(c, 100, CT_FLOAT32, CT_REDUCE_SUM);
    ct_dist_finalize();
}

/* Under mpirun with one rank on each host of the test cluster
 * (tests/ci/test_mpirun_cluster.sh), auto picks mpi, and under ctlaunch or
 * torchrun gloo (test_ctlaunch_cluster.sh); each rank is alone on its
 * machine, and the large allreduce (12 MiB each way) crosses
 * the links, where the driver counts the bytes. */
TEST(across_hosts) {
    ct_comm *c = join(30);
    if (!c)
        return;
    const ct_world *w = ct_dist_world();
    /* ct's own rendezvous (ctlaunch, torchrun) runs gloo, MPI's mpi. */
    ct_backend want = w->master_port > 0 ? CT_BACKEND_GLOO : CT_BACKEND_MPI;
    if (ct_comm_backend(c) != want)
        tt_fail(__FILE__, __LINE__, "auto picked %s with one rank per host under %s, not %s",
                ct_backend_name(ct_comm_backend(c)), ct_world_source_name(w->source),
                ct_backend_name(want));
    if (w->local_size != 1 || w->local_rank != 0)
        tt_fail(__FILE__, __LINE__, "local rank %d of %d: the world has ranks sharing a host",
                w->local_rank, w->local_size);
    check_allreduce_of(c, LARGE, CT_FLOAT32, CT_REDUCE_SUM);
    ct_dist_finalize();
}

TEST(peer_killed) { run_peer_killed(false); }
TEST(peer_killed_shared) { run_peer_killed(true); }

/* Every rank but rank 1 calls an allreduce of n elements of dt, rank 1 one
 * of n1 elements of dt1; every rank fails with a message naming both
 * sides. */
static void run_mismatch(bool shared, int64_t n, ct_dtype dt, int64_t n1, ct_dtype dt1,
                         const char *side, const char *side1) {
    const double timeout = 10;
    ct_comm *c = join(timeout);
    if (!c)
        return;
    int64_t most = n > n1 ? n : n1;
    ct_tensor *t = rank_ == 1 ? scenario_tensor(c, shared, most, n1, dt1)
                              : scenario_tensor(c, shared, most, n, dt);
    double took;
    int rc = timed_allreduce(c, t, &took);
    if (check_fails("mismatched allreduce", rc, CT_EMISMATCH, "allreduce", side, side1)) {
        if (took > timeout / 2)
            tt_fail(__FILE__, __LINE__, "the mismatch was noticed after %.2f s", took);
        check_later_calls_fail(c, CT_EMISMATCH, (const char *const[]){side, side1, NULL}, -1);
    }
    ct_dist_finalize();
}

/* The thread ids of this process, into tids (up to cap): how many. */
static int thread_ids(long *tids, int cap) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < cap;)
        if (e->d_name[0] != '.')
            tids[n++] = atol(e->d_name);
    if (d)
        closedir(d);
    return n;
}

/* Whether thread tid blocks SIGPIPE, from its SigBlk mask. */
static bool blocks_sigpipe(long tid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/task/%ld/status", tid);
    FILE *f = fopen(path, "r");
    unsigned long long mask = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "SigBlk: %llx", &mask) == 1)
            break;
    if (f)
        fclose(f);
    return mask & (1ull << (SIGPIPE - 1));
}

TEST(signal_masks) {
    long before[256], after[256];
    int nbefore = thread_ids(before, 256);
    ct_comm *c = join(10);
    if (!c)
        return;
    ct_tensor *t = ct_ones(CT_SHAPE(1000), CT_FLOAT32);
    check_rc("allreduce", ct_comm_allreduce(c, t, CT_REDUCE_SUM, NULL));
    int nafter = thread_ids(after, 256), started = 0;
    for (int i = 0; i < nafter; i++) {
        bool old = false;
        for (int j = 0; j < nbefore; j++)
            old |= after[i] == before[j];
        if (old)
            continue;
        started++;
        if (!blocks_sigpipe(after[i]))
            tt_fail(__FILE__, __LINE__, "thread %ld, started by joining, takes SIGPIPE", after[i]);
    }
    if (started == 0)
        tt_fail(__FILE__, __LINE__, "joining started no thread to check");
    ct_dist_finalize();
}

TEST(count_mismatch) {
    run_mismatch(false, 100, CT_FLOAT32, 99, CT_FLOAT32, "100 elements", "99 elements");
}

/* Both in the same shared memory: the direct path's check. */
TEST(count_mismatch_shared) {
    run_mismatch(true, 40000, CT_FLOAT32, 39999, CT_FLOAT32, "40000 elements", "39999 elements");
}

TEST(dtype_mismatch) { run_mismatch(false, 100, CT_FLOAT64, 100, CT_INT32, "float64", "int32"); }

TEST(op_mismatch) {
    const double timeout = 10;
    ct_comm *c = join(timeout);
    if (!c)
        return;
    ct_tensor *t = ct_zeros(1, (int64_t[]){100}, CT_FLOAT32);
    double t0 = tt_now();
    int rc = rank_ == 1 ? ct_comm_broadcast(c, t, 0, NULL)
                        : ct_comm_allreduce(c, t, CT_REDUCE_SUM, NULL);
    double took = tt_now() - t0;
    printf("rank %d: after %.2f s: %s\n", rank_, took, ct_errmsg());
    if (check_fails("allreduce against a broadcast", rc, CT_EMISMATCH, "allreduce", "broadcast",
                    "operation")) {
        if (took > timeout / 2)
            tt_fail(__FILE__, __LINE__, "the mismatch was noticed after %.2f s", took);
        check_later_calls_fail(c, CT_EMISMATCH, (const char *const[]){"broadcast", NULL}, -1);
    }
    ct_dist_finalize();
}

/* The README's error path (print, finalize, return) must not hang on a
 * peer that hangs: after their allreduce times out, the others' finalize
 * returns within the timeout, while the stuck rank sleeps on, well past
 * it, before it finalizes too. */
TEST(stuck_peer) {
    const double timeout = 2, stuck_for = 4 * timeout + 2;
    ct_comm *c = join(20);
    if (!c || !check_rc("ct_comm_set_timeout", ct_comm_set_timeout(c, timeout)))
        return;
    const int stuck = size_ - 1;
    check_rc("barrier", ct_comm_barrier(c, NULL));
    if (rank_ == stuck) {
        nanosleep(&(struct timespec){(time_t)stuck_for, 0}, NULL);
        ct_dist_finalize();
        return;
    }
    ct_tensor *t = ct_zeros(1, (int64_t[]){100}, CT_FLOAT32);
    double took;
    int rc = timed_allreduce(c, t, &took);
    /* Timed out here, or on the other waiting rank first, which fails the
     * group: either way the allreduce failed, which is what finalize
     * follows. */
    if (rc == CT_EPEER)
        check_fails("allreduce with a stuck peer", rc, CT_EPEER, "allreduce", "timed out");
    else
        check_fails("allreduce with a stuck peer", rc, CT_ETIMEDOUT, "allreduce");
    double t0 = tt_now();
    ct_dist_finalize();
    double fin = tt_now() - t0;
    printf("rank %d: ct_dist_finalize returned after %.2f s\n", rank_, fin);
    if (fin > timeout + 1)
        tt_fail(__FILE__, __LINE__,
                "ct_dist_finalize took %.2f s after a timed-out allreduce, with a timeout of "
                "%.1f s: it waited for the stuck rank",
                fin, timeout);
}

TEST(late_rank) {
    const double timeout = 2, late_by = 3.5;
    ct_comm *c = join(20);
    if (!c || !check_rc("ct_comm_set_timeout", ct_comm_set_timeout(c, timeout)))
        return;
    const int late = size_ - 1;
    check_rc("barrier", ct_comm_barrier(c, NULL));
    ct_comm_stats stats;
    ct_comm_stats_get(c, &stats);
    char seq[32];
    snprintf(seq, sizeof seq, "#%llu", (unsigned long long)stats.issued + 1);
    ct_tensor *t = ct_zeros(1, (int64_t[]){100}, CT_FLOAT32);
    if (rank_ == late)
        nanosleep(&(struct timespec){(time_t)late_by, (long)((late_by - (int)late_by) * 1e9)},
                  NULL);
    double took;
    int rc = timed_allreduce(c, t, &took);
    if (rank_ == late) {
        /* The others gave up on it long ago: its call fails well within
         * its own timeout. */
        if (rc != CT_EPEER && rc != CT_ESTATE && rc != CT_ETIMEDOUT)
            tt_fail(__FILE__, __LINE__, "the late rank's allreduce returned %s: %s", ct_errname(rc),
                    ct_errmsg());
        if (took > timeout / 2)
            tt_fail(__FILE__, __LINE__, "the late rank's allreduce took %.2f s to fail", took);
        ct_dist_finalize();
        return;
    }
    /* Hierarchical: the rank that waits for the late one times out, and
     * the other machines' ranks learn it from their peer there. */
    bool relayed = rc == CT_EPEER && ct_comm_backend(c) == CT_BACKEND_HIER;
    int want = relayed ? CT_EPEER : CT_ETIMEDOUT;
    const char *says = relayed ? "timed out" : seq;
    if (check_fails("allreduce with a late rank", rc, want, "allreduce", says)) {
        check_tt_names_rank("allreduce with a late rank", ct_errmsg(), late);
        if (took < timeout * 0.9 || took > timeout + 3)
            tt_fail(__FILE__, __LINE__,
                    "the allreduce timed out after %.2f s, with a timeout of %.1f s", took,
                    timeout);
        check_later_calls_fail(c, want, (const char *const[]){"allreduce", says, NULL}, late);
    }
    ct_dist_finalize();
}
