// IDX files (the MNIST family's format) and the Fashion-MNIST data set.
//
// An IDX file is: two zero bytes, an element-type byte, a dimension count, that many
// big-endian u32 dimensions, then the elements, big-endian, row-major. Files may be
// gzip-compressed (detected from the content, not the name). Every malformed input gives
// a kiln::Error "PATH: what is wrong"; nothing is trusted before it is checked against the
// bytes actually present.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "ir/tensor.h"

namespace kiln {

enum class IdxType : uint8_t { u8 = 0x08, i8 = 0x09, i16 = 0x0B, i32 = 0x0C, f32 = 0x0D, f64 = 0x0E };

struct IdxHeader {
  IdxType type = IdxType::u8;
  Shape dims;
  size_t data_offset = 0;  // where the elements start
};

// An IDX file's bytes, gunzipped if it is gzip. The header is read and checked first, then
// only the element bytes it promises (and a few more, for parse_idx_header to report
// trailing data), so a wrong file fails at once. Refuses more than 2 GiB of data.
std::string read_idx_file(const std::string& path);
// Checks the header and that exactly the promised number of element bytes follows.
IdxHeader parse_idx_header(std::string_view bytes, std::string_view name);
// The elements as a tensor of the file's dims: i32 for the integer types, f32 / f64 for
// the float ones; values are unchanged (no scaling).
Tensor parse_idx(std::string_view bytes, std::string_view name);
Tensor read_idx(const std::string& path);

// Images and labels of a classification set.
struct Dataset {
  Tensor images;  // f32 [N,H*W] or [N,1,H,W], pixels scaled to [0,1]
  Tensor labels;  // i32 [N]
  int64_t size() const { return labels.rank() == 1 ? labels.shape()[0] : 0; }
};

enum class ImageLayout { flat, nchw };  // [N,H*W] (for MLPs) or [N,1,H,W] (for CNNs)

// An MNIST-style pair: u8 images [N,H,W] and u8 labels [N] in 0..num_classes-1.
Dataset load_mnist_files(const std::string& images_path, const std::string& labels_path,
                         ImageLayout layout = ImageLayout::flat, int num_classes = 10);

// $KILN_FASHION_MNIST_DIR if set, else /usr/share/datasets/fashion-mnist (where the Debian
// package dataset-fashion-mnist puts it).
std::string fashion_mnist_dir();
// split "train" (60000 images) or "test" (10000), 28x28, from DIR/{train,t10k}-{images-idx3,
// labels-idx1}-ubyte[.gz]. A missing file's error says which package provides it.
Dataset load_fashion_mnist(std::string_view split, const std::string& dir = fashion_mnist_dir(),
                           ImageLayout layout = ImageLayout::flat);
// "T-shirt/top", "Trouser", ..., "Ankle boot", indexed by label.
const std::array<std::string_view, 10>& fashion_mnist_classes();

// Rows [begin, begin + count) of a tensor's first axis, copied (for batching).
Tensor slice_rows(const Tensor& t, int64_t begin, int64_t count);

}  // namespace kiln
