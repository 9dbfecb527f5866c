/* The multi-gpu case: the ring allreduce time model against hand-computed values; every rung
 * planned at full scale with its keys and exact relations (DDP's buckets and payload are the
 * gradients, plain DDP's memory per card does not depend on the cards, ZeRO-1's optimizer
 * state is the shard's, ZeRO-1 on one card is plain DDP's, DataParallel's replicas keep no
 * optimizer state); bad knobs refused naming the knob; the seg-ckpt knobs keep seg-ckpt's
 * defaults; and, where MPI is built, a tiny 2-rank run through the worker (this executable
 * is the worker: `test_multigpu_case worker multi-gpu ...` under mpirun) with planned =
 * measured on every rank, then its report. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness/collbench.h"
#include "cases/multi-gpu/mg.h"
#include "harness/report.h"
#include "testutil.h"

static vl_ladder *ladder; /* large: not on the stack */

static int setup(void **state) {
  (void)state;
  ladder = malloc(sizeof *ladder);
  vl_err err;
  if (!ladder || vl_ladder_load(ladder, VRAMLAB_SOURCE_DIR, "multi-gpu", &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return -1;
  }
  if (tu_tmpdir(tu_tmp, sizeof tu_tmp, "vramlab-mg-")) return -1;
  char data[300];
  tu_join(data, sizeof data, tu_tmp, "data");
  const char *set[][2] = {{"train_images", "16"}, {"steps", "2"}, {"warmup", "1"}, {"data_dir", data},
                          {"sweep_bucket_caps", "none"}, {"timeout", "120"},
                          {"disturbed_retries", "0"}};
  for (size_t i = 0; i < sizeof set / sizeof *set; i++)
    if (vl_knob_set(&ladder->setting, set[i][0], set[i][1])) return -1;
  return 0;
}

static int teardown(void **state) {
  free(ladder);
  return tu_tmp_teardown(state);
}

static const vl_knobs *rung(const char *name) {
  int i = vl_ladder_find(ladder, name);
  assert_true(i >= 0);
  return &ladder->rungs[i].knobs;
}

static vl_case_env env_at(const char *scale, vl_device dev) {
  return (vl_case_env){.scale = scale, .device = dev, .setting = &ladder->setting, .quiet = 1};
}

static double num(const cJSON *o, const char *k) { return cJSON_GetNumberValue(cJSON_GetObjectItem(o, k)); }

static void close_to(double got, double want, const char *what) {
  if (!(fabs(got - want) <= 1e-12 * fabs(want) + 1e-15)) fail_msg("%s: %.17g, expected %.17g", what, got, want);
}

/* ---- the time model ---------------------------------------------------------------------------- */
static void test_time_model(void **state) {
  (void)state;
  vl_mg_link l = {"t", 10e9, 10e-6, 1e12, 0.5}; /* 5e11 FLOP/s achieved */
  double buckets[3] = {1e9, 2e9, 1e9};
  vl_mg_work w = {1e12, 0.5, buckets, 3, 4e9, 4e9, 1e8};
  /* allreduce, 2 ranks: 2(1)/2 x B / 1e10 + 2 x 1e-5 */
  close_to(vl_mg_allreduce_s(1e9, 2, &l), 0.1 + 2e-5, "allreduce n=2");
  close_to(vl_mg_allreduce_s(1e9, 4, &l), 0.15 + 6e-5, "allreduce n=4");
  close_to(vl_mg_allreduce_s(1e9, 1, &l), 0, "allreduce n=1");
  close_to(vl_mg_half_s(4e9, 4, &l), 0.3 + 3e-5, "reduce-scatter n=4");
  close_to(vl_mg_rooted_s(4e9, 2, &l), 0.4 + 1e-5, "reduce n=2");
  /* DDP with overlap: buckets 0.10002, 0.20002, 0.10002; the first two hide in a 1 s backward */
  vl_mg_time t = vl_mg_model(VL_DIST_DDP, true, 2, &l, &w);
  close_to(t.compute_s, 2.0, "compute");
  close_to(t.comm_s, 0.40006, "ddp comm");
  close_to(t.exposed_s, 0.10002, "ddp overlap exposed");
  close_to(t.step_s, 2.10002, "ddp step");
  close_to(t.speedup, 4.0 / 2.10002, "ddp speedup");
  close_to(t.busy, 2.0 / 2.10002, "ddp busy");
  /* a backward of 0.2 s hides only 0.2 of the other buckets' 0.30004 */
  w.bwd_share = 0.1;
  t = vl_mg_model(VL_DIST_DDP, true, 2, &l, &w);
  close_to(t.exposed_s, 0.10002 + 0.10004, "ddp short backward");
  t = vl_mg_model(VL_DIST_DDP, false, 2, &l, &w);
  close_to(t.exposed_s, 0.40006, "ddp no overlap");
  /* ZeRO-1, 4 ranks: reduce-scatter + allgather of 4e9 bytes, each 0.3 + 3e-5 */
  t = vl_mg_model(VL_DIST_ZERO1, true, 4, &l, &w);
  close_to(t.exposed_s, 0.60006, "zero1 exposed");
  close_to(t.speedup, 8.0 / 2.60006, "zero1 speedup");
  /* DataParallel, 2 ranks: scatter 1e8 (0.01 + 1e-5), reduce and broadcast 4e9 (0.4 + 1e-5 each) */
  t = vl_mg_model(VL_DIST_DP, true, 2, &l, &w);
  close_to(t.exposed_s, 0.81003, "dp exposed");
  /* one card: no communication, speedup 1 */
  t = vl_mg_model(VL_DIST_SINGLE, true, 8, &l, &w);
  close_to(t.speedup, 1.0, "single speedup");
  close_to(t.comm_s, 0, "single comm");
  t = vl_mg_model(VL_DIST_DDP, true, 1, &l, &w);
  close_to(t.speedup, 1.0, "ddp on 1 card");
}

/* Medians keep the undisturbed runs (other processes under the threshold) when there are any. */
static void test_median_leaves_out_disturbed(void **state) {
  (void)state;
  cJSON *rung = cJSON_Parse("{\"runs\": [{\"x\": 1, \"disturbed\": false}, {\"x\": 9, \"disturbed\": true},"
                            " {\"x\": 3, \"disturbed\": false}, {\"y\": 5}]}");
  int used, total;
  close_to(vl_mg_run_median(rung, "x", &used, &total), 2, "undisturbed median");
  assert_int_equal(used, 2);
  assert_int_equal(total, 3);
  cJSON *all = cJSON_Parse("{\"runs\": [{\"x\": 1, \"disturbed\": true}, {\"x\": 9, \"disturbed\": true}]}");
  close_to(vl_mg_run_median(all, "x", &used, &total), 5, "all disturbed: every run");
  assert_int_equal(used, 2);
  assert_true(isnan(vl_mg_run_median(all, "nothing", NULL, NULL)));
  cJSON_Delete(rung);
  cJSON_Delete(all);
}

/* ---- plans -------------------------------------------------------------------------------------- */
static cJSON *plan_of(const char *name, const char *set) {
  const vl_case *c = vl_case_find("multi-gpu");
  vl_knobs k = *rung(name);
  vl_err err;
  if (set && vl_knobs_apply_list(&k, set, &err)) fail_msg("%s", err.msg);
  vl_case_env env = env_at("full", VL_DEV_PLAN);
  cJSON *o = cJSON_CreateObject();
  if (c->plan(&env, "full", &k, o)) fail_msg("%s %s: %s", name, set ? set : "", env.err.msg);
  return o;
}

static const cJSON *card(const cJSON *plan, int n) {
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(plan, "per_card"))
    if (num(e, "cards") == n) return e;
  fail_msg("no per_card entry for %d cards", n);
  return NULL;
}

static double cat(const cJSON *plan, const char *k) { return num(cJSON_GetObjectItem(plan, "by_category"), k); }

static double align256(double b) { return ceil(b / 256) * 256; }

static void test_plan_relations(void **state) {
  (void)state;
  cJSON *single = plan_of("single", NULL), *ddp = plan_of("ddp", NULL), *tuned = plan_of("ddp-tuned", NULL),
        *zero = plan_of("zero1", NULL), *dp = plan_of("dp", NULL);
  const char *keys[] = {"peak_bytes", "by_category", "model_state_bytes", "optim_bytes", "comm_bytes", "n_buckets",
                        "bucket_bytes", "comm_payload_bytes", "per_card", "modeled_speedup_pcie",
                        "modeled_busy_nvlink", "fits", "max_batch", "global_batch"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    if (!cJSON_GetObjectItem(ddp, keys[i])) fail_msg("the plan has no '%s'", keys[i]);
  double elems = num(ddp, "trainable_elems");
  assert_true(elems > 5e7 && elems < 5.2e7); /* ~51.5M: ResNet-101 U-Net */
  /* DDP's buckets hold every gradient once; its payload per step is the gradients */
  double sum = 0, sum_al = 0;
  const cJSON *b;
  cJSON_ArrayForEach(b, cJSON_GetObjectItem(ddp, "bucket_bytes")) {
    sum += b->valuedouble;
    sum_al += align256(b->valuedouble);
  }
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(ddp, "bucket_bytes")), (int)num(ddp, "n_buckets"));
  close_to(sum, 4 * elems, "bucket bytes = gradients");
  close_to(num(ddp, "comm_payload_bytes"), 4 * elems, "ddp payload");
  close_to(num(ddp, "comm_bytes"), sum_al, "ddp comm category = its buckets");
  /* 25 MiB cap, first 1 MiB: about 206 MB / 25 MiB buckets */
  assert_true(num(ddp, "n_buckets") >= 8 && num(ddp, "n_buckets") <= 12);
  /* with gradient_as_bucket_view the buckets are the gradients: no separate gradient bytes */
  assert_true(cat(tuned, "grads") == 0);
  assert_true(num(tuned, "peak_bytes") < num(ddp, "peak_bytes"));
  /* plain DDP: the same memory per card on 1, 2, 4, 8 cards; the model state of one card */
  for (int i = 1; i < VL_MG_CARDS_N; i++)
    close_to(num(card(ddp, vl_mg_cards[i]), "peak_bytes"), num(card(ddp, 1), "peak_bytes"), "ddp per card");
  close_to(num(card(ddp, 8), "model_state_bytes"), num(single, "model_state_bytes"), "full copy on 8 cards");
  /* ZeRO-1 on N cards: optimizer state = the shard's (two AdamW moments of shard elements,
   * each slice aligned); on one card it is the whole, = plain DDP's */
  close_to(num(card(zero, 1), "optim_bytes"), num(single, "optim_bytes"), "zero1 on 1 card = whole optimizer");
  /* the gradients in parameter order: ZeRO-1's flat layout */
  vl_mg_rung r;
  vl_case_env env = env_at("full", VL_DEV_PLAN);
  assert_int_equal(vl_mg_parse_rung(&env, "full", rung("zero1"), &r), VL_OK);
  size_t *gb;
  int ng;
  int64_t ge;
  assert_int_equal(vl_mg_grad_layout(&env, &r, &gb, &ng, &ge), VL_OK);
  assert_true(ge == (int64_t)elems);
  for (int i = 1; i < VL_MG_CARDS_N; i++) {
    int n = vl_mg_cards[i];
    int64_t padded, shard;
    vl_zero_layout((int64_t)elems, n, &padded, &shard);
    assert_true(padded % n == 0 && padded >= elems && padded - elems < n && shard * n == padded);
    /* rank 0's shard [0, shard) of the flat layout: AdamW's two moments of every parameter's
     * slice inside it, each its own arena block (256-byte aligned) */
    double want = 0;
    int64_t off = 0;
    for (int j = 0; j < ng; j++) {
      int64_t len = (int64_t)gb[j] / 4, hi = off + len < shard ? off + len : shard;
      if (hi > off) want += 2 * align256(4.0 * (double)(hi - off));
      off += len;
    }
    double o = num(card(zero, n), "optim_bytes");
    close_to(o, want, "zero1 optimizer bytes = rank 0's shard");
    assert_true(o >= 8.0 * shard && o < num(single, "optim_bytes") / n * 1.01);
    close_to(num(card(zero, n), "comm_bytes"), align256(4.0 * padded), "zero1 flat buffer");
    assert_true(num(card(zero, n), "grads_bytes") == 0);
  }
  free(gb);
  assert_true(num(card(zero, 8), "peak_bytes") < num(card(zero, 2), "peak_bytes"));
  /* DataParallel: rank 0 keeps the optimizer state, its plan processes its shard */
  close_to(num(dp, "optim_bytes"), num(single, "optim_bytes"), "dp rank 0 optimizer");
  close_to(num(dp, "global_batch"), 16, "dp global batch");
  /* the modeled speedup: 1 on one card, below ideal on more, overlap helps */
  close_to(num(single, "modeled_speedup_pcie"), 1, "single modeled");
  assert_true(num(tuned, "modeled_speedup_pcie") > num(ddp, "modeled_speedup_pcie"));
  assert_true(num(tuned, "modeled_speedup_pcie") < 2 && num(tuned, "modeled_speedup_nvlink") <= 2);
  assert_true(num(tuned, "modeled_speedup_nvlink") > num(tuned, "modeled_speedup_pcie"));
  cJSON_Delete(single); cJSON_Delete(ddp); cJSON_Delete(tuned); cJSON_Delete(zero); cJSON_Delete(dp);
}

/* ---- knobs --------------------------------------------------------------------------------------- */
static void expect_refused(const char *name, const char *set, const char *word) {
  const vl_case *c = vl_case_find("multi-gpu");
  vl_knobs k = *rung(name);
  vl_err err;
  assert_int_equal(vl_knobs_apply_list(&k, set, &err), 0);
  vl_case_env env = env_at("tiny", VL_DEV_PLAN);
  assert_int_equal(c->check(&env, &k), VL_ERR_INVALID);
  if (!strstr(env.err.msg, word)) fail_msg("%s: message '%s' lacks '%s'", set, env.err.msg, word);
}

static void test_knob_errors(void **state) {
  (void)state;
  expect_refused("ddp", "mode=fsdp", "mode");
  expect_refused("single", "ranks=2", "single");
  expect_refused("ddp", "ranks=0", "ranks");
  expect_refused("ddp", "batch=max", "batch");
  expect_refused("ddp", "bucket_cap=10", "bucket_cap");
  expect_refused("ddp", "overlap=maybe", "overlap");
  expect_refused("ddp", "threads=0", "threads");
  /* settings */
  const vl_case *c = vl_case_find("multi-gpu");
  const char *bad[][2] = {{"sweep_bucket_caps", "4MiB,lots"}, {"pcie_busbw_gbs", "0"}, {"efficiency", "1.5"},
                          {"steps", "0"}, {"timeout", "-1"}, {"coll_max_bytes", "1"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    vl_knobs *s = malloc(sizeof *s);
    *s = ladder->setting;
    assert_int_equal(vl_knob_set(s, bad[i][0], bad[i][1]), 0);
    vl_case_env env = {.scale = "tiny", .device = VL_DEV_PLAN, .setting = s, .quiet = 1};
    assert_int_equal(c->check(&env, rung("ddp")), VL_ERR_INVALID);
    if (!strstr(env.err.msg, bad[i][0])) fail_msg("%s=%s: message '%s'", bad[i][0], bad[i][1], env.err.msg);
    free(s);
  }
}

/* The seg-ckpt knobs this case takes keep seg-ckpt's defaults (its parse falls back to them). */
static void test_seg_defaults_shared(void **state) {
  (void)state;
  int shared = 0;
  for (int i = 0; vl_mg_knobs[i].name; i++) {
    const vl_knob_decl *s = vl_knob_decl_find(vl_segrung_knobs, vl_mg_knobs[i].name);
    if (!s) continue;
    shared++;
    if (strcmp(s->def, vl_mg_knobs[i].def)) fail_msg("%s: default %s, seg-ckpt's %s", s->name, vl_mg_knobs[i].def, s->def);
  }
  assert_true(shared >= 15);
}

/* ---- a tiny run ----------------------------------------------------------------------------------- */
static bool can_run(void) {
  if (!vl_comm_have_mpi()) {
    print_message("skipped: this build has no MPI\n");
    return false;
  }
  return true;
}

static void test_tiny_two_rank_run(void **state) {
  (void)state;
  if (!can_run()) return;
  const vl_case *c = vl_case_find("multi-gpu");
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  double t0 = vl_now();
  const char *names[] = {"single", "ddp-tuned", "zero1", "dp"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    cJSON *o = cJSON_CreateObject();
    vl_status s = c->run(&env, rung(names[i]), 0, o);
    if (s != VL_OK) fail_msg("%s: %s", names[i], env.err.msg);
    if (cJSON_GetObjectItem(o, "not_measured")) {
      print_message("skipped: %s\n", cJSON_GetStringValue(cJSON_GetObjectItem(o, "not_measured")));
      cJSON_Delete(o);
      return;
    }
    int ranks = i == 0 ? 1 : 2;
    assert_int_equal((int)num(o, "ranks"), ranks);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "per_rank")), ranks);
    assert_true(num(o, "samples_per_s") > 0);
    assert_int_equal((int)num(o, "timed_steps"), 2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "loss")), 3);
    if (!cJSON_IsTrue(cJSON_GetObjectItem(o, "plan_matches_measured")))
      fail_msg("%s: planned %.0f != measured %.0f", names[i], num(o, "planned_peak_bytes"), num(o, "measured_peak_bytes"));
    double busy = num(o, "busy_share_min");
    assert_true(busy > 0 && busy <= 1);
    if (ranks > 1) assert_true(num(o, "comm_s_per_step") > 0);
    cJSON_Delete(o);
  }
  print_message("tiny runs took %.1f s\n", vl_now() - t0);
  /* more ranks than cores without oversubscribe: refused, naming the knob */
  vl_knobs k = *rung("ddp");
  char n[16];
  snprintf(n, sizeof n, "%d", 2 * (int)sysconf(_SC_NPROCESSORS_ONLN) + 2);
  assert_int_equal(vl_knob_set(&k, "ranks", n), 0);
  cJSON *o = cJSON_CreateObject();
  assert_int_equal(c->run(&env, &k, 0, o), VL_ERR_INVALID);
  assert_non_null(strstr(env.err.msg, "oversubscribe"));
  cJSON_Delete(o);
}

/* A worker that fails ends the job: every rank refuses a batch larger than its shard of the
 * split, the job exits non-zero, and the run's message carries the ranks' own words from the
 * job's output (never a hang, never a silent success). */
static void test_failing_worker_ends_the_job(void **state) {
  (void)state;
  if (!can_run()) return;
  const vl_case *c = vl_case_find("multi-gpu");
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  vl_knobs k = *rung("ddp");
  assert_int_equal(vl_knob_set(&k, "batch", "12"), 0); /* 16 images over 2 ranks: 8 each */
  cJSON *o = cJSON_CreateObject();
  double t0 = vl_now();
  assert_int_equal(c->run(&env, &k, 0, o), VL_ERR_COMM);
  assert_true(vl_now() - t0 < 60);
  if (!strstr(env.err.msg, "exceeds the 8 images")) fail_msg("message: %s", env.err.msg);
  assert_non_null(strstr(env.err.msg, "exited with status"));
  cJSON_Delete(o);
  /* the job's folder is kept for its log (/tmp/vramlab-mg-XXXXXX/job.log); remove it */
  const char *p = strstr(env.err.msg, "/tmp/vramlab-mg-");
  assert_non_null(p);
  char dir[32];
  snprintf(dir, sizeof dir, "%.22s", p);
  tu_rmtree(dir);
}

/* Without mpirun (VRAMLAB_MPIRUN names none) a rung is "not measured here" with the apt-get
 * line, and the run goes on (VL_OK). */
static void test_no_mpirun_not_measured(void **state) {
  (void)state;
  if (!can_run()) return;
  const vl_case *c = vl_case_find("multi-gpu");
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  setenv("VRAMLAB_MPIRUN", "/nonexistent/mpirun", 1);
  cJSON *o = cJSON_CreateObject();
  vl_status s = c->run(&env, rung("ddp"), 0, o);
  unsetenv("VRAMLAB_MPIRUN");
  if (s != VL_OK) fail_msg("%s", env.err.msg);
  const char *why = cJSON_GetStringValue(cJSON_GetObjectItem(o, "not_measured"));
  assert_non_null(why);
  assert_non_null(strstr(why, "apt-get install"));
  assert_null(cJSON_GetObjectItem(o, "step_time"));
  cJSON_Delete(o);
}

/* Every rung planned at full scale equals tests/golden/multi-gpu.json (tools/make_golden.sh),
 * field by field, timings aside: refactors keep every planned byte and FLOP. */
static bool is_timing(const char *k) {
  size_t n = strlen(k);
  return n > 8 && !strcmp(k + n - 8, "_seconds");
}

static void same_json(const cJSON *want, const cJSON *got, const char *path) {
  if (!got) fail_msg("%s: missing", path);
  if ((want->type & 0xff) != (got->type & 0xff)) fail_msg("%s: type differs", path);
  char p[512];
  if (cJSON_IsObject(want)) {
    const cJSON *w;
    cJSON_ArrayForEach(w, want) {
      if (is_timing(w->string)) continue;
      snprintf(p, sizeof p, "%s.%s", path, w->string);
      same_json(w, cJSON_GetObjectItemCaseSensitive(got, w->string), p);
    }
    cJSON_ArrayForEach(w, got)
      if (!is_timing(w->string) && !cJSON_GetObjectItemCaseSensitive(want, w->string))
        fail_msg("%s.%s: new field", path, w->string);
  } else if (cJSON_IsArray(want)) {
    assert_int_equal(cJSON_GetArraySize(want), cJSON_GetArraySize(got));
    for (int i = 0; i < cJSON_GetArraySize(want); i++) {
      snprintf(p, sizeof p, "%s[%d]", path, i);
      same_json(cJSON_GetArrayItem(want, i), cJSON_GetArrayItem(got, i), p);
    }
  } else if (cJSON_IsNumber(want)) {
    double w = want->valuedouble, g = got->valuedouble;
    bool integral = w == floor(w) && fabs(w) < 9007199254740992.0;
    if (integral ? w != g : !(fabs(w - g) <= 1e-12 * fabs(w))) fail_msg("%s: %.17g, golden %.17g", path, g, w);
  } else if (cJSON_IsString(want) && strcmp(want->valuestring, got->valuestring)) {
    fail_msg("%s: '%s', golden '%s'", path, got->valuestring, want->valuestring);
  }
}

static void test_golden_plans(void **state) {
  (void)state;
  vl_ladder *L = malloc(sizeof *L); /* the ladder as shipped: the setup's settings aside */
  char path[512];
  vl_err err;
  assert_non_null(L);
  if (vl_ladder_load(L, VRAMLAB_SOURCE_DIR, "multi-gpu", &err)) fail_msg("%s", err.msg);
  snprintf(path, sizeof path, "%s/tests/golden/multi-gpu.json", VRAMLAB_SOURCE_DIR);
  uint8_t *text;
  size_t n = tu_slurp(path, &text);
  cJSON *golden = cJSON_ParseWithLength((const char *)text, n);
  free(text);
  assert_non_null(golden);
  assert_int_equal(cJSON_GetArraySize(golden), L->n_rungs);
  const vl_case *c = vl_case_find("multi-gpu");
  vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .setting = &L->setting, .quiet = 1};
  for (int i = 0; i < L->n_rungs; i++) {
    cJSON *o = cJSON_CreateObject();
    if (c->plan(&env, "full", &L->rungs[i].knobs, o)) fail_msg("%s: %s", L->rungs[i].name, env.err.msg);
    char where[64];
    snprintf(where, sizeof where, "multi-gpu.%s", L->rungs[i].name);
    same_json(cJSON_GetObjectItemCaseSensitive(golden, L->rungs[i].name), o, where);
    cJSON_Delete(o);
  }
  cJSON_Delete(golden);
  free(L);
}

/* A tiny ladder through every hook (plans at full scale, one run per rung, extra with a
 * two-cap sweep and the collective benchmark to 64 KiB) makes a report with the memory
 * statement, the measured and modeled sections, and no NaN; without MPI the measured rows say
 * "not measured here". */
static void test_report_of_a_tiny_ladder(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("multi-gpu");
  vl_knobs saved = ladder->setting;
  assert_int_equal(vl_knob_set(&ladder->setting, "sweep_bucket_caps", "64KiB,1MiB"), 0);
  assert_int_equal(vl_knob_set(&ladder->setting, "coll_max_bytes", "64KiB"), 0);
  vl_case_env env = env_at("tiny", VL_DEV_CPU);
  cJSON *res = cJSON_CreateObject();
  cJSON_AddNumberToObject(res, "schema_version", VL_RESULTS_SCHEMA_VERSION);
  cJSON_AddStringToObject(res, "case", "multi-gpu");
  cJSON *envj = cJSON_AddObjectToObject(res, "env");
  cJSON_AddStringToObject(envj, "device", "cpu");
  cJSON_AddNumberToObject(envj, "cores", 2);
  cJSON_AddStringToObject(res, "run_scale", "tiny");
  cJSON *setting = cJSON_AddObjectToObject(res, "setting");
  for (int i = 0; i < ladder->setting.n; i++)
    cJSON_AddStringToObject(setting, ladder->setting.k[i].key, ladder->setting.k[i].val);
  cJSON *rungs = cJSON_AddArrayToObject(res, "rungs");
  double t0 = vl_now();
  for (int i = 0; i < ladder->n_rungs; i++) {
    cJSON *r = cJSON_CreateObject(), *kn;
    cJSON_AddStringToObject(r, "name", ladder->rungs[i].name);
    cJSON_AddStringToObject(r, "label", ladder->rungs[i].label);
    kn = cJSON_AddObjectToObject(r, "knobs");
    for (int j = 0; j < ladder->rungs[i].knobs.n; j++)
      cJSON_AddStringToObject(kn, ladder->rungs[i].knobs.k[j].key, ladder->rungs[i].knobs.k[j].val);
    cJSON_AddItemToObject(r, "plan", plan_of(ladder->rungs[i].name, NULL));
    cJSON *ro = cJSON_CreateObject();
    if (c->run(&env, &ladder->rungs[i].knobs, 0, ro)) fail_msg("%s: %s", ladder->rungs[i].name, env.err.msg);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "runs"), ro);
    cJSON_AddItemToArray(rungs, r);
  }
  if (c->extra(&env, res)) fail_msg("extra: %s", env.err.msg);
  print_message("tiny ladder + extra took %.1f s\n", vl_now() - t0);
  ladder->setting = saved;
  bool measured = vl_comm_have_mpi();
  if (measured) { /* extra's speedups and the claims' medians */
    const cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
    assert_true(num(cm, "measured_speedup_ddp") > 0);
    assert_true(num(cm, "measured_busy_min_dp") > 0);
    assert_true(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "bucket_sweep"), "points")) == 2);
    const cJSON *co, *colls = cJSON_GetObjectItem(res, "collectives");
    assert_int_equal(cJSON_GetArraySize(colls), 3);
    cJSON_ArrayForEach(co, colls) { /* every one measured, every result exact */
      if (cJSON_GetObjectItem(co, "error")) fail_msg("%s", cJSON_GetStringValue(cJSON_GetObjectItem(co, "error")));
      assert_true(cJSON_GetArraySize(cJSON_GetObjectItem(co, "rows")) >= 1);
      assert_true(num(co, "wrong") == 0);
    }
  }
  char path[512], md[512];
  vl_err err;
  tu_join(path, sizeof path, tu_tmp, "results.json");
  tu_join(md, sizeof md, tu_tmp, "multi-gpu.md");
  char *t = cJSON_Print(res);
  tu_write_text(path, t);
  free(t);
  cJSON_Delete(res);
  setenv("VRAMLAB_NO_GNUPLOT", "1", 1);
  if (vl_report_write(c, ladder, path, md, &err)) fail_msg("%s", err.msg);
  uint8_t *text;
  size_t n = tu_slurp(md, &text);
  text[n] = 0;
  const char *s = (const char *)text;
  const char *want[] = {"a full copy of the weights, the gradients and the optimizer state on every card",
                        "What ZeRO-1 (`zero1`) saves", "Modeled time at full scale", "Ladder at `tiny` scale",
                        "no SyncBatchNorm"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    if (!strstr(s, want[i])) fail_msg("the report lacks '%s':\n%s", want[i], s);
  if (measured && (!strstr(s, "Collective bandwidth") || !strstr(s, "Bucket cap") || !strstr(s, "Per rank (first")))
    fail_msg("the report lacks a measured section:\n%s", s);
  /* the engine's own validation (planned = measured per rank, the collectives' busbw) is in the
   * appendix, after every section of evidence */
  const char *app = strstr(s, "## Appendix: the engine's own validation");
  if (measured) {
    if (!app) fail_msg("the report lacks its appendix:\n%s", s);
    const char *pm = strstr(s, "Memory per rank: planned = measured"), *cb = strstr(s, "Collective bandwidth");
    if (!pm || pm < app || !cb || cb < app || !strstr(pm, "| yes |"))
      fail_msg("planned = measured and the collectives belong in the appendix:\n%s", s);
  }
  /* one row per article claim: the modeled second numbers are in their measured rows */
  assert_non_null(strstr(s, "## Suite checks"));
  assert_null(strstr(s, "| `speedup_2_modeled`"));
  assert_non_null(strstr(s, "| `speedup_2` |"));
  if (!measured) assert_non_null(strstr(s, "not measured here"));
  assert_null(strstr(s, "nan"));
  assert_null(strstr(s, "(null)"));
  free(text);
}

int main(int argc, char **argv) {
  /* under mpirun this executable is what the hooks start (themselves, as `vramlab`): the
   * case's worker and the collective benchmark */
  if (argc >= 2 && !strcmp(argv[1], "worker")) return vl_case_worker_main(argc - 2, argv + 2);
  if (argc >= 3 && !strcmp(argv[1], "bench") && vl_collbench_is(argv[2])) return vl_collbench_main(argc - 2, argv + 2);
  /* under the sanitizers (make asan), as tests/mpirun.sh does for the MPI tests: the slow
   * unwinder, so tests/lsan.supp sees that Open MPI allocated its process-lifetime blocks in
   * the ranks this test starts, and Open MPI's components kept loaded for their names */
  const char *asan = getenv("ASAN_OPTIONS");
  if (asan && !strstr(asan, "fast_unwind_on_malloc")) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s:fast_unwind_on_malloc=0", asan);
    setenv("ASAN_OPTIONS", buf, 1);
  }
  if (asan) setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_time_model),
      cmocka_unit_test(test_median_leaves_out_disturbed),
      cmocka_unit_test(test_plan_relations),
      cmocka_unit_test(test_knob_errors),
      cmocka_unit_test(test_seg_defaults_shared),
      cmocka_unit_test(test_tiny_two_rank_run),
      cmocka_unit_test(test_failing_worker_ends_the_job),
      cmocka_unit_test(test_no_mpirun_not_measured),
      cmocka_unit_test(test_golden_plans),
      cmocka_unit_test(test_report_of_a_tiny_ladder),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
