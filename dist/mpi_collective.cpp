// The MPI session and its all-reduce: recursive doubling for small buffers, a ring for
// the others (dist/mpi_collective.h).
//
// Recursive doubling sends a rank's whole partial sum in one message a round (at most
// kRecursiveDoublingMaxBytes) and receives the peer's into scratch. Both ranks of a pair
// compute lower rank's partial + higher rank's with one function, into a second scratch
// buffer rather than over either operand. IEEE addition is commutative, so either order
// would give both ranks the numbers' bits; one order and one loop for both leave no room
// for a difference at all (which of two NaNs' payloads a sum keeps depends on the operands'
// order), and three distinct arrays vectorize without alias checks. The partial alternates
// between the caller's buffer and that scratch, so a call copies at most once, at the end.
//
// One ring step moves one chunk from each rank to the next. A chunk travels in pieces of at
// most kPieceBytes, which bounds the scratch memory (kSlots pieces, whatever the buffer's
// size), lets the sum of one received piece overlap the transfer of the next, and keeps
// every MPI count far below INT_MAX elements. A rank posts all of a step's sends at once,
// then receives the step's pieces in order into the scratch slots in turn (reduce-scatter)
// or straight into place (all-gather), and waits for its sends before the next step: the
// chunk it sends next is the one it has just finished.
//
// A wait polls MPI_Testall (which also drives MPI's progress) until its requests complete or
// KILN_DIST_TIMEOUT seconds pass: in a tight loop for kSpinTime (a message between ranks of
// one host comes within microseconds), yielding the core between polls until kYieldTime
// (an oversubscribed host: the peer being waited for may need this core), then sleeping
// between polls a fiftieth of the time waited so far, at most kMaxSleep: a wait that long is
// on a slower rank's compute, not on a message in flight, and a rank waiting minutes for a
// straggler should not hold a core, while the sleep adds at most 2% to the wait (a fixed
// 200 us sleep took 7% of a core through a 5 s wait, this 1.3%).
#include "dist/mpi_collective.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <type_traits>
#include <utility>

#include "ir/error.h"
#include "runtime/aot.h"
#include "runtime/collective.h"
#include "runtime/kernels.h"
#include "runtime/thread_pool.h"

namespace kiln::dist {
namespace {

constexpr double kDefaultTimeoutSeconds = 300;
// 1 MiB pieces: 0.4 ms each at the 2.5 GB/s that Open MPI's shared-memory transport moves
// between two ranks here, long beside a message's handshake (microseconds); the scratch is
// kSlots of them. 256 KiB and 4 MiB took the same time on 64 MB within the noise.
constexpr int64_t kPieceBytes = int64_t{1} << 20;
constexpr int kSlots = 2;  // one piece being summed while the next arrives
static_assert(kPieceBytes <= INT_MAX, "a piece's element count must fit MPI's int counts");
// MPI_Ibcast takes an int count of bytes: a larger broadcast goes in pieces of 1 GiB.
constexpr int64_t kBroadcastPieceBytes = int64_t{1} << 30;
static_assert(kBroadcastPieceBytes <= INT_MAX);
constexpr auto kSpinTime = std::chrono::microseconds(100);
constexpr auto kYieldTime = std::chrono::milliseconds(10);
constexpr auto kMaxSleep = std::chrono::milliseconds(2);
constexpr int kSleepFraction = 50;  // sleep 1/50 of the time waited
// Message tags on Kiln's communicator, one per phase (the phases never overlap; distinct
// tags make a mismatch an error instead of a wrong sum).
constexpr int kTagReduceScatter = 1;
constexpr int kTagAllGather = 2;
constexpr int kTagFold = 3;      // recursive doubling: rank r >= Q's buffer to rank r - Q
constexpr int kTagDoubling = 4;  // recursive doubling's rounds
constexpr int kTagUnfold = 5;    // recursive doubling: the sum back to rank r >= Q
static_assert(Mpi::kRecursiveDoublingMaxBytes <= INT_MAX, "recursive doubling sends its buffer in one message");

Mpi* g_session = nullptr;

// A launcher's rank count in `name`, or 0 when unset or not a number.
long env_count(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return *end == '\0' ? n : 0;
}

double timeout_from_env() {
  const char* v = std::getenv("KILN_DIST_TIMEOUT");
  if (!v || !*v) return kDefaultTimeoutSeconds;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  if (*end != '\0' || !std::isfinite(s) || s <= 0)
    throw Error(std::string("KILN_DIST_TIMEOUT='") + v +
                "' is not a number of seconds > 0 (unset it for the default of 300 s)");
  return s;
}

// KILN_DIST_OVERLAP: 1 lets the runtime run the sums on its communication thread,
// overlapped with the step's computation; 0 sums each one in place when the step reaches it;
// unset (or "auto"), overlap when there is a core for that thread (see overlap_fits).
enum class Overlap { off, on, automatic };
Overlap overlap_from_env() {
  const char* v = std::getenv("KILN_DIST_OVERLAP");
  if (!v || !*v) return Overlap::automatic;
  const std::string s = v;
  if (s == "1") return Overlap::on;
  if (s == "0") return Overlap::off;
  if (s == "auto") return Overlap::automatic;
  throw Error("KILN_DIST_OVERLAP='" + s + "' is not 0, 1 or auto (1 overlaps the gradients' all_reduce with "
              "the backward pass on a thread of its own; 0 sums each bucket where the step reaches it; auto, "
              "the default, overlaps when each rank has a core to spare for that thread)");
}

// Whether the communication thread gets a core of its own: this rank's threads plus it fit
// the cores the rank may run on, and every rank of this host's do in the host's. Where it
// would share a core, its polling for messages takes that core from the step's threads:
// with 2 ranks of 1 thread on 2 cores, overlap made LeNet's epoch 1.3x slower.
bool overlap_fits(MPI_Comm comm) {
  MPI_Comm host;
  int local_ranks = 1;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host) == MPI_SUCCESS) {
    MPI_Comm_size(host, &local_ranks);
    MPI_Comm_free(&host);
  }
  const int threads = kiln_rt_num_threads() + 1;  // the step's, and the communication thread
  const int machine = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return threads <= rt::cores() && int64_t{threads} * local_ranks <= machine;
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

template <typename T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, int32_t>) return MPI_INT32_T;
  else return MPI_INT64_T;
}

// Chunk c of n elements over p ranks: n / p elements, one more for the first n % p chunks.
struct Range {
  int64_t begin, size;
};
Range chunk(int64_t n, int p, int c) {
  int64_t base = n / p, extra = n % p;
  return {c * base + std::min<int64_t>(c, extra), base + (c < extra ? 1 : 0)};
}

int64_t pieces(int64_t elements, int64_t per_piece) { return (elements + per_piece - 1) / per_piece; }

// local[i] = received[i] + local[i]: the partial sum that came along the ring plus this
// rank's term. Integers add as unsigned (two's complement wrapping, no undefined overflow).
template <typename T>
void add_into(T* __restrict local, const T* __restrict received, int64_t n) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    for (int64_t i = 0; i < n; ++i)
      local[i] = static_cast<T>(static_cast<U>(received[i]) + static_cast<U>(local[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) local[i] = received[i] + local[i];
  }
}

// out[i] = lower[i] + higher[i]: the lower rank's partial sum on the left. `out` is neither
// operand (see the top of this file). Integers add as unsigned, as above.
template <typename T>
void sum_pair(T* __restrict out, const T* __restrict lower, const T* __restrict higher, int64_t n) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<U>(lower[i]) + static_cast<U>(higher[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = lower[i] + higher[i];
  }
}

}  // namespace

bool launched_by_mpi() {
  if (env_count("OMPI_COMM_WORLD_SIZE") > 1) return true;  // Open MPI's mpirun
  if (env_count("PMI_SIZE") > 1) return true;              // MPICH's Hydra, Slurm's PMI-2
  // srun with PMIx (or PMI-1) names the rank but not the count; Slurm gives the task
  // count. SLURM_NTASKS alone is no sign: a batch script's own shell has it too.
  if (std::getenv("PMIX_RANK") || std::getenv("PMI_RANK"))
    return env_count("SLURM_NTASKS") > 1 || env_count("SLURM_NPROCS") > 1;
  return false;
}

Mpi& Mpi::init() {
  // Never destroyed: the runtime's collective and the at-exit MPI_Finalize refer to it
  // until the process ends.
  static Mpi* session = g_session = new Mpi();
  return *session;
}

Mpi::Mpi() {
  timeout_s_ = timeout_from_env();
  const Overlap overlap = overlap_from_env();
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // No argc / argv: MPI takes what it needs from the launcher's environment. SERIALIZED:
    // the calls come one at a time, but not always from the thread that started MPI (a
    // training step's CUDA all_reduce runs in a host function on the driver's thread; a
    // Python program may train on a thread of its own).
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    owns_mpi_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);  // for the messages until Kiln's communicator exists
  if (provided < MPI_THREAD_FUNNELED) {
    if (owns_mpi_) MPI_Finalize();
    throw Error("MPI gives thread level " + std::to_string(provided) +
                ", below the MPI_THREAD_FUNNELED that Kiln needs (its runtime runs a thread pool; "
                "only the thread that runs the step calls MPI): use an MPI built with thread "
                "support, or initialize MPI with MPI_Init_thread(..., MPI_THREAD_FUNNELED, ...)");
  }
  // Errors come back as codes, which check() turns into one clear line and MPI_Abort. On
  // MPI_COMM_WORLD too when Kiln started MPI; a program that started MPI itself chose its
  // communicators' handlers and keeps them.
  if (owns_mpi_) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup", "init");
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "init");
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", "init");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", "init");

  KilnCollective c{};
  c.ctx = this;
  c.rank = rank_;
  c.size = size_;
  c.all_reduce_sum = &Mpi::collective_all_reduce_sum;
  // The runtime's communication thread makes the calls then: SERIALIZED allows it (one call
  // at a time, the step waiting for each sum before it returns), FUNNELED does not.
  overlap_ = provided >= MPI_THREAD_SERIALIZED &&
             (overlap == Overlap::on || (overlap == Overlap::automatic && overlap_fits(comm_)));
  if (overlap_) c.flags |= KILN_COLLECTIVE_ASYNC;
  kiln_rt_set_collective(&c);
  if (owns_mpi_) std::atexit(&Mpi::finalize_at_exit);
}

void Mpi::finalize_at_exit() {
  kiln_rt_set_collective(nullptr);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || !g_session) return;  // the program finalized MPI itself
  MPI_Comm_free(&g_session->comm_);
  MPI_Finalize();
}

int32_t Mpi::collective_all_reduce_sum(void* ctx, void* data, int64_t count, int32_t dtype, const char** error) {
  Mpi* self = static_cast<Mpi*>(ctx);
  try {
    self->all_reduce_sum(data, count, dtype);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(self->error_, sizeof self->error_, "%s", e.what());
    if (error) *error = self->error_;
    return 1;
  }
}

[[noreturn]] void Mpi::abort(const std::string& why) {
  std::fprintf(stderr, "kiln: rank %d: %s\n", rank_, why.c_str());
  std::fflush(stderr);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort returned, or MPI is gone: this rank at least ends
}

void Mpi::check(int code, const char* call, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) std::snprintf(text, sizeof text, "MPI error code %d", code);
  abort(std::string(call) + " failed in " + what + ": " + text +
        " (the job cannot go on; the MPI library's own messages, if any, are above)");
}

void Mpi::wait(MPI_Request* requests, int n, int peer, bool receiving, const char* what) {
  if (n == 0) return;
  if (statuses_.size() < static_cast<size_t>(n)) statuses_.resize(n);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(timeout_s_);
  for (;;) {
    int done = 0;
    int code = MPI_Testall(n, requests, &done, statuses_.data());
    if (code == MPI_ERR_IN_STATUS) {
      for (int i = 0; i < n; ++i)
        if (statuses_[i].MPI_ERROR != MPI_SUCCESS && statuses_[i].MPI_ERROR != MPI_ERR_PENDING) code = statuses_[i].MPI_ERROR;
    }
    check(code, "MPI_Testall", what);
    if (done) return;
    const auto waited = Clock::now() - start;
    if (waited > limit) {
      const std::string within = " within " + seconds_text(timeout_s_) + " s";
      const std::string why = " (a rank died or hangs; KILN_DIST_TIMEOUT sets the limit)";
      if (peer < 0) abort(std::string(what) + " did not complete on every rank" + within + why);
      if (receiving) abort("no message from rank " + std::to_string(peer) + within + " in " + what + why);
      abort("rank " + std::to_string(peer) + " took no message" + within + " in " + what + why);
    }
    if (waited < kSpinTime) continue;
    if (waited < kYieldTime) sched_yield();
    else std::this_thread::sleep_for(std::min<Clock::duration>(waited / kSleepFraction, kMaxSleep));
  }
}

void Mpi::barrier() {
  if (size_ == 1) return;
  MPI_Request request;
  check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier", "barrier");
  wait(&request, 1, -1, true, "barrier");
}

void Mpi::broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= size_)
    throw Error("broadcast from rank " + std::to_string(root) + ": the job's ranks are 0 .. " +
                std::to_string(size_ - 1));
  if (size_ == 1 || bytes == 0) return;
  if (!data) throw Error("broadcast of " + std::to_string(bytes) + " bytes from a null buffer");
  auto* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes;) {
    int n = static_cast<int>(std::min<size_t>(bytes - done, kBroadcastPieceBytes));
    MPI_Request request;
    check(MPI_Ibcast(p + done, n, MPI_BYTE, root, comm_, &request), "MPI_Ibcast", "broadcast");
    wait(&request, 1, rank_ == root ? -1 : root, true, "broadcast");
    done += n;
  }
}

void Mpi::all_reduce_sum(void* data, int64_t count, int32_t dtype) {
  if (count < 0) throw Error("all_reduce_sum of " + std::to_string(count) + " elements (a count is >= 0)");
  if (count > 0 && !data) throw Error("all_reduce_sum of " + std::to_string(count) + " elements at a null buffer");
  switch (dtype) {
    case KILN_DTYPE_F32: return all_reduce(static_cast<float*>(data), count);
    case KILN_DTYPE_F64: return all_reduce(static_cast<double*>(data), count);
    case KILN_DTYPE_I32: return all_reduce(static_cast<int32_t*>(data), count);
    case KILN_DTYPE_I64: return all_reduce(static_cast<int64_t*>(data), count);
    default:
      throw Error("all_reduce_sum: dtype code " + std::to_string(dtype) +
                  " is not KILN_DTYPE_F32, F64, I32 or I64 (runtime/aot.h); sum other types as one of these");
  }
}

template <typename T>
void Mpi::all_reduce(T* data, int64_t count) {
  if (size_ == 1 || count == 0) return;
  // By (count, element size) alone: every rank passes the same count and dtype, so every
  // rank takes the same path.
  if (count <= kRecursiveDoublingMaxBytes / int64_t{sizeof(T)}) doubling_all_reduce(data, count);
  else ring_all_reduce(data, count);
}

// Recursive doubling on rank r of P, Q the largest power of two <= P (the order is in
// dist/mpi_collective.h):
//   r >= Q: sends its buffer to r - Q, then receives the finished sum from it;
//   r < P - Q: first receives rank r + Q's buffer and adds it (x_r + x_{r+Q});
//   r < Q: in round k swaps its partial with rank r XOR 2^k, both summing lower + higher;
//   r < P - Q: last sends the sum to rank r + Q.
// A rank waits for each message before the next round: a round's sum needs the peer's
// partial, and the buffer it sent becomes the next round's output.
template <typename T>
void Mpi::doubling_all_reduce(T* data, int64_t count) {
  const int p = size_, r = rank_;
  int q = 1;
  while (q <= p / 2) q *= 2;
  const int n = static_cast<int>(count);  // at most kRecursiveDoublingMaxBytes
  const MPI_Datatype type = mpi_type<T>();
  const char* what = "all_reduce's recursive doubling";
  MPI_Request requests[2];

  if (r >= q) {
    const int peer = r - q;
    check(MPI_Isend(data, n, type, peer, kTagFold, comm_, &requests[0]), "MPI_Isend", what);
    wait(&requests[0], 1, peer, false, what);
    check(MPI_Irecv(data, n, type, peer, kTagUnfold, comm_, &requests[0]), "MPI_Irecv", what);
    wait(&requests[0], 1, peer, true, what);
    return;
  }

  // Two scratch buffers of `count`, grown once: the peer's partial, and the sum.
  const size_t need = 2 * static_cast<size_t>(count) * sizeof(T);
  if (scratch_.size() < need) scratch_.resize(need);
  T* received = reinterpret_cast<T*>(scratch_.data());
  T* partial = data;           // this rank's partial sum
  T* spare = received + count;  // where the next sum goes: the other of data and scratch
  auto add = [&](const T* lower, const T* higher) {
    sum_pair(spare, lower, higher, count);
    std::swap(partial, spare);
  };

  const int folded = r + q < p ? r + q : -1;  // the rank whose term this one adds first
  if (folded >= 0) {
    check(MPI_Irecv(received, n, type, folded, kTagFold, comm_, &requests[0]), "MPI_Irecv", what);
    wait(&requests[0], 1, folded, true, what);
    add(partial, received);
  }
  for (int bit = 1; bit < q; bit *= 2) {
    const int peer = r ^ bit;
    check(MPI_Irecv(received, n, type, peer, kTagDoubling, comm_, &requests[0]), "MPI_Irecv", what);
    check(MPI_Isend(partial, n, type, peer, kTagDoubling, comm_, &requests[1]), "MPI_Isend", what);
    wait(&requests[0], 1, peer, true, what);
    wait(&requests[1], 1, peer, false, what);
    if (r < peer) add(partial, received);
    else add(received, partial);
  }
  if (folded >= 0)
    check(MPI_Isend(partial, n, type, folded, kTagUnfold, comm_, &requests[0]), "MPI_Isend", what);
  if (partial != data) std::memcpy(data, partial, static_cast<size_t>(count) * sizeof(T));  // both only read `partial`
  if (folded >= 0) wait(&requests[0], 1, folded, false, what);
}

template <typename T>
void Mpi::ring_all_reduce(T* data, int64_t count) {
  // The scratch holds kSlots pieces of the largest chunk (chunk 0), grown once.
  const int64_t slot = std::min<int64_t>(chunk(count, size_, 0).size, kPieceBytes / int64_t{sizeof(T)});
  const size_t need = static_cast<size_t>(kSlots * slot) * sizeof(T);
  if (scratch_.size() < need) scratch_.resize(need);
  for (int step = 0; step < size_ - 1; ++step) ring_step(data, count, Phase::reduce_scatter, step);
  for (int step = 0; step < size_ - 1; ++step) ring_step(data, count, Phase::all_gather, step);
}

// Step `step` of a phase on rank r of P (indices mod P):
//   reduce-scatter: sends chunk r - step to r + 1, receives chunk r - step - 1 from r - 1 and
//     adds its own term; after P - 1 steps rank r holds the finished chunk r + 1, whose sum
//     began at rank r + 1 and took each next rank's term in turn.
//   all-gather: sends chunk r + 1 - step (finished) to r + 1, receives the finished chunk
//     r - step from r - 1 in place.
template <typename T>
void Mpi::ring_step(T* data, int64_t count, Phase phase, int step) {
  const int p = size_, r = rank_;
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  const bool reducing = phase == Phase::reduce_scatter;
  const int send_chunk = ((reducing ? r - step : r + 1 - step) % p + p) % p;
  const int recv_chunk = ((reducing ? r - step - 1 : r - step) % p + p) % p;
  const char* what = reducing ? "all_reduce's reduce-scatter" : "all_reduce's all-gather";
  const int tag = reducing ? kTagReduceScatter : kTagAllGather;
  const Range out = chunk(count, p, send_chunk), in = chunk(count, p, recv_chunk);
  const int64_t per_piece = kPieceBytes / int64_t{sizeof(T)};
  const MPI_Datatype type = mpi_type<T>();

  const int64_t n_out = pieces(out.size, per_piece), n_in = pieces(in.size, per_piece);
  // The sends' requests, then (all-gather) the receives': grown before any is posted.
  if (sends_.size() < static_cast<size_t>(n_out + n_in)) sends_.resize(n_out + n_in);
  for (int64_t k = 0; k < n_out; ++k) {
    const int64_t at = k * per_piece;
    check(MPI_Isend(data + out.begin + at, static_cast<int>(std::min(per_piece, out.size - at)), type, next, tag,
                    comm_, &sends_[k]),
          "MPI_Isend", what);
  }

  if (reducing) {
    T* slots = reinterpret_cast<T*>(scratch_.data());
    const int64_t slot = std::min(in.size, per_piece);  // every piece but the last fills a slot
    MPI_Request receives[kSlots];
    auto post = [&](int64_t k) {
      const int64_t at = k * per_piece;
      check(MPI_Irecv(slots + (k % kSlots) * slot, static_cast<int>(std::min(per_piece, in.size - at)), type, prev,
                      tag, comm_, &receives[k % kSlots]),
            "MPI_Irecv", what);
    };
    for (int64_t k = 0; k < std::min<int64_t>(kSlots, n_in); ++k) post(k);
    for (int64_t k = 0; k < n_in; ++k) {
      wait(&receives[k % kSlots], 1, prev, true, what);
      const int64_t at = k * per_piece;
      add_into(data + in.begin + at, slots + (k % kSlots) * slot, std::min(per_piece, in.size - at));
      if (k + kSlots < n_in) post(k + kSlots);
    }
  } else {
    // Received straight into place.
    MPI_Request* receives = sends_.data() + n_out;
    for (int64_t k = 0; k < n_in; ++k) {
      const int64_t at = k * per_piece;
      check(MPI_Irecv(data + in.begin + at, static_cast<int>(std::min(per_piece, in.size - at)), type, prev, tag,
                      comm_, &receives[k]),
            "MPI_Irecv", what);
    }
    wait(receives, static_cast<int>(n_in), prev, true, what);
  }
  wait(sends_.data(), static_cast<int>(n_out), next, false, what);
}

}  // namespace kiln::dist
