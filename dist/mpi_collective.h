// Kiln's MPI communication library for data-parallel training: a process-wide MPI session
// that installs itself as the runtime's collective (runtime/collective.h), so that the
// all_reduce nodes of a compiled training step sum gradients over the ranks of an mpirun /
// srun job.
//
// all_reduce_sum takes one of two paths, chosen by the buffer's size in bytes alone, so
// every rank takes the same one. Both run over point-to-point messages on a communicator of
// Kiln's own (a dup of MPI_COMM_WORLD: a program's own MPI traffic never matches Kiln's),
// and both add in the element type (f32 in f32; integers exactly, wrapping as two's
// complement).
//
// Up to Mpi::kRecursiveDoublingMaxBytes (64 KiB), recursive doubling: every rank exchanges
// its whole partial sum with one peer per round, floor(log2 P) rounds (plus two messages
// when P is not a power of two), where the ring would take 2 (P - 1) steps. With Q the
// largest power of two <= P, element i is
//
//     y_r = x_r + x_{r+Q}  for r < P - Q,  y_r = x_r  for P - Q <= r < Q   (the fold)
//     sum = ((y_0 + y_1) + (y_2 + y_3)) + ((y_4 + y_5) + (y_6 + y_7)) + ...  (the rounds)
//
// Ranks r >= Q send their buffer to rank r - Q, which adds it; in round k = 0 .. log2 Q - 1
// rank r < Q swaps its partial with rank r XOR 2^k and both compute lower rank's partial +
// higher rank's partial, so after round k each aligned block of 2^(k+1) ranks holds the sum
// of its two halves, the lower half on the left; rank r - Q then sends the sum to rank r.
// With 3 ranks that is (x_0 + x_2) + x_1, with 4 (x_0 + x_1) + (x_2 + x_3).
//
// Above it, a ring reduce-scatter followed by a ring all-gather. With P ranks and n elements
// the buffer is cut into P chunks by (n, P) alone: chunk c holds n / P elements, plus one
// when c < n % P, chunks in rank order. Element i of chunk c is summed along the ring
// starting at rank c:
//
//     sum[i] = ((x_c[i] + x_{c+1}[i]) + x_{c+2}[i]) + ... + x_{c+P-1}[i]   (rank numbers mod P)
//
// and the all-gather copies each finished chunk to every rank. Either way the order of the
// additions depends on (P, n) alone, never on which message arrives first, and every rank
// ends with the same bits.
//
// Every wait has a deadline: KILN_DIST_TIMEOUT seconds (default 300) without progress on a
// message ends the whole job through MPI_Abort with a line that names this rank and the peer
// it waited for, as does any error MPI reports (MPI_ERRORS_RETURN on Kiln's communicator,
// and on MPI_COMM_WORLD when Kiln started MPI).
// A job never hangs on a dead rank; with mpirun on several hosts, pass the variable on with
// `-x KILN_DIST_TIMEOUT`.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::dist {

// True when this process is one of several ranks started by mpirun / mpiexec / srun (Open
// MPI's OMPI_COMM_WORLD_SIZE, PMI_SIZE of MPICH's Hydra and Slurm's PMI-2, or SLURM_NTASKS
// of a task that has a PMI_RANK / PMIX_RANK), read from the environment without MPI_Init: a
// program decides with it whether to start MPI at all. A single rank gives false.
bool launched_by_mpi();

class Mpi {
 public:
  // The process's MPI session, started on the first call (MPI_Init_thread asking for
  // MPI_THREAD_SERIALIZED: Kiln makes one call at a time, from the thread that runs the step,
  // the runtime's communication thread (overlap(), below) or, for a CUDA step, the driver's
  // host-function thread; an MPI that gives only MPI_THREAD_FUNNELED is accepted, and then
  // steps must run on the CPU from the thread that started MPI, without overlap), which also
  // installs the runtime's collective (kiln_rt_set_collective) and registers MPI_Finalize to
  // run at exit. Uses an MPI that the program has initialized itself, then leaving
  // MPI_Finalize to it. Throws kiln::Error when KILN_DIST_TIMEOUT is not a positive number,
  // KILN_DIST_OVERLAP is not 0, 1 or auto, or MPI gives less than MPI_THREAD_FUNNELED.
  static Mpi& init();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // KILN_DIST_TIMEOUT, read once by init().
  double timeout_seconds() const { return timeout_s_; }
  // Whether a compiled step's sums run on the runtime's communication thread, overlapped
  // with its computation (KILN_COLLECTIVE_ASYNC): an MPI at MPI_THREAD_SERIALIZED or above,
  // and KILN_DIST_OVERLAP: 1, 0, or auto (the default: when that thread has a core to
  // spare, i.e. this rank's threads plus one fit the cores it may run on, and every rank of
  // the host's do in the host's).
  bool overlap() const { return overlap_; }

  // Returns once every rank has called it.
  void barrier();
  // `bytes` bytes at `data` from rank `root` to every rank (each rank passes the same
  // `bytes` and `root`). Throws kiln::Error for a root outside 0 .. size() - 1.
  void broadcast(void* data, size_t bytes, int root);
  // Sums `count` elements of KILN_DTYPE_* `dtype` (f32, f64, i32, i64) at `data` over the
  // ranks in place, in the order above: bitwise the same on every rank and every run with
  // the same rank count. Every rank passes the same count and dtype. Throws kiln::Error for
  // another dtype, a negative count or a null buffer (before any message is sent, so every
  // rank throws alike); a dead or hung peer or an MPI error aborts the job.
  void all_reduce_sum(void* data, int64_t count, int32_t dtype);

  // all_reduce_sum of at most this many bytes takes recursive doubling (above). Its
  // log2 P messages carry the whole buffer each, the ring's 2 (P - 1) carry 1 / P of it:
  // doubling wins while the latencies it saves outweigh the bytes it adds. Measured on one
  // host here (shared memory, 2 to 4 ranks): doubling is faster up to 32 KiB, as fast
  // (2 ranks) or faster (3, 4) at 64 KiB, and slower from 128 KiB (2, 3) or 256 KiB (4).
  // Between hosts (a = 20 us, 3.1 GB/s) the crossover is higher, 100 to 550 KB for 4 to 8
  // ranks and growing with the rank count, except at 3 ranks (37 KB: the fold adds two
  // messages), where 64 KiB costs 123 us against the ring's 108. The measurements and the
  // model are in docs/distributed.md. Small enough too that the two scratch buffers
  // (128 KiB) cost nothing and a message's count is far below INT_MAX.
  static constexpr int64_t kRecursiveDoublingMaxBytes = int64_t{64} << 10;

  // Prints "kiln: rank R: <why>" to stderr and ends every rank of the job (MPI_Abort, exit
  // status 1).
  [[noreturn]] void abort(const std::string& why);

  // Kiln's communicator (a dup of MPI_COMM_WORLD).
  MPI_Comm comm() const { return comm_; }

  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;

 private:
  Mpi();
  static void finalize_at_exit();

  enum class Phase { reduce_scatter, all_gather };
  // all_reduce_sum of T: recursive doubling up to kRecursiveDoublingMaxBytes, else the ring.
  template <typename T>
  void all_reduce(T* data, int64_t count);
  template <typename T>
  void doubling_all_reduce(T* data, int64_t count);
  template <typename T>
  void ring_all_reduce(T* data, int64_t count);
  template <typename T>
  void ring_step(T* data, int64_t count, Phase phase, int step);
  // Waits for `n` requests; the messages go to / come from rank `peer` (-1: a collective of
  // every rank); `what` names the operation in the messages.
  void wait(MPI_Request* requests, int n, int peer, bool receiving, const char* what);
  // Aborts with MPI's description of `code` unless it is MPI_SUCCESS.
  void check(int code, const char* call, const char* what);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 300;
  bool owns_mpi_ = false;  // MPI_Init was ours, so MPI_Finalize is too
  bool overlap_ = false;
  // Kept between calls: all_reduce's receive slots (the ring's) or its received and summed
  // buffers (recursive doubling's), its requests (one per piece of a chunk: see kPieceBytes
  // in mpi_collective.cpp) and their statuses.
  std::vector<std::byte> scratch_;
  std::vector<MPI_Request> sends_;
  std::vector<MPI_Status> statuses_;
  // The runtime's collective returns a failure's message in static storage: this, the
  // session being never destroyed.
  char error_[512] = {};
  // KilnCollective::all_reduce_sum over this session (`ctx`).
  static int32_t collective_all_reduce_sum(void* ctx, void* data, int64_t count, int32_t dtype, const char** error);
};

}  // namespace kiln::dist
