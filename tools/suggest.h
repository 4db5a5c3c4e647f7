// "did you mean ...?" for the `kiln` command line: misspelled commands, options, choices,
// model and data-set names. Free of CLI11, so that the unit tests link it alone.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::cli {

// The number of single-character insertions, deletions, substitutions and swaps of two
// neighbours that turn `a` into `b` (optimal string alignment: a typo's distance).
size_t edit_distance(std::string_view a, std::string_view b);
// "did you mean 'X'?" (or "'X' or 'Y'" on a tie) for the candidates nearest to `text` when
// they are near enough to be a misspelling of it (at most one edit in four characters, and
// at least one: `--lrr` for `--lr`, `complie` for `compile`); "" otherwise. Case is ignored.
std::string did_you_mean(std::string_view text, const std::vector<std::string>& candidates);

}  // namespace kiln::cli
