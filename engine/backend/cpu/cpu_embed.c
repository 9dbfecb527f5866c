/* CPU backend, token and timestep embeddings: OpenMP loops over the single-source bodies of
 * engine/kernels/embed.h. Arguments are checked by the operation's descriptor
 * (engine/backend/ops.c) before a kernel runs, on every backend. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "../../kernels/embed.h"

static vl_status cpu_embed_fwd(vl_ctx *c, const void *p) {
  const vl_embed_fwd_args *a = p;
  int64_t R = a->R, C = a->C;
  vl_tensor *out = a->out;
  const vl_tensor *wte = a->wte;
  const int32_t *tok = a->tok ? a->tok->data : NULL;
  int nt = vl_cpu_threads((double)(R * C) * NS_MEM);
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < R * C; i++)
    vl_k_embed_fwd(out->data, dt(out), wte->data, dt(wte), tok, C, i);
  return VL_OK;
}

/* dwte by blocks of COLS columns, each block's rows in order: per column the adds of
 * vl_k_embed_bwd_col in its order, reading rows instead of striding down columns. */
#define EMBED_BWD(WD, OD)                                                                  \
  _Pragma("omp parallel for num_threads(nt) if (nt > 1)") for (int64_t b = 0; b < nb; b++) { \
    int64_t c0 = b * COLS, c1 = c0 + COLS < C ? c0 + COLS : C;                             \
    for (int64_t r = 0; r < R; r++)                                                        \
      for (int64_t k = c0; k < c1; k++) vl_k_embed_bwd_add(pw, WD, po, OD, tok, C, r, k);  \
  }
static vl_status cpu_embed_bwd(vl_ctx *c, const void *p) {
  const vl_embed_bwd_args *a = p;
  int64_t R = a->R, C = a->C, nb = (C + COLS - 1) / COLS;
  void *pw = a->dwte->data;
  const void *po = a->dout->data;
  const int32_t *tok = a->tok ? a->tok->data : NULL;
  int nt = vl_cpu_threads((double)(R * C) * NS_MEM);
  if (a->dwte->dtype == VL_F32 && a->dout->dtype == VL_F32) EMBED_BWD(F32, F32)
  else EMBED_BWD(dt(a->dwte), dt(a->dout))
  return VL_OK;
}

/* ---- timestep embedding, MSE, Gaussian sample ------------------------------------------- */

static vl_status cpu_timestep_embed(vl_ctx *c, const vl_timestep_embed_args *a) {
  int64_t n = a->B * a->dim;
  if (n == 0) return VL_OK;
  const int32_t *t = a->t->data; /* host memory on this backend */
  void *pe = a->emb->data;
  int edt = dt(a->emb), flip = a->flip_sin_to_cos ? 1 : 0;
#pragma omp parallel for num_threads(vl_cpu_threads((double)(n) * NS_ROW))
  for (int64_t i = 0; i < n; i++)
    vl_k_timestep_embed(pe, edt, t, a->dim, flip, a->shift, a->max_period, i);
  return VL_OK;
}

CPU_ENTRY(timestep_embed, vl_timestep_embed_args)

void vl_cpu_embed_ops(vl_backend *b) {
  b->ops[VL_OP_EMBED_FWD] = cpu_embed_fwd;
  b->ops[VL_OP_EMBED_BWD] = cpu_embed_bwd;
  b->ops[VL_OP_TIMESTEP_EMBED] = vl_cpu_timestep_embed;
}
