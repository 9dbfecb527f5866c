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
 * live bytes and calls are also written to that file at exit ("peak live calls\n").
 *
 * Who holds the peak (VL_MEMCOUNT_WHO=1 in the environment at start; off, nothing of it runs):
 * each live block is also kept in a table with its "site" (what allocated it: a class and the
 * ATen op running at the time), so the peak can be split into tensors and what is no tensor.
 * The class of a block of 4 KiB or more comes from its caller (the first frame outside this
 * library): PyTorch's CPU allocator (c10's alloc_cpu: a tensor's storage, or a buffer a library
 * takes through it), C++ new, Python, libtorch_cpu's own (oneDNN's and MKL's buffers, whose
 * symbols are hidden) or another library; smaller blocks are "small". The program names the op
 * running (vl_memcount_who_op) and marks the blocks that are tensor storages
 * (vl_memcount_who_tensor: an op's outputs, parameters), which moves them to the class
 * "tensor"; vl_memcount_who_base snapshots the sites (the bytes before a step) and restarts the
 * peak; vl_memcount_who_dump writes, per site, the bytes at the base, at the peak and now
 * (tools/peers/heap_breakdown.py drives it around a PyTorch peer's step). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <sys/mman.h>
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


/* ---- who holds the peak (VL_MEMCOUNT_WHO=1) ------------------------------------------------- */
enum { WHO_SLOTS = 1 << 22, WHO_OPS = 2048, WHO_SMALL = 4096 };
typedef enum { W_SMALL, W_TENSOR, W_C10, W_NEW, W_PYTHON, W_TORCH, W_OTHER, W_NCLASS } who_class;
static const char *const who_class_name[W_NCLASS] = {"small", "tensor", "c10_allocator", "operator_new",
                                                     "python", "libtorch_cpu", "other"};
typedef struct {
  const void *p;
  int64_t n;
  uint64_t seq; /* its allocation's number */
  int32_t site;
} who_slot;
static struct {
  int on;
  pthread_mutex_t mu;
  who_slot *slot; /* open addressing, mmap'd (not counted) */
  char op[WHO_OPS][64];
  int nop, cur; /* op names; the op running now (0: none) */
  int64_t live, peak, tensor_live, tensor_peak;
  uint64_t seq, peak_seq; /* allocations so far; their number when the peak was taken */
  int64_t site_live[WHO_OPS * W_NCLASS], site_peak[WHO_OPS * W_NCLASS], site_base[WHO_OPS * W_NCLASS];
} who = {.mu = PTHREAD_MUTEX_INITIALIZER, .nop = 1, .op = {"-"}};
static _Thread_local int who_busy; /* inside backtrace/dladdr: their own allocations not classified */

static uint64_t who_hash(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  return x ^ (x >> 33);
}

static who_slot *who_find(const void *p) {
  uint64_t i = who_hash(p) & (WHO_SLOTS - 1);
  while (who.slot[i].p && who.slot[i].p != p) i = (i + 1) & (WHO_SLOTS - 1);
  return &who.slot[i];
}

/* The class of one return address (dladdr; the answers cached: the call sites are few). */
enum { WHO_PC_SLOTS = 1 << 14 };
static struct {
  void *pc;
  int8_t cls; /* -1: this library's own frame */
} who_pc[WHO_PC_SLOTS];

static int who_pc_class(void *pc) {
  uint64_t i = who_hash(pc) & (WHO_PC_SLOTS - 1);
  if (who_pc[i].pc == pc) return who_pc[i].cls;
  Dl_info d, self;
  int c = W_OTHER;
  if (!dladdr(pc, &d)) d.dli_fname = NULL, d.dli_sname = NULL;
  if (dladdr((void *)who_hash, &self) && d.dli_fname && self.dli_fname && !strcmp(d.dli_fname, self.dli_fname)) {
    c = -1;
  } else {
    const char *s = d.dli_sname ? d.dli_sname : "", *f = d.dli_fname ? d.dli_fname : "";
    const char *base = strrchr(f, '/') ? strrchr(f, '/') + 1 : f;
    if (strstr(s, "alloc_cpu")) c = W_C10;
    else if (!strncmp(s, "_Znwm", 5) || !strncmp(s, "_Znam", 5)) c = W_NEW;
    else if (!strncmp(base, "libtorch_cpu", 12)) c = W_TORCH;
    else if (!strncmp(base, "libpython", 9) || !strncmp(base, "python", 6)) c = W_PYTHON;
  }
  pthread_mutex_lock(&who.mu);
  who_pc[i].pc = pc;
  who_pc[i].cls = (int8_t)c;
  pthread_mutex_unlock(&who.mu);
  return c;
}

/* The first frame outside this library says who allocated. */
static who_class who_caller(void) {
  void *fr[8];
  int n = backtrace(fr, 8);
  for (int i = 1; i < n; i++) {
    int c = who_pc_class(fr[i]);
    if (c >= 0) return (who_class)c;
  }
  return W_OTHER;
}

static void who_move(int64_t *site, int from, int to, int64_t n) {
  site[from] -= n;
  site[to] += n;
}

static void who_note_peak(void) {
  if (who.live > who.peak) {
    who.peak = who.live;
    who.peak_seq = who.seq;
    memcpy(who.site_peak, who.site_live, sizeof who.site_live);
  }
  if (who.tensor_live > who.tensor_peak) who.tensor_peak = who.tensor_live;
}

static void who_add(const void *p, int64_t n) {
  if (who_busy) return;
  who_busy = 1;
  who_class c = n >= WHO_SMALL ? who_caller() : W_SMALL;
  pthread_mutex_lock(&who.mu);
  who_slot *s = who_find(p);
  *s = (who_slot){p, n, ++who.seq, who.cur * W_NCLASS + (int)c};
  who.site_live[s->site] += n;
  who.live += n;
  who_note_peak();
  pthread_mutex_unlock(&who.mu);
  who_busy = 0;
}

static void who_sub(const void *p) {
  pthread_mutex_lock(&who.mu);
  who_slot *s = who_find(p);
  if (s->p) {
    who.site_live[s->site] -= s->n;
    who.live -= s->n;
    if (s->site % W_NCLASS == W_TENSOR) who.tensor_live -= s->n;
    s->p = NULL; /* then re-seat the run after it (no tombstones) */
    for (uint64_t j = ((uint64_t)(s - who.slot) + 1) & (WHO_SLOTS - 1); who.slot[j].p; j = (j + 1) & (WHO_SLOTS - 1)) {
      who_slot e = who.slot[j];
      who.slot[j].p = NULL;
      *who_find(e.p) = e;
    }
  }
  pthread_mutex_unlock(&who.mu);
}

static void who_start(void) {
  const char *e = getenv("VL_MEMCOUNT_WHO");
  if (!e || strcmp(e, "1")) return;
  void *m = mmap(NULL, WHO_SLOTS * sizeof(who_slot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return;
  who.slot = m;
  who.on = 1;
}

/* The op running now (NULL or "": none). */
VL_EXPORT void vl_memcount_who_op(const char *name) {
  if (!who.on) return;
  pthread_mutex_lock(&who.mu);
  int k = 0;
  if (name && *name) {
    for (k = who.nop - 1; k > 0 && strncmp(who.op[k], name, sizeof who.op[0] - 1); k--) {
    }
    if (k == 0 && who.nop < WHO_OPS) {
      k = who.nop++;
      snprintf(who.op[k], sizeof who.op[k], "%s", name);
    }
  }
  who.cur = k;
  pthread_mutex_unlock(&who.mu);
}

/* The block at p is a tensor's storage made by op `name`: its bytes move to class "tensor". */
VL_EXPORT void vl_memcount_who_tensor(const void *p, const char *name) {
  if (!who.on || !p) return;
  int save = who.cur;
  vl_memcount_who_op(name);
  pthread_mutex_lock(&who.mu);
  who_slot *s = who_find(p);
  int to = who.cur * W_NCLASS + W_TENSOR;
  if (s->p && s->site % W_NCLASS != W_TENSOR) {
    who_move(who.site_live, s->site, to, s->n);
    /* made before the peak was taken and live now, so live then: a tensor at the peak too (an
     * op's output is marked when the op returns, after a peak inside the op) */
    if (s->seq <= who.peak_seq) who_move(who.site_peak, s->site, to, s->n);
    s->site = to;
    who.tensor_live += s->n;
    who_note_peak();
  }
  who.cur = save;
  pthread_mutex_unlock(&who.mu);
}

/* The sites now are the base; the peaks restart from here. */
VL_EXPORT void vl_memcount_who_base(void) {
  if (!who.on) return;
  pthread_mutex_lock(&who.mu);
  memcpy(who.site_base, who.site_live, sizeof who.site_live);
  memcpy(who.site_peak, who.site_live, sizeof who.site_live);
  who.peak = who.live;
  who.peak_seq = who.seq;
  who.tensor_peak = who.tensor_live;
  pthread_mutex_unlock(&who.mu);
}

/* The peaks restart from now (the base kept). */
VL_EXPORT void vl_memcount_who_reset_peak(void) {
  if (!who.on) return;
  pthread_mutex_lock(&who.mu);
  memcpy(who.site_peak, who.site_live, sizeof who.site_live);
  who.peak = who.live;
  who.peak_seq = who.seq;
  who.tensor_peak = who.tensor_live;
  pthread_mutex_unlock(&who.mu);
}

/* "live peak tensor_live tensor_peak" then one line per site that moved: "class op base peak
 * now" (tab-separated). 0, or -1 when off or the file cannot be written. */
VL_EXPORT int vl_memcount_who_dump(const char *path) {
  if (!who.on) return -1;
  who_busy = 1;
  FILE *f = fopen(path, "w");
  if (f) {
    pthread_mutex_lock(&who.mu);
    fprintf(f, "%lld\t%lld\t%lld\t%lld\n", (long long)who.live, (long long)who.peak, (long long)who.tensor_live,
            (long long)who.tensor_peak);
    for (int i = 0; i < who.nop * W_NCLASS; i++)
      if (who.site_base[i] || who.site_peak[i] || who.site_live[i])
        fprintf(f, "%s\t%s\t%lld\t%lld\t%lld\n", who_class_name[i % W_NCLASS], who.op[i / W_NCLASS],
                (long long)who.site_base[i], (long long)who.site_peak[i], (long long)who.site_live[i]);
    pthread_mutex_unlock(&who.mu);
  }
  int r = f && !ferror(f) ? 0 : -1;
  if (f && fclose(f)) r = -1;
  who_busy = 0;
  return r;
}

/* ---- counting ------------------------------------------------------------------------------ */
static void count_add(const void *p) {
  int64_t n = (int64_t)malloc_usable_size((void *)p);
  int64_t now = atomic_fetch_add(&live_bytes, n) + n;
  int64_t pk = atomic_load(&peak_bytes);
  while (now > pk && !atomic_compare_exchange_weak(&peak_bytes, &pk, now)) {
  }
  atomic_fetch_add(&n_calls, 1);
  if (who.on) who_add(p, n);
}

static void count_sub(const void *p) {
  if (who.on) who_sub(p);
  atomic_fetch_sub(&live_bytes, (int64_t)malloc_usable_size((void *)p));
}

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
  if (who.on) who_sub(p); /* before p can be handed to another thread */
  void *q = real.realloc(p, n);
  if (q) {
    atomic_fetch_sub(&live_bytes, old);
    count_add(q);
  } else if (n == 0) {
    atomic_fetch_sub(&live_bytes, old); /* glibc: realloc(p, 0) frees p */
  } else if (who.on) {
    who_add(p, old); /* it failed: p is still the program's */
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

__attribute__((constructor)) static void memcount_init(void) {
  resolve();
  who_start();
}

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
