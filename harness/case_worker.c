/* `vramlab worker CASE ARGS...`: the per-rank process of a case that runs under mpirun. */
#include <stdio.h>

#include "registry.h"
#include "kit/mpirun.h"

int vl_case_worker_main(int argc, char **argv) {
  if (argc < 1) {
    fprintf(stderr, "vramlab: worker: expected 'worker CASE ARGS...'\n");
    return 2;
  }
  const vl_case *c = vl_case_find(argv[0]);
  if (!c || !c->worker) {
    fprintf(stderr, "vramlab: worker: %s '%s'\n", c ? "no per-rank worker in case" : "unknown case", argv[0]);
    return 2;
  }
  /* a rank ends with the vramlab process that started the job, whatever ended that */
  if (vl_mpirun_watch_launcher()) return 1;
  return c->worker(argc, argv);
}
