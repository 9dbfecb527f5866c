/* Checkpoint and resume (engine/run/ckpt.c, the loop's saves and vl_run_resume, the cases'
 * state, the CLI): a resumed run's loss trajectory and final state are bit-identical to an
 * uninterrupted run's (Mistral with LoRA, fp16 AMP and accumulation; the U-Net through the
 * seg-ckpt case's loader, evaluation and batch-norm statistics); a damaged or mismatched
 * checkpoint is refused naming the file and the field, and the model is left as it was; an
 * interrupt saves at the step edge; `vramlab run --save-every / --resume` end to end. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "datasets/dialogue.h"
#include "testutil.h"
#include "vramlab/cache.h" /* vl_crc32 */
#include "vramlab/ckpt.h"
#include "vramlab/fileio.h"
#include "vramlab/mistral.h"
#include "vramlab/resunet.h"
#include "vramlab/run.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic error "-Wformat-truncation"
#endif

#define ACCUM 2
#define ROWS 2
#define STEPS 8

static char last_err[600]; /* the last failing context's message */

/* ---- Mistral: the llm-lora case's model, fp16 AMP with a loss scale that moves ---------- */
/* variant 0: LoRA r=8 on an fp16 base, AdamW (the llm-lora `lora` rung); variant 1: full
 * fine-tune in fp16 AMP (fp32 masters of every weight) with Adafactor and a first moment
 * (factored state of other shapes). Window 2: the scale doubles every 2 good steps until an
 * overflow halves it, so the scaler's state changes from step to step. */
static vl_mistral_model_cfg llm_cfg(int variant) {
  vl_mistral_model_cfg k;
  assert_int_equal(vl_mistral_preset("tiny", &k.mc), 0);
  vl_train_cfg_default(&k.tc);
  k.tc.compute = VL_F16;
  k.tc.loss_scale_window = 2;
  if (variant == 0) {
    k.tc.lora_rank = 8;
    k.tc.frozen = VL_F16;
    vl_optim_cfg_default(&k.tc.optim, 1e-3f);
  } else {
    vl_optim_cfg_default(&k.tc.optim, 1e-3f);
    k.tc.optim.opt = VL_OPT_ADAFACTOR;
    k.tc.optim.adafactor_beta1 = true;
  }
  return k;
}

/* The data: accum micro-batches of dialogue per step; its RNG is the checkpoint's blob. */
typedef struct {
  vl_dialogue_gen g;
  int32_t *tok, *tgt;
  vl_batch mb[ACCUM];
  long stop_after; /* set `stop` after this step index (-1: never) */
  volatile sig_atomic_t stop;
} feed;

static vl_status feed_next(void *user, long step, const vl_batch **mb, int *n, double *wait) {
  (void)step;
  (void)wait;
  feed *f = user;
  int64_t T = f->g.max_len;
  for (int j = 0; j < ACCUM; j++) {
    int32_t *tok = f->tok + j * ROWS * T, *tgt = f->tgt + j * ROWS * T;
    int64_t Tj = vl_dialogue_batch(&f->g, ROWS, 0, tok, tgt), sh[2] = {ROWS, Tj};
    f->mb[j] = (vl_batch){0};
    vl_batch_add(&f->mb[j], "tokens", VL_I32, 2, sh, tok);
    vl_batch_add(&f->mb[j], "targets", VL_I32, 2, sh, tgt);
  }
  *mb = f->mb;
  *n = ACCUM;
  return VL_OK;
}
static void feed_after(void *user, long step, bool timed, const vl_step_info *info, double dt, double wait) {
  (void)timed, (void)info, (void)dt, (void)wait;
  feed *f = user;
  if (step == f->stop_after) f->stop = 1;
}
static vl_status feed_save(void *user, long steps, void **blob, size_t *len) {
  (void)steps;
  feed *f = user;
  *blob = malloc(sizeof f->g.rng);
  if (!*blob) return VL_ERR_OOM;
  memcpy(*blob, &f->g.rng, sizeof f->g.rng);
  *len = sizeof f->g.rng;
  return VL_OK;
}

typedef struct {
  uint64_t seed;         /* of the model's weights (a resumed run's must not matter) */
  const char *resume;    /* checkpoint to continue from, or NULL */
  const char *save_dir;  /* NULL: no checkpoints */
  long save_every, stop_after, total;
  const char *final;     /* the final state is saved here (vl_ckpt_save), or NULL */
  const char *settings;  /* the run's settings (recorded by saves, compared by the resume) */
} llm_run;

/* One training run of the Mistral on a fresh context: its status; res holds the losses. */
static vl_status run_llm(const vl_mistral_model_cfg *k, const llm_run *o, vl_loop_result *res) {
  vl_ctx *c;
  assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_model *m;
  assert_int_equal(vl_model_create(c, &vl_model_mistral, k, o->seed, &m), VL_OK);
  int64_t T = k->mc.seq;
  feed f = {.tok = malloc((size_t)(ACCUM * ROWS * T) * 4), .tgt = malloc((size_t)(ACCUM * ROWS * T) * 4),
            .stop_after = o->stop_after};
  assert_non_null(f.tok);
  assert_non_null(f.tgt);
  vl_dialogue_init(&f.g, k->mc.vocab, T, 7);
  memset(res, 0, sizeof *res);
  vl_status s = VL_OK;
  if (o->resume) {
    vl_ckpt_meta meta;
    s = vl_run_resume(m, o->resume, "test", o->settings, res, &meta);
    if (s == VL_OK) {
      assert_int_equal(meta.blob_len, sizeof f.g.rng);
      memcpy(&f.g.rng, meta.blob, sizeof f.g.rng);
    }
    vl_ckpt_meta_free(&meta);
  }
  vl_loop_cfg lc = {.warmup = 1, .total = o->total, .next = feed_next, .after = feed_after, .user = &f,
                    .stop = &f.stop, .save_every = o->save_every, .save_dir = o->save_dir, .ckpt_tag = "test",
                    .ckpt_settings = o->settings, .save_state = feed_save};
  if (s == VL_OK) s = vl_run_loop(m, &lc, res);
  snprintf(last_err, sizeof last_err, "%s", c->err);
  if (s != VL_OK && s != VL_ERR_INTERRUPTED) print_error("run: %s\n", c->err);
  if (o->final && (s == VL_OK || s == VL_ERR_INTERRUPTED)) assert_int_equal(vl_ckpt_save(m, o->final, &(vl_ckpt_meta){0}), VL_OK);
  free(f.tok);
  free(f.tgt);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  return s;
}

static void path_in(char *buf, size_t n, const char *name) { tu_join(buf, n, tu_tmp, name); }

static void assert_losses_equal(const vl_loop_result *a, const vl_loop_result *b) {
  assert_int_equal(a->steps, b->steps);
  for (long i = 0; i < a->steps; i++)
    if (memcmp(&a->losses[i], &b->losses[i], sizeof(double))) fail_msg("step %ld: loss %.17g vs %.17g", i, a->losses[i], b->losses[i]);
}

/* (1) k steps + save + a fresh context and model (other weights) + load + the rest gives
 * the uninterrupted run's losses bit for bit, and its final parameters, masters, optimizer
 * state and scaler (the final checkpoints compared byte for byte). */
static void check_llm_resume(int variant) {
  vl_mistral_model_cfg k = llm_cfg(variant);
  char dir[320], ref_final[320], res_final[320], from[400];
  snprintf(ref_final, sizeof ref_final, "%s/llm%d-ref.final", tu_tmp, variant);
  snprintf(dir, sizeof dir, "%s/llm%d-ref", tu_tmp, variant);
  vl_loop_result ref, r2;
  llm_run o = {.seed = 1, .save_dir = dir, .save_every = 3, .stop_after = -1, .total = STEPS, .final = ref_final};
  assert_int_equal(run_llm(&k, &o, &ref), VL_OK);
  assert_int_equal(ref.saves, 2); /* steps 3 and 6 */
  vl_scaler want;
  vl_scaler_init(&want, true, k.tc.loss_scale, 2);
  if (ref.loss_scale_end == want.scale && ref.skipped == 0) fail_msg("the loss scale never moved: the scaler is not exercised");
  print_message("  variant %d: losses %.6f .. %.6f, %ld skipped, final scale %g\n", variant, ref.losses[0],
                ref.losses[STEPS - 1], ref.skipped, (double)ref.loss_scale_end);
  for (int at = 3; at <= 6; at += 3) {
    snprintf(from, sizeof from, "%s/step-%d.ckpt", dir, at);
    snprintf(res_final, sizeof res_final, "%s/llm%d-from%d.final", tu_tmp, variant, at);
    llm_run o2 = {.seed = 99, .resume = from, .stop_after = -1, .total = STEPS, .final = res_final};
    assert_int_equal(run_llm(&k, &o2, &r2), VL_OK);
    assert_int_equal(r2.resumed_from, at);
    assert_losses_equal(&ref, &r2);
    assert_true(r2.loss_scale_end == ref.loss_scale_end);
    assert_true(tu_same_file(ref_final, res_final));
    vl_loop_result_free(&r2);
  }
  /* the weights' seed matters without a resume (so the comparison above can fail) */
  snprintf(res_final, sizeof res_final, "%s/llm%d-seed99.final", tu_tmp, variant);
  llm_run o3 = {.seed = 99, .stop_after = -1, .total = STEPS, .final = res_final};
  assert_int_equal(run_llm(&k, &o3, &r2), VL_OK);
  assert_false(tu_same_file(ref_final, res_final));
  assert_true(memcmp(r2.losses, ref.losses, STEPS * sizeof(double)) != 0);
  vl_loop_result_free(&r2);
  vl_loop_result_free(&ref);
}
static void test_llm_resume_lora(void **state) {
  (void)state;
  check_llm_resume(0);
}
static void test_llm_resume_full_adafactor(void **state) {
  (void)state;
  check_llm_resume(1);
}

/* ---- (4) the interrupt path ----------------------------------------------------------- */
static void test_interrupt_saves_at_step_edge(void **state) {
  (void)state;
  vl_mistral_model_cfg k = llm_cfg(0);
  char dir[320], ref_final[320], fin[320], latest[400], path[400];
  vl_err err;
  path_in(dir, sizeof dir, "int");
  path_in(ref_final, sizeof ref_final, "int-ref.final");
  path_in(fin, sizeof fin, "int-resumed.final");
  vl_loop_result ref, r, r2;
  assert_int_equal(run_llm(&k, &(llm_run){.seed = 1, .stop_after = -1, .total = STEPS, .final = ref_final}, &ref),
                   VL_OK);
  /* the stop flag goes up during step 4 (index 3): the step finishes, a checkpoint of 4 steps */
  vl_status s = run_llm(&k, &(llm_run){.seed = 1, .save_dir = dir, .save_every = 100, .stop_after = 3, .total = STEPS}, &r);
  assert_int_equal(s, VL_ERR_INTERRUPTED);
  assert_int_equal(r.steps, 4);
  assert_int_equal(r.saves, 1);
  assert_int_equal(r.saved_step, 4);
  assert_non_null(strstr(last_err, "interrupted after step 4"));
  assert_non_null(strstr(last_err, "step-4.ckpt"));
  snprintf(latest, sizeof latest, "%s/latest", dir);
  char *text;
  (void)vl_file_read_text(latest, 100, NULL, &text, NULL, &err);
  assert_non_null(text);
  assert_string_equal(text, "step-4.ckpt\n");
  free(text);
  /* --resume DIR: the folder's latest */
  assert_int_equal(vl_ckpt_resolve(dir, path, sizeof path, &err), VL_OK);
  snprintf(latest, sizeof latest, "%s/step-4.ckpt", dir);
  assert_string_equal(path, latest);
  assert_int_equal(run_llm(&k, &(llm_run){.seed = 5, .resume = path, .stop_after = -1, .total = STEPS, .final = fin}, &r2),
                   VL_OK);
  assert_losses_equal(&ref, &r2);
  assert_true(tu_same_file(ref_final, fin));
  vl_loop_result_free(&r);
  vl_loop_result_free(&r2);
  /* without a save folder an interrupt saves nothing and says only that */
  s = run_llm(&k, &(llm_run){.seed = 1, .stop_after = 1, .total = STEPS}, &r);
  assert_int_equal(s, VL_ERR_INTERRUPTED);
  assert_string_equal(last_err, "interrupted");
  assert_int_equal(r.saves, 0);
  vl_loop_result_free(&r);
  vl_loop_result_free(&ref);
  /* vl_ckpt_resolve's refusals name what is wrong */
  char empty[320], bad[400];
  path_in(empty, sizeof empty, "no-latest");
  assert_int_equal(mkdir(empty, 0755), 0);
  assert_int_equal(vl_ckpt_resolve(empty, path, sizeof path, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "holds no checkpoint"));
  snprintf(bad, sizeof bad, "%s/latest", empty);
  tu_write_text(bad, "../int/step-4.ckpt\n");
  assert_int_equal(vl_ckpt_resolve(empty, path, sizeof path, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "does not name a checkpoint file of the folder"));
  assert_int_equal(vl_ckpt_resolve("/nonexistent/ckpt", path, sizeof path, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "/nonexistent/ckpt"));
}

/* ---- (3) damaged and mismatched checkpoints ------------------------------------------- */
typedef struct {
  size_t start, payload, payload_len, crc_at, end;
  char name[256];
} sec_t;

/* The sections of a checkpoint's bytes (the format of vramlab/ckpt.h), independently of
 * the reader. */
static int walk(const uint8_t *d, size_t n, sec_t *out, int max) {
  size_t pos = 12;
  int k = 0;
  while (pos < n && k < max) {
    uint32_t nl;
    uint64_t pl;
    memcpy(&nl, d + pos, 4);
    sec_t *s = &out[k++];
    s->start = pos;
    memcpy(s->name, d + pos + 4, nl);
    s->name[nl] = 0;
    memcpy(&pl, d + pos + 4 + nl, 8);
    s->payload = pos + 4 + nl + 8;
    s->payload_len = (size_t)pl;
    s->crc_at = s->payload + s->payload_len;
    s->end = s->crc_at + 4;
    pos = s->end;
  }
  assert_int_equal(pos, n);
  return k;
}

static vl_model *make_llm(vl_ctx **c, const vl_mistral_model_cfg *k, uint64_t seed) {
  assert_int_equal(vl_ctx_create(c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
  vl_model *m;
  assert_int_equal(vl_model_create(*c, &vl_model_mistral, k, seed, &m), VL_OK);
  return m;
}

/* The whole training state of m as checkpoint bytes (to see that a refused load changed
 * nothing). */
static size_t snapshot(vl_model *m, const char *name, uint8_t **out) {
  char p[320];
  path_in(p, sizeof p, name);
  assert_int_equal(vl_ckpt_save(m, p, &(vl_ckpt_meta){0}), VL_OK);
  return tu_slurp(p, out);
}

/* Loading bytes d (written to a file) into m for a run of `settings` (NULL: none compared)
 * fails with status st, a message naming the file and holding `want`, and m unchanged. */
static void expect_refused_for(vl_model *m, const uint8_t *d, size_t n, const char *settings, vl_status st,
                               const char *want) {
  char p[320];
  path_in(p, sizeof p, "bad.ckpt");
  tu_write_bytes(p, d, n);
  uint8_t *before, *after;
  size_t nb = snapshot(m, "before.snap", &before);
  vl_ckpt_meta meta;
  vl_status s = vl_ckpt_load(m, p, "test", settings, &meta);
  if (s != st || !strstr(m->c->err, p) || !strstr(m->c->err, want))
    fail_msg("status %s, message \"%s\": wanted %s and \"%s\"", vl_status_name(s), m->c->err, vl_status_name(st), want);
  assert_null(meta.losses);
  size_t na = snapshot(m, "after.snap", &after);
  assert_int_equal(na, nb);
  assert_memory_equal(before, after, nb);
  free(before);
  free(after);
}
static void expect_refused(vl_model *m, const uint8_t *d, size_t n, vl_status st, const char *want) {
  expect_refused_for(m, d, n, NULL, st, want);
}

static void test_damaged_and_mismatched(void **state) {
  (void)state;
  vl_mistral_model_cfg k = llm_cfg(0);
  char dir[320], file[400];
  path_in(dir, sizeof dir, "dmg");
  vl_loop_result r;
  assert_int_equal(run_llm(&k, &(llm_run){.seed = 1, .save_dir = dir, .save_every = 2, .stop_after = -1, .total = 2}, &r),
                   VL_OK);
  vl_loop_result_free(&r);
  snprintf(file, sizeof file, "%s/step-2.ckpt", dir);
  uint8_t *good;
  size_t n = tu_slurp(file, &good);
  sec_t secs[128];
  int ns = walk(good, n, secs, 128);
  vl_train_state ts;
  vl_ctx *c;
  vl_model *m = make_llm(&c, &k, 42); /* other weights than the file's: a partial load would show */
  assert_int_equal(vl_model_train_state(m, &ts), VL_OK);
  assert_int_equal(ns, 7 + ts.n + ts.n_buffers);
  assert_string_equal(secs[0].name, "header");
  assert_string_equal(secs[ns - 1].name, "end");
  uint8_t *bad = malloc(n + 1);
  assert_non_null(bad);
  char want[400];
  /* a flipped byte in each section's payload (its middle) and in its checksum */
  for (int i = 0; i < ns; i++) {
    if (!secs[i].payload_len) continue; /* an empty case blob */
    memcpy(bad, good, n);
    bad[secs[i].payload + secs[i].payload_len / 2] ^= 0x10;
    snprintf(want, sizeof want, "bad checksum in section '%s'", secs[i].name);
    expect_refused(m, bad, n, VL_ERR_IO, want);
    memcpy(bad, good, n);
    bad[secs[i].crc_at] ^= 0x01;
    expect_refused(m, bad, n, VL_ERR_IO, want);
  }
  /* truncated: inside the magic, the version, every section's framing, payload and end */
  size_t cuts[8 + 3 * 128];
  int nc = 0;
  cuts[nc++] = 0;
  cuts[nc++] = 5;
  cuts[nc++] = 10;
  for (int i = 0; i < ns; i++) {
    cuts[nc++] = secs[i].start;
    cuts[nc++] = secs[i].start + 6;
    cuts[nc++] = secs[i].crc_at + 2;
  }
  cuts[nc++] = n - 1;
  for (int i = 0; i < nc; i++) {
    snprintf(want, sizeof want, "truncated at byte %zu", cuts[i]);
    expect_refused(m, good, cuts[i], VL_ERR_IO, want);
  }
  /* not a checkpoint; another format version; bytes after the end */
  memcpy(bad, good, n);
  bad[2] = 'X';
  expect_refused(m, bad, n, VL_ERR_IO, "not a vramlab checkpoint (bad magic");
  memcpy(bad, good, n);
  bad[8] = 9;
  expect_refused(m, bad, n, VL_ERR_IO, "format version 9, this build reads version 2");
  memcpy(bad, good, n);
  bad[n] = 0;
  expect_refused(m, bad, n + 1, VL_ERR_IO, "1 stray bytes after section 'end'");
  /* another run's tag */
  char p[320];
  path_in(p, sizeof p, "tag.ckpt");
  tu_write_bytes(p, good, n);
  vl_ckpt_meta meta;
  assert_int_equal(vl_ckpt_load(m, p, "other", NULL, &meta), VL_ERR_INVALID);
  assert_non_null(strstr(c->err, "field 'tag' is 'test', this run's 'other'"));
  /* the good file loads (so the refusals above were about the damage) and says what it holds */
  assert_int_equal(vl_ckpt_load(m, p, "test", NULL, &meta), VL_OK);
  assert_int_equal(meta.step, 2);
  assert_int_equal(meta.n_losses, 2);
  assert_string_equal(meta.model, "mistral");
  assert_int_equal(meta.blob_len, sizeof(vl_rng));
  vl_ckpt_meta_free(&meta);
  vl_model_destroy(m);
  vl_ctx_destroy(c);

  /* mismatched models: each refused with the field, the model unchanged */
  static const struct {
    int what;
    const char *want;
  } mism[] = {
      {0, "parameter 'l0.q.lora_A' has shape (8, 64), the model (4, 64)"},
      {1, "field 'parameters' is 49, the model has 72"},
      {2, "optimizer field 'lr' is 0.00100000005, the model's 0.00200000009"},
      {3, "parameter 'l0.q' tensor 'w' is fp16, the model's nf4"},
      {4, "scaler field 'fp16' is true, the model's false"},
      {5, "field 'model' is 'mistral', this run's model is 'resunet'"},
  };
  for (size_t i = 0; i < sizeof mism / sizeof *mism; i++) {
    vl_mistral_model_cfg k2 = llm_cfg(0);
    if (mism[i].what == 0) k2.tc.lora_rank = 4;
    if (mism[i].what == 1) k2.mc.n_layers = 3;
    if (mism[i].what == 2) k2.tc.optim.hp.lr = 2e-3f;
    if (mism[i].what == 3) k2.tc.frozen = VL_NF4;
    if (mism[i].what == 4) k2.tc.compute = VL_BF16;
    if (mism[i].what == 5) {
      vl_resunet_model_cfg u;
      assert_int_equal(vl_resunet_preset("tiny", &u.mc), 0);
      vl_resunet_train_cfg_default(&u.tc);
      assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
      assert_int_equal(vl_model_create(c, &vl_model_resunet, &u, 1, &m), VL_OK);
    } else {
      m = make_llm(&c, &k2, 3);
    }
    expect_refused(m, good, n, VL_ERR_INVALID, mism[i].want);
    vl_model_destroy(m);
    vl_ctx_destroy(c);
  }
  free(bad);
  free(good);
}

/* ---- (6) hostile checkpoints (#22): other settings, sizes, non-finite state ------------ */
/* A checkpoint of a fresh variant-0 model: its bytes (malloc'd) and size; settings recorded. */
static size_t fresh_ckpt(const char *name, const char *settings, uint8_t **out) {
  vl_mistral_model_cfg k = llm_cfg(0);
  vl_ctx *c;
  vl_model *m = make_llm(&c, &k, 1);
  double losses[2] = {2.5, 2.25};
  vl_ckpt_meta meta = {.tag = "test", .step = 2, .n_losses = 2, .losses = losses, .settings = settings};
  char p[320];
  path_in(p, sizeof p, name);
  assert_int_equal(vl_ckpt_save(m, p, &meta), VL_OK);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  return tu_slurp(p, out);
}

/* The section of d named `name` (asserted present). */
static sec_t find_sec(const uint8_t *d, size_t n, const char *name) {
  sec_t secs[128];
  int ns = walk(d, n, secs, 128);
  for (int i = 0; i < ns; i++)
    if (!strcmp(secs[i].name, name)) return secs[i];
  fail_msg("no section '%s'", name);
  return secs[0];
}
/* Recompute a section's CRC after its payload was changed (what a crafted file does). */
static void fix_crc(uint8_t *d, const sec_t *s) {
  uint32_t crc = vl_crc32(0, d + s->start, s->crc_at - s->start);
  memcpy(d + s->crc_at, &crc, 4);
}

/* 5: every setting that shapes the trajectory is in the checkpoint and compared by name. */
static void test_settings_compared(void **state) {
  (void)state;
  uint8_t *d;
  size_t n = fresh_ckpt("settings.ckpt", "lora_alpha=32\nseed=1\n", &d);
  vl_mistral_model_cfg k = llm_cfg(0);
  vl_ctx *c;
  vl_model *m = make_llm(&c, &k, 42);
  char p[320];
  path_in(p, sizeof p, "bad.ckpt");
  expect_refused_for(m, d, n, "lora_alpha=16\nseed=1\n", VL_ERR_INVALID, " was made with lora_alpha=32, this run has lora_alpha=16");
  expect_refused_for(m, d, n, "lora_alpha=32\nseed=7\n", VL_ERR_INVALID, "was made with seed=1, this run has seed=7");
  expect_refused_for(m, d, n, "seed=1\n", VL_ERR_INVALID, "was made with lora_alpha=32, this run has no setting 'lora_alpha'");
  expect_refused_for(m, d, n, "lora_alpha=32\nseed=1\nrope_theta=10000\n", VL_ERR_INVALID,
                     "was made with no setting 'rope_theta', this run has rope_theta=10000");
  /* the same settings in another order load; so does a load that compares none */
  vl_ckpt_meta meta;
  assert_int_equal(vl_ckpt_load(m, p, "test", "seed=1\nlora_alpha=32\n", &meta), VL_OK);
  vl_ckpt_meta_free(&meta);
  assert_int_equal(vl_ckpt_load(m, p, "test", NULL, &meta), VL_OK);
  vl_ckpt_meta_free(&meta);
  /* a version-1 checkpoint records no settings: refused by name, not as a damaged file */
  d[8] = 1;
  expect_refused(m, d, n, VL_ERR_INVALID, "format version 1 records no settings");
  /* the builder: float values in their shortest exact form, bad names and overflow refused */
  char buf[64] = "";
  assert_int_equal(vl_ckpt_setting_f32(buf, sizeof buf, "rms_norm_eps", 1e-5f), 0);
  assert_int_equal(vl_ckpt_setting(buf, sizeof buf, "seed", "%d", 7), 0);
  assert_string_equal(buf, "rms_norm_eps=1e-05\nseed=7\n");
  assert_int_equal(vl_ckpt_setting(buf, sizeof buf, "a=b", "%d", 1), -1);
  assert_int_equal(vl_ckpt_setting(buf, sizeof buf, "x", "two\nlines"), -1);
  assert_int_equal(vl_ckpt_setting(buf, sizeof buf, "long", "%040d", 1), -1);
  assert_string_equal(buf, "rms_norm_eps=1e-05\nseed=7\n");
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  free(d);
}

/* 7: a file larger than the model's sections can hold is refused before it is read: a
 * 64 GiB sparse file with a valid header is a bad checkpoint, not an out-of-memory result.
 * The load runs in a child whose address space is capped near its present size, so a
 * reader that allocates the file fails there (VL_ERR_OOM) instead of swapping the machine. */
static void test_huge_file_refused_unread(void **state) {
  (void)state;
  char p[320];
  path_in(p, sizeof p, "huge.ckpt");
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_true(fd >= 0);
  uint32_t ver = VL_CKPT_VERSION;
  assert_int_equal(write(fd, VL_CKPT_MAGIC, 8), 8);
  assert_int_equal(write(fd, &ver, 4), 4);
  if (ftruncate(fd, (off_t)64 << 30) != 0) {
    close(fd);
    skip(); /* a file system without sparse files */
  }
  close(fd);
  vl_mistral_model_cfg k = llm_cfg(0);
  vl_ctx *c;
  vl_model *m = make_llm(&c, &k, 1);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld", &pages) != 1) pages = 0;
    if (f) fclose(f);
    struct rlimit rl = {(rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)256 << 20), 0};
    rl.rlim_max = rl.rlim_cur;
    if (pages > 0) setrlimit(RLIMIT_AS, &rl);
    vl_ckpt_meta meta;
    vl_status s = vl_ckpt_load(m, p, "test", NULL, &meta);
    bool ok = s == VL_ERR_IO && strstr(c->err, p) && strstr(c->err, "exceeds the most a checkpoint of this model can hold");
    if (!ok) fprintf(stderr, "huge file: status %s, message \"%s\"\n", vl_status_name(s), c->err);
    _exit(ok ? 0 : 1);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_int_equal(unlink(p), 0);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
}

/* 10: crafted checkpoints with recomputed checksums: a non-finite loss scale, loss, weight,
 * master or optimizer state is refused naming the section and field. */
static void poison(uint8_t *d, vl_dtype dt, bool nan) {
  if (dt == VL_F32) {
    uint32_t v = nan ? 0x7fc00000u : 0x7f800000u;
    memcpy(d, &v, 4);
  } else {
    uint16_t v = dt == VL_F16 ? (nan ? 0x7e00u : 0x7c00u) : (nan ? 0x7fc0u : 0x7f80u);
    memcpy(d, &v, 2);
  }
}

/* Poison the element `elem` of tensor slot `which` (0: the first present) of parameter
 * section sec in a copy of good, checksum fixed; the tensor's dtype into *dt. */
static uint8_t *poisoned_param(const uint8_t *good, size_t n, const char *sec, int which, int64_t elem, bool nan,
                               vl_dtype *dt) {
  uint8_t *d = malloc(n);
  assert_non_null(d);
  memcpy(d, good, n);
  sec_t s = find_sec(d, n, sec);
  uint32_t nl;
  memcpy(&nl, d + s.payload, 4);
  size_t pos = s.payload + 4 + nl + 8 + 8 + 2; /* name, rows, cols, trainable, present */
  for (int t = 0;; t++) {
    int nd = d[pos + 1];
    uint64_t bytes;
    memcpy(&bytes, d + pos + 2 + 8 * (size_t)nd, 8);
    size_t data = pos + 2 + 8 * (size_t)nd + 8;
    if (t == which) {
      *dt = (vl_dtype)d[pos];
      size_t w = *dt == VL_F32 ? 4 : 2;
      assert_true((elem + 1) * (int64_t)w <= (int64_t)bytes);
      poison(d + data + (size_t)elem * w, *dt, nan);
      break;
    }
    pos = data + bytes;
    assert_true(pos < s.crc_at);
  }
  fix_crc(d, &s);
  return d;
}

static void test_non_finite_refused(void **state) {
  (void)state;
  uint8_t *good, *d;
  size_t n = fresh_ckpt("finite.ckpt", NULL, &good);
  vl_mistral_model_cfg k = llm_cfg(0);
  vl_ctx *c;
  vl_model *m = make_llm(&c, &k, 42);
  d = malloc(n);
  assert_non_null(d);
  /* the loss scale: +Inf (a NaN one was refused already) */
  memcpy(d, good, n);
  sec_t s = find_sec(d, n, "scaler");
  float inf = INFINITY;
  memcpy(d + s.payload + 1, &inf, 4);
  fix_crc(d, &s);
  expect_refused(m, d, n, VL_ERR_IO, "scaler fields out of range (scale inf");
  /* a NaN loss */
  memcpy(d, good, n);
  s = find_sec(d, n, "losses");
  double nan = NAN;
  memcpy(d + s.payload + 16 + 8, &nan, 8);
  fix_crc(d, &s);
  expect_refused(m, d, n, VL_ERR_NUMERIC, "section 'losses': the loss of step 2 is nan");
  free(d);
  /* a frozen fp16 weight, and each tensor of a LoRA factor: its weight, fp32 master and both
   * AdamW moments (fp16 and fp32 values; Inf and NaN) */
  static const struct {
    const char *sec;
    int which;
    int64_t elem;
    bool nan;
    const char *want;
  } cases[] = {
      {"param:l0.q", 0, 3, false, "parameter 'l0.q' tensor 'w' holds inf (element 3)"},
      {"param:l0.q.lora_A", 0, 0, true, "parameter 'l0.q.lora_A' tensor 'w' holds nan (element 0)"},
      {"param:l0.q.lora_A", 1, 5, true, "parameter 'l0.q.lora_A' tensor 'master' holds nan (element 5)"},
      {"param:l0.q.lora_A", 2, 7, false, "parameter 'l0.q.lora_A' tensor 'state[0]' holds inf (element 7)"},
      {"param:l0.q.lora_A", 3, 1, true, "parameter 'l0.q.lora_A' tensor 'state[1]' holds nan (element 1)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    vl_dtype dt;
    d = poisoned_param(good, n, cases[i].sec, cases[i].which, cases[i].elem, cases[i].nan, &dt);
    expect_refused(m, d, n, VL_ERR_NUMERIC, cases[i].want);
    free(d);
  }
  /* bf16 values are checked too (the dtype's own exponent) */
  vl_mistral_model_cfg kb = llm_cfg(0);
  kb.tc.compute = VL_BF16;
  kb.tc.frozen = VL_BF16;
  vl_ctx *cb;
  vl_model *mb = make_llm(&cb, &kb, 1);
  char p[320];
  path_in(p, sizeof p, "bf16.ckpt");
  assert_int_equal(vl_ckpt_save(mb, p, &(vl_ckpt_meta){.tag = "test"}), VL_OK);
  uint8_t *gb;
  size_t nbf = tu_slurp(p, &gb);
  vl_dtype dt;
  d = poisoned_param(gb, nbf, "param:l0.q", 0, 2, true, &dt);
  assert_int_equal(dt, VL_BF16);
  expect_refused(mb, d, nbf, VL_ERR_NUMERIC, "parameter 'l0.q' tensor 'w' holds nan (element 2)");
  free(d);
  free(gb);
  vl_model_destroy(mb);
  vl_ctx_destroy(cb);
  /* the untouched file loads */
  path_in(p, sizeof p, "finite.ckpt");
  vl_ckpt_meta meta;
  assert_int_equal(vl_ckpt_load(m, p, "test", NULL, &meta), VL_OK);
  vl_ckpt_meta_free(&meta);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
  free(good);
}

/* 9: a save removes the temporary files of killed saves (only ours, only of dead
 * processes) and keeps the newest keep_last checkpoints up to its own step. */
static bool exists_in(const char *dir, const char *name) {
  char p[1500];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

static void test_stale_temps_and_keep_last(void **state) {
  (void)state;
  char dir[320], p[700], dead_tmp[64], live_tmp[64], other_tmp[64];
  path_in(dir, sizeof dir, "keep");
  assert_int_equal(mkdir(dir, 0755), 0);
  pid_t dead = fork(); /* a pid that was a process and is no more */
  assert_true(dead >= 0);
  if (dead == 0) _exit(0);
  assert_int_equal(waitpid(dead, NULL, 0), dead);
  snprintf(dead_tmp, sizeof dead_tmp, ".step-3.ckpt.tmp.%ld", (long)dead);
  snprintf(live_tmp, sizeof live_tmp, ".step-4.ckpt.tmp.%ld", (long)getppid());
  snprintf(other_tmp, sizeof other_tmp, ".notes.txt.tmp.%ld", (long)dead);
  const char *planted[] = {dead_tmp, live_tmp, other_tmp, "step-9.ckpt", "step-x.ckpt", "step-01.ckpt"};
  for (size_t i = 0; i < sizeof planted / sizeof *planted; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, planted[i]);
    tu_write_text(p, "left by someone\n");
  }
  vl_mistral_model_cfg k = llm_cfg(0);
  vl_ctx *c;
  vl_model *m = make_llm(&c, &k, 1);
  char path[700];
  for (long step = 1; step <= 5; step++) {
    vl_ckpt_meta meta = {.tag = "test", .step = step};
    assert_int_equal(vl_ckpt_save_dir(m, dir, &meta, 3, path, sizeof path), VL_OK);
    if (step == 1) {
      assert_false(exists_in(dir, dead_tmp)); /* a killed save's leftover: gone */
      assert_true(exists_in(dir, live_tmp));  /* a live process's: kept */
      assert_true(exists_in(dir, other_tmp)); /* not a checkpoint's name: kept */
    }
  }
  assert_false(exists_in(dir, "step-1.ckpt"));
  assert_false(exists_in(dir, "step-2.ckpt"));
  for (int i = 3; i <= 5; i++) {
    snprintf(p, sizeof p, "step-%d.ckpt", i);
    assert_true(exists_in(dir, p));
  }
  /* not this run's: a later step of an earlier run, names that are not ours */
  assert_true(exists_in(dir, "step-9.ckpt"));
  assert_true(exists_in(dir, "step-x.ckpt"));
  assert_true(exists_in(dir, "step-01.ckpt"));
  /* 0 keeps every one */
  for (long step = 6; step <= 7; step++) {
    vl_ckpt_meta meta = {.tag = "test", .step = step};
    assert_int_equal(vl_ckpt_save_dir(m, dir, &meta, 0, path, sizeof path), VL_OK);
  }
  for (int i = 3; i <= 7; i++) {
    snprintf(p, sizeof p, "step-%d.ckpt", i);
    assert_true(exists_in(dir, p));
  }
  vl_err err;
  snprintf(p, sizeof p, "%s/latest", dir);
  char *text;
  (void)vl_file_read_text(p, 100, NULL, &text, NULL, &err);
  assert_non_null(text);
  assert_string_equal(text, "step-7.ckpt\n");
  free(text);
  vl_model_destroy(m);
  vl_ctx_destroy(c);
}

/* ---- (2) the U-Net through the seg-ckpt case: loader position, held-out scores, BN stats */
static vl_knobs seg_setting, seg_knobs;

static cJSON *seg_run_case(const char *ckpt_dir, const char *resume) {
  const vl_case *c = vl_case_find("seg-ckpt");
  assert_non_null(c);
  assert_true(c->resumable);
  vl_case_env env = {.scale = "tiny", .device = VL_DEV_CPU, .setting = &seg_setting, .quiet = 1, .save_every = 2,
                     .ckpt_dir = ckpt_dir, .resume = resume};
  cJSON *o = cJSON_CreateObject();
  vl_status s = c->run(&env, &seg_knobs, 0, o);
  if (s != VL_OK) fail_msg("seg-ckpt run: %s", env.err.msg);
  return o;
}

static void assert_same_doubles(const cJSON *a, const cJSON *b, const char *key) {
  const cJSON *x = cJSON_GetObjectItem(a, key), *y = cJSON_GetObjectItem(b, key);
  assert_true(cJSON_IsArray(x) && cJSON_IsArray(y));
  assert_int_equal(cJSON_GetArraySize(x), cJSON_GetArraySize(y));
  for (int i = 0; i < cJSON_GetArraySize(x); i++) {
    double u = cJSON_GetArrayItem(x, i)->valuedouble, v = cJSON_GetArrayItem(y, i)->valuedouble;
    if (memcmp(&u, &v, sizeof u)) fail_msg("%s[%d]: %.17g vs %.17g", key, i, u, v);
  }
}

static void test_seg_resume_through_case(void **state) {
  (void)state;
  char data[320], ref[320], dir[320], from[400], a[420], b[420];
  path_in(data, sizeof data, "segdata");
  path_in(ref, sizeof ref, "seg-ref");
  assert_int_equal(vl_knob_set(&seg_setting, "data_dir", data), 0);
  assert_int_equal(vl_knob_set(&seg_setting, "train_images", "16"), 0);
  assert_int_equal(vl_knob_set(&seg_setting, "eval_images", "8"), 0);
  assert_int_equal(vl_knob_set(&seg_setting, "epochs", "2"), 0);
  assert_int_equal(vl_knob_set(&seg_knobs, "batch", "2"), 0);
  assert_int_equal(vl_knob_set(&seg_knobs, "accum", "2"), 0);
  assert_int_equal(vl_knob_set(&seg_knobs, "compute", "fp16"), 0);
  assert_int_equal(vl_knob_set(&seg_knobs, "workers", "1"), 0);
  assert_int_equal(vl_knob_set(&seg_knobs, "lr", "3e-3"), 0);
  /* 16 images / (2 x 2) = 4 steps an epoch, 8 in all; checkpoints at 2, 4, 6, 8 */
  cJSON *r0 = seg_run_case(ref, NULL);
  assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(r0, "optimizer_steps")), 8);
  assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(r0, "checkpoints_saved")), 4);
  snprintf(a, sizeof a, "%s/step-8.ckpt", ref);
  /* the U-Net hands out its batch-norm running statistics: they are in the file */
  {
    vl_ctx *c;
    vl_model *m;
    vl_resunet_model_cfg u;
    assert_int_equal(vl_resunet_preset("tiny", &u.mc), 0);
    vl_resunet_train_cfg_default(&u.tc);
    assert_int_equal(vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP), VL_OK);
    assert_int_equal(vl_model_create(c, &vl_model_resunet, &u, 1, &m), VL_OK);
    vl_train_state ts;
    assert_int_equal(vl_model_train_state(m, &ts), VL_OK);
    print_message("  U-Net: %d parameters, %d buffers\n", ts.n, ts.n_buffers);
    assert_true(ts.n_buffers > 0);
    vl_model_destroy(m);
    vl_ctx_destroy(c);
  }
  /* mid-epoch 0, at the epoch edge (before its evaluation), mid-epoch 1 */
  for (int at = 2; at <= 6; at += 2) {
    snprintf(dir, sizeof dir, "%s/seg-from%d", tu_tmp, at);
    snprintf(from, sizeof from, "%s/step-%d.ckpt", ref, at);
    cJSON *r1 = seg_run_case(dir, from);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(r1, "resumed_from_step")), at);
    assert_same_doubles(r0, r1, "loss");
    assert_same_doubles(r0, r1, "pixel_accuracy_per_epoch");
    assert_same_doubles(r0, r1, "miou_per_epoch");
    snprintf(b, sizeof b, "%s/step-8.ckpt", dir);
    assert_true(tu_same_file(a, b)); /* parameters, masters, Adam state, scaler, BN statistics */
    cJSON_Delete(r1);
  }
  print_message("  seg-ckpt: 8 steps, losses and held-out scores bit-identical after resuming at 2, 4, 6\n");
  /* a resume with a setting that changes the data stream is refused, naming it */
  assert_int_equal(vl_knob_set(&seg_knobs, "batch", "4"), 0);
  assert_int_equal(vl_knob_set(&seg_knobs, "accum", "1"), 0);
  const vl_case *c = vl_case_find("seg-ckpt");
  vl_case_env env = {.scale = "tiny", .device = VL_DEV_CPU, .setting = &seg_setting, .quiet = 1, .resume = from};
  cJSON *o = cJSON_CreateObject();
  assert_int_not_equal(c->run(&env, &seg_knobs, 0, o), VL_OK);
  if (!strstr(env.err.msg, "was made with batch=2, this run has batch=4")) fail_msg("message: %s", env.err.msg);
  cJSON_Delete(o);
  cJSON_Delete(r0);
}

/* ---- (5) the CLI: --save-every, --resume, and the options' refusals --------------------- */
static int cli(const char *args, char *out, size_t on) {
  char cmd[2048], log[320];
  path_in(log, sizeof log, "cli.log");
  snprintf(cmd, sizeof cmd, "cd '%s' && %s/vramlab %s >'%s' 2>&1", tu_tmp, VRAMLAB_BINARY_DIR, args, log);
  int st = system(cmd);
  vl_err err;
  char *t;
  (void)vl_file_read_text(log, 1 << 20, NULL, &t, NULL, &err);
  snprintf(out, on, "%s", t ? t : "");
  free(t);
  return WEXITSTATUS(st);
}

static cJSON *results(const char *out_dir) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s/llm-lora/latest.json", tu_tmp, out_dir);
  uint8_t *text;
  size_t n = tu_slurp(p, &text);
  cJSON *r = cJSON_ParseWithLength((const char *)text, n);
  free(text);
  assert_non_null(r);
  return r;
}
/* The first rung's first run of a results file (asserted present). */
static cJSON *run0(cJSON *res) {
  cJSON *r = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(res, "rungs"), 0), "runs"), 0);
  assert_non_null(r);
  return r;
}

static void test_cli_save_and_resume(void **state) {
  (void)state;
  char out[8192], a[420], b[420];
  const char *base = "run llm-lora --device cpu --scale tiny --step lora --set steps=6 --set reps=1 --quiet";
  char args[1024];
  snprintf(args, sizeof args, "%s --save-every 3 --out cli-a", base);
  assert_int_equal(cli(args, out, sizeof out), 0);
  snprintf(args, sizeof args, "%s --save-every 3 --resume cli-a/llm-lora/ckpt/lora-rep0/step-3.ckpt --out cli-b", base);
  if (cli(args, out, sizeof out) != 0) fail_msg("resume: %s", out);
  cJSON *ra = results("cli-a"), *rb = results("cli-b");
  assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(run0(rb), "resumed_from_step")), 3);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(run0(ra), "loss")), 8); /* warmup 2 + steps 6 */
  assert_same_doubles(run0(ra), run0(rb), "loss");
  snprintf(a, sizeof a, "%s/cli-a/llm-lora/ckpt/lora-rep0/step-6.ckpt", tu_tmp);
  snprintf(b, sizeof b, "%s/cli-b/llm-lora/ckpt/lora-rep0/step-6.ckpt", tu_tmp);
  assert_true(tu_same_file(a, b));
  cJSON_Delete(ra);
  cJSON_Delete(rb);
  /* the folder form reads its latest (step 6): two steps left, one of them warm-up */
  snprintf(args, sizeof args, "%s --resume cli-a/llm-lora/ckpt/lora-rep0 --out cli-c", base);
  if (cli(args, out, sizeof out) != 0) fail_msg("resume from a folder: %s", out);
  cJSON *rc = results("cli-c");
  assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(run0(rc), "resumed_from_step")), 6);
  cJSON_Delete(rc);
  /* refusals */
  static const struct {
    const char *args, *want;
    int rc;
  } bad[] = {
      {"run dataloader --scale tiny --save-every 2", "--save-every: dataloader has no checkpoints (cases that do:", 2},
      {"run llm-lora --scale tiny --resume cli-a/llm-lora/ckpt/lora-rep0", "--resume continues one rung's run: give --step RUNG", 2},
      {"plan llm-lora --save-every 2", "--save-every applies to run and bench only", 2},
      {"run llm-lora --scale tiny --step lora --save-every 0", "--save-every '0' ", 2},
      {"run llm-lora --scale tiny --step lora --resume nowhere", "--resume: nowhere: No such file or directory", 2},
      {"run llm-lora --scale tiny --step lora --device plan --save-every 2", "the plan device trains nothing", 2},
      {"run llm-lora --device cpu --scale tiny --step lora --set steps=6 --set lr=5e-3 --quiet --out cli-d "
       "--resume cli-a/llm-lora/ckpt/lora-rep0/step-3.ckpt", "step-3.ckpt was made with lr=0.001, this run has lr=0.005", 1},
      /* #22: every setting that shapes the trajectory, named (a model config that differs
       * from the preset in one number only) */
      {"run llm-lora --device cpu --scale tiny --step lora --set steps=6 --set lora_alpha=32 --quiet --out cli-d "
       "--resume cli-a/llm-lora/ckpt/lora-rep0", "was made with lora_alpha=16, this run has lora_alpha=32", 1},
      {"run llm-lora --device cpu --scale tiny --step lora --set steps=6 --set seed=7 --quiet --out cli-d "
       "--resume cli-a/llm-lora/ckpt/lora-rep0", "was made with seed=1, this run has seed=7", 1},
      {"run llm-lora --device cpu --scale tiny --step lora --set steps=6 --model-config cfg-theta.json --quiet "
       "--out cli-d --resume cli-a/llm-lora/ckpt/lora-rep0", "was made with rope_theta=10000, this run has "
       "rope_theta=500000", 1},
      {"run llm-lora --device cpu --scale tiny --step lora --set steps=6 --model-config cfg-eps.json --quiet "
       "--out cli-d --resume cli-a/llm-lora/ckpt/lora-rep0", "was made with rms_norm_eps=1e-05, this run has "
       "rms_norm_eps=1e-06", 1},
      {"plan llm-lora --keep-last 2", "--keep-last applies to run and bench only", 2},
      {"run llm-lora --scale tiny --step lora --save-every 2 --keep-last -1", "--keep-last '-1' ", 2},
  };
  /* the tiny preset as a config.json, with one number changed */
  static const char cfg[] = "{\"model_type\": \"mistral\", \"hidden_size\": 64, \"intermediate_size\": 128, "
                            "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                            "\"vocab_size\": 256, \"max_position_embeddings\": 4096, \"rope_theta\": %s, "
                            "\"rms_norm_eps\": %s}";
  char text[512], p[400];
  snprintf(text, sizeof text, cfg, "500000", "1e-5");
  path_in(p, sizeof p, "cfg-theta.json");
  tu_write_text(p, text);
  snprintf(text, sizeof text, cfg, "10000", "1e-6");
  path_in(p, sizeof p, "cfg-eps.json");
  tu_write_text(p, text);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int st = cli(bad[i].args, out, sizeof out);
    if (st != bad[i].rc || !strstr(out, bad[i].want))
      fail_msg("vramlab %s: status %d, output:\n%s\nwanted %d and \"%s\"", bad[i].args, st, out, bad[i].rc, bad[i].want);
  }
  /* #22: a refused resume leaves the results before it as they were (latest.json too) */
  uint8_t *before, *after;
  snprintf(p, sizeof p, "%s/cli-a/llm-lora/latest.json", tu_tmp);
  size_t nb = tu_slurp(p, &before);
  snprintf(args, sizeof args, "%s --set lora_alpha=8 --out cli-a --resume cli-a/llm-lora/ckpt/lora-rep0", base);
  assert_int_equal(cli(args, out, sizeof out), 1);
  if (!strstr(out, "latest.json left as it was")) fail_msg("refused resume: %s", out);
  size_t na = tu_slurp(p, &after);
  assert_int_equal(na, nb);
  assert_memory_equal(before, after, nb);
  free(before);
  free(after);
}

/* Ctrl-C during a run with --save-every: exit 130, a checkpoint at the step edge named by
 * the folder's latest and by the results, and --resume continues from it. */
static void test_cli_sigint_saves(void **state) {
  (void)state;
  char cmd[1024], p[400], out[8192];
  vl_err err;
  snprintf(cmd, sizeof cmd,
           "cd '%s' && (%s/vramlab run llm-lora --device cpu --scale tiny --step lora --set steps=100000 "
           "--set reps=1 --save-every 100000 --out cli-int >int.log 2>&1 & pid=$!; "
           /* Ctrl-C once steps are running (a progress line every 5 steps), not after a fixed
            * sleep: on a loaded machine the start-up alone can take seconds */
           "for i in $(seq 1200); do grep -q '  step ' int.log && break; sleep 0.1; done; "
           "kill -INT $pid; wait $pid; echo $? > int.rc)",
           tu_tmp, VRAMLAB_BINARY_DIR);
  assert_int_equal(system(cmd), 0);
  snprintf(p, sizeof p, "%s/int.rc", tu_tmp);
  char *rc;
  (void)vl_file_read_text(p, 100, NULL, &rc, NULL, &err);
  assert_non_null(rc);
  assert_int_equal(atoi(rc), 130);
  free(rc);
  cJSON *res = results("cli-int");
  cJSON *r = run0(res);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(res, "interrupted")));
  const char *ck = cJSON_GetStringValue(cJSON_GetObjectItem(r, "checkpoint"));
  assert_non_null(ck);
  long at = (long)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "checkpoint_step"));
  assert_true(at >= 1);
  snprintf(p, sizeof p, "%s/cli-int/llm-lora/ckpt/lora-rep0/latest", tu_tmp);
  char *latest;
  (void)vl_file_read_text(p, 100, NULL, &latest, NULL, &err);
  assert_non_null(latest);
  char want[64];
  snprintf(want, sizeof want, "step-%ld.ckpt\n", at);
  assert_string_equal(latest, want);
  free(latest);
  cJSON_Delete(res);
  /* continue for two more steps (warmup 2: total = 2 + steps) */
  char args[512];
  snprintf(args, sizeof args,
           "run llm-lora --device cpu --scale tiny --step lora --set steps=%ld --set reps=1 --quiet --out cli-int2 "
           "--resume cli-int/llm-lora/ckpt/lora-rep0", at);
  if (cli(args, out, sizeof out) != 0) fail_msg("resume after Ctrl-C: %s", out);
  res = results("cli-int2");
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(run0(res), "loss")), at + 2);
  cJSON_Delete(res);
}

static int setup(void **state) {
  (void)state;
  return tu_tmpdir(tu_tmp, sizeof tu_tmp, "vramlab-ckpt-");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_llm_resume_lora),
      cmocka_unit_test(test_llm_resume_full_adafactor),
      cmocka_unit_test(test_interrupt_saves_at_step_edge),
      cmocka_unit_test(test_damaged_and_mismatched),
      cmocka_unit_test(test_settings_compared),
      cmocka_unit_test(test_huge_file_refused_unread),
      cmocka_unit_test(test_non_finite_refused),
      cmocka_unit_test(test_stale_temps_and_keep_last),
      cmocka_unit_test(test_seg_resume_through_case),
      cmocka_unit_test(test_cli_save_and_resume),
      cmocka_unit_test(test_cli_sigint_saves),
  };
  return cmocka_run_group_tests(tests, setup, tu_tmp_teardown);
}
