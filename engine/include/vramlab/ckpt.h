/* Checkpoint and resume (docs/architecture.md "Checkpoints"), written once for every model
 * that hands out its training state (vl_model_train_state): every parameter's tensors
 * (weights in their storage dtype, the fp32 master under AMP, the optimizer state), the
 * optimizer's config, the loss scaler, the model's buffers (batch-norm running statistics),
 * the step count, the loss of every step so far, and an opaque blob the caller fills with
 * its own state (data position, RNG). Gradients are not saved: they are zero at a step edge
 * (apply and a skipped step both clear them).
 *
 * The file (little-endian; tensor bytes as the device holds them):
 *   magic "VLCKPT\r\n" (8 bytes), u32 format version (VL_CKPT_VERSION; version 1, without
 *   the settings section, is refused by name)
 *   then sections, each: u32 name length (1..255), the name, u64 payload length, the
 *   payload, u32 CRC-32 (vl_crc32) of everything of the section before it, in this order:
 *     header      str model type, str tag, i64 step, i64 parameters, i64 buffers
 *     settings    str: the run's settings that shape its trajectory, "name=value" lines
 *                 (vl_ckpt_meta.settings; at most VL_CKPT_SETTINGS_MAX bytes)
 *     losses      i64 n (= step), i64 skipped steps, n x f64 losses (all finite)
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
 * the previous checkpoint. Reading checks the file's size against the most the model's
 * sections can hold before it reads a byte, then the whole file (every checksum, every field
 * against the model and the run's settings, every float tensor, loss and the loss scale
 * finite) before it writes anything into the model: a refused checkpoint leaves the model
 * as it was. Messages name the file and the field:
 *   "checkpoint F: truncated at byte N (section 'param:...' needs M bytes)"
 *   "checkpoint F: bad checksum in section 'optimizer'"
 *   "checkpoint F: parameter 'layers.0.wq.lora_A' has shape (8, 64), the model (16, 64)"
 *   "checkpoint F was made with lora_alpha=32, this run has lora_alpha=16"
 *   "checkpoint F: parameter 'l0.q.lora_A' tensor 'master' holds nan (element 5)" */
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
#define VL_CKPT_VERSION 2u
#define VL_CKPT_NAME_MAX 64  /* model type names */
#define VL_CKPT_TAG_MAX 128  /* the run's tag */
#define VL_CKPT_BLOB_MAX ((size_t)64 << 20)
#define VL_CKPT_SETTINGS_MAX ((size_t)16 << 10)
#define VL_CKPT_STEPS_MAX (1L << 24) /* steps (losses) a checkpoint may hold */
#define VL_CKPT_KEEP_LAST_DEFAULT 3  /* step-N.ckpt files a folder keeps (--keep-last) */

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
  /* Save: the run's settings that shape its trajectory, "name=value\n" lines (built with
   * vl_ckpt_setting; NULL: none). Load: not filled; the reader compares the file's with the
   * run's instead (vl_ckpt_load's settings). */
  const char *settings;
} vl_ckpt_meta;

void vl_ckpt_meta_free(vl_ckpt_meta *meta);

/* Append "name=value\n" (value printf-style) to the settings text in buf (n bytes,
 * NUL-terminated). A name is [A-Za-z0-9_.]; a value printable ASCII. 0, or -1 when it does
 * not fit or is not so (buf then unchanged). */
int vl_ckpt_setting(char *buf, size_t n, const char *name, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* The same for a float: its shortest decimal form that reads back as the same float
 * (a whole number without an exponent). */
int vl_ckpt_setting_f32(char *buf, size_t n, const char *name, float v);

/* Write m's training state and meta to path atomically. VL_ERR_UNSUPPORTED for a model
 * without train_state or on the plan device; VL_ERR_IO naming the path. */
vl_status vl_ckpt_save(vl_model *m, const char *path, const vl_ckpt_meta *meta);
/* Check the checkpoint at path against m (and, when tag is not NULL, its tag against
 * tag; when settings is not NULL, its settings against these, line by line: a setting that
 * differs, or is on one side only, is refused naming it), then restore m's parameters,
 * optimizer state, scaler and buffers from it and fill *meta. A file larger than the
 * model's sections can hold is refused unread. A damaged file is VL_ERR_IO, a checkpoint
 * of another model, config, settings or run VL_ERR_INVALID, non-finite state
 * VL_ERR_NUMERIC (never VL_ERR_OOM: a bad file is not a device out of memory); either way
 * m is unchanged and the message names the file and field. */
vl_status vl_ckpt_load(vl_model *m, const char *path, const char *tag, const char *settings, vl_ckpt_meta *meta);
/* The same over bytes in memory (name: what messages call them); with apply false only the
 * checks run and m is never written. For tests and the fuzz target. */
vl_status vl_ckpt_read_mem(vl_model *m, const uint8_t *d, size_t n, const char *name, const char *tag,
                           const char *settings, bool apply, vl_ckpt_meta *meta);

/* dir/step-<meta->step>.ckpt (vl_ckpt_save), then dir/latest (its file name and a newline)
 * written atomically after it; dir is made when missing. The file written into path (pn).
 * Before it writes, the temporary files of checkpoints and `latest` that a killed process
 * left in dir are removed (only ours by name, only of processes no longer alive:
 * vl_file_remove_stale_temps). After it, when keep_last > 0, step-<k>.ckpt files beyond
 * the keep_last of the highest k <= meta->step are removed (later steps, left by an earlier
 * run into the same folder, are not this run's to judge); 0 keeps every one. */
vl_status vl_ckpt_save_dir(vl_model *m, const char *dir, const vl_ckpt_meta *meta, long keep_last, char *path,
                           size_t pn);
/* What `--resume ARG` reads: ARG itself when it is a file, ARG/<the name in ARG/latest> when
 * it is a folder. 0, or -1 with a message naming what is missing in err. */
int vl_ckpt_resolve(const char *arg, char *path, size_t pn, char *err, size_t errn);

#ifdef __cplusplus
}
#endif
#endif
