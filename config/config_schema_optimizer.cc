// The optimizer section's rows of the field table (config_rows.h): one declaration per key.
#include "zerort/config/config_readers.h"
#include "zerort/config/config_rows.h"

namespace zerort::config_rows {

using namespace config_readers;  // ReadOptimizerType

void AddOptimizerRows(std::vector<ConfigField>& t) {
  t.push_back(
      Custom("optimizer", "type", ZR_MEMBER(optimizer.type), ReadOptimizerType,
             {"AdamW", "Adam", "SGD", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"},
             "AdamW, Adam, SGD (torch.optim's), Lamb (trust ratios over shards), OneBitAdam, "
             "ZeroOneAdam and OneBitLamb (DeepSpeed's 1-bit Adam, 0/1 Adam and 1-bit LAMB, stage "
             "0; any case)"));
  const std::string_view op = "optimizer.params";
  const std::vector<std::string_view> adams = {"AdamW",      "Adam",        "Lamb",
                                               "OneBitAdam", "ZeroOneAdam", "OneBitLamb"};
  const std::vector<std::string_view> one_bit = {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"};
  const std::vector<std::string_view> lambs = {"Lamb", "OneBitLamb"};
  const std::vector<std::string_view> adam_w_modes = {"AdamW", "Adam", "Lamb"};
  t.push_back(Num<float>(op, "lr", ZR_MEMBER(optimizer.lr), 0, 1e3,
                         "learning rate (a scheduler overrides it)"));
  t.push_back(Owned(Num<std::array<float, 2>>(op, "betas", ZR_MEMBER(optimizer.betas), 0,
                                              0.999999999, "the moments' decay rates"),
                    adams));
  t.push_back(Owned(Num<float>(op, "eps", ZR_MEMBER(manager.optimizer.eps), 0, 1,
                               "the denominator's term, PyTorch's 1e-8"),
                    adams));
  t.push_back(Num<float>(op, "weight_decay", ZR_MEMBER(manager.optimizer.weight_decay), 0, 1e3,
                         "decoupled (AdamW, Lamb) or L2 (Adam, SGD) decay, PyTorch's 0"));
  t.push_back(Owned(Bool(op, "adam_w_mode", ZR_MEMBER(optimizer.adam_w_mode),
                         "Adam: decoupled decay (DeepSpeed's FusedAdam default); AdamW: must be "
                         "true"),
                    adam_w_modes, {"Adam"}));
  t.push_back(Owned(Bool(op, "bias_correction", ZR_MEMBER(manager.optimizer.bias_correction),
                         "false drops Adam's 1/(1-beta^t) terms (the 1-bit optimizers have none)"),
                    adams));
  t.push_back(Owned(Num<float>(op, "max_coeff", ZR_MEMBER(manager.optimizer.max_coeff), 0, 1e6,
                               "the trust ratio's upper clamp, DeepSpeed's 10"),
                    lambs));
  t.push_back(Owned(Num<float>(op, "min_coeff", ZR_MEMBER(manager.optimizer.min_coeff), 0, 1e6,
                               "the trust ratio's lower clamp, DeepSpeed's 0.01"),
                    lambs));
  t.push_back(Owned(Num<int64_t>(op, "freeze_step", ZR_MEMBER(manager.optimizer.freeze_step), 0,
                                 kMaxConfigIntAsDouble,
                                 "the last step with uncompressed gradients, DeepSpeed's 100000"),
                    {"OneBitAdam", "OneBitLamb"}));
  for (auto [key, member, low, high, doc] :
       {std::tuple{"coeff_beta", ZR_MEMBER(manager.optimizer.coeff_beta), 0.0, 1.0,
                   "the frozen trust ratio's running-average coefficient (below 1), DeepSpeed's "
                   "0.9"},
        std::tuple{"factor_max", ZR_MEMBER(manager.optimizer.factor_max), 0.0, 1e6,
                   "the compressed steps' largest factor on the frozen ratio, DeepSpeed's 4"},
        std::tuple{"factor_min", ZR_MEMBER(manager.optimizer.factor_min), 0.0, 1e6,
                   "the compressed steps' smallest factor (above 0), DeepSpeed's 0.5"},
        std::tuple{"factor_threshold", ZR_MEMBER(manager.optimizer.factor_threshold), 0.0, 1.0,
                   "the factor's largest relative change per step, DeepSpeed's 0.1"}}) {
    t.push_back(Owned(Num<float>(op, key, member, low, high, doc), {"OneBitLamb"}));
  }
  t.push_back(Owned(Bool(op, "cuda_aware", ZR_MEMBER(optimizer.cuda_aware),
                         "accepted: zerort's communicator decides how device buffers travel"),
                    one_bit));
  t.push_back(Owned(Str(op, "comm_backend_name", ZR_MEMBER(optimizer.comm_backend_name),
                        {"nccl", "mpi", "hccl", "compressed"},
                        "accepted: the compressed all-reduce uses the run's communicator"),
                    one_bit));
  for (auto [key, member, low, doc] :
       {std::tuple{"var_freeze_step", ZR_MEMBER(manager.optimizer.var_freeze_step), 0,
                   "the variance's last update, DeepSpeed's 100000"},
        std::tuple{"var_update_scaler", ZR_MEMBER(manager.optimizer.var_update_scaler), 1,
                   "variance updates per doubling of their interval, DeepSpeed's 16"},
        std::tuple{"local_step_scaler", ZR_MEMBER(manager.optimizer.local_step_scaler), 1,
                   "steps per doubling of the local-step interval, DeepSpeed's 32678"},
        std::tuple{"local_step_clipper", ZR_MEMBER(manager.optimizer.local_step_clipper), 1,
                   "the local-step interval's cap, DeepSpeed's 16"}}) {
    t.push_back(
        Owned(Num<int64_t>(op, key, member, low, kMaxConfigIntAsDouble, doc), {"ZeroOneAdam"}));
  }
  t.push_back(Owned(Num<float>(op, "momentum", ZR_MEMBER(manager.optimizer.momentum), 0, 1,
                               "torch.optim.SGD's momentum"),
                    {"SGD"}));
  t.push_back(Owned(Num<float>(op, "dampening", ZR_MEMBER(manager.optimizer.dampening), 0, 1,
                               "torch.optim.SGD's dampening"),
                    {"SGD"}));
  t.push_back(Owned(Bool(op, "nesterov", ZR_MEMBER(manager.optimizer.nesterov),
                         "Nesterov momentum (needs momentum > 0 and dampening 0)"),
                    {"SGD"}));
}

}  // namespace zerort::config_rows
