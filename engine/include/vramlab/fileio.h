/* Files the suite reads from users and writes for them, in one copy below everything that
 * uses them (harness, datasets, cases): reads that never block or balloon, atomic writes.
 * Functions that fail return a vl_status and put a message naming the path in err (which
 * may be NULL). */
#ifndef VRAMLAB_FILEIO_H
#define VRAMLAB_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include "vramlab/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The bytes of the regular file at path into *buf (grown with realloc to *cap as needed;
 * reusable across calls), *len bytes. Opened with O_NONBLOCK and checked with fstat before
 * any byte is read: a FIFO, directory or device is refused ("not a regular file (fifo)"),
 * so is a file larger than max bytes ("file of N bytes exceeds <limit_name> (max)";
 * limit_name NULL: "the limit"). VL_ERR_IO, VL_ERR_OOM, or VL_OK. A file that shrinks
 * while it is read gives what was there. */
vl_status vl_file_read(const char *path, uint64_t max, const char *limit_name, uint8_t **buf,
                       size_t *cap, size_t *len, vl_err *err);
/* The same for text: a malloc'd NUL-terminated copy into *text (*n bytes, n may be NULL);
 * on failure *text is NULL (VL_ERR_IO, VL_ERR_OOM). */
vl_status vl_file_read_text(const char *path, uint64_t max, const char *limit_name, char **text,
                            size_t *n, vl_err *err);
/* mkdir -p; VL_OK, or VL_ERR_IO (also when the path exists and is not a directory). */
vl_status vl_file_mkdir_p(const char *dir, vl_err *err);
/* Write len bytes to path atomically: a fresh temporary file beside it (never through a
 * leftover FIFO or a planted link), fsync, rename over path, fsync of the folder. VL_OK or
 * VL_ERR_IO (a folder at path is refused before anything is written);
 * on failure path is untouched and no temporary file is left. */
vl_status vl_file_write_atomic(const char *path, const void *data, size_t len, vl_err *err);
/* Whether vl_file_write_atomic(path, ...) can write there, asked before the work whose
 * result it will hold: VL_OK, or VL_ERR_IO with a message naming path when it is no file name, is a
 * folder, its folder is missing or not a folder, or nothing can be created there (the
 * temporary file is made and removed). */
vl_status vl_file_check_writable(const char *path, vl_err *err);
/* Remove the temporary files vl_file_write_atomic left in dir when its process was killed
 * mid-write: regular files named ".<name>.tmp.<pid>" for which owned(name) is true and
 * whose pid is not a live process (kill(pid, 0) says ESRCH; never this process's own).
 * Nothing else is touched: other names, folders, links, a live writer's file. (A pid
 * reused by a new process keeps its file until that process is gone: the safe side.)
 * The number removed into *removed (may be NULL); VL_ERR_IO when dir cannot be read. */
vl_status vl_file_remove_stale_temps(const char *dir, int (*owned)(const char *name), int *removed,
                                     vl_err *err);
/* The two halves of vl_file_write_atomic, for a file written by someone else (a child
 * process's output): a fresh temporary file beside path (".<name>.tmp.<pid>", its name into
 * tmp, at least PATH_MAX bytes), created with O_EXCL | O_NOFOLLOW | O_CLOEXEC after whatever
 * had that name is removed: a planted link or FIFO is never followed. The fd into *fd
 * (-1 on failure: VL_ERR_IO). */
vl_status vl_file_tmp_beside(const char *path, char *tmp, size_t tmpn, int *fd, vl_err *err);
/* fsync and close fd, rename tmp over path (a link at path is replaced, not followed),
 * fsync the folder. VL_OK, or VL_ERR_IO with tmp removed. */
vl_status vl_file_tmp_commit(int fd, const char *tmp, const char *path, vl_err *err);
/* fsync a folder, so a rename in it survives a crash (best effort). */
void vl_file_fsync_dir(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
