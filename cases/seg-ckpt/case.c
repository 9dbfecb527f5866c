/* seg-ckpt: ResNet-101 U-Net segmentation with activation checkpointing (docs/cases.md §2).
 * Memory, FLOPs, fit, largest batch and the memory-vs-batch line come from the plan backend
 * at the scale asked (full = the article's 512x512, batch 8); step time, images/s, the
 * data-wait share and held-out accuracy from real training at the run scale (run.c), fed by
 * the engine's loader from a synthetic JPEG segmentation set (decoded every epoch, kit/segrung_data.c).
 * The scaffolding (plan, search, timed loop, OOM triage, planned-equals-measured,
 * interleaved repetitions) is the engine's (vramlab/run.h); knobs map to a model config in
 * kit/segrung.c. This file holds the plan, the check and the case itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "seg_torch.h"
#include "seg.h"

/* ---- planning ---------------------------------------------------------------------------- */
/* Memory vs batch: planned peaks, the fitted line base + batch x per_sample, and the batch
 * that line predicts under the cap against the planner's exact answer (mb). */
static vl_status curve_json(vl_case_env *env, const vl_segrung *r, int64_t mb, cJSON *out) {
  int64_t top = mb > 8 ? mb + mb / 4 + 2 : 16;
  int np = (int)(top < r->curve_points ? top : r->curve_points);
  double *xs = calloc((size_t)np, sizeof *xs), *ys = calloc((size_t)np, sizeof *ys);
  if (!xs || !ys) { free(xs); free(ys); return vl_case_fail(env, VL_ERR_OOM, "host memory"); }
  cJSON *curve = cJSON_AddArrayToObject(out, "batch_curve");
  int got = 0;
  for (int i = 0; i < np; i++) {
    int64_t b = 2 + (int64_t)((double)i * (double)(top - 2) / (double)(np > 1 ? np - 1 : 1));
    if (got && b <= (int64_t)xs[got - 1]) continue;
    vl_plan_result q;
    vl_step_spec s = vl_segrung_step_spec(r, b, 1);
    if (vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &q) != VL_OK) break;
    xs[got] = (double)b;
    ys[got++] = (double)q.mem.peak_total;
    cJSON_AddItemToArray(curve, cJSON_CreateDoubleArray((double[2]){(double)b, (double)q.mem.peak_total}, 2));
  }
  double a = 0, bb = 0, r2 = 0;
  if (got >= 2) vl_case_linfit(xs, ys, got, &a, &bb, &r2);
  free(xs);
  free(ys);
  cJSON_AddNumberToObject(out, "fit_base_bytes", a);
  cJSON_AddNumberToObject(out, "fit_per_sample_bytes", bb);
  cJSON_AddNumberToObject(out, "fit_r2", r2);
  double pred = bb > 0 ? floor(((double)r->card.cap - a) / bb) : 0;
  cJSON_AddNumberToObject(out, "fit_predicted_max_batch", pred);
  cJSON_AddNumberToObject(out, "exact_vs_linear", pred > 0 ? (double)mb / pred : 0);
  return VL_OK;
}

/* the mimic of seg_peer.py's step on CUDA (vl_case_pytorch_json's run) */
static vl_status mimic_cuda(const void *cfg, int64_t batch, uint64_t capacity, vl_mimic_result *r, char *why,
                            size_t whyn) {
  const vl_segrung *q = cfg;
  vl_mimic_resunet_cfg c = vl_segcase_mimic_cfg(q, batch, VL_MIMIC_CUDA);
  c.capacity = capacity;
  return vl_mimic_resunet(&c, r, NULL, NULL, why, whyn);
}

static vl_status seg_plan(vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out) {
  vl_segrung r;
  VL_TRY(vl_segrung_parse(env, scale, k, &r));
  double t0 = vl_now();
  int64_t mb = vl_segrung_max_batch(&r);
  double t_search = vl_now() - t0;
  if (r.batch == 0) r.batch = mb > 0 ? mb : 2;
  int64_t B = r.batch;
  vl_plan_result p;
  vl_step_spec spec = vl_segrung_step_spec(&r, B, r.accum), one = vl_segrung_step_spec(&r, B, 1);
  double t1 = vl_now();
  vl_run_plan(&spec, VL_NO_CAP, VL_DEV_CUDA, false, &p);
  double t_plan = vl_now() - t1;
  if (p.status != VL_OK) return vl_case_fail(env, p.status, "planning failed: %s", p.err);
  const vl_mem_stats *ms = &p.mem;
  vl_case_plan_json(out, scale, &p, B, r.accum);
  cJSON_AddNumberToObject(out, "image", (double)r.model.mc.image);
  cJSON *pm = cJSON_AddObjectToObject(out, "params_by_module");
  for (int i = 0; i < p.params.n_modules; i++)
    cJSON_AddNumberToObject(pm, p.params.module_name[i], (double)p.params.module_count[i]);
  /* "model memory": what the weights cost to train (weights, masters, grads, optimizer) */
  double model = (double)(ms->at_peak[VL_MEM_PARAMS] + ms->at_peak[VL_MEM_FROZEN] +
                          ms->at_peak[VL_MEM_GRADS] + ms->at_peak[VL_MEM_OPTIM]);
  cJSON_AddNumberToObject(out, "model_bytes", model);
  /* the activation category's peak over the step's peak (000 §2.2: "40%+" in deep models) */
  cJSON_AddNumberToObject(out, "acts_share",
                          ms->peak_total ? (double)ms->at_peak[VL_MEM_ACTS] / (double)ms->peak_total : 0);
  cJSON_AddNumberToObject(out, "fragmentation_at_end", ms->fragmentation);
  /* allocator extent beyond the live peak: what fragmentation costs this step */
  cJSON_AddNumberToObject(out, "extent_overhead",
                          ms->peak_total ? (double)ms->reserved / (double)ms->peak_total - 1.0 : 0);
  cJSON_AddNumberToObject(out, "recompute_share", p.flops > 0 ? p.flops_recompute / p.flops : 0);
  vl_case_fit_json(out, &r.card, vl_run_fits(&one, r.card.cap), mb, t_plan, t_search);
  cJSON_AddNumberToObject(out, "max_effective_batch", (double)(mb * r.accum));
  vl_case_pytorch_json(out, mimic_cuda, &r, B, r.card.cap,
                       "torchvision Bottleneck U-Net + torch.utils.checkpoint + torch.autocast + AdamW on CUDA (mimic)");
  return curve_json(env, &r, mb, out);
}

/* Every knob of a rung and the setting, without planning or running. */
static vl_status seg_check(vl_case_env *env, const vl_knobs *k) {
  vl_segrung r;
  return vl_segrung_parse(env, env->scale, k, &r);
}

/* What plan, run and extra write at the top level of a rung's plan or run. */
static const char *const metrics[] = {
    "image", "params_total", "params_trainable", "batch", "accum", "effective_batch", "peak_bytes", "acts_bytes",
    "model_bytes", "acts_share", "weight_bytes", "fragmentation_at_end", "reserved_bytes", "extent_overhead", "flops_per_step",
    "flops_recompute", "recompute_share", "card_bytes", "cap_bytes", "cuda_context_bytes", "fits", "max_batch",
    "max_effective_batch", "max_batch_at_search_limit", "plan_seconds", "max_batch_search_seconds",
    "fit_base_bytes", "fit_per_sample_bytes", "fit_r2", "fit_predicted_max_batch", "exact_vs_linear", "oom",
    "workers", "step_seconds", "sec_per_image", "images_per_s", "data_wait_share", "compute_share",
    "sec_per_batch_data", "model_flops_per_step", "flops_per_s", "optimizer_steps", "images_seen", "run_seconds",
    "pixel_accuracy", "miou", "skipped_steps", "loss_scale_end", "measured_peak_bytes", "measured_acts_bytes",
    "measured_fragmentation", "planned_peak_bytes", "plan_matches_measured", "interleaved_step_seconds",
    /* the extra hook's PyTorch side by side (seg_torch.c), on the compared rungs' first runs */
    "peer_step_seconds", "speedup_vs_torch", "peer_peak_bytes", NULL};

static const char *const scales[] = {"tiny", "small", "full", NULL};

/* After the ladder: checkpointing's cost with the models in turn (interleaved.c), then the
 * before and relu_off rungs beside PyTorch (seg_torch.c). */
static vl_status seg_extra(vl_case_env *env, cJSON *res) {
  VL_TRY(vl_segcase_interleaved(env, res));
  VL_TRY(vl_segcase_peers(env, res));
  return vl_segcase_full_scale(env, res, "full");
}

const vl_case vl_case_seg_ckpt = {
    .id = "seg-ckpt",
    .summary = "ResNet-101 U-Net segmentation, 512x512 batch 8 on 24 GB: checkpointing -> ReLU in-place off -> accumulation 4 -> AMP -> loader -> largest batch",
    .knobs = vl_segrung_knobs,
    .scales = scales,
    .metrics = metrics,
    .check = seg_check,
    .plan = seg_plan,
    .run = vl_segcase_run,
    .resumable = true, /* --save-every / --resume (run.c) */
    .extra = seg_extra,
    .peer_config = vl_segcase_peer_config,
    .method = "Memory, FLOPs, fit, largest batch and the memory-vs-batch line are **planned at full "
              "scale** (512x512 images, torchvision-exact ResNet-101 encoder, U-Net decoder) by the "
              "plan backend, which runs a training step's exact allocation sequence through the "
              "arena with a CUDA card's workspace rules. Step time, images/s, the data-wait share "
              "and held-out pixel accuracy / mIoU are measured by training each rung for the same "
              "number of epochs (the same images, in the same seeded order) at the run scale, fed "
              "by the engine's loader, which decodes the synthetic JPEG set every epoch. The before and "
              "relu_off rungs are then run side by side with the same step in PyTorch when it is installed.",
    .report = vl_segcase_report,
};
