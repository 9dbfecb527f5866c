/* The engine's training scaffolding (vramlab/run.h) as results JSON: the keys every model
 * case writes the same way, so each case.c adds only its own. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "case.h"
#include "peers.h"
#include "rep.h"

static const vl_knob_decl card_knobs[] = {VL_CASE_CARD_KNOBS, {NULL, NULL, NULL, 0}};

vl_status vl_case_card_parse(vl_case_env *env, const vl_knobs *k, vl_case_card *out) {
  const vl_knobs *s = env->setting;
  VL_TRY(vl_knob_bytes(s, "card", card_knobs, &out->card, &env->err));
  /* What lives outside the arena on a GPU (CUDA context, cuBLAS and cuDNN handles):
   * measured on an H200 by the first-light call (VRAMLAB_CUDA_MEMINFO: used - arena at the
   * end of a run), a stand-in for the article's cards; set per case in its ladder. */
  VL_TRY(vl_knob_bytes(s, "cuda_context", card_knobs, &out->context, &env->err));
  VL_TRY(vl_knob_double(k, "cap_fraction", card_knobs, 1e-6, 1.0, &out->cap_fraction, &env->err));
  out->cap = (size_t)((double)out->card * out->cap_fraction);
  if (out->context >= out->card) return vl_case_fail(env, VL_ERR_INVALID, "cuda_context must be smaller than the card");
  if (out->cap > out->card - out->context) out->cap = out->card - out->context;
  return VL_OK;
}

void vl_case_plan_json(cJSON *out, const char *scale, const vl_plan_result *p, int64_t B, int64_t accum) {
  const vl_mem_stats *ms = &p->mem;
  cJSON_AddStringToObject(out, "scale", scale);
  cJSON_AddNumberToObject(out, "params_total", (double)p->params.total);
  cJSON_AddNumberToObject(out, "params_trainable", (double)p->params.trainable);
  cJSON_AddNumberToObject(out, "batch", (double)B);
  cJSON_AddNumberToObject(out, "accum", (double)accum);
  cJSON_AddNumberToObject(out, "effective_batch", (double)(B * accum));
  cJSON_AddNumberToObject(out, "peak_bytes", (double)ms->peak_total);
  cJSON_AddItemToObject(out, "by_category", vl_case_cats_json(ms->at_peak));
  cJSON_AddItemToObject(out, "peak_by_category", vl_case_cats_json(ms->peak));
  cJSON_AddNumberToObject(out, "reserved_bytes", (double)ms->reserved);
  cJSON_AddNumberToObject(out, "weight_bytes", (double)(ms->at_peak[VL_MEM_FROZEN] + ms->at_peak[VL_MEM_PARAMS]));
  cJSON_AddNumberToObject(out, "acts_bytes", (double)ms->peak[VL_MEM_ACTS]);
  cJSON_AddNumberToObject(out, "flops_per_step", p->flops);
  cJSON_AddNumberToObject(out, "flops_recompute", p->flops_recompute);
}

void vl_case_fit_json(cJSON *out, const vl_case_card *card, bool fits, int64_t max_batch, double t_plan,
                      double t_search) {
  cJSON_AddNumberToObject(out, "card_bytes", (double)card->card);
  cJSON_AddNumberToObject(out, "cap_bytes", (double)card->cap);
  cJSON_AddNumberToObject(out, "cuda_context_bytes", (double)card->context);
  cJSON_AddBoolToObject(out, "fits", fits);
  cJSON_AddNumberToObject(out, "max_batch", (double)max_batch);
  cJSON_AddBoolToObject(out, "max_batch_at_search_limit", max_batch >= VL_MAX_BATCH_SEARCH);
  cJSON_AddNumberToObject(out, "plan_seconds", t_plan);
  cJSON_AddNumberToObject(out, "max_batch_search_seconds", t_search);
}

void vl_case_run_json(cJSON *out, const vl_case_env *env, const vl_loop_result *L, const vl_mem_stats *ms,
                      int64_t B, int64_t accum, vl_stats *st) {
  vl_stats_compute(L->times, (int)L->timed, st);
  cJSON_AddStringToObject(out, "scale", env->scale);
  cJSON_AddStringToObject(out, "device", vl_device_name(env->device));
  cJSON_AddNumberToObject(out, "batch", (double)B);
  cJSON_AddNumberToObject(out, "accum", (double)accum);
  cJSON_AddItemToObject(out, "step_time", vl_stats_json(st, L->times, (int)L->timed));
  cJSON_AddNumberToObject(out, "model_flops_per_step", L->flops / (double)L->timed);
  cJSON_AddNumberToObject(out, "flops_per_s", L->flops / (double)L->timed / st->median);
  cJSON_AddItemToObject(out, "loss", cJSON_CreateDoubleArray(L->losses, (int)L->steps));
  cJSON_AddNumberToObject(out, "loss_scale_end", L->loss_scale_end);
  cJSON_AddNumberToObject(out, "measured_peak_bytes", (double)ms->peak_total);
  cJSON_AddItemToObject(out, "measured_by_category", vl_case_cats_json(ms->at_peak));
  if (L->profiled) vl_case_profile_json(out, L);
}

void vl_case_profile_json(cJSON *out, const vl_loop_result *L) {
  double total = 0, in_ops = 0;
  for (long i = 0; i < L->timed; i++) total += L->times[i];
  /* slowest first: the order the report reads them in (ties: the enum's order) */
  int order[VL_OP_COUNT], n = 0;
  for (int i = 0; i < VL_OP_COUNT; i++) {
    if (!L->profile[i].calls) continue;
    int j = n++;
    for (; j > 0 && L->profile[order[j - 1]].seconds < L->profile[i].seconds; j--) order[j] = order[j - 1];
    order[j] = i;
  }
  cJSON *arr = cJSON_AddArrayToObject(out, "profile");
  for (int k = 0; k < n; k++) {
    const vl_op_profile *p = &L->profile[order[k]];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "op", vl_op_name((vl_op)order[k]));
    cJSON_AddNumberToObject(e, "calls", (double)p->calls);
    cJSON_AddNumberToObject(e, "seconds", p->seconds);
    cJSON_AddNumberToObject(e, "flops", p->flops);
    cJSON_AddNumberToObject(e, "bytes", p->bytes);
    /* NaN (written as null) where nothing was timed: "not measured", never a division by 0 */
    cJSON_AddNumberToObject(e, "flops_per_s", p->seconds > 0 ? p->flops / p->seconds : NAN);
    cJSON_AddNumberToObject(e, "share", total > 0 ? p->seconds / total : NAN);
    cJSON_AddItemToArray(arr, e);
    in_ops += p->seconds;
  }
  cJSON_AddNumberToObject(out, "profile_steps", (double)L->timed);
  cJSON_AddNumberToObject(out, "profile_seconds", total);
  cJSON_AddNumberToObject(out, "profile_other_seconds", total - in_ops);
  cJSON_AddNumberToObject(out, "profile_recompute_flops", L->flops_recompute);
}

void vl_case_plan_check_json(cJSON *out, const vl_case_env *env, const vl_step_spec *s, size_t measured_peak) {
  if (env->device != VL_DEV_CPU) return; /* on CUDA the context outside the arena differs */
  size_t planned;
  bool match;
  vl_run_plan_check(s, measured_peak, &planned, &match);
  cJSON_AddNumberToObject(out, "planned_peak_bytes", (double)planned);
  cJSON_AddBoolToObject(out, "plan_matches_measured", match);
}

vl_status vl_case_triage(vl_case_env *env, vl_status s, const char *msg, cJSON *out, bool *ran) {
  *ran = s == VL_OK;
  if (s == VL_OK) return VL_OK;
  if (vl_run_is_oom(s)) {
    /* A rung that does not fit this device is a result, not a failure of the run (the
     * fp32 7B baseline on any single GPU): recorded, and the ladder goes on. */
    cJSON_AddBoolToObject(out, "oom", 1);
    cJSON_AddStringToObject(out, "error", msg);
    if (!env->quiet) vl_progress("  out of memory on %s: %s", vl_device_name(env->device), msg);
    return VL_OK;
  }
  char m[VL_CASE_ERR_LEN]; /* msg may be env->err itself (a helper's message passed on) */
  snprintf(m, sizeof m, "%s", msg);
  vl_case_fail(env, s, "%s at scale %s: %s (%s)", vl_device_name(env->device), env->scale, vl_status_name(s), m);
  cJSON_AddStringToObject(out, "error", env->err.msg);
  if (s == VL_ERR_INTERRUPTED) cJSON_AddBoolToObject(out, "interrupted", 1);
  return s;
}

void vl_case_peer_mimic_json(cJSON *o, vl_status s, const vl_mimic_result *m, const vl_mimic_result *fake,
                             const char *why, bool cuda) {
  if (s != VL_OK) {
    cJSON_AddStringToObject(o, "mimic_why", why);
    return;
  }
  cJSON_AddNumberToObject(o, "mimic_peak_bytes", (double)(cuda ? m->max_allocated : m->peak_bytes));
  /* MemTracker's terms: its fake-tensor code path, the batch (made before it tracks) not counted */
  if (fake) cJSON_AddNumberToObject(o, "mimic_fake_peak_bytes", (double)(fake->peak_bytes - fake->cat[VL_MC_OTH]));
  if (cuda) cJSON_AddNumberToObject(o, "mimic_max_reserved_bytes", (double)m->max_reserved);
  cJSON_AddStringToObject(o, "mimic_code_path", cuda ? "cuda" : "cpu");
  cJSON_AddNumberToObject(o, "mimic_seconds", m->seconds);
}

void vl_case_pytorch_json(cJSON *out, vl_case_mimic_fn run, const void *cfg, int64_t batch, uint64_t cap,
                          const char *code_path) {
  cJSON *o = cJSON_AddObjectToObject(out, "pytorch");
  vl_mimic_result m, capped;
  char why[200];
  vl_status s = run(cfg, batch, 0, &m, why, sizeof why);
  if (s == VL_OK) s = run(cfg, batch, cap, &capped, why, sizeof why);
  if (s != VL_OK) {
    cJSON_AddStringToObject(o, "not_mimicked", why);
    return;
  }
  cJSON_AddStringToObject(o, "code_path", code_path);
  cJSON_AddNumberToObject(o, "peak_bytes", (double)m.peak_bytes);
  cJSON_AddNumberToObject(o, "max_allocated_bytes", (double)m.max_allocated);
  cJSON_AddNumberToObject(o, "max_reserved_bytes", (double)m.max_reserved);
  cJSON_AddBoolToObject(o, "fits", !capped.oom);
  char ph[2] = {m.peak_phase, 0};
  cJSON_AddStringToObject(o, "peak_phase", ph);
  cJSON_AddStringToObject(o, "peak_op", m.peak_op);
  cJSON *cat = cJSON_AddObjectToObject(o, "categories");
  for (int i = 0; i < VL_MC_N; i++) cJSON_AddNumberToObject(cat, vl_mimic_cat_name(i), (double)m.cat[i]);
  cJSON_AddNumberToObject(o, "plan_seconds", m.seconds);
  double t0 = vl_now();
  int64_t lo = 0, hi = 4097; /* lo fits (0: nothing does), hi does not */
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (run(cfg, mid, cap, &capped, why, sizeof why) == VL_OK && !capped.oom) lo = mid;
    else hi = mid;
  }
  cJSON_AddNumberToObject(o, "max_batch", (double)lo);
  cJSON_AddNumberToObject(o, "max_batch_search_seconds", vl_now() - t0);
}

const char *vl_case_batch_cell(const cJSON *p, const char *key, char *b, size_t n) {
  double v = vl_rep_num(p, key);
  if (isnan(v)) snprintf(b, n, "—");
  else if (v == 0) snprintf(b, n, "none fits");
  else snprintf(b, n, "%s%.0f", v >= VL_MAX_BATCH_SEARCH ? "≥" : "", v);
  return b;
}

void vl_case_pytorch_report(const cJSON *res, FILE *md, const char *replays, const char *note) {
  const cJSON *r;
  int any = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs"))
    any |= cJSON_IsObject(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "plan"), "pytorch"));
  if (!any) return;
  double G = 1e9;
  fprintf(md, "## PyTorch's own step on the card (planned, mimic)\n\n"
              "| step | engine: peak GB | engine: fits | engine: max batch | PyTorch: peak tensors GB | "
              "max_memory_allocated GB | max_memory_reserved GB | PyTorch: fits | PyTorch: max batch | what PyTorch "
              "keeps at its peak | mimic ms (step / search) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs")) {
    const cJSON *p = cJSON_GetObjectItem(r, "plan"), *t = cJSON_GetObjectItem(p, "pytorch");
    char m1[32], m2[32];
    fprintf(md, "| %s | %s | %s | %s | ", vl_rep_str(r, "name"), vl_rep_fmt("%.2f", vl_rep_num(p, "peak_bytes") / G),
            vl_rep_yes_no(cJSON_GetObjectItem(p, "fits")), vl_case_batch_cell(p, "max_batch", m1, sizeof m1));
    const char *why = cJSON_GetStringValue(cJSON_GetObjectItem(t, "not_mimicked"));
    if (!t || why) {
      fprintf(md, "%s | | | | | | |\n", why ? why : "not planned");
      continue;
    }
    const cJSON *c = cJSON_GetObjectItem(t, "categories");
    fprintf(md, "%s | %s | %s | %s | %s | params %s, grads %s, optimizer %s, activations %s, temporaries %s GB (%s, %s) "
                "| %s / %s |\n",
            vl_rep_fmt("%.2f", vl_rep_num(t, "peak_bytes") / G), vl_rep_fmt("%.2f", vl_rep_num(t, "max_allocated_bytes") / G),
            vl_rep_fmt("%.2f", vl_rep_num(t, "max_reserved_bytes") / G), vl_rep_yes_no(cJSON_GetObjectItem(t, "fits")),
            vl_case_batch_cell(t, "max_batch", m2, sizeof m2), vl_rep_fmt("%.2f", vl_rep_num(c, "PARAM") / G),
            vl_rep_fmt("%.2f", vl_rep_num(c, "GRAD") / G), vl_rep_fmt("%.2f", vl_rep_num(c, "OPT") / G),
            vl_rep_fmt("%.2f", vl_rep_num(c, "ACT") / G), vl_rep_fmt("%.2f", vl_rep_num(c, "TEMP") / G),
            !strcmp(vl_rep_str(t, "peak_phase"), "o") ? "in the optimizer step"
            : !strcmp(vl_rep_str(t, "peak_phase"), "b") ? "in backward" : "in forward",
            vl_rep_str(t, "peak_op"), vl_rep_fmt("%.1f", 1e3 * vl_rep_num(t, "plan_seconds")),
            vl_rep_fmt("%.1f", 1e3 * vl_rep_num(t, "max_batch_search_seconds")));
  }
  fprintf(md, "\nThe PyTorch columns replay, without running it, the step %s on its CUDA code path: autograd's "
              "saved tensors as each ATen op saves them, the autocast weight cache, the fp32 loss inputs, the "
              "optimizer's state created on the first step and its foreach temporaries (AdamW's parameter-sized "
              "`_foreach_sqrt`), then the CUDA caching allocator's 512-byte blocks and 2/20 MiB segments for "
              "`max_memory_allocated` and `max_memory_reserved` (`vramlab plan CASE --mimic pytorch`). Fits: the "
              "caching allocator, which frees its cached segments and retries before it fails, stays under the "
              "rung's cap. Planned, full scale, two steps; held to PyTorch's own traces op by op and to MemTracker "
              "on the CPU (tests/test_mimic.c). %s\n\n", replays, note);
  vl_peer_full_scale_report(res, md);
}

