// Activation: elementwise GELU (erf or tanh form), SiLU, ReLU, and the gated forms
// SwiGLU / GeGLU, where gate and up arrive in one input (..., 2F) and y (..., F) =
// act(gate) * up. gate_first: gate is the first half [gate | up] (the layout of a fused
// gate-up Linear); otherwise [up | gate]. Dtypes f32, bf16, f16; math in f32.
#pragma once

namespace tboost::ops {

enum class ActivationType { kRelu, kGeluErf, kGeluTanh, kSilu, kSwiGlu, kGeGluErf, kGeGluTanh };
const char* activation_type_name(ActivationType t);
constexpr bool is_gated(ActivationType t) {
  return t == ActivationType::kSwiGlu || t == ActivationType::kGeGluErf ||
         t == ActivationType::kGeGluTanh;
}

struct ActivationParam {
  ActivationType type = ActivationType::kSilu;
  bool gate_first = true;
  bool operator==(const ActivationParam&) const = default;
};

}  // namespace tboost::ops
