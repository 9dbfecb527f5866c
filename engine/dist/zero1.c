/* ZeRO stage 1 (vramlab/ddp.h): every gradient is a view into one flat fp32 buffer
 * (VL_MEM_COMM) padded to a multiple of the ranks (vl_zero_layout); after backward it is
 * reduce-scattered (average), so this rank holds the averaged gradients of its shard;
 * optimizer state exists only for the parameter slices inside the shard (AdamW and SGD
 * are elementwise, so a slice updates exactly as the whole would); the global gradient
 * norm is the sum of the shards' sums of squares (rank order, the same on every rank);
 * the updated fp32 values are all-gathered through the same flat buffer (the gradients
 * are spent by then: no extra bytes) and copied into the parameters, whose AMP working
 * copies are then refreshed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_impl.h"

static int n_states(const vl_optim_cfg *oc) { return oc->opt == VL_OPT_ADAMW ? 2 : 1; }

vl_status vl_dist_zero_make(vl_dist *d) {
  vl_ctx *c = d->c;
  const vl_optim_cfg *oc = d->ts.optim;
  if (!oc || !d->ts.scaler)
    return vl_fail(c, VL_ERR_INVALID, "zero1: model %s hands out no optimizer or loss scaler",
                   d->cfg.inner->name);
  if (oc->opt != VL_OPT_ADAMW && oc->opt != VL_OPT_SGD)
    return vl_fail(c, VL_ERR_UNSUPPORTED,
                   "zero1: optimizer %s is not elementwise (Adafactor factors its second moment "
                   "per matrix row and column), so its state cannot be split into shards; "
                   "ZeRO-1 runs AdamW and SGD", vl_optimizer_name(oc->opt));
  d->total = 0;
  for (int s = 0; s < d->nt; s++) {
    const vl_param *p = vl_dist_param(d, s);
    d->off[s] = d->total;
    d->total += p->rows * p->cols;
  }
  vl_zero_layout(d->total, d->world, &d->padded, &d->shard);
  /* the gradients' own storage first, so the flat buffer takes its place */
  for (int s = 0; s < d->nt; s++) vl_tensor_free(c, &vl_dist_param(d, s)->grad);
  VL_TRY(vl_tensor_alloc2(c, &d->flat, VL_F32, VL_MEM_COMM, 1, d->padded));
  VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &d->flat}));
  for (int s = 0; s < d->nt; s++) {
    vl_param *p = vl_dist_param(d, s);
    int64_t shape[2] = {p->rows, p->cols};
    p->grad = vl_tensor_view(&d->flat, (size_t)d->off[s] * 4, VL_F32, 2, shape);
  }
  d->st.n_buckets = 1;
  d->st.bucket_bytes[0] = (size_t)d->padded * 4;
  /* this rank's slices and their optimizer state */
  int64_t s0 = (int64_t)d->rank * d->shard, s1 = s0 + d->shard;
  d->sl = calloc((size_t)d->nt, sizeof *d->sl);
  if (!d->sl) return vl_fail(c, VL_ERR_OOM, "host memory for %d shard slices", d->nt);
  for (int s = 0; s < d->nt; s++) {
    const vl_param *p = vl_dist_param(d, s);
    int64_t a = d->off[s], b = a + p->rows * p->cols;
    int64_t lo = a > s0 ? a : s0, hi = b < s1 ? b : s1;
    if (hi <= lo) continue;
    vl_zero_slice *z = &d->sl[d->nsl++];
    z->slot = s;
    z->lo = lo - a;
    z->len = hi - lo;
    for (int k = 0; k < n_states(oc); k++) {
      VL_TRY(vl_tensor_alloc2(c, &z->state[k], VL_F32, VL_MEM_OPTIM, 1, z->len));
      VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &z->state[k]}));
    }
  }
  return VL_OK;
}

void vl_dist_zero_free(vl_dist *d) {
  for (int i = d->nsl - 1; i >= 0; i--)
    for (int k = 1; k >= 0; k--) vl_tensor_free(d->c, &d->sl[i].state[k]);
  free(d->sl);
  d->sl = NULL;
  d->nsl = 0;
  vl_tensor_free(d->c, &d->flat);
}

/* ---- the step ------------------------------------------------------------------------------ */

vl_status vl_dist_zero_fwd_bwd(vl_dist *d, const vl_batch *mb, int n, vl_step_info *info) {
  double t0 = vl_dist_now(d);
  VL_TRY(vl_dist_sync_buffers(d));
  vl_dist_step_begin(d, n, false);
  vl_status s = vl_model_fwd_bwd(d->inner, mb, n, info);
  double t1 = vl_dist_now(d);
  d->st.compute_s += t1 - t0;
  if (s == VL_OK && d->talk) {
    /* in place: this rank's shard of the averaged gradients lands at its own offset */
    char *base = d->flat.data;
    vl_comm_req *req = NULL;
    s = vl_comm_reduce_scatter(d->comm, d->c, base, base + (size_t)d->rank * d->shard * 4,
                               d->shard, VL_F32, VL_RED_AVG, &req);
    d->st.bytes += (double)d->padded * 4;
    if (s == VL_OK) s = vl_dist_wait(d, req, false);
    d->st.comm_s += vl_now() - t1;
  }
  if (s == VL_OK) s = vl_dist_agree(d, info);
  if (s == VL_OK && info->skipped) s = vl_zero_run(d->c, &(vl_zero_args){.y = &d->flat});
  d->st.step_s += vl_dist_now(d) - t0;
  return s;
}

/* The global squared norm and "a gradient is not finite" from every rank's shard. */
static vl_status global_sumsq(vl_dist *d, double *ss, bool *bad) {
  double s1 = 0;
  bool b1 = false;
  vl_tensor shard = vl_dist_span(&d->flat, (int64_t)d->rank * d->shard, d->shard);
  VL_TRY(vl_sumsq_run(d->c, &(vl_sumsq_args){.x = &shard, .n = d->shard, .out = &s1,
                                             .nonfinite = &b1}));
  double mine[2] = {s1, b1 ? 1.0 : 0.0}, buf[2 * 64];
  double *all = d->world <= 64 ? buf : malloc((size_t)d->world * 2 * sizeof *all);
  if (!all) return vl_fail(d->c, VL_ERR_OOM, "host memory for %d ranks' norms", d->world);
  vl_status s = vl_dist_exchange(d, mine, 2, all);
  *ss = 0;
  *bad = false;
  if (!d->talk) { /* one rank (or a plan): its own shard is the whole */
    *ss = s1;
    *bad = b1;
  } else {
    for (int r = 0; r < d->world; r++) {
      *ss += all[2 * r];
      *bad |= all[2 * r + 1] != 0;
    }
  }
  if (all != buf) free(all);
  return s;
}

/* The optimizer on this rank's slices: a (1, len) parameter of views per slice. */
static vl_status update_shard(vl_dist *d, int64_t t, float grad_scale) {
  for (int i = 0; i < d->nsl; i++) {
    vl_zero_slice *z = &d->sl[i];
    vl_param *p = vl_dist_param(d, z->slot);
    vl_param v;
    memset(&v, 0, sizeof v);
    v.w = vl_dist_span(vl_dist_truth(p), z->lo, z->len);
    v.grad = vl_dist_span(&d->flat, d->off[z->slot] + z->lo, z->len);
    v.state[0] = z->state[0];
    v.state[1] = z->state[1];
    v.rows = 1;
    v.cols = z->len;
    v.trainable = true;
    VL_TRY(vl_param_update(d->c, &v, d->ts.optim, t, grad_scale));
  }
  return VL_OK;
}

/* Updated shard -> flat -> allgather -> every parameter (and its AMP working copy). */
static vl_status gather_params(vl_dist *d) {
  vl_ctx *c = d->c;
  for (int i = 0; i < d->nsl; i++) {
    vl_zero_slice *z = &d->sl[i];
    vl_param *p = vl_dist_param(d, z->slot);
    vl_tensor src = vl_dist_span(vl_dist_truth(p), z->lo, z->len);
    vl_tensor dst = vl_dist_span(&d->flat, d->off[z->slot] + z->lo, z->len);
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &dst, .x = &src, .n = z->len}));
  }
  if (d->talk) {
    double t0 = vl_now();
    char *base = d->flat.data;
    vl_comm_req *req = NULL;
    VL_TRY(vl_comm_allgather(d->comm, c, base + (size_t)d->rank * d->shard * 4, base, d->shard,
                             VL_F32, &req));
    d->st.bytes += (double)d->shard * 4;
    VL_TRY(vl_dist_wait(d, req, false));
    d->st.comm_s += vl_now() - t0;
  }
  for (int s = 0; s < d->nt; s++) {
    vl_param *p = vl_dist_param(d, s);
    int64_t n = p->rows * p->cols;
    vl_tensor src = vl_dist_span(&d->flat, d->off[s], n);
    VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = vl_dist_truth(p), .x = &src, .n = n}));
    if (p->has_master) VL_TRY(vl_convert_run(c, &(vl_convert_args){.y = &p->w, .x = &p->master,
        .n = n}));
  }
  return VL_OK;
}

/* vl_params_apply (engine/nn/train.c) with the norm, the update and the parameters split
 * across ranks; the scaler's decisions are the same on every rank. */
static vl_status zero_apply(vl_dist *d, vl_step_info *info) {
  vl_ctx *c = d->c;
  vl_scaler *sc = d->ts.scaler;
  info->skipped = false;
  info->grad_norm = 0;
  info->loss_scale = sc->scale;
  double ss;
  bool bad;
  VL_TRY(global_sumsq(d, &ss, &bad));
  float ls = sc->scale;
  if (bad) {
    VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &d->flat}));
    if (!sc->fp16) return vl_fail(c, VL_ERR_NUMERIC, "non-finite gradient without fp16 loss scaling");
    info->skipped = true;
    return vl_scaler_skip(c, d->ts.p, d->ts.n, sc);
  }
  double norm = sqrt(ss) / ls;
  info->grad_norm = norm;
  float coef = 1.0f;
  if (d->ts.clip > 0 && norm > d->ts.clip) coef = (float)(d->ts.clip / (norm + 1e-6));
  sc->t++;
  vl_status s = update_shard(d, sc->t, coef / ls);
  if (s == VL_OK) s = gather_params(d);
  if (s == VL_OK && sc->fp16 && ++sc->good >= sc->window) {
    sc->scale = ls * 2.0f;
    sc->good = 0;
  }
  vl_status z = vl_zero_run(c, &(vl_zero_args){.y = &d->flat}); /* the gradients, zeroed */
  return s != VL_OK ? s : z;
}

vl_status vl_dist_zero_apply(vl_dist *d, vl_step_info *info) {
  double t0 = vl_dist_now(d), e0 = d->st.exposed_s;
  vl_status s = zero_apply(d, info);
  if (s == VL_OK) s = vl_dist_inner_bookkeeping(d);
  double dt = vl_dist_now(d) - t0;
  d->st.compute_s += dt - (d->st.exposed_s - e0); /* the norm and allgather waits apart */
  d->st.step_s += dt;
  return s;
}
