/* vramlab: list | plan | run | report | bench | peer-config | ... */
#include <limits.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ladder.h"
#include "registry.h"
#include "collbench.h"
#include "index.h"
#include "regress.h"
#include "datagen.h"
#include "kit/interrupt.h"
#include "list.h"
#include "peercfg.h"
#include "kit/parse.h"
#include "datasets/jpegset.h"
#include "datasets/segset.h"
#include "report.h"
#include "sgemm.h"
#include "vramlab/backend.h"
#include "vramlab/ckpt.h"

/* gcc: the build turns -Wformat-truncation off for every file (message buffers elsewhere
 * trip it); in this file every path, name and value copy is length-checked, so a copy that
 * could be cut is an error here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic error "-Wformat-truncation"
#endif

static void usage(FILE *f) {
  fprintf(f,
          "usage: vramlab <command> [options]\n"
          "  list [CASE] [--json]               cases, scales and rungs (CASE: its knobs and\n"
          "                                     settings too; --json: all of it, with defaults)\n"
          "  plan CASE [--step RUNG]            memory/FLOPs of a step without running it\n"
          "  run CASE [--step RUNG]             run the ladder (plan at full scale + timed run)\n"
          "  report CASE [--results FILE]       write reports/CASE.md and plots from results\n"
          "  bench CASE                         run + report\n"
          "  peer-config CASE [--step RUNG]     each rung's PyTorch peer setup (JSON) without\n"
          "                                     running it, at --scale (default small, the\n"
          "                                     CPU's run scale); a rung no CPU peer runs says\n"
          "                                     why (llm-lora, seg-ckpt, sd-lora; the MemTracker\n"
          "                                     fixtures)\n"
          "  bench gemm [--n N]                 this machine's sgemm FLOP/s\n"
          "  bench allreduce|reduce_scatter|allgather [--ranks N] [--min-bytes B] [--max-bytes B]\n"
          "                                     collective bandwidth over N ranks (the\n"
          "                                     nccl-tests table; --help for all options)\n"
          "  index                              rewrite reports/index.md (bench does it too)\n"
          "  regress [--update] [--device D]    short fixed runs of every case against\n"
          "                                     reports/baselines/<device-class>.json (--help)\n"
          "  data gen --out DIR [--n N] [--seed S] [--quality Q]\n"
          "                                     make a synthetic JPEG set (dataloader case)\n"
          "  data gen --kind seg --out DIR [--n N] [--seed S] [--quality Q] [--size S]\n"
          "           [--classes C]             make a synthetic segmentation set: SxS JPEGs\n"
          "                                     + PGM masks, C classes incl. background\n"
          "                                     (default 128, 5; seg-ckpt case)\n"
          "  data gen --kind captions --out DIR [--n N] [--seed S] [--quality Q]\n"
          "                                     make a captioned image set: JPEGs with short\n"
          "                                     side 384..640, captions of CLIP token ids\n"
          "                                     (sd-lora case)\n"
          "options:\n"
          "  --device auto|cpu|cuda|plan        where run executes (auto: cuda if visible)\n"
          "  --scale tiny|small|full            run scale (plan defaults to full)\n"
          "  --step RUNG                        one rung only\n"
          "  --set key=value | rung.key=value   override the ladder (repeatable)\n"
          "  --vram SIZE                        card memory for plan (e.g. 24GiB)\n"
          "  --model-config FILE                llm-lora: the model of a Hugging Face config.json\n"
          "                                     (Mistral, Llama incl. 3.2's tied head, Qwen2/2.5)\n"
          "                                     at every scale (plan, run, bench, peer-config;\n"
          "                                     = --set model_config=FILE)\n"
          "  --json                             machine-readable output (plan, list)\n"
          "  --mimic pytorch                    plan: also PyTorch's own step on the card (the\n"
          "                                     mimic of its code path: max_memory_allocated,\n"
          "                                     max_memory_reserved, fits, max batch; llm-lora,\n"
          "                                     seg-ckpt, sd-lora)\n"
          "  --out DIR                          results directory (default results)\n"
          "  --profile                          run/bench: time every operation of the timed\n"
          "                                     steps (a per-operation table in results+report)\n"
          "  --save-every N                     run/bench: a checkpoint every N training steps in\n"
          "                                     OUT/CASE/ckpt/RUNG-repK/ (step-N.ckpt + latest);\n"
          "                                     Ctrl-C then also saves before it stops; stale\n"
          "                                     temporary files of killed saves are removed\n"
          "  --keep-last N                      run/bench: keep the N newest step-N.ckpt of a\n"
          "                                     folder (default 3; 0 keeps every one)\n"
          "  --resume DIR|FILE                  run/bench --step RUNG: continue one repetition from\n"
          "                                     a checkpoint (a folder's latest, or a file)\n");
}

typedef struct {
  const char *cmd, *case_id, *device, *scale, *step, *vram, *results, *out, *kind, *model_config, *resume, *mimic;
  const char *sets[32];
  int nsets, json, n, quiet, quality, size, classes, profile;
  int64_t seed, save_every, keep_last;
  int out_given, device_given, size_given, classes_given, keep_last_given; /* refused where they do not apply */
} args;

/* A numeric option, strictly: the whole argument an integer in [lo, hi] (atoi read "1e3"
 * as 1, "90abc" as 90 and 4294967297 as 1). */
static int num_opt(const char *name, const char *v, int64_t lo, int64_t hi, int64_t *out) {
  if (!v) { fprintf(stderr, "vramlab: %s needs a value\n", name); return -1; }
  vl_parse_status st = vl_parse_i64(v, lo, hi, out);
  if (st == VL_PARSE_OK) return 0;
  fprintf(stderr, "vramlab: %s '%s' %s: expected an integer in [%lld, %lld]\n", name, v, vl_parse_why(st),
          (long long)lo, (long long)hi);
  return -1;
}

static int parse_args(int argc, char **argv, args *a) {
  memset(a, 0, sizeof *a);
  a->device = "auto";
  a->out = "results";
  a->n = 1024;
  a->quality = 90;
  a->seed = 1;
  a->kind = "jpeg";
  a->size = 128;
  a->classes = 5;
  a->keep_last = VL_CKPT_KEEP_LAST_DEFAULT;
  int pos = 0;
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    /* an empty value is never meant: --out "" would write results under "/" */
#define OPT(name, field) if (!strcmp(s, name)) { if (!next || !*next) { fprintf(stderr, "vramlab: %s needs a value\n", name); return -1; } a->field = next; i++; continue; }
    a->device_given |= !strcmp(s, "--device");
    a->size_given |= !strcmp(s, "--size");
    a->classes_given |= !strcmp(s, "--classes");
    OPT("--device", device) OPT("--scale", scale) OPT("--step", step) OPT("--vram", vram)
    OPT("--results", results) OPT("--kind", kind) OPT("--model-config", model_config) OPT("--resume", resume) OPT("--mimic", mimic)
    if (!strcmp(s, "--out")) {
      if (!next || !*next) { fprintf(stderr, "vramlab: --out needs a value\n"); return -1; }
      a->out = next; a->out_given = 1; i++; continue;
    }
#undef OPT
    if (!strcmp(s, "--set")) {
      if (!next) { fprintf(stderr, "vramlab: --set needs key=value\n"); return -1; }
      if (a->nsets >= 32) { fprintf(stderr, "vramlab: too many --set (limit 32)\n"); return -1; }
      a->sets[a->nsets++] = next; i++; continue;
    }
    if (!strcmp(s, "--json")) { a->json = 1; continue; }
    if (!strcmp(s, "--quiet")) { a->quiet = 1; continue; }
    if (!strcmp(s, "--profile")) { a->profile = 1; continue; }
    /* the type's range here; a command narrows it (bench gemm: --n in [16, 16384]) */
    int64_t v;
#define NUM(name, field, lo, hi) \
    if (!strcmp(s, name)) { if (num_opt(name, next, lo, hi, &v)) return -1; a->field = v; i++; continue; }
    NUM("--n", n, 1, INT_MAX) NUM("--seed", seed, 0, INT64_MAX) NUM("--quality", quality, 1, 100)
    NUM("--size", size, VL_SEGSET_SIZE_MIN, VL_SEGSET_SIZE_MAX) NUM("--classes", classes, 2, VL_SEGSET_CLASSES_MAX)
    NUM("--save-every", save_every, 1, INT_MAX)
    if (!strcmp(s, "--keep-last")) {
      if (num_opt(s, next, 0, INT_MAX, &v)) return -1;
      a->keep_last = v; a->keep_last_given = 1; i++; continue;
    }
#undef NUM
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) { usage(stdout); exit(0); }
    if (s[0] == '-') { fprintf(stderr, "vramlab: unknown option '%s'\n", s); return -1; }
    if (pos == 0) a->cmd = s;
    else if (pos == 1) a->case_id = s;
    else { fprintf(stderr, "vramlab: unexpected argument '%s'\n", s); return -1; }
    pos++;
  }
  if (!a->cmd) { usage(stderr); return -1; }
  return 0;
}

static int parse_device(const char *s, vl_device *d) {
  if (!strcmp(s, "auto")) { *d = vl_cuda_available() ? VL_DEV_CUDA : VL_DEV_CPU; return 0; }
  if (!strcmp(s, "cpu")) { *d = VL_DEV_CPU; return 0; }
  if (!strcmp(s, "plan")) { *d = VL_DEV_PLAN; return 0; }
  if (!strcmp(s, "cuda")) {
    if (!vl_cuda_available()) { fprintf(stderr, "vramlab: --device cuda: no CUDA GPU is visible (or this build has no CUDA backend)\n"); return -1; }
    *d = VL_DEV_CUDA;
    return 0;
  }
  fprintf(stderr, "vramlab: unknown device '%s' (auto, cpu, cuda, plan)\n", s);
  return -1;
}

static int valid_scale(const vl_case *c, const char *s) {
  for (int i = 0; c->scales[i]; i++) if (!strcmp(c->scales[i], s)) return 1;
  return 0;
}

/* Load the case and its ladder, apply --set and --vram, validate every rung's knobs: their
 * names against the case's list, then their values through the case's check (which parses
 * every knob the rung's plan and run read, and the setting), so a bad value is refused
 * here and not after the ladder has run. */
static const vl_case *load_case(const args *a, vl_ladder *L) {
  if (!a->case_id) { fprintf(stderr, "vramlab: %s needs a case (try: vramlab list)\n", a->cmd); return NULL; }
  const vl_case *c = vl_case_find(a->case_id);
  if (!c) {
    int n;
    const vl_case *const *all = vl_case_all(&n);
    fprintf(stderr, "vramlab: unknown case '%s'; known:", a->case_id);
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", all[i]->id);
    fprintf(stderr, "\n");
    return NULL;
  }
  vl_err err;
  if (vl_ladder_load(L, VRAMLAB_SOURCE_DIR, c->id, &err)) { fprintf(stderr, "vramlab: %s\n", err.msg); return NULL; }
  for (int i = 0; i < a->nsets; i++)
    if (vl_ladder_set(L, a->sets[i], &err)) { fprintf(stderr, "vramlab: %s\n", err.msg); return NULL; }
  if (a->vram && vl_knob_set_err(&L->setting, "card", a->vram, &err)) {
    fprintf(stderr, "vramlab: --vram: %s\n", err.msg);
    return NULL;
  }
  /* the case's messages: its env's (vl_case_fail), printed here */
  vl_case_env env = {.scale = a->scale ? a->scale : "full", .device = VL_DEV_PLAN, .setting = &L->setting, .quiet = 1};
  if (a->vram && vl_case_check_setting(&env, c, "card") != VL_OK) {
    fprintf(stderr, "vramlab: --vram: %s plans no card memory\n", c->id);
    return NULL;
  }
  /* --model-config is the setting model_config: the case reads (and checks) it like any other */
  if (a->model_config) {
    if (vl_case_check_setting(&env, c, "model_config") != VL_OK) {
      fprintf(stderr, "vramlab: --model-config: %s takes no model config\n", c->id);
      return NULL;
    }
    if (vl_knob_set_err(&L->setting, "model_config", a->model_config, &err)) {
      fprintf(stderr, "vramlab: --model-config: %s\n", err.msg);
      return NULL;
    }
  }
  if (a->scale && !valid_scale(c, a->scale)) { fprintf(stderr, "vramlab: unknown scale '%s' (tiny, small, full)\n", a->scale); return NULL; }
  /* the setting alone first (a rung without knobs), so its errors do not name a rung */
  static const vl_knobs no_knobs;
  if (c->check && c->check(&env, &no_knobs) != VL_OK) { fprintf(stderr, "vramlab: %s\n", env.err.msg); return NULL; }
  for (int i = 0; i < L->n_rungs; i++) {
    if (vl_case_check_knobs(&env, c, L->rungs[i].name, &L->rungs[i].knobs) != VL_OK) {
      fprintf(stderr, "vramlab: %s\n", env.err.msg);
      return NULL;
    }
    if (c->check && c->check(&env, &L->rungs[i].knobs) != VL_OK) {
      fprintf(stderr, "vramlab: rung '%s': %s\n", L->rungs[i].name, env.err.msg);
      return NULL;
    }
  }
  if (a->step && vl_ladder_find(L, a->step) < 0) {
    fprintf(stderr, "vramlab: unknown step '%s' of %s; steps:", a->step, c->id);
    for (int i = 0; i < L->n_rungs; i++) fprintf(stderr, " %s", L->rungs[i].name);
    fprintf(stderr, "\n");
    return NULL;
  }
  return c;
}

static void plan_header(bool mimic) {
  printf("%-10s %6s %9s %9s %9s %10s %9s %8s %5s %9s %6s%s\n", "step", "batch", "params", "trainable", "peak GB",
         "weights GB", "acts GB", "TFLOP", "fits", "max batch", "OOM%",
         mimic ? "  PyTorch: alloc GB  reserved GB  fits  max batch" : "");
}

static int cmd_plan(const args *a) {
  vl_ladder L;
  const vl_case *c = load_case(a, &L);
  if (!c) return 2;
  vl_case_env env = {.scale = a->scale ? a->scale : "full", .device = VL_DEV_PLAN, .setting = &L.setting};
  cJSON *all = cJSON_CreateObject();
  int rc = 0;
  if (a->mimic && strcmp(a->mimic, "pytorch")) {
    fprintf(stderr, "vramlab: --mimic %s: the one framework mimicked is pytorch\n", a->mimic);
    cJSON_Delete(all);
    return 2;
  }
  bool header = false;
  for (int i = 0; i < L.n_rungs; i++) {
    if (a->step && strcmp(a->step, L.rungs[i].name)) continue;
    cJSON *o = cJSON_CreateObject();
    if (c->plan(&env, env.scale, &L.rungs[i].knobs, o) != VL_OK) {
      fprintf(stderr, "vramlab: plan %s: %s\n", L.rungs[i].name, env.err.msg);
      cJSON_Delete(o);
      rc = 1;
      break;
    }
    cJSON *pt = cJSON_GetObjectItem(o, "pytorch");
    if (a->mimic && !pt) {
      fprintf(stderr, "vramlab: --mimic pytorch: %s has no PyTorch mimic (llm-lora, seg-ckpt and sd-lora have)\n", c->id);
      cJSON_Delete(o);
      rc = 2;
      break;
    }
    if (!a->json && !header) plan_header(a->mimic != NULL);
    header = true;
    if (!a->json) {
      /* one row per rung; a metric the case does not plan shows as "-" */
      const struct { const char *key; double div; int w, prec; const char *suffix; } col[] = {
          {"batch", 1, 6, 0, ""},         {"params_total", 1e9, 8, 2, "B"},
          {"params_trainable", 1e6, 8, 2, "M"}, {"peak_bytes", 1e9, 9, 2, ""},
          {"weight_bytes", 1e9, 10, 2, ""}, {"acts_bytes", 1e9, 9, 2, ""},
          {"flops_per_step", 1e12, 8, 1, ""}};
      printf("%-10s", L.rungs[i].name);
      for (size_t k = 0; k < sizeof col / sizeof *col; k++) {
        cJSON *v = cJSON_GetObjectItem(o, col[k].key);
        if (cJSON_IsNumber(v)) printf(" %*.*f%s", col[k].w, col[k].prec, v->valuedouble / col[k].div, col[k].suffix);
        else printf(" %*s%s", col[k].w, "-", *col[k].suffix ? " " : "");
      }
      cJSON *oom = cJSON_GetObjectItem(o, "oom_rate");
      printf(" %5s %9.0f", cJSON_IsTrue(cJSON_GetObjectItem(o, "fits")) ? "yes" : "no",
             cJSON_GetNumberValue(cJSON_GetObjectItem(o, "max_batch")));
      if (cJSON_IsNumber(oom)) printf(" %5.0f%%", 100 * oom->valuedouble);
      else printf(" %6s", "-");
      if (a->mimic && cJSON_GetObjectItem(pt, "not_mimicked"))
        printf("  %s", cJSON_GetStringValue(cJSON_GetObjectItem(pt, "not_mimicked")));
      else if (a->mimic)
        printf("  %17.2f %12.2f %5s %10.0f", cJSON_GetNumberValue(cJSON_GetObjectItem(pt, "max_allocated_bytes")) / 1e9,
               cJSON_GetNumberValue(cJSON_GetObjectItem(pt, "max_reserved_bytes")) / 1e9,
               cJSON_IsTrue(cJSON_GetObjectItem(pt, "fits")) ? "yes" : "no",
               cJSON_GetNumberValue(cJSON_GetObjectItem(pt, "max_batch")));
      printf("\n");
    }
    if (!a->mimic) cJSON_DeleteItemFromObject(o, "pytorch");
    cJSON_DeleteItemFromObject(o, "timeline");
    cJSON_DeleteItemFromObject(o, "batch_curve");
    cJSON_AddItemToObject(all, L.rungs[i].name, o);
  }
  if (a->json && rc == 0) {
    cJSON *single = a->step ? cJSON_DetachItemFromObject(all, a->step) : NULL;
    char *s = cJSON_Print(single ? single : all);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(single);
  }
  cJSON_Delete(all);
  return rc;
}

static int cmd_peer_config(const args *a) {
  vl_ladder L;
  const vl_case *c = load_case(a, &L);
  if (!c) return 2;
  vl_err err;
  cJSON *o = vl_peer_configs(c, &L, a->scale ? a->scale : "small", a->step, omp_get_max_threads(), &err);
  if (!o) {
    fprintf(stderr, "vramlab: peer-config: %s\n", err.msg);
    return 1;
  }
  char *txt = cJSON_Print(o);
  printf("%s\n", txt);
  free(txt);
  cJSON_Delete(o);
  return 0;
}

/* snprintf for a path, which must never be cut (a cut path writes somewhere else): 0, or
 * -1 with "path too long" and the limit on stderr. Paths get PATH_MAX buffers. */
__attribute__((format(printf, 3, 4))) static int path_fmt(char *buf, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf, n, fmt, ap);
  va_end(ap);
  if (k >= 0 && (size_t)k < n) return 0;
  fprintf(stderr, "vramlab: path too long: %.60s... (%d characters, limit %zu)\n", buf, k, n - 1);
  return -1;
}

/* --save-every and --resume: for a case whose run honours them (vl_case.resumable), on a
 * compute device; --resume continues one rung (--step), from ARG resolved to a file into
 * resume. 0, or -1 with the reason on stderr. */
static int ckpt_options(const args *a, const vl_case *c, vl_device dev, char *resume, size_t rn) {
  if (!a->save_every && !a->resume) return 0;
  const char *opt = a->resume ? "--resume" : "--save-every";
  if (!c->resumable) {
    int n;
    const vl_case *const *all = vl_case_all(&n);
    fprintf(stderr, "vramlab: %s: %s has no checkpoints (cases that do:", opt, c->id);
    for (int i = 0; i < n; i++)
      if (all[i]->resumable) fprintf(stderr, " %s", all[i]->id);
    fprintf(stderr, ")\n");
    return -1;
  }
  if (dev == VL_DEV_PLAN) {
    fprintf(stderr, "vramlab: %s: the plan device trains nothing (use --device cpu or cuda)\n", opt);
    return -1;
  }
  if (!a->resume) return 0;
  if (!a->step) {
    fprintf(stderr, "vramlab: --resume continues one rung's run: give --step RUNG\n");
    return -1;
  }
  vl_err err;
  if (vl_ckpt_resolve(a->resume, resume, rn, &err)) {
    fprintf(stderr, "vramlab: --resume: %s\n", err.msg);
    return -1;
  }
  return 0;
}

/* The results into OUT/CASE/<stamp>.json and latest.json. A failed run (a refused --resume,
 * a rung that failed) goes to <stamp>-failed.json alone: the results of the runs before it,
 * latest.json and a stamp of the same second included, stay as they were. */
static int write_results(const char *out, const char *case_id, cJSON *res, bool failed, char *path, size_t pn) {
  char dir[PATH_MAX], latest[PATH_MAX], stamp[32];
  vl_err err;
  time_t t = time(NULL);
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", gmtime(&t));
  /* every path checked before anything is made or written */
  if (path_fmt(dir, sizeof dir, "%s/%s", out, case_id) ||
      path_fmt(path, pn, "%s/%s%s.json", dir, stamp, failed ? "-failed" : "") ||
      path_fmt(latest, sizeof latest, "%s/latest.json", dir))
    return -1;
  if (vl_mkdir_p(dir)) { fprintf(stderr, "vramlab: cannot create %s\n", dir); return -1; }
  char *text = cJSON_Print(res);
  int rc = vl_write_atomic(path, text, &err) ? -1 : 0;
  if (!rc && !failed) rc = vl_write_atomic(latest, text, &err) ? -1 : 0;
  free(text);
  if (rc) fprintf(stderr, "vramlab: %s\n", err.msg);
  return rc;
}

static int cmd_run(const args *a, char *results_path, size_t rn) {
  vl_ladder L;
  const vl_case *c = load_case(a, &L);
  if (!c) return 2;
  vl_device dev;
  if (parse_device(a->device, &dev)) return 2;
  const char *scale = a->scale ? a->scale : (dev == VL_DEV_CUDA ? "full" : "small");
  vl_case_env env = {.scale = scale, .device = dev, .setting = &L.setting, .quiet = a->quiet,
                     .profile = a->profile != 0};
  vl_err err;
  long reps;
  if (vl_knob_int(&L.setting, "reps", vl_harness_settings, 1, 100, &reps, &err)) { fprintf(stderr, "vramlab: %s\n", err.msg); return 2; }
  char resume[PATH_MAX], ckpt_dir[PATH_MAX];
  if (ckpt_options(a, c, dev, resume, sizeof resume)) return 2;
  if (a->resume) {
    env.resume = resume;
    if (reps > 1) vl_progress("resume: one repetition (reps = %ld ignored)", reps);
    reps = 1;
  }
  env.save_every = a->save_every;
  env.keep_last = (long)a->keep_last;
  vl_interrupt_install();

  cJSON *res = cJSON_CreateObject();
  cJSON_AddNumberToObject(res, "schema_version", VL_RESULTS_SCHEMA_VERSION);
  cJSON_AddStringToObject(res, "case", c->id);
  cJSON_AddItemToObject(res, "env", vl_env_json(vl_device_name(dev)));
  cJSON_AddStringToObject(res, "run_scale", scale);
  cJSON *setting = cJSON_AddObjectToObject(res, "setting");
  for (int i = 0; i < L.setting.n; i++) cJSON_AddStringToObject(setting, L.setting.k[i].key, L.setting.k[i].val);
  /* The sgemm reference is taken before and after the ladder and the higher one kept: a
   * shared machine's noise then cannot flatter the model's share of it. */
  double sg0 = 0;
  if (dev == VL_DEV_CPU) {
    vl_progress("measuring sgemm FLOP/s (1024^3, best of 5)");
    sg0 = vl_bench_sgemm(1024, 5);
    env.sgemm_flops = sg0;
  }
  cJSON *rungs = cJSON_AddArrayToObject(res, "rungs");
  int rc = 0;
  for (int i = 0; i < L.n_rungs && !rc; i++) {
    vl_rung *r = &L.rungs[i];
    if (a->step && strcmp(a->step, r->name)) continue;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", r->name);
    cJSON_AddStringToObject(o, "label", r->label);
    cJSON *kn = cJSON_AddObjectToObject(o, "knobs");
    for (int j = 0; j < r->knobs.n; j++) cJSON_AddStringToObject(kn, r->knobs.k[j].key, r->knobs.k[j].val);
    vl_progress("plan %s (full scale)", r->name);
    cJSON *p = cJSON_AddObjectToObject(o, "plan");
    if (c->plan(&env, "full", &r->knobs, p) != VL_OK) {
      fprintf(stderr, "vramlab: plan %s: %s\n", r->name, env.err.msg);
      rc = 1;
    }
    cJSON_AddItemToArray(rungs, o);
  }
  /* Timed runs: whole ladder repeated in interleaved order (A B C .. A B C ..). */
  for (int rep = 0; rep < reps && !rc && !vl_interrupted && dev != VL_DEV_PLAN; rep++) {
    cJSON *o;
    cJSON_ArrayForEach(o, rungs) {
      if (vl_interrupted) break;
      const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(o, "name"));
      vl_rung *r = &L.rungs[vl_ladder_find(&L, name)];
      vl_progress("run %s (%s, %s scale, repetition %d/%ld)", name, vl_device_name(dev), scale, rep + 1, reps);
      cJSON *runs = cJSON_GetObjectItem(o, "runs");
      if (!runs) runs = cJSON_AddArrayToObject(o, "runs");
      /* checkpoints of this rung and repetition in a folder of their own */
      if ((a->save_every || a->resume) &&
          path_fmt(ckpt_dir, sizeof ckpt_dir, "%s/%s/ckpt/%s-rep%d", a->out, c->id, name, rep)) {
        rc = 1;
        break;
      }
      env.ckpt_dir = a->save_every || a->resume ? ckpt_dir : NULL;
      cJSON *ro = cJSON_CreateObject();
      vl_status e = c->run(&env, &r->knobs, rep, ro);
      cJSON_AddItemToArray(runs, ro);
      if (e != VL_OK) {
        fprintf(stderr, "vramlab: run %s: %s\n", name, env.err.msg);
        rc = 1;
        break;
      }
    }
  }
  if (!rc && !vl_interrupted && dev != VL_DEV_PLAN && c->extra && !a->step) {
    if (c->extra(&env, res) != VL_OK) {
      fprintf(stderr, "vramlab: %s: %s\n", c->id, env.err.msg);
      rc = 1;
    }
  }
  if (dev == VL_DEV_CPU) {
    double sg1 = vl_interrupted ? 0 : vl_bench_sgemm(1024, 5);
    cJSON *sg = cJSON_CreateArray();
    cJSON_AddItemToArray(sg, cJSON_CreateNumber(sg0));
    if (sg1 > 0) cJSON_AddItemToArray(sg, cJSON_CreateNumber(sg1));
    cJSON_AddItemToObject(res, "sgemm_samples", sg);
    cJSON_AddNumberToObject(res, "sgemm_flops_per_s", sg1 > sg0 ? sg1 : sg0);
  }
  if (vl_interrupted) cJSON_AddBoolToObject(res, "interrupted", 1);
  bool failed = rc && !vl_interrupted;
  int wrc = write_results(a->out, c->id, res, failed, results_path, rn);
  if (!wrc) vl_progress("results%s: %s", failed ? " of the failed run (latest.json left as it was)" : "", results_path);
  cJSON_Delete(res);
  if (wrc) return 1;
  /* an interrupted run is never a success, whatever it managed to write (a step that
   * stopped on the interrupt reports it as its error: that is not a failure of the run) */
  return vl_interrupted ? VL_EXIT_INTERRUPTED : rc;
}

static int cmd_report(const args *a, const char *path) {
  vl_ladder L;
  const vl_case *c = load_case(a, &L);
  if (!c) return 2;
  char def[PATH_MAX];
  if (!path) {
    if (path_fmt(def, sizeof def, "%s/%s/latest.json", a->out, c->id)) return 2;
    path = def;
  }
  vl_err err = {0};
  char md[PATH_MAX];
  if (path_fmt(md, sizeof md, "%s/reports/%s.md", VRAMLAB_SOURCE_DIR, c->id)) return 2;
  if (vl_report_write(c, &L, path, md, &err)) { fprintf(stderr, "vramlab: report: %s\n", err.msg); return 1; }
  vl_progress("report: %s", md);
  return 0;
}

/* --size and --classes belong to the data sets whose registry row lists them: refused
 * elsewhere (they were silently ignored), naming the kinds that read them. k: the data gen
 * kind, NULL outside data gen. 0, or -1 with the message on stderr. */
static int unread_set_opts(const args *a, const vl_dataset_kind *k) {
  const char *given[] = {a->size_given ? "--size" : NULL, a->classes_given ? "--classes" : NULL};
  for (size_t i = 0; i < sizeof given / sizeof *given; i++) {
    if (!given[i] || (k && vl_dataset_kind_reads(k, given[i]))) continue;
    int n, m = 0;
    const vl_dataset_kind *all = vl_dataset_kinds(&n);
    fprintf(stderr, "vramlab: %s applies to data gen --kind ", given[i]);
    for (int j = 0; j < n; j++)
      if (vl_dataset_kind_reads(&all[j], given[i])) fprintf(stderr, "%s%s", m++ ? "|" : "", all[j].kind);
    fprintf(stderr, " only");
    if (k) fprintf(stderr, " (--kind %s reads %s)", k->kind, k->options);
    fprintf(stderr, "\n");
    return -1;
  }
  return 0;
}

/* Through the data set registry (datagen.h): one row per --kind. */
static int cmd_data_gen(const args *a) {
  if (!a->out_given) { fprintf(stderr, "vramlab: data gen needs --out DIR\n"); return 2; }
  if (a->n < 1 || a->quality < 1 || a->quality > 100 || a->seed < 0) {
    fprintf(stderr, "vramlab: data gen: --n >= 1, --quality in 1..100, --seed >= 0\n");
    return 2;
  }
  const vl_dataset_kind *k = vl_dataset_kind_find(a->kind);
  if (!k) {
    int n;
    const vl_dataset_kind *all = vl_dataset_kinds(&n);
    fprintf(stderr, "vramlab: data gen: unknown --kind '%s' (", a->kind);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? ", " : "", all[i].kind);
    fprintf(stderr, ")\n");
    return 2;
  }
  if (unread_set_opts(a, k)) return 2;
  vl_datagen_opts o = {.out = a->out, .n = a->n, .seed = a->seed, .quality = a->quality, .size = a->size,
                       .classes = a->classes};
  return k->generate(&o);
}

int main(int argc, char **argv) {
  /* the collective benchmarks and a case's per-rank worker parse their own arguments */
  if (argc >= 3 && !strcmp(argv[1], "bench") && vl_collbench_is(argv[2]))
    return vl_collbench_main(argc - 2, argv + 2);
  if (argc >= 2 && !strcmp(argv[1], "worker")) return vl_case_worker_main(argc - 2, argv + 2);
  if (argc >= 2 && !strcmp(argv[1], "regress")) return vl_regress_main(argc - 1, argv + 1);
  if (argc == 2 && !strcmp(argv[1], "index")) {
    vl_err ierr;
    if (vl_index_write(VRAMLAB_SOURCE_DIR "/reports", NULL, &ierr)) {
      fprintf(stderr, "vramlab: index: %s\n", ierr.msg);
      return 1;
    }
    printf("%s/reports/index.md\n", VRAMLAB_SOURCE_DIR);
    return 0;
  }
  args a;
  if (parse_args(argc, argv, &a)) return 2;
  /* an option that would change nothing is refused, not ignored: the user expects a table */
  if (a.profile && strcmp(a.cmd, "run") && strcmp(a.cmd, "bench")) {
    fprintf(stderr, "vramlab: --profile applies to run and bench only\n");
    return 2;
  }
  if (a.mimic && strcmp(a.cmd, "plan")) {
    fprintf(stderr, "vramlab: --mimic applies to plan only (run and bench record it in the plan of each rung)\n");
    return 2;
  }
  if ((a.save_every || a.resume || a.keep_last_given) && strcmp(a.cmd, "run") && strcmp(a.cmd, "bench")) {
    fprintf(stderr, "vramlab: %s applies to run and bench only\n",
            a.resume ? "--resume" : a.save_every ? "--save-every" : "--keep-last");
    return 2;
  }
  if (a.model_config && strcmp(a.cmd, "plan") && strcmp(a.cmd, "run") && strcmp(a.cmd, "bench") &&
      strcmp(a.cmd, "peer-config")) {
    fprintf(stderr, "vramlab: --model-config applies to plan, run, bench and peer-config only\n");
    return 2;
  }
  if (a.device_given && strcmp(a.cmd, "run") && strcmp(a.cmd, "bench")) {
    fprintf(stderr, "vramlab: --device applies to run and bench only (%s runs nothing on a device)\n", a.cmd);
    return 2;
  }
  int is_data_gen = !strcmp(a.cmd, "data") && a.case_id && !strcmp(a.case_id, "gen");
  if (!is_data_gen && unread_set_opts(&a, NULL)) return 2;
  char results[PATH_MAX] = "";
  if (!strcmp(a.cmd, "list")) return vl_cmd_list(a.case_id, a.json);
  if (!strcmp(a.cmd, "plan")) return cmd_plan(&a);
  if (!strcmp(a.cmd, "peer-config")) return cmd_peer_config(&a);
  if (!strcmp(a.cmd, "run")) return cmd_run(&a, results, sizeof results);
  if (!strcmp(a.cmd, "report")) return cmd_report(&a, a.results);
  if (!strcmp(a.cmd, "data")) {
    if (a.case_id && !strcmp(a.case_id, "gen")) return cmd_data_gen(&a);
    fprintf(stderr, "vramlab: data: expected 'data gen --out DIR'\n");
    return 2;
  }
  if (!strcmp(a.cmd, "bench")) {
    if (a.case_id && !strcmp(a.case_id, "gemm")) {
      if (a.save_every || a.resume || a.keep_last_given) { fprintf(stderr, "vramlab: bench gemm trains nothing: no --save-every, --resume or --keep-last\n"); return 2; }
      if (a.n < 16 || a.n > 16384) { fprintf(stderr, "vramlab: --n must be in [16, 16384]\n"); return 2; }
      double f = vl_bench_sgemm(a.n, 5);
      printf("sgemm %dx%dx%d: %.1f GFLOP/s (cpu backend, best of 5)\n", a.n, a.n, a.n, f / 1e9);
      return f > 0 ? 0 : 1;
    }
    int rc = cmd_run(&a, results, sizeof results);
    /* an interrupted run still gets its report (marked, judging only what was measured) */
    if (rc && rc != VL_EXIT_INTERRUPTED) return rc;
    int rrc = cmd_report(&a, results);
    /* the suite's front page: every case's row and the claims that apply to every case */
    vl_err ierr;
    if (!rrc && vl_index_write(VRAMLAB_SOURCE_DIR "/reports", NULL, &ierr))
      fprintf(stderr, "vramlab: reports/index.md: %s\n", ierr.msg);
    else if (!rrc) vl_progress("index: %s/reports/index.md", VRAMLAB_SOURCE_DIR);
    return rc ? rc : rrc;
  }
  fprintf(stderr, "vramlab: unknown command '%s'\n", a.cmd);
  usage(stderr);
  return 2;
}
