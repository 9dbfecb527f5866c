/* The cases' one error convention (vl_case_fail: a status returned, its message kept once in
 * the env's vl_err), and small helpers every case may use. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "case.h"
#include "vramlab/nn.h"

vl_status vl_case_fail(vl_case_env *env, vl_status s, const char *fmt, ...) {
  if (env) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(env->err.msg, sizeof env->err.msg, fmt, ap);
    va_end(ap);
  }
  return s;
}

/* A rung's knobs as a results file holds them, read back for a side run. */
vl_status vl_case_knobs_of(vl_case_env *env, const cJSON *rung, vl_knobs *k) {
  memset(k, 0, sizeof *k);
  const cJSON *it;
  cJSON_ArrayForEach(it, cJSON_GetObjectItem(rung, "knobs"))
    if (cJSON_IsString(it)) VL_TRY(vl_knob_set_err(k, it->string, it->valuestring, &env->err));
  return VL_OK;
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
