// Every family the loader reads: one line each.
#include "core/error.h"
#include "loader/families/family.h"

namespace shardlm {

extern const FamilyDef kQwen2Family, kQwen3Family, kLlamaFamily, kMistralFamily, kMixtralFamily, kQwen3MoeFamily,
    kPhi3Family, kGemma3Family, kGemma3MultimodalFamily;

const std::vector<const FamilyDef*>& family_defs() {
  static const std::vector<const FamilyDef*> defs = {
      &kQwen2Family, &kQwen3Family, &kLlamaFamily, &kMistralFamily, &kMixtralFamily, &kQwen3MoeFamily, &kPhi3Family,
      &kGemma3Family, &kGemma3MultimodalFamily,
  };
  return defs;
}

const FamilyDef& family_def(Family family) {
  for (const FamilyDef* d : family_defs())
    if (d->family == family) return *d;
  fail(ErrorCode::kInternal, "family ", static_cast<int>(family), " has no entry in loader/families/registry.cpp");
}

const FamilyDef* find_family(const std::string& architecture) {
  for (const FamilyDef* d : family_defs())
    if (architecture == d->architecture) return d;
  return nullptr;
}

}  // namespace shardlm
