// CudaCodeFor, CheckCudaDevice, DescribeCudaArchitectures (cuda_arch.h; [Note: the GPUs a build
// runs on]).
#include "zerort/runtime/cuda_arch.h"

#include <optional>
#include <vector>

#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// One entry of CMake's CUDA_ARCHITECTURES: "90", "90-real", "90-virtual", "90a", "100f-real".
struct Arch {
  int cc = 0;      // major x 10 + minor
  char variant{};  // 0, 'a' (this capability only) or 'f' (this major's family)
  bool sass = false;
  bool ptx = false;
  std::string name() const { return StrCat(cc, variant == 0 ? "" : std::string(1, variant)); }
};

// The entries, or nullopt when one is not a number CMake resolves here ("all", "native", "").
std::optional<std::vector<Arch>> Parse(std::string_view list) {
  std::vector<Arch> out;
  while (!list.empty()) {
    const size_t end = list.find(';');
    std::string_view e = list.substr(0, end);
    list = end == std::string_view::npos ? std::string_view{} : list.substr(end + 1);
    Arch a;
    a.sass = a.ptx = true;
    if (e.ends_with("-real")) {
      a.ptx = false;
      e.remove_suffix(5);
    } else if (e.ends_with("-virtual")) {
      a.sass = false;
      e.remove_suffix(8);
    }
    if (!e.empty() && (e.back() == 'a' || e.back() == 'f')) {
      a.variant = e.back();
      e.remove_suffix(1);
    }
    if (e.empty() || e.size() > 4) return std::nullopt;
    for (const char c : e) {
      if (c < '0' || c > '9') return std::nullopt;
      a.cc = a.cc * 10 + (c - '0');
    }
    out.push_back(a);
  }
  if (out.empty()) return std::nullopt;
  return out;
}

// Whether code for `a` (its SASS when `sass`, else its PTX) runs on capability `cc`.
bool Runs(const Arch& a, bool sass, int cc) {
  if (a.variant == 'a') return cc == a.cc;
  if (sass || a.variant == 'f') return cc / 10 == a.cc / 10 && cc >= a.cc;
  return cc >= a.cc;  // PTX: compiled for newer devices by the driver
}

}  // namespace

CudaCodeFit CudaCodeFor(std::string_view architectures, int major, int minor) {
  const std::optional<std::vector<Arch>> archs = Parse(architectures);
  if (!archs.has_value()) return CudaCodeFit::kUnknown;
  const int cc = major * 10 + minor;
  bool ptx = false;
  for (const Arch& a : *archs) {
    if (a.sass && Runs(a, true, cc)) return CudaCodeFit::kBinary;
    if (a.ptx && Runs(a, false, cc)) ptx = true;
  }
  return ptx ? CudaCodeFit::kPtx : CudaCodeFit::kNone;
}

std::string DescribeCudaArchitectures(std::string_view architectures) {
  const std::optional<std::vector<Arch>> archs = Parse(architectures);
  if (!archs.has_value()) return StrCat("\"", architectures, "\" (CMake's to resolve)");
  std::vector<std::string> parts;
  for (const Arch& a : *archs) {
    if (a.sass) parts.push_back(StrCat("sm_", a.name()));
  }
  for (const Arch& a : *archs) {
    if (a.ptx) parts.push_back(StrCat("PTX for compute_", a.name()));
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    out += i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ";
    out += parts[i];
  }
  return out;
}

Status CheckCudaDevice(std::string_view architectures, int major, int minor,
                       std::string_view device) {
  const int cc = major * 10 + minor;
  if (cc < kMinCudaComputeCapability) {
    return absl::FailedPreconditionError(StrCat(
        device, " is compute capability ", major, ".", minor, "; zerort's CUDA kernels need ",
        kMinCudaComputeCapability / 10, ".", kMinCudaComputeCapability % 10,
        " or later (bf16 tensor-core products, cp.async): train.device \"cpu\" runs here"));
  }
  if (CudaCodeFor(architectures, major, minor) != CudaCodeFit::kNone) return absl::OkStatus();
  return absl::FailedPreconditionError(StrCat(
      device, " is compute capability ", major, ".", minor,
      ", and this build of zerort holds GPU code for ", DescribeCudaArchitectures(architectures),
      " (CMAKE_CUDA_ARCHITECTURES \"", architectures,
      "\"), none of which runs on it: rebuild with -DCMAKE_CUDA_ARCHITECTURES=\"", architectures,
      ";", cc, "-real\""));
}

}  // namespace zerort
