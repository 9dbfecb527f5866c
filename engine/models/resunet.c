/* ResNet-101 U-Net training step (see resunet.h). Activations are NCHW in the compute
 * dtype; conv weights are trainable vl_params (fp32, or fp16/bf16 working copies of fp32
 * masters under AMP); BN gamma/beta fp32; gradients fp32.
 *
 * The building block is a "unit": conv -> BN (-> ReLU). What a unit keeps for backward is
 * what PyTorch's autograd keeps: the conv output (BN's input), the per-channel mean and
 * 1/std, and the unit output (the ReLU's output, which is also the next conv's input).
 * With in-place ReLU the BN writes the output buffer and the ReLU overwrites it; without,
 * the BN output is a temporary the ReLU reads into a new buffer.
 *
 * Every tensor a step allocates lives in a slot of this struct, so a failed step (OOM)
 * frees all of them (cleanup) and the model stays usable. */
#include "vramlab/resunet.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Shapes: B the micro-batch in flight (m->B); a unit's output side is P = Q =
 * unit_hout(u); activations in the compute dtype unless marked fp32. */
typedef struct {
  int pw, pg, pb;          /* conv weight, BN gamma, BN beta (param indices) */
  int64_t cin, cout, k;    /* kernel k x k */
  int stride, pad;
  int64_t hin;             /* input side */
  bool relu;
  vl_tensor rmean, rvar;   // (cout) fp32 BN running statistics: model state, not a step's
  vl_tensor conv;          // (B, cout, P, P) conv output: BN's input, kept for backward
  vl_tensor mean, rstd;    // (cout) fp32 batch mean and 1/std, kept for backward
  vl_tensor o;             // (B, cout, P, P) unit output (after the ReLU when relu)
} unit;

typedef struct {
  unit u[4];               /* conv1 1x1, conv2 3x3 (stride), conv3 1x1, downsample */
  bool ds;
  vl_tensor out;           // (B, u[2].cout, P, P) relu(conv3 branch + identity), P of u[1]
} block;

typedef struct {
  unit u[2];
  int64_t cin, cskip, hin; /* input channels/side; cskip 0: no skip */
  vl_tensor up;            // (B, cin, 2 hin, 2 hin) upsampled input (only with a skip)
  vl_tensor cat;           // (B, cin + cskip, 2 hin, 2 hin) [up, skip]: u[0]'s input
} dblock;

struct vl_resunet {
  vl_ctx *c;
  vl_resunet_cfg mc;
  vl_resunet_train_cfg tc;
  vl_param *params;
  int n_params, cap_params;
  int p_dec0, p_head;      /* first decoder param, the head conv */
  unit stem;
  block *blocks;           /* all stages, stage by stage */
  int n_blocks, stage0[5]; /* stage s holds blocks [stage0[s], stage0[s+1]) */
  dblock dec[5];
  /* The step's own tensors; H = W = mc.image, K = mc.classes. */
  vl_tensor data;          // (B*3*H*W [+ B*H*W]) fp32 block in category data: the micro-batch
  vl_tensor img;           // (B, 3, H, W) fp32 view of data: normalised images
  vl_tensor tgt;           // (B, H, W) int32 view of data: class ids, -1 ignored (training)
  vl_tensor xin;           // (B, 3, H, W) AMP's half copy of img (conv1's input), else empty
  vl_tensor pool;          // (B, width, H/4, W/4) max pool of the stem: block 0's input
  vl_tensor logits;        // (B, K, H, W) head output; dlogits in place after the loss
  vl_tensor loss;          // (B*H*W) fp32 per-pixel cross-entropy
  vl_tensor dskip[4];      // skip gradients, w = mc.width: [0] the stem's (B, w, H/2, W/2);
                           // [s] layer s's output (B, 2^(s+1) w, H/2^(s+1), W/2^(s+1))
  vl_tensor gcur;          // the gradient flowing back: the shape of the activation it is
                           // the gradient of, (B, dec[4], H, W) after the head
  vl_tensor tmp[4];        // short-lived gradients in flight (the shapes of their
                           // activations); tmp[3]: unit_fwd's BN output without in-place ReLU
  bool *grad_live;         /* per param: holds this step's gradient already */
  vl_tensor **bufs;        /* train_state's buffers: each unit's running mean, var (made on
                              first use) */
  int n_bufs;
  vl_scaler sc;
  int64_t B;               /* batch of the micro-batch in flight */
};

enum { KEEP = 1, TRAIN = 2, STATS = 4 }; /* forward modes */

/* ---- presets ------------------------------------------------------------------------ */

int vl_resunet_preset(const char *scale, vl_resunet_cfg *o) {
  memset(o, 0, sizeof *o);
  *o = (vl_resunet_cfg){.image = 512, .in_ch = 3, .width = 64, .blocks = {3, 4, 23, 3},
                        .dec = {256, 128, 64, 32, 16}, .classes = 5, .bn_eps = 1e-5f,
                        .bn_momentum = 0.1f};
  if (!strcasecmp(scale, "full")) return 0;
  if (!strcasecmp(scale, "small")) {
    o->image = 128;
    o->width = 16;
    for (int i = 0; i < 5; i++) o->dec[i] /= 4;
    return 0;
  }
  if (!strcasecmp(scale, "tiny")) {
    o->image = 32;
    o->width = 4;
    for (int i = 0; i < 5; i++) o->dec[i] = o->dec[i] / 16 > 2 ? o->dec[i] / 16 : 2;
    return 0;
  }
  return -1;
}

void vl_resunet_train_cfg_default(vl_resunet_train_cfg *t) {
  memset(t, 0, sizeof *t);
  t->compute = VL_F32;
  t->relu_inplace = true;
  vl_optim_cfg_default(&t->optim, 1e-3f);
  t->loss_scale = 65536.0f;
  t->loss_scale_window = 2000;
}

/* ---- construction --------------------------------------------------------------------- */

static vl_status add_param(vl_resunet *m, const char *name, int64_t rows, int64_t cols,
                           vl_dtype dtype, int *idx) {
  if (m->n_params == m->cap_params) {
    int cap = m->cap_params ? 2 * m->cap_params : 256;
    vl_param *np = realloc(m->params, (size_t)cap * sizeof *np);
    if (!np) return vl_fail(m->c, VL_ERR_OOM, "parameter table");
    m->params = np;
    m->cap_params = cap;
  }
  *idx = m->n_params;
  vl_status s = vl_param_alloc(m->c, &m->params[m->n_params], name, rows, cols, dtype, true);
  m->n_params++; /* counted even on failure: destroy frees what was allocated */
  return s;
}

static vl_status unit_make(vl_resunet *m, unit *u, const char *name, int64_t cin, int64_t cout,
                           int64_t k, int stride, int64_t hin, bool relu) {
  char nm[48];
  *u = (unit){.cin = cin, .cout = cout, .k = k, .stride = stride, .pad = (int)(k / 2),
              .hin = hin, .relu = relu};
  snprintf(nm, sizeof nm, "%s.conv", name);
  VL_TRY(add_param(m, nm, cout, cin * k * k, m->tc.compute, &u->pw));
  snprintf(nm, sizeof nm, "%s.bn.weight", name);
  VL_TRY(add_param(m, nm, 1, cout, VL_F32, &u->pg));
  snprintf(nm, sizeof nm, "%s.bn.bias", name);
  VL_TRY(add_param(m, nm, 1, cout, VL_F32, &u->pb));
  VL_TRY(vl_tensor_alloc2(m->c, &u->rmean, VL_F32, VL_MEM_PARAMS, 1, cout));
  VL_TRY(vl_tensor_alloc2(m->c, &u->rvar, VL_F32, VL_MEM_PARAMS, 1, cout));
  return VL_OK;
}

static int64_t unit_hout(const unit *u) { return (u->hin + 2 * u->pad - u->k) / u->stride + 1; }

static vl_status build(vl_resunet *m) {
  const vl_resunet_cfg *mc = &m->mc;
  int64_t h = mc->image / 2, w0 = mc->width;
  VL_TRY(unit_make(m, &m->stem, "conv1", mc->in_ch, w0, 7, 2, mc->image, true));
  m->n_blocks = mc->blocks[0] + mc->blocks[1] + mc->blocks[2] + mc->blocks[3];
  m->blocks = calloc((size_t)m->n_blocks, sizeof *m->blocks);
  if (!m->blocks) return vl_fail(m->c, VL_ERR_OOM, "block table");
  int64_t cin = w0;
  h /= 2; /* max pool */
  int bi = 0;
  for (int s = 0; s < 4; s++) {
    m->stage0[s] = bi;
    int64_t planes = w0 << s, cout = planes * 4;
    for (int b = 0; b < mc->blocks[s]; b++, bi++) {
      block *B = &m->blocks[bi];
      int stride = (b == 0 && s > 0) ? 2 : 1;
      char nm[40];
      snprintf(nm, sizeof nm, "layer%d.%d.1", s + 1, b);
      VL_TRY(unit_make(m, &B->u[0], nm, cin, planes, 1, 1, h, true));
      snprintf(nm, sizeof nm, "layer%d.%d.2", s + 1, b);
      VL_TRY(unit_make(m, &B->u[1], nm, planes, planes, 3, stride, h, true));
      int64_t ho = unit_hout(&B->u[1]);
      snprintf(nm, sizeof nm, "layer%d.%d.3", s + 1, b);
      VL_TRY(unit_make(m, &B->u[2], nm, planes, cout, 1, 1, ho, false));
      B->ds = b == 0; /* channels change in every stage's first block (64 -> 256 too) */
      if (B->ds) {
        snprintf(nm, sizeof nm, "layer%d.%d.downsample", s + 1, b);
        VL_TRY(unit_make(m, &B->u[3], nm, cin, cout, 1, stride, h, false));
      }
      cin = cout;
      h = ho;
    }
  }
  m->stage0[4] = bi;
  /* decoder: skips of layer3, layer2, layer1, the stem; none at full resolution */
  m->p_dec0 = m->n_params;
  const int64_t skipc[5] = {w0 * 4 * 4, w0 * 4 * 2, w0 * 4, w0, 0};
  int64_t dcin = w0 * 4 * 8;
  for (int d = 0; d < 5; d++) {
    dblock *D = &m->dec[d];
    D->cin = dcin;
    D->cskip = skipc[d];
    D->hin = h;
    char nm[40];
    snprintf(nm, sizeof nm, "decoder.%d.1", d);
    VL_TRY(unit_make(m, &D->u[0], nm, dcin + D->cskip, mc->dec[d], 3, 1, 2 * h, true));
    snprintf(nm, sizeof nm, "decoder.%d.2", d);
    VL_TRY(unit_make(m, &D->u[1], nm, mc->dec[d], mc->dec[d], 3, 1, 2 * h, true));
    dcin = mc->dec[d];
    h *= 2;
  }
  m->p_head = m->n_params;
  VL_TRY(add_param(m, "head.conv", mc->classes, mc->dec[4] * 9, m->tc.compute, &m->p_head));
  m->grad_live = calloc((size_t)m->n_params, sizeof *m->grad_live);
  if (!m->grad_live) return vl_fail(m->c, VL_ERR_OOM, "gradient flags");
  for (int i = 0; i < m->n_params; i++)
    VL_TRY(vl_param_alloc_optim(m->c, &m->params[i], &m->tc.optim));
  return VL_OK;
}

#define FOR_UNITS(m, u, BODY)                                                              \
  do {                                                                                     \
    unit *u = &(m)->stem;                                                                  \
    BODY;                                                                                  \
    for (int bi_ = 0; bi_ < (m)->n_blocks; bi_++)                                          \
      for (int ui_ = 0; ui_ < ((m)->blocks[bi_].ds ? 4 : 3); ui_++) {                      \
        u = &(m)->blocks[bi_].u[ui_];                                                      \
        BODY;                                                                              \
      }                                                                                    \
    for (int di_ = 0; di_ < 5; di_++)                                                      \
      for (int ui_ = 0; ui_ < 2; ui_++) {                                                  \
        u = &(m)->dec[di_].u[ui_];                                                         \
        BODY;                                                                              \
      }                                                                                    \
  } while (0)

/* torchvision's init: conv kaiming_normal_(mode='fan_out', relu): std = sqrt(2 / (out
 * channels * k * k)); BN weight 1, bias 0 (running mean 0, var 1: init_running). */
static vl_status init_conv(vl_resunet *m, int pw, int64_t fan_out, vl_rng *rng, float *h) {
  vl_param *p = &m->params[pw];
  float std = (float)sqrt(2.0 / (double)fan_out);
  vl_rng_normal_fill(rng, h, p->rows * p->cols, std);
  return vl_param_load(m->c, p, h);
}

static vl_status init_values(vl_resunet *m, uint64_t seed) {
  vl_ctx *c = m->c;
  if (c->plan) return VL_OK; /* no values on the plan device */
  vl_rng rng;
  vl_rng_seed(&rng, seed);
  int64_t maxn = 0;
  for (int i = 0; i < m->n_params; i++)
    if (m->params[i].rows * m->params[i].cols > maxn) maxn = m->params[i].rows * m->params[i].cols;
  float *h = malloc((size_t)maxn * sizeof *h);
  if (!h) return vl_fail(c, VL_ERR_OOM, "host init buffer");
  vl_status s = VL_OK;
  FOR_UNITS(m, u, {
    if (s == VL_OK) s = init_conv(m, u->pw, u->cout * u->k * u->k, &rng, h);
    for (int64_t j = 0; j < u->cout; j++) h[j] = 1.0f;
    if (s == VL_OK) s = vl_param_load(c, &m->params[u->pg], h);
    memset(h, 0, (size_t)u->cout * sizeof *h);
    if (s == VL_OK) s = vl_param_load(c, &m->params[u->pb], h);
  });
  if (s == VL_OK) s = init_conv(m, m->p_head, m->mc.classes * 9, &rng, h);
  free(h);
  return s;
}

static vl_status init_running(vl_resunet *m, unit *u) {
  vl_ctx *c = m->c;
  if (c->plan) return VL_OK;
  VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &u->rmean}));
  float *one = malloc((size_t)u->cout * sizeof *one);
  if (!one) return vl_fail(c, VL_ERR_OOM, "host init buffer");
  for (int64_t i = 0; i < u->cout; i++) one[i] = 1.0f;
  vl_status s = c->be->upload(c, &u->rvar, 0, one, (size_t)u->cout * sizeof *one);
  free(one);
  return s;
}

vl_status vl_resunet_create(vl_ctx *c, const vl_resunet_cfg *mc, const vl_resunet_train_cfg *tc,
                            uint64_t seed, vl_resunet **out) {
  *out = NULL;
  if (mc->image < 32 || mc->image % 32 || mc->in_ch < 1 || mc->width < 1 || mc->classes < 2)
    return vl_fail(c, VL_ERR_INVALID,
                   "resunet: image %lld must be a multiple of 32 (>= 32), width and in_ch >= 1, "
                   "classes >= 2", (long long)mc->image);
  for (int i = 0; i < 4; i++)
    if (mc->blocks[i] < 1) return vl_fail(c, VL_ERR_INVALID, "resunet: stage %d has no block", i + 1);
  for (int i = 0; i < 5; i++)
    if (mc->dec[i] < 1) return vl_fail(c, VL_ERR_INVALID, "resunet: decoder block %d has no channel", i);
  if (tc->compute != VL_F32 && tc->compute != VL_F16 && tc->compute != VL_BF16)
    return vl_fail(c, VL_ERR_INVALID, "resunet: compute dtype %s: fp32, fp16 or bf16 expected",
                   vl_dtype_name(tc->compute));
  vl_resunet *m = calloc(1, sizeof *m);
  if (!m) return vl_fail(c, VL_ERR_OOM, "model struct");
  m->c = c;
  m->mc = *mc;
  m->tc = *tc;
  vl_scaler_init(&m->sc, tc->compute == VL_F16, tc->loss_scale, tc->loss_scale_window);
  vl_status s = build(m);
  if (s == VL_OK) s = init_values(m, seed);
  if (s == VL_OK) FOR_UNITS(m, u, if (s == VL_OK) s = init_running(m, u));
  if (s != VL_OK) {
    vl_resunet_destroy(m);
    return s;
  }
  *out = m;
  return VL_OK;
}

static void unit_clear(vl_ctx *c, unit *u) {
  vl_tensor *l[] = {&u->o, &u->rstd, &u->mean, &u->conv};
  for (int i = 0; i < 4; i++) vl_tensor_free(c, l[i]);
}

/* Frees everything a step allocated (after an error), newest first. */
static void cleanup(vl_resunet *m) {
  vl_ctx *c = m->c;
  for (int i = 3; i >= 0; i--) vl_tensor_free(c, &m->tmp[i]);
  vl_tensor_free(c, &m->gcur);
  for (int i = 3; i >= 0; i--) vl_tensor_free(c, &m->dskip[i]);
  vl_tensor_free(c, &m->loss);
  vl_tensor_free(c, &m->logits);
  for (int d = 4; d >= 0; d--) {
    unit_clear(c, &m->dec[d].u[1]);
    unit_clear(c, &m->dec[d].u[0]);
    vl_tensor_free(c, &m->dec[d].cat);
    vl_tensor_free(c, &m->dec[d].up);
  }
  for (int b = m->n_blocks - 1; b >= 0; b--) {
    vl_tensor_free(c, &m->blocks[b].out);
    for (int i = 3; i >= 0; i--) unit_clear(c, &m->blocks[b].u[i]);
  }
  vl_tensor_free(c, &m->pool);
  unit_clear(c, &m->stem);
  vl_tensor_free(c, &m->xin);
  vl_tensor_free(c, &m->data);
}

void vl_resunet_destroy(vl_resunet *m) {
  if (!m) return;
  vl_ctx *c = m->c;
  if (m->blocks) {
    cleanup(m);
    FOR_UNITS(m, u, { vl_tensor_free(c, &u->rvar); vl_tensor_free(c, &u->rmean); });
  } else {
    vl_tensor_free(c, &m->stem.rvar);
    vl_tensor_free(c, &m->stem.rmean);
  }
  for (int i = m->n_params - 1; i >= 0; i--) vl_param_free(c, &m->params[i]);
  free(m->params);
  free(m->blocks);
  free(m->grad_live);
  free(m->bufs);
  free(m);
}

/* ---- ops with their accounting ------------------------------------------------------------ */

static vl_status act(vl_resunet *m, vl_tensor *t, vl_mem_cat cat, int64_t ch, int64_t side) {
  int64_t shape[4] = {m->B, ch, side, side};
  return vl_tensor_alloc(m->c, t, m->tc.compute, cat, 4, shape);
}
static vl_status f32(vl_resunet *m, vl_tensor *t, vl_mem_cat cat, int64_t n) {
  return vl_tensor_alloc(m->c, t, VL_F32, cat, 1, &n);
}
static void tensor_free(vl_resunet *m, vl_tensor *t) { vl_tensor_free(m->c, t); }
/* Moves a tensor to another slot (ownership follows). */
static void move(vl_tensor *dst, vl_tensor *src) {
  *dst = *src;
  memset(src, 0, sizeof *src);
}

static vl_conv unit_conv(const vl_resunet *m, const unit *u) {
  vl_conv cv;
  vl_conv_init(&cv, m->B, u->cin, u->hin, u->hin, u->cout, u->k, u->k, u->stride, u->pad, 1);
  cv.xdt = m->tc.compute;
  cv.wdt = m->params[u->pw].w.dtype;
  cv.gdt = VL_F32;
  return cv;
}

/* The three convolution directions of a unit; FLOPs, bytes and workspace: vl_op_run. */
static vl_status conv_fwd(vl_resunet *m, const vl_conv *cv, vl_tensor *y, const vl_tensor *x,
                          const vl_param *w) {
  return vl_conv_fwd_run(m->c, &(vl_conv_fwd_args){.cv = *cv, .y = y, .x = x, .w = &w->w});
}

/* dw is written by the first backward of a step, accumulated by later micro-batches. */
static vl_status conv_bwd_w(vl_resunet *m, const vl_conv *cv, int pw, const vl_tensor *x,
                            const vl_tensor *dy) {
  vl_param *w = &m->params[pw];
  vl_status s = vl_conv_bwd_weight_run(
      m->c, &(vl_conv_bwd_weight_args){.cv = *cv, .dw = &w->grad, .x = x, .dy = dy,
                                       .accumulate = m->grad_live[pw]});
  m->grad_live[pw] = true;
  if (s == VL_OK) vl_grad_ready(m->c, w);
  return s;
}

static vl_status conv_bwd_x(vl_resunet *m, const vl_conv *cv, vl_tensor *dx, const vl_tensor *dy,
                            const vl_param *w) {
  return vl_conv_bwd_data_run(m->c,
                              &(vl_conv_bwd_data_args){.cv = *cv, .dx = dx, .dy = dy, .w = &w->w});
}

/* ---- units ------------------------------------------------------------------------------- */

/* conv -> BN (-> ReLU) of x into u->o. KEEP: conv, mean, rstd stay for backward (else freed at
 * once); TRAIN: batch statistics (else running ones); STATS: update the running ones. */
static vl_status unit_fwd(vl_resunet *m, unit *u, const vl_tensor *x, int mode, vl_mem_cat ocat) {
  vl_ctx *c = m->c;
  vl_conv cv = unit_conv(m, u);
  int64_t HW = cv.P * cv.Q, n = m->B * u->cout * HW;
  vl_mem_cat keep = (mode & KEEP) ? VL_MEM_ACTS : VL_MEM_TEMP;
  VL_TRY(act(m, &u->conv, keep, u->cout, cv.P));
  VL_TRY(conv_fwd(m, &cv, &u->conv, x, &m->params[u->pw]));
  const vl_tensor *g = &m->params[u->pg].w, *b = &m->params[u->pb].w;
  if (!(mode & TRAIN)) {
    VL_TRY(act(m, &u->o, ocat, u->cout, cv.P));
    VL_TRY(vl_bn_fwd_eval_run(c, &(vl_bn_fwd_eval_args){.y = &u->o, .x = &u->conv, .gamma = g,
                                                       .beta = b, .rmean = &u->rmean,
                                                       .rvar = &u->rvar, .N = m->B, .C = u->cout,
                                                       .HW = HW, .eps = m->mc.bn_eps}));
    tensor_free(m, &u->conv);
    if (u->relu) VL_TRY(vl_relu_fwd_run(c, &(vl_relu_fwd_args){.y = &u->o, .x = &u->o, .n = n}));
    return VL_OK;
  }
  VL_TRY(f32(m, &u->mean, keep, u->cout));
  VL_TRY(f32(m, &u->rstd, keep, u->cout));
  bool sep = u->relu && !m->tc.relu_inplace; /* out-of-place ReLU: BN output is temporary */
  vl_tensor *bo = sep ? &m->tmp[3] : &u->o;
  VL_TRY(act(m, bo, sep ? VL_MEM_TEMP : ocat, u->cout, cv.P));
  bool stats = (mode & STATS) && !c->recomputing;
  VL_TRY(vl_bn_fwd_train_run(
      c, &(vl_bn_fwd_train_args){.y = bo, .mean = &u->mean, .rstd = &u->rstd,
                                 .rmean = stats ? &u->rmean : NULL, .rvar = stats ? &u->rvar : NULL,
                                 .x = &u->conv, .gamma = g, .beta = b, .N = m->B, .C = u->cout,
                                 .HW = HW, .eps = m->mc.bn_eps, .momentum = m->mc.bn_momentum}));
  if (u->relu) {
    if (sep) {
      VL_TRY(act(m, &u->o, ocat, u->cout, cv.P));
      VL_TRY(vl_relu_fwd_run(c, &(vl_relu_fwd_args){.y = &u->o, .x = bo, .n = n}));
      tensor_free(m, bo);
    } else {
      VL_TRY(vl_relu_fwd_run(c, &(vl_relu_fwd_args){.y = &u->o, .x = &u->o, .n = n}));
    }
  }
  if (!(mode & KEEP)) {
    tensor_free(m, &u->rstd);
    tensor_free(m, &u->mean);
    tensor_free(m, &u->conv);
  }
  return VL_OK;
}

/* Backward of a kept unit. d (gradient of u->o, in the slot `d`) is consumed; u's saved
 * tensors are freed (u->o too when it is still here); x is the unit's input. With dx the
 * input gradient is written into a new temporary there. */
static vl_status unit_bwd(vl_resunet *m, unit *u, vl_tensor *d, const vl_tensor *x, vl_tensor *dx) {
  vl_ctx *c = m->c;
  vl_conv cv = unit_conv(m, u);
  int64_t HW = cv.P * cv.Q, n = m->B * u->cout * HW;
  if (u->relu) VL_TRY(vl_relu_bwd_run(c, &(vl_relu_bwd_args){.dx = d, .dy = d, .y = &u->o,
                                                             .n = n}));
  tensor_free(m, &u->o);
  vl_param *g = &m->params[u->pg], *b = &m->params[u->pb];
  VL_TRY(vl_bn_bwd_run(c, &(vl_bn_bwd_args){.dx = d, .dgamma = &g->grad, .dbeta = &b->grad, .dy = d,
                                           .x = &u->conv, .gamma = &g->w, .mean = &u->mean,
                                           .rstd = &u->rstd, .N = m->B, .C = u->cout, .HW = HW}));
  vl_grad_ready(c, g);
  vl_grad_ready(c, b);
  tensor_free(m, &u->rstd);
  tensor_free(m, &u->mean);
  tensor_free(m, &u->conv);
  VL_TRY(conv_bwd_w(m, &cv, u->pw, x, d));
  if (dx) {
    VL_TRY(act(m, dx, VL_MEM_TEMP, u->cin, u->hin));
    VL_TRY(conv_bwd_x(m, &cv, dx, d, &m->params[u->pw]));
  }
  tensor_free(m, d);
  return VL_OK;
}

/* ---- bottleneck blocks ------------------------------------------------------------------ */

static const vl_tensor *block_in(vl_resunet *m, int bi) {
  return bi == 0 ? &m->pool : &m->blocks[bi - 1].out;
}

static vl_status block_fwd(vl_resunet *m, int bi, int mode) {
  vl_ctx *c = m->c;
  block *B = &m->blocks[bi];
  const vl_tensor *x = block_in(m, bi);
  bool keep = mode & KEEP;
  vl_mem_cat oc = keep ? VL_MEM_ACTS : VL_MEM_TEMP;
  VL_TRY(unit_fwd(m, &B->u[0], x, mode, oc));
  VL_TRY(unit_fwd(m, &B->u[1], &B->u[0].o, mode, oc));
  if (!keep) tensor_free(m, &B->u[0].o);
  VL_TRY(unit_fwd(m, &B->u[2], &B->u[1].o, mode, VL_MEM_ACTS)); /* becomes the block output */
  if (!keep) tensor_free(m, &B->u[1].o);
  unit *u3 = &B->u[2];
  int64_t side = unit_hout(&B->u[1]), n = m->B * u3->cout * side * side;
  const vl_tensor *id = x;
  if (B->ds) {
    VL_TRY(unit_fwd(m, &B->u[3], x, mode, VL_MEM_TEMP));
    id = &B->u[3].o;
  }
  VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = &u3->o, .a = 1.0f, .x = id, .b = 1.0f,
                                          .n = n})); /* out += identity */
  if (B->ds) tensor_free(m, &B->u[3].o);
  if (m->tc.relu_inplace || !(mode & TRAIN)) {
    VL_TRY(vl_relu_fwd_run(c, &(vl_relu_fwd_args){.y = &u3->o, .x = &u3->o, .n = n}));
    move(&B->out, &u3->o);
  } else {
    VL_TRY(act(m, &B->out, VL_MEM_ACTS, u3->cout, side));
    VL_TRY(vl_relu_fwd_run(c, &(vl_relu_fwd_args){.y = &B->out, .x = &u3->o, .n = n}));
    tensor_free(m, &u3->o);
  }
  return VL_OK;
}

/* d: gradient of the block output (consumed). Leaves the input gradient in d. */
static vl_status block_bwd(vl_resunet *m, int bi, vl_tensor *d) {
  vl_ctx *c = m->c;
  block *B = &m->blocks[bi];
  const vl_tensor *x = block_in(m, bi);
  if (m->tc.checkpoint) {
    /* re-run the forward from the saved input, keeping everything; FLOPs are recompute */
    tensor_free(m, &B->out);
    c->recomputing++;
    vl_status s = block_fwd(m, bi, KEEP | TRAIN);
    c->recomputing--;
    VL_TRY(s);
  }
  unit *u3 = &B->u[2];
  int64_t side = unit_hout(&B->u[1]), n = m->B * u3->cout * side * side;
  VL_TRY(vl_relu_bwd_run(c, &(vl_relu_bwd_args){.dx = d, .dy = d, .y = &B->out, .n = n}));
  tensor_free(m, &B->out);
  /* the main path consumes a copy: d itself is the identity's gradient. dm (B, cout, side,
   * side) that copy; t the gradient between two units; dx (B, cin, hin, hin) the input's */
  vl_tensor *dm = &m->tmp[0], *t = &m->tmp[1], *dx = &m->tmp[2];
  VL_TRY(act(m, dm, VL_MEM_TEMP, u3->cout, side));
  VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = dm, .x = d, .n = n}));
  VL_TRY(unit_bwd(m, u3, dm, &B->u[1].o, t));
  VL_TRY(unit_bwd(m, &B->u[1], t, &B->u[0].o, dm));
  VL_TRY(unit_bwd(m, &B->u[0], dm, x, dx));
  int64_t nx = m->B * B->u[0].cin * B->u[0].hin * B->u[0].hin;
  if (B->ds) {
    VL_TRY(unit_bwd(m, &B->u[3], d, x, t));
    VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = dx, .a = 1.0f, .x = t, .b = 1.0f, .n = nx}));
    tensor_free(m, t);
  } else {
    VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = dx, .a = 1.0f, .x = d, .b = 1.0f, .n = nx}));
    tensor_free(m, d);
  }
  move(d, dx);
  return VL_OK;
}

/* ---- decoder ----------------------------------------------------------------------------- */

static const vl_tensor *skip_of(vl_resunet *m, int d) {
  /* decoder block d takes the output of layer 3-d (layer3, layer2, layer1) or the stem */
  if (d == 3) return &m->stem.o;
  return &m->blocks[m->stage0[3 - d] - 1].out;
}

static const vl_tensor *dec_in(vl_resunet *m, int d) {
  return d == 0 ? &m->blocks[m->n_blocks - 1].out : &m->dec[d - 1].u[1].o;
}

static vl_status dec_fwd(vl_resunet *m, int d, int mode) {
  vl_ctx *c = m->c;
  dblock *D = &m->dec[d];
  int64_t h2 = 2 * D->hin, HW = h2 * h2;
  bool keep = mode & KEEP;
  vl_tensor *in = D->cskip ? &D->up : &D->cat; /* without a skip the upsample is the input */
  VL_TRY(act(m, in, D->cskip ? VL_MEM_TEMP : (keep ? VL_MEM_ACTS : VL_MEM_TEMP), D->cin, h2));
  VL_TRY(vl_upsample2x_fwd_run(
      c, &(vl_upsample2x_fwd_args){.y = in, .x = dec_in(m, d), .planes = m->B * D->cin, .H = D->hin,
                                   .W = D->hin, .nearest = false}));
  if (D->cskip) {
    int64_t ct = D->cin + D->cskip;
    VL_TRY(act(m, &D->cat, keep ? VL_MEM_ACTS : VL_MEM_TEMP, ct, h2));
    VL_TRY(vl_chan_copy_run(c, &(vl_chan_copy_args){.y = &D->cat, .yC = ct, .y_c0 = 0, .x = &D->up,
                                                   .xC = D->cin, .x_c0 = 0, .nc = D->cin, .N = m->B,
                                                   .HW = HW, .accumulate = false}));
    VL_TRY(vl_chan_copy_run(c, &(vl_chan_copy_args){.y = &D->cat, .yC = ct, .y_c0 = D->cin,
                                                   .x = skip_of(m, d), .xC = D->cskip, .x_c0 = 0,
                                                   .nc = D->cskip, .N = m->B, .HW = HW,
                                                   .accumulate = false}));
    tensor_free(m, &D->up);
  }
  vl_mem_cat oc = keep ? VL_MEM_ACTS : VL_MEM_TEMP;
  VL_TRY(unit_fwd(m, &D->u[0], &D->cat, mode, oc));
  if (!keep) tensor_free(m, &D->cat);
  VL_TRY(unit_fwd(m, &D->u[1], &D->u[0].o, mode, oc));
  if (!keep) tensor_free(m, &D->u[0].o);
  return VL_OK;
}

/* d: gradient of the block output (consumed); leaves the gradient of the block input in
 * d and the skip's gradient in m->dskip. */
static vl_status dec_bwd(vl_resunet *m, int d, vl_tensor *g) {
  vl_ctx *c = m->c;
  dblock *D = &m->dec[d];
  int64_t h2 = 2 * D->hin, HW = h2 * h2;
  vl_tensor *t = &m->tmp[1], *dcat = &m->tmp[2];
  VL_TRY(unit_bwd(m, &D->u[1], g, &D->u[0].o, t));
  VL_TRY(unit_bwd(m, &D->u[0], t, &D->cat, dcat));
  tensor_free(m, &D->cat);
  vl_tensor *dup = dcat;
  if (D->cskip) {
    int64_t ct = D->cin + D->cskip;
    VL_TRY(act(m, t, VL_MEM_TEMP, D->cin, h2));
    VL_TRY(vl_chan_copy_run(c, &(vl_chan_copy_args){.y = t, .yC = D->cin, .y_c0 = 0, .x = dcat,
                                                   .xC = ct, .x_c0 = 0, .nc = D->cin, .N = m->B,
                                                   .HW = HW, .accumulate = false}));
    vl_tensor *ds = &m->dskip[3 - d];
    VL_TRY(act(m, ds, VL_MEM_TEMP, D->cskip, h2));
    VL_TRY(vl_chan_copy_run(c, &(vl_chan_copy_args){.y = ds, .yC = D->cskip, .y_c0 = 0, .x = dcat,
                                                   .xC = ct, .x_c0 = D->cin, .nc = D->cskip,
                                                   .N = m->B, .HW = HW, .accumulate = false}));
    tensor_free(m, dcat);
    dup = t;
  }
  VL_TRY(act(m, g, VL_MEM_TEMP, D->cin, D->hin));
  VL_TRY(vl_upsample2x_bwd_run(
      c, &(vl_upsample2x_bwd_args){.dx = g, .dy = dup, .planes = m->B * D->cin, .H = D->hin,
                                   .W = D->hin, .nearest = false}));
  tensor_free(m, dup);
  return VL_OK;
}

/* ---- the whole network ----------------------------------------------------------------- */

/* Input (already in m->data) through the encoder and decoder to the logits. */
static vl_status forward(vl_resunet *m, int mode) {
  vl_ctx *c = m->c;
  const vl_resunet_cfg *mc = &m->mc;
  bool train = mode & TRAIN;
  int64_t npix = m->B * mc->in_ch * mc->image * mc->image;
  const vl_tensor *x = &m->img;
  if (m->tc.compute != VL_F32) { /* autocast's half copy of the input, kept by conv1 */
    VL_TRY(act(m, &m->xin, train ? VL_MEM_ACTS : VL_MEM_TEMP, mc->in_ch, mc->image));
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &m->xin, .x = &m->img, .n = npix}));
    x = &m->xin;
  }
  VL_TRY(unit_fwd(m, &m->stem, x, mode, train ? VL_MEM_ACTS : VL_MEM_TEMP));
  if (!train) tensor_free(m, &m->xin);
  int64_t hs = mc->image / 2, hp = hs / 2;
  VL_TRY(act(m, &m->pool, train ? VL_MEM_ACTS : VL_MEM_TEMP, mc->width, hp));
  VL_TRY(vl_maxpool_fwd_run(c, &(vl_maxpool_fwd_args){.y = &m->pool, .x = &m->stem.o,
                                                     .planes = m->B * mc->width, .H = hs, .W = hs,
                                                     .k = 3, .stride = 2, .pad = 1, .P = hp,
                                                     .Q = hp}));
  int bmode = train ? (m->tc.checkpoint ? TRAIN | STATS : KEEP | TRAIN | STATS) : 0;
  for (int bi = 0; bi < m->n_blocks; bi++) {
    VL_TRY(block_fwd(m, bi, bmode));
    if (!train) { /* evaluation keeps only what the decoder still reads */
      bool is_skip = false;
      for (int s = 1; s < 4; s++) is_skip |= bi - 1 == m->stage0[s] - 1;
      if (bi == 0) tensor_free(m, &m->pool);
      else if (!is_skip) tensor_free(m, &m->blocks[bi - 1].out);
    }
  }
  for (int d = 0; d < 5; d++) {
    VL_TRY(dec_fwd(m, d, train ? KEEP | TRAIN | STATS : 0));
    if (!train) {
      if (d == 0) tensor_free(m, &m->blocks[m->n_blocks - 1].out);
      else tensor_free(m, &m->dec[d - 1].u[1].o);
      if (d < 4) tensor_free(m, (vl_tensor *)skip_of(m, d));
    }
  }
  vl_conv hc;
  vl_conv_init(&hc, m->B, mc->dec[4], mc->image, mc->image, mc->classes, 3, 3, 1, 1, 1);
  hc.xdt = m->tc.compute;
  hc.wdt = m->params[m->p_head].w.dtype;
  VL_TRY(act(m, &m->logits, VL_MEM_TEMP, mc->classes, mc->image));
  VL_TRY(conv_fwd(m, &hc, &m->logits, &m->dec[4].u[1].o, &m->params[m->p_head]));
  if (!train) tensor_free(m, &m->dec[4].u[1].o);
  return VL_OK;
}

static vl_status backward(vl_resunet *m, double *loss_sum, float dscale) {
  vl_ctx *c = m->c;
  const vl_resunet_cfg *mc = &m->mc;
  int64_t HW = mc->image * mc->image, P = m->B * HW;
  VL_TRY(f32(m, &m->loss, VL_MEM_TEMP, P));
  VL_TRY(vl_xent_pix_run(c, &(vl_xent_pix_args){.logits = &m->logits, .loss = &m->loss,
                                               .tgt = &m->tgt, .N = m->B, .K = mc->classes,
                                               .HW = HW, .dloss_scale = dscale}));
  if (!c->plan) {
    float *lh = malloc((size_t)P * sizeof *lh);
    if (!lh) return vl_fail(c, VL_ERR_OOM, "host loss buffer");
    vl_status s = c->be->download(c, lh, &m->loss, 0, (size_t)P * sizeof *lh);
    double sum = 0;
    for (int64_t i = 0; s == VL_OK && i < P; i++) sum += lh[i];
    free(lh);
    VL_TRY(s);
    *loss_sum += sum;
  }
  tensor_free(m, &m->loss);
  /* head */
  vl_conv hc;
  vl_conv_init(&hc, m->B, mc->dec[4], mc->image, mc->image, mc->classes, 3, 3, 1, 1, 1);
  hc.xdt = m->tc.compute;
  hc.wdt = m->params[m->p_head].w.dtype;
  hc.gdt = VL_F32;
  vl_tensor *g = &m->gcur;
  VL_TRY(conv_bwd_w(m, &hc, m->p_head, &m->dec[4].u[1].o, &m->logits));
  VL_TRY(act(m, g, VL_MEM_TEMP, mc->dec[4], mc->image));
  VL_TRY(conv_bwd_x(m, &hc, g, &m->logits, &m->params[m->p_head]));
  tensor_free(m, &m->logits);
  for (int d = 4; d >= 0; d--) VL_TRY(dec_bwd(m, d, g));
  /* encoder, stage by stage; a stage output that is also a skip gets the skip's gradient */
  for (int bi = m->n_blocks - 1; bi >= 0; bi--) {
    int skip = -1; /* block bi's output is skip index `skip` (layer1..3 -> 1..3) */
    for (int s = 0; s < 3; s++)
      if (bi == m->stage0[s + 1] - 1) skip = s + 1;
    if (skip > 0) {
      int64_t n = m->dskip[skip].n;
      VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = g, .a = 1.0f, .x = &m->dskip[skip], .b = 1.0f,
                                              .n = n}));
      tensor_free(m, &m->dskip[skip]);
    }
    VL_TRY(block_bwd(m, bi, g));
  }
  /* max pool, the stem's skip, the stem (no input gradient) */
  int64_t hs = mc->image / 2, hp = hs / 2;
  vl_tensor *ds = &m->tmp[1];
  VL_TRY(act(m, ds, VL_MEM_TEMP, mc->width, hs));
  VL_TRY(vl_maxpool_bwd_run(c, &(vl_maxpool_bwd_args){.dx = ds, .dy = g, .x = &m->stem.o,
                                                     .planes = m->B * mc->width, .H = hs, .W = hs,
                                                     .k = 3, .stride = 2, .pad = 1, .P = hp,
                                                     .Q = hp}));
  tensor_free(m, g);
  tensor_free(m, &m->pool);
  VL_TRY(vl_axpby_run(c, &(vl_axpby_args){.y = ds, .a = 1.0f, .x = &m->dskip[0], .b = 1.0f,
                                          .n = ds->n}));
  tensor_free(m, &m->dskip[0]);
  VL_TRY(unit_bwd(m, &m->stem, ds, m->xin.n ? &m->xin : &m->img, NULL));
  tensor_free(m, &m->xin);
  return VL_OK;
}

static vl_status upload_batch(vl_resunet *m, const vl_resunet_batch *b, bool targets) {
  vl_ctx *c = m->c;
  const vl_resunet_cfg *mc = &m->mc;
  int64_t HW = mc->image * mc->image, nx = b->B * mc->in_ch * HW;
  /* the batch on the device, one block in category data: images (B, 3, H, W) fp32, then
   * (training) targets (B, H, W) int32; img and tgt are typed views of it */
  VL_TRY(f32(m, &m->data, VL_MEM_DATA, nx + (targets ? b->B * HW : 0)));
  int64_t xs[4] = {b->B, mc->in_ch, mc->image, mc->image}, ys[3] = {b->B, mc->image, mc->image};
  m->img = vl_tensor_view(&m->data, 0, VL_F32, 4, xs);
  m->tgt = targets ? vl_tensor_view(&m->data, (size_t)nx * 4, VL_I32, 3, ys) : (vl_tensor){0};
  if (!c->plan && b->x) {
    VL_TRY(c->be->upload(c, &m->img, 0, b->x, (size_t)nx * 4));
    if (targets && b->y) VL_TRY(c->be->upload(c, &m->tgt, 0, b->y, (size_t)(b->B * HW) * 4));
  }
  return VL_OK;
}

static int64_t count_pixels(const vl_resunet *m, const vl_resunet_batch *b, vl_status *bad) {
  int64_t HW = m->mc.image * m->mc.image, n = 0;
  *bad = VL_OK;
  if (!b->y) return b->B * HW;
  for (int64_t i = 0; i < b->B * HW; i++) {
    if (b->y[i] >= m->mc.classes || b->y[i] < -1) *bad = VL_ERR_INVALID;
    n += b->y[i] >= 0;
  }
  return n;
}

vl_status vl_resunet_fwd_bwd(vl_resunet *m, const vl_resunet_batch *mb, int n_micro,
                             vl_resunet_step_info *info) {
  vl_ctx *c = m->c;
  memset(info, 0, sizeof *info);
  if (n_micro < 1) return vl_fail(c, VL_ERR_INVALID, "need at least one micro-batch");
  int64_t npix = 0;
  for (int i = 0; i < n_micro; i++) {
    vl_status bad;
    if (mb[i].B < 1) return vl_fail(c, VL_ERR_INVALID, "micro-batch %d: batch %lld", i, (long long)mb[i].B);
    if (!c->plan && (!mb[i].x || !mb[i].y))
      return vl_fail(c, VL_ERR_INVALID, "micro-batch %d has no images or no targets", i);
    npix += count_pixels(m, &mb[i], &bad);
    if (bad != VL_OK)
      return vl_fail(c, VL_ERR_INVALID, "micro-batch %d: a target is outside -1..%lld", i,
                     (long long)m->mc.classes - 1);
  }
  if (npix == 0) return vl_fail(c, VL_ERR_INVALID, "no labelled pixel in the step");
  float dscale = m->sc.scale / (float)npix;
  double loss_sum = 0;
  for (int i = 0; i < n_micro; i++) {
    m->B = mb[i].B;
    vl_status s = upload_batch(m, &mb[i], true);
    if (s == VL_OK) s = forward(m, KEEP | TRAIN | STATS);
    if (s == VL_OK) s = backward(m, &loss_sum, dscale);
    tensor_free(m, &m->data);
    if (s != VL_OK) {
      cleanup(m);
      vl_params_zero_grads(c, m->params, m->n_params);
      memset(m->grad_live, 0, (size_t)m->n_params * sizeof *m->grad_live);
      return s;
    }
  }
  info->loss = loss_sum / (double)npix;
  info->n_pixels = npix;
  info->loss_scale = m->sc.scale;
  if (!c->plan && !isfinite(info->loss)) {
    vl_params_zero_grads(c, m->params, m->n_params);
    memset(m->grad_live, 0, (size_t)m->n_params * sizeof *m->grad_live);
    if (m->sc.fp16) {
      info->skipped = true;
      return vl_scaler_skip(c, m->params, m->n_params, &m->sc);
    }
    return vl_fail(c, VL_ERR_NUMERIC, "loss is %g: training diverged", info->loss);
  }
  return VL_OK;
}

void vl_resunet_step_end(vl_resunet *m) {
  /* conv gradients are written (not added) by the first backward of the next step */
  memset(m->grad_live, 0, (size_t)m->n_params * sizeof *m->grad_live);
}

vl_status vl_resunet_apply(vl_resunet *m, vl_resunet_step_info *info) {
  info->loss_scale = m->sc.scale;
  vl_resunet_step_end(m);
  return vl_params_apply(m->c, m->params, m->n_params, &m->tc.optim, m->tc.clip, &m->sc,
                         &info->skipped, &info->grad_norm);
}

vl_status vl_resunet_step(vl_resunet *m, const vl_resunet_batch *mb, int n_micro,
                          vl_resunet_step_info *info) {
  VL_TRY(vl_resunet_fwd_bwd(m, mb, n_micro, info));
  if (info->skipped) return VL_OK;
  return vl_resunet_apply(m, info);
}

vl_status vl_resunet_predict(vl_resunet *m, const float *x, int64_t B, int32_t *pred) {
  vl_ctx *c = m->c;
  const vl_resunet_cfg *mc = &m->mc;
  if (B < 1 || !x || !pred) return vl_fail(c, VL_ERR_INVALID, "predict: batch %lld", (long long)B);
  vl_resunet_batch b = {.B = B, .x = x, .y = NULL};
  m->B = B;
  vl_status s = upload_batch(m, &b, false);
  if (s == VL_OK) s = forward(m, 0);
  int64_t HW = mc->image * mc->image, K = mc->classes;
  float *lg = NULL;
  if (s == VL_OK && !c->plan) {
    lg = malloc((size_t)(B * K * HW) * sizeof *lg);
    if (!lg) s = vl_fail(c, VL_ERR_OOM, "host logits");
  }
  if (s == VL_OK && lg) {
    /* logits in the compute dtype: read them as fp32 through a converted copy */
    vl_tensor f = {0};
    s = f32(m, &f, VL_MEM_TEMP, B * K * HW);
    if (s == VL_OK) s = vl_convert_run(c, &(vl_convert_args){.y = &f, .x = &m->logits,
                                                             .n = B * K * HW});
    if (s == VL_OK) s = c->be->download(c, lg, &f, 0, (size_t)(B * K * HW) * sizeof *lg);
    tensor_free(m, &f);
    for (int64_t n = 0; s == VL_OK && n < B; n++)
      for (int64_t p = 0; p < HW; p++) {
        int best = 0;
        for (int k = 1; k < K; k++)
          if (lg[(n * K + k) * HW + p] > lg[(n * K + best) * HW + p]) best = k;
        pred[n * HW + p] = best;
      }
  }
  free(lg);
  tensor_free(m, &m->logits);
  tensor_free(m, &m->data);
  if (s != VL_OK) cleanup(m);
  return s;
}

/* vl_model_resunet's train_state (resunet_model.c): the parameter table in creation order
 * (per conv-BN unit: conv weight, BN weight, BN bias; stem, the bottlenecks' conv1..3 and
 * downsample, the decoder's units, the head; torchvision's and the decoder's
 * model.parameters() order), the optimizer, clip and scaler, and the buffers: each unit's
 * BN running mean and variance (made on the first call). */
vl_status vl_resunet_train_state(vl_resunet *m, vl_train_state *out) {
  if (!m->bufs) { /* the BN running statistics, unit by unit (the BN parameters' order) */
    int n = 0;
    FOR_UNITS(m, u, { (void)u; n += 2; });
    m->bufs = malloc((size_t)n * sizeof *m->bufs);
    if (!m->bufs) return vl_fail(m->c, VL_ERR_OOM, "host memory for %d buffer pointers", n);
    FOR_UNITS(m, u, {
      m->bufs[m->n_bufs++] = &u->rmean;
      m->bufs[m->n_bufs++] = &u->rvar;
    });
  }
  *out = (vl_train_state){m->params, m->n_params, &m->tc.optim, m->tc.clip, &m->sc, m->bufs,
                          m->n_bufs};
  return VL_OK;
}

vl_param *vl_resunet_params(vl_resunet *m, int *n) {
  *n = m->n_params;
  return m->params;
}

int vl_resunet_param_module(const vl_resunet *m, int i) {
  return i < m->p_dec0 ? 0 : i < m->p_head ? 1 : 2;
}

int64_t vl_resunet_n_params(const vl_resunet *m, int module) {
  int64_t n = 0;
  for (int i = 0; i < m->n_params; i++)
    if (module < 0 || vl_resunet_param_module(m, i) == module)
      n += m->params[i].rows * m->params[i].cols;
  return n;
}

vl_status vl_resunet_bn_running(vl_resunet *m, int gi, float *mean, float *var) {
  vl_ctx *c = m->c;
  unit *hit = NULL;
  FOR_UNITS(m, u, if (u->pg == gi) hit = u);
  if (!hit) return vl_fail(c, VL_ERR_INVALID, "parameter %d is not a BN weight", gi);
  if (c->plan) return VL_OK;
  VL_TRY(c->be->download(c, mean, &hit->rmean, 0, (size_t)hit->cout * 4));
  return c->be->download(c, var, &hit->rvar, 0, (size_t)hit->cout * 4);
}

const vl_resunet_cfg *vl_resunet_config(const vl_resunet *m) { return &m->mc; }
vl_ctx *vl_resunet_ctx(const vl_resunet *m) { return m->c; }
