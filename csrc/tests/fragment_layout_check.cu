// Host checks of the CuTe layouts the CUDA kernels rely on but no CPU can run
// (python_tests/test_fragment_layouts.py compiles this with nvcc and runs it). The types are the
// kernels' own (sm80_kernels.cuh, sm90_kernels.cuh); only their layouts are evaluated, on the host.
// One line per check: "PASS name" or "FAIL name: details"; the exit status counts the failures.
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "../cuda/sm80_kernels.cuh"
#include "../cuda/sm90_kernels.cuh"

using namespace cute;

namespace {

int failures = 0;

// The element offset a shared-memory layout gives a coordinate. GMMA's swizzled layouts only
// evaluate through a shared-memory pointer (their swizzle reads the address bits), so through a
// tensor at a 1 KB aligned stand-in address.
template <class T, class Layout, class... Coord>
int offset(Layout const& layout, Coord... coord) {
  T* base = reinterpret_cast<T*>(uintptr_t(1) << 20);
  Tensor t = make_tensor(make_smem_ptr(base), layout);
  return int(raw_pointer_cast(&t(coord...)) - base);
}

void report(const std::string& name, const std::string& failure) {
  if (failure.empty()) {
    std::printf("PASS %s\n", name.c_str());
  } else {
    std::printf("FAIL %s: %s\n", name.c_str(), failure.c_str());
    ++failures;
  }
}

std::string at(int thread, int i, int row, int col) {
  return "thread " + std::to_string(thread) + " element " + std::to_string(i) + " (row " +
         std::to_string(row) + ", column " + std::to_string(col) + ")";
}

// The accumulator facts of fragments.cuh for a TiledMMA and a C tile of ROWS x COLS:
// quads own whole rows; the (rows, columns) view has one tile row per view row; elements
// 2i and 2i + 1 are adjacent columns of one row (store_tile_shared's pairs).
template <int ROWS, int COLS, class Mma, class RowsColumns>
void check_accumulator(const std::string& name, Mma mma, RowsColumns rows_columns) {
  std::string failure;
  std::map<int, std::set<int>> threads_of_row;
  std::map<int, std::set<int>> columns_of_row;
  for (int t = 0; t < int(size(mma)) && failure.empty(); ++t) {
    Tensor coords = mma.get_slice(t).partition_C(make_identity_tensor(Shape<Int<ROWS>, Int<COLS>>{}));
    for (int i = 0; i < int(size(coords)); ++i) {
      const int row = get<0>(coords(i)), col = get<1>(coords(i));
      threads_of_row[row].insert(t);
      columns_of_row[row].insert(col);
      if (i % 2 == 0) {
        const int row2 = get<0>(coords(i + 1)), col2 = get<1>(coords(i + 1));
        if (row2 != row || col2 != col + 1 || col % 2 != 0) failure = "pair broken at " + at(t, i, row, col);
      }
    }
    Tensor view = make_tensor(coords.data(), rows_columns(coords.layout()));
    if (int(size(view)) != int(size(coords))) failure = "the (rows, columns) view has another size";
    for (int r = 0; r < int(size<0>(view)) && failure.empty(); ++r) {
      for (int c = 0; c < int(size<1>(view)); ++c) {
        if (get<0>(view(r, c)) != get<0>(view(r, 0))) {
          failure = "view row " + std::to_string(r) + " mixes tile rows for thread " + std::to_string(t);
          break;
        }
      }
    }
  }
  for (const auto& [row, threads] : threads_of_row) {
    if (!failure.empty()) break;
    const int quad = *threads.begin() / 4;
    bool one_quad = threads.size() == 4;
    for (int t : threads) one_quad = one_quad && t / 4 == quad;
    if (!one_quad) failure = "row " + std::to_string(row) + " is not held by exactly one quad";
    if (int(columns_of_row[row].size()) != COLS) failure = "row " + std::to_string(row) + " misses columns";
  }
  if (failure.empty() && int(threads_of_row.size()) != ROWS) failure = "rows missing";
  report(name, failure);
}

template <class A, class B, class Map>
void check_same_offsets(const std::string& name, int n0, int n1, int n2, Map&& map) {
  std::string failure;
  for (int i = 0; i < n0 && failure.empty(); ++i)
    for (int j = 0; j < n1 && failure.empty(); ++j)
      for (int s = 0; s < n2 && failure.empty(); ++s) {
        const auto [a, b] = map(i, j, s);
        if (a != b) failure = "(" + std::to_string(i) + ", " + std::to_string(j) + ", " +
                              std::to_string(s) + "): " + std::to_string(a) + " != " + std::to_string(b);
      }
  report(name, failure);
}

// Runs of `run` consecutive elements along mode 1 start at multiples of `run` and are contiguous.
template <class Layout>
void check_runs(const std::string& name, Layout layout, int rows, int cols, int stages, int run) {
  std::string failure;
  for (int r = 0; r < rows && failure.empty(); ++r)
    for (int c = 0; c < cols && failure.empty(); c += run)
      for (int s = 0; s < stages && failure.empty(); ++s)
        for (int i = 1; i < run; ++i)
          if (int(layout(r, c + i, s)) != int(layout(r, c, s)) + i) {
            failure = "row " + std::to_string(r) + ", columns " + std::to_string(c) + ".." +
                      std::to_string(c + run - 1) + " are not contiguous";
            break;
          }
  report(name, failure);
}

template <class T>
void check_sm80(const std::string& type) {
  using C = scl::cuda::sm80::Config<T>;
  using namespace scl::cuda::sm80;
  auto rc = [](auto l) { return scl::cuda::sm80_rows_columns(l); };
  check_accumulator<kBlockM, kBlockN>("sm80 " + type + " logits accumulator", typename C::TiledMma{}, rc);
  check_accumulator<kBlockM, kBlockOut>("sm80 " + type + " gradient accumulator", typename C::TiledMma{}, rc);
  check_same_offsets<int, int>("sm80 " + type + " out chunk transposed", kBlockN, kBlockOut, 2,
                               [](int j, int d, int s) {
                                 return std::pair<int, int>(typename C::OutTransposed{}(d, j, s),
                                                            typename C::OutLayout{}(j, d, s));
                               });
  check_runs("sm80 " + type + " own chunk 16-byte runs", typename C::OwnLayout{}, kBlockM, C::kBlockK, 2, C::kVector);
  check_runs("sm80 " + type + " streamed chunk 16-byte runs", typename C::StreamLayout{}, kBlockN, C::kBlockK, 2, C::kVector);
  check_runs("sm80 " + type + " out chunk 16-byte runs", typename C::OutLayout{}, kBlockN, kBlockOut, 2, C::kVector);
  auto weights = [](int r, int c, int) { return offset<T>(typename C::WeightLayout{}, r, c); };
  check_runs("sm80 " + type + " weight pairs", weights, kBlockM, kBlockN, 1, sizeof(T) == 2 ? 2 : 1);
}

template <class T>
void check_sm90(const std::string& type) {
  using L = scl::cuda::sm90::Layouts<T>;
  using namespace scl::cuda::sm90;
  auto rc = [](auto l) { return scl::cuda::sm90_rows_columns(l); };
  check_accumulator<kRowsPerConsumer, kBlock>("sm90 " + type + " logits accumulator",
                                             make_tiled_mma(typename Atoms<T>::Logits{}), rc);
  check_accumulator<kRowsPerConsumer, 64>("sm90 " + type + " gradient accumulator (64)",
                                         make_tiled_mma(typename Atoms<T>::template Grads<64>{}), rc);
  check_accumulator<kRowsPerConsumer, 128>("sm90 " + type + " gradient accumulator (128)",
                                          make_tiled_mma(typename Atoms<T>::template Grads<128>{}), rc);
  check_same_offsets<int, int>("sm90 " + type + " tile read as (D, rows)", kBlock, kWidth, 1,
                               [](int row, int d, int) {
                                 return std::pair<int, int>(offset<T>(typename L::BlockTransposed{}, d, row),
                                                            offset<T>(typename L::Block{}, row, d));
                               });
  check_same_offsets<int, int>("sm90 " + type + " 64-column chunks of the transposed tile", kBlock, 64, 2,
                               [](int row, int d, int chunk) {
                                 T* base = reinterpret_cast<T*>(uintptr_t(1) << 20);
                                 Tensor t = make_tensor(make_smem_ptr(base), typename L::BlockTransposed{});
                                 Tensor part = local_tile(t, Shape<_64, Int<kBlock>>{}, make_coord(chunk, 0));
                                 const int via_chunk = int(raw_pointer_cast(&part(d, row)) - base);
                                 return std::pair<int, int>(via_chunk, offset<T>(typename L::Block{}, row, chunk * 64 + d));
                               });
  auto weights = [](int r, int c, int) { return offset<T>(typename L::Weights{}, r, c); };
  check_runs("sm90 " + type + " weight pairs", weights, kRowsPerConsumer, kBlock, 1, 2);
}

}  // namespace

int main() {
  check_sm80<cutlass::bfloat16_t>("bf16");
  check_sm80<cutlass::half_t>("fp16");
  check_sm80<float>("fp32");
  check_sm90<cutlass::bfloat16_t>("bf16");
  check_sm90<cutlass::half_t>("fp16");
  std::printf("%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
