/* The data set registry of `vramlab data gen` (datagen.h). */
#include "datagen.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "datasets/captions.h"
#include "datasets/jpegset.h"
#include "datasets/segset.h"
#include "datasets/synth.h"
#include "kit/util.h"
#include "vramlab/core.h"

static void progress(int64_t done, int64_t total, void *user) {
  int *last = user; /* every 10% and at the end */
  int pct = (int)(100 * done / total);
  if (pct / 10 != *last / 10 || done == total) {
    *last = pct;
    vl_progress("data gen: %lld/%lld images", (long long)done, (long long)total);
  }
}

/* The cases' first-use rule (vl_synth_first_use) for data gen too: a set is made only in a
 * new or empty folder, or one holding only what an interrupted generation left; a folder
 * with other files, or with a set already (of any kind: another one would mix with it), is
 * left as it is. 0, or 1 with the message. */
static int out_is_new(const char *dir, const char *manifest) {
  vl_err err;
  bool make = false;
  if (vl_synth_first_use(dir, manifest, NULL, &make, &err) == VL_OK) {
    if (make) return 0;
    vl_err_set(&err, VL_ERR_INVALID, "%s holds a data set already (%s): a set is made only in a new or "
               "empty folder; delete the folder or use another", dir, manifest);
  }
  fprintf(stderr, "vramlab: data gen: --out %s\n", err.msg);
  return 1;
}

/* A generation or a reopen failed: the message, exit status 1. */
static int gen_failed(const char *err) {
  fprintf(stderr, "vramlab: data gen: %s\n", err);
  return 1;
}

static int gen_jpeg(const vl_datagen_opts *o) {
  if (out_is_new(o->out, VL_JPEGSET_MANIFEST)) return 1;
  int last = 0;
  vl_jpegset_gen_cfg g;
  vl_jpegset_gen_cfg_default(&g);
  g.n = o->n;
  g.seed = (uint64_t)o->seed;
  g.quality = o->quality;
  g.progress = progress;
  g.user = &last;
  vl_err err;
  double t0 = vl_now();
  if (vl_jpegset_generate_ex(o->out, &g, &err)) return gen_failed(err.msg);
  double dt = vl_now() - t0;
  vl_jpegset *s;
  if (vl_jpegset_open(&s, o->out, &err)) return gen_failed(err.msg);
  vl_jpegset_info in;
  vl_jpegset_info_get(s, &in);
  printf("%s: %lld images, %.1f KB average, %.1f s (%.0f images/s)\n", o->out, (long long)in.n,
         (double)in.total_bytes / 1e3 / (double)in.n, dt, (double)in.n / dt);
  vl_jpegset_close(s);
  return 0;
}

static int gen_seg(const vl_datagen_opts *o) {
  if (o->size < VL_SEGSET_SIZE_MIN || o->size > VL_SEGSET_SIZE_MAX || o->classes < 2 ||
      o->classes > VL_SEGSET_CLASSES_MAX) {
    fprintf(stderr, "vramlab: data gen --kind seg: --size in %d..%d, --classes in 2..%d (background included)\n",
            VL_SEGSET_SIZE_MIN, VL_SEGSET_SIZE_MAX, VL_SEGSET_CLASSES_MAX);
    return 2;
  }
  if (out_is_new(o->out, VL_SEGSET_MANIFEST)) return 1;
  int last = 0;
  vl_segset_gen_cfg g;
  vl_segset_gen_cfg_default(&g);
  g.n = o->n;
  g.seed = (uint64_t)o->seed;
  g.quality = o->quality;
  g.size = o->size;
  g.num_classes = o->classes;
  g.progress = progress;
  g.user = &last;
  vl_err err;
  double t0 = vl_now();
  if (vl_segset_generate(o->out, &g, &err)) return gen_failed(err.msg);
  double dt = vl_now() - t0;
  vl_segset *s;
  if (vl_segset_open(&s, o->out, &err)) return gen_failed(err.msg);
  vl_segset_info in;
  vl_segset_info_get(s, &in);
  printf("%s: %lld %dx%d images + masks, %d classes, %.1f KB JPEG average, %.1f s (%.0f images/s)\n",
         o->out, (long long)in.n, in.size, in.size, in.num_classes,
         (double)in.total_bytes / 1e3 / (double)in.n, dt, (double)in.n / dt);
  vl_segset_close(s);
  return 0;
}

/* The command line's options carry no size for this set: it is made at the default (512). */
static int gen_captions(const vl_datagen_opts *o) {
  if (out_is_new(o->out, VL_CAPTIONS_MANIFEST)) return 1;
  int last = 0;
  vl_captions_gen_cfg g;
  vl_captions_gen_cfg_default(&g);
  g.n = o->n;
  g.seed = (uint64_t)o->seed;
  g.quality = o->quality;
  g.progress = progress;
  g.user = &last;
  vl_err err;
  double t0 = vl_now();
  if (vl_captions_generate(o->out, &g, &err)) return gen_failed(err.msg);
  double dt = vl_now() - t0;
  vl_captions *s;
  if (vl_captions_open(&s, o->out, &err)) return gen_failed(err.msg);
  vl_captions_info in;
  vl_captions_info_get(s, &in);
  printf("%s: %lld captioned images (short side %d..%d, 1:1..16:9), %.1f KB JPEG average, "
         "%.1f tokens per caption average (77 with padding), %.1f s (%.0f images/s)\n",
         o->out, (long long)in.n, in.size * 3 / 4, in.size * 5 / 4,
         (double)in.total_bytes / 1e3 / (double)in.n, (double)in.total_tokens / (double)in.n, dt,
         (double)in.n / dt);
  vl_captions_close(s);
  return 0;
}

static const vl_dataset_kind kinds[] = {
    {"jpeg", "synthetic photo-like JPEG set (dataloader case)", "--n --seed --quality", gen_jpeg},
    {"seg", "synthetic segmentation set: SxS JPEGs + PGM masks, C classes incl. background (seg-ckpt case)",
     "--n --seed --quality --size --classes", gen_seg},
    {"captions", "synthetic captioned image set: JPEGs around 512 px (short side 384..640, 1:1..16:9) "
     "+ CLIP token ids, 77 per caption (sd-lora case)", "--n --seed --quality", gen_captions},
};

const vl_dataset_kind *vl_dataset_kinds(int *n) {
  *n = (int)(sizeof kinds / sizeof *kinds);
  return kinds;
}

const vl_dataset_kind *vl_dataset_kind_find(const char *kind) {
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
    if (!strcmp(kinds[i].kind, kind)) return &kinds[i];
  return NULL;
}

bool vl_dataset_kind_reads(const vl_dataset_kind *k, const char *opt) {
  size_t n = strlen(opt);
  for (const char *p = strstr(k->options, opt); p; p = strstr(p + 1, opt))
    if ((p == k->options || p[-1] == ' ') && (p[n] == ' ' || !p[n])) return true;
  return false;
}
