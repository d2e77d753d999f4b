#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "lmr/common/error.h"
#include "lmr/signature/signature.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using signature::Signature;

nb::bytes toBytes(const signature::Digest& d) {
  const std::string b = d.bytes();
  return nb::bytes(b.data(), b.size());
}

// A tensor's bytes as the Python side passes them: the address of its first byte (logical
// order), the byte count and the device (-1: host memory, else a CUDA ordinal). Passing the
// address instead of a DLPack capsule saves the capsule's construction on every call; the
// caller holds the tensor for the call (SignatureSet: for the set's life).
TensorView rawView(std::uintptr_t address, std::uint64_t nbytes, int device, const std::string& dtype,
                   const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides) {
  TensorView view;
  view.data = reinterpret_cast<const void*>(address);
  view.nbytes = static_cast<std::size_t>(nbytes);
  view.meta = TensorMeta{dtype, shape, strides};
  if (device < -1) throw InvalidArgument("device must be -1 (host) or a CUDA ordinal, got " + std::to_string(device));
  if (device >= 0) {
    view.device = DeviceType::kCuda;
    view.device_index = device;
  }
  return view;
}

using Shapes = std::vector<std::vector<std::int64_t>>;

std::vector<TensorView> rawViews(const std::vector<std::uintptr_t>& addresses, const std::vector<std::uint64_t>& nbytes,
                                 int device, const std::vector<std::string>& dtypes, const Shapes& shapes,
                                 const Shapes& strides, const char* what) {
  const std::size_t n = addresses.size();
  if (nbytes.size() != n || dtypes.size() != n || shapes.size() != n || strides.size() != n)
    throw InvalidArgument(std::string(what) + " needs one byte count, dtype, shape and strides per address");
  std::vector<TensorView> views;
  views.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    views.push_back(rawView(addresses[i], nbytes[i], device, dtypes[i], shapes[i], strides[i]));
  return views;
}

}  // namespace

void registerSignature(nb::module_& m) {
  nb::class_<Signature>(m, "Signature")
      .def_prop_ro(
          "content", [](const Signature& s) { return toBytes(s.content); }, "16-byte fingerprint of the bytes.")
      .def_prop_ro(
          "meta", [](const Signature& s) { return toBytes(s.meta); }, "16-byte digest of dtype, shape, strides.")
      .def_prop_ro(
          "digest", [](const Signature& s) { return toBytes(s.digest); }, "16-byte value peers compare.")
      .def("hex", [](const Signature& s) { return s.digest.hex(); })
      .def("__eq__",
           [](const Signature& a, const Signature& b) { return a.digest == b.digest && a.content == b.content; })
      .def("__hash__", [](const Signature& s) { return static_cast<std::int64_t>(s.digest.lo >> 1); })
      .def("__repr__", [](const Signature& s) { return "Signature(" + s.digest.hex() + ")"; });

  m.def(
      "sign_raw",
      [](std::uintptr_t address, std::uint64_t nbytes, int device, const std::string& dtype,
         const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides, std::uintptr_t stream) {
        const TensorView view = rawView(address, nbytes, device, dtype, shape, strides);
        nb::gil_scoped_release release;
        return signature::sign(view, reinterpret_cast<void*>(stream));
      },
      nb::arg("address"), nb::arg("nbytes"), nb::arg("device"), nb::arg("dtype"), nb::arg("shape"), nb::arg("strides"),
      nb::arg("stream") = 0,
      "Signature of a tensor's bytes (logical order) at `address` on `device` (-1: host, else a CUDA "
      "ordinal). For CUDA the kernel runs on `stream` (a cudaStream_t as int) and the call waits for it.");

  m.def(
      "sign_many",
      [](const std::vector<std::uintptr_t>& addresses, const std::vector<std::uint64_t>& nbytes, int device,
         const std::vector<std::string>& dtypes, const Shapes& shapes, const Shapes& strides, std::uintptr_t stream) {
        const std::vector<TensorView> views = rawViews(addresses, nbytes, device, dtypes, shapes, strides, "sign_many");
        nb::gil_scoped_release release;
        return signature::signMany(views, reinterpret_cast<void*>(stream));
      },
      nb::arg("addresses"), nb::arg("nbytes"), nb::arg("device"), nb::arg("dtypes"), nb::arg("shapes"),
      nb::arg("strides"), nb::arg("stream") = 0,
      "Signatures of many tensors' bytes on one device: one kernel launch and one read-back for CUDA "
      "(lmr::signature::signMany).");
  using Pending = signature::TensorSet::Pending;
  nb::class_<Pending>(m, "PendingSignatures")
      .def("ready", &Pending::ready, "True when the signatures can be read without waiting.")
      .def(
          "digests",
          [](const Pending& p) {
            std::vector<Signature> got;
            {
              nb::gil_scoped_release release;
              got = p.wait();
            }
            std::string out;
            out.reserve(16 * got.size());
            for (const Signature& s : got) out += s.digest.bytes();
            return nb::bytes(out.data(), out.size());
          },
          "Waits for this launch only, then every tensor's 16-byte digest, concatenated in the set's order.")
      .def(
          "signatures",
          [](const Pending& p) {
            nb::gil_scoped_release release;
            return p.wait();
          },
          "Waits for this launch only, then every tensor's Signature.");
  nb::class_<signature::TensorSet>(m, "SignatureSet")
      .def(
          "__init__",
          [](signature::TensorSet* self, const std::vector<std::uintptr_t>& addresses,
             const std::vector<std::uint64_t>& nbytes, int device, const std::vector<std::string>& dtypes,
             const Shapes& shapes, const Shapes& strides) {
            new (self)
                signature::TensorSet(rawViews(addresses, nbytes, device, dtypes, shapes, strides, "SignatureSet"));
          },
          nb::arg("addresses"), nb::arg("nbytes"), nb::arg("device"), nb::arg("dtypes"), nb::arg("shapes"),
          nb::arg("strides"),
          "A fixed list of tensors' bytes on one device, signed again and again (lmr::signature::TensorSet). "
          "The caller keeps the tensors alive and in place.")
      .def(
          "launch",
          [](const signature::TensorSet& set, std::uintptr_t stream) {
            nb::gil_scoped_release release;
            return set.launch(reinterpret_cast<void*>(stream));
          },
          nb::arg("stream") = 0,
          "Queues the signing of every array on `stream` (CUDA: returns at once; host: signs now).")
      .def_prop_ro("size", &signature::TensorSet::size)
      .def_prop_ro("on_cuda", &signature::TensorSet::onCuda);
  m.def("cuda_available", &signature::cudaAvailable, "True when _core has CUDA kernels and a device is visible.");
}

}  // namespace lmr::python
