/* multi-gpu's plan hook: a rung's data-parallel step planned on rank 0 of its ranks at the
 * scale asked (full: 512x512, the per-card batch), with a card's workspace rules, through
 * vl_run_plan of the wrapper model vl_model_dist (nothing is communicated on a plan context:
 * world and rank only size the buckets and shards). Also: the DDP bucket layout (PyTorch's
 * assignment), the per-card table for 1, 2, 4 and 8 cards (planned, exact) and the modeled
 * step times of both link presets (timemodel.c), labelled "modeled". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg.h"

vl_status vl_mg_grad_layout(vl_case_env *env, const vl_mg_rung *r, size_t **bytes, int *n, int64_t *elems) {
  *bytes = NULL;
  *n = 0;
  *elems = 0;
  vl_ctx *c = NULL;
  vl_status s = vl_ctx_create(&c, VL_DEV_PLAN, VL_NO_CAP);
  if (s != VL_OK) return vl_case_fail(env, s, "cannot create a plan context");
  vl_model *m = NULL;
  vl_train_state ts;
  s = vl_model_create(c, &vl_model_resunet, &r->seg.model, (uint64_t)r->seg.seed, &m);
  if (s == VL_OK) s = vl_model_train_state(m, &ts);
  if (s != VL_OK) {
    vl_case_fail(env, s, "the U-Net's parameters: %s", c->err);
  } else if (!(*bytes = malloc((size_t)(ts.n > 0 ? ts.n : 1) * sizeof **bytes))) {
    s = vl_case_fail(env, VL_ERR_OOM, "host memory");
  } else {
    for (int i = 0; i < ts.n; i++) {
      if (!ts.p[i].trainable) continue;
      (*bytes)[(*n)++] = ts.p[i].grad.bytes;
      *elems += ts.p[i].grad.n;
    }
  }
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  return s;
}

/* ---- the model's inputs --------------------------------------------------------------------- */
typedef struct {
  double flops;            /* one card's step at the per-card batch, recompute included */
  double *buckets;         /* DDP buckets, reduction order */
  int n_buckets;
  int64_t elems;           /* trainable elements */
  double input_bytes;      /* one card's images + masks */
} mg_inputs;

static vl_status model_inputs(vl_case_env *env, const vl_mg_rung *r, mg_inputs *in) {
  memset(in, 0, sizeof *in);
  /* compute: the inner U-Net's step at the per-card batch, whatever the mode */
  vl_step_spec one = vl_segrung_step_spec(&r->seg, r->seg.batch, 1);
  vl_plan_result p;
  vl_run_plan(&one, VL_NO_CAP, VL_DEV_CUDA, false, &p);
  vl_plan_result_free(&p);
  if (p.status != VL_OK) return vl_case_fail(env, p.status, "planning the U-Net's step: %s", p.err);
  in->flops = p.flops + p.flops_recompute;
  const vl_resunet_cfg *mc = &r->seg.model.mc;
  in->input_bytes = (double)r->seg.batch * (double)(mc->in_ch + 1) * (double)(mc->image * mc->image) * 4.0;
  size_t *bytes;
  int n;
  VL_TRY(vl_mg_grad_layout(env, r, &bytes, &n, &in->elems));
  int *of = malloc((size_t)(n > 0 ? n : 1) * sizeof *of);
  in->buckets = calloc((size_t)(n > 0 ? n : 1), sizeof *in->buckets);
  if (!of || !in->buckets) {
    free(bytes);
    free(of);
    free(in->buckets);
    return vl_case_fail(env, VL_ERR_OOM, "host memory");
  }
  in->n_buckets = vl_ddp_assign_buckets(bytes, n, r->first_bucket_cap, r->bucket_cap, of);
  for (int i = 0; i < n; i++) in->buckets[of[i]] += (double)bytes[i];
  free(bytes);
  free(of);
  return VL_OK;
}

static vl_mg_work work_of(const mg_inputs *in, const vl_mg_rung *r, int n) {
  int64_t padded, shard;
  vl_zero_layout(in->elems, n, &padded, &shard);
  bool zero = r->mode == VL_DIST_ZERO1;
  vl_mg_work w = {in->flops, r->bwd_share, in->buckets, in->n_buckets,
                  4.0 * (double)(zero ? padded : in->elems), 4.0 * (double)(zero ? padded : in->elems),
                  in->input_bytes};
  return w;
}

static cJSON *time_json(const vl_mg_time *t) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "compute_s", t->compute_s);
  cJSON_AddNumberToObject(o, "comm_s", t->comm_s);
  cJSON_AddNumberToObject(o, "exposed_s", t->exposed_s);
  cJSON_AddNumberToObject(o, "step_s", t->step_s);
  cJSON_AddNumberToObject(o, "speedup", t->speedup);
  cJSON_AddNumberToObject(o, "busy", t->busy);
  return o;
}

/* The modeled times of both presets on n cards into o.modeled, and (top) the rung's own
 * as modeled_<what>_<preset> keys. */
static void modeled_json(const vl_mg_rung *r, const mg_inputs *in, int n, cJSON *o, bool top) {
  cJSON *mo = top ? NULL : cJSON_AddObjectToObject(o, "modeled");
  for (int i = 0; i < 2; i++) {
    const vl_mg_link *l = &r->link[i];
    vl_mg_work w = work_of(in, r, n);
    vl_mg_time t = vl_mg_model(r->mode, r->overlap, n, l, &w);
    if (!top) {
      cJSON_AddItemToObject(mo, l->name, time_json(&t));
      continue;
    }
    char k[64];
    const struct { const char *what; double v; } kv[] = {
        {"speedup", t.speedup}, {"busy", t.busy}, {"step_s", t.step_s}, {"compute_s", t.compute_s},
        {"comm_s", t.comm_s}, {"exposed_s", t.exposed_s}};
    for (size_t j = 0; j < sizeof kv / sizeof *kv; j++) {
      snprintf(k, sizeof k, "modeled_%s_%s", kv[j].what, l->name);
      cJSON_AddNumberToObject(o, k, kv[j].v);
    }
  }
}

/* Per-card memory of a planned step at its peak: the model's state (weights, gradients,
 * optimizer) and the categories a data-parallel step changes. */
static void card_mem_json(cJSON *o, const vl_mem_stats *ms) {
  cJSON_AddNumberToObject(o, "model_state_bytes",
                          (double)(ms->at_peak[VL_MEM_PARAMS] + ms->at_peak[VL_MEM_FROZEN] +
                                   ms->at_peak[VL_MEM_GRADS] + ms->at_peak[VL_MEM_OPTIM]));
  cJSON_AddNumberToObject(o, "params_bytes", (double)ms->at_peak[VL_MEM_PARAMS]);
  cJSON_AddNumberToObject(o, "grads_bytes", (double)ms->at_peak[VL_MEM_GRADS]);
  cJSON_AddNumberToObject(o, "optim_bytes", (double)ms->at_peak[VL_MEM_OPTIM]);
  cJSON_AddNumberToObject(o, "comm_bytes", (double)ms->at_peak[VL_MEM_COMM]);
}

/* One plan of the rung on `world` cards (rank 0). */
static vl_status plan_world(vl_case_env *env, const vl_mg_rung *r, int world, vl_plan_result *p) {
  vl_dist_cfg dc = vl_mg_dist_cfg(r, world, 0, NULL);
  vl_step_spec s = vl_mg_step_spec(r, &dc);
  vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, p);
  if (p->status != VL_OK)
    return vl_case_fail(env, p->status, "planning %s on %d rank(s): %s", vl_dist_mode_name(r->mode), world, p->err);
  return VL_OK;
}

/* Does the rung's step on `world` cards at per-card batch b fit under the card's cap (rank 0,
 * a card's workspace rules, fragmentation included)? */
static bool fits_world(const vl_mg_rung *r, int world, int64_t b) {
  vl_mg_rung rb = *r;
  rb.seg.batch = b;
  vl_dist_cfg dc = vl_mg_dist_cfg(&rb, world, 0, NULL);
  vl_step_spec s = vl_mg_step_spec(&rb, &dc);
  return vl_run_fits(&s, r->seg.card.cap);
}

static bool fits_at(void *user, int64_t b) {
  const vl_mg_rung *r = user;
  return fits_world(r, r->ranks, b);
}

/* 1, 2, 4, 8 cards (single: 1), each planned exactly, with the modeled times. */
static vl_status per_card_json(vl_case_env *env, const vl_mg_rung *r, const mg_inputs *in, cJSON *out) {
  cJSON *arr = cJSON_AddArrayToObject(out, "per_card");
  for (int i = 0; i < VL_MG_CARDS_N; i++) {
    int n = vl_mg_cards[i];
    if (r->mode == VL_DIST_SINGLE && n > 1) break;
    vl_mg_rung rn = *r;
    rn.ranks = n;
    vl_plan_result p;
    vl_status s = plan_world(env, &rn, n, &p);
    vl_plan_result_free(&p);
    if (s != VL_OK) return s;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "cards", n);
    cJSON_AddNumberToObject(o, "peak_bytes", (double)p.mem.peak_total);
    cJSON_AddItemToObject(o, "by_category", vl_case_cats_json(p.mem.at_peak));
    card_mem_json(o, &p.mem);
    cJSON_AddBoolToObject(o, "fits", fits_world(r, n, r->seg.batch));
    modeled_json(r, in, n, o, false);
    cJSON_AddItemToArray(arr, o);
  }
  return VL_OK;
}


vl_status vl_mg_plan(vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out) {
  vl_mg_rung r;
  VL_TRY(vl_mg_parse_rung(env, scale, k, &r));
  mg_inputs in;
  VL_TRY(model_inputs(env, &r, &in));
  double t0 = vl_now();
  vl_plan_result p;
  vl_status s = plan_world(env, &r, r.ranks, &p);
  double t_plan = vl_now() - t0;
  vl_plan_result_free(&p);
  if (s != VL_OK) {
    free(in.buckets);
    return s;
  }
  int64_t B = r.seg.batch;
  vl_case_plan_json(out, scale, &p, B, 1);
  cJSON_AddStringToObject(out, "mode", vl_dist_mode_name(r.mode));
  cJSON_AddNumberToObject(out, "ranks", r.ranks);
  cJSON_AddNumberToObject(out, "global_batch", (double)(B * r.ranks));
  cJSON_AddNumberToObject(out, "image", (double)r.seg.model.mc.image);
  card_mem_json(out, &p.mem);
  /* DDP's buckets (PyTorch's assignment over the gradients in parameter order) */
  bool ddp = r.mode == VL_DIST_DDP;
  cJSON_AddNumberToObject(out, "n_buckets", ddp ? in.n_buckets : 0);
  cJSON *bb = cJSON_AddArrayToObject(out, "bucket_bytes");
  for (int i = 0; ddp && i < in.n_buckets; i++) cJSON_AddItemToArray(bb, cJSON_CreateNumber(in.buckets[i]));
  int64_t padded, shard;
  vl_zero_layout(in.elems, r.ranks, &padded, &shard);
  cJSON_AddNumberToObject(out, "trainable_elems", (double)in.elems);
  cJSON_AddNumberToObject(out, "zero_padded_elems", (double)padded);
  cJSON_AddNumberToObject(out, "zero_shard_elems", (double)shard);
  /* what one rank hands to collectives per step (payload, not the ring's traffic) */
  double payload = r.ranks < 2 ? 0
                   : ddp ? 4.0 * (double)in.elems
                   : r.mode == VL_DIST_ZERO1 ? 4.0 * (double)(padded + shard)
                   : r.mode == VL_DIST_DP ? 4.0 * (double)in.elems : 0;
  cJSON_AddNumberToObject(out, "comm_payload_bytes", payload);
  cJSON_AddNumberToObject(out, "step_flops_per_card", in.flops);
  double t1 = vl_now();
  int64_t mb = vl_run_max_true(fits_at, &r, 2, VL_MAX_BATCH_SEARCH);
  vl_case_fit_json(out, &r.seg.card, fits_world(&r, r.ranks, B), mb, t_plan, vl_now() - t1);
  modeled_json(&r, &in, r.ranks, out, true);
  /* the presets the modeled numbers used, as the report states them */
  cJSON *ml = cJSON_AddObjectToObject(out, "modeled_links");
  for (int i = 0; i < 2; i++) {
    cJSON *o = cJSON_AddObjectToObject(ml, r.link[i].name);
    cJSON_AddNumberToObject(o, "busbw_gbs", r.link[i].busbw / 1e9);
    cJSON_AddNumberToObject(o, "latency_us", r.link[i].latency * 1e6);
    cJSON_AddNumberToObject(o, "tflops", r.link[i].peak_flops / 1e12);
    cJSON_AddNumberToObject(o, "efficiency", r.link[i].efficiency);
  }
  cJSON_AddNumberToObject(ml, "bwd_share", r.bwd_share);
  s = per_card_json(env, &r, &in, out);
  free(in.buckets);
  return s;
}
