/* CUDA backend (being written). */
#include "gpu/gpu-impl.h"

int zn_cuda_backend_create(zn_dev *d, int ordinal)
{
    (void)d;
    return zn_set_error(ZN_ENODEV, "cuda:%d: CUDA backend not built yet", ordinal);
}
