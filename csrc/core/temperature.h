// The temperature of one call, in the one form its plan chose (call_plan.h) and resolved once:
// a host value (t read on the host once per call, and checked there: 1/t in every formula), a
// tensor in device memory that the kernels read (TileKernels::reads_temperature: no host read,
// so a CUDA graph can capture the call), or unread: the form of a plan that refuses the call
// because it cannot read t now (Refusal::kTemperatureUnreadable), with which nothing runs. Every
// struct of the core and of the backends' glue carries this one value; the kernels take it as
// one KernelTemperature (kernel_temperature.h), and the Triton stage ops as its tensor and
// is_in_memory (csrc/triton/stage_arguments.h).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <utility>

#include "kernel_temperature.h"

namespace scl {

class Temperature {
 public:
  enum class Form { kUnread, kOnHost, kInMemory };

  // Unread (see above).
  Temperature() = default;

  // `t`: the value the host read and checked (positive, finite). The tensor that holds it is
  // the call's own ([1] float64 on the CPU, for the Triton stage ops), written in place: no
  // ATen call that a profile would count as work (bench/launch_count.py).
  static Temperature on_host(double t) {
    Temperature temperature;
    temperature.form_ = Form::kOnHost;
    temperature.inv_t_ = 1.0 / t;
    temperature.tensor_ = at::empty({1}, at::TensorOptions().dtype(at::kDouble));
    *temperature.tensor_.mutable_data_ptr<double>() = t;
    return temperature;
  }

  // `tensor`: [1] float64 on the rows' device.
  static Temperature in_memory(at::Tensor tensor) {
    TORCH_INTERNAL_ASSERT(tensor.scalar_type() == at::kDouble && tensor.numel() == 1 &&
                          tensor.is_contiguous());
    Temperature temperature;
    temperature.form_ = Form::kInMemory;
    temperature.tensor_ = std::move(tensor);
    return temperature;
  }

  Form form() const { return form_; }
  bool is_on_host() const { return form_ == Form::kOnHost; }
  bool is_in_memory() const { return form_ == Form::kInMemory; }

  // 1 / t, for the host's formulas: only a host value has one.
  double inv_t() const {
    TORCH_INTERNAL_ASSERT(is_on_host(), "the temperature is not a host value: no host 1/t");
    return inv_t_;
  }

  // [1] float64 holding t: on the rows' device in memory, on the CPU for a host value.
  const at::Tensor& tensor() const {
    TORCH_INTERNAL_ASSERT(form_ != Form::kUnread, "the temperature is unread");
    return tensor_;
  }

  // x / t in place, x float64 on the rows' device: by the tensor where t stays in memory (no
  // host read), else times the host's 1 / t.
  at::Tensor& divide(at::Tensor& x) const {
    return is_in_memory() ? x.div_(tensor_) : x.mul_(inv_t());
  }

  // The kernels' one argument (kernel_temperature.h).
  KernelTemperature for_kernels() const {
    TORCH_INTERNAL_ASSERT(form_ != Form::kUnread, "the temperature is unread: nothing runs");
    return is_in_memory() ? KernelTemperature::at(tensor_.const_data_ptr<double>())
                          : KernelTemperature::on_host(inv_t_);
  }

 private:
  Form form_ = Form::kUnread;
  double inv_t_ = 1.0;  // read only on the host (is_on_host)
  at::Tensor tensor_;
};

}  // namespace scl
