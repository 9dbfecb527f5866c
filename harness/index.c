/* reports/index.md (index.h): the cases' rows and the claims that apply to every case,
 * judged from the results the committed reports were made from. */
#include "index.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kit/proc.h"
#include "ladder.h"
#include "registry.h"
#include "report.h"

#define MAX_CASES 16

typedef struct {
  const vl_case *c;
  vl_ladder L;
  cJSON *res; /* NULL: no results for this case */
  char why[200];
} case_res;

static double gb(double b) { return b / 1e9; }

static const cJSON *rung_at(const cJSON *res, int i) { return cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), i); }
static int n_rungs(const cJSON *res) { return cJSON_GetArraySize(cJSON_GetObjectItem(res, "rungs")); }
static const char *rung_name(const cJSON *r) { return vl_rep_str(r, "name"); }
static const char *knob(const cJSON *r, const char *k) {
  return cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "knobs"), k));
}
static double cat(const cJSON *plan, const char *k) {
  double v = vl_rep_num(cJSON_GetObjectItem(plan, "by_category"), k);
  return isnan(v) ? 0 : v;
}

/* ---- the rows ---------------------------------------------------------------------------- */
static void load_all(const char *reports_dir, case_res *cr, int *n) {
  int nc;
  const vl_case *const *all = vl_case_all(&nc);
  *n = 0;
  for (int i = 0; i < nc && *n < MAX_CASES; i++) {
    case_res *x = &cr[(*n)++];
    memset(x, 0, sizeof *x);
    x->c = all[i];
    char path[1200];
    vl_err err;
    snprintf(path, sizeof path, "%s/%s/results.json", reports_dir, x->c->id);
    if (vl_ladder_load(&x->L, VRAMLAB_SOURCE_DIR, x->c->id, &err)) {
      snprintf(x->why, sizeof x->why, "its ladder does not load");
      continue;
    }
    size_t len;
    char *text = vl_read_file_max(path, VL_RESULTS_MAX_BYTES, &len, &err);
    if (!text) {
      snprintf(x->why, sizeof x->why, "no results yet (`make bench CASE=%s`)", x->c->id);
      continue;
    }
    x->res = cJSON_Parse(text);
    free(text);
    if (!x->res || vl_results_validate(x->res, x->c, &x->L, &err)) {
      snprintf(x->why, sizeof x->why, "its results file is unreadable");
      cJSON_Delete(x->res);
      x->res = NULL;
    }
  }
}

/* Whether the code that makes case id's report changed since commit: "" (no), "stale" (yes,
 * or the report was made from uncommitted code), "unknown" (no git, or an unknown commit). */
static const char *staleness(const char *id, const char *commit) {
  if (!commit || !commit[0] || !strcmp(commit, "unknown")) return "unknown";
  if (strstr(commit, "-dirty")) return "stale";
  char cases_dir[80], out[8];
  snprintf(cases_dir, sizeof cases_dir, "cases/%s", id);
  char *argv[] = {"git", "-C", VRAMLAB_SOURCE_DIR, "diff", "--quiet", (char *)commit, "HEAD", "--", "engine",
                  "datasets", "kit", "harness", cases_dir, "CMakeLists.txt", NULL};
  int rc = vl_run_capture(argv, out, sizeof out);
  return rc == 0 ? "" : rc == 1 ? "stale" : "unknown";
}

static void cases_table(FILE *md, case_res *cr, int n) {
  fprintf(md, "## Cases\n\nArticle claims only (suite checks apart). A row is **stale** when the code that makes "
              "its report (engine, datasets, kit, harness, the case's folder) changed after the commit it was "
              "made from.\n\n| case | device | run scale | date | commit | holds | direction holds | inconclusive | "
              "does not hold | by construction | not measurable | report |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < n; i++) {
    if (!cr[i].res) {
      fprintf(md, "| %s | — | — | — | — | — | — | — | — | — | — | %s |\n", cr[i].c->id, cr[i].why);
      continue;
    }
    vl_tally t;
    vl_report_verdicts(cr[i].c, &cr[i].L, cr[i].res, &t);
    const int *k = t.article;
    const cJSON *env = cJSON_GetObjectItem(cr[i].res, "env");
    char date[16], holds[48];
    snprintf(date, sizeof date, "%.10s", vl_rep_str(env, "time"));
    if (t.on_model[VL_HOLDS]) snprintf(holds, sizeof holds, "%d (%d on a model or stand-in)", k[VL_HOLDS], t.on_model[VL_HOLDS]);
    else snprintf(holds, sizeof holds, "%d", k[VL_HOLDS]);
    const char *st = staleness(cr[i].c->id, cJSON_GetStringValue(cJSON_GetObjectItem(env, "git_commit")));
    fprintf(md, "| %s | %s | %s | %s | %s%s%s | %s | %d | %d | %d | %d | %d | [%s.md](%s.md)%s |\n", cr[i].c->id,
            vl_rep_str(env, "device"), vl_rep_str(cr[i].res, "run_scale"), date, vl_rep_str(env, "git_commit"),
            st[0] ? " **" : "", st[0] ? (strcmp(st, "stale") ? "stale?**" : "stale**") : "", holds,
            k[VL_DIRECTION_HOLDS], k[VL_INCONCLUSIVE], k[VL_DOES_NOT_HOLD], k[VL_BY_CONSTRUCTION],
            k[VL_NOT_MEASURABLE], cr[i].c->id, cr[i].c->id,
            cJSON_IsTrue(cJSON_GetObjectItem(cr[i].res, "interrupted")) ? " (interrupted)" : "");
  }
  fprintf(md, "\n");
}

/* ---- memory composition (000 §1.1) ---------------------------------------------------------- */
static bool in(double x, double lo, double hi) { return x >= lo && x <= hi; }

static void composition(FILE *md, case_res *cr, int n) {
  fprintf(md, "### Memory = parameters + activations + optimizer state + data (000 §1.1)\n\n"
              "The article: on 24 GB, parameters 20–30%%, activations 40–50%%, optimizer state 10–20%%, data "
              "buffers 10–15%%. Below: each case's first and last rung, planned at full scale, as shares of the "
              "planned peak at the moment of the peak. Parameters = trainable + frozen weights; activations = "
              "kept activations + transient intermediates; the article has no row for gradients, nor for library "
              "workspace and collective buckets: they are shown apart.\n\n"
              "| case / rung | planned peak | parameters | activations | optimizer | data | gradients | other | "
              "in the article's ranges | verdict (planned) |\n|---|---|---|---|---|---|---|---|---|---|\n");
  int rows = 0, all4 = 0;
  for (int i = 0; i < n; i++) {
    if (!cr[i].res) continue;
    int nr = n_rungs(cr[i].res);
    for (int j = 0; j < nr; j += (nr > 1 ? nr - 1 : 1)) {
      const cJSON *r = rung_at(cr[i].res, j), *p = vl_rep_plan(r);
      double peak = vl_rep_num(p, "peak_bytes");
      if (!(peak > 0)) continue;
      double par = (cat(p, "frozen") + cat(p, "params")) / peak, act = (cat(p, "acts") + cat(p, "temp")) / peak;
      double opt = cat(p, "optim") / peak, dat = cat(p, "data") / peak, grd = cat(p, "grads") / peak;
      double oth = (cat(p, "workspace") + cat(p, "comm")) / peak;
      int ok = in(par, .20, .30) + in(act, .40, .50) + in(opt, .10, .20) + in(dat, .10, .15);
      rows++;
      all4 += ok == 4;
      fprintf(md, "| %s / %s | %s GB | %s | %s | %s | %s | %s | %s | %d of 4 | %s |\n", cr[i].c->id, rung_name(r),
              vl_rep_fmt("%.2f", gb(peak)), vl_rep_fmt("%.0f%%", 100 * par), vl_rep_fmt("%.0f%%", 100 * act),
              vl_rep_fmt("%.0f%%", 100 * opt), vl_rep_fmt("%.1f%%", 100 * dat), vl_rep_fmt("%.0f%%", 100 * grd),
              vl_rep_fmt("%.0f%%", 100 * oth), ok, vl_verdict_name(ok == 4 ? VL_HOLDS : VL_DOES_NOT_HOLD));
      if (nr == 1) break;
    }
  }
  if (!rows) fprintf(md, "\n**Verdict: %s** — no case has planned results yet.\n\n", vl_verdict_name(VL_NOT_MEASURABLE));
  else
    fprintf(md, "\n**Verdict: %s** (planned) — all four shares fall in the article's ranges in %d of %d configurations. "
                "The composition depends on the model and the knobs (a 7B base model is mostly weights, a "
                "segmentation U-Net at batch 8 mostly activations, input batches are well under 10%% everywhere): "
                "the split is not a rule to budget by; plan the step instead.\n\n",
            vl_verdict_name(all4 == rows ? VL_HOLDS : VL_DOES_NOT_HOLD), all4, rows);
}

/* ---- usable = total x fraction - reserve ----------------------------------------------------- */
static void usable(FILE *md, case_res *cr, int n) {
  fprintf(md, "### Usable memory = total × fraction − reserve (000 §1.1)\n\n"
              "The article: usable = total × allocation fraction − an emergency reserve of 5–10%%; on 24 GB a "
              "fraction of 85–90%% (20.4–21.6 GB). The suite caps its arena at fraction × card, and at most card "
              "minus the CUDA context (which sits outside PyTorch's cap). Each case's last rung:\n\n"
              "| case / rung | card | fraction | context | cap (usable) | planned peak | fits | peak / card |\n"
              "|---|---|---|---|---|---|---|---|\n");
  int rows = 0, fit = 0;
  for (int i = 0; i < n; i++) {
    if (!cr[i].res) continue;
    const cJSON *r = rung_at(cr[i].res, n_rungs(cr[i].res) - 1), *p = vl_rep_plan(r);
    double card = vl_rep_num(p, "card_bytes"), cap = vl_rep_num(p, "cap_bytes"), peak = vl_rep_num(p, "peak_bytes");
    if (isnan(card) || isnan(cap) || isnan(peak)) continue;
    const char *fr = knob(r, "cap_fraction");
    bool fits = cJSON_IsTrue(cJSON_GetObjectItem(p, "fits"));
    rows++;
    fit += fits;
    fprintf(md, "| %s / %s | %s GB | %s | %s GB | %s GB | %s GB | %s | %s |\n", cr[i].c->id, rung_name(r),
            vl_rep_fmt("%.1f", gb(card)), fr ? fr : "1.0", vl_rep_fmt("%.2f", gb(vl_rep_num(p, "cuda_context_bytes"))),
            vl_rep_fmt("%.2f", gb(cap)), vl_rep_fmt("%.2f", gb(peak)), fits ? "yes" : "**no**",
            vl_rep_fmt("%.0f%%", 100 * peak / card));
  }
  if (!rows) fprintf(md, "\n**Verdict: %s** — no case plans for a card yet.\n\n", vl_verdict_name(VL_NOT_MEASURABLE));
  else
    fprintf(md, "\n**Verdict: %s** (configured) — the formula is the suite's own cap model (`cap_fraction` × card, "
                "less the context), so that usable memory follows it echoes a setting and is no evidence for it; "
                "%d of %d last rungs fit under it. The reserve is real: the CUDA context alone is outside every "
                "cap.\n\n",
            vl_verdict_name(VL_BY_CONSTRUCTION), fit, rows);
}

/* ---- FP16 AMP ---------------------------------------------------------------------------------- */
static bool is_half(const char *c) { return c && (!strcmp(c, "fp16") || !strcmp(c, "bf16")); }

/* The article's AMP memory claim as a claim of the report's judge: memory per sample 14.2 GB / 8
 * -> 13.8 GB / 16 (x0.49), planned, 20% tolerance; the magnitude band decides "direction holds". */
static vl_claim amp_claim(void) {
  vl_claim c;
  memset(&c, 0, sizeof c);
  snprintf(c.kind, sizeof c.kind, "ratio");
  c.article_before = 14.2 / 8;
  c.article_after = 13.8 / 16;
  c.tol = 0.2;
  c.lo = c.hi = NAN;
  c.basis = VL_BASIS_PLANNED;
  c.noise_exact = true;
  return c;
}

static void amp(FILE *md, case_res *cr, int n) {
  const vl_claim ac = amp_claim();
  int per[VL_N_VERDICTS] = {0};
  fprintf(md, "### FP16 AMP halves memory and speeds up training (004)\n\n"
              "The article (YOLOv10): FP32 batch 8, 14.2 GB, 120 min → AMP batch 16, 13.8 GB, 75 min (memory per "
              "sample ×0.49, time ×0.63). Every case's AMP rung against the rung before it, at the same batch:\n\n"
              "| case | rungs | planned peak | ratio | activations ratio | memory verdict (planned) | step time ratio "
              "(measured) |\n|---|---|---|---|---|---|---|\n");
  int rows = 0, timed = 0;
  for (int i = 0; i < n; i++) {
    if (!cr[i].res) continue;
    for (int j = 1; j < n_rungs(cr[i].res); j++) {
      const cJSON *a = rung_at(cr[i].res, j - 1), *b = rung_at(cr[i].res, j);
      if (!is_half(knob(b, "compute")) || is_half(knob(a, "compute"))) continue;
      double pa = vl_rep_num(vl_rep_plan(a), "peak_bytes"), pb = vl_rep_num(vl_rep_plan(b), "peak_bytes");
      double aa = vl_rep_num(vl_rep_plan(a), "acts_bytes"), ab = vl_rep_num(vl_rep_plan(b), "acts_bytes");
      double ta = vl_rep_run_metric(a, "step_seconds"), tb = vl_rep_run_metric(b, "step_seconds");
      const char *dev = vl_rep_str(cJSON_GetObjectItem(cr[i].res, "env"), "device");
      char t[120];
      if (!strcmp(dev, "cuda") && ta > 0 && tb > 0) {
        snprintf(t, sizeof t, "×%.2f (measured on %s)", tb / ta, dev);
        timed++;
      }
      else snprintf(t, sizeof t, "not measured here (%s: no fp16 tensor units; a GPU run judges it)", dev);
      double r = pb / pa;
      vl_evidence ev = {pa, pb, NAN, NAN, NAN, NAN};
      vl_judgement j = vl_judge_ev(&ac, &ev);
      rows++;
      per[j.v]++;
      fprintf(md, "| %s | %s → %s | %s → %s GB | ×%s | ×%s | %s%s%s | %s |\n", cr[i].c->id, rung_name(a), rung_name(b),
              vl_rep_fmt("%.2f", gb(pa)), vl_rep_fmt("%.2f", gb(pb)), vl_rep_fmt("%.2f", r),
              vl_rep_fmt("%.2f", ab / aa), vl_verdict_name(j.v), j.why[0] ? ": " : "", j.why, t);
    }
  }
  if (!rows) {
    fprintf(md, "\n**Verdict: %s** — no case with results has an AMP rung.\n\n", vl_verdict_name(VL_NOT_MEASURABLE));
    return;
  }
  fprintf(md, "\n**Verdict on memory (planned), per case:**");
  const char *sep = " ";
  for (int v = 0; v < VL_N_VERDICTS; v++)
    if (per[v]) {
      fprintf(md, "%s%s in %d of %d", sep, vl_verdict_name((vl_verdict)v), per[v], rows);
      sep = "; ";
    }
  fprintf(md, " (the article's ×0.49 per sample within 20%%; **direction holds** at ¼ to 2× its change on a log "
              "scale, as in the reports). There is no single verdict across cases: AMP halves what is stored in "
              "half precision (activations, the working copy of the weights) and adds an fp32 master per trainable "
              "weight; optimizer state and gradients stay fp32, so the whole peak halves only where activations "
              "dominate, and it rises where the weights do (a full fine-tune of a 7B model). **Verdict on speed:** "
              "%s.\n\n",
          timed ? "the measured step time ratios above, against the article's ×0.63 (only where a GPU ran)"
                : "**not measurable here** (no case ran on a GPU: a CPU has no fp16 tensor units)");
}

/* ---- automatic batch + accumulation ----------------------------------------------------------- */
static void autobatch(FILE *md, case_res *cr, int n) {
  fprintf(md, "### Automatic batch size plus accumulation (004)\n\n"
              "The article: fixed batch 8, 8.3 GB, 100 epochs → automatic batch 12 + accumulation 2, 9.1 GB, 80 "
              "epochs. The planner's largest batch under each case's cap (the automatic batch, found exactly by "
              "planning rather than by trial OOMs) against the ladder's first batch:\n\n"
              "| case | first rung batch | largest batch (rung) | accumulation | effective batch | planned peak | "
              "verdict (planned) |\n|---|---|---|---|---|---|---|\n");
  int rows = 0, larger = 0;
  for (int i = 0; i < n; i++) {
    if (!cr[i].res) continue;
    for (int j = 0; j < n_rungs(cr[i].res); j++) {
      const cJSON *r = rung_at(cr[i].res, j), *p = vl_rep_plan(r);
      const char *b = knob(r, "batch");
      if (!b || strcmp(b, "max")) continue;
      double b0 = vl_rep_num(vl_rep_plan(rung_at(cr[i].res, 0)), "batch"), bm = vl_rep_num(p, "batch");
      bool ok = bm > b0 && cJSON_IsTrue(cJSON_GetObjectItem(p, "fits"));
      rows++;
      larger += ok;
      fprintf(md, "| %s | %s | %s (%s) | %s | %s | %s GB | %s |\n", cr[i].c->id, vl_rep_fmt("%.0f", b0),
              vl_rep_fmt("%.0f", vl_rep_num(p, "batch")), rung_name(r), vl_rep_fmt("%.0f", vl_rep_num(p, "accum")),
              vl_rep_fmt("%.0f", vl_rep_num(p, "effective_batch")), vl_rep_fmt("%.2f", gb(vl_rep_num(p, "peak_bytes"))),
              vl_verdict_name(ok ? VL_HOLDS : VL_DOES_NOT_HOLD));
      break;
    }
  }
  if (!rows)
    fprintf(md, "\n**Verdict: %s** — no case with results has an automatic-batch rung.\n\n",
            vl_verdict_name(VL_NOT_MEASURABLE));
  else
    fprintf(md, "\n**Verdict on the batch (planned): %s** — in %d of %d cases the largest batch under the cap is larger "
                "than the fixed first batch and fits; the largest batch and its memory are exact plans at full scale, "
                "not measured. **Verdict on the epochs: %s** — \"80 instead of 100 epochs\" needs training to "
                "convergence on the article's data, which no case here does.\n\n",
            vl_verdict_name(larger == rows ? VL_HOLDS : VL_DOES_NOT_HOLD), larger, rows,
            vl_verdict_name(VL_NOT_MEASURABLE));
}

/* ---- failure handling ------------------------------------------------------------------------ */
static void failures(FILE *md, case_res *cr, int n) {
  fprintf(md, "### Failure handling (002)\n\n"
              "The article: save the state dict only, checkpoint every N steps and resume from the latest, clip "
              "gradients at 1.0, call `empty_cache` between epochs against fragmentation.\n\n");
  fprintf(md, "- **Checkpoint every N steps and resume**: `vramlab run|bench CASE --save-every N` and `--resume DIR` "
              "(llm-lora, seg-ckpt); the resumed loss trajectory is bit-identical to an uninterrupted run "
              "(`test_ckpt`). Ctrl-C finishes the step, saves and writes partial results.\n");
  fprintf(md, "- **Clip at 1.0**:");
  int k = 0;
  for (int i = 0; i < n; i++) {
    const vl_knob_decl *d = vl_case_knob(cr[i].c, "clip", VL_KNOB_RUNG);
    if (d && d->def) fprintf(md, "%s %s clips at %s by default", k++ ? ";" : "", cr[i].c->id, d->def);
  }
  fprintf(md, "%s (global norm, after unscaling, fp16 overflow steps skipped first).\n", k ? "" : " no case has a clip knob");
  fprintf(md, "- **`empty_cache` between epochs**: ");
  int rows = 0;
  for (int i = 0; i < n; i++) {
    if (!cr[i].res) continue;
    const cJSON *p = vl_rep_plan(rung_at(cr[i].res, 0));
    double res = vl_rep_num(p, "reserved_bytes"), peak = vl_rep_num(p, "peak_bytes");
    if (!(res > 0 && peak > 0)) continue;
    fprintf(md, "%s%s %s GB reserved for a %s GB peak (+%s)", rows++ ? "; " : "", cr[i].c->id,
            vl_rep_fmt("%.2f", gb(res)), vl_rep_fmt("%.2f", gb(peak)), vl_rep_fmt("%.1f%%", 100 * (res / peak - 1)));
  }
  if (rows)
    fprintf(md, " (first rungs, planned with the caching allocator's rounding). Emptying the cache returns the "
                "extent above the live blocks to the driver; the next epoch's first step reserves the same extent "
                "again, so it changes neither the peak nor what fits: its only effect is on other processes "
                "sharing the card.\n\n");
  else
    fprintf(md, "not measurable: no planned extent in the results.\n\n");
}

vl_status vl_index_write(const char *reports_dir, const char *regress_line, vl_err *e) {
  static case_res cr[MAX_CASES];
  int n;
  load_all(reports_dir, cr, &n);
  char *buf = NULL;
  size_t len = 0;
  FILE *md = open_memstream(&buf, &len);
  if (!md) return vl_err_set(e, VL_ERR_OOM, "cannot build the index: %s", strerror(errno));
  char stamp[32];
  time_t t = time(NULL);
  strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M UTC", gmtime(&t));
  fprintf(md, "# vramlab — results\n\n_Written by `vramlab bench` and `vramlab regress` (%s) from the results each "
              "report was made from (`reports/<case>/results.json`)._\n\n", stamp);
  cases_table(md, cr, n);
  char rpath[1200];
  snprintf(rpath, sizeof rpath, "%s/regress.md", reports_dir);
  if (regress_line) fprintf(md, "**Regression:** %s\n\n", regress_line);
  else if (access(rpath, F_OK) == 0) fprintf(md, "**Regression:** the last run's table is in [regress.md](regress.md).\n\n");
  else fprintf(md, "**Regression:** not run yet (`make regress`).\n\n");
  fprintf(md, "## Claims that apply to every case\n\nEach verdict uses the reports' words (holds, direction holds, "
              "inconclusive, does not hold, by construction, not measurable here) and names its basis: planned (exact, "
              "full scale), measured (this machine), modeled, configured (echoes a setting).\n\n");
  composition(md, cr, n);
  usable(md, cr, n);
  amp(md, cr, n);
  autobatch(md, cr, n);
  failures(md, cr, n);
  for (int i = 0; i < n; i++) cJSON_Delete(cr[i].res);
  bool ok = !ferror(md);
  if (fclose(md)) ok = false;
  char path[1200];
  snprintf(path, sizeof path, "%s/index.md", reports_dir);
  vl_status rc = !ok || !buf ? vl_err_set(e, VL_ERR_OOM, "cannot build the index: out of memory")
                             : vl_write_atomic(path, buf, e);
  free(buf);
  return rc;
}
