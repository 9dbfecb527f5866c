/* seg-ckpt beside its PyTorch peer (tools/peers/seg_peer.py: the engine-parity ResNet U-Net
 * of tests/torch/make_resunet_fixture.py built from torchvision's Bottleneck): the extra hook
 * runs the before rung (fp32, no checkpointing) and the relu_off rung (checkpointing per
 * bottleneck, in-place ReLU off: the article's "after" model without fp16, which PyTorch has
 * no fast CPU kernels for, accumulation and the GPU's largest batch) on one batch, engine
 * and PyTorch in turn (kit/peers.c), and the report shows them side by side. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "seg_torch.h"
#include "kit/peers.h"
#include "kit/rep.h"
#include "seg.h"
#include "vramlab/mimic.h"

/* a fresh peer process per compared rung: one that ran an earlier rung keeps its allocator's
 * pools (on the H200, llm-lora lora's max_memory_reserved read 111 MB after baseline in the
 * same process, the mimic says 42) and reads the next rung's memory wrong */
static const vl_peer_kind kind = {"seg_peer.py", "pip install torch torchvision", "images", true};
static const vl_peer_rounds rounds = {2, 1, 6, 2};
static const char *const compared[] = {"before", "relu_off"};

/* A half-precision compute dtype PyTorch has no fast kernels for here: the rung runs in
 * fp32 on both sides (set in k), and says why; NULL when it runs as it is. */
static const char *half_variant(vl_case_env *env, vl_knobs *k, const cJSON *hello, vl_status *s) {
  const char *c = vl_knob_str(k, "compute", vl_segrung_knobs);
  bool f16 = !strcasecmp(c, "fp16"), b16 = !strcasecmp(c, "bf16");
  if ((!f16 && !b16) || cJSON_IsTrue(cJSON_GetObjectItem(hello, f16 ? "fp16_fast" : "bf16_fast"))) return NULL;
  *s = vl_knob_set_err(k, "compute", "fp32", &env->err);
  return f16 ? "fp32 on both sides: PyTorch has no fast fp16 convolutions on this CPU (oneDNN's need "
               "AVX512-FP16 or AMX-FP16), so its fp16 step would time reference loops"
             : "fp32 on both sides: PyTorch has no fast bf16 kernels on this CPU";
}

static cJSON *setup_json(const vl_segrung *r, vl_device dev, int threads, int64_t B) {
  const vl_resunet_cfg *mc = &r->model.mc;
  const vl_resunet_train_cfg *tc = &r->model.tc;
  cJSON *s = cJSON_CreateObject();
  cJSON_AddStringToObject(s, "device", dev == VL_DEV_CUDA ? "cuda" : "cpu");
  cJSON_AddNumberToObject(s, "threads", threads);
  cJSON_AddNumberToObject(s, "seed", (double)r->seed);
  cJSON_AddNumberToObject(s, "batch", (double)B);
  cJSON *m = cJSON_AddObjectToObject(s, "model");
  cJSON_AddNumberToObject(m, "image", (double)mc->image);
  cJSON_AddNumberToObject(m, "width", (double)mc->width);
  cJSON_AddItemToObject(m, "blocks", cJSON_CreateIntArray(mc->blocks, 4));
  double dec[5];
  for (int i = 0; i < 5; i++) dec[i] = (double)mc->dec[i];
  cJSON_AddItemToObject(m, "dec", cJSON_CreateDoubleArray(dec, 5));
  cJSON_AddNumberToObject(m, "classes", (double)mc->classes);
  cJSON_AddNumberToObject(m, "bn_eps", mc->bn_eps);
  cJSON_AddNumberToObject(m, "bn_momentum", mc->bn_momentum);
  cJSON *t = vl_peer_train_json(&tc->optim, tc->clip, r->accum, tc->compute);
  cJSON_AddBoolToObject(t, "checkpoint", tc->checkpoint);
  cJSON_AddBoolToObject(t, "relu_inplace", tc->relu_inplace);
  cJSON_AddItemToObject(s, "train", t);
  return s;
}

static const char fixed_only[] = "batch = max is compared only at a fixed batch";

vl_status vl_segcase_peer_config(vl_case_env *env, const vl_knobs *k, int threads, cJSON *out) {
  vl_segrung r;
  VL_TRY(vl_segrung_parse(env, env->scale, k, &r));
  cJSON_AddStringToObject(out, "script", kind.script);
  if (r.batch == 0) cJSON_AddStringToObject(out, "not_measured", fixed_only);
  else cJSON_AddItemToObject(out, "config", setup_json(&r, env->device, threads, r.batch));
  return VL_OK;
}

vl_mimic_resunet_cfg vl_segcase_mimic_cfg(const vl_segrung *r, int64_t batch, vl_mimic_device dev) {
  const vl_resunet_train_cfg *t = &r->model.tc;
  return (vl_mimic_resunet_cfg){.model = r->model.mc, .compute = t->compute, .checkpoint = t->checkpoint,
                                .relu_inplace = t->relu_inplace, .optim = t->optim.opt, .clip = t->clip,
                                .batch = batch, .accum = r->accum, .steps = 2, .device = dev};
}

/* The mimic of the peer's own step (the code path of the real run on `dev`, vramlab/mimic.h)
 * at this batch: its prediction beside what the peer measures. */
static void mimic_json(const vl_segrung *r, int64_t B, vl_device dev, cJSON *o) {
  vl_mimic_resunet_cfg c = vl_segcase_mimic_cfg(r, B, dev == VL_DEV_CUDA ? VL_MIMIC_CUDA : VL_MIMIC_CPU);
  vl_mimic_result m;
  char why[200];
  vl_status s = vl_mimic_resunet(&c, &m, NULL, NULL, why, sizeof why);
  /* MemTracker's terms (CPU): the U-Net's ops are the same on fake tensors, the batch aside */
  vl_case_peer_mimic_json(o, s, &m, dev != VL_DEV_CUDA ? &m : NULL, why, dev == VL_DEV_CUDA);
}

static vl_status compare_rung(vl_case_env *env, vl_peer *p, const cJSON *hello, const cJSON *rung, int threads,
                              cJSON *o) {
  const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(rung, "name"));
  vl_knobs k;
  VL_TRY(vl_case_knobs_of(env, rung, &k));
  vl_status s = VL_OK;
  const char *variant = half_variant(env, &k, hello, &s);
  VL_TRY(s);
  vl_segrung r;
  VL_TRY(vl_segrung_parse(env, env->scale, &k, &r));
  if (r.batch == 0) {
    cJSON_AddStringToObject(o, "rung", name);
    cJSON_AddStringToObject(o, "not_measured", fixed_only);
    return VL_OK;
  }
  const vl_resunet_cfg *mc = &r.model.mc;
  int64_t B = r.batch, HW = mc->image * mc->image;
  vl_step_spec spec = vl_segrung_step_spec(&r, B, r.accum);
  float *x = malloc((size_t)(B * 3 * HW) * sizeof *x);
  int32_t *y = malloc((size_t)(B * HW) * sizeof *y);
  if (!x || !y) {
    s = vl_peer_engine_failed(env, VL_ERR_OOM, NULL, name, o);
  } else {
    vl_rng g; /* random images and classes, as the interleaved timing's */
    vl_rng_seed(&g, (uint64_t)r.seed + 77);
    for (int64_t i = 0; i < B * 3 * HW; i++) x[i] = vl_rng_normal(&g);
    for (int64_t i = 0; i < B * HW; i++) y[i] = (int32_t)vl_rng_below(&g, (uint64_t)mc->classes);
    vl_batch mb = {0};
    vl_batch_add(&mb, "images", VL_F32, 4, (int64_t[4]){B, 3, mc->image, mc->image}, x);
    vl_batch_add(&mb, "masks", VL_I32, 3, (int64_t[3]){B, mc->image, mc->image}, y);
    cJSON *setup = setup_json(&r, env->device, threads, B);
    vl_peer_cmp cmp = {name, variant, NULL, NULL, &mb, r.accum, (double)(B * r.accum), &spec, setup};
    s = vl_peer_compare_model(env, p, &cmp, &rounds, &vl_model_resunet, &r.model, (uint64_t)r.seed, o);
    if (s == VL_OK && !cJSON_GetObjectItem(o, "not_measured")) mimic_json(&r, B, env->device, o);
    cJSON_AddNumberToObject(o, "batch", (double)B);
    cJSON_AddNumberToObject(o, "image", (double)mc->image);
    cJSON_Delete(setup);
  }
  free(x);
  free(y);
  return s;
}

/* The rung's step on MemTracker's terms (vl_peer_fake_mimic_fn): the U-Net's ops are the same
 * on fake tensors, so PyTorch's CPU code path at the rung's batch. */
static vl_status fake_mimic(vl_case_env *env, const vl_knobs *k, vl_mimic_result *m, char *why, size_t n) {
  vl_segrung r;
  vl_status s = vl_segrung_parse(env, env->scale, k, &r);
  if (s != VL_OK || r.batch == 0) {
    snprintf(why, n, "%s", s != VL_OK ? env->err.msg : fixed_only);
    return s != VL_OK ? s : VL_ERR_INVALID;
  }
  vl_mimic_resunet_cfg c = vl_segcase_mimic_cfg(&r, r.batch, VL_MIMIC_CPU);
  return vl_mimic_resunet(&c, m, NULL, NULL, why, n);
}

vl_status vl_segcase_full_scale(vl_case_env *env, cJSON *res, const char *scale) {
  return vl_peer_full_scale(env, res, scale, vl_segcase_peer_config, fake_mimic);
}

vl_status vl_segcase_peers(vl_case_env *env, cJSON *res) {
  return vl_peer_side_by_side(env, res, &kind, &rounds, compared, (int)(sizeof compared / sizeof *compared),
                              compare_rung);
}

void vl_segcase_peers_report(const cJSON *res, FILE *md) {
  vl_peer_report(res, md, &kind,
                 "What differs by construction: PyTorch's checkpoint re-runs each bottleneck's batch norm in "
                 "training mode and so updates its running statistics twice per step (the engine's re-run does "
                 "not); the peer's stem and decoder ReLUs are out of place in every rung (the parity model's "
                 "`F.relu`), the engine's follow `relu_inplace`; both use NCHW tensors and oneDNN convolutions "
                 "(the engine reorders into oneDNN's blocked layout in counted workspace).");
}
