// State files and checkpoints.
//
// save_state / load_state: a TensorMap of state (parameters, optimizer buffers, step, lr, the
// hyper-parameters) as one safetensors file (ir/safetensors.h), which opens in Python with
// `safetensors` or PyTorch without Kiln. Every write is atomic: the bytes go to a temporary
// file in the same folder, which is fsync'ed and renamed over PATH, and the folder is
// fsync'ed; a crash (even kill -9) at any moment leaves either the old file or the new one,
// never a mix, and no temporary file is mistaken for a checkpoint. save_state adds to the
// metadata "kiln.format" = "kiln-state-1" and per tensor "kiln.crc32.NAME" = the CRC-32 (hex)
// of its bytes; load_state/read_state check them when present, so a flipped byte is an error
// naming the tensor ("ckpt.safetensors: tensor 'fc1.weight': checksum mismatch (the file is
// corrupt)").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/safetensors.h"
#include "ir/calling.h"
#include "ir/tensor.h"

namespace kiln {

using Metadata = std::map<std::string, std::string>;

// Atomically writes `bytes` to `path` (runtime/file_output.h: temporary file in the same
// folder, fsync, rename, fsync the folder; a device or FIFO is written in place, never
// replaced). kiln::Error "cannot write 'PATH': ..." on any failure; the temporary file is
// removed.
void write_file_atomic(const std::string& path, std::string_view bytes);

void save_state(const std::string& path, const TensorMap& state, const Metadata& metadata = {});
// The file's tensors and metadata, checksums checked (when the file has them: a file written
// by Python's safetensors has none).
SafetensorsFile read_state(const std::string& path);

// Where a Kiln state tensor comes from in a file written elsewhere (a PyTorch state_dict
// saved with safetensors): the source tensor's name, transposed if `transpose` (a 2-D
// tensor: PyTorch's Linear weight is [out, in], Kiln's [in, out]).
struct SourceTensor {
  std::string name;
  bool transpose = false;
};
struct LoadStateOptions {
  // Kiln name -> source; names not in the table are looked up under their own name.
  std::map<std::string, SourceTensor> rename;
  // Every name of `want` must be found, unless allow_missing (then the missing ones are
  // simply not in the result). Tensors of the file nobody asked for are ignored.
  bool allow_missing = false;
  // Convert F64 <-> F32 where the file's dtype differs (a PyTorch float64 export); off: a
  // dtype mismatch is an error.
  bool convert_dtype = false;
  // What errors call the rename table (its file name, for a table read from one).
  std::string rename_name = "the rename table";
};
// Reads PATH and returns, for each name in `want`, its tensor, checked to have exactly that
// type (after rename/transpose/conversion). Errors name the tensor and both types:
// "w.safetensors: tensor 'fc1.weight' is f64[784,256] in the file, the graph needs
// f32[784,256]", "...: no tensor 'fc2.bias' (nor 'l2.bias' it is mapped to)". A rename
// entry for a name `want` lacks (a typo, another model's table) is an error too, listing the
// names there are. All or nothing: an error returns nothing.
TensorMap load_state(const std::string& path, const std::map<std::string, TensorType>& want,
                     const LoadStateOptions& options = {});
// Parses a rename table: lines (or comma-separated items) "KILN_NAME=SOURCE_NAME" with an
// optional ":T" after the source name for transpose; '#' starts a comment.
std::map<std::string, SourceTensor> parse_rename_table(std::string_view text, std::string_view name);

// The name of the first float tensor (in name order) holding a NaN or an infinity; nullopt
// when every float is finite.
std::optional<std::string> first_nonfinite(const TensorMap& state);

// A folder of numbered checkpoints, ckpt-<global step, 10 digits>.safetensors, of which the
// last `keep` are kept (older ones deleted after a new one is safely written). The newest
// checkpoint whose floats are all finite is never deleted, even when it is older than the
// last `keep`: a run that trains on after diverging (NaN or infinite weights) cannot rotate
// out the last good checkpoint.
class CheckpointDir {
 public:
  explicit CheckpointDir(std::string dir, int keep = 3);  // creates the folder if needed
  const std::string& dir() const { return dir_; }
  // Writes the checkpoint for `global_step` atomically, then prunes. Returns its path.
  std::string save(int64_t global_step, const TensorMap& state, const Metadata& metadata);
  // Complete checkpoints (temporary files are ignored), oldest first.
  std::vector<std::string> list() const;
  std::optional<std::string> latest() const;

 private:
  // Whether every float of the checkpoint at `path` is finite (false for a file that cannot
  // be read); remembered per path, so a file is read at most once.
  bool all_finite(const std::string& path);

  std::string dir_;
  int keep_;
  std::map<std::string, bool> finite_;
};

// An advisory lock (flock(2)) on a checkpoint folder, held by a training run for as long as
// it writes there: the file DIR/.lock, which holds the holder's process id. Taking it fails
// at once, with kiln::Error "DIR: the checkpoint folder is in use by another training run
// (pid N) ...", when another lock holds it: another process's, or another CheckpointLock in
// this process (flock locks belong to an open file, not a process). Released when destroyed
// or when the process ends in any way (kill -9 included); the file stays. Creates the folder
// if needed.
class CheckpointLock {
 public:
  explicit CheckpointLock(std::string dir);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int fd_ = -1;
};

// The newest complete checkpoint of folder `dir` (as CheckpointDir::latest, but without
// creating or tidying the folder: for readers), or nothing when it holds none.
// kiln::Error when `dir` cannot be listed.
std::optional<std::string> latest_checkpoint(const std::string& dir);

}  // namespace kiln
