// lmr-oobd: the out-of-band observer of one training process (see observer.h). Started by
// lm_resiliency's harness; reports readiness on --ready-fd; exits with its parent.
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "lmr/common/error.h"
#include "lmr/common/list.h"
#include "lmr/common/log.h"
#include "lmr/oob/watch.h"
#include "observer.h"

namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_exiting{false};  // main() is returning: the parent watch may end
void onSignal(int) { g_stop.store(true); }

// The usage text, with the watch defaults of lmr::oob::WatchOptions.
std::string usage() {
  const lmr::oob::WatchOptions w;
  std::ostringstream u;
  u << "usage: lmr-oobd --segment=NAME --state-dir=DIR --group-ranks=R0,R1,... --index=I [options]\n"
       "  --run-id=ID --instance=TOKEN --generation=G --group=NAME --host=NAME\n"
       "  --master-addr=HOST --master-port=PORT [--serve]   TCP rendezvous (--serve hosts the store)\n"
       "                                                    (without them: files under DIR/rendezvous)\n"
    << "  --threshold-s=" << w.threshold_s << " --warmup-threshold-s=" << w.warmup_threshold_s
    << " --poll-ms=" << w.poll_s * 1000 << " --join-ms=" << w.join_s * 1000 << " --gather-ms=" << w.gather_s * 1000
    << " --setup-timeout-s=" << w.setup_timeout_s << "\n"
    << "  --io-absolute-s=" << w.io_absolute_s << " --io-relative=" << w.io_relative
    << " --io-persistence-s=" << w.io_persistence_s << "\n"
    << "  --gloo-hostname=127.0.0.1 --gloo-iface=IF --parent-pid=PID --ready-fd=FD\n"
       "  --bind-addr=IPV4   where --serve listens (default: the address --master-addr resolves to)\n"
       "environment: LMR_OOB_TOKEN, the job's secret (required; lm_resiliency sets it)\n";
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
  static const char* known[] = {"segment",
                                "state-dir",
                                "group-ranks",
                                "index",
                                "run-id",
                                "instance",
                                "generation",
                                "group",
                                "host",
                                "master-addr",
                                "master-port",
                                "serve",
                                "threshold-s",
                                "warmup-threshold-s",
                                "poll-ms",
                                "join-ms",
                                "gather-ms",
                                "setup-timeout-s",
                                "io-absolute-s",
                                "io-relative",
                                "io-persistence-s",
                                "gloo-hostname",
                                "gloo-iface",
                                "parent-pid",
                                "ready-fd",
                                "bind-addr"};
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

// The IPv4 address `host` resolves to: where the serving daemon listens, so the store is
// reachable at the address the job gave and nowhere else (loopback on one host).
std::string listenAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr)
    throw lmr::IoError("cannot resolve --master-addr " + host + " to an IPv4 address to listen on");
  const in_addr address = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
  ::freeaddrinfo(found);
  char text[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &address, text, sizeof(text));
  const bool loopback = (ntohl(address.s_addr) >> 24) == 127;
  if (loopback && host != "localhost" && host.rfind("127.", 0) != 0) {
    // A host name this machine maps to loopback (Debian's 127.0.1.1): peers on other
    // hosts reach it at another address, which only the wildcard covers.
    LMR_LOG(kWarn, "oobd", "--master-addr ", host, " resolves to ", text,
            " here: listening on every interface (set hang_bind_addr to restrict it)");
    return "0.0.0.0";
  }
  return text;
}

// The job's secret, from the environment (not the command line, which other users can read).
std::string takeToken() {
  const char* t = std::getenv("LMR_OOB_TOKEN");
  if (t == nullptr || std::strlen(t) < 16)
    throw lmr::InvalidArgument("LMR_OOB_TOKEN must hold the job's secret token (16 characters or more)");
  std::string token = t;
  ::unsetenv("LMR_OOB_TOKEN");
  return token;
}

// Removes the record the dead training process `parent` left. Its parent pid is gone from
// getppid() before the kernel shows it dead (a zombie): retried briefly until it does.
void removeRecordOf(long parent, const std::string& segment) {
  for (int i = 0; i < 100 && lmr::oob::ProgressReader::exists(segment); ++i) {
    if (lmr::oob::ProgressReader::unlinkIfOwnerDead(segment, static_cast<std::int32_t>(parent))) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Watches the training process: once it is gone (killed: it could not stop us), removes
// the record it left and exits at once, within one poll period even while a stall round
// blocks the main thread (a round can wait join + gather): it looks twice per period.
// Returns only when main() returns: a stop request (SIGTERM) can arrive in the middle of
// a round, which then still runs to its end, and the parent may die meanwhile.
void exitWithParent(long parent, const std::string& segment, std::chrono::milliseconds poll) {
  while (!g_exiting.load()) {
    if (::getppid() != parent) {
      lmr::MutexLock lock(lmr::oobd::reportFileLock());  // not half-way through a report
      removeRecordOf(parent, segment);
      std::_Exit(0);
    }
    std::this_thread::sleep_for(std::max(poll / 2, std::chrono::milliseconds(1)));
  }
}

// Stopped in order: this daemon's registration goes, and the last daemon of the group to
// leave removes the job's rendezvous directory (someone is always last: each removes its
// own key before it looks for the others').
void leaveFileRendezvous(lmr::oob::FileStore& store, const std::string& prefix, std::int64_t index,
                         std::size_t members) {
  try {
    store.erase(prefix + "ready/" + std::to_string(index));
    for (std::size_t i = 0; i < members; ++i)
      if (store.tryGet(prefix + "ready/" + std::to_string(i))) return;
    store.removeAll();
  } catch (const std::exception& e) {
    LMR_LOG(kWarn, "oobd", "cannot clean up the file rendezvous: ", e.what());
  }
}

struct ParentWatch {
  std::thread thread;
  ~ParentWatch() {
    g_exiting.store(true);
    if (thread.joinable()) thread.join();
  }
};

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
    // Exits with its parent: polled (a parent-death signal would follow the thread that
    // started the daemon, not the process). The parent may already be gone.
    if (parent > 0 && ::getppid() != parent) {
      removeRecordOf(parent, args.str("segment"));
      return 0;
    }
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
    o.token = takeToken();
    const lmr::oob::WatchOptions watch;  // the defaults
    const auto ms = [](double seconds) { return static_cast<std::int64_t>(seconds * 1000.0); };
    o.threshold = std::chrono::nanoseconds(static_cast<std::int64_t>(args.num("threshold-s", watch.threshold_s) * 1e9));
    o.warmup_threshold = std::chrono::nanoseconds(
        static_cast<std::int64_t>(args.num("warmup-threshold-s", watch.warmup_threshold_s) * 1e9));
    o.join = std::chrono::milliseconds(args.integer("join-ms", ms(watch.join_s)));
    o.gather = std::chrono::milliseconds(args.integer("gather-ms", ms(watch.gather_s)));
    o.state_dir = args.str("state-dir");
    o.diagnosis.io_absolute_ns = static_cast<std::int64_t>(args.num("io-absolute-s", watch.io_absolute_s) * 1e9);
    o.diagnosis.io_relative = args.num("io-relative", watch.io_relative);
    o.diagnosis.io_persistence_ns =
        static_cast<std::int64_t>(args.num("io-persistence-s", watch.io_persistence_s) * 1e9);
    const auto poll = std::chrono::milliseconds(std::max<std::int64_t>(1, args.integer("poll-ms", ms(watch.poll_s))));
    // From here on the daemon exits with its parent, during set-up too.
    ParentWatch watch_parent;
    if (parent > 0) watch_parent.thread = std::thread([&] { exitWithParent(parent, args.str("segment"), poll); });
    const auto setup_deadline =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(static_cast<long>(args.num("setup-timeout-s", watch.setup_timeout_s) * 1000));

    std::unique_ptr<lmr::oob::TcpStoreServer> server;
    std::unique_ptr<lmr::oob::Store> store;
    lmr::oob::FileStore* file_store = nullptr;  // owned by `store`, when file rendezvous
    if (args.has("master-addr") || args.has("master-port")) {
      lmr::oob::TcpStoreOptions t;
      t.host = args.str("master-addr", "127.0.0.1");
      t.port = static_cast<int>(args.integer("master-port", 0));
      t.token = o.token;
      if (args.has("serve")) {
        const std::string bind = args.has("bind-addr") ? args.str("bind-addr") : listenAddress(t.host);
        server = std::make_unique<lmr::oob::TcpStoreServer>(t.port, bind, o.token);
        LMR_LOG(kInfo, "oobd", "rendezvous store listening on ", bind, ":", server->port());
      }
      t.connect_timeout = std::chrono::milliseconds(500);
      store = std::make_unique<lmr::oob::TcpStore>(t);
    } else {
      // One directory per job: its daemons remove it when the job ends in order.
      auto files = std::make_unique<lmr::oob::FileStore>(o.state_dir + "/rendezvous/" +
                                                         (o.instance.empty() ? "job" : o.instance));
      file_store = files.get();
      store = std::move(files);
    }
    // The training process creates its record once this daemon runs (so that a training
    // process killed at any moment leaves nothing behind: the watch above removes it).
    std::unique_ptr<lmr::oobd::Observer> made;
    for (;;) {
      try {
        made = std::make_unique<lmr::oobd::Observer>(o, *store, args.str("segment"));
        break;
      } catch (const lmr::IoError&) {
        if (std::chrono::steady_clock::now() >= setup_deadline || g_stop.load()) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    lmr::oobd::Observer& observer = *made;
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
      observer.poll();
      std::this_thread::sleep_for(poll);
    }
    if (file_store != nullptr) leaveFileRendezvous(*file_store, observer.keyPrefix(), o.index, o.group_ranks.size());
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
