// strata/pipeline.hpp: pipeline parallelism: schedules as constexpr tables, their proof, the stage
// split, and the executor that runs a table over the pipeline group's send/recv.
#pragma once

#include "pipeline/action.hpp"
#include "pipeline/schedule.hpp"
#include "pipeline/schedule_check.hpp"
#include "pipeline/stage.hpp"
#include "pipeline/executor.hpp"
