// One function per distinct top-level kernel (codegen/cpu/lowerer.h, LowerOptions::share_kernels).
//
// Each top-level kernel is outlined into kiln_kernel.N(ctx), ctx holding the pointers it
// works on (its buffers in the arena, the graph's inputs and state, its constants), so that
// its code depends on the kernel alone, not on where its buffers are. A transformer's
// layers are then the same functions over other buffers: comparing each new function with
// the earlier ones (LLVM's FunctionComparator, which MergeFunctions uses: the same
// instructions, types, constants and callees, in the same order) finds them, and the
// duplicate is deleted before LLVM optimizes or compiles anything, which is where the
// time goes. Task functions (parallel loops) are compared first, so that kernels calling
// equal tasks compare equal.
#include <unordered_map>

#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/StructuralHash.h>
#include <llvm/Transforms/Utils/FunctionComparator.h>

#include "codegen/cpu/lowerer.h"
#include "ir/error.h"

namespace kiln::cpu::detail {

struct Lowerer::SharedFunctions {
  llvm::GlobalNumberState numbers;
  // llvm::StructuralHash (opcodes and types) -> the functions kept with that hash, in order.
  std::unordered_map<uint64_t, std::vector<llvm::Function*>> by_hash;
  std::vector<llvm::Function*> kernels;  // the kernel functions kept, in order
  int64_t next = 0;
};

llvm::Function* Lowerer::same_function(llvm::Function* f) {
  if (!shared_) shared_ = std::make_shared<SharedFunctions>();
  std::vector<llvm::Function*>& bucket = shared_->by_hash[llvm::StructuralHash(*f)];
  if (options_.share_kernels)
    for (llvm::Function* g : bucket)
      if (g->getFunctionType() == f->getFunctionType() &&
          llvm::FunctionComparator(g, f, &shared_->numbers).compare() == 0)
        return g;
  bucket.push_back(f);
  return nullptr;
}

void Lowerer::kernel_function(const std::function<void()>& body) {
  if (!shared_) shared_ = std::make_shared<SharedFunctions>();
  // Functions are appended to the module: the kernel's, then its tasks'.
  llvm::Function* last = M_->empty() ? nullptr : &M_->getFunctionList().back();
  kernel_caller_ = B_.GetInsertBlock();
  auto [fn, ctx] =
      outline("kiln_kernel." + std::to_string(shared_->next++), {}, [&](llvm::Function*) { body(); });
  kernel_caller_ = nullptr;
  std::vector<llvm::Function*> tasks;
  for (auto it = last ? std::next(last->getIterator()) : M_->begin(); it != M_->end(); ++it)
    if (&*it != fn && !it->isDeclaration()) tasks.push_back(&*it);
  for (llvm::Function* t : tasks)
    if (llvm::Function* same = same_function(t)) {
      t->replaceAllUsesWith(same);
      t->eraseFromParent();
    }
  llvm::CallInst* call = B_.CreateCall(fn, {ctx});
  ++info_.kernel_calls;
  if (llvm::Function* same = same_function(fn)) {
    call->setCalledFunction(same);
    fn->eraseFromParent();
  } else {
    shared_->kernels.push_back(fn);
  }
}

void Lowerer::finish_kernel_functions(bool large) {
  if (!shared_) return;
  info_.kernel_functions = static_cast<int64_t>(shared_->kernels.size());
  for (llvm::Function* f : shared_->kernels)
    if (large || f->getNumUses() > 1) f->addFnAttr(llvm::Attribute::NoInline);
}

}  // namespace kiln::cpu::detail
