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

// Four floats into another program's shared memory (cluster_shared_address).
__device__ __forceinline__ void store_to_cluster(uint32_t remote, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
               :: "r"(remote), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
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
__device__ __forceinline__ void arrive_in_cluster_after_reads(uint32_t remote_barrier) {
#if defined(__CUDA_ARCH__)
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];" :: "r"(remote_barrier) : "memory");
#endif
}

// Four floats into another program's shared memory (`remote`), counted in bytes on that
// program's mbarrier `remote_barrier` (both cluster_shared_address; the PTX ISA requires both in
// the same program). The store is weak, and its completion is a complete-tx on the mbarrier with
// release at cluster scope (PTX ISA, st.async): the receiver's acquire wait on that mbarrier
// sees the floats, and the sender waits for nothing.
__device__ __forceinline__ void store_async_to_cluster(uint32_t remote, uint32_t remote_barrier, float a, float b,
                                                       float c, float d) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(remote), "f"(a), "f"(b), "f"(c), "f"(d), "r"(remote_barrier) : "memory");
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
// has read this program's.
template <bool kSeesPartnerData = true>
__device__ __forceinline__ void wait_for_cluster(const uint64_t* barrier, int parity) {
#if defined(__CUDA_ARCH__)
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
