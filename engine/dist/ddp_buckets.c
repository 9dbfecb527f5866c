/* The data-parallel wrapper's pure helpers (vramlab/ddp.h): mode names, PyTorch's DDP
 * bucket assignment and ZeRO-1's flat layout. No context, no memory: CPU-tested as they are
 * (the NCCL path uses the same offsets). */
#include <string.h>
#include <strings.h>

#include "ddp_impl.h"

static const char *const mode_names[VL_DIST_COUNT] = {"single", "dp", "ddp", "zero1"};

const char *vl_dist_mode_name(vl_dist_mode m) {
  return (unsigned)m < VL_DIST_COUNT ? mode_names[m] : "?";
}

int vl_dist_mode_parse(const char *s, vl_dist_mode *out) {
  if (!s) return -1;
  for (int i = 0; i < VL_DIST_COUNT; i++)
    if (!strcasecmp(s, mode_names[i])) {
      *out = (vl_dist_mode)i;
      return 0;
    }
  return -1;
}

/* torch/csrc/distributed/c10d/reducer.cpp compute_bucket_assignment_by_size, for tensors of
 * one dtype and device (one bucket accumulator): tensors join the open bucket in order; it
 * closes as soon as its bytes reach its limit (the tensor that crosses is inside); limits
 * are taken in turn, the last one repeating. Buckets come out ordered by their smallest
 * index, which for one accumulator is creation order; DDP then reverses them. */
int vl_ddp_assign_buckets(const size_t *bytes, int n, size_t first_cap, size_t cap, int *bucket_of) {
  if (n <= 0) return 0;
  if (!first_cap) first_cap = VL_DDP_FIRST_BUCKET_CAP;
  if (!cap) cap = VL_DDP_BUCKET_CAP;
  int nb = 0;
  size_t size = 0, limit = first_cap;
  bool open = false;
  for (int i = 0; i < n; i++) {
    bucket_of[i] = nb; /* creation order for now */
    size += bytes[i];
    open = true;
    if (size >= limit) {
      nb++;
      size = 0;
      open = false;
      limit = cap;
    }
  }
  if (open) nb++;
  for (int i = 0; i < n; i++) bucket_of[i] = nb - 1 - bucket_of[i]; /* DDP's reversal */
  return nb;
}

void vl_zero_layout(int64_t total, int world, int64_t *padded, int64_t *shard) {
  if (world < 1) world = 1;
  if (total < 0) total = 0;
  int64_t p = (total + world - 1) / world * world;
  *padded = p;
  *shard = p / world;
}
