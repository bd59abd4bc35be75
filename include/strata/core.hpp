// strata/core.hpp: the core module (dtypes, shapes, tensors, errors, random numbers, UTF-8, JSON).
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/dtype.hpp"
#include "core/fp8.hpp"
#include "core/checked.hpp"
#include "core/shape.hpp"
#include "core/host_memory.hpp"
#include "core/tensor.hpp"
#include "core/rng.hpp"
#include "core/utf8.hpp"
#include "core/json.hpp"
#include "core/file.hpp"
