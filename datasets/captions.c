/* Synthetic captioned image set: what is its own (image sizes and shapes, the captions and
 * their token ids, the manifest's columns and their checks); the generation driver, the
 * pixel synthesis, manifest parsing, first-use checks and JPEG reading are shared with the
 * jpegset and the segset (synth.h). See captions.h for the content and the layout. */
#define _GNU_SOURCE
#include "captions.h"
#include "synth.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

/* Short local names for the shared synthesis helpers (synth.h). */
#define rnd_in vl_synth_rnd_in

#define TEXT_MAX (VL_CLIP_CONTEXT - 2) /* text ids a caption keeps: 75 */
#define SHAPES_MAX 4
#define ASPECT_MAX 1778                /* long / short, per mille: 16:9 */

/* Word ids (captions.h): stand-ins, not CLIP's vocabulary. */
#define COLOUR_WORD0 1000
#define KIND_WORD0 1010
#define TAG_WORD0 2000
#define TAG_STRIDE 11
#define TAG_WORDS 4096 /* the last tag id, 2000 + 11 * 4095 = 47045, is below BOS */

/* =================================== sizes =========================================== */

static int short_min(int size) { return size * 3 / 4; }
static int short_max(int size) { return size * 5 / 4; }
/* The longest side any image of the set can have: both canvas dimensions. */
static int long_max(int size) { return short_max(size) * ASPECT_MAX / 1000; }

/* ================================ synthesis =========================================== */

/* Colour families, nominal RGB: red, orange, yellow, green, cyan, blue, purple, white. */
#define COLOURS 8
static const int colour_rgb[COLOURS][3] = {{200, 40, 40},  {230, 130, 30}, {225, 205, 50},
                                           {50, 160, 60},  {40, 180, 190}, {40, 70, 200},
                                           {130, 60, 180}, {235, 235, 230}};

/* One shape of `kind` in colour col over the w x h canvas. The draws, in this order, are
 * part of the set's bytes. */
static void draw_shape(vl_synth_canvas *cv, int w, int h, vl_rng *r, int kind, const int col[3]) {
  const int m = w < h ? w : h;
  vl_synth_shape sh = {.kind = kind};
  sh.rx = rnd_in(r, m * 6 / 100, m * 25 / 100);
  sh.ry = sh.rx * rnd_in(r, 60, 160) / 100;
  if (sh.rx < 2) sh.rx = 2;
  if (sh.ry < 2) sh.ry = 2;
  sh.cx = rnd_in(r, w / 8, w - 1 - w / 8);
  sh.cy = rnd_in(r, h / 8, h - 1 - h / 8);
  sh.rot = vl_synth_rot[vl_rng_below(r, 16)];
  sh.alpha = rnd_in(r, 190, 256);
  sh.tex_gain = rnd_in(r, 64, 224);              /* texture carried in, /256 */
  sh.gx = rnd_in(r, -40, 40);                    /* shading across the shape */
  sh.gy = rnd_in(r, -40, 40);
  sh.R = sh.rx + sh.ry;                          /* >= the farthest corner */
  memcpy(sh.col, col, sizeof sh.col);
  vl_synth_paint(cv, w, h, &sh, NULL, 0);
}

/* What a generated image records for the manifest. */
typedef struct {
  int w, h;
  int64_t bytes;
  int ntok;                         /* ids with BOS and EOS */
  uint16_t tok[VL_CLIP_CONTEXT];
} gen_item;

/* Image i's size, pixels into cv->rgb, and the words that describe it (colour, kind per
 * shape) into words; returns their count. */
static int synth_image(vl_synth_canvas *cv, uint64_t seed, int64_t i, int size, gen_item *it,
                       uint16_t *words) {
  vl_rng r;
  vl_rng_seed(&r, seed ^ vl_mix64((uint64_t)i * 0x9E3779B97F4A7C15ull + 0xCA9710ull));
  const int s = rnd_in(&r, short_min(size), short_max(size));
  const int l = s * rnd_in(&r, 1000, ASPECT_MAX) / 1000;
  const int portrait = rnd_in(&r, 0, 1);
  const int w = portrait ? s : l, h = portrait ? l : s;
  it->w = w;
  it->h = h;
  vl_synth_background(cv, w, h, &r);
  const int nshapes = rnd_in(&r, 1, SHAPES_MAX);
  int nw = 0;
  for (int k = 0; k < nshapes; k++) {
    const int fam = (int)vl_rng_below(&r, COLOURS), kind = (int)vl_rng_below(&r, VL_SYNTH_KINDS);
    int col[3];
    for (int c = 0; c < 3; c++) col[c] = vl_synth_clamp255(colour_rgb[fam][c] + rnd_in(&r, -20, 20));
    draw_shape(cv, w, h, &r, kind, col);
    words[nw++] = (uint16_t)(COLOUR_WORD0 + fam);
    words[nw++] = (uint16_t)(KIND_WORD0 + kind);
  }
  vl_synth_noise(cv, w, h, &r, 8, 20);
  return nw;
}

/* Caption i from the words describing its image, then tags from a stream of its own (so the
 * caption's draws never move the image's): BOS, text truncated to 75 ids, EOS. */
static void make_caption(uint64_t seed, int64_t i, const uint16_t *words, int nwords, gen_item *it) {
  vl_rng r;
  vl_rng_seed(&r, seed ^ vl_mix64((uint64_t)i * 0xD1B54A32D192ED03ull + 0x7A65ull));
  const int ntags = rnd_in(&r, 0, 3) ? rnd_in(&r, 0, 16) : rnd_in(&r, 16, 96);
  int n = 0;
  it->tok[n++] = VL_CLIP_BOS;
  for (int k = 0; k < nwords && n - 1 < TEXT_MAX; k++) it->tok[n++] = words[k];
  for (int k = 0; k < ntags; k++) {
    /* rank below a uniform bound: P(rank) ~ log(4096 / rank) / 4096, a long tail */
    const int bound = 1 + (int)vl_rng_below(&r, TAG_WORDS);
    const int rank = (int)vl_rng_below(&r, (uint64_t)bound);
    if (n - 1 < TEXT_MAX) it->tok[n++] = (uint16_t)(TAG_WORD0 + TAG_STRIDE * rank);
  }
  it->tok[n++] = VL_CLIP_EOS;
  it->ntok = n;
}

/* ================================ generation ========================================== */

void vl_captions_gen_cfg_default(vl_captions_gen_cfg *c) {
  memset(c, 0, sizeof *c);
  c->n = 1000;
  c->size = 512;
  c->seed = 1;
  c->quality = 90;
}

/* Image i synthesised and written, its caption made (synth.h's vl_synth_gen.sample). */
static vl_status gen_sample(vl_synth_worker *wk, const void *cfg, int64_t i, void *result,
                            const char *dir, vl_err *err) {
  const vl_captions_gen_cfg *c = cfg;
  gen_item *it = result;
  uint16_t words[2 * SHAPES_MAX];
  char name[32];
  vl_synth_image_name(i, name, sizeof name);
  const int nwords = synth_image(&wk->cv, c->seed, i, c->size, it, words);
  make_caption(c->seed, i, words, nwords, it);
  return vl_synth_write_jpeg(wk, dir, name, it->w, it->h, &it->bytes, err);
}

static int manifest_line(const void *cfg, int64_t i, const void *result, char *buf, size_t n) {
  const vl_captions_gen_cfg *c = cfg;
  if (i < 0)
    return snprintf(buf, n, "# vramlab-captions version=%d n=%lld size=%d seed=%llu quality=%d "
                            "context=%d bos=%d eos=%d pad=%d columns=file,width,height,bytes,tokens\n",
                    VL_CAPTIONS_VERSION, (long long)c->n, c->size, (unsigned long long)c->seed,
                    c->quality, VL_CLIP_CONTEXT, VL_CLIP_BOS, VL_CLIP_EOS, VL_CLIP_PAD);
  const gen_item *it = result;
  char name[32], toks[VL_CLIP_CONTEXT * 6 + 1];
  vl_synth_image_name(i, name, sizeof name);
  size_t len = 0;
  for (int k = 0; k < it->ntok; k++)
    len += (size_t)snprintf(toks + len, sizeof toks - len, "%s%u", k ? "," : "", (unsigned)it->tok[k]);
  return snprintf(buf, n, "%s\t%d\t%d\t%lld\t%s\n", name, it->w, it->h, (long long)it->bytes, toks);
}

vl_status vl_captions_generate(const char *dir, const vl_captions_gen_cfg *cfg, vl_err *err) {
  if (!dir || !cfg)
    return vl_err_set(err, VL_ERR_INVALID, "captions: no output directory or configuration");
  if (cfg->size < VL_CAPTIONS_SIZE_MIN || cfg->size > VL_CAPTIONS_SIZE_MAX)
    return vl_err_set(err, VL_ERR_INVALID, "captions: size must be in %d..%d (got %d)", VL_CAPTIONS_SIZE_MIN,
                      VL_CAPTIONS_SIZE_MAX, cfg->size);
  const int lmax = long_max(cfg->size);
  const vl_synth_gen g = {
      .kind = "captions", .manifest = VL_CAPTIONS_MANIFEST, .cfg = cfg, .n = cfg->n,
      .quality = cfg->quality, .threads = cfg->threads, .progress = cfg->progress,
      .user = cfg->user, .wmax = lmax, .hmax = lmax, .result_bytes = sizeof(gen_item),
      .sample = gen_sample, .manifest_line = manifest_line};
  return vl_synth_generate(dir, &g, err);
}

/* ================================ manifest ============================================ */

typedef struct {
  int w, h;
  int64_t bytes;
  uint32_t name_off;  /* into names */
  int64_t tok_off;    /* into tok */
  int ntok;
} item;

struct vl_captions {
  char *dir;
  int64_t n;
  item *it;
  char *names;
  uint16_t *tok;      /* every caption's ids, BOS to EOS, back to back */
  vl_captions_info info;
};

void vl_captions_close(vl_captions *s) {
  if (!s) return;
  free(s->dir);
  free(s->it);
  free(s->names);
  free(s->tok);
  free(s);
}

int64_t vl_captions_len(const vl_captions *s) { return s ? s->n : 0; }

void vl_captions_info_get(const vl_captions *s, vl_captions_info *out) { *out = s->info; }

int vl_captions_item(const vl_captions *s, int64_t i, int *w, int *h, int64_t *bytes) {
  if (!s || i < 0 || i >= s->n) return -1;
  if (w) *w = s->it[i].w;
  if (h) *h = s->it[i].h;
  if (bytes) *bytes = s->it[i].bytes;
  return 0;
}

const char *vl_captions_path(const vl_captions *s, int64_t i, char *buf, size_t n) {
  if (!s || i < 0 || i >= s->n || !buf || !n) return NULL;
  return vl_synth_join(buf, n, s->dir, s->names + s->it[i].name_off, NULL) == VL_OK ? buf : NULL;
}

int vl_captions_tokens(const vl_captions *s, int64_t i, int32_t ids[VL_CLIP_CONTEXT]) {
  if (!s || i < 0 || i >= s->n) return -1;
  const item *it = &s->it[i];
  for (int k = 0; k < VL_CLIP_CONTEXT; k++)
    ids[k] = k < it->ntok ? (int32_t)s->tok[it->tok_off + k] : VL_CLIP_PAD;
  return it->ntok;
}

/* An open in progress: the set being filled and what the header said (-1: absent). */
typedef struct {
  vl_captions *s;
  long long n, size, quality, context, bos, eos, pad;
  size_t names_len;
  int64_t tok_len, tok_cap;
} parse_state;

/* The lines do not say the size, so the header must (synth.h's vl_synth_manifest.header). */
static vl_status check_header(void *set, const char *mpath, vl_err *err) {
  const parse_state *ps = set;
  const char *missing = ps->n < 0 ? "n" : ps->size < 0 ? "size" : NULL;
  if (missing)
    return vl_err_set(err, VL_ERR_IO, "%s:1: the header has no %s= (a captions header gives n and size)", mpath, missing);
  return VL_OK;
}

/* The tokens field: ids from BOS to EOS, comma-separated, appended to the set's ids; their
 * count into *ntok. VL_OK, or VL_ERR_IO with a message naming the line. */
static vl_status parse_tokens(parse_state *ps, char *t, const char *mpath, int lineno, int *ntok, vl_err *err) {
  vl_captions *s = ps->s;
  int n = 0;
  for (char *save = NULL, *id = strtok_r(t, ",", &save); id; id = strtok_r(NULL, ",", &save)) {
    long long v;
    if (vl_synth_parse_int(id, 0, VL_CLIP_VOCAB - 1, &v))
      return vl_err_set(err, VL_ERR_IO, "%s:%d: bad token %d \"%s\" (an id in 0..%d)", mpath, lineno, n + 1, id,
                        VL_CLIP_VOCAB - 1);
    if (n == VL_CLIP_CONTEXT)
      return vl_err_set(err, VL_ERR_IO, "%s:%d: more than %d tokens (a caption has at most %d ids with BOS and EOS)",
                        mpath, lineno, VL_CLIP_CONTEXT, VL_CLIP_CONTEXT);
    if (n == 0 && v != VL_CLIP_BOS)
      return vl_err_set(err, VL_ERR_IO, "%s:%d: the caption starts with %lld, not BOS %d", mpath, lineno, v, VL_CLIP_BOS);
    if (n > 0 && v == VL_CLIP_BOS)
      return vl_err_set(err, VL_ERR_IO, "%s:%d: BOS %d at token %d (only the first id is BOS)", mpath, lineno,
                        VL_CLIP_BOS, n + 1);
    if (n > 0 && v == VL_CLIP_EOS && save && *save)
      return vl_err_set(err, VL_ERR_IO, "%s:%d: EOS %d at token %d before the end (the manifest lists captions "
                        "without their padding)", mpath, lineno, VL_CLIP_EOS, n + 1);
    s->tok[ps->tok_len + n++] = (uint16_t)v;
  }
  /* strtok_r skips empty fields: a ",," or a trailing comma must not pass unseen */
  if (n < 2 || s->tok[ps->tok_len + n - 1] != VL_CLIP_EOS)
    return vl_err_set(err, VL_ERR_IO, "%s:%d: the caption does not end with EOS %d (expected BOS, text ids, EOS)",
                      mpath, lineno, VL_CLIP_EOS);
  ps->tok_len += n;
  *ntok = n;
  return VL_OK;
}

/* One image line: file, width, height, bytes, tokens (synth.h's vl_synth_manifest.line). */
static vl_status parse_line(void *set, char **fld, const char *mpath, int lineno, vl_err *err) {
  parse_state *ps = set;
  vl_captions *s = ps->s;
  if (!vl_synth_plain_name(fld[0]))
    return vl_err_set(err, VL_ERR_IO, "%s:%d: bad file name \"%s\" (a plain name in the set's directory)", mpath,
                      lineno, fld[0]);
  static const char *const what[3] = {"width", "height", "bytes"};
  const long long hi[3] = {65535, 65535, 1ll << 40};
  long long v[3];
  for (int k = 0; k < 3; k++)
    if (vl_synth_parse_int(fld[k + 1], 1, hi[k], &v[k]))
      return vl_err_set(err, VL_ERR_IO, "%s:%d: bad %s \"%s\" (a positive integer)", mpath, lineno, what[k], fld[k + 1]);
  /* the field as written: no empty ids, which strtok_r would skip */
  const char *f = fld[4];
  if (!*f || *f == ',' || f[strlen(f) - 1] == ',' || strstr(f, ",,"))
    return vl_err_set(err, VL_ERR_IO, "%s:%d: bad tokens \"%.40s\" (ids from BOS %d to EOS %d, comma-separated)",
                      mpath, lineno, f, VL_CLIP_BOS, VL_CLIP_EOS);
  const int64_t off = ps->tok_len;
  int ntok = 0;
  VL_TRY(parse_tokens(ps, fld[4], mpath, lineno, &ntok, err));
  item *it = &s->it[s->n++];
  *it = (item){.w = (int)v[0], .h = (int)v[1], .bytes = v[2], .name_off = (uint32_t)ps->names_len,
               .tok_off = off, .ntok = ntok};
  memcpy(s->names + ps->names_len, fld[0], strlen(fld[0]) + 1);
  ps->names_len += strlen(fld[0]) + 1;
  vl_captions_info *in = &s->info;
  if (it->w > in->max_w) in->max_w = it->w;
  if (it->h > in->max_h) in->max_h = it->h;
  if (it->bytes > in->max_bytes) in->max_bytes = it->bytes;
  if ((int64_t)it->w * it->h > in->max_pixels) in->max_pixels = (int64_t)it->w * it->h;
  if (ntok > in->max_tokens) in->max_tokens = ntok;
  in->total_bytes += it->bytes;
  in->total_tokens += ntok;
  return VL_OK;
}

/* Room for every line of a manifest of len bytes: lines, names and ids are bounded by it (an
 * id takes at least two bytes, its digit and a separator) (synth.h's
 * vl_synth_manifest.prepare). */
static int prepare(void *set, const char *dir, int64_t lines, size_t len) {
  parse_state *ps = set;
  vl_captions *s = ps->s = calloc(1, sizeof *s);
  if (!s) return -1;
  s->dir = strdup(dir);
  s->it = calloc((size_t)lines, sizeof *s->it);
  s->names = malloc(len + 1);
  s->tok = malloc((len / 2 + 1) * sizeof *s->tok);
  if (!s->dir || !s->it || !s->names || !s->tok) {
    vl_captions_close(s);
    ps->s = NULL;
    return -1;
  }
  return 0;
}

/* dir's manifest (text NULL) or the len bytes at text, parsed as dir's. */
static vl_status open_from(vl_captions **out, const char *dir, const char *text, size_t len, vl_err *err) {
  *out = NULL;
  parse_state ps = {.n = -1, .size = -1, .quality = -1, .context = -1, .bos = -1, .eos = -1, .pad = -1};
  unsigned long long seed = 0;
  const vl_synth_key keys[] = {{"n", 1, INT64_MAX, &ps.n},
                               {"size", VL_CAPTIONS_SIZE_MIN, VL_CAPTIONS_SIZE_MAX, &ps.size},
                               {"quality", 1, 100, &ps.quality},
                               {"context", VL_CLIP_CONTEXT, VL_CLIP_CONTEXT, &ps.context},
                               {"bos", VL_CLIP_BOS, VL_CLIP_BOS, &ps.bos},
                               {"eos", VL_CLIP_EOS, VL_CLIP_EOS, &ps.eos},
                               {"pad", VL_CLIP_PAD, VL_CLIP_PAD, &ps.pad},
                               {NULL, 0, 0, NULL}};
  const vl_synth_manifest m = {
      .kind = "captions", .name = VL_CAPTIONS_MANIFEST, .magic = "# vramlab-captions",
      .version = VL_CAPTIONS_VERSION, .what = "captioned image set",
      .gen = "vramlab data gen --kind captions", .keys = keys, .seed = &seed, .n = &ps.n,
      .nfields = 5, .fields = "file, width, height, bytes, tokens", .noun = "image",
      .header = check_header, .prepare = prepare, .line = parse_line, .set = &ps};
  vl_status st = vl_synth_manifest_load(dir, &m, text, len, err);
  if (st != VL_OK) {
    vl_captions_close(ps.s);
    return st;
  }
  vl_captions_info *in = &ps.s->info;
  in->n = ps.s->n;
  in->version = VL_CAPTIONS_VERSION;
  in->size = (int)ps.size;
  in->quality = (int)ps.quality;
  in->seed = seed;
  *out = ps.s;
  return VL_OK;
}

vl_status vl_captions_open(vl_captions **out, const char *dir, vl_err *err) {
  return open_from(out, dir, NULL, 0, err);
}

vl_status vl_captions_parse(vl_captions **out, const char *dir, const char *text, size_t len, vl_err *err) {
  if (!text) {
    *out = NULL;
    return vl_err_set(err, VL_ERR_INVALID, "captions: no manifest text");
  }
  return open_from(out, dir, text, len, err);
}

vl_status vl_captions_first_use(vl_captions **out, const char *dir, const vl_captions_gen_cfg *cfg, bool *make,
                                vl_err *err) {
  *out = NULL;
  char gen[700];
  vl_err e2;
  /* The command line makes sets of the default size only. */
  vl_captions_gen_cfg d;
  vl_captions_gen_cfg_default(&d);
  if (cfg->size == d.size)
    snprintf(gen, sizeof gen, "remake it with `vramlab data gen --kind captions --out %s --n %lld "
                              "--seed %llu --quality %d`",
             dir, (long long)cfg->n, (unsigned long long)cfg->seed, cfg->quality);
  else
    snprintf(gen, sizeof gen, "use another");
  VL_TRY(vl_synth_first_use(dir, VL_CAPTIONS_MANIFEST, "vramlab data gen --kind captions --out DIR", make, err));
  if (*make) return VL_OK;
  if (vl_captions_open(out, dir, &e2) != VL_OK)
    return vl_err_set(err, VL_ERR_IO,
                      "%s. The captioned image set in %s is damaged and is left as it is: delete "
                      "the folder (the next run makes it again) or %s",
                      e2.msg, dir, gen);
  const vl_captions_info *in = &(*out)->info;
  if (in->n != cfg->n || in->size != cfg->size || in->seed != cfg->seed ||
      (in->quality != -1 && in->quality != cfg->quality)) {
    vl_status st = vl_err_set(err, VL_ERR_IO,
                              "%s holds a captioned image set of n=%lld size=%d seed=%llu quality=%d, not "
                              "the n=%lld size=%d seed=%llu quality=%d asked for: it is left as it is; "
                              "delete the folder (the next run makes it again) or use another",
                              dir, (long long)in->n, in->size, (unsigned long long)in->seed, in->quality,
                              (long long)cfg->n, cfg->size, (unsigned long long)cfg->seed, cfg->quality);
    vl_captions_close(*out);
    *out = NULL;
    return st;
  }
  return VL_OK;
}

/* ================================ decoding ============================================ */

/* Image i read and decoded with r (synth.h's vl_synth_read_fn). */
static vl_status read_image(void *set, vl_synth_reader *r, int64_t i, vl_image *out, vl_err *err) {
  const vl_captions *s = set;
  const item *it = &s->it[i];
  char path[PATH_MAX];
  if (!vl_captions_path(s, i, path, sizeof path))
    return vl_err_set(err, VL_ERR_IO, "captions: path of image %lld too long", (long long)i);
  const vl_synth_jpeg_want want = {it->w, it->h, it->bytes, "the manifest says"};
  VL_TRY(vl_synth_read_jpeg(r, path, &want, out, err));
  out->w = it->w;
  out->h = it->h;
  out->c = 3;
  out->label = 0;
  return VL_OK;
}

static int64_t ds_len(void *self) { return ((vl_captions *)self)->n; }

static void *ds_scratch_new(void *self) {
  return vl_synth_reader_new((size_t)((vl_captions *)self)->info.max_bytes, 0);
}

static vl_status ds_read(void *self, void *scratch, int64_t i, vl_image *out, vl_err *err) {
  return vl_synth_ds_read("captions", self, ((vl_captions *)self)->n, scratch, i, read_image, out,
                          err);
}

vl_dataset vl_captions_dataset(vl_captions *s) {
  vl_dataset d = vl_synth_dataset(s, ds_len, ds_scratch_new, ds_read);
  d.scratch_bytes = vl_synth_reader_bytes((size_t)s->info.max_bytes, 0, s->info.max_w);
  /* The largest image the manifest lists (portrait and landscape ones mixed: the widest by
   * the tallest would be twice too much). */
  d.max_image_bytes = (size_t)s->info.max_pixels * 3;
  return d;
}

void vl_captions_gen_bound(int size, size_t *scratch_bytes, size_t *max_image_bytes) {
  const int s = short_max(size), l = long_max(size);
  /* the generator's 4:2:0 subsampling (synth.c), as its own output buffer is sized */
  *scratch_bytes = vl_synth_reader_bytes((size_t)tjBufSize(l, s, TJSAMP_420), 0, l);
  *max_image_bytes = (size_t)s * (size_t)l * 3;
}
