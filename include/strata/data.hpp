// strata/data.hpp: the data module — Megatron indexed datasets (.bin/.idx), llm.c token shards,
// the byte tokenizer and GPT-2's byte-level BPE, the GPT sample index, micro-batches and weighted blending.
#pragma once

#include "core.hpp"
#include "data/mapped_file.hpp"
#include "data/indexed_dataset.hpp"
#include "data/llmc_shard.hpp"
#include "data/tokenizer.hpp"
#include "data/bpe_tokenizer.hpp"
#include "data/text_tokenizer.hpp"
#include "data/gpt_dataset.hpp"
#include "data/batch.hpp"
#include "data/blended_dataset.hpp"
#include "data/mock_dataset.hpp"
