/* Damaged data-set files for the tests: a truncated, garbled or replaced JPEG, a broken or
 * missing mask. Test-only code, so it lives here and not in datasets/: testutil.c
 * #includes this file because the CMake rule compiles each tests/test_*.c with
 * tests/testutil.c only. Declarations: testutil.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "datasets/jpegset.h"
#include "datasets/segset.h"
#include "vramlab/fileio.h"

static void damage_fail(char *err, size_t errn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void damage_fail(char *err, size_t errn, const char *fmt, ...) {
  if (!err || !errn) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errn, fmt, ap);
  va_end(ap);
}

/* A call of the engine or a data set (vl_status, its message in e) as this file's helpers
 * report: 0, or -1 with the message in err. */
static int damage_from(vl_status st, const vl_err *e, char *err, size_t errn) {
  if (st == VL_OK) return 0;
  damage_fail(err, errn, "%s", e->msg);
  return -1;
}

static int damage_write(const char *path, const void *data, size_t len, char *err, size_t errn) {
  vl_err e;
  return damage_from(vl_file_write_atomic(path, data, len, &e), &e, err, errn);
}

/* The whole file into *buf (malloc'd; the caller frees it, also on failure), as the data
 * sets read it: at most VL_LOADER_MAX_FILE_BYTES, an empty file is an error. 0 or -1. */
static int damage_read(const char *path, uint8_t **buf, size_t *len, char *err, size_t errn) {
  size_t cap = 0;
  *buf = NULL;
  *len = 0;
  vl_err e;
  if (damage_from(vl_file_read(path, VL_LOADER_MAX_FILE_BYTES, "max_file_bytes", buf, &cap, len, &e), &e, err,
                  errn))
    return -1;
  if (*len == 0) {
    damage_fail(err, errn, "%s: empty file (0 bytes)", path);
    return -1;
  }
  return 0;
}

int tu_damage_jpeg(const char *path, int mode, uint64_t salt, char *err, size_t errn) {
  if (mode == TU_JPEG_NOT_JPEG) {
    static const char junk[] =
        "This is not a JPEG file: vramlab replaced the image to test corrupt-file handling.\n";
    return damage_write(path, junk, sizeof junk - 1, err, errn);
  }
  int rc = -1;
  uint8_t *buf = NULL;
  size_t len = 0;
  if (damage_read(path, &buf, &len, err, errn) == 0) {
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      damage_fail(err, errn, "%s: cannot open for writing: %s", path, strerror(errno));
    } else if (mode == TU_JPEG_TRUNCATE) {
      if (ftruncate(fd, (off_t)(len / 2)) != 0 || fsync(fd) != 0)
        damage_fail(err, errn, "%s: cannot truncate: %s", path, strerror(errno));
      else
        rc = 0;
    } else {
      /* Entropy-coded data: after the SOS segment, up to the EOI marker. */
      size_t sos = 0;
      for (size_t k = 2; k + 3 < len; k++)
        if (buf[k] == 0xFF && buf[k + 1] == 0xDA) {
          sos = k;
          break;
        }
      size_t start = sos ? sos + 2 + ((size_t)buf[sos + 2] << 8 | buf[sos + 3]) : 0;
      size_t end = len >= 2 ? len - 2 : 0;
      enum { G = 64 };
      if (!sos || start + 4 * G > end) {
        damage_fail(err, errn, "%s: no entropy-coded data long enough to damage (is it a JPEG?)",
                    path);
      } else {
        uint8_t g[G];
        vl_rng r;
        vl_rng_seed(&r, vl_mix64(salt ^ 0xBADBADull));
        for (int k = 0; k < G; k++) g[k] = (uint8_t)vl_rng_u64(&r);
        /* A stray EOI marker: the decoder runs out of data mid-scan, which libjpeg reports
         * (random bytes alone can decode into wrong pixels without a word). */
        g[G / 2] = 0xFF;
        g[G / 2 + 1] = 0xD9;
        off_t at = (off_t)(start + (end - start) / 2 - G / 2);
        if (pwrite(fd, g, G, at) != G || fsync(fd) != 0)
          damage_fail(err, errn, "%s: cannot write: %s", path, strerror(errno));
        else
          rc = 0;
      }
    }
    if (fd >= 0) close(fd);
  }
  free(buf);
  return rc;
}

int tu_jpegset_corrupt(const char *dir, int64_t i, int mode, char *err, size_t errn) {
  if (mode < TU_JPEG_TRUNCATE || mode > TU_JPEG_NOT_JPEG) {
    damage_fail(err, errn,
                "jpegset: unknown corrupt mode %d (0 truncate, 1 garbage, 2 not a JPEG)", mode);
    return -1;
  }
  vl_jpegset *s = NULL;
  vl_err e;
  if (damage_from(vl_jpegset_open(&s, dir, &e), &e, err, errn)) return -1;
  char path[PATH_MAX];
  int rc = -1;
  if (!vl_jpegset_path(s, i, path, sizeof path))
    damage_fail(err, errn, "jpegset: image %lld is not in the set (n = %lld)", (long long)i,
                (long long)vl_jpegset_len(s));
  else
    rc = tu_damage_jpeg(path, mode, (uint64_t)i, err, errn); /* the salt: the image index */
  vl_jpegset_close(s);
  return rc;
}

/* The segset's mask header (its generator's): "P5\n<w> <h>\n255\n". */
enum { PGM_HDR_MAX = 32 };
static size_t damage_pgm_header(char *buf, size_t n, int w, int h) {
  return (size_t)snprintf(buf, n, "P5\n%d %d\n255\n", w, h);
}

/* The mask at path (size x size, as generated) damaged as `what` says. */
static int damage_mask(const char *path, int what, int size, int num_classes, char *err,
                       size_t errn) {
  uint8_t *buf = NULL;
  size_t len = 0;
  if (damage_read(path, &buf, &len, err, errn) != 0) {
    free(buf);
    return -1;
  }
  int rc = -1;
  if (what == TU_SEGSET_MASK_TRUNCATE) {
    if (truncate(path, (off_t)(len / 2)) != 0)
      damage_fail(err, errn, "%s: cannot truncate: %s", path, strerror(errno));
    else
      rc = 0;
  } else if (what == TU_SEGSET_MASK_WRONG_SIZE) {
    /* A well-formed PGM of (size/2) x size: the first half of every row. */
    const int w2 = size / 2;
    uint8_t *o = malloc(PGM_HDR_MAX + (size_t)w2 * size);
    size_t h = o ? damage_pgm_header((char *)o, PGM_HDR_MAX, w2, size) : 0;
    const size_t pix0 = len - (size_t)size * size; /* the generator's header length */
    if (!o || len < (size_t)size * size) {
      damage_fail(err, errn, "%s: %s", path,
                  o ? "too short to resize (already damaged?)" : "out of memory");
    } else {
      for (int y = 0; y < size; y++)
        memcpy(o + h + (size_t)y * w2, buf + pix0 + (size_t)y * size, (size_t)w2);
      rc = damage_write(path, o, h + (size_t)w2 * size, err, errn);
    }
    free(o);
  } else if (what == TU_SEGSET_MASK_BAD_CLASS) {
    if (len < (size_t)size * size) {
      damage_fail(err, errn, "%s: too short to damage (already damaged?)", path);
    } else {
      size_t at = len - (size_t)size * size + (size_t)(size / 2) * size + size / 3;
      buf[at] = (uint8_t)(num_classes < 256 ? num_classes : 255);
      rc = damage_write(path, buf, len, err, errn);
    }
  } else { /* TU_SEGSET_MASK_BAD_HEADER: an ASCII PGM magic on binary data */
    buf[0] = 'P';
    if (len > 1) buf[1] = '2';
    rc = damage_write(path, buf, len, err, errn);
  }
  free(buf);
  return rc;
}

int tu_segset_corrupt(const char *dir, int64_t i, int what, char *err, size_t errn) {
  if (what < TU_SEGSET_IMG_TRUNCATE || what > TU_SEGSET_MASK_MISSING) {
    damage_fail(err, errn,
                "segset: unknown corrupt mode %d (0..2: image truncate, garbage, not a JPEG; "
                "3..6: mask truncate, wrong size, bad class, bad header; 7, 8: delete the "
                "image, the mask)", what);
    return -1;
  }
  vl_segset *s = NULL;
  vl_err e;
  if (damage_from(vl_segset_open(&s, dir, &e), &e, err, errn)) return -1;
  vl_segset_info info;
  vl_segset_info_get(s, &info);
  char img[PATH_MAX], mask[PATH_MAX];
  int rc = -1;
  if (i < 0 || i >= info.n) {
    damage_fail(err, errn, "segset: sample %lld is not in the set (n = %lld)", (long long)i,
                (long long)info.n);
  } else if (!vl_segset_path(s, i, false, img, sizeof img) ||
             !vl_segset_path(s, i, true, mask, sizeof mask)) {
    damage_fail(err, errn, "segset: path of sample %lld too long", (long long)i);
  } else if (what <= TU_SEGSET_IMG_NOT_JPEG) {
    /* the image modes are the JPEG modes, in the same order */
    rc = tu_damage_jpeg(img, what, (uint64_t)i, err, errn);
  } else if (what == TU_SEGSET_IMG_MISSING || what == TU_SEGSET_MASK_MISSING) {
    const char *path = what == TU_SEGSET_IMG_MISSING ? img : mask;
    if (unlink(path) != 0) damage_fail(err, errn, "cannot delete %s: %s", path, strerror(errno));
    else rc = 0;
  } else {
    rc = damage_mask(mask, what, info.size, info.num_classes, err, errn);
  }
  vl_segset_close(s);
  return rc;
}
