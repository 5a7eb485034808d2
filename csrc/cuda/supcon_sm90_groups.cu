// The wgmma + TMA family's launchers of the kernels compiled with the group mask
// (sm90_launchers.cuh): a translation unit of their own.
#include "sm90_launchers.cuh"

namespace scl::cuda::sm90 {

template struct Launchers<true>;

}  // namespace scl::cuda::sm90
