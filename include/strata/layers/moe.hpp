// strata/layers/moe.hpp: the mixture-of-experts layers: TopKRouter, the token dispatchers,
// GroupedExperts and MoeMlp (TransformerLayer's MLP block).
#pragma once

#include "moe/router.hpp"
#include "moe/token_dispatcher.hpp"
#include "moe/experts.hpp"
#include "moe/moe_mlp.hpp"
