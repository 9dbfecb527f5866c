/* Ctrl-C and SIGTERM: the first asks the run to stop at the next step edge and still write
 * what finished; a second ends the process at once. Leaf module: cases may include it. */
#ifndef VRAMLAB_INTERRUPT_H
#define VRAMLAB_INTERRUPT_H

#include <signal.h>

/* Set by the handler; loops poll it at step edges. */
extern volatile sig_atomic_t vl_interrupted;
/* Set by a first SIGTERM too (kill, a job scheduler, `timeout`): the model loops stop between
 * operations (vl_loop_cfg.stop_now), not at the end of a step that may take minutes. */
extern volatile sig_atomic_t vl_terminated;

/* Exit status of a run stopped by SIGINT/SIGTERM (the shell's 128 + SIGINT). */
#define VL_EXIT_INTERRUPTED 130

/* Install the handler for SIGINT and SIGTERM. */
void vl_interrupt_install(void);

#endif
