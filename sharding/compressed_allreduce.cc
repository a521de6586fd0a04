// [Note: 1-bit Adam] (compressed_allreduce.h): the compressed all-reduce.
#include "zerort/sharding/compressed_allreduce.h"

#include <numeric>

#include "zerort/kernels/onebit.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/strings.h"

namespace zerort {

std::vector<OneBitAllReduce::Segment> OneBitSegments(const FlatLayout& layout) {
  std::vector<OneBitAllReduce::Segment> segments;
  for (const ShardPiece& piece : layout.ShardPieces(0)) {
    if (piece.shard_range.size() > 0) {
      segments.push_back({piece.shard_range.begin, piece.shard_range.size()});
    }
  }
  return segments;
}

int64_t OneBitAllReduce::Padded(int64_t numel, int ranks) {
  const int64_t multiple = static_cast<int64_t>(ranks) * std::lcm(int64_t{ranks}, int64_t{8});
  return (numel + multiple - 1) / multiple * multiple;
}

int64_t OneBitAllReduce::WorkerErrorNumel(std::span<const Segment> segments, int ranks) {
  int64_t total = 0;
  for (const Segment& s : segments) total += Padded(s.numel, ranks);
  return total;
}

int64_t OneBitAllReduce::MessageBytes(std::span<const Segment> segments, int ranks) {
  const int64_t signs = WorkerErrorNumel(segments, ranks) / ranks / 8;
  return (signs + 3) / 4 * 4 + 4 * static_cast<int64_t>(segments.size());
}

OneBitAllReduce::Buffers OneBitAllReduce::BufferBytes(std::span<const Segment> segments,
                                                      int ranks) {
  const int64_t msg = MessageBytes(segments, ranks);
  return {.send = ranks * msg,
          .recv = ranks * msg,
          .package = msg,
          .sums = 4 * 3 * static_cast<int64_t>(segments.size())};
}

Status OneBitAllReduce::Run(std::span<const Segment> segments, const TensorView& momentum,
                            const TensorView& worker_error, const TensorView& server_error,
                            Stream* stream) {
  const int N = dp_.size(), me = dp_.rank();
  const int64_t k = static_cast<int64_t>(segments.size());
  const Device device = momentum.device();
  const int64_t worker = WorkerErrorNumel(segments, N);
  if (worker_error.numel() != worker || server_error.numel() != worker / N) {
    return absl::InvalidArgumentError(StrCat("1-bit all-reduce: error buffers of ",
                                             worker_error.numel(), " and ", server_error.numel(),
                                             " values for ", worker, " and ", worker / N));
  }
  const int64_t msg = MessageBytes(segments, N), scales_at = msg - 4 * k;
  const Buffers b = BufferBytes(segments, N);
  ZR_ASSIGN_OR_RETURN(Buffer send, memory_.Allocate(b.send, MemoryCategory::kCommBuffers, stream));
  ZR_ASSIGN_OR_RETURN(Buffer recv, memory_.Allocate(b.recv, MemoryCategory::kCommBuffers, stream));
  ZR_ASSIGN_OR_RETURN(Buffer package,
                      memory_.Allocate(b.package, MemoryCategory::kCommBuffers, stream));
  // Sums of squares (the workers' k, the server's k), then the worker scales (k).
  ZR_ASSIGN_OR_RETURN(Buffer sums, memory_.Allocate(b.sums, MemoryCategory::kCommBuffers, stream));
  ZR_RETURN_IF_ERROR(FillZero(send.data(), device, static_cast<size_t>(N * msg), stream));
  ZR_RETURN_IF_ERROR(FillZero(package.data(), device, static_cast<size_t>(msg), stream));
  ZR_RETURN_IF_ERROR(FillZero(sums.data(), device, static_cast<size_t>(4 * 2 * k), stream));
  auto* send_bytes = send.as<uint8_t>();
  auto* recv_bytes = recv.as<uint8_t>();
  auto* package_bytes = package.as<uint8_t>();
  float* sum_sq = sums.as<float>();
  float* scales = sum_sq + 2 * k;

  // Worker: b = m + e_w per parameter, its signs chunk by chunk into the N messages.
  int64_t woff = 0, bits_off = 0;
  for (int64_t i = 0; i < k; ++i) {
    const Segment& s = segments[static_cast<size_t>(i)];
    const int64_t P = Padded(s.numel, N), chunk = P / N;
    const TensorView e = worker_error.Flat(woff, P);
    ZR_RETURN_IF_ERROR(
        AccumulateInto(momentum.Flat(s.offset, s.numel), e.Flat(0, s.numel), stream));
    const TensorView sq(sum_sq + i, DType::kF32, {1}, device);
    ZR_RETURN_IF_ERROR(SumOfSquares(e, sq, stream));
    ZR_RETURN_IF_ERROR(
        SignCompress(e, sum_sq + i, scales + i, send_bytes + bits_off, chunk, msg, stream));
    woff += P;
    bits_off += chunk / 8;
  }
  for (int r = 0; r < N; ++r) {
    ZR_RETURN_IF_ERROR(CopyBytes(send_bytes + r * msg + scales_at, device, scales, device,
                                 static_cast<size_t>(4 * k), stream));
  }
  // Phase 1: chunk r to rank r (this rank's own copied).
  ZR_RETURN_IF_ERROR(CopyBytes(recv_bytes + me * msg, device, send_bytes + me * msg, device,
                               static_cast<size_t>(msg), stream));
  for (int d = 1; d < N; ++d) {  // a ring: to me + d, from me - d
    const int to = (me + d) % N, from = (me - d + N) % N;
    ZR_RETURN_IF_ERROR(dp_.p2p().SendRecv(send_bytes + to * msg, static_cast<size_t>(msg), to,
                                          recv_bytes + from * msg, static_cast<size_t>(msg), from,
                                          DType::kU8, stream));
  }
  // Server: this rank's chunk of every parameter averaged, compensated and compressed again.
  float* package_scales = reinterpret_cast<float*>(package_bytes + scales_at);
  int64_t soff = 0;
  bits_off = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t chunk = Padded(segments[static_cast<size_t>(i)].numel, N) / N;
    const TensorView c = server_error.Flat(soff, chunk);
    ZR_RETURN_IF_ERROR(SignDecode(recv_bytes + bits_off, msg,
                                  reinterpret_cast<const float*>(recv_bytes + scales_at) + i,
                                  msg / 4, N, 1.0f / static_cast<float>(N), true, c, stream));
    const TensorView sq(sum_sq + k + i, DType::kF32, {1}, device);
    ZR_RETURN_IF_ERROR(SumOfSquares(c, sq, stream));
    ZR_RETURN_IF_ERROR(SignCompress(c, sum_sq + k + i, package_scales + i, package_bytes + bits_off,
                                    chunk, chunk / 8, stream));
    soff += chunk;
    bits_off += chunk / 8;
  }
  // Phase 2: every rank's package; the momentum rebuilt from them.
  ZR_RETURN_IF_ERROR(
      dp_.AllGather(package_bytes, recv_bytes, static_cast<size_t>(msg), DType::kU8, stream));
  bits_off = 0;
  for (int64_t i = 0; i < k; ++i) {
    const Segment& s = segments[static_cast<size_t>(i)];
    const int64_t chunk = Padded(s.numel, N) / N;
    for (int r = 0; r < N && r * chunk < s.numel; ++r) {
      const int64_t n = std::min(chunk, s.numel - r * chunk);
      const uint8_t* from = recv_bytes + r * msg;
      ZR_RETURN_IF_ERROR(SignDecode(from + bits_off, 0,
                                    reinterpret_cast<const float*>(from + scales_at) + i, 0, 1,
                                    1.0f, false, momentum.Flat(s.offset + r * chunk, n), stream));
    }
    bits_off += chunk / 8;
  }
  return absl::OkStatus();
}

}  // namespace zerort
