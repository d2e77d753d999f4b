#include "lmr/signature/signature.h"

#include <cstring>

#include "lanes.h"
#include "lmr/common/error.h"
#include "lmr/common/hex.h"

namespace lmr::signature {
namespace {

using detail::Quad;

Quad toQuad(const Digest& d) {
  return Quad{static_cast<std::uint32_t>(d.lo), static_cast<std::uint32_t>(d.lo >> 32),
              static_cast<std::uint32_t>(d.hi), static_cast<std::uint32_t>(d.hi >> 32)};
}

Digest toDigest(const Quad& q) {
  return Digest{q.x0 | (std::uint64_t{q.x1} << 32), q.x2 | (std::uint64_t{q.x3} << 32)};
}

// Bijection of the sums for every byte count.
Digest finalizeContent(Quad sums, std::uint64_t nbytes) {
  sums.x0 ^= static_cast<std::uint32_t>(nbytes);
  sums.x1 ^= static_cast<std::uint32_t>(nbytes >> 32);
  sums = detail::mixBlock(sums, detail::kFinalContentA);
  return toDigest(detail::mixBlock(sums, detail::kFinalContentB));
}

void appendU64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

std::string Digest::bytes() const {
  std::string out;
  appendU64(out, lo);
  appendU64(out, hi);
  return out;
}

std::string Digest::hex() const { return toHex(bytes()); }

Digest Digest::fromBytes(std::string_view sixteen) {
  if (sixteen.size() != 16) {
    throw InvalidArgument("a digest is 16 bytes, got " + std::to_string(sixteen.size()));
  }
  Digest d;
  for (int i = 7; i >= 0; --i) d.lo = (d.lo << 8) | static_cast<unsigned char>(sixteen[i]);
  for (int i = 15; i >= 8; --i) d.hi = (d.hi << 8) | static_cast<unsigned char>(sixteen[i]);
  return d;
}

Digest contentCpu(const void* data, std::size_t nbytes) {
  if (data == nullptr && nbytes != 0) throw InvalidArgument("contentCpu: null data with non-zero size");
  const Quad sums =
      nbytes == 0 ? Quad{0, 0, 0, 0} : detail::laneSumsCpu(static_cast<const unsigned char*>(data), nbytes);
  return finalizeContent(sums, nbytes);
}

Digest contentCuda(const void* data, std::size_t nbytes, int device, void* stream) {
  if (data == nullptr && nbytes != 0) throw InvalidArgument("contentCuda: null data with non-zero size");
  const Quad sums = nbytes == 0 ? Quad{0, 0, 0, 0} : detail::laneSumsCuda(data, nbytes, device, stream);
  return finalizeContent(sums, nbytes);
}

bool cudaAvailable() noexcept { return detail::cudaDevicePresent(); }

Digest metaDigest(const TensorMeta& meta, std::size_t nbytes) {
  if (meta.dtype.empty()) throw InvalidArgument("tensor metadata has an empty dtype");
  if (!meta.strides.empty() && meta.strides.size() != meta.shape.size()) {
    throw InvalidArgument("tensor metadata has " + std::to_string(meta.shape.size()) + " dimensions but " +
                          std::to_string(meta.strides.size()) + " strides");
  }
  // Canonical encoding: every field is length-prefixed, so no two metadata collide here.
  std::string encoding = "lmr.meta.v1";
  appendU64(encoding, meta.dtype.size());
  encoding += meta.dtype;
  appendU64(encoding, meta.shape.size());
  for (std::int64_t d : meta.shape) appendU64(encoding, static_cast<std::uint64_t>(d));
  appendU64(encoding, meta.strides.size());
  for (std::int64_t s : meta.strides) appendU64(encoding, static_cast<std::uint64_t>(s));
  appendU64(encoding, nbytes);
  return contentCpu(encoding.data(), encoding.size());
}

Digest combine(const Digest& content, const Digest& meta) {
  Quad q = toQuad(Digest{content.lo ^ meta.lo, content.hi ^ meta.hi});
  q = detail::mixBlock(q, detail::kFinalCombineA);
  return toDigest(detail::mixBlock(q, detail::kFinalCombineB));
}

Signature sign(const TensorView& view, void* stream) {
  Signature s;
  s.content = view.device == DeviceType::kCuda ? contentCuda(view.data, view.nbytes, view.device_index, stream)
                                               : contentCpu(view.data, view.nbytes);
  s.meta = metaDigest(view.meta, view.nbytes);
  s.digest = combine(s.content, s.meta);
  return s;
}

namespace {

// InvalidArgument unless every view is on one device with data where it has bytes.
void checkOneDevice(const std::vector<TensorView>& views, const char* what) {
  if (views.empty()) return;
  const DeviceType device = views.front().device;
  const int index = views.front().device_index;
  for (const auto& v : views) {
    if (v.device != device || (device == DeviceType::kCuda && v.device_index != index))
      throw InvalidArgument(std::string(what) +
                            " needs every tensor on one device (all host memory, or one CUDA device)");
    if (v.data == nullptr && v.nbytes != 0) throw InvalidArgument(std::string(what) + ": null data with non-zero size");
  }
}

}  // namespace

std::vector<Signature> signMany(const std::vector<TensorView>& views, void* stream) {
  std::vector<Signature> out(views.size());
  if (views.empty()) return out;
  checkOneDevice(views, "signMany");
  const int index = views.front().device_index;
  if (views.front().device == DeviceType::kCuda) {
    std::vector<detail::Segment> segments;
    std::vector<std::size_t> where;  // index of each non-empty view
    for (std::size_t i = 0; i < views.size(); ++i) {
      if (views[i].nbytes == 0) continue;
      segments.push_back({views[i].data, views[i].nbytes});
      where.push_back(i);
    }
    std::vector<Quad> sums(views.size(), Quad{0, 0, 0, 0});
    if (!segments.empty()) {
      const auto got = detail::laneSumsManyCuda(segments, index, stream);
      for (std::size_t k = 0; k < where.size(); ++k) sums[where[k]] = got[k];
    }
    for (std::size_t i = 0; i < views.size(); ++i) out[i].content = finalizeContent(sums[i], views[i].nbytes);
  } else {
    for (std::size_t i = 0; i < views.size(); ++i) out[i].content = contentCpu(views[i].data, views[i].nbytes);
  }
  for (std::size_t i = 0; i < views.size(); ++i) {
    out[i].meta = metaDigest(views[i].meta, views[i].nbytes);
    out[i].digest = combine(out[i].content, out[i].meta);
  }
  return out;
}

constexpr std::size_t kNoSegment = static_cast<std::size_t>(-1);

TensorSet::TensorSet(std::vector<TensorView> views) : views_(std::move(views)) {
  checkOneDevice(views_, "TensorSet");
  metas_ = std::make_shared<std::vector<Signature>>(views_.size());
  for (std::size_t i = 0; i < views_.size(); ++i) (*metas_)[i].meta = metaDigest(views_[i].meta, views_[i].nbytes);
  nbytes_ = std::make_shared<std::vector<std::size_t>>();
  segment_of_ = std::make_shared<std::vector<std::size_t>>();
  for (const TensorView& v : views_) nbytes_->push_back(v.nbytes);
  if (!views_.empty() && views_.front().device == DeviceType::kCuda) {
    std::vector<detail::Segment> segments;
    for (const TensorView& v : views_) {
      segment_of_->push_back(v.nbytes == 0 ? kNoSegment : segments.size());
      if (v.nbytes != 0) segments.push_back({v.data, v.nbytes});
    }
    table_ = detail::uploadChunks(segments, views_.front().device_index);
  }
}

TensorSet::Pending TensorSet::launch(void* stream) const {
  Pending p;
  p.metas_ = metas_;
  if (table_ != nullptr) {
    p.launch_ = detail::launchChunks(table_, stream);
    p.segment_of_ = segment_of_;
    p.nbytes_ = nbytes_;
    return p;
  }
  auto signed_now = std::make_shared<std::vector<Signature>>(*metas_);
  for (std::size_t i = 0; i < views_.size(); ++i) {
    Signature& s = (*signed_now)[i];
    s.content = contentCpu(views_[i].data, views_[i].nbytes);
    s.digest = combine(s.content, s.meta);
  }
  p.host_ = std::move(signed_now);
  return p;
}

bool TensorSet::Pending::ready() const { return launch_ == nullptr || detail::launchReady(*launch_); }

std::vector<Signature> TensorSet::Pending::wait() const {
  if (host_ != nullptr) return *host_;
  std::vector<Signature> out = metas_ != nullptr ? *metas_ : std::vector<Signature>{};
  if (launch_ == nullptr) return out;
  const std::vector<Quad> sums = detail::launchWait(*launch_);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::size_t k = (*segment_of_)[i];
    out[i].content = finalizeContent(k == kNoSegment ? Quad{0, 0, 0, 0} : sums[k], (*nbytes_)[i]);
    out[i].digest = combine(out[i].content, out[i].meta);
  }
  return out;
}

}  // namespace lmr::signature
