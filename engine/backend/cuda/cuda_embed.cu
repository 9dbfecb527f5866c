/* CUDA backend, token and timestep embeddings: grid-stride kernels over the
 * single-source bodies of engine/kernels/embed.h, the same bodies the CPU backend loops over
 * (cpu_embed.c). Arguments are checked by the operation's descriptor (engine/backend/ops.c)
 * before a kernel runs. */
#include <math.h>

#include "cuda_internal.h"
#include "../../kernels/embed.h"

__global__ void k_embed_fwd(void *out, int odt, const void *wte, int wdt, const int32_t *tok,
                            int64_t C, int64_t n) {
  GRID_STRIDE(i, n) vl_k_embed_fwd(out, odt, wte, wdt, tok, C, i);
}
__global__ void k_embed_bwd(void *dw, int wdt, const void *dout, int odt, const int32_t *tok,
                            int64_t R, int64_t C) {
  GRID_STRIDE(k, C) vl_k_embed_bwd_col(dw, wdt, dout, odt, tok, R, C, k);
}

static vl_status cu_embed_fwd(vl_ctx *c, vl_tensor *out, const vl_tensor *wte, const vl_tensor *ids,
                              int64_t R, int64_t C) {
  if (R <= 0 || C <= 0) return VL_OK;
  /* ids: device memory (the step's VL_MEM_DATA tensor) */
  const int32_t *tok = (const int32_t *)ids->data;
  LAUNCH(c, st(c), R * C, VL_THREADS, k_embed_fwd, out->data, dt(out), wte->data, dt(wte), tok, C,
         R * C);
  return VL_OK;
}

static vl_status cu_embed_bwd(vl_ctx *c, vl_tensor *dw, const vl_tensor *dout, const vl_tensor *ids,
                              int64_t R, int64_t C) {
  if (R <= 0 || C <= 0) return VL_OK;
  const int32_t *tok = (const int32_t *)ids->data;
  /* one thread per column, rows in order: deterministic without atomics (as on CPU) */
  LAUNCH(c, st(c), C, VL_ROW_THREADS, k_embed_bwd, dw->data, dt(dw), dout->data, dt(dout), tok, R,
         C);
  return VL_OK;
}

static vl_status op_embed_fwd(vl_ctx *c, const void *p) {
  ARGS(vl_embed_fwd_args);
  return cu_embed_fwd(c, a->out, a->wte, a->tok, a->R, a->C);
}
static vl_status op_embed_bwd(vl_ctx *c, const void *p) {
  ARGS(vl_embed_bwd_args);
  return cu_embed_bwd(c, a->dwte, a->dout, a->tok, a->R, a->C);
}

__global__ void k_timestep(void *emb, int edt, const int32_t *t, int64_t dim, int flip,
                           float shift, float max_period, int64_t n) {
  GRID_STRIDE(i, n) vl_k_timestep_embed(emb, edt, t, dim, flip, shift, max_period, i);
}

static vl_status op_timestep_embed(vl_ctx *c, const void *p) {
  ARGS(vl_timestep_embed_args);
  int64_t n = a->B * a->dim;
  if (n > 0)
    LAUNCH(c, st(c), n, VL_THREADS, k_timestep, a->emb->data, dt(a->emb),
           (const int32_t *)a->t->data, a->dim, a->flip_sin_to_cos ? 1 : 0, a->shift,
           a->max_period, n);
  return VL_OK;
}

void vl_cuda_embed_ops(vl_backend *b) {
  b->ops[VL_OP_EMBED_FWD] = op_embed_fwd;
  b->ops[VL_OP_EMBED_BWD] = op_embed_bwd;
  b->ops[VL_OP_TIMESTEP_EMBED] = op_timestep_embed;
}
