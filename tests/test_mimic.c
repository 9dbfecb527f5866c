/* The PyTorch mimic (vramlab/mimic.h) against PyTorch itself: the committed traces of
 * tools/peers/torch_trace.py (tests/fixtures/trace/: every allocation and free of Hugging
 * Face's step on fake tensors, op by op) and MemTracker's peaks (tests/fixtures/memtracker/);
 * the CUDA code path's rules; what it refuses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include <cjson/cJSON.h>
#include "kit/case.h"
#include "kit/rep.h"
#include "vramlab/fileio.h"
#include "vramlab/mimic.h"

/* ---- a peer config (llm_lora_peer.py's JSON) as the mimic's config ------------------------- */

static vl_mimic_llm_cfg cfg_of(const cJSON *c) {
  vl_mimic_llm_cfg m;
  memset(&m, 0, sizeof m);
  const cJSON *md = cJSON_GetObjectItem(c, "model"), *t = cJSON_GetObjectItem(c, "train");
  vl_mistral_cfg *mc = &m.model.mc;
  vl_train_cfg *tc = &m.model.tc;
  vl_train_cfg_default(tc);
  mc->vocab = (int64_t)vl_rep_num(md, "vocab");
  mc->dim = (int64_t)vl_rep_num(md, "dim");
  mc->n_layers = (int64_t)vl_rep_num(md, "layers");
  mc->n_heads = (int64_t)vl_rep_num(md, "heads");
  mc->n_kv_heads = (int64_t)vl_rep_num(md, "kv_heads");
  mc->head_dim = (int64_t)vl_rep_num(md, "head_dim");
  mc->ffn = (int64_t)vl_rep_num(md, "ffn");
  mc->tie_embed = cJSON_IsTrue(cJSON_GetObjectItem(md, "tie_embed"));
  mc->qkv_bias = cJSON_IsTrue(cJSON_GetObjectItem(md, "qkv_bias"));
  m.batch = (int64_t)vl_rep_num(c, "batch");
  m.seq = mc->seq = (int64_t)vl_rep_num(c, "seq");
  assert_int_equal(vl_dtype_parse(vl_rep_str(t, "compute"), &tc->compute), 0);
  assert_int_equal(vl_dtype_parse(vl_rep_str(t, "frozen"), &tc->frozen), 0);
  assert_int_equal(vl_optimizer_parse(vl_rep_str(t, "optimizer"), &tc->optim.opt), 0);
  tc->optim.adafactor_beta1 = cJSON_IsTrue(cJSON_GetObjectItem(t, "adafactor_beta1"));
  tc->lora_rank = (int)vl_rep_num(t, "lora_rank");
  tc->lora_alpha = (float)vl_rep_num(t, "lora_alpha");
  tc->lora_targets = !strcmp(vl_rep_str(t, "lora_targets"), "all") ? VL_LORA_ALL : VL_LORA_QKVO;
  tc->checkpoint = cJSON_IsTrue(cJSON_GetObjectItem(t, "checkpoint"));
  tc->clip = (float)vl_rep_num(t, "clip");
  m.accum = (int64_t)vl_rep_num(t, "accum");
  m.steps = 2;
  m.device = VL_MIMIC_CPU;
  m.traced = true;
  const char *sdpa = cJSON_GetStringValue(cJSON_GetObjectItem(t, "sdpa")); /* the math kernel forced */
  m.sdpa_math = sdpa && !strcmp(sdpa, "math");
  return m;
}

static vl_mimic_resunet_cfg seg_cfg_of(const cJSON *c) {
  vl_mimic_resunet_cfg m;
  memset(&m, 0, sizeof m);
  const cJSON *md = cJSON_GetObjectItem(c, "model"), *t = cJSON_GetObjectItem(c, "train");
  m.model.image = (int64_t)vl_rep_num(md, "image");
  m.model.in_ch = 3;
  m.model.width = (int64_t)vl_rep_num(md, "width");
  for (int i = 0; i < 4; i++) m.model.blocks[i] = (int)cJSON_GetNumberValue(cJSON_GetArrayItem(cJSON_GetObjectItem(md, "blocks"), i));
  for (int i = 0; i < 5; i++) m.model.dec[i] = (int64_t)cJSON_GetNumberValue(cJSON_GetArrayItem(cJSON_GetObjectItem(md, "dec"), i));
  m.model.classes = (int64_t)vl_rep_num(md, "classes");
  assert_int_equal(vl_dtype_parse(vl_rep_str(t, "compute"), &m.compute), 0);
  assert_int_equal(vl_optimizer_parse(vl_rep_str(t, "optimizer"), &m.optim), 0);
  m.checkpoint = cJSON_IsTrue(cJSON_GetObjectItem(t, "checkpoint"));
  m.relu_inplace = cJSON_IsTrue(cJSON_GetObjectItem(t, "relu_inplace"));
  m.clip = (float)vl_rep_num(t, "clip");
  m.accum = (int64_t)vl_rep_num(t, "accum");
  m.batch = (int64_t)vl_rep_num(c, "batch");
  m.steps = 2;
  m.device = VL_MIMIC_CPU;
  return m;
}

static bool bool_at(const cJSON *a, int i) { return cJSON_IsTrue(cJSON_GetArrayItem(a, i)); }

/* sd_lora_peer.py's JSON as vl_mimic_sd_unet_cfg */
static vl_mimic_sd_unet_cfg sd_cfg_of(const cJSON *c) {
  vl_mimic_sd_unet_cfg m;
  memset(&m, 0, sizeof m);
  const cJSON *md = cJSON_GetObjectItem(c, "model"), *t = cJSON_GetObjectItem(c, "train");
  const cJSON *u = cJSON_GetObjectItem(md, "unet"), *ch = cJSON_GetObjectItem(u, "block_out_channels");
  vl_sd_unet_cfg *x = &m.model;
  x->in_ch = (int64_t)vl_rep_num(u, "in_ch");
  x->out_ch = (int64_t)vl_rep_num(u, "out_ch");
  x->n_blocks = cJSON_GetArraySize(ch);
  for (int i = 0; i < x->n_blocks; i++) {
    x->ch[i] = (int64_t)cJSON_GetNumberValue(cJSON_GetArrayItem(ch, i));
    x->down_attn[i] = bool_at(cJSON_GetObjectItem(u, "down_attn"), i);
    x->up_attn[i] = bool_at(cJSON_GetObjectItem(u, "up_attn"), i);
  }
  x->layers = (int)vl_rep_num(u, "layers");
  x->heads = (int64_t)vl_rep_num(u, "heads");
  x->groups = (int64_t)vl_rep_num(u, "groups");
  x->sample = (int64_t)vl_rep_num(u, "sample");
  x->ctx_len = (int64_t)vl_rep_num(u, "ctx_len");
  x->ctx_dim = (int64_t)vl_rep_num(u, "ctx_dim");
  assert_int_equal(vl_dtype_parse(vl_rep_str(t, "compute"), &x->acts), 0);
  assert_int_equal(vl_dtype_parse(vl_rep_str(t, "frozen"), &x->weights), 0);
  x->lora_rank = (int)vl_rep_num(t, "lora_rank");
  x->lora_alpha = (float)vl_rep_num(t, "lora_alpha");
  x->attn = !strcmp(vl_rep_str(t, "attention"), "classic") ? VL_ATTN_CLASSIC : VL_ATTN_EFFICIENT;
  x->checkpoint = cJSON_IsTrue(cJSON_GetObjectItem(t, "checkpoint"));
  m.encoders_in_step = cJSON_IsTrue(cJSON_GetObjectItem(md, "encoders_in_step"));
  if (m.encoders_in_step) { /* the frozen encoders' sizes (the peer's vae and clip objects) */
    const cJSON *v = cJSON_GetObjectItem(md, "vae"), *vc = cJSON_GetObjectItem(v, "block_out_channels");
    const cJSON *k = cJSON_GetObjectItem(md, "clip");
    m.vae.in_ch = 3;
    m.vae.n_levels = cJSON_GetArraySize(vc);
    for (int i = 0; i < m.vae.n_levels; i++) m.vae.ch[i] = (int64_t)cJSON_GetNumberValue(cJSON_GetArrayItem(vc, i));
    m.vae.layers_per_block = (int)vl_rep_num(v, "layers_per_block");
    m.vae.groups = (int64_t)vl_rep_num(v, "groups");
    m.vae.latent_ch = (int64_t)vl_rep_num(v, "latent_ch");
    m.vae.mid_attn = cJSON_IsTrue(cJSON_GetObjectItem(v, "mid_attn"));
    m.vae.image = (int64_t)vl_rep_num(v, "image");
    m.text.vocab = (int64_t)vl_rep_num(k, "vocab");
    m.text.dim = (int64_t)vl_rep_num(k, "dim");
    m.text.n_layers = (int64_t)vl_rep_num(k, "layers");
    m.text.n_heads = (int64_t)vl_rep_num(k, "heads");
    m.text.ffn = (int64_t)vl_rep_num(k, "ffn");
    m.text.n_pos = (int64_t)vl_rep_num(k, "n_pos");
  }
  assert_int_equal(vl_optimizer_parse(vl_rep_str(t, "optimizer"), &m.optim), 0);
  m.clip = (float)vl_rep_num(t, "clip");
  m.accum = (int64_t)vl_rep_num(t, "accum");
  m.batch = (int64_t)vl_rep_num(c, "batch");
  m.steps = 2;
  m.device = VL_MIMIC_CPU;
  m.traced = true; /* the fixtures' own traces are of fake tensors (a --real one says so) */
  return m;
}

static cJSON *load(const char *path) {
  char *text = NULL;
  size_t n = 0;
  vl_err err;
  if (vl_file_read_text(path, 1u << 24, "16 MiB", &text, &n, &err)) fail_msg("%s", err.msg);
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j) fail_msg("%s is not JSON", path);
  return j;
}

/* ---- the mimic's events ------------------------------------------------------------------- */

typedef struct {
  char op[64];
  char phase;
  int64_t bytes;
} ev;

typedef struct {
  ev *e;
  int64_t n, cap;
} evs;

static void sink(void *user, const vl_mimic_event *e) {
  evs *v = user;
  if (v->n == v->cap) {
    v->cap = v->cap ? 2 * v->cap : 4096;
    v->e = realloc(v->e, (size_t)v->cap * sizeof *v->e);
    assert_non_null(v->e);
  }
  ev *x = &v->e[v->n++];
  snprintf(x->op, sizeof x->op, "%s", e->op);
  x->phase = e->phase;
  x->bytes = e->bytes;
}

/* what exists before the step (the mimic's leaves) */
static bool is_leaf(const char *op) {
  return !strcmp(op, "param") || !strcmp(op, "buffer") || !strcmp(op, "input_ids") || !strcmp(op, "input") ||
         !strcmp(op, "target");
}

/* "mm.default" -> "mm": the overload is not the op */
static void base_name(char *dst, size_t n, const char *op) {
  snprintf(dst, n, "%s", op);
  char *dot = strchr(dst, '.');
  if (dot) *dot = 0;
}

/* Allocations of at least `min` bytes, the leaves before the step left out: (op, phase, bytes). */
static int64_t big_allocs(const evs *v, int64_t min, ev *out) {
  int64_t k = 0;
  for (int64_t i = 0; i < v->n; i++) {
    const ev *e = &v->e[i];
    if (e->bytes < min || is_leaf(e->op)) continue;
    out[k] = *e;
    base_name(out[k].op, sizeof out[k].op, e->op);
    k++;
  }
  return k;
}

static bool same(const ev *a, const ev *b) { return a->bytes == b->bytes && a->phase == b->phase && !strcmp(a->op, b->op); }

/* Longest common subsequence of the two allocation sequences (op by op, in order). */
static int64_t lcs(const ev *a, int64_t na, const ev *b, int64_t nb) {
  /* the common prefix and suffix are in every longest common subsequence: only the middle
   * needs the table (nothing, when the mimic matched exactly) */
  int64_t pre = 0, suf = 0;
  while (pre < na && pre < nb && same(&a[pre], &b[pre])) pre++;
  while (suf < na - pre && suf < nb - pre && same(&a[na - 1 - suf], &b[nb - 1 - suf])) suf++;
  if (pre + suf > 0) return pre + suf + lcs(a + pre, na - pre - suf, b + pre, nb - pre - suf);
  int64_t *prev = calloc((size_t)nb + 1, sizeof *prev), *cur = calloc((size_t)nb + 1, sizeof *cur);
  assert_non_null(prev);
  assert_non_null(cur);
  for (int64_t i = 1; i <= na; i++) {
    for (int64_t j = 1; j <= nb; j++)
      cur[j] = same(&a[i - 1], &b[j - 1]) ? prev[j - 1] + 1 : (prev[j] > cur[j - 1] ? prev[j] : cur[j - 1]);
    int64_t *t = prev;
    prev = cur;
    cur = t;
  }
  int64_t r = prev[nb];
  free(prev);
  free(cur);
  return r;
}

/* Live bytes at the end of each phase run and the highest inside it: phases in order. */
typedef struct {
  char phase;
  int64_t max, end;
} seg;

static int segments(int64_t base, const ev *e, int64_t n, bool skip_leaves, seg *out, int cap) {
  int k = -1;
  int64_t cur = base;
  for (int64_t i = 0; i < n; i++) {
    if (skip_leaves && is_leaf(e[i].op)) continue;
    bool scalar = e[i].bytes < 64 && e[i].bytes > -64; /* a loss or a norm: no phase of its own */
    if (k < 0 || (out[k].phase != e[i].phase && !scalar)) {
      if (k + 1 >= cap) break;
      out[++k] = (seg){e[i].phase, cur, cur};
    }
    cur += e[i].bytes;
    if (cur > out[k].max) out[k].max = cur;
    out[k].end = cur;
  }
  return k + 1;
}

/* How far the mimic is from a trace: returns the number of checks that fail (printing each),
 * so a planted difference can be shown to fail. */
static bool is_seg(const cJSON *fx) { return !strcmp(vl_rep_str(fx, "script"), "seg_peer.py"); }

/* cfg_in: a vl_mimic_llm_cfg or vl_mimic_resunet_cfg (the fixture's script says which) in place
 * of the fixture's own config */
/* How close the mimic must be: peak and phase ends (fractions), a phase's highest, and how many
 * more allocations >= 1 KiB than PyTorch's it may make (every one of PyTorch's must match). */
typedef struct {
  double peak, end, max;
  int extra;
} tol;
static const tol exact = {1e-3, 1e-3, 1e-2, 0};

static int compare_trace_tol(const char *path, const void *cfg_in, bool quiet, tol tl);
static int compare_trace(const char *path, const void *cfg_in, bool quiet) {
  return compare_trace_tol(path, cfg_in, quiet, exact);
}

static int compare_trace_tol(const char *path, const void *cfg_in, bool quiet, tol tl) {
  cJSON *fx = load(path);
  evs v = {0};
  vl_mimic_result r;
  char why[200];
  if (!strcmp(vl_rep_str(fx, "script"), "sd_lora_peer.py")) {
    vl_mimic_sd_unet_cfg cfg = cfg_in ? *(const vl_mimic_sd_unet_cfg *)cfg_in : sd_cfg_of(cJSON_GetObjectItem(fx, "config"));
    if (!cfg_in && cJSON_IsTrue(cJSON_GetObjectItem(fx, "real"))) cfg.traced = false; /* torch_trace.py --real */
    assert_int_equal(vl_mimic_sd_unet(&cfg, &r, sink, &v, why, sizeof why), VL_OK);
  } else if (is_seg(fx)) {
    vl_mimic_resunet_cfg cfg = cfg_in ? *(const vl_mimic_resunet_cfg *)cfg_in : seg_cfg_of(cJSON_GetObjectItem(fx, "config"));
    assert_int_equal(vl_mimic_resunet(&cfg, &r, sink, &v, why, sizeof why), VL_OK);
  } else {
    vl_mimic_llm_cfg cfg = cfg_in ? *(const vl_mimic_llm_cfg *)cfg_in : cfg_of(cJSON_GetObjectItem(fx, "config"));
    if (!cfg_in && cJSON_IsTrue(cJSON_GetObjectItem(fx, "real"))) cfg.traced = false; /* torch_trace.py --real */
    assert_int_equal(vl_mimic_llm(&cfg, &r, sink, &v, why, sizeof why), VL_OK);
  }
  const char *dump = getenv("VL_MIMIC_DUMP"); /* the mimic's events, to read beside the trace */
  FILE *df = dump && !quiet ? fopen(dump, "w") : NULL;
  for (int64_t k = 0; df && k < v.n; k++) fprintf(df, "%s %c %lld\n", v.e[k].op, v.e[k].phase, (long long)v.e[k].bytes);
  if (df) fclose(df);
  int bad = 0;
#define CHECK(cond, ...)                                                                                       \
  do {                                                                                                         \
    if (!(cond)) {                                                                                             \
      bad++;                                                                                                   \
      if (!quiet) print_message(__VA_ARGS__);                                                                  \
    }                                                                                                          \
  } while (0)
  /* the trace's events */
  const cJSON *te = cJSON_GetObjectItem(fx, "events"), *x;
  int64_t nt = cJSON_GetArraySize(te);
  ev *t = calloc((size_t)nt, sizeof *t);
  assert_non_null(t);
  int64_t i = 0;
  cJSON_ArrayForEach(x, te) {
    snprintf(t[i].op, sizeof t[i].op, "%s", cJSON_GetStringValue(cJSON_GetArrayItem(x, 0)));
    t[i].phase = cJSON_GetStringValue(cJSON_GetArrayItem(x, 1))[0];
    t[i].bytes = (int64_t)cJSON_GetNumberValue(cJSON_GetArrayItem(x, 2));
    i++;
  }
  int64_t base = (int64_t)vl_rep_num(fx, "base_bytes"), peak = (int64_t)vl_rep_num(fx, "peak_bytes");
  if (!quiet)
    printf("  %s: peak %lld bytes, PyTorch %lld (%+.4f%%)\n", path, (long long)r.peak_bytes, (long long)peak,
           100 * ((double)r.peak_bytes / (double)peak - 1));
  /* 1. what exists before the step: parameters, buffers, the batch, exactly */
  CHECK(r.base_bytes == base, "%s: before the step %lld bytes, PyTorch %lld\n", path, (long long)r.base_bytes,
        (long long)base);
  /* 2. the peak, within 0.1% */
  CHECK(fabs((double)(r.peak_bytes - peak)) <= tl.peak * (double)peak, "%s: peak %lld, PyTorch %lld\n", path,
        (long long)r.peak_bytes, (long long)peak);
  /* 3. every forward, backward and optimizer phase of both steps: live bytes at its end within
   *    0.1%, its highest within 1% */
  seg ts[64], ms[64];
  int nts = segments(base, t, nt, false, ts, 64), nms = segments(r.base_bytes, v.e, v.n, true, ms, 64);
  CHECK(nts == nms, "%s: %d phases, PyTorch %d\n", path, nms, nts);
  for (int k = 0; k < nts && k < nms; k++) {
    CHECK(ts[k].phase == ms[k].phase, "%s: phase %d is %c, PyTorch's %c\n", path, k, ms[k].phase, ts[k].phase);
    CHECK(fabs((double)(ms[k].end - ts[k].end)) <= tl.end * (double)ts[k].end,
          "%s: phase %d (%c) ends with %lld live bytes, PyTorch %lld\n", path, k, ts[k].phase, (long long)ms[k].end,
          (long long)ts[k].end);
    CHECK(fabs((double)(ms[k].max - ts[k].max)) <= tl.max * (double)ts[k].max,
          "%s: phase %d (%c) reaches %lld bytes, PyTorch %lld\n", path, k, ts[k].phase, (long long)ms[k].max,
          (long long)ts[k].max);
  }
  /* 4. op by op: every allocation of 1 KiB or more, its op, phase and size, in order */
  ev *ta = calloc((size_t)nt, sizeof *ta), *ma = calloc((size_t)v.n, sizeof *ma);
  assert_non_null(ta);
  assert_non_null(ma);
  int64_t nta = big_allocs(&(evs){t, nt, nt}, 1024, ta), nma = big_allocs(&v, 1024, ma);
  int64_t common = lcs(ta, nta, ma, nma);
  CHECK(common == nta && nma - common <= tl.extra,
        "%s: %lld of PyTorch's %lld allocations >= 1 KiB matched in order (the mimic made %lld)\n", path,
        (long long)common, (long long)nta, (long long)nma);
  if (!quiet && (common != nta || nma - common > tl.extra)) { /* the first difference, to start from */
    int64_t k = 0;
    while (k < nta && k < nma && same(&ta[k], &ma[k])) k++;
    if (k < nta && k < nma)
      print_message("  first difference at allocation %lld: PyTorch %s/%c/%lld, mimic %s/%c/%lld\n", (long long)k,
                    ta[k].op, ta[k].phase, (long long)ta[k].bytes, ma[k].op, ma[k].phase, (long long)ma[k].bytes);
  }
#undef CHECK
  free(ta);
  free(ma);
  free(t);
  free(v.e);
  cJSON_Delete(fx);
  return bad;
}

/* The NF4 traces (bitsandbytes 0.50.2 on the CPU, --real: its Python kernels traced inside):
 * llm-qlora-real: --step qlora with train.compute "fp32"; llm-qlora-f16-real: --step qlora as it
 * is (fp16 autocast); llm-qlora-ckpt-real: --step ckpt (NF4, Adafactor, checkpointing, fp16). The
 * Adafactor ones: llm-adafactor (fake, tiny, --step baseline --set baseline.optimizer=adafactor
 * with train.adafactor_beta1 true and seq 16) and llm-adafactor-real (--step lora --set
 * lora.optimizer=adafactor, compute and frozen "fp32"). */
/* llm-base-math-real: llm-base-real's config with train.sdpa "math" (llm_lora_peer.py runs the
 * step under sdpa_kernel(SDPBackend.MATH)): SDPA's math kernel, which CUDA runs for an fp32 step
 * with grouped KV heads (PyTorch 2.11), traced on the CPU; matched exactly. */
/* The llm-*-real traces: the step on real tensors (torch_trace.py --real), the code path the
 * side by side and a GPU run take, at the small scale (sequence 128: position ids and
 * transformers' packed-sequence check are 1 KiB and more):
 *   cfg=$(vramlab peer-config llm-lora --step baseline | jq -c .rungs.baseline.config)   (llm-base-real;
 *   llm-lora-real: --step lora with train.compute and train.frozen "fp32"; llm-fp16-real:
 *   baseline with train.compute "fp16")
 *   python3 tools/peers/torch_trace.py --real --script llm_lora_peer.py --config "$cfg"
 * There no mask is built, SDPA takes k and v at their own heads (enable_gqa), v's gradient
 * comes back in v's strides. sd-f32-enc-real and seg-before-real: sd-lora's `before` (fp32) and
 * seg-ckpt's `before` at the tiny scale, --real (there F.mse_loss keeps its unreduced buffer
 * as the loss's storage). Every one matched exactly. */
static const char *const traces[] = {"llm-base", "llm-fp16", "llm-lora", "llm-loraall", "llm-qwen", "llm-lora-ckpt",
                                     "llm-base-real", "llm-base-math-real", "llm-lora-real", "llm-fp16-real", "llm-adafactor", "llm-adafactor-real", "llm-qlora-real", "llm-qlora-f16-real", "llm-qlora-ckpt-real",
                                     "seg-before", "seg-ckpt", "seg-relu_off", "seg-amp", "sd-f32", "sd-f32-ckpt", "sd-f16", "sd-f16-ckpt", "sd-bf16", "sd-f16-classic", "sd-f32-classic-ckpt",
                                     "sd-f32-enc", "sd-f16-enc", "sd-f32-classic-enc", "sd-f16-classic-enc", "sd-f16-ckpt-enc", "sd-f32-enc-real", "seg-before-real"};
/* The sd-* traces: the ladder's disk_cache rung (cached latents and text embeddings) at the
 * tiny scale, fp16 as the ladder has it, the others by --set:
 *   cfg=$(vramlab peer-config sd-lora --scale tiny --step disk_cache [--set disk_cache.precision=fp32|bf16]
 *         [--set disk_cache.checkpoint=true] | jq -c .rungs.disk_cache.config)
 *   python3 tools/peers/torch_trace.py --script sd_lora_peer.py --config "$cfg"
 * (torch 2.15, diffusers 0.42.1, peft 0.21.2, transformers 5.24.0). The sd-*-enc ones are the
 * uncached `before` rung the same way (--step before [--set before.precision=fp32]
 * [--set before.attention=classic] [--set before.checkpoint=true], .rungs.before.config): the frozen VAE encoder and CLIP
 * under no_grad in every micro-batch. Every one matched exactly. */
/* Hugging Face's gradient checkpointing: within 1.5% (llm-lora-ckpt's peak 0.6% low; llm-qlora-ckpt-real's,
 * the ladder's ckpt rung on real tensors (NF4, Adafactor, fp16), 0.23% low, every one of its 2,882
 * allocations >= 1 KiB matched in order, its phase ends within 2.1%: PyTorch keeps 8 more tensors
 * of 8 KiB past each step's end (64 KiB after the first, 128 KiB after the second), by their size
 * (T x head_dim fp16) the checkpoint frames' cos and sin, inferred rather than traced to their
 * owner; the mimic frees those at their last use). The small tensors the
 * mimic leaves out (the causal mask's and rotary embedding's temporaries, position ids) are
 * kept longer by the checkpoint frames of the layers; the recomputation's early stop makes
 * the mimic allocate four tensors PyTorch does not (checked: at most 4). */
static tol tolerance(const char *name) {
  if (!strcmp(name, "llm-lora-ckpt")) return (tol){1e-2, 1.5e-2, 1.5e-2, 4};
  if (!strcmp(name, "llm-qlora-ckpt-real")) return (tol){1e-2, 2.5e-2, 2.5e-2, 4};
  return exact;
}

static void test_traces(void **state) {
  (void)state;
  int bad = 0;
  const char *only = getenv("VL_MIMIC_ONLY"); /* one trace (with VL_MIMIC_DUMP: its events) */
  for (size_t i = 0; i < sizeof traces / sizeof *traces; i++) {
    if (only && strcmp(only, traces[i])) continue;
    char path[128];
    snprintf(path, sizeof path, "tests/fixtures/trace/%s.json", traces[i]);
    bad += compare_trace_tol(path, NULL, false, tolerance(traces[i]));
  }
  assert_int_equal(bad, 0);
}

/* The comparison fails when the mimic's step is not PyTorch's: another LoRA rank, an fp32
 * step against an autocast trace, no clipping. */
static void test_traces_planted(void **state) {
  (void)state;
  cJSON *fx = load("tests/fixtures/trace/llm-lora.json");
  vl_mimic_llm_cfg c = cfg_of(cJSON_GetObjectItem(fx, "config"));
  cJSON_Delete(fx);
  vl_mimic_llm_cfg r4 = c;
  r4.model.tc.lora_rank = 4;
  assert_true(compare_trace("tests/fixtures/trace/llm-lora.json", &r4, true) > 0);
  vl_mimic_llm_cfg f32 = c;
  f32.model.tc.compute = VL_F32;
  f32.model.tc.frozen = VL_F32;
  assert_true(compare_trace("tests/fixtures/trace/llm-lora.json", &f32, true) > 0);
  vl_mimic_llm_cfg real = c;
  real.traced = false; /* no causal-mask tensor: PyTorch's real run, not its fake-tensor trace */
  assert_true(compare_trace("tests/fixtures/trace/llm-lora.json", &real, true) > 0);
  assert_int_equal(compare_trace("tests/fixtures/trace/llm-lora.json", &c, true), 0);
  /* SDPA's math kernel: the flash kernel's step against its trace */
  const char *mt = "tests/fixtures/trace/llm-base-math-real.json";
  fx = load(mt);
  c = cfg_of(cJSON_GetObjectItem(fx, "config"));
  c.traced = false;
  cJSON_Delete(fx);
  vl_mimic_llm_cfg fl = c;
  fl.sdpa_math = false;
  assert_true(compare_trace(mt, &fl, true) > 0);
  assert_int_equal(compare_trace(mt, &c, true), 0);
  /* Adafactor: AdamW against its trace, no first moment against one with it */
  const char *ada = "tests/fixtures/trace/llm-adafactor.json";
  fx = load(ada);
  c = cfg_of(cJSON_GetObjectItem(fx, "config"));
  cJSON_Delete(fx);
  vl_mimic_llm_cfg a1 = c;
  a1.model.tc.optim.opt = VL_OPT_ADAMW;
  assert_true(compare_trace(ada, &a1, true) > 0);
  a1 = c;
  a1.model.tc.optim.adafactor_beta1 = false;
  assert_true(compare_trace(ada, &a1, true) > 0);
  assert_int_equal(compare_trace(ada, &c, true), 0);
  /* NF4: an fp16 base against the QLoRA trace */
  const char *qt = "tests/fixtures/trace/llm-qlora-f16-real.json";
  fx = load(qt);
  c = cfg_of(cJSON_GetObjectItem(fx, "config"));
  c.traced = false;
  cJSON_Delete(fx);
  a1 = c;
  a1.model.tc.frozen = VL_F16;
  assert_true(compare_trace(qt, &a1, true) > 0);
  assert_int_equal(compare_trace(qt, &c, true), 0);
  /* sd-lora: no checkpointing against a checkpointing trace, another rank, fp32 against fp16,
   * another batch */
  fx = load("tests/fixtures/trace/sd-f16-ckpt.json");
  vl_mimic_sd_unet_cfg s = sd_cfg_of(cJSON_GetObjectItem(fx, "config"));
  cJSON_Delete(fx);
  vl_mimic_sd_unet_cfg s1 = s;
  s1.model.checkpoint = false;
  assert_true(compare_trace("tests/fixtures/trace/sd-f16-ckpt.json", &s1, true) > 0);
  s1 = s;
  s1.model.lora_rank = 4;
  assert_true(compare_trace("tests/fixtures/trace/sd-f16-ckpt.json", &s1, true) > 0);
  s1 = s;
  s1.model.acts = s1.model.weights = VL_F32;
  assert_true(compare_trace("tests/fixtures/trace/sd-f16-ckpt.json", &s1, true) > 0);
  s1 = s;
  s1.batch = 1;
  assert_true(compare_trace("tests/fixtures/trace/sd-f16-ckpt.json", &s1, true) > 0);
  assert_int_equal(compare_trace("tests/fixtures/trace/sd-f16-ckpt.json", &s, true), 0);
  /* an uncached rung: cached inputs, no mid-block attention in the VAE, one CLIP layer less,
   * classic attention against SDPA's trace, a VAE resnet more a level */
  const char *enc = "tests/fixtures/trace/sd-f16-enc.json";
  fx = load(enc);
  s = sd_cfg_of(cJSON_GetObjectItem(fx, "config"));
  cJSON_Delete(fx);
  s1 = s;
  s1.encoders_in_step = false;
  assert_true(compare_trace(enc, &s1, true) > 0);
  s1 = s;
  s1.vae.mid_attn = false;
  assert_true(compare_trace(enc, &s1, true) > 0);
  s1 = s;
  s1.text.n_layers--;
  assert_true(compare_trace(enc, &s1, true) > 0);
  s1 = s;
  s1.model.attn = VL_ATTN_CLASSIC;
  assert_true(compare_trace(enc, &s1, true) > 0);
  s1 = s;
  s1.vae.layers_per_block++;
  assert_true(compare_trace(enc, &s1, true) > 0);
  assert_int_equal(compare_trace(enc, &s, true), 0);
  /* checkpointing with the encoders in the step: CLIP's output lives on in the transformer
   * blocks' frames; without checkpointing it does not match */
  enc = "tests/fixtures/trace/sd-f16-ckpt-enc.json";
  fx = load(enc);
  s = sd_cfg_of(cJSON_GetObjectItem(fx, "config"));
  cJSON_Delete(fx);
  s1 = s;
  s1.model.checkpoint = false;
  assert_true(compare_trace(enc, &s1, true) > 0);
  assert_int_equal(compare_trace(enc, &s, true), 0);
}

/* MemTracker's peak of each rung of a fixture, to 0.1%: the mimic's peak less the batch
 * (MemTracker does not count the input, created before it tracks). The small-scale fixtures
 * and the full-scale ones (*-full.json: the article's models on fake tensors, the 7B step
 * among them, tools/peers/memtracker_all.py --scale full --no-real) */
static int memtracker_fixture(const char *path) {
  cJSON *fx = load(path);
  const cJSON *r;
  int n = 0;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(fx, "rungs")) {
    const cJSON *cfg = cJSON_GetObjectItem(r, "config"), *mt = cJSON_GetObjectItem(r, "memtracker");
    if (!cfg || !cJSON_IsNumber(cJSON_GetObjectItem(mt, "peak_bytes"))) continue;
    vl_mimic_result m;
    char why[200];
    if (!strcmp(vl_rep_str(r, "script"), "sd_lora_peer.py")) {
      vl_mimic_sd_unet_cfg c = sd_cfg_of(cfg);
      assert_int_equal(vl_mimic_sd_unet(&c, &m, NULL, NULL, why, sizeof why), VL_OK);
    } else if (!strcmp(vl_rep_str(r, "script"), "seg_peer.py")) {
      vl_mimic_resunet_cfg c = seg_cfg_of(cfg);
      assert_int_equal(vl_mimic_resunet(&c, &m, NULL, NULL, why, sizeof why), VL_OK);
    } else {
      vl_mimic_llm_cfg c = cfg_of(cfg);
      assert_int_equal(vl_mimic_llm(&c, &m, NULL, NULL, why, sizeof why), VL_OK);
    }
    double want = vl_rep_num(mt, "peak_bytes"), got = (double)(m.peak_bytes - m.cat[VL_MC_OTH]);
    printf("  %s %s: mimic %.0f bytes, MemTracker %.0f (%+.4f%%)\n", path, r->string, got, want, 100 * (got / want - 1));
    if (fabs(got - want) > 1e-3 * want)
      fail_msg("%s: mimic %.0f bytes, MemTracker %.0f (%+.3f%%)", r->string, got, want, 100 * (got / want - 1));
    /* parameters and optimizer state are the same tensors on both sides; at a peak in the
     * optimizer step MemTracker files everything made inside optimizer.step under OPT, its
     * temporaries too, which the mimic calls TEMP (7B: the embedding's AdamW temporaries, 1 GB) */
    const cJSON *cats = cJSON_GetObjectItem(mt, "categories");
    assert_int_equal(m.cat[VL_MC_PARAM], (int64_t)vl_rep_num(cats, "PARAM"));
    bool in_opt = m.peak_phase == 'o';
    double opt = (double)(m.cat[VL_MC_OPT] + (in_opt ? m.cat[VL_MC_TEMP] : 0)),
           mt_opt = vl_rep_num(cats, "OPT") + (in_opt ? vl_rep_num(cats, "TEMP") : 0);
    assert_true(fabs(opt - mt_opt) <= 1e-3 * mt_opt + 4096);
    n++;
  }
  cJSON_Delete(fx);
  return n;
}

static void test_memtracker(void **state) {
  (void)state;
  assert_true(memtracker_fixture("tests/fixtures/memtracker/llm-lora.json") >= 3);
  assert_true(memtracker_fixture("tests/fixtures/memtracker/llm-lora-full.json") >= 3);
  /* the families of --model-config in their own transformers classes, at full size
   * (memtracker_all.py --model-config: LlamaForCausalLM, Qwen2ForCausalLM) */
  assert_true(memtracker_fixture("tests/fixtures/memtracker/llm-lora-llama-3.2-1b-full.json") >= 3);
  assert_true(memtracker_fixture("tests/fixtures/memtracker/llm-lora-qwen2.5-0.5b-full.json") >= 3);
  /* and the sizes users bring: Llama-3-8B (untied head, 128k vocabulary: baseline 132.7 GB)
   * and Qwen2.5-7B (q/k/v biases, untied at 7B: 126.2 GB) */
  assert_true(memtracker_fixture("tests/fixtures/memtracker/llm-lora-llama-3-8b-full.json") >= 3);
  assert_true(memtracker_fixture("tests/fixtures/memtracker/llm-lora-qwen2.5-7b-full.json") >= 3);
  assert_true(memtracker_fixture("tests/fixtures/memtracker/seg-ckpt.json") >= 5);
  assert_true(memtracker_fixture("tests/fixtures/memtracker/seg-ckpt-full.json") >= 5);
  /* sd-lora: the cached rungs (disk_cache, prefetch16, ram_cache) and the uncached ones (before,
   * batched_workers: the frozen VAE encoder and CLIP in the step; -0.001%: MemTracker counts the
   * token ids, a batch tensor made before it tracks, as an activation once CLIP's
   * input_ids.view() hands it their storage, B x 77 x 8 = 4,928 of the 5,008 bytes the mimic
   * is under, at both scales) */
  assert_true(memtracker_fixture("tests/fixtures/memtracker/sd-lora.json") >= 5);
  assert_true(memtracker_fixture("tests/fixtures/memtracker/sd-lora-full.json") >= 5);
}

static vl_mimic_llm_cfg small_cfg(void) {
  vl_mimic_llm_cfg c;
  memset(&c, 0, sizeof c);
  vl_mistral_cfg *m = &c.model.mc;
  *m = (vl_mistral_cfg){.vocab = 4096, .dim = 256, .n_layers = 4, .n_heads = 8, .n_kv_heads = 2, .head_dim = 32,
                        .ffn = 896, .seq = 128, .rope_theta = 1e4f, .norm_eps = 1e-5f};
  vl_train_cfg_default(&c.model.tc);
  c.model.tc.compute = VL_F32;
  c.model.tc.frozen = VL_F32;
  c.model.tc.lora_rank = 0;
  c.model.tc.optim.opt = VL_OPT_ADAMW;
  c.model.tc.clip = 1;
  c.batch = 2;
  c.seq = 128;
  c.accum = 1;
  c.steps = 2;
  c.device = VL_MIMIC_CUDA;
  return c;
}

typedef vl_status (*mimic_run)(const void *cfg, int64_t batch, uint64_t capacity, vl_mimic_result *r, char *why,
                               size_t whyn);

/* kit's largest-batch search over a mimic (plan --mimic pytorch) under cap: above `batch`,
 * fits, reserved within cap; that batch replays without running out, one more does not. */
static int64_t check_search(mimic_run run, const void *cfg, int64_t batch, uint64_t cap) {
  cJSON *o = cJSON_CreateObject();
  vl_case_pytorch_json(o, run, cfg, batch, cap, "test");
  const cJSON *pt = cJSON_GetObjectItem(o, "pytorch");
  int64_t mb = (int64_t)vl_rep_num(pt, "max_batch");
  assert_true(mb > batch);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(pt, "fits")));
  assert_true(vl_rep_num(pt, "max_reserved_bytes") <= (double)cap);
  cJSON_Delete(o);
  vl_mimic_result r;
  char why[200];
  assert_int_equal(run(cfg, mb, cap, &r, why, sizeof why), VL_OK);
  assert_false(r.oom);
  assert_int_equal(run(cfg, mb + 1, cap, &r, why, sizeof why), VL_OK);
  assert_true(r.oom);
  return mb;
}

static vl_status run_llm_cuda(const void *cfg, int64_t batch, uint64_t capacity, vl_mimic_result *r, char *why,
                              size_t whyn) {
  vl_mimic_llm_cfg c = *(const vl_mimic_llm_cfg *)cfg;
  c.batch = batch;
  c.capacity = capacity;
  return vl_mimic_llm(&c, r, NULL, NULL, why, whyn);
}

/* The CUDA code path: the foreach AdamW's sqrt of every exp_avg_sq at once, SDPA's enable_gqa
 * (no repeat_kv copies), the caching allocator's 512-byte blocks and segments. */
static void test_cuda_path(void **state) {
  (void)state;
  vl_mimic_llm_cfg g = small_cfg(), c = small_cfg();
  c.device = VL_MIMIC_CPU;
  vl_mimic_result rg, rc;
  char why[200];
  assert_int_equal(vl_mimic_llm(&g, &rg, NULL, NULL, why, sizeof why), VL_OK);
  assert_int_equal(vl_mimic_llm(&c, &rc, NULL, NULL, why, sizeof why), VL_OK);
  int64_t params = rg.cat[VL_MC_PARAM];
  /* full fine-tune: the first step's peak is in the optimizer, with params, grads, 2x state and
   * the foreach temporaries (one more parameter-sized set) */
  assert_int_equal(rg.peak_phase, 'o');
  assert_true(rg.peak_bytes >= 5 * params);
  assert_true(rc.peak_bytes < rg.peak_bytes);
  assert_true(rg.max_allocated >= rg.peak_bytes);
  /* 512-byte blocks, and cuBLAS's two workspaces (test_cublas_workspace) */
  assert_true(rg.max_allocated <= rg.peak_bytes + 2 * vl_mimic_cublas_workspace(8) + 512 * rg.n_events);
  assert_true(rg.max_reserved >= rg.max_allocated);
  assert_int_equal(rg.max_reserved % (2 << 20), 0);
  assert_int_equal(rc.max_allocated, 0); /* no allocator replay on the CPU */
  /* the largest batch under a capacity (kit's search over the mimic): it fits, one more does not */
  uint64_t cap = (uint64_t)rg.max_reserved * 3;
  (void)check_search(run_llm_cuda, &g, 2, cap);
  cJSON *o = cJSON_CreateObject();
  vl_case_pytorch_json(o, run_llm_cuda, &g, 2, 1 << 20, "test");
  assert_int_equal((int)vl_rep_num(cJSON_GetObjectItem(o, "pytorch"), "max_batch"), 0);
  assert_false(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "pytorch"), "fits")));
  cJSON_Delete(o);
  /* an NF4 base (QLoRA) under fp16 autocast: on CUDA PEFT's bitsandbytes layer casts no input to
   * fp32 (torch.is_autocast_enabled() asks about CUDA alone), so each adapter saves the shared x
   * where the CPU path saves its own fp16 copy: CUDA keeps less; the weights are the same */
  vl_mimic_llm_cfg q = g;
  q.model.tc.lora_rank = 8;
  q.model.tc.lora_alpha = 16;
  q.model.tc.frozen = VL_NF4;
  q.model.tc.compute = VL_F16;
  vl_mimic_result rq, rqc;
  assert_int_equal(vl_mimic_llm(&q, &rq, NULL, NULL, why, sizeof why), VL_OK);
  q.device = VL_MIMIC_CPU;
  assert_int_equal(vl_mimic_llm(&q, &rqc, NULL, NULL, why, sizeof why), VL_OK);
  assert_int_equal(rq.base_bytes, rqc.base_bytes);
  assert_true(rq.peak_bytes < rqc.peak_bytes);
  assert_true(rq.max_allocated >= rq.peak_bytes);
  assert_true(rq.max_reserved >= rq.max_allocated);
}

typedef struct {
  int64_t b[64];
  int n;
} bw_allocs;

static void flash_bw_sink(void *user, const vl_mimic_event *e) {
  bw_allocs *a = user;
  if (e->bytes > 0 && strcmp(e->op, "_scaled_dot_product_flash_attention_backward") == 0 && a->n < 64)
    a->b[a->n++] = e->bytes;
}

/* CUDA's flash attention backward (PyTorch's FlashAttention-2 mha_bwd, read from its source):
 * dq, dk, dv, then softmax_d (B·H·Tq rounded up to 128, fp32), dq_accum (B·Tq rounded·H·hd
 * rounded up to 32, fp32) and, with grouped KV heads, dK and dV at every query head (fp16) */
static void test_flash_backward_buffers(void **state) {
  (void)state;
  vl_mimic_llm_cfg c = small_cfg(); /* 8 heads, 2 KV heads, head dim 32, 4 layers */
  c.model.tc.lora_rank = 8;
  c.model.tc.lora_alpha = 16;
  c.model.tc.compute = VL_F16; /* autocast: SDPA runs in fp16, flash attention */
  c.seq = c.model.mc.seq = 100;
  vl_mimic_result r;
  char why[200];
  bw_allocs a = {.n = 0};
  assert_int_equal(vl_mimic_llm(&c, &r, flash_bw_sink, &a, why, sizeof why), VL_OK);
  const int64_t B = 2, H = 8, KV = 2, T = 100, hd = 32;
  const int64_t want[7] = {B * H * T * hd * 2, B * KV * T * hd * 2, B * KV * T * hd * 2, B * H * 128 * 4,
                           B * 128 * H * hd * 4, B * H * T * hd * 2, B * H * T * hd * 2};
  assert_int_equal(a.n, 7 * 4 * 2); /* every layer's backward, two steps */
  for (int i = 0; i < a.n; i++) assert_int_equal(a.b[i], want[i % 7]);
  /* heads not grouped: no expanded dK, dV */
  c.model.mc.n_kv_heads = 8;
  a.n = 0;
  assert_int_equal(vl_mimic_llm(&c, &r, flash_bw_sink, &a, why, sizeof why), VL_OK);
  assert_int_equal(a.n, 5 * 4 * 2);
  assert_int_equal(a.b[4], B * 128 * H * hd * 4);
  /* fp32 (flash takes fp16/bf16 only) and the CPU's flash kernel: none of these */
  c.model.tc.compute = VL_F32;
  a.n = 0;
  assert_int_equal(vl_mimic_llm(&c, &r, flash_bw_sink, &a, why, sizeof why), VL_OK);
  assert_int_equal(a.n, 3 * 4 * 2);
  c.model.mc.n_kv_heads = 2; /* fp32 with grouped KV heads: the math kernel (PyTorch 2.11), no flash */
  a.n = 0;
  assert_int_equal(vl_mimic_llm(&c, &r, flash_bw_sink, &a, why, sizeof why), VL_OK);
  assert_int_equal(a.n, 0);
  c.model.tc.compute = VL_F16;
  c.device = VL_MIMIC_CPU;
  a.n = 0;
  assert_int_equal(vl_mimic_llm(&c, &r, flash_bw_sink, &a, why, sizeof why), VL_OK);
  assert_int_equal(a.n, 0);
}

static vl_status run_sd_cuda(const void *cfg, int64_t batch, uint64_t capacity, vl_mimic_result *r, char *why,
                             size_t whyn) {
  vl_mimic_sd_unet_cfg c = *(const vl_mimic_sd_unet_cfg *)cfg;
  c.batch = batch;
  c.capacity = capacity;
  return vl_mimic_sd_unet(&c, r, NULL, NULL, why, whyn);
}

/* sd-lora's CUDA code path (no trace: the tracer runs on the CPU): the caching allocator's
 * blocks and segments and cuBLAS's two workspaces over the live tensors, autocast's fp32 norms
 * (more than the CPU's fp16 ones), the capacity search of plan --mimic pytorch. */
static void test_sd_cuda_path(void **state) {
  (void)state;
  cJSON *fx = load("tests/fixtures/trace/sd-f16.json");
  vl_mimic_sd_unet_cfg c = sd_cfg_of(cJSON_GetObjectItem(fx, "config")), g = c;
  cJSON_Delete(fx);
  g.device = VL_MIMIC_CUDA;
  vl_mimic_result rc, rg, rk;
  char why[200];
  assert_int_equal(vl_mimic_sd_unet(&c, &rc, NULL, NULL, why, sizeof why), VL_OK);
  assert_int_equal(vl_mimic_sd_unet(&g, &rg, NULL, NULL, why, sizeof why), VL_OK);
  assert_int_equal(rc.max_allocated, 0);
  assert_int_equal(rg.base_bytes, rc.base_bytes);
  assert_true(rg.peak_bytes > rc.peak_bytes);
  int64_t ws = vl_mimic_cublas_workspace(8);
  assert_true(rg.max_allocated >= rg.peak_bytes + ws);
  assert_true(rg.max_allocated <= rg.peak_bytes + 2 * ws + 512 * rg.n_events);
  assert_true(rg.max_reserved >= rg.max_allocated);
  assert_int_equal(rg.max_reserved % (2 << 20), 0);
  (void)check_search(run_sd_cuda, &g, g.batch, (uint64_t)rg.max_reserved * 3);
  /* an uncached rung on CUDA (no trace either): the frozen encoders under no_grad before the
   * U-Net, autocast's fp32 GroupNorm / LayerNorm and exp in them; the same rules, the same
   * search */
  fx = load("tests/fixtures/trace/sd-f16-enc.json");
  vl_mimic_sd_unet_cfg ec = sd_cfg_of(cJSON_GetObjectItem(fx, "config")), eg = ec;
  cJSON_Delete(fx);
  eg.device = VL_MIMIC_CUDA;
  vl_mimic_result re, rge;
  assert_int_equal(vl_mimic_sd_unet(&ec, &re, NULL, NULL, why, sizeof why), VL_OK);
  assert_int_equal(vl_mimic_sd_unet(&eg, &rge, NULL, NULL, why, sizeof why), VL_OK);
  assert_int_equal(rge.base_bytes, re.base_bytes);
  assert_true(rge.base_bytes > rg.base_bytes); /* the encoders' weights and the images */
  assert_true(rge.peak_bytes > rg.peak_bytes);
  assert_true(rge.max_allocated >= rge.peak_bytes + ws);
  assert_true(rge.max_allocated <= rge.peak_bytes + 2 * ws + 512 * rge.n_events);
  assert_true(rge.max_reserved >= rge.max_allocated);
  assert_int_equal(rge.max_reserved % (2 << 20), 0);
  (void)check_search(run_sd_cuda, &eg, eg.batch, (uint64_t)rge.max_reserved * 3);
  eg.model.attn = VL_ATTN_CLASSIC; /* AttnProcessor's fp32 softmax, CLIP's eager mask */
  assert_int_equal(vl_mimic_sd_unet(&eg, &rk, NULL, NULL, why, sizeof why), VL_OK);
  assert_true(rk.max_allocated > rge.max_allocated);
  /* encoders that do not feed this U-Net */
  ec.vae.image *= 2;
  assert_int_equal(vl_mimic_sd_unet(&ec, &re, NULL, NULL, why, sizeof why), VL_ERR_INVALID);
  /* what it does not mimic is said */
  c.optim = VL_OPT_SGD;
  assert_int_equal(vl_mimic_sd_unet(&c, &rc, NULL, NULL, why, sizeof why), VL_ERR_UNSUPPORTED);
  assert_non_null(strstr(why, "AdamW"));
  cJSON *o = cJSON_CreateObject(); /* and the report's object says it */
  vl_case_pytorch_json(o, run_sd_cuda, &c, c.batch, 1u << 30, "test");
  assert_non_null(strstr(vl_rep_str(cJSON_GetObjectItem(o, "pytorch"), "not_mimicked"), "AdamW"));
  cJSON_Delete(o);
  /* classic attention on CUDA: the scores' softmax in fp32 under autocast */
  c.optim = VL_OPT_ADAMW;
  c.model.attn = VL_ATTN_CLASSIC;
  c.device = VL_MIMIC_CUDA;
  assert_int_equal(vl_mimic_sd_unet(&c, &rk, NULL, NULL, why, sizeof why), VL_OK);
  c.model.attn = VL_ATTN_EFFICIENT;
  assert_int_equal(vl_mimic_sd_unet(&c, &rc, NULL, NULL, why, sizeof why), VL_OK);
  assert_true(rk.max_allocated > rc.max_allocated);
}

/* cuBLAS's workspaces on CUDA: one per thread's handle (forward's, autograd's), from the
 * caching allocator, kept; not tensors. Held to what an H200 measured (first light,
 * reports/gpu/cuda-nvidia-h200: llm-lora `baseline` at small scale, torch 2.11,
 * max_memory_allocated 177,259,008 bytes in a fresh peer process). */
static void test_cublas_workspace(void **state) {
  (void)state;
  assert_int_equal(vl_mimic_cublas_workspace(9), 32 << 20);
  assert_int_equal(vl_mimic_cublas_workspace(8), 8519680);
  vl_mimic_llm_cfg h = small_cfg(), a = small_cfg(), c = small_cfg();
  h.cuda_cc_major = 9; /* H200 */
  c.device = VL_MIMIC_CPU;
  c.cuda_cc_major = 9;
  vl_mimic_result rh, ra, rc, rc0;
  char why[200];
  assert_int_equal(vl_mimic_llm(&h, &rh, NULL, NULL, why, sizeof why), VL_OK);
  assert_int_equal(vl_mimic_llm(&a, &ra, NULL, NULL, why, sizeof why), VL_OK); /* 0: the RTX 4090's */
  assert_int_equal(vl_mimic_llm(&c, &rc, NULL, NULL, why, sizeof why), VL_OK);
  c.cuda_cc_major = 0;
  assert_int_equal(vl_mimic_llm(&c, &rc0, NULL, NULL, why, sizeof why), VL_OK);
  /* not tensors: the live-tensor peak is the same; the CPU path has none */
  assert_int_equal(rh.peak_bytes, ra.peak_bytes);
  assert_int_equal(rc.peak_bytes, rc0.peak_bytes);
  /* both live at the optimizer's peak: two workspaces' difference exactly */
  assert_int_equal(rh.max_allocated - ra.max_allocated, 2 * ((32 << 20) - 8519680));
  assert_true(ra.max_allocated >= ra.peak_bytes + 2 * 8519680);
  double want = 177259008;
  printf("  H200 llm-lora baseline: mimic max_allocated %lld, PyTorch 177259008 (%+.4f%%)\n",
         (long long)rh.max_allocated, 100 * ((double)rh.max_allocated / want - 1));
  if (fabs((double)rh.max_allocated - want) > 1e-4 * want)
    fail_msg("H200 baseline: mimic %lld, PyTorch %.0f (%+.4f%%)", (long long)rh.max_allocated, want,
             100 * ((double)rh.max_allocated / want - 1));
}

/* What it does not mimic is said, not guessed. */
static void test_refused(void **state) {
  (void)state;
  vl_mimic_llm_cfg c = small_cfg();
  vl_mimic_result r;
  char why[200];
  c.model.tc.frozen = VL_NF4; /* an NF4 base needs LoRA (the engine refuses it too) */
  assert_int_equal(vl_mimic_llm(&c, &r, NULL, NULL, why, sizeof why), VL_ERR_INVALID);
  assert_non_null(strstr(why, "NF4"));
  c = small_cfg();
  c.batch = 0;
  assert_int_equal(vl_mimic_llm(&c, &r, NULL, NULL, why, sizeof why), VL_ERR_INVALID);
}

/* Gradient accumulation: micro-batches after the third repeat the one before, so the mimic replays
 * at most MT_MICRO_MAX of them (engine/mimic/tape.h). The premise, checked on the CUDA path (peaks
 * and the caching allocator's high-water marks) with an NF4 base and Adafactor, with and without
 * checkpointing: accum 3 and 8 (both replayed whole) plan the same; 4096 plans as 8, in a moment. */
static void test_accum_repeats(void **state) {
  (void)state;
  char why[200];
  for (int ck = 0; ck < 2; ck++) {
    vl_mimic_llm_cfg c = small_cfg();
    c.model.tc.lora_rank = 8;
    c.model.tc.lora_alpha = 16;
    c.model.tc.frozen = VL_NF4;
    c.model.tc.compute = VL_F16;
    c.model.tc.optim.opt = VL_OPT_ADAFACTOR;
    c.model.tc.checkpoint = ck;
    vl_mimic_result r[3];
    const int64_t acc[3] = {3, 8, 4096};
    for (int i = 0; i < 3; i++) {
      c.accum = acc[i];
      assert_int_equal(vl_mimic_llm(&c, &r[i], NULL, NULL, why, sizeof why), VL_OK);
    }
    for (int i = 1; i < 3; i++) {
      assert_int_equal(r[i].peak_bytes, r[0].peak_bytes);
      assert_int_equal(r[i].max_allocated, r[0].max_allocated);
      assert_int_equal(r[i].max_reserved, r[0].max_reserved);
    }
    assert_true(r[1].n_events > r[0].n_events); /* 8 replayed whole */
    assert_int_equal(r[2].n_events, r[1].n_events);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_traces),   cmocka_unit_test(test_traces_planted), cmocka_unit_test(test_memtracker),
      cmocka_unit_test(test_cuda_path), cmocka_unit_test(test_flash_backward_buffers),
      cmocka_unit_test(test_sd_cuda_path),
      cmocka_unit_test(test_cublas_workspace), cmocka_unit_test(test_refused), cmocka_unit_test(test_accum_repeats),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
