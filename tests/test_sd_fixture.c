/* The Stable Diffusion parity fixtures (tests/fixtures/sd_{unet,vae,clip}_parity.bin, written
 * by tests/torch/make_sd_fixture.py) and their reader (tests/sd_fixture.c): record counts and
 * shapes, the relations the references must satisfy among themselves (loss = mean squared
 * error of the stored prediction, DDPM noising, latent sampling, the final LayerNorm), the
 * generated weights against the checksums the script computed, and damaged copies
 * (truncated, bad magic, flipped byte, wrong version, trailing bytes, missing file) that the
 * reader must refuse with a message saying what is wrong. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_fixture.c"

#define UNET_FILE "sd_unet_parity.bin"
#define VAE_FILE "sd_vae_parity.bin"
#define CLIP_FILE "sd_clip_parity.bin"

static void open_fx(sdfx_file *f, const char *file) {
  char path[512], err[1024];
  sdfx_fixture_path(path, sizeof path, file);
  if (sdfx_open(f, path, err, sizeof err) != 0) fail_msg("%s", err);
}

static double *get64(const sdfx_file *f, const char *name, int64_t n) {
  char err[1024];
  int64_t got = 0;
  double *v = sdfx_get_f64(f, name, &got, err, sizeof err);
  if (!v) fail_msg("%s", err);
  assert_int_equal(got, n);
  return v;
}

static void expect_shape(const sdfx_file *f, const char *name, int ndim, const int64_t *dims) {
  char err[1024];
  if (sdfx_check_shape(f, name, ndim, dims, err, sizeof err) != 0) fail_msg("%s", err);
}

static void expect_close(double got, double want, double rtol, const char *what) {
  if (!(fabs(got - want) <= rtol * fabs(want) + 1e-300))
    fail_msg("%s: %.17g, expected %.17g (rtol %g)", what, got, want, rtol);
}

/* Sum and sum of squares of every param.* record, against check.param_sum / _sumsq: ties the
 * C generator of the GEN records to the values the PyTorch reference ran with. Also checks
 * that every generated value is exactly a float32. */
static void check_param_sums(const sdfx_file *f) {
  double s = 0, ss = 0, want_s, want_ss;
  char err[1024];
  int64_t gen = 0;
  for (int i = 0; i < f->n; i++) {
    const sdfx_record *r = &f->rec[i];
    if (strncmp(r->name, "param.", 6) != 0) continue;
    double *v = get64(f, r->name, r->n);
    for (int64_t j = 0; j < r->n; j++) {
      s += v[j];
      ss += v[j] * v[j];
      if ((double)(float)v[j] != v[j]) fail_msg("%s[%lld] = %.17g is not a float32", r->name, (long long)j, v[j]);
    }
    gen += r->dtype == SDFX_GEN;
    free(v);
  }
  assert_int_equal(gen, sdfx_count_prefix(f, "param."));
  if (sdfx_read_f64(f, "check.param_sum", &want_s, 1, err, sizeof err) != 0 ||
      sdfx_read_f64(f, "check.param_sumsq", &want_ss, 1, err, sizeof err) != 0)
    fail_msg("%s", err);
  expect_close(s, want_s, 1e-9, "sum of the generated parameters");
  expect_close(ss, want_ss, 1e-12, "sum of squares of the generated parameters");
}

/* ---- U-Net ------------------------------------------------------------------------------------ */

static void test_unet(void **state) {
  (void)state;
  sdfx_file f;
  char err[1024];
  open_fx(&f, UNET_FILE);
  assert_int_equal(f.n, 371);
  assert_int_equal(sdfx_count_prefix(&f, "param."), 208);
  assert_int_equal(sdfx_count_prefix(&f, "lora."), 64);
  assert_int_equal(sdfx_count_prefix(&f, "grad."), 64);
  assert_int_equal(sdfx_count_prefix(&f, "input."), 4);

  expect_shape(&f, "param.conv_in.weight", 4, (int64_t[]){32, 4, 3, 3});
  expect_shape(&f, "param.down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight", 2,
               (int64_t[]){32, 24});
  expect_shape(&f, "param.down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj.weight", 2,
               (int64_t[]){256, 32});
  expect_shape(&f, "lora.down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.lora_A.weight", 2,
               (int64_t[]){2, 24});
  expect_shape(&f, "lora.mid_block.attentions.0.transformer_blocks.0.attn1.to_out.0.lora_B.weight", 2,
               (int64_t[]){64, 2});
  expect_shape(&f, "out.model_pred", 4, (int64_t[]){2, 4, 8, 8});
  expect_shape(&f, "out.loss", 0, NULL);
  expect_shape(&f, "ddpm.alphas_cumprod", 1, (int64_t[]){1000});
  assert_int_equal(sdfx_find(&f, "ddpm.alphas_cumprod")->dtype, SDFX_F32);

  /* every LoRA matrix has a gradient of its shape; A is (rank, in), B (out, rank) */
  for (int i = 0; i < f.n; i++) {
    const sdfx_record *r = &f.rec[i];
    if (strncmp(r->name, "lora.", 5) != 0) continue;
    char g[300];
    snprintf(g, sizeof g, "grad.%s", r->name + 5);
    expect_shape(&f, g, r->ndim, r->dims);
    assert_int_equal(r->ndim, 2);
    if (strstr(r->name, ".lora_A.weight")) assert_int_equal(r->dims[0], 2);
    else if (strstr(r->name, ".lora_B.weight")) assert_int_equal(r->dims[1], 2);
    else fail_msg("%s: neither lora_A nor lora_B", r->name);
  }

  int64_t heads, ts[2];
  if (sdfx_read_i64(&f, "config.heads", &heads, 1, err, sizeof err) != 0 ||
      sdfx_read_i64(&f, "input.timesteps", ts, 2, err, sizeof err) != 0)
    fail_msg("%s", err);
  assert_int_equal(heads, 8);
  assert_int_equal(ts[0], 10);
  assert_int_equal(ts[1], 700);

  /* the stored loss is the mean squared error of the stored prediction against the noise */
  const int64_t n = 2 * 4 * 8 * 8, per = n / 2;
  double *pred = get64(&f, "out.model_pred", n), *noise = get64(&f, "input.noise", n);
  double *lat = get64(&f, "input.latents", n), *noisy = get64(&f, "out.noisy_latents", n);
  double *acp = get64(&f, "ddpm.alphas_cumprod", 1000), *acpt = get64(&f, "ddpm.alphas_cumprod_t", 2);
  double *loss = get64(&f, "out.loss", 1);
  double se = 0;
  for (int64_t i = 0; i < n; i++) se += (pred[i] - noise[i]) * (pred[i] - noise[i]);
  assert_true(isfinite(loss[0]) && loss[0] > 0.1 && loss[0] < 10);
  expect_close(se / (double)n, loss[0], 1e-12, "loss vs mean((model_pred - noise)^2)");
  /* DDPM add_noise: sqrt(acp[t]) x0 + sqrt(1 - acp[t]) noise, acp diffusers' float32 values */
  for (int b = 0; b < 2; b++) {
    expect_close(acpt[b], acp[ts[b]], 0, "alphas_cumprod at t");
    for (int64_t i = b * per; i < (b + 1) * per; i++)
      expect_close(noisy[i], sqrt(acpt[b]) * lat[i] + sqrt(1 - acpt[b]) * noise[i], 1e-12, "noisy latents");
  }
  /* scaled_linear: acp[t] = prod (1 - beta_s), beta = linspace(sqrt(0.00085), sqrt(0.012))^2 */
  double p = 1;
  for (int t = 0; t <= 700; t++) {
    double sb = sqrt(0.00085) + (sqrt(0.012) - sqrt(0.00085)) * t / 999.0;
    p *= 1 - sb * sb;
    if (t == 10 || t == 700) expect_close(acp[t], p, 1e-5, "alphas_cumprod vs the schedule in double");
  }
  free(pred); free(noise); free(lat); free(noisy); free(acp); free(acpt); free(loss);

  /* gradients: finite, and not all zero for A nor for B */
  double ga = 0, gb = 0;
  for (int i = 0; i < f.n; i++) {
    const sdfx_record *r = &f.rec[i];
    if (strncmp(r->name, "grad.", 5) != 0) continue;
    double *g = get64(&f, r->name, r->n);
    for (int64_t j = 0; j < r->n; j++) {
      assert_true(isfinite(g[j]));
      *(strstr(r->name, "lora_A") ? &ga : &gb) += fabs(g[j]);
    }
    free(g);
  }
  assert_true(ga > 1e-3 && gb > 1e-3);
  check_param_sums(&f);
  sdfx_close(&f);
}

/* ---- VAE encoder ---------------------------------------------------------------------------- */

static void test_vae(void **state) {
  (void)state;
  sdfx_file f;
  open_fx(&f, VAE_FILE);
  assert_int_equal(f.n, 74);
  assert_int_equal(sdfx_count_prefix(&f, "param."), 54);
  assert_int_equal(sdfx_count_prefix(&f, "param.encoder."), 52);
  expect_shape(&f, "param.encoder.conv_in.weight", 4, (int64_t[]){32, 3, 3, 3});
  expect_shape(&f, "param.encoder.down_blocks.0.downsamplers.0.conv.weight", 4, (int64_t[]){32, 32, 3, 3});
  expect_shape(&f, "param.quant_conv.weight", 4, (int64_t[]){8, 8, 1, 1});
  expect_shape(&f, "input.image", 4, (int64_t[]){2, 3, 16, 16});
  expect_shape(&f, "out.latents", 4, (int64_t[]){2, 4, 8, 8});
  expect_shape(&f, "act.encoder", 4, (int64_t[]){2, 8, 8, 8});
  const int64_t n = 2 * 4 * 8 * 8;
  double *mean = get64(&f, "out.mean", n), *logvar = get64(&f, "out.logvar", n), *sd = get64(&f, "out.std", n);
  double *noise = get64(&f, "input.noise", n), *lat = get64(&f, "out.latents", n);
  double *scale = get64(&f, "config.scaling_factor", 1);
  assert_true(scale[0] == 0.18215);
  for (int64_t i = 0; i < n; i++) {
    expect_close(sd[i], exp(0.5 * logvar[i]), 1e-12, "std vs exp(logvar / 2)");
    expect_close(lat[i], (mean[i] + sd[i] * noise[i]) * scale[0], 1e-12, "latents vs (mean + std noise) 0.18215");
  }
  free(mean); free(logvar); free(sd); free(noise); free(lat); free(scale);
  check_param_sums(&f);
  sdfx_close(&f);
}

/* ---- CLIP text encoder ---------------------------------------------------------------------- */

static void test_clip(void **state) {
  (void)state;
  sdfx_file f;
  char err[1024];
  open_fx(&f, CLIP_FILE);
  assert_int_equal(f.n, 87); /* 50 of the frozen encoder, 37 of its LoRA step */
  assert_int_equal(sdfx_count_prefix(&f, "param."), 36);
  assert_int_equal(sdfx_count_prefix(&f, "lora."), 16); /* 2 layers x q, k, v, out_proj x A, B */
  assert_int_equal(sdfx_count_prefix(&f, "grad."), 16);
  expect_shape(&f, "param.embeddings.token_embedding.weight", 2, (int64_t[]){100, 32});
  expect_shape(&f, "param.embeddings.position_embedding.weight", 2, (int64_t[]){7, 32});
  expect_shape(&f, "param.encoder.layers.1.mlp.fc1.weight", 2, (int64_t[]){64, 32});
  expect_shape(&f, "out.last_hidden_state", 3, (int64_t[]){2, 7, 32});
  int64_t ids[14];
  if (sdfx_read_i64(&f, "input.input_ids", ids, 14, err, sizeof err) != 0) fail_msg("%s", err);
  for (int i = 0; i < 14; i++) assert_true(ids[i] >= 0 && ids[i] < 100);
  /* last_hidden_state is after final_layer_norm: (h - bias) / weight has mean 0, variance
   * var / (var + 1e-5) ~ 1 per token (the weights come from the generator) */
  double *h = get64(&f, "out.last_hidden_state", 14 * 32);
  double *w = get64(&f, "param.final_layer_norm.weight", 32);
  double *b = get64(&f, "param.final_layer_norm.bias", 32);
  for (int t = 0; t < 14; t++) {
    double m = 0, v = 0;
    for (int c = 0; c < 32; c++) m += (h[t * 32 + c] - b[c]) / w[c];
    m /= 32;
    for (int c = 0; c < 32; c++) {
      double z = (h[t * 32 + c] - b[c]) / w[c] - m;
      v += z * z;
    }
    v /= 32;
    if (!(fabs(m) < 1e-9 && fabs(v - 1) < 1e-3)) fail_msg("token %d: normalised mean %g, variance %g", t, m, v);
  }
  free(h); free(w); free(b);
  /* the LoRA step's loss is sum(lora_last_hidden_state * R) */
  double *lh = get64(&f, "out.lora_last_hidden_state", 14 * 32), *R = get64(&f, "input.R", 14 * 32);
  double *loss = get64(&f, "out.lora_loss", 1), sum = 0;
  for (int i = 0; i < 14 * 32; i++) sum += lh[i] * R[i];
  expect_close(sum, loss[0], 1e-12, "clip LoRA loss vs sum(hidden * R)");
  free(lh); free(R); free(loss);
  check_param_sums(&f);
  sdfx_close(&f);
}

/* ---- the reader's errors -------------------------------------------------------------------- */

static void test_api_errors(void **state) {
  (void)state;
  sdfx_file f;
  char err[1024];
  open_fx(&f, UNET_FILE);
  float x[256];
  int64_t k[2];
  assert_null(sdfx_find(&f, "param.no_such_thing"));
  assert_int_equal(sdfx_read_f32(&f, "param.no_such_thing", x, 1, err, sizeof err), -1);
  assert_non_null(strstr(err, "no record named"));
  assert_int_equal(sdfx_read_f32(&f, "param.conv_in.bias", x, 31, err, sizeof err), -1);
  assert_non_null(strstr(err, "holds 32 values"));
  assert_int_equal(sdfx_read_i64(&f, "param.conv_in.bias", k, 32, err, sizeof err), -1);
  assert_non_null(strstr(err, "float"));
  assert_int_equal(sdfx_read_f32(&f, "input.timesteps", x, 2, err, sizeof err), -1);
  assert_non_null(strstr(err, "int64"));
  assert_int_equal(sdfx_check_shape(&f, "param.conv_in.weight", 2, (int64_t[]){32, 36}, err, sizeof err), -1);
  assert_non_null(strstr(err, "(32, 4, 3, 3)"));
  /* float64 -> float32 rounds to nearest; generated values come out exactly */
  double d[2];
  float s[2];
  assert_int_equal(sdfx_read_f64(&f, "ddpm.alphas_cumprod_t", d, 2, err, sizeof err), 0);
  assert_int_equal(sdfx_read_f32(&f, "ddpm.alphas_cumprod_t", s, 2, err, sizeof err), 0);
  assert_true(s[0] == (float)d[0] && s[1] == (float)d[1]);
  double gd[32];
  assert_int_equal(sdfx_read_f32(&f, "param.conv_in.bias", x, 32, err, sizeof err), 0);
  assert_int_equal(sdfx_read_f64(&f, "param.conv_in.bias", gd, 32, err, sizeof err), 0);
  for (int i = 0; i < 32; i++) assert_true((double)x[i] == gd[i] && fabs(gd[i]) < 0.125);
  sdfx_close(&f);
}

/* Writes bytes (n of them) to dir/name and returns sdfx_open's result, err filled. */
static int open_damaged(const char *name, const uint8_t *bytes, size_t n, char *err, size_t errn) {
  char path[512];
  tu_join(path, sizeof path, tu_tmp, name);
  tu_write_bytes(path, bytes, n);
  sdfx_file f;
  int rc = sdfx_open(&f, path, err, errn);
  if (rc != 0) assert_true(f.n == 0 && f.buf == NULL && f.rec == NULL);
  sdfx_close(&f);
  return rc;
}

static void expect_refused(const char *name, const uint8_t *bytes, size_t n, const char *needle) {
  char err[1024] = "";
  if (open_damaged(name, bytes, n, err, sizeof err) == 0) fail_msg("%s: the damaged copy was accepted", name);
  if (!strstr(err, needle)) fail_msg("%s: message \"%s\" does not say \"%s\"", name, err, needle);
  print_message("  %s: %s\n", name, err);
}

static void test_damaged(void **state) {
  (void)state;
  char path[512], err[1024];
  sdfx_fixture_path(path, sizeof path, UNET_FILE);
  uint8_t *good;
  size_t n = tu_slurp(path, &good);
  /* an intact copy opens */
  assert_int_equal(open_damaged("intact.bin", good, n, err, sizeof err), 0);

  uint8_t *bad = malloc(n + 1);
  expect_refused("half.bin", good, n / 2, "truncated");
  expect_refused("minus1.bin", good, n - 1, "truncated");
  expect_refused("empty.bin", good, 0, "truncated");
  expect_refused("headeronly.bin", good, 16, "truncated");
  memcpy(bad, good, n);
  bad[0] = 'X';
  expect_refused("magic.bin", bad, n, "bad magic");
  memcpy(bad, good, n);
  bad[8] = 2;
  expect_refused("version.bin", bad, n, "version 2");
  memcpy(bad, good, n);
  bad[n] = 0;
  expect_refused("trailing.bin", bad, n + 1, "trailing");
  /* one bit flipped inside the model prediction's payload: only the checksum can tell */
  sdfx_file f;
  open_fx(&f, UNET_FILE);
  size_t off = (size_t)(sdfx_find(&f, "out.model_pred")->payload - f.buf) + 100;
  sdfx_close(&f);
  memcpy(bad, good, n);
  bad[off] ^= 0x04;
  expect_refused("bitflip.bin", bad, n, "checksum mismatch");
  /* the first record's name length zeroed; the record count made huge */
  memcpy(bad, good, n);
  memset(bad + 16, 0, 4);
  expect_refused("namelen.bin", bad, n, "name length 0");
  memcpy(bad, good, n);
  memset(bad + 12, 0xff, 4);
  expect_refused("count.bin", bad, n, "records cannot fit");
  /* a missing file says how to make it */
  tu_join(path, sizeof path, tu_tmp, "missing.bin");
  assert_int_equal(sdfx_open(&f, path, err, sizeof err), -1);
  assert_non_null(strstr(err, "cannot open"));
  assert_non_null(strstr(err, "make_sd_fixture.py"));
  print_message("  missing.bin: %s\n", err);
  free(bad);
  free(good);
}

static int tmp_setup(void **state) {
  (void)state;
  return tu_tmpdir(tu_tmp, sizeof tu_tmp, "vl_sdfx_");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unet),       cmocka_unit_test(test_vae),     cmocka_unit_test(test_clip),
      cmocka_unit_test(test_api_errors), cmocka_unit_test(test_damaged),
  };
  return cmocka_run_group_tests(tests, tmp_setup, tu_tmp_teardown);
}
