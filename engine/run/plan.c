/* Plan one training step of any vl_model on the plan device: the exact allocation
 * sequence through the arena algorithm, FLOPs and bytes counted by vl_op_run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/run.h"

void vl_step_spec_set_batch(vl_step_spec *s, int64_t B) { s->type->plan_batch(s->cfg, B, &s->batch); }

/* The arena's event log as at most ~800 points, each the max of its window, so the peak
 * survives the thinning. */
static void keep_timeline(const vl_arena *a, vl_plan_result *out) {
  size_t ne;
  const vl_mem_event *ev = vl_arena_log(a, &ne);
  size_t stride = ne / 800 + 1;
  out->timeline = malloc((ne / stride + 1) * sizeof *out->timeline);
  if (!out->timeline) return; /* the plot is left out; the plan itself stands */
  for (size_t i = 0; i < ne; i += stride) {
    size_t mx = ev[i].total;
    for (size_t j = i; j < i + stride && j < ne; j++)
      if (ev[j].total > mx) mx = ev[j].total;
    out->timeline[out->n_timeline++] = (vl_mem_point){ev[i].seq, mx};
  }
}

/* The step on a fresh model: all accum micro-batches when there are at most
 * VL_PLAN_MICRO_MAX, else n - 1 of them, then the last alone (the same allocations as all n
 * at once) to read what one micro-batch adds, then the optimizer update. */
static vl_status plan_micro(vl_model *m, const vl_step_spec *s, vl_plan_result *out) {
  vl_ctx *c = m->c;
  int most = s->plan_micro_max > 0 ? s->plan_micro_max : VL_PLAN_MICRO_MAX;
  int n = s->accum < most ? (int)s->accum : most;
  vl_batch *mb = malloc((size_t)n * sizeof *mb);
  if (!mb) return vl_fail(c, VL_ERR_OOM, "host memory for %d micro-batches", n);
  for (int i = 0; i < n; i++) mb[i] = s->batch;
  vl_step_info info;
  vl_status st;
  double more_f = 0, more_r = 0, more_b = 0; /* what the micro-batches not planned add */
  if (n == s->accum) {
    st = vl_model_step(m, mb, n, &info);
  } else {
    st = vl_model_fwd_bwd(m, mb, n - 1, &info);
    double f0 = c->flops, r0 = c->flops_recompute, b0 = c->bytes_moved;
    if (st == VL_OK) st = vl_model_fwd_bwd(m, mb + n - 1, 1, &info);
    double rest = (double)(s->accum - n);
    more_f = rest * (c->flops - f0);
    more_r = rest * (c->flops_recompute - r0);
    more_b = rest * (c->bytes_moved - b0);
    if (st == VL_OK && !info.skipped) st = vl_model_apply(m, &info);
  }
  free(mb);
  out->flops = c->flops + more_f;
  out->flops_recompute = c->flops_recompute + more_r;
  out->bytes_moved = c->bytes_moved + more_b;
  return st;
}

vl_status vl_run_plan(const vl_step_spec *s, size_t cap, vl_device target, bool timeline,
                      vl_plan_result *out) {
  memset(out, 0, sizeof *out);
  vl_ctx *c;
  out->status = vl_ctx_create_ex(&c, VL_DEV_PLAN, cap, target);
  if (out->status != VL_OK) return out->status;
  vl_model *m = NULL;
  out->status = s->accum >= 1 ? vl_model_create(c, s->type, s->cfg, s->seed, &m)
                              : vl_fail(c, VL_ERR_INVALID, "accum %lld < 1", (long long)s->accum);
  if (out->status == VL_OK) {
    vl_model_params(m, &out->params);
    /* the step only: creating the model is not part of it */
    c->flops = c->flops_recompute = c->bytes_moved = 0;
    vl_arena_log_enable(c->arena, timeline);
    out->status = plan_micro(m, s, out);
    if (timeline) keep_timeline(c->arena, out);
  }
  if (out->status != VL_OK) snprintf(out->err, sizeof out->err, "%s", c->err);
  vl_arena_stats(c->arena, &out->mem);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  return out->status;
}

void vl_plan_result_free(vl_plan_result *r) {
  free(r->timeline);
  r->timeline = NULL;
  r->n_timeline = 0;
}

bool vl_run_fits(const vl_step_spec *s, size_t cap) {
  vl_plan_result p;
  vl_status st = vl_run_plan(s, cap, VL_DEV_CUDA, false, &p);
  return st == VL_OK;
}

void vl_run_plan_check(const vl_step_spec *s, size_t measured_peak, size_t *planned, bool *match) {
  vl_plan_result p;
  vl_status st = vl_run_plan(s, VL_NO_CAP, VL_DEV_CPU, false, &p);
  *planned = p.mem.peak_total;
  *match = st == VL_OK && p.mem.peak_total == measured_peak;
}
