// Row-major GEMM on raw pointers through the Fortran BLAS that PyTorch's CPU library carries
// (MKL on x86 wheels, OpenBLAS elsewhere). The tile kernels call it for every tile, so it must
// cost nothing beyond the BLAS call itself: no tensors, no dispatcher.
#pragma once

#include <cstdint>
#include <stdexcept>

extern "C" {
// Weak, so that a PyTorch build without an exported BLAS loads the extension and reports the
// problem when the kernel is called instead of failing at import.
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc) __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b,
            const int* ldb, const double* beta, double* c, const int* ldc) __attribute__((weak));
// MKL's per-thread thread count, C interface (absent from other BLAS libraries, hence weak).
int MKL_Set_Num_Threads_Local(int threads) __attribute__((weak));
}

namespace scl::cpu {

inline bool blas_available() { return sgemm_ != nullptr && dgemm_ != nullptr; }

// C[m x n] = alpha * op(A) * op(B) + beta * C, all row-major; op(X) = X^T when trans_x.
// Row-major C = A B is column-major C^T = B^T A^T, hence the swapped operands.
template <typename T>
void gemm_row_major(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                    const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  // One BLAS thread per tile: the tile schedule is the parallelism, and a tile that MKL split
  // by torch's thread count (as it does outside a parallel region) would sum in an order that
  // depends on that count.
  struct SequentialBlas {
    int previous = MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0;
    ~SequentialBlas() {
      if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous);
    }
  } sequential;
  const char ta = trans_b ? 'T' : 'N';
  const char tb = trans_a ? 'T' : 'N';
  const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k);
  const int ilda = static_cast<int>(ldb), ildb = static_cast<int>(lda), ildc = static_cast<int>(ldc);
  if constexpr (sizeof(T) == sizeof(float)) {
    if (sgemm_ == nullptr) throw std::runtime_error("scl: PyTorch's CPU library exports no BLAS sgemm_");
    sgemm_(&ta, &tb, &im, &in, &ik, &alpha, b, &ilda, a, &ildb, &beta, c, &ildc);
  } else {
    if (dgemm_ == nullptr) throw std::runtime_error("scl: PyTorch's CPU library exports no BLAS dgemm_");
    dgemm_(&ta, &tb, &im, &in, &ik, &alpha, b, &ilda, a, &ildb, &beta, c, &ildc);
  }
}

}  // namespace scl::cpu
