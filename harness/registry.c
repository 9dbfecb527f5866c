/* The case registry and the check of knob and setting names against a case's declarations
 * (knob parsing is kit/knobs.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "registry.h"

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
