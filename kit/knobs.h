/* Knobs: their storage (a rung's or the setting's key=value pairs), their declarations and
 * typed reads; the one module cases include to read their knobs.
 * A case declares every knob a rung may set and every [case] setting it reads once, in a
 * table of vl_knob_decl (name, default as a user would type it, one line of help); the
 * helpers below read a knob and, when it is absent, parse the declared default through the
 * same code, so a default lives in one place and is checked like a typed value.
 * Leaf module of the kit: depends only on parse.h and the engine core's size parser. */
#ifndef VRAMLAB_KNOBS_H
#define VRAMLAB_KNOBS_H

#include <stddef.h>

#include "vramlab/core.h" /* vl_status, vl_err */

#define VL_MAX_KNOBS 48

/* A knob value holds a real path (data_dir). 1024, not PATH_MAX: a ladder is 17 knob sets
 * of 48 knobs held by value (on the stack in main.c and the tests, copied for side plans
 * and inheritance), so 4096 would make it ~3.4 MB; at 1024 it is ~0.9 MB. Heap strings
 * would make vl_knobs need an owner and a free everywhere it is copied. A longer value is
 * refused with a message naming the knob and the limit, never cut. */
#define VL_KNOB_KEY_LEN 40
#define VL_KNOB_VAL_LEN 1024
typedef struct { char key[VL_KNOB_KEY_LEN]; char val[VL_KNOB_VAL_LEN]; } vl_knob;
typedef struct { vl_knob k[VL_MAX_KNOBS]; int n; } vl_knobs;

const char *vl_knob_get(const vl_knobs *ks, const char *key); /* NULL when absent */
/* Set (or replace) key. Refused: an empty key or value (an empty value is never meaningful:
 * leave the knob out for its default), a key or value longer than the limits, more than
 * VL_MAX_KNOBS knobs. VL_OK, or VL_ERR_INVALID with a message naming the knob and the limit
 * in e (e may be NULL). */
/* Whether key=val may be stored at all: the refusals of vl_knob_set_err but the count. */
vl_status vl_knob_check(const char *key, const char *val, vl_err *e);
vl_status vl_knob_set_err(vl_knobs *ks, const char *key, const char *val, vl_err *e);
vl_status vl_knob_set(vl_knobs *ks, const char *key, const char *val); /* same, no message */
/* Apply "k=v,k=v" on top of ks; VL_OK, or a status with its message in e. */
vl_status vl_knobs_apply_list(vl_knobs *ks, const char *list, vl_err *e);

/* Where a declared name may be set (a bit set: llm-lora's batch is both). */
enum { VL_KNOB_RUNG = 1, VL_KNOB_SETTING = 2 };

typedef struct {
  const char *name;
  const char *def;  /* the default, as a user would type it; NULL: none (absent means unset) */
  const char *help; /* one line */
  unsigned where;   /* VL_KNOB_RUNG and/or VL_KNOB_SETTING */
} vl_knob_decl;

/* The entry of a {NULL}-terminated table named name (NULL when not declared). */
const vl_knob_decl *vl_knob_decl_find(const vl_knob_decl *decl, const char *name);

/* Settings the harness itself reads for every case (title, reps): declared here once. */
extern const vl_knob_decl vl_harness_settings[];

/* The value of key in k, else its declared default (NULL when neither). */
const char *vl_knob_str(const vl_knobs *k, const char *key, const vl_knob_decl *decl);

/* Typed reads of key from k, falling back to the default declared for key in decl. Return
 * VL_OK, or VL_ERR_INVALID with a message naming the knob and value in e; a key absent
 * from k that decl does not declare with a default is an error too (a programmer's: the
 * table misses a row). */
vl_status vl_knob_int(const vl_knobs *k, const char *key, const vl_knob_decl *decl, long lo, long hi, long *out,
                vl_err *e);
vl_status vl_knob_double(const vl_knobs *k, const char *key, const vl_knob_decl *decl, double lo, double hi,
                   double *out, vl_err *e);
vl_status vl_knob_bool(const vl_knobs *k, const char *key, const vl_knob_decl *decl, int *out, vl_err *e);
vl_status vl_knob_bytes(const vl_knobs *k, const char *key, const vl_knob_decl *decl, size_t *out, vl_err *e);
/* Comma-separated integers in [lo, hi] ("0,1,2,4"), at most max of them, into out[0 .. *n). */
vl_status vl_knob_int_list(const vl_knobs *k, const char *key, const vl_knob_decl *decl, long lo, long hi, long *out,
                     int max, int *n, vl_err *e);

#endif
