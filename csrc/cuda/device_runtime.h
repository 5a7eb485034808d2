// What the ATen glue (supcon_cuda.cpp) asks of the CUDA runtime: a device guard, the device's
// compute capability, SM count and current stream, a check after each launch, and whether the
// stream is capturing a graph. The dry run (csrc/cuda_dry_run) answers as an idle H100 SXM would,
// without one, so that the glue's launches can be counted on a CPU.
#pragma once

#include <ATen/ATen.h>

#include "launch.h"

#ifdef SCL_CUDA_DRY_RUN

#include "../core/test_hooks.h"

namespace scl::cuda {

struct DeviceGuard {
  explicit DeviceGuard(const at::Device&) {}
};
inline Device current_device(const at::Tensor&) { return {90, 132, nullptr}; }
inline void check_launch() {}
// The tests may have it answer as a stream that captures a CUDA graph (TestHooks), so that a CPU
// test sees what a call leaves out then.
inline bool stream_is_capturing(const at::Tensor&) { return test_hooks().dry_run_capturing; }

}  // namespace scl::cuda

#else

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace scl::cuda {

using DeviceGuard = c10::cuda::CUDAGuard;

inline Device current_device(const at::Tensor& like) {
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  return {props->major * 10 + props->minor, props->multiProcessorCount,
          at::cuda::getCurrentCUDAStream(like.device().index()).stream()};
}

inline void check_launch() { C10_CUDA_KERNEL_LAUNCH_CHECK(); }

inline bool stream_is_capturing(const at::Tensor& like) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(
      at::cuda::getCurrentCUDAStream(like.device().index()).stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace scl::cuda

#endif
