/* The CUDA runtime calls the launch code needs (how many GPUs this rank can
 * see), kept apart so that launch.c builds without the CUDA toolkit. */
#include <cuda_runtime.h>

#include "comm/comm-impl.h"

int zn_comm_cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* "no GPU" (no driver, or insufficient driver) is an answer, not an
         * error: the rank runs on the host device. */
        zn_debug("comm: cudaGetDeviceCount: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}
