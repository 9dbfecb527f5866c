/* The data-parallel wrapper as a vl_model (vramlab/ddp.h): creation (the inner model, its
 * trainable slots, buckets or ZeRO-1's flat buffer, the broadcast of every parameter from
 * rank 0), the single and DDP steps, stats, and the table. The DataParallel-style
 * baseline is in ddp_dp.c, ZeRO-1 in zero1.c, the buckets' reducer in ddp_reduce.c. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_impl.h"

/* ---- configuration ---------------------------------------------------------------------- */

static vl_status check_cfg(vl_ctx *c, const vl_dist_cfg *k) {
  if (!k || !k->inner) return vl_fail(c, VL_ERR_INVALID, "dist: no inner model type");
  if ((unsigned)k->mode >= VL_DIST_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "dist: unknown mode %d", (int)k->mode);
  if (k->world < 1 || k->rank < 0 || k->rank >= k->world)
    return vl_fail(c, VL_ERR_INVALID, "dist: rank %d of world %d", k->rank, k->world);
  if (k->mode != VL_DIST_SINGLE && !k->inner->train_state)
    return vl_fail(c, VL_ERR_UNSUPPORTED,
                   "dist %s: model %s does not hand out its parameters (no train_state): "
                   "it cannot be trained data-parallel", vl_dist_mode_name(k->mode), k->inner->name);
  if (c->plan || k->mode == VL_DIST_SINGLE) return VL_OK;
  if (!k->comm) {
    if (k->world > 1)
      return vl_fail(c, VL_ERR_INVALID, "dist %s: world %d needs a communicator",
                     vl_dist_mode_name(k->mode), k->world);
    return VL_OK;
  }
  if (vl_comm_size(k->comm) != k->world || vl_comm_rank(k->comm) != k->rank)
    return vl_fail(c, VL_ERR_INVALID,
                   "dist: config says rank %d of %d, the communicator rank %d of %d", k->rank,
                   k->world, vl_comm_rank(k->comm), vl_comm_size(k->comm));
  vl_comm_kind kind = vl_comm_kind_of(k->comm);
  if (kind == VL_COMM_NCCL && c->device != VL_DEV_CUDA)
    return vl_fail(c, VL_ERR_INVALID, "dist: an NCCL communicator needs a CUDA context");
  if (kind == VL_COMM_MPI && c->device == VL_DEV_CUDA)
    return vl_fail(c, VL_ERR_UNSUPPORTED,
                   "dist: the MPI communicator moves host buffers; a CUDA context needs NCCL");
  if (kind == VL_COMM_NCCL && k->mode == VL_DIST_DP)
    return vl_fail(c, VL_ERR_UNSUPPORTED,
                   "dist dp: the batch scatter moves host buffers; run the DataParallel-style "
                   "baseline on MPI ranks");
  return VL_OK;
}

/* ---- creation ------------------------------------------------------------------------------ */

/* Trainable parameters that have a gradient, in parameter order. */
static vl_status make_slots(vl_dist *d) {
  int n = d->ts.n;
  d->slot_of = malloc((size_t)(n ? n : 1) * sizeof *d->slot_of);
  d->tidx = malloc((size_t)(n ? n : 1) * sizeof *d->tidx);
  if (!d->slot_of || !d->tidx)
    return vl_fail(d->c, VL_ERR_OOM, "host memory for %d parameter slots", n);
  for (int i = 0; i < n; i++) {
    const vl_param *p = &d->ts.p[i];
    d->slot_of[i] = -1;
    if (!p->trainable || p->rows * p->cols <= 0) continue;
    d->slot_of[i] = d->nt;
    d->tidx[d->nt++] = i;
  }
  int m = d->nt ? d->nt : 1;
  d->off = calloc((size_t)m, sizeof *d->off);
  d->bucket_of = calloc((size_t)m, sizeof *d->bucket_of);
  d->nready = calloc((size_t)m, sizeof *d->nready);
  d->border = calloc((size_t)m, sizeof *d->border);
  if (!d->off || !d->bucket_of || !d->nready || !d->border)
    return vl_fail(d->c, VL_ERR_OOM, "host memory for %d parameter slots", d->nt);
  if (!d->nt)
    return vl_fail(d->c, VL_ERR_INVALID, "dist %s: model %s has no trainable parameter",
                   vl_dist_mode_name(d->cfg.mode), d->cfg.inner->name);
  return VL_OK;
}

/* torch DDP's _sync_module_states: every parameter (frozen ones too) from rank 0, so ranks
 * that were seeded differently start from the same model; AMP working copies refreshed
 * from the broadcast masters. (BN running statistics are not in the train state; every
 * rank makes them alike.) */
static vl_status broadcast_params(vl_dist *d) {
  if (!d->talk) return VL_OK;
  vl_ctx *c = d->c;
  vl_comm_req **req = calloc((size_t)(d->ts.n ? d->ts.n : 1), sizeof *req);
  if (!req) return vl_fail(c, VL_ERR_OOM, "host memory for %d broadcasts", d->ts.n);
  vl_status s = VL_OK;
  for (int i = 0; s == VL_OK && i < d->ts.n; i++) {
    vl_param *p = &d->ts.p[i];
    vl_tensor *t = p->trainable ? vl_dist_truth(p) : &p->w;
    if (!t->n || !t->data) continue;
    s = vl_comm_bcast(d->comm, c, t->data, t->n, t->dtype, 0, &req[i]);
  }
  for (int i = 0; i < d->ts.n; i++) {
    vl_status w = vl_comm_wait(d->comm, c, req[i]);
    if (s == VL_OK) s = w;
  }
  free(req);
  for (int i = 0; s == VL_OK && i < d->ts.n; i++) {
    vl_param *p = &d->ts.p[i];
    if (p->trainable && p->has_master)
      s = vl_convert_run(c, &(vl_convert_args){.y = &p->w, .x = &p->master, .n = p->w.n});
  }
  return s;
}

/* torch DDP's broadcast_buffers (its default): rank 0's buffers (the U-Net's BN running
 * statistics) to every rank before each forward, so they never drift apart. */
vl_status vl_dist_sync_buffers(vl_dist *d) {
  if (!d->talk || !d->ts.n_buffers) return VL_OK;
  int n = d->ts.n_buffers;
  vl_comm_req **req = calloc((size_t)n, sizeof *req);
  if (!req) return vl_fail(d->c, VL_ERR_OOM, "host memory for %d broadcasts", n);
  double t0 = vl_now();
  vl_status s = VL_OK;
  for (int i = 0; s == VL_OK && i < n; i++) {
    vl_tensor *t = d->ts.buffers[i];
    if (!t->n || !t->data) continue;
    s = vl_comm_bcast(d->comm, d->c, t->data, t->n, t->dtype, 0, &req[i]);
    d->st.bytes += d->rank == 0 ? (double)t->bytes * (d->world - 1) : 0;
  }
  for (int i = 0; i < n; i++) {
    vl_status w = vl_dist_wait(d, req[i], false);
    if (s == VL_OK) s = w;
  }
  d->st.comm_s += vl_now() - t0;
  free(req);
  return s;
}

static void dist_destroy(void *state);

static vl_status dist_create(vl_ctx *c, const void *cfg, const vl_model_opts *o, uint64_t seed,
                             void **state) {
  const vl_dist_cfg *k = cfg;
  *state = NULL;
  VL_TRY(check_cfg(c, k));
  vl_dist *d = calloc(1, sizeof *d);
  if (!d) return vl_fail(c, VL_ERR_OOM, "host memory for the dist wrapper");
  d->c = c;
  d->cfg = *k;
  d->world = k->world;
  d->rank = k->rank;
  d->comm = c->plan ? NULL : k->comm;
  d->talk = d->comm && d->world > 1 && k->mode != VL_DIST_SINGLE;
  /* ZeRO-1 allocates its optimizer shard itself; DP's replicas never update (rank 0 does) */
  vl_model_opts io = *o;
  io.optim_state_elsewhere |= k->mode == VL_DIST_ZERO1 || (k->mode == VL_DIST_DP && k->rank != 0);
  vl_status s = vl_model_create_ex(c, k->inner, k->inner_cfg, &io, seed, &d->inner);
  if (s == VL_OK && k->mode != VL_DIST_SINGLE) s = vl_model_train_state(d->inner, &d->ts);
  if (s == VL_OK && k->mode != VL_DIST_SINGLE) s = make_slots(d);
  if (s == VL_OK && (k->mode == VL_DIST_DDP || k->mode == VL_DIST_DP)) s = vl_dist_make_buckets(d);
  if (s == VL_OK && k->mode == VL_DIST_ZERO1) s = vl_dist_zero_make(d);
  if (s == VL_OK && d->talk && vl_comm_kind_of(d->comm) == VL_COMM_NCCL)
    s = vl_tensor_alloc2(c, &d->xbuf, VL_I32, VL_MEM_COMM, d->world, 2 * VL_DIST_XMAX);
  if (s == VL_OK) s = broadcast_params(d);
  if (s == VL_OK) s = vl_dist_sync_buffers(d);
  if (s == VL_OK) memset(&d->st, 0, offsetof(vl_dist_stats, n_buckets)); /* steps only */
  if (s != VL_OK) {
    dist_destroy(d);
    return s;
  }
  *state = d;
  return VL_OK;
}

static void dist_destroy(void *state) {
  vl_dist *d = state;
  if (!d) return;
  vl_ctx *c = d->c;
  if (c->grad_hook_user == d) {
    c->grad_hook = NULL;
    c->grad_hook_user = NULL;
  }
  vl_model_destroy(d->inner); /* gradient views into buckets are not owned: left alone */
  vl_tensor_free(c, &d->xbuf);
  vl_dist_zero_free(d);
  if (d->b) vl_dist_free_buckets(d);
  free(d->b);
  free(d->slot_of);
  free(d->tidx);
  free(d->off);
  free(d->bucket_of);
  free(d->nready);
  free(d->border);
  free(d);
}

/* ---- the table --------------------------------------------------------------------------- */

static void dist_params(const void *state, vl_param_counts *out) {
  const vl_dist *d = state;
  vl_model_params(d->inner, out);
}

/* The batch this rank passes to fwd_bwd: B samples; dp: the global batch of world * B. */
static void dist_plan_batch(const void *cfg, int64_t B, vl_batch *out) {
  const vl_dist_cfg *k = cfg;
  int64_t g = k->mode == VL_DIST_DP ? B * (k->world > 0 ? k->world : 1) : B;
  k->inner->plan_batch(k->inner_cfg, g, out);
}

static vl_status single_fwd_bwd(vl_dist *d, const vl_batch *mb, int n, vl_step_info *info) {
  double t0 = vl_dist_now(d);
  vl_status s = vl_model_fwd_bwd(d->inner, mb, n, info);
  double dt = vl_dist_now(d) - t0;
  d->st.compute_s += dt;
  d->st.step_s += dt;
  return s;
}

static vl_status ddp_fwd_bwd(vl_dist *d, const vl_batch *mb, int n, vl_step_info *info) {
  double t0 = vl_dist_now(d);
  VL_TRY(vl_dist_sync_buffers(d));
  vl_dist_step_begin(d, n, d->cfg.overlap);
  vl_status s = vl_model_fwd_bwd(d->inner, mb, n, info);
  vl_dist_step_hook_off(d);
  double t1 = vl_dist_now(d);
  d->st.compute_s += t1 - t0;
  if (s == VL_OK) s = vl_dist_launch_rest(d);
  if (s == VL_OK) s = vl_dist_wait_buckets(d);
  if (s == VL_OK) s = vl_dist_agree(d, info);
  /* skipped (an fp16 overflow on some rank): the reduced gradients hold its infs */
  if (s == VL_OK)
    s = info->skipped ? vl_params_zero_grads(d->c, d->ts.p, d->ts.n) : vl_dist_copy_back(d);
  d->st.step_s += vl_dist_now(d) - t0;
  return s;
}

static vl_status dist_fwd_bwd(void *state, const vl_batch *mb, int n, vl_step_info *info) {
  vl_dist *d = state;
  memset(info, 0, sizeof *info);
  if (n < 1) return vl_fail(d->c, VL_ERR_INVALID, "need at least one micro-batch");
  d->st.steps++;
  switch (d->cfg.mode) {
    case VL_DIST_DDP: return ddp_fwd_bwd(d, mb, n, info);
    case VL_DIST_DP: return vl_dist_dp_fwd_bwd(d, mb, n, info);
    case VL_DIST_ZERO1: return vl_dist_zero_fwd_bwd(d, mb, n, info);
    default: return single_fwd_bwd(d, mb, n, info);
  }
}

static vl_status dist_apply(void *state, vl_step_info *info) {
  vl_dist *d = state;
  if (d->cfg.mode == VL_DIST_DP) return vl_dist_dp_apply(d, info);
  if (d->cfg.mode == VL_DIST_ZERO1) return vl_dist_zero_apply(d, info);
  /* single and DDP: every rank holds the averaged gradients and updates alike */
  double t0 = vl_dist_now(d);
  vl_status s = vl_model_apply(d->inner, info);
  double dt = vl_dist_now(d) - t0;
  d->st.compute_s += dt;
  d->st.step_s += dt;
  return s;
}

static vl_status dist_predict(void *state, const vl_batch *b, int32_t *pred) {
  vl_dist *d = state;
  return vl_model_predict(d->inner, b, pred);
}

/* The replica's state is the model's for single and DDP; ZeRO-1 and DP hold optimizer
 * state on some ranks only, which a resume from one rank cannot restore. */
static vl_status dist_train_state(void *state, vl_train_state *out) {
  vl_dist *d = state;
  if (d->cfg.mode == VL_DIST_SINGLE || d->cfg.mode == VL_DIST_DDP)
    return vl_model_train_state(d->inner, out);
  return vl_fail(d->c, VL_ERR_UNSUPPORTED, "dist %s: the optimizer state is not whole on this rank",
                 vl_dist_mode_name(d->cfg.mode));
}

const vl_model_type vl_model_dist = {
    .name = "dist",
    .create = dist_create,
    .destroy = dist_destroy,
    .params = dist_params,
    .plan_batch = dist_plan_batch,
    .fwd_bwd = dist_fwd_bwd,
    .apply = dist_apply,
    .predict = dist_predict,
    .train_state = dist_train_state,
};

/* ---- stats, inner --------------------------------------------------------------------------- */

vl_status vl_dist_stats_get(const vl_model *m, vl_dist_stats *out) {
  memset(out, 0, sizeof *out);
  if (!m || m->type != &vl_model_dist) {
    if (m) return vl_fail(m->c, VL_ERR_INVALID, "model %s is not a dist wrapper", m->type->name);
    return VL_ERR_INVALID;
  }
  *out = ((const vl_dist *)m->state)->st;
  return VL_OK;
}

void vl_dist_stats_reset(vl_model *m) {
  if (!m || m->type != &vl_model_dist) return;
  vl_dist *d = m->state;
  vl_dist_stats keep = d->st;
  memset(&d->st, 0, sizeof d->st);
  d->st.n_buckets = keep.n_buckets;
  memcpy(d->st.bucket_bytes, keep.bucket_bytes, sizeof keep.bucket_bytes);
}

vl_model *vl_dist_inner(vl_model *m) {
  if (!m || m->type != &vl_model_dist) return NULL;
  return ((vl_dist *)m->state)->inner;
}
