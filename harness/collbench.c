/* STUB (being written): the collective benchmark. */
#include <stdio.h>
#include <string.h>

#include "collbench.h"

bool vl_collbench_is(const char *name) {
  return !strcmp(name, "allreduce") || !strcmp(name, "reduce_scatter") || !strcmp(name, "allgather");
}
int vl_collbench_main(int argc, char **argv) {
  fprintf(stderr, "vramlab: bench %s: not built yet\n", argv[0]);
  return 2;
}
