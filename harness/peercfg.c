/* Every rung's PyTorch peer setup, through the cases' peer_config hooks (peercfg.h). */
#include "peercfg.h"

#include <string.h>

cJSON *vl_peer_configs(const vl_case *c, const vl_ladder *L, const char *scale, const char *step, int threads,
                       vl_err *e) {
  if (!c->peer_config) {
    vl_err_set(e, VL_ERR_INVALID, "%s has no PyTorch peer (cases with one: llm-lora, seg-ckpt, sd-lora)", c->id);
    return NULL;
  }
  vl_case_env env = {.scale = scale, .device = VL_DEV_CPU, .setting = &L->setting, .quiet = 1};
  cJSON *all = cJSON_CreateObject();
  cJSON_AddStringToObject(all, "case", c->id);
  cJSON_AddStringToObject(all, "scale", scale);
  cJSON *rungs = cJSON_AddObjectToObject(all, "rungs");
  for (int i = 0; i < L->n_rungs; i++) {
    if (step && strcmp(step, L->rungs[i].name)) continue;
    cJSON *o = cJSON_AddObjectToObject(rungs, L->rungs[i].name);
    if (c->peer_config(&env, &L->rungs[i].knobs, threads, o) != VL_OK) {
      vl_err_set(e, VL_ERR_INVALID, "rung '%s': %s", L->rungs[i].name, env.err.msg);
      cJSON_Delete(all);
      return NULL;
    }
  }
  return all;
}
