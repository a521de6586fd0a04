// Optimizer kernels: the scalar reference against an independent textbook implementation in
// double precision (AdamW, Adam+L2, SGD with momentum, dampening and Nesterov) over several
// steps, and the vectorised CPU kernel against the reference, bitwise, on uneven sizes.
#include "zerort/kernels/optimizer.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/kernels/random_floats.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1) {
  return testing::RandomNormal<float>(n, seed, scale);
}

TensorView View(std::vector<float>& v) {
  return TensorView(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

// Textbook Adam(W) in double (Loshchilov & Hutter; Kingma & Ba), written independently.
void TextbookAdam(const AdamHyper& h, std::vector<double>& p, const std::vector<float>& g,
                  std::vector<double>& m, std::vector<double>& v) {
  for (size_t i = 0; i < p.size(); ++i) {
    double grad = static_cast<double>(g[i]) * h.grad_scale;
    if (!h.decoupled) grad += h.weight_decay * p[i];
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * grad;
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * grad * grad;
    // DeepSpeed's bias_correction = false drops the two corrections.
    const double m_hat = h.bias_correction ? m[i] / (1 - std::pow(h.beta1, h.step)) : m[i];
    const double v_hat = h.bias_correction ? v[i] / (1 - std::pow(h.beta2, h.step)) : v[i];
    if (h.decoupled) p[i] -= h.lr * h.weight_decay * p[i];
    p[i] -= h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
  }
}

void TextbookSgd(const SgdHyper& h, std::vector<double>& p, const std::vector<float>& g,
                 std::vector<double>& buf) {
  for (size_t i = 0; i < p.size(); ++i) {
    double d = static_cast<double>(g[i]) * h.grad_scale + h.weight_decay * p[i];
    if (h.momentum != 0) {
      buf[i] = h.step == 1 ? d : h.momentum * buf[i] + (1 - h.dampening) * d;
      d = h.nesterov ? d + h.momentum * buf[i] : buf[i];
    }
    p[i] -= h.lr * d;
  }
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double rel,
                 const char* what) {
  for (size_t i = 0; i < got.size(); ++i) {
    // Parameters are O(1): a cancellation near zero leaves an absolute error of O(eps).
    ASSERT_NEAR(got[i], want[i], rel * (std::abs(want[i]) + 1.0)) << what << " element " << i;
  }
}

TEST(OptimizerTest, AdamReferenceMatchesTextbook) {
  for (const auto& [decoupled, bias_correction] :
       {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}}) {
    const size_t n = 1001;
    std::vector<float> p = Random(n, 1), m(n, 0), v(n, 0);
    std::vector<double> pd(p.begin(), p.end()), md(n, 0), vd(n, 0);
    AdamHyper h{.lr = 3e-3f,
                .beta1 = 0.9f,
                .beta2 = 0.95f,
                .eps = 1e-8f,
                .weight_decay = 0.1f,
                .decoupled = decoupled,
                .bias_correction = bias_correction};
    for (int step = 1; step <= 6; ++step) {
      std::vector<float> g = Random(n, 100 + step, 0.5f);
      h.step = step;
      h.grad_scale = 0.25f;
      ASSERT_TRUE(AdamStepReference(h, View(p), View(g), View(m), View(v), TensorView()).ok());
      TextbookAdam(h, pd, g, md, vd);
    }
    ExpectClose(p, pd, 2e-5,
                !bias_correction ? "AdamW without bias correction"
                : decoupled      ? "AdamW"
                                 : "Adam");
  }
}

TEST(OptimizerTest, SgdReferenceMatchesTextbook) {
  struct Case {
    float momentum, dampening;
    bool nesterov;
    float wd;
  };
  for (const Case& c : {Case{0, 0, false, 0}, Case{0.9f, 0, false, 0.01f},
                        Case{0.9f, 0.1f, false, 0}, Case{0.9f, 0, true, 0.05f}}) {
    const size_t n = 777;
    std::vector<float> p = Random(n, 2), buf(n, 0);
    std::vector<double> pd(p.begin(), p.end()), bufd(n, 0);
    SgdHyper h{.lr = 0.05f,
               .momentum = c.momentum,
               .dampening = c.dampening,
               .weight_decay = c.wd,
               .nesterov = c.nesterov};
    for (int step = 1; step <= 5; ++step) {
      std::vector<float> g = Random(n, 200 + step);
      h.step = step;
      ASSERT_TRUE(SgdStepReference(h, View(p), View(g), View(buf), TensorView()).ok());
      TextbookSgd(h, pd, g, bufd);
    }
    ExpectClose(p, pd, 1e-5, "SGD");
  }
}

TEST(OptimizerTest, VectorisedAdamMatchesReferenceBitwise) {
  const size_t n = (1 << 18) + 3;
  for (DType out_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<float> p1 = Random(n, 3), m1 = Random(n, 4, 0.01f), v1 = Random(n, 5, 0.01f);
    for (float& x : v1) x = std::abs(x);
    std::vector<float> p2 = p1, m2 = m1, v2 = v1, g = Random(n, 6);
    std::vector<uint16_t> out1(2 * n), out2(2 * n);
    const AdamHyper h{.lr = 1e-3f, .weight_decay = 0.1f, .step = 7, .grad_scale = 0.5f};
    TensorView o1(out1.data(), out_dtype, {static_cast<int64_t>(n)});
    TensorView o2(out2.data(), out_dtype, {static_cast<int64_t>(n)});
    ASSERT_TRUE(AdamStep(h, View(p1), View(g), View(m1), View(v1), o1, nullptr).ok());
    ASSERT_TRUE(AdamStepReference(h, View(p2), View(g), View(m2), View(v2), o2).ok());
    ASSERT_EQ(std::memcmp(p1.data(), p2.data(), n * 4), 0);
    ASSERT_EQ(std::memcmp(m1.data(), m2.data(), n * 4), 0);
    ASSERT_EQ(std::memcmp(v1.data(), v2.data(), n * 4), 0);
    ASSERT_EQ(std::memcmp(out1.data(), out2.data(), n * DTypeSize(out_dtype)), 0);
    // The compute copy is the updated master, rounded once.
    for (size_t i = 0; i < n; i += 4099) {
      float rounded = p1[i];
      if (out_dtype == DType::kBF16) rounded = Bf16BitsToFloat(FloatToBf16Bits(p1[i]));
      if (out_dtype == DType::kF16) rounded = F16BitsToFloat(FloatToF16Bits(p1[i]));
      ASSERT_EQ(LoadAsFloat(out1.data(), out_dtype, static_cast<int64_t>(i)), rounded);
    }
  }
}

// A multi-range step equals AdamStep on each range with that range's weight decay, bitwise, and
// leaves the elements between and after the ranges alone; a range outside the views is refused.
TEST(OptimizerTest, AdamSegmentsEqualPerRangeStepsBitwise) {
  const std::vector<OptimizerSegment> segments = {
      {.begin = 0, .count = 100, .weight_decay = 0.1f},
      {.begin = 112, .count = 1000, .weight_decay = 0.0f},
      {.begin = 1112, .count = 33, .weight_decay = 0.1f}};
  const int64_t n = 1200;
  std::vector<float> p1 = Random(n, 1), g = Random(n, 2), m1 = Random(n, 3), v1 = Random(n, 4);
  for (float& x : v1) x = std::abs(x);
  std::vector<float> p2 = p1, m2 = m1, v2 = v1;
  std::vector<uint16_t> o1(n, 0x7fc1), o2 = o1;
  const AdamHyper h{.lr = 1e-2f, .decoupled = true, .step = 4, .grad_scale = 0.5f};
  ASSERT_TRUE(AdamStepSegments(h, segments, View(p1), View(g), View(m1), View(v1),
                               TensorView(o1.data(), DType::kBF16, {n}), nullptr)
                  .ok());
  for (const OptimizerSegment& seg : segments) {
    AdamHyper hs = h;
    hs.weight_decay = seg.weight_decay;
    auto part = [&](std::vector<float>& x) { return View(x).Flat(seg.begin, seg.count); };
    ASSERT_TRUE(AdamStep(hs, part(p2), View(g).Flat(seg.begin, seg.count), part(m2), part(v2),
                         TensorView(o2.data() + seg.begin, DType::kBF16, {seg.count}), nullptr)
                    .ok());
  }
  EXPECT_EQ(std::memcmp(p1.data(), p2.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(m1.data(), m2.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(v1.data(), v2.data(), n * 4), 0);
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(o1[105], 0x7fc1) << "a gap was written";
  EXPECT_EQ(o1[n - 1], 0x7fc1) << "the tail was written";
  const OptimizerSegment outside[] = {{.begin = 1190, .count = 11}};
  EXPECT_EQ(
      AdamStepSegments(h, outside, View(p1), View(g), View(m1), View(v1), TensorView(), nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// Without a compute copy too, and at a length whose last chunk is short: the vectorised update
// is built per vector width ([Note: the host update's vector width]), the reference is not.
TEST(OptimizerTest, VectorisedAdamWithoutComputeCopyMatchesReferenceBitwise) {
  const size_t n = (1 << 16) + 37;
  std::vector<float> p1 = Random(n, 13), m1 = Random(n, 14, 0.01f), v1 = Random(n, 15, 0.01f);
  for (float& x : v1) x = std::abs(x);
  std::vector<float> p2 = p1, m2 = m1, v2 = v1, g = Random(n, 16);
  const AdamHyper h{.lr = 2e-3f, .weight_decay = 0.05f, .decoupled = false, .step = 2};
  ASSERT_TRUE(AdamStep(h, View(p1), View(g), View(m1), View(v1), TensorView(), nullptr).ok());
  ASSERT_TRUE(AdamStepReference(h, View(p2), View(g), View(m2), View(v2), TensorView()).ok());
  ASSERT_EQ(std::memcmp(p1.data(), p2.data(), n * 4), 0);
  ASSERT_EQ(std::memcmp(m1.data(), m2.data(), n * 4), 0);
  ASSERT_EQ(std::memcmp(v1.data(), v2.data(), n * 4), 0);
}

// Each momentum case and compute-copy type, bitwise the scalar reference.
TEST(OptimizerTest, VectorisedSgdMatchesReferenceBitwise) {
  const size_t n = (1 << 17) + 9;
  struct Case {
    float momentum;
    bool nesterov;
  };
  for (const Case& c : {Case{0.0f, false}, Case{0.9f, true}, Case{0.9f, false}}) {
    // No compute copy, then each type.
    for (const std::optional<DType> copy :
         {std::optional<DType>(), std::optional(DType::kF32), std::optional(DType::kBF16),
          std::optional(DType::kF16)}) {
      std::vector<float> p1 = Random(n, 7), b1 = Random(n, 8), g = Random(n, 9);
      std::vector<float> p2 = p1, b2 = b1;
      std::vector<uint16_t> out1(2 * n), out2(2 * n);
      TensorView o1, o2;
      if (copy) {
        o1 = TensorView(out1.data(), *copy, {static_cast<int64_t>(n)});
        o2 = TensorView(out2.data(), *copy, {static_cast<int64_t>(n)});
      }
      const SgdHyper h{.lr = 0.1f,
                       .momentum = c.momentum,
                       .weight_decay = 1e-4f,
                       .nesterov = c.nesterov,
                       .step = 3};
      const std::string what = StrCat("momentum ", c.momentum, " nesterov ", c.nesterov, " copy ",
                                      copy ? DTypeName(*copy) : "none");
      ASSERT_TRUE(SgdStep(h, View(p1), View(g), View(b1), o1, nullptr).ok()) << what;
      ASSERT_TRUE(SgdStepReference(h, View(p2), View(g), View(b2), o2).ok()) << what;
      // Untouched buffers (no momentum, no copy) compare equal too.
      ASSERT_EQ(std::memcmp(p1.data(), p2.data(), n * 4), 0) << what;
      ASSERT_EQ(std::memcmp(b1.data(), b2.data(), n * 4), 0) << what;
      ASSERT_EQ(std::memcmp(out1.data(), out2.data(), out1.size() * 2), 0) << what;
    }
  }
}

TEST(OptimizerTest, RejectsBadArguments) {
  std::vector<float> a(8), b(7);
  EXPECT_EQ(AdamStep({}, View(a), View(b), View(a), View(a), TensorView(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamStep({.step = 0}, View(a), View(a), View(a), View(a), TensorView(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SgdStep({.momentum = 0, .nesterov = true}, View(a), View(a), View(a), TensorView(), nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerort
