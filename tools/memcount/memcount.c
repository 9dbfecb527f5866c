/* libvlmemcount.so: the live heap bytes of a process and their peak, for the PyTorch peers'
 * memory beside the engine's planned peak (docs/architecture.md "Measurement rules": peers side by side).
 *
 * Preloaded (LD_PRELOAD=build/libvlmemcount.so), it wraps malloc, calloc, realloc,
 * reallocarray, free, posix_memalign, aligned_alloc, memalign, valloc and pvalloc: every
 * block adds its malloc_usable_size to the live count when it is handed out and takes it
 * off when it is freed, so the count is what the heap holds for the program (the
 * allocator's rounding of each block included; its free lists, arenas and trimming not).
 * Memory a library maps itself (mmap) is not seen. Counters are C11 atomics, so every
 * thread counts. The real functions come from dlsym(RTLD_NEXT); dlsym may itself allocate
 * before they are known, which a static bootstrap buffer serves (never freed, never
 * counted).
 *
 * A program reads it through exported functions (Python: ctypes.CDLL of the same path
 * returns the preloaded copy): vl_memcount_live, vl_memcount_peak, vl_memcount_reset_peak
 * (peak := live) and vl_memcount_calls (allocation calls seen: 0 when the library was
 * loaded but not preloaded, so nothing is interposed). With VL_MEMCOUNT_OUT set, the peak,
 * live bytes and calls are also written to that file at exit ("peak live calls\n"). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VL_EXPORT __attribute__((visibility("default")))

typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef void (*free_fn)(void *);
typedef int (*posix_memalign_fn)(void **, size_t, size_t);
typedef void *(*aligned_fn)(size_t, size_t);
typedef void *(*valloc_fn)(size_t);

static struct {
  malloc_fn malloc;
  calloc_fn calloc;
  realloc_fn realloc;
  free_fn free;
  posix_memalign_fn posix_memalign;
  aligned_fn aligned_alloc, memalign;
  valloc_fn valloc, pvalloc;
} real;

static _Atomic int64_t live_bytes, peak_bytes;
static _Atomic uint64_t n_calls;
static _Atomic int resolving; /* dlsym is running: allocations go to the bootstrap buffer */

/* ---- the bootstrap buffer: dlsym's own allocations before the real functions are known ---- */
enum { BOOT_BYTES = 1 << 16, BOOT_ALIGN = 16 };
static alignas(64) unsigned char boot[BOOT_BYTES];
static _Atomic size_t boot_used;

static int in_boot(const void *p) {
  const unsigned char *q = p;
  return q >= boot && q < boot + BOOT_BYTES;
}

/* A zeroed block of n bytes (the buffer is static, so zero) with its size in the 16 bytes
 * before it, for realloc; NULL when the buffer is spent. */
static void *boot_alloc(size_t n) {
  size_t need = BOOT_ALIGN + ((n + BOOT_ALIGN - 1) & ~(size_t)(BOOT_ALIGN - 1));
  size_t at = atomic_fetch_add(&boot_used, need);
  if (at + need > BOOT_BYTES) return NULL;
  memcpy(boot + at, &n, sizeof n);
  return boot + at + BOOT_ALIGN;
}

static size_t boot_size(const void *p) {
  size_t n;
  memcpy(&n, (const unsigned char *)p - BOOT_ALIGN, sizeof n);
  return n;
}

static void resolve(void) {
  if (real.free) return;
  atomic_store(&resolving, 1);
  real.malloc = (malloc_fn)dlsym(RTLD_NEXT, "malloc");
  real.calloc = (calloc_fn)dlsym(RTLD_NEXT, "calloc");
  real.realloc = (realloc_fn)dlsym(RTLD_NEXT, "realloc");
  real.posix_memalign = (posix_memalign_fn)dlsym(RTLD_NEXT, "posix_memalign");
  real.aligned_alloc = (aligned_fn)dlsym(RTLD_NEXT, "aligned_alloc");
  real.memalign = (aligned_fn)dlsym(RTLD_NEXT, "memalign");
  real.valloc = (valloc_fn)dlsym(RTLD_NEXT, "valloc");
  real.pvalloc = (valloc_fn)dlsym(RTLD_NEXT, "pvalloc");
  real.free = (free_fn)dlsym(RTLD_NEXT, "free"); /* last: it marks the table complete */
  atomic_store(&resolving, 0);
}

/* ---- counting ------------------------------------------------------------------------------ */
static void count_add(const void *p) {
  int64_t n = (int64_t)malloc_usable_size((void *)p);
  int64_t now = atomic_fetch_add(&live_bytes, n) + n;
  int64_t pk = atomic_load(&peak_bytes);
  while (now > pk && !atomic_compare_exchange_weak(&peak_bytes, &pk, now)) {
  }
  atomic_fetch_add(&n_calls, 1);
}

static void count_sub(const void *p) { atomic_fetch_sub(&live_bytes, (int64_t)malloc_usable_size((void *)p)); }

/* Before the table is complete (or while dlsym runs) the bootstrap buffer serves. */
static int booting(void) {
  if (atomic_load(&resolving)) return 1;
  resolve();
  return !real.free;
}

/* ---- the wrapped functions ------------------------------------------------------------------ */
VL_EXPORT void *malloc(size_t n) {
  if (booting()) return boot_alloc(n);
  void *p = real.malloc(n);
  if (p) count_add(p);
  return p;
}

VL_EXPORT void *calloc(size_t n, size_t m) {
  if (booting()) {
    if (m && n > SIZE_MAX / m) return NULL;
    return boot_alloc(n * m);
  }
  void *p = real.calloc(n, m);
  if (p) count_add(p);
  return p;
}

VL_EXPORT void free(void *p) {
  if (!p || in_boot(p)) return;
  if (booting()) return; /* cannot happen: a block from the real malloc means the table is known */
  count_sub(p);
  real.free(p);
}

VL_EXPORT void *realloc(void *p, size_t n) {
  if (!p) return malloc(n);
  if (in_boot(p)) { /* move a bootstrap block to the real heap */
    void *q = malloc(n);
    if (q) {
      size_t old = boot_size(p);
      memcpy(q, p, old < n ? old : n);
    }
    return q;
  }
  if (booting()) return NULL;
  int64_t old = (int64_t)malloc_usable_size(p);
  void *q = real.realloc(p, n);
  if (q) {
    atomic_fetch_sub(&live_bytes, old);
    count_add(q);
  } else if (n == 0) {
    atomic_fetch_sub(&live_bytes, old); /* glibc: realloc(p, 0) frees p */
  }
  return q;
}

VL_EXPORT void *reallocarray(void *p, size_t n, size_t m) {
  if (m && n > SIZE_MAX / m) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(p, n * m);
}

VL_EXPORT int posix_memalign(void **out, size_t align, size_t n) {
  if (booting()) return ENOMEM;
  int r = real.posix_memalign(out, align, n);
  if (r == 0 && *out) count_add(*out);
  return r;
}

VL_EXPORT void *aligned_alloc(size_t align, size_t n) {
  if (booting()) return NULL;
  void *p = real.aligned_alloc(align, n);
  if (p) count_add(p);
  return p;
}

VL_EXPORT void *memalign(size_t align, size_t n) {
  if (booting()) return NULL;
  void *p = real.memalign(align, n);
  if (p) count_add(p);
  return p;
}

VL_EXPORT void *valloc(size_t n) {
  if (booting()) return NULL;
  void *p = real.valloc(n);
  if (p) count_add(p);
  return p;
}

VL_EXPORT void *pvalloc(size_t n) {
  if (booting()) return NULL;
  void *p = real.pvalloc(n);
  if (p) count_add(p);
  return p;
}

/* ---- what a program reads ------------------------------------------------------------------ */
VL_EXPORT int64_t vl_memcount_live(void) { return atomic_load(&live_bytes); }
VL_EXPORT int64_t vl_memcount_peak(void) { return atomic_load(&peak_bytes); }
VL_EXPORT uint64_t vl_memcount_calls(void) { return atomic_load(&n_calls); }
/* peak := live, so the next peak is that of what follows (a training step). */
VL_EXPORT void vl_memcount_reset_peak(void) { atomic_store(&peak_bytes, atomic_load(&live_bytes)); }

__attribute__((constructor)) static void memcount_init(void) { resolve(); }

/* VL_MEMCOUNT_OUT: "peak live calls\n" at exit, without allocating (so not through the
 * engine's atomic writer: this library links nothing of the engine). */
__attribute__((destructor)) static void memcount_fini(void) {
  const char *path = getenv("VL_MEMCOUNT_OUT");
  if (!path || !*path) return;
  char line[96];
  int k = snprintf(line, sizeof line, "%lld %lld %llu\n", (long long)vl_memcount_peak(),
                   (long long)vl_memcount_live(), (unsigned long long)vl_memcount_calls());
  /* never through a link planted at the path (a name in /tmp, typically): refused, said once */
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    static const char link_msg[] = "libvlmemcount: VL_MEMCOUNT_OUT is a symbolic link: not written through\n";
    static const char fail_msg[] = "libvlmemcount: VL_MEMCOUNT_OUT cannot be opened for writing\n";
    const char *m = errno == ELOOP ? link_msg : fail_msg;
    size_t mn = errno == ELOOP ? sizeof link_msg - 1 : sizeof fail_msg - 1;
    if (write(2, m, mn) < 0) { /* nothing else to tell it with */
    }
    return;
  }
  if (k > 0 && write(fd, line, (size_t)k) != k) { /* nothing to do: the reader sees a short file */
  }
  close(fd);
}
