# The unified strategy, HG + DNP + OR + IWD (paper 4).
#   torchrun --standalone --nproc_per_node=8 train.py config/unified_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/unified_124m"
sv_hetero = True
sv_placement = 'dnp'
sv_reparam = 'or'
sv_weight_decay = 'iwd'
