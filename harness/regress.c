/* `vramlab regress [--update]`: plan every rung of every case at full scale (exact numbers),
 * run one fixed short rung of every case a few times, interleaved across the cases (seeded
 * losses, the measured peak, step times), and compare it all with the baseline of this
 * device class (regress.h says how each metric is judged). */
#include "regress.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ladder.h"
#include "registry.h"
#include "index.h"
#include "kit/interrupt.h"
#include "kit/util.h"
#include "sgemm.h"
#include "vramlab/backend.h"

/* ---- the fixed configuration ---------------------------------------------------------- */
typedef enum { M_EXACT, M_TOL, M_TIME, M_RATE } metric_kind; /* rate: per second, inverted */
/* What a measured number depends on beyond the engine's code (exact and tol metrics): the
 * keys of vl_cpu_blas_key / vl_cpu_conv_key. Timings instead name their calibration. */
enum { DEP_BLAS = 1, DEP_CONV = 2 };
typedef struct {
  const char *key; /* a key of the run's JSON: a number, a bool, a number array, or a
                      {median} object (step_time) */
  metric_kind kind;
  double tol;
  bool cpu_only; /* the measured peak equals the plan on the CPU; a GPU adds its own */
  int deps;      /* DEP_*: exact where these kernels are the baseline's */
  double xtol;   /* tol metrics: the tolerance where they are not */
  const char *calib; /* time metrics: "sgemm" (compute-bound steps) or "copy" (loaders: a
                        stand-in, JPEG decoding is neither GEMM nor copy) */
} run_metric;

typedef struct {
  const char *case_id, *rung, *scale;
  const char *sets[8]; /* "@DATA@" is the data folder */
  run_metric m[6];
} run_cfg;

/* Losses: the same seeded step on the same machine agrees to ~1e-15 run to run (OpenMP's
 * reduction order in the loss sum); 1e-4 relative leaves room for a BLAS that splits a GEMM
 * differently at another thread count, not for a changed model. With another convolution or
 * sgemm kernel (another host of the same class: oneDNN picks by ISA and cache sizes) the
 * trajectory drifts: seg-ckpt's third loss moved 7e-4 relative and its accuracy 0.003 on
 * such a host, so the cross-kernel tolerances are 1e-2 and 2e-2, and its measured peak
 * (oneDNN's scratchpad) is compared only where the convolutions are the baseline's. Planned
 * = measured holds on every host. */
static const run_cfg RUNS[] = {
    {"llm-lora", "lora", "small", {"steps=4", "warmup=1", "seq=128", NULL},
     {{"step_time", M_TIME, 0, false, 0, 0, "sgemm"},
      {"loss", M_TOL, 1e-4, false, DEP_BLAS, 1e-2, NULL},
      {"measured_peak_bytes", M_EXACT, 0, true, 0, 0, NULL},
      {"plan_matches_measured", M_EXACT, 0, true, 0, 0, NULL}}},
    {"seg-ckpt", "ckpt", "tiny", {"train_images=24", "eval_images=8", "epochs=1", "data_dir=@DATA@", NULL},
     {{"step_time", M_TIME, 0, false, 0, 0, "sgemm"},
      {"loss", M_TOL, 1e-4, false, DEP_BLAS | DEP_CONV, 1e-2, NULL},
      {"measured_peak_bytes", M_EXACT, 0, true, DEP_CONV, 0, NULL},
      {"plan_matches_measured", M_EXACT, 0, true, 0, 0, NULL},
      {"pixel_accuracy", M_TOL, 1e-3, false, DEP_BLAS | DEP_CONV, 2e-2, NULL}}},
    {"sd-lora", "before", "tiny",
     {"steps=3", "data_dir=@DATA@/captions", "cache_dir=@DATA@/sd-cache", NULL},
     /* its step is the modeled accelerator's (a fixed wait): only the loading is timed */
     {{"load_s_per_batch", M_TIME, 0, false, 0, 0, "copy"}, {"images_per_s", M_RATE, 0, false, 0, 0, "copy"}}},
    {"dataloader", "workers", "tiny", {"consumer_ms=1", "data_dir=@DATA@", NULL},
     {{"images_per_s", M_RATE, 0, false, 0, 0, "copy"}, {"load_s_per_batch", M_TIME, 0, false, 0, 0, "copy"}}},
};
#define N_RUNS (int)(sizeof RUNS / sizeof *RUNS)

/* Plan keys compared exactly for every rung (those a case writes). */
static const char *const PLAN_KEYS[] = {"params_total", "params_trainable", "batch", "peak_bytes", "flops_per_step",
                                        "flops_recompute", "max_batch", "fits", NULL};

/* ---- device class --------------------------------------------------------------------- */
static void slug(const char *s, char *out, size_t n) {
  size_t k = 0;
  bool dash = false;
  for (; *s && k + 1 < n; s++) {
    char ch = *s;
    if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
    if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9')) {
      if (dash && k) out[k++] = '-';
      if (k + 1 < n) out[k++] = ch;
      dash = false;
    } else {
      dash = true;
    }
  }
  out[k] = 0;
}

void vl_regress_device_class(const char *device, const char *cpu, int cores, const char *gpu, char *out,
                             size_t n) {
  char s[160];
  if (!strcmp(device, "cuda")) {
    /* nvidia-smi's "name, driver": the name only */
    char g[160];
    snprintf(g, sizeof g, "%s", gpu ? gpu : "unknown");
    char *comma = strchr(g, ',');
    if (comma) *comma = 0;
    slug(g, s, sizeof s);
    snprintf(out, n, "cuda-%s", s[0] ? s : "unknown");
  } else {
    slug(cpu && cpu[0] ? cpu : "unknown", s, sizeof s);
    snprintf(out, n, "cpu-%s-%dc", s, cores);
  }
}

/* ---- validation --------------------------------------------------------------------------
 * A baseline (or a --now file) is read only after it is checked as results files are: every
 * field a comparison reads has its type and a sane range, no key appears twice, and a
 * failure names the path. A metric that could not be compared would otherwise read "ok". */
#define FAILV(...) (vl_err_set(err, VL_ERR_INVALID, __VA_ARGS__), -1)

static double num(const cJSON *o, const char *k) { return cJSON_GetNumberValue(cJSON_GetObjectItem(o, k)); }

static const char *type_name(const cJSON *v) {
  if (!v) return "nothing";
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  return "an object";
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A key of o that appears twice (cJSON keeps both), NULL when none; sorted, so a hostile
 * baseline with a million keys costs n log n, not n^2. "(no memory)" when the check cannot
 * be made. */
static const char *dup_key(const cJSON *o) {
  int n = cJSON_GetArraySize(o), k = 0;
  if (n < 2) return NULL;
  const char **names = malloc((size_t)n * sizeof *names);
  if (!names) return "(no memory)";
  for (const cJSON *a = o->child; a; a = a->next) names[k++] = a->string ? a->string : "";
  qsort(names, (size_t)k, sizeof *names, cmp_str);
  const char *d = NULL;
  for (int i = 1; i < k && !d; i++)
    if (!strcmp(names[i - 1], names[i])) d = names[i];
  free(names);
  return d;
}

static int want_object(const cJSON *v, const char *path, vl_err *err) {
  if (!cJSON_IsObject(v)) return FAILV("%s: expected an object, got %s", path, type_name(v));
  const char *d = dup_key(v);
  if (d) return FAILV("%s: the key \"%.80s\" appears twice", path, d);
  return 0;
}

/* A finite number in [lo, hi]. */
static int want_num(const cJSON *o, const char *key, double lo, double hi, const char *path, vl_err *err) {
  const cJSON *v = cJSON_GetObjectItem(o, key);
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return FAILV("%s.%s: expected a finite number, got %s", path, key, type_name(v));
  if (v->valuedouble < lo || v->valuedouble > hi)
    return FAILV("%s.%s: %.6g is outside [%g, %g]", path, key, v->valuedouble, lo, hi);
  return 0;
}

static int check_metric(const cJSON *m, const char *path, vl_err *err) {
  if (want_object(m, path, err)) return -1;
  const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(m, "kind"));
  const cJSON *impl = cJSON_GetObjectItem(m, "impl");
  if (impl && !cJSON_IsString(impl)) return FAILV("%s.impl: expected a string, got %s", path, type_name(impl));
  if (!kind) return FAILV("%s.kind: expected \"exact\", \"tol\" or \"time\"", path);
  if (!strcmp(kind, "exact")) return want_num(m, "value", -1e300, 1e300, path, err);
  if (!strcmp(kind, "tol")) {
    if (want_num(m, "value", -1e300, 1e300, path, err) || want_num(m, "tol", 0, 0.1, path, err))
      return -1;
    if (cJSON_GetObjectItem(m, "xtol") && want_num(m, "xtol", 0, 0.5, path, err)) return -1;
    return 0;
  }
  if (!strcmp(kind, "time")) {
    /* seconds: a step or a batch, more than a nanosecond and less than an hour */
    if (want_num(m, "median", 1e-9, 3600, path, err) || want_num(m, "min", 1e-9, 3600, path, err))
      return -1;
    if (num(m, "min") > num(m, "median"))
      return FAILV("%s: min %.6g is above the median %.6g", path, num(m, "min"), num(m, "median"));
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(m, "calib"));
    if (!c || (strcmp(c, "sgemm") && strcmp(c, "copy") && strcmp(c, "none")))
      return FAILV("%s.calib: expected \"sgemm\", \"copy\" or \"none\" (the calibration it is judged against)",
                   path);
    return 0;
  }
  return FAILV("%s.kind: \"%.40s\" is not \"exact\", \"tol\" or \"time\"", path, kind);
}

static int check_doc(const cJSON *doc, vl_err *err) {
  if (want_object(doc, "(top level)", err)) return -1;
  const cJSON *ver = cJSON_GetObjectItem(doc, "version");
  if (!cJSON_IsNumber(ver) || ver->valuedouble != VL_REGRESS_VERSION)
    return FAILV("version: expected %d, got %s (made by another vramlab: rerun with --update)", VL_REGRESS_VERSION,
                 cJSON_IsNumber(ver) ? "another number" : type_name(ver));
  const char *cls = cJSON_GetStringValue(cJSON_GetObjectItem(doc, "device_class"));
  if (!cls || !*cls) return FAILV("device_class: expected a non-empty string");
  const cJSON *cal = cJSON_GetObjectItem(doc, "calibration");
  if (want_object(cal, "calibration", err) ||
      want_num(cal, "sgemm_flops", 1e6, 1e18, "calibration", err) ||
      want_num(cal, "copy_bytes_per_s", 1e6, 1e15, "calibration", err))
    return -1;
  const cJSON *ms = cJSON_GetObjectItem(doc, "metrics");
  if (want_object(ms, "metrics", err)) return -1;
  if (!ms->child) return FAILV("metrics: empty (nothing to compare)");
  for (const cJSON *m = ms->child; m; m = m->next) {
    char path[240];
    snprintf(path, sizeof path, "metrics[\"%.200s\"]", m->string ? m->string : "");
    if (check_metric(m, path, err)) return -1;
  }
  return 0;
}

vl_status vl_regress_validate(const cJSON *doc, vl_err *e) { return check_doc(doc, e) ? VL_ERR_INVALID : VL_OK; }

/* ---- comparison ------------------------------------------------------------------------ */

static const char *str(const cJSON *o, const char *k) {
  const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(o, k));
  return s ? s : "";
}

static void fmt_val(const cJSON *m, char *buf, size_t n) {
  if (!m) { snprintf(buf, n, "-"); return; }
  if (!strcmp(str(m, "kind"), "time")) snprintf(buf, n, "%.4g s (min %.4g)", num(m, "median"), num(m, "min"));
  else snprintf(buf, n, "%.10g", num(m, "value"));
}

/* How much faster this host runs the calibration a time metric is judged against than the
 * baseline's host did (now rate / baseline rate); NAN when either is missing. A difference
 * within VL_REGRESS_CALIB_NOISE is the calibration's own noise (the same quiet host reads
 * ±12% run to run): 1, so the same host compares its raw times. "none" (a GPU's steps: the
 * device class is the GPU, and the host's sgemm says nothing of it): 1. */
static double host_speed(const cJSON *base, const cJSON *now, const char *calib) {
  if (!strcmp(calib, "none")) return 1;
  const char *k = !strcmp(calib, "copy") ? "copy_bytes_per_s" : "sgemm_flops";
  double b = num(cJSON_GetObjectItem(base, "calibration"), k), n = num(cJSON_GetObjectItem(now, "calibration"), k);
  double q = isfinite(b) && isfinite(n) && b > 0 && n > 0 ? n / b : NAN;
  return q >= 1 / VL_REGRESS_CALIB_NOISE && q <= VL_REGRESS_CALIB_NOISE ? 1 : q;
}

typedef enum { V_OK, V_REGRESSED, V_FASTER, V_INCOMPARABLE } verdict_kind;

/* One time metric: the now times scaled to the baseline host's speed (a host half as fast
 * takes twice as long for the same code), then the median-and-min rule. */
static verdict_kind judge_time(const cJSON *b, const cJSON *n, double speed, double thr, char *ns, size_t nsn,
                               char *ch, size_t chn, const char **verdict) {
  if (!(speed >= 1.0 / VL_REGRESS_CALIB_BAND && speed <= VL_REGRESS_CALIB_BAND)) {
    snprintf(ns + strlen(ns), nsn - strlen(ns), "; host ×%.2f", speed);
    *verdict = "not judged (this host's speed is outside the band the baseline speaks for)";
    return V_INCOMPARABLE;
  }
  double bmed = num(b, "median"), bmin = num(b, "min"), nmed = num(n, "median") * speed, nmin = num(n, "min") * speed;
  snprintf(ns + strlen(ns), nsn - strlen(ns), "; host ×%.2f", speed);
  snprintf(ch, chn, "%+.1f%%", 100 * (nmed / bmed - 1));
  if (nmed > bmed * (1 + thr) && nmin > bmin * (1 + thr)) {
    *verdict = "REGRESSION (slower)";
    return V_REGRESSED;
  }
  if (nmed < bmed * (1 - thr) && nmin < bmin * (1 - thr)) {
    *verdict = "faster";
    return V_FASTER;
  }
  *verdict = "ok";
  return V_OK;
}

/* One exact or tol metric: exact where the kernels it depends on are the baseline's; with
 * another kernel, an exact number is not compared and a tol number gets its cross-kernel
 * tolerance. On a GPU the kernels are picked at run time (cuDNN's and cuBLAS's heuristics,
 * algorithms that accumulate with atomics: seg-ckpt's pixel accuracy moved 0.0018 between
 * two H200 runs of one build): such a number ("runtime_kernels") is never "the baseline's
 * kernels". */
static verdict_kind judge_value(const cJSON *b, const cJSON *n, char *ch, size_t chn, const char **verdict) {
  bool tol = !strcmp(str(b, "kind"), "tol");
  bool other = strcmp(str(b, "impl"), str(n, "impl")) != 0 ||
               cJSON_IsTrue(cJSON_GetObjectItem(b, "runtime_kernels")) ||
               cJSON_IsTrue(cJSON_GetObjectItem(n, "runtime_kernels"));
  double bv = num(b, "value"), nv = num(n, "value"), d = nv - bv;
  if (d != 0) snprintf(ch, chn, "%+.6g", d);
  if (other && !tol) {
    *verdict = "not compared (other kernels)";
    return V_INCOMPARABLE;
  }
  double t = !tol ? 0 : other && cJSON_IsNumber(cJSON_GetObjectItem(b, "xtol")) ? num(b, "xtol") : num(b, "tol");
  if (fabs(d) <= t * fmax(1.0, fabs(bv))) {
    *verdict = other ? "ok (other kernels, within the cross-kernel tolerance)"
             : d != 0 ? "ok (within its tolerance, not exact)" : "ok (exact)";
    return V_OK;
  }
  *verdict = other ? "REGRESSION (changed beyond the cross-kernel tolerance)" : "REGRESSION (changed)";
  return V_REGRESSED;
}

void vl_regress_compare(const cJSON *base, const cJSON *now, double threshold, vl_regress_rows rows, FILE *out,
                        vl_regress_counts *counts) {
  int hidden = 0, hidden_tol = 0;
  memset(counts, 0, sizeof *counts);
  const cJSON *bm = cJSON_GetObjectItem(base, "metrics"), *nm = cJSON_GetObjectItem(now, "metrics");
  if (out) fprintf(out, "| metric | baseline | now | change | verdict |\n|---|---|---|---|---|\n");
  const cJSON *b;
  cJSON_ArrayForEach(b, bm) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(nm, b->string);
    char bs[64], ns[96], ch[48] = "";
    const char *verdict = "ok";
    fmt_val(b, bs, sizeof bs);
    fmt_val(n, ns, sizeof ns);
    verdict_kind v;
    if (!n) {
      verdict = "REGRESSION (missing)";
      counts->missing++;
      v = V_REGRESSED;
    } else if (check_metric(n, "now", NULL) || check_metric(b, "baseline", NULL) ||
               strcmp(str(b, "kind"), str(n, "kind"))) {
      verdict = "REGRESSION (cannot be compared)"; /* never an "ok" for what was not compared */
      v = V_REGRESSED;
    } else if (!strcmp(str(b, "kind"), "time")) {
      v = judge_time(b, n, host_speed(base, now, str(b, "calib")), threshold, ns, sizeof ns, ch, sizeof ch, &verdict);
    } else {
      v = judge_value(b, n, ch, sizeof ch, &verdict);
    }
    bool is_time = !strcmp(str(b, "kind"), "time");
    if (v == V_OK) {
      counts->ok++;
      if (!is_time && ch[0]) counts->within_tol++;
      else if (!is_time) counts->exact++;
    } else if (v == V_REGRESSED) counts->regressed++;
    else if (v == V_FASTER) counts->improved++;
    else counts->incomparable++;
    bool changed = v != V_OK || (ch[0] && strcmp(str(b, "kind"), "time")); /* a time inside the threshold: unchanged */
    bool show = rows == VL_REGRESS_ROWS_ALL || (rows == VL_REGRESS_ROWS_CHANGED && changed) ||
                (rows == VL_REGRESS_ROWS_DEFAULT && (v != V_OK || !strstr(b->string, "/plan.")));
    if (out && show) fprintf(out, "| %s | %s | %s | %s | %s |\n", b->string, bs, ns, ch, verdict);
    else if (v == V_OK && !is_time && ch[0]) hidden_tol++;
    else if (v == V_OK) hidden++;
  }
  const cJSON *n;
  cJSON_ArrayForEach(n, nm) {
    if (cJSON_GetObjectItemCaseSensitive(bm, n->string)) continue;
    char ns[64];
    fmt_val(n, ns, sizeof ns);
    counts->added++;
    if (out) fprintf(out, "| %s | - | %s | | new |\n", n->string, ns);
  }
  if (out && hidden && rows == VL_REGRESS_ROWS_DEFAULT)
    fprintf(out, "| (%d planned numbers, each exactly as in the baseline) | | | | ok (exact) |\n", hidden);
  if (out && hidden_tol && rows == VL_REGRESS_ROWS_DEFAULT)
    fprintf(out, "| (%d numbers moved inside their tolerance, not exact) | | | | ok (within its tolerance) |\n",
            hidden_tol);
}

/* ---- collecting the metrics ------------------------------------------------------------ */
static cJSON *put_exact(cJSON *m, const char *name, double v) {
  cJSON *o = cJSON_AddObjectToObject(m, name);
  cJSON_AddStringToObject(o, "kind", "exact");
  cJSON_AddNumberToObject(o, "value", v);
  return o;
}

/* A measured exact or tol value with the kernels it depends on (none: compared anywhere;
 * on a GPU, "runtime_kernels": picked at run time, judge_value). */
static void put_measured(cJSON *m, const char *name, double v, const run_metric *rm, const char *impl,
                         vl_device dev) {
  cJSON *o = put_exact(m, name, v);
  if (rm->kind == M_TOL) {
    cJSON_ReplaceItemInObject(o, "kind", cJSON_CreateString("tol"));
    cJSON_AddNumberToObject(o, "tol", rm->tol);
    cJSON_AddNumberToObject(o, "xtol", rm->xtol);
  }
  if (rm->deps) cJSON_AddStringToObject(o, "impl", impl);
  if (rm->deps && dev != VL_DEV_CPU) cJSON_AddTrueToObject(o, "runtime_kernels");
}

/* The kernels rm depends on, as one string ("" when none or not on the CPU). */
static void impl_of(const run_metric *rm, vl_device dev, char *out, size_t n) {
  char blas[96] = "", conv[128] = "";
  out[0] = 0;
  if (dev != VL_DEV_CPU || !rm->deps) return;
  if (rm->deps & DEP_BLAS) vl_cpu_blas_key(blas, sizeof blas);
  if (rm->deps & DEP_CONV) vl_cpu_conv_key(conv, sizeof conv);
  snprintf(out, n, "%s%s%s", blas, blas[0] && conv[0] ? " " : "", conv);
}

static int load_ladder(const vl_case *c, vl_ladder *L, const run_cfg *rc, const char *data) {
  vl_err err;
  if (vl_ladder_load(L, VRAMLAB_SOURCE_DIR, c->id, &err)) {
    fprintf(stderr, "vramlab: regress: %s\n", err.msg);
    return -1;
  }
  for (int i = 0; rc && rc->sets[i]; i++) {
    char set[PATH_MAX + 64], *at = strstr(rc->sets[i], "@DATA@");
    if (at) snprintf(set, sizeof set, "%.*s%s%s", (int)(at - rc->sets[i]), rc->sets[i], data, at + 6);
    else snprintf(set, sizeof set, "%s", rc->sets[i]);
    if (vl_ladder_set(L, set, &err)) {
      fprintf(stderr, "vramlab: regress: %s: %s\n", c->id, err.msg);
      return -1;
    }
  }
  return 0;
}

/* Every rung of every case planned at full scale: the exact numbers. */
static int plan_all(cJSON *metrics) {
  int n;
  const vl_case *const *all = vl_case_all(&n);
  for (int i = 0; i < n; i++) {
    const vl_case *c = all[i];
    vl_ladder L;
    if (load_ladder(c, &L, NULL, "")) return -1;
    vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L.setting, .quiet = 1};
    for (int r = 0; r < L.n_rungs; r++) {
      vl_progress("regress: plan %s/%s", c->id, L.rungs[r].name);
      cJSON *o = cJSON_CreateObject();
      if (c->plan(&env, "full", &L.rungs[r].knobs, o) != VL_OK) {
        fprintf(stderr, "vramlab: regress: plan %s/%s: %s\n", c->id, L.rungs[r].name, env.err.msg);
        cJSON_Delete(o);
        return -1;
      }
      char name[160];
      for (int k = 0; PLAN_KEYS[k]; k++) {
        cJSON *v = cJSON_GetObjectItem(o, PLAN_KEYS[k]);
        if (!cJSON_IsNumber(v) && !cJSON_IsBool(v)) continue;
        snprintf(name, sizeof name, "%s/%s/plan.%s", c->id, L.rungs[r].name, PLAN_KEYS[k]);
        put_exact(metrics, name, cJSON_IsBool(v) ? (double)cJSON_IsTrue(v) : v->valuedouble);
      }
      const cJSON *cats = cJSON_GetObjectItem(o, "peak_by_category"), *cat;
      cJSON_ArrayForEach(cat, cats) {
        snprintf(name, sizeof name, "%s/%s/plan.bytes.%s", c->id, L.rungs[r].name, cat->string);
        put_exact(metrics, name, cJSON_GetNumberValue(cat));
      }
      cJSON_Delete(o);
    }
  }
  return 0;
}

/* The value of a run metric in one repetition's JSON (the step-time median of a step_time
 * object); NAN when the run did not write it. */
static double run_value(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItem(o, key);
  if (cJSON_IsObject(v)) return num(v, "median");
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* This host's calibration, one sample per repetition round, interleaved with the runs so a
 * neighbour that slows the runs slows it too: sgemm FLOP/s through the engine's GEMM (the
 * compute-bound steps) and memcpy bandwidth (the loaders). */
typedef struct {
  double sgemm[64], copy[64];
  int n;
} calib_samples;

static void calibrate(calib_samples *c) {
  if (c->n >= 64) return;
  c->sgemm[c->n] = vl_bench_sgemm(768, 3);
  c->copy[c->n] = vl_bench_copy_bw((size_t)64 << 20, 3);
  c->n++;
}

static void put_calibration(cJSON *doc, calib_samples *c) {
  cJSON *o = cJSON_AddObjectToObject(doc, "calibration");
  vl_stats sg, cp;
  vl_stats_compute(c->sgemm, c->n, &sg);
  vl_stats_compute(c->copy, c->n, &cp);
  cJSON_AddNumberToObject(o, "sgemm_flops", c->n ? sg.median : 0);
  cJSON_AddNumberToObject(o, "copy_bytes_per_s", c->n ? cp.median : 0);
  cJSON_AddItemToObject(o, "sgemm_samples", cJSON_CreateDoubleArray(c->sgemm, c->n));
  cJSON_AddItemToObject(o, "copy_samples", cJSON_CreateDoubleArray(c->copy, c->n));
}

typedef struct {
  const vl_case *c;
  vl_ladder L;
  int rung;
  cJSON *reps; /* array of each repetition's run JSON */
} run_state;

/* reps repetitions, interleaved: case A, B, C, D, A, B, C, D, ... */
static int run_all(cJSON *metrics, vl_device dev, const char *data, int reps, run_state *st, calib_samples *cal) {
  for (int i = 0; i < N_RUNS; i++) {
    st[i].c = vl_case_find(RUNS[i].case_id);
    st[i].reps = cJSON_CreateArray();
    if (!st[i].c || load_ladder(st[i].c, &st[i].L, &RUNS[i], data)) return -1;
    st[i].rung = vl_ladder_find(&st[i].L, RUNS[i].rung);
    if (st[i].rung < 0) {
      fprintf(stderr, "vramlab: regress: %s has no rung '%s'\n", RUNS[i].case_id, RUNS[i].rung);
      return -1;
    }
  }
  for (int rep = 0; rep < reps; rep++) {
    calibrate(cal);
    for (int i = 0; i < N_RUNS; i++) {
      if (vl_interrupted) return -1;
      vl_case_env env = {.scale = RUNS[i].scale, .device = dev, .setting = &st[i].L.setting, .quiet = 1};
      vl_progress("regress: run %s/%s (%s scale, repetition %d/%d)", RUNS[i].case_id, RUNS[i].rung, RUNS[i].scale,
                  rep + 1, reps);
      cJSON *o = cJSON_CreateObject();
      cJSON_AddItemToArray(st[i].reps, o);
      /* rep 0 each time: every repetition is the same seeded run */
      if (st[i].c->run(&env, &st[i].L.rungs[st[i].rung].knobs, 0, o) != VL_OK) {
        fprintf(stderr, "vramlab: regress: run %s/%s: %s\n", RUNS[i].case_id, RUNS[i].rung, env.err.msg);
        return -1;
      }
      if (cJSON_IsTrue(cJSON_GetObjectItem(o, "oom"))) {
        fprintf(stderr, "vramlab: regress: run %s/%s ran out of memory\n", RUNS[i].case_id, RUNS[i].rung);
        return -1;
      }
    }
  }
  for (int i = 0; i < N_RUNS; i++) {
    const cJSON *first = cJSON_GetArrayItem(st[i].reps, 0);
    for (int k = 0; k < 6 && RUNS[i].m[k].key; k++) {
      const run_metric *rm = &RUNS[i].m[k];
      if (rm->cpu_only && dev != VL_DEV_CPU) continue;
      char name[160];
      snprintf(name, sizeof name, "%s/%s/run.%s", RUNS[i].case_id, RUNS[i].rung, rm->key);
      const cJSON *v = cJSON_GetObjectItem(first, rm->key);
      char impl[256];
      impl_of(rm, dev, impl, sizeof impl);
      if (rm->kind == M_TOL && cJSON_IsArray(v)) { /* a loss trajectory: one metric per step */
        int j = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, v) {
          char nj[176];
          snprintf(nj, sizeof nj, "%s[%d]", name, j++);
          put_measured(metrics, nj, x->valuedouble, rm, impl, dev);
        }
        continue;
      }
      if (rm->kind == M_EXACT || rm->kind == M_TOL) {
        double x = run_value(first, rm->key);
        if (isnan(x)) continue;
        put_measured(metrics, name, x, rm, impl, dev);
        continue;
      }
      /* timings: one sample per repetition */
      double s[64];
      int ns = 0;
      const cJSON *o;
      cJSON_ArrayForEach(o, st[i].reps) {
        double x = run_value(o, rm->key);
        if (isnan(x) || ns >= 64) continue;
        s[ns++] = rm->kind == M_RATE ? (x > 0 ? 1.0 / x : INFINITY) : x;
      }
      if (ns == 0) continue;
      /* a rate is judged as its inverse, a time, and named as one: images_per_s -> seconds_per_image */
      if (rm->kind == M_RATE) {
        const char *per = strstr(rm->key, "_per_s");
        int stem = per ? (int)(per - rm->key) : (int)strlen(rm->key);
        if (stem > 1 && rm->key[stem - 1] == 's') stem--; /* images -> image */
        snprintf(name, sizeof name, "%s/%s/run.seconds_per_%.*s", RUNS[i].case_id, RUNS[i].rung, stem, rm->key);
      }
      vl_stats st;
      vl_stats_compute(s, ns, &st);
      cJSON *t = cJSON_AddObjectToObject(metrics, name);
      cJSON_AddStringToObject(t, "kind", "time");
      cJSON_AddNumberToObject(t, "median", st.median);
      cJSON_AddNumberToObject(t, "min", st.min);
      cJSON_AddItemToObject(t, "samples", cJSON_CreateDoubleArray(s, ns));
      cJSON_AddStringToObject(t, "calib", dev == VL_DEV_CPU ? rm->calib : "none");
    }
  }
  return 0;
}

/* ---- the command ----------------------------------------------------------------------- */
static const char *now_utc(void) {
  static char buf[32];
  time_t t = time(NULL);
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", gmtime(&t));
  return buf;
}

static void usage(FILE *f) {
  fprintf(f, "usage: vramlab regress [--update] [--all] [--device cpu|cuda|auto] [--threshold F] [--reps N]\n"
             "                       [--baselines DIR | --baseline FILE] [--now FILE] [--data-dir DIR] [--out FILE]\n"
             "  compare a short fixed run of every case with DIR/<device-class>.json\n"
             "  (DIR default reports/baselines; --threshold: timing slowdown flagged, default 0.07, after\n"
             "  scaling by this host's calibration; --reps: interleaved repetitions, >= 5; --update:\n"
             "  rewrite the baseline and say what changed; --all: list every metric, not only the\n"
             "  measured ones and the failures; --out: this run's metrics as JSON; --now FILE: compare\n"
             "  such a file instead of running; --baseline FILE: that baseline, whatever its class)\n");
}

/* The baselines under dir, "a, b" (for the message when this host's class has none). */
static void list_baselines(const char *dir, char *out, size_t n) {
  out[0] = 0;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l > 5 && !strcmp(e->d_name + l - 5, ".json"))
      snprintf(out + strlen(out), n - strlen(out), "%s%.*s", out[0] ? ", " : "", (int)(l - 5), e->d_name);
  }
  closedir(d);
}

/* Reads and validates a metrics document (a baseline or a --now file); NULL with the reason. */
static cJSON *load_doc(const char *path, vl_err *err) {
  size_t bn = 0;
  vl_err why = {0};
  char *text = vl_read_file_max(path, 64u << 20, &bn, &why);
  if (!text) {
    vl_err_set(err, VL_ERR_IO, "%s: %s", path, why.msg[0] ? why.msg : "cannot be read");
    return NULL;
  }
  cJSON *doc = cJSON_ParseWithLength(text, bn);
  free(text);
  if (!doc) {
    vl_err_set(err, VL_ERR_INVALID, "%s: not valid JSON", path);
    return NULL;
  }
  if (vl_regress_validate(doc, &why)) {
    vl_err_set(err, VL_ERR_INVALID, "%s: %s", path, why.msg);
    cJSON_Delete(doc);
    return NULL;
  }
  return doc;
}

/* This run's metrics: the plans, the runs and the calibration interleaved with them. */
static cJSON *measure(vl_device dev, const char *cls, cJSON *env, const char *data, long reps) {
  cJSON *now = cJSON_CreateObject();
  cJSON_AddNumberToObject(now, "version", VL_REGRESS_VERSION);
  cJSON_AddStringToObject(now, "device_class", cls);
  cJSON_AddItemToObject(now, "env", env);
  cJSON_AddNumberToObject(now, "reps", (double)reps);
  cJSON *metrics = cJSON_AddObjectToObject(now, "metrics");
  run_state st[N_RUNS];
  calib_samples cal = {0};
  memset(st, 0, sizeof st);
  double t0 = vl_now();
  int rc = plan_all(metrics) || run_all(metrics, dev, data, (int)reps, st, &cal) ? 1 : 0;
  for (int i = 0; i < N_RUNS; i++) cJSON_Delete(st[i].reps);
  if (rc) {
    cJSON_Delete(now);
    return NULL;
  }
  put_calibration(now, &cal);
  if (dev == VL_DEV_CPU) {
    char k[160];
    cJSON *kern = cJSON_AddObjectToObject(now, "kernels");
    vl_cpu_blas_key(k, sizeof k);
    cJSON_AddStringToObject(kern, "blas", k);
    vl_cpu_conv_key(k, sizeof k);
    cJSON_AddStringToObject(kern, "conv", k);
  }
  vl_progress("regress: %d metrics in %.0f s", cJSON_GetArraySize(metrics), vl_now() - t0);
  return now;
}

/* reports/regress.md and the front page's regression line. */
static void write_regress_md(const char *cls, const char *head, const char *tbl, const char *summary,
                             const char *warn, const cJSON *env) {
  char md[PATH_MAX], *mtext = NULL, line[900];
  vl_err err;
  snprintf(md, sizeof md, "%s/reports/regress.md", VRAMLAB_SOURCE_DIR);
  size_t ml = 0;
  FILE *mf = open_memstream(&mtext, &ml);
  if (mf) {
    fprintf(mf, "# vramlab regress — %s\n\n_%s; %s; commit %s._\n\n%s\n**%s**\n%s%s", cls, head + 9, now_utc(),
            cJSON_GetStringValue(cJSON_GetObjectItem(env, "git_commit")), tbl ? tbl : "", summary,
            warn[0] ? "\n" : "", warn);
    fclose(mf);
  }
  if (mtext && vl_write_atomic(md, mtext, &err)) fprintf(stderr, "vramlab: regress: %s\n", err.msg);
  free(mtext);
  snprintf(line, sizeof line, "`make regress` on %s: %s ([regress.md](regress.md)).", cls, summary);
  if (vl_index_write(VRAMLAB_SOURCE_DIR "/reports", line, &err))
    fprintf(stderr, "vramlab: regress: reports/index.md: %s\n", err.msg);
}

/* Compares now with base, prints the table and the summary; 1 on a regression. */
static int judge(const cJSON *base, const cJSON *now, const char *path, double threshold, long reps, bool all_rows,
                 bool write_md) {
  const char *cls = cJSON_GetStringValue(cJSON_GetObjectItem(now, "device_class"));
  vl_regress_counts k;
  char *tbl = NULL;
  size_t tn = 0;
  FILE *tf = open_memstream(&tbl, &tn);
  if (!tf) return 1;
  vl_regress_compare(base, now, threshold, all_rows ? VL_REGRESS_ROWS_ALL : VL_REGRESS_ROWS_DEFAULT, tf, &k);
  fclose(tf);
  char head[700], summary[300], warn[600] = "";
  snprintf(head, sizeof head, "regress: %s against %s (threshold %.0f%%, %ld interleaved repetitions)", cls, path,
           100 * threshold, reps);
  snprintf(summary, sizeof summary,
           "%d ok (%d exactly as in the baseline, %d within their tolerance, %d timings within the threshold), "
           "%d regressed (%d missing), %d faster, %d new, %d not comparable: %s",
           k.ok, k.exact, k.within_tol, k.ok - k.exact - k.within_tol, k.regressed, k.missing, k.improved, k.added, k.incomparable,
           k.regressed ? "FAILED" : k.incomparable ? "passed with warnings" : "passed");
  if (k.incomparable) {
    const cJSON *bc = cJSON_GetObjectItem(base, "calibration"), *nc = cJSON_GetObjectItem(now, "calibration");
    snprintf(warn, sizeof warn,
             "regress: warning: %d metrics not comparable on this host: sgemm %.1f GFLOP/s and copy %.1f GB/s "
             "here against %.1f and %.1f in the baseline (timings are judged within ×%.0f of the baseline's "
             "speed), or other convolution/sgemm kernels (exact numbers compared only on the baseline's: "
             "here %s)\n",
             k.incomparable, num(nc, "sgemm_flops") / 1e9, num(nc, "copy_bytes_per_s") / 1e9,
             num(bc, "sgemm_flops") / 1e9, num(bc, "copy_bytes_per_s") / 1e9, VL_REGRESS_CALIB_BAND,
             str(cJSON_GetObjectItem(now, "kernels"), "conv"));
  }
  printf("%s\n\n%s\nregress: %s\n%s", head, tbl ? tbl : "", summary, warn);
  if (k.regressed) printf("regress: make regress-update rewrites the baseline when the change is deliberate\n");
  if (write_md) write_regress_md(cls, head, tbl, summary, warn, cJSON_GetObjectItem(now, "env"));
  free(tbl);
  return k.regressed ? 1 : 0;
}

int vl_regress_main(int argc, char **argv) {
  const char *device = "cpu", *bdir = VRAMLAB_SOURCE_DIR "/reports/baselines", *data = "build/regress-data",
             *out = NULL, *now_path = NULL, *bfile = NULL;
  double threshold = 0.07;
  long reps = 5;
  bool update = false, all_rows = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(a, "--update")) update = true;
    else if (!strcmp(a, "--all")) all_rows = true;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
    else if (!v) { fprintf(stderr, "vramlab: regress: %s needs a value (or is unknown)\n", a); usage(stderr); return 2; }
    else if (!strcmp(a, "--device")) device = v, i++;
    else if (!strcmp(a, "--baselines")) bdir = v, i++;
    else if (!strcmp(a, "--baseline")) bfile = v, i++;
    else if (!strcmp(a, "--now")) now_path = v, i++;
    else if (!strcmp(a, "--data-dir")) data = v, i++;
    else if (!strcmp(a, "--out")) out = v, i++;
    else if (!strcmp(a, "--threshold")) {
      threshold = strtod(v, &end), i++;
      if (*end || !(threshold > 0 && threshold < 10)) { fprintf(stderr, "vramlab: regress: --threshold %s: a fraction in (0, 10), e.g. 0.07\n", v); return 2; }
    } else if (!strcmp(a, "--reps")) {
      reps = strtol(v, &end, 10), i++;
      if (*end || reps < 5 || reps > 64) { fprintf(stderr, "vramlab: regress: --reps %s: 5..64 (medians need >= 5)\n", v); return 2; }
    } else { fprintf(stderr, "vramlab: regress: unknown option %s\n", a); usage(stderr); return 2; }
  }
  if (now_path && update) {
    fprintf(stderr, "vramlab: regress: --now compares a file; --update rewrites a baseline from a run: not both\n");
    return 2;
  }
  char path[PATH_MAX], cls[200];
  vl_err err = {0};
  cJSON *now = NULL;
  if (now_path) {
    if (!(now = load_doc(now_path, &err))) {
      fprintf(stderr, "vramlab: regress: --now %s\n", err.msg);
      return 1;
    }
    snprintf(cls, sizeof cls, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(now, "device_class")));
    reps = (long)num(now, "reps");
  } else {
    vl_device dev;
    if (!strcmp(device, "auto")) dev = vl_cuda_available() ? VL_DEV_CUDA : VL_DEV_CPU;
    else if (!strcmp(device, "cpu")) dev = VL_DEV_CPU;
    else if (!strcmp(device, "cuda")) dev = VL_DEV_CUDA;
    else { fprintf(stderr, "vramlab: regress: --device %s: cpu, cuda or auto\n", device); return 2; }
    if (dev == VL_DEV_CUDA && !vl_cuda_available()) {
      fprintf(stderr, "vramlab: regress: --device cuda: no CUDA device visible (or no CUDA backend in this build)\n");
      return 2;
    }
    vl_interrupt_install();
    cJSON *env = vl_env_json(vl_device_name(dev));
    vl_regress_device_class(vl_device_name(dev), cJSON_GetStringValue(cJSON_GetObjectItem(env, "cpu")),
                            (int)num(env, "cores"), cJSON_GetStringValue(cJSON_GetObjectItem(env, "gpu")), cls,
                            sizeof cls);
    if (!(now = measure(dev, cls, env, data, reps))) return vl_interrupted ? 130 : 1;
  }
  int rc = 0;
  char *text = cJSON_Print(now);
  if (out && !now_path && vl_write_atomic(out, text, &err)) {
    fprintf(stderr, "vramlab: regress: %s\n", err.msg);
    rc = 1;
  }
  if (bfile) snprintf(path, sizeof path, "%s", bfile);
  else snprintf(path, sizeof path, "%s/%s.json", bdir, cls);
  bool exists = access(path, F_OK) == 0;
  cJSON *base = exists ? load_doc(path, &err) : NULL;
  if (exists && !base && !update) {
    /* a damaged baseline is a failure, never "0 compared: passed" */
    fprintf(stderr, "vramlab: regress: baseline %s\nvramlab: regress: fix it, or rewrite it with make regress-update\n",
            err.msg);
    rc = 1;
  } else if (update) {
    if (base) {
      vl_regress_counts k;
      printf("regress-update: what changed in %s\n\n", path);
      vl_regress_compare(base, now, threshold, VL_REGRESS_ROWS_CHANGED, stdout, &k);
      printf("\n%d unchanged, %d changed or slower, %d faster, %d new, %d gone, %d not comparable\n", k.ok,
             k.regressed - k.missing, k.improved, k.added, k.missing, k.incomparable);
    } else if (exists) {
      printf("regress-update: the old baseline %s is replaced: %s\n", path, err.msg);
    }
    if ((!bfile && vl_mkdir_p(bdir)) || vl_write_atomic(path, text, &err)) {
      fprintf(stderr, "vramlab: regress: cannot write the baseline %s: %s\n", path, err.msg);
      rc = 1;
    } else {
      printf("regress: baseline %s %s (%d metrics, device class %s)\n", path, exists ? "rewritten" : "created",
             cJSON_GetArraySize(cJSON_GetObjectItem(now, "metrics")), cls);
    }
  } else if (!base) {
    char have[1024];
    list_baselines(bdir, have, sizeof have);
    if (bfile) printf("regress: not compared: no baseline at %s; this host (device class %s)", path, cls);
    else printf("regress: not compared: no baseline for device class %s (%s has %s); this host", cls, bdir,
                have[0] ? have : "none");
    printf("'s numbers are in %s.\nregress: neither a pass nor a failure: `make regress-update` on a quiet machine of "
           "this class makes one\n", now_path ? now_path : out ? out : "--out FILE");
  } else {
    const char *bcls = cJSON_GetStringValue(cJSON_GetObjectItem(base, "device_class"));
    if (strcmp(bcls, cls)) {
      printf("regress: not compared: %s is the baseline of device class %s, this host is %s: neither a pass nor "
             "a failure\n", path, bcls, cls);
    } else {
      rc |= judge(base, now, path, threshold, reps, all_rows, !now_path);
    }
  }
  free(text);
  cJSON_Delete(base);
  cJSON_Delete(now);
  return rc;
}
