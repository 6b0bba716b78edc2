// Transparent huge pages for the engine's large, long-lived buffers (weights, KV pools):
// streaming them through 4 KiB pages costs a TLB miss and a stop of the hardware
// prefetchers every 4 KiB; 2 MiB pages let a decode step read its weights as one stream.
#pragma once

#include <cstdint>

namespace sonarspec {

// Asks the kernel to back the 2 MiB-aligned interior of [ptr, ptr + bytes) with huge pages
// (madvise MADV_HUGEPAGE; pages touched after the call are then faulted in 2 MiB at a time).
// Returns whether the advice was taken: false off Linux, for a range holding no whole huge
// page, where the kernel refuses it (transparent huge pages "never"), or with the
// environment variable SONARSPEC_NO_HUGE_PAGES set non-zero (for comparisons).
bool advise_huge_pages(void* ptr, int64_t bytes);

}  // namespace sonarspec
