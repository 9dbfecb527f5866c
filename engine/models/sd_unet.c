/* SD U-Net (sd_unet.h): presets, construction (the graph of nodes in forward order and the
 * parameters in state_dict order), the step (which node needs what in backward, tensor
 * lifetimes, the forward and backward walks with checkpoint re-runs) and the public API.
 * The layers themselves are in sd_unet_blocks.c.
 *
 * Tensor lifetimes. A node's output is read in forward by the next node and, for a skip, by
 * one up resnet. It survives into backward only when a reader's backward needs it: a
 * resnet's or the head's GroupNorm input, a transformer's GroupNorm input when the gradient
 * of its input is needed, and every input of a checkpointed block (its re-run). Otherwise it
 * is freed in forward after its last reader. In backward it is freed after the backward of
 * the first (in forward order) reader that needs it. */
#include "sd_unet_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- presets ----------------------------------------------------------------------------- */

int vl_sd_unet_preset(const char *scale, vl_sd_unet_cfg *o) {
  memset(o, 0, sizeof *o);
  *o = (vl_sd_unet_cfg){.in_ch = 4, .out_ch = 4, .n_blocks = 4, .ch = {320, 640, 1280, 1280},
                        .down_attn = {true, true, true, false},
                        .up_attn = {false, true, true, true}, .layers = 2, .heads = 8,
                        .groups = 32, .norm_eps = 1e-5f, .attn_norm_eps = 1e-6f, .ln_eps = 1e-5f,
                        .sample = 64, .ctx_len = 77, .ctx_dim = 768, .weights = VL_F32,
                        .acts = VL_F32, .lora_rank = 4, .lora_alpha = 4.0f,
                        .attn = VL_ATTN_EFFICIENT, .checkpoint = false, .ctx_grad = false};
  if (!strcasecmp(scale, "full")) return 0;
  if (!strcasecmp(scale, "small")) {
    const int64_t ch[4] = {64, 128, 256, 256};
    memcpy(o->ch, ch, sizeof ch);
    o->groups = 16;
    o->sample = 32;
    o->ctx_dim = 256;
    return 0;
  }
  if (!strcasecmp(scale, "tiny")) {
    const int64_t ch[4] = {32, 64, 64, 64};
    memcpy(o->ch, ch, sizeof ch);
    o->groups = 8;
    o->heads = 4;
    o->sample = 16;
    o->ctx_len = 16;
    o->ctx_dim = 32;
    return 0;
  }
  return -1;
}

static vl_status validate(vl_ctx *c, const vl_sd_unet_cfg *g) {
  if (g->n_blocks < 1 || g->n_blocks > VL_SD_UNET_MAX_BLOCKS)
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: %d blocks (1..%d)", g->n_blocks,
                   VL_SD_UNET_MAX_BLOCKS);
  if (g->in_ch < 1 || g->out_ch < 1 || g->layers < 1 || g->heads < 1 || g->groups < 1 ||
      g->sample < 1 || g->ctx_len < 1 || g->ctx_dim < 1)
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: every size must be positive");
  for (int i = 0; i < g->n_blocks; i++) {
    if (g->ch[i] < 1 || g->ch[i] % g->groups || g->ch[i] % g->heads)
      return vl_fail(c, VL_ERR_INVALID,
                     "sd_unet: block %d has %lld channels: not a multiple of %lld groups and "
                     "%lld heads", i, (long long)g->ch[i], (long long)g->groups,
                     (long long)g->heads);
  }
  if (g->sample % (1 << (g->n_blocks - 1)))
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: latent side %lld is not a multiple of %d",
                   (long long)g->sample, 1 << (g->n_blocks - 1));
  if (!vl_dtype_is_float(g->weights) || !vl_dtype_is_float(g->acts))
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: weights %s, activations %s: fp32, fp16 or bf16",
                   vl_dtype_name(g->weights), vl_dtype_name(g->acts));
  if (g->lora_rank < 0) return vl_fail(c, VL_ERR_INVALID, "sd_unet: LoRA rank %d", g->lora_rank);
  if (g->lora_rank > 0 && !(g->lora_alpha > 0))
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: LoRA alpha must be > 0");
  if ((unsigned)g->attn >= VL_ATTN_IMPL_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: unknown attention implementation");
  return VL_OK;
}

/* ---- parameters -------------------------------------------------------------------------- */

static vl_status add_fz(vl_sd_unet *m, const char *name, int ndim, const int64_t *d, vl_sd_init init,
                        float a, int *idx) {
  vl_sd_pinfo in = {.ndim = ndim, .init = init, .a = a};
  for (int i = 0; i < ndim; i++) in.d[i] = d[i];
  *idx = m->fz.n;
  return vl_sd_params_add(m->c, &m->fz, name, &in, m->cfg.weights);
}

/* "<pre>.weight" (K, C, k, k) and "<pre>.bias" (K), PyTorch's default U(-1/sqrt(fan_in), ..) */
static vl_status add_conv(vl_sd_unet *m, const char *pre, int64_t K, int64_t C, int64_t k, int *w,
                          int *b) {
  char nm[128];
  float a = 1.0f / sqrtf((float)(C * k * k));
  snprintf(nm, sizeof nm, "%s.weight", pre);
  VL_TRY(add_fz(m, nm, 4, (int64_t[]){K, C, k, k}, VL_SD_INIT_UNIFORM, a, w));
  snprintf(nm, sizeof nm, "%s.bias", pre);
  return add_fz(m, nm, 1, (int64_t[]){K}, VL_SD_INIT_UNIFORM, a, b);
}

static vl_status add_norm(vl_sd_unet *m, const char *pre, int64_t C, int *w, int *b) {
  char nm[128];
  snprintf(nm, sizeof nm, "%s.weight", pre);
  VL_TRY(add_fz(m, nm, 1, (int64_t[]){C}, VL_SD_INIT_ONE, 0, w));
  snprintf(nm, sizeof nm, "%s.bias", pre);
  return add_fz(m, nm, 1, (int64_t[]){C}, VL_SD_INIT_ZERO, 0, b);
}

static vl_status add_lora_param(vl_sd_unet *m, const char *name, int64_t rows, int64_t cols,
                                vl_sd_init init, float a, int *idx) {
  vl_ctx *c = m->c;
  if (m->n_lora == m->cap_lora) {
    int cap = m->cap_lora ? 2 * m->cap_lora : 64;
    vl_param *np = realloc(m->lora, (size_t)cap * sizeof *np);
    if (!np) return vl_fail(c, VL_ERR_OOM, "LoRA parameter table");
    m->lora = np;
    vl_sd_pinfo *ni = realloc(m->lora_info, (size_t)cap * sizeof *ni);
    if (!ni) return vl_fail(c, VL_ERR_OOM, "LoRA parameter table");
    m->lora_info = ni;
    m->cap_lora = cap;
  }
  *idx = m->n_lora;
  m->lora_info[m->n_lora] = (vl_sd_pinfo){.ndim = 2, .d = {rows, cols}, .init = init, .a = a};
  /* trainable: fp32, or an acts-dtype working copy of an fp32 master (AMP) */
  vl_status s = vl_param_alloc(c, &m->lora[m->n_lora], name, rows, cols, m->cfg.acts, true);
  m->n_lora++; /* counted even on failure: destroy frees what was allocated */
  return s;
}

/* A linear "<pre>" (out, in) with an optional bias, and LoRA factors when `lora`. */
static vl_status add_linear(vl_sd_unet *m, const char *pre, int64_t out, int64_t in, bool has_bias,
                            bool lora, sd_lin *L) {
  char nm[128];
  float a = 1.0f / sqrtf((float)in);
  *L = (sd_lin){.w = -1, .b = -1, .la = -1, .lb = -1, .in = in, .out = out};
  snprintf(nm, sizeof nm, "%s.weight", pre);
  VL_TRY(add_fz(m, nm, 2, (int64_t[]){out, in}, VL_SD_INIT_UNIFORM, a, &L->w));
  if (has_bias) {
    snprintf(nm, sizeof nm, "%s.bias", pre);
    VL_TRY(add_fz(m, nm, 1, (int64_t[]){out}, VL_SD_INIT_UNIFORM, a, &L->b));
  }
  if (!lora || m->cfg.lora_rank == 0) return VL_OK;
  int64_t r = m->cfg.lora_rank;
  snprintf(nm, sizeof nm, "%s.lora_A.weight", pre);
  VL_TRY(add_lora_param(m, nm, r, in, VL_SD_INIT_NORMAL, 1.0f / (float)r, &L->la));
  snprintf(nm, sizeof nm, "%s.lora_B.weight", pre);
  return add_lora_param(m, nm, out, r, VL_SD_INIT_ZERO, 0, &L->lb);
}

static vl_status resnet_params(vl_sd_unet *m, const char *pre, sd_resnet *r) {
  char nm[128];
  int64_t temb = 4 * m->cfg.ch[0];
  snprintf(nm, sizeof nm, "%s.norm1", pre);
  VL_TRY(add_norm(m, nm, r->cin, &r->n1w, &r->n1b));
  snprintf(nm, sizeof nm, "%s.conv1", pre);
  VL_TRY(add_conv(m, nm, r->cout, r->cin, 3, &r->c1w, &r->c1b));
  snprintf(nm, sizeof nm, "%s.time_emb_proj", pre);
  sd_lin tl;
  VL_TRY(add_linear(m, nm, r->cout, temb, true, false, &tl));
  r->tw = tl.w;
  r->tb = tl.b;
  snprintf(nm, sizeof nm, "%s.norm2", pre);
  VL_TRY(add_norm(m, nm, r->cout, &r->n2w, &r->n2b));
  snprintf(nm, sizeof nm, "%s.conv2", pre);
  VL_TRY(add_conv(m, nm, r->cout, r->cout, 3, &r->c2w, &r->c2b));
  r->scw = r->scb = -1;
  if (r->cin != r->cout) {
    snprintf(nm, sizeof nm, "%s.conv_shortcut", pre);
    VL_TRY(add_conv(m, nm, r->cout, r->cin, 1, &r->scw, &r->scb));
  }
  return VL_OK;
}

static vl_status xformer_params(vl_sd_unet *m, const char *pre, sd_xformer *X) {
  char nm[160];
  int64_t C = X->C, D = m->cfg.ctx_dim;
  static const char *const lin[4] = {"to_q", "to_k", "to_v", "to_out.0"};
  snprintf(nm, sizeof nm, "%s.norm", pre);
  VL_TRY(add_norm(m, nm, C, &X->gnw, &X->gnb));
  snprintf(nm, sizeof nm, "%s.proj_in", pre);
  VL_TRY(add_conv(m, nm, C, C, 1, &X->piw, &X->pib));
  for (int a = 0; a < 3; a++) {
    snprintf(nm, sizeof nm, "%s.transformer_blocks.0.norm%d", pre, a + 1);
    VL_TRY(add_norm(m, nm, C, &X->lnw[a], &X->lnb[a]));
    if (a == 2) break;
    for (int i = 0; i < 4; i++) {
      snprintf(nm, sizeof nm, "%s.transformer_blocks.0.attn%d.%s", pre, a + 1, lin[i]);
      int64_t in = (a == 1 && (i == 1 || i == 2)) ? D : C;
      VL_TRY(add_linear(m, nm, C, in, i == 3, true, &X->at[a][i]));
    }
  }
  snprintf(nm, sizeof nm, "%s.transformer_blocks.0.ff.net.0.proj", pre);
  VL_TRY(add_linear(m, nm, 8 * C, C, true, false, &X->ff1));
  snprintf(nm, sizeof nm, "%s.transformer_blocks.0.ff.net.2", pre);
  VL_TRY(add_linear(m, nm, C, 4 * C, true, false, &X->ff2));
  snprintf(nm, sizeof nm, "%s.proj_out", pre);
  return add_conv(m, nm, C, C, 1, &X->pow, &X->pob);
}

/* ---- the graph ------------------------------------------------------------------------------ */

/* Which nodes the diffusers modules are, for naming their parameters in state_dict order
 * (node indices, -1 when absent). */
#define SD_MAX_LAYERS 8
typedef struct {
  int res[VL_SD_UNET_MAX_BLOCKS][SD_MAX_LAYERS + 1], xf[VL_SD_UNET_MAX_BLOCKS][SD_MAX_LAYERS + 1];
  int sampler[VL_SD_UNET_MAX_BLOCKS]; /* the down/up sampler */
} sd_layout;

typedef struct {
  sd_layout down, up;
  int mid_res[2], mid_xf;
  int conv_in, out;
} sd_graph;

static int add_node(vl_sd_unet *m, sd_kind kind, int in, int skip, int64_t C, int64_t cin, int lvl,
                    int lvl_in) {
  sd_node *nd = &m->nodes[m->n_nodes];
  memset(nd, 0, sizeof *nd);
  *nd = (sd_node){.kind = kind, .ix = -1, .w = -1, .b = -1, .gw = -1, .gb = -1, .in = in,
                  .skip = skip, .C = C, .cin = cin, .lvl = lvl, .lvl_in = lvl_in,
                  .bwd_free = -1, .fwd_last = -1};
  return m->n_nodes++;
}

static int add_resnet(vl_sd_unet *m, int in, int skip, int64_t cin, int64_t cskip, int64_t cout,
                      int lvl) {
  int k = add_node(m, SD_RESNET, in, skip, cout, cin, lvl, lvl);
  m->nodes[k].ix = m->n_res;
  m->res[m->n_res++] = (sd_resnet){.cin = cin + cskip, .cout = cout};
  return k;
}

static int add_xformer(vl_sd_unet *m, int in, int64_t C, int lvl) {
  int k = add_node(m, SD_XFORMER, in, -1, C, C, lvl, lvl);
  m->nodes[k].ix = m->n_xf;
  m->xf[m->n_xf++] = (sd_xformer){.C = C};
  return k;
}

static vl_status build_graph(vl_sd_unet *m, sd_graph *gr) {
  const vl_sd_unet_cfg *g = &m->cfg;
  int nb = g->n_blocks, L = g->layers;
  int max_nodes = 2 + nb * (2 * L + 1) + 3 + nb * (2 * (L + 1) + 1);
  m->nodes = calloc((size_t)max_nodes, sizeof *m->nodes);
  m->res = calloc((size_t)(nb * (2 * L + 1) + 2), sizeof *m->res);
  m->xf = calloc((size_t)(nb * (2 * L + 1) + 1), sizeof *m->xf);
  if (!m->nodes || !m->res || !m->xf) return vl_fail(m->c, VL_ERR_OOM, "sd_unet graph");
  memset(gr, -1, sizeof *gr);
  int stack[64], sp = 0, lvl = 0;
  int64_t C = g->ch[0];
  int prev = gr->conv_in = add_node(m, SD_CONV_IN, -1, -1, C, g->in_ch, 0, 0);
  stack[sp++] = prev;
  for (int i = 0; i < nb; i++) {
    for (int j = 0; j < L; j++) {
      prev = gr->down.res[i][j] = add_resnet(m, prev, -1, C, 0, g->ch[i], lvl);
      C = g->ch[i];
      if (g->down_attn[i]) prev = gr->down.xf[i][j] = add_xformer(m, prev, C, lvl);
      stack[sp++] = prev;
    }
    if (i < nb - 1) {
      prev = gr->down.sampler[i] = add_node(m, SD_DOWN, prev, -1, C, C, lvl + 1, lvl);
      lvl++;
      stack[sp++] = prev;
    }
  }
  prev = gr->mid_res[0] = add_resnet(m, prev, -1, C, 0, C, lvl);
  prev = gr->mid_xf = add_xformer(m, prev, C, lvl);
  prev = gr->mid_res[1] = add_resnet(m, prev, -1, C, 0, C, lvl);
  for (int i = 0; i < nb; i++) {
    int64_t out = g->ch[nb - 1 - i];
    for (int j = 0; j <= L; j++) {
      int skip = stack[--sp];
      prev = gr->up.res[i][j] = add_resnet(m, prev, skip, C, m->nodes[skip].C, out, lvl);
      C = out;
      if (g->up_attn[i]) prev = gr->up.xf[i][j] = add_xformer(m, prev, C, lvl);
    }
    if (i < nb - 1) {
      prev = gr->up.sampler[i] = add_node(m, SD_UP, prev, -1, C, C, lvl - 1, lvl);
      lvl--;
    }
  }
  gr->out = add_node(m, SD_OUT, prev, -1, g->out_ch, C, 0, 0);
  if (sp != 0 || lvl != 0 || m->n_nodes > max_nodes)
    return vl_fail(m->c, VL_ERR_INVALID, "sd_unet: skip stack left %d entries", sp);
  return VL_OK;
}

/* The parameters in state_dict order: conv_in, time_embedding, down_blocks (attentions,
 * resnets, downsamplers), up_blocks (the same), mid_block, conv_norm_out, conv_out. */
static vl_status build_params(vl_sd_unet *m, const sd_graph *gr) {
  const vl_sd_unet_cfg *g = &m->cfg;
  char nm[128];
  int nb = g->n_blocks;
  sd_node *ci = &m->nodes[gr->conv_in];
  VL_TRY(add_conv(m, "conv_in", ci->C, ci->cin, 3, &ci->w, &ci->b));
  sd_lin l1, l2;
  VL_TRY(add_linear(m, "time_embedding.linear_1", 4 * g->ch[0], g->ch[0], true, false, &l1));
  VL_TRY(add_linear(m, "time_embedding.linear_2", 4 * g->ch[0], 4 * g->ch[0], true, false, &l2));
  m->t1w = l1.w, m->t1b = l1.b, m->t2w = l2.w, m->t2b = l2.b;
  for (int side = 0; side < 2; side++) {
    const sd_layout *lay = side ? &gr->up : &gr->down;
    const char *blk = side ? "up_blocks" : "down_blocks";
    int nl = side ? g->layers + 1 : g->layers;
    for (int i = 0; i < nb; i++) {
      for (int j = 0; j < nl; j++) {
        if (lay->xf[i][j] < 0) continue;
        snprintf(nm, sizeof nm, "%s.%d.attentions.%d", blk, i, j);
        VL_TRY(xformer_params(m, nm, &m->xf[m->nodes[lay->xf[i][j]].ix]));
      }
      for (int j = 0; j < nl; j++) {
        snprintf(nm, sizeof nm, "%s.%d.resnets.%d", blk, i, j);
        VL_TRY(resnet_params(m, nm, &m->res[m->nodes[lay->res[i][j]].ix]));
      }
      if (lay->sampler[i] >= 0) {
        sd_node *s = &m->nodes[lay->sampler[i]];
        snprintf(nm, sizeof nm, "%s.%d.%s.0.conv", blk, i, side ? "upsamplers" : "downsamplers");
        VL_TRY(add_conv(m, nm, s->C, s->cin, 3, &s->w, &s->b));
      }
    }
  }
  VL_TRY(xformer_params(m, "mid_block.attentions.0", &m->xf[m->nodes[gr->mid_xf].ix]));
  for (int j = 0; j < 2; j++) {
    snprintf(nm, sizeof nm, "mid_block.resnets.%d", j);
    VL_TRY(resnet_params(m, nm, &m->res[m->nodes[gr->mid_res[j]].ix]));
  }
  sd_node *o = &m->nodes[gr->out];
  VL_TRY(add_norm(m, "conv_norm_out", o->cin, &o->gw, &o->gb));
  return add_conv(m, "conv_out", o->C, o->cin, 3, &o->w, &o->b);
}

/* Seeded values (nothing on a plan context): frozen as PyTorch initialises a fresh model,
 * LoRA as peft's "gaussian" init (A ~ N(0, 1/r^2), B = 0). */
static vl_status init_lora(vl_sd_unet *m, uint64_t seed) {
  vl_ctx *c = m->c;
  if (c->plan || m->n_lora == 0) return VL_OK;
  int64_t maxn = 0;
  for (int i = 0; i < m->n_lora; i++)
    if (m->lora[i].rows * m->lora[i].cols > maxn) maxn = m->lora[i].rows * m->lora[i].cols;
  float *h = malloc((size_t)maxn * sizeof *h);
  if (!h) return vl_fail(c, VL_ERR_OOM, "host init buffer");
  vl_rng rng;
  vl_rng_seed(&rng, seed);
  vl_status s = VL_OK;
  for (int i = 0; i < m->n_lora && s == VL_OK; i++) {
    const vl_sd_pinfo *in = &m->lora_info[i];
    int64_t n = m->lora[i].rows * m->lora[i].cols;
    if (in->init == VL_SD_INIT_NORMAL) vl_rng_normal_fill(&rng, h, n, in->a);
    else memset(h, 0, (size_t)n * sizeof *h);
    s = vl_param_load(c, &m->lora[i], h);
  }
  free(h);
  return s;
}

vl_status vl_sd_unet_create(vl_ctx *c, const vl_sd_unet_cfg *cfg, uint64_t seed,
                            vl_sd_unet **out) {
  *out = NULL;
  VL_TRY(validate(c, cfg));
  if (cfg->layers > SD_MAX_LAYERS)
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: %d layers per block (at most %d)", cfg->layers,
                   SD_MAX_LAYERS);
  vl_sd_unet *m = calloc(1, sizeof *m);
  if (!m) return vl_fail(c, VL_ERR_OOM, "sd_unet struct");
  m->c = c;
  m->cfg = *cfg;
  sd_graph *gr = malloc(sizeof *gr);
  vl_status s = gr ? build_graph(m, gr) : vl_fail(c, VL_ERR_OOM, "sd_unet graph");
  if (s == VL_OK) s = build_params(m, gr);
  free(gr);
  if (s == VL_OK) s = vl_sd_params_init(c, &m->fz, seed);
  if (s == VL_OK) s = init_lora(m, vl_mix64(seed ^ 0x10a));
  if (s != VL_OK) {
    vl_sd_unet_destroy(m);
    return s;
  }
  *out = m;
  return VL_OK;
}

/* ---- the step ------------------------------------------------------------------------------- */

/* Everything a step holds, freed (a failed step, a forward without backward). */
static void cleanup(vl_sd_unet *m) {
  for (int k = m->n_nodes - 1; k >= 0; k--) {
    sd_node *nd = &m->nodes[k];
    vl_tensor *list[] = {&nd->dskip, &nd->nr, &nd->nm, &nd->n, &nd->out};
    for (size_t i = 0; i < sizeof list / sizeof *list; i++) sd_free(m, list[i]);
  }
  for (int i = m->n_xf - 1; i >= 0; i--) sd_xformer_clear(m, &m->xf[i]);
  for (int i = m->n_res - 1; i >= 0; i--) sd_resnet_clear(m, &m->res[i]);
  sd_free(m, &m->lt);
  for (int i = 5; i >= 0; i--) sd_free(m, &m->tmp[i]);
  vl_tensor *list[] = {&m->g, &m->ctxc, &m->temb, &m->xin};
  for (size_t i = 0; i < sizeof list / sizeof *list; i++) sd_free(m, list[i]);
  m->ctx = NULL;
  m->in_step = false;
}

void vl_sd_unet_release(vl_sd_unet *m) {
  cleanup(m);
  sd_free(m, &m->dctx);
}

/* Node sizes for latents of h x w. */
static void set_sizes(vl_sd_unet *m, int64_t h, int64_t w) {
  for (int k = 0; k < m->n_nodes; k++) {
    sd_node *nd = &m->nodes[k];
    nd->H = h >> nd->lvl, nd->W = w >> nd->lvl;
    nd->hin = h >> nd->lvl_in, nd->win = w >> nd->lvl_in;
  }
}

/* Does node k's backward read its main input (skip: its skip input)? */
static bool reads_in_bwd(const sd_node *nd, bool skip) {
  switch (nd->kind) {
    case SD_RESNET: return skip ? nd->ck : (nd->skip < 0 ? nd->bwd : nd->ck);
    case SD_XFORMER: return !skip && (nd->ck || (nd->keep && nd->gin));
    case SD_OUT: return !skip && nd->keep && nd->gin;
    default: return false;
  }
}

/* Which node needs which gradient, what forward keeps, and when each output is freed. */
static void plan_step(vl_sd_unet *m, bool train) {
  const vl_sd_unet_cfg *g = &m->cfg;
  bool any = false, s1 = g->lora_rank > 0, s2 = s1 || g->ctx_grad;
  for (int k = 0; k < m->n_nodes; k++) {
    sd_node *nd = &m->nodes[k];
    nd->sink = nd->kind == SD_XFORMER && s2;
    nd->gin = train && any;
    any |= nd->sink;
    nd->bwd = train && any;
    nd->ck = g->checkpoint && nd->bwd && (nd->kind == SD_RESNET || nd->kind == SD_XFORMER);
    nd->keep = nd->bwd && !nd->ck;
    nd->fwd_last = nd->bwd_free = -1;
    if (nd->kind == SD_XFORMER) {
      sd_xformer *X = &m->xf[nd->ix];
      X->need_dh[0] = nd->gin;
      X->need_dh[1] = nd->gin || (train && s1);
      X->need_dh[2] = nd->bwd;
      X->bwd_sub[0] = X->need_dh[0] || (train && s1);
      X->bwd_sub[1] = X->need_dh[1] || (train && s2);
      X->bwd_sub[2] = X->need_dh[2];
    }
  }
  for (int k = 0; k < m->n_nodes; k++) {
    const sd_node *nd = &m->nodes[k];
    int src[2] = {nd->in, nd->skip};
    for (int i = 0; i < 2; i++) {
      if (src[i] < 0) continue;
      sd_node *p = &m->nodes[src[i]];
      if (k > p->fwd_last) p->fwd_last = k;
      if (reads_in_bwd(nd, i == 1) && (p->bwd_free < 0 || k < p->bwd_free)) p->bwd_free = k;
    }
  }
}

static vl_status node_fwd(vl_sd_unet *m, int k, const vl_tensor *latents, int mode,
                          vl_tensor *pred) {
  sd_node *nd = &m->nodes[k];
  const vl_tensor *in = nd->in >= 0 ? &m->nodes[nd->in].out : latents;
  switch (nd->kind) {
    case SD_CONV_IN: return sd_conv_in_fwd(m, nd, in);
    case SD_RESNET:
      return sd_resnet_fwd(m, nd, in, nd->skip >= 0 ? &m->nodes[nd->skip].out : NULL, mode);
    case SD_XFORMER: return sd_xformer_fwd(m, nd, in, mode);
    case SD_DOWN: return sd_down_fwd(m, nd, in);
    case SD_UP: return sd_up_fwd(m, nd, in);
    case SD_OUT: return sd_out_fwd(m, nd, in, pred);
  }
  return VL_ERR_INVALID;
}

/* Is the context read by backward (LoRA k/v inputs, checkpoint re-runs)? */
static bool ctx_in_bwd(const vl_sd_unet *m) {
  return m->train && m->n_xf > 0 && (m->cfg.lora_rank > 0 || m->cfg.checkpoint) &&
         (m->cfg.lora_rank > 0 || m->cfg.ctx_grad);
}

/* Is the time embedding read by backward (resnet re-runs)? */
static bool temb_in_bwd(const vl_sd_unet *m) {
  for (int k = 0; k < m->n_nodes; k++)
    if (m->nodes[k].ck && m->nodes[k].kind == SD_RESNET) return true;
  return false;
}

static vl_status forward(vl_sd_unet *m, const vl_tensor *x, const vl_tensor *t,
                         const vl_tensor *ctx, vl_tensor *pred) {
  vl_ctx *c = m->c;
  const vl_sd_unet_cfg *g = &m->cfg;
  m->ctxv = *ctx; /* a view: the caller's tensor, read in backward too */
  m->ctxv.owned = false;
  m->ctx = &m->ctxv;
  if (ctx->dtype != g->acts) { /* the context in the acts dtype, kept when backward reads it */
    VL_TRY(sd_act(m, &m->ctxc, ctx_in_bwd(m) ? VL_MEM_ACTS : VL_MEM_TEMP, m->B, m->L, g->ctx_dim));
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &m->ctxc, .x = ctx, .n = m->ctxc.n}));
    m->ctx = &m->ctxc;
  }
  bool temb_keep = temb_in_bwd(m);
  VL_TRY(sd_time_embed(m, t, temb_keep ? VL_MEM_ACTS : VL_MEM_TEMP));
  const vl_tensor *lat = x;
  if (x->dtype != g->acts) {
    int64_t shape[4] = {x->shape[0], x->shape[1], x->shape[2], x->shape[3]};
    VL_TRY(vl_tensor_alloc(c, &m->xin, g->acts, VL_MEM_TEMP, 4, shape));
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &m->xin, .x = x, .n = x->n}));
    lat = &m->xin;
  }
  for (int k = 0; k < m->n_nodes; k++) {
    sd_node *nd = &m->nodes[k];
    VL_TRY(node_fwd(m, k, lat, nd->keep ? SD_KEEP : 0, pred));
    if (k == 0) sd_free(m, &m->xin);
    int src[2] = {nd->in, nd->skip};
    for (int i = 0; i < 2; i++) {
      if (src[i] < 0) continue;
      sd_node *p = &m->nodes[src[i]];
      if (p->fwd_last == k && p->bwd_free < 0) sd_free(m, &p->out);
    }
  }
  if (!temb_keep) sd_free(m, &m->temb);
  if (!ctx_in_bwd(m)) sd_free(m, &m->ctxc);
  return VL_OK;
}

static vl_status backward(vl_sd_unet *m, const vl_tensor *dpred) {
  vl_ctx *c = m->c;
  const vl_sd_unet_cfg *g = &m->cfg;
  if (g->ctx_grad) {
    int64_t shape[3] = {m->B, m->L, g->ctx_dim};
    VL_TRY(vl_tensor_alloc(c, &m->dctx, VL_F32, VL_MEM_TEMP, 3, shape));
    VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &m->dctx}));
  }
  for (int k = m->n_nodes - 1; k >= 0; k--) {
    sd_node *nd = &m->nodes[k];
    if (!nd->bwd) break; /* every earlier node needs no gradient either */
    if (nd->dskip.owned) { /* the output's gradient through its skip connection */
      VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = &m->g, .a = 1.0f, .x = &nd->dskip, .b = 1.0f,
                                              .n = nd->dskip.n}));
      sd_free(m, &nd->dskip);
    }
    const vl_tensor *in = nd->in >= 0 ? &m->nodes[nd->in].out : NULL;
    if (nd->ck) { /* re-run the block from its saved inputs; its FLOPs are recompute */
      c->recomputing++;
      vl_status s = node_fwd(m, k, NULL, SD_KEEP | SD_RERUN, NULL);
      c->recomputing--;
      VL_TRY(s);
    }
    switch (nd->kind) {
      case SD_OUT: VL_TRY(sd_out_bwd(m, nd, in, dpred)); break;
      case SD_RESNET:
        VL_TRY(sd_resnet_bwd(m, nd, in, nd->skip >= 0 ? &m->nodes[nd->skip] : NULL));
        break;
      case SD_XFORMER: VL_TRY(sd_xformer_bwd(m, nd, in)); break;
      case SD_DOWN: VL_TRY(sd_down_bwd(m, nd)); break;
      case SD_UP: VL_TRY(sd_up_bwd(m, nd)); break;
      case SD_CONV_IN: return vl_fail(c, VL_ERR_INVALID, "sd_unet: conv_in has no backward");
    }
    int src[2] = {nd->in, nd->skip};
    for (int i = 0; i < 2; i++)
      if (src[i] >= 0 && m->nodes[src[i]].bwd_free == k) sd_free(m, &m->nodes[src[i]].out);
  }
  return VL_OK;
}

static bool shape_is(const vl_tensor *t, int ndim, const int64_t *d) {
  if (!t || t->ndim != ndim) return false;
  for (int i = 0; i < ndim; i++)
    if (t->shape[i] != d[i]) return false;
  return true;
}

vl_status vl_sd_unet_forward(vl_sd_unet *m, const vl_tensor *x, const vl_tensor *t,
                             const vl_tensor *ctx, bool train, vl_tensor *pred) {
  vl_ctx *c = m->c;
  const vl_sd_unet_cfg *g = &m->cfg;
  memset(pred, 0, sizeof *pred);
  vl_sd_unet_release(m);
  if (!x || !t || !ctx || x->ndim != 4 || x->shape[1] != g->in_ch)
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: latents must be (B, %lld, h, w)", (long long)g->in_ch);
  int64_t B = x->shape[0], h = x->shape[2], w = x->shape[3], f = (int64_t)1 << (g->n_blocks - 1);
  if (B < 1 || h < f || w < f || h % f || w % f)
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: latents %lldx%lld: sides must be multiples of %lld",
                   (long long)h, (long long)w, (long long)f);
  if (t->dtype != VL_I32 || t->n != B)
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: timesteps must be (%lld) int32", (long long)B);
  if (ctx->ndim != 3 || ctx->shape[0] != B || ctx->shape[1] < 1 || ctx->shape[2] != g->ctx_dim)
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: context must be (%lld, L, %lld)", (long long)B,
                   (long long)g->ctx_dim);
  if (!vl_dtype_is_float(x->dtype) || !vl_dtype_is_float(ctx->dtype))
    return vl_fail(c, VL_ERR_INVALID, "sd_unet: latents and context must be fp32, fp16 or bf16");
  m->B = B;
  m->L = ctx->shape[1];
  m->train = train;
  set_sizes(m, h, w);
  plan_step(m, train);
  vl_status s = forward(m, x, t, ctx, pred);
  if (s != VL_OK) {
    vl_tensor_free(c, pred);
    cleanup(m);
    return s;
  }
  m->in_step = train;
  return VL_OK;
}

vl_status vl_sd_unet_backward(vl_sd_unet *m, const vl_tensor *dpred) {
  vl_ctx *c = m->c;
  if (!m->in_step) return vl_fail(c, VL_ERR_INVALID, "sd_unet: backward without a training forward");
  const sd_node *o = &m->nodes[m->n_nodes - 1];
  int64_t d[4] = {m->B, o->C, o->H, o->W};
  vl_status s = VL_OK;
  if (!dpred || !shape_is(dpred, 4, d) || !vl_dtype_is_float(dpred->dtype))
    s = vl_fail(c, VL_ERR_INVALID, "sd_unet: dpred must be (%lld, %lld, %lld, %lld)",
                (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3]);
  if (s == VL_OK) s = backward(m, dpred);
  if (s != VL_OK) sd_free(m, &m->dctx);
  cleanup(m);
  return s;
}

const vl_tensor *vl_sd_unet_dctx(const vl_sd_unet *m) { return m->dctx.owned ? &m->dctx : NULL; }

/* ---- the rest of the API ------------------------------------------------------------------- */

void vl_sd_unet_destroy(vl_sd_unet *m) {
  if (!m) return;
  vl_ctx *c = m->c;
  if (m->nodes && m->res && m->xf) vl_sd_unet_release(m);
  for (int i = m->n_lora - 1; i >= 0; i--) vl_param_free(c, &m->lora[i]);
  vl_sd_params_free(c, &m->fz);
  free(m->lora);
  free(m->lora_info);
  free(m->nodes);
  free(m->res);
  free(m->xf);
  free(m);
}

const vl_sd_unet_cfg *vl_sd_unet_config(const vl_sd_unet *m) { return &m->cfg; }
vl_ctx *vl_sd_unet_ctx(const vl_sd_unet *m) { return m->c; }
int vl_sd_unet_n_params(const vl_sd_unet *m) { return m->fz.n + m->n_lora; }

vl_param *vl_sd_unet_param_at(vl_sd_unet *m, int i) {
  if (i < 0 || i >= m->fz.n + m->n_lora) return NULL;
  return i < m->fz.n ? &m->fz.p[i] : &m->lora[i - m->fz.n];
}

int vl_sd_unet_param_shape(const vl_sd_unet *m, int i, int64_t shape[VL_MAX_DIMS]) {
  if (i < 0 || i >= m->fz.n + m->n_lora) return 0;
  const vl_sd_pinfo *in = i < m->fz.n ? &m->fz.info[i] : &m->lora_info[i - m->fz.n];
  for (int k = 0; k < in->ndim; k++) shape[k] = in->d[k];
  return in->ndim;
}

vl_param *vl_sd_unet_param(vl_sd_unet *m, const char *name) {
  int i = vl_sd_params_find(&m->fz, name);
  if (i >= 0) return &m->fz.p[i];
  for (int k = 0; k < m->n_lora; k++)
    if (!strcmp(m->lora[k].name, name)) return &m->lora[k];
  return NULL;
}

vl_param *vl_sd_unet_trainable(vl_sd_unet *m, int *n) {
  *n = m->n_lora;
  return m->lora;
}

void vl_sd_unet_counts(const vl_sd_unet *m, vl_param_counts *out) {
  static const char *const mod[] = {"conv_in", "time_embedding", "down_blocks", "mid_block",
                                    "up_blocks", "conv_out"};
  memset(out, 0, sizeof *out);
  out->n_modules = 6;
  for (int i = 0; i < 6; i++) out->module_name[i] = mod[i];
  for (int i = 0; i < m->fz.n; i++) {
    const vl_param *p = &m->fz.p[i];
    int64_t n = p->rows * p->cols;
    out->total += n;
    int k = 5; /* conv_norm_out, conv_out */
    for (int j = 0; j < 5; j++)
      if (!strncmp(p->name, mod[j], strlen(mod[j])) && p->name[strlen(mod[j])] == '.') k = j;
    out->module_count[k] += n;
  }
  for (int i = 0; i < m->n_lora; i++) {
    int64_t n = m->lora[i].rows * m->lora[i].cols;
    out->total += n;
    out->trainable += n;
  }
}

vl_status vl_sd_unet_alloc_optim(vl_sd_unet *m, const vl_optim_cfg *oc) {
  for (int i = 0; i < m->n_lora; i++) VL_TRY(vl_param_alloc_optim(m->c, &m->lora[i], oc));
  return VL_OK;
}

vl_status vl_sd_unet_apply(vl_sd_unet *m, const vl_optim_cfg *oc, float clip, vl_scaler *s,
                           bool *skipped, double *grad_norm) {
  return vl_params_apply(m->c, m->lora, m->n_lora, oc, clip, s, skipped, grad_norm);
}

vl_status vl_sd_unet_zero_grads(vl_sd_unet *m) {
  return vl_params_zero_grads(m->c, m->lora, m->n_lora);
}
