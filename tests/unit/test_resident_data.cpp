// make_resident_step (passes/resident_data.h): a training step fed from its state's copy of
// the data trains bitwise as the step fed batch by batch, and logs each step's loss.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <string>
#include <vector>

#include "codegen/executable.h"
#include "ir/interp.h"
#include "passes/resident_data.h"
#include "train/data.h"
#include "training_model.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

// `rows` deterministic examples for classifier(cnn, ...).
TensorDataset dataset(bool cnn, int64_t rows) {
  TensorMap b = testing::classifier_batch(cnn, rows);
  for (int64_t i = 0; i < b.at("x").numel(); ++i) b.at("x").set(i, ((i * 31 + i / 97) % 251) / 250.0);
  for (int64_t i = 0; i < rows; ++i) b.at("y").set(i, (i * 7 + i / 3) % 10);
  return {b};
}

Tensor order_tensor(const std::vector<int64_t>& order) {
  Tensor t(DType::i32, {static_cast<int64_t>(order.size())});
  for (size_t i = 0; i < order.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(order[i]));
  return t;
}

void require_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  INFO(what);
  REQUIRE(a.type() == b.type());
  REQUIRE(a.nbytes() == b.nbytes());
  REQUIRE(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

}  // namespace

TEST_CASE("resident data: steps gather their batches and train bitwise as host batches do", "[resident][passes]") {
  for (bool cnn : {false, true}) {
    CAPTURE(cnn);
    const int64_t batch = cnn ? 4 : 8, rows = 5 * batch + 3, steps = 5;
    testing::Model m = testing::training_model(cnn, batch, SGD{0.05, 0.9});
    Graph resident = make_resident_step(m.step, rows, steps + 2, "loss", "accuracy");
    CHECK(resident.inputs().size() == m.step.inputs().size() - 2 + 6);  // x, y out; 6 states in
    for (const GraphInput& in : resident.inputs()) CHECK(in.is_state);
    TensorDataset data = dataset(cnn, rows);
    std::vector<int64_t> order = epoch_order(rows, 3, 0);

    // The reference: host batches through the compiled step, one by one.
    auto plain = compile(m.step);
    plain->set_state(m.state);
    std::vector<double> losses, accuracies;
    for (int64_t s = 0; s < steps; ++s) {
      TensorMap b = gather_rows(data, std::span<const int64_t>(order).subspan(static_cast<size_t>(s * batch),
                                                                               static_cast<size_t>(batch)));
      TensorMap out = plain->run(b);
      losses.push_back(out.at("loss").get(0));
      accuracies.push_back(out.at("accuracy").get(0));
    }

    auto exe = compile(resident);
    exe->set_state(m.state);
    exe->set_state({{"data.x", data.columns.at("x")},
                    {"data.y", data.columns.at("y")},
                    {"data.order", order_tensor(order)},
                    {"data.cursor", Tensor::scalar(DType::i32, 0)},
                    {"data.losses", Tensor(DType::f32, {steps + 2})},
                    {"data.accuracies", Tensor(DType::f32, {steps + 2})}});
    for (int64_t s = 0; s < steps; ++s) exe->step({});
    for (const auto& [name, value] : plain->state()) require_equal(exe->state(name), value, name);
    CHECK(exe->state("data.cursor").get(0) == steps);
    Tensor logged = exe->state("data.losses"), logged_acc = exe->state("data.accuracies");
    for (int64_t s = 0; s < steps; ++s) {
      CHECK(logged.get(s) == losses[static_cast<size_t>(s)]);
      CHECK(logged_acc.get(s) == accuracies[static_cast<size_t>(s)]);
    }
    CHECK(logged.get(steps) == 0);  // slots not reached stay as they were
    // The data itself is never written.
    require_equal(exe->state("data.x"), data.columns.at("x"), "data.x");

    // The interpreter agrees (the reference semantics of the gathers and the logs).
    TensorMap st = m.state;
    st["data.x"] = data.columns.at("x");
    st["data.y"] = data.columns.at("y");
    st["data.order"] = order_tensor(order);
    st["data.cursor"] = Tensor::scalar(DType::i32, 1);
    st["data.losses"] = Tensor(DType::f32, {steps + 2});
    st["data.accuracies"] = Tensor(DType::f32, {steps + 2});
    TensorMap out = interpret_step(resident, st, {});
    CHECK(st.at("data.cursor").get(0) == 2);
    CHECK(st.at("data.losses").get(1) == out.at("loss").get(0));
  }
}

TEST_CASE("resident data: the rate of each step from data.lrs, as writing lr before each step", "[resident][passes]") {
  const int64_t batch = 8, rows = 4 * batch, steps = 4;
  testing::Model m = testing::training_model(false, batch, Adam{});
  Graph resident = make_resident_step(m.step, rows, steps, "loss", "", "lr");
  CHECK_FALSE(resident.find("lr").valid());  // the rate is data.lrs's
  CHECK_FALSE(resident.find_output("lr.next").valid());
  TensorDataset data = dataset(false, rows);
  std::vector<int64_t> order = epoch_order(rows, 1, 0);
  const std::vector<float> rates = {1e-3f, 3e-4f, 7e-3f, 2e-5f};
  auto plain = compile(m.step);
  plain->set_state(m.state);
  for (int64_t s = 0; s < steps; ++s) {
    plain->set_state("lr", Tensor::scalar(DType::f32, rates[static_cast<size_t>(s)]));
    plain->run(gather_rows(data, std::span<const int64_t>(order).subspan(static_cast<size_t>(s * batch),
                                                                          static_cast<size_t>(batch))));
  }
  auto exe = compile(resident);
  TensorMap st = m.state;
  st.erase("lr");
  exe->set_state(st);
  exe->set_state({{"data.x", data.columns.at("x")},
                  {"data.y", data.columns.at("y")},
                  {"data.order", order_tensor(order)},
                  {"data.cursor", Tensor::scalar(DType::i32, 0)},
                  {"data.losses", Tensor(DType::f32, {steps})},
                  {"data.lrs", Tensor::from<float>(DType::f32, {steps}, rates)}});
  for (int64_t s = 0; s < steps; ++s) exe->step({});
  for (const auto& [name, value] : plain->state())
    if (name != "lr") require_equal(exe->state(name), value, name);
  CHECK_THROWS_WITH(make_resident_step(m.step, rows, steps, "loss", "", "beta1x"),
                    ContainsSubstring("no scalar state input named 'beta1x' to take the rate from"));
}

TEST_CASE("resident data: clear errors", "[resident][passes]") {
  testing::Model m = testing::training_model(false, 8, SGD{0.05, 0.9});
  CHECK_THROWS_WITH(make_resident_step(m.step, 4, 10), ContainsSubstring("the batch (8) is larger than the data (4 rows)"));
  CHECK_THROWS_WITH(make_resident_step(m.step, 0, 10), ContainsSubstring("rows must be in 1.."));
  CHECK_THROWS_WITH(make_resident_step(m.step, 100, 0), ContainsSubstring("log_capacity must be at least 1"));
  CHECK_THROWS_WITH(make_resident_step(m.step, 100, 10, "nope"), ContainsSubstring("no loss output named 'nope'"));
  CHECK_THROWS_WITH(make_resident_step(m.step, 100, 10, "loss", "nope"),
                    ContainsSubstring("no accuracy output named 'nope'"));
  Graph twice = make_resident_step(m.step, 100, 10);
  CHECK_THROWS_WITH(make_resident_step(twice, 100, 10),
                    ContainsSubstring("the step has no non-state input to feed from resident data"));
}
