/* vramlab/elem.h: the kernels' own conversions (kernels/kcommon.h) behind functions. */
#include "vramlab/elem.h"

#include "../kernels/kcommon.h"

float vl_elem_get(const void *p, vl_dtype dt, int64_t i) { return vl_ld(p, (int)dt, i); }
void vl_elem_set(void *p, vl_dtype dt, int64_t i, float x) { vl_st(p, (int)dt, i, x); }
float vl_elem_round(vl_dtype dt, float x) { return vl_round_to((int)dt, x); }
