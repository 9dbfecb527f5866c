/* The U-Net parity fixture (tests/fixtures/sd_unet_parity.bin) as a model: its config and
 * its weights. Test-only, included after sd_fixture.c by the tests that compare with it
 * (test_sd_unet.c: the U-Net alone; test_sd_model.c: the whole LoRA step). Failures end the
 * test (cmocka's fail_msg). */
#include "vramlab/sd_unet.h"

/* The fixture's UNet2DConditionModel config (block_out_channels, CrossAttnDownBlock2D +
 * DownBlock2D, UpBlock2D + CrossAttnUpBlock2D, ...) over the tiny preset, fp32. */
static void sdfx_unet_cfg(const sdfx_file *fx, vl_attn_impl attn, vl_sd_unet_cfg *g) {
  char err[1024];
  int64_t boc[2], v1[1];
  if (sdfx_read_i64(fx, "config.block_out_channels", boc, 2, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(vl_sd_unet_preset("tiny", g), 0);
  g->n_blocks = 2;
  g->ch[0] = boc[0];
  g->ch[1] = boc[1];
  g->down_attn[0] = true, g->down_attn[1] = false; /* CrossAttnDownBlock2D, DownBlock2D */
  g->up_attn[0] = false, g->up_attn[1] = true;     /* UpBlock2D, CrossAttnUpBlock2D */
#define SDFX_CFG_I64(name, field)                                                             \
  do {                                                                                        \
    if (sdfx_read_i64(fx, "config." name, v1, 1, err, sizeof err)) fail_msg("%s", err);       \
    field = v1[0];                                                                            \
  } while (0)
  SDFX_CFG_I64("layers_per_block", g->layers);
  SDFX_CFG_I64("cross_attention_dim", g->ctx_dim);
  SDFX_CFG_I64("heads", g->heads);
  SDFX_CFG_I64("norm_num_groups", g->groups);
  SDFX_CFG_I64("sample_size", g->sample);
  SDFX_CFG_I64("in_channels", g->in_ch);
  SDFX_CFG_I64("out_channels", g->out_ch);
  SDFX_CFG_I64("lora_rank", g->lora_rank);
  int64_t alpha;
  SDFX_CFG_I64("lora_alpha", alpha);
#undef SDFX_CFG_I64
  g->lora_alpha = (float)alpha;
  const sdfx_record *ehs = sdfx_find(fx, "input.encoder_hidden_states");
  assert_non_null(ehs);
  g->ctx_len = ehs->dims[1];
  g->attn = attn;
  g->weights = g->acts = VL_F32;
}

/* Every parameter by its name: frozen from param.<name>, LoRA from lora.<name>. */
static void sdfx_unet_load(const sdfx_file *fx, vl_ctx *c, vl_sd_unet *m) {
  char err[1024];
  int n = vl_sd_unet_n_params(m), n_lora;
  vl_sd_unet_trainable(m, &n_lora);
  assert_int_equal(sdfx_count_prefix(fx, "param."), n - n_lora);
  assert_int_equal(sdfx_count_prefix(fx, "lora."), n_lora);
  for (int i = 0; i < n; i++) {
    vl_param *p = vl_sd_unet_param_at(m, i);
    char rec[160];
    snprintf(rec, sizeof rec, "%s.%s", p->trainable ? "lora" : "param", p->name);
    int64_t sh[4];
    int nd = vl_sd_unet_param_shape(m, i, sh);
    if (sdfx_check_shape(fx, rec, nd, sh, err, sizeof err)) fail_msg("%s", err);
    float *h = malloc((size_t)(p->rows * p->cols) * 4);
    assert_non_null(h);
    if (sdfx_read_f32(fx, rec, h, p->rows * p->cols, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(vl_param_load(c, p, h), VL_OK);
    free(h);
  }
}

/* Largest |got - want| over the largest |want|. */
static double sdfx_max_norm_err(const float *got, const double *want, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)got[i] - want[i]));
    den = fmax(den, fabs(want[i]));
  }
  return den > 0 ? num / den : num;
}
