// Shared checks of collective semantics, run on any Communicator: loopback ranks in threads and
// MPI ranks in processes use the same bodies. Inputs are random (seeded by rank and case), never
// zeros; expected values are computed independently on each rank from the same seeds.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "zerort/runtime/communicator.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/strings.h"

namespace zerort::testing {

// Deterministic random values of `dtype` for (seed, rank); floats in [-2, 2], integers small.
inline std::vector<std::byte> RandomData(DType dtype, size_t count, uint64_t seed, int rank) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(rank) * 7919u + 17u);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::uniform_int_distribution<int> ints(-50, 50);
  std::vector<std::byte> out(count * DTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kF32: {
        float v = uniform(rng);
        std::memcpy(&out[i * 4], &v, 4);
        break;
      }
      case DType::kBF16: {
        uint16_t v = FloatToBf16Bits(uniform(rng));
        std::memcpy(&out[i * 2], &v, 2);
        break;
      }
      case DType::kF16: {
        uint16_t v = FloatToF16Bits(uniform(rng));
        std::memcpy(&out[i * 2], &v, 2);
        break;
      }
      case DType::kI32: {
        int32_t v = ints(rng);
        std::memcpy(&out[i * 4], &v, 4);
        break;
      }
      case DType::kI64: {
        int64_t v = ints(rng) * 1000000007LL;
        std::memcpy(&out[i * 8], &v, 8);
        break;
      }
      case DType::kU8: {
        uint8_t v = static_cast<uint8_t>(ints(rng) + 50);
        std::memcpy(&out[i], &v, 1);
        break;
      }
    }
  }
  return out;
}

inline double ValueAt(const std::vector<std::byte>& data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, &data[i * 4], 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t v;
      std::memcpy(&v, &data[i * 2], 2);
      return Bf16BitsToFloat(v);
    }
    case DType::kF16: {
      uint16_t v;
      std::memcpy(&v, &data[i * 2], 2);
      return F16BitsToFloat(v);
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, &data[i * 4], 4);
      return v;
    }
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, &data[i * 8], 8);
      return static_cast<double>(v);
    }
    case DType::kU8:
      return static_cast<double>(static_cast<uint8_t>(data[i]));
  }
  return 0;
}

// Every rank's RandomData for one case.
inline std::vector<std::vector<std::byte>> AllRanksData(DType dtype, size_t count, uint64_t seed,
                                                        int size) {
  std::vector<std::vector<std::byte>> all;
  for (int r = 0; r < size; ++r) all.push_back(RandomData(dtype, count, seed, r));
  return all;
}

// Reference reduction in double of element i over all ranks' data.
inline double ReferenceReduce(const std::vector<std::vector<std::byte>>& all, DType dtype, size_t i,
                              ReduceOp op) {
  const int size = static_cast<int>(all.size());
  double acc = op == ReduceOp::kMax ? -INFINITY : 0.0;
  for (int r = 0; r < size; ++r) {
    const double v = ValueAt(all[r], dtype, i);
    acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
  }
  if (op == ReduceOp::kAvg) acc /= size;
  if (dtype == DType::kU8 && op == ReduceOp::kSum) acc = std::fmod(acc, 256.0);
  return acc;
}

// Tolerance of a reduced value: one rounding of the output dtype on top of fp32 summation.
inline double Tolerance(DType dtype, double expected, int size) {
  switch (dtype) {
    case DType::kF32:
      return 1e-6 * (std::abs(expected) + 2.0 * size);
    case DType::kBF16:
      return std::abs(expected) * (1.0 / 256) + 1e-6 * size;
    case DType::kF16:
      return std::abs(expected) * (1.0 / 2048) + 1e-5 * size;
    default:
      return 0;
  }
}

inline const std::vector<DType>& AllDTypes() {
  static const std::vector<DType> all = {DType::kF32, DType::kBF16, DType::kF16,
                                         DType::kI32, DType::kI64,  DType::kU8};
  return all;
}

// Each check returns "" on success, else a description of the first wrong element.
std::string CheckAllGather(Communicator& comm, DType dtype, size_t count, uint64_t seed,
                           bool in_place);
std::string CheckReduceScatter(Communicator& comm, DType dtype, size_t count, ReduceOp op,
                               uint64_t seed, bool in_place);
std::string CheckAllReduce(Communicator& comm, DType dtype, size_t count, ReduceOp op,
                           uint64_t seed, bool in_place);
std::string CheckBroadcast(Communicator& comm, DType dtype, size_t count, int root, uint64_t seed);
std::string CheckSendRecvRing(Communicator& comm, DType dtype, size_t count, uint64_t seed);
// A batch (Exchange) of three sends and three receives around the ring, sends posted first.
std::string CheckExchange(Communicator& comm, DType dtype, size_t count, uint64_t seed);
// Sends posted (PostSend) before any receive, then received in a batch and waited for.
std::string CheckPostedSends(Communicator& comm, DType dtype, size_t count, uint64_t seed);
// Every collective, every dtype and op, counts 0, 1, uneven, and large.
std::string CheckEverything(Communicator& comm, uint64_t seed);
// Collectives on queued CPU streams ([Note: the asynchronous CPU device]): each rank's input is
// written late on one queued stream, a second one waits for it by event, then all-reduces,
// reduce-scatters and all-gathers on its own thread, under jitter seeded by `seed`; a posted send
// there is refused. "" when every value is right.
std::string CheckQueuedCollectives(Communicator& comm, uint64_t seed);
// [Note: one communicator, one order]: an all-reduce queued on one stream behind slow work (on
// even ranks), a second one queued later on another stream, then one on the host: each rank runs
// them in that order, so every sum pairs like inputs. "" when every value is right.
std::string CheckIssueOrderAcrossStreams(Communicator& comm, uint64_t seed);

}  // namespace zerort::testing
