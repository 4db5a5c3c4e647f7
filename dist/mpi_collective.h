// Kiln's MPI communication library for data-parallel training: a process-wide MPI session
// that installs itself as the runtime's collective (runtime/collective.h), so that the
// all_reduce nodes of a compiled training step sum gradients over the ranks of an mpirun /
// srun job.
//
// all_reduce_sum is a ring reduce-scatter followed by a ring all-gather over point-to-point
// messages, on a communicator of Kiln's own (a dup of MPI_COMM_WORLD: a program's own MPI
// traffic never matches Kiln's). With P ranks and n elements the buffer is cut into P chunks
// by (n, P) alone: chunk c holds n / P elements, plus one when c < n % P, chunks in rank
// order. Element i of chunk c is summed along the ring starting at rank c:
//
//     sum[i] = ((x_c[i] + x_{c+1}[i]) + x_{c+2}[i]) + ... + x_{c+P-1}[i]   (rank numbers mod P)
//
// in the element type (f32 in f32; integers exactly, wrapping as two's complement), and the
// all-gather copies each finished chunk to every rank. The order of the additions depends on
// (P, n) alone, never on which message arrives first, and every rank ends with the same bits.
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
  // MPI_THREAD_FUNNELED: Kiln calls MPI from the thread that runs the step only), which also
  // installs the runtime's collective (kiln_rt_set_collective) and registers MPI_Finalize to
  // run at exit. Uses an MPI that the program has initialized itself, then leaving
  // MPI_Finalize to it. Throws kiln::Error when KILN_DIST_TIMEOUT is not a positive number
  // or MPI gives less than MPI_THREAD_FUNNELED.
  static Mpi& init();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // KILN_DIST_TIMEOUT, read once by init().
  double timeout_seconds() const { return timeout_s_; }

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
  // Kept between calls: all_reduce's receive slots, its requests (one per piece of a chunk:
  // see kPieceBytes in mpi_collective.cpp) and their statuses.
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
