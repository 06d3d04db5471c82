/* ct_cli_parse(): one test per rule of ct/cli.h, on a table like the
 * programs' own. */
#include "ct_test.h"

#include <ct/cli.h>

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct opts {
    int epochs, recipe, count;
    int64_t batch;
    uint64_t seed;
    double lr, timeout;
    const char *data, *prompt;
    bool bench, epochs_given;
    int device;
} opts;

static const char *const recipes[] = {"sgd", "adamw", NULL};

static int parse_device(void *dest, const char *v) {
    if (!strcmp(v, "cpu")) {
        *(int *)dest = -1;
        return 0;
    }
    if (!strncmp(v, "cuda:", 5) && v[5] >= '0' && v[5] <= '9' && !v[6]) {
        *(int *)dest = v[5] - '0';
        return 0;
    }
    return ct_seterr(CT_EINVAL, "unknown device '%s' (cpu, cuda:N)", v);
}

static opts o;
static char captured[8192];

static int run_parse(const ct_cli *cli, char **argv, int *first) {
    int argc = 0;
    while (argv[argc])
        argc++;
    return ct_cli_parse(cli, argc, argv, first);
}

/* Parses argv (NULL-ended, argv[0] included) with the test's table, from
 * the defaults; stdout goes to captured[]. */
static int parse_with(const char *args, char **argv, int *first) {
    o = (opts){.epochs = 10, .batch = 64, .seed = 1, .lr = 0.05, .prompt = "Q: ", .device = -1};
    const ct_cli_flag flags[] = {
        CT_CLI_FLAG("--epochs", CT_CLI_INT, &o.epochs, "N", "epochs to train", .min = 1,
                    .max = HUGE_VAL, .given = &o.epochs_given),
        CT_CLI_FLAG("--batch", CT_CLI_INT64, &o.batch, "N", "the global batch", .min = 1,
                    .max = 1 << 20),
        CT_CLI_FLAG("--count", CT_CLI_INT, &o.count, "N", "a count of any sign"),
        CT_CLI_FLAG("--seed", CT_CLI_UINT64, &o.seed, "N", "the seed"),
        CT_CLI_FLAG("--lr", CT_CLI_DOUBLE, &o.lr, "X", "the learning rate", .min = 1e-9, .max = 10),
        CT_CLI_FLAG("--data", CT_CLI_STRING, &o.data, "DIR", "the data",
                    .default_text = "the system's"),
        CT_CLI_FLAG("--prompt", CT_CLI_STRING, &o.prompt, "TEXT", "the prompt"),
        CT_CLI_FLAG("--recipe", CT_CLI_CHOICE, &o.recipe, NULL, "the recipe", .choices = recipes),
        CT_CLI_FLAG("--device", CT_CLI_CUSTOM, &o.device, "cpu|cuda:N", "where to train",
                    .parse = parse_device, .default_text = "cpu"),
        CT_CLI_FLAG("--timeout", CT_CLI_DOUBLE, &o.timeout, "S", "how long", .min = 1e-3,
                    .max = HUGE_VAL, .expects = "seconds > 0"),
        CT_CLI_FLAG("--bench", CT_CLI_SWITCH, &o.bench, NULL, "throughput only"),
        CT_CLI_FLAG("--nproc-per-node", CT_CLI_INT, &o.count, "N", "ranks", .alias = "-np",
                    .min = 1, .max = 64),
    };
    ct_cli cli = {.prog = "prog",
                  .about = "Trains a model.\nA second line.",
                  .flags = flags,
                  .nflags = sizeof flags / sizeof *flags,
                  .args = args,
                  .epilog = "Exit codes: 0 done."};
    fflush(stdout);
    FILE *tmp = tmpfile();
    int saved = dup(STDOUT_FILENO);
    dup2(fileno(tmp), STDOUT_FILENO);
    int rc = run_parse(&cli, argv, first);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(captured, 1, sizeof captured - 1, tmp);
    captured[n] = '\0';
    fclose(tmp);
    return rc;
}

static int parse(char **argv) {
    int first;
    return parse_with(NULL, argv, &first);
}

#define ARGV(...)                                                                                  \
    (char *[]) { "prog", __VA_ARGS__, NULL }

/* rc is CT_EINVAL and the message holds part. */
#define ASSERT_USAGE_ERROR(rc, part)                                                               \
    do {                                                                                           \
        ASSERT_EQ(rc, CT_EINVAL);                                                                  \
        ASSERT_TRUE(strstr(ct_errmsg(), part) != NULL);                                            \
    } while (0)

TEST(space_and_equals_forms_both_set_the_value) {
    ASSERT_EQ(parse(ARGV("--epochs", "3", "--batch=32", "--lr=0.5")), 0);
    ASSERT_EQ(o.epochs, 3);
    ASSERT_EQ(o.batch, 32);
    ASSERT_TRUE(o.lr == 0.5);
    ASSERT_TRUE(o.epochs_given);
    ASSERT_EQ(parse(ARGV("--batch", "8")), 0);
    ASSERT_TRUE(!o.epochs_given);
}

TEST(defaults_stay_when_no_flag_is_given) {
    ASSERT_EQ(parse(ARGV("--bench")), 0);
    ASSERT_EQ(o.epochs, 10);
    ASSERT_EQ(o.batch, 64);
    ASSERT_TRUE(o.bench);
}

TEST(the_last_of_a_repeated_flag_wins) {
    ASSERT_EQ(parse(ARGV("--epochs", "3", "--epochs", "4")), 0);
    ASSERT_EQ(o.epochs, 4);
}

TEST(whole_numbers_are_strict) {
    ASSERT_USAGE_ERROR(parse(ARGV("--epochs", "1.5")),
                       "--epochs needs a whole number >= 1, got '1.5'");
    ASSERT_USAGE_ERROR(parse(ARGV("--epochs", "abc")), "got 'abc'");
    ASSERT_USAGE_ERROR(parse(ARGV("--epochs", "3x")), "got '3x'");
    ASSERT_USAGE_ERROR(parse(ARGV("--epochs", " 3")), "got ' 3'");
    ASSERT_USAGE_ERROR(parse(ARGV("--epochs=")), "got ''");
    ASSERT_USAGE_ERROR(parse(ARGV("--count", "99999999999")), "--count needs a whole number");
    ASSERT_USAGE_ERROR(parse(ARGV("--batch", "99999999999999999999")), "--batch needs");
    ASSERT_EQ(o.batch, 64);
}

TEST(numbers_outside_the_range_name_it) {
    ASSERT_USAGE_ERROR(parse(ARGV("--epochs", "0")), "needs a whole number >= 1, got '0'");
    ASSERT_USAGE_ERROR(parse(ARGV("--batch", "2000000")),
                       "--batch needs a whole number in [1, 1048576], got '2000000'");
    ASSERT_USAGE_ERROR(parse(ARGV("--lr", "0")), "--lr needs a number in [1e-09, 10], got '0'");
    ASSERT_EQ(parse(ARGV("--count", "-7")), 0);
    ASSERT_EQ(o.count, -7);
}

TEST(a_flag_can_say_what_it_expects) {
    ASSERT_USAGE_ERROR(parse(ARGV("--timeout", "0")), "--timeout needs seconds > 0, got '0'");
    ASSERT_USAGE_ERROR(parse(ARGV("--timeout", "soon")), "--timeout needs seconds > 0, got 'soon'");
}

TEST(a_seed_is_never_negative_and_takes_64_bits) {
    ASSERT_USAGE_ERROR(parse(ARGV("--seed", "-1")), "--seed needs a whole number >= 0, got '-1'");
    ASSERT_USAGE_ERROR(parse(ARGV("--seed", "abc")), "got 'abc'");
    ASSERT_EQ(parse(ARGV("--seed", "18446744073709551615")), 0);
    ASSERT_TRUE(o.seed == UINT64_MAX);
}

TEST(real_numbers_must_be_finite) {
    ASSERT_USAGE_ERROR(parse(ARGV("--lr", "abc")), "--lr needs a number in");
    ASSERT_USAGE_ERROR(parse(ARGV("--lr", "nan")), "got 'nan'");
    ASSERT_USAGE_ERROR(parse(ARGV("--lr", "inf")), "got 'inf'");
    ASSERT_USAGE_ERROR(parse(ARGV("--lr", "1e999")), "got '1e999'");
    ASSERT_EQ(parse(ARGV("--lr", "2.5e-1")), 0);
    ASSERT_TRUE(o.lr == 0.25);
}

TEST(an_option_is_not_taken_for_a_missing_value) {
    ASSERT_USAGE_ERROR(parse(ARGV("--epochs", "--batch", "32")),
                       "--epochs needs a value (N), got the option '--batch'");
    ASSERT_USAGE_ERROR(parse(ARGV("--prompt", "-np")), "got the option '-np'");
    ASSERT_USAGE_ERROR(parse(ARGV("--epochs")), "--epochs needs a value (N)");
    /* A value may start with a dash when it is joined with '=', or is a
     * negative number or a lone dash. */
    ASSERT_EQ(parse(ARGV("--prompt=--x", "--data", "-", "--count", "-3")), 0);
    ASSERT_TRUE(!strcmp(o.prompt, "--x"));
    ASSERT_TRUE(!strcmp(o.data, "-"));
    ASSERT_EQ(o.count, -3);
}

TEST(an_unknown_flag_gets_the_nearest_name) {
    ASSERT_USAGE_ERROR(parse(ARGV("--epoch", "3")),
                       "unknown option '--epoch'; did you mean '--epochs'?");
    ASSERT_USAGE_ERROR(parse(ARGV("--ephocs", "3")), "did you mean '--epochs'?");
    ASSERT_USAGE_ERROR(parse(ARGV("-epochs", "3")), "did you mean '--epochs'?");
    ASSERT_USAGE_ERROR(parse(ARGV("--nproc", "3")), "did you mean '--nproc-per-node'?");
    ASSERT_USAGE_ERROR(parse(ARGV("--verison")), "did you mean '--version'?");
    ASSERT_USAGE_ERROR(parse(ARGV("--zzzzzz=1")), "unknown option '--zzzzzz'");
    ASSERT_TRUE(strstr(ct_errmsg(), "did you mean") == NULL);
}

TEST(a_switch_takes_no_value) {
    ASSERT_USAGE_ERROR(parse(ARGV("--bench=yes")), "--bench takes no value, got 'yes'");
    ASSERT_TRUE(!o.bench);
}

TEST(choices_and_custom_values) {
    ASSERT_EQ(parse(ARGV("--recipe", "adamw", "--device=cuda:3")), 0);
    ASSERT_EQ(o.recipe, 1);
    ASSERT_EQ(o.device, 3);
    ASSERT_USAGE_ERROR(parse(ARGV("--recipe", "adam")),
                       "--recipe needs one of sgd, adamw, got 'adam'");
    ASSERT_USAGE_ERROR(parse(ARGV("--device", "tpu")),
                       "--device: unknown device 'tpu' (cpu, cuda:N)");
}

TEST(an_alias_is_the_same_flag) {
    ASSERT_EQ(parse(ARGV("-np", "4")), 0);
    ASSERT_EQ(o.count, 4);
    ASSERT_USAGE_ERROR(parse(ARGV("-np", "0")), "-np needs a whole number in [1, 64], got '0'");
}

TEST(help_describes_every_flag_with_its_default) {
    ASSERT_EQ(parse(ARGV("--epochs", "3", "--help")), 1);
    ASSERT_TRUE(strstr(captured, "usage: prog [options]\nTrains a model.\nA second line.\n"));
    ASSERT_TRUE(strstr(captured, "  --epochs N                epochs to train (default: 3)\n"));
    ASSERT_TRUE(strstr(captured, "the learning rate (default: 0.05)"));
    ASSERT_TRUE(strstr(captured, "the data (default: the system's)"));
    ASSERT_TRUE(strstr(captured, "the prompt (default: Q: )"));
    ASSERT_TRUE(strstr(captured, "  --recipe sgd|adamw        the recipe (default: sgd)"));
    ASSERT_TRUE(strstr(captured, "  --bench                   throughput only\n"));
    ASSERT_TRUE(strstr(captured, "  -np, --nproc-per-node N   ranks"));
    ASSERT_TRUE(strstr(captured, "  -h, --help"));
    ASSERT_TRUE(strstr(captured, "\nExit codes: 0 done.\n"));
    ASSERT_EQ(parse(ARGV("-h")), 1);
    ASSERT_TRUE(strstr(captured, "usage: prog"));
}

TEST(version_prints_the_project_version) {
    ASSERT_EQ(parse(ARGV("--version")), 1);
    char want[64];
    snprintf(want, sizeof want, "prog (ct) %s\n", ct_version());
    ASSERT_TRUE(!strcmp(captured, want));
    int major, minor, patch;
    ASSERT_EQ(sscanf(ct_version(), "%d.%d.%d", &major, &minor, &patch), 3);
}

TEST(positional_arguments_only_where_the_program_takes_them) {
    ASSERT_USAGE_ERROR(parse(ARGV("--epochs", "3", "extra")), "unexpected argument 'extra'");
    int first;
    char **argv = ARGV("in.jsonl", "--epochs", "3", "out", "--bench");
    ASSERT_EQ(parse_with("FILES...", argv, &first), 0);
    ASSERT_EQ(first, 4);
    ASSERT_TRUE(!strcmp(argv[4], "in.jsonl") && !strcmp(argv[5], "out"));
    ASSERT_EQ(o.epochs, 3);
    ASSERT_TRUE(o.bench);
    /* After "--" everything is positional, even what looks like a flag. */
    char **after = ARGV("--epochs", "2", "--", "--bench");
    ASSERT_EQ(parse_with("FILES...", after, &first), 0);
    ASSERT_TRUE(!o.bench);
    ASSERT_TRUE(!strcmp(after[first], "--bench"));
}

TEST(the_first_positional_argument_can_end_the_options) {
    const ct_cli_flag flags[] = {
        CT_CLI_FLAG("--nproc-per-node", CT_CLI_INT, &o.count, "N", "ranks", .alias = "-np",
                    .min = 1, .max = 64),
    };
    ct_cli cli = {.prog = "launch",
                  .flags = flags,
                  .nflags = 1,
                  .args = "PROGRAM [ARGS...]",
                  .stop_at_args = true};
    char **argv = ARGV("-np", "2", "./train", "--epochs", "3");
    int first;
    ASSERT_EQ(run_parse(&cli, argv, &first), 0);
    ASSERT_EQ(o.count, 2);
    ASSERT_EQ(first, 3);
    ASSERT_TRUE(!strcmp(argv[first], "./train") && !strcmp(argv[first + 1], "--epochs"));
}

TEST(a_table_that_names_a_flag_twice_is_refused) {
    int a = 0, b = 0;
    const ct_cli_flag flags[] = {
        CT_CLI_FLAG("--x", CT_CLI_INT, &a, "N", "x"),
        CT_CLI_FLAG("--y", CT_CLI_INT, &b, "N", "y", .alias = "--x"),
    };
    ct_cli cli = {.prog = "prog", .flags = flags, .nflags = 2};
    int first;
    ASSERT_USAGE_ERROR(run_parse(&cli, ARGV("--y", "1"), &first), "names --x twice");
    const ct_cli_flag no_choices[] = {CT_CLI_FLAG("--r", CT_CLI_CHOICE, &a, NULL, "r")};
    ct_cli bad = {.prog = "prog", .flags = no_choices, .nflags = 1};
    ASSERT_USAGE_ERROR(run_parse(&bad, ARGV("--r", "x"), &first), "incomplete");
}
