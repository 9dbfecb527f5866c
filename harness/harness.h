/* The vramlab harness: ladders and claims (INI), statistics, results JSON, reports. */
#ifndef VRAMLAB_HARNESS_H
#define VRAMLAB_HARNESS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#define VL_MAX_KNOBS 48
#define VL_MAX_RUNGS 16
#define VL_MAX_CLAIMS 32

/* A knob value holds a real path (data_dir). 1024, not PATH_MAX: a ladder is 17 knob sets
 * of 48 knobs held by value (on the stack in main.c and the tests, copied for side plans
 * and inheritance), so 4096 would make it ~3.4 MB; at 1024 it is ~0.9 MB. Heap strings
 * would make vl_knobs need an owner and a free everywhere it is copied. A longer value is
 * refused with a message naming the knob and the limit, never cut. */
#define VL_KNOB_KEY_LEN 40
#define VL_KNOB_VAL_LEN 1024
typedef struct { char key[VL_KNOB_KEY_LEN]; char val[VL_KNOB_VAL_LEN]; } vl_knob;
typedef struct { vl_knob k[VL_MAX_KNOBS]; int n; } vl_knobs;

const char *vl_knob_get(const vl_knobs *ks, const char *key); /* NULL when absent */
/* Set (or replace) key. Refused: an empty key or value (an empty value is never meaningful:
 * leave the knob out for its default), a key or value longer than the limits, more than
 * VL_MAX_KNOBS knobs. 0 on success; -1 with a message naming the knob and the limit in err
 * (err may be NULL). */
int vl_knob_set_err(vl_knobs *ks, const char *key, const char *val, char *err, size_t errn);
int vl_knob_set(vl_knobs *ks, const char *key, const char *val); /* same, no message */
/* Apply "k=v,k=v" on top of ks; returns 0, or -1 with a message in err. */
int vl_knobs_apply_list(vl_knobs *ks, const char *list, char *err, size_t errn);

typedef struct {
  char name[32];
  char label[160];
  vl_knobs knobs; /* resolved: every knob of the rungs above, then its own */
} vl_rung;

typedef struct {
  char id[40], text[200], source[64], metric[40], unit[16], kind[16], note[240];
  char before[32], after[32], before_set[160], after_set[160];
  char needs[16]; /* device the measurement needs ("cuda"): judged only there */
  double article_before, article_after, tol, lo, hi;
} vl_claim;

typedef struct {
  char case_id[40];
  vl_knobs setting;         /* the [case] section */
  vl_rung rungs[VL_MAX_RUNGS];
  int n_rungs;
  vl_claim claims[VL_MAX_CLAIMS];
  int n_claims;
} vl_ladder;

/* Load cases/<id>/ladder.ini and claims.ini from `dir`. err gets a readable message with
 * the file and line. */
int vl_ladder_load(vl_ladder *L, const char *dir, const char *case_id, char *err, size_t errn);
/* The same from memory: messages name "<name>/ladder.ini:LINE" and "<name>/claims.ini:LINE".
 * Strict: a malformed or over-long line, a key outside a section, an empty value, a
 * duplicate key, a reopened or empty section, a name longer than its field, more rungs,
 * knobs or claims than the limits, a claim number that is not a finite decimal, and (for a
 * registered case) a claim metric the case does not write are each an error. */
int vl_ladder_parse(vl_ladder *L, const char *case_id, const char *ladder_text, const char *claims_text,
                    const char *name, char *err, size_t errn);
/* --set overrides: "key=value" sets the [case] setting; "rung.key=value" one rung (and the
 * rungs below it, which inherit). */
int vl_ladder_set(vl_ladder *L, const char *assignment, char *err, size_t errn);
int vl_ladder_find(const vl_ladder *L, const char *rung);

/* ---- statistics ---- */
typedef struct { double median, min, max, mean, p90, cv; int n; } vl_stats;
void vl_stats_compute(const double *x, int n, vl_stats *s);
cJSON *vl_stats_json(const vl_stats *s, const double *samples, int n);

/* ---- results ---- */
cJSON *vl_env_json(const char *device);
/* Write text atomically: temp file in the same directory, fsync, rename. */
int vl_write_atomic(const char *path, const char *text, char *err, size_t errn);
int vl_mkdir_p(const char *path);
/* The whole regular file at path (NUL-terminated, *n bytes), or NULL with a message in err:
 * not there, not a regular file (a directory, a FIFO, a device), or larger than max bytes. */
char *vl_read_file_max(const char *path, size_t max, size_t *n, char *err, size_t errn);
/* vl_read_file_max with a 1 GiB limit and no message. */
char *vl_read_file(const char *path, size_t *n);

/* ---- progress ---- */
void vl_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
