/* On-disk caches of encoder outputs (latents, text embeddings): keys, the file format,
 * CRC-32, the builder (unique temporary file, fsync, rename) and the reader (header and
 * size validation at open, a CRC check on every record read, an optional RAM mode). The
 * layout and the concurrency rules are in vramlab/cache.h. */
#define _GNU_SOURCE
#include "vramlab/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../kernels/kcommon.h"
#include "vramlab/fileio.h"

static const char CACHE_MAGIC[8] = {'V', 'L', 'C', 'A', 'C', 'H', 'E', 0};
#define HDR VL_CACHE_HEADER_BYTES
#define HDR_CRC_OFF (HDR - 4)
#define WRITE_BUF_BYTES ((size_t)1 << 20)

/* ---- CRC-32/ISO-HDLC, slice-by-8 ------------------------------------------------------ */
/* crc_tab[0] is the classic byte table of the reflected polynomial 0xEDB88320;
 * crc_tab[k][b] is the CRC of byte b followed by k zero bytes, so eight bytes are folded per
 * step with eight independent lookups. */
static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t r = b;
    for (int k = 0; k < 8; k++) r = (r >> 1) ^ (0xEDB88320u & (0u - (r & 1u)));
    crc_tab[0][b] = r;
  }
  for (int t = 1; t < 8; t++)
    for (int b = 0; b < 256; b++)
      crc_tab[t][b] = (crc_tab[t - 1][b] >> 8) ^ crc_tab[0][crc_tab[t - 1][b] & 0xffu];
}

uint32_t vl_crc32(uint32_t crc, const void *data, size_t n) {
  pthread_once(&crc_once, crc_init);
  const uint8_t *p = data;
  uint32_t r = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t lo = r ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                       (uint32_t)p[3] << 24);
    r = crc_tab[7][lo & 0xffu] ^ crc_tab[6][(lo >> 8) & 0xffu] ^
        crc_tab[5][(lo >> 16) & 0xffu] ^ crc_tab[4][lo >> 24] ^ crc_tab[3][p[4]] ^
        crc_tab[2][p[5]] ^ crc_tab[1][p[6]] ^ crc_tab[0][p[7]];
  }
  while (n--) r = (r >> 8) ^ crc_tab[0][(r ^ *p++) & 0xffu];
  return ~r;
}

/* A record's CRC: its index (LE uint64) then its payload. */
static uint32_t record_crc(int64_t i, const void *payload, size_t n) {
  uint8_t idx[8];
  for (int k = 0; k < 8; k++) idx[k] = (uint8_t)((uint64_t)i >> (8 * k));
  return vl_crc32(vl_crc32(0, idx, 8), payload, n);
}

uint64_t vl_cache_hash(uint64_t h, const void *data, size_t n) {
  const uint8_t *p = data;
  size_t len = n;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w = 0;
    for (int k = 0; k < 8; k++) w |= (uint64_t)p[k] << (8 * k);
    h = vl_mix64(h ^ w);
  }
  uint64_t w = 0;
  for (size_t k = 0; k < n; k++) w |= (uint64_t)p[k] << (8 * k);
  /* the length goes in last: "ab" and "ab\0" differ */
  return vl_mix64(vl_mix64(h ^ w) ^ (uint64_t)len);
}

/* ---- keys ---------------------------------------------------------------------------- */
void vl_cache_key_init(vl_cache_key *k, const char *kind) {
  memset(k, 0, sizeof *k);
  if (kind) snprintf(k->kind, sizeof k->kind, "%s", kind);
  k->flip_variants = 1;
  for (int i = 0; i < 3; i++) k->norm_std[i] = 1.0f;
  k->latent_scale = 1.0f;
  k->form = VL_CACHE_TENSOR;
  k->dtype = VL_F32;
}

void vl_cache_key_shape(vl_cache_key *k, int ndim, const int64_t *shape) {
  k->ndim = ndim;
  for (int i = 0; i < VL_MAX_DIMS; i++) k->shape[i] = i < ndim ? shape[i] : 0;
}

static const char *form_name(int32_t f) {
  switch (f) {
  case VL_CACHE_MOMENTS: return "moments";
  case VL_CACHE_SAMPLE: return "sample";
  case VL_CACHE_TENSOR: return "tensor";
  default: return "?";
  }
}

static const char *crop_name(int32_t c) {
  switch (c) {
  case VL_CACHE_CROP_NONE: return "none";
  case VL_CACHE_CROP_CENTER: return "center";
  case VL_CACHE_CROP_TOP_LEFT: return "top-left";
  default: return "?";
  }
}

static bool storage_dtype(vl_dtype d) { return d == VL_F32 || d == VL_F16 || d == VL_BF16; }

vl_status vl_cache_key_check(vl_ctx *c, const vl_cache_key *k) {
  if (!memchr(k->kind, 0, sizeof k->kind) || !k->kind[0])
    return vl_fail(c, VL_ERR_INVALID, "cache key: kind must be 1 to %d characters",
                   VL_CACHE_KIND_MAX - 1);
  if (k->form < 0 || k->form >= VL_CACHE_FORM_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "cache key: form %d", (int)k->form);
  if (k->crop < 0 || k->crop >= VL_CACHE_CROP_COUNT)
    return vl_fail(c, VL_ERR_INVALID, "cache key: crop %d", (int)k->crop);
  if (k->flip_variants != 1 && k->flip_variants != 2)
    return vl_fail(c, VL_ERR_INVALID, "cache key: flip_variants %d (1 or 2)",
                   (int)k->flip_variants);
  if (!storage_dtype(k->dtype))
    return vl_fail(c, VL_ERR_INVALID, "cache key: dtype %d (fp32, fp16 or bf16)",
                   (int)k->dtype);
  if (k->width < 0 || k->height < 0)
    return vl_fail(c, VL_ERR_INVALID, "cache key: resolution %dx%d", (int)k->width,
                   (int)k->height);
  if (k->ndim < 1 || k->ndim > VL_MAX_DIMS)
    return vl_fail(c, VL_ERR_INVALID, "cache key: record rank %d", (int)k->ndim);
  int64_t n = 1;
  for (int i = 0; i < VL_MAX_DIMS; i++) {
    if (i >= k->ndim) {
      if (k->shape[i] != 0)
        return vl_fail(c, VL_ERR_INVALID, "cache key: unused dim %d is %lld", i,
                       (long long)k->shape[i]);
      continue;
    }
    if (k->shape[i] <= 0 || k->shape[i] > ((int64_t)1 << 31) || n > ((int64_t)1 << 31))
      return vl_fail(c, VL_ERR_INVALID, "cache key: record dim %d is %lld", i,
                     (long long)k->shape[i]);
    n *= k->shape[i];
  }
  if (n > ((int64_t)1 << 31))
    return vl_fail(c, VL_ERR_INVALID, "cache key: record of %lld elements (limit 2^31)",
                   (long long)n);
  if (k->form == VL_CACHE_MOMENTS && k->shape[0] % 2)
    return vl_fail(c, VL_ERR_INVALID,
                   "cache key: moments record (%lld, ...): dim 0 holds mean and log-variance "
                   "channels, so it must be even",
                   (long long)k->shape[0]);
  if (k->form != VL_CACHE_SAMPLE && k->sample_seed != 0)
    return vl_fail(c, VL_ERR_INVALID, "cache key: sample_seed set on a %s cache",
                   form_name(k->form));
  return VL_OK;
}

static bool f32_same(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* First differing field of a and b, with both values in msg. */
const char *vl_cache_key_diff(const vl_cache_key *a, const vl_cache_key *b, char *msg,
                              size_t msgn) {
  char m[200];
  const char *f = NULL;
#define DIFF_INT(field, fmt, conv)                                                         \
  if (!f && a->field != b->field) {                                                        \
    f = #field;                                                                            \
    snprintf(m, sizeof m, fmt " vs " fmt, conv(a->field), conv(b->field));                 \
  }
  if (strncmp(a->kind, b->kind, sizeof a->kind) != 0) {
    f = "kind";
    snprintf(m, sizeof m, "\"%.*s\" vs \"%.*s\"", (int)sizeof a->kind, a->kind,
             (int)sizeof b->kind, b->kind);
  }
  DIFF_INT(model_hash, "%016llx", (unsigned long long))
  DIFF_INT(data_hash, "%016llx", (unsigned long long))
  DIFF_INT(width, "%d", (int))
  DIFF_INT(height, "%d", (int))
  DIFF_INT(crop, "%s", crop_name)
  DIFF_INT(flip_variants, "%d", (int))
  for (int i = 0; i < 3 && !f; i++)
    if (!f32_same(a->norm_mean[i], b->norm_mean[i])) {
      f = "norm_mean";
      snprintf(m, sizeof m, "[%d] %.9g vs %.9g", i, a->norm_mean[i], b->norm_mean[i]);
    }
  for (int i = 0; i < 3 && !f; i++)
    if (!f32_same(a->norm_std[i], b->norm_std[i])) {
      f = "norm_std";
      snprintf(m, sizeof m, "[%d] %.9g vs %.9g", i, a->norm_std[i], b->norm_std[i]);
    }
  if (!f && !f32_same(a->latent_scale, b->latent_scale)) {
    f = "latent_scale";
    snprintf(m, sizeof m, "%.9g vs %.9g", a->latent_scale, b->latent_scale);
  }
  DIFF_INT(form, "%s", form_name)
  DIFF_INT(sample_seed, "%llu", (unsigned long long))
  DIFF_INT(dtype, "%s", vl_dtype_name)
#undef DIFF_INT
  bool shape_same = a->ndim == b->ndim;
  for (int i = 0; i < VL_MAX_DIMS && shape_same; i++) shape_same = a->shape[i] == b->shape[i];
  if (!f && !shape_same) {
    f = "shape";
    char sa[80], sb[80];
    const vl_cache_key *ks[2] = {a, b};
    char *ss[2] = {sa, sb};
    for (int j = 0; j < 2; j++) {
      int o = snprintf(ss[j], 80, "(");
      for (int i = 0; i < ks[j]->ndim && i < VL_MAX_DIMS && o < 70; i++)
        o += snprintf(ss[j] + o, (size_t)(80 - o), "%s%lld", i ? ", " : "",
                      (long long)ks[j]->shape[i]);
      snprintf(ss[j] + o, (size_t)(80 - o), ")");
    }
    snprintf(m, sizeof m, "%s vs %s", sa, sb);
  }
  if (f && msg && msgn) snprintf(msg, msgn, "%s %s", f, m);
  return f;
}

/* ---- sizes ---------------------------------------------------------------------------- */
int64_t vl_cache_record_elems(const vl_cache_key *k) {
  int64_t n = 1;
  for (int i = 0; i < k->ndim && i < VL_MAX_DIMS; i++) n *= k->shape[i];
  return n;
}

size_t vl_cache_record_bytes(const vl_cache_key *k) {
  return vl_dtype_bytes(k->dtype, vl_cache_record_elems(k));
}

uint64_t vl_cache_file_bytes(const vl_cache_key *k, int64_t n_records) {
  return (uint64_t)HDR + (uint64_t)n_records * ((uint64_t)vl_cache_record_bytes(k) + 4u);
}

/* ---- header (de)serialisation ------------------------------------------------------------ */
static void put32(uint8_t *p, uint32_t v) {
  for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) v |= (uint32_t)p[k] << (8 * k);
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int k = 0; k < 8; k++) v |= (uint64_t)p[k] << (8 * k);
  return v;
}
static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void header_write(uint8_t h[HDR], const vl_cache_key *k, int64_t n) {
  memset(h, 0, HDR);
  memcpy(h, CACHE_MAGIC, 8);
  put32(h + 8, VL_CACHE_VERSION);
  put32(h + 12, HDR);
  memcpy(h + 16, k->kind, VL_CACHE_KIND_MAX);
  put64(h + 32, k->model_hash);
  put64(h + 40, k->data_hash);
  put32(h + 48, (uint32_t)k->width);
  put32(h + 52, (uint32_t)k->height);
  put32(h + 56, (uint32_t)k->crop);
  put32(h + 60, (uint32_t)k->flip_variants);
  for (int i = 0; i < 3; i++) put32(h + 64 + 4 * i, fbits(k->norm_mean[i]));
  for (int i = 0; i < 3; i++) put32(h + 76 + 4 * i, fbits(k->norm_std[i]));
  put32(h + 88, fbits(k->latent_scale));
  put32(h + 92, (uint32_t)k->form);
  put64(h + 96, k->sample_seed);
  put32(h + 104, (uint32_t)k->dtype);
  put32(h + 108, (uint32_t)k->ndim);
  for (int i = 0; i < VL_MAX_DIMS; i++) put64(h + 112 + 8 * i, (uint64_t)k->shape[i]);
  size_t p = vl_cache_record_bytes(k);
  put64(h + 144, (uint64_t)n);
  put64(h + 152, (uint64_t)p);
  put64(h + 160, (uint64_t)p + 4);
  put32(h + HDR_CRC_OFF, vl_crc32(0, h, HDR_CRC_OFF));
}

static void header_key(const uint8_t h[HDR], vl_cache_key *k) {
  memset(k, 0, sizeof *k);
  memcpy(k->kind, h + 16, VL_CACHE_KIND_MAX);
  k->model_hash = get64(h + 32);
  k->data_hash = get64(h + 40);
  k->width = (int32_t)get32(h + 48);
  k->height = (int32_t)get32(h + 52);
  k->crop = (int32_t)get32(h + 56);
  k->flip_variants = (int32_t)get32(h + 60);
  for (int i = 0; i < 3; i++) k->norm_mean[i] = bitsf(get32(h + 64 + 4 * i));
  for (int i = 0; i < 3; i++) k->norm_std[i] = bitsf(get32(h + 76 + 4 * i));
  k->latent_scale = bitsf(get32(h + 88));
  k->form = (int32_t)get32(h + 92);
  k->sample_seed = get64(h + 96);
  uint32_t dt = get32(h + 104);
  k->dtype = dt < VL_DTYPE_COUNT ? (vl_dtype)dt : VL_DTYPE_COUNT;
  k->ndim = (int32_t)get32(h + 108);
  for (int i = 0; i < VL_MAX_DIMS; i++) k->shape[i] = (int64_t)get64(h + 112 + 8 * i);
}

/* ---- paths ------------------------------------------------------------------------------- */
/* dir and base name of path; -1 when too long or not a file name. */
static int split_path(const char *path, char dir[PATH_MAX], const char **base) {
  const char *slash = strrchr(path, '/');
  *base = slash ? slash + 1 : path;
  int dn = !slash ? snprintf(dir, PATH_MAX, ".")
           : slash == path ? snprintf(dir, PATH_MAX, "/")
                           : snprintf(dir, PATH_MAX, "%.*s", (int)(slash - path), path);
  return (!**base || dn < 0 || dn >= PATH_MAX || strlen(path) > PATH_MAX - 96) ? -1 : 0;
}

/* This host's name with anything but [A-Za-z0-9_-] made '_': a field of the temp name. */
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

/* Removes ".<base>.tmp.<host>.<pid>.<seq>" files in dir whose process is gone: what a
 * builder that crashed left. Only this host's (a pid means nothing elsewhere). */
static void remove_dead_temps(const char *dir, const char *base, const char *host) {
  char prefix[PATH_MAX];
  int pn = snprintf(prefix, sizeof prefix, ".%s.tmp.%s.", base, host);
  if (pn < 0 || (size_t)pn >= sizeof prefix) return;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, (size_t)pn) != 0) continue;
    char *end = NULL;
    long pid = strtol(e->d_name + pn, &end, 10);
    if (end == e->d_name + pn || *end != '.' || pid <= 0) continue;
    char *end2 = NULL;
    (void)strtoul(end + 1, &end2, 10);
    if (end2 == end + 1 || *end2 != 0) continue;
    if ((pid_t)pid == getpid()) continue;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) (void)unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

/* ---- builder ---------------------------------------------------------------------------- */
struct vl_cache_builder {
  vl_cache_key key;
  int64_t n, added;
  size_t payload, stride;
  int fd;        /* -1 once failed, committed or aborted */
  bool failed;
  uint8_t *buf;  /* buffered records */
  size_t buf_cap, buf_len;
  char path[PATH_MAX], dir[PATH_MAX], tmp[PATH_MAX];
};

static int write_all(int fd, const uint8_t *p, size_t len) {
  while (len) {
    ssize_t k = write(fd, p, len);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += k;
    len -= (size_t)k;
  }
  return 0;
}

/* Drops the temporary file after an error (errno-preserving). */
static void builder_fail(vl_cache_builder *b) {
  int e = errno;
  if (b->fd >= 0) close(b->fd);
  b->fd = -1;
  if (b->tmp[0]) unlink(b->tmp);
  b->tmp[0] = 0;
  b->failed = true;
  errno = e;
}

static vl_status builder_io_error(vl_ctx *c, vl_cache_builder *b, const char *what) {
  int e = errno;
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", b->tmp);
  builder_fail(b);
  char sz[32];
  vl_fmt_bytes((size_t)vl_cache_file_bytes(&b->key, b->n), sz, sizeof sz);
  return vl_fail(c, VL_ERR_IO,
                 "%s: cannot build cache: %s %s: %s (a cache of %s; %lld of %lld records "
                 "done; nothing left behind)",
                 b->path, what, tmp, strerror(e), sz, (long long)b->added, (long long)b->n);
}

static vl_status builder_flush(vl_ctx *c, vl_cache_builder *b) {
  if (b->buf_len && write_all(b->fd, b->buf, b->buf_len) != 0)
    return builder_io_error(c, b, "write");
  b->buf_len = 0;
  return VL_OK;
}

vl_status vl_cache_build_begin(vl_ctx *c, const char *path, const vl_cache_key *key,
                               int64_t n_records, vl_cache_builder **out) {
  *out = NULL;
  VL_TRY(vl_cache_key_check(c, key));
  if (n_records < 0)
    return vl_fail(c, VL_ERR_INVALID, "%s: %lld records", path, (long long)n_records);
  vl_cache_builder *b = calloc(1, sizeof *b);
  if (!b) return vl_fail(c, VL_ERR_OOM, "%s: out of memory for a cache builder", path);
  b->fd = -1;
  const char *base;
  if (split_path(path, b->dir, &base) != 0) {
    free(b);
    return vl_fail(c, VL_ERR_INVALID, "cache path too long or not a file name: %.200s", path);
  }
  snprintf(b->path, sizeof b->path, "%s", path);
  b->key = *key;
  b->n = n_records;
  b->payload = vl_cache_record_bytes(key);
  b->stride = b->payload + 4;
  /* whole records per buffer; one when a record is larger than the buffer */
  b->buf_cap = b->stride > WRITE_BUF_BYTES ? b->stride
                                           : WRITE_BUF_BYTES - WRITE_BUF_BYTES % b->stride;
  b->buf = malloc(b->buf_cap);
  vl_err err;
  if (!b->buf) {
    size_t cap = b->buf_cap;
    free(b);
    return vl_fail(c, VL_ERR_OOM, "%s: out of memory for a %zu-byte write buffer", path, cap);
  }
  if (vl_file_mkdir_p(b->dir, &err) != VL_OK) {
    vl_cache_build_abort(&b);
    return vl_fail(c, VL_ERR_IO, "%s: %s", path, err.msg);
  }
  char host[64];
  host_tag(host, sizeof host);
  remove_dead_temps(b->dir, base, host);
  /* unique among processes (pid), hosts sharing the folder (host) and threads (seq) */
  static unsigned seq_counter;
  unsigned seq = __atomic_fetch_add(&seq_counter, 1u, __ATOMIC_RELAXED);
  int tn = snprintf(b->tmp, sizeof b->tmp, "%s/.%s.tmp.%s.%ld.%u", b->dir, base, host,
                    (long)getpid(), seq);
  if (tn < 0 || (size_t)tn >= sizeof b->tmp) {
    b->tmp[0] = 0;
    vl_cache_build_abort(&b);
    return vl_fail(c, VL_ERR_INVALID, "cache path too long: %.200s", path);
  }
  b->fd = open(b->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (b->fd < 0) {
    int e = errno;
    b->tmp[0] = 0; /* not ours: never unlinked */
    vl_cache_build_abort(&b);
    return vl_fail(c, VL_ERR_IO, "%s: cannot create the temporary cache file: %s", path,
                   strerror(e));
  }
  /* Reserve the whole file now: a full disk is reported before hours of encoding, not
   * after. File systems without fallocate (EOPNOTSUPP) find out at write time instead. */
  uint64_t total = vl_cache_file_bytes(key, n_records);
  if (fallocate(b->fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)total) != 0 &&
      (errno == ENOSPC || errno == EDQUOT || errno == EFBIG)) {
    vl_status s = builder_io_error(c, b, "reserving the space of");
    vl_cache_build_abort(&b);
    return s;
  }
  uint8_t h[HDR];
  header_write(h, key, n_records);
  if (write_all(b->fd, h, HDR) != 0) {
    vl_status s = builder_io_error(c, b, "write");
    vl_cache_build_abort(&b);
    return s;
  }
  *out = b;
  return VL_OK;
}

/* Completes the record whose payload was just put at the end of the write buffer: its CRC
 * behind it; the buffer goes to the file when the next record would not fit. */
static vl_status builder_push(vl_ctx *c, vl_cache_builder *b) {
  uint8_t *rec = b->buf + b->buf_len;
  put32(rec + b->payload, record_crc(b->added, rec, b->payload));
  b->buf_len += b->stride;
  b->added++;
  if (b->buf_len + b->stride > b->buf_cap) return builder_flush(c, b);
  return VL_OK;
}

static vl_status builder_ready(vl_ctx *c, const vl_cache_builder *b) {
  if (b->failed || b->fd < 0)
    return vl_fail(c, VL_ERR_INVALID, "%s: cache builder used after a failure", b->path);
  if (b->added >= b->n)
    return vl_fail(c, VL_ERR_INVALID, "%s: record %lld added to a cache of %lld records",
                   b->path, (long long)b->added, (long long)b->n);
  return VL_OK;
}

vl_status vl_cache_build_add(vl_ctx *c, vl_cache_builder *b, const float *x) {
  VL_TRY(builder_ready(c, b));
  uint8_t *rec = b->buf + b->buf_len;
  int64_t n = vl_cache_record_elems(&b->key);
  if (b->key.dtype == VL_F32) {
    memcpy(rec, x, b->payload);
  } else {
    uint16_t *h = (uint16_t *)(void *)rec; /* buf is malloc'd and stride is even: aligned */
    if (b->key.dtype == VL_F16)
      for (int64_t i = 0; i < n; i++) h[i] = vl_f2h(x[i]);
    else
      for (int64_t i = 0; i < n; i++) h[i] = vl_f2bf(x[i]);
  }
  return builder_push(c, b);
}

vl_status vl_cache_build_add_raw(vl_ctx *c, vl_cache_builder *b, const void *raw) {
  VL_TRY(builder_ready(c, b));
  memcpy(b->buf + b->buf_len, raw, b->payload);
  return builder_push(c, b);
}

int64_t vl_cache_build_count(const vl_cache_builder *b) { return b ? b->added : 0; }

vl_status vl_cache_build_commit(vl_ctx *c, vl_cache_builder **bp) {
  vl_cache_builder *b = *bp;
  vl_status s = VL_OK;
  if (!b) return vl_fail(c, VL_ERR_INVALID, "cache commit without a builder");
  if (b->failed || b->fd < 0) {
    s = vl_fail(c, VL_ERR_INVALID, "%s: cache commit after a failure", b->path);
    goto done;
  }
  if (b->added != b->n) {
    s = vl_fail(c, VL_ERR_INVALID, "%s: cache commit with %lld of %lld records", b->path,
                (long long)b->added, (long long)b->n);
    goto done;
  }
  VL_TRY_GOTO(s, builder_flush(c, b), done);
  if (fsync(b->fd) != 0) {
    s = builder_io_error(c, b, "fsync");
    goto done;
  }
  int fd = b->fd;
  b->fd = -1;
  if (close(fd) != 0) {
    s = builder_io_error(c, b, "close");
    goto done;
  }
  if (rename(b->tmp, b->path) != 0) {
    s = builder_io_error(c, b, "rename of");
    goto done;
  }
  b->tmp[0] = 0; /* it is the cache now */
  vl_file_fsync_dir(b->dir);
done:
  vl_cache_build_abort(bp);
  return s;
}

void vl_cache_build_abort(vl_cache_builder **bp) {
  vl_cache_builder *b = bp ? *bp : NULL;
  if (!b) return;
  if (b->fd >= 0) close(b->fd);
  if (b->tmp[0]) unlink(b->tmp);
  free(b->buf);
  free(b);
  *bp = NULL;
}

/* ---- reader ------------------------------------------------------------------------------ */
struct vl_cache {
  vl_cache_key key;
  int64_t n;
  size_t payload, stride;
  uint64_t file_bytes;
  int fd;       /* file mode; -1 in RAM mode */
  uint8_t *ram; /* RAM mode: n payloads back to back (CRCs checked, then dropped) */
  char path[PATH_MAX];
};

const char *vl_cache_state_name(vl_cache_state s) {
  switch (s) {
  case VL_CACHE_VALID: return "valid";
  case VL_CACHE_MISSING: return "missing";
  case VL_CACHE_STALE: return "stale";
  case VL_CACHE_CORRUPT: return "corrupt";
  }
  return "?";
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off) {
  uint8_t *p = buf;
  while (n) {
    ssize_t k = pread(fd, p, n, (off_t)off);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (k == 0) {
      errno = 0; /* end of file: short */
      return -1;
    }
    p += k;
    n -= (size_t)k;
    off += (uint64_t)k;
  }
  return 0;
}

/* Checks the m records of buf (m * stride bytes holding records i0 ..) and copies their
 * payloads to dst when it is not NULL; -1 and the failing index in *bad on a CRC mismatch. */
static int check_records(const vl_cache *k, const uint8_t *buf, int64_t i0, int64_t m,
                         uint8_t *dst, int64_t *bad) {
  for (int64_t j = 0; j < m; j++) {
    const uint8_t *rec = buf + (size_t)j * k->stride;
    if (get32(rec + k->payload) != record_crc(i0 + j, rec, k->payload)) {
      *bad = i0 + j;
      return -1;
    }
    if (dst) memcpy(dst + (size_t)j * k->payload, rec, k->payload);
  }
  return 0;
}

/* Every record's CRC, the file read in chunks; into k->ram (packed payloads) when ram. */
static vl_status scan_records(vl_ctx *c, vl_cache *k, bool ram, vl_cache_state *state) {
  size_t per = k->stride > WRITE_BUF_BYTES ? 1 : WRITE_BUF_BYTES / k->stride;
  uint8_t *chunk = malloc(per * k->stride);
  if (ram && k->n) k->ram = malloc((size_t)k->n * k->payload);
  if (!chunk || (ram && k->n && !k->ram)) {
    free(chunk);
    char sz[32];
    vl_fmt_bytes(ram ? (size_t)k->n * k->payload : per * k->stride, sz, sizeof sz);
    return vl_fail(c, VL_ERR_OOM, "%s: out of memory for %s of cache records", k->path, sz);
  }
  vl_status s = VL_OK;
  for (int64_t i = 0; i < k->n; i += (int64_t)per) {
    int64_t m = k->n - i < (int64_t)per ? k->n - i : (int64_t)per;
    if (pread_all(k->fd, chunk, (size_t)m * k->stride, HDR + (uint64_t)i * k->stride) != 0) {
      int e = errno;
      *state = VL_CACHE_CORRUPT;
      if (e) s = vl_fail(c, VL_ERR_IO, "%s: read error: %s", k->path, strerror(e));
      else vl_fail(c, VL_OK, "%s: corrupt: truncated while it was read (records from %lld)",
                   k->path, (long long)i);
      break;
    }
    int64_t bad;
    uint8_t *dst = ram ? k->ram + (size_t)i * k->payload : NULL;
    if (check_records(k, chunk, i, m, dst, &bad) != 0) {
      *state = VL_CACHE_CORRUPT;
      vl_fail(c, VL_OK, "%s: corrupt: record %lld of %lld: CRC mismatch", k->path,
              (long long)bad, (long long)k->n);
      break;
    }
  }
  free(chunk);
  return s;
}

/* The outcome of a check that sends the caller to rebuild: VL_OK and the state, c's
 * message explaining. */
static vl_status found(vl_ctx *c, vl_cache_state *state, vl_cache_state st, const char *path,
                       const char *why) {
  *state = st;
  vl_fail(c, VL_OK, "%s: %s: %s", path, vl_cache_state_name(st), why);
  return VL_OK;
}

vl_status vl_cache_open(vl_ctx *c, const char *path, const vl_cache_key *want,
                        int64_t n_records, const vl_cache_opts *o, vl_cache_state *state,
                        vl_cache **out) {
  static const vl_cache_opts defaults = {
      .on_mismatch = VL_CACHE_REBUILD, .in_ram = false, .verify = false};
  if (!o) o = &defaults;
  *out = NULL;
  *state = VL_CACHE_CORRUPT; /* what an I/O error leaves: not valid */
  VL_TRY(vl_cache_key_check(c, want));
  if (strlen(path) >= PATH_MAX)
    return vl_fail(c, VL_ERR_INVALID, "cache path too long: %.200s", path);
  /* O_NONBLOCK: a FIFO planted at the path must not block the open (fileio.c) */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return found(c, state, VL_CACHE_MISSING, path, "no file");
    return vl_fail(c, VL_ERR_IO, "%s: cannot open the cache: %s", path, strerror(errno));
  }
  vl_cache *k = calloc(1, sizeof *k);
  if (!k) {
    close(fd);
    return vl_fail(c, VL_ERR_OOM, "%s: out of memory", path);
  }
  k->fd = fd;
  snprintf(k->path, sizeof k->path, "%s", path);
  vl_status s = VL_OK;
  char why[512];
  struct stat st;
  if (fstat(fd, &st) != 0) {
    s = vl_fail(c, VL_ERR_IO, "%s: cannot stat the cache: %s", path, strerror(errno));
    goto fail;
  }
  if (!S_ISREG(st.st_mode)) {
    s = vl_fail(c, VL_ERR_IO, "%s: the cache is not a regular file", path);
    goto fail;
  }
  uint64_t size = (uint64_t)st.st_size;
  k->file_bytes = size;
  uint8_t h[HDR];
  if (size < HDR) {
    snprintf(why, sizeof why, "truncated: %llu bytes, shorter than the %d-byte header",
             (unsigned long long)size, HDR);
    s = found(c, state, VL_CACHE_CORRUPT, path, why);
    goto fail;
  }
  if (pread_all(fd, h, HDR, 0) != 0) {
    if (errno) {
      s = vl_fail(c, VL_ERR_IO, "%s: read error: %s", path, strerror(errno));
    } else {
      s = found(c, state, VL_CACHE_CORRUPT, path, "truncated while the header was read");
    }
    goto fail;
  }
  if (memcmp(h, CACHE_MAGIC, 8) != 0) {
    s = found(c, state, VL_CACHE_CORRUPT, path, "not a vramlab cache (bad magic)");
    goto fail;
  }
  uint32_t crc_stored = get32(h + HDR_CRC_OFF), crc = vl_crc32(0, h, HDR_CRC_OFF);
  if (crc_stored != crc) {
    snprintf(why, sizeof why, "header CRC mismatch (stored %08x, computed %08x)", crc_stored, crc);
    s = found(c, state, VL_CACHE_CORRUPT, path, why);
    goto fail;
  }
  if (get32(h + 8) != VL_CACHE_VERSION || get32(h + 12) != HDR) {
    snprintf(why, sizeof why, "format version %u (header %u bytes), this build reads %d",
             get32(h + 8), get32(h + 12), VL_CACHE_VERSION);
    s = found(c, state, VL_CACHE_STALE, path, why);
    goto fail;
  }
  header_key(h, &k->key);
  uint64_t n = get64(h + 144), p = get64(h + 152), stride = get64(h + 160);
  /* the CRC matched, so a bad field here is a writer's bug, not a flipped bit */
  if (vl_cache_key_check(NULL, &k->key) != VL_OK || p != vl_cache_record_bytes(&k->key) ||
      stride != p + 4 || n > ((uint64_t)1 << 40) || n > (UINT64_MAX - HDR) / stride) {
    s = found(c, state, VL_CACHE_CORRUPT, path, "inconsistent header (key, record size or count)");
    goto fail;
  }
  k->n = (int64_t)n;
  k->payload = (size_t)p;
  k->stride = (size_t)stride;
  char diff[256];
  const char *field = vl_cache_key_diff(&k->key, want, diff, sizeof diff);
  if (!field && n_records >= 0 && k->n != n_records) {
    field = "records";
    snprintf(diff, sizeof diff, "records %lld vs %lld", (long long)k->n, (long long)n_records);
  }
  if (field) {
    if (o->on_mismatch == VL_CACHE_STRICT) {
      *state = VL_CACHE_STALE;
      s = vl_fail(c, VL_ERR_INVALID,
                  "%s: the cache was built for another %s (file vs expected: %s); strict "
                  "mode: not rebuilt",
                  path, field, diff);
      goto fail;
    }
    snprintf(why, sizeof why, "key differs in %s (file vs expected: %s)", field, diff);
    s = found(c, state, VL_CACHE_STALE, path, why);
    goto fail;
  }
  uint64_t expect = vl_cache_file_bytes(&k->key, k->n);
  if (size != expect) {
    snprintf(why, sizeof why, "%s: %llu bytes, the header's %lld records of %zu bytes make %llu",
             size < expect ? "truncated" : "trailing bytes", (unsigned long long)size,
             (long long)k->n, k->stride, (unsigned long long)expect);
    s = found(c, state, VL_CACHE_CORRUPT, path, why);
    goto fail;
  }
  *state = VL_CACHE_VALID;
  if (o->in_ram || o->verify) {
    VL_TRY_GOTO(s, scan_records(c, k, o->in_ram, state), fail);
    if (*state != VL_CACHE_VALID) goto fail;
  }
  if (o->in_ram) {
    close(k->fd);
    k->fd = -1;
  }
  *out = k;
  return VL_OK;
fail:
  vl_cache_close(k);
  return s;
}

static vl_status check_index(vl_ctx *c, const vl_cache *k, int64_t i) {
  if (i < 0 || i >= k->n)
    return vl_fail(c, VL_ERR_INVALID, "%s: record %lld of a cache of %lld", k->path,
                   (long long)i, (long long)k->n);
  return VL_OK;
}

vl_status vl_cache_read_raw(vl_ctx *c, const vl_cache *k, int64_t i, void *out) {
  VL_TRY(check_index(c, k, i));
  if (k->ram) {
    memcpy(out, k->ram + (size_t)i * k->payload, k->payload);
    return VL_OK;
  }
  uint8_t crc_b[4];
  struct iovec iov[2] = {{.iov_base = out, .iov_len = k->payload},
                         {.iov_base = crc_b, .iov_len = 4}};
  off_t off = (off_t)(HDR + (uint64_t)i * k->stride);
  size_t want = k->stride, got = 0;
  while (got < want) {
    ssize_t r = preadv(k->fd, iov, 2, off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = r < 0 ? errno : 0;
      memset(out, 0, k->payload);
      return vl_fail(c, VL_ERR_IO, "%s: record %lld of %lld: %s; rebuild the cache", k->path,
                     (long long)i, (long long)k->n,
                     e ? strerror(e) : "short read (the file was truncated)");
    }
    got += (size_t)r;
    /* advance the iovecs past what was read (rare: a regular file reads whole) */
    size_t adv = (size_t)r;
    for (int j = 0; j < 2 && adv; j++) {
      size_t t = adv < iov[j].iov_len ? adv : iov[j].iov_len;
      iov[j].iov_base = (uint8_t *)iov[j].iov_base + t;
      iov[j].iov_len -= t;
      adv -= t;
    }
  }
  uint32_t stored = get32(crc_b), crc = record_crc(i, out, k->payload);
  if (stored != crc) {
    memset(out, 0, k->payload);
    return vl_fail(c, VL_ERR_IO,
                   "%s: record %lld of %lld: CRC mismatch (stored %08x, computed %08x): the "
                   "cache is corrupt; rebuild it",
                   k->path, (long long)i, (long long)k->n, stored, crc);
  }
  return VL_OK;
}

vl_status vl_cache_read(vl_ctx *c, const vl_cache *k, int64_t i, float *out) {
  int64_t n = vl_cache_record_elems(&k->key);
  if (k->key.dtype == VL_F32) return vl_cache_read_raw(c, k, i, out);
  /* 2-byte elements: read into the upper half of out, then widen front to back; element j
   * is loaded (at byte 2n + 2j) before out[j] (bytes [4j, 4j + 4)) is stored, and stores
   * never reach elements not yet loaded (4j + 4 <= 2n + 2(j + 1) while j < n). */
  uint8_t *o = (uint8_t *)out;
  const uint8_t *raw = o + 2 * (size_t)n;
  vl_status s = vl_cache_read_raw(c, k, i, o + 2 * (size_t)n);
  if (s != VL_OK) {
    memset(out, 0, (size_t)n * sizeof(float));
    return s;
  }
  bool f16 = k->key.dtype == VL_F16;
  for (int64_t j = 0; j < n; j++) {
    uint16_t hv;
    memcpy(&hv, raw + 2 * j, 2);
    float v = f16 ? vl_h2f(hv) : vl_bf2f(hv);
    memcpy(o + 4 * j, &v, 4);
  }
  return VL_OK;
}

const vl_cache_key *vl_cache_key_of(const vl_cache *k) { return &k->key; }
int64_t vl_cache_count(const vl_cache *k) { return k->n; }
uint64_t vl_cache_disk_bytes(const vl_cache *k) { return k->file_bytes; }
uint64_t vl_cache_ram_bytes(const vl_cache *k) { return k->ram ? (uint64_t)k->n * k->payload : 0; }

void vl_cache_close(vl_cache *k) {
  if (!k) return;
  if (k->fd >= 0) close(k->fd);
  free(k->ram);
  free(k);
}
