// tools/commands.h — the subcommands; each returns the process exit status.
#pragma once

#include "cli_args.h"

namespace fp4moe::cli {

int run_info(const Args& args);
int run_check(const Args& args);
int run_bench(const Args& args);
int run_ep_bench(const Args& args);  // bench --ep N (ep_bench.cpp)

// Resolves --device: true for the GPU. Throws UsageError for --device cuda without a GPU.
bool use_gpu(const Args& args);

}  // namespace fp4moe::cli
