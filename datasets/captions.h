/* A synthetic captioned image set on disk, for the Stable Diffusion LoRA case (sd-lora): photo-
 * like JPEGs (libjpeg-turbo, 4:2:0) of varied sizes and aspect ratios, each with a caption
 * already tokenised the way Stable Diffusion 1.5's CLIP tokenizer hands it to the text
 * encoder.
 *
 * Images. The jpegset's and segset's synthesis (synth.h): a textured background (colour
 * gradients, multi-octave value noise, a slow chroma field), 1..4 shapes over it, each of
 * one of 8 colour families (red, orange, yellow, green, cyan, blue, purple, white, with
 * per-shape jitter) and one of the 6 shape kinds, then per-pixel sensor noise. Sizes around
 * `size` (512 by default) so that SD's resize and crop are real work: the short side is
 * drawn in [size*3/4, size*5/4] (384..640), the long side is short * a with a in
 * [1, 16/9] (1:1 to 16:9), landscape or portrait with equal odds.
 *
 * Captions. What CLIPTokenizer(max_length=77, padding="max_length", truncation=True) gives
 * for a caption: BOS 49406, the caption's text tokens, EOS 49407, then EOS 49407 as padding
 * up to 77 ids (SD 1.5's tokenizer pads with <|endoftext|>), every id < 49408. The text
 * describes the image: for each shape, in the order drawn, a colour word and a shape word,
 * then 0..96 "tags" drawn from a 4096-word vocabulary with a long-tailed (roughly
 * log-uniform) frequency, three captions in four short (0..16 tags) and one in four long
 * (16..96); a text longer than 75 tokens is truncated to its first 75, as the tokenizer's
 * truncation does. So a caption holds 4..77 ids with BOS and EOS as made here (a manifest
 * may hold 2..77: an empty caption is BOS, EOS), 25 on average, and about one in twelve is
 * truncated. The word ids are fixed stand-ins (colour words 1000..1007, shape words
 * 1010..1015, tags 2000 + 11 * rank), not CLIP's vocabulary: what a text encoder's cost and
 * memory depend on is the ids' range and the (B, 77) shape, which are CLIP's.
 *
 * Layout of a set directory:
 *   img_0000000.jpg ...  RGB JPEGs
 *   manifest.tsv         first line: "# vramlab-captions version=1 n=N size=S seed=S
 *                        quality=Q context=77 bos=49406 eos=49407 pad=49407
 *                        columns=file,width,height,bytes,tokens" (space-separated key=value
 *                        fields, unknown keys ignored; n and size are required; context,
 *                        bos, eos and pad, when present, must be these values), then one
 *                        tab-separated line per image: file name, width, height, bytes of
 *                        the JPEG, and the caption's ids from BOS to EOS, comma-separated,
 *                        without the padding ("49406,1003,1012,2154,49407").
 * The captions live in the manifest only: one file, written last and atomically, so an
 * image and its caption can never come from two generations.
 *
 * Generation is seeded and deterministic: the same (n, size, seed, quality) gives
 * byte-identical files whatever the thread count (integer pixel synthesis; the JPEG bytes
 * depend on the libjpeg-turbo version). Every file, and the manifest last, is written
 * atomically (temporary file, fsync, rename): an interrupted generation leaves no manifest,
 * so the set cannot be opened half-made. */
#ifndef VRAMLAB_CAPTIONS_H
#define VRAMLAB_CAPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "vramlab/core.h"
#include "vramlab/data.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VL_CAPTIONS_VERSION 1
#define VL_CAPTIONS_MANIFEST "manifest.tsv"
#define VL_CAPTIONS_SIZE_MIN 16
#define VL_CAPTIONS_SIZE_MAX 896 /* the long side stays under 2048 (synth.h's shape maths) */

/* CLIP's tokenizer as Stable Diffusion 1.5 uses it. */
#define VL_CLIP_CONTEXT 77     /* model_max_length: ids per caption after padding */
#define VL_CLIP_VOCAB 49408    /* every id is below this */
#define VL_CLIP_BOS 49406      /* <|startoftext|> */
#define VL_CLIP_EOS 49407      /* <|endoftext|> */
#define VL_CLIP_PAD VL_CLIP_EOS /* SD 1.5's pad token is <|endoftext|> */

typedef void (*vl_captions_progress_fn)(int64_t done, int64_t total, void *user);

typedef struct {
  int64_t n;              /* images */
  int size;               /* nominal short side, VL_CAPTIONS_SIZE_MIN..MAX; 512 */
  uint64_t seed;
  int quality;            /* 1..100; 90 */
  int threads;            /* 0: OpenMP's default (omp_get_max_threads()) */
  vl_captions_progress_fn progress; /* called on the calling thread, every chunk of images
                                       and once at the end (done == total); may be NULL */
  void *user;
} vl_captions_gen_cfg;

/* n 1000, size 512, seed 1, quality 90, threads 0, no progress. */
void vl_captions_gen_cfg_default(vl_captions_gen_cfg *c);

/* Creates dir (and its parents) and writes the set. Returns VL_OK, or a status with a
 * message (VL_ERR_INVALID: a bad configuration; VL_ERR_IO, VL_ERR_OOM). */
vl_status vl_captions_generate(const char *dir, const vl_captions_gen_cfg *cfg, vl_err *err);

typedef struct vl_captions vl_captions;

/* Reads and validates the manifest (not the images). Returns VL_OK, or VL_ERR_IO with a message naming
 * the manifest and, for a bad line, its line number. */
vl_status vl_captions_open(vl_captions **out, const char *dir, vl_err *err);
/* As vl_captions_open, with the manifest's contents the len bytes at text (a fuzz target
 * parses from memory); dir is where the images would be. */
vl_status vl_captions_parse(vl_captions **out, const char *dir, const char *text, size_t len, vl_err *err);
/* A case's set on first use, never writing into a user's folder: VL_OK with *make false when
 * dir holds a set made as cfg says (n, size, seed; quality when the header says it), opened
 * into *out; VL_OK with *make true when the caller is to make it there with cfg (dir does
 * not exist, is empty, or holds only what an interrupted generation leaves: numbered images,
 * temporary files, no manifest); VL_ERR_IO with a message otherwise: a manifest that does
 * not open (the message names the file, the line and what is wrong, then says to delete the
 * folder or remake it), a set made with other settings, or a folder with other files. */
vl_status vl_captions_first_use(vl_captions **out, const char *dir, const vl_captions_gen_cfg *cfg, bool *make,
                                vl_err *err);
void vl_captions_close(vl_captions *s);
int64_t vl_captions_len(const vl_captions *s);

typedef struct {
  int64_t n;
  int size, version;
  int quality;            /* -1 when the header does not say */
  uint64_t seed;
  int max_w, max_h;       /* over the manifest's images */
  int64_t max_pixels;     /* the largest image's w * h */
  int64_t total_bytes, max_bytes; /* of the JPEGs */
  int64_t total_tokens;   /* caption ids with BOS and EOS, before padding */
  int max_tokens;         /* the longest caption, with BOS and EOS */
} vl_captions_info;

void vl_captions_info_get(const vl_captions *s, vl_captions_info *out);
/* What the manifest says about image i; 0, or -1 when i is out of range. Any out pointer may
 * be NULL. */
int vl_captions_item(const vl_captions *s, int64_t i, int *w, int *h, int64_t *bytes);
/* "dir/img_0000042.jpg" into buf; NULL when i is out of range or buf is too small. */
const char *vl_captions_path(const vl_captions *s, int64_t i, char *buf, size_t n);
/* Caption i as the text encoder takes it: VL_CLIP_CONTEXT ids into ids (BOS, text, EOS, then
 * VL_CLIP_PAD). Returns the caption's length with BOS and EOS (2..77), or -1 when i is out
 * of range (ids untouched). The loader delivers each sample's index: look captions up by it. */
int vl_captions_tokens(const vl_captions *s, int64_t i, int32_t ids[VL_CLIP_CONTEXT]);

/* The set as a vl_dataset (engine/data): read(i) reads the file and decodes it with
 * TurboJPEG into RGB HWC (growing out->pix), sets w, h, c = 3 and label 0 (captions are
 * looked up by index). As the jpegset's: each worker's scratch holds a file buffer, every
 * image gets a decompressor of its own, read() works with a NULL scratch too, and a missing,
 * unreadable, truncated or corrupt file, one that is not a regular file, one larger than
 * the loader's max_file_bytes, or one whose size or byte count differs from the manifest's
 * is VL_ERR_IO naming the file. The set must outlive the dataset. */
vl_dataset vl_captions_dataset(vl_captions *s);
/* vl_dataset's scratch_bytes and max_image_bytes for any set of nominal short side `size`
 * that vl_captions_generate makes, without the set (for planning a loader before the set
 * exists). */
void vl_captions_gen_bound(int size, size_t *scratch_bytes, size_t *max_image_bytes);

#ifdef __cplusplus
}
#endif
#endif
