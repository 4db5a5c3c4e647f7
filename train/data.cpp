// Datasets in memory, the shuffled order of an epoch and the batches it is cut into.
#include "train/data.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "frontend/init.h"
#include "ir/error.h"

namespace kiln {

void TensorDataset::check(std::string_view what) const {
  std::optional<std::pair<std::string, int64_t>> first;
  for (const auto& [name, t] : columns) {
    if (t.rank() == 0)
      throw Error(std::string(what) + ": column '" + name + "' is a scalar (" + t.type().str() +
                  "); every column needs a leading example dimension");
    if (t.is_splat()) throw Error(std::string(what) + ": column '" + name + "' is a splat; store every element");
    if (!first) {
      first.emplace(name, t.shape()[0]);
    } else if (t.shape()[0] != first->second) {
      throw Error(std::string(what) + ": columns '" + first->first + "' (" + std::to_string(first->second) +
                  " rows) and '" + name + "' (" + std::to_string(t.shape()[0]) +
                  " rows) differ in their leading dimension; every column holds one row per example");
    }
  }
}

int64_t TensorDataset::size() const { return columns.empty() ? 0 : columns.begin()->second.shape()[0]; }

TensorDataset TensorDataset::first(int64_t n) const {
  TensorDataset d;
  int64_t rows = std::min(std::max<int64_t>(n, 0), size());
  for (const auto& [name, t] : columns) d.columns.emplace(name, rows == size() ? t : slice_rows(t, 0, rows));
  return d;
}

TensorDataset TensorDataset::from(const Dataset& d) { return TensorDataset{{{"x", d.images}, {"y", d.labels}}}; }

void gather_rows_into(const TensorDataset& data, std::span<const int64_t> rows, TensorMap& out) {
  const int64_t n = data.size(), count = static_cast<int64_t>(rows.size());
  for (int64_t r : rows)
    if (r < 0 || r >= n)
      throw Error("gather_rows: row " + std::to_string(r) + " is out of range for a dataset of " + std::to_string(n) +
                  " examples");
  for (const auto& [name, t] : data.columns) {
    Shape s = t.shape();
    s[0] = count;
    auto it = out.find(name);
    if (it == out.end() || it->second.shape() != s || it->second.dtype() != t.dtype() || it->second.is_splat())
      it = out.insert_or_assign(name, Tensor(t.dtype(), s)).first;
    const size_t row_bytes = n ? t.nbytes() / static_cast<size_t>(n) : 0;
    std::byte* dst = it->second.raw();
    for (int64_t r : rows) {
      std::memcpy(dst, t.raw() + static_cast<size_t>(r) * row_bytes, row_bytes);
      dst += row_bytes;
    }
  }
}

TensorMap gather_rows(const TensorDataset& data, std::span<const int64_t> rows) {
  TensorMap out;
  gather_rows_into(data, rows, out);
  return out;
}

std::pair<int64_t, int64_t> rank_share(int64_t size, int rank, int ranks) {
  const int64_t q = size / ranks, r = size % ranks, k = rank;
  const int64_t first = k * q + std::min(k, r);
  return {first, first + q + (k < r ? 1 : 0)};
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  if (n < 0) throw Error("epoch_order: negative example count " + std::to_string(n));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  if (!shuffle) return order;
  nn::Rng rng = nn::Rng::for_name(seed, "epoch " + std::to_string(epoch));
  // Fisher-Yates in integers only (the modulo's bias is below 2^-40 for any real n).
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

BatchPlan BatchPlan::make(int64_t n, int64_t batch, bool drop_last) {
  if (batch < 1) throw Error("batch size must be at least 1, got " + std::to_string(batch));
  if (n < 0) throw Error("negative example count " + std::to_string(n));
  BatchPlan p{batch, n / batch, drop_last ? 0 : n % batch};
  return p;
}

}  // namespace kiln
