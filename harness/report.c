/* reports/<case>.md: setting, claims with verdicts, ladder tables, plots (gnuplot PNG).
 * Results files are shared between users, so everything read from one is untrusted: it is
 * validated before anything is written, every string that reaches a gnuplot script or data
 * file goes through vl_rep_gp_str, and every artifact is written whole or not at all. */
#define _GNU_SOURCE
#include "report.h"

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

#include "vramlab/fileio.h"

extern char **environ;

const char *vl_verdict_name(vl_verdict v) {
  switch (v) {
    case VL_HOLDS: return "holds";
    case VL_DIRECTION_HOLDS: return "direction holds";
    case VL_DOES_NOT_HOLD: return "does not hold";
    default: return "not measurable here";
  }
}

static int sgn(double x) { return (x > 0) - (x < 0); }

vl_verdict vl_judge(const vl_claim *c, double before, double after) {
  if (!strcmp(c->kind, "ratio_range")) {
    /* the measured change after/before inside [lo, hi]; else the direction of the range */
    if (isnan(after) || isnan(before) || before == 0) return VL_NOT_MEASURABLE;
    double r = after / before, mid = 0.5 * (c->lo + c->hi);
    if (r >= c->lo && r <= c->hi) return VL_HOLDS;
    return sgn(r - 1) == sgn(mid - 1) ? VL_DIRECTION_HOLDS : VL_DOES_NOT_HOLD;
  }
  if (!strcmp(c->kind, "range")) {
    if (isnan(after)) return VL_NOT_MEASURABLE;
    return after >= c->lo && after <= c->hi ? VL_HOLDS : VL_DOES_NOT_HOLD;
  }
  if (isnan(after) || isnan(before)) return VL_NOT_MEASURABLE;
  double ab = c->article_before, aa = c->article_after;
  if (!strcmp(c->kind, "ratio")) {
    if (before == 0 || ab == 0) return VL_NOT_MEASURABLE;
    double mr = after / before, ar = aa / ab;
    if (fabs(mr - ar) <= c->tol * fabs(ar)) return VL_HOLDS;
    return sgn(mr - 1) == sgn(ar - 1) ? VL_DIRECTION_HOLDS : VL_DOES_NOT_HOLD;
  }
  /* value: both measured ends against the article's (a claim without an article "before"
   * is judged on its "after"); tolerance relative, absolute where the article says 0 */
  bool after_ok = fabs(after - aa) <= (aa != 0 ? c->tol * fabs(aa) : c->tol) + 1e-12;
  bool before_ok = isnan(ab) || fabs(before - ab) <= (ab != 0 ? c->tol * fabs(ab) : c->tol) + 1e-12;
  if (after_ok && before_ok) return VL_HOLDS;
  return sgn(after - before) == sgn(aa - ab) ? VL_DIRECTION_HOLDS : VL_DOES_NOT_HOLD;
}

/* ---- metric lookup ------------------------------------------------------------------------ */
static cJSON *find_rung(const cJSON *res, const char *name) {
  cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const char *n = cJSON_GetStringValue(cJSON_GetObjectItem(r, "name"));
    if (n && !strcmp(n, name)) return r;
  }
  return NULL;
}

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

/* A side plan (a rung varied by a claim's `set`) depends on the ladder only, never on the
 * results file, and a full-scale plan costs a largest-batch search: a process that reports
 * many files (the fuzz target, the tests) would redo the same ones for every file. They are
 * kept by what c->plan sees: the case, the knobs and the [case] setting (one thread writes
 * reports). A failed plan is kept as NULL. */
#define SIDE_CACHE_N 8
static struct { char *key; cJSON *plan; } side_cache[SIDE_CACHE_N];
static unsigned side_next;

static const cJSON *side_plan(const vl_case *c, const vl_ladder *L, const vl_knobs *k) {
  char *key = NULL;
  size_t kl = 0;
  FILE *f = open_memstream(&key, &kl);
  if (!f) return NULL;
  fprintf(f, "%s", c->id);
  for (int i = 0; i < k->n; i++) fprintf(f, "\n%s=%s", k->k[i].key, k->k[i].val);
  fprintf(f, "\n[case]");
  for (int i = 0; i < L->setting.n; i++) fprintf(f, "\n%s=%s", L->setting.k[i].key, L->setting.k[i].val);
  bool ok = !ferror(f);
  if (fclose(f) || !ok || !key) { free(key); return NULL; }
  for (int i = 0; i < SIDE_CACHE_N; i++)
    if (side_cache[i].key && !strcmp(side_cache[i].key, key)) { free(key); return side_cache[i].plan; }
  vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L->setting, .quiet = 1};
  cJSON *o = cJSON_CreateObject(); /* a side plan that fails is not measurable: no message */
  if (o && c->plan(&env, "full", k, o) != VL_OK) { cJSON_Delete(o); o = NULL; }
  unsigned slot = side_next++ % SIDE_CACHE_N;
  free(side_cache[slot].key);
  cJSON_Delete(side_cache[slot].plan);
  side_cache[slot].key = key;
  side_cache[slot].plan = o;
  return o;
}

static double metric(const vl_case *c, const vl_ladder *L, cJSON *res, const char *rung,
                     const char *set, const char *m) {
  if (!rung[0]) return NAN;
  if (set && set[0]) {
    /* a side plan: the rung varied by `set` */
    int i = vl_ladder_find(L, rung);
    if (i < 0) return NAN;
    vl_knobs k = L->rungs[i].knobs;
    char err[256];
    if (vl_knobs_apply_list(&k, set, err, sizeof err)) return NAN;
    return vl_rep_num(side_plan(c, L, &k), m);
  }
  cJSON *r = find_rung(res, rung);
  if (!r) return NAN;
  double v = vl_rep_num(cJSON_GetObjectItem(r, "plan"), m);
  if (isnan(v)) v = vl_rep_run_metric(r, m);
  /* case-wide measurements (a sweep's best setting, a ceiling) stand for every rung */
  return isnan(v) ? vl_rep_num(cJSON_GetObjectItem(res, "case_metrics"), m) : v;
}

static const char *fmt_val(double v, const char *unit, char *b, size_t n) {
  if (!isfinite(v)) snprintf(b, n, "—");
  else if (!strcmp(unit, "bytes")) snprintf(b, n, "%.2f GB", v / 1e9);
  else if (!strcmp(unit, "share")) snprintf(b, n, "%.0f%%", 100 * v);
  else if (!strcmp(unit, "count")) snprintf(b, n, "%.0f", v);
  else snprintf(b, n, "%.3g", v);
  return b;
}

static const char *fmt_ratio(double r, char *b, size_t n) {
  if (!isfinite(r)) snprintf(b, n, "—");
  else snprintf(b, n, "×%.3g", r);
  return b;
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

/* ---- results schema ------------------------------------------------------------------------ */
/* The fields the reports read, with their types and the range of their numbers. Fields not
 * listed are not read (except as claim metrics, checked separately) and may hold anything.
 * NUM takes null too: cJSON writes a NaN (not measured) as null. */
typedef enum { V_NUM, V_BOOL, V_STR, V_OBJ, V_NUMS, V_PAIRS, V_NUMOBJ, V_STROBJ, V_OBJS } vtype;
/* The values a number may take (of V_NUM, and of each number of V_NUMS and V_NUMOBJ):
 * R_ANY every finite number (losses, fits, claim metrics); R_GE0 >= 0 (times, rates, FLOPs,
 * ratios); R_WHOLE a whole number >= 0 (bytes, counts), R_WHOLE1 >= 1 (batch, accum, seq),
 * both at most 2^53, beyond which a double holds no exact count; R_FRAC a fraction in [0, 1]
 * (shares, rates of OOM, accuracies). null (not measured) is always accepted. */
typedef enum { R_ANY, R_GE0, R_WHOLE, R_WHOLE1, R_FRAC } vrange;
typedef struct vfield { const char *key; vtype t; const struct vfield *sub; vrange r; } vfield;

static const vfield env_fields[] = {
    {"cpu", V_STR, NULL, R_ANY}, {"kernel", V_STR, NULL, R_ANY}, {"device", V_STR, NULL, R_ANY},
    {"gpu", V_STR, NULL, R_ANY}, {"git_commit", V_STR, NULL, R_ANY}, {"openblas", V_STR, NULL, R_ANY},
    {"compiler", V_STR, NULL, R_ANY}, {"time", V_STR, NULL, R_ANY}, {"cores", V_NUM, NULL, R_WHOLE1},
    {"ram_bytes", V_NUM, NULL, R_WHOLE}, {NULL, 0, NULL, R_ANY}};
static const vfield stats_fields[] = {
    {"samples", V_NUMS, NULL, R_GE0}, {"median", V_NUM, NULL, R_GE0}, {"min", V_NUM, NULL, R_GE0},
    {"max", V_NUM, NULL, R_GE0}, {"mean", V_NUM, NULL, R_GE0}, {"p90", V_NUM, NULL, R_GE0},
    {"cv", V_NUM, NULL, R_GE0}, {"n", V_NUM, NULL, R_WHOLE}, {NULL, 0, NULL, R_ANY}};
static const vfield plan_fields[] = {
    {"timeline", V_PAIRS, NULL, R_ANY}, {"batch_curve", V_PAIRS, NULL, R_ANY},
    {"by_category", V_NUMOBJ, NULL, R_WHOLE}, {"peak_by_category", V_NUMOBJ, NULL, R_WHOLE},
    {"params_by_module", V_NUMOBJ, NULL, R_WHOLE}, {"scale", V_STR, NULL, R_ANY}, {"fits", V_BOOL, NULL, R_ANY},
    {"max_batch_at_search_limit", V_BOOL, NULL, R_ANY}, {"batch", V_NUM, NULL, R_WHOLE1},
    {"accum", V_NUM, NULL, R_WHOLE1}, {"seq", V_NUM, NULL, R_WHOLE1}, {"peak_bytes", V_NUM, NULL, R_WHOLE},
    {"cap_bytes", V_NUM, NULL, R_WHOLE}, {"acts_bytes", V_NUM, NULL, R_WHOLE}, {"weight_bytes", V_NUM, NULL, R_WHOLE},
    {"grads_bytes", V_NUM, NULL, R_WHOLE}, {"optim_bytes", V_NUM, NULL, R_WHOLE},
    {"params_total", V_NUM, NULL, R_WHOLE}, {"params_trainable", V_NUM, NULL, R_WHOLE},
    {"max_batch", V_NUM, NULL, R_WHOLE}, {"oom_rate", V_NUM, NULL, R_FRAC}, {"oom_batches", V_NUM, NULL, R_WHOLE1},
    {"flops_per_step", V_NUM, NULL, R_GE0}, {"plan_seconds", V_NUM, NULL, R_GE0},
    {"max_batch_search_seconds", V_NUM, NULL, R_GE0}, {"cuda_context_bytes", V_NUM, NULL, R_WHOLE},
    {"model_bytes", V_NUM, NULL, R_WHOLE}, {"extent_overhead", V_NUM, NULL, R_GE0},
    {"recompute_share", V_NUM, NULL, R_FRAC}, {"fit_base_bytes", V_NUM, NULL, R_ANY},
    {"fit_per_sample_bytes", V_NUM, NULL, R_ANY}, {"fit_r2", V_NUM, NULL, R_ANY},
    {"fit_predicted_max_batch", V_NUM, NULL, R_ANY}, {"exact_vs_linear", V_NUM, NULL, R_GE0},
    {"workers", V_NUM, NULL, R_WHOLE}, {"prefetch", V_NUM, NULL, R_WHOLE}, {"host_bytes_bound", V_NUM, NULL, R_WHOLE},
    {NULL, 0, NULL, R_ANY}};
/* one entry of a run's --profile table (cases/case_run.c: vl_case_profile_json); share is an
 * op's time over the steps' time from another clock reading, so not bounded by 1 exactly */
static const vfield profile_fields[] = {
    {"op", V_STR, NULL, R_ANY}, {"calls", V_NUM, NULL, R_WHOLE}, {"seconds", V_NUM, NULL, R_GE0},
    {"flops", V_NUM, NULL, R_GE0}, {"bytes", V_NUM, NULL, R_GE0}, {"flops_per_s", V_NUM, NULL, R_GE0},
    {"share", V_NUM, NULL, R_GE0}, {NULL, 0, NULL, R_ANY}};
static const vfield run_fields[] = {
    {"scale", V_STR, NULL, R_ANY}, {"device", V_STR, NULL, R_ANY}, {"consumer", V_STR, NULL, R_ANY},
    {"error", V_STR, NULL, R_ANY}, {"oom", V_BOOL, NULL, R_ANY}, {"plan_matches_measured", V_BOOL, NULL, R_ANY},
    {"pin_applies", V_BOOL, NULL, R_ANY}, {"loss", V_NUMS, NULL, R_ANY},
    {"pixel_accuracy_per_epoch", V_NUMS, NULL, R_FRAC}, {"miou_per_epoch", V_NUMS, NULL, R_FRAC},
    {"step_time", V_OBJ, stats_fields, R_ANY}, {"measured_by_category", V_NUMOBJ, NULL, R_WHOLE},
    {"epochs", V_OBJS, NULL, R_ANY}, {"batch", V_NUM, NULL, R_WHOLE1}, {"accum", V_NUM, NULL, R_WHOLE1},
    {"tokens_per_s", V_NUM, NULL, R_GE0}, {"sec_per_token", V_NUM, NULL, R_GE0}, {"flops_per_s", V_NUM, NULL, R_GE0},
    {"measured_peak_bytes", V_NUM, NULL, R_WHOLE}, {"planned_peak_bytes", V_NUM, NULL, R_WHOLE},
    {"images_per_s", V_NUM, NULL, R_GE0}, {"data_wait_share", V_NUM, NULL, R_FRAC},
    {"sec_per_batch_data", V_NUM, NULL, R_GE0}, {"pixel_accuracy", V_NUM, NULL, R_FRAC},
    {"miou", V_NUM, NULL, R_FRAC}, {"optimizer_steps", V_NUM, NULL, R_WHOLE},
    {"interleaved_step_seconds", V_NUM, NULL, R_GE0}, {"workers", V_NUM, NULL, R_WHOLE},
    {"prefetch", V_NUM, NULL, R_WHOLE}, {"epoch_s", V_NUM, NULL, R_GE0}, {"data_wait_frac", V_NUM, NULL, R_FRAC},
    {"accel_util", V_NUM, NULL, R_FRAC}, {"wait_s_per_batch", V_NUM, NULL, R_GE0},
    {"load_s_per_batch", V_NUM, NULL, R_GE0}, {"transform_s_per_batch", V_NUM, NULL, R_GE0},
    {"cpu_util", V_NUM, NULL, R_GE0}, {"host_bytes_bound", V_NUM, NULL, R_WHOLE},
    {"host_bytes_peak", V_NUM, NULL, R_WHOLE}, {"first_batch_s", V_NUM, NULL, R_GE0},
    {"consumer_ms", V_NUM, NULL, R_GE0}, {"profile", V_OBJS, profile_fields, R_ANY},
    {"profile_steps", V_NUM, NULL, R_WHOLE}, {"profile_seconds", V_NUM, NULL, R_GE0},
    {"profile_other_seconds", V_NUM, NULL, R_ANY}, {"profile_recompute_flops", V_NUM, NULL, R_GE0},
    {NULL, 0, NULL, R_ANY}};
static const vfield rung_fields[] = {
    {"name", V_STR, NULL, R_ANY}, {"label", V_STR, NULL, R_ANY}, {"knobs", V_STROBJ, NULL, R_ANY},
    {"plan", V_OBJ, plan_fields, R_ANY}, {"runs", V_OBJS, run_fields, R_ANY}, {NULL, 0, NULL, R_ANY}};
static const vfield interleaved_fields[] = {
    {"rounds", V_NUM, NULL, R_WHOLE}, {"batch", V_NUM, NULL, R_WHOLE1}, {NULL, 0, NULL, R_ANY}};
static const vfield case_metrics_fields[] = {
    {"torch_not_measured", V_STR, NULL, R_ANY}, {"sweep_incomplete", V_STR, NULL, R_ANY},
    {"interleaved_steps", V_OBJ, interleaved_fields, R_ANY}, {"cores", V_NUM, NULL, R_WHOLE1},
    {"decode_images_per_s_per_core", V_NUM, NULL, R_GE0}, {"decode_ceiling_images_per_s", V_NUM, NULL, R_GE0},
    {"images_per_s_at_cores", V_NUM, NULL, R_GE0}, {"share_of_decode_ceiling", V_NUM, NULL, R_GE0},
    {"best_workers", V_NUM, NULL, R_WHOLE}, {"best_prefetch", V_NUM, NULL, R_WHOLE},
    {"best_images_per_s", V_NUM, NULL, R_GE0}, {"torch_images_per_s", V_NUM, NULL, R_GE0},
    {"speedup_vs_torch", V_NUM, NULL, R_GE0}, {NULL, 0, NULL, R_ANY}};
static const vfield sweep_fields[] = {
    {"workers", V_NUM, NULL, R_WHOLE}, {"prefetch", V_NUM, NULL, R_WHOLE}, {"images_per_s", V_NUM, NULL, R_GE0},
    {"cpu_util", V_NUM, NULL, R_GE0}, {NULL, 0, NULL, R_ANY}};
static const vfield top_fields[] = {
    {"env", V_OBJ, env_fields, R_ANY}, {"run_scale", V_STR, NULL, R_ANY}, {"setting", V_STROBJ, NULL, R_ANY},
    {"rungs", V_OBJS, rung_fields, R_ANY}, {"sgemm_flops_per_s", V_NUM, NULL, R_GE0},
    {"sgemm_samples", V_NUMS, NULL, R_GE0}, {"interrupted", V_BOOL, NULL, R_ANY},
    {"case_metrics", V_OBJ, case_metrics_fields, R_ANY}, {"sweep", V_OBJS, sweep_fields, R_ANY},
    {NULL, 0, NULL, R_ANY}};

typedef struct {
  const vl_ladder *L;
  char *err;
  size_t errn;
} vcheck;

static int vbad(vcheck *v, const char *path, const char *what) {
  snprintf(v->err, v->errn, "%s: %s", path[0] ? path : "the top level", what);
  return -1;
}

/* path + ".key" (the key made printable: it comes from the file) */
static void path_key(char *out, size_t n, const char *path, const char *key) {
  char k[64];
  snprintf(out, n, "%s%s%s", path, path[0] ? "." : "", vl_rep_gp_str(key, true, k, sizeof k));
}

static bool is_num(const cJSON *x) {
  return cJSON_IsNull(x) || (cJSON_IsNumber(x) && isfinite(x->valuedouble));
}

/* A number (is_num) within r; null passes. */
static int check_range(vcheck *v, const cJSON *x, vrange r, const char *path) {
  static const double whole_max = 9007199254740992.0; /* 2^53 */
  if (cJSON_IsNull(x) || r == R_ANY) return 0;
  double d = x->valuedouble;
  const char *want = NULL;
  if (r == R_GE0 && !(d >= 0)) want = "a number >= 0";
  if (r == R_FRAC && !(d >= 0 && d <= 1)) want = "a fraction in [0, 1]";
  if (r == R_WHOLE && !(d >= 0 && d <= whole_max && d == floor(d))) want = "a whole number >= 0 (at most 2^53)";
  if (r == R_WHOLE1 && !(d >= 1 && d <= whole_max && d == floor(d))) want = "a whole number >= 1 (at most 2^53)";
  if (!want) return 0;
  char msg[96];
  snprintf(msg, sizeof msg, "expected %s, got %.17g", want, d);
  return vbad(v, path, msg);
}

static int check_obj(vcheck *v, const cJSON *o, const vfield *spec, const char *path, bool metrics);

static int check_value(vcheck *v, const cJSON *x, const vfield *f, const char *path) {
  char p[320];
  const cJSON *e;
  int i = 0;
  switch (f->t) {
    case V_NUM: return is_num(x) ? check_range(v, x, f->r, path) : vbad(v, path, "expected a number");
    case V_BOOL: return cJSON_IsBool(x) ? 0 : vbad(v, path, "expected true or false");
    case V_STR: return cJSON_IsString(x) && x->valuestring ? 0 : vbad(v, path, "expected a string");
    case V_OBJ:
      if (!cJSON_IsObject(x)) return vbad(v, path, "expected an object");
      return f->sub ? check_obj(v, x, f->sub, path, f->sub == plan_fields || f->sub == case_metrics_fields) : 0;
    case V_NUMOBJ:
    case V_STROBJ:
      if (!cJSON_IsObject(x)) return vbad(v, path, "expected an object");
      cJSON_ArrayForEach(e, x) {
        path_key(p, sizeof p, path, e->string);
        if (f->t == V_NUMOBJ && !is_num(e)) return vbad(v, p, "expected a number");
        if (f->t == V_NUMOBJ && check_range(v, e, f->r, p)) return -1;
        if (f->t == V_STROBJ && !cJSON_IsString(e)) return vbad(v, p, "expected a string");
      }
      return 0;
    case V_NUMS:
    case V_PAIRS:
    case V_OBJS:
      if (!cJSON_IsArray(x)) return vbad(v, path, "expected an array");
      cJSON_ArrayForEach(e, x) {
        snprintf(p, sizeof p, "%s[%d]", path, i++);
        if (f->t == V_NUMS && !is_num(e)) return vbad(v, p, "expected a number");
        if (f->t == V_NUMS && check_range(v, e, f->r, p)) return -1;
        if (f->t == V_PAIRS && !(cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                                 cJSON_IsNumber(e->child) && isfinite(e->child->valuedouble) &&
                                 cJSON_IsNumber(e->child->next) && isfinite(e->child->next->valuedouble)))
          return vbad(v, p, "expected an [x, y] pair of numbers");
        if (f->t == V_OBJS) {
          if (!cJSON_IsObject(e)) return vbad(v, p, "expected an object");
          if (f->sub && check_obj(v, e, f->sub, p, f->sub == run_fields)) return -1;
        }
      }
      return 0;
  }
  return 0;
}

/* Every member of o whose key the spec lists (matched as cJSON_GetObjectItem matches keys:
 * ignoring case, so a second "Name" cannot hide behind a checked "name"); with metrics, also
 * the members the claims read as metrics. */
static int check_obj(vcheck *v, const cJSON *o, const vfield *spec, const char *path, bool metrics) {
  static const vfield num = {"", V_NUM, NULL, R_ANY};
  const cJSON *e;
  char p[320];
  cJSON_ArrayForEach(e, o) {
    if (!e->string) continue;
    const vfield *f = NULL;
    for (const vfield *s = spec; s->key && !f; s++)
      if (!strcasecmp(s->key, e->string)) f = s;
    for (int i = 0; metrics && !f && i < v->L->n_claims; i++)
      if (!strcasecmp(v->L->claims[i].metric, e->string)) f = &num;
    if (!f) continue;
    path_key(p, sizeof p, path, e->string);
    if (check_value(v, e, f, p)) return -1;
  }
  return 0;
}

int vl_results_validate(const cJSON *res, const vl_case *c, const vl_ladder *L, char *err, size_t errn) {
  vcheck v = {L, err, errn};
  char msg[400], a[VL_REP_GP_MAX + 1], p[64];
  if (!cJSON_IsObject(res)) return vbad(&v, "", "expected an object");
  const cJSON *sv = cJSON_GetObjectItem(res, "schema_version");
  if (!cJSON_IsNumber(sv)) return vbad(&v, "schema_version", "expected a number");
  if (sv->valuedouble != VL_RESULTS_SCHEMA_VERSION) {
    snprintf(msg, sizeof msg, "%.17g is not the version this vramlab reads (%d)", sv->valuedouble,
             VL_RESULTS_SCHEMA_VERSION);
    return vbad(&v, "schema_version", msg);
  }
  const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(res, "case"));
  if (!id) return vbad(&v, "case", "expected a string");
  if (strcmp(id, c->id)) {
    snprintf(msg, sizeof msg, "these are results of '%s', not of '%s'", vl_rep_gp_str(id, false, a, sizeof a), c->id);
    return vbad(&v, "case", msg);
  }
  if (!cJSON_IsObject(cJSON_GetObjectItem(res, "env"))) return vbad(&v, "env", "expected an object");
  const cJSON *rungs = cJSON_GetObjectItem(res, "rungs");
  if (!cJSON_IsArray(rungs)) return vbad(&v, "rungs", "expected an array");
  if (!cJSON_GetArraySize(rungs)) return vbad(&v, "rungs", "no rung in this file");
  if (check_obj(&v, res, top_fields, "", false)) return -1;
  /* every rung names a rung of this case's ladder, once: claims and tables look rungs up by
   * name, and a foreign or repeated name would make them judge the wrong one */
  bool seen[VL_MAX_RUNGS] = {false};
  const cJSON *r;
  int i = 0;
  cJSON_ArrayForEach(r, rungs) {
    snprintf(p, sizeof p, "rungs[%d].name", i++);
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(r, "name"));
    if (!name) return vbad(&v, p, "expected a string");
    int k = vl_ladder_find(L, name);
    if (k < 0) {
      int o = snprintf(msg, sizeof msg, "'%s' is not a rung of %s (", vl_rep_gp_str(name, false, a, sizeof a), c->id);
      for (int j = 0; j < L->n_rungs && o > 0 && (size_t)o < sizeof msg; j++)
        o += snprintf(msg + o, sizeof msg - (size_t)o, "%s%s", j ? ", " : "", L->rungs[j].name);
      if (o > 0 && (size_t)o < sizeof msg) snprintf(msg + o, sizeof msg - (size_t)o, ")");
      return vbad(&v, p, msg);
    }
    if (seen[k]) {
      snprintf(msg, sizeof msg, "'%s' appears twice", L->rungs[k].name);
      return vbad(&v, p, msg);
    }
    seen[k] = true;
  }
  return 0;
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

static int write_script(const char *dir, const char *name, const char *script, char *why, size_t whyn) {
  if (!plot_name_ok(name)) { snprintf(why, whyn, "'%s' is not a plot name", name); return -1; }
  char path[1200], err[1400];
  if (snprintf(path, sizeof path, "%s/%s.gp", dir, name) >= (int)sizeof path) {
    snprintf(why, whyn, "the report folder's path is too long");
    return -1;
  }
  /* vl_png names the output: the report renders into a temp file, `gnuplot name.gp` by hand
   * into name.png */
  char *text = NULL;
  if (asprintf(&text, "# vramlab report: gnuplot %s.gp in this folder re-renders %s.png\n"
                      "if (!exists(\"vl_png\")) vl_png = '%s.png'\n%s", name, name, name, script) < 0) {
    snprintf(why, whyn, "out of memory");
    return -1;
  }
  int rc = vl_write_atomic(path, text, err, sizeof err);
  free(text);
  if (rc) snprintf(why, whyn, "cannot write %s.gp: %s", name, err);
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
static int render(const char *dir, const char *name, const char *log_shown, char *why, size_t whyn) {
  char tmp[128], final[1200], tmp_path[1200], log_path[1200], setvar[200], gp[100];
  char log_tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.png.tmp.%d", name, (int)getpid());
  snprintf(setvar, sizeof setvar, "vl_png = '%s'", tmp);
  snprintf(gp, sizeof gp, "%s.gp", name);
  snprintf(final, sizeof final, "%s/%s.png", dir, name);
  snprintf(tmp_path, sizeof tmp_path, "%s/%s", dir, tmp);
  snprintf(log_path, sizeof log_path, "%s/%s.gnuplot.log", dir, name);
  int log_fd;
  vl_err err;
  if (vl_file_tmp_beside(log_path, log_tmp, sizeof log_tmp, &log_fd, &err)) {
    snprintf(why, whyn, "gnuplot's log: %s", err.msg);
    return -1;
  }
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa)) {
    snprintf(why, whyn, "out of memory");
    close(log_fd);
    unlink(log_tmp);
    return -1;
  }
  posix_spawn_file_actions_addchdir_np(&fa, dir);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
  char *argv[] = {"gnuplot", "-e", setvar, gp, NULL};
  pid_t pid;
  int e = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ), st = 0;
  posix_spawn_file_actions_destroy(&fa);
  if (e) {
    snprintf(why, whyn, "cannot start gnuplot: %s", strerror(e));
    close(log_fd);
    unlink(log_tmp);
    return -1;
  }
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) { st = -1; break; }
  int rc = -1;
  if (st == -1) snprintf(why, whyn, "lost track of gnuplot: %s", strerror(errno));
  else if (WIFSIGNALED(st)) snprintf(why, whyn, "gnuplot was killed by signal %d (see %s)", WTERMSIG(st), log_shown);
  else if (WEXITSTATUS(st) == 127) snprintf(why, whyn, "gnuplot could not be started (see %s)", log_shown);
  else if (WEXITSTATUS(st)) snprintf(why, whyn, "gnuplot failed with status %d (see %s)", WEXITSTATUS(st), log_shown);
  else if (!png_whole(tmp_path)) snprintf(why, whyn, "gnuplot wrote an incomplete PNG (a full disk?)");
  else if (rename(tmp_path, final)) snprintf(why, whyn, "rename to %s.png: %s", name, strerror(errno));
  else rc = 0;
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

int vl_rep_gnuplot(const char *dir, const char *name, const char *script, char *why, size_t whyn) {
  char log_shown[1200];
  snprintf(log_shown, sizeof log_shown, "%s/%s.gnuplot.log", dir, name);
  return write_script(dir, name, script, why, whyn) ? -1 : render(dir, name, log_shown, why, whyn);
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
  char why[1600] = "", log_shown[256];
  snprintf(log_shown, sizeof log_shown, "`%s/%s.gnuplot.log`", case_id, name);
  int rc = write_script(dir, name, script, why, sizeof why);
  if (!rc && !gnuplot) { /* the report says once that nothing is rendered */
    char png[1200];
    snprintf(png, sizeof png, "%s/%s.png", dir, name);
    unlink(png);
    return -1;
  }
  if (!rc) rc = render(dir, name, log_shown, why, sizeof why);
  if (rc) vl_rep_plot_missing(md, dir, name, why);
  else fprintf(md, "![%s](%s/%s.png)\n\n", alt, case_id, name);
  return rc;
}

int vl_rep_dat_open(vl_rep_dat *d) {
  d->buf = NULL;
  d->len = 0;
  d->f = open_memstream(&d->buf, &d->len);
  return d->f ? 0 : -1;
}

int vl_rep_dat_commit(vl_rep_dat *d, const char *dir, const char *name, char *why, size_t whyn) {
  bool ok = d->f && !ferror(d->f);
  if (d->f && fclose(d->f)) ok = false;
  d->f = NULL;
  char path[1200], err[1400];
  int rc = -1;
  if (!ok || !d->buf) snprintf(why, whyn, "cannot build %s: out of memory", name);
  else if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
    snprintf(why, whyn, "the report folder's path is too long");
  else if (vl_write_atomic(path, d->buf, err, sizeof err)) snprintf(why, whyn, "cannot write %s: %s", name, err);
  else rc = 0;
  free(d->buf);
  d->buf = NULL;
  return rc;
}

/* ---- where the time goes (--profile) ------------------------------------------------------- */
/* A rung's profile: its runs' tables summed by operation name (repetitions add up), so each
 * value per step is a total over every profiled step divided by their number. */
#define PROF_TOP 12     /* rows shown; the rest are summed into one row */
#define PROF_OPS_MAX 64 /* distinct names kept (the engine has ~35); more from a file are summed */
typedef struct {
  const char *op;     /* the name as in the file (a key, never printed) */
  const cJSON *entry; /* its first entry: printed through vl_rep_str */
  double calls, seconds, flops;
} prof_row;
typedef struct {
  prof_row row[PROF_OPS_MAX];
  int n, runs;
  prof_row rest; /* names past PROF_OPS_MAX */
  double steps, seconds, other;
} prof_sum;

/* 0 where the file has null: a missing part of a sum is left out, not a poisoned total */
static double prof_val(const cJSON *o, const char *k) {
  double v = vl_rep_num(o, k);
  return isnan(v) ? 0 : v;
}

/* Sums the profiled runs of a rung into *p; false when none carries a profile. */
static bool prof_sum_rung(const cJSON *rung, prof_sum *p) {
  memset(p, 0, sizeof *p);
  const cJSON *run, *e;
  cJSON_ArrayForEach(run, cJSON_GetObjectItem(rung, "runs")) {
    const cJSON *prof = cJSON_GetObjectItem(run, "profile");
    if (!cJSON_IsArray(prof)) continue;
    p->runs++;
    p->steps += prof_val(run, "profile_steps");
    p->seconds += prof_val(run, "profile_seconds");
    p->other += prof_val(run, "profile_other_seconds");
    cJSON_ArrayForEach(e, prof) {
      const char *op = cJSON_GetStringValue(cJSON_GetObjectItem(e, "op"));
      if (!op) op = "";
      prof_row *r = NULL;
      for (int i = 0; i < p->n && !r; i++)
        if (!strcmp(p->row[i].op, op)) r = &p->row[i];
      if (!r && p->n < PROF_OPS_MAX) {
        r = &p->row[p->n++];
        r->op = op;
        r->entry = e;
      }
      if (!r) r = &p->rest;
      r->calls += prof_val(e, "calls");
      r->seconds += prof_val(e, "seconds");
      r->flops += prof_val(e, "flops");
    }
  }
  /* slowest first */
  for (int i = 1; i < p->n; i++)
    for (int j = i; j > 0 && p->row[j - 1].seconds < p->row[j].seconds; j--) {
      prof_row t = p->row[j];
      p->row[j] = p->row[j - 1];
      p->row[j - 1] = t;
    }
  return p->runs > 0;
}

/* About three significant digits without an exponent (ms from 0.001 to 10^5, GFLOP/s) */
static const char *fmt_sig(double v) {
  return vl_rep_fmt(!isfinite(v) || fabs(v) >= 100 ? "%.0f" : fabs(v) >= 1 ? "%.1f" : "%.3f", v);
}

/* GFLOP/s of flops in seconds: "—" for an operation that counts no FLOPs (a copy) */
static double prof_gflops(double flops, double seconds) {
  return flops > 0 && seconds > 0 ? flops / seconds / 1e9 : NAN;
}

static void prof_table(FILE *md, const cJSON *rung, const prof_sum *p) {
  double steps = p->steps > 0 ? p->steps : NAN, total = p->seconds > 0 ? p->seconds : NAN;
  fprintf(md, "### `%s` — %s\n\n", vl_rep_str(rung, "name"), vl_rep_str(rung, "label"));
  fprintf(md, "%s timed steps (%d run%s), %s ms per step profiled.\n\n", vl_rep_fmt("%.0f", p->steps), p->runs,
          p->runs == 1 ? "" : "s", fmt_sig(1e3 * total / steps));
  fprintf(md, "| operation | calls per step | ms per step | share of the step | GFLOP/s |\n|---|---|---|---|---|\n");
  prof_row more = p->rest, all = p->rest;
  int n_more = p->rest.calls > 0 ? 1 : 0; /* names past PROF_OPS_MAX: at least one */
  for (int i = 0; i < p->n; i++) {
    const prof_row *r = &p->row[i];
    all.calls += r->calls;
    all.seconds += r->seconds;
    all.flops += r->flops;
    if (i >= PROF_TOP) {
      more.calls += r->calls;
      more.seconds += r->seconds;
      more.flops += r->flops;
      n_more++;
      continue;
    }
    fprintf(md, "| %s | %s | %s | %s | %s |\n", vl_rep_str(r->entry, "op"), vl_rep_fmt("%.0f", r->calls / steps),
            fmt_sig(1e3 * r->seconds / steps), vl_rep_fmt("%.1f%%", 100 * r->seconds / total),
            fmt_sig(prof_gflops(r->flops, r->seconds)));
  }
  if (n_more)
    fprintf(md, "| %d more operation%s | %s | %s | %s | %s |\n", n_more, n_more == 1 ? "" : "s",
            vl_rep_fmt("%.0f", more.calls / steps), fmt_sig(1e3 * more.seconds / steps),
            vl_rep_fmt("%.1f%%", 100 * more.seconds / total), fmt_sig(prof_gflops(more.flops, more.seconds)));
  fprintf(md, "| other: inside no operation (the model's glue, allocation, sync) | — | %s | %s | — |\n",
          fmt_sig(1e3 * p->other / steps), vl_rep_fmt("%.1f%%", 100 * p->other / total));
  fprintf(md, "| **the whole step** | %s | %s | 100%% | %s |\n\n", vl_rep_fmt("%.0f", all.calls / steps),
          fmt_sig(1e3 * total / steps), fmt_sig(prof_gflops(all.flops, total)));
}

/* After the case's own sections, for any case whose runs carry a profile: the first
 * profiled rung and the last (every one when there are at most three). */
static void profile_section(FILE *md, const cJSON *res) {
  const cJSON *rung, *with[VL_MAX_RUNGS];
  int n = 0;
  prof_sum *p = malloc(sizeof *p);
  if (!p) return;
  cJSON_ArrayForEach(rung, cJSON_GetObjectItem(res, "rungs"))
    if (n < VL_MAX_RUNGS && prof_sum_rung(rung, p)) with[n++] = rung;
  if (n) {
    fprintf(md, "## Where the time goes (--profile)\n\n"
                "Every operation of the timed steps, timed on the host clock around its kernel with a "
                "device sync before and after it (on a GPU: the kernel's own time, not its launch), "
                "summed over the timed steps of every repetition; warm-up steps are left out. The syncs "
                "make profiled steps a little slower than the unprofiled timings above. GFLOP/s count "
                "recomputed FLOPs (checkpointing) too, unlike the model FLOP/s above; — marks an operation "
                "that counts no FLOPs (copies, conversions, optimizer updates, as in the model FLOPs). "
                "The full table is in `results.json`.\n\n");
    for (int i = 0; i < n; i++) {
      if (n > 3 && i > 0 && i < n - 1) continue;
      prof_sum_rung(with[i], p);
      prof_table(md, with[i], p);
    }
    if (n > 3) {
      fprintf(md, "Also profiled (in `results.json`):");
      for (int i = 1; i < n - 1; i++) fprintf(md, "%s `%s`", i > 1 ? "," : "", vl_rep_str(with[i], "name"));
      fprintf(md, ".\n\n");
    }
  }
  free(p);
}

/* ---- the report --------------------------------------------------------------------------- */
static int report_fail(char *err, size_t errn, cJSON *res, char *text, const char *fmt, const char *a,
                       const char *b) {
  snprintf(err, errn, fmt, a, b);
  cJSON_Delete(res);
  free(text);
  return -1;
}

/* A claim's verdict as the report judges it (a claim needing another device than the
 * results' is not measurable). */
static vl_verdict judge_claim(const vl_case *c, const vl_ladder *L, cJSON *res, const vl_claim *cl, double *b,
                              double *a, bool *other_device) {
  const char *dev = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "env"), "device"));
  *b = metric(c, L, res, cl->before, cl->before_set, cl->metric);
  *a = metric(c, L, res, cl->after, cl->after_set, cl->metric);
  vl_verdict v = vl_judge(cl, *b, *a);
  *other_device = cl->needs[0] && (!dev || strcmp(dev, cl->needs));
  return *other_device ? VL_NOT_MEASURABLE : v;
}

void vl_report_verdicts(const vl_case *c, const vl_ladder *L, cJSON *res, int counts[4]) {
  memset(counts, 0, 4 * sizeof *counts);
  for (int i = 0; i < L->n_claims; i++) {
    double b, a;
    bool other;
    counts[judge_claim(c, L, res, &L->claims[i], &b, &a, &other)]++;
  }
}

int vl_report_write(const vl_case *c, const vl_ladder *L, const char *results_path,
                    const char *md_path, char *err, size_t errn) {
  size_t n = 0;
  char rerr[1200], verr[600];
  if (errn) err[0] = 0;
  errno = 0;
  char *text = vl_read_file_max(results_path, VL_RESULTS_MAX_BYTES, &n, rerr, sizeof rerr);
  if (!text && errno == ENOENT)
    return report_fail(err, errn, NULL, NULL, "cannot read %s (run `vramlab run %s` first)", results_path, c->id);
  if (!text) return report_fail(err, errn, NULL, NULL, "cannot read %s%s", rerr, "");
  if (memchr(text, 0, n))
    return report_fail(err, errn, NULL, text, "%s holds a NUL byte: not a vramlab results file%s",
                       results_path, "");
  /* the whole file is one JSON value: trailing bytes mean it was cut or glued together */
  cJSON *res = cJSON_ParseWithOpts(text, NULL, 1);
  if (!res)
    return report_fail(err, errn, NULL, text, "%s is not a vramlab results file (truncated or corrupt?)%s",
                       results_path, "");
  if (vl_results_validate(res, c, L, verr, sizeof verr))
    return report_fail(err, errn, res, text, "%s is not a results file `vramlab report` can read: %s",
                       results_path, verr);
  /* The report's own folder keeps the results it was made from, so it stands on its own. */
  char dir[1024], copy[1100];
  const char *slash = strrchr(md_path, '/');
  int dn = slash ? snprintf(dir, sizeof dir, "%.*s/%s", (int)(slash - md_path), md_path, c->id)
                 : snprintf(dir, sizeof dir, "%s", c->id);
  if (dn < 0 || (size_t)dn >= sizeof dir || snprintf(copy, sizeof copy, "%s/results.json", dir) >= (int)sizeof copy)
    return report_fail(err, errn, res, text, "the report path %s is too long%s", md_path, "");
  if (vl_mkdir_p(dir)) return report_fail(err, errn, res, text, "cannot create %s: %s", dir, strerror(errno));
  int wrc = vl_write_atomic(copy, text, err, errn);
  free(text);
  if (wrc) {
    cJSON_Delete(res);
    return -1;
  }
  char *buf = NULL;
  size_t blen = 0;
  FILE *md = open_memstream(&buf, &blen);
  if (!md) return report_fail(err, errn, res, NULL, "cannot build the report: %s%s", strerror(errno), "");
  cJSON *env = cJSON_GetObjectItem(res, "env");
  const char *scale = vl_rep_str(res, "run_scale");
  fprintf(md, "# %s — %s\n\n", c->id, vl_knob_get(&L->setting, "title") ? vl_knob_get(&L->setting, "title") : c->summary);
  fprintf(md, "_Generated by `vramlab report %s` from `%s` (copied to `%s/results.json`). Device: %s; "
              "CPU: %s (%s cores); GPU: %s; commit %s; %s._\n\n",
          c->id, results_path, c->id, vl_rep_str(env, "device"), vl_rep_str(env, "cpu"),
          vl_rep_fmt("%g", vl_rep_num(env, "cores")), vl_rep_str(env, "gpu"), vl_rep_str(env, "git_commit"),
          vl_rep_str(env, "time"));
  if (cJSON_IsTrue(cJSON_GetObjectItem(res, "interrupted")))
    fprintf(md, "**This run was interrupted: the tables hold what finished.**\n\n");
  fprintf(md, "## Setting\n\n");
  if (c->method) fprintf(md, "%s\n\n", c->method);
  fprintf(md, "Runs were measured at the **`%s` scale on `%s`**; timings are compared only as ratios "
              "within this run.\n\n",
          scale, vl_rep_str(env, "device"));
  fprintf(md, "Case settings:");
  for (int i = 0; i < L->setting.n; i++) fprintf(md, " `%s=%s`", L->setting.k[i].key, L->setting.k[i].val);
  fprintf(md, "\n\n");

  fprintf(md, "## Claims\n\n| claim | source | article before → after | measured before → after | verdict | note |\n|---|---|---|---|---|---|\n");
  int counts[4] = {0}, n_missing = 0;
  bool interrupted = cJSON_IsTrue(cJSON_GetObjectItem(res, "interrupted"));
  char *miss = NULL;
  size_t miss_len = 0;
  FILE *missf = open_memstream(&miss, &miss_len);
  for (int i = 0; i < L->n_claims; i++) {
    const vl_claim *cl = &L->claims[i];
    double b, a;
    bool other_device;
    vl_verdict v = judge_claim(c, L, res, cl, &b, &a, &other_device);
    counts[v]++;
    /* An interrupted run judges nothing it did not measure: say which claim lost what. */
    const char *vname = vl_verdict_name(v);
    if (interrupted && v == VL_NOT_MEASURABLE && !other_device) {
      vname = "not measured: run interrupted";
      if (missf) fprintf(missf, "%s`%s` (%s)", n_missing ? ", " : "", cl->metric, cl->id);
      n_missing++;
    }
    char x1[32], x2[32], y1[32], y2[32];
    if (!strcmp(cl->kind, "range"))
      fprintf(md, "| %s | %s | %g–%g | %s (rung %s) | **%s** | %s |\n", cl->text, cl->source, cl->lo,
              cl->hi, fmt_val(a, cl->unit, y2, sizeof y2), cl->after, vname, cl->note);
    else if (!strcmp(cl->kind, "ratio_range"))
      fprintf(md, "| %s | %s | ×%g–%g | %s (%s → %s) | **%s** | %s |\n", cl->text, cl->source, cl->lo,
              cl->hi, fmt_ratio(a / b, y1, sizeof y1), cl->before, cl->after, vname, cl->note);
    else if (!strcmp(cl->kind, "ratio"))
      fprintf(md, "| %s | %s | %s | %s (%s → %s) | **%s** | %s |\n", cl->text, cl->source,
              fmt_ratio(cl->article_after / cl->article_before, x1, sizeof x1), fmt_ratio(a / b, y1, sizeof y1),
              cl->before, cl->after, vname, cl->note);
    else
      fprintf(md, "| %s | %s | %s → %s | %s → %s | **%s** | %s |\n", cl->text, cl->source,
              fmt_val(cl->article_before, cl->unit, x1, sizeof x1), fmt_val(cl->article_after, cl->unit, x2, sizeof x2),
              fmt_val(b, cl->unit, y1, sizeof y1), fmt_val(a, cl->unit, y2, sizeof y2), vname, cl->note);
  }
  fprintf(md, "\n%d hold, %d hold in direction only, %d do not hold, %d not measurable here.\n\n",
          counts[0], counts[1], counts[2], counts[3]);
  if (missf) fclose(missf);
  if (n_missing)
    fprintf(md, "**Missing because the run was interrupted** (%d claim%s not judged): %s.\n\n", n_missing,
            n_missing == 1 ? "" : "s", miss ? miss : "");
  free(miss);

  bool gp = vl_rep_have_gnuplot();
  if (c->report) c->report(res, md, dir, c->id, gp);
  if (!gp) {
    const char *off = getenv("VRAMLAB_NO_GNUPLOT");
    if (off && off[0] && strcmp(off, "0"))
      fprintf(md, "Plots are missing: rendering is off (VRAMLAB_NO_GNUPLOT); the gnuplot scripts and data are "
                  "in `%s/`.\n\n", c->id);
    else
      fprintf(md, "Plots are missing: gnuplot is not installed (`apt-get install gnuplot-nox`).\n\n");
  }
  profile_section(md, res);
  bool ok = !ferror(md);
  if (fclose(md)) ok = false;
  cJSON_Delete(res);
  int rc = -1;
  if (!ok || !buf) snprintf(err, errn, "cannot build the report: out of memory");
  else rc = vl_write_atomic(md_path, buf, err, errn);
  free(buf);
  return rc;
}

/* ---- shared plot data -------------------------------------------------------------------- */

/* NaN where a value is missing: gnuplot leaves it out, where a 0 would plot a wrong bar. */
static void dat_num(FILE *f, const char *fmt, double v) {
  if (isfinite(v)) fprintf(f, fmt, v);
  else fputs(" NaN", f);
}

int vl_rep_write_pairs(const char *dir, const char *name, const cJSON *pairs, char *why, size_t whyn) {
  vl_rep_dat d;
  if (vl_rep_dat_open(&d)) { snprintf(why, whyn, "cannot build %s: out of memory", name); return -1; }
  const cJSON *pt;
  if (cJSON_IsArray(pairs))
    cJSON_ArrayForEach(pt, pairs) {
      double x = cJSON_GetArraySize(pt) == 2 ? vl_rep_numv(cJSON_GetArrayItem(pt, 0)) : NAN;
      double y = cJSON_GetArraySize(pt) == 2 ? vl_rep_numv(cJSON_GetArrayItem(pt, 1)) : NAN;
      if (cJSON_IsArray(pt) && !isnan(x) && !isnan(y)) fprintf(d.f, "%g %.4f\n", x, y / 1e9);
    }
  return vl_rep_dat_commit(&d, dir, name, why, whyn);
}

int vl_rep_mem_by_category(const cJSON *res, const char *dir, const char *title, char *script, size_t n,
                           char *why, size_t whyn) {
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
  if (!ncat) { snprintf(why, whyn, "the results hold no plan memory by category"); return -1; }
  vl_rep_dat d;
  if (vl_rep_dat_open(&d)) { snprintf(why, whyn, "cannot build mem_by_category.dat: out of memory"); return -1; }
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
  if (vl_rep_dat_commit(&d, dir, "mem_by_category.dat", why, whyn)) return -1;
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
  if (sn < 0 || (size_t)sn >= n) {
    snprintf(why, whyn, "the mem_by_category script does not fit its buffer");
    return -1;
  }
  return 0;
}
