// Runs the 16-bit conversions of csrc/cuda/row_stages.h (the fused backward's stores) on the host
// for python_tests/static_checks/test_float16_conversions.py.
// Build: g++ -std=c++17 -O2 -I csrc csrc/tests/float16_conversion_check.cpp
// Reads float32 bit patterns, one hexadecimal word per line; prints, per line, the bfloat16 and
// half bit patterns of float_to_bfloat16 and float_to_half, and back to float32 through
// half_to_float and the bfloat16 widening (Rows::at), all in hexadecimal.
#include <cstdint>
#include <cstdio>

#include "cuda/row_stages.h"

int main() {
  namespace rs = scl::cuda::row_stages;
  unsigned int word;
  while (std::scanf("%x", &word) == 1) {
    const float x = rs::bits_to_float(word);
    const uint16_t bf16 = rs::float_to_bfloat16(x), half = rs::float_to_half(x);
    const rs::Rows bf16_row{scl::cuda::ElementType::kBFloat16, &bf16, 1};
    const rs::Rows half_row{scl::cuda::ElementType::kFloat16, &half, 1};
    std::printf("%04x %04x %08x %08x\n", unsigned(bf16), unsigned(half),
                unsigned(rs::float_to_bits(bf16_row.at(0, 0))),
                unsigned(rs::float_to_bits(half_row.at(0, 0))));
  }
  return 0;
}
