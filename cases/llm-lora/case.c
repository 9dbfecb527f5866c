/* llm-lora: Mistral-7B fine-tuning memory on a 24 GB card (CASES.md §1).
 * Memory, FLOPs, fit, largest batch and OOM rate come from the plan backend at the scale
 * asked (full = the article's 7B); step time, tokens/s and loss from a real run at the
 * scale this device can run. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "case.h"
#include "interrupt.h"
#include "datasets/dialogue.h"
#include "vramlab/mistral.h"

static const char *const knobs[] = {"compute", "frozen", "lora_rank", "lora_alpha", "lora_targets",
                                    "optimizer", "adafactor_beta1", "checkpoint", "cap_fraction",
                                    "lr", "batch", "accum", "clip", "weight_decay", NULL};
static const char *const scales[] = {"tiny", "small", "full", NULL};


typedef struct {
  vl_mistral_cfg mc;
  vl_train_cfg tc;
  long batch;       /* micro-batch rows; 0 = "max" */
  long accum;
  double cap_fraction;
  size_t card, cap, context; /* card bytes, arena cap, CUDA context outside the arena */
  size_t run_cap;            /* arena cap of the timed runs (VL_NO_CAP: uncapped) */
  long seed, steps, warmup, oom_batches;
} rung_cfg;

#define FAIL(...) (snprintf(err, errn, __VA_ARGS__), -1)

static int parse_dtype(const vl_knobs *k, const char *key, const char *def, vl_dtype *out,
                       char *err, size_t errn) {
  const char *v = vl_knob_get(k, key);
  if (!v) v = def;
  if (vl_dtype_parse(v, out)) return FAIL("%s = '%s': expected fp32, fp16, bf16 or nf4", key, v);
  return 0;
}

static int parse_rung(const vl_case_env *env, const char *scale, const vl_knobs *k, rung_cfg *r,
                      char *err, size_t errn) {
  memset(r, 0, sizeof *r);
  if (vl_mistral_preset(scale, &r->mc))
    return FAIL("unknown scale '%s' (tiny, small, full)", scale);
  vl_train_cfg_default(&r->tc);
  const vl_knobs *s = env->setting;
  long seq;
  if (vl_knob_int(s, "seq", 512, 1, 1 << 20, &seq, err, errn)) return -1;
  /* The article's sequence length applies at full scale; reduced scales keep their own. */
  if (!strcasecmp(scale, "full")) r->mc.seq = seq;
  if (vl_knob_bytes(s, "card", "24GiB", &r->card, err, errn)) return -1;
  /* What lives outside the arena on a GPU (CUDA context, cuBLAS handles). Assumed, not
   * measured here: no GPU. A GPU run can measure it and set cuda_context. */
  if (vl_knob_bytes(s, "cuda_context", "512MiB", &r->context, err, errn)) return -1;
  if (vl_knob_int(s, "seed", 1, 0, 1L << 40, &r->seed, err, errn)) return -1;
  if (vl_knob_int(s, "steps", 12, 1, 100000, &r->steps, err, errn)) return -1;
  if (vl_knob_int(s, "warmup", 2, 0, 1000, &r->warmup, err, errn)) return -1;
  if (vl_knob_int(s, "oom_batches", 200, 1, 1000000, &r->oom_batches, err, errn)) return -1;
  if (parse_dtype(k, "compute", "fp32", &r->tc.compute, err, errn)) return -1;
  if (r->tc.compute == VL_NF4) return FAIL("compute = nf4: nf4 is a storage format for frozen weights");
  if (parse_dtype(k, "frozen", "fp32", &r->tc.frozen, err, errn)) return -1;
  long v;
  if (vl_knob_int(k, "lora_rank", 0, 0, 4096, &v, err, errn)) return -1;
  r->tc.lora_rank = (int)v;
  double d;
  if (vl_knob_double(k, "lora_alpha", 16, 1e-6, 1e6, &d, err, errn)) return -1;
  r->tc.lora_alpha = (float)d;
  const char *t = vl_knob_get(k, "lora_targets");
  if (t && !strcasecmp(t, "all")) r->tc.lora_targets = VL_LORA_ALL;
  else if (!t || !strcasecmp(t, "qkvo")) r->tc.lora_targets = VL_LORA_QKVO;
  else return FAIL("lora_targets = '%s': expected qkvo or all", t);
  const char *o = vl_knob_get(k, "optimizer");
  if (o && vl_optimizer_parse(o, &r->tc.optim.opt))
    return FAIL("optimizer = '%s': expected adamw, adafactor or sgd", o);
  int b;
  if (vl_knob_bool(k, "adafactor_beta1", 0, &b, err, errn)) return -1;
  r->tc.optim.adafactor_beta1 = b;
  if (vl_knob_bool(k, "checkpoint", 0, &b, err, errn)) return -1;
  r->tc.checkpoint = b;
  if (vl_knob_double(k, "cap_fraction", 1.0, 1e-6, 1.0, &r->cap_fraction, err, errn)) return -1;
  /* set_per_process_memory_fraction caps the allocator at fraction x card; the context
   * sits outside that cap, so the arena gets at most card - context. */
  r->cap = (size_t)((double)r->card * r->cap_fraction);
  if (r->context >= r->card) return FAIL("cuda_context must be smaller than the card");
  if (r->cap > r->card - r->context) r->cap = r->card - r->context;
  if (vl_knob_double(k, "lr", 1e-4, 1e-12, 10, &d, err, errn)) return -1;
  r->tc.optim.hp.lr = (float)d;
  if (vl_knob_double(k, "clip", 1.0, 0, 1e9, &d, err, errn)) return -1;
  r->tc.clip = (float)d;
  if (vl_knob_double(k, "weight_decay", 0, 0, 10, &d, err, errn)) return -1;
  r->tc.optim.hp.weight_decay = (float)d;
  const char *bs = vl_knob_get(k, "batch");
  if (!bs) bs = vl_knob_get(s, "batch");
  if (bs && !strcasecmp(bs, "max")) r->batch = 0;
  else {
    vl_knobs tmp = {0};
    vl_knob_set(&tmp, "batch", bs ? bs : "2");
    if (vl_knob_int(&tmp, "batch", 2, 1, 1 << 20, &r->batch, err, errn)) return -1;
  }
  if (vl_knob_int(k, "accum", 1, 1, 4096, &r->accum, err, errn)) return -1;
  /* Runs are uncapped unless run_cap says otherwise (to study OOM at the run scale); parsed
   * here with the rest so a bad value is refused before anything runs. */
  r->run_cap = VL_NO_CAP;
  const char *rc_s = vl_knob_get(s, "run_cap");
  if (rc_s && strcasecmp(rc_s, "none") && vl_knob_bytes(s, "run_cap", "0", &r->run_cap, err, errn)) return -1;
  return 0;
}

/* ---- planning ---------------------------------------------------------------------------- */
typedef struct {
  vl_status st;
  vl_mem_stats mem;
  double flops, flops_re, bytes;
  int64_t ptot, ptrain;
  char err[256];
} plan_res;

/* A step of accum micro-batches is planned with at most PLAN_MICRO_MAX of them. Every
 * micro-batch after the first allocates and frees the same tensors in the same order, so
 * the arena is in its steady state from the second on and a longer step has the same peak
 * (planned in full, accum 3 to 200 give identical memory at every rung); FLOPs and bytes of
 * the micro-batches not planned are the last planned one's, added. Planning all of them
 * took minutes at accum=4096: the batch search plans dozens of steps. */
#define PLAN_MICRO_MAX 64

/* Plan one full training step (accum micro-batches of B x T) from a fresh arena. With
 * `timeline`, the arena's event log of the step is appended as [seq, live bytes] pairs
 * (of the planned micro-batches). */
static void plan_step(const rung_cfg *r, int64_t B, int64_t T, size_t cap, vl_device target,
                      cJSON *timeline, plan_res *out) {
  memset(out, 0, sizeof *out);
  vl_ctx *c;
  out->st = vl_ctx_create_ex(&c, VL_DEV_PLAN, cap, target);
  if (out->st != VL_OK) return;
  vl_mistral *m = NULL;
  out->st = vl_mistral_create(c, &r->mc, &r->tc, (uint64_t)r->seed, &m);
  if (out->st == VL_OK) {
    out->ptot = vl_mistral_n_params(m, false);
    out->ptrain = vl_mistral_n_params(m, true);
    int n = r->accum < PLAN_MICRO_MAX ? (int)r->accum : PLAN_MICRO_MAX;
    vl_batch *mb = calloc((size_t)n, sizeof *mb);
    if (!mb) { out->st = VL_ERR_OOM; snprintf(out->err, sizeof out->err, "host memory"); vl_mistral_destroy(m); vl_ctx_destroy(c); return; }
    for (int i = 0; i < n; i++) mb[i] = (vl_batch){B, T, NULL, NULL};
    c->flops = c->flops_recompute = c->bytes_moved = 0;
    vl_arena_log_enable(c->arena, timeline != NULL);
    vl_step_info info;
    double more_f = 0, more_r = 0, more_b = 0; /* what the micro-batches not planned add */
    if (n == r->accum) {
      out->st = vl_mistral_step(m, mb, n, &info);
    } else {
      /* n - 1 micro-batches, then the last alone (the same allocations as all n at once)
       * to read what one micro-batch adds, then the optimizer update */
      out->st = vl_mistral_fwd_bwd(m, mb, n - 1, &info);
      double f0 = c->flops, r0 = c->flops_recompute, b0 = c->bytes_moved;
      if (out->st == VL_OK) out->st = vl_mistral_fwd_bwd(m, mb + n - 1, 1, &info);
      double rest = (double)(r->accum - n);
      more_f = rest * (c->flops - f0);
      more_r = rest * (c->flops_recompute - r0);
      more_b = rest * (c->bytes_moved - b0);
      if (out->st == VL_OK && !info.skipped) out->st = vl_mistral_apply(m, &info);
    }
    free(mb);
    out->flops = c->flops + more_f;
    out->flops_re = c->flops_recompute + more_r;
    out->bytes = c->bytes_moved + more_b;
    if (timeline) {
      size_t ne;
      const vl_mem_event *ev = vl_arena_log(c->arena, &ne);
      /* keep at most ~800 points, each the max of its window, so the peak survives */
      size_t stride = ne / 800 + 1;
      for (size_t i = 0; i < ne; i += stride) {
        size_t mx = ev[i].total;
        for (size_t j = i; j < i + stride && j < ne; j++) if (ev[j].total > mx) mx = ev[j].total;
        cJSON *pt = cJSON_CreateArray();
        cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)ev[i].seq));
        cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)mx));
        cJSON_AddItemToArray(timeline, pt);
      }
    }
  }
  if (out->st != VL_OK) snprintf(out->err, sizeof out->err, "%s", c->err);
  vl_arena_stats(c->arena, &out->mem);
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
}

static bool fits(const rung_cfg *r, int64_t B, int64_t T) {
  plan_res p;
  plan_step(r, B, T, r->cap, VL_DEV_CUDA, NULL, &p);
  return p.st == VL_OK;
}

#define MAX_BATCH_SEARCH 65536

static bool fits_full_len(void *user, int64_t b) {
  const rung_cfg *r = user;
  return fits(r, b, r->mc.seq);
}

/* Largest micro-batch whose worst-case step (T = seq) fits under the cap (peak is monotone
 * in B). 0 when not even one row fits; MAX_BATCH_SEARCH means "at least that many". */
static int64_t max_batch(const rung_cfg *r) {
  return vl_case_max_true(fits_full_len, (void *)r, 1, MAX_BATCH_SEARCH);
}

/* Longest padded length that fits for batch B (0 if none). */
static int64_t max_len(const rung_cfg *r, int64_t B) {
  if (fits(r, B, r->mc.seq)) return r->mc.seq;
  if (!fits(r, B, 1)) return 0;
  int64_t lo = 1, hi = r->mc.seq;
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) / 2;
    if (fits(r, B, mid)) lo = mid; else hi = mid;
  }
  return lo;
}

static int resolve_batch(rung_cfg *r, int64_t *mb) {
  *mb = max_batch(r);
  if (r->batch == 0) r->batch = *mb > 0 ? *mb : 1;
  return 0;
}

static int llm_plan(const vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out,
                    char *err, size_t errn) {
  rung_cfg r;
  if (parse_rung(env, scale, k, &r, err, errn)) return -1;
  double t0 = vl_now();
  int64_t mb;
  resolve_batch(&r, &mb);
  double t_search = vl_now() - t0;
  int64_t B = r.batch, T = r.mc.seq;
  plan_res p;
  double t1 = vl_now();
  cJSON *timeline = cJSON_CreateArray();
  plan_step(&r, B, T, VL_NO_CAP, VL_DEV_CUDA, timeline, &p);
  double t_plan = vl_now() - t1;
  if (p.st != VL_OK) {
    cJSON_Delete(timeline);
    return FAIL("planning failed: %s", p.err);
  }
  bool fit = fits(&r, B, T);
  cJSON_AddStringToObject(out, "scale", scale);
  cJSON_AddNumberToObject(out, "params_total", (double)p.ptot);
  cJSON_AddNumberToObject(out, "params_trainable", (double)p.ptrain);
  cJSON_AddNumberToObject(out, "batch", (double)B);
  cJSON_AddNumberToObject(out, "accum", (double)r.accum);
  cJSON_AddNumberToObject(out, "effective_batch", (double)(B * r.accum));
  cJSON_AddNumberToObject(out, "seq", (double)T);
  cJSON_AddNumberToObject(out, "peak_bytes", (double)p.mem.peak_total);
  cJSON_AddItemToObject(out, "by_category", vl_case_cats_json(p.mem.at_peak));
  cJSON_AddItemToObject(out, "peak_by_category", vl_case_cats_json(p.mem.peak));
  cJSON_AddNumberToObject(out, "reserved_bytes", (double)p.mem.reserved);
  cJSON_AddNumberToObject(out, "weight_bytes", (double)(p.mem.at_peak[VL_MEM_FROZEN] + p.mem.at_peak[VL_MEM_PARAMS]));
  cJSON_AddNumberToObject(out, "optim_bytes", (double)p.mem.at_peak[VL_MEM_OPTIM]);
  cJSON_AddNumberToObject(out, "grads_bytes", (double)p.mem.at_peak[VL_MEM_GRADS]);
  cJSON_AddNumberToObject(out, "acts_bytes", (double)p.mem.peak[VL_MEM_ACTS]);
  cJSON_AddNumberToObject(out, "optim_per_param",
                          p.ptrain ? (double)p.mem.at_peak[VL_MEM_OPTIM] / (4.0 * (double)p.ptrain) : 0);
  cJSON_AddNumberToObject(out, "flops_per_step", p.flops);
  cJSON_AddNumberToObject(out, "flops_recompute", p.flops_re);
  cJSON_AddNumberToObject(out, "bytes_moved_per_step", p.bytes);
  cJSON_AddNumberToObject(out, "card_bytes", (double)r.card);
  cJSON_AddNumberToObject(out, "cap_bytes", (double)r.cap);
  cJSON_AddNumberToObject(out, "usable_fraction", (double)r.cap / (double)r.card);
  cJSON_AddBoolToObject(out, "fits", fit);
  cJSON_AddNumberToObject(out, "max_batch", (double)mb);
  cJSON_AddBoolToObject(out, "max_batch_at_search_limit", mb >= MAX_BATCH_SEARCH);
  cJSON_AddNumberToObject(out, "cuda_context_bytes", (double)r.context);
  cJSON_AddNumberToObject(out, "plan_seconds", t_plan);
  cJSON_AddNumberToObject(out, "max_batch_search_seconds", t_search);
  /* OOM rate over variable-length batches: a step fails when its padded length exceeds
   * the longest that fits at this batch size. */
  int64_t tmax = max_len(&r, B);
  vl_dialogue_gen g;
  vl_dialogue_init(&g, r.mc.vocab, T, (uint64_t)r.seed + 17);
  long oom = 0;
  for (long i = 0; i < r.oom_batches; i++) {
    int64_t tb = 0;
    for (int64_t b = 0; b < B; b++) { int64_t l = vl_dialogue_len(&g); if (l > tb) tb = l; }
    oom += tb > tmax;
  }
  cJSON_AddNumberToObject(out, "oom_rate", (double)oom / (double)r.oom_batches);
  cJSON_AddNumberToObject(out, "max_len_fit", (double)tmax);
  cJSON_AddNumberToObject(out, "oom_batches", (double)r.oom_batches);
  cJSON_AddItemToObject(out, "timeline", timeline);
  /* peak vs batch at the worst-case length, for the batch plot */
  cJSON *curve = cJSON_CreateArray();
  int64_t top = mb + mb / 4 + 2 > 8 ? mb + mb / 4 + 2 : 8; /* past the cap crossing */
  int64_t step = top / 64 + 1;
  for (int64_t b = 1; b <= top; b += step) {
    plan_res q;
    plan_step(&r, b, T, VL_NO_CAP, VL_DEV_CUDA, NULL, &q);
    if (q.st != VL_OK) break; /* uncapped, so only a host failure ends the curve */
    cJSON *pt = cJSON_CreateArray();
    cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)b));
    cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)q.mem.peak_total));
    cJSON_AddItemToArray(curve, pt);
  }
  cJSON_AddItemToObject(out, "batch_curve", curve);
  return 0;
}

/* ---- running ---------------------------------------------------------------------------- */
static int llm_run(const vl_case_env *env, const vl_knobs *k, int rep, cJSON *out, char *err,
                   size_t errn) {
  rung_cfg r;
  if (parse_rung(env, env->scale, k, &r, err, errn)) return -1;
  if (env->device == VL_DEV_PLAN) return FAIL("run needs a compute device (cpu or cuda), not plan");
  if (r.batch == 0) {
    /* "max": the largest batch at the article's (full) scale, as the planner found it */
    rung_cfg full;
    if (parse_rung(env, "full", k, &full, err, errn)) return -1;
    int64_t mb;
    resolve_batch(&full, &mb);
    r.batch = full.batch;
  }
  if (!strcasecmp(env->scale, "full") && env->device == VL_DEV_CPU)
    return FAIL("a full-scale (7B) step does not run on the CPU here: use --scale small or tiny, or --device plan");
  vl_ctx *c;
  vl_status s = vl_ctx_create(&c, env->device, r.run_cap);
  if (s != VL_OK) return FAIL("cannot create a %s context: %s", vl_device_name(env->device), vl_status_name(s));
  vl_mistral *m = NULL;
  s = vl_mistral_create(c, &r.mc, &r.tc, (uint64_t)r.seed, &m);
  int64_t B = r.batch, T = r.mc.seq, nmb = r.accum;
  int32_t *tok = malloc((size_t)(B * T * nmb) * sizeof(int32_t));
  int32_t *tgt = malloc((size_t)(B * T * nmb) * sizeof(int32_t));
  vl_batch *mb = calloc((size_t)nmb, sizeof *mb);
  double *times = calloc((size_t)r.steps, sizeof(double));
  double *losses = calloc((size_t)(r.steps + r.warmup), sizeof(double));
  if (!tok || !tgt || !mb || !times || !losses) s = VL_ERR_OOM;
  vl_dialogue_gen g;
  vl_dialogue_init(&g, r.mc.vocab, T, (uint64_t)r.seed + 1000 + (uint64_t)rep);
  int64_t maxT = 0, tokens = 0, skipped = 0;
  double flops = 0;
  float scale_end = 0;
  for (long i = 0; s == VL_OK && i < r.warmup + r.steps; i++) {
    if (vl_interrupted) { s = VL_ERR_INTERRUPTED; snprintf(c->err, sizeof c->err, "interrupted"); break; }
    for (int64_t j = 0; j < nmb; j++) {
      mb[j] = (vl_batch){B, 0, tok + j * B * T, tgt + j * B * T};
      mb[j].T = vl_dialogue_batch(&g, B, 0, (int32_t *)mb[j].tokens, (int32_t *)mb[j].targets);
    }
    if (i == r.warmup) { vl_arena_reset_peaks(c->arena); c->flops = 0; }
    vl_step_info info;
    double dt = 0;
    s = c->be->timer_start(c);
    if (s == VL_OK) s = vl_mistral_step(m, mb, (int)nmb, &info);
    if (s == VL_OK) s = c->be->timer_stop(c, &dt);
    if (s != VL_OK) break;
    losses[i] = info.loss;
    scale_end = info.loss_scale;
    if (i >= r.warmup) {
      times[i - r.warmup] = dt;
      tokens += info.n_tokens;
      skipped += info.skipped;
      for (int64_t j = 0; j < nmb; j++) if (mb[j].T > maxT) maxT = mb[j].T;
    }
    if (!env->quiet && (i + 1) % 5 == 0)
      vl_progress("  step %ld/%ld  loss %.4f  %.3f s", i + 1, r.warmup + r.steps, info.loss, dt);
  }
  flops = c->flops;
  int rc = 0;
  if (s == VL_ERR_OOM) {
    /* A rung that does not fit this device is a result, not a failure of the run (the
     * fp32 7B baseline on any single GPU): recorded, and the ladder goes on. */
    cJSON_AddBoolToObject(out, "oom", 1);
    cJSON_AddStringToObject(out, "error", c->err);
    if (!env->quiet) vl_progress("  out of memory on %s: %s", vl_device_name(env->device), c->err);
  } else if (s != VL_OK) {
    rc = FAIL("%s at scale %s: %s (%s)", vl_device_name(env->device), env->scale, vl_status_name(s), c->err);
    cJSON_AddStringToObject(out, "error", err);
    if (s == VL_ERR_INTERRUPTED) cJSON_AddBoolToObject(out, "interrupted", 1);
  } else {
    vl_mem_stats ms;
    vl_arena_stats(c->arena, &ms);
    vl_stats st;
    vl_stats_compute(times, (int)r.steps, &st);
    cJSON_AddStringToObject(out, "scale", env->scale);
    cJSON_AddStringToObject(out, "device", vl_device_name(env->device));
    cJSON_AddNumberToObject(out, "batch", (double)B);
    cJSON_AddNumberToObject(out, "accum", (double)nmb);
    cJSON_AddItemToObject(out, "step_time", vl_stats_json(&st, times, (int)r.steps));
    double tps = (double)tokens / (double)r.steps / st.median;
    cJSON_AddNumberToObject(out, "tokens_per_s", tps);
    cJSON_AddNumberToObject(out, "sec_per_token", 1.0 / tps);
    cJSON_AddNumberToObject(out, "model_flops_per_step", flops / (double)r.steps);
    cJSON_AddNumberToObject(out, "flops_per_s", flops / (double)r.steps / st.median);
    cJSON_AddItemToObject(out, "loss", cJSON_CreateDoubleArray(losses, (int)(r.warmup + r.steps)));
    cJSON_AddNumberToObject(out, "skipped_steps", (double)skipped);
    cJSON_AddNumberToObject(out, "loss_scale_end", scale_end);
    cJSON_AddNumberToObject(out, "params_total", (double)vl_mistral_n_params(m, false));
    cJSON_AddNumberToObject(out, "params_trainable", (double)vl_mistral_n_params(m, true));
    cJSON_AddNumberToObject(out, "measured_peak_bytes", (double)ms.peak_total);
    cJSON_AddItemToObject(out, "measured_by_category", vl_case_cats_json(ms.at_peak));
    /* The planner, following this device's workspace rules, for the longest step seen. */
    if (env->device == VL_DEV_CPU) {
      plan_res p;
      plan_step(&r, B, maxT, VL_NO_CAP, VL_DEV_CPU, NULL, &p);
      cJSON_AddNumberToObject(out, "planned_peak_bytes", (double)p.mem.peak_total);
      cJSON_AddBoolToObject(out, "plan_matches_measured", p.st == VL_OK && p.mem.peak_total == ms.peak_total);
    }
  }
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
  free(tok); free(tgt); free(mb); free(times); free(losses);
  return rc;
}

/* Every knob of a rung and the setting (run_cap included), without planning. */
static int llm_check(const vl_case_env *env, const vl_knobs *k, char *err, size_t errn) {
  rung_cfg r;
  return parse_rung(env, env->scale, k, &r, err, errn);
}

/* What plan and run write at the top level of a rung's plan or run. */
static const char *const metrics[] = {
    "params_total", "params_trainable", "batch", "accum", "effective_batch", "seq", "peak_bytes", "reserved_bytes",
    "weight_bytes", "optim_bytes", "grads_bytes", "acts_bytes", "optim_per_param", "flops_per_step",
    "flops_recompute", "bytes_moved_per_step", "card_bytes", "cap_bytes", "usable_fraction", "fits", "max_batch",
    "max_batch_at_search_limit", "cuda_context_bytes", "plan_seconds", "max_batch_search_seconds", "oom_rate",
    "max_len_fit", "oom_batches", "oom", "tokens_per_s", "sec_per_token", "model_flops_per_step", "flops_per_s",
    "skipped_steps", "loss_scale_end", "measured_peak_bytes", "planned_peak_bytes", "plan_matches_measured", NULL};

const vl_case vl_case_llm_lora = {
    .id = "llm-lora",
    .summary = "7B LLM fine-tuning memory on a 24 GB card: fp32 -> cap -> fp16 -> LoRA -> QLoRA -> Adafactor -> checkpointing",
    .knobs = knobs,
    .scales = scales,
    .metrics = metrics,
    .check = llm_check,
    .plan = llm_plan,
    .run = llm_run,
    .method = "Memory, FLOPs, fit, largest batch and OOM rate are **planned at full scale** (the "
              "article's Mistral-7B and sequence length) by the plan backend, which runs the exact "
              "allocation sequence of a training step through the same arena algorithm as a real "
              "run, with a CUDA card's workspace rules. Step time, tokens/s and loss are measured "
              "by running each rung at the run scale.",
    .report = vl_llm_lora_report,
};
