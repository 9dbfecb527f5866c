/* The MPI communicator (vramlab/dist.h) on host buffers: MPI_COMM_WORLD, every collective a
 * non-blocking MPI_I* call completed by MPI_Test polling (comm.c's wait loop, with its
 * timeout). Average = sum, then scaled by 1/size where the result lands. fp16 and bf16 sum
 * through user-defined MPI_Ops (fp32 add, rounded back, the kernels' conversions). In-place
 * calls follow NCCL's convention (dist.h), mapped to MPI_IN_PLACE; an in-place
 * reduce-scatter lands in a scratch block first (MPI's in-place result sits at the buffer's
 * start) and is copied to this rank's chunk, so the other chunks are left as they were.
 *
 * MPI is initialised (MPI_THREAD_FUNNELED) by the first communicator when nobody has, and
 * finalized at exit of the process that initialised it, unless a collective was left
 * unfinished (a timed-out wait): MPI_Finalize would wait for the stuck peer, so the process
 * exits without it and mpirun ends the job. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_impl.h"

bool vl_comm_have_mpi(void) {
#ifdef VRAMLAB_HAVE_MPI
  return true;
#else
  return false;
#endif
}

#ifndef VRAMLAB_HAVE_MPI

vl_status vl_comm_create_mpi(vl_comm **out, vl_err *err) {
  *out = NULL;
  return vl_err_set(err, VL_ERR_UNSUPPORTED,
                    "built without MPI: apt-get install libopenmpi-dev openmpi-bin, then rebuild");
}

#else

#include <mpi.h>

typedef struct {
  vl_comm_req head; /* first: the request comm.c sees */
  MPI_Request mr;
  void *tmp; /* in-place reduce-scatter: the result before it is copied to recv */
} mpi_req;

/* Process-wide: MPI is one per process. */
static struct {
  bool we_init, ops_made, stuck;
  pid_t pid;
  MPI_Op sum_f16, sum_bf16;
} g;

static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *t) {
  vl_comm_add(in, inout, *len, VL_F16);
}
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *t) {
  vl_comm_add(in, inout, *len, VL_BF16);
}

static MPI_Datatype mpi_type(vl_dtype dt) {
  switch (dt) {
    case VL_F32: return MPI_FLOAT;
    case VL_I32: return MPI_INT32_T;
    default: return MPI_UINT16_T; /* fp16, bf16: moved as 16-bit words, summed by our ops */
  }
}

static MPI_Op mpi_op(vl_dtype dt) {
  return dt == VL_F16 ? g.sum_f16 : dt == VL_BF16 ? g.sum_bf16 : MPI_SUM;
}

static vl_status mpi_err(vl_comm *cm, vl_ctx *c, const vl_coll_args *a, const char *call, int rc) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return vl_fail(c, VL_ERR_COMM, "rank %d of %d: %s of %lld %s: %s: %s", cm->rank, cm->size,
                 vl_coll_name(a->kind), (long long)a->count, vl_dtype_name(a->dt), call, msg);
}

/* ---- start ---------------------------------------------------------------------------------- */

static int start_call(vl_comm *cm, const vl_coll_args *a, mpi_req *r, const char **call) {
  MPI_Comm w = MPI_COMM_WORLD;
  MPI_Datatype t = mpi_type(a->dt);
  MPI_Op op = mpi_op(a->dt);
  int n = (int)a->count;
  const void *s = a->in_place ? MPI_IN_PLACE : a->send;
  switch (a->kind) {
    case VL_COLL_BARRIER:
      *call = "MPI_Ibarrier";
      return MPI_Ibarrier(w, &r->mr);
    case VL_COLL_BCAST:
      *call = "MPI_Ibcast";
      return MPI_Ibcast(a->recv, (int)vl_dtype_bytes(a->dt, a->count), MPI_BYTE, a->root, w, &r->mr);
    case VL_COLL_ALLREDUCE:
      *call = "MPI_Iallreduce";
      return MPI_Iallreduce(s, a->recv, n, t, op, w, &r->mr);
    case VL_COLL_REDUCE_SCATTER:
      *call = "MPI_Ireduce_scatter_block";
      return MPI_Ireduce_scatter_block(a->send, a->in_place ? r->tmp : a->recv, n, t, op, w, &r->mr);
    case VL_COLL_ALLGATHER:
      *call = "MPI_Iallgather";
      return MPI_Iallgather(s, n, t, a->recv, n, t, w, &r->mr);
    case VL_COLL_REDUCE:
      *call = "MPI_Ireduce";
      return MPI_Ireduce(s, a->recv, n, t, op, a->root, w, &r->mr);
    case VL_COLL_SCATTER:
      *call = "MPI_Iscatter";
      return MPI_Iscatter(a->send, n, t, a->in_place ? MPI_IN_PLACE : a->recv, n, t, a->root, w,
                          &r->mr);
    case VL_COLL_GATHER:
      *call = "MPI_Igather";
      return MPI_Igather(s, n, t, a->recv, n, t, a->root, w, &r->mr);
    default:
      *call = "?";
      return MPI_ERR_OP;
  }
}

static vl_status mpi_start(vl_comm *cm, vl_ctx *c, const vl_coll_args *a, vl_comm_req **out) {
  size_t limit = a->kind == VL_COLL_BCAST ? vl_dtype_bytes(a->dt, a->count) : (size_t)a->count;
  if (limit > INT_MAX)
    return vl_fail(c, VL_ERR_UNSUPPORTED,
                   "rank %d of %d: %s of %lld %s: more than 2^31-1 elements in one MPI call: "
                   "split it", cm->rank, cm->size, vl_coll_name(a->kind), (long long)a->count,
                   vl_dtype_name(a->dt));
  mpi_req *r = calloc(1, sizeof *r);
  if (r && a->kind == VL_COLL_REDUCE_SCATTER && a->in_place)
    r->tmp = malloc(vl_dtype_bytes(a->dt, a->count) + 1);
  if (!r || (a->kind == VL_COLL_REDUCE_SCATTER && a->in_place && !r->tmp)) {
    if (r) free(r);
    return vl_fail(c, VL_ERR_OOM, "rank %d of %d: %s: out of host memory", cm->rank, cm->size,
                   vl_coll_name(a->kind));
  }
  r->head.a = *a;
  r->mr = MPI_REQUEST_NULL;
  const char *call = "";
  int rc = start_call(cm, a, r, &call);
  if (rc != MPI_SUCCESS) {
    free(r->tmp);
    free(r);
    return mpi_err(cm, c, a, call, rc);
  }
  vl_comm_link(cm, &r->head);
  *out = &r->head;
  return VL_OK;
}

/* ---- completion ------------------------------------------------------------------------------ */

/* After MPI is done: the in-place reduce-scatter's copy, the average's scaling. */
static void complete(vl_comm *cm, mpi_req *r) {
  const vl_coll_args *a = &r->head.a;
  if (r->tmp) memcpy(a->recv, r->tmp, vl_dtype_bytes(a->dt, a->count));
  bool holds = a->kind != VL_COLL_REDUCE || a->root == cm->rank;
  if (a->op == VL_RED_AVG && holds &&
      (a->kind == VL_COLL_ALLREDUCE || a->kind == VL_COLL_REDUCE_SCATTER || a->kind == VL_COLL_REDUCE))
    vl_comm_scale(a->recv, a->count, a->dt, 1.0 / cm->size);
  r->head.done = true;
}

static vl_status mpi_poll(vl_comm *cm, vl_ctx *c, vl_comm_req *h) {
  mpi_req *r = (mpi_req *)h;
  if (h->done) return VL_OK;
  int flag = 0;
  int rc = MPI_Test(&r->mr, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    h->done = true;
    return mpi_err(cm, c, &h->a, "MPI_Test", rc);
  }
  if (flag) complete(cm, r);
  return VL_OK;
}

static void mpi_free_req(vl_comm *cm, vl_comm_req *h) {
  mpi_req *r = (mpi_req *)h;
  free(r->tmp);
  free(r);
}

/* Requests never waited on: completed ones are freed by comm.c; those MPI still owns are
 * left to it (their buffers may still be written), and MPI is not finalized. */
static void mpi_destroy(vl_comm *cm) {
  for (vl_comm_req *h = cm->head; h; h = h->next) {
    if (!h->done) mpi_poll(cm, NULL, h);
    if (!h->done) {
      h->abandoned = true;
      g.stuck = true;
    }
  }
}

static void mpi_abort(vl_comm *cm, int code) { MPI_Abort(MPI_COMM_WORLD, code); }

static const vl_comm_ops mpi_ops = {mpi_start, mpi_poll, NULL, mpi_free_req, mpi_destroy, mpi_abort};

/* ---- lifetime ---------------------------------------------------------------------------------- */

static void mpi_at_exit(void) {
  if (getpid() != g.pid || g.stuck) return; /* a forked child, or a peer that hangs */
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  if (g.ops_made) {
    MPI_Op_free(&g.sum_f16);
    MPI_Op_free(&g.sum_bf16);
    g.ops_made = false;
  }
  MPI_Finalize();
}

static vl_status mpi_boot(vl_err *err) {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (fin) return vl_err_set(err, VL_ERR_COMM, "MPI was already finalized in this process: it cannot start again");
  if (!inited) {
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      return vl_err_set(err, VL_ERR_COMM, "MPI_Init_thread failed (started outside mpirun? run it under "
                        "mpirun, e.g. tests/mpirun.sh 2 PROGRAM)");
    g.we_init = true;
    g.pid = getpid();
    atexit(mpi_at_exit);
  }
  if (!g.ops_made) {
    MPI_Op_create(sum_f16, 1, &g.sum_f16);
    MPI_Op_create(sum_bf16, 1, &g.sum_bf16);
    g.ops_made = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return VL_OK;
}

vl_status vl_comm_create_mpi(vl_comm **out, vl_err *err) {
  *out = NULL;
  VL_TRY(mpi_boot(err));
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return vl_comm_new(out, VL_COMM_MPI, &mpi_ops, rank, size, err);
}

#endif
