// The CUDA model kernels' cuBLASLt matmuls (internal to kernels/cuda/, included by
// model_kernels.cu only): a plan per distinct matmul, made on first use and kept, with the bias
// or a GELU epilogue ([Note: cuBLASLt plans], [Note: cuBLASLt epilogues]).
#pragma once

#include <cublasLt.h>

#include <map>
#include <string>
#include <tuple>

#include "zerort/kernels/gemm_map.h"
#include "zerort/runtime/internal/cublas_api.h"
#include "zerort/runtime/internal/cuda_check.h"
#include "zerort/runtime/status.h"

namespace zerort {
namespace {

// [Note: cuBLASLt plans]
// One plan per distinct matmul: its gemm::ColumnMajor shape, the operand types, whether a bias
// is fused, and the alignment of each operand's pointer. A plan holds the descriptors, layouts
// and the heuristic's algorithm, made on first use and kept for the kernels' life (a GPT model
// has a few dozen distinct matmuls; rebuilding them cost a heuristic query per call). The
// alignments are gemm::PointerAlignment of the real pointers, given to the heuristic as the
// preference's minimum alignments: weights are sub-views of flat buffers aligned to 32 bytes in
// bf16 (FlatLayout::kDefaultAlignment), and without the preference cuBLASLt assumes 256 bytes and
// may pick an algorithm that needs them. The bias pointer, which changes between layers, is set
// on the plan's descriptor before each call.
// [Note: cuBLASLt epilogues] A plan's epilogue: the bias (the linear layers' forward) and, for
// the MLP in 16 bits, GELU with its input kept (GELU_AUX(_BIAS): D = GELU(x), the auxiliary
// output x = the product + bias, both in D's type, ld = D's rows), so that MatmulGelu is one
// launch instead of a GEMM and a GELU pass; and in the backward GELU's derivative (DGELU: the
// projection's input gradient times gelu'(aux), aux = the forward's pre), so that
// GeluMatmulBackward writes dpre in one GEMM instead of two fills, a GEMM and a GELU backward
// pass; and with fp32 weight gradients from 16-bit activations, the bias gradient as BGRADB
// (the weight-gradient GEMM's B = dout summed over its rows, written in fp32 to the last 64 KiB
// of the workspace and added into dbias by a kernel of out_features threads: the bias-gradient
// kernel read all of dout again). Not an epilogue but beside them: MatmulResidual's residual
// as the matmul's C (beta 1, C its own matrix of D's layout: cuBLASLt's out-of-place form), so
// that a linear layer into the residual stream writes out = product + bias + residual at once. fp32
// keeps the separate kernels: its GELU is the CPU's bit for bit (kernels/model_math.h), cuBLASLt's
// is its own.
class LtMatmuls {
 public:
  explicit LtMatmuls(const internal::CublasApi& blas) : b_(blas) {}
  LtMatmuls(const LtMatmuls&) = delete;
  LtMatmuls& operator=(const LtMatmuls&) = delete;
  ~LtMatmuls() {
    for (auto& [key, plan] : plans_) DestroyPlan(plan);
  }
  // The handle, the workspace of `workspace_bytes` and the stream every matmul runs with.
  void Bind(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    lt_ = lt;
    workspace_ = workspace;
    workspace_bytes_ = workspace_bytes;
    stream_ = stream;
  }

  // Column-major D = op(A) x op(B) + beta C (gemm::ColumnMajor), fp32 compute, C = D unless `c`
  // is given (D's type and layout: the residual of MatmulResidual); with `bias` (length m, D's
  // type) fused as the epilogue, and with `aux` D = GELU of that, the product + bias written to
  // aux; with `dgelu`, D = gelu'(aux) x the product, aux read; with `bgrad` (length n, D's type)
  // written with op(B)'s sums over k ([Note: cuBLASLt epilogues]).
  Status Run(const gemm::ColumnMajor& g, const void* a, cudaDataType_t a_type, const void* b,
             cudaDataType_t b_type, void* d, cudaDataType_t d_type, float beta, const void* bias,
             const void* aux = nullptr, bool dgelu = false, void* bgrad = nullptr,
             const void* c = nullptr) {
    if (g.m == 0 || g.n == 0) return absl::OkStatus();  // an empty result: nothing to compute
    if (g.k == 0) {                                     // no rows in a weight gradient: D += 0
      if (beta == 1.0f && bias == nullptr) return absl::OkStatus();
      return absl::InvalidArgumentError("a " + std::to_string(g.m) + "x" + std::to_string(g.n) +
                                        " matmul with no inner dimension");
    }
    if (c == nullptr) c = d;
    ZR_ASSIGN_OR_RETURN(LtPlan * plan, PlanFor(KeyFor(g, a, a_type, b, b_type, d, d_type, bias, aux,
                                                      dgelu, bgrad, c),
                                               aux, bgrad));
    if (bias != nullptr || bgrad != nullptr) {
      const void* vector = bias != nullptr ? bias : bgrad;
      ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulDescSetAttribute(
          plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector, sizeof(vector)));
    }
    if (aux != nullptr) {
      ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulDescSetAttribute(
          plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    }
    const float alpha = 1.0f;
    const size_t ws = workspace_bytes_;
    ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmul(lt_, plan->op, &alpha, a, plan->la, b, plan->lb, &beta, c,
                                          plan->ld, d, plan->ld, &plan->algo, workspace_, ws,
                                          stream_));
    ++calls_;
    return absl::OkStatus();
  }

  // Whether cuBLASLt has a plan for this matmul and epilogue (Run's arguments; the plan is kept).
  bool Plannable(const gemm::ColumnMajor& g, const void* a, cudaDataType_t a_type, const void* b,
                 cudaDataType_t b_type, const void* d, cudaDataType_t d_type, const void* bias,
                 const void* aux, bool dgelu, void* bgrad = nullptr, const void* c = nullptr) {
    return PlanFor(KeyFor(g, a, a_type, b, b_type, d, d_type, bias, aux, dgelu, bgrad,
                          c != nullptr ? c : d),
                   aux, bgrad)
        .ok();
  }
  int64_t calls() const { return calls_; }  // matmuls run

 private:
  enum class LtEpilogue { kNone, kBias, kGeluAux, kGeluAuxBias, kDGelu, kBGradB };
  struct LtKey {
    gemm::ColumnMajor g;
    cudaDataType_t a_type, b_type, d_type;
    LtEpilogue epilogue;
    uint32_t align_a, align_b, align_d, align_aux, align_c;
    auto Tie() const {
      return std::tie(g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, a_type, b_type,
                      d_type, epilogue, align_a, align_b, align_d, align_aux, align_c);
    }
    bool operator<(const LtKey& o) const { return Tie() < o.Tie(); }
  };
  struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  StatusOr<LtPlan*> PlanFor(const LtKey& key, const void* aux, const void* bgrad) {
    if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
    const gemm::ColumnMajor& g = key.g;
    LtPlan plan;
    cublasLtMatmulPreference_t pref = nullptr;
    Status status = [&]() -> Status {
      ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      ZR_CUBLAS_RETURN_IF_ERROR(
          b_.LtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      ZR_CUBLAS_RETURN_IF_ERROR(
          b_.LtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      const bool bias =
          key.epilogue == LtEpilogue::kBias || key.epilogue == LtEpilogue::kGeluAuxBias;
      const bool dgelu = key.epilogue == LtEpilogue::kDGelu;
      const bool bgradb = key.epilogue == LtEpilogue::kBGradB;
      const bool gelu =
          dgelu || key.epilogue == LtEpilogue::kGeluAux || key.epilogue == LtEpilogue::kGeluAuxBias;
      if (key.epilogue != LtEpilogue::kNone) {
        const cublasLtEpilogue_t epilogue = bgradb  ? CUBLASLT_EPILOGUE_BGRADB
                                            : dgelu ? CUBLASLT_EPILOGUE_DGELU
                                            : !gelu ? CUBLASLT_EPILOGUE_BIAS
                                            : bias  ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                    : CUBLASLT_EPILOGUE_GELU_AUX;
        ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulDescSetAttribute(
            plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
      }
      if (bias) {
        const cudaDataType_t bias_type = key.d_type;
        ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulDescSetAttribute(
            plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
      }
      if (bgradb) {  // written in D's type (cublasLt.h); the heuristic reads its alignment
        ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulDescSetAttribute(
            plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bgrad, sizeof(bgrad)));
      }
      if (gelu) {  // [Note: cuBLASLt epilogues]; the heuristic reads the pointer's alignment
        const int64_t aux_ld = g.m;
        const int32_t aux_type = key.d_type;
        ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulDescSetAttribute(
            plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulDescSetAttribute(
            plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
        ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulDescSetAttribute(
            plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
      }
      ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatrixLayoutCreate(&plan.la, key.a_type, g.trans_a ? g.k : g.m,
                                                        g.trans_a ? g.m : g.k, g.lda));
      ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatrixLayoutCreate(&plan.lb, key.b_type, g.trans_b ? g.n : g.k,
                                                        g.trans_b ? g.k : g.n, g.ldb));
      ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatrixLayoutCreate(&plan.ld, key.d_type, g.m, g.n, g.ldd));
      ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulPreferenceCreate(&pref));
      const size_t ws = workspace_bytes_;
      ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
      for (const auto& [attribute, bytes] : alignments) {
        ZR_CUBLAS_RETURN_IF_ERROR(
            b_.LtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof(bytes)));
      }
      cublasLtMatmulHeuristicResult_t heuristic{};
      int found = 0;
      ZR_CUBLAS_RETURN_IF_ERROR(b_.LtMatmulAlgoGetHeuristic(lt_, plan.op, plan.la, plan.lb, plan.ld,
                                                            plan.ld, pref, 1, &heuristic, &found));
      if (found == 0) {
        using std::to_string;
        return absl::UnimplementedError(
            "cuBLASLt has no algorithm for the " + to_string(g.m) + "x" + to_string(g.n) + "x" +
            to_string(g.k) + " matmul (transa " + to_string(g.trans_a) + ", transb " +
            to_string(g.trans_b) + ", alignments " + to_string(key.align_a) + "/" +
            to_string(key.align_b) + "/" + to_string(key.align_d) + " bytes)");
      }
      plan.algo = heuristic.algo;
      return absl::OkStatus();
    }();
    if (pref != nullptr) b_.LtMatmulPreferenceDestroy(pref);
    if (!status.ok()) {
      DestroyPlan(plan);
      return status;
    }
    LtPlan& kept = plans_[key];
    kept = plan;
    return &kept;
  }
  void DestroyPlan(LtPlan& plan) {
    if (plan.ld != nullptr) b_.LtMatrixLayoutDestroy(plan.ld);
    if (plan.lb != nullptr) b_.LtMatrixLayoutDestroy(plan.lb);
    if (plan.la != nullptr) b_.LtMatrixLayoutDestroy(plan.la);
    if (plan.op != nullptr) b_.LtMatmulDescDestroy(plan.op);
  }

  // `dgelu`: aux is GELU's input, read (kDGelu); otherwise a non-null aux is written (GELU_AUX).
  // A non-null `bgrad` is BGRADB's output (kBGradB; its alignment kept as aux's). `c`: C (D, or
  // a separate matrix of D's layout).
  LtKey KeyFor(const gemm::ColumnMajor& g, const void* a, cudaDataType_t a_type, const void* b,
               cudaDataType_t b_type, const void* d, cudaDataType_t d_type, const void* bias,
               const void* aux, bool dgelu, const void* bgrad, const void* c) const {
    const LtEpilogue epilogue =
        bgrad != nullptr  ? LtEpilogue::kBGradB
        : dgelu           ? LtEpilogue::kDGelu
        : aux != nullptr  ? (bias != nullptr ? LtEpilogue::kGeluAuxBias : LtEpilogue::kGeluAux)
        : bias != nullptr ? LtEpilogue::kBias
                          : LtEpilogue::kNone;
    return {g,
            a_type,
            b_type,
            d_type,
            epilogue,
            gemm::PointerAlignment(a),
            gemm::PointerAlignment(b),
            gemm::PointerAlignment(d),
            aux != nullptr     ? gemm::PointerAlignment(aux)
            : bgrad != nullptr ? gemm::PointerAlignment(bgrad)
                               : 0,
            gemm::PointerAlignment(c)};
  }

  const internal::CublasApi& b_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::map<LtKey, LtPlan> plans_;  // [Note: cuBLASLt plans]
  int64_t calls_ = 0;
};

}  // namespace
}  // namespace zerort
