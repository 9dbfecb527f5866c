/* Stable Diffusion 1.5's encoders (engine/models/sd_vae.c, sd_clip.c): full-scale
 * parameter names, shapes and counts against the PyTorch listings; full-scale planned peaks
 * (fp16, B = 1 and 8) and the time a plan takes; planned peak == measured peak on the CPU at
 * tiny scale (fp32 and bf16, classic and efficient attention); classic == efficient up to
 * rounding; the Gaussian sample against its formula; bad configurations and inputs; OOM in
 * the middle of a forward frees everything; parity with diffusers' AutoencoderKL and
 * transformers' CLIPTextModel (float64 references on tiny configurations,
 * tests/fixtures/sd_{vae,clip}_parity.bin from tests/torch/make_sd_fixture.py).
 *
 * LoRA training of the text encoder (section 6): full-scale LoRA counts (peft's), names and
 * storage; full-scale plans of a training step (fp16, r=4, B = 1 and 8, both target sets,
 * both attentions, checkpointing on and off); planned == measured peaks of a tiny training
 * step (fp32 / bf16, classic / efficient, checkpointing on / off, both target sets);
 * checkpointed == plain bit for bit and the training forward == encode; finite differences
 * of LoRA gradients; misuse and OOM; parity of the LoRA forward and of every LoRA gradient
 * with transformers + peft in float64 (the same fp32 tolerance as the forward: max
 * normalised errors below 1e-6 seen).
 *
 * Parity tolerances. The references are float64 on float32-exact weights and inputs, so in
 * fp32 the only error is the engine's float32 rounding through ~20 layers: max |got - ref| /
 * max |ref| of a few 1e-7 seen; the limit 1e-5 leaves room for another BLAS's summation order
 * and is far below what a wrong convention moves (the fixture script refuses to write a
 * fixture where padding, heads, mean/logvar order, causality, quick-GELU or the final norm
 * move the output by less than 1e-3), and a 0.05 change of one weight is caught (the last
 * check of each parity test). fp16 / bf16 weights and activations are held to 1e-2 / 5e-2 (unit
 * roundoff 2^-11 / 2^-8 accumulated over the layers). */
#include "testutil.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/backend.h"
#include "vramlab/sd_encoders.h"

#include "sd_fixture.c" /* the parity fixtures' reader (test-only code, see sd_fixture.h) */

#define OK(expr) assert_int_equal((expr), VL_OK)

#define VAE_LISTING "tests/fixtures/sd15_params_vae_encoder.txt"
#define CLIP_LISTING "tests/fixtures/sd15_params_text_encoder.txt"

/* ---- helpers ------------------------------------------------------------------------------ */

static vl_ctx *mkctx(vl_device dev, size_t cap) {
  vl_ctx *c = NULL;
  if (dev == VL_DEV_PLAN) OK(vl_ctx_create_ex(&c, VL_DEV_PLAN, cap, VL_DEV_CPU));
  else OK(vl_ctx_create(&c, dev, cap));
  return c;
}

/* A VL_MEM_DATA fp32 tensor of the given shape holding seeded N(0, 1) values (shape only on
 * a plan context). */
static vl_tensor data_f32(vl_ctx *c, int ndim, const int64_t *shape, uint64_t seed) {
  vl_tensor t;
  OK(vl_tensor_alloc(c, &t, VL_F32, VL_MEM_DATA, ndim, shape));
  if (!c->plan) {
    float *h = tu_randn_new(t.n, 1.0f, seed);
    OK(c->be->upload(c, &t, 0, h, t.bytes));
    free(h);
  }
  return t;
}

/* A VL_MEM_DATA (B, T) VL_I32 tensor of seeded ids in [0, vocab). */
static vl_tensor data_tokens(vl_ctx *c, int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  vl_tensor t;
  int64_t shape[2] = {B, T};
  OK(vl_tensor_alloc(c, &t, VL_I32, VL_MEM_DATA, 2, shape));
  if (!c->plan) {
    int32_t *h = malloc((size_t)(B * T) * sizeof *h);
    vl_rng r;
    vl_rng_seed(&r, seed);
    for (int64_t i = 0; i < B * T; i++) h[i] = (int32_t)vl_rng_below(&r, (uint64_t)vocab);
    OK(c->be->upload(c, &t, 0, h, t.bytes));
    free(h);
  }
  return t;
}

static size_t live(vl_ctx *c) {
  vl_mem_stats s;
  vl_arena_stats(c->arena, &s);
  return s.cur_total;
}

static float *host_of(const vl_tensor *t) {
  float *h = malloc((size_t)t->n * sizeof *h);
  tu_tget(t, h);
  return h;
}

/* max |a - b| / max |b|: the normalised error of a whole output. */
static double norm_err(const float *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (fabs((double)a[i] - b[i]) > num) num = fabs((double)a[i] - b[i]);
    if (fabs(b[i]) > den) den = fabs(b[i]);
  }
  return num / (den > 0 ? den : 1);
}
static double norm_err_f(const float *a, const float *b, int64_t n) {
  double *bd = malloc((size_t)n * sizeof *bd);
  for (int64_t i = 0; i < n; i++) bd[i] = b[i];
  double e = norm_err(a, bd, n);
  free(bd);
  return e;
}

static bool all_finite(const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return false;
  return true;
}

/* One encoder on one context with its inputs and outputs. */
typedef struct {
  vl_ctx *c;
  vl_sd_vae *vae;
  vl_sd_clip *clip;
  vl_tensor in, noise; /* VAE: images, noise; CLIP: tokens in `in` */
  vl_tensor z, mom, hidden;
  double seconds;      /* of the forward */
  size_t before;       /* live bytes when the forward started (weights and inputs) */
} run;

static void run_vae(run *r, vl_device dev, size_t cap, const vl_sd_vae_cfg *g, int64_t B,
                    int64_t side, bool want_mom, vl_status expect) {
  memset(r, 0, sizeof *r);
  r->c = mkctx(dev, cap);
  OK(vl_sd_vae_create(r->c, g, 11, &r->vae));
  int64_t h = vl_sd_vae_latent_side(r->vae, side);
  int64_t is[4] = {B, g->in_ch, side, side}, ns[4] = {B, g->latent_ch, h, h};
  r->in = data_f32(r->c, 4, is, 21);
  r->noise = data_f32(r->c, 4, ns, 22);
  r->before = live(r->c);
  double t0 = vl_now();
  assert_int_equal(vl_sd_vae_encode(r->vae, &r->in, &r->noise, &r->z, want_mom ? &r->mom : NULL,
                                    VL_MEM_DATA),
                   expect);
  r->seconds = vl_now() - t0;
}

static void run_clip(run *r, vl_device dev, size_t cap, const vl_sd_clip_cfg *g, int64_t B,
                     int64_t T, vl_status expect) {
  memset(r, 0, sizeof *r);
  r->c = mkctx(dev, cap);
  OK(vl_sd_clip_create(r->c, g, 12, &r->clip));
  r->in = data_tokens(r->c, B, T, g->vocab, 23);
  r->before = live(r->c);
  double t0 = vl_now();
  assert_int_equal(vl_sd_clip_encode(r->clip, &r->in, &r->hidden, VL_MEM_DATA), expect);
  r->seconds = vl_now() - t0;
}

static void run_free(run *r) {
  vl_tensor *l[] = {&r->hidden, &r->mom, &r->z, &r->noise, &r->in};
  for (size_t i = 0; i < sizeof l / sizeof *l; i++) vl_tensor_free(r->c, l[i]);
  vl_sd_vae_destroy(r->vae);
  vl_sd_clip_destroy(r->clip);
  vl_mem_stats s;
  vl_arena_stats(r->c->arena, &s);
  assert_int_equal(s.cur_total, 0); /* the model gave back everything it took */
  assert_int_equal(s.n_bad_free, 0);
  vl_ctx_destroy(r->c);
  memset(r, 0, sizeof *r);
}

/* ---- (1) full-scale parameters against the PyTorch listings ---------------------------------- */

typedef struct {
  char name[96];
  int ndim;
  int64_t d[VL_MAX_DIMS];
} listed;

/* "name d0 d1 ..." per line (sd_param_counts.py's format; "(d0, d1)" is read too). */
static listed *read_listing(const char *path, int *n) {
  FILE *f = fopen(path, "r");
  if (!f) fail_msg("%s: cannot open (run from the repository root)", path);
  listed *out = NULL;
  int cap = 0;
  char line[512];
  *n = 0;
  while (fgets(line, sizeof line, f)) {
    for (char *p = line; *p; p++)
      if (*p == '(' || *p == ')' || *p == ',') *p = ' ';
    char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save);
    if (!tok) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 128;
      out = realloc(out, (size_t)cap * sizeof *out);
    }
    listed *l = &out[*n];
    memset(l, 0, sizeof *l);
    assert_true(strlen(tok) < sizeof l->name);
    strcpy(l->name, tok);
    while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
      assert_true(l->ndim < VL_MAX_DIMS && isdigit((unsigned char)tok[0]));
      l->d[l->ndim++] = strtoll(tok, NULL, 10);
    }
    assert_true(l->ndim >= 1);
    (*n)++;
  }
  fclose(f);
  return out;
}

/* Every parameter in the listing's order, with its name and shape; the total. */
static void check_listing(const vl_sd_params *P, const char *path, int64_t total) {
  int n;
  listed *l = read_listing(path, &n);
  assert_int_equal(P->n, n);
  int64_t sum = 0;
  for (int i = 0; i < n; i++) {
    const vl_sd_pinfo *in = &P->info[i];
    if (strcmp(P->p[i].name, l[i].name) || in->ndim != l[i].ndim)
      fail_msg("%s line %d: %s (%d dims) listed, the model has %s (%d dims)", path, i + 1,
               l[i].name, l[i].ndim, P->p[i].name, in->ndim);
    int64_t ne = 1;
    for (int k = 0; k < in->ndim; k++) {
      if (in->d[k] != l[i].d[k])
        fail_msg("%s: dim %d is %lld, listed %lld", l[i].name, k, (long long)in->d[k],
                 (long long)l[i].d[k]);
      ne *= in->d[k];
    }
    assert_int_equal(P->p[i].rows * P->p[i].cols, ne);
    assert_false(P->p[i].trainable);
    assert_int_equal(P->p[i].w.cat, VL_MEM_FROZEN);
    assert_int_equal(vl_sd_params_find(P, l[i].name), i);
    sum += ne;
  }
  assert_int_equal(sum, total);
  assert_int_equal(vl_sd_params_count(P), total);
  assert_int_equal(vl_sd_params_find(P, "encoder.no_such.weight"), -1);
  free(l);
}

static void test_full_params(void **state) {
  (void)state;
  vl_ctx *p = mkctx(VL_DEV_PLAN, VL_NO_CAP);
  vl_sd_vae_cfg vg;
  assert_int_equal(vl_sd_vae_preset("full", &vg), 0);
  vl_sd_vae *vae;
  OK(vl_sd_vae_create(p, &vg, 1, &vae));
  assert_int_equal(vl_sd_vae_n_params(vae), 34163664);
  check_listing(vl_sd_vae_params(vae), VAE_LISTING, 34163664);
  assert_non_null(vl_sd_vae_param(vae, "encoder.mid_block.attentions.0.to_out.0.bias"));
  assert_null(vl_sd_vae_param(vae, "decoder.conv_in.weight"));
  assert_int_equal(vl_sd_vae_latent_side(vae, 512), 64);
  vl_mem_stats s;
  vl_arena_stats(p->arena, &s);
  assert_true(s.cur[VL_MEM_FROZEN] >= (size_t)34163664 * 4);
  assert_int_equal(s.cur[VL_MEM_PARAMS] + s.cur[VL_MEM_GRADS] + s.cur[VL_MEM_OPTIM], 0);
  vl_sd_vae_destroy(vae);

  vl_sd_clip_cfg cg;
  assert_int_equal(vl_sd_clip_preset("full", &cg), 0);
  vl_sd_clip *clip;
  OK(vl_sd_clip_create(p, &cg, 1, &clip));
  assert_int_equal(vl_sd_clip_n_params(clip), 123060480);
  check_listing(vl_sd_clip_params(clip), CLIP_LISTING, 123060480);
  assert_non_null(vl_sd_clip_param(clip, "final_layer_norm.bias"));
  vl_sd_clip_destroy(clip);
  vl_arena_stats(p->arena, &s);
  assert_int_equal(s.cur_total, 0);
  vl_ctx_destroy(p);

  /* the smaller presets keep the structure: same parameter kinds, fewer values */
  const char *sc[2] = {"small", "tiny"};
  for (int i = 0; i < 2; i++) {
    p = mkctx(VL_DEV_PLAN, VL_NO_CAP);
    assert_int_equal(vl_sd_vae_preset(sc[i], &vg), 0);
    assert_int_equal(vl_sd_clip_preset(sc[i], &cg), 0);
    OK(vl_sd_vae_create(p, &vg, 1, &vae));
    OK(vl_sd_clip_create(p, &cg, 1, &clip));
    print_message("  %s: vae encoder %lld params (%d tensors, %lldx%lld images), text encoder "
                  "%lld params (%d tensors)\n", sc[i], (long long)vl_sd_vae_n_params(vae),
                  vl_sd_vae_params(vae)->n, (long long)vg.image, (long long)vg.image,
                  (long long)vl_sd_clip_n_params(clip), vl_sd_clip_params(clip)->n);
    assert_true(vl_sd_vae_n_params(vae) < 34163664 && vl_sd_clip_n_params(clip) < 123060480);
    vl_sd_clip_destroy(clip);
    vl_sd_vae_destroy(vae);
    vl_ctx_destroy(p);
  }
  assert_int_equal(vl_sd_vae_preset("huge", &vg), -1);
  assert_int_equal(vl_sd_clip_preset("huge", &cg), -1);
}

/* ---- (2) full-scale planned peaks, fp16 ----------------------------------------------------- */

static size_t al(size_t b) { return (b + VL_ARENA_ALIGN - 1) / VL_ARENA_ALIGN * VL_ARENA_ALIGN; }

static void test_full_plan_peaks(void **state) {
  (void)state;
  char b1[32], b2[32], b3[32], b4[32];
  for (int k = 0; k < 2; k++) {
    int64_t B = k ? 8 : 1;
    /* VAE at 512x512: images and noise in fp16 (diffusers casts pixel_values to the VAE's
     * dtype), z to the data category (the U-Net's input) */
    vl_sd_vae_cfg vg;
    vl_sd_vae_preset("full", &vg);
    vg.weights = vg.acts = vg.out = VL_F16;
    vl_ctx *p;
    OK(vl_ctx_create(&p, VL_DEV_PLAN, VL_NO_CAP)); /* the CUDA target's workspace rules */
    double t0 = vl_now();
    vl_mem_stats s;
    vl_arena_stats(p->arena, &s);
    size_t fixed_ws = s.cur[VL_MEM_WORKSPACE]; /* cuBLAS's, taken with the context */
    vl_sd_vae *vae;
    OK(vl_sd_vae_create(p, &vg, 1, &vae));
    vl_tensor img, noise, z;
    int64_t is[4] = {B, 3, 512, 512}, ns[4] = {B, 4, 64, 64};
    OK(vl_tensor_alloc(p, &img, VL_F16, VL_MEM_DATA, 4, is));
    OK(vl_tensor_alloc(p, &noise, VL_F16, VL_MEM_DATA, 4, ns));
    OK(vl_sd_vae_encode(vae, &img, &noise, &z, NULL, VL_MEM_DATA));
    double dt = vl_now() - t0;
    vl_arena_stats(p->arena, &s);
    /* the largest live set: a level-0 resnet's input, norm output and conv output */
    size_t map = al((size_t)B * 128 * 512 * 512 * 2);
    print_message("  vae encoder 512x512 fp16 B=%lld: planned peak %s (frozen %s, temp %s, "
                  "workspace %s at the peak), %.1f GFLOP, plan %.3f s\n", (long long)B,
                  vl_fmt_bytes(s.peak_total, b1, sizeof b1), vl_fmt_bytes(s.at_peak[VL_MEM_FROZEN], b2, sizeof b2),
                  vl_fmt_bytes(s.at_peak[VL_MEM_TEMP], b3, sizeof b3),
                  vl_fmt_bytes(s.at_peak[VL_MEM_WORKSPACE], b4, sizeof b4), p->flops / 1e9, dt);
    assert_int_equal(s.at_peak[VL_MEM_FROZEN], s.cur[VL_MEM_FROZEN]);
    assert_int_equal(s.at_peak[VL_MEM_TEMP], 3 * map);
    assert_true(s.at_peak[VL_MEM_FROZEN] >= (size_t)34163664 * 2);
    assert_int_equal(s.cur[VL_MEM_TEMP] + s.cur[VL_MEM_WORKSPACE], fixed_ws);
    assert_int_equal(z.shape[0] * z.shape[1] * z.shape[2] * z.shape[3], B * 4 * 64 * 64);
    assert_true(dt < 0.5);
    vl_tensor_free(p, &z);
    vl_tensor_free(p, &noise);
    vl_tensor_free(p, &img);
    vl_sd_vae_destroy(vae);
    vl_ctx_destroy(p);

    /* CLIP over 77 tokens */
    vl_sd_clip_cfg cg;
    vl_sd_clip_preset("full", &cg);
    cg.weights = cg.acts = cg.out = VL_F16;
    OK(vl_ctx_create(&p, VL_DEV_PLAN, VL_NO_CAP));
    t0 = vl_now();
    vl_arena_stats(p->arena, &s);
    fixed_ws = s.cur[VL_MEM_WORKSPACE];
    vl_sd_clip *clip;
    OK(vl_sd_clip_create(p, &cg, 1, &clip));
    vl_tensor tok, hid;
    int64_t ts[2] = {B, 77};
    OK(vl_tensor_alloc(p, &tok, VL_I32, VL_MEM_DATA, 2, ts));
    OK(vl_sd_clip_encode(clip, &tok, &hid, VL_MEM_DATA));
    dt = vl_now() - t0;
    vl_arena_stats(p->arena, &s);
    /* the largest live set: the residual stream, layer_norm2's output and fc1's output */
    int64_t R = B * 77;
    size_t mlp = 2 * al((size_t)R * 768 * 2) + al((size_t)R * 3072 * 2);
    print_message("  text encoder 77 tokens fp16 B=%lld: planned peak %s (frozen %s, temp %s, "
                  "workspace %s at the peak), %.1f GFLOP, plan %.3f s\n", (long long)B,
                  vl_fmt_bytes(s.peak_total, b1, sizeof b1), vl_fmt_bytes(s.at_peak[VL_MEM_FROZEN], b2, sizeof b2),
                  vl_fmt_bytes(s.at_peak[VL_MEM_TEMP], b3, sizeof b3),
                  vl_fmt_bytes(s.at_peak[VL_MEM_WORKSPACE], b4, sizeof b4), p->flops / 1e9, dt);
    assert_true(s.at_peak[VL_MEM_FROZEN] >= (size_t)123060480 * 2);
    assert_int_equal(s.at_peak[VL_MEM_TEMP], mlp);
    assert_int_equal(hid.shape[0] * hid.shape[1] * hid.shape[2], R * 768);
    assert_int_equal(s.cur[VL_MEM_TEMP] + s.cur[VL_MEM_WORKSPACE], fixed_ws);
    assert_true(dt < 0.5);
    vl_tensor_free(p, &hid);
    vl_tensor_free(p, &tok);
    vl_sd_clip_destroy(clip);
    vl_ctx_destroy(p);
  }
}

/* ---- (3) planned == measured at tiny scale --------------------------------------------------- */

static size_t peak_of(vl_ctx *c) {
  vl_mem_stats s;
  vl_arena_stats(c->arena, &s);
  return s.peak_total;
}

static void same_memory(const run *cpu, const run *plan, const char *what) {
  vl_mem_stats sm, sp;
  vl_arena_stats(cpu->c->arena, &sm);
  vl_arena_stats(plan->c->arena, &sp);
  if (sm.peak_total != sp.peak_total)
    fail_msg("%s: measured peak %zu, planned %zu", what, sm.peak_total, sp.peak_total);
  assert_memory_equal(sm.at_peak, sp.at_peak, sizeof sm.at_peak);
  assert_memory_equal(sm.cur, sp.cur, sizeof sm.cur);
  assert_int_equal(sm.n_alloc, sp.n_alloc);
  assert_int_equal(sm.n_bad_free + sp.n_bad_free, 0);
  assert_true(cpu->c->flops == plan->c->flops && cpu->c->flops > 0);
  /* after the forward only the weights, the inputs and the outputs are left */
  assert_int_equal(sm.cur[VL_MEM_TEMP] + sm.cur[VL_MEM_WORKSPACE] + sm.cur[VL_MEM_ACTS], 0);
  assert_true(sm.peak[VL_MEM_TEMP] > 0);
}

static void test_plan_equals_measured(void **state) {
  (void)state;
  const vl_dtype dts[2] = {VL_F32, VL_BF16};
  for (int d = 0; d < 2; d++)
    for (int a = 0; a < VL_ATTN_IMPL_COUNT; a++) {
      char what[64];
      vl_sd_vae_cfg vg;
      vl_sd_vae_preset("tiny", &vg);
      vg.weights = vg.acts = dts[d];
      vg.out = VL_F32; /* with bf16 activations the moments are converted */
      vg.attn = (vl_attn_impl)a;
      run rc, rp;
      run_vae(&rc, VL_DEV_CPU, VL_NO_CAP, &vg, 2, vg.image, true, VL_OK);
      run_vae(&rp, VL_DEV_PLAN, VL_NO_CAP, &vg, 2, vg.image, true, VL_OK);
      snprintf(what, sizeof what, "vae %s %s", vl_dtype_name(dts[d]), vl_attn_impl_name(vg.attn));
      same_memory(&rc, &rp, what);
      float *z = host_of(&rc.z), *mom = host_of(&rc.mom);
      assert_true(all_finite(z, rc.z.n) && all_finite(mom, rc.mom.n));
      print_message("  %s: peak %zu bytes planned = measured; 2x3x64x64 encode %.1f ms\n", what,
                    peak_of(rc.c), rc.seconds * 1e3);
      free(z);
      free(mom);
      run_free(&rc);
      run_free(&rp);

      vl_sd_clip_cfg cg;
      vl_sd_clip_preset("tiny", &cg);
      cg.weights = cg.acts = dts[d];
      cg.out = dts[d];
      cg.attn = (vl_attn_impl)a;
      for (int k = 0; k < 2; k++) {
        int64_t T = k ? 9 : cg.n_pos; /* a prompt shorter than the positions too */
        run_clip(&rc, VL_DEV_CPU, VL_NO_CAP, &cg, 2, T, VL_OK);
        run_clip(&rp, VL_DEV_PLAN, VL_NO_CAP, &cg, 2, T, VL_OK);
        snprintf(what, sizeof what, "clip %s %s T=%lld", vl_dtype_name(dts[d]),
                 vl_attn_impl_name(cg.attn), (long long)T);
        same_memory(&rc, &rp, what);
        float *h = host_of(&rc.hidden);
        assert_true(all_finite(h, rc.hidden.n));
        assert_int_equal(rc.hidden.shape[1], T);
        free(h);
        run_free(&rc);
        run_free(&rp);
      }
    }
}

/* ---- (4) classic == efficient; the sample's formula ------------------------------------------ */

static void test_attention_impls_agree(void **state) {
  (void)state;
  const vl_dtype dts[2] = {VL_F32, VL_BF16};
  const double tol[2] = {2e-6, 2e-2}; /* fp32: summation order; bf16: the classic scores and
                                         probabilities are stored in bf16 (2^-8) */
  for (int d = 0; d < 2; d++) {
    float *o[2][3];
    int64_t n[3];
    for (int a = 0; a < 2; a++) {
      vl_sd_vae_cfg vg;
      vl_sd_vae_preset("tiny", &vg);
      vg.weights = vg.acts = vg.out = dts[d];
      vg.attn = (vl_attn_impl)a;
      run r;
      run_vae(&r, VL_DEV_CPU, VL_NO_CAP, &vg, 2, vg.image, true, VL_OK);
      o[a][0] = host_of(&r.z);
      o[a][1] = host_of(&r.mom);
      n[0] = r.z.n;
      n[1] = r.mom.n;
      run_free(&r);
      vl_sd_clip_cfg cg;
      vl_sd_clip_preset("tiny", &cg);
      cg.weights = cg.acts = cg.out = dts[d];
      cg.attn = (vl_attn_impl)a;
      run_clip(&r, VL_DEV_CPU, VL_NO_CAP, &cg, 3, cg.n_pos, VL_OK);
      o[a][2] = host_of(&r.hidden);
      n[2] = r.hidden.n;
      run_free(&r);
    }
    const char *nm[3] = {"vae z", "vae moments", "clip hidden"};
    for (int i = 0; i < 3; i++) {
      double e = norm_err_f(o[0][i], o[1][i], n[i]);
      print_message("  %s %s: classic vs efficient, max normalised difference %.2e\n",
                    vl_dtype_name(dts[d]), nm[i], e);
      assert_true(e <= tol[d]);
      assert_true(all_finite(o[0][i], n[i]));
      free(o[0][i]);
      free(o[1][i]);
    }
  }
}

/* z = 0.18215 (mean + exp(clamp(logvar, -30, 20) / 2) noise) from the moments and the noise
 * the forward was given; the moments are (mean, logvar) in that channel order. */
static void test_sample(void **state) {
  (void)state;
  vl_sd_vae_cfg vg;
  vl_sd_vae_preset("tiny", &vg);
  run r;
  run_vae(&r, VL_DEV_CPU, VL_NO_CAP, &vg, 2, 32, true, VL_OK); /* 32x32 -> 4x4 latents */
  assert_int_equal(r.z.shape[2], 4);
  float *z = host_of(&r.z), *mom = host_of(&r.mom), *nz = host_of(&r.noise);
  int64_t L = vg.latent_ch, HW = 16;
  double worst = 0;
  for (int64_t b = 0; b < 2; b++)
    for (int64_t c = 0; c < L; c++)
      for (int64_t i = 0; i < HW; i++) {
        double mean = mom[(b * 2 * L + c) * HW + i], lv = mom[(b * 2 * L + L + c) * HW + i];
        lv = lv < -30 ? -30 : lv > 20 ? 20 : lv;
        double want = 0.18215 * (mean + exp(lv / 2) * nz[(b * L + c) * HW + i]);
        double e = fabs(z[(b * L + c) * HW + i] - want) / (1e-6 + fabs(want));
        worst = e > worst ? e : worst;
      }
  assert_true(worst < 1e-5);
  /* z alone (no moments) gives the same z */
  vl_tensor z2;
  OK(vl_sd_vae_encode(r.vae, &r.in, &r.noise, &z2, NULL, VL_MEM_DATA));
  float *zz = host_of(&z2);
  assert_memory_equal(z, zz, (size_t)r.z.n * sizeof *z);
  free(zz);
  vl_tensor_free(r.c, &z2);
  free(z);
  free(mom);
  free(nz);
  run_free(&r);
}

/* ---- errors, OOM ----------------------------------------------------------------------------- */

static void test_bad_configs_and_inputs(void **state) {
  (void)state;
  vl_ctx *c = mkctx(VL_DEV_CPU, VL_NO_CAP);
  vl_sd_vae_cfg vg;
  vl_sd_vae *vae = NULL;
  vl_sd_vae_preset("tiny", &vg);
  vg.groups = 3; /* does not divide 8 channels */
  assert_int_equal(vl_sd_vae_create(c, &vg, 1, &vae), VL_ERR_INVALID);
  assert_null(vae);
  vl_sd_vae_preset("tiny", &vg);
  vg.weights = VL_NF4;
  assert_int_equal(vl_sd_vae_create(c, &vg, 1, &vae), VL_ERR_INVALID);
  vl_sd_vae_preset("tiny", &vg);
  vg.n_levels = VL_SD_VAE_MAX_LEVELS + 1;
  assert_int_equal(vl_sd_vae_create(c, &vg, 1, &vae), VL_ERR_INVALID);
  vl_sd_clip_cfg cg;
  vl_sd_clip *clip = NULL;
  vl_sd_clip_preset("tiny", &cg);
  cg.n_heads = 5; /* does not divide 64 */
  assert_int_equal(vl_sd_clip_create(c, &cg, 1, &clip), VL_ERR_INVALID);
  assert_null(clip);
  vl_mem_stats s;
  vl_arena_stats(c->arena, &s);
  assert_int_equal(s.cur_total, 0); /* a refused config holds nothing */

  vl_sd_vae_preset("tiny", &vg);
  OK(vl_sd_vae_create(c, &vg, 1, &vae));
  vl_sd_clip_preset("tiny", &cg);
  OK(vl_sd_clip_create(c, &cg, 1, &clip));
  vl_arena_stats(c->arena, &s);
  size_t base = s.cur_total;
  int64_t is[4] = {1, 3, 64, 64}, bad_ns[4] = {1, 4, 4, 8}, small[4] = {1, 3, 4, 4};
  vl_tensor img = data_f32(c, 4, is, 1), bad_noise = data_f32(c, 4, bad_ns, 2);
  vl_tensor tiny_img = data_f32(c, 4, small, 3), z, mom;
  assert_int_equal(vl_sd_vae_encode(vae, &img, &bad_noise, &z, NULL, VL_MEM_DATA), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "noise"));
  assert_int_equal(vl_sd_vae_encode(vae, &img, NULL, &z, NULL, VL_MEM_DATA), VL_ERR_INVALID);
  assert_int_equal(vl_sd_vae_encode(vae, &img, NULL, NULL, NULL, VL_MEM_DATA), VL_ERR_INVALID);
  assert_int_equal(vl_sd_vae_encode(vae, &tiny_img, NULL, NULL, &mom, VL_MEM_DATA), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "too small"));
  /* tokens: wrong dtype, too long, an id outside the vocabulary */
  vl_tensor tok = data_tokens(c, 2, cg.n_pos + 1, cg.vocab, 4), hid;
  assert_int_equal(vl_sd_clip_encode(clip, &tok, &hid, VL_MEM_DATA), VL_ERR_INVALID);
  vl_tensor_free(c, &tok);
  assert_int_equal(vl_sd_clip_encode(clip, &img, &hid, VL_MEM_DATA), VL_ERR_INVALID);
  tok = data_tokens(c, 2, 5, cg.vocab, 4);
  ((int32_t *)tok.data)[7] = (int32_t)cg.vocab;
  assert_int_equal(vl_sd_clip_encode(clip, &tok, &hid, VL_MEM_DATA), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "token 7"));
  ((int32_t *)tok.data)[7] = -1;
  assert_int_equal(vl_sd_clip_encode(clip, &tok, &hid, VL_MEM_DATA), VL_ERR_INVALID);
  vl_tensor_free(c, &tok);
  vl_tensor_free(c, &tiny_img);
  vl_tensor_free(c, &bad_noise);
  vl_tensor_free(c, &img);
  vl_arena_stats(c->arena, &s);
  assert_int_equal(s.cur_total, base);
  vl_sd_clip_destroy(clip);
  vl_sd_vae_destroy(vae);
  vl_ctx_destroy(c);
}

/* A cap below the forward's peak: VL_ERR_OOM at some allocation inside it, everything the
 * forward made is freed, the outputs stay empty, and the same model then encodes a smaller
 * batch that fits. */
static void test_oom(void **state) {
  (void)state;
  vl_sd_vae_cfg vg;
  vl_sd_vae_preset("tiny", &vg);
  vl_sd_clip_cfg cg;
  vl_sd_clip_preset("tiny", &cg);
  const double frac[3] = {0.2, 0.6, 0.97};
  for (int k = 0; k < 2; k++) {
    run rp;
    if (k) run_clip(&rp, VL_DEV_PLAN, VL_NO_CAP, &cg, 4, cg.n_pos, VL_OK);
    else run_vae(&rp, VL_DEV_PLAN, VL_NO_CAP, &vg, 4, vg.image, true, VL_OK);
    size_t before = rp.before, peak = peak_of(rp.c);
    run_free(&rp);
    for (int f = 0; f < 3; f++) {
      size_t cap = before + (size_t)(frac[f] * (double)(peak - before));
      run r;
      if (k) run_clip(&r, VL_DEV_CPU, cap, &cg, 4, cg.n_pos, VL_ERR_OOM);
      else run_vae(&r, VL_DEV_CPU, cap, &vg, 4, vg.image, true, VL_ERR_OOM);
      assert_int_equal(r.before, before);
      vl_mem_stats s;
      vl_arena_stats(r.c->arena, &s);
      assert_int_equal(s.cur_total, before);
      assert_int_equal(s.n_bad_free, 0);
      assert_false(r.z.owned || r.mom.owned || r.hidden.owned);
      if (frac[f] > 0.5) { /* one sample of the four fits in the same arena */
        vl_tensor one = vl_tensor_rows(&r.in, 0, 1);
        if (k) {
          OK(vl_sd_clip_encode(r.clip, &one, &r.hidden, VL_MEM_DATA));
        } else {
          vl_tensor nz = vl_tensor_rows(&r.noise, 0, 1);
          OK(vl_sd_vae_encode(r.vae, &one, &nz, &r.z, &r.mom, VL_MEM_DATA));
        }
      }
      run_free(&r);
    }
  }
}

/* ---- (5) parity with PyTorch --------------------------------------------------------------- */

#define PARITY_TOL_F32 1e-5

static int64_t fx_i64(const sdfx_file *f, const char *name) {
  int64_t v = 0;
  char err[512];
  if (sdfx_read_i64(f, name, &v, 1, err, sizeof err)) fail_msg("%s", err);
  return v;
}
static double fx_f64(const sdfx_file *f, const char *name) {
  double v = 0;
  char err[512];
  if (sdfx_read_f64(f, name, &v, 1, err, sizeof err)) fail_msg("%s", err);
  return v;
}
static void fx_open(sdfx_file *f, const char *file) {
  char path[512], err[512];
  sdfx_fixture_path(path, sizeof path, file);
  if (sdfx_open(f, path, err, sizeof err)) fail_msg("%s (regenerate: " SDFX_REGEN ")", err);
}

/* Loads every parameter from the fixture's "param.<prefix><name>" records, which must be the
 * model's parameters in the model's (state_dict) order with the same shapes; checks the sum
 * and sum of squares the script recorded. */
static void fx_load_params(vl_ctx *c, vl_sd_params *P, const sdfx_file *f, const char *prefix) {
  char key[160], err[512];
  assert_int_equal(sdfx_count_prefix(f, "param."), P->n);
  int i = 0;
  double sum = 0, sumsq = 0;
  for (int r = 0; r < f->n; r++) {
    if (strncmp(f->rec[r].name, "param.", 6)) continue;
    snprintf(key, sizeof key, "param.%s%s", prefix, P->p[i].name);
    if (strcmp(f->rec[r].name, key))
      fail_msg("parameter %d: the fixture has %s, the model %s", i, f->rec[r].name, key);
    if (sdfx_check_shape(f, key, P->info[i].ndim, P->info[i].d, err, sizeof err)) fail_msg("%s", err);
    int64_t n = P->p[i].rows * P->p[i].cols;
    float *h = malloc((size_t)n * sizeof *h);
    if (sdfx_read_f32(f, key, h, n, err, sizeof err)) fail_msg("%s", err);
    for (int64_t j = 0; j < n; j++) {
      sum += h[j];
      sumsq += (double)h[j] * h[j];
    }
    OK(vl_param_load(c, &P->p[i], h));
    free(h);
    i++;
  }
  double want = fx_f64(f, "check.param_sum"), want2 = fx_f64(f, "check.param_sumsq");
  assert_true(fabs(sum - want) <= 1e-9 * (1 + fabs(want)));
  assert_true(fabs(sumsq - want2) <= 1e-9 * want2);
}

/* A fixture input (float32 record) as a VL_MEM_DATA fp32 tensor of that shape. */
static vl_tensor fx_input(vl_ctx *c, const sdfx_file *f, const char *name) {
  const sdfx_record *r = sdfx_find(f, name);
  assert_non_null(r);
  assert_true(r->ndim >= 1 && r->ndim <= VL_MAX_DIMS);
  vl_tensor t;
  OK(vl_tensor_alloc(c, &t, VL_F32, VL_MEM_DATA, r->ndim, r->dims));
  char err[512];
  float *h = malloc((size_t)t.n * sizeof *h);
  if (sdfx_read_f32(f, name, h, t.n, err, sizeof err)) fail_msg("%s", err);
  OK(c->be->upload(c, &t, 0, h, t.bytes));
  free(h);
  return t;
}

static void vae_fixture_cfg(const sdfx_file *f, vl_sd_vae_cfg *g) {
  char err[512];
  vl_sd_vae_preset("tiny", g);
  const sdfx_record *bo = sdfx_find(f, "config.block_out_channels");
  assert_non_null(bo);
  assert_true(bo->n >= 1 && bo->n <= VL_SD_VAE_MAX_LEVELS);
  g->n_levels = (int)bo->n;
  if (sdfx_read_i64(f, "config.block_out_channels", g->ch, bo->n, err, sizeof err)) fail_msg("%s", err);
  g->layers_per_block = (int)fx_i64(f, "config.layers_per_block");
  g->groups = fx_i64(f, "config.norm_num_groups");
  g->latent_ch = fx_i64(f, "config.latent_channels");
  g->in_ch = fx_i64(f, "config.in_channels");
  g->eps = (float)fx_f64(f, "config.norm_eps");
  g->scale = (float)fx_f64(f, "config.scaling_factor");
  g->mid_attn = true;
  const sdfx_record *im = sdfx_find(f, "input.image");
  assert_non_null(im);
  g->image = im->dims[2];
}

/* One encode of the fixture's images and noise; the normalised errors of mean, logvar and
 * the latents. perturb: add 0.05 to one weight of the mid-block attention's to_q first. */
static void vae_parity_run(const sdfx_file *f, vl_dtype dt, vl_attn_impl impl, bool perturb,
                           double err3[3]) {
  vl_sd_vae_cfg g;
  vae_fixture_cfg(f, &g);
  g.weights = g.acts = dt;
  g.out = VL_F32;
  g.attn = impl;
  vl_ctx *c = mkctx(VL_DEV_CPU, VL_NO_CAP);
  vl_sd_vae *m;
  OK(vl_sd_vae_create(c, &g, 5, &m));
  fx_load_params(c, vl_sd_vae_params(m), f, "");
  if (perturb) {
    vl_param *q = vl_sd_vae_param(m, "encoder.mid_block.attentions.0.to_q.weight");
    assert_non_null(q);
    float *h = malloc((size_t)(q->rows * q->cols) * sizeof *h);
    OK(vl_param_read(c, q, h));
    h[3] += 0.05f;
    OK(vl_param_load(c, q, h));
    free(h);
  }
  vl_tensor img = fx_input(c, f, "input.image"), noise = fx_input(c, f, "input.noise"), z, mom;
  OK(vl_sd_vae_encode(m, &img, &noise, &z, &mom, VL_MEM_DATA));
  int64_t B = z.shape[0], L = g.latent_ch, HW = z.shape[2] * z.shape[3], n = B * L * HW;
  float *zh = host_of(&z), *mh = host_of(&mom), *mean = malloc((size_t)n * 4), *lv = malloc((size_t)n * 4);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < L * HW; i++) {
      mean[b * L * HW + i] = mh[b * 2 * L * HW + i];
      lv[b * L * HW + i] = mh[b * 2 * L * HW + L * HW + i];
    }
  const char *names[3] = {"out.mean", "out.logvar", "out.latents"};
  const float *got[3] = {mean, lv, zh};
  char err[512];
  for (int k = 0; k < 3; k++) {
    int64_t dims[4] = {B, L, z.shape[2], z.shape[3]};
    if (sdfx_check_shape(f, names[k], 4, dims, err, sizeof err)) fail_msg("%s", err);
    double *want = sdfx_get_f64(f, names[k], NULL, err, sizeof err);
    assert_non_null(want);
    err3[k] = norm_err(got[k], want, n);
    free(want);
  }
  free(zh);
  free(mh);
  free(mean);
  free(lv);
  vl_tensor_free(c, &mom);
  vl_tensor_free(c, &z);
  vl_tensor_free(c, &noise);
  vl_tensor_free(c, &img);
  vl_sd_vae_destroy(m);
  vl_ctx_destroy(c);
}

static void test_vae_parity(void **state) {
  (void)state;
  sdfx_file f;
  fx_open(&f, "sd_vae_parity.bin");
  const vl_dtype dts[3] = {VL_F32, VL_F16, VL_BF16};
  const double tol[3] = {PARITY_TOL_F32, 1e-2, 5e-2};
  for (int d = 0; d < 3; d++)
    for (int a = 0; a < VL_ATTN_IMPL_COUNT; a++) {
      double e[3];
      vae_parity_run(&f, dts[d], (vl_attn_impl)a, false, e);
      print_message("  vae %s %s vs diffusers (float64): max normalised error mean %.2e, logvar "
                    "%.2e, latents %.2e\n", vl_dtype_name(dts[d]), vl_attn_impl_name((vl_attn_impl)a),
                    e[0], e[1], e[2]);
      for (int k = 0; k < 3; k++) assert_true(e[k] <= tol[d]);
    }
  /* can fail: one weight moved by 0.05 */
  double e[3];
  vae_parity_run(&f, VL_F32, VL_ATTN_EFFICIENT, true, e);
  print_message("  vae with one to_q weight + 0.05: latents error %.2e\n", e[2]);
  assert_true(e[2] > 10 * PARITY_TOL_F32);
  sdfx_close(&f);
}

/* The fixture's CLIPTextConfig over the tiny preset (frozen). */
static void clip_fixture_cfg(const sdfx_file *f, vl_sd_clip_cfg *g) {
  vl_sd_clip_preset("tiny", g);
  g->vocab = fx_i64(f, "config.vocab_size");
  g->dim = fx_i64(f, "config.hidden_size");
  g->ffn = fx_i64(f, "config.intermediate_size");
  g->n_layers = fx_i64(f, "config.num_hidden_layers");
  g->n_heads = fx_i64(f, "config.num_attention_heads");
  g->n_pos = fx_i64(f, "config.max_position_embeddings");
  g->eps = (float)fx_f64(f, "config.layer_norm_eps");
  g->act = VL_ACT_QUICK_GELU;
}

/* The fixture's frozen weights into m. The SD 1.5 checkpoint's keys (and make_sd_fixture.py's)
 * may carry "text_model."; the live CLIPTextModel of transformers 5 and
 * sd15_params_text_encoder.txt do not. */
static void clip_fixture_load(vl_ctx *c, vl_sd_clip *m, const sdfx_file *f) {
  bool pre = sdfx_find(f, "param.text_model.embeddings.token_embedding.weight") != NULL;
  fx_load_params(c, vl_sd_clip_params(m), f, pre ? "text_model." : "");
}

/* The fixture's token ids as a VL_MEM_DATA (B, T) VL_I32 tensor. */
static vl_tensor clip_fixture_tokens(vl_ctx *c, const sdfx_file *f) {
  const sdfx_record *ids = sdfx_find(f, "input.input_ids");
  assert_non_null(ids);
  assert_int_equal(ids->ndim, 2);
  int64_t B = ids->dims[0], T = ids->dims[1];
  int64_t *id64 = malloc((size_t)(B * T) * sizeof *id64);
  int32_t *id32 = malloc((size_t)(B * T) * sizeof *id32);
  char err[512];
  if (sdfx_read_i64(f, "input.input_ids", id64, B * T, err, sizeof err)) fail_msg("%s", err);
  for (int64_t i = 0; i < B * T; i++) id32[i] = (int32_t)id64[i];
  vl_tensor tok;
  OK(vl_tensor_alloc2(c, &tok, VL_I32, VL_MEM_DATA, B, T));
  OK(c->be->upload(c, &tok, 0, id32, tok.bytes));
  free(id64);
  free(id32);
  return tok;
}

static void clip_parity_run(const sdfx_file *f, vl_dtype dt, vl_attn_impl impl, bool perturb,
                            double *err_out) {
  vl_sd_clip_cfg g;
  clip_fixture_cfg(f, &g);
  g.weights = g.acts = dt;
  g.out = VL_F32;
  g.attn = impl;
  vl_ctx *c = mkctx(VL_DEV_CPU, VL_NO_CAP);
  vl_sd_clip *m;
  OK(vl_sd_clip_create(c, &g, 5, &m));
  clip_fixture_load(c, m, f);
  if (perturb) {
    vl_param *q = vl_sd_clip_param(m, "encoder.layers.1.self_attn.q_proj.weight");
    assert_non_null(q);
    float *h = malloc((size_t)(q->rows * q->cols) * sizeof *h);
    OK(vl_param_read(c, q, h));
    h[5] += 0.05f;
    OK(vl_param_load(c, q, h));
    free(h);
  }
  vl_tensor tok = clip_fixture_tokens(c, f), hid;
  int64_t B = tok.shape[0], T = tok.shape[1];
  char err[512];
  OK(vl_sd_clip_encode(m, &tok, &hid, VL_MEM_DATA));
  int64_t dims[3] = {B, T, g.dim};
  if (sdfx_check_shape(f, "out.last_hidden_state", 3, dims, err, sizeof err)) fail_msg("%s", err);
  double *want = sdfx_get_f64(f, "out.last_hidden_state", NULL, err, sizeof err);
  assert_non_null(want);
  float *got = host_of(&hid);
  *err_out = norm_err(got, want, hid.n);
  free(got);
  free(want);
  vl_tensor_free(c, &hid);
  vl_tensor_free(c, &tok);
  vl_sd_clip_destroy(m);
  vl_ctx_destroy(c);
}

static void test_clip_parity(void **state) {
  (void)state;
  sdfx_file f;
  fx_open(&f, "sd_clip_parity.bin");
  const vl_dtype dts[3] = {VL_F32, VL_F16, VL_BF16};
  const double tol[3] = {PARITY_TOL_F32, 1e-2, 5e-2};
  for (int d = 0; d < 3; d++)
    for (int a = 0; a < VL_ATTN_IMPL_COUNT; a++) {
      double e;
      clip_parity_run(&f, dts[d], (vl_attn_impl)a, false, &e);
      print_message("  clip %s %s vs transformers (float64): last_hidden_state max normalised "
                    "error %.2e\n", vl_dtype_name(dts[d]), vl_attn_impl_name((vl_attn_impl)a), e);
      assert_true(e <= tol[d]);
    }
  double e;
  clip_parity_run(&f, VL_F32, VL_ATTN_EFFICIENT, true, &e);
  print_message("  clip with one q_proj weight + 0.05: error %.2e\n", e);
  assert_true(e > 10 * PARITY_TOL_F32);
  sdfx_close(&f);
}

/* ---- (6) LoRA training of the text encoder ------------------------------------------------ */

/* A training setup: the model (with optimizer state when asked), tokens and the loss weights
 * R (B, T, dim) fp32 of loss = sum(hidden * R), so dL/dhidden = R. */
typedef struct {
  vl_ctx *c;
  vl_sd_clip *m;
  vl_tensor tok, R;
  float *rh;     /* R on the host */
  size_t base;   /* live bytes of the bare context (a CUDA plan's fixed cuBLAS workspace) */
  size_t before; /* live bytes before the step */
} ctrain;

static vl_sd_clip_cfg lora_cfg(const char *scale, vl_dtype dt, vl_attn_impl attn, bool ck,
                               vl_sd_clip_lora_targets tg, int rank, float alpha) {
  vl_sd_clip_cfg g;
  assert_int_equal(vl_sd_clip_preset(scale, &g), 0);
  g.weights = g.acts = g.out = dt;
  g.attn = attn;
  g.checkpoint = ck;
  g.lora_targets = tg;
  g.lora_rank = rank;
  g.lora_alpha = alpha;
  return g;
}

/* LoRA factors as the fixture sets them: A ~ N(0, 1/in), B ~ N(0, 0.2^2) (B non-zero, so
 * neither gradient vanishes). */
static void randomize_lora(vl_sd_clip *m, vl_ctx *c, uint64_t seed) {
  int n;
  vl_param *p = vl_sd_clip_trainable(m, &n);
  for (int i = 0; i < n; i++) {
    bool isA = strstr(p[i].name, ".lora_A.") != NULL;
    float *h = tu_randn_new(p[i].rows * p[i].cols, isA ? 1.0f / sqrtf((float)p[i].cols) : 0.2f,
                            seed + (uint64_t)i);
    OK(vl_param_load(c, &p[i], h));
    free(h);
  }
}

/* The model on context c (the setup owns it from here). */
static void ctrain_make(ctrain *t, vl_ctx *c, const vl_sd_clip_cfg *g, int64_t B, int64_t T,
                        bool optim, uint64_t lora_seed) {
  memset(t, 0, sizeof *t);
  t->c = c;
  t->base = live(c);
  OK(vl_sd_clip_create(t->c, g, 12, &t->m));
  if (optim) {
    vl_optim_cfg oc;
    vl_optim_cfg_default(&oc, 1e-3f);
    OK(vl_sd_clip_alloc_optim(t->m, &oc));
  }
  if (lora_seed && !t->c->plan) randomize_lora(t->m, t->c, lora_seed);
  t->tok = data_tokens(t->c, B, T, g->vocab, 23);
  int64_t rs[3] = {B, T, g->dim};
  t->R = data_f32(t->c, 3, rs, 31);
  t->rh = tu_randn_new(B * T * g->dim, 1.0f, 31); /* data_f32's values */
  t->before = live(t->c);
}

static void ctrain_free(ctrain *t) {
  TU_TFREE(t->c, &t->R, &t->tok);
  free(t->rh);
  vl_sd_clip_destroy(t->m);
  vl_mem_stats s;
  vl_arena_stats(t->c->arena, &s);
  assert_int_equal(s.cur_total, t->base); /* the model gave back everything it took */
  assert_int_equal(s.n_bad_free, 0);
  vl_ctx_destroy(t->c);
  memset(t, 0, sizeof *t);
}

/* One step: forward (train), dL/dhidden = R, backward, then AdamW when apply. The loss
 * sum(hidden * R) (0 on a plan context); the hidden state into *hid (malloc'd) when asked. */
static double ctrain_step(ctrain *t, bool apply, float **hid) {
  vl_ctx *c = t->c;
  vl_tensor hidden;
  OK(vl_sd_clip_forward(t->m, &t->tok, true, &hidden));
  double loss = 0;
  if (!c->plan) {
    float *h = host_of(&hidden);
    loss = tu_dot(h, t->rh, hidden.n);
    if (hid) *hid = h;
    else free(h);
  }
  OK(vl_sd_clip_backward(t->m, &t->R));
  vl_tensor_free(c, &hidden);
  if (apply) {
    vl_optim_cfg oc;
    vl_optim_cfg_default(&oc, 1e-3f);
    vl_scaler sc;
    vl_scaler_init(&sc, vl_sd_clip_config(t->m)->acts == VL_F16, 65536.0f, 2000);
    bool skipped;
    double norm;
    OK(vl_sd_clip_apply(t->m, &oc, 1.0f, &sc, &skipped, &norm));
    assert_false(skipped);
    assert_true(c->plan || norm > 0);
  }
  vl_mem_stats s;
  vl_arena_stats(c->arena, &s);
  assert_int_equal(s.cur[VL_MEM_ACTS] + s.cur[VL_MEM_TEMP], 0); /* the step gave it all back */
  return loss;
}

static float *clip_lora_grads(ctrain *t, int64_t *n_out) {
  int n;
  vl_param *p = vl_sd_clip_trainable(t->m, &n);
  int64_t tot = 0;
  for (int i = 0; i < n; i++) tot += p[i].rows * p[i].cols;
  float *g = malloc((size_t)tot * 4), *q = g;
  for (int i = 0; i < n; i++) {
    OK(vl_param_read_grad(t->c, &p[i], q));
    q += p[i].rows * p[i].cols;
  }
  *n_out = tot;
  return g;
}

/* (1) the LoRA factors at full scale: counts (peft's, tests/torch/sd_param_counts.py), names,
 * shapes, storage; configuration errors. */
static void test_clip_lora_params(void **state) {
  (void)state;
  const int64_t want[2] = {294912, 663552}; /* r=4 on q/k/v/out_proj; kohya adds fc1, fc2 */
  const int n_tensors[2] = {12 * 4 * 2, 12 * 6 * 2};
  for (int k = 0; k < 2; k++) {
    vl_ctx *p = mkctx(VL_DEV_PLAN, VL_NO_CAP);
    vl_mem_stats s0, s;
    vl_arena_stats(p->arena, &s0);
    vl_sd_clip_cfg g = lora_cfg("full", VL_F16, VL_ATTN_EFFICIENT, false,
                                (vl_sd_clip_lora_targets)k, 4, 4.0f);
    vl_sd_clip *m;
    OK(vl_sd_clip_create(p, &g, 1, &m));
    int n;
    vl_param *lp = vl_sd_clip_trainable(m, &n);
    int64_t tot = 0;
    for (int i = 0; i < n; i++) {
      assert_true(lp[i].trainable && lp[i].has_master); /* fp16: fp32 master + fp16 copy */
      assert_int_equal(lp[i].w.dtype, VL_F16);
      assert_int_equal(lp[i].master.cat, VL_MEM_PARAMS);
      assert_int_equal(lp[i].grad.cat, VL_MEM_GRADS);
      assert_ptr_equal(vl_sd_clip_param(m, lp[i].name), &lp[i]);
      tot += lp[i].rows * lp[i].cols;
    }
    print_message("  full-scale LoRA r=4 targets %s: %lld parameters in %d tensors\n",
                  vl_sd_clip_lora_targets_name(g.lora_targets), (long long)tot, n);
    assert_int_equal(n, n_tensors[k]);
    assert_int_equal(tot, want[k]);
    assert_int_equal(vl_sd_clip_n_trainable(m), want[k]);
    assert_int_equal(vl_sd_clip_n_params(m), 123060480); /* the frozen count is unchanged */
    check_listing(vl_sd_clip_params(m), CLIP_LISTING, 123060480);
    /* peft's order and names: layer 0 k_proj A, B, then v_proj, q_proj, out_proj, ... */
    assert_string_equal(lp[0].name, "encoder.layers.0.self_attn.k_proj.lora_A.weight");
    assert_string_equal(lp[1].name, "encoder.layers.0.self_attn.k_proj.lora_B.weight");
    assert_string_equal(lp[4].name, "encoder.layers.0.self_attn.q_proj.lora_A.weight");
    assert_true(lp[0].rows == 4 && lp[0].cols == 768 && lp[1].rows == 768 && lp[1].cols == 4);
    vl_param *fc2b = vl_sd_clip_param(m, "encoder.layers.11.mlp.fc2.lora_B.weight");
    vl_param *fc1a = vl_sd_clip_param(m, "encoder.layers.3.mlp.fc1.lora_A.weight");
    if (k) {
      assert_true(fc2b && fc2b->rows == 768 && fc2b->cols == 4);
      assert_true(fc1a && fc1a->rows == 4 && fc1a->cols == 768);
      assert_string_equal(lp[n - 1].name, "encoder.layers.11.mlp.fc2.lora_B.weight");
    } else {
      assert_true(!fc2b && !fc1a);
      assert_string_equal(lp[n - 1].name, "encoder.layers.11.self_attn.out_proj.lora_B.weight");
    }
    vl_arena_stats(p->arena, &s);
    assert_true(s.cur[VL_MEM_GRADS] >= (size_t)want[k] * 4);
    assert_true(s.cur[VL_MEM_PARAMS] >= (size_t)want[k] * 6);
    vl_sd_clip_destroy(m);
    vl_arena_stats(p->arena, &s);
    assert_int_equal(s.cur_total, s0.cur_total);
    vl_ctx_destroy(p);
  }
  /* frozen by default: nothing trainable */
  vl_ctx *c = mkctx(VL_DEV_CPU, VL_NO_CAP);
  vl_sd_clip_cfg g;
  vl_sd_clip_preset("full", &g);
  assert_int_equal(g.lora_rank, 0);
  vl_sd_clip_preset("tiny", &g);
  vl_sd_clip *m = NULL;
  OK(vl_sd_clip_create(c, &g, 1, &m));
  int n = -1;
  assert_null(vl_sd_clip_trainable(m, &n));
  assert_int_equal(n, 0);
  assert_int_equal(vl_sd_clip_n_trainable(m), 0);
  vl_sd_clip_destroy(m);
  /* the init: A ~ N(0, 1/r^2), B = 0 (peft's "gaussian", the U-Net's) */
  g = lora_cfg("tiny", VL_F32, VL_ATTN_EFFICIENT, false, VL_SD_CLIP_LORA_KOHYA, 4, 4.0f);
  OK(vl_sd_clip_create(c, &g, 1, &m));
  vl_param *lp = vl_sd_clip_trainable(m, &n);
  double ss = 0, bs = 0;
  int64_t na = 0;
  for (int i = 0; i < n; i++) {
    float *h = malloc((size_t)(lp[i].rows * lp[i].cols) * 4);
    OK(vl_param_read(c, &lp[i], h));
    for (int64_t j = 0; j < lp[i].rows * lp[i].cols; j++) {
      if (i % 2 == 0) ss += (double)h[j] * h[j], na++;
      else bs += fabs(h[j]);
    }
    free(h);
  }
  double sd = sqrt(ss / (double)na);
  print_message("  tiny LoRA init: std(A) %.4f (1/r = 0.25), sum |B| %g\n", sd, bs);
  assert_true(fabs(sd - 0.25) < 0.02 && bs == 0);
  vl_sd_clip_destroy(m);
  /* configuration errors */
  g.lora_alpha = 0;
  assert_int_equal(vl_sd_clip_create(c, &g, 1, &m), VL_ERR_INVALID);
  g.lora_alpha = 4, g.lora_rank = -1;
  assert_int_equal(vl_sd_clip_create(c, &g, 1, &m), VL_ERR_INVALID);
  g.lora_rank = 4, g.lora_targets = VL_SD_CLIP_LORA_TARGETS_COUNT;
  assert_int_equal(vl_sd_clip_create(c, &g, 1, &m), VL_ERR_INVALID);
  vl_sd_clip_lora_targets tg;
  assert_int_equal(vl_sd_clip_lora_targets_parse("kohya", &tg), 0);
  assert_int_equal(tg, VL_SD_CLIP_LORA_KOHYA);
  assert_int_equal(vl_sd_clip_lora_targets_parse("attn", &tg), 0);
  assert_int_equal(tg, VL_SD_CLIP_LORA_ATTN);
  assert_int_equal(vl_sd_clip_lora_targets_parse("mlp", &tg), -1);
  vl_mem_stats s;
  vl_arena_stats(c->arena, &s);
  assert_int_equal(s.cur_total, 0);
  vl_ctx_destroy(c);
}

/* (2) full-scale plans of a training step (forward, backward, AdamW), fp16, r=4. */
static vl_mem_stats plan_train_full(int64_t B, vl_attn_impl attn, bool ck,
                                    vl_sd_clip_lora_targets tg, double *secs, double *flops) {
  vl_sd_clip_cfg g = lora_cfg("full", VL_F16, attn, ck, tg, 4, 4.0f);
  double t0 = vl_now();
  ctrain t;
  vl_ctx *p;
  OK(vl_ctx_create(&p, VL_DEV_PLAN, VL_NO_CAP)); /* the CUDA target's workspace rules */
  ctrain_make(&t, p, &g, B, 77, true, 0);
  ctrain_step(&t, true, NULL);
  *secs = vl_now() - t0;
  *flops = t.c->flops;
  vl_mem_stats s;
  vl_arena_stats(t.c->arena, &s);
  ctrain_free(&t);
  return s;
}

static void test_clip_lora_plan_full(void **state) {
  (void)state;
  char b[VL_MEM_NCAT][32], tot[32];
  for (int bi = 0; bi < 2; bi++) {
    int64_t B = bi ? 8 : 1;
    vl_mem_stats r[2][2][2]; /* [targets][attn][ck] */
    double fr[2][2][2];
    for (int tg = 0; tg < 2; tg++)
      for (int a = 0; a < 2; a++)
        for (int k = 0; k < 2; k++) {
          double secs, fl;
          vl_mem_stats s = plan_train_full(B, (vl_attn_impl)a, k, (vl_sd_clip_lora_targets)tg,
                                           &secs, &fl);
          r[tg][a][k] = s;
          fr[tg][a][k] = fl;
          for (int cat = 0; cat < VL_MEM_NCAT; cat++) vl_fmt_bytes(s.at_peak[cat], b[cat], 32);
          print_message("  full B=%lld %-5s %-9s ckpt %d: peak %s (frozen %s params %s grads %s "
                        "optim %s acts %s temp %s ws %s data %s) %.1f GFLOP, plan %.3f s\n",
                        (long long)B, vl_sd_clip_lora_targets_name((vl_sd_clip_lora_targets)tg),
                        vl_attn_impl_name((vl_attn_impl)a), k,
                        vl_fmt_bytes(s.peak_total, tot, sizeof tot), b[VL_MEM_FROZEN],
                        b[VL_MEM_PARAMS], b[VL_MEM_GRADS], b[VL_MEM_OPTIM], b[VL_MEM_ACTS],
                        b[VL_MEM_TEMP], b[VL_MEM_WORKSPACE], b[VL_MEM_DATA], fl / 1e9, secs);
          assert_true(secs < 0.5);
          int64_t ntr = tg ? 663552 : 294912;
          assert_true(s.peak[VL_MEM_GRADS] >= (size_t)ntr * 4);
          assert_true(s.peak[VL_MEM_OPTIM] >= (size_t)ntr * 8);
          assert_true(s.at_peak[VL_MEM_FROZEN] >= (size_t)123060480 * 2);
          assert_true(s.at_peak[VL_MEM_FROZEN] < (size_t)123060480 * 2 + (1u << 20));
          assert_true(s.peak[VL_MEM_ACTS] > 0);
        }
    for (int tg = 0; tg < 2; tg++)
      for (int a = 0; a < 2; a++) {
        /* checkpointing keeps one (B, 77, 768) input per layer instead of everything */
        assert_true(r[tg][a][1].peak[VL_MEM_ACTS] < r[tg][a][0].peak[VL_MEM_ACTS] / 3);
        assert_true(r[tg][a][1].peak_total < r[tg][a][0].peak_total);
        /* and changes no model FLOP (its re-runs are recompute) */
        assert_true(fabs(fr[tg][a][1] - fr[tg][a][0]) < 1e-9 * fr[tg][a][0]);
      }
    /* kohya's targets keep fc1's and fc2's inputs too */
    assert_true(r[1][1][0].peak[VL_MEM_ACTS] > r[0][1][0].peak[VL_MEM_ACTS]);
  }
}

/* (3) planned peak == measured peak of a training step on the CPU at tiny scale. */
static void test_clip_lora_plan_equals_measured(void **state) {
  (void)state;
  const vl_dtype dts[2] = {VL_F32, VL_BF16};
  for (int d = 0; d < 2; d++)
    for (int a = 0; a < 2; a++)
      for (int k = 0; k < 2; k++)
        for (int tg = 0; tg < 2; tg++) {
          vl_sd_clip_cfg g = lora_cfg("tiny", dts[d], (vl_attn_impl)a, k,
                                      (vl_sd_clip_lora_targets)tg, 4, 4.0f);
          ctrain tc, tp;
          ctrain_make(&tc, mkctx(VL_DEV_CPU, VL_NO_CAP), &g, 2, g.n_pos, true, 0);
          ctrain_make(&tp, mkctx(VL_DEV_PLAN, VL_NO_CAP), &g, 2, g.n_pos, true, 0);
          double t0 = vl_now();
          double loss = ctrain_step(&tc, true, NULL);
          double secs = vl_now() - t0;
          ctrain_step(&tp, true, NULL);
          vl_mem_stats sm, sp;
          vl_arena_stats(tc.c->arena, &sm);
          vl_arena_stats(tp.c->arena, &sp);
          print_message("  tiny %s %-9s ckpt %d %-5s: peak %zu planned, %zu measured (acts %zu); "
                        "loss %.4f; step %.1f ms\n", vl_dtype_name(dts[d]),
                        vl_attn_impl_name((vl_attn_impl)a), k,
                        vl_sd_clip_lora_targets_name((vl_sd_clip_lora_targets)tg), sp.peak_total,
                        sm.peak_total, sm.peak[VL_MEM_ACTS], loss, secs * 1e3);
          assert_true(isfinite(loss) && loss != 0);
          if (sm.peak_total != sp.peak_total)
            fail_msg("measured peak %zu, planned %zu", sm.peak_total, sp.peak_total);
          assert_memory_equal(sm.peak, sp.peak, sizeof sm.peak);
          assert_memory_equal(sm.at_peak, sp.at_peak, sizeof sm.at_peak);
          assert_memory_equal(sm.cur, sp.cur, sizeof sm.cur);
          assert_int_equal(sm.n_alloc, sp.n_alloc);
          assert_true(tc.c->flops == tp.c->flops && tc.c->flops > 0);
          assert_true(tc.c->flops_recompute == tp.c->flops_recompute);
          assert_true(k ? tc.c->flops_recompute > 0 : tc.c->flops_recompute == 0);
          assert_true(sm.peak[VL_MEM_ACTS] > 0);
          ctrain_free(&tc);
          ctrain_free(&tp);
        }
}

/* (4) checkpointed == plain bit for bit; the training forward == encode; classic ~ efficient. */
static float *clip_grads_of(const vl_sd_clip_cfg *g, int64_t *n, double *loss, float **hid) {
  ctrain t;
  ctrain_make(&t, mkctx(VL_DEV_CPU, VL_NO_CAP), g, 3, g->n_pos, false, 77);
  *loss = ctrain_step(&t, false, hid);
  float *gr = clip_lora_grads(&t, n);
  ctrain_free(&t);
  return gr;
}

static void test_clip_lora_equivalences(void **state) {
  (void)state;
  const vl_dtype dts[2] = {VL_F32, VL_BF16};
  for (int d = 0; d < 2; d++)
    for (int tg = 0; tg < 2; tg++) {
      vl_sd_clip_cfg g = lora_cfg("tiny", dts[d], VL_ATTN_EFFICIENT, false,
                                  (vl_sd_clip_lora_targets)tg, 4, 8.0f);
      int64_t n0, n1, n2;
      double l0, l1, l2;
      float *h0, *h1, *h2;
      float *plain = clip_grads_of(&g, &n0, &l0, &h0);
      g.checkpoint = true;
      float *ck = clip_grads_of(&g, &n1, &l1, &h1);
      g.checkpoint = false;
      g.attn = VL_ATTN_CLASSIC;
      float *cl = clip_grads_of(&g, &n2, &l2, &h2);
      assert_int_equal(n0, n1);
      assert_int_equal(n0, n2);
      int64_t nh = 3 * g.n_pos * g.dim;
      /* checkpointing changes memory, not math: the same bits */
      assert_true(l0 == l1);
      assert_memory_equal(h0, h1, (size_t)nh * 4);
      assert_memory_equal(plain, ck, (size_t)n0 * 4);
      double amax = 0, e = norm_err_f(cl, plain, n0);
      for (int64_t i = 0; i < n0; i++) amax = fmax(amax, fabs(plain[i]));
      print_message("  %s %-5s: %lld LoRA gradient entries, max |g| %.3f, loss %.5f; "
                    "classic vs efficient: gradients %.2e, hidden %.2e\n", vl_dtype_name(dts[d]),
                    vl_sd_clip_lora_targets_name((vl_sd_clip_lora_targets)tg), (long long)n0,
                    amax, l0, e, norm_err_f(h2, h0, nh));
      assert_true(amax > 1e-2);
      assert_true(e < (d ? 3e-2 : 2e-6));
      /* the training forward computes what encode does, LoRA included */
      vl_ctx *c = mkctx(VL_DEV_CPU, VL_NO_CAP);
      vl_sd_clip *m;
      g.attn = VL_ATTN_EFFICIENT;
      OK(vl_sd_clip_create(c, &g, 12, &m));
      randomize_lora(m, c, 77);
      vl_tensor tok = data_tokens(c, 3, g.n_pos, g.vocab, 23), hid;
      OK(vl_sd_clip_encode(m, &tok, &hid, VL_MEM_DATA));
      float *he = host_of(&hid);
      assert_memory_equal(he, h0, (size_t)nh * 4);
      free(he);
      vl_tensor_free(c, &hid);
      vl_tensor_free(c, &tok);
      vl_sd_clip_destroy(m);
      vl_ctx_destroy(c);
      free(plain);
      free(ck);
      free(cl);
      free(h0);
      free(h1);
      free(h2);
    }
}

/* (5) finite differences of the LoRA gradients (fp32, random non-zero B) on
 * loss = sum(hidden * R). */
typedef struct {
  ctrain *t;
  vl_param *p; /* the parameter perturbed */
  float *ph;   /* its values on the host */
} clip_fd;

static double clip_fd_loss(void *v) {
  clip_fd *f = v;
  vl_ctx *c = f->t->c;
  OK(vl_param_load(c, f->p, f->ph));
  vl_tensor hid;
  OK(vl_sd_clip_forward(f->t->m, &f->t->tok, false, &hid));
  float *h = host_of(&hid);
  double s = tu_dot(h, f->t->rh, hid.n);
  free(h);
  vl_tensor_free(c, &hid);
  return s;
}

static void test_clip_lora_finite_differences(void **state) {
  (void)state;
  static const char *const names[] = {
      "encoder.layers.0.self_attn.q_proj.lora_A.weight", /* the first sink: no input gradient */
      "encoder.layers.0.self_attn.k_proj.lora_B.weight",
      "encoder.layers.0.self_attn.v_proj.lora_A.weight",
      "encoder.layers.0.mlp.fc1.lora_A.weight",
      "encoder.layers.1.self_attn.out_proj.lora_B.weight",
      "encoder.layers.1.mlp.fc2.lora_A.weight",
      "encoder.layers.1.mlp.fc2.lora_B.weight"};
  for (int k = 0; k < 2; k++) { /* plain and checkpointed */
    vl_sd_clip_cfg g = lora_cfg("tiny", VL_F32, VL_ATTN_CLASSIC, k, VL_SD_CLIP_LORA_KOHYA, 4, 8.0f);
    ctrain t;
    ctrain_make(&t, mkctx(VL_DEV_CPU, VL_NO_CAP), &g, 2, 9, false, 99);
    ctrain_step(&t, false, NULL);
    clip_fd f = {.t = &t};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
      f.p = vl_sd_clip_param(t.m, names[i]);
      assert_non_null(f.p);
      assert_true(f.p->trainable);
      int64_t n = f.p->rows * f.p->cols;
      f.ph = malloc((size_t)n * 4);
      float *an = malloc((size_t)n * 4);
      OK(vl_param_read(t.c, f.p, f.ph));
      OK(vl_param_read_grad(t.c, f.p, an));
      int64_t best = 0; /* the 3 entries of largest gradient, checked where they sit */
      for (int64_t j = 0; j < n; j++)
        if (fabsf(an[j]) > fabsf(an[best])) best = j;
      int64_t j0 = best > n - 3 ? n - 3 : best;
      char what[48];
      snprintf(what, sizeof what, "ck%d %s", k, strstr(names[i], "layers.") + 7);
      what[sizeof what - 1] = 0;
      tu_fd_check(clip_fd_loss, &f, f.ph + j0, 3, an + j0, 1e-2f, 5e-3, what);
      OK(vl_param_load(t.c, f.p, f.ph));
      free(an);
      free(f.ph);
    }
    ctrain_free(&t);
  }
}

/* Misuse and OOM: backward without a training forward, training without LoRA, a bad
 * dhidden, a training forward dropped by encode or release, OOM inside a step. */
static void test_clip_lora_misuse_and_oom(void **state) {
  (void)state;
  vl_sd_clip_cfg g =
      lora_cfg("tiny", VL_F32, VL_ATTN_EFFICIENT, false, VL_SD_CLIP_LORA_ATTN, 4, 4.0f);
  ctrain t;
  ctrain_make(&t, mkctx(VL_DEV_CPU, VL_NO_CAP), &g, 2, g.n_pos, true, 0);
  vl_ctx *c = t.c;
  vl_tensor hid;
  assert_int_equal(vl_sd_clip_backward(t.m, &t.R), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "without a training forward"));
  OK(vl_sd_clip_forward(t.m, &t.tok, false, &hid)); /* keeps nothing: no backward */
  assert_int_equal(hid.cat, VL_MEM_TEMP);
  assert_int_equal(vl_sd_clip_backward(t.m, &hid), VL_ERR_INVALID);
  vl_tensor_free(c, &hid);
  assert_int_equal(live(c), t.before);
  /* a bad dhidden: refused, and the forward's activations are freed */
  OK(vl_sd_clip_forward(t.m, &t.tok, true, &hid));
  vl_mem_stats s;
  vl_arena_stats(c->arena, &s);
  assert_true(s.cur[VL_MEM_ACTS] > 0);
  assert_int_equal(vl_sd_clip_backward(t.m, &t.tok), VL_ERR_INVALID);
  assert_int_equal(live(c), t.before + (hid.bytes + 255) / 256 * 256);
  /* a training forward dropped by the next encode, and by release */
  vl_tensor h2, h3;
  OK(vl_sd_clip_forward(t.m, &t.tok, true, &h2));
  OK(vl_sd_clip_encode(t.m, &t.tok, &h3, VL_MEM_DATA));
  vl_arena_stats(c->arena, &s);
  assert_int_equal(s.cur[VL_MEM_ACTS], 0);
  assert_int_equal(vl_sd_clip_backward(t.m, &t.R), VL_ERR_INVALID);
  TU_TFREE(c, &h3, &h2, &hid);
  assert_int_equal(live(c), t.before);
  OK(vl_sd_clip_forward(t.m, &t.tok, true, &hid));
  vl_sd_clip_release(t.m);
  vl_tensor_free(c, &hid);
  assert_int_equal(live(c), t.before);
  assert_int_equal(vl_sd_clip_backward(t.m, &t.R), VL_ERR_INVALID);
  ctrain_free(&t);
  /* without LoRA nothing can train */
  vl_sd_clip_cfg gf = g;
  gf.lora_rank = 0;
  ctrain_make(&t, mkctx(VL_DEV_CPU, VL_NO_CAP), &gf, 2, g.n_pos, false, 0);
  assert_int_equal(vl_sd_clip_forward(t.m, &t.tok, true, &hid), VL_ERR_INVALID);
  assert_false(hid.owned);
  assert_int_equal(live(t.c), t.before);
  ctrain_free(&t);

  /* OOM inside a step under caps below its peak: a status; everything the step made is
   * freed; the same model then steps a smaller batch */
  ctrain tp;
  g.checkpoint = true;
  ctrain_make(&tp, mkctx(VL_DEV_PLAN, VL_NO_CAP), &g, 4, g.n_pos, true, 0);
  ctrain_step(&tp, false, NULL);
  size_t before = tp.before, peak = peak_of(tp.c);
  ctrain_free(&tp);
  const double frac[3] = {0.3, 0.8, 0.99};
  for (int f = 0; f < 3; f++) {
    size_t cap = before + (size_t)(frac[f] * (double)(peak - before));
    ctrain_make(&t, mkctx(VL_DEV_CPU, cap), &g, 4, g.n_pos, true, 0);
    assert_int_equal(t.before, before);
    vl_status st = vl_sd_clip_forward(t.m, &t.tok, true, &hid);
    if (st == VL_OK) {
      st = vl_sd_clip_backward(t.m, &t.R);
      vl_tensor_free(t.c, &hid);
    } else {
      assert_false(hid.owned);
    }
    assert_int_equal(st, VL_ERR_OOM);
    vl_arena_stats(t.c->arena, &s);
    assert_int_equal(s.cur_total, before);
    assert_int_equal(s.n_bad_free, 0);
    vl_tensor one = vl_tensor_rows(&t.tok, 0, 1), r1 = vl_tensor_rows(&t.R, 0, 1);
    if (frac[f] > 0.5) {
      OK(vl_sd_clip_forward(t.m, &one, true, &hid));
      OK(vl_sd_clip_backward(t.m, &r1));
      vl_tensor_free(t.c, &hid);
    }
    ctrain_free(&t);
  }
}

/* (6) parity with transformers' CLIPTextModel + peft LoRA (r=2, alpha 2 on q/k/v/out_proj, B
 * non-zero) in float64: the fixture's LoRA step, loss = sum(last_hidden_state * R). The
 * normalised errors (max |got - ref| / max |ref|) of the hidden state, of the loss and, per
 * LoRA matrix, of its gradient (the worst matrix reported). */
typedef struct {
  double hid, loss, grad;
  char worst[96];
} lora_parity;

static lora_parity clip_lora_parity_run(const sdfx_file *f, vl_attn_impl impl, bool ck,
                                        bool perturb) {
  lora_parity out = {0};
  char err[512];
  vl_sd_clip_cfg g;
  clip_fixture_cfg(f, &g);
  g.weights = g.acts = g.out = VL_F32;
  g.attn = impl;
  g.checkpoint = ck;
  g.lora_rank = (int)fx_i64(f, "config.lora_rank");
  g.lora_alpha = (float)fx_i64(f, "config.lora_alpha");
  g.lora_targets = VL_SD_CLIP_LORA_ATTN;
  vl_ctx *c = mkctx(VL_DEV_CPU, VL_NO_CAP);
  vl_sd_clip *m;
  OK(vl_sd_clip_create(c, &g, 5, &m));
  clip_fixture_load(c, m, f);
  int n;
  vl_param *lp = vl_sd_clip_trainable(m, &n);
  assert_int_equal(n, 2 * 4 * 2);
  assert_int_equal(sdfx_count_prefix(f, "lora."), n);
  for (int i = 0; i < n; i++) { /* every LoRA factor by its name */
    char rec[160];
    snprintf(rec, sizeof rec, "lora.%s", lp[i].name);
    if (sdfx_check_shape(f, rec, 2, (int64_t[]){lp[i].rows, lp[i].cols}, err, sizeof err))
      fail_msg("%s", err);
    float *h = malloc((size_t)(lp[i].rows * lp[i].cols) * 4);
    if (sdfx_read_f32(f, rec, h, lp[i].rows * lp[i].cols, err, sizeof err)) fail_msg("%s", err);
    if (perturb && !strcmp(lp[i].name, "encoder.layers.0.self_attn.q_proj.lora_B.weight"))
      h[3] += 0.05f;
    OK(vl_param_load(c, &lp[i], h));
    free(h);
  }
  vl_tensor tok = clip_fixture_tokens(c, f), R = fx_input(c, f, "input.R"), hid;
  OK(vl_sd_clip_forward(m, &tok, true, &hid));
  int64_t dims[3] = {tok.shape[0], tok.shape[1], g.dim};
  if (sdfx_check_shape(f, "out.lora_last_hidden_state", 3, dims, err, sizeof err))
    fail_msg("%s", err);
  double *want = sdfx_get_f64(f, "out.lora_last_hidden_state", NULL, err, sizeof err);
  assert_non_null(want);
  float *got = host_of(&hid), *rh = host_of(&R);
  out.hid = norm_err(got, want, hid.n);
  double lw;
  if (sdfx_read_f64(f, "out.lora_loss", &lw, 1, err, sizeof err)) fail_msg("%s", err);
  out.loss = fabs(tu_dot(got, rh, hid.n) - lw) / fabs(lw);
  free(want);
  free(got);
  free(rh);
  OK(vl_sd_clip_backward(m, &R));
  vl_tensor_free(c, &hid);
  for (int i = 0; i < n; i++) {
    char rec[160];
    snprintf(rec, sizeof rec, "grad.%s", lp[i].name);
    int64_t gn = 0;
    double *gw = sdfx_get_f64(f, rec, &gn, err, sizeof err);
    if (!gw) fail_msg("%s", err);
    assert_int_equal(gn, lp[i].rows * lp[i].cols);
    float *gh = malloc((size_t)gn * 4);
    OK(vl_param_read_grad(c, &lp[i], gh));
    double e = norm_err(gh, gw, gn);
    if (e >= out.grad) {
      out.grad = e;
      snprintf(out.worst, sizeof out.worst, "%s", lp[i].name);
    }
    free(gh);
    free(gw);
  }
  TU_TFREE(c, &R, &tok);
  vl_sd_clip_destroy(m);
  vl_ctx_destroy(c);
  return out;
}

static void test_clip_lora_parity(void **state) {
  (void)state;
  sdfx_file f;
  fx_open(&f, "sd_clip_parity.bin");
  for (int a = 0; a < VL_ATTN_IMPL_COUNT; a++)
    for (int k = 0; k < 2; k++) {
      lora_parity p = clip_lora_parity_run(&f, (vl_attn_impl)a, k, false);
      print_message("  clip LoRA fp32 %-9s ckpt %d vs transformers + peft (float64): hidden %.2e, "
                    "loss %.2e, LoRA gradients max normalised error %.2e (%s)\n",
                    vl_attn_impl_name((vl_attn_impl)a), k, p.hid, p.loss, p.grad, p.worst);
      assert_true(p.hid <= PARITY_TOL_F32);
      assert_true(p.loss <= PARITY_TOL_F32);
      assert_true(p.grad <= PARITY_TOL_F32);
    }
  /* can fail: one LoRA weight moved by 0.05 */
  lora_parity p = clip_lora_parity_run(&f, VL_ATTN_EFFICIENT, false, true);
  print_message("  clip LoRA with one q_proj lora_B weight + 0.05: hidden %.2e, gradients %.2e\n",
                p.hid, p.grad);
  assert_true(p.hid > 10 * PARITY_TOL_F32 && p.grad > 10 * PARITY_TOL_F32);
  sdfx_close(&f);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(test_full_params),
      cmocka_unit_test(test_full_plan_peaks),
      cmocka_unit_test(test_plan_equals_measured),
      cmocka_unit_test(test_attention_impls_agree),
      cmocka_unit_test(test_sample),
      cmocka_unit_test(test_bad_configs_and_inputs),
      cmocka_unit_test(test_oom),
      cmocka_unit_test(test_vae_parity),
      cmocka_unit_test(test_clip_parity),
      cmocka_unit_test(test_clip_lora_params),
      cmocka_unit_test(test_clip_lora_plan_full),
      cmocka_unit_test(test_clip_lora_plan_equals_measured),
      cmocka_unit_test(test_clip_lora_equivalences),
      cmocka_unit_test(test_clip_lora_finite_differences),
      cmocka_unit_test(test_clip_lora_misuse_and_oom),
      cmocka_unit_test(test_clip_lora_parity),
  };
  return cmocka_run_group_tests(t, NULL, NULL);
}
