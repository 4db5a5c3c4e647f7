// Learning-rate schedules. The rate is state ("lr"), so a schedule writes it before each
// step and nothing is recompiled. Steps count optimizer steps from 0 over the whole run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

struct LrSchedule {
  enum class Kind { constant, step, cosine };
  Kind kind = Kind::constant;
  int64_t warmup_steps = 0;  // linear warm-up from lr/warmup_steps ... to lr over these steps
  // step: multiply by gamma every `every_epochs` epochs.
  int64_t every_epochs = 1;
  double gamma = 0.1;
  // cosine: from lr down to min_lr over the run's steps after the warm-up.
  double min_lr = 0.0;

  // The rate of step `step` (0-based) for base rate `lr`, given the run's shape.
  double at(int64_t step, double lr, int64_t steps_per_epoch, int64_t total_steps) const;

  // "constant", "step:EPOCHS[:GAMMA]", "cosine[:MIN_LR]"; warm-up comes from its own option.
  // kiln::Error naming the text and what is expected.
  static LrSchedule parse(std::string_view text);
  std::string str() const;  // the parse() form, for metadata and messages
};

}  // namespace kiln
