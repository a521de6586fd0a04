// [Note: what the kernels allocate] The bytes the model kernels keep for a backward or allocate
// for themselves, per backend, as plain functions: the kernels (kernels/cpu/model_kernels.cc,
// kernels/cuda/model_kernels.cu) size their buffers with them and the memory model
// (estimate/step_model.cc) replays them, without a kernel object (an estimate for CUDA runs on a
// machine without a GPU).
//
// - Which attention program runs (AttentionProgramFor): flash-style on the CPU float and 16-bit
//   kernels; on CUDA zerort's flash kernels (kernels/flash_attention.h) for bf16/fp16 at head
//   sizes 64 and 128 with batch x heads within a grid's 65535 rows, else the materialised kernels
//   (fp32, other head sizes), unless the run asks for one (model.attention_backend: flash,
//   materialised, or cuDNN's fused flash attention where the build has it; the CPU has one
//   program each); materialised on the CPU double kernels (the gradient checks' reference).
//   flash_tiles_test holds this choice to CheckFlashAttention's.
// - The attention's saved tensor (besides qkv and out): a flash program (zerort's or cuDNN's)
//   keeps each query's log-sum-exp of its scores (fp32 [batch, heads, seq]; the seq x seq
//   probabilities never exist), a materialised one the probabilities (act dtype [batch, heads, seq,
//   seq]).
// - The CUDA attention's scratch, allocated in this order on the kernels' stream and freed when
//   the call returns. Flash: none forward; backward one fp32 workspace, D = dout . out ([batch,
//   heads, seq]) and, from the next 16-byte boundary (FlashBackwardDqOffset), the dQ accumulator
//   ([batch, seq, heads x head size]). cuDNN: one
//   workspace each way, a budget its graphs must fit (kCudnnForwardWorkspaceBytes forward;
//   backward the flash one's with the sequence rounded up to 128, its dQ part twice with grouped
//   key/value heads, plus that): a graph that asks for more fails the call naming both
//   (kernels/cudnn_attention.h).
//   Materialised: forward q, k, v ([batch, heads, seq, head size] each) and the scores
//   [batch, heads, seq, seq]; backward q, k, v, dy, the scores' gradient, then dk. The CPU
//   kernels allocate none.
// - The LayerNorm backward and the bias gradients allocate nothing on either backend (the CUDA
//   column kernels of kernels/launch_geometry.h sum each column in registers and shared memory).
// - The CUDA embedding backward with 16-bit gradients (an embedder's choice: `zerort train`'s
//   gradients are fp32, so the memory model has nothing to replay): fp32 sums of this call's
//   token and position gradients, [vocab slice + seq, channels], freed when the call returns.
// - cuBLASLt's workspace: 32 MiB, allocated once by the CUDA kernels (its last 64 KiB hold the
//   bias gradients' fp32 sums that the BGRADB epilogue writes).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace zerort {

enum class KernelBackend {
  kCpu,        // the CPU float and 16-bit kernels
  kCpuDouble,  // the CPU double kernels
  kCuda,
};

inline constexpr int64_t kCudaLtWorkspaceBytes = int64_t{32} << 20;  // cuBLASLt's advice for Hopper
// The CUDA kernels' one workspace allocation: cuBLASLt's workspace, then 256 bytes holding the
// training loss ledger (one fp32; [Note: the training loss ledger] in kernels/kernel_roles.h).
inline constexpr int64_t kCudaLossLedgerBytes = 256;
inline constexpr int64_t kCudaModelWorkspaceBytes = kCudaLtWorkspaceBytes + kCudaLossLedgerBytes;

// The attention programs: flash (zerort's: tiled, online softmax, the log-sum-exp saved),
// materialised (the seq x seq probabilities saved), or cuDNN's fused flash attention (its SDPA
// graphs; the same log-sum-exp saved; CUDA builds configured with ZR_CUDNN_FRONTEND only).
enum class AttentionProgram { kFlash, kMaterialised, kCudnn };

// cuDNN's forward workspace budget (its Hopper SDPA forward asks for a few bytes or none).
inline constexpr int64_t kCudnnForwardWorkspaceBytes = int64_t{1} << 20;

// The CUDA flash kernels' block shapes (model.flash_attention), each 0 for the head size's
// default: the queries a forward block owns (64, or 128) and its warps (4, or 8: 128 queries as
// two row groups on 4 warps, head size 64 only, or as one on 8; [Note: the register-resident
// forward] in kernels/flash_forward.h), the keys a backward block owns (64, or 128 at head size
// 64: kBackwardWarps in kernels/flash_backward.h) and the queries its warps take at a time (the
// default 64, or 32 at head size 64; 32 at 128: kBackwardChunk). They split the same work
// differently: the memory, the saved tensors and the scratch are the same whatever they are, the
// forward's results are the same bits, and the backward's differ only in the order of fp32 sums.
// CheckFlashTiles (kernels/flash_attention.h) says which a shape takes.
struct FlashTiles {
  int forward_block_queries = 0;
  int backward_block_keys = 0;
  int backward_query_chunk = 0;
  int forward_warps = 0;
  bool operator==(const FlashTiles&) const = default;
};

// model.attention_backend's values: "flash", "materialised", "cudnn"; nullopt (by shape) when
// unset (""), and for any other name (the config schema allows only these three).
inline std::optional<AttentionProgram> AttentionBackendNamed(std::string_view name) {
  if (name == "flash") return AttentionProgram::kFlash;
  if (name == "materialised") return AttentionProgram::kMaterialised;
  if (name == "cudnn") return AttentionProgram::kCudnn;
  return std::nullopt;
}

// The program a backend's Attention runs for this shape; `act_size` is the activations' bytes
// (2: bf16 or fp16, which the CUDA flash kernels both take). `requested`: the run's choice on
// CUDA (a flash request the kernels cannot take fails in the call, naming why); nullopt: auto.
inline AttentionProgram AttentionProgramFor(KernelBackend backend, int64_t act_size, int batch,
                                            int heads, int head_size,
                                            std::optional<AttentionProgram> requested = {}) {
  switch (backend) {
    case KernelBackend::kCpu:
      return AttentionProgram::kFlash;
    case KernelBackend::kCpuDouble:
      return AttentionProgram::kMaterialised;
    case KernelBackend::kCuda:
      break;
  }
  if (requested.has_value()) return *requested;
  const bool flash =
      act_size == 2 && (head_size == 64 || head_size == 128) && int64_t{batch} * heads <= 65535;
  return flash ? AttentionProgram::kFlash : AttentionProgram::kMaterialised;
}

inline int64_t AttentionSavedBytes(AttentionProgram program, int batch, int seq, int heads,
                                   int64_t act_size) {
  if (program != AttentionProgram::kMaterialised) return int64_t{batch} * heads * seq * 4;
  return int64_t{batch} * heads * seq * seq * act_size;
}

// Where the flash backward's dQ accumulator starts in its fp32 workspace, in floats: after D,
// at the next 16-byte boundary. The programs add into it by 8-byte atomics and zero it by 16-byte
// stores (kernels/flash_backward.h); right after D, batch x heads x seq floats in, those missed
// their alignment whenever that count was not a multiple of 4 (a GPU faults on them).
inline int64_t FlashBackwardDqOffset(int batch, int heads, int seq) {
  return (int64_t{batch} * heads * seq + 3) / 4 * 4;
}

// The attention's scratch buffers in allocation order (empty on the CPU); `channels` are the
// attention's (heads x head size), `kv_heads` its key/value heads.
inline std::vector<int64_t> AttentionScratchBytes(KernelBackend backend, AttentionProgram program,
                                                  bool backward, int batch, int seq, int channels,
                                                  int heads, int kv_heads, int64_t act_size) {
  if (backend != KernelBackend::kCuda) return {};
  if (program == AttentionProgram::kFlash) {
    if (!backward) return {};
    // One fp32 workspace: D = dout . out per query, then the dQ accumulator (out's shape).
    return {(FlashBackwardDqOffset(batch, heads, seq) + int64_t{batch} * seq * channels) * 4};
  }
  if (program == AttentionProgram::kCudnn) {
    if (!backward) return {kCudnnForwardWorkspaceBytes};
    // Grouped heads: as much again (cuDNN 9 on an H200 asked for exactly that and 256 bytes, at
    // 32:8 heads, for B 2 x T 2048 and B 4 x T 2048; 2026-12-04).
    const int64_t padded = (int64_t{seq} + 127) / 128 * 128;
    const int64_t dq = int64_t{batch} * padded * channels * (kv_heads < heads ? 2 : 1);
    return {(int64_t{batch} * heads * padded + dq) * 4 + kCudnnForwardWorkspaceBytes};
  }
  const int64_t n = int64_t{batch} * seq * channels * act_size;
  const int64_t scores = int64_t{batch} * heads * seq * seq * act_size;
  if (!backward) return {n, n, n, scores};  // q, k, v, scores
  return {n, n, n, n, scores, n};           // q, k, v, dy, dscores, dk
}

// The embedding backward's scratch (0: none); `vocab_count` and `seq` are 0 for a table whose
// gradient is not wanted.
inline int64_t EmbeddingBackwardScratchBytes(KernelBackend backend, int64_t grad_size,
                                             int vocab_count, int seq, int channels) {
  if (backend != KernelBackend::kCuda || grad_size >= 4) return 0;
  return (int64_t{vocab_count} + seq) * channels * 4;
}

}  // namespace zerort
