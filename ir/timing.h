// Wall time of the phases of loading, compiling and running a model (`kiln run --timings`).
// Code marks a phase with a PhaseTimer for its scope; while timing is off (the default) a
// timer does nothing but test a flag. On, every phase is recorded in the order phases
// start, with its nesting depth, and take_phase_times() hands the list over.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct PhaseTime {
  std::string name;
  int depth = 0;  // 0 for a phase inside no other
  double ms = 0;
};

void set_phase_timing(bool on);
bool phase_timing();
// The phases recorded since the last call (a phase still running is left out), then none.
std::vector<PhaseTime> take_phase_times();

class PhaseTimer {
 public:
  explicit PhaseTimer(std::string_view name);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  long slot_ = -1;  // index into the record, -1 when timing is off
  long generation_ = 0;
  double start_ms_ = 0;
};

}  // namespace kiln
