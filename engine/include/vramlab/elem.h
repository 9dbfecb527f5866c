/* Host access to single elements of a float storage buffer (fp32, fp16, bf16), converted
 * exactly as the kernels convert them (round to nearest even), for code outside the engine
 * that fills or reads host copies: the collective benchmark, gpu-check. */
#ifndef VRAMLAB_ELEM_H
#define VRAMLAB_ELEM_H
#include <stdint.h>

#include "vramlab/core.h"
#ifdef __cplusplus
extern "C" {
#endif
/* Element i of p stored as dt (VL_F32, VL_F16 or VL_BF16), as fp32. */
float vl_elem_get(const void *p, vl_dtype dt, int64_t i);
/* Stores x as element i of p in dt. */
void vl_elem_set(void *p, vl_dtype dt, int64_t i, float x);
/* What x becomes once stored in dt and read back. */
float vl_elem_round(vl_dtype dt, float x);
#ifdef __cplusplus
}
#endif
#endif
