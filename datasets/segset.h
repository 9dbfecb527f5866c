/* A synthetic segmentation set on disk: square JPEG images (libjpeg-turbo, 4:2:0) with an
 * exact per-pixel class mask each, for the segmentation benchmark (ResNet-101 U-Net).
 *
 * Content. Photo-like textured backgrounds (the jpegset's: colour gradients, multi-octave
 * value noise, a slow chroma field; class 0) and 2..6 shapes of classes 1..C-1 on top.
 * Each class has its own colour family (a hue spread evenly around the colour wheel, with
 * per-shape jitter in hue, saturation and brightness, and the background's texture and a
 * shading gradient carried into it) and its own shape kind (ellipse, rectangle, triangle,
 * ring, diamond, cross, cycling when there are more than six classes), with per-shape
 * jitter in size, aspect, position and rotation. A later shape covers an earlier one in
 * both the image and the mask. Some images also get an unsaturated distractor shape that
 * stays background in the mask (shape alone does not make a class). Then per-pixel sensor
 * noise and JPEG compression. Colour and shape identify the class, so a small CNN learns
 * it within a few hundred steps; noise, jitter, JPEG artefacts, overlaps and backgrounds of
 * similar brightness or hue keep it from being trivial. The mask is exactly the
 * generator's class ids (it never goes through JPEG).
 *
 * Layout of a set directory:
 *   img_0000000.jpg ...    size x size RGB JPEG
 *   mask_0000000.pgm ...   binary PGM (P5, maxval 255), size x size, values = class ids
 *   manifest.tsv           first line "# vramlab-segset version=1 n=N size=S classes=C
 *                          seed=S quality=Q columns=image,mask,bytes" (space-separated
 *                          key=value fields, unknown keys ignored; n, size and classes are
 *                          required), then one tab-separated line per sample: image file,
 *                          mask file, bytes of the JPEG.
 *
 * Generation is seeded and deterministic: the same (n, size, classes, seed, quality) gives
 * byte-identical files whatever the thread count (integer pixel synthesis; the JPEG bytes
 * depend on the libjpeg-turbo version). A held-out split is the same generator with
 * another seed into another directory (class colours and shapes depend on the class and
 * the class count only). Every file, and the manifest last, is written atomically
 * (temporary file, fsync, rename): an interrupted generation leaves no manifest. */
#ifndef VRAMLAB_SEGSET_H
#define VRAMLAB_SEGSET_H

#include <stddef.h>
#include <stdint.h>

#include "vramlab/core.h"
#include "vramlab/data.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VL_SEGSET_VERSION 1
#define VL_SEGSET_MANIFEST "manifest.tsv"
#define VL_SEGSET_SIZE_MIN 16
#define VL_SEGSET_SIZE_MAX 2048 /* keeps the integer shape tests within int64 */
/* Mask values are bytes; 255 and not 256: the seg-ckpt case (its classes knob) reads sets
 * of at most 255 classes, so no set is made that the case cannot train on. */
#define VL_SEGSET_CLASSES_MAX 255

typedef void (*vl_segset_progress_fn)(int64_t done, int64_t total, void *user);

typedef struct {
  int64_t n;              /* samples */
  int size;               /* image side, VL_SEGSET_SIZE_MIN..VL_SEGSET_SIZE_MAX; 128 */
  int num_classes;        /* including background 0; 2..VL_SEGSET_CLASSES_MAX; 5 */
  uint64_t seed;
  int quality;            /* 1..100; 90 */
  int threads;            /* 0: OpenMP's default (omp_get_max_threads()) */
  vl_segset_progress_fn progress; /* called on the calling thread, every chunk of samples
                                     and once at the end (done == total); may be NULL */
  void *user;
} vl_segset_gen_cfg;

/* n 512, size 128, 5 classes, seed 1, quality 90, threads 0, no progress. */
void vl_segset_gen_cfg_default(vl_segset_gen_cfg *c);

/* Creates dir (and its parents) and writes the set. Returns VL_OK, or a status with a
 * message (VL_ERR_INVALID: a bad configuration; VL_ERR_IO, VL_ERR_OOM). */
vl_status vl_segset_generate(const char *dir, const vl_segset_gen_cfg *cfg, vl_err *err);

typedef struct vl_segset vl_segset;

/* Reads and validates the manifest (not the files). Returns VL_OK, or VL_ERR_IO with a message naming
 * the manifest and, for a bad line, its line number. */
vl_status vl_segset_open(vl_segset **out, const char *dir, vl_err *err);
/* As vl_segset_open, with the manifest's contents the len bytes at text (the fuzz target
 * parses from memory); dir is where the files would be. */
vl_status vl_segset_parse(vl_segset **out, const char *dir, const char *text, size_t len, vl_err *err);
/* A case's split on first use, never writing into a user's folder: VL_OK with *make false
 * when dir holds a set made as cfg says (n, size, classes, seed; quality when the header
 * says it), opened into *out; VL_OK with *make true when the caller is to make it there with
 * cfg (dir does not exist, is empty, or holds only what an interrupted generation leaves);
 * VL_ERR_IO with a message otherwise: a manifest that does not open (the message names the
 * file, the line and what is wrong, then says to delete the folder or remake it with
 * `vramlab data gen`), a set made with other settings, or a folder with other files. */
vl_status vl_segset_first_use(vl_segset **out, const char *dir, const vl_segset_gen_cfg *cfg, bool *make,
                              vl_err *err);
void vl_segset_close(vl_segset *s);
int64_t vl_segset_len(const vl_segset *s);

typedef struct {
  int64_t n;
  int size, num_classes;
  uint64_t seed;
  int version;
  int quality;            /* -1 when the header does not say */
  int64_t total_bytes, max_bytes; /* of the JPEGs, from the manifest */
} vl_segset_info;

void vl_segset_info_get(const vl_segset *s, vl_segset_info *out);
/* "dir/img_0000042.jpg" (mask false) or "dir/mask_0000042.pgm" (mask true) of sample i into
 * buf; NULL when i is out of range or buf is too small. */
const char *vl_segset_path(const vl_segset *s, int64_t i, bool mask, char *buf, size_t n);

/* The nominal colour of class `cls` (1..num_classes-1) in a set of num_classes classes:
 * the centre of its colour family (shapes jitter around it). Background (0) has no colour
 * of its own: rgb is set to mid-grey. */
void vl_segset_class_rgb(int cls, int num_classes, uint8_t rgb[3]);

/* The set as a vl_dataset (engine/data): read(i) reads and decodes the JPEG with TurboJPEG
 * into RGB HWC (growing out->pix) and reads the mask into out->mask (growing it,
 * size*size bytes), sets w = h = size, c = 3, label 0 (no image-level label). Each
 * worker's scratch holds file buffers (each image gets a decompressor of its own, as in
 * the jpegset); read() also works with a NULL scratch (it then makes its own, per call).
 * Errors are VL_ERR_IO with a message naming the file: a file that is not a regular one
 * (never waited on) or is larger than the loader's max_file_bytes (refused before it is
 * read); a missing, unreadable, truncated or corrupt JPEG (TurboJPEG's words; decoding
 * stops at the first warning), one of another size or byte count than the set says; a
 * missing, empty or truncated mask, a bad PGM header, a mask whose dimensions do not match
 * the image, trailing bytes, or a class id >= num_classes. A failed allocation gives
 * VL_ERR_OOM. The set must outlive the dataset. */
vl_dataset vl_segset_dataset(vl_segset *s);

/* A mask file's bytes buf (len, from path) checked and decoded into dst (size*size class
 * ids): a binary PGM ("P5", width, height and maxval as decimal numbers of at most 9
 * digits, '#' comments between them, one whitespace byte, then exactly size*size pixel
 * bytes), size x size, maxval 255, every id < num_classes. VL_OK, or VL_ERR_IO with a
 * message naming path. What read() runs on each mask (exposed for the fuzz target). */
vl_status vl_segset_decode_mask(const char *path, const uint8_t *buf, size_t len, int size,
                                int num_classes, uint8_t *dst, vl_err *err);

#ifdef __cplusplus
}
#endif
#endif
