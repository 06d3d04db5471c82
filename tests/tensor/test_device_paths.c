/* The device paths of autograd, nn, optim and checkpoint, on the device
 * under test (device_under_test.h) against the same computation on the
 * CPU: backward through an MLP (linear, relu, gelu, dropout from one seed,
 * softmax), layer norm, cross-entropy and a tiny GPT; a module moved to the
 * device and flattened there; gradient clipping; SGD, Adam and AdamW steps;
 * a checkpoint of device parameters saved and loaded; data-parallel
 * training over a host backend, which stages the device's buckets. */
#include "ct_test.h"
#include "device_under_test.h"

#include <ct/autograd.h>
#include <ct/checkpoint.h>
#include <ct/collectives.h>
#include <ct/dist.h>
#include <ct/nn.h>
#include <ct/optim.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

typedef ct_tensor *(*loss_fn)(ct_module *m, ct_tensor *x, ct_tensor *target);

static ct_tensor *on(ct_tensor *t, int side) { return side ? ct_to(t, dut) : t; }

/* A module made the same on both sides (one seed), moved to the device on
 * side 1, flattened with its gradients when flat. */
static ct_module *made_on(ct_module *(*make)(void), int side, bool flat) {
    ct_manual_seed(5);
    ct_module *m = make();
    if (m && side && ct_module_to(m, dut)) {
        ct_module_free(m);
        return NULL;
    }
    if (m && flat && ct_module_flatten(m, true)) {
        ct_module_free(m);
        return NULL;
    }
    return m;
}

/* m's parameters in named order into pl. */
static bool params_of(ct_module *m, ct_param_list *pl) {
    ct_param_list_init(pl);
    return ct_module_named_parameters(m, pl) == 0;
}

/* Whether backward of loss(make(), x, target) gives the same loss and
 * gradients on the device as on the CPU, within tol. The draws of the
 * forward (dropout) come from one seed on both sides. */
static bool backward_matches(const char *file, int line, ct_module *(*make)(void), ct_tensor *x,
                             ct_tensor *target, loss_fn loss, bool flat, double tol) {
    ct_module *m[2] = {NULL, NULL};
    ct_tensor *l[2] = {NULL, NULL};
    ct_param_list pl[2];
    bool ok = true;
    for (int side = 0; side < 2 && ok; side++) {
        ok = (m[side] = made_on(make, side, flat)) != NULL;
        ct_manual_seed(11);
        ok = ok && (l[side] = loss(m[side], on(x, side), on(target, side))) != NULL &&
             ct_tensor_backward(l[side]) == 0 && params_of(m[side], &pl[side]);
        if (!ok)
            tt_fail(file, line, "on %s: %s", side ? DUT_NAME : "cpu", ct_errmsg());
    }
    if (ok && ct_tensor_device(l[1]).type != DUT_TYPE) {
        tt_fail(file, line, "the loss is not on the device");
        ok = false;
    }
    ok = ok && tt_close(file, line, ct_to(l[1], CT_DEVICE_CPU), l[0], tol, tol);
    for (int i = 0; ok && i < pl[0].n; i++) {
        ct_tensor *g = ct_tensor_grad(pl[1].tensors[i]);
        ok = g && ct_tensor_device(g).type == DUT_TYPE &&
             tt_close(file, line, ct_to(g, CT_DEVICE_CPU), ct_tensor_grad(pl[0].tensors[i]), tol,
                      tol);
        if (!ok)
            tt_fail(file, line, "the gradient of %s differs", pl[0].names[i]);
    }
    if (ok && flat)
        ok = tt_close(file, line, ct_to(ct_module_flat_grads(m[1]), CT_DEVICE_CPU),
                      ct_module_flat_grads(m[0]), tol, tol);
    for (int side = 0; side < 2; side++) {
        if (l[side])
            ct_param_list_free(&pl[side]);
        ct_module_free(m[side]);
    }
    return ok;
}

#define ASSERT_BACKWARD_MATCHES(make, x, target, loss, flat, tol)                                  \
    do {                                                                                           \
        if (!backward_matches(__FILE__, __LINE__, make, x, target, loss, flat, tol))               \
            return;                                                                                \
    } while (0)

/* ------------------------------------------------------------------ MLP */

static ct_module *mlp(void) {
    ct_module *seq = ct_sequential_new();
    ct_sequential_append(seq, ct_linear_new(6, 16, true));
    ct_sequential_append(seq, ct_relu_new());
    ct_sequential_append(seq, ct_dropout_new(0.25));
    ct_sequential_append(seq, ct_linear_new(16, 16, true));
    ct_sequential_append(seq, ct_gelu_new(false));
    ct_sequential_append(seq, ct_linear_new(16, 4, true));
    return seq;
}

/* Squared error of the softmax of the scores against target. */
static ct_tensor *softmax_mse(ct_module *m, ct_tensor *x, ct_tensor *target) {
    return ct_mse_loss(ct_softmax(ct_module_forward(m, x), 1), target, CT_REDUCTION_MEAN);
}

static ct_tensor *mlp_input(void) { return tt_rand(CT_SHAPE(8, 6), CT_FLOAT32, 1); }

static ct_tensor *mlp_target(void) { return ct_softmax(tt_rand(CT_SHAPE(8, 4), CT_FLOAT32, 2), 1); }

TEST(backward_through_an_mlp_matches_the_cpu) {
    ASSERT_BACKWARD_MATCHES(mlp, mlp_input(), mlp_target(), softmax_mse, false, 1e-5);
}

TEST(a_module_moved_and_flattened_on_the_device_trains_as_on_the_cpu) {
    ASSERT_BACKWARD_MATCHES(mlp, mlp_input(), mlp_target(), softmax_mse, true, 1e-5);
    ct_module *m = made_on(mlp, 1, true);
    ASSERT_TRUE(m != NULL);
    ASSERT_EQ(ct_tensor_device(ct_module_flat_params(m)).type, DUT_TYPE);
    ASSERT_EQ(ct_tensor_device(ct_module_flat_grads(m)).type, DUT_TYPE);
    ct_module_free(m);
}

/* ------------------------------------------- layer norm, cross-entropy */

static ct_module *normed(void) {
    ct_module *seq = ct_sequential_new();
    ct_sequential_append(seq, ct_linear_new(6, 16, true));
    ct_sequential_append(seq, ct_layer_norm_new(16, 1e-5));
    ct_sequential_append(seq, ct_linear_new(16, 4, true));
    return seq;
}

static ct_tensor *cross_entropy(ct_module *m, ct_tensor *x, ct_tensor *target) {
    return ct_cross_entropy(ct_module_forward(m, x), target, NULL);
}

static ct_tensor *classes(void) {
    return ct_from_data((int64_t[]){0, 3, 1, 2, 2, 0, 3, 1}, CT_SHAPE(8), CT_INT64);
}

TEST(backward_through_layer_norm_matches_the_cpu) {
    ASSERT_BACKWARD_MATCHES(normed, mlp_input(), mlp_target(), softmax_mse, false, 1e-5);
}

TEST(backward_through_cross_entropy_matches_the_cpu) {
    ASSERT_BACKWARD_MATCHES(mlp, mlp_input(), classes(), cross_entropy, false, 1e-5);
}

/* ------------------------------------------------------------------ GPT */

static ct_module *tiny_gpt(void) {
    ct_gpt_config cfg = {.vocab = 11, .context = 8, .layers = 2, .heads = 2, .width = 16};
    return ct_gpt_new(&cfg);
}

/* The language model's loss: ids [2, 8] predicting target [2, 8]. */
static ct_tensor *lm_loss(ct_module *m, ct_tensor *ids, ct_tensor *target) {
    ct_tensor *logits = ct_module_forward(m, ids);
    return ct_cross_entropy(ct_reshape(logits, CT_SHAPE(16, 11)), ct_reshape(target, CT_SHAPE(16)),
                            NULL);
}

static ct_tensor *tokens(uint64_t seed) {
    return ct_to_dtype(ct_add_scalar(tt_rand(CT_SHAPE(2, 8), CT_INT64, seed), 5), CT_INT64);
}

TEST(a_tiny_gpts_forward_and_backward_match_the_cpu) {
    ASSERT_BACKWARD_MATCHES(tiny_gpt, tokens(3), tokens(4), lm_loss, false, 1e-4);
}

/* ------------------------------------------------------------ optimizers */

/* The parameters of m after backward of softmax_mse on the MLP's input. */
static bool mlp_backward(ct_module *m, int side) {
    ct_manual_seed(11);
    ct_tensor *l = softmax_mse(m, on(mlp_input(), side), on(mlp_target(), side));
    return l && ct_tensor_backward(l) == 0;
}

TEST(gradient_clipping_matches_the_cpu) {
    double norm[2];
    ct_module *m[2];
    ct_param_list pl[2];
    for (int side = 0; side < 2; side++) {
        m[side] = made_on(mlp, side, false);
        ASSERT_TRUE(m[side] && mlp_backward(m[side], side) && params_of(m[side], &pl[side]));
        ct_tensor *grads[16];
        ASSERT_TRUE(pl[side].n <= 16);
        for (int i = 0; i < pl[side].n; i++)
            grads[i] = pl[side].tensors[i];
        ASSERT_EQ(ct_clip_grad_norm(grads, pl[side].n, 0.01, &norm[side]), 0);
    }
    ASSERT_NEAR(norm[1], norm[0], 1e-5 * norm[0]);
    for (int i = 0; i < pl[0].n; i++)
        ASSERT_CLOSE(ct_to(ct_tensor_grad(pl[1].tensors[i]), CT_DEVICE_CPU),
                     ct_tensor_grad(pl[0].tensors[i]), 1e-5, 1e-7);
    for (int side = 0; side < 2; side++) {
        ct_param_list_free(&pl[side]);
        ct_module_free(m[side]);
    }
}

TEST(sgd_adam_and_adamw_steps_match_the_cpu) {
    ct_optim_kind kinds[] = {CT_OPTIM_SGD, CT_OPTIM_ADAM, CT_OPTIM_ADAMW};
    for (int k = 0; k < 3; k++) {
        ct_optim_options o = ct_optim_defaults(kinds[k], 0.01);
        o.weight_decay = 0.1;
        o.momentum = kinds[k] == CT_OPTIM_SGD ? 0.9 : o.momentum;
        ct_module *m[2];
        for (int side = 0; side < 2; side++) {
            m[side] = made_on(mlp, side, true);
            ct_param_list pl;
            ASSERT_TRUE(m[side] && params_of(m[side], &pl));
            ct_optim *opt = ct_optim_new(&o, pl.tensors, pl.n);
            ct_param_list_free(&pl);
            ASSERT_TRUE(opt != NULL);
            for (int step = 0; step < 3; step++) {
                ASSERT_TRUE(mlp_backward(m[side], side));
                ASSERT_EQ(ct_optim_step(opt), 0);
                ASSERT_EQ(ct_optim_zero_grad(opt, false), 0);
            }
            ct_optim_free(opt);
        }
        ASSERT_CLOSE(ct_to(ct_module_flat_params(m[1]), CT_DEVICE_CPU), ct_module_flat_params(m[0]),
                     1e-5, 1e-6);
        /* The steps moved them. */
        ct_module *start = made_on(mlp, 0, true);
        ASSERT_TRUE(start != NULL);
        ct_tensor *moved = ct_sub(ct_module_flat_params(m[0]), ct_module_flat_params(start));
        ASSERT_TRUE(ct_item(ct_amax(ct_abs(moved), NULL, 0, false)) > 1e-4);
        ct_module_free(start);
        ct_module_free(m[0]);
        ct_module_free(m[1]);
    }
}

/* ------------------------------------------------------------ checkpoint */

/* A state naming every parameter of m. */
static ct_state *state_of(ct_module *m, ct_param_list *pl) {
    ct_state *st = params_of(m, pl) ? ct_state_new() : NULL;
    for (int i = 0; st && i < pl->n; i++)
        if (ct_state_add_tensor(st, pl->names[i], pl->tensors[i], CT_STATE_REPLICATED)) {
            ct_state_free(st);
            st = NULL;
        }
    return st;
}

TEST(a_checkpoint_of_device_parameters_loads_into_another_module_on_the_device) {
    char dir[256];
    tt_tmp_path(dir, "params");
    ct_module *a = made_on(mlp, 1, true);
    ASSERT_TRUE(a && mlp_backward(a, 1));
    ct_param_list pa, pb;
    ct_state *st = state_of(a, &pa);
    ASSERT_TRUE(st != NULL);
    ASSERT_EQ(ct_checkpoint_save(dir, st, NULL, NULL), 0);
    ct_state_free(st);
    /* Another module, its parameters zeroed, takes the saved values in. */
    ct_module *b = made_on(mlp, 1, true);
    ASSERT_TRUE(b != NULL);
    bool grad = ct_set_grad_enabled(false);
    ct_tensor *zeroed = ct_mul_scalar_(ct_module_flat_params(b), 0);
    ct_set_grad_enabled(grad);
    ASSERT_TRUE(zeroed != NULL);
    st = state_of(b, &pb);
    ASSERT_TRUE(st != NULL);
    ASSERT_EQ(ct_checkpoint_load(dir, st, NULL), 0);
    ct_state_free(st);
    for (int i = 0; i < pa.n; i++) {
        ASSERT_EQ(ct_tensor_device(pb.tensors[i]).type, DUT_TYPE);
        ASSERT_CLOSE(ct_to(pb.tensors[i], CT_DEVICE_CPU), ct_to(pa.tensors[i], CT_DEVICE_CPU), 0,
                     0);
    }
    ct_param_list_free(&pa);
    ct_param_list_free(&pb);
    ct_module_free(a);
    ct_module_free(b);
}

/* ------------------------------------------------ data parallel, staged */

/* An MLP without dropout, whose draws would differ between the ranks. */
static ct_module *mlp_plain(void) {
    ct_module *seq = ct_sequential_new();
    ct_sequential_append(seq, ct_linear_new(6, 16, true));
    ct_sequential_append(seq, ct_gelu_new(false));
    ct_sequential_append(seq, ct_linear_new(16, 4, true));
    return seq;
}

#define DDP_RANKS 2

/* A batch of rank's own, the same on every run. */
static ct_tensor *rank_batch(int rank) { return tt_rand(CT_SHAPE(5, 6), CT_FLOAT32, 70 + rank); }

/* One rank's step under ct_ddp, with the model on the device: 0 when its
 * gradients are want (n of them), else 1 with the reason on stderr. */
static int ddp_rank_step(const char *shm, int rank, ct_tensor *const *want, int n) {
    ct_comm *comm = ct_comm_new(&(ct_comm_config){.backend = CT_BACKEND_SHM,
                                                  .rank = rank,
                                                  .size = DDP_RANKS,
                                                  .timeout_s = 60,
                                                  .shm_name = shm});
    ct_module *m = comm ? made_on(mlp_plain, 1, true) : NULL;
    ct_ddp_options o = ct_ddp_defaults();
    o.first_bucket_bytes = o.bucket_bytes = 256; /* buckets that overlap backward */
    ct_ddp *ddp = m ? ct_ddp_new(comm, m, &o) : NULL;
    int rc = !ddp ? ct_errcode() : 0;
    if (rc == 0 && ct_ddp_num_buckets(ddp) < 2)
        rc = ct_seterr(CT_EINVAL, "expected buckets that overlap backward, got one");
    if (rc == 0) {
        ct_tensor *y = ct_module_forward(m, ct_to(rank_batch(rank), dut));
        ct_tensor *loss = y ? ct_sum(ct_mul(y, y), NULL, 0, false) : NULL;
        rc = !loss ? ct_errcode() : ct_tensor_backward(loss);
    }
    ct_param_list pl;
    if (rc == 0 && !params_of(m, &pl))
        rc = ct_errcode();
    for (int i = 0; rc == 0 && i < n; i++) {
        ct_tensor *got = ct_to(ct_tensor_grad(pl.tensors[i]), CT_DEVICE_CPU);
        ct_tensor *err = got ? ct_amax(ct_abs(ct_sub(got, want[i])), NULL, 0, false) : NULL;
        if (!err)
            rc = ct_errcode();
        else if (ct_item(err) > 1e-5)
            rc = ct_seterr(CT_EINVAL, "gradient %s is off by %g", pl.names[i], ct_item(err));
    }
    if (rc)
        fprintf(stderr, "rank %d: %s\n", rank, ct_errmsg());
    ct_ddp_free(ddp);
    ct_module_free(m);
    ct_comm_free(comm);
    return rc ? 1 : 0;
}

/* The gradients of the ranks' mean loss, computed here on the CPU: the
 * mean of the ranks' local gradients. n gets their count. */
static bool mean_gradients(ct_tensor **want, int *n) {
    for (int rank = 0; rank < DDP_RANKS; rank++) {
        ct_module *m = made_on(mlp_plain, 0, false);
        ct_tensor *y = m ? ct_module_forward(m, rank_batch(rank)) : NULL;
        ct_param_list pl;
        if (!y || ct_tensor_backward(ct_sum(ct_mul(y, y), NULL, 0, false)) || !params_of(m, &pl) ||
            pl.n > 8)
            return false;
        *n = pl.n;
        for (int i = 0; i < pl.n; i++) {
            ct_tensor *g = ct_mul_scalar(ct_tensor_grad(pl.tensors[i]), 1.0 / DDP_RANKS);
            want[i] = want[i] ? ct_add(want[i], g) : g;
        }
        ct_param_list_free(&pl);
        ct_module_free(m);
    }
    return true;
}

/* A rank of the case below: this program run again with CT_DUT_DDP_RANK
 * and CT_DUT_DDP_SHM set; it exits with its rank's result. */
static void ddp_rank_process(const char *rank, const char *shm) {
    ct_tensor *want[8] = {NULL};
    int n = 0;
    if (!mean_gradients(want, &n)) {
        fprintf(stderr, "rank %s: %s\n", rank, ct_errmsg());
        _exit(1);
    }
    fflush(NULL);
    _exit(ddp_rank_step(shm, atoi(rank), want, n));
}

/* ct_ddp with parameters on the device and the shm backend, which stages
 * every bucket through host memory: each rank's gradients are the mean of
 * the ranks' local ones. The ranks are processes, as they would be under
 * ctlaunch (a device has one backward thread per process, which ranks
 * sharing a process would take turns on, each waiting in its allreduce for
 * the other), and fresh ones: this program run again, not forked, as TSan
 * cannot follow a process that forks with threads and starts more. */
TEST(ddp_over_a_host_backend_averages_device_gradients) {
    if (getenv("CT_DUT_DDP_RANK") && getenv("CT_DUT_DDP_SHM"))
        ddp_rank_process(getenv("CT_DUT_DDP_RANK"), getenv("CT_DUT_DDP_SHM"));
    char shm[64], exe[4096];
    snprintf(shm, sizeof shm, "/ct-test-dut-ddp-%ld", (long)getpid());
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ASSERT_TRUE(len > 0);
    exe[len] = 0;
    pid_t pids[DDP_RANKS];
    fflush(NULL);
    for (int r = 0; r < DDP_RANKS; r++) {
        pids[r] = fork();
        ASSERT_TRUE(pids[r] >= 0);
        if (pids[r] == 0) {
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            setenv("CT_DUT_DDP_RANK", rank, 1);
            setenv("CT_DUT_DDP_SHM", shm, 1);
            alarm(120); /* a rank that hangs dies, and its status says so */
            execl(exe, exe, "ddp_over_a_host_backend_averages_device_gradients", (char *)NULL);
            _exit(127);
        }
    }
    for (int r = 0; r < DDP_RANKS; r++) {
        int status = 0;
        ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            tt_fail(__FILE__, __LINE__, "rank %d %s %d (its reason is above)", r,
                    WIFEXITED(status) ? "exited with" : "was killed by signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
}
