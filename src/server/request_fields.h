// Every field a request may carry, and what shardlm does with it. A field
// shardlm implements is parsed by openai_protocol.cpp; one it does not is
// refused with a 400 that names it (never silently dropped), as OpenAI
// itself answers "Unrecognized request argument supplied".
#pragma once

#include "server/openai_protocol.h"

namespace shardlm::server {

// Throws ApiException(400, param = the field) for the first field of `body`
// that `endpoint` does not implement, or implements only some values of
// (best_of > 1, a non-empty suffix, priority != 0, ...).
void check_request_fields(Endpoint endpoint, const ordered_json& body);

}  // namespace shardlm::server
