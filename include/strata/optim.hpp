// strata/optim.hpp: the optimizer module (learning-rate schedules, gradient utilities, AdamW).
#pragma once

#include "optim/lr_schedule.hpp"
#include "optim/state_piece.hpp"
#include "optim/grad_utils.hpp"
#include "optim/adamw.hpp"
#include "optim/grad_buffer.hpp"
#include "optim/distributed_optimizer.hpp"
#include "optim/loss_scaler.hpp"
