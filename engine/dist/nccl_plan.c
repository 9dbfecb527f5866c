/* The NCCL communicator's pure host logic (nccl_plan.h): codes, local rank, the stream and
 * event plan. No CUDA here: compiled and tested in every build. */
#include <stdlib.h>

#include "nccl_plan.h"

int vl_nccl_dtype(vl_dtype dt) {
  switch (dt) {
    case VL_F32: return VL_NCCL_FLOAT32;
    case VL_F16: return VL_NCCL_FLOAT16;
    case VL_BF16: return VL_NCCL_BFLOAT16;
    case VL_I32: return VL_NCCL_INT32;
    default: return -1;
  }
}

int vl_nccl_redop(vl_red_op op) {
  return op == VL_RED_SUM ? VL_NCCL_SUM : op == VL_RED_AVG ? VL_NCCL_AVG : -1;
}

static int parse_index(const char *s) {
  if (!s || *s < '0' || *s > '9') return -1;
  char *end;
  long v = strtol(s, &end, 10);
  return *end || v > 1 << 20 ? -1 : (int)v;
}

int vl_nccl_local_rank(const char *ompi, const char *mpich, const char *slurm, int rank) {
  const char *src[3] = {ompi, mpich, slurm};
  for (int i = 0; i < 3; i++) {
    int v = parse_index(src[i]);
    if (v >= 0) return v;
  }
  return rank;
}

static vl_nccl_act act(vl_nccl_act_kind k, vl_nccl_stream s, int ev) {
  vl_nccl_act a = {k, s, ev};
  return a;
}

int vl_nccl_plan_start(int slot, vl_nccl_act out[VL_NCCL_START_ACTS]) {
  out[0] = act(VL_NA_RECORD, VL_NS_COMPUTE, 2 * slot);
  out[1] = act(VL_NA_WAIT, VL_NS_COMM, 2 * slot);
  out[2] = act(VL_NA_LAUNCH, VL_NS_COMM, -1);
  out[3] = act(VL_NA_RECORD, VL_NS_COMM, 2 * slot + 1);
  return VL_NCCL_START_ACTS;
}

int vl_nccl_plan_wait(int slot, vl_nccl_act out[VL_NCCL_WAIT_ACTS]) {
  out[0] = act(VL_NA_WAIT, VL_NS_COMPUTE, 2 * slot + 1);
  return VL_NCCL_WAIT_ACTS;
}
