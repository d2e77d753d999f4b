// Registration entry points of the _core module, one per area.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

namespace lmr::python {

// A C++ byte string as Python bytes.
inline nanobind::bytes asBytes(const std::string& s) { return nanobind::bytes(s.data(), s.size()); }

void registerErrors(nanobind::module_& m);
void registerConsensus(nanobind::module_& m);
void registerSignature(nanobind::module_& m);
void registerCampaign(nanobind::module_& m);
void registerSession(nanobind::module_& m);
void registerInject(nanobind::module_& m);
void registerScout(nanobind::module_& m);
void registerOob(nanobind::module_& m);
void registerHealth(nanobind::module_& m);
void registerFiles(nanobind::module_& m);
void registerOobReport(nanobind::module_& m);
void registerCkpt(nanobind::module_& m);
void registerExclusion(nanobind::module_& m);
void registerMemoryTier(nanobind::module_& m);
void registerIntegrity(nanobind::module_& m);
void registerMesh(nanobind::module_& m);
void registerMoe(nanobind::module_& m);

}  // namespace lmr::python
