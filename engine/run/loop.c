/* The timed training loop over any vl_model: warm-up steps, then timed ones, each timed at
 * its edges by the backend (CUDA events on a GPU, the monotonic clock on a CPU); checkpoints
 * at step edges (every N steps, and where an interrupt stops the loop) and the resume that
 * continues from one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/run.h"

/* Room for `need` steps in losses and times. */
static vl_status reserve(vl_ctx *c, vl_loop_result *r, long need) {
  if (need <= r->cap) return VL_OK;
  long cap = r->cap ? 2 * r->cap : 64;
  while (cap < need) cap *= 2;
  double *l = realloc(r->losses, (size_t)cap * sizeof *l);
  if (!l) return vl_fail(c, VL_ERR_OOM, "host memory for %ld step results", cap);
  r->losses = l;
  double *t = realloc(r->times, (size_t)cap * sizeof *t);
  if (!t) return vl_fail(c, VL_ERR_OOM, "host memory for %ld step times", cap);
  r->times = t;
  r->cap = cap;
  return VL_OK;
}
/* Room for one more step. */
static vl_status grow(vl_ctx *c, vl_loop_result *r) { return reserve(c, r, r->steps + 1); }

/* A checkpoint at the edge after res->steps steps into cfg->save_dir. */
static vl_status save(vl_model *m, const vl_loop_cfg *cfg, vl_loop_result *res) {
  vl_ctx *c = m->c;
  double t0 = vl_now();
  vl_ckpt_meta meta = {.step = res->steps, .n_losses = res->steps, .losses = res->losses, .skipped = res->skipped};
  const char *tag = cfg->ckpt_tag ? cfg->ckpt_tag : "";
  if (strlen(tag) >= sizeof meta.tag)
    return vl_fail(c, VL_ERR_INVALID, "checkpoint tag '%.40s...' is longer than %zu characters", tag,
                   sizeof meta.tag - 1);
  snprintf(meta.tag, sizeof meta.tag, "%s", tag);
  void *blob = NULL;
  size_t len = 0;
  if (cfg->save_state) VL_TRY(cfg->save_state(cfg->user, res->steps, &blob, &len));
  meta.blob = blob;
  meta.blob_len = len;
  meta.settings = cfg->ckpt_settings;
  vl_status s = vl_ckpt_save_dir(m, cfg->save_dir, &meta, cfg->keep_last, res->saved_path, sizeof res->saved_path);
  free(blob);
  if (s != VL_OK) return s;
  res->saves++;
  res->saved_step = res->steps;
  res->save_seconds += vl_now() - t0;
  return VL_OK;
}

/* Stopped by cfg->stop at a step edge: save there (unless just saved), then
 * VL_ERR_INTERRUPTED with a message that says where the state went. */
static vl_status interrupted(vl_model *m, const vl_loop_cfg *cfg, vl_loop_result *res) {
  vl_ctx *c = m->c;
  if (!cfg->save_dir) return vl_fail(c, VL_ERR_INTERRUPTED, "interrupted");
  if (!(res->saves && res->saved_step == res->steps) && save(m, cfg, res) != VL_OK) {
    char why[sizeof c->err];
    snprintf(why, sizeof why, "%s", c->err);
    return vl_fail(c, VL_ERR_INTERRUPTED, "interrupted after step %ld; saving a checkpoint failed: %s", res->steps,
                   why);
  }
  return vl_fail(c, VL_ERR_INTERRUPTED, "interrupted after step %ld; checkpoint %s", res->steps, res->saved_path);
}

/* The step before which nothing is timed: cfg->warmup, and after a resume one more warm-up
 * step at the resumed edge. */
static long warm_end(const vl_loop_cfg *cfg, const vl_loop_result *res) {
  long w = cfg->warmup;
  if (res->resumed_from > 0 && cfg->warmup > 0 && w < res->resumed_from + 1) w = res->resumed_from + 1;
  return w;
}

vl_status vl_run_loop(vl_model *m, const vl_loop_cfg *cfg, vl_loop_result *res) {
  vl_ctx *c = m->c;
  long warm = warm_end(cfg, res);
  while (cfg->total < 0 || res->steps < cfg->total) {
    if (cfg->stop && *cfg->stop) return interrupted(m, cfg, res);
    VL_TRY(grow(c, res));
    double t0 = vl_now(), wait = 0;
    const vl_batch *mb = NULL;
    int n = 0;
    VL_TRY(cfg->next(cfg->user, res->steps, &mb, &n, &wait));
    if (n == 0) break; /* the end of the data */
    bool timed = res->steps >= warm;
    if (res->steps == warm && cfg->reset_peaks_after_warmup) vl_arena_reset_peaks(c->arena);
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
    c->stop_ops = cfg->stop_now;
    if (s == VL_OK) s = vl_model_step(m, mb, n, &info);
    c->stop_ops = NULL;
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
    if (cfg->save_dir && cfg->save_every > 0 && res->steps % cfg->save_every == 0) VL_TRY(save(m, cfg, res));
  }
  return VL_OK;
}

vl_status vl_run_resume(vl_model *m, const char *path, const char *tag, const char *settings, vl_loop_result *res,
                        vl_ckpt_meta *meta) {
  vl_ctx *c = m->c;
  memset(meta, 0, sizeof *meta);
  if (res->steps)
    return vl_fail(c, VL_ERR_INVALID, "resume from %s into a loop that has taken %ld steps already", path, res->steps);
  VL_TRY(vl_ckpt_load(m, path, tag, settings, meta));
  vl_status s = reserve(c, res, meta->step + 1);
  vl_train_state ts;
  if (s == VL_OK) s = vl_model_train_state(m, &ts);
  if (s != VL_OK) {
    vl_ckpt_meta_free(meta);
    return s;
  }
  if (meta->step) memcpy(res->losses, meta->losses, (size_t)meta->step * sizeof *res->losses);
  res->steps = meta->step;
  res->skipped = meta->skipped;
  res->resumed_from = meta->step;
  res->loss_scale_end = ts.scaler->scale;
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
