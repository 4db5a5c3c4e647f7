// The host device (codegen/backend.h host_device): what every size of buffer promises, the
// small ones from the heap and the large ones (a model's weights as state) mapped.
#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <vector>

#include "codegen/backend.h"

using namespace kiln;

TEST_CASE("host device: buffers of every size are zeroed, 256-byte aligned and released", "[executable][host]") {
  Device& dev = *host_device();
  for (int round = 0; round < 2; ++round) {  // the second round reuses what the first released
    for (int64_t bytes : {int64_t{1}, int64_t{255}, int64_t{4096}, (int64_t{1} << 20) - 256, int64_t{1} << 20,
                          (int64_t{1} << 20) + 3, int64_t{5} << 20}) {
      CAPTURE(round, bytes);
      auto* p = static_cast<uint8_t*>(dev.allocate(bytes));
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
      bool zero = true;
      for (int64_t i = 0; i < bytes; ++i) zero = zero && p[i] == 0;
      CHECK(zero);
      std::vector<uint8_t> in(static_cast<size_t>(bytes)), out(static_cast<size_t>(bytes));
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 1);
      dev.upload(p, in.data(), bytes);
      dev.download(out.data(), p, bytes);
      CHECK(in == out);
      dev.release(p);
    }
  }
}
