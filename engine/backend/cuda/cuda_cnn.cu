/* PLACEHOLDER until the CNN ops land. */
#include "cuda_internal.h"
void vl_cuda_cnn_ops(vl_backend *b) { (void)b; }
