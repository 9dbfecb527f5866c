/* The CLIP ViT-L/14 text encoder of Stable Diffusion 1.5 (see sd_encoders.h): transformers'
 * CLIPTextModel up to last_hidden_state, frozen or LoRA-trained. Token embedding + position
 * embedding; per layer x += out_proj(attn(layer_norm1(x))) (q/k/v/out projections with
 * biases, causal, scale 1/sqrt(head dim)) and x += fc2(quick_gelu(fc1(layer_norm2(x))));
 * final_layer_norm. LoRA factors (sd_lora.c, the U-Net's) sit on q/k/v/out_proj, and with
 * kohya's targets on fc1/fc2 too.
 *
 * Rows R = B*T; C = dim; H heads of D = C/H; F = ffn. Activations and gradients are in the
 * activation dtype. Every tensor a step makes lives in a slot of the model (its layers,
 * m->xf, m->gr, m->t), so a failed step (OOM) frees all of them.
 *
 * Forward without training: the residual stream is updated in place (GEMMs accumulate into
 * it, then the bias) and every intermediate is VL_MEM_TEMP, freed as soon as it is consumed.
 * Training forward: the stream moves on in new tensors where backward reads the old one
 * (each layer's input for layer_norm1's backward or a checkpoint's re-run, the stream after
 * the attention for layer_norm2's), in VL_MEM_ACTS; a layer keeps what its backward reads,
 * or with checkpointing nothing but its input, and its backward first re-runs its forward
 * up to fc2's input. Backward: final_layer_norm, then each layer from the last: fc2, the
 * activation, fc1, layer_norm2 (its input gradient added to the residual's), out_proj,
 * attention, q/k/v, layer_norm1. Layer 0 stops after the q/k/v LoRA gradients: the
 * embeddings are frozen, so nothing needs the gradient of its input. */
#include "sd_lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The linears of a layer, in forward order. */
enum { CL_Q = 0, CL_K, CL_V, CL_O, CL_FC1, CL_FC2, CL_NLIN };

/* A linear: frozen weight and bias (indices into m->P), LoRA A and B (indices into m->lora,
 * -1 when not adapted). */
typedef struct {
  int w, b, la, lb;
  int64_t in, out;
} clip_lin;

/* One encoder layer: its parameters and what a step holds of it. */
typedef struct {
  clip_lin lin[CL_NLIN];
  int ln1, ln2;          /* LayerNorm weight (its bias follows) */
  vl_tensor x;           // (B, T, C) the layer's input: the residual stream
  vl_tensor m1, r1;      // (R) fp32 layer_norm1 mean, 1/std
  vl_tensor h1;          // (B, T, C) layer_norm1 output: the input of q, k, v
  vl_tensor q, k, v;     // (B, T, C) projections, head h in columns [h D, (h+1) D)
  vl_tensor o;           // (B, T, C) attention output: out_proj's input
  vl_attn_saved sv;      /* attention probabilities (classic) or log-sum-exp (efficient) */
  vl_tensor x2;          // (B, T, C) the stream after the attention: layer_norm2's input
  vl_tensor m2, r2;      // (R) fp32 layer_norm2 mean, 1/std
  vl_tensor h2;          // (B, T, C) layer_norm2 output: fc1's input
  vl_tensor f;           // (B, T, F) fc1 output: the activation's input
  vl_tensor g;           // (B, T, F) activation output: fc2's input
  vl_tensor xa[CL_NLIN]; // (R, r) x A^T of each adapted linear, for dB
} clip_layer;

struct vl_sd_clip {
  vl_ctx *c;
  vl_sd_clip_cfg cfg;
  vl_sd_params P;       /* frozen, state_dict order */
  vl_sd_params lora;    /* trainable LoRA factors, peft's state_dict order */
  int tok_emb, pos_emb, final_ln;
  clip_layer *layers;
  /* the step */
  int64_t B, T;
  bool train, in_step;
  vl_tensor xf;         // (B, T, C) final_layer_norm's input: the last layer's output
  vl_tensor mf, rf;     // (R) fp32 final_layer_norm mean, 1/std
  vl_tensor gr;         // (B, T, C) the gradient of the residual stream
  vl_tensor t[5];       // a layer backward's temporaries; shapes at each use
  vl_tensor dxa;        // (R, r) LoRA s dy B in sd_lora_lin_bwd
};

/* ---- presets ------------------------------------------------------------------------- */

static const char *const TARGETS[VL_SD_CLIP_LORA_TARGETS_COUNT] = {"attn", "kohya"};

const char *vl_sd_clip_lora_targets_name(vl_sd_clip_lora_targets t) {
  return (unsigned)t < VL_SD_CLIP_LORA_TARGETS_COUNT ? TARGETS[t] : "?";
}

int vl_sd_clip_lora_targets_parse(const char *s, vl_sd_clip_lora_targets *out) {
  for (int i = 0; s && i < VL_SD_CLIP_LORA_TARGETS_COUNT; i++)
    if (!strcasecmp(s, TARGETS[i])) {
      *out = (vl_sd_clip_lora_targets)i;
      return 0;
    }
  return -1;
}

int vl_sd_clip_preset(const char *scale, vl_sd_clip_cfg *o) {
  memset(o, 0, sizeof *o);
  *o = (vl_sd_clip_cfg){.vocab = 49408, .dim = 768, .n_layers = 12, .n_heads = 12, .ffn = 3072,
                        .n_pos = 77, .eps = 1e-5f, .act = VL_ACT_QUICK_GELU, .weights = VL_F32,
                        .acts = VL_F32, .out = VL_F32, .attn = VL_ATTN_EFFICIENT,
                        .lora_rank = 0, .lora_alpha = 0.0f, .lora_targets = VL_SD_CLIP_LORA_ATTN,
                        .checkpoint = false};
  if (!strcasecmp(scale, "full")) return 0;
  if (!strcasecmp(scale, "small")) {
    o->vocab = 4096;
    o->dim = 256;
    o->n_layers = 4;
    o->n_heads = 4;
    o->ffn = 1024;
    return 0;
  }
  if (!strcasecmp(scale, "tiny")) {
    o->vocab = 512;
    o->dim = 64;
    o->n_layers = 2;
    o->n_heads = 4;
    o->ffn = 256;
    o->n_pos = 16;
    return 0;
  }
  return -1;
}

/* ---- construction -------------------------------------------------------------------- */

static vl_status validate(vl_ctx *c, const vl_sd_clip_cfg *g) {
  if (g->vocab < 1 || g->dim < 1 || g->n_layers < 1 || g->n_heads < 1 || g->ffn < 1 ||
      g->n_pos < 1 || !(g->eps > 0))
    return vl_fail(c, VL_ERR_INVALID, "clip: every size and eps must be positive");
  if (g->dim % g->n_heads)
    return vl_fail(c, VL_ERR_INVALID, "clip: dim %lld is not a multiple of %lld heads",
                   (long long)g->dim, (long long)g->n_heads);
  if ((unsigned)g->act >= VL_ACT_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "clip: unknown activation %d", (int)g->act);
  if (!vl_dtype_is_float(g->weights) || !vl_dtype_is_float(g->acts) || !vl_dtype_is_float(g->out))
    return vl_fail(c, VL_ERR_INVALID, "clip: weights %s, activations %s, outputs %s: fp32, "
                   "fp16 or bf16 expected", vl_dtype_name(g->weights), vl_dtype_name(g->acts),
                   vl_dtype_name(g->out));
  if ((unsigned)g->attn >= VL_ATTN_IMPL_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "clip: unknown attention implementation %d", (int)g->attn);
  if (g->lora_rank < 0) return vl_fail(c, VL_ERR_INVALID, "clip: LoRA rank %d", g->lora_rank);
  if (g->lora_rank > 0 && !(g->lora_alpha > 0))
    return vl_fail(c, VL_ERR_INVALID, "clip: LoRA alpha %g must be > 0 with rank %d",
                   (double)g->lora_alpha, g->lora_rank);
  if ((unsigned)g->lora_targets >= VL_SD_CLIP_LORA_TARGETS_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "clip: unknown LoRA targets %d", (int)g->lora_targets);
  return VL_OK;
}

static vl_status add(vl_sd_clip *m, const char *name, int ndim, int64_t d0, int64_t d1,
                     vl_sd_init init, float a) {
  return vl_sd_params_add(m->c, &m->P, name, &(vl_sd_pinfo){ndim, {d0, d1, 0, 0}, init, a},
                          m->cfg.weights);
}

/* nn.Linear(K -> N) "<pre>.<name>" with bias: weight (N, K), bias (N), PyTorch's bound
 * 1/sqrt(K). Its LoRA factors come later (add_lora). */
static vl_status add_linear(vl_sd_clip *m, const char *pre, const char *name, int64_t N,
                            int64_t K, clip_lin *L) {
  char nm[96];
  float a = 1.0f / sqrtf((float)K);
  *L = (clip_lin){.w = m->P.n, .b = m->P.n + 1, .la = -1, .lb = -1, .in = K, .out = N};
  snprintf(nm, sizeof nm, "%s.%s.weight", pre, name);
  VL_TRY(add(m, nm, 2, N, K, VL_SD_INIT_UNIFORM, a));
  snprintf(nm, sizeof nm, "%s.%s.bias", pre, name);
  return add(m, nm, 1, N, 0, VL_SD_INIT_UNIFORM, a);
}

static vl_status add_ln(vl_sd_clip *m, const char *name, int64_t C, int *idx) {
  char nm[96];
  *idx = m->P.n;
  snprintf(nm, sizeof nm, "%s.weight", name);
  VL_TRY(add(m, nm, 1, C, 0, VL_SD_INIT_ONE, 0));
  snprintf(nm, sizeof nm, "%s.bias", name);
  return add(m, nm, 1, C, 0, VL_SD_INIT_ZERO, 0);
}

/* The frozen parameters in state_dict order. */
static vl_status build(vl_sd_clip *m) {
  const vl_sd_clip_cfg *g = &m->cfg;
  int64_t C = g->dim;
  m->layers = calloc((size_t)g->n_layers, sizeof *m->layers);
  if (!m->layers) return vl_fail(m->c, VL_ERR_OOM, "layer table");
  m->tok_emb = m->P.n;
  VL_TRY(add(m, "embeddings.token_embedding.weight", 2, g->vocab, C, VL_SD_INIT_NORMAL, 0.02f));
  m->pos_emb = m->P.n;
  VL_TRY(add(m, "embeddings.position_embedding.weight", 2, g->n_pos, C, VL_SD_INIT_NORMAL, 0.02f));
  char pre[64], nm[96];
  for (int64_t l = 0; l < g->n_layers; l++) {
    clip_layer *L = &m->layers[l];
    snprintf(pre, sizeof pre, "encoder.layers.%lld", (long long)l);
    snprintf(nm, sizeof nm, "%s.self_attn", pre);
    VL_TRY(add_linear(m, nm, "k_proj", C, C, &L->lin[CL_K]));
    VL_TRY(add_linear(m, nm, "v_proj", C, C, &L->lin[CL_V]));
    VL_TRY(add_linear(m, nm, "q_proj", C, C, &L->lin[CL_Q]));
    VL_TRY(add_linear(m, nm, "out_proj", C, C, &L->lin[CL_O]));
    snprintf(nm, sizeof nm, "%s.layer_norm1", pre);
    VL_TRY(add_ln(m, nm, C, &L->ln1));
    snprintf(nm, sizeof nm, "%s.mlp", pre);
    VL_TRY(add_linear(m, nm, "fc1", g->ffn, C, &L->lin[CL_FC1]));
    VL_TRY(add_linear(m, nm, "fc2", C, g->ffn, &L->lin[CL_FC2]));
    snprintf(nm, sizeof nm, "%s.layer_norm2", pre);
    VL_TRY(add_ln(m, nm, C, &L->ln2));
  }
  return add_ln(m, "final_layer_norm", C, &m->final_ln);
}

/* The LoRA factors of linear L, "<frozen weight's module>.lora_A.weight" (r, in) and
 * ".lora_B.weight" (out, r), as trainable parameters in the acts dtype. */
static vl_status add_lora(vl_sd_clip *m, clip_lin *L) {
  char mod[96], nm[128];
  const char *wn = m->P.p[L->w].name;
  size_t n = strlen(wn) - strlen(".weight");
  snprintf(mod, sizeof mod, "%.*s", (int)n, wn);
  int64_t r = m->cfg.lora_rank;
  L->la = m->lora.n;
  snprintf(nm, sizeof nm, "%s.lora_A.weight", mod);
  VL_TRY(sd_lora_add(m->c, &m->lora, nm, r, L->in, m->cfg.acts, VL_SD_INIT_NORMAL,
                     1.0f / (float)r));
  L->lb = m->lora.n;
  snprintf(nm, sizeof nm, "%s.lora_B.weight", mod);
  return sd_lora_add(m->c, &m->lora, nm, L->out, r, m->cfg.acts, VL_SD_INIT_ZERO, 0.0f);
}

/* Every adapted linear, in peft's order (the modules' registration order: k, v, q, out_proj,
 * fc1, fc2 of each layer). */
static vl_status build_lora(vl_sd_clip *m) {
  if (m->cfg.lora_rank == 0) return VL_OK;
  static const int order[CL_NLIN] = {CL_K, CL_V, CL_Q, CL_O, CL_FC1, CL_FC2};
  int n = m->cfg.lora_targets == VL_SD_CLIP_LORA_KOHYA ? 6 : 4;
  for (int64_t l = 0; l < m->cfg.n_layers; l++)
    for (int i = 0; i < n; i++) VL_TRY(add_lora(m, &m->layers[l].lin[order[i]]));
  return VL_OK;
}

vl_status vl_sd_clip_create(vl_ctx *c, const vl_sd_clip_cfg *cfg, uint64_t seed,
                            vl_sd_clip **out) {
  *out = NULL;
  VL_TRY(validate(c, cfg));
  vl_sd_clip *m = calloc(1, sizeof *m);
  if (!m) return vl_fail(c, VL_ERR_OOM, "clip struct");
  m->c = c;
  m->cfg = *cfg;
  vl_status s = build(m);
  if (s == VL_OK) s = vl_sd_params_init(c, &m->P, seed);
  if (s == VL_OK) s = build_lora(m);
  if (s == VL_OK) s = vl_sd_params_init(c, &m->lora, vl_mix64(seed ^ 0x10a));
  if (s != VL_OK) {
    vl_sd_clip_destroy(m);
    return s;
  }
  *out = m;
  return VL_OK;
}

/* Frees every tensor a step holds (an error, a forward without backward), newest first. */
static void cleanup(vl_sd_clip *m) {
  vl_ctx *c = m->c;
  vl_tensor_free(c, &m->dxa);
  for (int i = 4; i >= 0; i--) vl_tensor_free(c, &m->t[i]);
  vl_tensor *top[] = {&m->gr, &m->rf, &m->mf, &m->xf};
  for (size_t i = 0; i < sizeof top / sizeof *top; i++) vl_tensor_free(c, top[i]);
  for (int64_t l = m->layers ? m->cfg.n_layers - 1 : -1; l >= 0; l--) {
    clip_layer *L = &m->layers[l];
    vl_attn_saved_free(c, &L->sv);
    for (int i = CL_NLIN - 1; i >= 0; i--) vl_tensor_free(c, &L->xa[i]);
    vl_tensor *list[] = {&L->g, &L->f, &L->h2, &L->r2, &L->m2, &L->x2, &L->o, &L->v,
                         &L->k, &L->q, &L->h1, &L->r1, &L->m1, &L->x};
    for (size_t i = 0; i < sizeof list / sizeof *list; i++) vl_tensor_free(c, list[i]);
  }
  m->in_step = false;
}

void vl_sd_clip_release(vl_sd_clip *m) { cleanup(m); }

void vl_sd_clip_destroy(vl_sd_clip *m) {
  if (!m) return;
  cleanup(m);
  vl_sd_params_free(m->c, &m->lora);
  vl_sd_params_free(m->c, &m->P);
  free(m->layers);
  free(m);
}

const vl_sd_clip_cfg *vl_sd_clip_config(const vl_sd_clip *m) { return &m->cfg; }
vl_sd_params *vl_sd_clip_params(vl_sd_clip *m) { return &m->P; }
int64_t vl_sd_clip_n_params(const vl_sd_clip *m) { return vl_sd_params_count(&m->P); }
int64_t vl_sd_clip_n_trainable(const vl_sd_clip *m) { return vl_sd_params_count(&m->lora); }

vl_param *vl_sd_clip_param(vl_sd_clip *m, const char *name) {
  int i = vl_sd_params_find(&m->P, name);
  if (i >= 0) return &m->P.p[i];
  i = vl_sd_params_find(&m->lora, name);
  return i < 0 ? NULL : &m->lora.p[i];
}

vl_param *vl_sd_clip_trainable(vl_sd_clip *m, int *n) {
  *n = m->lora.n;
  return m->lora.n ? m->lora.p : NULL;
}

vl_status vl_sd_clip_alloc_optim(vl_sd_clip *m, const vl_optim_cfg *oc) {
  for (int i = 0; i < m->lora.n; i++) VL_TRY(vl_param_alloc_optim(m->c, &m->lora.p[i], oc));
  return VL_OK;
}

vl_status vl_sd_clip_zero_grads(vl_sd_clip *m) {
  return vl_params_zero_grads(m->c, m->lora.p, m->lora.n);
}

vl_status vl_sd_clip_apply(vl_sd_clip *m, const vl_optim_cfg *oc, float clip, vl_scaler *s,
                           bool *skipped, double *grad_norm) {
  return vl_params_apply(m->c, m->lora.p, m->lora.n, oc, clip, s, skipped, grad_norm);
}

/* ---- helpers ----------------------------------------------------------------------------- */

static const vl_tensor *W(vl_sd_clip *m, int idx) { return &m->P.p[idx].w; }
static vl_mem_cat kcat(bool keep) { return keep ? VL_MEM_ACTS : VL_MEM_TEMP; }
static bool adapted(const clip_layer *L, int i) { return L->lin[i].la >= 0; }

static vl_status act3(vl_sd_clip *m, vl_tensor *t, vl_dtype dt, vl_mem_cat cat, int64_t n) {
  int64_t shape[3] = {m->B, m->T, n};
  return vl_tensor_alloc(m->c, t, dt, cat, 3, shape);
}
static vl_status rowstat(vl_sd_clip *m, vl_tensor *t, vl_mem_cat cat) {
  int64_t R = m->B * m->T;
  return vl_tensor_alloc(m->c, t, VL_F32, cat, 1, &R);
}
static void move(vl_tensor *dst, vl_tensor *src) {
  *dst = *src;
  memset(src, 0, sizeof *src);
}

/* y (R, C) (allocated: dtype dt, category cat) = LayerNorm(x) with the affine at parameter
 * pn; its statistics mean, rstd (R) in category scat, freed unless keep_stats. */
static vl_status layernorm(vl_sd_clip *m, vl_tensor *y, vl_dtype dt, vl_mem_cat cat,
                           vl_tensor *mean, vl_tensor *rstd, bool keep_stats, const vl_tensor *x,
                           int pn) {
  vl_ctx *c = m->c;
  int64_t R = m->B * m->T;
  VL_TRY(act3(m, y, dt, cat, m->cfg.dim));
  VL_TRY(rowstat(m, mean, kcat(keep_stats)));
  VL_TRY(rowstat(m, rstd, kcat(keep_stats)));
  VL_TRY(vl_layernorm_fwd_run(c, &(vl_layernorm_fwd_args){.y = y, .mean = mean, .rstd = rstd,
                                                         .x = x, .gamma = W(m, pn),
                                                         .beta = W(m, pn + 1), .R = R,
                                                         .C = m->cfg.dim, .eps = m->cfg.eps}));
  if (!keep_stats) {
    vl_tensor_free(c, rstd);
    vl_tensor_free(c, mean);
  }
  return VL_OK;
}
/* dx (R, C) += LayerNorm's input gradient from dy; the norm is frozen */
static vl_status layernorm_bwd(vl_sd_clip *m, vl_tensor *dx, const vl_tensor *dy,
                               const vl_tensor *x, int pn, const vl_tensor *mean,
                               const vl_tensor *rstd, bool accumulate) {
  return vl_layernorm_bwd_run(m->c, &(vl_layernorm_bwd_args){.dx = dx, .dgamma = NULL,
                                                            .dbeta = NULL, .dy = dy, .x = x,
                                                            .gamma = W(m, pn), .mean = mean,
                                                            .rstd = rstd, .R = m->B * m->T,
                                                            .C = m->cfg.dim,
                                                            .accumulate = accumulate});
}

/* Linear i of layer L as sd_lora.c sees it. */
static sd_lora_lin lora_lin(vl_sd_clip *m, const clip_layer *L, int i) {
  const clip_lin *l = &L->lin[i];
  bool lora = l->la >= 0;
  return (sd_lora_lin){.w = W(m, l->w), .b = W(m, l->b), .A = lora ? &m->lora.p[l->la] : NULL,
                       .B = lora ? &m->lora.p[l->lb] : NULL, .in = l->in, .out = l->out,
                       .r = m->cfg.lora_rank,
                       .scale = lora ? m->cfg.lora_alpha / (float)m->cfg.lora_rank : 0.0f,
                       .acts = m->cfg.acts};
}
/* y (R, out) (beta 0: overwritten, 1: accumulated) = linear i of L (x) */
static vl_status lin_fwd(vl_sd_clip *m, clip_layer *L, int i, vl_tensor *y, const vl_tensor *x,
                         float beta, bool keep) {
  sd_lora_lin l = lora_lin(m, L, i);
  return sd_lora_lin_fwd(m->c, &l, y, x, m->B * m->T, beta, keep, &L->xa[i]);
}
/* LoRA gradients of linear i from dy; with dx, dx (beta 0: overwritten, 1: accumulated) */
static vl_status lin_bwd(vl_sd_clip *m, clip_layer *L, int i, vl_tensor *dx, float beta,
                         const vl_tensor *dy, const vl_tensor *x) {
  sd_lora_lin l = lora_lin(m, L, i);
  return sd_lora_lin_bwd(m->c, &l, dx, beta, dy, x, &L->xa[i], &m->dxa, m->B * m->T);
}

/* ---- one encoder layer --------------------------------------------------------------------- */

/* Layer l from its input L->x (B, T, C) to `out` (B, T, C), allocated here unless `rerun`.
 * keep: keep what the backward reads (VL_MEM_ACTS); save_in: L->x survives (layer_norm1's
 * backward or a checkpoint's re-run reads it), else the stream runs on in it in place. A
 * rerun (a checkpointed layer inside backward) stops once what fc2's backward reads exists
 * (its input and x A^T with LoRA, without its output). */
static vl_status layer_fwd(vl_sd_clip *m, int64_t l, bool keep, bool save_in, bool rerun,
                           vl_tensor *out) {
  vl_ctx *c = m->c;
  const vl_sd_clip_cfg *g = &m->cfg;
  clip_layer *L = &m->layers[l];
  int64_t C = g->dim, F = g->ffn, H = g->n_heads, D = C / H, R = m->B * m->T;
  vl_dtype dt = g->acts;
  vl_mem_cat kc = kcat(keep), sc = kcat(m->train); /* sc: the residual stream's */
  bool keep_h1 = keep && (adapted(L, CL_Q) || adapted(L, CL_K) || adapted(L, CL_V));
  bool keep_h2 = keep && adapted(L, CL_FC1), keep_g = keep && adapted(L, CL_FC2);
  /* x2 = x + out_proj(attn(layer_norm1(x))) */
  VL_TRY(layernorm(m, &L->h1, dt, kcat(keep_h1), &L->m1, &L->r1, keep && save_in, &L->x,
                   L->ln1));                                                // h1 (B, T, C)
  VL_TRY(act3(m, &L->q, dt, kc, C));                                        // q (B, T, C)
  VL_TRY(lin_fwd(m, L, CL_Q, &L->q, &L->h1, 0.0f, keep));
  VL_TRY(act3(m, &L->k, dt, kc, C));                                        // k (B, T, C)
  VL_TRY(lin_fwd(m, L, CL_K, &L->k, &L->h1, 0.0f, keep));
  VL_TRY(act3(m, &L->v, dt, kc, C));                                        // v (B, T, C)
  VL_TRY(lin_fwd(m, L, CL_V, &L->v, &L->h1, 0.0f, keep));
  if (!keep_h1) vl_tensor_free(c, &L->h1);
  VL_TRY(act3(m, &L->o, dt, kc, C));                                        // o (B, T, C)
  VL_TRY(vl_attention_fwd(c, g->attn, &L->o, &L->q, &L->k, &L->v, m->B, H, m->T, m->T, D, true,
                          keep, &L->sv));
  if (!keep) {
    vl_tensor_free(c, &L->v);
    vl_tensor_free(c, &L->k);
    vl_tensor_free(c, &L->q);
  }
  if (save_in) {
    VL_TRY(act3(m, &L->x2, dt, sc, C));                                     // x2 (B, T, C)
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &L->x2, .x = &L->x, .n = R * C}));
  } else {
    move(&L->x2, &L->x);
  }
  VL_TRY(lin_fwd(m, L, CL_O, &L->x2, &L->o, 1.0f, keep));                   /* residual */
  if (!keep) vl_tensor_free(c, &L->o);
  /* out = x2 + fc2(act(fc1(layer_norm2(x2)))) */
  VL_TRY(layernorm(m, &L->h2, dt, kcat(keep_h2), &L->m2, &L->r2, keep, &L->x2,
                   L->ln2));                                                // h2 (B, T, C)
  VL_TRY(act3(m, &L->f, dt, kc, F));                                        // f (B, T, F)
  VL_TRY(lin_fwd(m, L, CL_FC1, &L->f, &L->h2, 0.0f, keep));
  if (!keep_h2) vl_tensor_free(c, &L->h2);
  if (rerun && !keep_g) return VL_OK;
  if (keep) {
    VL_TRY(act3(m, &L->g, dt, kcat(keep_g), F));                            // g (B, T, F)
    VL_TRY(vl_act_fwd_run(c, &(vl_act_fwd_args){.y = &L->g, .x = &L->f, .n = R * F,
                                                .act = g->act}));
  } else { /* no backward reads fc1's output: the activation in place */
    move(&L->g, &L->f);
    VL_TRY(vl_act_fwd_run(c, &(vl_act_fwd_args){.y = &L->g, .x = &L->g, .n = R * F,
                                                .act = g->act}));
  }
  if (rerun) { /* fc2's LoRA input x A^T, without fc2's output */
    sd_lora_lin l = lora_lin(m, L, CL_FC2);
    return sd_lora_lin_xa(c, &l, &L->g, R, &L->xa[CL_FC2]);
  }
  if (keep) {
    VL_TRY(act3(m, out, dt, sc, C));                                        // out (B, T, C)
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = out, .x = &L->x2, .n = R * C}));
  } else {
    move(out, &L->x2);
  }
  VL_TRY(lin_fwd(m, L, CL_FC2, out, &L->g, 1.0f, keep));                    /* residual */
  if (!keep_g) vl_tensor_free(c, &L->g);
  return VL_OK;
}

/* m->gr (B, T, C): the gradient of the layer's output in; of its input out (l > 0), else
 * freed. The LoRA gradients of its linears accumulate. */
static vl_status layer_bwd(vl_sd_clip *m, int64_t l) {
  vl_ctx *c = m->c;
  const vl_sd_clip_cfg *g = &m->cfg;
  clip_layer *L = &m->layers[l];
  int64_t C = g->dim, F = g->ffn, R = m->B * m->T;
  vl_dtype dt = g->acts;
  bool need_dx = l > 0; /* layer 0's input comes from the frozen embeddings */
  vl_tensor *gr = &m->gr, *t0 = &m->t[0], *t1 = &m->t[1], *dq = &m->t[2], *dk = &m->t[3],
            *dv = &m->t[4];
  /* the MLP: fc2, the activation, fc1, then gr += layer_norm2's input gradient */
  VL_TRY(act3(m, t0, dt, VL_MEM_TEMP, F)); // (B, T, F) d activation output, then d f
  VL_TRY(lin_bwd(m, L, CL_FC2, t0, 0.0f, gr, &L->g));
  vl_tensor_free(c, &L->g);
  VL_TRY(vl_act_bwd_run(c, &(vl_act_bwd_args){.dx = t0, .dy = t0, .x = &L->f, .n = R * F,
                                              .act = g->act}));
  vl_tensor_free(c, &L->f);
  VL_TRY(act3(m, t1, dt, VL_MEM_TEMP, C)); // (B, T, C) d h2
  VL_TRY(lin_bwd(m, L, CL_FC1, t1, 0.0f, t0, &L->h2));
  vl_tensor_free(c, t0);
  vl_tensor_free(c, &L->h2);
  VL_TRY(layernorm_bwd(m, gr, t1, &L->x2, L->ln2, &L->m2, &L->r2, true));
  vl_tensor_free(c, t1);
  vl_tensor_free(c, &L->r2);
  vl_tensor_free(c, &L->m2);
  vl_tensor_free(c, &L->x2);
  /* the attention: out_proj, attention, q/k/v, then gr += layer_norm1's input gradient */
  VL_TRY(act3(m, t0, dt, VL_MEM_TEMP, C)); // (B, T, C) d o
  VL_TRY(lin_bwd(m, L, CL_O, t0, 0.0f, gr, &L->o));
  if (!need_dx) vl_tensor_free(c, gr);
  VL_TRY(act3(m, dq, dt, VL_MEM_TEMP, C)); // (B, T, C) each
  VL_TRY(act3(m, dk, dt, VL_MEM_TEMP, C));
  VL_TRY(act3(m, dv, dt, VL_MEM_TEMP, C));
  VL_TRY(vl_attention_bwd(c, &L->sv, dq, dk, dv, t0, &L->o, &L->q, &L->k, &L->v));
  vl_tensor_free(c, t0);
  vl_tensor *list[] = {&L->o, &L->v, &L->k, &L->q};
  for (size_t i = 0; i < sizeof list / sizeof *list; i++) vl_tensor_free(c, list[i]);
  vl_tensor *dh1 = need_dx ? t0 : NULL; // (B, T, C) d h1
  if (need_dx) VL_TRY(act3(m, t0, dt, VL_MEM_TEMP, C));
  VL_TRY(lin_bwd(m, L, CL_Q, dh1, 0.0f, dq, &L->h1));
  VL_TRY(lin_bwd(m, L, CL_K, dh1, 1.0f, dk, &L->h1));
  VL_TRY(lin_bwd(m, L, CL_V, dh1, 1.0f, dv, &L->h1));
  vl_tensor_free(c, dv);
  vl_tensor_free(c, dk);
  vl_tensor_free(c, dq);
  vl_tensor_free(c, &L->h1);
  if (!need_dx) return VL_OK;
  VL_TRY(layernorm_bwd(m, gr, t0, &L->x, L->ln1, &L->m1, &L->r1, true));
  vl_tensor_free(c, t0);
  vl_tensor_free(c, &L->r1);
  vl_tensor_free(c, &L->m1);
  vl_tensor_free(c, &L->x);
  return VL_OK;
}

/* ---- the step ------------------------------------------------------------------------------ */

/* Is every layer checkpointed in this step? */
static bool ck(const vl_sd_clip *m) { return m->train && m->cfg.checkpoint; }

/* tokens (B, T) -> the stream through every layer -> hidden = final_layer_norm(stream). */
static vl_status forward(vl_sd_clip *m, const vl_tensor *tokens, vl_tensor *hidden,
                         vl_mem_cat out_cat) {
  vl_ctx *c = m->c;
  const vl_sd_clip_cfg *g = &m->cfg;
  int64_t C = g->dim, R = m->B * m->T, n = g->n_layers;
  vl_tensor *x = &m->layers[0].x;
  VL_TRY(act3(m, x, g->acts, kcat(m->train), C));                           // x (B, T, C)
  VL_TRY(vl_embed_fwd_run(c, &(vl_embed_fwd_args){.out = x, .wte = W(m, m->tok_emb), .tok = tokens,
                                                  .R = R, .C = C}));
  /* + position_embedding rows 0..T-1, the same for every sequence: a bias over (B, T*C) */
  vl_tensor pos = vl_tensor_rows(W(m, m->pos_emb), 0, m->T);
  VL_TRY(vl_bias_fwd_run(c, &(vl_bias_fwd_args){.y = x, .b = &pos, .outer = m->B, .C = m->T * C,
                                                .inner = 1, .per_outer = false}));
  for (int64_t l = 0; l < n; l++) {
    bool keep = m->train && !ck(m), save_in = m->train && (ck(m) || l > 0);
    VL_TRY(layer_fwd(m, l, keep, save_in, false, l + 1 < n ? &m->layers[l + 1].x : &m->xf));
  }
  VL_TRY(layernorm(m, hidden, g->out, out_cat, &m->mf, &m->rf, m->train, &m->xf,
                   m->final_ln));                                           // hidden (B, T, C)
  if (!m->train) vl_tensor_free(c, &m->xf);
  return VL_OK;
}

static vl_status backward(vl_sd_clip *m, const vl_tensor *dhidden) {
  vl_ctx *c = m->c;
  VL_TRY(act3(m, &m->gr, m->cfg.acts, VL_MEM_TEMP, m->cfg.dim));            // gr (B, T, C)
  VL_TRY(layernorm_bwd(m, &m->gr, dhidden, &m->xf, m->final_ln, &m->mf, &m->rf, false));
  vl_tensor_free(c, &m->rf);
  vl_tensor_free(c, &m->mf);
  vl_tensor_free(c, &m->xf);
  for (int64_t l = m->cfg.n_layers - 1; l >= 0; l--) {
    if (ck(m)) { /* re-run the layer from its saved input; its FLOPs are recompute */
      c->recomputing++;
      vl_status s = layer_fwd(m, l, true, l > 0, true, NULL);
      c->recomputing--;
      VL_TRY(s);
    }
    VL_TRY(layer_bwd(m, l));
  }
  return VL_OK;
}

static vl_status check_tokens(vl_sd_clip *m, const vl_tensor *tokens, const vl_tensor *hidden) {
  vl_ctx *c = m->c;
  const vl_sd_clip_cfg *g = &m->cfg;
  if (!tokens || !hidden) return vl_fail(c, VL_ERR_INVALID, "clip encode: needs tokens and hidden");
  if (tokens->dtype != VL_I32 || tokens->ndim != 2 || tokens->shape[0] < 1 ||
      tokens->shape[1] < 1 || tokens->shape[1] > g->n_pos)
    return vl_fail(c, VL_ERR_INVALID, "clip encode: tokens must be i32 (B, T) with 1 <= T <= %lld",
                   (long long)g->n_pos);
  if (c->device == VL_DEV_CPU && tokens->data) { /* host memory: an id out of range would be
                                                    read out of the table's bounds */
    const int32_t *id = tokens->data;
    for (int64_t i = 0; i < tokens->n; i++)
      if (id[i] < 0 || id[i] >= g->vocab)
        return vl_fail(c, VL_ERR_INVALID, "clip encode: token %lld is %d, outside 0..%lld",
                       (long long)i, (int)id[i], (long long)g->vocab - 1);
  }
  return VL_OK;
}

static vl_status run_forward(vl_sd_clip *m, const vl_tensor *tokens, bool train,
                             vl_tensor *hidden, vl_mem_cat out_cat) {
  vl_ctx *c = m->c;
  if (hidden) memset(hidden, 0, sizeof *hidden);
  cleanup(m);
  VL_TRY(check_tokens(m, tokens, hidden));
  if (train && m->cfg.lora_rank == 0)
    return vl_fail(c, VL_ERR_INVALID, "clip: a training forward needs lora_rank > 0");
  m->B = tokens->shape[0];
  m->T = tokens->shape[1];
  m->train = train;
  vl_status s = forward(m, tokens, hidden, out_cat);
  if (s != VL_OK) {
    cleanup(m);
    vl_tensor_free(c, hidden);
    return s;
  }
  m->in_step = train;
  return VL_OK;
}

vl_status vl_sd_clip_encode(vl_sd_clip *m, const vl_tensor *tokens, vl_tensor *hidden,
                            vl_mem_cat out_cat) {
  return run_forward(m, tokens, false, hidden, out_cat);
}

vl_status vl_sd_clip_forward(vl_sd_clip *m, const vl_tensor *tokens, bool train,
                             vl_tensor *hidden) {
  return run_forward(m, tokens, train, hidden, VL_MEM_TEMP);
}

vl_status vl_sd_clip_backward(vl_sd_clip *m, const vl_tensor *dhidden) {
  vl_ctx *c = m->c;
  if (!m->in_step) return vl_fail(c, VL_ERR_INVALID, "clip: backward without a training forward");
  vl_status s = VL_OK;
  if (!dhidden || dhidden->ndim != 3 || dhidden->shape[0] != m->B || dhidden->shape[1] != m->T ||
      dhidden->shape[2] != m->cfg.dim || !vl_dtype_is_float(dhidden->dtype))
    s = vl_fail(c, VL_ERR_INVALID, "clip: dhidden must be a float (%lld, %lld, %lld)",
                (long long)m->B, (long long)m->T, (long long)m->cfg.dim);
  if (s == VL_OK) s = backward(m, dhidden);
  cleanup(m);
  return s;
}
