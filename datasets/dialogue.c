#include "dialogue.h"

#include <math.h>

void vl_dialogue_init(vl_dialogue_gen *g, int64_t vocab, int64_t max_len, uint64_t seed) {
  g->vocab = vocab;
  g->max_len = max_len;
  /* Customer-service turns: a median near a quarter of the limit, ~2% reach the limit. */
  g->median_len = (double)max_len * 0.235;
  g->sigma = 0.7;
  g->min_len = max_len < 16 ? 2 : 8;
  vl_rng_seed(&g->rng, seed);
}

int64_t vl_dialogue_len(vl_dialogue_gen *g) {
  double z = vl_rng_normal(&g->rng);
  int64_t n = (int64_t)llround(g->median_len * exp(g->sigma * z));
  if (n < g->min_len) n = g->min_len;
  if (n > g->max_len) n = g->max_len;
  return n;
}

/* Tokens follow a seeded affine recurrence with 10% noise: next = (5*cur + 3 + speaker) % V.
 * A model learns it within a few hundred steps, so loss curves are meaningful. */
static int32_t next_token(vl_dialogue_gen *g, int32_t cur, int speaker) {
  if (vl_rng_uniform(&g->rng) < 0.1) return (int32_t)vl_rng_below(&g->rng, (uint64_t)g->vocab);
  return (int32_t)((5 * (int64_t)cur + 3 + speaker) % g->vocab);
}

int64_t vl_dialogue_batch(vl_dialogue_gen *g, int64_t B, int64_t fixed_T, int32_t *tokens,
                          int32_t *targets) {
  /* Lengths first (T is the longest), parked in targets[b]. Rows are written last to first:
   * row b writes [b*T, b*T+T), which holds no parked length of a row still to come (< b). */
  int64_t T = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t n = fixed_T > 0 ? fixed_T : vl_dialogue_len(g);
    targets[b] = (int32_t)n;
    if (n > T) T = n;
  }
  for (int64_t b = B - 1; b >= 0; b--) {
    int64_t n = targets[b];
    int32_t cur = (int32_t)vl_rng_below(&g->rng, (uint64_t)g->vocab);
    int speaker = 0;
    for (int64_t t = 0; t < T; t++) {
      int64_t i = b * T + t;
      if (t < n) {
        if (t % 16 == 15) speaker ^= 1; /* turns alternate */
        int32_t nx = next_token(g, cur, speaker);
        tokens[i] = cur;
        targets[i] = t + 1 < n ? nx : -1;
        cur = nx;
      } else {
        tokens[i] = 0;
        targets[i] = -1;
      }
    }
  }
  return T;
}
