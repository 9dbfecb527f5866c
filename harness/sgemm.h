/* This machine's sgemm FLOP/s: the reference a run's model FLOP/s is a share of. */
#ifndef VRAMLAB_SGEMM_H
#define VRAMLAB_SGEMM_H

/* Best of reps timed n x n x n sgemms on the CPU backend (after one warm-up call); 0 when
 * the context or its tensors cannot be had. */
double vl_bench_sgemm(int n, int reps);

#endif
