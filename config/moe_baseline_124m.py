# A Mixture-of-Experts twin of baseline_124m: every FFN is an MoE of 8 routed SwiGLU experts (top-2)
# plus 1 shared expert, each 384 wide; router in fp32, load balanced by the DeepSeek-V3 expert bias.
# 162.6M parameters in all, 98.9M active per token (2 + 1 of 9 experts per layer; 38.6M of either
# is the tied embedding), against 123.6M for the dense baseline.
#   torchrun --standalone --nproc_per_node=8 train.py config/moe_baseline_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/moe_baseline_124m"
n_experts = 8
n_experts_active = 2
n_shared_experts = 1
moe_hidden = 384          # (2 + 1) * 384 = 1152 active FFN width per layer (the dense SwiGLU: 2048)
moe_dense_layers = 0      # every layer is MoE; 1 keeps the first layer dense
moe_bias_rate = 1e-3
