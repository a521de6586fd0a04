// Rank 0's metrics record, line, CSV files and progress bar (metrics_sink.h).
#include "zerort/engine/metrics_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <utility>

#include "zerort/checkpoint/run_dir.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {
namespace {

std::string Mib(int64_t bytes) { return fmt::format("{:.1f}", bytes / 1048576.0); }

}  // namespace

StatusOr<std::unique_ptr<MetricsSink>> MetricsSink::Open(const MetricsSinkOptions& options) {
  std::unique_ptr<MetricsSink> sink(new MetricsSink(options));
  if (!options.csv_dir.empty()) {
    ZR_ASSIGN_OR_RETURN(sink->csv_, CsvMonitor::Open(options.csv_dir));
  }
  const std::string& path = options.metrics_file;
  if (path.empty()) return sink;
  if (!options.resume) {
    ZR_RETURN_IF_ERROR(
        CheckNewRunFile("logging.metrics_file", path, options.overwrite, "append to it"));
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  // Non-blocking open: a FIFO nobody reads is an error (ENXIO), not a hang.
  sink->fd_ = ::open(
      path.c_str(),
      O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (options.resume ? O_APPEND : O_TRUNC), 0644);
  if (sink->fd_ < 0) return ErrnoError(StrCat("open logging.metrics_file ", path), errno);
  ::fcntl(sink->fd_, F_SETFL, ::fcntl(sink->fd_, F_GETFL) & ~O_NONBLOCK);
  return sink;
}

MetricsSink::~MetricsSink() {
  if (fd_ >= 0) ::close(fd_);
}

Status MetricsSink::Close() {
  if (csv_) ZR_RETURN_IF_ERROR(csv_->Flush());
  if (fd_ < 0) return absl::OkStatus();
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0 && errno != EINVAL) {  // EINVAL: a special file (a pipe, /dev/null)
    const int err = errno;
    ::close(fd);
    return ErrnoError(StrCat("fsync logging.metrics_file ", o_.metrics_file), err);
  }
  if (::close(fd) != 0) {
    return ErrnoError(StrCat("close logging.metrics_file ", o_.metrics_file), errno);
  }
  return absl::OkStatus();
}

void MetricsSink::Emit(const nlohmann::json& record, const std::string& line) {
  if (fd_ >= 0 && write_error_.ok()) {
    write_error_ =
        WriteAll(fd_, record.dump() + "\n", StrCat("write logging.metrics_file ", o_.metrics_file));
  }
  if (!line.empty()) {
    std::fprintf(o_.out, "%s\n", line.c_str());
    std::fflush(o_.out);
  }
}

void MetricsSink::Step(const StepMetrics& m) {
  const int64_t steps = o_.steps;
  const bool last = m.step == steps;
  const bool print = m.step % o_.steps_per_print == 0 || last || m.step == 1;
  const MemorySnapshot& mem = m.memory;
  nlohmann::json memory;
  for (int cat = 0; cat < kNumMemoryCategories; ++cat) {
    const int64_t peak = mem.Get(MemoryTier::kDevice, static_cast<MemoryCategory>(cat)).peak;
    memory[std::string(MemoryCategoryName(static_cast<MemoryCategory>(cat)))] = peak;
  }
  const int64_t peak_total = mem.in_use[static_cast<int>(MemoryTier::kDevice)].peak;
  const double tokens_per_s = static_cast<double>(o_.train_batch_size) * o_.seq_len / m.seconds;
  // Per device: every rank of the mesh shares the work (a tensor-parallel group computes one
  // replica's FLOPs together), so the whole throughput is divided by the world size.
  const int devices = o_.devices;
  const double flops_per_device = o_.flops_per_token * tokens_per_s / devices;
  const double peak = o_.peak_flops;
  nlohmann::json record = {
      {"step", m.step},
      {"steps", steps},
      {"loss", m.loss},
      {"grad_norm", m.grad_norm},
      {"lr", m.lr},
      {"loss_scale", m.loss_scale},
      {"skipped", m.skipped},
      {"skipped_steps", m.skipped_steps},
      {"tokens", m.tokens},
      {"step_time_s", m.seconds},
      {"tokens_per_s", tokens_per_s},
      {"tokens_per_s_per_device", tokens_per_s / devices},
      {"tflops_per_device", flops_per_device / 1e12},
      {"mfu", peak > 0 ? nlohmann::json(flops_per_device / peak) : nlohmann::json()},
      {"peak_memory_bytes", memory},
      {"peak_memory_total_bytes", peak_total},
  };
  const double val = m.val_loss;
  if (val >= 0) record["val_loss"] = val;
  // [Note: exposed communication] (engine/comm_spans.h).
  record["comm_s"] = m.comm_s;
  record["exposed_comm_s"] = m.exposed_comm_s;
  // [Note: bytes on the wire] (runtime/comm_recorder.h).
  record["comm_bytes_intra_node"] = m.comm_bytes_intra;
  record["comm_bytes_inter_node"] = m.comm_bytes_inter;
  const std::string comm_line =
      devices > 1
          ? fmt::format(
                " | comm {:.3f} s (exposed {:.3f}), {:.2f} MB in node, {:.2f} "
                "MB across",
                m.comm_s, m.exposed_comm_s, m.comm_bytes_intra / 1e6, m.comm_bytes_inter / 1e6)
          : "";
  if (csv_ && write_error_.ok()) {  // DeepSpeed's events, stepped by global samples
    const int64_t samples = m.step * o_.train_batch_size;
    Status s = csv_->Write("Train/Samples/train_loss", samples, m.loss);
    if (s.ok()) s = csv_->Write("Train/Samples/lr", samples, m.lr);
    if (s.ok() && o_.fp16) s = csv_->Write("Train/Samples/loss_scale", samples, m.loss_scale);
    if (s.ok() && val >= 0) s = csv_->Write("Train/Samples/val_loss", samples, val);
    if (s.ok()) s = csv_->Write("Train/Samples/tokens_per_s", samples, tokens_per_s);
    if (!s.ok()) write_error_ = s;
  }
  std::string wall_line;
  if (o_.wall_clock_breakdown) {
    const StepMetrics::WallClock& w = m.wall;
    record["wall_clock_s"] = {{"forward", w.forward}, {"backward", w.backward},
                              {"reduce", w.reduce},   {"optimizer", w.optimizer},
                              {"gather", w.gather},   {"other", w.other}};
    wall_line = fmt::format(
        " | ms: fwd {:.1f} bwd {:.1f} reduce {:.1f} optim {:.1f} gather {:.1f} other {:.1f}",
        1e3 * w.forward, 1e3 * w.backward, 1e3 * w.reduce, 1e3 * w.optimizer, 1e3 * w.gather,
        1e3 * w.other);
  }
  // Offload: the host tiers' and the NVMe tier's peaks, by category, beside the device's.
  std::string offload_line;
  if (m.offload) {
    int64_t host = 0;
    nlohmann::json by_tier;
    for (MemoryTier tier : {MemoryTier::kPinnedHost, MemoryTier::kHost, MemoryTier::kNvme}) {
      nlohmann::json cats;
      for (int cat = 0; cat < kNumMemoryCategories; ++cat) {
        const int64_t p = mem.Get(tier, static_cast<MemoryCategory>(cat)).peak;
        if (p > 0) cats[std::string(MemoryCategoryName(static_cast<MemoryCategory>(cat)))] = p;
      }
      const int64_t total = mem.in_use[static_cast<int>(tier)].peak;
      if (total == 0) continue;
      by_tier[std::string(MemoryTierName(tier))] = {{"total", total}, {"by_category", cats}};
      if (tier != MemoryTier::kNvme) host += total;
    }
    record["peak_offload_bytes"] = by_tier;
    const OffloadStats& s = *m.offload;
    record["offload_time_s"] = {
        {"fetch_wait", s.fetch_wait_s},  {"grad_io", s.grad_io_s},
        {"optimizer", s.optimizer_s},    {"optimizer_io_wait", s.optimizer_io_wait_s},
        {"grad_wait", s.grad_wait_s},    {"grad_add", s.grad_add_s},
        {"update_wait", s.update_wait_s}};
    offload_line = fmt::format(
        " | host {} MiB | nvme {} MiB | optimizer {:.2f} s (io wait {:.2f}, update wait {:.2f}), "
        "fetch wait {:.2f} s, grad io {:.2f} s, grad wait {:.2f} s, grad add {:.2f} s",
        Mib(host), Mib(mem.in_use[static_cast<int>(MemoryTier::kNvme)].peak), s.optimizer_s,
        s.optimizer_io_wait_s, s.update_wait_s, s.fetch_wait_s, s.grad_io_s, s.grad_wait_s,
        s.grad_add_s);
  }
  std::string line;
  if (print) {
    line = fmt::format(
        "step {:>5}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f}{} | {:.0f} tok/s "
        "({:.0f}/device) | {:.3f} TFLOP/s/device{} | peak {} MiB (params {}, grads {}, optim "
        "{}, gathered {}, activations {}){}{}{} | skipped {}",
        m.step, steps, m.loss, val >= 0 ? fmt::format(" | val {:.4f}", val) : "", m.lr, m.grad_norm,
        o_.fp16 ? fmt::format(" | scale {}", m.loss_scale) : "", tokens_per_s,
        tokens_per_s / devices, flops_per_device / 1e12,
        peak > 0 ? fmt::format(" | MFU {:.1f}%", 100 * flops_per_device / peak) : "",
        Mib(peak_total), Mib(memory["parameters"].get<int64_t>()),
        Mib(memory["gradients"].get<int64_t>()), Mib(memory["optimizer_state"].get<int64_t>()),
        Mib(memory["gathered_weights"].get<int64_t>()), Mib(memory["activations"].get<int64_t>()),
        comm_line, offload_line, wall_line, m.skipped_steps);
    if (o_.progress_bar) line = "\r\033[K" + line;
  }
  Emit(record, line);
  if (o_.progress_bar && !last) {
    const int width = 30;
    const int done = static_cast<int>(width * m.step / steps);
    std::fprintf(o_.out, "\r[%s%s] %lld/%lld", std::string(done, '#').c_str(),
                 std::string(width - done, '.').c_str(), static_cast<long long>(m.step),
                 static_cast<long long>(steps));
    std::fflush(o_.out);
  }
}

}  // namespace zerort
