/* Child processes without a shell: arguments are passed as they are, so a path or a name
 * holding quotes, `;` or `$(...)` is never interpreted. Leaf module: cases may include it. */
#ifndef VRAMLAB_PROC_H
#define VRAMLAB_PROC_H

#include <stddef.h>

/* Runs argv[0] (looked up in PATH) with argv, stdin from /dev/null, stderr to /dev/null;
 * its standard output, up to n - 1 bytes, into out (NUL-terminated; the rest is read and
 * dropped). Returns the exit status (0..255), or -1 when it could not run or was killed
 * by a signal. */
int vl_run_capture(char *const argv[], char *out, size_t n);

#endif
