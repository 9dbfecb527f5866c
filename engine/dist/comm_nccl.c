/* The NCCL communicator (vramlab/dist.h) on device buffers. Built when CMake finds NCCL
 * (VRAMLAB_HAVE_NCCL, with the CUDA backend); elsewhere vl_comm_create_nccl says why not.
 *
 * Bootstrap: rank 0's ncclUniqueId broadcast over the MPI boot communicator (with its
 * timeout), then a non-blocking ncclCommInitRankConfig polled with the same timeout. One
 * device per rank (local rank modulo the visible devices, vl_comm_select_device before the
 * context is made). Each collective follows nccl_plan.h's stream/event plan on a stream of
 * its own: READY recorded on the context's compute stream, the comm stream waits on it,
 * the NCCL call, DONE recorded; a wait makes the compute stream wait on DONE and polls DONE
 * from the host (cudaEventQuery, backoff) so a dead peer gives VL_ERR_COMM after the
 * timeout instead of a hang (the NCCL communicator is aborted then). Scatter and gather are
 * grouped ncclSend/ncclRecv; the barrier a one-int allreduce on a scratch word. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"
#include "nccl_plan.h"

#if !defined(VRAMLAB_HAVE_NCCL) || !defined(VRAMLAB_HAVE_CUDA)

vl_status vl_comm_create_nccl(vl_comm *boot, vl_ctx *c, vl_comm **out, vl_err *err) {
  *out = NULL;
#ifndef VRAMLAB_HAVE_CUDA
  return vl_err_set(err, VL_ERR_UNSUPPORTED, "NCCL needs the CUDA backend: this binary was built without nvcc");
#else
  return vl_err_set(err, VL_ERR_UNSUPPORTED,
                    "built without NCCL (libnccl-dev not found by CMake): install it, then rebuild");
#endif
}

vl_status vl_comm_select_device(int *dev, vl_err *err) {
  *dev = -1;
  return vl_err_set(err, VL_ERR_UNSUPPORTED, "no CUDA backend in this binary: no device to select");
}

#else

#include <cuda_runtime.h>
#include <nccl.h>

#include "../backend/cuda/cuda_internal.h"

_Static_assert((int)VL_NCCL_FLOAT32 == (int)ncclFloat32 && (int)VL_NCCL_FLOAT16 == (int)ncclFloat16 &&
                   (int)VL_NCCL_BFLOAT16 == (int)ncclBfloat16 && (int)VL_NCCL_INT32 == (int)ncclInt32 &&
                   (int)VL_NCCL_UINT8 == (int)ncclUint8,
               "nccl_plan.h's dtype codes are nccl.h's");
_Static_assert((int)VL_NCCL_SUM == (int)ncclSum && (int)VL_NCCL_AVG == (int)ncclAvg,
               "nccl_plan.h's op codes are nccl.h's");

typedef struct {
  vl_comm_req head;
  cudaEvent_t ev[2]; /* READY, DONE (nccl_plan.h, slot 0) */
  cudaStream_t compute;
} nccl_req;

typedef struct {
  ncclComm_t nc;
  cudaStream_t stream; /* the comm stream */
  vl_comm *boot;
  int device;
  int *scratch; /* one device int for the barrier */
  bool aborted;
} nccl_state;

static nccl_state *ns(vl_comm *cm) { return cm->impl; }

/* The compute stream of a CUDA context (the backend's state; NULL is the default stream). */
static cudaStream_t compute_stream(vl_ctx *c) {
  return c && c->device == VL_DEV_CUDA && c->be_state ? st(c)->stream : NULL;
}

static vl_status nccl_fail(vl_comm *cm, vl_ctx *c, const char *what, ncclResult_t e) {
  return vl_fail(c, VL_ERR_COMM, "rank %d of %d: %s: %s", cm->rank, cm->size, what,
                 ncclGetErrorString(e));
}
static vl_status cuda_fail(vl_comm *cm, vl_ctx *c, const char *what, cudaError_t e) {
  return vl_fail(c, VL_ERR_BACKEND, "rank %d of %d: %s: %s", cm->rank, cm->size, what,
                 cudaGetErrorString(e));
}

/* A call on a non-blocking NCCL communicator may return ncclInProgress: poll its state
 * until it settles, within the timeout. */
static ncclResult_t settle(vl_comm *cm, ncclResult_t r) {
  double t0 = vl_now();
  for (long polls = 0; r == ncclInProgress; polls++) {
    double waited = vl_now() - t0;
    if (waited > cm->timeout) return ncclInProgress;
    vl_comm_backoff(polls, waited);
    if (ncclCommGetAsyncError(ns(cm)->nc, &r) != ncclSuccess) return ncclSystemError;
  }
  return r;
}

/* ---- the NCCL calls ---------------------------------------------------------------------- */

static ncclResult_t rooted_p2p(vl_comm *cm, const vl_coll_args *a, ncclDataType_t t, cudaStream_t s) {
  nccl_state *n = ns(cm);
  size_t es = vl_dtype_bytes(a->dt, 1), chunk = (size_t)a->count * es;
  bool root = a->root == cm->rank, gather = a->kind == VL_COLL_GATHER;
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  if (!root) {
    r = gather ? ncclSend(a->send, a->count, t, a->root, n->nc, s)
               : ncclRecv(a->recv, a->count, t, a->root, n->nc, s);
  } else {
    for (int q = 0; q < cm->size && r == ncclSuccess; q++) {
      if (q == cm->rank) continue;
      r = gather ? ncclRecv((char *)a->recv + q * chunk, a->count, t, q, n->nc, s)
                 : ncclSend((const char *)a->send + q * chunk, a->count, t, q, n->nc, s);
    }
  }
  ncclResult_t g = ncclGroupEnd();
  if (r == ncclSuccess) r = g;
  if (r == ncclSuccess && root && !a->in_place && chunk) { /* root's own chunk */
    const void *from = gather ? a->send : (const char *)a->send + cm->rank * chunk;
    void *to = gather ? (char *)a->recv + cm->rank * chunk : a->recv;
    if (cudaMemcpyAsync(to, from, chunk, cudaMemcpyDeviceToDevice, s) != cudaSuccess) r = ncclUnhandledCudaError;
  }
  return r;
}

static ncclResult_t launch(vl_comm *cm, const vl_coll_args *a) {
  nccl_state *n = ns(cm);
  cudaStream_t s = n->stream;
  ncclDataType_t t = (ncclDataType_t)vl_nccl_dtype(a->dt);
  ncclRedOp_t op = (ncclRedOp_t)vl_nccl_redop(a->op);
  size_t cnt = (size_t)a->count;
  switch (a->kind) {
    case VL_COLL_BARRIER:
      return ncclAllReduce(n->scratch, n->scratch, 1, ncclInt32, ncclSum, n->nc, s);
    case VL_COLL_BCAST:
      return ncclBroadcast(a->recv, a->recv, vl_dtype_bytes(a->dt, a->count), ncclUint8, a->root,
                           n->nc, s);
    case VL_COLL_ALLREDUCE: return ncclAllReduce(a->send, a->recv, cnt, t, op, n->nc, s);
    case VL_COLL_REDUCE_SCATTER: return ncclReduceScatter(a->send, a->recv, cnt, t, op, n->nc, s);
    case VL_COLL_ALLGATHER: return ncclAllGather(a->send, a->recv, cnt, t, n->nc, s);
    case VL_COLL_REDUCE: return ncclReduce(a->send, a->recv, cnt, t, op, a->root, n->nc, s);
    case VL_COLL_SCATTER:
    case VL_COLL_GATHER: return rooted_p2p(cm, a, t, s);
    default: return ncclInvalidArgument;
  }
}

/* ---- the plan, executed ----------------------------------------------------------------- */

static vl_status run_acts(vl_comm *cm, vl_ctx *c, nccl_req *r, const vl_nccl_act *acts, int n) {
  for (int i = 0; i < n; i++) {
    cudaStream_t s = acts[i].stream == VL_NS_COMM ? ns(cm)->stream : r->compute;
    cudaError_t e = cudaSuccess;
    if (acts[i].kind == VL_NA_RECORD) e = cudaEventRecord(r->ev[acts[i].event & 1], s);
    else if (acts[i].kind == VL_NA_WAIT) e = cudaStreamWaitEvent(s, r->ev[acts[i].event & 1], 0);
    else {
      ncclResult_t x = settle(cm, launch(cm, &r->head.a));
      if (x != ncclSuccess) {
        char what[96];
        snprintf(what, sizeof what, "%s of %lld %s", vl_coll_name(r->head.a.kind),
                 (long long)r->head.a.count, vl_dtype_name(r->head.a.dt));
        return nccl_fail(cm, c, what, x);
      }
    }
    if (e != cudaSuccess) return cuda_fail(cm, c, "stream/event plan", e);
  }
  return VL_OK;
}

static void free_req(vl_comm *cm, vl_comm_req *h) {
  nccl_req *r = (nccl_req *)h;
  for (int i = 0; i < 2; i++)
    if (r->ev[i]) cudaEventDestroy(r->ev[i]);
  free(r);
}

static vl_status nccl_start(vl_comm *cm, vl_ctx *c, const vl_coll_args *a, vl_comm_req **out) {
  if (a->kind != VL_COLL_BCAST && a->kind != VL_COLL_BARRIER && vl_nccl_dtype(a->dt) < 0)
    return vl_fail(c, VL_ERR_UNSUPPORTED, "rank %d of %d: %s: NCCL cannot move %s", cm->rank,
                   cm->size, vl_coll_name(a->kind), vl_dtype_name(a->dt));
  nccl_req *r = calloc(1, sizeof *r);
  if (!r) return vl_fail(c, VL_ERR_OOM, "rank %d of %d: out of host memory", cm->rank, cm->size);
  r->head.a = *a;
  r->compute = compute_stream(c);
  for (int i = 0; i < 2; i++) {
    cudaError_t e = cudaEventCreateWithFlags(&r->ev[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
      free_req(cm, &r->head);
      return cuda_fail(cm, c, "cudaEventCreate", e);
    }
  }
  vl_nccl_act acts[VL_NCCL_START_ACTS];
  int n = vl_nccl_plan_start(0, acts);
  vl_status s = run_acts(cm, c, r, acts, n);
  if (s != VL_OK) {
    free_req(cm, &r->head);
    return s;
  }
  vl_comm_link(cm, &r->head);
  *out = &r->head;
  return VL_OK;
}

static vl_status nccl_poll(vl_comm *cm, vl_ctx *c, vl_comm_req *h) {
  nccl_req *r = (nccl_req *)h;
  if (h->done) return VL_OK;
  cudaError_t e = cudaEventQuery(r->ev[1]);
  if (e == cudaSuccess) {
    h->done = true;
    return VL_OK;
  }
  if (e != cudaErrorNotReady) {
    h->done = true;
    return cuda_fail(cm, c, "cudaEventQuery", e);
  }
  ncclResult_t x = ncclSuccess;
  if (ncclCommGetAsyncError(ns(cm)->nc, &x) == ncclSuccess && x != ncclSuccess && x != ncclInProgress) {
    h->done = true;
    return nccl_fail(cm, c, vl_coll_name(h->a.kind), x);
  }
  return VL_OK;
}

/* The compute stream waits on DONE; the host polls DONE for the timeout. */
static vl_status nccl_finish(vl_comm *cm, vl_ctx *c, vl_comm_req *h) {
  nccl_req *r = (nccl_req *)h;
  if (h->status != VL_OK) return vl_fail(c, h->status, "%s", h->msg); /* seen by progress */
  vl_nccl_act acts[VL_NCCL_WAIT_ACTS];
  int n = vl_nccl_plan_wait(0, acts);
  VL_TRY(run_acts(cm, c, r, acts, n));
  double t0 = vl_now();
  for (long polls = 0; !h->done; polls++) {
    VL_TRY(nccl_poll(cm, c, h));
    if (h->done) break;
    double waited = vl_now() - t0;
    if (waited > cm->timeout) {
      if (!ns(cm)->aborted) ncclCommAbort(ns(cm)->nc); /* frees the stuck kernels */
      ns(cm)->aborted = true;
      return vl_comm_fail_timeout(cm, c, h);
    }
    vl_comm_backoff(polls, waited);
  }
  return VL_OK;
}

static void nccl_destroy(vl_comm *cm) {
  nccl_state *n = ns(cm);
  if (!n) return;
  bool stuck = n->aborted;
  for (vl_comm_req *h = cm->head; h; h = h->next) {
    if (!h->done) nccl_poll(cm, NULL, h);
    if (!h->done) stuck = true;
  }
  if (stuck && !n->aborted) ncclCommAbort(n->nc);
  else if (!stuck) ncclCommDestroy(n->nc);
  if (!stuck) {
    cudaStreamDestroy(n->stream);
    cudaFree(n->scratch);
  }
  free(n);
  cm->impl = NULL;
}

static void nccl_abort(vl_comm *cm, int code) {
  nccl_state *n = ns(cm);
  if (n && !n->aborted) ncclCommAbort(n->nc);
  if (n) n->aborted = true;
  if (n && n->boot && n->boot->ops->abort) n->boot->ops->abort(n->boot, code);
}

static const vl_comm_ops nccl_ops = {nccl_start, nccl_poll, nccl_finish, free_req, nccl_destroy, nccl_abort};

/* ---- creation ---------------------------------------------------------------------------- */

static int local_rank(int rank) {
  return vl_nccl_local_rank(getenv("OMPI_COMM_WORLD_LOCAL_RANK"), getenv("MPI_LOCALRANKID"),
                            getenv("SLURM_LOCALID"), rank);
}

vl_status vl_comm_select_device(int *dev, vl_err *err) {
  int ndev = 0;
  *dev = -1;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev < 1)
    return vl_err_set(err, VL_ERR_BACKEND, "no CUDA device visible%s%s", e != cudaSuccess ? ": " : "",
                      e != cudaSuccess ? cudaGetErrorString(e) : "");
  int d = vl_comm_device_of(local_rank(0), ndev);
  e = cudaSetDevice(d);
  if (e != cudaSuccess) return vl_err_set(err, VL_ERR_BACKEND, "cudaSetDevice(%d): %s", d, cudaGetErrorString(e));
  *dev = d;
  return VL_OK;
}

/* The context's device is this rank's (vl_comm_select_device ran before vl_ctx_create). */
static vl_status check_device(vl_comm *boot, int *dev, vl_err *err) {
  int ndev = 0, cur = -1;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1 || cudaGetDevice(&cur) != cudaSuccess)
    return vl_err_set(err, VL_ERR_BACKEND, "rank %d of %d: no CUDA device visible", boot->rank, boot->size);
  int lr = local_rank(boot->rank);
  *dev = vl_comm_device_of(lr, ndev);
  if (cur != *dev)
    return vl_err_set(err, VL_ERR_INVALID,
                      "rank %d of %d: the context is on device %d but local rank %d uses "
                      "device %d of %d: call vl_comm_select_device() before vl_ctx_create",
                      boot->rank, boot->size, cur, lr, *dev, ndev);
  return VL_OK;
}

/* rank 0's unique id over the boot communicator, then the non-blocking init, polled. */
static vl_status init_comm(vl_comm *cm, vl_comm *boot, vl_ctx *c, vl_err *err) {
  nccl_state *n = ns(cm);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclResult_t x = boot->rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
  if (x != ncclSuccess) return vl_err_set(err, VL_ERR_COMM, "rank 0: ncclGetUniqueId: %s", ncclGetErrorString(x));
  _Static_assert(sizeof(ncclUniqueId) % 4 == 0, "the id moves as 32-bit words");
  if (vl_comm_bcast(boot, c, &id, (int64_t)(sizeof id / 4), VL_I32, 0, NULL) != VL_OK)
    return vl_err_set(err, VL_ERR_COMM, "%s", c->err);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  x = ncclCommInitRankConfig(&n->nc, boot->size, id, boot->rank, &cfg);
  if (x == ncclInProgress) x = settle(cm, x);
  if (x != ncclSuccess) {
    vl_err_set(err, VL_ERR_COMM, "rank %d of %d: ncclCommInitRank: %s%s", boot->rank, boot->size,
               x == ncclInProgress ? "timed out: a peer rank died or stopped" : ncclGetErrorString(x), "");
    if (n->nc) ncclCommAbort(n->nc);
    n->nc = NULL;
    return VL_ERR_COMM;
  }
  return VL_OK;
}

vl_status vl_comm_create_nccl(vl_comm *boot, vl_ctx *c, vl_comm **out, vl_err *err) {
  *out = NULL;
  if (!boot || !c || c->device != VL_DEV_CUDA)
    return vl_err_set(err, VL_ERR_UNSUPPORTED,
                      "NCCL needs an MPI boot communicator and a CUDA context (device buffers)%s",
                      c && c->device != VL_DEV_CUDA ? ": this context is not on cuda" : "");
  int dev = -1;
  vl_status s = check_device(boot, &dev, err);
  if (s != VL_OK) return s;
  vl_comm *cm = NULL;
  VL_TRY(vl_comm_new(&cm, VL_COMM_NCCL, &nccl_ops, boot->rank, boot->size, err));
  cm->timeout = boot->timeout;
  nccl_state *n = calloc(1, sizeof *n);
  if (!n) {
    free(cm);
    return vl_err_set(err, VL_ERR_OOM, "out of host memory");
  }
  n->boot = boot;
  n->device = dev;
  cm->impl = n;
  cudaError_t e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc((void **)&n->scratch, sizeof(int));
  if (e != cudaSuccess) {
    vl_err_set(err, VL_ERR_BACKEND, "rank %d of %d: comm stream: %s", boot->rank, boot->size, cudaGetErrorString(e));
    if (n->stream) cudaStreamDestroy(n->stream);
    free(n);
    free(cm);
    return VL_ERR_BACKEND;
  }
  s = init_comm(cm, boot, c, err);
  if (s != VL_OK) {
    cudaStreamDestroy(n->stream);
    cudaFree(n->scratch);
    free(n);
    free(cm);
    return s;
  }
  *out = cm;
  return VL_OK;
}

#endif
