/* Knob storage, declarations and typed knob reads (knobs.h). */
#include "knobs.h"

#include <float.h>
#include <stdlib.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "parse.h"
#include "vramlab/core.h" /* vl_parse_bytes: the engine's size parser (24GiB, 22.08GB) */

/* gcc: the build turns -Wformat-truncation off for every file (message buffers elsewhere
 * trip it); in this file every name and value copy is length-checked, so a copy that could
 * be cut is an error here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic error "-Wformat-truncation"
#endif

/* ---- storage ----------------------------------------------------------------------------- */

const char *vl_knob_get(const vl_knobs *ks, const char *key) {
  for (int i = 0; i < ks->n; i++)
    if (!strcmp(ks->k[i].key, key)) return ks->k[i].val;
  return NULL;
}

/* Whether key=val may be stored at all (a message naming the knob and the limit if not). */
int vl_knob_check(const char *key, const char *val, char *err, size_t errn) {
  size_t kl = strlen(key), vl = strlen(val);
  if (kl == 0) { snprintf(err, errn, "a knob needs a name (got '=%.40s')", val); return -1; }
  if (kl >= VL_KNOB_KEY_LEN) {
    snprintf(err, errn, "knob name '%s' is %zu characters long (limit %d)", key, kl, VL_KNOB_KEY_LEN - 1);
    return -1;
  }
  if (vl == 0) {
    snprintf(err, errn, "knob '%s': empty value (an empty value is never meaningful: leave the knob out for its default)", key);
    return -1;
  }
  if (vl >= VL_KNOB_VAL_LEN) {
    snprintf(err, errn, "knob '%s': value is %zu characters long (limit %d)", key, vl, VL_KNOB_VAL_LEN - 1);
    return -1;
  }
  return 0;
}

int vl_knob_set_err(vl_knobs *ks, const char *key, const char *val, char *err, size_t errn) {
  char none[1];
  if (!err || !errn) { err = none; errn = sizeof none; }
  if (vl_knob_check(key, val, err, errn)) return -1;
  size_t vl = strlen(val) + 1; /* lengths checked: the copies below cannot truncate */
  for (int i = 0; i < ks->n; i++)
    if (!strcmp(ks->k[i].key, key)) { memcpy(ks->k[i].val, val, vl); return 0; }
  if (ks->n >= VL_MAX_KNOBS) {
    snprintf(err, errn, "knob '%s': too many knobs (limit %d)", key, VL_MAX_KNOBS);
    return -1;
  }
  memcpy(ks->k[ks->n].key, key, strlen(key) + 1);
  memcpy(ks->k[ks->n].val, val, vl);
  ks->n++;
  return 0;
}

int vl_knob_set(vl_knobs *ks, const char *key, const char *val) {
  return vl_knob_set_err(ks, key, val, NULL, 0);
}

int vl_knobs_apply_list(vl_knobs *ks, const char *list, char *err, size_t errn) {
  if (!*list) { snprintf(err, errn, "empty list (expected key=value,key=value)"); return -1; }
  char key[VL_KNOB_KEY_LEN], e2[256];
  for (const char *p = list;;) {
    const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p);
    const char *eq = memchr(p, '=', (size_t)(end - p));
    if (!eq || eq == p) {
      snprintf(err, errn, "'%.*s' is not key=value", (int)(end - p), p);
      return -1;
    }
    if ((size_t)(eq - p) >= sizeof key) {
      snprintf(err, errn, "knob name '%.*s' is %d characters long (limit %zu)", (int)(eq - p), p, (int)(eq - p),
               sizeof key - 1);
      return -1;
    }
    memcpy(key, p, (size_t)(eq - p));
    key[eq - p] = 0;
    size_t vl = (size_t)(end - eq - 1);
    char *val = malloc(vl + 1);
    if (!val) { snprintf(err, errn, "out of host memory"); return -1; }
    memcpy(val, eq + 1, vl);
    val[vl] = 0;
    int rc = vl_knob_set_err(ks, key, val, e2, sizeof e2);
    free(val);
    if (rc) { snprintf(err, errn, "%s", e2); return -1; }
    if (!comma) return 0;
    p = comma + 1;
  }
}

/* ---- declarations and typed reads --------------------------------------------------- */

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
