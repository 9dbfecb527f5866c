/* Internal helpers shared by the synthetic image sets (jpegset, segset): atomic file
 * writes, whole-file reads, the generation driver (threads, progress, first error, the
 * manifest written last), manifest parsing, the first-use check of a set directory, the
 * read side of a vl_dataset (per-worker file buffers, decoding with checks against the
 * manifest), and the integer pixel synthesis of a photo-like textured background (gradients +
 * multi-octave value noise), of shapes over it and of per-pixel sensor noise. Not a public
 * interface: names carry the vl_synth_ prefix only because the sets are linked into one
 * library. Each set keeps only what is its own: its content, its file layout, its manifest
 * columns and their checks.
 *
 * Everything that makes pixels is integer arithmetic and draws from the caller's vl_rng in
 * a fixed order, so a set's bytes depend on its seed only (not on threads or compiler
 * flags). Changing the order or count of draws here changes every generated set. */
#ifndef VRAMLAB_DATASETS_SYNTH_H
#define VRAMLAB_DATASETS_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include <turbojpeg.h>

#include "vramlab/core.h"
#include "vramlab/data.h"

/* ---- files ------------------------------------------------------------------------ */

/* strerror_r into buf (the GNU one: it returns the message, in buf or static). */
const char *vl_synth_errstr(int e, char *buf, size_t n);
/* "dir/name" into buf; VL_ERR_INVALID with a message (err may be NULL) when it does not fit. */
vl_status vl_synth_join(char *buf, size_t n, const char *dir, const char *name, vl_err *err);
/* Creates dir and its parents. VL_OK, or VL_ERR_IO with a message. */
vl_status vl_synth_mkdir_p(const char *dir, vl_err *err);
/* dir/name written atomically: dir/.name.tmp.PID, fsync, rename. VL_OK, or a status with a
 * message. */
vl_status vl_synth_write_atomic(const char *dir, const char *name, const void *data, size_t len, vl_err *err);
void vl_synth_fsync_dir(const char *dir);
/* Whole file into *buf (grown with realloc, capacity *cap); *len its size. Opened without
 * blocking and checked with fstat before a byte is read: a missing, unreadable or empty
 * file, one that is not a regular file ("not a regular file (fifo)": a FIFO would block the
 * read forever) or one of more than max_bytes ("file of N bytes exceeds max_file_bytes
 * (M)") is VL_ERR_IO with a message starting "path: "; no memory for the buffer is
 * VL_ERR_OOM. */
vl_status vl_synth_read_file(const char *path, uint64_t max_bytes, uint8_t **buf, size_t *cap,
                             size_t *len, vl_err *err);

/* ---- pixel synthesis ---------------------------------------------------------------- */

static inline int vl_synth_clamp255(int v) { return v < 0 ? 0 : v > 255 ? 255 : v; }
static inline int vl_synth_rnd_in(vl_rng *r, int lo, int hi) {
  return lo + (int)vl_rng_below(r, (uint64_t)(hi - lo + 1));
}

/* cos, sin of k*pi/16 (k = 0..15) times 1024: rotations in integer arithmetic. */
extern const int vl_synth_rot[16][2];

#define VL_SYNTH_OCTAVES 7
#define VL_SYNTH_FIELDS (VL_SYNTH_OCTAVES + 3) /* luminance octaves + one chroma field per channel */

/* One value-noise field: a lattice of int8 values every `cell` pixels, bilinear with a
 * smoothstep weight between them. Tables sized for the canvas's largest image. */
typedef struct {
  int cell, gw, gh, amp;
  int8_t *lat;
  int16_t *xi, *xw; /* per x: lattice column, weight 0..256 */
  int16_t *xend;    /* per lattice column: first x past it */
  int16_t *yi, *yw; /* per y: lattice row, weight 0..256 */
  int32_t *row;     /* lattice row interpolated in y, scaled by 256 */
} vl_synth_field;

/* Per-thread working memory for images up to wmax x hmax. */
typedef struct {
  int wmax, hmax;
  vl_synth_field f[VL_SYNTH_FIELDS];
  int16_t *tex;  /* w*h luminance texture, levels (shapes carry it too) */
  uint8_t *rgb;  /* w*h*3, HWC */
  int32_t *acc;  /* 3 * wmax: a row accumulator, or a row of noise bits */
} vl_synth_canvas;

int vl_synth_canvas_init(vl_synth_canvas *c, int wmax, int hmax); /* 0, or -1: out of memory */
void vl_synth_canvas_free(vl_synth_canvas *c);

/* The background of a w x h image (w, h >= 2, within the canvas) into c->rgb, and its
 * luminance texture into c->tex: a bilinear gradient between four random corner colours,
 * octaves of value noise whose fine ones are scaled by a random roughness (some images
 * smooth like sky, some busy like foliage), and a slow chroma field per channel. */
void vl_synth_background(vl_synth_canvas *c, int w, int h, vl_rng *r);

/* Shape kinds (the jpegset draws the first two). */
enum { VL_SYNTH_ELLIPSE, VL_SYNTH_RECT, VL_SYNTH_TRIANGLE, VL_SYNTH_RING, VL_SYNTH_DIAMOND,
       VL_SYNTH_CROSS, VL_SYNTH_KINDS };

/* A shape as the set drew it: kind, centre, half-extents rx, ry (>= 1), R (> 0, bounds
 * its extent from the centre), rotation (a row of vl_synth_rot), its colour, how much of
 * the background's texture it carries (tex_gain/256), a shading gradient (gx, gy levels
 * across R) and its opacity (alpha/256). */
typedef struct {
  int kind, cx, cy;
  int64_t rx, ry, R;
  const int *rot;
  int col[3];
  int tex_gain, gx, gy, alpha;
} vl_synth_shape;

/* Paints sh over c's w x h image, blending over what is below; where it lands, mask (w*h
 * class ids) is set to cls, unless mask is NULL (a distractor). */
void vl_synth_paint(vl_synth_canvas *c, int w, int h, const vl_synth_shape *sh, uint8_t *mask,
                    int cls);

/* Sensor-like noise over c->rgb: a sum of four uniform bytes (Irwin-Hall, sd 147.8) scaled
 * to a per-image sigma of 147.8 * q / 256 levels, q drawn in [sig_lo, sig_hi]. */
void vl_synth_noise(vl_synth_canvas *c, int w, int h, vl_rng *r, int sig_lo, int sig_hi);

/* ---- generation ----------------------------------------------------------------------- */

typedef void (*vl_synth_progress_fn)(int64_t done, int64_t total, void *user);

/* One generating thread's memory: a canvas and a JPEG encoder with an output buffer, both
 * for the largest image, and the set's own scratch (extra, vl_synth_gen.extra_bytes). */
typedef struct {
  vl_synth_canvas cv;
  tjhandle tj;
  uint8_t *jbuf;
  unsigned long jcap;
  int quality;
  void *extra;
} vl_synth_worker;

/* "img_0000042.jpg": image i's file name in either set. */
void vl_synth_image_name(int64_t i, char *buf, size_t n);

/* Encodes the worker's w x h canvas (RGB, 4:2:0, its quality) and writes it atomically as
 * dir/name; *bytes is its size. VL_OK, or a status with a message naming the file. */
vl_status vl_synth_write_jpeg(vl_synth_worker *wk, const char *dir, const char *name, int w, int h,
                              int64_t *bytes, vl_err *err);

/* A set's generator as the shared driver runs it. */
typedef struct {
  const char *kind;         /* "jpegset": starts the driver's own messages */
  const char *manifest;     /* the manifest's file name in the set directory */
  const void *cfg;          /* the set's configuration, handed to the callbacks */
  int64_t n;                /* samples, >= 1 */
  int quality;              /* 1..100 */
  int threads;              /* >= 0; 0: OpenMP's default */
  vl_synth_progress_fn progress; /* may be NULL */
  void *user;
  int wmax, hmax;           /* the largest image: sizes each worker's canvas and encoder */
  size_t extra_bytes;       /* each worker's vl_synth_worker.extra */
  size_t result_bytes;      /* what sample() records per sample for the manifest */
  /* Synthesises sample i and writes its files into dir, recording what the manifest
   * needs in *result. Runs on any worker thread. VL_OK, or a status with a message naming
   * the file. */
  vl_status (*sample)(vl_synth_worker *wk, const void *cfg, int64_t i, void *result, const char *dir,
                      vl_err *err);
  /* The manifest's header line (i < 0, result NULL) or sample i's line, with its '\n',
   * into buf as snprintf does (the return value is the full length). */
  int (*manifest_line)(const void *cfg, int64_t i, const void *result, char *buf, size_t n);
} vl_synth_gen;

/* Checks n, quality and threads, creates dir (and its parents), removes an old manifest
 * (a half-made set must not open), writes every sample on g->threads threads (each with
 * its vl_synth_worker), reports progress on the calling thread after every chunk of
 * samples, stops at the first error, and writes the manifest atomically last. The bytes
 * do not depend on the thread count as long as sample() depends on i only. VL_OK, or the
 * first error's status and message (VL_ERR_INVALID: a bad n, quality or threads). */
vl_status vl_synth_generate(const char *dir, const vl_synth_gen *g, vl_err *err);

/* ---- reading ------------------------------------------------------------------------- */

/* A reading worker's scratch (a vl_dataset's scratch_new): a buffer for the JPEG file,
 * one for a second file per sample (the segset's mask), and the largest file it reads. */
typedef struct {
  uint8_t *buf, *aux;
  size_t cap, aux_cap;
  uint64_t max_file; /* VL_LOADER_MAX_FILE_BYTES until the loader says (scratch_limit) */
} vl_synth_reader;

/* The buffers sized for the set's largest files up front, at most max_file each
 * (vl_synth_read_file grows them if a file is larger); NULL when there is no memory. */
vl_synth_reader *vl_synth_reader_new(size_t cap, size_t aux_cap);
/* As a vl_dataset's scratch_free (self unused). */
void vl_synth_reader_delete(void *self, void *reader);
/* As a vl_dataset's scratch_limit (self unused): the reader's max_file. */
void vl_synth_reader_limit(void *self, void *reader, uint64_t max_file_bytes);
/* One reader's bytes while decoding images up to max_w wide: its buffers and libjpeg's
 * working memory (an estimate: a few MCU rows of each component and the upsampling
 * buffers, ~150 KB at a width of 600). The decoded image lives in the loader's vl_image. */
size_t vl_synth_reader_bytes(size_t cap, size_t aux_cap, int max_w);

/* What the set says a JPEG is: w x h pixels (`says` words the source in a message: "the
 * manifest says") and a file of `bytes` bytes. */
typedef struct {
  int w, h;
  int64_t bytes;
  const char *says;
} vl_synth_jpeg_want;

/* Decodes the JPEG buf (len bytes, from path) into out->pix (RGB HWC, grown) as PIL and
 * libjpeg do by default, stopping at the first warning (a warning means damaged data), with
 * a decompressor of its own: the pixels and the verdict depend on these bytes only, never
 * on what was decoded before (see synth.c). RGB, YCbCr and grayscale JPEGs decode (gray to
 * R = G = B). Any TurboJPEG error or warning, no frame header ("truncated JPEG (no frame
 * header)"), a CMYK or YCCK file ("unsupported colour space CMYK"), other dimensions than
 * `want` (checked before the image is allocated), or another byte count (reported after
 * decoding, with the decoder's words when it fails too) is VL_ERR_IO with a message naming
 * path; no memory, or no decompressor, is VL_ERR_OOM. Leaves out->w, h, c and label to the
 * caller. */
vl_status vl_synth_decode_jpeg(const char *path, const uint8_t *buf, size_t len,
                               const vl_synth_jpeg_want *want, vl_image *out, vl_err *err);
/* path read into r->buf (at most r->max_file bytes) and decoded. */
vl_status vl_synth_read_jpeg(vl_synth_reader *r, const char *path, const vl_synth_jpeg_want *want,
                             vl_image *out, vl_err *err);

/* *buf (capacity *cap) grown to need bytes for a w x h `what` ("image", "mask") of path;
 * VL_ERR_OOM with a message naming path when there is no memory. */
vl_status vl_synth_grow(uint8_t **buf, size_t *cap, size_t need, const char *path, const char *what,
                        int w, int h, vl_err *err);

/* Sample i of a set into out with the reader r (ready, with a decompressor). */
typedef vl_status (*vl_synth_read_fn)(void *set, vl_synth_reader *r, int64_t i, vl_image *out, vl_err *err);
/* A vl_dataset's read() around read_fn: checks i against the set's n and, for a NULL
 * scratch, uses a reader for this call only (VL_LOADER_MAX_FILE_BYTES). Messages start
 * with kind ("jpegset"). */
vl_status vl_synth_ds_read(const char *kind, void *set, int64_t n, void *scratch, int64_t i,
                           vl_synth_read_fn read_fn, vl_image *out, vl_err *err);

/* A vl_dataset over a set with a vl_synth_reader per worker (scratch_new makes one,
 * scratch_free is vl_synth_reader_delete, scratch_limit vl_synth_reader_limit); the
 * caller adds scratch_bytes and max_image_bytes. */
vl_dataset vl_synth_dataset(void *set, int64_t (*len)(void *self), void *(*scratch_new)(void *self),
                            vl_status (*read)(void *self, void *scratch, int64_t i, vl_image *out, vl_err *err));

/* ---- manifests ---------------------------------------------------------------------- */

/* Whole decimal integer in [lo, hi] (no sign, no spaces); 0 on success. */
int vl_synth_parse_int(const char *t, long long lo, long long hi, long long *out);
/* A plain file name in the set's directory: not empty, no '/', not . or .., <= 255. */
int vl_synth_plain_name(const char *name);

/* A whole number the header may carry as key=value: into *val, within [lo, hi]. */
typedef struct {
  const char *key;
  long long lo, hi;
  long long *val;
} vl_synth_key;

#define VL_SYNTH_MAX_FIELDS 8

/* A set's manifest: "MAGIC version=V key=value ..." then one tab-separated line per
 * sample. */
typedef struct {
  const char *kind;         /* "jpegset" */
  const char *name;         /* "manifest.tsv" */
  const char *magic;        /* "# vramlab-jpegset" */
  int version;              /* the only version this build reads */
  const char *what;         /* "image set": what a missing manifest means is missing */
  const char *gen;          /* the command that makes a set: "vramlab data gen" */
  const vl_synth_key *keys; /* the header's numbers besides version and seed, {NULL}-ended */
  unsigned long long *seed; /* seed= when there is one */
  const long long *n;       /* the header's n (a key's val), -1 when absent: not checked */
  int nfields;              /* per line, at most VL_SYNTH_MAX_FIELDS */
  const char *fields;       /* their names in messages: "image file, mask file, bytes" */
  const char *noun;         /* what a line lists: "image" ("no images listed") */
  /* Makes the set's room for at most `lines` lines of a manifest of len bytes (names
   * included), before any is parsed. 0, or -1: out of memory. */
  int (*prepare)(void *set, const char *dir, int64_t lines, size_t len);
  /* Checks the header's values and keeps them; NULL: nothing to check. VL_OK, or VL_ERR_IO
   * with a message. */
  vl_status (*header)(void *set, const char *mpath, vl_err *err);
  /* One line's fields, all of them NUL-terminated. VL_OK, or VL_ERR_IO with a message naming
   * the manifest and the line. */
  vl_status (*line)(void *set, char **fld, const char *mpath, int lineno, vl_err *err);
  void *set;
} vl_synth_manifest;

/* A manifest may be this large (a 10-million-image set's is about 400 MB). */
#define VL_SYNTH_MANIFEST_MAX ((uint64_t)1 << 30)

/* Reads dir's manifest (text == NULL), or takes the len bytes at text as its contents
 * (parsing from memory: the fuzz target), has the set prepare() its room, and parses it:
 * the header's magic, keys, version and seed (then header()), each line's fields (line()),
 * and the count against the header's n. VL_OK, or VL_ERR_IO (VL_ERR_OOM) with a message
 * naming the manifest and, for a bad line, its line number: a missing one (with a hint to
 * make a set), an empty, unreadable, oversized, non-regular or binary one, a bad header or
 * line. On failure the set
 * may hold what prepare() and line() made: the caller frees it. */
vl_status vl_synth_manifest_load(const char *dir, const vl_synth_manifest *m, const char *text, size_t len,
                                 vl_err *err);

/* ---- first use ----------------------------------------------------------------------- */

/* What a case may do with its set directory dir on first use: VL_OK with *make false when
 * dir holds the manifest `manifest` (open it: the set decides whether it is sound), VL_OK
 * with *make true when dir may be made into a set (it does not exist, is empty, or holds
 * only what an interrupted generation leaves: img_NNNNNNN.jpg, mask_NNNNNNN.pgm and
 * ".NAME.tmp.PID" files, no manifest), VL_ERR_IO with a message naming dir otherwise (not a
 * directory, unreadable, or a folder with other files: never written into). `gen` is the command that makes a set
 * there ("vramlab data gen --out DIR ..."), for the message (NULL: none, for data gen itself). */
vl_status vl_synth_first_use(const char *dir, const char *manifest, const char *gen, bool *make, vl_err *err);

#endif
