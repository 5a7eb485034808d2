// The temperature of one call, in the one form its plan chose (call_plan.h) and resolved once: a
// host value (1/t known to the host, in every formula) or a tensor in device memory that the
// kernels read (TileKernels::reads_temperature: no host read, so a CUDA graph can capture the
// call). Every struct of the core and of the backends' glue carries this one value.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <limits>
#include <utility>

namespace scl {

class Temperature {
 public:
  Temperature() = default;

  static Temperature on_host(double inv_t) {
    Temperature t;
    t.inv_t_ = inv_t;
    return t;
  }

  // `tensor`: [1] float64 on the rows' device.
  static Temperature in_memory(at::Tensor tensor) {
    TORCH_INTERNAL_ASSERT(tensor.scalar_type() == at::kDouble && tensor.numel() == 1 &&
                          tensor.is_contiguous());
    Temperature t;
    t.tensor_ = std::move(tensor);
    return t;
  }

  bool is_in_memory() const { return tensor_.defined(); }

  // 1 / t, for the host's formulas; a call whose temperature is in memory has none.
  double inv_t() const {
    TORCH_INTERNAL_ASSERT(!is_in_memory(), "the temperature is in device memory: no host 1/t");
    return inv_t_;
  }

  const at::Tensor& tensor() const {
    TORCH_INTERNAL_ASSERT(is_in_memory(), "the temperature is a host value: no tensor");
    return tensor_;
  }

  // The kernels' two arguments (csrc/cuda/row_stages.h, the Triton stage ops): the pointer they
  // read t from, null for a host value, and 1/t, which they read only when the pointer is null.
  const double* device_pointer() const {
    return is_in_memory() ? tensor_.const_data_ptr<double>() : nullptr;
  }
  double kernel_inv_t() const {
    return is_in_memory() ? std::numeric_limits<double>::quiet_NaN() : inv_t_;
  }

 private:
  double inv_t_ = std::numeric_limits<double>::quiet_NaN();
  at::Tensor tensor_;
};

}  // namespace scl
