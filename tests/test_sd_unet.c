/* The SD 1.5 U-Net (engine/models/sd_unet*.c): the full-scale parameter names, shapes and
 * counts (diffusers' state_dict, tests/fixtures/sd15_params_unet.txt; peft's LoRA count),
 * full-scale plans of a LoRA step (time, peak by category, classic vs efficient attention,
 * checkpointing), planned peak == measured peak on the CPU at tiny scale, checkpointed ==
 * plain gradients bit for bit, classic == efficient within rounding, finite differences
 * through the whole network, forward-only and OOM recovery, and parity with diffusers'
 * UNet2DConditionModel + peft LoRA in float64 (tests/fixtures/sd_unet_parity.bin). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/backend.h"
#include "vramlab/sd_unet.h"

#include "sd_fixture.c"
#include "sd_unet_fx.c"

#define OK(expr) assert_int_equal((expr), VL_OK)

/* ---- a batch on the device, a step ------------------------------------------------------- */

typedef struct {
  vl_tensor x;     // (B, in_ch, S, S) fp32 noisy latents
  vl_tensor noise; // (B, in_ch, S, S) fp32 the target
  vl_tensor t;     // (B) int32 timesteps
  vl_tensor ctx;   // (B, L, ctx_dim) text context
} dbatch;

static void upload_f32(vl_ctx *c, vl_tensor *t, const float *h) {
  if (c->plan) return;
  if (t->dtype == VL_F32) {
    OK(c->be->upload(c, t, 0, h, t->bytes));
    return;
  }
  vl_tensor src = tu_tnew(c, VL_F32, t->n, h);
  OK(vl_convert_run(c, &(vl_convert_args){.y = t, .x = &src, .n = t->n}));
  vl_tensor_free(c, &src);
}

static void batch_make(vl_ctx *c, const vl_sd_unet_cfg *g, int64_t B, vl_dtype ctx_dt,
                       uint64_t seed, dbatch *b) {
  int64_t S = g->sample, xs[4] = {B, g->in_ch, S, S}, cs[3] = {B, g->ctx_len, g->ctx_dim};
  OK(vl_tensor_alloc(c, &b->x, VL_F32, VL_MEM_DATA, 4, xs));
  OK(vl_tensor_alloc(c, &b->noise, VL_F32, VL_MEM_DATA, 4, xs));
  OK(vl_tensor_alloc(c, &b->t, VL_I32, VL_MEM_DATA, 1, &B));
  OK(vl_tensor_alloc(c, &b->ctx, ctx_dt, VL_MEM_DATA, 3, cs));
  if (c->plan) return;
  float *h = tu_randn_new(b->ctx.n, 1.0f, seed);
  upload_f32(c, &b->ctx, h);
  free(h);
  float *hx = tu_randn_new(b->x.n, 1.0f, seed + 1), *hn = tu_randn_new(b->x.n, 1.0f, seed + 2);
  upload_f32(c, &b->x, hx);
  upload_f32(c, &b->noise, hn);
  free(hx);
  free(hn);
  int32_t ts[64];
  for (int64_t i = 0; i < B; i++) ts[i] = (int32_t)((seed * 131 + (uint64_t)i * 379) % 1000);
  OK(c->be->upload(c, &b->t, 0, ts, (size_t)B * 4));
}

static void batch_free(vl_ctx *c, dbatch *b) {
  TU_TFREE(c, &b->ctx, &b->t, &b->noise, &b->x);
}

/* One LoRA training step as the script does it: forward, MSE against the noise (mean),
 * backward, then AdamW when apply. Returns the loss (0 on a plan context). */
static double train_step(vl_sd_unet *m, dbatch *b, bool apply) {
  vl_ctx *c = vl_sd_unet_ctx(m);
  vl_tensor pred, loss;
  OK(vl_sd_unet_forward(m, &b->x, &b->t, &b->ctx, true, &pred));
  int64_t B = pred.shape[0], per = pred.n / B;
  OK(vl_tensor_alloc(c, &loss, VL_F32, VL_MEM_TEMP, 1, &B));
  OK(vl_mse_fused_run(c, &(vl_mse_fused_args){.pred = &pred, .loss = &loss, .target = &b->noise,
                                              .R = B, .C = per,
                                              .dloss_scale = 1.0f / (float)pred.n}));
  double l = 0;
  if (!c->plan) {
    float lh[64];
    OK(c->be->download(c, lh, &loss, 0, (size_t)B * 4));
    for (int64_t i = 0; i < B; i++) l += lh[i];
    l /= (double)pred.n;
  }
  vl_tensor_free(c, &loss);
  OK(vl_sd_unet_backward(m, &pred));
  vl_tensor_free(c, &pred);
  if (apply) {
    vl_optim_cfg oc;
    vl_optim_cfg_default(&oc, 1e-4f);
    vl_scaler sc;
    vl_scaler_init(&sc, vl_sd_unet_config(m)->acts == VL_F16, 65536.0f, 2000);
    bool skipped;
    double norm;
    OK(vl_sd_unet_apply(m, &oc, 1.0f, &sc, &skipped, &norm));
  }
  return l;
}

static vl_sd_unet *make(vl_ctx *c, const vl_sd_unet_cfg *g, bool optim) {
  vl_sd_unet *m = NULL;
  OK(vl_sd_unet_create(c, g, 11, &m));
  if (optim) {
    vl_optim_cfg oc;
    vl_optim_cfg_default(&oc, 1e-4f);
    OK(vl_sd_unet_alloc_optim(m, &oc));
  }
  return m;
}

/* LoRA factors as the fixture sets them: A ~ N(0, 1/in), B ~ N(0, 0.2^2) (B non-zero, so
 * neither gradient vanishes). */
static void randomize_lora(vl_sd_unet *m, uint64_t seed) {
  vl_ctx *c = vl_sd_unet_ctx(m);
  int n;
  vl_param *p = vl_sd_unet_trainable(m, &n);
  for (int i = 0; i < n; i++) {
    bool isA = strstr(p[i].name, ".lora_A.") != NULL;
    float *h = tu_randn_new(p[i].rows * p[i].cols, isA ? 1.0f / sqrtf((float)p[i].cols) : 0.2f,
                            seed + (uint64_t)i);
    OK(vl_param_load(c, &p[i], h));
    free(h);
  }
}

static float *lora_grads(vl_sd_unet *m, int64_t *n_out) {
  vl_ctx *c = vl_sd_unet_ctx(m);
  int n;
  vl_param *p = vl_sd_unet_trainable(m, &n);
  int64_t tot = 0;
  for (int i = 0; i < n; i++) tot += p[i].rows * p[i].cols;
  float *g = malloc((size_t)tot * 4), *q = g;
  for (int i = 0; i < n; i++) {
    OK(vl_param_read_grad(c, &p[i], q));
    q += p[i].rows * p[i].cols;
  }
  *n_out = tot;
  return g;
}

/* ---- (1) parameters ------------------------------------------------------------------------ */

static void test_params_full(void **state) {
  (void)state;
  vl_sd_unet_cfg g;
  assert_int_equal(vl_sd_unet_preset("full", &g), 0);
  assert_int_equal(vl_sd_unet_preset("huge", &g), -1);
  assert_int_equal(vl_sd_unet_preset("full", &g), 0);
  vl_ctx *p;
  OK(vl_ctx_create(&p, VL_DEV_PLAN, VL_NO_CAP));
  vl_mem_stats st0, st;
  vl_arena_stats(p->arena, &st0); /* the plan target's fixed library workspace */
  vl_sd_unet *m = make(p, &g, false);
  vl_param_counts pc;
  vl_sd_unet_counts(m, &pc);
  /* diffusers UNet2DConditionModel with SD 1.5's config (tests/torch/sd_param_counts.py) */
  assert_int_equal(pc.total - pc.trainable, 859520964);
  /* peft LoRA r=4 on to_q/k/v/out.0 of attn1 and attn2: sum over the 16 transformers of
   * 4 r (2C + 2C) ... = 14 r C + 2 r 768 each; sum C = 12480 -> 797,184 */
  assert_int_equal(pc.trainable, 797184);
  int64_t by_mod = 0;
  for (int i = 0; i < pc.n_modules; i++) by_mod += pc.module_count[i];
  assert_int_equal(by_mod, 859520964);
  assert_int_equal(pc.module_count[0], 320 * 4 * 9 + 320);      /* conv_in */
  assert_int_equal(pc.module_count[1], 320 * 1280 + 1280 * 1280 + 2 * 1280); /* time_embedding */
  assert_int_equal(pc.module_count[5], 2 * 320 + 4 * 320 * 9 + 4); /* conv_norm_out + conv_out */
  print_message("  SD 1.5 U-Net: %lld frozen (down %lld, mid %lld, up %lld), LoRA r=4 %lld\n",
                (long long)(pc.total - pc.trainable), (long long)pc.module_count[2],
                (long long)pc.module_count[3], (long long)pc.module_count[4],
                (long long)pc.trainable);

  /* every frozen name and shape, in order, as diffusers' state_dict */
  char path[512];
  sdfx_fixture_path(path, sizeof path, "sd15_params_unet.txt");
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[512];
  int i = 0, n = vl_sd_unet_n_params(m);
  while (fgets(line, sizeof line, f)) {
    char name[256];
    int64_t d[4] = {0};
    int got = sscanf(line, "%255s %ld %ld %ld %ld", name, &d[0], &d[1], &d[2], &d[3]);
    assert_true(got >= 2);
    assert_true(i < n);
    const vl_param *pp = vl_sd_unet_param_at(m, i);
    if (strcmp(pp->name, name)) fail_msg("parameter %d: %s, state_dict has %s", i, pp->name, name);
    assert_false(pp->trainable);
    int64_t sh[4];
    int nd = vl_sd_unet_param_shape(m, i, sh);
    if (nd != got - 1) fail_msg("%s: %d dims, state_dict %d", name, nd, got - 1);
    for (int k = 0; k < nd; k++)
      if (sh[k] != d[k]) fail_msg("%s: dim %d is %ld, state_dict %ld", name, k, (long)sh[k], (long)d[k]);
    assert_ptr_equal(vl_sd_unet_param(m, name), pp);
    i++;
  }
  fclose(f);
  assert_int_equal(i, 686);
  /* then the 256 LoRA factors: trainable, fp32, named as peft's saved state dict */
  assert_int_equal(n, 686 + 256);
  const vl_param *a0 = vl_sd_unet_param_at(m, 686), *b0 = vl_sd_unet_param_at(m, 687);
  assert_string_equal(a0->name, "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.weight");
  assert_string_equal(b0->name, "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora_B.weight");
  assert_true(a0->trainable && a0->rows == 4 && a0->cols == 320 && a0->w.dtype == VL_F32);
  assert_true(b0->rows == 320 && b0->cols == 4);
  const vl_param *k2 = vl_sd_unet_param(m, "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.lora_A.weight");
  assert_non_null(k2);
  assert_true(k2->rows == 4 && k2->cols == 768);
  assert_null(vl_sd_unet_param(m, "mid_block.attentions.0.transformer_blocks.0.ff.net.2.lora_A.weight"));
  assert_null(vl_sd_unet_param_at(m, n));
  vl_arena_stats(p->arena, &st);
  assert_true(st.cur[VL_MEM_FROZEN] >= (size_t)859520964 * 4);
  vl_sd_unet_destroy(m);
  vl_arena_stats(p->arena, &st);
  assert_int_equal(st.cur_total, st0.cur_total);
  vl_ctx_destroy(p);
}

/* ---- (2) full-scale plans ---------------------------------------------------------------- */

typedef struct {
  vl_mem_stats st;
  double seconds, flops, flops_re;
} plan_out;

static plan_out plan_full(int64_t B, vl_attn_impl attn, bool ck) {
  vl_sd_unet_cfg g;
  assert_int_equal(vl_sd_unet_preset("full", &g), 0);
  g.weights = g.acts = VL_F16;
  g.attn = attn;
  g.checkpoint = ck;
  plan_out o = {0};
  double t0 = vl_now();
  vl_ctx *p;
  OK(vl_ctx_create(&p, VL_DEV_PLAN, VL_NO_CAP));
  vl_sd_unet *m = make(p, &g, true);
  dbatch b;
  batch_make(p, &g, B, VL_F16, 1, &b);
  train_step(m, &b, true);
  o.seconds = vl_now() - t0;
  vl_arena_stats(p->arena, &o.st);
  o.flops = p->flops;
  o.flops_re = p->flops_recompute;
  assert_int_equal(o.st.cur[VL_MEM_ACTS], 0);
  assert_int_equal(o.st.cur[VL_MEM_TEMP], 0);
  batch_free(p, &b);
  vl_sd_unet_destroy(m);
  vl_ctx_destroy(p);
  return o;
}

static void print_plan(const char *what, const plan_out *o) {
  char buf[VL_MEM_NCAT][32], tot[32];
  for (int k = 0; k < VL_MEM_NCAT; k++) vl_fmt_bytes(o->st.at_peak[k], buf[k], sizeof buf[k]);
  print_message("  %-26s peak %s: frozen %s params %s grads %s optim %s acts %s temp %s ws %s "
                "data %s | %.0f GFLOP (+%.0f recompute), planned in %.3f s\n",
                what, vl_fmt_bytes(o->st.peak_total, tot, sizeof tot), buf[VL_MEM_FROZEN],
                buf[VL_MEM_PARAMS], buf[VL_MEM_GRADS], buf[VL_MEM_OPTIM], buf[VL_MEM_ACTS],
                buf[VL_MEM_TEMP], buf[VL_MEM_WORKSPACE], buf[VL_MEM_DATA], o->flops / 1e9,
                o->flops_re / 1e9, o->seconds);
}

static void test_plan_full(void **state) {
  (void)state;
  const char *nm[2] = {"classic", "efficient"};
  plan_out r[2][2][2]; /* [B=1,8][attn][ck] */
  const int64_t Bs[2] = {1, 8};
  for (int bi = 0; bi < 2; bi++)
    for (int a = 0; a < 2; a++)
      for (int k = 0; k < 2; k++) {
        r[bi][a][k] = plan_full(Bs[bi], (vl_attn_impl)a, k);
        char what[64];
        snprintf(what, sizeof what, "B=%lld %s%s", (long long)Bs[bi], nm[a], k ? " ckpt" : "");
        print_plan(what, &r[bi][a][k]);
      }
  const plan_out *e1 = &r[0][VL_ATTN_EFFICIENT][0], *c1 = &r[0][VL_ATTN_CLASSIC][0];
  assert_true(e1->seconds < 0.5);
  /* fp16 frozen weights: 2 bytes each (+ alignment), LoRA params fp32 master + fp16 copy */
  assert_true(e1->st.at_peak[VL_MEM_FROZEN] >= (size_t)859520964 * 2);
  assert_true(e1->st.at_peak[VL_MEM_FROZEN] < (size_t)859520964 * 2 + (1u << 20));
  assert_true(e1->st.peak[VL_MEM_GRADS] >= 797184 * 4);
  assert_true(e1->st.peak[VL_MEM_OPTIM] >= 797184 * 8);
  /* classic attention keeps (B, 8, 4096, 4096) fp16 probabilities per 64x64 self-attention:
   * gigabytes more */
  assert_true(c1->st.peak_total > e1->st.peak_total + ((size_t)1 << 30));
  assert_true(r[1][VL_ATTN_CLASSIC][0].st.peak_total >
              r[1][VL_ATTN_EFFICIENT][0].st.peak_total + ((size_t)8 << 30));
  /* checkpointing lowers what is kept, and re-runs forwards */
  for (int bi = 0; bi < 2; bi++)
    for (int a = 0; a < 2; a++) {
      assert_true(r[bi][a][1].st.peak[VL_MEM_ACTS] < r[bi][a][0].st.peak[VL_MEM_ACTS] / 2);
      assert_true(r[bi][a][1].st.peak_total < r[bi][a][0].st.peak_total);
      assert_true(r[bi][a][1].flops_re > 0 && r[bi][a][0].flops_re == 0);
      assert_true(fabs(r[bi][a][1].flops - r[bi][a][0].flops) < 1e-9 * r[bi][a][0].flops);
    }
  /* model FLOPs scale with the batch */
  assert_true(fabs(r[1][1][0].flops / r[0][1][0].flops - 8) < 0.01);
}

/* ---- (3) planned == measured at tiny scale ------------------------------------------------- */

static vl_sd_unet_cfg tiny_cfg(vl_attn_impl attn, bool ck, vl_dtype weights, vl_dtype acts) {
  vl_sd_unet_cfg g;
  assert_int_equal(vl_sd_unet_preset("tiny", &g), 0);
  g.attn = attn;
  g.checkpoint = ck;
  g.weights = weights;
  g.acts = acts;
  return g;
}

static vl_mem_stats step_stats(vl_device dev, const vl_sd_unet_cfg *g, double *loss, double *secs) {
  vl_ctx *c;
  if (dev == VL_DEV_PLAN) OK(vl_ctx_create_ex(&c, VL_DEV_PLAN, VL_NO_CAP, VL_DEV_CPU));
  else OK(vl_ctx_create(&c, dev, VL_NO_CAP));
  vl_sd_unet *m = make(c, g, true);
  dbatch b;
  batch_make(c, g, 2, VL_F32, 3, &b);
  double t0 = vl_now();
  *loss = train_step(m, &b, true);
  if (secs) *secs = vl_now() - t0;
  vl_mem_stats st;
  vl_arena_stats(c->arena, &st);
  assert_int_equal(st.cur[VL_MEM_ACTS], 0);
  assert_int_equal(st.cur[VL_MEM_TEMP], 0);
  assert_int_equal(st.cur[VL_MEM_WORKSPACE], 0);
  assert_int_equal(st.n_bad_free, 0);
  batch_free(c, &b);
  vl_sd_unet_destroy(m);
  vl_arena_stats(c->arena, &st);
  assert_int_equal(st.cur_total, 0);
  vl_ctx_destroy(c);
  return st;
}

static void test_planned_equals_measured(void **state) {
  (void)state;
  const vl_dtype wd[2] = {VL_F32, VL_BF16};
  for (int a = 0; a < 2; a++)
    for (int k = 0; k < 2; k++)
      for (int w = 0; w < 2; w++) {
        vl_sd_unet_cfg g = tiny_cfg((vl_attn_impl)a, k, wd[w], VL_F32);
        double lp, lc, secs;
        vl_mem_stats sp = step_stats(VL_DEV_PLAN, &g, &lp, NULL);
        vl_mem_stats sc = step_stats(VL_DEV_CPU, &g, &lc, &secs);
        print_message("  tiny %-9s ckpt %d weights %-4s: peak %zu planned, %zu measured; loss %.5f; "
                      "step %.3f s\n", vl_attn_impl_name((vl_attn_impl)a), k, vl_dtype_name(wd[w]),
                      sp.peak_total, sc.peak_total, lc, secs);
        assert_true(isfinite(lc) && lc > 0.1);
        assert_int_equal(sp.peak_total, sc.peak_total);
        for (int cat = 0; cat < VL_MEM_NCAT; cat++) {
          assert_int_equal(sp.peak[cat], sc.peak[cat]);
          assert_int_equal(sp.at_peak[cat], sc.at_peak[cat]);
        }
        assert_int_equal(sp.n_alloc, sc.n_alloc);
      }
  /* AMP: bf16 activations too */
  vl_sd_unet_cfg g = tiny_cfg(VL_ATTN_EFFICIENT, true, VL_BF16, VL_BF16);
  double lp, lc;
  vl_mem_stats sp = step_stats(VL_DEV_PLAN, &g, &lp, NULL);
  vl_mem_stats sc = step_stats(VL_DEV_CPU, &g, &lc, NULL);
  assert_true(isfinite(lc));
  assert_int_equal(sp.peak_total, sc.peak_total);
}

/* ---- (4) equivalences ------------------------------------------------------------------------ */

static float *grads_of(const vl_sd_unet_cfg *g, int64_t *n, double *loss) {
  vl_ctx *c;
  OK(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP));
  vl_sd_unet *m = make(c, g, false);
  randomize_lora(m, 77);
  dbatch b;
  batch_make(c, g, 2, VL_F32, 5, &b);
  *loss = train_step(m, &b, false);
  float *gr = lora_grads(m, n);
  batch_free(c, &b);
  vl_sd_unet_destroy(m);
  vl_ctx_destroy(c);
  return gr;
}

static void test_equivalences(void **state) {
  (void)state;
  int64_t n0, n1, n2;
  double l0, l1, l2;
  vl_sd_unet_cfg g = tiny_cfg(VL_ATTN_EFFICIENT, false, VL_F32, VL_F32);
  float *plain = grads_of(&g, &n0, &l0);
  g.checkpoint = true;
  float *ck = grads_of(&g, &n1, &l1);
  g.checkpoint = false;
  g.attn = VL_ATTN_CLASSIC;
  float *cl = grads_of(&g, &n2, &l2);
  assert_int_equal(n0, n1);
  assert_int_equal(n0, n2);
  /* checkpointing changes memory, not math: the same bits */
  assert_true(l0 == l1);
  assert_memory_equal(plain, ck, (size_t)n0 * 4);
  /* classic vs efficient: the same math up to rounding */
  double amax = 0;
  for (int64_t i = 0; i < n0; i++) amax = fmax(amax, fabs(plain[i]));
  assert_true(amax > 1e-3);
  tu_assert_close(cl, plain, n0, 1e-5 * amax, 1e-3, "classic vs efficient LoRA gradients");
  assert_true(fabs(l2 - l0) <= 1e-5 * l0);
  print_message("  %lld LoRA gradient entries, max |g| %.4f; loss %.6f\n", (long long)n0, amax, l0);
  free(plain);
  free(ck);
  free(cl);
}

/* dL/dcontext of a U-Net without LoRA (a text encoder trained alone: the gradient sinks are
 * the cross-attentions only) equals that of one with peft's fresh LoRA (B = 0: a no-op). */
static float *dctx_of(vl_sd_unet_cfg g, int64_t *n) {
  vl_ctx *c;
  OK(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP));
  vl_sd_unet *m = make(c, &g, false);
  dbatch b;
  batch_make(c, &g, 2, VL_F32, 5, &b);
  train_step(m, &b, false);
  const vl_tensor *d = vl_sd_unet_dctx(m);
  assert_non_null(d);
  *n = d->n;
  float *h = malloc(d->bytes);
  OK(c->be->download(c, h, d, 0, d->bytes));
  batch_free(c, &b);
  vl_sd_unet_destroy(m);
  vl_ctx_destroy(c);
  return h;
}

static void test_context_gradient(void **state) {
  (void)state;
  vl_sd_unet_cfg g = tiny_cfg(VL_ATTN_EFFICIENT, false, VL_F32, VL_F32);
  g.ctx_grad = true;
  int64_t n0, n1, n2;
  float *with = dctx_of(g, &n0);
  g.lora_rank = 0;
  float *without = dctx_of(g, &n1);
  g.checkpoint = true;
  float *ck = dctx_of(g, &n2);
  assert_int_equal(n0, n1);
  assert_int_equal(n0, n2);
  double amax = 0;
  for (int64_t i = 0; i < n0; i++) amax = fmax(amax, fabs(with[i]));
  print_message("  dctx (mean-MSE loss) max |g| %.3g\n", amax);
  assert_true(amax > 1e-4);
  tu_assert_close(without, with, n0, 1e-6 * amax, 1e-5, "dctx without LoRA vs fresh LoRA");
  assert_memory_equal(ck, without, (size_t)n0 * 4);
  free(with);
  free(without);
  free(ck);
}

/* ---- (5) finite differences through the whole U-Net --------------------------------------- */

typedef struct {
  vl_ctx *c;
  vl_sd_unet *m;
  dbatch b;
  vl_tensor r;     // (B, out_ch, S, S) fp32 fixed random weights of the loss sum(pred * r)
  float *rh;
  vl_param *p;     /* the parameter perturbed */
  float *ph;       /* its values on the host */
} fd_ctx;

static double fd_loss(void *v) {
  fd_ctx *f = v;
  OK(vl_param_load(f->c, f->p, f->ph));
  vl_tensor pred;
  OK(vl_sd_unet_forward(f->m, &f->b.x, &f->b.t, &f->b.ctx, false, &pred));
  float *h = malloc(pred.bytes);
  OK(f->c->be->download(f->c, h, &pred, 0, pred.bytes));
  double s = tu_dot(h, f->rh, pred.n);
  free(h);
  vl_tensor_free(f->c, &pred);
  return s;
}

static void test_finite_differences(void **state) {
  (void)state;
  fd_ctx f;
  memset(&f, 0, sizeof f);
  vl_sd_unet_cfg g = tiny_cfg(VL_ATTN_EFFICIENT, true, VL_F32, VL_F32);
  g.ctx_grad = true;
  OK(vl_ctx_create(&f.c, VL_DEV_CPU, VL_NO_CAP));
  f.m = make(f.c, &g, false);
  randomize_lora(f.m, 99);
  batch_make(f.c, &g, 2, VL_F32, 9, &f.b);
  int64_t on = f.b.x.n;
  f.rh = tu_randn_new(on, 1.0f, 4242);
  int64_t sh[4] = {f.b.x.shape[0], g.out_ch, g.sample, g.sample};
  OK(vl_tensor_alloc(f.c, &f.r, VL_F32, VL_MEM_DATA, 4, sh));
  upload_f32(f.c, &f.r, f.rh);
  /* analytic: dL/dpred = r */
  vl_tensor pred;
  OK(vl_sd_unet_forward(f.m, &f.b.x, &f.b.t, &f.b.ctx, true, &pred));
  OK(vl_sd_unet_backward(f.m, &f.r));
  vl_tensor_free(f.c, &pred);
  static const char *const names[] = {
      /* the first transformer: its LoRA is the first gradient sink (no input gradient) */
      "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.weight",
      "down_blocks.1.attentions.1.transformer_blocks.0.attn1.to_v.lora_B.weight",
      "up_blocks.1.attentions.2.transformer_blocks.0.attn2.to_k.lora_B.weight",
      "up_blocks.3.attentions.2.transformer_blocks.0.attn2.to_out.0.lora_A.weight"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    f.p = vl_sd_unet_param(f.m, names[i]);
    assert_non_null(f.p);
    int64_t n = f.p->rows * f.p->cols;
    f.ph = malloc((size_t)n * 4);
    float *an = malloc((size_t)n * 4);
    OK(vl_param_read(f.c, f.p, f.ph));
    OK(vl_param_read_grad(f.c, f.p, an));
    /* the 3 entries of largest gradient, checked where they sit */
    int64_t best = 0;
    for (int64_t j = 0; j < n; j++)
      if (fabsf(an[j]) > fabsf(an[best])) best = j;
    int64_t j0 = best > n - 3 ? n - 3 : best;
    char what[48];
    snprintf(what, sizeof what, "lora %zu", i);
    tu_fd_check(fd_loss, &f, f.ph + j0, 3, an + j0, 1e-2f, 5e-3, what);
    OK(vl_param_load(f.c, f.p, f.ph));
    free(an);
    free(f.ph);
  }
  /* dL/dcontext: a few entries by finite differences on the context. A forward drops the
   * last backward's dctx (the FD losses above ran forwards): a training step again */
  assert_null(vl_sd_unet_dctx(f.m));
  OK(vl_sd_unet_forward(f.m, &f.b.x, &f.b.t, &f.b.ctx, true, &pred));
  OK(vl_sd_unet_backward(f.m, &f.r));
  vl_tensor_free(f.c, &pred);
  const vl_tensor *dctx = vl_sd_unet_dctx(f.m);
  assert_non_null(dctx);
  float *dc = malloc(dctx->bytes);
  OK(f.c->be->download(f.c, dc, dctx, 0, dctx->bytes));
  float *ch = malloc(f.b.ctx.bytes);
  OK(f.c->be->download(f.c, ch, &f.b.ctx, 0, f.b.ctx.bytes));
  double worst = 0, dmax = 0;
  int64_t top = 0;
  for (int64_t j = 0; j < f.b.ctx.n; j++)
    if (fabsf(dc[j]) > fabsf(dc[top])) top = j;
  dmax = fabs(dc[top]);
  assert_true(dmax > 0.05);
  for (int k = 0; k < 4; k++) {
    int64_t j = k == 0 ? top : (k * 997 + 13) % f.b.ctx.n;
    float x0 = ch[j];
    double l[2];
    for (int s = 0; s < 2; s++) {
      ch[j] = x0 + (s ? -1e-2f : 1e-2f);
      OK(f.c->be->upload(f.c, &f.b.ctx, 0, ch, f.b.ctx.bytes));
      f.p = vl_sd_unet_param_at(f.m, 0);
      f.ph = malloc((size_t)(f.p->rows * f.p->cols) * 4);
      OK(vl_param_read(f.c, f.p, f.ph));
      l[s] = fd_loss(&f);
      free(f.ph);
    }
    ch[j] = x0;
    OK(f.c->be->upload(f.c, &f.b.ctx, 0, ch, f.b.ctx.bytes));
    double fd = (l[0] - l[1]) / 2e-2, err = fabs(fd - dc[j]) / fmax(1.0, fabs(dc[j]));
    worst = fmax(worst, err);
    if (!(err < 5e-3)) fail_msg("dctx[%lld]: analytic %.7g, finite difference %.7g", (long long)j, dc[j], fd);
  }
  print_message("  fd dctx (4 entries, max |dctx| %.3f) worst err/max(1,|an|) %.2e\n", dmax, worst);
  free(dc);
  free(ch);
  vl_tensor_free(f.c, &f.r);
  free(f.rh);
  batch_free(f.c, &f.b);
  vl_sd_unet_destroy(f.m);
  vl_ctx_destroy(f.c);
}

/* ---- forward only, misuse, OOM ------------------------------------------------------------- */

static void test_forward_only_and_oom(void **state) {
  (void)state;
  vl_sd_unet_cfg g = tiny_cfg(VL_ATTN_EFFICIENT, false, VL_F32, VL_F32);
  vl_ctx *c;
  OK(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP));
  vl_sd_unet *m = make(c, &g, true);
  dbatch b;
  batch_make(c, &g, 2, VL_F32, 1, &b);
  vl_mem_stats s0, s1;
  vl_arena_stats(c->arena, &s0);
  vl_tensor pred;
  /* a backward needs a training forward */
  assert_int_equal(vl_sd_unet_backward(m, &b.x), VL_ERR_INVALID);
  OK(vl_sd_unet_forward(m, &b.x, &b.t, &b.ctx, false, &pred));
  vl_arena_stats(c->arena, &s1);
  assert_int_equal(s1.cur[VL_MEM_ACTS], 0);
  assert_int_equal(s1.cur_total, s0.cur_total + (pred.bytes + 255) / 256 * 256);
  assert_int_equal(vl_sd_unet_backward(m, &pred), VL_ERR_INVALID);
  vl_tensor_free(c, &pred);
  /* bad shapes */
  assert_int_equal(vl_sd_unet_forward(m, &b.x, &b.x, &b.ctx, true, &pred), VL_ERR_INVALID);
  assert_int_equal(vl_sd_unet_forward(m, &b.ctx, &b.t, &b.ctx, true, &pred), VL_ERR_INVALID);
  assert_int_equal(pred.owned, false);
  /* a training forward then a forward: the first one's activations are dropped */
  OK(vl_sd_unet_forward(m, &b.x, &b.t, &b.ctx, true, &pred));
  vl_arena_stats(c->arena, &s1);
  assert_true(s1.cur[VL_MEM_ACTS] > 0);
  vl_tensor_free(c, &pred);
  vl_sd_unet_release(m);
  vl_arena_stats(c->arena, &s1);
  assert_int_equal(s1.cur_total, s0.cur_total);
  batch_free(c, &b);
  vl_sd_unet_destroy(m);
  vl_ctx_destroy(c);

  /* OOM in the middle of a step is a status; everything the step made is freed, and the next
   * step under a larger cap succeeds (plan device: the same allocation sequence) */
  double lp;
  vl_mem_stats full = step_stats(VL_DEV_PLAN, &g, &lp, NULL);
  vl_ctx *p;
  OK(vl_ctx_create_ex(&p, VL_DEV_PLAN, full.peak_total - 4096, VL_DEV_CPU));
  m = make(p, &g, true);
  batch_make(p, &g, 2, VL_F32, 3, &b);
  vl_arena_stats(p->arena, &s0);
  OK(vl_sd_unet_forward(m, &b.x, &b.t, &b.ctx, true, &pred));
  vl_tensor loss;
  int64_t B = 2;
  vl_status st = vl_tensor_alloc(p, &loss, VL_F32, VL_MEM_TEMP, 1, &B);
  if (st == VL_OK) {
    OK(vl_mse_fused_run(p, &(vl_mse_fused_args){.pred = &pred, .loss = &loss, .target = &b.noise,
                                                .R = B, .C = pred.n / B, .dloss_scale = 1.0f}));
    vl_tensor_free(p, &loss);
    st = vl_sd_unet_backward(m, &pred);
  }
  assert_int_equal(st, VL_ERR_OOM);
  vl_tensor_free(p, &pred);
  vl_arena_stats(p->arena, &s1);
  assert_int_equal(s1.cur_total, s0.cur_total);
  batch_free(p, &b);
  vl_sd_unet_destroy(m);
  vl_ctx_destroy(p);
}

/* ---- (6) parity with diffusers + peft in float64 ------------------------------------------- */

static void parity(vl_attn_impl attn) {
  sdfx_file fx;
  char path[512], err[1024];
  sdfx_fixture_path(path, sizeof path, "sd_unet_parity.bin");
  if (sdfx_open(&fx, path, err, sizeof err) != 0) fail_msg("%s", err);
  vl_sd_unet_cfg g;
  sdfx_unet_cfg(&fx, attn, &g);
  const sdfx_record *ehs = sdfx_find(&fx, "input.encoder_hidden_states");
  vl_ctx *c;
  OK(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP));
  vl_sd_unet *m = make(c, &g, false);
  int n_lora;
  vl_sd_unet_trainable(m, &n_lora);
  assert_int_equal(n_lora, 4 * 2 * 4 * 2);
  sdfx_unet_load(&fx, c, m);
  /* inputs: the fixture's noisy latents (its DDPM noising), timesteps, text, noise */
  int64_t B = ehs->dims[0], S = g.sample, xs[4] = {B, g.in_ch, S, S};
  dbatch b;
  batch_make(c, &g, B, VL_F32, 1, &b);
  float *h = sdfx_get_f32(&fx, "out.noisy_latents", NULL, err, sizeof err);
  if (!h) fail_msg("%s", err);
  assert_int_equal(b.x.n, xs[0] * xs[1] * xs[2] * xs[3]);
  upload_f32(c, &b.x, h);
  free(h);
  h = sdfx_get_f32(&fx, "input.noise", NULL, err, sizeof err);
  if (!h) fail_msg("%s", err);
  upload_f32(c, &b.noise, h);
  free(h);
  h = sdfx_get_f32(&fx, "input.encoder_hidden_states", NULL, err, sizeof err);
  if (!h) fail_msg("%s", err);
  upload_f32(c, &b.ctx, h);
  free(h);
  int64_t ts64[8];
  if (sdfx_read_i64(&fx, "input.timesteps", ts64, B, err, sizeof err)) fail_msg("%s", err);
  int32_t ts[8];
  for (int64_t i = 0; i < B; i++) ts[i] = (int32_t)ts64[i];
  OK(c->be->upload(c, &b.t, 0, ts, (size_t)B * 4));
  /* forward, the prediction */
  vl_tensor pred, loss;
  OK(vl_sd_unet_forward(m, &b.x, &b.t, &b.ctx, true, &pred));
  float *ph = malloc(pred.bytes);
  OK(c->be->download(c, ph, &pred, 0, pred.bytes));
  int64_t np;
  double *want = sdfx_get_f64(&fx, "out.model_pred", &np, err, sizeof err);
  if (!want) fail_msg("%s", err);
  assert_int_equal(np, pred.n);
  double e_pred = sdfx_max_norm_err(ph, want, np);
  free(want);
  free(ph);
  /* loss = mean squared error against the noise; pred becomes dloss/dpred */
  OK(vl_tensor_alloc(c, &loss, VL_F32, VL_MEM_TEMP, 1, &B));
  OK(vl_mse_fused_run(c, &(vl_mse_fused_args){.pred = &pred, .loss = &loss, .target = &b.noise,
                                             .R = B, .C = pred.n / B,
                                             .dloss_scale = 1.0f / (float)pred.n}));
  float lh[8];
  OK(c->be->download(c, lh, &loss, 0, (size_t)B * 4));
  double l = 0, lw;
  for (int64_t i = 0; i < B; i++) l += lh[i];
  l /= (double)pred.n;
  if (sdfx_read_f64(&fx, "out.loss", &lw, 1, err, sizeof err)) fail_msg("%s", err);
  vl_tensor_free(c, &loss);
  OK(vl_sd_unet_backward(m, &pred));
  vl_tensor_free(c, &pred);
  /* every LoRA gradient */
  double e_grad = 0;
  const char *worst = "";
  int lora_n;
  vl_param *lp = vl_sd_unet_trainable(m, &lora_n);
  for (int i = 0; i < lora_n; i++) {
    char rec[160];
    snprintf(rec, sizeof rec, "grad.%s", lp[i].name);
    int64_t gn;
    double *gw = sdfx_get_f64(&fx, rec, &gn, err, sizeof err);
    if (!gw) fail_msg("%s", err);
    assert_int_equal(gn, lp[i].rows * lp[i].cols);
    float *gh = malloc((size_t)gn * 4);
    OK(vl_param_read_grad(c, &lp[i], gh));
    double e = sdfx_max_norm_err(gh, gw, gn);
    if (e > e_grad) e_grad = e, worst = lp[i].name;
    free(gh);
    free(gw);
  }
  print_message("  parity (%s): prediction max err/max %.2e, loss %.9f vs %.9f (rel %.2e), "
                "LoRA gradients max err/max %.2e (%s)\n",
                vl_attn_impl_name(attn), e_pred, l, lw, fabs(l - lw) / lw, e_grad, worst);
  assert_true(e_pred < 1e-5);
  assert_true(fabs(l - lw) <= 1e-5 * lw);
  assert_true(e_grad < 1e-4);
  batch_free(c, &b);
  vl_sd_unet_destroy(m);
  vl_ctx_destroy(c);
  sdfx_close(&fx);
}

static void test_parity(void **state) {
  (void)state;
  parity(VL_ATTN_EFFICIENT);
  parity(VL_ATTN_CLASSIC);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_params_full),
      cmocka_unit_test(test_plan_full),
      cmocka_unit_test(test_planned_equals_measured),
      cmocka_unit_test(test_equivalences),
      cmocka_unit_test(test_context_gradient),
      cmocka_unit_test(test_finite_differences),
      cmocka_unit_test(test_forward_only_and_oom),
      cmocka_unit_test(test_parity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
