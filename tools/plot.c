/* SPDX-License-Identifier: MIT */
#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void fa_plot_init(fa_plot *p) { memset(p, 0, sizeof(*p)); }

void fa_plot_add(fa_plot *p, const char *series, double x, double y)
{
    fa_plot_series *s = NULL;
    for (int i = 0; i < p->nseries; i++)
        if (strcmp(p->series[i].name, series) == 0)
            s = &p->series[i];
    if (!s) {
        if (p->nseries == FA_PLOT_MAX_SERIES)
            return;
        s = &p->series[p->nseries++];
        snprintf(s->name, sizeof(s->name), "%s", series);
    }
    if (s->n < FA_PLOT_MAX_POINTS && x > 0 && isfinite(y)) {
        s->x[s->n] = x;
        s->y[s->n] = y;
        s->n++;
    }
}

int fa_plot_write_svg(const fa_plot *p, FILE *f, const char *title, const char *xlabel, const char *ylabel)
{
    static const char *colors[] = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf" };
    const double W = 760, H = 460, L = 70, R = 200, T = 50, B = 60;
    double x0 = INFINITY, x1 = -INFINITY, y1 = 1.0;
    for (int i = 0; i < p->nseries; i++)
        for (int j = 0; j < p->series[i].n; j++) {
            x0 = fmin(x0, log2(p->series[i].x[j]));
            x1 = fmax(x1, log2(p->series[i].x[j]));
            y1 = fmax(y1, p->series[i].y[j]);
        }
    if (!isfinite(x0)) {
        x0 = 0;
        x1 = 1;
    }
    if (x1 - x0 < 1)
        x1 = x0 + 1;
    y1 = ceil(y1 * 1.1);
#define PX(v) (L + ((v) - x0) / (x1 - x0) * (W - L - R))
#define PY(v) (H - B - (v) / y1 * (H - T - B))
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"25\" font-size=\"15\">%s</text>\n", L, title);
    for (double e = ceil(x0); e <= x1 + 1e-9; e += 1) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                PX(e), PY(0), PX(e), PY(y1));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", PX(e),
                PY(0) + 18, pow(2, e));
    }
    double step = y1 <= 5 ? 0.5 : y1 <= 12 ? 1 : y1 <= 40 ? 5 : 10;
    for (double v = 0; v <= y1 + 1e-9; v += step) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                PX(x0), PY(v), PX(x1), PY(v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", PX(x0) - 6,
                PY(v) + 4, v);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" "
               "stroke-dasharray=\"4 3\"/>\n", PX(x0), PY(1), PX(x1), PY(1));
    fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n", (L + W - R) / 2,
            H - 15, xlabel);
    fprintf(f, "<text transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
            (T + H - B) / 2, ylabel);
    for (int i = 0; i < p->nseries; i++) {
        const fa_plot_series *s = &p->series[i];
        const char *col = colors[i % 10];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int j = 0; j < s->n; j++)
            fprintf(f, "%.1f,%.1f ", PX(log2(s->x[j])), PY(s->y[j]));
        fprintf(f, "\"/>\n");
        for (int j = 0; j < s->n; j++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", PX(log2(s->x[j])),
                    PY(s->y[j]), col);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"4\" fill=\"%s\"/>\n",
                W - R + 15, T + 20 * i + 4, col);
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", W - R + 35, T + 20 * i + 10, s->name);
    }
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}
