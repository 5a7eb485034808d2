// The mma.sync family's launchers of the kernels compiled with the group mask
// (sm80_launchers.cuh): a translation unit of their own.
#include "sm80_launchers.cuh"

namespace scl::cuda::sm80 {

template struct Launchers<true>;

}  // namespace scl::cuda::sm80
