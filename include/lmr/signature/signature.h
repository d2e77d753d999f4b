// Tensor signatures: a 128-bit fingerprint of a tensor's bytes plus a digest of its dtype,
// shape and strides, combined into one 16-byte digest that peers compare with C3.
//
// Construction (identical on CPU and CUDA, see src/signature/mix.h): the bytes are cut into
// 16-byte blocks (the last one zero-padded). Block b is read as four little-endian 32-bit
// words and mapped through a bijection keyed by b; the four 32-bit lanes of all mapped
// blocks are summed modulo 2^32. Addition is order-independent, so any reduction order
// (threads, CUDA blocks) gives the same sums. Because the per-block map is a bijection for
// every key, changing any bytes inside one block always changes the sums; because it is
// keyed by position, moving bytes between blocks changes them too (with overwhelming
// probability). The sums and the byte count are finalised by further bijections.
//
// Not cryptographic: it detects corruption, it does not resist an adversary.
// All functions are thread-safe. contentCuda blocks until the 16-byte result is on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/common/tensor_view.h"

namespace lmr::signature {

struct Digest {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;

  std::string bytes() const;  // 16 bytes, little-endian lo then hi
  std::string hex() const;    // 32 lowercase hex digits of bytes()
  static Digest fromBytes(std::string_view sixteen);  // throws InvalidArgument unless 16 bytes
  bool operator==(const Digest&) const = default;
};

struct Signature {
  Digest content;  // the bytes (and their count)
  Digest meta;     // dtype, shape, strides, byte count
  Digest digest;   // content combined with meta: what peers compare
};

// Fingerprint of `nbytes` bytes of host memory.
Digest contentCpu(const void* data, std::size_t nbytes);

// Fingerprint of `nbytes` bytes of memory on CUDA device `device`. Work is launched on
// `stream` (a cudaStream_t; nullptr = legacy default stream) after whatever is already queued
// there; the call waits for that stream and copies back 16 bytes. Throws Unsupported when
// this build has no CUDA or no device is visible, IoError when a CUDA call fails.
Digest contentCuda(const void* data, std::size_t nbytes, int device, void* stream);

// True when this build has CUDA support and at least one device is visible.
bool cudaAvailable() noexcept;

Digest metaDigest(const TensorMeta& meta, std::size_t nbytes);

// A bijection of `content` for every fixed `meta`.
Digest combine(const Digest& content, const Digest& meta);

// Signature of the tensor described by `view` (bytes must be in logical order).
// `stream` is used only for CUDA views.
Signature sign(const TensorView& view, void* stream = nullptr);

// The signatures of many tensors, each equal to sign(view): host views one after another,
// CUDA views (all on one device) with one kernel launch over every tensor, one 16-byte
// read-back per tensor in one copy, and one wait for `stream`. InvalidArgument when the
// views mix host and device memory or CUDA devices.
std::vector<Signature> signMany(const std::vector<TensorView>& views, void* stream = nullptr);

namespace detail {
struct DeviceChunks;
struct DeviceLaunch;
}  // namespace detail

// A fixed list of tensors signed again and again (state integrity signs every parameter and
// optimizer-state tensor at each optimizer step). What does not depend on the bytes is done
// once: the metadata digests and, for CUDA, the chunk table, which stays on the device.
// launch() queues one kernel over every tensor and one asynchronous copy of the lane sums on
// `stream`, and returns at once; the Pending it returns reads the signatures when they are
// there. Host sets are signed inside launch(). The caller keeps every tensor's memory at the
// same address, alive, while the set is in use. Not thread-safe.
class TensorSet {
 public:
  // InvalidArgument as signMany (one device, no null data).
  explicit TensorSet(std::vector<TensorView> views);

  class Pending {
   public:
    bool ready() const;  // the signatures can be read without waiting
    // Waits for the launch (only for it), then the signatures, in the set's order.
    std::vector<Signature> wait() const;

   private:
    friend class TensorSet;
    std::shared_ptr<const std::vector<Signature>> metas_;  // meta digests; content unset
    std::shared_ptr<detail::DeviceLaunch> launch_;         // null for host sets
    std::shared_ptr<const std::vector<std::size_t>> segment_of_;  // view -> segment, npos when empty
    std::shared_ptr<const std::vector<std::size_t>> nbytes_;
    std::shared_ptr<std::vector<Signature>> host_;         // host sets: signed already
  };

  Pending launch(void* stream = nullptr) const;
  std::size_t size() const { return views_.size(); }
  bool onCuda() const { return table_ != nullptr; }

 private:
  std::vector<TensorView> views_;
  std::shared_ptr<std::vector<Signature>> metas_;
  std::shared_ptr<detail::DeviceChunks> table_;
  std::shared_ptr<std::vector<std::size_t>> segment_of_;  // view -> segment index, npos for empty views
  std::shared_ptr<std::vector<std::size_t>> nbytes_;
};

}  // namespace lmr::signature
