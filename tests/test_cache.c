/* The on-disk cache of latents and text embeddings (engine/data/cache.c): CRC-32 against
 * its check value and a bitwise reference, key validation and diffs, round trips in fp32
 * (bit-exact), fp16 and bf16 (the storage rounding exactly), moments and sample forms, flip
 * variants; stale keys per field (rebuild and strict), truncation at every boundary and
 * inside records and the header, flipped bytes in the header, a record and a CRC, moved
 * records; two processes building the same cache at once while a third reads; a full disk
 * (a 64 KiB tmpfs in a private mount namespace, and RLIMIT_FSIZE); RAM mode against file
 * mode; the sizes of a 50k-image cache. */
#define _GNU_SOURCE
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/kcommon.h"
#include "vramlab/cache.h"

static vl_ctx *ctx; /* a plan context: messages only */

static int setup(void **state) {
  (void)state;
  if (vl_ctx_create(&ctx, VL_DEV_PLAN, VL_NO_CAP) != VL_OK) return -1;
  return tu_tmpdir(tu_tmp, sizeof tu_tmp, "vlcache");
}

static int teardown(void **state) {
  vl_ctx_destroy(ctx);
  return tu_tmp_teardown(state);
}

/* ---- helpers ---------------------------------------------------------------------------- */

/* A latent key: form, dtype and a (C, h, w) record; SD-like preprocessing. */
static vl_cache_key latent_key(vl_cache_form form, vl_dtype dt, int64_t ch, int64_t h, int64_t w) {
  vl_cache_key k;
  vl_cache_key_init(&k, "latents");
  k.model_hash = 0x5d15ea5e0ddba11ull;
  k.data_hash = 0xda7a5e7ull;
  k.width = k.height = (int32_t)(8 * h);
  k.crop = VL_CACHE_CROP_CENTER;
  for (int i = 0; i < 3; i++) k.norm_mean[i] = k.norm_std[i] = 0.5f;
  k.form = form;
  k.sample_seed = form == VL_CACHE_SAMPLE ? 1234 : 0;
  k.dtype = dt;
  vl_cache_key_shape(&k, 3, (int64_t[]){ch, h, w});
  return k;
}

/* n records of seeded N(0, 2^2) values, record i from seed 1000 * salt + i (malloc'd). */
static float *records(const vl_cache_key *k, int64_t n, uint64_t salt) {
  int64_t e = vl_cache_record_elems(k);
  float *x = malloc((size_t)(n * e) * sizeof(float) + 1);
  assert_non_null(x);
  for (int64_t i = 0; i < n; i++) tu_randn(x + i * e, e, 2.0f, 1000 * salt + (uint64_t)i);
  return x;
}

/* Builds path from x (n records); asserts success. */
static void build(const char *path, const vl_cache_key *k, int64_t n, const float *x) {
  vl_cache_builder *b = NULL;
  int64_t e = vl_cache_record_elems(k);
  assert_int_equal(vl_cache_build_begin(ctx, path, k, n, &b), VL_OK);
  for (int64_t i = 0; i < n; i++) {
    assert_int_equal(vl_cache_build_count(b), i);
    assert_int_equal(vl_cache_build_add(ctx, b, x + i * e), VL_OK);
  }
  assert_int_equal(vl_cache_build_commit(ctx, &b), VL_OK);
  assert_null(b);
}

/* Opens path expecting `want` (n records); returns the state, *out open when valid. */
static vl_cache_state open_as(const char *path, const vl_cache_key *want, int64_t n,
                              vl_cache_policy pol, bool ram, bool verify, vl_cache **out) {
  vl_cache_opts o = {.on_mismatch = pol, .in_ram = ram, .verify = verify};
  vl_cache_state st = VL_CACHE_VALID;
  vl_cache *k = NULL;
  assert_int_equal(vl_cache_open(ctx, path, want, n, &o, &st, &k), VL_OK);
  assert_true((st == VL_CACHE_VALID) == (k != NULL));
  if (out) *out = k;
  else vl_cache_close(k);
  return st;
}

/* Files in dir whose name holds ".tmp.": temporary files left behind. */
static int count_temps(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
  closedir(d);
  return n;
}

static uint64_t file_size(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return (uint64_t)st.st_size;
}

static void sub_dir(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", tu_tmp, name);
  tu_rmtree(buf);
  assert_int_equal(mkdir(buf, 0755), 0);
}

/* ---- CRC-32 and hashes ------------------------------------------------------------------ */

/* CRC-32/ISO-HDLC one bit at a time: the definition, no table. */
static uint32_t crc_bitwise(const uint8_t *p, size_t n) {
  uint32_t r = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    r ^= p[i];
    for (int k = 0; k < 8; k++) r = (r & 1u) ? (r >> 1) ^ 0xedb88320u : r >> 1;
  }
  return ~r;
}

static void test_crc32(void **state) {
  (void)state;
  assert_int_equal(vl_crc32(0, "123456789", 9), 0xcbf43926u); /* the catalogue check value */
  assert_int_equal(vl_crc32(0, "", 0), 0);
  assert_int_equal(vl_crc32(0, "a", 1), 0xe8b7be43u);
  uint8_t buf[1100];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(vl_mix64(i) >> 17);
  /* every length 0..40 and some long ones at every alignment 0..7 (slice-by-8 vs bits) */
  for (size_t off = 0; off < 8; off++) {
    for (size_t n = 0; n <= 40; n++)
      assert_int_equal(vl_crc32(0, buf + off, n), crc_bitwise(buf + off, n));
    assert_int_equal(vl_crc32(0, buf + off, 1024 + off), crc_bitwise(buf + off, 1024 + off));
  }
  /* continuation: crc(a ++ b) from crc(a) */
  for (size_t cut = 0; cut <= 1024; cut += 37)
    assert_int_equal(vl_crc32(vl_crc32(0, buf, cut), buf + cut, 1024 - cut),
                     crc_bitwise(buf, 1024));
}

static void test_hash(void **state) {
  (void)state;
  uint8_t a[64], b[64];
  for (int i = 0; i < 64; i++) a[i] = b[i] = (uint8_t)i;
  assert_true(vl_cache_hash(0, a, 64) == vl_cache_hash(0, b, 64));
  for (int i = 0; i < 64; i += 7) { /* one bit anywhere, the tail included */
    b[i] ^= 4;
    assert_true(vl_cache_hash(0, a, 64) != vl_cache_hash(0, b, 64));
    b[i] ^= 4;
  }
  uint8_t z[3] = {'a', 'b', 0};
  assert_true(vl_cache_hash(0, z, 2) != vl_cache_hash(0, z, 3)); /* the length counts */
  assert_true(vl_cache_hash(0, a, 64) != vl_cache_hash(1, a, 64)); /* and the start */
}

/* ---- keys ----------------------------------------------------------------------------------- */

static void test_key_check(void **state) {
  (void)state;
  vl_cache_key ok = latent_key(VL_CACHE_MOMENTS, VL_F16, 8, 4, 4);
  assert_int_equal(vl_cache_key_check(ctx, &ok), VL_OK);
  vl_cache_key t;
  vl_cache_key_init(&t, "text");
  vl_cache_key_shape(&t, 2, (int64_t[]){77, 768});
  assert_int_equal(vl_cache_key_check(ctx, &t), VL_OK);
  struct { const char *what, *msg; vl_cache_key k; } bad[12];
  int n = 0;
#define BAD(what_, msg_, stmt)                                                             \
  do {                                                                                     \
    bad[n].what = what_;                                                                   \
    bad[n].msg = msg_;                                                                     \
    bad[n].k = ok;                                                                         \
    vl_cache_key *k = &bad[n].k;                                                           \
    stmt;                                                                                  \
    n++;                                                                                   \
  } while (0)
  BAD("empty kind", "kind", k->kind[0] = 0);
  BAD("unterminated kind", "kind", memset(k->kind, 'x', sizeof k->kind));
  BAD("form", "form", k->form = VL_CACHE_FORM_COUNT);
  BAD("crop", "crop", k->crop = -1);
  BAD("flip 3", "flip_variants", k->flip_variants = 3);
  BAD("flip 0", "flip_variants", k->flip_variants = 0);
  BAD("nf4", "dtype", k->dtype = VL_NF4);
  BAD("rank 0", "rank", k->ndim = 0);
  BAD("dim 0", "dim 1", k->shape[1] = 0);
  BAD("odd moments", "even", k->shape[0] = 7);
  BAD("seed on moments", "sample_seed", k->sample_seed = 5);
  BAD("unused dim", "unused dim 3", k->shape[3] = 2);
#undef BAD
  for (int i = 0; i < n; i++) {
    ctx->err[0] = 0;
    if (vl_cache_key_check(ctx, &bad[i].k) != VL_ERR_INVALID || !strstr(ctx->err, bad[i].msg))
      fail_msg("%s: not refused as expected (message: %s)", bad[i].what, ctx->err);
    /* a builder refuses it as well */
    vl_cache_builder *b = (vl_cache_builder *)1;
    char p[512];
    tu_join(p, sizeof p, tu_tmp, "never.bin");
    assert_int_equal(vl_cache_build_begin(ctx, p, &bad[i].k, 1, &b), VL_ERR_INVALID);
    assert_null(b);
    assert_int_equal(access(p, F_OK), -1);
  }
}

/* ---- round trips --------------------------------------------------------------------------- */

/* Builds and reads back n records of key k: fp32 values come back bit-exact, fp16/bf16 as
 * exactly the stored rounding; raw reads are the stored bits; sizes add up. */
static void round_trip(const vl_cache_key *k, int64_t n, const char *name) {
  char path[512];
  tu_join(path, sizeof path, tu_tmp, name);
  float *x = records(k, n, 1);
  build(path, k, n, x);
  int64_t e = vl_cache_record_elems(k);
  size_t pb = vl_cache_record_bytes(k);
  assert_int_equal(pb, vl_dtype_bytes(k->dtype, e));
  assert_int_equal(file_size(path), vl_cache_file_bytes(k, n));
  assert_int_equal(file_size(path), VL_CACHE_HEADER_BYTES + (uint64_t)n * (pb + 4));
  vl_cache *c = NULL;
  assert_int_equal(open_as(path, k, n, VL_CACHE_STRICT, false, true, &c), VL_CACHE_VALID);
  assert_int_equal(vl_cache_count(c), n);
  assert_int_equal(vl_cache_disk_bytes(c), file_size(path));
  assert_int_equal(vl_cache_ram_bytes(c), 0);
  assert_null(vl_cache_key_diff(vl_cache_key_of(c), k, NULL, 0));
  float *got = malloc((size_t)e * sizeof(float));
  uint8_t *raw = malloc(pb);
  int64_t inexact = 0;
  for (int64_t i = 0; i < n; i++) {
    const float *xi = x + i * e;
    assert_int_equal(vl_cache_read(ctx, c, i, got), VL_OK);
    assert_int_equal(vl_cache_read_raw(ctx, c, i, raw), VL_OK);
    for (int64_t j = 0; j < e; j++) {
      float want = vl_round_to((int)k->dtype, xi[j]);
      if (memcmp(&got[j], &want, 4) != 0)
        fail_msg("%s record %lld elem %lld: %.9g, stored %s should give %.9g", name,
                 (long long)i, (long long)j, got[j], vl_dtype_name(k->dtype), want);
      if (vl_ld(raw, (int)k->dtype, j) != want)
        fail_msg("%s: raw record %lld elem %lld", name, (long long)i, (long long)j);
      inexact += got[j] != xi[j];
    }
  }
  /* fp32 exact; fp16/bf16 round almost every random value (the rounding is really applied) */
  if (k->dtype == VL_F32) assert_int_equal(inexact, 0);
  else assert_true(inexact > n * e / 2);
  free(got);
  free(raw);
  free(x);
  vl_cache_close(c);
  assert_int_equal(count_temps(tu_tmp), 0);
}

static void test_round_trip_f32_moments(void **state) {
  (void)state;
  vl_cache_key k = latent_key(VL_CACHE_MOMENTS, VL_F32, 8, 8, 8); /* (2C, h, w) */
  round_trip(&k, 13, "m32.bin");
}

static void test_round_trip_f16_sample(void **state) {
  (void)state;
  vl_cache_key k = latent_key(VL_CACHE_SAMPLE, VL_F16, 4, 8, 8);
  round_trip(&k, 9, "s16.bin");
  k.form = VL_CACHE_MOMENTS;
  k.sample_seed = 0;
  k.shape[0] = 8;
  round_trip(&k, 5, "m16.bin");
}

static void test_round_trip_bf16_text_flip(void **state) {
  (void)state;
  vl_cache_key t;
  vl_cache_key_init(&t, "text");
  t.dtype = VL_BF16;
  vl_cache_key_shape(&t, 2, (int64_t[]){7, 24}); /* (tokens, hidden): a small CLIP */
  round_trip(&t, 6, "t16.bin");
  /* flip augmentation cached: 2 records per image (as is, mirrored) */
  vl_cache_key k = latent_key(VL_CACHE_MOMENTS, VL_F16, 8, 4, 4);
  k.flip_variants = 2;
  round_trip(&k, 2 * 5, "flip.bin");
}

/* Zero records: a valid empty cache. Fewer records than promised: commit refuses, nothing
 * is left; one record too many: refused. */
static void test_commit_rules(void **state) {
  (void)state;
  char path[512];
  tu_join(path, sizeof path, tu_tmp, "rules.bin");
  vl_cache_key k = latent_key(VL_CACHE_SAMPLE, VL_F16, 4, 2, 2);
  float *x = records(&k, 3, 2);
  build(path, &k, 0, x);
  assert_int_equal(open_as(path, &k, 0, VL_CACHE_STRICT, true, true, NULL), VL_CACHE_VALID);
  unlink(path);
  vl_cache_builder *b = NULL;
  assert_int_equal(vl_cache_build_begin(ctx, path, &k, 3, &b), VL_OK);
  assert_int_equal(count_temps(tu_tmp), 1);
  assert_int_equal(vl_cache_build_add(ctx, b, x), VL_OK);
  assert_int_equal(vl_cache_build_commit(ctx, &b), VL_ERR_INVALID);
  assert_non_null(strstr(ctx->err, "1 of 3 records"));
  assert_null(b);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(count_temps(tu_tmp), 0);
  assert_int_equal(vl_cache_build_begin(ctx, path, &k, 1, &b), VL_OK);
  assert_int_equal(vl_cache_build_add(ctx, b, x), VL_OK);
  assert_int_equal(vl_cache_build_add(ctx, b, x), VL_ERR_INVALID);
  vl_cache_build_abort(&b);
  assert_null(b);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(count_temps(tu_tmp), 0);
  /* missing file; a folder at the path is an I/O error, not a rebuild */
  assert_int_equal(open_as(path, &k, -1, VL_CACHE_STRICT, false, false, NULL), VL_CACHE_MISSING);
  assert_int_equal(mkdir(path, 0755), 0);
  vl_cache_state st;
  vl_cache *c = NULL;
  assert_int_equal(vl_cache_open(ctx, path, &k, -1, NULL, &st, &c), VL_ERR_IO);
  assert_null(c);
  assert_non_null(strstr(ctx->err, "not a regular file"));
  rmdir(path);
  free(x);
}

/* ---- stale keys ------------------------------------------------------------------------------ */

static void test_key_mismatch(void **state) {
  (void)state;
  char path[512];
  tu_join(path, sizeof path, tu_tmp, "key.bin");
  vl_cache_key k = latent_key(VL_CACHE_SAMPLE, VL_F16, 4, 4, 4);
  const int64_t n = 3;
  float *x = records(&k, n, 3);
  build(path, &k, n, x);
  assert_int_equal(open_as(path, &k, n, VL_CACHE_STRICT, false, false, NULL), VL_CACHE_VALID);
  assert_int_equal(open_as(path, &k, -1, VL_CACHE_STRICT, false, false, NULL), VL_CACHE_VALID);
  struct { const char *field; vl_cache_key k; } v[16];
  int m = 0;
#define VAR(field_, stmt)                                                                  \
  do {                                                                                     \
    v[m].field = field_;                                                                   \
    v[m].k = k;                                                                            \
    vl_cache_key *w = &v[m].k;                                                             \
    stmt;                                                                                  \
    m++;                                                                                   \
  } while (0)
  VAR("kind", snprintf(w->kind, sizeof w->kind, "text"));
  VAR("model_hash", w->model_hash ^= 1);
  VAR("data_hash", w->data_hash += 1);
  VAR("width", w->width = 768);
  VAR("height", w->height = 768);
  VAR("crop", w->crop = VL_CACHE_CROP_NONE);
  VAR("flip_variants", w->flip_variants = 2);
  VAR("norm_mean", w->norm_mean[1] = 0.456f);
  VAR("norm_std", w->norm_std[2] = 0.225f);
  VAR("latent_scale", w->latent_scale = 0.18215f);
  VAR("form", (w->form = VL_CACHE_MOMENTS, w->sample_seed = 0, w->shape[0] = 8));
  VAR("sample_seed", w->sample_seed = 1235);
  VAR("dtype", w->dtype = VL_F32);
  VAR("shape", w->shape[2] = 5);
  VAR("shape", (w->ndim = 2, w->shape[2] = 0));
#undef VAR
  for (int i = 0; i < m; i++) {
    vl_cache_key *w = &v[i].k;
    assert_int_equal(vl_cache_key_check(ctx, w), VL_OK);
    char msg[256];
    const char *f = vl_cache_key_diff(&k, w, msg, sizeof msg);
    if (!f || strcmp(f, v[i].field) != 0)
      fail_msg("diff names %s, not %s", f ? f : "nothing", v[i].field);
    assert_int_equal(strncmp(msg, v[i].field, strlen(v[i].field)), 0);
    /* rebuild policy: VL_OK, stale, the field in the message */
    ctx->err[0] = 0;
    assert_int_equal(open_as(path, w, n, VL_CACHE_REBUILD, false, false, NULL), VL_CACHE_STALE);
    char need[64];
    snprintf(need, sizeof need, "key differs in %s", v[i].field);
    if (!strstr(ctx->err, need)) fail_msg("stale message lacks '%s': %s", need, ctx->err);
    /* strict: an error naming the field */
    vl_cache_opts o = {.on_mismatch = VL_CACHE_STRICT, .in_ram = true, .verify = true};
    vl_cache_state st = VL_CACHE_VALID;
    vl_cache *c = (vl_cache *)1;
    assert_int_equal(vl_cache_open(ctx, path, w, n, &o, &st, &c), VL_ERR_INVALID);
    assert_null(c);
    assert_int_equal(st, VL_CACHE_STALE);
    snprintf(need, sizeof need, "built for another %s", v[i].field);
    if (!strstr(ctx->err, need)) fail_msg("strict message lacks '%s': %s", need, ctx->err);
  }
  /* the record count is part of what is expected */
  assert_int_equal(open_as(path, &k, n + 1, VL_CACHE_REBUILD, false, false, NULL), VL_CACHE_STALE);
  assert_non_null(strstr(ctx->err, "key differs in records"));
  vl_cache_opts o = {.on_mismatch = VL_CACHE_STRICT, .in_ram = false, .verify = false};
  vl_cache_state st;
  vl_cache *c = NULL;
  assert_int_equal(vl_cache_open(ctx, path, &k, n - 1, &o, &st, &c), VL_ERR_INVALID);
  assert_non_null(strstr(ctx->err, "another records"));
  free(x);
}

/* ---- truncation and corruption ------------------------------------------------------------- */

/* A fresh file each time: rewriting one in place (O_TRUNC) makes ext4 flush it on close
 * (auto_da_alloc), 3 ms a copy. */
static void fresh_copy(const char *dst, const uint8_t *src, size_t n) {
  unlink(dst);
  tu_write_bytes(dst, src, n);
}

static void test_truncation(void **state) {
  (void)state;
  char path[512], cut[512];
  tu_join(path, sizeof path, tu_tmp, "trunc.bin");
  tu_join(cut, sizeof cut, tu_tmp, "cut.bin");
  vl_cache_key k = latent_key(VL_CACHE_MOMENTS, VL_F16, 2, 3, 5); /* 60-byte payloads */
  const int64_t n = 4;
  float *x = records(&k, n, 4);
  build(path, &k, n, x);
  uint8_t *full;
  size_t size = tu_slurp(path, &full);
  const size_t H = VL_CACHE_HEADER_BYTES, P = vl_cache_record_bytes(&k), S = P + 4;
  assert_int_equal(size, H + n * S);
  size_t lens[64];
  int m = 0;
  size_t in_header[] = {0, 1, 7, 8, 100, 144, 251, 252, 255};
  for (size_t i = 0; i < sizeof in_header / sizeof *in_header; i++) lens[m++] = in_header[i];
  for (int64_t r = 0; r < n; r++) {
    lens[m++] = H + (size_t)r * S;               /* at a record boundary */
    lens[m++] = H + (size_t)r * S + 1;           /* inside the payload */
    lens[m++] = H + (size_t)r * S + P / 2;
    lens[m++] = H + (size_t)r * S + P;           /* payload whole, CRC missing */
    lens[m++] = H + (size_t)r * S + P + 3;       /* one CRC byte missing */
  }
  int corrupt = 0;
  for (int i = 0; i < m; i++) {
    fresh_copy(cut, full, lens[i]);
    for (int pol = 0; pol < 2; pol++)
      for (int want_n = 0; want_n < 2; want_n++) {
        ctx->err[0] = 0;
        /* rebuild policy in file mode, strict in RAM mode; expected count or any */
        vl_cache_state st = open_as(cut, &k, want_n ? n : -1,
                                    pol ? VL_CACHE_STRICT : VL_CACHE_REBUILD, pol, false, NULL);
        if (st != VL_CACHE_CORRUPT)
          fail_msg("%zu of %zu bytes: %s", lens[i], size, vl_cache_state_name(st));
        if (!strstr(ctx->err, "truncated") && !strstr(ctx->err, "magic") &&
            !strstr(ctx->err, "header CRC"))
          fail_msg("%zu bytes: message %s", lens[i], ctx->err);
        corrupt++;
      }
  }
  /* bytes past the end are corrupt too */
  uint8_t *longer = malloc(size + S);
  memcpy(longer, full, size);
  memset(longer + size, 0, S);
  for (size_t extra = 1; extra <= S; extra += S - 1) {
    fresh_copy(cut, longer, size + extra);
    assert_int_equal(open_as(cut, &k, n, VL_CACHE_REBUILD, false, false, NULL), VL_CACHE_CORRUPT);
    assert_non_null(strstr(ctx->err, "trailing bytes"));
  }
  printf("  truncation: %d cuts x 4 opens, all corrupt (file of %zu bytes)\n", m, size);
  assert_int_equal(corrupt, 4 * m);
  /* cut after a successful open (file mode): the missing records fail to read, by name */
  vl_cache *c = NULL;
  assert_int_equal(open_as(path, &k, n, VL_CACHE_STRICT, false, false, &c), VL_CACHE_VALID);
  assert_int_equal(truncate(path, (off_t)(H + 2 * S + 5)), 0);
  float *got = malloc((size_t)vl_cache_record_elems(&k) * sizeof(float));
  assert_int_equal(vl_cache_read(ctx, c, 1, got), VL_OK);
  for (int64_t r = 2; r < n; r++) {
    got[0] = 42.0f;
    assert_int_equal(vl_cache_read(ctx, c, r, got), VL_ERR_IO);
    char need[64];
    snprintf(need, sizeof need, "record %lld of %lld", (long long)r, (long long)n);
    if (!strstr(ctx->err, need) || !strstr(ctx->err, "short read"))
      fail_msg("message: %s", ctx->err);
    assert_true(got[0] == 0.0f); /* never data */
  }
  vl_cache_close(c);
  free(got);
  free(longer);
  free(full);
  free(x);
}

/* Writes src with byte off xor mask to dst. */
static void flipped_copy(const char *dst, const uint8_t *src, size_t n, size_t off, uint8_t mask) {
  uint8_t *t = malloc(n);
  memcpy(t, src, n);
  t[off] ^= mask;
  fresh_copy(dst, t, n);
  free(t);
}

/* A corrupt record: file mode opens (header fine) and fails exactly that record's read;
 * verify and RAM mode refuse the file at open, naming the record. */
static void expect_bad_record(const char *p, const vl_cache_key *k, int64_t n, int64_t bad) {
  vl_cache *c = NULL;
  assert_int_equal(open_as(p, k, n, VL_CACHE_STRICT, false, false, &c), VL_CACHE_VALID);
  int64_t e = vl_cache_record_elems(k);
  float *got = malloc((size_t)e * sizeof(float));
  char need[64];
  snprintf(need, sizeof need, "record %lld of %lld", (long long)bad, (long long)n);
  for (int64_t r = 0; r < n; r++) {
    for (int64_t j = 0; j < e; j++) got[j] = 7.0f;
    vl_status s = vl_cache_read(ctx, c, r, got);
    if (r != bad) {
      assert_int_equal(s, VL_OK);
      continue;
    }
    assert_int_equal(s, VL_ERR_IO);
    if (!strstr(ctx->err, need) || !strstr(ctx->err, "CRC mismatch"))
      fail_msg("message: %s", ctx->err);
    for (int64_t j = 0; j < e; j++) assert_true(got[j] == 0.0f);
  }
  vl_cache_close(c);
  free(got);
  for (int ram = 0; ram < 2; ram++) {
    ctx->err[0] = 0;
    assert_int_equal(open_as(p, k, n, VL_CACHE_REBUILD, ram, !ram, NULL), VL_CACHE_CORRUPT);
    if (!strstr(ctx->err, need)) fail_msg("%s mode: message %s", ram ? "RAM" : "verify", ctx->err);
  }
}

static void test_flipped_bytes(void **state) {
  (void)state;
  char path[512], bad[512];
  tu_join(path, sizeof path, tu_tmp, "flip.bin");
  tu_join(bad, sizeof bad, tu_tmp, "bad.bin");
  vl_cache_key k = latent_key(VL_CACHE_SAMPLE, VL_F32, 4, 2, 4); /* 128-byte payloads */
  const int64_t n = 5;
  float *x = records(&k, n, 5);
  build(path, &k, n, x);
  uint8_t *full;
  size_t size = tu_slurp(path, &full);
  const size_t H = VL_CACHE_HEADER_BYTES, P = vl_cache_record_bytes(&k), S = P + 4;
  /* every header byte, two masks: never valid, never merely stale */
  for (size_t off = 0; off < H; off++)
    for (int mk = 0; mk < 2; mk++) {
      flipped_copy(bad, full, size, off, mk ? 0x80 : 0x01);
      vl_cache_state st = open_as(bad, &k, n, VL_CACHE_STRICT, false, false, NULL);
      if (st != VL_CACHE_CORRUPT) fail_msg("header byte %zu: %s", off, vl_cache_state_name(st));
    }
  /* a payload byte of record 2 (first, middle, last), a CRC byte of record 3 */
  size_t poffs[3] = {0, P / 2 + 1, P - 1};
  for (int i = 0; i < 3; i++) {
    flipped_copy(bad, full, size, H + 2 * S + poffs[i], 0x10);
    expect_bad_record(bad, &k, n, 2);
  }
  for (int b = 0; b < 4; b++) {
    flipped_copy(bad, full, size, H + 3 * S + P + (size_t)b, 0x04);
    expect_bad_record(bad, &k, n, 3);
  }
  /* records 1 and 4 swapped, each with its own valid CRC: the index in the CRC catches it */
  uint8_t *sw = malloc(size);
  memcpy(sw, full, size);
  memcpy(sw + H + 1 * S, full + H + 4 * S, S);
  memcpy(sw + H + 4 * S, full + H + 1 * S, S);
  fresh_copy(bad, sw, size);
  vl_cache *c = NULL;
  assert_int_equal(open_as(bad, &k, n, VL_CACHE_STRICT, false, false, &c), VL_CACHE_VALID);
  float *got = malloc(P);
  assert_int_equal(vl_cache_read(ctx, c, 0, got), VL_OK);
  assert_int_equal(vl_cache_read(ctx, c, 1, got), VL_ERR_IO);
  assert_int_equal(vl_cache_read(ctx, c, 4, got), VL_ERR_IO);
  assert_int_equal(vl_cache_read(ctx, c, 5, got), VL_ERR_INVALID); /* out of range */
  vl_cache_close(c);
  free(got);
  free(sw);
  free(full);
  free(x);
}

/* ---- RAM mode ---------------------------------------------------------------------------- */

static void test_ram_equals_file(void **state) {
  (void)state;
  char path[512];
  tu_join(path, sizeof path, tu_tmp, "ram.bin");
  /* 4 KiB records, 2.4 MB: RAM mode loads it in three 1 MiB chunks, the last one partial */
  vl_cache_key k = latent_key(VL_CACHE_MOMENTS, VL_F16, 8, 16, 16);
  const int64_t n = 600;
  float *x = records(&k, n, 6);
  build(path, &k, n, x);
  vl_cache *f = NULL, *r = NULL;
  assert_int_equal(open_as(path, &k, n, VL_CACHE_STRICT, false, false, &f), VL_CACHE_VALID);
  assert_int_equal(open_as(path, &k, n, VL_CACHE_STRICT, true, false, &r), VL_CACHE_VALID);
  const size_t P = vl_cache_record_bytes(&k);
  assert_int_equal(vl_cache_ram_bytes(r), (uint64_t)n * P);
  assert_int_equal(vl_cache_ram_bytes(f), 0);
  assert_int_equal(vl_cache_disk_bytes(r), vl_cache_file_bytes(&k, n));
  assert_int_equal(vl_cache_disk_bytes(f), vl_cache_file_bytes(&k, n));
  /* the RAM reader no longer needs the file */
  assert_int_equal(unlink(path), 0);
  int64_t e = vl_cache_record_elems(&k);
  float *a = malloc((size_t)e * 4), *b = malloc((size_t)e * 4);
  uint8_t *ra = malloc(P), *rb = malloc(P);
  for (int64_t i = n - 1; i >= 0; i--) { /* any order */
    assert_int_equal(vl_cache_read(ctx, f, i, a), VL_OK);
    assert_int_equal(vl_cache_read(ctx, r, i, b), VL_OK);
    assert_memory_equal(a, b, (size_t)e * 4);
    assert_int_equal(vl_cache_read_raw(ctx, f, i, ra), VL_OK);
    assert_int_equal(vl_cache_read_raw(ctx, r, i, rb), VL_OK);
    assert_memory_equal(ra, rb, P);
    for (int64_t j = 0; j < e; j++) assert_true(b[j] == vl_round_to(VL_K_F16, x[i * e + j]));
  }
  vl_cache_close(f);
  vl_cache_close(r);
  /* a bad CRC in the last chunk is found and named by the RAM load */
  build(path, &k, n, x);
  uint8_t *full;
  size_t size = tu_slurp(path, &full);
  flipped_copy(path, full, size, size - 4 - P / 3, 0x20);
  assert_int_equal(open_as(path, &k, n, VL_CACHE_STRICT, true, false, NULL), VL_CACHE_CORRUPT);
  assert_non_null(strstr(ctx->err, "record 599 of 600"));
  free(full);
  free(a);
  free(b);
  free(ra);
  free(rb);
  free(x);
}

/* ---- concurrency -------------------------------------------------------------------------- */

/* Child: waits on the pipe, builds path from the same seeded records, exits 0 on success. */
static void child_build(int rfd, const char *path, const vl_cache_key *k, int64_t n) {
  char go;
  if (read(rfd, &go, 1) != 1) _exit(2);
  int64_t e = vl_cache_record_elems(k);
  float *x = malloc((size_t)e * sizeof(float));
  vl_cache_builder *b = NULL;
  if (vl_cache_build_begin(NULL, path, k, n, &b) != VL_OK) _exit(3);
  for (int64_t i = 0; i < n; i++) {
    tu_randn(x, e, 2.0f, 7000 + (uint64_t)i);
    if (vl_cache_build_add(NULL, b, x) != VL_OK) _exit(4);
  }
  _exit(vl_cache_build_commit(NULL, &b) == VL_OK ? 0 : 5);
}

static void test_two_builders(void **state) {
  (void)state;
  char dir[512], path[512];
  sub_dir(dir, sizeof dir, "race");
  tu_join(path, sizeof path, dir, "latents.cache");
  vl_cache_key k = latent_key(VL_CACHE_SAMPLE, VL_F16, 4, 32, 32); /* 8 KiB records */
  const int64_t n = 96;
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t kids[2];
  for (int i = 0; i < 2; i++) {
    kids[i] = fork();
    assert_true(kids[i] >= 0);
    if (kids[i] == 0) {
      close(p[1]);
      child_build(p[0], path, &k, n);
    }
  }
  close(p[0]);
  tu_watchdog(30, "two builders");
  assert_int_equal(write(p[1], "gg", 2), 2); /* both start at once */
  close(p[1]);
  /* read meanwhile: never a partial file */
  int done = 0, status[2] = {-1, -1}, opens[4] = {0};
  float *got = malloc((size_t)vl_cache_record_elems(&k) * sizeof(float));
  while (done < 2) {
    for (int i = 0; i < 2; i++) {
      int ws = 0;
      if (status[i] == -1 && waitpid(kids[i], &ws, WNOHANG) == kids[i]) {
        status[i] = ws;
        done++;
      }
    }
    vl_cache *c = NULL;
    vl_cache_state st = open_as(path, &k, n, VL_CACHE_STRICT, false, false, &c);
    if (st != VL_CACHE_VALID && st != VL_CACHE_MISSING)
      fail_msg("a reader saw a %s cache: %s", vl_cache_state_name(st), ctx->err);
    opens[st]++;
    if (c) assert_int_equal(vl_cache_read(ctx, c, n - 1, got), VL_OK);
    vl_cache_close(c);
  }
  tu_watchdog(0, NULL);
  for (int i = 0; i < 2; i++) {
    assert_true(WIFEXITED(status[i]));
    assert_int_equal(WEXITSTATUS(status[i]), 0);
  }
  printf("  two builders: reader opened %d times: %d missing, %d valid, 0 partial\n",
         opens[0] + opens[1], opens[VL_CACHE_MISSING], opens[VL_CACHE_VALID]);
  /* the result: one valid file with the records, no temporary file */
  vl_cache *c = NULL;
  assert_int_equal(open_as(path, &k, n, VL_CACHE_STRICT, true, false, &c), VL_CACHE_VALID);
  int64_t e = vl_cache_record_elems(&k);
  float *want = malloc((size_t)e * sizeof(float));
  for (int64_t i = 0; i < n; i++) {
    tu_randn(want, e, 2.0f, 7000 + (uint64_t)i);
    assert_int_equal(vl_cache_read(ctx, c, i, got), VL_OK);
    for (int64_t j = 0; j < e; j++) assert_true(got[j] == vl_round_to(VL_K_F16, want[j]));
  }
  vl_cache_close(c);
  assert_int_equal(count_temps(dir), 0);
  assert_int_equal(tu_count_entries(dir), 1);
  free(want);
  free(got);
}

/* The temporary-name host field, as cache.c makes it. */
static void host_tag(char *buf, size_t n) {
  char h[65] = {0};
  if (gethostname(h, sizeof h - 1) != 0 || !h[0]) snprintf(h, sizeof h, "host");
  size_t i = 0;
  for (; h[i] && i + 1 < n; i++) {
    char ch = h[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '_';
    buf[i] = ok ? ch : '_';
  }
  buf[i] = 0;
}

/* A crashed builder's temporary file (its pid gone) is removed by the next builder of the
 * same path; a live process's and another cache's are left alone. */
static void test_dead_temp_removed(void **state) {
  (void)state;
  char dir[512], path[512], dead[600], live[600], other[600], host[64];
  sub_dir(dir, sizeof dir, "stale");
  tu_join(path, sizeof path, dir, "c.bin");
  host_tag(host, sizeof host);
  pid_t gone = fork();
  assert_true(gone >= 0);
  if (gone == 0) _exit(0);
  assert_int_equal(waitpid(gone, NULL, 0), gone);
  snprintf(dead, sizeof dead, "%s/.c.bin.tmp.%s.%ld.0", dir, host, (long)gone);
  snprintf(live, sizeof live, "%s/.c.bin.tmp.%s.%ld.3", dir, host, (long)getppid());
  snprintf(other, sizeof other, "%s/.d.bin.tmp.%s.%ld.0", dir, host, (long)gone);
  tu_write_text(dead, "partial");
  tu_write_text(live, "partial");
  tu_write_text(other, "partial");
  vl_cache_key k = latent_key(VL_CACHE_SAMPLE, VL_F16, 4, 2, 2);
  vl_cache_builder *b = NULL;
  assert_int_equal(vl_cache_build_begin(ctx, path, &k, 1, &b), VL_OK);
  vl_cache_build_abort(&b);
  assert_int_equal(access(dead, F_OK), -1);
  assert_int_equal(access(live, F_OK), 0);
  assert_int_equal(access(other, F_OK), 0);
  assert_int_equal(tu_count_entries(dir), 2);
}

/* ---- a full disk ---------------------------------------------------------------------------- */

/* Builds n records of k at path; the status of the first failing call, and which call. */
static vl_status try_build(const char *path, const vl_cache_key *k, int64_t n, const char **where) {
  int64_t e = vl_cache_record_elems(k);
  float *x = calloc((size_t)e, sizeof(float));
  vl_cache_builder *b = NULL;
  vl_status s = vl_cache_build_begin(ctx, path, k, n, &b);
  *where = "begin";
  for (int64_t i = 0; s == VL_OK && i < n; i++) {
    s = vl_cache_build_add(ctx, b, x);
    *where = "add";
  }
  if (s == VL_OK) {
    s = vl_cache_build_commit(ctx, &b);
    *where = "commit";
  }
  vl_cache_build_abort(&b);
  free(x);
  return s;
}

/* Child-side check: prints and exits non-zero when cond fails. */
#define CHILD_CHECK(cond, ...)                                                             \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "  child: " __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                               \
      _exit(1);                                                                            \
    }                                                                                      \
  } while (0)

/* In a child: a 64 KiB tmpfs mounted in a private mount namespace (gone with the child).
 * A 100 KiB cache fails at once with ENOSPC (the space is reserved up front); so does a
 * 32 KiB one once a filler file took 48 KiB; nothing is left in either case, and a cache
 * that fits is built. Exit 77 when namespaces or mounts are not allowed (not root). */
static void tmpfs_child(const char *dir) {
  if (unshare(CLONE_NEWNS) != 0) _exit(77);
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) _exit(77);
  if (mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) _exit(77);
  char path[600], filler[600];
  snprintf(path, sizeof path, "%s/latents.cache", dir);
  snprintf(filler, sizeof filler, "%s/filler", dir);
  vl_cache_key k = latent_key(VL_CACHE_SAMPLE, VL_F32, 4, 8, 8); /* 1 KiB records */
  const char *where;
  vl_status s = try_build(path, &k, 100, &where);
  CHILD_CHECK(s == VL_ERR_IO, "100 KiB on 64 KiB: %s", vl_status_name(s));
  CHILD_CHECK(strstr(ctx->err, "No space left on device"), "message: %s", ctx->err);
  fprintf(stderr, "  tmpfs 64 KiB, 100 KiB cache: %s failed: %s\n", where, ctx->err);
  CHILD_CHECK(tu_count_entries(dir) == 0, "%d files left", tu_count_entries(dir));
  int fd = open(filler, O_WRONLY | O_CREAT, 0644);
  static char blk[48 << 10];
  CHILD_CHECK(fd >= 0 && write(fd, blk, sizeof blk) == (ssize_t)sizeof blk, "filler");
  close(fd);
  s = try_build(path, &k, 30, &where);
  CHILD_CHECK(s == VL_ERR_IO && strstr(ctx->err, "No space left on device"),
              "30 KiB on 16 KiB free: %s: %s", vl_status_name(s), ctx->err);
  CHILD_CHECK(tu_count_entries(dir) == 1, "%d files left", tu_count_entries(dir) - 1);
  s = try_build(path, &k, 8, &where);
  CHILD_CHECK(s == VL_OK, "8 KiB on 16 KiB free: %s", ctx->err);
  vl_cache_state st;
  vl_cache *c = NULL;
  CHILD_CHECK(vl_cache_open(ctx, path, &k, 8, NULL, &st, &c) == VL_OK && st == VL_CACHE_VALID,
              "reopen");
  vl_cache_close(c);
  CHILD_CHECK(count_temps(dir) == 0, "temps left");
  _exit(0);
}

static void test_disk_full_tmpfs(void **state) {
  (void)state;
  char dir[512];
  sub_dir(dir, sizeof dir, "full");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) tmpfs_child(dir);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    printf("  (no tmpfs: mount namespaces need root; the RLIMIT_FSIZE test covers a full disk)\n");
    skip();
  }
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_int_equal(tu_count_entries(dir), 0); /* the mount was private to the child */
}

/* RLIMIT_FSIZE below the cache's size (SIGXFSZ ignored: writes fail with EFBIG), in a
 * child: the failing write (the space reservation does not extend the file, so the limit
 * is met while writing) is a clear error and leaves neither the cache nor a temp file. */
static void test_disk_full_rlimit(void **state) {
  (void)state;
  char dir[512], path[600];
  sub_dir(dir, sizeof dir, "fsize");
  snprintf(path, sizeof path, "%s/latents.cache", dir);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {.rlim_cur = 20000, .rlim_max = 20000};
    CHILD_CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit");
    vl_cache_key k = latent_key(VL_CACHE_SAMPLE, VL_F32, 4, 8, 8);
    const char *where;
    vl_status s = try_build(path, &k, 64, &where); /* 64 KiB */
    CHILD_CHECK(s == VL_ERR_IO, "%s", vl_status_name(s));
    CHILD_CHECK(strstr(ctx->err, "File too large") && strstr(ctx->err, path), "message: %s",
                ctx->err);
    fprintf(stderr, "  RLIMIT_FSIZE 20000 B, 64 KiB cache: %s failed: %s\n", where, ctx->err);
    CHILD_CHECK(access(path, F_OK) != 0 && tu_count_entries(dir) == 0, "files left");
    /* a small cache under the limit builds */
    s = try_build(path, &k, 8, &where);
    CHILD_CHECK(s == VL_OK, "8 KiB: %s", ctx->err);
    _exit(0);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_int_equal(tu_count_entries(dir), 1);
  assert_int_equal(count_temps(dir), 0);
}

/* ---- sizes ---------------------------------------------------------------------------------- */

static void test_sizes_50k(void **state) {
  (void)state;
  const int64_t images = 50000;
  struct {
    const char *what;
    vl_cache_form form;
    int flips;
    vl_dtype dt;
  } rows[] = {
      {"latent sample 4x64x64", VL_CACHE_SAMPLE, 1, VL_F32},
      {"latent sample 4x64x64", VL_CACHE_SAMPLE, 1, VL_F16},
      {"latent moments 8x64x64", VL_CACHE_MOMENTS, 1, VL_F32},
      {"latent moments 8x64x64", VL_CACHE_MOMENTS, 1, VL_F16},
      {"moments, flip x2", VL_CACHE_MOMENTS, 2, VL_F32},
      {"moments, flip x2", VL_CACHE_MOMENTS, 2, VL_F16},
  };
  uint64_t file[8], rec[8];
  printf(
      "  cache for %lld images at 512x512 (docs/cases.md, sd-lora notes: the article says \"50k latents ~ 20 GB\")\n",
      (long long)images);
  printf("  %-24s %-5s %10s %16s %9s\n", "records", "dtype", "record", "file bytes", "GB");
  for (int i = 0; i < 6; i++) {
    vl_cache_key k =
        latent_key(rows[i].form, rows[i].dt, rows[i].form == VL_CACHE_MOMENTS ? 8 : 4, 64, 64);
    k.flip_variants = rows[i].flips;
    assert_int_equal(vl_cache_key_check(ctx, &k), VL_OK);
    rec[i] = vl_cache_record_bytes(&k);
    file[i] = vl_cache_file_bytes(&k, images * rows[i].flips);
    printf("  %-24s %-5s %10llu %16llu %9.3f\n", rows[i].what, vl_dtype_name(rows[i].dt),
           (unsigned long long)rec[i], (unsigned long long)file[i], (double)file[i] / 1e9);
  }
  vl_cache_key t;
  vl_cache_key_init(&t, "text");
  vl_cache_key_shape(&t, 2, (int64_t[]){77, 768});
  uint64_t text[2];
  for (int d = 0; d < 2; d++) {
    t.dtype = d ? VL_F16 : VL_F32;
    text[d] = vl_cache_file_bytes(&t, images);
    printf("  %-24s %-5s %10zu %16llu %9.3f\n", "CLIP text 77x768", vl_dtype_name(t.dtype),
           vl_cache_record_bytes(&t), (unsigned long long)text[d], (double)text[d] / 1e9);
  }
  printf("  20 GB / fp32 latent samples = %.1fx; fp32 samples + fp32 text = %.2f GB\n",
         20e9 / (double)file[0], (double)(file[0] + text[0]) / 1e9);
  /* docs/cases.md §3 notes: 64 KiB fp32, 32 KiB fp16; ~3.3 GB and ~1.6 GB for 50k */
  assert_int_equal(rec[0], 64 << 10);
  assert_int_equal(rec[1], 32 << 10);
  assert_int_equal(rec[2], 128 << 10);
  assert_int_equal(file[0], 256 + 50000ull * (65536 + 4));
  assert_int_equal(file[1], 256 + 50000ull * (32768 + 4));
  assert_true(file[0] > 3.2e9 && file[0] < 3.4e9);
  assert_true(file[1] > 1.6e9 && file[1] < 1.7e9);
  assert_int_equal(file[4], 256 + 100000ull * (131072 + 4));
  assert_int_equal(text[1], 256 + 50000ull * (77 * 768 * 2 + 4));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_crc32),
      cmocka_unit_test(test_hash),
      cmocka_unit_test(test_key_check),
      cmocka_unit_test(test_round_trip_f32_moments),
      cmocka_unit_test(test_round_trip_f16_sample),
      cmocka_unit_test(test_round_trip_bf16_text_flip),
      cmocka_unit_test(test_commit_rules),
      cmocka_unit_test(test_key_mismatch),
      cmocka_unit_test(test_truncation),
      cmocka_unit_test(test_flipped_bytes),
      cmocka_unit_test(test_ram_equals_file),
      cmocka_unit_test(test_two_builders),
      cmocka_unit_test(test_dead_temp_removed),
      cmocka_unit_test(test_disk_full_tmpfs),
      cmocka_unit_test(test_disk_full_rlimit),
      cmocka_unit_test(test_sizes_50k),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
