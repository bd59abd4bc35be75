// strata/checkpoint.hpp: the checkpoint module (per-rank file format, crash-safe save and load in
// any layout, background saves, layout conversion, Hugging Face import and export).
#pragma once

#include "checkpoint/crc32.hpp"
#include "checkpoint/durable_file.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/json.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/huggingface.hpp"
#include "checkpoint/reshard.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/convert.hpp"
