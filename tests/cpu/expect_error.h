// Checking fp4moe's typed errors: the exact type, the argument it names, and the values its message
// carries. Used by test_weights.cpp and test_validation.cpp.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <typeinfo>

#include "fp4moe/errors.h"

namespace fp4moe::testing_errors {

// Success when fn throws exactly `E` (not another fp4moe::Error subclass), whose argument() is
// `argument` and whose what() contains every string in `needles`.
template <typename E>
::testing::AssertionResult throws_error(const std::function<void()>& fn, const std::string& argument,
                                        std::initializer_list<std::string> needles) {
  try {
    fn();
  } catch (const fp4moe::Error& e) {
    const std::string what = e.what();
    if (typeid(e) != typeid(E))
      return ::testing::AssertionFailure() << "threw " << typeid(e).name() << " instead of " << typeid(E).name()
                                           << ": " << what;
    if (e.argument() != argument)
      return ::testing::AssertionFailure() << "names argument '" << e.argument() << "' instead of '" << argument
                                           << "': " << what;
    for (const std::string& n : needles)
      if (what.find(n) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks '" << n << "': " << what;
    return ::testing::AssertionSuccess() << what;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-fp4moe exception: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw something that is not a std::exception";
  }
  return ::testing::AssertionFailure() << "did not throw (expected " << typeid(E).name() << " naming '" << argument
                                       << "')";
}

// expect_error<InvalidArgument>(fn, "hidden", "130"): the function form the brief asks for.
template <typename E, typename F, typename... S>
void expect_error(F&& fn, const std::string& argument, const S&... needles) {
  EXPECT_TRUE(throws_error<E>(std::function<void()>(std::forward<F>(fn)), argument, {std::string(needles)...}));
}

}  // namespace fp4moe::testing_errors

// EXPECT_ERROR(InvalidArgument, statement, "argument", "value", ...): the same with the caller's line.
#define EXPECT_ERROR(Type, statement, argument, ...)                                                    \
  EXPECT_TRUE(::fp4moe::testing_errors::throws_error<::fp4moe::Type>([&]() { statement; }, argument,   \
                                                                     {__VA_ARGS__}))
