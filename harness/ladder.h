/* The driver's ladders and claims (INI): cases/<id>/ladder.ini and claims.ini loaded into
 * rungs of resolved knobs and claims to judge (ladder.c). */
#ifndef VRAMLAB_LADDER_H
#define VRAMLAB_LADDER_H

#include <stdbool.h>
#include <stddef.h>

#include "kit/case.h" /* vl_knobs, VL_MAX_RUNGS */

#define VL_MAX_CLAIMS 48

typedef struct {
  char name[32];
  char label[160];
  vl_knobs knobs; /* resolved: every knob of the rungs above, then its own */
} vl_rung;

/* Where a claim's numbers come from (docs/architecture.md "Verdicts"): planned (exact, full
 * scale, this engine), measured (this device, run scale), modeled (an assumed accelerator or
 * time model: `assumption` names it), configured (echoes a setting: a claim judged on it
 * holds "by construction" and is never counted as a hold). */
typedef enum { VL_BASIS_PLANNED = 0, VL_BASIS_MEASURED, VL_BASIS_MODELED, VL_BASIS_CONFIGURED } vl_basis;
const char *vl_basis_name(vl_basis b);

/* How the spread of a measured value is known: from the repetitions (each rung's runs; a rung
 * with one run gets VL_NOISE_ONE_RUN, kit/case.h), none (an exact count: bytes, FLOPs, a
 * seeded deterministic value), or at least a stated relative floor (noise = 0.02). */

typedef struct {
  char id[40], text[200], source[64], metric[40], unit[16], kind[16], note[240];
  char before[32], after[32], before_set[160], after_set[160];
  char needs[16]; /* device the measurement needs ("cuda"): judged only there */
  double article_before, article_after, tol, lo, hi;
  vl_basis basis;
  bool suite;            /* scope = suite: a check of the suite's own implementation, no article's */
  bool noise_exact;      /* noise = exact */
  double noise_floor;    /* noise = <fraction>: the least relative spread; 0 = from the runs */
  char qualifier[40];    /* a stand-in named in the verdict ("on CPU ranks") */
  char assumption[160];  /* modeled: the model's assumption; measured stand-in: what it stands for */
  char shown_with[40];   /* another claim's id: this one is its second number, in its row */
  char reason[200];      /* kind = none: why the claim is not measurable here */
  char finding[200];     /* the first screen's line for this claim ({before} {after} {ratio}) */
  int rank;              /* findings in rank order (1 first); 0: not a finding */
} vl_claim;

typedef struct {
  char case_id[40];
  vl_knobs setting;         /* the [case] section */
  vl_rung rungs[VL_MAX_RUNGS];
  int n_rungs;
  vl_claim claims[VL_MAX_CLAIMS];
  int n_claims;
  /* claims.ini [_report]: where = the first screen's "where it ran" line; articles =
   * "000:24 001:3", the checkable claims about this case in each source article */
  char where[200], articles[80];
} vl_ladder;

/* Load cases/<id>/ladder.ini and claims.ini from `dir`. e gets a readable message with
 * the file and line. */
vl_status vl_ladder_load(vl_ladder *L, const char *dir, const char *case_id, vl_err *e);
/* The same from memory: messages name "<name>/ladder.ini:LINE" and "<name>/claims.ini:LINE".
 * Strict: a malformed or over-long line, a key outside a section, an empty value, a
 * duplicate key, a reopened or empty section, a name longer than its field, more rungs,
 * knobs or claims than the limits, a claim number that is not a finite decimal, and (for a
 * registered case) a claim metric the case does not write are each an error. */
vl_status vl_ladder_parse(vl_ladder *L, const char *case_id, const char *ladder_text, const char *claims_text,
                          const char *name, vl_err *e);
/* --set overrides: "key=value" sets the [case] setting; "rung.key=value" one rung (and the
 * rungs below it, which inherit). */
vl_status vl_ladder_set(vl_ladder *L, const char *assignment, vl_err *e);
int vl_ladder_find(const vl_ladder *L, const char *rung);

#endif
