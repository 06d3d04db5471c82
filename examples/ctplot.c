/* ctplot: draws a ct metrics file (JSON lines) as a PNG chart, the loss
 * above and the throughput below, with gnuplot (docs/plot.md).
 *
 *   ctplot METRICS.jsonl [-o OUT.png] [--x FIELD] [--title TEXT]
 *          [--script FILE]          (ctplot --help says more)
 *
 * Exit codes: 0 the chart is written, 1 it could not be (the reason on
 * stderr), 2 bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include "metrics_plot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    const char *out = NULL;
    metrics_plot_options o = {0};
    const ct_cli_flag flags[] = {
        CT_CLI_FLAG("--output", CT_CLI_STRING, &out, "OUT.png", "where the chart goes",
                    .alias = "-o", .default_text = "METRICS with .jsonl replaced by .png"),
        CT_CLI_FLAG("--x", CT_CLI_STRING, &o.x, "FIELD",
                    "the x axis, a numeric field (step, epoch, time_s, ...)",
                    .default_text = "step"),
        CT_CLI_FLAG("--title", CT_CLI_STRING, &o.title, "TEXT", "above the chart",
                    .default_text = "the metrics file's name"),
        CT_CLI_FLAG("--script", CT_CLI_STRING, &o.script, "FILE",
                    "also save the gnuplot script, data inline, to restyle it"),
    };
    ct_cli cli = {.prog = "ctplot",
                  .about = "Draws the fields named *loss* (top) and *_per_s (bottom) of a metrics "
                           "file\nagainst the x field into a PNG chart, with gnuplot "
                           "(docs/plot.md).",
                  .flags = flags,
                  .nflags = sizeof flags / sizeof *flags,
                  .args = "METRICS.jsonl",
                  .epilog = "Exit codes: 0 written, 1 it could not be, 2 bad usage."};
    int first, rc = ct_cli_parse(&cli, argc, argv, &first);
    if (rc)
        return rc > 0 ? 0 : 2;
    if (argc - first != 1) {
        fprintf(stderr, "ctplot: %s\nTry 'ctplot --help'.\n",
                argc == first ? "which metrics file?" : "one metrics file at a time");
        return 2;
    }
    const char *metrics = argv[first];
    char *made = out ? NULL : default_output(metrics);
    if (!out && !made) {
        fprintf(stderr, "ctplot: out of memory\n");
        return 1;
    }
    rc = metrics_plot(metrics, out ? out : made, &o);
    if (rc)
        fprintf(stderr, "ctplot: %s\n", ct_errmsg());
    else
        printf("ctplot: wrote %s\n", out ? out : made);
    free(made);
    return rc ? 1 : 0;
}
