/* seg-ckpt: ResNet-101 U-Net segmentation with activation checkpointing (CASES.md §2).
 * Memory, FLOPs, fit, largest batch and the memory-vs-batch line come from the plan backend
 * at the scale asked (full = the article's 512x512, batch 8); step time, images/s, the
 * data-wait share and held-out accuracy from real training at the run scale, fed by the
 * engine's loader from a synthetic JPEG segmentation set (decoded every epoch). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "case.h"
#include "interrupt.h"
#include "datasets/segset.h"
#include "vramlab/data.h"
#include "vramlab/resunet.h"


static const char *const knobs[] = {"compute", "checkpoint", "relu_inplace", "accum", "batch",
                                    "workers", "prefetch", "pinned", "cap_fraction", "lr",
                                    "corrupt", "max_file_bytes", NULL};
static const char *const scales[] = {"tiny", "small", "full", NULL};

typedef struct {
  vl_resunet_cfg mc;
  vl_seg_train_cfg tc;
  long batch;            /* micro-batch; 0 = "max" */
  long accum, workers, prefetch;
  int pinned;
  vl_corrupt_policy corrupt;
  size_t max_file_bytes;
  double cap_fraction;
  size_t card, cap, context;
  long seed, epochs, train_images, eval_images, curve_points;
  char data_dir[VL_KNOB_VAL_LEN]; /* the data_dir knob (its length checked by vl_knob_set) */
} rung_cfg;

#define FAIL(...) (snprintf(err, errn, __VA_ARGS__), -1)

static int parse_rung(const vl_case_env *env, const char *scale, const vl_knobs *k, rung_cfg *r,
                      char *err, size_t errn) {
  memset(r, 0, sizeof *r);
  if (vl_resunet_preset(scale, &r->mc)) return FAIL("unknown scale '%s' (tiny, small, full)", scale);
  vl_seg_train_cfg_default(&r->tc);
  const vl_knobs *s = env->setting;
  long v;
  if (vl_knob_int(s, "classes", 5, 2, 255, &v, err, errn)) return -1;
  r->mc.classes = v;
  if (vl_knob_bytes(s, "card", "24GiB", &r->card, err, errn)) return -1;
  if (vl_knob_bytes(s, "cuda_context", "512MiB", &r->context, err, errn)) return -1;
  if (vl_knob_int(s, "seed", 1, 0, 1L << 40, &r->seed, err, errn)) return -1;
  if (vl_knob_int(s, "epochs", 3, 1, 10000, &r->epochs, err, errn)) return -1;
  if (vl_knob_int(s, "train_images", 256, 8, 1 << 24, &r->train_images, err, errn)) return -1;
  if (vl_knob_int(s, "eval_images", 64, 1, 1 << 24, &r->eval_images, err, errn)) return -1;
  if (vl_knob_int(s, "curve_points", 24, 4, 256, &r->curve_points, err, errn)) return -1;
  const char *dd = vl_knob_get(s, "data_dir");
  if (dd && strlen(dd) >= sizeof r->data_dir)
    return FAIL("data_dir: path too long: %zu characters (limit %zu)", strlen(dd), sizeof r->data_dir - 1);
  snprintf(r->data_dir, sizeof r->data_dir, "%s", dd ? dd : "data/segset");
  const char *cs = vl_knob_get(k, "compute");
  if (!cs) cs = "fp32";
  if (vl_dtype_parse(cs, &r->tc.compute) || r->tc.compute == VL_NF4)
    return FAIL("compute = '%s': expected fp32, fp16 or bf16", cs);
  int b;
  if (vl_knob_bool(k, "checkpoint", 0, &b, err, errn)) return -1;
  r->tc.checkpoint = b;
  if (vl_knob_bool(k, "relu_inplace", 1, &b, err, errn)) return -1;
  r->tc.relu_inplace = b;
  if (vl_knob_int(k, "accum", 1, 1, 4096, &r->accum, err, errn)) return -1;
  const char *w = vl_knob_get(k, "workers");
  if (w && !strcasecmp(w, "cores")) { /* PyTorch's usual advice: one worker per core */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    r->workers = n > 0 ? n : 1;
  } else if (vl_knob_int(k, "workers", 0, 0, VL_LOADER_WORKERS_MAX, &r->workers, err, errn)) {
    return -1;
  }
  if (vl_knob_int(k, "prefetch", 2, 1, 64, &r->prefetch, err, errn)) return -1;
  if (vl_knob_bool(k, "pinned", 0, &r->pinned, err, errn)) return -1;
  /* Damaged files in the data: fail on the first (error, the default) or skip them. */
  const char *cp = vl_knob_get(k, "corrupt");
  r->corrupt = VL_CORRUPT_ERROR;
  if (cp && vl_corrupt_policy_parse(cp, &r->corrupt))
    return FAIL("corrupt = '%s': expected skip or error", cp);
  if (vl_knob_bytes(k, "max_file_bytes", "64MiB", &r->max_file_bytes, err, errn)) return -1;
  double d;
  if (vl_knob_double(k, "lr", 1e-3, 1e-12, 10, &d, err, errn)) return -1;
  r->tc.optim.hp.lr = (float)d;
  if (vl_knob_double(k, "cap_fraction", 1.0, 1e-6, 1.0, &r->cap_fraction, err, errn)) return -1;
  r->cap = (size_t)((double)r->card * r->cap_fraction);
  if (r->context >= r->card) return FAIL("cuda_context must be smaller than the card");
  if (r->cap > r->card - r->context) r->cap = r->card - r->context;
  const char *bs = vl_knob_get(k, "batch");
  if (bs && !strcasecmp(bs, "max")) r->batch = 0;
  else if (vl_knob_int(k, "batch", 8, 2, 1 << 20, &r->batch, err, errn)) return -1;
  return 0;
}

/* ---- planning ---------------------------------------------------------------------------- */
typedef struct {
  vl_status st;
  vl_mem_stats mem;
  double flops, flops_re, bytes;
  int64_t p_enc, p_dec, p_head;
  char err[256];
} plan_res;

/* One full training step (accum micro-batches of B) planned from a fresh arena. */
static void plan_step(const rung_cfg *r, int64_t B, long accum, size_t cap, vl_device target,
                      plan_res *out) {
  memset(out, 0, sizeof *out);
  vl_ctx *c;
  out->st = vl_ctx_create_ex(&c, VL_DEV_PLAN, cap, target);
  if (out->st != VL_OK) return;
  vl_resunet *m = NULL;
  out->st = vl_resunet_create(c, &r->mc, &r->tc, (uint64_t)r->seed, &m);
  if (out->st == VL_OK) {
    out->p_enc = vl_resunet_n_params(m, 0);
    out->p_dec = vl_resunet_n_params(m, 1);
    out->p_head = vl_resunet_n_params(m, 2);
    vl_seg_batch mb[64];
    long n = accum < 64 ? accum : 64; /* memory repeats per micro-batch; FLOPs scale */
    for (long i = 0; i < n; i++) mb[i] = (vl_seg_batch){B, NULL, NULL};
    c->flops = c->flops_recompute = c->bytes_moved = 0;
    vl_seg_step_info info;
    out->st = vl_resunet_step(m, mb, (int)n, &info);
    out->flops = c->flops * (double)accum / (double)n;
    out->flops_re = c->flops_recompute * (double)accum / (double)n;
    out->bytes = c->bytes_moved * (double)accum / (double)n;
  }
  if (out->st != VL_OK) snprintf(out->err, sizeof out->err, "%s", c->err);
  vl_arena_stats(c->arena, &out->mem);
  vl_resunet_destroy(m);
  vl_ctx_destroy(c);
}

static bool fits(const rung_cfg *r, int64_t B) {
  plan_res p;
  plan_step(r, B, 1, r->cap, VL_DEV_CUDA, &p);
  return p.st == VL_OK;
}

#define MAX_BATCH_SEARCH 65536

static bool fits_pred(void *user, int64_t b) { return fits(user, b); }

/* Largest micro-batch (>= 2: batch norm needs two samples at 1/32 resolution) that fits
 * under the cap; 0 when none does. */
static int64_t max_batch(const rung_cfg *r) {
  return vl_case_max_true(fits_pred, (void *)r, 2, MAX_BATCH_SEARCH);
}

static int seg_plan(const vl_case_env *env, const char *scale, const vl_knobs *k, cJSON *out,
                    char *err, size_t errn) {
  rung_cfg r;
  if (parse_rung(env, scale, k, &r, err, errn)) return -1;
  double t0 = vl_now();
  int64_t mb = max_batch(&r);
  double t_search = vl_now() - t0;
  if (r.batch == 0) r.batch = mb > 0 ? mb : 2;
  int64_t B = r.batch;
  plan_res p;
  double t1 = vl_now();
  plan_step(&r, B, r.accum, VL_NO_CAP, VL_DEV_CUDA, &p);
  double t_plan = vl_now() - t1;
  if (p.st != VL_OK) return FAIL("planning failed: %s", p.err);
  const vl_mem_stats *ms = &p.mem;
  cJSON_AddStringToObject(out, "scale", scale);
  cJSON_AddNumberToObject(out, "image", (double)r.mc.image);
  cJSON_AddNumberToObject(out, "params_total", (double)(p.p_enc + p.p_dec + p.p_head));
  cJSON_AddNumberToObject(out, "params_trainable", (double)(p.p_enc + p.p_dec + p.p_head));
  cJSON *pm = cJSON_AddObjectToObject(out, "params_by_module");
  cJSON_AddNumberToObject(pm, "encoder", (double)p.p_enc);
  cJSON_AddNumberToObject(pm, "decoder", (double)p.p_dec);
  cJSON_AddNumberToObject(pm, "head", (double)p.p_head);
  cJSON_AddNumberToObject(out, "batch", (double)B);
  cJSON_AddNumberToObject(out, "accum", (double)r.accum);
  cJSON_AddNumberToObject(out, "effective_batch", (double)(B * r.accum));
  cJSON_AddNumberToObject(out, "peak_bytes", (double)ms->peak_total);
  cJSON_AddItemToObject(out, "by_category", vl_case_cats_json(ms->at_peak));
  cJSON_AddItemToObject(out, "peak_by_category", vl_case_cats_json(ms->peak));
  cJSON_AddNumberToObject(out, "acts_bytes", (double)ms->peak[VL_MEM_ACTS]);
  /* "model memory": what the weights cost to train (weights, masters, grads, optimizer) */
  double model = (double)(ms->at_peak[VL_MEM_PARAMS] + ms->at_peak[VL_MEM_FROZEN] +
                          ms->at_peak[VL_MEM_GRADS] + ms->at_peak[VL_MEM_OPTIM]);
  cJSON_AddNumberToObject(out, "model_bytes", model);
  cJSON_AddNumberToObject(out, "weight_bytes", (double)(ms->at_peak[VL_MEM_PARAMS] + ms->at_peak[VL_MEM_FROZEN]));
  cJSON_AddNumberToObject(out, "fragmentation_at_end", ms->fragmentation);
  cJSON_AddNumberToObject(out, "reserved_bytes", (double)ms->reserved);
  /* allocator extent beyond the live peak: what fragmentation costs this step */
  cJSON_AddNumberToObject(out, "extent_overhead",
                          ms->peak_total ? (double)ms->reserved / (double)ms->peak_total - 1.0 : 0);
  cJSON_AddNumberToObject(out, "flops_per_step", p.flops);
  cJSON_AddNumberToObject(out, "flops_recompute", p.flops_re);
  cJSON_AddNumberToObject(out, "recompute_share", p.flops > 0 ? p.flops_re / p.flops : 0);
  cJSON_AddNumberToObject(out, "card_bytes", (double)r.card);
  cJSON_AddNumberToObject(out, "cap_bytes", (double)r.cap);
  cJSON_AddNumberToObject(out, "cuda_context_bytes", (double)r.context);
  cJSON_AddBoolToObject(out, "fits", fits(&r, B));
  cJSON_AddNumberToObject(out, "max_batch", (double)mb);
  cJSON_AddNumberToObject(out, "max_effective_batch", (double)(mb * r.accum));
  cJSON_AddBoolToObject(out, "max_batch_at_search_limit", mb >= MAX_BATCH_SEARCH);
  cJSON_AddNumberToObject(out, "plan_seconds", t_plan);
  cJSON_AddNumberToObject(out, "max_batch_search_seconds", t_search);
  /* memory vs batch: planned peaks, the fitted line base + batch x per_sample, and the
   * batch that line predicts under the cap against the planner's exact answer */
  int64_t top = mb > 8 ? mb + mb / 4 + 2 : 16;
  int np = (int)(top < r.curve_points ? top : r.curve_points);
  double *xs = calloc((size_t)np, sizeof *xs), *ys = calloc((size_t)np, sizeof *ys);
  if (!xs || !ys) { free(xs); free(ys); return FAIL("host memory"); }
  cJSON *curve = cJSON_CreateArray();
  int got = 0;
  for (int i = 0; i < np; i++) {
    int64_t b = 2 + (int64_t)((double)i * (double)(top - 2) / (double)(np > 1 ? np - 1 : 1));
    if (got && b <= (int64_t)xs[got - 1]) continue;
    plan_res q;
    plan_step(&r, b, 1, VL_NO_CAP, VL_DEV_CUDA, &q);
    if (q.st != VL_OK) break;
    xs[got] = (double)b;
    ys[got++] = (double)q.mem.peak_total;
    cJSON *pt = cJSON_CreateArray();
    cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)b));
    cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)q.mem.peak_total));
    cJSON_AddItemToArray(curve, pt);
  }
  cJSON_AddItemToObject(out, "batch_curve", curve);
  double a = 0, bb = 0, r2 = 0;
  if (got >= 2) vl_case_linfit(xs, ys, got, &a, &bb, &r2);
  free(xs);
  free(ys);
  cJSON_AddNumberToObject(out, "fit_base_bytes", a);
  cJSON_AddNumberToObject(out, "fit_per_sample_bytes", bb);
  cJSON_AddNumberToObject(out, "fit_r2", r2);
  double pred = bb > 0 ? floor(((double)r.cap - a) / bb) : 0;
  cJSON_AddNumberToObject(out, "fit_predicted_max_batch", pred);
  cJSON_AddNumberToObject(out, "exact_vs_linear", pred > 0 ? (double)mb / pred : 0);
  return 0;
}

/* ---- data -------------------------------------------------------------------------------- */

/* The train or eval split at this scale's image size, made on first use (seeded). */
static int open_split(const rung_cfg *r, bool eval, vl_segset **out, char *err, size_t errn) {
  char dir[VL_KNOB_VAL_LEN + 128]; /* data_dir + the split's folder name: cannot be cut */
  long n = eval ? r->eval_images : r->train_images;
  uint64_t seed = (uint64_t)r->seed * 1000003u + (eval ? 7u : 0u);
  int dn = snprintf(dir, sizeof dir, "%s/s%lld-c%lld-%s-n%ld-seed%llu", r->data_dir, (long long)r->mc.image,
                    (long long)r->mc.classes, eval ? "eval" : "train", n, (unsigned long long)seed);
  if (dn < 0 || (size_t)dn >= sizeof dir)
    return snprintf(err, errn, "data_dir: path too long (limit %zu)", sizeof dir - 1), -1;
  vl_segset_gen_cfg g;
  vl_segset_gen_cfg_default(&g);
  g.n = n;
  g.size = (int)r->mc.image;
  g.num_classes = (int)r->mc.classes;
  g.seed = seed;
  g.progress = vl_case_gen_progress;
  /* Made only in a new or empty folder: a damaged or foreign one is refused, never
   * overwritten. */
  int u = vl_segset_first_use(out, dir, &g, err, errn);
  if (u <= 0) return u;
  vl_progress("generating %ld synthetic segmentation images (%lldx%lld) in %s", n,
              (long long)r->mc.image, (long long)r->mc.image, dir);
  if (vl_segset_generate(dir, &g, err, errn)) return -1;
  return vl_segset_open(out, dir, err, errn);
}

static void loader_cfg(const rung_cfg *r, vl_loader_cfg *lc, int64_t B, bool eval, vl_ctx *c) {
  vl_loader_cfg_default(lc);
  lc->batch = B;
  lc->masks = true;
  lc->crop = (int)r->mc.image;
  lc->workers = eval ? 0 : (int)r->workers;
  lc->prefetch = (int)r->prefetch;
  lc->persistent = true;
  lc->batched_collate = true;
  lc->drop_last = !eval;
  lc->shuffle = !eval;
  lc->seed = (uint64_t)r->seed;
  lc->on_corrupt = r->corrupt;
  lc->max_file_bytes = r->max_file_bytes;
  if (r->pinned && c->device == VL_DEV_CUDA) {
    lc->x_alloc = vl_case_pinned_alloc;
    lc->x_free = vl_case_pinned_free;
    lc->x_user = c;
  }
}

/* Pixel accuracy and mean IoU (over classes present in the labels or predictions) on the
 * held-out split, BN in evaluation mode. */
static vl_status evaluate(vl_resunet *m, vl_ctx *c, const rung_cfg *r, vl_segset *es,
                          double *acc, double *miou, char *err, size_t errn) {
  vl_loader_cfg lc;
  int64_t B = 8;
  loader_cfg(r, &lc, B, true, c);
  vl_dataset ds = vl_segset_dataset(es);
  vl_loader *l = NULL;
  vl_status s = vl_loader_create(&l, &lc, &ds, err, errn);
  if (s != VL_OK) return s;
  int64_t K = r->mc.classes, HW = r->mc.image * r->mc.image;
  int64_t *conf = calloc((size_t)(K * K), sizeof *conf);
  int32_t *pred = malloc((size_t)(B * HW) * sizeof *pred);
  if (!conf || !pred) s = VL_ERR_OOM;
  if (s == VL_OK) s = vl_loader_start_epoch(l, 0);
  while (s == VL_OK) {
    vl_batch_buf *b = NULL;
    if ((s = vl_loader_next(l, &b)) != VL_OK || !b) break;
    s = vl_resunet_predict(m, b->x, b->n, pred);
    if (s != VL_OK) snprintf(err, errn, "evaluation: %s", c->err);
    for (int64_t i = 0; s == VL_OK && i < b->n * HW; i++) conf[b->y[i] * K + pred[i]]++;
    vl_loader_release(l, b);
  }
  if (s != VL_OK && !err[0]) {
    vl_loader_stats st;
    vl_loader_stats_get(l, &st);
    snprintf(err, errn, "evaluation data: %s", st.last_error);
  }
  int64_t hit = 0, tot = 0;
  double iou = 0;
  int nk = 0;
  for (int64_t k = 0; s == VL_OK && k < K; k++) {
    int64_t tp = conf[k * K + k], row = 0, col = 0;
    for (int64_t j = 0; j < K; j++) { row += conf[k * K + j]; col += conf[j * K + k]; }
    hit += tp;
    tot += row;
    if (row + col - tp > 0) { iou += (double)tp / (double)(row + col - tp); nk++; }
  }
  *acc = tot ? (double)hit / (double)tot : 0;
  *miou = nk ? iou / nk : 0;
  free(conf);
  free(pred);
  vl_loader_destroy(l);
  return s;
}

/* ---- running ----------------------------------------------------------------------------- */

typedef struct {
  double *times, *losses, *acc, *miou, wait, wall, flops;
  long steps, timed, images;
} train_log;

static int seg_run(const vl_case_env *env, const vl_knobs *k, int rep, cJSON *out, char *err,
                   size_t errn) {
  rung_cfg r;
  if (parse_rung(env, env->scale, k, &r, err, errn)) return -1;
  if (env->device == VL_DEV_PLAN) return FAIL("run needs a compute device (cpu or cuda), not plan");
  if (r.batch == 0) { /* "max": the planner's answer at full scale */
    rung_cfg full;
    if (parse_rung(env, "full", k, &full, err, errn)) return -1;
    int64_t mb = max_batch(&full);
    r.batch = mb > 0 ? mb : 2;
    /* at a reduced run scale the full-scale batch may not fit the data set: keep >= 2
     * micro-batches per epoch */
    if (r.batch * r.accum * 2 > r.train_images) r.batch = r.train_images / (2 * r.accum);
    if (r.batch < 2) r.batch = 2;
  }
  if (!strcasecmp(env->scale, "full") && env->device == VL_DEV_CPU)
    return FAIL("a full-scale (512x512 ResNet-101) step is too slow for this CPU: use --scale small or tiny, or --device plan");
  int64_t B = r.batch;
  long per_step = B * r.accum;
  if (per_step > r.train_images) return FAIL("batch %ld x accum %ld exceeds the %ld training images", B, r.accum, r.train_images);
  vl_segset *ts = NULL, *es = NULL;
  if (open_split(&r, false, &ts, err, errn) || open_split(&r, true, &es, err, errn)) {
    vl_segset_close(ts);
    return -1;
  }
  vl_ctx *c = NULL;
  vl_status s = vl_ctx_create(&c, env->device, VL_NO_CAP);
  if (s != VL_OK) {
    vl_segset_close(ts);
    vl_segset_close(es);
    return FAIL("cannot create a %s context: %s", vl_device_name(env->device), vl_status_name(s));
  }
  vl_resunet *m = NULL;
  s = vl_resunet_create(c, &r.mc, &r.tc, (uint64_t)r.seed, &m);
  vl_loader_cfg lc;
  loader_cfg(&r, &lc, B, false, c);
  vl_dataset ds = vl_segset_dataset(ts);
  vl_loader *l = NULL;
  char lerr[512] = "";
  if (s == VL_OK) s = vl_loader_create(&l, &lc, &ds, lerr, sizeof lerr);
  long steps_per_epoch = r.train_images / per_step, max_steps = steps_per_epoch * r.epochs;
  train_log L = {calloc((size_t)max_steps + 1, sizeof(double)), calloc((size_t)max_steps + 1, sizeof(double)),
                 calloc((size_t)r.epochs, sizeof(double)), calloc((size_t)r.epochs, sizeof(double)),
                 0, 0, 0, 0, 0, 0};
  vl_batch_buf **held = calloc((size_t)r.accum, sizeof *held);
  vl_seg_batch *mb = calloc((size_t)r.accum, sizeof *mb);
  size_t nxb = (size_t)(3 * r.mc.image * r.mc.image), nyb = (size_t)(r.mc.image * r.mc.image);
  float *xs = malloc((size_t)(r.accum * B) * nxb * sizeof(float));
  int32_t *ys = malloc((size_t)(r.accum * B) * nyb * sizeof(int32_t));
  if (!L.times || !L.losses || !L.acc || !L.miou || !held || !mb || !xs || !ys) s = VL_ERR_OOM;
  long skipped = 0;
  float scale_end = 0;
  double run_t0 = vl_now();
  for (long e = 0; s == VL_OK && e < r.epochs; e++) {
    s = vl_loader_start_epoch(l, e);
    for (long st = 0; s == VL_OK && st < steps_per_epoch; st++) {
      if (vl_interrupted) { s = VL_ERR_INTERRUPTED; snprintf(c->err, sizeof c->err, "interrupted"); break; }
      double t0 = vl_now(), wait = 0;
      long n = 0;
      for (; n < r.accum; n++) {
        double w0 = vl_now();
        s = vl_loader_next(l, &held[n]);
        wait += vl_now() - w0;
        if (s != VL_OK || !held[n]) break;
        /* the loader keeps a bounded pool of batch buffers: micro-batches of one step are
         * copied out (a memcpy per micro-batch) and handed back at once */
        memcpy(xs + (size_t)n * nxb, held[n]->x, (size_t)held[n]->n * nxb * sizeof(float));
        memcpy(ys + (size_t)n * nyb, held[n]->y, (size_t)held[n]->n * nyb * sizeof(int32_t));
        mb[n] = (vl_seg_batch){held[n]->n, xs + (size_t)n * nxb, ys + (size_t)n * nyb};
        vl_loader_release(l, held[n]);
      }
      if (s == VL_OK && n < r.accum) break; /* end of the epoch's data */
      vl_seg_step_info info = {0};
      double dt = 0;
      if (s == VL_OK) s = c->be->timer_start(c);
      if (s == VL_OK) {
        c->flops = 0;
        s = vl_resunet_step(m, mb, (int)r.accum, &info);
      }
      if (s == VL_OK) s = c->be->timer_stop(c, &dt);
      if (s != VL_OK) break;
      double wall = vl_now() - t0;
      L.losses[L.steps] = info.loss;
      scale_end = info.loss_scale;
      skipped += info.skipped;
      if (L.steps >= 1) { /* the first step (primitive creation, page faults) is warm-up */
        L.times[L.timed++] = dt;
        L.wait += wait;
        L.wall += wall;
        L.images += per_step;
        L.flops += c->flops;
      }
      L.steps++;
      if (!env->quiet && (L.steps % 10 == 0 || L.steps == max_steps))
        vl_progress("  step %ld/%ld  loss %.4f  %.3f s (data wait %.3f s)", L.steps, max_steps,
                    info.loss, dt, wait);
    }
    if (s == VL_OK) {
      s = evaluate(m, c, &r, es, &L.acc[e], &L.miou[e], lerr, sizeof lerr);
      if (s == VL_OK && !env->quiet)
        vl_progress("  epoch %ld: held-out pixel accuracy %.4f, mIoU %.4f", e + 1, L.acc[e], L.miou[e]);
    }
  }
  double run_wall = vl_now() - run_t0;
  if (s != VL_OK && l && !lerr[0]) {
    vl_loader_stats lst;
    vl_loader_stats_get(l, &lst);
    if (lst.last_error[0]) snprintf(lerr, sizeof lerr, "%s", lst.last_error);
  }
  int rc = 0;
  if (s == VL_ERR_OOM && m) {
    cJSON_AddBoolToObject(out, "oom", 1);
    cJSON_AddStringToObject(out, "error", c->err);
    if (!env->quiet) vl_progress("  out of memory on %s: %s", vl_device_name(env->device), c->err);
  } else if (s != VL_OK) {
    rc = FAIL("%s at scale %s: %s (%s)", vl_device_name(env->device), env->scale, vl_status_name(s),
              lerr[0] ? lerr : c->err);
    cJSON_AddStringToObject(out, "error", err);
    if (s == VL_ERR_INTERRUPTED) cJSON_AddBoolToObject(out, "interrupted", 1);
  } else if (L.timed < 1) {
    rc = FAIL("no timed step: %ld training images give %ld step(s) of %ld x %ld", r.train_images,
              L.steps, B, r.accum);
  } else {
    vl_mem_stats ms;
    vl_arena_stats(c->arena, &ms);
    vl_stats st;
    vl_stats_compute(L.times, (int)L.timed, &st);
    cJSON_AddStringToObject(out, "scale", env->scale);
    cJSON_AddStringToObject(out, "device", vl_device_name(env->device));
    cJSON_AddNumberToObject(out, "batch", (double)B);
    cJSON_AddNumberToObject(out, "accum", (double)r.accum);
    cJSON_AddNumberToObject(out, "effective_batch", (double)per_step);
    cJSON_AddNumberToObject(out, "workers", (double)r.workers);
    cJSON_AddItemToObject(out, "step_time", vl_stats_json(&st, L.times, (int)L.timed));
    cJSON_AddNumberToObject(out, "step_seconds", st.median);
    cJSON_AddNumberToObject(out, "sec_per_image", L.wall / (double)L.images);
    cJSON_AddNumberToObject(out, "images_per_s", (double)L.images / L.wall);
    cJSON_AddNumberToObject(out, "data_wait_share", L.wait / L.wall);
    cJSON_AddNumberToObject(out, "compute_share", 1.0 - L.wait / L.wall);
    cJSON_AddNumberToObject(out, "sec_per_batch_data", L.wait / (double)(L.timed * r.accum));
    cJSON_AddNumberToObject(out, "model_flops_per_step", L.flops / (double)L.timed);
    cJSON_AddNumberToObject(out, "flops_per_s", L.flops / (double)L.timed / st.median);
    cJSON_AddNumberToObject(out, "optimizer_steps", (double)L.steps);
    cJSON_AddNumberToObject(out, "images_seen", (double)(L.steps * per_step));
    cJSON_AddNumberToObject(out, "run_seconds", run_wall);
    cJSON_AddItemToObject(out, "loss", cJSON_CreateDoubleArray(L.losses, (int)L.steps));
    cJSON_AddItemToObject(out, "pixel_accuracy_per_epoch", cJSON_CreateDoubleArray(L.acc, (int)r.epochs));
    cJSON_AddItemToObject(out, "miou_per_epoch", cJSON_CreateDoubleArray(L.miou, (int)r.epochs));
    cJSON_AddNumberToObject(out, "pixel_accuracy", L.acc[r.epochs - 1]);
    cJSON_AddNumberToObject(out, "miou", L.miou[r.epochs - 1]);
    cJSON_AddNumberToObject(out, "skipped_steps", (double)skipped);
    cJSON_AddNumberToObject(out, "loss_scale_end", scale_end);
    cJSON_AddNumberToObject(out, "measured_peak_bytes", (double)ms.peak_total);
    cJSON_AddNumberToObject(out, "measured_acts_bytes", (double)ms.peak[VL_MEM_ACTS]);
    cJSON_AddNumberToObject(out, "measured_fragmentation", ms.fragmentation);
    cJSON_AddItemToObject(out, "measured_by_category", vl_case_cats_json(ms.at_peak));
    if (env->device == VL_DEV_CPU) { /* the planner with this device's workspace rules */
      plan_res p;
      plan_step(&r, B, r.accum, VL_NO_CAP, VL_DEV_CPU, &p);
      cJSON_AddNumberToObject(out, "planned_peak_bytes", (double)p.mem.peak_total);
      cJSON_AddBoolToObject(out, "plan_matches_measured",
                            p.st == VL_OK && p.mem.peak_total == ms.peak_total);
    }
  }
  if (l) vl_loader_destroy(l);
  vl_resunet_destroy(m);
  vl_ctx_destroy(c);
  vl_segset_close(ts);
  vl_segset_close(es);
  free(L.times); free(L.losses); free(L.acc); free(L.miou); free(held); free(mb);
  free(xs); free(ys);
  return rc;
}

/* ---- checkpointing's time cost, interleaved ------------------------------------------------
 * The ladder's rungs run one after another, so a noisy neighbour on a shared machine can move
 * one rung's median by tens of percent. The cost of checkpointing (and of in-place ReLU off)
 * is therefore also measured here with the three models side by side, one step of each in
 * turn on the same batch, so each round sees the same machine. */

static int knobs_of(const cJSON *rung, vl_knobs *k, char *err, size_t errn) {
  memset(k, 0, sizeof *k);
  const cJSON *it;
  cJSON_ArrayForEach(it, cJSON_GetObjectItem(rung, "knobs"))
    if (cJSON_IsString(it) && vl_knob_set_err(k, it->string, it->valuestring, err, errn)) return -1;
  return 0;
}

static double median3(double *t, int n) { /* n small: insertion sort */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && t[j - 1] > t[j]; j--) { double x = t[j]; t[j] = t[j - 1]; t[j - 1] = x; }
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static int seg_extra(const vl_case_env *env, cJSON *res, char *err, size_t errn) {
  static const char *const names[3] = {"before", "ckpt", "relu_off"};
  enum { ROUNDS = 9, WARM = 2 };
  cJSON *rung[3] = {0}, *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "rungs"))
    for (int i = 0; i < 3; i++)
      if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(r, "name")), names[i])) rung[i] = r;
  if (!rung[0] || !rung[1] || !rung[2]) return 0; /* a ladder without them: nothing to compare */
  rung_cfg cfg[3];
  for (int i = 0; i < 3; i++) {
    vl_knobs k;
    if (knobs_of(rung[i], &k, err, errn) || parse_rung(env, env->scale, &k, &cfg[i], err, errn)) return -1;
    if (cfg[i].batch == 0) return 0;
  }
  vl_ctx *c;
  if (vl_ctx_create(&c, env->device, VL_NO_CAP) != VL_OK) return FAIL("interleaved timing: no %s context", vl_device_name(env->device));
  vl_resunet *m[3] = {0};
  int64_t B = cfg[0].batch, HW = cfg[0].mc.image * cfg[0].mc.image;
  float *x = malloc((size_t)(B * 3 * HW) * sizeof *x);
  int32_t *y = malloc((size_t)(B * HW) * sizeof *y);
  vl_status s = x && y ? VL_OK : VL_ERR_OOM;
  for (int i = 0; s == VL_OK && i < 3; i++) s = vl_resunet_create(c, &cfg[i].mc, &cfg[i].tc, (uint64_t)cfg[i].seed, &m[i]);
  vl_rng g;
  vl_rng_seed(&g, (uint64_t)cfg[0].seed + 77);
  for (int64_t i = 0; s == VL_OK && i < B * 3 * HW; i++) x[i] = vl_rng_normal(&g);
  for (int64_t i = 0; s == VL_OK && i < B * HW; i++) y[i] = (int32_t)vl_rng_below(&g, (uint64_t)cfg[0].mc.classes);
  double t[3][ROUNDS];
  vl_seg_batch mb = {B, x, y};
  if (!env->quiet) vl_progress("interleaved step timing: before / ckpt / relu_off, %d rounds", ROUNDS);
  for (int round = 0; s == VL_OK && round < WARM + ROUNDS; round++)
    for (int i = 0; s == VL_OK && i < 3; i++) {
      if (vl_interrupted) { s = VL_ERR_INTERRUPTED; break; }
      vl_seg_step_info info;
      double dt = 0;
      s = c->be->timer_start(c);
      if (s == VL_OK) s = vl_resunet_step(m[i], &mb, 1, &info);
      if (s == VL_OK) s = c->be->timer_stop(c, &dt);
      if (round >= WARM) t[i][round - WARM] = dt;
    }
  int rc = 0;
  if (s != VL_OK) {
    rc = FAIL("interleaved timing: %s (%s)", vl_status_name(s), c->err);
  } else {
    cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
    if (!cm) cm = cJSON_AddObjectToObject(res, "case_metrics");
    cJSON *o = cJSON_AddObjectToObject(cm, "interleaved_steps");
    cJSON_AddNumberToObject(o, "rounds", ROUNDS);
    cJSON_AddNumberToObject(o, "batch", (double)B);
    for (int i = 0; i < 3; i++) {
      cJSON_AddItemToObject(o, names[i], cJSON_CreateDoubleArray(t[i], ROUNDS));
      double med = median3(t[i], ROUNDS);
      /* on the rung, so claims and the report read it like any run metric */
      cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(rung[i], "runs"), 0);
      if (r0) cJSON_AddNumberToObject(r0, "interleaved_step_seconds", med);
    }
  }
  for (int i = 2; i >= 0; i--) vl_resunet_destroy(m[i]);
  vl_ctx_destroy(c);
  free(x);
  free(y);
  return rc;
}

/* Every knob of a rung and the setting, without planning or running. */
static int seg_check(const vl_case_env *env, const vl_knobs *k, char *err, size_t errn) {
  rung_cfg r;
  return parse_rung(env, env->scale, k, &r, err, errn);
}

/* What plan, run and extra write at the top level of a rung's plan or run. */
static const char *const metrics[] = {
    "image", "params_total", "params_trainable", "batch", "accum", "effective_batch", "peak_bytes", "acts_bytes",
    "model_bytes", "weight_bytes", "fragmentation_at_end", "reserved_bytes", "extent_overhead", "flops_per_step",
    "flops_recompute", "recompute_share", "card_bytes", "cap_bytes", "cuda_context_bytes", "fits", "max_batch",
    "max_effective_batch", "max_batch_at_search_limit", "plan_seconds", "max_batch_search_seconds",
    "fit_base_bytes", "fit_per_sample_bytes", "fit_r2", "fit_predicted_max_batch", "exact_vs_linear", "oom",
    "workers", "step_seconds", "sec_per_image", "images_per_s", "data_wait_share", "compute_share",
    "sec_per_batch_data", "model_flops_per_step", "flops_per_s", "optimizer_steps", "images_seen", "run_seconds",
    "pixel_accuracy", "miou", "skipped_steps", "loss_scale_end", "measured_peak_bytes", "measured_acts_bytes",
    "measured_fragmentation", "planned_peak_bytes", "plan_matches_measured", "interleaved_step_seconds", NULL};

const vl_case vl_case_seg_ckpt = {
    .id = "seg-ckpt",
    .summary = "ResNet-101 U-Net segmentation, 512x512 batch 8 on 24 GB: checkpointing -> ReLU in-place off -> accumulation 4 -> AMP -> loader -> largest batch",
    .knobs = knobs,
    .scales = scales,
    .metrics = metrics,
    .check = seg_check,
    .plan = seg_plan,
    .run = seg_run,
    .extra = seg_extra,
    .method = "Memory, FLOPs, fit, largest batch and the memory-vs-batch line are **planned at full "
              "scale** (512x512 images, torchvision-exact ResNet-101 encoder, U-Net decoder) by the "
              "plan backend, which runs a training step's exact allocation sequence through the "
              "arena with a CUDA card's workspace rules. Step time, images/s, the data-wait share "
              "and held-out pixel accuracy / mIoU are measured by training each rung for the same "
              "number of epochs (the same images, in the same seeded order) at the run scale, fed "
              "by the engine's loader, which decodes the synthetic JPEG set every epoch.",
    .report = vl_seg_ckpt_report,
};
