// cuBLAS is loaded when first asked for, not when the program starts (runtime/internal/
// cublas_api.h): no GPU needed, only a CUDA build and the toolkit's libraries. Built with CUDA
// only.
#include "zerort/runtime/internal/cublas_api.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace zerort::internal {
namespace {

bool Mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(library) != std::string::npos;
}

TEST(CublasApiTest, LoadedOnFirstUseWithEveryEntryPoint) {
  // Linked normally, both would be mapped before main (and cost 0.35 s of start-up).
  EXPECT_FALSE(Mapped("libcublasLt.so")) << "cuBLASLt was loaded before it was asked for";
  EXPECT_FALSE(Mapped("libcublas.so")) << "cuBLAS was loaded before it was asked for";
  StatusOr<const CublasApi*> api = LoadCublas();
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_TRUE(Mapped("libcublasLt.so"));
  EXPECT_TRUE(Mapped("libcublas.so"));
  const CublasApi& b = **api;
  for (const void* fn :
       {reinterpret_cast<const void*>(b.Create), reinterpret_cast<const void*>(b.Destroy),
        reinterpret_cast<const void*>(b.SetStream), reinterpret_cast<const void*>(b.SetMathMode),
        reinterpret_cast<const void*>(b.GemmStridedBatchedEx),
        reinterpret_cast<const void*>(b.GetStatusName),
        reinterpret_cast<const void*>(b.GetStatusString), reinterpret_cast<const void*>(b.LtCreate),
        reinterpret_cast<const void*>(b.LtDestroy),
        reinterpret_cast<const void*>(b.LtMatmulDescCreate),
        reinterpret_cast<const void*>(b.LtMatmulDescDestroy),
        reinterpret_cast<const void*>(b.LtMatmulDescSetAttribute),
        reinterpret_cast<const void*>(b.LtMatrixLayoutCreate),
        reinterpret_cast<const void*>(b.LtMatrixLayoutDestroy),
        reinterpret_cast<const void*>(b.LtMatmulPreferenceCreate),
        reinterpret_cast<const void*>(b.LtMatmulPreferenceDestroy),
        reinterpret_cast<const void*>(b.LtMatmulPreferenceSetAttribute),
        reinterpret_cast<const void*>(b.LtMatmulAlgoGetHeuristic),
        reinterpret_cast<const void*>(b.LtMatmul)}) {
    EXPECT_NE(fn, nullptr);
  }
  // Usable without a GPU: a status string from the loaded library.
  EXPECT_STREQ(b.GetStatusName(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  // Loaded once: the same table again.
  StatusOr<const CublasApi*> again = LoadCublas();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *api);
}

}  // namespace
}  // namespace zerort::internal
