/* libFuzzer target: arbitrary bytes as a results file through the path `vramlab report`
 * takes (vl_report_write: read, parse, validate, then the markdown, the results copy, the
 * gnuplot scripts and data files), once for every registered case. Plots are not rendered
 * (VRAMLAB_NO_GNUPLOT: one gnuplot per input would be far too slow), but every script and
 * data file is still written, and each is checked here for what would let a results file
 * run a command or shift a data column: abort() when it does, so that the fuzzer reports it. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "harness/report.h"

/* Every artifact goes through vl_write_atomic, whose fsync costs milliseconds on a disk: ten
 * of them per valid input would cut the executions tenfold. Durability is not what is fuzzed
 * here, so this binary's fsync (which the statically linked report code calls instead of
 * libc's) only says yes. */
int fsync(int fd) {
  (void)fd;
  return 0;
}

static char tmp[512], in_path[600], md_path[600];
static const vl_case *const *cases;
static int n_cases;
static vl_ladder *ladders; /* loaded once: a ladder is about 1 MB and its files never change */

static void die(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_results: %s: %s\n", what, detail);
  abort();
}

static void init(void) {
  if (setenv("VRAMLAB_NO_GNUPLOT", "1", 1)) die("setenv", "VRAMLAB_NO_GNUPLOT");
  const char *t = getenv("TMPDIR");
  snprintf(tmp, sizeof tmp, "%s/vl-fuzz-results-XXXXXX", t && t[0] ? t : "/tmp");
  if (!mkdtemp(tmp)) die("mkdtemp", tmp);
  snprintf(in_path, sizeof in_path, "%s/results.json", tmp);
  snprintf(md_path, sizeof md_path, "%s/report.md", tmp);
  cases = vl_case_all(&n_cases);
  ladders = calloc((size_t)n_cases, sizeof *ladders);
  if (!ladders) die("calloc", "ladders");
  for (int i = 0; i < n_cases; i++) {
    vl_err err;
    if (vl_ladder_load(&ladders[i], VRAMLAB_SOURCE_DIR, cases[i]->id, &err)) die("ladder", err.msg);
  }
}

/* Whitespace-separated fields of one line. */
static int fields(const char *line, const char *end) {
  int n = 0;
  for (const char *p = line; p < end; p++)
    if (*p != ' ' && (p == line || p[-1] == ' ')) n++;
  return n;
}

/* A script: outside quoted strings no system() and no backquote or macro anywhere; no
 * quoted string runs past a line end (a results string would then be gnuplot commands). A
 * data file: no quote, backquote or macro; the rung-name column is one token. */
static void check_file(const char *path, const char *name, const char *t, bool gp) {
  if (strchr(t, '`') || strchr(t, '@')) die("backquote or macro in", path);
  if (!gp && (strchr(t, '\'') || strchr(t, '"'))) die("quote in data file", path);
  int sq = 0, dq = 0;
  for (const char *p = t; *p; p++) {
    if (*p == '\'' && !dq) sq ^= 1;
    else if (*p == '"' && !sq) dq ^= 1;
    else if (*p == '\n' && (sq || dq)) die("quoted string past a line end in", path);
    else if (gp && !sq && !dq && !strncmp(p, "system", 6)) die("system call in", path);
  }
  if (sq || dq) die("unterminated string in", path);
  int want = !strcmp(name, "mem_by_category.dat") ? 12
             : !strcmp(name, "step_time.dat") || !strcmp(name, "wait.dat") ? 2 : 0;
  for (const char *l = t; want && *l;) {
    const char *e = strchr(l, '\n');
    if (!e) e = l + strlen(l);
    if (fields(l, e) != want) die("a row with the wrong number of columns in", path);
    l = *e ? e + 1 : e;
  }
}

/* Check, then remove, every script and data file the report wrote (so that the next input
 * is judged on its own files). */
static void check_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    size_t n = strlen(e->d_name);
    bool gp = n > 3 && !strcmp(e->d_name + n - 3, ".gp"), dat = n > 4 && !strcmp(e->d_name + n - 4, ".dat");
    if (gp || dat) {
      vl_err err;
      char *t = vl_read_file_max(path, (size_t)1 << 30, NULL, &err);
      if (!t) die("cannot read back", err.msg);
      check_file(path, e->d_name, t, gp);
      free(t);
    }
    unlink(path);
  }
  closedir(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ladders) init();
  FILE *f = fopen(in_path, "wb");
  if (!f) die("fopen", in_path);
  if (size && fwrite(data, 1, size, f) != size) die("fwrite", in_path);
  if (fclose(f)) die("fclose", in_path);
  for (int i = 0; i < n_cases; i++) {
    char dir[700];
    vl_err err = {0};
    if (vl_report_write(cases[i], &ladders[i], in_path, md_path, &err)) continue;
    snprintf(dir, sizeof dir, "%s/%s", tmp, cases[i]->id);
    check_dir(dir);
  }
  return 0;
}
