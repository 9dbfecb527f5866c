/* Synthetic dialogue tokens: a seeded, learnable token process with a realistic length
 * distribution (many short dialogues, a long tail up to the sequence limit), so padded
 * batch lengths vary from step to step and an OOM rate means something. */
#ifndef VRAMLAB_DIALOGUE_H
#define VRAMLAB_DIALOGUE_H
#include <stdint.h>
#include "vramlab/core.h"

typedef struct {
  int64_t vocab, max_len;
  double median_len;   /* log-normal median of dialogue length (tokens) */
  double sigma;        /* log-normal sigma */
  int64_t min_len;
  vl_rng rng;
} vl_dialogue_gen;

void vl_dialogue_init(vl_dialogue_gen *g, int64_t vocab, int64_t max_len, uint64_t seed);
/* Length of the next dialogue, in [min_len, max_len]. */
int64_t vl_dialogue_len(vl_dialogue_gen *g);
/* Fill one right-padded batch: B rows of T = longest length drawn (capped at max_len, or at
 * fixed_T when > 0). tokens/targets hold B*max_len int32; targets are the next token, -1 on
 * padding. Returns T. */
int64_t vl_dialogue_batch(vl_dialogue_gen *g, int64_t B, int64_t fixed_T, int32_t *tokens,
                          int32_t *targets);
#endif
