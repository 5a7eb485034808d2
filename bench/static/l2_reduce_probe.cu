// How fast can many programs add fp32 tiles into global memory on this GPU? The number that
// decides whether a triangle backward (docs/CUDA_KERNELS.md, "The triangle backward")
// can beat the full-row one: at N = 65,536, D = 128 and 128-row blocks, the triangle's column
// side is 131,072 tiles of 128 x 128 fp32 (64 KiB each, 8.6 GB in all) added into the [N, D]
// gradient, which stays in L2 (32 MiB). Each probe moves exactly that: every program walks its
// share of the tiles and adds a 64 KiB tile into a 128-row block of the output chosen per tile,
//   store   plain 16-byte stores (the write bandwidth the reductions are measured against)
//   red     atomicAdd(float4*) per 16 bytes (RED.E.ADD.F32x4, sm_90)
//   bulk    one cp.reduce.async.bulk .add.f32 of the whole tile from shared memory (the TMA unit)
//   pair    the 2-program cluster design the first GPU session chose (bulk at 3.31 TB/s): the two
//           programs of a cluster hold partial tiles of the same column block, each adds the
//           partner's half to its own over distributed shared memory and sends that half by one
//           bulk reduction, so global memory gets half the bytes; a cluster barrier per step
// and checks afterwards that every element received every addition. Every rate is partial-tile
// bytes absorbed per second (pair: two partial tiles per step), so the four compare directly.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/static/l2_reduce_probe.cu \
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
constexpr int kHalfFloats = kTileFloats / 2, kHalfBytes = kTileBytes / 2;
constexpr int kInFlight = 2;  // bulk reductions a program keeps outstanding, as a 2-stage ring would

enum Method { kStore = 0, kRed = 1, kBulk = 2, kPair = 3 };
const char* const kMethodNames[] = {"store", "red", "bulk", "pair"};

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

// One bulk reduction (the TMA unit) of `bytes` from shared memory into global memory.
__device__ void bulk_add(float* dst, const float* src, int bytes) {
  const unsigned from = unsigned(__cvta_generic_to_shared(src));
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst), "r"(from), "r"(bytes)
      : "memory");
}

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
        bulk_add(dst, tile_smem, kTileBytes);
        asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kInFlight) : "memory");
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

__device__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The pair method: `tiles` partial tiles, two per cluster step. Each program's partial is a
// constant tile of ones (a real kernel computes a new one per step: the barrier at the top of a
// step stands for "the partner's partial is ready"); half `rank` of the sum goes out from here.
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads)
    add_tile_pairs(float* out, int blocks, long tiles) {
  extern __shared__ __align__(128) float pair_smem[];
  float* partial = pair_smem;                 // kTileFloats
  float* staged = pair_smem + kTileFloats;    // kInFlight halves
  for (int i = threadIdx.x; i < kTileFloats; i += kThreads) partial[i] = 1.0f;
  unsigned rank, partner;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm("mapa.shared::cluster.u32 %0, %1, %2;"
      : "=r"(partner)
      : "r"(unsigned(__cvta_generic_to_shared(partial))), "r"(rank ^ 1u));
  const int half = int(rank) * kHalfFloats;
  const long steps = tiles / 2, cluster = blockIdx.x / 2, clusters = gridDim.x / 2;
  int slot = 0;
  for (long step = cluster; step < steps; step += clusters) {
    // The slot's previous bulk reduction must have read it.
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kInFlight - 1) : "memory");
    cluster_sync();
    float4* stage = reinterpret_cast<float4*>(staged + slot * kHalfFloats);
    const float4* mine = reinterpret_cast<const float4*>(partial + half);
    for (int i = threadIdx.x; i < kHalfFloats / 4; i += kThreads) {
      float4 theirs;
      asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(theirs.x), "=f"(theirs.y), "=f"(theirs.z), "=f"(theirs.w)
                   : "r"(partner + unsigned((half + 4 * i) * 4)));
      const float4 own = mine[i];
      stage[i] = make_float4(own.x + theirs.x, own.y + theirs.y, own.z + theirs.z, own.w + theirs.w);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to the bulk copy
    __syncthreads();
    if (threadIdx.x == 0) {
      bulk_add(out + long(target_block(step, blocks)) * kTileFloats + half, staged + slot * kHalfFloats,
               kHalfBytes);
    }
    slot = (slot + 1) % kInFlight;
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  cluster_sync();  // the partner may still be reading this program's partial
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
  constexpr int kPairSmem = kTileBytes + kInFlight * kHalfBytes;
  CHECK(cudaFuncSetAttribute(add_tile_pairs, cudaFuncAttributeMaxDynamicSharedMemorySize, kPairSmem));
  const int grid = prop.multiProcessorCount / 2 * 2;  // one resident program per SM, in pairs
  std::printf("%s, %d SMs; N = %d, D = %d: %ld tiles of %d KiB = %.2f GB per pass, median of %d\n",
              prop.name, grid, n, kDim, tiles, kTileBytes / 1024, tiles * double(kTileBytes) / 1e9,
              repeats);
  // Additions each output block receives per pass: one per tile, two per pair step.
  std::vector<long> per_block(blocks, 0), per_block_pairs(blocks, 0);
  for (long t = 0; t < tiles; ++t) ++per_block[target_block(t, blocks)];
  for (long step = 0; step < tiles / 2; ++step) per_block_pairs[target_block(step, blocks)] += 2;
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int method : {kStore, kRed, kBulk, kPair}) {
    CHECK(cudaMemset(out, 0, size_t(n) * kDim * 4));
    std::vector<float> ms(repeats);
    for (int r = 0; r < repeats; ++r) {
      CHECK(cudaEventRecord(start));
      if (method == kPair) {
        add_tile_pairs<<<grid, kThreads, kPairSmem>>>(out, blocks, tiles);
      } else {
        add_tiles<<<grid, kThreads, kTileBytes>>>(out, blocks, tiles, method);
      }
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      CHECK(cudaGetLastError());
      CHECK(cudaEventElapsedTime(&ms[r], start, stop));
    }
    std::vector<float> host(size_t(n) * kDim);
    CHECK(cudaMemcpy(host.data(), out, host.size() * 4, cudaMemcpyDeviceToHost));
    long wrong = 0;
    for (int b = 0; b < blocks; ++b) {
      const long adds = method == kPair ? per_block_pairs[b] : per_block[b];
      const float expect = method == kStore ? (adds ? 1.f : 0.f) : float(adds * repeats);
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
