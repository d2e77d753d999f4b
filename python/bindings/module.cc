#include "bindings.h"

NB_MODULE(_core, m) {
  m.doc() = "LM Resiliency engine (liblmr) bindings";
  m.attr("__version__") = LMR_VERSION;
  // The GPU architectures the signature kernels were built for ("80 90"); empty without them.
  m.attr("cuda_architectures") = LMR_CUDA_ARCHS;
  // Objects referenced from long-lived Python state (a session wrapping an optimizer) may
  // still exist when the interpreter exits; that is not a leak worth a warning.
  nanobind::set_leak_warnings(false);
  lmr::python::registerErrors(m);
  lmr::python::registerConsensus(m);
  lmr::python::registerSignature(m);
  lmr::python::registerCampaign(m);
  lmr::python::registerSession(m);
  lmr::python::registerInject(m);
  lmr::python::registerScout(m);
  lmr::python::registerIntegrity(m);
  lmr::python::registerMesh(m);
  lmr::python::registerOob(m);
  lmr::python::registerOobReport(m);
  lmr::python::registerHealth(m);
  lmr::python::registerFiles(m);
  lmr::python::registerCkpt(m);
  lmr::python::registerExclusion(m);
  lmr::python::registerMemoryTier(m);
  lmr::python::registerMoe(m);
}
