/* Reader of the Stable Diffusion parity fixtures (tests/fixtures/sd_{unet,vae,clip}_parity.bin,
 * written by tests/torch/make_sd_fixture.py, whose docstring documents the format and the
 * record names): named records of float32, float64, int64 or generated float32 values.
 *
 * Test-only code. The CMake rule compiles each tests/test_*.c with tests/testutil.c only, so
 * a test that reads these fixtures does `#include "sd_fixture.c"` (once per executable).
 *
 *   sdfx_file f;
 *   char err[512];
 *   char path[512];
 *   sdfx_fixture_path(path, sizeof path, "sd_unet_parity.bin");
 *   if (sdfx_open(&f, path, err, sizeof err) != 0) fail_msg("%s", err);
 *   float *w = malloc(...);
 *   sdfx_read_f32(&f, "param.conv_in.weight", w, 32 * 4 * 3 * 3, err, sizeof err);
 *   sdfx_close(&f);
 *
 * Every function that can fail returns 0, or -1 with a message naming the file in err. */
#ifndef VRAMLAB_SD_FIXTURE_H
#define VRAMLAB_SD_FIXTURE_H
#include <stddef.h>
#include <stdint.h>

#define SDFX_MAX_DIMS 8
#define SDFX_MAX_BYTES ((size_t)64 << 20) /* a fixture larger than this is refused */
#define SDFX_REGEN "python3 tests/torch/make_sd_fixture.py"

/* Storage types. SDFX_GEN: float32 values regenerated from (seed, base, e), see sdfx_gen. */
typedef enum { SDFX_F32 = 1, SDFX_F64 = 2, SDFX_I64 = 3, SDFX_GEN = 4 } sdfx_dtype;

typedef struct {
  const char *name;           /* NUL-terminated, owned by the sdfx_file */
  sdfx_dtype dtype;
  int ndim;                   /* 0 for a scalar */
  int64_t dims[SDFX_MAX_DIMS];
  int64_t n;                  /* prod(dims); 1 for a scalar */
  const uint8_t *payload;     /* into the file's bytes, unaligned (read through memcpy) */
  uint64_t gen_seed;          /* SDFX_GEN only */
  double gen_base;
  int32_t gen_e;
} sdfx_record;

typedef struct {
  char path[512];
  uint8_t *buf; /* the whole file */
  size_t size;
  int n;        /* records */
  sdfx_record *rec;
  char *names;  /* NUL-terminated copies of the names */
} sdfx_file;

/* path of tests/fixtures/<file> under the source tree (VRAMLAB_SOURCE_DIR when defined). */
void sdfx_fixture_path(char *buf, size_t n, const char *file);

/* Reads and validates the whole file: magic, version, every record's bounds, unique names,
 * the end marker and the checksum. On failure f is left empty (sdfx_close is harmless). */
int sdfx_open(sdfx_file *f, const char *path, char *err, size_t errn);
void sdfx_close(sdfx_file *f);

/* The record called name, or NULL. */
const sdfx_record *sdfx_find(const sdfx_file *f, const char *name);
/* Number of records whose name starts with prefix. */
int sdfx_count_prefix(const sdfx_file *f, const char *prefix);

/* Copies the n values of a float record (float32, float64 or generated) into out, converted
 * (float64 -> float32 rounds to nearest). Fails when the record is missing, is int64, or
 * holds a number of values other than n. */
int sdfx_read_f32(const sdfx_file *f, const char *name, float *out, int64_t n, char *err, size_t errn);
int sdfx_read_f64(const sdfx_file *f, const char *name, double *out, int64_t n, char *err, size_t errn);
/* The values of an int64 record (float records are refused). */
int sdfx_read_i64(const sdfx_file *f, const char *name, int64_t *out, int64_t n, char *err, size_t errn);
/* malloc'd copies of a whole float record (the caller frees), or NULL with err set; *n gets
 * the number of values when n is not NULL. */
float *sdfx_get_f32(const sdfx_file *f, const char *name, int64_t *n, char *err, size_t errn);
double *sdfx_get_f64(const sdfx_file *f, const char *name, int64_t *n, char *err, size_t errn);
/* Whether the record exists with exactly these dims (ndim 0: a scalar). */
int sdfx_check_shape(const sdfx_file *f, const char *name, int ndim, const int64_t *dims, char *err,
                     size_t errn);

/* Value i of a generated record: base + q * 2^(e - 15), q the top 16 bits of splitmix64's
 * i-th output from seed, minus 32768. Exact in float32 for the records the reader accepts. */
double sdfx_gen(uint64_t seed, double base, int32_t e, int64_t i);
/* FNV-1a 64 of n bytes (the file's checksum). */
uint64_t sdfx_fnv1a(const void *p, size_t n);
#endif
