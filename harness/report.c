/* reports/<case>.md: setting, claims with verdicts, ladder tables, the profile section; the
 * case's own sections through its report hook (they use the kit's helpers, kit/rep.c).
 * Results files are shared between users, so everything read from one is untrusted: it is
 * validated before anything is written, every string that reaches a gnuplot script or data
 * file goes through vl_rep_gp_str, and every artifact is written whole or not at all. */
#define _GNU_SOURCE
#include "report.h"

#include <ctype.h>
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
    case VL_INCONCLUSIVE: return "inconclusive (within noise)";
    case VL_DOES_NOT_HOLD: return "does not hold";
    case VL_BY_CONSTRUCTION: return "by construction";
    default: return "not measurable here";
  }
}

/* ---- the judge ------------------------------------------------------------------------------ */
/* The magnitude band of "direction holds": the measured change over the claimed one. */
#define BAND_LO 0.25
#define BAND_HI 2.0

static int sgn(double x) { return (x > 0) - (x < 0); }

/* Whether x passes the claim's own test, for the measured pair (b, a). */
static bool hold_test(const vl_claim *c, double b, double a) {
  if (!strcmp(c->kind, "ratio_range")) return b != 0 && a / b >= c->lo && a / b <= c->hi;
  if (!strcmp(c->kind, "range")) return a >= c->lo && a <= c->hi;
  double ab = c->article_before, aa = c->article_after;
  if (!strcmp(c->kind, "ratio")) {
    double ar = aa / ab;
    return b != 0 && fabs(a / b - ar) <= c->tol * fabs(ar);
  }
  /* value: both ends against the article's (without an article "before", the "after" only);
   * tolerance relative, absolute where the article says 0 */
  bool after_ok = fabs(a - aa) <= (aa != 0 ? c->tol * fabs(aa) : c->tol) + 1e-12;
  bool before_ok = isnan(ab) || fabs(b - ab) <= (ab != 0 ? c->tol * fabs(ab) : c->tol) + 1e-12;
  return after_ok && before_ok;
}

static bool overlaps(double lo1, double hi1, double lo2, double hi2) { return lo1 <= hi2 && lo2 <= hi1; }

/* Whether some pair inside the spread (before in [blo, bhi], after in [alo, ahi]) passes the
 * claim's test: the claim is reachable within the noise. */
static bool reachable(const vl_claim *c, double blo, double bhi, double alo, double ahi) {
  if (!strcmp(c->kind, "range")) return overlaps(alo, ahi, c->lo, c->hi);
  if (!strcmp(c->kind, "ratio_range") || !strcmp(c->kind, "ratio")) {
    if (!(blo > 0)) /* a ratio over a spread that reaches 0: its corners only */
      return hold_test(c, bhi, alo) || hold_test(c, blo, ahi) || hold_test(c, blo, alo) || hold_test(c, bhi, ahi);
    double rl = (alo >= 0 ? alo / bhi : alo / blo), rh = (ahi >= 0 ? ahi / blo : ahi / bhi);
    if (!strcmp(c->kind, "ratio_range")) return overlaps(rl, rh, c->lo, c->hi);
    double ar = c->article_after / c->article_before, t = c->tol * fabs(ar);
    return overlaps(rl, rh, ar - t, ar + t);
  }
  double aa = c->article_after, ab = c->article_before;
  double ta = (aa != 0 ? c->tol * fabs(aa) : c->tol) + 1e-12, tb = (ab != 0 ? c->tol * fabs(ab) : c->tol) + 1e-12;
  return overlaps(alo, ahi, aa - ta, aa + ta) && (isnan(ab) || overlaps(blo, bhi, ab - tb, ab + tb));
}

/* A change from x to y: log(y/x) when both are > 0, else y - x; *lin tells which. */
static double change(double x, double y, bool *lin) {
  if (x > 0 && y > 0) return log(y / x);
  *lin = true;
  return y - x;
}

/* The change the claim claims, on the scale change() uses for the measured one (0: it claims
 * none; NaN: it claims a value, not a change). */
static double claimed(const vl_claim *c, double b, bool *lin) {
  if (!strcmp(c->kind, "ratio")) return change(c->article_before, c->article_after, lin);
  if (!strcmp(c->kind, "ratio_range")) {
    if (c->lo <= 1 && c->hi >= 1) return 0;
    return c->lo > 0 ? log(sqrt(c->lo * c->hi)) : NAN;
  }
  if (!strcmp(c->kind, "range")) {
    /* a range reached from a "before" rung: the change to the middle of the range */
    if (!c->before[0] || isnan(b)) return NAN;
    if (b >= c->lo && b <= c->hi) return 0;
    double mid = c->lo > 0 ? sqrt(c->lo * c->hi) : 0.5 * (c->lo + c->hi);
    return change(b, mid, lin);
  }
  if (isnan(c->article_before)) return NAN;
  return change(c->article_before, c->article_after, lin);
}

vl_judgement vl_judge_ev(const vl_claim *c, const vl_evidence *ev) {
  double b = ev->before, a = ev->after;
  /* judged on its "after" alone: a range, or a value without the article's "before", with no
   * "before" rung */
  bool other = !c->before[0] && (!strcmp(c->kind, "range") || (!strcmp(c->kind, "value") && isnan(c->article_before)));
  if (!strcmp(c->kind, "none")) return (vl_judgement){VL_NOT_MEASURABLE, ""};
  if (isnan(a) || (!other && isnan(b)) || (!strcmp(c->kind, "ratio_range") && b == 0) ||
      (!strcmp(c->kind, "ratio") && (b == 0 || c->article_before == 0)))
    return (vl_judgement){VL_NOT_MEASURABLE, ""};
  /* the spread: the measured pair's extremes (exact ends have none) */
  bool noisy = !isnan(ev->a_lo) || !isnan(ev->b_lo);
  double alo = isnan(ev->a_lo) ? a : ev->a_lo, ahi = isnan(ev->a_hi) ? a : ev->a_hi;
  double blo = isnan(ev->b_lo) ? b : ev->b_lo, bhi = isnan(ev->b_hi) ? b : ev->b_hi;
  bool lin = false, lin_c = false;
  double cl = claimed(c, b, &lin_c);
  double m = other ? NAN : change(b, a, &lin);
  if (lin != lin_c && !isnan(m) && !isnan(cl) && cl != 0) { /* one scale for both: linear */
    lin = true;
    m = a - b;
    cl = !strcmp(c->kind, "range") ? 0.5 * (c->lo + c->hi) - b : c->article_after - c->article_before;
  }
  vl_judgement j = {VL_DOES_NOT_HOLD, ""};
  if (noisy && !other && !isnan(cl) && cl != 0) {
    /* a claimed change whose measured counterpart could be no change at all */
    bool lin2 = false;
    double lo = change(bhi, alo, &lin2), hi = change(blo, ahi, &lin2);
    if (lo <= 0 && hi >= 0) j = (vl_judgement){VL_INCONCLUSIVE, "the change is inside the spread of the runs"};
  }
  if (j.v != VL_INCONCLUSIVE) {
    if (hold_test(c, b, a))
      j = (vl_judgement){VL_HOLDS, ""};
    else if (noisy && reachable(c, blo, bhi, alo, ahi))
      j = (vl_judgement){VL_INCONCLUSIVE, "the claim is inside the spread of the runs"};
    else if (isnan(cl) || isnan(m))
      j = (vl_judgement){VL_DOES_NOT_HOLD, ""};
    else if (cl == 0)
      j = (vl_judgement){VL_DOES_NOT_HOLD, "a change where the claim has none"};
    else if (m == 0)
      j = (vl_judgement){VL_DOES_NOT_HOLD, "no change"};
    else if (sgn(m) != sgn(cl))
      j = (vl_judgement){VL_DOES_NOT_HOLD, "the opposite direction"};
    else if (m / cl < BAND_LO)
      j = (vl_judgement){VL_DOES_NOT_HOLD, "much smaller than claimed (under a quarter of it)"};
    else if (m / cl > BAND_HI)
      j = (vl_judgement){VL_DOES_NOT_HOLD, "far beyond the claim (over twice it)"};
    else
      j = (vl_judgement){VL_DIRECTION_HOLDS, ""};
  }
  if (c->basis == VL_BASIS_CONFIGURED && (j.v == VL_HOLDS || j.v == VL_DIRECTION_HOLDS))
    j = (vl_judgement){VL_BY_CONSTRUCTION, "the number echoes a setting"};
  return j;
}

vl_verdict vl_judge(const vl_claim *c, double before, double after) {
  vl_evidence ev = {before, after, NAN, NAN, NAN, NAN};
  return vl_judge_ev(c, &ev).v;
}

/* ---- metric lookup ------------------------------------------------------------------------ */
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

/* One end of a claim: its value, the spread of the runs it comes from ([lo, hi]: NaN when
 * exact), and where it was found. */
typedef struct {
  double v, lo, hi;
  int runs;      /* runs that measured it (0: a plan or a side plan) */
  bool planned;  /* read from a plan */
} end_val;

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of a rung's runs and their min and max. */
static end_val run_end(const cJSON *rung, const char *m) {
  end_val e = {NAN, NAN, NAN, 0, false};
  double x[64];
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(rung, "runs")) {
    double v = vl_rep_num(r, m);
    if (!isnan(v) && e.runs < 64) x[e.runs++] = v;
  }
  if (!e.runs) return e;
  qsort(x, (size_t)e.runs, sizeof *x, cmp_dbl);
  e.v = e.runs % 2 ? x[e.runs / 2] : 0.5 * (x[e.runs / 2 - 1] + x[e.runs / 2]);
  e.lo = x[0];
  e.hi = x[e.runs - 1];
  return e;
}

static end_val metric_end(const vl_case *c, const vl_ladder *L, cJSON *res, const char *rung, const char *set,
                          const char *m) {
  end_val e = {NAN, NAN, NAN, 0, false};
  if (!rung[0]) return e;
  if (set && set[0]) {
    /* a side plan: the rung varied by `set` */
    int i = vl_ladder_find(L, rung);
    if (i < 0) return e;
    vl_knobs k = L->rungs[i].knobs;
    if (vl_knobs_apply_list(&k, set, NULL)) return e;
    e.v = vl_rep_num(side_plan(c, L, &k), m);
    e.planned = true;
    return e;
  }
  const cJSON *r = vl_rep_rung(res, rung);
  if (!r) return e;
  e.v = vl_rep_num(cJSON_GetObjectItem(r, "plan"), m);
  if (!isnan(e.v)) {
    e.planned = true;
    return e;
  }
  e = run_end(r, m);
  if (!isnan(e.v)) return e;
  /* case-wide measurements (a sweep's best setting, a ceiling) stand for every rung */
  e.v = vl_rep_num(cJSON_GetObjectItem(res, "case_metrics"), m);
  e.runs = isnan(e.v) ? 0 : 1;
  e.lo = e.hi = e.v;
  return e;
}

/* The spread a claim judges with: the runs' min and max, widened to the claim's floor, or
 * to VL_NOISE_ONE_RUN for a value of one run; none for an exact or planned value. */
static void spread(const vl_claim *cl, end_val *e) {
  if (e->planned || cl->noise_exact || isnan(e->v) || e->runs == 0) {
    e->lo = e->hi = NAN;
    return;
  }
  double f = cl->noise_floor > 0 ? cl->noise_floor : e->runs < 2 ? VL_NOISE_ONE_RUN : 0;
  double a = fabs(e->v) * f;
  if (e->v - a < e->lo) e->lo = e->v - a;
  if (e->v + a > e->hi) e->hi = e->v + a;
}

static const char *fmt_val(double v, const char *unit, char *b, size_t n) {
  if (!isfinite(v)) snprintf(b, n, "—");
  else if (!strcmp(unit, "bytes")) snprintf(b, n, "%.2f GB", v / 1e9);
  else if (!strcmp(unit, "share")) /* 99.91% is not 100% */
    snprintf(b, n, fabs(100 * v - round(100 * v)) < 0.05 || v < 0.1 ? "%.0f%%" : "%.1f%%", 100 * v);
  else if (!strcmp(unit, "count")) snprintf(b, n, "%.0f", v);
  else snprintf(b, n, "%.3g", v);
  return b;
}

static const char *fmt_ratio(double r, char *b, size_t n) {
  if (!isfinite(r)) snprintf(b, n, "—");
  else snprintf(b, n, "×%.3g", r);
  return b;
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
    {"batch_curve_live", V_PAIRS, NULL, R_ANY},
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
  vl_err *e;
} vcheck;

static int vbad(vcheck *v, const char *path, const char *what) {
  vl_err_set(v->e, VL_ERR_INVALID, "%s: %s", path[0] ? path : "the top level", what);
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

static int validate(const cJSON *res, const vl_case *c, const vl_ladder *L, vl_err *e) {
  vcheck v = {L, e};
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

vl_status vl_results_validate(const cJSON *res, const vl_case *c, const vl_ladder *L, vl_err *e) {
  return validate(res, c, L, e) ? VL_ERR_INVALID : VL_OK;
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
static vl_status report_fail(vl_err *e, vl_status s, cJSON *res, char *text, const char *fmt, const char *a,
                             const char *b) {
  vl_err_set(e, s, fmt, a, b);
  cJSON_Delete(res);
  free(text);
  return s;
}

/* A claim as the report judges it: the two ends with their spread and the verdict (a claim
 * needing another device than the results' is not measurable). */
typedef struct {
  end_val b, a;
  vl_judgement j;
  bool other_device;
} judged;

static judged judge_claim(const vl_case *c, const vl_ladder *L, cJSON *res, const vl_claim *cl) {
  judged r = {{NAN, NAN, NAN, 0, false}, {NAN, NAN, NAN, 0, false}, {VL_NOT_MEASURABLE, ""}, false};
  if (!strcmp(cl->kind, "none")) return r;
  const char *dev = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "env"), "device"));
  r.b = metric_end(c, L, res, cl->before, cl->before_set, cl->metric);
  r.a = metric_end(c, L, res, cl->after, cl->after_set, cl->metric);
  spread(cl, &r.b);
  spread(cl, &r.a);
  vl_evidence ev = {r.b.v, r.a.v, r.b.lo, r.b.hi, r.a.lo, r.a.hi};
  r.j = vl_judge_ev(cl, &ev);
  r.other_device = cl->needs[0] && (!dev || strcmp(dev, cl->needs));
  if (r.other_device) r.j = (vl_judgement){VL_NOT_MEASURABLE, ""};
  return r;
}

/* A hold that rests on a model or a named stand-in, tallied apart from planned and measured. */
static bool rests_on_model(const vl_claim *cl) { return cl->basis == VL_BASIS_MODELED || cl->qualifier[0]; }

static void tally_add(vl_tally *t, const vl_claim *cl, vl_verdict v) {
  if (cl->shown_with[0]) return; /* a second number of another claim's row */
  if (cl->suite) {
    t->suite[v]++;
    return;
  }
  t->article[v]++;
  if (rests_on_model(cl)) t->on_model[v]++;
}

void vl_report_verdicts(const vl_case *c, const vl_ladder *L, cJSON *res, vl_tally *t) {
  memset(t, 0, sizeof *t);
  for (int i = 0; i < L->n_claims; i++) tally_add(t, &L->claims[i], judge_claim(c, L, res, &L->claims[i]).j.v);
}

/* ---- the claims tables ----------------------------------------------------------------------- */
/* "holds", "holds (modeled)", "holds on CPU ranks", "not measurable here: <reason>" */
static const char *verdict_text(const vl_claim *cl, const judged *r, bool interrupted, char *b, size_t n) {
  vl_verdict v = r->j.v;
  if (v == VL_NOT_MEASURABLE && cl->reason[0]) snprintf(b, n, "not measurable here: %s", cl->reason);
  else if (v == VL_NOT_MEASURABLE && r->other_device) snprintf(b, n, "not measurable here: needs %s", cl->needs);
  else if (v == VL_NOT_MEASURABLE && interrupted) snprintf(b, n, "not measured: run interrupted");
  else if ((v == VL_HOLDS || v == VL_DIRECTION_HOLDS) && cl->qualifier[0])
    snprintf(b, n, "%s %s", vl_verdict_name(v), cl->qualifier);
  else if ((v == VL_HOLDS || v == VL_DIRECTION_HOLDS) && cl->basis == VL_BASIS_MODELED)
    snprintf(b, n, "%s (modeled)", vl_verdict_name(v));
  else snprintf(b, n, "%s", vl_verdict_name(v));
  return b;
}

/* A value with its spread: "1.23 (1.20–1.25, 3 runs)"; a planned or exact one alone. */
static const char *fmt_end(const end_val *e, const char *unit, char *b, size_t n) {
  char v[32], lo[32], hi[32];
  fmt_val(e->v, unit, v, sizeof v);
  if (isnan(e->lo) || !isfinite(e->v)) snprintf(b, n, "%s", v);
  else if (e->runs < 2) snprintf(b, n, "%s (1 run)", v);
  else snprintf(b, n, "%s (%s–%s, %d runs)", v, fmt_val(e->lo, unit, lo, sizeof lo), fmt_val(e->hi, unit, hi, sizeof hi),
                e->runs);
  return b;
}

/* The suite's numbers of a claim: "B → A", "×r (b → a)" with the ratio's spread, "A (rung)". */
static void suite_cell(FILE *md, const vl_claim *cl, const judged *r) {
  char x[96], y[96], q[32], lo[32], hi[32];
  if (!strcmp(cl->kind, "none")) {
    fprintf(md, "—");
    return;
  }
  if (!strcmp(cl->kind, "ratio_range") || !strcmp(cl->kind, "ratio")) {
    fprintf(md, "%s (`%s` → `%s`)", fmt_ratio(r->a.v / r->b.v, q, sizeof q), cl->before, cl->after);
    if (!isnan(r->a.lo) || !isnan(r->b.lo)) {
      double alo = isnan(r->a.lo) ? r->a.v : r->a.lo, ahi = isnan(r->a.hi) ? r->a.v : r->a.hi;
      double blo = isnan(r->b.lo) ? r->b.v : r->b.lo, bhi = isnan(r->b.hi) ? r->b.v : r->b.hi;
      int runs = r->a.runs < r->b.runs ? r->a.runs : r->b.runs;
      fprintf(md, ", spread %s–%s (%s)", fmt_ratio(alo / bhi, lo, sizeof lo), fmt_ratio(ahi / blo, hi, sizeof hi),
              runs < 2 ? "1 run: ±5% assumed" : "min–max of the runs");
    }
    return;
  }
  if (!strcmp(cl->kind, "range") && !cl->before[0]) {
    fprintf(md, "%s (`%s`)", fmt_end(&r->a, cl->unit, y, sizeof y), cl->after);
    return;
  }
  fprintf(md, "%s → %s", fmt_end(&r->b, cl->unit, x, sizeof x), fmt_end(&r->a, cl->unit, y, sizeof y));
}

static void article_cell(FILE *md, const vl_claim *cl) {
  char x1[32], x2[32];
  if (!strcmp(cl->kind, "none")) fprintf(md, "—");
  else if (!strcmp(cl->kind, "range") && cl->lo == cl->hi) fprintf(md, "%s", fmt_val(cl->lo, cl->unit, x1, sizeof x1));
  else if (!strcmp(cl->kind, "range"))
    fprintf(md, "%s–%s", fmt_val(cl->lo, cl->unit, x1, sizeof x1), fmt_val(cl->hi, cl->unit, x2, sizeof x2));
  else if (!strcmp(cl->kind, "ratio_range")) fprintf(md, "×%g–%g", cl->lo, cl->hi);
  else if (!strcmp(cl->kind, "ratio"))
    fprintf(md, "%s", fmt_ratio(cl->article_after / cl->article_before, x1, sizeof x1));
  else if (isnan(cl->article_before)) fprintf(md, "%s", fmt_val(cl->article_after, cl->unit, x2, sizeof x2));
  else
    fprintf(md, "%s → %s", fmt_val(cl->article_before, cl->unit, x1, sizeof x1),
            fmt_val(cl->article_after, cl->unit, x2, sizeof x2));
}

static void tol_cell(FILE *md, const vl_claim *cl) {
  if (!strcmp(cl->kind, "none")) fprintf(md, "—");
  else if (!strcmp(cl->kind, "range") || !strcmp(cl->kind, "ratio_range")) fprintf(md, "the range");
  else if (!strcmp(cl->kind, "value") && cl->article_after == 0) fprintf(md, "±%g", cl->tol);
  else fprintf(md, "±%g%%", 100 * cl->tol);
  if (cl->noise_exact) fprintf(md, "; exact");
  else if (cl->noise_floor > 0) fprintf(md, "; noise ≥ %g%%", 100 * cl->noise_floor);
}

static void basis_cell(FILE *md, const vl_claim *cl) {
  fprintf(md, "%s", vl_basis_name(cl->basis));
  if (cl->qualifier[0]) fprintf(md, " (stand-in)");
}

/* One row; the claims shown with it (shown_with) add their numbers to its suite cell. */
static void claim_row(FILE *md, const vl_case *c, const vl_ladder *L, cJSON *res, int i, bool interrupted,
                      vl_tally *t, FILE *missf, int *n_missing) {
  const vl_claim *cl = &L->claims[i];
  judged r = judge_claim(c, L, res, cl);
  tally_add(t, cl, r.j.v);
  if (interrupted && r.j.v == VL_NOT_MEASURABLE && !r.other_device && strcmp(cl->kind, "none")) {
    if (missf) fprintf(missf, "%s`%s` (%s)", *n_missing ? ", " : "", cl->metric, cl->id);
    ++*n_missing;
  }
  char vb[320];
  fprintf(md, "| `%s` | %s | %s | ", cl->id, cl->text, cl->source);
  article_cell(md, cl);
  fprintf(md, " | ");
  suite_cell(md, cl, &r);
  for (int k = 0; k < L->n_claims; k++) {
    const vl_claim *o = &L->claims[k];
    if (strcmp(o->shown_with, cl->id)) continue;
    judged ro = judge_claim(c, L, res, o);
    fprintf(md, "; %s: ", vl_basis_name(o->basis));
    suite_cell(md, o, &ro);
    fprintf(md, " (%s, not counted)", verdict_text(o, &ro, interrupted, vb, sizeof vb));
  }
  fprintf(md, " | ");
  basis_cell(md, cl);
  fprintf(md, " | ");
  tol_cell(md, cl);
  fprintf(md, " | **%s** | ", verdict_text(cl, &r, interrupted, vb, sizeof vb));
  const char *sep = "";
  if (r.j.why[0]) { fprintf(md, "%s", r.j.why); sep = "; "; }
  if (cl->assumption[0]) { fprintf(md, "%s%s: %s", sep, cl->basis == VL_BASIS_MODELED ? "model" : "stands for", cl->assumption); sep = "; "; }
  if (cl->note[0]) fprintf(md, "%s%s", sep, cl->note);
  fprintf(md, " |\n");
}

static const char *const TABLE_HEAD =
    "| id | claim | source | article | this suite, before → after | basis | tolerance | verdict | note |\n"
    "|---|---|---|---|---|---|---|---|---|\n";

/* "000: 24" per article of [_report] articles, with the claims of this report from each */
static void article_counts(FILE *md, const vl_ladder *L, const vl_tally *t) {
  int in_report = 0, judged_n = t->article[VL_HOLDS] + t->article[VL_DIRECTION_HOLDS] +
                                t->article[VL_INCONCLUSIVE] + t->article[VL_DOES_NOT_HOLD];
  for (int v = 0; v < VL_N_VERDICTS; v++) in_report += t->article[v];
  fprintf(md, "Article claims about this case:");
  const char *p = L->articles;
  int total = 0;
  bool any = false;
  while (*p) {
    char id[16];
    int cnt, used = 0;
    if (sscanf(p, " %15[^: ]:%d%n", id, &cnt, &used) != 2) break;
    int here = 0;
    for (int i = 0; i < L->n_claims; i++)
      if (!L->claims[i].suite && !L->claims[i].shown_with[0] && !strncmp(L->claims[i].source, id, strlen(id)))
        here++;
    fprintf(md, "%s article %s: %d checkable, %d in this report", any ? ";" : "", id, cnt, here);
    total += cnt;
    any = true;
    p += used;
  }
  if (!any) fprintf(md, " (per-article counts not given)");
  fprintf(md, ". In all: %d in this report, %d judged (holds, direction, inconclusive or does not hold).\n\n",
          in_report, judged_n);
  (void)total;
}

/* "5 hold (2 on a model or a stand-in), 4 direction holds, ..." */
static void tally_line(FILE *md, const int *k, const int *on_model) {
  fprintf(md, "%d hold", k[VL_HOLDS]);
  if (on_model && on_model[VL_HOLDS]) fprintf(md, " (%d on a model or a stand-in)", on_model[VL_HOLDS]);
  fprintf(md, ", %d direction holds", k[VL_DIRECTION_HOLDS]);
  if (on_model && on_model[VL_DIRECTION_HOLDS])
    fprintf(md, " (%d on a model or a stand-in)", on_model[VL_DIRECTION_HOLDS]);
  fprintf(md, ", %d inconclusive (within noise), %d do not hold, %d by construction, %d not measurable here",
          k[VL_INCONCLUSIVE], k[VL_DOES_NOT_HOLD], k[VL_BY_CONSTRUCTION], k[VL_NOT_MEASURABLE]);
}

static const char *const LEGEND =
    "Verdicts: **holds** inside the claim's tolerance or range; **direction holds** the claimed direction "
    "at ¼ to 2× the claimed change (log scale), beyond that band **does not hold**; **inconclusive** the "
    "change is inside the spread of the runs (min–max of the repetitions; ±5% for a one-run value); "
    "**by construction** the number echoes a setting and is never counted a hold. Numbers: planned "
    "(exact, full scale), measured (this machine, run scale), modeled (assumption named), configured.";

/* The first screen: where it ran, the findings (claims with a finding, by rank), the tally
 * and the legend. */
static void first_screen(FILE *md, const vl_case *c, const vl_ladder *L, cJSON *res, const cJSON *env) {
  const char *dev = vl_rep_str(env, "device");
  char where[sizeof L->where];
  snprintf(where, sizeof where, "%s", L->where[0] ? L->where : dev);
  where[0] = (char)toupper((unsigned char)where[0]);
  fprintf(md, "**Where it ran:** %s (this machine: %s, %s cores, device `%s`; run scale `%s`).\n\n", where,
          vl_rep_str(env, "cpu"), vl_rep_fmt("%g", vl_rep_num(env, "cores")), dev, vl_rep_str(res, "run_scale"));
  int order[VL_MAX_CLAIMS], n = 0;
  for (int rank = 1; rank <= 99 && n < 5; rank++)
    for (int i = 0; i < L->n_claims && n < 5; i++)
      if (L->claims[i].rank == rank && L->claims[i].finding[0]) order[n++] = i;
  if (n) fprintf(md, "**Findings:**\n");
  for (int k = 0; k < n; k++) {
    const vl_claim *cl = &L->claims[order[k]];
    judged r = judge_claim(c, L, res, cl);
    char vb[320], x[32];
    fprintf(md, "- ");
    for (const char *p = cl->finding; *p; p++) {
      if (!strncmp(p, "{before}", 8)) { fprintf(md, "%s", fmt_val(r.b.v, cl->unit, x, sizeof x)); p += 7; }
      else if (!strncmp(p, "{after}", 7)) { fprintf(md, "%s", fmt_val(r.a.v, cl->unit, x, sizeof x)); p += 6; }
      else if (!strncmp(p, "{ratio}", 7)) { fprintf(md, "%s", fmt_ratio(r.a.v / r.b.v, x, sizeof x)); p += 6; }
      else fputc(*p, md);
    }
    fprintf(md, " (`%s`: **%s**)\n", cl->id, verdict_text(cl, &r, false, vb, sizeof vb));
  }
  vl_tally t;
  vl_report_verdicts(c, L, res, &t);
  fprintf(md, "%s**Article claims:** ", n ? "\n" : "");
  tally_line(md, t.article, t.on_model);
  fprintf(md, ".  \n%s\n\n", LEGEND);
}

vl_status vl_report_write(const vl_case *c, const vl_ladder *L, const char *results_path,
                          const char *md_path, vl_err *e) {
  size_t n = 0;
  vl_err rerr, verr;
  if (e) e->msg[0] = 0;
  errno = 0;
  char *text = vl_read_file_max(results_path, VL_RESULTS_MAX_BYTES, &n, &rerr);
  if (!text && errno == ENOENT)
    return report_fail(e, VL_ERR_IO, NULL, NULL, "cannot read %s (run `vramlab run %s` first)", results_path, c->id);
  if (!text) return report_fail(e, VL_ERR_IO, NULL, NULL, "cannot read %s%s", rerr.msg, "");
  if (memchr(text, 0, n))
    return report_fail(e, VL_ERR_INVALID, NULL, text, "%s holds a NUL byte: not a vramlab results file%s",
                       results_path, "");
  /* the whole file is one JSON value: trailing bytes mean it was cut or glued together */
  cJSON *res = cJSON_ParseWithOpts(text, NULL, 1);
  if (!res)
    return report_fail(e, VL_ERR_INVALID, NULL, text, "%s is not a vramlab results file (truncated or corrupt?)%s",
                       results_path, "");
  if (vl_results_validate(res, c, L, &verr))
    return report_fail(e, VL_ERR_INVALID, res, text, "%s is not a results file `vramlab report` can read: %s",
                       results_path, verr.msg);
  /* The report's own folder keeps the results it was made from, so it stands on its own. */
  char dir[1024], copy[1100];
  const char *slash = strrchr(md_path, '/');
  int dn = slash ? snprintf(dir, sizeof dir, "%.*s/%s", (int)(slash - md_path), md_path, c->id)
                 : snprintf(dir, sizeof dir, "%s", c->id);
  if (dn < 0 || (size_t)dn >= sizeof dir || snprintf(copy, sizeof copy, "%s/results.json", dir) >= (int)sizeof copy)
    return report_fail(e, VL_ERR_INVALID, res, text, "the report path %s is too long%s", md_path, "");
  if (vl_mkdir_p(dir)) return report_fail(e, VL_ERR_IO, res, text, "cannot create %s: %s", dir, strerror(errno));
  vl_status wrc = vl_write_atomic(copy, text, e);
  free(text);
  if (wrc) {
    cJSON_Delete(res);
    return wrc;
  }
  char *buf = NULL;
  size_t blen = 0;
  FILE *md = open_memstream(&buf, &blen);
  if (!md) return report_fail(e, VL_ERR_OOM, res, NULL, "cannot build the report: %s%s", strerror(errno), "");
  cJSON *env = cJSON_GetObjectItem(res, "env");
  const char *scale = vl_rep_str(res, "run_scale");
  fprintf(md, "# %s — %s\n\n", c->id, vl_knob_get(&L->setting, "title") ? vl_knob_get(&L->setting, "title") : c->summary);
  first_screen(md, c, L, res, env);
  fprintf(md, "_Generated by `vramlab report %s` from `%s` (copied to `%s/results.json`). Device: %s; "
              "CPU: %s (%s cores); GPU: %s; commit %s; %s._\n\n",
          c->id, results_path, c->id, vl_rep_str(env, "device"), vl_rep_str(env, "cpu"),
          vl_rep_fmt("%g", vl_rep_num(env, "cores")), vl_rep_str(env, "gpu"), vl_rep_str(env, "git_commit"),
          vl_rep_str(env, "time"));
  bool interrupted = cJSON_IsTrue(cJSON_GetObjectItem(res, "interrupted"));
  if (interrupted) fprintf(md, "**This run was interrupted: the tables hold what finished.**\n\n");
  fprintf(md, "## Setting\n\n");
  if (c->method) fprintf(md, "%s\n\n", c->method);
  fprintf(md, "Runs were measured at the **`%s` scale on `%s`**; timings are compared only as ratios "
              "within this run.\n\n",
          scale, vl_rep_str(env, "device"));
  fprintf(md, "Case settings:");
  for (int i = 0; i < L->setting.n; i++) fprintf(md, " `%s=%s`", L->setting.k[i].key, L->setting.k[i].val);
  fprintf(md, "\n\n");

  vl_tally t;
  memset(&t, 0, sizeof t);
  int n_missing = 0;
  char *miss = NULL;
  size_t miss_len = 0;
  FILE *missf = open_memstream(&miss, &miss_len);
  fprintf(md, "## Claims of the articles\n\n%s", TABLE_HEAD);
  for (int i = 0; i < L->n_claims; i++)
    if (!L->claims[i].suite && !L->claims[i].shown_with[0]) claim_row(md, c, L, res, i, interrupted, &t, missf, &n_missing);
  fprintf(md, "\n");
  tally_line(md, t.article, t.on_model);
  fprintf(md, ".\n\n");
  article_counts(md, L, &t);
  int n_suite = 0;
  for (int i = 0; i < L->n_claims; i++) n_suite += L->claims[i].suite && !L->claims[i].shown_with[0];
  if (n_suite) {
    fprintf(md, "## Suite checks\n\nChecks of this suite's own implementation that no article states; not "
                "counted as article claims.\n\n%s", TABLE_HEAD);
    for (int i = 0; i < L->n_claims; i++)
      if (L->claims[i].suite && !L->claims[i].shown_with[0]) claim_row(md, c, L, res, i, interrupted, &t, missf, &n_missing);
    fprintf(md, "\n");
    tally_line(md, t.suite, NULL);
    fprintf(md, ".\n\n");
  }
  if (missf) fclose(missf);
  if (n_missing)
    fprintf(md, "**Missing because the run was interrupted** (%d claim%s not judged): %s.\n\n", n_missing,
            n_missing == 1 ? "" : "s", miss ? miss : "");
  free(miss);

  bool gp = vl_rep_have_gnuplot();
  char *app = NULL;
  size_t app_len = 0;
  FILE *appf = open_memstream(&app, &app_len);
  if (c->report) c->report(res, md, appf ? appf : md, dir, c->id, gp);
  if (!gp) {
    const char *off = getenv("VRAMLAB_NO_GNUPLOT");
    if (off && off[0] && strcmp(off, "0"))
      fprintf(md, "Plots are missing: rendering is off (VRAMLAB_NO_GNUPLOT); the gnuplot scripts and data are "
                  "in `%s/`.\n\n", c->id);
    else
      fprintf(md, "Plots are missing: gnuplot is not installed (`apt-get install gnuplot-nox`).\n\n");
  }
  profile_section(md, res);
  bool app_ok = appf && !ferror(appf);
  if (appf && fclose(appf)) app_ok = false;
  if (app_ok && app && app_len)
    fprintf(md, "## Appendix: the engine's own validation\n\nHow far this suite's engine can be trusted: its plan "
                "against its measured memory, against PyTorch, its collectives. Not evidence for or against "
                "any article claim.\n\n%s", app);
  free(app);
  bool ok = !ferror(md) && (app_ok || !appf);
  if (fclose(md)) ok = false;
  cJSON_Delete(res);
  vl_status rc = !ok || !buf ? vl_err_set(e, VL_ERR_OOM, "cannot build the report: out of memory")
                             : vl_write_atomic(md_path, buf, e);
  free(buf);
  return rc;
}
