/* `vramlab regress [--update]`: plan every rung of every case at full scale (exact numbers),
 * run one fixed short rung of every case a few times, interleaved across the cases (seeded
 * losses, the measured peak, step times), and compare it all with the baseline of this
 * device class (regress.h says how each metric is judged). */
#include "regress.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "case.h"
#include "index.h"
#include "interrupt.h"
#include "vramlab/backend.h"

/* ---- the fixed configuration ---------------------------------------------------------- */
typedef enum { M_EXACT, M_TOL, M_TIME, M_RATE } metric_kind; /* rate: per second, inverted */
typedef struct {
  const char *key; /* a key of the run's JSON: a number, a bool, a number array, or a
                      {median} object (step_time) */
  metric_kind kind;
  double tol;
  bool cpu_only; /* the measured peak equals the plan on the CPU; a GPU adds its own */
} run_metric;

typedef struct {
  const char *case_id, *rung, *scale;
  const char *sets[8]; /* "@DATA@" is the data folder */
  run_metric m[6];
} run_cfg;

/* Losses: the same seeded step on the same machine agrees to ~1e-15 run to run (OpenMP's
 * reduction order in the loss sum); 1e-4 relative leaves room for a BLAS that splits a GEMM
 * differently at another thread count, not for a changed model. */
static const run_cfg RUNS[] = {
    {"llm-lora", "lora", "small", {"steps=4", "warmup=1", "seq=128", NULL},
     {{"step_time", M_TIME, 0, false}, {"loss", M_TOL, 1e-4, false}, {"measured_peak_bytes", M_EXACT, 0, true},
      {"plan_matches_measured", M_EXACT, 0, true}}},
    {"seg-ckpt", "ckpt", "tiny", {"train_images=24", "eval_images=8", "epochs=1", "data_dir=@DATA@", NULL},
     {{"step_time", M_TIME, 0, false}, {"loss", M_TOL, 1e-4, false}, {"measured_peak_bytes", M_EXACT, 0, true},
      {"plan_matches_measured", M_EXACT, 0, true}, {"pixel_accuracy", M_TOL, 1e-3, false}}},
    {"sd-lora", "before", "tiny",
     {"steps=3", "data_dir=@DATA@/captions", "cache_dir=@DATA@/sd-cache", NULL},
     /* its step is the modeled accelerator's (a fixed wait): only the loading is timed */
     {{"load_s_per_batch", M_TIME, 0, false}, {"images_per_s", M_RATE, 0, false}}},
    {"dataloader", "workers", "tiny", {"consumer_ms=1", "data_dir=@DATA@", NULL},
     {{"images_per_s", M_RATE, 0, false}, {"load_s_per_batch", M_TIME, 0, false}}},
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

/* ---- comparison ------------------------------------------------------------------------ */
static double num(const cJSON *o, const char *k) { return cJSON_GetNumberValue(cJSON_GetObjectItem(o, k)); }

static void fmt_val(const cJSON *m, char *buf, size_t n) {
  if (!m) { snprintf(buf, n, "-"); return; }
  const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(m, "kind"));
  if (kind && !strcmp(kind, "time")) snprintf(buf, n, "%.4g s (min %.4g)", num(m, "median"), num(m, "min"));
  else snprintf(buf, n, "%.10g", num(m, "value"));
}

void vl_regress_compare(const cJSON *base, const cJSON *now, double threshold, vl_regress_rows rows, FILE *out,
                        vl_regress_counts *counts) {
  int hidden = 0;
  memset(counts, 0, sizeof *counts);
  const cJSON *bm = cJSON_GetObjectItem(base, "metrics"), *nm = cJSON_GetObjectItem(now, "metrics");
  if (out) fprintf(out, "| metric | baseline | now | change | verdict |\n|---|---|---|---|---|\n");
  const cJSON *b;
  cJSON_ArrayForEach(b, bm) {
    const cJSON *n = cJSON_GetObjectItem(nm, b->string);
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(b, "kind"));
    char bs[64], ns[64], ch[48] = "", *verdict;
    fmt_val(b, bs, sizeof bs);
    fmt_val(n, ns, sizeof ns);
    bool changed = true;
    if (!n) {
      verdict = "REGRESSION (missing)";
      counts->missing++, counts->regressed++;
    } else if (kind && !strcmp(kind, "time")) {
      double bmed = num(b, "median"), nmed = num(n, "median"), bmin = num(b, "min"), nmin = num(n, "min");
      double r = bmed > 0 ? nmed / bmed - 1 : 0;
      snprintf(ch, sizeof ch, "%+.1f%%", 100 * r);
      if (nmed > bmed * (1 + threshold) && nmin > bmin * (1 + threshold)) {
        verdict = "REGRESSION (slower)";
        counts->regressed++;
      } else if (nmed < bmed * (1 - threshold) && nmin < bmin * (1 - threshold)) {
        verdict = "faster";
        counts->improved++;
      } else {
        verdict = "ok";
        counts->ok++;
        changed = false;
      }
    } else {
      double bv = num(b, "value"), nv = num(n, "value");
      double tol = kind && !strcmp(kind, "tol") ? num(b, "tol") : 0;
      double d = nv - bv;
      if (d != 0) snprintf(ch, sizeof ch, "%+.6g", d);
      bool same = kind && !strcmp(kind, "tol") ? fabs(d) <= tol * fmax(1.0, fabs(bv)) : d == 0;
      changed = d != 0;
      if (same) {
        verdict = "ok";
        counts->ok++;
      } else {
        verdict = "REGRESSION (changed)";
        counts->regressed++;
      }
    }
    bool ok = !strcmp(verdict, "ok");
    bool show = rows == VL_REGRESS_ROWS_ALL || (rows == VL_REGRESS_ROWS_CHANGED && changed) ||
                (rows == VL_REGRESS_ROWS_DEFAULT && (!ok || !strstr(b->string, "/plan.")));
    if (out && show) fprintf(out, "| %s | %s | %s | %s | %s |\n", b->string, bs, ns, ch, verdict);
    else if (ok) hidden++;
  }
  const cJSON *n;
  cJSON_ArrayForEach(n, nm) {
    if (cJSON_GetObjectItem(bm, n->string)) continue;
    char ns[64];
    fmt_val(n, ns, sizeof ns);
    counts->added++;
    if (out) fprintf(out, "| %s | - | %s | | new |\n", n->string, ns);
  }
  if (out && hidden && rows == VL_REGRESS_ROWS_DEFAULT)
    fprintf(out, "| (%d planned numbers, each exactly as in the baseline) | | | | ok |\n", hidden);
}

/* ---- collecting the metrics ------------------------------------------------------------ */
static void put_exact(cJSON *m, const char *name, double v) {
  cJSON *o = cJSON_AddObjectToObject(m, name);
  cJSON_AddStringToObject(o, "kind", "exact");
  cJSON_AddNumberToObject(o, "value", v);
}

static void put_tol(cJSON *m, const char *name, double v, double tol) {
  cJSON *o = cJSON_AddObjectToObject(m, name);
  cJSON_AddStringToObject(o, "kind", "tol");
  cJSON_AddNumberToObject(o, "value", v);
  cJSON_AddNumberToObject(o, "tol", tol);
}

static int load_ladder(const vl_case *c, vl_ladder *L, const run_cfg *rc, const char *data) {
  char err[512];
  if (vl_ladder_load(L, VRAMLAB_SOURCE_DIR, c->id, err, sizeof err)) {
    fprintf(stderr, "vramlab: regress: %s\n", err);
    return -1;
  }
  for (int i = 0; rc && rc->sets[i]; i++) {
    char set[PATH_MAX + 64], *at = strstr(rc->sets[i], "@DATA@");
    if (at) snprintf(set, sizeof set, "%.*s%s%s", (int)(at - rc->sets[i]), rc->sets[i], data, at + 6);
    else snprintf(set, sizeof set, "%s", rc->sets[i]);
    if (vl_ladder_set(L, set, err, sizeof err)) {
      fprintf(stderr, "vramlab: regress: %s: %s\n", c->id, err);
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
        fprintf(stderr, "vramlab: regress: plan %s/%s: %s\n", c->id, L.rungs[r].name, env.err);
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

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct {
  const vl_case *c;
  vl_ladder L;
  int rung;
  cJSON *reps; /* array of each repetition's run JSON */
} run_state;

/* reps repetitions, interleaved: case A, B, C, D, A, B, C, D, ... */
static int run_all(cJSON *metrics, vl_device dev, const char *data, int reps, run_state *st) {
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
  for (int rep = 0; rep < reps; rep++)
    for (int i = 0; i < N_RUNS; i++) {
      if (vl_interrupted) return -1;
      vl_case_env env = {.scale = RUNS[i].scale, .device = dev, .setting = &st[i].L.setting, .quiet = 1};
      vl_progress("regress: run %s/%s (%s scale, repetition %d/%d)", RUNS[i].case_id, RUNS[i].rung, RUNS[i].scale,
                  rep + 1, reps);
      cJSON *o = cJSON_CreateObject();
      cJSON_AddItemToArray(st[i].reps, o);
      /* rep 0 each time: every repetition is the same seeded run */
      if (st[i].c->run(&env, &st[i].L.rungs[st[i].rung].knobs, 0, o) != VL_OK) {
        fprintf(stderr, "vramlab: regress: run %s/%s: %s\n", RUNS[i].case_id, RUNS[i].rung, env.err);
        return -1;
      }
      if (cJSON_IsTrue(cJSON_GetObjectItem(o, "oom"))) {
        fprintf(stderr, "vramlab: regress: run %s/%s ran out of memory\n", RUNS[i].case_id, RUNS[i].rung);
        return -1;
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
      if (rm->kind == M_TOL && cJSON_IsArray(v)) { /* a loss trajectory: one metric per step */
        int j = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, v) {
          char nj[176];
          snprintf(nj, sizeof nj, "%s[%d]", name, j++);
          put_tol(metrics, nj, x->valuedouble, rm->tol);
        }
        continue;
      }
      if (rm->kind == M_EXACT || rm->kind == M_TOL) {
        double x = run_value(first, rm->key);
        if (isnan(x)) continue;
        if (rm->kind == M_EXACT) put_exact(metrics, name, x);
        else put_tol(metrics, name, x, rm->tol);
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
      if (rm->kind == M_RATE) snprintf(name, sizeof name, "%s/%s/run.1/%s", RUNS[i].case_id, RUNS[i].rung, rm->key);
      qsort(s, (size_t)ns, sizeof *s, cmp_d);
      cJSON *t = cJSON_AddObjectToObject(metrics, name);
      cJSON_AddStringToObject(t, "kind", "time");
      cJSON_AddNumberToObject(t, "median", ns % 2 ? s[ns / 2] : 0.5 * (s[ns / 2 - 1] + s[ns / 2]));
      cJSON_AddNumberToObject(t, "min", s[0]);
      cJSON_AddItemToObject(t, "samples", cJSON_CreateDoubleArray(s, ns));
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
             "                       [--baselines DIR] [--data-dir DIR] [--out FILE]\n"
             "  compare a short fixed run of every case with DIR/<device-class>.json\n"
             "  (DIR default reports/baselines; --threshold: timing slowdown flagged, default 0.07;\n"
             "  --reps: interleaved repetitions, >= 5; --update: rewrite the baseline and say what\n"
             "  changed; --all: list every metric, not only the measured ones and the failures;\n"
             "  --out: this run's metrics as JSON)\n");
}

int vl_regress_main(int argc, char **argv) {
  const char *device = "cpu", *bdir = VRAMLAB_SOURCE_DIR "/reports/baselines", *data = "build/regress-data",
             *out = NULL;
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
  char cls[200], path[PATH_MAX], err[512];
  vl_regress_device_class(vl_device_name(dev), cJSON_GetStringValue(cJSON_GetObjectItem(env, "cpu")),
                          (int)num(env, "cores"), cJSON_GetStringValue(cJSON_GetObjectItem(env, "gpu")), cls, sizeof cls);
  snprintf(path, sizeof path, "%s/%s.json", bdir, cls);
  cJSON *now = cJSON_CreateObject();
  cJSON_AddStringToObject(now, "device_class", cls);
  cJSON_AddItemToObject(now, "env", env);
  cJSON_AddNumberToObject(now, "reps", (double)reps);
  cJSON *metrics = cJSON_AddObjectToObject(now, "metrics");
  run_state st[N_RUNS];
  memset(st, 0, sizeof st);
  double t0 = vl_now();
  int rc = plan_all(metrics) || run_all(metrics, dev, data, (int)reps, st) ? 1 : 0;
  for (int i = 0; i < N_RUNS; i++) cJSON_Delete(st[i].reps);
  if (rc) {
    cJSON_Delete(now);
    return vl_interrupted ? 130 : 1;
  }
  vl_progress("regress: %d metrics in %.0f s", cJSON_GetArraySize(metrics), vl_now() - t0);
  char *text = cJSON_Print(now);
  if (out && vl_write_atomic(out, text, err, sizeof err)) {
    fprintf(stderr, "vramlab: regress: %s\n", err);
    rc = 1;
  }
  size_t bn = 0;
  char *btext = access(path, F_OK) == 0 ? vl_read_file_max(path, 64u << 20, &bn, err, sizeof err) : NULL;
  cJSON *base = btext ? cJSON_Parse(btext) : NULL;
  free(btext);
  if (access(path, F_OK) == 0 && !base) {
    fprintf(stderr, "vramlab: regress: baseline %s is not valid JSON: %s\n", path,
            err[0] ? err : "parse error (fix it or rerun with --update)");
    rc = 1;
  } else if (!base || update) {
    if (base) {
      vl_regress_counts k;
      printf("regress-update: what changed in %s\n\n", path);
      vl_regress_compare(base, now, threshold, VL_REGRESS_ROWS_CHANGED, stdout, &k);
      printf("\n%d unchanged, %d changed or slower, %d faster, %d new, %d gone\n", k.ok, k.regressed - k.missing,
             k.improved, k.added, k.missing);
    }
    if (vl_mkdir_p(bdir) || vl_write_atomic(path, text, err, sizeof err)) {
      fprintf(stderr, "vramlab: regress: cannot write the baseline %s: %s\n", path, err);
      rc = 1;
    } else {
      printf("regress: baseline %s %s (%d metrics, device class %s)\n", path, base ? "rewritten" : "created",
             cJSON_GetArraySize(metrics), cls);
    }
  } else {
    vl_regress_counts k;
    char *tbl = NULL;
    size_t tn = 0;
    FILE *tf = open_memstream(&tbl, &tn);
    if (tf) {
      vl_regress_compare(base, now, threshold, all_rows ? VL_REGRESS_ROWS_ALL : VL_REGRESS_ROWS_DEFAULT, tf, &k);
      fclose(tf);
    }
    char head[600], summary[300];
    snprintf(head, sizeof head, "regress: %s against %s (threshold %.0f%%, %ld interleaved repetitions)", cls,
             path, 100 * threshold, reps);
    snprintf(summary, sizeof summary, "%d ok, %d regressed (%d missing), %d faster, %d new: %s", k.ok, k.regressed,
             k.missing, k.improved, k.added, k.regressed ? "FAILED" : "passed");
    printf("%s\n\n%s\nregress: %s\n", head, tbl ? tbl : "", summary);
    if (k.regressed) {
      printf("regress: make regress-update rewrites the baseline when the change is deliberate\n");
      rc = 1;
    }
    /* reports/regress.md and the front page's regression line */
    char md[PATH_MAX], *mtext = NULL, line[700];
    snprintf(md, sizeof md, "%s/reports/regress.md", VRAMLAB_SOURCE_DIR);
    size_t ml = 0;
    FILE *mf = open_memstream(&mtext, &ml);
    if (mf) {
      fprintf(mf, "# vramlab regress — %s\n\n_%s; %s; commit %s._\n\n%s\n**%s**\n", cls, head + 9,
              now_utc(), cJSON_GetStringValue(cJSON_GetObjectItem(env, "git_commit")), tbl ? tbl : "",
              summary);
      fclose(mf);
    }
    if (mtext && vl_write_atomic(md, mtext, err, sizeof err)) fprintf(stderr, "vramlab: regress: %s\n", err);
    free(mtext);
    free(tbl);
    snprintf(line, sizeof line, "`make regress` on %s: %s ([regress.md](regress.md)).", cls, summary);
    if (vl_index_write(VRAMLAB_SOURCE_DIR "/reports", line, err, sizeof err))
      fprintf(stderr, "vramlab: regress: reports/index.md: %s\n", err);
  }
  free(text);
  cJSON_Delete(base);
  cJSON_Delete(now);
  return rc;
}
