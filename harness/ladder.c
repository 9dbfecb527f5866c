/* Ladder and claims files (INI, read with inih). A rung inherits all knobs of the rungs
 * above it, so the file lists only what each rung changes. */
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

const char *vl_knob_get(const vl_knobs *ks, const char *key) {
  for (int i = 0; i < ks->n; i++)
    if (!strcmp(ks->k[i].key, key)) return ks->k[i].val;
  return NULL;
}

int vl_knob_set(vl_knobs *ks, const char *key, const char *val) {
  if (strlen(key) >= sizeof ks->k[0].key || strlen(val) >= sizeof ks->k[0].val) return -1;
  for (int i = 0; i < ks->n; i++)
    if (!strcmp(ks->k[i].key, key)) { snprintf(ks->k[i].val, sizeof ks->k[i].val, "%s", val); return 0; }
  if (ks->n >= VL_MAX_KNOBS) return -1;
  snprintf(ks->k[ks->n].key, sizeof ks->k[0].key, "%s", key);
  snprintf(ks->k[ks->n].val, sizeof ks->k[0].val, "%s", val);
  ks->n++;
  return 0;
}

int vl_knobs_apply_list(vl_knobs *ks, const char *list, char *err, size_t errn) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq || eq == tok) { snprintf(err, errn, "'%s' is not key=value", tok); return -1; }
    *eq = 0;
    if (vl_knob_set(ks, tok, eq + 1)) { snprintf(err, errn, "knob '%s' too long or too many", tok); return -1; }
  }
  return 0;
}

typedef struct { vl_ladder *L; char err[256]; int in_case; } load_ctx;

static int on_ladder(void *user, const char *section, const char *name, const char *value) {
  load_ctx *lc = user;
  vl_ladder *L = lc->L;
  if (!strcmp(section, "case")) return vl_knob_set(&L->setting, name, value) == 0;
  int i = vl_ladder_find(L, section);
  if (i < 0) {
    if (L->n_rungs >= VL_MAX_RUNGS) { snprintf(lc->err, sizeof lc->err, "too many rungs"); return 0; }
    i = L->n_rungs++;
    vl_rung *r = &L->rungs[i];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", section);
    if (i > 0) r->knobs = L->rungs[i - 1].knobs; /* inherit */
    snprintf(r->label, sizeof r->label, "%s", section);
  }
  vl_rung *r = &L->rungs[i];
  if (!strcmp(name, "label")) { snprintf(r->label, sizeof r->label, "%s", value); return 1; }
  if (vl_knob_set(&r->knobs, name, value)) {
    snprintf(lc->err, sizeof lc->err, "rung [%s]: knob '%s' too long", section, name);
    return 0;
  }
  return 1;
}

static vl_claim *claim_get(vl_ladder *L, const char *id) {
  for (int i = 0; i < L->n_claims; i++)
    if (!strcmp(L->claims[i].id, id)) return &L->claims[i];
  if (L->n_claims >= VL_MAX_CLAIMS) return NULL;
  vl_claim *c = &L->claims[L->n_claims++];
  memset(c, 0, sizeof *c);
  snprintf(c->id, sizeof c->id, "%s", id);
  c->article_before = c->article_after = c->lo = c->hi = NAN;
  snprintf(c->kind, sizeof c->kind, "value");
  return c;
}

static int parse_num(const char *v, double *out) {
  char *end;
  *out = strtod(v, &end);
  while (*end == ' ') end++;
  return end != v && !*end;
}

static int on_claims(void *user, const char *section, const char *name, const char *value) {
  load_ctx *lc = user;
  vl_claim *c = claim_get(lc->L, section);
  if (!c) { snprintf(lc->err, sizeof lc->err, "too many claims"); return 0; }
#define STR(f) if (!strcmp(name, #f)) { snprintf(c->f, sizeof c->f, "%s", value); return 1; }
  STR(text) STR(source) STR(metric) STR(unit) STR(kind) STR(note) STR(before) STR(after)
  STR(before_set) STR(after_set) STR(needs)
#undef STR
  double *num = !strcmp(name, "article_before") ? &c->article_before
              : !strcmp(name, "article_after")  ? &c->article_after
              : !strcmp(name, "tol")            ? &c->tol
              : !strcmp(name, "lo")             ? &c->lo
              : !strcmp(name, "hi")             ? &c->hi : NULL;
  if (!num) { snprintf(lc->err, sizeof lc->err, "claim [%s]: unknown key '%s'", section, name); return 0; }
  if (!parse_num(value, num)) {
    snprintf(lc->err, sizeof lc->err, "claim [%s]: %s = '%s' is not a number", section, name, value);
    return 0;
  }
  return 1;
}

int vl_ladder_find(const vl_ladder *L, const char *rung) {
  for (int i = 0; i < L->n_rungs; i++)
    if (!strcmp(L->rungs[i].name, rung)) return i;
  return -1;
}

static int parse_file(const char *path, ini_handler h, load_ctx *lc, char *err, size_t errn) {
  FILE *f = fopen(path, "r");
  if (!f) { snprintf(err, errn, "cannot open %s", path); return -1; }
  int rc = ini_parse_file(f, h, lc);
  fclose(f);
  if (rc != 0) {
    /* inih stops at its line-length limit (200 bytes) with the same code as a syntax error */
    const char *why = lc->err[0] ? lc->err : "malformed line (expected [section], key = value or ; comment)";
    f = rc > 0 ? fopen(path, "r") : NULL;
    char line[4096];
    for (int i = 1; f && fgets(line, sizeof line, f); i++)
      if (i == rc) { if (strlen(line) >= 199) why = "line longer than 199 characters"; break; }
    if (f) fclose(f);
    snprintf(err, errn, "%s:%d: %s", path, rc > 0 ? rc : 0, why);
    return -1;
  }
  return 0;
}

int vl_ladder_load(vl_ladder *L, const char *dir, const char *case_id, char *err, size_t errn) {
  memset(L, 0, sizeof *L);
  snprintf(L->case_id, sizeof L->case_id, "%s", case_id);
  char path[1024];
  load_ctx lc = {.L = L};
  snprintf(path, sizeof path, "%s/cases/%s/ladder.ini", dir, case_id);
  if (parse_file(path, on_ladder, &lc, err, errn)) return -1;
  if (L->n_rungs == 0) { snprintf(err, errn, "%s: no rungs", path); return -1; }
  snprintf(path, sizeof path, "%s/cases/%s/claims.ini", dir, case_id);
  lc.err[0] = 0;
  if (parse_file(path, on_claims, &lc, err, errn)) return -1;
  for (int i = 0; i < L->n_claims; i++) {
    vl_claim *c = &L->claims[i];
    if (!c->metric[0] || !c->after[0]) {
      snprintf(err, errn, "claim [%s]: needs metric and after", c->id);
      return -1;
    }
    if (strcmp(c->kind, "value") && strcmp(c->kind, "ratio") && strcmp(c->kind, "range") &&
        strcmp(c->kind, "ratio_range")) {
      snprintf(err, errn, "claim [%s]: kind '%s' (value, ratio, range or ratio_range)", c->id, c->kind);
      return -1;
    }
    if ((c->before[0] && vl_ladder_find(L, c->before) < 0) || vl_ladder_find(L, c->after) < 0) {
      snprintf(err, errn, "claim [%s]: unknown rung '%s'", c->id,
               vl_ladder_find(L, c->after) < 0 ? c->after : c->before);
      return -1;
    }
  }
  return 0;
}

int vl_ladder_set(vl_ladder *L, const char *a, char *err, size_t errn) {
  const char *eq = strchr(a, '=');
  if (!eq || eq == a) { snprintf(err, errn, "--set '%s': expected key=value or rung.key=value", a); return -1; }
  char key[128];
  snprintf(key, sizeof key, "%.*s", (int)(eq - a), a);
  const char *val = eq + 1;
  char *dot = strchr(key, '.');
  if (!dot) {
    /* a case setting, or a knob for every rung */
    if (vl_knob_get(&L->setting, key)) return vl_knob_set(&L->setting, key, val);
    for (int i = 0; i < L->n_rungs; i++)
      if (vl_knob_set(&L->rungs[i].knobs, key, val)) { snprintf(err, errn, "--set %s: too long", key); return -1; }
    return 0;
  }
  *dot = 0;
  int i = vl_ladder_find(L, key);
  if (i < 0) { snprintf(err, errn, "--set: unknown rung '%s'", key); return -1; }
  const char *k = dot + 1;
  const char *old = vl_knob_get(&L->rungs[i].knobs, k);
  char oldv[96];
  snprintf(oldv, sizeof oldv, "%s", old ? old : "");
  /* rungs below inherit unless they set the knob themselves (same value as before) */
  for (int j = i; j < L->n_rungs; j++) {
    const char *cur = vl_knob_get(&L->rungs[j].knobs, k);
    if (j > i && cur && strcmp(cur, oldv)) break;
    if (vl_knob_set(&L->rungs[j].knobs, k, val)) { snprintf(err, errn, "--set %s: too long", k); return -1; }
  }
  return 0;
}
