// State files and checkpoints (train/checkpoint.h): checksums that catch every flipped byte,
// truncation, wrong dtypes and missing tensors named in the error, loading a PyTorch
// state_dict saved by Python's safetensors (tests/data/torch_mlp.safetensors, made by
// tests/data/make_torch_mlp.py) through a rename table, and a folder keeping the last K.
// The kill -9 test is tests/checkpoint/crash_test.sh.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <unistd.h>

#include "tests/unit/error_of.h"
#include "tests/unit/temp_dir.h"
#include "train/checkpoint.h"

using namespace kiln;
using kiln::testing::error_of;
using kiln::testing::slurp;
using kiln::testing::TempDir;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

namespace {

void put(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out);
}

TensorMap small_state() {
  TensorMap m;
  m.emplace("fc1.weight", Tensor::from(DType::f32, {2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6}));
  m.emplace("fc1.bias", Tensor::from(DType::f32, {3}, std::vector<float>{0.5f, -0.5f, 0}));
  m.emplace("step", Tensor::scalar(DType::i64, int64_t(42)));
  m.emplace("lr", Tensor::scalar(DType::f32, 0.01));
  return m;
}

std::map<std::string, TensorType> types_of(const TensorMap& m) {
  std::map<std::string, TensorType> t;
  for (const auto& [name, v] : m) t.emplace(name, v.type());
  return t;
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[size_t(i)])) << (8 * i);
  return n;
}

}  // namespace

TEST_CASE("checkpoint: save_state writes a safetensors file with checksums; read_state checks them", "[checkpoint]") {
  TempDir dir;
  std::string path = dir / "s.safetensors";
  save_state(path, small_state(), {{"epoch", "2"}});
  SafetensorsFile f = read_state(path);
  CHECK(f.tensors == small_state());
  CHECK(f.metadata.at("epoch") == "2");
  CHECK(f.metadata.at("kiln.format") == "kiln-state-1");
  CHECK(f.metadata.at("kiln.crc32.step").size() == 8);
  CHECK(f.metadata.contains("kiln.crc32.__metadata__"));
  CHECK(dir.files() == std::vector<std::string>{"s.safetensors"});  // no temporary file left
  // A plain safetensors reader sees the same tensors.
  CHECK(read_safetensors(path).tensors == small_state());
  // Overwriting replaces it.
  TensorMap other = small_state();
  other.at("step") = Tensor::scalar(DType::i64, int64_t(43));
  save_state(path, other);
  CHECK(read_state(path).tensors == other);
  CHECK(load_state(path, types_of(other)) == other);
}

TEST_CASE("checkpoint: write_file_atomic errors name the path and the system's reason", "[checkpoint]") {
  TempDir dir;
  std::string path = dir / "missing/x.bin";
  std::string e = error_of([&] { write_file_atomic(path, "abc"); });
  CHECK(e == "cannot write '" + path + "': its folder '" + dir / "missing" + "' does not exist");
  // A folder is refused before anything is written: no temporary file is left.
  std::filesystem::create_directory(dir / "d");
  std::filesystem::create_directory(dir / "d/sub");
  put(dir / "d/sub/f", "x");
  e = error_of([&] { write_file_atomic(dir / "d/sub", "abc"); });
  CHECK(e == "cannot write '" + dir / "d/sub" + "': it is a folder (name a file in it)");
  CHECK(std::distance(std::filesystem::directory_iterator(dir / "d"), {}) == 1);
  write_file_atomic(dir / "ok.bin", std::string("a\0b", 3));
  CHECK(slurp(dir / "ok.bin") == std::string("a\0b", 3));
}

TEST_CASE("checkpoint: a truncated file is refused", "[checkpoint]") {
  TempDir dir;
  std::string path = dir / "s.safetensors";
  save_state(path, small_state());
  std::string bytes = slurp(path);
  put(path, bytes.substr(0, bytes.size() - 1));
  // The last tensor in the data is "step" (name order: fc1.bias, fc1.weight, lr, step).
  CHECK(error_of([&] { read_state(path); }) ==
        path + ": tensor 'step': data_offsets [40,48] reach beyond the data (47 bytes; the file is truncated?)");
  put(path, bytes.substr(0, 100));
  CHECK_THAT(error_of([&] { read_state(path); }), StartsWith(path + ": the file is truncated: the header is "));
  put(path, "");
  CHECK_THAT(error_of([&] { load_state(path, types_of(small_state())); }), StartsWith(path + ": not a safetensors file"));
}

TEST_CASE("checkpoint: a flipped data byte is refused, naming the tensor", "[checkpoint]") {
  TempDir dir;
  std::string path = dir / "s.safetensors";
  save_state(path, small_state());
  std::string bytes = slurp(path);
  size_t data = 8 + header_length(bytes);
  // fc1.weight is bytes [12, 36) of the data.
  std::string flipped = bytes;
  flipped[data + 20] ^= 0x10;
  put(path, flipped);
  CHECK(error_of([&] { read_state(path); }) ==
        path + ": tensor 'fc1.weight': checksum mismatch (the file is corrupt)");
  CHECK(error_of([&] { load_state(path, types_of(small_state())); }) ==
        path + ": tensor 'fc1.weight': checksum mismatch (the file is corrupt)");
  // Every single bit of the data, flipped, is caught and names its tensor.
  for (size_t i = data; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      flipped = bytes;
      flipped[i] ^= static_cast<char>(1 << bit);
      put(path, flipped);
      INFO("byte " << i << " bit " << bit);
      CHECK_THAT(error_of([&] { read_state(path); }), EndsWith("': checksum mismatch (the file is corrupt)"));
    }
  }
}

TEST_CASE("checkpoint: a flipped header byte is refused", "[checkpoint]") {
  TempDir dir;
  std::string path = dir / "s.safetensors";
  save_state(path, small_state(), {{"epoch", "2"}, {"optimizer", "sgd"}});
  std::string bytes = slurp(path);
  size_t data = 8 + header_length(bytes);
  std::string flipped = bytes;
  size_t epoch = bytes.find("\"2\"");  // the epoch's value: only the metadata checksum sees it
  REQUIRE(epoch < data);
  flipped[epoch + 1] = '3';
  put(path, flipped);
  CHECK(error_of([&] { read_state(path); }) ==
        path + ": the metadata's checksum does not match (the file's header is corrupt)");
  // Every byte of the length and the JSON (the padding's spaces included), with one bit
  // flipped, is an error.
  for (size_t i = 0; i < data; ++i) {
    flipped = bytes;
    flipped[i] ^= 0x01;
    put(path, flipped);
    INFO("byte " << i << " '" << bytes[i] << "'");
    CHECK_THAT(error_of([&] { read_state(path); }), StartsWith(path + ": "));
  }
}

TEST_CASE("checkpoint: load_state refuses a wrong dtype or shape and a missing tensor, naming it", "[checkpoint]") {
  TempDir dir;
  std::string path = dir / "s.safetensors";
  TensorMap m = small_state();
  m.at("fc1.weight") = m.at("fc1.weight").cast(DType::f64);
  save_state(path, m);
  auto want = types_of(small_state());
  CHECK(error_of([&] { load_state(path, want); }) ==
        path + ": tensor 'fc1.weight' is f64[2,3] in the file, the graph needs f32[2,3]");
  LoadStateOptions convert;
  convert.convert_dtype = true;
  CHECK(load_state(path, want, convert) == small_state());
  want.at("fc1.bias") = TensorType{DType::f32, {4}};
  CHECK(error_of([&] { load_state(path, want, convert); }) ==
        path + ": tensor 'fc1.bias' is f32[3] in the file, the graph needs f32[4]");
  // An integer is never converted.
  want = types_of(small_state());
  want.at("step") = TensorType{DType::i32, {}};
  CHECK(error_of([&] { load_state(path, want, convert); }) ==
        path + ": tensor 'step' is i64[] in the file, the graph needs i32[]");

  want = types_of(small_state());
  want.emplace("fc2.bias", TensorType{DType::f32, {10}});
  CHECK(error_of([&] { load_state(path, want, convert); }) == path + ": no tensor 'fc2.bias'; the file has 4 tensors");
  convert.rename.emplace("fc2.bias", SourceTensor{"l2.bias", false});
  CHECK(error_of([&] { load_state(path, want, convert); }) ==
        path + ": no tensor 'l2.bias' (the graph's 'fc2.bias' is mapped to it); the file has 4 tensors");
  convert.allow_missing = true;
  CHECK(load_state(path, want, convert) == small_state());  // fc2.bias is simply not there
  // Tensors nobody asked for are ignored.
  CHECK(load_state(path, {{"step", TensorType{DType::i64, {}}}}).size() == 1);
}

TEST_CASE("checkpoint: a PyTorch state_dict saved by Python's safetensors loads through a rename table",
          "[checkpoint]") {
  const std::string path = std::string(KILN_TEST_DATA_DIR) + "/torch_mlp.safetensors";
  SafetensorsFile f = read_state(path);  // no Kiln checksums: accepted as is
  CHECK(f.metadata == std::map<std::string, std::string>{{"format", "pt"}});
  CHECK(f.tensors.size() == 5);
  CHECK(f.tensors.at("num_batches_tracked") == Tensor::scalar(DType::i64, int64_t(7)));

  LoadStateOptions options;
  options.rename = parse_rename_table(
      "# PyTorch nn.Sequential(Linear(6,4), ReLU, Linear(4,3)) -> Kiln\n"
      "fc1.weight = 0.weight:T\n"
      "fc1.bias=0.bias, fc2.weight=2.weight:T\n"
      "fc2.bias=2.bias   # biases are not transposed\n",
      "table.txt");
  std::map<std::string, TensorType> want{{"fc1.weight", {DType::f32, {6, 4}}},
                                         {"fc1.bias", {DType::f32, {4}}},
                                         {"fc2.weight", {DType::f32, {4, 3}}},
                                         {"fc2.bias", {DType::f32, {3}}}};
  TensorMap m = load_state(path, want, options);
  REQUIRE(m.size() == 4);
  // make_torch_mlp.py: 0.weight[o][i] = (6 o + i - 12) / 4, so fc1.weight[i][o] is that.
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t o = 0; o < 4; ++o) CHECK(m.at("fc1.weight").get(i * 4 + o) == double(6 * o + i - 12) * 0.25);
  for (int64_t o = 0; o < 4; ++o) CHECK(m.at("fc1.bias").get(o) == 0.5 * double(o));
  // 2.weight[o][i] = -(4 o + i) / 8.
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t o = 0; o < 3; ++o) CHECK(m.at("fc2.weight").get(i * 3 + o) == -0.125 * double(4 * o + i));
  CHECK(m.at("fc2.bias") == Tensor::from(DType::f32, {3}, std::vector<float>{1, 2, 3}));

  // Without the transposes the shapes disagree, and the error says where the tensor came from.
  options.rename.at("fc1.weight").transpose = false;
  CHECK(error_of([&] { load_state(path, want, options); }) ==
        path + ": tensor 'fc1.weight' (as '0.weight') is f32[4,6] in the file, the graph needs f32[6,4]");
  options.rename.at("fc1.bias").transpose = true;
  CHECK(error_of([&] { load_state(path, want, options); }) ==
        path + ": tensor 'fc1.bias' (as '0.bias', transposed): cannot transpose f32[4] (only a 2-D tensor can be)");
}

TEST_CASE("checkpoint: parse_rename_table reads lines and commas and refuses malformed items", "[checkpoint]") {
  auto t = parse_rename_table("a=b:T,c = d\n\n# only a comment\n e=f # trailing\n", "t");
  REQUIRE(t.size() == 3);
  CHECK((t.at("a").name == "b" && t.at("a").transpose));
  CHECK((t.at("c").name == "d" && !t.at("c").transpose));
  CHECK(t.at("e").name == "f");
  CHECK(parse_rename_table("", "t").empty());
  CHECK(error_of([] { parse_rename_table("a=b\nnoequals\n", "t.txt"); }) ==
        "t.txt:2: expected KILN_NAME=SOURCE_NAME (or SOURCE_NAME:T to transpose), found 'noequals'");
  CHECK(error_of([] { parse_rename_table("=b", "t"); }) ==
        "t:1: expected KILN_NAME=SOURCE_NAME (or SOURCE_NAME:T to transpose), found '=b'");
  CHECK(error_of([] { parse_rename_table("a=:T", "t"); }) ==
        "t:1: expected KILN_NAME=SOURCE_NAME (or SOURCE_NAME:T to transpose), found 'a=:T'");
  CHECK(error_of([] { parse_rename_table("a=b:X", "t"); }) ==
        "t:1: 'b:X': a source name cannot hold ':' or '=' (the only suffix is :T, to transpose)");
  CHECK(error_of([] { parse_rename_table("a=b, a=c", "t"); }) == "t:1: 'a' is mapped twice");
}

TEST_CASE("checkpoint: a checkpoint folder keeps the last K and ignores temporary and foreign files",
          "[checkpoint]") {
  TempDir dir;
  CHECK(error_of([&] { CheckpointDir(dir / "c", 0); }) == dir / "c" + ": cannot keep 0 checkpoints (keep at least 1)");
  CheckpointDir ckpt(dir / "c", 2);
  CHECK(ckpt.list().empty());
  CHECK(!ckpt.latest());
  // What a writer killed mid-write leaves, and files that are not checkpoints.
  put(dir / "c/.ckpt-0000000099.safetensors.tmp.1.0", "partial");
  put(dir / "c/ckpt-12.safetensors", "short step");
  put(dir / "c/ckpt-00000000x1.safetensors", "not a number");
  put(dir / "c/notes.txt", "");
  for (int64_t step = 1; step <= 5; ++step) {
    TensorMap s = small_state();
    s.at("step") = Tensor::scalar(DType::i64, step);
    CHECK(ckpt.save(step * 100, s, {}) == dir / "c/ckpt-" + std::string(7, '0') + std::to_string(step) + "00.safetensors");
  }
  CHECK(ckpt.list() == std::vector<std::string>{dir / "c/ckpt-0000000400.safetensors", dir / "c/ckpt-0000000500.safetensors"});
  CHECK(*ckpt.latest() == dir / "c/ckpt-0000000500.safetensors");
  CHECK(read_state(*ckpt.latest()).tensors.at("step") == Tensor::scalar(DType::i64, int64_t(5)));
  // Steps past 10 digits still sort by number.
  ckpt.save(12345678901, small_state(), {});
  CHECK(*ckpt.latest() == dir / "c/ckpt-12345678901.safetensors");
  CHECK(std::filesystem::exists(dir / "c/notes.txt"));
  CHECK(error_of([&] { ckpt.save(-1, small_state(), {}); }) == dir / "c" + ": cannot save a checkpoint for step -1");

  // A temporary file of a process that no longer runs is removed when the folder is opened;
  // one of a running process (this one) is left to it.
  std::string own = dir / "c/.ckpt-0000000600.safetensors.tmp." + std::to_string(::getpid()) + ".0";
  put(own, "in progress");
  put(dir / "c/.ckpt-0000000600.safetensors.tmp.999999999.0", "dead");
  CheckpointDir again(dir / "c", 2);
  CHECK(std::filesystem::exists(own));
  CHECK(!std::filesystem::exists(dir / "c/.ckpt-0000000600.safetensors.tmp.999999999.0"));
  CHECK(again.list().size() == 2);
}

TEST_CASE("checkpoint: a rename entry for a tensor the model lacks is refused, listing the model's",
          "[checkpoint]") {
  TempDir dir;
  const std::string path = dir / "s.safetensors";
  save_state(path, small_state());
  LoadStateOptions options;
  options.rename = parse_rename_table("fc1.weight=fc1.weight\nfc3.weight=l3.weight:T\n", "map.txt");
  options.rename_name = "map.txt";
  CHECK(error_of([&] { load_state(path, types_of(small_state()), options); }) ==
        "map.txt: 'fc3.weight' (mapped to 'l3.weight') is not a tensor of the model; it has 4: fc1.bias, "
        "fc1.weight, lr, step");
  options.rename.erase("fc3.weight");
  CHECK(load_state(path, types_of(small_state()), options) == small_state());
}

TEST_CASE("checkpoint: first_nonfinite names the first float tensor with a NaN or an infinity", "[checkpoint]") {
  TensorMap m = small_state();
  CHECK_FALSE(first_nonfinite(m));
  m.at("fc1.weight").set(4, INFINITY);
  m.at("lr") = Tensor::scalar(DType::f64, NAN);
  CHECK(first_nonfinite(m) == "fc1.weight");
  m.at("fc1.weight").set(4, 1);
  CHECK(first_nonfinite(m) == "lr");
  CHECK(first_nonfinite({{"s", Tensor::splat(Tensor::scalar(DType::f32, -INFINITY), {3, 3})}}) == "s");
}

TEST_CASE("checkpoint: the folder never deletes its newest finite checkpoint, however many non-finite follow",
          "[checkpoint][nonfinite]") {
  TempDir dir;
  auto state_at = [](int64_t step, bool finite) {
    TensorMap s = small_state();
    s.at("step") = Tensor::scalar(DType::i64, step);
    if (!finite) s.at("fc1.bias").set(1, NAN);
    return s;
  };
  auto name = [&](int64_t step) { return dir / ("c/ckpt-000000000" + std::to_string(step) + ".safetensors"); };
  {
    CheckpointDir ckpt(dir / "c", 2);
    ckpt.save(1, state_at(1, true), {});
    ckpt.save(2, state_at(2, true), {});
    for (int64_t step = 3; step <= 6; ++step) ckpt.save(step, state_at(step, false), {});
    CHECK(ckpt.list() == std::vector<std::string>{name(2), name(5), name(6)});
  }
  // Another process (a run resumed with --allow-nonfinite) reads what it did not write.
  {
    CheckpointDir ckpt(dir / "c", 1);
    ckpt.save(7, state_at(7, false), {});
    CHECK(ckpt.list() == std::vector<std::string>{name(2), name(7)});
    // A finite checkpoint again: the rotation goes back to the last K.
    ckpt.save(8, state_at(8, true), {});
    CHECK(ckpt.list() == std::vector<std::string>{name(8)});
  }
}

// Two processes: tests/unit/test_cli_train.cpp ("two kiln train runs on one folder").
TEST_CASE("checkpoint: a second lock on a folder fails at once, naming the holder's pid; released with it",
          "[checkpoint][lock]") {
  TempDir dir;
  std::optional<CheckpointLock> first;
  first.emplace(dir / "run");  // creates the folder
  CHECK(std::filesystem::is_directory(dir / "run"));
  CHECK(slurp(dir / "run/.lock") == std::to_string(::getpid()) + "\n");
  CHECK_THAT(error_of([&] { CheckpointLock second(dir / "run"); }),
             StartsWith(dir / "run" + ": the checkpoint folder is in use by another training run (this process, pid " +
                        std::to_string(::getpid()) + ")"));
  CHECK(CheckpointDir(dir / "run").list().empty());  // the lock file is not a checkpoint
  first.reset();
  CHECK_NOTHROW(CheckpointLock(dir / "run"));
}
