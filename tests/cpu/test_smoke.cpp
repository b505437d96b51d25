#include <gtest/gtest.h>
#include "fp4moe/fp4moe.h"
TEST(Smoke, Builds) { EXPECT_EQ(fp4moe::fmt::e2m1_encode(6.0f), 7); }
