// fp4moe/errors.h — the typed errors every public entry point throws.
//
// Each error names the argument and the values involved; `argument()` gives the name alone so
// callers (and the Python binding) can map it. Nothing in the library calls exit() or traps on
// user input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fp4moe {

enum class ErrorKind {
  kInvalidArgument,  // a shape, dtype, pointer, alignment or value is wrong
  kUnsupported,      // a valid request this build or backend cannot serve
  kCapacity,         // past max_tokens, a 32-bit index limit, or device memory
  kCuda,             // a CUDA runtime call failed
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string argument, const std::string& message)
      : std::runtime_error(message), kind_(kind), argument_(std::move(argument)) {}
  ErrorKind kind() const noexcept { return kind_; }
  const std::string& argument() const noexcept { return argument_; }

 private:
  ErrorKind kind_;
  std::string argument_;
};

class InvalidArgument : public Error {
 public:
  InvalidArgument(std::string argument, const std::string& message)
      : Error(ErrorKind::kInvalidArgument, std::move(argument), message) {}
};

class Unsupported : public Error {
 public:
  Unsupported(std::string argument, const std::string& message)
      : Error(ErrorKind::kUnsupported, std::move(argument), message) {}
};

class CapacityError : public Error {
 public:
  CapacityError(std::string argument, const std::string& message)
      : Error(ErrorKind::kCapacity, std::move(argument), message) {}
};

class CudaError : public Error {
 public:
  CudaError(std::string call, const std::string& message)
      : Error(ErrorKind::kCuda, std::move(call), message) {}
};

namespace detail {
template <typename... Ts>
std::string concat(const Ts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace fp4moe

// FP4MOE_REQUIRE(cond, ErrorType, "argument", message parts...): throws ErrorType whose message is
// "argument: <parts>" when cond is false.
#define FP4MOE_REQUIRE(cond, ErrorType, arg, ...)                                      \
  do {                                                                                  \
    if (!(cond))                                                                        \
      throw ::fp4moe::ErrorType(arg, ::fp4moe::detail::concat(arg, ": ", __VA_ARGS__)); \
  } while (0)
