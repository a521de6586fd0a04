// The hardware's 2^x (PTX ex2.approx: the SFU's one instruction, within 2 ulp of 2^x, subnormal
// results flushed to zero), for the kernels whose exponentials need not be the CPU's bits: flash
// attention's probabilities (kernels/flash_forward.h, kernels/flash_backward.h) and the 16-bit
// cross-entropy (kernels/cuda/model_ops.cuh). kernels/model_math.h's FastExp, which the
// bitwise-shared element math uses, is about 26 ALU instructions a call.
#pragma once

namespace zerort::cuda {

__device__ __forceinline__ float Ex2Approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

}  // namespace zerort::cuda
