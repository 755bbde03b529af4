/* SVG charts: see plot.h. A panel maps data ranges to a pixel box; ticks are 1/2/5 steps. */
#include "bench/plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

struct panel {
    double x, y, w, h;     /* pixel box of the plotting area */
    double x0, x1, y0, y1; /* data ranges */
};

static double px(const struct panel *p, double v)
{
    return p->x + (v - p->x0) / (p->x1 - p->x0) * p->w;
}

static double py(const struct panel *p, double v)
{
    return p->y + p->h - (v - p->y0) / (p->y1 - p->y0) * p->h;
}

static void text_esc(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else
            fputc(*s, f);
    }
}

static double nice_step(double range, int target)
{
    if (!(range > 0)) return 1;
    double raw = range / target, mag = pow(10, floor(log10(raw)));
    double m = raw / mag;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * mag;
}

static double nice_max(double v)
{
    if (!(v > 0)) return 1;
    double st = nice_step(v, 5);
    return ceil(v / st) * st;
}

static void fmt_num(char *buf, size_t n, double v)
{
    if (v != 0 && (fabs(v) >= 1e5 || fabs(v) < 1e-2))
        snprintf(buf, n, "%.1e", v);
    else
        snprintf(buf, n, "%g", round(v * 1000) / 1000);
}

static void axes(FILE *f, const struct panel *p, const char *title, const char *xl, const char *yl)
{
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='white' stroke='#444'/>\n",
            p->x, p->y, p->w, p->h);
    char buf[32];
    double sx = nice_step(p->x1 - p->x0, 6), sy = nice_step(p->y1 - p->y0, 5);
    for (double v = ceil(p->x0 / sx) * sx; v <= p->x1 + sx * 1e-9; v += sx) {
        double X = px(p, v);
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>\n", X, p->y, X,
                p->y + p->h);
        fmt_num(buf, sizeof buf, v);
        fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle'>%s</text>\n", X, p->y + p->h + 14,
                buf);
    }
    for (double v = ceil(p->y0 / sy) * sy; v <= p->y1 + sy * 1e-9; v += sy) {
        double Y = py(p, v);
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>\n", p->x, Y,
                p->x + p->w, Y);
        fmt_num(buf, sizeof buf, v);
        fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='end'>%s</text>\n", p->x - 4, Y + 4, buf);
    }
    fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle' font-weight='bold'>", p->x + p->w / 2,
            p->y - 8);
    text_esc(f, title);
    fprintf(f, "</text>\n<text x='%.1f' y='%.1f' text-anchor='middle'>", p->x + p->w / 2,
            p->y + p->h + 30);
    text_esc(f, xl);
    fprintf(f, "</text>\n<text transform='translate(%.1f,%.1f) rotate(-90)' text-anchor='middle'>",
            p->x - 40, p->y + p->h / 2);
    text_esc(f, yl);
    fputs("</text>\n", f);
}

static void cdf_panel(FILE *f, struct panel p, const char *title, const double *v, int n,
                      const char *color)
{
    double p99 = stats_quantile(v, n, 0.99);
    double hi = n ? v[n - 1] : 1;
    int clipped = n && hi > 3 * p99 && p99 > 0;
    if (clipped) hi = 3 * p99; /* one outlier must not flatten the curve */
    p.x0 = 0;
    p.x1 = nice_max(hi);
    p.y0 = 0;
    p.y1 = 1;
    char xl[96];
    snprintf(xl, sizeof xl, "%s (ms)%s", title, clipped ? ", clipped at 3 x P99" : "");
    axes(f, &p, title, xl, "fraction of samples");
    if (!n) {
        fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle'>no samples</text>\n",
                p.x + p.w / 2, p.y + p.h / 2);
        return;
    }
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", color);
    int pts = n < 1000 ? n : 1000;
    for (int k = 0; k < pts; k++) {
        int i = pts == n ? k : (int)((double)k * (n - 1) / (pts - 1));
        double x = v[i] < p.x1 ? v[i] : p.x1;
        fprintf(f, "%.1f,%.1f ", px(&p, x), py(&p, (double)(i + 1) / n));
    }
    fputs("'/>\n", f);
}

static FILE *open_svg(const char *path, int w, int h, struct err *e)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        err_set(e, "%s: %s", path, strerror(errno));
        return NULL;
    }
    fprintf(f,
            "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' viewBox='0 0 %d %d' "
            "font-family='sans-serif' font-size='11'>\n<rect width='100%%' height='100%%' "
            "fill='#fafafa'/>\n",
            w, h, w, h);
    return f;
}

static int close_svg(FILE *f, const char *path, struct err *e)
{
    fputs("</svg>\n", f);
    if (ferror(f) | fclose(f)) return err_set(e, "%s: write failed", path);
    return 0;
}

int plot_run_svg(const char *path, const struct req_result *r, int n, const struct summary *s,
                 const char *title, struct err *e)
{
    FILE *f = open_svg(path, 1000, 800, e);
    if (!f) return -1;
    fprintf(f, "<text x='500' y='24' text-anchor='middle' font-size='15' font-weight='bold'>");
    text_esc(f, title);
    fputs("</text>\n", f);
    static const char *const names[] = {"TTFT", "TPOT", "ITL", "E2E latency"};
    static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
    for (int m = 0; m < 4; m++) {
        int k;
        double *v = stats_values(r, n, (enum metric)m, &k);
        struct panel p = {.x = 70 + (m % 2) * 480, .y = 60 + (m / 2) * 240, .w = 400, .h = 170};
        cdf_panel(f, p, names[m], v, k, colors[m]);
        free(v);
    }
    struct panel p = {.x = 70, .y = 560, .w = 880, .h = 170};
    double hi = 0;
    for (int b = 0; b < s->n_bins; b++)
        if (s->out_tps[b] > hi) hi = s->out_tps[b];
    p.x0 = 0;
    p.x1 = nice_max(s->n_bins * s->bin_s);
    p.y0 = 0;
    p.y1 = nice_max(hi);
    char xl[64];
    snprintf(xl, sizeof xl, "time since the first request (s), bins of %g s", s->bin_s);
    axes(f, &p, "Output throughput over time", xl, "tokens/s");
    fprintf(f, "<polyline fill='none' stroke='#ff7f0e' stroke-width='2' points='");
    for (int b = 0; b < s->n_bins; b++)
        fprintf(f, "%.1f,%.1f %.1f,%.1f ", px(&p, b * s->bin_s), py(&p, s->out_tps[b]),
                px(&p, (b + 1) * s->bin_s), py(&p, s->out_tps[b]));
    fputs("'/>\n", f);
    return close_svg(f, path, e);
}

static void series(FILE *f, const struct panel *p, const struct summary *runs, int n,
                   const double *ys, const char *color, int dashed, int label)
{
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2'%s points='", color,
            dashed ? " stroke-dasharray='6,4'" : "");
    for (int i = 0; i < n; i++)
        if (!isnan(ys[i])) fprintf(f, "%.1f,%.1f ", px(p, runs[i].output_throughput), py(p, ys[i]));
    fputs("'/>\n", f);
    for (int i = 0; i < n; i++) {
        if (isnan(ys[i])) continue;
        double X = px(p, runs[i].output_throughput), Y = py(p, ys[i]);
        fprintf(f, "<circle cx='%.1f' cy='%.1f' r='3.5' fill='%s'/>\n", X, Y, color);
        if (label) fprintf(f, "<text x='%.1f' y='%.1f'>%g</text>\n", X + 5, Y - 5, runs[i].load);
    }
}

int plot_sweep_svg(const char *path, const struct summary *runs, int n, const char *load_name,
                   const char *title, struct err *e)
{
    FILE *f = open_svg(path, 1000, 420, e);
    if (!f) return -1;
    fprintf(f, "<text x='500' y='24' text-anchor='middle' font-size='15' font-weight='bold'>");
    text_esc(f, title);
    fprintf(f, "</text>\n<text x='500' y='42' text-anchor='middle'>points labelled with the ");
    text_esc(f, load_name);
    fputs("; solid: median, dashed: P99</text>\n", f);
    double xmax = 0;
    for (int i = 0; i < n; i++)
        if (runs[i].output_throughput > xmax) xmax = runs[i].output_throughput;
    double *med = xmalloc(sizeof *med * (size_t)(n ? n : 1));
    double *p99 = xmalloc(sizeof *p99 * (size_t)(n ? n : 1));
    for (int k = 0; k < 2; k++) {
        double hi = 0;
        for (int i = 0; i < n; i++) {
            const struct dist *d = k == 0 ? &runs[i].ttft : &runs[i].tpot;
            med[i] = d->median;
            p99[i] = d->p99;
            if (!isnan(d->p99) && d->p99 > hi) hi = d->p99;
        }
        struct panel p = {.x = 80 + k * 480, .y = 80, .w = 390, .h = 260};
        p.x0 = 0;
        p.x1 = nice_max(xmax);
        p.y0 = 0;
        p.y1 = nice_max(hi);
        const char *name = k == 0 ? "TTFT (ms)" : "TPOT (ms)";
        axes(f, &p,
             k == 0 ? "Time to first token vs throughput" : "Time per output token vs throughput",
             "output throughput (tokens/s)", name);
        const char *color = k == 0 ? "#1f77b4" : "#d62728";
        series(f, &p, runs, n, med, color, 0, 1);
        series(f, &p, runs, n, p99, color, 1, 0);
    }
    free(med);
    free(p99);
    return close_svg(f, path, e);
}

/* Whether run i is dominated on (throughput up, latency lat down) by another valid run. */
static int dominated(const struct summary *runs, const char *const *errs, int n, int i,
                     const double *lat)
{
    for (int j = 0; j < n; j++) {
        if (j == i || errs[j] || isnan(lat[j])) continue;
        int ge = runs[j].output_throughput >= runs[i].output_throughput && lat[j] <= lat[i];
        int gt = runs[j].output_throughput > runs[i].output_throughput || lat[j] < lat[i];
        if (ge && gt) return 1;
    }
    return 0;
}

int plot_server_svg(const char *path, const struct summary *runs, const char *const *args,
                    const char *const *errs, int n, const char *title, struct err *e)
{
    int h = 400 + 16 * n;
    FILE *f = open_svg(path, 1000, h, e);
    if (!f) return -1;
    fprintf(f, "<text x='500' y='24' text-anchor='middle' font-size='15' font-weight='bold'>");
    text_esc(f, title);
    fputs("</text>\n<text x='500' y='42' text-anchor='middle'>one point per server args "
          "(numbered as below); filled: no other point has as much throughput at a lower "
          "P99</text>\n",
          f);
    static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    double ymax = 0;
    for (int i = 0; i < n; i++)
        if (!errs[i] && runs[i].output_throughput > ymax) ymax = runs[i].output_throughput;
    double *lat = xmalloc(sizeof *lat * (size_t)(n ? n : 1));
    for (int k = 0; k < 2; k++) {
        double hi = 0;
        for (int i = 0; i < n; i++) {
            lat[i] = errs[i] ? NAN : k == 0 ? runs[i].itl.p99 : runs[i].ttft.p99;
            if (!isnan(lat[i]) && lat[i] > hi) hi = lat[i];
        }
        struct panel p = {.x = 80 + k * 480, .y = 80, .w = 390, .h = 260};
        p.x0 = 0;
        p.x1 = nice_max(hi);
        p.y0 = 0;
        p.y1 = nice_max(ymax);
        axes(f, &p, k == 0 ? "Throughput vs P99 inter-token latency" : "Throughput vs P99 TTFT",
             k == 0 ? "P99 ITL (ms)" : "P99 TTFT (ms)", "output throughput (tokens/s)");
        for (int i = 0; i < n; i++) {
            if (isnan(lat[i])) continue;
            const char *c = colors[i % 10];
            double X = px(&p, lat[i]), Y = py(&p, runs[i].output_throughput);
            fprintf(f,
                    "<circle cx='%.1f' cy='%.1f' r='5' stroke='%s' stroke-width='2' fill='%s'/>\n",
                    X, Y, c, dominated(runs, errs, n, i, lat) ? "white" : c);
            fprintf(f, "<text x='%.1f' y='%.1f' fill='%s'>%d</text>\n", X + 7, Y - 6, c, i + 1);
        }
    }
    free(lat);
    for (int i = 0; i < n; i++) {
        fprintf(f, "<text x='80' y='%d' fill='%s'>%d: ", 390 + 16 * i, colors[i % 10], i + 1);
        text_esc(f, args[i] && args[i][0] ? args[i] : "(no extra args)");
        if (errs[i]) {
            fputs(" (failed: ", f);
            text_esc(f, errs[i]);
            fputc(')', f);
        } else {
            fprintf(f, " (%.1f tok/s, P99 ITL %.1f ms, P99 TTFT %.1f ms)",
                    runs[i].output_throughput, runs[i].itl.p99, runs[i].ttft.p99);
        }
        fputs("</text>\n", f);
    }
    return close_svg(f, path, e);
}
