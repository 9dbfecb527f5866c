/* Parity of the C Mistral model with a float64 PyTorch reference of the Hugging Face
 * architecture (RoPE rotate_half, grouped-query attention, RMSNorm, SwiGLU, untied LM head,
 * mean cross-entropy over targets != -1).
 *
 * tests/fixtures/mistral_parity.bin is written by tests/torch/make_parity_fixture.py (its
 * docstring documents the format): a tiny config, float32 weights, one right-padded batch,
 * and the reference loss and the gradient of every parameter. The C model loads the same
 * weights, runs one forward + backward and must reproduce them. No optimizer step is taken.
 *
 * Tolerances. The reference is float64 on the same float32 weights, so the only error is
 * the C engine's float32 rounding (unit roundoff 6e-8): a few ulps per op, ~20 ops deep,
 * dot products of at most 64 terms. Observed (OpenBLAS, x86-64): loss rel err ~6e-9,
 * gradient abs err <= 7.5e-8 with gradients up to 0.23.
 *  - loss: rel 1e-5 (three orders above what float32 gives here; still 370x below the
 *    smallest loss shift of a wrong convention, see make_parity_fixture.py's self-check);
 *  - gradients: |got - want| <= 1e-6 + 1e-4 |want|: the 1e-6 floor is ~13x the worst
 *    absolute error seen (room for another BLAS's summation order or thread split), and
 *    1e-4 relative covers the larger entries; a wrong RoPE pairing, head mapping, softmax
 *    scale or norm moves gradients by percents.
 * test_parity_can_fail shows that a 1e-2 change to one weight of a k projection (3% of
 * that matrix's std) is caught by the loss check and by the gradient check.
 *
 * The families --model-config reads beyond Mistral and Llama 3 (version 2 of the format,
 * make_parity_fixture.py --family): llama32_parity.bin from transformers' LlamaForCausalLM
 * with a tied head (the embedding's gradient the sum of both uses), qwen2_parity.bin from
 * Qwen2ForCausalLM with q/k/v biases and a tied head; the same tolerances. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/mistral.h"

#define MISTRAL_FIXTURE "tests/fixtures/mistral_parity.bin"
/* the families (make_parity_fixture.py --family, version 2): through transformers' own classes */
#define LLAMA32_FIXTURE "tests/fixtures/llama32_parity.bin" /* tied head */
#define QWEN2_FIXTURE "tests/fixtures/qwen2_parity.bin"     /* tied head, q/k/v biases */
static const char *FIXTURE = MISTRAL_FIXTURE;            /* the one being read, for messages */
#define NAME_LEN 48
#define LOSS_RTOL 1e-5
#define GRAD_ATOL 1e-6
#define GRAD_RTOL 1e-4

typedef struct {
  char name[NAME_LEN];
  int64_t rows, cols;
  float *w, *g;
} fx_param;

typedef struct {
  vl_mistral_cfg mc;
  int64_t B, T;
  int32_t *tokens, *targets;
  int n;
  fx_param *p;
  double loss;
} fixture;

static void fixture_free(fixture *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) { free(f->p[i].w); free(f->p[i].g); }
  free(f->p);
  free(f->tokens);
  free(f->targets);
  free(f);
}

/* Read exactly n bytes or say what was missing. */
static int rd(FILE *fp, void *dst, size_t n, const char *what, char *err, size_t errn) {
  if (fread(dst, 1, n, fp) == n) return 0;
  snprintf(err, errn, "%s: truncated while reading %s (%zu bytes)", FIXTURE, what, n);
  return -1;
}

/* Load the fixture; on any problem returns NULL with a message in err (never crashes). */
static fixture *fixture_load(const char *path, char *err, size_t errn) {
  FIXTURE = path;
  FILE *fp = fopen(FIXTURE, "rb");
  if (!fp) {
    snprintf(err, errn, "%s: cannot open (run the test from the repo root; regenerate with "
             "python3 tests/torch/make_parity_fixture.py)", FIXTURE);
    return NULL;
  }
  fixture *f = calloc(1, sizeof *f);
  if (!f) { fclose(fp); snprintf(err, errn, "out of host memory"); return NULL; }
  char magic[8];
  uint32_t ver_n[2];
  int64_t cfg[8], bt[2];
  float rf[2];
  if (rd(fp, magic, 8, "magic", err, errn)) goto fail;
  if (memcmp(magic, "VLPARITY", 8)) { snprintf(err, errn, "%s: bad magic", FIXTURE); goto fail; }
  if (rd(fp, ver_n, sizeof ver_n, "version", err, errn)) goto fail;
  if (ver_n[0] != 1 && ver_n[0] != 2) { snprintf(err, errn, "%s: version %u, want 1 or 2", FIXTURE, ver_n[0]); goto fail; }
  if (rd(fp, cfg, sizeof cfg, "config", err, errn)) goto fail;
  if (rd(fp, rf, sizeof rf, "rope_theta/norm_eps", err, errn)) goto fail;
  int32_t flags[2] = {0, 0}; /* version 2: tie_embed, qkv_bias */
  if (ver_n[0] == 2 && rd(fp, flags, sizeof flags, "tie_embed/qkv_bias", err, errn)) goto fail;
  if (rd(fp, bt, sizeof bt, "B/T", err, errn)) goto fail;
  for (int i = 0; i < 8; i++)
    if (cfg[i] < 1 || cfg[i] > 4096) { snprintf(err, errn, "%s: config value %d = %lld out of range", FIXTURE, i, (long long)cfg[i]); goto fail; }
  if (bt[0] < 1 || bt[0] > 64 || bt[1] < 1 || bt[1] > 4096) {
    snprintf(err, errn, "%s: B=%lld T=%lld out of range", FIXTURE, (long long)bt[0], (long long)bt[1]);
    goto fail;
  }
  f->mc = (vl_mistral_cfg){cfg[0], cfg[1], cfg[2], cfg[3], cfg[4], cfg[5], cfg[6], cfg[7], rf[0], rf[1], flags[0] != 0, flags[1] != 0};
  f->B = bt[0];
  f->T = bt[1];
  int64_t R = f->B * f->T;
  int64_t want_n = 3 + 9 * f->mc.n_layers - (f->mc.tie_embed ? 1 : 0) + (f->mc.qkv_bias ? 3 * f->mc.n_layers : 0);
  if ((int64_t)ver_n[1] != want_n) {
    snprintf(err, errn, "%s: %u parameter records, want %lld", FIXTURE, ver_n[1], (long long)want_n);
    goto fail;
  }
  f->tokens = malloc((size_t)R * 4);
  f->targets = malloc((size_t)R * 4);
  f->p = calloc(ver_n[1], sizeof *f->p);
  if (!f->tokens || !f->targets || !f->p) { snprintf(err, errn, "out of host memory"); goto fail; }
  if (rd(fp, f->tokens, (size_t)R * 4, "tokens", err, errn)) goto fail;
  if (rd(fp, f->targets, (size_t)R * 4, "targets", err, errn)) goto fail;
  for (uint32_t i = 0; i < ver_n[1]; i++) {
    fx_param *p = &f->p[i];
    f->n = (int)i + 1;
    int64_t rc[2];
    if (rd(fp, p->name, NAME_LEN, "parameter name", err, errn)) goto fail;
    p->name[NAME_LEN - 1] = 0;
    if (rd(fp, rc, sizeof rc, p->name, err, errn)) goto fail;
    if (rc[0] < 1 || rc[1] < 1 || rc[0] * rc[1] > (1 << 24)) {
      snprintf(err, errn, "%s: %s has bad shape %lld x %lld", FIXTURE, p->name, (long long)rc[0], (long long)rc[1]);
      goto fail;
    }
    p->rows = rc[0];
    p->cols = rc[1];
    size_t bytes = (size_t)(p->rows * p->cols) * sizeof(float);
    p->w = malloc(bytes);
    p->g = malloc(bytes);
    if (!p->w || !p->g) { snprintf(err, errn, "out of host memory"); goto fail; }
    if (rd(fp, p->w, bytes, p->name, err, errn)) goto fail;
    if (rd(fp, p->g, bytes, p->name, err, errn)) goto fail;
  }
  if (rd(fp, &f->loss, sizeof f->loss, "loss", err, errn)) goto fail;
  if (rd(fp, magic, 8, "end marker", err, errn)) goto fail;
  if (memcmp(magic, "VLPAREND", 8)) { snprintf(err, errn, "%s: bad end marker", FIXTURE); goto fail; }
  fclose(fp);
  return f;
fail:
  fclose(fp);
  fixture_free(f);
  return NULL;
}

static fixture *load_or_fail(const char *path) {
  char err[512] = "";
  fixture *f = fixture_load(path, err, sizeof err);
  if (!f) fail_msg("parity fixture: %s", err);
  return f;
}

/* A CPU model with the fixture's config and weights: full fine-tune, fp32. */
static void model_create(const fixture *f, bool checkpoint, vl_ctx **cp, vl_mistral **mp) {
  vl_ctx *c = NULL;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, (size_t)256 << 20), VL_OK);
  vl_train_cfg tc;
  vl_train_cfg_default(&tc);
  tc.compute = VL_F32;
  tc.frozen = VL_F32;
  tc.lora_rank = 0;
  tc.checkpoint = checkpoint;
  vl_mistral *m = NULL;
  vl_status s = vl_mistral_create(c, &f->mc, &tc, 1, &m);
  if (s != VL_OK) fail_msg("vl_mistral_create: %s: %s", vl_status_name(s), c->err);
  int n;
  vl_param *ps = vl_mistral_params(m, &n);
  int k = 0;
  for (int i = 0; i < n; i++) {
    vl_param *p = &ps[i];
    if (!p->w.owned) continue; /* unused LoRA slot */
    if (k >= f->n) fail_msg("model has more parameters than the fixture's %d (at %s)", f->n, p->name);
    const fx_param *q = &f->p[k++];
    if (strcmp(p->name, q->name) || p->rows != q->rows || p->cols != q->cols)
      fail_msg("parameter order: model has %s (%lld x %lld), fixture %s (%lld x %lld)", p->name,
               (long long)p->rows, (long long)p->cols, q->name, (long long)q->rows, (long long)q->cols);
    assert_true(p->trainable);
    s = vl_param_load(c, p, q->w);
    if (s != VL_OK) fail_msg("vl_param_load %s: %s", p->name, c->err);
  }
  if (k != f->n) fail_msg("model has %d parameters, the fixture %d", k, f->n);
  *cp = c;
  *mp = m;
}

static void model_destroy(vl_ctx *c, vl_mistral *m) {
  vl_mistral_destroy(m);
  vl_ctx_destroy(c);
}

static double run_step(const fixture *f, vl_ctx *c, vl_mistral *m) {
  vl_mistral_batch b = {.B = f->B, .T = f->T, .tokens = f->tokens, .targets = f->targets};
  vl_mistral_step_info info;
  vl_status s = vl_mistral_fwd_bwd(m, &b, 1, &info);
  if (s != VL_OK) fail_msg("vl_mistral_fwd_bwd: %s: %s", vl_status_name(s), c->err);
  int64_t nvalid = 0;
  for (int64_t i = 0; i < f->B * f->T; i++) nvalid += f->targets[i] >= 0;
  assert_int_equal(info.n_tokens, nvalid);
  return info.loss;
}

static void check_loss(double got, double want) {
  double rel = fabs(got - want) / fabs(want);
  print_message("  loss C %.9f  torch %.9f  rel err %.3g\n", got, want, rel);
  if (!(rel <= LOSS_RTOL)) fail_msg("loss %.9f vs reference %.9f: rel err %.3g > %g", got, want, rel, LOSS_RTOL);
}

/* Compare every gradient with the fixture. Returns the worst max|err|/tolerance over all
 * parameters (<= 1: all within tolerance) and the name of the parameter where it occurs;
 * prints one line per parameter when verbose. */
static double grads_worst(const fixture *f, vl_ctx *c, vl_mistral *m, bool verbose,
                          char *worst_name, double *worst_abs) {
  int n;
  vl_param *ps = vl_mistral_params(m, &n);
  int k = 0;
  double worst = 0;
  *worst_abs = 0;
  strcpy(worst_name, "-");
  for (int i = 0; i < n; i++) {
    vl_param *p = &ps[i];
    if (!p->w.owned) continue;
    const fx_param *q = &f->p[k++];
    int64_t cnt = p->rows * p->cols;
    float *g = malloc((size_t)cnt * sizeof(float));
    assert_non_null(g);
    vl_status s = vl_param_read_grad(c, p, g);
    if (s != VL_OK) { free(g); fail_msg("vl_param_read_grad %s: %s", p->name, c->err); }
    double mabs = 0, gmax = 0;
    for (int64_t j = 0; j < cnt; j++) {
      double d = fabs((double)g[j] - (double)q->g[j]);
      if (!(d <= mabs)) mabs = d; /* NaN wins */
      if (fabs((double)q->g[j]) > gmax) gmax = fabs((double)q->g[j]);
    }
    double ratio = tu_max_rel_err(g, q->g, cnt, GRAD_ATOL, GRAD_RTOL);
    free(g);
    if (verbose)
      print_message("  grad %-10s max|ref| %.3e  max abs err %.3e  err/tol %.4f\n", p->name, gmax,
                    mabs, ratio);
    if (!(gmax > 0)) fail_msg("fixture gradient of %s is all zero: the fixture cannot test it", p->name);
    if (!(mabs <= *worst_abs)) *worst_abs = mabs;
    if (!(ratio <= worst)) { worst = ratio; snprintf(worst_name, NAME_LEN, "%s", p->name); }
  }
  return worst;
}

/* Assert every gradient matches, naming the parameter and the element on failure. */
static void check_grads(const fixture *f, vl_ctx *c, vl_mistral *m) {
  char name[NAME_LEN];
  double wabs;
  double worst = grads_worst(f, c, m, true, name, &wabs);
  print_message("  all gradients: max abs err %.3e, worst err/tol %.4f (%s)\n", wabs, worst, name);
  if (worst <= 1) return;
  int n;
  vl_param *ps = vl_mistral_params(m, &n);
  for (int i = 0, k = 0; i < n; i++) {
    if (!ps[i].w.owned) continue;
    const fx_param *q = &f->p[k++];
    if (strcmp(ps[i].name, name)) continue;
    float *g = malloc((size_t)(q->rows * q->cols) * sizeof(float));
    assert_non_null(g);
    assert_int_equal(vl_param_read_grad(c, &ps[i], g), VL_OK);
    char what[96];
    snprintf(what, sizeof what, "gradient of %s", name);
    tu_assert_close(g, q->g, q->rows * q->cols, GRAD_ATOL, GRAD_RTOL, what); /* fails, names it */
    free(g);
  }
  fail_msg("gradient of %s: err/tol %.3f > 1", name, worst);
}

static void parity(const char *path, bool checkpoint) {
  fixture *f = load_or_fail(path);
  vl_ctx *c;
  vl_mistral *m;
  model_create(f, checkpoint, &c, &m);
  double loss = run_step(f, c, m);
  check_loss(loss, f->loss);
  check_grads(f, c, m);
  model_destroy(c, m);
  fixture_free(f);
}

static void test_parity_full(void **state) {
  (void)state;
  parity(MISTRAL_FIXTURE, false);
}

static void test_parity_checkpoint(void **state) {
  (void)state;
  parity(MISTRAL_FIXTURE, true);
}

/* Llama 3.2's tied head: one parameter, its gradient the sum of the embedding's and the
 * head's; LlamaForCausalLM's own forward and backward. */
static void test_parity_llama32(void **state) {
  (void)state;
  parity(LLAMA32_FIXTURE, false);
  parity(LLAMA32_FIXTURE, true);
}

/* Qwen2's q/k/v biases (and a tied head, as the small Qwen2.5): Qwen2ForCausalLM's. */
static void test_parity_qwen2(void **state) {
  (void)state;
  parity(QWEN2_FIXTURE, false);
  parity(QWEN2_FIXTURE, true);
}

/* The checks have teeth: a 1e-2 change to one weight of layer 0's k projection (a kv head
 * shared by two query heads: the GQA path) is seen by the loss check and by the gradient
 * check. */
static void test_parity_can_fail(void **state) {
  (void)state;
  fixture *f = load_or_fail(MISTRAL_FIXTURE);
  vl_ctx *c;
  vl_mistral *m;
  model_create(f, false, &c, &m);
  int n;
  vl_param *ps = vl_mistral_params(m, &n);
  vl_param *kp = NULL;
  const fx_param *q = NULL;
  for (int i = 0, k = 0; i < n; i++) {
    if (!ps[i].w.owned) continue;
    if (!strcmp(ps[i].name, "l0.k")) { kp = &ps[i]; q = &f->p[k]; }
    k++;
  }
  if (!kp) fail_msg("no parameter l0.k in the model");
  int64_t cnt = kp->rows * kp->cols;
  float *w = malloc((size_t)cnt * sizeof(float));
  assert_non_null(w);
  memcpy(w, q->w, (size_t)cnt * sizeof(float));
  /* the entry with the largest gradient: the one the loss is most sensitive to */
  int64_t at = 0;
  for (int64_t j = 1; j < cnt; j++)
    if (fabsf(q->g[j]) > fabsf(q->g[at])) at = j;
  w[at] += 1e-2f;
  assert_int_equal(vl_param_load(c, kp, w), VL_OK);
  free(w);
  double loss = run_step(f, c, m);
  double rel = fabs(loss - f->loss) / fabs(f->loss);
  char name[NAME_LEN];
  double wabs;
  double worst = grads_worst(f, c, m, false, name, &wabs);
  print_message("  l0.k[%lld] += 1e-2: loss rel diff %.3g (tolerance %g); worst gradient "
                "err/tol %.3g at %s\n", (long long)at, rel, LOSS_RTOL, worst, name);
  if (!(rel > 10 * LOSS_RTOL)) fail_msg("perturbed loss rel diff %.3g: the loss check is blind", rel);
  if (!(worst > 10)) fail_msg("perturbed gradients err/tol %.3g: the gradient check is blind", worst);
  model_destroy(c, m);
  fixture_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity_full),
      cmocka_unit_test(test_parity_checkpoint),
      cmocka_unit_test(test_parity_can_fail),
      cmocka_unit_test(test_parity_llama32),
      cmocka_unit_test(test_parity_qwen2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
