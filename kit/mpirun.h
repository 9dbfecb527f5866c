/* Starting ranks: mpirun with what Open MPI needs to run as root and inside containers,
 * stdout/stderr passed through, a wall-clock limit so a stuck job never hangs the caller.
 * Used by `vramlab bench allreduce` (re-exec under mpirun), the multi-gpu case (one mpirun
 * job per rung repetition) and the tests (tests/mpirun.sh does the same from the shell). */
#ifndef VRAMLAB_MPIRUN_H
#define VRAMLAB_MPIRUN_H

#include <stdbool.h>
#include <stddef.h>

#include "vramlab/core.h" /* vl_err */

/* This machine's cores available to us (sched_getaffinity). */
int vl_cores(void);
/* The path of this executable (/proc/self/exe) into buf; 0 on success. */
int vl_self_exe(char *buf, size_t n);

typedef struct {
  int np;               /* ranks */
  bool oversubscribe;   /* allow np > cores (labelled so by the caller) */
  int threads;          /* OMP_NUM_THREADS / OPENBLAS_NUM_THREADS of every rank (0: leave) */
  double timeout_s;     /* kill the job after this long (0: 600) */
  const char *out_path; /* stdout+stderr of the job into this file (NULL: pass through) */
} vl_mpirun_opts;

/* Run cmd (argv, NULL-terminated; cmd[0] a path) on o->np ranks. Returns the job's exit
 * status (0..255); -1 with a message in err when mpirun is missing (the apt-get line) or
 * could not start; 124 when it ran past the timeout (the job is killed). The job ends with
 * the caller: SIGTERM, SIGINT or SIGHUP to the caller while it waits ends the job (its
 * process group: SIGTERM, SIGKILL 5 s later), then the caller's own disposition of the
 * signal runs (raise) and, if the caller lives on, 128 + the signal is returned. */
int vl_mpirun(const vl_mpirun_opts *o, char *const cmd[], vl_err *err);

/* In a rank of a vl_mpirun job: a thread that ends this process (exit status 130) within
 * a fraction of a second once the launching process, whatever killed it (SIGKILL included),
 * or this rank's parent (mpirun) is gone. 0 (also outside a vl_mpirun job: nothing to
 * watch), -1 when the launcher is gone already or the thread cannot start. */
int vl_mpirun_watch_launcher(void);

#endif
