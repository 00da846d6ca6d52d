// Overload: a visitor from lambdas, for std::visit over Param variants.
#pragma once

namespace tboost {
template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;
}  // namespace tboost
