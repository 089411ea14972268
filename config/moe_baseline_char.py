# The MoE at CPU size: every FFN is an MoE of 4 routed SwiGLU experts (top-2) plus 1 shared one,
# each 128 wide. 1.26M parameters in all, 0.86M active per token
# (the dense shakespeare_char: 0.81M).
#   python train.py config/moe_baseline_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/moe_baseline_char"
n_experts = 4
n_experts_active = 2
n_shared_experts = 1
moe_hidden = 128
moe_bias_rate = 1e-3
