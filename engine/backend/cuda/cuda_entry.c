/* The CUDA backend's public entry points (backend.h), in every build.
 *
 * Without CUDA (no nvcc, or -DVRAMLAB_CUDA=OFF) there is no backend and no device:
 * vl_ctx_create(VL_DEV_CUDA) fails with VL_ERR_UNSUPPORTED and the GPU checks skip.
 *
 * With CUDA they forward to cuda_backend.cu. They live here rather than in the .cu because
 * of static-link order: the vramlab_cuda library comes AFTER vramlab_engine on the link
 * line, and the linker only takes an archive member for symbols wanted when it reads that
 * archive. cuda_host.o is called only by the .cu, so nothing would pull it in and the .cu's
 * calls would be undefined. backend.c's call to vl_backend_cuda() pulls this object, and the
 * anchor below makes this object pull cuda_host.o. */
#include "vramlab/backend.h"

#ifndef VRAMLAB_HAVE_CUDA

const vl_backend *vl_backend_cuda(void) { return NULL; }
bool vl_cuda_available(void) { return false; }

#else

#include "cuda_host.h"

__attribute__((used)) static void (*const vl_cuda_host_anchor)(int64_t, int, int, int *) =
    vl_cuda_grid;

const vl_backend *vl_backend_cuda(void) { return vl_cuda_backend_table(); }
bool vl_cuda_available(void) { return vl_cuda_probe(); }

#endif
