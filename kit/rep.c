/* The kit's helpers for the cases' report sections (rep.h): numbers and strings of a results
 * file made safe for a markdown table, gnuplot scripts and data files written whole or not
 * at all, and the plots shared by several cases. Results files are shared between users, so
 * everything read from one is untrusted: every string that reaches a gnuplot script or data
 * file goes through vl_rep_gp_str. */
#define _GNU_SOURCE
#include "rep.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

#include "util.h"
#include "vramlab/fileio.h"

extern char **environ;

/* ---- numbers and strings of a results file ------------------------------------------------- */
double vl_rep_numv(const cJSON *v) {
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
  return cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : NAN;
}

double vl_rep_num(const cJSON *o, const char *k) { return vl_rep_numv(cJSON_GetObjectItem(o, k)); }

/* A run metric across repetitions: the mean of the repetitions' values. */
double vl_rep_run_metric(const cJSON *rung, const char *k) {
  double s = 0;
  int n = 0;
  const cJSON *r, *runs = cJSON_GetObjectItem(rung, "runs");
  if (!cJSON_IsArray(runs)) return NAN;
  cJSON_ArrayForEach(r, runs) {
    double v = vl_rep_num(r, k);
    if (!isnan(v)) { s += v; n++; }
  }
  return n ? s / n : NAN;
}

const char *vl_rep_count(double v, char *b, size_t n) {
  if (!isfinite(v)) snprintf(b, n, "—");
  else if (v >= 1e9) snprintf(b, n, "%.2fB", v / 1e9);
  else if (v >= 1e6) snprintf(b, n, "%.2fM", v / 1e6);
  else if (v >= 1e3) snprintf(b, n, "%.1fk", v / 1e3);
  else snprintf(b, n, "%.0f", v);
  return b;
}

/* Table rows print a dozen values in one fprintf: a ring of buffers keeps each alive until
 * the row is written (reports are written by one thread). */
#define RING_N 32
#define RING_LEN 256
static char *ring_next(void) {
  static char ring[RING_N][RING_LEN];
  static unsigned k;
  return ring[k++ % RING_N];
}

const char *vl_rep_fmt(const char *fmt, double v) {
  if (!isfinite(v)) return "—";
  char *b = ring_next();
  snprintf(b, RING_LEN, fmt, v);
  return b;
}

const cJSON *vl_rep_plan(const cJSON *rung) { return cJSON_GetObjectItem(rung, "plan"); }

const cJSON *vl_rep_run0(const cJSON *rung) {
  const cJSON *runs = cJSON_GetObjectItem(rung, "runs");
  return cJSON_IsArray(runs) ? cJSON_GetArrayItem(runs, 0) : NULL;
}

const cJSON *vl_rep_rung(const cJSON *res, const char *name) {
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const char *n = cJSON_GetStringValue(cJSON_GetObjectItem(r, "name"));
    if (n && name && !strcmp(n, name)) return r;
  }
  return NULL;
}

const char *vl_rep_yes_no(const cJSON *b) {
  return cJSON_IsTrue(b) ? "yes" : cJSON_IsFalse(b) ? "**no**" : "—";
}

const char *vl_rep_str(const cJSON *o, const char *k) {
  const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(o, k));
  if (!s) return "—";
  char *b = ring_next();
  size_t j = 0;
  for (; s[j] && j < RING_LEN - 8; j++) {
    unsigned char ch = (unsigned char)s[j];
    b[j] = ch == '|' ? '/' : ch < 0x20 || ch == 0x7f ? ' ' : (char)ch;
  }
  /* cut on a UTF-8 character boundary */
  if (s[j]) while (j > 0 && ((unsigned char)b[j] & 0xc0) == 0x80) j--;
  b[j] = 0;
  return b;
}

/* ---- strings into gnuplot ------------------------------------------------------------------ */
/* A whitelist, not an escape: inside gnuplot's single quotes a quote ends the string and a
 * line break ends the command, after which `system(...)`, backquotes and @macros run; a data
 * column with a space or a quote shifts every column after it. */
static bool gp_safe(unsigned char ch, bool token) {
  if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) return true;
  if (ch == ' ') return !token;
  return ch && strchr("_.,:;+-/()%=<>", ch) != NULL;
}

const char *vl_rep_gp_str(const char *s, bool token, char *buf, size_t n) {
  if (!n) return "";
  if (!s) return n > 1 ? strcpy(buf, "?") : strcpy(buf, ""); /* '?' is inert in both uses */
  size_t max = n - 1 < VL_REP_GP_MAX ? n - 1 : VL_REP_GP_MAX, j = 0;
  for (; s[j] && j < max; j++) buf[j] = gp_safe((unsigned char)s[j], token) ? s[j] : '_';
  if (!j && token && max) buf[j++] = '_';
  buf[j] = 0;
  return buf;
}

/* ---- plots -------------------------------------------------------------------------------- */
bool vl_rep_have_gnuplot(void) {
  /* VRAMLAB_NO_GNUPLOT=1: scripts and data are still written, nothing is rendered (the fuzz
   * target; a machine where gnuplot is broken) */
  const char *off = getenv("VRAMLAB_NO_GNUPLOT");
  if (off && off[0] && strcmp(off, "0")) return false;
  return system("command -v gnuplot >/dev/null 2>&1") == 0;
}

static bool plot_name_ok(const char *name) {
  if (!name[0] || strlen(name) > 64) return false;
  for (const char *p = name; *p; p++)
    if (!gp_safe((unsigned char)*p, true) || strchr(".,:;+/()%=<>", *p)) return false;
  return true;
}

static vl_status write_script(const char *dir, const char *name, const char *script, vl_err *e) {
  if (!plot_name_ok(name)) return vl_err_set(e, VL_ERR_INVALID, "'%s' is not a plot name", name);
  char path[1200];
  vl_err werr;
  if (snprintf(path, sizeof path, "%s/%s.gp", dir, name) >= (int)sizeof path)
    return vl_err_set(e, VL_ERR_IO, "the report folder's path is too long");
  /* vl_png names the output: the report renders into a temp file, `gnuplot name.gp` by hand
   * into name.png */
  char *text = NULL;
  if (asprintf(&text, "# vramlab report: gnuplot %s.gp in this folder re-renders %s.png\n"
                      "if (!exists(\"vl_png\")) vl_png = '%s.png'\n%s", name, name, name, script) < 0) {
    return vl_err_set(e, VL_ERR_OOM, "out of memory");
  }
  vl_status rc = vl_write_atomic(path, text, &werr);
  free(text);
  if (rc) vl_err_set(e, rc, "cannot write %s.gp: %s", name, werr.msg);
  return rc;
}

/* A PNG that gnuplot finished: signature first, the IEND chunk last. gnuplot does not check
 * its writes, so on a full disk it exits 0 with half a PNG. Synced before it is renamed. */
static bool png_whole(const char *path) {
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
  unsigned char head[8], tail[12];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = !fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size >= 20 &&
            pread(fd, head, 8, 0) == 8 && pread(fd, tail, 12, st.st_size - 12) == 12 &&
            !memcmp(head, sig, 8) && !memcmp(tail, iend, 12) && !fsync(fd);
  close(fd);
  return ok;
}

/* gnuplot runs with no shell in between (the folder's name is never parsed), in dir, stdin
 * from /dev/null (a stray `pause` cannot wait), stderr into a fresh temporary file that
 * becomes name.gnuplot.log only when it explains a failure (renamed over whatever has that
 * name: a link planted there is replaced, never written through). */
static vl_status render(const char *dir, const char *name, const char *log_shown, vl_err *e) {
  char tmp[128], final[1200], tmp_path[1200], log_path[1200], setvar[200], gp[100];
  char log_tmp[PATH_MAX];
  vl_err lerr;
  snprintf(tmp, sizeof tmp, "%s.png.tmp.%d", name, (int)getpid());
  snprintf(setvar, sizeof setvar, "vl_png = '%s'", tmp);
  snprintf(gp, sizeof gp, "%s.gp", name);
  snprintf(final, sizeof final, "%s/%s.png", dir, name);
  snprintf(tmp_path, sizeof tmp_path, "%s/%s", dir, tmp);
  snprintf(log_path, sizeof log_path, "%s/%s.gnuplot.log", dir, name);
  int log_fd = -1;
  if (vl_file_tmp_beside(log_path, log_tmp, sizeof log_tmp, &log_fd, &lerr))
    return vl_err_set(e, VL_ERR_IO, "gnuplot's log: %s", lerr.msg);
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa)) {
    vl_err_set(e, VL_ERR_OOM, "out of memory");
    close(log_fd);
    unlink(log_tmp);
    return VL_ERR_IO;
  }
  posix_spawn_file_actions_addchdir_np(&fa, dir);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
  char *argv[] = {"gnuplot", "-e", setvar, gp, NULL};
  pid_t pid;
  int sp = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ), st = 0;
  posix_spawn_file_actions_destroy(&fa);
  if (sp) {
    vl_err_set(e, VL_ERR_IO, "cannot start gnuplot: %s", strerror(sp));
    close(log_fd);
    unlink(log_tmp);
    return VL_ERR_IO;
  }
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) { st = -1; break; }
  vl_status rc = VL_ERR_IO;
  if (st == -1)
    vl_err_set(e, VL_ERR_IO, "lost track of gnuplot: %s", strerror(errno));
  else if (WIFSIGNALED(st))
    vl_err_set(e, VL_ERR_IO, "gnuplot was killed by signal %d (see %s)", WTERMSIG(st), log_shown);
  else if (WEXITSTATUS(st) == 127)
    vl_err_set(e, VL_ERR_IO, "gnuplot could not be started (see %s)", log_shown);
  else if (WEXITSTATUS(st))
    vl_err_set(e, VL_ERR_IO, "gnuplot failed with status %d (see %s)", WEXITSTATUS(st), log_shown);
  else if (!png_whole(tmp_path))
    vl_err_set(e, VL_ERR_IO, "gnuplot wrote an incomplete PNG (a full disk?)");
  else if (rename(tmp_path, final))
    vl_err_set(e, VL_ERR_IO, "rename to %s.png: %s", name, strerror(errno));
  else
    rc = VL_OK;
  if (rc) {
    unlink(tmp_path);
    (void)vl_file_tmp_commit(log_fd, log_tmp, log_path, NULL); /* the log explains the failure */
  } else {
    close(log_fd);
    unlink(log_tmp);
    unlink(log_path); /* a log of an earlier failure (or a link in its place) */
  }
  return rc;
}

vl_status vl_rep_gnuplot(const char *dir, const char *name, const char *script, vl_err *e) {
  char log_shown[1200];
  snprintf(log_shown, sizeof log_shown, "%s/%s.gnuplot.log", dir, name);
  VL_TRY(write_script(dir, name, script, e));
  return render(dir, name, log_shown, e);
}

void vl_rep_plot_missing(FILE *md, const char *dir, const char *name, const char *why) {
  /* a PNG from an earlier results file beside this report would be a silently wrong plot */
  char png[1200];
  snprintf(png, sizeof png, "%s/%s.png", dir, name);
  unlink(png);
  fprintf(md, "_Plot `%s` is missing: %s._\n\n", name, why);
}

int vl_rep_plot(FILE *md, const char *dir, const char *case_id, bool gnuplot, const char *name,
                const char *alt, const char *script) {
  char log_shown[256];
  vl_err why = {0};
  snprintf(log_shown, sizeof log_shown, "`%s/%s.gnuplot.log`", case_id, name);
  int rc = write_script(dir, name, script, &why) ? -1 : 0;
  if (!rc && !gnuplot) { /* the report says once that nothing is rendered */
    char png[1200];
    snprintf(png, sizeof png, "%s/%s.png", dir, name);
    unlink(png);
    return -1;
  }
  if (!rc) rc = render(dir, name, log_shown, &why) ? -1 : 0;
  if (rc)
    vl_rep_plot_missing(md, dir, name, why.msg);
  else fprintf(md, "![%s](%s/%s.png)\n\n", alt, case_id, name);
  return rc;
}

int vl_rep_dat_open(vl_rep_dat *d) {
  d->buf = NULL;
  d->len = 0;
  d->f = open_memstream(&d->buf, &d->len);
  return d->f ? 0 : -1;
}

vl_status vl_rep_dat_commit(vl_rep_dat *d, const char *dir, const char *name, vl_err *e) {
  bool ok = d->f && !ferror(d->f);
  if (d->f && fclose(d->f)) ok = false;
  d->f = NULL;
  char path[1200];
  vl_err werr;
  vl_status rc = VL_ERR_IO;
  if (!ok || !d->buf)
    rc = vl_err_set(e, VL_ERR_OOM, "cannot build %s: out of memory", name);
  else if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
    vl_err_set(e, VL_ERR_IO, "the report folder's path is too long");
  else if (vl_write_atomic(path, d->buf, &werr))
    vl_err_set(e, VL_ERR_IO, "cannot write %s: %s", name, werr.msg);
  else
    rc = VL_OK;
  free(d->buf);
  d->buf = NULL;
  return rc;
}

/* ---- shared plot data -------------------------------------------------------------------- */

/* NaN where a value is missing: gnuplot leaves it out, where a 0 would plot a wrong bar. */
static void dat_num(FILE *f, const char *fmt, double v) {
  if (isfinite(v)) fprintf(f, fmt, v);
  else fputs(" NaN", f);
}

vl_status vl_rep_write_pairs(const char *dir, const char *name, const cJSON *pairs, vl_err *e) {
  vl_rep_dat d;
  if (vl_rep_dat_open(&d)) return vl_err_set(e, VL_ERR_OOM, "cannot build %s: out of memory", name);
  const cJSON *pt;
  if (cJSON_IsArray(pairs))
    cJSON_ArrayForEach(pt, pairs) {
      double x = cJSON_GetArraySize(pt) == 2 ? vl_rep_numv(cJSON_GetArrayItem(pt, 0)) : NAN;
      double y = cJSON_GetArraySize(pt) == 2 ? vl_rep_numv(cJSON_GetArrayItem(pt, 1)) : NAN;
      if (cJSON_IsArray(pt) && !isnan(x) && !isnan(y)) fprintf(d.f, "%g %.4f\n", x, y / 1e9);
    }
  return vl_rep_dat_commit(&d, dir, name, e);
}

vl_status vl_rep_mem_by_category(const cJSON *res, const char *dir, const char *title, char *script, size_t n,
                                 vl_err *e) {
  static const char *cats[] = {"frozen", "params", "grads", "optim", "acts", "temp", "workspace", "data", "comm"};
  static const char *col[] = {"#7b3294", "#1b9e77", "#80b1d3", "#e6ab02", "#f0e442",
                              "#377eb8", "#e41a1c", "#333333", "#a65628"};
  /* gnuplot refuses a histogram column without one valid point: plot only the categories
   * (and the cap) that some rung has */
  bool has[10] = {false};
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *p = cJSON_GetObjectItem(r, "plan"), *bc = cJSON_GetObjectItem(p, "by_category");
    for (int i = 0; i < 9; i++) has[i] |= !isnan(vl_rep_num(bc, cats[i]));
    has[9] |= !isnan(vl_rep_num(p, "cap_bytes"));
  }
  int ncat = 0;
  for (int i = 0; i < 9; i++) ncat += has[i];
  if (!ncat) return vl_err_set(e, VL_ERR_INVALID, "the results hold no plan memory by category");
  vl_rep_dat d;
  if (vl_rep_dat_open(&d)) return vl_err_set(e, VL_ERR_OOM, "cannot build mem_by_category.dat: out of memory");
  fprintf(d.f, "index rung");
  for (int i = 0; i < 9; i++) fprintf(d.f, " %s", cats[i]);
  fprintf(d.f, " cap\n");
  int idx = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *p = cJSON_GetObjectItem(r, "plan"), *bc = cJSON_GetObjectItem(p, "by_category");
    char name[64];
    /* one token: the xtic(2) column; a space would shift the columns after it */
    const char *rn = cJSON_GetStringValue(cJSON_GetObjectItem(r, "name"));
    fprintf(d.f, "%d %s", idx++, vl_rep_gp_str(rn, true, name, sizeof name));
    for (int i = 0; i < 9; i++) dat_num(d.f, " %.4f", vl_rep_num(bc, cats[i]) / 1e9);
    dat_num(d.f, " %.4f", vl_rep_num(p, "cap_bytes") / 1e9);
    fputc('\n', d.f);
  }
  VL_TRY(vl_rep_dat_commit(&d, dir, "mem_by_category.dat", e));
  char t[VL_REP_GP_MAX + 1];
  int sn = snprintf(script, n,
                    "set terminal png size 1000,560 noenhanced\nset output vl_png\n"
                    "set title '%s'\n"
                    "set style data histograms\nset style histogram rowstacked\n"
                    "set style fill solid 0.85 border -1\nset boxwidth 0.7\nset ylabel 'GB'\n"
                    "set key outside right\nset xtics rotate by -30\nset yrange [0:*]\n"
                    "plot",
                    vl_rep_gp_str(title, false, t, sizeof t));
  bool first = true;
  for (int i = 0; i < 9 && sn > 0 && (size_t)sn < n; i++) {
    if (!has[i]) continue;
    sn += snprintf(script + sn, n - (size_t)sn, "%s '%s' using %d%s title columnheader(%d) lc rgb '%s'",
                   first ? "" : ",", first ? "mem_by_category.dat" : "", i + 3, first ? ":xtic(2)" : "", i + 3, col[i]);
    first = false;
  }
  if (has[9] && sn > 0 && (size_t)sn < n)
    sn += snprintf(script + sn, n - (size_t)sn, ", '' using 1:12 with linespoints lw 2 pt 7 lc rgb 'red' title 'cap'");
  if (sn > 0 && (size_t)sn < n) sn += snprintf(script + sn, n - (size_t)sn, "\n");
  if (sn < 0 || (size_t)sn >= n)
    return vl_err_set(e, VL_ERR_INVALID, "the mem_by_category script does not fit its buffer");
  return VL_OK;
}
