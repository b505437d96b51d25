// Parsing and validating the `fp4moe` command line. See cli_args.h.
#include "cli_args.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "fp4moe/ep.h"
#include "fp4moe/errors.h"
#include "testing/problem.h"

namespace fp4moe::cli {
namespace {

[[noreturn]] void bad(const std::string& flag, const std::string& value, const std::string& why) {
  std::ostringstream os;
  os << flag << " ";
  if (!value.empty()) os << "'" << value << "': ";
  os << why;
  throw UsageError(os.str());
}

std::vector<std::string> split_list(const std::string& flag, const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) bad(flag, s, "empty item in the comma-separated list");
    out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int64_t parse_int(const std::string& flag, const std::string& s, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    bad(flag, s, "expected an integer");
  if (v < lo || v > hi) bad(flag, s, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

float parse_float(const std::string& flag, const std::string& s) {
  if (s == "inf" || s == "+inf") return INFINITY;
  size_t used = 0;
  float v = 0;
  try {
    v = std::stof(s, &used);
  } catch (const std::exception&) {
    bad(flag, s, "expected a number");
  }
  if (used != s.size() || std::isnan(v)) bad(flag, s, "expected a number");
  return v;
}

std::string join_names(const std::vector<testkit::NamedShape>& shapes) {
  std::string s;
  for (const auto& n : shapes) s += (s.empty() ? "" : ", ") + std::string(n.name);
  return s;
}

Shape from_named(const testkit::NamedShape& n) {
  return {n.name, n.hidden, n.intermediate, n.experts, n.top_k, n.activation, n.swiglu};
}

// Flags that take a value, and the boolean ones.
const std::set<std::string> kValueFlags = {
    "--model", "--hidden", "--intermediate", "--experts", "--topk", "--activation", "--swiglu-alpha",
    "--swiglu-beta", "--swiglu-limit", "--tokens", "--format", "--mode", "--backend", "--device", "--seed",
    "--out-dir", "--run-name", "--iters", "--warmup", "--sets", "--threads", "--ep", "--ep-strategy",
    "--prefill-bf16-gib", "--prefill-bf16-min-rows", "--dynamic-tile-m"};
const std::set<std::string> kBoolFlags = {"--bias", "--no-peer", "--help"};

// Which flags each subcommand accepts.
bool accepts(const std::string& command, const std::string& flag) {
  if (flag == "--help") return true;
  if (command == "info") return false;
  static const std::set<std::string> bench_only = {"--out-dir", "--run-name", "--iters", "--warmup", "--sets",
                                                    "--no-peer", "--ep", "--ep-strategy"};
  if (command == "check") return !bench_only.count(flag);
  return true;
}

}  // namespace

RunnerOptions runner_options(const Args& args, Backend backend, int64_t tokens) {
  RunnerOptions o;
  o.max_tokens = tokens;
  o.backend = backend;
  o.cpu_threads = args.threads;
  o.prefill_bf16_bytes = args.prefill_bf16_bytes;
  o.prefill_bf16_min_rows = args.prefill_bf16_min_rows;
  o.dynamic_tile_m = args.dynamic_tile_m;
  return o;
}

std::string backend_label(const MoeRunner& runner, int64_t tokens) {
  const Backend b = runner.plan(tokens);
  if (runner.plan_bf16_copy(tokens)) return std::string(to_string(b)) + " (bf16 copy)";
  if (b == Backend::kDynamic && runner.options().dynamic_tile_m > 0)
    return std::string(to_string(b)) + " (m-tile " + std::to_string(runner.options().dynamic_tile_m) + ")";
  return std::string(to_string(b));
}

const std::vector<int64_t>& protocol_tokens() {
  static const std::vector<int64_t> t = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384};
  return t;
}

std::string usage() {
  std::ostringstream os;
  os << "usage: fp4moe <command> [flags]\n"
        "\n"
        "commands:\n"
        "  info    version, commit, CUDA version, archs and the GPUs found\n"
        "  check   run random problems through fp4moe and compare against the float64 reference\n"
        "  bench   time fp4moe against the hardware floors and a cuBLAS bf16 peer\n"
        "          (bench-protocol.md; without a GPU: the CPU reference backend, no floors)\n"
        "\n"
        "layer shape (check, bench):\n"
        "  --model NAME[,NAME..]|all   a named shape (default qwen3-30b-a3b):\n"
        "                              "
     << join_names(testkit::named_shapes())
     << "\n"
        "  --hidden H --intermediate I --experts E --topk K [--activation A]\n"
        "                              a command-line shape instead (A: silu, gelu_tanh, swiglu_oai, relu2)\n"
        "  --swiglu-alpha X --swiglu-beta X --swiglu-limit X   swiglu_oai parameters (1.702, 1, inf)\n"
        "\n"
        "points (check, bench; lists are comma-separated):\n"
        "  --tokens LIST        token counts (check default 1,7,64; bench default on a GPU\n"
        "                       1,2,4,...,4096,16384, on the CPU 1,4)\n"
        "  --format LIST        nvfp4, mxfp4 (default nvfp4)\n"
        "  --mode LIST          a4, a16, a8 (default a4)\n"
        "  --bias               per-expert biases b13, b2\n"
        "  --backend NAME       auto, reference, generic, direct_micro, micro, static, dynamic (default auto);\n"
        "                       bench takes a comma list and times every point on each\n"
        "  --device cpu|cuda    default: cuda when a GPU is present, else cpu\n"
        "  --seed N             random data (check default 1; bench default fresh, printed in the command)\n"
        "  --threads N          host threads for generation and the reference (default all)\n"
        "  --prefill-bf16-gib G device memory for dynamic's bf16 weight copy (RunnerOptions::\n"
        "                       prefill_bf16_bytes; default 0: none); calls with at least\n"
        "  --prefill-bf16-min-rows N   routes per expert (T·K / E, default "
     << RunnerOptions{}.prefill_bf16_min_rows
     << ") dequantise once into it;\n"
        "                       their rows read \"dynamic (bf16 copy)\"\n"
        "  --dynamic-tile-m N   dynamic's register-path m-tile: 16, 32, 64 or 128 routed rows (RunnerOptions::\n"
        "                       dynamic_tile_m; default 0: from the rows per expert); rows read\n"
        "                       \"dynamic (m-tile N)\"\n"
        "\n"
        "bench only:\n"
        "  --out-dir DIR        where <run-name>.jsonl and <run-name>.md go (default bench/results)\n"
        "  --run-name NAME      default bench-<date>-<time>-<gpu|cpu>\n"
        "  --iters N            timed calls per point (default 100 on a GPU, 3 on the CPU)\n"
        "  --warmup N           untimed calls first (default 10 on a GPU, 1 on the CPU)\n"
        "  --sets N             input sets rotated between calls on a GPU (default 4)\n"
        "  --no-peer            skip the cuBLAS bf16 peer\n"
        "  --ep N               expert parallel over GPUs 0..N-1 (NCCL builds): per-layer time, bytes\n"
        "                       each rank moved, ratio to one GPU on N·T tokens; --tokens is per rank\n"
        "                       (default 1,16,128,1024), --iters default 20, --warmup 3\n"
        "  --ep-strategy S      allgather, alltoall, auto or both (default both)\n"
        "\n"
        "exit status: 0 success, 1 a check failed or a run error, 2 bad command line\n"
        "examples:\n"
        "  fp4moe check --model all --format nvfp4,mxfp4 --mode a4,a16,a8 --tokens 1,16,300\n"
        "  fp4moe bench --model qwen3-30b-a3b,deepseek-v3 --tokens 1,16,64,1024\n"
        "  fp4moe bench --hidden 2880 --intermediate 2880 --experts 128 --topk 4 --activation swiglu_oai \\\n"
        "               --swiglu-limit 7 --tokens 1,64\n";
  return os.str();
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 0; i < argc; ++i) a.argv.push_back(argv[i]);
  if (argc < 2) throw UsageError("missing command (info, check or bench)");
  a.command = argv[1];
  if (a.command == "--help" || a.command == "-h" || a.command == "help") {
    a.command = "help";
    return a;
  }
  if (a.command != "info" && a.command != "check" && a.command != "bench")
    throw UsageError("unknown command '" + a.command + "' (expected info, check or bench)");

  // Collect flag → value, accepting "--flag value" and "--flag=value".
  std::map<std::string, std::string> v;
  for (int i = 2; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "-h") flag = "--help";
    const size_t eq = flag.find('=');
    const bool inline_value = flag.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (!kValueFlags.count(flag) && !kBoolFlags.count(flag)) {
      if (flag.rfind("-", 0) == 0) throw UsageError("unknown flag " + flag + " (see fp4moe --help)");
      throw UsageError("unexpected argument '" + flag + "' (flags start with --; see fp4moe --help)");
    }
    if (!accepts(a.command, flag)) throw UsageError(flag + " does not apply to 'fp4moe " + a.command + "'");
    if (v.count(flag)) throw UsageError(flag + " given twice");
    if (kBoolFlags.count(flag)) {
      if (inline_value) throw UsageError(flag + " takes no value, got '" + value + "'");
    } else if (!inline_value) {
      if (i + 1 >= argc) throw UsageError(flag + " needs a value");
      value = argv[++i];
    }
    v[flag] = value;
  }
  if (v.count("--help")) {
    a.command = "help";
    return a;
  }
  auto has = [&](const char* f) { return v.count(f) > 0; };

  // Shape: --model or the five shape flags.
  const bool cmd_shape = has("--hidden") || has("--intermediate") || has("--experts") || has("--topk");
  if (has("--model") && cmd_shape)
    throw UsageError("--model and --hidden/--intermediate/--experts/--topk are exclusive: give a named shape or a "
                     "command-line shape");
  if (cmd_shape) {
    for (const char* f : {"--hidden", "--intermediate", "--experts", "--topk"})
      if (!has(f)) throw UsageError(std::string(f) + " is missing (a command-line shape needs --hidden, "
                                    "--intermediate, --experts and --topk)");
    Shape s;
    s.hidden = static_cast<int>(parse_int("--hidden", v["--hidden"], 1, 1 << 20));
    s.intermediate = static_cast<int>(parse_int("--intermediate", v["--intermediate"], 1, 1 << 20));
    s.experts = static_cast<int>(parse_int("--experts", v["--experts"], 1, kMaxExperts));
    s.top_k = static_cast<int>(parse_int("--topk", v["--topk"], 1, kMaxTopK));
    if (has("--activation")) {
      try {
        s.activation = parse_activation(v["--activation"], "--activation");
      } catch (const Error& e) {
        throw UsageError(e.what());
      }
    }
    if (has("--swiglu-alpha")) s.swiglu.alpha = parse_float("--swiglu-alpha", v["--swiglu-alpha"]);
    if (has("--swiglu-beta")) s.swiglu.beta = parse_float("--swiglu-beta", v["--swiglu-beta"]);
    if (has("--swiglu-limit")) {
      s.swiglu.limit = parse_float("--swiglu-limit", v["--swiglu-limit"]);
      if (!(s.swiglu.limit > 0)) bad("--swiglu-limit", v["--swiglu-limit"], "must be positive (inf: no clamp)");
    }
    if (s.activation != Activation::kSwigluOai && (has("--swiglu-alpha") || has("--swiglu-beta") || has("--swiglu-limit")))
      throw UsageError("--swiglu-* apply to --activation swiglu_oai only");
    std::ostringstream name;
    name << "H" << s.hidden << "-I" << s.intermediate << "-E" << s.experts << "-K" << s.top_k << "-"
         << to_string(s.activation);
    s.name = name.str();
    a.shapes.push_back(s);
  } else {
    for (const char* f : {"--activation", "--swiglu-alpha", "--swiglu-beta", "--swiglu-limit"})
      if (has(f)) throw UsageError(std::string(f) + " applies to a command-line shape (--hidden ...) only; a "
                                   "named model fixes its activation");
    const std::string models = has("--model") ? v["--model"] : "qwen3-30b-a3b";
    for (const std::string& m : split_list("--model", models)) {
      if (m == "all") {
        for (const auto& n : testkit::named_shapes()) a.shapes.push_back(from_named(n));
        continue;
      }
      const testkit::NamedShape* n = testkit::find_shape(m);
      if (!n) bad("--model", m, "unknown model; known: all, " + join_names(testkit::named_shapes()));
      a.shapes.push_back(from_named(*n));
    }
  }

  if (has("--tokens"))
    for (const std::string& t : split_list("--tokens", v["--tokens"]))
      a.tokens.push_back(parse_int("--tokens", t, 1, int64_t{1} << 24));
  try {
    for (const std::string& f : split_list("--format", has("--format") ? v["--format"] : "nvfp4"))
      a.formats.push_back(parse_weight_format(f, "--format"));
    for (const std::string& m : split_list("--mode", has("--mode") ? v["--mode"] : "a4"))
      a.modes.push_back(parse_act_mode(m, "--mode"));
    if (has("--backend")) {
      a.backends.clear();
      for (const std::string& b : split_list("--backend", v["--backend"])) a.backends.push_back(parse_backend(b, "--backend"));
      if (a.command != "bench" && a.backends.size() > 1)
        throw UsageError("--backend: only bench takes a list (got '" + v["--backend"] + "')");
      a.backend = a.backends.front();
    }
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  a.bias = has("--bias");
  if (has("--device")) {
    const std::string d = v["--device"];
    if (d == "cpu") a.device = DeviceChoice::kCpu;
    else if (d == "cuda" || d == "gpu") a.device = DeviceChoice::kCuda;
    else bad("--device", d, "expected cpu or cuda");
  }
  if (has("--seed")) a.seed = static_cast<uint64_t>(parse_int("--seed", v["--seed"], 0, INT64_MAX));
  if (has("--threads")) a.threads = static_cast<int>(parse_int("--threads", v["--threads"], 0, 4096));
  if (has("--out-dir")) {
    a.out_dir = v["--out-dir"];
    if (a.out_dir.empty()) bad("--out-dir", "", "must not be empty");
  }
  if (has("--run-name")) {
    a.run_name = v["--run-name"];
    const bool ok = !a.run_name.empty() && std::all_of(a.run_name.begin(), a.run_name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    });
    if (!ok) bad("--run-name", a.run_name, "use letters, digits, '-', '_' and '.' only");
  }
  if (has("--prefill-bf16-gib")) {
    const float gib = parse_float("--prefill-bf16-gib", v["--prefill-bf16-gib"]);
    if (!(gib >= 0.0f && gib <= 1024.0f)) bad("--prefill-bf16-gib", v["--prefill-bf16-gib"], "must be in [0, 1024]");
    a.prefill_bf16_bytes = static_cast<int64_t>(static_cast<double>(gib) * (int64_t{1} << 30));
  }
  if (has("--prefill-bf16-min-rows"))
    a.prefill_bf16_min_rows = parse_int("--prefill-bf16-min-rows", v["--prefill-bf16-min-rows"], 1, int64_t{1} << 40);
  if (has("--dynamic-tile-m")) {
    a.dynamic_tile_m = static_cast<int>(parse_int("--dynamic-tile-m", v["--dynamic-tile-m"], 0, 128));
    if (!is_dynamic_tile_m(a.dynamic_tile_m))
      bad("--dynamic-tile-m", v["--dynamic-tile-m"], "must be 0 (from the rows per expert), 16, 32, 64 or 128");
  }
  if (has("--iters")) a.iters = static_cast<int>(parse_int("--iters", v["--iters"], 1, 100000));
  if (has("--warmup")) a.warmup = static_cast<int>(parse_int("--warmup", v["--warmup"], 0, 100000));
  if (has("--sets")) a.sets = static_cast<int>(parse_int("--sets", v["--sets"], 1, 64));
  a.peer = !has("--no-peer");
  if (has("--ep")) a.ep = static_cast<int>(parse_int("--ep", v["--ep"], 1, 1024));
  if (has("--ep-strategy")) {
    if (!has("--ep")) throw UsageError("--ep-strategy applies to bench --ep N only");
    a.ep_strategy = v["--ep-strategy"];
    if (a.ep_strategy != "both") {
      try {
        (void)parse_ep_strategy(a.ep_strategy, "--ep-strategy");
      } catch (const Error& e) {
        throw UsageError(std::string(e.what()) + " (or both)");
      }
    }
  }

  // Every (shape, format, mode) must be a valid layer: MoeConfig::validate names the field.
  for (const Shape& s : a.shapes)
    for (WeightFormat f : a.formats)
      for (ActMode m : a.modes) {
        MoeConfig c;
        c.num_experts = s.experts, c.hidden = s.hidden, c.intermediate = s.intermediate, c.top_k = s.top_k;
        c.format = f, c.mode = m, c.activation = s.activation, c.swiglu = s.swiglu, c.has_bias = a.bias;
        try {
          c.validate();
        } catch (const Error& e) {
          throw UsageError("shape " + s.name + " with --format " + std::string(to_string(f)) + " --mode " +
                           std::string(to_string(m)) + " is not a valid layer: " + e.what());
        }
      }
  return a;
}

std::string reproducing_command(const Args& args, uint64_t seed) {
  auto quote = [](const std::string& s) {
    const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("-_=.,/:+").find(c) != std::string_view::npos;
    });
    if (plain) return s;
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  std::ostringstream cmd;
  for (size_t i = 0; i < args.argv.size(); ++i) cmd << (i ? " " : "") << quote(args.argv[i]);
  if (!args.seed) cmd << " --seed " << seed;
  return cmd.str();
}

}  // namespace fp4moe::cli
