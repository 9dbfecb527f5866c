/* multi-gpu's per-rank process: `vramlab worker multi-gpu --scale S --out DIR [--quiet]
 * [--set key=value]... [--knob key=value]...` under mpirun (the run hook starts it, run.c).
 * Each rank joins the communicator, makes the ResNet-101 U-Net wrapped in vl_model_dist,
 * reads its shard of the synthetic segmentation split through the engine's loader
 * (DistributedSampler semantics; DataParallel: rank 0 loads the global batch), runs the
 * timed loop (warm-up, then timed steps, epoch after epoch as needed), and writes what it
 * measured to DIR/rank-R.json atomically: step times, losses, the wrapper's compute /
 * communication / idle seconds, memory by category, and the planner's peak for this rank
 * with this machine's rules. A rank that fails ends the job (vl_comm_abort names it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/interrupt.h"
#include "mg.h"
#include "vramlab/fileio.h"

typedef struct {
  const char *scale, *out;
  bool quiet;
  vl_knobs setting, knobs;
} wargs;

static vl_status parse_args(int argc, char **argv, wargs *a, vl_err *e) {
  a->scale = "small";
  a->out = NULL;
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(s, "--quiet")) { a->quiet = true; continue; }
    if (!v) return vl_err_set(e, VL_ERR_INVALID, "%s needs a value", s);
    i++;
    if (!strcmp(s, "--scale")) { a->scale = v; continue; }
    if (!strcmp(s, "--out")) { a->out = v; continue; }
    vl_knobs *k = !strcmp(s, "--set") ? &a->setting : !strcmp(s, "--knob") ? &a->knobs : NULL;
    if (!k) return vl_err_set(e, VL_ERR_INVALID, "unknown option '%s'", s);
    /* one key=value (a value may hold commas: blocks=3,4,23,3) */
    const char *eq = strchr(v, '=');
    char key[VL_KNOB_KEY_LEN];
    if (!eq || eq == v || (size_t)(eq - v) >= sizeof key)
      return vl_err_set(e, VL_ERR_INVALID, "%s '%s': expected key=value", s, v);
    memcpy(key, v, (size_t)(eq - v));
    key[eq - v] = 0;
    VL_TRY(vl_knob_set_err(k, key, eq + 1, e));
  }
  if (!a->out) return vl_err_set(e, VL_ERR_INVALID, "--out DIR is needed");
  return VL_OK;
}

/* ---- the rank's data ------------------------------------------------------------------------ */
typedef struct {
  vl_segrung_feed f;     /* seg-ckpt's feed over this rank's loader (NULL loader: no data) */
  vl_segrung seg;   /* the rung with this rank's batch */
  vl_batch empty;    /* DataParallel's ranks other than 0: no data of their own */
} rank_feed;

static vl_status next_empty(void *user, long step, const vl_batch **mb, int *n, double *wait) {
  rank_feed *F = user;
  (void)step;
  (void)wait;
  *mb = &F->empty;
  *n = 1;
  return VL_OK;
}

/* The rank's loader, batches and feed; B = the samples this rank loads per step. */
static vl_status feed_open(vl_case_env *env, const vl_mg_rung *r, int64_t B, int world, int rank, vl_segset *ts,
                           vl_ctx *c, rank_feed *F) {
  memset(F, 0, sizeof *F);
  F->seg = r->seg;
  F->seg.batch = B;
  F->seg.accum = 1;
  const vl_resunet_cfg *mc = &r->seg.model.mc;
  if (B == 0) { /* DP's other ranks: the global batch's shapes, no data (rank 0 scatters it) */
    int64_t g = r->seg.batch * world;
    int64_t xs[4] = {g, mc->in_ch, mc->image, mc->image}, ys[3] = {g, mc->image, mc->image};
    vl_batch_add(&F->empty, "images", VL_F32, 4, xs, NULL);
    vl_batch_add(&F->empty, "masks", VL_I32, 3, ys, NULL);
    return VL_OK;
  }
  vl_loader_cfg lc;
  vl_segrung_loader_cfg(&F->seg, &lc, B, false, c);
  /* DistributedSampler: every rank its own shard of the epoch; DataParallel's rank 0 alone
   * loads the whole global batch */
  lc.rank = r->mode == VL_DIST_DP ? 0 : rank;
  lc.world = r->mode == VL_DIST_DP ? 1 : world;
  vl_dataset ds = vl_segset_dataset(ts);
  vl_err lerr = {""};
  vl_status s = vl_loader_create(&F->f.l, &lc, &ds, &lerr);
  if (s != VL_OK) return vl_case_fail(env, s, "loader: %s", lerr.msg);
  size_t HW = (size_t)(mc->image * mc->image);
  F->f.env = env;
  F->f.r = &F->seg;
  F->f.held = calloc(1, sizeof(vl_batch_buf *));
  F->f.mb = calloc(1, sizeof(vl_batch));
  F->f.xs = malloc((size_t)B * 3 * HW * sizeof(float));
  F->f.ys = malloc((size_t)B * HW * sizeof(int32_t));
  if (!F->f.held || !F->f.mb || !F->f.xs || !F->f.ys) return vl_case_fail(env, VL_ERR_OOM, "host memory for batches");
  return VL_OK;
}

static void feed_close(rank_feed *F) {
  if (F->f.l) vl_loader_destroy(F->f.l);
  free(F->f.held);
  free(F->f.mb);
  free(F->f.xs);
  free(F->f.ys);
}

/* Steps until res->steps reaches total, starting the next epoch whenever the data of one
 * ends (every rank has the same number of batches per epoch: drop_last on equal shards). */
static vl_status loop_to(vl_case_env *env, vl_model *m, vl_loop_cfg *cfg, rank_feed *F, long total,
                         int64_t *epoch, vl_loop_result *res) {
  cfg->total = total;
  bool fresh = false; /* an epoch was just started */
  while (res->steps < total) {
    long before = res->steps;
    vl_status s = vl_run_loop(m, cfg, res);
    if (s != VL_OK) return vl_case_fail(env, s, "step %ld: %s", res->steps, m->c->err);
    if (res->steps >= total) break;
    if (!F->f.l || (res->steps == before && fresh))
      return vl_case_fail(env, VL_ERR_INVALID, "the data gave no step (epoch %lld)", (long long)*epoch);
    fresh = true;
    s = vl_loader_start_epoch(F->f.l, ++*epoch);
    if (s != VL_OK) return vl_case_fail(env, s, "loader: epoch %lld", (long long)*epoch);
  }
  return VL_OK;
}

/* ---- what the rank writes ----------------------------------------------------------------- */
static cJSON *stats_json(const vl_dist_stats *d) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "steps", (double)d->steps);
  cJSON_AddNumberToObject(o, "step_s", d->step_s);
  cJSON_AddNumberToObject(o, "compute_s", d->compute_s);
  cJSON_AddNumberToObject(o, "comm_s", d->comm_s);
  cJSON_AddNumberToObject(o, "exposed_s", d->exposed_s);
  cJSON_AddNumberToObject(o, "idle_s", d->idle_s);
  cJSON_AddNumberToObject(o, "bytes", d->bytes);
  cJSON_AddNumberToObject(o, "n_buckets", d->n_buckets);
  cJSON *bb = cJSON_AddArrayToObject(o, "bucket_bytes");
  for (int i = 0; i < d->n_buckets && i < 64; i++) cJSON_AddItemToArray(bb, cJSON_CreateNumber((double)d->bucket_bytes[i]));
  return o;
}

static vl_status write_rank(vl_case_env *env, const char *dir, int rank, cJSON *o) {
  char path[VL_KNOB_VAL_LEN + 64];
  vl_err err;
  snprintf(path, sizeof path, "%s/rank-%d.json", dir, rank);
  char *text = cJSON_PrintUnformatted(o);
  if (!text) return vl_case_fail(env, VL_ERR_OOM, "host memory for the rank's results");
  vl_status rc = vl_file_write_atomic(path, text, strlen(text), &err);
  free(text);
  return rc ? vl_case_fail(env, VL_ERR_IO, "%s", err.msg) : VL_OK;
}

/* The measured run of this rank into o. */
static void rank_json(const vl_mg_rung *r, vl_model *m, int world, int rank, int64_t B, const vl_loop_result *res,
                      cJSON *o) {
  vl_dist_stats d;
  vl_dist_stats_get(m, &d);
  vl_mem_stats ms;
  vl_arena_stats(m->c->arena, &ms);
  cJSON_AddNumberToObject(o, "rank", rank);
  cJSON_AddNumberToObject(o, "world", world);
  cJSON_AddStringToObject(o, "mode", vl_dist_mode_name(r->mode));
  cJSON_AddNumberToObject(o, "batch_loaded", (double)B);
  cJSON_AddNumberToObject(o, "steps", (double)res->steps);
  cJSON_AddNumberToObject(o, "timed", (double)res->timed);
  cJSON_AddItemToObject(o, "times", cJSON_CreateDoubleArray(res->times, (int)res->timed));
  cJSON_AddItemToObject(o, "losses", cJSON_CreateDoubleArray(res->losses, (int)res->steps));
  cJSON_AddNumberToObject(o, "wall", res->wall);
  cJSON_AddNumberToObject(o, "wait", res->wait);
  cJSON_AddNumberToObject(o, "flops", res->flops);
  cJSON_AddItemToObject(o, "dist", stats_json(&d));
  cJSON_AddNumberToObject(o, "measured_peak_bytes", (double)ms.peak_total);
  cJSON_AddItemToObject(o, "measured_by_category", vl_case_cats_json(ms.at_peak));
  cJSON_AddItemToObject(o, "measured_peak_by_category", vl_case_cats_json(ms.peak));
  /* the planner with this machine's rules, for this rank of this world (no communicator) */
  vl_dist_cfg dc = vl_mg_dist_cfg(r, world, rank, NULL);
  vl_step_spec s = vl_mg_step_spec(r, &dc);
  size_t planned;
  bool match;
  vl_run_plan_check(&s, ms.peak_total, &planned, &match);
  cJSON_AddNumberToObject(o, "planned_peak_bytes", (double)planned);
  cJSON_AddBoolToObject(o, "plan_matches_measured", match);
}

/* One rank's whole run; its message in env->err on failure. */
static vl_status rank_run(vl_case_env *env, const wargs *a, vl_comm *cm) {
  vl_mg_rung r;
  VL_TRY(vl_mg_parse_rung(env, a->scale, &a->knobs, &r));
  int world = vl_comm_size(cm), rank = vl_comm_rank(cm);
  if (world != r.ranks)
    return vl_case_fail(env, VL_ERR_INVALID, "started on %d ranks, the rung has ranks = %d", world, r.ranks);
  int64_t B = vl_mg_rank_batch(&r, world, rank);
  long per_epoch = (r.mode == VL_DIST_DP ? r.seg.train_images : (r.seg.train_images + world - 1) / world);
  if (B > per_epoch)
    return vl_case_fail(env, VL_ERR_INVALID, "batch %lld per step exceeds the %ld images this rank gets per epoch",
                        (long long)B, per_epoch);
  vl_segset *ts = NULL;
  VL_TRY(vl_segrung_open_split(env, &r.seg, false, &ts));
  vl_ctx *c = NULL;
  vl_model *m = NULL;
  rank_feed F;
  memset(&F, 0, sizeof F);
  vl_loop_result res = {0};
  vl_status s = vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP);
  if (s != VL_OK) vl_case_fail(env, s, "cannot create a cpu context");
  vl_dist_cfg dc = vl_mg_dist_cfg(&r, world, rank, cm);
  if (s == VL_OK && (s = vl_model_create(c, &vl_model_dist, &dc, (uint64_t)r.seg.seed, &m)) != VL_OK)
    vl_case_fail(env, s, "model: %s", c->err);
  if (s == VL_OK) s = feed_open(env, &r, B, world, rank, ts, c, &F);
  int64_t epoch = 0;
  if (s == VL_OK && F.f.l && (s = vl_loader_start_epoch(F.f.l, 0)) != VL_OK) vl_case_fail(env, s, "loader: epoch 0");
  vl_loop_cfg cfg = {.warmup = r.warmup, .next = F.f.l ? vl_segrung_next : next_empty, .user = F.f.l ? (void *)&F.f : &F,
                     .stop = &vl_interrupted, .stop_now = &vl_terminated};
  F.f.max_steps = r.warmup + r.steps;
  if (s == VL_OK && r.warmup > 0) s = loop_to(env, m, &cfg, &F, r.warmup, &epoch, &res);
  if (s == VL_OK) vl_dist_stats_reset(m); /* the wrapper's seconds: timed steps only */
  if (s == VL_OK) s = loop_to(env, m, &cfg, &F, r.warmup + r.steps, &epoch, &res);
  if (s == VL_OK) {
    cJSON *o = cJSON_CreateObject();
    rank_json(&r, m, world, rank, B, &res, o);
    s = write_rank(env, a->out, rank, o);
    cJSON_Delete(o);
  }
  feed_close(&F);
  vl_loop_result_free(&res);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  vl_segset_close(ts);
  return s;
}

int vl_mg_worker(int argc, char **argv) {
  wargs *a = calloc(1, sizeof *a);
  vl_case_env *env = calloc(1, sizeof *env);
  if (!a || !env) {
    fprintf(stderr, "vramlab: worker multi-gpu: out of host memory\n");
    free(a);
    free(env);
    return 1;
  }
  if (parse_args(argc, argv, a, &env->err)) {
    fprintf(stderr, "vramlab: worker multi-gpu: %s\n", env->err.msg);
    free(a);
    free(env);
    return 2;
  }
  *env = (vl_case_env){.scale = a->scale, .device = VL_DEV_CPU, .setting = &a->setting, .quiet = a->quiet};
  vl_comm *cm = NULL;
  vl_err err = {""};
  vl_status s = vl_comm_under_mpirun() ? vl_comm_create_mpi(&cm, &err) : vl_comm_create_self(&cm, &err);
  if (s != VL_OK) {
    fprintf(stderr, "vramlab: worker multi-gpu: %s\n", err.msg);
    free(a);
    free(env);
    return 1;
  }
  s = rank_run(env, a, cm);
  if (s != VL_OK && vl_comm_size(cm) > 1) {
    char why[VL_CASE_ERR_LEN + 32];
    snprintf(why, sizeof why, "multi-gpu worker: %s", env->err.msg);
    vl_comm_abort(cm, 1, why); /* ends every rank of the job */
  }
  if (s != VL_OK) fprintf(stderr, "vramlab: worker multi-gpu: rank 0 of 1: %s\n", env->err.msg);
  vl_comm_destroy(cm);
  free(a);
  free(env);
  return s == VL_OK ? 0 : 1;
}
