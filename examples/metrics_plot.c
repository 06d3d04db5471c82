#define _POSIX_C_SOURCE 200809L

#include "metrics_plot.h"

#include <cJSON.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum { PANEL_NONE, PANEL_LOSS, PANEL_RATE };

/* A numeric field of the file, with its points if a panel draws it. */
typedef struct field {
    char *name;
    int panel;
    double *xy; /* (n, 2): x, y */
    size_t n, cap;
} field;

typedef struct metrics {
    field *f;
    size_t n, cap;
    size_t lines, lines_with_x;
    double xmin, xmax; /* over the points drawn */
} metrics;

static int panel_of(const char *name) {
    size_t len = strlen(name);
    if (strstr(name, "loss"))
        return PANEL_LOSS;
    if (len >= 6 && !strcmp(name + len - 6, "_per_s"))
        return PANEL_RATE;
    return PANEL_NONE;
}

static int out_of_memory(void) { return ct_seterr(CT_ENOMEM, "metrics_plot: out of memory"); }

static field *field_get(metrics *m, const char *name) {
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->f[i].name, name))
            return &m->f[i];
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 16;
        field *f = realloc(m->f, cap * sizeof *f);
        if (!f)
            return NULL;
        m->f = f;
        m->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy)
        return NULL;
    m->f[m->n] = (field){.name = copy, .panel = panel_of(name)};
    return &m->f[m->n++];
}

static int field_add(metrics *m, field *f, double x, double y) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 64;
        double *xy = realloc(f->xy, 2 * cap * sizeof *xy);
        if (!xy)
            return out_of_memory();
        f->xy = xy;
        f->cap = cap;
    }
    f->xy[2 * f->n] = x;
    f->xy[2 * f->n + 1] = y;
    f->n++;
    m->xmin = fmin(m->xmin, x);
    m->xmax = fmax(m->xmax, x);
    return 0;
}

static void metrics_free(metrics *m) {
    for (size_t i = 0; i < m->n; i++) {
        free(m->f[i].name);
        free(m->f[i].xy);
    }
    free(m->f);
}

/* Where a bare nan, inf or infinity (any case, signed or not) that starts
 * at p ends, or NULL. printf writes them so, and Python's json NaN and
 * Infinity. */
static const char *nonfinite_end(const char *p) {
    static const char *const words[] = {"infinity", "inf", "nan"};
    p += *p == '-' || *p == '+';
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        size_t k = strlen(words[i]);
        if (!strncasecmp(p, words[i], k) && !isalnum((unsigned char)p[k]))
            return p + k;
    }
    return NULL;
}

/* line with every non-finite number outside strings made null, so that a
 * diverged run still plots up to where it diverged; malloc'd. */
static char *null_nonfinite(const char *line) {
    char *out = malloc(2 * strlen(line) + 1); /* "nan" (3) becomes "null" (4) */
    if (!out)
        return NULL;
    size_t o = 0;
    bool in_string = false;
    for (const char *p = line; *p; p++) {
        const char *end;
        if (in_string) {
            if (*p == '\\' && p[1])
                out[o++] = *p++;
            else if (*p == '"')
                in_string = false;
        } else if (*p == '"') {
            in_string = true;
        } else if ((p == line || !isalnum((unsigned char)p[-1])) && (end = nonfinite_end(p))) {
            memcpy(out + o, "null", 4);
            o += 4;
            p = end - 1;
            continue;
        }
        out[o++] = *p;
    }
    out[o] = '\0';
    return out;
}

static cJSON *parse_line(const char *line, bool *oom) {
    cJSON *obj = cJSON_ParseWithOpts(line, NULL, true);
    if (obj)
        return obj;
    char *fixed = null_nonfinite(line);
    *oom = !fixed;
    obj = fixed ? cJSON_ParseWithOpts(fixed, NULL, true) : NULL;
    free(fixed);
    return obj;
}

/* Adds a line's numeric fields to m, and its points if it has the x
 * field. */
static int add_line(metrics *m, const cJSON *obj, const char *xname) {
    const cJSON *xv = cJSON_GetObjectItemCaseSensitive(obj, xname);
    bool has_x = cJSON_IsNumber(xv) && isfinite(xv->valuedouble);
    m->lines++;
    m->lines_with_x += has_x;
    const cJSON *item;
    cJSON_ArrayForEach(item, obj) {
        if (!strcmp(item->string, xname) || !(cJSON_IsNumber(item) || cJSON_IsNull(item)))
            continue;
        field *f = field_get(m, item->string);
        if (!f)
            return out_of_memory();
        if (has_x && f->panel != PANEL_NONE && cJSON_IsNumber(item) &&
            isfinite(item->valuedouble) && field_add(m, f, xv->valuedouble, item->valuedouble))
            return CT_ENOMEM;
    }
    return 0;
}

static int read_metrics(const char *path, const char *xname, metrics *m) {
    FILE *in = fopen(path, "r");
    if (!in)
        return ct_seterr(CT_EIO, "metrics_plot: cannot read '%s': %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    for (long number = 1; !rc && (len = getline(&line, &cap, in)) > 0; number++) {
        bool still_written = line[len - 1] != '\n';
        while (len && isspace((unsigned char)line[len - 1]))
            line[--len] = '\0';
        const char *p = line + strspn(line, " \t\r\v\f");
        if (!*p)
            continue;
        bool oom = false;
        cJSON *obj = parse_line(line, &oom);
        if (oom)
            rc = out_of_memory();
        else if (!obj && still_written)
            break;
        else if (!cJSON_IsObject(obj))
            rc = ct_seterr(CT_ECORRUPT, "metrics_plot: '%s' line %ld is not a JSON object: %.60s",
                           path, number, p);
        else
            rc = add_line(m, obj, xname);
        cJSON_Delete(obj);
    }
    if (!rc && ferror(in))
        rc = ct_seterr(CT_EIO, "metrics_plot: cannot read '%s': %s", path, strerror(errno));
    free(line);
    fclose(in);
    return rc;
}

/* "a, b, c" (the fields m has), cut short to fit buf. */
static const char *field_list(const metrics *m, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "%s", m->n ? "" : "none that is a number");
    for (size_t i = 0; i < m->n && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", m->f[i].name);
    if (o >= cap && cap > 4)
        memcpy(buf + cap - 4, "...", 4);
    return buf;
}

static size_t panel_count(const metrics *m, int panel) {
    size_t n = 0;
    for (size_t i = 0; i < m->n; i++)
        n += m->f[i].panel == panel && m->f[i].n > 0;
    return n;
}

static int check_plottable(const metrics *m, const char *path, const char *xname) {
    char fields[320];
    if (!m->lines)
        return ct_seterr(CT_EINVAL, "metrics_plot: '%s' has no metrics: it is empty", path);
    if (!m->lines_with_x)
        return ct_seterr(CT_EINVAL,
                         "metrics_plot: no line of '%s' has the x field '%s' as a number; its "
                         "fields: %s",
                         path, xname, field_list(m, fields, sizeof fields));
    if (!panel_count(m, PANEL_LOSS) && !panel_count(m, PANEL_RATE))
        return ct_seterr(CT_EINVAL,
                         "metrics_plot: nothing to plot in '%s': no field whose name contains "
                         "'loss' or ends in '_per_s' is a number on a line with '%s'; its "
                         "fields: %s",
                         path, xname, field_list(m, fields, sizeof fields));
    return 0;
}

/* s as a gnuplot string: single quotes take everything literally but a
 * quote, which is doubled. */
static void put_quoted(FILE *out, const char *s) {
    fputc('\'', out);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', out);
        fputc(iscntrl((unsigned char)*s) ? ' ' : *s, out);
    }
    fputc('\'', out);
}

static void put_panel(FILE *out, const metrics *m, int panel, const char *xname) {
    static const char *const ylabel[] = {"", "loss", "throughput (per second)"};
    fprintf(out, "\nset xlabel ");
    put_quoted(out, xname);
    fprintf(out, "\nset ylabel '%s'\n", ylabel[panel]);
    if (panel == PANEL_RATE)
        fprintf(out, "set yrange [0:*]\nset key bottom right\n");
    else
        fprintf(out, "set autoscale y\nset key top right\n");
    const char *sep = "plot ";
    for (size_t i = 0; i < m->n; i++) {
        const field *f = &m->f[i];
        if (f->panel != panel || !f->n)
            continue;
        bool sparse = 2 * f->n < m->lines_with_x || f->n <= 25;
        fprintf(out, "%s$s%zu using 1:2 with %s title ", sep, i,
                sparse ? "linespoints pointtype 7 pointsize 0.8 linewidth 1.5"
                       : "lines linewidth 1.5");
        put_quoted(out, f->name);
        sep = ", \\\n     ";
    }
    fputc('\n', out);
}

static void write_script(FILE *out, const metrics *m, const char *xname, const char *title,
                         const char *metrics_path, const char *png_path) {
    fprintf(out, "# ct metrics_plot: the chart of ");
    put_quoted(out, metrics_path);
    fprintf(out, "; run `gnuplot THIS_FILE` to draw it again.\n"
                 "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
                 "    set terminal pngcairo noenhanced size 1000,800 font ',11'\n"
                 "} else {\n"
                 "    set terminal png noenhanced size 1000,800\n"
                 "}\n"
                 "set output ");
    put_quoted(out, png_path);
    fputc('\n', out);
    for (size_t i = 0; i < m->n; i++) {
        const field *f = &m->f[i];
        if (f->panel == PANEL_NONE || !f->n)
            continue;
        fprintf(out, "\n# ");
        put_quoted(out, f->name);
        fprintf(out, "\n$s%zu << EOD\n", i);
        for (size_t k = 0; k < f->n; k++)
            fprintf(out, "%.10g %.10g\n", f->xy[2 * k], f->xy[2 * k + 1]);
        fprintf(out, "EOD\n");
    }
    size_t panels = (panel_count(m, PANEL_LOSS) > 0) + (panel_count(m, PANEL_RATE) > 0);
    fprintf(out, "\nset multiplot layout %zu,1 title ", panels);
    put_quoted(out, title);
    fprintf(out, " font ',13'\nset grid\nset key opaque box\nset lmargin 12\nset rmargin 4\n");
    /* Both panels span the same steps, so that they line up. */
    if (m->xmin < m->xmax)
        fprintf(out, "set xrange [%.10g:%.10g]\n", m->xmin, m->xmax);
    for (int panel = PANEL_LOSS; panel <= PANEL_RATE; panel++)
        if (panel_count(m, panel))
            put_panel(out, m, panel, xname);
    fprintf(out, "\nunset multiplot\nset output\n");
}

/* A file that is gone once closed. */
static FILE *temp_file(void) {
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/ct_plot.XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0)
        return NULL;
    unlink(path);
    FILE *f = fdopen(fd, "w+");
    if (!f)
        close(fd);
    return f;
}

static int temp_file_failed(void) {
    return ct_seterr(CT_EIO, "metrics_plot: cannot make a temporary file (in TMPDIR or /tmp): %s",
                     strerror(errno));
}

/* The end of what gnuplot printed, where its error is, without the blank
 * lines around it. */
static void read_tail(FILE *f, char *buf, size_t cap) {
    long size = fseek(f, 0, SEEK_END) ? 0 : ftell(f);
    long from = size > (long)cap - 1 ? size - (long)cap + 1 : 0;
    size_t got = fseek(f, from, SEEK_SET) ? 0 : fread(buf, 1, cap - 1, f);
    while (got && isspace((unsigned char)buf[got - 1]))
        got--;
    buf[got] = '\0';
    size_t lead = strspn(buf, "\n\r");
    memmove(buf, buf + lead, got - lead + 1);
}

/* Whether an executable named prog is in one of PATH's directories, as
 * posix_spawnp will look for it. */
static bool on_path(const char *prog) {
    const char *path = getenv("PATH");
    for (const char *p = path && *path ? path : "/usr/bin:/bin"; *p;) {
        size_t len = strcspn(p, ":");
        char full[4096];
        snprintf(full, sizeof full, "%.*s/%s", (int)(len ? len : 1), len ? p : ".", prog);
        if (!access(full, X_OK))
            return true;
        p += len + (p[len] == ':');
    }
    return false;
}

int metrics_plot_check(const char *png_path) {
    if (!on_path("gnuplot"))
        return ct_seterr(CT_ENOTSUP,
                         "drawing %s needs gnuplot, which is not on PATH: install gnuplot-nox "
                         "(bash ci/setup.sh)",
                         png_path);
    const char *slash = strrchr(png_path, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - png_path + 1) : 1,
             slash ? png_path : ".");
    if (access(dir, W_OK))
        return ct_seterr(CT_EIO, "%s: cannot write in %s: %s", png_path, dir, strerror(errno));
    return 0;
}

/* Runs gnuplot on script, its output captured for the error message. */
static int run_gnuplot(FILE *script) {
    if (fflush(script) || fseek(script, 0, SEEK_SET))
        return ct_seterr(CT_EIO, "metrics_plot: cannot write the gnuplot script: %s",
                         strerror(errno));
    FILE *said = temp_file();
    if (!said)
        return temp_file_failed();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fileno(script), STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fileno(said), STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fileno(said), STDERR_FILENO);
    char prog[] = "gnuplot", defaults[] = "-d";
    pid_t pid;
    int rc = posix_spawnp(&pid, prog, &fa, NULL, (char *[]){prog, defaults, NULL}, environ);
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    while (!rc && waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            rc = errno;
    if (rc == ENOENT)
        rc = ct_seterr(CT_ENOTSUP,
                       "metrics_plot: gnuplot not found: install gnuplot-nox (bash ci/setup.sh)");
    else if (rc)
        rc = ct_seterr(CT_EIO, "metrics_plot: cannot run gnuplot: %s", strerror(rc));
    else if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        char text[800];
        read_tail(said, text, sizeof text);
        char how[40];
        if (WIFEXITED(status))
            snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(status));
        else
            snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
        rc = ct_seterr(CT_EFOREIGN, "metrics_plot: gnuplot failed (%s): %s", how,
                       *text ? text : "it printed nothing");
    }
    fclose(said);
    return rc;
}

static int check_png(const char *png_path) {
    static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    FILE *f = fopen(png_path, "rb");
    size_t got = f ? fread(head, 1, sizeof head, f) : 0;
    if (f)
        fclose(f);
    if (!got)
        return ct_seterr(CT_EIO,
                         "metrics_plot: gnuplot exited without error but wrote nothing to "
                         "'%s'",
                         png_path);
    if (got < sizeof head || memcmp(head, signature, sizeof head))
        return ct_seterr(CT_EIO, "metrics_plot: gnuplot wrote '%s', but not as a PNG", png_path);
    return 0;
}

int metrics_plot(const char *metrics_path, const char *png_path, const metrics_plot_options *opts) {
    if (!metrics_path || !png_path)
        return ct_seterr(CT_EINVAL, "metrics_plot: the metrics and PNG paths must not be NULL");
    metrics_plot_options o = opts ? *opts : (metrics_plot_options){0};
    const char *xname = o.x ? o.x : "step";
    const char *base = strrchr(metrics_path, '/');
    const char *title = o.title ? o.title : base ? base + 1 : metrics_path;
    metrics m = {.xmin = INFINITY, .xmax = -INFINITY};
    int rc = read_metrics(metrics_path, xname, &m);
    if (!rc)
        rc = check_plottable(&m, metrics_path, xname);
    FILE *script = NULL;
    if (!rc && !(script = o.script ? fopen(o.script, "w+") : temp_file()))
        rc = o.script ? ct_seterr(CT_EIO, "metrics_plot: cannot write '%s': %s", o.script,
                                  strerror(errno))
                      : temp_file_failed();
    if (!rc)
        write_script(script, &m, xname, title, metrics_path, png_path);
    metrics_free(&m);
    /* Made now, so that a path that cannot be written fails with errno's
     * reason rather than in gnuplot's words. */
    FILE *png = rc ? NULL : fopen(png_path, "wb");
    if (!rc && !png)
        rc = ct_seterr(CT_EIO, "metrics_plot: cannot write '%s': %s", png_path, strerror(errno));
    if (png) {
        fclose(png);
        rc = run_gnuplot(script);
        if (!rc)
            rc = check_png(png_path);
        if (rc)
            unlink(png_path);
    }
    if (script)
        fclose(script);
    return rc;
}
