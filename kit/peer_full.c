/* PyTorch's own estimator at full scale (#23): MemTracker traces the peer's step on fake
 * tensors (tools/peers/memtracker_peer.py: no memory, no arithmetic, so a 7B step traces on
 * this CPU), beside the mimic of the same code path, and the seconds each planner took. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kit/interrupt.h"
#include "kit/peers.h"
#include "kit/rep.h"
#include "kit/util.h"

/* A rung's setup seen before (two rungs PyTorch's CPU step does not tell apart: llm-lora's cap
 * and baseline): the first rung with it, else NULL. */
static const cJSON *same_as(const cJSON *rows, const cJSON *setup) {
  const cJSON *o;
  cJSON_ArrayForEach(o, rows) {
    const cJSON *s = cJSON_GetObjectItem(o, "setup");
    if (s && cJSON_Compare(s, setup, true)) return o;
  }
  return NULL;
}

vl_status vl_peer_full_scale(vl_case_env *env, cJSON *res, const char *scale, vl_peer_config_fn config,
                             vl_peer_fake_mimic_fn fake) {
  if (env->device == VL_DEV_PLAN) return VL_OK;
  cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
  if (!cm) cm = cJSON_AddObjectToObject(res, "case_metrics");
  cJSON_DeleteItemFromObject(cm, "pytorch_full_scale");
  cJSON *top = cJSON_AddObjectToObject(cm, "pytorch_full_scale");
  cJSON_AddStringToObject(top, "scale", scale);
  cJSON *rows = cJSON_AddArrayToObject(top, "rungs");
  /* a GPU run (the first light's minutes, a GPU runner) holds its card for nothing while the
   * host traces: a CPU bench makes this table, the same on any machine but for the seconds */
  if (env->device != VL_DEV_CPU) {
    cJSON_AddStringToObject(top, "not_measured", "a run on a GPU spends no card time on the host's trace on fake CPU "
                                                 "tensors; a CPU bench makes it");
    return VL_OK;
  }
  /* MemTracker traces on a fake CPU device (this run's), whatever the scale */
  vl_case_env fe = *env;
  fe.scale = scale;
  fe.quiet = 1;
  int threads = omp_get_max_threads();
  const cJSON *rung;
  vl_status s = VL_OK;
  cJSON_ArrayForEach(rung, cJSON_GetObjectItem(res, "rungs")) {
    if (vl_interrupted) break;
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(rung, "name"));
    vl_knobs k;
    if ((s = vl_case_knobs_of(env, rung, &k)) != VL_OK) break;
    cJSON *pc = cJSON_CreateObject(), *o = cJSON_CreateObject();
    cJSON_AddItemToArray(rows, o);
    cJSON_AddStringToObject(o, "rung", name);
    if ((s = config(&fe, &k, threads, pc)) != VL_OK) {
      vl_case_fail(env, s, "%s at scale %s: %s", name, scale, fe.err.msg);
      cJSON_Delete(pc);
      break;
    }
    const cJSON *setup = cJSON_GetObjectItem(pc, "config");
    if (!setup) {
      cJSON_AddStringToObject(o, "not_measured", vl_rep_str(pc, "not_measured"));
      cJSON_Delete(pc);
      continue;
    }
    vl_mimic_result m;
    char why[200];
    if (fake(&fe, &k, &m, why, sizeof why) == VL_OK) {
      /* MemTracker's terms: the batch, made before it tracks, not counted */
      cJSON_AddNumberToObject(o, "mimic_fake_peak_bytes", (double)(m.peak_bytes - m.cat[VL_MC_OTH]));
      cJSON_AddNumberToObject(o, "mimic_seconds", m.seconds);
    } else {
      cJSON_AddStringToObject(o, "mimic_why", why);
    }
    const cJSON *first = same_as(rows, setup);
    cJSON_AddItemToObject(o, "setup", cJSON_Duplicate(setup, true));
    if (first) { /* the same step: its trace is that rung's */
      cJSON_AddStringToObject(o, "same_setup_as", vl_rep_str(first, "rung"));
      const cJSON *e;
      cJSON_ArrayForEach(e, first) if (!strncmp(e->string, "memtracker_", 11))
        cJSON_AddItemToObject(o, e->string, cJSON_Duplicate(e, true));
    } else {
      if (!env->quiet) vl_progress("  MemTracker at %s scale (PyTorch's estimator, fake tensors): %s", scale, name);
      vl_peer_memtracker(vl_rep_str(pc, "script"), setup, o);
    }
    cJSON_Delete(pc);
    /* no PyTorch (or no transformers, peft, ...), or a Python that does not answer: said once,
     * no other rung tried (a step MemTracker refuses is that rung's reason) */
    const char *w = cJSON_GetStringValue(cJSON_GetObjectItem(o, "memtracker_why"));
    if (w && (cJSON_GetObjectItem(o, "missing") || strstr(w, "could not run") || strstr(w, "no reply"))) {
      cJSON_AddStringToObject(top, "not_measured", w);
      break;
    }
  }
  /* the setups served to find repeats; the rung names the step */
  cJSON *o;
  cJSON_ArrayForEach(o, rows) cJSON_DeleteItemFromObject(o, "setup");
  return s;
}

void vl_peer_full_scale_report(const cJSON *res, FILE *md) {
  const cJSON *top = cJSON_GetObjectItem(cJSON_GetObjectItem(res, "case_metrics"), "pytorch_full_scale"), *o;
  if (!top) return;
  const char *scale = vl_rep_str(top, "scale");
  fprintf(md, "### The %s-scale step beside PyTorch's own estimator (MemTracker)\n\n", scale);
  const char *nm = cJSON_GetStringValue(cJSON_GetObjectItem(top, "not_measured"));
  if (nm) {
    fprintf(md, "MemTracker not measured here: %s.\n\n", nm);
    return;
  }
  fprintf(md, "| step | mimic on MemTracker's terms GB (planned) | MemTracker GB (PyTorch's estimator) | mimic vs "
              "MemTracker | mimic ms (measured) | MemTracker s, build + trace (whole process) (measured) | MemTracker / "
              "mimic time |\n"
              "|---|---|---|---|---|---|---|\n");
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(top, "rungs")) {
    const char *rung = vl_rep_str(o, "rung");
    const char *skip = cJSON_GetStringValue(cJSON_GetObjectItem(o, "not_measured"));
    if (skip) {
      fprintf(md, "| %s | not measured here: %s | | | | | |\n", rung, skip);
      continue;
    }
    double mi = vl_rep_num(o, "mimic_fake_peak_bytes"), mt = vl_rep_num(o, "memtracker_peak_bytes");
    double ms = vl_rep_num(o, "mimic_seconds");
    double ts = vl_rep_num(o, "memtracker_build_seconds") + vl_rep_num(o, "memtracker_seconds");
    const char *mw = cJSON_GetStringValue(cJSON_GetObjectItem(o, "memtracker_why"));
    const char *same = cJSON_GetStringValue(cJSON_GetObjectItem(o, "same_setup_as"));
    char pct[32] = "-", ratio[32] = "-", mts[96];
    if (!isnan(mi) && !isnan(mt) && mt > 0) snprintf(pct, sizeof pct, "%+.4f%%", 100 * (mi / mt - 1));
    if (!isnan(ts) && ms > 0) snprintf(ratio, sizeof ratio, "%.0f×", ts / ms);
    if (mw) snprintf(mts, sizeof mts, "-");
    else snprintf(mts, sizeof mts, "%.1f (%.1f)%s", ts, vl_rep_num(o, "memtracker_process_seconds"),
                  same ? ", its trace" : "");
    fprintf(md, "| %s%s%s%s | %s | %s | %s | %s | %s | %s |\n", rung, same ? " (as " : "", same ? same : "",
            same ? ")" : "", isnan(mi) ? "-" : vl_rep_fmt("%.3f", mi / 1e9),
            mw ? "cannot trace it" : vl_rep_fmt("%.3f", mt / 1e9), pct, isnan(ms) ? "-" : vl_rep_fmt("%.1f", 1e3 * ms),
            mts, ratio);
  }
  fprintf(md, "\nMemTracker (`torch.distributed._tools.mem_tracker`, PyTorch's own estimator) traces the step "
              "the case's PyTorch peer runs, built at %s scale on fake tensors of the CPU device (real ops, shapes "
              "and allocations, no memory and no arithmetic), two steps, each rung in a fresh process "
              "(tools/peers/memtracker_peer.py: only MemTracker's total peak is updated on each op, its per-module "
              "peaks, a loop over every module, are left out, which made the small `lora` rung of llm-lora trace "
              "in 3.7 s instead of 9.0); its seconds are measured on this machine in this run, building the "
              "model and tracing (the whole process adds Python's imports). The mimic plans the same code "
              "path (PyTorch's CPU path as it runs on fake tensors), the batch not counted, as MemTracker counts; "
              "its milliseconds are planning on this machine. GB are decimal.",
          scale);
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(top, "rungs")) {
    const char *w = cJSON_GetStringValue(cJSON_GetObjectItem(o, "memtracker_why"));
    const char *mw = cJSON_GetStringValue(cJSON_GetObjectItem(o, "mimic_why"));
    if (w && !cJSON_GetObjectItem(o, "same_setup_as")) fprintf(md, " %s: MemTracker cannot trace it: %s.", vl_rep_str(o, "rung"), w);
    if (mw) fprintf(md, " %s: not mimicked: %s.", vl_rep_str(o, "rung"), mw);
  }
  fprintf(md, "\n\n");
}
