// The temperature as every kernel takes it: one tagged value, made once per call by
// scl::Temperature::for_kernels (temperature.h). Either the host's 1/t, or a pointer to t in
// device memory ([1] float64) that the kernel reads itself, so that the call needs no host read
// (a CUDA graph can capture it). Torch-free and host-device, for the CUDA kernels (row_stages.h),
// the dry run and the host code alike.
#pragma once

#include "tile_math.h"

namespace scl {

struct KernelTemperature {
  bool in_memory;
  union {
    double inv_t;      // !in_memory: 1 / t, read on the host
    const double* t;   // in_memory: t on the device
  };

  static KernelTemperature on_host(double inv_t) {
    KernelTemperature k;
    k.in_memory = false;
    k.inv_t = inv_t;
    return k;
  }
  static KernelTemperature at(const double* t) {
    KernelTemperature k;
    k.in_memory = true;
    k.t = t;
    return k;
  }

  // 1 / t in float64, the same division wherever t was read, so results do not depend on it.
  SCL_HOST_DEVICE double inverse() const { return in_memory ? 1.0 / *t : inv_t; }
};

}  // namespace scl
