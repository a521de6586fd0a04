// ModelKernels on CUDA: the GPT model's operations for fp32, bf16 or fp16 activations/weights and
// fp32 or bf16 weight gradients, fp32 accumulation everywhere. GEMMs of the linear layers through
// cuBLASLt (bias fused as an epilogue in the forward; gradients accumulated with beta = 1);
// attention through zerort's flash kernels (kernels/flash_attention.h) for bf16/fp16 at head
// sizes 64 and 128, else the materialised program (materialised_attention.cuh: strided-batched
// cuBLAS GEMMs with a causal softmax kernel between them; kernels/memory_facts.h's
// AttentionProgramFor chooses); the element-wise ops, LayerNorm and the fused softmax
// cross-entropy as kernels here. Same three layers per op as the rest of kernels/cuda: a static
// __global__ kernel, a launcher on raw pointers and a stream, and the public method that
// validates and returns Status. The kernels and their launchers are model_ops.cuh and
// llama_ops.cuh; this file is the interface.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/cuda/launch_context.cuh"
#include "zerort/kernels/cuda/llama_ops.cuh"
#include "zerort/kernels/cuda/lt_matmul.cuh"
#include "zerort/kernels/cuda/materialised_attention.cuh"
#include "zerort/kernels/cuda/model_ops.cuh"
#include "zerort/kernels/cuda/norm_backward.cuh"
#include "zerort/kernels/cudnn_attention.h"
#include "zerort/kernels/flash_attention.h"
#include "zerort/kernels/gemm_map.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/internal/cublas_api.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

// ---- the interface ---------------------------------------------------------------------------

struct LtDeleter {
  decltype(&cublasLtDestroy) destroy;
  void operator()(cublasLtContext* h) const { destroy(h); }
};

template <typename T, typename G>
class CudaModelKernels final : public ModelKernels {
 public:
  CudaModelKernels(const internal::CublasApi& blas, Stream& stream, Allocator& workspace, DType act,
                   DType grad, std::optional<AttentionProgram> attention, const FlashTiles& tiles)
      : b_(blas),
        stream_(stream),
        ws_(workspace),
        act_(act),
        grad_(grad),
        attention_(attention),
        tiles_(tiles),
        lt_(nullptr, LtDeleter{blas.LtDestroy}),
        lt_matmuls_(blas),
        materialised_(blas, ctx_) {}

  Status Init() {
    cublasLtHandle_t lt = nullptr;
    ZR_CUBLAS_RETURN_IF_ERROR(b_.LtCreate(&lt));
    lt_.reset(lt);
    ZR_RETURN_IF_ERROR(materialised_.Init());
    if (attention_ == AttentionProgram::kCudnn) {  // [Note: the cuDNN attention]
      ZR_ASSIGN_OR_RETURN(cudnn_, internal::CudnnAttention::Create(stream_));
    }
    ZR_ASSIGN_OR_RETURN(lt_workspace_, ws_.Allocate(kCudaModelWorkspaceBytes,
                                                    MemoryCategory::kWorkspace, &stream_));
    lt_matmuls_.Bind(lt, lt_workspace_.data(), kLtWorkspace - kLtBiasGradBytes, s());
    ZR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(Ledger(), 0, sizeof(float), s()));
    ++launches_["memset"];
    return absl::OkStatus();
  }

  Device device() const override { return stream_.device(); }
  Stream& stream() override { return stream_; }
  size_t act_size() const override { return sizeof(T); }
  KernelBackend backend() const override { return KernelBackend::kCuda; }
  size_t grad_size() const override { return sizeof(G); }
  size_t stat_size() const override { return sizeof(float); }
  std::optional<DType> act_dtype() const override { return act_; }
  std::optional<DType> grad_dtype() const override { return grad_; }
  std::optional<DType> stat_dtype() const override { return DType::kF32; }
  AttentionProgram attention_program(int batch, int heads, int head_size) const override {
    return AttentionProgramFor(backend(), sizeof(T), batch, heads, head_size, attention_);
  }
  std::optional<std::map<std::string, int64_t>> launches() const override {
    std::map<std::string, int64_t> by_name;  // the same name may be two literals' addresses
    for (const auto& [what, n] : launches_) by_name[what] += n;
    if (lt_matmuls_.calls() > 0) by_name["cuBLASLt matmul"] += lt_matmuls_.calls();
    return by_name;
  }

  Status ActToHost(const void* src, int64_t n, double* out) override {
    std::vector<T> host(n);
    ZR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost, s()));
    ++launches_["copy to host"];
    ZR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(static_cast<float>(host[i]));
    return absl::OkStatus();
  }
  Status StatToHost(const void* src, int64_t n, double* out) override {
    std::vector<float> host(n);
    ZR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost, s()));
    ++launches_["copy to host"];
    ZR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
    std::copy(host.begin(), host.end(), out);
    return absl::OkStatus();
  }
  // [Note: the training loss ledger]: reduced on the device into the fp32 ledger after the
  // cuBLASLt workspace; read (one wait) and zeroed once per step.
  Status AddToLossLedger(const void* src, int64_t n, double divisor) override {
    ++launches_["loss ledger sum"];
    return internal::CudaSum(src, DType::kF32, n, static_cast<float>(1.0 / divisor), Ledger(),
                             &stream_);
  }
  StatusOr<double> TakeLossLedger() override {
    float host = 0;
    ZR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&host, Ledger(), sizeof(float), cudaMemcpyDeviceToHost, s()));
    ++launches_["copy to host"];
    ZR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
    ZR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(Ledger(), 0, sizeof(float), s()));
    ++launches_["memset"];
    return static_cast<double>(host);
  }

  Status Embedding(void* out, const int32_t* tokens, const void* wte, const void* wpe, int batch,
                   int seq, int channels, int vocab_begin, int vocab_count) override {
    const int64_t n = int64_t{batch} * seq * channels;
    EmbeddingKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(out), tokens, A(wte), A(wpe), seq,
                                                        channels, vocab_begin, vocab_count, n);
    return Launched("Embedding");
  }
  Status EmbeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                           int batch, int seq, int channels, int vocab_begin,
                           int vocab_count) override {
    const int64_t n = int64_t{batch} * seq * channels;
    if constexpr (sizeof(G) == sizeof(float)) {
      EmbeddingBackwardKernel<T><<<Blocks(n), kThreads, 0, s()>>>(
          Gp(dwte), Gp(dwpe), A(dout), tokens, seq, channels, vocab_begin, vocab_count, n);
      return Launched("EmbeddingBackward");
    } else {
      // 16-bit gradients: a 16-bit atomic add rounds every addition, so a token seen a few
      // hundred times stops growing (bf16: 256 + 1 = 256). The call's sums are made in fp32
      // scratch and added into the gradients once, rounded once, as the CPU kernels do.
      const int64_t wte_n = dwte != nullptr ? int64_t{vocab_count} * channels : 0;
      const int64_t wpe_n = dwpe != nullptr ? int64_t{seq} * channels : 0;
      ZR_ASSIGN_OR_RETURN(Buffer acc, Scratch(EmbeddingBackwardScratchBytes(
                                          backend(), sizeof(G), dwte != nullptr ? vocab_count : 0,
                                          dwpe != nullptr ? seq : 0, channels)));
      if (acc.bytes() == 0) return absl::OkStatus();
      ZR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc.data(), 0, acc.bytes(), s()));
      ++launches_["memset"];
      float* acc_wte = dwte != nullptr ? acc.as<float>() : nullptr;
      float* acc_wpe = dwpe != nullptr ? acc.as<float>() + wte_n : nullptr;
      EmbeddingBackwardKernel<T><<<Blocks(n), kThreads, 0, s()>>>(
          acc_wte, acc_wpe, A(dout), tokens, seq, channels, vocab_begin, vocab_count, n);
      ZR_RETURN_IF_ERROR(Launched("EmbeddingBackward"));
      if (wte_n > 0) LaunchAccumulate(Gp(dwte), acc_wte, wte_n);
      if (wpe_n > 0) LaunchAccumulate(Gp(dwpe), acc_wpe, wpe_n);
      return Launched("EmbeddingBackward (16-bit gradients)");
    }
  }

  Status LayerNorm(void* out, void* mean, void* rstd, const void* inp, const void* weight,
                   const void* bias, int64_t rows, int channels) override {
    ByWidth(Vectorisable(channels, {out, inp, weight, bias}), [&](auto w) {
      LayerNormKernel<T, decltype(w)::value><<<RowBlocks(rows), kThreads, 0, s()>>>(
          A(out), static_cast<float*>(mean), static_cast<float*>(rstd), A(inp), nullptr, nullptr,
          A(weight), A(bias), rows, channels);
    });
    return Launched("LayerNorm");
  }
  // One launch for the residual connection and the norm after it (the default is two).
  Status AddLayerNorm(void* sum, void* out, void* mean, void* rstd, const void* a, const void* b,
                      const void* weight, const void* bias, int64_t rows, int channels) override {
    if (rows == 0) return absl::OkStatus();
    ByWidth(Vectorisable(channels, {out, a, b, sum, weight, bias}), [&](auto w) {
      LayerNormKernel<T, decltype(w)::value><<<RowBlocks(rows), kThreads, 0, s()>>>(
          A(out), static_cast<float*>(mean), static_cast<float*>(rstd), A(a), A(b), A(sum),
          A(weight), A(bias), rows, channels);
    });
    return Launched("AddLayerNorm");
  }
  Status LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                           const void* inp, const void* weight, const void* mean, const void* rstd,
                           int64_t rows, int channels) override {
    if (rows == 0) return absl::OkStatus();  // nothing to add (and no grid of 0 rows)
    const auto* m = static_cast<const float*>(mean);
    const auto* r = static_cast<const float*>(rstd);
    if (dinp != nullptr && (dweight != nullptr || dbias != nullptr)) {
      return NormBackward<ColumnSum::kLayerNorm>(dinp, dweight, dbias, dout, inp, weight, m, r,
                                                 rows, channels, "LayerNormBackward");
    }
    if (dinp != nullptr) {
      ByWidth(Vectorisable(channels, {dinp, dout, inp, weight}), [&](auto w) {
        LayerNormInputGradKernel<T, decltype(w)::value><<<RowBlocks(rows), kThreads, 0, s()>>>(
            A(dinp), A(dout), A(inp), A(weight), m, r, rows, channels);
      });
      return Launched("LayerNormBackward");
    }
    if (dweight == nullptr && dbias == nullptr) return absl::OkStatus();
    return SumColumns<ColumnSum::kLayerNorm>(dweight, dbias, dout, inp, m, r, rows, channels);
  }

  Status Matmul(void* out, const void* inp, const void* weight, const void* bias, int64_t rows,
                int in, int out_features) override {
    // Column-major view: out^T [out, rows] = W [out, in] (stored [in, out]^T) x inp^T [in, rows].
    return lt_matmuls_.Run(gemm::LinearForward(rows, in, out_features), weight, CudaType<T>(), inp,
                           CudaType<T>(), out, CudaType<T>(), 0.0f, bias);
  }
  // [Note: cuBLASLt epilogues]: out = the product + bias + residual as one cuBLASLt call, the
  // residual its C (beta 1), out rounded once, where cuBLASLt has an algorithm for it; otherwise
  // the default's Matmul then Add. A plan cuBLASLt refuses is not asked for again.
  Status MatmulResidual(void* out, const void* inp, const void* weight, const void* bias,
                        const void* residual, int64_t rows, int in, int out_features) override {
    if (residual_c_ && out != residual && rows > 0) {
      const gemm::ColumnMajor g = gemm::LinearForward(rows, in, out_features);
      if (lt_matmuls_.Plannable(g, weight, CudaType<T>(), inp, CudaType<T>(), out, CudaType<T>(),
                                bias, nullptr, /*dgelu=*/false, nullptr, residual)) {
        return lt_matmuls_.Run(g, weight, CudaType<T>(), inp, CudaType<T>(), out, CudaType<T>(),
                               1.0f, bias, nullptr, /*dgelu=*/false, nullptr, residual);
      }
      residual_c_ = false;
    }
    return ModelKernels::MatmulResidual(out, inp, weight, bias, residual, rows, in, out_features);
  }
  // [Note: cuBLASLt epilogues]: in 16 bits one cuBLASLt call writes pre and out = GELU(pre)
  // where cuBLASLt has an algorithm for it (pre's leading dimension a multiple of 8); otherwise,
  // and in fp32, a GEMM then the GELU kernel. A plan cuBLASLt refuses is not asked for again.
  Status MatmulGelu(void* pre, void* out, const void* inp, const void* weight, const void* bias,
                    int64_t rows, int in, int out_features) override {
    if (!std::is_same_v<T, float> && gelu_epilogue_ && out_features % 8 == 0 && rows > 0) {
      const gemm::ColumnMajor g = gemm::LinearForward(rows, in, out_features);
      if (lt_matmuls_.Plannable(g, weight, CudaType<T>(), inp, CudaType<T>(), out, CudaType<T>(),
                                bias, pre, /*dgelu=*/false)) {
        return lt_matmuls_.Run(g, weight, CudaType<T>(), inp, CudaType<T>(), out, CudaType<T>(),
                               0.0f, bias, pre);
      }
      gelu_epilogue_ = false;
    }
    return ModelKernels::MatmulGelu(pre, out, inp, weight, bias, rows, in, out_features);
  }
  // [Note: cuBLASLt epilogues]: in 16 bits dpre = gelu'(pre) x (dout W) is one cuBLASLt call
  // (DGELU, pre read as the auxiliary input, beta 0: no fill, no GELU backward pass, no
  // scratch); the weight and bias gradients as MatmulBackward's. Otherwise the default's path.
  Status GeluMatmulBackward(void* dpre, void* dweight, void* dbias, const void* dout,
                            const void* act, const void* pre, const void* weight, void* scratch,
                            int64_t rows, int in, int out_features) override {
    if (!std::is_same_v<T, float> && dgelu_epilogue_ && in % 8 == 0 && rows > 0 &&
        dpre != nullptr) {
      const gemm::ColumnMajor g = gemm::LinearBackwardInput(rows, in, out_features);
      if (lt_matmuls_.Plannable(g, weight, CudaType<T>(), dout, CudaType<T>(), dpre, CudaType<T>(),
                                nullptr, pre, /*dgelu=*/true)) {
        ZR_RETURN_IF_ERROR(lt_matmuls_.Run(g, weight, CudaType<T>(), dout, CudaType<T>(), dpre,
                                           CudaType<T>(), 0.0f, nullptr, pre, /*dgelu=*/true));
        return MatmulBackward(nullptr, dweight, dbias, dout, act, weight, rows, in, out_features);
      }
      dgelu_epilogue_ = false;
    }
    return ModelKernels::GeluMatmulBackward(dpre, dweight, dbias, dout, act, pre, weight, scratch,
                                            rows, in, out_features);
  }
  Status MatmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                        const void* weight, int64_t rows, int in, int out_features) override {
    return LinearBackward(dinp, 1.0f, dweight, dbias, dout, inp, weight, rows, in, out_features);
  }
  // beta 0: the input gradient's GEMM writes dinp (no fill before it, no read of it).
  Status MatmulBackwardWrite(void* dinp, void* dweight, void* dbias, const void* dout,
                             const void* inp, const void* weight, int64_t rows, int in,
                             int out_features) override {
    return LinearBackward(dinp, 0.0f, dweight, dbias, dout, inp, weight, rows, in, out_features);
  }
  // dinp = dinp_beta x dinp + dout W; dW and db added.
  Status LinearBackward(void* dinp, float dinp_beta, void* dweight, void* dbias, const void* dout,
                        const void* inp, const void* weight, int64_t rows, int in,
                        int out_features) {
    if (dinp != nullptr) {  // dinp^T [in, rows] (+)= W^T [in, out] x dout^T [out, rows]
      ZR_RETURN_IF_ERROR(lt_matmuls_.Run(gemm::LinearBackwardInput(rows, in, out_features), weight,
                                         CudaType<T>(), dout, CudaType<T>(), dinp, CudaType<T>(),
                                         dinp_beta, nullptr));
    }
    if (dweight != nullptr) {  // dW^T [in, out] += inp^T [in, rows] x dout [rows, out]
      const gemm::ColumnMajor g = gemm::LinearBackwardWeight(rows, in, out_features);
      // [Note: cuBLASLt epilogues]: dout's column sums by BGRADB into fp32 sums, then added.
      float* sums = nullptr;
      if constexpr (!std::is_same_v<T, float> && std::is_same_v<G, float>) {
        if (dbias != nullptr && rows > 0 && bgradb_epilogue_ &&
            out_features * sizeof(float) <= kLtBiasGradBytes) {
          if (lt_matmuls_.Plannable(g, inp, CudaType<T>(), dout, CudaType<T>(), dweight,
                                    CudaType<G>(), nullptr, nullptr, false, BiasGradSums())) {
            sums = BiasGradSums();
          } else {
            bgradb_epilogue_ = false;
          }
        }
      }
      ZR_RETURN_IF_ERROR(lt_matmuls_.Run(g, inp, CudaType<T>(), dout, CudaType<T>(), dweight,
                                         CudaType<G>(), 1.0f, nullptr, nullptr, false, sums));
      if (sums != nullptr) {
        AccumulateKernel<G, float>
            <<<Blocks(out_features), kThreads, 0, s()>>>(Gp(dbias), sums, out_features);
        ZR_RETURN_IF_ERROR(Launched("BiasGradAdd"));
        dbias = nullptr;
      }
    }
    if (dbias != nullptr && rows > 0) {  // [Note: column sums]
      return SumColumns<ColumnSum::kBias>(dbias, nullptr, dout, nullptr, nullptr, nullptr, rows,
                                          out_features);
    }
    return absl::OkStatus();
  }

  // The attention program is attention_program()'s: zerort's flash kernels (the log-sum-exp
  // saved), cuDNN's (the same saved), or the materialised one below (the probabilities saved).
  Status Attention(void* out, void* att, const void* qkv, int batch, int seq, int channels,
                   int heads, int kv_heads) override {
    const int hs = channels / heads;
    const AttentionProgram program = attention_program(batch, heads, hs);
    if (program == AttentionProgram::kCudnn) {
      const int64_t bytes = AttentionScratchBytes(backend(), program, false, batch, seq, channels,
                                                  heads, kv_heads, sizeof(T))[0];
      ZR_ASSIGN_OR_RETURN(Buffer workspace, Scratch(bytes));
      ZR_RETURN_IF_ERROR(cudnn_->Forward(act_, {batch, seq, heads, kv_heads, hs}, out,
                                         static_cast<float*>(att), qkv, workspace.data(), bytes));
      ++launches_["cuDNN attention"];
      return absl::OkStatus();
    }
    if (program == AttentionProgram::kFlash) {
      ZR_RETURN_IF_ERROR(
          internal::CudaFlashAttentionForward(act_, {batch, seq, heads, kv_heads, hs}, out,
                                              static_cast<float*>(att), qkv, stream_, tiles_));
      ++launches_["FlashAttention"];
      return absl::OkStatus();
    }
    return materialised_.Forward(out, att, qkv, batch, seq, channels, heads, kv_heads);
  }

  // Flash (zerort's or cuDNN's): the forward saved the log-sum-exp and the backward reads `out`;
  // materialised: it saved the probabilities and `out` is not needed.
  Status AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                           const void* att, int batch, int seq, int channels, int heads,
                           int kv_heads) override {
    const int hs = channels / heads;
    const AttentionProgram program = attention_program(batch, heads, hs);
    if (program == AttentionProgram::kCudnn) {
      const int64_t bytes = AttentionScratchBytes(backend(), program, true, batch, seq, channels,
                                                  heads, kv_heads, sizeof(T))[0];
      ZR_ASSIGN_OR_RETURN(Buffer workspace, Scratch(bytes));
      ZR_RETURN_IF_ERROR(cudnn_->Backward(act_, {batch, seq, heads, kv_heads, hs}, dqkv, dout, qkv,
                                          out, static_cast<const float*>(att), workspace.data(),
                                          bytes));
      ++launches_["cuDNN attention backward"];
      return absl::OkStatus();
    }
    if (program == AttentionProgram::kFlash) {
      // D = dout . out and the dQ accumulator: kernels/memory_facts.h's AttentionScratchBytes.
      const std::vector<int64_t> bytes = AttentionScratchBytes(
          backend(), program, true, batch, seq, channels, heads, kv_heads, sizeof(T));
      ZR_ASSIGN_OR_RETURN(Buffer workspace, Scratch(bytes[0]));
      ZR_RETURN_IF_ERROR(internal::CudaFlashAttentionBackward(
          act_, {batch, seq, heads, kv_heads, hs}, dqkv, workspace.as<float>(), dout, qkv, out,
          static_cast<const float*>(att), stream_, tiles_));
      launches_["FlashAttentionBackward"] += 3;  // D, the main program, dQ stored
      return absl::OkStatus();
    }
    return materialised_.Backward(dqkv, dout, qkv, att, batch, seq, channels, heads, kv_heads);
  }

  Status RmsNorm(void* out, void* rstd, const void* inp, const void* weight, int64_t rows,
                 int channels, float eps) override {
    if (rows == 0) return absl::OkStatus();
    ByWidth(Vectorisable(channels, {out, inp, weight}), [&](auto w) {
      RmsNormKernel<T, decltype(w)::value>
          <<<RowBlocks(rows), kThreads, 0, s()>>>(A(out), static_cast<float*>(rstd), A(inp),
                                                  nullptr, nullptr, A(weight), rows, channels, eps);
    });
    return Launched("RmsNorm");
  }
  Status AddRmsNorm(void* sum, void* out, void* rstd, const void* a, const void* b,
                    const void* weight, int64_t rows, int channels, float eps) override {
    if (rows == 0) return absl::OkStatus();
    ByWidth(Vectorisable(channels, {out, a, b, sum, weight}), [&](auto w) {
      RmsNormKernel<T, decltype(w)::value><<<RowBlocks(rows), kThreads, 0, s()>>>(
          A(out), static_cast<float*>(rstd), A(a), A(b), A(sum), A(weight), rows, channels, eps);
    });
    return Launched("AddRmsNorm");
  }
  Status RmsNormBackward(void* dinp, void* dweight, const void* dout, const void* inp,
                         const void* weight, const void* rstd, int64_t rows,
                         int channels) override {
    if (rows == 0) return absl::OkStatus();
    const auto* r = static_cast<const float*>(rstd);
    if (dinp != nullptr && dweight != nullptr) {
      return NormBackward<ColumnSum::kRms>(dinp, dweight, nullptr, dout, inp, weight, nullptr, r,
                                           rows, channels, "RmsNormBackward");
    }
    if (dinp != nullptr) {
      ByWidth(Vectorisable(channels, {dinp, dout, inp, weight}), [&](auto w) {
        RmsNormInputGradKernel<T, decltype(w)::value><<<RowBlocks(rows), kThreads, 0, s()>>>(
            A(dinp), A(dout), A(inp), A(weight), r, rows, channels);
      });
      return Launched("RmsNormBackward");
    }
    if (dweight == nullptr) return absl::OkStatus();
    return SumColumns<ColumnSum::kRms>(dweight, nullptr, dout, inp, nullptr, r, rows, channels);
  }
  Status RopeQkv(void* qkv, const void* q, const void* k, const void* v, int batch, int seq,
                 int heads, int kv_heads, int head_size, const Rope& rope) override {
    const int64_t n = int64_t{batch} * seq * (head_size / 2);  // a thread a row and pair
    if (n == 0) return absl::OkStatus();
    ZR_ASSIGN_OR_RETURN(const RopeFrequencies* f, Frequencies(rope, head_size));
    RopeQkvKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(qkv), A(q), A(k), A(v), seq, heads,
                                                      kv_heads, head_size, *f, n);
    return Launched("RopeQkv");
  }
  Status RopeQkvBackward(void* dq, void* dk, void* dv, const void* dqkv, int batch, int seq,
                         int heads, int kv_heads, int head_size, const Rope& rope) override {
    const int64_t n = int64_t{batch} * seq * (head_size / 2);  // a thread a row and pair
    if (n == 0) return absl::OkStatus();
    ZR_ASSIGN_OR_RETURN(const RopeFrequencies* f, Frequencies(rope, head_size));
    RopeQkvBackwardKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(dq), A(dk), A(dv), A(dqkv), seq,
                                                              heads, kv_heads, head_size, *f, n);
    return Launched("RopeQkvBackward");
  }
  Status RopeQkvInPlace(void* qkv, int batch, int seq, int heads, int kv_heads, int head_size,
                        const Rope& rope, bool transpose) override {
    const int64_t n = int64_t{batch} * seq * (head_size / 2);  // a thread a row and pair
    if (n == 0) return absl::OkStatus();
    ZR_ASSIGN_OR_RETURN(const RopeFrequencies* f, Frequencies(rope, head_size));
    RopeQkvInPlaceKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(qkv), seq, heads, kv_heads,
                                                             head_size, *f, transpose, n);
    return Launched(transpose ? "RopeQkvInPlaceBackward" : "RopeQkvInPlace");
  }
  Status SwiGlu(void* out, const void* gate_up, int64_t rows, int cols, bool interleaved) override {
    const int64_t n = rows * cols;
    if (n == 0) return absl::OkStatus();
    const GatedIndex at{rows, cols, interleaved};
    if (Vectorisable(cols, {out, gate_up})) {
      SwiGluVecKernel<T><<<Blocks(n / kVec), kThreads, 0, s()>>>(A(out), A(gate_up), at, n / kVec);
    } else {
      SwiGluKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(out), A(gate_up), at, n);
    }
    return Launched("SwiGlu");
  }
  Status SwiGluBackward(void* dgate_up, const void* dout, const void* gate_up, int64_t rows,
                        int cols, bool interleaved) override {
    const int64_t n = rows * cols;
    if (n == 0) return absl::OkStatus();
    const GatedIndex at{rows, cols, interleaved};
    if (Vectorisable(cols, {dgate_up, dout, gate_up})) {
      SwiGluBackwardVecKernel<T>
          <<<Blocks(n / kVec), kThreads, 0, s()>>>(A(dgate_up), A(dout), A(gate_up), at, n / kVec);
    } else {
      SwiGluBackwardKernel<T>
          <<<Blocks(n), kThreads, 0, s()>>>(A(dgate_up), A(dout), A(gate_up), at, n);
    }
    return Launched("SwiGluBackward");
  }
  Status Gelu(void* out, const void* inp, int64_t n) override {
    GeluKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(out), A(inp), n);
    return Launched("Gelu");
  }
  Status GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) override {
    GeluBackwardKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(dinp), A(inp), A(dout), n);
    return Launched("GeluBackward");
  }
  // The element-wise kernels go kVec elements at a time where the pointers allow it.
  Status Add(void* out, const void* a, const void* b, int64_t n) override {
    if (Vectorisable(n, {out, a, b})) {
      AddVecKernel<T, T, T><<<Blocks(n / kVec), kThreads, 0, s()>>>(A(out), A(a), A(b), n / kVec);
    } else {
      AddKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(out), A(a), A(b), n);
    }
    return Launched("Add");
  }
  Status Accumulate(void* dst, const void* src, int64_t n) override {
    LaunchAccumulate(A(dst), A(src), n);
    return Launched("Accumulate");
  }
  Status AccumulateGrad(void* dst, const void* src, int64_t n) override {
    LaunchAccumulate(Gp(dst), Gp(src), n);
    return Launched("AccumulateGrad");
  }
  template <typename D, typename S>
  void LaunchAccumulate(D* dst, const S* src, int64_t n) {
    if (Vectorisable(n, {dst, src})) {
      AddVecKernel<D, D, S><<<Blocks(n / kVec), kThreads, 0, s()>>>(dst, dst, src, n / kVec);
    } else {
      AccumulateKernel<D, S><<<Blocks(n), kThreads, 0, s()>>>(dst, src, n);
    }
  }
  // The vocabulary kernels run a block per row: no rows, no launch (a grid of 0 is invalid).
  Status VocabMax(const void* logits, void* max, int64_t rows, int vocab, int valid) override {
    if (rows == 0) return absl::OkStatus();
    VocabMaxKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s()>>>(
        A(logits), static_cast<float*>(max), vocab, valid);
    return Launched("VocabMax");
  }
  Status VocabSums(const void* logits, const void* gmax, const int32_t* targets, void* sums,
                   int64_t rows, int vocab, int valid, int begin) override {
    if (rows == 0) return absl::OkStatus();
    VocabSumsKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s()>>>(
        A(logits), static_cast<const float*>(gmax), targets, static_cast<float*>(sums), rows, vocab,
        valid, begin);
    return Launched("VocabSums");
  }
  Status VocabCrossEntropyFinish(void* logits, void* losses, const void* gmax, const void* gsums,
                                 const int32_t* targets, int64_t rows, int vocab, int valid,
                                 int begin, float dscale) override {
    if (rows == 0) return absl::OkStatus();
    VocabFinishKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s()>>>(
        A(logits), static_cast<float*>(losses), static_cast<const float*>(gmax),
        static_cast<const float*>(gsums), targets, rows, vocab, valid, begin, dscale);
    return Launched("VocabCrossEntropyFinish");
  }
  Status AddBias(void* out, const void* bias, int64_t rows, int cols) override {
    AddBiasKernel<T><<<Blocks(rows * cols), kThreads, 0, s()>>>(A(out), A(bias), rows, cols);
    return Launched("AddBias");
  }
  Status CrossEntropy(void* logits, void* losses, const int32_t* targets, int64_t rows, int vocab,
                      int valid, float dscale) override {
    if (rows == 0) return absl::OkStatus();
    const auto grid = static_cast<unsigned>(rows);
    ByWidth(Vectorisable(vocab, {logits}), [&](auto w) {
      CrossEntropyKernel<T, decltype(w)::value><<<grid, kClassifierThreads, 0, s()>>>(
          A(logits), static_cast<float*>(losses), targets, vocab, valid, dscale);
    });
    return Launched("CrossEntropy");
  }

 private:
  // [Note: the row kernels' width]: f(std::integral_constant<int, W>) at W = kVec or 1.
  template <typename F>
  static void ByWidth(bool vectors, F&& f) {
    if (vectors) {
      f(std::integral_constant<int, kVec>{});
    } else {
      f(std::integral_constant<int, 1>{});
    }
  }
  cudaStream_t s() const { return ctx_.s(); }
  static T* A(void* p) { return static_cast<T*>(p); }
  static const T* A(const void* p) { return static_cast<const T*>(p); }
  static G* Gp(void* p) { return static_cast<G*>(p); }
  static const G* Gp(const void* p) { return static_cast<const G*>(p); }
  StatusOr<Buffer> Scratch(int64_t bytes) { return ctx_.Scratch(bytes); }
  Status Launched(const char* what) { return ctx_.Launched(what); }

  // [Note: column sums] (kernels/launch_geometry.h): the partials into the cuBLASLt workspace
  // (free between GEMMs on the stream), then the finish adding them in order into dsum (and, for
  // LayerNorm, its bias's into dsum2).
  static constexpr int64_t kMaxPartials = (kLtWorkspace - kLtBiasGradBytes) / sizeof(float);
  template <ColumnSum kKind>
  static Status CheckPartialsFit(int channels) {
    constexpr int kSums = kKind == ColumnSum::kLayerNorm ? 2 : 1;
    if (int64_t{channels} * kSums > kMaxPartials) {
      return absl::InvalidArgumentError("column sums of " + std::to_string(channels) +
                                        " columns: their partials do not fit the workspace");
    }
    return absl::OkStatus();
  }
  template <ColumnSum kKind>
  Status SumColumns(void* dsum, void* dsum2, const void* dout, const void* inp, const float* mean,
                    const float* rstd, int64_t rows, int channels) {
    ZR_RETURN_IF_ERROR(CheckPartialsFit<kKind>(channels));
    constexpr int kSums = kKind == ColumnSum::kLayerNorm ? 2 : 1;
    const bool vec = Vectorisable(channels, {dout, inp});  // a null inp (kBias) is aligned
    const launch::ColumnSums p =
        launch::ColumnSumsFor(rows, channels, vec ? kVec : 1, kSums, kMaxPartials);
    float* pw = static_cast<float*>(lt_workspace_.data());
    float* pb = pw + p.chunks * channels;
    const dim3 grid(static_cast<unsigned>(p.tiles), static_cast<unsigned>(p.chunks));
    ByWidth(vec, [&](auto w) {
      ColumnPartialsKernel<kKind, T, decltype(w)::value><<<grid, kThreads, 0, s()>>>(
          pw, pb, A(dout), A(inp), mean, rstd, rows, channels, p.rows_per_chunk);
    });
    ZR_RETURN_IF_ERROR(Launched("column sums (partials)"));
    return FinishColumns(dsum, dsum2, pw, pb, p.chunks, channels);
  }
  Status FinishColumns(void* dsum, void* dsum2, const float* pw, const float* pb, int64_t chunks,
                       int channels) {
    ColumnFinishKernel<G>
        <<<static_cast<unsigned>(launch::ColumnFinishBlocks(channels)), kThreads, 0, s()>>>(
            Gp(dsum), Gp(dsum2), pw, pb, chunks, channels);
    return Launched("column sums (finish)");
  }
  // A norm's input gradient and its weight (and LayerNorm's bias) gradients: one pass over the
  // rows (NormBackwardKernel), then the finish ([Note: column sums]). Two launches, not three.
  template <ColumnSum kKind>
  Status NormBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                      const void* weight, const float* mean, const float* rstd, int64_t rows,
                      int channels, const char* name) {
    ZR_RETURN_IF_ERROR(CheckPartialsFit<kKind>(channels));
    constexpr int kSums = kKind == ColumnSum::kLayerNorm ? 2 : 1;
    const bool vec = Vectorisable(channels, {dinp, dout, inp, weight});
    const launch::ColumnSums p = launch::ColumnSumsFor(rows, channels, vec ? kVec : 1, kSums,
                                                       kMaxPartials, launch::kFusedRowsPerChunk);
    float* pw = static_cast<float*>(lt_workspace_.data());
    float* pb = pw + p.chunks * channels;
    ByWidth(vec, [&](auto w) {
      NormBackwardKernel<kKind, T, decltype(w)::value>
          <<<static_cast<unsigned>(p.chunks), kThreads, 0, s()>>>(
              A(dinp), pw, pb, A(dout), A(inp), A(weight), mean, rstd, rows, channels,
              p.rows_per_chunk, p.tiles);
    });
    ZR_RETURN_IF_ERROR(Launched(name));
    return FinishColumns(dweight, dbias, pw, pb, p.chunks, channels);
  }

  // The rotary kernels' argument ([Note: the rotary frequencies' argument], llama_ops.cuh), kept
  // for the last rope and head size (every layer's call asks for the same).
  StatusOr<const RopeFrequencies*> Frequencies(const Rope& rope, int head_size) {
    ZR_RETURN_IF_ERROR(CheckCudaRope(head_size));
    if (rope_head_size_ != head_size || !(rope_ == rope)) {
      for (int i = 0; i < head_size / 2; ++i) {
        rope_frequencies_.inv_freq[i] = RopeFrequency(rope, i, head_size);
      }
      rope_frequencies_.scale = RopeCosSinScale(rope);
      rope_ = rope;
      rope_head_size_ = head_size;
    }
    return &rope_frequencies_;
  }

  const internal::CublasApi& b_;  // loaded by MakeCudaModelKernels
  Stream& stream_;
  Allocator& ws_;
  const DType act_, grad_;  // T's and G's DType, as the collectives name them
  const std::optional<AttentionProgram> attention_;  // asked for; nullopt: by shape
  const FlashTiles tiles_;                           // model.flash_attention
  bool gelu_epilogue_ = true;    // false once cuBLASLt refused a GELU epilogue plan
  bool dgelu_epilogue_ = true;   // the same for DGELU
  bool residual_c_ = true;       // the same for MatmulResidual's C
  bool bgradb_epilogue_ = true;  // and for BGRADB
  std::unique_ptr<cublasLtContext, LtDeleter> lt_;
  LtMatmuls lt_matmuls_;  // [Note: cuBLASLt plans], bound to lt_ and the workspace by Init
  // kLtWorkspace bytes: cuBLASLt's, its last kLtBiasGradBytes BGRADB's sums; then the loss ledger.
  Buffer lt_workspace_;
  float* BiasGradSums() const {
    return reinterpret_cast<float*>(static_cast<char*>(lt_workspace_.data()) + kLtWorkspace -
                                    kLtBiasGradBytes);
  }
  float* Ledger() const {
    return reinterpret_cast<float*>(static_cast<char*>(lt_workspace_.data()) + kLtWorkspace);
  }
  // launches(): by the name's literal (LaunchContext).
  std::unordered_map<const char*, int64_t> launches_;
  const LaunchContext ctx_{stream_, ws_, launches_};
  MaterialisedAttention<T> materialised_;            // kernels/cuda/materialised_attention.cuh
  std::unique_ptr<internal::CudnnAttention> cudnn_;  // model.attention_backend "cudnn" only
  Rope rope_;                                        // Frequencies()' last
  int rope_head_size_ = 0;
  RopeFrequencies rope_frequencies_ = {};
};

template <typename T, typename G>
StatusOr<std::unique_ptr<ModelKernels>> Make(Stream& stream, Allocator& workspace,
                                             std::optional<AttentionProgram> attention,
                                             const FlashTiles& tiles) {
  ZR_ASSIGN_OR_RETURN(const internal::CublasApi* blas, internal::LoadCublas());
  auto k = std::make_unique<CudaModelKernels<T, G>>(*blas, stream, workspace, DTypeOfCuda<T>(),
                                                    DTypeOfCuda<G>(), attention, tiles);
  ZR_RETURN_IF_ERROR(k->Init());
  return std::unique_ptr<ModelKernels>(std::move(k));
}

}  // namespace

StatusOr<std::unique_ptr<ModelKernels>> MakeCudaModelKernels(
    DType act, DType grad, Stream& stream, Allocator& workspace,
    std::optional<AttentionProgram> attention, const FlashTiles& tiles) {
  if (!stream.device().is_cuda() || workspace.device() != stream.device()) {
    return absl::InvalidArgumentError(
        "MakeCudaModelKernels needs a CUDA stream and an allocator "
        "on the same device");
  }
  // cuBLASLt writes a bf16 or fp32 result from bf16 inputs, but not bf16 from fp32 inputs.
  if (act == DType::kF32 && grad == DType::kF32)
    return Make<float, float>(stream, workspace, attention, tiles);
  if (act == DType::kBF16 && grad == DType::kF32)
    return Make<bf16, float>(stream, workspace, attention, tiles);
  if (act == DType::kBF16 && grad == DType::kBF16)
    return Make<bf16, bf16>(stream, workspace, attention, tiles);
  if (act == DType::kF16 && grad == DType::kF32)
    return Make<f16, float>(stream, workspace, attention, tiles);
  return absl::InvalidArgumentError(
      std::string("the GPT model's CUDA kernels take f32/f32, bf16/f32, bf16/bf16 or f16/f32 "
                  "activations/"
                  "gradients, not ") +
      std::string(DTypeName(act)) + "/" + std::string(DTypeName(grad)));
}

}  // namespace zerort
