/* `vramlab peer-config`: every rung's PyTorch peer setup without running anything
 * (peercfg.c), for tools/peers/memtracker_all.py and the tests that keep the MemTracker
 * fixtures (tests/fixtures/memtracker/) in step with the ladders. */
#ifndef VRAMLAB_PEERCFG_H
#define VRAMLAB_PEERCFG_H

#include "ladder.h"

/* {"case", "scale", "rungs": {RUNG: {"script", "config" | "not_measured"}}} of the ladder's
 * rungs (only `step` when not NULL) at `scale`, the peers' setups at `threads` threads on
 * the CPU; NULL with the reason in e (a case without peers, a rung that does not parse). */
cJSON *vl_peer_configs(const vl_case *c, const vl_ladder *L, const char *scale, const char *step, int threads,
                       vl_err *e);

#endif
