/* Stable Diffusion 1.5's frozen encoders (engine/models/sd_vae.c, sd_clip.c): full-scale
 * parameter names, shapes and counts against the PyTorch listings; full-scale planned peaks
 * (fp16, B = 1 and 8) and the time a plan takes; planned peak == measured peak on the CPU at
 * tiny scale (fp32 and bf16, classic and efficient attention); classic == efficient up to
 * rounding; the Gaussian sample against its formula; bad configurations and inputs; OOM in
 * the middle of a forward frees everything; parity with diffusers' AutoencoderKL and
 * transformers' CLIPTextModel (float64 references on tiny configurations,
 * tests/fixtures/sd_{vae,clip}_parity.bin from tests/torch/make_sd_fixture.py).
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

static void clip_parity_run(const sdfx_file *f, vl_dtype dt, vl_attn_impl impl, bool perturb,
                            double *err_out) {
  vl_sd_clip_cfg g;
  vl_sd_clip_preset("tiny", &g);
  g.vocab = fx_i64(f, "config.vocab_size");
  g.dim = fx_i64(f, "config.hidden_size");
  g.ffn = fx_i64(f, "config.intermediate_size");
  g.n_layers = fx_i64(f, "config.num_hidden_layers");
  g.n_heads = fx_i64(f, "config.num_attention_heads");
  g.n_pos = fx_i64(f, "config.max_position_embeddings");
  g.eps = (float)fx_f64(f, "config.layer_norm_eps");
  g.act = VL_ACT_QUICK_GELU;
  g.weights = g.acts = dt;
  g.out = VL_F32;
  g.attn = impl;
  vl_ctx *c = mkctx(VL_DEV_CPU, VL_NO_CAP);
  vl_sd_clip *m;
  OK(vl_sd_clip_create(c, &g, 5, &m));
  /* the SD 1.5 checkpoint's keys (and make_sd_fixture.py's) may carry "text_model."; the
   * live CLIPTextModel of transformers 5 and sd15_params_text_encoder.txt do not */
  bool pre = sdfx_find(f, "param.text_model.embeddings.token_embedding.weight") != NULL;
  fx_load_params(c, vl_sd_clip_params(m), f, pre ? "text_model." : "");
  if (perturb) {
    vl_param *q = vl_sd_clip_param(m, "encoder.layers.1.self_attn.q_proj.weight");
    assert_non_null(q);
    float *h = malloc((size_t)(q->rows * q->cols) * sizeof *h);
    OK(vl_param_read(c, q, h));
    h[5] += 0.05f;
    OK(vl_param_load(c, q, h));
    free(h);
  }
  const sdfx_record *ids = sdfx_find(f, "input.input_ids");
  assert_non_null(ids);
  assert_int_equal(ids->ndim, 2);
  int64_t B = ids->dims[0], T = ids->dims[1];
  int64_t *id64 = malloc((size_t)(B * T) * sizeof *id64);
  int32_t *id32 = malloc((size_t)(B * T) * sizeof *id32);
  char err[512];
  if (sdfx_read_i64(f, "input.input_ids", id64, B * T, err, sizeof err)) fail_msg("%s", err);
  for (int64_t i = 0; i < B * T; i++) id32[i] = (int32_t)id64[i];
  vl_tensor tok, hid;
  OK(vl_tensor_alloc2(c, &tok, VL_I32, VL_MEM_DATA, B, T));
  OK(c->be->upload(c, &tok, 0, id32, tok.bytes));
  OK(vl_sd_clip_encode(m, &tok, &hid, VL_MEM_DATA));
  int64_t dims[3] = {B, T, g.dim};
  if (sdfx_check_shape(f, "out.last_hidden_state", 3, dims, err, sizeof err)) fail_msg("%s", err);
  double *want = sdfx_get_f64(f, "out.last_hidden_state", NULL, err, sizeof err);
  assert_non_null(want);
  float *got = host_of(&hid);
  *err_out = norm_err(got, want, hid.n);
  free(got);
  free(want);
  free(id64);
  free(id32);
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
  };
  return cmocka_run_group_tests(t, NULL, NULL);
}
