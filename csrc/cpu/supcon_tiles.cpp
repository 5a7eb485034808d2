// Picks an instruction set's copy of the tile kernels. Where the compiler or the architecture
// allows no raised target (isa_target.h), the default copy is the only one built.
#include "supcon_tiles.h"

#include "isa_target.h"

namespace scl::cpu {

template <typename T>
const TileKernelSet<T>& tile_kernels_for(CpuCapability capability) {
  switch (capability) {
#if SCL_CPU_DISPATCH_X86
    case CpuCapability::kAvx512:
      return scl_avx512::tile_kernels<T>();
    case CpuCapability::kAvx2:
      return scl_avx2::tile_kernels<T>();
#endif
    default:
      return scl_default::tile_kernels<T>();
  }
}
template const TileKernelSet<float>& tile_kernels_for<float>(CpuCapability);
template const TileKernelSet<double>& tile_kernels_for<double>(CpuCapability);

}  // namespace scl::cpu
