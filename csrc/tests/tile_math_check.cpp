// Runs the functions of csrc/core/tile_math.h on the host for python_tests/test_tile_math.py.
// Build: g++ -std=c++17 -O2 -ffp-contract=off -I csrc csrc/tests/tile_math_check.cpp
// One command per input line, one output line per command: the results as %.17g separated by
// spaces (floats are printed widened to double, exactly); infinities and NaN come out as "inf",
// "-inf", "nan", which Python's float() reads, as does this program ("-inf" etc. on input).
//   lse K1 V.. K2 V.. ...      a row fed tile by tile to RunningLse2 (K values per tile, base-2
//                              logits, K may be 0): each tile's sum of 2^(v - shift_for(max)) is
//                              formed as the kernels do and add()ed; prints max, sum, lse()
//   merge M1 S1 M2 S2 ...      a RunningLse2 that merge()s each (max, sum); prints max, sum, lse()
//   shift_for MAX TILE_MAX     prints RunningLse2{MAX, 0}.shift_for(TILE_MAX)
//   add MAX SUM TILE_MAX TILE_SUM   RunningLse2{MAX, SUM}.add(...); prints max, sum
//   exp2 X                     exp2_approx
//   logit2 DOT ROW_SCALE COLUMN_SCALED BIAS
//   symmetric_lse INV_T ROW_SUM
//   split_lse2 LSE             prints hi, lo
//   plain_weight S2 HI LO SCALE
//   plain_weight_none S2 SCALE plain_grad_weight with no_gradient_lse2()
//   symmetric_weight S2 COEF_ROW COLUMN_SCALED COLUMN_COEF
//   symmetric_coef G LSE INV_T
//   fixed_shift INV_T MIN_NORMAL_LOG    1 or 0
//   fixed_shift_fp32 INV_T     1 or 0
//   fixed_shift_core INV_T     the core's rule (csrc/core/supcon_orchestration.cpp), as it read
//                              before it called tile_math, for float32 then float64 compute,
//                              then tile_math's with the core's arguments log(FLT_MIN) and
//                              log(DBL_MIN): four 1-or-0
//   self_tile R0 BLOCK_M C0 BLOCK_N SELF_OFFSET   1 or 0
//   split_range TILES SPLITS SPLIT                prints begin, end
//   triangle NB P T            prints row_block, column_block, valid (1 or 0)
//   pairs NB                   triangle_pairs
//   pair_triangle NB I T       pair_triangle_tiles(NB, I), then column block and column side
//                              (1 or 0) of row block I's tile T
// An unknown command or a malformed line is reported on stderr with exit status 1.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "../core/tile_math.h"

namespace math = scl::tile_math;

namespace {

struct BadLine {};

double number(std::istringstream& in) {
  std::string word;
  if (!(in >> word)) throw BadLine{};
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);  // reads inf, -inf, nan
  if (end == word.c_str() || *end != '\0') throw BadLine{};
  return v;
}

long long integer(std::istringstream& in) {
  long long v;
  if (!(in >> v)) throw BadLine{};
  return v;
}

bool at_end(std::istringstream& in) { return (in >> std::ws).eof(); }

void print(double v) { std::printf(" %.17g", v); }
void print_bool(bool v) { std::printf(" %d", v ? 1 : 0); }

// The core's rule as it read before it called tile_math (kept verbatim for the comparison).
bool core_rule_before(double inv_t, bool float64_compute) {
  const double min_log = float64_compute
                             ? std::log(std::numeric_limits<double>::min())
                             : std::log(static_cast<double>(std::numeric_limits<float>::min()));
  return 2 * inv_t < -min_log * 0.95;
}

void run(const std::string& command, std::istringstream& in) {
  if (command == "lse") {
    math::RunningLse2 running;
    std::vector<float> values;
    while (!at_end(in)) {
      const long long k = integer(in);
      if (k < 0) throw BadLine{};
      values.resize(static_cast<size_t>(k));
      float tile_max = -std::numeric_limits<float>::infinity();
      for (float& v : values) {
        v = static_cast<float>(number(in));
        tile_max = std::fmax(tile_max, v);
      }
      const float shift = running.shift_for(tile_max);
      float sum = 0.f;
      for (const float v : values) sum += math::exp2_approx(v - shift);
      running.add(tile_max, sum);
    }
    print(running.max), print(running.sum), print(running.lse());
  } else if (command == "merge") {
    math::RunningLse2 running;
    while (!at_end(in)) {
      const float m = static_cast<float>(number(in));
      const float s = static_cast<float>(number(in));
      running.merge(m, s);
    }
    print(running.max), print(running.sum), print(running.lse());
  } else if (command == "shift_for") {
    math::RunningLse2 running;
    running.max = static_cast<float>(number(in));
    print(running.shift_for(static_cast<float>(number(in))));
  } else if (command == "add") {
    math::RunningLse2 running;
    running.max = static_cast<float>(number(in));
    running.sum = static_cast<float>(number(in));
    const float tile_max = static_cast<float>(number(in));
    running.add(tile_max, static_cast<float>(number(in)));
    print(running.max), print(running.sum);
  } else if (command == "exp2") {
    print(math::exp2_approx(static_cast<float>(number(in))));
  } else if (command == "logit2") {
    const float dot = static_cast<float>(number(in)), row = static_cast<float>(number(in));
    const float column = static_cast<float>(number(in));
    print(math::logit2(dot, row, column, static_cast<float>(number(in))));
  } else if (command == "symmetric_lse") {
    const double inv_t = number(in);
    print(math::symmetric_lse(inv_t, static_cast<float>(number(in))));
  } else if (command == "split_lse2") {
    const math::Lse2Split s = math::split_lse2(number(in));
    print(s.hi), print(s.lo);
  } else if (command == "plain_weight") {
    const float s2 = static_cast<float>(number(in)), hi = static_cast<float>(number(in));
    const float lo = static_cast<float>(number(in));
    print(math::plain_grad_weight(s2, {hi, lo}, static_cast<float>(number(in))));
  } else if (command == "plain_weight_none") {
    const float s2 = static_cast<float>(number(in));
    print(math::plain_grad_weight(s2, math::no_gradient_lse2(), static_cast<float>(number(in))));
  } else if (command == "symmetric_weight") {
    const float s2 = static_cast<float>(number(in)), row = static_cast<float>(number(in));
    const float scaled = static_cast<float>(number(in));
    print(math::symmetric_grad_weight(s2, row, scaled, static_cast<float>(number(in))));
  } else if (command == "symmetric_coef") {
    const double g = number(in), lse = number(in);
    print(math::symmetric_coef(g, lse, number(in)));
  } else if (command == "fixed_shift") {
    const double inv_t = number(in);
    print_bool(math::fixed_shift_is_safe(inv_t, number(in)));
  } else if (command == "fixed_shift_fp32") {
    print_bool(math::fixed_shift_is_safe_fp32(number(in)));
  } else if (command == "fixed_shift_core") {
    const double inv_t = number(in);
    print_bool(core_rule_before(inv_t, false)), print_bool(core_rule_before(inv_t, true));
    print_bool(math::fixed_shift_is_safe(
        inv_t, std::log(static_cast<double>(std::numeric_limits<float>::min()))));
    print_bool(math::fixed_shift_is_safe(inv_t, std::log(std::numeric_limits<double>::min())));
  } else if (command == "self_tile") {
    long long v[5];
    for (long long& x : v) x = integer(in);
    print_bool(math::tile_holds_self_column(v[0], v[1], v[2], v[3], v[4]));
  } else if (command == "split_range") {
    const long long tiles = integer(in), splits = integer(in), split = integer(in);
    const math::TileRange r = math::split_range(tiles, splits, split);
    print(static_cast<double>(r.begin)), print(static_cast<double>(r.end));
  } else if (command == "triangle") {
    const long long nb = integer(in), p = integer(in), t = integer(in);
    const math::TriangleTile tile = math::paired_triangle_tile(nb, p, t);
    print(static_cast<double>(tile.row_block)), print(static_cast<double>(tile.column_block));
    print_bool(tile.valid);
  } else if (command == "pairs") {
    print(static_cast<double>(math::triangle_pairs(integer(in))));
  } else if (command == "pair_triangle") {
    const long long nb = integer(in), i = integer(in), t = integer(in);
    print(static_cast<double>(math::pair_triangle_tiles(nb, i)));
    print(static_cast<double>(math::pair_triangle_column_block(i, t)));
    print_bool(math::pair_triangle_has_column_side(t));
  } else {
    throw BadLine{};
  }
  if (!at_end(in)) throw BadLine{};
}

}  // namespace

int main() {
  std::string line;
  long long number_of_line = 0;
  while (std::getline(std::cin, line)) {
    ++number_of_line;
    std::istringstream in(line);
    std::string command;
    in >> command;
    try {
      run(command, in);
    } catch (const BadLine&) {
      std::fflush(stdout);
      std::fprintf(stderr, "tile_math_check: line %lld: cannot run \"%s\"\n", number_of_line,
                   line.c_str());
      return 1;
    }
    std::printf("\n");
  }
  return 0;
}
