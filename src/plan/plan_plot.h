// `plan --plot FILE.svg`: the recommended layout as a picture. Per device, a
// bar of its memory with the stacked bytes plan budgets (weights, workspace,
// reserve, KV cache, unused); under each bar its rank, TP rank, PP stage and
// replica, with the TP groups boxed; the even split's bars beside the chosen
// split's when plan chose another (mixed devices). Plain SVG 1.1, no scripts.
#pragma once

#include <string>

#include "plan/planner.h"

namespace shardlm {

std::string plan_svg(const Plan& plan);
// Throws Error(kIo) naming the file when it cannot be written.
void write_plan_svg(const Plan& plan, const std::string& path);

}  // namespace shardlm
