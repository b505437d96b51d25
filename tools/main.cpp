// The `fp4moe` command: argument parsing and dispatch. info / check / bench live in their own files.
#include <cstdio>
#include <exception>

#include "cli_args.h"
#include "commands.h"
#include "fp4moe/errors.h"
#include "fp4moe/runner.h"

namespace fp4moe::cli {

bool use_gpu(const Args& args) {
  const bool have = cuda_device_count() > 0;
  if (args.device == DeviceChoice::kCuda && !have)
    throw UsageError("--device cuda: no CUDA device found (fp4moe info says why); use --device cpu");
  return args.device == DeviceChoice::kAuto ? have : args.device == DeviceChoice::kCuda;
}

}  // namespace fp4moe::cli

int main(int argc, char** argv) {
  using namespace fp4moe::cli;
  try {
    const Args args = parse_args(argc, argv);
    if (args.command == "help") {
      std::fputs(usage().c_str(), stdout);
      return 0;
    }
    if (args.command == "info") return run_info(args);
    if (args.command == "check") return run_check(args);
    if (args.command == "bench" && args.ep > 0) return run_ep_bench(args);
    return run_bench(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "fp4moe: %s\n(fp4moe --help lists the commands and flags)\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fp4moe: out of host memory (try fewer or smaller points)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp4moe: error: %s\n", e.what());
    return 1;
  }
}
