/* DDP's reducer (what torch's C++ Reducer does, over our hook): gradient buckets laid out
 * by PyTorch's assignment, the grad-ready hook that copies a final gradient into its bucket
 * and starts the buckets whose gradients are all final, in bucket order (so every rank
 * starts the same collectives in the same order), the waits with their timing, and the
 * small exchanges every mode needs after backward (loss, fp16 skip). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_impl.h"

vl_tensor vl_dist_span(const vl_tensor *t, int64_t e0, int64_t n) {
  int64_t shape[2] = {1, n};
  return vl_tensor_view(t, (size_t)e0 * 4, VL_F32, 2, shape);
}

double vl_dist_now(vl_dist *d) {
  if (!d->c->plan && d->c->device == VL_DEV_CUDA && d->c->be->sync) d->c->be->sync(d->c);
  return vl_now();
}

/* ---- layout ------------------------------------------------------------------------------- */

vl_status vl_dist_make_buckets(vl_dist *d) {
  vl_ctx *c = d->c;
  size_t *bytes = malloc((size_t)(d->nt ? d->nt : 1) * sizeof *bytes);
  if (!bytes) return vl_fail(c, VL_ERR_OOM, "host memory for %d bucket sizes", d->nt);
  for (int s = 0; s < d->nt; s++) {
    const vl_param *p = vl_dist_param(d, s);
    bytes[s] = (size_t)(p->rows * p->cols) * 4; /* fp32 gradients */
  }
  d->nb = vl_ddp_assign_buckets(bytes, d->nt, d->cfg.first_bucket_cap, d->cfg.bucket_cap,
                                d->bucket_of);
  free(bytes);
  d->b = calloc((size_t)(d->nb ? d->nb : 1), sizeof *d->b);
  if (!d->b) return vl_fail(c, VL_ERR_OOM, "host memory for %d buckets", d->nb);
  /* slots bucket by bucket, ascending parameter order inside a bucket (torch's layout) */
  int k = 0;
  for (int b = 0; b < d->nb; b++) {
    d->b[b].first = k;
    int64_t e = 0;
    for (int s = 0; s < d->nt; s++) {
      if (d->bucket_of[s] != b) continue;
      const vl_param *p = vl_dist_param(d, s);
      d->border[k++] = s;
      d->off[s] = e;
      e += p->rows * p->cols;
    }
    d->b[b].count = k - d->b[b].first;
    d->b[b].n = e;
  }
  /* grad_as_bucket_view: the gradients' own storage goes first, so the buckets take its
   * place and the step holds no second copy */
  if (d->cfg.grad_as_bucket_view)
    for (int s = 0; s < d->nt; s++) vl_tensor_free(c, &vl_dist_param(d, s)->grad);
  for (int b = 0; b < d->nb; b++) {
    vl_ddp_bucket *B = &d->b[b];
    VL_TRY(vl_tensor_alloc2(c, &B->buf, VL_F32, VL_MEM_COMM, 1, B->n));
    VL_TRY(vl_zero_run(c, &(vl_zero_args){.y = &B->buf}));
    if (b < 64) d->st.bucket_bytes[b] = (size_t)B->n * 4;
    if (!d->cfg.grad_as_bucket_view) continue;
    for (int i = B->first; i < B->first + B->count; i++) {
      vl_param *p = vl_dist_param(d, d->border[i]);
      int64_t shape[2] = {p->rows, p->cols};
      p->grad = vl_tensor_view(&B->buf, (size_t)d->off[d->border[i]] * 4, VL_F32, 2, shape);
    }
  }
  d->st.n_buckets = d->nb;
  return VL_OK;
}

void vl_dist_free_buckets(vl_dist *d) {
  for (int b = d->nb - 1; b >= 0; b--) vl_tensor_free(d->c, &d->b[b].buf);
}

/* ---- launching ------------------------------------------------------------------------------- */

/* Gradient of slot s into its bucket (a counted copy; nothing with grad_as_bucket_view). */
static vl_status copy_in(vl_dist *d, int s) {
  if (d->cfg.grad_as_bucket_view) return VL_OK;
  vl_param *p = vl_dist_param(d, s);
  int64_t n = p->rows * p->cols;
  vl_tensor dst = vl_dist_span(&d->b[d->bucket_of[s]].buf, d->off[s], n);
  return vl_convert_run(d->c, &(vl_convert_args){.y = &dst, .x = &p->grad, .n = n});
}

/* Start bucket b's collective: allreduce (average) for DDP, reduce to rank 0 for DP. */
static vl_status launch(vl_dist *d, int b) {
  vl_ddp_bucket *B = &d->b[b];
  B->launched = true;
  B->t_start = vl_now();
  if (!d->talk) return VL_OK;
  void *buf = B->buf.data;
  d->st.bytes += (double)B->n * 4;
  if (d->cfg.mode == VL_DIST_DP)
    return vl_comm_reduce(d->comm, d->c, buf, buf, B->n, VL_F32, VL_RED_AVG, 0, &B->req);
  return vl_comm_allreduce(d->comm, d->c, buf, buf, B->n, VL_F32, VL_RED_AVG, &B->req);
}

/* Buckets start in order, as torch's Reducer does: bucket b only after 0..b-1. */
static vl_status launch_ready(vl_dist *d) {
  while (d->next_launch < d->nb && d->b[d->next_launch].ready == d->b[d->next_launch].count)
    VL_TRY(launch(d, d->next_launch++));
  return VL_OK;
}

/* Note completions that happened meanwhile (their end time) and let MPI progress them. */
static void poll_buckets(vl_dist *d) {
  if (!d->talk) return;
  vl_comm_progress(d->comm);
  for (int b = 0; b < d->next_launch; b++) {
    vl_ddp_bucket *B = &d->b[b];
    bool done = false;
    if (B->req && !B->seen_done && vl_comm_test(d->comm, d->c, B->req, &done) == VL_OK && done) {
      B->seen_done = true;
      B->t_done = vl_now();
    }
  }
}

static void on_grad_ready(void *user, const vl_param *p) {
  vl_dist *d = user;
  ptrdiff_t i = p - d->ts.p;
  if (i < 0 || i >= d->ts.n || d->slot_of[i] < 0 || d->hook_status != VL_OK) return;
  int s = d->slot_of[i];
  if (++d->nready[s] != d->n_micro) return; /* final in the last micro-batch only */
  vl_status st = copy_in(d, s);
  d->b[d->bucket_of[s]].ready++;
  if (st == VL_OK) st = launch_ready(d);
  if (st != VL_OK) {
    d->hook_status = st;
    snprintf(d->hook_err, sizeof d->hook_err, "%s", d->c->err);
    return;
  }
  poll_buckets(d);
}

void vl_dist_step_begin(vl_dist *d, int n_micro, bool hook) {
  d->n_micro = n_micro;
  d->next_launch = 0;
  d->hook_status = VL_OK;
  d->hook_err[0] = 0;
  memset(d->nready, 0, (size_t)(d->nt ? d->nt : 1) * sizeof *d->nready);
  for (int b = 0; b < d->nb; b++) {
    vl_ddp_bucket *B = &d->b[b];
    B->ready = 0;
    B->launched = B->seen_done = false;
    B->req = NULL;
  }
  d->hooked = hook;
  if (hook) {
    d->c->grad_hook = on_grad_ready;
    d->c->grad_hook_user = d;
  }
}

void vl_dist_step_hook_off(vl_dist *d) {
  if (!d->hooked) return;
  d->c->grad_hook = NULL;
  d->c->grad_hook_user = NULL;
  d->hooked = false;
}

vl_status vl_dist_launch_rest(vl_dist *d) {
  if (d->hook_status != VL_OK) return vl_fail(d->c, d->hook_status, "%s", d->hook_err);
  for (int s = 0; s < d->nt; s++) {
    if (d->nready[s] == d->n_micro) continue; /* copied by the hook */
    VL_TRY(copy_in(d, s));
    d->nready[s] = d->n_micro;
    d->b[d->bucket_of[s]].ready++;
  }
  return launch_ready(d);
}

/* ---- completion ------------------------------------------------------------------------------ */

vl_status vl_dist_wait(vl_dist *d, vl_comm_req *r, bool idle) {
  if (!r) return VL_OK;
  double t0 = vl_now();
  vl_status s = vl_comm_wait(d->comm, d->c, r);
  double dt = vl_now() - t0;
  d->st.exposed_s += dt;
  if (idle) d->st.idle_s += dt;
  return s;
}

vl_status vl_dist_wait_buckets(vl_dist *d) {
  vl_status first = VL_OK;
  for (int b = 0; b < d->nb; b++) {
    vl_ddp_bucket *B = &d->b[b];
    if (!B->launched) continue;
    vl_status s = vl_dist_wait(d, B->req, false);
    B->req = NULL;
    if (!B->seen_done) B->t_done = vl_now();
    if (d->talk) d->st.comm_s += B->t_done - B->t_start;
    if (s != VL_OK && first == VL_OK) first = s;
  }
  return first;
}

vl_status vl_dist_copy_back(vl_dist *d) {
  if (d->cfg.grad_as_bucket_view) return VL_OK;
  for (int s = 0; s < d->nt; s++) {
    vl_param *p = vl_dist_param(d, s);
    int64_t n = p->rows * p->cols;
    vl_tensor src = vl_dist_span(&d->b[d->bucket_of[s]].buf, d->off[s], n);
    VL_TRY(vl_convert_run(d->c, &(vl_convert_args){.y = &p->grad, .x = &src, .n = n}));
  }
  return VL_OK;
}

/* ---- small exchanges ------------------------------------------------------------------------- */

vl_status vl_dist_exchange(vl_dist *d, const double *mine, int k, double *all) {
  if (!d->talk) {
    for (int r = 0; r < d->world; r++) memcpy(all + (size_t)r * k, mine, (size_t)k * sizeof *mine);
    return VL_OK;
  }
  double t0 = vl_now();
  vl_status s;
  int64_t words = 2 * k; /* doubles moved as raw 32-bit words: no reduction touches them */
  if (d->xbuf.n) { /* NCCL: device memory */
    size_t nb = (size_t)k * sizeof *mine;
    s = d->c->be->upload(d->c, &d->xbuf, (size_t)d->rank * nb, mine, nb);
    char *base = d->xbuf.data;
    if (s == VL_OK)
      s = vl_comm_allgather(d->comm, d->c, base + (size_t)d->rank * nb, base, words, VL_I32, NULL);
    if (s == VL_OK) s = d->c->be->download(d->c, all, &d->xbuf, 0, nb * (size_t)d->world);
  } else {
    memcpy(all + (size_t)d->rank * k, mine, (size_t)k * sizeof *mine);
    s = vl_comm_allgather(d->comm, d->c, all + (size_t)d->rank * k, all, words, VL_I32, NULL);
  }
  double dt = vl_now() - t0;
  d->st.exposed_s += dt;
  d->st.comm_s += dt;
  d->st.bytes += (double)k * 8;
  return s;
}

vl_status vl_dist_agree(vl_dist *d, vl_step_info *info) {
  double mine[3] = {info->loss * (double)info->n_targets, (double)info->n_targets,
                    info->skipped ? 1.0 : 0.0};
  double all[3 * 64];
  double *buf = d->world <= 64 ? all : malloc((size_t)d->world * 3 * sizeof *buf);
  if (!buf) return vl_fail(d->c, VL_ERR_OOM, "host memory for %d ranks' losses", d->world);
  vl_status s = vl_dist_exchange(d, mine, 3, buf);
  double lsum = 0, n = 0;
  bool skip = false;
  for (int r = 0; s == VL_OK && r < d->world; r++) { /* rank order: the same sum everywhere */
    lsum += buf[3 * r];
    n += buf[3 * r + 1];
    skip |= buf[3 * r + 2] != 0;
  }
  if (buf != all) free(buf);
  VL_TRY(s);
  if (d->world > 1 && d->talk) { /* one rank: its own numbers, bit for bit */
    info->n_targets = (int64_t)n;
    info->loss = n > 0 ? lsum / n : 0;
  }
  if (skip && !info->skipped) {
    /* another rank's loss overflowed (fp16): skip here too, as GradScaler does when the
     * allreduced gradients hold its infs */
    info->skipped = true;
    VL_TRY(vl_scaler_skip(d->c, d->ts.p, d->ts.n, d->ts.scaler));
  }
  return VL_OK;
}

vl_status vl_dist_inner_bookkeeping(vl_dist *d) {
  vl_model_step_end(d->inner);
  return VL_OK;
}
