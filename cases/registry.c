/* The case registry and knob parsing shared by all cases. */
#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "case.h"
#include "parse.h"
#include "vramlab/nn.h"

/* gcc: the build turns -Wformat-truncation off for every file (message buffers elsewhere
 * trip it); in this file every path, name and value copy is length-checked, so a copy that
 * could be cut is an error here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic error "-Wformat-truncation"
#endif

static const vl_case *const all_cases[] = {&vl_case_llm_lora, &vl_case_seg_ckpt, &vl_case_dataloader};

const vl_case *const *vl_case_all(int *n) {
  *n = (int)(sizeof all_cases / sizeof *all_cases);
  return all_cases;
}

const vl_case *vl_case_find(const char *id) {
  int n;
  const vl_case *const *a = vl_case_all(&n);
  for (int i = 0; i < n; i++)
    if (!strcmp(a[i]->id, id)) return a[i];
  return NULL;
}

int vl_case_check_knobs(const vl_case *c, const char *rung, const vl_knobs *k, char *err, size_t errn) {
  for (int i = 0; i < k->n; i++) {
    int ok = 0;
    for (int j = 0; c->knobs[j]; j++) ok |= !strcmp(c->knobs[j], k->k[i].key);
    if (!ok) {
      char known[512] = "";
      for (int j = 0; c->knobs[j]; j++) {
        strncat(known, c->knobs[j], sizeof known - strlen(known) - 1);
        if (c->knobs[j + 1]) strncat(known, ", ", sizeof known - strlen(known) - 1);
      }
      snprintf(err, errn, "rung '%s': unknown knob '%s' (known: %s)", rung, k->k[i].key, known);
      return -1;
    }
  }
  return 0;
}

int vl_knob_int(const vl_knobs *k, const char *key, long def, long lo, long hi, long *out, char *err, size_t errn) {
  const char *v = vl_knob_get(k, key);
  if (!v) { *out = def; return 0; }
  int64_t x;
  if (vl_parse_i64(v, lo, hi, &x) != VL_PARSE_OK) {
    snprintf(err, errn, "%s = '%s': expected an integer in [%ld, %ld]", key, v, lo, hi);
    return -1;
  }
  *out = (long)x;
  return 0;
}

int vl_knob_double(const vl_knobs *k, const char *key, double def, double lo, double hi, double *out, char *err, size_t errn) {
  const char *v = vl_knob_get(k, key);
  if (!v) { *out = def; return 0; }
  double x;
  if (vl_parse_f64(v, lo, hi, &x) != VL_PARSE_OK) {
    snprintf(err, errn, "%s = '%s': expected a number in [%g, %g]", key, v, lo, hi);
    return -1;
  }
  *out = x;
  return 0;
}

int vl_knob_int_list(const vl_knobs *k, const char *key, const char *def, long lo, long hi, long *out, int max,
                     int *n, char *err, size_t errn) {
  const char *v = vl_knob_get(k, key);
  if (!v) v = def;
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

int vl_knob_bool(const vl_knobs *k, const char *key, int def, int *out, char *err, size_t errn) {
  const char *v = vl_knob_get(k, key);
  if (!v) { *out = def; return 0; }
  if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) { *out = 1; return 0; }
  if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "off")) { *out = 0; return 0; }
  snprintf(err, errn, "%s = '%s': expected true or false", key, v);
  return -1;
}

int vl_knob_bytes(const vl_knobs *k, const char *key, const char *def, size_t *out, char *err, size_t errn) {
  const char *v = vl_knob_get(k, key);
  if (!v) v = def;
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

double vl_bench_sgemm(int n, int reps) {
  vl_ctx *c;
  if (vl_ctx_create(&c, VL_DEV_CPU, VL_NO_CAP)) return 0;
  vl_tensor a, b, d;
  double best = 0;
  if (!vl_tensor_alloc2(c, &a, VL_F32, VL_MEM_TEMP, n, n) &&
      !vl_tensor_alloc2(c, &b, VL_F32, VL_MEM_TEMP, n, n) &&
      !vl_tensor_alloc2(c, &d, VL_F32, VL_MEM_TEMP, n, n)) {
    vl_rng r;
    vl_rng_seed(&r, 3);
    float *pa = a.data, *pb = b.data;
    for (int64_t i = 0; i < (int64_t)n * n; i++) { pa[i] = vl_rng_normal(&r); pb[i] = vl_rng_normal(&r); }
    for (int i = 0; i < reps + 1; i++) {
      vl_gemm g = {.M = n, .N = n, .K = n, .alpha = 1, .beta = 0, .A = &a, .lda = n, .B = &b,
                   .ldb = n, .C = &d, .ldc = n, .batch = 1};
      double t0 = vl_now();
      vl_gemm_run(c, &g);
      double dt = vl_now() - t0;
      double f = 2.0 * n * (double)n * n / dt;
      if (i > 0 && f > best) best = f; /* first call warms up threads and pages */
    }
  }
  vl_ctx_destroy(c);
  return best;
}

/* ---- helpers shared by the cases ------------------------------------------------------- */

cJSON *vl_case_cats_json(const size_t *v) {
  cJSON *o = cJSON_CreateObject();
  for (int i = 0; i < VL_MEM_NCAT; i++)
    cJSON_AddNumberToObject(o, vl_mem_cat_name((vl_mem_cat)i), (double)v[i]);
  return o;
}

void *vl_case_pinned_alloc(void *user, size_t n) {
  vl_ctx *c = user;
  return c->be->host_alloc(c, n, true);
}

void vl_case_pinned_free(void *user, void *p) {
  vl_ctx *c = user;
  c->be->host_free(c, p, true);
}

void vl_case_gen_progress(int64_t done, int64_t total, void *user) {
  (void)user;
  if (done == total || done % 64 == 0)
    vl_progress("  data gen %lld/%lld", (long long)done, (long long)total);
}

void vl_case_linfit(const double *x, const double *y, int n, double *a, double *b, double *r2) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int i = 0; i < n; i++) { sx += x[i]; sy += y[i]; sxx += x[i] * x[i]; sxy += x[i] * y[i]; }
  double den = n * sxx - sx * sx;
  *b = den != 0 ? (n * sxy - sx * sy) / den : 0;
  *a = n ? (sy - *b * sx) / n : 0;
  double my = n ? sy / n : 0, ss_tot = 0, ss_res = 0;
  for (int i = 0; i < n; i++) {
    double e = y[i] - (*a + *b * x[i]);
    ss_res += e * e;
    ss_tot += (y[i] - my) * (y[i] - my);
  }
  *r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : 1.0;
}
