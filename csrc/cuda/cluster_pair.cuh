// Two programs of a thread-block cluster (sm_90) handing each other data through distributed
// shared memory: the symmetric backward's partners add their partial gradients of a column
// block before one reduction into global memory (sm90_kernels.cuh, Walk::kGradTriangle and
// Walk::kGradTriangleAsync).
//
// Raw PTX, because CuTe and CUTLASS name these steps only inside their pipelines (and CUTLASS's
// barrier functions do not tell the compiler that they order memory): a store into the
// partner's shared memory, an arrive on the partner's mbarrier with release at cluster scope
// (CUTLASS's ClusterBarrier::arrive(cta_id) leaves the scope at its default, the CTA), and a
// wait on an own mbarrier with acquire at cluster scope, so that the partner's stores made
// before its arrive are visible after the wait. The release at cluster scope compiles to
// MEMBAR.ALL.GPU; the asynchronous form (st.async, below) needs none.
#pragma once

#include <cstdint>

#include "barrier_wait.cuh"

namespace scl::cuda {

// The shared-memory address `local` (this program's) names in program `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_shared_address(const void* local, uint32_t rank) {
  uint32_t remote = 0;
#if defined(__CUDA_ARCH__)
  const uint32_t own = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(own), "r"(rank));
#endif
  return remote;
}

// What one store into another program's shared memory carries: the stores below are .v4.f32.
using ClusterQuad = float[4];

// A quad into another program's shared memory (cluster_shared_address).
__device__ __forceinline__ void store_to_cluster(uint32_t remote, const ClusterQuad& quad) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
               :: "r"(remote), "f"(quad[0]), "f"(quad[1]), "f"(quad[2]), "f"(quad[3]) : "memory");
#endif
}

// One arrival on another program's mbarrier, releasing this thread's earlier stores and reads to
// the threads that then wait on it.
__device__ __forceinline__ void arrive_in_cluster(uint32_t remote_barrier) {
#if defined(__CUDA_ARCH__)
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];"
               :: "r"(remote_barrier) : "memory");
#endif
}

// One arrival on another program's mbarrier with release at CTA scope (the PTX default, and what
// CUTLASS's multicast pipelines release a consumed stage with): it orders this thread's earlier
// reads of its own shared memory before the arrival, so the partner, which writes there only
// after it has waited for this arrival, cannot overwrite what they still read. No fence at GPU
// scope: nothing of this thread's global memory traffic is waited for.
// `loaded`: one register of each of those reads (shared-memory loads). The memory model orders
// the reads before the release (above), but in the machine code a load is only issued when the
// next instruction issues, and its data are waited for only where a register it writes is read:
// ptxas issued the arrive while half the received buffer's loads were in flight. So the arrive's
// address depends on every load: each value enters as value * 0 (+0, -0 or NaN, which
// cvt.rzi.u32 makes 0), which ptxas may not fold away as it folds value & 0.
template <int kLoads>
__device__ __forceinline__ void arrive_in_cluster_after_reads(uint32_t remote_barrier, const float (&loaded)[kLoads]) {
#if defined(__CUDA_ARCH__)
  float zero = 0.0f;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) asm("fma.rn.f32 %0, %1, 0f00000000, %0;" : "+f"(zero) : "f"(loaded[i]));
  asm("{\n"
      ".reg .u32 offset;\n"
      "cvt.rzi.u32.f32 offset, %1;\n"
      "add.u32 %0, %0, offset;\n"
      "}\n"
      : "+r"(remote_barrier) : "f"(zero));
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];" :: "r"(remote_barrier) : "memory");
#endif
}

// A quad into another program's shared memory (`remote`), counted in bytes on that
// program's mbarrier `remote_barrier` (both cluster_shared_address; the PTX ISA requires both in
// the same program). The store is weak, and its completion is a complete-tx on the mbarrier with
// release at cluster scope (PTX ISA, st.async): the receiver's acquire wait on that mbarrier
// sees the floats, and the sender waits for nothing.
__device__ __forceinline__ void store_async_to_cluster(uint32_t remote, uint32_t remote_barrier,
                                                       const ClusterQuad& quad) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(remote), "f"(quad[0]), "f"(quad[1]), "f"(quad[2]), "f"(quad[3]), "r"(remote_barrier)
               : "memory");
#endif
}

#define SCL_WAIT_FOR_PHASE(SEMANTICS)                                                  \
  "{\n"                                                                                \
  ".reg .pred done;\n"                                                                 \
  "WAIT_%=:\n"                                                                         \
  "mbarrier.try_wait.parity." SEMANTICS ".shared::cta.b64 done, [%0], %1;\n"           \
  "@!done bra WAIT_%=;\n"                                                              \
  "}\n"

// Waits for phase `parity` of an own mbarrier whose arrivals come from the cluster. With
// acquire at cluster scope (kSeesPartnerData), the partner's stores made before its arrive, or
// its st.async data, are visible after the wait (the wait then invalidates L1: CCTL.IVALL);
// with acquire at CTA scope, for an arrival that carries no data, only the news that the partner
// has read this program's. `name[index]`: what a bounded wait reports (barrier_wait.cuh).
template <bool kSeesPartnerData = true>
__device__ __forceinline__ void wait_for_cluster(const uint64_t* barrier, int parity, const char* name, int index) {
#if defined(SCL_CUDA_BOUNDED_WAITS)
  bounded_wait<kSeesPartnerData ? AcquireScope::kCluster : AcquireScope::kCta>(barrier, parity, name, index);
#elif defined(__CUDA_ARCH__)
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
  if constexpr (kSeesPartnerData) {
    asm volatile(SCL_WAIT_FOR_PHASE("acquire.cluster") :: "r"(address), "r"(parity) : "memory");
  } else {
    asm volatile(SCL_WAIT_FOR_PHASE("acquire.cta") :: "r"(address), "r"(parity) : "memory");
  }
#endif
}

#undef SCL_WAIT_FOR_PHASE

}  // namespace scl::cuda
