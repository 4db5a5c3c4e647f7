// The two halves of the kill -9 test (crash_test.sh).
//   crash_writer write DIR   saves checkpoints of ~4 MB through CheckpointDir(DIR, 2) in an
//                            endless loop, from the step after DIR's latest, until killed.
//   crash_writer check DIR   checks what a killed writer left: the latest checkpoint reads
//                            with read_state (checksums pass) and holds exactly the content
//                            of its step; no temporary file is listed. Prints the step and
//                            how many temporary files the writer left (a kill mid-write).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "train/checkpoint.h"

using namespace kiln;

namespace {

constexpr int64_t kElements = 1 << 20;  // f32: 4 MiB

// Element i of step s's weights: exact in f32, different for every step.
float weight(int64_t step, int64_t i) { return static_cast<float>((step * 7919 + i) % 65536); }

TensorMap state_of(int64_t step) {
  TensorMap m;
  Tensor w(DType::f32, {kElements / 1024, 1024});
  float* p = w.data<float>();
  for (int64_t i = 0; i < kElements; ++i) p[i] = weight(step, i);
  m.emplace("w", std::move(w));
  m.emplace("step", Tensor::scalar(DType::i64, step));
  return m;
}

int check(const std::string& dir) {
  // A writer killed before it created the folder (a loaded machine) left nothing at all.
  if (!std::filesystem::exists(dir)) {
    std::printf("no checkpoint yet, 0 temporary files\n");
    return 0;
  }
  int temps = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    temps += e.path().filename().string().find(".tmp.") != std::string::npos;
  CheckpointDir ckpt(dir, 2);
  for (const std::string& p : ckpt.list()) {
    std::string name = std::filesystem::path(p).filename().string();
    if (name.starts_with(".") || name.find(".tmp.") != std::string::npos) {
      std::fprintf(stderr, "check: a temporary file is listed as a checkpoint: %s\n", p.c_str());
      return 1;
    }
  }
  auto latest = ckpt.latest();
  if (!latest) {
    std::printf("no checkpoint yet, %d temporary files\n", temps);
    return 0;
  }
  SafetensorsFile f = read_state(*latest);
  int64_t step = f.tensors.at("step").get_int(0);
  char want[64];
  std::snprintf(want, sizeof want, "ckpt-%010lld.safetensors", static_cast<long long>(step));
  if (std::filesystem::path(*latest).filename() != want) {
    std::fprintf(stderr, "check: %s holds step %lld\n", latest->c_str(), static_cast<long long>(step));
    return 1;
  }
  if (!(f.tensors == state_of(step))) {
    std::fprintf(stderr, "check: %s does not hold the content of step %lld\n", latest->c_str(),
                 static_cast<long long>(step));
    return 1;
  }
  std::printf("step %lld, %d temporary files\n", static_cast<long long>(step), temps);
  return 0;
}

int write(const std::string& dir) {
  CheckpointDir ckpt(dir, 2);
  auto latest = ckpt.latest();
  int64_t step = latest ? read_state(*latest).tensors.at("step").get_int(0) + 1 : 1;
  for (;; ++step) ckpt.save(step, state_of(step), {{"writer", "crash_writer"}});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "check") != 0)) {
    std::fprintf(stderr, "usage: crash_writer write|check DIR\n");
    return 2;
  }
  try {
    return std::strcmp(argv[1], "write") == 0 ? write(argv[2]) : check(argv[2]);
  } catch (const Error& e) {
    std::fprintf(stderr, "crash_writer %s: %s\n", argv[1], e.what());
    return 1;
  }
}
