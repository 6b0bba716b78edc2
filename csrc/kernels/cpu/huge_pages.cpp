#include "sonarspec/huge_pages.h"

#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sonarspec {

bool advise_huge_pages(void* ptr, int64_t bytes) {
  const char* off = std::getenv("SONARSPEC_NO_HUGE_PAGES");
  if (off != nullptr && off[0] != '\0' && std::strcmp(off, "0") != 0) return false;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(ptr) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(ptr) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (bytes <= 0 || end <= begin) return false;
  return madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) == 0;
#else
  (void)ptr, (void)bytes;
  return false;
#endif
}

}  // namespace sonarspec
