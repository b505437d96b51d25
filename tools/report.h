// tools/report.h — bench results: the markdown table, JSON lines and the .md file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "points.h"

namespace fp4moe::cli {

// Facts that hold for the whole run (the header line of the .jsonl, the top of the .md).
struct RunFacts {
  std::string run;            // run name
  std::string device;         // "cuda" or "cpu"
  std::string commit, version, gpu, date;
  double sm_clock_mhz = 0, sm_clock_max_mhz = 0;
  std::optional<double> read_tbs, copy_tbs, bf16_tflops, fp8_tflops;  // GPU only
  std::string ceilings_detail;
  std::string method;         // how times were taken (L2 flush statement, or the CPU note)
  std::string command;        // reproduces the run
  uint64_t seed = 0;
  int iters = 0, warmup = 0, sets = 1;
};

struct BenchRow {
  Point point;
  std::string backend;
  std::string status = "ok";  // "ok", "unsupported: …", "error: …"
  std::optional<double> time_us, min_us, max_us, floor_us, efficiency;
  double bytes = 0, flops = 0;
  double touched_experts = 0;  // mean over the input sets
  std::optional<double> flush_us;  // GPU: median flush-only graph time that was subtracted
  int sets = 1;                    // input sets rotated
  std::map<std::string, double> peers;        // name → median µs
  std::map<std::string, std::string> notes;   // e.g. a peer that failed: name → why
};

// The table printed to stdout and written into the .md.
// The current UTC time formatted by strftime(format).
std::string utc_now(const char* format);

std::string markdown_table(const std::vector<BenchRow>& rows, bool gpu);
// One JSON object per line: the run header first ("type":"run"), then rows ("type":"row").
std::string json_header(const RunFacts& f);
std::string json_row(const RunFacts& f, const BenchRow& r);
std::string markdown_report(const RunFacts& f, const std::vector<BenchRow>& rows);

// Appends / writes; create the directory if needed. Throws std::runtime_error naming the path.
void append_file(const std::string& path, const std::string& text);
void write_file(const std::string& path, const std::string& text);

}  // namespace fp4moe::cli
