// strata/layers.hpp: the layers module.
#pragma once

#include "layers/layout.hpp"
#include "layers/conversions.hpp"
#include "layers/parameter.hpp"
#include "layers/deferred_weight_gradients.hpp"
#include "layers/gather.hpp"
#include "layers/policy.hpp"
#include "layers/column_parallel_linear.hpp"
#include "layers/row_parallel_linear.hpp"
#include "layers/embedding.hpp"
#include "layers/cross_entropy.hpp"
#include "layers/chunked_classifier.hpp"
#include "layers/norm.hpp"
#include "layers/dropout.hpp"
#include "layers/attention.hpp"
#include "layers/mlp.hpp"
#include "layers/transformer_layer.hpp"
