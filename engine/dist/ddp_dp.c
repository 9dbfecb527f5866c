/* The DataParallel-style baseline (vramlab/ddp.h, mode dp): torch.nn.DataParallel's
 * communication pattern over ranks. Rank 0 holds the global batch and scatters its rows;
 * every replica runs forward + backward on its shard; the gradients (in DDP's buckets)
 * are reduced (average) to rank 0, which alone clips and updates; it then broadcasts its
 * decision (skip, norm, loss scale) and the updated fp32 parameters (through the same
 * buckets, as DataParallel's replicate broadcasts them coalesced), and the replicas refresh
 * their AMP working copies. The other ranks wait meanwhile: their idle share is measured. */
#include <stdlib.h>
#include <string.h>

#include "ddp_impl.h"

/* Rows [rank * b, (rank + 1) * b) of every tensor of every micro-batch into local (host
 * buffers in bufs, the caller frees them); rank 0's data is the global batch. */
static vl_status scatter_batches(vl_dist *d, const vl_batch *mb, int n, vl_batch *local, void **bufs,
                                 vl_comm_req **req) {
  vl_ctx *c = d->c;
  for (int i = 0; i < n; i++) {
    local[i] = mb[i];
    for (int j = 0; j < mb[i].n; j++) {
      const vl_batch_tensor *t = &mb[i].t[j];
      vl_batch_tensor *o = &local[i].t[j];
      if (t->ndim < 1 || t->shape[0] < d->world || t->shape[0] % d->world)
        return vl_fail(c, VL_ERR_INVALID,
                       "dp: micro-batch %d: '%s' has %lld samples, not a multiple of the %d "
                       "ranks (every rank passes the global batch; rank 0's data is scattered)",
                       i, t->name, t->ndim ? (long long)t->shape[0] : 0LL, d->world);
      int64_t per = t->shape[0] / d->world, elems = per;
      for (int k = 1; k < t->ndim; k++) elems *= t->shape[k];
      size_t bytes = vl_dtype_bytes(t->dtype, elems);
      o->shape[0] = per;
      if (!d->talk) { /* a plan (no data) or one rank (its own rows) */
        o->data = t->data ? (const char *)t->data + (size_t)d->rank * bytes : NULL;
        continue;
      }
      if (d->rank == 0 && !t->data)
        return vl_fail(c, VL_ERR_INVALID, "dp: rank 0 has no data for '%s'", t->name);
      void *buf = malloc(bytes ? bytes : 1);
      if (!buf) return vl_fail(c, VL_ERR_OOM, "dp: host memory for a %zu-byte shard", bytes);
      bufs[i * VL_BATCH_MAX_TENSORS + j] = buf;
      o->data = buf;
      VL_TRY(vl_comm_scatter(d->comm, c, d->rank == 0 ? t->data : NULL, buf, elems, t->dtype, 0,
                             &req[i * VL_BATCH_MAX_TENSORS + j]));
      d->st.bytes += d->rank == 0 ? (double)bytes * d->world : 0;
    }
  }
  return VL_OK;
}

static vl_status dp_step(vl_dist *d, const vl_batch *mb, int n, vl_step_info *info, vl_batch *local,
                         void **bufs, vl_comm_req **req) {
  int nr = n * VL_BATCH_MAX_TENSORS;
  double t0 = vl_now();
  vl_status s = scatter_batches(d, mb, n, local, bufs, req);
  for (int i = 0; i < nr; i++) { /* every started scatter completes, even after a failure */
    vl_status w = vl_dist_wait(d, req[i], d->rank != 0);
    if (s == VL_OK) s = w;
  }
  if (d->talk) d->st.comm_s += vl_now() - t0;
  VL_TRY(s);
  VL_TRY(vl_dist_sync_buffers(d)); /* DataParallel's replicate copies them from device 0 */
  double t1 = vl_dist_now(d);
  vl_dist_step_begin(d, n, false);
  s = vl_model_fwd_bwd(d->inner, local, n, info);
  d->st.compute_s += vl_dist_now(d) - t1;
  if (s == VL_OK) s = vl_dist_launch_rest(d); /* every bucket reduced to rank 0 */
  if (s == VL_OK) s = vl_dist_wait_buckets(d);
  if (s == VL_OK) s = vl_dist_agree(d, info);
  if (s != VL_OK) return s;
  if (d->rank == 0 && !info->skipped) return vl_dist_copy_back(d);
  return vl_params_zero_grads(d->c, d->ts.p, d->ts.n); /* a replica's gradients are spent */
}

vl_status vl_dist_dp_fwd_bwd(vl_dist *d, const vl_batch *mb, int n, vl_step_info *info) {
  double t0 = vl_dist_now(d);
  int nr = n * VL_BATCH_MAX_TENSORS;
  vl_batch *local = calloc((size_t)n, sizeof *local);
  void **bufs = calloc((size_t)nr, sizeof *bufs);
  vl_comm_req **req = calloc((size_t)nr, sizeof *req);
  vl_status s = local && bufs && req ? dp_step(d, mb, n, info, local, bufs, req)
                                     : vl_fail(d->c, VL_ERR_OOM, "dp: host memory for %d micro-batches", n);
  for (int i = 0; bufs && i < nr; i++) free(bufs[i]);
  free(local);
  free(bufs);
  free(req);
  d->st.step_s += vl_dist_now(d) - t0;
  return s;
}

/* ---- apply: rank 0 updates, everyone gets its decision and parameters ------------------- */

/* Rank 0's trainable fp32 parameters to every rank through the buckets. */
static vl_status broadcast_update(vl_dist *d) {
  vl_ctx *c = d->c;
  for (int b = 0; b < d->nb; b++) {
    vl_ddp_bucket *B = &d->b[b];
    for (int i = B->first; d->rank == 0 && i < B->first + B->count; i++) {
      int s = d->border[i];
      vl_param *p = vl_dist_param(d, s);
      int64_t n = p->rows * p->cols;
      vl_tensor dst = vl_dist_span(&B->buf, d->off[s], n);
      VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &dst, .x = vl_dist_truth(p), .n = n}));
    }
    B->req = NULL;
    if (d->talk) {
      VL_TRY(vl_comm_bcast(d->comm, c, B->buf.data, B->n, VL_F32, 0, &B->req));
      d->st.bytes += d->rank == 0 ? (double)B->n * 4 * (d->world - 1) : 0;
    }
  }
  double t0 = vl_now();
  vl_status s = VL_OK;
  for (int b = 0; b < d->nb; b++) {
    vl_status w = vl_dist_wait(d, d->b[b].req, d->rank != 0);
    d->b[b].req = NULL;
    if (s == VL_OK) s = w;
  }
  if (d->talk) d->st.comm_s += vl_now() - t0;
  VL_TRY(s);
  for (int s2 = 0; d->rank != 0 && s2 < d->nt; s2++) {
    vl_param *p = vl_dist_param(d, s2);
    int64_t n = p->rows * p->cols;
    vl_tensor src = vl_dist_span(&d->b[d->bucket_of[s2]].buf, d->off[s2], n);
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = vl_dist_truth(p), .x = &src, .n = n}));
    if (p->has_master) VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &p->w, .x = &p->master,
        .n = n}));
  }
  /* with grad_as_bucket_view the buckets are the gradients: zero again */
  for (int b = 0; d->cfg.grad_as_bucket_view && b < d->nb; b++)
    VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &d->b[b].buf}));
  return VL_OK;
}

/* Rank 0's step decision to every rank: skipped, norm, scale used, and its scaler. */
static vl_status share_decision(vl_dist *d, vl_step_info *info) {
  vl_scaler *sc = d->ts.scaler;
  double v[6] = {info->skipped ? 1.0 : 0.0, info->grad_norm, info->loss_scale,
                 sc ? sc->scale : 1.0, sc ? sc->good : 0, sc ? (double)sc->t : 0};
  if (d->talk) {
    vl_comm_req *req = NULL;
    double t0 = vl_now();
    VL_TRY(vl_comm_bcast(d->comm, d->c, v, 12, VL_I32, 0, &req)); /* doubles as raw words */
    VL_TRY(vl_dist_wait(d, req, d->rank != 0));
    d->st.comm_s += vl_now() - t0;
  }
  info->skipped = v[0] != 0;
  info->grad_norm = v[1];
  info->loss_scale = (float)v[2];
  if (sc) {
    sc->scale = (float)v[3];
    sc->good = (int)v[4];
    sc->t = (int64_t)v[5];
  }
  return VL_OK;
}

vl_status vl_dist_dp_apply(vl_dist *d, vl_step_info *info) {
  double t0 = vl_dist_now(d);
  vl_status s;
  if (d->rank == 0) {
    s = vl_model_apply(d->inner, info);
    d->st.compute_s += vl_dist_now(d) - t0;
  } else {
    s = vl_dist_inner_bookkeeping(d); /* a replica keeps no optimizer state */
  }
  if (s == VL_OK) s = share_decision(d, info);
  if (s == VL_OK && !info->skipped) s = broadcast_update(d);
  d->st.step_s += vl_dist_now(d) - t0;
  return s;
}
