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

#include "harness.h"

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
  read_line("git -C " VRAMLAB_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null", buf, sizeof buf);
  cJSON_AddStringToObject(e, "git_commit", buf[0] ? buf : "unknown");
  read_line("dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null", buf, sizeof buf);
  cJSON_AddStringToObject(e, "openblas", buf[0] ? buf : "unknown");
  cJSON_AddStringToObject(e, "compiler", __VERSION__);
  time_t t = time(NULL);
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
  cJSON_AddStringToObject(e, "time", buf);
  return e;
}

int vl_mkdir_p(const char *path) {
  char tmp[PATH_MAX];
  size_t len = strlen(path);
  if (len == 0 || len >= sizeof tmp) { errno = len ? ENAMETOOLONG : ENOENT; return -1; }
  memcpy(tmp, path, len + 1);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
  if (mkdir(tmp, 0755) == 0) return 0;
  /* an existing directory is fine; an existing file of that name is not */
  struct stat st;
  if (errno == EEXIST && stat(tmp, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return 0;
    errno = ENOTDIR;
  }
  return -1;
}

int vl_write_atomic(const char *path, const char *text, char *err, size_t errn) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
    snprintf(err, errn, "path too long: %.200s... (limit %d)", path, PATH_MAX - 16);
    return -1;
  }
  /* a fresh file: never through a leftover FIFO or a symlink planted under the temp name */
  unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) { snprintf(err, errn, "cannot create %s: %s", tmp, strerror(errno)); return -1; }
  size_t n = strlen(text), off = 0;
  while (off < n) {
    ssize_t w = write(fd, text + off, n - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      snprintf(err, errn, "write %s: %s", tmp, strerror(errno));
      close(fd); unlink(tmp);
      return -1;
    }
    off += (size_t)w;
  }
  if (fsync(fd) || close(fd)) {
    snprintf(err, errn, "fsync %s: %s", tmp, strerror(errno));
    unlink(tmp);
    return -1;
  }
  if (rename(tmp, path)) {
    snprintf(err, errn, "rename to %s: %s", path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* Results files come from users: a directory (where ftell says LONG_MAX), a FIFO (where a
 * read waits for a writer forever) or a huge file must give an error, not a 2^63-byte
 * allocation or a hang. O_NONBLOCK makes opening a FIFO return at once and changes nothing
 * for a regular file; fstat then refuses everything that is not one. */
char *vl_read_file_max(const char *path, size_t max, size_t *n, char *err, size_t errn) {
  char none[1];
  if (!err || !errn) { err = none; errn = sizeof none; }
  if (max > (size_t)-1 / 4) max = (size_t)-1 / 4; /* so that max + 1 and 2 * cap cannot wrap */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    snprintf(err, errn, "%s: %s", path, strerror(e));
    errno = e;
    return NULL;
  }
  struct stat st;
  int e = 0;
  if (fstat(fd, &st)) {
    e = errno;
    snprintf(err, errn, "%s: %s", path, strerror(e));
  } else if (!S_ISREG(st.st_mode)) {
    e = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    snprintf(err, errn, "%s: not a regular file (%s)", path,
             S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
             : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a socket or special file");
  } else if ((unsigned long long)st.st_size > max) {
    e = EFBIG;
    snprintf(err, errn, "%s: %lld bytes, more than the %zu this reads", path, (long long)st.st_size, max);
  }
  if (e) { close(fd); errno = e; return NULL; }
  /* read to the end, not st_size bytes: the file may change under us; cap + 1 spare byte
   * tells a file that grew from one that did not */
  size_t cap = (size_t)st.st_size + 1, len = 0;
  char *b = malloc(cap + 1);
  while (b) {
    if (len == cap) {
      if (cap > max) { e = EFBIG; snprintf(err, errn, "%s: more than the %zu bytes this reads", path, max); break; }
      size_t nc = cap <= max / 2 ? 2 * cap : max + 1;
      char *nb = realloc(b, nc + 1);
      if (!nb) break;
      b = nb;
      cap = nc;
    }
    ssize_t r = read(fd, b + len, cap - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) { e = errno; snprintf(err, errn, "read %s: %s", path, strerror(e)); break; }
    if (r == 0) {
      close(fd);
      b[len] = 0;
      if (n) *n = len;
      return b;
    }
    len += (size_t)r;
  }
  if (!b || !e) { e = ENOMEM; snprintf(err, errn, "%s: out of memory", path); }
  free(b);
  close(fd);
  errno = e;
  return NULL;
}

char *vl_read_file(const char *path, size_t *n) {
  return vl_read_file_max(path, (size_t)1 << 30, n, NULL, 0);
}

void vl_progress(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[vramlab] ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
