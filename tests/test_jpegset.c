/* The synthetic JPEG set (datasets/jpegset): generation, manifest, decoding through the
 * vl_dataset interface, determinism, damaged files, malformed manifests, decode rate; and
 * what a shared set may hold: FIFOs, oversized files, files without their own tables
 * (decoded the same in any order and worker count), CMYK, a bare start marker, damaged
 * or foreign set folders on first use, and the dataloader case's corrupt and
 * max_file_bytes knobs. */
#define _GNU_SOURCE
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "datasets/jpegset.h"

static char g_set[300];  /* the shared 12-image set */
#define N_SET 12
#define SEED 7

static tu_progress g_prog; /* what the shared set's generation reported */

static int setup(void **state) {
  (void)state;
  if (tu_tmpdir(tu_tmp, sizeof tu_tmp, "vl_jpegset_test_") != 0) return -1;
  snprintf(g_set, sizeof g_set, "%s/a/b/set", tu_tmp); /* parents made too */
  vl_err err;
  if (vl_jpegset_generate(g_set, N_SET, SEED, 90, tu_on_progress, &g_prog, &err) != 0) {
    fprintf(stderr, "generate: %s\n", err.msg);
    return -1;
  }
  return 0;
}

/* Generated set: sizes in range, manifest agrees with the files, every image decodes to
 * the manifest's size and label, pixels are textured (not constant, not pure noise). */
static void test_generate_and_decode(void **state) {
  (void)state;
  tu_assert_progress_done(&g_prog, N_SET);

  vl_err err;
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, g_set, &err), VL_OK);
  assert_int_equal(vl_jpegset_len(s), N_SET);
  vl_jpegset_info info;
  vl_jpegset_info_get(s, &info);
  assert_int_equal(info.n, N_SET);
  assert_int_equal(info.version, VL_JPEGSET_VERSION);
  assert_int_equal(info.num_classes, 1000);
  assert_int_equal(info.quality, 90);
  assert_int_equal(info.seed, SEED);

  vl_dataset d = vl_jpegset_dataset(s);
  assert_int_equal(d.len(d.self), N_SET);
  assert_true(d.scratch_bytes >= (size_t)info.max_bytes);
  assert_int_equal(d.max_image_bytes, (size_t)info.max_w * info.max_h * 3);
  void *scr = d.scratch_new(d.self);
  assert_non_null(scr);
  vl_image img = {0}, img2 = {0};
  int64_t total = 0;
  for (int64_t i = 0; i < N_SET; i++) {
    int32_t label;
    int w, h;
    int64_t bytes;
    assert_int_equal(vl_jpegset_item(s, i, &label, &w, &h, &bytes), 0);
    assert_in_range(w, 400, 600);
    assert_in_range(h, 300, 450);
    assert_in_range(label, 0, 999);
    char path[512];
    assert_non_null(vl_jpegset_path(s, i, path, sizeof path));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, bytes);
    total += bytes;

    assert_int_equal(d.read(d.self, scr, i, &img, &err), VL_OK);
    assert_int_equal(img.w, w);
    assert_int_equal(img.h, h);
    assert_int_equal(img.c, 3);
    assert_int_equal(img.label, label);
    assert_true(img.cap >= (size_t)w * h * 3);
    assert_true((size_t)w * h * 3 <= d.max_image_bytes);
    /* Textured: many distinct values, a spread, and neighbours mostly close (smooth
     * content plus noise, not white noise). */
    size_t np = (size_t)w * h * 3;
    int seen[256] = {0}, distinct = 0;
    double sum = 0, sum2 = 0, dx = 0;
    for (size_t k = 0; k < np; k++) {
      uint8_t v = img.pix[k];
      if (!seen[v]++) distinct++;
      sum += v;
      sum2 += (double)v * v;
      if (k % ((size_t)w * 3) >= 3) dx += abs((int)v - (int)img.pix[k - 3]);
    }
    double mean = sum / np, sd = sqrt(sum2 / np - mean * mean);
    dx /= (double)(w - 1) * h * 3;
    assert_true(distinct > 100);
    assert_true(sd > 10);
    assert_true(dx > 1.0 && dx < 25.0);

    /* A NULL scratch decodes the same pixels. */
    assert_int_equal(d.read(d.self, NULL, i, &img2, &err), VL_OK);
    assert_memory_equal(img.pix, img2.pix, np);
  }
  assert_int_equal(total, info.total_bytes);
  /* Out of range index: an argument error, not I/O. */
  assert_int_equal(d.read(d.self, scr, N_SET, &img, &err), VL_ERR_INVALID);
  char pb[512];
  assert_null(vl_jpegset_path(s, -1, pb, sizeof pb));
  assert_null(vl_jpegset_path(s, 0, pb, 4));
  d.scratch_free(d.self, scr);
  free(img.pix);
  free(img2.pix);
  vl_jpegset_close(s);
}

/* Same seed -> byte-identical files and manifest, whatever the thread count or n (image i
 * depends only on seed and i); another seed -> different images. */
static void test_determinism(void **state) {
  (void)state;
  char d1[300], d2[300], d3[300];
  vl_err err;
  tu_join(d1, sizeof d1, tu_tmp, "det1");
  tu_join(d2, sizeof d2, tu_tmp, "det2");
  tu_join(d3, sizeof d3, tu_tmp, "det3");
  vl_jpegset_gen_cfg c;
  vl_jpegset_gen_cfg_default(&c);
  c.n = 3;
  c.seed = SEED;
  c.threads = 1;
  assert_int_equal(vl_jpegset_generate_ex(d1, &c, &err), VL_OK);
  c.threads = 3;
  assert_int_equal(vl_jpegset_generate_ex(d2, &c, &err), VL_OK);
  c.seed = SEED + 1;
  assert_int_equal(vl_jpegset_generate_ex(d3, &c, &err), VL_OK);
  char a[400], b[400], x[400];
  snprintf(a, sizeof a, "%s/manifest.tsv", d1);
  snprintf(b, sizeof b, "%s/manifest.tsv", d2);
  assert_true(tu_same_file(a, b));
  for (int i = 0; i < 3; i++) {
    snprintf(a, sizeof a, "%s/img_%07d.jpg", d1, i);
    snprintf(b, sizeof b, "%s/img_%07d.jpg", d2, i);
    snprintf(x, sizeof x, "%s/img_%07d.jpg", g_set, i);
    assert_true(tu_same_file(a, b));
    assert_true(tu_same_file(a, x)); /* the 12-image set: OpenMP's default threads */
    snprintf(b, sizeof b, "%s/img_%07d.jpg", d3, i);
    assert_false(tu_same_file(a, b));
  }
  /* Nothing but the images and the manifest is left behind (no temporary files). */
  DIR *dp = opendir(d1);
  assert_non_null(dp);
  int entries = 0;
  for (struct dirent *e; (e = readdir(dp));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    entries++;
    if (strstr(e->d_name, "tmp")) {
      print_error("left behind: %s\n", e->d_name);
      fail();
    }
  }
  closedir(dp);
  assert_int_equal(entries, 4);
}

/* Each damage mode gives VL_ERR_IO naming the file (with TurboJPEG's words), never a
 * crash; the same scratch then decodes the intact images. */
static void test_corrupt_files(void **state) {
  (void)state;
  char dir[300];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "corrupt");
  assert_int_equal(vl_jpegset_generate(dir, 6, 99, 90, NULL, NULL, &err), VL_OK);
  for (int mode = 0; mode < 3; mode++) assert_int_equal(tu_jpegset_corrupt(dir, mode, mode, err.msg, sizeof err.msg), 0);
  assert_int_equal(tu_jpegset_corrupt(dir, 0, 3, err.msg, sizeof err.msg), -1);
  assert_non_null(strstr(err.msg, "mode"));
  assert_int_equal(tu_jpegset_corrupt(dir, 6, 0, err.msg, sizeof err.msg), -1);
  /* Image 3 goes missing; image 4 gets trailing bytes (still decodes, but changed). */
  char p[400];
  snprintf(p, sizeof p, "%s/img_0000003.jpg", dir);
  assert_int_equal(unlink(p), 0);
  snprintf(p, sizeof p, "%s/img_0000004.jpg", dir);
  FILE *f = fopen(p, "ab");
  assert_non_null(f);
  fputs("trailing", f);
  fclose(f);

  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, dir, &err), VL_OK);
  vl_dataset d = vl_jpegset_dataset(s);
  void *scr = d.scratch_new(d.self);
  assert_non_null(scr);
  vl_image img = {0};
  static const char *want[5] = {"TurboJPEG", "TurboJPEG", "TurboJPEG", "cannot open", "changed"};
  for (int rep = 0; rep < 2; rep++) {
    for (int i = 0; i < 5; i++) {
      err.msg[0] = '\0';
      assert_int_equal(d.read(d.self, scr, i, &img, &err), VL_ERR_IO);
      char name[32];
      snprintf(name, sizeof name, "img_%07d.jpg", i);
      if (!strstr(err.msg, name) || !strstr(err.msg, want[i])) {
        print_error("image %d: message \"%s\" lacks \"%s\" or \"%s\"\n", i, err.msg, name, want[i]);
        fail();
      }
    }
    assert_int_equal(d.read(d.self, scr, 5, &img, &err), VL_OK);
    assert_int_equal(img.c, 3);
  }
  /* A file cut inside its header (the Huffman tables) leaves TurboJPEG 2.1's handle broken
   * for the next file unless the reader replaces it: the good image read right after it
   * with the same scratch must decode. */
  snprintf(p, sizeof p, "%s/img_0000001.jpg", dir);
  assert_int_equal(truncate(p, 400), 0);
  assert_int_equal(d.read(d.self, scr, 1, &img, &err), VL_ERR_IO);
  err.msg[0] = '\0';
  if (d.read(d.self, scr, 5, &img, &err) != VL_OK) {
    print_error("a good image after one cut in its header: %s\n", err.msg);
    fail();
  }
  /* The truncated one is reported as such; the garbage one by TurboJPEG too. */
  assert_int_equal(d.read(d.self, scr, 0, &img, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "manifest says"));
  /* The decode ceiling refuses a damaged set, naming the file: image 3 is missing (all
   * files are read before decoding starts), and with 3 images image 0 fails to decode. */
  double rate = 0;
  assert_int_not_equal(vl_jpegset_decode_rate(s, 6, &rate, &err), VL_OK);
  assert_true(rate < 0);
  assert_non_null(strstr(err.msg, "img_0000003.jpg"));
  assert_int_not_equal(vl_jpegset_decode_rate(s, 3, &rate, &err), VL_OK);
  assert_true(rate < 0);
  assert_non_null(strstr(err.msg, "img_0000000.jpg"));
  d.scratch_free(d.self, scr);
  free(img.pix);
  vl_jpegset_close(s);
}

static void expect_open_error(const char *dir, const char *manifest, const char *what1,
                              const char *what2) {
  char path[400];
  vl_err err = {""};
  snprintf(path, sizeof path, "%s/manifest.tsv", dir);
  if (manifest) tu_write_text(path, manifest);
  else unlink(path);
  vl_jpegset *s = (vl_jpegset *)&err; /* must be reset to NULL */
  assert_int_not_equal(vl_jpegset_open(&s, dir, &err), VL_OK);
  assert_null(s);
  if (!strstr(err.msg, "manifest.tsv") || !strstr(err.msg, what1) || (what2 && !strstr(err.msg, what2))) {
    print_error("manifest error \"%s\" lacks \"%s\"/\"%s\"\n", err.msg, what1, what2 ? what2 : "");
    fail();
  }
}

/* Missing manifest, wrong header or version, malformed lines (with their line number),
 * a count that disagrees with the header. */
static void test_manifest_errors(void **state) {
  (void)state;
  char dir[300];
  tu_join(dir, sizeof dir, tu_tmp, "manifests");
  assert_int_equal(mkdir(dir, 0755), 0);
  const char *H = "# vramlab-jpegset version=1 n=2 classes=10\n";
  char m[512];
  expect_open_error(dir, NULL, "No such file", "vramlab data gen");
  expect_open_error(dir, "", ":1:", "empty manifest");
  expect_open_error(dir, "file\tlabel\n", ":1:", "not a vramlab-jpegset manifest");
  expect_open_error(dir, "# vramlab-jpegset version=2 n=1\na.jpg\t0\t1\t1\t1\n", ":1:",
                    "unknown manifest version 2");
  expect_open_error(dir, "# vramlab-jpegset n=1\na.jpg\t0\t1\t1\t1\n", ":1:", "no version");
  static const struct { const char *lines, *what1, *what2; } bad[] = { /* after the header H */
      {"a.jpg\t1\t500\t375\t1000\nb.jpg\t1\t500\t375\n", ":3:", "expected 5"},
      {"a.jpg\t1\t500\t375\t1000\nb.jpg\tx\t500\t375\t10\n", ":3:", "label"},
      {"a.jpg\t10\t500\t375\t1000\n", ":2:", "0..9"},
      {"a.jpg\t1\t-5\t375\t1000\n", ":2:", "width"},
      {"a.jpg\t1\t500\t375\t10x\n", ":2:", "bytes"},
      {"../a.jpg\t1\t500\t375\t10\n", ":2:", "file name"},
      {"a.jpg\t1\t500\t375\t10\n\nb.jpg\t1\t500\t375\t10\n", ":3:", "empty line"},
      {"a.jpg\t1\t500\t375\t10\n", "n=2", "1 image lines"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    snprintf(m, sizeof m, "%s%s", H, bad[k].lines);
    expect_open_error(dir, m, bad[k].what1, bad[k].what2);
  }

  /* A valid manifest whose file is missing opens (images are not read) and fails on read. */
  snprintf(m, sizeof m, "%sa.jpg\t1\t500\t375\t10\r\nb.jpg\t9\t400\t300\t20\n", H);
  char path[400];
  vl_err err;
  snprintf(path, sizeof path, "%s/manifest.tsv", dir);
  tu_write_text(path, m);
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, dir, &err), VL_OK);
  assert_int_equal(vl_jpegset_len(s), 2);
  int32_t label;
  int w;
  assert_int_equal(vl_jpegset_item(s, 1, &label, &w, NULL, NULL), 0);
  assert_int_equal(label, 9);
  assert_int_equal(w, 400);
  assert_int_equal(vl_jpegset_item(s, 2, NULL, NULL, NULL, NULL), -1);
  vl_dataset d = vl_jpegset_dataset(s);
  vl_image img = {0};
  assert_int_equal(d.read(d.self, NULL, 0, &img, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "a.jpg"));
  free(img.pix);
  vl_jpegset_close(s);
}

/* Bad generation arguments fail with a message and write nothing. */
static void test_generate_errors(void **state) {
  (void)state;
  char dir[300];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "bad");
  err.msg[0] = '\0';
  assert_int_not_equal(vl_jpegset_generate(dir, 0, 1, 90, NULL, NULL, &err), VL_OK);
  assert_non_null(strstr(err.msg, "n must be"));
  assert_int_not_equal(vl_jpegset_generate(dir, 2, 1, 101, NULL, NULL, &err), VL_OK);
  assert_non_null(strstr(err.msg, "quality"));
  struct stat st;
  assert_int_not_equal(stat(dir, &st), 0);
  char under_file[400];
  snprintf(under_file, sizeof under_file, "%s/manifest.tsv/sub", g_set);
  assert_int_not_equal(vl_jpegset_generate(under_file, 2, 1, 90, NULL, NULL, &err), VL_OK);
  assert_non_null(strstr(err.msg, "manifest.tsv"));
}

static void test_decode_rate(void **state) {
  (void)state;
  vl_err err;
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, g_set, &err), VL_OK);
  double r = 0;
  assert_int_equal(vl_jpegset_decode_rate(s, 1000, &r, &err), VL_OK); /* capped at the set size */
  assert_true(r > 0);
  assert_true(r < 1e6);
  assert_int_equal(vl_jpegset_decode_rate(s, 0, &r, &err), VL_ERR_INVALID);
  assert_true(r < 0);
  vl_jpegset_close(s);
}

/* ============================== hardening ============================================ */

/* What one epoch through the loader delivered. */
typedef struct {
  vl_status st;
  int64_t n, skipped;
  bool seen[64];
  char last_error[256];
} epoch_res;

/* One epoch of d (at most 64 samples) through a loader with `workers` workers, policy pol
 * and, when max_file is not 0, that file limit. */
static epoch_res loader_epoch(vl_dataset *d, int workers, vl_corrupt_policy pol, uint64_t max_file) {
  vl_loader_cfg c;
  vl_loader_cfg_default(&c);
  c.batch = 2;
  c.crop = 16;
  c.seed = 3;
  c.workers = workers;
  c.on_corrupt = pol;
  if (max_file) c.max_file_bytes = max_file;
  vl_loader *l = NULL;
  vl_err err;
  vl_status st = vl_loader_create(&l, &c, d, &err);
  if (st != VL_OK) print_error("create: %s\n", err.msg);
  assert_int_equal(st, VL_OK);
  epoch_res r;
  memset(&r, 0, sizeof r);
  assert_int_equal(vl_loader_start_epoch(l, 0), VL_OK);
  vl_batch_buf *b;
  while ((r.st = vl_loader_next(l, &b)) == VL_OK && b) {
    for (int64_t k = 0; k < b->n; k++) {
      assert_in_range(b->index[k], 0, 63);
      r.seen[b->index[k]] = true;
    }
    r.n += b->n;
    vl_loader_release(l, b);
  }
  vl_loader_stats ls;
  vl_loader_stats_get(l, &ls);
  r.skipped = ls.skipped;
  snprintf(r.last_error, sizeof r.last_error, "%s", ls.last_error);
  vl_loader_destroy(l);
  return r;
}

/* Sample i of the n in d is corrupt, saying `what`: skipped under SKIP, the epoch's error
 * under ERROR, with 0 and 2 workers. */
static void expect_bad_sample(vl_dataset *d, int64_t i, int64_t n, const char *what) {
  for (int w = 0; w <= 2; w += 2) {
    epoch_res r = loader_epoch(d, w, VL_CORRUPT_SKIP, 0);
    if (r.st != VL_OK) print_error("workers %d: %s\n", w, r.last_error);
    assert_int_equal(r.st, VL_OK);
    assert_int_equal(r.n, n - 1);
    assert_int_equal(r.skipped, 1);
    assert_false(r.seen[i]);
    r = loader_epoch(d, w, VL_CORRUPT_ERROR, 0);
    assert_int_equal(r.st, VL_ERR_IO);
    char sample[32];
    snprintf(sample, sizeof sample, "sample %lld", (long long)i);
    if (!strstr(r.last_error, sample) || !strstr(r.last_error, what))
      print_error("last_error \"%s\" lacks \"%s\" or \"%s\"\n", r.last_error, sample, what);
    assert_non_null(strstr(r.last_error, sample));
    assert_non_null(strstr(r.last_error, what));
  }
}

/* A FIFO in place of an image (or of the manifest) is refused at once as not a regular
 * file, never waited on: the watchdog turns a blocking open into a failure. */
static void test_fifo_in_set(void **state) {
  (void)state;
  char dir[300], p[400];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "fifo");
  assert_int_equal(vl_jpegset_generate(dir, 5, 31, 90, NULL, NULL, &err), VL_OK);
  snprintf(p, sizeof p, "%s/img_0000002.jpg", dir);
  assert_int_equal(unlink(p), 0);
  assert_int_equal(mkfifo(p, 0644), 0);
  tu_watchdog(30, "test_fifo_in_set: reading a FIFO in the set blocked");
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, dir, &err), VL_OK);
  vl_dataset d = vl_jpegset_dataset(s);
  vl_image img = {0};
  assert_int_equal(d.read(d.self, NULL, 2, &img, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "img_0000002.jpg: not a regular file (fifo)"));
  expect_bad_sample(&d, 2, 5, "img_0000002.jpg: not a regular file (fifo)");
  /* A directory in its place: the same, said as such. */
  assert_int_equal(unlink(p), 0);
  assert_int_equal(mkdir(p, 0755), 0);
  assert_int_equal(d.read(d.self, NULL, 2, &img, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "not a regular file (directory)"));
  assert_int_equal(rmdir(p), 0);
  vl_jpegset_close(s);
  /* The manifest a FIFO: opening the set does not wait for a writer either. */
  snprintf(p, sizeof p, "%s/manifest.tsv", dir);
  assert_int_equal(unlink(p), 0);
  assert_int_equal(mkfifo(p, 0644), 0);
  assert_int_not_equal(vl_jpegset_open(&s, dir, &err), VL_OK);
  assert_non_null(strstr(err.msg, "manifest.tsv: not a regular file (fifo)"));
  tu_watchdog(0, NULL);
  free(img.pix);
}

/* A 3 GiB (sparse) file in place of an image is refused from its size, before a byte is
 * read: fast, without the memory, and as a corrupt sample (skipped under SKIP). The
 * loader's max_file_bytes reaches every worker's reader. */
static void test_oversized_file(void **state) {
  (void)state;
  char dir[300], p[400];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "big");
  assert_int_equal(vl_jpegset_generate(dir, 5, 32, 90, NULL, NULL, &err), VL_OK);
  snprintf(p, sizeof p, "%s/img_0000003.jpg", dir);
  tu_sparse_file(p, 3ull << 30);
  const long rss0 = tu_peak_rss_kib();
  const double t0 = vl_now();
  tu_watchdog(60, "test_oversized_file: reading a 3 GiB file");
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, dir, &err), VL_OK);
  vl_dataset d = vl_jpegset_dataset(s);
  vl_image img = {0};
  assert_int_equal(d.read(d.self, NULL, 3, &img, &err), VL_ERR_IO);
  const char *want = "img_0000003.jpg: file of 3221225472 bytes exceeds max_file_bytes (67108864)";
  if (!strstr(err.msg, want)) print_error("\"%s\" lacks \"%s\"\n", err.msg, want);
  assert_non_null(strstr(err.msg, want));
  expect_bad_sample(&d, 3, 5, want);
  /* At 1000 bytes every image (all larger) is oversized, in every worker. */
  for (int64_t i = 0; i < 5; i++) {
    int64_t bytes;
    assert_int_equal(vl_jpegset_item(s, i, NULL, NULL, NULL, &bytes), 0);
    assert_true(bytes > 1000);
  }
  for (int w = 0; w <= 2; w += 2) {
    epoch_res r = loader_epoch(&d, w, VL_CORRUPT_SKIP, 1000);
    assert_int_equal(r.st, VL_OK);
    assert_int_equal(r.n, 0);
    assert_int_equal(r.skipped, 5);
    r = loader_epoch(&d, w, VL_CORRUPT_ERROR, 1000);
    assert_int_equal(r.st, VL_ERR_IO);
    assert_non_null(strstr(r.last_error, "exceeds max_file_bytes (1000)"));
  }
  tu_watchdog(0, NULL);
  const double dt = vl_now() - t0;
  const long grown = tu_peak_rss_kib() - rss0;
  if (dt > 10 || grown > 64 * 1024)
    print_error("%.1f s, peak RSS grew by %ld KiB\n", dt, grown);
  assert_true(dt < 10);
  assert_true(grown < 64 * 1024);
  free(img.pix);
  vl_jpegset_close(s);
}

/* ---- decoding does not depend on what was decoded before ------------------------------ */

/* in without its DQT segments: a file that relies on quantisation tables it does not carry
 * (an abbreviated stream). out holds n bytes. */
static size_t strip_dqt(const uint8_t *in, size_t n, uint8_t *out) {
  size_t o = 2, k = 2;
  memcpy(out, in, 2); /* SOI */
  while (k + 4 <= n && in[k] == 0xFF && in[k + 1] != 0xDA) {
    size_t seg = 2 + ((size_t)in[k + 2] << 8 | in[k + 3]);
    if (in[k + 1] != 0xDB) {
      memcpy(out + o, in + k, seg);
      o += seg;
    }
    k += seg;
  }
  memcpy(out + o, in + k, n - k); /* SOS and the scan */
  return o + n - k;
}

/* The tables of in alone: SOI, its DQT and DHT segments, EOI (a "tables-only" stream). */
static size_t tables_only(const uint8_t *in, size_t n, uint8_t *out) {
  size_t o = 2, k = 2;
  memcpy(out, in, 2);
  while (k + 4 <= n && in[k] == 0xFF && in[k + 1] != 0xDA) {
    size_t seg = 2 + ((size_t)in[k + 2] << 8 | in[k + 3]);
    if (in[k + 1] == 0xDB || in[k + 1] == 0xC4) {
      memcpy(out + o, in + k, seg);
      o += seg;
    }
    k += seg;
  }
  out[o++] = 0xFF;
  out[o++] = 0xD9;
  return o;
}

/* Whether a DQT segment comes before the scan. */
static bool has_dqt(const uint8_t *b, size_t n) {
  for (size_t k = 2; k + 4 <= n && b[k] == 0xFF && b[k + 1] != 0xDA;
       k += 2 + ((size_t)b[k + 2] << 8 | b[k + 3]))
    if (b[k + 1] == 0xDB) return true;
  return false;
}

#define MIX_N 10

/* A dataset that records what the one it wraps gives for each sample: status, message and
 * a hash of the decoded image. The loader reads each sample once per epoch, so each slot
 * has one writer; the epoch's end (workers joined or parked) orders it before the checks. */
typedef struct {
  vl_dataset in;
  vl_status st[MIX_N];
  uint64_t hash[MIX_N];
  char msg[MIX_N][256];
  atomic_int reads[MIX_N];
} recorder;

static uint64_t image_hash(const vl_image *im) {
  int32_t head[4] = {im->w, im->h, im->c, im->label};
  return tu_hash(im->pix, (size_t)im->w * im->h * 3, tu_hash(head, sizeof head, TU_HASH0));
}

static void rec_reset(recorder *r) {
  for (int i = 0; i < MIX_N; i++) {
    r->st[i] = VL_ERR_INVALID;
    r->hash[i] = 0;
    r->msg[i][0] = 0;
    atomic_store(&r->reads[i], 0);
  }
}

static int64_t rec_len(void *self) { return ((recorder *)self)->in.len(((recorder *)self)->in.self); }
static void *rec_scratch_new(void *self) { return ((recorder *)self)->in.scratch_new(((recorder *)self)->in.self); }
static void rec_scratch_free(void *self, void *scr) {
  ((recorder *)self)->in.scratch_free(((recorder *)self)->in.self, scr);
}
static void rec_scratch_limit(void *self, void *scr, uint64_t max) {
  ((recorder *)self)->in.scratch_limit(((recorder *)self)->in.self, scr, max);
}
static vl_status rec_read(void *self, void *scr, int64_t i, vl_image *out, vl_err *err) {
  recorder *r = self;
  vl_status st = r->in.read(r->in.self, scr, i, out, err);
  if (i >= 0 && i < MIX_N) {
    r->st[i] = st;
    r->hash[i] = st == VL_OK ? image_hash(out) : 0;
    snprintf(r->msg[i], sizeof r->msg[i], "%s", st == VL_OK ? "" : err->msg);
    atomic_fetch_add(&r->reads[i], 1);
  }
  return st;
}

static vl_dataset rec_dataset(recorder *r) {
  vl_dataset d = r->in;
  d.self = r;
  d.len = rec_len;
  d.scratch_new = rec_scratch_new;
  d.scratch_free = rec_scratch_free;
  d.scratch_limit = rec_scratch_limit;
  d.read = rec_read;
  return d;
}

/* A mixed set: good images, copies of good ones without their DQT segments, a truncated
 * one, one with garbage in its scan, a bare start marker, a tables-only stream. Each
 * sample's status and pixels are the same decoded alone (a fresh reader), in one reader
 * backwards, and through the loader with 0..3 workers, shuffled with several seeds: an
 * image decodes from its own bytes only. A JPEG without DQT is corrupt every time. */
static void test_decode_independent_of_order(void **state) {
  (void)state;
  char dir[300], p[400], q[400];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "mixed");
  assert_int_equal(vl_jpegset_generate(dir, MIX_N, 21, 90, NULL, NULL, &err), VL_OK);
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, dir, &err), VL_OK);
  int32_t lab[MIX_N];
  int w[MIX_N], h[MIX_N];
  int64_t bytes[MIX_N];
  for (int i = 0; i < MIX_N; i++)
    assert_int_equal(vl_jpegset_item(s, i, &lab[i], &w[i], &h[i], &bytes[i]), 0);
  vl_jpegset_close(s);

  /* 1, 4, 9: images 0, 2, 7 without their DQT, each right after its source in file order
   * (a reused decoder would still hold the source's tables); 8: image 7's tables alone. */
  static const int nodqt[3][2] = {{1, 0}, {4, 2}, {9, 7}};
  for (int k = 0; k < 3; k++) {
    const int i = nodqt[k][0], src = nodqt[k][1];
    snprintf(p, sizeof p, "%s/img_%07d.jpg", dir, src);
    snprintf(q, sizeof q, "%s/img_%07d.jpg", dir, i);
    uint8_t *in, *out;
    size_t n = tu_slurp(p, &in);
    out = malloc(n);
    assert_non_null(out);
    size_t m = strip_dqt(in, n, out);
    assert_true(has_dqt(in, n));
    assert_false(has_dqt(out, m));
    assert_true(m < n);
    tu_write_bytes(q, out, m);
    w[i] = w[src], h[i] = h[src], lab[i] = lab[src], bytes[i] = (int64_t)m;
    if (src == 7) { /* 8: the tables-only stream of 7 */
      snprintf(q, sizeof q, "%s/img_%07d.jpg", dir, 8);
      m = tables_only(in, n, out);
      tu_write_bytes(q, out, m);
      bytes[8] = (int64_t)m;
    }
    free(in);
    free(out);
  }
  assert_int_equal(tu_jpegset_corrupt(dir, 3, TU_JPEG_TRUNCATE, err.msg, sizeof err.msg), 0);
  assert_int_equal(tu_jpegset_corrupt(dir, 5, TU_JPEG_GARBAGE, err.msg, sizeof err.msg), 0);
  snprintf(q, sizeof q, "%s/img_%07d.jpg", dir, 6); /* a bare start marker */
  tu_write_bytes(q, "\xFF\xD8", 2);
  bytes[6] = 2;
  /* The manifest lists the files as they now are (the truncated one keeps its old size). */
  char man[4096];
  int len = snprintf(man, sizeof man, "# vramlab-jpegset version=1 n=%d classes=1000 seed=21 quality=90\n", MIX_N);
  for (int i = 0; i < MIX_N; i++)
    len += snprintf(man + len, sizeof man - (size_t)len, "img_%07d.jpg\t%d\t%d\t%d\t%lld\n", i, lab[i], w[i],
                    h[i], (long long)bytes[i]);
  snprintf(p, sizeof p, "%s/manifest.tsv", dir);
  tu_write_text(p, man);

  assert_int_equal(vl_jpegset_open(&s, dir, &err), VL_OK);
  recorder alone, r;
  memset(&alone, 0, sizeof alone);
  memset(&r, 0, sizeof r);
  alone.in = r.in = vl_jpegset_dataset(s);
  vl_dataset da = rec_dataset(&alone), dr = rec_dataset(&r);
  vl_image img = {0};
  rec_reset(&alone);
  for (int i = 0; i < MIX_N; i++) da.read(da.self, NULL, i, &img, &err);
  static const struct { int i; const char *what; } bad[] = {
      {1, "missing quantisation table"}, {3, "TurboJPEG"},
      {4, "missing quantisation table"}, {5, "corrupt or truncated JPEG"},
      {6, "truncated JPEG (no frame header)"}, {8, "truncated JPEG (no frame header)"},
      {9, "missing quantisation table"}};
  int nbad = (int)(sizeof bad / sizeof bad[0]);
  for (int i = 0, b = 0; i < MIX_N; i++) {
    if (b < nbad && bad[b].i == i) {
      if (alone.st[i] != VL_ERR_IO || !strstr(alone.msg[i], bad[b].what))
        print_error("image %d alone: %s \"%s\" (want \"%s\")\n", i, vl_status_name(alone.st[i]),
                    alone.msg[i], bad[b].what);
      assert_int_equal(alone.st[i], VL_ERR_IO);
      assert_non_null(strstr(alone.msg[i], bad[b].what));
      b++;
    } else {
      assert_int_equal(alone.st[i], VL_OK);
    }
  }
  /* One reader for all, backwards, then forwards: each source is read right before its
   * copy without tables in one of the two directions. */
  void *scr = dr.scratch_new(dr.self);
  assert_non_null(scr);
  for (int dirn = 0; dirn < 2; dirn++) {
    rec_reset(&r);
    for (int k = 0; k < MIX_N; k++) dr.read(dr.self, scr, dirn ? k : MIX_N - 1 - k, &img, &err);
    for (int i = 0; i < MIX_N; i++) {
      if (r.st[i] != alone.st[i]) print_error("one reader, image %d: %s\n", i, r.msg[i]);
      assert_int_equal(r.st[i], alone.st[i]);
      assert_true(r.hash[i] == alone.hash[i]);
    }
  }
  dr.scratch_free(dr.self, scr);
  int64_t n_ok = 0;
  for (int i = 0; i < MIX_N; i++) n_ok += alone.st[i] == VL_OK;

  static const struct { int workers, prefetch; bool shuffle; uint64_t seed; } runs[] = {
      {0, 2, false, 0}, {0, 2, true, 1}, {1, 1, false, 0}, {1, 3, true, 2},
      {2, 1, true, 3},  {2, 2, false, 0}, {3, 1, true, 4}, {3, 3, true, 5},
  };
  for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++)
    for (int64_t e = 0; e < 2; e++) {
      vl_loader_cfg c;
      vl_loader_cfg_default(&c);
      c.batch = 3;
      c.crop = 16;
      c.workers = runs[ri].workers;
      c.prefetch = runs[ri].prefetch;
      c.shuffle = runs[ri].shuffle;
      c.seed = runs[ri].seed;
      c.on_corrupt = VL_CORRUPT_SKIP;
      vl_loader *l = NULL;
      assert_int_equal(vl_loader_create(&l, &c, &dr, &err), VL_OK);
      rec_reset(&r);
      assert_int_equal(vl_loader_start_epoch(l, e), VL_OK);
      vl_batch_buf *b;
      vl_status st;
      int64_t got = 0;
      while ((st = vl_loader_next(l, &b)) == VL_OK && b) {
        got += b->n;
        vl_loader_release(l, b);
      }
      assert_int_equal(st, VL_OK);
      vl_loader_stats ls;
      vl_loader_stats_get(l, &ls);
      vl_loader_destroy(l);
      for (int i = 0; i < MIX_N; i++) {
        assert_int_equal(atomic_load(&r.reads[i]), 1);
        if (r.st[i] != alone.st[i] || r.hash[i] != alone.hash[i])
          print_error("workers %d, seed %llu, epoch %lld, image %d: %s \"%s\", alone %s \"%s\"%s\n",
                      runs[ri].workers, (unsigned long long)runs[ri].seed, (long long)e, i,
                      vl_status_name(r.st[i]), r.msg[i], vl_status_name(alone.st[i]),
                      alone.msg[i], r.hash[i] != alone.hash[i] ? " (other pixels)" : "");
        assert_int_equal(r.st[i], alone.st[i]);
        assert_true(r.hash[i] == alone.hash[i]);
        assert_string_equal(r.msg[i], alone.msg[i]);
      }
      assert_int_equal(got, n_ok);
      assert_int_equal(ls.skipped, MIX_N - n_ok);
    }
  free(img.pix);
  vl_jpegset_close(s);
}

/* ---- messages ------------------------------------------------------------------------- */

/* A w x h JPEG of a smooth pattern in pixel format pf (RGB, GRAY or CMYK) into *out. */
static size_t encode(int w, int h, int pf, int samp, uint8_t **out) {
  const int ps = tjPixelSize[pf];
  uint8_t *px = malloc((size_t)w * h * ps);
  assert_non_null(px);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < ps; c++) px[((size_t)y * w + x) * ps + c] = (uint8_t)(x * 5 + y * 3 + c * 60);
  tjhandle t = tjInitCompress();
  assert_non_null(t);
  unsigned long len = 0;
  *out = NULL;
  int rc = tjCompress2(t, px, w, 0, h, pf, out, &len, samp, 90, 0);
  if (rc) print_error("tjCompress2: %s\n", tjGetErrorStr2(t));
  assert_int_equal(rc, 0);
  tjDestroy(t);
  free(px);
  return len;
}

/* A CMYK JPEG (TurboJPEG writes it as YCCK) is "unsupported colour space CMYK", not
 * "corrupt"; a file holding only a start marker is "truncated JPEG (no frame header)", not
 * a 0x0 image; a grayscale JPEG decodes, to R = G = B. */
static void test_messages(void **state) {
  (void)state;
  char dir[300], p[400], man[1024];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "kinds");
  assert_int_equal(mkdir(dir, 0755), 0);
  uint8_t *cmyk, *gray;
  size_t nc = encode(40, 30, TJPF_CMYK, TJSAMP_444, &cmyk), ng = encode(40, 30, TJPF_GRAY, TJSAMP_GRAY, &gray);
  snprintf(p, sizeof p, "%s/cmyk.jpg", dir);
  tu_write_bytes(p, cmyk, nc);
  snprintf(p, sizeof p, "%s/gray.jpg", dir);
  tu_write_bytes(p, gray, ng);
  snprintf(p, sizeof p, "%s/soi.jpg", dir);
  tu_write_bytes(p, "\xFF\xD8", 2);
  snprintf(man, sizeof man, "# vramlab-jpegset version=1 n=3 classes=2\ncmyk.jpg\t0\t40\t30\t%zu\n"
                            "gray.jpg\t1\t40\t30\t%zu\nsoi.jpg\t0\t40\t30\t2\n", nc, ng);
  snprintf(p, sizeof p, "%s/manifest.tsv", dir);
  tu_write_text(p, man);
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, dir, &err), VL_OK);
  vl_dataset d = vl_jpegset_dataset(s);
  vl_image img = {0};
  assert_int_equal(d.read(d.self, NULL, 0, &img, &err), VL_ERR_IO);
  if (!strstr(err.msg, "cmyk.jpg: unsupported colour space CMYK")) print_error("cmyk: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "cmyk.jpg: unsupported colour space CMYK"));
  assert_null(strstr(err.msg, "corrupt"));
  assert_int_equal(d.read(d.self, NULL, 2, &img, &err), VL_ERR_IO);
  if (!strstr(err.msg, "soi.jpg: truncated JPEG (no frame header)")) print_error("soi: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "soi.jpg: truncated JPEG (no frame header)"));
  assert_null(strstr(err.msg, "0x0"));
  err.msg[0] = 0;
  vl_status st = d.read(d.self, NULL, 1, &img, &err);
  if (st != VL_OK) print_error("gray: %s\n", err.msg);
  assert_int_equal(st, VL_OK);
  assert_int_equal(img.w, 40);
  assert_int_equal(img.h, 30);
  assert_int_equal(img.label, 1);
  for (size_t k = 0; k < 40 * 30; k++) {
    assert_int_equal(img.pix[3 * k], img.pix[3 * k + 1]);
    assert_int_equal(img.pix[3 * k], img.pix[3 * k + 2]);
  }
  tjFree(cmyk);
  tjFree(gray);
  free(img.pix);
  vl_jpegset_close(s);
}

/* ---- first use of a set folder -------------------------------------------------------- */

/* A case's set is made only where nothing (or only an interrupted generation's files) is:
 * a damaged manifest, a set made otherwise and a folder with other files are refused with
 * a message and left exactly as they are. */
/* vl_jpegset_first_use as the number the tests compare: 1 make the set, 0 open it, -1 refused. */
static int first_use_code(vl_jpegset **s, const char *dir, const vl_jpegset_gen_cfg *g, vl_err *err) {
  bool make = false;
  if (vl_jpegset_first_use(s, dir, g, &make, err) != VL_OK) return -1;
  return make ? 1 : 0;
}

static void test_first_use(void **state) {
  (void)state;
  char top[300], dir[320], p[400];
  vl_err err;
  tu_join(top, sizeof top, tu_tmp, "first");
  tu_join(dir, sizeof dir, top, "n4");
  vl_jpegset_gen_cfg g;
  vl_jpegset_gen_cfg_default(&g);
  g.n = 4;
  g.seed = 41;
  g.threads = 1;
  vl_jpegset *s = (vl_jpegset *)&g; /* must be reset to NULL */
  assert_int_equal(first_use_code(&s, dir, &g, &err), 1); /* not there */
  assert_null(s);
  assert_int_equal(mkdir(top, 0755), 0);
  assert_int_equal(mkdir(dir, 0755), 0);
  assert_int_equal(first_use_code(&s, dir, &g, &err), 1); /* empty */
  /* An interrupted generation: numbered images and temporary files, no manifest. */
  static const char *const left[] = {"img_0000000.jpg", ".img_0000001.jpg.tmp.4242", ".manifest.tsv.tmp.17"};
  for (int k = 0; k < 3; k++) {
    tu_join(p, sizeof p, dir, left[k]);
    tu_write_text(p, "partial");
  }
  assert_int_equal(first_use_code(&s, dir, &g, &err), 1);
  assert_int_equal(vl_jpegset_generate_ex(dir, &g, &err), VL_OK);
  assert_int_equal(first_use_code(&s, dir, &g, &err), 0);
  assert_non_null(s);
  assert_int_equal(vl_jpegset_len(s), 4);
  vl_jpegset_close(s);

  /* Made with other settings. */
  vl_jpegset_gen_cfg g2 = g;
  g2.n = 5;
  s = (vl_jpegset *)&g;
  assert_int_equal(first_use_code(&s, dir, &g2, &err), -1);
  assert_null(s);
  assert_non_null(strstr(err.msg, "n=4 seed=41"));
  assert_non_null(strstr(err.msg, "n=5 seed=41"));
  assert_non_null(strstr(err.msg, "left as it is"));
  g2 = g;
  g2.seed = 40;
  assert_int_equal(first_use_code(&s, dir, &g2, &err), -1);

  /* A damaged manifest: refused, naming the file, the line and what is wrong; untouched. */
  tu_join(p, sizeof p, dir, "manifest.tsv");
  uint8_t *orig;
  size_t olen = tu_slurp(p, &orig);
  char *text = malloc(olen + 1);
  assert_non_null(text);
  memcpy(text, orig, olen);
  text[olen] = 0;
  char *l3 = strchr(strchr(text, '\n') + 1, '\n') + 1; /* line 3: img_0000001.jpg<TAB>label... */
  *(strchr(l3, '\t') + 1) = 'x';
  tu_write_text(p, text);
  uint8_t *damaged;
  size_t dlen = tu_slurp(p, &damaged);
  assert_int_equal(first_use_code(&s, dir, &g, &err), -1);
  assert_null(s);
  static const char *const says[] = {"manifest.tsv:3: bad label", "damaged", "delete the folder",
                                     "vramlab data gen --out", "--n 4 --seed 41"};
  for (int k = 0; k < 5; k++) {
    if (!strstr(err.msg, says[k])) print_error("\"%s\" lacks \"%s\"\n", err.msg, says[k]);
    assert_non_null(strstr(err.msg, says[k]));
  }
  uint8_t *after;
  size_t alen = tu_slurp(p, &after);
  assert_int_equal(alen, dlen);
  assert_memory_equal(after, damaged, dlen);
  assert_int_equal(tu_count_entries(dir), 7); /* 4 images, the manifest, 2 stale temporary files */
  free(after);
  /* Cut short (fewer lines than n=): the same. */
  tu_write_bytes(p, orig, (size_t)(strchr(strchr((char *)text, '\n') + 1, '\n') + 1 - text));
  assert_int_equal(first_use_code(&s, dir, &g, &err), -1);
  assert_non_null(strstr(err.msg, "the header says n=4 but 1 image lines follow"));
  tu_write_bytes(p, orig, olen);
  assert_int_equal(first_use_code(&s, dir, &g, &err), 0);
  vl_jpegset_close(s);
  free(orig);
  free(damaged);
  free(text);

  /* A folder with someone's files and no manifest: refused, left alone. */
  char other[320];
  tu_join(other, sizeof other, top, "theirs");
  assert_int_equal(mkdir(other, 0755), 0);
  tu_join(p, sizeof p, other, "notes.txt");
  tu_write_text(p, "mine");
  assert_int_equal(first_use_code(&s, other, &g, &err), -1);
  assert_null(s);
  assert_non_null(strstr(err.msg, "is not empty"));
  assert_non_null(strstr(err.msg, "notes.txt"));
  assert_int_equal(tu_count_entries(other), 1);
  /* A file where the folder should be. */
  assert_int_equal(first_use_code(&s, p, &g, &err), -1);
  assert_non_null(strstr(err.msg, "not a directory"));
}

/* ---- the dataloader case: first use, corrupt and max_file_bytes knobs ------------------- */

/* The case's run; its message in env->err. */
static vl_status run_case(const vl_case *c, vl_case_env *env, const vl_knobs *k, double *skipped) {
  cJSON *o = cJSON_CreateObject();
  env->err.msg[0] = 0;
  vl_status rc = c->run(env, k, 0, o);
  cJSON *sk = cJSON_GetObjectItem(o, "skipped");
  if (skipped) *skipped = sk ? sk->valuedouble : -1;
  cJSON_Delete(o);
  return rc;
}

static void test_dataloader_case(void **state) {
  (void)state;
  const vl_case *c = vl_case_find("dataloader");
  assert_non_null(c);
  char root[300], set[340], p[400];
  vl_err err;
  tu_join(root, sizeof root, tu_tmp, "case");
  snprintf(set, sizeof set, "%s/n6-s3", root);
  vl_knobs setting = {0};
  vl_knob_set(&setting, "data_dir", root);
  vl_knob_set(&setting, "images", "6");
  vl_knob_set(&setting, "data_seed", "3");
  vl_knob_set(&setting, "batch", "2");
  vl_knob_set(&setting, "crop", "8");
  vl_knob_set(&setting, "epochs", "1");
  vl_knob_set(&setting, "consumer_ms", "0");
  vl_case_env env = {.scale = "tiny", .device = VL_DEV_CPU, .setting = &setting, .quiet = 1};
  vl_knobs k = {0};
  vl_knob_set(&k, "corrupt", "skip");
  vl_knob_set(&k, "max_file_bytes", "1MiB");
  assert_int_equal(vl_case_check_knobs(&env, c, "r", &k), VL_OK);

  /* First use: the set is made, and runs. */
  double skipped;
  vl_knobs none = {0};
  vl_status rc = run_case(c, &env, &none, &skipped);
  if (rc) print_error("run: %s\n", env.err.msg);
  assert_int_equal(rc, 0);
  assert_true(skipped == 0);

  /* A policy other than skip or error is refused, naming the knob. */
  vl_knobs bad = {0};
  vl_knob_set(&bad, "corrupt", "ignore");
  assert_int_not_equal(run_case(c, &env, &bad, NULL), 0);
  assert_non_null(strstr(env.err.msg, "corrupt = 'ignore'"));
  assert_non_null(strstr(env.err.msg, "skip or error"));
  cJSON *o = cJSON_CreateObject();
  assert_int_equal(c->plan(&env, "tiny", &bad, o), VL_ERR_INVALID);
  assert_non_null(strstr(env.err.msg, "corrupt"));
  cJSON_Delete(o);
  vl_knobs badm = {0};
  vl_knob_set(&badm, "max_file_bytes", "lots");
  assert_int_not_equal(run_case(c, &env, &badm, NULL), 0);
  assert_non_null(strstr(env.err.msg, "max_file_bytes"));

  /* A damaged image: skipped with corrupt=skip, the run's error by default. */
  assert_int_equal(tu_jpegset_corrupt(set, 1, TU_JPEG_GARBAGE, err.msg, sizeof err.msg), 0);
  vl_knobs skip = {0};
  vl_knob_set(&skip, "corrupt", "skip");
  rc = run_case(c, &env, &skip, &skipped);
  if (rc) print_error("run: %s\n", env.err.msg);
  assert_int_equal(rc, 0);
  assert_true(skipped == 1);
  assert_int_not_equal(run_case(c, &env, &none, NULL), 0);
  assert_non_null(strstr(env.err.msg, "img_0000001.jpg"));
  /* max_file_bytes reaches the loader: every image is larger than 1 KiB. */
  vl_knobs small = {0};
  vl_knob_set(&small, "max_file_bytes", "1KiB");
  assert_int_not_equal(run_case(c, &env, &small, NULL), 0);
  if (!strstr(env.err.msg, "exceeds max_file_bytes (1024)")) print_error("run: %s\n", env.err.msg);
  assert_non_null(strstr(env.err.msg, "exceeds max_file_bytes (1024)"));

  /* A damaged manifest: the run stops, naming it; the folder is left as it was. */
  snprintf(p, sizeof p, "%s/manifest.tsv", set);
  uint8_t *m;
  size_t mlen = tu_slurp(p, &m);
  m[mlen] = 0;
  char *l2 = strchr((char *)m, '\n') + 1;
  *(strchr(l2, '\t') + 1) = '-';
  tu_write_bytes(p, m, mlen);
  assert_int_not_equal(run_case(c, &env, &none, NULL), 0);
  if (!strstr(env.err.msg, "manifest.tsv:2: bad label") || !strstr(env.err.msg, "vramlab data gen"))
    print_error("run: %s\n", env.err.msg);
  assert_non_null(strstr(env.err.msg, "manifest.tsv:2: bad label"));
  assert_non_null(strstr(env.err.msg, "vramlab data gen"));
  uint8_t *after;
  assert_int_equal(tu_slurp(p, &after), mlen);
  assert_memory_equal(after, m, mlen);
  assert_int_equal(tu_count_entries(set), 7);
  free(after);
  free(m);

  /* Someone else's folder where the set would go: refused, left alone. */
  snprintf(root, sizeof root, "%s/case2", tu_tmp);
  snprintf(set, sizeof set, "%s/n6-s3", root);
  vl_knob_set(&setting, "data_dir", root);
  assert_int_equal(mkdir(root, 0755), 0);
  assert_int_equal(mkdir(set, 0755), 0);
  snprintf(p, sizeof p, "%s/photo.jpg", set);
  tu_write_text(p, "theirs");
  assert_int_not_equal(run_case(c, &env, &none, NULL), 0);
  assert_non_null(strstr(env.err.msg, "is not empty"));
  assert_int_equal(tu_count_entries(set), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generate_and_decode),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_corrupt_files),
      cmocka_unit_test(test_manifest_errors),
      cmocka_unit_test(test_generate_errors),
      cmocka_unit_test(test_decode_rate),
      cmocka_unit_test(test_fifo_in_set),
      cmocka_unit_test(test_oversized_file),
      cmocka_unit_test(test_decode_independent_of_order),
      cmocka_unit_test(test_messages),
      cmocka_unit_test(test_first_use),
      cmocka_unit_test(test_dataloader_case),
  };
  return cmocka_run_group_tests(tests, setup, tu_tmp_teardown);
}
