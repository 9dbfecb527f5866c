/* vramlab engine core: status codes, dtypes, memory categories, tensors, context.
 * Everything a backend, a layer or a model needs to talk about memory and errors. */
#ifndef VRAMLAB_CORE_H
#define VRAMLAB_CORE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------ */
typedef enum {
  VL_OK = 0,
  VL_ERR_OOM,         /* the arena cap was exceeded: a status, never a crash */
  VL_ERR_INVALID,     /* bad argument or configuration value */
  VL_ERR_IO,          /* file missing, truncated or unwritable */
  VL_ERR_NUMERIC,     /* NaN/Inf where it must not be (e.g. loss) */
  VL_ERR_UNSUPPORTED, /* a combination this backend does not support */
  VL_ERR_BACKEND,     /* CUDA/cuBLAS/OpenBLAS failure */
  VL_ERR_INTERRUPTED, /* SIGINT/SIGTERM seen: the run stopped cleanly */
  VL_ERR_COMM         /* a collective failed or timed out (a peer rank died or hangs) */
} vl_status;

const char *vl_status_name(vl_status s);

/* The one error convention: a function that can fail returns vl_status and leaves one
 * message in a buffer its caller owns: the vl_ctx's (vl_fail) for the engine's model code,
 * a vl_err (vl_err_set) for code that has no context (files, data sets, collectives, the
 * kit and the driver). VL_TRY passes a failure up unchanged; VL_TRY_GOTO stores it in
 * `status` and jumps to `label`, for a function that must free what it holds before
 * returning (status is left alone on success). */
#define VL_ERR_LEN 512
typedef struct {
  char msg[VL_ERR_LEN];
} vl_err;
/* Record a message (printf-style) in e (NULL: none kept) and return s. */
vl_status vl_err_set(vl_err *e, vl_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define VL_TRY(expr)                                                                       \
  do {                                                                                     \
    vl_status vl_try_s_ = (expr);                                                          \
    if (vl_try_s_ != VL_OK) return vl_try_s_;                                              \
  } while (0)
#define VL_TRY_GOTO(status, expr, label)                                                   \
  do {                                                                                     \
    vl_status vl_try_s_ = (expr);                                                          \
    if (vl_try_s_ != VL_OK) {                                                              \
      (status) = vl_try_s_;                                                                \
      goto label;                                                                          \
    }                                                                                      \
  } while (0)

/* ---- dtypes ------------------------------------------------------------------ */
/* Float storage dtypes (fp32, fp16, bf16; nf4 for frozen weights) and VL_I32 for token
 * ids, targets and class masks (4 bytes an element; no op computes in it). */
typedef enum { VL_F32 = 0, VL_F16, VL_BF16, VL_NF4, VL_I32, VL_DTYPE_COUNT } vl_dtype;

const char *vl_dtype_name(vl_dtype d);
/* fp32, fp16 or bf16: a dtype activations and float weights can be stored in */
static inline bool vl_dtype_is_float(vl_dtype d) { return d == VL_F32 || d == VL_F16 || d == VL_BF16; }
int vl_dtype_parse(const char *s, vl_dtype *out); /* 0 on success */
/* Bytes to store n elements. NF4 follows QLoRA: 4-bit codes, one 8-bit absmax code per
 * 64-weight block, one fp32 scale + the fp32 mean per 256 absmax codes (double quant). */
size_t vl_dtype_bytes(vl_dtype d, int64_t n);

/* ---- memory categories ---------------------------------------------------------- */
typedef enum {
  VL_MEM_FROZEN = 0, /* frozen base weights */
  VL_MEM_PARAMS,     /* trainable weights (and their AMP working copies) */
  VL_MEM_GRADS,
  VL_MEM_OPTIM,      /* optimizer state */
  VL_MEM_ACTS,       /* activations kept for backward */
  VL_MEM_TEMP,       /* transient intermediates */
  VL_MEM_WORKSPACE,  /* library scratch (GEMM dequant/convert, cuBLAS workspace) */
  VL_MEM_DATA,       /* input batches on the device */
  VL_MEM_COMM,       /* collective buckets */
  VL_MEM_NCAT
} vl_mem_cat;

const char *vl_mem_cat_name(vl_mem_cat c);

typedef enum { VL_DEV_CPU = 0, VL_DEV_CUDA, VL_DEV_PLAN } vl_device;
const char *vl_device_name(vl_device d);

/* ---- tensors -------------------------------------------------------------------- */
#define VL_MAX_DIMS 4
typedef struct {
  vl_dtype dtype;
  vl_device device;
  vl_mem_cat cat;
  int ndim;
  int64_t shape[VL_MAX_DIMS];
  int64_t stride[VL_MAX_DIMS]; /* in elements, row-major contiguous unless a view */
  int64_t n;                   /* element count */
  size_t bytes;                /* storage bytes (vl_dtype_bytes) */
  size_t off;                  /* offset in the arena; valid when allocated */
  void *data;                  /* NULL on the plan device */
  bool owned;                  /* true when this tensor owns an arena block */
} vl_tensor;

/* ---- arena (see arena.c) ---------------------------------------------------------- */
typedef struct vl_arena vl_arena;

typedef struct {
  size_t cur[VL_MEM_NCAT];
  size_t peak[VL_MEM_NCAT];         /* per-category peak, each on its own */
  size_t at_peak[VL_MEM_NCAT];      /* categories at the moment of the total peak */
  size_t cur_total, peak_total;     /* bytes in live blocks (after alignment) */
  size_t reserved;                  /* high-water extent of the reservation */
  size_t cap;                       /* bytes usable; SIZE_MAX when uncapped */
  size_t free_bytes, largest_free;  /* below the current extent */
  double fragmentation;             /* 1 - largest_free/free_bytes below the extent */
  uint64_t n_alloc, n_free, n_oom;
  uint64_t n_bad_free;              /* frees of offsets that are not live blocks (bugs) */
} vl_mem_stats;

typedef struct {
  double t;       /* seconds since the log was enabled (host clock) */
  int64_t seq;    /* allocation sequence number: a device-free time axis */
  int cat;
  int64_t delta;  /* +bytes on alloc, -bytes on free */
  size_t total;   /* live bytes after this event */
} vl_mem_event;

typedef enum {
  VL_ARENA_VIRTUAL = 0, /* plan: offsets only, no memory */
  VL_ARENA_HOST,        /* one lazily-touched host reservation */
  VL_ARENA_EXTERNAL     /* caller-provided base (e.g. one cudaMalloc of the cap) */
} vl_arena_mode;

#define VL_ARENA_ALIGN 256
#define VL_NO_CAP ((size_t)-1)

/* `cap` bounds the reservation; VL_NO_CAP reserves `no_cap_extent` of address space. */
vl_status vl_arena_create(vl_arena **out, vl_arena_mode mode, size_t cap, void *external_base);
void vl_arena_destroy(vl_arena *a);
vl_status vl_arena_alloc(vl_arena *a, size_t bytes, vl_mem_cat cat, size_t *off);
void vl_arena_free(vl_arena *a, size_t off);
void *vl_arena_base(const vl_arena *a);
void vl_arena_stats(const vl_arena *a, vl_mem_stats *s);
void vl_arena_reset_peaks(vl_arena *a); /* peaks := current */
size_t vl_arena_live_blocks(const vl_arena *a);
void vl_arena_log_enable(vl_arena *a, bool on);
const vl_mem_event *vl_arena_log(const vl_arena *a, size_t *n);
void vl_arena_log_clear(vl_arena *a);

/* ---- RNG (seeded, portable: splitmix64 seeding xoshiro256**) ---------------------- */
typedef struct { uint64_t s[4]; } vl_rng;
void vl_rng_seed(vl_rng *r, uint64_t seed);
/* splitmix64's step: a well-mixed hash of x (seeding, per-item seeds). */
uint64_t vl_mix64(uint64_t x);
uint64_t vl_rng_u64(vl_rng *r);
double vl_rng_uniform(vl_rng *r);        /* [0,1) */
float vl_rng_normal(vl_rng *r);          /* N(0,1), Box-Muller */
/* Move r n draws (vl_rng_u64 calls) on, as n calls would, in at most 64 matrix-vector
 * products over GF(2); 0, or -1 (r unchanged) when the jump table cannot be made. */
int vl_rng_jump(vl_rng *r, uint64_t n);
/* out[i] = scale * vl_rng_normal(r) for i < n, bit for bit as that loop, on every OpenMP
 * thread: segments of the stream start where the loop would reach them (vl_rng_jump), and r
 * ends where the loop leaves it. A 7B model's 7.2e9 draws took minutes on one core. */
void vl_rng_normal_fill(vl_rng *r, float *out, int64_t n, float scale);
uint64_t vl_rng_below(vl_rng *r, uint64_t n);

/* ---- time ------------------------------------------------------------------------ */
double vl_now(void); /* CLOCK_MONOTONIC seconds */

/* ---- context ---------------------------------------------------------------------- */
struct vl_backend;
struct vl_op_profile;
struct vl_param;

typedef struct vl_ctx {
  const struct vl_backend *be;
  void *be_state;        /* the backend's own state (its clocks, streams, handles) */
  vl_arena *arena;
  vl_device device;
  size_t cap;            /* arena cap the context was created with (VL_NO_CAP: none) */
  vl_device plan_target; /* plan device: whose workspace rules to follow (cuda default) */
  char err[512];        /* last error message */
  double flops;         /* model FLOPs counted (recompute excluded) */
  double flops_recompute;
  double bytes_moved;   /* bytes read+written by ops, from their shapes */
  int recomputing;      /* >0 inside a checkpoint's re-run forward */
  bool plan;            /* plan device: ops are counted, never computed (vl_op_run) */
  bool profile;         /* vl_op_run fills prof (ops.h: vl_ctx_profile) */
  struct vl_op_profile *prof; /* VL_OP_COUNT entries, made with the context */
  /* Data parallelism (vramlab/ddp.h). grad_hook: called by vl_grad_ready (nn.h) each time a
   * model has finished writing a parameter's gradient for one micro-batch, so a reducer
   * can start that bucket's allreduce while backward goes on; NULL: nobody listens. */
  void (*grad_hook)(void *user, const struct vl_param *p);
  void *grad_hook_user;
  /* Set (SIGTERM) while a step runs: vl_op_run refuses the next operation with
   * VL_ERR_INTERRUPTED, so a step of minutes stops within one operation (the step in flight
   * is lost; vl_run_loop sets it for the step only). NULL: never. */
  const volatile sig_atomic_t *stop_ops;
} vl_ctx;

/* Create a context for `device` with an arena capped at `cap` bytes. */
vl_status vl_ctx_create(vl_ctx **out, vl_device device, size_t cap);
/* As vl_ctx_create; a plan context follows `plan_target`'s workspace rules. */
vl_status vl_ctx_create_ex(vl_ctx **out, vl_device device, size_t cap, vl_device plan_target);
void vl_ctx_destroy(vl_ctx *c);
/* Record an error message (printf-style) and return `s`. */
vl_status vl_fail(vl_ctx *c, vl_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Add to the context's counters (recompute FLOPs apart). Called by vl_op_run only: every
 * FLOP and byte is an operation's (vramlab/ops.h). */
void vl_count(vl_ctx *c, double flops, double bytes);

/* Allocate a contiguous tensor from the context's arena. On OOM, t is left empty and the
 * context's error says how many bytes were asked for in which category. */
vl_status vl_tensor_alloc(vl_ctx *c, vl_tensor *t, vl_dtype dt, vl_mem_cat cat, int ndim,
                          const int64_t *shape);
vl_status vl_tensor_alloc2(vl_ctx *c, vl_tensor *t, vl_dtype dt, vl_mem_cat cat, int64_t d0,
                           int64_t d1);
void vl_tensor_free(vl_ctx *c, vl_tensor *t);
/* A view of rows [r0, r0+nr) of dim 0 of a contiguous tensor (not owned). */
vl_tensor vl_tensor_rows(const vl_tensor *t, int64_t r0, int64_t nr);
/* A typed view (not owned) of the block of t starting `byte_off` bytes in: dtype dt and the
 * given shape, e.g. the VL_I32 targets stored behind the images of one data block. The
 * caller keeps it inside t. On the plan device data stays NULL; off is always set. */
vl_tensor vl_tensor_view(const vl_tensor *t, size_t byte_off, vl_dtype dt, int ndim,
                         const int64_t *shape);
/* Shape without storage (used by plan math and for views). */
void vl_tensor_set_shape(vl_tensor *t, vl_dtype dt, int ndim, const int64_t *shape);

/* Parse "24GiB", "22.08GB", "512MiB", "1e9" into bytes; 0 on success. */
int vl_parse_bytes(const char *s, size_t *out);
/* Format bytes as "1.23 GiB" into buf. */
const char *vl_fmt_bytes(size_t b, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
