// Helpers over CuTe accumulator fragments shared by the sm_80 and sm_90a kernels. Which tile
// element a register holds always comes from CuTe (an identity tensor partitioned like the
// accumulator), never from hand-written lane arithmetic; the one layout fact the reductions rely
// on, that the threads holding one row of an accumulator are the four lanes of a quad, is
// checked on the host for every MMA the kernels use (csrc/tests/fragment_layout_check.cpp).
#pragma once

#include <cute/tensor.hpp>

#include "tile_args.h"

namespace scl::cuda {

// Sum and maximum over the four lanes of a quad (lanes 4k .. 4k + 3).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// An mma.sync (m16n8) accumulator ((2, 2), MMA_M, MMA_N) seen as (rows, columns):
// ((2, MMA_M), (2, MMA_N)): mode 0 of the value pair is the column pair, mode 1 the row + 8.
template <class Layout>
__device__ __host__ constexpr auto sm80_rows_columns(Layout const& l) {
  using namespace cute;
  static_assert(decltype(rank(l))::value == 3);
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// A wgmma accumulator ((2, 2, N/8), MMA_M, MMA_N) seen as (rows, columns):
// ((2, MMA_M), (2, N/8, MMA_N)).
template <class Layout>
__device__ __host__ constexpr auto sm90_rows_columns(Layout const& l) {
  using namespace cute;
  static_assert(decltype(rank(l))::value == 3);
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                     make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// Stores an fp32 accumulator into a shared-memory tile of element type T and layout `layout`
// (`coords` gives each element's coordinates): 16-bit T rounded, two adjacent columns per 32-bit
// st.shared; 32-bit T (fp32 kept for 3xTF32) as the float's bits. Shared-space 32-bit addresses:
// CuTe's generic pointers would make every address a 64-bit pair, and a tile's worth spills.
template <class T, class Layout, class Acc, class Coords>
__device__ __forceinline__ void store_tile_shared(T* tile, Layout const& layout, Acc const& acc,
                                                  Coords const& coords) {
  const uint32_t base = cute::cast_smem_ptr_to_uint(tile);
  constexpr int kStep = sizeof(T) == 2 ? 2 : 1;
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc); i += kStep) {
    uint32_t bits;
    if constexpr (sizeof(T) == 2) {
      bits = uint32_t(T(acc(i)).raw()) | (uint32_t(T(acc(i + 1)).raw()) << 16);
    } else {
      bits = __float_as_uint(acc(i));
    }
    const uint32_t address = base + uint32_t(sizeof(T)) *
                                        uint32_t(layout(cute::get<0>(coords(i)), cute::get<1>(coords(i))));
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(bits));
  }
}

// One row's terms from shared memory, by an explicit ld.shared: a generic load would need a
// 64-bit address (see store_tile_shared).
__device__ __forceinline__ RowTerms shared_terms(const RowTerms* at) {
  RowTerms t;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(t.x), "=f"(t.y), "=f"(t.z), "=f"(t.w)
               : "r"(cute::cast_smem_ptr_to_uint(at)));
  return t;
}

}  // namespace scl::cuda
