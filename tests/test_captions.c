/* The synthetic captioned image set (datasets/captions) and Stable Diffusion's transform in
 * the loader (vl_transform_sd, cfg.transform = VL_TF_SD): generation determinism (files and
 * captions), caption validity (BOS, EOS, padding, id range, lengths, truncation), the
 * manifest's checks, first use of damaged or foreign folders, an interrupted generation; the
 * transform bit for bit against Pillow + torch (fixture hashes), against a direct
 * double-precision reference, its crop geometry, flip and [-1, 1] range, its scratch bound;
 * the loader with VL_TF_SD over the set (every sample once, 0 and 2 workers identical, each
 * sample equal to the transform with its documented seed); and `data gen --kind captions`
 * through the harness's registry. */
#define _GNU_SOURCE
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/datagen.h"
#include "datasets/captions.h"

static char g_set[300]; /* the shared set */
#define N_SET 12
#define SIZE 64         /* short sides 48..80: SD at 32 downscales them */
#define SEED 7

static tu_progress g_prog; /* what the shared set's generation reported */

static vl_captions_gen_cfg set_cfg(void) {
  vl_captions_gen_cfg g;
  vl_captions_gen_cfg_default(&g);
  g.n = N_SET;
  g.size = SIZE;
  g.seed = SEED;
  g.threads = 2;
  return g;
}

static int setup(void **state) {
  (void)state;
  if (tu_tmpdir(tu_tmp, sizeof tu_tmp, "vl_captions_test_") != 0) return -1;
  snprintf(g_set, sizeof g_set, "%s/a/b/set", tu_tmp); /* parents made too */
  vl_captions_gen_cfg g = set_cfg();
  g.progress = tu_on_progress;
  g.user = &g_prog;
  vl_err err;
  if (vl_captions_generate(g_set, &g, &err) != 0) {
    fprintf(stderr, "generate: %s\n", err.msg);
    return -1;
  }
  return 0;
}

static vl_captions *open_ok(const char *dir) {
  vl_captions *s = NULL;
  vl_err err = {""};
  int rc = vl_captions_open(&s, dir, &err);
  if (rc != 0) print_error("open %s: %s\n", dir, err.msg);
  assert_int_equal(rc, 0);
  return s;
}

static void gen_ok(const char *dir, const vl_captions_gen_cfg *g) {
  vl_err err;
  int rc = vl_captions_generate(dir, g, &err);
  if (rc) print_error("generate %s: %s\n", dir, err.msg);
  assert_int_equal(rc, 0);
}

/* ============================== generation, reading =================================== */

/* Sizes within the documented ranges, both orientations, the files as the manifest says,
 * every image decodes through the dataset to its size. */
static void test_generate_and_read(void **state) {
  (void)state;
  tu_assert_progress_done(&g_prog, N_SET);
  vl_captions *s = open_ok(g_set);
  assert_int_equal(vl_captions_len(s), N_SET);
  vl_captions_info in;
  vl_captions_info_get(s, &in);
  assert_int_equal(in.n, N_SET);
  assert_int_equal(in.size, SIZE);
  assert_int_equal(in.seed, SEED);
  assert_int_equal(in.quality, 90);
  assert_int_equal(in.version, VL_CAPTIONS_VERSION);

  vl_dataset d = vl_captions_dataset(s);
  assert_int_equal(d.len(d.self), N_SET);
  assert_int_equal(d.max_image_bytes, (size_t)in.max_pixels * 3);
  assert_true(d.scratch_bytes >= (size_t)in.max_bytes);
  size_t gen_scratch, gen_image;
  vl_captions_gen_bound(SIZE, &gen_scratch, &gen_image);
  assert_true(gen_image >= d.max_image_bytes);
  void *scr = d.scratch_new(d.self);
  assert_non_null(scr);
  vl_image img = {0}, img2 = {0};
  vl_err err;
  int portrait = 0, landscape = 0;
  int64_t px = 0;
  for (int64_t i = 0; i < N_SET; i++) {
    int w, h;
    int64_t bytes;
    assert_int_equal(vl_captions_item(s, i, &w, &h, &bytes), 0);
    const int sh = w < h ? w : h, lg = w < h ? h : w;
    assert_in_range(sh, SIZE * 3 / 4, SIZE * 5 / 4);
    assert_true(lg * 1000 <= sh * 1778 + 1000 && lg >= sh);
    portrait += h > w;
    landscape += w > h;
    if ((int64_t)w * h > px) px = (int64_t)w * h;
    char path[512];
    assert_non_null(vl_captions_path(s, i, path, sizeof path));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, bytes);
    err.msg[0] = 0;
    vl_status rs = d.read(d.self, scr, i, &img, &err);
    if (rs != VL_OK) print_error("read %lld: %s\n", (long long)i, err.msg);
    assert_int_equal(rs, VL_OK);
    assert_int_equal(img.w, w);
    assert_int_equal(img.h, h);
    assert_int_equal(img.c, 3);
    assert_int_equal(img.label, 0);
    /* textured, not flat */
    int lo = 255, hi = 0;
    for (int64_t k = 0; k < (int64_t)w * h * 3; k++) {
      lo = img.pix[k] < lo ? img.pix[k] : lo;
      hi = img.pix[k] > hi ? img.pix[k] : hi;
    }
    assert_true(hi - lo > 100);
    assert_int_equal(d.read(d.self, NULL, i, &img2, &err), VL_OK);
    assert_memory_equal(img.pix, img2.pix, (size_t)w * h * 3);
  }
  assert_true(portrait > 0 && landscape > 0);
  assert_int_equal(px, in.max_pixels);
  assert_int_equal(d.read(d.self, scr, N_SET, &img, &err), VL_ERR_INVALID);
  assert_non_null(strstr(err.msg, "out of range"));
  assert_int_equal(vl_captions_item(s, N_SET, NULL, NULL, NULL), -1);
  assert_null(vl_captions_path(s, -1, err.msg, sizeof err.msg));
  d.scratch_free(d.self, scr);
  tu_image_free(&img);
  tu_image_free(&img2);
  vl_captions_close(s);
}

/* One thread or two: byte-identical files, manifest (so the captions) included; another seed
 * gives other images and other captions. */
static void test_deterministic(void **state) {
  (void)state;
  char dir[320], other[320];
  tu_join(dir, sizeof dir, tu_tmp, "det1");
  tu_join(other, sizeof other, tu_tmp, "seed2");
  vl_captions_gen_cfg g = set_cfg();
  g.threads = 1;
  gen_ok(dir, &g);
  DIR *dd = opendir(g_set);
  assert_non_null(dd);
  int files = 0;
  for (struct dirent *e; (e = readdir(dd));) {
    if (e->d_name[0] == '.') continue;
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/%s", g_set, e->d_name);
    snprintf(b, sizeof b, "%s/%s", dir, e->d_name);
    if (!tu_same_file(a, b)) print_error("%s differs between 2 threads and 1\n", e->d_name);
    assert_true(tu_same_file(a, b));
    files++;
  }
  closedir(dd);
  assert_int_equal(files, N_SET + 1);
  vl_captions *s1 = open_ok(g_set), *s2 = open_ok(dir);
  for (int64_t i = 0; i < N_SET; i++) {
    int32_t a[VL_CLIP_CONTEXT], b[VL_CLIP_CONTEXT];
    assert_int_equal(vl_captions_tokens(s1, i, a), vl_captions_tokens(s2, i, b));
    assert_memory_equal(a, b, sizeof a);
  }
  vl_captions_close(s2);

  g.seed = SEED + 1;
  gen_ok(other, &g);
  char a[600], b[600];
  snprintf(a, sizeof a, "%s/img_0000000.jpg", g_set);
  snprintf(b, sizeof b, "%s/img_0000000.jpg", other);
  assert_false(tu_same_file(a, b));
  s2 = open_ok(other);
  int same = 0;
  for (int64_t i = 0; i < N_SET; i++) {
    int32_t x[VL_CLIP_CONTEXT], y[VL_CLIP_CONTEXT];
    vl_captions_tokens(s1, i, x);
    vl_captions_tokens(s2, i, y);
    same += !memcmp(x, y, sizeof x);
  }
  assert_int_equal(same, 0);
  vl_captions_close(s1);
  vl_captions_close(s2);
}

/* Every caption as the tokenizer pads it: BOS, text ids below BOS, EOS, EOS padding to 77;
 * the text starts with a (colour, shape) word pair per shape; lengths spread from short to
 * truncated. 240 captions of tiny images. */
static void test_caption_validity(void **state) {
  (void)state;
  char dir[320];
  tu_join(dir, sizeof dir, tu_tmp, "many");
  vl_captions_gen_cfg g = set_cfg();
  g.n = 240;
  g.size = VL_CAPTIONS_SIZE_MIN;
  gen_ok(dir, &g);
  vl_captions *s = open_ok(dir);
  vl_captions_info in;
  vl_captions_info_get(s, &in);
  int lmin = 99, lmax = 0, truncated = 0, long_ones = 0;
  int64_t total = 0;
  for (int64_t i = 0; i < g.n; i++) {
    int32_t ids[VL_CLIP_CONTEXT + 1];
    ids[VL_CLIP_CONTEXT] = -7; /* never written */
    const int L = vl_captions_tokens(s, i, ids);
    assert_in_range(L, 4, VL_CLIP_CONTEXT);
    assert_int_equal(ids[VL_CLIP_CONTEXT], -7);
    assert_int_equal(ids[0], VL_CLIP_BOS);
    assert_int_equal(ids[L - 1], VL_CLIP_EOS);
    for (int k = 1; k < L - 1; k++) assert_in_range(ids[k], 0, VL_CLIP_BOS - 1);
    for (int k = L; k < VL_CLIP_CONTEXT; k++) assert_int_equal(ids[k], VL_CLIP_PAD);
    assert_int_equal(VL_CLIP_PAD, 49407);
    for (int k = 0; k < VL_CLIP_CONTEXT; k++) assert_in_range(ids[k], 0, VL_CLIP_VOCAB - 1);
    /* (colour, shape) pairs first: 1..4 of them */
    int pairs = 0;
    while (1 + 2 * pairs + 1 < L - 1 && ids[1 + 2 * pairs] >= 1000 && ids[1 + 2 * pairs] <= 1007) {
      assert_in_range(ids[2 + 2 * pairs], 1010, 1015);
      pairs++;
    }
    assert_in_range(pairs, 1, 4);
    lmin = L < lmin ? L : lmin;
    lmax = L > lmax ? L : lmax;
    truncated += L == VL_CLIP_CONTEXT;
    long_ones += L > 30;
    total += L;
  }
  print_message("caption lengths %d..%d, mean %.1f, %d of %lld truncated\n", lmin, lmax,
                (double)total / (double)g.n, truncated, (long long)g.n);
  assert_true(lmin <= 8);
  assert_int_equal(lmax, VL_CLIP_CONTEXT);
  assert_true(truncated >= g.n / 50 && truncated <= g.n / 5);
  assert_true(long_ones >= g.n / 10 && long_ones <= g.n / 2);
  assert_int_equal(in.total_tokens, total);
  assert_int_equal(in.max_tokens, VL_CLIP_CONTEXT);
  int32_t ids[VL_CLIP_CONTEXT];
  assert_int_equal(vl_captions_tokens(s, g.n, ids), -1);
  assert_int_equal(vl_captions_tokens(s, -1, ids), -1);
  vl_captions_close(s);
}

/* ============================== manifest, first use ==================================== */

static void expect_open_fail(const char *dir, const char *needle) {
  vl_captions *s = (vl_captions *)1;
  vl_err err = {""};
  assert_int_not_equal(vl_captions_open(&s, dir, &err), VL_OK);
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
  expect_open_fail(dir, "data gen --kind captions"); /* none there */
  static const struct { const char *body, *needle; } hdr[] = {
      {"", "manifest.tsv:1: empty manifest"},
      {"# vramlab-jpegset version=1 n=1\n", "manifest.tsv:1: not a vramlab-captions manifest"},
      {"# vramlab-captions version=2 n=1 size=64\n", "manifest.tsv:1: unknown manifest version 2"},
      {"# vramlab-captions version=1 size=64\na.jpg\t4\t4\t9\t49406,49407\n", "the header has no n="},
      {"# vramlab-captions version=1 n=1\na.jpg\t4\t4\t9\t49406,49407\n", "the header has no size="},
      {"# vramlab-captions version=1 n=1 size=64 context=76\n", "manifest.tsv:1: bad header value context=76"},
      {"# vramlab-captions version=1 n=1 size=64 pad=0\n", "manifest.tsv:1: bad header value pad=0"},
      {"# vramlab-captions version=1 n=1 size=8\n", "bad header value size=8"},
  };
  for (size_t k = 0; k < sizeof hdr / sizeof hdr[0]; k++) {
    tu_write_text(mp, hdr[k].body);
    expect_open_fail(dir, hdr[k].needle);
  }
  const char *H = "# vramlab-captions version=1 n=2 size=64 seed=3 quality=90\n";
  const char *L1 = "a.jpg\t60\t80\t100\t49406,1000,1010,49407\n";
  char many[1024] = "49406";
  for (int k = 0; k < 76; k++) strcat(many, ",5");
  strcat(many, ",49407"); /* 78 ids */
  char toolong[1100];
  snprintf(toolong, sizeof toolong, "b.jpg\t60\t80\t100\t%s\n", many);
  const struct { const char *line, *needle; } bad[] = {
      {"b.jpg\t60\t80\t100\n",
       "manifest.tsv:3: expected 5 tab-separated fields (file, width, height, bytes, tokens), found 4"},
      {"../b.jpg\t60\t80\t100\t49406,49407\n", "manifest.tsv:3: bad file name \"../b.jpg\""},
      {"b.jpg\t0\t80\t100\t49406,49407\n", "manifest.tsv:3: bad width \"0\""},
      {"b.jpg\t60\tx\t100\t49406,49407\n", "manifest.tsv:3: bad height \"x\""},
      {"b.jpg\t60\t80\t-1\t49406,49407\n", "manifest.tsv:3: bad bytes \"-1\""},
      {"b.jpg\t60\t80\t100\t1000,49407\n", "manifest.tsv:3: the caption starts with 1000, not BOS 49406"},
      {"b.jpg\t60\t80\t100\t49406,1000\n", "manifest.tsv:3: the caption does not end with EOS 49407"},
      {"b.jpg\t60\t80\t100\t49406\n", "manifest.tsv:3: the caption does not end with EOS"},
      {"b.jpg\t60\t80\t100\t49406,7,49407,49407\n", "manifest.tsv:3: EOS 49407 at token 3 before the end"},
      {"b.jpg\t60\t80\t100\t49406,7,49406,49407\n", "manifest.tsv:3: BOS 49406 at token 3"},
      {"b.jpg\t60\t80\t100\t49406,49408,49407\n", "manifest.tsv:3: bad token 2 \"49408\" (an id in 0..49407)"},
      {"b.jpg\t60\t80\t100\t49406,-3,49407\n", "manifest.tsv:3: bad token 2 \"-3\""},
      {"b.jpg\t60\t80\t100\t49406, 5,49407\n", "manifest.tsv:3: bad token 2 \" 5\""},
      {"b.jpg\t60\t80\t100\t49406,,49407\n", "manifest.tsv:3: bad tokens \"49406,,49407\""},
      {"b.jpg\t60\t80\t100\t49406,49407,\n", "manifest.tsv:3: bad tokens"},
      {"b.jpg\t60\t80\t100\t\n", "manifest.tsv:3: bad tokens"},
      {toolong, "manifest.tsv:3: more than 77 tokens"},
      {"", "the header says n=2 but 1 image lines follow"},
  };
  char body[2048];
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    snprintf(body, sizeof body, "%s%s%s", H, L1, bad[k].line);
    tu_write_text(mp, body);
    expect_open_fail(dir, bad[k].needle);
  }
  /* The shortest caption (an empty text) and the longest open; CRLF and unknown keys too. */
  many[strlen(many) - strlen(",5,49407")] = '\0';
  strcat(many, ",49407"); /* 77 ids */
  snprintf(body, sizeof body, "# vramlab-captions version=1 n=2 size=64 future=1\r\n"
                              "a.jpg\t60\t80\t100\t49406,49407\r\nb.jpg\t90\t50\t30\t%s\r\n", many);
  tu_write_text(mp, body);
  vl_captions *s = open_ok(dir);
  int32_t ids[VL_CLIP_CONTEXT];
  assert_int_equal(vl_captions_tokens(s, 0, ids), 2);
  assert_int_equal(ids[0], VL_CLIP_BOS);
  for (int k = 1; k < VL_CLIP_CONTEXT; k++) assert_int_equal(ids[k], VL_CLIP_EOS);
  assert_int_equal(vl_captions_tokens(s, 1, ids), 77);
  assert_int_equal(ids[75], 5);
  vl_captions_info in;
  vl_captions_info_get(s, &in);
  assert_int_equal(in.quality, -1);
  assert_int_equal(in.max_pixels, 60 * 80);
  assert_int_equal(in.max_w, 90);
  assert_int_equal(in.total_tokens, 79);
  /* ... and then a listed image that is not there is the read's error, naming it. */
  vl_dataset d = vl_captions_dataset(s);
  vl_image img = {0};
  vl_err err;
  assert_int_equal(d.read(d.self, NULL, 1, &img, &err), VL_ERR_IO);
  assert_non_null(strstr(err.msg, "b.jpg: cannot open"));
  tu_image_free(&img);
  vl_captions_close(s);
  /* From memory, as a fuzz target would. */
  const char *text = "# vramlab-captions version=1 n=1 size=64\nz.jpg\t4\t4\t9\t49406,3,49407\n";
  assert_int_equal(vl_captions_parse(&s, "/nowhere", text, strlen(text), &err), VL_OK);
  char p[64];
  assert_string_equal(vl_captions_path(s, 0, p, sizeof p), "/nowhere/z.jpg");
  vl_captions_close(s);
}

/* A set is made only where nothing (or only an interrupted generation's files) is: a damaged
 * manifest, a set made otherwise, a folder with other files are refused and left as they
 * are. A generation that fails half-way leaves no manifest. */
/* vl_captions_first_use as the number the tests compare: 1 make the set, 0 open it, -1 refused. */
static int first_use_code(vl_captions **s, const char *dir, const vl_captions_gen_cfg *g, vl_err *err) {
  bool make = false;
  if (vl_captions_first_use(s, dir, g, &make, err) != VL_OK) return -1;
  return make ? 1 : 0;
}

static void test_first_use(void **state) {
  (void)state;
  char dir[320], p[400];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "first");
  vl_captions_gen_cfg g = set_cfg();
  g.n = 3;
  g.size = 32;
  g.seed = 9;
  vl_captions *s = (vl_captions *)&g; /* must be reset to NULL */
  assert_int_equal(first_use_code(&s, dir, &g, &err), 1);
  assert_null(s);
  assert_int_equal(mkdir(dir, 0755), 0);
  tu_join(p, sizeof p, dir, "img_0000002.jpg"); /* an interrupted generation's */
  tu_write_text(p, "half");
  tu_join(p, sizeof p, dir, ".manifest.tsv.tmp.123");
  tu_write_text(p, "half");
  assert_int_equal(first_use_code(&s, dir, &g, &err), 1);
  assert_int_equal(unlink(p), 0);
  gen_ok(dir, &g);
  assert_int_equal(first_use_code(&s, dir, &g, &err), 0);
  assert_non_null(s);
  vl_captions_close(s);
  vl_captions_gen_cfg g2 = g;
  g2.size = 48;
  assert_int_equal(first_use_code(&s, dir, &g2, &err), -1);
  assert_null(s);
  assert_non_null(strstr(err.msg, "size=32"));
  assert_non_null(strstr(err.msg, "size=48"));
  g2 = g;
  g2.seed = 10;
  assert_int_equal(first_use_code(&s, dir, &g2, &err), -1);
  assert_non_null(strstr(err.msg, "seed=9"));

  /* the last line cut inside its tokens */
  tu_join(p, sizeof p, dir, "manifest.tsv");
  uint8_t *orig;
  size_t olen = tu_slurp(p, &orig);
  tu_write_bytes(p, orig, olen - 3);
  uint8_t *cut;
  size_t clen = tu_slurp(p, &cut);
  assert_int_equal(first_use_code(&s, dir, &g, &err), -1);
  assert_null(s);
  if (!strstr(err.msg, "manifest.tsv:4:") || !strstr(err.msg, "damaged") || !strstr(err.msg, "left as it is"))
    print_error("%s\n", err.msg);
  assert_non_null(strstr(err.msg, "manifest.tsv:4: "));
  assert_non_null(strstr(err.msg, "damaged"));
  assert_non_null(strstr(err.msg, "delete the folder"));
  uint8_t *after;
  assert_int_equal(tu_slurp(p, &after), clen);
  assert_memory_equal(after, cut, clen);
  assert_int_equal(tu_count_entries(dir), 4);
  free(after);
  free(cut);
  free(orig);
  /* The default size's message names the command that remakes it. */
  vl_captions_gen_cfg gd = g;
  gd.size = 512;
  assert_int_equal(first_use_code(&s, dir, &gd, &err), -1);
  assert_non_null(strstr(err.msg, "vramlab data gen --kind captions --out"));
  assert_non_null(strstr(err.msg, "--n 3 --seed 9 --quality 90"));

  char other[320];
  tu_join(other, sizeof other, tu_tmp, "theirs");
  assert_int_equal(mkdir(other, 0755), 0);
  tu_join(p, sizeof p, other, "captions.txt");
  tu_write_text(p, "mine");
  assert_int_equal(first_use_code(&s, other, &g, &err), -1);
  assert_non_null(strstr(err.msg, "is not empty"));
  assert_non_null(strstr(err.msg, "captions.txt"));
  assert_int_equal(tu_count_entries(other), 1);

  /* Remaking a set whose image 1 cannot be written (a directory in its place): the
   * generation fails naming it, and the old manifest is gone, so the set cannot open. */
  char re[320];
  tu_join(re, sizeof re, tu_tmp, "remake");
  gen_ok(re, &g);
  tu_join(p, sizeof p, re, "img_0000001.jpg");
  assert_int_equal(unlink(p), 0);
  assert_int_equal(mkdir(p, 0755), 0);
  g.threads = 1;
  assert_int_not_equal(vl_captions_generate(re, &g, &err), VL_OK);
  assert_non_null(strstr(err.msg, "img_0000001.jpg"));
  tu_join(p, sizeof p, re, "manifest.tsv");
  assert_int_equal(access(p, F_OK), -1);
  expect_open_fail(re, "an interrupted generation leaves no manifest");
}

static void test_generate_errors(void **state) {
  (void)state;
  char dir[320];
  vl_err err;
  tu_join(dir, sizeof dir, tu_tmp, "bad_cfg");
  static const struct { int field, value; const char *needle; } cases[] = {
      {0, 0, "n must be at least 1"},   {1, 15, "size must be in 16..896"},
      {1, 897, "size must be in"},      {2, 0, "quality must be in 1..100"},
      {3, -1, "threads must be >= 0"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    vl_captions_gen_cfg g = set_cfg();
    if (cases[k].field == 0) g.n = cases[k].value;
    if (cases[k].field == 1) g.size = cases[k].value;
    if (cases[k].field == 2) g.quality = cases[k].value;
    if (cases[k].field == 3) g.threads = cases[k].value;
    assert_int_not_equal(vl_captions_generate(dir, &g, &err), VL_OK);
    if (!strstr(err.msg, cases[k].needle)) print_error("message '%s' lacks '%s'\n", err.msg, cases[k].needle);
    assert_non_null(strstr(err.msg, cases[k].needle));
  }
}

/* ============================== the SD transform ======================================= */

static vl_image mk_img(int w, int h, uint8_t (*f)(int x, int y, int c)) {
  vl_image im = {0};
  im.w = w, im.h = h, im.c = 3;
  im.cap = (size_t)w * h * 3;
  im.pix = malloc(im.cap);
  assert_non_null(im.pix);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < 3; c++) im.pix[((size_t)y * w + x) * 3 + c] = f(x, y, c);
  return im;
}

/* The pattern the Pillow fixture was made from (see test_sd_pillow). */
static uint8_t px_fixture(int x, int y, int c) {
  if (c == 0) return (uint8_t)((x * 7 + y * 3) % 256);
  if (c == 1) return (uint8_t)((x * x + y) % 256);
  return (uint8_t)(((x / 3) * 50 + (y / 5) * 30) % 256);
}
static uint8_t px_noise(int x, int y, int c) {
  return (uint8_t)(vl_mix64((uint64_t)(y * 100003 + x * 7 + c)) >> 56);
}
static uint8_t px_ramp2(int x, int y, int c) { return (uint8_t)(c == 0 ? 2 * x : c == 1 ? 3 * y : 90); }
static uint8_t px_coord(int x, int y, int c) { return (uint8_t)(c == 0 ? x * 5 : c == 1 ? y * 5 : 77); }
static uint8_t px_const(int x, int y, int c) { return (uint8_t)(c == 0 ? 0 : c == 1 ? 255 : 100); }
static uint8_t px_all(int x, int y, int c) { return (uint8_t)(y * 16 + x); }

static vl_loader_cfg sd_cfg(int crop) {
  vl_loader_cfg c;
  vl_loader_cfg_default(&c);
  c.transform = VL_TF_SD;
  c.crop = crop;
  return c;
}

/* vl_transform_sd of im with a fresh rng and scratch; dst: 3*crop*crop floats. */
static void sd(const vl_loader_cfg *c, const vl_image *im, uint64_t seed, float *dst) {
  void *scr = malloc(vl_transform_sd_scratch_bytes(c->crop, im->w, im->h));
  assert_non_null(scr);
  vl_rng r;
  vl_rng_seed(&r, seed);
  vl_transform_sd(c, im, &r, dst, scr);
  free(scr);
}

/* Output value v (0..255) as ToTensor + Normalize([0.5], [0.5]) give it. */
static float norm(int v) { return ((float)v / 255.0f - 0.5f) / 0.5f; }
/* The output level back (exact for the transform's values). */
static int level(float f) { return (int)lrintf((f + 1.0f) * 127.5f); }

/* Bit for bit against Pillow 13's Image.resize(BILINEAR) + crop and torch's ToTensor +
 * Normalize, fixed here as hashes of the float outputs (and a few pixels), made with:
 *   a = pattern (px_fixture) as uint8 (h, w, 3); im = Image.fromarray(a)
 *   nw, nh = (R, int(R*h/w)) if w <= h else (int(R*w/h), R)
 *   r = im.resize((nw, nh), Image.BILINEAR); t, l = round((nh-R)/2), round((nw-R)/2)
 *   r = r.crop((l, t, l+R, t+R)); x = torch.from_numpy(np.array(r)).permute(2,0,1)
 *   x = x.float().div(255).sub(0.5).div(0.5); fnv1a64(x.numpy().tobytes())
 * Downscales and upscales, both orientations, odd factors, an 11x reduction; 50x120 and
 * 40x300 are resampled vertically first (Pillow 13's order when the height shrinks by more
 * than twice as many pixels as the width), the others horizontally first. */
static void test_sd_pillow(void **state) {
  (void)state;
  static const struct {
    int w, h, crop;
    uint64_t hash;
    uint8_t first[3], last[3], mid[3]; /* (0, 0), (R-1, R-1), row R/2 column R/3 */
  } fx[] = {
      {13, 9, 5, 0x53741d93613cf243ull, {18, 7, 19}, {90, 103, 178}, {41, 21, 57}},
      {9, 13, 5, 0xf913d9b17af5e2bdull, {11, 3, 0}, {81, 66, 149}, {33, 11, 46}},
      {77, 31, 16, 0x5f49fd9866b851c2ull, {171, 74, 134}, {209, 120, 72}, {30, 150, 128}},
      {50, 120, 24, 0xed5ca42bf0bb9b16ull, {108, 35, 191}, {74, 149, 34}, {44, 102, 101}},
      {300, 200, 64, 0x82564cb98c9ffc29ull, {106, 130, 67}, {25, 92, 165}, {96, 182, 221}},
      {40, 300, 16, 0x8be1080175defe0aull, {143, 133, 40}, {91, 91, 74}, {33, 71, 77}},
      {301, 90, 8, 0x422e383e13f61e5eull, {98, 124, 119}, {72, 143, 129}, {71, 91, 134}},
  };
  for (size_t k = 0; k < sizeof fx / sizeof fx[0]; k++) {
    const int R = fx[k].crop;
    vl_image im = mk_img(fx[k].w, fx[k].h, px_fixture);
    vl_loader_cfg c = sd_cfg(R);
    float *out = malloc((size_t)3 * R * R * sizeof(float));
    assert_non_null(out);
    sd(&c, &im, 1, out);
    const size_t P = (size_t)R * R;
    for (int ch = 0; ch < 3; ch++) {
      assert_int_equal(level(out[ch * P]), fx[k].first[ch]);
      assert_int_equal(level(out[ch * P + P - 1]), fx[k].last[ch]);
      assert_int_equal(level(out[ch * P + (size_t)(R / 2) * R + R / 3]), fx[k].mid[ch]);
    }
    const uint64_t h = tu_hash(out, 3 * P * sizeof(float), TU_HASH0);
    if (h != fx[k].hash)
      print_error("%dx%d at %d: hash 0x%016llx, Pillow's 0x%016llx\n", fx[k].w, fx[k].h, R,
                  (unsigned long long)h, (unsigned long long)fx[k].hash);
    assert_true(h == fx[k].hash);
    free(out);
    free(im.pix);
  }
}

/* Weights of an in -> out antialiased triangle resize at output index o: the continuous
 * filter, evaluated directly (no tap window, no fixed point) and normalised. */
static void tri_weights(int in, int out, int o, double *wt) {
  const double scale = (double)in / out, sup = scale > 1 ? scale : 1;
  const double center = (o + 0.5) * scale;
  double sum = 0;
  for (int i = 0; i < in; i++) {
    double d = fabs(i + 0.5 - center) / sup;
    wt[i] = d < 1 ? 1 - d : 0;
    sum += wt[i];
  }
  for (int i = 0; i < in; i++) wt[i] /= sum;
}

/* The transform against a direct 2-D evaluation in double of "resize the short side to R
 * with a triangle filter stretched by the reduction, crop the centre": within one level
 * everywhere (Pillow rounds to bytes twice), the means within 0.1 level. A resize without
 * antialiasing misses a noise image's downscale by tens of levels. */
static void test_sd_reference(void **state) {
  (void)state;
  static const struct { int w, h, R; uint8_t (*f)(int, int, int); } cs[] = {
      {60, 40, 32, px_noise},  {40, 61, 32, px_noise},  {97, 45, 16, px_fixture},
      {23, 37, 32, px_fixture}, {37, 23, 20, px_noise},  {200, 130, 24, px_noise},
      {60, 200, 24, px_noise}, /* vertical pass first */
  };
  for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
    const int w = cs[k].w, h = cs[k].h, R = cs[k].R;
    vl_image im = mk_img(w, h, cs[k].f);
    vl_loader_cfg c = sd_cfg(R);
    float *out = malloc((size_t)3 * R * R * sizeof(float));
    assert_non_null(out);
    sd(&c, &im, 1, out);
    const int nw = w <= h ? R : (int)((double)R * w / h), nh = w <= h ? (int)((double)R * h / w) : R;
    const int top = (int)nearbyint((nh - R) / 2.0), left = (int)nearbyint((nw - R) / 2.0);
    double *wx = malloc(sizeof(double) * (size_t)w), *wy = malloc(sizeof(double) * (size_t)h);
    assert_non_null(wx);
    assert_non_null(wy);
    double maxd = 0, mean_got = 0, mean_ref = 0;
    for (int y = 0; y < R; y++) {
      tri_weights(h, nh, top + y, wy);
      for (int x = 0; x < R; x++) {
        tri_weights(w, nw, left + x, wx);
        for (int ch = 0; ch < 3; ch++) {
          double ref = 0;
          for (int i = 0; i < h; i++) {
            if (wy[i] == 0) continue;
            double row = 0;
            for (int j = 0; j < w; j++) row += wx[j] * im.pix[((size_t)i * w + j) * 3 + ch];
            ref += wy[i] * row;
          }
          const double got = ((double)out[(size_t)ch * R * R + (size_t)y * R + x] + 1) * 127.5;
          maxd = fmax(maxd, fabs(got - ref));
          mean_got += got;
          mean_ref += ref;
        }
      }
    }
    mean_got /= 3.0 * R * R;
    mean_ref /= 3.0 * R * R;
    if (maxd > 1.01 || fabs(mean_got - mean_ref) > 0.1)
      print_error("%dx%d at %d: max diff %.3f levels, mean %.3f vs %.3f\n", w, h, R, maxd,
                  mean_got, mean_ref);
    assert_true(maxd <= 1.01);
    assert_true(fabs(mean_got - mean_ref) <= 0.1);
    free(wx);
    free(wy);
    free(out);
    free(im.pix);
  }
  /* Exact pixels: a 2x reduction weighs 4 source pixels 1/8, 3/8, 3/8, 1/8, so the ramp
   * v = 2x gives 4x' + 1 at resized column x' (here 8 + the output column); y is constant
   * per row in G (3y) so the vertical pass gives 6y' + 1.5 -> Pillow rounds .5 up. */
  vl_image im = mk_img(64, 32, px_ramp2);
  vl_loader_cfg c = sd_cfg(16);
  float out[3 * 16 * 16];
  sd(&c, &im, 1, out);
  for (int y = 1; y < 15; y++)
    for (int x = 0; x < 16; x++) {
      assert_int_equal(level(out[y * 16 + x]), 4 * (8 + x) + 1);
      assert_int_equal(level(out[256 + y * 16 + x]), 6 * y + 2);
      assert_true(out[512 + y * 16 + x] == norm(90));
    }
  free(im.pix);
  /* A constant image stays exactly constant, up or down. */
  for (int k = 0; k < 2; k++) {
    im = mk_img(k ? 10 : 50, k ? 13 : 40, px_const);
    sd(&c, &im, 1, out);
    for (int i = 0; i < 256; i++) {
      assert_true(out[i] == -1.0f);
      assert_true(out[256 + i] == 1.0f);
      assert_true(out[512 + i] == norm(100));
    }
    free(im.pix);
  }
}

/* Crop geometry where the short side is already R (no resampling, Pillow returns the image):
 * the centre crop's offset is Python's round((long - R) / 2), half to even, for landscape
 * and portrait; the random crop's offsets cover 0..long-R and draw nothing for R x R. */
static void test_sd_crop_geometry(void **state) {
  (void)state;
  static const struct { int w, h, top, left; } cs[] = {
      {45, 32, 0, 6}, /* round(6.5) = 6 */
      {47, 32, 0, 8}, /* round(7.5) = 8 */
      {46, 32, 0, 7}, {32, 45, 6, 0}, {32, 47, 8, 0}, {32, 32, 0, 0},
  };
  float out[3 * 32 * 32];
  const size_t P = 32 * 32;
  for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
    vl_image im = mk_img(cs[k].w, cs[k].h, px_coord);
    vl_loader_cfg c = sd_cfg(32);
    sd(&c, &im, 5, out);
    for (int y = 0; y < 32; y++)
      for (int x = 0; x < 32; x++) {
        assert_true(out[y * 32 + x] == norm((x + cs[k].left) * 5));
        assert_true(out[P + y * 32 + x] == norm((y + cs[k].top) * 5));
      }
    /* random crop: the window lands anywhere, and each is an exact window */
    c.sd_random_crop = true;
    const int range = cs[k].w - 32 + cs[k].h - 32 + 1;
    int seen[16] = {0}, distinct = 0;
    for (uint64_t seed = 0; seed < 200; seed++) {
      sd(&c, &im, seed, out);
      const int l = level(out[0]) / 5, t = level(out[P]) / 5;
      assert_true(cs[k].w == 32 ? l == 0 : t == 0);
      for (int y = 0; y < 32; y += 7)
        for (int x = 0; x < 32; x += 5) {
          assert_true(out[y * 32 + x] == norm((x + l) * 5));
          assert_true(out[P + y * 32 + x] == norm((y + t) * 5));
        }
      distinct += !seen[l + t]++;
    }
    assert_int_equal(distinct, range);
    free(im.pix);
  }
  /* With resampling: a 60x40 landscape at 32 is 48x32, cropped at column 8; the same image
   * transposed (40x60) is 32x48 cropped at row 8; the two outputs are transposes up to
   * Pillow's rounding between its passes (horizontal first in both: not the same order over
   * the content), so within one level, and equal on average. */
  vl_image a = mk_img(60, 40, px_noise), b = {0};
  b = a;
  b.w = 40, b.h = 60;
  b.pix = malloc(a.cap);
  assert_non_null(b.pix);
  for (int y = 0; y < 60; y++)
    for (int x = 0; x < 40; x++)
      for (int ch = 0; ch < 3; ch++)
        b.pix[((size_t)y * 40 + x) * 3 + ch] = a.pix[((size_t)x * 60 + y) * 3 + ch];
  float ot[3 * 32 * 32];
  vl_loader_cfg c = sd_cfg(32);
  sd(&c, &a, 1, out);
  sd(&c, &b, 1, ot);
  double sum = 0;
  int same = 0;
  for (int ch = 0; ch < 3; ch++)
    for (int y = 0; y < 32; y++)
      for (int x = 0; x < 32; x++) {
        const int d = level(out[ch * P + y * 32 + x]) - level(ot[ch * P + x * 32 + y]);
        assert_in_range(d + 1, 0, 2);
        sum += d;
        same += d == 0;
      }
  assert_true(fabs(sum) / (3.0 * P) < 0.05);
  assert_true(same > (int)(3 * P) / 2);
  free(a.pix);
  free(b.pix);
}

/* sd_flip: about half the seeds flip, a flipped output is the exact mirror of the unflipped
 * one, the same seed flips the same way; without sd_flip nothing flips. */
static void test_sd_flip(void **state) {
  (void)state;
  vl_image im = mk_img(70, 50, px_noise);
  vl_loader_cfg c = sd_cfg(24);
  const size_t F = 3 * 24 * 24;
  float *plain = malloc(F * sizeof(float)), *out = malloc(F * sizeof(float));
  assert_non_null(plain);
  assert_non_null(out);
  sd(&c, &im, 0, plain);
  for (uint64_t seed = 1; seed < 8; seed++) {
    sd(&c, &im, seed, out);
    assert_memory_equal(out, plain, F * sizeof(float));
  }
  c.sd_flip = true;
  int flips = 0;
  for (uint64_t seed = 0; seed < 64; seed++) {
    sd(&c, &im, seed, out);
    const bool same = !memcmp(out, plain, F * sizeof(float));
    if (!same) {
      for (int ch = 0; ch < 3; ch++)
        for (int y = 0; y < 24; y++)
          for (int x = 0; x < 24; x++)
            assert_true(out[(size_t)ch * 576 + y * 24 + x] == plain[(size_t)ch * 576 + y * 24 + 23 - x]);
      flips++;
    }
    vl_rng r;
    vl_rng_seed(&r, seed);
    assert_int_equal(!same, vl_rng_uniform(&r) < 0.5); /* the centre crop draws nothing */
  }
  assert_true(flips >= 16 && flips <= 48);
  free(plain);
  free(out);
  free(im.pix);
}

/* ToTensor + Normalize([0.5], [0.5]): every byte value maps to (v/255 - 0.5)/0.5 in float, 0
 * to -1 and 255 to 1 exactly, and nothing leaves [-1, 1] whatever the resampling does. */
static void test_sd_range(void **state) {
  (void)state;
  vl_image im = mk_img(16, 16, px_all); /* every value 0..255 once per channel */
  vl_loader_cfg c = sd_cfg(16);
  float out[3 * 256];
  sd(&c, &im, 1, out);
  for (int ch = 0; ch < 3; ch++)
    for (int v = 0; v < 256; v++) {
      assert_true(out[ch * 256 + v] == norm(v));
      assert_true(fabsf(out[ch * 256 + v] - ((float)v / 127.5f - 1.0f)) <= 1e-6f);
    }
  assert_true(out[0] == -1.0f && out[255] == 1.0f);
  free(im.pix);
  im = mk_img(53, 91, px_noise);
  c.crop = 40;
  float *o = malloc(3 * 40 * 40 * sizeof(float));
  assert_non_null(o);
  c.sd_flip = c.sd_random_crop = true;
  for (uint64_t seed = 0; seed < 4; seed++) {
    sd(&c, &im, seed, o);
    for (int i = 0; i < 3 * 40 * 40; i++) assert_true(o[i] >= -1.0f && o[i] <= 1.0f);
  }
  free(o);
  free(im.pix);
}

/* The scratch the transform needs never exceeds the bound the host-memory bound uses, and
 * the transform stays inside what it asked for (a guard word after the block). */
static void test_sd_scratch(void **state) {
  (void)state;
  static const int crops[] = {1, 2, 3, 7, 16, 64, 224, 512};
  int checked = 0;
  for (size_t k = 0; k < sizeof crops / sizeof crops[0]; k++)
    for (int w = 1; w < 1400; w += w < 40 ? 1 : 37)
      for (int h = 1; h < 1400; h += h < 40 ? 3 : 53) {
        const size_t need = vl_transform_sd_scratch_bytes(crops[k], w, h);
        const size_t bound = vl_transform_sd_scratch_bound(crops[k], (size_t)w * h);
        if (need > bound) print_error("crop %d, %dx%d: %zu > %zu\n", crops[k], w, h, need, bound);
        assert_true(need <= bound);
        checked++;
      }
  assert_true(checked > 10000);
  assert_true(vl_transform_sd_scratch_bytes(512, 640, 480) < 40 << 10);
  static const struct { int w, h, R; } cs[] = {
      {640, 480, 512}, {3, 700, 64}, {900, 17, 5}, {1, 1, 9}, {40, 700, 16}};
  for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
    vl_image im = mk_img(cs[k].w, cs[k].h, px_noise);
    vl_loader_cfg c = sd_cfg(cs[k].R);
    c.sd_random_crop = c.sd_flip = true;
    const size_t need = vl_transform_sd_scratch_bytes(cs[k].R, cs[k].w, cs[k].h);
    uint8_t *scr = malloc(need + 64);
    float *out = malloc((size_t)3 * cs[k].R * cs[k].R * sizeof(float));
    assert_non_null(scr);
    assert_non_null(out);
    memset(scr + need, 0xA5, 64);
    vl_rng r;
    vl_rng_seed(&r, 3);
    vl_transform_sd(&c, &im, &r, out, scr);
    for (int i = 0; i < 64; i++) assert_int_equal(scr[need + i], 0xA5);
    free(scr);
    free(out);
    free(im.pix);
  }
}

/* ============================== the loader ============================================= */

/* One epoch's samples in delivery order. */
typedef struct {
  int64_t n;
  int64_t *index;
  float *x;
} epoch_out;

static void run_epoch(const vl_loader_cfg *c, vl_dataset *d, int64_t epoch, epoch_out *o) {
  vl_loader *l = NULL;
  vl_err err;
  vl_status st = vl_loader_create(&l, c, d, &err);
  if (st != VL_OK) print_error("create: %s\n", err.msg);
  assert_int_equal(st, VL_OK);
  const size_t F = 3 * (size_t)c->crop * c->crop;
  o->n = 0;
  o->index = malloc(N_SET * sizeof(int64_t));
  o->x = malloc(N_SET * F * sizeof(float));
  assert_non_null(o->index);
  assert_non_null(o->x);
  assert_int_equal(vl_loader_start_epoch(l, epoch), VL_OK);
  vl_batch_buf *b;
  while ((st = vl_loader_next(l, &b)) == VL_OK && b) {
    assert_true(o->n + b->n <= N_SET);
    memcpy(o->index + o->n, b->index, (size_t)b->n * sizeof(int64_t));
    memcpy(o->x + (size_t)o->n * F, b->x, (size_t)b->n * F * sizeof(float));
    assert_true(b->transform_seconds > 0 && b->load_seconds >= b->transform_seconds);
    o->n += b->n;
    vl_loader_release(l, b);
  }
  assert_int_equal(st, VL_OK);
  vl_loader_stats ls;
  vl_loader_stats_get(l, &ls);
  assert_true(ls.host_bytes_peak <= ls.host_bytes_bound);
  vl_loader_destroy(l);
}

static void epoch_free(epoch_out *o) {
  free(o->index);
  free(o->x);
}

/* The set through the loader with VL_TF_SD (random crop and flip on): every sample once per
 * epoch, in [-1, 1], with 0 workers and per-sample collate and with 2 workers and batched
 * collate the same batches, again the same for the same seed, each sample equal to
 * vl_transform_sd of its decoded image with vl_loader_sample_seed; another epoch, other
 * crops. */
static void test_loader_sd(void **state) {
  (void)state;
  vl_captions *s = open_ok(g_set);
  vl_dataset d = vl_captions_dataset(s);
  vl_loader_cfg c = sd_cfg(32);
  c.batch = 5;
  c.seed = 3;
  c.sd_random_crop = c.sd_flip = true;
  const size_t F = 3 * 32 * 32;
  epoch_out ref, o;
  run_epoch(&c, &d, 1, &ref);
  assert_int_equal(ref.n, N_SET);
  int seen[N_SET] = {0};
  for (int64_t k = 0; k < N_SET; k++) seen[ref.index[k]]++;
  for (int i = 0; i < N_SET; i++) assert_int_equal(seen[i], 1);
  for (size_t q = 0; q < N_SET * F; q++) assert_true(ref.x[q] >= -1.0f && ref.x[q] <= 1.0f);

  vl_image img = {0};
  vl_err err;
  float *one = malloc(F * sizeof(float));
  assert_non_null(one);
  for (int64_t k = 0; k < N_SET; k++) {
    assert_int_equal(d.read(d.self, NULL, ref.index[k], &img, &err), VL_OK);
    void *scr = malloc(vl_transform_sd_scratch_bytes(32, img.w, img.h));
    assert_non_null(scr);
    vl_rng r;
    vl_rng_seed(&r, vl_loader_sample_seed(c.seed, 1, ref.index[k]));
    vl_transform_sd(&c, &img, &r, one, scr);
    assert_memory_equal(one, ref.x + (size_t)k * F, F * sizeof(float));
    free(scr);
  }
  free(one);
  tu_image_free(&img);

  for (int mode = 0; mode < 3; mode++) {
    vl_loader_cfg c2 = c;
    c2.workers = mode == 0 ? 0 : 2;
    c2.batched_collate = mode == 1;
    c2.persistent = mode == 2;
    run_epoch(&c2, &d, 1, &o);
    assert_int_equal(o.n, N_SET);
    assert_memory_equal(o.index, ref.index, N_SET * sizeof(int64_t));
    assert_memory_equal(o.x, ref.x, N_SET * F * sizeof(float));
    epoch_free(&o);
  }
  /* another epoch: another order and other crops/flips of the same samples */
  run_epoch(&c, &d, 2, &o);
  assert_int_equal(o.n, N_SET);
  int differ = 0;
  for (int64_t k = 0; k < N_SET; k++)
    for (int64_t j = 0; j < N_SET; j++)
      if (o.index[j] == ref.index[k]) differ += memcmp(o.x + j * F, ref.x + k * F, F * sizeof(float)) != 0;
  assert_true(differ >= N_SET / 2);
  epoch_free(&o);
  epoch_free(&ref);

  /* The host-memory bound counts the transform's scratch per worker; bad configs refused. */
  vl_loader_cfg ci = c;
  ci.transform = VL_TF_IMAGENET;
  ci.workers = c.workers = 3;
  const size_t extra = vl_loader_host_bytes_bound(&c, N_SET, d.scratch_bytes, d.max_image_bytes) -
                       vl_loader_host_bytes_bound(&ci, N_SET, d.scratch_bytes, d.max_image_bytes);
  assert_int_equal(extra, 3 * vl_transform_sd_scratch_bound(32, d.max_image_bytes / 3));
  vl_loader *l = NULL;
  vl_loader_cfg bad = c;
  bad.masks = true;
  assert_int_equal(vl_loader_create(&l, &bad, &d, &err), VL_ERR_INVALID);
  assert_non_null(strstr(err.msg, "not VL_TF_SD"));
  bad = c;
  bad.transform = (vl_transform_kind)7;
  assert_int_equal(vl_loader_create(&l, &bad, &d, &err), VL_ERR_INVALID);
  assert_non_null(strstr(err.msg, "transform must be VL_TF_IMAGENET or VL_TF_SD (got 7)"));
  /* the default is the ImageNet transform */
  vl_loader_cfg def;
  vl_loader_cfg_default(&def);
  assert_int_equal(def.transform, VL_TF_IMAGENET);
  assert_false(def.sd_flip || def.sd_random_crop);
  vl_captions_close(s);
}

/* ============================== data gen registry ====================================== */

/* `vramlab data gen --kind captions` is a row of the registry: it makes a set of the default
 * size with the options it lists, and fails (1) on a bad one. */
static void test_datagen_registry(void **state) {
  (void)state;
  const vl_dataset_kind *k = vl_dataset_kind_find("captions");
  assert_non_null(k);
  assert_string_equal(k->options, "--n --seed --quality");
  assert_non_null(strstr(k->summary, "sd-lora"));
  int n, found = 0;
  const vl_dataset_kind *all = vl_dataset_kinds(&n);
  for (int i = 0; i < n; i++) found += !strcmp(all[i].kind, "captions");
  assert_int_equal(found, 1);
  assert_string_equal(all[0].kind, "jpeg"); /* the default stays first */

  char dir[320];
  tu_join(dir, sizeof dir, tu_tmp, "registry");
  vl_datagen_opts o = {.out = dir, .n = 2, .seed = 5, .quality = 80, .size = 128, .classes = 5};
  assert_int_equal(k->generate(&o), 0);
  vl_captions *s = open_ok(dir);
  vl_captions_info in;
  vl_captions_info_get(s, &in);
  assert_int_equal(in.n, 2);
  assert_int_equal(in.size, 512); /* --size is the segmentation set's, not read here */
  assert_int_equal(in.seed, 5);
  assert_int_equal(in.quality, 80);
  for (int64_t i = 0; i < 2; i++) {
    int w, h;
    vl_captions_item(s, i, &w, &h, NULL);
    assert_in_range(w < h ? w : h, 384, 640);
  }
  vl_captions_close(s);
  char file[340];
  tu_join(file, sizeof file, tu_tmp, "regfile");
  tu_write_text(file, "x");
  snprintf(dir, sizeof dir, "%s/sub", file); /* under a regular file: cannot be made */
  o.out = dir;
  assert_int_equal(k->generate(&o), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generate_and_read),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_caption_validity),
      cmocka_unit_test(test_manifest_errors),
      cmocka_unit_test(test_first_use),
      cmocka_unit_test(test_generate_errors),
      cmocka_unit_test(test_sd_pillow),
      cmocka_unit_test(test_sd_reference),
      cmocka_unit_test(test_sd_crop_geometry),
      cmocka_unit_test(test_sd_flip),
      cmocka_unit_test(test_sd_range),
      cmocka_unit_test(test_sd_scratch),
      cmocka_unit_test(test_loader_sd),
      cmocka_unit_test(test_datagen_registry),
  };
  return cmocka_run_group_tests(tests, setup, tu_tmp_teardown);
}
