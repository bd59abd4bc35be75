// strata/checkpoint.hpp: the checkpoint module (per-rank file format, crash-safe save and load).
#pragma once

#include "checkpoint/crc32.hpp"
#include "checkpoint/durable_file.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/reshard.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/convert.hpp"
