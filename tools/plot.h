/* SPDX-License-Identifier: MIT */
/* A tiny SVG line chart: named series of (x, y) points, x on a log2 axis. */
#ifndef FA_TOOLS_PLOT_H
#define FA_TOOLS_PLOT_H

#include <stdio.h>

#define FA_PLOT_MAX_SERIES 16
#define FA_PLOT_MAX_POINTS 32

typedef struct fa_plot_series {
    char name[64];
    int n;
    double x[FA_PLOT_MAX_POINTS], y[FA_PLOT_MAX_POINTS];
} fa_plot_series;

typedef struct fa_plot {
    int nseries;
    fa_plot_series series[FA_PLOT_MAX_SERIES];
} fa_plot;

void fa_plot_init(fa_plot *p);
/* Add a point to the named series (created on first use); extra points are dropped. */
void fa_plot_add(fa_plot *p, const char *series, double x, double y);
/* Write the chart to f; 0, or -1 where a write failed (ferror). */
int fa_plot_write_svg(const fa_plot *p, FILE *f, const char *title, const char *xlabel, const char *ylabel);

#endif
