// A Hugging Face tokenizer.json with a BPE model as a Tokenizer ([Note: zerort's tokenizers] in
// tokenizer.h says what is read and what is refused). Internal to data/: Tokenizer::Load is the
// entry point.
#pragma once

#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "zerort/data/tokenizer.h"

namespace zerort {

// `j` is the parsed file; `file` names it in errors (with the JSON path of what is refused).
StatusOr<std::unique_ptr<Tokenizer>> HfTokenizerFromJson(const nlohmann::json& j,
                                                         const std::string& file);

}  // namespace zerort
