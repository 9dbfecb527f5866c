/* libFuzzer target: bytes -> the Hugging Face config reader of llm-lora's model_config
 * setting (cases/llm-lora/hfconfig.c): from memory (vl_llm_hf_config_parse) and, through a
 * file below $TMPDIR, the loader with its cache of the last config read
 * (vl_llm_hf_config_load, twice: read, then reused). abort() on a broken promise: a refusal
 * without the file's name, a refused config that changed the model, an accepted one outside
 * the size limits or with heads not dividing, the two paths or the two loads disagreeing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness/ladder.h"
#include "harness/registry.h"
#include "cases/llm-lora/llm.h"

static void die(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_model_config: %s: %s\n", what, detail);
  abort();
}

/* An accepted config is a model the planner can take. */
static void check_model(const vl_mistral_cfg *m, int64_t max_pos) {
  const vl_llm_dim_limits *X = &vl_llm_dim_max;
  if (m->dim < 2 || m->dim > X->dim || m->ffn < 1 || m->ffn > X->ffn || m->n_layers < 1 ||
      m->n_layers > X->layers || m->n_heads < 1 || m->n_heads > X->heads || m->n_kv_heads < 1 ||
      m->n_heads % m->n_kv_heads || m->vocab < 2 || m->vocab > X->vocab || m->head_dim < 2 ||
      m->head_dim > X->head_dim || m->head_dim % 2 || max_pos < 1 || max_pos > X->seq)
    die("accepted outside the limits", "sizes");
  if (!(m->rope_theta > 0) || !(m->norm_eps > 0) || !(m->norm_eps < 1)) die("accepted outside the limits", "floats");
}

/* One reading: its status; *m changed only when it was accepted, a refusal names `name`. */
static vl_status read_one(const char *text, size_t n, const char *path, vl_mistral_cfg *m, int64_t *pos,
                          const char **mt) {
  vl_case_env env = {.scale = "full", .device = VL_DEV_PLAN, .quiet = 1};
  vl_mistral_cfg before = *m;
  *mt = NULL;
  vl_status s = path ? vl_llm_hf_config_load(&env, path, m, pos, mt)
                     : vl_llm_hf_config_parse(&env, text, n, "f.json", m, pos, mt);
  if (s == VL_OK) {
    check_model(m, *pos);
    if (!*mt || (strcmp(*mt, "llama") && strcmp(*mt, "mistral") && strcmp(*mt, "qwen2")))
      die("accepted without its family", *mt ? *mt : "(none)");
    if (m->seq != before.seq) die("seq changed", "a training setting, not the config's");
    return s;
  }
  if (memcmp(m, &before, sizeof *m)) die("refused but changed the model", env.err.msg);
  if (!strstr(env.err.msg, "model_config")) die("refused without naming the setting", env.err.msg);
  if (!path && !strstr(env.err.msg, "'f.json'")) die("refused without naming the file", env.err.msg);
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  if (n > VL_LLM_HF_CONFIG_MAX_BYTES) return 0;
  char *text = malloc(n + 1);
  if (!text) return 0;
  memcpy(text, d, n);
  text[n] = 0;
  vl_mistral_cfg a, b, c;
  vl_mistral_preset("tiny", &a);
  b = c = a;
  int64_t pa = 0, pb = 0, pc = 0;
  const char *ma, *mb, *mc;
  vl_status sa = read_one(text, n, NULL, &a, &pa, &ma);
  /* the same bytes as a file, read by the loader, then again (from its cache when accepted);
   * a new name each time: a file rewritten to the same size within one tick of the file
   * system's clock (and its inode reused) would be taken for the one cached, by design */
  static unsigned long serial;
  char path[4096];
  const char *tmp = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/fuzz_model_config.%d.%lu.json", tmp && *tmp ? tmp : "/tmp", (int)getpid(),
           serial++);
  FILE *f = fopen(path, "wb");
  if (f && fwrite(d, 1, n, f) == n && fclose(f) == 0) {
    vl_status sb = read_one(NULL, 0, path, &b, &pb, &mb);
    vl_status sc = read_one(NULL, 0, path, &c, &pc, &mc);
    if (sb != sa || sc != sa) die("file and memory disagree", path);
    if (sa == VL_OK && (memcmp(&a, &b, sizeof a) || memcmp(&a, &c, sizeof a) || pa != pb || pa != pc ||
                        strcmp(ma, mb) || strcmp(ma, mc)))
      die("file, cache and memory give other models", path);
  } else if (f) {
    fclose(f);
  }
  unlink(path);
  free(text);
  return 0;
}
