/* `vramlab bench allreduce|reduce_scatter|allgather`: the nccl-tests table over N ranks
 * (collbench.c). Not under mpirun, it starts itself there (--ranks N, default 2). */
#ifndef VRAMLAB_COLLBENCH_H
#define VRAMLAB_COLLBENCH_H

#include <stdbool.h>

/* Is name one of the collectives the bench measures? */
bool vl_collbench_is(const char *name);
/* argv[0] is the collective; returns the process exit status (non-zero on #wrong > 0). */
int vl_collbench_main(int argc, char **argv);

#endif
