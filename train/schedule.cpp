// Learning-rate schedules: the rate of a step from the run's shape alone (no hidden state),
// so a resumed run gets the same rates as an uninterrupted one.
#include "train/schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <vector>

#include "ir/error.h"

namespace kiln {

double LrSchedule::at(int64_t step, double lr, int64_t steps_per_epoch, int64_t total_steps) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  switch (kind) {
    case Kind::constant:
      return lr;
    case Kind::step: {
      int64_t epoch = steps_per_epoch > 0 ? step / steps_per_epoch : 0;
      return lr * std::pow(gamma, static_cast<double>(epoch / every_epochs));
    }
    case Kind::cosine: {
      int64_t span = total_steps - warmup_steps;
      if (span <= 0) return lr;
      int64_t t = std::min(step - warmup_steps, span);
      double c = 0.5 * (1 + std::cos(std::numbers::pi * static_cast<double>(t) / static_cast<double>(span)));
      return min_lr + (lr - min_lr) * c;
    }
  }
  internal_error("kind", "unknown schedule kind");
}

namespace {

[[noreturn]] void bad(std::string_view text, std::string_view why) {
  throw Error("schedule '" + std::string(text) + "': " + std::string(why) +
              " (expected constant, step:EPOCHS[:GAMMA] or cosine[:MIN_LR])");
}

template <typename T>
T number(std::string_view text, std::string_view part, std::string_view what) {
  T v{};
  auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
  if (ec != std::errc() || end != part.data() + part.size() || part.empty())
    bad(text, std::string(what) + " '" + std::string(part) + "' is not a number");
  return v;
}

}  // namespace

LrSchedule LrSchedule::parse(std::string_view text) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  LrSchedule s;
  if (parts[0] == "constant") {
    if (parts.size() > 1) bad(text, "constant takes no parameters");
  } else if (parts[0] == "step") {
    s.kind = Kind::step;
    if (parts.size() < 2 || parts.size() > 3) bad(text, "step needs EPOCHS and optionally GAMMA");
    s.every_epochs = number<int64_t>(text, parts[1], "EPOCHS");
    if (s.every_epochs < 1) bad(text, "EPOCHS must be at least 1");
    if (parts.size() == 3) s.gamma = number<double>(text, parts[2], "GAMMA");
    if (!(s.gamma > 0 && s.gamma <= 1)) bad(text, "GAMMA must be in (0, 1]");
  } else if (parts[0] == "cosine") {
    s.kind = Kind::cosine;
    if (parts.size() > 2) bad(text, "cosine takes at most MIN_LR");
    if (parts.size() == 2) s.min_lr = number<double>(text, parts[1], "MIN_LR");
    if (!(s.min_lr >= 0 && std::isfinite(s.min_lr))) bad(text, "MIN_LR must be a finite number >= 0");
  } else {
    bad(text, "unknown schedule '" + std::string(parts[0]) + "'");
  }
  return s;
}

std::string LrSchedule::str() const {
  auto num = [](double v) {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest form that reads back exactly
    return std::string(buf, r.ptr);
  };
  switch (kind) {
    case Kind::constant:
      return "constant";
    case Kind::step:
      return "step:" + std::to_string(every_epochs) + ":" + num(gamma);
    case Kind::cosine:
      return "cosine:" + num(min_lr);
  }
  internal_error("kind", "unknown schedule kind");
}

}  // namespace kiln
