/* What the communicator's implementations share (comm.c dispatches, comm_self.c in comm.c,
 * comm_mpi.c, comm_nccl.c): the communicator and request structs, the table of operations
 * each implementation fills, and the waiting loop's backoff. Engine-internal. */
#ifndef VRAMLAB_COMM_IMPL_H
#define VRAMLAB_COMM_IMPL_H

#include "vramlab/dist.h"

/* The collectives, as named in messages. */
typedef enum {
  VL_COLL_BARRIER = 0, VL_COLL_BCAST, VL_COLL_ALLREDUCE, VL_COLL_REDUCE_SCATTER,
  VL_COLL_ALLGATHER, VL_COLL_REDUCE, VL_COLL_SCATTER, VL_COLL_GATHER, VL_COLL_COUNT
} vl_coll;
const char *vl_coll_name(vl_coll k);

/* One collective call, validated by comm.c: send/recv as the caller gave them, count the
 * caller's count (recv_count for reduce_scatter, send_count for allgather), in_place by the
 * NCCL convention of dist.h. */
typedef struct {
  vl_coll kind;
  const void *send;
  void *recv;
  int64_t count;
  vl_dtype dt;
  vl_red_op op;
  int root;
  bool in_place;
} vl_coll_args;

/* A started collective. Implementations allocate it (with room for their own fields behind
 * this head) and link it into the communicator's outstanding list. */
struct vl_comm_req {
  vl_comm *cm;
  vl_coll_args a;
  bool done;      /* completed and its completion work (averaging, copies) done */
  bool abandoned; /* its wait timed out: left to the library, never touched again */
  vl_status status; /* a failure seen while polling (vl_comm_progress has no context) */
  char msg[256];    /* and its message, for the wait that reports it */
  struct vl_comm_req *next, *prev;
};

typedef struct {
  /* Start a collective; *req receives the request (never NULL on VL_OK). */
  vl_status (*start)(vl_comm *cm, vl_ctx *c, const vl_coll_args *a, vl_comm_req **req);
  /* Complete it if it has: run the completion work, set r->done. Never blocks. */
  vl_status (*poll)(vl_comm *cm, vl_ctx *c, vl_comm_req *r);
  /* Block the caller until it is done (or its timeout): NULL means "poll with backoff".
   * NCCL uses it to make the compute stream wait instead of the host. */
  vl_status (*finish)(vl_comm *cm, vl_ctx *c, vl_comm_req *r);
  void (*free_req)(vl_comm *cm, vl_comm_req *r);
  void (*destroy)(vl_comm *cm);
  void (*abort)(vl_comm *cm, int code);
} vl_comm_ops;

struct vl_comm {
  vl_comm_kind kind;
  const vl_comm_ops *ops;
  int rank, size;
  double timeout;
  vl_comm_req *head; /* outstanding requests, newest first */
  void *impl;
};

/* A communicator of kind k with the timeout of VRAMLAB_COMM_TIMEOUT (default 120 s);
 * VL_ERR_INVALID with a message when the variable is not a positive number. */
vl_status vl_comm_new(vl_comm **out, vl_comm_kind k, const vl_comm_ops *ops, int rank,
                      int size, vl_err *err);
void vl_comm_link(vl_comm *cm, vl_comm_req *r);
void vl_comm_unlink(vl_comm *cm, vl_comm_req *r);

/* The polling loop's pause after `polls` unsuccessful polls, `waited` seconds into a wait:
 * sched_yield (the core goes to whoever else is runnable), and after the first 50 ms a
 * 50 us nanosleep every 256th poll. MPI moves data only inside MPI_Test (one shared-memory
 * fragment a call), so a wait must keep polling while a large collective streams: polls
 * that copy take longer, so the sleeps cost a streaming transfer a few percent, while a wait
 * on a peer that is still computing leaves part of its core idle. */
void vl_comm_backoff(long polls, double waited);
/* VL_ERR_COMM with "rank R of N: <collective> of <count> <dtype> timed out after S s: a
 * peer rank died or stopped". */
vl_status vl_comm_fail_timeout(vl_comm *cm, vl_ctx *c, const vl_comm_req *r);

/* Elementwise helpers of the reductions on host buffers. */
void vl_comm_scale(void *buf, int64_t n, vl_dtype dt, double f);
void vl_comm_add(const void *in, void *inout, int64_t n, vl_dtype dt);

#endif
