/* The CLIP ViT-L/14 text encoder of Stable Diffusion 1.5, forward only (see sd_encoders.h):
 * transformers' CLIPTextModel up to last_hidden_state. Token embedding + position embedding;
 * per layer x += out_proj(attn(layer_norm1(x))) (q/k/v/out projections with biases, causal,
 * scale 1/sqrt(head dim)) and x += fc2(quick_gelu(fc1(layer_norm2(x)))); final_layer_norm.
 *
 * Rows R = B*T; C = dim; H heads of D = C/H; F = ffn. Activations are in the activation
 * dtype; the residual stream x is updated in place (GEMMs accumulate into it, then the
 * bias). Every intermediate is VL_MEM_TEMP, freed as soon as it is consumed; every tensor a
 * forward makes lives in a slot of clip_slots, so a failed forward (OOM) frees all of them. */
#include "vramlab/sd_encoders.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Parameter indices of one encoder layer (a weight; its bias follows it). */
typedef struct {
  int k, v, q, o, ln1, fc1, fc2, ln2;
} layer;

typedef struct {
  vl_tensor x;          // (B, T, C) the residual stream
  vl_tensor h;          // (B, T, C) a LayerNorm output (the projections' input)
  vl_tensor mean, rstd; // (R) fp32 LayerNorm statistics, alive for one op
  vl_tensor q, k, v;    // (B, T, C) projections, head h in columns [h D, (h+1) D)
  vl_tensor o;          // (B, T, C) attention output
  vl_tensor f;          // (B, T, F) fc1 output, quick-GELU in place
} clip_slots;

struct vl_sd_clip {
  vl_ctx *c;
  vl_sd_clip_cfg cfg;
  vl_sd_params P;
  int tok_emb, pos_emb, final_ln;
  layer *layers;
  int64_t B, T;         /* the forward in flight */
  clip_slots s;
};

/* ---- presets ------------------------------------------------------------------------- */

int vl_sd_clip_preset(const char *scale, vl_sd_clip_cfg *o) {
  memset(o, 0, sizeof *o);
  *o = (vl_sd_clip_cfg){.vocab = 49408, .dim = 768, .n_layers = 12, .n_heads = 12, .ffn = 3072,
                        .n_pos = 77, .eps = 1e-5f, .act = VL_ACT_QUICK_GELU, .weights = VL_F32,
                        .acts = VL_F32, .out = VL_F32, .attn = VL_ATTN_EFFICIENT};
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
  return VL_OK;
}

static vl_status add(vl_sd_clip *m, const char *name, int ndim, int64_t d0, int64_t d1,
                     vl_sd_init init, float a) {
  return vl_sd_params_add(m->c, &m->P, name, &(vl_sd_pinfo){ndim, {d0, d1, 0, 0}, init, a},
                          m->cfg.weights);
}

/* nn.Linear(K -> N) with bias: weight (N, K), bias (N), PyTorch's bound 1/sqrt(K). */
static vl_status add_linear(vl_sd_clip *m, const char *pre, const char *name, int64_t N,
                            int64_t K, int *idx) {
  char nm[96];
  float a = 1.0f / sqrtf((float)K);
  *idx = m->P.n;
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

/* The parameters in state_dict order. */
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
    layer *L = &m->layers[l];
    snprintf(pre, sizeof pre, "encoder.layers.%lld", (long long)l);
    snprintf(nm, sizeof nm, "%s.self_attn", pre);
    VL_TRY(add_linear(m, nm, "k_proj", C, C, &L->k));
    VL_TRY(add_linear(m, nm, "v_proj", C, C, &L->v));
    VL_TRY(add_linear(m, nm, "q_proj", C, C, &L->q));
    VL_TRY(add_linear(m, nm, "out_proj", C, C, &L->o));
    snprintf(nm, sizeof nm, "%s.layer_norm1", pre);
    VL_TRY(add_ln(m, nm, C, &L->ln1));
    snprintf(nm, sizeof nm, "%s.mlp", pre);
    VL_TRY(add_linear(m, nm, "fc1", g->ffn, C, &L->fc1));
    VL_TRY(add_linear(m, nm, "fc2", C, g->ffn, &L->fc2));
    snprintf(nm, sizeof nm, "%s.layer_norm2", pre);
    VL_TRY(add_ln(m, nm, C, &L->ln2));
  }
  return add_ln(m, "final_layer_norm", C, &m->final_ln);
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
  if (s != VL_OK) {
    vl_sd_clip_destroy(m);
    return s;
  }
  *out = m;
  return VL_OK;
}

/* Frees every tensor a forward made (after an error), newest first. */
static void cleanup(vl_sd_clip *m) {
  clip_slots *S = &m->s;
  vl_tensor *l[] = {&S->f, &S->o, &S->v, &S->k, &S->q, &S->rstd, &S->mean, &S->h, &S->x};
  for (size_t i = 0; i < sizeof l / sizeof *l; i++) vl_tensor_free(m->c, l[i]);
}

void vl_sd_clip_destroy(vl_sd_clip *m) {
  if (!m) return;
  cleanup(m);
  vl_sd_params_free(m->c, &m->P);
  free(m->layers);
  free(m);
}

const vl_sd_clip_cfg *vl_sd_clip_config(const vl_sd_clip *m) { return &m->cfg; }
vl_sd_params *vl_sd_clip_params(vl_sd_clip *m) { return &m->P; }
int64_t vl_sd_clip_n_params(const vl_sd_clip *m) { return vl_sd_params_count(&m->P); }
vl_param *vl_sd_clip_param(vl_sd_clip *m, const char *name) {
  int i = vl_sd_params_find(&m->P, name);
  return i < 0 ? NULL : &m->P.p[i];
}

/* ---- layers ------------------------------------------------------------------------------ */

static const vl_tensor *W(vl_sd_clip *m, int idx) { return &m->P.p[idx].w; }

static vl_status act3(vl_sd_clip *m, vl_tensor *t, vl_dtype dt, vl_mem_cat cat, int64_t n) {
  int64_t shape[3] = {m->B, m->T, n};
  return vl_tensor_alloc(m->c, t, dt, cat, 3, shape);
}

/* y (R, C) = LayerNorm(x) with the affine at parameter pn; y allocated (dtype dt, cat). */
static vl_status layernorm(vl_sd_clip *m, vl_tensor *y, vl_dtype dt, vl_mem_cat cat,
                           const vl_tensor *x, int pn) {
  vl_ctx *c = m->c;
  clip_slots *S = &m->s;
  int64_t R = m->B * m->T;
  VL_TRY(act3(m, y, dt, cat, m->cfg.dim));
  VL_TRY(vl_tensor_alloc(c, &S->mean, VL_F32, VL_MEM_TEMP, 1, &R));
  VL_TRY(vl_tensor_alloc(c, &S->rstd, VL_F32, VL_MEM_TEMP, 1, &R));
  VL_TRY(vl_layernorm_fwd_run(c, &(vl_layernorm_fwd_args){y, &S->mean, &S->rstd, x, W(m, pn),
                                                         W(m, pn + 1), R, m->cfg.dim,
                                                         m->cfg.eps}));
  vl_tensor_free(c, &S->rstd);
  vl_tensor_free(c, &S->mean);
  return VL_OK;
}

/* y (R, N) (beta 0: overwritten, 1: accumulated) += x (R, K) W^T + b, at parameter pw. */
static vl_status linear(vl_sd_clip *m, vl_tensor *y, const vl_tensor *x, int pw, int64_t K,
                        int64_t N, float beta) {
  int64_t R = m->B * m->T;
  VL_TRY(vl_linear_fwd(m->c, y, x, W(m, pw), R, K, N, beta));
  return vl_bias_fwd_run(m->c, &(vl_bias_fwd_args){y, W(m, pw + 1), R, N, 1, false});
}

/* One encoder layer on the residual stream S->x (B, T, C), in place. */
static vl_status layer_fwd(vl_sd_clip *m, const layer *L) {
  vl_ctx *c = m->c;
  const vl_sd_clip_cfg *g = &m->cfg;
  clip_slots *S = &m->s;
  int64_t C = g->dim, F = g->ffn, H = g->n_heads, D = C / H, R = m->B * m->T;
  vl_dtype dt = g->acts;
  /* x += out_proj(attn(layer_norm1(x))) */
  VL_TRY(layernorm(m, &S->h, dt, VL_MEM_TEMP, &S->x, L->ln1));              // h (B, T, C)
  VL_TRY(act3(m, &S->q, dt, VL_MEM_TEMP, C));                               // q (B, T, C)
  VL_TRY(linear(m, &S->q, &S->h, L->q, C, C, 0.0f));
  VL_TRY(act3(m, &S->k, dt, VL_MEM_TEMP, C));                               // k (B, T, C)
  VL_TRY(linear(m, &S->k, &S->h, L->k, C, C, 0.0f));
  VL_TRY(act3(m, &S->v, dt, VL_MEM_TEMP, C));                               // v (B, T, C)
  VL_TRY(linear(m, &S->v, &S->h, L->v, C, C, 0.0f));
  vl_tensor_free(c, &S->h);
  VL_TRY(act3(m, &S->o, dt, VL_MEM_TEMP, C));                               // o (B, T, C)
  vl_attn_saved saved;
  VL_TRY(vl_attention_fwd(c, g->attn, &S->o, &S->q, &S->k, &S->v, m->B, H, m->T, m->T, D, true,
                          false, &saved));
  vl_tensor_free(c, &S->v);
  vl_tensor_free(c, &S->k);
  vl_tensor_free(c, &S->q);
  VL_TRY(linear(m, &S->x, &S->o, L->o, C, C, 1.0f));                        /* residual */
  vl_tensor_free(c, &S->o);
  /* x += fc2(act(fc1(layer_norm2(x)))) */
  VL_TRY(layernorm(m, &S->h, dt, VL_MEM_TEMP, &S->x, L->ln2));              // h (B, T, C)
  VL_TRY(act3(m, &S->f, dt, VL_MEM_TEMP, F));                               // f (B, T, F)
  VL_TRY(linear(m, &S->f, &S->h, L->fc1, C, F, 0.0f));
  vl_tensor_free(c, &S->h);
  VL_TRY(vl_act_fwd_run(c, &(vl_act_fwd_args){&S->f, &S->f, R * F, g->act}));
  VL_TRY(linear(m, &S->x, &S->f, L->fc2, F, C, 1.0f));                      /* residual */
  vl_tensor_free(c, &S->f);
  return VL_OK;
}

/* tokens (B, T) -> S->x (B, T, C) through every layer, then hidden = final_layer_norm(x). */
static vl_status forward(vl_sd_clip *m, const vl_tensor *tokens, vl_tensor *hidden,
                         vl_mem_cat out_cat) {
  vl_ctx *c = m->c;
  const vl_sd_clip_cfg *g = &m->cfg;
  clip_slots *S = &m->s;
  int64_t C = g->dim, R = m->B * m->T;
  VL_TRY(act3(m, &S->x, g->acts, VL_MEM_TEMP, C));                          // x (B, T, C)
  VL_TRY(vl_embed_fwd_run(c, &(vl_embed_fwd_args){&S->x, W(m, m->tok_emb), tokens, R, C}));
  /* + position_embedding rows 0..T-1, the same for every sequence: a bias over (B, T*C) */
  vl_tensor pos = vl_tensor_rows(W(m, m->pos_emb), 0, m->T);
  VL_TRY(vl_bias_fwd_run(c, &(vl_bias_fwd_args){&S->x, &pos, m->B, m->T * C, 1, false}));
  for (int64_t l = 0; l < g->n_layers; l++) VL_TRY(layer_fwd(m, &m->layers[l]));
  VL_TRY(layernorm(m, hidden, g->out, out_cat, &S->x, m->final_ln));       // hidden (B, T, C)
  vl_tensor_free(c, &S->x);
  return VL_OK;
}

vl_status vl_sd_clip_encode(vl_sd_clip *m, const vl_tensor *tokens, vl_tensor *hidden,
                            vl_mem_cat out_cat) {
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
  memset(hidden, 0, sizeof *hidden);
  m->B = tokens->shape[0];
  m->T = tokens->shape[1];
  vl_status s = forward(m, tokens, hidden, out_cat);
  if (s != VL_OK) {
    cleanup(m);
    vl_tensor_free(c, hidden);
  }
  return s;
}
