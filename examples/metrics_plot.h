/* examples internal header: renders a ct metrics file (JSON lines, one
 * object per line, as fmnist_mlp --metrics writes) to a PNG chart with
 * gnuplot, so that a run can be looked at, not just read. ctplot is its
 * command line; fmnist_mlp --plot calls it after training.
 *
 *   if (metrics_plot("run.jsonl", "run.png", NULL))
 *       fprintf(stderr, "%s\n", ct_errmsg());
 *
 * What it draws, against the x field ("step" unless opts say otherwise):
 *   - top panel: every numeric field whose name contains "loss" (loss,
 *     train_loss, val_loss);
 *   - bottom panel: every numeric field whose name ends in "_per_s"
 *     (samples_per_s, tokens_per_s), its y axis from 0.
 * A panel with nothing to draw is left out. A line without the x field, or
 * without a series' field, adds no point to that series, so per-step lines
 * and per-eval lines may share a file. A sparse series (fewer points than
 * half the lines that have the x field, or at most 25) is drawn with points
 * and lines, a dense one with lines. Values that are not finite (NaN, inf:
 * a diverged run, even when written as bare nan or NaN) and JSON null add
 * no point. Blank lines are skipped, and so is a last line that has no
 * newline yet and is not valid JSON: the end of a file still being
 * written.
 *
 * gnuplot 5 (Debian: gnuplot-nox) is run from PATH with its default settings
 * (-d), with the pngcairo terminal where it has one and png otherwise.
 *
 * Ownership. Everything is borrowed; nothing is kept after the call. The
 * script file, if asked for, is the caller's.
 *
 * Errors. 0, or a negative CT_E* code with ct_errmsg() saying why:
 *   CT_EIO       the metrics file cannot be read, png_path (or the script)
 *                cannot be written, gnuplot cannot be started, or it wrote
 *                no PNG;
 *   CT_ECORRUPT  a line is not a JSON object (the message gives its
 *                number);
 *   CT_EINVAL    no line has the x field, or no field is drawn ("nothing to
 *                plot"); the message lists the fields the file has;
 *   CT_ENOTSUP   gnuplot is not installed;
 *   CT_EFOREIGN  gnuplot failed; its own output is in the message.
 * On error no PNG is left at png_path.
 *
 * Threads. Safe to call from several threads at once on different output
 * paths (errors are per thread, as all of ct's).
 */
#ifndef METRICS_PLOT_H
#define METRICS_PLOT_H

#include <ct/ct.h>

typedef struct metrics_plot_options {
    const char *x;      /* the x axis field; NULL: "step" */
    const char *title;  /* above the chart; NULL: the metrics file's name */
    const char *script; /* NULL, or where to save the gnuplot script as well
                           (its data inline): edit it and run `gnuplot FILE`
                           to restyle the chart */
} metrics_plot_options;

/* Renders metrics_path to png_path (1000 x 800 pixels), replacing what was
 * there; opts may be NULL. */
int metrics_plot(const char *metrics_path, const char *png_path, const metrics_plot_options *opts);

/* What metrics_plot() will need, checked before a run's work: gnuplot on
 * PATH and png_path's directory writable. CT_ENOTSUP or CT_EIO saying
 * which, the path named. */
int metrics_plot_check(const char *png_path);

#endif /* METRICS_PLOT_H */
