/* The command-line parser of ct's programs (ct/cli.h, docs/cli.md). */
#include "tensor_impl.h"

#include <ct/cli.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#ifndef CT_VERSION_STRING
#error "CT_VERSION_STRING is defined by tensor/CMakeLists.txt from the project's version"
#endif

const char *ct_version(void) { return CT_VERSION_STRING; }

/* The widest flag column of the help; longer ones put their help below. */
#define HELP_COLUMN 28
/* Where the help's lines wrap, as a terminal of 80 columns shows them. */
#define HELP_WIDTH 79
/* Names longer than this get no suggestion (the distance table is on the
 * stack). */
#define SUGGEST_MAX 64

/* Prints "PROG: <why>" and the hint to stderr, keeps the message in
 * ct_errmsg(), and returns CT_EINVAL. */
CT_PRINTF(2, 3)
static int usage_error(const ct_cli *cli, const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\nTry '%s --help'.\n", cli->prog, why, cli->prog);
    return ct_seterr(CT_EINVAL, "%s", why);
}

static bool is_integer_kind(ct_cli_kind k) {
    return k == CT_CLI_INT || k == CT_CLI_INT64 || k == CT_CLI_UINT64;
}

static bool has_range(const ct_cli_flag *f) { return f->min != 0 || f->max != 0; }

/* A bound as the help and the messages write it: whole numbers without an
 * exponent. */
static void format_bound(char *buf, size_t n, double v) {
    if (v == floor(v) && fabs(v) < 1e15)
        snprintf(buf, n, "%.0f", v);
    else
        snprintf(buf, n, "%g", v);
}

/* "a whole number >= 1", "a number in [0, 1]", ...: what f accepts. */
static void describe_expected(const ct_cli_flag *f, char *buf, size_t n) {
    const char *what = is_integer_kind(f->kind) ? "a whole number" : "a number";
    char lo[32], hi[32];
    if (f->kind == CT_CLI_UINT64 && !has_range(f)) {
        snprintf(buf, n, "%s >= 0", what);
        return;
    }
    if (!has_range(f)) {
        snprintf(buf, n, "%s", what);
        return;
    }
    format_bound(lo, sizeof lo, f->min);
    format_bound(hi, sizeof hi, f->max);
    if (isinf(f->max) && isinf(f->min))
        snprintf(buf, n, "%s", what);
    else if (isinf(f->max))
        snprintf(buf, n, "%s >= %s", what, lo);
    else if (isinf(f->min))
        snprintf(buf, n, "%s <= %s", what, hi);
    else
        snprintf(buf, n, "%s in [%s, %s]", what, lo, hi);
}

/* name: the flag as the command line spelled it (its alias, say). */
static int bad_number(const ct_cli *cli, const ct_cli_flag *f, const char *name, const char *v) {
    char expected[96];
    if (f->expects)
        snprintf(expected, sizeof expected, "%s", f->expects);
    else
        describe_expected(f, expected, sizeof expected);
    return usage_error(cli, "%s needs %s, got '%s'", name, expected, v);
}

/* v as a whole number with nothing around it: strtoll alone skips leading
 * spaces and stops at the first character it does not take. */
static bool read_whole(const char *v, bool is_unsigned, long long *s, unsigned long long *u) {
    if (!*v || isspace((unsigned char)*v) || (is_unsigned && (*v == '-' || *v == '+')))
        return false;
    char *end;
    errno = 0;
    if (is_unsigned)
        *u = strtoull(v, &end, 10);
    else
        *s = strtoll(v, &end, 10);
    return !errno && end != v && !*end;
}

static int parse_number(const ct_cli *cli, const ct_cli_flag *f, const char *name, const char *v) {
    long long s = 0;
    unsigned long long u = 0;
    double d = 0;
    if (f->kind == CT_CLI_DOUBLE) {
        char *end;
        errno = 0;
        d = *v && !isspace((unsigned char)*v) ? strtod(v, &end) : NAN;
        if (isnan(d) || errno || *end || !isfinite(d))
            return bad_number(cli, f, name, v);
    } else if (!read_whole(v, f->kind == CT_CLI_UINT64, &s, &u)) {
        return bad_number(cli, f, name, v);
    } else {
        d = f->kind == CT_CLI_UINT64 ? (double)u : (double)s;
    }
    if (has_range(f) && !(d >= f->min && d <= f->max))
        return bad_number(cli, f, name, v);
    switch (f->kind) {
    case CT_CLI_INT:
        if (s < INT_MIN || s > INT_MAX)
            return bad_number(cli, f, name, v);
        *(int *)f->dest = (int)s;
        break;
    case CT_CLI_INT64: *(int64_t *)f->dest = (int64_t)s; break;
    case CT_CLI_UINT64: *(uint64_t *)f->dest = (uint64_t)u; break;
    default: *(double *)f->dest = d; break;
    }
    return 0;
}

/* "sgd, adamw": the choices, into buf. */
static void join_choices(const ct_cli_flag *f, const char *sep, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; f->choices[i] && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? sep : "", f->choices[i]);
}

static int parse_value(const ct_cli *cli, const ct_cli_flag *f, const char *name, const char *v) {
    switch (f->kind) {
    case CT_CLI_STRING: *(const char **)f->dest = v; return 0;
    case CT_CLI_CHOICE:
        for (int i = 0; f->choices[i]; i++)
            if (!strcmp(f->choices[i], v)) {
                *(int *)f->dest = i;
                return 0;
            }
        char list[256];
        join_choices(f, ", ", list, sizeof list);
        return usage_error(cli, "%s needs one of %s, got '%s'", name, list, v);
    case CT_CLI_CUSTOM:
        if (f->parse(f->dest, v))
            return usage_error(cli, "%s: %s", name, ct_errmsg());
        return 0;
    default: return parse_number(cli, f, name, v);
    }
}

/* Optimal string alignment distance (Levenshtein with transpositions), so
 * that "--ephocs" is one edit from "--epochs". */
static size_t edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > SUGGEST_MAX || m > SUGGEST_MAX)
        return SIZE_MAX;
    size_t d[SUGGEST_MAX + 1][SUGGEST_MAX + 1];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            size_t best = sub < del ? sub : del;
            best = best < ins ? best : ins;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

/* The known name nearest to name, if it is near enough to be a typo or a
 * shortening ("--epoch", "--check"); NULL otherwise. */
static const char *suggest(const ct_cli *cli, const char *name) {
    static const char *const builtin[] = {"--help", "--version"};
    const char *best = NULL;
    size_t best_d = SIZE_MAX, len = strlen(name);
    size_t total = cli->nflags * 2 + 2;
    for (size_t k = 0; k < total; k++) {
        const char *cand = k < cli->nflags       ? cli->flags[k].name
                           : k < cli->nflags * 2 ? cli->flags[k - cli->nflags].alias
                                                 : builtin[k - cli->nflags * 2];
        if (!cand)
            continue;
        size_t d = edit_distance(name, cand);
        /* A prefix of a longer name counts as near, however short. */
        if (len >= 4 && !strncmp(cand, name, len))
            d = 1;
        if (d < best_d) {
            best_d = d;
            best = cand;
        }
    }
    size_t limit = len / 3 > 2 ? len / 3 : 2;
    return best_d <= limit ? best : NULL;
}

/* flag's entry in the table: by name, alias, or the name before '='. */
static const ct_cli_flag *find_flag(const ct_cli *cli, const char *arg, size_t len) {
    for (size_t k = 0; k < cli->nflags; k++) {
        const ct_cli_flag *f = &cli->flags[k];
        if ((strlen(f->name) == len && !strncmp(f->name, arg, len)) ||
            (f->alias && strlen(f->alias) == len && !strncmp(f->alias, arg, len)))
            return f;
    }
    return NULL;
}

/* An argument that reads as an option rather than a value: "--x" and "-x",
 * but not "-", "-1" or "-.5". */
static bool looks_like_option(const char *a) {
    return a[0] == '-' && a[1] && !isdigit((unsigned char)a[1]) && a[1] != '.';
}

static int check_table(const ct_cli *cli) {
    for (size_t k = 0; k < cli->nflags; k++) {
        const ct_cli_flag *f = &cli->flags[k];
        bool ok = f->name && f->name[0] == '-' && f->dest && f->help &&
                  (f->kind != CT_CLI_CHOICE || f->choices) &&
                  (f->kind != CT_CLI_CUSTOM || f->parse) && f->kind <= CT_CLI_CUSTOM;
        if (!ok)
            return ct_seterr(CT_EINVAL, "%s: the flag table's entry %zu (%s) is incomplete",
                             cli->prog, k, f->name ? f->name : "unnamed");
        for (size_t j = 0; j < k; j++) {
            const char *mine[] = {f->name, f->alias};
            const char *theirs[] = {cli->flags[j].name, cli->flags[j].alias};
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++)
                    if (mine[a] && theirs[b] && !strcmp(mine[a], theirs[b]))
                        return ct_seterr(CT_EINVAL, "%s: the flag table names %s twice", cli->prog,
                                         mine[a]);
        }
    }
    return 0;
}

/* The flag column of the help: "  -np, --nproc-per-node N". */
static int flag_column(const ct_cli_flag *f, char *buf, size_t n) {
    char choices[128] = "";
    const char *metavar = f->metavar;
    if (f->kind == CT_CLI_CHOICE && !metavar) {
        join_choices(f, "|", choices, sizeof choices);
        metavar = choices;
    }
    return snprintf(buf, n, "  %s%s%s%s%s", f->alias ? f->alias : "", f->alias ? ", " : "", f->name,
                    f->kind == CT_CLI_SWITCH ? "" : " ",
                    f->kind == CT_CLI_SWITCH ? "" : (metavar ? metavar : "VALUE"));
}

/* The destination's value as the help's default; "" for none. */
static void format_default(const ct_cli_flag *f, char *buf, size_t n) {
    buf[0] = '\0';
    if (f->default_text) {
        snprintf(buf, n, "%s", f->default_text);
        return;
    }
    switch (f->kind) {
    case CT_CLI_INT: snprintf(buf, n, "%d", *(const int *)f->dest); break;
    case CT_CLI_INT64: snprintf(buf, n, "%" PRId64, *(const int64_t *)f->dest); break;
    case CT_CLI_UINT64: snprintf(buf, n, "%" PRIu64, *(const uint64_t *)f->dest); break;
    case CT_CLI_DOUBLE: snprintf(buf, n, "%g", *(const double *)f->dest); break;
    case CT_CLI_STRING: {
        const char *s = *(const char *const *)f->dest;
        if (s)
            snprintf(buf, n, "%s", *s ? s : "\"\"");
        break;
    }
    case CT_CLI_CHOICE: snprintf(buf, n, "%s", f->choices[*(const int *)f->dest]); break;
    default: break;
    }
}

/* One flag of the help: its column, then its help and default wrapped at
 * HELP_WIDTH, the lines after the first indented to HELP_COLUMN. */
static void print_entry(FILE *out, const char *column, int width, const char *help,
                        const char *def) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s%s%s", help, *def ? " (default: " : "", def, *def ? ")" : "");
    if (width > HELP_COLUMN - 2)
        fprintf(out, "%s\n%*s", column, HELP_COLUMN, "");
    else
        fprintf(out, "%-*s", HELP_COLUMN, column);
    int at = HELP_COLUMN;
    for (const char *w = text; *w;) {
        size_t len = strcspn(w, " ");
        if (at > HELP_COLUMN && at + 1 + (int)len > HELP_WIDTH) {
            fprintf(out, "\n%*s", HELP_COLUMN, "");
            at = HELP_COLUMN;
        } else if (at > HELP_COLUMN) {
            fputc(' ', out);
            at++;
        }
        fprintf(out, "%.*s", (int)len, w);
        at += (int)len;
        w += len;
        w += strspn(w, " ");
    }
    fputc('\n', out);
}

void ct_cli_print_help(const ct_cli *cli, FILE *out) {
    fprintf(out, "usage: %s [options]%s%s\n", cli->prog, cli->args ? " " : "",
            cli->args ? cli->args : "");
    if (cli->about)
        fprintf(out, "%s%s", cli->about, cli->about[strlen(cli->about) - 1] == '\n' ? "" : "\n");
    fputs("\noptions:\n", out);
    for (size_t k = 0; k < cli->nflags; k++) {
        char column[160], def[160];
        int width = flag_column(&cli->flags[k], column, sizeof column);
        format_default(&cli->flags[k], def, sizeof def);
        print_entry(out, column, width, cli->flags[k].help, def);
    }
    print_entry(out, "  -h, --help", 11, "print this help and exit", "");
    print_entry(out, "  --version", 11, "print the version and exit", "");
    if (cli->epilog)
        fprintf(out, "\n%s%s", cli->epilog,
                cli->epilog[strlen(cli->epilog) - 1] == '\n' ? "" : "\n");
}

/* One option at argv[*i]; *i moves past its value. */
static int parse_option(const ct_cli *cli, int argc, char **argv, int *i) {
    const char *a = argv[*i], *eq = strchr(a, '=');
    size_t len = eq && a[1] == '-' ? (size_t)(eq - a) : strlen(a);
    const ct_cli_flag *f = find_flag(cli, a, len);
    /* The flag as the command line spells it, for the messages. */
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(len < 255 ? len : 255), a);
    if (!f) {
        const char *near = suggest(cli, name);
        if (near)
            return usage_error(cli, "unknown option '%s'; did you mean '%s'?", name, near);
        return usage_error(cli, "unknown option '%s'", name);
    }
    if (f->given)
        *f->given = true;
    const char *v = len < strlen(a) ? a + len + 1 : NULL;
    if (f->kind == CT_CLI_SWITCH) {
        if (v)
            return usage_error(cli, "%s takes no value, got '%s'", name, v);
        *(bool *)f->dest = true;
        return 0;
    }
    const char *metavar = f->metavar ? f->metavar : "a value";
    if (!v) {
        if (*i + 1 >= argc)
            return usage_error(cli, "%s needs a value (%s)", name, metavar);
        v = argv[++*i];
        if (looks_like_option(v))
            return usage_error(cli,
                               "%s needs a value (%s), got the option '%s' (write %s=VALUE for "
                               "a value that starts with '-')",
                               name, metavar, v, name);
    }
    return parse_value(cli, f, name, v);
}

int ct_cli_parse(const ct_cli *cli, int argc, char **argv, int *first) {
    if (check_table(cli)) {
        fprintf(stderr, "%s\n", ct_errmsg());
        return CT_EINVAL;
    }
    /* Positional arguments are gathered here and put back after the
     * options, in their order. */
    char **positional = malloc(sizeof *positional * (size_t)(argc > 0 ? argc : 1));
    if (!positional)
        return ct_seterr(CT_ENOMEM, "%s: out of memory parsing the command line", cli->prog);
    int npos = 0, i = 1, rc = 0;
    for (; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!looks_like_option(a)) {
            if (!cli->args) {
                rc = usage_error(cli, "unexpected argument '%s' (%s takes options only)", a,
                                 cli->prog);
                break;
            }
            if (cli->stop_at_args)
                break;
            positional[npos++] = argv[i];
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            ct_cli_print_help(cli, stdout);
            rc = 1;
        } else if (!strcmp(a, "--version")) {
            printf("%s (ct) %s\n", cli->prog, ct_version());
            rc = 1;
        } else {
            rc = parse_option(cli, argc, argv, &i);
        }
    }
    if (!rc && i < argc && !cli->args)
        rc = usage_error(cli, "unexpected argument '%s' (%s takes options only)", argv[i],
                         cli->prog);
    if (!rc) {
        /* Options first, then the positional arguments: argv[1..i) minus
         * the positional ones keep their order. */
        int w = 1;
        for (int r = 1, p = 0; r < i; r++) {
            if (p < npos && argv[r] == positional[p])
                p++;
            else
                argv[w++] = argv[r];
        }
        *first = w;
        for (int p = 0; p < npos; p++)
            argv[w++] = positional[p];
    }
    free(positional);
    return rc;
}
