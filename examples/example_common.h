/* examples internal header: what fmnist_mlp, param_server and two_stage
 * share, so that the two RPC examples train fmnist_mlp's MLP from its flags,
 * its initial weights and its data, and print what it prints.
 *
 *   - example_parse(): the flags all three take (--epochs --batch --lr
 *     --hidden --threads --seed --data --max-steps) and each example's own,
 *     by ct/cli.h's rules;
 *   - example_mlp_new(): the 784-H-H-10 MLP with fmnist_mlp's weights;
 *   - example_data_load(): Fashion-MNIST;
 *   - example_evaluate(): the test accuracy, in batches of 1000 images;
 *   - example_progress_*(): the progress line on stderr;
 *   - example_print_epoch(), example_print_summary(): the line after every
 *     epoch, and the JSON summary that ends stdout;
 *   - example_train(): the RPC examples' training loop, around a step
 *     callback (fmnist_mlp keeps its own: it resumes mid-epoch, leaves
 *     warmup steps out of its timing and saves checkpoints).
 *
 * Ownership. Every function borrows what it is passed (example_train()
 * too, all that its example_trainer points to). example_mlp_new() and
 * example_data_load() hand what they make to the caller, who frees it with
 * ct_module_free() and example_data_free().
 *
 * Errors. As in ct: 0 or a negative CT_E* code, or NULL, with ct_errmsg()
 * saying why. example_parse() prints its own messages instead, as a command
 * line tool does.
 *
 * Threads. Nothing here is thread-safe; call it from the thread that trains
 * (the progress line is one per process).
 */
#ifndef EXAMPLE_COMMON_H
#define EXAMPLE_COMMON_H

#include <ct/ct.h>

#include <stdbool.h>
#include <stdint.h>

/* Seconds on the monotonic clock. */
double example_now(void);

/* ------------------------------------------------------------------ flags */

typedef struct example_options {
    int epochs, threads, max_steps; /* max_steps 0: all the epochs' steps */
    int64_t batch, hidden;          /* batch: the global one, shared among the ranks */
    double lr;
    uint64_t seed;    /* of the initial weights and of the shuffle */
    const char *data; /* Fashion-MNIST's directory; NULL: CT_FMNIST_DIR */
    ct_device device; /* where the model trains (fmnist_mlp's --device); the CPU by default */
    struct {
        bool epochs, batch, hidden, lr;
    } given; /* which of these the command line set (a recipe fills in the others) */
} example_options;

/* The most threads a program accepts (--threads, CT_NUM_THREADS). */
#define EXAMPLE_MAX_THREADS 4096

/* CT_NUM_THREADS when it is set to a valid count, else fallback: the
 * default of every program's --threads (docs/cli.md: a flag beats the
 * variable, which beats the program's own default). */
int example_default_threads(int fallback);

/* fmnist_mlp's reference recipe (10 epochs, batch 64, hidden 256, lr 0.05)
 * with seed 1, on one thread unless CT_NUM_THREADS says otherwise. */
example_options example_options_defaults(void);

/* The flags of example_options (--epochs --batch --lr --hidden --threads
 * --seed --data --max-steps) with their ranges, pointing into o. */
#define EXAMPLE_NUM_COMMON_FLAGS 8
#define EXAMPLE_MAX_OWN_FLAGS    24
void example_common_flags(example_options *o, ct_cli_flag out[EXAMPLE_NUM_COMMON_FLAGS]);

/* What a resumable run is told (fmnist_mlp's and gpt's flags). */
typedef struct example_resume {
    const char *dir;      /* --checkpoint-dir; NULL: no checkpoints */
    int64_t save_every;   /* --save-every: 0 only where the program saves anyway */
    int64_t stop_at_step; /* --stop-at-step: 0 never */
    int keep_last;        /* --keep-last: 0 keeps all */
} example_resume;

/* --checkpoint-dir, --save-every (with save_help, which says when the
 * program saves anyway), --stop-at-step and --keep-last (its default, 3,
 * set here), pointing into r. */
#define EXAMPLE_NUM_RESUME_FLAGS 4
void example_resume_flags(example_resume *r, const char *save_help,
                          ct_cli_flag out[EXAMPLE_NUM_RESUME_FLAGS]);

/* Parses argv by the common flags and the example's own (at most
 * EXAMPLE_MAX_OWN_FLAGS), into the defaults already in o and own's
 * destinations. --help and --version print and exit 0; bad usage: -1,
 * the message printed (exit 2). */
int example_parse(const char *name, const char *about, const ct_cli_flag *own, size_t nown,
                  example_options *o, int argc, char **argv);

/* --device's value (a CT_CLI_CUSTOM parser into a ct_device): "cpu",
 * "cuda" (index -1: the rank's own device, known after example_init()) or
 * "cuda:N". */
int example_parse_device(void *dest, const char *value);

/* Gives ct o->threads threads and joins the launcher's world (a world of
 * one without a launcher). Warns once when the local ranks' threads
 * outnumber the CPUs. On error: -1, "<name>: <why>" printed. */
int example_init(const char *name, const example_options *o);

/* ------------------------------------------------ checks before the work */

/* Fails unless dir is a directory this process can create files in,
 * making it (and its parents) first if it does not exist: what
 * --checkpoint-dir needs, checked before the first step rather than at
 * the first save. The message names flag and dir. */
int example_check_dir(const char *flag, const char *dir);

/* ------------------------------------------------------- metrics files */

/* v as a JSON number, or null when it is not finite (a diverged loss, a
 * validation that did not run): JSON has no NaN (docs/cli.md). buf holds
 * 32 bytes. */
const char *example_json_number(char buf[32], double v);

/* Opens the metrics file at path for a run: a fresh one (resumed_at 0)
 * starts it anew; a resumed one appends, after a marker line
 * {"resumed_at_step": N, "checkpoint": "PATH"}, so that the history of the
 * steps before stays (a line a killed run left torn stays on its own).
 * Line-buffered. NULL with the message set on error. */
FILE *example_metrics_open(const char *path, int64_t resumed_at, const char *checkpoint);

/* ------------------------------------------------------- model and data */

/* 784-H-H-10 with ReLU (and dropout after each ReLU when dropout > 0), on
 * o->device, its parameters in one flat buffer (so that an optimizer
 * updates them in one pass). It seeds the default generator with o->seed first, so that every
 * example starts from fmnist_mlp's weights. NULL on error. */
ct_module *example_mlp_new(const example_options *o, double dropout, bool flat);

typedef struct example_data {
    ct_tensor *train_x, *train_y; /* [60000, 784] float32 in [0, 1], [60000] int64 */
    ct_tensor *test_x, *test_y;   /* [10000, 784], [10000]; NULL unless loaded */
} example_data;

/* Loads the training split into *d, and the test split too if test. On
 * error *d may hold the tensors that did load: free it either way. */
int example_data_load(example_data *d, const char *dir, bool test);
/* Accepts a zeroed *d. */
void example_data_free(example_data *d);

/* An optimizer of opts's kind (AdamW in both examples) over pl's
 * parameters, in two groups: weight_decay for matrices and embeddings (2 or
 * more dims), none for biases and norms. NULL on error. */
ct_optim *example_optimizer(ct_ddp *ddp, const ct_param_list *pl, const ct_optim_options *opts,
                            double weight_decay);

/* ------------------------------------------------------------- reporting */

/* The class of each image: images [n, 784] -> int64 [n], owned by the
 * current scope; NULL on error. */
typedef ct_tensor *(*example_predict_fn)(void *ctx, ct_tensor *images);

/* *acc = the fraction of images [N, 784] whose predicted class is their
 * label [N], predicted 1000 at a time without a graph, each batch moved to
 * device first. The first error stops it (*acc counts the batches before
 * it). */
int example_evaluate(example_predict_fn predict, void *ctx, ct_tensor *images, ct_tensor *labels,
                     ct_device device, double *acc);

/* On a terminal one line, redrawn at most 5 times a second; elsewhere a
 * line every 5 seconds, so that logs stay short. */
typedef struct example_progress {
    int epochs;       /* 0: a run not counted in epochs */
    int64_t steps;    /* per epoch, or in the run; 0: not known (yet) */
    const char *unit; /* what the rate counts: "samples" unless set after init */
    bool tty;
    double last_print;
} example_progress;

void example_progress_init(example_progress *p, int epochs, int64_t steps);
/* step counts from 1 in each epoch; rate (units/s) and eta (s) as
 * estimated. */
void example_progress_show(example_progress *p, int epoch, int64_t step, double loss, double rate,
                           double eta);
/* Shows the epoch's last step even if one was shown just now, and ends the
 * line on a terminal, so that the epoch's result goes below it. */
void example_progress_end_epoch(example_progress *p, int epoch, int64_t step, double loss,
                                double rate);

/* "epoch  E  train loss L  test accuracy A%  (R samples/s, T s)". */
void example_print_epoch(int epoch, double loss, double acc, double rate, double seconds);
/* {<head>, "threads": .., "batch": .., "epochs": epochs, "steps": steps,
 * <more>"samples_per_s": rate, "test_acc": acc, "final_loss": loss}: head,
 * the example's first fields; more, "" or fields that end in ", ". */
void example_print_summary(const char *head, const char *more, const example_options *o, int epochs,
                           int64_t steps, double rate, double acc, double loss);

/* Sums (or takes the maximum of) v[0..n-1] across group, in place. */
int example_allreduce_sum(ct_comm *group, double *v, int n);
int example_allreduce_max(ct_comm *group, double *v, int n);

/* ------------------------------------------------------------ checkpoints */

/* What a resumable run saves (fmnist_mlp's and gpt's): the parameters, the
 * optimizer's state, the step, and each rank's random stream (dropout);
 * an example adds its own entries to st (the data position, say) before
 * example_ckpt_resume(). */
typedef struct example_ckpt {
    ct_state *st;
    ct_checkpointer *ck;
    int64_t step, last_saved;
    char path[4096]; /* the checkpoint resumed from; "" for none */
} example_ckpt;

/* --shard 0|1|2|3 into *shard: what ct_ddp shards across the ranks
 * (ct_ddp_shard; docs/sharding.md). */
ct_cli_flag example_shard_flag(int *shard);
/* The model state this rank holds, in bytes, into *m: ct_ddp_memory_of's
 * under data parallel; alone, params' bytes for the parameters and again
 * for their gradients, and opt's state. */
void example_model_state(const ct_ddp *ddp, const ct_optim *opt, const ct_param_list *params,
                         ct_ddp_memory *m);
/* Prints, on every rank, peak (bytes: ct_memory_peak at the point the
 * caller reports) and the model state ddp and opt hold (ct_ddp_memory_of),
 * as one line prefixed by name. */
void example_print_memory(const char *name, const ct_ddp *ddp, const ct_optim *opt, int rank,
                          int64_t peak);

/* --plan and --plan-only: ct_memory_plan before training (docs/sharding.md,
 * "Memory you can ask for"), and the plan set against the measured peak
 * at the end. */
typedef struct example_plan {
    bool plan, only;      /* the flags */
    bool made;            /* a plan was made */
    int64_t base;         /* what the device held before the model was built */
    ct_memory_estimate e; /* the plan */
} example_plan;
#define EXAMPLE_NUM_PLAN_FLAGS 2
void example_plan_flags(example_plan *p, ct_cli_flag out[EXAMPLE_NUM_PLAN_FLAGS]);
/* Notes what device holds before the run builds its model (call it just
 * before), from which the step peak counts; with --plan or --plan-only,
 * plans cfg's run on device and prints the plan on every rank, prefixed
 * by name. 0 or the plan's CT_E* code. */
int example_plan_make(example_plan *p, const char *name, const ct_memory_plan_config *cfg,
                      ct_device device);
/* The planned step peak on device: the plan's, and on the CPU what ct
 * keeps on the host besides (0 without a plan). */
int64_t example_plan_bytes(const example_plan *p, ct_device device);
/* Prints the plan against peak (the device's ct_memory_peak over the
 * training steps) less what was held before the model: the measured step
 * peak. Nothing without a plan. */
void example_plan_check(const example_plan *p, const char *name, int rank, ct_device device,
                        int64_t peak);

/* Registers params (replicated), opt's state per parameter as
 * "optimizer.<state>.<parameter>" (ddp, which may be NULL, says whether opt
 * holds a ZeRO shard: then as blocks of those entries), "train.step" and
 * "rng" (replicated: every rank seeds the default generator alike and
 * draws as much from it). Returns 0 or a CT_E* code; on error the caller
 * still calls example_ckpt_finish(). */
int example_ckpt_init(example_ckpt *r, const ct_param_list *params, ct_optim *opt,
                      const ct_ddp *ddp, ct_comm *world);
/* Faults in the staging memory of background saves (so that the first save
 * does not), then loads the newest checkpoint in dir, if there is one, and
 * sets opt's step count: the step to go on from (0 without a checkpoint),
 * or -1. The checkpoint's path goes to r->path. The caller says what was
 * resumed and what remains (docs/cli.md). */
int64_t example_ckpt_resume(example_ckpt *r, const char *dir, ct_comm *world, ct_optim *opt);
/* Starts a background save of the state after step steps, as
 * dir/step-NNNNNNNN, keeping the last three; once per step (a second call
 * for the same step does nothing). */
int example_ckpt_save(example_ckpt *r, const char *dir, int64_t step, int keep_last);
/* Waits for the last save and frees r (accepts a zeroed r): 0, or -1 when
 * the save failed. */
int example_ckpt_finish(example_ckpt *r);

/* ------------------------------------------------------ the training loop */

/* One training step on images x [b, 784] and labels y [b]; *loss, the
 * batch's mean loss. */
typedef int (*example_step_fn)(void *ctx, ct_tensor *x, ct_tensor *y, double *loss);

typedef struct example_trainer {
    const example_options *o; /* epochs and max_steps; batch and threads as printed */
    ct_loader *loader;        /* this trainer's batches */
    example_step_fn step;
    example_predict_fn predict;
    void *ctx;                  /* step's and predict's */
    ct_comm *group;             /* the trainers that train side by side; NULL: this one alone */
    const char *summary_head;   /* example_print_summary()'s head */
    ct_tensor *test_x, *test_y; /* read by the reporter only */
} example_trainer;

/* Steps through o->epochs epochs of t->loader, or o->max_steps steps. The
 * trainers meet at every epoch's end (an allreduce over t->group) to sum
 * their losses and samples/s, and then the reporter, the group's rank 0,
 * prints what fmnist_mlp prints: progress, the test accuracy after every
 * epoch, and the summary. Stops at the first error. */
int example_train(const example_trainer *t);

#endif /* EXAMPLE_COMMON_H */
