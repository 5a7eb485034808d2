// Orders in which the tile kernels visit tiles so that no two tiles running at the same time
// write the same block of rows. That makes every accumulation race-free without atomics or
// per-thread copies of the gradient, and its order independent of the thread count
// (deterministic results).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace scl::cpu {

using TilePair = std::pair<int64_t, int64_t>;

// Symmetric schedule over the upper triangle of an nb x nb block grid: the circle method of a
// round-robin tournament. Each round pairs every block with one other (a perfect matching), so
// the tiles of one round touch disjoint row blocks; the last round holds the diagonal tiles.
inline std::vector<std::vector<TilePair>> round_robin_rounds(int64_t nb) {
  std::vector<std::vector<TilePair>> rounds;
  const int64_t players = nb + (nb % 2);  // an odd count gets a bye, as a phantom block
  for (int64_t r = 0; r + 1 < players; ++r) {
    std::vector<TilePair> round;
    auto seat = [&](int64_t k) { return k == 0 ? int64_t{0} : (k - 1 + r) % (players - 1) + 1; };
    for (int64_t k = 0; k < players / 2; ++k) {
      const int64_t a = seat(k), b = seat(players - 1 - k);
      if (a < nb && b < nb) round.emplace_back(a < b ? a : b, a < b ? b : a);
    }
    rounds.push_back(std::move(round));
  }
  std::vector<TilePair> diagonal;
  for (int64_t i = 0; i < nb; ++i) diagonal.emplace_back(i, i);
  rounds.push_back(std::move(diagonal));
  return rounds;
}

// Rectangular schedule over an mb x nb grid, in waves along wrapped diagonals: within a wave
// every row block and every column block appears at most once.
inline std::vector<std::vector<TilePair>> diagonal_waves(int64_t mb, int64_t nb) {
  const bool rows_fewer = mb <= nb;
  const int64_t waves = rows_fewer ? nb : mb, width = rows_fewer ? mb : nb;
  std::vector<std::vector<TilePair>> out(waves);
  for (int64_t w = 0; w < waves; ++w) {
    for (int64_t l = 0; l < width; ++l) {
      out[w].emplace_back(rows_fewer ? TilePair{l, (l + w) % nb} : TilePair{(l + w) % mb, l});
    }
  }
  return out;
}

}  // namespace scl::cpu
