// The "cuda-emu" Backend: the CUDA backend's rendering, compiled for and run on the CPU.
#include <cstdlib>
#include <cstring>
#include <new>

#include "codegen/cuda/emu/emu.h"
#include "ir/error.h"

namespace kiln::cuda {
namespace {

// Device memory released on destruction.
struct Allocation {
  std::shared_ptr<Device> device;
  void* p = nullptr;
  Allocation(std::shared_ptr<Device> d, int64_t bytes) : device(std::move(d)), p(device->allocate(bytes)) {}
  ~Allocation() { device->release(p); }
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
};

class EmuProgram;

class EmuInstance final : public Instance {
 public:
  explicit EmuInstance(std::shared_ptr<const EmuProgram> program);
  void call(const std::vector<void*>& buffers) override;
  const void* output_data(ValueId v, const std::vector<void*>& buffers) const override;

 private:
  std::shared_ptr<const EmuProgram> program_;
  Allocation arena_;
  std::vector<void*> bufs_;
};

class EmuProgram final : public Program, public std::enable_shared_from_this<EmuProgram> {
 public:
  EmuProgram(std::shared_ptr<const Prepared> prepared, Rendered rendered,
             std::shared_ptr<const EmuModule> module, std::string prefix)
      : prepared_(std::move(prepared)),
        rendered_(std::move(rendered)),
        module_(std::move(module)),
        prefix_(std::move(prefix)) {
    // Constants go to the device once per program, as the GPU backend uploads them.
    for (const Tensor& t : rendered_.constants) {
      constants_.push_back(std::make_unique<Allocation>(device_, static_cast<int64_t>(t.nbytes())));
      device_->upload(constants_.back()->p, t.raw(), static_cast<int64_t>(t.nbytes()));
    }
  }
  const Prepared& prepared() const override { return *prepared_; }
  const std::shared_ptr<Device>& device() const override { return device_; }
  std::unique_ptr<Instance> instantiate() const override {
    return std::make_unique<EmuInstance>(shared_from_this());
  }
  std::string emit(std::string_view form) const override {
    if (form == "cuda") return rendered_.source;
    throw Error("cuda-emu: no '" + std::string(form) + "' form to emit (it has: cuda)");
  }
  std::vector<std::string> emit_forms() const override { return {"cuda"}; }

  const Rendered& rendered() const { return rendered_; }
  const EmuModule& module() const { return *module_; }
  const std::string& prefix() const { return prefix_; }
  void* constant(int32_t j) const { return constants_.at(static_cast<size_t>(j))->p; }

 private:
  std::shared_ptr<const Prepared> prepared_;
  Rendered rendered_;
  std::shared_ptr<const EmuModule> module_;
  std::string prefix_;
  std::shared_ptr<Device> device_ = host_device();  // host memory stands in for the GPU's
  std::vector<std::unique_ptr<Allocation>> constants_;
};

EmuInstance::EmuInstance(std::shared_ptr<const EmuProgram> program)
    : program_(std::move(program)), arena_(program_->device(), program_->rendered().total_bytes()) {}

void EmuInstance::call(const std::vector<void*>& buffers) {
  const Graph& g = program_->prepared().graph;
  KILN_CHECK(buffers.size() == g.inputs().size(),
             "cuda-emu: " + std::to_string(buffers.size()) + " buffers for " +
                 std::to_string(g.inputs().size()) + " graph inputs");
  bufs_ = buffers;
  for (size_t j = 0; j < program_->rendered().constants.size(); ++j)
    bufs_.push_back(program_->constant(static_cast<int32_t>(j)));
  emu_run(program_->rendered(), program_->module(), static_cast<unsigned char*>(arena_.p),
          bufs_.data(), program_->prefix());
}

const void* EmuInstance::output_data(ValueId v, const std::vector<void*>& buffers) const {
  const Prepared& p = program_->prepared();
  const ValuePlan& plan = p.memory.at(v);
  switch (plan.kind) {
    case BufferKind::Arena:
      return static_cast<const unsigned char*>(arena_.p) + plan.offset;
    case BufferKind::Input:
    case BufferKind::State:
      return buffers.at(static_cast<size_t>(p.graph.value(v).input));
    case BufferKind::StateInPlace:
      return buffers.at(static_cast<size_t>(p.graph.value(plan.state).input));
    case BufferKind::Constant: {
      int32_t j = program_->rendered().constant_index.at(static_cast<size_t>(v.id));
      KILN_CHECK(j >= 0, "cuda-emu: constant output %" + std::to_string(v.id) + " was not materialized");
      return program_->constant(j);
    }
  }
  internal_error("false", "cuda-emu: a value with no buffer kind");
}

class EmuBackend final : public Backend {
 public:
  std::string name() const override { return "cuda-emu"; }
  void check_available(const CompileOptions&) const override {
    std::string why;
    if (emu_host_compiler(&why).empty()) throw Error(why);
  }
  std::string target_key(const CompileOptions&) const override {
    // The shim is part of the code: a changed shim must not reuse old programs.
    return "cuda-emu;cxx=" + emu_host_compiler() + ";shim=" +
           std::to_string(std::hash<std::string>()(kCudaEmuHeader));
  }
  std::shared_ptr<const Program> compile(std::shared_ptr<const Prepared> prepared,
                                         const CompileOptions&) const override {
    Rendered r = render(*prepared);
    auto module = EmuModule::compile(r.source, "graph '" + prepared->graph.name() + "'");
    return make_emu_program(std::move(prepared), std::move(r), std::move(module));
  }
};

}  // namespace

std::shared_ptr<const Program> make_emu_program(std::shared_ptr<const Prepared> prepared,
                                                Rendered rendered,
                                                std::shared_ptr<const EmuModule> module,
                                                std::string prefix) {
  return std::make_shared<EmuProgram>(std::move(prepared), std::move(rendered), std::move(module),
                                      std::move(prefix));
}

std::unique_ptr<Backend> make_emu_backend() { return std::make_unique<EmuBackend>(); }

}  // namespace kiln::cuda
