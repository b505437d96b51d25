// libFuzzer harness for the safetensors reader (src/host/safetensors.cpp). Any input must either
// parse or throw fp4moe::InvalidArgument; a crash, a sanitizer report, a hang or any other
// exception is a bug. On success every tensor's bytes are read (ASan checks they are in bounds).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fp4moe/checkpoint.h"
#include "fp4moe/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = fp4moe::SafetensorsFile::from_bytes(data, size, "fuzz");
    unsigned sum = 0;
    for (const auto& name : f.names()) {
      const auto& t = f.get(name);
      for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
      if (t.numel() < 0) std::abort();
    }
    for (const auto& kv : f.metadata()) sum += static_cast<unsigned>(kv.second.size());
    volatile unsigned sink = sum;
    (void)sink;
  } catch (const fp4moe::InvalidArgument&) {
  }
  return 0;
}
