// Whether two incidents' active windows can meet, decided arithmetically so that ranges of
// a billion candidates cost no more than ranges of ten.
#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "lmr/campaign/schedule.h"
#include "lmr/common/error.h"

namespace lmr::campaign {
namespace {

using I128 = __int128;

// Longer than any schedule: stands for an unbounded window.
constexpr std::int64_t kForever = std::int64_t{1} << 62;

// Smallest x >= 0 with L <= (A * x) mod M <= R, for 0 <= A < M and 0 <= L <= R < M;
// -1 when there is none. Euclid-like: each level swaps (A, M) for (M mod A, A).
I128 firstMultipleInRange(I128 A, I128 M, I128 L, I128 R) {
  if (L == 0) return 0;
  if (A == 0) return -1;
  const I128 x = (L + A - 1) / A;  // the first multiple of A at or above L, before any wrap
  if (A * x <= R) return x;
  // [L, R] holds no multiple of A: look for the wrap count y >= 1 whose residue lands there.
  const I128 y = firstMultipleInRange(M % A, A, (A - R % A) % A, (A - L % A) % A);
  if (y < 0) return -1;
  return (L + M * y + A - 1) / A;
}

I128 mod(I128 v, I128 m) {
  const I128 r = v % m;
  return r < 0 ? r + m : r;
}

// Smallest x in [0, limit] with (A * x + B) mod M <= W - 1, or -1.
I128 firstWithResidueBelow(I128 A, I128 B, I128 M, I128 W, I128 limit) {
  A = mod(A, M);
  B = mod(B, M);
  // (A x + B) mod M in [0, W-1]  <=>  (A x) mod M in the cyclic interval [-B, W-1-B].
  const I128 lo = mod(-B, M);
  const I128 hi = mod(W - 1 - B, M);
  I128 best = -1;
  auto consider = [&](I128 l, I128 r) {
    const I128 x = firstMultipleInRange(A, M, l, r);
    if (x >= 0 && (best < 0 || x < best)) best = x;
  };
  if (lo <= hi) {
    consider(lo, hi);
  } else {
    consider(lo, M - 1);
    consider(0, hi);
  }
  return best <= limit ? best : -1;
}

struct Progression {
  I128 start, step, count;  // start + i * step, 0 <= i < count
  I128 last() const { return start + (count - 1) * step; }
  // Index of the first element >= v (count when none).
  I128 firstIndexAtOrAbove(I128 v) const {
    if (v <= start) return 0;
    const I128 i = (v - start + step - 1) / step;
    return std::min(i, count);
  }
  // Index of the last element <= v (-1 when none).
  I128 lastIndexAtOrBelow(I128 v) const {
    if (v < start) return -1;
    return std::min((v - start) / step, count - 1);
  }
};

Progression asProgression(const Trigger& t) {
  return Progression{t.start, t.every, static_cast<I128>(t.candidateCount())};
}

// Index of the first element of P in [from, to], or -1.
I128 firstIndexIn(const Progression& P, I128 from, I128 to) {
  if (from > to) return -1;
  const I128 i = P.firstIndexAtOrAbove(from);
  return (i < P.count && P.start + i * P.step <= to) ? i : -1;
}

// Some a of A and b of B with lo <= b - a <= hi, for progressions. For each a, let b* be
// the first element of B at or above a + lo; they overlap iff b* exists and b* <= a + hi.
std::optional<std::pair<std::int64_t, std::int64_t>> progressionOverlap(const Progression& A, const Progression& B,
                                                                        I128 lo, I128 hi) {
  auto witness = [&](I128 i) {
    const I128 a = A.start + i * A.step;
    const I128 j = B.firstIndexAtOrAbove(a + lo);
    return std::make_pair(static_cast<std::int64_t>(a), static_cast<std::int64_t>(B.start + j * B.step));
  };
  // a + lo <= B.start <= a + hi: b* is B's first element.
  if (I128 i = firstIndexIn(A, B.start - hi, B.start - lo); i >= 0) return witness(i);
  // B.start < a + lo <= B.last and B.last <= a + hi: b* <= B.last <= a + hi.
  if (I128 i = firstIndexIn(A, std::max(B.last() - hi, B.start - lo + 1), B.last() - lo); i >= 0) return witness(i);
  // B.start < a + lo and a + hi < B.last: the largest element of B at or below a + hi is
  // a + hi - ((a + hi - B.start) mod B.step); it is >= a + lo iff that residue <= hi - lo.
  const I128 iL = A.firstIndexAtOrAbove(B.start - lo + 1);
  const I128 iR = A.lastIndexAtOrBelow(B.last() - hi - 1);
  if (iL > iR || iL >= A.count) return std::nullopt;
  const I128 W = hi - lo + 1;
  I128 x = 0;
  if (W < B.step) {
    x = firstWithResidueBelow(A.step, A.start + iL * A.step + hi - B.start, B.step, W, iR - iL);
    if (x < 0) return std::nullopt;
  }
  return witness(iL + x);
}

}  // namespace

std::optional<std::pair<std::int64_t, std::int64_t>> firstWindowOverlap(const Trigger& a,
                                                                        std::optional<std::int64_t> window_a,
                                                                        const Trigger& b,
                                                                        std::optional<std::int64_t> window_b) {
  const I128 wa = window_a.value_or(kForever);
  const I128 wb = window_b.value_or(kForever);
  // Occurrences at x (of a) and y (of b) overlap iff -(wb - 1) <= y - x <= wa - 1.
  const I128 lo = -(wb - 1);
  const I128 hi = wa - 1;
  if (a.is_range && b.is_range) return progressionOverlap(asProgression(a), asProgression(b), lo, hi);
  if (!a.is_range) {
    for (std::int64_t x : a.at) {
      const I128 from = x + lo;
      auto y = b.firstAtOrAfter(static_cast<std::int64_t>(std::max<I128>(from, 1)));
      if (y && static_cast<I128>(*y) <= x + hi) return std::make_pair(x, *y);
    }
    return std::nullopt;
  }
  auto swapped = firstWindowOverlap(b, window_b, a, window_a);
  if (swapped) return std::make_pair(swapped->second, swapped->first);
  return std::nullopt;
}

void checkTargetOverlaps(const Campaign& campaign,
                         const std::function<std::string(std::size_t incident, std::size_t fault)>& target_key) {
  const auto& incidents = campaign.incidents();
  std::map<std::string, std::vector<std::size_t>> by_key;  // key -> incidents acting on it
  for (std::size_t i = 0; i < incidents.size(); ++i) {
    std::map<std::string, std::size_t> seen;
    for (std::size_t f = 0; f < incidents[i].faults.size(); ++f) {
      const std::string key = target_key(i, f);
      if (key.empty()) continue;
      if (auto [it, inserted] = seen.emplace(key, f); !inserted) {
        throw InvalidArgument("incidents[" + std::to_string(i) + "].faults[" + std::to_string(f) +
                              "]: resolves to the same target as faults[" + std::to_string(it->second) + "] (" + key +
                              "); correlated actions need distinct targets");
      }
      if (incidents[i].trigger.probability > 0.0) by_key[key].push_back(i);
    }
  }
  for (const auto& [key, members] : by_key) {
    for (std::size_t x = 0; x < members.size(); ++x) {
      for (std::size_t y = x + 1; y < members.size(); ++y) {
        const Incident& a = incidents[members[x]];
        const Incident& b = incidents[members[y]];
        if (auto hit = firstWindowOverlap(a.trigger, a.lifetime.windowIterations(), b.trigger,
                                          b.lifetime.windowIterations())) {
          throw InvalidArgument("incidents[" + std::to_string(members[y]) + "] (\"" + b.incident_id + "\" at " +
                                std::to_string(hit->second) + ") can be active together with incidents[" +
                                std::to_string(members[x]) + "] (\"" + a.incident_id + "\" at " +
                                std::to_string(hit->first) + ") on the same target (" + key + ")");
        }
      }
    }
  }
}

}  // namespace lmr::campaign
