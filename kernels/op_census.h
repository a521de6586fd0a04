// The census of a model's kernel calls: how many times each ModelKernels operation is called,
// and how many calls read values back to the host, while a census is attached
// (`zerort bench model --census`). On CUDA each operation is one kernel launch or more (a
// GEMM, a softmax, a layout kernel, ...); the runtime's own fills and copies (FillZero,
// CopyBytes) are not ModelKernels calls and are not counted. A host read of an asynchronous
// stream (CUDA, a queued CPU stream) waits for the stream: inside a micro-batch there should be
// none (issue 48's census).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "zerort/kernels/model_kernels.h"

namespace zerort {

struct OpCensus {
  std::map<std::string, int64_t> ops;  // calls per operation
  int64_t host_reads = 0;              // ActToHost, StatToHost, TakeLossLedger
  int64_t total_ops() const;
  void Clear() { *this = {}; }
};

// `kernels`, every call counted into `census` (which must outlive the result) and then run as
// `kernels` runs it.
std::unique_ptr<ModelKernels> CountOperations(std::unique_ptr<ModelKernels> kernels,
                                              OpCensus* census);

}  // namespace zerort
