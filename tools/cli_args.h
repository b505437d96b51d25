// tools/cli_args.h — the `fp4moe` command line: what the user asked for, parsed and validated.
//
// Every mistake becomes a UsageError whose message names the flag and the value; main() prints it
// and exits with status 2. Nothing here touches CUDA.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/runner.h"

namespace fp4moe::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One layer shape: a named model of bench-protocol.md or a command-line shape.
struct Shape {
  std::string name;
  int hidden = 0, intermediate = 0, experts = 0, top_k = 0;
  Activation activation = Activation::kSilu;
  SwigluParams swiglu{};
};

enum class DeviceChoice { kAuto, kCpu, kCuda };

struct Args {
  std::string command;                 // info | check | bench
  std::vector<Shape> shapes;
  std::vector<int64_t> tokens;         // empty: the subcommand's default for the device
  std::vector<WeightFormat> formats;
  std::vector<ActMode> modes;
  bool bias = false;
  Backend backend = Backend::kAuto;   // the first of `backends`
  std::vector<Backend> backends{Backend::kAuto};  // bench: each point is timed on each, in order
  DeviceChoice device = DeviceChoice::kAuto;
  std::optional<uint64_t> seed;        // bench default: fresh per run (and written into the command)
  std::string out_dir = "bench/results";
  std::string run_name;                // empty: bench-<date>-<time>-<cpu|gpu>
  int iters = 0, warmup = -1;          // 0 / -1: the device's default
  int sets = 4;                        // GPU bench: input sets rotated between calls
  int threads = 0;                     // host threads (generation, reference); 0 = all
  int64_t prefill_bf16_bytes = 0;      // --prefill-bf16-gib: RunnerOptions::prefill_bf16_bytes
  int64_t prefill_bf16_min_rows = RunnerOptions{}.prefill_bf16_min_rows;
  int dynamic_tile_m = 0;              // --dynamic-tile-m: RunnerOptions::dynamic_tile_m
  bool peer = true;                    // GPU bench: time the cuBLAS bf16 peer
  int ep = 0;                          // bench --ep N: expert parallel over N local GPUs (ep_bench.cpp)
  std::string ep_strategy = "both";    // --ep-strategy: allgather, alltoall, auto or both
  std::vector<std::string> argv;       // as given, for the reproducing command line
};

// The runner options of one point of check or bench: `backend`, a workspace for T tokens, and the
// flags that map onto RunnerOptions.
RunnerOptions runner_options(const Args& args, Backend backend, int64_t tokens);
// The backend column of a check or bench row: the planned backend, "(bf16 copy)" when the call
// dequantises once into dynamic's bf16 copy.
std::string backend_label(const MoeRunner& runner, int64_t tokens);

// Parses argv; throws UsageError. `--help` anywhere sets command = "help".
Args parse_args(int argc, char** argv);
std::string usage();

// The command line that reproduces a run: argv shell-quoted, plus the flags whose defaults are
// not reproducible (a fresh seed).
std::string reproducing_command(const Args& args, uint64_t seed);

// The accepted token list of bench-protocol.md (decode, middle, prefill).
const std::vector<int64_t>& protocol_tokens();

}  // namespace fp4moe::cli
