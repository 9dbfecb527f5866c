/* The communicator's front (vramlab/dist.h): argument checks shared by every
 * implementation, in-place detection by NCCL's convention, blocking = start + wait, the
 * waiting loop with its timeout, the outstanding-request list; the `self` communicator
 * (one rank, every collective a copy); the pure helpers (busbw factor, device choice). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"
#include "../kernels/kcommon.h"

#define VL_COMM_DEFAULT_TIMEOUT 120.0

const char *vl_comm_kind_name(vl_comm_kind k) {
  switch (k) {
    case VL_COMM_SELF: return "self";
    case VL_COMM_MPI: return "mpi";
    case VL_COMM_NCCL: return "nccl";
  }
  return "?";
}

const char *vl_coll_name(vl_coll k) {
  static const char *names[VL_COLL_COUNT] = {"barrier", "broadcast", "allreduce",
                                             "reduce_scatter", "allgather", "reduce",
                                             "scatter", "gather"};
  return (unsigned)k < VL_COLL_COUNT ? names[k] : "?";
}

bool vl_comm_under_mpirun(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* ---- construction ----------------------------------------------------------------------- */

static vl_status parse_timeout(double *out, vl_err *err) {
  *out = VL_COMM_DEFAULT_TIMEOUT;
  const char *s = getenv("VRAMLAB_COMM_TIMEOUT");
  if (!s || !*s) return VL_OK;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || !(v > 0) || v > 1e9)
    return vl_err_set(err, VL_ERR_INVALID, "VRAMLAB_COMM_TIMEOUT=%s: not a positive number of seconds", s);
  *out = v;
  return VL_OK;
}

vl_status vl_comm_new(vl_comm **out, vl_comm_kind k, const vl_comm_ops *ops, int rank,
                      int size, vl_err *err) {
  *out = NULL;
  double t;
  VL_TRY(parse_timeout(&t, err));
  vl_comm *cm = calloc(1, sizeof *cm);
  if (!cm) return vl_err_set(err, VL_ERR_OOM, "out of host memory for a communicator");
  cm->kind = k;
  cm->ops = ops;
  cm->rank = rank;
  cm->size = size;
  cm->timeout = t;
  *out = cm;
  return VL_OK;
}

void vl_comm_link(vl_comm *cm, vl_comm_req *r) {
  r->cm = cm;
  r->prev = NULL;
  r->next = cm->head;
  if (cm->head) cm->head->prev = r;
  cm->head = r;
}

void vl_comm_unlink(vl_comm *cm, vl_comm_req *r) {
  if (r->prev) r->prev->next = r->next;
  else cm->head = r->next;
  if (r->next) r->next->prev = r->prev;
  r->next = r->prev = NULL;
}

void vl_comm_destroy(vl_comm *cm) {
  if (!cm) return;
  if (cm->ops->destroy) cm->ops->destroy(cm); /* frees what it can of cm->head first */
  while (cm->head) {
    vl_comm_req *r = cm->head;
    vl_comm_unlink(cm, r);
    if (r->done || !r->abandoned) cm->ops->free_req(cm, r); /* MPI may still write one */
  }
  free(cm);
}

vl_comm_kind vl_comm_kind_of(const vl_comm *cm) { return cm->kind; }
int vl_comm_rank(const vl_comm *cm) { return cm->rank; }
int vl_comm_size(const vl_comm *cm) { return cm->size; }
double vl_comm_timeout(const vl_comm *cm) { return cm->timeout; }
void vl_comm_set_timeout(vl_comm *cm, double seconds) {
  if (seconds > 0) cm->timeout = seconds;
}

/* ---- argument checks ---------------------------------------------------------------------- */

static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
  const char *pa = a, *pb = b;
  return na && nb && pa < pb + nb && pb < pa + na;
}

static vl_status bad(vl_comm *cm, vl_ctx *c, vl_coll k, const char *what) {
  return vl_fail(c, VL_ERR_INVALID, "rank %d of %d: %s: %s", cm->rank, cm->size,
                 vl_coll_name(k), what);
}

static vl_status check_type(vl_comm *cm, vl_ctx *c, const vl_coll_args *a, bool reduce) {
  char m[160];
  if (a->count < 0) {
    snprintf(m, sizeof m, "count %lld is negative", (long long)a->count);
    return bad(cm, c, a->kind, m);
  }
  if ((unsigned)a->dt >= VL_DTYPE_COUNT) return bad(cm, c, a->kind, "unknown dtype");
  if (a->kind != VL_COLL_BCAST && a->kind != VL_COLL_BARRIER &&
      !(vl_dtype_is_float(a->dt) || a->dt == VL_I32)) {
    snprintf(m, sizeof m, "dtype %s: only fp32, fp16, bf16 and i32 (broadcast moves any)",
             vl_dtype_name(a->dt));
    return bad(cm, c, a->kind, m);
  }
  if (reduce) {
    if (a->op != VL_RED_SUM && a->op != VL_RED_AVG) return bad(cm, c, a->kind, "unknown reduction");
    if (a->op == VL_RED_AVG && a->dt == VL_I32)
      return bad(cm, c, a->kind, "average of i32 values: only sum (average needs a float dtype)");
  }
  return VL_OK;
}

static vl_status check_root(vl_comm *cm, vl_ctx *c, const vl_coll_args *a) {
  if (a->root >= 0 && a->root < cm->size) return VL_OK;
  char m[96];
  snprintf(m, sizeof m, "root %d is not a rank of %d", a->root, cm->size);
  return bad(cm, c, a->kind, m);
}

/* The byte extents of the two buffers this rank touches; sets in_place by dist.h's rules
 * and rejects any other overlap and missing buffers. */
static vl_status check_bufs(vl_comm *cm, vl_ctx *c, vl_coll_args *a) {
  size_t es = a->kind == VL_COLL_BCAST ? 0 : vl_dtype_bytes(a->dt, 1);
  size_t n = (size_t)a->count * es, big = n * (size_t)cm->size;
  const char *s = a->send;
  char *r = a->recv;
  bool root = a->root == cm->rank;
  size_t ns = 0, nr = 0; /* bytes read from send, written to recv */
  switch (a->kind) {
    case VL_COLL_ALLREDUCE: ns = nr = n; a->in_place = s == r; break;
    case VL_COLL_REDUCE_SCATTER: ns = big; nr = n; a->in_place = r == s + cm->rank * n; break;
    case VL_COLL_ALLGATHER: ns = n; nr = big; a->in_place = s == r + cm->rank * n; break;
    case VL_COLL_REDUCE: ns = n; nr = root ? n : 0; a->in_place = root && s == r; break;
    case VL_COLL_SCATTER: ns = root ? big : 0; nr = n; a->in_place = root && r == s + a->root * n; break;
    case VL_COLL_GATHER: ns = n; nr = root ? big : 0; a->in_place = root && s == r + a->root * n; break;
    default: return VL_OK;
  }
  if (a->count == 0) return VL_OK;
  if (ns && !s) return bad(cm, c, a->kind, "send buffer is NULL");
  if (nr && !r) return bad(cm, c, a->kind, "recv buffer is NULL");
  if (!a->in_place && overlap(s, ns, r, nr))
    return bad(cm, c, a->kind, "send and recv overlap other than in place (dist.h's convention)");
  return VL_OK;
}

static vl_status check(vl_comm *cm, vl_ctx *c, vl_coll_args *a, vl_comm_req **req) {
  if (req) *req = NULL;
  if (!cm) return vl_fail(c, VL_ERR_INVALID, "%s: communicator is NULL", vl_coll_name(a->kind));
  bool reduce = a->kind == VL_COLL_ALLREDUCE || a->kind == VL_COLL_REDUCE_SCATTER ||
                a->kind == VL_COLL_REDUCE;
  bool rooted = a->kind == VL_COLL_BCAST || a->kind == VL_COLL_REDUCE ||
                a->kind == VL_COLL_SCATTER || a->kind == VL_COLL_GATHER;
  VL_TRY(check_type(cm, c, a, reduce));
  if (rooted) VL_TRY(check_root(cm, c, a));
  if (a->kind == VL_COLL_BCAST && a->count > 0 && !a->recv) return bad(cm, c, a->kind, "buffer is NULL");
  return check_bufs(cm, c, a);
}

/* ---- dispatch: blocking = start + wait ----------------------------------------------------- */

static vl_status run(vl_comm *cm, vl_ctx *c, vl_coll_args a, vl_comm_req **req) {
  VL_TRY(check(cm, c, &a, req));
  vl_comm_req *r = NULL;
  VL_TRY(cm->ops->start(cm, c, &a, &r));
  if (req) {
    *req = r;
    return VL_OK;
  }
  return vl_comm_wait(cm, c, r);
}

vl_status vl_comm_barrier(vl_comm *cm, vl_ctx *c, vl_comm_req **req) {
  vl_coll_args a = {VL_COLL_BARRIER, NULL, NULL, 0, VL_I32, VL_RED_SUM, 0, false};
  return run(cm, c, a, req);
}

vl_status vl_comm_bcast(vl_comm *cm, vl_ctx *c, void *buf, int64_t count, vl_dtype dt, int root,
                        vl_comm_req **req) {
  vl_coll_args a = {VL_COLL_BCAST, buf, buf, count, dt, VL_RED_SUM, root, true};
  return run(cm, c, a, req);
}

vl_status vl_comm_allreduce(vl_comm *cm, vl_ctx *c, const void *send, void *recv, int64_t count,
                            vl_dtype dt, vl_red_op op, vl_comm_req **req) {
  vl_coll_args a = {VL_COLL_ALLREDUCE, send, recv, count, dt, op, 0, false};
  return run(cm, c, a, req);
}

vl_status vl_comm_reduce_scatter(vl_comm *cm, vl_ctx *c, const void *send, void *recv,
                                 int64_t recv_count, vl_dtype dt, vl_red_op op, vl_comm_req **req) {
  vl_coll_args a = {VL_COLL_REDUCE_SCATTER, send, recv, recv_count, dt, op, 0, false};
  return run(cm, c, a, req);
}

vl_status vl_comm_allgather(vl_comm *cm, vl_ctx *c, const void *send, void *recv,
                            int64_t send_count, vl_dtype dt, vl_comm_req **req) {
  vl_coll_args a = {VL_COLL_ALLGATHER, send, recv, send_count, dt, VL_RED_SUM, 0, false};
  return run(cm, c, a, req);
}

vl_status vl_comm_reduce(vl_comm *cm, vl_ctx *c, const void *send, void *recv, int64_t count,
                         vl_dtype dt, vl_red_op op, int root, vl_comm_req **req) {
  vl_coll_args a = {VL_COLL_REDUCE, send, recv, count, dt, op, root, false};
  return run(cm, c, a, req);
}

vl_status vl_comm_scatter(vl_comm *cm, vl_ctx *c, const void *send, void *recv, int64_t count,
                          vl_dtype dt, int root, vl_comm_req **req) {
  vl_coll_args a = {VL_COLL_SCATTER, send, recv, count, dt, VL_RED_SUM, root, false};
  return run(cm, c, a, req);
}

vl_status vl_comm_gather(vl_comm *cm, vl_ctx *c, const void *send, void *recv, int64_t count,
                         vl_dtype dt, int root, vl_comm_req **req) {
  vl_coll_args a = {VL_COLL_GATHER, send, recv, count, dt, VL_RED_SUM, root, false};
  return run(cm, c, a, req);
}

/* ---- completion ---------------------------------------------------------------------------- */

void vl_comm_backoff(long polls, double waited) {
  if (waited < 0.05 || (polls & 255)) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 50 * 1000};
  nanosleep(&ts, NULL);
}

vl_status vl_comm_fail_timeout(vl_comm *cm, vl_ctx *c, const vl_comm_req *r) {
  return vl_fail(c, VL_ERR_COMM,
                 "rank %d of %d: %s of %lld %s timed out after %g s: a peer rank died or stopped",
                 cm->rank, cm->size, vl_coll_name(r->a.kind), (long long)r->a.count,
                 vl_dtype_name(r->a.dt), cm->timeout);
}

/* Poll once; a failure is kept in the request (polled without a context by
 * vl_comm_progress) and reported to whoever waits on or tests it. */
static vl_status poll_req(vl_comm *cm, vl_ctx *c, vl_comm_req *r) {
  if (!r->done) {
    static vl_ctx scratch; /* for vl_fail's message when polled without a context */
    vl_ctx *cc = c ? c : &scratch;
    vl_status s = cm->ops->poll(cm, cc, r);
    if (s != VL_OK) {
      r->done = true;
      r->status = s;
      snprintf(r->msg, sizeof r->msg, "%s", cc->err);
    }
  }
  if (r->done && r->status != VL_OK) return vl_fail(c, r->status, "%s", r->msg);
  return VL_OK;
}

static vl_status poll_until(vl_comm *cm, vl_ctx *c, vl_comm_req *r) {
  double t0 = vl_now();
  for (long polls = 0;; polls++) {
    VL_TRY(poll_req(cm, c, r));
    if (r->done) return VL_OK;
    double waited = vl_now() - t0;
    if (waited > cm->timeout) return vl_comm_fail_timeout(cm, c, r);
    vl_comm_backoff(polls, waited);
  }
}

vl_status vl_comm_wait(vl_comm *cm, vl_ctx *c, vl_comm_req *req) {
  if (!req) return VL_OK;
  if (!cm) cm = req->cm;
  vl_status s = cm->ops->finish ? cm->ops->finish(cm, c, req) : poll_until(cm, c, req);
  if (s == VL_ERR_COMM && !req->done) {
    req->abandoned = true; /* the library may still complete it: vl_comm_progress reaps it */
    return s;
  }
  vl_comm_unlink(cm, req);
  cm->ops->free_req(cm, req);
  return s;
}

vl_status vl_comm_test(vl_comm *cm, vl_ctx *c, vl_comm_req *req, bool *done) {
  *done = true;
  if (!req) return VL_OK;
  if (!cm) cm = req->cm;
  vl_status s = poll_req(cm, c, req);
  *done = req->done;
  return s;
}

void vl_comm_progress(vl_comm *cm) {
  if (!cm) return;
  vl_comm_req *next;
  for (vl_comm_req *r = cm->head; r; r = next) {
    next = r->next;
    if (r->done) continue;
    if (poll_req(cm, NULL, r) != VL_OK) continue; /* its wait reports the error */
    if (r->done && r->abandoned) { /* a timed-out one the library finished after all */
      vl_comm_unlink(cm, r);
      cm->ops->free_req(cm, r);
    }
  }
}

/* ---- elementwise helpers ---------------------------------------------------------------------- */

void vl_comm_scale(void *buf, int64_t n, vl_dtype dt, double f) {
  if (dt == VL_I32) return;
  float ff = (float)f;
  for (int64_t i = 0; i < n; i++) vl_st(buf, (int)dt, i, vl_ld(buf, (int)dt, i) * ff);
}

void vl_comm_add(const void *in, void *inout, int64_t n, vl_dtype dt) {
  if (dt == VL_I32) {
    const int32_t *a = in;
    int32_t *b = inout;
    for (int64_t i = 0; i < n; i++) b[i] = (int32_t)((uint32_t)b[i] + (uint32_t)a[i]);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    vl_st(inout, (int)dt, i, vl_ld(in, (int)dt, i) + vl_ld(inout, (int)dt, i));
}

/* ---- self: one rank --------------------------------------------------------------------------- */

static vl_status self_start(vl_comm *cm, vl_ctx *c, const vl_coll_args *a, vl_comm_req **out) {
  vl_comm_req *r = calloc(1, sizeof *r);
  if (!r) return vl_fail(c, VL_ERR_OOM, "rank 0 of 1: out of host memory for a request");
  r->a = *a;
  size_t n = a->kind == VL_COLL_BCAST ? 0 : vl_dtype_bytes(a->dt, a->count);
  if (n && !a->in_place && a->kind != VL_COLL_BARRIER) memcpy(a->recv, a->send, n);
  r->done = true;
  vl_comm_link(cm, r);
  *out = r;
  return VL_OK;
}

static vl_status self_poll(vl_comm *cm, vl_ctx *c, vl_comm_req *r) { return VL_OK; }
static void self_free(vl_comm *cm, vl_comm_req *r) { free(r); }
static void self_abort(vl_comm *cm, int code) {}

static const vl_comm_ops self_ops = {self_start, self_poll, NULL, self_free, NULL, self_abort};

vl_status vl_comm_create_self(vl_comm **out, vl_err *err) {
  return vl_comm_new(out, VL_COMM_SELF, &self_ops, 0, 1, err);
}

_Noreturn void vl_comm_abort(vl_comm *cm, int code, const char *why) {
  int rank = cm ? cm->rank : 0, size = cm ? cm->size : 1;
  fprintf(stderr, "vramlab: rank %d of %d: %s\n", rank, size, why ? why : "aborted");
  fflush(stderr);
  fflush(stdout);
  if (cm && cm->ops->abort) cm->ops->abort(cm, code ? code : 1); /* MPI_Abort: no return */
  exit(code ? code : 1);
}

/* ---- pure helpers ------------------------------------------------------------------------------ */

double vl_comm_busbw_factor(const char *collective, int n) {
  if (!collective || n < 1) return 0;
  if (!strcmp(collective, "allreduce")) return 2.0 * (n - 1) / n;
  if (!strcmp(collective, "reduce_scatter") || !strcmp(collective, "allgather") ||
      !strcmp(collective, "scatter") || !strcmp(collective, "gather") ||
      !strcmp(collective, "alltoall"))
    return (double)(n - 1) / n;
  if (!strcmp(collective, "broadcast") || !strcmp(collective, "bcast") ||
      !strcmp(collective, "reduce") || !strcmp(collective, "sendrecv"))
    return 1;
  return 0;
}

int vl_comm_device_of(int local_rank, int n_devices) {
  if (local_rank < 0 || n_devices <= 0) return -1;
  return local_rank % n_devices;
}
