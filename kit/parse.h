/* Strict number parsing for everything a person types: command-line options, --set knobs
 * and INI values. One parser, so "1e3", "90abc", " 7", "" and 4294967297 are refused the
 * same way everywhere instead of being read as 1, 90, 7, 0 and 1 by atoi. Leaf module: no
 * dependencies beyond libc, so the harness, the cases and the fuzzers may all use it. */
#ifndef VRAMLAB_PARSE_H
#define VRAMLAB_PARSE_H

#include <stdint.h>

typedef enum {
  VL_PARSE_OK = 0,
  VL_PARSE_EMPTY,    /* "" (or an empty item of a list) */
  VL_PARSE_SYNTAX,   /* not a number: junk, whitespace, a sign alone, hex */
  VL_PARSE_RANGE,    /* a number, but outside [lo, hi] or outside the type (ERANGE) */
  VL_PARSE_TOO_MANY, /* a list with more items than the caller has room for */
} vl_parse_status;

/* A decimal integer: optional sign, digits, nothing else (no whitespace, no "0x", no
 * exponent), inside [lo, hi]. *out is written only on VL_PARSE_OK. */
vl_parse_status vl_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);

/* A decimal floating-point number ("3e-3", "-0.5", "12."), inside [lo, hi]. NaN is never
 * accepted; "inf"/"infinity" only where the range reaches it (lo = -INFINITY or
 * hi = INFINITY): a caller asks for infinities by passing infinite bounds. Hex floats,
 * whitespace, trailing junk and values that overflow or underflow a double are refused. */
vl_parse_status vl_parse_f64(const char *s, double lo, double hi, double *out);

/* Comma-separated integers ("0,1,2,4"), each as vl_parse_i64: no empty items, no spaces,
 * at most max items. *n is written only on VL_PARSE_OK (out[] may hold a prefix after a
 * failure). */
vl_parse_status vl_parse_i64_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int max,
                                  int *n);

/* What went wrong, for messages: "is empty", "is not a number", ... */
const char *vl_parse_why(vl_parse_status st);

#endif
