/* The timed training loop over any vl_model: warm-up steps, then timed ones, each timed at
 * its edges by the backend (CUDA events on a GPU, the monotonic clock on a CPU). */
#include <stdlib.h>
#include <string.h>

#include "vramlab/run.h"

/* Room for one more step in losses and times. */
static vl_status grow(vl_ctx *c, vl_loop_result *r) {
  if (r->steps < r->cap) return VL_OK;
  long cap = r->cap ? 2 * r->cap : 64;
  double *l = realloc(r->losses, (size_t)cap * sizeof *l);
  if (!l) return vl_fail(c, VL_ERR_OOM, "host memory for %ld step results", cap);
  r->losses = l;
  double *t = realloc(r->times, (size_t)cap * sizeof *t);
  if (!t) return vl_fail(c, VL_ERR_OOM, "host memory for %ld step times", cap);
  r->times = t;
  r->cap = cap;
  return VL_OK;
}

vl_status vl_run_loop(vl_model *m, const vl_loop_cfg *cfg, vl_loop_result *res) {
  vl_ctx *c = m->c;
  while (cfg->total < 0 || res->steps < cfg->total) {
    if (cfg->stop && *cfg->stop) return vl_fail(c, VL_ERR_INTERRUPTED, "interrupted");
    VL_TRY(grow(c, res));
    double t0 = vl_now(), wait = 0;
    const vl_batch *mb = NULL;
    int n = 0;
    VL_TRY(cfg->next(cfg->user, res->steps, &mb, &n, &wait));
    if (n == 0) break; /* the end of the data */
    bool timed = res->steps >= cfg->warmup;
    if (res->steps == cfg->warmup && cfg->reset_peaks_after_warmup) vl_arena_reset_peaks(c->arena);
    vl_step_info info;
    double dt = 0, recompute0 = c->flops_recompute;
    c->flops = 0; /* this step's model FLOPs */
    /* The context's counters hold one step at a time and are summed here, so a case that
     * runs the loop epoch by epoch profiles every timed step and nothing between them. */
    bool prof = cfg->profile && timed, was = c->profile;
    if (prof) {
      vl_ctx_profile_reset(c);
      c->profile = true;
    }
    vl_status s = c->be->timer_start(c);
    if (s == VL_OK) s = vl_model_step(m, mb, n, &info);
    if (s == VL_OK) s = c->be->timer_stop(c, &dt);
    c->profile = was;
    if (s != VL_OK) return s;
    double wall = vl_now() - t0;
    const vl_op_profile *op = vl_ctx_profile(c);
    if (prof && op) {
      res->profiled = true;
      for (int i = 0; i < VL_OP_COUNT; i++) {
        res->profile[i].calls += op[i].calls;
        res->profile[i].seconds += op[i].seconds;
        res->profile[i].flops += op[i].flops;
        res->profile[i].bytes += op[i].bytes;
      }
    }
    res->losses[res->steps] = info.loss;
    res->loss_scale_end = info.loss_scale;
    res->skipped += info.skipped;
    if (timed) {
      res->times[res->timed++] = dt;
      res->flops += c->flops;
      res->flops_recompute += c->flops_recompute - recompute0;
      res->wall += wall;
      res->wait += wait;
      res->targets += info.n_targets;
      res->skipped_timed += info.skipped;
    }
    if (cfg->after) cfg->after(cfg->user, res->steps, timed, &info, dt, wait);
    res->steps++;
  }
  return VL_OK;
}

void vl_loop_result_free(vl_loop_result *r) {
  free(r->losses);
  free(r->times);
  memset(r, 0, sizeof *r);
}

vl_status vl_run_interleaved(vl_model *const *m, int n, const vl_batch *b, int warm, int rounds,
                             const volatile sig_atomic_t *stop, double *times) {
  for (int round = 0; round < warm + rounds; round++)
    for (int i = 0; i < n; i++) {
      vl_ctx *c = m[i]->c;
      if (stop && *stop) return vl_fail(c, VL_ERR_INTERRUPTED, "interrupted");
      vl_step_info info;
      double dt = 0;
      VL_TRY(c->be->timer_start(c));
      VL_TRY(vl_model_step(m[i], b, 1, &info));
      VL_TRY(c->be->timer_stop(c, &dt));
      if (round >= warm) times[i * rounds + round - warm] = dt;
    }
  return VL_OK;
}
