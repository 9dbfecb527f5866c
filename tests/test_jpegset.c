/* The synthetic JPEG set (datasets/jpegset): generation, manifest, decoding through the
 * vl_dataset interface, determinism, damaged files, malformed manifests, decode rate. */
#define _GNU_SOURCE
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/jpegset.h"

static char g_set[300];  /* the shared 12-image set */
#define N_SET 12
#define SEED 7

static tu_progress g_prog; /* what the shared set's generation reported */

static int setup(void **state) {
  (void)state;
  if (tu_tmpdir(tu_tmp, sizeof tu_tmp, "vl_jpegset_test_") != 0) return -1;
  snprintf(g_set, sizeof g_set, "%s/a/b/set", tu_tmp); /* parents made too */
  char err[512];
  if (vl_jpegset_generate(g_set, N_SET, SEED, 90, tu_on_progress, &g_prog, err, sizeof err) != 0) {
    fprintf(stderr, "generate: %s\n", err);
    return -1;
  }
  return 0;
}

/* Generated set: sizes in range, manifest agrees with the files, every image decodes to
 * the manifest's size and label, pixels are textured (not constant, not pure noise). */
static void test_generate_and_decode(void **state) {
  (void)state;
  tu_assert_progress_done(&g_prog, N_SET);

  char err[512];
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, g_set, err, sizeof err), 0);
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

    assert_int_equal(d.read(d.self, scr, i, &img, err, sizeof err), VL_OK);
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
    assert_int_equal(d.read(d.self, NULL, i, &img2, err, sizeof err), VL_OK);
    assert_memory_equal(img.pix, img2.pix, np);
  }
  assert_int_equal(total, info.total_bytes);
  /* Out of range index: an argument error, not I/O. */
  assert_int_equal(d.read(d.self, scr, N_SET, &img, err, sizeof err), VL_ERR_INVALID);
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
  char d1[300], d2[300], d3[300], err[512];
  tu_join(d1, sizeof d1, tu_tmp, "det1");
  tu_join(d2, sizeof d2, tu_tmp, "det2");
  tu_join(d3, sizeof d3, tu_tmp, "det3");
  vl_jpegset_gen_cfg c;
  vl_jpegset_gen_cfg_default(&c);
  c.n = 3;
  c.seed = SEED;
  c.threads = 1;
  assert_int_equal(vl_jpegset_generate_ex(d1, &c, err, sizeof err), 0);
  c.threads = 3;
  assert_int_equal(vl_jpegset_generate_ex(d2, &c, err, sizeof err), 0);
  c.seed = SEED + 1;
  assert_int_equal(vl_jpegset_generate_ex(d3, &c, err, sizeof err), 0);
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
  char dir[300], err[512];
  tu_join(dir, sizeof dir, tu_tmp, "corrupt");
  assert_int_equal(vl_jpegset_generate(dir, 6, 99, 90, NULL, NULL, err, sizeof err), 0);
  for (int mode = 0; mode < 3; mode++) assert_int_equal(vl_jpegset_corrupt(dir, mode, mode, err, sizeof err), 0);
  assert_int_equal(vl_jpegset_corrupt(dir, 0, 3, err, sizeof err), -1);
  assert_non_null(strstr(err, "mode"));
  assert_int_equal(vl_jpegset_corrupt(dir, 6, 0, err, sizeof err), -1);
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
  assert_int_equal(vl_jpegset_open(&s, dir, err, sizeof err), 0);
  vl_dataset d = vl_jpegset_dataset(s);
  void *scr = d.scratch_new(d.self);
  assert_non_null(scr);
  vl_image img = {0};
  static const char *want[5] = {"TurboJPEG", "TurboJPEG", "TurboJPEG", "cannot open", "changed"};
  for (int rep = 0; rep < 2; rep++) {
    for (int i = 0; i < 5; i++) {
      err[0] = '\0';
      assert_int_equal(d.read(d.self, scr, i, &img, err, sizeof err), VL_ERR_IO);
      char name[32];
      snprintf(name, sizeof name, "img_%07d.jpg", i);
      if (!strstr(err, name) || !strstr(err, want[i])) {
        print_error("image %d: message \"%s\" lacks \"%s\" or \"%s\"\n", i, err, name, want[i]);
        fail();
      }
    }
    assert_int_equal(d.read(d.self, scr, 5, &img, err, sizeof err), VL_OK);
    assert_int_equal(img.c, 3);
  }
  /* A file cut inside its header (the Huffman tables) leaves TurboJPEG 2.1's handle broken
   * for the next file unless the reader replaces it: the good image read right after it
   * with the same scratch must decode. */
  snprintf(p, sizeof p, "%s/img_0000001.jpg", dir);
  assert_int_equal(truncate(p, 400), 0);
  assert_int_equal(d.read(d.self, scr, 1, &img, err, sizeof err), VL_ERR_IO);
  err[0] = '\0';
  if (d.read(d.self, scr, 5, &img, err, sizeof err) != VL_OK) {
    print_error("a good image after one cut in its header: %s\n", err);
    fail();
  }
  /* The truncated one is reported as such; the garbage one by TurboJPEG too. */
  assert_int_equal(d.read(d.self, scr, 0, &img, err, sizeof err), VL_ERR_IO);
  assert_non_null(strstr(err, "manifest says"));
  /* The decode ceiling refuses a damaged set, naming the file: image 3 is missing (all
   * files are read before decoding starts), and with 3 images image 0 fails to decode. */
  assert_true(vl_jpegset_decode_rate(s, 6, err, sizeof err) < 0);
  assert_non_null(strstr(err, "img_0000003.jpg"));
  assert_true(vl_jpegset_decode_rate(s, 3, err, sizeof err) < 0);
  assert_non_null(strstr(err, "img_0000000.jpg"));
  d.scratch_free(d.self, scr);
  free(img.pix);
  vl_jpegset_close(s);
}

static void expect_open_error(const char *dir, const char *manifest, const char *what1,
                              const char *what2) {
  char path[400], err[512] = "";
  snprintf(path, sizeof path, "%s/manifest.tsv", dir);
  if (manifest) tu_write_text(path, manifest);
  else unlink(path);
  vl_jpegset *s = (vl_jpegset *)&err; /* must be reset to NULL */
  assert_int_equal(vl_jpegset_open(&s, dir, err, sizeof err), -1);
  assert_null(s);
  if (!strstr(err, "manifest.tsv") || !strstr(err, what1) || (what2 && !strstr(err, what2))) {
    print_error("manifest error \"%s\" lacks \"%s\"/\"%s\"\n", err, what1, what2 ? what2 : "");
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
  char path[400], err[512];
  snprintf(path, sizeof path, "%s/manifest.tsv", dir);
  tu_write_text(path, m);
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, dir, err, sizeof err), 0);
  assert_int_equal(vl_jpegset_len(s), 2);
  int32_t label;
  int w;
  assert_int_equal(vl_jpegset_item(s, 1, &label, &w, NULL, NULL), 0);
  assert_int_equal(label, 9);
  assert_int_equal(w, 400);
  assert_int_equal(vl_jpegset_item(s, 2, NULL, NULL, NULL, NULL), -1);
  vl_dataset d = vl_jpegset_dataset(s);
  vl_image img = {0};
  assert_int_equal(d.read(d.self, NULL, 0, &img, err, sizeof err), VL_ERR_IO);
  assert_non_null(strstr(err, "a.jpg"));
  free(img.pix);
  vl_jpegset_close(s);
}

/* Bad generation arguments fail with a message and write nothing. */
static void test_generate_errors(void **state) {
  (void)state;
  char dir[300], err[512];
  tu_join(dir, sizeof dir, tu_tmp, "bad");
  err[0] = '\0';
  assert_int_equal(vl_jpegset_generate(dir, 0, 1, 90, NULL, NULL, err, sizeof err), -1);
  assert_non_null(strstr(err, "n must be"));
  assert_int_equal(vl_jpegset_generate(dir, 2, 1, 101, NULL, NULL, err, sizeof err), -1);
  assert_non_null(strstr(err, "quality"));
  struct stat st;
  assert_int_not_equal(stat(dir, &st), 0);
  char under_file[400];
  snprintf(under_file, sizeof under_file, "%s/manifest.tsv/sub", g_set);
  assert_int_equal(vl_jpegset_generate(under_file, 2, 1, 90, NULL, NULL, err, sizeof err), -1);
  assert_non_null(strstr(err, "manifest.tsv"));
}

static void test_decode_rate(void **state) {
  (void)state;
  char err[512];
  vl_jpegset *s = NULL;
  assert_int_equal(vl_jpegset_open(&s, g_set, err, sizeof err), 0);
  double r = vl_jpegset_decode_rate(s, 1000, err, sizeof err); /* capped at the set size */
  assert_true(r > 0);
  assert_true(r < 1e6);
  assert_true(vl_jpegset_decode_rate(s, 0, err, sizeof err) < 0);
  vl_jpegset_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generate_and_decode),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_corrupt_files),
      cmocka_unit_test(test_manifest_errors),
      cmocka_unit_test(test_generate_errors),
      cmocka_unit_test(test_decode_rate),
  };
  return cmocka_run_group_tests(tests, setup, tu_tmp_teardown);
}
