/* dataloader's knobs and what they mean: the knob table, the setting and a rung's knobs as
 * the engine's loader config (scales shrink the data set and the modeled step so CI runs in
 * seconds), and the synthetic JPEG set they name, made on first use. */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "dl.h"

const vl_knob_decl vl_dl_knobs[] = {
    {"workers", "0", "loader worker threads (PyTorch num_workers), or cores (one per core)", VL_KNOB_RUNG},
    {"prefetch", "2", "batches in flight per worker (prefetch_factor)", VL_KNOB_RUNG},
    {"pin", "false", "batches in pinned staging (pin_memory; applies on CUDA only)", VL_KNOB_RUNG},
    {"collate", "per_sample", "per_sample (PyTorch's default) or batched (transform into the batch)",
     VL_KNOB_RUNG},
    {"persistent", "false", "keep worker threads across epochs (persistent_workers)", VL_KNOB_RUNG},
    {"corrupt", "error", "a damaged file in the data: error (stop) or skip (leave it out, counted)",
     VL_KNOB_RUNG},
    {"max_file_bytes", "64MiB", "larger input files are corrupt samples, refused unread", VL_KNOB_RUNG},
    {"images", "384", "synthetic JPEGs in the set (at most 48 at tiny scale)", VL_KNOB_SETTING},
    {"data_seed", "7", "seed of the synthetic set", VL_KNOB_SETTING},
    {"data_dir", "data/jpegset", "where the set is made and read (in n<images>-s<seed>/)", VL_KNOB_SETTING},
    {"batch", "32", "samples per batch (at most 8 at tiny scale); a rung's own value (a side plan's) wins",
     VL_KNOB_SETTING | VL_KNOB_RUNG},
    {"crop", "224", "side of the random-resized crop", VL_KNOB_SETTING},
    {"epochs", "2", "epochs per rung and repetition (the last is reported)", VL_KNOB_SETTING},
    {"seed", "1", "seed of the loader's order and transforms", VL_KNOB_SETTING},
    {"consumer_ms", "40", "the modeled accelerator's step per batch (wall time, no CPU)", VL_KNOB_SETTING},
    {"sweep_workers", "0,1,2,4", "worker counts of the workers x prefetch sweep", VL_KNOB_SETTING},
    {"sweep_prefetch", "1,2,4", "prefetch depths of the sweep", VL_KNOB_SETTING},
    {"cores", "auto", "CPU cores the case assumes for workers=cores, the decode ceiling and CPU use "
     "(auto: this machine's)", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};

static long n_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

vl_status vl_dl_parse(vl_case_env *env, const char *scale, const vl_knobs *k, vl_dl_cfg *d) {
  memset(d, 0, sizeof *d);
  const vl_knobs *s = env->setting;
  vl_loader_cfg_default(&d->lc);
  long v;
  /* pinned by the golden plan test, so a snapshot does not depend on the machine */
  const char *nc = vl_knob_str(s, "cores", vl_dl_knobs);
  if (!strcasecmp(nc, "auto")) d->cores = n_cores();
  else VL_TRY(vl_knob_int(s, "cores", vl_dl_knobs, 1, 4096, &d->cores, &env->err));
  VL_TRY(vl_knob_int(s, "images", vl_dl_knobs, 1, 10000000, &d->images, &env->err));
  if (!strcasecmp(scale, "tiny")) d->images = d->images < 48 ? d->images : 48;
  else if (strcasecmp(scale, "small") && strcasecmp(scale, "full"))
    return vl_case_fail(env, VL_ERR_INVALID, "unknown scale '%s' (tiny, small, full)", scale);
  VL_TRY(vl_knob_int(s, "data_seed", vl_dl_knobs, 0, 1L << 40, &d->data_seed, &env->err));
  /* a rung's batch (a claim's side plan: 003's 500 MB batches) over the setting's */
  VL_TRY(vl_knob_int(vl_knob_get(k, "batch") ? k : s, "batch", vl_dl_knobs, 1, 65536, &v, &env->err));
  d->lc.batch = v;
  if (!strcasecmp(scale, "tiny") && d->lc.batch > 8) d->lc.batch = 8;
  VL_TRY(vl_knob_int(s, "crop", vl_dl_knobs, 8, 4096, &v, &env->err));
  d->lc.crop = (int)v;
  VL_TRY(vl_knob_int(s, "epochs", vl_dl_knobs, 1, 1000, &d->epochs, &env->err));
  VL_TRY(vl_knob_int(s, "seed", vl_dl_knobs, 0, 1L << 40, &v, &env->err));
  d->lc.seed = (uint64_t)v;
  VL_TRY(vl_knob_double(s, "consumer_ms", vl_dl_knobs, 0, 1e6, &d->consumer_ms, &env->err));
  const char *dd = vl_knob_str(s, "data_dir", vl_dl_knobs);
  int dn = snprintf(d->data_dir, sizeof d->data_dir, "%s/n%ld-s%ld", dd, d->images, d->data_seed);
  if (dn < 0 || (size_t)dn >= sizeof d->data_dir)
    return vl_case_fail(env, VL_ERR_INVALID,
                        "data_dir: path too long: %d characters with its n<images>-s<seed> folder (limit %zu)", dn,
                        sizeof d->data_dir - 1);
  /* the sweep is run by extra after the whole ladder: parsed here so a bad list is refused
   * before the first rung runs */
  VL_TRY(vl_knob_int_list(s, "sweep_workers", vl_dl_knobs, 0, VL_LOADER_WORKERS_MAX, d->sweep_w, 16,
                               &d->n_sweep_w, &env->err));
  VL_TRY(vl_knob_int_list(s, "sweep_prefetch", vl_dl_knobs, 1, 1024, d->sweep_p, 16, &d->n_sweep_p, &env->err));
  const char *w = vl_knob_get(k, "workers");
  if (w && !strcasecmp(w, "cores")) d->lc.workers = (int)d->cores;
  else {
    VL_TRY(vl_knob_int(k, "workers", vl_dl_knobs, 0, 1024, &v, &env->err));
    d->lc.workers = (int)v;
  }
  VL_TRY(vl_knob_int(k, "prefetch", vl_dl_knobs, 1, 1024, &v, &env->err));
  d->lc.prefetch = (int)v;
  int b;
  VL_TRY(vl_knob_bool(k, "pin", vl_dl_knobs, &b, &env->err));
  d->pin = b;
  VL_TRY(vl_knob_bool(k, "persistent", vl_dl_knobs, &b, &env->err));
  d->lc.persistent = b;
  const char *c = vl_knob_str(k, "collate", vl_dl_knobs);
  if (!strcasecmp(c, "per_sample")) d->lc.batched_collate = false;
  else if (!strcasecmp(c, "batched")) d->lc.batched_collate = true;
  else return vl_case_fail(env, VL_ERR_INVALID, "collate = '%s': expected per_sample or batched", c);
  /* A shared data set may hold damaged files: fail on the first (error, the default) or
   * leave them out and count them (skip). */
  const char *cp = vl_knob_str(k, "corrupt", vl_dl_knobs);
  if (vl_corrupt_policy_parse(cp, &d->lc.on_corrupt))
    return vl_case_fail(env, VL_ERR_INVALID, "corrupt = '%s': expected skip or error", cp);
  size_t mfb;
  VL_TRY(vl_knob_bytes(k, "max_file_bytes", vl_dl_knobs, &mfb, &env->err));
  d->lc.max_file_bytes = mfb; /* a larger file is a corrupt sample, refused unread */
  d->lc.drop_last = true;
  return VL_OK;
}

/* Open the data set, making it first when it is not there (seeded, so every run of the
 * same setting reads the same bytes). */
vl_status vl_dl_open_data(vl_case_env *env, const vl_dl_cfg *d, vl_jpegset **out) {
  vl_jpegset_gen_cfg g;
  vl_jpegset_gen_cfg_default(&g);
  g.n = d->images;
  g.seed = (uint64_t)d->data_seed;
  g.quality = 90;
  g.progress = vl_case_gen_progress;
  /* Made only in a new or empty folder: a damaged or foreign one is refused, never
   * overwritten. The data set's calls write their message into m. */
  vl_err m = {""};
  bool make = false;
  if (vl_jpegset_first_use(out, d->data_dir, &g, &make, &m) != VL_OK) return vl_case_fail(env, VL_ERR_IO, "%s", m.msg);
  if (!make) return VL_OK;
  vl_progress("generating %ld synthetic JPEGs in %s", d->images, d->data_dir);
  if (vl_jpegset_generate_ex(d->data_dir, &g, &m) || vl_jpegset_open(out, d->data_dir, &m))
    return vl_case_fail(env, VL_ERR_IO, "%s", m.msg);
  return VL_OK;
}
