// strata/models.hpp: the model module (GPT and Llama).
#pragma once

#include "models/config.hpp"
#include "models/memory_estimate.hpp"
#include "models/decoder.hpp"
#include "models/gpt.hpp"
#include "models/llama.hpp"
#include "models/moe_llama.hpp"
#include "models/pipeline_model.hpp"
