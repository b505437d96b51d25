// Bench output: markdown and JSON lines. See report.h.
#include "report.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fp4moe::cli {

std::string utc_now(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}
namespace {

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
    else if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else o += static_cast<char>(c);
  }
  return o + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0)  // integers (bytes, seed) in full
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string json_opt(const std::optional<double>& v) { return v ? json_number(*v) : "null"; }

// Builds {"k": v, ...} in insertion order.
class JsonObject {
 public:
  JsonObject& raw(const std::string& k, const std::string& v) {
    body_ += (body_.empty() ? "" : ", ") + json_string(k) + ": " + v;
    return *this;
  }
  JsonObject& str(const std::string& k, const std::string& v) { return raw(k, json_string(v)); }
  JsonObject& num(const std::string& k, double v) { return raw(k, json_number(v)); }
  JsonObject& opt(const std::string& k, const std::optional<double>& v) { return raw(k, json_opt(v)); }
  std::string done() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

std::string us(const std::optional<double>& v) { return v ? format_fixed(*v, 1) : "n/a"; }

}  // namespace

std::string markdown_table(const std::vector<BenchRow>& rows, bool gpu) {
  std::ostringstream os;
  os << "| model | format | mode | T | backend | time µs (median, min–max) | floor µs | efficiency | peer µs "
        "(cublas_bf16) |\n"
        "|---|---|---|---|---|---|---|---|---|\n";
  for (const BenchRow& r : rows) {
    os << "| " << r.point.shape.name << " | " << to_string(r.point.format) << " | " << to_string(r.point.mode)
       << (r.point.bias ? "+bias" : "") << " | " << r.point.tokens << " | " << r.backend << " | ";
    if (r.status != "ok") os << r.status;
    else os << us(r.time_us) << " (" << us(r.min_us) << "–" << us(r.max_us) << ")";
    os << " | " << us(r.floor_us) << " | " << (r.efficiency ? format_fixed(100 * *r.efficiency, 1) + " %" : "n/a")
       << " | ";
    const auto p = r.peers.find("cublas_bf16");
    if (p != r.peers.end()) os << format_fixed(p->second, 1);
    else if (r.notes.count("cublas_bf16")) os << r.notes.at("cublas_bf16");
    else os << (gpu ? "—" : "n/a");
    os << " |\n";
  }
  return os.str();
}

std::string json_header(const RunFacts& f) {
  JsonObject o;
  o.str("type", "run").str("run", f.run).str("device", f.device).str("date", f.date).str("version", f.version)
      .str("commit", f.commit).str("gpu", f.gpu).num("sm_clock_mhz", f.sm_clock_mhz)
      .num("sm_clock_max_mhz", f.sm_clock_max_mhz).opt("read_tbs", f.read_tbs).opt("copy_tbs", f.copy_tbs);
  if (f.bf16_tflops || f.fp8_tflops)
    o.raw("gemm_tflops", JsonObject().opt("bf16", f.bf16_tflops).opt("fp8", f.fp8_tflops).done());
  else
    o.raw("gemm_tflops", "null");
  o.str("ceilings_detail", f.ceilings_detail).str("method", f.method).num("seed", static_cast<double>(f.seed))
      .num("iters", f.iters).num("warmup", f.warmup).num("sets", f.sets).str("command", f.command);
  return o.done();
}

std::string json_row(const RunFacts& f, const BenchRow& r) {
  const Point& p = r.point;
  JsonObject peers, notes;
  for (const auto& [k, v] : r.peers) peers.num(k, v);
  for (const auto& [k, v] : r.notes) notes.str(k, v);
  JsonObject o;
  o.str("type", "row").str("run", f.run).str("device", f.device).str("commit", f.commit).str("gpu", f.gpu)
      .str("model", p.shape.name).num("H", p.shape.hidden).num("I", p.shape.intermediate).num("E", p.shape.experts)
      .num("K", p.shape.top_k).str("activation", std::string(to_string(p.shape.activation)))
      .str("mode", std::string(to_string(p.mode))).str("format", std::string(to_string(p.format)))
      .raw("bias", p.bias ? "true" : "false").num("tokens", static_cast<double>(p.tokens)).str("backend", r.backend)
      .str("status", r.status).opt("time_us", r.time_us).opt("min_us", r.min_us).opt("max_us", r.max_us)
      .opt("floor_us", r.floor_us).num("bytes", r.bytes).num("flops", r.flops).opt("efficiency", r.efficiency)
      .num("touched_experts", r.touched_experts).opt("flush_us", r.flush_us).num("sets", r.sets).raw("peers", peers.done()).raw("notes", notes.done());
  return o.done();
}

std::string markdown_report(const RunFacts& f, const std::vector<BenchRow>& rows) {
  std::ostringstream os;
  os << "# fp4moe bench: " << f.run << "\n\n";
  os << "- date: " << f.date << "\n- fp4moe " << f.version << ", commit " << f.commit << "\n";
  if (f.device == "cuda") {
    os << "- GPU: " << f.gpu << ", SM clock measured " << format_fixed(f.sm_clock_mhz, 0) << " MHz (max "
       << format_fixed(f.sm_clock_max_mhz, 0) << ")\n";
    os << "- ceilings: read-only stream " << format_fixed(f.read_tbs.value_or(0), 2) << " TB/s, copy "
       << format_fixed(f.copy_tbs.value_or(0), 2) << " TB/s, bf16 GEMM " << format_fixed(f.bf16_tflops.value_or(0), 0)
       << " TFLOP/s, fp8 GEMM " << format_fixed(f.fp8_tflops.value_or(0), 0) << " TFLOP/s (" << f.ceilings_detail
       << ")\n";
    os << "- floor = max(bytes / read-only stream, flops / GEMM rate of the mode: bf16 for a4/a16, fp8 for a8); "
          "efficiency = floor / median time\n";
  } else {
    os << "- device: CPU (the reference backend; no GPU in this run) — no floor or efficiency applies\n";
  }
  os << "- method: " << f.method << "\n- seed " << f.seed << ", " << f.iters << " timed calls after " << f.warmup
     << " warm-up per point\n\n";
  os << markdown_table(rows, f.device == "cuda") << "\n";
  os << "Reproduce:\n\n```\n" << f.command << "\n```\n";
  return os.str();
}

void append_file(const std::string& path, const std::string& text) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream f(path, std::ios::app);
  if (!(f << text)) throw std::runtime_error("cannot write " + path);
}

void write_file(const std::string& path, const std::string& text) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream f(path, std::ios::trunc);
  if (!(f << text)) throw std::runtime_error("cannot write " + path);
}

}  // namespace fp4moe::cli
