/* A synthetic JPEG image set on disk, made with libjpeg-turbo (TurboJPEG), for studying
 * input pipelines. Content is photo-like so that decoding costs what real photos cost:
 * smooth colour gradients, multi-octave value-noise texture, a few shapes (ellipses,
 * rectangles) in colours that depend on the class, and per-pixel Gaussian-like noise.
 * Sizes vary around ImageNet's (width 400..600, height 300..450, 500x375 on average),
 * 4:2:0 chroma subsampling, quality 90 by default.
 *
 * Layout of a set directory:
 *   img_0000000.jpg ... img_{n-1}.jpg
 *   manifest.tsv   first line: "# vramlab-jpegset version=1 n=N classes=C seed=S quality=Q
 *                  columns=file,label,width,height,bytes" (space-separated key=value
 *                  fields; unknown keys are ignored), then one tab-separated line per
 *                  image: file name, label, width, height, bytes.
 *
 * Generation is seeded and deterministic: the same (n, seed, quality, classes) gives
 * byte-identical files whatever the thread count (all pixel synthesis is integer
 * arithmetic, so the bytes do not depend on compiler flags either; the JPEG encoder is
 * libjpeg-turbo's, so another version of it may code the same pixels differently). The
 * class colours depend on the label only: a set made with another seed is a held-out set
 * of the same classes. Every file, and the manifest last, is written atomically (temporary
 * file, fsync, rename); an interrupted generation leaves no manifest, so the set cannot
 * be opened half-made. */
#ifndef VRAMLAB_JPEGSET_H
#define VRAMLAB_JPEGSET_H

#include <stddef.h>
#include <stdint.h>

#include "vramlab/core.h"
#include "vramlab/data.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VL_JPEGSET_VERSION 1
#define VL_JPEGSET_MANIFEST "manifest.tsv"

typedef void (*vl_jpegset_progress_fn)(int64_t done, int64_t total, void *user);

typedef struct {
  int64_t n;              /* images */
  uint64_t seed;
  int quality;            /* 1..100; 90 by default */
  int num_classes;        /* labels are 0..num_classes-1; 1000 by default */
  int threads;            /* 0: OpenMP's default (omp_get_max_threads()) */
  vl_jpegset_progress_fn progress; /* called on the calling thread, every chunk of images
                                      and once at the end (done == total); may be NULL */
  void *user;
} vl_jpegset_gen_cfg;

void vl_jpegset_gen_cfg_default(vl_jpegset_gen_cfg *c);

/* Creates dir (and its parents) and writes the set. Returns VL_OK, or a status with a
 * message (VL_ERR_INVALID: a bad configuration; VL_ERR_IO, VL_ERR_OOM). */
vl_status vl_jpegset_generate_ex(const char *dir, const vl_jpegset_gen_cfg *cfg, vl_err *err);
/* As vl_jpegset_generate_ex with 1000 classes and OpenMP's default thread count. */
vl_status vl_jpegset_generate(const char *dir, int64_t n, uint64_t seed, int quality,
                              vl_jpegset_progress_fn progress, void *user, vl_err *err);

typedef struct vl_jpegset vl_jpegset;

/* Reads and validates the manifest (not the images). Returns VL_OK, or VL_ERR_IO (VL_ERR_OOM)
 * with a message naming the manifest and, for a bad line, its line number. */
vl_status vl_jpegset_open(vl_jpegset **out, const char *dir, vl_err *err);
/* As vl_jpegset_open, with the manifest's contents the len bytes at text (the fuzz
 * target parses from memory); dir is where the images would be. */
vl_status vl_jpegset_parse(vl_jpegset **out, const char *dir, const char *text, size_t len, vl_err *err);
void vl_jpegset_close(vl_jpegset *s);

/* A case's set on first use, never writing into a user's folder: VL_OK with *make false
 * when dir holds a set made as cfg says (n, seed, classes; quality when the header says
 * it), opened into *out; VL_OK with *make true when the caller is to make it there with cfg
 * (dir does not exist, is empty, or holds only what an interrupted generation leaves:
 * numbered images, temporary files, no manifest); VL_ERR_IO with a message otherwise: a
 * manifest that does not open (the message names the file, the line and what is wrong, then
 * says to delete the folder or remake it with `vramlab data gen`), a set made with other
 * settings, or a folder with other files. */
vl_status vl_jpegset_first_use(vl_jpegset **out, const char *dir, const vl_jpegset_gen_cfg *cfg, bool *make,
                               vl_err *err);

int64_t vl_jpegset_len(const vl_jpegset *s);

typedef struct {
  int64_t n;
  int version, quality;   /* quality: -1 when the header does not say */
  int num_classes;        /* from the header, else 1 + the largest label */
  uint64_t seed;
  int max_w, max_h;
  int64_t total_bytes, max_bytes;
} vl_jpegset_info;

void vl_jpegset_info_get(const vl_jpegset *s, vl_jpegset_info *out);
/* What the manifest says about image i; 0, or -1 when i is out of range. Any out pointer
 * may be NULL. */
int vl_jpegset_item(const vl_jpegset *s, int64_t i, int32_t *label, int *w, int *h,
                    int64_t *bytes);
/* "dir/img_0000042.jpg" into buf; NULL when i is out of range or buf is too small. */
const char *vl_jpegset_path(const vl_jpegset *s, int64_t i, char *buf, size_t n);

/* The set as a vl_dataset (engine/data): read(i) reads the file and decodes it with
 * TurboJPEG into RGB HWC (growing out->pix), and sets w, h, c = 3 and the label. Each
 * worker's scratch (scratch_new) holds a file buffer; every image gets a decompressor of
 * its own, so it decodes the same whatever was read before it. read() also works with a
 * NULL scratch (it then makes its own, per call). A missing, unreadable, truncated or
 * corrupt file (any TurboJPEG error or warning, decoding stops at the first warning), one
 * that is not a regular file (a FIFO is never waited on), one larger than the loader's
 * max_file_bytes (refused before it is read; VL_LOADER_MAX_FILE_BYTES with a NULL
 * scratch), a CMYK JPEG, or one whose size differs from the manifest's, gives VL_ERR_IO
 * with a message naming the file (and TurboJPEG's words); a failed allocation gives
 * VL_ERR_OOM. The set must outlive the dataset. */
vl_dataset vl_jpegset_dataset(vl_jpegset *s);
/* vl_dataset's scratch_bytes and max_image_bytes for any set vl_jpegset_generate_ex makes,
 * without the set: the largest image it draws and a reader for the largest JPEG TurboJPEG
 * can write at that size. A bound for planning a loader before the set exists; a case that
 * feeds its loader this description gets the bound its plan printed. */
void vl_jpegset_gen_bound(size_t *scratch_bytes, size_t *max_image_bytes);

/* Decode-only ceiling on the calling thread: the first n_images files (fewer if the set
 * is smaller) are read into memory first, one is decoded to warm up, then all are decoded
 * exactly as read() decodes them, in whole passes (at least 3 and 0.3 s); *rate is images/s
 * of the fastest pass, or -1 with a status and message (a file that fails to read or
 * decode). */
vl_status vl_jpegset_decode_rate(vl_jpegset *s, int64_t n_images, double *rate, vl_err *err);

#ifdef __cplusplus
}
#endif
#endif
