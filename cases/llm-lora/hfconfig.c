/* A Hugging Face config.json of the Llama/Mistral family as llm-lora's model: the strict
 * reader behind the model_config setting (vramlab plan llm-lora --model-config FILE).
 *
 * Read (field -> vl_mistral_cfg): hidden_size -> dim, intermediate_size -> ffn,
 * num_hidden_layers -> n_layers, num_attention_heads -> n_heads, num_key_value_heads ->
 * n_kv_heads (absent: = num_attention_heads, as transformers does), vocab_size -> vocab,
 * head_dim (absent: hidden_size / num_attention_heads, which must divide), rope_theta
 * (absent: 10000), rms_norm_eps (absent: 1e-6, transformers' default) and
 * max_position_embeddings (the longest seq the model takes; seq itself stays a training
 * setting), tie_word_embeddings -> tie_embed (absent: false, transformers' default for all
 * three families: the LM head then reads the embedding matrix, Llama 3.2 1B/3B and the
 * small Qwen2.5). model_type must be llama, mistral or qwen2; qwen2 -> qkv_bias (Qwen2's
 * q, k and v projections always have biases, its o and MLP projections never:
 * transformers' Qwen2Attention and Qwen2MLP, which read neither attention_bias nor
 * mlp_bias, so a qwen2 config's are not read either).
 * Refused, since the engine's Mistral has none of them: for llama and mistral,
 * attention_bias true (Llama's puts a bias on o too) and mlp_bias true; hidden_act other
 * than silu, a non-zero attention_dropout.
 * Ignored (neither memory nor FLOPs of the step depend on them): rope_scaling (only the
 * RoPE frequencies), sliding_window, use_sliding_window, max_window_layers and layer_types
 * (the engine attends over the whole causal window: the same at seq <= sliding_window),
 * torch_dtype (the rung's compute/frozen knobs say the dtypes), quantization_config, token
 * ids, initializer_range, use_cache, use_mrope, pretraining_tp, architectures,
 * transformers_version and every other key. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llm.h"
#include "vramlab/fileio.h"

/* Bounds of every size, shared with the knobs (config.c): generous (Llama-3.1-405B is
 * 16384 / 53248 / 126 layers / 128 heads) and far from int64 overflow in the planner. */
const vl_llm_dim_limits vl_llm_dim_max = {.vocab = 1L << 22, .dim = 1L << 17, .ffn = 1L << 20, .layers = 1024,
                                          .heads = 1024, .head_dim = 4096, .seq = 1L << 20};

/* The reader's context: the file's name for messages, the env they go to. */
typedef struct {
  vl_case_env *env;
  const char *name;
  const cJSON *root;
} hf_reader;

static vl_status hf_fail(const hf_reader *h, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static vl_status hf_fail(const hf_reader *h, const char *field, const char *fmt, ...) {
  char m[VL_CASE_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  if (field) return vl_case_fail(h->env, VL_ERR_INVALID, "model_config '%s': %s: %s", h->name, field, m);
  return vl_case_fail(h->env, VL_ERR_INVALID, "model_config '%s': %s", h->name, m);
}

static const char *type_name(const cJSON *v) {
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "a number";
}

/* An integer field in [lo, hi]; absent: *out untouched and *present (when given) false, or
 * an error when required. */
static vl_status hf_int(const hf_reader *h, const char *field, bool required, int64_t lo, int64_t hi, int64_t *out,
                        bool *present) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(h->root, field);
  if (present) *present = v != NULL;
  if (!v) return required ? hf_fail(h, field, "missing (required)") : VL_OK;
  if (!cJSON_IsNumber(v)) return hf_fail(h, field, "expected an integer, got %s", type_name(v));
  double d = v->valuedouble;
  if (!isfinite(d) || d != floor(d)) return hf_fail(h, field, "expected an integer, got %.17g", d);
  if (d < (double)lo || d > (double)hi)
    return hf_fail(h, field, "%.17g out of range [%lld, %lld]", d, (long long)lo, (long long)hi);
  *out = (int64_t)d;
  return VL_OK;
}

/* A positive finite number below hi, optional. */
static vl_status hf_pos(const hf_reader *h, const char *field, double hi, float *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(h->root, field);
  if (!v) return VL_OK;
  if (!cJSON_IsNumber(v)) return hf_fail(h, field, "expected a number, got %s", type_name(v));
  double d = v->valuedouble;
  if (!isfinite(d) || !(d > 0) || !(d < hi) || !((float)d > 0))
    return hf_fail(h, field, "%.17g: expected a positive number below %g", d, hi);
  *out = (float)d;
  return VL_OK;
}

/* An optional boolean that the engine supports only as `want` (absent = want). */
static vl_status hf_flag(const hf_reader *h, const char *field, bool want, const char *why) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(h->root, field);
  if (!v) return VL_OK;
  if (!cJSON_IsBool(v)) return hf_fail(h, field, "expected true or false, got %s", type_name(v));
  if ((bool)cJSON_IsTrue(v) != want) return hf_fail(h, field, "%s is not supported: %s", want ? "false" : "true", why);
  return VL_OK;
}

/* An optional boolean: *out when present, untouched when absent. */
static vl_status hf_bool(const hf_reader *h, const char *field, bool *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(h->root, field);
  if (!v) return VL_OK;
  if (!cJSON_IsBool(v)) return hf_fail(h, field, "expected true or false, got %s", type_name(v));
  *out = cJSON_IsTrue(v);
  return VL_OK;
}

/* An optional string that must be one of the NULL-terminated list. */
static vl_status hf_str(const hf_reader *h, const char *field, bool required, const char *const *ok, const char *why) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(h->root, field);
  if (!v) return required ? hf_fail(h, field, "missing (required: %s)", why) : VL_OK;
  if (!cJSON_IsString(v)) return hf_fail(h, field, "expected a string, got %s", type_name(v));
  for (int i = 0; ok[i]; i++)
    if (!strcmp(v->valuestring, ok[i])) return VL_OK;
  return hf_fail(h, field, "'%.60s' is not supported (%s)", v->valuestring, why);
}

/* The parse error's line and column (1-based) at offset `at` of text. */
static void line_col(const char *text, size_t at, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < at && text[i]; i++) {
    if (text[i] == '\n') { (*line)++; *col = 1; }
    else (*col)++;
  }
}

/* FNV-1a, 64 bits, of a NUL-terminated key: the duplicate check's hash. */
static uint64_t key_hash(const char *k) {
  uint64_t x = 0xcbf29ce484222325ull;
  for (; *k; k++) x = (x ^ (unsigned char)*k) * 0x100000001b3ull;
  return x;
}

/* Every key of the object once: one pass through an open-addressing set of the keys seen
 * (linear in the keys; a pairwise comparison took minutes for the 100k keys that fit in
 * 1 MiB). The first key found again is named. */
static vl_status hf_no_duplicates(const hf_reader *h) {
  size_t n = 0, cap = 16;
  for (const cJSON *a = h->root->child; a; a = a->next) n++;
  while (cap < 2 * n) cap *= 2; /* at most half full: short probe runs */
  const char **seen = calloc(cap, sizeof *seen);
  if (!seen) return vl_case_fail(h->env, VL_ERR_OOM, "model_config '%s': out of memory (%zu keys)", h->name, n);
  vl_status s = VL_OK;
  for (const cJSON *a = h->root->child; s == VL_OK && a; a = a->next) {
    if (!a->string) continue;
    size_t i = (size_t)key_hash(a->string) & (cap - 1);
    while (seen[i] && strcmp(seen[i], a->string)) i = (i + 1) & (cap - 1);
    if (seen[i]) s = hf_fail(h, a->string, "given twice");
    seen[i] = a->string;
  }
  free(seen);
  return s;
}

static const char *const families[] = {"llama", "mistral", "qwen2", NULL};

static vl_status hf_fields(hf_reader *h, vl_mistral_cfg *mc, int64_t *max_pos, const char **model_type) {
  const vl_llm_dim_limits *X = &vl_llm_dim_max;
  static const char *const acts[] = {"silu", NULL};
  VL_TRY(hf_str(h, "model_type", true, families, "the Llama/Mistral family: llama, mistral or qwen2"));
  const char *mt = cJSON_GetObjectItemCaseSensitive(h->root, "model_type")->valuestring;
  int fam = 0;
  while (strcmp(families[fam], mt)) fam++; /* hf_str accepted it: one of them */
  bool qwen2 = !strcmp(mt, "qwen2");
  int64_t dim = 0, ffn = 0, layers = 0, heads = 1, kv = 1, vocab = 0, pos = 0, hd = 0;
  bool has_kv, has_hd;
  VL_TRY(hf_int(h, "hidden_size", true, 2, X->dim, &dim, NULL));
  VL_TRY(hf_int(h, "intermediate_size", true, 1, X->ffn, &ffn, NULL));
  VL_TRY(hf_int(h, "num_hidden_layers", true, 1, X->layers, &layers, NULL));
  VL_TRY(hf_int(h, "num_attention_heads", true, 1, X->heads, &heads, NULL));
  VL_TRY(hf_int(h, "num_key_value_heads", false, 1, X->heads, &kv, &has_kv));
  VL_TRY(hf_int(h, "vocab_size", true, 2, X->vocab, &vocab, NULL));
  VL_TRY(hf_int(h, "max_position_embeddings", true, 1, X->seq, &pos, NULL));
  VL_TRY(hf_int(h, "head_dim", false, 2, X->head_dim, &hd, &has_hd));
  if (!has_hd) {
    if (dim % heads)
      return hf_fail(h, "num_attention_heads", "%lld does not divide hidden_size %lld (and no head_dim is given)",
                     (long long)heads, (long long)dim);
    hd = dim / heads;
    if (hd > X->head_dim) /* derived, so hf_int's bound did not see it (found by fuzz_model_config) */
      return hf_fail(h, "num_attention_heads", "head_dim %lld (hidden_size %lld / %lld heads) exceeds %lld",
                     (long long)hd, (long long)dim, (long long)heads, (long long)X->head_dim);
  }
  if (!has_kv) kv = heads; /* transformers: multi-head attention when absent */
  if (heads % kv)
    return hf_fail(h, "num_key_value_heads", "%lld does not divide num_attention_heads %lld", (long long)kv,
                   (long long)heads);
  if (hd % 2) return hf_fail(h, has_hd ? "head_dim" : "num_attention_heads", "head_dim %lld is odd (RoPE rotates pairs)",
                             (long long)hd);
  float theta = 10000.0f, eps = 1e-6f; /* transformers' defaults for both families */
  VL_TRY(hf_pos(h, "rope_theta", 1e12, &theta));
  VL_TRY(hf_pos(h, "rms_norm_eps", 1, &eps));
  bool tie = false;
  VL_TRY(hf_bool(h, "tie_word_embeddings", &tie));
  if (!qwen2) {
    VL_TRY(hf_flag(h, "attention_bias", false, "the engine's attention has biases on q, k and v only (Qwen2's), "
                                               "and Llama's attention_bias puts one on o too"));
    VL_TRY(hf_flag(h, "mlp_bias", false, "the engine's MLP linears have no biases"));
  }
  VL_TRY(hf_str(h, "hidden_act", false, acts, "the engine's MLP is SwiGLU: silu"));
  const cJSON *drop = cJSON_GetObjectItemCaseSensitive(h->root, "attention_dropout");
  if (drop && !cJSON_IsNumber(drop)) return hf_fail(h, "attention_dropout", "expected a number, got %s", type_name(drop));
  if (drop && drop->valuedouble != 0) return hf_fail(h, "attention_dropout", "%g is not supported: the engine has no dropout",
                                                     drop->valuedouble);
  mc->vocab = vocab;
  mc->dim = dim;
  mc->n_layers = layers;
  mc->n_heads = heads;
  mc->n_kv_heads = kv;
  mc->head_dim = hd;
  mc->ffn = ffn;
  mc->rope_theta = theta;
  mc->norm_eps = eps;
  mc->tie_embed = tie;
  mc->qkv_bias = qwen2;
  *max_pos = pos;
  *model_type = families[fam];
  return VL_OK;
}

vl_status vl_llm_hf_config_parse(vl_case_env *env, const char *text, size_t n, const char *name, vl_mistral_cfg *mc,
                                 int64_t *max_pos, const char **model_type) {
  hf_reader h = {env, name, NULL};
  if (strlen(text) != n) return hf_fail(&h, NULL, "not JSON text: a NUL byte at offset %zu", strlen(text));
  const char *end = NULL;
  /* n + 1: the terminator, which require_null_terminated looks for after the value */
  cJSON *root = cJSON_ParseWithLengthOpts(text, n + 1, &end, 1);
  if (!root) {
    int line, col;
    size_t at = end && end >= text && end <= text + n ? (size_t)(end - text) : n;
    line_col(text, at, &line, &col);
    return hf_fail(&h, NULL, "not valid JSON at line %d, column %d", line, col);
  }
  h.root = root;
  vl_status s = VL_OK;
  if (!cJSON_IsObject(root)) s = hf_fail(&h, NULL, "expected a JSON object, got %s", type_name(root));
  /* a key given twice would be read as its first value: refused, not guessed */
  if (s == VL_OK) s = hf_no_duplicates(&h);
  vl_mistral_cfg tmp = *mc; /* mc is changed only by a config that is read whole */
  const char *mt = NULL;
  if (s == VL_OK) s = hf_fields(&h, &tmp, max_pos, &mt);
  if (s == VL_OK) {
    *mc = tmp;
    if (model_type) *model_type = mt;
  }
  cJSON_Delete(root);
  return s;
}

/* The last config read whole, by the identity of its file when it was read: every rung of a
 * ladder (check, plan and run each parse the setting) reuses it instead of reading and
 * parsing the file again. A file replaced or rewritten since (another inode, size, mtime or
 * ctime) is read again; a rewrite to the same size within one tick of the file system's
 * clock is not seen. Only configs that were accepted are kept. */
static struct {
  pthread_mutex_t lock;
  char *path;
  struct stat st;
  vl_mistral_cfg mc; /* every size the config sets (all but seq) */
  int64_t max_pos;
  const char *model_type; /* one of families[] */
} hf_last = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool same_file(const struct stat *a, const struct stat *b) {
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
         a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
         a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* The sizes a config sets over *to: all of vl_mistral_cfg but seq (a training setting). */
static void hf_apply(const vl_mistral_cfg *from, vl_mistral_cfg *to) {
  int64_t seq = to->seq;
  *to = *from;
  to->seq = seq;
}

/* The cached config of path when its file is still the one read: true and *mc, *max_pos set. */
static bool hf_cached(const char *path, const struct stat *st, vl_mistral_cfg *mc, int64_t *max_pos,
                      const char **model_type) {
  pthread_mutex_lock(&hf_last.lock);
  bool hit = hf_last.path && !strcmp(hf_last.path, path) && same_file(&hf_last.st, st);
  if (hit) {
    hf_apply(&hf_last.mc, mc);
    *max_pos = hf_last.max_pos;
    if (model_type) *model_type = hf_last.model_type;
  }
  pthread_mutex_unlock(&hf_last.lock);
  return hit;
}

static void hf_remember(const char *path, const struct stat *st, const vl_mistral_cfg *mc, int64_t max_pos,
                        const char *model_type) {
  char *p = strdup(path);
  if (!p) return; /* not cached: the next rung reads the file again */
  pthread_mutex_lock(&hf_last.lock);
  free(hf_last.path);
  hf_last.path = p;
  hf_last.st = *st;
  hf_last.mc = *mc;
  hf_last.max_pos = max_pos;
  hf_last.model_type = model_type;
  pthread_mutex_unlock(&hf_last.lock);
}

vl_status vl_llm_hf_config_load(vl_case_env *env, const char *path, vl_mistral_cfg *mc, int64_t *max_pos,
                                const char **model_type) {
  /* the identity is taken before the read: a file changed during it is read again next time */
  struct stat st;
  bool known = stat(path, &st) == 0 && S_ISREG(st.st_mode);
  if (known && hf_cached(path, &st, mc, max_pos, model_type)) return VL_OK;
  vl_err m;
  size_t n = 0;
  char *text;
  /* a config that cannot be read is a bad value of the setting, like any other */
  if (vl_file_read_text(path, VL_LLM_HF_CONFIG_MAX_BYTES, "the 1 MiB limit of a model config", &text, &n, &m))
    return vl_case_fail(env, VL_ERR_INVALID, "model_config: %s", m.msg);
  const char *mt = NULL;
  vl_status s = vl_llm_hf_config_parse(env, text, n, path, mc, max_pos, &mt);
  free(text);
  if (s == VL_OK && model_type) *model_type = mt;
  if (s == VL_OK && known) hf_remember(path, &st, mc, *max_pos, mt);
  return s;
}
