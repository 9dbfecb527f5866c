/* Files: reads that never block or balloon, atomic writes (see vramlab/fileio.h). */
#define _GNU_SOURCE
#include "vramlab/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

/* What fstat says a file that is not a regular one is, for messages. */
static const char *file_kind(mode_t m) {
  return S_ISFIFO(m)   ? "fifo"
         : S_ISDIR(m)  ? "directory"
         : S_ISCHR(m)  ? "character device"
         : S_ISBLK(m)  ? "block device"
         : S_ISSOCK(m) ? "socket"
                       : "unknown file type";
}

/* An fd on a regular file of at most max bytes into *fd, its size in *size; VL_ERR_IO
 * with a message (errno says why).
 * O_NONBLOCK: opening a FIFO for reading waits for a writer, maybe forever (a hung run);
 * with it the open returns at once and fstat says what the file is. A regular file reads
 * the same either way. The size is checked before any byte: a 40 GiB file is refused
 * here, not after an attempt to hold it in memory. */
static vl_status open_regular(const char *path, uint64_t max, const char *limit_name, int *fdp,
                              size_t *size, vl_err *err) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return vl_err_set(err, VL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  int e = 0;
  if (fstat(fd, &st) != 0) {
    e = errno;
    vl_err_set(err, VL_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
  } else if (!S_ISREG(st.st_mode)) {
    e = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    vl_err_set(err, VL_ERR_IO, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
  } else if ((uint64_t)st.st_size > max || (uint64_t)st.st_size > (uint64_t)SIZE_MAX / 2) {
    e = EFBIG;
    vl_err_set(err, VL_ERR_IO, "%s: file of %lld bytes exceeds %s (%llu)", path, (long long)st.st_size,
               limit_name ? limit_name : "the limit", (unsigned long long)max);
  }
  if (e) {
    close(fd);
    errno = e;
    return VL_ERR_IO;
  }
  *size = (size_t)st.st_size;
  *fdp = fd;
  return VL_OK;
}

vl_status vl_file_read(const char *path, uint64_t max, const char *limit_name, uint8_t **buf,
                       size_t *cap, size_t *len, vl_err *err) {
  size_t size = 0;
  int fd = -1;
  VL_TRY(open_regular(path, max, limit_name, &fd, &size, err));
  if (size > *cap) {
    uint8_t *nb = realloc(*buf, size);
    if (!nb) {
      close(fd);
      return vl_err_set(err, VL_ERR_OOM, "%s: out of memory for a %zu-byte file buffer", path, size);
    }
    *buf = nb;
    *cap = size;
  }
  /* st_size bytes at most: a file that grows while it is read cannot pass the limit */
  size_t got = 0;
  while (got < size) {
    ssize_t k = read(fd, *buf + got, size - got);
    if (k < 0) {
      if (errno == EINTR) continue;
      vl_err_set(err, VL_ERR_IO, "%s: read error: %s", path, strerror(errno));
      close(fd);
      return VL_ERR_IO;
    }
    if (k == 0) break; /* shrank under us: what is there */
    got += (size_t)k;
  }
  close(fd);
  *len = got;
  return VL_OK;
}

vl_status vl_file_read_text(const char *path, uint64_t max, const char *limit_name, char **text,
                            size_t *n, vl_err *err) {
  uint8_t *buf = NULL;
  size_t cap = 0, len = 0;
  *text = NULL;
  vl_status s = vl_file_read(path, max, limit_name, &buf, &cap, &len, err);
  if (s != VL_OK) {
    free(buf);
    return s;
  }
  char *t = realloc(buf, len + 1); /* buf may be NULL for an empty file */
  if (!t) {
    free(buf);
    return vl_err_set(err, VL_ERR_OOM, "%s: out of memory", path);
  }
  t[len] = 0;
  if (n) *n = len;
  *text = t;
  return VL_OK;
}

vl_status vl_file_mkdir_p(const char *dir, vl_err *err) {
  char p[PATH_MAX];
  size_t len = strlen(dir);
  if (len == 0) return vl_err_set(err, VL_ERR_IO, "empty directory name");
  if (len >= sizeof p) return vl_err_set(err, VL_ERR_IO, "path too long: %.200s... (limit %d)", dir, PATH_MAX - 1);
  memcpy(p, dir, len + 1);
  for (size_t i = 1; i <= len; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
      return vl_err_set(err, VL_ERR_IO, "cannot create directory %s: %s", p, strerror(errno));
    p[i] = c;
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return vl_err_set(err, VL_ERR_IO, "%s exists and is not a directory", dir);
  }
  return VL_OK;
}

void vl_file_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

static int write_all(int fd, const void *data, size_t len) {
  const uint8_t *q = data;
  while (len) {
    ssize_t k = write(fd, q, len);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    q += k;
    len -= (size_t)k;
  }
  return 0;
}

/* The pid of a temporary file's name ".<name>.tmp.<pid>" (its name into base, bn bytes),
 * or 0 when the name is not of that form. */
static long temp_pid(const char *ent, char *base, size_t bn) {
  const char *tag = ent[0] == '.' ? strrchr(ent, '.') : NULL; /* ".<pid>" */
  static const char mid[] = ".tmp";
  if (!tag || tag - ent < (long)sizeof mid || strncmp(tag - (sizeof mid - 1), mid, sizeof mid - 1)) return 0;
  const char *digits = tag + 1;
  if (!*digits || strlen(digits) > 9 || digits[0] == '0') return 0;
  for (const char *d = digits; *d; d++)
    if (*d < '0' || *d > '9') return 0;
  size_t k = (size_t)(tag - (sizeof mid - 1) - ent) - 1; /* the name between the dot and ".tmp" */
  if (k == 0 || k >= bn) return 0;
  memcpy(base, ent + 1, k);
  base[k] = 0;
  return atol(digits);
}

vl_status vl_file_remove_stale_temps(const char *dir, int (*owned)(const char *name), int *removed_out,
                                     vl_err *err) {
  if (removed_out) *removed_out = 0;
  DIR *d = opendir(dir);
  if (!d) return vl_err_set(err, VL_ERR_IO, "cannot read folder %s: %s", dir, strerror(errno));
  int removed = 0;
  struct dirent *e;
  char base[NAME_MAX + 1], path[PATH_MAX];
  while ((e = readdir(d))) {
    long pid = temp_pid(e->d_name, base, sizeof base);
    if (pid <= 0 || pid == (long)getpid() || !owned(base)) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to ask): left */
    struct stat st;
    int n = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (n < 0 || (size_t)n >= sizeof path || lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (unlink(path) == 0) removed++;
  }
  closedir(d);
  if (removed_out) *removed_out = removed;
  return VL_OK;
}

/* The folder of path into dir and the temporary file vl_file_write_atomic writes first,
 * ".<name>.tmp.<pid>" in that folder (rename is atomic only within one file system), into
 * tmp; VL_ERR_IO with a message when path is no file name (empty, ending in '/') or too long. */
static vl_status temp_of(const char *path, char dir[PATH_MAX], char tmp[PATH_MAX], vl_err *err) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  int dn = !slash ? snprintf(dir, PATH_MAX, ".")
           : slash == path ? snprintf(dir, PATH_MAX, "/")
                           : snprintf(dir, PATH_MAX, "%.*s", (int)(slash - path), path);
  int tn = snprintf(tmp, PATH_MAX, "%s%s.%s.tmp.%ld", dir, slash == path ? "" : "/", base, (long)getpid());
  if (!*base || dn < 0 || dn >= PATH_MAX || tn < 0 || tn >= PATH_MAX)
    return vl_err_set(err, VL_ERR_IO, "path too long or not a file name: %.200s (limit %d)", path, PATH_MAX - 32);
  return VL_OK;
}

/* A folder at path: a rename onto it fails only after the temporary file is written. */
static vl_status not_a_folder(const char *path, vl_err *err) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return vl_err_set(err, VL_ERR_IO, "%s is a folder, not a file name", path);
  return VL_OK;
}

vl_status vl_file_check_writable(const char *path, vl_err *err) {
  char dir[PATH_MAX], tmp[PATH_MAX];
  if (!path || !*path) return vl_err_set(err, VL_ERR_IO, "empty file name");
  VL_TRY(temp_of(path, dir, tmp, err));
  VL_TRY(not_a_folder(path, err));
  struct stat st;
  if (stat(dir, &st) != 0)
    return vl_err_set(err, VL_ERR_IO, "%s: its folder %s %s", path, dir,
                      errno == ENOENT ? "does not exist" : strerror(errno));
  if (!S_ISDIR(st.st_mode)) return vl_err_set(err, VL_ERR_IO, "%s: %s is not a folder", path, dir);
  /* the one honest test (root passes access(W_OK) on a read-only file system): make the
   * temporary file the write will make, and remove it */
  (void)unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return vl_err_set(err, VL_ERR_IO, "%s: cannot write in %s: %s", path, dir, strerror(errno));
  close(fd);
  unlink(tmp);
  return VL_OK;
}

/* The folder of path into dir ("." for a bare name, "/" for one in the root); its name's
 * start, or NULL when dir does not fit. */
static const char *dir_of(const char *path, char *dir, size_t n) {
  const char *slash = strrchr(path, '/');
  int dn = !slash ? snprintf(dir, n, ".")
           : slash == path ? snprintf(dir, n, "/")
                           : snprintf(dir, n, "%.*s", (int)(slash - path), path);
  return dn < 0 || (size_t)dn >= n ? NULL : slash ? slash + 1 : path;
}

vl_status vl_file_tmp_beside(const char *path, char *tmp, size_t tmpn, int *fdp, vl_err *err) {
  char dir[PATH_MAX], t[PATH_MAX];
  *fdp = -1;
  if (tmpn) tmp[0] = 0;
  VL_TRY(temp_of(path, dir, t, err));
  if (strlen(t) >= tmpn) return vl_err_set(err, VL_ERR_IO, "path too long: %.200s", path);
  memcpy(tmp, t, strlen(t) + 1);
  /* A new file of our own: whatever has the name already (a stale temporary file, a FIFO
   * that would block the open, a link) is removed, not followed. */
  (void)unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return vl_err_set(err, VL_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  *fdp = fd;
  return VL_OK;
}

vl_status vl_file_tmp_commit(int fd, const char *tmp, const char *path, vl_err *err) {
  if (fsync(fd) != 0) {
    vl_err_set(err, VL_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    close(fd);
    unlink(tmp);
    return VL_ERR_IO;
  }
  if (close(fd) != 0) {
    vl_err_set(err, VL_ERR_IO, "close %s: %s", tmp, strerror(errno));
    unlink(tmp);
    return VL_ERR_IO;
  }
  if (rename(tmp, path) != 0) {
    vl_err_set(err, VL_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    unlink(tmp);
    return VL_ERR_IO;
  }
  char dir[PATH_MAX];
  if (dir_of(path, dir, sizeof dir)) vl_file_fsync_dir(dir);
  return VL_OK;
}

vl_status vl_file_write_atomic(const char *path, const void *data, size_t len, vl_err *err) {
  char tmp[PATH_MAX];
  int fd = -1;
  VL_TRY(not_a_folder(path, err));
  VL_TRY(vl_file_tmp_beside(path, tmp, sizeof tmp, &fd, err));
  if (write_all(fd, data, len)) {
    vl_err_set(err, VL_ERR_IO, "write %s: %s", tmp, strerror(errno));
    close(fd);
    unlink(tmp);
    return VL_ERR_IO;
  }
  return vl_file_tmp_commit(fd, tmp, path, err);
}
