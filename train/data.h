// Training data in memory and the order it is visited in.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "frontend/idx.h"
#include "ir/calling.h"
#include "ir/tensor.h"

namespace kiln {

// Named tensors sharing their leading dimension: example i is row i of each ("x", "y").
struct TensorDataset {
  TensorMap columns;
  // kiln::Error unless every column has rank >= 1 and they share the leading dimension.
  void check(std::string_view what) const;
  int64_t size() const;  // the shared leading dimension (0 when empty)
  TensorDataset first(int64_t n) const;  // rows [0, n) (n > size(): all)
  static TensorDataset from(const Dataset& d);  // images -> "x", labels -> "y"
};

// Rows `rows` of every column, gathered in that order (a batch).
TensorMap gather_rows(const TensorDataset& data, std::span<const int64_t> rows);
// The same into `out`, whose tensors are reused when they already have the batch's type
// (the training loop gathers every step into the same buffers: no allocation).
void gather_rows_into(const TensorDataset& data, std::span<const int64_t> rows, TensorMap& out);

// The order of epoch `epoch` (0-based) over `n` examples: a Fisher-Yates shuffle driven by
// nn::Rng seeded from (seed, epoch) only, or 0..n-1 when !shuffle. Depending on nothing else
// is what makes a resumed run visit the data exactly as an uninterrupted one.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle = true);

// The batches of one epoch: `full` batches of `batch` rows, then one of `remainder` rows
// unless it is 0 or drop_last.
struct BatchPlan {
  int64_t batch = 0, full = 0, remainder = 0;
  int64_t count() const { return full + (remainder > 0 ? 1 : 0); }
  int64_t size_of(int64_t i) const { return i < full ? batch : remainder; }
  static BatchPlan make(int64_t n, int64_t batch, bool drop_last);
};

// Data-parallel: rank `rank`'s rows of `size` consecutive rows (a global batch, a test
// set), [first, second): `size` cut into `ranks` contiguous pieces, the first size % ranks
// one row longer. Together the ranks' pieces are every row once.
std::pair<int64_t, int64_t> rank_share(int64_t size, int rank, int ranks);

}  // namespace kiln
