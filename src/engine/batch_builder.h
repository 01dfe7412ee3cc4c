// StepPlan (sched, plain data) -> ForwardBatch (what the model runs): one
// chunk per scheduled sequence, plus one single-token chunk per drafted token.
#pragma once

#include "model/forward_batch.h"
#include "sched/step_plan.h"

namespace shardlm {

ForwardBatch make_forward_batch(const StepPlan& plan);

}  // namespace shardlm
