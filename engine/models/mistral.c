/* Mistral decoder training step: explicit forward/backward per layer (llm.c style).
 * Rows R = B*T; C = dim; H heads of D; KVH key/value heads (GQA: rep = H/KVH query heads
 * share one KV head); F = ffn. Activations are stored in the compute dtype (fp32 or the
 * AMP half type); gradients of weights are fp32. */
#include "vramlab/mistral.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { LQ, LK, LV, LO, LG, LU, LD, NLIN };
enum { P_LN1, P_LN2, P_LIN0 };               /* per-layer param slots: norms, then linears */
#define PER_LAYER (P_LIN0 + NLIN * 3)        /* each linear: base W, LoRA A, LoRA B */

/* Everything one layer allocates during a step; freed as backward consumes it, and all
 * freed by cleanup() when a step fails (OOM), so the engine keeps working. Shapes use
 * R = B*T rows; in the compute dtype unless marked fp32. */
typedef struct {
  vl_tensor ln1;      // (R, C) RMSNorm 1 output: input of q, k, v
  vl_tensor rstd1;    // (R) fp32 1/rms of the layer input
  vl_tensor q;        // (B, H, T, D) after RoPE
  vl_tensor k;        // (B, KVH, T, D) after RoPE
  vl_tensor v;        // (B, KVH, T, D)
  vl_tensor P;        // (B*H*T, T) causal softmax of q k^T / sqrt(D); dP, dS in backward
  vl_tensor att;      // (R, H*D) attention output, heads back in (B, T, H, D) order
  vl_tensor res2;     // (R, C) x + att Wo^T: the residual after attention
  vl_tensor ln2;      // (R, C) RMSNorm 2 output: input of gate and up
  vl_tensor rstd2;    // (R) fp32 1/rms of res2
  vl_tensor g;        // (R, F) gate projection
  vl_tensor u;        // (R, F) up projection
  vl_tensor h;        // (R, F) silu(g) * u: input of down
  vl_tensor xa[NLIN]; // (R, r) LoRA x A^T of each linear, kept for dB
} layer_acts;

/* What one micro-batch allocates outside the layers. */
typedef struct {
  vl_tensor data;     // (2, B, T) int32, category data: the micro-batch on the device
  vl_tensor tok;      // (B, T) int32 view of data: token ids
  vl_tensor tgt;      // (B, T) int32 view of data: targets, -1 ignored
  vl_tensor lnf;      // (R, C) final RMSNorm output
  vl_tensor rstdf;    // (R) fp32 1/rms of the last residual
  vl_tensor logits;   // (R, V) logits, then dlogits in place (fused cross-entropy)
  vl_tensor loss;     // (R) fp32 per-token loss
  vl_tensor dres;     // (R, C) gradient of the residual stream, layer by layer down
  vl_tensor dlnf;     // (R, C) gradient of lnf
  vl_tensor tmp[8];   // a layer's backward temps; shapes at each use in layer_bwd
} step_tensors;

struct vl_mistral {
  vl_ctx *c;
  vl_mistral_cfg mc;
  vl_train_cfg tc;
  vl_param *params; int n_params;
  int p_embed, p_normf, p_head, p_layer0;
  int p_bias0;        // qkv_bias: layer l's q, k, v biases at p_bias0 + 3 l + {0, 1, 2}
  vl_tensor *res;     // L+1 tensors (R, C): the residual stream, res[l] is layer l's input
  layer_acts *acts;   // L: each layer's activations
  step_tensors step;  // the micro-batch's own tensors
  vl_scaler sc;       /* loss scale and optimizer step count */
  double pending_loss; int64_t pending_tokens;
};

/* ---- presets ------------------------------------------------------------------------ */
int vl_mistral_preset(const char *scale, vl_mistral_cfg *o) {
  memset(o, 0, sizeof *o);
  o->rope_theta = 10000.0f;
  o->norm_eps = 1e-5f;
  if (!strcasecmp(scale, "full")) {
    *o = (vl_mistral_cfg){32000, 4096, 32, 32, 8, 128, 14336, 512, 10000.0f, 1e-5f, 0, 0};
  } else if (!strcasecmp(scale, "small")) {
    *o = (vl_mistral_cfg){4096, 256, 4, 8, 2, 32, 896, 128, 10000.0f, 1e-5f, 0, 0};
  } else if (!strcasecmp(scale, "tiny")) {
    *o = (vl_mistral_cfg){256, 64, 2, 4, 2, 16, 128, 32, 10000.0f, 1e-5f, 0, 0};
  } else {
    return -1;
  }
  return 0;
}

void vl_train_cfg_default(vl_train_cfg *t) {
  memset(t, 0, sizeof *t);
  t->compute = VL_F32;
  t->frozen = VL_F32;
  t->lora_alpha = 16.0f;
  vl_optim_cfg_default(&t->optim, 1e-4f);
  t->clip = 1.0f;
  t->loss_scale = 65536.0f;
  t->loss_scale_window = 2000;
}

/* ---- parameters --------------------------------------------------------------------- */
/* Parameter `slot` of layer l (P_LN1, P_LN2, or a linear's). */
static vl_param *layer_param(vl_mistral *m, int64_t l, int slot) {
  return &m->params[m->p_layer0 + l * PER_LAYER + slot];
}
/* Linear `lin` of layer l: which 0 is the base W (out, in), 1 LoRA A (r, in), 2 LoRA B
 * (out, r). */
static vl_param *linear_param(vl_mistral *m, int64_t l, int lin, int which) {
  return layer_param(m, l, P_LIN0 + lin * 3 + which);
}

/* The bias of linear `lin` of layer l: q, k and v under qkv_bias; NULL otherwise. */
static vl_param *bias_param(vl_mistral *m, int64_t l, int lin) {
  if (!m->mc.qkv_bias || lin > LV) return NULL;
  return &m->params[m->p_bias0 + l * 3 + lin];
}

static bool lora_on(const vl_mistral *m, int lin) {
  if (m->tc.lora_rank <= 0) return false;
  return m->tc.lora_targets == VL_LORA_ALL || lin <= LO;
}

static void lin_shape(const vl_mistral_cfg *mc, int lin, int64_t *out, int64_t *in) {
  int64_t C = mc->dim, HD = mc->n_heads * mc->head_dim, KD = mc->n_kv_heads * mc->head_dim;
  switch (lin) {
    case LQ: *out = HD; *in = C; break;
    case LK: case LV: *out = KD; *in = C; break;
    case LO: *out = C; *in = HD; break;
    case LG: case LU: *out = mc->ffn; *in = C; break;
    default: *out = C; *in = mc->ffn; break;
  }
}

static const char *lin_name[NLIN] = {"q", "k", "v", "o", "gate", "up", "down"};

static vl_status validate(vl_ctx *c, const vl_mistral_cfg *mc, const vl_train_cfg *tc) {
  if (mc->vocab < 2 || mc->dim < 2 || mc->n_layers < 1 || mc->n_heads < 1 || mc->head_dim < 2 ||
      mc->ffn < 1 || mc->seq < 1)
    return vl_fail(c, VL_ERR_INVALID, "model config: every size must be positive");
  if (mc->head_dim % 2) return vl_fail(c, VL_ERR_INVALID, "head_dim %lld must be even (RoPE)", (long long)mc->head_dim);
  if (mc->n_kv_heads < 1 || mc->n_heads % mc->n_kv_heads)
    return vl_fail(c, VL_ERR_INVALID, "n_heads %lld must be a multiple of n_kv_heads %lld",
                   (long long)mc->n_heads, (long long)mc->n_kv_heads);
  if (tc->compute != VL_F32 && tc->compute != VL_F16 && tc->compute != VL_BF16)
    return vl_fail(c, VL_ERR_INVALID, "compute dtype %s: fp32, fp16 or bf16 expected",
                   vl_dtype_name(tc->compute));
  if (tc->frozen == VL_I32 || (unsigned)tc->frozen >= VL_DTYPE_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "frozen dtype %s: fp32, fp16, bf16 or nf4 expected",
                   vl_dtype_name(tc->frozen));
  if (tc->lora_rank < 0) return vl_fail(c, VL_ERR_INVALID, "lora rank %d < 0", tc->lora_rank);
  if (tc->lora_rank == 0 && tc->frozen == VL_NF4)
    return vl_fail(c, VL_ERR_INVALID, "an nf4 base needs LoRA (lora_rank > 0): nf4 weights cannot be trained");
  if (tc->frozen == VL_NF4 && ((mc->dim * mc->ffn) % 64 || (mc->dim * mc->head_dim) % 64))
    return vl_fail(c, VL_ERR_INVALID, "nf4 needs weight sizes divisible by 64");
  if (tc->optim.opt >= VL_OPT_COUNT) return vl_fail(c, VL_ERR_INVALID, "unknown optimizer");
  if (!(tc->optim.hp.lr > 0)) return vl_fail(c, VL_ERR_INVALID, "learning rate must be > 0");
  return VL_OK;
}

/* Seeded init on the host: N(0, 0.02) for matrices, 1 for norms, LoRA A ~ N(0, 1/in),
 * LoRA B = 0 (so training starts from the base model, as PEFT does). */
static vl_status init_param(vl_mistral *m, vl_param *p, int kind, vl_rng *rng) {
  vl_ctx *c = m->c;
  if (c->plan) return VL_OK; /* no values on the plan device */
  int64_t n = p->rows * p->cols;
  float *h = malloc((size_t)n * sizeof(float));
  if (!h) return vl_fail(c, VL_ERR_OOM, "host init buffer");
  float sd = kind == 2 ? 1.0f / sqrtf((float)p->cols) : 0.02f;
  if (kind == 0 || kind == 2) vl_rng_normal_fill(rng, h, n, sd);
  else
    for (int64_t i = 0; i < n; i++) h[i] = kind == 1 ? 1.0f : 0.0f;
  vl_status s = vl_param_load(c, p, h);
  free(h);
  return s;
}

static vl_status build_params(vl_mistral *m, uint64_t seed) {
  const vl_mistral_cfg *mc = &m->mc;
  const vl_train_cfg *tc = &m->tc;
  vl_ctx *c = m->c;
  bool full = tc->lora_rank == 0;
  /* Non-linear weights (embedding, norms, head): trainable in compute dtype for a full
   * fine-tune; frozen under LoRA, in the base dtype (or compute dtype when it is nf4). */
  vl_dtype other = full ? tc->compute : (tc->frozen == VL_NF4 ? tc->compute : tc->frozen);
  vl_dtype base = full ? tc->compute : tc->frozen;
  m->n_params = 3 + (int)mc->n_layers * (PER_LAYER + (mc->qkv_bias ? 3 : 0));
  m->params = calloc((size_t)m->n_params, sizeof(vl_param));
  if (!m->params) return vl_fail(c, VL_ERR_OOM, "param table");
  vl_rng rng;
  vl_rng_seed(&rng, seed);
  m->p_embed = 0;
  m->p_layer0 = 1;
  m->p_normf = 1 + (int)mc->n_layers * PER_LAYER;
  m->p_head = m->p_normf + 1;
  m->p_bias0 = m->p_head + 1;
  VL_TRY(vl_param_alloc(c, &m->params[m->p_embed], "embed", mc->vocab, mc->dim, other, full));
  VL_TRY(init_param(m, &m->params[m->p_embed], 0, &rng));
  char nm[48];
  for (int64_t l = 0; l < mc->n_layers; l++) {
    for (int k = 0; k < 2; k++) {
      snprintf(nm, sizeof nm, "l%lld.norm%d", (long long)l, k + 1);
      VL_TRY(vl_param_alloc(c, layer_param(m, l, k), nm, 1, mc->dim, other, full));
      VL_TRY(init_param(m, layer_param(m, l, k), 1, &rng));
    }
    for (int lin = 0; lin < NLIN; lin++) {
      int64_t o, i;
      lin_shape(mc, lin, &o, &i);
      snprintf(nm, sizeof nm, "l%lld.%s", (long long)l, lin_name[lin]);
      VL_TRY(vl_param_alloc(c, linear_param(m, l, lin, 0), nm, o, i, base, full));
      VL_TRY(init_param(m, linear_param(m, l, lin, 0), 0, &rng));
      vl_param *b = bias_param(m, l, lin);
      if (b) { /* as the weight: trainable in a full fine-tune, else frozen (PEFT's bias="none") */
        snprintf(nm, sizeof nm, "l%lld.%s.bias", (long long)l, lin_name[lin]);
        VL_TRY(vl_param_alloc(c, b, nm, 1, o, other, full));
        VL_TRY(init_param(m, b, 3, &rng)); /* zero, as transformers initialises a Linear's bias */
      }
      if (lora_on(m, lin)) {
        int64_t r = tc->lora_rank;
        snprintf(nm, sizeof nm, "l%lld.%s.lora_A", (long long)l, lin_name[lin]);
        VL_TRY(vl_param_alloc(c, linear_param(m, l, lin, 1), nm, r, i, tc->compute, true));
        VL_TRY(init_param(m, linear_param(m, l, lin, 1), 2, &rng));
        snprintf(nm, sizeof nm, "l%lld.%s.lora_B", (long long)l, lin_name[lin]);
        VL_TRY(vl_param_alloc(c, linear_param(m, l, lin, 2), nm, o, r, tc->compute, true));
        VL_TRY(init_param(m, linear_param(m, l, lin, 2), 3, &rng));
      }
    }
  }
  VL_TRY(vl_param_alloc(c, &m->params[m->p_normf], "norm", 1, mc->dim, other, full));
  VL_TRY(init_param(m, &m->params[m->p_normf], 1, &rng));
  if (!mc->tie_embed) { /* tied: the slot stays empty and the head reads the embedding */
    VL_TRY(vl_param_alloc(c, &m->params[m->p_head], "lm_head", mc->vocab, mc->dim, other, full));
    VL_TRY(init_param(m, &m->params[m->p_head], 0, &rng));
  }
  for (int i = 0; i < m->n_params; i++)
    if (m->params[i].trainable) VL_TRY(vl_param_alloc_optim(c, &m->params[i], &tc->optim));
  return VL_OK;
}

vl_status vl_mistral_create(vl_ctx *c, const vl_mistral_cfg *mc, const vl_train_cfg *tc,
                            uint64_t seed, vl_mistral **out) {
  *out = NULL;
  VL_TRY(validate(c, mc, tc));
  vl_mistral *m = calloc(1, sizeof *m);
  if (!m) return vl_fail(c, VL_ERR_OOM, "model struct");
  m->c = c;
  m->mc = *mc;
  m->tc = *tc;
  vl_scaler_init(&m->sc, tc->compute == VL_F16, tc->loss_scale, tc->loss_scale_window);
  m->res = calloc((size_t)mc->n_layers + 1, sizeof(vl_tensor));
  m->acts = calloc((size_t)mc->n_layers, sizeof(layer_acts));
  vl_status s = (m->res && m->acts) ? build_params(m, seed) : vl_fail(c, VL_ERR_OOM, "act tables");
  if (s != VL_OK) { vl_mistral_destroy(m); return s; }
  *out = m;
  return VL_OK;
}

static void cleanup(vl_mistral *m) {
  vl_ctx *c = m->c;
  for (int64_t l = m->mc.n_layers - 1; l >= 0; l--) {
    layer_acts *a = &m->acts[l];
    vl_tensor *list[] = {&a->h, &a->u, &a->g, &a->rstd2, &a->ln2, &a->res2, &a->att, &a->P,
                         &a->v, &a->k, &a->q, &a->rstd1, &a->ln1};
    for (size_t i = 0; i < sizeof list / sizeof *list; i++) vl_tensor_free(c, list[i]);
    for (int i = 0; i < NLIN; i++) vl_tensor_free(c, &a->xa[i]);
  }
  for (int64_t l = 0; l <= m->mc.n_layers; l++) vl_tensor_free(c, &m->res[l]);
  step_tensors *t = &m->step;
  for (int i = 7; i >= 0; i--) vl_tensor_free(c, &t->tmp[i]);
  vl_tensor *list[] = {&t->dlnf, &t->dres, &t->loss, &t->logits, &t->rstdf, &t->lnf, &t->data};
  for (size_t i = 0; i < sizeof list / sizeof *list; i++) vl_tensor_free(c, list[i]);
}

void vl_mistral_destroy(vl_mistral *m) {
  if (!m) return;
  if (m->res && m->acts) cleanup(m);
  for (int i = m->n_params - 1; i >= 0; i--) vl_param_free(m->c, &m->params[i]);
  free(m->params);
  free(m->res);
  free(m->acts);
  free(m);
}

/* ---- helpers -------------------------------------------------------------------------- */
static vl_status alloc2(vl_mistral *m, vl_tensor *t, vl_mem_cat cat, int64_t r, int64_t k) {
  return vl_tensor_alloc2(m->c, t, m->tc.compute, cat, r, k);
}
static vl_status alloc_f32(vl_mistral *m, vl_tensor *t, vl_mem_cat cat, int64_t n) {
  return vl_tensor_alloc(m->c, t, VL_F32, cat, 1, &n);
}
static void tensor_free(vl_mistral *m, vl_tensor *t) { vl_tensor_free(m->c, t); }

/* y (R,N) (beta: overwrite/accumulate) = x W^T + s (x A^T) B^T ; xa saved when LoRA is on. */
static vl_status lin_fwd(vl_mistral *m, int64_t l, int lin, vl_tensor *y, const vl_tensor *x,
                         vl_tensor *xa, vl_mem_cat cat, int64_t R, float beta) {
  int64_t N, K;
  lin_shape(&m->mc, lin, &N, &K);
  VL_TRY(vl_linear_fwd(m->c, y, x, &linear_param(m, l, lin, 0)->w, R, K, N, beta));
  const vl_param *b = bias_param(m, l, lin);
  if (b)
    VL_TRY(vl_bias_fwd_run(m->c, &(vl_bias_fwd_args){.y = y, .b = &b->w, .outer = R, .C = N, .inner = 1}));
  if (!lora_on(m, lin)) return VL_OK;
  int64_t r = m->tc.lora_rank;
  float lora_scale = m->tc.lora_alpha / (float)r;
  VL_TRY(alloc2(m, xa, cat, R, r));
  VL_TRY(vl_linear_fwd(m->c, xa, x, &linear_param(m, l, lin, 1)->w, R, K, r, 0.0f));
  vl_gemm g = {.ta = false, .tb = true, .M = R, .N = N, .K = r, .alpha = lora_scale, .beta = 1.0f,
               .A = xa, .lda = r, .B = &linear_param(m, l, lin, 2)->w, .ldb = r, .C = y,
               .ldc = N, .batch = 1};
  return vl_gemm_run(m->c, &g);
}

/* dx (beta) = dy W (+ LoRA path); weight grads accumulate. Frees xa. */
static vl_status lin_bwd(vl_mistral *m, int64_t l, int lin, vl_tensor *dx, const vl_tensor *dy,
                         const vl_tensor *x, vl_tensor *xa, int64_t R, float beta) {
  int64_t N, K;
  lin_shape(&m->mc, lin, &N, &K);
  vl_param *W = linear_param(m, l, lin, 0);
  if (W->trainable) {
    VL_TRY(vl_linear_bwd_w(m->c, &W->grad, dy, x, R, K, N, 1.0f));
    vl_grad_ready(m->c, W);
  }
  vl_param *b = bias_param(m, l, lin);
  if (b && b->trainable) {
    VL_TRY(vl_bias_bwd_run(m->c, &(vl_bias_bwd_args){.db = &b->grad, .dy = dy, .outer = R, .C = N, .inner = 1,
                                                     .accumulate = true}));
    vl_grad_ready(m->c, b);
  }
  VL_TRY(vl_linear_bwd_x(m->c, dx, dy, &W->w, R, K, N, beta));
  if (!lora_on(m, lin)) return VL_OK;
  int64_t r = m->tc.lora_rank;
  float lora_scale = m->tc.lora_alpha / (float)r;
  vl_param *A = linear_param(m, l, lin, 1), *B = linear_param(m, l, lin, 2);
  VL_TRY(vl_linear_bwd_w(m->c, &B->grad, dy, xa, R, r, N, lora_scale)); /* dB = s dy^T xa */
  vl_grad_ready(m->c, B);
  tensor_free(m, xa);
  vl_tensor dxa;
  VL_TRY(alloc2(m, &dxa, VL_MEM_TEMP, R, r));
  vl_gemm g = {.ta = false, .tb = false, .M = R, .N = r, .K = N, .alpha = lora_scale, .beta = 0.0f,
               .A = dy, .lda = N, .B = &B->w, .ldb = r, .C = &dxa, .ldc = r, .batch = 1};
  vl_status status = vl_gemm_run(m->c, &g);
  if (status == VL_OK) status = vl_linear_bwd_w(m->c, &A->grad, &dxa, x, R, K, r, 1.0f);
  if (status == VL_OK) vl_grad_ready(m->c, A);
  if (status == VL_OK) status = vl_linear_bwd_x(m->c, dx, &dxa, &A->w, R, K, r, 1.0f);
  tensor_free(m, &dxa);
  return status;
}

/* Batched attention GEMM over the B*KVH groups: each group's rep query heads are stacked
 * into (rep*T) rows, so GQA needs no K/V expansion. */
static vl_status attn_gemm(vl_mistral *m, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                           const vl_tensor *A, int64_t lda, int64_t stride_a, const vl_tensor *B,
                           int64_t ldb, int64_t stride_b, vl_tensor *C, int64_t stride_c,
                           int64_t n_groups) {
  vl_gemm g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = 1.0f, .beta = 0.0f,
               .A = A, .lda = lda, .sa = stride_a, .B = B, .ldb = ldb, .sb = stride_b,
               .C = C, .ldc = N, .sc = stride_c, .batch = n_groups};
  return vl_gemm_run(m->c, &g);
}

/* ---- layer forward ------------------------------------------------------------------------ */
/* keep: activations are saved for backward (category acts); otherwise (checkpointed first
 * pass) they are temps freed at the end of the layer and only res[l+1] survives.
 * recompute: the re-run inside backward (keep is true; res[l+1] is not rebuilt). */
static vl_status layer_fwd(vl_mistral *m, int64_t l, int64_t B, int64_t T, bool keep,
                           bool recompute) {
  vl_ctx *c = m->c;
  const vl_mistral_cfg *mc = &m->mc;
  layer_acts *a = &m->acts[l];
  vl_mem_cat cat = keep ? VL_MEM_ACTS : VL_MEM_TEMP;
  int64_t R = B * T, C = mc->dim, H = mc->n_heads, KVH = mc->n_kv_heads, D = mc->head_dim;
  int64_t F = mc->ffn, rep = H / KVH;
  vl_tensor *x = &m->res[l];

  VL_TRY(alloc2(m, &a->ln1, cat, R, C));
  VL_TRY(alloc_f32(m, &a->rstd1, cat, R));
  VL_TRY(vl_rmsnorm_fwd_run(c, &(vl_rmsnorm_fwd_args){.out = &a->ln1, .rstd = &a->rstd1, .x = x,
                                                     .w = &layer_param(m, l, P_LN1)->w, .R = R,
                                                     .C = C, .eps = mc->norm_eps}));
  /* q, k, v: project, rotate (q, k), permute to (B, heads, T, D). */
  vl_tensor *dst[3] = {&a->q, &a->k, &a->v};
  int64_t heads[3] = {H, KVH, KVH};
  for (int i = 0; i < 3; i++) {
    vl_tensor tmp;
    VL_TRY(alloc2(m, &tmp, VL_MEM_TEMP, R, heads[i] * D));
    vl_status s = lin_fwd(m, l, LQ + i, &tmp, &a->ln1, &a->xa[LQ + i], cat, R, 0.0f);
    if (s == VL_OK && i < 2)
      s = vl_rope_run(c, &(vl_rope_args){.x = &tmp, .B = B, .T = T, .H = heads[i], .D = D,
                                         .theta = mc->rope_theta, .inverse = false});
    if (s == VL_OK) s = alloc2(m, dst[i], cat, R, heads[i] * D);
    if (s == VL_OK)
      s = vl_permute_run(c, &(vl_permute_args){.y = dst[i], .x = &tmp, .B = B, .T = T,
                                               .H = heads[i], .D = D, .back = false});
    tensor_free(m, &tmp);
    VL_TRY(s);
  }
  /* S = Q K^T per (b, kv head): (rep*T, D) x (T, D)^T -> (rep*T, T); softmax in place. */
  VL_TRY(alloc2(m, &a->P, cat, B * H * T, T));
  VL_TRY(attn_gemm(m, false, true, rep * T, T, D, &a->q, D, rep * T * D, &a->k, D, T * D,
                   &a->P, rep * T * T, B * KVH));
  VL_TRY(vl_softmax_fwd_run(
      c, &(vl_softmax_fwd_args){.P = &a->P, .S = &a->P, .rows = B * H * T, .T = T,
                                .scale = 1.0f / sqrtf((float)D), .causal = true}));
  vl_tensor O;
  VL_TRY(alloc2(m, &O, VL_MEM_TEMP, R, H * D));
  vl_status s = attn_gemm(m, false, false, rep * T, D, T, &a->P, T, rep * T * T, &a->v, D,
                          T * D, &O, rep * T * D, B * KVH);
  if (s == VL_OK) s = alloc2(m, &a->att, cat, R, H * D);
  if (s == VL_OK) s = vl_permute_run(c, &(vl_permute_args){.y = &a->att, .x = &O, .B = B, .T = T,
                                                           .H = H, .D = D, .back = true});
  tensor_free(m, &O);
  VL_TRY(s);
  /* res2 = x + att Wo^T */
  VL_TRY(alloc2(m, &a->res2, cat, R, C));
  VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &a->res2, .x = x, .n = R * C}));
  VL_TRY(lin_fwd(m, l, LO, &a->res2, &a->att, &a->xa[LO], cat, R, 1.0f));
  /* MLP: h = silu(ln2 Wg^T) * (ln2 Wu^T); out = res2 + h Wd^T */
  VL_TRY(alloc2(m, &a->ln2, cat, R, C));
  VL_TRY(alloc_f32(m, &a->rstd2, cat, R));
  VL_TRY(vl_rmsnorm_fwd_run(c, &(vl_rmsnorm_fwd_args){.out = &a->ln2, .rstd = &a->rstd2,
                                                     .x = &a->res2,
                                                     .w = &layer_param(m, l, P_LN2)->w, .R = R,
                                                     .C = C, .eps = mc->norm_eps}));
  VL_TRY(alloc2(m, &a->g, cat, R, F));
  VL_TRY(lin_fwd(m, l, LG, &a->g, &a->ln2, &a->xa[LG], cat, R, 0.0f));
  VL_TRY(alloc2(m, &a->u, cat, R, F));
  VL_TRY(lin_fwd(m, l, LU, &a->u, &a->ln2, &a->xa[LU], cat, R, 0.0f));
  VL_TRY(alloc2(m, &a->h, cat, R, F));
  VL_TRY(vl_swiglu_fwd_run(c, &(vl_swiglu_fwd_args){.out = &a->h, .g = &a->g, .u = &a->u,
                                                    .n = R * F}));
  if (recompute) {
    /* Re-running a checkpointed block: its output is not needed again, only what backward
     * reads (the LoRA intermediate of the down projection). */
    if (!lora_on(m, LD)) return VL_OK;
    int64_t r = m->tc.lora_rank;
    VL_TRY(alloc2(m, &a->xa[LD], cat, R, r));
    return vl_linear_fwd(c, &a->xa[LD], &a->h, &linear_param(m, l, LD, 1)->w, R, F, r, 0.0f);
  }
  /* The next layer's input is kept in both modes: it is the checkpoint. */
  VL_TRY(alloc2(m, &m->res[l + 1], VL_MEM_ACTS, R, C));
  VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &m->res[l + 1], .x = &a->res2, .n = R * C}));
  VL_TRY(lin_fwd(m, l, LD, &m->res[l + 1], &a->h, &a->xa[LD], cat, R, 1.0f));
  if (!keep) {
    vl_tensor *list[] = {&a->h, &a->u, &a->g, &a->rstd2, &a->ln2, &a->res2, &a->att, &a->P,
                         &a->v, &a->k, &a->q, &a->rstd1, &a->ln1};
    for (int i = NLIN - 1; i >= 0; i--) tensor_free(m, &a->xa[i]);
    for (size_t i = 0; i < sizeof list / sizeof *list; i++) tensor_free(m, list[i]);
  }
  return VL_OK;
}

/* ---- layer backward ------------------------------------------------------------------------ */
/* dres holds dL/d(res[l+1]) on entry and dL/d(res[l]) on exit. */
static vl_status layer_bwd(vl_mistral *m, int64_t l, int64_t B, int64_t T, vl_tensor *dres) {
  vl_ctx *c = m->c;
  const vl_mistral_cfg *mc = &m->mc;
  layer_acts *a = &m->acts[l];
  int64_t R = B * T, C = mc->dim, H = mc->n_heads, KVH = mc->n_kv_heads, D = mc->head_dim;
  int64_t F = mc->ffn, rep = H / KVH;
  float scale = 1.0f / sqrtf((float)D);
  vl_tensor *t = m->step.tmp; /* t[0..7]: this layer's gradient temps */

  /* MLP */
  VL_TRY(alloc2(m, &t[0], VL_MEM_TEMP, R, F)); /* dh (R, F), then dg in place */
  VL_TRY(lin_bwd(m, l, LD, &t[0], dres, &a->h, &a->xa[LD], R, 0.0f));
  tensor_free(m, &a->h);
  VL_TRY(alloc2(m, &t[1], VL_MEM_TEMP, R, F)); /* du (R, F) */
  VL_TRY(vl_swiglu_bwd_run(c, &(vl_swiglu_bwd_args){.dg = &t[0], .du = &t[1], .dout = &t[0],
                                                    .g = &a->g, .u = &a->u, .n = R * F}));
  tensor_free(m, &a->u);
  tensor_free(m, &a->g);
  VL_TRY(alloc2(m, &t[2], VL_MEM_TEMP, R, C)); /* dln2 (R, C) */
  VL_TRY(lin_bwd(m, l, LG, &t[2], &t[0], &a->ln2, &a->xa[LG], R, 0.0f));
  VL_TRY(lin_bwd(m, l, LU, &t[2], &t[1], &a->ln2, &a->xa[LU], R, 1.0f));
  tensor_free(m, &t[1]);
  tensor_free(m, &t[0]);
  vl_param *n2 = layer_param(m, l, P_LN2);
  VL_TRY(vl_rmsnorm_bwd_run(c, &(vl_rmsnorm_bwd_args){.dx = dres,
                                                     .dw = n2->trainable ? &n2->grad : NULL,
                                                     .dout = &t[2], .x = &a->res2, .w = &n2->w,
                                                     .rstd = &a->rstd2, .R = R, .C = C}));
  if (n2->trainable) vl_grad_ready(c, n2);
  tensor_free(m, &t[2]);
  tensor_free(m, &a->rstd2);
  tensor_free(m, &a->ln2);
  tensor_free(m, &a->res2);

  /* attention output projection */
  VL_TRY(alloc2(m, &t[0], VL_MEM_TEMP, R, H * D)); /* datt (R, H*D) */
  VL_TRY(lin_bwd(m, l, LO, &t[0], dres, &a->att, &a->xa[LO], R, 0.0f));
  tensor_free(m, &a->att);
  VL_TRY(alloc2(m, &t[1], VL_MEM_TEMP, R, H * D)); /* dO (B, H, T, D) */
  VL_TRY(vl_permute_run(c, &(vl_permute_args){.y = &t[1], .x = &t[0], .B = B, .T = T, .H = H,
                                              .D = D, .back = false}));
  tensor_free(m, &t[0]);
  VL_TRY(alloc2(m, &t[2], VL_MEM_TEMP, B * H * T, T)); /* dP (B*H*T, T), then dS in place */
  VL_TRY(attn_gemm(m, false, true, rep * T, T, D, &t[1], D, rep * T * D, &a->v, D, T * D,
                   &t[2], rep * T * T, B * KVH));
  /* dv (B, KVH, T, D) = P^T dO, summed over the rep query heads of each KV head */
  VL_TRY(alloc2(m, &t[3], VL_MEM_TEMP, R, KVH * D));
  VL_TRY(attn_gemm(m, true, false, T, D, rep * T, &a->P, T, rep * T * T, &t[1], D, rep * T * D,
                   &t[3], T * D, B * KVH));
  tensor_free(m, &t[1]);
  tensor_free(m, &a->v);
  VL_TRY(vl_softmax_bwd_run(
      c, &(vl_softmax_bwd_args){.dS = &t[2], .dP = &t[2], .P = &a->P, .rows = B * H * T, .T = T,
                                .scale = scale, .causal = true}));
  tensor_free(m, &a->P);
  VL_TRY(alloc2(m, &t[4], VL_MEM_TEMP, R, H * D)); /* dq (B, H, T, D) = dS K */
  VL_TRY(attn_gemm(m, false, false, rep * T, D, T, &t[2], T, rep * T * T, &a->k, D, T * D,
                   &t[4], rep * T * D, B * KVH));
  VL_TRY(alloc2(m, &t[5], VL_MEM_TEMP, R, KVH * D)); /* dk (B, KVH, T, D) = dS^T Q */
  VL_TRY(attn_gemm(m, true, false, T, D, rep * T, &t[2], T, rep * T * T, &a->q, D, rep * T * D,
                   &t[5], T * D, B * KVH));
  tensor_free(m, &t[2]);
  tensor_free(m, &a->k);
  tensor_free(m, &a->q);
  /* back to (B,T,heads,D), undo the rotation, project to dln1 */
  VL_TRY(alloc2(m, &t[6], VL_MEM_TEMP, R, C)); /* dln1 (R, C) */
  vl_tensor *g[3] = {&t[4], &t[5], &t[3]};
  int64_t heads[3] = {H, KVH, KVH};
  for (int i = 0; i < 3; i++) {
    VL_TRY(alloc2(m, &t[7], VL_MEM_TEMP, R, heads[i] * D));
    vl_status s = vl_permute_run(c, &(vl_permute_args){.y = &t[7], .x = g[i], .B = B, .T = T,
                                                       .H = heads[i], .D = D, .back = true});
    if (s == VL_OK && i < 2)
      s = vl_rope_run(c, &(vl_rope_args){.x = &t[7], .B = B, .T = T, .H = heads[i], .D = D,
                                         .theta = mc->rope_theta, .inverse = true});
    tensor_free(m, g[i]);
    if (s == VL_OK) s = lin_bwd(m, l, LQ + i, &t[6], &t[7], &a->ln1, &a->xa[LQ + i], R, i ? 1.0f : 0.0f);
    tensor_free(m, &t[7]);
    VL_TRY(s);
  }
  vl_param *n1 = layer_param(m, l, P_LN1);
  VL_TRY(vl_rmsnorm_bwd_run(c, &(vl_rmsnorm_bwd_args){.dx = dres,
                                                     .dw = n1->trainable ? &n1->grad : NULL,
                                                     .dout = &t[6], .x = &m->res[l], .w = &n1->w,
                                                     .rstd = &a->rstd1, .R = R, .C = C}));
  if (n1->trainable) vl_grad_ready(c, n1);
  tensor_free(m, &t[6]);
  tensor_free(m, &a->rstd1);
  tensor_free(m, &a->ln1);
  return VL_OK;
}

/* ---- one micro-batch ------------------------------------------------------------------------ */
static vl_status micro_fwd_bwd(vl_mistral *m, const vl_mistral_batch *b, float dloss_scale, double *loss_sum) {
  vl_ctx *c = m->c;
  const vl_mistral_cfg *mc = &m->mc;
  step_tensors *step = &m->step;
  int64_t B = b->B, T = b->T, R = B * T, C = mc->dim, V = mc->vocab, L = mc->n_layers;
  bool ck = m->tc.checkpoint;

  /* the batch on the device, one block (2, B, T) of int32: tokens, then targets */
  int64_t ids_shape[3] = {2, B, T}, bt[2] = {B, T};
  VL_TRY(vl_tensor_alloc(c, &step->data, VL_I32, VL_MEM_DATA, 3, ids_shape));
  step->tok = vl_tensor_view(&step->data, 0, VL_I32, 2, bt);
  step->tgt = vl_tensor_view(&step->data, (size_t)R * 4, VL_I32, 2, bt);
  if (!c->plan && b->tokens) {
    VL_TRY(c->be->upload(c, &step->tok, 0, b->tokens, (size_t)R * 4));
    VL_TRY(c->be->upload(c, &step->tgt, 0, b->targets, (size_t)R * 4));
  }
  VL_TRY(alloc2(m, &m->res[0], VL_MEM_ACTS, R, C));
  vl_param *E = &m->params[m->p_embed];
  VL_TRY(vl_embed_fwd_run(c, &(vl_embed_fwd_args){.out = &m->res[0], .wte = &E->w,
                                                  .tok = &step->tok, .R = R, .C = C}));
  for (int64_t l = 0; l < L; l++) VL_TRY(layer_fwd(m, l, B, T, !ck, false));

  /* head: final norm, logits, fused cross-entropy (logits become dlogits in place) */
  VL_TRY(alloc2(m, &step->lnf, VL_MEM_ACTS, R, C));
  VL_TRY(alloc_f32(m, &step->rstdf, VL_MEM_ACTS, R));
  vl_param *NF = &m->params[m->p_normf], *HW = mc->tie_embed ? E : &m->params[m->p_head];
  VL_TRY(vl_rmsnorm_fwd_run(c, &(vl_rmsnorm_fwd_args){.out = &step->lnf, .rstd = &step->rstdf,
                                                     .x = &m->res[L], .w = &NF->w, .R = R, .C = C,
                                                     .eps = mc->norm_eps}));
  VL_TRY(alloc2(m, &step->logits, VL_MEM_TEMP, R, V));
  VL_TRY(vl_linear_fwd(c, &step->logits, &step->lnf, &HW->w, R, C, V, 0.0f));
  VL_TRY(alloc_f32(m, &step->loss, VL_MEM_TEMP, R));
  VL_TRY(vl_xent_fused_run(
      c, &(vl_xent_fused_args){.logits = &step->logits, .loss = &step->loss, .tgt = &step->tgt,
                               .R = R, .V = V, .dloss_scale = dloss_scale}));
  if (!c->plan && b->targets) {
    float *lh = malloc((size_t)R * sizeof(float));
    if (!lh) return vl_fail(c, VL_ERR_OOM, "host loss buffer");
    vl_status s = c->be->download(c, lh, &step->loss, 0, (size_t)R * 4);
    for (int64_t r = 0; s == VL_OK && r < R; r++) *loss_sum += lh[r];
    free(lh);
    VL_TRY(s);
  }
  tensor_free(m, &step->loss);
  VL_TRY(alloc2(m, &step->dlnf, VL_MEM_TEMP, R, C));
  if (HW->trainable) { /* tied: the head's share of the embedding's gradient, ready after the embedding's */
    VL_TRY(vl_linear_bwd_w(c, &HW->grad, &step->logits, &step->lnf, R, C, V, 1.0f));
    if (!mc->tie_embed) vl_grad_ready(c, HW);
  }
  VL_TRY(vl_linear_bwd_x(c, &step->dlnf, &step->logits, &HW->w, R, C, V, 0.0f));
  tensor_free(m, &step->logits);
  VL_TRY(alloc2(m, &step->dres, VL_MEM_TEMP, R, C));
  VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &step->dres}));
  VL_TRY(vl_rmsnorm_bwd_run(c, &(vl_rmsnorm_bwd_args){.dx = &step->dres,
                                                     .dw = NF->trainable ? &NF->grad : NULL,
                                                     .dout = &step->dlnf, .x = &m->res[L],
                                                     .w = &NF->w, .rstd = &step->rstdf, .R = R,
                                                     .C = C}));
  if (NF->trainable) vl_grad_ready(c, NF);
  tensor_free(m, &step->dlnf);
  tensor_free(m, &step->rstdf);
  tensor_free(m, &step->lnf);
  tensor_free(m, &m->res[L]);

  for (int64_t l = L - 1; l >= 0; l--) {
    if (ck) {
      /* re-run this block's forward from its saved input; its FLOPs are recompute */
      c->recomputing++;
      vl_status s = layer_fwd(m, l, B, T, true, true);
      c->recomputing--;
      VL_TRY(s);
    }
    VL_TRY(layer_bwd(m, l, B, T, &step->dres));
    if (l > 0) tensor_free(m, &m->res[l]);
  }
  if (E->trainable) {
    VL_TRY(vl_embed_bwd_run(c, &(vl_embed_bwd_args){.dwte = &E->grad, .dout = &step->dres,
                                                    .tok = &step->tok, .R = R, .C = C}));
    vl_grad_ready(c, E);
  }
  tensor_free(m, &step->dres);
  tensor_free(m, &m->res[0]);
  tensor_free(m, &step->data);
  step->tok = step->tgt = (vl_tensor){0};
  return VL_OK;
}

/* GradScaler's response to an overflow: no update, scale halved, gradients dropped. */
static vl_status skip_step(vl_mistral *m, vl_mistral_step_info *info) {
  info->skipped = true;
  return vl_scaler_skip(m->c, m->params, m->n_params, &m->sc);
}

static int64_t valid_tokens(const vl_mistral_batch *b) {
  if (!b->targets) return b->B * b->T;
  int64_t n = 0;
  for (int64_t i = 0; i < b->B * b->T; i++) n += b->targets[i] >= 0;
  return n;
}

vl_status vl_mistral_fwd_bwd(vl_mistral *m, const vl_mistral_batch *mb, int n_micro, vl_mistral_step_info *info) {
  vl_ctx *c = m->c;
  memset(info, 0, sizeof *info);
  if (n_micro < 1) return vl_fail(c, VL_ERR_INVALID, "need at least one micro-batch");
  int64_t ntok = 0;
  for (int i = 0; i < n_micro; i++) {
    if (mb[i].B < 1 || mb[i].T < 1 || mb[i].T > m->mc.seq)
      return vl_fail(c, VL_ERR_INVALID, "micro-batch %d: B=%lld T=%lld (sequence limit %lld)", i,
                     (long long)mb[i].B, (long long)mb[i].T, (long long)m->mc.seq);
    if (!c->plan && (!mb[i].tokens || !mb[i].targets))
      return vl_fail(c, VL_ERR_INVALID, "micro-batch %d has no tokens or no targets", i);
    for (int64_t k = 0; mb[i].tokens && k < mb[i].B * mb[i].T; k++)
      if (mb[i].tokens[k] < 0 || mb[i].tokens[k] >= m->mc.vocab || mb[i].targets[k] >= m->mc.vocab)
        return vl_fail(c, VL_ERR_INVALID, "micro-batch %d: token %lld out of the vocabulary", i, (long long)k);
    ntok += valid_tokens(&mb[i]);
  }
  if (ntok == 0) return vl_fail(c, VL_ERR_INVALID, "no target tokens in the step");
  float dscale = m->sc.scale / (float)ntok;
  double loss_sum = 0;
  for (int i = 0; i < n_micro; i++) {
    vl_status s = micro_fwd_bwd(m, &mb[i], dscale, &loss_sum);
    if (s != VL_OK) {
      cleanup(m);
      vl_mistral_zero_grads(m);
      return s;
    }
  }
  info->loss = loss_sum / (double)ntok;
  info->n_tokens = ntok;
  info->loss_scale = m->sc.scale;
  if (!c->plan && !isfinite(info->loss)) {
    VL_TRY(vl_mistral_zero_grads(m));
    /* fp16: an overflow in forward is what GradScaler skips (its gradients are inf too) */
    if (m->tc.compute == VL_F16) return skip_step(m, info);
    return vl_fail(c, VL_ERR_NUMERIC, "loss is %g: training diverged", info->loss);
  }
  return VL_OK;
}

vl_status vl_mistral_zero_grads(vl_mistral *m) {
  return vl_params_zero_grads(m->c, m->params, m->n_params);
}

vl_status vl_mistral_apply(vl_mistral *m, vl_mistral_step_info *info) {
  info->loss_scale = m->sc.scale;
  return vl_params_apply(m->c, m->params, m->n_params, &m->tc.optim, m->tc.clip, &m->sc,
                         &info->skipped, &info->grad_norm);
}

vl_status vl_mistral_step(vl_mistral *m, const vl_mistral_batch *mb, int n_micro, vl_mistral_step_info *info) {
  VL_TRY(vl_mistral_fwd_bwd(m, mb, n_micro, info));
  if (info->skipped) return VL_OK;
  return vl_mistral_apply(m, info);
}

vl_param *vl_mistral_params(vl_mistral *m, int *n) { *n = m->n_params; return m->params; }

/* vl_model_mistral's train_state (mistral_model.c): the parameter table in creation order
 * (embed; per layer norm1, norm2, then q, k, v, o, gate, up, down, each followed by its
 * LoRA A and B slots, unused ones empty; norm; lm_head), the optimizer, clip and scaler;
 * no buffers. */
vl_status vl_mistral_train_state(vl_mistral *m, vl_train_state *out) {
  *out = (vl_train_state){m->params, m->n_params, &m->tc.optim, m->tc.clip, &m->sc, NULL, 0};
  return VL_OK;
}

const vl_mistral_cfg *vl_mistral_config(const vl_mistral *m) { return &m->mc; }
vl_ctx *vl_mistral_ctx(const vl_mistral *m) { return m->c; }
const vl_train_cfg *vl_mistral_train_config(const vl_mistral *m) { return &m->tc; }

int64_t vl_mistral_n_params(const vl_mistral *m, bool trainable_only) {
  int64_t n = 0;
  for (int i = 0; i < m->n_params; i++) {
    const vl_param *p = &m->params[i];
    if (!p->w.owned && !p->master.owned) continue; /* unused LoRA slot */
    if (!trainable_only || p->trainable) n += p->rows * p->cols;
  }
  return n;
}

vl_status vl_mistral_merged_weight(vl_mistral *m, int idx, float *out) {
  vl_ctx *c = m->c;
  if (idx < m->p_layer0 || idx >= m->p_normf) return vl_fail(c, VL_ERR_INVALID, "not a layer weight");
  int slot = (idx - m->p_layer0) % PER_LAYER;
  int64_t l = (idx - m->p_layer0) / PER_LAYER;
  if (slot < P_LIN0 || (slot - P_LIN0) % 3) return vl_fail(c, VL_ERR_INVALID, "not a base linear");
  int lin = (slot - P_LIN0) / 3;
  vl_param *W = linear_param(m, l, lin, 0);
  VL_TRY(vl_param_read(c, W, out));
  if (!lora_on(m, lin)) return VL_OK;
  int64_t r = m->tc.lora_rank, N = W->rows, K = W->cols;
  vl_status status = VL_OK;
  float *A = malloc((size_t)(r * K) * sizeof(float));  // (r, K)
  float *Bm = malloc((size_t)(N * r) * sizeof(float)); // (N, r)
  if (!A || !Bm) {
    status = vl_fail(c, VL_ERR_OOM, "host memory for the LoRA factors of %s", W->name);
    goto done;
  }
  VL_TRY_GOTO(status, vl_param_read(c, linear_param(m, l, lin, 1), A), done);
  VL_TRY_GOTO(status, vl_param_read(c, linear_param(m, l, lin, 2), Bm), done);
  float scale = m->tc.lora_alpha / (float)r;
  for (int64_t i = 0; i < N; i++)
    for (int64_t j = 0; j < K; j++) {
      float acc = 0;
      for (int64_t k = 0; k < r; k++) acc += Bm[i * r + k] * A[k * K + j];
      out[i * K + j] += scale * acc;
    }
done:
  free(A);
  free(Bm);
  return status;
}
