// health::Monitor: the polling thread, stored errors and snapshots (see monitor.h).
#include "lmr/health/monitor.h"

#include <chrono>
#include <exception>
#include <set>

#include "lmr/common/log.h"

namespace lmr::health {
namespace {

constexpr std::size_t kMaxEvents = 1024;
constexpr std::size_t kMaxErrors = 256;

double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Monitor::Monitor(MonitorOptions options, std::vector<std::shared_ptr<Source>> sources, EventCallback on_event)
    : options_(std::move(options)), sources_(std::move(sources)), on_event_(std::move(on_event)), rules_(options_) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    if (!sources_[i]) throw InvalidArgument("sources[" + std::to_string(i) + "]: is null");
    const std::string name = sources_[i]->name();
    if (!names.insert(name).second)
      throw InvalidArgument("sources[" + std::to_string(i) + "]: another source is also named '" + name +
                            "' (names key the readings and rule state; give each source its own)");
  }
}

Monitor::~Monitor() {
  try {
    stop();
  } catch (...) {
  }
}

void Monitor::storeError(const std::string& source, ErrorKind kind, const std::string& message) {
  LMR_LOG(kWarn, "health", source, ": ", message);
  MutexLock lock(mutex_);
  if (errors_.size() >= kMaxErrors) {
    errors_.erase(errors_.begin());
    if (errors_rethrown_ > 0) --errors_rethrown_;
    ++errors_dropped_;
  }
  errors_.push_back(SourceError{source, kind, message, wallSeconds()});
}

std::vector<Event> Monitor::pollOnce() {
  std::vector<Event> all;
  {
    MutexLock poll_lock(poll_mutex_);
    for (std::size_t i = 0; i < sources_.size(); ++i) {
      Source& source = *sources_[i];
      std::string name = "source " + std::to_string(i);
      PollResult result;
      try {
        name = source.name();
        result = source.poll();
      } catch (const Error& e) {
        storeError(name, e.kind(), e.message());
        continue;
      } catch (const std::exception& e) {
        storeError(name, ErrorKind::kPeerFailure, e.what());
        continue;
      }
      std::vector<Event> events = rules_.evaluate(name, result.readings, wallSeconds());
      {
        MutexLock lock(mutex_);
        last_readings_[name] = std::move(result.readings);
        for (UnsupportedMetric& u : result.unsupported) unsupported_.push_back(std::move(u));
        for (const Event& e : events) {
          if (events_.size() >= kMaxEvents) events_.erase(events_.begin());
          events_.push_back(e);
        }
      }
      all.insert(all.end(), events.begin(), events.end());
    }
    MutexLock lock(mutex_);
    ++polls_;
  }
  if (on_event_) {
    for (const Event& e : all) {
      try {
        on_event_(e);
      } catch (const Error& ex) {
        storeError("on_event", ex.kind(), ex.message());
      } catch (const std::exception& ex) {
        storeError("on_event", ErrorKind::kPeerFailure, ex.what());
      }
    }
  }
  return all;
}

void Monitor::run() {
  while (true) {
    try {
      pollOnce();
    } catch (...) {  // pollOnce stores what it can; never let the thread die
      storeError("monitor", ErrorKind::kPeerFailure, "unexpected failure while polling");
    }
    MutexLock lock(mutex_);
    if (lock.waitFor(wake_, std::chrono::duration<double>(options_.interval_s),
                     [this]() LMR_REQUIRES(mutex_) { return stop_; }))
      return;
  }
}

void Monitor::start() {
  MutexLock lock(mutex_);
  if (running_) throw InvalidArgument("the health monitor is already running");
  stop_ = false;
  running_ = true;
  thread_ = std::thread(&Monitor::run, this);
  thread_id_ = thread_.get_id();
}

void Monitor::stop() {
  if (onMonitorThread()) throw InvalidArgument("stop() called from the monitor's own thread (an on_event callback)");
  MutexLock stopping(stop_mutex_);
  {
    MutexLock lock(mutex_);
    if (!running_) return;
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  MutexLock lock(mutex_);
  running_ = false;
  thread_id_ = std::thread::id();
}

bool Monitor::onMonitorThread() const {
  MutexLock lock(mutex_);
  return running_ && std::this_thread::get_id() == thread_id_;
}

bool Monitor::running() const {
  MutexLock lock(mutex_);
  return running_;
}

std::vector<Event> Monitor::events() const {
  MutexLock lock(mutex_);
  return events_;
}

std::vector<SourceError> Monitor::errors() const {
  MutexLock lock(mutex_);
  return errors_;
}

std::vector<Reading> Monitor::lastReadings() const {
  MutexLock lock(mutex_);
  std::vector<Reading> out;
  for (const auto& [name, readings] : last_readings_) out.insert(out.end(), readings.begin(), readings.end());
  return out;
}

std::vector<UnsupportedMetric> Monitor::unsupported() const {
  MutexLock lock(mutex_);
  return unsupported_;
}

std::uint64_t Monitor::polls() const {
  MutexLock lock(mutex_);
  return polls_;
}

void Monitor::rethrowError() {
  SourceError error;
  {
    MutexLock lock(mutex_);
    if (errors_rethrown_ >= errors_.size()) return;
    error = errors_[errors_rethrown_++];
  }
  throwError(error.kind, "health source " + error.source + ": " + error.message);
}

}  // namespace lmr::health
