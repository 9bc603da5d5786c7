// Random bits from the kernel (random_fill.hpp).
#include "transport/common/random_fill.hpp"

#include <sys/random.h>

#include <cerrno>

namespace kvstream::transport {

bool random_fill(void* out, size_t n) {
  ssize_t got;
  do got = ::getrandom(out, n, 0);
  while (got < 0 && errno == EINTR);
  return got == ssize_t(n);
}

}  // namespace kvstream::transport
