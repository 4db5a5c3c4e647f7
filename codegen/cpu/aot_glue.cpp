// The per-model glue of an AOT object (module.h add_aot_glue), added to the module after
// optimization so that its code is bitwise the JIT's: the KilnAotModel descriptor of
// runtime/aot.h as constant globals, the embedded weights, a reference to the runtime's ABI
// version symbol, and the external NAME_* functions, each a thin wrapper over the runtime.
// Every other symbol of the module is made internal: two models link into one program.
#include <cstddef>
#include <cstring>
#include <functional>
#include <iterator>
#include <optional>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/Transforms/Utils/ModuleUtils.h>

#include "codegen/aot_dtype.h"
#include "codegen/cpu/module.h"
#include "ir/attrs.h"
#include "ir/calling.h"
#include "ir/error.h"
#include "runtime/aot.h"

namespace kiln::cpu::detail {

namespace {

class Glue {
 public:
  Glue(EmittedModule& em, const Prepared& p)
      : m_(*em.module), c_(*em.context), p_(p), g_(p.graph), sig_(signature(p.graph)) {
    i32_ = llvm::Type::getInt32Ty(c_);
    i64_ = llvm::Type::getInt64Ty(c_);
    ptr_ = llvm::PointerType::get(c_, 0);
    // The C structs of runtime/aot.h; check_layout() compares them with the C compiler's.
    tensor_ = llvm::StructType::create(c_, {ptr_, i32_, i32_, ptr_, i64_}, "KilnAotTensor");
    source_ = llvm::StructType::create(c_, {i32_, i32_, i64_, ptr_}, "KilnAotSource");
    model_ = llvm::StructType::create(c_,
                                      {i32_, ptr_, ptr_, ptr_, i64_, i32_,          // abi_version .. n_buffers
                                       i32_, ptr_, ptr_,                           // inputs
                                       i32_, ptr_, ptr_,                           // outputs
                                       i32_, ptr_, ptr_, ptr_,                     // state
                                       ptr_, ptr_,                                 // weights
                                       i64_},                                      // cpu_features
                                      "KilnAotModel");
    check_layout();
    // Declared first: a model name that would make NAME_create one of these is refused.
    llvm::Type* void_ = llvm::Type::getVoidTy(c_);
    declare("kiln_aot_create", ptr_, {ptr_});
    declare("kiln_aot_destroy", void_, {ptr_});
    declare("kiln_aot_call", i32_, {ptr_, ptr_, ptr_});
    declare("kiln_aot_get_state", i32_, {ptr_, ptr_, ptr_, i64_});
    declare("kiln_aot_set_state", i32_, {ptr_, ptr_, ptr_, i64_});
    declare("kiln_aot_load_weights", i32_, {ptr_, ptr_});
    declare("kiln_aot_save_weights", i32_, {ptr_, ptr_});
    declare("kiln_aot_error", ptr_, {ptr_});
  }

  llvm::GlobalVariable* descriptor(const AotModule& aot, llvm::Function* entry, const std::string& target,
                                   int64_t arena_bytes, uint64_t cpu_features) {
    const Signature& sig = sig_;
    std::vector<llvm::Constant*> inputs, input_buffer, outputs, output_source, state, state_buffer, update;
    for (size_t i : sig.inputs) {
      inputs.push_back(tensor(g_.inputs()[i].value, g_.value(g_.inputs()[i].value).name));
      input_buffer.push_back(int32(static_cast<int64_t>(i)));
    }
    for (size_t o : sig.outputs) {
      const GraphOutput& out = g_.outputs()[o];
      outputs.push_back(tensor(out.value, out.name));
      output_source.push_back(source(out.value));
    }
    for (size_t k = 0; k < sig.state.size(); ++k) {
      ValueId x = g_.inputs()[sig.state[k]].value;
      state.push_back(tensor(x, g_.value(x).name));
      state_buffer.push_back(int32(static_cast<int64_t>(sig.state[k])));
      update.push_back(state_update(x, sig.update[k]));
    }
    llvm::Constant* weights = null();
    llvm::Constant* weights_offset = null();
    if (aot.state && !sig.state.empty()) {
      std::string blob;
      std::vector<llvm::Constant*> offsets;
      for (size_t i : sig.state) {
        const std::string& name = g_.value(g_.inputs()[i].value).name;
        auto it = aot.state->find(name);
        KILN_CHECK(it != aot.state->end(), "aot glue: no initial value for state '" + name + "'");
        Tensor t = it->second.materialized();
        KILN_CHECK(t.type() == g_.value(g_.inputs()[i].value).type, "aot glue: state '" + name + "' mistyped");
        blob.resize(static_cast<size_t>(align_up(static_cast<int64_t>(blob.size()), 64)), '\0');
        offsets.push_back(int64(static_cast<int64_t>(blob.size())));
        blob.append(reinterpret_cast<const char*>(t.raw()), t.nbytes());
      }
      weights = global(llvm::ConstantDataArray::getRaw(blob, blob.size(), llvm::Type::getInt8Ty(c_)), "weights", 64);
      weights_offset = array(i64_, offsets, "weights_offset");
    }
    auto count = [&](const std::vector<llvm::Constant*>& v) { return int32(static_cast<int64_t>(v.size())); };
    llvm::Constant* init = llvm::ConstantStruct::get(
        model_, {int32(KILN_AOT_ABI_VERSION), string(aot.name), string(target), entry, int64(arena_bytes),
                 int32(static_cast<int64_t>(g_.inputs().size())),
                 count(inputs), array(tensor_, inputs, "inputs"), array(i32_, input_buffer, "input_buffer"),
                 count(outputs), array(tensor_, outputs, "outputs"), array(source_, output_source, "output_source"),
                 count(state), array(tensor_, state, "state"), array(i32_, state_buffer, "state_buffer"),
                 array(source_, update, "state_update"), weights, weights_offset,
                 llvm::ConstantInt::get(i64_, cpu_features)});
    return global(init, "model", 8);
  }

  // NAME_create, NAME_run / NAME_step, ...: see docs/aot.md.
  void functions(const std::string& name, llvm::GlobalVariable* model) {
    const Signature& sig = sig_;
    const bool step = updates_state(sig);
    const size_t n_in = sig.inputs.size(), n_out = sig.outputs.size();

    define(name + "_create", ptr_, {}, [&](llvm::IRBuilder<>& b, llvm::Function*) {
      return b.CreateCall(runtime("kiln_aot_create"), {model});
    });
    define(name + "_destroy", b_void(), {ptr_}, [&](llvm::IRBuilder<>& b, llvm::Function* f) {
      b.CreateCall(runtime("kiln_aot_destroy"), {f->getArg(0)});
      return nullptr;
    });
    // Positional pointers -> the arrays of kiln_aot_call, on the stack.
    std::vector<llvm::Type*> call_params(1 + n_in + n_out, ptr_);
    define(name + (step ? "_step" : "_run"), i32_, call_params, [&](llvm::IRBuilder<>& b, llvm::Function* f) {
      auto pack = [&](size_t first, size_t n) -> llvm::Value* {
        if (n == 0) return null();
        llvm::Value* a = b.CreateAlloca(llvm::ArrayType::get(ptr_, n));
        for (size_t i = 0; i < n; ++i)
          b.CreateStore(f->getArg(static_cast<unsigned>(first + i)), b.CreateConstInBoundsGEP2_64(
                                                                          llvm::ArrayType::get(ptr_, n), a, 0, i));
        return a;
      };
      llvm::Value* ins = pack(1, n_in);
      llvm::Value* outs = pack(1 + n_in, n_out);
      return b.CreateCall(runtime("kiln_aot_call"), {f->getArg(0), ins, outs});
    });
    for (const char* f : {"get_state", "set_state", "load_weights", "save_weights", "error"})
      forward(name + "_" + f, runtime(("kiln_aot_" + std::string(f)).c_str()));
  }

  // A relocation against kiln_aot_abi_v<N>: linking with a runtime of another ABI fails.
  void abi_reference() {
    auto* abi = new llvm::GlobalVariable(m_, i32_, true, llvm::GlobalValue::ExternalLinkage, nullptr,
                                         "kiln_aot_abi_v" + std::to_string(KILN_AOT_ABI_VERSION));
    llvm::appendToCompilerUsed(m_, {global(abi, "abi", 8)});
  }

  bool is_exported(const llvm::GlobalValue& v) const {
    for (const llvm::Function* f : exported_)
      if (f == &v) return true;
    return false;
  }

 private:
  void check_layout() {
    const llvm::DataLayout& dl = m_.getDataLayout();
    const llvm::StructLayout* t = dl.getStructLayout(tensor_);
    const llvm::StructLayout* s = dl.getStructLayout(source_);
    const llvm::StructLayout* md = dl.getStructLayout(model_);
    KILN_CHECK(t->getSizeInBytes().getFixedValue() == sizeof(KilnAotTensor) &&
                   t->getElementOffset(4).getFixedValue() == offsetof(KilnAotTensor, bytes),
               "aot glue: KilnAotTensor layout");
    KILN_CHECK(s->getSizeInBytes().getFixedValue() == sizeof(KilnAotSource) &&
                   s->getElementOffset(3).getFixedValue() == offsetof(KilnAotSource, data),
               "aot glue: KilnAotSource layout");
    const size_t offsets[] = {offsetof(KilnAotModel, abi_version), offsetof(KilnAotModel, name),
                              offsetof(KilnAotModel, target), offsetof(KilnAotModel, entry),
                              offsetof(KilnAotModel, arena_bytes), offsetof(KilnAotModel, n_buffers),
                              offsetof(KilnAotModel, n_inputs), offsetof(KilnAotModel, inputs),
                              offsetof(KilnAotModel, input_buffer), offsetof(KilnAotModel, n_outputs),
                              offsetof(KilnAotModel, outputs), offsetof(KilnAotModel, output_source),
                              offsetof(KilnAotModel, n_state), offsetof(KilnAotModel, state),
                              offsetof(KilnAotModel, state_buffer), offsetof(KilnAotModel, state_update),
                              offsetof(KilnAotModel, weights), offsetof(KilnAotModel, weights_offset),
                              offsetof(KilnAotModel, cpu_features)};
    KILN_CHECK(md->getSizeInBytes().getFixedValue() == sizeof(KilnAotModel), "aot glue: KilnAotModel size");
    for (unsigned i = 0; i < std::size(offsets); ++i)
      KILN_CHECK(md->getElementOffset(i).getFixedValue() == offsets[i], "aot glue: KilnAotModel field " + std::to_string(i));
  }

  llvm::Type* b_void() { return llvm::Type::getVoidTy(c_); }
  llvm::Constant* null() { return llvm::ConstantPointerNull::get(ptr_); }
  llvm::Constant* int32(int64_t v) { return llvm::ConstantInt::get(i32_, static_cast<uint64_t>(v), true); }
  llvm::Constant* int64(int64_t v) { return llvm::ConstantInt::get(i64_, static_cast<uint64_t>(v), true); }

  llvm::GlobalVariable* global(llvm::Constant* init, const std::string& name, uint64_t align) {
    auto* gv = new llvm::GlobalVariable(m_, init->getType(), true, llvm::GlobalValue::PrivateLinkage, init,
                                        "kiln.aot." + name);
    gv->setAlignment(llvm::Align(align));
    return gv;
  }
  llvm::Constant* string(const std::string& s) {
    auto* gv = global(llvm::ConstantDataArray::getString(c_, s), "str", 1);
    gv->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
    return gv;
  }
  llvm::Constant* array(llvm::Type* elem, const std::vector<llvm::Constant*>& items, const std::string& name) {
    if (items.empty()) return null();
    return global(llvm::ConstantArray::get(llvm::ArrayType::get(elem, items.size()), items), name, 8);
  }

  llvm::Constant* tensor(ValueId v, const std::string& name) {
    const TensorType& t = g_.type(v);
    std::vector<llvm::Constant*> dims;
    for (int64_t d : t.shape) dims.push_back(int64(d));
    return llvm::ConstantStruct::get(
        tensor_, {string(name), int32(aot_dtype(t.dtype)), int32(static_cast<int64_t>(t.shape.size())),
                  array(i64_, dims, "shape"), int64(t.numel() * static_cast<int64_t>(dtype_size(t.dtype)))});
  }

  llvm::Constant* source(int32_t kind, int64_t buffer, int64_t offset, llvm::Constant* data) {
    return llvm::ConstantStruct::get(source_, {int32(kind), int32(buffer), int64(offset), data});
  }
  // Where value v is after the entry function ran (as CpuInstance::output_data finds it).
  llvm::Constant* source(ValueId v) {
    const ValuePlan& vp = p_.memory.at(v);
    switch (vp.kind) {
      case BufferKind::Arena: return source(KILN_AOT_ARENA, 0, vp.offset, null());
      case BufferKind::Input:
      case BufferKind::State: return source(KILN_AOT_BUFFER, g_.value(v).input, 0, null());
      case BufferKind::StateInPlace: return source(KILN_AOT_BUFFER, g_.value(vp.state).input, 0, null());
      case BufferKind::Constant: {
        Tensor t = attr_tensor(g_.defining_node(v)->attrs, "value").materialized();
        llvm::StringRef bytes(reinterpret_cast<const char*>(t.raw()), t.nbytes());
        return source(KILN_AOT_CONSTANT, 0, 0,
                      global(llvm::ConstantDataArray::getRaw(bytes, bytes.size(), llvm::Type::getInt8Ty(c_)),
                             "constant", 64));
      }
    }
    KILN_CHECK(false, "aot glue: unknown buffer kind");
    return nullptr;
  }
  // X.next's place, or NONE when there is nothing to copy (no update, X.next = %X, or
  // written into X by the code), as the Executable decides its updates.
  llvm::Constant* state_update(ValueId x, std::optional<size_t> update) {
    if (!update) return source(KILN_AOT_NONE, 0, 0, null());
    ValueId v = g_.outputs()[*update].value;
    if (!update_needs_copy(p_.memory, x, v)) return source(KILN_AOT_NONE, 0, 0, null());
    return source(v);
  }

  void declare(const char* name, llvm::Type* ret, std::vector<llvm::Type*> params) {
    llvm::Function::Create(llvm::FunctionType::get(ret, params, false), llvm::Function::ExternalLinkage, name, m_);
  }
  llvm::Function* runtime(const char* name) {
    llvm::Function* f = m_.getFunction(name);
    KILN_CHECK(f, std::string("aot glue: runtime function not declared: ") + name);
    return f;
  }
  // An external function whose body `body` returns the value to return (null: void).
  void define(const std::string& name, llvm::Type* ret, std::vector<llvm::Type*> params,
              const std::function<llvm::Value*(llvm::IRBuilder<>&, llvm::Function*)>& body) {
    if (m_.getNamedValue(name))
      throw Error("aot: symbol '" + name + "' clashes with one the object or its runtime has: choose another name");
    auto* f = llvm::Function::Create(llvm::FunctionType::get(ret, params, false), llvm::Function::ExternalLinkage,
                                     name, m_);
    f->addFnAttr(llvm::Attribute::NoUnwind);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(c_, "entry", f));
    llvm::Value* r = body(b, f);
    if (ret->isVoidTy()) b.CreateRetVoid();
    else b.CreateRet(r);
    exported_.push_back(f);
  }
  // NAME_x(args) { return kiln_aot_x(args); }
  void forward(const std::string& name, llvm::Function* to) {
    llvm::FunctionType* t = to->getFunctionType();
    define(name, t->getReturnType(), t->params().vec(), [&](llvm::IRBuilder<>& b, llvm::Function* f) -> llvm::Value* {
      std::vector<llvm::Value*> args;
      for (llvm::Argument& a : f->args()) args.push_back(&a);
      return b.CreateCall(to, args);
    });
  }

  llvm::Module& m_;
  llvm::LLVMContext& c_;
  const Prepared& p_;
  const Graph& g_;
  const Signature sig_;
  llvm::IntegerType *i32_, *i64_;
  llvm::PointerType* ptr_;
  llvm::StructType *tensor_, *source_, *model_;
  std::vector<llvm::Function*> exported_;
};

}  // namespace

void add_aot_glue(EmittedModule& em, const Prepared& prepared, const AotModule& aot, const std::string& entry_name,
                  const std::string& target, uint64_t cpu_features) {
  llvm::Module& m = *em.module;
  llvm::Function* entry = m.getFunction(entry_name);
  KILN_CHECK(entry && !entry->isDeclaration(), "aot glue: no entry function " + entry_name);
  Glue glue(em, prepared);
  glue.abi_reference();
  llvm::GlobalVariable* model = glue.descriptor(aot, entry, target, em.arena_bytes, cpu_features);
  glue.functions(aot.name, model);
  for (llvm::GlobalValue& v : m.global_values()) {
    if (v.isDeclaration() || v.hasLocalLinkage() || v.getName().starts_with("llvm.") || glue.is_exported(v)) continue;
    v.setLinkage(llvm::GlobalValue::InternalLinkage);
  }
}

}  // namespace kiln::cpu::detail
