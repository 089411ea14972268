# Gemma-like norms (QK-norm and post-norms, both Output-Norms); IWD: decay only the Input-Norm ones
# (paper 2.2).
#   torchrun --standalone --nproc_per_node=8 train.py config/gemma_iwd_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/gemma_iwd_124m"
qk_norm = True
post_norm = True
sv_weight_decay = 'iwd'
