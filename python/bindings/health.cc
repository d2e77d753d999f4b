// Bindings of lmr::health: the options, device, reading, unsupported-metric and event
// structs as classes (the names Python users know: HealthConfig, HealthDevice, ...), the
// metric vocabulary as constants, NvmlSource, and the monitor. A Python HealthSource is
// polled by the C++ monitor thread through PySource, which takes the GIL only for that call.
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <thread>

#include "bindings.h"
#include "lmr/common/error.h"
#include "lmr/common/json.h"
#include "lmr/health/monitor.h"
#include "lmr/health/nvml.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using health::DeviceInfo;
using health::Event;
using health::MonitorOptions;
using health::Reading;
using health::UnsupportedMetric;

std::string reprText(nb::handle h) { return nb::cast<std::string>(nb::repr(h)); }
std::string typeName(nb::handle h) { return nb::cast<std::string>(h.type().attr("__name__")); }

// A Python number (not a bool) for option `field`.
double number(nb::handle v, const char* field) {
  if (PyBool_Check(v.ptr()) || !(PyLong_Check(v.ptr()) || PyFloat_Check(v.ptr())))
    throw InvalidArgument(std::string(field) + ": must be a number, got " + reprText(v));
  return nb::cast<double>(v);
}

std::set<std::int64_t> xids(nb::handle v) {
  const auto bad = [&] { return InvalidArgument("fatal_xids: must be a sequence of integers, got " + reprText(v)); };
  if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) || !PySequence_Check(v.ptr())) throw bad();
  std::set<std::int64_t> out;
  for (nb::handle x : v) {
    if (PyBool_Check(x.ptr()) || !PyLong_Check(x.ptr())) throw bad();
    out.insert(nb::cast<std::int64_t>(x));
  }
  return out;
}

nb::tuple strings(const std::vector<const char*>& names) {
  nb::list out;
  for (const char* n : names) out.append(nb::str(n));
  return nb::tuple(out);
}

nb::tuple xidTuple(const std::set<std::int64_t>& values) {
  nb::list out;
  for (std::int64_t x : values) out.append(x);
  return nb::tuple(out);
}

std::string eventText(nb::handle d) { return nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(d)); }
nb::object eventDict(const Event& e) { return nb::module_::import_("json").attr("loads")(health::toJson(e).dump()); }

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

// A HealthSource written in Python: poll() returns HealthReadings, or (readings,
// unsupported metrics).
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
      nb::object result = object_.attr("poll")();
      nb::object readings = result, unsupported = nb::tuple();
      if (nb::isinstance<nb::tuple>(result) && nb::len(result) == 2 && !nb::isinstance<Reading>(result[0])) {
        readings = result[0];
        unsupported = result[1];
      }
      health::PollResult out;
      for (nb::handle r : readings) {
        if (!nb::isinstance<Reading>(r))
          throw InvalidArgument(name_ + ".poll()[" + std::to_string(out.readings.size()) +
                                "]: expected a HealthReading, got " + typeName(r));
        out.readings.push_back(nb::cast<Reading>(r));
      }
      for (nb::handle u : unsupported) {
        if (!nb::isinstance<UnsupportedMetric>(u))
          throw InvalidArgument(name_ + ".poll() unsupported[" + std::to_string(out.unsupported.size()) +
                                "]: expected an UnsupportedMetric, got " + typeName(u));
        out.unsupported.push_back(nb::cast<UnsupportedMetric>(u));
      }
      return out;
    } catch (nb::python_error& e) {
      rethrowPython(e);
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

health::NvmlOptions nvmlOptions(const std::string& library_path, bool xid_events = true) {
  health::NvmlOptions o;
  o.library_path = library_path;
  o.xid_events = xid_events;
  return o;
}

template <double MonitorOptions::* Field>
void numberOption(nb::class_<MonitorOptions>& c, const char* name) {
  c.def_prop_rw(
      name, [](const MonitorOptions& o) { return o.*Field; },
      [name](MonitorOptions& o, nb::handle v) { o.*Field = number(v, name); });
}

std::string deviceRepr(const DeviceInfo& d) {
  return "HealthDevice(index=" + std::to_string(d.index) + ", uuid=" + reprText(nb::str(d.uuid.c_str())) +
         ", pci_bus_id=" + reprText(nb::str(d.pci_bus_id.c_str())) + ", name=" + reprText(nb::str(d.name.c_str())) +
         ")";
}

void registerConfig(nb::module_& m) {
  const MonitorOptions d;
  nb::class_<MonitorOptions> c(m, "HealthConfig",
                               "Options of a HardwareHealthMonitor (lmr::health::MonitorOptions). A bad value raises "
                               "InvalidArgumentError naming the field.");
  c.def(
      "__init__",
      [](MonitorOptions* self, nb::handle interval_s, nb::handle fatal_xids, nb::handle nvlink_error_threshold,
         nb::handle nvlink_window_s, nb::handle temperature_margin_c, nb::handle temperature_warning_margin_c,
         nb::handle warning_interval_s) {
        MonitorOptions o;
        o.interval_s = number(interval_s, "interval_s");
        o.fatal_xids = xids(fatal_xids);
        o.nvlink_error_threshold = number(nvlink_error_threshold, "nvlink_error_threshold");
        o.nvlink_window_s = number(nvlink_window_s, "nvlink_window_s");
        o.temperature_margin_c = number(temperature_margin_c, "temperature_margin_c");
        o.temperature_warning_margin_c = number(temperature_warning_margin_c, "temperature_warning_margin_c");
        o.warning_interval_s = number(warning_interval_s, "warning_interval_s");
        o.validate();
        new (self) MonitorOptions(std::move(o));
      },
      nb::arg("interval_s") = d.interval_s, nb::arg("fatal_xids") = xidTuple(d.fatal_xids),
      nb::arg("nvlink_error_threshold") = d.nvlink_error_threshold, nb::arg("nvlink_window_s") = d.nvlink_window_s,
      nb::arg("temperature_margin_c") = d.temperature_margin_c,
      nb::arg("temperature_warning_margin_c") = d.temperature_warning_margin_c,
      nb::arg("warning_interval_s") = d.warning_interval_s);
  numberOption<&MonitorOptions::interval_s>(c, "interval_s");
  c.def_prop_rw(
      "fatal_xids", [](const MonitorOptions& o) { return xidTuple(o.fatal_xids); },
      [](MonitorOptions& o, nb::handle v) { o.fatal_xids = xids(v); });
  numberOption<&MonitorOptions::nvlink_error_threshold>(c, "nvlink_error_threshold");
  numberOption<&MonitorOptions::nvlink_window_s>(c, "nvlink_window_s");
  numberOption<&MonitorOptions::temperature_margin_c>(c, "temperature_margin_c");
  numberOption<&MonitorOptions::temperature_warning_margin_c>(c, "temperature_warning_margin_c");
  numberOption<&MonitorOptions::warning_interval_s>(c, "warning_interval_s");
  c.def("validate", &MonitorOptions::validate, "Raises InvalidArgumentError naming a field with a bad value.");
  c.def(nb::self == nb::self);
  c.def("__repr__", [](const MonitorOptions& o) {
    auto f = [](double v) { return reprText(nb::float_(v)); };
    return "HealthConfig(interval_s=" + f(o.interval_s) + ", fatal_xids=" + reprText(xidTuple(o.fatal_xids)) +
           ", nvlink_error_threshold=" + f(o.nvlink_error_threshold) + ", nvlink_window_s=" + f(o.nvlink_window_s) +
           ", temperature_margin_c=" + f(o.temperature_margin_c) +
           ", temperature_warning_margin_c=" + f(o.temperature_warning_margin_c) +
           ", warning_interval_s=" + f(o.warning_interval_s) + ")";
  });
  c.attr("__hash__") = nb::none();  // mutable, as the options are
  m.attr("HEALTH_DEFAULT_FATAL_XIDS") = xidTuple(d.fatal_xids);
}

void registerRecords(nb::module_& m) {
  m.attr("HEALTH_METRICS") = strings(health::metricNames());
  m.attr("HEALTH_EVENT_METRICS") = strings(health::eventMetricNames());

  nb::class_<DeviceInfo>(m, "HealthDevice", "The physical device a reading is about (index: the source's numbering).")
      .def(
          "__init__",
          [](DeviceInfo* self, int index, std::string uuid, std::string pci_bus_id, std::string name) {
            new (self) DeviceInfo{index, std::move(uuid), std::move(pci_bus_id), std::move(name)};
          },
          nb::arg("index"), nb::arg("uuid") = "", nb::arg("pci_bus_id") = "", nb::arg("name") = "")
      .def_ro("index", &DeviceInfo::index)
      .def_ro("uuid", &DeviceInfo::uuid)
      .def_ro("pci_bus_id", &DeviceInfo::pci_bus_id)
      .def_ro("name", &DeviceInfo::name)
      .def(nb::self == nb::self)
      .def("__hash__",
           [](const DeviceInfo& d) { return nb::hash(nb::make_tuple(d.index, d.uuid, d.pci_bus_id, d.name)); })
      .def("__repr__", &deviceRepr);

  nb::class_<Reading>(m, "HealthReading", "One reading of one metric of one device.")
      .def(
          "__init__",
          [](Reading* self, const DeviceInfo& device, std::string metric, double value, std::string detail) {
            new (self) Reading{device, std::move(metric), value, std::move(detail)};
          },
          nb::arg("device"), nb::arg("metric"), nb::arg("value"), nb::arg("detail") = "")
      .def_ro("device", &Reading::device)
      .def_ro("metric", &Reading::metric)
      .def_ro("value", &Reading::value)
      .def_ro("detail", &Reading::detail)
      .def(nb::self == nb::self)
      .def("__hash__", [](const Reading& r) { return nb::hash(nb::make_tuple(r.device, r.metric, r.value, r.detail)); })
      .def("__repr__", [](const Reading& r) {
        return "HealthReading(device=" + deviceRepr(r.device) + ", metric=" + reprText(nb::str(r.metric.c_str())) +
               ", value=" + reprText(nb::float_(r.value)) + ", detail=" + reprText(nb::str(r.detail.c_str())) + ")";
      });

  nb::class_<UnsupportedMetric>(m, "UnsupportedMetric", "A metric a device does not support, and why.")
      .def(
          "__init__",
          [](UnsupportedMetric* self, const DeviceInfo& device, std::string metric, std::string reason) {
            new (self) UnsupportedMetric{device, std::move(metric), std::move(reason)};
          },
          nb::arg("device"), nb::arg("metric"), nb::arg("reason"))
      .def_ro("device", &UnsupportedMetric::device)
      .def_ro("metric", &UnsupportedMetric::metric)
      .def_ro("reason", &UnsupportedMetric::reason)
      .def(nb::self == nb::self)
      .def("__hash__",
           [](const UnsupportedMetric& u) { return nb::hash(nb::make_tuple(u.device, u.metric, u.reason)); })
      .def("__repr__", [](const UnsupportedMetric& u) {
        return "UnsupportedMetric(device=" + deviceRepr(u.device) + ", metric=" + reprText(nb::str(u.metric.c_str())) +
               ", reason=" + reprText(nb::str(u.reason.c_str())) + ")";
      });

  nb::class_<Event>(m, "HealthEvent", "A fatal or warning event about one device (lmr::health::Event).")
      .def(
          "__init__",
          [](Event* self, const DeviceInfo& device, std::string source, std::string host, std::string metric,
             double value, double threshold, const std::string& severity, double time, std::string message) {
            new (self) Event{device,
                             std::move(source),
                             std::move(host),
                             std::move(metric),
                             value,
                             threshold,
                             health::severityFromName(severity),
                             time,
                             std::move(message)};
          },
          nb::arg("device"), nb::arg("source"), nb::arg("host"), nb::arg("metric"), nb::arg("value"),
          nb::arg("threshold"), nb::arg("severity"), nb::arg("time"), nb::arg("message"))
      .def_ro("device", &Event::device)
      .def_ro("source", &Event::source)
      .def_ro("host", &Event::host)
      .def_ro("metric", &Event::metric)
      .def_ro("value", &Event::value)
      .def_ro("threshold", &Event::threshold)
      .def_prop_ro("severity", [](const Event& e) { return health::severityName(e.severity); })
      .def_ro("time", &Event::time_s, "seconds since the epoch")
      .def_ro("message", &Event::message)
      .def_prop_ro("fatal", [](const Event& e) { return e.severity == health::Severity::kFatal; })
      .def("resource", &health::resourceName, "The GPU as a kit resource name: <host>/gpu-<index>.")
      .def_prop_ro("_kit_kind", &health::kitKind)
      .def("to_json", [](const Event& e) { return health::toJson(e).dump(); })
      .def("to_dict", &eventDict)
      .def_static(
          "from_dict", [](nb::handle d) { return health::parseEvent(json::parse(eventText(d), "HealthEvent").value); },
          nb::arg("data"), "Strict: raises InvalidArgumentError naming the JSON path of what is wrong.")
      .def(nb::self == nb::self)
      .def("__hash__", [](const Event& e) { return nb::hash(nb::str(health::toJson(e).dump().c_str())); })
      .def("__repr__", [](const Event& e) {
        return "HealthEvent(device=" + deviceRepr(e.device) + ", source=" + reprText(nb::str(e.source.c_str())) +
               ", host=" + reprText(nb::str(e.host.c_str())) + ", metric=" + reprText(nb::str(e.metric.c_str())) +
               ", value=" + reprText(nb::float_(e.value)) + ", threshold=" + reprText(nb::float_(e.threshold)) +
               ", severity='" + health::severityName(e.severity) + "', time=" + reprText(nb::float_(e.time_s)) +
               ", message=" + reprText(nb::str(e.message.c_str())) + ")";
      });
}

void registerNvml(nb::module_& m) {
  nb::class_<health::Source>(m, "NativeHealthSource")
      .def_prop_ro("name", &health::Source::name)
      .def("poll", [](health::Source& s) {
        health::PollResult result;
        {
          nb::gil_scoped_release release;
          result = s.poll();
        }
        return nb::make_tuple(std::move(result.readings), std::move(result.unsupported));
      });

  nb::class_<health::NvmlSource, health::Source>(m, "NvmlSource")
      .def(
          "__init__",
          [](health::NvmlSource* self, unsigned index, const std::string& library_path, bool xid_events) {
            new (self) health::NvmlSource(index, nvmlOptions(library_path, xid_events));
          },
          nb::arg("index"), nb::arg("library_path") = "", nb::arg("xid_events") = true)
      .def_prop_ro("device", [](const health::NvmlSource& s) { return s.device(); })
      .def("unsupported", &health::NvmlSource::unsupported);

  m.def(
      "nvml_device_count", [](const std::string& path) { return health::nvmlDeviceCount(nvmlOptions(path)); },
      nb::arg("library_path") = "");
  m.def(
      "nvml_device_info",
      [](unsigned index, const std::string& path) { return health::nvmlDeviceInfo(index, nvmlOptions(path)); },
      nb::arg("index"), nb::arg("library_path") = "");
  m.def(
      "nvml_index_for_cuda_ordinal",
      [](int ordinal, const std::string& pci_bus_id, const std::string& path) {
        return health::nvmlIndexForCudaOrdinal(ordinal, pci_bus_id, nvmlOptions(path));
      },
      nb::arg("ordinal"), nb::arg("pci_bus_id") = "", nb::arg("library_path") = "");
  m.def(
      "nvml_index_by_uuid",
      [](const std::string& uuid, const std::string& path) { return health::nvmlIndexByUuid(uuid, nvmlOptions(path)); },
      nb::arg("uuid"), nb::arg("library_path") = "");
}

void registerMonitor(nb::module_& m) {
  nb::class_<PyMonitor>(m, "HealthMonitor")
      .def(
          "__init__",
          [](PyMonitor* self, const MonitorOptions& options, nb::list sources, nb::object on_event) {
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
              callback = [holder](const Event& e) {
                nb::gil_scoped_acquire gil;
                try {
                  (*holder)(nb::cast(e, nb::rv_policy::copy));  // the callee may keep it
                } catch (nb::python_error& err) {
                  rethrowPython(err);
                }
              };
            }
            new (self) PyMonitor{std::make_unique<health::Monitor>(options, std::move(native), callback)};
          },
          nb::arg("options"), nb::arg("sources"), nb::arg("on_event").none())
      .def("start", [](PyMonitor& m) { m.monitor->start(); })
      .def("stop",
           [](PyMonitor& m) {
             nb::gil_scoped_release release;
             m.monitor->stop();
           })
      .def_prop_ro("running", [](PyMonitor& m) { return m.monitor->running(); })
      .def_prop_ro("polls", [](PyMonitor& m) { return m.monitor->polls(); })
      .def("poll_once",
           [](PyMonitor& m) {
             nb::gil_scoped_release release;
             return m.monitor->pollOnce();
           })
      .def("events", [](PyMonitor& m) { return m.monitor->events(); })
      .def("errors",
           [](PyMonitor& m) {
             nb::list out;
             for (const auto& e : m.monitor->errors())
               out.append(nb::make_tuple(e.source, std::string(errorKindName(e.kind)), e.message, e.time_s));
             return out;
           })
      .def("last_readings", [](PyMonitor& m) { return m.monitor->lastReadings(); })
      .def("unsupported", [](PyMonitor& m) { return m.monitor->unsupported(); })
      .def("rethrow_error", [](PyMonitor& m) { m.monitor->rethrowError(); });
}

}  // namespace

void registerHealth(nb::module_& m) {
  registerConfig(m);
  registerRecords(m);
  registerNvml(m);
  registerMonitor(m);
}

}  // namespace lmr::python
