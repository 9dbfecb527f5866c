/* llm-lora beside its PyTorch peer (tools/peers/llm_lora_peer.py: Hugging Face's Mistral,
 * SDPA, PEFT LoRA, bitsandbytes' NF4): the extra hook runs the baseline rung (fp32 full
 * fine-tune, the ladder's start), the lora rung and the qlora rung (its NF4 base needs
 * bitsandbytes, which runs on the CPU too; without it the rung is "not measured") on one
 * fixed-length batch, engine and PyTorch in turn (kit/peers.c), and the report shows them
 * side by side. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "llm.h"
#include "llm_torch.h"
#include "kit/peers.h"
#include "kit/rep.h"
#include "vramlab/mimic.h"

/* a fresh peer process per compared rung: one that ran an earlier rung keeps its allocator's
 * pools (on the H200, llm-lora lora's max_memory_reserved read 111 MB after baseline in the
 * same process, the mimic says 42) and reads the next rung's memory wrong */
static const vl_peer_kind kind = {"llm_lora_peer.py", "pip install torch transformers peft", "tokens", true};
static const vl_peer_rounds rounds = {2, 1, 6, 2};
static const char *const compared[] = {"baseline", "lora", "qlora"};

/* A half-precision compute dtype PyTorch has no fast kernels for here (hello: fp16_fast,
 * bf16_fast): the comparison runs the rung with fp32 compute and base on both sides (set
 * in k) and says why; NULL when the rung runs as it is. */
static const char *half_variant(vl_case_env *env, vl_knobs *k, const cJSON *hello, vl_status *s) {
  const char *c = vl_knob_str(k, "compute", vl_llm_knobs);
  bool f16 = !strcasecmp(c, "fp16"), b16 = !strcasecmp(c, "bf16");
  if ((!f16 && !b16) || cJSON_IsTrue(cJSON_GetObjectItem(hello, f16 ? "fp16_fast" : "bf16_fast"))) return NULL;
  *s = vl_knob_set_err(k, "compute", "fp32", &env->err);
  const char *fz = vl_knob_str(k, "frozen", vl_llm_knobs);
  bool nf4 = !strcasecmp(fz, "nf4"); /* stays NF4, dequantised to fp32 */
  if (*s == VL_OK && !nf4 && strcasecmp(fz, "fp32")) *s = vl_knob_set_err(k, "frozen", "fp32", &env->err);
  if (nf4)
    return f16 ? "compute in fp32 on both sides, the base NF4 (dequantised to fp32): PyTorch has no fast fp16 "
                 "kernels on this CPU (oneDNN's need AVX512-FP16 or AMX-FP16), so its fp16 step would time reference loops"
               : "compute in fp32 on both sides, the base NF4 (dequantised to fp32): PyTorch has no fast bf16 kernels "
                 "on this CPU";
  return f16 ? "compute and frozen base in fp32 on both sides: PyTorch has no fast fp16 kernels on this CPU "
               "(oneDNN's need AVX512-FP16 or AMX-FP16), so its fp16 step would time reference loops"
             : "compute and frozen base in fp32 on both sides: PyTorch has no fast bf16 kernels on this CPU";
}

/* The peer's config: the engine's model and training config at this batch and length. */
static cJSON *setup_json(const vl_llm_rung *r, vl_device dev, int threads, int64_t B, int64_t T) {
  const vl_mistral_cfg *mc = &r->model.mc;
  const vl_train_cfg *tc = &r->model.tc;
  cJSON *s = cJSON_CreateObject();
  cJSON_AddStringToObject(s, "device", dev == VL_DEV_CUDA ? "cuda" : "cpu");
  cJSON_AddNumberToObject(s, "threads", threads);
  cJSON_AddNumberToObject(s, "seed", (double)r->seed);
  cJSON_AddNumberToObject(s, "batch", (double)B);
  cJSON_AddNumberToObject(s, "seq", (double)T);
  cJSON *m = cJSON_AddObjectToObject(s, "model");
  cJSON_AddNumberToObject(m, "vocab", (double)mc->vocab);
  cJSON_AddNumberToObject(m, "dim", (double)mc->dim);
  cJSON_AddNumberToObject(m, "layers", (double)mc->n_layers);
  cJSON_AddNumberToObject(m, "heads", (double)mc->n_heads);
  cJSON_AddNumberToObject(m, "kv_heads", (double)mc->n_kv_heads);
  cJSON_AddNumberToObject(m, "head_dim", (double)mc->head_dim);
  cJSON_AddNumberToObject(m, "ffn", (double)mc->ffn);
  cJSON_AddNumberToObject(m, "rope_theta", mc->rope_theta);
  cJSON_AddNumberToObject(m, "norm_eps", mc->norm_eps);
  /* the families of --model-config, named only when set (a Mistral's setup stays as it was) */
  if (mc->tie_embed) cJSON_AddBoolToObject(m, "tie_embed", true);
  if (mc->qkv_bias) cJSON_AddBoolToObject(m, "qkv_bias", true);
  if (r->model_type) cJSON_AddStringToObject(m, "model_type", r->model_type); /* the peer's class */
  cJSON *t = vl_peer_train_json(&tc->optim, tc->clip, r->accum, tc->compute);
  cJSON_AddStringToObject(t, "frozen", vl_dtype_name(tc->frozen));
  cJSON_AddNumberToObject(t, "lora_rank", tc->lora_rank);
  cJSON_AddNumberToObject(t, "lora_alpha", tc->lora_alpha);
  cJSON_AddStringToObject(t, "lora_targets", tc->lora_targets == VL_LORA_ALL ? "all" : "qkvo");
  cJSON_AddBoolToObject(t, "checkpoint", tc->checkpoint);
  cJSON_AddItemToObject(s, "train", t);
  return s;
}

/* Random tokens (B, T) and their next-token targets, the last of each row ignored (as
 * Hugging Face's shifted labels). */
static void fill_tokens(int32_t *tok, int32_t *tgt, int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  vl_rng g;
  vl_rng_seed(&g, seed);
  for (int64_t i = 0; i < B * T; i++) tok[i] = (int32_t)vl_rng_below(&g, (uint64_t)vocab);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) tgt[b * T + t] = t + 1 < T ? tok[b * T + t + 1] : -1;
}

/* The rung as the peer runs it (k parsed at env->scale, one fixed batch and length: a fixed
 * length above the limit raises it, as the run does); *skip: NULL, or why no CPU peer runs it. */
static vl_status peer_rung(vl_case_env *env, const vl_knobs *k, vl_llm_rung *r, int64_t *B, int64_t *T,
                           const char **skip) {
  VL_TRY(vl_llm_parse_rung(env, env->scale, k, r));
  *skip = r->batch == 0 ? "batch = max is compared only at a fixed batch" : NULL;
  *B = r->batch;
  *T = r->run_seq > 0 ? r->run_seq : r->model.mc.seq;
  if (*T > r->model.mc.seq) r->model.mc.seq = *T;
  return VL_OK;
}

vl_status vl_llm_peer_config(vl_case_env *env, const vl_knobs *k, int threads, cJSON *out) {
  vl_llm_rung r;
  int64_t B, T;
  const char *skip;
  VL_TRY(peer_rung(env, k, &r, &B, &T, &skip));
  cJSON_AddStringToObject(out, "script", kind.script);
  if (skip) cJSON_AddStringToObject(out, "not_measured", skip);
  else cJSON_AddItemToObject(out, "config", setup_json(&r, env->device, threads, B, T));
  return VL_OK;
}

vl_mimic_llm_cfg vl_llm_mimic_cfg(const vl_llm_rung *r, int64_t B, int64_t T, vl_mimic_device dev) {
  vl_mimic_llm_cfg c = {.model = r->model, .batch = B, .seq = T, .accum = r->accum, .steps = 2, .device = dev};
  c.model.mc.seq = T;
  return c;
}

/* The mimic of the peer's own step (the code path of the real run on `dev`, vramlab/mimic.h)
 * at this batch and length: what it predicts beside what the peer measures. */
static void mimic_json(const vl_llm_rung *r, int64_t B, int64_t T, vl_device dev, const cJSON *hello, cJSON *o) {
  /* the peer's card sizes cuBLAS's workspace (its hello: cuda_capability) */
  vl_mimic_llm_cfg c = vl_llm_mimic_cfg(r, B, T, dev == VL_DEV_CUDA ? VL_MIMIC_CUDA : VL_MIMIC_CPU);
  c.cuda_cc_major = vl_peer_cuda_cc_major(hello);
  vl_mimic_result m;
  char why[200];
  vl_status s = vl_mimic_llm(&c, &m, NULL, NULL, why, sizeof why);
  /* MemTracker's terms (CPU): its fake tensors take the explicit causal mask and repeat_kv */
  vl_mimic_result fake;
  c.traced = true;
  bool cpu = s == VL_OK && dev != VL_DEV_CUDA && vl_mimic_llm(&c, &fake, NULL, NULL, why, sizeof why) == VL_OK;
  vl_case_peer_mimic_json(o, s, &m, cpu ? &fake : NULL, why, dev == VL_DEV_CUDA);
}

static vl_status compare_rung(vl_case_env *env, vl_peer *p, const cJSON *hello, const cJSON *rung, int threads,
                              cJSON *o) {
  const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(rung, "name"));
  vl_knobs k;
  VL_TRY(vl_case_knobs_of(env, rung, &k));
  vl_status s = VL_OK;
  const char *variant = half_variant(env, &k, hello, &s);
  VL_TRY(s);
  vl_llm_rung r;
  int64_t B, T;
  const char *skip;
  VL_TRY(peer_rung(env, &k, &r, &B, &T, &skip));
  if (skip) {
    cJSON_AddStringToObject(o, "rung", name);
    cJSON_AddStringToObject(o, "not_measured", skip);
    return VL_OK;
  }
  vl_step_spec spec = vl_llm_step_spec(&r, B, T);
  int32_t *tok = malloc((size_t)(B * T) * sizeof *tok), *tgt = malloc((size_t)(B * T) * sizeof *tgt);
  if (!tok || !tgt) {
    s = vl_peer_engine_failed(env, VL_ERR_OOM, NULL, name, o);
  } else {
    fill_tokens(tok, tgt, B, T, r.model.mc.vocab, (uint64_t)r.seed + 1000);
    vl_batch mb = vl_llm_token_batch(B, T, tok, tgt);
    cJSON *setup = setup_json(&r, env->device, threads, B, T);
    vl_peer_cmp cmp = {name, variant, NULL, NULL, &mb, r.accum, (double)(B * T * r.accum), &spec, setup};
    s = vl_peer_compare_model(env, p, &cmp, &rounds, &vl_model_mistral, &r.model, (uint64_t)r.seed, o);
    if (s == VL_OK && !cJSON_GetObjectItem(o, "not_measured")) mimic_json(&r, B, T, env->device, hello, o);
    cJSON_AddNumberToObject(o, "batch", (double)B);
    cJSON_AddNumberToObject(o, "seq", (double)T);
    cJSON_Delete(setup);
  }
  free(tok);
  free(tgt);
  return s;
}

/* The rung's step on MemTracker's terms (vl_peer_fake_mimic_fn): the peer's batch and length
 * at env->scale, PyTorch's CPU code path as it runs on fake tensors (the causal mask as a
 * tensor, k and v repeated to every head). */
static vl_status fake_mimic(vl_case_env *env, const vl_knobs *k, vl_mimic_result *m, char *why, size_t n) {
  vl_llm_rung r;
  int64_t B, T;
  const char *skip;
  vl_status s = peer_rung(env, k, &r, &B, &T, &skip);
  if (s != VL_OK || skip) {
    snprintf(why, n, "%s", s != VL_OK ? env->err.msg : skip);
    return s != VL_OK ? s : VL_ERR_INVALID;
  }
  vl_mimic_llm_cfg c = vl_llm_mimic_cfg(&r, B, T, VL_MIMIC_CPU);
  c.traced = true;
  return vl_mimic_llm(&c, m, NULL, NULL, why, n);
}

vl_status vl_llm_full_scale(vl_case_env *env, cJSON *res, const char *scale) {
  return vl_peer_full_scale(env, res, scale, vl_llm_peer_config, fake_mimic);
}

vl_status vl_llm_peers(vl_case_env *env, cJSON *res) {
  return vl_peer_side_by_side(env, res, &kind, &rounds, compared, (int)(sizeof compared / sizeof *compared),
                              compare_rung);
}

void vl_llm_peers_report(const cJSON *res, FILE *md) {
  vl_peer_report(res, md, &kind,
                 "What differs by construction: Hugging Face computes the loss over the T − 1 shifted positions "
                 "of each row, which the engine's batch matches (its last target of a row is ignored); PEFT "
                 "initialises LoRA A by Kaiming-uniform where the engine draws N(0, 1/in) (B = 0 on both, so the "
                 "first steps start from the same function); PyTorch's CPU SDPA keeps no (T × T) probability "
                 "matrix for backward where the engine's classic attention keeps one per layer (B·H·T² values), "
                 "part of the engine's larger activations at long sequences. Where the mimic and MemTracker "
                 "differ: MemTracker traces on fake tensors, where transformers builds the causal mask as a tensor "
                 "((B, 1, T, T) booleans) and SDPA's CPU path turns it into an additive mask of q's dtype that each "
                 "layer saves, and repeats k and v to every head (repeat_kv); the real run passes no mask (is_causal) "
                 "and lets SDPA take k and v at their own heads (enable_gqa), which the mimic follows. tests/test_mimic.c "
                 "replays the fake-tensor path too and matches MemTracker to 0.1%.");
}
