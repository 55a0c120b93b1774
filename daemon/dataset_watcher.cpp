#include "daemon/dataset_watcher.hpp"

#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <vector>

#include "messages/log.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct FileStat {
  std::int64_t size = -1;
  std::int64_t mtime_ns = 0;
  bool operator==(const FileStat& o) const { return size == o.size && mtime_ns == o.mtime_ns; }
  bool operator!=(const FileStat& o) const { return !(*this == o); }
};

/// path -> stat of every regular file under a folder (hidden names skipped, as the dataset
/// layouts skip them).
using Walk = std::map<fs::path, FileStat>;

bool stat_file(const fs::path& p, FileStat& out) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  out.size = static_cast<std::int64_t>(st.st_size);
  out.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  return true;
}

bool is_hidden(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.empty() || n[0] == '.';
}

/// A dataset folder still being written (NAME.partial, renamed to NAME when complete).
bool is_partial(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.size() > 8 && n.ends_with(".partial");
}

Walk walk_folder(const fs::path& root) {
  Walk w;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (is_hidden(p)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    FileStat s;
    if (stat_file(p, s)) w[p] = s;
  }
  return w;
}

constexpr std::uint32_t kDirMask =
    IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CREATE | IN_DELETE_SELF | IN_ONLYDIR;

struct DatasetState {
  Walk last_walk;
  bool walked = false;
  bool dirty = true;
  bool pending = false;
  Clock::time_point next_pending_check{};
  std::size_t ok_signature = 0;
  bool has_baseline = false;
};

}  // namespace

struct DatasetWatcher::Impl {
  WatchOptions o;
  StateDb& db;
  ChangeFn on_change;
  std::atomic<bool> stop{false};

  int fd = -1;
  std::map<int, fs::path> wd_dir;
  std::map<fs::path, int> dir_wd;
  std::map<fs::path, FileStat> closed;  // stats seen at IN_CLOSE_WRITE / IN_MOVED_TO
  std::map<std::string, DatasetState> sets;
  bool root_dirty = true;
  Clock::time_point last_event{};
  bool warned_watch_limit = false;

  mutable std::mutex version_mu;
  std::map<std::string, std::uint64_t> versions;

  Impl(WatchOptions opts, StateDb& d, ChangeFn fn) : o(std::move(opts)), db(d), on_change(std::move(fn)) {}

  std::string dataset_of(const fs::path& p) const {
    const fs::path rel = p.lexically_relative(o.data_root);
    if (rel.empty() || *rel.begin() == "..") return "";
    return rel.begin()->string();
  }

  void add_watch(const fs::path& dir) {
    if (fd < 0 || dir_wd.count(dir)) return;
    const int wd = inotify_add_watch(fd, dir.c_str(), kDirMask);
    if (wd < 0) {
      if (!warned_watch_limit) {
        log::warn("watcher: cannot watch " + dir.string() + ": " + std::strerror(errno) +
                  " (falling back to periodic rescans there)");
        warned_watch_limit = true;
      }
      return;
    }
    wd_dir[wd] = dir;
    dir_wd[dir] = wd;
  }

  void add_watch_tree(const fs::path& dir) {
    add_watch(dir);
    std::error_code ec;
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      if (!it->is_directory(ec)) continue;
      if (is_hidden(it->path())) {
        it.disable_recursion_pending();
        continue;
      }
      add_watch(it->path());
    }
  }

  /// Finds the dataset folders; forgets the ones that went away.
  void discover() {
    root_dirty = false;
    std::set<std::string> present;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(o.data_root, ec)) {
      if (is_hidden(e.path()) || is_partial(e.path()) || !e.is_directory(ec)) continue;
      const std::string name = e.path().filename().string();
      present.insert(name);
      if (!sets.count(name)) {
        sets[name] = DatasetState{};
        add_watch_tree(e.path());
      }
    }
    for (auto it = sets.begin(); it != sets.end();) {
      if (present.count(it->first)) {
        ++it;
        continue;
      }
      log::info("watcher: dataset " + it->first + " removed");
      forget(it->first);
      const bool had_cases = it->second.has_baseline && it->second.ok_signature != 0;
      const std::string name = it->first;
      it = sets.erase(it);
      if (had_cases) bump(name);
    }
    auto stored = db.datasets();
    if (stored.is_ok())
      for (const auto& d : *stored)
        if (!present.count(d.name)) forget(d.name);
  }

  void forget(const std::string& name) {
    Status st = db.remove_dataset(name);
    if (!st.is_ok()) log::warn("watcher: " + st.message());
  }

  void bump(const std::string& name) {
    {
      std::lock_guard<std::mutex> lock(version_mu);
      ++versions[name];
    }
    if (on_change) {
      try {
        on_change(name);
      } catch (const std::exception& e) {
        log::error(std::string("watcher: change callback failed: ") + e.what());
      }
    }
  }

  void read_events() {
    alignas(struct inotify_event) char buf[64 * 1024];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return;  // EAGAIN: drained
      for (ssize_t off = 0; off < n;) {
        const auto* ev = reinterpret_cast<const struct inotify_event*>(buf + off);
        off += static_cast<ssize_t>(sizeof(struct inotify_event) + ev->len);
        handle(*ev);
      }
    }
  }

  void handle(const struct inotify_event& ev) {
    last_event = Clock::now();
    if (ev.mask & IN_Q_OVERFLOW) {
      root_dirty = true;
      for (auto& [n, s] : sets) s.dirty = true;
      return;
    }
    auto it = wd_dir.find(ev.wd);
    if (it == wd_dir.end()) return;
    const fs::path dir = it->second;
    if (ev.mask & IN_IGNORED) {
      dir_wd.erase(dir);
      wd_dir.erase(it);
      return;
    }
    const fs::path path = ev.len > 0 ? dir / ev.name : dir;
    if (ev.len > 0 && is_hidden(path)) return;
    const bool is_dir = (ev.mask & IN_ISDIR) != 0;
    if (dir == o.data_root) {
      if (is_dir) root_dirty = true;  // a dataset folder came or went
      if (is_dir && is_partial(path)) return;
      if (is_dir && (ev.mask & (IN_CREATE | IN_MOVED_TO))) add_watch_tree(path);
    } else if (is_dir && (ev.mask & (IN_CREATE | IN_MOVED_TO))) {
      add_watch_tree(path);  // files may already be inside (mv of a whole folder)
    }
    if (!is_dir && (ev.mask & (IN_CLOSE_WRITE | IN_MOVED_TO))) {
      FileStat s;
      if (stat_file(path, s)) closed[path] = s;
    }
    const std::string ds = dataset_of(path);
    if (!ds.empty()) {
      auto s = sets.find(ds);
      if (s != sets.end())
        s->second.dirty = true;
      else
        root_dirty = true;
    }
  }

  /// Looks at a dataset; re-indexes it when a file changed or pending files may be complete.
  void process(const std::string& name, DatasetState& st) {
    st.dirty = false;
    const fs::path root = o.data_root / name;
    Walk walk = walk_folder(root);
    if (st.walked && walk == st.last_walk && !st.pending) return;
    reindex(name, root, walk, st);
    st.last_walk = std::move(walk);
    st.walked = true;
    for (auto it = closed.begin(); it != closed.end();) {
      auto w = st.last_walk.find(it->first);
      if (dataset_of(it->first) == name && (w == st.last_walk.end() || w->second != it->second))
        it = closed.erase(it);
      else
        ++it;
    }
  }

  void reindex(const std::string& name, const fs::path& root, const Walk& walk, DatasetState& st) {
    DatasetRecord rec;
    rec.name = name;
    rec.path = root.string();
    std::map<std::string, CaseRecord> stored;
    if (auto c = db.cases(name); c.is_ok())
      for (auto& r : *c) stored[r.case_id] = std::move(r);
    std::vector<CaseRecord> out;
    bool pending = false;
    Result<pipeline::DatasetIndex> idx = internal_error("not scanned");
    try {
      idx = pipeline::scan_dataset(root, pipeline::ScanOptions{.validate = false});
    } catch (const std::exception& e) {
      idx = internal_error(root.string() + ": scan failed: " + e.what());
    }
    if (!idx.is_ok()) {
      rec.error = idx.status().message();
    } else {
      rec.layout = pipeline::to_string(idx->layout);
      for (const auto& c : idx->cases) out.push_back(index_case(name, root, c, walk, st, stored, pending));
      for (const auto& s : idx->skipped) {
        CaseRecord r;
        r.dataset = name;
        std::string rel = s.path.lexically_relative(root).string();
        r.case_id = rel.empty() || rel.rfind("..", 0) == 0 ? s.path.string() : rel;
        FileStat fst;
        r.files = json::array();
        if (stat_file(s.path, fst)) {
          r.files.push_back({{"path", s.path.string()}, {"size", fst.size}, {"mtime_ns", fst.mtime_ns}});
          r.size = fst.size;
          r.mtime_ns = fst.mtime_ns;
        } else {
          r.files.push_back({{"path", s.path.string()}});
        }
        r.status = "bad";
        r.reason = s.reason;
        // A skipped entry may share a case id: keep both by suffixing.
        for (const auto& o2 : out)
          if (o2.case_id == r.case_id) r.case_id += " (file)";
        out.push_back(std::move(r));
      }
    }
    Status w = db.replace_dataset(rec, out);
    if (!w.is_ok()) log::error("watcher: " + w.message());
    st.pending = pending;
    if (pending)
      st.next_pending_check = Clock::now() + std::chrono::milliseconds(static_cast<int>(o.settle_s * 1000));

    std::string sig;
    std::int64_t ok = 0, bad = 0, waiting = 0, unlabelled = 0;
    for (const auto& r : out) {
      if (r.status == "ok") {
        sig += r.case_id + "|" + r.files.dump() + "\n";
        ++ok;
      } else if (r.status == "unlabelled") {
        ++unlabelled;
      } else if (r.status == "bad") {
        ++bad;
      } else {
        ++waiting;
      }
    }
    const std::size_t h = std::hash<std::string>{}(sig) ^ static_cast<std::size_t>(ok);
    log::debug("watcher: indexed " + name + ": " + std::to_string(ok) + " labelled, " +
               std::to_string(unlabelled) + " unlabelled, " + std::to_string(bad) + " bad, " +
               std::to_string(waiting) + " pending");
    // Jobs hear of a change only once the dataset is settled (nothing pending), and not of
    // the first settled state (a job started before it read the folder itself).
    if (pending) return;
    if (!st.has_baseline) {
      st.has_baseline = true;
      st.ok_signature = h;
    } else if (h != st.ok_signature) {
      st.ok_signature = h;
      log::info("watcher: dataset " + name + " now has " + std::to_string(ok) + " labelled cases (" +
                std::to_string(unlabelled) + " unlabelled, " + std::to_string(bad) + " bad, " +
                std::to_string(waiting) + " pending)");
      bump(name);
    }
  }

  CaseRecord index_case(const std::string& name, const fs::path& root, const pipeline::CaseEntry& c,
                        const Walk& walk, const DatasetState& st,
                        const std::map<std::string, CaseRecord>& stored, bool& pending) {
    CaseRecord r;
    r.dataset = name;
    r.case_id = c.id;
    std::vector<fs::path> files;
    auto add = [&](const fs::path& p) {
      std::error_code ec;
      if (fs::is_directory(p, ec)) {
        for (auto it = walk.lower_bound(p); it != walk.end(); ++it) {
          const std::string s = it->first.string(), prefix = p.string() + "/";
          if (s.rfind(prefix, 0) != 0) break;
          files.push_back(it->first);
        }
      } else {
        files.push_back(p);
      }
    };
    for (const auto& p : c.images) add(p);
    if (c.label) add(*c.label);
    std::sort(files.begin(), files.end());
    r.files = json::array();
    const fs::path* incomplete = nullptr;
    std::string vanished;
    for (const auto& p : files) {
      FileStat s;
      auto w = walk.find(p);
      if (w != walk.end())
        s = w->second;
      else if (!stat_file(p, s)) {
        vanished = p.string();
        continue;
      }
      r.files.push_back({{"path", p.string()}, {"size", s.size}, {"mtime_ns", s.mtime_ns}});
      r.size += s.size;
      r.mtime_ns = std::max(r.mtime_ns, s.mtime_ns);
      bool complete = false;
      if (auto cl = closed.find(p); cl != closed.end() && cl->second == s) complete = true;
      if (st.walked) {
        auto prev = st.last_walk.find(p);
        if (prev != st.last_walk.end() && prev->second == s) complete = true;
      }
      if (!complete && !incomplete) incomplete = &p;
    }
    if (!vanished.empty()) {
      r.status = "bad";
      r.reason = vanished + ": file disappeared while indexing";
      return r;
    }
    if (!c.label && incomplete) {
      pending = true;
      r.status = "pending";
      r.reason = incomplete->lexically_relative(root).string() + ": waiting for the file to be complete";
      return r;
    }
    if (!c.label) {
      r.status = "unlabelled";  // an image for inference; training needs a label
      r.reason = "no label: usable for inference, not for training";
      return r;
    }
    auto prev = stored.find(c.id);
    if (prev != stored.end() && prev->second.files == r.files &&
        (prev->second.status == "ok" || prev->second.status == "bad")) {
      r.status = prev->second.status;  // unchanged since it was validated
      r.reason = prev->second.reason;
      return r;
    }
    if (incomplete) {
      pending = true;
      r.status = "pending";
      r.reason = incomplete->lexically_relative(root).string() + ": waiting for the file to be complete";
      return r;
    }
    try {
      auto loaded = pipeline::load_case(c);
      if (loaded.is_ok()) {
        r.status = "ok";
      } else {
        r.status = "bad";
        r.reason = loaded.status().message();
      }
    } catch (const std::exception& e) {
      r.status = "bad";
      r.reason = std::string("case ") + c.id + ": " + e.what();
    }
    if (r.status == "bad") log::warn("watcher: " + name + "/" + c.id + ": " + r.reason);
    return r;
  }

  void run(std::atomic<bool>& ready) {
    auto next_rescan = Clock::now();
    bool first = true;
    while (!stop.load()) {
      try {
        if (fd >= 0) {
          struct pollfd p {
            fd, POLLIN, 0
          };
          if (::poll(&p, 1, 200) > 0 && (p.revents & POLLIN)) read_events();
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        const auto now = Clock::now();
        const bool quiet = now - last_event >= std::chrono::milliseconds(150);
        if (now >= next_rescan) {
          root_dirty = true;
          for (auto& [n, s] : sets) s.dirty = true;
          next_rescan = now + std::chrono::milliseconds(static_cast<int>(o.rescan_interval_s * 1000));
        }
        if (root_dirty && (quiet || first)) discover();
        for (auto& [name, st] : sets) {
          if (stop.load()) break;
          if ((st.dirty && (quiet || first)) || (st.pending && now >= st.next_pending_check))
            process(name, st);
        }
        if (first) {
          first = false;
          ready.store(true);
          log::info("watcher: indexed " + std::to_string(sets.size()) + " dataset(s) under " +
                    o.data_root.string());
        }
      } catch (const std::exception& e) {
        // Never let a file take the watcher down: report, wait a little, go on.
        log::error(std::string("watcher: ") + e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
  }
};

DatasetWatcher::DatasetWatcher(WatchOptions options, StateDb& db, ChangeFn on_change)
    : impl_(std::make_unique<Impl>(std::move(options), db, std::move(on_change))) {}

DatasetWatcher::~DatasetWatcher() {
  stop();
  if (impl_->fd >= 0) ::close(impl_->fd);
}

Status DatasetWatcher::start() {
  std::error_code ec;
  fs::create_directories(impl_->o.data_root, ec);
  if (!fs::is_directory(impl_->o.data_root, ec))
    return io_error(impl_->o.data_root.string() + ": data_root is not a folder and cannot be created");
  impl_->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (impl_->fd < 0)
    log::warn(std::string("watcher: inotify unavailable (") + std::strerror(errno) + "), rescans only");
  impl_->add_watch(impl_->o.data_root);
  thread_ = std::thread([this] { impl_->run(ready_); });
  return Status::ok();
}

void DatasetWatcher::stop() {
  impl_->stop.store(true);
  if (thread_.joinable()) thread_.join();
}

std::uint64_t DatasetWatcher::version(const std::string& dataset) const {
  std::lock_guard<std::mutex> lock(impl_->version_mu);
  auto it = impl_->versions.find(dataset);
  return it == impl_->versions.end() ? 0 : it->second;
}

Result<json> DatasetWatcher::describe(StateDb& db, const std::string& only) {
  SEGFLOW_ASSIGN_OR_RETURN(auto sets, db.datasets());
  SEGFLOW_ASSIGN_OR_RETURN(auto cases, db.cases(only));
  json out = json::array();
  for (const auto& d : sets) {
    if (!only.empty() && d.name != only) continue;
    json bad = json::array(), waiting = json::array(), unlabelled = json::array();
    std::int64_t ok = 0, bytes = 0;
    for (const auto& c : cases) {
      if (c.dataset != d.name) continue;
      json paths = json::array();
      for (const auto& f : c.files)
        if (f.contains("path")) paths.push_back(f["path"]);
      if (c.status == "ok") {
        ++ok;
        bytes += c.size;
      } else if (c.status == "unlabelled") {
        unlabelled.push_back(c.case_id);
        bytes += c.size;
      } else if (c.status == "bad") {
        bad.push_back({{"case", c.case_id}, {"files", paths}, {"reason", c.reason}});
      } else {
        waiting.push_back({{"case", c.case_id}, {"files", paths}, {"reason", c.reason}});
      }
    }
    out.push_back(
        {{"name", d.name},
         {"path", d.path},
         {"layout", d.layout},
         {"error", d.error},
         {"cases", ok + static_cast<std::int64_t>(unlabelled.size())},
         {"labelled", ok},
         {"unlabelled", static_cast<std::int64_t>(unlabelled.size())},
         {"uses", {{"training", ok}, {"inference", ok + static_cast<std::int64_t>(unlabelled.size())}}},
         {"unlabelled_cases", unlabelled},
         {"bytes", bytes},
         {"bad", static_cast<std::int64_t>(bad.size())},
         {"pending", static_cast<std::int64_t>(waiting.size())},
         {"bad_files", bad},
         {"pending_files", waiting},
         {"updated", d.updated}});
  }
  if (!only.empty() && out.empty()) return not_found("dataset '" + only + "' is not indexed under data_root");
  return out;
}

}  // namespace segflow::daemon
