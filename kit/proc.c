/* Child processes without a shell (see proc.h). */
#define _GNU_SOURCE
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

int vl_run_capture(char *const argv[], char *out, size_t n) {
  if (n) out[0] = 0;
  int p[2];
  if (pipe2(p, O_CLOEXEC)) return -1;
  pid_t pid = fork();
  if (pid < 0) { close(p[0]); close(p[1]); return -1; }
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 2) < 0 || dup2(p[1], 1) < 0) _exit(127);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(p[1]);
  size_t got = 0;
  char sink[4096];
  for (;;) {
    char *dst = got + 1 < n ? out + got : sink;
    size_t room = got + 1 < n ? n - 1 - got : sizeof sink;
    ssize_t r = read(p[0], dst, room);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (dst != sink) got += (size_t)r;
  }
  close(p[0]);
  if (n) out[got] = 0;
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
