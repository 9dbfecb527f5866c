/* Ladder and claims files (INI, read with inih). A rung inherits all knobs of the rungs
 * above it, so the file lists only what each rung changes.
 *
 * The files are read strictly: inih alone lets the last of two equal keys win, merges a
 * section that is opened twice, cuts long names to its buffers and takes "nan" for a
 * number. inih (Debian's build) gives its handler no line number, so the text is fed to
 * ini_parse_stream through our own line reader: the reader knows the line inih is on,
 * sees every section header (also of an empty section), and refuses an over-long line
 * itself instead of letting inih split it. */
#include <float.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/parse.h"
#include "ladder.h"
#include "registry.h" /* vl_case_find: the metrics and knobs a registered case declares */

/* gcc: the build turns -Wformat-truncation off for every file (message buffers elsewhere
 * trip it); in this file every path, name and value copy is length-checked, so a copy that
 * could be cut is an error here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic error "-Wformat-truncation"
#endif

/* ---- the line reader and the strict checks common to both files ---------------------- */

#define LINE_MAX_CHARS 199 /* inih's line buffer is 200 bytes (INI_MAX_LINE) */
#define MAX_SECTIONS 64    /* more than [case] + VL_MAX_RUNGS or VL_MAX_CLAIMS: a limit fails first */
#define MAX_KEYS 64        /* per section; more than VL_MAX_KNOBS + label or a claim's keys */
#define NAME_BUF 64        /* inih cuts section and key names at 49 characters */

typedef struct load_ctx load_ctx;
struct load_ctx {
  vl_ladder *L;
  const vl_case *vc; /* the registered case of L->case_id, or NULL */
  const char *file;  /* for messages: "<name>/ladder.ini" */
  const char *what;  /* "rung" or "claim": what a section is */
  size_t name_max;   /* longest section name the file's struct holds */
  /* reader */
  const char *text;
  size_t pos;
  int line; /* the line last handed to inih */
  const char *cur;
  size_t cur_len;
  /* sections, in file order; the current one is the last */
  char sect[MAX_SECTIONS][NAME_BUF];
  int sect_line[MAX_SECTIONS], n_sect;
  int sect_keys; /* keys of the current section */
  char keys[MAX_KEYS][NAME_BUF];
  int key_line[MAX_KEYS];
  /* claims: the lines their checks after parsing point at */
  int claim_line[VL_MAX_CLAIMS], metric_line[VL_MAX_CLAIMS], before_line[VL_MAX_CLAIMS],
      after_line[VL_MAX_CLAIMS];
  bool basis_seen[VL_MAX_CLAIMS];
  /* first error; err_seen: the line being read when it was found (an empty section is
   * found at the next header or after the last line) */
  bool failed;
  int err_line, err_seen;
  char err[512];
};

__attribute__((format(printf, 3, 4))) static int fail_at(load_ctx *c, int line, const char *fmt, ...) {
  if (c->failed) return 0;
  c->failed = true;
  c->err_line = line;
  c->err_seen = c->line;
  char msg[448];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(c->err, sizeof c->err, "%s:%d: %s", c->file, line, msg);
  return 0; /* what an inih handler returns on error */
}

static bool name_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
}

static bool blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\f' || ch == '\v'; }

/* Line 1 may start with a UTF-8 byte-order mark, which inih skips. */
static const char *skip_bom(const load_ctx *c, const char *s) {
  return c->line == 1 && !strncmp(s, "\xEF\xBB\xBF", 3) ? s + 3 : s;
}

/* The section just ended must have had a key: inih calls the handler only for keys, so an
 * empty section would otherwise vanish (a rung that silently does not exist). */
static void end_section(load_ctx *c) {
  if (c->n_sect > 0 && c->sect_keys == 0)
    fail_at(c, c->sect_line[c->n_sect - 1], "section [%s] has no keys", c->sect[c->n_sect - 1]);
}

/* A "[name]" line: must start the line, name in [A-Za-z0-9_-] and short enough, nothing
 * after "]" but a comment, not seen before in this file. */
static void on_header(load_ctx *c, const char *line) {
  const char *close = strchr(line, ']');
  if (!close) return; /* inih reports the malformed line */
  size_t n = (size_t)(close - line - 1);
  for (const char *p = close + 1; *p && *p != ';' && *p != '#'; p++)
    if (!blank(*p)) { fail_at(c, c->line, "text after the section header '%.*s'", (int)(close - line + 1), line); return; }
  if (n == 0) { fail_at(c, c->line, "empty section name"); return; }
  for (size_t i = 0; i < n; i++)
    if (!name_char(line[1 + i])) {
      fail_at(c, c->line, "section name '%.*s': use letters, digits, '_' and '-' only", (int)n, line + 1);
      return;
    }
  if (n > c->name_max) {
    fail_at(c, c->line, "%s name '%.*s' is %zu characters long (limit %zu)", c->what, (int)n, line + 1, n, c->name_max);
    return;
  }
  end_section(c);
  if (c->failed) return;
  for (int i = 0; i < c->n_sect; i++)
    if (strlen(c->sect[i]) == n && !memcmp(c->sect[i], line + 1, n)) {
      fail_at(c, c->line, "section [%s] reopened (first at line %d): keep each section in one place", c->sect[i],
              c->sect_line[i]);
      return;
    }
  if (c->n_sect >= MAX_SECTIONS) { fail_at(c, c->line, "more than %d sections", MAX_SECTIONS); return; }
  memcpy(c->sect[c->n_sect], line + 1, n);
  c->sect[c->n_sect][n] = 0;
  c->sect_line[c->n_sect++] = c->line;
  c->sect_keys = 0;
}

/* inih's fgets-like reader over c->text: one line per call, so inih's line number and
 * ours agree. Returns NULL at the end of the text or after the first error (inih then
 * stops: later lines cannot make the first error clearer). */
static char *read_line(char *str, int num, void *stream) {
  load_ctx *c = stream;
  if (c->failed) return NULL;
  if (!c->text[c->pos]) {
    c->line++; /* past the last line: inih has seen all of them */
    end_section(c);
    return NULL;
  }
  const char *p = c->text + c->pos, *nl = strchr(p, '\n');
  size_t len = nl ? (size_t)(nl - p) : strlen(p);
  c->pos += len + (nl ? 1 : 0);
  c->line++;
  c->cur = p;
  c->cur_len = len;
  size_t limit = (size_t)num - 1 < LINE_MAX_CHARS ? (size_t)num - 1 : LINE_MAX_CHARS;
  if (len > limit) {
    fail_at(c, c->line, "line is %zu characters long (limit %zu)", len, limit);
    return NULL;
  }
  memcpy(str, p, len);
  str[len] = 0;
  const char *s = skip_bom(c, str), *t = s;
  while (blank(*t)) t++;
  if (*t == '[') {
    if (t != s) { fail_at(c, c->line, "a section header must start its line"); return NULL; }
    on_header(c, t);
    if (c->failed) return NULL;
  }
  return str;
}

/* What every key line must satisfy: inside a section, on its own line (not an indented
 * continuation of the previous value, which inih would append as a second value of the
 * same key), a name that fits, a value, and no earlier key of the same name. */
static int check_key(load_ctx *c, const char *section, const char *name, const char *value) {
  if (c->n_sect == 0) return fail_at(c, c->line, "key '%s' before any [section]", name);
  if (strcmp(section, c->sect[c->n_sect - 1]))
    return fail_at(c, c->line, "malformed section header before this line");
  /* the key as written on this line: up to '=' or ':', trailing blanks dropped */
  char line[LINE_MAX_CHARS + 1];
  memcpy(line, c->cur, c->cur_len);
  line[c->cur_len] = 0;
  const char *s = skip_bom(c, line);
  while (blank(*s)) s++;
  const char *e = strpbrk(s, "=:");
  size_t n = e ? (size_t)(e - s) : 0;
  while (n > 0 && blank(s[n - 1])) n--;
  if (n >= VL_KNOB_KEY_LEN)
    return fail_at(c, c->line, "key '%.*s' is %zu characters long (limit %d)", (int)n, s, n, VL_KNOB_KEY_LEN - 1);
  if (!e || n != strlen(name) || memcmp(s, name, n))
    return fail_at(c, c->line, "an indented line continues the value of '%s': a value must fit on its line", name);
  if (!*value)
    return fail_at(c, c->line, "'%s' is empty (an empty value is never meaningful: leave the key out)", name);
  for (int i = 0; i < c->sect_keys && i < MAX_KEYS; i++)
    if (!strcmp(c->keys[i], name))
      return fail_at(c, c->line, "duplicate key '%s' in [%s] (first at line %d)", name, section, c->key_line[i]);
  if (c->sect_keys >= MAX_KEYS) return fail_at(c, c->line, "more than %d keys in [%s]", MAX_KEYS, section);
  snprintf(c->keys[c->sect_keys], NAME_BUF, "%s", name);
  c->key_line[c->sect_keys++] = c->line;
  return 1;
}

/* ---- ladder.ini ------------------------------------------------------------------------ */

static int on_ladder(void *user, const char *section, const char *name, const char *value) {
  load_ctx *c = user;
  vl_ladder *L = c->L;
  if (!check_key(c, section, name, value)) return 0;
  vl_err e2;
  if (!strcmp(section, "case")) {
    /* a registered case reads only the settings it declares: a typo is an error, not a
     * setting that silently does nothing */
    vl_case_env e3 = {0}; /* only for the message (vl_case_fail) */
    if (c->vc && vl_case_check_setting(&e3, c->vc, name) != VL_OK) return fail_at(c, c->line, "%s", e3.err.msg);
    if (vl_knob_set_err(&L->setting, name, value, &e2)) return fail_at(c, c->line, "[case]: %s", e2.msg);
    return 1;
  }
  int i = vl_ladder_find(L, section);
  if (i < 0) {
    if (L->n_rungs >= VL_MAX_RUNGS)
      return fail_at(c, c->sect_line[c->n_sect - 1], "rung [%s]: too many rungs (limit %d)", section, VL_MAX_RUNGS);
    i = L->n_rungs++;
    vl_rung *r = &L->rungs[i];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", section); /* length checked by on_header */
    if (i > 0) r->knobs = L->rungs[i - 1].knobs;    /* inherit */
    snprintf(r->label, sizeof r->label, "%s", section);
  }
  vl_rung *r = &L->rungs[i];
  if (!strcmp(name, "label")) {
    size_t n = strlen(value);
    if (n >= sizeof r->label)
      return fail_at(c, c->line, "rung [%s]: label is %zu characters long (limit %zu)", section, n, sizeof r->label - 1);
    memcpy(r->label, value, n + 1);
    return 1;
  }
  if (vl_knob_set_err(&r->knobs, name, value, &e2)) return fail_at(c, c->line, "rung [%s]: %s", section, e2.msg);
  return 1;
}

/* ---- claims.ini ------------------------------------------------------------------------ */

static bool case_has(const char *const *list, const char *s) {
  for (int i = 0; list && list[i]; i++)
    if (!strcmp(list[i], s)) return true;
  return false;
}

static vl_claim *claim_get(load_ctx *c, const char *id) {
  vl_ladder *L = c->L;
  for (int i = 0; i < L->n_claims; i++)
    if (!strcmp(L->claims[i].id, id)) return &L->claims[i];
  if (L->n_claims >= VL_MAX_CLAIMS) {
    fail_at(c, c->sect_line[c->n_sect - 1], "claim [%s]: too many claims (limit %d)", id, VL_MAX_CLAIMS);
    return NULL;
  }
  int k = L->n_claims++;
  vl_claim *cl = &L->claims[k];
  memset(cl, 0, sizeof *cl);
  snprintf(cl->id, sizeof cl->id, "%s", id); /* length checked by on_header */
  cl->article_before = cl->article_after = cl->lo = cl->hi = NAN;
  snprintf(cl->kind, sizeof cl->kind, "value");
  c->claim_line[k] = c->sect_line[c->n_sect - 1];
  c->metric_line[k] = c->before_line[k] = c->after_line[k] = c->claim_line[k];
  c->basis_seen[k] = false;
  return cl;
}

/* before_set/after_set: a side plan's knobs, checked now so a typo is not a silent "not
 * measurable" in the report. */
static int check_set(load_ctx *c, const vl_claim *cl, const char *name, const char *value) {
  vl_knobs *k = calloc(1, sizeof *k);
  if (!k) return fail_at(c, c->line, "out of host memory");
  vl_err e2;
  int ok = 1;
  if (vl_knobs_apply_list(k, value, &e2)) ok = fail_at(c, c->line, "claim [%s]: %s: %s", cl->id, name, e2.msg);
  for (int i = 0; ok && c->vc && i < k->n; i++)
    if (!vl_case_knob(c->vc, k->k[i].key, VL_KNOB_RUNG))
      ok = fail_at(c, c->line, "claim [%s]: %s: '%s' is not a knob of %s", cl->id, name, k->k[i].key, c->vc->id);
  free(k);
  return ok;
}

/* claims.ini's [_report] section: the report's first screen (not a claim) */
static int on_report_section(load_ctx *c, const char *name, const char *value) {
  char *dst = !strcmp(name, "where") ? c->L->where : !strcmp(name, "articles") ? c->L->articles : NULL;
  size_t cap = dst == c->L->where ? sizeof c->L->where : sizeof c->L->articles;
  if (!dst) return fail_at(c, c->line, "[_report]: unknown key '%s' (where or articles)", name);
  if (strlen(value) >= cap)
    return fail_at(c, c->line, "[_report]: %s is %zu characters long (limit %zu)", name, strlen(value), cap - 1);
  memcpy(dst, value, strlen(value) + 1);
  if (dst == c->L->articles) {
    /* "000:24 001:3": article ids with a count each */
    const char *p = value;
    while (*p) {
      char id[16];
      int cnt, used = 0;
      if (sscanf(p, " %15[^: ]:%d%n", id, &cnt, &used) != 2 || cnt < 0)
        return fail_at(c, c->line, "[_report]: articles = '%s' (expected ARTICLE:COUNT ..., e.g. 000:24 001:3)",
                       value);
      p += used;
      while (*p == ' ') p++;
    }
  }
  return 1;
}

static int on_claims(void *user, const char *section, const char *name, const char *value) {
  load_ctx *c = user;
  if (!check_key(c, section, name, value)) return 0;
  if (!strcmp(section, "_report")) return on_report_section(c, name, value);
  vl_claim *cl = claim_get(c, section);
  if (!cl) return 0;
  int k = (int)(cl - c->L->claims);
  size_t n = strlen(value);
#define STR(f)                                                                                        \
  if (!strcmp(name, #f)) {                                                                            \
    if (n >= sizeof cl->f)                                                                            \
      return fail_at(c, c->line, "claim [%s]: " #f " is %zu characters long (limit %zu)", cl->id, n, \
                     sizeof cl->f - 1);                                                               \
    memcpy(cl->f, value, n + 1);                                                                      \
    return 1;                                                                                         \
  }
  if (!strcmp(name, "metric")) c->metric_line[k] = c->line;
  if (!strcmp(name, "before")) c->before_line[k] = c->line;
  if (!strcmp(name, "after")) c->after_line[k] = c->line;
  if (!strcmp(name, "kind") && strcmp(value, "value") && strcmp(value, "ratio") && strcmp(value, "range") &&
      strcmp(value, "ratio_range") && strcmp(value, "none"))
    return fail_at(c, c->line, "claim [%s]: kind '%s' (value, ratio, range, ratio_range or none)", cl->id, value);
  if (!strcmp(name, "needs") && strcmp(value, "cuda") && strcmp(value, "cpu"))
    return fail_at(c, c->line, "claim [%s]: needs '%s' (cuda or cpu)", cl->id, value);
  if ((!strcmp(name, "before_set") || !strcmp(name, "after_set")) && !check_set(c, cl, name, value)) return 0;
  if (!strcmp(name, "basis")) {
    static const char *const names[] = {"planned", "measured", "modeled", "configured"};
    for (int b = 0; b < 4; b++)
      if (!strcmp(value, names[b])) {
        cl->basis = (vl_basis)b;
        c->basis_seen[k] = true;
        return 1;
      }
    return fail_at(c, c->line, "claim [%s]: basis '%s' (planned, measured, modeled or configured)", cl->id, value);
  }
  if (!strcmp(name, "scope")) {
    if (strcmp(value, "article") && strcmp(value, "suite"))
      return fail_at(c, c->line, "claim [%s]: scope '%s' (article or suite)", cl->id, value);
    cl->suite = !strcmp(value, "suite");
    return 1;
  }
  if (!strcmp(name, "noise") && !strcmp(value, "exact")) {
    cl->noise_exact = true;
    return 1;
  }
  if (!strcmp(name, "rank")) {
    double r;
    if (vl_parse_f64(value, 1, 99, &r) != VL_PARSE_OK || r != floor(r))
      return fail_at(c, c->line, "claim [%s]: rank = '%s' (a whole number from 1 to 99)", cl->id, value);
    cl->rank = (int)r;
    return 1;
  }
  STR(text) STR(source) STR(metric) STR(unit) STR(kind) STR(note) STR(before) STR(after)
  STR(before_set) STR(after_set) STR(needs) STR(qualifier) STR(assumption) STR(shown_with) STR(reason)
  STR(finding)
#undef STR
  double *num = !strcmp(name, "article_before") ? &cl->article_before
              : !strcmp(name, "article_after")  ? &cl->article_after
              : !strcmp(name, "tol")            ? &cl->tol
              : !strcmp(name, "lo")             ? &cl->lo
              : !strcmp(name, "hi")             ? &cl->hi
              : !strcmp(name, "noise")          ? &cl->noise_floor : NULL;
  if (!num) return fail_at(c, c->line, "claim [%s]: unknown key '%s'", cl->id, name);
  /* finite decimals only: NaN or an infinity would make every verdict "not measurable"
   * or always true; a tolerance or a noise floor is never negative */
  bool nonneg = num == &cl->tol || num == &cl->noise_floor;
  vl_parse_status st = vl_parse_f64(value, nonneg ? 0 : -DBL_MAX, num == &cl->noise_floor ? 1 : DBL_MAX, num);
  if (st != VL_PARSE_OK)
    return fail_at(c, c->line, "claim [%s]: %s = '%s' %s (expected a finite decimal number%s)", cl->id, name, value,
                   vl_parse_why(st), num == &cl->noise_floor ? " in [0, 1] or exact" : nonneg ? " >= 0" : "");
  return 1;
}

/* What a claim needs once its whole section is read. */
static void check_claim(load_ctx *c, int k) {
  const vl_ladder *L = c->L;
  const vl_claim *cl = &L->claims[k];
  int line = c->claim_line[k];
  if (cl->shown_with[0]) {
    int j = 0;
    while (j < L->n_claims && strcmp(L->claims[j].id, cl->shown_with)) j++;
    if (j == L->n_claims || j == k || L->claims[j].shown_with[0]) {
      fail_at(c, line, "claim [%s]: shown_with '%s' is not another claim shown in a row of its own", cl->id,
              cl->shown_with);
      return;
    }
  }
  if (!strcmp(cl->kind, "none")) {
    if (!cl->reason[0]) fail_at(c, line, "claim [%s]: kind none needs a reason (why it is not measurable here)", cl->id);
    else if (!c->basis_seen[k]) fail_at(c, line, "claim [%s]: needs basis (planned, measured, modeled or configured)", cl->id);
    return;
  }
  if (!cl->metric[0] || !cl->after[0]) { fail_at(c, line, "claim [%s]: needs metric and after", cl->id); return; }
  if (vl_ladder_find(L, cl->after) < 0) {
    fail_at(c, c->after_line[k], "claim [%s]: unknown rung '%s'", cl->id, cl->after);
    return;
  }
  if (cl->before[0] && vl_ladder_find(L, cl->before) < 0) {
    fail_at(c, c->before_line[k], "claim [%s]: unknown rung '%s'", cl->id, cl->before);
    return;
  }
  if (c->vc && !case_has(c->vc->metrics, cl->metric)) {
    fail_at(c, c->metric_line[k], "claim [%s]: metric '%s' is not one that case %s writes (its metrics list in case.c)",
            cl->id, cl->metric, c->vc->id);
    return;
  }
  if (cl->basis == VL_BASIS_MODELED && !cl->assumption[0])
    fail_at(c, line, "claim [%s]: basis modeled needs an assumption (the model's, named in the report)", cl->id);
  bool range = !strcmp(cl->kind, "range") || !strcmp(cl->kind, "ratio_range");
  if (range && (isnan(cl->lo) || isnan(cl->hi) || cl->lo > cl->hi))
    fail_at(c, line, "claim [%s]: kind %s needs lo <= hi", cl->id, cl->kind);
  else if (!range && isnan(cl->article_after))
    fail_at(c, line, "claim [%s]: kind %s needs article_after", cl->id, cl->kind);
  else if (!strcmp(cl->kind, "ratio") && isnan(cl->article_before))
    fail_at(c, line, "claim [%s]: kind ratio needs article_before", cl->id);
  else if (!c->basis_seen[k])
    fail_at(c, line, "claim [%s]: needs basis (planned, measured, modeled or configured)", cl->id);
}

/* ---- entry points ------------------------------------------------------------------------ */

int vl_ladder_find(const vl_ladder *L, const char *rung) {
  for (int i = 0; i < L->n_rungs; i++)
    if (!strcmp(L->rungs[i].name, rung)) return i;
  return -1;
}

/* One file's text through inih; the first error (ours or inih's) into e. */
static vl_status parse_text(load_ctx *c, const char *text, ini_handler h, vl_err *e) {
  c->text = text;
  c->pos = 0;
  c->line = 0;
  c->n_sect = 0;
  c->sect_keys = 0;
  c->failed = false;
  c->err_line = c->err_seen = 0;
  int rc = ini_parse_stream(read_line, c, h, c);
  if (rc == -2) return vl_err_set(e, VL_ERR_OOM, "%s: out of host memory", c->file);
  /* inih goes on after a malformed line and reports the first; our checks stop at theirs:
   * the one found first is the error (a malformed line inih saw before ours was found) */
  if (rc > 0 && (!c->failed || rc < c->err_seen))
    return vl_err_set(e, VL_ERR_INVALID, "%s:%d: malformed line (expected [section], key = value or ; comment)",
                      c->file, rc);
  if (c->failed) return vl_err_set(e, VL_ERR_INVALID, "%s", c->err);
  return VL_OK;
}

vl_status vl_ladder_parse(vl_ladder *L, const char *case_id, const char *ladder_text, const char *claims_text,
                          const char *name, vl_err *e) {
  memset(L, 0, sizeof *L);
  if (strlen(case_id) >= sizeof L->case_id)
    return vl_err_set(e, VL_ERR_INVALID, "case id '%s' is %zu characters long (limit %zu)", case_id, strlen(case_id),
                      sizeof L->case_id - 1);
  snprintf(L->case_id, sizeof L->case_id, "%s", case_id);
  load_ctx *c = calloc(1, sizeof *c);
  char *file = malloc(strlen(name) + 16);
  if (!c || !file) {
    free(c);
    free(file);
    return vl_err_set(e, VL_ERR_OOM, "out of host memory");
  }
  c->L = L;
  c->vc = vl_case_find(case_id);
  c->file = file;
  vl_status rc;
  sprintf(file, "%s/ladder.ini", name);
  c->what = "rung";
  c->name_max = sizeof L->rungs[0].name - 1;
  if ((rc = parse_text(c, ladder_text, on_ladder, e))) goto out;
  if (L->n_rungs == 0) {
    rc = vl_err_set(e, VL_ERR_INVALID, "%s: no rungs", file);
    goto out;
  }
  sprintf(file, "%s/claims.ini", name);
  c->what = "claim";
  c->name_max = sizeof L->claims[0].id - 1;
  if ((rc = parse_text(c, claims_text ? claims_text : "", on_claims, e))) goto out;
  for (int k = 0; k < L->n_claims && !c->failed; k++) check_claim(c, k);
  if (c->failed) rc = vl_err_set(e, VL_ERR_INVALID, "%s", c->err);
out:
  free(file);
  free(c);
  return rc;
}

/* A file's text, refusing one with a NUL byte (the parser would stop there silently). */
static char *read_text(const char *path, vl_err *e) {
  size_t n = 0;
  char *t = vl_read_file(path, &n);
  if (!t) {
    vl_err_set(e, VL_ERR_IO, "cannot open %s", path);
    return NULL;
  }
  if (strlen(t) != n) {
    vl_err_set(e, VL_ERR_INVALID, "%s: a NUL byte at offset %zu (not a text file)", path, strlen(t));
    free(t);
    return NULL;
  }
  return t;
}

vl_status vl_ladder_load(vl_ladder *L, const char *dir, const char *case_id, vl_err *e) {
  memset(L, 0, sizeof *L);
  size_t pn = strlen(dir) + strlen(case_id) + 32;
  char *base = malloc(pn), *path = malloc(pn);
  char *lt = NULL, *ct = NULL;
  vl_status rc = VL_ERR_IO; /* a file read_text refused */
  if (!base || !path) {
    rc = vl_err_set(e, VL_ERR_OOM, "out of host memory");
    goto out;
  }
  snprintf(base, pn, "%s/cases/%s", dir, case_id);
  snprintf(path, pn, "%s/ladder.ini", base);
  if (!(lt = read_text(path, e))) goto out;
  snprintf(path, pn, "%s/claims.ini", base);
  if (!(ct = read_text(path, e))) goto out;
  rc = vl_ladder_parse(L, case_id, lt, ct, base, e);
out:
  free(base);
  free(path);
  free(lt);
  free(ct);
  return rc;
}

vl_status vl_ladder_set(vl_ladder *L, const char *a, vl_err *e) {
  const char *eq = strchr(a, '=');
  if (!eq || eq == a) return vl_err_set(e, VL_ERR_INVALID, "--set '%s': expected key=value or rung.key=value", a);
  /* "rung.key": a rung name and a knob name, each with its own limit */
  char key[sizeof L->rungs[0].name + VL_KNOB_KEY_LEN + 1];
  vl_err e2;
  size_t kl = (size_t)(eq - a);
  if (kl >= sizeof key)
    return vl_err_set(e, VL_ERR_INVALID, "--set '%.*s': the name is %zu characters long (limit %zu)", (int)kl, a, kl,
                      sizeof key - 1);
  memcpy(key, a, kl);
  key[kl] = 0;
  const char *val = eq + 1;
  char *dot = strchr(key, '.');
  const char *k = dot ? dot + 1 : key;
  if (dot) *dot = 0;
  /* checked once up front, so a refused value changes no rung */
  if (vl_knob_check(k, val, &e2)) return vl_err_set(e, VL_ERR_INVALID, "--set: %s", e2.msg);
  if (!dot) {
    /* a case setting (one the ladder sets, or one a registered case declares as a setting
     * and not as a rung knob), or a knob for every rung; for a registered case, a name it
     * declares neither way is refused here, as a typo in ladder.ini is */
    const vl_case *vc = vl_case_find(L->case_id);
    bool rung_knob = vc && vl_case_knob(vc, key, VL_KNOB_RUNG);
    if (vc && !rung_knob && !vl_case_knob(vc, key, VL_KNOB_SETTING)) {
      char kn[1024], st[1024];
      vl_case_known_names(vc, VL_KNOB_RUNG, kn, sizeof kn);
      vl_case_known_names(vc, VL_KNOB_SETTING, st, sizeof st);
      return vl_err_set(e, VL_ERR_INVALID,
                        "--set: '%s' is neither a knob nor a setting of %s (knobs: %s; settings: %s)", key, vc->id, kn,
                        st);
    }
    if (vl_knob_get(&L->setting, key) || (vc && !rung_knob)) {
      if (vl_knob_set_err(&L->setting, key, val, &e2)) return vl_err_set(e, VL_ERR_INVALID, "--set: %s", e2.msg);
      return VL_OK;
    }
    for (int i = 0; i < L->n_rungs; i++)
      if (vl_knob_set_err(&L->rungs[i].knobs, key, val, &e2))
        return vl_err_set(e, VL_ERR_INVALID, "--set: rung '%s': %s", L->rungs[i].name, e2.msg);
    return VL_OK;
  }
  int i = vl_ladder_find(L, key);
  if (i < 0) return vl_err_set(e, VL_ERR_INVALID, "--set: unknown rung '%s'", key);
  const char *old = vl_knob_get(&L->rungs[i].knobs, k);
  char oldv[VL_KNOB_VAL_LEN];
  snprintf(oldv, sizeof oldv, "%s", old ? old : ""); /* a stored value always fits */
  /* rungs below inherit unless they set the knob themselves (same value as before) */
  for (int j = i; j < L->n_rungs; j++) {
    const char *cur = vl_knob_get(&L->rungs[j].knobs, k);
    if (j > i && cur && strcmp(cur, oldv)) break;
    if (vl_knob_set_err(&L->rungs[j].knobs, k, val, &e2))
      return vl_err_set(e, VL_ERR_INVALID, "--set: rung '%s': %s", L->rungs[j].name, e2.msg);
  }
  return VL_OK;
}

const char *vl_basis_name(vl_basis b) {
  switch (b) {
    case VL_BASIS_PLANNED: return "planned";
    case VL_BASIS_MEASURED: return "measured";
    case VL_BASIS_MODELED: return "modeled";
    default: return "configured";
  }
}
