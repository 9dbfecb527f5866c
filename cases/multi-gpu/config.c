/* multi-gpu's knobs and what they mean: the knob table, a rung's knobs and the setting
 * mapped to the data-parallel wrapper's config over seg-ckpt's ResNet-101 U-Net, and the
 * step a rung plans and runs. The U-Net, its training and loader knobs are seg-ckpt's,
 * parsed by seg-ckpt's own code (vl_segrung_parse) with the same names and defaults. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mg.h"

const int vl_mg_cards[VL_MG_CARDS_N] = {1, 2, 4, 8};

/* The seg-ckpt knobs this case takes keep seg-ckpt's defaults (tests compare the two tables):
 * seg-ckpt's parse falls back to its own table for a knob that is not set. */
const vl_knob_decl vl_mg_knobs[] = {
    {"mode", "ddp", "single (one rank), dp (DataParallel-style), ddp (DistributedDataParallel) or zero1 (DDP + ZeRO-1)",
     VL_KNOB_RUNG},
    {"ranks", "2", "ranks (processes; one card each at full scale); single needs 1", VL_KNOB_RUNG},
    {"threads", "1", "compute threads per rank (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS)", VL_KNOB_RUNG},
    {"oversubscribe", "false", "allow ranks x threads above this machine's cores (results labelled oversubscribed)",
     VL_KNOB_RUNG},
    {"overlap", "true", "ddp: allreduce each bucket as soon as its gradients are ready, during backward",
     VL_KNOB_RUNG},
    {"grad_as_bucket_view", "false", "ddp: gradients live in the buckets (no separate bucket copy)", VL_KNOB_RUNG},
    {"bucket_cap", "25MiB", "ddp: bucket size cap (PyTorch's bucket_cap_mb = 25)", VL_KNOB_RUNG},
    {"first_bucket_cap", "1MiB", "ddp: the first bucket's cap (PyTorch's 1 MiB)", VL_KNOB_RUNG},
    {"batch", "8", "micro-batch per rank (>= 2, batch norm): the global batch is ranks x batch", VL_KNOB_RUNG},
    VL_SEGRUNG_MODEL_KNOBS,
    VL_SEGRUNG_LOADER_KNOBS, /* per rank */
    VL_CASE_CARD_KNOBS,
    VL_SEGRUNG_SIZE_SETTINGS,
    {"train_images", "256", "training split at the run scale (made on first use), sharded over the ranks",
     VL_KNOB_SETTING},
    {"data_dir", "data/segset", "where the segmentation split is made and read", VL_KNOB_SETTING},
    {"steps", "20", "timed steps per rank of a run", VL_KNOB_SETTING},
    {"warmup", "2", "untimed steps per rank before them", VL_KNOB_SETTING},
    {"timeout", "300", "seconds one mpirun job may take before it is killed", VL_KNOB_SETTING},
    {"bwd_share", "0.6667", "modeled: share of a step's compute that is backward (the overlap window)",
     VL_KNOB_SETTING},
    {"efficiency", "0.4", "modeled: share of the card's peak FLOP/s a step achieves (assumed)", VL_KNOB_SETTING},
    {"pcie_tflops", "82.6", "modeled, PCIe preset: RTX 4090 peak TF32/FP32 TFLOP/s (NVIDIA Ada whitepaper)",
     VL_KNOB_SETTING},
    {"pcie_busbw_gbs", "12", "modeled, PCIe preset: allreduce bus bandwidth without peer-to-peer, GB/s (assumed)",
     VL_KNOB_SETTING},
    {"pcie_latency_us", "10", "modeled, PCIe preset: latency of one ring step, us (assumed)", VL_KNOB_SETTING},
    {"nvlink_tflops", "494.7", "modeled, NVLink preset: H100 SXM dense TF32 TFLOP/s (NVIDIA H100 datasheet)",
     VL_KNOB_SETTING},
    {"nvlink_busbw_gbs", "360", "modeled, NVLink preset: allreduce bus bandwidth, GB/s (assumed: 80% of 450)",
     VL_KNOB_SETTING},
    {"nvlink_latency_us", "3", "modeled, NVLink preset: latency of one ring step, us (assumed)", VL_KNOB_SETTING},
    {"sweep_bucket_caps", "1MiB,2MiB,4MiB,8MiB,25MiB",
     "bucket caps the bench measures on the ddp-tuned rung (none: no sweep)", VL_KNOB_SETTING},
    {"coll_max_bytes", "64MiB", "largest size of the collective benchmark the bench runs", VL_KNOB_SETTING},
    {"disturbed_share", "0.1", "a run during which other processes used more of the cores is run again", VL_KNOB_SETTING},
    {"disturbed_retries", "2", "at most this many times (the report counts them)", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};

/* "1MiB,4MiB": sizes into out; "none": no sweep. */
static vl_status parse_sweep(vl_case_env *env, vl_mg_rung *r) {
  const char *s = vl_knob_str(env->setting, "sweep_bucket_caps", vl_mg_knobs);
  r->n_sweep = 0;
  if (!strcasecmp(s, "none")) return VL_OK;
  char buf[VL_KNOB_VAL_LEN];
  snprintf(buf, sizeof buf, "%s", s);
  char *save = NULL;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    size_t v;
    if (vl_parse_bytes(t, &v) || v < 1024 || v > ((size_t)1 << 32))
      return vl_case_fail(env, VL_ERR_INVALID, "sweep_bucket_caps: '%s' is not a size in [1KiB, 4GiB] (e.g. 4MiB)", t);
    if (r->n_sweep >= VL_MG_MAX_SWEEP)
      return vl_case_fail(env, VL_ERR_INVALID, "sweep_bucket_caps: more than %d sizes", VL_MG_MAX_SWEEP);
    r->sweep[r->n_sweep++] = v;
  }
  if (!r->n_sweep) return vl_case_fail(env, VL_ERR_INVALID, "sweep_bucket_caps: expected sizes or none");
  return VL_OK;
}

/* A link preset from its three settings (prefix "pcie" or "nvlink"). */
static vl_status parse_link(vl_case_env *env, const char *name, double eff, vl_mg_link *l) {
  char kt[40], kb[40], kl[40];
  snprintf(kt, sizeof kt, "%s_tflops", name);
  snprintf(kb, sizeof kb, "%s_busbw_gbs", name);
  snprintf(kl, sizeof kl, "%s_latency_us", name);
  double tf, bw, lat;
  VL_TRY(vl_knob_double(env->setting, kt, vl_mg_knobs, 1e-3, 1e6, &tf, &env->err));
  VL_TRY(vl_knob_double(env->setting, kb, vl_mg_knobs, 1e-3, 1e6, &bw, &env->err));
  VL_TRY(vl_knob_double(env->setting, kl, vl_mg_knobs, 0, 1e6, &lat, &env->err));
  *l = (vl_mg_link){name, bw * 1e9, lat * 1e-6, tf * 1e12, eff};
  return VL_OK;
}

/* The data-parallel knobs of a rung. */
static vl_status parse_dist(vl_case_env *env, const vl_knobs *k, vl_mg_rung *r) {
  const char *ms = vl_knob_str(k, "mode", vl_mg_knobs);
  if (vl_dist_mode_parse(ms, &r->mode))
    return vl_case_fail(env, VL_ERR_INVALID, "mode = '%s': expected single, dp, ddp or zero1", ms);
  long v;
  int b;
  VL_TRY(vl_knob_int(k, "ranks", vl_mg_knobs, 1, 256, &v, &env->err));
  r->ranks = (int)v;
  if (r->mode == VL_DIST_SINGLE && r->ranks != 1)
    return vl_case_fail(env, VL_ERR_INVALID, "ranks = %d: mode single runs on one rank (ranks = 1)", r->ranks);
  VL_TRY(vl_knob_int(k, "threads", vl_mg_knobs, 1, 256, &v, &env->err));
  r->threads = (int)v;
  VL_TRY(vl_knob_bool(k, "oversubscribe", vl_mg_knobs, &b, &env->err));
  r->oversubscribe = b;
  VL_TRY(vl_knob_bool(k, "overlap", vl_mg_knobs, &b, &env->err));
  r->overlap = b;
  VL_TRY(vl_knob_bool(k, "grad_as_bucket_view", vl_mg_knobs, &b, &env->err));
  r->grad_as_bucket_view = b;
  VL_TRY(vl_knob_bytes(k, "bucket_cap", vl_mg_knobs, &r->bucket_cap, &env->err));
  VL_TRY(vl_knob_bytes(k, "first_bucket_cap", vl_mg_knobs, &r->first_bucket_cap, &env->err));
  if (r->bucket_cap < 1024 || r->first_bucket_cap < 1024)
    return vl_case_fail(env, VL_ERR_INVALID, "%s: below 1 KiB", r->bucket_cap < 1024 ? "bucket_cap" : "first_bucket_cap");
  return VL_OK;
}

/* The setting's run and model knobs. */
static vl_status parse_setting(vl_case_env *env, vl_mg_rung *r) {
  const vl_knobs *s = env->setting;
  VL_TRY(vl_knob_int(s, "steps", vl_mg_knobs, 1, 100000, &r->steps, &env->err));
  VL_TRY(vl_knob_int(s, "warmup", vl_mg_knobs, 0, 1000, &r->warmup, &env->err));
  VL_TRY(vl_knob_double(s, "timeout", vl_mg_knobs, 1, 86400, &r->timeout_s, &env->err));
  VL_TRY(vl_knob_double(s, "bwd_share", vl_mg_knobs, 0, 1, &r->bwd_share, &env->err));
  double eff;
  VL_TRY(vl_knob_double(s, "efficiency", vl_mg_knobs, 1e-3, 1, &eff, &env->err));
  VL_TRY(parse_link(env, "pcie", eff, &r->link[0]));
  VL_TRY(parse_link(env, "nvlink", eff, &r->link[1]));
  VL_TRY(parse_sweep(env, r));
  VL_TRY(vl_knob_bytes(s, "coll_max_bytes", vl_mg_knobs, &r->coll_max_bytes, &env->err));
  if (r->coll_max_bytes < 1024 || r->coll_max_bytes > ((size_t)1 << 30))
    return vl_case_fail(env, VL_ERR_INVALID, "coll_max_bytes: expected 1KiB .. 1GiB");
  VL_TRY(vl_knob_double(s, "disturbed_share", vl_mg_knobs, 0, 1, &r->disturbed_share, &env->err));
  VL_TRY(vl_knob_int(s, "disturbed_retries", vl_mg_knobs, 0, 20, &r->disturbed_retries, &env->err));
  return VL_OK;
}

vl_status vl_mg_parse_rung(vl_case_env *env, const char *scale, const vl_knobs *k, vl_mg_rung *r) {
  memset(r, 0, sizeof *r);
  VL_TRY(vl_segrung_parse(env, scale, k, &r->seg));
  if (r->seg.batch == 0)
    return vl_case_fail(env, VL_ERR_INVALID, "batch = max: multi-gpu takes a micro-batch per rank (>= 2)");
  VL_TRY(parse_dist(env, k, r));
  return parse_setting(env, r);
}

vl_dist_cfg vl_mg_dist_cfg(const vl_mg_rung *r, int world, int rank, vl_comm *comm) {
  vl_dist_cfg dc = {&vl_model_resunet, &r->seg.model, r->mode, world, rank, comm,
                    r->bucket_cap, r->first_bucket_cap, r->overlap, r->grad_as_bucket_view};
  return dc;
}

int64_t vl_mg_rank_batch(const vl_mg_rung *r, int world, int rank) {
  if (r->mode == VL_DIST_DP) return rank == 0 ? r->seg.batch * world : 0;
  return r->seg.batch;
}

/* The wrapper's planned batch of B: B samples per rank; DataParallel's every rank passes the
 * global batch's shapes (rank 0's data is scattered), so world x B. */
vl_step_spec vl_mg_step_spec(const vl_mg_rung *r, const vl_dist_cfg *dc) {
  vl_step_spec s = {.type = &vl_model_dist, .cfg = dc, .seed = (uint64_t)r->seg.seed, .batch = {0}, .accum = 1};
  vl_step_spec_set_batch(&s, r->seg.batch);
  return s;
}
