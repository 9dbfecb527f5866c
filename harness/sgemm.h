/* This machine's sgemm FLOP/s: the reference a run's model FLOP/s is a share of. */
#ifndef VRAMLAB_SGEMM_H
#define VRAMLAB_SGEMM_H

#include <stddef.h>

/* Best of reps timed n x n x n sgemms on the CPU backend (after one warm-up call); 0 when
 * the context or its tensors cannot be had. */
double vl_bench_sgemm(int n, int reps);

/* This host's memory copy bandwidth (bytes read + written per second, one thread): best of
 * reps memcpy's of `bytes` after one warm-up; 0 when the buffers cannot be had. With
 * vl_bench_sgemm, the calibration `vramlab regress` judges timings against. */
double vl_bench_copy_bw(size_t bytes, int reps);

#endif
