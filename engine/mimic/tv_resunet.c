/* The mimic of the seg-ckpt step in PyTorch (vramlab/mimic.h: vl_mimic_resunet): the ResNet
 * U-Net of tools/peers/seg_peer.py (torchvision's Bottleneck blocks under an encoder-decoder,
 * tests/torch/make_resunet_fixture.py's Net), NCHW, pixel cross-entropy on the fp32 logits,
 * autocast + GradScaler for fp16/bf16, torch.utils.checkpoint (non-reentrant) around every
 * bottleneck when the rung checkpoints, ReLU in place or not, AdamW / SGD, gradients set to
 * None; op by op over tape.c, as tools/peers/torch_trace.py's traces show the step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tape.h"

typedef struct {
  mt_id w;
  int64_t cin, cout, k, stride;
} conv;
typedef struct {
  mt_id w, b;
  int64_t c;
} bn;
typedef struct prog prog;
typedef struct {
  prog *p;
  conv c1, c2, c3, ds;
  bn b1, b2, b3, dsb;
  bool has_ds;
  int64_t hin; /* input side */
} block;

struct prog {
  const vl_mimic_resunet_cfg *c;
  mt_tape *t;
  int64_t B;
  int aesz; /* autocast dtype size, 0: none */
  conv stem;
  bn stem_bn;
  block *blk;
  int nblk;
  conv dec[5][2];
  bn dbn[5][2];
  conv head;
  mt_id x, y;
  mt_optim opt;
};

static mt_id param(prog *p, int64_t numel) {
  mt_id x = mt_leaf(p->t, "param", numel, 4, VL_MC_PARAM, true);
  p->opt.train[p->opt.ntrain++] = x;
  return x;
}

static conv conv_params(prog *p, int64_t cin, int64_t cout, int64_t k, int64_t stride) {
  conv c = {.cin = cin, .cout = cout, .k = k, .stride = stride};
  c.w = param(p, cout * cin * k * k);
  return c;
}

/* nn.BatchNorm2d: weight and bias; running_mean, running_var and num_batches_tracked */
static bn bn_params(prog *p, int64_t c) {
  bn b = {.c = c};
  b.w = param(p, c);
  b.b = param(p, c);
  (void)mt_leaf(p->t, "buffer", 2 * c, 4, VL_MC_BUFFER, false);
  (void)mt_leaf(p->t, "buffer", 1, 8, VL_MC_BUFFER, false);
  return b;
}

static void build(prog *p) {
  const vl_resunet_cfg *m = &p->c->model;
  p->stem = conv_params(p, m->in_ch, m->width, 7, 2);
  p->stem_bn = bn_params(p, m->width);
  int64_t cin = m->width, h = m->image / 4;
  int k = 0;
  for (int s = 0; s < 4; s++) {
    int64_t planes = m->width << s;
    for (int b = 0; b < m->blocks[s]; b++) {
      block *y = &p->blk[k++];
      int64_t stride = (b == 0 && s > 0) ? 2 : 1;
      y->p = p;
      y->hin = h;
      y->c1 = conv_params(p, cin, planes, 1, 1);
      y->b1 = bn_params(p, planes);
      y->c2 = conv_params(p, planes, planes, 3, stride);
      y->b2 = bn_params(p, planes);
      y->c3 = conv_params(p, planes, planes * 4, 1, 1);
      y->b3 = bn_params(p, planes * 4);
      if (b == 0) {
        y->has_ds = true;
        y->ds = conv_params(p, cin, planes * 4, 1, stride);
        y->dsb = bn_params(p, planes * 4);
      }
      cin = planes * 4;
      h /= stride;
    }
  }
  p->nblk = k;
  int64_t skips[5] = {m->width * 16, m->width * 8, m->width * 4, m->width, 0}, dcin = m->width * 32;
  for (int d = 0; d < 5; d++) {
    p->dec[d][0] = conv_params(p, dcin + skips[d], m->dec[d], 3, 1);
    p->dbn[d][0] = bn_params(p, m->dec[d]);
    p->dec[d][1] = conv_params(p, m->dec[d], m->dec[d], 3, 1);
    p->dbn[d][1] = bn_params(p, m->dec[d]);
    dcin = m->dec[d];
  }
  p->head = conv_params(p, m->dec[4], m->classes, 3, 1);
  p->x = mt_leaf(p->t, "input", p->B * m->in_ch * m->image * m->image, 4, VL_MC_OTH, false);
  p->y = mt_leaf(p->t, "target", p->B * m->image * m->image, 8, VL_MC_OTH, false);
}

/* ---- forward ------------------------------------------------------------------------------- */

/* F.conv2d under autocast: the weight's cast (cached) first, then the input's */
static mt_id f_conv(prog *p, mt_id x, const conv *c, int64_t hout) {
  mt_tape *t = p->t;
  bool ac = p->aesz != 0;
  mt_id wc = ac ? mt_cast(t, c->w, p->aesz, true) : (mt_ref(t, c->w), c->w);
  mt_id xc = ac ? mt_cast(t, x, p->aesz, true) : (mt_ref(t, x), x);
  mt_id y = mt_op(t, "convolution", MT_BW_CONV, p->B * c->cout * hout * hout, mt_esz(t, xc), xc, wc, 0);
  mt_drop(t, xc);
  mt_drop(t, wc);
  return y;
}

/* nn.BatchNorm2d in training: native_batch_norm's output, save_mean and save_invstd */
static mt_id f_bn(prog *p, mt_id x, const bn *b) {
  mt_id y = mt_op(p->t, "native_batch_norm", MT_BW_BN, mt_numel(p->t, x), mt_esz(p->t, x), x, b->w, b->b);
  mt_aux(p->t, y, "native_batch_norm", b->c, 4);
  mt_aux(p->t, y, "native_batch_norm", b->c, 4);
  return y;
}

/* nn.ReLU(inplace) / F.relu: x is dropped (the name rebound) */
static mt_id f_relu(prog *p, mt_id x, bool inplace) {
  mt_id y = inplace ? mt_inplace(p->t, "relu_", MT_BW_RELU, x, 0)
                    : mt_op(p->t, "relu", MT_BW_RELU, mt_numel(p->t, x), mt_esz(p->t, x), x, 0, 0);
  mt_drop(p->t, x);
  return y;
}

/* conv -> bn, the conv's output let go */
static mt_id conv_bn(prog *p, mt_id x, const conv *c, const bn *b, int64_t hout) {
  mt_id y = f_conv(p, x, c, hout);
  mt_id z = f_bn(p, y, b);
  mt_drop(p->t, y);
  return z;
}

/* torchvision.models.resnet.Bottleneck.forward; x keeps its reference */
static mt_id bottleneck(void *ctx, mt_id x) {
  block *y = ctx;
  prog *p = y->p;
  bool ip = p->c->relu_inplace;
  int64_t h = y->hin, ho = h / y->c2.stride;
  mt_id out = f_relu(p, conv_bn(p, x, &y->c1, &y->b1, h), ip);
  mt_id o2 = conv_bn(p, out, &y->c2, &y->b2, ho);
  mt_drop(p->t, out);
  out = f_relu(p, o2, ip);
  mt_id o3 = conv_bn(p, out, &y->c3, &y->b3, ho);
  mt_drop(p->t, out);
  mt_id id = y->has_ds ? conv_bn(p, x, &y->ds, &y->dsb, ho) : (mt_ref(p->t, x), x);
  out = mt_inplace(p->t, "add_", MT_BW_ADD, o3, id); /* out += identity */
  mt_drop(p->t, o3);
  mt_drop(p->t, id);
  return f_relu(p, out, ip);
}

static mt_id block_fwd(prog *p, mt_id x, block *y) {
  if (!p->c->checkpoint) return bottleneck(y, x);
  mt_ckpt_begin(p->t, x);
  mt_id out = bottleneck(y, x);
  mt_ckpt_end(p->t, bottleneck, y);
  return out;
}

/* the decoder's Unit: F.relu(bn(conv(x))) */
static mt_id unit(prog *p, mt_id x, const conv *c, const bn *b, int64_t h) {
  return f_relu(p, conv_bn(p, x, c, b, h), false);
}

static mt_id forward(prog *p) {
  mt_tape *t = p->t;
  const vl_resunet_cfg *m = &p->c->model;
  int64_t H = m->image;
  mt_id stem = f_relu(p, conv_bn(p, p->x, &p->stem, &p->stem_bn, H / 2), false);
  int64_t h = H / 4;
  mt_id cur = mt_op(t, "max_pool2d_with_indices", MT_BW_POOL, p->B * m->width * h * h, mt_esz(t, stem), stem, 0, 0);
  mt_aux(t, cur, "max_pool2d_with_indices", p->B * m->width * h * h, 8);
  mt_id feats[4];
  int k = 0;
  for (int s = 0; s < 4; s++) {
    for (int b = 0; b < m->blocks[s]; b++) {
      mt_id nx = block_fwd(p, cur, &p->blk[k++]);
      mt_drop(t, cur);
      cur = nx;
    }
    feats[s] = cur;
    mt_ref(t, cur);
    if (s > 0) h /= 2;
  }
  mt_id skips[5] = {feats[2], feats[1], feats[0], stem, 0};
  for (int d = 0; d < 5; d++) {
    h *= 2;
    int64_t cin = mt_numel(t, cur) / (p->B * (h / 2) * (h / 2));
    mt_id u = mt_op(t, "upsample_bilinear2d", MT_BW_UPSAMPLE, p->B * cin * h * h, mt_esz(t, cur), cur, 0, 0);
    mt_drop(t, cur);
    if (skips[d]) {
      int e = mt_esz(t, u) > mt_esz(t, skips[d]) ? mt_esz(t, u) : mt_esz(t, skips[d]);
      mt_id c = mt_op(t, "cat", MT_BW_CAT, mt_numel(t, u) + mt_numel(t, skips[d]), e, u, skips[d], 0);
      mt_drop(t, u);
      u = c;
    }
    mt_id a = unit(p, u, &p->dec[d][0], &p->dbn[d][0], h);
    mt_drop(t, u);
    cur = unit(p, a, &p->dec[d][1], &p->dbn[d][1], h);
    mt_drop(t, a);
  }
  mt_id logits = f_conv(p, cur, &p->head, H);
  mt_drop(t, cur);
  for (int s = 0; s < 4; s++) mt_drop(t, feats[s]); /* Net.forward returns */
  mt_drop(t, stem);
  /* F.cross_entropy(net(x).float(), y): log_softmax over the classes, nll_loss2d */
  mt_id lf = mt_cast(t, logits, 4, false);
  mt_drop(t, logits);
  mt_id ls = mt_op(t, "_log_softmax", MT_BW_LOGSOFTMAX, mt_numel(t, lf), 4, lf, 0, 0);
  mt_drop(t, lf);
  mt_id loss = mt_op(t, "nll_loss2d_forward", MT_BW_NLL, 1, 4, ls, p->y, 0);
  mt_id tw = mt_temp(t, "nll_loss2d_forward", 1, 4);
  mt_drop(t, tw);
  mt_drop(t, ls);
  mt_id l2 = mt_op(t, "div", MT_BW_MULS, 1, 4, loss, 0, 0); /* / accum */
  mt_drop(t, loss);
  return l2;
}

static void one_step(prog *p) {
  mt_tape *t = p->t;
  for (int64_t a = 0; a < mt_micro_batches(p->c->accum); a++) {
    mt_phase(t, 'f');
    int mark = mt_graph_mark(t);
    mt_id loss = forward(p);
    mt_release_graph(t, mark); /* the previous micro-batch's loss, rebound */
    if (p->aesz) mt_autocast_exit(t);
    mt_id root = loss;
    if (p->c->compute == VL_F16) { /* GradScaler.scale(loss) */
      root = mt_op(t, "mul", MT_BW_MULS, 1, 4, loss, 0, 0);
      mt_drop(t, loss);
    }
    mt_phase(t, 'b');
    mt_backward(t, root);
    mt_drop(t, root);
    mt_phase(t, 'o'); /* until the next forward (as tools/peers/torch_trace.py phases it) */
  }
  mt_step_tail(t, &p->opt, p->c->clip > 0);
}

vl_status vl_mimic_resunet(const vl_mimic_resunet_cfg *c, vl_mimic_result *out, vl_mimic_sink sink, void *user,
                           char *why, size_t whyn) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  memset(out, 0, sizeof *out);
  const vl_resunet_cfg *m = &c->model;
  if (c->optim == VL_OPT_ADAFACTOR) {
    snprintf(why, whyn, "not mimicked: transformers' Adafactor");
    return VL_ERR_UNSUPPORTED;
  }
  if (c->batch < 1 || c->accum < 1 || c->steps < 1 || m->image < 32 || m->image % 32 || m->width < 1) {
    snprintf(why, whyn, "batch, accum and steps must be >= 1, the image a multiple of 32");
    return VL_ERR_INVALID;
  }
  int nb = 0;
  for (int s = 0; s < 4; s++) nb += m->blocks[s];
  int64_t max_train = 2 + 3 * 20 + 12 * (int64_t)nb + 1;
  prog p = {.c = c, .B = c->batch, .aesz = c->compute == VL_F32 ? 0 : 2};
  p.t = mt_new(sink, user);
  p.blk = calloc((size_t)nb + 1, sizeof *p.blk);
  p.opt = (mt_optim){.train = calloc((size_t)max_train, sizeof(mt_id)),
                     .state = calloc((size_t)max_train * 2, sizeof(mt_id)), .opt = c->optim,
                     .cuda = c->device == VL_MIMIC_CUDA};
  vl_status st = VL_OK;
  if (!p.t || !p.blk || !p.opt.train || !p.opt.state) {
    snprintf(why, whyn, "out of host memory");
    st = VL_ERR_OOM;
    goto done;
  }
  build(&p);
  int64_t base = mt_live(p.t);
  for (int s = 0; s < c->steps; s++) {
    mt_step(p.t, s);
    one_step(&p);
  }
  mt_result(p.t, out);
  out->base_bytes = base;
  if (c->device == VL_MIMIC_CUDA) st = mt_replay_cuda(p.t, c->capacity, out, why, whyn);
done:
  mt_free(p.t);
  free(p.blk);
  free(p.opt.train);
  free(p.opt.state);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return st;
}
