// Runs the functions of csrc/core/tile_math.h on the host for python_tests/test_tile_math.py:
// one command per input line, one result line per command, numbers as %.17g.
//   lse TILES ...            a row fed tile by tile: each tile is "k v1 .. vk" (base-2 logits,
//                            "-inf" allowed); prints max, sum, lse()
//   merge M1 S1 M2 S2 ...    RunningLse2 merges of (max, sum) parts; prints max, sum, lse()
//   symmetric_lse INV_T SUM
//   split_lse2 LSE           prints hi, lo
//   plain_weight S2 HI LO SCALE | plain_weight_none S2
//   symmetric_weight S2 COEF_ROW COLUMN_SCALED COLUMN_COEF
//   symmetric_coef G LSE INV_T
//   fixed_shift INV_T        prints 1 or 0 (fp32 rule)
//   self_tile R0 BM C0 BN OFFSET
//   split_range TILES SPLITS SPLIT
//   triangle NB P T          prints row_block, column_block, valid
//   pairs NB
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "../core/tile_math.h"

namespace math = scl::tile_math;

namespace {

double number(std::istringstream& in) {
  std::string word;
  in >> word;
  return std::strtod(word.c_str(), nullptr);  // reads inf, -inf, nan
}

void print(double v) { std::printf(" %.17g", v); }

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "lse") {
      math::RunningLse2 run;
      int k;
      while (in >> k) {
        float values[4096];
        float tile_max = -INFINITY;
        for (int i = 0; i < k; ++i) {
          values[i] = float(number(in));
          tile_max = std::fmax(tile_max, values[i]);
        }
        const float shift = run.shift_for(tile_max);
        float sum = 0.f;
        for (int i = 0; i < k; ++i) sum += math::exp2_approx(values[i] - shift);
        run.add(tile_max, sum);
      }
      print(run.max), print(run.sum), print(run.lse());
    } else if (command == "merge") {
      math::RunningLse2 run;
      double m, s;
      while (in >> std::ws && !in.eof()) {
        m = number(in), s = number(in);
        run.merge(float(m), float(s));
      }
      print(run.max), print(run.sum), print(run.lse());
    } else if (command == "symmetric_lse") {
      const double inv_t = number(in);
      print(math::symmetric_lse(inv_t, float(number(in))));
    } else if (command == "split_lse2") {
      const math::Lse2Split s = math::split_lse2(number(in));
      print(s.hi), print(s.lo);
    } else if (command == "plain_weight") {
      const float s2 = float(number(in)), hi = float(number(in)), lo = float(number(in));
      print(math::plain_grad_weight(s2, {hi, lo}, float(number(in))));
    } else if (command == "plain_weight_none") {
      print(math::plain_grad_weight(float(number(in)), math::no_gradient_lse2(), 1.f));
    } else if (command == "symmetric_weight") {
      const float s2 = float(number(in)), row = float(number(in)), scaled = float(number(in));
      print(math::symmetric_grad_weight(s2, row, scaled, float(number(in))));
    } else if (command == "symmetric_coef") {
      const double g = number(in), lse = number(in);
      print(math::symmetric_coef(g, lse, number(in)));
    } else if (command == "fixed_shift") {
      print(math::fixed_shift_is_safe_fp32(number(in)) ? 1 : 0);
    } else if (command == "self_tile") {
      long long v[5];
      for (auto& x : v) in >> x;
      print(math::tile_holds_self_column(v[0], v[1], v[2], v[3], v[4]) ? 1 : 0);
    } else if (command == "split_range") {
      long long tiles, splits, split;
      in >> tiles >> splits >> split;
      const math::TileRange r = math::split_range(tiles, splits, split);
      print(double(r.begin)), print(double(r.end));
    } else if (command == "triangle") {
      long long nb, p, t;
      in >> nb >> p >> t;
      const math::TriangleTile tile = math::paired_triangle_tile(nb, p, t);
      print(double(tile.row_block)), print(double(tile.column_block)), print(tile.valid ? 1 : 0);
    } else if (command == "pairs") {
      long long nb;
      in >> nb;
      print(double(math::triangle_pairs(nb)));
    } else {
      std::fprintf(stderr, "unknown command: %s\n", command.c_str());
      return 1;
    }
    std::printf("\n");
  }
  return 0;
}
