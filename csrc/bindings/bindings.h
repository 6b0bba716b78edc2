// Shared by the pybind11 translation units of module sonarspec_ext._C.
#pragma once

#include <pybind11/pybind11.h>

namespace sonarspec {
// Planner, PlannerConfig, PlanHandle and build_metadata (planner_bindings.cpp).
void bind_planner(pybind11::module_& m);
// DecoderStack (model_bindings.cpp).
void bind_decoder_stack(pybind11::module_& m);
}  // namespace sonarspec
