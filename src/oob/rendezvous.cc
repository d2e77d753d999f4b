#include "lmr/oob/rendezvous.h"

#include <string>

#include "lmr/common/sha256.h"

namespace lmr::oob {
namespace {

// (h + offset) mod span without overflow, non-negative for any offset (as Python's %).
std::int64_t wrap(std::uint64_t h, std::int64_t offset) {
  const auto span = static_cast<std::uint64_t>(kDerivedPortSpan);
  std::int64_t o = offset % kDerivedPortSpan;
  if (o < 0) o += kDerivedPortSpan;
  return static_cast<std::int64_t>((h % span + static_cast<std::uint64_t>(o)) % span);
}

}  // namespace

std::int64_t derivedPort(std::string_view run_id, std::int64_t generation, std::int64_t master_port) {
  const std::string text = "lmr-oob|" + std::string(run_id) + "|" + std::to_string(master_port);
  const auto digest = Sha256().update(text).finish();
  std::uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h = (h << 8) | digest[static_cast<std::size_t>(i)];
  std::int64_t port = kDerivedPortBase + wrap(h, generation);
  if (port == master_port) port = kDerivedPortBase + wrap(h, generation % kDerivedPortSpan + 1);
  return port;
}

}  // namespace lmr::oob
