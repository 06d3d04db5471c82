/* ct/cli.h: the command-line parser of ct's programs (ctlaunch, ctckpt,
 * ctplot, fmnist_mlp, gpt), for programs of your own too.
 *
 * A program describes its flags in a table (name, kind, where the value
 * goes, a range, a one-line help) with its defaults already stored in the
 * destinations, and ct_cli_parse() does the rest the same way in every
 * program (docs/cli.md):
 *   - "--flag value" and "--flag=value"; a switch takes no value;
 *   - numbers are strict: the whole value must be a number of the flag's
 *     kind ("1.5" is not a whole number, "abc" is not a number, "-1" is not
 *     a seed) and inside its range, else the message names the flag, the
 *     value and what was expected;
 *   - a value that is itself an option ("--epochs --batch 32") is refused,
 *     so that a forgotten value is not taken for one ("--prompt=--x" passes
 *     a value that starts with a dash);
 *   - an unknown flag gets the nearest known one as a suggestion;
 *   - -h/--help prints the usage, a description and each flag with its
 *     help and default; --version prints "PROG (ct) VERSION";
 *   - "--" ends the options; positional arguments are allowed only where the
 *     program says so.
 *
 * Example:
 *
 *     #include <ct/cli.h>
 *     #include <stdio.h>
 *
 *     int main(int argc, char **argv) {
 *         int epochs = 10;
 *         double lr = 0.05;
 *         bool verbose = false;
 *         const ct_cli_flag flags[] = {
 *             CT_CLI_FLAG("--epochs", CT_CLI_INT, &epochs, "N", "epochs to train", .min = 1,
 *                         .max = 1e6),
 *             CT_CLI_FLAG("--lr", CT_CLI_DOUBLE, &lr, "X", "learning rate", .min = 1e-12,
 *                         .max = 1e3),
 *             CT_CLI_FLAG("--verbose", CT_CLI_SWITCH, &verbose, NULL, "print every step"),
 *         };
 *         ct_cli cli = {.prog = "train", .about = "Trains a model.", .flags = flags,
 *                       .nflags = sizeof flags / sizeof *flags};
 *         int first;
 *         int rc = ct_cli_parse(&cli, argc, argv, &first);
 *         if (rc != 0)
 *             return rc > 0 ? 0 : 2; // --help, --version; or bad usage, said on stderr
 *         printf("%d epochs at lr %g\n", epochs, lr);
 *         return 0;
 *     }
 *
 * Ownership. The parser borrows the table and argv. A string value points
 * into argv; nothing is allocated.
 *
 * Errors. ct_cli_parse() prints its messages on stderr ("PROG: ..." and
 * "Try 'PROG --help'.") and also leaves the message in ct_errmsg().
 *
 * Threads. ct_cli_parse() writes the table's destinations and permutes argv:
 * call it from one thread, before starting others.
 */
#ifndef CT_CLI_H
#define CT_CLI_H

#include <ct/tensor.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a flag's destination points to, and how its value is read. */
typedef enum ct_cli_kind {
    CT_CLI_SWITCH, /* bool: true when the flag is given; it takes no value */
    CT_CLI_INT,    /* int: a whole number in the range */
    CT_CLI_INT64,  /* int64_t: a whole number in the range */
    CT_CLI_UINT64, /* uint64_t: a whole number >= 0 (a seed: any 64 bits) */
    CT_CLI_DOUBLE, /* double: a finite number in the range */
    CT_CLI_STRING, /* const char *: the value as given (it may be empty) */
    CT_CLI_CHOICE, /* int: the index of the value in choices */
    CT_CLI_CUSTOM, /* anything: parse() reads the value */
} ct_cli_kind;

typedef struct ct_cli_flag {
    const char *name; /* "--epochs" */
    ct_cli_kind kind;
    void *dest;          /* holds the default before parsing */
    const char *metavar; /* the value's name in the help ("N", "DIR"); NULL for a switch */
    const char *help;    /* what the flag does, one line */
    /* Numbers: the closed range accepted. Leave both 0 for the kind's whole
     * range; use HUGE_VAL for no upper bound. */
    double min, max;
    const char *const *choices; /* CT_CLI_CHOICE: the accepted values, NULL-ended */
    /* CT_CLI_CUSTOM: reads value into dest; 0, or a ct_seterr() code whose
     * message says what is wrong with it (the parser adds the flag). */
    int (*parse)(void *dest, const char *value);
    /* The help's "(default: ...)": NULL shows the destination's value
     * (nothing for a switch, a NULL string or a custom flag); "" shows no
     * default. */
    const char *default_text;
    const char *alias; /* a second name ("-np", "-o"), or NULL */
    /* What a valid value is, for the messages ("seconds > 0"); NULL: said
     * from the kind and the range ("a whole number in [1, 64]"). */
    const char *expects;
    bool *given;       /* when not NULL, set to true if the flag appears */
} ct_cli_flag;

/* A table entry: the fields every flag has, then the help and any other
 * fields by name, e.g.
 *     CT_CLI_FLAG("--epochs", CT_CLI_INT, &epochs, "N", "epochs to train", .min = 1,
 *                 .max = HUGE_VAL)
 * (designated fields, so that -Wextra's missing-field-initializers stays
 * quiet). */
#define CT_CLI_FLAG(name_, kind_, dest_, metavar_, ...)                                            \
    {                                                                                              \
        .name = (name_), .kind = (kind_), .dest = (dest_), .metavar = (metavar_),                  \
        .help = __VA_ARGS__                                                                        \
    }

typedef struct ct_cli {
    const char *prog;  /* the program's name, at the start of every message */
    const char *about; /* the help's description, one or more lines */
    const ct_cli_flag *flags;
    size_t nflags;
    /* Positional arguments in the usage line ("METRICS.jsonl",
     * "PROGRAM [ARGS...]"); NULL: the program takes none, and one is an
     * error. */
    const char *args;
    /* The first positional argument ends the options (ctlaunch: the program
     * to run, whose own flags follow it). */
    bool stop_at_args;
    const char *epilog; /* printed after the flags (exit codes, variables), or NULL */
} ct_cli;

/* Parses argv[1..argc-1] by cli's table, storing each value in its
 * destination (the last one wins when a flag repeats). Positional arguments
 * are moved, in their order, to the end of argv: they are argv[*first] to
 * argv[argc - 1] (with stop_at_args, the first positional one and
 * everything after it, as given).
 *
 * Returns 0 when the program should go on; 1 after printing the help or the
 * version on stdout (exit 0); CT_EINVAL after printing why on stderr (exit
 * 2, the usage error of ct's programs). A table that names a flag twice, or
 * a kind without what it needs (choices, parse, dest), is a programming
 * error: CT_EINVAL too, with the flag named. */
CT_API int ct_cli_parse(const ct_cli *cli, int argc, char **argv, int *first);

/* Prints cli's help to f: what --help prints. */
CT_API void ct_cli_print_help(const ct_cli *cli, FILE *f);

/* ct's version, "MAJOR.MINOR.PATCH" (the project's version in CMake). */
CT_API const char *ct_version(void);

#ifdef __cplusplus
}
#endif

#endif /* CT_CLI_H */
