/* tensor_demo: ct's tensor core on real data.
 *
 * Loads Fashion-MNIST from the gzipped IDX files of Debian's
 * dataset-fashion-mnist package, computes the mean image of every class over
 * the 60,000 training images with one matmul, draws the means as ASCII art,
 * and classifies the 10,000 test images by their nearest class mean.
 *
 *   tensor_demo [DATA_DIR [CLASS]]      (tensor_demo --help says more)
 *
 * DATA_DIR defaults to /usr/share/datasets/fashion-mnist; CLASS (0-9) picks
 * the mean drawn at full size. Every op result below is owned by the scope
 * that main() opens, so nothing is freed by hand.
 */
#define _POSIX_C_SOURCE 200809L

#include <ct/ct.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"
#define NCLASSES         10
#define SIDE             28
#define NPIX             (SIDE * SIDE)

static const char *const class_names[NCLASSES] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot",
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Prints what failed with ct's message and returns NULL, so that a helper
 * can `return fail(...)`. */
static ct_tensor *fail(const char *what) {
    fprintf(stderr, "tensor_demo: %s failed: %s\n", what, ct_errmsg());
    return NULL;
}

/* ----------------------------------------------------------- IDX files */

/* One of the data set's files, as ct's IDX reader gives it: uint8 images
 * [n, 28, 28] or labels [n]. */
static ct_tensor *load_idx(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ct_tensor *t = ct_idx_load(path);
    if (!t)
        fprintf(stderr,
                "tensor_demo: %s\n  install Debian's dataset-fashion-mnist package with "
                "`bash ci/setup.sh`, or pass the folder holding the four *-ubyte.gz files\n",
                ct_errmsg());
    return t;
}

/* uint8 images [n, 28, 28] -> float32 pixels in [0, 1] as rows [n, 784]. */
static ct_tensor *to_rows(ct_tensor *images) {
    return ct_div_scalar(ct_to_dtype(ct_flatten(images, 1, 2), CT_FLOAT32), 255.0);
}

/* Labels [n] uint8 -> float32 one-hot rows [n, 10]. */
static ct_tensor *one_hot_rows(ct_tensor *labels) {
    return ct_to_dtype(ct_one_hot(ct_to_dtype(labels, CT_INT64), NCLASSES), CT_FLOAT32);
}

/* ------------------------------------------------------------ ASCII art */

static const char ramp[] = " .:-=+*#%@";

static char shade(double v) {
    int i = (int)lround(v * (double)(sizeof ramp - 2));
    return ramp[i < 0 ? 0 : i > (int)sizeof ramp - 2 ? (int)sizeof ramp - 2 : i];
}

/* Draws a [h, w] image, each pixel `xscale` characters wide. */
static void draw(ct_tensor *img, int xscale) {
    int64_t h = ct_size(img, 0), w = ct_size(img, 1);
    for (int64_t r = 0; r < h; r++) {
        fputs("    ", stdout);
        for (int64_t c = 0; c < w; c++)
            for (int k = 0; k < xscale; k++)
                putchar(shade(ct_get(img, (int64_t[]){r, c})));
        putchar('\n');
    }
}

/* Draws the ten means as 7 x 14 thumbnails, five to a row. A thumbnail
 * averages 4 x 2 pixel blocks: the [28, 28] image viewed as [7, 4, 14, 2]
 * and reduced over dims 1 and 3, so rows and columns keep the aspect of a
 * terminal's tall characters. */
static int draw_gallery(ct_tensor *means) {
    ct_tensor *thumbs = ct_mean(ct_view(means, CT_SHAPE(NCLASSES, 7, 4, 14, 2)), CT_DIMS(2, 4),
                                false); /* [10, 7, 14] */
    if (!thumbs) {
        fail("thumbnails");
        return -1;
    }
    for (int first = 0; first < NCLASSES; first += 5) {
        for (int64_t r = 0; r < 7; r++) {
            fputs("    ", stdout);
            for (int k = first; k < first + 5; k++) {
                for (int64_t c = 0; c < 14; c++)
                    putchar(shade(ct_get(thumbs, (int64_t[]){k, r, c})));
                fputs("   ", stdout);
            }
            putchar('\n');
        }
        fputs("    ", stdout);
        for (int k = first; k < first + 5; k++)
            printf("%-17.14s", class_names[k]);
        printf("\n\n");
    }
    return 0;
}

/* --------------------------------------------------------------- steps */

/* Mean image of each class, [10, 784]: one-hot^T @ X sums the rows of each
 * class in one GEMM (the transposed view goes to BLAS as a flag, not a copy),
 * and a broadcast division by the class counts [10, 1] turns sums into
 * means. The helper's own scope frees its temporaries; ct_keep hands the
 * result to the caller's scope. */
static ct_tensor *class_means(ct_tensor *x, ct_tensor *labels) {
    ct_scope_begin();
    ct_tensor *onehot = one_hot_rows(labels);                          /* [n, 10] */
    ct_tensor *sums = ct_matmul(ct_transpose(onehot, 0, 1), x);        /* [10, 784] */
    ct_tensor *counts = ct_sum(onehot, CT_DIMS(0), false);             /* [10] */
    ct_tensor *means = ct_keep(ct_div(sums, ct_unsqueeze(counts, 1))); /* [10, 784] */
    ct_scope_end();
    return means;
}

/* The same mean for one class without a matmul: a bool mask broadcast over
 * the rows, a masked sum over dim 0, and a division. Returns the largest
 * difference from the matmul result, or NAN on error. */
static double check_mean(ct_tensor *x, ct_tensor *labels, ct_tensor *means, int cls) {
    ct_scope_begin();
    ct_tensor *mask = ct_to_dtype(ct_eq_scalar(labels, cls), CT_FLOAT32);         /* [n] */
    ct_tensor *sum = ct_sum(ct_mul(x, ct_unsqueeze(mask, 1)), CT_DIMS(0), false); /* [784] */
    ct_tensor *mean = ct_div(sum, ct_sum(mask, NULL, 0, false));
    ct_tensor *diff = ct_amax(ct_abs(ct_sub(mean, ct_select(means, 0, cls))), NULL, 0, false);
    double d = diff ? ct_item(diff) : (fail("masked mean"), NAN);
    ct_scope_end();
    return d;
}

/* Squared distances from every row of x [n, 784] to every mean [10, 784]:
 * |x - m|^2 = |x|^2 - 2 x.m + |m|^2, a matmul (the transposed means reach
 * BLAS as a flag) and two broadcast adds: [n, 1] + [n, 10] + [10]. */
static ct_tensor *sq_dists(ct_tensor *x, ct_tensor *means) {
    ct_scope_begin();
    ct_tensor *xm = ct_matmul(x, ct_transpose(means, 0, 1));         /* [n, 10] */
    ct_tensor *xx = ct_sum(ct_mul(x, x), CT_DIMS(1), true);          /* [n, 1] */
    ct_tensor *mm = ct_sum(ct_mul(means, means), CT_DIMS(1), false); /* [10] */
    ct_tensor *d2 = ct_keep(ct_add(ct_sub(xx, ct_mul_scalar(xm, 2.0)), mm));
    ct_scope_end();
    return d2;
}

/* Mean negative log-likelihood of the labels under softmax(-d2 / temp):
 * log_softmax, then gather picks each row's true class. NAN on error. */
static double mean_nll(ct_tensor *d2, ct_tensor *labels, double temp) {
    ct_scope_begin();
    ct_tensor *logp = ct_log_softmax(ct_div_scalar(d2, -temp), 1);   /* [n, 10] */
    ct_tensor *picked = ct_gather(logp, 1, ct_unsqueeze(labels, 1)); /* [n, 1] */
    ct_tensor *m = ct_mean(picked, NULL, 0, false);
    double v = m ? -ct_item(m) : (fail("log-likelihood"), NAN);
    ct_scope_end();
    return v;
}

int main(int argc, char **argv) {
    ct_cli cli = {.prog = "tensor_demo",
                  .about = "Computes the mean image of every Fashion-MNIST class with one matmul,\n"
                           "draws them, and classifies the test images by the nearest mean.\n"
                           "DATA_DIR: " DEFAULT_DATA_DIR " by default; CLASS (0-9, default 9):\n"
                           "the mean drawn at full size.",
                  .args = "[DATA_DIR [CLASS]]"};
    int first, rc = ct_cli_parse(&cli, argc, argv, &first);
    if (rc)
        return rc > 0 ? 0 : 2;
    int npos = argc - first;
    const char *dir = npos > 0 ? argv[first] : DEFAULT_DATA_DIR;
    int cls = 9;
    char *end = NULL;
    long picked = npos > 1 ? strtol(argv[first + 1], &end, 10) : cls;
    if (npos > 2 || (npos > 1 && (!*argv[first + 1] || *end || picked < 0 || picked >= NCLASSES))) {
        fprintf(stderr, "tensor_demo: %s\nTry 'tensor_demo --help'.\n",
                npos > 2 ? "at most DATA_DIR and CLASS" : "CLASS is a whole number in [0, 9]");
        return 2;
    }
    cls = (int)picked;
    /* Progress lines appear as they happen, also in a CI log. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ct tensor demo: Fashion-MNIST from %s, %d threads\n\n", dir, ct_get_num_threads());

    ct_scope_begin();
    int status = 1;
    double t0 = now();

    ct_tensor *train_img = load_idx(dir, "train-images-idx3-ubyte.gz");
    ct_tensor *train_lab = train_img ? load_idx(dir, "train-labels-idx1-ubyte.gz") : NULL;
    ct_tensor *test_img = train_lab ? load_idx(dir, "t10k-images-idx3-ubyte.gz") : NULL;
    ct_tensor *test_lab = test_img ? load_idx(dir, "t10k-labels-idx1-ubyte.gz") : NULL;
    if (!test_lab)
        goto out;
    if (ct_ndim(train_img) != 3 || ct_ndim(test_img) != 3 ||
        ct_tensor_dtype(train_img) != CT_UINT8 || ct_size(train_img, 0) != ct_size(train_lab, 0) ||
        ct_size(test_img, 0) != ct_size(test_lab, 0) || ct_size(train_img, 1) != SIDE ||
        ct_size(train_img, 2) != SIDE || ct_size(test_img, 1) != SIDE) {
        fprintf(stderr,
                "tensor_demo: image and label files do not match (expected %dx%d "
                "images, one label each)\n",
                SIDE, SIDE);
        goto out;
    }
    printf("[1/5] loaded %lld training and %lld test images in %.2f s\n",
           (long long)ct_size(train_img, 0), (long long)ct_size(test_img, 0), now() - t0);
    printf("      first training labels:\n");
    ct_print(ct_narrow(train_lab, 0, 0, 10));

    t0 = now();
    ct_tensor *x = to_rows(train_img); /* [60000, 784] */
    ct_tensor *means = class_means(x, train_lab);
    if (!means) {
        fail("class means");
        goto out;
    }
    double diff = check_mean(x, train_lab, means, cls);
    if (isnan(diff))
        goto out;
    printf("\n[2/5] mean image of each class over %lld images in %.2f s (one-hot^T @ X)\n",
           (long long)ct_size(x, 0), now() - t0);
    printf("      a masked sum gives the same '%s' mean: largest difference %.2g\n",
           class_names[cls], diff);
    printf("      ten pixels from the middle of that mean image:\n");
    ct_print(ct_narrow(ct_select(means, 0, cls), 0, 14 * SIDE + 9, 10));

    printf("\n[3/5] mean '%s' (class %d):\n\n", class_names[cls], cls);
    ct_tensor *img = ct_view(ct_select(means, 0, cls), CT_SHAPE(SIDE, SIDE));
    if (!img) {
        fail("view");
        goto out;
    }
    draw(img, 2);
    printf("\n      all ten means, pooled over 4x2 pixel blocks by a view and a mean:\n\n");
    if (draw_gallery(means))
        goto out;

    /* Nearest mean: the class whose mean image is closest in squared
     * distance. */
    t0 = now();
    ct_tensor *xt = to_rows(test_img);                  /* [10000, 784] */
    ct_tensor *d2 = sq_dists(xt, means);                /* [10000, 10] */
    ct_tensor *pred = ct_argmin(d2, 1, false);          /* [10000] int64 */
    ct_tensor *truth = ct_to_dtype(test_lab, CT_INT64); /* [10000] */
    ct_tensor *acc = ct_mean(ct_to_dtype(ct_eq(pred, truth), CT_FLOAT32), NULL, 0, false);
    if (!acc) {
        fail("nearest-mean classifier");
        goto out;
    }
    double secs = now() - t0;
    printf("\n[4/5] nearest class mean on %lld test images: accuracy %.2f%% (%.0f ms)\n",
           (long long)ct_size(xt, 0), 100.0 * ct_item(acc), secs * 1e3);

    /* Distances become probabilities through softmax(-d2 / T); T is the
     * temperature that best explains the training labels. */
    ct_tensor *d2_train = sq_dists(x, means);
    ct_tensor *train_truth = ct_to_dtype(train_lab, CT_INT64);
    double best_t = 0, best_nll = INFINITY;
    for (double temp = 1; temp <= 64; temp *= 2) {
        double v = mean_nll(d2_train, train_truth, temp);
        if (isnan(v))
            goto out;
        if (v < best_nll) {
            best_nll = v;
            best_t = temp;
        }
    }
    printf("      confidence: softmax(-distance^2 / T), T = %g fitted on the training set "
           "(mean NLL %.3f)\n",
           best_t, best_nll);

    /* A few test images at random (fixed seed: the same ones every run). */
    ct_manual_seed(2024);
    ct_tensor *pick = ct_narrow(ct_randperm(ct_size(xt, 0), NULL), 0, 0, 6);
    ct_tensor *pick_pred = ct_index_select(pred, 0, pick);
    ct_tensor *pick_true = ct_index_select(truth, 0, pick);
    ct_tensor *prob = ct_softmax(ct_div_scalar(ct_index_select(d2, 0, pick), -best_t), 1);
    if (!prob) {
        fail("sample predictions");
        goto out;
    }
    for (int64_t i = 0; i < ct_size(pick, 0); i++) {
        int64_t p = (int64_t)ct_get(pick_pred, &i), t = (int64_t)ct_get(pick_true, &i);
        printf("      test image %5lld: predicted %-11s (p = %.2f), is %-11s %s\n",
               (long long)ct_get(pick, &i), class_names[p], ct_get(prob, (int64_t[]){i, p}),
               class_names[t], p == t ? "" : "<- wrong");
    }

    /* Confusion matrix: truth one-hot^T @ prediction one-hot, [10, 10]. */
    ct_tensor *conf = ct_contiguous(ct_to_dtype(
        ct_matmul(ct_transpose(one_hot_rows(truth), 0, 1), one_hot_rows(pred)), CT_INT64));
    if (!conf) {
        fail("confusion matrix");
        goto out;
    }
    printf("\n[5/5] confusion matrix (rows: true class, columns: predicted):\n");
    ct_print(conf);
    /* The diagonal is a strided view of the same storage: stride 11. */
    ct_tensor *diag =
        ct_tensor_from_storage(ct_tensor_storage(conf), ct_tensor_offset(conf), 1,
                               (int64_t[]){NCLASSES}, (int64_t[]){NCLASSES + 1}, CT_INT64);
    ct_tensor *recall = ct_div(diag, ct_sum(conf, CT_DIMS(1), false)); /* [10] float32 */
    if (!recall) {
        fail("per-class accuracy");
        goto out;
    }
    printf("      per-class accuracy (diagonal / row sums):\n");
    for (int64_t k = 0; k < NCLASSES; k++)
        printf("      %-11s %5.1f%%\n", class_names[k], 100.0 * ct_get(recall, &k));

    /* Mistakes are reported, not fatal: X @ means has mismatched inner
     * sizes, and ct says so. */
    ct_tensor *wrong = ct_matmul(xt, means);
    printf("\nct reports a mistake instead of crashing; ct_matmul(X, means) gives %s:\n  %s\n",
           wrong ? "a tensor?!" : "NULL", ct_errmsg());
    ct_errclear();
    status = wrong ? 1 : 0;

out:
    ct_scope_end();
    return status;
}
