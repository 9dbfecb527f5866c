/* The interrupt flag and its signal handler (see interrupt.h). */
#include "interrupt.h"

#include <unistd.h>

volatile sig_atomic_t vl_interrupted;
volatile sig_atomic_t vl_terminated;

/* Only async-signal-safe calls here. A step stuck in a blocking read (a FIFO, a hung
 * network file system) never reaches its next step edge: the second signal must not wait
 * for one. */
static void on_signal(int sig) {
  if (vl_interrupted) {
    static const char msg[] = "\n[vramlab] second interrupt: stopping now, nothing more is written\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    /* die of the signal itself (a calling shell script then stops too): default action,
     * and unblock it, since a handler runs with its own signal blocked */
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    _exit(128 + sig); /* not reached unless the signal is blocked */
  }
  vl_interrupted = 1;
  if (sig == SIGTERM) {
    vl_terminated = 1;
    static const char msg[] = "\n[vramlab] terminated: stopping at the next operation and writing what finished "
                              "(the step in flight is lost)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    return;
  }
  static const char msg[] = "\n[vramlab] interrupted: finishing the current step and writing what finished "
                            "(interrupt again to stop at once)\n";
  ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)w;
}

void vl_interrupt_install(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; /* step code does not expect EINTR; the second signal ends it */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}
