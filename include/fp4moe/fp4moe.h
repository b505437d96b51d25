// fp4moe — fused Mixture-of-Experts with 4-bit expert weights on Hopper. The whole public API.
#pragma once

#include "fp4moe/config.h"
#include "fp4moe/errors.h"
#include "fp4moe/formats.h"
#include "fp4moe/runner.h"
#include "fp4moe/weights.h"
