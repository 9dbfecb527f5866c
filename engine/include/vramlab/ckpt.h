/* Checkpoint and resume (DESIGN.md "Checkpoint and resume"), written once for every model
 * that hands out its training state (vl_model_train_state): every parameter's tensors
 * (weights in their storage dtype, the fp32 master under AMP, the optimizer state), the
 * optimizer's config, the loss scaler, the model's buffers (batch-norm running statistics),
 * the step count, the loss of every step so far, and an opaque blob the caller fills with
 * its own state (data position, RNG). Gradients are not saved: they are zero at a step edge
 * (apply and a skipped step both clear them).
 *
 * The file (little-endian; tensor bytes as the device holds them):
 *   magic "VLCKPT\r\n" (8 bytes), u32 format version (VL_CKPT_VERSION)
 *   then sections, each: u32 name length (1..255), the name, u64 payload length, the
 *   payload, u32 CRC-32 (vl_crc32) of everything of the section before it, in this order:
 *     header      str model type, str tag, i64 step, i64 parameters, i64 buffers
 *     losses      i64 n (= step), i64 skipped steps, n x f64 losses
 *     case        the caller's blob (any bytes)
 *     optimizer   u32 optimizer, f32 lr beta1 beta2 eps weight_decay eps2 clip_thr
 *                 decay_pow momentum, u8 adafactor_beta1, f32 clip
 *     scaler      u8 fp16, f32 scale, i32 window, i32 good, i64 t
 *     param:NAME  (one per parameter, the model's order) str name, i64 rows, i64 cols,
 *                 u8 trainable, u8 present (bit 0 w, 1 master, 2..4 state[0..2]), then
 *                 per present tensor: u8 dtype, u8 ndim, ndim x i64 shape, u64 bytes, data
 *     buffer:I    (one per buffer) one tensor as above
 *     end         i64 number of sections before it
 *   (str: u32 length, bytes.) Nothing may follow `end`.
 *
 * Writing is atomic (vl_file_write_atomic: a temporary file, fsync, rename): a crash leaves
 * the previous checkpoint. Reading checks the whole file (every checksum, every field
 * against the model) before it writes anything into the model: a refused checkpoint leaves
 * the model as it was. Messages name the file and the field:
 *   "checkpoint F: truncated at byte N (section 'param:...' needs M bytes)"
 *   "checkpoint F: bad checksum in section 'optimizer'"
 *   "checkpoint F: parameter 'layers.0.wq.lora_A' has shape (8, 64), the model (16, 64)" */
#ifndef VRAMLAB_CKPT_H
#define VRAMLAB_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramlab/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VL_CKPT_MAGIC "VLCKPT\r\n"
#define VL_CKPT_VERSION 1u
#define VL_CKPT_NAME_MAX 64  /* model type names */
#define VL_CKPT_TAG_MAX 128  /* the run's tag */
#define VL_CKPT_BLOB_MAX ((size_t)64 << 20)

/* What a checkpoint holds beside the model. Save: filled by the caller (losses and blob
 * may be NULL when n_losses / blob_len are 0). Load: filled from the file, losses and blob
 * malloc'd (vl_ckpt_meta_free). */
typedef struct {
  char model[VL_CKPT_NAME_MAX]; /* the model type's name (save: taken from the model) */
  char tag[VL_CKPT_TAG_MAX];    /* what wrote it (e.g. the case id); a load may demand it */
  long step;                    /* steps taken (skipped fp16 steps included) */
  long n_losses;                /* = step: the loss of every step so far */
  double *losses;
  long skipped;                 /* fp16-skipped steps among them */
  void *blob;                   /* the caller's own state: data position, RNG */
  size_t blob_len;
} vl_ckpt_meta;

void vl_ckpt_meta_free(vl_ckpt_meta *meta);

/* Write m's training state and meta to path atomically. VL_ERR_UNSUPPORTED for a model
 * without train_state or on the plan device; VL_ERR_IO naming the path. */
vl_status vl_ckpt_save(vl_model *m, const char *path, const vl_ckpt_meta *meta);
/* Check the checkpoint at path against m (and, when tag is not NULL, its tag against
 * tag), then restore m's parameters, optimizer state, scaler and buffers from it and fill
 * *meta. A damaged file is VL_ERR_IO, a checkpoint of another model, config or run
 * VL_ERR_INVALID; either way m is unchanged and the message names the file and field. */
vl_status vl_ckpt_load(vl_model *m, const char *path, const char *tag, vl_ckpt_meta *meta);
/* The same over bytes in memory (name: what messages call them); with apply false only the
 * checks run and m is never written. For tests and the fuzz target. */
vl_status vl_ckpt_read_mem(vl_model *m, const uint8_t *d, size_t n, const char *name, const char *tag,
                           bool apply, vl_ckpt_meta *meta);

/* dir/step-<meta->step>.ckpt (vl_ckpt_save), then dir/latest (its file name and a newline)
 * written atomically after it; dir is made when missing. The file written into path (pn). */
vl_status vl_ckpt_save_dir(vl_model *m, const char *dir, const vl_ckpt_meta *meta, char *path, size_t pn);
/* What `--resume ARG` reads: ARG itself when it is a file, ARG/<the name in ARG/latest> when
 * it is a folder. 0, or -1 with a message naming what is missing in err. */
int vl_ckpt_resolve(const char *arg, char *path, size_t pn, char *err, size_t errn);

#ifdef __cplusplus
}
#endif
#endif
