/* Random draws: the Philox4x32-10 block function against its published
 * known answers, the stream definition, reproducibility on any thread count,
 * distribution moments and errors. */
#include "ct_test.h"

/* The block function is a private, dependency-free header, so that the
 * known-answer test checks the very code the library runs. */
#include "../tensor/philox.h"

#include <pthread.h>
#include <stdlib.h>

static const ct_dtype float_dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16};

TEST(philox_known_answers) {
    /* From kat_vectors in the Random123 distribution (philox4x32 10). */
    static const uint32_t kat[][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int c = 0; c < 3; c++) {
        uint32_t out[4];
        ct__philox4x32_10(kat[c], kat[c] + 4, out);
        for (int w = 0; w < 4; w++)
            ASSERT_EQ(out[w], kat[c][6 + w]);
    }
    /* Offsets carry into the counter's high words. */
    uint32_t a[4], b[4];
    ct__philox_block(7, UINT64_MAX, 1, a);
    ct__philox4x32_10((uint32_t[]){0, 0, 1, 0}, (uint32_t[]){7, 0}, b);
    ASSERT_TRUE(memcmp(a, b, sizeof a) == 0);
}

/* The public draws follow the documented stream: with seed 0 at offset 0,
 * block 0 is the first known answer above. */
TEST(draws_follow_the_stream_definition) {
    static const uint32_t w[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    ct_generator gen = {0, 0};
    ct_tensor *f = ct_rand(CT_SHAPE(4), CT_FLOAT32, &gen);
    ASSERT_EQ(gen.offset, 1);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(tt_at(f, i), ldexp((double)(w[i] >> 8), -24));
    gen = (ct_generator){0, 0};
    ct_tensor *d = ct_rand(CT_SHAPE(2), CT_FLOAT64, &gen);
    ASSERT_EQ(gen.offset, 1);
    for (int i = 0; i < 2; i++) {
        uint64_t u = (uint64_t)w[2 * i + 1] << 32 | w[2 * i];
        ASSERT_EQ(tt_at(d, i), ldexp((double)(u >> 11), -53));
    }
    gen = (ct_generator){0, 0};
    ct_tensor *h = ct_rand(CT_SHAPE(4), CT_BFLOAT16, &gen);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(tt_at(h, i), ldexp((double)(w[i] >> 24), -8));
    /* Each draw advances the offset by the blocks it used. */
    gen = (ct_generator){5, 10};
    ct_rand(CT_SHAPE(5), CT_FLOAT32, &gen);
    ASSERT_EQ(gen.offset, 12);
    ct_randn(CT_SHAPE(5), CT_FLOAT64, &gen);
    ASSERT_EQ(gen.offset, 15);
    ct_bernoulli_(ct_zeros(CT_SHAPE(3), CT_FLOAT32), 0.5, &gen);
    ASSERT_EQ(gen.offset, 17);
    ct_randperm(7, &gen);
    ASSERT_EQ(gen.offset, 21);
    ct_rand(CT_SHAPE(0), CT_FLOAT32, &gen);
    ASSERT_EQ(gen.offset, 21);
}

static bool same_values(ct_tensor *a, ct_tensor *b) {
    return a && b && ct_numel(a) == ct_numel(b) && ct_tensor_dtype(a) == ct_tensor_dtype(b) &&
           memcmp(ct_data_ptr(a), ct_data_ptr(b),
                  (size_t)ct_numel(a) * ct_dtype_size(ct_tensor_dtype(a))) == 0;
}

/* Every kind of draw, from the default generator after seeding. */
static void draw_all(uint64_t seed, ct_tensor **out) {
    ct_manual_seed(seed);
    out[0] = ct_rand(CT_SHAPE(3, 33335), CT_FLOAT32, NULL);
    out[1] = ct_randn(CT_SHAPE(100003), CT_FLOAT64, NULL);
    out[2] = ct_randn(CT_SHAPE(1023, 17), CT_BFLOAT16, NULL);
    out[3] = ct_bernoulli(ct_full(CT_SHAPE(50001), 0.3, CT_FLOAT16), NULL);
    out[4] = ct_randperm(100001, NULL);
    out[5] = ct_clone(ct_uniform_(
        tt_layout_of(ct_zeros(CT_SHAPE(301, 333), CT_FLOAT32), TT_TRANSPOSED), -1, 2, NULL));
}

TEST(same_seed_same_numbers_on_any_thread_count) {
    ct_tensor *ref[6], *again[6];
    int saved = ct_get_num_threads();
    ASSERT_EQ(ct_set_num_threads(1), 0);
    draw_all(1234, ref);
    for (int threads = 2; threads <= 3; threads++) {
        ASSERT_EQ(ct_set_num_threads(threads), 0);
        draw_all(1234, again);
        for (int i = 0; i < 6; i++) {
            if (!same_values(ref[i], again[i])) {
                ct_set_num_threads(saved);
                tt_fail(__FILE__, __LINE__, "draw %d differs at %d threads", i, threads);
                return;
            }
        }
    }
    ct_set_num_threads(saved);
    draw_all(1235, again);
    for (int i = 0; i < 6; i++)
        ASSERT_TRUE(!same_values(ref[i], again[i]));
}

/* Mean and variance of a contiguous draw. */
static void moments(ct_tensor *t, double *mean, double *var) {
    int64_t n = ct_numel(t);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = tt_at(t, i);
        s += v;
        s2 += v * v;
    }
    *mean = s / (double)n;
    *var = s2 / (double)n - *mean * *mean;
}

TEST(uniform_and_normal_moments) {
    ct_generator gen = {42, 0};
    /* With 1e6 draws the standard error of the mean is ~3e-4 (uniform) and
     * 1e-3 (normal); the bounds are five of them. */
    for (int d = 0; d < 4; d++) {
        ct_dtype dt = float_dtypes[d];
        double mean, var;
        ct_tensor *u = ct_rand(CT_SHAPE(1000, 1000), dt, &gen);
        ASSERT_TRUE(u);
        moments(u, &mean, &var);
        double q = dt == CT_BFLOAT16 ? 1.0 / 256 : dt == CT_FLOAT16 ? 1.0 / 2048 : 0;
        ASSERT_NEAR(mean, 0.5 - q / 2, 1.5e-3);
        ASSERT_NEAR(var, 1.0 / 12, 1.5e-3);
        double lo = INFINITY, hi = -INFINITY;
        for (int64_t i = 0; i < ct_numel(u); i++) {
            double v = tt_at(u, i);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        ASSERT_TRUE(lo >= 0 && hi < 1);
        ct_tensor *n = ct_randn(CT_SHAPE(1000000), dt, &gen);
        moments(n, &mean, &var);
        ASSERT_NEAR(mean, 0, 5e-3);
        ASSERT_NEAR(var, 1, dt == CT_BFLOAT16 ? 1e-2 : 5e-3);
        ct_tensor *s = ct_normal_(ct_empty(CT_SHAPE(1000000), dt), 3, 0.5, &gen);
        moments(s, &mean, &var);
        ASSERT_NEAR(mean, 3, 5e-3);
        ASSERT_NEAR(var, 0.25, 0.25 * (dt == CT_BFLOAT16 ? 3e-2 : 5e-3));
    }
    ct_tensor *r = ct_uniform_(ct_empty(CT_SHAPE(1000000), CT_FLOAT64), -3, 5, &gen);
    double mean, var;
    moments(r, &mean, &var);
    ASSERT_NEAR(mean, 1, 1e-2);
    ASSERT_NEAR(var, 64.0 / 12, 2e-2);
    /* A degenerate range gives its one value. */
    ct_tensor *c = ct_uniform_(ct_empty(CT_SHAPE(17), CT_FLOAT32), 2, 2, &gen);
    for (int64_t i = 0; i < 17; i++)
        ASSERT_EQ(tt_at(c, i), 2);
}

TEST(in_place_draws_follow_row_major_order) {
    /* Element i of a draw is the i-th in row-major order whatever the
     * layout, so a strided target gets the same values as a contiguous
     * one. */
    for (int lay = 0; lay < TT_NLAYOUTS; lay++) {
        ct_generator g1 = {9, 3}, g2 = {9, 3};
        ct_tensor *want = ct_normal_(ct_empty(CT_SHAPE(17, 1023), CT_FLOAT32), 1, 2, &g1);
        ct_tensor *t = tt_layout_of(ct_zeros(CT_SHAPE(17, 1023), CT_FLOAT32), (tt_layout)lay);
        ASSERT_TRUE(ct_normal_(t, 1, 2, &g2) == t);
        ASSERT_CLOSE(t, want, 0, 0);
        ASSERT_EQ(g1.offset, g2.offset);
    }
    /* Size-0 and size-1 targets. */
    ct_generator g = {1, 0};
    ASSERT_TRUE(ct_uniform_(ct_empty(CT_SHAPE(0, 5), CT_FLOAT32), 0, 1, &g));
    ASSERT_EQ(g.offset, 0);
    ct_tensor *one = ct_uniform_(ct_empty(CT_SHAPE(1, 1), CT_FLOAT64), 0, 1, &g);
    ASSERT_TRUE(one && tt_at(one, 0) >= 0 && tt_at(one, 0) < 1);
    ASSERT_EQ(g.offset, 1);
}

TEST(bernoulli_rows_depend_on_their_row_alone) {
    /* Rows 2 and 0 of a draw of 4, drawn alone, are those rows of the
     * whole draw, in every layout and for rows of an odd size (the last
     * block half used) too; the generator advances by the whole draw. */
    for (int64_t per = 5; per <= 6; per++)
        for (int lay = 0; lay < TT_NLAYOUTS; lay++) {
            ct_generator all_gen = {9, 3}, part_gen = {9, 3};
            ct_tensor *all = ct_bernoulli_rows_(ct_zeros(CT_SHAPE(4, per), CT_FLOAT32), 0.5,
                                                (const int64_t[]){0, 1, 2, 3}, 4, &all_gen);
            ct_tensor *part = tt_layout_of(ct_zeros(CT_SHAPE(2, per), CT_FLOAT32), (tt_layout)lay);
            ASSERT_TRUE(ct_bernoulli_rows_(part, 0.5, (const int64_t[]){2, 0}, 4, &part_gen) ==
                        part);
            ASSERT_CLOSE(ct_select(part, 0, 0), ct_select(all, 0, 2), 0, 0);
            ASSERT_CLOSE(ct_select(part, 0, 1), ct_select(all, 0, 0), 0, 0);
            ASSERT_EQ(all_gen.offset, 3 + 4 * ((per + 1) / 2));
            ASSERT_EQ(part_gen.offset, all_gen.offset);
        }
    /* The rows differ from each other, and half the values are ones. */
    ct_generator gen = {5, 0};
    ct_tensor *big = ct_bernoulli_rows_(ct_zeros(CT_SHAPE(2, 4000), CT_FLOAT32), 0.5,
                                        (const int64_t[]){0, 1}, 2, &gen);
    ASSERT_TRUE(ct_item(ct_sum(ct_abs(ct_sub(ct_select(big, 0, 0), ct_select(big, 0, 1))), NULL, 0,
                               false)) > 1000);
    ASSERT_NEAR(ct_item(ct_mean(big, NULL, 0, false)), 0.5, 0.02);
}

TEST(bernoulli_frequencies) {
    ct_generator gen = {7, 0};
    double probs[] = {0, 0.1, 0.5, 0.9, 1};
    for (int lay = 0; lay < TT_NLAYOUTS; lay++) {
        for (int d = 0; d < 4; d++) {
            /* Each column has its own probability. */
            ct_tensor *p = ct_expand(
                ct_view(ct_to_dtype(ct_from_data(probs, CT_SHAPE(5), CT_FLOAT64), float_dtypes[d]),
                        CT_SHAPE(1, 5)),
                CT_SHAPE(40000, 5));
            if (lay != TT_CONTIGUOUS)
                p = tt_layout_of(p, (tt_layout)lay);
            ct_tensor *b = ct_bernoulli(p, &gen);
            ASSERT_TRUE(b);
            ASSERT_EQ(ct_tensor_dtype(b), float_dtypes[d]);
            for (int c = 0; c < 5; c++) {
                int64_t ones = 0;
                for (int64_t r = 0; r < 40000; r++) {
                    double v = ct_get(b, (int64_t[]){r, c});
                    ASSERT_TRUE(v == 0 || v == 1);
                    ones += v == 1;
                }
                double pc = ct_get(p, (int64_t[]){0, c});
                ASSERT_NEAR((double)ones / 40000, pc, 0.01);
                if (pc == 0 || pc == 1)
                    ASSERT_EQ(ones, pc * 40000);
            }
        }
    }
    /* In place, into any dtype. */
    ct_dtype into[] = {CT_FLOAT32, CT_INT64, CT_UINT8, CT_BOOL};
    for (int d = 0; d < 4; d++) {
        ct_tensor *t = ct_bernoulli_(ct_full(CT_SHAPE(100000), 7, into[d]), 0.25, &gen);
        ASSERT_TRUE(t);
        int64_t ones = 0;
        for (int64_t i = 0; i < 100000; i++) {
            double v = tt_at(t, i);
            ASSERT_TRUE(v == 0 || v == 1);
            ones += v == 1;
        }
        ASSERT_NEAR(ones / 100000.0, 0.25, 0.01);
    }
}

static bool is_permutation(ct_tensor *t, int64_t n) {
    if (!t || ct_tensor_dtype(t) != CT_INT64 || ct_ndim(t) != 1 || ct_size(t, 0) != n)
        return false;
    const int64_t *p = ct_data_ptr(t);
    bool *seen = calloc((size_t)n + 1, 1);
    bool ok = true;
    for (int64_t i = 0; i < n && ok; i++) {
        ok = p[i] >= 0 && p[i] < n && !seen[p[i]];
        if (ok)
            seen[p[i]] = true;
    }
    free(seen);
    return ok;
}

TEST(randperm_is_a_permutation) {
    ct_generator gen = {3, 0};
    int64_t sizes[] = {0, 1, 2, 17, 1023, 100000};
    for (int i = 0; i < 6; i++)
        ASSERT_TRUE(is_permutation(ct_randperm(sizes[i], &gen), sizes[i]));
    /* Not the identity, and different on the next draw. */
    ct_tensor *a = ct_randperm(1023, &gen), *b = ct_randperm(1023, &gen);
    const int64_t *pa = ct_data_ptr(a);
    int64_t fixed = 0;
    for (int64_t i = 0; i < 1023; i++)
        fixed += pa[i] == i;
    ASSERT_TRUE(fixed < 10);
    ASSERT_TRUE(!same_values(a, b));
    /* Position 0 is uniform over the values. */
    int64_t counts[4] = {0};
    for (int r = 0; r < 4000; r++)
        counts[ct_item_int64(ct_select(ct_randperm(4, &gen), 0, 0))]++;
    for (int v = 0; v < 4; v++)
        ASSERT_NEAR(counts[v] / 4000.0, 0.25, 0.035);
}

typedef struct thread_draws {
    int64_t n;
    uint64_t first_offset;
} thread_draws;

static void *draw_from_default(void *arg) {
    thread_draws *d = arg;
    ct_scope_begin();
    for (int i = 0; i < 200; i++)
        ct_rand(CT_SHAPE(d->n), CT_FLOAT32, NULL);
    ct_scope_end();
    return NULL;
}

TEST(default_generator_is_thread_safe) {
    ct_manual_seed(11);
    ASSERT_EQ(ct_default_generator()->seed, 11);
    ASSERT_EQ(ct_default_generator()->offset, 0);
    pthread_t threads[4];
    thread_draws d[4];
    for (int i = 0; i < 4; i++) {
        d[i].n = 4 * (i + 1);
        ASSERT_EQ(pthread_create(&threads[i], NULL, draw_from_default, &d[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    /* Every reservation counted: 200 draws of 1 + 2 + 3 + 4 blocks. */
    ct_tensor *probe = ct_rand(CT_SHAPE(1), CT_FLOAT32, ct_default_generator());
    ASSERT_TRUE(probe);
    ASSERT_EQ(ct_default_generator()->offset, 200 * 10 + 1);
    /* The default generator is the one NULL means. */
    ct_manual_seed(11);
    ct_tensor *a = ct_rand(CT_SHAPE(9), CT_FLOAT64, NULL);
    ct_generator g = {11, 0};
    ASSERT_TRUE(same_values(a, ct_rand(CT_SHAPE(9), CT_FLOAT64, &g)));
}

TEST(random_errors) {
    ct_generator gen = {1, 0};
    ASSERT_FAILS(ct_rand(CT_SHAPE(2), CT_INT64, &gen), CT_EDTYPE, "rand", "int64");
    ASSERT_FAILS(ct_randn(CT_SHAPE(2, -1), CT_FLOAT32, &gen), CT_EINVAL, "randn", "[2, -1]");
    ASSERT_FAILS(ct_uniform_(ct_zeros(CT_SHAPE(2), CT_FLOAT32), 2, 1, &gen), CT_EINVAL, "uniform_",
                 "[2, 1)");
    ASSERT_FAILS(ct_uniform_(ct_zeros(CT_SHAPE(2), CT_INT32), 0, 1, &gen), CT_EDTYPE, "uniform_",
                 "int32");
    ASSERT_FAILS(ct_normal_(ct_zeros(CT_SHAPE(2), CT_FLOAT32), 0, -1, &gen), CT_EINVAL, "normal_",
                 "std -1");
    ct_tensor *expanded = ct_expand(ct_zeros(CT_SHAPE(1, 3), CT_FLOAT32), CT_SHAPE(4, 3));
    ASSERT_FAILS(ct_normal_(expanded, 0, 1, &gen), CT_EINVAL, "normal_", "float32[4, 3]",
                 "expanded");
    ASSERT_FAILS(ct_bernoulli_(expanded, 0.5, &gen), CT_EINVAL, "bernoulli_", "expanded");
    ASSERT_FAILS(ct_bernoulli_(ct_zeros(CT_SHAPE(2), CT_FLOAT32), 1.5, &gen), CT_EINVAL,
                 "bernoulli_", "1.5");
    double bad[] = {0.5, -0.25, NAN};
    ASSERT_FAILS(ct_bernoulli(ct_from_data(bad, CT_SHAPE(3), CT_FLOAT64), &gen), CT_EINVAL,
                 "bernoulli", "float64[3]", "-0.25");
    ASSERT_FAILS(ct_bernoulli(ct_zeros(CT_SHAPE(2), CT_INT64), &gen), CT_EDTYPE, "bernoulli",
                 "int64");
    ASSERT_FAILS(ct_bernoulli(NULL, &gen), CT_EINVAL, "bernoulli", "NULL");
    ASSERT_FAILS(ct_randperm(-1, &gen), CT_EINVAL, "randperm", "-1");
    ASSERT_FAILS(ct_bernoulli_rows_(ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32), 0.5,
                                    (const int64_t[]){0, 4}, 4, &gen),
                 CT_ERANGE, "bernoulli_rows_", "rows[1] is 4", "[0, 4)");
    ASSERT_FAILS(ct_bernoulli_rows_(ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32), 0.5, NULL, 4, &gen),
                 CT_EINVAL, "bernoulli_rows_", "NULL");
    ASSERT_FAILS(
        ct_bernoulli_rows_(ct_zeros(CT_SHAPE(2), CT_FLOAT32), 2, (const int64_t[]){0, 1}, 2, &gen),
        CT_EINVAL, "bernoulli_rows_", "p is 2");
    ASSERT_FAILS(ct_bernoulli_rows_(ct_scalar(0, CT_FLOAT32), 0.5, (const int64_t[]){0}, 1, &gen),
                 CT_EINVAL, "bernoulli_rows_", "scalar");
    ASSERT_FAILS(ct_bernoulli_rows_(expanded, 0.5, (const int64_t[]){0, 1, 2, 3}, 4, &gen),
                 CT_EINVAL, "bernoulli_rows_", "expanded");
    /* Failed draws consume nothing. */
    ASSERT_EQ(gen.offset, 0);
}

static int recorded_op = -1;
static ct_op_args recorded_args;
static int record(const ct_op_record *rec) {
    recorded_op = rec->op;
    recorded_args = *rec->args;
    return 0;
}

TEST(draws_record_seed_and_offset) {
    static const ct_tensor_hooks hooks = {.record = record};
    ct_generator gen = {77, 5};
    ct_tensor_set_hooks(&hooks);
    ct_tensor *t = ct_randn(CT_SHAPE(3), CT_FLOAT32, &gen);
    ct_tensor_set_hooks(NULL);
    ASSERT_TRUE(t);
    ASSERT_EQ(recorded_op, CT_OP_RANDOM);
    ASSERT_EQ(recorded_args.nints, 2);
    ASSERT_EQ(recorded_args.ints[0], 77);
    ASSERT_EQ(recorded_args.ints[1], 5);
}
