// Bindings of lmr::health. Readings cross as tuples, events as their JSON text; the Python
// package (lm_resiliency/health.py) turns them into dataclasses. A Python HealthSource is
// polled by the C++ monitor thread through PySource, which takes the GIL only for that call.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <thread>

#include "bindings.h"
#include "lmr/common/error.h"
#include "lmr/health/monitor.h"
#include "lmr/health/nvml.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using health::DeviceInfo;

nb::tuple deviceTuple(const DeviceInfo& d) { return nb::make_tuple(d.index, d.uuid, d.pci_bus_id, d.name); }

DeviceInfo deviceFrom(nb::handle t) {
  return DeviceInfo{nb::cast<int>(t[0]), nb::cast<std::string>(t[1]), nb::cast<std::string>(t[2]),
                    nb::cast<std::string>(t[3])};
}

nb::tuple pollTuple(const health::PollResult& result) {
  nb::list readings, unsupported;
  for (const auto& r : result.readings) readings.append(nb::make_tuple(deviceTuple(r.device), r.metric, r.value, r.detail));
  for (const auto& u : result.unsupported) unsupported.append(nb::make_tuple(deviceTuple(u.device), u.metric, u.reason));
  return nb::make_tuple(readings, unsupported);
}

// A Python exception as the lmr::Error a C++ caller stores: ValueError -> InvalidArgument,
// OSError -> IoError, TimeoutError -> TimeoutError, anything else -> PeerFailure.
[[noreturn]] void rethrowPython(nb::python_error& e) {
  ErrorKind kind = ErrorKind::kPeerFailure;
  if (e.matches(PyExc_TimeoutError)) kind = ErrorKind::kTimeout;
  else if (e.matches(PyExc_OSError)) kind = ErrorKind::kIo;
  else if (e.matches(PyExc_ValueError)) kind = ErrorKind::kInvalidArgument;
  std::string message = nb::cast<std::string>(nb::str(e.type().attr("__name__")));
  message += ": " + nb::cast<std::string>(nb::str(e.value()));
  throwError(kind, message);
}

// A HealthSource written in Python: its _poll_for_core() returns (readings, unsupported) as
// tuples (lm_resiliency.health.HealthSource provides it).
class PySource : public health::Source {
 public:
  explicit PySource(nb::object object) : object_(std::move(object)) {
    nb::gil_scoped_acquire gil;
    name_ = nb::cast<std::string>(object_.attr("name"));
  }
  ~PySource() override {
    nb::gil_scoped_acquire gil;
    object_.reset();
  }
  std::string name() const override { return name_; }
  health::PollResult poll() override {
    nb::gil_scoped_acquire gil;
    try {
      nb::tuple result = nb::cast<nb::tuple>(object_.attr("_poll_for_core")());
      health::PollResult out;
      for (nb::handle r : nb::cast<nb::list>(result[0]))
        out.readings.push_back({deviceFrom(r[0]), nb::cast<std::string>(r[1]), nb::cast<double>(r[2]), nb::cast<std::string>(r[3])});
      for (nb::handle u : nb::cast<nb::list>(result[1]))
        out.unsupported.push_back({deviceFrom(u[0]), nb::cast<std::string>(u[1]), nb::cast<std::string>(u[2])});
      return out;
    } catch (nb::python_error& e) {
      rethrowPython(e);
    } catch (const nb::cast_error& e) {
      throw InvalidArgument(name_ + ": _poll_for_core() returned something other than (readings, unsupported) tuples");
    }
  }

 private:
  nb::object object_;
  std::string name_;
};

// Owns the monitor; stops it with the GIL released (its thread may be waiting for the GIL).
// Destroyed on the monitor's own thread (a garbage collection that ran inside a callback or
// a Python source), it cannot join itself: another thread stops and destroys it.
struct PyMonitor {
  std::unique_ptr<health::Monitor> monitor;
  ~PyMonitor() {
    if (monitor && monitor->onMonitorThread()) {
      std::thread([m = std::move(monitor)]() mutable { m.reset(); }).detach();
      return;
    }
    nb::gil_scoped_release release;
    monitor.reset();
  }
};

health::MonitorOptions optionsFrom(nb::dict o) {
  health::MonitorOptions options;
  for (auto [key, value] : o) {
    const std::string k = nb::cast<std::string>(key);
    if (k == "interval_s") options.interval_s = nb::cast<double>(value);
    else if (k == "fatal_xids") {
      options.fatal_xids.clear();
      for (nb::handle x : value) options.fatal_xids.insert(nb::cast<std::int64_t>(x));
    } else if (k == "nvlink_error_threshold") options.nvlink_error_threshold = nb::cast<double>(value);
    else if (k == "nvlink_window_s") options.nvlink_window_s = nb::cast<double>(value);
    else if (k == "temperature_margin_c") options.temperature_margin_c = nb::cast<double>(value);
    else if (k == "temperature_warning_margin_c") options.temperature_warning_margin_c = nb::cast<double>(value);
    else if (k == "warning_interval_s") options.warning_interval_s = nb::cast<double>(value);
    else throw InvalidArgument(k + ": unknown HealthConfig field");
  }
  return options;
}

nb::list eventsJson(const std::vector<health::Event>& events) {
  nb::list out;
  for (const auto& e : events) out.append(health::toJson(e).dump());
  return out;
}

health::NvmlOptions nvmlOptions(const std::string& library_path, bool xid_events = true) {
  health::NvmlOptions o;
  o.library_path = library_path;
  o.xid_events = xid_events;
  return o;
}

}  // namespace

void registerHealth(nb::module_& m) {
  nb::class_<health::Source>(m, "NativeHealthSource")
      .def_prop_ro("name", &health::Source::name)
      .def("poll", [](health::Source& s) {
        health::PollResult result;
        {
          nb::gil_scoped_release release;
          result = s.poll();
        }
        return pollTuple(result);
      });

  nb::class_<health::NvmlSource, health::Source>(m, "NvmlSource")
      .def(
          "__init__",
          [](health::NvmlSource* self, unsigned index, const std::string& library_path, bool xid_events) {
            new (self) health::NvmlSource(index, nvmlOptions(library_path, xid_events));
          },
          nb::arg("index"), nb::arg("library_path") = "", nb::arg("xid_events") = true)
      .def_prop_ro("device", [](const health::NvmlSource& s) { return deviceTuple(s.device()); })
      .def("unsupported", [](const health::NvmlSource& s) {
        nb::list out;
        for (const auto& u : s.unsupported()) out.append(nb::make_tuple(deviceTuple(u.device), u.metric, u.reason));
        return out;
      });

  m.def("nvml_device_count", [](const std::string& path) { return health::nvmlDeviceCount(nvmlOptions(path)); },
        nb::arg("library_path") = "");
  m.def("nvml_device_info",
        [](unsigned index, const std::string& path) { return deviceTuple(health::nvmlDeviceInfo(index, nvmlOptions(path))); },
        nb::arg("index"), nb::arg("library_path") = "");
  m.def("nvml_index_for_cuda_ordinal",
        [](int ordinal, const std::string& pci_bus_id, const std::string& path) {
          return health::nvmlIndexForCudaOrdinal(ordinal, pci_bus_id, nvmlOptions(path));
        },
        nb::arg("ordinal"), nb::arg("pci_bus_id") = "", nb::arg("library_path") = "");
  m.def("nvml_index_by_uuid",
        [](const std::string& uuid, const std::string& path) { return health::nvmlIndexByUuid(uuid, nvmlOptions(path)); },
        nb::arg("uuid"), nb::arg("library_path") = "");

  nb::class_<PyMonitor>(m, "HealthMonitor")
      .def(
          "__init__",
          [](PyMonitor* self, nb::dict options, nb::list sources, nb::object on_event) {
            std::vector<std::shared_ptr<health::Source>> native;
            for (nb::handle s : sources) {
              if (nb::isinstance<health::Source>(s)) native.push_back(nb::cast<std::shared_ptr<health::Source>>(s));
              else native.push_back(std::make_shared<PySource>(nb::borrow<nb::object>(s)));
            }
            health::EventCallback callback;
            if (!on_event.is_none()) {
              auto holder = std::shared_ptr<nb::object>(new nb::object(on_event), [](nb::object* o) {
                nb::gil_scoped_acquire gil;
                delete o;
              });
              callback = [holder](const health::Event& e) {
                const std::string text = health::toJson(e).dump();
                nb::gil_scoped_acquire gil;
                try {
                  (*holder)(text);
                } catch (nb::python_error& err) {
                  rethrowPython(err);
                }
              };
            }
            new (self) PyMonitor{std::make_unique<health::Monitor>(optionsFrom(options), std::move(native), callback)};
          },
          nb::arg("options"), nb::arg("sources"), nb::arg("on_event").none())
      .def("start", [](PyMonitor& m) { m.monitor->start(); })
      .def("stop", [](PyMonitor& m) {
        nb::gil_scoped_release release;
        m.monitor->stop();
      })
      .def_prop_ro("running", [](PyMonitor& m) { return m.monitor->running(); })
      .def_prop_ro("polls", [](PyMonitor& m) { return m.monitor->polls(); })
      .def("poll_once", [](PyMonitor& m) {
        std::vector<health::Event> events;
        {
          nb::gil_scoped_release release;
          events = m.monitor->pollOnce();
        }
        return eventsJson(events);
      })
      .def("events", [](PyMonitor& m) { return eventsJson(m.monitor->events()); })
      .def("errors", [](PyMonitor& m) {
        nb::list out;
        for (const auto& e : m.monitor->errors())
          out.append(nb::make_tuple(e.source, std::string(errorKindName(e.kind)), e.message, e.time_s));
        return out;
      })
      .def("last_readings",
           [](PyMonitor& m) { return nb::borrow<nb::list>(pollTuple({m.monitor->lastReadings(), {}})[0]); })
      .def("unsupported", [](PyMonitor& m) { return nb::borrow<nb::list>(pollTuple({{}, m.monitor->unsupported()})[1]); })
      .def("rethrow_error", [](PyMonitor& m) { m.monitor->rethrowError(); });
}

}  // namespace lmr::python
