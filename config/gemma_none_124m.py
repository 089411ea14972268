# Gemma-like norms (QK-norm and post-norms, both Output-Norms); no weight decay on scale vectors.
#   torchrun --standalone --nproc_per_node=8 train.py config/gemma_none_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/gemma_none_124m"
qk_norm = True
post_norm = True
sv_weight_decay = 'none'
