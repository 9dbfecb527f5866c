/* `vramlab list [CASE] [--json]`: the cases, their scales, rungs, knobs and settings. */
#ifndef VRAMLAB_LIST_H
#define VRAMLAB_LIST_H

#include <cjson/cJSON.h>
#include <stdbool.h>

/* Every case (case_id NULL) or one; as text or JSON on stdout. 0, or 2 for an unknown case
 * (the message names the known ones). */
int vl_cmd_list(const char *case_id, bool json);
/* The JSON `list --json` prints (NULL for an unknown case): {cases: [{id, summary, scales,
 * setting, knobs: [{name, default, help, rung, setting}], rungs: [{name, label, knobs}]}],
 * devices}. A case whose ladder does not load has ladder_error instead of setting/rungs. */
cJSON *vl_list_json(const char *case_id);

#endif
