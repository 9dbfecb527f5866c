/* NF4 quantisation of frozen weights (QLoRA); layout in engine/kernels/nf4.h (engine-internal). */
#ifndef VRAMLAB_QUANT_H
#define VRAMLAB_QUANT_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
/* dst must hold vl_dtype_bytes(VL_NF4, n); n % 64 == 0. Returns 0 on success. */
int vl_nf4_quantize_host(uint8_t *dst, const float *src, int64_t n);
void vl_nf4_dequantize_host(float *dst, const uint8_t *src, int64_t n);
/* Element i of an NF4 buffer holding n weights, as the kernels read it. */
float vl_nf4_get_host(const uint8_t *buf, int64_t n, int64_t i);
#ifdef __cplusplus
}
#endif
#endif
