/* Parameter storage (frozen, trainable, AMP master + working copy), optimizer state and
 * the update step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "vramlab/nn.h"
#include "vramlab/quant.h"

static const char *const opt_names[VL_OPT_COUNT] = {"adamw", "adafactor", "sgd"};
const char *vl_optimizer_name(vl_optimizer o) { return o < VL_OPT_COUNT ? opt_names[o] : "?"; }
int vl_optimizer_parse(const char *s, vl_optimizer *o) {
  for (int i = 0; i < VL_OPT_COUNT; i++)
    if (!strcasecmp(s, opt_names[i])) { *o = (vl_optimizer)i; return 0; }
  return -1;
}

vl_status vl_param_alloc(vl_ctx *c, vl_param *p, const char *name, int64_t rows, int64_t cols,
                         vl_dtype dtype, bool trainable) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->rows = rows;
  p->cols = cols;
  p->trainable = trainable;
  if (trainable && dtype == VL_NF4)
    return vl_fail(c, VL_ERR_INVALID, "%s: nf4 storage is for frozen weights only", name);
  vl_mem_cat cat = trainable ? VL_MEM_PARAMS : VL_MEM_FROZEN;
  if (trainable && dtype != VL_F32) {
    /* AMP: fp32 master first, then the low-precision working copy used by compute. */
    p->has_master = true;
    VL_TRY(vl_tensor_alloc2(c, &p->master, VL_F32, VL_MEM_PARAMS, rows, cols));
  }
  VL_TRY(vl_tensor_alloc2(c, &p->w, dtype, cat, rows, cols));
  if (trainable) {
    VL_TRY(vl_tensor_alloc2(c, &p->grad, VL_F32, VL_MEM_GRADS, rows, cols));
    VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &p->grad}));
  }
  return VL_OK;
}

size_t vl_optim_state_bytes(const vl_optim_cfg *oc, int64_t rows, int64_t cols) {
  size_t n = (size_t)(rows * cols);
  switch (oc->opt) {
    case VL_OPT_ADAMW: return 8 * n;
    case VL_OPT_SGD: return 4 * n;
    case VL_OPT_ADAFACTOR:
      return 4 * (size_t)(rows > 1 ? rows + cols : cols) + (oc->adafactor_beta1 ? 4 * n : 0);
    default: return 0;
  }
}

vl_status vl_param_alloc_optim(vl_ctx *c, vl_param *p, const vl_optim_cfg *oc) {
  if (!p->trainable || oc->state_elsewhere) return VL_OK;
  int64_t r = p->rows, k = p->cols;
  switch (oc->opt) {
    case VL_OPT_ADAMW:
      VL_TRY(vl_tensor_alloc2(c, &p->state[0], VL_F32, VL_MEM_OPTIM, r, k));
      VL_TRY(vl_tensor_alloc2(c, &p->state[1], VL_F32, VL_MEM_OPTIM, r, k));
      break;
    case VL_OPT_SGD:
      VL_TRY(vl_tensor_alloc2(c, &p->state[0], VL_F32, VL_MEM_OPTIM, r, k));
      break;
    case VL_OPT_ADAFACTOR:
      /* Factored second moment for matrices: a row and a column vector. */
      if (r > 1) VL_TRY(vl_tensor_alloc2(c, &p->state[0], VL_F32, VL_MEM_OPTIM, 1, r));
      VL_TRY(vl_tensor_alloc2(c, &p->state[1], VL_F32, VL_MEM_OPTIM, 1, k));
      if (oc->adafactor_beta1)
        VL_TRY(vl_tensor_alloc2(c, &p->state[2], VL_F32, VL_MEM_OPTIM, r, k));
      break;
    default: return vl_fail(c, VL_ERR_INVALID, "unknown optimizer %d", (int)oc->opt);
  }
  for (int i = 0; i < 3; i++)
    if (p->state[i].owned) VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &p->state[i]}));
  return VL_OK;
}

/* Host-side dtype conversion: the CPU backend's kernel on host buffers, called directly
 * (not an operation of c's device, so not counted). */
static vl_status host_convert(vl_ctx *c, vl_tensor *dst, const vl_tensor *src, int64_t n) {
  return vl_backend_cpu()->ops[VL_OP_CONVERT](c, &(vl_convert_args){.y = dst, .x = src, .n = n});
}

/* Upload host fp32 into a tensor of any dtype, converting on the host. */
static vl_status upload_f32(vl_ctx *c, vl_tensor *t, const float *host) {
  if (c->plan) return VL_OK; /* no data on the plan device */
  if (t->dtype == VL_F32) return c->be->upload(c, t, 0, host, t->bytes);
  void *buf = malloc(t->bytes);
  if (!buf) return vl_fail(c, VL_ERR_OOM, "host buffer of %zu bytes", t->bytes);
  vl_status s = VL_OK;
  if (t->dtype == VL_NF4) {
    if (vl_nf4_quantize_host(buf, host, t->n)) s = vl_fail(c, VL_ERR_INVALID, "nf4 quantise");
  } else {
    /* Reuse the backend's conversion rules through a host-side fp32 staging tensor. */
    vl_tensor src = *t, dst = *t;
    src.dtype = VL_F32; src.data = (void *)host;
    dst.data = buf;
    s = host_convert(c, &dst, &src, t->n);
  }
  if (s == VL_OK) s = c->be->upload(c, t, 0, buf, t->bytes);
  free(buf);
  return s;
}

vl_status vl_param_load(vl_ctx *c, vl_param *p, const float *host) {
  if (p->has_master) VL_TRY(upload_f32(c, &p->master, host));
  return upload_f32(c, &p->w, host);
}

static vl_status read_f32(vl_ctx *c, const vl_tensor *t, float *host) {
  if (c->plan) return vl_fail(c, VL_ERR_UNSUPPORTED, "no data on the plan device");
  if (t->dtype == VL_F32) return c->be->download(c, host, t, 0, t->bytes);
  void *buf = malloc(t->bytes);
  if (!buf) return vl_fail(c, VL_ERR_OOM, "host buffer of %zu bytes", t->bytes);
  vl_status s = c->be->download(c, buf, t, 0, t->bytes);
  if (s == VL_OK) {
    if (t->dtype == VL_NF4) vl_nf4_dequantize_host(host, buf, t->n);
    else {
      vl_tensor src = *t, dst = *t;
      src.data = buf; dst.dtype = VL_F32; dst.data = host;
      s = host_convert(c, &dst, &src, t->n);
    }
  }
  free(buf);
  return s;
}

vl_status vl_param_read(vl_ctx *c, const vl_param *p, float *host) {
  return read_f32(c, p->has_master ? &p->master : &p->w, host);
}
vl_status vl_param_read_grad(vl_ctx *c, const vl_param *p, float *host) {
  if (!p->trainable) return vl_fail(c, VL_ERR_INVALID, "%s is frozen: no gradient", p->name);
  return read_f32(c, &p->grad, host);
}

void vl_param_free(vl_ctx *c, vl_param *p) {
  for (int i = 2; i >= 0; i--) vl_tensor_free(c, &p->state[i]);
  vl_tensor_free(c, &p->grad);
  vl_tensor_free(c, &p->w);
  vl_tensor_free(c, &p->master);
}

vl_status vl_param_update(vl_ctx *c, vl_param *p, const vl_optim_cfg *oc, int64_t t,
                          float grad_scale) {
  if (!p->trainable) return VL_OK;
  vl_optim_hp hp = oc->hp;
  hp.t = t;
  hp.grad_scale = grad_scale;
  vl_tensor *w = p->has_master ? &p->master : &p->w;
  int64_t n = p->rows * p->cols;
  switch (oc->opt) {
    case VL_OPT_ADAMW:
      VL_TRY(vl_adamw_run(c, &(vl_adamw_args){.p = w, .g = &p->grad, .m = &p->state[0],
                                              .v = &p->state[1], .n = n, .hp = &hp}));
      break;
    case VL_OPT_SGD:
      VL_TRY(vl_sgd_run(c, &(vl_sgd_args){.p = w, .g = &p->grad, .mom = &p->state[0], .n = n,
                                          .hp = &hp}));
      break;
    case VL_OPT_ADAFACTOR:
      if (!oc->adafactor_beta1) hp.beta1 = 0;
      VL_TRY(vl_adafactor_run(
          c, &(vl_adafactor_args){.p = w, .g = &p->grad, .vr = &p->state[0], .vc = &p->state[1],
                                  .m = oc->adafactor_beta1 ? &p->state[2] : NULL,
                                  .R = p->rows, .C = p->cols, .hp = &hp}));
      break;
    default: return vl_fail(c, VL_ERR_INVALID, "unknown optimizer");
  }
  /* the AMP working copy (R, C) from the fp32 master */
  if (p->has_master) VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &p->w, .x = &p->master,
      .n = n}));
  return VL_OK;
}
