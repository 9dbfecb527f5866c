/* `vramlab bench allreduce|reduce_scatter|allgather` (collbench.h): the nccl-tests table over
 * N ranks. Started outside mpirun it runs itself under vl_mpirun with the same arguments
 * (--ranks N, default 2). Under mpirun every rank takes part; rank 0 prints.
 *
 * Per size, as nccl-tests does: known values filled (small integers per rank and index, so
 * every sum is exact in every dtype), warmup iterations, a barrier, `iters` timed
 * collectives (blocking, back to back; time = their mean, averaged over ranks), then the
 * buffers refilled, one more collective and every element of the result checked on every
 * rank (#wrong summed over ranks); out of place, then in place (dist.h's convention).
 * algbw = size / time, busbw = algbw * vl_comm_busbw_factor. Sizes: --min-bytes to
 * --max-bytes by --factor, each rounded down to whole elements per rank (size is the full
 * buffer: allreduce's, reduce_scatter's send, allgather's recv, as in nccl-tests).
 * Exit status 1 when any element is wrong; --json FILE writes the table atomically (its path
 * is checked before any work). */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "collbench.h"
#include "kit/mpirun.h"
#include "kit/parse.h"
#include "vramlab/backend.h"
#include "vramlab/dist.h"
#include "vramlab/elem.h"
#include "vramlab/fileio.h"

#define CB_MAX_ROWS 64

bool vl_collbench_is(const char *name) {
  return name && (!strcmp(name, "allreduce") || !strcmp(name, "reduce_scatter") ||
                  !strcmp(name, "allgather"));
}

typedef struct {
  const char *coll;
  int ranks, iters, warmup;
  size_t min_bytes, max_bytes;
  double factor, timeout;
  vl_dtype dt;
  vl_device dev;
  const char *json;
  bool oversubscribe;
} cb_args;

typedef struct {
  double time_us, algbw, busbw;
  long wrong;
} cb_meas;

typedef struct {
  size_t bytes;
  int64_t count;
  cb_meas oop, ip;
} cb_row;

static void usage(FILE *f, const char *coll) {
  fprintf(f,
          "usage: vramlab bench %s [--ranks N (2)] [--oversubscribe] [--min-bytes 8] "
          "[--max-bytes 256M]\n"
          "         [--factor 2] [--iters 20] [--warmup 5] [--dtype float|half|bfloat16|int32]\n"
          "         [--device cpu|cuda] [--json FILE] [--timeout S (600)]\n"
          "  sizes take K, M, G (binary, as nccl-tests) or KiB/MB/... suffixes\n",
          coll);
}

/* ---- arguments ---------------------------------------------------------------------------- */

/* A size through the strict parser (NaN, "inf", junk and hex refused): a number with an
 * optional K, M or G (binary, as nccl-tests), at most 1e15 bytes, or vl_parse_bytes's
 * KiB, MB, ... forms. */
static int parse_size(const char *s, size_t *out) {
  static const char units[] = "kKmMgG";
  static const double mult[] = {1024.0, 1048576.0, 1073741824.0};
  size_t n = strlen(s);
  if (!n) return -1;
  const char *u = strchr(units, s[n - 1]);
  if (!u && !strchr("0123456789.", s[n - 1])) return vl_parse_bytes(s, out);
  double m = u ? mult[(u - units) / 2] : 1, v;
  char num[64];
  if (u) n--;
  if (n >= sizeof num) return -1;
  memcpy(num, s, n);
  num[n] = 0;
  if (vl_parse_f64(num, 0, 1e15 / m, &v) != VL_PARSE_OK) return -1;
  *out = (size_t)(v * m);
  return 0;
}

static int parse_dtype(const char *s, vl_dtype *dt) {
  if (!strcmp(s, "float")) *dt = VL_F32;
  else if (!strcmp(s, "half")) *dt = VL_F16;
  else if (!strcmp(s, "bfloat16")) *dt = VL_BF16;
  else if (!strcmp(s, "int32") || !strcmp(s, "int")) *dt = VL_I32;
  else if (vl_dtype_parse(s, dt) || *dt == VL_NF4) return -1;
  return 0;
}

static int parse_int(const char *s, int lo, int *out) {
  int64_t v;
  if (vl_parse_i64(s, lo, INT_MAX, &v) != VL_PARSE_OK) return -1;
  *out = (int)v;
  return 0;
}

static int bad_arg(const cb_args *a, const char *opt, const char *val, const char *want) {
  fprintf(stderr, "vramlab: bench %s: %s %s: %s\n", a->coll, opt, val ? val : "(missing)", want);
  return 2;
}

static int parse_args(int argc, char **argv, cb_args *a) {
  *a = (cb_args){argv[0], 2, 20, 5, 8, 256u << 20, 2, 600, VL_F32, VL_DEV_CPU, NULL, false};
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
      usage(stdout, a->coll);
      return 1;
    }
    if (!strcmp(o, "--oversubscribe")) {
      a->oversubscribe = true;
      continue;
    }
    if (!v) return bad_arg(a, o, NULL, "needs a value");
    i++;
    if (!strcmp(o, "--ranks")) {
      if (parse_int(v, 1, &a->ranks)) return bad_arg(a, o, v, "a number of ranks >= 1");
    } else if (!strcmp(o, "--iters")) {
      if (parse_int(v, 1, &a->iters)) return bad_arg(a, o, v, "a count >= 1");
    } else if (!strcmp(o, "--warmup")) {
      if (parse_int(v, 0, &a->warmup)) return bad_arg(a, o, v, "a count >= 0");
    } else if (!strcmp(o, "--min-bytes")) {
      if (parse_size(v, &a->min_bytes) || a->min_bytes < 1) return bad_arg(a, o, v, "a size >= 1 byte (8, 1K, 1M)");
    } else if (!strcmp(o, "--max-bytes")) {
      if (parse_size(v, &a->max_bytes) || a->max_bytes < 1 || a->max_bytes > ((size_t)1 << 33))
        return bad_arg(a, o, v, "a size from 1 byte to 8G (8, 1K, 256M)");
    } else if (!strcmp(o, "--factor")) {
      if (vl_parse_f64(v, 1, 1024, &a->factor) != VL_PARSE_OK || !(a->factor > 1))
        return bad_arg(a, o, v, "a factor > 1, at most 1024");
    } else if (!strcmp(o, "--timeout")) {
      if (vl_parse_f64(v, 0, 1e9, &a->timeout) != VL_PARSE_OK || !(a->timeout > 0))
        return bad_arg(a, o, v, "seconds > 0, at most 1e9");
    } else if (!strcmp(o, "--dtype")) {
      if (parse_dtype(v, &a->dt)) return bad_arg(a, o, v, "float, half, bfloat16 or int32");
    } else if (!strcmp(o, "--device")) {
      if (!strcmp(v, "cpu")) a->dev = VL_DEV_CPU;
      else if (!strcmp(v, "cuda")) a->dev = VL_DEV_CUDA;
      else return bad_arg(a, o, v, "cpu or cuda");
    } else if (!strcmp(o, "--json")) {
      a->json = v;
    } else {
      fprintf(stderr, "vramlab: bench %s: unknown option %s\n", a->coll, o);
      usage(stderr, a->coll);
      return 2;
    }
  }
  if (a->min_bytes > a->max_bytes) {
    fprintf(stderr, "vramlab: bench %s: --min-bytes %zu exceeds --max-bytes %zu\n", a->coll,
            a->min_bytes, a->max_bytes);
    return 2;
  }
  /* the output path before any work: a folder, a missing folder or an unwritable place
   * was found only after the whole benchmark */
  vl_err err;
  if (a->json && vl_file_check_writable(a->json, &err)) {
    fprintf(stderr, "vramlab: bench %s: --json: %s\n", a->coll, err.msg);
    return 2;
  }
  double sizes = floor(log((double)a->max_bytes / (double)a->min_bytes) / log(a->factor)) + 1;
  if (sizes > CB_MAX_ROWS) {
    fprintf(stderr, "vramlab: bench %s: --factor %g makes %.0f sizes from %zu to %zu bytes: at "
            "most %d (a larger factor or a narrower range)\n", a->coll, a->factor, sizes,
            a->min_bytes, a->max_bytes, CB_MAX_ROWS);
    return 2;
  }
  return 0;
}

/* ---- outside mpirun: run ourselves under it ------------------------------------------------ */

static int relaunch(int argc, char **argv, const cb_args *a) {
  char exe[PATH_MAX];
  vl_err err = {0};
  if (vl_self_exe(exe, sizeof exe)) {
    fprintf(stderr, "vramlab: bench %s: cannot find this executable (/proc/self/exe)\n", a->coll);
    return 2;
  }
  char **cmd = calloc((size_t)argc + 3, sizeof *cmd);
  if (!cmd) return 2;
  cmd[0] = exe;
  cmd[1] = "bench";
  for (int i = 0; i < argc; i++) cmd[i + 2] = argv[i];
  vl_mpirun_opts o = {a->ranks, a->oversubscribe, 1, a->timeout, NULL};
  int st = vl_mpirun(&o, cmd, &err);
  free(cmd);
  if (st == -1 || st == 124) fprintf(stderr, "vramlab: bench %s: %s\n", a->coll, err.msg);
  return st == -1 ? 2 : st;
}

/* ---- values ------------------------------------------------------------------------------ */

/* Rank r's value at global index i: a small integer, exact in every dtype, as are sums. */
static float val(int r, int64_t i) { return (float)(((i * 7 + r * 13 + 1) % 17) - 8); }

static void put(void *p, vl_dtype dt, int64_t i, float x) {
  if (dt == VL_I32) ((int32_t *)p)[i] = (int32_t)x;
  else vl_elem_set(p, dt, i, x);
}
static float get(const void *p, vl_dtype dt, int64_t i) {
  return dt == VL_I32 ? (float)((const int32_t *)p)[i] : vl_elem_get(p, dt, i);
}

/* ---- buffers: tensors of the context; host staging on a device ------------------------------- */

typedef struct {
  vl_comm *cm;      /* the measured communicator: MPI, or NCCL on --device cuda */
  vl_comm *boot;    /* MPI: scalars (times, #wrong) and NCCL's bootstrap */
  vl_ctx *c;
  vl_tensor a, b;   /* the two buffers, max bytes each */
  void *stage;      /* host copy of one buffer (device contexts) */
  int rank, size;
  size_t es;
} cb_env;

/* host view of n elements of t at element off: the tensor itself on CPU, else staging */
static void *host_of(cb_env *e, vl_tensor *t, int64_t off) {
  if (e->c->device == VL_DEV_CPU) return (char *)t->data + (size_t)off * e->es;
  return e->stage;
}
static void push(cb_env *e, vl_tensor *t, int64_t off, int64_t n) {
  if (e->c->device == VL_DEV_CPU) return;
  if (e->c->be->upload(e->c, t, (size_t)off * e->es, e->stage, (size_t)n * e->es))
    vl_comm_abort(e->cm, 3, e->c->err);
}
static void pull(cb_env *e, vl_tensor *t, int64_t off, int64_t n) {
  if (e->c->device == VL_DEV_CPU) return;
  if (e->c->be->download(e->c, e->stage, t, (size_t)off * e->es, (size_t)n * e->es))
    vl_comm_abort(e->cm, 3, e->c->err);
}
static char *dptr(cb_env *e, vl_tensor *t, int64_t off) {
  return (char *)t->data + (size_t)off * e->es;
}

/* One collective's buffers for a size: send, recv, pc elements per rank (in place: dist.h). */
typedef struct {
  void *send, *recv;
  vl_tensor *st, *rt;
  int64_t s_off, r_off, s_n, r_n, pc;
} cb_bufs;

static cb_bufs layout(cb_env *e, const char *coll, int64_t count, bool ip) {
  cb_bufs b = {0};
  int64_t n = e->size;
  b.st = &e->a;
  b.rt = ip ? &e->a : &e->b;
  if (!strcmp(coll, "allreduce")) {
    b.pc = count;
    b.s_n = b.r_n = count;
  } else if (!strcmp(coll, "reduce_scatter")) {
    b.pc = count / n;
    b.s_n = b.pc * n;
    b.r_n = b.pc;
    b.r_off = ip ? e->rank * b.pc : 0;
  } else {
    b.pc = count / n;
    b.s_n = b.pc;
    b.r_n = b.pc * n;
    b.st = ip ? &e->a : &e->b;
    b.rt = &e->a;
    b.s_off = ip ? e->rank * b.pc : 0;
  }
  b.send = dptr(e, b.st, b.s_off);
  b.recv = dptr(e, b.rt, b.r_off);
  return b;
}

static vl_status coll_once(cb_env *e, const char *coll, const cb_bufs *b, vl_dtype dt) {
  if (!strcmp(coll, "allreduce"))
    return vl_comm_allreduce(e->cm, e->c, b->send, b->recv, b->pc, dt, VL_RED_SUM, NULL);
  if (!strcmp(coll, "reduce_scatter"))
    return vl_comm_reduce_scatter(e->cm, e->c, b->send, b->recv, b->pc, dt, VL_RED_SUM, NULL);
  return vl_comm_allgather(e->cm, e->c, b->send, b->recv, b->pc, dt, NULL);
}

/* send filled with this rank's values at their global indices; recv (out of place) with 99 */
static void fill(cb_env *e, const char *coll, const cb_bufs *b, vl_dtype dt, bool ip) {
  bool ag = !strcmp(coll, "allgather");
  if (!ip) {
    float *dummy = host_of(e, b->rt, b->r_off);
    for (int64_t i = 0; i < b->r_n; i++) put(dummy, dt, i, 99);
    push(e, b->rt, b->r_off, b->r_n);
  }
  void *h = host_of(e, b->st, b->s_off);
  int64_t i0 = ag ? e->rank * b->pc : 0;
  for (int64_t i = 0; i < b->s_n; i++) put(h, dt, i, val(e->rank, i0 + i));
  push(e, b->st, b->s_off, b->s_n);
}

static long check(cb_env *e, const char *coll, const cb_bufs *b, vl_dtype dt) {
  pull(e, b->rt, b->r_off, b->r_n);
  const void *h = host_of(e, b->rt, b->r_off);
  bool ag = !strcmp(coll, "allgather");
  int64_t i0 = !strcmp(coll, "reduce_scatter") ? e->rank * b->pc : 0;
  long wrong = 0;
  for (int64_t i = 0; i < b->r_n; i++) {
    float want = 0;
    if (ag) want = val((int)(i / b->pc), i);
    else
      for (int r = 0; r < e->size; r++) want += val(r, i0 + i);
    wrong += get(h, dt, i) != want;
  }
  return wrong;
}

static float all_sum_f(cb_env *e, float x) {
  if (vl_comm_allreduce(e->boot, e->c, &x, &x, 1, VL_F32, VL_RED_SUM, NULL)) vl_comm_abort(e->boot, 3, e->c->err);
  return x;
}

static long all_sum_l(cb_env *e, long x) {
  int32_t v = x > INT32_MAX ? INT32_MAX : (int32_t)x;
  if (vl_comm_allreduce(e->boot, e->c, &v, &v, 1, VL_I32, VL_RED_SUM, NULL)) vl_comm_abort(e->boot, 3, e->c->err);
  return v;
}

static cb_meas measure(cb_env *e, const cb_args *a, int64_t count, size_t bytes, bool ip) {
  cb_bufs b = layout(e, a->coll, count, ip);
  fill(e, a->coll, &b, a->dt, ip);
  for (int i = 0; i < a->warmup; i++)
    if (coll_once(e, a->coll, &b, a->dt)) vl_comm_abort(e->cm, 3, e->c->err);
  if (vl_comm_barrier(e->cm, e->c, NULL)) vl_comm_abort(e->cm, 3, e->c->err);
  double t0 = vl_now();
  for (int i = 0; i < a->iters; i++)
    if (coll_once(e, a->coll, &b, a->dt)) vl_comm_abort(e->cm, 3, e->c->err);
  double t = (vl_now() - t0) / a->iters;
  cb_meas m;
  m.time_us = all_sum_f(e, (float)(t * 1e6)) / e->size;
  m.algbw = (double)bytes / (m.time_us * 1e-6) / 1e9;
  m.busbw = m.algbw * vl_comm_busbw_factor(a->coll, e->size);
  fill(e, a->coll, &b, a->dt, ip); /* known values again (in place runs overwrote them) */
  if (coll_once(e, a->coll, &b, a->dt)) vl_comm_abort(e->cm, 3, e->c->err);
  m.wrong = all_sum_l(e, check(e, a->coll, &b, a->dt));
  return m;
}

/* ---- output ------------------------------------------------------------------------------ */

static const char *type_name(vl_dtype dt) {
  switch (dt) {
    case VL_F32: return "float";
    case VL_F16: return "half";
    case VL_BF16: return "bfloat16";
    default: return "int32";
  }
}

static const char *redop(const char *coll) { return strcmp(coll, "allgather") ? "sum" : "none"; }

static void print_header(const cb_env *e, const cb_args *a) {
  printf("# vramlab bench %s: %d ranks (%s%s), minBytes %zu maxBytes %zu step: %g(factor) "
         "warmup iters: %d iters: %d validation: 1\n#\n",
         a->coll, e->size, vl_comm_kind_name(vl_comm_kind_of(e->cm)),
         a->ranks > vl_cores() ? ", oversubscribed" : "", a->min_bytes, a->max_bytes, a->factor,
         a->warmup, a->iters);
  printf("# Using devices\n#  %d ranks on %s, %d cores%s\n#\n", e->size,
         a->dev == VL_DEV_CPU ? "the host (cpu)" : "cuda", vl_cores(),
         a->dev == VL_DEV_CPU ? ", one thread each" : "");
  printf("#%51s%-32s%s\n", "", "          out-of-place", "            in-place");
  printf("#%11s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type",
         "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("#%11s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "",
         "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static void print_row(const cb_args *a, const cb_row *r) {
  printf(" %11zu %13lld %9s %7s %7d %8.2f %7.2f %7.2f %6ld %8.2f %7.2f %7.2f %6ld\n", r->bytes,
         (long long)r->count, type_name(a->dt), redop(a->coll), -1, r->oop.time_us, r->oop.algbw,
         r->oop.busbw, r->oop.wrong, r->ip.time_us, r->ip.algbw, r->ip.busbw, r->ip.wrong);
  fflush(stdout);
}

static cJSON *meas_json(const cb_meas *m) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "time_us", m->time_us);
  cJSON_AddNumberToObject(o, "algbw_gbs", m->algbw);
  cJSON_AddNumberToObject(o, "busbw_gbs", m->busbw);
  cJSON_AddNumberToObject(o, "wrong", (double)m->wrong);
  return o;
}

static int write_json(const cb_env *e, const cb_args *a, const cb_row *rows, int n, double avg,
                      long wrong) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "collective", a->coll);
  cJSON_AddNumberToObject(o, "ranks", e->size);
  cJSON_AddStringToObject(o, "backend", vl_comm_kind_name(vl_comm_kind_of(e->cm)));
  cJSON_AddStringToObject(o, "device", vl_device_name(a->dev));
  cJSON_AddStringToObject(o, "dtype", type_name(a->dt));
  cJSON_AddBoolToObject(o, "oversubscribed", e->size > vl_cores());
  cJSON_AddNumberToObject(o, "iters", a->iters);
  cJSON_AddNumberToObject(o, "warmup", a->warmup);
  cJSON *arr = cJSON_AddArrayToObject(o, "rows");
  for (int i = 0; i < n; i++) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "bytes", (double)rows[i].bytes);
    cJSON_AddNumberToObject(r, "count", (double)rows[i].count);
    cJSON_AddStringToObject(r, "type", type_name(a->dt));
    cJSON_AddStringToObject(r, "redop", redop(a->coll));
    cJSON_AddItemToObject(r, "oop", meas_json(&rows[i].oop));
    cJSON_AddItemToObject(r, "ip", meas_json(&rows[i].ip));
    cJSON_AddItemToArray(arr, r);
  }
  cJSON_AddNumberToObject(o, "avg_busbw_gbs", avg);
  cJSON_AddNumberToObject(o, "wrong", (double)wrong);
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  vl_err err = {""};
  int rc = text ? (vl_file_write_atomic(a->json, text, strlen(text), &err) == VL_OK ? 0 : -1) : -1;
  free(text);
  if (rc) fprintf(stderr, "vramlab: bench %s: --json: %s\n", a->coll, err.msg[0] ? err.msg : "out of memory");
  return rc;
}

/* ---- the run ------------------------------------------------------------------------------ */

static int open_env(cb_env *e, const cb_args *a) {
  vl_err err = {""};
  memset(e, 0, sizeof *e);
  vl_comm *mpi = NULL;
  if (vl_comm_create_mpi(&mpi, &err)) {
    fprintf(stderr, "vramlab: bench %s: %s\n", a->coll, err.msg);
    return 2;
  }
  if (vl_comm_timeout(mpi) > a->timeout) vl_comm_set_timeout(mpi, a->timeout);
  e->es = vl_dtype_bytes(a->dt, 1);
  size_t cap = 2 * a->max_bytes + (8u << 20);
  int dev;
  if (a->dev == VL_DEV_CUDA && vl_comm_select_device(&dev, &err)) vl_comm_abort(mpi, 3, err.msg);
  if (vl_ctx_create(&e->c, a->dev, cap)) {
    vl_err_set(&err, VL_ERR_OOM, "cannot make a %s context of %zu bytes", vl_device_name(a->dev), cap);
    vl_comm_abort(mpi, 3, err.msg);
  }
  e->cm = e->boot = mpi;
  if (a->dev == VL_DEV_CUDA) {
    if (vl_comm_create_nccl(mpi, e->c, &e->cm, &err)) vl_comm_abort(mpi, 3, err.msg);
    e->stage = malloc(a->max_bytes + 64);
    if (!e->stage) vl_comm_abort(mpi, 3, "out of host memory for the staging buffer");
  }
  e->rank = vl_comm_rank(mpi);
  e->size = vl_comm_size(mpi);
  int64_t n = (int64_t)(a->max_bytes / e->es) + 1;
  if (vl_tensor_alloc2(e->c, &e->a, a->dt, VL_MEM_COMM, 1, n) ||
      vl_tensor_alloc2(e->c, &e->b, a->dt, VL_MEM_COMM, 1, n))
    vl_comm_abort(mpi, 3, e->c->err);
  return 0;
}

static void close_env(cb_env *e) {
  vl_tensor_free(e->c, &e->b);
  vl_tensor_free(e->c, &e->a);
  if (e->cm != e->boot) vl_comm_destroy(e->cm);
  vl_ctx_destroy(e->c);
  free(e->stage);
  vl_comm_destroy(e->boot);
}

static int run_ranks(const cb_args *a) {
  if (vl_mpirun_watch_launcher()) return 1; /* a rank ends with the bench that started it */
  cb_env e;
  int rc = open_env(&e, a);
  if (rc) return rc;
  cb_row rows[CB_MAX_ROWS];
  int n = 0;
  double bw = 0, t_start = vl_now();
  long wrong = 0;
  if (e.rank == 0) print_header(&e, a);
  int64_t per = !strcmp(a->coll, "allreduce") ? 1 : e.size;
  double top = (double)a->max_bytes * (1 + 1e-9);
  for (double sz = (double)a->min_bytes; sz <= top && n < CB_MAX_ROWS; sz *= a->factor) {
    int64_t count = (int64_t)((size_t)sz / e.es) / per * per;
    if (count < per) continue; /* under one element per rank */
    if (n && rows[n - 1].count == count) continue;
    if (e.rank == 0 && vl_now() - t_start > 2)
      fprintf(stderr, "bench %s: %lld B ...\n", a->coll, (long long)((size_t)count * e.es));
    cb_row *r = &rows[n++];
    r->count = count;
    r->bytes = (size_t)count * e.es;
    r->oop = measure(&e, a, count, r->bytes, false);
    r->ip = measure(&e, a, count, r->bytes, true);
    wrong += r->oop.wrong + r->ip.wrong;
    bw += r->oop.busbw + r->ip.busbw;
    if (e.rank == 0) print_row(a, r);
  }
  double avg = n ? bw / (2 * n) : 0;
  if (e.rank == 0) {
    printf("# Out of bounds values : %ld %s\n", wrong, wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", avg);
    fflush(stdout);
    if (a->json && write_json(&e, a, rows, n, avg, wrong)) rc = 2;
  }
  close_env(&e);
  return wrong ? 1 : rc;
}

int vl_collbench_main(int argc, char **argv) {
  cb_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc == 1 ? 0 : rc;
  if (!vl_comm_have_mpi()) { /* said once here, not by every rank of a job */
    fprintf(stderr, "vramlab: bench %s: built without MPI: apt-get install libopenmpi-dev openmpi-bin, then rebuild\n",
            argv[0]);
    return 2;
  }
  if (!vl_comm_under_mpirun()) return relaunch(argc, argv, &a);
  return run_ranks(&a);
}
