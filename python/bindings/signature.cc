#include <nanobind/ndarray.h>
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

// The bytes of a tensor, flattened to uint8 by the caller, on CPU or CUDA.
using ByteArray = nb::ndarray<nb::ro, std::uint8_t, nb::ndim<1>, nb::c_contig>;

TensorView viewOf(const ByteArray& bytes, const std::string& dtype, const std::vector<std::int64_t>& shape,
                  const std::vector<std::int64_t>& strides) {
  TensorView view;
  view.data = bytes.data();
  view.nbytes = bytes.size();
  view.meta = TensorMeta{dtype, shape, strides};
  const int device_type = bytes.device_type();
  if (device_type == nb::device::cuda::value) {
    view.device = DeviceType::kCuda;
    view.device_index = bytes.device_id();
  } else if (device_type != nb::device::cpu::value) {
    throw Unsupported("signatures support CPU and CUDA tensors; got DLPack device type " + std::to_string(device_type));
  }
  return view;
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
      "sign_bytes",
      [](ByteArray bytes, const std::string& dtype, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& strides, std::uintptr_t stream) {
        const TensorView view = viewOf(bytes, dtype, shape, strides);
        nb::gil_scoped_release release;
        return signature::sign(view, reinterpret_cast<void*>(stream));
      },
      nb::arg("bytes"), nb::arg("dtype"), nb::arg("shape"), nb::arg("strides"), nb::arg("stream") = 0,
      "Signature of a tensor whose bytes (in logical order) are given as a flat uint8 array. "
      "For CUDA arrays the kernel runs on `stream` (a cudaStream_t as int) and the call waits for it.");

  m.def(
      "sign_many",
      [](const std::vector<ByteArray>& arrays, const std::vector<std::string>& dtypes,
         const std::vector<std::vector<std::int64_t>>& shapes, const std::vector<std::vector<std::int64_t>>& strides,
         std::uintptr_t stream) {
        if (dtypes.size() != arrays.size() || shapes.size() != arrays.size() || strides.size() != arrays.size())
          throw InvalidArgument("sign_many needs one dtype, shape and strides per array");
        std::vector<TensorView> views;
        views.reserve(arrays.size());
        for (std::size_t i = 0; i < arrays.size(); ++i)
          views.push_back(viewOf(arrays[i], dtypes[i], shapes[i], strides[i]));
        nb::gil_scoped_release release;
        return signature::signMany(views, reinterpret_cast<void*>(stream));
      },
      nb::arg("arrays"), nb::arg("dtypes"), nb::arg("shapes"), nb::arg("strides"), nb::arg("stream") = 0,
      "Signatures of many tensors given as flat uint8 arrays, all on one device: one kernel launch and one "
      "read-back for CUDA arrays (lmr::signature::signMany).");
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
          [](signature::TensorSet* self, const std::vector<ByteArray>& arrays, const std::vector<std::string>& dtypes,
             const std::vector<std::vector<std::int64_t>>& shapes,
             const std::vector<std::vector<std::int64_t>>& strides) {
            if (dtypes.size() != arrays.size() || shapes.size() != arrays.size() || strides.size() != arrays.size())
              throw InvalidArgument("SignatureSet needs one dtype, shape and strides per array");
            std::vector<TensorView> views;
            views.reserve(arrays.size());
            for (std::size_t i = 0; i < arrays.size(); ++i)
              views.push_back(viewOf(arrays[i], dtypes[i], shapes[i], strides[i]));
            new (self) signature::TensorSet(std::move(views));
          },
          nb::arg("arrays"), nb::arg("dtypes"), nb::arg("shapes"), nb::arg("strides"),
          "A fixed list of flat uint8 arrays on one device, signed again and again "
          "(lmr::signature::TensorSet). The caller keeps the arrays alive and in place.")
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
