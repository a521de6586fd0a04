// DataConfig: what a run reads its tokens from (the run config's `data` section, config/config.h;
// each key's meaning is its row in config/config_rows.cc). Here so that data/ depends on the
// runtime alone.
#pragma once

#include <string>
#include <vector>

namespace zerort {

struct DataConfig {
  std::string path;
  // data.blend: Megatron's weighted data_path, WEIGHT PATH WEIGHT PATH ... (weights as decimal
  // strings; data/data_loader.h [Note: blending token files]); exclusive with path.
  std::vector<std::string> blend;
  std::string format = "detect";  // ParseTokenFormat
  std::string tokenizer;          // a tokenizer.json or .model (the sample, EOD); empty: bytes
  bool eod_mask_loss = false;     // Megatron's: no loss where the input is the end-of-text token
  int eos_token_id = -1;          // that token; -1: data.tokenizer's end-of-text token
  double validation_fraction = 0.05;
};

}  // namespace zerort
