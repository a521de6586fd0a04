// zerort plot METRICS.jsonl -o OUT.png|OUT.svg: loss and validation loss, learning rate, tokens/s
// and gradient norm against steps, drawn by gnuplot (Debian's gnuplot-nox). The metrics file is
// untrusted: bounded in size, each line parsed on its own (a line cut short by a killed run is
// skipped with a warning; any other bad line is an error naming it). gnuplot is started without
// a shell, on a data file and a script in a private temporary directory, and writes next to the
// output, which is renamed into place only when gnuplot succeeded.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

extern char** environ;

namespace zerort::cli {
namespace {

constexpr int64_t kMaxMetricsBytes = int64_t{1} << 30;
constexpr auto kGnuplotTimeout = std::chrono::seconds(60);

struct MetricsRow {
  int64_t step = 0;
  double loss = NAN, lr = NAN, tokens_per_s = NAN, grad_norm = NAN, val_loss = NAN;
};

StatusOr<std::vector<MetricsRow>> ReadMetrics(const std::string& path) {
  ZR_ASSIGN_OR_RETURN(const std::string text, ReadDataFile(path, kMaxMetricsBytes));
  std::vector<MetricsRow> rows;
  size_t start = 0;
  int64_t line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    const bool last = end == std::string::npos;
    if (last) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_no;
    if (line.empty()) continue;
    StatusOr<nlohmann::json> parsed = ParseJsonText(line, StrCat(path, ": line ", line_no));
    if (!parsed.ok()) {
      if (last) {  // a run killed while writing its last line
        Logger()->warn("{}: line {} is cut short; skipped", path, line_no);
        continue;
      }
      return absl::InvalidArgumentError(
          StrCat(parsed.status().message(), " (a metrics.jsonl record is one JSON object)"));
    }
    const nlohmann::json& j = *parsed;
    auto number = [&](const char* key) {
      auto it = j.is_object() ? j.find(key) : j.end();
      return it != j.end() && it->is_number() ? it->get<double>() : NAN;
    };
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
      return absl::InvalidArgumentError(StrCat(
          path, ": line ", line_no, " has no integer \"step\" (not a zerort metrics file?)"));
    }
    const int64_t step = j["step"].get<int64_t>();
    // A run resumed with --resume appends from its checkpoint's step on: its records replace
    // those the killed run wrote past that step, so the lines drawn never turn back.
    if (!rows.empty() && step <= rows.back().step) {
      const int64_t last = rows.back().step;
      int64_t dropped = 0;
      while (!rows.empty() && rows.back().step >= step) rows.pop_back(), ++dropped;
      Logger()->info(
          "{}: line {} (step {}) starts a resumed run; it replaces {} earlier "
          "record(s), steps {}..{}",
          path, line_no, step, dropped, step, last);
    }
    rows.push_back({step, number("loss"), number("lr"), number("tokens_per_s"), number("grad_norm"),
                    number("val_loss")});
  }
  if (rows.empty()) return absl::InvalidArgumentError(StrCat(path, ": no metrics records"));
  return rows;
}

std::string Value(double v) { return std::isfinite(v) ? fmt::format("{:.9g}", v) : "?"; }

// Runs gnuplot on `script`; fails on a non-zero exit, a signal or the timeout.
Status RunGnuplot(const std::string& script) {
  pid_t pid = 0;
  char* argv[] = {const_cast<char*>("gnuplot"), const_cast<char*>(script.c_str()), nullptr};
  const int err = ::posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv, environ);
  if (err == ENOENT) {
    return absl::FailedPreconditionError(
        "gnuplot is not installed (zerort plot draws through it): apt-get install gnuplot-nox");
  }
  if (err != 0) return ErrnoError("posix_spawnp gnuplot", err);
  const auto deadline = std::chrono::steady_clock::now() + kGnuplotTimeout;
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return ErrnoError("waitpid gnuplot", errno);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return absl::DeadlineExceededError("gnuplot did not finish within 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(StrCat("gnuplot failed (", WIFEXITED(status) ? "exit " : "signal ",
                                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                                      "); its messages are above"));
  }
  return absl::OkStatus();
}

Status Plot(const PlotOptions& o) {
  const std::filesystem::path out(o.out);
  const std::string ext = out.extension().string();
  if (ext != ".png" && ext != ".svg") {
    return absl::InvalidArgumentError(StrCat("-o ", o.out, ": expected a .png or .svg file name"));
  }
  // gnuplot reads paths between single quotes; a quote or newline cannot be passed through.
  for (const std::string* p : {&o.out, &o.metrics}) {
    if (p->find_first_of("'\n\r") != std::string::npos) {
      return absl::InvalidArgumentError(StrCat("\"", *p, "\": a quote or newline in a path"));
    }
  }
  std::error_code ec;
  const auto st = std::filesystem::symlink_status(out, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    return absl::InvalidArgumentError(StrCat("-o ", o.out, ": exists and is not a regular file"));
  }
  ZR_ASSIGN_OR_RETURN(const std::vector<MetricsRow> rows, ReadMetrics(o.metrics));

  // The system's temporary directory ($TMPDIR, else /tmp).
  std::string tmpl = (std::filesystem::temp_directory_path(ec) / "zerort-plot-XXXXXX").string();
  if (ec) tmpl = "/tmp/zerort-plot-XXXXXX";
  const char* dir_c = ::mkdtemp(tmpl.data());
  if (dir_c == nullptr) return ErrnoError(StrCat("mkdtemp ", tmpl), errno);
  const std::string dir(dir_c);
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code e;
      std::filesystem::remove_all(dir, e);
    }
  } cleanup{dir};

  std::string data = "# step loss lr tokens_per_s grad_norm val_loss\n";
  for (const MetricsRow& r : rows) {
    data += fmt::format("{} {} {} {} {} {}\n", r.step, Value(r.loss), Value(r.lr),
                        Value(r.tokens_per_s), Value(r.grad_norm), Value(r.val_loss));
  }
  const std::string data_path = dir + "/metrics.dat";
  ZR_RETURN_IF_ERROR(WriteFileAtomically(data_path, data, "zerort plot"));
  // gnuplot draws into a new file of zerort's beside the target ([Note: a file written beside its
  // target]), renamed over it once gnuplot has succeeded; on any failure it is removed.
  ZR_ASSIGN_OR_RETURN(FileReplacement image, FileReplacement::Begin(o.out, "zerort plot -o"));
  const std::string& partial = image.temp_path();
  const bool png = ext == ".png";
  const std::string title = std::filesystem::path(o.metrics).filename().string();
  std::string script = fmt::format(
      "set terminal {} size 1200,800 font ',10'\n"
      "set output '{}'\n"
      "set termoption noenhanced\n"
      "set datafile missing '?'\n"
      "set grid\n"
      "set key top right\n"
      "set xlabel 'step'\n"
      "set multiplot layout 2,2 title '{}'\n",
      png ? "pngcairo" : "svg", partial, title);
  // A panel whose series hold no finite value is drawn as empty axes saying so: gnuplot stops at
  // a plot with no valid point ("x range is invalid"), and such a file is real: a diverged run
  // records its loss as null, an fp16 run whose every step so far overflowed its gradient norm.
  auto any_finite = [&rows](double MetricsRow::*field) {
    return std::any_of(rows.begin(), rows.end(),
                       [field](const MetricsRow& r) { return std::isfinite(r.*field); });
  };
  const int64_t first = rows.front().step;  // ReadMetrics keeps the steps ascending
  const int64_t last = std::max(rows.back().step, first + 1);
  auto panel = [&](const char* name, bool drawn, const std::string& series) {
    if (drawn) return fmt::format("set title '{}'\nplot {}\n", name, series);
    return fmt::format(
        "set title '{} (no finite values)'\nset xrange [{}:{}]\nset yrange [0:1]\n"
        "plot 2 notitle\nset autoscale\n",  // 2: off the axes' range, nothing drawn
        name, first, last);
  };
  const std::string d = fmt::format("'{}'", data_path);
  script += panel("loss (nats per token)",
                  any_finite(&MetricsRow::loss) || any_finite(&MetricsRow::val_loss),
                  fmt::format("{0} using 1:2 with lines lw 1.5 title 'train', {0} using 1:6 with "
                              "linespoints pt 7 ps 0.6 lw 1.5 title 'validation'",
                              d));
  script += panel("learning rate", any_finite(&MetricsRow::lr),
                  d + " using 1:3 with lines lw 1.5 notitle");
  script += panel("tokens/s", any_finite(&MetricsRow::tokens_per_s),
                  d + " using 1:4 with lines lw 1.5 notitle");
  script += panel("gradient norm", any_finite(&MetricsRow::grad_norm),
                  d + " using 1:5 with lines lw 1.5 notitle");
  script += "unset multiplot\n";
  const std::string script_path = dir + "/plot.gp";
  ZR_RETURN_IF_ERROR(WriteFileAtomically(script_path, script, "zerort plot"));
  ZR_RETURN_IF_ERROR(RunGnuplot(script_path));
  return image.Commit();
}

}  // namespace

int RunPlot(const PlotOptions& o) {
  const Status s = Plot(o);
  if (!s.ok()) {
    Logger()->error("zerort plot: {}", s.message());
    return ExitCodeOf(s);
  }
  Logger()->info("wrote {}", o.out);
  return kExitOk;
}

}  // namespace zerort::cli
