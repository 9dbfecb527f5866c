/* LoRA shared by the Stable Diffusion models (sd_lora.h): the linear layer with its LoRA path,
 * forward and backward over vl_op_run, and the table of trainable LoRA factors. */
#include "sd_lora.h"

#include <stdlib.h>
#include <string.h>

vl_status sd_lora_lin_fwd(vl_ctx *c, const sd_lora_lin *L, vl_tensor *y, const vl_tensor *x,
                          int64_t R, float beta, bool keep, vl_tensor *xa) {
  VL_TRY(vl_linear_fwd(c, y, x, L->w, R, L->in, L->out, beta));
  if (L->b) VL_TRY(vl_bias_fwd_run(c, &(vl_bias_fwd_args){.y = y, .b = L->b, .outer = R,
                                                          .C = L->out, .inner = 1,
                                                          .per_outer = false}));
  if (!L->A) return VL_OK;
  int64_t r = L->r;
  VL_TRY(vl_tensor_alloc2(c, xa, L->acts, keep ? VL_MEM_ACTS : VL_MEM_TEMP, R, r)); // (R, r)
  VL_TRY(vl_linear_fwd(c, xa, x, &L->A->w, R, L->in, r, 0.0f));
  vl_gemm g = {.ta = false, .tb = true, .M = R, .N = L->out, .K = r, .alpha = L->scale,
               .beta = 1.0f, .A = xa, .lda = r, .B = &L->B->w, .ldb = r, .C = y, .ldc = L->out,
               .batch = 1};
  VL_TRY(vl_gemm_run(c, &g));
  if (!keep) vl_tensor_free(c, xa);
  return VL_OK;
}

vl_status sd_lora_lin_xa(vl_ctx *c, const sd_lora_lin *L, const vl_tensor *x, int64_t R,
                         vl_tensor *xa) {
  if (!L->A) return VL_OK;
  VL_TRY(vl_tensor_alloc2(c, xa, L->acts, VL_MEM_ACTS, R, L->r)); // (R, r)
  return vl_linear_fwd(c, xa, x, &L->A->w, R, L->in, L->r, 0.0f);
}

vl_status sd_lora_lin_bwd(vl_ctx *c, const sd_lora_lin *L, vl_tensor *dx, float beta,
                          const vl_tensor *dy, const vl_tensor *x, vl_tensor *xa, vl_tensor *dxa,
                          int64_t R) {
  if (dx) VL_TRY(vl_linear_bwd_x(c, dx, dy, L->w, R, L->in, L->out, beta));
  if (!L->A) return VL_OK;
  int64_t r = L->r;
  float s = L->scale;
  VL_TRY(vl_linear_bwd_w(c, &L->B->grad, dy, xa, R, r, L->out, s));
  vl_tensor_free(c, xa);
  VL_TRY(vl_tensor_alloc2(c, dxa, L->acts, VL_MEM_TEMP, R, r)); // (R, r) s dy B
  vl_gemm g = {.ta = false, .tb = false, .M = R, .N = r, .K = L->out, .alpha = s, .beta = 0.0f,
               .A = dy, .lda = L->out, .B = &L->B->w, .ldb = r, .C = dxa, .ldc = r, .batch = 1};
  VL_TRY(vl_gemm_run(c, &g));
  VL_TRY(vl_linear_bwd_w(c, &L->A->grad, dxa, x, R, L->in, r, 1.0f));
  if (dx) VL_TRY(vl_linear_bwd_x(c, dx, dxa, &L->A->w, R, L->in, r, 1.0f));
  vl_tensor_free(c, dxa);
  return VL_OK;
}

vl_status sd_lora_add(vl_ctx *c, vl_sd_params *t, const char *name, int64_t rows, int64_t cols,
                      vl_dtype dtype, vl_sd_init init, float a) {
  if (strlen(name) >= sizeof t->p[0].name)
    return vl_fail(c, VL_ERR_INVALID, "parameter name too long: %s", name);
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 64;
    vl_param *np = realloc(t->p, (size_t)cap * sizeof *np);
    if (!np) return vl_fail(c, VL_ERR_OOM, "LoRA parameter table");
    t->p = np;
    vl_sd_pinfo *ni = realloc(t->info, (size_t)cap * sizeof *ni);
    if (!ni) return vl_fail(c, VL_ERR_OOM, "LoRA parameter table");
    t->info = ni;
    t->cap = cap;
  }
  t->info[t->n] = (vl_sd_pinfo){.ndim = 2, .d = {rows, cols}, .init = init, .a = a};
  vl_status s = vl_param_alloc(c, &t->p[t->n], name, rows, cols, dtype, true);
  t->n++; /* counted even on failure: vl_sd_params_free releases what was allocated */
  return s;
}
