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

// Atomically writes `bytes` to `path` (temporary file in the same folder, fsync, rename,
// fsync the folder). kiln::Error "PATH: ..." on any failure; the temporary file is removed.
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
};
// Reads PATH and returns, for each name in `want`, its tensor, checked to have exactly that
// type (after rename/transpose/conversion). Errors name the tensor and both types:
// "w.safetensors: tensor 'fc1.weight' is f64[784,256] in the file, the graph needs
// f32[784,256]", "...: no tensor 'fc2.bias' (nor 'l2.bias' it is mapped to)". All or
// nothing: an error returns nothing.
TensorMap load_state(const std::string& path, const std::map<std::string, TensorType>& want,
                     const LoadStateOptions& options = {});
// Parses a rename table: lines (or comma-separated items) "KILN_NAME=SOURCE_NAME" with an
// optional ":T" after the source name for transpose; '#' starts a comment.
std::map<std::string, SourceTensor> parse_rename_table(std::string_view text, std::string_view name);

// A folder of numbered checkpoints, ckpt-<global step, 10 digits>.safetensors, of which the
// last `keep` are kept (older ones deleted after a new one is safely written).
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
  std::string dir_;
  int keep_;
};

// The newest complete checkpoint of folder `dir` (as CheckpointDir::latest, but without
// creating or tidying the folder: for readers), or nothing when it holds none.
// kiln::Error when `dir` cannot be listed.
std::optional<std::string> latest_checkpoint(const std::string& dir);

}  // namespace kiln
