/* Knob declarations and typed knob reads (knobs.h). */
#include "knobs.h"

#include <float.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "parse.h"
#include "vramlab/core.h" /* vl_parse_bytes: the engine's size parser (24GiB, 22.08GB) */

const vl_knob_decl vl_harness_settings[] = {
    {"title", NULL, "the report's title (default: the case's summary)", VL_KNOB_SETTING},
    {"reps", "2", "whole ladder repetitions of a run, in interleaved order (1..100)", VL_KNOB_SETTING},
    {NULL, NULL, NULL, 0},
};

const vl_knob_decl *vl_knob_decl_find(const vl_knob_decl *decl, const char *name) {
  for (int i = 0; decl && decl[i].name; i++)
    if (!strcmp(decl[i].name, name)) return &decl[i];
  return NULL;
}

const char *vl_knob_str(const vl_knobs *k, const char *key, const vl_knob_decl *decl) {
  const char *v = vl_knob_get(k, key);
  if (v) return v;
  const vl_knob_decl *d = vl_knob_decl_find(decl, key);
  return d ? d->def : NULL;
}

/* The value to parse: the knob's, else its declared default; NULL with a message when
 * neither (a table that misses a row must fail loudly, not read as 0). */
static const char *value_of(const vl_knobs *k, const char *key, const vl_knob_decl *decl, char *err,
                            size_t errn) {
  const char *v = vl_knob_str(k, key, decl);
  if (!v) snprintf(err, errn, "%s: not set, and no default is declared for it", key);
  return v;
}

int vl_knob_int(const vl_knobs *k, const char *key, const vl_knob_decl *decl, long lo, long hi, long *out,
                char *err, size_t errn) {
  const char *v = value_of(k, key, decl, err, errn);
  if (!v) return -1;
  int64_t x;
  if (vl_parse_i64(v, lo, hi, &x) != VL_PARSE_OK) {
    snprintf(err, errn, "%s = '%s': expected an integer in [%ld, %ld]", key, v, lo, hi);
    return -1;
  }
  *out = (long)x;
  return 0;
}

int vl_knob_double(const vl_knobs *k, const char *key, const vl_knob_decl *decl, double lo, double hi,
                   double *out, char *err, size_t errn) {
  const char *v = value_of(k, key, decl, err, errn);
  if (!v) return -1;
  double x;
  if (vl_parse_f64(v, lo, hi, &x) != VL_PARSE_OK) {
    snprintf(err, errn, "%s = '%s': expected a number in [%g, %g]", key, v, lo, hi);
    return -1;
  }
  *out = x;
  return 0;
}

int vl_knob_int_list(const vl_knobs *k, const char *key, const vl_knob_decl *decl, long lo, long hi, long *out,
                     int max, int *n, char *err, size_t errn) {
  const char *v = value_of(k, key, decl, err, errn);
  if (!v) return -1;
  int64_t x[64];
  int m = 0;
  vl_parse_status st = max > 64 ? VL_PARSE_TOO_MANY : vl_parse_i64_list(v, lo, hi, x, max, &m);
  if (st != VL_PARSE_OK) {
    snprintf(err, errn, "%s = '%s' %s: expected up to %d comma-separated integers in [%ld, %ld], no spaces", key, v,
             vl_parse_why(st), max, lo, hi);
    return -1;
  }
  for (int i = 0; i < m; i++) out[i] = (long)x[i];
  *n = m;
  return 0;
}

int vl_knob_bool(const vl_knobs *k, const char *key, const vl_knob_decl *decl, int *out, char *err, size_t errn) {
  const char *v = value_of(k, key, decl, err, errn);
  if (!v) return -1;
  if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) { *out = 1; return 0; }
  if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "off")) { *out = 0; return 0; }
  snprintf(err, errn, "%s = '%s': expected true or false", key, v);
  return -1;
}

int vl_knob_bytes(const vl_knobs *k, const char *key, const vl_knob_decl *decl, size_t *out, char *err,
                  size_t errn) {
  const char *v = value_of(k, key, decl, err, errn);
  if (!v) return -1;
  /* vl_parse_bytes reads the number with strtod, which also takes " 24GiB", "0x18GiB" and
   * "infGB": the number part must be a plain decimal first (the unit may follow a space) */
  size_t n = strspn(v, "0123456789.eE+-");
  while (n > 0 && (v[n - 1] == 'e' || v[n - 1] == 'E')) n--; /* "24E" is no exponent */
  char num[64];
  double x;
  bool plain = n > 0 && n < sizeof num;
  if (plain) {
    memcpy(num, v, n);
    num[n] = 0;
    plain = vl_parse_f64(num, 0, DBL_MAX, &x) == VL_PARSE_OK;
  }
  const char *u = v + n; /* then spaces and a unit of letters only ("0x18GiB" is not 0 x 18GiB) */
  while (*u == ' ') u++;
  for (; plain && *u; u++) plain = (*u >= 'a' && *u <= 'z') || (*u >= 'A' && *u <= 'Z');
  if (!plain || vl_parse_bytes(v, out) || *out == 0) {
    snprintf(err, errn, "%s = '%s': expected a size like 24GiB or 22.08GB", key, v);
    return -1;
  }
  return 0;
}
