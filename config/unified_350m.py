# The unified strategy, HG + DNP + OR + IWD (paper 4), at GPT-2 medium's sizes.
#   torchrun --standalone --nproc_per_node=8 train.py config/unified_350m.py
from config.baseline_350m import *  # noqa: F401,F403

out_dir = "out/unified_350m"
sv_hetero = True
sv_placement = 'dnp'
sv_reparam = 'or'
sv_weight_decay = 'iwd'
