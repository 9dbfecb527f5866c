/* The kit's small services for cases and the driver: statistics over repetitions, the
 * results' environment block and file helpers, the progress line (util.c). */
#ifndef VRAMLAB_KIT_UTIL_H
#define VRAMLAB_KIT_UTIL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "vramlab/core.h" /* vl_status, vl_err */

/* ---- statistics ---- */
typedef struct { double median, min, max, mean, p90, cv; int n; } vl_stats;
void vl_stats_compute(const double *x, int n, vl_stats *s);
cJSON *vl_stats_json(const vl_stats *s, const double *samples, int n);

/* ---- results ---- */
cJSON *vl_env_json(const char *device);
/* Write text atomically: temp file in the same directory, fsync, rename. */
vl_status vl_write_atomic(const char *path, const char *text, vl_err *e);
int vl_mkdir_p(const char *path);
/* The whole regular file at path (NUL-terminated, *n bytes), or NULL with a message in e:
 * not there, not a regular file (a directory, a FIFO, a device), or larger than max bytes. */
char *vl_read_file_max(const char *path, size_t max, size_t *n, vl_err *e);
/* vl_read_file_max with a 1 GiB limit and no message. */
char *vl_read_file(const char *path, size_t *n);

/* ---- progress ---- */
void vl_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
