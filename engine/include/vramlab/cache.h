/* On-disk caches of encoder outputs (docs/architecture.md "On-disk caches"): the VAE's latent
 * moments or one latent sample per image, a text encoder's embeddings per caption. A cache
 * file is a header holding the key it was built for, then fixed-size records, each with a
 * CRC-32. A reader whose key differs is told which field differs and rebuilds (or, in strict
 * mode, stops with an error naming it); a truncated or corrupt file is reported and
 * rebuilt, never read. Files are written to a unique temporary name beside the target,
 * fsynced and renamed, so readers and concurrent builders only ever see whole files.
 *
 * File layout (version 1; integers little-endian, record data in host order, which is
 * little-endian on every machine the suite builds for):
 *   offset  bytes  field
 *        0      8  magic "VLCACHE\0"
 *        8      4  version (1)
 *       12      4  header bytes (256)
 *       16     16  kind tag, NUL-padded ("latents", "text", ...)
 *       32      8  model_hash        (identity of the encoder's weights)
 *       40      8  data_hash         (identity of the source items, in order)
 *       48      8  width, height     (int32 each: input resolution in pixels)
 *       56      4  crop              (vl_cache_crop)
 *       60      4  flip_variants     (1, or 2: records 2i and 2i+1 are item i as is and
 *                                     mirrored)
 *       64     24  norm_mean[3], norm_std[3] (fp32 bit patterns)
 *       88      4  latent_scale      (fp32 bit pattern; 1 = the raw encoder output)
 *       92      4  form              (vl_cache_form)
 *       96      8  sample_seed
 *      104      4  dtype             (vl_dtype: VL_F32, VL_F16, VL_BF16)
 *      108      4  ndim
 *      112     32  shape[4]          (int64 each; unused dims 0)
 *      144      8  record count n
 *      152      8  record payload bytes P = vl_dtype_bytes(dtype, prod(shape))
 *      160      8  record stride S = P + 4
 *      168     84  reserved (zero)
 *      252      4  CRC-32 of bytes [0, 252)
 *      256  n * S  records: P payload bytes, then the CRC-32 of (the record's index as a
 *                  little-endian uint64, then the payload): a record that moved is caught
 *                  like one that changed.
 * The file is exactly 256 + n * S bytes; any other size is a truncated or corrupt file.
 *
 * Concurrency: each builder writes its own temporary file ".<name>.tmp.<host>.<pid>.<seq>"
 * (O_EXCL), fsyncs it and renames it over the target, then fsyncs the folder. Two builders
 * of the same cache both succeed; the later rename replaces the earlier file with an
 * equally valid one (identical content when the encoder is deterministic), and a reader
 * opening meanwhile sees no file, the first or the second, never a partial one. No lock
 * file: nothing is left to clean up when a builder dies, apart from its temporary file,
 * which the next vl_cache_build_begin of the same path on the same host removes once
 * its process is gone (containers sharing a folder need distinct host names for that).
 * (An flock'd lock file would save the loser's duplicate work but not make the result
 * more correct, and locks are unreliable on network file systems.)
 *
 * Messages: every function that can fail takes a vl_ctx only for vl_fail's message (any
 * context, a plan context included; NULL drops the message). */
#ifndef VRAMLAB_CACHE_H
#define VRAMLAB_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramlab/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VL_CACHE_VERSION 1
#define VL_CACHE_HEADER_BYTES 256
#define VL_CACHE_KIND_MAX 16 /* kind tag bytes, the NUL included */

/* What a record holds. */
typedef enum {
  VL_CACHE_MOMENTS = 0, /* the latent distribution: mean in channels [0, C), log-variance in
                           [C, 2C) of a (2C, h, w) record; a fresh sample is drawn each step
                           (the default: the cache stays valid for every epoch's noise) */
  VL_CACHE_SAMPLE,      /* one draw z (C, h, w) with sample_seed (kohya's cache_latents) */
  VL_CACHE_TENSOR,      /* a deterministic output as is (text embeddings (77, 768)) */
  VL_CACHE_FORM_COUNT
} vl_cache_form;

/* The crop made before encoding; a random crop cannot be cached (every epoch differs). */
typedef enum {
  VL_CACHE_CROP_NONE = 0, /* resized to width x height, no crop */
  VL_CACHE_CROP_CENTER,
  VL_CACHE_CROP_TOP_LEFT,
  VL_CACHE_CROP_COUNT
} vl_cache_crop;

/* What a cache was built for: two caches with equal keys hold the same records. Fields that
 * do not apply are zero (text: no resolution or normalisation). Floats compare by bits. */
typedef struct {
  char kind[VL_CACHE_KIND_MAX]; /* "latents", "text": at most 15 characters, NUL-padded */
  uint64_t model_hash;          /* the encoder's weights (vl_cache_hash over them) */
  uint64_t data_hash;           /* the source items in order (sizes, contents, captions) */
  int32_t width, height;        /* input resolution, pixels */
  int32_t crop;                 /* vl_cache_crop */
  int32_t flip_variants;        /* 1: as is; 2: as is and mirrored, records 2i, 2i+1 */
  float norm_mean[3], norm_std[3]; /* per channel: x' = (x / 255 - mean) / std */
  float latent_scale;           /* factor applied before storing (1: the raw output) */
  int32_t form;                 /* vl_cache_form */
  uint64_t sample_seed;         /* VL_CACHE_SAMPLE: the noise seed; 0 otherwise */
  vl_dtype dtype;               /* storage: VL_F32, VL_F16 or VL_BF16 */
  int32_t ndim;                 /* one record's shape, 1..VL_MAX_DIMS dims */
  int64_t shape[VL_MAX_DIMS];   /* unused dims 0 */
} vl_cache_key;

/* A key with kind (truncated to 15 characters), flip_variants 1, norm_std 1, latent_scale
 * 1, form VL_CACHE_TENSOR, VL_F32 and everything else 0; the caller fills in the rest. */
void vl_cache_key_init(vl_cache_key *k, const char *kind);
/* Sets the record shape (ndim 1..4). */
void vl_cache_key_shape(vl_cache_key *k, int ndim, const int64_t *shape);
/* VL_OK, or VL_ERR_INVALID naming what is wrong: empty or unterminated kind, form, crop,
 * flip_variants not 1 or 2, dtype not fp32/fp16/bf16, rank or a dimension, a moments
 * record whose first dimension is odd, a sample seed on a form that draws none. */
vl_status vl_cache_key_check(vl_ctx *c, const vl_cache_key *k);
/* NULL when a and b are equal, else the name of the first differing field ("kind",
 * "model_hash", "data_hash", "width", "height", "crop", "flip_variants", "norm_mean",
 * "norm_std", "latent_scale", "form", "sample_seed", "dtype", "shape"); when msg is not
 * NULL it gets "<field>: <a's value> vs <b's value>". */
const char *vl_cache_key_diff(const vl_cache_key *a, const vl_cache_key *b, char *msg,
                              size_t msgn);

/* ---- sizes (pure) ---------------------------------------------------------------------- */
/* Elements of one record. */
int64_t vl_cache_record_elems(const vl_cache_key *k);
/* Payload bytes of one record in the key's dtype (the CRC's 4 bytes not included). */
size_t vl_cache_record_bytes(const vl_cache_key *k);
/* Bytes of a file of n records: header + n * (payload + 4). */
uint64_t vl_cache_file_bytes(const vl_cache_key *k, int64_t n_records);

/* ---- checksums and identity hashes ------------------------------------------------------ */
/* CRC-32/ISO-HDLC (zlib's crc32: reflected polynomial 0xEDB88320, init and final xor
 * 0xFFFFFFFF), continued from crc (0 to start): vl_crc32(0, "123456789", 9) = 0xCBF43926. */
uint32_t vl_crc32(uint32_t crc, const void *data, size_t n);
/* A 64-bit identity hash of n bytes continued from h (0 to start), 8 bytes a step through
 * vl_mix64: for the encoder's weights (model_hash) and the source list (data_hash). Not
 * cryptographic; equal inputs give equal hashes on every little-endian host. */
uint64_t vl_cache_hash(uint64_t h, const void *data, size_t n);

/* ---- building -------------------------------------------------------------------------- */
typedef struct vl_cache_builder vl_cache_builder;

/* Starts a cache of exactly n_records records for key at path (its folder is created):
 * a fresh temporary file beside it. Temporary files of the same path left by dead
 * processes of this host are removed. VL_ERR_INVALID (key, n_records < 0, path),
 * VL_ERR_IO, VL_ERR_OOM. */
vl_status vl_cache_build_begin(vl_ctx *c, const char *path, const vl_cache_key *key,
                               int64_t n_records, vl_cache_builder **out);
/* Appends the next record (index vl_cache_build_count): x holds the record's elements in
 * fp32, stored converted to the key's dtype (round to nearest even). Writes are buffered;
 * a failure (disk full: "No space left on device", file size limit) removes the temporary
 * file at once and leaves the builder failed: the caller then calls vl_cache_build_abort. */
vl_status vl_cache_build_add(vl_ctx *c, vl_cache_builder *b, const float *x);
/* The same with the record already in the key's dtype (vl_cache_record_bytes bytes). */
vl_status vl_cache_build_add_raw(vl_ctx *c, vl_cache_builder *b, const void *raw);
/* Records added so far (for progress). */
int64_t vl_cache_build_count(const vl_cache_builder *b);
/* Finishes: all n_records must have been added; flush, fsync, rename over path, fsync of
 * the folder. Frees the builder and sets *b = NULL whatever the outcome; on failure the
 * path is untouched and no temporary file is left. */
vl_status vl_cache_build_commit(vl_ctx *c, vl_cache_builder **b);
/* Drops an unfinished cache: the temporary file is removed, the builder freed, *b = NULL.
 * No-op for NULL. */
void vl_cache_build_abort(vl_cache_builder **b);

/* ---- reading --------------------------------------------------------------------------- */
typedef struct vl_cache vl_cache;

/* What vl_cache_open found at the path. */
typedef enum {
  VL_CACHE_VALID = 0, /* header, key, count and size check out: *out is open */
  VL_CACHE_MISSING,   /* no file: build it */
  VL_CACHE_STALE,     /* built for another key or record count: rebuild */
  VL_CACHE_CORRUPT    /* bad magic, version, header CRC, size, or (when every record is
                         checked) a record's CRC: rebuild */
} vl_cache_state;
const char *vl_cache_state_name(vl_cache_state s);

typedef enum {
  VL_CACHE_REBUILD = 0, /* a differing key is VL_CACHE_STALE: the caller rebuilds */
  VL_CACHE_STRICT       /* a differing key is VL_ERR_INVALID naming the field */
} vl_cache_policy;

typedef struct {
  vl_cache_policy on_mismatch;
  bool in_ram;  /* load every record once (each CRC checked) and serve reads from memory */
  bool verify;  /* file mode: check every record's CRC at open too (in_ram always does) */
} vl_cache_opts;

/* Opens the cache at path for the key `want` and n_records records (-1: any count; a
 * different count is a differing key field, "records"); o NULL means REBUILD, file mode,
 * no verify. On VL_OK, *state says what was found: only VL_CACHE_VALID sets *out; for the
 * others c's message says why, for the caller to report before it rebuilds:
 *   "<path>: missing: no file"
 *   "<path>: stale: key differs in dtype (file vs expected: dtype fp32 vs fp16)"
 *   "<path>: corrupt: header CRC mismatch (stored ..., computed ...)"
 *   "<path>: corrupt: truncated: N bytes, the header's n records of S bytes make M"
 *   "<path>: corrupt: record i of n: CRC mismatch" (verify or RAM mode)
 * Errors: VL_ERR_INVALID (the key differs under VL_CACHE_STRICT: "<path>: the cache was
 * built for another dtype (file vs expected: ...); strict mode: not rebuilt"; a bad
 * `want`), VL_ERR_IO (the path exists but cannot be opened or read, or is not a regular
 * file), VL_ERR_OOM (RAM mode); *state is then VL_CACHE_STALE for a strict key mismatch,
 * VL_CACHE_CORRUPT otherwise. */
vl_status vl_cache_open(vl_ctx *c, const char *path, const vl_cache_key *want,
                        int64_t n_records, const vl_cache_opts *o, vl_cache_state *state,
                        vl_cache **out);
/* Record i (0 <= i < count) converted to fp32 into out (vl_cache_record_elems floats).
 * The record's CRC is checked on every read in file mode (RAM mode checked them all at
 * open): a mismatch or short read is VL_ERR_IO naming the record and nothing is returned
 * as data (out is zeroed). Safe to call from several threads at once (pread, no shared
 * buffer). */
vl_status vl_cache_read(vl_ctx *c, const vl_cache *k, int64_t i, float *out);
/* The same in the stored dtype (vl_cache_record_bytes bytes). */
vl_status vl_cache_read_raw(vl_ctx *c, const vl_cache *k, int64_t i, void *out);
const vl_cache_key *vl_cache_key_of(const vl_cache *k);
int64_t vl_cache_count(const vl_cache *k);
/* Bytes the file takes on disk, and bytes this reader holds in RAM (RAM mode: every
 * record's payload, count * vl_cache_record_bytes; file mode: 0, reads go straight into
 * the caller's buffer). */
uint64_t vl_cache_disk_bytes(const vl_cache *k);
uint64_t vl_cache_ram_bytes(const vl_cache *k);
void vl_cache_close(vl_cache *k); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif
#endif
