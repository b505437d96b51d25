// A strict safetensors reader and writer (include/fp4moe/checkpoint.h). Fuzzed by fuzz/.
//
// Every read is bounds-checked against the buffer; every size product is overflow-checked; JSON
// nesting is bounded, so hostile input can cost at most O(file size) time and memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "fp4moe/checkpoint.h"
#include "fp4moe/errors.h"

namespace fp4moe {
namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // as the reference implementation: 100 MB
constexpr int kMaxDepth = 64;

struct DTypeInfo {
  StDType dtype;
  const char* name;
  int bits;
};
constexpr DTypeInfo kDTypes[] = {
    {StDType::kBool, "BOOL", 8},     {StDType::kU8, "U8", 8},          {StDType::kI8, "I8", 8},
    {StDType::kF8_E4M3, "F8_E4M3", 8}, {StDType::kF8_E5M2, "F8_E5M2", 8}, {StDType::kF8_E8M0, "F8_E8M0", 8},
    {StDType::kF4, "F4", 4},         {StDType::kI16, "I16", 16},       {StDType::kU16, "U16", 16},
    {StDType::kF16, "F16", 16},      {StDType::kBF16, "BF16", 16},     {StDType::kI32, "I32", 32},
    {StDType::kU32, "U32", 32},      {StDType::kF32, "F32", 32},       {StDType::kI64, "I64", 64},
    {StDType::kU64, "U64", 64},      {StDType::kF64, "F64", 64},
};

// ---- a minimal JSON DOM ------------------------------------------------------------------------
struct JValue {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  bool is_uint = false;  // a non-negative integer literal that fits in int64
  int64_t uint = 0;
  std::string str;
  std::vector<JValue> arr;
  std::vector<std::string> keys;  // object members, in order (parallel to vals)
  std::vector<JValue> vals;
};

class JsonParser {
 public:
  JsonParser(const char* p, size_t n, const std::string& file) : p_(p), end_(p + n), file_(file) {}

  JValue parse_document() {
    JValue v = value(0);
    ws();
    if (p_ != end_) fail("unexpected bytes after the JSON value");
    return v;
  }

 private:
  const char* p_;
  const char* end_;
  const std::string& file_;
  const char* begin_ = p_;

  [[noreturn]] void fail(const std::string& what) {
    throw InvalidArgument(file_, detail::concat(file_, ": malformed safetensors header: ", what, " at header byte ",
                                                p_ - begin_));
  }
  void ws() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool eat(char c) {
    if (p_ != end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void literal(const char* word) {
    for (const char* w = word; *w; ++w)
      if (!eat(*w)) fail(detail::concat("expected '", word, "'"));
  }

  JValue value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 64");
    ws();
    if (p_ == end_) fail("unexpected end of header");
    JValue v;
    switch (*p_) {
      case '{': {
        ++p_;
        v.kind = JValue::kObject;
        ws();
        if (eat('}')) return v;
        std::set<std::string> seen;
        for (;;) {
          ws();
          if (p_ == end_ || *p_ != '"') fail("expected a string key");
          std::string key = string();
          if (!seen.insert(key).second) fail(detail::concat("duplicate key \"", key, "\""));
          ws();
          if (!eat(':')) fail("expected ':'");
          JValue item = value(depth + 1);
          v.keys.push_back(std::move(key));
          v.vals.push_back(std::move(item));
          ws();
          if (eat(',')) continue;
          if (eat('}')) return v;
          fail("expected ',' or '}'");
        }
      }
      case '[': {
        ++p_;
        v.kind = JValue::kArray;
        ws();
        if (eat(']')) return v;
        for (;;) {
          v.arr.push_back(value(depth + 1));
          ws();
          if (eat(',')) continue;
          if (eat(']')) return v;
          fail("expected ',' or ']'");
        }
      }
      case '"':
        v.kind = JValue::kString;
        v.str = string();
        return v;
      case 't': literal("true"); v.kind = JValue::kBool; v.boolean = true; return v;
      case 'f': literal("false"); v.kind = JValue::kBool; return v;
      case 'n': literal("null"); return v;
      default:
        number(v);
        return v;
    }
  }

  void number(JValue& v) {
    v.kind = JValue::kNumber;
    const char* start = p_;
    bool neg = eat('-');
    if (p_ == end_ || !(*p_ >= '0' && *p_ <= '9')) fail("invalid value");
    bool overflow = false;
    uint64_t acc = 0;
    if (*p_ == '0') {
      ++p_;
    } else {
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') {
        const uint64_t d = static_cast<uint64_t>(*p_ - '0');
        if (acc > (static_cast<uint64_t>(INT64_MAX) - d) / 10) overflow = true;
        else acc = acc * 10 + d;
        ++p_;
      }
    }
    bool integer = true;
    if (eat('.')) {
      integer = false;
      if (p_ == end_ || !(*p_ >= '0' && *p_ <= '9')) fail("invalid number");
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      integer = false;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !(*p_ >= '0' && *p_ <= '9')) fail("invalid number");
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    (void)start;
    v.is_uint = integer && !neg && !overflow;
    v.uint = v.is_uint ? static_cast<int64_t>(acc) : 0;
  }

  static void put_utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex4() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      if (p_ == end_) fail("truncated \\u escape");
      const char c = *p_++;
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("invalid \\u escape");
    }
    return v;
  }
  std::string string() {
    ++p_;  // the opening quote
    std::string s;
    for (;;) {
      if (p_ == end_) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(*p_++);
      if (c == '"') return s;
      if (c < 0x20) fail("control character in a string");
      if (c != '\\') {
        s += static_cast<char>(c);
        continue;
      }
      if (p_ == end_) fail("unterminated escape");
      const char e = *p_++;
      switch (e) {
        case '"': s += '"'; break;
        case '\\': s += '\\'; break;
        case '/': s += '/'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'n': s += '\n'; break;
        case 'r': s += '\r'; break;
        case 't': s += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!(eat('\\') && eat('u'))) fail("lone high surrogate");
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("invalid low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone low surrogate");
          }
          put_utf8(s, cp);
          break;
        }
        default: fail("invalid escape");
      }
    }
  }
};

// A printable form of a tensor name for messages (names come from untrusted files).
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7F) out += static_cast<char>(c);
    else out += detail::concat("\\x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
  }
  if (s.size() > 200) out += "...";
  return out;
}

const DTypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

void json_escape(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += detail::concat("\\u00", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

}  // namespace

struct SafetensorsFile::Impl {
  std::string path;
  std::shared_ptr<const uint8_t> buffer;  // the whole file
  size_t size = 0;
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> metadata;
};

const char* to_string(StDType d) {
  for (const auto& x : kDTypes)
    if (x.dtype == d) return x.name;
  return "?";
}
int dtype_bits(StDType d) {
  for (const auto& x : kDTypes)
    if (x.dtype == d) return x.bits;
  return 0;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

namespace {

void parse_into(SafetensorsFile::Impl& f) {
  const std::string& file = f.path;
  const uint8_t* base = f.buffer.get();
  FP4MOE_REQUIRE(f.size >= 8, InvalidArgument, file, "not a safetensors file: ", f.size,
                 " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  FP4MOE_REQUIRE(n <= f.size - 8, InvalidArgument, file, "header length ", n, " runs past the end of the file (",
                 f.size, " bytes): truncated or not a safetensors file");
  FP4MOE_REQUIRE(n <= kMaxHeader, InvalidArgument, file, "header length ", n, " exceeds the 100 MB limit");
  FP4MOE_REQUIRE(n >= 2 && base[8] == '{', InvalidArgument, file,
                 "the header does not start with '{' (not a safetensors file)");
  JsonParser parser(reinterpret_cast<const char*>(base + 8), static_cast<size_t>(n), file);
  const JValue root = parser.parse_document();
  FP4MOE_REQUIRE(root.kind == JValue::kObject, InvalidArgument, file, "the header is not a JSON object");

  const uint8_t* data = base + 8 + n;
  const uint64_t data_size = f.size - 8 - n;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (begin, end) per tensor, then sorted
  std::vector<const std::string*> range_names;

  for (size_t member = 0; member < root.keys.size(); ++member) {
    const std::string& name = root.keys[member];
    const JValue& v = root.vals[member];
    const std::string tname = printable(name);
    if (name == "__metadata__") {
      FP4MOE_REQUIRE(v.kind == JValue::kObject, InvalidArgument, file, "__metadata__ is not an object");
      for (size_t j = 0; j < v.keys.size(); ++j) {
        const std::string& k = v.keys[j];
        const JValue& mv = v.vals[j];
        FP4MOE_REQUIRE(mv.kind == JValue::kString, InvalidArgument, file, "__metadata__ value of '", printable(k),
                       "' is not a string");
        f.metadata[k] = mv.str;
      }
      continue;
    }
    FP4MOE_REQUIRE(v.kind == JValue::kObject, InvalidArgument, file, "tensor '", tname, "': entry is not an object");
    const JValue *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (size_t j = 0; j < v.keys.size(); ++j) {
      const std::string& k = v.keys[j];
      const JValue& fv = v.vals[j];
      if (k == "dtype") dtype = &fv;
      else if (k == "shape") shape = &fv;
      else if (k == "data_offsets") offsets = &fv;
      else
        FP4MOE_REQUIRE(false, InvalidArgument, file, "tensor '", tname, "': unknown field '", printable(k), "'");
    }
    FP4MOE_REQUIRE(dtype && shape && offsets, InvalidArgument, file, "tensor '", tname,
                   "': needs dtype, shape and data_offsets");
    FP4MOE_REQUIRE(dtype->kind == JValue::kString, InvalidArgument, file, "tensor '", tname,
                   "': dtype is not a string");
    const DTypeInfo* info = find_dtype(dtype->str);
    FP4MOE_REQUIRE(info != nullptr, InvalidArgument, file, "tensor '", tname, "': unknown dtype '",
                   printable(dtype->str), "'");
    FP4MOE_REQUIRE(shape->kind == JValue::kArray, InvalidArgument, file, "tensor '", tname,
                   "': shape is not an array");
    FP4MOE_REQUIRE(shape->arr.size() <= 16, InvalidArgument, file, "tensor '", tname, "': ", shape->arr.size(),
                   " dimensions (at most 16)");
    StTensor t;
    t.name = name;
    t.file = file;
    t.dtype = info->dtype;
    // Element count, overflow-checked: bits must stay below 2^63.
    uint64_t bits = static_cast<uint64_t>(info->bits);
    bool overflow = false, zero = false;
    for (const auto& d : shape->arr) {
      FP4MOE_REQUIRE(d.kind == JValue::kNumber && d.is_uint, InvalidArgument, file, "tensor '", tname,
                     "': shape entries must be non-negative integers");
      t.shape.push_back(d.uint);
      if (d.uint == 0) zero = true;
      else if (bits > (static_cast<uint64_t>(INT64_MAX) / static_cast<uint64_t>(d.uint))) overflow = true;
      else bits *= static_cast<uint64_t>(d.uint);
    }
    FP4MOE_REQUIRE(zero || !overflow, InvalidArgument, file, "tensor '", tname, "': shape is too large");
    if (zero) bits = 0;
    FP4MOE_REQUIRE(bits % 8 == 0, InvalidArgument, file, "tensor '", tname, "': ", to_string(info->dtype),
                   " shape holds a fractional number of bytes");
    FP4MOE_REQUIRE(offsets->kind == JValue::kArray && offsets->arr.size() == 2 && offsets->arr[0].kind == JValue::kNumber &&
                       offsets->arr[0].is_uint && offsets->arr[1].kind == JValue::kNumber && offsets->arr[1].is_uint,
                   InvalidArgument, file, "tensor '", tname, "': data_offsets must be two non-negative integers");
    const uint64_t b = static_cast<uint64_t>(offsets->arr[0].uint), e = static_cast<uint64_t>(offsets->arr[1].uint);
    FP4MOE_REQUIRE(b <= e, InvalidArgument, file, "tensor '", tname, "': data_offsets [", b, ", ", e,
                   "] end before they begin");
    FP4MOE_REQUIRE(e <= data_size, InvalidArgument, file, "tensor '", tname, "': data_offsets [", b, ", ", e,
                   "] run past the end of the data (", data_size, " bytes): truncated or lying file");
    FP4MOE_REQUIRE(e - b == bits / 8, InvalidArgument, file, "tensor '", tname, "': data_offsets [", b, ", ", e,
                   "] hold ", e - b, " bytes but ", to_string(info->dtype), " of this shape needs ", bits / 8);
    t.data = data + b;
    t.nbytes = static_cast<size_t>(e - b);
    ranges.emplace_back(b, e);
    range_names.push_back(&name);
    f.tensors.emplace(name, std::move(t));
  }
  // Offsets must tile the data exactly: sorted, no overlap, no hole, nothing after the last.
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  uint64_t pos = 0;
  for (size_t i : order) {
    FP4MOE_REQUIRE(ranges[i].first >= pos, InvalidArgument, file, "tensor '", printable(*range_names[i]),
                   "': data_offsets [", ranges[i].first, ", ", ranges[i].second, "] overlap another tensor");
    FP4MOE_REQUIRE(ranges[i].first == pos, InvalidArgument, file, "tensor '", printable(*range_names[i]),
                   "': data_offsets [", ranges[i].first, ", ", ranges[i].second, "] leave a hole at byte ", pos);
    pos = ranges[i].second;
  }
  FP4MOE_REQUIRE(pos == data_size, InvalidArgument, file, "the tensors cover ", pos, " bytes of data but the file has ",
                 data_size, " after the header");
}

}  // namespace

SafetensorsFile SafetensorsFile::from_bytes(const uint8_t* data, size_t size, const std::string& name) {
  auto impl = std::make_shared<Impl>();
  impl->path = name;
  uint8_t* copy = new uint8_t[size ? size : 1];
  if (size) std::memcpy(copy, data, size);
  impl->buffer = std::shared_ptr<const uint8_t>(copy, [](const uint8_t* p) { delete[] p; });
  impl->size = size;
  parse_into(*impl);
  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FP4MOE_REQUIRE(fd >= 0, InvalidArgument, path, "cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InvalidArgument(path, path + ": not a regular file");
  }
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->size = static_cast<size_t>(st.st_size);
  if (impl->size == 0) {
    ::close(fd);
    impl->buffer = std::shared_ptr<const uint8_t>(new uint8_t[1], [](const uint8_t* p) { delete[] p; });
  } else {
    void* m = ::mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    FP4MOE_REQUIRE(m != MAP_FAILED, InvalidArgument, path, "cannot map: ", std::strerror(errno));
    const size_t size = impl->size;
    impl->buffer = std::shared_ptr<const uint8_t>(static_cast<const uint8_t*>(m),
                                                  [size](const uint8_t* p) { ::munmap(const_cast<uint8_t*>(p), size); });
  }
  parse_into(*impl);
  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

const std::string& SafetensorsFile::path() const { return impl_->path; }
bool SafetensorsFile::contains(const std::string& t) const { return impl_->tensors.count(t) != 0; }
std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> v;
  for (const auto& kv : impl_->tensors) v.push_back(kv.first);
  return v;
}
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }
const StTensor* SafetensorsFile::find(const std::string& t) const {
  auto it = impl_->tensors.find(t);
  return it == impl_->tensors.end() ? nullptr : &it->second;
}
const StTensor& SafetensorsFile::get(const std::string& t) const {
  const StTensor* p = find(t);
  FP4MOE_REQUIRE(p != nullptr, InvalidArgument, impl_->path, "no tensor '", printable(t), "'");
  return *p;
}

std::vector<uint8_t> serialize_safetensors(const std::vector<StTensorData>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool f2 = true;
    for (const auto& [k, v] : metadata) {
      if (!f2) h += ',';
      f2 = false;
      json_escape(h, k);
      h += ':';
      json_escape(h, v);
    }
    h += '}';
    first = false;
  }
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    uint64_t bits = static_cast<uint64_t>(dtype_bits(t.dtype));
    for (int64_t d : t.shape) {
      FP4MOE_REQUIRE(d >= 0, InvalidArgument, "tensors", "tensor '", t.name, "': negative dimension ", d);
      bits *= static_cast<uint64_t>(d);
    }
    FP4MOE_REQUIRE(bits % 8 == 0, InvalidArgument, "tensors", "tensor '", t.name, "': fractional byte count");
    sizes.push_back(bits / 8);
    if (!first) h += ',';
    first = false;
    json_escape(h, t.name);
    h += detail::concat(":{\"dtype\":\"", to_string(t.dtype), "\",\"shape\":[");
    for (size_t i = 0; i < t.shape.size(); ++i) h += detail::concat(i ? "," : "", t.shape[i]);
    h += detail::concat("],\"data_offsets\":[", offset, ",", offset + bits / 8, "]}");
    offset += bits / 8;
  }
  h += '}';
  while (h.size() % 8) h += ' ';  // the reference writer pads the header to 8 bytes
  std::vector<uint8_t> out(8 + h.size() + offset);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, h.data(), h.size());
  uint8_t* p = out.data() + 8 + h.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (sizes[i]) std::memcpy(p, tensors[i].data, sizes[i]);
    p += sizes[i];
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<StTensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<uint8_t> bytes = serialize_safetensors(tensors, metadata);
  std::ofstream os(path, std::ios::binary | std::ios::trunc);
  FP4MOE_REQUIRE(os.good(), InvalidArgument, path, "cannot open for writing");
  os.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  FP4MOE_REQUIRE(os.good(), InvalidArgument, path, "write failed");
}

CheckpointFiles::CheckpointFiles(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  FP4MOE_REQUIRE(!paths.empty(), InvalidArgument, "paths", "no checkpoint file given");
  std::vector<std::string> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(p, ec))
        if (entry.path().extension() == ".safetensors") found.push_back(entry.path().string());
      std::sort(found.begin(), found.end());
      FP4MOE_REQUIRE(!found.empty(), InvalidArgument, p, "directory holds no .safetensors file");
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(p);
    }
  }
  for (const auto& path : files) {
    files_.push_back(SafetensorsFile::open(path));
    for (const auto& name : files_.back().names()) {
      auto [it, inserted] = index_.emplace(name, files_.size() - 1);
      FP4MOE_REQUIRE(inserted, InvalidArgument, path, "tensor '", printable(name), "' is also in ",
                     files_[it->second].path());
    }
  }
}

const StTensor* CheckpointFiles::find(const std::string& t) const {
  auto it = index_.find(t);
  return it == index_.end() ? nullptr : files_[it->second].find(t);
}

const StTensor& CheckpointFiles::get(const std::string& t) const {
  const StTensor* p = find(t);
  FP4MOE_REQUIRE(p != nullptr, InvalidArgument, description(), "no tensor '", printable(t), "'");
  return *p;
}

std::string CheckpointFiles::description() const {
  std::string s;
  for (const auto& f : files_) s += (s.empty() ? "" : ", ") + f.path();
  return s;
}

}  // namespace fp4moe
