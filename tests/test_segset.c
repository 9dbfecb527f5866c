/* The synthetic segmentation set (datasets/segset): generation, determinism across thread
 * counts, image/mask alignment, class frequencies, every damage mode (and fuzzed files)
 * read as VL_ERR_IO naming the file, FIFOs and oversized files, strict PGM headers,
 * malformed manifests, damaged or foreign set folders on first use, the seg-ckpt case's
 * corrupt and max_file_bytes knobs, and an end-to-end run through the loader with masks. */
#define _GNU_SOURCE
#include "testutil.h"

#include "harness/ladder.h"
#include "harness/registry.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/segset.h"

static char g_set[300];  /* the shared set */
#define N_SET 24
#define SIZE 48
#define CLASSES 5
#define SEED 11

static tu_progress g_prog; /* what the shared set's generation reported */

static vl_segset_gen_cfg set_cfg(void) {
  vl_segset_gen_cfg g;
  vl_segset_gen_cfg_default(&g);
  g.n = N_SET;
  g.size = SIZE;
  g.num_classes = CLASSES;
  g.seed = SEED;
  g.threads = 2;
  return g;
}

static int setup(void **state) {
  (void)state;
  if (tu_tmpdir(tu_tmp, sizeof tu_tmp, "vl_segset_test_") != 0) return -1;
  snprintf(g_set, sizeof g_set, "%s/a/b/set", tu_tmp); /* parents made too */
  vl_segset_gen_cfg g = set_cfg();
  g.progress = tu_on_progress;
  g.user = &g_prog;
  vl_err err;
  if (vl_segset_generate(g_set, &g, &err) != 0) {
    fprintf(stderr, "generate: %s\n", err.msg);
    return -1;
  }
  return 0;
}

static vl_segset *open_ok(const char *dir) {
  vl_segset *s = NULL;
  vl_err err = {""};
  int rc = vl_segset_open(&s, dir, &err);
  if (rc != 0) print_error("open %s: %s\n", dir, err.msg);
  assert_int_equal(rc, 0);
  return s;
}

/* Sample i through the dataset interface (scratch may be NULL). */
static vl_status read_one(vl_dataset *d, void *scr, int64_t i, vl_image *img, vl_err *err) {
  err->msg[0] = 0;
  return d->read(d->self, scr, i, img, err);
}

/* ============================== generation, reading =================================== */

static void test_generate_and_read(void **state) {
  (void)state;
  tu_assert_progress_done(&g_prog, N_SET);

  vl_segset *s = open_ok(g_set);
  assert_int_equal(vl_segset_len(s), N_SET);
  vl_segset_info in;
  vl_segset_info_get(s, &in);
  assert_int_equal(in.n, N_SET);
  assert_int_equal(in.size, SIZE);
  assert_int_equal(in.num_classes, CLASSES);
  assert_int_equal(in.seed, SEED);
  assert_int_equal(in.version, VL_SEGSET_VERSION);
  assert_int_equal(in.quality, 90);
  assert_true(in.max_bytes > 0 && in.total_bytes >= in.max_bytes);

  vl_dataset d = vl_segset_dataset(s);
  assert_int_equal(d.len(d.self), N_SET);
  assert_int_equal(d.max_image_bytes, (size_t)SIZE * SIZE * 3);
  assert_true(d.scratch_bytes >= (size_t)in.max_bytes + SIZE * SIZE);
  void *scr = d.scratch_new(d.self);
  assert_non_null(scr);
  vl_image img = {0}, img2 = {0};
  vl_err err;
  for (int64_t i = 0; i < N_SET; i++) {
    vl_status st = read_one(&d, scr, i, &img, &err);
    if (st != VL_OK) print_error("read %lld: %s\n", (long long)i, err.msg);
    assert_int_equal(st, VL_OK);
    assert_int_equal(img.w, SIZE);
    assert_int_equal(img.h, SIZE);
    assert_int_equal(img.c, 3);
    assert_int_equal(img.label, 0);
    assert_non_null(img.mask);
    assert_true(img.mask_cap >= (size_t)SIZE * SIZE);
    int fg = 0;
    for (int k = 0; k < SIZE * SIZE; k++) {
      assert_true(img.mask[k] < CLASSES);
      fg += img.mask[k] != 0;
    }
    assert_true(fg > 0); /* 2..6 shapes, never all clipped away */
    /* Without a scratch: the same pixels and mask. */
    assert_int_equal(read_one(&d, NULL, i, &img2, &err), VL_OK);
    assert_memory_equal(img.pix, img2.pix, (size_t)SIZE * SIZE * 3);
    assert_memory_equal(img.mask, img2.mask, (size_t)SIZE * SIZE);
  }
  /* Out of range is a caller error, not a corrupt file. */
  assert_int_equal(read_one(&d, scr, N_SET, &img, &err), VL_ERR_INVALID);
  assert_non_null(strstr(err.msg, "out of range"));
  d.scratch_free(d.self, scr);
  tu_image_free(&img);
  tu_image_free(&img2);
  vl_segset_close(s);
}

/* One thread or two: byte-identical files, manifest included. Another seed: other images
 * (a held-out split) with the same classes. */
static void test_deterministic(void **state) {
  (void)state;
  char dir[320], other[320];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "det1");
  tu_join(other, sizeof other, tu_tmp, "seed2");
  vl_segset_gen_cfg g = set_cfg();
  g.threads = 1;
  assert_int_equal(vl_segset_generate(dir, &g, &err), VL_OK);
  DIR *dd = opendir(g_set);
  assert_non_null(dd);
  struct dirent *e;
  int files = 0;
  while ((e = readdir(dd))) {
    if (e->d_name[0] == '.') continue;
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/%s", g_set, e->d_name);
    snprintf(b, sizeof b, "%s/%s", dir, e->d_name);
    if (!tu_same_file(a, b)) print_error("%s differs between 2 threads and 1\n", e->d_name);
    assert_true(tu_same_file(a, b));
    files++;
  }
  closedir(dd);
  assert_int_equal(files, 2 * N_SET + 1);

  g.seed = SEED + 1;
  g.n = 2;
  assert_int_equal(vl_segset_generate(other, &g, &err), VL_OK);
  char a[600], b[600];
  snprintf(a, sizeof a, "%s/img_0000000.jpg", g_set);
  snprintf(b, sizeof b, "%s/img_0000000.jpg", other);
  assert_false(tu_same_file(a, b));
  snprintf(a, sizeof a, "%s/mask_0000000.pgm", g_set);
  snprintf(b, sizeof b, "%s/mask_0000000.pgm", other);
  assert_false(tu_same_file(a, b));
  vl_segset *s = open_ok(other);
  vl_segset_info in;
  vl_segset_info_get(s, &in);
  assert_int_equal(in.seed, SEED + 1);
  vl_segset_close(s);
}

/* ============================== content ============================================== */

/* Decoded pixels of each class average to a colour near the class's nominal colour and far
 * from the other classes'; with the mask mirrored (misaligned) they do not. */
static void test_alignment(void **state) {
  (void)state;
  vl_segset *s = open_ok(g_set);
  vl_dataset d = vl_segset_dataset(s);
  vl_image img = {0};
  vl_err err;
  double sum[CLASSES][3] = {{0}}, dist[2][CLASSES] = {{0}};
  int64_t cnt[2][CLASSES] = {{0}};
  uint8_t nom[CLASSES][3];
  for (int k = 1; k < CLASSES; k++) vl_segset_class_rgb(k, CLASSES, nom[k]);
  for (int64_t i = 0; i < N_SET; i++) {
    assert_int_equal(read_one(&d, NULL, i, &img, &err), VL_OK);
    for (int y = 0; y < SIZE; y++)
      for (int x = 0; x < SIZE; x++) {
        const uint8_t *p = img.pix + ((size_t)y * SIZE + x) * 3;
        for (int mir = 0; mir < 2; mir++) {
          int k = img.mask[(size_t)y * SIZE + (mir ? SIZE - 1 - x : x)];
          cnt[mir][k]++;
          if (!mir)
            for (int c = 0; c < 3; c++) sum[k][c] += p[c];
          if (k == 0) continue;
          double dd = 0;
          for (int c = 0; c < 3; c++) dd += ((double)p[c] - nom[k][c]) * ((double)p[c] - nom[k][c]);
          dist[mir][k] += sqrt(dd);
        }
      }
  }
  double mean[CLASSES][3];
  for (int k = 0; k < CLASSES; k++)
    for (int c = 0; c < 3; c++) mean[k][c] = sum[k][c] / (double)cnt[0][k];
  for (int k = 1; k < CLASSES; k++) {
    double own = 0;
    for (int c = 0; c < 3; c++) own += (mean[k][c] - nom[k][c]) * (mean[k][c] - nom[k][c]);
    own = sqrt(own);
    if (own > 60) print_error("class %d: mean (%.0f %.0f %.0f), nominal (%d %d %d)\n", k, mean[k][0],
                              mean[k][1], mean[k][2], nom[k][0], nom[k][1], nom[k][2]);
    assert_true(own < 60);
    for (int j = 1; j < CLASSES; j++) {
      if (j == k) continue;
      double other = 0, between = 0;
      for (int c = 0; c < 3; c++) {
        other += (mean[k][c] - nom[j][c]) * (mean[k][c] - nom[j][c]);
        between += (mean[k][c] - mean[j][c]) * (mean[k][c] - mean[j][c]);
      }
      assert_true(own < sqrt(other)); /* nearest to its own family */
      assert_true(sqrt(between) > 60); /* families are distinct */
    }
    /* Pixels of class k are much closer to k's colour under the true mask. */
    double aligned = dist[0][k] / (double)cnt[0][k], mirrored = dist[1][k] / (double)cnt[1][k];
    if (!(aligned < 0.7 * mirrored)) print_error("class %d: %.1f aligned, %.1f mirrored\n", k, aligned, mirrored);
    assert_true(aligned < 0.7 * mirrored);
  }
  tu_image_free(&img);
  vl_segset_close(s);
}

/* Every class is present over the set; background is the majority but not > 90%. */
static void test_class_frequencies(void **state) {
  (void)state;
  vl_segset *s = open_ok(g_set);
  vl_dataset d = vl_segset_dataset(s);
  vl_image img = {0};
  vl_err err;
  int64_t cnt[CLASSES] = {0}, images_with[CLASSES] = {0};
  for (int64_t i = 0; i < N_SET; i++) {
    assert_int_equal(read_one(&d, NULL, i, &img, &err), VL_OK);
    int seen[CLASSES] = {0};
    for (int k = 0; k < SIZE * SIZE; k++) cnt[img.mask[k]]++, seen[img.mask[k]] = 1;
    for (int k = 0; k < CLASSES; k++) images_with[k] += seen[k];
  }
  const double total = (double)N_SET * SIZE * SIZE;
  print_message("class fractions: %.3f %.3f %.3f %.3f %.3f\n", cnt[0] / total, cnt[1] / total,
                cnt[2] / total, cnt[3] / total, cnt[4] / total);
  assert_true(cnt[0] / total > 0.4 && cnt[0] / total < 0.9);
  for (int k = 1; k < CLASSES; k++) {
    assert_true(cnt[k] / total > 0.01);
    assert_true(images_with[k] >= 3);
  }
  tu_image_free(&img);
  vl_segset_close(s);
}

/* ============================== damage =============================================== */

/* A fresh 3-sample set at size 32. */
static void small_set(char *dir, size_t n, const char *name) {
  tu_join(dir, n, tu_tmp, name);
  vl_segset_gen_cfg g;
  vl_segset_gen_cfg_default(&g);
  g.n = 3;
  g.size = 32;
  g.seed = 5;
  g.threads = 1;
  vl_err err;
  int rc = vl_segset_generate(dir, &g, &err);
  if (rc) print_error("generate: %s\n", err.msg);
  assert_int_equal(rc, 0);
}

/* Sample 1 must fail with VL_ERR_IO naming `file` and saying `what`; 0 and 2 still read;
 * the loader skips it under SKIP and names it under ERROR. */
static void expect_damaged(const char *dir, const char *file, const char *what) {
  vl_segset *s = open_ok(dir);
  vl_dataset d = vl_segset_dataset(s);
  void *scr = d.scratch_new(d.self);
  vl_image img = {0};
  vl_err err;
  for (int64_t i = 0; i < 3; i++) {
    vl_status st = read_one(&d, i % 2 ? scr : NULL, i, &img, &err);
    if (i != 1) {
      assert_int_equal(st, VL_OK);
      continue;
    }
    if (st != VL_ERR_IO || !strstr(err.msg, file) || !strstr(err.msg, what))
      print_error("status %s, message '%s' (want %s and '%s')\n", vl_status_name(st), err.msg, file, what);
    assert_int_equal(st, VL_ERR_IO);
    assert_non_null(strstr(err.msg, file));
    assert_non_null(strstr(err.msg, what));
  }
  for (int pol = 0; pol < 2; pol++) {
    vl_loader_cfg c;
    vl_loader_cfg_default(&c);
    c.masks = true;
    c.batch = 2;
    c.crop = 16;
    c.workers = pol;
    c.on_corrupt = pol ? VL_CORRUPT_SKIP : VL_CORRUPT_ERROR;
    vl_loader *l = NULL;
    assert_int_equal(vl_loader_create(&l, &c, &d, &err), VL_OK);
    assert_int_equal(vl_loader_start_epoch(l, 0), VL_OK);
    vl_batch_buf *b;
    int64_t got = 0;
    vl_status st;
    while ((st = vl_loader_next(l, &b)) == VL_OK && b) {
      for (int64_t k = 0; k < b->n; k++) assert_true(b->index[k] != 1);
      got += b->n;
      vl_loader_release(l, b);
    }
    vl_loader_stats ls;
    vl_loader_stats_get(l, &ls);
    if (pol) {
      assert_int_equal(st, VL_OK);
      if (got != 2) print_error("got %lld, status %d, err %s\n", (long long)got, st, ls.last_error);
      assert_int_equal(got, 2);
      assert_int_equal(ls.skipped, 1);
    } else {
      assert_int_equal(st, VL_ERR_IO);
      assert_non_null(strstr(ls.last_error, "sample 1"));
      assert_non_null(strstr(ls.last_error, file));
    }
    vl_loader_destroy(l);
  }
  d.scratch_free(d.self, scr);
  tu_image_free(&img);
  vl_segset_close(s);
}

static void test_corrupt_modes(void **state) {
  (void)state;
  static const struct { int mode; const char *file, *what; } m[] = {
      {TU_SEGSET_IMG_TRUNCATE, "img_0000001.jpg", "JPEG"},
      {TU_SEGSET_IMG_GARBAGE, "img_0000001.jpg", "corrupt or truncated JPEG"},
      {TU_SEGSET_IMG_NOT_JPEG, "img_0000001.jpg", "not a readable JPEG"},
      {TU_SEGSET_MASK_TRUNCATE, "mask_0000001.pgm", "truncated mask"},
      {TU_SEGSET_MASK_WRONG_SIZE, "mask_0000001.pgm", "wrong mask dimensions: the mask is 16x32 but the image is 32x32"},
      {TU_SEGSET_MASK_BAD_CLASS, "mask_0000001.pgm", "class id 5 at (x 10, y 16) is >= num_classes 5"},
      {TU_SEGSET_MASK_BAD_HEADER, "mask_0000001.pgm", "bad PGM header"},
      {TU_SEGSET_IMG_MISSING, "img_0000001.jpg", "cannot open"},
      {TU_SEGSET_MASK_MISSING, "mask_0000001.pgm", "cannot open"},
  };
  vl_err err;
  for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
    char dir[320], name[32];
    snprintf(name, sizeof name, "damage%zu", k);
    small_set(dir, sizeof dir, name);
    int rc = tu_segset_corrupt(dir, 1, m[k].mode, err.msg, sizeof err.msg);
    if (rc) print_error("corrupt mode %d: %s\n", m[k].mode, err.msg);
    assert_int_equal(rc, 0);
    expect_damaged(dir, m[k].file, m[k].what);
  }
  /* Bad arguments. */
  char dir[320];
  small_set(dir, sizeof dir, "damage_args");
  assert_int_equal(tu_segset_corrupt(dir, 1, 99, err.msg, sizeof err.msg), -1);
  assert_non_null(strstr(err.msg, "unknown corrupt mode 99"));
  assert_int_equal(tu_segset_corrupt(dir, 3, TU_SEGSET_IMG_TRUNCATE, err.msg, sizeof err.msg), -1);
  assert_non_null(strstr(err.msg, "not in the set"));
}

/* Hand-made masks: a header comment is fine (PGM allows it); trailing bytes, another
 * maxval, an empty file are errors; and fuzzed headers and truncations of both files are
 * errors or clean reads, never a crash (ASan checks the reads). */
static void test_mask_files(void **state) {
  (void)state;
  char dir[320], path[400];
  vl_err err;
  small_set(dir, sizeof dir, "masks");
  snprintf(path, sizeof path, "%s/mask_0000001.pgm", dir);
  uint8_t *orig;
  size_t olen = tu_slurp(path, &orig);
  const size_t npx = 32 * 32, hdr = olen - npx;
  uint8_t *buf = malloc(olen + 64);
  assert_non_null(buf);
  vl_segset *s = open_ok(dir);
  vl_dataset d = vl_segset_dataset(s);
  vl_image img = {0};

  int n = snprintf((char *)buf, 64, "P5\n# a comment\n32\t32 # and another\n255\n");
  memcpy(buf + n, orig + hdr, npx);
  tu_write_bytes(path, buf, (size_t)n + npx);
  assert_int_equal(read_one(&d, NULL, 1, &img, &err), VL_OK);
  assert_memory_equal(img.mask, orig + hdr, npx);

  memcpy(buf, orig, olen);
  buf[olen] = 0;
  tu_write_bytes(path, buf, olen + 1);
  assert_int_equal(read_one(&d, NULL, 1, &img, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "wrong mask size: 1 bytes past"));

  n = snprintf((char *)buf, 64, "P5\n32 32\n65535\n");
  memcpy(buf + n, orig + hdr, npx);
  tu_write_bytes(path, buf, (size_t)n + npx);
  assert_int_equal(read_one(&d, NULL, 1, &img, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "maxval 65535"));

  tu_write_bytes(path, buf, 0);
  assert_int_equal(read_one(&d, NULL, 1, &img, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "mask_0000001.pgm: empty file"));

  /* Fuzz: random bytes over the header, then every truncation length of the header. */
  vl_rng r;
  vl_rng_seed(&r, 99);
  for (int it = 0; it < 200; it++) {
    memcpy(buf, orig, olen);
    int nb = 1 + (int)vl_rng_below(&r, 4);
    for (int k = 0; k < nb; k++) buf[vl_rng_below(&r, hdr + 2)] = (uint8_t)vl_rng_u64(&r);
    tu_write_bytes(path, buf, olen);
    vl_status st = read_one(&d, NULL, 1, &img, &err);
    assert_true(st == VL_OK || st == VL_ERR_IO);
    if (st == VL_ERR_IO) assert_non_null(strstr(err.msg, "mask_0000001.pgm"));
  }
  for (size_t len = 1; len < olen; len += len < 40 ? 1 : 97) {
    tu_write_bytes(path, orig, len);
    assert_int_equal(read_one(&d, NULL, 1, &img, &err), VL_ERR_IO);
    assert_non_null(strstr(err.msg, "mask_0000001.pgm"));
  }
  tu_write_bytes(path, orig, olen);
  assert_int_equal(read_one(&d, NULL, 1, &img, &err), VL_OK);

  /* The JPEG cut at many lengths. */
  snprintf(path, sizeof path, "%s/img_0000002.jpg", dir);
  uint8_t *jorig;
  size_t jlen = tu_slurp(path, &jorig);
  for (size_t len = 1; len < jlen; len += len < 700 ? 37 : 301) {
    tu_write_bytes(path, jorig, len);
    assert_int_equal(read_one(&d, NULL, 2, &img, &err), VL_ERR_IO);
    assert_non_null(strstr(err.msg, "img_0000002.jpg"));
  }
  free(jorig);
  free(orig);
  free(buf);
  tu_image_free(&img);
  vl_segset_close(s);
}

/* A FIFO in place of a mask or an image is refused at once (never waited on: the watchdog
 * turns a blocking open into a failure); a 3 GiB (sparse) mask from its size, unread. */
static void test_fifo_and_oversized(void **state) {
  (void)state;
  char dir[320], p[400];
  tu_watchdog(60, "test_fifo_and_oversized: reading a FIFO or a 3 GiB mask");
  static const char *const files[] = {"mask_0000001.pgm", "img_0000001.jpg"};
  for (int k = 0; k < 2; k++) {
    char name[32];
    snprintf(name, sizeof name, "fifo%d", k);
    small_set(dir, sizeof dir, name);
    tu_join(p, sizeof p, dir, files[k]);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0644), 0);
    expect_damaged(dir, files[k], "not a regular file (fifo)");
  }
  small_set(dir, sizeof dir, "bigmask");
  tu_join(p, sizeof p, dir, "mask_0000001.pgm");
  const long rss0 = tu_peak_rss_kib();
  tu_sparse_file(p, 3ull << 30);
  expect_damaged(dir, "mask_0000001.pgm", "file of 3221225472 bytes exceeds max_file_bytes (67108864)");
  assert_true(tu_peak_rss_kib() - rss0 < 64 * 1024);
  tu_watchdog(0, NULL);
}

/* The PGM reader takes only "P5 width height maxval" with decimal numbers of at most 9
 * digits, each ending at whitespace or a comment, one whitespace byte, then exactly
 * size*size pixels: anything else is VL_ERR_IO naming the file, before any size is
 * computed from the file's numbers (a header claiming 999999999 x 999999999 allocates
 * nothing). */
static void test_mask_header_strict(void **state) {
  (void)state;
  enum { S = 4 };
  static const struct { const char *hdr, *needle; } cases[] = {
      {"P5\n4 4\n255\n", NULL},
      {"P5 4 4 255 ", NULL},
      {"P5\n0004 4\n255\n", NULL},
      {"P5#c\n4 4 # w h\n255\n", NULL},
      {"P5\n4x4\n255\n", "bad PGM header (expected"},
      {"P5\n4 4\n255#c\n", "bad PGM header (expected"},
      {"P5\n4 4\n255", "bad PGM header (expected"},
      {"P5\n-4 4\n255\n", "bad PGM header (expected"},
      {"P5\n+4 4\n255\n", "bad PGM header (expected"},
      {"P5\n0000000004 4\n255\n", "bad PGM header (expected"}, /* 10 digits */
      {"P5\n4294967300 4\n255\n", "bad PGM header (expected"}, /* 2^32 + 4 */
      {"P54 4\n255\n", "bad PGM header (expected"},
      {"P6\n4 4\n255\n", "not a binary PGM mask"},
      {"P5\n0 4\n255\n", "bad PGM header: 0x4 pixels"},
      {"P5\n4 4\n0\n", "maxval 0"},
      {"P5\n4 4\n65535\n", "maxval 65535"},
      {"P5\n999999999 999999999\n255\n", "the mask is 999999999x999999999 but the image is 4x4"},
      {"P5\n4 3\n255\n", "the mask is 4x3"},
  };
  uint8_t buf[64], dst[S * S];
  vl_err err;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    size_t n = strlen(cases[k].hdr);
    memcpy(buf, cases[k].hdr, n);
    for (int q = 0; q < S * S; q++) buf[n + q] = (uint8_t)(q % 3);
    err.msg[0] = 0;
    vl_status st = vl_segset_decode_mask("m.pgm", buf, n + S * S, S, 3, dst, &err);
    if (!cases[k].needle) {
      if (st != VL_OK) print_error("\"%s\": %s\n", cases[k].hdr, err.msg);
      assert_int_equal(st, VL_OK);
      for (int q = 0; q < S * S; q++) assert_int_equal(dst[q], q % 3);
      continue;
    }
    if (st != VL_ERR_IO || !strstr(err.msg, cases[k].needle) || !strstr(err.msg, "m.pgm"))
      print_error("\"%s\": %s \"%s\" (want \"%s\")\n", cases[k].hdr, vl_status_name(st), err.msg, cases[k].needle);
    assert_int_equal(st, VL_ERR_IO);
    assert_non_null(strstr(err.msg, "m.pgm"));
    assert_non_null(strstr(err.msg, cases[k].needle));
  }
  /* The data length is exact: one byte short or long is an error. */
  const size_t h = strlen("P5\n4 4\n255\n");
  memcpy(buf, "P5\n4 4\n255\n", h);
  memset(buf + h, 1, S * S + 1);
  assert_int_equal(vl_segset_decode_mask("m.pgm", buf, h + S * S - 1, S, 3, dst, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "truncated mask: 15 of 16"));
  assert_int_equal(vl_segset_decode_mask("m.pgm", buf, h + S * S + 1, S, 3, dst, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "1 bytes past"));
  assert_int_equal(vl_segset_decode_mask("m.pgm", buf, 1, S, 3, dst, &err), VL_ERR_IO);
}

/* ============================== manifest ============================================= */

static void expect_open_fail(const char *dir, const char *needle) {
  vl_segset *s = (vl_segset *)1;
  vl_err err = {""};
  assert_int_not_equal(vl_segset_open(&s, dir, &err), VL_OK);
  assert_null(s);
  if (!strstr(err.msg, needle)) print_error("message '%s' lacks '%s'\n", err.msg, needle);
  assert_non_null(strstr(err.msg, needle));
}

static void test_manifest_errors(void **state) {
  (void)state;
  char dir[320], mp[400];
  tu_join(dir, sizeof dir, tu_tmp, "manifests");
  mkdir(dir, 0755);
  snprintf(mp, sizeof mp, "%s/manifest.tsv", dir);
  expect_open_fail(dir, "data gen --kind seg"); /* none there */
  const char *H = "# vramlab-segset version=1 n=2 size=32 classes=5 seed=3 quality=90\n";
  static const struct { const char *body, *needle; } cases[] = {
      {"", "manifest.tsv:1: empty manifest"},
      {"# vramlab-jpegset version=1 n=1\n", "manifest.tsv:1: not a vramlab-segset manifest"},
      {"# vramlab-segset version=2 n=1 size=32 classes=5\n", "manifest.tsv:1: unknown manifest version 2"},
      {"# vramlab-segset n=1 size=32 classes=5\n", "manifest.tsv:1: the header has no version="},
      {"# vramlab-segset version=1 n=1 classes=5\na.jpg\ta.pgm\t10\n", "manifest.tsv:1: the header has no size="},
      {"# vramlab-segset version=1 n=1 size=32\na.jpg\ta.pgm\t10\n", "manifest.tsv:1: the header has no classes="},
      {"# vramlab-segset version=1 n=1 size=32 classes=1\n", "manifest.tsv:1: bad header value classes=1"},
      {"# vramlab-segset version=1 n=1 size=8 classes=5\n", "manifest.tsv:1: bad header value size=8"},
      {"# vramlab-segset version=1 n=1 size=32 classes=5 seed=-4\n", "bad header value seed=-4"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    tu_write_text(mp, cases[k].body);
    expect_open_fail(dir, cases[k].needle);
  }
  char body[1024];
  static const struct { const char *lines, *needle; } bad[] = {
      {"a.jpg\ta.pgm\n", "manifest.tsv:2: expected 3 tab-separated fields (image file, mask file, bytes), found 2"},
      {"a.jpg\ta.pgm\t10\tx\n", "manifest.tsv:2: expected 3 tab-separated fields"},
      {"../a.jpg\ta.pgm\t10\n", "manifest.tsv:2: bad image file name \"../a.jpg\""},
      {"a.jpg\tsub/a.pgm\t10\n", "manifest.tsv:2: bad mask file name \"sub/a.pgm\""},
      {"a.jpg\ta.pgm\tabc\n", "manifest.tsv:2: bad bytes \"abc\""},
      {"a.jpg\ta.pgm\t0\n", "manifest.tsv:2: bad bytes \"0\""},
      {"a.jpg\ta.pgm\t10\n\nb.jpg\tb.pgm\t10\n", "manifest.tsv:3: empty line"},
      {"a.jpg\ta.pgm\t10\n", "the header says n=2 but 1 sample lines follow"},
      {"a.jpg\ta.pgm\t10\nb.jpg\tb.pgm\t10\nc.jpg\tc.pgm\t10\n", "the header says n=2 but 3"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    snprintf(body, sizeof body, "%s%s", H, bad[k].lines);
    tu_write_text(mp, body);
    expect_open_fail(dir, bad[k].needle);
  }
  /* CRLF line ends and an unknown key are fine. */
  tu_write_text(mp, "# vramlab-segset version=1 n=2 size=32 classes=7 future=1\r\na.jpg\ta.pgm\t10\r\nb.jpg\tb.pgm\t30\r\n");
  vl_segset *s = open_ok(dir);
  vl_segset_info in;
  vl_segset_info_get(s, &in);
  assert_int_equal(in.n, 2);
  assert_int_equal(in.num_classes, 7);
  assert_int_equal(in.quality, -1);
  assert_int_equal(in.max_bytes, 30);
  assert_int_equal(in.total_bytes, 40);
  /* ... and then a listed file that is not there is the read's error, naming it. */
  vl_dataset d = vl_segset_dataset(s);
  vl_image img = {0};
  vl_err err;
  assert_int_equal(read_one(&d, NULL, 1, &img, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "b.jpg: cannot open"));
  tu_image_free(&img);
  vl_segset_close(s);
}

static void test_generate_errors(void **state) {
  (void)state;
  char dir[320];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "bad_cfg");
  static const struct { int field, value; const char *needle; } cases[] = {
      {0, 0, "n must be at least 1"},        {1, 8, "size must be in 16..2048"},
      {1, 4096, "size must be in"},          {2, 1, "num_classes must be in 2..255"},
      {2, 256, "num_classes"},               {3, 0, "quality must be in 1..100"},
      {4, -1, "threads must be >= 0"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    vl_segset_gen_cfg g = set_cfg();
    if (cases[k].field == 0) g.n = cases[k].value;
    if (cases[k].field == 1) g.size = cases[k].value;
    if (cases[k].field == 2) g.num_classes = cases[k].value;
    if (cases[k].field == 3) g.quality = cases[k].value;
    if (cases[k].field == 4) g.threads = cases[k].value;
    assert_int_not_equal(vl_segset_generate(dir, &g, &err), VL_OK);
    if (!strstr(err.msg, cases[k].needle)) print_error("message '%s' lacks '%s'\n", err.msg, cases[k].needle);
    assert_non_null(strstr(err.msg, cases[k].needle));
  }
  /* A directory under a regular file cannot be made. */
  char file[340], under[400];
  snprintf(file, sizeof file, "%s/plainfile", tu_tmp);
  tu_write_text(file, "x");
  snprintf(under, sizeof under, "%s/sub", file);
  vl_segset_gen_cfg g = set_cfg();
  g.n = 1;
  assert_int_not_equal(vl_segset_generate(under, &g, &err), VL_OK);
  assert_non_null(strstr(err.msg, "plainfile"));
}

/* ============================== first use, the case's knobs ========================== */

/* A split is made only where nothing (or only an interrupted generation's files) is: a
 * damaged manifest, a set made otherwise, a folder with other files are refused and left
 * as they are. */
/* vl_segset_first_use as the number the tests compare: 1 make the set, 0 open it, -1 refused. */
static int first_use_code(vl_segset **s, const char *dir, const vl_segset_gen_cfg *g, vl_err *err) {
  bool make = false;
  if (vl_segset_first_use(s, dir, g, &make, err) != VL_OK) return -1;
  return make ? 1 : 0;
}

static void test_first_use(void **state) {
  (void)state;
  char dir[320], p[400];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "first");
  vl_segset_gen_cfg g;
  vl_segset_gen_cfg_default(&g);
  g.n = 3;
  g.size = 16;
  g.seed = 9;
  g.threads = 1;
  vl_segset *s = (vl_segset *)&g; /* must be reset to NULL */
  assert_int_equal(first_use_code(&s, dir, &g, &err), 1);
  assert_null(s);
  assert_int_equal(mkdir(dir, 0755), 0);
  tu_join(p, sizeof p, dir, "mask_0000002.pgm"); /* an interrupted generation's */
  tu_write_text(p, "P5");
  assert_int_equal(first_use_code(&s, dir, &g, &err), 1);
  assert_int_equal(vl_segset_generate(dir, &g, &err), VL_OK);
  assert_int_equal(first_use_code(&s, dir, &g, &err), 0);
  assert_non_null(s);
  vl_segset_close(s);
  vl_segset_gen_cfg g2 = g;
  g2.size = 32;
  assert_int_equal(first_use_code(&s, dir, &g2, &err), -1);
  assert_null(s);
  assert_non_null(strstr(err.msg, "size=16"));
  assert_non_null(strstr(err.msg, "size=32"));
  g2 = g;
  g2.num_classes = 6;
  assert_int_equal(first_use_code(&s, dir, &g2, &err), -1);

  tu_join(p, sizeof p, dir, "manifest.tsv");
  uint8_t *orig;
  size_t olen = tu_slurp(p, &orig);
  tu_write_bytes(p, orig, olen - 20); /* the last line cut inside its mask name */
  uint8_t *cut;
  size_t clen = tu_slurp(p, &cut);
  assert_int_equal(first_use_code(&s, dir, &g, &err), -1);
  assert_null(s);
  if (!strstr(err.msg, "manifest.tsv:4:") || !strstr(err.msg, "damaged") || !strstr(err.msg, "vramlab data gen --kind seg"))
    print_error("%s\n", err.msg);
  assert_non_null(strstr(err.msg, "manifest.tsv:4:"));
  assert_non_null(strstr(err.msg, "damaged"));
  assert_non_null(strstr(err.msg, "vramlab data gen --kind seg --out"));
  uint8_t *after;
  assert_int_equal(tu_slurp(p, &after), clen);
  assert_memory_equal(after, cut, clen);
  assert_int_equal(tu_count_entries(dir), 7);
  free(after);
  free(cut);
  free(orig);

  char other[320];
  tu_join(other, sizeof other, tu_tmp, "theirs");
  assert_int_equal(mkdir(other, 0755), 0);
  tu_join(p, sizeof p, other, "labels.csv");
  tu_write_text(p, "mine");
  assert_int_equal(first_use_code(&s, other, &g, &err), -1);
  assert_non_null(strstr(err.msg, "is not empty"));
  assert_non_null(strstr(err.msg, "labels.csv"));
  assert_int_equal(tu_count_entries(other), 1);
}

/* seg-ckpt knows the corrupt and max_file_bytes knobs and refuses bad values, naming the
 * knob. */
static void test_case_knobs(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("seg-ckpt");
  assert_non_null(c);
  vl_knobs setting = {0};
  vl_case_env env = {.scale = "tiny", .device = VL_DEV_PLAN, .setting = &setting, .quiet = 1};
  vl_knobs k = {0};
  vl_knob_set(&k, "corrupt", "skip");
  vl_knob_set(&k, "max_file_bytes", "16MiB");
  assert_int_equal(vl_case_check_knobs(&env, c, "r", &k), 0);
  static const struct { const char *key, *val, *needle; } bad[] = {
      {"corrupt", "ignore", "corrupt = 'ignore': expected skip or error"},
      {"corrupt", "SKIPPED", "corrupt = 'SKIPPED'"},
      {"max_file_bytes", "huge", "max_file_bytes = 'huge'"},
      {"max_file_bytes", "0", "max_file_bytes = '0'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    vl_knobs b = {0};
    assert_int_equal(vl_knob_set(&b, bad[i].key, bad[i].val), 0);
    cJSON *o = cJSON_CreateObject();
    env.err.msg[0] = 0;
    assert_int_equal(c->plan(&env, "tiny", &b, o), VL_ERR_INVALID);
    cJSON_Delete(o);
    if (!strstr(env.err.msg, bad[i].needle)) print_error("\"%s\" lacks \"%s\"\n", env.err.msg, bad[i].needle);
    assert_non_null(strstr(env.err.msg, bad[i].needle));
  }
}

/* ============================== loader =============================================== */

/* The set through vl_loader with masks: 48 -> 32 resize, every sample once, y holds valid
 * class ids (background and objects both), x is finite, and 2 workers with batched collate
 * give the same batches as the caller's thread with per-sample collate. */
static void test_loader_end_to_end(void **state) {
  (void)state;
  vl_segset *s = open_ok(g_set);
  vl_dataset d = vl_segset_dataset(s);
  const int crop = 32;
  const size_t F = 3 * (size_t)crop * crop, P = (size_t)crop * crop;
  float *x0 = malloc(N_SET * F * sizeof(float));
  int32_t *y0 = malloc(N_SET * P * sizeof(int32_t));
  assert_non_null(x0);
  assert_non_null(y0);
  for (int mode = 0; mode < 2; mode++) {
    vl_loader_cfg c;
    vl_loader_cfg_default(&c);
    c.masks = true;
    c.batch = 5;
    c.crop = crop;
    c.seed = 3;
    c.workers = mode ? 2 : 0;
    c.batched_collate = mode;
    vl_loader *l = NULL;
    vl_err err;
    vl_status st = vl_loader_create(&l, &c, &d, &err);
    if (st != VL_OK) print_error("create: %s\n", err.msg);
    assert_int_equal(st, VL_OK);
    assert_int_equal(vl_loader_start_epoch(l, 1), VL_OK);
    vl_batch_buf *b;
    int64_t got = 0, hist[CLASSES] = {0};
    int seen[N_SET] = {0};
    while ((st = vl_loader_next(l, &b)) == VL_OK && b) {
      assert_non_null(b->y);
      for (int64_t k = 0; k < b->n; k++) {
        seen[b->index[k]]++;
        const float *x = b->x + k * F;
        const int32_t *y = b->y + k * P;
        for (size_t q = 0; q < F; q++) assert_true(isfinite(x[q]));
        for (size_t q = 0; q < P; q++) {
          assert_true(y[q] >= 0 && y[q] < CLASSES);
          hist[y[q]]++;
        }
        if (mode == 0) {
          memcpy(x0 + (size_t)(got + k) * F, x, F * sizeof(float));
          memcpy(y0 + (size_t)(got + k) * P, y, P * sizeof(int32_t));
        } else {
          assert_memory_equal(x0 + (size_t)(got + k) * F, x, F * sizeof(float));
          assert_memory_equal(y0 + (size_t)(got + k) * P, y, P * sizeof(int32_t));
        }
      }
      got += b->n;
      vl_loader_release(l, b);
    }
    assert_int_equal(st, VL_OK);
    assert_int_equal(got, N_SET);
    for (int i = 0; i < N_SET; i++) assert_int_equal(seen[i], 1);
    for (int k = 0; k < CLASSES; k++) assert_true(hist[k] > 0);
    vl_loader_stats ls;
    vl_loader_stats_get(l, &ls);
    assert_true(ls.host_bytes_peak <= ls.host_bytes_bound);
    vl_loader_destroy(l);
  }
  free(x0);
  free(y0);
  vl_segset_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generate_and_read),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_alignment),
      cmocka_unit_test(test_class_frequencies),
      cmocka_unit_test(test_corrupt_modes),
      cmocka_unit_test(test_mask_files),
      cmocka_unit_test(test_manifest_errors),
      cmocka_unit_test(test_generate_errors),
      cmocka_unit_test(test_loader_end_to_end),
      cmocka_unit_test(test_fifo_and_oversized),
      cmocka_unit_test(test_mask_header_strict),
      cmocka_unit_test(test_first_use),
      cmocka_unit_test(test_case_knobs),
  };
  return cmocka_run_group_tests(tests, setup, tu_tmp_teardown);
}
