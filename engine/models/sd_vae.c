/* The VAE encoder of Stable Diffusion 1.5, forward only (see sd_encoders.h): diffusers
 * AutoencoderKL's Encoder (conv_in; per level ResnetBlock2Ds without time embedding and,
 * except on the last level, a Downsample2D: F.pad (0, 1, 0, 1) then a stride-2 3x3
 * convolution without padding; the mid block resnet, single-head attention, resnet;
 * GroupNorm, SiLU, conv_out to 2 x latent channels), quant_conv, and the diagonal Gaussian
 * sample scaled by 0.18215.
 *
 * Activations are NCHW in the activation dtype; B the batch, h x w the current side. Every
 * intermediate is VL_MEM_TEMP and is freed as soon as the next one is made from it; the
 * largest live set is a resnet's input, its norm output and its conv output (three
 * 128-channel maps at full resolution). Convolutions have no bias in the engine: BIAS_FWD
 * adds it. Every tensor a forward makes lives in a slot of vae_slots, so a failed forward
 * (OOM) frees all of them and the model stays usable. */
#include "vramlab/sd_encoders.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../kernels/act.h"

/* One ResnetBlock2D (temb_channels None): parameter indices of norm1, conv1, norm2, conv2
 * (weight; the bias follows it) and conv_shortcut (-1 when cin == cout). */
typedef struct {
  int norm1, conv1, norm2, conv2, shortcut;
  int64_t cin, cout;
} resnet;

typedef struct {
  vl_tensor x;          // (B, C, h, w) the activation flowing through the encoder
  vl_tensor xin;        // (B, in_ch, H, W) the images in the activation dtype, when they differ
  vl_tensor a, b;       // (B, C', h, w) a block's intermediates (norm output, conv output)
  vl_tensor pad;        // (B, C, h + 1, w + 1) a downsampler's padded input
  vl_tensor mean, rstd; // (B * groups) fp32 GroupNorm statistics, alive for one op
  vl_tensor tok;        // (B, h*w, C) the mid attention's tokens (its GroupNorm, permuted)
  vl_tensor q, k, v, o; // (B, h*w, C) projections and the attention output
  vl_tensor mom;        // (B, 2 latent_ch, h, w) moments in the activation dtype
} vae_slots;

struct vl_sd_vae {
  vl_ctx *c;
  vl_sd_vae_cfg cfg;
  vl_sd_params P;
  int conv_in;
  resnet *res;          /* level l's resnets at [l * layers_per_block, ...); the mid block's two
                           at n_levels * layers_per_block */
  int down[VL_SD_VAE_MAX_LEVELS]; /* downsampler conv of level l, -1 on the last */
  int attn_norm, to_q, to_k, to_v, to_out;
  int norm_out, conv_out, quant_conv;
  int64_t B;            /* batch of the forward in flight */
  vae_slots s;
};

/* ---- presets ------------------------------------------------------------------------- */

int vl_sd_vae_preset(const char *scale, vl_sd_vae_cfg *o) {
  memset(o, 0, sizeof *o);
  *o = (vl_sd_vae_cfg){.in_ch = 3, .n_levels = 4, .ch = {128, 256, 512, 512},
                       .layers_per_block = 2, .groups = 32, .latent_ch = 4, .mid_attn = true,
                       .eps = 1e-6f, .scale = 0.18215f, .image = 512, .weights = VL_F32,
                       .acts = VL_F32, .out = VL_F32, .attn = VL_ATTN_EFFICIENT};
  if (!strcasecmp(scale, "full")) return 0;
  if (!strcasecmp(scale, "small")) {
    for (int i = 0; i < 4; i++) o->ch[i] /= 4;
    o->groups = 8;
    o->image = 128;
    return 0;
  }
  if (!strcasecmp(scale, "tiny")) {
    for (int i = 0; i < 4; i++) o->ch[i] /= 16;
    o->layers_per_block = 1;
    o->groups = 4;
    o->image = 64;
    return 0;
  }
  return -1;
}

/* ---- construction -------------------------------------------------------------------- */

static vl_status validate(vl_ctx *c, const vl_sd_vae_cfg *g) {
  if (g->n_levels < 1 || g->n_levels > VL_SD_VAE_MAX_LEVELS || g->layers_per_block < 1 ||
      g->in_ch < 1 || g->latent_ch < 1 || g->groups < 1 || !(g->eps > 0) || g->image < 1)
    return vl_fail(c, VL_ERR_INVALID, "vae: levels 1..%d, layers, channels, groups, eps and "
                   "image must be positive", VL_SD_VAE_MAX_LEVELS);
  for (int l = 0; l < g->n_levels; l++)
    if (g->ch[l] < 1 || g->ch[l] % g->groups)
      return vl_fail(c, VL_ERR_INVALID, "vae: level %d has %lld channels, not a positive "
                     "multiple of %lld groups", l, (long long)g->ch[l], (long long)g->groups);
  if (!vl_dtype_is_float(g->weights) || !vl_dtype_is_float(g->acts) || !vl_dtype_is_float(g->out))
    return vl_fail(c, VL_ERR_INVALID, "vae: weights %s, activations %s, outputs %s: fp32, "
                   "fp16 or bf16 expected", vl_dtype_name(g->weights), vl_dtype_name(g->acts),
                   vl_dtype_name(g->out));
  if ((unsigned)g->attn >= VL_ATTN_IMPL_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "vae: unknown attention implementation %d", (int)g->attn);
  return VL_OK;
}

/* Conv2d weight (K, C, k, k) and bias (K), PyTorch's default init bound 1/sqrt(C k k). */
static vl_status add_conv(vl_sd_vae *m, const char *name, int64_t K, int64_t C, int64_t k,
                          int *idx) {
  char nm[96];
  float a = 1.0f / sqrtf((float)(C * k * k));
  *idx = m->P.n;
  snprintf(nm, sizeof nm, "%s.weight", name);
  VL_TRY(vl_sd_params_add(m->c, &m->P, nm,
                          &(vl_sd_pinfo){4, {K, C, k, k}, VL_SD_INIT_UNIFORM, a}, m->cfg.weights));
  snprintf(nm, sizeof nm, "%s.bias", name);
  return vl_sd_params_add(m->c, &m->P, nm, &(vl_sd_pinfo){1, {K, 0, 0, 0}, VL_SD_INIT_UNIFORM, a},
                          m->cfg.weights);
}

static vl_status add_linear(vl_sd_vae *m, const char *name, int64_t N, int64_t K, int *idx) {
  char nm[96];
  float a = 1.0f / sqrtf((float)K);
  *idx = m->P.n;
  snprintf(nm, sizeof nm, "%s.weight", name);
  VL_TRY(vl_sd_params_add(m->c, &m->P, nm, &(vl_sd_pinfo){2, {N, K, 0, 0}, VL_SD_INIT_UNIFORM, a},
                          m->cfg.weights));
  snprintf(nm, sizeof nm, "%s.bias", name);
  return vl_sd_params_add(m->c, &m->P, nm, &(vl_sd_pinfo){1, {N, 0, 0, 0}, VL_SD_INIT_UNIFORM, a},
                          m->cfg.weights);
}

/* GroupNorm affine: weight 1, bias 0. */
static vl_status add_norm(vl_sd_vae *m, const char *name, int64_t C, int *idx) {
  char nm[96];
  *idx = m->P.n;
  snprintf(nm, sizeof nm, "%s.weight", name);
  VL_TRY(vl_sd_params_add(m->c, &m->P, nm, &(vl_sd_pinfo){1, {C, 0, 0, 0}, VL_SD_INIT_ONE, 0},
                          m->cfg.weights));
  snprintf(nm, sizeof nm, "%s.bias", name);
  return vl_sd_params_add(m->c, &m->P, nm, &(vl_sd_pinfo){1, {C, 0, 0, 0}, VL_SD_INIT_ZERO, 0},
                          m->cfg.weights);
}

static vl_status add_resnet(vl_sd_vae *m, const char *pre, resnet *r, int64_t cin, int64_t cout) {
  char nm[96];
  *r = (resnet){.cin = cin, .cout = cout, .shortcut = -1};
  snprintf(nm, sizeof nm, "%s.norm1", pre);
  VL_TRY(add_norm(m, nm, cin, &r->norm1));
  snprintf(nm, sizeof nm, "%s.conv1", pre);
  VL_TRY(add_conv(m, nm, cout, cin, 3, &r->conv1));
  snprintf(nm, sizeof nm, "%s.norm2", pre);
  VL_TRY(add_norm(m, nm, cout, &r->norm2));
  snprintf(nm, sizeof nm, "%s.conv2", pre);
  VL_TRY(add_conv(m, nm, cout, cout, 3, &r->conv2));
  if (cin == cout) return VL_OK;
  snprintf(nm, sizeof nm, "%s.conv_shortcut", pre);
  return add_conv(m, nm, cout, cin, 1, &r->shortcut);
}

/* The parameters in state_dict order (named_parameters of encoder, then quant_conv). */
static vl_status build(vl_sd_vae *m) {
  const vl_sd_vae_cfg *g = &m->cfg;
  int lpb = g->layers_per_block;
  m->res = calloc((size_t)(g->n_levels * lpb + 2), sizeof *m->res);
  if (!m->res) return vl_fail(m->c, VL_ERR_OOM, "resnet table");
  VL_TRY(add_conv(m, "encoder.conv_in", g->ch[0], g->in_ch, 3, &m->conv_in));
  char nm[96];
  int64_t cin = g->ch[0];
  for (int l = 0; l < g->n_levels; l++) {
    for (int i = 0; i < lpb; i++) {
      snprintf(nm, sizeof nm, "encoder.down_blocks.%d.resnets.%d", l, i);
      VL_TRY(add_resnet(m, nm, &m->res[l * lpb + i], cin, g->ch[l]));
      cin = g->ch[l];
    }
    m->down[l] = -1;
    if (l < g->n_levels - 1) {
      snprintf(nm, sizeof nm, "encoder.down_blocks.%d.downsamplers.0.conv", l);
      VL_TRY(add_conv(m, nm, cin, cin, 3, &m->down[l]));
    }
  }
  /* mid block: the attention's parameters come before its resnets in state_dict order */
  m->attn_norm = m->to_q = m->to_k = m->to_v = m->to_out = -1;
  if (g->mid_attn) {
    VL_TRY(add_norm(m, "encoder.mid_block.attentions.0.group_norm", cin, &m->attn_norm));
    VL_TRY(add_linear(m, "encoder.mid_block.attentions.0.to_q", cin, cin, &m->to_q));
    VL_TRY(add_linear(m, "encoder.mid_block.attentions.0.to_k", cin, cin, &m->to_k));
    VL_TRY(add_linear(m, "encoder.mid_block.attentions.0.to_v", cin, cin, &m->to_v));
    VL_TRY(add_linear(m, "encoder.mid_block.attentions.0.to_out.0", cin, cin, &m->to_out));
  }
  for (int i = 0; i < 2; i++) {
    snprintf(nm, sizeof nm, "encoder.mid_block.resnets.%d", i);
    VL_TRY(add_resnet(m, nm, &m->res[g->n_levels * lpb + i], cin, cin));
  }
  VL_TRY(add_norm(m, "encoder.conv_norm_out", cin, &m->norm_out));
  VL_TRY(add_conv(m, "encoder.conv_out", 2 * g->latent_ch, cin, 3, &m->conv_out));
  return add_conv(m, "quant_conv", 2 * g->latent_ch, 2 * g->latent_ch, 1, &m->quant_conv);
}

vl_status vl_sd_vae_create(vl_ctx *c, const vl_sd_vae_cfg *cfg, uint64_t seed, vl_sd_vae **out) {
  *out = NULL;
  VL_TRY(validate(c, cfg));
  vl_sd_vae *m = calloc(1, sizeof *m);
  if (!m) return vl_fail(c, VL_ERR_OOM, "vae struct");
  m->c = c;
  m->cfg = *cfg;
  vl_status s = build(m);
  if (s == VL_OK) s = vl_sd_params_init(c, &m->P, seed);
  if (s != VL_OK) {
    vl_sd_vae_destroy(m);
    return s;
  }
  *out = m;
  return VL_OK;
}

/* Frees every tensor a forward made (after an error), newest first. */
static void cleanup(vl_sd_vae *m) {
  vae_slots *S = &m->s;
  vl_tensor *l[] = {&S->mom, &S->o, &S->v, &S->k, &S->q, &S->tok, &S->rstd, &S->mean,
                    &S->pad, &S->b, &S->a, &S->xin, &S->x};
  for (size_t i = 0; i < sizeof l / sizeof *l; i++) vl_tensor_free(m->c, l[i]);
}

void vl_sd_vae_destroy(vl_sd_vae *m) {
  if (!m) return;
  cleanup(m);
  vl_sd_params_free(m->c, &m->P);
  free(m->res);
  free(m);
}

const vl_sd_vae_cfg *vl_sd_vae_config(const vl_sd_vae *m) { return &m->cfg; }
vl_sd_params *vl_sd_vae_params(vl_sd_vae *m) { return &m->P; }
int64_t vl_sd_vae_n_params(const vl_sd_vae *m) { return vl_sd_params_count(&m->P); }
vl_param *vl_sd_vae_param(vl_sd_vae *m, const char *name) {
  int i = vl_sd_params_find(&m->P, name);
  return i < 0 ? NULL : &m->P.p[i];
}

int64_t vl_sd_vae_latent_side(const vl_sd_vae *m, int64_t side) {
  for (int l = 0; l < m->cfg.n_levels - 1; l++) {
    if (side < 2) return 0;
    side = (side + 1 - 3) / 2 + 1; /* pad 1 at the end, 3x3 stride 2, no padding */
  }
  return side;
}

/* ---- layers ---------------------------------------------------------------------------- */

static void move(vl_tensor *dst, vl_tensor *src) {
  *dst = *src;
  memset(src, 0, sizeof *src);
}

static vl_status act4(vl_sd_vae *m, vl_tensor *t, vl_mem_cat cat, int64_t C, int64_t h, int64_t w) {
  int64_t shape[4] = {m->B, C, h, w};
  return vl_tensor_alloc(m->c, t, m->cfg.acts, cat, 4, shape);
}

static const vl_tensor *W(vl_sd_vae *m, int idx) { return &m->P.p[idx].w; }

/* y (B, K, P, Q) = conv(x (B, C, h, w)) + bias, K x C x k x k weights at parameter `pw`
 * (the bias at pw + 1); y is allocated in `cat`. */
static vl_status conv(vl_sd_vae *m, vl_tensor *y, vl_mem_cat cat, const vl_tensor *x, int pw,
                      int64_t C, int64_t h, int64_t w, int64_t K, int64_t k, int stride, int pad) {
  vl_conv cv;
  if (!vl_conv_init(&cv, m->B, C, h, w, K, k, k, stride, pad, 1))
    return vl_fail(m->c, VL_ERR_INVALID, "vae: %s on a %lldx%lld map", m->P.p[pw].name,
                   (long long)h, (long long)w);
  cv.xdt = m->cfg.acts;
  cv.wdt = W(m, pw)->dtype;
  cv.gdt = VL_F32;
  VL_TRY(act4(m, y, cat, K, cv.P, cv.Q));
  VL_TRY(vl_conv_fwd_run(m->c, &(vl_conv_fwd_args){.cv = cv, .y = y, .x = x, .w = W(m, pw)}));
  return vl_bias_fwd_run(m->c, &(vl_bias_fwd_args){.y = y, .b = W(m, pw + 1), .outer = m->B, .C = K,
                                                   .inner = cv.P * cv.Q, .per_outer = false});
}

/* y (B, C, HW) = GroupNorm(x) (-> SiLU in place when silu), affine at parameter pn. */
static vl_status norm(vl_sd_vae *m, vl_tensor *y, const vl_tensor *x, int pn, int64_t C,
                      int64_t h, int64_t w, bool silu) {
  vl_ctx *c = m->c;
  vae_slots *S = &m->s;
  int64_t G = m->cfg.groups, n = m->B * C * h * w, ng = m->B * G;
  VL_TRY(act4(m, y, VL_MEM_TEMP, C, h, w));
  VL_TRY(vl_tensor_alloc(c, &S->mean, VL_F32, VL_MEM_TEMP, 1, &ng));
  VL_TRY(vl_tensor_alloc(c, &S->rstd, VL_F32, VL_MEM_TEMP, 1, &ng));
  VL_TRY(vl_groupnorm_fwd_run(c, &(vl_groupnorm_fwd_args){.y = y, .mean = &S->mean,
                                                         .rstd = &S->rstd, .x = x,
                                                         .gamma = W(m, pn), .beta = W(m, pn + 1),
                                                         .N = m->B, .C = C, .HW = h * w, .G = G,
                                                         .eps = m->cfg.eps}));
  vl_tensor_free(c, &S->rstd);
  vl_tensor_free(c, &S->mean);
  if (silu) VL_TRY(vl_act_fwd_run(c, &(vl_act_fwd_args){.y = y, .x = y, .n = n,
                                                        .act = VL_ACT_SILU}));
  return VL_OK;
}

/* ResnetBlock2D on S->x (B, cin, h, w), replaced by its output (B, cout, h, w):
 * conv2(silu(norm2(conv1(silu(norm1(x)))))) + shortcut(x). */
static vl_status resnet_fwd(vl_sd_vae *m, const resnet *r, int64_t h, int64_t w) {
  vl_ctx *c = m->c;
  vae_slots *S = &m->s;
  int64_t n = m->B * r->cout * h * w;
  VL_TRY(norm(m, &S->a, &S->x, r->norm1, r->cin, h, w, true));              // a (B, cin, h, w)
  VL_TRY(conv(m, &S->b, VL_MEM_TEMP, &S->a, r->conv1, r->cin, h, w, r->cout, 3, 1, 1)); // b (B, cout, h, w)
  vl_tensor_free(c, &S->a);
  VL_TRY(norm(m, &S->a, &S->b, r->norm2, r->cout, h, w, true));             // a (B, cout, h, w)
  vl_tensor_free(c, &S->b);
  VL_TRY(conv(m, &S->b, VL_MEM_TEMP, &S->a, r->conv2, r->cout, h, w, r->cout, 3, 1, 1)); // b (B, cout, h, w)
  vl_tensor_free(c, &S->a);
  if (r->shortcut >= 0) {
    VL_TRY(conv(m, &S->a, VL_MEM_TEMP, &S->x, r->shortcut, r->cin, h, w, r->cout, 1, 1, 0)); // a (B, cout, h, w)
    VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = &S->b, .a = 1.0f, .x = &S->a, .b = 1.0f, .n = n}));
    vl_tensor_free(c, &S->a);
  } else {
    VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = &S->b, .a = 1.0f, .x = &S->x, .b = 1.0f, .n = n}));
  }
  vl_tensor_free(c, &S->x);
  move(&S->x, &S->b);
  return VL_OK;
}

/* Downsample2D on S->x (B, C, h, w) -> (B, C, h2, w2): F.pad (0, 1, 0, 1), 3x3 stride 2. */
static vl_status down_fwd(vl_sd_vae *m, int pw, int64_t C, int64_t h, int64_t w) {
  vl_ctx *c = m->c;
  vae_slots *S = &m->s;
  VL_TRY(act4(m, &S->pad, VL_MEM_TEMP, C, h + 1, w + 1));                   // pad (B, C, h+1, w+1)
  VL_TRY(vl_pad2d_fwd_run(c, &(vl_pad2d_fwd_args){.y = &S->pad, .x = &S->x, .planes = m->B * C,
                                                  .H = h, .W = w, .top = 0, .bottom = 1, .left = 0,
                                                  .right = 1}));
  vl_tensor_free(c, &S->x);
  VL_TRY(conv(m, &S->x, VL_MEM_TEMP, &S->pad, pw, C, h + 1, w + 1, C, 3, 2, 0)); // x (B, C, h2, w2)
  vl_tensor_free(c, &S->pad);
  return VL_OK;
}

/* y (B*T, N) = x (B*T, K) W^T + b, linear at parameter pw (bias pw + 1). */
static vl_status linear(vl_sd_vae *m, vl_tensor *y, const vl_tensor *x, int pw, int64_t R,
                        int64_t K, int64_t N) {
  int64_t shape[3] = {m->B, R / m->B, N};
  VL_TRY(vl_tensor_alloc(m->c, y, m->cfg.acts, VL_MEM_TEMP, 3, shape));
  VL_TRY(vl_linear_fwd(m->c, y, x, W(m, pw), R, K, N, 0.0f));
  return vl_bias_fwd_run(m->c, &(vl_bias_fwd_args){.y = y, .b = W(m, pw + 1), .outer = R, .C = N,
                                                   .inner = 1, .per_outer = false});
}

/* The mid block's attention on S->x (B, C, h, w), in place: x += to_out(attn(q, k, v)) with
 * q, k, v projections of GroupNorm(x) as (B, h*w, C) tokens, one head of C. */
static vl_status attn_fwd(vl_sd_vae *m, int64_t C, int64_t h, int64_t w) {
  vl_ctx *c = m->c;
  vae_slots *S = &m->s;
  int64_t T = h * w, R = m->B * T;
  VL_TRY(norm(m, &S->a, &S->x, m->attn_norm, C, h, w, false));              // a (B, C, T)
  int64_t ts[3] = {m->B, T, C};
  VL_TRY(vl_tensor_alloc(c, &S->tok, m->cfg.acts, VL_MEM_TEMP, 3, ts));     // tok (B, T, C)
  VL_TRY(vl_permute_run(c, &(vl_permute_args){.y = &S->tok, .x = &S->a, .B = m->B, .T = C, .H = T,
                                              .D = 1, .back = false}));
  vl_tensor_free(c, &S->a);
  VL_TRY(linear(m, &S->q, &S->tok, m->to_q, R, C, C));                      // q (B, T, C)
  VL_TRY(linear(m, &S->k, &S->tok, m->to_k, R, C, C));                      // k (B, T, C)
  VL_TRY(linear(m, &S->v, &S->tok, m->to_v, R, C, C));                      // v (B, T, C)
  vl_tensor_free(c, &S->tok);
  VL_TRY(vl_tensor_alloc(c, &S->o, m->cfg.acts, VL_MEM_TEMP, 3, ts));       // o (B, T, C)
  vl_attn_saved saved;
  VL_TRY(vl_attention_fwd(c, m->cfg.attn, &S->o, &S->q, &S->k, &S->v, m->B, 1, T, T, C, false,
                          false, &saved));
  vl_tensor_free(c, &S->v);
  vl_tensor_free(c, &S->k);
  vl_tensor_free(c, &S->q);
  VL_TRY(linear(m, &S->a, &S->o, m->to_out, R, C, C));                      // a (B, T, C)
  vl_tensor_free(c, &S->o);
  VL_TRY(act4(m, &S->b, VL_MEM_TEMP, C, h, w));                             // b (B, C, h, w)
  VL_TRY(vl_permute_run(c, &(vl_permute_args){.y = &S->b, .x = &S->a, .B = m->B, .T = C, .H = T,
                                              .D = 1, .back = true}));
  vl_tensor_free(c, &S->a);
  VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = &S->x, .a = 1.0f, .x = &S->b, .b = 1.0f,
                                          .n = m->B * C * T})); /* residual */
  vl_tensor_free(c, &S->b);
  return VL_OK;
}

/* ---- the encoder ------------------------------------------------------------------------ */

/* Images (B, in_ch, H, W) -> S->mom (B, 2 latent_ch, h, w), allocated in mom_cat. */
static vl_status encoder_fwd(vl_sd_vae *m, const vl_tensor *images, vl_mem_cat mom_cat) {
  vl_ctx *c = m->c;
  const vl_sd_vae_cfg *g = &m->cfg;
  vae_slots *S = &m->s;
  int64_t h = images->shape[2], w = images->shape[3], lpb = g->layers_per_block;
  const vl_tensor *x = images;
  if (images->dtype != g->acts) {
    VL_TRY(act4(m, &S->xin, VL_MEM_TEMP, g->in_ch, h, w));                  // xin (B, in_ch, H, W)
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &S->xin, .x = images, .n = images->n}));
    x = &S->xin;
  }
  VL_TRY(conv(m, &S->x, VL_MEM_TEMP, x, m->conv_in, g->in_ch, h, w, g->ch[0], 3, 1, 1)); // x (B, ch0, H, W)
  vl_tensor_free(c, &S->xin);
  for (int l = 0; l < g->n_levels; l++) {
    for (int i = 0; i < lpb; i++) VL_TRY(resnet_fwd(m, &m->res[l * lpb + i], h, w));
    if (m->down[l] >= 0) {
      VL_TRY(down_fwd(m, m->down[l], g->ch[l], h, w));
      h = S->x.shape[2];
      w = S->x.shape[3];
    }
  }
  int64_t C = g->ch[g->n_levels - 1], L2 = 2 * g->latent_ch;
  VL_TRY(resnet_fwd(m, &m->res[g->n_levels * lpb], h, w));
  if (g->mid_attn) VL_TRY(attn_fwd(m, C, h, w));
  VL_TRY(resnet_fwd(m, &m->res[g->n_levels * lpb + 1], h, w));
  VL_TRY(norm(m, &S->a, &S->x, m->norm_out, C, h, w, true));                // a (B, C, h, w)
  vl_tensor_free(c, &S->x);
  VL_TRY(conv(m, &S->b, VL_MEM_TEMP, &S->a, m->conv_out, C, h, w, L2, 3, 1, 1)); // b (B, 2L, h, w)
  vl_tensor_free(c, &S->a);
  VL_TRY(conv(m, &S->mom, mom_cat, &S->b, m->quant_conv, L2, h, w, L2, 1, 1, 0)); // mom (B, 2L, h, w)
  vl_tensor_free(c, &S->b);
  return VL_OK;
}

static vl_status check_inputs(vl_sd_vae *m, const vl_tensor *images, const vl_tensor *noise,
                              const vl_tensor *z, const vl_tensor *moments) {
  vl_ctx *c = m->c;
  const vl_sd_vae_cfg *g = &m->cfg;
  if (!images || !(z || moments))
    return vl_fail(c, VL_ERR_INVALID, "vae encode: needs images and z or moments");
  if (images->ndim != 4 || images->shape[0] < 1 || images->shape[1] != g->in_ch ||
      !vl_dtype_is_float(images->dtype))
    return vl_fail(c, VL_ERR_INVALID, "vae encode: images must be float (B, %lld, H, W)",
                   (long long)g->in_ch);
  int64_t h = vl_sd_vae_latent_side(m, images->shape[2]), w = vl_sd_vae_latent_side(m, images->shape[3]);
  if (h < 1 || w < 1)
    return vl_fail(c, VL_ERR_INVALID, "vae encode: images of %lldx%lld are too small for %d levels",
                   (long long)images->shape[2], (long long)images->shape[3], g->n_levels);
  if (z) {
    if (!noise || noise->ndim != 4 || noise->shape[0] != images->shape[0] ||
        noise->shape[1] != g->latent_ch || noise->shape[2] != h || noise->shape[3] != w ||
        !vl_dtype_is_float(noise->dtype))
      return vl_fail(c, VL_ERR_INVALID, "vae encode: noise must be float (%lld, %lld, %lld, %lld)",
                     (long long)images->shape[0], (long long)g->latent_ch, (long long)h,
                     (long long)w);
  }
  return VL_OK;
}

vl_status vl_sd_vae_encode(vl_sd_vae *m, const vl_tensor *images, const vl_tensor *noise,
                           vl_tensor *z, vl_tensor *moments, vl_mem_cat out_cat) {
  vl_ctx *c = m->c;
  const vl_sd_vae_cfg *g = &m->cfg;
  VL_TRY(check_inputs(m, images, noise, z, moments));
  if (z) memset(z, 0, sizeof *z);
  if (moments) memset(moments, 0, sizeof *moments);
  m->B = images->shape[0];
  /* the moments go straight to the caller when it wants them in the activation dtype */
  bool direct = moments && g->out == g->acts;
  vl_status s = encoder_fwd(m, images, direct ? out_cat : VL_MEM_TEMP);
  int64_t h = m->s.mom.ndim ? m->s.mom.shape[2] : 0, w = m->s.mom.ndim ? m->s.mom.shape[3] : 0;
  int64_t L = g->latent_ch, zs[4] = {m->B, L, h, w};
  if (s == VL_OK && z) s = vl_tensor_alloc(c, z, g->out, out_cat, 4, zs); // z (B, L, h, w)
  if (s == VL_OK && z)
    s = vl_gauss_sample_run(c, &(vl_gauss_sample_args){.z = z, .moments = &m->s.mom, .noise = noise,
                                                      .N = m->B, .C = L, .HW = h * w,
                                                      .scale = g->scale});
  if (s == VL_OK && moments) {
    if (direct) {
      move(moments, &m->s.mom);
    } else {
      zs[1] = 2 * L;
      s = vl_tensor_alloc(c, moments, g->out, out_cat, 4, zs);              // (B, 2L, h, w)
      if (s == VL_OK) s = vl_convert_run(c, &(vl_convert_args){.y = moments, .x = &m->s.mom,
                                                               .n = m->s.mom.n});
    }
  }
  vl_tensor_free(c, &m->s.mom);
  if (s != VL_OK) {
    cleanup(m);
    if (moments) vl_tensor_free(c, moments);
    if (z) vl_tensor_free(c, z);
  }
  return s;
}

void vl_sd_vae_sample_host(float *z, const float *moments, const float *noise, int64_t C,
                           int64_t HW, float scale, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    vl_k_gauss_sample(z, VL_K_F32, moments, VL_K_F32, noise, VL_K_F32, C, HW, scale, i);
}
