#include "bindings.h"

NB_MODULE(_core, m) {
  m.doc() = "LM Resiliency engine (liblmr) bindings";
  m.attr("__version__") = LMR_VERSION;
  lmr::python::registerErrors(m);
  lmr::python::registerConsensus(m);
  lmr::python::registerSignature(m);
  lmr::python::registerCampaign(m);
  lmr::python::registerInject(m);
}
