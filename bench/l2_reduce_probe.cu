// How fast can many programs add fp32 tiles into global memory on this GPU? The number that
// decides whether a triangle backward (docs/CUDA_KERNELS.md, "Why the backward walks full rows")
// can beat the full-row one: at N = 65,536, D = 128 and 128-row blocks, the triangle's column
// side is 131,072 tiles of 128 x 128 fp32 (64 KiB each, 8.6 GB in all) added into the [N, D]
// gradient, which stays in L2 (32 MiB). Each probe moves exactly that: every program walks its
// share of the tiles and adds a 64 KiB tile into a 128-row block of the output chosen per tile,
//   store   plain 16-byte stores (the write bandwidth the reductions are measured against)
//   red     atomicAdd(float4*) per 16 bytes (RED.E.ADD.F32x4, sm_90)
//   bulk    one cp.reduce.async.bulk .add.f32 of the whole tile from shared memory (the TMA unit)
// and checks afterwards that every element received every addition.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/l2_reduce_probe.cu \
//        -o build/l2_reduce_probe && build/l2_reduce_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kRows = 128, kDim = 128, kThreads = 256;
constexpr int kTileFloats = kRows * kDim;
constexpr int kTileBytes = kTileFloats * 4;
constexpr int kInFlight = 2;  // bulk reductions a program keeps outstanding, as a 2-stage ring would

enum Method { kStore = 0, kRed = 1, kBulk = 2 };
const char* const kMethodNames[] = {"store", "red", "bulk"};

#define CHECK(call)                                                                         \
  do {                                                                                      \
    cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));    \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

// The output block a tile lands in: spread over all blocks, as the triangle's columns are.
__host__ __device__ int target_block(long tile, int blocks) { return int((tile * 7919) % blocks); }

__global__ void __launch_bounds__(kThreads) add_tiles(float* out, int blocks, long tiles, int method) {
  extern __shared__ __align__(128) float tile_smem[];
  for (int i = threadIdx.x; i < kTileFloats; i += kThreads) tile_smem[i] = 1.0f;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to the bulk copies
  __syncthreads();
  const float4 ones = make_float4(1.f, 1.f, 1.f, 1.f);
  for (long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    float* dst = out + long(target_block(tile, blocks)) * kTileFloats;
    if (method == kBulk) {
      if (threadIdx.x == 0) {
        const unsigned src = unsigned(__cvta_generic_to_shared(tile_smem));
        asm volatile(
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
            "cp.async.bulk.commit_group;\n"
            "cp.async.bulk.wait_group.read %3;\n" ::"l"(dst), "r"(src), "r"(kTileBytes), "n"(kInFlight)
            : "memory");
      }
      continue;
    }
    float4* dst4 = reinterpret_cast<float4*>(dst);
    for (int i = threadIdx.x; i < kTileFloats / 4; i += kThreads) {
      if (method == kRed) {
        atomicAdd(dst4 + i, ones);
      } else {
        dst4[i] = ones;
      }
    }
  }
  if (method == kBulk && threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 65536;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 7;
  const int blocks = n / kRows;
  const long tiles = long(blocks) * blocks / 2;  // the column side of the triangle's tiles
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  float* out;
  CHECK(cudaMalloc(&out, size_t(n) * kDim * 4));
  CHECK(cudaFuncSetAttribute(add_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, kTileBytes));
  const int grid = prop.multiProcessorCount;  // one resident program per SM, as the kernels
  std::printf("%s, %d SMs; N = %d, D = %d: %ld tiles of %d KiB = %.2f GB per pass, median of %d\n",
              prop.name, grid, n, kDim, tiles, kTileBytes / 1024, tiles * double(kTileBytes) / 1e9,
              repeats);
  std::vector<long> per_block(blocks, 0);
  for (long t = 0; t < tiles; ++t) ++per_block[target_block(t, blocks)];
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int method : {kStore, kRed, kBulk}) {
    CHECK(cudaMemset(out, 0, size_t(n) * kDim * 4));
    std::vector<float> ms(repeats);
    for (int r = 0; r < repeats; ++r) {
      CHECK(cudaEventRecord(start));
      add_tiles<<<grid, kThreads, kTileBytes>>>(out, blocks, tiles, method);
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      CHECK(cudaGetLastError());
      CHECK(cudaEventElapsedTime(&ms[r], start, stop));
    }
    std::vector<float> host(size_t(n) * kDim);
    CHECK(cudaMemcpy(host.data(), out, host.size() * 4, cudaMemcpyDeviceToHost));
    long wrong = 0;
    for (int b = 0; b < blocks; ++b) {
      const float expect = method == kStore ? (per_block[b] ? 1.f : 0.f) : float(per_block[b] * repeats);
      for (int i = 0; i < kTileFloats; ++i) wrong += host[size_t(b) * kTileFloats + i] != expect;
    }
    std::sort(ms.begin(), ms.end());
    const float median = ms[repeats / 2];
    std::printf("%-6s %8.3f ms  %6.2f TB/s  %s\n", kMethodNames[method], median,
                tiles * double(kTileBytes) / (median * 1e-3) / 1e12,
                wrong ? "WRONG SUMS" : "sums checked");
    if (wrong) return 1;
  }
  return 0;
}
