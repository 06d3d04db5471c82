/* The program each rank of test_ckpt_dist runs under ctlaunch. The
 * scenario is named on the command line, the checkpoint directory in
 * CKPT_DIR:
 *
 *   reshard_save     saves a state whose tensors each rank holds a block of,
 *                    in a blocking that depends on the world size, beside
 *                    replicated and per-rank entries
 *   reshard_load     loads it in another world size and another blocking
 *                    (CKPT_SAVED_RANKS says how many saved it): every rank
 *                    gets exactly the elements of its block. At another
 *                    world size, asking for the per-rank entries fails on
 *                    every rank first, naming them
 *   disagree         rank 1 adds "w" as float64, rank 0 as float32: the save
 *                    fails on every rank, naming both
 *   overlap          two ranks add the same block: the save fails on every
 *                    rank, saying the blocks overlap
 *   peer_dies        the last rank SIGKILLs itself instead of saving: the
 *                    others' save fails with CT_EPEER naming it, promptly
 *   resume           data-parallel training (dropout, SGD with momentum, a
 *                    shuffling sampler) checkpointed in the background every
 *                    SAVE_EVERY steps. In the first run (CT_RESTART_COUNT 0)
 *                    the last rank dies at step CRASH_AT; ctlaunch restarts
 *                    the job, which resumes from the newest checkpoint and
 *                    trains to TOTAL steps. The parameters must then equal,
 *                    bit for bit, those of TOTAL steps trained without a
 *                    break, which every rank computes itself afterwards.
 *
 * Every rank prints "pid=<pid>" first so that the driver can check that none
 * is left behind. */
#include "ct_test.h"
#include "tt_rank.h"

#include <ct/checkpoint.h>
#include <ct/data.h>
#include <ct/dist.h>
#include <ct/optim.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

/* Seconds for rendezvous and every collective: far above what a step
 * takes, far below the driver's deadline. */
#define TIMEOUT 10.0
/* The sharded tensors: w [W_ROWS, W_COLS] holds row * 100 + col, v [V_LEN]
 * holds 3 * i - 5. */
#define W_ROWS 7
#define W_COLS 10
#define V_LEN  13
/* resume: steps in all, checkpoint interval, the step the first run dies
 * at, rows of data, per-rank batch, model size. */
#define TOTAL      24
#define SAVE_EVERY 5
#define CRASH_AT   13
#define ROWS       96
#define BATCH      4
#define IN         8
#define HIDDEN     16
#define OUT        3
#define SEED       500

static int rank_, size_;
static ct_comm *comm_;

static bool join(void) { return (comm_ = tt_rank_join(TIMEOUT, &rank_, &size_)) != NULL; }

static const char *ckpt_dir(void) {
    const char *d = getenv("CKPT_DIR");
    if (!d)
        tt_fail(__FILE__, __LINE__, "CKPT_DIR is not set");
    return d;
}

/* Expects rc to be code with a message holding each of subs (NULL-ended). */
static bool check_fails(const char *what, int rc, int code, const char *const *subs) {
    if (rc != code) {
        tt_fail(__FILE__, __LINE__, "%s returned %s, expected %s: %s", what, ct_errname(rc),
                ct_errname(code), ct_errmsg());
        return false;
    }
    for (int i = 0; subs[i]; i++)
        if (!strstr(ct_errmsg(), subs[i])) {
            tt_fail(__FILE__, __LINE__, "%s: '%s' does not say '%s'", what, ct_errmsg(), subs[i]);
            return false;
        }
    printf("rank %d: %s failed as expected: %s\n", rank_, what, ct_errmsg());
    return true;
}

/* ------------------------------------------------------------- reshard */

/* Rank r's block of w in a world of n: rows split in two (n = 2: a row
 * block each; n = 4: a 2 x 2 grid of row and column blocks), columns split
 * when loading in 2 (cols), rows in three parts for 3. */
typedef struct block {
    int64_t off[2], len[2];
} block;

static block w_block(int r, int n, bool cols) {
    block b = {{0, 0}, {W_ROWS, W_COLS}};
    int dim = cols ? 1 : 0, parts = n == 4 ? 2 : n;
    int part = n == 4 ? r / 2 : r;
    int64_t extent = dim ? W_COLS : W_ROWS;
    b.off[dim] = extent * part / parts;
    b.len[dim] = extent * (part + 1) / parts - b.off[dim];
    if (n == 4) {
        b.off[1] = (r % 2) * (W_COLS / 2);
        b.len[1] = W_COLS / 2;
    }
    return b;
}

/* Entries every reshard scenario has; per_rank adds the per-rank ones. The
 * tensors are caller-owned. */
typedef struct reshard_state {
    ct_state *st;
    ct_tensor *w, *v, *r, *own, *w_base;
    int64_t step;
    ct_generator gen;
} reshard_state;

static void reshard_free(reshard_state *s) {
    ct_state_free(s->st);
    ct_tensor *ts[] = {s->w, s->v, s->r, s->own, s->w_base};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        ct_tensor_free(ts[i]);
}

/* s's entries: w and v sharded, the rest whole, own and rng per rank when
 * per_rank. */
static int reshard_add(reshard_state *s, const block *b, int64_t v0, bool per_rank) {
    CT_TRY(ct_state_add_shard(s->st, "w", s->w, 2, (int64_t[]){W_ROWS, W_COLS}, b->off));
    CT_TRY(ct_state_add_shard(s->st, "v", s->v, 1, (int64_t[]){V_LEN}, &v0));
    CT_TRY(ct_state_add_tensor(s->st, "r", s->r, CT_STATE_REPLICATED));
    CT_TRY(ct_state_add_i64(s->st, "step", &s->step, CT_STATE_REPLICATED));
    if (per_rank) {
        CT_TRY(ct_state_add_tensor(s->st, "own", s->own, CT_STATE_PER_RANK));
        CT_TRY(ct_state_add_generator(s->st, "rng", &s->gen, CT_STATE_PER_RANK));
    }
    return 0;
}

/* The state of this rank, filled with the true values (fill) or with -1. On
 * rank 0 w's block is a transposed view, so that saving and loading go
 * through non-contiguous memory. */
static bool reshard_build(reshard_state *s, bool cols, bool fill, bool per_rank) {
    *s = (reshard_state){.st = ct_state_new()};
    block b = w_block(rank_, size_, cols);
    if (rank_ == 0) {
        s->w_base = ct_keep(ct_full(CT_SHAPE(b.len[1], b.len[0]), -1, CT_FLOAT32));
        s->w = ct_keep(ct_transpose(s->w_base, 0, 1));
    } else {
        s->w = ct_keep(ct_full(CT_SHAPE(b.len[0], b.len[1]), -1, CT_FLOAT32));
    }
    int64_t v0 = V_LEN * rank_ / size_, v1 = V_LEN * (rank_ + 1) / size_;
    s->v = ct_keep(ct_full(CT_SHAPE(v1 - v0), -1, CT_INT64));
    s->r = ct_keep(ct_full(CT_SHAPE(3, 3), -1, CT_BFLOAT16));
    s->own = ct_keep(ct_full(CT_SHAPE(2), -1, CT_INT64));
    s->step = -1;
    if (fill) {
        for (int64_t i = 0; i < b.len[0]; i++)
            for (int64_t j = 0; j < b.len[1]; j++)
                ct_copy_(ct_narrow(ct_narrow(s->w, 0, i, 1), 1, j, 1),
                         ct_scalar((double)((b.off[0] + i) * 100 + b.off[1] + j), CT_FLOAT32));
        for (int64_t i = v0; i < v1; i++)
            ct_copy_(ct_narrow(s->v, 0, i - v0, 1), ct_scalar((double)(3 * i - 5), CT_INT64));
        ct_copy_(s->r, ct_view(ct_arange(0, 9, 1, CT_BFLOAT16), CT_SHAPE(3, 3)));
        ct_copy_(s->own, ct_scalar(rank_ * 10 + size_, CT_INT64));
        s->step = 77;
        s->gen = (ct_generator){1000 + (uint64_t)rank_, 7 * (uint64_t)rank_};
    }
    int rc = reshard_add(s, &b, v0, per_rank);
    TT_CHECK_RC("building the state", rc);
    return rc == 0;
}

/* Checks every element of this rank's blocks against the formula. */
static void reshard_check(const reshard_state *s, bool cols, bool per_rank) {
    block b = w_block(rank_, size_, cols);
    for (int64_t i = 0; i < b.len[0]; i++)
        for (int64_t j = 0; j < b.len[1]; j++) {
            double got = ct_get(s->w, (int64_t[]){i, j});
            double want = (double)((b.off[0] + i) * 100 + b.off[1] + j);
            if (got != want) {
                tt_fail(__FILE__, __LINE__, "w[%lld, %lld] is %g, want %g",
                        (long long)(b.off[0] + i), (long long)(b.off[1] + j), got, want);
                return;
            }
        }
    int64_t v0 = V_LEN * rank_ / size_;
    for (int64_t i = 0; i < ct_numel(s->v); i++)
        if (ct_get(s->v, &i) != (double)(3 * (v0 + i) - 5)) {
            tt_fail(__FILE__, __LINE__, "v[%lld] is %g", (long long)(v0 + i), ct_get(s->v, &i));
            return;
        }
    for (int64_t i = 0; i < 9; i++)
        if (ct_get(s->r, (int64_t[]){i / 3, i % 3}) != (double)i) {
            tt_fail(__FILE__, __LINE__, "r[%lld] is wrong", (long long)i);
            return;
        }
    if (s->step != 77)
        tt_fail(__FILE__, __LINE__, "step is %lld", (long long)s->step);
    if (per_rank && (ct_get(s->own, (int64_t[]){1}) != rank_ * 10 + size_ ||
                     s->gen.seed != 1000 + (uint64_t)rank_ || s->gen.offset != 7 * (uint64_t)rank_))
        tt_fail(__FILE__, __LINE__, "the per-rank entries of rank %d are not its own", rank_);
}

static void checkpoint_path(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", ckpt_dir(), name);
}

TEST(reshard_save) {
    if (!join())
        return;
    reshard_state s;
    if (reshard_build(&s, false, true, true)) {
        char path[512];
        checkpoint_path(path, sizeof path, "reshard");
        ct_state_set_meta(s.st, "saved_by", "ckpt_rank");
        TT_CHECK_RC("ct_checkpoint_save", ct_checkpoint_save(path, s.st, comm_, NULL));
    }
    reshard_free(&s);
    ct_dist_finalize();
}

TEST(reshard_load) {
    if (!join())
        return;
    const char *saved = getenv("CKPT_SAVED_RANKS");
    int saved_ranks = saved ? atoi(saved) : size_;
    bool cols = size_ == 2;
    char path[512];
    checkpoint_path(path, sizeof path, "reshard");
    reshard_state s;
    if (saved_ranks != size_ && reshard_build(&s, cols, false, true)) {
        char n[32];
        snprintf(n, sizeof n, "saved by %d ranks", saved_ranks);
        check_fails("loading per-rank entries into another world size",
                    ct_checkpoint_load(path, s.st, comm_), CT_EINVAL,
                    (const char *const[]){"per-rank", n, "valid only", NULL});
        reshard_free(&s);
    }
    bool per_rank = saved_ranks == size_;
    if (!tt_failed() && reshard_build(&s, cols, false, per_rank)) {
        TT_CHECK_RC("ct_checkpoint_load", ct_checkpoint_load(path, s.st, comm_));
        if (!tt_failed())
            reshard_check(&s, cols, per_rank);
        if (!tt_failed() && strcmp(ct_state_meta(s.st, "saved_by"), "ckpt_rank"))
            tt_fail(__FILE__, __LINE__, "the metadata did not load");
        reshard_free(&s);
    }
    ct_dist_finalize();
}

TEST(disagree) {
    if (!join())
        return;
    ct_state *st = ct_state_new();
    ct_tensor *w = ct_zeros(CT_SHAPE(4), rank_ == 1 ? CT_FLOAT64 : CT_FLOAT32);
    TT_CHECK_RC("adding w", ct_state_add_tensor(st, "w", w, CT_STATE_REPLICATED));
    char path[512];
    checkpoint_path(path, sizeof path, "disagree");
    check_fails("saving tensors the ranks disagree on", ct_checkpoint_save(path, st, comm_, NULL),
                CT_EINVAL, (const char *const[]){"'w'", "float32", "float64", "rank 1", NULL});
    ct_state_free(st);
    ct_dist_finalize();
}

TEST(overlap) {
    if (!join())
        return;
    ct_state *st = ct_state_new();
    ct_tensor *w = ct_zeros(CT_SHAPE(3), CT_FLOAT32);
    TT_CHECK_RC("adding w",
                ct_state_add_shard(st, "w", w, 1, (int64_t[]){3 * (int64_t)size_}, (int64_t[]){0}));
    char path[512];
    checkpoint_path(path, sizeof path, "overlap");
    check_fails("saving overlapping blocks", ct_checkpoint_save(path, st, comm_, NULL), CT_EINVAL,
                (const char *const[]){"'w'", "overlap", NULL});
    ct_state_free(st);
    ct_dist_finalize();
}

/* ctlaunch SIGTERMs the others when one dies: they ignore it to report
 * what their save said (the driver gives a long --grace). */
TEST(peer_dies) {
    signal(SIGTERM, SIG_IGN);
    if (!join())
        return;
    ct_state *st = ct_state_new();
    ct_tensor *w = ct_zeros(CT_SHAPE(1000), CT_FLOAT32);
    TT_CHECK_RC("adding w", ct_state_add_tensor(st, "w", w, CT_STATE_REPLICATED));
    TT_CHECK_RC("barrier", ct_comm_barrier(comm_, NULL));
    if (rank_ == size_ - 1)
        raise(SIGKILL);
    char path[512], rank[32];
    checkpoint_path(path, sizeof path, "peer_dies");
    snprintf(rank, sizeof rank, "%d", size_ - 1);
    double t0 = tt_now();
    check_fails("saving with a dead peer", ct_checkpoint_save(path, st, comm_, NULL), CT_EPEER,
                (const char *const[]){rank, NULL});
    if (tt_now() - t0 > TIMEOUT / 2)
        tt_fail(__FILE__, __LINE__, "the dead peer was noticed after %.1f s", tt_now() - t0);
    ct_state_free(st);
    ct_dist_finalize();
}

/* -------------------------------------------------------------- resume */

/* A training run: model, data parallel, optimizer, loader, and the state
 * that checkpoints it. */
typedef struct run {
    ct_module *net;
    ct_ddp *ddp;
    ct_optim *opt;
    ct_loader *loader;
    ct_tensor *data, *labels;
    ct_state *st;
    int64_t step, epoch, offset;
} run;

static void run_free(run *r) {
    ct_state_free(r->st);
    ct_loader_free(r->loader);
    ct_optim_free(r->opt);
    ct_ddp_free(r->ddp);
    ct_module_free(r->net);
    ct_tensor_free(r->data);
    ct_tensor_free(r->labels);
}

/* The same model, data and RNG stream on every call; each rank's dropout
 * stream is its own. params gets the model's; run_free releases the rest
 * of what this made. */
static int run_build(run *r, ct_param_list *params) {
    ct_manual_seed(SEED);
    r->net = ct_sequential_new();
    CT_TRY(ct_sequential_append(r->net, ct_linear_new(IN, HIDDEN, true)));
    CT_TRY(ct_sequential_append(r->net, ct_relu_new()));
    CT_TRY(ct_sequential_append(r->net, ct_dropout_new(0.2)));
    CT_TRY(ct_sequential_append(r->net, ct_linear_new(HIDDEN, OUT, true)));
    ct_generator data_gen = {SEED + 1, 0};
    r->data = ct_keep(ct_randn(CT_SHAPE(ROWS, IN), CT_FLOAT32, &data_gen));
    int64_t labels[ROWS];
    for (int i = 0; i < ROWS; i++)
        labels[i] = (i * 7) % OUT;
    r->labels = ct_keep(ct_from_data(labels, CT_SHAPE(ROWS), CT_INT64));
    ct_manual_seed(SEED + 2 + (uint64_t)rank_);
    if (!(r->ddp = ct_ddp_new(comm_, r->net, NULL)))
        return ct_errcode();
    CT_TRY(ct_module_named_parameters(r->net, params));
    ct_optim_options oo = ct_optim_defaults(CT_OPTIM_SGD, 0.05);
    oo.momentum = 0.9;
    if (!(r->opt = ct_optim_new(&oo, params->tensors, params->n)))
        return ct_errcode();
    ct_sampler_options so = {
        .size = ROWS, .num_replicas = size_, .rank = rank_, .shuffle = true, .seed = SEED};
    ct_sampler sampler;
    CT_TRY(ct_sampler_init(&sampler, &so));
    ct_loader_options lo = {.batch_size = BATCH, .drop_last = true, .sampler = &sampler};
    if (!(r->loader = ct_loader_new(r->data, r->labels, &lo)))
        return ct_errcode();
    /* What a checkpoint holds: parameters, the optimizer's state and step,
     * the data position and each rank's RNG stream. */
    r->st = ct_state_new();
    for (int i = 0; i < params->n; i++)
        CT_TRY(
            ct_state_add_tensor(r->st, params->names[i], params->tensors[i], CT_STATE_REPLICATED));
    int nstates = ct_optim_num_states(r->opt);
    for (int i = 0; i < nstates; i++) {
        const char *name;
        ct_tensor *t;
        char key[128];
        CT_TRY(ct_optim_state_at(r->opt, i, &name, &t));
        snprintf(key, sizeof key, "optim.%s", name);
        CT_TRY(ct_state_add_tensor(r->st, key, t, CT_STATE_REPLICATED));
    }
    CT_TRY(ct_state_add_i64(r->st, "train.step", &r->step, CT_STATE_REPLICATED));
    CT_TRY(ct_state_add_i64(r->st, "data.epoch", &r->epoch, CT_STATE_REPLICATED));
    CT_TRY(ct_state_add_i64(r->st, "data.offset", &r->offset, CT_STATE_REPLICATED));
    CT_TRY(ct_state_add_generator(r->st, "rng", ct_default_generator(), CT_STATE_PER_RANK));
    return 0;
}

static bool run_init(run *r) {
    *r = (run){0};
    ct_param_list params;
    ct_param_list_init(&params);
    int rc = run_build(r, &params);
    ct_param_list_free(&params);
    TT_CHECK_RC("building the run", rc);
    return rc == 0;
}

/* A step's work, inside train_step's scope. */
static int step_in_scope(run *r) {
    ct_tensor *x, *y;
    int got = ct_loader_next(r->loader, &x, &y);
    if (got == 0)
        got = ct_loader_next(r->loader, &x, &y);
    CT_TRY(got);
    ct_tensor *loss = ct_cross_entropy(ct_module_forward(r->net, x), y, NULL);
    CT_TRY(loss ? ct_tensor_backward(loss) : ct_errcode());
    CT_TRY(ct_optim_step(r->opt));
    return ct_optim_zero_grad(r->opt, true);
}

static int train_step(run *r) {
    ct_scope_begin();
    int rc = step_in_scope(r);
    ct_scope_end();
    r->step++;
    return rc;
}

static int resume_from(run *r, const char *path) {
    CT_TRY(ct_checkpoint_load(path, r->st, comm_));
    CT_TRY(ct_loader_set_position(r->loader, r->epoch, r->offset));
    return ct_optim_set_step_count(r->opt, r->step);
}

static bool same_params(ct_module *a, ct_module *b) {
    ct_param_list pa, pb;
    ct_param_list_init(&pa);
    ct_param_list_init(&pb);
    bool same =
        !ct_module_named_parameters(a, &pa) && !ct_module_named_parameters(b, &pb) && pa.n == pb.n;
    for (int i = 0; same && i < pa.n; i++) {
        size_t bytes = (size_t)ct_numel(pa.tensors[i]) * 4;
        if (memcmp(ct_data_ptr(pa.tensors[i]), ct_data_ptr(pb.tensors[i]), bytes)) {
            tt_fail(__FILE__, __LINE__, "%s differs from the uninterrupted run's", pa.names[i]);
            same = false;
        }
    }
    ct_param_list_free(&pa);
    ct_param_list_free(&pb);
    return same;
}

TEST(resume) {
    if (!join())
        return;
    const char *rc_env = getenv("CT_RESTART_COUNT");
    bool restarted = rc_env && atoi(rc_env) > 0;
    char dir[512], path[600], name[32];
    snprintf(name, sizeof name, "resume-%d", size_);
    checkpoint_path(dir, sizeof dir, name);
    run r;
    ct_checkpointer *ck = ct_checkpointer_new(comm_);
    if (!ck)
        TT_CHECK_RC("ct_checkpointer_new", ct_errcode());
    if (!ck || !run_init(&r)) {
        ct_checkpointer_free(ck);
        return;
    }
    if (restarted) {
        int found = ct_checkpoint_latest(dir, path, sizeof path);
        if (found != 1)
            tt_fail(__FILE__, __LINE__, "no checkpoint to resume from in %s", dir);
        else
            TT_CHECK_RC("resuming", resume_from(&r, path));
        printf("rank %d: resumed from %s at step %lld\n", rank_, path, (long long)r.step);
    }
    TT_CHECK_RC("ct_checkpointer_reserve", ct_checkpointer_reserve(ck, r.st));
    int64_t staged = ct_checkpointer_staging_bytes(ck);
    if (staged <= 0)
        tt_fail(__FILE__, __LINE__, "ct_checkpointer_reserve reserved %lld bytes",
                (long long)staged);
    while (!tt_failed() && r.step < TOTAL) {
        if (!restarted && r.step == CRASH_AT) {
            TT_CHECK_RC("the last save", ct_checkpointer_wait(ck));
            if (rank_ == size_ - 1) {
                printf("rank %d: dying at step %d\n", rank_, CRASH_AT);
                fflush(stdout);
                _exit(1);
            }
        }
        TT_CHECK_RC("a training step", train_step(&r));
        if (r.step % SAVE_EVERY)
            continue;
        ct_loader_position(r.loader, &r.epoch, &r.offset);
        ct_checkpoint_options o = ct_checkpoint_defaults();
        o.step = r.step;
        o.keep_last = 2;
        snprintf(path, sizeof path, "%s/step-%03lld", dir, (long long)r.step);
        TT_CHECK_RC("ct_checkpointer_save", ct_checkpointer_save(ck, path, r.st, &o));
        /* The staging reserved is reused: no save grows it. */
        int64_t now = ct_checkpointer_staging_bytes(ck);
        if (now != staged)
            tt_fail(__FILE__, __LINE__, "staging grew from %lld to %lld bytes", (long long)staged,
                    (long long)now);
    }
    TT_CHECK_RC("the last save", ct_checkpointer_wait(ck));
    ct_checkpointer_free(ck);
    run ref;
    if (!tt_failed() && run_init(&ref)) {
        while (!tt_failed() && ref.step < TOTAL)
            TT_CHECK_RC("a reference step", train_step(&ref));
        if (!tt_failed() && same_params(r.net, ref.net))
            printf("rank %d: %d steps with a restart equal %d without, bit for bit\n", rank_, TOTAL,
                   TOTAL);
        run_free(&ref);
    }
    run_free(&r);
    ct_dist_finalize();
}
