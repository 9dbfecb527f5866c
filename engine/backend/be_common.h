/* What every backend's kernel wrappers share (included by cpu/cpu_internal.h and
 * cuda/cuda_internal.h). Host code; plain C that also compiles as the host side of a .cu
 * file. */
#ifndef VRAMLAB_BE_COMMON_H
#define VRAMLAB_BE_COMMON_H
#include "vramlab/backend.h"

/* A tensor's dtype as the int code the kernel bodies take (engine/kernels/kcommon.h:
 * VL_K_F32, VL_K_F16, VL_K_BF16 equal vl_dtype). */
static inline int dt(const vl_tensor *t) { return (int)t->dtype; }
/* An optional tensor's dtype code (fp32 when it is absent) and storage (NULL then). */
static inline int dt_or_f32(const vl_tensor *t) { return t ? dt(t) : (int)VL_F32; }
static inline void *data_or_null(const vl_tensor *t) { return t ? t->data : NULL; }

#endif
