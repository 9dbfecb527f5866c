/* libFuzzer target: bytes -> the jpegset and the segset manifest parsers, from memory
 * (vl_jpegset_parse, vl_segset_parse: what opening a set runs on its manifest.tsv). A
 * refusal must say why; an accepted manifest must give a set whose every item is within
 * the bounds the parsers promise, with a path for each file. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/jpegset.h"
#include "datasets/segset.h"

static void check_jpegset(const vl_jpegset *s) {
  vl_jpegset_info in;
  vl_jpegset_info_get(s, &in);
  if (in.n < 1 || in.n != vl_jpegset_len(s) || in.num_classes < 1) abort();
  int64_t total = 0;
  char path[PATH_MAX];
  for (int64_t i = 0; i < in.n; i++) {
    int32_t label;
    int w, h;
    int64_t bytes;
    if (vl_jpegset_item(s, i, &label, &w, &h, &bytes)) abort();
    if (label < 0 || label >= in.num_classes || w < 1 || w > in.max_w || h < 1 || h > in.max_h ||
        bytes < 1 || bytes > in.max_bytes)
      abort();
    if (!vl_jpegset_path(s, i, path, sizeof path) || strncmp(path, "/fuzz/set/", 10)) abort();
    total += bytes;
  }
  if (total != in.total_bytes) abort();
  vl_dataset d = vl_jpegset_dataset((vl_jpegset *)s);
  if (d.len(d.self) != in.n || d.max_image_bytes != (size_t)in.max_w * (size_t)in.max_h * 3) abort();
}

static void check_segset(const vl_segset *s) {
  vl_segset_info in;
  vl_segset_info_get(s, &in);
  if (in.n < 1 || in.n != vl_segset_len(s) || in.size < VL_SEGSET_SIZE_MIN ||
      in.size > VL_SEGSET_SIZE_MAX || in.num_classes < 2 || in.num_classes > VL_SEGSET_CLASSES_MAX ||
      in.max_bytes < 1 || in.total_bytes < in.max_bytes)
    abort();
  vl_dataset d = vl_segset_dataset((vl_segset *)s);
  if (d.len(d.self) != in.n || d.max_image_bytes != (size_t)in.size * (size_t)in.size * 3) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  vl_err err = {""};
  vl_jpegset *j = NULL;
  if (vl_jpegset_parse(&j, "/fuzz/set", (const char *)d, n, &err) == VL_OK) {
    check_jpegset(j);
    vl_jpegset_close(j);
  } else if (j || !strstr(err.msg, "manifest.tsv")) {
    abort();
  }
  err.msg[0] = 0;
  vl_segset *s = NULL;
  if (vl_segset_parse(&s, "/fuzz/set", (const char *)d, n, &err) == VL_OK) {
    check_segset(s);
    vl_segset_close(s);
  } else if (s || !strstr(err.msg, "manifest.tsv")) {
    abort();
  }
  return 0;
}
