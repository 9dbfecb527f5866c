/* reports/index.md, the suite's front page: one row per case from the results each report
 * was made from (reports/<case>/results.json), then the claims of docs/cases.md "Claims that
 * apply to every case" judged across the cases. Written by `vramlab bench` and `vramlab
 * regress`; a claim whose evidence is missing says so. */
#ifndef VRAMLAB_INDEX_H
#define VRAMLAB_INDEX_H

#include <stddef.h>

/* Write <reports_dir>/index.md atomically. regress_line: one markdown line about the last
 * regression run (NULL: none this time; a previous reports/regress.md is linked). 0, or -1
 * with the reason in err. */
int vl_index_write(const char *reports_dir, const char *regress_line, char *err, size_t errn);

#endif
