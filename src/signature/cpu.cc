// CPU lane sums. Two 16-byte blocks travel together in one 256-bit vector (GCC/Clang vector
// extensions), so the 4-lane chain of mixBlock becomes an in-lane prefix sum. On x86-64 the
// hot loop is compiled twice (AVX2 and baseline) and picked at load time. The scalar
// mixBlock handles the odd block and the zero-padded tail, and is the reference the tests
// hold this loop to.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "lanes.h"

#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__))
#define LMR_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LMR_CPU_CLONES
#endif

namespace lmr::signature::detail {
namespace {

typedef std::uint32_t V8 __attribute__((vector_size(32)));
typedef std::int32_t M8 __attribute__((vector_size(32)));

// Lanes 0-7 pick from `a`, 8-15 from `b` (GCC and Clang spell it differently).
#if defined(__clang__)
#define LMR_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define LMR_SHUFFLE(a, b, ...) __builtin_shuffle(a, b, M8{__VA_ARGS__})
#endif

Quad loadQuad(const unsigned char* p) {
  Quad q;
  std::memcpy(&q, p, sizeof(q));
  return q;
}

// Sum of mixBlock over the block pairs (first, first+1), ... (first + 2*npairs - 1).
// Requires that the high 32 bits of the block index stay constant over the range.
LMR_CPU_CLONES Quad sumPairs(const unsigned char* p, std::uint64_t first, std::uint64_t npairs) {
  const std::uint32_t lo = static_cast<std::uint32_t>(first);
  const std::uint32_t hi = static_cast<std::uint32_t>(first >> 32);
  const V8 klo = {kKeyLo0, kKeyLo1, kKeyLo2, kKeyLo3, kKeyLo0, kKeyLo1, kKeyLo2, kKeyLo3};
  const V8 khi = {kKeyHi0, kKeyHi1, kKeyHi2, kKeyHi3, kKeyHi0, kKeyHi1, kKeyHi2, kKeyHi3};
  const V8 mul = {kMul0, kMul1, kMul2, kMul3, kMul0, kMul1, kMul2, kMul3};
  const V8 index = {lo, lo, lo, lo, lo + 1, lo + 1, lo + 1, lo + 1};
  const V8 zero = {};
  V8 key = index * klo + hi * khi;
  const V8 step = klo * 2u;
  V8 acc = zero;
  for (std::uint64_t i = 0; i < npairs; ++i) {
    V8 x;
    std::memcpy(&x, p + 32 * i, sizeof(x));
    x = (x ^ key) * mul;
    x ^= x >> 15;
    // x1 += x0; x2 += x1; x3 += x2; x0 += x3, within each 16-byte half: an inclusive
    // prefix sum, then the total added back to lane 0.
    x += LMR_SHUFFLE(x, zero, 8, 0, 1, 2, 8, 4, 5, 6);
    x += LMR_SHUFFLE(x, zero, 8, 8, 0, 1, 8, 8, 4, 5);
    x += LMR_SHUFFLE(x, zero, 3, 8, 8, 8, 7, 8, 8, 8);
    x ^= x >> 16;
    x *= kFmixA;
    x ^= x >> 13;
    x *= kFmixB;
    x ^= x >> 16;
    acc += x;
    key += step;
  }
  return Quad{acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]};
}

}  // namespace

Quad laneSumsCpu(const unsigned char* data, std::size_t nbytes) {
  Quad acc{0, 0, 0, 0};
  const std::uint64_t nblocks = nbytes / 16;
  const std::uint64_t paired = nblocks & ~std::uint64_t{1};
  // Split where the high half of the block index changes (every 2^32 blocks = 64 GiB).
  for (std::uint64_t start = 0; start < paired;) {
    const std::uint64_t chunk_end = std::min<std::uint64_t>(paired, (start | 0xFFFFFFFFull) + 1);
    addInto(acc, sumPairs(data + 16 * start, start, (chunk_end - start) / 2));
    start = chunk_end;
  }
  if (paired != nblocks) addInto(acc, mixBlock(loadQuad(data + 16 * paired), paired));
  if (const std::size_t rest = nbytes % 16; rest != 0) {
    unsigned char tail[16] = {};
    std::memcpy(tail, data + 16 * nblocks, rest);
    addInto(acc, mixBlock(loadQuad(tail), nblocks));
  }
  return acc;
}

}  // namespace lmr::signature::detail
