/* libFuzzer target: arbitrary bytes as a ladder.ini and a claims.ini through the strict
 * parser (vl_ladder_parse, harness/ladder.c), once as an unregistered case and once as each
 * registered case (whose claims may name only its metrics), then --set assignments on every
 * ladder it accepts. Input: ladder text, NUL, claims text, NUL, assignments one per line.
 * What the parser accepts must satisfy the limits the rest of the harness relies on: abort()
 * when it does not, so that the fuzzer reports it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/ladder.h"
#include "harness/registry.h"

static vl_ladder *L; /* about 1 MB: off the stack, allocated once */

static void die(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_ini: %s: %s\n", what, detail);
  abort();
}

static void check_knobs(const vl_knobs *k, const char *where) {
  if (k->n < 0 || k->n > VL_MAX_KNOBS) die("knob count", where);
  for (int i = 0; i < k->n; i++) {
    size_t kl = strnlen(k->k[i].key, sizeof k->k[i].key), vl = strnlen(k->k[i].val, sizeof k->k[i].val);
    if (kl == 0 || kl >= sizeof k->k[i].key) die("knob name empty or unterminated", where);
    if (vl == 0 || vl >= sizeof k->k[i].val) die("knob value empty or unterminated", k->k[i].key);
    for (int j = 0; j < i; j++)
      if (!strcmp(k->k[i].key, k->k[j].key)) die("knob twice", k->k[i].key);
  }
}

/* What an accepted ladder promises: limits kept, names unique and terminated, every claim
 * pointing at rungs that exist and (registered case) at a metric the case writes. */
static void check_ladder(const vl_case *c) {
  if (L->n_rungs < 1 || L->n_rungs > VL_MAX_RUNGS) die("rung count", L->case_id);
  if (L->n_claims < 0 || L->n_claims > VL_MAX_CLAIMS) die("claim count", L->case_id);
  check_knobs(&L->setting, "[case]");
  for (int i = 0; i < L->n_rungs; i++) {
    const vl_rung *r = &L->rungs[i];
    size_t n = strnlen(r->name, sizeof r->name);
    if (n == 0 || n >= sizeof r->name || strchr(r->name, '.')) die("rung name", r->name);
    if (strnlen(r->label, sizeof r->label) >= sizeof r->label) die("rung label unterminated", r->name);
    if (vl_ladder_find(L, r->name) != i) die("rung twice", r->name);
    check_knobs(&r->knobs, r->name);
  }
  for (int i = 0; i < L->n_claims; i++) {
    const vl_claim *cl = &L->claims[i];
    if (!cl->id[0] || strnlen(cl->id, sizeof cl->id) >= sizeof cl->id) die("claim id", cl->id);
    if (!cl->metric[0] || vl_ladder_find(L, cl->after) < 0) die("claim without metric or after rung", cl->id);
    if (cl->before[0] && vl_ladder_find(L, cl->before) < 0) die("claim before rung", cl->id);
    if (c) {
      bool ok = false;
      for (int m = 0; c->metrics[m]; m++) ok |= !strcmp(c->metrics[m], cl->metric);
      if (!ok) die("claim metric the case does not write", cl->metric);
    }
    for (int j = 0; j < i; j++)
      if (!strcmp(cl->id, L->claims[j].id)) die("claim twice", cl->id);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  if (!L && !(L = malloc(sizeof *L))) die("malloc", "ladder");
  /* three NUL-terminated parts (a missing part is empty) */
  char *buf = malloc(n + 3);
  if (!buf) return 0;
  memcpy(buf, d, n);
  buf[n] = buf[n + 1] = buf[n + 2] = 0;
  const char *ladder = buf, *claims = ladder + strlen(ladder) + 1;
  if (claims > buf + n) claims = buf + n + 1;
  const char *sets = claims + strlen(claims) + 1;
  if (sets > buf + n + 1) sets = buf + n + 2;
  int nc;
  const vl_case *const *all = vl_case_all(&nc);
  vl_err err;
  for (int ci = -1; ci < nc; ci++) {
    const vl_case *c = ci < 0 ? NULL : all[ci];
    if (vl_ladder_parse(L, c ? c->id : "fuzz", ladder, claims, "fuzz", &err)) {
      if (!err.msg[0]) die("refused without a message", c ? c->id : "fuzz");
      continue;
    }
    check_ladder(c);
    /* up to 16 assignments, each line as `--set` gets it */
    const char *p = sets;
    for (int k = 0; k < 16 && *p; k++) {
      const char *nl = strchr(p, '\n');
      size_t len = nl ? (size_t)(nl - p) : strlen(p);
      char *a = malloc(len + 1);
      if (!a) break;
      memcpy(a, p, len);
      a[len] = 0;
      err.msg[0] = 0;
      if (vl_ladder_set(L, a, &err) && !err.msg[0]) die("--set refused without a message", a);
      free(a);
      check_ladder(c);
      p += len + (nl ? 1 : 0);
    }
  }
  free(buf);
  return 0;
}
