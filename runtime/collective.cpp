// The installed collective (runtime/collective.h).
#include "runtime/collective.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/thread_pool.h"

namespace {
KilnCollective g_collective{};
std::atomic<bool> g_installed{false};

// The communication thread: runs the started sums one at a time, in the order started (the
// same order on every rank, since every rank runs the same step), and marks each done.
// Started on the first asynchronous sum; it waits on a condition variable between steps
// and lives until the process exits (detached: it holds nothing a static destructor frees).
struct Job {
  KilnCollective collective;  // installed when the sum started
  void* data;
  int64_t count;
  int32_t dtype;
  std::thread::id owner;  // the thread that started it and will wait for it
  bool done = false;
  const char* error = nullptr;
};

class CommThread {
 public:
  static CommThread& get() {
    static CommThread* t = new CommThread;  // never destroyed: see above
    return *t;
  }

  void start(const KilnCollective& c, void* data, int64_t count, int32_t dtype) {
    auto job = std::make_shared<Job>(Job{c, data, count, dtype, std::this_thread::get_id()});
    {
      std::lock_guard<std::mutex> lock(m_);
      queue_.push_back(job);
      outstanding_.push_back(std::move(job));
    }
    work_.notify_one();
  }

  void wait(void* data) {
    std::unique_lock<std::mutex> lock(m_);
    const std::thread::id me = std::this_thread::get_id();
    auto mine = [&](const std::shared_ptr<Job>& j) { return j->data == data && j->owner == me; };
    auto it = std::find_if(outstanding_.begin(), outstanding_.end(), mine);
    if (it == outstanding_.end()) return;
    std::shared_ptr<Job> job = *it;
    done_.wait(lock, [&] { return job->done; });
    // Other threads may have started sums while this one waited: find it again.
    outstanding_.erase(std::find(outstanding_.begin(), outstanding_.end(), job));
    lock.unlock();
    if (job->error) kiln::rt::record_error(job->error);
  }

 private:
  CommThread() { std::thread([this] { loop(); }).detach(); }

  void loop() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      work_.wait(lock, [&] { return !queue_.empty(); });
      std::shared_ptr<Job> job = std::move(queue_.front());
      queue_.pop_front();
      const KilnCollective& c = job->collective;
      lock.unlock();
      const char* error = nullptr;
      if (c.all_reduce_sum(c.ctx, job->data, job->count, job->dtype, &error) != 0)
        job->error = error ? error : "all_reduce failed across the ranks";
      lock.lock();
      job->done = true;
      done_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable work_, done_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> outstanding_;  // started, not yet waited for
};

std::atomic<bool> g_comm_thread_started{false};

}  // namespace

extern "C" {

void kiln_rt_set_collective(const KilnCollective* c) {
  g_installed.store(false, std::memory_order_release);
  if (!c) return;
  g_collective = *c;
  g_installed.store(true, std::memory_order_release);
}

const KilnCollective* kiln_rt_collective(void) {
  return g_installed.load(std::memory_order_acquire) ? &g_collective : nullptr;
}

void kiln_rt_all_reduce_sum(void* data, int64_t count, int32_t dtype) {
  const KilnCollective* c = kiln_rt_collective();
  if (!c || c->size <= 1 || count <= 0) return;
  const char* error = nullptr;
  if (c->all_reduce_sum(c->ctx, data, count, dtype, &error) != 0)
    kiln::rt::record_error(error ? error : "all_reduce failed across the ranks");
}

void kiln_rt_all_reduce_start(void* data, int64_t count, int32_t dtype) {
  const KilnCollective* c = kiln_rt_collective();
  if (!c || c->size <= 1 || count <= 0) return;
  if (!(c->flags & KILN_COLLECTIVE_ASYNC)) return kiln_rt_all_reduce_sum(data, count, dtype);
  g_comm_thread_started.store(true, std::memory_order_release);
  try {
    CommThread::get().start(*c, data, count, dtype);
  } catch (...) {  // no thread or no memory for the job: sum here, as without overlap
    kiln_rt_all_reduce_sum(data, count, dtype);
  }
}

void kiln_rt_all_reduce_wait(void* data) {
  // No sum ever went to the communication thread: nothing to wait for (and no thread made).
  if (!g_comm_thread_started.load(std::memory_order_acquire)) return;
  CommThread::get().wait(data);
}

}  // extern "C"
