/* Process control: a second Ctrl-C ends a stuck process at once; an interrupted run exits
 * non-zero and writes no number it did not measure; child processes run without a shell. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "kit/interrupt.h"
#include "kit/proc.h"
#include "testutil.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

/* waitpid with a deadline: the child's status, or -1 (the child is then killed) */
static int wait_for(pid_t pid, int ms) {
  for (int t = 0; t < ms; t += 10) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    sleep_ms(10);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* A child stuck where no step edge comes (pause() in a loop stands for a blocking read):
 * the first SIGINT only sets the flag, the second ends it by SIGINT. */
static void test_second_interrupt_ends_stuck_process(void **state) {
  (void)state;
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    vl_interrupt_install();
    ssize_t w = write(pfd[1], "r", 1);
    (void)w;
    for (;;) pause();
  }
  close(pfd[1]);
  char ch;
  assert_int_equal(read(pfd[0], &ch, 1), 1);
  close(pfd[0]);
  kill(pid, SIGINT);
  sleep_ms(200);
  int st;
  assert_int_equal(waitpid(pid, &st, WNOHANG), 0); /* still running: the first asks politely */
  kill(pid, SIGINT);
  st = wait_for(pid, 3000);
  assert_true(st != -1); /* before the fix: the child never ended */
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGINT);
}

static void test_sigterm_then_sigint_also_ends(void **state) {
  (void)state;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    vl_interrupt_install();
    for (;;) pause();
  }
  sleep_ms(100);
  kill(pid, SIGTERM);
  sleep_ms(100);
  kill(pid, SIGINT);
  int st = wait_for(pid, 3000);
  assert_true(st != -1);
  assert_true(WIFSIGNALED(st));
}

/* `vramlab run dataloader` stopped by SIGINT: exit status 130, results written and marked
 * interrupted. */
static void test_interrupted_run_exits_nonzero(void **state) {
  (void)state;
  char out[512], data[512];
  tu_join(out, sizeof out, tu_tmp, "results");
  tu_join(data, sizeof data, tu_tmp, "data");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char dd[600];
    snprintf(dd, sizeof dd, "data_dir=%s", data);
    freopen("/dev/null", "w", stderr);
    /* a slow consumer keeps the run busy for many seconds */
    execl(VRAMLAB_BINARY_DIR "/vramlab", "vramlab", "run", "dataloader", "--scale", "tiny", "--device", "cpu",
          "--set", dd, "--set", "reps=3", "--set", "consumer_ms=200", "--out", out, (char *)NULL);
    _exit(127);
  }
  sleep_ms(2500);
  kill(pid, SIGINT);
  int st = wait_for(pid, 60000);
  assert_true(st != -1);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), VL_EXIT_INTERRUPTED); /* before the fix: 0 */
  char latest[700];
  snprintf(latest, sizeof latest, "%s/dataloader/latest.json", out);
  uint8_t *text;
  size_t n = tu_slurp(latest, &text);
  cJSON *res = cJSON_ParseWithLength((const char *)text, n);
  free(text);
  assert_non_null(res);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(res, "interrupted")));
  cJSON_Delete(res);

  /* Its report judges nothing it did not measure and names what is missing: the sweep's
   * best setting never ran (before the fix: judged from zeros, "does not hold"). */
  const vl_case *c = vl_case_find("dataloader");
  vl_ladder *L = malloc(sizeof *L);
  assert_non_null(L);
  char md[600];
  vl_err err = {0};
  assert_int_equal(vl_ladder_load(L, VRAMLAB_SOURCE_DIR, "dataloader", &err), 0);
  tu_join(md, sizeof md, tu_tmp, "reports/dataloader.md");
  char rdir[600];
  tu_join(rdir, sizeof rdir, tu_tmp, "reports");
  assert_int_equal(vl_mkdir_p(rdir), 0);
  setenv("VRAMLAB_NO_GNUPLOT", "1", 1);
  if (vl_report_write(c, L, latest, md, &err)) fail_msg("report: %s", err.msg);
  free(L);
  n = tu_slurp(md, &text);
  char *rep = strndup((const char *)text, n);
  free(text);
  assert_non_null(strstr(rep, "**Missing because the run was interrupted**"));
  assert_non_null(strstr(rep, "`best_workers_share` (workers_share)"));
  /* the workers-share claim's row (a range over the sweep's best setting) */
  const char *row = strstr(rep, "| best num_workers is 70-80% of the cores |");
  assert_non_null(row);
  const char *eol = strchr(row, '\n');
  char line[1024];
  snprintf(line, sizeof line, "%.*s", (int)(eol ? eol - row : (long)strlen(row)), row);
  if (!strstr(line, "**not measured: run interrupted**")) fail_msg("row judged: %s", line);
  free(rep);
}

/* Interrupted before the sweep: the decode ceiling (measured) is kept, and nothing derived
 * from the sweep is written (before the fix: zeros, judged "does not hold"). */
static void test_dataloader_extra_interrupted_writes_no_derived_metrics(void **state) {
  (void)state;
  char data[512];
  tu_join(data, sizeof data, tu_tmp, "data-extra");
  vl_knobs setting = {0};
  assert_int_equal(vl_knob_set(&setting, "data_dir", data), 0);
  assert_int_equal(vl_knob_set(&setting, "images", "16"), 0);
  vl_case_env env = {.scale = "tiny", .device = VL_DEV_CPU, .setting = &setting, .quiet = 1};
  const vl_case *c = vl_case_find("dataloader");
  assert_non_null(c);
  cJSON *res = cJSON_CreateObject();
  vl_interrupted = 1;
  vl_status rc = c->extra(&env, res);
  vl_interrupted = 0;
  if (rc != VL_OK) fail_msg("extra: %s: %s", vl_status_name(rc), env.err.msg);
  cJSON *cm = cJSON_GetObjectItem(res, "case_metrics");
  assert_non_null(cm);
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(cm, "decode_images_per_s_per_core")) > 0);
  static const char *const derived[] = {"best_images_per_s", "best_workers", "best_workers_share",
                                        "images_per_s_at_cores", "share_of_decode_ceiling",
                                        "torch_images_per_s", "speedup_vs_torch"};
  for (size_t i = 0; i < sizeof derived / sizeof *derived; i++)
    if (cJSON_GetObjectItem(cm, derived[i])) fail_msg("interrupted run wrote %s", derived[i]);
  cJSON_Delete(res);
}

/* Arguments reach the child as they are: quotes, `;` and $(...) are not interpreted (the
 * PyTorch reference used to build a shell line around the data folder's name). */
static void test_run_capture_passes_arguments_verbatim(void **state) {
  (void)state;
  char marker[600], arg[800], out[1024];
  tu_join(marker, sizeof marker, tu_tmp, "PWNED");
  snprintf(arg, sizeof arg, "x' ; touch '%s' ; echo '$(touch %s)", marker, marker);
  char *argv[] = {"printf", "%s", arg, NULL};
  assert_int_equal(vl_run_capture(argv, out, sizeof out), 0);
  assert_string_equal(out, arg);
  assert_int_not_equal(access(marker, F_OK), 0);
  /* output longer than the buffer: truncated, NUL-terminated, the child still reaped */
  char small[8];
  assert_int_equal(vl_run_capture(argv, small, sizeof small), 0);
  assert_int_equal(strlen(small), 7);
  /* exit status and a missing program */
  char *f[] = {"false", NULL}, *missing[] = {"vramlab-no-such-program", NULL};
  assert_int_equal(vl_run_capture(f, out, sizeof out), 1);
  assert_int_equal(vl_run_capture(missing, out, sizeof out), 127);
}

static int setup(void **state) {
  (void)state;
  return tu_tmpdir(tu_tmp, sizeof tu_tmp, "vramlab-interrupt-");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_interrupt_ends_stuck_process),
      cmocka_unit_test(test_sigterm_then_sigint_also_ends),
      cmocka_unit_test(test_interrupted_run_exits_nonzero),
      cmocka_unit_test(test_dataloader_extra_interrupted_writes_no_derived_metrics),
      cmocka_unit_test(test_run_capture_passes_arguments_verbatim),
  };
  return cmocka_run_group_tests(tests, setup, tu_tmp_teardown);
}
