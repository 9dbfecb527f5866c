/* sd-lora's own pieces shared by its files: a rung's settings, its knob table, its step and
 * the modeled accelerator (config.c); the captioned set, the per-sample draws and the
 * loader's config (data.c); the latent and text-embedding cache files (latents.c); the
 * batch sources over the loader or over the caches (feed.c); the timed run (run.c); the loss
 * over the same seeded samples with and without the cache (losscmp.c); the report
 * (sdl_report.c).
 * Every function that can fail returns vl_status with its message in env->err
 * (vl_case_fail). */
#ifndef VRAMLAB_SD_LORA_CASE_H
#define VRAMLAB_SD_LORA_CASE_H

#include "kit/case.h"
#include "datasets/captions.h"
#include "vramlab/cache.h"
#include "vramlab/data.h"
#include "vramlab/mimic.h"
#include "vramlab/sd.h"

typedef enum { VL_SDL_CACHE_NONE = 0, VL_SDL_CACHE_DISK, VL_SDL_CACHE_RAM } vl_sdl_cache;
typedef enum { VL_SDL_MODELED = 0, VL_SDL_MODEL } vl_sdl_consumer;

/* The batch the modeled accelerator's consumer_ms is given for (docs/cases.md §3: batch 16). */
#define VL_SDL_REF_BATCH 16
/* The batch sizes of the memory-vs-batch curves planned at full scale. */
#define VL_SDL_CURVE_N 12

typedef struct {
  vl_sd_cfg model;          /* at the scale parsed; encoders_in_step = (cache none) */
  vl_sdl_cache cache;
  vl_cache_form store;      /* VL_CACHE_MOMENTS (sample per step) or VL_CACHE_SAMPLE (kohya) */
  vl_dtype cache_dtype;     /* VL_F16 or VL_F32 */
  long workers, prefetch, batch, accum; /* batch 0: "max" */
  int batched, drop_last;
  vl_sdl_consumer consumer;
  double consumer_ms;       /* the modeled accelerator's cached step at 512 px, batch 16 */
  vl_case_card card, card48;
  vl_cache_policy on_mismatch;
  long seed, images, epochs, steps, warmup, cores, loss_steps, loss_batch;
  char data_dir[VL_KNOB_VAL_LEN], cache_dir[VL_KNOB_VAL_LEN];
  char loss_scale[8];       /* the loss comparison's scale (tiny, small, full) */
} vl_sdl_rung;

/* ---- config.c ------------------------------------------------------------------------ */
extern const vl_knob_decl vl_sdl_knobs[];
/* Every knob of a rung and the setting at `scale` into r; VL_ERR_INVALID naming the knob. */
vl_status vl_sdl_parse_rung(vl_case_env *env, const char *scale, const vl_knobs *k, vl_sdl_rung *r);
/* The PyTorch mimic of the rung's step (vl_mimic_sd_unet) at `batch` on `dev`, two steps; the
 * caller sets what depends on the card (capacity, cuda_cc_major). */
vl_mimic_sd_unet_cfg vl_sdl_mimic_cfg(const vl_sdl_rung *r, int64_t batch, vl_mimic_device dev);
/* A step of accum micro-batches of B images of the rung's model. */
vl_step_spec vl_sdl_step_spec(const vl_sdl_rung *r, int64_t B);
/* Largest micro-batch whose step fits under cap on a CUDA card (0: none). */
int64_t vl_sdl_max_batch(const vl_sdl_rung *r, size_t cap);
/* FLOPs of the rung's step at full scale (recomputation included) for B images per
 * micro-batch, and of the modeled accelerator's reference: the same step on cached inputs,
 * batch 16, no checkpointing, no text-encoder LoRA. */
vl_status vl_sdl_step_flops(vl_case_env *env, const vl_sdl_rung *full, int64_t B, double *flops, double *ref);
/* The modeled accelerator's seconds per image for rung k at `scale`: consumer_ms x (the
 * rung's full-scale FLOPs per image / the reference's) x (image side / 512)^2. */
vl_status vl_sdl_modeled_s_per_image(vl_case_env *env, const vl_knobs *k, const char *scale, int64_t B,
                                     double *out);
/* The rung's batch at the run scale: "max" is the full-scale planner's answer (0.88 cap),
 * then at most images / 2 so an epoch holds two batches. */
vl_status vl_sdl_run_batch(vl_case_env *env, const vl_knobs *k, const vl_sdl_rung *r, int64_t *B);
const char *vl_sdl_cache_name(vl_sdl_cache c);

/* ---- data.c -------------------------------------------------------------------------- */
/* The captioned set at this scale's image side, made on first use (seeded). */
vl_status vl_sdl_open_set(vl_case_env *env, const vl_sdl_rung *r, vl_captions **out);
/* Caption i as the rung's text encoder takes it: its context length of ids (CLIP's 77 at
 * full scale; the first n_pos at reduced scales), each folded into its vocabulary. */
void vl_sdl_tokens(const vl_captions *set, const vl_sd_cfg *m, int64_t i, int32_t *ids);
/* The per-sample draws of epoch e, seeded by (seed, e, index), identical for every pipeline:
 * the VAE's eps (C, h, w) (NULL: not drawn), the U-Net's noise (C, h, w) and timestep. */
void vl_sdl_draw(uint64_t seed, int64_t epoch, int64_t index, int64_t n_lat, float *vae_eps, float *noise,
                 int32_t *t);
/* z (C, h, w) = scale (mean + exp(logvar / 2) eps) from moments (2C, h, w), the VAE's own
 * kernel body (logvar clamped to [-30, 20]). */
void vl_sdl_sample(const float *moments, const float *eps, int64_t C, int64_t hw, float scale, float *z);
/* The loader over the set: SD's resize, center crop and [-1, 1] at the model's image side,
 * no flip (disabled: the cache holds one variant), batches of B. */
void vl_sdl_loader_cfg(const vl_sdl_rung *r, vl_loader_cfg *lc, int64_t B, int workers, bool shuffle);

/* ---- latents.c: the cache files ------------------------------------------------------- */
typedef struct {
  vl_cache *lat;     /* the rung's stored form (NULL for cache none) */
  vl_cache *text;
  char lat_path[VL_KNOB_VAL_LEN + 192], text_path[VL_KNOB_VAL_LEN + 192];
} vl_sdl_caches;

/* One build's measurements. */
typedef struct {
  bool built;                 /* something was (re)built */
  int64_t images;
  double wall, load, vae, clip, write; /* seconds: whole, decode + transform, encoders, files */
  double open;                /* seconds to open the rung's caches (RAM mode: load them) */
  char why[256];              /* what was found: "missing", "stale: ...", "corrupt: ..." */
} vl_sdl_build;

/* The cache paths of the rung (under cache_dir, per scale, set and stored form). */
vl_status vl_sdl_cache_paths(vl_case_env *env, const vl_sdl_rung *r, vl_cache_form form, char *lat, char *text,
                             size_t n);
/* Open the rung's caches (its stored form and the text embeddings), building what is
 * missing, stale or corrupt first: one VAE pass writes both stored forms (moments and one
 * sample), one text-encoder pass the embeddings; a progress line says why. Under
 * cache_mismatch = error a cache built for another key stops the run naming the field. */
vl_status vl_sdl_caches_open(vl_case_env *env, const vl_sdl_rung *r, vl_captions *set, vl_cache_form form,
                             bool in_ram, vl_sdl_caches *out, vl_sdl_build *b);
void vl_sdl_caches_close(vl_sdl_caches *c);
/* The keys the rung's caches are built for (the encoders' weights read back from c). */
vl_status vl_sdl_cache_keys(vl_case_env *env, const vl_sdl_rung *r, const vl_captions *set, vl_cache_form form,
                            vl_cache_key *lat, vl_cache_key *text);
/* Bytes of a full-scale cache of n images for the stored form and dtype (no weights needed:
 * the format's sizes): latents and text embeddings. */
void vl_sdl_cache_bytes_full(vl_cache_form form, vl_dtype dt, int64_t n, uint64_t *lat, uint64_t *text);

/* ---- feed.c: batch sources ------------------------------------------------------------- */
/* One micro-batch on the host at the run scale, the model's named tensors over it. */
typedef struct {
  int64_t n;        /* samples: B, or fewer for an epoch's last batch without drop_last */
  float *images;    /* (B, 3, H, W)  uncached */
  int32_t *tokens;  /* (B, L)        uncached */
  float *vae_eps;   /* (B, C, h, w)  uncached: the VAE's sample noise */
  float *latents;   /* (B, C, h, w)  cached: z sampled from the moments (or stored) */
  float *context;   /* (B, L, D)     cached */
  float *noise;     /* (B, C, h, w) */
  int32_t *t;       /* (B) */
  int64_t *index;   /* (B) */
  vl_batch batch;
} vl_sdl_micro;

typedef struct vl_sdl_feed vl_sdl_feed;
/* A source of micro-batches of B: the loader over the set (cache none) or parallel reads of
 * the caches (workers, prefetch) with the moments sampled per step. */
vl_status vl_sdl_feed_open(vl_case_env *env, const vl_sdl_rung *r, vl_captions *set, const vl_sdl_caches *caches,
                           int64_t B, bool shuffle, vl_sdl_feed **out);
vl_status vl_sdl_feed_epoch(vl_case_env *env, vl_sdl_feed *f, int64_t epoch);
/* The next micro-batch of the epoch into m (*end at the end of the epoch); *producer: the
 * seconds a producer spent making it (decode + transform, or cache reads + sampling). */
vl_status vl_sdl_feed_next(vl_case_env *env, vl_sdl_feed *f, vl_sdl_micro *m, bool *end, double *producer);
int64_t vl_sdl_feed_batches(const vl_sdl_feed *f); /* micro-batches per epoch */
size_t vl_sdl_feed_host_bytes(const vl_sdl_feed *f); /* its buffers' bound */
void vl_sdl_feed_close(vl_sdl_feed *f);
/* Host arrays of a micro-batch of B for the rung's model (cached or not), and the batch over
 * them (n samples). */
vl_status vl_sdl_micro_alloc(const vl_sd_cfg *m, int64_t B, vl_sdl_micro *mb);
void vl_sdl_micro_bind(const vl_sd_cfg *m, vl_sdl_micro *mb);
void vl_sdl_micro_free(vl_sdl_micro *mb);

/* ---- run.c, losscmp.c, sdl_report.c -------------------------------------------------------- */
/* The modeled accelerator as a vl_model: its step sleeps its seconds per image x the batch's
 * images (wall time, no CPU). */
extern const vl_model_type vl_sdl_modeled_model;
vl_status vl_sdl_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out);
/* After the ladder: the cache build's cost (timed if no rung built it), the payoff epoch,
 * cache sizes for 50k images, the loss with and without the cache (real U-Net steps). */
vl_status vl_sdl_extra(vl_case_env *env, cJSON *res);
void vl_sd_lora_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot);

#endif
