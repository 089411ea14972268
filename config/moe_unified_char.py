# The unified strategy, HG + DNP + OR + IWD (paper 4), on the MoE of moe_baseline_char.
# 1.27M parameters, 0.87M active per token.
#   python train.py config/moe_unified_char.py
from config.moe_baseline_char import *  # noqa: F401,F403

out_dir = "out/moe_unified_char"
sv_hetero = True
sv_placement = 'dnp'
sv_reparam = 'or'
sv_weight_decay = 'iwd'
