// Expert-parallel AllToAll replay: the traffic matrices a check sends through the job's own
// expert-parallel group, and the routing verdict from what every receiver verified.
//
// A replayed payload is a deterministic function of (seed, matrix, sender, receiver), so each
// receiver can check every segment it got against what it should have got (deterministic
// routing verification: corrupted, misrouted or misplaced tokens all fail). A receiver's
// vote says, per matrix and sender, "no segment", "intact" or "corrupted". The sender of a
// segment and its receiver are then judged by strict majority: a rank is blamed when more
// than half of the segments it sent (or, as a receiver, got) arrived corrupted. A corrupted
// segment neither end explains (one bad link, or two ranks on a pair) is Inconclusive.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lmr/consensus/consensus.h"

namespace lmr::moe {

// rows[i][j]: tokens expert-parallel rank i sends to rank j.
using Matrix = std::vector<std::vector<std::int64_t>>;

// InvalidArgument naming the offending entry unless `m` is `ranks` x `ranks` with
// non-negative counts, at least one of them positive.
void validateMatrix(const Matrix& m, std::int64_t ranks, const std::string& what = "matrix");

// The default bounded policy: one balanced matrix (every pair `rows` tokens), then cyclic
// permutations (rank i sends `rows` tokens to rank (i + k) mod ranks) for the shifts k of
// defaultShifts, in that order. Every sender reaches every receiver at least once, and
// itself and `max_shifts` - 1 others again, so a rank that corrupts what it sends (or
// receives) is blamed by a strict majority of its segments. Votes and the verdict's work grow
// with ranks x (1 + shifts) per receiver: linear in the group for a fixed `max_shifts`
// (all shifts, as before, would make the group's votes cubic).
inline constexpr std::int64_t kDefaultShifts = 8;
std::vector<Matrix> defaultMatrices(std::int64_t ranks, std::int64_t rows, std::int64_t max_shifts = kDefaultShifts);
// Every shift 0 .. ranks - 1 when ranks <= max_shifts; else max_shifts of them spread evenly
// (k = j x ranks / max_shifts: the local copy, then farther and farther peers).
std::vector<std::int64_t> defaultShifts(std::int64_t ranks, std::int64_t max_shifts = kDefaultShifts);

// One receiver's vote characters.
inline constexpr char kNoSegment = '-';
inline constexpr char kIntact = '0';
inline constexpr char kCorrupted = '1';

// The vote receiver `me` casts: for each matrix, for each sender i, kNoSegment where
// matrices[m][i][me] is 0, else kCorrupted where bad[m][i], else kIntact.
std::string routingVote(const std::vector<Matrix>& matrices, std::int64_t me,
                        const std::vector<std::vector<bool>>& bad);

struct RoutingVerdict {
  consensus::Status status = consensus::Status::kAgree;
  std::vector<bool> bitmap;  // by expert-parallel position: blamed as sender or receiver
  std::string reason;        // why it is Inconclusive (empty otherwise)
};

// `votes[j]`: receiver j's vote (routingVote), by expert-parallel position; an empty vote is
// a receiver that did not verify (Inconclusive). Attributed when some rank is blamed;
// Inconclusive (with `reason`) when a corrupted segment is explained by neither end or the
// votes do not line up; both may hold, and then the status is Attributed and `reason` says
// what is left unexplained.
RoutingVerdict decideRouting(const std::vector<std::string>& votes);

}  // namespace lmr::moe
