#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */

#include "example_common.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double example_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int example_default_threads(int fallback) {
    const char *env = getenv("CT_NUM_THREADS");
    char *end;
    long n = env && *env ? strtol(env, &end, 10) : 0;
    /* A bad value is ct's to report (ct_get_num_threads says why once). */
    return n >= 1 && n <= EXAMPLE_MAX_THREADS && !*end ? (int)n : fallback;
}

example_options example_options_defaults(void) {
    return (example_options){.epochs = 10,
                             .threads = example_default_threads(1),
                             .batch = 64,
                             .hidden = 256,
                             .lr = 0.05,
                             .seed = 1};
}

void example_common_flags(example_options *o, ct_cli_flag out[EXAMPLE_NUM_COMMON_FLAGS]) {
    const ct_cli_flag flags[EXAMPLE_NUM_COMMON_FLAGS] = {
        CT_CLI_FLAG("--epochs", CT_CLI_INT, &o->epochs, "N", "epochs to train", .min = 1,
                    .max = 1e6, .given = &o->given.epochs),
        CT_CLI_FLAG("--batch", CT_CLI_INT64, &o->batch, "N",
                    "the global batch, shared among the ranks (each takes batch/ranks)", .min = 1,
                    .max = 1 << 24, .given = &o->given.batch),
        CT_CLI_FLAG("--lr", CT_CLI_DOUBLE, &o->lr, "X", "the learning rate", .min = 1e-12,
                    .max = 1e6, .given = &o->given.lr),
        CT_CLI_FLAG("--hidden", CT_CLI_INT64, &o->hidden, "N", "the hidden layers' width", .min = 1,
                    .max = 1 << 16, .given = &o->given.hidden),
        CT_CLI_FLAG("--threads", CT_CLI_INT, &o->threads, "N",
                    "ct's threads in each rank (the default comes from CT_NUM_THREADS if set)",
                    .min = 1, .max = EXAMPLE_MAX_THREADS),
        CT_CLI_FLAG("--seed", CT_CLI_UINT64, &o->seed, "N",
                    "the seed of the initial weights and of the shuffle"),
        CT_CLI_FLAG("--data", CT_CLI_STRING, &o->data, "DIR", "Fashion-MNIST's directory",
                    .default_text = CT_FMNIST_DIR),
        CT_CLI_FLAG("--max-steps", CT_CLI_INT, &o->max_steps, "N",
                    "stop after N steps in all (0: the epochs' steps)", .min = 0, .max = 1e9),
    };
    memcpy(out, flags, sizeof flags);
}

ct_cli_flag example_shard_flag(int *shard) {
    return (ct_cli_flag)CT_CLI_FLAG("--shard", CT_CLI_INT, shard, "0|1|2|3",
                                    "under data parallel, shard the optimizer state (1: ZeRO-1), "
                                    "the gradients too (2: ZeRO-2) and the parameters too (3: "
                                    "fully sharded, FSDP) across the ranks",
                                    .min = 0, .max = 3);
}

void example_model_state(const ct_ddp *ddp, const ct_optim *opt, const ct_param_list *params,
                         ct_ddp_memory *m) {
    *m = (ct_ddp_memory){0};
    if (ddp && !ct_ddp_memory_of(ddp, opt, m))
        return;
    for (int i = 0; i < params->n; i++)
        m->params += ct_numel(params->tensors[i]) *
                     (int64_t)ct_dtype_size(ct_tensor_dtype(params->tensors[i]));
    m->grads = m->params;
    for (int i = 0, n = opt ? ct_optim_num_states(opt) : 0; i < n; i++) {
        ct_tensor *t = NULL;
        if (!ct_optim_state_at(opt, i, NULL, &t))
            m->optimizer += ct_numel(t) * (int64_t)ct_dtype_size(ct_tensor_dtype(t));
    }
}

void example_print_memory(const char *name, const ct_ddp *ddp, const ct_optim *opt, int rank,
                          int64_t peak) {
    ct_ddp_memory m = {0};
    if (ddp)
        ct_ddp_memory_of(ddp, opt, &m);
    const double mib = 1 << 20;
    printf("%s: rank %d: peak memory %.1f MiB; model state %.2f MiB (parameters %.2f, "
           "gradients %.2f, optimizer %.2f, staging %.2f)\n",
           name, rank, (double)peak / mib,
           (double)(m.params + m.grads + m.optimizer + m.staging) / mib, (double)m.params / mib,
           (double)m.grads / mib, (double)m.optimizer / mib, (double)m.staging / mib);
    fflush(stdout);
}

void example_plan_flags(example_plan *p, ct_cli_flag out[EXAMPLE_NUM_PLAN_FLAGS]) {
    const ct_cli_flag flags[EXAMPLE_NUM_PLAN_FLAGS] = {
        CT_CLI_FLAG("--plan", CT_CLI_SWITCH, &p->plan, NULL,
                    "plan each rank's memory before training (a dry run on the meta device), "
                    "and set it against the measured peak at the end"),
        CT_CLI_FLAG("--plan-only", CT_CLI_SWITCH, &p->only, NULL,
                    "plan each rank's memory, print the plan and stop, training nothing"),
    };
    memcpy(out, flags, sizeof flags);
}

int example_plan_make(example_plan *p, const char *name, const ct_memory_plan_config *cfg,
                      ct_device device) {
    p->base = ct_memory_allocated(device);
    if (!p->plan && !p->only)
        return 0;
    CT_TRY(ct_memory_plan(cfg, &p->e));
    p->made = true;
    const double mib = 1 << 20;
    const ct_ddp_memory *m = &p->e.state;
    printf("%s: rank %d: memory plan: a step peaks at %.2f MiB on %s; %.2f MiB stay between "
           "steps (parameters %.2f, gradients %.2f, optimizer %.2f, staging %.2f); setup peaks "
           "at %.2f MiB\n",
           name, cfg->rank, (double)example_plan_bytes(p, device) / mib,
           ct_device_str(device, (char[CT_DEVICE_STR]){0}), (double)p->e.resident / mib,
           (double)m->params / mib, (double)m->grads / mib, (double)m->optimizer / mib,
           (double)m->staging / mib, (double)p->e.setup_peak / mib);
    fflush(stdout);
    return 0;
}

int64_t example_plan_bytes(const example_plan *p, ct_device device) {
    if (!p->made)
        return 0;
    return p->e.peak + (device.type == CT_CPU ? p->e.host : 0);
}

void example_plan_check(const example_plan *p, const char *name, int rank, ct_device device,
                        int64_t peak) {
    if (!p->made)
        return;
    const double mib = 1 << 20;
    int64_t measured = peak - p->base, planned = example_plan_bytes(p, device);
    printf("%s: rank %d: step peak measured %.2f MiB, planned %.2f MiB (plan/measured %.3f)\n",
           name, rank, (double)measured / mib, (double)planned / mib,
           measured > 0 ? (double)planned / (double)measured : 0.0);
    fflush(stdout);
}

void example_resume_flags(example_resume *r, const char *save_help,
                          ct_cli_flag out[EXAMPLE_NUM_RESUME_FLAGS]) {
    r->keep_last = 3;
    const ct_cli_flag flags[EXAMPLE_NUM_RESUME_FLAGS] = {
        CT_CLI_FLAG("--checkpoint-dir", CT_CLI_STRING, &r->dir, "DIR",
                    "resume from the newest checkpoint in DIR and save there"),
        CT_CLI_FLAG("--save-every", CT_CLI_INT64, &r->save_every, "N", save_help, .min = 0,
                    .max = 1e15),
        CT_CLI_FLAG("--stop-at-step", CT_CLI_INT64, &r->stop_at_step, "N",
                    "save and stop at step N, to resume later (0: never)", .min = 0, .max = 1e15),
        CT_CLI_FLAG("--keep-last", CT_CLI_INT, &r->keep_last, "N",
                    "keep the N newest checkpoints in DIR (0: all)", .min = 0, .max = 1e9),
    };
    memcpy(out, flags, sizeof flags);
}

int example_parse(const char *name, const char *about, const ct_cli_flag *own, size_t nown,
                  example_options *o, int argc, char **argv) {
    ct_cli_flag flags[EXAMPLE_NUM_COMMON_FLAGS + EXAMPLE_MAX_OWN_FLAGS];
    if (nown > EXAMPLE_MAX_OWN_FLAGS) {
        fprintf(stderr, "%s: %zu flags of its own, more than the %d example_parse holds\n", name,
                nown, EXAMPLE_MAX_OWN_FLAGS);
        return -1;
    }
    example_common_flags(o, flags);
    memcpy(flags + EXAMPLE_NUM_COMMON_FLAGS, own, sizeof *own * nown);
    ct_cli cli = {.prog = name,
                  .about = about,
                  .flags = flags,
                  .nflags = EXAMPLE_NUM_COMMON_FLAGS + nown,
                  .epilog = "Exit codes: 0 done, 1 an error, 2 bad usage."};
    int first, rc = ct_cli_parse(&cli, argc, argv, &first);
    if (rc > 0)
        exit(0);
    return rc ? -1 : 0;
}

int example_parse_device(void *dest, const char *v) {
    ct_device *out = dest;
    char *end;
    if (!strcmp(v, "cpu"))
        *out = CT_DEVICE_CPU;
    else if (!strcmp(v, "cuda"))
        *out = (ct_device){CT_CUDA, -1};
    else if (!strncmp(v, "cuda:", 5) && v[5] >= '0' && v[5] <= '9' &&
             strtol(v + 5, &end, 10) < 1024 && !*end)
        *out = (ct_device){CT_CUDA, (int)strtol(v + 5, NULL, 10)};
    else
        return ct_seterr(CT_EINVAL, "unknown device '%s' (cpu, cuda, cuda:N)", v);
    return 0;
}

/* The CPUs this process may run on. */
static int usable_cpus(void) {
    cpu_set_t set;
    if (!sched_getaffinity(0, sizeof set, &set))
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int example_init(const char *name, const example_options *o) {
    ct_world w;
    int local = !ct_world_from_env(&w) && w.local_size > 0 ? w.local_size : 1;
    int cpus = usable_cpus();
    /* Once per machine: the first local rank speaks for all. */
    if ((long)o->threads * local > cpus && (local == 1 || w.local_rank == 0))
        fprintf(stderr,
                "%s: warning: %d thread%s in each of %d rank%s is more than the %d CPUs here: "
                "the threads will wait for each other (--threads %d fits)\n",
                name, o->threads, o->threads > 1 ? "s" : "", local, local > 1 ? "s" : "", cpus,
                cpus / local > 1 ? cpus / local : 1);
    if (!ct_set_num_threads(o->threads) && !ct_dist_init(NULL))
        return 0;
    fprintf(stderr, "%s: %s\n", name, ct_errmsg());
    return -1;
}

/* mkdir -p: each missing directory of path, from the top. */
static int make_dirs(const char *path) {
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1;; s++) {
        bool end = *s == '\0';
        if (*s != '/' && !end)
            continue;
        *s = '\0';
        if (mkdir(p, 0755) && errno != EEXIST)
            return ct_seterr(CT_EIO, "cannot create %s: %s", p, strerror(errno));
        if (end)
            return 0;
        *s = '/';
    }
}

int example_check_dir(const char *flag, const char *dir) {
    struct stat st;
    if (stat(dir, &st) && errno == ENOENT && make_dirs(dir))
        return ct_seterr(CT_EIO, "%s %s: %s", flag, dir, ct_errmsg());
    if (stat(dir, &st))
        return ct_seterr(CT_EIO, "%s %s: %s", flag, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ct_seterr(CT_EIO, "%s %s: not a directory", flag, dir);
    /* access() answers for the real user and ignores read-only mounts: a
     * file made and removed is the question itself. */
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.ct-write-check-XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0)
        return ct_seterr(CT_EIO, "%s %s: cannot write there: %s", flag, dir, strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

const char *example_json_number(char buf[32], double v) {
    if (!isfinite(v))
        return "null";
    snprintf(buf, 32, "%.9g", v);
    return buf;
}

FILE *example_metrics_open(const char *path, int64_t resumed_at, const char *checkpoint) {
    FILE *f = fopen(path, resumed_at > 0 ? "a+" : "w");
    if (!f) {
        ct_seterr(CT_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    /* A line at a time, so that a run stopped by a signal (a restart, an
     * elastic job re-forming) leaves whole lines. */
    setvbuf(f, NULL, _IOLBF, 0);
    if (resumed_at > 0) {
        /* A run killed in the middle of a line left it torn: it stays on a
         * line of its own. */
        bool torn = fseek(f, -1, SEEK_END) == 0 && fgetc(f) != '\n';
        fseek(f, 0, SEEK_END); /* between a read and a write */
        if (torn)
            fputc('\n', f);
        /* The path as a JSON string: escape what JSON requires. */
        fprintf(f, "{\"resumed_at_step\":%lld,\"checkpoint\":\"", (long long)resumed_at);
        for (const unsigned char *c = (const unsigned char *)checkpoint; *c; c++)
            fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : *c < 0x20 ? "\\u%04x" : "%c", *c);
        fputs("\"}\n", f);
        fflush(f);
    }
    return f;
}

ct_module *example_mlp_new(const example_options *o, double dropout, bool flat) {
    ct_manual_seed(o->seed);
    ct_module *net = ct_sequential_new();
    ct_sequential_append(net, ct_linear_new(784, o->hidden, true));
    ct_sequential_append(net, ct_relu_new());
    if (dropout > 0)
        ct_sequential_append(net, ct_dropout_new(dropout));
    ct_sequential_append(net, ct_linear_new(o->hidden, o->hidden, true));
    ct_sequential_append(net, ct_relu_new());
    if (dropout > 0)
        ct_sequential_append(net, ct_dropout_new(dropout));
    ct_sequential_append(net, ct_linear_new(o->hidden, 10, true));
    if (ct_module_to(net, o->device) || (flat && ct_module_flatten(net, false))) {
        ct_module_free(net);
        return NULL;
    }
    return net;
}

ct_optim *example_optimizer(ct_ddp *ddp, const ct_param_list *pl, const ct_optim_options *opts,
                            double weight_decay) {
    ct_tensor *decay[pl->n > 0 ? pl->n : 1], *plain[pl->n > 0 ? pl->n : 1];
    int nd = 0, np = 0;
    for (int i = 0; i < pl->n; i++) {
        if (ct_ndim(pl->tensors[i]) >= 2)
            decay[nd++] = pl->tensors[i];
        else
            plain[np++] = pl->tensors[i];
    }
    ct_param_group groups[2] = {{decay, nd, weight_decay, 1}, {plain, np, 0, 1}};
    return ddp ? ct_ddp_optim_new(ddp, opts, groups, 2) : ct_optim_new_groups(opts, groups, 2);
}

int example_data_load(example_data *d, const char *dir, bool test) {
    *d = (example_data){0};
    int rc = ct_fmnist_load(dir, true, &d->train_x, &d->train_y);
    return rc || !test ? rc : ct_fmnist_load(dir, false, &d->test_x, &d->test_y);
}

void example_data_free(example_data *d) {
    ct_tensor_free(d->train_x);
    ct_tensor_free(d->train_y);
    ct_tensor_free(d->test_x);
    ct_tensor_free(d->test_y);
}

int example_evaluate(example_predict_fn predict, void *ctx, ct_tensor *images, ct_tensor *labels,
                     ct_device device, double *acc) {
    bool prev = ct_set_grad_enabled(false);
    int64_t n = ct_size(images, 0), correct = 0;
    int rc = 0;
    for (int64_t at = 0; at < n && !rc; at += 1000) {
        ct_scope_begin();
        int64_t len = n - at < 1000 ? n - at : 1000;
        ct_tensor *pred = predict(ctx, ct_to(ct_narrow(images, 0, at, len), device));
        ct_tensor *hits =
            pred ? ct_sum(ct_eq(pred, ct_to(ct_narrow(labels, 0, at, len), device)), NULL, 0, false)
                 : NULL;
        rc = hits ? 0 : ct_errcode();
        correct += hits ? ct_item_int64(hits) : 0;
        ct_scope_end();
    }
    ct_set_grad_enabled(prev);
    *acc = (double)correct / (double)n;
    return rc;
}

void example_progress_init(example_progress *p, int epochs, int64_t steps) {
    *p = (example_progress){epochs, steps, "samples", isatty(STDERR_FILENO) != 0, 0};
}

static void show(example_progress *p, bool force, int epoch, int64_t step, double loss, double rate,
                 double eta) {
    double t = example_now();
    if (!force && t - p->last_print < (p->tty ? 0.2 : 5))
        return;
    p->last_print = t;
    int s = eta > 0 && eta < 1e6 ? (int)(eta + 0.5) : 0;
    char ep[32] = "", of[24] = "";
    if (p->epochs > 0)
        snprintf(ep, sizeof ep, "epoch %d/%d  ", epoch, p->epochs);
    if (p->steps > 0)
        snprintf(of, sizeof of, "/%lld", (long long)p->steps);
    fprintf(stderr, "%s%sstep %4lld%s  loss %.4f  %8.0f %s/s  ETA %d:%02d:%02d%s",
            p->tty ? "\r" : "", ep, (long long)step, of, loss, rate, p->unit, s / 3600, s / 60 % 60,
            s % 60, p->tty ? "   " : "\n");
    fflush(stderr);
}

void example_progress_show(example_progress *p, int epoch, int64_t step, double loss, double rate,
                           double eta) {
    show(p, false, epoch, step, loss, rate, eta);
}

void example_progress_end_epoch(example_progress *p, int epoch, int64_t step, double loss,
                                double rate) {
    show(p, true, epoch, step, loss, rate, 0);
    if (p->tty)
        fputc('\n', stderr);
}

void example_print_epoch(int epoch, double loss, double acc, double rate, double seconds) {
    printf("epoch %2d  train loss %.4f  test accuracy %.2f%%  (%.0f samples/s, %.1f s)\n", epoch,
           loss, 100 * acc, rate, seconds);
    fflush(stdout);
}

void example_print_summary(const char *head, const char *more, const example_options *o, int epochs,
                           int64_t steps, double rate, double acc, double loss) {
    printf("{%s, \"threads\": %d, \"batch\": %lld, \"epochs\": %d, \"steps\": %lld, "
           "%s\"samples_per_s\": %.1f, \"test_acc\": %.4f, \"final_loss\": %.4f}\n",
           head, o->threads, (long long)o->batch, epochs, (long long)steps, more, rate, acc, loss);
}

/* The model parameter that optimizer parameter k updates, and where in it
 * (flattened) its elements start: itself under a replicated optimizer, a
 * piece of one under a ZeRO shard. -1 when k is not the model's. */
static int source_of(const ct_param_list *params, ct_optim *opt, const ct_ddp *ddp, int k,
                     int64_t *offset) {
    int m;
    *offset = 0;
    if (ddp && !ct_ddp_optim_param_source(ddp, k, &m, offset))
        return m;
    ct_errclear();
    for (m = 0; m < params->n; m++)
        if (params->tensors[m] == ct_optim_param(opt, k))
            return m;
    return ct_seterr(CT_EINVAL, "optimizer parameter %d is not one of the model's", k);
}

/* The parameters under their names: whole, or fully sharded as the
 * blocks of each that this rank's shard holds (the file holds each in its
 * own shape either way). */
static int add_params(example_ckpt *r, const ct_param_list *params, const ct_ddp *ddp) {
    bool full = ddp && ct_ddp_stage(ddp) == CT_DDP_SHARD_FULL;
    for (int i = 0; i < params->n; i++) {
        ct_tensor *t = params->tensors[i], *piece = NULL;
        int64_t offset;
        if (!full) {
            CT_TRY(ct_state_add_tensor(r->st, params->names[i], t, CT_STATE_REPLICATED));
            continue;
        }
        CT_TRY(ct_ddp_param_shard(ddp, i, &piece, &offset));
        int rc = piece ? ct_state_add_flat_shard(r->st, params->names[i], piece, ct_ndim(t),
                                                 ct_sizes(t), offset)
                       : 0;
        ct_tensor_free(piece);
        CT_TRY(rc);
    }
    return 0;
}

/* Each optimizer state per model parameter, flattened:
 * "optimizer.<state>.<parameter>" [numel]. A replicated optimizer holds
 * every entry whole; a ZeRO shard holds blocks of some, so a checkpoint
 * loads into either, at any world size. The per-parameter "step" counts
 * are left out: train.step restores them (ct_optim_set_step_count). */
static int add_optimizer(example_ckpt *r, const ct_param_list *params, ct_optim *opt,
                         const ct_ddp *ddp) {
    int64_t lo, hi, total = ct_param_list_numel(params);
    bool sharded = ddp && (ct_ddp_stage(ddp) == CT_DDP_SHARD_FULL ||
                           (!ct_ddp_shard_range(ddp, &lo, &hi) && (lo > 0 || hi < total)));
    int n = ct_optim_num_params(opt), nstates = ct_optim_num_states(opt);
    for (int s = 0; s < nstates; s++) {
        const char *name;
        CT_TRY(ct_optim_state_at(opt, s, &name, NULL));
        for (int k = 0; strcmp(name, "step") && k < n; k++) {
            int64_t offset, numel;
            int m = source_of(params, opt, sharded ? ddp : NULL, k, &offset);
            ct_tensor *state = m < 0 ? NULL : ct_optim_param_state(opt, name, k);
            if (!state)
                return ct_errcode();
            numel = ct_numel(state);
            int64_t whole = ct_numel(params->tensors[m]);
            ct_tensor *flat = ct_view(state, 1, &numel);
            char key[256];
            snprintf(key, sizeof key, "optimizer.%s.%s", name, params->names[m]);
            int rc = !flat     ? ct_errcode()
                     : sharded ? ct_state_add_shard(r->st, key, flat, 1, &whole, &offset)
                               : ct_state_add_tensor(r->st, key, flat, CT_STATE_REPLICATED);
            ct_tensor_free(flat);
            CT_TRY(rc);
        }
    }
    return 0;
}

int example_ckpt_init(example_ckpt *r, const ct_param_list *params, ct_optim *opt,
                      const ct_ddp *ddp, ct_comm *world) {
    *r = (example_ckpt){.st = ct_state_new(), .ck = ct_checkpointer_new(world), .last_saved = -1};
    if (!r->st || !r->ck)
        return ct_errcode();
    CT_TRY(add_params(r, params, ddp));
    CT_TRY(add_optimizer(r, params, opt, ddp));
    CT_TRY(ct_state_add_i64(r->st, "train.step", &r->step, CT_STATE_REPLICATED));
    CT_TRY(ct_state_add_generator(r->st, "rng", ct_default_generator(), CT_STATE_REPLICATED));
    return 0;
}

int64_t example_ckpt_resume(example_ckpt *r, const char *dir, ct_comm *world, ct_optim *opt) {
    if (ct_checkpointer_reserve(r->ck, r->st))
        return -1;
    int found = ct_checkpoint_latest(dir, r->path, sizeof r->path);
    if (found <= 0) {
        r->path[0] = '\0';
        return found < 0 ? -1 : 0;
    }
    if (ct_checkpoint_load(r->path, r->st, world) || ct_optim_set_step_count(opt, r->step))
        return -1;
    r->last_saved = r->step;
    return r->step;
}

int example_ckpt_save(example_ckpt *r, const char *dir, int64_t step, int keep_last) {
    if (r->last_saved == step)
        return 0;
    r->step = step;
    r->last_saved = step;
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%08lld", dir, (long long)step);
    ct_checkpoint_options co = ct_checkpoint_defaults();
    co.step = step;
    co.keep_last = keep_last;
    return ct_checkpointer_save(r->ck, path, r->st, &co) ? -1 : 0;
}

int example_ckpt_finish(example_ckpt *r) {
    int rc = r->ck && ct_checkpointer_wait(r->ck) ? -1 : 0;
    ct_checkpointer_free(r->ck);
    ct_state_free(r->st);
    *r = (example_ckpt){0};
    return rc;
}

static int allreduce(ct_comm *group, double *v, int n, ct_reduce_op op) {
    ct_scope_begin();
    ct_tensor *t = ct_from_data(v, CT_SHAPE(n), CT_FLOAT64);
    int rc = t ? ct_comm_allreduce(group, t, op, NULL) : ct_errcode();
    if (!rc)
        memcpy(v, ct_data_ptr(t), sizeof *v * (size_t)n);
    ct_scope_end();
    return rc;
}

int example_allreduce_sum(ct_comm *group, double *v, int n) {
    return allreduce(group, v, n, CT_REDUCE_SUM);
}

int example_allreduce_max(ct_comm *group, double *v, int n) {
    return allreduce(group, v, n, CT_REDUCE_MAX);
}

int example_train(const example_trainer *t) {
    const example_options *o = t->o;
    int trainers = t->group ? ct_comm_size(t->group) : 1;
    bool report = !t->group || ct_comm_rank(t->group) == 0;
    int64_t per_epoch = ct_loader_num_batches(t->loader), total = per_epoch * o->epochs;
    if (o->max_steps > 0 && o->max_steps < total)
        total = o->max_steps;
    example_progress prog;
    example_progress_init(&prog, o->epochs, per_epoch);
    double start = example_now(), busy = 0, acc = NAN, mean_loss = NAN, rate = 0;
    int64_t step = 0, samples = 0;
    int epoch = 0, rc = 0;
    while (!rc && step < total) {
        epoch++;
        double loss_sum = 0, loss = NAN;
        int64_t in_epoch = 0;
        for (; step < total && !rc; step++) {
            double t0 = example_now();
            ct_scope_begin();
            ct_tensor *x, *y;
            int got = ct_loader_next(t->loader, &x, &y);
            if (got == 1) {
                rc = t->step(t->ctx, x, y, &loss);
                samples += ct_size(x, 0);
            }
            ct_scope_end();
            if (got < 0)
                rc = got;
            if (rc || got == 0)
                break;
            busy += example_now() - t0;
            loss_sum += loss;
            in_epoch++;
            /* Every trainer goes at about this one's pace. */
            double mine = (double)samples / busy;
            if (report)
                example_progress_show(&prog, epoch, in_epoch, loss, mine * trainers,
                                      (double)(total - step - 1) * (double)o->batch / mine);
        }
        double sums[3] = {loss_sum, (double)in_epoch, busy > 0 ? (double)samples / busy : 0};
        if (!rc && t->group)
            rc = example_allreduce_sum(t->group, sums, 3);
        if (rc || !report)
            continue;
        mean_loss = sums[0] / sums[1];
        rate = sums[2];
        example_progress_end_epoch(&prog, epoch, in_epoch, loss, rate);
        rc = example_evaluate(t->predict, t->ctx, t->test_x, t->test_y, t->o->device, &acc);
        if (!rc)
            example_print_epoch(epoch, mean_loss, acc, rate, example_now() - start);
    }
    if (!rc && report)
        example_print_summary(t->summary_head, "", o, epoch, step, rate, acc, mean_loss);
    return rc;
}
