// The CPU kernels issued in a stream's order (stream_kernels.cc): what MakeCpuModelKernels
// returns when it is given the stream the kernels run on.
#pragma once

#include <memory>

#include "zerort/kernels/model_kernels.h"

namespace zerort::internal {

// `kernels`, with every operation issued on `stream` (which must outlive the result) and the
// host reads synchronising it.
std::unique_ptr<ModelKernels> IssueOnStream(std::unique_ptr<ModelKernels> kernels, Stream& stream);

}  // namespace zerort::internal
