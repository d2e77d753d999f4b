// lmr-oobd: the out-of-band observer of one training process (see observer.h). Started by
// lm_resiliency's harness; reports readiness on --ready-fd; exits with its parent.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "lmr/common/error.h"
#include "lmr/common/list.h"
#include "lmr/oob/watch.h"
#include "observer.h"

namespace {

std::atomic<bool> g_stop{false};
void onSignal(int) { g_stop.store(true); }

// The usage text, with the watch defaults of lmr::oob::WatchOptions.
std::string usage() {
  const lmr::oob::WatchOptions w;
  std::ostringstream u;
  u << "usage: lmr-oobd --segment=NAME --state-dir=DIR --group-ranks=R0,R1,... --index=I [options]\n"
       "  --run-id=ID --instance=TOKEN --generation=G --group=NAME --host=NAME\n"
       "  --master-addr=HOST --master-port=PORT [--serve]   TCP rendezvous (--serve hosts the store)\n"
       "                                                    (without them: files under DIR/rendezvous)\n"
    << "  --threshold-s=" << w.threshold_s << " --poll-ms=" << w.poll_s * 1000 << " --join-ms=" << w.join_s * 1000
    << " --gather-ms=" << w.gather_s * 1000 << " --setup-timeout-s=" << w.setup_timeout_s << "\n"
    << "  --io-absolute-s=" << w.io_absolute_s << " --io-relative=" << w.io_relative
    << " --io-persistence-s=" << w.io_persistence_s << "\n"
    << "  --gloo-hostname=127.0.0.1 --gloo-iface=IF --parent-pid=PID --ready-fd=FD\n";
  return u.str();
}

struct Args {
  std::map<std::string, std::string> values;
  bool has(const std::string& k) const { return values.count(k) != 0; }
  std::string str(const std::string& k, const std::string& fallback = "") const {
    auto it = values.find(k);
    return it == values.end() ? fallback : it->second;
  }
  double num(const std::string& k, double fallback) const {
    if (!has(k)) return fallback;
    const std::string& v = values.at(k);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(x >= 0))
      throw lmr::InvalidArgument("--" + k + " must be a non-negative number, got \"" + v + "\"");
    return x;
  }
  long integer(const std::string& k, long fallback) const {
    const double x = num(k, static_cast<double>(fallback));
    if (x != static_cast<double>(static_cast<long>(x))) throw lmr::InvalidArgument("--" + k + " must be an integer");
    return static_cast<long>(x);
  }
};

Args parse(int argc, char** argv) {
  static const char* known[] = {"segment",       "state-dir",       "group-ranks",   "index",       "run-id",
                                "instance",      "generation",      "group",         "host",        "master-addr",
                                "master-port",   "serve",           "threshold-s",   "poll-ms",     "join-ms",
                                "gather-ms",     "setup-timeout-s", "io-absolute-s", "io-relative", "io-persistence-s",
                                "gloo-hostname", "gloo-iface",      "parent-pid",    "ready-fd"};
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) throw lmr::InvalidArgument("unexpected argument \"" + s + "\"");
    const auto eq = s.find('=');
    const std::string k = s.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    bool ok = false;
    for (const char* x : known) ok = ok || k == x;
    if (!ok) throw lmr::InvalidArgument("unknown option --" + k);
    a.values[k] = eq == std::string::npos ? "" : s.substr(eq + 1);
  }
  for (const char* required : {"segment", "state-dir", "group-ranks", "index"})
    if (!a.has(required)) throw lmr::InvalidArgument(std::string("missing --") + required);
  return a;
}

void tell(int fd, const std::string& line) {
  if (fd < 0) return;
  const std::string text = line + "\n";
  [[maybe_unused]] const ssize_t n = ::write(fd, text.data(), text.size());
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << "lmr-oobd: the out-of-band observer of one training process (started by lm_resiliency)\n" << usage();
      return 0;
    }
  }
  int ready_fd = -1;
  try {
    const Args args = parse(argc, argv);
    ready_fd = static_cast<int>(args.integer("ready-fd", -1));
    const long parent = args.integer("parent-pid", 0);
    // Exits with its parent: polled below (a parent-death signal would follow the thread
    // that started the daemon, not the process).
    if (parent > 0 && ::getppid() != parent) return 0;
    ::signal(SIGTERM, onSignal);
    ::signal(SIGINT, onSignal);
    ::signal(SIGPIPE, SIG_IGN);

    lmr::oobd::ObserverOptions o;
    o.run_id = args.str("run-id", "default");
    o.instance = args.str("instance");
    o.generation = args.integer("generation", 0);
    o.group = args.str("group", "world");
    o.group_ranks = lmr::parseIntegerList(args.str("group-ranks"), "--group-ranks", 0);
    o.index = args.integer("index", 0);
    char hostname[256] = {0};
    ::gethostname(hostname, sizeof(hostname) - 1);
    o.host = args.str("host", hostname);
    o.gloo_hostname = args.str("gloo-hostname", "127.0.0.1");
    o.gloo_iface = args.str("gloo-iface");
    const lmr::oob::WatchOptions watch;  // the defaults
    const auto ms = [](double seconds) { return static_cast<std::int64_t>(seconds * 1000.0); };
    o.threshold = std::chrono::nanoseconds(static_cast<std::int64_t>(args.num("threshold-s", watch.threshold_s) * 1e9));
    o.join = std::chrono::milliseconds(args.integer("join-ms", ms(watch.join_s)));
    o.gather = std::chrono::milliseconds(args.integer("gather-ms", ms(watch.gather_s)));
    o.state_dir = args.str("state-dir");
    o.diagnosis.io_absolute_ns = static_cast<std::int64_t>(args.num("io-absolute-s", watch.io_absolute_s) * 1e9);
    o.diagnosis.io_relative = args.num("io-relative", watch.io_relative);
    o.diagnosis.io_persistence_ns =
        static_cast<std::int64_t>(args.num("io-persistence-s", watch.io_persistence_s) * 1e9);
    const auto poll = std::chrono::milliseconds(std::max<std::int64_t>(1, args.integer("poll-ms", ms(watch.poll_s))));
    const auto setup_deadline =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(static_cast<long>(args.num("setup-timeout-s", watch.setup_timeout_s) * 1000));

    std::unique_ptr<lmr::oob::TcpStoreServer> server;
    std::unique_ptr<lmr::oob::Store> store;
    if (args.has("master-addr") || args.has("master-port")) {
      lmr::oob::TcpStoreOptions t;
      t.host = args.str("master-addr", "127.0.0.1");
      t.port = static_cast<int>(args.integer("master-port", 0));
      if (args.has("serve")) server = std::make_unique<lmr::oob::TcpStoreServer>(t.port);
      t.connect_timeout = std::chrono::milliseconds(500);
      store = std::make_unique<lmr::oob::TcpStore>(t);
    } else {
      store = std::make_unique<lmr::oob::FileStore>(o.state_dir + "/rendezvous");
    }
    lmr::oobd::Observer observer(o, *store, args.str("segment"));
    // Set-up retries a store that is not listening yet (the serving daemon may start last).
    for (;;) {
      try {
        observer.setUp(setup_deadline);
        break;
      } catch (const lmr::IoError&) {
        if (std::chrono::steady_clock::now() >= setup_deadline || g_stop.load()) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    tell(ready_fd, "ready " + observer.reportStem() + " " + observer.keyPrefix());
    if (ready_fd >= 0) ::close(ready_fd);
    while (!g_stop.load()) {
      if (parent > 0 && ::getppid() != parent) {
        // The training process died without unlinking its record (killed): remove it.
        lmr::oob::ProgressReader::unlinkIfOwnerDead(args.str("segment"), static_cast<std::int32_t>(parent));
        break;
      }
      observer.poll();
      std::this_thread::sleep_for(poll);
    }
    return 0;
  } catch (const lmr::InvalidArgument& e) {
    tell(ready_fd, std::string("error: ") + e.what());
    std::cerr << "lmr-oobd: " << e.what() << "\n" << usage();
    return 2;
  } catch (const std::exception& e) {
    tell(ready_fd, std::string("error: ") + e.what());
    std::cerr << "lmr-oobd: " << e.what() << "\n";
    return 1;
  }
}
