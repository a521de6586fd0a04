// The config front end for DeepSpeed (its key list is deepspeed_keys.cc): legacy and alternative
// names, accepted and refused keys, "auto" values.
#include "zerort/config/deepspeed_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "zerort/config/config.h"
#include "zerort/config/config_schema.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

bool IsAuto(const nlohmann::json& v) {
  return v.is_string() && AsciiLower(v.get<std::string>()) == "auto";
}

std::vector<std::string> Split(std::string_view path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.emplace_back(path.substr(start, dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

// The object holding `path`'s last key, or null when a section on the way is missing.
nlohmann::json* Parent(nlohmann::json& root, std::string_view path, std::string* key) {
  const std::vector<std::string> parts = Split(path);
  nlohmann::json* node = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->is_object()) return nullptr;
    auto it = node->find(parts[i]);
    if (it == node->end() || !it->is_object()) return nullptr;
    node = &*it;
  }
  if (!node->is_object()) return nullptr;
  *key = parts.back();
  return node;
}

const nlohmann::json* Find(nlohmann::json& root, std::string_view path) {
  std::string key;
  nlohmann::json* parent = Parent(root, path, &key);
  if (parent == nullptr) return nullptr;
  auto it = parent->find(key);
  return it == parent->end() ? nullptr : &*it;
}

// Erases `path`, and its section when that is left empty (DeepSpeed's "data_types" with only
// accepted keys is nothing zerort's schema should see).
void Erase(nlohmann::json& root, std::string_view path) {
  std::string key;
  nlohmann::json* parent = Parent(root, path, &key);
  if (parent == nullptr) return;
  parent->erase(key);
  const size_t dot = path.rfind('.');
  if (parent->empty() && dot != std::string_view::npos) Erase(root, path.substr(0, dot));
}

// Sets `path`, creating its sections; false when a section on the way is not an object.
bool Set(nlohmann::json& root, std::string_view path, nlohmann::json value) {
  const std::vector<std::string> parts = Split(path);
  nlohmann::json* node = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    nlohmann::json& child = (*node)[parts[i]];
    if (child.is_null()) child = nlohmann::json::object();
    if (!child.is_object()) return false;
    node = &child;
  }
  (*node)[parts.back()] = std::move(value);
  return true;
}

// Whether an object asks for anything: an `"enabled": true` anywhere inside it.
bool AnyEnabled(const nlohmann::json& v) {
  if (!v.is_object()) return false;
  for (const auto& [key, value] : v.items()) {
    if (key == "enabled" && value.is_boolean() && value.get<bool>()) return true;
    if (AnyEnabled(value)) return true;
  }
  return false;
}

bool AsksForNothing(const DsKey& k, const nlohmann::json& value) {
  if (k.accept_if.empty()) return false;
  if (k.accept_if == "disabled") return !AnyEnabled(value);
  const nlohmann::json allowed = nlohmann::json::parse(k.accept_if);
  for (const nlohmann::json& a : allowed) {
    if (a == value) return true;
    if (a.is_string() && value.is_string() &&
        AsciiLower(a.get<std::string>()) == AsciiLower(value.get<std::string>())) {
      return true;
    }
  }
  return false;
}

bool IsPath(std::string_view s) { return s.find(' ') == std::string_view::npos; }

// The special mappings: DeepSpeed's legacy boolean forms and its activation checkpointing.
void MapSpecial(nlohmann::json& json, const DsKey& k, const nlohmann::json& value,
                Problems& problems, std::vector<std::string>& notes) {
  const std::string path(k.path);
  auto need_bool = [&]() {
    if (value.is_boolean()) return true;
    problems.Add(
        StrCat(path, " = ", ShortDump(value), ": expected true or false, got ", value.type_name()));
    return false;
  };
  if (path == "zero_optimization") {  // {"zero_optimization": true}: DeepSpeed's old form
    if (value.is_object() || !need_bool()) return;
    json["zero_optimization"] = {{"stage", value.get<bool>() ? 1 : 0}};
    notes.push_back(StrCat("zero_optimization = ", value.dump(),
                           " (legacy form) read as {\"stage\": ", value.get<bool>() ? 1 : 0, "}"));
  } else if (path == "zero_optimization.cpu_offload" ||
             path == "zero_optimization.cpu_offload_param" ||
             path == "zero_optimization.cpu_offload_params") {
    if (!need_bool()) return;
    const std::string section = path == "zero_optimization.cpu_offload"
                                    ? "zero_optimization.offload_optimizer"
                                    : "zero_optimization.offload_param";
    Erase(json, path);
    if (!value.get<bool>()) return;
    if (Find(json, section + ".device") != nullptr) {
      problems.Add(StrCat(path, " (legacy) and ", section, ".device are both given: keep ", section,
                          " only"));
      return;
    }
    Set(json, section + ".device", "cpu");
    notes.push_back(StrCat(path, " = true (legacy) read as ", section, ".device = \"cpu\""));
  } else if (path == "zero_optimization.cpu_offload_use_pin_memory") {
    if (!need_bool()) return;
    Erase(json, path);
    for (const char* section : {"offload_optimizer", "offload_param"}) {
      const std::string target = StrCat("zero_optimization.", section, ".pin_memory");
      if (Find(json, StrCat("zero_optimization.", section)) != nullptr &&
          Find(json, target) == nullptr) {
        Set(json, target, value);
      }
    }
    notes.push_back(StrCat(path, " (legacy) read as the offload sections' pin_memory"));
  } else if (path == "activation_checkpointing") {
    if (!value.is_object()) {
      problems.Add(StrCat("activation_checkpointing = ", ShortDump(value),
                          ": expected an object (DeepSpeed's activation checkpointing section)"));
      return;
    }
    Erase(json, path);
    if (const nlohmann::json* own = Find(json, "model.activation_checkpointing")) {
      notes.push_back(StrCat("activation_checkpointing section: model.activation_checkpointing = ",
                             own->dump(), " is given and decides"));
      return;
    }
    Set(json, "model.activation_checkpointing", true);
    notes.push_back(
        "activation_checkpointing section read as model.activation_checkpointing = true: every "
        "block is recomputed in the backward (partition_activations, cpu_checkpointing and the "
        "other keys tune DeepSpeed's own checkpointing function and are accepted)");
  }
}

// Paths whose "auto" has a rule (Hugging Face's integration, docs/deepspeed.md, "auto" values).
constexpr std::string_view kAutoPaths[] = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
    "fp16.enabled",
    "bf16.enabled",
    "amp.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
};

void CollectAutos(nlohmann::json& node, const std::string& path, Problems& problems,
                  AutoKeys& autos) {
  if (!node.is_object()) return;
  std::vector<std::string> found;
  for (auto& [key, value] : node.items()) {
    const std::string p = path.empty() ? key : StrCat(path, ".", key);
    if (IsAuto(value) && p != "aio.engine") {  // zerort's aio.engine has a value "auto"
      found.push_back(key);
      if (std::find(std::begin(kAutoPaths), std::end(kAutoPaths), p) != std::end(kAutoPaths)) {
        autos.push_back(p);
      } else {
        problems.Add(StrCat(p,
                            " = \"auto\": no rule resolves \"auto\" for this key (zerort "
                            "resolves it where Hugging Face's DeepSpeed integration does: "
                            "docs/deepspeed.md, \"auto\" values); give a value"));
      }
    } else {
      CollectAutos(value, p, problems, autos);
    }
  }
  for (const std::string& key : found) node.erase(key);
}

}  // namespace

std::string_view DsHandlingName(DsHandling h) {
  switch (h) {
    case DsHandling::kImplemented:
      return "implemented";
    case DsHandling::kMapped:
      return "mapped";
    case DsHandling::kAccepted:
      return "accepted (note)";
    case DsHandling::kRefused:
      return "refused (exit 2)";
  }
  return "?";
}

std::string DeepSpeedKeysMarkdown() {
  std::string out = "| DeepSpeed key | zerort | what zerort does |\n|---|---|---|\n";
  for (const DsKey& k : DeepSpeedKeys()) {
    std::string what(k.detail);
    if (k.handling == DsHandling::kImplemented && what.empty()) {  // the field table's text
      const ConfigField* field = FindConfigField(k.path);
      ZR_CHECK(field != nullptr) << k.path << ": an implemented key without a field-table row";
      what = field->doc;
    }
    if (k.handling == DsHandling::kMapped && IsPath(k.detail))
      what = StrCat("read as `", k.detail, "`");
    if (k.handling == DsHandling::kRefused && !k.accept_if.empty()) {
      what += k.accept_if == "disabled" ? " (accepted when not enabled)"
                                        : StrCat(" (accepted when ", k.accept_if, ")");
    }
    for (size_t i = 0; (i = what.find('|', i)) != std::string::npos; i += 2)
      what.replace(i, 1, "\\|");
    out += StrCat("| `", k.path, "` | ", DsHandlingName(k.handling), " | ", what, " |\n");
  }
  return out;
}

void NormalizeDeepSpeed(nlohmann::json& json, Problems& problems, std::vector<std::string>& notes,
                        AutoKeys& autos) {
  // Top-level keys beginning with "_" are comments ("_comment", "_description"): DeepSpeed reads
  // the keys it knows and never looks at them.
  std::vector<std::string> comments;
  for (const auto& [key, value] : json.items()) {
    if (!key.empty() && key[0] == '_') comments.push_back(key);
  }
  for (const std::string& key : comments) {
    notes.push_back(StrCat(key, ": a comment (a top-level key beginning with _), ignored"));
    json.erase(key);
  }
  // Mapped names first, so "auto" and the other rows see the current paths.
  for (const DsKey& k : DeepSpeedKeys()) {
    if (k.handling != DsHandling::kMapped) continue;
    const nlohmann::json* found = Find(json, k.path);
    if (found == nullptr) continue;
    const nlohmann::json value = *found;
    if (!IsPath(k.detail)) {
      MapSpecial(json, k, value, problems, notes);
      continue;
    }
    if (Find(json, k.detail) != nullptr) {
      problems.Add(StrCat(k.path, " and ", k.detail, " are both given (", k.path,
                          " is DeepSpeed's other name for it): keep one"));
      continue;
    }
    Erase(json, k.path);
    if (!Set(json, k.detail, value)) {
      problems.Add(StrCat(k.path, ": cannot be read as ", k.detail,
                          " (a section on the way is not "
                          "an object)"));
      continue;
    }
    notes.push_back(StrCat(k.path, " read as ", k.detail, " (DeepSpeed's other name)"));
  }
  CollectAutos(json, "", problems, autos);
  // Accepted and refused keys. A key the schema reads too (fp16.enabled) stays for it.
  for (const DsKey& k : DeepSpeedKeys()) {
    if (k.handling != DsHandling::kAccepted && k.handling != DsHandling::kRefused) continue;
    const nlohmann::json* found = Find(json, k.path);
    if (found == nullptr || found->is_null()) continue;
    const nlohmann::json value = *found;
    if (k.handling == DsHandling::kRefused && !AsksForNothing(k, value)) {
      problems.Add(StrCat(k.path, " = ", ShortDump(value),
                          ": a DeepSpeed key zerort does not support: ", k.detail));
      Erase(json, k.path);  // not "unknown" as well
      continue;
    }
    Erase(json, k.path);
    if (k.handling == DsHandling::kAccepted) {
      notes.push_back(StrCat(k.path, " = ", ShortDump(value), ": accepted; ", k.detail));
    }
  }
  // DeepSpeed's sections that zerort's schema does not have: what is left in them is unknown.
  for (const char* section : {"data_types", "tensor_parallel"}) {
    const nlohmann::json* left = Find(json, section);
    if (left == nullptr) continue;
    if (left->is_object()) {
      for (const auto& [key, value] : left->items()) {
        problems.Add(StrCat("unknown key '", section, ".", key, "' (DeepSpeed's ", section,
                            " section has no such key)"));
      }
    } else {
      problems.Add(StrCat(section, " = ", ShortDump(*left), ": expected an object"));
    }
    json.erase(section);
  }
}

void ResolveAutoValues(const AutoKeys& autos, const RunConfig& first, nlohmann::json& json,
                       std::vector<std::string>& notes) {
  const int64_t d = first.model.shape.d_model;
  const OptimizerConfig& o = first.optimizer;
  auto set = [&](std::string_view path, const nlohmann::json& value, std::string_view from) {
    Set(json, path, value);
    notes.push_back(StrCat(path, " = \"auto\" -> ", value.dump(), " (", from, ")"));
  };
  auto given = [&](std::string_view p) { return Find(json, p) != nullptr; };
  for (const std::string& p : autos) {
    if (p == "train_batch_size" || p == "train_micro_batch_size_per_gpu" ||
        p == "gradient_accumulation_steps") {
      continue;  // below, once for the triple
    } else if (p == "gradient_clipping") {
      set(p, 1.0, "Hugging Face's max_grad_norm default");
    } else if (p == "optimizer.params.lr") {
      set(p, o.lr, "zerort's default learning rate");
    } else if (p == "optimizer.params.betas") {
      set(p, {o.betas[0], o.betas[1]}, "zerort's default, as Hugging Face's");
    } else if (p == "optimizer.params.eps") {
      set(p, first.manager.optimizer.eps, "zerort's default, as Hugging Face's");
    } else if (p == "optimizer.params.weight_decay") {
      set(p, first.manager.optimizer.weight_decay, "zerort's default, as Hugging Face's");
    } else if (p == "scheduler.params.warmup_min_lr") {
      set(p, 0, "Hugging Face's rule");
    } else if (p == "scheduler.params.warmup_max_lr") {
      set(p, o.lr, "optimizer.params.lr");
    } else if (p == "scheduler.params.warmup_num_steps") {
      set(p, 0, "Hugging Face's warmup_steps default");
    } else if (p == "scheduler.params.total_num_steps") {
      set(p, first.train.steps, "train.steps");
    } else if (p == "fp16.enabled" || p == "bf16.enabled" || p == "amp.enabled") {
      set(p, false, "Hugging Face's default: no mixed precision unless asked");
    } else if (p == "zero_optimization.reduce_bucket_size") {
      set(p, d * d, "model.d_model^2");
    } else if (p == "zero_optimization.stage3_prefetch_bucket_size") {
      set(p, static_cast<int64_t>(0.9 * static_cast<double>(d * d)), "0.9 x model.d_model^2");
    } else if (p == "zero_optimization.stage3_param_persistence_threshold") {
      set(p, 10 * d, "10 x model.d_model");
    } else if (p == "zero_optimization.stage3_gather_16bit_weights_on_model_save") {
      set(p, false, "Accelerate's zero3_save_16bit_model default");
    }
  }
  const bool batch_auto = std::any_of(autos.begin(), autos.end(), [](const std::string& p) {
    return p == "train_batch_size" || p == "train_micro_batch_size_per_gpu" ||
           p == "gradient_accumulation_steps";
  });
  if (!batch_auto) return;
  if (!given("train_batch_size") && !given("train_micro_batch_size_per_gpu")) {
    set("train_micro_batch_size_per_gpu", 8,
        "Hugging Face's per_device_train_batch_size default; the rest of the triple follows");
  } else {
    notes.push_back(
        "batch keys given as \"auto\" follow from the others and the data-parallel size");
  }
}

}  // namespace zerort
