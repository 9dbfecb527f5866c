/* Statistics, environment block, atomic writes, progress lines. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "util.h"
#include "vramlab/fileio.h"

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

void vl_stats_compute(const double *x, int n, vl_stats *s) {
  memset(s, 0, sizeof *s);
  s->n = n;
  if (n <= 0) { s->median = s->min = s->max = s->mean = s->p90 = s->cv = NAN; return; }
  double *v = malloc((size_t)n * sizeof *v);
  memcpy(v, x, (size_t)n * sizeof *v);
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  s->min = v[0];
  s->max = v[n - 1];
  s->median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s->p90 = v[(int)ceil(0.9 * n) - 1];
  double m = 0, q = 0;
  for (int i = 0; i < n; i++) m += v[i];
  m /= n;
  for (int i = 0; i < n; i++) q += (v[i] - m) * (v[i] - m);
  s->mean = m;
  s->cv = n > 1 && m != 0 ? sqrt(q / (n - 1)) / m : 0;
  free(v);
}

cJSON *vl_stats_json(const vl_stats *s, const double *samples, int n) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "median", s->median);
  cJSON_AddNumberToObject(o, "min", s->min);
  cJSON_AddNumberToObject(o, "max", s->max);
  cJSON_AddNumberToObject(o, "mean", s->mean);
  if (s->n >= 10) cJSON_AddNumberToObject(o, "p90", s->p90);
  if (s->n >= 3) cJSON_AddNumberToObject(o, "cv", s->cv);
  cJSON_AddNumberToObject(o, "n", s->n);
  if (samples) cJSON_AddItemToObject(o, "samples", cJSON_CreateDoubleArray(samples, n));
  return o;
}

static void read_line(const char *cmd, char *out, size_t n) {
  out[0] = 0;
  FILE *p = popen(cmd, "r");
  if (!p) return;
  if (fgets(out, (int)n, p)) out[strcspn(out, "\n")] = 0;
  pclose(p);
}

cJSON *vl_env_json(const char *device) {
  cJSON *e = cJSON_CreateObject();
  char buf[256];
  read_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'", buf, sizeof buf);
  cJSON_AddStringToObject(e, "cpu", buf);
  cJSON_AddNumberToObject(e, "cores", (double)sysconf(_SC_NPROCESSORS_ONLN));
  read_line("grep -m1 MemTotal /proc/meminfo | awk '{print $2*1024}'", buf, sizeof buf);
  cJSON_AddNumberToObject(e, "ram_bytes", atof(buf));
  struct utsname u;
  if (!uname(&u)) cJSON_AddStringToObject(e, "kernel", u.release);
  cJSON_AddStringToObject(e, "device", device);
  read_line("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1", buf, sizeof buf);
  cJSON_AddStringToObject(e, "gpu", buf[0] ? buf : "none");
  /* the commit, "-dirty" when the code differs from it (the index flags such reports stale) */
  read_line("git -C " VRAMLAB_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null", buf, sizeof buf);
  if (buf[0]) {
    char dirty[8];
    read_line("git -C " VRAMLAB_SOURCE_DIR " status --porcelain --untracked-files=no -- engine datasets kit "
              "harness cases CMakeLists.txt 2>/dev/null | head -c 1", dirty, sizeof dirty);
    if (dirty[0] && strlen(buf) + 7 < sizeof buf) strcat(buf, "-dirty");
  }
  cJSON_AddStringToObject(e, "git_commit", buf[0] ? buf : "unknown");
  read_line("dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null", buf, sizeof buf);
  cJSON_AddStringToObject(e, "openblas", buf[0] ? buf : "unknown");
  cJSON_AddStringToObject(e, "compiler", __VERSION__);
  time_t t = time(NULL);
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
  cJSON_AddStringToObject(e, "time", buf);
  return e;
}

/* The harness's names for the engine's file functions (vramlab/fileio.h). */
int vl_mkdir_p(const char *path) { return vl_file_mkdir_p(path, NULL) == VL_OK ? 0 : -1; }

vl_status vl_write_atomic(const char *path, const char *text, vl_err *e) {
  return vl_file_write_atomic(path, text, strlen(text), e);
}

/* A results file, a ladder or a report path given by a user may name a FIFO (whose open
 * waits for a writer forever) or a huge file: an error, never a hang or a 2^63-byte
 * allocation. */
char *vl_read_file_max(const char *path, size_t max, size_t *n, vl_err *e) {
  char *text = NULL;
  return vl_file_read_text(path, max, NULL, &text, n, e) == VL_OK ? text : NULL;
}

char *vl_read_file(const char *path, size_t *n) {
  return vl_read_file_max(path, (size_t)1 << 30, n, NULL);
}

void vl_progress(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[vramlab] ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
