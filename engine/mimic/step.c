/* The mimic's pieces every framework step shares (tape.h): clip_grad_norm_, the optimizer's
 * step and zero_grad as torch.optim runs them on the CPU (single-tensor) and on CUDA
 * (foreach), and the replay of a tape's events through the CUDA caching allocator. */
#include <stdio.h>
#include <stdlib.h>

#include "tape.h"
#include "vramlab/cachealloc.h"

void mt_clip(mt_tape *t, const mt_optim *p) {
  /* clip_grad_norm_: a norm per gradient (torch._foreach_norm on CUDA, vector_norm each on
   * the CPU), their stack and its norm, the clip coefficient; gradients scaled in place */
  mt_id norms[4096];
  int n = p->ntrain < 4096 ? p->ntrain : 4096;
  for (int i = 0; i < n; i++) norms[i] = mt_temp(t, "linalg_vector_norm", 1, 4);
  mt_id st = mt_temp(t, "stack", n, 4), tot = mt_temp(t, "linalg_vector_norm", 1, 4);
  mt_drop(t, st);
  for (int i = 0; i < n; i++) mt_drop(t, norms[i]);
  mt_id c = mt_temp(t, "clamp", 1, 4);
  mt_drop(t, tot);
  mt_drop(t, c);
}

/* transformers.optimization.Adafactor.step as the peer configures it (relative_step and
 * scale_parameter off, fp32 parameters and gradients), parameter by parameter, read off
 * torch_trace.py's traces (tests/fixtures/trace/llm-adafactor*.json). A parameter of two or more
 * dimensions keeps a factored second moment (a row of its rows, a column of its last dimension);
 * a one-dimensional one a full exp_avg_sq. `update` lives on until the next parameter's
 * `update = grad**2 + eps` rebinds the name (or step returns). */
static void adafactor(mt_tape *t, mt_optim *p) {
  mt_id update = 0;
  for (int i = 0; i < p->ntrain; i++) {
    mt_id w = p->train[i], *s = p->state + MT_OPT_STATE * (size_t)i;
    int64_t n = mt_numel(t, w), C = p->cols ? p->cols[i] : 0, R = C ? n / C : 0;
    int e = mt_esz(t, w);
    if (!p->has_state) { /* exp_avg, then torch.zeros(shape[:-1]).to(grad) and the column's */
      if (p->beta1) s[0] = mt_leaf(t, "zeros_like", n, e, VL_MC_OPT, false);
      if (C) {
        s[1] = mt_leaf(t, "zeros", R, e, VL_MC_OPT, false);
        s[2] = mt_leaf(t, "zeros", C, e, VL_MC_OPT, false);
      } else {
        s[1] = mt_leaf(t, "zeros_like", n, e, VL_MC_OPT, false);
      }
    }
    mt_id nrm = mt_temp(t, "linalg_vector_norm", 1, 4), rms = mt_temp(t, "div", 1, 4); /* state["RMS"] */
    mt_set_cat(t, rms, VL_MC_OPT);
    mt_drop(t, nrm);
    mt_drop(t, s[3]);
    s[3] = rms;
    mt_id sq = mt_temp(t, "pow", n, e), u = mt_temp(t, "add", n, e); /* (grad**2) + eps[0] */
    mt_drop(t, sq);
    mt_drop(t, update);
    update = u;
    if (C) {
      mt_drop(t, mt_temp(t, "mean", R, e)); /* row.mul_(beta2t).add_(update.mean(dim=-1)) */
      mt_drop(t, mt_temp(t, "mean", C, e));
      mt_id m = mt_temp(t, "mean", 1, e), rf = mt_temp(t, "div", R, e); /* _approx_sq_grad */
      mt_drop(t, m);
      mt_id cf = mt_temp(t, "rsqrt", C, e), a = mt_temp(t, "mul", n, e);
      mt_drop(t, rf);
      mt_drop(t, cf);
      mt_drop(t, update);
      update = a; /* .mul_(grad) */
    } else {
      mt_id a = mt_temp(t, "rsqrt", n, e); /* exp_avg_sq.rsqrt().mul_(grad) */
      mt_drop(t, update);
      update = a;
    }
    mt_id un = mt_temp(t, "linalg_vector_norm", 1, 4), ur = mt_temp(t, "div", 1, 4); /* _rms(update) */
    mt_drop(t, un);
    mt_id uc = mt_temp(t, "div", 1, 4); /* / clip_threshold, clamp_, update.div_ */
    mt_drop(t, ur);
    mt_drop(t, uc);
    if (p->beta1) { /* exp_avg.mul_().add_(update); update = exp_avg */
      mt_drop(t, update);
      update = 0;
    }
    mt_drop(t, mt_temp(t, "neg", n, e)); /* p_data_fp32.add_(-update) */
  }
  mt_drop(t, update);
  p->has_state = true;
}

void mt_optim_step(mt_tape *t, mt_optim *p) {
  if (p->opt == VL_OPT_ADAFACTOR) {
    adafactor(t, p);
    return;
  }
  bool sgd = p->opt == VL_OPT_SGD;
  int per = sgd ? 1 : 2;
  if (!p->has_state) { /* _init_group: state created on the first step */
    for (int i = 0; i < p->ntrain; i++) {
      mt_id w = p->train[i];
      int64_t n = mt_numel(t, w);
      if (!sgd && !p->cuda) (void)mt_leaf(t, "lift_fresh", 1, 4, VL_MC_OPT, false); /* step (host on CUDA) */
      for (int j = 0; j < per; j++)
        p->state[per * i + j] = mt_leaf(t, sgd ? "clone" : "zeros_like", n, mt_esz(t, w), VL_MC_OPT, false);
    }
    p->has_state = true;
  }
  if (sgd) return; /* momentum and the update in place */
  if (p->cuda) { /* _multi_tensor_adamw: exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs) */
    mt_id *s = p->state + 0;
    mt_id tmp[8192];
    int n = p->ntrain < 8192 ? p->ntrain : 8192;
    for (int i = 0; i < n; i++) tmp[i] = mt_temp(t, "_foreach_sqrt", mt_numel(t, s[2 * i + 1]), mt_esz(t, s[2 * i + 1]));
    for (int i = 0; i < n; i++) mt_drop(t, tmp[i]);
    return;
  }
  /* _single_tensor_adamw: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps); the
   * previous parameter's denom is freed when the name is rebound */
  mt_id prev = 0;
  for (int i = 0; i < p->ntrain; i++) {
    mt_id v = p->state[2 * i + 1];
    mt_id sq = mt_temp(t, "sqrt", mt_numel(t, v), mt_esz(t, v));
    mt_id dv = mt_temp(t, "div", mt_numel(t, v), mt_esz(t, v));
    mt_drop(t, sq);
    mt_drop(t, prev);
    prev = dv;
  }
  mt_drop(t, prev);
}

vl_status mt_replay_cuda(const mt_tape *t, uint64_t capacity, vl_mimic_result *r, char *why, size_t whyn) {
  int64_t n;
  const mt_ev *ev = mt_events(t, &n);
  int32_t maxid = 0;
  for (int64_t i = 0; i < n; i++)
    if (ev[i].id > maxid) maxid = ev[i].id;
  vl_cachealloc *ca = NULL;
  uint64_t *h = calloc((size_t)maxid + 1, sizeof *h);
  vl_status st = h ? vl_cachealloc_create(&ca, capacity) : VL_ERR_OOM;
  for (int64_t i = 0; st == VL_OK && i < n; i++) {
    if (ev[i].id > 0)
      st = vl_cachealloc_malloc(ca, (uint64_t)ev[i].bytes, &h[ev[i].id]);
    else
      vl_cachealloc_free(ca, h[-ev[i].id]);
  }
  if (st == VL_ERR_OOM && ca) { /* out of device memory: a result, not a failure */
    r->oom = true;
    st = VL_OK;
  }
  if (st == VL_OK) {
    vl_ca_stats cs;
    vl_cachealloc_stats(ca, &cs);
    r->max_allocated = (int64_t)cs.allocated_peak;
    r->max_reserved = (int64_t)cs.reserved_peak;
  } else {
    snprintf(why, whyn, "the caching allocator's replay failed (%s)", vl_status_name(st));
  }
  vl_cachealloc_destroy(ca);
  free(h);
  return st;
}


void mt_zero_grad(mt_tape *t, const mt_optim *p) {
  for (int i = 0; i < p->ntrain; i++) mt_grad_none(t, p->train[i]);
}

void mt_step_tail(mt_tape *t, mt_optim *o, bool clip) {
  mt_phase(t, 'o');
  if (clip) mt_clip(t, o);
  mt_optim_step(t, o);
  mt_zero_grad(t, o);
  mt_release_graph(t, mt_graph_mark(t));
}
