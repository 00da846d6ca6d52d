// The kernel registry and the built-in kernel registration.
#include "src/ops/registry.h"

#include <map>
#include <mutex>
#include <tuple>
#include <typeindex>

#include "src/kernels/cpu/kernels.h"
#include "tboost/core/error.h"

namespace tboost::ops_internal {
namespace {

struct Entry {
  ErasedFn fn;
  std::type_index signature;
  std::string impl;
};
using Key = std::tuple<std::string, Device, DType>;

std::map<Key, Entry>& table() {
  static std::map<Key, Entry> t;
  return t;
}
std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}

void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] { kernels::cpu::register_cpu_kernels(); });
}

}  // namespace

void register_kernel_erased(const std::string& op, Device device, DType dtype, ErasedFn fn,
                            const std::type_info& signature, const std::string& impl) {
  std::lock_guard<std::mutex> lock(table_mutex());
  table().insert_or_assign(Key{op, device, dtype}, Entry{fn, std::type_index(signature), impl});
}

ErasedFn find_kernel_erased(const std::string& op, Device device, DType dtype,
                            const std::type_info& signature, std::string* impl) {
  register_builtins();
  std::lock_guard<std::mutex> lock(table_mutex());
  auto it = table().find(Key{op, device, dtype});
  TBOOST_CHECK_CODE(it != table().end(), ErrorCode::kUnsupported, op, ": no kernel for device ",
                    device_name(device), " and dtype ", dtype_name(dtype));
  TBOOST_CHECK_CODE(it->second.signature == std::type_index(signature), ErrorCode::kInternal, op,
                    ": kernel registered with another signature");
  if (impl) *impl = it->second.impl;
  return it->second.fn;
}

}  // namespace tboost::ops_internal
