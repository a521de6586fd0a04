// Loads cuBLAS and cuBLASLt on first use (runtime/internal/cublas_api.h).
#include "zerort/runtime/internal/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "zerort/runtime/strings.h"

namespace zerort::internal {
namespace {

// dlopen by soname, then at the build's toolkit path; the message names both attempts.
StatusOr<void*> Open(const std::string& soname, std::string& tried) {
  for (const std::string& name : {soname, std::string(ZR_CUDA_LIBRARY_DIR "/") + soname}) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* why = dlerror();
    StrAppend(&tried, tried.empty() ? "" : "; ", why != nullptr ? why : name);
  }
  return absl::FailedPreconditionError(
      StrCat("cuBLAS could not be loaded (", tried,
             "): a GPU run needs CUDA's libraries; put their directory on LD_LIBRARY_PATH"));
}

template <typename Fn>
Status Resolve(void* handle, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (fn == nullptr) {
    return absl::FailedPreconditionError(StrCat("cuBLAS has no ", symbol, " (", dlerror(),
                                                "): zerort was built against CUDA ", ZR_CUDA_MAJOR,
                                                ", whose cuBLAS has it"));
  }
  return absl::OkStatus();
}

StatusOr<CublasApi> Load() {
  std::string tried;
  // libcublas depends on libcublasLt: load Lt first so that its own lookup finds the same file.
  ZR_ASSIGN_OR_RETURN(void* lt, Open(StrCat("libcublasLt.so.", ZR_CUDA_MAJOR), tried));
  ZR_ASSIGN_OR_RETURN(void* blas, Open(StrCat("libcublas.so.", ZR_CUDA_MAJOR), tried));
  CublasApi api{};
  ZR_RETURN_IF_ERROR(Resolve(blas, "cublasCreate_v2", api.Create));
  ZR_RETURN_IF_ERROR(Resolve(blas, "cublasDestroy_v2", api.Destroy));
  ZR_RETURN_IF_ERROR(Resolve(blas, "cublasSetStream_v2", api.SetStream));
  ZR_RETURN_IF_ERROR(Resolve(blas, "cublasSetMathMode", api.SetMathMode));
  ZR_RETURN_IF_ERROR(Resolve(blas, "cublasGemmStridedBatchedEx", api.GemmStridedBatchedEx));
  ZR_RETURN_IF_ERROR(Resolve(blas, "cublasGetStatusName", api.GetStatusName));
  ZR_RETURN_IF_ERROR(Resolve(blas, "cublasGetStatusString", api.GetStatusString));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtCreate", api.LtCreate));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtDestroy", api.LtDestroy));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtMatmulDescCreate", api.LtMatmulDescCreate));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtMatmulDescDestroy", api.LtMatmulDescDestroy));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtMatmulDescSetAttribute", api.LtMatmulDescSetAttribute));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtMatrixLayoutCreate", api.LtMatrixLayoutCreate));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtMatrixLayoutDestroy", api.LtMatrixLayoutDestroy));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtMatmulPreferenceCreate", api.LtMatmulPreferenceCreate));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtMatmulPreferenceDestroy", api.LtMatmulPreferenceDestroy));
  ZR_RETURN_IF_ERROR(
      Resolve(lt, "cublasLtMatmulPreferenceSetAttribute", api.LtMatmulPreferenceSetAttribute));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtMatmulAlgoGetHeuristic", api.LtMatmulAlgoGetHeuristic));
  ZR_RETURN_IF_ERROR(Resolve(lt, "cublasLtMatmul", api.LtMatmul));
  return api;
}

}  // namespace

StatusOr<const CublasApi*> LoadCublas() {
  // One table per process, as the libraries it points into are loaded once per process.
  static const StatusOr<CublasApi> api = Load();
  if (!api.ok()) return api.status();
  return &*api;
}

}  // namespace zerort::internal
