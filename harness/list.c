/* `vramlab list` (list.h). */
#include "list.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ladder.h"
#include "registry.h"
#include "vramlab/backend.h"

/* The cases to list: all, or the one named (*n = 0 when it is not registered). */
static const vl_case *const *selected(const char *case_id, const vl_case **one, int *n) {
  const vl_case *const *all = vl_case_all(n);
  if (!case_id) return all;
  *one = vl_case_find(case_id);
  *n = *one ? 1 : 0;
  return one;
}

static int unknown_case(const char *case_id) {
  int n;
  const vl_case *const *all = vl_case_all(&n);
  fprintf(stderr, "vramlab: unknown case '%s'; known:", case_id);
  for (int i = 0; i < n; i++) fprintf(stderr, " %s", all[i]->id);
  fprintf(stderr, "\n");
  return 2;
}

static cJSON *knob_json(const vl_knob_decl *d) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", d->name);
  if (d->def) cJSON_AddStringToObject(o, "default", d->def);
  else cJSON_AddNullToObject(o, "default");
  cJSON_AddStringToObject(o, "help", d->help);
  cJSON_AddBoolToObject(o, "rung", (d->where & VL_KNOB_RUNG) != 0);
  cJSON_AddBoolToObject(o, "setting", (d->where & VL_KNOB_SETTING) != 0);
  return o;
}

static cJSON *knobs_obj(const vl_knobs *k) {
  cJSON *o = cJSON_CreateObject();
  for (int i = 0; i < k->n; i++) cJSON_AddStringToObject(o, k->k[i].key, k->k[i].val);
  return o;
}

cJSON *vl_list_json(const char *case_id) {
  const vl_case *one = NULL;
  int n;
  const vl_case *const *cs = selected(case_id, &one, &n);
  if (n == 0) return NULL;
  vl_ladder *L = malloc(sizeof *L); /* ~1 MB: not on the stack */
  if (!L) return NULL;
  cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "cases");
  for (int i = 0; i < n; i++) {
    const vl_case *c = cs[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, o);
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "summary", c->summary);
    cJSON *sc = cJSON_AddArrayToObject(o, "scales");
    for (int j = 0; c->scales[j]; j++) cJSON_AddItemToArray(sc, cJSON_CreateString(c->scales[j]));
    /* the case's declarations, then the settings the harness reads for every case */
    cJSON *kn = cJSON_AddArrayToObject(o, "knobs");
    for (int j = 0; c->knobs[j].name; j++) cJSON_AddItemToArray(kn, knob_json(&c->knobs[j]));
    for (int j = 0; vl_harness_settings[j].name; j++) cJSON_AddItemToArray(kn, knob_json(&vl_harness_settings[j]));
    vl_err err;
    if (vl_ladder_load(L, VRAMLAB_SOURCE_DIR, c->id, &err)) {
      cJSON_AddStringToObject(o, "ladder_error", err.msg);
      continue;
    }
    cJSON_AddItemToObject(o, "setting", knobs_obj(&L->setting));
    cJSON *rs = cJSON_AddArrayToObject(o, "rungs");
    for (int j = 0; j < L->n_rungs; j++) {
      cJSON *r = cJSON_CreateObject();
      cJSON_AddStringToObject(r, "name", L->rungs[j].name);
      cJSON_AddStringToObject(r, "label", L->rungs[j].label);
      cJSON_AddItemToObject(r, "knobs", knobs_obj(&L->rungs[j].knobs)); /* resolved: inherited ones too */
      cJSON_AddItemToArray(rs, r);
    }
  }
  free(L);
  cJSON *dev = cJSON_AddArrayToObject(root, "devices");
  cJSON_AddItemToArray(dev, cJSON_CreateString("cpu"));
  cJSON_AddItemToArray(dev, cJSON_CreateString("plan"));
  if (vl_cuda_available()) cJSON_AddItemToArray(dev, cJSON_CreateString("cuda"));
  return root;
}

/* One case as text: summary, scales, steps; with `knobs`, every knob and setting too. */
static void print_case(const vl_case *c, vl_ladder *L, bool knobs) {
  printf("%-12s %s\n", c->id, c->summary);
  vl_err err;
  if (vl_ladder_load(L, VRAMLAB_SOURCE_DIR, c->id, &err)) { printf("  (ladder: %s)\n", err.msg); return; }
  printf("  scales:");
  for (int j = 0; c->scales[j]; j++) printf(" %s", c->scales[j]);
  printf("\n  steps:\n");
  for (int j = 0; j < L->n_rungs; j++) printf("    %-10s %s\n", L->rungs[j].name, L->rungs[j].label);
  if (!knobs) return;
  const vl_knob_decl *tables[2] = {c->knobs, vl_harness_settings};
  const char *heads[2] = {"knobs (a rung sets them; --set [rung.]key=value)", "settings ([case]; --set key=value)"};
  for (int h = 0; h < 2; h++) {
    printf("  %s:\n", heads[h]);
    unsigned want = h == 0 ? VL_KNOB_RUNG : VL_KNOB_SETTING;
    for (int t = 0; t < 2; t++)
      for (int j = 0; tables[t][j].name; j++) {
        const vl_knob_decl *d = &tables[t][j];
        if (!(d->where & want)) continue;
        const char *now = h == 1 ? vl_knob_get(&L->setting, d->name) : NULL;
        printf("    %-16s %-12s %s", d->name, d->def ? d->def : "-", d->help);
        if (now) printf(" [ladder: %s]", now);
        printf("\n");
      }
  }
}

int vl_cmd_list(const char *case_id, bool json) {
  if (json) {
    cJSON *o = vl_list_json(case_id);
    if (!o) return case_id && !vl_case_find(case_id) ? unknown_case(case_id) : 1;
    char *s = cJSON_Print(o);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
    return 0;
  }
  const vl_case *one = NULL;
  int n;
  const vl_case *const *cs = selected(case_id, &one, &n);
  if (n == 0) return unknown_case(case_id);
  vl_ladder *L = malloc(sizeof *L);
  if (!L) return 1;
  for (int i = 0; i < n; i++) print_case(cs[i], L, case_id != NULL);
  free(L);
  printf("devices: cpu, plan%s\n", vl_cuda_available() ? ", cuda" : " (cuda: no GPU visible)");
  return 0;
}
