/* seg-ckpt's own pieces shared by its files: the timed run (run.c), the interleaved step
 * timing (interleaved.c) and the report (seg_report.c). The rung they train (knobs, step,
 * data, loader, evaluation) is the kit's (kit/segrung.h), shared with multi-gpu. Every
 * function that can fail returns vl_status with its message in env->err (vl_case_fail). */
#ifndef VRAMLAB_SEG_CKPT_H
#define VRAMLAB_SEG_CKPT_H

#include "kit/segrung.h"

/* One repetition of a rung on env->device at env->scale (run.c): the case's run hook. */
vl_status vl_segcase_run(vl_case_env *env, const vl_knobs *k, int rep, cJSON *out);

/* The cost of checkpointing and in-place ReLU off, the three rungs' models stepped in turn
 * (interleaved.c): case_metrics.interleaved_steps and each rung's interleaved_step_seconds. */
vl_status vl_segcase_interleaved(vl_case_env *env, cJSON *res);

/* The case's report sections (the report hook). */
void vl_segcase_report(cJSON *res, FILE *md, FILE *appendix, const char *dir, const char *case_id, bool gnuplot);

#endif
