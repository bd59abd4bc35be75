// strata/checkpoint/json.hpp: the strict JSON reader now lives in core (core/json.hpp), where the
// tokenizers read tokenizer.json and vocab.json with it too; this name stays for existing users.
#pragma once

#include "../core/json.hpp"
