/* `vramlab data gen`: the synthetic data sets a user can make by hand, as a table. A new
 * set is a row here (kind, summary, options, generate), not a branch in main.c. */
#ifndef VRAMLAB_DATAGEN_H
#define VRAMLAB_DATAGEN_H

#include <stdbool.h>
#include <stdint.h>

/* The command line's data gen options (each set reads the ones its row lists). */
typedef struct {
  const char *out;
  int64_t n, seed;
  int quality, size, classes;
} vl_datagen_opts;

typedef struct {
  const char *kind;    /* --kind */
  const char *summary; /* one line: what the set is and which case reads it */
  const char *options; /* the options it reads, for messages and help */
  /* Make the set at o->out and print one summary line; 0, 1 (failed, or refused: o->out is
   * not a new or empty folder, the cases' first-use rule; message on stderr) or 2 (bad
   * options). */
  int (*generate)(const vl_datagen_opts *o);
} vl_dataset_kind;

/* Every kind, the default (jpeg) first. */
const vl_dataset_kind *vl_dataset_kinds(int *n);
const vl_dataset_kind *vl_dataset_kind_find(const char *kind);
/* Whether kind k reads the option opt ("--size"): one of the words of its options. */
bool vl_dataset_kind_reads(const vl_dataset_kind *k, const char *opt);

#endif
