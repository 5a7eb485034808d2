// Host checks, built with the host C++ compiler (g++), of the CuTe layouts the CUDA kernels rely
// on but no CPU can run (python_tests/test_fragment_layouts.py builds and runs this). CuTe's
// layout algebra is host code, so the checks evaluate the kernels' OWN types: the kernel headers
// (sm80_kernels.cuh, sm90_kernels.cuh, fragments.cuh) are included as they are, not re-declared.
// They are CUDA sources, so they are included behind the small host shim below: the CUDA
// toolkit's <cuda_runtime.h> defines __device__, __global__, __forceinline__, __shared__ etc. for
// a host compiler, __launch_bounds__ is defined away, and the few device built-ins the headers
// name outside templates are DECLARED only (never defined: nothing here calls device code, and a
// call would fail to link). No kernel is instantiated; only layouts, tiled MMAs and tensors over
// stand-in shared-memory addresses are evaluated.
//
// Build: g++ -std=c++20 -I csrc -I <cutlass include> -I <cuda include> [-I <cuda include>/cccl]
//
// Output: one line per check, "PASS <family> | <name> | <details>" or
// "FAIL <family> | <name> | <details>", then "SUMMARY <checks> checks, <failed> failed"; the exit
// status is 1 when any check fails. Families:
//   quads                every row of an accumulator is held by exactly the 4 lanes of one quad,
//                        which together hold all its columns (quad_sum / quad_max, fragments.cuh)
//   views                sm80_rows_columns / sm90_rows_columns: a bijection onto the thread's
//                        registers, agreeing between the accumulator and its coordinates; one
//                        tile row per view row, one tile column per view column; the 4 lanes of a
//                        quad see the same tile row at view row r, their columns partitioning it
//   sm90-operands        for both resident widths (128, 256), the streamed tile read as (d, row)
//                        (BlockTransposed, whole and in every 128-wide d chunk) is the same
//                        bytes as Block; Ring's stages are Block at stage * cosize(Block)
//   sm80-out-transposed  Config<T>::OutTransposed(d, j, s) == OutLayout(j, d, s)
//   smem-addressing      what the kernels compute by evaluating a layout as a function (cp.async
//                        destinations, store_tile_shared) is what the tensors over shared memory
//                        (ldmatrix) read; 16-byte runs; store_tile_shared's column pairs
//   sm90-register-operand  the sm_90a backward's weights, copied element by element from the
//                        logits accumulator into the A fragment of the register-sourced grads
//                        wgmma, keep their (row, column)
//   sm90-triangle        the triangle backward's assumptions: in every 64x128 accumulator it
//                        reads (logits, gradient, column product), elements 2m, 2m + 1 are
//                        columns c, c + 1 of one row, c even (float2 atomics, packed stores), and
//                        element e + 32 is element e 64 columns on (the partners' halves),
//                        elements 4g + 2, 4g + 3 are 4g, 4g + 1 eight rows down and lane ^ 1 holds
//                        the two columns after an even lane's (16-byte atomics); the
//                        logits' (row, column) view pairs columns the same way; its weights
//                        tile's 32-bit offsets (weights_byte_offset) are those of a tensor over
//                        shared memory, and rows j and j + 1 of an own row i are adjacent for
//                        even j
#if defined(__CUDACC__)
#error "a host program: build it with the host C++ compiler, not nvcc"
#endif

#include <cuda_runtime.h>  // __device__, __global__, __forceinline__, __shared__, uint3 for a host compiler

#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

// ---- host shim for the kernel headers (declarations only; see the top of the file) ----
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
extern const uint3 threadIdx;
extern const uint3 blockIdx;
float __shfl_xor_sync(unsigned mask, float value, int lane_mask, int width = 32);
unsigned __float_as_uint(float);
float __uint_as_float(unsigned);
float atomicAdd(float* address, float value);
float4 atomicAdd(float4* address, float4 value);
void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
int2 __ldg(const int2* address);

#include "cuda/fragments.cuh"
#include "cuda/sm80_kernels.cuh"
#include "cuda/sm90_kernels.cuh"

using namespace cute;

namespace {

int checks = 0;
int failures = 0;

// A check's failures: the count and the first few, verbatim.
struct Failures {
  std::vector<std::string> first;
  int count = 0;
  void add(const std::string& what) {
    if (first.size() < 6) first.push_back(what);
    ++count;
  }
  bool empty() const { return count == 0; }
};

void report(const char* family, const std::string& name, const Failures& f, const std::string& ok) {
  ++checks;
  if (f.empty()) {
    std::printf("PASS %s | %s | %s\n", family, name.c_str(), ok.c_str());
    return;
  }
  ++failures;
  std::string details = std::to_string(f.count) + " failure(s): ";
  for (size_t i = 0; i < f.first.size(); ++i) details += (i ? "; " : "") + f.first[i];
  if (f.count > int(f.first.size())) details += "; ...";
  std::printf("FAIL %s | %s | %s\n", family, name.c_str(), details.c_str());
}

std::string str(int v) { return std::to_string(v); }
std::string rc(int row, int col) { return "(row " + str(row) + ", col " + str(col) + ")"; }

struct Coord {
  int row, col;
};

// The element offset of a coordinate, as a tensor over shared memory sees it: the way ldmatrix,
// wgmma descriptors and TMA use a layout. GMMA's swizzled layouts swizzle the byte ADDRESS (their
// smem_ptr_flag), so the tensor is made over a 1 KB aligned stand-in address (never dereferenced).
template <class T, class Layout, class... Coords>
int tensor_offset(Layout const& layout, Coords... coords) {
  T* base = reinterpret_cast<T*>(uintptr_t(1) << 20);
  Tensor t = make_tensor(make_smem_ptr(base), layout);
  return int(raw_pointer_cast(&t(coords...)) - base);
}

// ---------------------------------------------------------------------------------------------
// Checks 1 (quads) and 1b (views): the accumulator of a TiledMMA for a ROWS x COLS C tile.
// ---------------------------------------------------------------------------------------------
template <int ROWS, int COLS, class Mma, class RowsColumns>
void check_accumulator(const std::string& name, Mma mma, RowsColumns rows_columns) {
  using Tile = Shape<Int<ROWS>, Int<COLS>>;
  const int threads = int(size(mma));
  Tensor frag = partition_fragment_C(mma, Tile{});  // the kernels' accumulator (registers)
  auto acc_layout = frag.layout();
  const int n = int(size(frag));
  auto acc_view = rows_columns(acc_layout);
  const int view_rows = int(size<0>(acc_view)), view_cols = int(size<1>(acc_view));

  Failures quads, views;
  std::vector<std::vector<Coord>> held(threads);             // [thread][natural index]
  std::vector<std::vector<int>> row_of_view_row(threads);    // [thread][view row] -> tile row
  std::vector<std::vector<std::vector<int>>> cols_of_view_row(threads);  // [thread][view row]
  std::vector<std::vector<int>> owner(ROWS, std::vector<int>(COLS, -1));

  // The accumulator's registers: natural index i is register acc_layout(i); invert it.
  std::vector<int> natural_of_register(n, -1);
  for (int i = 0; i < n; ++i) {
    const int reg = int(acc_layout(i));
    if (reg < 0 || reg >= n || natural_of_register[reg] != -1) {
      views.add("the accumulator's layout is not a bijection onto its " + str(n) + " registers at element " + str(i));
    } else {
      natural_of_register[reg] = i;
    }
  }
  if (view_rows * view_cols != n) views.add("the (rows, columns) view has " + str(view_rows * view_cols) + " elements, the fragment " + str(n));

  for (int t = 0; t < threads; ++t) {
    Tensor coords = mma.get_slice(t).partition_C(make_identity_tensor(Tile{}));
    static_assert(std::is_same_v<decltype(shape(coords.layout())), decltype(shape(acc_layout))>,
                  "the coordinates and the accumulator must have the same shape");
    if (int(size(coords)) != n) {
      quads.add("thread " + str(t) + " holds " + str(int(size(coords))) + " elements, not " + str(n));
      continue;
    }
    for (int i = 0; i < n; ++i) {
      const Coord c{int(get<0>(coords(i))), int(get<1>(coords(i)))};
      held[t].push_back(c);
      if (c.row < 0 || c.row >= ROWS || c.col < 0 || c.col >= COLS) {
        quads.add("thread " + str(t) + " element " + str(i) + " " + rc(c.row, c.col) + " is outside the tile");
      } else if (owner[c.row][c.col] != -1) {
        quads.add(rc(c.row, c.col) + " is held by threads " + str(owner[c.row][c.col]) + " and " + str(t));
      } else {
        owner[c.row][c.col] = t;
      }
    }
    // The views of the accumulator (registers) and of the coordinates, as the kernels make them.
    Tensor coords_rc = make_tensor(coords.data(), rows_columns(coords.layout()));
    if (int(size<0>(coords_rc)) != view_rows || int(size<1>(coords_rc)) != view_cols) {
      views.add("thread " + str(t) + ": the coordinates' view has another shape than the accumulator's");
      continue;
    }
    std::vector<int> seen(n, 0);
    row_of_view_row[t].assign(view_rows, -1);
    cols_of_view_row[t].assign(view_rows, {});
    for (int r = 0; r < view_rows; ++r) {
      for (int c = 0; c < view_cols; ++c) {
        const int reg = int(acc_view(r, c));
        if (reg < 0 || reg >= n) {
          views.add("thread " + str(t) + " view (" + str(r) + ", " + str(c) + ") is register " + str(reg) + ", outside the fragment");
          continue;
        }
        ++seen[reg];
        const Coord got{int(get<0>(coords_rc(r, c))), int(get<1>(coords_rc(r, c)))};
        const int nat = natural_of_register[reg];
        if (nat >= 0 && (got.row != held[t][nat].row || got.col != held[t][nat].col)) {
          views.add("thread " + str(t) + " view (" + str(r) + ", " + str(c) + "): the accumulator's register " + str(reg) +
                    " holds " + rc(held[t][nat].row, held[t][nat].col) + ", the coordinates' view says " + rc(got.row, got.col));
        }
        const int row0 = int(get<0>(coords_rc(r, 0))), col0 = int(get<1>(coords_rc(0, c)));
        if (got.row != row0) {
          views.add("thread " + str(t) + " view row " + str(r) + " mixes tile rows " + str(row0) + " and " + str(got.row) +
                    " (view column " + str(c) + ", " + rc(got.row, got.col) + ")");
        }
        if (got.col != col0) {
          views.add("thread " + str(t) + " view column " + str(c) + " mixes tile columns " + str(col0) + " and " + str(got.col) +
                    " (view row " + str(r) + ", " + rc(got.row, got.col) + ")");
        }
        row_of_view_row[t][r] = row0;
        cols_of_view_row[t][r].push_back(got.col);
      }
    }
    for (int reg = 0; reg < n; ++reg) {
      if (seen[reg] != 1) views.add("thread " + str(t) + ": register " + str(reg) + " appears " + str(seen[reg]) + " times in the view");
    }
  }

  // (quads) The tile is covered; each row's holders are exactly the 4 lanes of one quad, and
  // those hold all its columns.
  for (int row = 0; row < ROWS; ++row) {
    std::set<int> holders;
    for (int col = 0; col < COLS; ++col) {
      if (owner[row][col] == -1) {
        quads.add(rc(row, col) + " is held by no thread");
      } else {
        holders.insert(owner[row][col]);
      }
    }
    if (holders.empty()) continue;
    const int quad = *holders.begin() / 4;
    bool one_quad = holders.size() == 4;
    for (int t : holders) one_quad = one_quad && t / 4 == quad;
    if (!one_quad) {
      std::string who;
      for (int t : holders) who += (who.empty() ? "" : ",") + str(t);
      quads.add("row " + str(row) + " is held by threads {" + who + "}, not the 4 lanes of one quad");
    }
  }

  // (views) quad_sum / quad_max of a per-view-row value: the 4 lanes of a quad see the same tile
  // row at view row r, and their columns of it are all COLS columns, each once.
  for (int q = 0; q < threads / 4; ++q) {
    for (int r = 0; r < view_rows; ++r) {
      std::vector<int> count(COLS, 0);
      for (int k = 0; k < 4; ++k) {
        const int t = 4 * q + k;
        if (row_of_view_row[t].size() != size_t(view_rows) || row_of_view_row[4 * q].size() != size_t(view_rows)) continue;
        if (row_of_view_row[t][r] != row_of_view_row[4 * q][r]) {
          views.add("quad " + str(q) + " view row " + str(r) + ": thread " + str(4 * q) + " has tile row " + str(row_of_view_row[4 * q][r]) +
                    ", thread " + str(t) + " tile row " + str(row_of_view_row[t][r]));
        }
        for (int col : cols_of_view_row[t][r]) {
          if (col >= 0 && col < COLS) ++count[col];
        }
      }
      for (int col = 0; col < COLS; ++col) {
        if (count[col] != 1) {
          views.add("quad " + str(q) + " view row " + str(r) + " (tile row " + str(row_of_view_row[4 * q].empty() ? -1 : row_of_view_row[4 * q][r]) +
                    "): column " + str(col) + " is held " + str(count[col]) + " times by the quad");
        }
      }
    }
  }

  const std::string shape = " C(" + str(ROWS) + "," + str(COLS) + ")";
  report("quads", name + shape, quads,
         str(threads) + " threads x " + str(n) + " elements cover the tile once; each of the " + str(ROWS) +
             " rows is held by exactly one quad (lanes 4k..4k+3), which holds all " + str(COLS) + " columns");
  report("views", name + shape, views,
         "(" + str(view_rows) + " rows, " + str(view_cols) + " columns) per thread: a bijection onto the registers, the same "
         "elements in the accumulator's and the coordinates' views, one tile row per view row, one tile column per view "
         "column, quad lanes agree on each view row's tile row and partition its columns");
}

// ---------------------------------------------------------------------------------------------
// Offsets compared over a grid of coordinates.
// ---------------------------------------------------------------------------------------------
template <class Map>
void check_same_offsets(const char* family, const std::string& name, const char* what, int n0, int n1, int n2, Map&& map) {
  Failures f;
  for (int i = 0; i < n0; ++i)
    for (int j = 0; j < n1; ++j)
      for (int s = 0; s < n2; ++s) {
        const auto [a, b] = map(i, j, s);
        if (a != b) {
          f.add(std::string(what) + " (" + str(i) + ", " + str(j) + (n2 > 1 ? ", " + str(s) : std::string()) + "): " + str(a) + " != " + str(b));
        }
      }
  report(family, name, f, "all " + str(n0 * n1 * n2) + " coordinates agree");
}

// Runs of `run` elements along mode 1 that start at multiples of `run` are contiguous and aligned
// to `run` elements (16-byte cp.async / ldmatrix rows when run * sizeof == 16).
template <class Offset>
void check_runs(const std::string& name, Offset&& offset, int rows, int cols, int stages, int run, const char* what) {
  Failures f;
  for (int s = 0; s < stages; ++s)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; c += run) {
        const int first = offset(r, c, s);
        if (first % run != 0) f.add("stage " + str(s) + " " + rc(r, c) + " starts at offset " + str(first) + ", not a multiple of " + str(run));
        for (int i = 1; i < run; ++i) {
          if (offset(r, c + i, s) != first + i) {
            f.add("stage " + str(s) + " row " + str(r) + ", columns " + str(c) + ".." + str(c + run - 1) + " are not contiguous");
            break;
          }
        }
      }
  report("smem-addressing", name, f, str(rows * cols * stages / run) + " runs of " + str(run) + " " + what);
}

// store_tile_shared (fragments.cuh) stores a 16-bit accumulator two elements per 32-bit store:
// elements 2i and 2i + 1 must be columns c, c + 1 of one row, c even, at offsets o, o + 1, o even.
template <int ROWS, int COLS, class Mma, class Layout>
void check_store_pairs(const std::string& name, Mma mma, Layout layout) {
  Failures f;
  for (int t = 0; t < int(size(mma)); ++t) {
    Tensor coords = mma.get_slice(t).partition_C(make_identity_tensor(Shape<Int<ROWS>, Int<COLS>>{}));
    for (int i = 0; i + 1 < int(size(coords)); i += 2) {
      const int row = get<0>(coords(i)), col = get<1>(coords(i));
      const int row2 = get<0>(coords(i + 1)), col2 = get<1>(coords(i + 1));
      const int o = int(layout(row, col)), o2 = int(layout(row2, col2));  // as store_tile_shared
      if (row2 != row || col2 != col + 1 || col % 2 != 0 || o % 2 != 0 || o2 != o + 1) {
        f.add("thread " + str(t) + " elements " + str(i) + ", " + str(i + 1) + ": " + rc(row, col) + " at " + str(o) + ", " +
              rc(row2, col2) + " at " + str(o2));
      }
    }
  }
  report("smem-addressing", name, f, "every element pair (2i, 2i+1) is two adjacent columns at an even offset and the next");
}

// ---------------------------------------------------------------------------------------------
// sm_80 (mma.sync) kernels.
// ---------------------------------------------------------------------------------------------
template <class T, class Atom, int MmaK>
void check_sm80(const std::string& type) {
  using namespace scl::cuda::sm80;
  using C = Config<T>;
  using Smem = typename C::Smem;
  // The kernels' TiledMma is the one of the brief: 4 warps along M over a 64 x 16 x K tile.
  static_assert(std::is_same_v<typename C::TiledMma,
                               decltype(make_tiled_mma(Atom{}, Layout<Shape<_4, _1, _1>>{},
                                                       Tile<_64, _16, Int<MmaK>>{}))>);
  auto view = [](auto l) { return scl::cuda::sm80_rows_columns(l); };
  const std::string p = "sm80 " + type + " ";
  check_accumulator<kBlockM, kBlockN>(p + "logits accumulator", typename C::TiledMma{}, view);
  check_accumulator<kBlockM, kBlockOut>(p + "gradient accumulator", typename C::TiledMma{}, view);

  // 3. The out chunk read as the second product's B operand: (d, j, stage).
  check_same_offsets("sm80-out-transposed", p + "OutTransposed(d, j, s) vs OutLayout(j, d, s)", "(j, d, s)", kBlockN, kBlockOut, 2,
                     [](int j, int d, int s) {
                       return std::pair<int, int>(int(typename C::OutTransposed{}(d, j, s)), int(typename C::OutLayout{}(j, d, s)));
                     });

  // cp.async (load_block) evaluates the layouts as functions; ldmatrix reads them as tensors.
  auto direct_vs_tensor = [&](auto layout, int rows, int cols, int stages, Failures& f, const char* what) {
    for (int s = 0; s < stages; ++s)
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          int direct, tensor;
          if constexpr (decltype(rank(layout))::value == 3) {
            direct = int(layout(r, c, s));
            tensor = tensor_offset<Smem>(layout, r, c, s);
          } else {
            direct = int(layout(r, c));
            tensor = tensor_offset<Smem>(layout, r, c);
          }
          if (direct != tensor) f.add(std::string(what) + " " + rc(r, c) + " stage " + str(s) + ": " + str(direct) + " != " + str(tensor));
        }
  };
  Failures direct;
  direct_vs_tensor(typename C::OwnLayout{}, kBlockM, C::kBlockK, 2, direct, "OwnLayout");
  direct_vs_tensor(typename C::StreamLayout{}, kBlockN, C::kBlockK, 2, direct, "StreamLayout");
  direct_vs_tensor(typename C::OutLayout{}, kBlockN, kBlockOut, 2, direct, "OutLayout");
  direct_vs_tensor(typename C::WeightLayout{}, kBlockM, kBlockN, 1, direct, "WeightLayout");
  direct_vs_tensor(typename C::OutTransposed{}, kBlockOut, kBlockN, 2, direct, "OutTransposed");
  report("smem-addressing", p + "layouts evaluated as functions vs as shared-memory tensors", direct,
         "OwnLayout, StreamLayout, OutLayout, WeightLayout, OutTransposed agree everywhere");

  auto staged = [](auto layout) { return [layout](int r, int c, int s) { return int(layout(r, c, s)); }; };
  check_runs(p + "OwnLayout 16-byte runs", staged(typename C::OwnLayout{}), kBlockM, C::kBlockK, 2, C::kVector, "elements (16 bytes), contiguous and aligned");
  check_runs(p + "StreamLayout 16-byte runs", staged(typename C::StreamLayout{}), kBlockN, C::kBlockK, 2, C::kVector, "elements (16 bytes), contiguous and aligned");
  check_runs(p + "OutLayout 16-byte runs", staged(typename C::OutLayout{}), kBlockN, kBlockOut, 2, C::kVector, "elements (16 bytes), contiguous and aligned");
  if constexpr (sizeof(Smem) == 2) {
    check_store_pairs<kBlockM, kBlockN>(p + "store_tile_shared pairs into WeightLayout", typename C::TiledMma{}, typename C::WeightLayout{});
  }
}

// The weights of a 64 x 128 logits tile as the A operand (64 rows x K = 128) of a register-sourced
// wgmma: thread t's A fragment element i must be the (row, column) of its accumulator element i.
template <class LogitsMma, class GradsMma>
void check_register_operand(const std::string& name, LogitsMma logits, GradsMma grads) {
  using Tile = Shape<Int<scl::cuda::sm90::kRowsPerConsumer>, Int<scl::cuda::sm90::kBlock>>;
  Failures f;
  for (int t = 0; t < 128; ++t) {
    Tensor c = logits.get_slice(t).partition_C(make_identity_tensor(Tile{}));
    Tensor a = grads.get_slice(t).partition_A(make_identity_tensor(Tile{}));
    if (size(a) != size(c)) {
      f.add("thread " + str(t) + ": A fragment of " + str(int(size(a))) + " elements, accumulator of " + str(int(size(c))));
      continue;
    }
    for (int i = 0; i < int(size(c)); ++i) {
      const int ar = int(get<0>(a(i))), ak = int(get<1>(a(i))), cr = int(get<0>(c(i))), cc = int(get<1>(c(i)));
      if (ar != cr || ak != cc) {
        f.add("thread " + str(t) + " element " + str(i) + ": A holds (row " + str(ar) + ", k " + str(ak) + "), the accumulator " + rc(cr, cc));
      }
    }
  }
  report("sm90-register-operand", name, f, "128 threads x 64 elements: the same (row, column) at every index");
}

// ---------------------------------------------------------------------------------------------
// sm_90a (wgmma + TMA) kernels.
// ---------------------------------------------------------------------------------------------
// The streamed tile as the backward's B operand, (d, row) through BlockTransposed, for a resident
// width: whole, and in every kGradWidth-wide chunk of d the gradient walks take; Ring's stages.
template <class T, int kWidth>
void check_sm90_operands(const std::string& p) {
  using namespace scl::cuda::sm90;
  using L = Layouts<T, kWidth>;
  const std::string w = "width " + str(kWidth) + ": ";
  check_same_offsets("sm90-operands", p + w + "BlockTransposed(d, row) vs Block(row, d)", "(row, d)", kBlock, kWidth, 1,
                     [](int row, int d, int) {
                       return std::pair<int, int>(tensor_offset<T>(typename L::BlockTransposed{}, d, row),
                                                  tensor_offset<T>(typename L::Block{}, row, d));
                     });
  auto chunk_check = [&](auto chunk_width, int chunk) {
    constexpr int W = decltype(chunk_width)::value;
    check_same_offsets("sm90-operands",
                       p + w + "local_tile(BlockTransposed, (" + str(W) + ", 128), chunk " + str(chunk) + ")(d, row) vs Block(row, " +
                           str(W * chunk) + " + d)",
                       "(row, d)", kBlock, W, 1, [chunk](int row, int d, int) {
                         T* base = reinterpret_cast<T*>(uintptr_t(1) << 20);
                         Tensor t = make_tensor(make_smem_ptr(base), typename L::BlockTransposed{});
                         Tensor part = local_tile(t, Shape<Int<W>, Int<kBlock>>{}, make_coord(chunk, 0));
                         return std::pair<int, int>(int(raw_pointer_cast(&part(d, row)) - base),
                                                    tensor_offset<T>(typename L::Block{}, row, W * chunk + d));
                       });
  };
  for (int chunk = 0; chunk < kWidth / kGradWidth; ++chunk) chunk_check(Int<kGradWidth>{}, chunk);
  // The producer's TMA writes Ring(_, _, stage); the consumers read Block at ring + stage * cosize.
  check_same_offsets("sm90-operands", p + w + "Ring(row, d, s) vs s * cosize(Block) + Block(row, d)", "(row, d, s)", kBlock, kWidth, L::kStages,
                     [](int row, int d, int s) {
                       return std::pair<int, int>(tensor_offset<T>(typename L::Ring{}, row, d, s),
                                                  s * int(cosize_v<typename L::Block>) + tensor_offset<T>(typename L::Block{}, row, d));
                     });
}

// The triangle backward (Walk::kGradTriangle) relies on where the 64 x 128 accumulators put
// their elements, and on its weights tile's two views agreeing.
template <class T, class Mma>
void check_triangle_accumulator(const std::string& name, Mma mma) {
  using Tile = Shape<Int<scl::cuda::sm90::kRowsPerConsumer>, Int<scl::cuda::sm90::kBlock>>;
  constexpr int kHalf = scl::cuda::sm90::kExchangeFloats;
  Failures f;
  for (int t = 0; t < 128; ++t) {
    Tensor c = mma.get_slice(t).partition_C(make_identity_tensor(Tile{}));
    if (int(size(c)) != 2 * kHalf) f.add("thread " + str(t) + ": " + str(int(size(c))) + " elements, not " + str(2 * kHalf));
    for (int e = 0; e + 1 < int(size(c)); e += 2) {
      const int r0 = int(get<0>(c(e))), c0 = int(get<1>(c(e))), r1 = int(get<0>(c(e + 1))), c1 = int(get<1>(c(e + 1)));
      if (r0 != r1 || c1 != c0 + 1 || c0 % 2 != 0) {
        f.add("thread " + str(t) + " elements " + str(e) + ", " + str(e + 1) + ": " + rc(r0, c0) + ", " + rc(r1, c1));
      }
    }
    for (int e = 0; e < kHalf && 2 * kHalf <= int(size(c)); ++e) {
      const int r0 = int(get<0>(c(e))), c0 = int(get<1>(c(e))), r1 = int(get<0>(c(e + kHalf))), c1 = int(get<1>(c(e + kHalf)));
      if (c0 >= 64 || r1 != r0 || c1 != c0 + 64) {
        f.add("thread " + str(t) + " element " + str(e) + " " + rc(r0, c0) + " vs element " + str(e + kHalf) + " " + rc(r1, c1));
      }
    }
  }
  // add_half_by_quads: elements 4g + 2, 4g + 3 are 4g, 4g + 1 eight rows down, and the quad
  // neighbour lane ^ 1 of an even lane holds its elements two columns on.
  Failures q;
  for (int t = 0; t < 128; ++t) {
    Tensor c = mma.get_slice(t).partition_C(make_identity_tensor(Tile{}));
    Tensor n = mma.get_slice(t ^ 1).partition_C(make_identity_tensor(Tile{}));
    for (int e = 0; e < int(size(c)); ++e) {
      if (e % 4 < 2 && (get<0>(c(e + 2)) != get<0>(c(e)) + 8 || get<1>(c(e + 2)) != get<1>(c(e)))) {
        q.add("thread " + str(t) + " element " + str(e + 2) + " " + rc(int(get<0>(c(e + 2))), int(get<1>(c(e + 2)))) +
              " is not 8 rows below element " + str(e) + " " + rc(int(get<0>(c(e))), int(get<1>(c(e)))));
      }
      if (t % 2 == 0 && (get<0>(n(e)) != get<0>(c(e)) || get<1>(n(e)) != get<1>(c(e)) + 2 || get<1>(c(e)) % 4 >= 2)) {
        q.add("threads " + str(t) + ", " + str(t ^ 1) + " element " + str(e) + ": " + rc(int(get<0>(c(e))), int(get<1>(c(e)))) +
              ", " + rc(int(get<0>(n(e))), int(get<1>(n(e)))));
      }
    }
  }
  report("sm90-triangle", name + ": quads for 16-byte atomics", q,
         "elements 4g + 2, 4g + 3 eight rows below 4g, 4g + 1; lane ^ 1 two columns on, 16-byte aligned");
  report("sm90-triangle", name, f, "128 threads: column pairs at 2m, 2m + 1; element e + 32 is element e 64 columns on");
}

template <class T, class LogitsAtom>
void check_triangle_weights(const std::string& p) {
  using namespace scl::cuda::sm90;
  using L = Layouts<T, kBlock, 2>;
  check_same_offsets("sm90-triangle", p + "weights_byte_offset(j, i) / sizeof(T) vs WeightsTransposed(j, i)", "(j, i)", kBlock, kBlock, 1,
                     [](int j, int i, int) {
                       return std::pair<int, int>(int(L::weights_byte_offset(j, i) / sizeof(T)),
                                                  tensor_offset<T>(typename L::WeightsTransposed{}, j, i));
                     });
  Failures f;
  for (int i = 0; i < kBlock; ++i)
    for (int j = 0; j < kBlock; j += 2) {
      const int o = int(L::weights_byte_offset(j, i) / sizeof(T));
      const int o2 = int(L::weights_byte_offset(j + 1, i) / sizeof(T));
      if (o % 2 != 0 || o2 != o + 1) f.add(rc(i, j) + " at " + str(o) + ", " + rc(i, j + 1) + " at " + str(o2));
    }
  report("sm90-triangle", p + "weights tile: WeightsTransposed (j, i), (j + 1, i) adjacent for even j (32-bit stores)", f,
         str(kBlock * kBlock / 2) + " pairs");
  // store_column_weights walks the logits accumulator's (row, column) view two columns at a time.
  Failures g;
  auto mma = make_tiled_mma(LogitsAtom{});
  using Tile = Shape<Int<kRowsPerConsumer>, Int<kBlock>>;
  for (int t = 0; t < 128; ++t) {
    Tensor c = mma.get_slice(t).partition_C(make_identity_tensor(Tile{}));
    Tensor v = make_tensor(c.data(), scl::cuda::sm90_rows_columns(c.layout()));
    for (int r = 0; r < int(size<0>(v)); ++r)
      for (int k = 0; k + 1 < int(size<1>(v)); k += 2) {
        if (get<0>(v(r, k + 1)) != get<0>(v(r, k)) || get<1>(v(r, k + 1)) != get<1>(v(r, k)) + 1) {
          g.add("thread " + str(t) + " view " + rc(r, k) + ": " + rc(int(get<0>(v(r, k))), int(get<1>(v(r, k)))) +
                " then " + rc(int(get<0>(v(r, k + 1))), int(get<1>(v(r, k + 1)))));
        }
      }
  }
  report("sm90-triangle", p + "logits view: view columns k, k + 1 (k even) are tile columns j, j + 1", g,
         "128 threads");
}

template <class T, class LogitsAtom, class GradsAtom>
void check_sm90(const std::string& type) {
  using namespace scl::cuda::sm90;
  static_assert(std::is_same_v<typename Atoms<T>::Logits, LogitsAtom>);
  static_assert(std::is_same_v<typename Atoms<T>::Grads, GradsAtom>);
  static_assert(kGradWidth == 128);
  auto view = [](auto l) { return scl::cuda::sm90_rows_columns(l); };
  const std::string p = "sm90 " + type + " ";
  check_accumulator<kRowsPerConsumer, kBlock>(p + "logits accumulator (64x128x16 K,K)", make_tiled_mma(LogitsAtom{}), view);
  check_accumulator<kRowsPerConsumer, kGradWidth>(p + "gradient accumulator (64x128x16 K,MN)", make_tiled_mma(GradsAtom{}), view);
  check_sm90_operands<T, 128>(p);
  check_sm90_operands<T, kMaxWidth>(p);

  // The backward copies the logits accumulator, element i to element i, into the A fragment of the
  // register-sourced grads wgmma: both must hold the same (row, column) at every i.
  check_register_operand(p + "grads wgmma's A fragment (64x128x16 RS) vs the logits accumulator",
                         make_tiled_mma(LogitsAtom{}), make_tiled_mma(GradsAtom{}));

  check_triangle_accumulator<T>(p + "logits accumulator", make_tiled_mma(LogitsAtom{}));
  check_triangle_accumulator<T>(p + "gradient accumulator", make_tiled_mma(GradsAtom{}));
  check_triangle_accumulator<T>(p + "column product accumulator (64x128x16 MN,MN)",
                                make_tiled_mma(typename Atoms<T>::Columns{}));
  check_triangle_weights<T, LogitsAtom>(p);
}

}  // namespace

int main() {
  using cutlass::bfloat16_t;
  using cutlass::half_t;
  using GMMA::Major;
  check_sm80<bfloat16_t, SM80_16x8x16_F32BF16BF16F32_TN, 16>("bf16");
  check_sm80<half_t, SM80_16x8x16_F32F16F16F32_TN, 16>("fp16");
  check_sm80<float, SM80_16x8x8_F32TF32TF32F32_TN, 8>("fp32");
  check_sm90<bfloat16_t, SM90_64x128x16_F32BF16BF16_SS<Major::K, Major::K>,
             SM90_64x128x16_F32BF16BF16_RS<Major::K, Major::MN>>("bf16");
  check_sm90<half_t, SM90_64x128x16_F32F16F16_SS<Major::K, Major::K>,
             SM90_64x128x16_F32F16F16_RS<Major::K, Major::MN>>("fp16");
  std::printf("SUMMARY %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
