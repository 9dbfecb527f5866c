/* How many threads an op's loop takes (vl_cpu_threads; cpu_internal.h has the cost model).
 *
 * A fork pays off when the time it saves, serial * (1 - 1/nt), exceeds what the fork and
 * join cost. On idle cores that cost is microseconds; on cores shared with other processes
 * it is however long the scheduler keeps a worker from running: measured at 1-10 ms per
 * region on this 2-core machine under load 4, where a 1 ms GEMM or a 50 us copy ran 3-50x
 * slower forked than serial. So the cost is measured, not assumed: the wait at the join
 * beyond the master thread's own share (a late start, a preempted worker), from forked
 * GEMMs (vl_cpu_par_observe) and from an empty probe region whenever no fork has been
 * observed for PROBE_X average waits (at least PROBE_MIN_S), is kept as a moving average;
 * a loop forks when its estimated saving exceeds it. Probing costs at most about 1/PROBE_X
 * of the time, and the average follows the load both ways within a few probes.
 *
 * One exception: right after a library ran its own parallel region (oneDNN's convolutions,
 * vl_cpu_par_warm), its workers are still spinning on their cores (libgomp spins about
 * 3 ms before sleeping), so a fork then is cheap whatever the average says, and loops keep
 * forking while they follow each other closely: letting the workers fall asleep between a
 * network's convolutions only makes each next convolution wake them (measured: U-Net
 * steps under load were slower with the average alone).
 *
 * Results never depend on the decision: every loop that takes vl_cpu_threads computes
 * each output element the same way on any number of threads (partitions fixed by the
 * shapes, sums in a fixed order), so the decision changes only the speed. */
#include <omp.h>

#include "cpu_internal.h"

#define PROBE_X 20.0      /* probe once 20 average waits passed without an observed fork */
#define PROBE_MIN_S 2e-3  /* and not more often than every 2 ms */
#define EMA_WEIGHT 0.25   /* weight of a new observation of the join's wait */
#define WARM_S 200e-6     /* a worker that left a region this recently is still spinning */

/* per host thread: the ops of one context run on one host thread */
static _Thread_local double wait_ema;   /* seconds */
static _Thread_local double last_obs;   /* vl_now() of the last observation */
static _Thread_local int forced;        /* vl_cpu_threads_force */
static _Thread_local double warm_until; /* vl_now() until which the workers are awake */

int vl_cpu_team(void) { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

void vl_cpu_threads_force(int n) { forced = n > 0 ? n : 0; }

void vl_cpu_par_warm(void) { warm_until = vl_now() + WARM_S; }

void vl_cpu_par_observe(double wall, double own) {
  double w = wall > own ? wall - own : 0.0;
  wait_ema += EMA_WEIGHT * (w - wait_ema);
  last_obs = vl_now();
}

/* An empty region on nt threads: its wall time beyond the master's is the fork's cost. */
static void probe(int nt) {
  double t0 = vl_now(), own = 0;
#pragma omp parallel num_threads(nt)
  {
    if (omp_get_thread_num() == 0) own = vl_now() - t0;
  }
  vl_cpu_par_observe(vl_now() - t0, own);
}

int vl_cpu_threads(double ns) {
  int nt = vl_cpu_team();
  if (forced) return forced < nt ? forced : nt;
  if (nt == 1 || ns < VL_CPU_PAR_NS) return 1;
  double now = vl_now();
  if (now < warm_until) { /* right after a library's region: keep the workers busy */
    warm_until = now + ns * 1e-9 / nt + WARM_S;
    return nt;
  }
  double every = PROBE_X * wait_ema > PROBE_MIN_S ? PROBE_X * wait_ema : PROBE_MIN_S;
  if (now - last_obs > every) probe(nt);
  return ns * 1e-9 * (1.0 - 1.0 / nt) > wait_ema ? nt : 1;
}
