/* libFuzzer target: bytes -> the checkpoint reader (vl_ckpt_read_mem, what vl_ckpt_load
 * runs on a file's bytes), against a small LoRA Mistral on a CPU context made once, with
 * the restore applied when every check passes. Every section's CRC is recomputed first
 * (where its framing allows), so the fuzzer reaches the fields behind the checksums rather
 * than stopping at them; the checksum refusal itself is one comparison, tested in
 * tests/test_ckpt.c. Any bytes must give VL_OK or a refusal whose message names the file;
 * an accepted checkpoint must hold one loss per step. Seed: corpus/fuzz_ckpt/micro.ckpt, a
 * checkpoint of this very model and settings (format version 2; fuzz_ckpt writes it when
 * FUZZ_CKPT_SEED names a path). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/cache.h"
#include "vramlab/ckpt.h"
#include "vramlab/mistral.h"

static vl_ctx *ctx;
static vl_model *model;
/* the run's settings: recorded in the seed and compared with every input's */
static const char settings[] = "lora_alpha=16\nseed=1\n";

/* 1 layer of width 8, LoRA r=2 on q, k, v, o, fp16 AMP, AdamW: every kind of tensor slot
 * (frozen fp16 weights, fp32 masters, optimizer state) in a few KiB. */
static void init(void) {
  vl_mistral_model_cfg k = {.mc = {.vocab = 16, .dim = 8, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                                    .head_dim = 4, .ffn = 8, .seq = 8, .rope_theta = 10000.0f, .norm_eps = 1e-5f}};
  vl_train_cfg_default(&k.tc);
  k.tc.compute = VL_F16;
  k.tc.frozen = VL_F16;
  k.tc.lora_rank = 2;
  if (vl_ctx_create(&ctx, VL_DEV_CPU, VL_NO_CAP) != VL_OK ||
      vl_model_create(ctx, &vl_model_mistral, &k, 1, &model) != VL_OK) {
    fprintf(stderr, "fuzz_ckpt: cannot make the model: %s\n", ctx ? ctx->err : "no context");
    abort();
  }
  const char *seed = getenv("FUZZ_CKPT_SEED");
  if (seed) {
    double losses[2] = {2.5, 2.25};
    uint64_t blob[2] = {1, 2};
    vl_ckpt_meta meta = {.tag = "fuzz", .step = 2, .n_losses = 2, .losses = losses, .blob = blob,
                         .blob_len = sizeof blob, .settings = settings};
    if (vl_ckpt_save(model, seed, &meta) != VL_OK) {
      fprintf(stderr, "fuzz_ckpt: %s\n", ctx->err);
      abort();
    }
  }
}

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Rewrite each section's CRC (the framing of vramlab/ckpt.h) while the framing fits. */
static void fix_crcs(uint8_t *d, size_t n) {
  size_t pos = 12;
  while (pos + 4 <= n) {
    uint64_t nl = le(d + pos, 4);
    if (nl < 1 || nl > 255 || n - pos - 4 < nl + 8) return;
    uint64_t pl = le(d + pos + 4 + nl, 8);
    size_t head = 4 + (size_t)nl + 8;
    if (n - pos - head < 4 || pl > n - pos - head - 4) return;
    size_t body = head + (size_t)pl;
    uint32_t crc = vl_crc32(0, d + pos, body);
    for (int i = 0; i < 4; i++) d[pos + body + (size_t)i] = (uint8_t)(crc >> (8 * i));
    pos += body + 4;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  if (!model) init();
  /* the file in a buffer of its own, so ASan sees a read past its end */
  uint8_t *d = malloc(n ? n : 1);
  if (!d) return 0;
  memcpy(d, data, n);
  fix_crcs(d, n);
  vl_ckpt_meta meta;
  vl_status s = vl_ckpt_read_mem(model, d, n, "fuzz.ckpt", NULL, settings, true, &meta);
  if (s == VL_OK) {
    if (meta.n_losses != meta.step || meta.blob_len > VL_CKPT_BLOB_MAX || (meta.blob_len && !meta.blob)) abort();
    vl_ckpt_meta_free(&meta);
  } else if (!strstr(ctx->err, "fuzz.ckpt") || meta.losses || meta.blob) {
    fprintf(stderr, "fuzz_ckpt: refusal without the file's name or with output left: %s\n", ctx->err);
    abort();
  }
  free(d);
  return 0;
}
