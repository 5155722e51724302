#pragma once
#include <torchloom/detail/strings.hpp>

#include <ATen/core/dispatch/Dispatcher.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

// What the dispatcher has registered, and what loading an op library in a short-lived child
// process registers (or torch's complaint): op_libraries.hpp loads a library here only after
// its probe showed it registers nothing already registered.

namespace torchloom::detail {

inline std::string op_name(const c10::OperatorName& n) {
  return n.overload_name.empty() ? n.name : concat(n.name, ".", n.overload_name);
}

inline std::set<std::string> registered_op_names() {
  std::set<std::string> names;
  for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) names.insert(op_name(n));
  return names;
}

// Every registered operator with what the dispatcher holds for it (its kernels per dispatch
// key, with where each was registered): a change shows a kernel added or replaced.
inline std::map<std::string, std::string> op_states() {
  std::map<std::string, std::string> states;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& n : dispatcher.getAllOpNames()) {
    if (const auto handle = dispatcher.findOp(n)) states.emplace(op_name(n), handle->dumpState());
  }
  return states;
}

inline std::string_view op_namespace(std::string_view op) {
  const auto pos = op.find("::");
  return pos == std::string_view::npos ? std::string_view() : op.substr(0, pos);
}

//! What loading a library in a child process showed.
struct op_library_probe {
  enum class outcome { registered, dlopen_failed, torch_refused, crashed };
  outcome result = outcome::crashed;
  std::vector<std::string> ops;  // registered: the operators it adds
  std::vector<std::string> changed;  // registered: operators it did not add whose kernels changed
  std::string message;           // otherwise: dlerror(), torch's message, or what happened
};

inline void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

// The end of a child's report: a report without it was cut short.
inline constexpr char probe_end = '\x04';

inline int& probe_fd() {
  static int fd = -1;
  return fd;
}

[[noreturn]] inline void probe_child(int fd, const std::string& path) {
  probe_fd() = fd;
  // torch throws from the library's static initialisers; that ends in std::terminate, or
  // unwinds out of dlopen, depending on how the library was built. Report it either way.
  std::set_terminate([] {
    std::string report = "T";
    try {
      if (auto e = std::current_exception()) std::rethrow_exception(e);
      report += "std::terminate was called";
    } catch (const std::exception& e) {
      report += e.what();
    } catch (...) {
      report += "an exception that is not a std::exception";
    }
    report += probe_end;
    write_all(probe_fd(), report);
    ::_exit(3);
  });
  std::string report;
  try {
    const auto before = op_states();
    if (::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char* why = ::dlerror();
      report = concat("E", why ? why : "dlopen failed");
    } else {
      // New operators one per line; '~' marks one that existed and whose kernels changed.
      report = "O";
      for (const auto& [op, state] : op_states()) {
        const auto it = before.find(op);
        if (it == before.end()) {
          report.append(op).push_back('\n');
        } else if (it->second != state) {
          report.append("~").append(op).push_back('\n');
        }
      }
    }
  } catch (const std::exception& e) {
    report = concat("T", e.what());
  } catch (...) {
    report = "Tan exception that is not a std::exception";
  }
  report.push_back(probe_end);
  write_all(fd, report);
  ::_exit(0);
}

//! Loads `path` in a child process and reports what it registers or why it failed.
inline op_library_probe probe_op_library(const std::string& path,
                                         std::chrono::milliseconds timeout) {
  op_library_probe probe;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    probe.message = concat("cannot create a pipe: ", std::strerror(errno));
    return probe;
  }
  // The child must not print what this process has buffered (if the library exits).
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    probe.message = concat("cannot fork a process to load it in: ", std::strerror(errno));
    ::close(fds[0]);
    ::close(fds[1]);
    return probe;
  }
  if (pid == 0) {
    ::close(fds[0]);
    probe_child(fds[1], path);
  }
  ::close(fds[1]);

  std::string report;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (report.empty() || report.back() != probe_end) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) {
      report.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  pid_t waited;
  do {
    waited = ::waitpid(pid, &status, 0);
  } while (waited < 0 && errno == EINTR);

  if (report.empty() || report.back() != probe_end) {
    if (timed_out) {
      // A child of a multithreaded process can block on a lock another thread held when
      // it was forked (torch's dispatcher, say).
      probe.message = concat("loading it in a child process did not finish within ",
                             timeout.count() / 1000,
                             " s (a lock held by another thread at fork time, or a library "
                             "whose initialisation blocks)");
    } else if (waited == pid && WIFSIGNALED(status)) {
      probe.message = concat("loading it in a child process crashed (",
                             ::strsignal(WTERMSIG(status)), ")");
    } else if (waited == pid && WIFEXITED(status)) {
      probe.message = concat("loading it in a child process ended it with status ",
                             WEXITSTATUS(status), " before it could report");
    } else {
      probe.message = "loading it in a child process ended without a report";
    }
    return probe;
  }
  report.pop_back();
  if (report.empty()) {
    probe.message = "loading it in a child process gave an empty report";
    return probe;
  }
  const char kind = report.front();
  report.erase(0, 1);
  if (kind == 'O') {
    probe.result = op_library_probe::outcome::registered;
    for (auto& op : split(report, '\n')) {
      if (op.empty()) continue;
      if (op.front() == '~') {
        probe.changed.push_back(op.substr(1));
      } else {
        probe.ops.push_back(std::move(op));
      }
    }
  } else if (kind == 'E') {
    probe.result = op_library_probe::outcome::dlopen_failed;
    probe.message = report;
  } else {
    probe.result = op_library_probe::outcome::torch_refused;
    probe.message = report;
  }
  return probe;
}

// What torch's refusal names: the operator ("Tried to register an operator (ns::op(...) ->
// ...) with the same name ...") or the namespace ("Only a single TORCH_LIBRARY can be used
// to register the namespace ns; ..."). Empty when it names neither.
// The word after `marker` in `message`, up to one of `ends`; empty without the marker.
inline std::string word_after(std::string_view message, std::string_view marker,
                              const char* ends) {
  const auto pos = message.find(marker);
  if (pos == std::string_view::npos) return {};
  const auto rest = message.substr(pos + marker.size());
  return std::string(rest.substr(0, rest.find_first_of(ends)));
}
inline std::string refused_operator(std::string_view message) {
  return word_after(message, "register an operator (", "( ");
}
inline std::string refused_namespace(std::string_view message) {
  return word_after(message, "register the namespace ", "; \n");
}

inline std::string first_line(std::string_view s) {
  return std::string(trim(s.substr(0, s.find('\n'))));
}

}  // namespace torchloom::detail
