// lmr::Error subclasses -> Python exceptions. Each class derives from LmrError and from the
// built-in exception a Python caller would expect.
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "lmr/common/error.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

PyObject* g_base = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_io = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_peer = nullptr;
PyObject* g_unsupported = nullptr;

PyObject* makeException(nb::module_& m, const char* name, PyObject* builtin, const char* doc) {
  PyObject* bases = builtin == nullptr ? nullptr : PyTuple_Pack(2, g_base, builtin);
  const std::string qualified = std::string("lm_resiliency._core.") + name;
  PyObject* type =
      PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases != nullptr ? bases : PyExc_Exception, nullptr);
  Py_XDECREF(bases);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

}  // namespace

void registerErrors(nb::module_& m) {
  g_base = makeException(m, "LmrError", nullptr, "Base class of every error raised by the LM Resiliency engine.");
  g_invalid = makeException(m, "InvalidArgumentError", PyExc_ValueError, "Malformed input (names what is wrong).");
  g_io = makeException(m, "LmrIOError", PyExc_OSError, "A file, shared-memory or device transfer failed.");
  g_timeout = makeException(m, "LmrTimeoutError", PyExc_TimeoutError, "A bounded wait expired.");
  g_peer = makeException(m, "PeerFailureError", PyExc_RuntimeError, "A peer rank or daemon failed.");
  g_unsupported =
      makeException(m, "UnsupportedError", PyExc_RuntimeError, "Valid request this build or machine cannot serve.");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(g_invalid, e.what());
    } catch (const IoError& e) {
      PyErr_SetString(g_io, e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(g_timeout, e.what());
    } catch (const PeerFailure& e) {
      PyErr_SetString(g_peer, e.what());
    } catch (const Unsupported& e) {
      PyErr_SetString(g_unsupported, e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_base, e.what());
    }
  });

  // Raises the error of the named kind; lets the tests check every mapping.
  m.def(
      "_raise_error",
      [](const std::string& kind, const std::string& message) {
        for (ErrorKind k : {ErrorKind::kInvalidArgument, ErrorKind::kIo, ErrorKind::kTimeout, ErrorKind::kPeerFailure,
                            ErrorKind::kUnsupported}) {
          if (errorKindName(k) == kind) throwError(k, message);
        }
        throw InvalidArgument("unknown error kind '" + kind + "'");
      },
      nb::arg("kind"), nb::arg("message"));
}

}  // namespace lmr::python
