// Shared by the pybind11 translation units of module sonarspec_ext._C.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "sonarspec/small_gemm.h"   // WeightFormat

namespace sonarspec {
// A WeightFormat from its Python code (ops.quantized.FORMAT_CODES); invalid_argument otherwise.
inline WeightFormat weight_format_of(int code) {
  if (code < 0 || code > static_cast<int>(WeightFormat::kQ5_1)) {
    throw std::invalid_argument("invalid weight format code " + std::to_string(code));
  }
  return static_cast<WeightFormat>(code);
}
// Planner, PlannerConfig, PlanHandle and build_metadata (planner_bindings.cpp).
void bind_planner(pybind11::module_& m);
// DecoderStack (model_bindings.cpp).
void bind_decoder_stack(pybind11::module_& m);
}  // namespace sonarspec
