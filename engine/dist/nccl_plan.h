/* The NCCL communicator's host logic as pure functions (comm_nccl.c executes them; tests/
 * test_dist.c checks them without a GPU): the dtype and reduction codes, the local rank, and
 * the stream/event plan of a collective.
 *
 * The plan. Every collective runs on the communicator's own stream so it overlaps compute;
 * request slot s owns two events, READY (2s) and DONE (2s+1):
 *   start:  record READY on the compute stream   (everything computed so far, its input)
 *           the comm stream waits on READY
 *           launch the NCCL call on the comm stream
 *           record DONE on the comm stream
 *   wait:   the compute stream waits on DONE      (later kernels see the result; the host
 *                                                  polls DONE too, for the timeout)
 * so a collective never waits for compute issued after its start, and compute issued after
 * its wait never runs before it ends. Collectives on the one comm stream run in start order,
 * the order every rank issues them in (NCCL's requirement). */
#ifndef VRAMLAB_NCCL_PLAN_H
#define VRAMLAB_NCCL_PLAN_H

#include "vramlab/dist.h"

/* nccl.h's codes (comm_nccl.c checks they are nccl.h's): -1 for a dtype NCCL cannot reduce
 * (NF4; broadcast moves bytes as ncclUint8). */
enum { VL_NCCL_UINT8 = 1, VL_NCCL_INT32 = 2, VL_NCCL_FLOAT16 = 6, VL_NCCL_FLOAT32 = 7,
       VL_NCCL_BFLOAT16 = 9 };
enum { VL_NCCL_SUM = 0, VL_NCCL_AVG = 4 };
int vl_nccl_dtype(vl_dtype dt);
int vl_nccl_redop(vl_red_op op);

/* This rank's index among the ranks on its host: OMPI_COMM_WORLD_LOCAL_RANK (Open MPI),
 * else MPI_LOCALRANKID (MPICH), else SLURM_LOCALID, else `rank` (one host). Values that are
 * not a non-negative number are skipped. */
int vl_nccl_local_rank(const char *ompi, const char *mpich, const char *slurm, int rank);

typedef enum { VL_NS_COMPUTE = 0, VL_NS_COMM = 1 } vl_nccl_stream;
typedef enum { VL_NA_RECORD = 0, VL_NA_WAIT, VL_NA_LAUNCH } vl_nccl_act_kind;
typedef struct {
  vl_nccl_act_kind kind;
  vl_nccl_stream stream; /* where it is enqueued */
  int event;             /* RECORD/WAIT: 2 * slot (READY) or 2 * slot + 1 (DONE) */
} vl_nccl_act;

#define VL_NCCL_START_ACTS 4
#define VL_NCCL_WAIT_ACTS 1
/* The actions of starting the collective of request slot `slot`; returns their count. */
int vl_nccl_plan_start(int slot, vl_nccl_act out[VL_NCCL_START_ACTS]);
/* The actions of waiting on it; returns their count. */
int vl_nccl_plan_wait(int slot, vl_nccl_act out[VL_NCCL_WAIT_ACTS]);

#endif
