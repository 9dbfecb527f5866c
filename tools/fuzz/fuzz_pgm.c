/* libFuzzer target: bytes -> the segset's PGM mask reader (vl_segset_decode_mask, what its
 * read() runs on each mask file). The last input byte is not part of the file: it picks
 * the set's side (1..64, its low 6 bits) and class count (2, 5, 64 or 256, its top 2), so
 * that masks that match the set, and ones that do not, are both reached. A refusal must
 * say why and name the file; an accepted mask must hold only ids below the class count. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/segset.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  if (n < 1) return 0;
  const uint8_t p = d[n - 1];
  const int size = 1 + (p & 63);
  static const int classes_of[4] = {2, 5, 64, 256};
  const int classes = classes_of[p >> 6];
  /* the file in a buffer of its own, so ASan sees a read past its end */
  const size_t len = n - 1;
  uint8_t *file = malloc(len ? len : 1);
  if (!file) return 0;
  memcpy(file, d, len);
  static uint8_t dst[64 * 64];
  memset(dst, 0xEE, sizeof dst);
  vl_err err = {""};
  vl_status st = vl_segset_decode_mask("fuzz.pgm", file, len, size, classes, dst, &err);
  if (st == VL_OK) {
    for (int k = 0; k < size * size; k++)
      if (dst[k] >= classes) abort();
  } else if (st != VL_ERR_IO || !strstr(err.msg, "fuzz.pgm")) {
    abort();
  }
  free(file);
  return 0;
}
