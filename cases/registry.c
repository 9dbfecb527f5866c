/* The case registry, the check of knob and setting names against a case's declarations,
 * and helpers shared by the cases (knob parsing is harness/knobs.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "case.h"
#include "vramlab/nn.h"

/* gcc: the build turns -Wformat-truncation off for every file (message buffers elsewhere
 * trip it); in this file every path, name and value copy is length-checked, so a copy that
 * could be cut is an error here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic error "-Wformat-truncation"
#endif

static const vl_case *const all_cases[] = {&vl_case_llm_lora, &vl_case_seg_ckpt, &vl_case_sd_lora, &vl_case_dataloader,
                                             &vl_case_multi_gpu};

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

void vl_case_known_names(const vl_case *c, unsigned where, char *buf, size_t n) {
  const vl_knob_decl *tables[2] = {c->knobs, where & VL_KNOB_SETTING ? vl_harness_settings : NULL};
  buf[0] = 0;
  for (int t = 0; t < 2; t++)
    for (int j = 0; tables[t] && tables[t][j].name; j++) {
      if (!(tables[t][j].where & where)) continue;
      if (buf[0]) strncat(buf, ", ", n - strlen(buf) - 1);
      strncat(buf, tables[t][j].name, n - strlen(buf) - 1);
    }
}

const vl_knob_decl *vl_case_knob(const vl_case *c, const char *name, unsigned where) {
  const vl_knob_decl *d = vl_knob_decl_find(c->knobs, name);
  if (!d && (where & VL_KNOB_SETTING)) d = vl_knob_decl_find(vl_harness_settings, name);
  return d && (d->where & where) ? d : NULL;
}

vl_status vl_case_check_knobs(vl_case_env *env, const vl_case *c, const char *rung, const vl_knobs *k) {
  for (int i = 0; i < k->n; i++) {
    if (vl_case_knob(c, k->k[i].key, VL_KNOB_RUNG)) continue;
    char known[1024];
    vl_case_known_names(c, VL_KNOB_RUNG, known, sizeof known);
    return vl_case_fail(env, VL_ERR_INVALID, "rung '%s': unknown knob '%s' (known: %s)", rung, k->k[i].key, known);
  }
  return VL_OK;
}

vl_status vl_case_check_setting(vl_case_env *env, const vl_case *c, const char *key) {
  if (vl_case_knob(c, key, VL_KNOB_SETTING)) return VL_OK;
  char known[1024];
  vl_case_known_names(c, VL_KNOB_SETTING, known, sizeof known);
  return vl_case_fail(env, VL_ERR_INVALID, "[case]: unknown setting '%s' of %s (known: %s)", key, c->id, known);
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
