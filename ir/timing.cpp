#include "ir/timing.h"

#include <atomic>
#include <chrono>
#include <mutex>

namespace kiln {

namespace {

std::atomic<bool> enabled{false};
std::mutex mutex;
std::vector<PhaseTime> record;    // in start order; ms < 0 while running
long generation = 0;              // of the record: take_phase_times() starts a new one
thread_local int depth = 0;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void set_phase_timing(bool on) { enabled = on; }
bool phase_timing() { return enabled; }

std::vector<PhaseTime> take_phase_times() {
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<PhaseTime> out;
  for (const PhaseTime& p : record)
    if (p.ms >= 0) out.push_back(p);
  record.clear();
  ++generation;
  return out;
}

PhaseTimer::PhaseTimer(std::string_view name) {
  if (!enabled) return;
  std::lock_guard<std::mutex> lock(mutex);
  slot_ = static_cast<long>(record.size());
  generation_ = generation;
  record.push_back({std::string(name), depth++, -1});
  start_ms_ = now_ms();
}

PhaseTimer::~PhaseTimer() {
  if (slot_ < 0) return;
  const double ms = now_ms() - start_ms_;
  --depth;
  std::lock_guard<std::mutex> lock(mutex);
  // take_phase_times() may have taken the record meanwhile: then this phase is dropped.
  if (generation_ == generation) record[static_cast<size_t>(slot_)].ms = ms;
}

}  // namespace kiln
