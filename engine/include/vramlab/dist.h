/* The communicator of data parallelism (docs/architecture.md "Data parallelism"): one interface, three
 * implementations. MPI on host buffers (CPU ranks are processes started by mpirun), NCCL on
 * device buffers (its unique id broadcast over an MPI communicator), and `self` (one rank,
 * every collective a copy). Every collective is blocking when req is NULL, non-blocking
 * otherwise: it returns a request that vl_comm_wait completes (and frees).
 *
 * Buffers: host pointers for MPI and self, device pointers on c's stream for NCCL. counts
 * are elements of dtype dt (VL_F32, VL_F16, VL_BF16, VL_I32; reductions need a float type
 * or VL_I32). In place follows NCCL's convention everywhere:
 *   allreduce:      send == recv;
 *   reduce_scatter: recv == send + rank * recv_count (send holds size * recv_count);
 *   allgather:      send == recv + rank * send_count (recv holds size * send_count);
 *   broadcast:      one buffer; any dtype, moved as raw bytes (vl_dtype_bytes; NF4 too).
 *
 * Never a hang: a wait gives up after the communicator's timeout (VRAMLAB_COMM_TIMEOUT
 * seconds, default 120) with VL_ERR_COMM and a message naming this rank, the collective
 * and its size; a rank that fails calls vl_comm_abort, which ends every rank of the job
 * (MPI_Abort) after printing "rank R of N: <why>". */
#ifndef VRAMLAB_DIST_H
#define VRAMLAB_DIST_H

#include "vramlab/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { VL_COMM_SELF = 0, VL_COMM_MPI, VL_COMM_NCCL } vl_comm_kind;
typedef enum { VL_RED_SUM = 0, VL_RED_AVG } vl_red_op;

typedef struct vl_comm vl_comm;
typedef struct vl_comm_req vl_comm_req;

const char *vl_comm_kind_name(vl_comm_kind k);

/* Was this binary built with MPI (libopenmpi-dev)? Without it vl_comm_create_mpi returns
 * VL_ERR_UNSUPPORTED with the apt-get line. */
bool vl_comm_have_mpi(void);
/* Was this process started by mpirun (OMPI_COMM_WORLD_SIZE / PMI_SIZE in the environment)? */
bool vl_comm_under_mpirun(void);

/* One rank: every collective copies send to recv (a reduction of one contribution). */
vl_status vl_comm_create_self(vl_comm **out, char *err, size_t errn);
/* MPI_COMM_WORLD; initialises MPI (thread level FUNNELED) when nobody has. */
vl_status vl_comm_create_mpi(vl_comm **out, char *err, size_t errn);
/* NCCL over the ranks of `boot` (an MPI communicator): rank 0's unique id broadcast over it,
 * one device per rank (local rank modulo the visible devices), collectives on c's stream.
 * VL_ERR_UNSUPPORTED without the CUDA backend or NCCL. */
vl_status vl_comm_create_nccl(vl_comm *boot, vl_ctx *c, vl_comm **out, char *err, size_t errn);
/* Before the CUDA context of an NCCL rank is made: cudaSetDevice(local rank modulo the
 * visible devices); the device index, or -1 with a message (no CUDA, no device).
 * vl_comm_create_nccl refuses a context on another device. */
int vl_comm_select_device(char *err, size_t errn);
/* NULL is fine. MPI itself is finalized at exit of the process whose vl_comm_create_mpi
 * initialised it (so communicators can be made and destroyed any number of times), unless a
 * collective was left unfinished (a timed-out wait: finalizing would wait on the peer). */
void vl_comm_destroy(vl_comm *cm);

vl_comm_kind vl_comm_kind_of(const vl_comm *cm);
int vl_comm_rank(const vl_comm *cm);
int vl_comm_size(const vl_comm *cm);
double vl_comm_timeout(const vl_comm *cm);
void vl_comm_set_timeout(vl_comm *cm, double seconds);

/* End the whole job: print "vramlab: rank R of N: <why>" on stderr, then MPI_Abort (other
 * ranks are killed by mpirun); exit(code) for self. Does not return. */
_Noreturn void vl_comm_abort(vl_comm *cm, int code, const char *why);

/* ---- collectives (messages into c->err) ------------------------------------------------- */
vl_status vl_comm_barrier(vl_comm *cm, vl_ctx *c, vl_comm_req **req);
vl_status vl_comm_bcast(vl_comm *cm, vl_ctx *c, void *buf, int64_t count, vl_dtype dt, int root,
                        vl_comm_req **req);
vl_status vl_comm_allreduce(vl_comm *cm, vl_ctx *c, const void *send, void *recv, int64_t count,
                            vl_dtype dt, vl_red_op op, vl_comm_req **req);
vl_status vl_comm_reduce_scatter(vl_comm *cm, vl_ctx *c, const void *send, void *recv,
                                 int64_t recv_count, vl_dtype dt, vl_red_op op, vl_comm_req **req);
vl_status vl_comm_allgather(vl_comm *cm, vl_ctx *c, const void *send, void *recv,
                            int64_t send_count, vl_dtype dt, vl_comm_req **req);
/* Rooted ones, for the DataParallel-style baseline: reduce to root (in place on root when
 * send == recv; recv ignored elsewhere), scatter root's size * count elements, gather
 * count elements of every rank into root's recv. */
vl_status vl_comm_reduce(vl_comm *cm, vl_ctx *c, const void *send, void *recv, int64_t count,
                         vl_dtype dt, vl_red_op op, int root, vl_comm_req **req);
vl_status vl_comm_scatter(vl_comm *cm, vl_ctx *c, const void *send, void *recv, int64_t count,
                          vl_dtype dt, int root, vl_comm_req **req);
vl_status vl_comm_gather(vl_comm *cm, vl_ctx *c, const void *send, void *recv, int64_t count,
                         vl_dtype dt, int root, vl_comm_req **req);

/* Complete a request (with the timeout) and free it; NULL is fine. */
vl_status vl_comm_wait(vl_comm *cm, vl_ctx *c, vl_comm_req *req);
/* Has it completed? Never blocks; the request stays valid until waited on. */
vl_status vl_comm_test(vl_comm *cm, vl_ctx *c, vl_comm_req *req, bool *done);
/* Drive outstanding non-blocking collectives (MPI progresses them only inside MPI calls; a
 * reducer calls this as backward goes on). */
void vl_comm_progress(vl_comm *cm);

/* ---- pure helpers (CPU-tested; the NCCL path's host logic) ------------------------------ */
/* The bus bandwidth factor of nccl-tests: busbw = algbw * factor, for n ranks:
 * allreduce 2(n-1)/n, reduce_scatter and allgather (n-1)/n, broadcast/reduce 1. */
double vl_comm_busbw_factor(const char *collective, int n);
/* The local rank and device of `rank` among ranks on one host: local % n_devices. */
int vl_comm_device_of(int local_rank, int n_devices);

#ifdef __cplusplus
}
#endif
#endif
