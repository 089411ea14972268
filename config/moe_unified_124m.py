# The unified strategy, HG + DNP + OR + IWD (paper 4), on the MoE of moe_baseline_124m: under HG the
# router and every expert's gate and up get their own vector; DNP's output vectors are per expert.
# 162.9M parameters, 99.0M active per token.
#   torchrun --standalone --nproc_per_node=8 train.py config/moe_unified_124m.py
from config.moe_baseline_124m import *  # noqa: F401,F403

out_dir = "out/moe_unified_124m"
sv_hetero = True
sv_placement = 'dnp'
sv_reparam = 'or'
sv_weight_decay = 'iwd'
