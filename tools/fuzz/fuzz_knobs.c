/* libFuzzer target: arbitrary bytes as `--set` assignments and knob values. The first byte
 * picks a registered case, whose real ladder (loaded once) is copied; every following line
 * is applied with vl_ladder_set, then run through the strict number parsers (kit/parse.c)
 * and the knob helpers (vl_knob_int/double/bool/bytes/int_list), and finally every rung of
 * the modified ladder goes through the case's knob validation (vl_case_check_knobs and its
 * check hook: what `vramlab` runs before anything is planned). Nothing is planned or run.
 * abort() on a broken promise (a value accepted outside its range, a refusal without a
 * message, a knob set that no longer holds its limits), so that the fuzzer reports it. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "kit/parse.h"

static const vl_case *const *cases;
static int n_cases;
static vl_ladder *pristine, *work; /* about 1 MB each: off the stack, loaded once */

static void die(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_knobs: %s: %s\n", what, detail);
  abort();
}

static void init(void) {
  cases = vl_case_all(&n_cases);
  pristine = calloc((size_t)n_cases, sizeof *pristine);
  work = malloc(sizeof *work);
  if (!pristine || !work) die("calloc", "ladders");
  for (int i = 0; i < n_cases; i++) {
    vl_err err;
    if (vl_ladder_load(&pristine[i], VRAMLAB_SOURCE_DIR, cases[i]->id, &err)) die("ladder", err.msg);
  }
}

static void check_knobs(const vl_knobs *k, const char *where) {
  if (k->n < 0 || k->n > VL_MAX_KNOBS) die("knob count", where);
  for (int i = 0; i < k->n; i++) {
    size_t kl = strnlen(k->k[i].key, sizeof k->k[i].key), vl = strnlen(k->k[i].val, sizeof k->k[i].val);
    if (kl == 0 || kl >= sizeof k->k[i].key) die("knob name empty or unterminated", where);
    if (vl == 0 || vl >= sizeof k->k[i].val) die("knob value empty or unterminated", k->k[i].key);
  }
}

/* One value through every parser: what each accepts must be inside its range. */
static void parse_value(const char *v) {
  int64_t i;
  if (vl_parse_i64(v, -1000, 1000, &i) == VL_PARSE_OK && (i < -1000 || i > 1000)) die("i64 out of range", v);
  if (vl_parse_i64(v, INT64_MIN, INT64_MAX, &i) == VL_PARSE_OK) {
    /* the only integers: an optional sign then digits */
    const char *p = v + (*v == '-' || *v == '+');
    if (!*p || strspn(p, "0123456789") != strlen(p)) die("i64 accepted a non-integer", v);
  }
  double x;
  if (vl_parse_f64(v, -1, 1, &x) == VL_PARSE_OK && !(x >= -1 && x <= 1)) die("f64 out of range", v);
  if (vl_parse_f64(v, -INFINITY, INFINITY, &x) == VL_PARSE_OK && isnan(x)) die("f64 accepted NaN", v);
  if (vl_parse_f64(v, -DBL_MAX, DBL_MAX, &x) == VL_PARSE_OK && !isfinite(x)) die("f64 accepted an infinity", v);
  int64_t list[8];
  int n = -1;
  if (vl_parse_i64_list(v, 0, 64, list, 8, &n) == VL_PARSE_OK) {
    if (n < 1 || n > 8) die("list count", v);
    for (int k = 0; k < n; k++)
      if (list[k] < 0 || list[k] > 64) die("list item out of range", v);
  }
  /* the knob helpers, on a set holding only this value (the declared default is never read) */
  static const vl_knob_decl decl[] = {{"v", "1", "the fuzzed value", VL_KNOB_RUNG}, {NULL, NULL, NULL, 0}};
  vl_knobs *k = calloc(1, sizeof *k);
  if (!k) return;
  vl_err err;
  if (vl_knob_set_err(k, "v", v, &err) == 0) {
    long l, lv[16];
    int b, m;
    size_t sz;
    err.msg[0] = 0;
    if (vl_knob_int(k, "v", decl, 1, 4096, &l, &err)) { if (!err.msg[0]) die("int refused without a message", v); }
    else if (l < 1 || l > 4096) die("knob int out of range", v);
    err.msg[0] = 0;
    if (vl_knob_double(k, "v", decl, 1e-12, 10, &x, &err)) { if (!err.msg[0]) die("double refused without a message", v); }
    else if (!(x >= 1e-12 && x <= 10)) die("knob double out of range", v);
    err.msg[0] = 0;
    if (vl_knob_bool(k, "v", decl, &b, &err)) { if (!err.msg[0]) die("bool refused without a message", v); }
    else if (b != 0 && b != 1) die("knob bool", v);
    err.msg[0] = 0;
    if (vl_knob_bytes(k, "v", decl, &sz, &err)) { if (!err.msg[0]) die("bytes refused without a message", v); }
    else if (sz == 0) die("knob bytes 0", v);
    err.msg[0] = 0;
    if (vl_knob_int_list(k, "v", decl, 0, 1024, lv, 16, &m, &err)) { if (!err.msg[0]) die("list refused without a message", v); }
    else if (m < 1 || m > 16) die("knob list count", v);
  } else if (!err.msg[0]) {
    die("knob refused without a message", v);
  }
  free(k);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  if (!cases) init();
  if (n == 0) return 0;
  int ci = d[0] % n_cases;
  const vl_case *c = cases[ci];
  memcpy(work, &pristine[ci], sizeof *work);
  char *buf = malloc(n);
  if (!buf) return 0;
  memcpy(buf, d + 1, n - 1);
  buf[n - 1] = 0; /* a NUL inside ends the input: a C string cannot hold one */
  vl_err err;
  const char *p = buf;
  for (int k = 0; k < 32 && *p; k++) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    char *a = malloc(len + 1);
    if (!a) break;
    memcpy(a, p, len);
    a[len] = 0;
    err.msg[0] = 0;
    if (vl_ladder_set(work, a, &err) && !err.msg[0]) die("--set refused without a message", a);
    const char *eq = strchr(a, '=');
    parse_value(eq ? eq + 1 : a);
    free(a);
    p += len + (nl ? 1 : 0);
  }
  free(buf);
  check_knobs(&work->setting, "[case]");
  /* the validation load_case runs: names, then values at two scales */
  static const vl_knobs no_knobs;
  const char *scales[] = {"tiny", "full"};
  for (int s = 0; s < 2; s++) {
    vl_case_env env = {.scale = scales[s], .device = VL_DEV_PLAN, .setting = &work->setting, .quiet = 1};
    env.err.msg[0] = 0;
    if (c->check(&env, &no_knobs) != VL_OK && !env.err.msg[0]) die("setting refused without a message", c->id);
    for (int i = 0; i < work->n_rungs; i++) {
      check_knobs(&work->rungs[i].knobs, work->rungs[i].name);
      env.err.msg[0] = 0;
      if (vl_case_check_knobs(&env, c, work->rungs[i].name, &work->rungs[i].knobs) != VL_OK) {
        if (!env.err.msg[0]) die("unknown knob without a message", work->rungs[i].name);
        continue;
      }
      env.err.msg[0] = 0;
      if (c->check(&env, &work->rungs[i].knobs) != VL_OK && !env.err.msg[0])
        die("rung refused without a message", work->rungs[i].name);
    }
  }
  return 0;
}
