/* The modeled section's time model: one data-parallel step on n cards from the step's
 * planned FLOPs at a stated device rate and a ring allreduce over a link of a stated bus
 * bandwidth and latency. Pure functions (tests/test_multigpu_case.c checks them against
 * hand-computed values). Everything it gives is labelled "modeled" where it is written.
 *
 * Assumptions, stated in the report:
 *  - compute: flops / (peak x efficiency) on every card alike (the same per-card batch);
 *    backward is bwd_share of it (2/3: a backward costs two forwards);
 *  - ring allreduce of B bytes: 2(n-1)/n x B / busbw + 2(n-1) x latency (nccl-tests' bus
 *    bandwidth is defined so that this is the time); reduce-scatter and allgather half of it;
 *  - DDP with overlap: a bucket's allreduce starts when backward has written its last
 *    gradient, so every bucket but the last reduced hides behind backward as long as their
 *    sum fits in the backward time; the last (the first layers' gradients, ready when
 *    backward ends) is always exposed: exposed = last + max(0, others - backward);
 *    without overlap every bucket is exposed;
 *  - ZeRO-1: one reduce-scatter of the padded gradient buffer after backward and one
 *    allgather of the fp32 parameters after the update, both exposed;
 *  - DataParallel: rank 0 scatters the inputs (n-1 shards over its own link), gradients are
 *    reduced to it and the parameters broadcast from it, all exposed (a lower bound of
 *    torch.nn.DataParallel's cost: no output gather, no Python threads). */
#include <math.h>

#include "mg.h"

double vl_mg_allreduce_s(double bytes, int n, const vl_mg_link *l) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / l->busbw + 2.0 * (n - 1) * l->latency;
}

double vl_mg_half_s(double bytes, int n, const vl_mg_link *l) {
  if (n <= 1) return 0;
  return (double)(n - 1) / n * bytes / l->busbw + (double)(n - 1) * l->latency;
}

double vl_mg_rooted_s(double bytes, int n, const vl_mg_link *l) {
  if (n <= 1) return 0;
  return bytes / l->busbw + (double)(n - 1) * l->latency;
}

/* DDP: the buckets' allreduces, the last reduced one exposed; the others behind backward
 * when overlapped. */
static void ddp_comm(bool overlap, int n, const vl_mg_link *l, const vl_mg_work *w, double bwd_s,
                     double *comm, double *exposed) {
  double all = 0, last = 0;
  for (int i = 0; i < w->n_buckets; i++) {
    last = vl_mg_allreduce_s(w->buckets[i], n, l);
    all += last;
  }
  *comm = all;
  if (!overlap) { *exposed = all; return; }
  double hidden_window = all - last - bwd_s;
  *exposed = last + (hidden_window > 0 ? hidden_window : 0);
}

vl_mg_time vl_mg_model(vl_dist_mode mode, bool overlap, int n, const vl_mg_link *l, const vl_mg_work *w) {
  vl_mg_time t = {0};
  double rate = l->peak_flops * l->efficiency;
  t.compute_s = rate > 0 ? w->flops / rate : NAN;
  double comm = 0, exposed = 0;
  switch (mode) {
    case VL_DIST_SINGLE:
      n = 1;
      break;
    case VL_DIST_DDP:
      ddp_comm(overlap, n, l, w, w->bwd_share * t.compute_s, &comm, &exposed);
      break;
    case VL_DIST_ZERO1:
      comm = exposed = vl_mg_half_s(w->grad_bytes, n, l) + vl_mg_half_s(w->param_bytes, n, l);
      break;
    case VL_DIST_DP:
      if (n > 1)
        comm = exposed = (n - 1) * w->input_bytes / l->busbw + (n - 1) * l->latency +
                         vl_mg_rooted_s(w->grad_bytes, n, l) + vl_mg_rooted_s(w->param_bytes, n, l);
      break;
    default:
      return (vl_mg_time){NAN, NAN, NAN, NAN, NAN, NAN};
  }
  t.comm_s = comm;
  t.exposed_s = exposed;
  t.step_s = t.compute_s + exposed;
  t.speedup = t.step_s > 0 ? n * t.compute_s / t.step_s : NAN;
  t.busy = t.step_s > 0 ? t.compute_s / t.step_s : NAN;
  return t;
}
