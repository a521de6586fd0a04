// Must not compile (ctest data_as_uint16_refused checks the compiler says why): a 16-bit view is
// read as zerort::Half or zerort::BFloat16, or as float through LoadAsFloat, not as uint16_t.
#include "zerort/runtime/tensor.h"

int main() {
  zerort::TensorView v;
  return *v.data_as<uint16_t>();
}
