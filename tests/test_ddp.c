/* The data-parallel wrapper on one process (vramlab/ddp.h): PyTorch's bucket assignment
 * against a fixture written by torch.distributed's own function
 * (tests/torch/make_ddp_buckets.py), ZeRO-1's layout, and per-rank memory planned through
 * vl_run_plan of vl_model_dist for any world and rank: single equals the inner model,
 * DDP's comm bytes are its buckets', grad_as_bucket_view adds nothing, ZeRO-1 keeps this
 * rank's optimizer shard only, DP's replicas keep no optimizer state. Then real steps on
 * one rank: DDP, grad_as_bucket_view, ZeRO-1 and DP at world 1 equal the model alone.
 * The 2-rank behaviour is tests/mpi_ddp.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"
#include "vramlab/ddp.h"
#include "vramlab/mistral.h"
#include "vramlab/resunet.h"
#include "vramlab/run.h"

#define ALIGN(b) (((b) + VL_ARENA_ALIGN - 1) / VL_ARENA_ALIGN * VL_ARENA_ALIGN)

static vl_mistral_model_cfg mistral_cfg(const char *scale) {
  vl_mistral_model_cfg k;
  assert_int_equal(vl_mistral_preset(scale, &k.mc), 0);
  vl_train_cfg_default(&k.tc);
  return k;
}

static vl_resunet_model_cfg resunet_cfg(const char *scale) {
  vl_resunet_model_cfg k;
  assert_int_equal(vl_resunet_preset(scale, &k.mc), 0);
  vl_resunet_train_cfg_default(&k.tc);
  return k;
}

/* Bytes of every trainable parameter's fp32 gradient, in the model's parameter order, from
 * the model made on a plan context. Returns the count; *out malloc'd. */
static int grad_bytes(const vl_model_type *t, const void *cfg, size_t **out) {
  vl_ctx *c;
  assert_int_equal(vl_ctx_create_ex(&c, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CUDA), VL_OK);
  vl_model *m;
  assert_int_equal(vl_model_create(c, t, cfg, 1, &m), VL_OK);
  vl_train_state ts;
  assert_int_equal(vl_model_train_state(m, &ts), VL_OK);
  *out = malloc((size_t)ts.n * sizeof **out);
  int n = 0;
  for (int i = 0; i < ts.n; i++)
    if (ts.p[i].trainable && ts.p[i].rows * ts.p[i].cols > 0)
      (*out)[n++] = (size_t)(ts.p[i].rows * ts.p[i].cols) * 4;
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  return n;
}

/* ---- PyTorch's bucket assignment ------------------------------------------------------- */

static cJSON *load_fixture(void) {
  uint8_t *text;
  tu_slurp(VRAMLAB_SOURCE_DIR "/tests/fixtures/ddp_buckets.json", &text);
  cJSON *j = cJSON_Parse((const char *)text);
  free(text);
  assert_non_null(j);
  return j;
}

/* Every case of the fixture: our assignment equals torch's, bucket for bucket. */
static void test_buckets_equal_torch(void **state) {
  (void)state;
  cJSON *j = load_fixture();
  const cJSON *lists = cJSON_GetObjectItem(j, "lists"), *cases = cJSON_GetObjectItem(j, "cases"), *c;
  assert_true(cJSON_GetArraySize(cases) >= 40);
  int checked = 0, multi = 0;
  cJSON_ArrayForEach(c, cases) {
    const char *name = cJSON_GetObjectItem(c, "list")->valuestring;
    const cJSON *list = cJSON_GetObjectItem(lists, name), *bk = cJSON_GetObjectItem(c, "buckets");
    int n = cJSON_GetArraySize(list), nb = cJSON_GetArraySize(bk);
    size_t *bytes = malloc((size_t)n * sizeof *bytes);
    int *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
    for (int i = 0; i < n; i++) {
      bytes[i] = (size_t)cJSON_GetArrayItem(list, i)->valuedouble;
      want[i] = -1;
    }
    for (int b = 0; b < nb; b++) {
      const cJSON *idx;
      cJSON_ArrayForEach(idx, cJSON_GetArrayItem(bk, b)) want[idx->valueint] = b;
    }
    size_t first = (size_t)cJSON_GetObjectItem(c, "first_cap")->valuedouble;
    size_t cap = (size_t)cJSON_GetObjectItem(c, "cap")->valuedouble;
    int ours = vl_ddp_assign_buckets(bytes, n, first, cap, got);
    if (ours != nb) print_error("%s first %zu cap %zu: %d buckets, torch %d\n", name, first, cap, ours, nb);
    assert_int_equal(ours, nb);
    for (int i = 0; i < n; i++) {
      if (got[i] != want[i])
        print_error("%s first %zu cap %zu: tensor %d in bucket %d, torch %d\n", name, first, cap, i,
                    got[i], want[i]);
      assert_int_equal(got[i], want[i]);
    }
    checked++;
    multi += nb > 2;
    free(bytes);
    free(want);
    free(got);
  }
  assert_true(checked >= 40 && multi >= 10); /* most cases split into several buckets */
  cJSON_Delete(j);
}

/* The fixture's model lists are our models' gradients, in our parameter order. */
static void test_fixture_lists_are_the_models(void **state) {
  (void)state;
  cJSON *j = load_fixture();
  const cJSON *lists = cJSON_GetObjectItem(j, "lists");
  const char *scales[3] = {"tiny", "small", "full"};
  for (int m = 0; m < 5; m++) {
    char name[32];
    size_t *bytes;
    int n;
    if (m < 2) {
      vl_mistral_model_cfg k = mistral_cfg(scales[m]);
      snprintf(name, sizeof name, "mistral-%s", scales[m]);
      n = grad_bytes(&vl_model_mistral, &k, &bytes);
    } else {
      vl_resunet_model_cfg k = resunet_cfg(scales[m - 2]);
      snprintf(name, sizeof name, "resunet-%s", scales[m - 2]);
      n = grad_bytes(&vl_model_resunet, &k, &bytes);
    }
    const cJSON *list = cJSON_GetObjectItem(lists, name);
    assert_non_null(list);
    assert_int_equal(cJSON_GetArraySize(list), n);
    for (int i = 0; i < n; i++) assert_true((size_t)cJSON_GetArrayItem(list, i)->valuedouble == bytes[i]);
    free(bytes);
  }
  cJSON_Delete(j);
}

/* Hand-checked corners: a bucket closes at its limit (the crossing tensor inside), the
 * first limit applies once, DDP's reversal, 0 means the defaults. */
static void test_buckets_by_hand(void **state) {
  (void)state;
  size_t a[5] = {600, 500, 100, 1000, 1};
  int b[5];
  /* creation: {0,1} (1100 >= 1000), {2,3} (1100 >= 1000), {4}; reversed */
  assert_int_equal(vl_ddp_assign_buckets(a, 5, 1000, 1000, b), 3);
  int want[5] = {2, 2, 1, 1, 0};
  assert_memory_equal(b, want, sizeof want);
  /* first cap 100: {0}, then cap 2000: {1,2,3} (1600 < 2000 ... 1601), {4} joins */
  assert_int_equal(vl_ddp_assign_buckets(a, 5, 100, 2000, b), 2);
  int want2[5] = {1, 0, 0, 0, 0};
  assert_memory_equal(b, want2, sizeof want2);
  /* defaults: everything under 1 MiB is one bucket */
  assert_int_equal(vl_ddp_assign_buckets(a, 5, 0, 0, b), 1);
  size_t big[3] = {VL_DDP_FIRST_BUCKET_CAP, VL_DDP_BUCKET_CAP - 1, 1};
  assert_int_equal(vl_ddp_assign_buckets(big, 3, 0, 0, b), 2);
  assert_int_equal(b[0], 1);
  assert_int_equal(b[1], 0);
  assert_int_equal(b[2], 0);
}

static void test_zero_layout_and_names(void **state) {
  (void)state;
  int64_t p, s;
  vl_zero_layout(10, 4, &p, &s);
  assert_true(p == 12 && s == 3);
  vl_zero_layout(8, 8, &p, &s);
  assert_true(p == 8 && s == 1);
  vl_zero_layout(7, 1, &p, &s);
  assert_true(p == 7 && s == 7);
  vl_zero_layout(0, 3, &p, &s);
  assert_true(p == 0 && s == 0);
  vl_zero_layout(1, 8, &p, &s);
  assert_true(p == 8 && s == 1);
  for (int m = 0; m < VL_DIST_COUNT; m++) {
    vl_dist_mode got;
    assert_int_equal(vl_dist_mode_parse(vl_dist_mode_name((vl_dist_mode)m), &got), 0);
    assert_int_equal(got, m);
  }
  vl_dist_mode got;
  assert_int_equal(vl_dist_mode_parse("zero2", &got), -1);
  assert_string_equal(vl_dist_mode_name(VL_DIST_ZERO1), "zero1");
}

/* ---- planned memory ---------------------------------------------------------------------- */

typedef struct {
  const char *name;
  const vl_model_type *type;
  const void *cfg;
  int64_t B;
} model_case;

static vl_mistral_model_cfg g_mis;
static vl_resunet_model_cfg g_seg;

static void cases(model_case out[2]) {
  g_mis = mistral_cfg("tiny");
  g_seg = resunet_cfg("tiny");
  out[0] = (model_case){"mistral-tiny", &vl_model_mistral, &g_mis, 2};
  out[1] = (model_case){"resunet-tiny", &vl_model_resunet, &g_seg, 2};
}

static vl_dist_cfg dcfg(const model_case *m, vl_dist_mode mode, int world, int rank) {
  vl_dist_cfg k;
  memset(&k, 0, sizeof k);
  k.inner = m->type;
  k.inner_cfg = m->cfg;
  k.mode = mode;
  k.world = world;
  k.rank = rank;
  k.overlap = true;
  return k;
}

static void plan(const vl_model_type *t, const void *cfg, int64_t B, int64_t accum, vl_plan_result *p) {
  vl_step_spec s = {.type = t, .cfg = cfg, .seed = 1, .batch = {0}, .accum = accum};
  vl_step_spec_set_batch(&s, B);
  vl_status st = vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, true, p);
  if (st != VL_OK) print_error("plan: %s\n", p->err);
  assert_int_equal(st, VL_OK);
}

static void plan_dist(const model_case *m, const vl_dist_cfg *k, int64_t accum, vl_plan_result *p) {
  plan(&vl_model_dist, k, m->B, accum, p);
}

static void assert_same_plan(const vl_plan_result *a, const vl_plan_result *b) {
  assert_int_equal(a->mem.peak_total, b->mem.peak_total);
  for (int c = 0; c < VL_MEM_NCAT; c++) {
    assert_int_equal(a->mem.peak[c], b->mem.peak[c]);
    assert_int_equal(a->mem.at_peak[c], b->mem.at_peak[c]);
  }
  assert_true(a->flops == b->flops && a->bytes_moved == b->bytes_moved);
  assert_int_equal(a->params.total, b->params.total);
  assert_int_equal(a->n_timeline, b->n_timeline);
  for (size_t i = 0; i < a->n_timeline; i++) assert_int_equal(a->timeline[i].bytes, b->timeline[i].bytes);
}

/* world 1 single is the inner model, byte for byte (accumulation too). */
static void test_plan_single_is_inner(void **state) {
  (void)state;
  model_case mc[2];
  cases(mc);
  for (int i = 0; i < 2; i++) {
    vl_dist_cfg k = dcfg(&mc[i], VL_DIST_SINGLE, 1, 0);
    for (int64_t accum = 1; accum <= 3; accum += 2) {
      vl_plan_result a, b;
      plan(mc[i].type, mc[i].cfg, mc[i].B, accum, &a);
      plan_dist(&mc[i], &k, accum, &b);
      assert_same_plan(&a, &b);
      vl_plan_result_free(&a);
      vl_plan_result_free(&b);
    }
  }
}

/* Sum over buckets of their aligned fp32 bytes, for the model's gradients. */
static size_t bucket_bytes(const model_case *m, size_t first, size_t cap, int *nb, size_t *elems) {
  size_t *bytes;
  int n = grad_bytes(m->type, m->cfg, &bytes);
  int *b = malloc((size_t)n * sizeof *b);
  *nb = vl_ddp_assign_buckets(bytes, n, first, cap, b);
  size_t *per = calloc((size_t)*nb, sizeof *per), sum = 0;
  *elems = 0;
  for (int i = 0; i < n; i++) {
    per[b[i]] += bytes[i];
    *elems += bytes[i] / 4;
  }
  for (int i = 0; i < *nb; i++) sum += ALIGN(per[i]);
  free(per);
  free(b);
  free(bytes);
  return sum;
}

/* DDP: comm bytes are exactly the buckets' (aligned fp32), live all along, so the peak is
 * the single rank's plus them; the step moves every gradient into a bucket and back. */
static void test_plan_ddp_comm_bytes(void **state) {
  (void)state;
  model_case mc[2];
  cases(mc);
  for (int i = 0; i < 2; i++) {
    for (int caps = 0; caps < 2; caps++) {
      size_t first = caps ? 16 << 10 : 0, cap = caps ? 64 << 10 : 0;
      int nb;
      size_t elems, want = bucket_bytes(&mc[i], first, cap, &nb, &elems);
      assert_true(caps == 0 || nb >= 4);
      for (int world = 2; world <= 8; world *= 4) {
        vl_dist_cfg k = dcfg(&mc[i], VL_DIST_DDP, world, world - 1);
        k.first_bucket_cap = first;
        k.bucket_cap = cap;
        vl_plan_result single, ddp;
        plan(mc[i].type, mc[i].cfg, mc[i].B, 1, &single);
        plan_dist(&mc[i], &k, 1, &ddp);
        assert_int_equal(ddp.mem.peak[VL_MEM_COMM], want);
        assert_int_equal(ddp.mem.at_peak[VL_MEM_COMM], want);
        assert_int_equal(ddp.mem.peak_total, single.mem.peak_total + want);
        assert_int_equal(ddp.mem.at_peak[VL_MEM_GRADS], single.mem.at_peak[VL_MEM_GRADS]);
        assert_true(ddp.flops == single.flops);
        assert_true(ddp.bytes_moved == single.bytes_moved + 16.0 * (double)elems); /* in + back */
        vl_plan_result_free(&single);
        vl_plan_result_free(&ddp);
      }
    }
  }
}

/* grad_as_bucket_view: the gradients live in the buckets; nothing added, no grads at peak. */
static void test_plan_grad_as_bucket_view(void **state) {
  (void)state;
  model_case mc[2];
  cases(mc);
  for (int i = 0; i < 2; i++) {
    vl_dist_cfg k = dcfg(&mc[i], VL_DIST_DDP, 4, 1);
    k.grad_as_bucket_view = true;
    k.first_bucket_cap = 16 << 10;
    k.bucket_cap = 64 << 10;
    int nb;
    size_t elems, want = bucket_bytes(&mc[i], k.first_bucket_cap, k.bucket_cap, &nb, &elems);
    vl_plan_result single, v;
    plan(mc[i].type, mc[i].cfg, mc[i].B, 2, &single);
    plan_dist(&mc[i], &k, 2, &v);
    assert_int_equal(v.mem.at_peak[VL_MEM_GRADS], 0);
    assert_int_equal(v.mem.at_peak[VL_MEM_COMM], want);
    assert_true(want <= single.mem.at_peak[VL_MEM_GRADS]); /* one alignment per bucket */
    assert_true(v.mem.peak_total <= single.mem.peak_total);
    assert_int_equal(v.mem.peak_total,
                     single.mem.peak_total - single.mem.at_peak[VL_MEM_GRADS] + want);
    assert_true(v.bytes_moved == single.bytes_moved); /* no copies */
    vl_plan_result_free(&single);
    vl_plan_result_free(&v);
  }
}

/* Optimizer bytes of rank r's ZeRO-1 shard, computed here from the layout: AdamW's two
 * (1, len) fp32 tensors per parameter slice inside the shard, each aligned. */
static size_t zero_optim_bytes(const model_case *m, int world, int rank, size_t *flat) {
  size_t *bytes;
  int n = grad_bytes(m->type, m->cfg, &bytes);
  int64_t total = 0, padded, shard;
  for (int i = 0; i < n; i++) total += (int64_t)bytes[i] / 4;
  vl_zero_layout(total, world, &padded, &shard);
  int64_t s0 = rank * shard, s1 = s0 + shard, off = 0;
  size_t sum = 0;
  for (int i = 0; i < n; i++) {
    int64_t a = off, b = off + (int64_t)bytes[i] / 4;
    int64_t lo = a > s0 ? a : s0, hi = b < s1 ? b : s1;
    if (hi > lo) sum += 2 * ALIGN((size_t)(hi - lo) * 4);
    off = b;
  }
  *flat = ALIGN((size_t)padded * 4);
  free(bytes);
  return sum;
}

static void test_plan_zero1_shard(void **state) {
  (void)state;
  model_case mc[2];
  cases(mc);
  for (int i = 0; i < 2; i++) {
    vl_plan_result single;
    plan(mc[i].type, mc[i].cfg, mc[i].B, 1, &single);
    size_t flat, total = 0;
    for (int r = 0; r < 4; r++) {
      vl_dist_cfg k = dcfg(&mc[i], VL_DIST_ZERO1, 4, r);
      vl_plan_result z;
      plan_dist(&mc[i], &k, 1, &z);
      size_t want = zero_optim_bytes(&mc[i], 4, r, &flat);
      assert_int_equal(z.mem.peak[VL_MEM_OPTIM], want);
      assert_int_equal(z.mem.peak[VL_MEM_COMM], flat);
      assert_int_equal(z.mem.at_peak[VL_MEM_GRADS], 0);
      assert_true(want < single.mem.peak[VL_MEM_OPTIM] / 3); /* about a quarter */
      total += want;
      vl_plan_result_free(&z);
    }
    /* the four shards hold every element once (each slice aligned on its own) */
    assert_true(total + 0 >= single.mem.peak[VL_MEM_OPTIM] / 2);
    /* world 1: the shard is every parameter whole, exactly the model's optimizer */
    vl_dist_cfg k1 = dcfg(&mc[i], VL_DIST_ZERO1, 1, 0);
    vl_plan_result z1;
    plan_dist(&mc[i], &k1, 1, &z1);
    assert_int_equal(z1.mem.peak[VL_MEM_OPTIM], single.mem.peak[VL_MEM_OPTIM]);
    vl_plan_result_free(&z1);
    vl_plan_result_free(&single);
  }
}

/* DP: the batch each rank passes is the global one; a replica keeps no optimizer state and
 * its data on the device is its shard's; rank 0 keeps all of the model's. */
static void test_plan_dp(void **state) {
  (void)state;
  model_case mc[2];
  cases(mc);
  for (int i = 0; i < 2; i++) {
    vl_plan_result single;
    plan(mc[i].type, mc[i].cfg, mc[i].B, 1, &single);
    vl_dist_cfg k = dcfg(&mc[i], VL_DIST_DP, 3, 0);
    vl_batch b;
    vl_model_dist.plan_batch(&k, mc[i].B, &b);
    assert_int_equal(vl_batch_samples(&b), 3 * mc[i].B);
    for (int r = 0; r < 3; r++) {
      k.rank = r;
      vl_plan_result p;
      plan_dist(&mc[i], &k, 1, &p);
      assert_int_equal(p.mem.peak[VL_MEM_DATA], single.mem.peak[VL_MEM_DATA]);
      assert_int_equal(p.mem.peak[VL_MEM_OPTIM], r == 0 ? single.mem.peak[VL_MEM_OPTIM] : 0);
      assert_true(p.mem.peak[VL_MEM_COMM] > 0);
      vl_plan_result_free(&p);
    }
    vl_plan_result_free(&single);
  }
}

/* A model without train_state, Adafactor under ZeRO-1, a rank outside the world. */
static void test_refusals(void **state) {
  (void)state;
  model_case mc[2];
  cases(mc);
  vl_model_type bare = vl_model_mistral;
  bare.train_state = NULL;
  model_case m = mc[0];
  m.type = &bare;
  vl_dist_cfg k = dcfg(&m, VL_DIST_DDP, 2, 0);
  vl_step_spec s = {.type = &vl_model_dist, .cfg = &k, .seed = 1, .batch = {0}, .accum = 1};
  vl_step_spec_set_batch(&s, 2);
  vl_plan_result p;
  assert_int_equal(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &p), VL_ERR_UNSUPPORTED);
  assert_non_null(strstr(p.err, "train_state"));
  assert_non_null(strstr(p.err, "mistral"));
  k.mode = VL_DIST_SINGLE; /* single needs nothing from the model */
  assert_int_equal(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &p), VL_OK);

  vl_mistral_model_cfg af = mistral_cfg("tiny");
  af.tc.optim.opt = VL_OPT_ADAFACTOR;
  m = mc[0];
  m.cfg = &af;
  k = dcfg(&m, VL_DIST_ZERO1, 2, 1);
  s.cfg = &k;
  assert_int_equal(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &p), VL_ERR_UNSUPPORTED);
  assert_non_null(strstr(p.err, "Adafactor"));
  k.mode = VL_DIST_DDP; /* plain DDP runs any optimizer */
  assert_int_equal(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &p), VL_OK);

  k = dcfg(&mc[0], VL_DIST_DDP, 2, 2);
  s.cfg = &k;
  assert_int_equal(vl_run_plan(&s, VL_NO_CAP, VL_DEV_CUDA, false, &p), VL_ERR_INVALID);
  assert_non_null(strstr(p.err, "rank 2 of world 2"));
  /* a run context with world 2 and no communicator */
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  k = dcfg(&mc[0], VL_DIST_DDP, 2, 0);
  vl_model *mm;
  assert_int_equal(vl_model_create(c, &vl_model_dist, &k, 1, &mm), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "communicator"));
  vl_mem_stats ms;
  vl_arena_stats(c->arena, &ms);
  assert_int_equal(ms.cur_total, 0);
  vl_ctx_destroy(c);
  vl_dist_stats st;
  assert_int_equal(vl_dist_stats_get(NULL, &st), VL_ERR_INVALID);
  assert_null(vl_dist_inner(NULL));
}

/* Per-rank planned memory of the U-Net full (512x512, batch 8 per rank, fp32, AdamW) for
 * 1, 2, 4, 8 ranks, DDP against ZeRO-1 (printed for the report), and planning stays fast. */
static void test_plan_full_unet_per_rank(void **state) {
  (void)state;
  vl_resunet_model_cfg k = resunet_cfg("full");
  model_case m = {"resunet-full", &vl_model_resunet, &k, 8};
  size_t prev_zero = SIZE_MAX, ddp1 = 0, elems;
  int nb;
  bucket_bytes(&m, 0, 0, &nb, &elems);
  for (int world = 1; world <= 8; world *= 2) {
    vl_dist_cfg d = dcfg(&m, VL_DIST_DDP, world, world - 1), z = dcfg(&m, VL_DIST_ZERO1, world, world - 1);
    vl_plan_result pd, pz;
    double t0 = vl_now();
    plan_dist(&m, &d, 1, &pd);
    double t1 = vl_now();
    plan_dist(&m, &z, 1, &pz);
    double t2 = vl_now();
    const vl_plan_result *pr[2] = {&pd, &pz};
    for (int v = 0; v < 2; v++) {
      const vl_mem_stats *ms = &pr[v]->mem;
      char tot[32], pa[32], gr[32], op[32], co[32];
      printf("resunet-full B=8 %-5s world %d: peak %s = params %s + grads %s + optim %s + comm %s + "
             "the step's (%zu bytes; %d buckets of DDP; planned in %.3f s)\n",
             v ? "zero1" : "ddp", world, vl_fmt_bytes(ms->peak_total, tot, sizeof tot),
             vl_fmt_bytes(ms->at_peak[VL_MEM_PARAMS], pa, sizeof pa),
             vl_fmt_bytes(ms->at_peak[VL_MEM_GRADS], gr, sizeof gr),
             vl_fmt_bytes(ms->at_peak[VL_MEM_OPTIM], op, sizeof op),
             vl_fmt_bytes(ms->at_peak[VL_MEM_COMM], co, sizeof co), ms->peak_total, nb,
             v ? t2 - t1 : t1 - t0);
    }
    assert_true(t1 - t0 < 5.0 && t2 - t1 < 5.0);
    if (world == 1) ddp1 = pd.mem.peak_total;
    assert_int_equal(pd.mem.peak_total, ddp1); /* plain DDP: the same copy on every card */
    assert_true(pz.mem.peak_total < prev_zero || world == 1);
    assert_true(world == 1 || pz.mem.peak_total < pd.mem.peak_total);
    prev_zero = pz.mem.peak_total;
    vl_plan_result_free(&pd);
    vl_plan_result_free(&pz);
  }
}

/* ---- real steps on one rank ----------------------------------------------------------------- */

/* Mistral tiny, full sequences (every target valid), 3 steps: losses and parameters. */
static void run_mistral(const vl_model_type *t, const void *cfg, int64_t B, int nsteps, double *loss,
                        float **params, int64_t *nparam) {
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_model *m;
  assert_int_equal(vl_model_create(c, t, cfg, 7, &m), VL_OK);
  int64_t T = 32, bt[2] = {B, T};
  int32_t *tok = malloc((size_t)(B * T) * 4), *tgt = malloc((size_t)(B * T) * 4);
  vl_rng r;
  vl_rng_seed(&r, 99);
  for (int s = 0; s < nsteps; s++) {
    for (int64_t i = 0; i < B * T; i++) {
      tok[i] = (int32_t)vl_rng_below(&r, 256);
      tgt[i] = (int32_t)vl_rng_below(&r, 256);
    }
    vl_batch b = {0};
    vl_batch_add(&b, "tokens", VL_I32, 2, bt, tok);
    vl_batch_add(&b, "targets", VL_I32, 2, bt, tgt);
    vl_step_info info;
    vl_status st = vl_model_step(m, &b, 1, &info);
    if (st != VL_OK) print_error("step: %s\n", c->err);
    assert_int_equal(st, VL_OK);
    loss[s] = info.loss;
  }
  vl_model *inner = t == &vl_model_dist ? vl_dist_inner(m) : m;
  vl_train_state ts;
  assert_int_equal(vl_model_train_state(inner, &ts), VL_OK);
  int64_t n = 0;
  for (int i = 0; i < ts.n; i++) n += ts.p[i].trainable ? ts.p[i].rows * ts.p[i].cols : 0;
  *params = malloc((size_t)n * 4);
  *nparam = n;
  int64_t o = 0;
  for (int i = 0; i < ts.n; i++) {
    if (!ts.p[i].trainable) continue;
    assert_int_equal(vl_param_read(c, &ts.p[i], *params + o), VL_OK);
    o += ts.p[i].rows * ts.p[i].cols;
  }
  if (t == &vl_model_dist) {
    vl_dist_stats ds;
    assert_int_equal(vl_dist_stats_get(m, &ds), VL_OK);
    assert_int_equal(ds.steps, nsteps);
    assert_true(ds.compute_s > 0 && ds.step_s >= ds.compute_s);
  }
  free(tok);
  free(tgt);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
}

/* One rank: DDP (overlap on/off, bucket views), ZeRO-1 and DP equal the model alone, bit
 * for bit (no clipping, so the norm's summation order does not enter). */
static void test_world1_equals_model(void **state) {
  (void)state;
  vl_mistral_model_cfg k = mistral_cfg("tiny");
  k.tc.clip = 0;
  model_case m = {"mistral-tiny", &vl_model_mistral, &k, 2};
  double ref_loss[3], loss[3];
  float *ref, *got;
  int64_t n, n2;
  run_mistral(&vl_model_mistral, &k, 2, 3, ref_loss, &ref, &n);
  for (int v = 0; v < 5; v++) {
    vl_dist_cfg d = dcfg(&m, v == 3 ? VL_DIST_ZERO1 : v == 4 ? VL_DIST_DP : VL_DIST_DDP, 1, 0);
    d.overlap = v != 1;
    d.grad_as_bucket_view = v == 2;
    d.first_bucket_cap = 8 << 10; /* several buckets */
    d.bucket_cap = 32 << 10;
    run_mistral(&vl_model_dist, &d, 2, 3, loss, &got, &n2);
    assert_int_equal(n, n2);
    for (int s = 0; s < 3; s++) assert_true(loss[s] == ref_loss[s]);
    assert_memory_equal(got, ref, (size_t)n * 4);
    free(got);
  }
  free(ref);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_buckets_equal_torch),
      cmocka_unit_test(test_fixture_lists_are_the_models),
      cmocka_unit_test(test_buckets_by_hand),
      cmocka_unit_test(test_zero_layout_and_names),
      cmocka_unit_test(test_plan_single_is_inner),
      cmocka_unit_test(test_plan_ddp_comm_bytes),
      cmocka_unit_test(test_plan_grad_as_bucket_view),
      cmocka_unit_test(test_plan_zero1_shard),
      cmocka_unit_test(test_plan_dp),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_plan_full_unet_per_rank),
      cmocka_unit_test(test_world1_equals_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
