#include "tools/suggest.h"

#include <algorithm>
#include <cctype>
#include <limits>

namespace kiln::cli {

size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rows of the dynamic programme: two back for a swap of neighbours.
  std::vector<size_t> before(b.size() + 1), last(b.size() + 1), row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) last[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      row[j] = std::min({last[j] + 1, row[j - 1] + 1, last[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) row[j] = std::min(row[j], before[j - 2] + 1);
    }
    std::swap(before, last);
    std::swap(last, row);
  }
  return last[b.size()];
}

std::string did_you_mean(std::string_view text, const std::vector<std::string>& candidates) {
  // Compared without leading dashes and case: `-lr` and `--LR` are both near `--lr`.
  auto bare = [](std::string_view s) {
    std::string out(s.substr(std::min(s.find_first_not_of('-'), s.size())));
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  };
  const std::string t = bare(text);
  size_t best = std::numeric_limits<size_t>::max();
  std::vector<std::string> nearest;
  for (const std::string& c : candidates) {
    const std::string b = bare(c);
    if (c == text || b.empty()) continue;
    const size_t d = edit_distance(t, b);
    // One edit per four characters of the longer name, at least one; and fewer edits than the
    // shorter one has characters, so that `-x` is not a misspelling of `-o`.
    if (d > std::max<size_t>(1, std::max(t.size(), b.size()) / 4) || d >= std::min(t.size(), b.size())) continue;
    if (d < best) nearest.clear();
    best = std::min(best, d);
    if (d == best && std::find(nearest.begin(), nearest.end(), c) == nearest.end()) nearest.push_back(c);
  }
  std::string out;
  for (size_t i = 0; i < nearest.size(); ++i) out += (i ? " or '" : "did you mean '") + nearest[i] + "'";
  return out.empty() ? out : out + "?";
}

}  // namespace kiln::cli
