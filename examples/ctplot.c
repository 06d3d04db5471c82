/* ctplot: draws a ct metrics file (JSON lines) as a PNG chart, the loss
 * above and the throughput below, with gnuplot (docs/plot.md).
 *
 *   ctplot METRICS.jsonl [-o OUT.png] [--x FIELD] [--title TEXT]
 *          [--script FILE]
 *
 * Exit codes: 0 the chart is written, 1 it could not be (the reason on
 * stderr), 2 bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include "metrics_plot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ctplot METRICS.jsonl [-o OUT.png] [--x FIELD] [--title TEXT] [--script FILE]\n"
    "Draws the fields named *loss* (top) and *_per_s (bottom) of a metrics file\n"
    "against FIELD (default: step) into OUT.png (default: METRICS with .jsonl\n"
    "replaced by .png), with gnuplot.\n"
    "  -o OUT.png      where the chart goes\n"
    "  --x FIELD       the x axis, a numeric field (step, epoch, time_s, ...)\n"
    "  --title TEXT    above the chart (default: the metrics file's name)\n"
    "  --script FILE   also save the gnuplot script, data inline, to restyle it\n"
    "Exit codes: 0 written, 1 it could not be, 2 bad usage.\n";

/* METRICS with a final .jsonl replaced by .png, or .png appended; malloc'd. */
static char *default_output(const char *metrics) {
    size_t n = strlen(metrics);
    if (n > 6 && !strcmp(metrics + n - 6, ".jsonl"))
        n -= 6;
    char *out = malloc(n + 5);
    if (out)
        snprintf(out, n + 5, "%.*s.png", (int)n, metrics);
    return out;
}

int main(int argc, char **argv) {
    const char *metrics = NULL, *out = NULL;
    metrics_plot_options o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        const char **value = !strcmp(a, "-o")         ? &out
                             : !strcmp(a, "--x")      ? &o.x
                             : !strcmp(a, "--title")  ? &o.title
                             : !strcmp(a, "--script") ? &o.script
                                                      : NULL;
        if (value && i + 1 < argc) {
            *value = argv[++i];
        } else if (value) {
            fprintf(stderr, "ctplot: %s needs a value\n", a);
            return 2;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ctplot: unknown option %s\n%s", a, usage);
            return 2;
        } else if (metrics) {
            fprintf(stderr, "ctplot: one metrics file at a time ('%s', then '%s')\n%s", metrics, a,
                    usage);
            return 2;
        } else {
            metrics = a;
        }
    }
    if (!metrics) {
        fprintf(stderr, "ctplot: which metrics file?\n%s", usage);
        return 2;
    }
    char *made = out ? NULL : default_output(metrics);
    if (!out && !made) {
        fprintf(stderr, "ctplot: out of memory\n");
        return 1;
    }
    int rc = metrics_plot(metrics, out ? out : made, &o);
    if (rc)
        fprintf(stderr, "ctplot: %s\n", ct_errmsg());
    else
        printf("ctplot: wrote %s\n", out ? out : made);
    free(made);
    return rc ? 1 : 0;
}
