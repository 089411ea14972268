# Gemma-like norms (QK-norm and post-norms, both Output-Norms); IWD: decay only the Input-Norm ones
# (paper 2.2).
#   python train.py config/gemma_iwd_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/gemma_iwd_char"
qk_norm = True
post_norm = True
sv_weight_decay = 'iwd'
