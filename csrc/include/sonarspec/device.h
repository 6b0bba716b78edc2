// Run-time questions about the CUDA device; only defined in CUDA builds.
#pragma once

namespace sonarspec {

bool cuda_device_available();
const char* cuda_error_string(int code);

}  // namespace sonarspec
