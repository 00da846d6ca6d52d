// Kernel registry keyed by (op, device, dtype).
//
// Each op family has one kernel signature; the registry stores type-erased function pointers
// with the signature's type id, so a lookup with the wrong signature is an internal error
// rather than undefined behaviour. Built-in kernels register once, on first lookup.
#pragma once

#include <string>
#include <typeinfo>

#include "tboost/core/context.h"
#include "tboost/core/dtype.h"

namespace tboost::ops_internal {

using ErasedFn = void (*)();

void register_kernel_erased(const std::string& op, Device device, DType dtype, ErasedFn fn,
                            const std::type_info& signature, const std::string& impl);
// Returns null when absent; throws kInternal when present with another signature.
ErasedFn find_kernel_erased(const std::string& op, Device device, DType dtype,
                            const std::type_info& signature, std::string* impl);

template <class Fn>
void register_kernel(const std::string& op, Device device, DType dtype, Fn* fn,
                     const std::string& impl) {
  register_kernel_erased(op, device, dtype, reinterpret_cast<ErasedFn>(fn), typeid(Fn), impl);
}

// Throws kUnsupported naming (op, device, dtype) when no kernel is registered.
template <class Fn>
Fn* get_kernel(const std::string& op, Device device, DType dtype, std::string* impl = nullptr) {
  return reinterpret_cast<Fn*>(find_kernel_erased(op, device, dtype, typeid(Fn), impl));
}

}  // namespace tboost::ops_internal
