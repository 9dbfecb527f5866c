/* The registry: the one place that names the cases (registry.c), and the check of knob and
 * setting names against a case's declarations. */
#ifndef VRAMLAB_REGISTRY_H
#define VRAMLAB_REGISTRY_H

#include "kit/case.h"

const vl_case *vl_case_find(const char *id);
/* `vramlab worker CASE ARGS...`: argv[0] is CASE; its worker hook's exit status, 2 when the
 * case is unknown or has none (case_worker.c). */
int vl_case_worker_main(int argc, char **argv);
const vl_case *const *vl_case_all(int *n);
/* The declaration of name in the case's table (or, for a setting, the harness's) when it
 * may be set `where` (VL_KNOB_RUNG, VL_KNOB_SETTING); NULL otherwise. */
const vl_knob_decl *vl_case_knob(const vl_case *c, const char *name, unsigned where);
/* Check a rung's knobs against the case's declarations: an unknown knob is VL_ERR_INVALID
 * with a message naming the known ones. */
vl_status vl_case_check_knobs(vl_case_env *env, const vl_case *c, const char *rung, const vl_knobs *k);
/* The names declared with `where` (the case's, then for settings the harness's), ", "-separated
 * into buf (cut at n, for messages). */
void vl_case_known_names(const vl_case *c, unsigned where, char *buf, size_t n);
/* The same for one [case] setting key. */
vl_status vl_case_check_setting(vl_case_env *env, const vl_case *c, const char *key);

extern const vl_case vl_case_llm_lora;
extern const vl_case vl_case_sd_lora;
extern const vl_case vl_case_dataloader;
extern const vl_case vl_case_seg_ckpt;
extern const vl_case vl_case_multi_gpu;
#endif
