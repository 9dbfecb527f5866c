/* dataloader's case-wide measurements after the ladder (the extra hook): the decode-only
 * ceiling on one core, the workers x prefetch sweep with its best setting, and the PyTorch
 * DataLoader references over the same set when PyTorch is installed: torchvision/PIL, and
 * torchvision.io.decode_jpeg on tensors, batched (the strongest CPU peer). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl.h"
#include "kit/interrupt.h"
#include "kit/peers.h"
#include "kit/proc.h"
#include "kit/rep.h"


/* The best setting of a finished sweep (rows {workers, prefetch, images_per_s}) into cm:
 * best_images_per_s, best_workers (the fewest workers, then the smallest prefetch, within 2%
 * of the top), best_prefetch — or null with best_prefetch_tied when several prefetch settings
 * at that worker count lie within one measurement's noise (5%) of the best there: a verdict
 * on the argmax of a tie would flip from run to run. */
void vl_dl_sweep_best(const cJSON *sweep, cJSON *cm, long *best_w_out) {
  const cJSON *o;
  double best = 0, top_w = 0;
  cJSON_ArrayForEach(o, sweep) if (vl_rep_num(o, "images_per_s") > best) best = vl_rep_num(o, "images_per_s");
  long best_w = 0, best_p = 0, min_w = 1L << 30;
  cJSON_ArrayForEach(o, sweep) {
    double ips = vl_rep_num(o, "images_per_s");
    long w = (long)vl_rep_num(o, "workers"), p = (long)vl_rep_num(o, "prefetch");
    if (ips >= 0.98 * best && (w < min_w || (w == min_w && p < best_p))) { min_w = w; best_w = w; best_p = p; }
  }
  cJSON_ArrayForEach(o, sweep) if ((long)vl_rep_num(o, "workers") == best_w && vl_rep_num(o, "images_per_s") > top_w)
      top_w = vl_rep_num(o, "images_per_s");
  cJSON *tied = cJSON_CreateArray();
  cJSON_ArrayForEach(o, sweep) if ((long)vl_rep_num(o, "workers") == best_w &&
                                   vl_rep_num(o, "images_per_s") >= (1 - VL_NOISE_ONE_RUN) * top_w)
      cJSON_AddItemToArray(tied, cJSON_CreateNumber(vl_rep_num(o, "prefetch")));
  cJSON_AddNumberToObject(cm, "best_images_per_s", best);
  cJSON_AddNumberToObject(cm, "best_workers", (double)best_w);
  if (cJSON_GetArraySize(tied) > 1) {
    cJSON_AddNullToObject(cm, "best_prefetch");
    cJSON_AddItemToObject(cm, "best_prefetch_tied", tied);
  } else {
    cJSON_AddNumberToObject(cm, "best_prefetch", (double)best_p);
    cJSON_Delete(tied);
  }
  *best_w_out = best_w;
}


/* The PyTorch DataLoader's images/s over the same set with `workers` workers, decoding with
 * `decoder` (tools/torch_loader_bench.py: pil, or decode_jpeg: torchvision.io.decode_jpeg on
 * uint8 tensors with transforms.v2, batched); NaN with the reason in *why when it was not
 * measured. The interpreter is the peers' ($VRAMLAB_PYTHON, else python3). */
static double torch_reference(const vl_dl_cfg *d, int workers, const char *decoder, const char **why) {
  char out[256];
  const bool tensors = !strcmp(decoder, "decode_jpeg");
  char *probe[] = {(char *)vl_peer_python(), "-c",
                   tensors ? "import torch, torchvision\nfrom torchvision.io import decode_jpeg\n"
                             "from torchvision.transforms import v2"
                           : "import torch, torchvision, PIL",
                   NULL};
  if (vl_run_capture(probe, out, sizeof out) != 0) {
    *why = tensors ? "PyTorch with torchvision (io.decode_jpeg, transforms.v2) is not installed (pip install torch "
                     "torchvision)"
                   : "PyTorch with torchvision and Pillow is not installed (pip install torch torchvision pillow)";
    return NAN;
  }
  /* no shell: the data folder is passed as it is, whatever characters it holds */
  char script[600], w[16], b[24], crop[16];
  snprintf(script, sizeof script, "%s/tools/torch_loader_bench.py", VRAMLAB_SOURCE_DIR);
  snprintf(w, sizeof w, "%d", workers);
  snprintf(b, sizeof b, "%lld", (long long)d->lc.batch);
  snprintf(crop, sizeof crop, "%d", d->lc.crop);
  char *argv[] = {(char *)vl_peer_python(), script, "--dir", (char *)d->data_dir, "--workers", w, "--batch", b,
                  "--crop", crop, "--epochs", "2", "--decoder", (char *)decoder, NULL};
  double v = NAN;
  char *end;
  if (vl_run_capture(argv, out, sizeof out) == 0) {
    v = strtod(out, &end);
    if (end == out || !(v > 0)) v = NAN;
  }
  if (isnan(v))
    *why = tensors ? "tools/torch_loader_bench.py --decoder decode_jpeg failed" : "tools/torch_loader_bench.py failed";
  return v;
}

/* Both references into cm: the PIL pipeline (torch_images_per_s, speedup_vs_torch) and the
 * decode_jpeg one (torch_decode_jpeg_images_per_s, speedup_vs_torch_decode_jpeg), or each
 * one's reason it was not measured. */
static void torch_references(const vl_dl_cfg *d, double at_cores, cJSON *cm) {
  static const struct { const char *decoder, *rate, *speedup, *not_measured, *progress; } ref[] = {
      {"pil", "torch_images_per_s", "speedup_vs_torch", "torch_not_measured",
       "PyTorch DataLoader reference (torchvision/PIL)"},
      {"decode_jpeg", "torch_decode_jpeg_images_per_s", "speedup_vs_torch_decode_jpeg",
       "torch_decode_jpeg_not_measured", "PyTorch DataLoader reference (torchvision.io.decode_jpeg, batched)"},
  };
  for (size_t i = 0; i < sizeof ref / sizeof *ref && !vl_interrupted; i++) {
    const char *why = "";
    vl_progress("%s", ref[i].progress);
    double t = torch_reference(d, (int)d->cores, ref[i].decoder, &why);
    if (isnan(t)) cJSON_AddStringToObject(cm, ref[i].not_measured, why);
    else {
      cJSON_AddNumberToObject(cm, ref[i].rate, t);
      cJSON_AddNumberToObject(cm, ref[i].speedup, at_cores / t);
    }
  }
}

vl_status vl_dl_extra(vl_case_env *env, cJSON *res) {
  /* every knob of the last rung (the corrupt-sample policy and file-size limit included),
   * batched collate; the sweep then varies workers and prefetch */
  vl_knobs k;
  const cJSON *last = cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"),
                                         cJSON_GetArraySize(cJSON_GetObjectItem(res, "rungs")) - 1);
  VL_TRY(vl_case_knobs_of(env, last, &k));
  VL_TRY(vl_knob_set_err(&k, "collate", "batched", &env->err));
  vl_dl_cfg d;
  VL_TRY(vl_dl_parse(env, env->scale, &k, &d));
  vl_jpegset *js = NULL;
  VL_TRY(vl_dl_open_data(env, &d, &js));
  cJSON *cm = cJSON_AddObjectToObject(res, "case_metrics");
  vl_progress("decode-only ceiling (one core)");
  vl_err m = {""}; /* the data set's and the loader's messages */
  double rate = -1;
  if (vl_jpegset_decode_rate(js, d.images < 128 ? d.images : 128, &rate, &m) != VL_OK || !(rate > 0)) {
    vl_jpegset_close(js);
    return vl_case_fail(env, VL_ERR_IO, "%s", m.msg);
  }
  cJSON_AddNumberToObject(cm, "decode_images_per_s_per_core", rate);
  cJSON_AddNumberToObject(cm, "decode_ceiling_images_per_s", rate * (double)d.cores);
  cJSON_AddNumberToObject(cm, "cores", (double)d.cores);
  /* Interrupted: keep what was measured, write nothing derived from a measurement that did
   * not happen (the report then says which are missing instead of judging zeros). */
  if (vl_interrupted) { vl_jpegset_close(js); return VL_OK; }

  const long *ws = d.sweep_w, *ps = d.sweep_p;
  int nw = d.n_sweep_w, np = d.n_sweep_p;
  cJSON *sweep = cJSON_AddArrayToObject(res, "sweep");
  double at_cores = 0;
  long best_w = 0;
  vl_dataset ds = vl_jpegset_dataset(js);
  for (int i = 0; i < nw && !vl_interrupted; i++)
    for (int j = 0; j < np && !vl_interrupted; j++) {
      if (ws[i] == 0 && j > 0) continue; /* prefetch has no meaning without workers */
      d.lc.workers = (int)ws[i];
      d.lc.prefetch = (int)ps[j];
      d.lc.persistent = true;
      vl_loader *l = NULL;
      vl_status s = vl_loader_create(&l, &d.lc, &ds, &m);
      if (s != VL_OK) {
        vl_jpegset_close(js);
        return vl_case_fail(env, s, "%s", m.msg);
      }
      vl_dl_epoch e;
      vl_progress("sweep workers=%ld prefetch=%ld", ws[i], ps[j]);
      /* one warm-up epoch, one measured; the consumer takes no time: pipeline throughput */
      s = vl_dl_run_epoch(l, 0, 0, NULL, &e);
      if (s == VL_OK) s = vl_dl_run_epoch(l, 1, 0, NULL, &e);
      vl_loader_destroy(l);
      if (s == VL_ERR_INTERRUPTED) break;
      if (s != VL_OK) {
        vl_jpegset_close(js);
        return vl_case_fail(env, s, "sweep: %s", vl_status_name(s));
      }
      double ips = (double)e.images / e.wall;
      cJSON *o = cJSON_CreateObject();
      cJSON_AddNumberToObject(o, "workers", (double)ws[i]);
      cJSON_AddNumberToObject(o, "prefetch", (double)ps[j]);
      cJSON_AddNumberToObject(o, "images_per_s", ips);
      cJSON_AddNumberToObject(o, "cpu_util", e.cpu / (e.wall * (double)d.cores));
      cJSON_AddItemToArray(sweep, o);
      if (ws[i] == d.cores && ips > at_cores) at_cores = ips;
    }
  if (vl_interrupted) { /* a partial sweep has no best setting: the sweep table keeps its rows */
    cJSON_AddStringToObject(cm, "sweep_incomplete", "the run was interrupted during the sweep");
    vl_jpegset_close(js);
    return VL_OK;
  }
  vl_dl_sweep_best(sweep, cm, &best_w);
  cJSON_AddNumberToObject(cm, "best_workers_share", (double)best_w / (double)d.cores);
  cJSON_AddNumberToObject(cm, "images_per_s_at_cores", at_cores);
  cJSON_AddNumberToObject(cm, "share_of_decode_ceiling", at_cores / (rate * (double)d.cores));
  torch_references(&d, at_cores, cm);
  vl_jpegset_close(js);
  return VL_OK;
}
