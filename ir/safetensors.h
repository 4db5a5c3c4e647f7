// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON header {"NAME": {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value", ...}}, then the raw
// little-endian tensor bytes, C order. Written by Python's `safetensors` and PyTorch's
// `safetensors.torch.save_file`; Kiln's checkpoints (train/checkpoint.h) use it.
//
// dtypes: F32, F64, I32, I64, BOOL read and written; F16, BF16, I8, U8, I16, ... are
// recognized and refused by name ("tensor 'x': dtype BF16 is not supported; Kiln reads F32,
// F64, I32, I64, BOOL"). The JSON is parsed with nlohmann-json.
//
// Reading checks everything against the bytes present before trusting it: a regular file
// (read_safetensors: ir/file_read.h), the header length against the file size (and a 100 MB
// cap), the header's nesting (flat JSON: an object of objects whose only containers are the
// arrays shape and data_offsets; deeper is refused before parsing), the JSON, every entry's fields and their types,
// shapes (non-negative, product overflow), data_offsets within the data and equal to
// shape x dtype size, entries neither overlapping nor leaving holes (as the Python library
// requires), no trailing bytes, metadata values strings. Each failure is a kiln::Error
// "NAME: what is wrong" naming the tensor where there is one. Splats are written filled out.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "ir/calling.h"
#include "ir/tensor.h"

namespace kiln {

struct SafetensorsFile {
  TensorMap tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__" (string -> string)
};

// Bytes of a file with these tensors (in name order, data 8-aligned) and metadata.
std::string serialize_safetensors(const TensorMap& tensors, const std::map<std::string, std::string>& metadata = {});
// `name` is the file name errors start with.
SafetensorsFile parse_safetensors(std::string_view bytes, std::string_view name);
// Reads and parses PATH (kiln::Error "PATH: ..." for a missing or unreadable file too).
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace kiln
