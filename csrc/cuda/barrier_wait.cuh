// Waits on mbarriers: the sm_90 kernels' ring and own block (sm90_mainloop.cuh) and the triangle's
// exchange (cluster_pair.cuh). A release build waits as long as it takes. A build with
// SCL_CUDA_BOUNDED_WAITS (SCL_CUDA_DEBUG_WAITS=1, csrc/build_description.py) bounds every such
// wait: a phase that never completes (an arrival or a byte count lost, a parity off by one) then
// ends the kernel with the barrier's name, block and thread instead of hanging the GPU. Its printf
// is a call, across which ptxas keeps no wgmma in flight (its warning C7510): every wgmma of that
// build waits for the one before, so it finds hangs but says nothing of the release's timing.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

#if defined(SCL_CUDA_BOUNDED_WAITS)
#include <cstdio>
#endif

namespace scl::cuda {

#if defined(SCL_CUDA_BOUNDED_WAITS)
enum class AcquireScope { kCta, kCluster };

// About a second at an H100's clock: a walk's waits last microseconds, a whole launch at the
// headline size milliseconds, so only a wait that will never end gets there. Counted on the
// 32-bit clock (one register where clock64 takes two, in loops where the consumers hold all 168),
// whose unsigned differences stay right across its wrap up to 2^32 cycles.
constexpr uint32_t kWaitBoundCycles = 1u << 31;

template <AcquireScope kScope>
__device__ __forceinline__ bool phase_complete(uint32_t barrier, int parity) {
  uint32_t complete = 0;
#if defined(__CUDA_ARCH__)
  if constexpr (kScope == AcquireScope::kCluster) {
    asm volatile("{\n.reg .pred done;\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, done;\n}\n"
                 : "=r"(complete) : "r"(barrier), "r"(parity) : "memory");
  } else {
    asm volatile("{\n.reg .pred done;\n"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, done;\n}\n"
                 : "=r"(complete) : "r"(barrier), "r"(parity) : "memory");
  }
#endif
  return complete != 0;
}

// Out of line and never returning, so that the waits' loops keep no register for the report.
[[noreturn]] __device__ __noinline__ void trap_incomplete_wait(const char* name, int index, int parity) {
  printf("scl_kernels: mbarrier %s[%d] (parity %d) still incomplete after %u cycles: block (%d, %d, %d), "
         "thread %d\n",
         name, index, parity, kWaitBoundCycles, int(blockIdx.x), int(blockIdx.y), int(blockIdx.z), int(threadIdx.x));
  __trap();
}

// `name[index]`: the barrier as the shared storage names it.
template <AcquireScope kScope>
__device__ __forceinline__ void bounded_wait(const uint64_t* barrier, int parity, const char* name, int index) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
  const uint32_t start = uint32_t(clock());
  while (!phase_complete<kScope>(address, parity)) {
    if (uint32_t(clock()) - start > kWaitBoundCycles) trap_incomplete_wait(name, index, parity);
  }
}
#endif

// Phase `parity` of one of the pipeline's own barriers, with CUTLASS's wait (acquire at CTA scope)
// in a release build. `name[index]`: what a bounded wait reports.
__device__ __forceinline__ void wait_for_pipeline(const uint64_t* barrier, int parity, const char* name,
                                                  int index) {
#if defined(SCL_CUDA_BOUNDED_WAITS)
  bounded_wait<AcquireScope::kCta>(barrier, parity, name, index);
#else
  cutlass::arch::ClusterBarrier::wait(barrier, uint32_t(parity));
#endif
}

}  // namespace scl::cuda
