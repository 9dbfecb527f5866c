/* ResNet-101 U-Net for semantic segmentation: a torchvision-exact ResNet-101 encoder (v1.5:
 * the stride sits on the 3x3 conv of the bottleneck and on the 1x1 downsample; BN eps 1e-5,
 * momentum 0.1; no conv biases; no classifier) and a U-Net decoder on the stem and the four
 * stages as segmentation_models_pytorch's Unet: per block, 2x bilinear upsampling
 * (align_corners=False), concatenation with the skip (1/16, 1/8, 1/4, 1/2; none at full
 * resolution), two conv3x3-BN-ReLU; then a conv3x3 head to per-pixel class logits (no
 * bias) and per-pixel cross-entropy.
 *
 * One explicit training step (llm.c style): forward allocates activations in the arena,
 * backward frees them as it consumes them. Knobs: AMP (fp16/bf16 activations and working
 * weights, fp32 masters, BN parameters and statistics in fp32, dynamic loss scale for fp16),
 * activation checkpointing per bottleneck block (forward keeps the block input only; the
 * recomputation does not update BN running statistics a second time, unlike PyTorch's
 * torch.utils.checkpoint), in-place ReLU on or off (off: the ReLU writes a new buffer and
 * the BN output is freed, as PyTorch does), gradient accumulation over micro-batches. */
#ifndef VRAMLAB_RESUNET_H
#define VRAMLAB_RESUNET_H

#include "vramlab/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t image;       /* input height = width; a multiple of 32 */
  int64_t in_ch;       /* 3 */
  int64_t width;       /* stem width (64 in ResNet-101); stage s has width * 2^s planes,
                          expansion 4 */
  int blocks[4];       /* bottlenecks per stage: 3, 4, 23, 3 */
  int64_t dec[5];      /* decoder block output channels (256, 128, 64, 32, 16) */
  int64_t classes;
  float bn_eps, bn_momentum;
} vl_resunet_cfg;

/* "full": 512x512, widths of ResNet-101 and smp's Unet, 5 classes; "small": 128x128,
 * widths / 4; "tiny": 32x32, widths / 16. All keep the 101-layer depth. 0 on success. */
int vl_resunet_preset(const char *scale, vl_resunet_cfg *out);

typedef struct {
  vl_dtype compute;          /* fp32, or fp16/bf16 (AMP) */
  bool checkpoint;           /* per bottleneck block */
  bool relu_inplace;         /* torchvision's default: true */
  vl_optim_cfg optim;
  float clip;                /* global-norm clip; 0 = off */
  float loss_scale;          /* fp16: initial dynamic loss scale */
  int loss_scale_window;
} vl_resunet_train_cfg;

/* fp32, no checkpointing, in-place ReLU, AdamW lr 1e-3 betas (0.9, 0.999), no weight
 * decay, no clipping, loss scale 65536 / window 2000. */
void vl_resunet_train_cfg_default(vl_resunet_train_cfg *t);

/* One micro-batch: images x (B, 3, image, image) fp32 normalised and targets y (B, image,
 * image) class ids (-1 ignored), host memory; both may be NULL on the plan device. */
typedef struct {
  int64_t B;
  const float *x;   // (B, in_ch, image, image) normalised images
  const int32_t *y; // (B, image, image) class ids, -1 ignored
} vl_resunet_batch;

typedef struct {
  double loss;          /* mean per-pixel cross-entropy of the step */
  int64_t n_pixels;     /* pixels with a target */
  bool skipped;         /* fp16 overflow: step skipped, scale halved */
  float loss_scale;
  double grad_norm;
} vl_resunet_step_info;

typedef struct vl_resunet vl_resunet;

vl_status vl_resunet_create(vl_ctx *c, const vl_resunet_cfg *mc, const vl_resunet_train_cfg *tc,
                            uint64_t seed, vl_resunet **out);
void vl_resunet_destroy(vl_resunet *m);
/* Forward + backward over n_micro micro-batches, gradients summed; each micro-batch's loss
 * is normalised by the pixels of all of them (so the gradient is that of the mean over the
 * whole step). Batch norm uses each micro-batch's own statistics, so 4 x b equals one 4b
 * batch only without batch norm (tests check both facts). */
vl_status vl_resunet_fwd_bwd(vl_resunet *m, const vl_resunet_batch *mb, int n_micro,
                             vl_resunet_step_info *info);
/* Unscale, overflow check, clip, update, zero gradients. */
vl_status vl_resunet_apply(vl_resunet *m, vl_resunet_step_info *info);
vl_status vl_resunet_step(vl_resunet *m, const vl_resunet_batch *mb, int n_micro,
                          vl_resunet_step_info *info);
/* Evaluation forward (BN running statistics, nothing kept): per-pixel argmax classes
 * into pred (B * image * image, host). */
vl_status vl_resunet_predict(vl_resunet *m, const float *x, int64_t B, int32_t *pred);

vl_param *vl_resunet_params(vl_resunet *m, int *n);
/* Parameters, optimizer, clip, scaler and batch-norm running statistics (model.h). */
vl_status vl_resunet_train_state(vl_resunet *m, vl_train_state *out);
/* The update was done outside the model: the next backward writes (not adds) gradients. */
void vl_resunet_step_end(vl_resunet *m);
/* Parameters by module: 0 encoder, 1 decoder, 2 head. */
int vl_resunet_param_module(const vl_resunet *m, int index);
int64_t vl_resunet_n_params(const vl_resunet *m, int module); /* module -1: all */
/* Running statistics (fp32, C each) of the BN after parameter `gamma_index` (its gamma). */
vl_status vl_resunet_bn_running(vl_resunet *m, int gamma_index, float *mean, float *var);
const vl_resunet_cfg *vl_resunet_config(const vl_resunet *m);
vl_ctx *vl_resunet_ctx(const vl_resunet *m);
/* ---- as a vl_model (resunet_model.c) ----------------------------------------------------- */
/* The config behind vl_model_resunet's void *cfg. Its batches: "images" (B, 3, H, W) VL_F32
 * normalised and "masks" (B, H, W) VL_I32 class ids (-1 ignored); predict reads "images"
 * and writes per-pixel classes (B, H, W). Parameters by module: encoder, decoder, head. */
typedef struct {
  vl_resunet_cfg mc;
  vl_resunet_train_cfg tc;
} vl_resunet_model_cfg;

extern const vl_model_type vl_model_resunet;

/* For tests: turn batch norm into the identity-affine of fixed statistics (no batch
 * statistics) so that accumulation can be compared with one large batch exactly. */
void vl_resunet_set_bn_frozen(vl_resunet *m, bool frozen);

#ifdef __cplusplus
}
#endif
#endif
