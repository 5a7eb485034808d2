// Two programs of a thread-block cluster (sm_90) handing each other data through distributed
// shared memory: the symmetric backward's partners add their partial gradients of a column
// block before one reduction into global memory (sm90_kernels.cuh, Walk::kGradTriangle).
//
// Raw PTX, because CuTe and CUTLASS name these steps only inside their pipelines: a store into
// the partner's shared memory, an arrive on the partner's mbarrier with release at cluster scope
// (CUTLASS's ClusterBarrier::arrive(cta_id) leaves the scope at its default, the CTA), and a
// wait on an own mbarrier with acquire at cluster scope, so that the partner's stores made
// before its arrive are visible after the wait.
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

// Waits for phase `parity` of an own mbarrier whose arrivals come from the cluster.
__device__ __forceinline__ void wait_for_cluster(const uint64_t* barrier, int parity) {
#if defined(__CUDA_ARCH__)
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" :: "r"(address), "r"(parity) : "memory");
#endif
}

}  // namespace scl::cuda
