/* bench_train_floor: the fmnist_mlp training step written by hand on OpenBLAS,
 * with no framework: the rate any framework can at best approach.
 *
 *   bench_train_floor [--epochs N] [--max-steps N] [--seed S]
 *                     [--warmup-steps N] [--data DIR]
 *
 * The recipe: a 784-256-256-10 MLP with ReLU, mean cross-entropy, SGD with
 * momentum 0.9 and lr 0.05 (PyTorch's: buf = 0.9 buf + grad; p -= lr buf),
 * batch 64 with the last partial batch kept, inputs = pixels / 255, weights
 * and biases drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as nn.Linear does.
 * train_torch.py runs the same recipe in PyTorch; docs/bench-train.md says
 * what is timed.
 *
 * One thread. Every buffer is allocated before the first step. Weights are
 * stored as PyTorch stores them, (out, in), in one flat block, and the
 * momentum buffers in a second block of the same layout (llm.c's scheme).
 *
 * stdout: one JSON object. stderr: notes, and the test accuracy per epoch. */
#include "bench_time.h"
#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#define IN       784
#define HID      256
#define OUT      10
#define BATCH    64
#define LR       0.05f
#define MOMENTUM 0.9f

#define NPARAMS  (HID * IN + HID + HID * HID + HID + OUT * HID + OUT)

static const char *const usage =
    "usage: bench_train_floor [--epochs N] [--max-steps N] [--seed S] [--warmup-steps N] "
    "[--data DIR]\n";

typedef struct options {
    long long epochs, max_steps, seed, warmup_steps;
    const char *data_dir;
} options;

/* Views into a flat block of NPARAMS floats: the parameters, or the momentum
 * buffers in the same layout. */
typedef struct mlp {
    float *w1; /* (HID, IN) */
    float *b1; /* (HID) */
    float *w2; /* (HID, HID) */
    float *b2; /* (HID) */
    float *w3; /* (OUT, HID) */
    float *b3; /* (OUT) */
} mlp;

/* Activations and their gradients for up to BATCH rows. */
typedef struct acts {
    float *x;   /* (BATCH, IN) inputs */
    float *h1;  /* (BATCH, HID) after ReLU */
    float *h2;  /* (BATCH, HID) after ReLU */
    float *z;   /* (BATCH, OUT) logits */
    float *dz;  /* (BATCH, OUT) dloss/dlogits */
    float *dh2; /* (BATCH, HID) */
    float *dh1; /* (BATCH, HID) */
    uint8_t y[BATCH];
} acts;

typedef struct dataset {
    uint8_t *images; /* (n, IN) */
    uint8_t *labels; /* (n) */
    uint32_t n;
} dataset;

/* ------------------------------------------------------------ random */

/* splitmix64 (Steele, Lea and Flood, 2014): one 64-bit word of state that
 * any seed initialises, and good enough statistics for an init and a
 * shuffle. The weights are drawn first, in the order of mlp's fields, then
 * one permutation per epoch. */
static uint64_t rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Lemire's multiply-shift without the rejection step: for n = 60000 the bias
 * is below n / 2^32, far under what a benchmark's shuffle can notice. */
static uint32_t rng_below(uint64_t *state, uint32_t n) {
    return (uint32_t)(((rng_next(state) >> 32) * n) >> 32);
}

static void fill_uniform(uint64_t *state, float *p, int n, float bound) {
    for (int i = 0; i < n; i++) {
        float u = (float)(rng_next(state) >> 40) * 0x1p-24f;
        p[i] = (2.0f * u - 1.0f) * bound;
    }
}

static void shuffle(uint64_t *state, uint32_t *perm, uint32_t n) {
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = rng_below(state, i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ------------------------------------------------------------ data */

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads `want` bytes; false after printing how far the file got. */
static bool read_exact(gzFile f, const char *path, void *buf, size_t want, const char *what) {
    int got = gzread(f, buf, (unsigned)want);
    if (got < 0) {
        int code;
        fprintf(stderr, "bench_train_floor: %s: reading the %s: %s\n", path, what,
                gzerror(f, &code));
        return false;
    }
    if ((size_t)got != want) {
        fprintf(stderr,
                "bench_train_floor: %s: the %s needs %zu bytes but the file ends after %d\n", path,
                what, want, got);
        return false;
    }
    return true;
}

/* Reads a gzipped IDX file of unsigned bytes with `ndim` dims, the first
 * being the item count and the rest equal to `inner`. Returns the malloc'ed
 * payload and the count in *count, or NULL after printing why. */
static uint8_t *read_idx(const char *path, int ndim, const uint32_t *inner, uint32_t *count) {
    gzFile f = gzopen(path, "rb");
    if (!f) {
        fprintf(stderr, "bench_train_floor: %s: %s\n", path,
                errno ? strerror(errno) : "gzopen failed");
        return NULL;
    }
    uint8_t *data = NULL;
    uint8_t head[4 + 4 * 3];
    if (!read_exact(f, path, head, 4 + 4 * (size_t)ndim, "header"))
        goto out;
    uint32_t magic = be32(head);
    if (magic != (0x0800u | (uint32_t)ndim)) {
        fprintf(stderr,
                "bench_train_floor: %s: magic 0x%08x, expected 0x%08x (unsigned bytes, %d dims)\n",
                path, magic, 0x0800u | (uint32_t)ndim, ndim);
        goto out;
    }
    size_t item = 1;
    for (int d = 1; d < ndim; d++) {
        uint32_t size = be32(head + 4 + 4 * d);
        if (size != inner[d - 1]) {
            fprintf(stderr, "bench_train_floor: %s: dim %d is %u, expected %u\n", path, d, size,
                    inner[d - 1]);
            goto out;
        }
        item *= size;
    }
    *count = be32(head + 4);
    if (*count == 0) {
        fprintf(stderr, "bench_train_floor: %s: holds no items\n", path);
        goto out;
    }
    size_t bytes = item * *count;
    /* gzread returns an int. */
    if (bytes > INT_MAX) {
        fprintf(stderr,
                "bench_train_floor: %s: %u items of %zu bytes exceed the %d bytes one "
                "read takes\n",
                path, *count, item, INT_MAX);
        goto out;
    }
    data = malloc(bytes);
    if (!data) {
        fprintf(stderr, "bench_train_floor: %s: out of memory for %zu bytes\n", path, bytes);
        goto out;
    }
    uint8_t extra;
    if (!read_exact(f, path, data, bytes, "payload")) {
        free(data);
        data = NULL;
    } else if (gzread(f, &extra, 1) != 0) {
        fprintf(stderr, "bench_train_floor: %s: data goes on past the %u items the header gives\n",
                path, *count);
        free(data);
        data = NULL;
    }
out:
    gzclose(f);
    return data;
}

/* Loads <dir>/<split>-images-idx3-ubyte.gz and the matching labels. */
static bool load_split(const char *dir, const char *split, dataset *ds) {
    static const uint32_t image_dims[] = {28, 28};
    char path[4096];
    uint32_t nlabels = 0;
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, split);
    ds->images = read_idx(path, 3, image_dims, &ds->n);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    ds->labels = ds->images ? read_idx(path, 1, NULL, &nlabels) : NULL;
    if (!ds->labels)
        return false;
    if (nlabels != ds->n) {
        fprintf(stderr, "bench_train_floor: %s: %u labels for %u images\n", path, nlabels, ds->n);
        return false;
    }
    for (uint32_t i = 0; i < ds->n; i++)
        if (ds->labels[i] >= OUT) {
            fprintf(stderr, "bench_train_floor: %s: label %u of item %u is not below %d\n", path,
                    ds->labels[i], i, OUT);
            return false;
        }
    return true;
}

static void dataset_free(dataset *ds) {
    free(ds->images);
    free(ds->labels);
}

/* Rows idx[0..n) as floats; division rather than a multiply by 1/255 so that
 * the inputs are bit-identical to PyTorch's `images / 255`. */
static void load_batch(const dataset *ds, const uint32_t *idx, int n, acts *a) {
    for (int r = 0; r < n; r++) {
        const uint8_t *src = ds->images + (size_t)idx[r] * IN;
        float *dst = a->x + (size_t)r * IN;
        for (int k = 0; k < IN; k++)
            dst[k] = (float)src[k] / 255.0f;
        a->y[r] = ds->labels[idx[r]];
    }
}

/* ------------------------------------------------------------ model */

static void mlp_point(mlp *m, float *p) {
    m->w1 = p;
    m->b1 = m->w1 + HID * IN;
    m->w2 = m->b1 + HID;
    m->b2 = m->w2 + HID * HID;
    m->w3 = m->b2 + HID;
    m->b3 = m->w3 + OUT * HID;
}

static void mlp_init(const mlp *m, uint64_t *state) {
    float b_in = 1.0f / sqrtf(IN), b_hid = 1.0f / sqrtf(HID);
    fill_uniform(state, m->w1, HID * IN, b_in);
    fill_uniform(state, m->b1, HID, b_in);
    fill_uniform(state, m->w2, HID * HID, b_hid);
    fill_uniform(state, m->b2, HID, b_hid);
    fill_uniform(state, m->w3, OUT * HID, b_hid);
    fill_uniform(state, m->b3, OUT, b_hid);
}

/* out = x w^T + b, then ReLU when asked. The bias and the ReLU ride on one
 * pass over the output after the sgemm, cheaper than copying the bias in
 * first and letting sgemm read it back with beta = 1. */
static void linear(const float *x, const float *w, const float *b, float *out, int n, int in,
                   int nout, bool relu) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, nout, in, 1.0f, x, in, w, in, 0.0f, out,
                nout);
    for (int i = 0; i < n; i++) {
        float *row = out + (size_t)i * nout;
        for (int j = 0; j < nout; j++) {
            float v = row[j] + b[j];
            row[j] = relu && v <= 0.0f ? 0.0f : v;
        }
    }
}

static void forward(const mlp *m, acts *a, int n) {
    linear(a->x, m->w1, m->b1, a->h1, n, IN, HID, true);
    linear(a->h1, m->w2, m->b2, a->h2, n, HID, HID, true);
    linear(a->h2, m->w3, m->b3, a->z, n, HID, OUT, false);
}

/* Stable softmax, cross-entropy and its gradient in one pass over the
 * logits: dz = (softmax(z) - onehot(y)) / n. Returns the mean loss. */
static float softmax_xent(acts *a, int n) {
    double loss = 0;
    float inv_n = 1.0f / (float)n;
    for (int i = 0; i < n; i++) {
        const float *z = a->z + i * OUT;
        float *d = a->dz + i * OUT;
        float max = z[0];
        for (int j = 1; j < OUT; j++)
            max = z[j] > max ? z[j] : max;
        float sum = 0.0f;
        for (int j = 0; j < OUT; j++) {
            d[j] = expf(z[j] - max);
            sum += d[j];
        }
        loss += logf(sum) - (z[a->y[i]] - max);
        float scale = inv_n / sum;
        for (int j = 0; j < OUT; j++)
            d[j] *= scale;
        d[a->y[i]] -= inv_n;
    }
    return (float)(loss / n);
}

/* Adds d's column sums, the bias gradient, to the momentum buffer vb. With h,
 * the output of a ReLU, it first zeroes d where h is not positive: the ReLU's
 * backward rides on the same pass. */
static void bias_grad(float *d, const float *h, float *vb, int n, int width) {
    for (int i = 0; i < n; i++) {
        float *dr = d + (size_t)i * width;
        const float *hr = h ? h + (size_t)i * width : NULL;
        for (int j = 0; j < width; j++) {
            if (hr)
                dr[j] = hr[j] > 0.0f ? dr[j] : 0.0f;
            vb[j] += dr[j];
        }
    }
}

/* p -= LR v, then v *= MOMENTUM for the next step, in one pass. Between steps
 * the buffer therefore holds MOMENTUM buf, and adding the next gradient to it
 * gives PyTorch's buf = MOMENTUM buf + grad without a pass of its own. */
static void sgd_update(float *restrict p, float *restrict v, int count) {
    for (int i = 0; i < count; i++) {
        p[i] -= LR * v[i];
        v[i] *= MOMENTUM;
    }
}

/* Backward through the layer out = x w^T + b, whose output gradient d is
 * final and whose bias gradient is already in the momentum buffer, then its
 * update. dx (may be NULL) gets d w from the weights before the update. The
 * weight gradient goes straight into the momentum buffer vw (sgemm's beta = 1,
 * so no gradient buffer and no scaling pass); the update follows at once,
 * while vw is still in cache, and covers the bias too, as mlp_point puts it
 * right after w. */
static void linear_backward(const float *d, const float *x, float *dx, float *w, float *vw, int n,
                            int nout, int in) {
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, nout, 1.0f, d, nout, w, in,
                    0.0f, dx, in);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nout, in, n, 1.0f, d, nout, x, in, 1.0f,
                vw, in);
    sgd_update(w, vw, nout * in + nout);
}

/* One SGD-momentum step on the rows already in a->x and a->y; returns the
 * batch's mean loss. */
static float train_step(const mlp *m, const mlp *v, acts *a, int n) {
    forward(m, a, n);
    float loss = softmax_xent(a, n);
    bias_grad(a->dz, NULL, v->b3, n, OUT);
    linear_backward(a->dz, a->h2, a->dh2, m->w3, v->w3, n, OUT, HID);
    bias_grad(a->dh2, a->h2, v->b2, n, HID);
    linear_backward(a->dh2, a->h1, a->dh1, m->w2, v->w2, n, HID, HID);
    bias_grad(a->dh1, a->h1, v->b1, n, HID);
    linear_backward(a->dh1, a->x, NULL, m->w1, v->w1, n, HID, IN);
    return loss;
}

/* Fraction of the test set whose largest logit is its label. */
static double evaluate(const mlp *m, const dataset *test, const uint32_t *iota, acts *a) {
    uint32_t correct = 0;
    for (uint32_t start = 0; start < test->n; start += BATCH) {
        int n = test->n - start < BATCH ? (int)(test->n - start) : BATCH;
        load_batch(test, iota + start, n, a);
        forward(m, a, n);
        for (int i = 0; i < n; i++) {
            const float *z = a->z + i * OUT;
            int best = 0;
            for (int j = 1; j < OUT; j++)
                best = z[j] > z[best] ? j : best;
            correct += best == a->y[i];
        }
    }
    return (double)correct / test->n;
}

/* ------------------------------------------------------------ main */

static bool parse_count(const char *flag, const char *s, long long min, long long *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || end == s || *end || errno || v < min) {
        fprintf(stderr, "bench_train_floor: %s %s: expected an integer >= %lld\n%s", flag,
                s ? s : "(missing)", min, usage);
        return false;
    }
    *out = v;
    return true;
}

/* Returns 0 on success, 1 on bad arguments (after printing why), -1 for
 * --help. */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.epochs = 1,
                   .max_steps = -1,
                   .seed = 0,
                   .warmup_steps = 50,
                   .data_dir = "/usr/share/datasets/fashion-mnist"};
    /* Each flag takes the next argument as its value. */
    for (int i = 1; i < argc; i += 2) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok;
        if (!strcmp(flag, "-h") || !strcmp(flag, "--help")) {
            fputs(usage, stdout);
            return -1;
        } else if (!strcmp(flag, "--epochs")) {
            ok = parse_count(flag, val, 1, &o->epochs);
        } else if (!strcmp(flag, "--max-steps")) {
            ok = parse_count(flag, val, 1, &o->max_steps);
        } else if (!strcmp(flag, "--seed")) {
            ok = parse_count(flag, val, 0, &o->seed);
        } else if (!strcmp(flag, "--warmup-steps")) {
            ok = parse_count(flag, val, 0, &o->warmup_steps);
        } else if (!strcmp(flag, "--data")) {
            ok = val != NULL;
            o->data_dir = val;
        } else {
            fprintf(stderr, "bench_train_floor: unknown argument '%s'\n%s", flag, usage);
            return 1;
        }
        if (!ok)
            return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : 2;
    openblas_set_num_threads(1);
    fprintf(stderr, "bench_train_floor: %s, core %s, 1 thread\n", openblas_get_config(),
            openblas_get_corename());

    dataset train = {0}, test = {0};
    float *params = NULL, *moment = NULL, *act_block = NULL;
    uint32_t *perm = NULL, *iota = NULL;
    rc = 1;
    if (!load_split(o.data_dir, "train", &train) || !load_split(o.data_dir, "t10k", &test))
        goto out;
    long long steps_per_epoch = (train.n + BATCH - 1) / BATCH;
    long long total = o.epochs * steps_per_epoch;
    if (o.max_steps > 0 && o.max_steps < total)
        total = o.max_steps;
    if (total <= o.warmup_steps) {
        fprintf(stderr, "bench_train_floor: %lld steps leave none after %lld warm-up steps\n",
                total, o.warmup_steps);
        rc = 2;
        goto out;
    }

    size_t pbytes = ((sizeof(float) * NPARAMS + 63) / 64) * 64;
    size_t abytes = sizeof(float) * BATCH * (IN + 4 * HID + 2 * OUT);
    params = aligned_alloc(64, pbytes);
    moment = aligned_alloc(64, pbytes);
    act_block = aligned_alloc(64, abytes);
    perm = malloc(sizeof(uint32_t) * train.n);
    iota = malloc(sizeof(uint32_t) * test.n);
    if (!params || !moment || !act_block || !perm || !iota) {
        fprintf(stderr, "bench_train_floor: out of memory\n");
        goto out;
    }
    mlp m, v;
    mlp_point(&m, params);
    mlp_point(&v, moment);
    acts a = {.x = act_block};
    a.h1 = a.x + BATCH * IN;
    a.h2 = a.h1 + BATCH * HID;
    a.dh1 = a.h2 + BATCH * HID;
    a.dh2 = a.dh1 + BATCH * HID;
    a.z = a.dh2 + BATCH * HID;
    a.dz = a.z + BATCH * OUT;
    for (uint32_t i = 0; i < train.n; i++)
        perm[i] = i;
    for (uint32_t i = 0; i < test.n; i++)
        iota[i] = i;

    uint64_t rng = (uint64_t)o.seed;
    mlp_init(&m, &rng);
    /* Zero momentum makes the first update buf = grad, as PyTorch's is. */
    memset(moment, 0, pbytes);

    long long step = 0, epoch = 0, epoch_steps = 0, timed_samples = 0;
    double timed = 0, loss_sum = 0, acc = 0;
    while (step < total) {
        shuffle(&rng, perm, train.n);
        loss_sum = 0;
        epoch_steps = 0;
        for (uint32_t start = 0; start < train.n && step < total; start += BATCH, step++) {
            int n = train.n - start < BATCH ? (int)(train.n - start) : BATCH;
            double t0 = bench_now();
            load_batch(&train, perm + start, n, &a);
            loss_sum += train_step(&m, &v, &a, n);
            if (step >= o.warmup_steps) {
                timed += bench_now() - t0;
                timed_samples += n;
            }
            epoch_steps++;
        }
        epoch++;
        acc = evaluate(&m, &test, iota, &a);
        fprintf(stderr,
                "bench_train_floor: epoch %lld: %lld steps, mean loss %.4f, test accuracy %.4f\n",
                epoch, epoch_steps, loss_sum / (double)epoch_steps, acc);
    }
    printf("{\"bench\": \"train\", \"impl\": \"c_floor\", \"threads\": 1, \"batch\": %d, "
           "\"epochs\": %lld, \"steps\": %lld, \"timed_steps\": %lld, \"samples_per_s\": %.1f, "
           "\"test_acc\": %.4f, \"final_loss\": %.4f}\n",
           BATCH, epoch, step, step - o.warmup_steps, (double)timed_samples / timed, acc,
           loss_sum / (double)epoch_steps);
    rc = 0;
out:
    free(iota);
    free(perm);
    free(act_block);
    free(moment);
    free(params);
    dataset_free(&test);
    dataset_free(&train);
    return rc;
}
