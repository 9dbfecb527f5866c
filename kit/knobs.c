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
vl_status vl_knob_check(const char *key, const char *val, vl_err *e) {
  size_t kl = strlen(key), vl = strlen(val);
  if (kl == 0) return vl_err_set(e, VL_ERR_INVALID, "a knob needs a name (got '=%.40s')", val);
  if (kl >= VL_KNOB_KEY_LEN) {
    return vl_err_set(e, VL_ERR_INVALID, "knob name '%s' is %zu characters long (limit %d)", key, kl,
                      VL_KNOB_KEY_LEN - 1);
  }
  if (vl == 0) {
    return vl_err_set(e, VL_ERR_INVALID,
                      "knob '%s': empty value (an empty value is never meaningful: leave the knob out for its default)",
                      key);
  }
  if (vl >= VL_KNOB_VAL_LEN) {
    return vl_err_set(e, VL_ERR_INVALID, "knob '%s': value is %zu characters long (limit %d)", key, vl,
                      VL_KNOB_VAL_LEN - 1);
  }
  return VL_OK;
}

vl_status vl_knob_set_err(vl_knobs *ks, const char *key, const char *val, vl_err *e) {
  VL_TRY(vl_knob_check(key, val, e));
  size_t vl = strlen(val) + 1; /* lengths checked: the copies below cannot truncate */
  for (int i = 0; i < ks->n; i++)
    if (!strcmp(ks->k[i].key, key)) {
      memcpy(ks->k[i].val, val, vl);
      return VL_OK;
    }
  if (ks->n >= VL_MAX_KNOBS) {
    return vl_err_set(e, VL_ERR_INVALID, "knob '%s': too many knobs (limit %d)", key, VL_MAX_KNOBS);
  }
  memcpy(ks->k[ks->n].key, key, strlen(key) + 1);
  memcpy(ks->k[ks->n].val, val, vl);
  ks->n++;
  return VL_OK;
}

vl_status vl_knob_set(vl_knobs *ks, const char *key, const char *val) { return vl_knob_set_err(ks, key, val, NULL); }

vl_status vl_knobs_apply_list(vl_knobs *ks, const char *list, vl_err *e) {
  if (!*list) return vl_err_set(e, VL_ERR_INVALID, "empty list (expected key=value,key=value)");
  char key[VL_KNOB_KEY_LEN];
  for (const char *p = list;;) {
    const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p);
    const char *eq = memchr(p, '=', (size_t)(end - p));
    if (!eq || eq == p) { return vl_err_set(e, VL_ERR_INVALID, "'%.*s' is not key=value", (int)(end - p), p); }
    if ((size_t)(eq - p) >= sizeof key) {
      return vl_err_set(e, VL_ERR_INVALID, "knob name '%.*s' is %d characters long (limit %zu)", (int)(eq - p), p,
                        (int)(eq - p), sizeof key - 1);
    }
    memcpy(key, p, (size_t)(eq - p));
    key[eq - p] = 0;
    size_t vl = (size_t)(end - eq - 1);
    char *val = malloc(vl + 1);
    if (!val) return vl_err_set(e, VL_ERR_OOM, "out of host memory");
    memcpy(val, eq + 1, vl);
    val[vl] = 0;
    vl_status s = vl_knob_set_err(ks, key, val, e);
    free(val);
    if (s) return s;
    if (!comma) return VL_OK;
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
static const char *value_of(const vl_knobs *k, const char *key, const vl_knob_decl *decl, vl_err *e) {
  const char *v = vl_knob_str(k, key, decl);
  if (!v) vl_err_set(e, VL_ERR_INVALID, "%s: not set, and no default is declared for it", key);
  return v;
}

vl_status vl_knob_int(const vl_knobs *k, const char *key, const vl_knob_decl *decl, long lo, long hi, long *out,
                      vl_err *e) {
  const char *v = value_of(k, key, decl, e);
  if (!v) return VL_ERR_INVALID;
  int64_t x;
  if (vl_parse_i64(v, lo, hi, &x) != VL_PARSE_OK) {
    return vl_err_set(e, VL_ERR_INVALID, "%s = '%s': expected an integer in [%ld, %ld]", key, v, lo, hi);
  }
  *out = (long)x;
  return VL_OK;
}

vl_status vl_knob_double(const vl_knobs *k, const char *key, const vl_knob_decl *decl, double lo, double hi,
                         double *out, vl_err *e) {
  const char *v = value_of(k, key, decl, e);
  if (!v) return VL_ERR_INVALID;
  double x;
  if (vl_parse_f64(v, lo, hi, &x) != VL_PARSE_OK) {
    return vl_err_set(e, VL_ERR_INVALID, "%s = '%s': expected a number in [%g, %g]", key, v, lo, hi);
  }
  *out = x;
  return VL_OK;
}

vl_status vl_knob_int_list(const vl_knobs *k, const char *key, const vl_knob_decl *decl, long lo, long hi, long *out,
                           int max, int *n, vl_err *e) {
  const char *v = value_of(k, key, decl, e);
  if (!v) return VL_ERR_INVALID;
  int64_t x[64];
  int m = 0;
  vl_parse_status st = max > 64 ? VL_PARSE_TOO_MANY : vl_parse_i64_list(v, lo, hi, x, max, &m);
  if (st != VL_PARSE_OK) {
    return vl_err_set(e, VL_ERR_INVALID,
                      "%s = '%s' %s: expected up to %d comma-separated integers in [%ld, %ld], no spaces", key, v,
                      vl_parse_why(st), max, lo, hi);
  }
  for (int i = 0; i < m; i++) out[i] = (long)x[i];
  *n = m;
  return VL_OK;
}

vl_status vl_knob_bool(const vl_knobs *k, const char *key, const vl_knob_decl *decl, int *out, vl_err *e) {
  const char *v = value_of(k, key, decl, e);
  if (!v) return VL_ERR_INVALID;
  if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) {
    *out = 1;
    return VL_OK;
  }
  if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "off")) {
    *out = 0;
    return VL_OK;
  }
  return vl_err_set(e, VL_ERR_INVALID, "%s = '%s': expected true or false", key, v);
}

vl_status vl_knob_bytes(const vl_knobs *k, const char *key, const vl_knob_decl *decl, size_t *out, vl_err *e) {
  const char *v = value_of(k, key, decl, e);
  if (!v) return VL_ERR_INVALID;
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
    return vl_err_set(e, VL_ERR_INVALID, "%s = '%s': expected a size like 24GiB or 22.08GB", key, v);
  }
  return VL_OK;
}
